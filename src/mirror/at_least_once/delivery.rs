//! The target side's delivery reports: they feed the offset tracker.
//!
//! Each produced record carries its [`Ticket`] as the delivery opaque (a `usize`, no
//! allocation). An acknowledgement advances the tracker; a failure is either fatal
//! (`--abort.on.send.failure true`: the commit point stays below the record and the mirror
//! stops) or counted as dropped.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use crate::mirror::clients::{self, Cluster};
use crate::mirror::flush::purged;
use crate::mirror::limits::TargetLimits;
use crate::mirror::offsets::{Outcome, Ticket};
use crate::mirror::state::{MissingTarget, Stats, StreamShared};
use crate::mirror::timestamps;

pub(crate) type MirrorProducer = BaseProducer<DeliveryContext>;

/// A record produced from `ticket` will never reach the target.
pub(super) fn send_failed(
    shared: &StreamShared,
    ticket: Ticket,
    target_topic: &str,
    target_partition: Option<i32>,
    error: &KafkaError,
) {
    if maybe_deleted(error) && target_missing(shared, ticket, target_topic, error) {
        return;
    }
    send_failed_as(shared, ticket, target_topic, target_partition, error, None);
}

/// Whether a record refused with `error` may have met a deleted target topic. An unknown
/// topic says so; so does an unknown partition in a delivery report: librdkafka fails the
/// records queued for a topic whose metadata went to 0 partitions (Kafka's answer for a
/// deleted topic) as UNKNOWN_PARTITION. Partitions of a Kafka topic are never removed, so
/// for a topic the mirror makes (and grew to the source's count at assignment) a partition
/// gone missing means a topic deleted, perhaps made again with fewer: [`target_missing`]
/// makes or grows it again, and whatever the target cannot take then is refused there.
fn maybe_deleted(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
        )
    )
}

/// Whether librdkafka reports a record as destroyed (`__DESTROY`) while the stream runs
/// (not stopping: then the producer is being closed). It does so for the records still in a
/// partition's queue when it destroys the partition, and a partition of a running producer
/// is destroyed when it leaves the target's metadata: the records that were on the wire
/// when a target topic was deleted come back from their failed request into the removed
/// partition's queue (no broker takes it any more) and are dropped with it. Nothing else
/// will report them: taken as purged, they would stay unacknowledged for ever, the commit
/// point stuck below them. They go the way of the records refused as an unknown partition.
fn dropped_while_running(shared: &StreamShared, error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerDestroy)
        && !shared.control.stop_requested()
}

/// What a delivery report tells of a failed record beyond its error.
pub(super) struct Failed {
    /// Its key and value, in bytes.
    pub(super) bytes: usize,
    /// The target topic's `max.message.bytes`, if it was read.
    pub(super) limit: Option<usize>,
    /// The producer's `batch.size`.
    pub(super) batch_size: usize,
    /// The target producer's fatal error (librdkafka's `rd_kafka_fatal_error`), if it has one.
    pub(super) fatal: Option<(RDKafkaErrorCode, String)>,
}

/// As [`send_failed`], with what the delivery report told (`failed`) in the reason.
fn send_failed_as(
    shared: &StreamShared,
    ticket: Ticket,
    target_topic: &str,
    target_partition: Option<i32>,
    error: &KafkaError,
    failed: Option<&Failed>,
) {
    let mut reason = describe_send_error(error, target_topic, target_partition, failed);
    if matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::InvalidTimestamp | RDKafkaErrorCode::InvalidRecord)
    ) {
        // The record's own timestamp, as the tracker keeps it (the source's).
        let timestamp = shared.tracker().peek(ticket).and_then(|s| s.timestamp);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let advice = timestamps::refusal_advice(target_topic, timestamp.map(|t| now - t));
        reason = format!("{reason}: {advice}");
    }
    // A record failed with `Fatal` failed because the producer had failed: the record the
    // broker refused (reported before or after it) names the cause.
    let consequence = error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal);
    record_send_failure(
        shared,
        ticket,
        target_topic,
        &clients::code_name(error),
        &reason,
        consequence,
    );
}

