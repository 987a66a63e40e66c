//! The source side's rebalance listener.
//!
//! Before partitions are released (revoked in a rebalance, or at close) the internal listener
//! flushes the producer, commits the acknowledged offsets of those partitions synchronously and
//! stops tracking them, so the next owner starts exactly after what reached the target. With
//! cooperative-sticky only the revoked partitions are touched; with eager protocols all of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{Producer, PurgeConfig};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::clients::{self, Cluster};
use super::commit::{commit_sync, committed, follow_positions};
use super::delivery::{self, MirrorProducer};
use super::state::{PartitionLag, Stats, StreamShared};
use super::topics::TopicCreator;
use crate::native::member_id;
use crate::native::queue::Source;
use crate::plugin::Listener;
use crate::settings::counted;

pub type MirrorConsumer = BaseConsumer<RebalanceContext>;
/// How long an assignment waits for the assigned partitions' committed offsets.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);
/// The source consumer with our poll of its queue.
pub type MirrorSource = Source<RebalanceContext>;

pub struct RebalanceContext {
    pub shared: Arc<StreamShared>,
    pub producer: Arc<MirrorProducer>,
    /// How long a revocation waits for the records in flight before purging what is left and
    /// committing what was acknowledged: within the group's rebalance timeout
    /// (`max.poll.interval.ms`), so that the member rejoins in time.
    pub revoke_flush_timeout: Duration,
    /// Set once the stream has made its final commit and left the group, just before the
    /// consumer is closed: a revocation served while closing neither flushes nor commits.
    /// (librdkafka 2.12 aborts when an offset commit reaches a group that has just finished
    /// terminating: `rd_kafka_cgrp_terminated: assert: !rd_kafka_assignment_in_progress`.)
    pub closing: AtomicBool,
    /// Set by every rebalance; the stream re-applies its pause state to the new assignment.
    pub assignment_changed: AtomicBool,
    /// How many rebalance events this consumer has served (the stream waits for them to stop
    /// before closing).
    pub rebalances_served: AtomicU64,
    /// How many partitions' offsets the revocations' commits carried (reset by the stream).
    pub release_commits: AtomicUsize,
    /// Whether a revocation's commit failed (reset by the stream).
    pub release_commit_failed: AtomicBool,
    /// The user's rebalance listener, called after the internal one.
    pub listener: Option<Mutex<Listener>>,
    /// `--create.topics`: target topics made before their partitions are fetched.
    pub topics: Option<Arc<TopicCreator>>,
    /// How long making the target topics of an assignment may retry transient errors (a
    /// third of `max.poll.interval.ms`: the callback does not poll the consumer meanwhile).
    pub topic_retry_limit: Duration,
}

