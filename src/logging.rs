//! Log set-up: text to stderr, level from `RUST_LOG` (default `info`).

use rdkafka::config::RDKafkaLogLevel;
use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second initialisation (tests calling into the library) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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
