//! A stream's ledger of its offset-mapping writes: which segments and commit points it sent
//! to the store, and which commit points the store holds (what may be committed on the
//! source). The writing itself is the store's ([`super::store`]); this side knows nothing of
//! Kafka, so the stream's shared state can hold it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Progress, Recorder, Segment, StoreRecord};
use crate::mirror::offsets::CommitPoint;
use crate::mirror::Partition;

/// Where a stream's mapping records go: the store topic's producer.
pub(crate) trait StoreWriter: Send + Sync + std::fmt::Debug {
    /// Sends `records`; each acknowledgement calls [`Flush::acknowledged`] on `flush`.
    fn write(&self, records: &[StoreRecord], flush: &Arc<Flush>);
    fn topic(&self) -> &str;
}

/// One write of a stream's segments and progress; its points become committable once every
/// record of it is acknowledged.
#[derive(Debug)]
pub(crate) struct Flush {
    id: u64,
    remaining: AtomicUsize,
    points: Mutex<Vec<CommitPoint>>,
    persisted: Arc<Persisted>,
}

impl Flush {
    /// A write that makes nothing committable (the store's own housekeeping: tombstones).
    pub(crate) fn detached(records: usize) -> Arc<Flush> {
        Arc::new(Flush {
            id: 0,
            remaining: AtomicUsize::new(records),
            points: Mutex::default(),
            persisted: Arc::default(),
        })
    }

    pub(crate) fn acknowledged(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let points =
                std::mem::take(&mut *self.points.lock().unwrap_or_else(|e| e.into_inner()));
            self.persisted.done(self.id, points);
        }
    }
}

/// What a stream's flushes made committable.
#[derive(Debug, Default)]
pub(crate) struct Persisted {
    state: Mutex<PersistedState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct PersistedState {
    points: HashMap<Partition, i64>,
    /// Every flush up to this id is acknowledged, and its points applied.
    done_through: u64,
    /// Flushes acknowledged while an earlier one is not: applied once it is (a flush with
    /// nothing to write completes at once, and its points are only as good as the write
    /// before it).
    early: std::collections::BTreeMap<u64, Vec<CommitPoint>>,
    /// Per released partition, the first flush id made after the release: points of
    /// earlier flushes that complete later belong to the previous ownership.
    released: HashMap<Partition, u64>,
}

impl PersistedState {
    fn apply(&mut self, id: u64, points: Vec<CommitPoint>) {
        for p in points {
            let key = (p.topic, p.partition);
            if self.released.get(&key).is_some_and(|&after| id < after) {
                continue;
            }
            let e = self.points.entry(key).or_insert(p.offset);
            *e = (*e).max(p.offset);
        }
        self.done_through = id;
    }
}

impl Persisted {
    fn done(&self, id: u64, points: Vec<CommitPoint>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.early.insert(id, points);
        loop {
            let next = state.done_through + 1;
            let Some(points) = state.early.remove(&next) else {
                break;
            };
            state.apply(next, points);
        }
        self.changed.notify_all();
    }
}

/// A stream's side of the store: its segments not yet written, its flushes, and the
/// commit points the store holds.
#[derive(Debug)]
pub struct StreamMapping {
    store: Arc<dyn StoreWriter>,
    pub(crate) recorder: Mutex<Recorder>,
    persisted: Arc<Persisted>,
    /// The progress last written per partition (only changes are written).
    written: Mutex<HashMap<Partition, i64>>,
    next_flush: Mutex<u64>,
    /// The periodic commit's write, until the target acknowledges it.
    /// (0: none; flush ids start at 1.) Read on every turn of the stream's loop: an atomic.
    awaiting: std::sync::atomic::AtomicU64,
}

impl StreamMapping {
    pub(crate) fn new(store: Arc<dyn StoreWriter>) -> StreamMapping {
        StreamMapping {
            store,
            recorder: Mutex::default(),
            persisted: Arc::default(),
            written: Mutex::default(),
            next_flush: Mutex::new(0),
            awaiting: 0.into(),
        }
    }