impl RebalanceContext {
    fn release(&self, consumer: &MirrorConsumer, partitions: &[(String, i32)]) {
        if partitions.is_empty() {
            return;
        }
        let stream = self.shared.stream;
        if self.closing.load(Ordering::SeqCst) {
            // The final commit is made and the group left: nothing to flush or commit, and a
            // commit now could reach a group that librdkafka is terminating.
            tracing::debug!(
                stream,
                "released {} at close",
                counted(partitions.len(), "partition")
            );
            self.forget(partitions);
            return;
        }
        if consumer.assignment_lost() {
            // The group gave these partitions away without this member (session timed out,
            // member fenced): their next owner may be copying them already. A commit would
            // be refused, or accepted against a stale generation; records still queued would
            // reach the target after the next owner's copies.
            tracing::warn!(
                stream,
                "the group took back {} from this stream (assignment lost); releasing them \
                 without flushing or committing, and purging what is queued for the target: \
                 the next owner mirrors them again from the last commit (duplicates, no loss)",
                counted(partitions.len(), "partition")
            );
            self.purge_and_rewind(consumer, partitions);
            self.forget(partitions);
            return;
        }
        // During shutdown the stream has flushed already (bounded); do not wait twice.
        let timeout = if self.shared.control.stop_requested() {
            Duration::ZERO
        } else {
            self.revoke_flush_timeout
        };
        let started = Instant::now();
        if let Err(e) = delivery::flush(&self.producer, timeout) {
            // Released with records still queued, librdkafka would deliver them later (it
            // retries for ever), interleaved with the next owner's copies: purge them first.
            if !timeout.is_zero() {
                tracing::warn!(
                    stream,
                    "flush before releasing {} did not finish within {timeout:?} ({e}); \
                     purging what is still queued so that none of it reaches the target after \
                     the release, and committing only what the target acknowledged: the next \
                     owner mirrors the rest again (duplicates, no loss)",
                    counted(partitions.len(), "partition")
                );
            }
            self.purge_and_rewind(consumer, partitions);
        }
        if timeout > Duration::ZERO {
            // Not while stopping: the shutdown's commit retries poll records they do not track.
            follow_positions(consumer, &self.shared);
        }
        // Only partitions acknowledged past their last synchronous commit need one: at a
        // clean stop the final commit committed them all, and the streams leaving the group
        // one after another make the broker refuse the later ones' commits
        // (REBALANCE_IN_PROGRESS) although there is nothing left to commit.
        let uncommitted = self.uncommitted(partitions);
        if uncommitted.is_empty() {
            tracing::info!(
                stream,
                "released {}: every acknowledged offset was committed already",
                counted(partitions.len(), "partition")
            );
        } else {
            match commit_sync(consumer, &self.shared, Some(&uncommitted)) {
                Ok(n) => {
                    self.release_commits.fetch_add(n, Ordering::SeqCst);
                    tracing::info!(
                        stream,
                        "released {} after flushing and committing {} in {:?}",
                        counted(partitions.len(), "partition"),
                        counted(n, "offset"),
                        started.elapsed()
                    )
                }
                Err(e) => {
                    self.release_commit_failed.store(true, Ordering::SeqCst);
                    tracing::warn!(
                        stream,
                        "commit before releasing {} failed: {e}; the next owner will mirror \
                         again the records of {} acknowledged after its last committed offset \
                         (duplicates, no loss)",
                        counted(partitions.len(), "partition"),
                        counted(uncommitted.len(), "partition")
                    )
                }
            }
        }
        self.forget(partitions);
    }

    /// Stops tracking released partitions (deliveries still to come for them are stale).
    fn forget(&self, partitions: &[(String, i32)]) {
        let mut tracker = self.shared.tracker();
        let mut committed = self
            .shared
            .committed_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in partitions {
            tracker.release(topic, *partition);
            committed.remove(&(topic.clone(), *partition));
        }
        if let Some(mapping) = &self.shared.mapping {
            mapping.forget(partitions);
        }
    }

    /// Those of `partitions` whose commit point is past what their last synchronous commit
    /// committed (or that have none).
    fn uncommitted(&self, partitions: &[(String, i32)]) -> Vec<(String, i32)> {
        let points = self.shared.tracker().commit_points_of(partitions);
        let committed = self
            .shared
            .committed_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        points
            .into_iter()
            .filter(|p| committed.get(&(p.topic.clone(), p.partition)) != Some(&p.offset))
            .map(|p| (p.topic, p.partition))
            .collect()
    }