/// The target topic of a record does not exist (deleted while running) and
/// `--create.topics` is on: the record is pinned (the commit point of its partition stays
/// below it) and the stream's loop creates the topic again and mirrors the partition
/// again from there.
/// Returns whether it did (`false`: not a topic it makes; a send failure as any other).
fn target_missing(
    shared: &StreamShared,
    ticket: Ticket,
    target_topic: &str,
    error: &KafkaError,
) -> bool {
    let Some(template) = shared.recreatable.get() else {
        return false;
    };
    let mut tracker = shared.tracker();
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
    let mut list = shared
        .missing_targets
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !list.contains(&missing) {
        tracing::warn!(
            stream = shared.stream,
            "target topic {target_topic} is missing (deleted while running?; a record sent \
             to it failed with {}): creating it again (--create.topics), then mirroring {}/{} \
             again from offset {offset}",
            clients::code_name(error),
            missing.source_topic,
            missing.partition
        );
        list.push(missing);
    }
    true
}

/// Like [`send_failed`](send_failed), with the reason given in words, counted
/// under `code` in `mirror_send_errors_total`.
pub(super) fn send_failed_because(
    shared: &StreamShared,
    ticket: Ticket,
    target_topic: &str,
    code: &str,
    reason: &str,
) {
    record_send_failure(shared, ticket, target_topic, code, reason, false);
}

/// [`send_failed_because`]; `consequence`: the record failed only because the producer had
/// failed already ([`Control::fail_as_consequence`](crate::mirror::state::Control)).
fn record_send_failure(
    shared: &StreamShared,
    ticket: Ticket,
    target_topic: &str,
    code: &str,
    reason: &str,
    consequence: bool,
) {
    shared.stats.recorded.count_send_error(code.to_owned());
    let mut tracker = shared.tracker();
    // Failed (abort: the commit point never passes it) or given up (skip: the commit point
    // passes it, and it is counted dropped, not acknowledged).
    let outcome = if shared.abort_on_send_failure {
        tracker.fail(ticket)
    } else {
        tracker.give_up(ticket)
    };
    let source = match outcome {
        Outcome::Recorded(s) => format!("{}/{} offset {}", s.topic, s.partition, s.offset),
        Outcome::Stale => "a record of a partition released since".to_owned(),
    };
    drop(tracker);
    if shared.abort_on_send_failure {
        let message = format!(
            "cannot mirror {source} to target topic {target_topic}: {reason}. Stopping \
             (--abort.on.send.failure true); the committed offset stays before this record"
        );
        if consequence {
            shared.control.fail_as_consequence(message);
        } else {
            shared.control.fail(message);
        }
    } else {
        Stats::add(&shared.stats.dropped, 1);
        tracing::warn!(
            stream = shared.stream,
            "dropped {source} (target topic {target_topic}): {reason} (--abort.on.send.failure false)"
        );
    }
}

fn describe_send_error(
    error: &KafkaError,
    topic: &str,
    partition: Option<i32>,
    failed: Option<&Failed>,
) -> String {
    let fatal = failed
        .and_then(|f| f.fatal.as_ref())
        .map(|(code, cause)| {
            format!(
                "; the target producer hit a fatal error at target partition {topic}/{}: \
                 {cause} ({code:?})",
                partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
            )
        })
        .unwrap_or_default();
    let refused = match failed.and_then(|f| f.fatal.as_ref()) {
        // The fatal error names the broker's refusal (gap-less guarantee).
        Some((_, cause)) if cause.contains("Message size too large") => {
            Some(RDKafkaErrorCode::MessageSizeTooLarge)
        }
        _ => error.rdkafka_error_code(),
    };
    let reason = match refused {
        Some(RDKafkaErrorCode::UnknownPartition) => format!(
            "the target topic {topic} has no partition {}: --partitioning preserve needs at \
             least as many partitions on the target as on the source; add partitions to the \
             target topic or use --partitioning hash",
            partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
        ),
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => too_large(topic, partition, failed),
        Some(RDKafkaErrorCode::BrokerDestroy) => format!(
            "the target producer dropped the record (BrokerDestroy): target partition \
             {topic}/{} left the target's metadata while the record was being sent (was the \
             target topic deleted?); make the topic again with at least the source's \
             partitions, or let the mirror make it (--create.topics), and restart",
            partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
        ),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => format!(
            "the target cluster does not allow the mirror's principal (the producer's \
             credentials: its sasl.username or its certificate's subject) to WRITE to topic \
             {topic} (TopicAuthorizationFailed): grant it WRITE on topic {topic}, e.g. \
             kafka-acls --add --allow-principal User:NAME --operation Write --topic {topic}"
        ),
        Some(code) => code.to_string(),
        None => error.to_string(),
    };
    format!("{reason}{fatal}")
}

