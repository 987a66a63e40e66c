//! The source side's rebalance listener and commits.
//!
//! Before partitions are released (revoked in a rebalance, or at close) the internal listener
//! flushes the producer, commits the acknowledged offsets of those partitions synchronously and
//! stops tracking them, so the next owner starts exactly after what reached the target. With
//! cooperative-sticky only the revoked partitions are touched; with eager protocols all of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use crate::control::Stats;
use crate::producer::{MirrorProducer, StreamShared};

pub type MirrorConsumer = BaseConsumer<RebalanceContext>;

pub struct RebalanceContext {
    pub shared: Arc<StreamShared>,
    pub producer: Arc<MirrorProducer>,
    /// How long a revocation waits for the records in flight before committing what was
    /// acknowledged so far.
    pub revoke_flush_timeout: Duration,
    /// Set once the stream has flushed and committed for shutdown; the revocation that closing
    /// the consumer triggers then has nothing left to wait for.
    pub closing: AtomicBool,
    /// Set by every rebalance; the stream re-applies its pause state to the new assignment.
    pub assignment_changed: AtomicBool,
}

impl RebalanceContext {
    fn release(&self, consumer: &MirrorConsumer, tpl: &TopicPartitionList) {
        let partitions: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        if partitions.is_empty() {
            return;
        }
        let stream = self.shared.stream;
        // During shutdown the stream has flushed already (bounded); do not wait twice.
        let timeout = if self.closing.load(Ordering::SeqCst) || self.shared.control.stop_requested()
        {
            Duration::ZERO
        } else {
            self.revoke_flush_timeout
        };
        let started = Instant::now();
        if let Err(e) = self.producer.flush(timeout) {
            if !timeout.is_zero() {
                tracing::warn!(
                    stream,
                    "flush before releasing {} partitions did not finish within {timeout:?} ({e}); \
                     committing only what the target acknowledged: the next owner will mirror the \
                     rest again (duplicates, no loss)",
                    partitions.len()
                );
            }
        }
        match commit(consumer, &self.shared, Some(&partitions), CommitMode::Sync) {
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
        for (topic, partition) in &partitions {
            tracker.release(topic, *partition);
        }
    }
}

/// Commits the acknowledged offsets of `only` these partitions, or of all tracked ones.
/// Returns how many partitions were committed.
pub fn commit(
    consumer: &MirrorConsumer,
    shared: &StreamShared,
    only: Option<&[(String, i32)]>,
    mode: CommitMode,
) -> KafkaResult<usize> {
    let points = {
        let tracker = shared.tracker();
        match only {
            Some(partitions) => tracker.commit_points_of(partitions),
            None => tracker.commit_points(),
        }
    };
    if points.is_empty() {
        return Ok(0);
    }
    let mut tpl = TopicPartitionList::with_capacity(points.len());
    for (topic, partition, offset) in &points {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    consumer.commit(&tpl, mode)?;
    Stats::add(&shared.stats.commits, 1);
    tracing::debug!(stream = shared.stream, "committed ({mode:?}) {points:?}");
    Ok(points.len())
}

impl ClientContext for RebalanceContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        crate::logging::librdkafka_log("source", level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            self.shared
                .control
                .fail(format!("the source consumer hit a fatal error: {reason}"));
        } else {
            tracing::warn!(
                stream = self.shared.stream,
                "source cluster: {reason} (retrying)"
            );
        }
    }
}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, consumer: &MirrorConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => self.release(consumer, tpl),
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(stream = self.shared.stream, "rebalance error: {e}")
            }
        }
    }

    fn post_rebalance(&self, _consumer: &MirrorConsumer, rebalance: &Rebalance<'_>) {
        Stats::add(&self.shared.stats.rebalances, 1);
        if let Rebalance::Assign(tpl) = rebalance {
            let list: Vec<String> = tpl
                .elements()
                .iter()
                .map(|e| format!("{}/{}", e.topic(), e.partition()))
                .collect();
            tracing::info!(
                stream = self.shared.stream,
                "assigned {} partitions: {}",
                list.len(),
                list.join(" ")
            );
        }
        self.assignment_changed.store(true, Ordering::SeqCst);
    }
}