    /// Tells the tracker where each assigned partition's consumption starts (its committed
    /// offset, one OffsetFetch request, bounded), so that records deleted by retention
    /// before the first fetch are noticed (see `Stream::skipped_before`). Partitions without
    /// a committed offset, or when the request fails, are not checked.
    fn expect_committed(&self, consumer: &MirrorConsumer, tpl: &TopicPartitionList) {
        if tpl.count() == 0 {
            return;
        }
        let committed = match consumer.committed_offsets(tpl.clone(), COMMITTED_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(
                    stream = self.shared.stream,
                    "cannot read the committed offsets of the assigned partitions ({e}); \
                     records deleted by retention before they are read will not be reported"
                );
                return;
            }
        };
        let mut tracker = self.shared.tracker();
        for e in committed.elements() {
            if let rdkafka::Offset::Offset(offset) = e.offset() {
                tracker.expect_start(e.topic(), e.partition(), offset);
            }
        }
    }

    /// Makes the target topics of the assigned partitions: see [`make_target_topics`].
    pub fn make_target_topics(&self, creator: &TopicCreator, partitions: &[(String, i32)]) {
        make_target_topics(creator, partitions, &self.shared, self.topic_retry_limit);
    }

    /// Purges every record the producer still holds (librdkafka purges per producer, not per
    /// partition), serves their delivery reports (purged records are not acknowledged), and
    /// rewinds the partitions this stream keeps to their commit points: their purged records
    /// are consumed and mirrored again, in order, and none is skipped. A partition that cannot
    /// be rewound stops the mirror (it would go on past records that never reached the
    /// target).
    fn purge_and_rewind(&self, consumer: &MirrorConsumer, released: &[(String, i32)]) {
        let stream = self.shared.stream;
        // Only what is queued, not what is in flight: purging a request on the wire breaks
        // the idempotent producer's sequence, which `enable.gapless.guarantee` (on in abort
        // mode) turns into a fatal error; a request on the wire lands or fails on its own.
        self.producer.purge(PurgeConfig::default().queue());
        if let Err(e) = delivery::flush(&self.producer, PURGE_SETTLE) {
            tracing::warn!(stream, "delivery reports after a purge: {e}");
        }
        let kept: Vec<(String, i32)> = match consumer.assignment() {
            Ok(assignment) => assignment
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition()))
                .filter(|tp| !released.contains(tp))
                .collect(),
            Err(e) => {
                self.shared.control.fail(format!(
                    "stream {stream}: cannot read the assignment to rewind the partitions whose \
                     records were purged: {e}"
                ));
                return;
            }
        };
        let points = self.shared.tracker().commit_points_of(&kept);
        if points.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::with_capacity(points.len());
        for p in &points {
            if let Err(e) =
                tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.offset))
            {
                self.shared.control.fail(format!(
                    "stream {stream}: cannot rewind {}/{}: {e}",
                    p.topic, p.partition
                ));
                return;
            }
        }
        let failed = seek_failures(consumer, tpl, SEEK_TIMEOUT);
        if !failed.is_empty() {
            self.shared.control.fail(format!(
                "stream {stream}: cannot rewind the partitions whose records were purged ({}); \
                 stopping rather than mirroring past them",
                failed.join(", ")
            ));
            return;
        }
        // The rewound partitions start afresh in the tracker: their purged records' delivery
        // reports are stale, and the records are registered again as they are read.
        let mut tracker = self.shared.tracker();
        for p in &points {
            tracker.release(&p.topic, p.partition);
        }
        drop(tracker);
        let list: Vec<String> = points
            .iter()
            .map(|p| format!("{}/{} at {}", p.topic, p.partition, p.offset))
            .collect();
        tracing::info!(
            stream,
            "rewound {} kept partitions to their commit points: {}",
            list.len(),
            list.join(" ")
        );
    }

    fn call_listener(&self, what: &str, call: impl FnOnce(&mut Listener) -> Result<(), String>) {
        call_listener(&self.listener, &self.shared, what, call);
    }
}

/// Makes the target topics of the assigned partitions (`--create.topics`). Transient
/// errors (a time-out, brokers down during a rolling restart) are retried with backoff
/// for at most `topic_retry_limit`; permanent ones (authorization, policy), and transient
/// ones that outlast it, are fatal.
pub fn make_target_topics(
    creator: &TopicCreator,
    partitions: &[(String, i32)],
    shared: &StreamShared,
    retry_limit: Duration,
) {
    let mut topics: Vec<(&str, usize)> = Vec::new();
    for (topic, partition) in partitions {
        let needed = usize::try_from(*partition).unwrap_or(0) + 1;
        match topics.iter_mut().find(|(t, _)| t == topic) {
            Some((_, n)) => *n = (*n).max(needed),
            None => topics.push((topic, needed)),
        }
    }
    let deadline = Instant::now() + retry_limit;
    for (topic, needed) in topics {
        let mut backoff = Duration::from_millis(200);
        loop {
            match creator.ensure(topic, needed) {
                Ok(_) => break,
                Err(e)
                    if e.is_transient()
                        && Instant::now() + backoff < deadline
                        && !shared.control.stop_requested() =>
                {
                    tracing::warn!(
                        stream = shared.stream,
                        "{e}; retrying in {backoff:?} (transient; for at most {:?} in all)",
                        retry_limit
                    );
                    std::thread::sleep(backoff);
                    shared.turned(Instant::now());
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    let why = if e.is_transient() {
                        format!(" (still failing after retrying for {:?})", retry_limit)
                    } else {
                        String::new()
                    };
                    shared.control.fail(format!("{e}{why}"));
                    return;
                }
            }
        }
    }
}

