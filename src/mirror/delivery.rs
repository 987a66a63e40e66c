//! The target side's delivery reports: they feed the offset tracker.
//!
//! Each produced record carries its [`Ticket`] as the delivery opaque (a `usize`, no
//! allocation). An acknowledgement advances the tracker; a failure is either fatal
//! (`--abort.on.send.failure true`: the commit point stays below the record and the mirror
//! stops) or counted as dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use super::clients::{self, Cluster};
use super::offsets::{Outcome, Ticket};
use super::state::{MissingTarget, Stats, StreamShared};

pub type MirrorProducer = BaseProducer<DeliveryContext>;

/// How long a wait for delivery reports sleeps when none was waiting ([`flush`],
/// [`serve_deliveries`]).
const REPORT_WAIT_STEP: Duration = Duration::from_millis(1);

/// Waits until every record handed to `producer` has its delivery report served, for at most
/// `timeout`; fails with the librdkafka timeout error otherwise. Not rust-rdkafka's own
/// `flush`: it waits in steps of 100 ms that each last their whole 100 ms, so a flush of
/// anything took 100 ms at least, and an exactly-once transaction (a flush, then the commit's
/// own flush) 200 ms. Nor `poll` with a short timeout: below a millisecond left, it polls
/// without waiting, in a loop (a spinning core). Here each waiting report is served at once,
/// and the thread sleeps a millisecond only when none was waiting.
pub fn flush<C: ProducerContext>(producer: &BaseProducer<C>, timeout: Duration) -> KafkaResult<()> {
    let deadline = Instant::now() + timeout;
    // One librdkafka flush call that does not wait: done if nothing is in flight, and it
    // wakes the broker threads to send what is queued.
    if producer.flush(Duration::ZERO).is_ok() {
        return Ok(());
    }
    let mut in_flight = producer.in_flight_count();
    while in_flight > 0 {
        if Instant::now() >= deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        // Serves at most one event (a batch of delivery reports).
        producer.poll(Duration::ZERO);
        let left = producer.in_flight_count();
        if left == in_flight {
            std::thread::sleep(REPORT_WAIT_STEP);
        }
        in_flight = left;
    }
    Ok(())
}

impl StreamShared {
    /// A record produced from `ticket` will never reach the target.
    pub fn send_failed(
        &self,
        ticket: Ticket,
        target_topic: &str,
        target_partition: Option<i32>,
        error: &KafkaError,
    ) {
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition)
        ) && self.target_missing(ticket, target_topic)
        {
            return;
        }
        let reason = describe_send_error(error, target_topic, target_partition);
        let code = error
            .rdkafka_error_code()
            .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"));
        self.send_failed_because(ticket, target_topic, &code, &reason);
    }

    /// The target topic of a record does not exist (deleted while running) and
    /// `--create.topics` is on: the record is pinned (the commit point of its partition stays
    /// below it) and the stream's loop creates the topic again and mirrors the partition
    /// again from there.
    /// Returns whether it did (`false`: not a topic it makes; a send failure as any other).
    fn target_missing(&self, ticket: Ticket, target_topic: &str) -> bool {
        let Some(template) = self.recreatable.get() else {
            return false;
        };
        let mut tracker = self.tracker();
        match tracker.peek(ticket) {
            Some(s) if template.render(s.topic) == target_topic => {}
            // A handler's output topic: not ours to make.
            Some(_) => return false,
            // Released since: nothing to do.
            None => return true,
        }
        let Outcome::Recorded(s) = tracker.fail(ticket) else {
            return true;
        };
        let missing = MissingTarget {
            target_topic: target_topic.to_owned(),
            source_topic: s.topic.to_owned(),
            partition: s.partition,
        };
        let offset = s.offset;
        drop(tracker);
        let mut list = self
            .missing_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !list.contains(&missing) {
            tracing::warn!(
                stream = self.stream,
                "target topic {target_topic} is missing (deleted while running?): creating it \
                 again (--create.topics), then mirroring {}/{} again from offset {offset}",
                missing.source_topic,
                missing.partition
            );
            list.push(missing);
        }
        true
    }

    /// Like [`send_failed`](Self::send_failed), with the reason given in words, counted
    /// under `code` in `mirror_send_errors_total`.
    pub fn send_failed_because(
        &self,
        ticket: Ticket,
        target_topic: &str,
        code: &str,
        reason: &str,
    ) {
        self.stats.recorded.count_send_error(code.to_owned());
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
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => format!(
            "{}: the record is larger than target topic {topic} takes (its max.message.bytes, \
             or the producer's message.max.bytes if set lower; see `mirror-maker check`)",
            RDKafkaErrorCode::MessageSizeTooLarge
        ),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => format!(
            "the target cluster does not allow the mirror's principal (the producer's \
             credentials: its sasl.username or its certificate's subject) to WRITE to topic \
             {topic} (TopicAuthorizationFailed): grant it WRITE on topic {topic}, e.g. \
             kafka-acls --add --allow-principal User:NAME --operation Write --topic {topic}"
        ),
        Some(code) => code.to_string(),
        None => error.to_string(),
    }
}