/// A record or its batch refused as larger than the target topic takes: which, with the
/// record's size, the topic's limit and what to do.
fn too_large(topic: &str, partition: Option<i32>, failed: Option<&Failed>) -> String {
    let code = RDKafkaErrorCode::MessageSizeTooLarge;
    let at = format!(
        "target topic {topic} partition {}",
        partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
    );
    match failed {
        // A batch holds the record and the records around it, plus 61 bytes of batch header
        // and some per record: a record well below the limit was refused with its batch.
        Some(f) if f.limit.is_some_and(|l| f.bytes + BATCH_OVERHEAD <= l) => format!(
            "{code}: the record ({} bytes) fits {at} (max.message.bytes {}), but the batch it \
             was sent in did not: the producer's batch.size is {}; restart the mirror (it caps \
             batch.size at the smallest max.message.bytes of the target topics at start) or set \
             batch.size to at most {} in the producer config",
            f.bytes,
            f.limit.unwrap_or(0),
            f.batch_size,
            f.limit.unwrap_or(0)
        ),
        Some(Failed {
            bytes,
            limit: Some(limit),
            ..
        }) => format!(
            "{code}: the record ({bytes} bytes of key and value) is larger than {at} takes \
             (max.message.bytes {limit}); raise max.message.bytes of topic {topic} on the target \
             to at least {}, or drop or shrink such records with a handler",
            bytes + BATCH_OVERHEAD
        ),
        Some(Failed { bytes, .. }) => format!(
            "{code}: the record ({bytes} bytes of key and value) or its batch is larger than \
             {at} takes (its max.message.bytes, or the producer's message.max.bytes if set \
             lower; see `mirror-maker check`)"
        ),
        None => format!(
            "{code}: the record is larger than {at} takes (its max.message.bytes, or the \
             producer's message.max.bytes if set lower; see `mirror-maker check`)"
        ),
    }
}

/// What a batch of one record takes beyond its key and value, at least: the batch header (61
/// bytes) and the record's own framing.
const BATCH_OVERHEAD: usize = 72;

/// The producer's context: routes delivery reports to the stream's tracker.
pub(crate) struct DeliveryContext {
    pub(crate) shared: Arc<StreamShared>,
    /// The target topics' limits, to name them when a record is refused as too large.
    pub(crate) limits: Arc<TargetLimits>,
    /// The producer this is the context of (set once it is made), to read its fatal error
    /// when a delivery fails with one.
    pub(crate) producer: OnceLock<Weak<MirrorProducer>>,
}