/// Keeps the lag of the assigned partitions (from the position of the next record to
/// the high watermark) and whether a source broker is connected.
pub fn source_statistics(shared: &StreamShared, statistics: &rdkafka::Statistics) {
    let up = statistics.brokers.values().any(|b| b.state == "UP");
    shared.source_up.store(up, Ordering::Relaxed);
    let mut lag = Vec::new();
    for (topic, t) in &statistics.topics {
        for (partition, p) in &t.partitions {
            if *partition < 0 || p.fetch_state == "none" || p.fetch_state == "stopped" {
                continue;
            }
            let value = if p.app_offset >= 0 && p.hi_offset >= 0 {
                (p.hi_offset - p.app_offset).max(0)
            } else {
                p.consumer_lag
            };
            if value >= 0 {
                lag.push(PartitionLag {
                    topic: topic.clone(),
                    partition: *partition,
                    records: value,
                });
            }
        }
    }
    *shared.lag.lock().unwrap_or_else(|e| e.into_inner()) = lag;
}

/// How long the delivery reports of purged records may take to be served.
const PURGE_SETTLE: Duration = Duration::from_secs(5);
/// How long rewinding the kept partitions may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

fn partition_list(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ClientContext for RebalanceContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Source, level, fac, message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        source_statistics(&self.shared, &statistics);
    }

    /// Not called for the source consumer (our poll returns its errors to the stream, which
    /// applies [`clients::client_error`]); kept for errors raised outside the queue.
    fn error(&self, error: KafkaError, reason: &str) {
        let shared = &self.shared;
        clients::client_error(
            &shared.control,
            Cluster::Source,
            shared.stream,
            &error,
            reason,
        );
    }
}

impl ConsumerContext for RebalanceContext {
    /// Runs before librdkafka applies the change: a revocation is flushed and committed before
    /// the partitions are released, and the user's `before_starting_fetchers` runs before an
    /// assignment starts fetching.
    fn pre_rebalance(&self, consumer: &MirrorConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let partitions = partition_list(tpl);
                self.release(consumer, &partitions);
                if !partitions.is_empty() {
                    self.call_listener("before_releasing_partitions", |l| {
                        l.before_releasing_partitions(&partitions)
                    });
                }
            }
            Rebalance::Assign(tpl) => {
                let partitions = partition_list(tpl);
                let list: Vec<String> =
                    partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect();
                tracing::info!(
                    stream = self.shared.stream,
                    "assigned {}: {}",
                    counted(list.len(), "partition"),
                    list.join(" ")
                );
                self.expect_committed(consumer, tpl);
                if let Some(creator) = &self.topics {
                    self.make_target_topics(creator, &partitions);
                }
                if !partitions.is_empty() {
                    let id = member_id(consumer);
                    self.call_listener("before_starting_fetchers", |l| {
                        l.before_starting_fetchers(&id, &partitions)
                    });
                }
            }
            Rebalance::Error(e) => {
                tracing::warn!(stream = self.shared.stream, "rebalance error: {e}")
            }
        }
    }

    /// The result of an asynchronous commit (the periodic one); synchronous commits report
    /// theirs to [`commit`] directly.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        committed(&self.shared, &result, offsets.count());
    }

    fn post_rebalance(&self, _consumer: &MirrorConsumer, rebalance: &Rebalance<'_>) {
        Stats::add(&self.shared.stats.rebalances, 1);
        self.rebalances_served.fetch_add(1, Ordering::SeqCst);
        if let Rebalance::Assign(_) = rebalance {
            self.shared.assigned.store(true, Ordering::SeqCst);
        }
        self.assignment_changed.store(true, Ordering::SeqCst);
    }
}

/// Moves each partition of `tpl` to its offset; returns those that did not move (or the
/// request's error): empty when all did.
pub fn seek_failures<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: TopicPartitionList,
    timeout: Duration,
) -> Vec<String> {
    match consumer.seek_partitions(tpl, timeout) {
        Ok(result) => result
            .elements()
            .iter()
            .filter(|e| e.error().is_err())
            .map(|e| format!("{}/{}", e.topic(), e.partition()))
            .collect(),
        Err(e) => vec![e.to_string()],
    }
}

/// Calls the user's rebalance listener, if any; its error is fatal for the mirror. Both
/// stream kinds (at least once and exactly once) call it from their rebalance callbacks.
pub(super) fn call_listener(
    listener: &Option<Mutex<Listener>>,
    shared: &StreamShared,
    what: &str,
    call: impl FnOnce(&mut Listener) -> Result<(), String>,
) {
    let Some(listener) = listener else {
        return;
    };
    let mut listener = listener.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = call(&mut listener) {
        shared
            .control
            .fail(format!("the rebalance listener failed in {what}: {e}"));
    }
}