/// Serves a producer's delivery reports for about `wait`, returning as soon as one
/// acknowledged something (the caller looks again at what it waits for).
///
/// Not `producer.poll(wait)`: rust-rdkafka's poll goes on until its deadline and hands
/// librdkafka the time left in whole milliseconds, so the last partial millisecond of every
/// wait is a loop of zero-timeout polls. The benchmark's profile of a stream waiting for room
/// (1 KiB records, the target the bottleneck) had 30% of the thread reading the clock.
pub fn serve_deliveries<C: ProducerContext>(
    producer: &BaseProducer<C>,
    stats: &Stats,
    wait: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let acknowledged = Stats::get(&stats.acknowledged);
        producer.poll(std::time::Duration::ZERO);
        if Stats::get(&stats.acknowledged) != acknowledged {
            return;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(REPORT_WAIT_STEP));
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
        self.shared.target_error(&error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.shared.target_statistics(&statistics);
    }
}

impl StreamShared {
    /// A client-wide error of the stream's target producer (either mode's).
    pub fn target_error(&self, error: &KafkaError, reason: &str) {
        clients::client_error(&self.control, Cluster::Target, self.stream, error, reason);
    }

    /// The producer's statistics say whether any target broker is connected.
    pub fn target_statistics(&self, statistics: &rdkafka::Statistics) {
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        self.target_up.store(up, Ordering::Relaxed);
    }
}

/// A delivery report that says the record was purged (partitions released while it was
/// queued, a shutdown flush that timed out) or the producer closed: not acknowledged, not
/// failed either; it stays uncommitted.
pub fn purged(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
                | RDKafkaErrorCode::BrokerDestroy
        )
    )
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let ticket = Ticket::from_opaque(opaque);
        match result {
            Ok(delivered) => {
                Stats::add(&self.shared.stats.acknowledged, 1);
                // Latency runs from the source record's timestamp (kept by the tracker): the
                // report's own timestamp may be the target broker's log-append time.
                let mut tracker = self.shared.tracker();
                let acked = match tracker.ack(ticket) {
                    Outcome::Recorded(source) => {
                        if let Some(mapping) = &self.shared.mapping {
                            // Under the tracker's lock: a commit point and the segments below
                            // it are taken together.
                            mapping.recorder().acked(
                                (source.topic, source.partition),
                                source.offset,
                                (delivered.topic(), delivered.partition()),
                                delivered.offset(),
                            );
                        }
                        Some(source.timestamp)
                    }
                    Outcome::Stale => None,
                };
                drop(tracker);
                match acked {
                    Some(Some(t)) => self.shared.stats.recorded.observe_latency(t),
                    Some(None) => {}
                    None => tracing::debug!(
                        stream = self.shared.stream,
                        "acknowledged a record of a partition released since"
                    ),
                }
            }
            Err((error, _)) if purged(error) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_write_names_the_topic_and_the_operation() {
        let error = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        let line = describe_send_error(&error, "orders", Some(1));
        assert!(line.contains("WRITE to topic orders"), "{line}");
        assert!(line.contains("TopicAuthorizationFailed"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
