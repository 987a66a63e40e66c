//! Log set-up: text or JSON lines to stderr, level from `RUST_LOG` (default `info`); colour
//! only on a terminal, and never with `NO_COLOR` set (https://no-color.org). Also the line
//! that ends the process with an error, in the same format.

use std::io::IsTerminal;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::EnvFilter;

use crate::settings::flags::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ));
    // A second initialisation (tests calling into the library) is harmless.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Colour codes only for a terminal, and not when `NO_COLOR` is set to anything but "".
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Prints the error that ends the process: `error: ...` as text, or one JSON object at level
/// ERROR like the other log lines (whatever `RUST_LOG` says: it is the last word).
pub fn final_error(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("error: {message}"),
        LogFormat::Json => {
            let mut timestamp = String::new();
            let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
            let line = serde_json::json!({
                "timestamp": timestamp,
                "level": "ERROR",
                "message": message,
                "target": "mirror_maker",
            });
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }
}
