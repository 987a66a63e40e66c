//! One batch stream on one thread: librdkafka's consumer keeps the group (subscription,
//! assignment, rebalance listener, commits) with its partitions paused from the moment they
//! are assigned, so it never fetches; our [`Fetcher`] reads the assigned partitions' batches,
//! [`prepare`] readies each for the target partition of the same number, our
//! [`BatchProducer`] sends them, and each acknowledgement advances the shared
//! [`OffsetTracker`](crate::mirror::offsets::OffsetTracker): a batch is begun there at its
//! first source offset when sent, and on its acknowledgement the partition's commit point
//! moves to the end of the batch (`advance_to_position`), so the commit point is the end of
//! the last acknowledged batch, never past one in flight or refused.
//!
//! Every Produce round is answered (or failed) before the consumer is polled again, so when
//! a rebalance callback runs nothing of this stream is waiting on the wire: a release drops the
//! released partitions' batches not yet sent, commits what was acknowledged, and calls the
//! user's listener. A batch whose Produce went unanswered in time may have been written: a
//! release sends it again for at most two request waits and commits it once answered; one
//! still unanswered may be applied later, after the next owner's copies (duplicates, nothing
//! lost), and keeps its sequences, so that no later batch is taken for it sent again.
//!
//! `--throttle.*.per.second`: each outgoing batch charges the shared buckets
//! ([`Throttle`](crate::mirror::throttle::Throttle)) as it is readied, with its size as sent
//! (header and records section, compressed as it came: what `mirror_bytes_consumed_total`
//! counts here; the records are never decompressed to count their keys and values) and its
//! record count ([`Hold`]). A debt of at least
//! [`MIN_PAUSE`](crate::mirror::throttle::MIN_PAUSE) stops the stream's fetches until it is
//! paid; batches already readied are still sent, and the consumer is polled all along, so the
//! stream stays in its group.
//!
//! The replication delay ([`crate::mirror::delay`]) and the lag come from the fetch responses'
//! high watermarks, not from librdkafka's statistics (its consumer does not fetch): at each
//! statistics interval, every owned partition's latest high watermark is observed with the
//! oldest source offset not yet acknowledged by the target (the batch in flight, else the
//! first one readied, else the fetch position).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::topic_partition_list::TopicPartitionList;

use super::batch::{prepare, prepare_before, split, without, BatchError, OutBatch, Stamp};
use super::cluster::UNKNOWN_TOPIC_OR_PARTITION;
use super::fetcher::{AbortedFilter, Fetched, Fetcher};
use super::producer::{BatchProducer, Outcome, RefusedRecord, RoundItem};
use crate::mirror::clients::{self, Cluster};
use crate::mirror::commit::{commit_async, commit_stored, commit_sync, final_commit};
use crate::mirror::delay::Observation;
use crate::mirror::limits::TargetLimits;
use crate::mirror::mapping::ledger::StreamMapping;
use crate::mirror::mapping::store::MappingStore;
use crate::mirror::offsets::Ticket;
use crate::mirror::route::StreamReport;
use crate::mirror::source::{call_listener, committed, make_target_topics, partition_list};
use crate::mirror::state::{Control, PartitionLag, ShutdownGate, Stats, StreamShared};
use crate::mirror::subscription::{SubscribeError, Subscription};
use crate::mirror::throttle::Hold;
use crate::mirror::topic_ids::TopicIds;
use crate::mirror::topics::TopicCreator;
use crate::mirror::Partition;
use crate::native::queue::{Polled, Source};
use crate::plugin::Listener;
use crate::settings::flags::SourceGap;
use crate::settings::{batch_request_wait, counted, Settings};

#[derive(Debug, thiserror::Error)]
pub enum BatchStreamError {
    #[error("stream {stream}: cannot create the {client}: {reason}")]
    Create {
        stream: usize,
        client: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    #[error("stream {stream}: final commit failed: {source}; the records after the last committed offsets will be mirrored again on restart (duplicates, no loss)")]
    FinalCommit { stream: usize, source: KafkaError },
}

/// The largest batch sent when the producer config does not say (`message.max.bytes`):
/// Kafka's default `max.message.bytes`.
const DEFAULT_MAX_BATCH: usize = 1_048_588;
/// How long a fetch waits for records when nothing else is to be done.
const IDLE_FETCH_WAIT: Duration = Duration::from_millis(100);
/// The pause before a round is sent again after every batch of it was to be retried.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// How long an idle loop polls the consumer before the next turn.
const IDLE_POLL: Duration = Duration::from_millis(10);
/// How often the replication delay and lag are observed when the consumer config names no
/// `statistics.interval.ms` (the record engine observes them at each statistics).
const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_secs(1);
/// How soon a target topic made again while running may be made again, while its metadata
/// propagates.
const TARGET_REMAKE_INTERVAL: Duration = Duration::from_secs(1);

/// A batch ready to go, and the sequence it was stamped with.
struct Queued {
    out: OutBatch,
    bytes: bytes::Bytes,
    sequence: i32,
    /// A send of it may have been applied though unanswered: its sequences may be the
    /// target's already, so they are never given to another batch.
    maybe_written: bool,
}

impl Queued {
    /// Stamped again (its sequences moved after an earlier batch was refused): the header,
    /// its CRC-32C and the bytes to send made again, the records untouched.
    fn restamp(&mut self, stamp: Stamp) {
        self.out.restamp(stamp);
        self.bytes = self.out.rejoin();
        self.sequence = stamp.base_sequence;
    }
}

/// A refused batch skipped (`--abort.on.send.failure false`): the target took none of its
/// sequences, so the partition's queued batches are stamped again from its first, and its next
/// batches follow them. Stamped as they were, the target would see a gap before each of them
/// (OUT_OF_ORDER_SEQUENCE_NUMBER) and refuse them all. A batch an earlier send may have written
/// keeps its sequences: they may be the target's.
fn give_back_sequences(
    producer: &mut BatchProducer,
    key: &Partition,
    part: &mut Part,
    refused: &Queued,
) {
    if !refused.maybe_written {
        restamp_queue(producer, key, part, refused.sequence);
    }
}

/// The partition's queued batches stamped again, in order, with sequences from `from` on, and
/// its next batches after them.
fn restamp_queue(producer: &mut BatchProducer, key: &Partition, part: &mut Part, from: i32) {
    producer.rewind(&part.target_topic, key.1, from);
    for step in part.queue.iter_mut() {
        if let Step::Send(q) = step {
            q.restamp(producer.stamp(&part.target_topic, key.1));
            producer.advance(&part.target_topic, key.1, q.out.records);
        }
    }
}

/// The target's `message` on a refused batch, with the source offsets of the records it named
/// as the cause and what it said of each.
fn name_refused_records(out: &OutBatch, message: &str, records: &[RefusedRecord]) -> String {
    if records.is_empty() {
        return message.to_owned();
    }
    let named: Vec<String> = records
        .iter()
        .map(|r| {
            let offset = if r.index < out.records.max(0) as usize {
                out.source_offset(r.index).to_string()
            } else {
                format!("index {} (not in the batch)", r.index)
            };
            if r.message.is_empty() {
                offset
            } else {
                format!("{offset} ({})", r.message)
            }
        })
        .collect();
    format!(
        "{message}; the target named source offset {}",
        named.join(", ")
    )
}

/// What comes next for a partition, in source order.
enum Step {
    /// A batch to send.
    Send(Queued),
    /// A source record that alone makes a batch larger than the target topic takes, or the
    /// records of a batch with a snappy block larger than the engine decompresses at once: a
    /// send failure, met in order (after every batch before it is acknowledged).
    TooLarge {
        offset: i64,
        size: usize,
        limit: usize,
        /// What it is about: one record, or the batch's records from `offset` on.
        of: TooLargeOf,
    },
}

/// What a [`Step::TooLarge`] refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TooLargeOf {
    /// One record, larger than the target topic's `max.message.bytes` in a batch alone.
    Record,
    /// The records of a batch from the step's offset to `last` (`records` of them at most), a
    /// snappy block of which states more than the engine decompresses at once
    /// (`BatchError::BlockTooLarge`).
    SnappyBlock { last: i64, records: u32 },
}

/// The source records a refusal is about.
#[derive(Clone, Copy)]
struct Span {
    first_source_offset: i64,
    last_source_offset: i64,
    records: i32,
}

impl Span {
    fn of(out: &OutBatch) -> Span {
        Span {
            first_source_offset: out.first_source_offset,
            last_source_offset: out.last_source_offset,
            records: out.records,
        }
    }
}

