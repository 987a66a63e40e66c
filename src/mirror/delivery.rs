//! The target side's delivery reports: they feed the offset tracker.
//!
//! Each produced record carries its [`Ticket`] as the delivery opaque (a `usize`, no
//! allocation). An acknowledgement advances the tracker; a failure is either fatal
//! (`--abort.on.send.failure true`: the commit point stays below the record and the mirror
//! stops) or counted as dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, ProducerContext};

use super::clients::{self, Cluster};
use super::offsets::{Outcome, Ticket};
use super::state::{Stats, StreamShared};

pub type MirrorProducer = BaseProducer<DeliveryContext>;

impl StreamShared {
    /// A record produced from `ticket` will never reach the target.
    pub fn send_failed(
        &self,
        ticket: Ticket,
        target_topic: &str,
        target_partition: Option<i32>,
        error: &KafkaError,
    ) {
        let reason = describe_send_error(error, target_topic, target_partition);
        self.stats.recorded.count_send_error(
            error
                .rdkafka_error_code()
                .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}")),
        );
        let mut tracker = self.tracker();
        // Failed (abort: the commit point never passes it) or given up (skip: acknowledged).
        let outcome = if self.abort_on_send_failure {
            tracker.fail(ticket)
        } else {
            tracker.ack(ticket)
        };
        let source = match outcome {
            Outcome::Recorded(s) => format!("{}/{} offset {}", s.topic, s.partition, s.offset),
            Outcome::Stale => "a record of a partition released since".to_owned(),
        };
        drop(tracker);
        if self.abort_on_send_failure {
            self.control.fail(format!(
                "cannot mirror {source} to target topic {target_topic}: {reason}. Stopping \
                 (--abort.on.send.failure true); the committed offset stays before this record"
            ));
        } else {
            Stats::add(&self.stats.dropped, 1);
            tracing::warn!(
                stream = self.stream,
                "dropped {source} (target topic {target_topic}): {reason} (--abort.on.send.failure false)"
            );
        }
    }
}

fn describe_send_error(error: &KafkaError, topic: &str, partition: Option<i32>) -> String {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::UnknownPartition) => format!(
            "the target topic {topic} has no partition {}: --partitioning preserve needs at \
             least as many partitions on the target as on the source; add partitions to the \
             target topic or use --partitioning hash",
            partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
        ),
        Some(code) => code.to_string(),
        None => error.to_string(),
    }
}

/// The producer's context: routes delivery reports to the stream's tracker.
pub struct DeliveryContext {
    pub shared: Arc<StreamShared>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let shared = &self.shared;
        clients::client_error(
            &shared.control,
            Cluster::Target,
            shared.stream,
            &error,
            reason,
        );
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.target_state(&statistics);
    }
}

impl DeliveryContext {
    /// The producer's statistics say whether any target broker is connected.
    fn target_state(&self, statistics: &rdkafka::Statistics) {
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        self.shared.target_up.store(up, Ordering::Relaxed);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let ticket = Ticket::from_opaque(opaque);
        match result {
            Ok(message) => {
                Stats::add(&self.shared.stats.acknowledged, 1);
                if let Some(t) = message.timestamp().to_millis() {
                    self.shared.stats.recorded.observe_latency(t);
                }
                if self.shared.tracker().ack(ticket) == Outcome::Stale {
                    tracing::debug!(
                        stream = self.shared.stream,
                        "acknowledged a record of a partition released since"
                    );
                }
            }
            Err((error, _))
                if matches!(
                    error.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::PurgeQueue
                            | RDKafkaErrorCode::PurgeInflight
                            | RDKafkaErrorCode::BrokerDestroy
                    )
                ) =>
            {
                // Purged (partitions released while records were queued, or a shutdown flush
                // that timed out) or the producer closed: they stay uncommitted, not failed.
                tracing::debug!(
                    stream = self.shared.stream,
                    "not acknowledged (purged or closed): {error}"
                );
            }
            Err((error, message)) => {
                // Records produced after this one may be queued behind it.
                self.shared
                    .failed_with_records_behind
                    .store(true, Ordering::SeqCst);
                self.shared
                    .send_failed(ticket, message.topic(), Some(message.partition()), error);
            }
        }
    }
}
