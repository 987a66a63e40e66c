//! Log set-up: text or JSON lines to stderr, level from `RUST_LOG` (default `info`).

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::cli::LogFormat;
use crate::control::Control;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests calling into the library) is harmless.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// librdkafka's own log lines, tagged with the cluster they concern.
pub fn librdkafka_log(cluster: &str, level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(cluster, facility, "librdkafka: {message}"),
        RDKafkaLogLevel::Warning => tracing::warn!(cluster, facility, "librdkafka: {message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(cluster, facility, "librdkafka: {message}")
        }
        RDKafkaLogLevel::Debug => tracing::debug!(cluster, facility, "librdkafka: {message}"),
    }
}

/// An error librdkafka reports for a whole client. Fatal ones stop the mirror; the others are
/// retried by librdkafka, which also logs them, so only a cluster going away is worth a line.
pub fn client_error(control: &Control, cluster: &str, error: KafkaError, reason: &str) {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::Fatal) => control.fail(format!(
            "the {cluster} cluster client hit a fatal error: {reason}"
        )),
        Some(RDKafkaErrorCode::AllBrokersDown) => tracing::warn!(
            cluster,
            "{reason}: no broker of the {cluster} cluster answers; retrying until one does"
        ),
        _ => tracing::debug!(cluster, "{reason}"),
    }
}
