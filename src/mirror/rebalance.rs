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
use super::commit::{commit_sync, committed};
use super::delivery::MirrorProducer;
use super::state::{PartitionLag, Stats, StreamShared};
use super::topics::TopicCreator;
use crate::native::member_id;
use crate::native::queue::Source;
use crate::plugin::Listener;

pub type MirrorConsumer = BaseConsumer<RebalanceContext>;
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
            tracing::debug!(stream, "released {} partitions at close", partitions.len());
            let mut tracker = self.shared.tracker();
            for (topic, partition) in partitions {
                tracker.release(topic, *partition);
            }
            return;
        }
        if consumer.assignment_lost() {
            // The group gave these partitions away without this member (session timed out,
            // member fenced): their next owner may be copying them already. A commit would
            // be refused, or accepted against a stale generation; records still queued would
            // reach the target after the next owner's copies.
            tracing::warn!(
                stream,
                "the group took back {} partitions from this stream (assignment lost); \
                 releasing them without flushing or committing, and purging what is queued for \
                 the target: the next owner mirrors them again from the last commit \
                 (duplicates, no loss)",
                partitions.len()
            );
            self.purge_and_rewind(consumer, partitions);
            let mut tracker = self.shared.tracker();
            for (topic, partition) in partitions {
                tracker.release(topic, *partition);
            }
            return;
        }
        // During shutdown the stream has flushed already (bounded); do not wait twice.
        let timeout = if self.shared.control.stop_requested() {
            Duration::ZERO
        } else {
            self.revoke_flush_timeout
        };
        let started = Instant::now();
        if let Err(e) = self.producer.flush(timeout) {
            // Released with records still queued, librdkafka would deliver them later (it
            // retries for ever), interleaved with the next owner's copies: purge them first.
            tracing::warn!(
                stream,
                "flush before releasing {} partitions did not finish within {timeout:?} ({e}); \
                 purging what is still queued so that none of it reaches the target after the \
                 release, and committing only what the target acknowledged: the next owner \
                 mirrors the rest again (duplicates, no loss)",
                partitions.len()
            );
            self.purge_and_rewind(consumer, partitions);
        }
        let result = commit_sync(consumer, &self.shared, Some(partitions));
        match &result {
            Ok(n) => {
                self.release_commits.fetch_add(*n, Ordering::SeqCst);
            }
            Err(_) => self.release_commit_failed.store(true, Ordering::SeqCst),
        }
        match result {
            Ok(n) => tracing::info!(
                stream,
                "released {} partitions after flushing and committing {n} offsets in {:?}",
                partitions.len(),
                started.elapsed()
            ),
            Err(e) => tracing::warn!(
                stream,
                "commit before releasing {} partitions failed: {e}; the next owner will mirror \
                 records after the last committed offset again (duplicates, no loss)",
                partitions.len()
            ),
        }
        let mut tracker = self.shared.tracker();
        for (topic, partition) in partitions {
            tracker.release(topic, *partition);
        }
    }

    /// Purges every record the producer still holds (librdkafka purges per producer, not per
    /// partition), serves their delivery reports (purged records are not acknowledged), and
    /// rewinds the partitions this stream keeps to their commit points: their purged records
    /// are consumed and mirrored again, in order, and none is skipped. A partition that cannot
    /// be rewound stops the mirror (it would go on past records that never reached the
    /// target).
    fn purge_and_rewind(&self, consumer: &MirrorConsumer, released: &[(String, i32)]) {
        let stream = self.shared.stream;
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
        if let Err(e) = self.producer.flush(PURGE_SETTLE) {
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
        let failed: Vec<String> = match consumer.seek_partitions(tpl, SEEK_TIMEOUT) {
            Ok(result) => result
                .elements()
                .iter()
                .filter(|e| e.error().is_err())
                .map(|e| format!("{}/{}", e.topic(), e.partition()))
                .collect(),
            Err(e) => vec![e.to_string()],
        };
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

    /// Calls the user's listener, if any; its error is fatal for the mirror.
    fn call_listener(&self, what: &str, call: impl FnOnce(&mut Listener) -> Result<(), String>) {
        let Some(listener) = &self.listener else {
            return;
        };
        let mut listener = listener.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = call(&mut listener) {
            self.shared
                .control
                .fail(format!("the rebalance listener failed in {what}: {e}"));
        }
    }
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

    /// Keeps the lag of the assigned partitions: from the position of the next record to
    /// the high watermark.
    fn stats(&self, statistics: rdkafka::Statistics) {
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
        *self.shared.lag.lock().unwrap_or_else(|e| e.into_inner()) = lag;
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
                    "assigned {} partitions: {}",
                    list.len(),
                    list.join(" ")
                );
                if let Some(creator) = &self.topics {
                    let mut topics: Vec<&str> =
                        partitions.iter().map(|(t, _)| t.as_str()).collect();
                    topics.sort_unstable();
                    topics.dedup();
                    for topic in topics {
                        if let Err(e) = creator.ensure(topic) {
                            self.shared.control.fail(e.to_string());
                        }
                    }
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
