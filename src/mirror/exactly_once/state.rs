//! The partitions an exactly-once stream owns, and its open transaction.

use std::time::Instant;

use crate::mirror::Partition;

/// One owned source partition.
#[derive(Debug)]
pub(super) struct OwnedPartition {
    pub(super) topic: String,
    pub(super) partition: i32,
    /// The next source offset to copy, as of the open transaction.
    pub(super) next: i64,
    /// The next source offset as of the last committed transaction (`None` for a partition
    /// just assigned, whose claim is still to be written).
    pub(super) committed: Option<i64>,
    /// Whether the consumer's position may move `next` (past records a `read_committed`
    /// consumer never returns): only while every record polled from the partition since it
    /// was assigned or rewound went into a transaction. A record polled and not mirrored
    /// (stopping, a failed send) clears it until the next one mirrored.
    pub(super) followable: bool,
}

impl OwnedPartition {
    pub(super) fn key(&self) -> Partition {
        (self.topic.clone(), self.partition)
    }

    pub(super) fn is(&self, topic: &str, partition: i32) -> bool {
        self.partition == partition && self.topic == topic
    }

    pub(super) fn dirty(&self) -> bool {
        self.committed != Some(self.next)
    }
}

/// The open transaction and the partitions it covers.
#[derive(Debug, Default)]
pub(super) struct TxState {
    /// When the open transaction began.
    pub(super) open: Option<Instant>,
    /// The owned partitions (few per stream: found by a scan, no allocation per record).
    pub(super) parts: Vec<OwnedPartition>,
    /// The index of the part last found.
    pub(super) last: usize,
    /// The producer cannot be used any more (fenced, or a fatal error).
    pub(super) broken: bool,
    /// Assigned partitions whose start could not be read yet (a crashed owner's open
    /// transaction on the store): paused until it is; and since when.
    pub(super) pending: Vec<Partition>,
    pub(super) pending_since: Option<Instant>,
    /// When the pending partitions' start was last tried.
    pub(super) pending_tried: Option<Instant>,
}

impl TxState {
    pub(super) fn find(&mut self, topic: &str, partition: i32) -> Option<&mut OwnedPartition> {
        if !self
            .parts
            .get(self.last)
            .is_some_and(|p| p.is(topic, partition))
        {
            self.last = self.parts.iter().position(|p| p.is(topic, partition))?;
        }
        self.parts.get_mut(self.last)
    }

    pub(super) fn remove(&mut self, topic: &str, partition: i32) {
        self.parts.retain(|p| !p.is(topic, partition));
        self.last = 0;
    }

    /// Back to the last commit: what the open transaction held is aborted.
    pub(super) fn rewind(&mut self) {
        self.open = None;
        for p in &mut self.parts {
            if let Some(c) = p.committed {
                p.next = c;
            }
            p.followable = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, partition: i32, next: i64, committed: Option<i64>) -> OwnedPartition {
        OwnedPartition {
            topic: topic.to_owned(),
            partition,
            next,
            committed,
            followable: true,
        }
    }

    #[test]
    fn an_abort_rewinds_each_partition_to_its_last_committed_progress() {
        let mut state = TxState {
            open: Some(Instant::now()),
            parts: vec![
                part("orders", 0, 150, Some(100)),
                // Just assigned: its claim is not committed yet; it keeps its start.
                part("orders", 1, 40, None),
            ],
            ..TxState::default()
        };
        assert!(state.parts.iter().all(OwnedPartition::dirty));
        state.rewind();
        assert!(state.open.is_none());
        let found = |s: &mut TxState, p: i32| {
            let part = s.find("orders", p).expect("owned");
            (part.next, part.followable, part.dirty())
        };
        // Copied again from 100: the aborted copies of 100..150 are never visible.
        assert_eq!(found(&mut state, 0), (100, false, false));
        // Still to be claimed: the next commit writes its progress.
        assert_eq!(found(&mut state, 1), (40, false, true));
    }

    #[test]
    fn a_released_partition_is_no_longer_found() {
        let mut state = TxState {
            parts: vec![
                part("orders", 0, 10, Some(10)),
                part("orders", 1, 20, Some(20)),
                part("payments", 0, 30, Some(30)),
            ],
            ..TxState::default()
        };
        assert_eq!(state.find("payments", 0).map(|p| p.next), Some(30));
        state.remove("payments", 0);
        assert!(state.find("payments", 0).is_none());
        assert_eq!(state.find("orders", 1).map(|p| p.next), Some(20));
        assert!(state.find("orders", 2).is_none());
    }
}