    pub(crate) fn awaiting(&self) -> Option<u64> {
        Some(self.awaiting.load(Ordering::Acquire)).filter(|&id| id > 0)
    }

    pub(crate) fn set_awaiting(&self, id: Option<u64>) {
        self.awaiting.store(id.unwrap_or(0), Ordering::Release);
    }

    pub(crate) fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `segments` and the progress of `points` to the store; returns the flush's id.
    /// The caller took both from the tracker and the recorder at one moment, so the segments
    /// cover every record below each point.
    pub(crate) fn persist(&self, points: Vec<CommitPoint>, segments: Vec<Segment>) -> u64 {
        let mut records: Vec<StoreRecord> =
            segments.into_iter().map(StoreRecord::Segment).collect();
        {
            let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            for p in &points {
                let key = (p.topic.clone(), p.partition);
                if written.get(&key) != Some(&p.offset) {
                    written.insert(key, p.offset);
                    records.push(StoreRecord::Progress(Progress {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        next: p.offset,
                        transactional_id: None,
                    }));
                }
            }
        }
        let id = {
            let mut next = self.next_flush.lock().unwrap_or_else(|e| e.into_inner());
            *next += 1;
            *next
        };
        let flush = Arc::new(Flush {
            id,
            remaining: AtomicUsize::new(records.len()),
            points: Mutex::new(points),
            persisted: self.persisted.clone(),
        });
        if records.is_empty() {
            flush.remaining.store(1, Ordering::Release);
            flush.acknowledged();
        } else {
            self.store.write(&records, &flush);
        }
        id
    }

    /// Whether flush `id` (and every one before it) is acknowledged.
    pub(crate) fn is_done(&self, id: u64) -> bool {
        let state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        state.done_through >= id
    }

    /// Waits up to `timeout` for flush `id`; returns whether it completed.
    pub(crate) fn wait(&self, id: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while state.done_through < id {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .persisted
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// The commit point the store holds for a partition (what may be committed), if any.
    pub(crate) fn persisted_point(&self, topic: &str, partition: i32) -> Option<i64> {
        let state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        state.points.get(&(topic.to_owned(), partition)).copied()
    }

    /// The partitions were released: their segments and points start again with the next
    /// owner (this stream or another).
    pub(crate) fn forget(&self, partitions: &[Partition]) {
        let mut recorder = self.recorder();
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let next = *self.next_flush.lock().unwrap_or_else(|e| e.into_inner()) + 1;
        for (topic, partition) in partitions {
            recorder.forget(topic, *partition);
            let key = (topic.clone(), *partition);
            written.remove(&key);
            state.points.remove(&key);
            state.released.insert(key, next);
        }
    }

    pub(crate) fn topic(&self) -> &str {
        self.store.topic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(offset: i64) -> Vec<CommitPoint> {
        vec![CommitPoint {
            topic: "orders".into(),
            partition: 0,
            offset,
        }]
    }

    fn stored(p: &Persisted) -> (u64, Option<i64>) {
        let state = p.state.lock().unwrap();
        (
            state.done_through,
            state.points.get(&("orders".to_owned(), 0)).copied(),
        )
    }

    #[test]
    fn a_write_acknowledged_before_an_earlier_one_commits_nothing_until_that_one_is() {
        let p = Persisted::default();
        // Flush 2 had nothing to write (complete at once); flush 1's records are in flight.
        p.done(2, point(100));
        assert_eq!(stored(&p), (0, None));
        p.done(1, point(100));
        assert_eq!(stored(&p), (2, Some(100)));
    }

    #[test]
    fn a_write_that_completes_after_its_partition_was_released_sets_no_point() {
        let p = Persisted::default();
        p.state
            .lock()
            .unwrap()
            .released
            .insert(("orders".to_owned(), 0), 2);
        p.done(1, point(500));
        assert_eq!(stored(&p), (1, None));
        p.done(2, point(300));
        assert_eq!(stored(&p), (2, Some(300)));
    }
}
