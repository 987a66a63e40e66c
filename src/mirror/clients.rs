//! One policy for what librdkafka reports about a whole client, for both clusters: its log
//! lines, and the errors it raises outside any one record (from the source consumer's poll,
//! or the target producer's error callback). Fatal errors stop the mirror; the others are
//! retried by librdkafka, which logs most of them itself, so only a cluster going away is
//! worth a line of ours.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::state::{Control, StreamShared};

/// Which side a client is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    Source,
    Target,
}

impl Cluster {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Cluster::Source => "source",
            Cluster::Target => "target",
        }
    }
}

/// librdkafka's own log lines, tagged with the cluster they concern.
pub(crate) fn librdkafka_log(
    cluster: Cluster,
    level: RDKafkaLogLevel,
    facility: &str,
    message: &str,
) {
    let cluster = cluster.name();
    let message = crate::settings::secrets::redact_log_line(message);
    if is_gapless_notice(facility, &message) {
        // Said once at start in our words (pipeline::run); librdkafka says it per client.
        tracing::debug!(cluster, facility, "librdkafka: {message}");
        return;
    }
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

/// librdkafka's warning, at every producer's creation, that `enable.gapless.guarantee` is
/// experimental: nothing an operator can act on.
fn is_gapless_notice(facility: &str, message: &str) -> bool {
    facility == "CONFWARN"
        && message.contains("enable.gapless.guarantee")
        && message.contains("experimental")
}

/// What the mirror relies on `enable.gapless.guarantee` for, said once at start when the
/// target producer has it on.
pub(crate) fn explain_gapless(producer: &crate::settings::client::ClientProps) {
    if producer.get("enable.gapless.guarantee").map(str::trim) == Some("true") {
        tracing::info!(
            "the target producer runs with enable.gapless.guarantee=true (librdkafka calls it \
             experimental): a record the target refuses for good stops the producer, so nothing \
             queued behind it lands before it is copied again; --abort.on.send.failure true \
             relies on it to keep each partition's order"
        );
    }
}

/// An error a client of `cluster` reports outside any one record, on `stream`'s clients;
/// `reason` is librdkafka's text for it. Each error is logged once, here.
pub(crate) fn client_error(
    control: &Control,
    cluster: Cluster,
    stream: usize,
    error: &KafkaError,
    reason: &str,
) {
    let name = cluster.name();
    let fatal = matches!(error, KafkaError::MessageConsumptionFatal(_))
        || error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal);
    match error.rdkafka_error_code() {
        _ if fatal => control.fail(format!(
            "stream {stream}: the {name} cluster client hit a fatal error: {reason}{}",
            if reason.contains("Invalid timestamp") || reason.contains("failed to validate record")
            {
                // The gapless producer stops at a refused record; the record's delivery
                // report, when it comes first, names the record and its age.
                ". The target refused a record as invalid, likely for its timestamp: see the \
                 target topic's message.timestamp.before.max.ms and \
                 message.timestamp.after.max.ms (`mirror-maker check` compares both clusters' \
                 settings)"
                    .to_owned()
            } else {
                String::new()
            }
        )),
        Some(RDKafkaErrorCode::AutoOffsetReset) => tracing::error!(
            stream,
            "{reason}: the committed offset is no longer on the source (deleted by retention \
             before it was mirrored); continuing from auto.offset.reset"
        ),
        Some(RDKafkaErrorCode::AllBrokersDown) => tracing::warn!(
            stream,
            "{reason}: no broker of the {name} cluster answers; retrying until one does"
        ),
        // librdkafka logs these itself, once per broker.
        Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::Resolve) => {
            tracing::debug!(stream, "{name} cluster: {reason}")
        }
        _ => tracing::warn!(stream, "{name} cluster: {reason} (retrying)"),
    }
}

/// The context of the readers (`verify`, `demo`, the offset-mapping store): reaching the end
/// of a partition, which they ask librdkafka to
/// report (`enable.partition.eof`), is not an error. An end reported after the reader stopped
/// waiting for that partition reaches the client's error callback as a "global" error; it is
/// logged at debug, every other error as librdkafka's default context does.
pub struct ReaderContext;