/// One assigned partition.
struct Part {
    target_topic: String,
    /// The next source offset to fetch.
    position: i64,
    /// Prepared batches (and refusals) not yet sent, in order.
    queue: VecDeque<Step>,
    /// The batch sent and not yet acknowledged (sent again until it is).
    in_flight: Option<(Queued, Ticket)>,
    /// The largest batch its target topic takes: its `max.message.bytes` where it was read,
    /// at most the engine's bound (larger source batches are split).
    max_batch: usize,
    /// The source partition's high watermark in the latest fetch response that had one.
    high_watermark: Option<i64>,
    /// Since when every fetch of it has failed, and whether that was said at warn
    /// ([`FETCH_FAILING_WARN`]).
    failing: Option<(Instant, bool)>,
    /// The first source offset of its batch that met a sequence gap, for which the producer
    /// took a new id, until the partition has a batch acknowledged: that batch meeting one
    /// again stops the stream.
    gap_at: Option<i64>,
}

/// How long every fetch of a partition may fail before it is said at warn: single failures
/// (a leader moving, a broker restarting) are ridden out and logged at debug; a partition that
/// copies nothing for this long (a broker whose answers the engine cannot read) must be seen.
const FETCH_FAILING_WARN: Duration = Duration::from_secs(30);

impl Part {
    /// The oldest source offset the target has not acknowledged: the batch in flight, else
    /// the first readied, else the next to fetch.
    fn replicated_to(&self) -> i64 {
        self.in_flight
            .as_ref()
            .map(|(q, _)| q.out.first_source_offset)
            .or_else(|| {
                self.queue.front().map(|step| match step {
                    Step::Send(q) => q.out.first_source_offset,
                    Step::TooLarge { offset, .. } => *offset,
                })
            })
            .unwrap_or(self.position)
    }

    /// Whether its batch in flight may have been written though the target did not answer.
    fn unanswered(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|(q, _)| q.maybe_written)
    }
}

/// What the batch engine holds for one stream: behind a lock shared by the loop and the
/// rebalance callbacks (which run inside the loop's consumer poll, never during a round).
pub(crate) struct Engine {
    fetcher: Fetcher,
    producer: BatchProducer,
    parts: HashMap<Partition, Part>,
    max_batch: usize,
}

pub(crate) struct BatchContext {
    shared: Arc<StreamShared>,
    engine: Mutex<Engine>,
    settings_gap: SourceGap,
    target_template: crate::settings::routing::TopicTemplate,
    listener: Option<Mutex<Listener>>,
    topics: Option<Arc<TopicCreator>>,
    /// The target topics' `max.message.bytes`, read once per topic (shared with the record
    /// engine's streams).
    limits: Arc<TargetLimits>,
    topic_retry_limit: Duration,
    /// Set once the final commit is made: a revocation while closing only forgets.
    closing: AtomicBool,
    /// The records librdkafka's consumer fetched itself, from its statistics (`rxmsgs`):
    /// stays 0, its partitions being paused as they are assigned.
    consumer_fetched: AtomicI64,
    /// Whether a statistics report arrived at all.
    statistics_seen: AtomicBool,
    /// auto.offset.reset: latest (true) or earliest.
    reset_latest: bool,
}

type BatchConsumer = BaseConsumer<BatchContext>;

impl rdkafka::client::ClientContext for BatchContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Source, level, fac, message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        let fetched: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0)
            .map(|p| i64::try_from(p.rxmsgs).unwrap_or(i64::MAX))
            .sum();
        self.consumer_fetched.fetch_max(fetched, Ordering::Relaxed);
        self.statistics_seen.store(true, Ordering::Relaxed);
        // The group consumer fetches nothing, but it keeps the group's connections: its
        // statistics say whether the source is in reach, as the record engine's do (an
        // answered fetch says so too).
        self.shared
            .source_up
            .observe(clients::in_reach(&statistics));
    }

    fn error(&self, error: KafkaError, reason: &str) {
        clients::client_error(
            &self.shared.control,
            Cluster::Source,
            self.shared.stream,
            &error,
            reason,
        );
    }
}