impl DeliveryContext {
    /// What the report of a failed delivery of `message` tells.
    fn failed(&self, message: &BorrowedMessage<'_>) -> Failed {
        let fatal = self
            .producer
            .get()
            .and_then(Weak::upgrade)
            .and_then(|p| p.client().fatal_error());
        Failed {
            bytes: message.payload_len() + message.key_len(),
            limit: self.limits.limit_of(message.topic()),
            batch_size: self.limits.batch_size(),
            fatal,
        }
    }
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        clients::target_error(&self.shared, &error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        clients::target_statistics(&self.shared, &statistics);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let ticket = Ticket::from_opaque(opaque);
        if let Some(dead_letter) = self.shared.dead_letter.get() {
            let topic = match result {
                Ok(delivered) => delivered.topic(),
                Err((_, message)) => message.topic(),
            };
            if topic == dead_letter {
                // Reports come on the stream's own thread (it polls the producer), after the
                // produce call that counted the record.
                let _ = self.shared.dead_letters_in_flight.fetch_update(
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                    |n| n.checked_sub(1),
                );
            }
        }
        match result {
            Ok(delivered) => {
                Stats::add(&self.shared.stats.acknowledged, 1);
                // Latency runs from the source record's timestamp (kept by the tracker): the
                // report's own timestamp may be the target broker's log-append time.
                let mut tracker = self.shared.tracker();
                let acked = match tracker.ack(ticket) {
                    Outcome::Recorded(source) => {
                        let dead_letter = self.shared.dead_letter.get().map(String::as_str);
                        let mapping = self
                            .shared
                            .mapping
                            .as_ref()
                            .filter(|_| dead_letter != Some(delivered.topic()));
                        if let Some(mapping) = mapping {
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
            Err((error, message)) => undelivered(
                &self.shared,
                ticket,
                error,
                message.topic(),
                message.partition(),
                || self.failed(message),
            ),
        }
    }
}

/// A record the producer reports as not delivered with `error`, to target partition
/// `topic`/`partition`; `failed` tells what else the report says.
fn undelivered(
    shared: &StreamShared,
    ticket: Ticket,
    error: &KafkaError,
    topic: &str,
    partition: i32,
    failed: impl FnOnce() -> Failed,
) {
    if purged(error) && !dropped_while_running(shared, error) {
        // Purged (partitions released while records were queued, or a shutdown flush
        // that timed out) or the producer closed: they stay uncommitted, not failed.
        tracing::debug!(
            stream = shared.stream,
            "not acknowledged (purged or closed): {error}"
        );
        return;
    }
    // Records produced after this one may be queued behind it: any, unless it is a
    // dead-letter record, whose order matters only against the dead-letter records after it
    // (a record produced later is checked when it is produced, in the stream's send).
    let behind = if is_dead_letter(shared, topic) {
        shared.dead_letter_refused.store(true, Ordering::SeqCst);
        shared.dead_letters_in_flight.load(Ordering::SeqCst) > 0
    } else {
        true
    };
    if behind {
        shared
            .failed_with_records_behind
            .store(true, Ordering::SeqCst);
    }
    let failed = failed();
    let deleted = maybe_deleted(error) || dropped_while_running(shared, error);
    if !(deleted && target_missing(shared, ticket, topic, error)) {
        send_failed_as(shared, ticket, topic, Some(partition), error, Some(&failed));
    }
}

/// Whether target topic `topic` is the dead-letter topic (`--on.handler.error dead-letter`).
fn is_dead_letter(shared: &StreamShared, topic: &str) -> bool {
    shared.dead_letter.get().is_some_and(|d| d == topic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::state::Control;
    use crate::settings::routing::TopicTemplate;

    /// A stream's shared state with one record of `orders/0` at offset 250 in flight, its
    /// target topic made by the mirror (`--create.topics`) when `recreatable`.
    fn one_in_flight(recreatable: bool) -> (Arc<StreamShared>, Ticket) {
        let shared = StreamShared::new(
            0,
            Arc::new(Control::new()),
            Arc::new(Stats::default()),
            true,
            None,
        );
        if recreatable {
            let _ = shared
                .recreatable
                .set(TopicTemplate::parse("{topic}").expect("template"));
        }
        let ticket = shared.tracker().begin("orders", 0, 250, None, 10, 1);
        (shared, ticket)
    }

    fn no_report() -> Failed {
        Failed {
            bytes: 10,
            limit: None,
            batch_size: 1_000_000,
            fatal: None,
        }
    }

    /// librdkafka's report for a record it dropped with its partition: a deleted topic's
    /// partitions leave the producer's metadata, and records that were on the wire then
    /// (put back in the removed partition's queue by their retry) are reported when it is
    /// destroyed, with `__DESTROY`, though the producer runs on.
    fn destroyed() -> KafkaError {
        KafkaError::MessageProduction(RDKafkaErrorCode::BrokerDestroy)
    }

    #[test]
    fn a_record_dropped_with_its_removed_partition_is_mirrored_again_after_the_topic_is_made() {
        let (shared, ticket) = one_in_flight(true);
        undelivered(&shared, ticket, &destroyed(), "orders", 0, no_report);
        assert_eq!(
            *shared.missing_targets.lock().unwrap(),
            [MissingTarget {
                target_topic: "orders".to_owned(),
                source_topic: "orders".to_owned(),
                partition: 0,
            }]
        );
        assert_eq!(shared.control.failure(), None);
    }

    #[test]
    fn a_record_dropped_with_its_removed_partition_of_a_topic_not_made_stops_the_mirror() {
        let (shared, ticket) = one_in_flight(false);
        undelivered(&shared, ticket, &destroyed(), "orders", 0, no_report);
        let failure = shared.control.failure().expect("no failure");
        for part in [
            "orders/0 offset 250",
            "target partition orders/0",
            "BrokerDestroy",
        ] {
            assert!(failure.contains(part), "{part:?} not in {failure}");
        }
    }

    #[test]
    fn a_record_dropped_while_stopping_stays_uncommitted_without_a_failure() {
        let (shared, ticket) = one_in_flight(true);
        shared.control.request_stop();
        undelivered(&shared, ticket, &destroyed(), "orders", 0, no_report);
        assert!(shared.missing_targets.lock().unwrap().is_empty());
        assert_eq!(shared.control.failure(), None);
        // Uncommitted: no commit point passes it.
        let points = shared.tracker().commit_points();
        assert!(points.iter().all(|p| p.offset <= 250), "{points:?}");
    }

    /// `one_in_flight` with `--dead.letter.topic orders.refused`, and `others` more
    /// dead-letter records in flight.
    fn with_dead_letters_in_flight(others: usize) -> (Arc<StreamShared>, Ticket) {
        let (shared, ticket) = one_in_flight(false);
        let _ = shared.dead_letter.set("orders.refused".to_owned());
        shared
            .dead_letters_in_flight
            .store(others, Ordering::SeqCst);
        (shared, ticket)
    }

    fn refused() -> KafkaError {
        KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)
    }

    fn records_behind(shared: &StreamShared) -> bool {
        shared.failed_with_records_behind.load(Ordering::SeqCst)
    }

    #[test]
    fn a_refused_mirrored_record_has_records_behind_it() {
        let (shared, ticket) = with_dead_letters_in_flight(0);
        undelivered(&shared, ticket, &refused(), "orders", 0, no_report);
        assert!(records_behind(&shared));
    }

    #[test]
    fn a_refused_dead_letter_record_leaves_the_mirrored_records_around_it_to_be_delivered() {
        let (shared, ticket) = with_dead_letters_in_flight(0);
        undelivered(&shared, ticket, &refused(), "orders.refused", 0, no_report);
        assert!(!records_behind(&shared));
        assert!(shared.control.failure().is_some(), "still a send failure");
    }

    #[test]
    fn a_refused_dead_letter_record_has_the_dead_letter_records_after_it_behind_it() {
        let (shared, ticket) = with_dead_letters_in_flight(1);
        undelivered(&shared, ticket, &refused(), "orders.refused", 0, no_report);
        assert!(records_behind(&shared));
    }

    #[test]
    fn a_refused_write_names_the_topic_and_the_operation() {
        let error = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        let line = describe_send_error(&error, "orders", Some(1), None);
        assert!(line.contains("WRITE to topic orders"), "{line}");
        assert!(line.contains("TopicAuthorizationFailed"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn a_fatal_delivery_names_librdkafkas_cause_the_partition_and_the_limit() {
        let error = KafkaError::MessageProduction(RDKafkaErrorCode::Fatal);
        let cause = "ProduceRequest for orders [0] with 935 message(s) failed: Broker: Message \
                     size too large (broker 1 PID{Id:0,Epoch:0}, base seq 0): unable to satisfy \
                     gap-less guarantee";
        let failed = Failed {
            bytes: 1034,
            limit: Some(65_536),
            batch_size: 1_000_000,
            fatal: Some((RDKafkaErrorCode::GaplessGuarantee, cause.to_owned())),
        };
        let line = describe_send_error(&error, "orders", Some(0), Some(&failed));
        for part in [
            "the record (1034 bytes) fits target topic orders partition 0 (max.message.bytes \
             65536), but the batch it was sent in did not",
            "batch.size is 1000000",
            cause,
        ] {
            assert!(line.contains(part), "{part:?} not in {line}");
        }
    }
}