impl rdkafka::ClientContext for ReaderContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        use rdkafka::error::RDKafkaErrorCode;
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::debug!("librdkafka: end of partition: {reason}");
        } else {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// The context of the short-lived clients of `translate` and the group sync: a cluster that
/// cannot be reached is reported once, by the call that gives up, not by a line per broker
/// and attempt (librdkafka's errors go to the debug log).
pub(crate) struct QuietContext;

impl rdkafka::ClientContext for QuietContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::debug!("librdkafka: {error}: {reason}");
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// The name of `error`'s librdkafka code, as the metrics label send and commit errors
/// ("unknown" when it has none).
pub(crate) fn code_name(error: &KafkaError) -> String {
    error
        .rdkafka_error_code()
        .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"))
}

/// A client-wide error of a stream's target producer (either stream kind's).
pub(crate) fn target_error(shared: &StreamShared, error: &KafkaError, reason: &str) {
    client_error(
        &shared.control,
        Cluster::Target,
        shared.stream,
        error,
        reason,
    );
}

/// The producer's statistics say whether the target cluster is in reach ([`in_reach`]).
pub(crate) fn target_statistics(shared: &StreamShared, statistics: &rdkafka::Statistics) {
    shared.target_up.observe(in_reach(statistics));
}

/// Whether a client's statistics say its cluster is in reach: a broker connected, or no
/// broker failed yet. librdkafka connects when it needs to, so a client's first statistics can
/// come before it has tried a broker, or while its first try is under way; the cluster
/// answered the start's probe, and nothing has failed since. No broker at all is not in reach.
pub(crate) fn in_reach(statistics: &rdkafka::Statistics) -> bool {
    let brokers = || statistics.brokers.values();
    brokers().any(|b| b.state == "UP")
        || (!statistics.brokers.is_empty() && brokers().all(not_failed_yet))
}

/// A broker with no failure yet: no connection attempt (`INIT`, none counted), or its first
/// one under way. A failed attempt leaves the broker `DOWN`, then `INIT` or `TRY_CONNECT`,
/// with the attempt counted (`rdkafka_broker.c`); a lost connection counts a disconnect.
fn not_failed_yet(b: &rdkafka::statistics::Broker) -> bool {
    let connecting = matches!(
        b.state.as_str(),
        "CONNECT"
            | "SSL_HANDSHAKE"
            | "AUTH_LEGACY"
            | "APIVERSION_QUERY"
            | "AUTH_HANDSHAKE"
            | "AUTH_REQ"
    );
    match (b.connects.unwrap_or(0), b.disconnects.unwrap_or(0)) {
        (0, _) => true,
        (1, 0) => connecting,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::in_reach;
    use rdkafka::statistics::Broker;
    use rdkafka::Statistics;

    /// Statistics naming brokers in `(state, connection attempts, disconnects)`.
    fn brokers(states: &[(&str, i64, i64)]) -> Statistics {
        let mut statistics = Statistics::default();
        for (i, (state, connects, disconnects)) in states.iter().enumerate() {
            let broker = Broker {
                name: format!("localhost:9092/{i}"),
                state: state.to_string(),
                connects: Some(*connects),
                disconnects: Some(*disconnects),
                ..Broker::default()
            };
            statistics.brokers.insert(broker.name.clone(), broker);
        }
        statistics
    }

    #[test]
    fn one_broker_up_puts_the_cluster_in_reach() {
        assert!(in_reach(&brokers(&[("UP", 1, 0), ("DOWN", 3, 1)])));
    }

    #[test]
    fn brokers_not_tried_yet_or_in_their_first_try_are_in_reach() {
        assert!(in_reach(&brokers(&[("INIT", 0, 0), ("TRY_CONNECT", 0, 0)])));
        assert!(in_reach(&brokers(&[
            ("INIT", 0, 0),
            ("APIVERSION_QUERY", 1, 0)
        ])));
    }

    #[test]
    fn a_failed_try_or_a_lost_connection_is_out_of_reach() {
        // A lost connection returns the broker to INIT, its attempt counted.
        assert!(!in_reach(&brokers(&[("INIT", 1, 1)])));
        assert!(!in_reach(&brokers(&[("DOWN", 1, 0), ("INIT", 0, 0)])));
        assert!(!in_reach(&brokers(&[("CONNECT", 2, 0)])));
    }

    #[test]
    fn no_broker_at_all_is_out_of_reach() {
        assert!(!in_reach(&Statistics::default()));
    }
}
