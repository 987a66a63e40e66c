//! The source side's rebalance listener.
//!
//! Before partitions are released (revoked in a rebalance, or at close) the internal listener
//! flushes the producer, commits the acknowledged offsets of those partitions synchronously and
//! stops tracking them, so the next owner starts exactly after what reached the target. A flush
//! that runs out purges the producer and drains it (`flush::drain`), so that librdkafka sends
//! nothing of the released partitions after the release. With cooperative-sticky only the
//! revoked partitions are touched; with eager protocols all of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::producers::Producers;
use crate::mirror::commit::{commit_sync, follow_positions};
use crate::mirror::flush;
use crate::mirror::offsets::{CommitPoint, OffsetTracker};
use crate::mirror::source::{
    call_listener, committed, make_target_topics, partition_list, seek_failures,
    source_client_context,
};
use crate::mirror::state::{Stats, StreamShared};
use crate::mirror::topics::TopicCreator;
use crate::mirror::Partition;
use crate::native::member_id;
use crate::native::queue::Source;
use crate::plugin::Listener;
use crate::settings::counted;

pub(crate) type MirrorConsumer = BaseConsumer<SourceContext>;
/// How long an assignment waits for the assigned partitions' committed offsets.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);
/// The source consumer with our poll of its queue.
pub(crate) type MirrorSource = Source<SourceContext>;

pub(crate) struct SourceContext {
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) producer: Arc<Producers>,
    /// How long a revocation waits for the records in flight before purging what is left and
    /// committing what was acknowledged: with [`Self::drain_limit`], within the group's
    /// rebalance timeout (`max.poll.interval.ms`), so that the member rejoins in time.
    pub(crate) revoke_flush_timeout: Duration,
    /// How long a release waits, after the purge, for the requests already on the wire
    /// (`request.timeout.ms` and a margin, at most half the release): see [`flush::drain`].
    pub(crate) drain_limit: Duration,
    /// `--shutdown.timeout.ms`: how long a revocation's flush may still wait once a stop is
    /// requested (SIGTERM during a slow revocation must not outlast the grace period).
    pub(crate) shutdown_timeout: Duration,
    /// Set once the stream has made its final commit and left the group, just before the
    /// consumer is closed: a revocation served while closing neither flushes nor commits.
    /// (librdkafka 2.12 aborts when an offset commit reaches a group that has just finished
    /// terminating: `rd_kafka_cgrp_terminated: assert: !rd_kafka_assignment_in_progress`.)
    pub(crate) closing: AtomicBool,
    /// Set by every rebalance; the stream re-applies its pause state to the new assignment.
    pub(crate) assignment_changed: AtomicBool,
    /// How many rebalance events this consumer has served (the stream waits for them to stop
    /// before closing).
    pub(crate) rebalances_served: AtomicU64,
    /// How many partitions' offsets the revocations' commits carried (reset by the stream).
    pub(crate) release_commits: AtomicUsize,
    /// Whether a revocation's commit failed (reset by the stream).
    pub(crate) release_commit_failed: AtomicBool,
    /// The user's rebalance listener, called after the internal one.
    pub(crate) listener: Option<Mutex<Listener>>,
    /// `--create.topics`: target topics made before their partitions are fetched.
    pub(crate) topics: Option<Arc<TopicCreator>>,
    /// How long making the target topics of an assignment may retry transient errors (a
    /// third of `max.poll.interval.ms`: the callback does not poll the consumer meanwhile).
    pub(crate) topic_retry_limit: Duration,
}