impl ConsumerContext for BatchContext {
    fn pre_rebalance(&self, consumer: &BatchConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let partitions = partition_list(tpl);
                self.shared.released(&partitions);
                self.release(consumer, &partitions);
                if !partitions.is_empty() {
                    call_listener(
                        &self.listener,
                        &self.shared,
                        "before_releasing_partitions",
                        |l| l.before_releasing_partitions(&partitions),
                    );
                }
            }
            Rebalance::Assign(tpl) => {
                // Paused before librdkafka starts them (the pause flag survives the assign);
                // paused again after, in `post_rebalance`.
                let _ = consumer.pause(tpl);
                let partitions = partition_list(tpl);
                if let Some(creator) = &self.topics {
                    make_target_topics(creator, &partitions, &self.shared, self.topic_retry_limit);
                }
            }
            Rebalance::Error(e) => {
                tracing::warn!(stream = self.shared.stream, "rebalance error: {e}")
            }
        }
    }

    fn post_rebalance(&self, consumer: &BatchConsumer, rebalance: &Rebalance<'_>) {
        Stats::add(&self.shared.stats.rebalances, 1);
        if let Rebalance::Assign(tpl) = rebalance {
            if let Err(e) = consumer.pause(tpl) {
                self.shared.control.fail(format!(
                    "stream {}: cannot pause the assigned partitions of the source consumer \
                     ({e}); the batch engine reads them itself and must not let it fetch",
                    self.shared.stream
                ));
                return;
            }
            self.shared.assigned.store(true, Ordering::SeqCst);
            self.assign(consumer, tpl);
            let partitions = partition_list(tpl);
            self.shared.took(&partitions);
            if !partitions.is_empty() {
                let id = crate::native::member_id(consumer);
                call_listener(
                    &self.listener,
                    &self.shared,
                    "before_starting_fetchers",
                    |l| l.before_starting_fetchers(&id, &partitions),
                );
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        committed(&self.shared, &result, offsets.count());
    }
}

impl BatchContext {
    fn engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the assigned partitions at their committed offsets, or where
    /// `auto.offset.reset` says.
    fn assign(&self, consumer: &BatchConsumer, tpl: &TopicPartitionList) {
        let stream = self.shared.stream;
        let committed = match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(c) => c,
            Err(e) => {
                self.shared.control.fail(format!(
                    "stream {stream}: cannot read the committed offsets of the assigned \
                     partitions: {e}; restart the mirror"
                ));
                return;
            }
        };
        let mut engine = self.engine();
        let mut list = Vec::new();
        for e in committed.elements() {
            let (topic, partition) = (e.topic().to_owned(), e.partition());
            let start = match e.offset() {
                rdkafka::Offset::Offset(o) => o,
                _ => {
                    let at = if self.reset_latest { -1 } else { -2 };
                    match engine.fetcher.list_offset(&topic, partition, at) {
                        Ok(o) => o,
                        Err(reason) => {
                            self.shared.control.fail(format!(
                                "stream {stream}: source {topic}/{partition} has no committed \
                                 offset and its start cannot be found: {reason}"
                            ));
                            return;
                        }
                    }
                }
            };
            self.shared.tracker().expect_start(&topic, partition, start);
            list.push(format!("{topic}/{partition} at {start}"));
            let target_topic = self.target_template.render(&topic);
            let topic_limit = self
                .limits
                .read(std::slice::from_ref(&target_topic))
                .first()
                .map(|(_, limit)| *limit);
            let max_batch =
                topic_limit.map_or(engine.max_batch, |limit| limit.min(engine.max_batch));
            engine.parts.insert(
                (topic, partition),
                Part {
                    target_topic,
                    position: start,
                    queue: VecDeque::new(),
                    in_flight: None,
                    max_batch,
                    high_watermark: None,
                    failing: None,
                    gap_at: None,
                },
            );
        }
        tracing::info!(
            stream,
            "assigned {} (batch engine): {}",
            counted(list.len(), "partition"),
            list.join(" ")
        );
    }

    /// Before partitions go: nothing of theirs is on the wire (rounds end before the consumer
    /// is polled); their prepared batches are dropped (the next owner copies them from the
    /// commit), the acknowledged offsets committed, the partitions forgotten.
    fn release(&self, consumer: &BatchConsumer, partitions: &[Partition]) {
        if partitions.is_empty() {
            return;
        }
        let stream = self.shared.stream;
        {
            let mut engine = self.engine();
            let mut released: Vec<(Partition, Part)> = partitions
                .iter()
                .filter_map(|p| engine.parts.remove(p).map(|part| (p.clone(), part)))
                .collect();
            // A lost assignment's next owner may be copying already: nothing is sent again,
            // lest it land among that owner's copies (the unanswered request itself still
            // may, as after a release whose resends go unanswered).
            if !consumer.assignment_lost() {
                self.settle_unanswered(&mut engine, &mut released);
            }
            for (p, part) in released {
                // The batches not written go again under these sequences, whoever copies
                // them next; a batch that may have been written keeps its own (the target
                // would take a later batch of its count under them for it sent again).
                let first = part
                    .in_flight
                    .as_ref()
                    .filter(|(q, _)| !q.maybe_written)
                    .map(|(q, _)| q.sequence)
                    .or_else(|| {
                        part.queue.iter().find_map(|step| match step {
                            Step::Send(q) => Some(q.sequence),
                            Step::TooLarge { .. } => None,
                        })
                    });
                if let Some(sequence) = first {
                    engine.producer.rewind(&part.target_topic, p.1, sequence);
                }
            }
        }
        if consumer.assignment_lost() {
            // As the record engine says it: the group gave them away without this member
            // (session timed out, poll interval passed), so nothing is committed.
            tracing::warn!(
                stream,
                "the group took back {} from this stream (assignment lost); releasing them \
                 without committing, their batches not yet acknowledged dropped: the next \
                 owner mirrors them again from the last commit (duplicates, no loss)",
                counted(partitions.len(), "partition")
            );
        } else if !self.closing.load(Ordering::SeqCst) {
            match commit_sync(consumer, &self.shared, Some(partitions)) {
                Ok(n) => tracing::info!(
                    stream,
                    "released {} after committing {}",
                    counted(partitions.len(), "partition"),
                    counted(n, "offset")
                ),
                Err(e) => tracing::warn!(
                    stream,
                    "commit before releasing {} failed: {e}; the next owner mirrors again what \
                     was acknowledged after the last commit (duplicates, no loss)",
                    counted(partitions.len(), "partition")
                ),
            }
        }
        self.shared.forget(partitions);
    }

    /// Before partitions go, the batches of theirs whose Produce may have been applied though
    /// unanswered are sent again (same bytes, same sequences) until the target answers, for at
    /// most two request waits in all (every wait within, connections, answers and metadata
    /// refreshes, ends at that one deadline): an acknowledgement (or DUPLICATE_SEQUENCE_NUMBER) says the batch
    /// is on the target once, and its commit point moves past it before the release commits,
    /// so the next owner neither copies it again nor sees it land after its own copies (the
    /// request left behind would be a duplicate of our sequences). One still unanswered when
    /// the time is up is said in a warning: it may still land, after the next owner's copies.
    fn settle_unanswered(&self, engine: &mut Engine, released: &mut [(Partition, Part)]) {
        let stream = self.shared.stream;
        let wait = engine.producer.cluster.timeout() * 2;
        let unanswered = released
            .iter()
            .filter(|(_, part)| part.unanswered())
            .count();
        if unanswered == 0 {
            return;
        }
        // Said, because the release waits for it (a slow target slows the hand-over).
        tracing::info!(
            stream,
            "releasing {} with {unanswered} {} unanswered by the target: sending {} again \
             for at most {wait:?} before the commit",
            counted(released.len(), "partition"),
            if unanswered == 1 { "batch" } else { "batches" },
            if unanswered == 1 { "it" } else { "them" }
        );
        let deadline = Instant::now() + wait;
        // Resends the target refused: not sent again, their batch's sequences kept (below).
        let mut refused_again: Vec<usize> = Vec::new();
        loop {
            let pending: Vec<usize> = released
                .iter()
                .enumerate()
                .filter(|(n, (_, part))| part.unanswered() && !refused_again.contains(n))
                .map(|(n, _)| n)
                .collect();
            if pending.is_empty() {
                return;
            }
            if Instant::now() >= deadline || self.shared.control.stop_requested() {
                for &n in &pending {
                    let (key, part) = &released[n];
                    let (q, _) = part.in_flight.as_ref().expect("pending");
                    tracing::warn!(
                        stream,
                        "releasing {}/{} with its batch of source offsets {} to {} unanswered by \
                         target {}/{}: it may still be written, after the next owner's copies \
                         of it (duplicates out of order, nothing lost)",
                        key.0,
                        key.1,
                        q.out.first_source_offset,
                        q.out.last_source_offset,
                        part.target_topic,
                        key.1
                    );
                }
                return;
            }
            let items: Vec<RoundItem<'_>> = pending
                .iter()
                .map(|&n| {
                    let (key, part) = &released[n];
                    let (q, _) = part.in_flight.as_ref().expect("pending");
                    RoundItem {
                        topic: &part.target_topic,
                        partition: key.1,
                        batch: q.bytes.clone(),
                    }
                })
                .collect();
            let outcomes = engine.producer.send_round_by(&items, Some(deadline));
            drop(items);
            if outcomes.iter().all(|o| matches!(o, Outcome::Retry { .. })) {
                std::thread::sleep(
                    RETRY_BACKOFF.min(deadline.saturating_duration_since(Instant::now())),
                );
            }
            for (&n, outcome) in pending.iter().zip(outcomes) {
                let (key, part) = &mut released[n];
                match outcome {
                    Outcome::Acked { base_offset } => {
                        let (q, ticket) = part.in_flight.take().expect("pending");
                        record_ack(
                            &self.shared,
                            key,
                            &part.target_topic,
                            &q.out,
                            ticket,
                            base_offset,
                        );
                        tracing::info!(
                            stream,
                            "{}/{}: the batch of source offsets {} to {}, unanswered before, is \
                             on the target; committed with the release",
                            key.0,
                            key.1,
                            q.out.first_source_offset,
                            q.out.last_source_offset
                        );
                    }
                    // Not written by this send: the one before it may be, so it stays pending.
                    Outcome::Retry { .. } | Outcome::Deferred => {}
                    // A gap: the target has neither this send nor the earlier one (it would
                    // have answered that one a duplicate); the next owner meets the batch.
                    Outcome::Gap => {
                        if let Some((q, _)) = part.in_flight.as_mut() {
                            q.maybe_written = false;
                        }
                    }
                    // Refused: Kafka validates a batch before it looks for a duplicate, so the
                    // earlier send may still have been written (its timestamps since too
                    // old, say): its sequences stay the target's; the next owner meets it.
                    Outcome::Refused { .. } => refused_again.push(n),
                }
            }
            self.shared.turned(Instant::now());
        }
    }
}

pub(crate) struct BatchStream<'s> {
    stream: usize,
    settings: &'s Settings,
    shared: Arc<StreamShared>,
    source: Source<BatchContext>,
    subscription: Subscription,
    gate: Arc<ShutdownGate>,
    /// The source topics' ids: a topic deleted and created again is mirrored again from its
    /// beginning.
    topic_ids: TopicIds,
    /// The hold of `--throttle.*.per.second`: the stream's fetches held back until the debt
    /// is paid; the time until the first fetch after it is the time throttled
    /// (`mirror_throttled_seconds_total`).
    hold: Hold,
    /// When the replication delay and the lag are observed next, and how often.
    next_observation: Cell<Instant>,
    observe_interval: Duration,
    /// When each target topic found missing while running was last made again.
    targets_made: RefCell<HashMap<String, Instant>>,
    /// How long a target topic may be missing before its batches fail, without
    /// `--create.topics`, and a target partition in any case: the producer's
    /// `topic.metadata.propagation.max.ms`.
    propagation_limit: Duration,
    /// Partitions whose target topic has no such partition, since their first batch was
    /// refused for it.
    absent_since: RefCell<HashMap<Partition, Instant>>,
}

