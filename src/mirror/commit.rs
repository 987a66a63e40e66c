//! Commits of acknowledged offsets to the source group: asynchronous on the timer,
//! synchronous before partitions are released and at shutdown. Offsets are always explicit
//! (the tracker's commit points), never librdkafka's auto commit.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use crate::mirror::offsets::CommitPoint;
use crate::mirror::source::committed;
use crate::mirror::state::StreamShared;
use crate::mirror::Partition;
use crate::native::queue::{Polled, Source};

/// Commits the acknowledged offsets of `only` these partitions, or of all tracked ones, and
/// waits for the result (before partitions are released, and at shutdown). Returns how many
/// partitions were committed.
pub(crate) fn commit_sync<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    shared: &StreamShared,
    only: Option<&[Partition]>,
) -> KafkaResult<usize> {
    if let Some(mapping) = &shared.mapping {
        let id = persist(shared, only);
        if !mapping.wait(id, PERSIST_TIMEOUT) {
            tracing::warn!(
                stream = shared.stream,
                "the offset mapping was not stored in topic {} within {PERSIST_TIMEOUT:?}; \
                 committing only offsets whose mapping is stored",
                mapping.topic()
            );
        }
    }
    let Some((tpl, points)) = commit_list(shared, only)? else {
        return Ok(0);
    };
    let started = Instant::now();
    let result = consumer.commit(&tpl, CommitMode::Sync);
    shared
        .stats
        .recorded
        .commit_seconds
        .observe(started.elapsed().as_secs_f64());
    committed(shared, &result, points.len());
    result?;
    let mut committed_sync = shared
        .committed_sync
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    for point in &points {
        committed_sync.insert((point.topic.clone(), point.partition), point.offset);
    }
    tracing::debug!(stream = shared.stream, "committed {points:?}");
    Ok(points.len())
}

/// Commits the acknowledged offsets of every tracked partition without waiting (the
/// periodic commit); the result comes back through the consumer context's
/// `commit_callback`, which calls [`committed`].
///
/// With the offset mapping, the commit waits for the mapping: this stores it, and
/// [`commit_stored`] commits once the target acknowledged it.
///
/// It does not follow the consumer's position ([`follow_positions`]): the record engine does
/// that between its polls; the batch engine's consumer fetches nothing (its own fetcher
/// moves the commit point past what it drops), and a record librdkafka returned to it anyway
/// would otherwise carry the commit point past batches not yet acknowledged.
pub(crate) fn commit_async<C: ConsumerContext>(
    source: &Source<C>,
    shared: &StreamShared,
) -> KafkaResult<usize> {
    if let Some(mapping) = &shared.mapping {
        if mapping.awaiting().is_none() {
            let id = persist(shared, None);
            mapping.set_awaiting(Some(id));
        }
        return commit_stored(source, shared);
    }
    send_commit(source, shared)
}

/// Commits, without waiting, the points whose mapping the store acknowledged since the last
/// periodic commit; nothing while that write is still on its way. Called on every turn of
/// the stream's loop (an atomic load when there is nothing to do).
pub(crate) fn commit_stored<C: ConsumerContext>(
    source: &Source<C>,
    shared: &StreamShared,
) -> KafkaResult<usize> {
    let Some(mapping) = &shared.mapping else {
        return Ok(0);
    };
    match mapping.awaiting() {
        Some(id) if mapping.is_done(id) => {
            mapping.set_awaiting(None);
            send_commit(source, shared)
        }
        _ => Ok(0),
    }
}

/// Writes the tracker's commit points (of `only` these partitions, or all) and the segments
/// below them to the offset-mapping store; returns the write's id.
fn persist(shared: &StreamShared, only: Option<&[Partition]>) -> u64 {
    let Some(mapping) = &shared.mapping else {
        return 0;
    };
    // One moment for both: the segments cover every record below the points (delivery
    // reports update the two under the tracker's lock).
    let (points, segments) = {
        let tracker = shared.tracker();
        let points = match only {
            Some(partitions) => tracker.commit_points_of(partitions),
            None => tracker.commit_points(),
        };
        (points, mapping.recorder().take_dirty())
    };
    mapping.persist(points, segments)
}

fn send_commit<C: ConsumerContext>(
    source: &Source<C>,
    shared: &StreamShared,
) -> KafkaResult<usize> {
    let Some((tpl, points)) = commit_list(shared, None)? else {
        return Ok(0);
    };
    let result = source.commit_async(&tpl);
    if result.is_err() {
        // Refused before it was sent: that is its result.
        committed(shared, &result, points.len());
    }
    result?;
    tracing::debug!(stream = shared.stream, "committing {points:?}");
    Ok(points.len())
}

/// Lets the commit points of idle partitions follow the consumer's positions past records a
/// `read_committed` consumer never returns (transaction markers, aborted transactions).
/// Only between polls of the stream's own loop: every record the position passed has begun
/// in the tracker then (records polled during the shutdown's commit retries have not).
pub(crate) fn follow_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    shared: &StreamShared,
) {
    let Ok(positions) = consumer.position() else {
        return;
    };
    let mut tracker = shared.tracker();
    for e in positions.elements() {
        if let Offset::Offset(position) = e.offset() {
            tracker.advance_to_position(e.topic(), e.partition(), position);
        }
    }
}

/// The commit points to commit, as a partition list; `None` when there are none.
fn commit_list(
    shared: &StreamShared,
    only: Option<&[Partition]>,
) -> KafkaResult<Option<(TopicPartitionList, Vec<CommitPoint>)>> {
    let points = {
        let tracker = shared.tracker();
        match only {
            Some(partitions) => tracker.commit_points_of(partitions),
            None => tracker.commit_points(),
        }
    };
    // With the offset mapping, a point is committed only as far as the store holds it.
    let points: Vec<CommitPoint> = match &shared.mapping {
        None => points,
        Some(mapping) => points
            .into_iter()
            .filter_map(|mut p| {
                let stored = mapping.persisted_point(&p.topic, p.partition)?;
                p.offset = p.offset.min(stored);
                Some(p)
            })
            .collect(),
    };
    if points.is_empty() {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::with_capacity(points.len());
    for point in &points {
        tpl.add_partition_offset(&point.topic, point.partition, Offset::Offset(point.offset))?;
    }
    Ok(Some((tpl, points)))
}

/// The shutdown commit, retried for up to `retry` while the group is rebalancing (another
/// instance joining or leaving): the broker refuses commits until the rebalance completes,
/// and a cooperative rebalance takes two rounds.
pub(crate) fn final_commit<C: ConsumerContext>(
    source: &Source<C>,
    shared: &StreamShared,
    retry: Duration,
) -> KafkaResult<usize> {
    let deadline = Instant::now() + retry;
    loop {
        match commit_sync(source.consumer(), shared, None) {
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

/// How long a synchronous commit waits for the offset mapping to be stored.
const PERSIST_TIMEOUT: Duration = Duration::from_secs(10);

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