impl SourceContext {
    fn release(&self, consumer: &MirrorConsumer, partitions: &[Partition]) {
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
        tracing::debug!(
            stream,
            "releasing {}: flushing the producer (at most {timeout:?})",
            counted(partitions.len(), "partition")
        );
        let control = &self.shared.control;
        let flushed = flush::flush_unless_stopped(
            &self.producer,
            timeout,
            || control.stop_requested(),
            self.shutdown_timeout,
        );
        if let Err(e) = flushed {
            // Released with records still queued, librdkafka would deliver them later (it
            // retries for ever), interleaved with the next owner's copies: purge them first.
            if control.stop_requested() && !timeout.is_zero() {
                tracing::warn!(
                    stream,
                    "stopping during the flush before releasing {}: purging what is still \
                     queued after waiting {:?} ({e}), and committing only what the target \
                     acknowledged: the next owner mirrors the rest again (duplicates, no loss)",
                    counted(partitions.len(), "partition"),
                    started.elapsed()
                );
            } else if !timeout.is_zero() {
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
    fn forget(&self, partitions: &[Partition]) {
        self.shared.forget(partitions);
    }

    /// Those of `partitions` whose commit point is past what their last synchronous commit
    /// committed (or that have none).
    fn uncommitted(&self, partitions: &[Partition]) -> Vec<Partition> {
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
    pub(crate) fn make_target_topics(&self, creator: &TopicCreator, partitions: &[Partition]) {
        make_target_topics(creator, partitions, &self.shared, self.topic_retry_limit);
    }

    /// Purges every record the producer still holds (librdkafka purges per producer, not per
    /// partition) and drains it ([`flush::drain`]: the requests on the wire are answered or
    /// time out, and what they give back to librdkafka's queue is purged too), serving their
    /// delivery reports (purged records are not acknowledged); then rewinds the partitions
    /// this stream keeps to their oldest records not acknowledged (or their commit points):
    /// their purged records are consumed and mirrored again, in order, and none is skipped. A
    /// partition that cannot be rewound stops the mirror (it would go on past records that
    /// never reached the target), and so does a drain that runs out with requests still on
    /// the wire (librdkafka would send their records again after the release, among the next
    /// owner's copies; the producer closes with the process and sends nothing more).
    fn purge_and_rewind(&self, consumer: &MirrorConsumer, released: &[Partition]) {
        let stream = self.shared.stream;
        // Only what is queued, not what is in flight: purging a request on the wire breaks
        // the idempotent producer's sequence, which `enable.gapless.guarantee` (on in abort
        // mode) turns into a fatal error; a request on the wire is answered or times out on
        // its own, within `request.timeout.ms`, and the drain waits for that.
        let control = &self.shared.control;
        let started = Instant::now();
        let drained = flush::drain(
            &self.producer,
            self.drain_limit,
            || control.stop_requested(),
            self.shutdown_timeout.min(STOP_DRAIN),
        );
        if let Err(e) = drained {
            let list: Vec<String> = released.iter().map(|(t, p)| format!("{t}/{p}")).collect();
            if control.stop_requested() {
                // The process is exiting: its producer, and what it would send again, with it.
                tracing::warn!(
                    stream,
                    "stopping with {} still on the wire to the target after {:?} ({e}); they \
                     are not committed, and nothing is sent again once the mirror has stopped",
                    counted(self.producer.in_flight_count(), "record"),
                    started.elapsed()
                );
            } else {
                control.fail(format!(
                    "stream {stream}: {} still on the wire to the target {:?} after the purge \
                     before releasing {} ({e}): librdkafka would send them again after the \
                     release, among the next owner's copies, so the mirror stops instead \
                     (nothing is committed past them: a restart mirrors them again). The drain \
                     waits the producer's request.timeout.ms + 2 s, at most 2/5 of the \
                     consumer's max.poll.interval.ms: raise max.poll.interval.ms to at least \
                     5/2 of that, or lower request.timeout.ms",
                    counted(self.producer.in_flight_count(), "record"),
                    started.elapsed(),
                    list.join(" ")
                ));
            }
        }
        let kept: Vec<Partition> = match consumer.assignment() {
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
        let points = rewind_points(&self.shared.tracker(), &kept);
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
            "rewound {} kept partitions to their oldest unacknowledged records: {}",
            list.len(),
            list.join(" ")
        );
    }

    fn call_listener(&self, what: &str, call: impl FnOnce(&mut Listener) -> Result<(), String>) {
        call_listener(&self.listener, &self.shared, what, call);
    }
}

/// Where the kept partitions go back to after a purge: every tracked one, to the first
/// offset whose records may have been purged (its oldest record in flight, or its commit
/// point). Not only those with a commit point: a partition assigned recently, none of whose
/// records is acknowledged yet, has none, and left alone its purged records would stay in
/// flight for ever (its commit stuck, and past half the limit the stream paused for good).
fn rewind_points(tracker: &OffsetTracker, kept: &[Partition]) -> Vec<CommitPoint> {
    tracker.rewind_points_of(kept)
}

/// How long a drain may go on once a stop is requested (at most `--shutdown.timeout.ms`): the
/// producer closes with the process, so nothing is sent again; waiting longer only saves
/// duplicates, and the shutdown watchdog allows `--shutdown.timeout.ms` + 30 s in all, the
/// shutdown's own flush included.
const STOP_DRAIN: Duration = Duration::from_secs(5);
/// How long rewinding the kept partitions may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

source_client_context!(
    SourceContext,
    |context| &context.shared,
    |context, topic, partition| context
        .shared
        .tracker()
        .oldest_unacknowledged(topic, partition)
);

impl ConsumerContext for SourceContext {
    /// Runs before librdkafka applies the change: a revocation is flushed and committed before
    /// the partitions are released, and the user's `before_starting_fetchers` runs before an
    /// assignment starts fetching.
    fn pre_rebalance(&self, consumer: &MirrorConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let partitions = partition_list(tpl);
                self.shared.released(&partitions);
                self.release(consumer, &partitions);
                if !partitions.is_empty() {
                    self.call_listener("before_releasing_partitions", |l| {
                        l.before_releasing_partitions(&partitions)
                    });
                }
            }
            Rebalance::Assign(tpl) => {
                let partitions = partition_list(tpl);
                self.shared.took(&partitions);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_rewinds_a_kept_partition_whose_records_are_all_unacknowledged() {
        let mut t = OffsetTracker::new();
        // "a"/0 has a commit point; "a"/1 was assigned recently: nothing acknowledged yet.
        let a = t.begin("a", 0, 40, None, 10, 1);
        t.begin("a", 0, 41, None, 10, 1);
        t.ack(a);
        t.begin("a", 1, 7, None, 10, 1);
        t.begin("a", 1, 8, None, 10, 1);
        let kept = [("a".to_owned(), 0), ("a".to_owned(), 1)];
        let mut points = rewind_points(&t, &kept);
        points.sort_by_key(|p| p.partition);
        let at = |partition, offset| CommitPoint {
            topic: "a".to_owned(),
            partition,
            offset,
        };
        assert_eq!(points, vec![at(0, 41), at(1, 7)]);
    }
}