impl<'s> BatchStream<'s> {
    pub(crate) fn new(
        stream: usize,
        settings: &'s Settings,
        control: Arc<Control>,
        stats: Arc<Stats>,
        gate: Arc<ShutdownGate>,
        (topics, store, limits): (
            Option<Arc<TopicCreator>>,
            Option<Arc<MappingStore>>,
            Arc<TargetLimits>,
        ),
    ) -> Result<BatchStream<'s>, BatchStreamError> {
        let create = |client, reason: String| BatchStreamError::Create {
            stream,
            client,
            reason,
        };
        let shared = StreamShared::new(
            stream,
            control,
            stats,
            settings.options.abort_on_send_failure,
            store.map(|s| StreamMapping::new(s)),
        );
        // Bounded by the poll interval: the consumer is polled between rounds only.
        let timeout = batch_request_wait(settings);
        let fetcher = Fetcher::new(&settings.consumer, timeout)
            .map_err(|e| create("source fetcher", e.to_string()))?;
        let producer = BatchProducer::new(&settings.producer, timeout)
            .map_err(|e| create("target producer", e.to_string()))?;
        let listener = settings
            .listener
            .as_ref()
            .map(|l| l.instance().map(Mutex::new))
            .transpose()
            .map_err(|e| create("rebalance listener", e.to_string()))?;
        let max_batch = settings
            .producer
            .get("message.max.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_BATCH)
            .min(DEFAULT_MAX_BATCH);
        let context = BatchContext {
            shared: shared.clone(),
            engine: Mutex::new(Engine {
                fetcher,
                producer,
                parts: HashMap::new(),
                max_batch,
            }),
            settings_gap: settings.on_source_gap,
            target_template: settings.target_topic.clone(),
            listener,
            topics,
            limits,
            topic_retry_limit: Duration::from_millis(
                (settings.consumer.max_poll_interval().as_millis() as u64) / 3,
            ),
            closing: false.into(),
            consumer_fetched: 0.into(),
            statistics_seen: false.into(),
            reset_latest: settings
                .consumer
                .get("auto.offset.reset")
                .is_some_and(|v| matches!(v, "latest" | "largest" | "end")),
        };
        let consumer: BatchConsumer = settings
            .consumer
            .client_config()
            .create_with_context(context)
            .map_err(|e| create("source consumer", e.to_string()))?;
        let source = Source::new(consumer)
            .ok_or_else(|| create("source consumer queue (is group.id set?)", String::new()))?;
        Ok(BatchStream {
            stream,
            settings,
            shared,
            source,
            subscription: Subscription::new(stream, ""),
            gate,
            topic_ids: TopicIds::new(stream, settings.options.topic_refresh_interval),
            hold: Hold::default(),
            next_observation: Cell::new(Instant::now()),
            observe_interval: settings
                .consumer
                .get("statistics.interval.ms")
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map_or(DEFAULT_OBSERVE_INTERVAL, Duration::from_millis),
            targets_made: RefCell::default(),
            propagation_limit: crate::mirror::metadata::propagation_limit(&settings.producer),
            absent_since: RefCell::default(),
        })
    }

    fn context(&self) -> &BatchContext {
        self.source.consumer().context()
    }

    pub(crate) fn run(
        mut self,
        initial_topics: Vec<String>,
    ) -> Result<StreamReport, BatchStreamError> {
        let subscribed =
            self.subscription
                .subscribe(self.source.consumer(), self.settings, initial_topics);
        if let Err(e) = subscribed {
            self.gate.arrive();
            return Err(e.into());
        }
        self.check_topic_ids();
        let mut next_commit = Instant::now() + self.settings.options.commit_interval;
        let mut next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
        while !self.shared.control.stop_requested() {
            self.poll_consumer(Duration::ZERO);
            // Partitions of a topic found created again, assigned since the check.
            self.restart_recreated();
            let busy = self.turn();
            if !busy {
                // Held by the throttle: back as its debt is paid.
                self.poll_consumer(self.hold.poll_wait(IDLE_POLL));
            }
            let now = Instant::now();
            self.shared.turned(now);
            if now >= next_commit {
                let _ = commit_async(&self.source, &self.shared);
                next_commit = now + self.settings.options.commit_interval;
            } else {
                let _ = commit_stored(&self.source, &self.shared);
            }
            if now >= next_refresh {
                self.subscription
                    .refresh(self.source.consumer(), self.settings);
                self.check_topic_ids();
                next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
            }
        }
        self.shutdown()
    }

    /// Asks the source for the ids of the subscribed topics (see [`crate::mirror::topic_ids`]):
    /// a topic whose id changed was deleted and created again, and a fetch at the old
    /// position would read the new topic from there; its partitions are started again from
    /// offset 0.
    fn check_topic_ids(&mut self) {
        self.topic_ids.check(
            self.source.consumer().client(),
            self.subscription.topics(),
            &self.shared.stats.recorded,
        );
        self.restart_recreated();
    }

    /// Starts the assigned partitions of source topics found created again from offset 0 of
    /// the new topic, each once, between rounds: their prepared batches of the old topic not
    /// yet sent are dropped (their sequences given back), the one on its way is acknowledged
    /// as any other (copied from the old topic); the tracker's commit point is 0 at once and
    /// the old topic's acknowledgements never move it.
    fn restart_recreated(&mut self) {
        if !self.topic_ids.has_pending() {
            return;
        }
        let context = self.source.consumer().context();
        let mut engine = context.engine();
        let Engine {
            parts, producer, ..
        } = &mut *engine;
        let assigned: Vec<Partition> = parts.keys().cloned().collect();
        let mut started = Vec::new();
        for key in self.topic_ids.due(&assigned) {
            let Some(part) = parts.get_mut(&key) else {
                continue;
            };
            let first = part.queue.iter().find_map(|step| match step {
                Step::Send(q) => Some(q.sequence),
                Step::TooLarge { .. } => None,
            });
            if let Some(sequence) = first {
                producer.rewind(&part.target_topic, key.1, sequence);
            }
            part.queue.clear();
            let abandoned = part.position;
            part.position = 0;
            self.shared.tracker().restart_at(&key.0, key.1, 0);
            started.push((key.0, key.1, Some(abandoned)));
        }
        drop(engine);
        self.topic_ids.report(&started);
    }

    /// Serves the consumer's events (rebalances, commit results, statistics), every one
    /// queued when it is called, then waits up to `timeout` for one more. (A poll without a
    /// wait serves one event; a turn that the target holds for seconds polls once, while
    /// each periodic commit's result, every log line and statistics add one: served one a
    /// turn, a revocation queued behind them was never reached, and a joining instance never
    /// got its partitions.) A record it returns would mean it fetched: counted, never
    /// mirrored (our fetcher reads it).
    fn poll_consumer(&self, timeout: Duration) {
        for _ in 0..self.source.queued() {
            self.serve(Duration::ZERO);
        }
        self.serve(timeout);
    }

    fn serve(&self, timeout: Duration) {
        match self.source.poll(timeout) {
            Polled::Nothing => {}
            Polled::Record(r) => {
                tracing::warn!(
                    stream = self.stream,
                    "the source consumer returned {}/{} offset {} although its partitions are \
                     paused; not mirrored from it (the batch engine reads the partition itself)",
                    r.topic(),
                    r.partition(),
                    r.offset()
                );
                self.context()
                    .consumer_fetched
                    .fetch_add(1, Ordering::Relaxed);
            }
            Polled::Error { error, reason } => clients::client_error(
                &self.shared.control,
                Cluster::Source,
                self.stream,
                &error,
                &reason,
            ),
        }
    }

    /// One Produce round, with the next fetch on the wire meanwhile. Returns whether there is
    /// work left.
    ///
    /// The fetch asks for every partition that will have nothing queued once this round has
    /// sent its next batch, and is sent before the round and read after it: the source's
    /// leaders answer while the target's acknowledge (the two waits overlap, where a fetch
    /// after the round would add them up). Each partition still has at most one batch in
    /// flight, and what is fetched is queued behind what is already queued, in offset order.
    fn turn(&self) -> bool {
        let context = self.context();
        let mut engine = context.engine();
        let engine = &mut *engine;
        let pending = engine
            .parts
            .values()
            .any(|p| !p.queue.is_empty() || p.in_flight.is_some());
        let throttled = self.throttled(Instant::now());
        let wanted: Vec<(String, i32, i64)> = engine
            .parts
            .iter()
            .filter(|(_, p)| !throttled && p.queue.len() <= usize::from(p.in_flight.is_none()))
            .map(|((t, n), p)| (t.clone(), *n, p.position))
            .collect();
        let fetch = (!wanted.is_empty()).then(|| {
            let wait = if pending {
                Duration::ZERO
            } else {
                IDLE_FETCH_WAIT
            };
            engine.fetcher.send(wanted, wait)
        });
        let more = self.round(engine);
        let Some(fetch) = fetch else {
            self.observe(engine, false);
            return more;
        };
        let fetched = engine.fetcher.receive(fetch);
        // From the pause to the first fetch after it, as the record engine counts.
        self.hold.resumed(&self.shared.stats.throttled_micros);
        for f in fetched {
            if self.shared.control.stop_requested() {
                return false;
            }
            self.take(engine, f);
        }
        // Records fetched after everything was acknowledged: observed now, not at the next
        // interval. The next round may wait a whole request timeout on a target that does not
        // answer, and the latest observation, all copied, would read no delay meanwhile.
        let behind_again = !pending && engine.parts.values().any(|p| !p.queue.is_empty());
        self.observe(engine, behind_again);
        more || engine.parts.values().any(|p| !p.queue.is_empty())
    }

    /// Whether the throttle holds the fetches back at `now` (the time held counted from the
    /// first turn it does).
    fn throttled(&self, now: Instant) -> bool {
        self.hold.holds(now)
    }

