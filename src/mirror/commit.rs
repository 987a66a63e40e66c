//! Commits of acknowledged offsets to the source group: asynchronous on the timer,
//! synchronous before partitions are released and at shutdown. Offsets are always explicit
//! (the tracker's commit points), never librdkafka's auto commit.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::state::{Stats, StreamShared};
use crate::native::queue::{Polled, Source};

/// Commits the acknowledged offsets of `only` these partitions, or of all tracked ones.
/// Returns how many partitions were committed.
pub fn commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
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
    for point in &points {
        tpl.add_partition_offset(&point.topic, point.partition, Offset::Offset(point.offset))?;
    }
    let started = Instant::now();
    consumer.commit(&tpl, mode)?;
    if matches!(mode, CommitMode::Sync) {
        shared
            .stats
            .recorded
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        let mut committed = shared
            .committed_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for point in &points {
            committed.insert((point.topic.clone(), point.partition), point.offset);
        }
    }
    Stats::add(&shared.stats.commits, 1);
    tracing::debug!(stream = shared.stream, "committed ({mode:?}) {points:?}");
    Ok(points.len())
}

/// The shutdown commit, retried while the group is rebalancing (another instance joining or
/// leaving): the broker refuses commits until the rebalance completes.
pub fn final_commit<C: ConsumerContext>(
    source: &Source<C>,
    shared: &StreamShared,
) -> KafkaResult<usize> {
    let deadline = Instant::now() + FINAL_COMMIT_RETRY;
    loop {
        match commit(source.consumer(), shared, None, CommitMode::Sync) {
            Err(e) if is_retriable_commit_error(&e) && Instant::now() < deadline => {
                tracing::info!(stream = shared.stream, "final commit: {e}; retrying");
                // Serve the rebalance (its revocation commits and releases partitions).
                if let Polled::Record(m) = source.poll(Duration::from_millis(200)) {
                    tracing::debug!(
                        stream = shared.stream,
                        "not mirrored at shutdown: {}/{} offset {}",
                        m.topic(),
                        m.partition(),
                        m.offset()
                    );
                }
            }
            other => return other,
        }
    }
}

/// How long the final commit is retried while the group rebalances.
const FINAL_COMMIT_RETRY: Duration = Duration::from_secs(10);

fn is_retriable_commit_error(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::RequestTimedOut
        )
    )
}
