//! Signals and the shutdown watchdog: SIGINT or SIGTERM asks the streams to stop, flush and
//! commit; a second signal later than [`SAME_REQUEST`] exits at once; a shutdown that outlasts
//! its limit ends the process.

use std::sync::Arc;
use std::time::Duration;

use super::{logging, notify};
use crate::mirror::state::Control;
use crate::native::runtime;
use crate::settings::flags::LogFormat;

/// Beyond the flush timeout, how long closing the clients may take before the process exits
/// anyway (what was committed stays committed).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The last resort against a shutdown that hangs (a client that cannot close): once a stop is
/// requested, the process exits with `exit_code` after `limit` whatever is still running.
pub fn watch_shutdown(control: Arc<Control>, limit: Duration, format: LogFormat, exit_code: u8) {
    let spawned = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            while !control.stop_requested() {
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(limit);
            logging::final_error(
                format,
                &format!(
                    "shutdown did not finish within {limit:?}; exiting without waiting further"
                ),
            );
            std::process::exit(exit_code.into());
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the shutdown watchdog: {e}");
    }
}

/// How long after the first signal another one is still the same request: supervisors signal
/// the process and its group microseconds apart (GNU `timeout`, systemd's
/// KillMode=control-group, `docker stop` of a shell's children), a person presses Ctrl-C again.
const SAME_REQUEST: Duration = Duration::from_secs(1);

/// Exit code when a second signal ends the process without waiting for the flush.
const EXIT_NOW: i32 = 130;

/// SIGINT or SIGTERM asks the streams to stop, flush and commit; another one at least
/// [`SAME_REQUEST`] later exits at once with 130 (what was committed stays committed; the rest
/// is mirrored again on restart).
pub fn watch(control: Arc<Control>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = runtime()?;
    let (mut int, mut term) = {
        let _guard = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut first: Option<std::time::Instant> = None;
                loop {
                    let name = tokio::select! {
                        _ = int.recv() => "SIGINT",
                        _ = term.recv() => "SIGTERM",
                    };
                    match first {
                        None => {
                            first = Some(std::time::Instant::now());
                            tracing::info!("{name}: stopping (flush, commit, exit)");
                            notify::stopping();
                            control.request_stop();
                        }
                        Some(at) if at.elapsed() < SAME_REQUEST => tracing::debug!(
                            "{name} again within {SAME_REQUEST:?} of the first: the same stop \
                             request"
                        ),
                        Some(_) => {
                            tracing::warn!(
                                "{name} again: exiting now without waiting for the flush \
                                 (exit {EXIT_NOW})"
                            );
                            std::process::exit(EXIT_NOW);
                        }
                    }
                }
            })
        })?;
    Ok(())
}