    /// Charges one outgoing batch to the throttle, if there is one: a debt of
    /// [`MIN_PAUSE`](crate::mirror::throttle::MIN_PAUSE) or more holds the fetches back until
    /// it is paid (a smaller one is carried).
    fn charge(&self, (bytes, records): (u64, u64)) {
        let Some(throttle) = self.shared.stats.throttle.get() else {
            return;
        };
        self.hold.charge(throttle, bytes, records);
    }

    /// Once per statistics interval, or now when `now_anyway`: every owned partition's lag and
    /// replication delay, from its latest fetched high watermark (partitions not fetched yet
    /// are left out).
    fn observe(&self, engine: &Engine, now_anyway: bool) {
        let now = Instant::now();
        if now < self.next_observation.get() && !now_anyway {
            return;
        }
        self.next_observation.set(now + self.observe_interval);
        let mut lag = Vec::new();
        let mut observations = Vec::new();
        for ((topic, partition), part) in &engine.parts {
            let Some(high_watermark) = part.high_watermark else {
                continue;
            };
            lag.push(PartitionLag {
                topic: topic.clone(),
                partition: *partition,
                records: (high_watermark - part.position).max(0),
            });
            observations.push(Observation {
                partition: (topic.clone(), *partition),
                high_watermark,
                replicated_to: Some(part.replicated_to()),
            });
        }
        *self.shared.lag.lock().unwrap_or_else(|e| e.into_inner()) = lag;
        self.shared.delay.observe(now, &observations);
    }

    /// Prepares the batches of one fetched partition.
    fn take(&self, engine: &mut Engine, fetched: Fetched) {
        let key = (fetched.topic, fetched.partition);
        let (topic, partition) = (&key.0, key.1);
        let Some(part) = engine.parts.get_mut(&key) else {
            return;
        };
        if part.position != fetched.from {
            return;
        }
        let data = match fetched.result {
            Ok(d) => d,
            Err(1) => {
                // OFFSET_OUT_OF_RANGE: the source deleted records before they were read.
                let earliest = engine.fetcher.list_offset(topic, partition, -2);
                let latest = engine.fetcher.list_offset(topic, partition, -1);
                match (earliest, latest) {
                    (Ok(earliest), _) if part.position < earliest => {
                        let skipped = earliest - part.position;
                        self.shared
                            .stats
                            .recorded
                            .count_skipped("retention", skipped as u64);
                        if self.context().settings_gap == SourceGap::Abort {
                            self.shared.control.fail(format!(
                                "source records {topic}/{partition} offsets {} to {} ({skipped} \
                                 records) were deleted by the source's retention before they \
                                 were mirrored; they are not on the target. Stopping \
                                 (--on.source.gap abort) with the committed offset at or \
                                 before {}; to mirror on from offset {earliest} anyway, \
                                 restart with --on.source.gap skip",
                                part.position,
                                earliest - 1,
                                part.position
                            ));
                            return;
                        }
                        tracing::warn!(
                            stream = self.stream,
                            "source records {topic}/{partition} offsets {} to {} ({skipped} \
                             records) were deleted by the source's retention before they were \
                             mirrored; they are not on the target. Mirroring goes on from \
                             offset {earliest}",
                            part.position,
                            earliest - 1
                        );
                        part.position = earliest;
                        self.shared
                            .tracker()
                            .expect_start(topic, partition, earliest);
                    }
                    (_, Ok(latest)) if part.position > latest => {
                        tracing::warn!(
                            stream = self.stream,
                            "source {topic}/{partition}: offset {} is past the end ({latest}); \
                             going on from {latest}",
                            part.position
                        );
                        part.position = latest;
                    }
                    (e, l) => tracing::debug!(
                        "source {topic}/{partition}: OFFSET_OUT_OF_RANGE, then {:?} {:?}",
                        e.err(),
                        l.err()
                    ),
                }
                return;
            }
            Err(code) => {
                tracing::debug!(
                    stream = self.stream,
                    "fetch of source {topic}/{partition} at {}: {}",
                    part.position,
                    super::wire::error_name(code)
                );
                let (since, warned) = part.failing.get_or_insert((Instant::now(), false));
                if !*warned && since.elapsed() >= FETCH_FAILING_WARN {
                    *warned = true;
                    tracing::warn!(
                        stream = self.stream,
                        "source {topic}/{partition}: every fetch at offset {} failed for {} s \
                         (last: {}), nothing of it is copied; still trying (a leader that is \
                         down is waited for; a broker whose answers this engine cannot read \
                         needs --copy.mode records)",
                        part.position,
                        since.elapsed().as_secs(),
                        engine
                            .fetcher
                            .last_failure
                            .clone()
                            .unwrap_or_else(|| super::wire::error_name(code))
                    );
                }
                return;
            }
        };
        if let Some((since, true)) = part.failing.take() {
            tracing::info!(
                stream = self.stream,
                "source {topic}/{partition}: fetching again after {} s",
                since.elapsed().as_secs()
            );
        }
        self.shared.source_up.set(true);
        part.high_watermark = Some(data.high_watermark);
        let mut filter = AbortedFilter::new(data.aborted);
        let mut batches = split(data.records);
        for batch in batches.by_ref() {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    self.shared.control.fail(format!(
                        "stream {}: source {topic}/{partition}: {e}",
                        self.stream
                    ));
                    return;
                }
            };
            if batch.last_offset() < part.position {
                continue;
            }
            let next = batch.last_offset() + 1;
            if filter.is_aborted(&batch) || batch.is_control() {
                part.position = next;
                continue;
            }
            // A record the target topic cannot take splits the batch: what is before it is
            // sent, the record met as a send failure in its turn, what follows prepared after.
            let mut from = part.position;
            loop {
                let stamp = engine.producer.stamp(&part.target_topic, partition);
                let (outs, too_large) = match prepare(&batch, from, part.max_batch, stamp) {
                    Ok(outs) => (outs, None),
                    Err(BatchError::RecordTooLarge {
                        offset,
                        size,
                        limit,
                    }) => match prepare_before(&batch, from, offset, part.max_batch, stamp) {
                        Ok(outs) => (outs, Some((offset, size, limit, TooLargeOf::Record))),
                        Err(e) => {
                            self.shared.control.fail(format!(
                                "stream {}: source {topic}/{partition}: {e}",
                                self.stream
                            ));
                            return;
                        }
                    },
                    // Nothing of the batch can be read past the block: its records from
                    // `from` on are the send failure.
                    Err(BatchError::BlockTooLarge {
                        offset,
                        last_offset,
                        size,
                        limit,
                    }) => {
                        let first = from.max(offset);
                        let span = u32::try_from(last_offset - first + 1).unwrap_or(u32::MAX);
                        let records = span.min(batch.record_count().max(1) as u32);
                        let of = TooLargeOf::SnappyBlock {
                            last: last_offset,
                            records,
                        };
                        (Vec::new(), Some((first, size, limit, of)))
                    }
                    Err(e) => {
                        self.shared.control.fail(format!(
                            "stream {}: source {topic}/{partition}: {e}",
                            self.stream
                        ));
                        return;
                    }
                };
                let mut sequence = stamp.base_sequence;
                for out in outs {
                    self.count_read((topic, partition), out.records.max(0) as u64, out.size());
                    self.charge(out.throttle_cost());
                    engine
                        .producer
                        .advance(&part.target_topic, partition, out.records);
                    let (out, bytes) = out.detach();
                    let records = out.records;
                    part.queue.push_back(Step::Send(Queued {
                        out,
                        bytes,
                        sequence,
                        maybe_written: false,
                    }));
                    sequence = super::batch::next_sequence(sequence, records);
                }
                let Some((offset, size, limit, of)) = too_large else {
                    break;
                };
                let (records, last) = match of {
                    TooLargeOf::Record => (1, offset),
                    TooLargeOf::SnappyBlock { last, records } => (records, last),
                };
                self.count_read((topic, partition), u64::from(records), 0);
                part.queue.push_back(Step::TooLarge {
                    offset,
                    size,
                    limit,
                    of,
                });
                from = last + 1;
            }
            part.position = next;
        }
        self.settle(&key, part);
    }

    /// Sends the next batch of every partition that has one (or the one to retry) and
    /// applies the answers. Returns whether anything is left to send.
    fn round(&self, engine: &mut Engine) -> bool {
        let mut keys: Vec<Partition> = Vec::new();
        for (key, part) in engine.parts.iter_mut() {
            while part.in_flight.is_none() {
                let q = match part.queue.pop_front() {
                    None => break,
                    Some(Step::Send(q)) => q,
                    Some(Step::TooLarge {
                        offset,
                        size,
                        limit,
                        of,
                    }) => {
                        self.too_large(key, &part.target_topic, offset, (size, limit), of);
                        if self.settings.options.abort_on_send_failure {
                            // Nothing after it is sent: the stream stops here.
                            part.queue.clear();
                            return false;
                        }
                        continue;
                    }
                };
                let ticket = self.shared.tracker().begin_batch(
                    &key.0,
                    key.1,
                    q.out.first_source_offset,
                    q.out.size(),
                    q.out.records.max(0) as u32,
                );
                Stats::add(&self.shared.stats.produced, q.out.records as u64);
                part.in_flight = Some((q, ticket));
            }
            if part.in_flight.is_some() {
                keys.push(key.clone());
            }
        }
        if keys.is_empty() {
            return false;
        }
        let items: Vec<RoundItem<'_>> = keys
            .iter()
            .map(|k| {
                let part = &engine.parts[k];
                let (q, _) = part.in_flight.as_ref().expect("set above");
                RoundItem {
                    topic: &part.target_topic,
                    partition: k.1,
                    batch: q.bytes.clone(),
                }
            })
            .collect();
        let outcomes = engine.producer.send_round(&items);
        drop(items);
        let mut retries = 0;
        // Batches a round left out (a budget or a request cap): not sent, they say nothing
        // of the target.
        let mut deferred = 0;
        // Partitions whose batch met a sequence gap.
        let mut gaps: Vec<Partition> = Vec::new();
        // Partitions retried because their target topic is gone, by target topic.
        let mut missing: Vec<(String, Instant, Vec<Partition>)> = Vec::new();
        // Partitions retried because their target topic has no such partition.
        let mut absent: Vec<Partition> = Vec::new();
        for (key, outcome) in keys.iter().zip(outcomes) {
            let part = engine.parts.get_mut(key).expect("kept during the round");
            if let Outcome::Retry { .. } = &outcome {
                let cluster = &engine.producer.cluster;
                if let Some(since) = cluster.missing_since(&part.target_topic) {
                    match missing.iter_mut().find(|(t, ..)| *t == part.target_topic) {
                        Some((_, _, keys)) => keys.push(key.clone()),
                        None => missing.push((part.target_topic.clone(), since, vec![key.clone()])),
                    }
                } else if cluster.lacks_partition(&part.target_topic, key.1) {
                    absent.push(key.clone());
                }
            }
            match outcome {
                Outcome::Acked { base_offset } => {
                    if !self.absent_since.borrow().is_empty() {
                        self.absent_since.borrow_mut().remove(key);
                    }
                    // Past the batch that met a gap: a later gap is a new one.
                    part.gap_at = None;
                    let (q, ticket) = part.in_flight.take().expect("sent");
                    self.acked(key, &part.target_topic, &q.out, ticket, base_offset);
                    self.settle(key, part);
                }
                Outcome::Retry {
                    reason,
                    maybe_written,
                } => {
                    retries += 1;
                    if let Some((q, _)) = part.in_flight.as_mut() {
                        q.maybe_written |= maybe_written;
                    }
                    tracing::debug!(
                        stream = self.stream,
                        "target {}/{}: {reason}; sending the batch of source offsets {} to {} \
                         again",
                        part.target_topic,
                        key.1,
                        part.in_flight
                            .as_ref()
                            .map_or(0, |q| q.0.out.first_source_offset),
                        part.in_flight
                            .as_ref()
                            .map_or(0, |q| q.0.out.last_source_offset)
                    );
                }
                // Still in flight: sent, before its successors, in a later round.
                Outcome::Deferred => deferred += 1,
                // Sent again under a new producer id, below.
                Outcome::Gap => gaps.push(key.clone()),
                Outcome::Refused {
                    code,
                    message,
                    records,
                } => {
                    let (q, ticket) = part.in_flight.take().expect("sent");
                    if !self.settings.options.abort_on_send_failure
                        && self.skip_refused_records(
                            &mut engine.producer,
                            key,
                            part,
                            (&q, ticket),
                            &code,
                            &records,
                        )
                    {
                        continue;
                    }
                    let message = name_refused_records(&q.out, &message, &records);
                    let span = Span::of(&q.out);
                    let target_topic = &part.target_topic;
                    if self.refused(key, target_topic, span, ticket, &code, &message) {
                        // Nothing after it is sent: the stream stops here.
                        part.queue.clear();
                        return false;
                    }
                    give_back_sequences(&mut engine.producer, key, part, &q);
                    self.settle(key, part);
                }
            }
        }
        if !gaps.is_empty() && !self.renew_producer(engine, &gaps) {
            return false;
        }
        for (target_topic, since, keys) in missing {
            if !self.target_missing(engine, &target_topic, since, &keys) {
                return false;
            }
        }
        for key in absent {
            if !self.target_partition_absent(engine, &key) {
                return false;
            }
        }
        let sent = keys.len() - deferred;
        if sent > 0 {
            self.shared.target_up.set(retries < sent);
            if retries == sent {
                std::thread::sleep(RETRY_BACKOFF);
            }
        }
        true
    }

    /// A target topic the target's Metadata says does not exist (deleted while running), its
    /// partitions' batches retried: with `--create.topics`, made again as on assignment (with
    /// the source's partitions and configs), and the batches in flight go to it in order, as
    /// nothing after them was sent (at most once a second per topic, while its metadata
    /// propagates). Without it, once the topic has been missing for
    /// `topic.metadata.propagation.max.ms` (as librdkafka's producer waits), each batch is a
    /// send failure. Returns `false` when the stream stops at one (abort mode).
    fn target_missing(
        &self,
        engine: &mut Engine,
        target_topic: &str,
        since: Instant,
        keys: &[Partition],
    ) -> bool {
        let context = self.context();
        let Some(creator) = &context.topics else {
            if since.elapsed() < self.propagation_limit {
                return true;
            }
            let message = format!(
                "target topic {target_topic} does not exist (the target's Metadata has said so \
                 for {:.0?}: deleted while running?); make it again with at least the source's \
                 partitions, or let the mirror make it (--create.topics), and restart",
                since.elapsed()
            );
            let code = super::wire::error_name(UNKNOWN_TOPIC_OR_PARTITION);
            for key in keys {
                if !self.give_up_in_flight(engine, key, &code, &message) {
                    return false;
                }
            }
            return true;
        };
        {
            let mut made = self.targets_made.borrow_mut();
            if made
                .get(target_topic)
                .is_some_and(|at| at.elapsed() < TARGET_REMAKE_INTERVAL)
            {
                return true;
            }
            made.insert(target_topic.to_owned(), Instant::now());
        }
        let from: Vec<String> = keys
            .iter()
            .filter_map(|key| {
                let (q, _) = engine.parts.get(key)?.in_flight.as_ref()?;
                Some(format!(
                    "{}/{} again from offset {}",
                    key.0, key.1, q.out.first_source_offset
                ))
            })
            .collect();
        tracing::warn!(
            stream = self.stream,
            "target topic {target_topic} is missing (deleted while running?; a record sent to it \
             failed with {}): creating it again (--create.topics), then mirroring {}",
            super::wire::error_name(UNKNOWN_TOPIC_OR_PARTITION),
            from.join(", ")
        );
        creator.forget(target_topic);
        make_target_topics(creator, keys, &self.shared, context.topic_retry_limit);
        if let Err(e) = engine.producer.cluster.refresh(&[target_topic]) {
            tracing::debug!("target metadata: {e}");
        }
        true
    }

    /// A batch retried because its target topic has no such partition (fewer partitions than
    /// the source, and nothing growing it): tried again, the topic's metadata asked for again
    /// with each round, until `topic.metadata.propagation.max.ms` after the first refusal; then
    /// a send failure naming the topic and the partition, as the record engine's. A partition
    /// that exists but has no leader is not this: it waits. Returns `false` when the stream
    /// stops at it (abort mode).
    fn target_partition_absent(&self, engine: &mut Engine, key: &Partition) -> bool {
        let since = *self
            .absent_since
            .borrow_mut()
            .entry(key.clone())
            .or_insert_with(|| {
                tracing::info!(
                    stream = self.stream,
                    "target topic {} has no partition {} (yet): its batch from source offset \
                     {} is sent again, and the topic's metadata asked for again, for up to \
                     {:?} (topic.metadata.propagation.max.ms); then it is a send failure",
                    engine.parts[key].target_topic,
                    key.1,
                    engine.parts[key]
                        .in_flight
                        .as_ref()
                        .map_or(0, |(q, _)| q.out.first_source_offset),
                    self.propagation_limit
                );
                Instant::now()
            });
        let after = since.elapsed();
        if after < self.propagation_limit {
            return true;
        }
        // A later batch of the partition starts a new wait (the topic may have grown by then).
        self.absent_since.borrow_mut().remove(key);
        let message = format!(
            "the target topic {} has no partition {}, still after asking for its metadata for \
             {after:.0?} (the producer's topic.metadata.propagation.max.ms is {:?}): \
             --partitioning preserve needs at least as many partitions on the target as on the \
             source; add partitions to the target topic (or let the mirror make and grow it, \
             --create.topics)",
            engine.parts[key].target_topic, key.1, self.propagation_limit
        );
        self.give_up_in_flight(engine, key, "UnknownPartition", &message)
    }

    /// The partition's batch in flight, given up as a send failure (`code`, `message`): in
    /// abort mode nothing after it is sent and `false` is returned (the stream stops there);
    /// in skip mode it is dropped and counted and the partition goes on.
    fn give_up_in_flight(
        &self,
        engine: &mut Engine,
        key: &Partition,
        code: &str,
        message: &str,
    ) -> bool {
        let part = engine.parts.get_mut(key).expect("kept during the round");
        let Some((q, ticket)) = part.in_flight.take() else {
            return true;
        };
        let span = Span::of(&q.out);
        if self.refused(key, &part.target_topic, span, ticket, code, message) {
            part.queue.clear();
            return false;
        }
        give_back_sequences(&mut engine.producer, key, part, &q);
        self.settle(key, part);
        true
    }

    /// A partition with nothing queued or in flight is done up to its fetch position: the
    /// batches between its last acknowledged one and that position were dropped (transaction
    /// markers, aborted transactions, empty batches), so the commit point follows, and a
    /// source whose log ends with a marker is committed to its end (lag 0).
    fn settle(&self, key: &Partition, part: &Part) {
        if part.in_flight.is_none() && part.queue.is_empty() {
            self.shared
                .tracker()
                .advance_to_position(&key.0, key.1, part.position);
        }
    }

    fn acked(
        &self,
        key: &Partition,
        target_topic: &str,
        out: &OutBatch,
        ticket: Ticket,
        base_offset: i64,
    ) {
        record_ack(&self.shared, key, target_topic, out, ticket, base_offset);
    }

    /// Target partitions whose batch met a sequence gap (OUT_OF_ORDER_SEQUENCE_NUMBER): the
    /// target lacks a batch our producer sent there before. A batch released unanswered that
    /// never landed (its records were copied again by the partition's next owner: nothing
    /// lost), or records the target acknowledged and then lost (an unclean leader election:
    /// stopping would not bring them back). Either way the stream goes on as a restart would:
    /// the producer takes a new id ([`BatchProducer::renew`]) and every batch not yet
    /// acknowledged, of every partition, in flight or queued, is stamped again from sequence 0
    /// and sent in order. The same batch meeting a gap again under the new id stops the stream
    /// (`false`): the target is losing what it acknowledges.
    fn renew_producer(&self, engine: &mut Engine, gaps: &[Partition]) -> bool {
        for key in gaps {
            let part = engine.parts.get_mut(key).expect("kept during the round");
            let Some((q, _)) = part.in_flight.as_ref() else {
                continue;
            };
            let again = part.gap_at == Some(q.out.first_source_offset);
            let what = format!(
                "target {}/{} lacks a batch this stream's producer sent it before the one of \
                 source {}/{} offsets {} to {} ({}): a batch left unanswered at a release that it \
                 never wrote (copied again by the partition's next owner), or records it had \
                 acknowledged and lost (an unclean leader election; `mirror-maker verify` shows \
                 them)",
                part.target_topic,
                key.1,
                key.0,
                key.1,
                q.out.first_source_offset,
                q.out.last_source_offset,
                super::wire::error_name(45)
            );
            if again {
                self.shared.control.fail(format!(
                    "stream {}: {what}; met again under a new producer id: stopping with the \
                     committed offset at {}",
                    self.stream, q.out.first_source_offset
                ));
                return false;
            }
            tracing::warn!(
                stream = self.stream,
                "{what}; sending it and every batch after it again under a new producer id"
            );
            part.gap_at = Some(q.out.first_source_offset);
        }
        if let Err(e) = engine.producer.renew() {
            self.shared
                .control
                .fail(format!("stream {}: after a sequence gap: {e}", self.stream));
            return false;
        }
        let producer = &mut engine.producer;
        for (key, part) in engine.parts.iter_mut() {
            let mut next = 0;
            if let Some((q, _)) = part.in_flight.as_mut() {
                q.restamp(producer.stamp(&part.target_topic, key.1));
                // Never sent under the new id.
                q.maybe_written = false;
                next = super::batch::next_sequence(next, q.out.records);
            }
            restamp_queue(producer, key, part, next);
        }
        true
    }

    /// Skip mode, a batch the target refused for some of its records (`records`, as its answer
    /// names them): those are dropped, logged and counted; the batch's other records are
    /// encoded again and sent in its place, the first of them under its ticket (so the commit
    /// point stays at the batch's first record until they are acknowledged), before anything
    /// after it; the batches queued after it are stamped again to follow them. An earlier send
    /// of the batch that may have been written changes nothing: the first replacement, fewer
    /// records from the same first sequence, cannot pass for it (no DUPLICATE_SEQUENCE_NUMBER),
    /// and had it landed the target answers a sequence gap and the producer renews (duplicates,
    /// nothing lost). `false` when this cannot be done (the answer named no record, or each
    /// one, or a record kept cannot be encoded again): the batch is then skipped whole.
    fn skip_refused_records(
        &self,
        producer: &mut BatchProducer,
        key: &Partition,
        part: &mut Part,
        (q, ticket): (&Queued, Ticket),
        code: &str,
        records: &[RefusedRecord],
    ) -> bool {
        let count = q.out.records.max(0) as usize;
        let mut refused: Vec<usize> = records.iter().map(|r| r.index).collect();
        refused.sort_unstable();
        refused.dedup();
        if refused.is_empty() || refused.len() >= count || refused.iter().any(|&i| i >= count) {
            return false;
        }
        let stamp = Stamp {
            base_sequence: q.sequence,
            ..producer.stamp(&part.target_topic, key.1)
        };
        let outs = match without(&q.out, &refused, part.max_batch, stamp) {
            Ok(outs) if !outs.is_empty() => outs,
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!(
                    stream = self.stream,
                    "{}/{}: the records of the batch of source offsets {} to {} that the target \
                     did not refuse cannot be encoded again ({e}): the batch is skipped whole",
                    key.0,
                    key.1,
                    q.out.first_source_offset,
                    q.out.last_source_offset
                );
                return false;
            }
        };
        let kept: i32 = outs.iter().map(|o| o.records).sum();
        for &index in &refused {
            let said = records
                .iter()
                .find(|r| r.index == index)
                .map_or("", |r| r.message.as_str());
            let offset = q.out.source_offset(index);
            let mut what = format!(
                "target {}/{} refused source {}/{} offset {offset} (of the batch of offsets {} \
                 to {}): {code}{}{}",
                part.target_topic,
                key.1,
                key.0,
                key.1,
                q.out.first_source_offset,
                q.out.last_source_offset,
                if said.is_empty() { "" } else { ": " },
                said
            );
            if matches!(code, "InvalidTimestamp" | "InvalidRecord") {
                let advice = crate::mirror::timestamps::refusal_advice(&part.target_topic, None);
                what = format!("{what}: {advice}");
            }
            tracing::warn!(
                stream = self.stream,
                "{what}; skipped (--abort.on.send.failure false), the batch's {} sent again \
                 without it",
                counted(kept, "other record")
            );
            self.shared.stats.recorded.count_send_error(code.to_owned());
        }
        Stats::add(&self.shared.stats.dropped, refused.len() as u64);
        restamp_queue(
            producer,
            key,
            part,
            super::batch::next_sequence(q.sequence, kept),
        );
        let mut outs = outs.into_iter().map(|out| {
            let sequence = out.base_sequence();
            let (out, bytes) = out.detach();
            Queued {
                out,
                bytes,
                sequence,
                maybe_written: false,
            }
        });
        let first = outs.next().expect("not empty");
        let rest: Vec<Queued> = outs.collect();
        // Counted as produced when the refused batch went: not again when they go.
        let again: u64 = rest.iter().map(|r| r.out.records.max(0) as u64).sum();
        self.shared
            .stats
            .produced
            .fetch_sub(again, Ordering::Relaxed);
        for later in rest.into_iter().rev() {
            part.queue.push_front(Step::Send(later));
        }
        // The ticket stands for the first part now; the others take their own tickets.
        self.shared
            .tracker()
            .set_records(ticket, first.out.records.max(0) as u32);
        part.in_flight = Some((first, ticket));
        true
    }

    /// A batch the target refused (`code`, `message`): in abort mode the stream fails with the
    /// commit point at the batch and `true` is returned; in skip mode it is skipped, counted
    /// and committed past.
    fn refused(
        &self,
        key: &Partition,
        target_topic: &str,
        out: Span,
        ticket: Ticket,
        code: &str,
        message: &str,
    ) -> bool {
        self.shared.stats.recorded.count_send_error(code.to_owned());
        let mut what = format!(
            "target {target_topic}/{} refused the batch of source {}/{} offsets {} to {} ({}): \
             {code}{}{message}",
            key.1,
            key.0,
            key.1,
            out.first_source_offset,
            out.last_source_offset,
            counted(out.records, "record"),
            if message.is_empty() { "" } else { ": " }
        );
        if matches!(code, "InvalidTimestamp" | "InvalidRecord") {
            // Which records of the batch the target refused is not said, so neither is an age.
            let advice = crate::mirror::timestamps::refusal_advice(target_topic, None);
            what = format!("{what}: {advice}");
        }
        if self.settings.options.abort_on_send_failure {
            self.shared.tracker().fail(ticket);
            self.shared.control.fail(format!(
                "stream {}: {what}; stopping (--abort.on.send.failure true) with the committed \
                 offset at {}: fix the cause and restart",
                self.stream, out.first_source_offset
            ));
            true
        } else {
            tracing::warn!(
                stream = self.stream,
                "{what}; skipped (--abort.on.send.failure false)"
            );
            Stats::add(&self.shared.stats.dropped, out.records as u64);
            let mut tracker = self.shared.tracker();
            tracker.give_up(ticket);
            tracker.advance_to_position(&key.0, key.1, out.last_source_offset + 1);
            false
        }
    }

    /// A source record no batch the target topic takes can hold, met after every batch before
    /// it was acknowledged: the send failure the target would answer (MESSAGE_TOO_LARGE), as
    /// the record engine meets it. Abort: the commit point stays at it and the stream stops;
    /// skip: dropped and counted, the commit point past it.
    fn too_large(
        &self,
        key: &Partition,
        target_topic: &str,
        offset: i64,
        (size, limit): (usize, usize),
        of: TooLargeOf,
    ) {
        let code = super::wire::error_name(10);
        self.shared.stats.recorded.count_send_error(code.clone());
        let (what, advice, records, last) = match of {
            TooLargeOf::Record => (
                format!(
                    "source {}/{} offset {offset}: the record makes a batch of {size} bytes \
                     alone, larger than target topic {target_topic} partition {} takes \
                     (max.message.bytes {limit}): {code}",
                    key.0, key.1, key.1
                ),
                format!(
                    "raise the target topic's max.message.bytes to at least {size} and restart"
                ),
                1,
                offset,
            ),
            TooLargeOf::SnappyBlock { last, records } => (
                format!(
                    "source {}/{} offsets {offset} to {last}: a snappy block of their batch \
                     states {size} bytes uncompressed, more than the batch engine decompresses \
                     at once ({limit} bytes), so they cannot be encoded again for target topic \
                     {target_topic} partition {}: {code}",
                    key.0, key.1, key.1
                ),
                "copy this topic with --copy.mode records and restart".to_owned(),
                records,
                last,
            ),
        };
        let mut tracker = self.shared.tracker();
        // Counted as consumed where it was read.
        let ticket = tracker.begin_batch(&key.0, key.1, offset, size, records);
        if self.settings.options.abort_on_send_failure {
            tracker.fail(ticket);
            drop(tracker);
            self.shared.control.fail(format!(
                "stream {}: {what}; stopping (--abort.on.send.failure true) with the committed \
                 offset at {offset}: {advice}",
                self.stream
            ));
        } else {
            tracker.give_up(ticket);
            tracker.advance_to_position(&key.0, key.1, last + 1);
            drop(tracker);
            Stats::add(&self.shared.stats.dropped, u64::from(records));
            tracing::warn!(
                stream = self.stream,
                "{what}; skipped (--abort.on.send.failure false)"
            );
        }
    }

    /// Source records read: `records` of `topic`/`partition`, `bytes` as they came, in the
    /// stream's totals and the partition's counters.
    fn count_read(&self, (topic, partition): (&str, i32), records: u64, bytes: usize) {
        Stats::add(&self.shared.stats.consumed, records);
        Stats::add(&self.shared.stats.consumed_bytes, bytes as u64);
        self.shared
            .tracker()
            .count_consumed(topic, partition, records, bytes as u64);
    }

    /// Stop fetching (nothing is on the wire between turns), commit what was acknowledged,
    /// leave the group.
    fn shutdown(self) -> Result<StreamReport, BatchStreamError> {
        let started = Instant::now();
        let timeout = self.settings.options.shutdown_timeout;
        let id = self.stream;
        let unacknowledged = self.shared.tracker().in_flight();
        let retry = timeout.max(Duration::from_secs(10));
        let committed = if self.shared.assigned.load(Ordering::SeqCst) {
            final_commit(&self.source, &self.shared, retry)
        } else {
            Ok(0)
        };
        self.gate.arrive();
        self.gate.wait(timeout);
        self.context().closing.store(true, Ordering::SeqCst);
        self.source.consumer().unsubscribe();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut quiet_since: Option<Instant> = None;
        while Instant::now() < deadline {
            self.poll_consumer(Duration::from_millis(20));
            let unassigned = self
                .source
                .consumer()
                .assignment()
                .is_ok_and(|a| a.count() == 0);
            let now = Instant::now();
            if !unassigned {
                quiet_since = None;
            } else if now.duration_since(*quiet_since.get_or_insert(now))
                >= Duration::from_millis(100)
            {
                break;
            }
        }
        let context = self.context();
        let fetched = context.consumer_fetched.load(Ordering::Relaxed);
        if context.statistics_seen.load(Ordering::Relaxed) || fetched > 0 {
            tracing::info!(
                stream = id,
                "the source consumer fetched {} itself (librdkafka statistics: rxmsgs)",
                counted(fetched, "record")
            );
        }
        drop(self.source);
        let n = committed.map_err(|source| BatchStreamError::FinalCommit { stream: id, source })?;
        tracing::info!(
            stream = id,
            "stopped: committed {}, {} unacknowledged, in {:?}",
            counted(n, "partition"),
            counted(unacknowledged, "batch"),
            started.elapsed()
        );
        Ok(StreamReport { unacknowledged })
    }
}

/// What an acknowledged batch does: the commit point past it, its mapping recorded from the
/// target's offset (-1: landed before, offset unknown), the counts and the latency.
fn record_ack(
    shared: &StreamShared,
    key: &Partition,
    target_topic: &str,
    out: &OutBatch,
    ticket: Ticket,
    base_offset: i64,
) {
    let records = out.records.max(0) as usize;
    let mapped = (0..records).map(|i| {
        let target_offset = if base_offset < 0 {
            -1
        } else {
            base_offset + i as i64
        };
        (out.source_offset(i), target_offset)
    });
    // One observation per batch, from its newest record: the records are not decoded for
    // their own timestamps (a backlog's age shows all the same).
    let acked = Acked {
        last_source_offset: out.last_source_offset,
        records: records as u64,
        newest: out.max_timestamp(),
    };
    acknowledge(shared, key, target_topic, ticket, acked, mapped);
}

/// An acknowledged step's counts: its last source record, its records, and the timestamp of
/// its newest record (negative: none).
struct Acked {
    last_source_offset: i64,
    records: u64,
    newest: i64,
}

/// The commit point past an acknowledged step (a batch of ours, or records librdkafka wrote),
/// each record's `(source offset, target offset)` recorded in the offset mapping, the counts
/// and one latency observation.
fn acknowledge(
    shared: &StreamShared,
    key: &Partition,
    target_topic: &str,
    ticket: Ticket,
    acked: Acked,
    mapped: impl Iterator<Item = (i64, i64)>,
) {
    let mut tracker = shared.tracker();
    tracker.ack(ticket);
    tracker.advance_to_position(&key.0, key.1, acked.last_source_offset + 1);
    if let Some(mapping) = &shared.mapping {
        let mut recorder = mapping.recorder();
        for (source_offset, target_offset) in mapped {
            recorder.acked(
                (&key.0, key.1),
                source_offset,
                (target_topic, key.1),
                target_offset,
            );
        }
    }
    drop(tracker);
    Stats::add(&shared.stats.acknowledged, acked.records);
    if acked.newest >= 0 {
        shared.stats.recorded.observe_latency(acked.newest);
    }
}
