//! The acknowledged-offset tracker: which source offsets may be committed.
//!
//! Every consumed record is registered with the number of target records produced from it
//! (one without a handler; zero when filtered out; several on fan-out). Each produced record
//! carries a small integer (its [`Ticket`] packed into a `usize`) through librdkafka as the
//! delivery opaque, so a delivery report finds its source record without a lookup or an
//! allocation. Per source partition the records in flight sit in a ring in consumption order;
//! the commit point is the offset after the longest prefix of records that are fully
//! acknowledged. Acknowledgements may arrive in any order (records of one source partition can
//! go to several target partitions). A record whose delivery failed stays at the front for
//! ever, so the commit point never passes it.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxHashMap;

use super::Partition;

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the offset tracker packs tickets into a 64-bit usize");

const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// Identifies one consumed record in the tracker; travels as the producer's delivery opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    slot: u32,
    seq: u64,
}

impl Ticket {
    pub(crate) fn to_opaque(self) -> usize {
        ((self.seq << SLOT_BITS) | u64::from(self.slot)) as usize
    }

    pub(crate) fn from_opaque(opaque: usize) -> Ticket {
        let v = opaque as u64;
        Ticket {
            slot: (v & SLOT_MASK) as u32,
            seq: v >> SLOT_BITS,
        }
    }
}

/// Where a source partition's committed offset may go: the offset of the next record to
/// read, everything before it acknowledged by the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommitPoint {
    pub topic: String,
    pub partition: i32,
    pub(crate) offset: i64,
}

/// One source partition's counters since start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTotals {
    pub topic: String,
    pub partition: i32,
    pub counters: PartitionCounters,
}

/// The source record a ticket stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceRecord<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub(crate) offset: i64,
    /// The source record's timestamp (create or log-append time), in ms since the epoch.
    pub(crate) timestamp: Option<i64>,
}

/// What an acknowledgement or failure found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome<'a> {
    /// The ticket belongs to a partition that was released since (after a rebalance whose
    /// flush timed out): nothing to do, its offsets were not committed past it.
    Stale,
    Recorded(SourceRecord<'a>),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: i64,
    /// The source record's timestamp in ms, or -1: what replication latency is measured from
    /// when its target records are acknowledged (carried here, not in a per-record box).
    timestamp: i64,
    /// Size of the source record, counted in `in_flight_bytes` until it is acknowledged.
    bytes: u32,
    /// Target records produced from this source record and not yet acknowledged.
    pending: u32,
    /// Source records it stands for in the partition's counters: 1 (a record), or a batch's
    /// count (the batch engine's tickets, [`OffsetTracker::begin_batch`]).
    records: u32,
    failed: bool,
}

/// What one source partition has seen since start, for metrics. Kept across rebalances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionCounters {
    /// Source records consumed.
    pub consumed: u64,
    /// Their key, value and header bytes.
    pub consumed_bytes: u64,
    /// Source records whose every target record was acknowledged (filtered ones included).
    pub acknowledged: u64,
    /// Source records consumed and not yet fully acknowledged (a gauge).
    pub in_flight: u64,
}

impl PartitionCounters {
    pub(crate) fn add(&mut self, other: &PartitionCounters) {
        self.consumed += other.consumed;
        self.consumed_bytes += other.consumed_bytes;
        self.acknowledged += other.acknowledged;
        self.in_flight += other.in_flight;
    }
}

#[derive(Debug)]
struct Slot {
    topic: String,
    partition: i32,
    live: bool,
    counters: PartitionCounters,
    /// Sequence number of `ring[0]`; sequence numbers of a slot index never repeat, even
    /// across occupants, so a late delivery for a released partition is recognised.
    front_seq: u64,
    /// Sequence number of the first record of the current occupant.
    first_seq: u64,
    ring: VecDeque<Entry>,
    /// The next offset to consume according to what is acknowledged, if anything is.
    committable: Option<i64>,
    /// The offset of the last record registered, to notice a position that moves back.
    last_offset: Option<i64>,
    /// Records with a lower sequence number were consumed before the position moved back:
    /// their acknowledgement lets the records behind them advance, but never sets the commit
    /// point (their offsets belong to the log as it was before).
    superseded_below: u64,
    /// Its source topic was created again (a new topic id) and no record of the new topic
    /// has been registered yet: the consumer's position may still be the old topic's, so the
    /// commit point does not follow it.
    restarted: bool,
}

impl Slot {
    fn next_seq(&self) -> u64 {
        self.front_seq + self.ring.len() as u64
    }

    fn advance(&mut self) {
        while let Some(front) = self.ring.front() {
            if front.pending > 0 || front.failed {
                break;
            }
            if self.front_seq >= self.superseded_below {
                self.committable = Some(front.offset + 1);
            }
            self.ring.pop_front();
            self.front_seq += 1;
        }
    }
}

/// Per-stream tracker. Not thread-safe by itself; a stream keeps it behind one mutex, taken
/// by that stream's thread (consume loop, delivery callbacks, rebalance) and, now and then,
/// by the operators' side reading counters.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Looked up for every record: a fast hash (topic names come from the cluster, not from
    /// an adversary), which took SipHash's share of the stream thread's time away.
    by_topic: FxHashMap<String, Vec<Option<u32>>>,
    /// The slot of the previous record: records come in runs from one partition (a fetched
    /// batch), and comparing one name is cheaper than hashing it.
    last: u32,
    in_flight: usize,
    in_flight_bytes: usize,
    /// Counters of partitions released since, so that they stay monotonic.
    retired: HashMap<Partition, PartitionCounters>,
    /// Where consumption of a newly assigned partition should start (its committed offset),
    /// until its first record is registered.
    starts: HashMap<Partition, i64>,
    /// Records the consumer returned that were put back to be consumed again, not
    /// registered: the least offset of each partition's, which its commit point does not pass
    /// by following the consumer's position, until a record from there on is registered.
    held: HashMap<Partition, i64>,
}

impl OffsetTracker {
    pub(crate) fn new() -> OffsetTracker {
        OffsetTracker::default()
    }

    /// Source records consumed and not yet fully acknowledged (failed ones included).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Bytes of the source records counted by [`in_flight`](Self::in_flight).
    pub(crate) fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    fn slot_of(&self, topic: &str, partition: i32) -> Option<u32> {
        let parts = self.by_topic.get(topic)?;
        *parts.get(usize::try_from(partition).ok()?)?
    }

    fn slot_or_insert(&mut self, topic: &str, partition: i32) -> u32 {
        if let Some(last) = self.slots.get(self.last as usize) {
            if last.live && last.partition == partition && last.topic == topic {
                return self.last;
            }
        }
        if let Some(slot) = self.slot_of(topic, partition) {
            self.last = slot;
            return slot;
        }
        let index = match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.topic.clear();
                slot.topic.push_str(topic);
                slot.partition = partition;
                slot.live = true;
                slot.first_seq = slot.next_seq();
                slot.front_seq = slot.first_seq;
                slot.committable = None;
                slot.last_offset = self
                    .starts
                    .remove(&(topic.to_owned(), partition))
                    .map(|o| o - 1);
                slot.superseded_below = slot.first_seq;
                slot.restarted = false;
                slot.counters = PartitionCounters::default();
                index
            }
            None => {
                assert!(
                    self.slots.len() < MAX_SLOTS,
                    "more than {MAX_SLOTS} partitions assigned to one stream"
                );
                self.slots.push(Slot {
                    topic: topic.to_owned(),
                    partition,
                    live: true,
                    counters: PartitionCounters::default(),
                    front_seq: 0,
                    first_seq: 0,
                    ring: VecDeque::new(),
                    committable: None,
                    last_offset: self
                        .starts
                        .remove(&(topic.to_owned(), partition))
                        .map(|o| o - 1),
                    superseded_below: 0,
                    restarted: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let p = usize::try_from(partition).expect("Kafka partitions are non-negative");
        let parts = self.by_topic.entry(topic.to_owned()).or_default();
        if parts.len() <= p {
            parts.resize(p + 1, None);
        }
        parts[p] = Some(index);
        self.last = index;
        index
    }

    /// Registers a consumed record of `bytes` bytes, stamped `timestamp` (ms), from which
    /// `outputs` target records will be produced. With `outputs == 0` (filtered out) it counts
    /// as acknowledged at once.
    ///
    /// Offsets grow within a partition, except when its position moves back (the log was
    /// truncated after an unclean leader election, the topic was deleted and recreated, the
    /// position was reset to the earliest offset). Then the records still in flight belong
    /// to the log as it was: their acknowledgements must not carry the commit point past the
    /// records consumed since, which come before them in offset order. The commit point is
    /// lowered to the new offset (if it was past it), and it only moves again when records
    /// consumed after the move are acknowledged.
    pub(crate) fn begin(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp: Option<i64>,
        bytes: usize,
        outputs: u32,
    ) -> Ticket {
        self.begin_after(topic, partition, offset, timestamp, bytes, outputs)
            .0
    }

    /// Where consumption of a partition being assigned starts (its committed offset): the
    /// first record registered for it is compared with it, as later ones with the record
    /// before them.
    pub(crate) fn expect_start(&mut self, topic: &str, partition: i32, offset: i64) {
        if self.slot_of(topic, partition).is_none() {
            self.starts.insert((topic.to_owned(), partition), offset);
        }
    }

    /// The offset a record at `offset` was expected at, when it skips ahead of it (what
    /// [`begin_after`](Self::begin_after) would report), without registering anything.
    pub(crate) fn gap_before(&self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let expected = match self.slot_of(topic, partition) {
            Some(index) => self.slots[index as usize].last_offset.map(|last| last + 1),
            None => self.starts.get(&(topic.to_owned(), partition)).copied(),
        };
        expected.filter(|expected| offset > *expected)
    }

    /// Like [`begin`](Self::begin); also returns the offset the record was expected at when
    /// it skips ahead of it (a gap: compaction, transaction markers, or records deleted
    /// before they were read), `None` when it follows on or nothing was expected.
    pub(crate) fn begin_after(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp: Option<i64>,
        bytes: usize,
        outputs: u32,
    ) -> (Ticket, Option<i64>) {
        self.register(topic, partition, offset, timestamp, (bytes, outputs), None)
    }

    /// A ticket for the `records` source records from `offset` on that go to the target as one
    /// batch (the batch engine): acknowledged once, it counts them all as acknowledged. Their
    /// consumption is counted where they are read ([`count_consumed`](Self::count_consumed)),
    /// not here: a batch sent again in parts takes tickets again.
    pub(crate) fn begin_batch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        bytes: usize,
        records: u32,
    ) -> Ticket {
        self.register(topic, partition, offset, None, (bytes, 1), Some(records))
            .0
    }

    /// Source records of a partition read (the batch engine, whose tickets stand for batches):
    /// its `consumed` counters.
    pub(crate) fn count_consumed(&mut self, topic: &str, partition: i32, records: u64, bytes: u64) {
        let index = self.slot_or_insert(topic, partition);
        let counters = &mut self.slots[index as usize].counters;
        counters.consumed += records;
        counters.consumed_bytes += bytes;
    }

    /// The source records the ticket stands for from now on (a batch sent again with fewer
    /// records under the same ticket: those left out are not acknowledged).
    pub(crate) fn set_records(&mut self, ticket: Ticket, records: u32) {
        if let Some(pos) = self.position(ticket) {
            self.slots[ticket.slot as usize].ring[pos].records = records;
        }
    }

    /// [`begin_after`](Self::begin_after), or with `batch` a batch engine's ticket for that
    /// many records, its consumption not counted here.
    fn register(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp: Option<i64>,
        (bytes, outputs): (usize, u32),
        batch: Option<u32>,
    ) -> (Ticket, Option<i64>) {
        if !self.held.is_empty() {
            self.held
                .retain(|(t, p), held| !(t == topic && *p == partition && offset >= *held));
        }
        let index = self.slot_or_insert(topic, partition);
        let slot = &mut self.slots[index as usize];
        let gap_from = slot
            .last_offset
            .map(|last| last + 1)
            .filter(|expected| offset > *expected);
        if let Some(last) = slot.last_offset.filter(|last| offset <= *last) {
            tracing::warn!(
                "source partition {topic}/{partition} moved back from offset {last} to {offset} \
                 (log truncated, topic recreated, or position reset); the commit point stays at \
                 or below {offset} until the records from there on are acknowledged"
            );
            slot.superseded_below = slot.next_seq();
            slot.committable = slot.committable.map(|c| c.min(offset));
        }
        slot.last_offset = Some(offset);
        slot.restarted = false;
        if batch.is_none() {
            slot.counters.consumed += 1;
            slot.counters.consumed_bytes += bytes as u64;
        }
        let seq = slot.next_seq();
        if outputs == 0 {
            slot.counters.acknowledged += 1;
        }
        if outputs == 0 && slot.ring.is_empty() {
            slot.committable = Some(offset + 1);
            slot.front_seq += 1;
        } else {
            let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
            slot.ring.push_back(Entry {
                offset,
                timestamp: timestamp.unwrap_or(-1),
                bytes,
                pending: outputs,
                records: batch.unwrap_or(1),
                failed: false,
            });
            if outputs > 0 {
                self.in_flight += 1;
                self.in_flight_bytes += bytes as usize;
            }
        }
        (Ticket { slot: index, seq }, gap_from)
    }

    /// The partition's source topic was deleted and created again (a new topic id): its
    /// consumption starts again at `offset` of the new topic, and the commit point is
    /// `offset` at once (a stop before the new topic's first record commits it, not the old
    /// topic's position). Records still in flight were copied from the old topic: their
    /// acknowledgements let the records behind them advance but never set the commit point.
    /// Returns the position abandoned in the old topic (the offset after its last record
    /// registered, or where consumption was to start), if any.
    pub(crate) fn restart_at(&mut self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let start = self.starts.get(&(topic.to_owned(), partition)).copied();
        let index = self.slot_or_insert(topic, partition);
        let slot = &mut self.slots[index as usize];
        let abandoned = slot.last_offset.map(|last| last + 1).or(start);
        slot.superseded_below = slot.next_seq();
        slot.committable = Some(offset);
        slot.last_offset = Some(offset - 1);
        slot.restarted = true;
        abandoned
    }

    /// Where the ticket's record sits in its slot's ring, if it is still tracked.
    fn position(&self, ticket: Ticket) -> Option<usize> {
        let slot = self.slots.get(ticket.slot as usize)?;
        if !slot.live || ticket.seq < slot.first_seq || ticket.seq < slot.front_seq {
            return None;
        }
        let pos = usize::try_from(ticket.seq - slot.front_seq).ok()?;
        (pos < slot.ring.len()).then_some(pos)
    }

    /// Where a partition's consumption must start again for nothing unacknowledged to be
    /// skipped: its oldest record not acknowledged (a failed one), or else its commit point.
    /// The lowest offset in its ring counts (after a position that moved back, the front
    /// holds records of the log as it was, above the ones consumed since).
    pub(crate) fn rewind_point(&self, topic: &str, partition: i32) -> Option<i64> {
        Self::rewind_of(&self.slots[self.slot_of(topic, partition)? as usize])
    }

    fn rewind_of(slot: &Slot) -> Option<i64> {
        let lowest = slot.ring.iter().map(|e| e.offset).min();
        match (lowest, slot.committable) {
            (Some(l), Some(c)) => Some(l.min(c)),
            (l, c) => l.or(c),
        }
    }

    /// [`rewind_point`](Self::rewind_point) of each of `partitions` that is tracked and has
    /// one: a partition with records in flight has one even when none is acknowledged yet.
    pub(crate) fn rewind_points_of(&self, partitions: &[Partition]) -> Vec<CommitPoint> {
        self.slots
            .iter()
            .filter(|s| {
                s.live
                    && partitions
                        .iter()
                        .any(|(t, p)| *t == s.topic && *p == s.partition)
            })
            .filter_map(|s| {
                Some(CommitPoint {
                    topic: s.topic.clone(),
                    partition: s.partition,
                    offset: Self::rewind_of(s)?,
                })
            })
            .collect()
    }

    /// The source record of a ticket still tracked.
    pub(crate) fn peek(&self, ticket: Ticket) -> Option<SourceRecord<'_>> {
        let pos = self.position(ticket)?;
        let slot = &self.slots[ticket.slot as usize];
        let entry = &slot.ring[pos];
        Some(SourceRecord {
            topic: &slot.topic,
            partition: slot.partition,
            offset: entry.offset,
            timestamp: (entry.timestamp >= 0).then_some(entry.timestamp),
        })
    }

    /// Whether the ticket's record is still tracked (its partition was not released since).
    pub(crate) fn is_tracked(&self, ticket: Ticket) -> bool {
        self.position(ticket).is_some()
    }

    /// One target record produced from the ticket's source record was acknowledged.
    pub(crate) fn ack(&mut self, ticket: Ticket) -> Outcome<'_> {
        self.settle(ticket, true)
    }

    /// Skip mode: a target record produced from the ticket's source record was refused for
    /// good and is given up. As [`ack`](Self::ack) for the commit point, which passes it; not
    /// counted as acknowledged (the caller counts it dropped).
    pub(crate) fn give_up(&mut self, ticket: Ticket) -> Outcome<'_> {
        self.settle(ticket, false)
    }

    fn settle(&mut self, ticket: Ticket, acknowledged: bool) -> Outcome<'_> {
        let Some(pos) = self.position(ticket) else {
            return Outcome::Stale;
        };
        let entry = &mut self.slots[ticket.slot as usize].ring[pos];
        if entry.pending == 0 {
            // More acknowledgements than records produced: librdkafka reports each once.
            return Outcome::Stale;
        }
        entry.pending -= 1;
        if !acknowledged {
            // A record given up stands for no record acknowledged, whatever else of it is.
            entry.records = 0;
        }
        let (offset, timestamp, bytes) = (entry.offset, entry.timestamp, entry.bytes as usize);
        let records = u64::from(entry.records);
        let done = entry.pending == 0 && !entry.failed;
        if done {
            self.in_flight -= 1;
            self.in_flight_bytes -= bytes;
        }
        let slot = &mut self.slots[ticket.slot as usize];
        if done {
            slot.counters.acknowledged += records;
            if pos == 0 {
                slot.advance();
            }
        }
        Outcome::Recorded(SourceRecord {
            topic: &slot.topic,
            partition: slot.partition,
            offset,
            timestamp: (timestamp >= 0).then_some(timestamp),
        })
    }

    /// A target record produced from the ticket's source record failed for good: the commit
    /// point of its partition never passes it.
    pub(crate) fn fail(&mut self, ticket: Ticket) -> Outcome<'_> {
        let Some(pos) = self.position(ticket) else {
            return Outcome::Stale;
        };
        let slot = &mut self.slots[ticket.slot as usize];
        let entry = &mut slot.ring[pos];
        entry.pending = entry.pending.saturating_sub(1);
        // It stays counted in `in_flight`: a failed record is never acknowledged.
        entry.failed = true;
        Outcome::Recorded(SourceRecord {
            topic: &slot.topic,
            partition: slot.partition,
            offset: entry.offset,
            timestamp: (entry.timestamp >= 0).then_some(entry.timestamp),
        })
    }

    /// A consumed record that never goes out (a message handler failed on it, or it could not
    /// be put back for a later poll): registered and failed at once, so that its partition's
    /// commit point stays below it for as long as the partition is tracked, even though the
    /// consumer's position is past it ([`advance_to_position`](Self::advance_to_position)
    /// follows positions only over acknowledged records).
    pub(crate) fn begin_failed(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp: Option<i64>,
        bytes: usize,
    ) -> Ticket {
        let ticket = self.begin(topic, partition, offset, timestamp, bytes, 1);
        self.fail(ticket);
        ticket
    }

    /// The commit point of every tracked partition that has one. Every commit sends them all, unchanged ones too, so a commit that failed for
    /// some partitions (librdkafka does not report that for asynchronous commits) is mended by
    /// the next one.
    pub(crate) fn commit_points(&self) -> Vec<CommitPoint> {
        self.commit_points_where(|_, _| true)
    }

    /// Like [`commit_points`](Self::commit_points), for the given partitions only.
    pub(crate) fn commit_points_of(&self, partitions: &[Partition]) -> Vec<CommitPoint> {
        self.commit_points_where(|t, p| partitions.iter().any(|(pt, pp)| pt == t && *pp == p))
    }

    fn commit_points_where(&self, wanted: impl Fn(&str, i32) -> bool) -> Vec<CommitPoint> {
        self.slots
            .iter()
            .filter(|s| s.live && wanted(&s.topic, s.partition))
            .filter_map(|s| {
                Some(CommitPoint {
                    topic: s.topic.clone(),
                    partition: s.partition,
                    offset: s.committable?,
                })
            })
            .collect()
    }

    /// The consumer's position in a partition moved to `position` without records (past
    /// transaction markers and aborted transactions, which a `read_committed` consumer never
    /// returns): when every record consumed from the partition is acknowledged, the commit
    /// point follows, so that committed offsets reach the end of the log. Only positions of
    /// records this tracker saw begin may be given (the stream's own thread, between polls).
    pub(crate) fn advance_to_position(&mut self, topic: &str, partition: i32, position: i64) {
        let Some(index) = self.slot_of(topic, partition) else {
            return;
        };
        let position = self
            .held
            .iter()
            .find(|((t, p), _)| t == topic && *p == partition)
            .map_or(position, |(_, held)| position.min(*held));
        let slot = &mut self.slots[index as usize];
        if slot.restarted {
            return;
        }
        if slot.live && slot.ring.is_empty() && slot.committable.is_some_and(|c| position > c) {
            slot.committable = Some(position);
        }
    }

    /// A record the consumer returned at `offset` that is put back to be consumed again (the
    /// consumer rewound to it) rather than registered: until a record from `offset` on is
    /// registered, the partition's commit point does not pass it by following the consumer's
    /// position ([`advance_to_position`](Self::advance_to_position)), which stays past it
    /// until the rewind takes effect.
    pub(crate) fn hold(&mut self, topic: &str, partition: i32, offset: i64) {
        self.held
            .entry((topic.to_owned(), partition))
            .and_modify(|held| *held = (*held).min(offset))
            .or_insert(offset);
    }

    /// Stops tracking a partition that was revoked. Deliveries still to come for it are
    /// recognised as stale. Returns how many of its records were not acknowledged.
    pub(crate) fn release(&mut self, topic: &str, partition: i32) -> usize {
        self.held
            .retain(|(t, p), _| !(t == topic && *p == partition));
        let Some(index) = self.slot_of(topic, partition) else {
            return 0;
        };
        let slot = &mut self.slots[index as usize];
        // Exactly the entries counted in `in_flight`: not fully acknowledged, or failed.
        let (unacked, unacked_bytes) = slot
            .ring
            .iter()
            .filter(|e| e.pending > 0 || e.failed)
            .fold((0, 0), |(n, b), e| (n + 1, b + e.bytes as usize));
        let mut counters = slot.counters;
        counters.in_flight = 0;
        self.retired
            .entry((topic.to_owned(), partition))
            .or_default()
            .add(&counters);
        // Keep sequence numbers of this slot index unique for its next occupant.
        slot.front_seq = slot.next_seq();
        slot.ring.clear();
        slot.live = false;
        self.in_flight -= unacked;
        self.in_flight_bytes -= unacked_bytes;
        if let Some(parts) = self.by_topic.get_mut(topic) {
            parts[partition as usize] = None;
        }
        self.starts.remove(&(topic.to_owned(), partition));
        self.free.push(index);
        unacked
    }

    /// Per source partition ever tracked: its counters since start, and what is in flight now.
    pub(crate) fn partition_counters(&self) -> Vec<PartitionTotals> {
        let mut all = self.retired.clone();
        for slot in self.slots.iter().filter(|s| s.live) {
            let mut counters = slot.counters;
            counters.in_flight = slot
                .ring
                .iter()
                .filter(|e| e.pending > 0 || e.failed)
                .map(|e| u64::from(e.records))
                .sum();
            all.entry((slot.topic.clone(), slot.partition))
                .or_default()
                .add(&counters);
        }
        all.into_iter()
            .map(|((topic, partition), counters)| PartitionTotals {
                topic,
                partition,
                counters,
            })
            .collect()
    }

    /// The offset of the oldest record of `topic/partition` consumed and not yet acknowledged
    /// (or failed), if any.
    pub(crate) fn oldest_unacknowledged(&self, topic: &str, partition: i32) -> Option<i64> {
        let index = self.slot_of(topic, partition)?;
        self.slots[index as usize].ring.front().map(|e| e.offset)
    }

    /// The partitions currently tracked.
    #[cfg(test)]
    fn partitions(&self) -> Vec<Partition> {
        self.slots
            .iter()
            .filter(|s| s.live)
            .map(|s| (s.topic.clone(), s.partition))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit_of(t: &mut OffsetTracker, topic: &str, partition: i32) -> Option<i64> {
        t.commit_points()
            .into_iter()
            .find(|c| c.topic == topic && c.partition == partition)
            .map(|c| c.offset)
    }

    #[test]
    fn commit_point_is_after_the_longest_acknowledged_prefix() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 10, None, 10, 1);
        let b = t.begin("t", 0, 11, None, 10, 1);
        let c = t.begin("t", 0, 12, None, 10, 1);
        assert_eq!(commit_of(&mut t, "t", 0), None);
        // Acks arrive out of order (the records went to different target partitions).
        t.ack(c);
        assert_eq!(
            commit_of(&mut t, "t", 0),
            None,
            "12 acked but 10 and 11 are not"
        );
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(11));
        t.ack(b);
        assert_eq!(commit_of(&mut t, "t", 0), Some(13));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_failed_record_pins_the_commit_point_below_it_for_ever() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 3, 100, None, 10, 1);
        let b = t.begin("t", 3, 101, None, 10, 1);
        let c = t.begin("t", 3, 102, None, 10, 1);
        t.ack(a);
        let failed = t.fail(b);
        assert_eq!(
            failed,
            Outcome::Recorded(SourceRecord {
                topic: "t",
                partition: 3,
                offset: 101,
                timestamp: None
            })
        );
        t.ack(c);
        assert_eq!(commit_of(&mut t, "t", 3), Some(101));
        let d = t.begin("t", 3, 103, None, 10, 1);
        t.ack(d);
        assert_eq!(commit_of(&mut t, "t", 3), Some(101));
    }

    #[test]
    fn fan_out_counts_as_acknowledged_only_when_every_output_is() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 5, None, 10, 3);
        t.ack(a);
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), None);
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(6));
    }

    #[test]
    fn filtered_records_count_as_acknowledged_at_once() {
        let mut t = OffsetTracker::new();
        t.begin("t", 0, 0, None, 10, 0);
        assert_eq!(commit_of(&mut t, "t", 0), Some(1));
        let b = t.begin("t", 0, 1, None, 10, 1);
        t.begin("t", 0, 2, None, 10, 0);
        assert_eq!(commit_of(&mut t, "t", 0), Some(1), "1 is still in flight");
        t.ack(b);
        assert_eq!(commit_of(&mut t, "t", 0), Some(3));
    }

    #[test]
    fn partitions_are_tracked_independently() {
        let mut t = OffsetTracker::new();
        let a0 = t.begin("a", 0, 0, None, 10, 1);
        let a1 = t.begin("a", 1, 50, None, 10, 1);
        let b0 = t.begin("b", 0, 7, None, 10, 1);
        t.ack(a1);
        t.ack(b0);
        assert_eq!(commit_of(&mut t, "a", 0), None);
        assert_eq!(commit_of(&mut t, "a", 1), Some(51));
        assert_eq!(commit_of(&mut t, "b", 0), Some(8));
        t.ack(a0);
        assert_eq!(commit_of(&mut t, "a", 0), Some(1));
    }

    #[test]
    fn deliveries_after_revocation_are_stale_even_when_the_slot_is_reused() {
        let mut t = OffsetTracker::new();
        let old = t.begin("t", 0, 10, None, 10, 1);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.release("t", 0), 1);
        assert_eq!(t.in_flight(), 0);
        // Another partition takes the freed slot index.
        let new = t.begin("u", 2, 500, None, 10, 1);
        assert_eq!(new.slot, old.slot);
        assert_eq!(t.ack(old), Outcome::Stale);
        assert_eq!(
            commit_of(&mut t, "u", 2),
            None,
            "the stale ack must not move u-2"
        );
        t.ack(new);
        assert_eq!(commit_of(&mut t, "u", 2), Some(501));
        assert!(t.partitions().iter().all(|(topic, _)| topic != "t"));
    }

    #[test]
    fn partition_counters_stay_monotonic_across_a_release_and_reassignment() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 0, None, 100, 1);
        t.begin("t", 0, 1, None, 50, 0); // filtered: acknowledged at once
        t.begin("t", 0, 2, None, 10, 1); // in flight
        t.ack(a);
        let counters = |t: &OffsetTracker| {
            t.partition_counters()
                .into_iter()
                .find(|p| p.topic == "t" && p.partition == 0)
                .map(|p| p.counters)
                .unwrap()
        };
        let before = counters(&t);
        assert_eq!(
            before,
            PartitionCounters {
                consumed: 3,
                consumed_bytes: 160,
                acknowledged: 2,
                in_flight: 1
            }
        );
        t.release("t", 0);
        let b = t.begin("t", 0, 2, None, 10, 1);
        t.ack(b);
        let after = counters(&t);
        assert_eq!(
            (after.consumed, after.acknowledged, after.in_flight),
            (4, 3, 0)
        );
    }

    fn counters_of(t: &OffsetTracker, partition: i32) -> PartitionCounters {
        t.partition_counters()
            .into_iter()
            .find(|p| p.topic == "t" && p.partition == partition)
            .map(|p| p.counters)
            .unwrap()
    }

    #[test]
    fn a_batch_ticket_counts_its_records_not_itself() {
        let mut t = OffsetTracker::new();
        t.count_consumed("t", 0, 300, 30_000);
        let first = t.begin_batch("t", 0, 0, 10_000, 100);
        let second = t.begin_batch("t", 0, 100, 20_000, 200);
        let c = counters_of(&t, 0);
        assert_eq!(
            (c.consumed, c.consumed_bytes, c.acknowledged, c.in_flight),
            (300, 30_000, 0, 300)
        );
        t.ack(first);
        let c = counters_of(&t, 0);
        assert_eq!((c.acknowledged, c.in_flight), (100, 200));
        // Sent again without 5 refused records: its ticket stands for the 195 others.
        t.set_records(second, 195);
        t.ack(second);
        let c = counters_of(&t, 0);
        assert_eq!((c.consumed, c.acknowledged, c.in_flight), (300, 295, 0));
    }

    #[test]
    fn a_record_given_up_in_skip_mode_is_passed_but_not_acknowledged() {
        let mut t = OffsetTracker::new();
        let dropped = t.begin("t", 0, 0, None, 10, 1);
        let copied = t.begin("t", 0, 1, None, 10, 1);
        t.give_up(dropped);
        t.ack(copied);
        let c = counters_of(&t, 0);
        assert_eq!((c.consumed, c.acknowledged, c.in_flight), (2, 1, 0));
        assert_eq!(commit_of(&mut t, "t", 0), Some(2));
    }

    #[test]
    fn revoked_partition_commit_points_can_be_taken_alone() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 0, None, 10, 1);
        let b = t.begin("t", 1, 0, None, 10, 1);
        t.ack(a);
        t.ack(b);
        assert_eq!(
            t.commit_points_of(&[("t".to_owned(), 1)]),
            vec![CommitPoint {
                topic: "t".to_owned(),
                partition: 1,
                offset: 1
            }]
        );
        assert_eq!(t.commit_points().len(), 2);
    }

    #[test]
    fn a_position_that_moves_back_never_lets_old_acks_pass_new_records() {
        // Log truncation, a topic deleted and recreated, a reset to earliest: the next
        // record of a partition has a lower offset than records still in flight.
        let mut t = OffsetTracker::new();
        let old_a = t.begin("t", 0, 100, None, 10, 1);
        let old_b = t.begin("t", 0, 101, None, 10, 1);
        let new_a = t.begin("t", 0, 5, None, 10, 1);
        let new_b = t.begin("t", 0, 6, None, 10, 1);
        // Nothing after 5 in the new log is acknowledged: the commit point is at most 5.
        assert!(commit_of(&mut t, "t", 0).is_none_or(|o| o <= 5));
        t.ack(old_a);
        t.ack(old_b);
        assert!(
            commit_of(&mut t, "t", 0).is_none_or(|o| o <= 5),
            "acknowledging the old records must not move the commit point past 5 and 6: {:?}",
            commit_of(&mut t, "t", 0)
        );
        t.ack(new_a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(6));
        t.ack(new_b);
        assert_eq!(commit_of(&mut t, "t", 0), Some(7));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_recreated_topic_commits_its_start_at_once_and_old_acks_never_pass_it() {
        let mut t = OffsetTracker::new();
        let done = t.begin("t", 0, 299, None, 10, 1);
        t.ack(done);
        let old = t.begin("t", 0, 300, None, 10, 1);
        assert_eq!(t.restart_at("t", 0, 0), Some(301));
        // Before any record of the new topic: its start, not the old position.
        assert_eq!(commit_of(&mut t, "t", 0), Some(0));
        // The consumer's position may still be the old one: not followed.
        t.advance_to_position("t", 0, 301);
        assert_eq!(commit_of(&mut t, "t", 0), Some(0));
        t.ack(old);
        assert_eq!(commit_of(&mut t, "t", 0), Some(0), "an old record's ack");
        // The new topic's first record follows on: no gap, no move back.
        let (first, gap) = t.begin_after("t", 0, 0, None, 10, 1);
        assert_eq!(gap, None);
        t.ack(first);
        assert_eq!(commit_of(&mut t, "t", 0), Some(1));
        assert_eq!(t.in_flight(), 0);
        // A partition assigned and not yet read abandons where it was to start.
        t.expect_start("t", 1, 40);
        assert_eq!(t.restart_at("t", 1, 0), Some(40));
        assert_eq!(commit_of(&mut t, "t", 1), Some(0));
    }

    #[test]
    fn a_position_that_moves_back_lowers_a_commit_point_already_past_it() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 100, None, 10, 1);
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(101));
        // The partition starts again at 0 (recreated); 0 is not acknowledged yet.
        let b = t.begin("t", 0, 0, None, 10, 1);
        assert_eq!(commit_of(&mut t, "t", 0), Some(0));
        t.ack(b);
        assert_eq!(commit_of(&mut t, "t", 0), Some(1));
        // A filtered record after another move back counts as acknowledged at once.
        t.begin("t", 0, 0, None, 10, 0);
        assert_eq!(commit_of(&mut t, "t", 0), Some(1));
    }

    #[test]
    fn a_position_that_moves_back_behind_a_failed_record_stays_pinned() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 50, None, 10, 1);
        t.fail(a);
        let b = t.begin("t", 0, 10, None, 10, 1);
        t.ack(b);
        assert!(commit_of(&mut t, "t", 0).is_none_or(|o| o <= 10));
    }

    #[test]
    fn a_record_after_a_gap_reports_the_offset_it_was_expected_at() {
        let mut t = OffsetTracker::new();
        t.expect_start("t", 0, 100);
        assert_eq!(t.begin_after("t", 0, 100, None, 1, 1).1, None);
        assert_eq!(t.begin_after("t", 0, 101, None, 1, 1).1, None);
        assert_eq!(t.begin_after("t", 0, 105, None, 1, 1).1, Some(102));
        // The first record after an assignment is compared with the committed offset.
        t.expect_start("t", 1, 100);
        assert_eq!(t.begin_after("t", 1, 857, None, 1, 1).1, Some(100));
        // Nothing expected (no committed offset): no gap.
        assert_eq!(t.begin_after("t", 2, 50, None, 1, 1).1, None);
        // Asked without registering, the same answers.
        t.expect_start("t", 3, 10);
        assert_eq!(t.gap_before("t", 3, 12), Some(10));
        assert_eq!(t.gap_before("t", 3, 10), None);
        assert_eq!(t.gap_before("t", 0, 107), Some(106));
        assert_eq!(t.gap_before("t", 0, 106), None);
    }

    #[test]
    fn an_acknowledgement_carries_the_source_records_timestamp() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 0, Some(1_700_000_000_123), 10, 1);
        let b = t.begin("t", 0, 1, None, 10, 1);
        let timestamp = |o: Outcome<'_>| match o {
            Outcome::Recorded(s) => s.timestamp,
            Outcome::Stale => panic!("stale"),
        };
        assert_eq!(timestamp(t.ack(a)), Some(1_700_000_000_123));
        assert_eq!(timestamp(t.ack(b)), None);
    }

    #[test]
    fn a_record_that_never_went_out_stops_the_commit_point_following_the_position() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 10, None, 10, 1);
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(11));
        // A handler failed on 11: the consumer's position is 12 all the same.
        t.begin_failed("t", 0, 11, None, 10);
        t.advance_to_position("t", 0, 12);
        assert_eq!(commit_of(&mut t, "t", 0), Some(11));
        assert_eq!(t.rewind_point("t", 0), Some(11));
        assert_eq!(t.in_flight(), 1, "counted until its partition is released");
        assert_eq!(t.release("t", 0), 1);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn tickets_survive_the_round_trip_through_the_opaque() {
        let t = Ticket {
            slot: 12345,
            seq: (1 << 40) + 7,
        };
        assert_eq!(Ticket::from_opaque(t.to_opaque()), t);
    }

    #[test]
    fn the_commit_point_follows_the_position_past_markers_once_everything_is_acknowledged() {
        let mut t = OffsetTracker::new();
        let a = t.begin("t", 0, 10, None, 10, 1);
        // A transaction marker at 11: the consumer's position is 12.
        t.advance_to_position("t", 0, 12);
        assert_eq!(
            commit_of(&mut t, "t", 0),
            None,
            "10 is not acknowledged yet"
        );
        t.ack(a);
        assert_eq!(commit_of(&mut t, "t", 0), Some(11));
        t.advance_to_position("t", 0, 12);
        assert_eq!(commit_of(&mut t, "t", 0), Some(12));
        // Never backwards, and never for a partition it does not track.
        t.advance_to_position("t", 0, 5);
        assert_eq!(commit_of(&mut t, "t", 0), Some(12));
        t.advance_to_position("u", 0, 7);
        assert_eq!(commit_of(&mut t, "u", 0), None);
    }

    #[test]
    fn a_record_put_back_holds_its_partitions_commit_point_below_it() {
        // Records 10 and 11 acknowledged; 12 returned by the consumer while the producer
        // queue was full and rewound to, not registered: the position (13 until the rewind
        // takes effect) must not carry the commit point past 12.
        let mut t = OffsetTracker::new();
        for offset in [10, 11] {
            let ticket = t.begin("t", 0, offset, None, 1, 1);
            t.ack(ticket);
        }
        t.hold("t", 0, 12);
        t.advance_to_position("t", 0, 13);
        assert_eq!(t.commit_points()[0].offset, 12);
        // It comes again and is registered: the hold is gone, the record itself keeps the
        // commit point until acknowledged, and then positions are followed again.
        let again = t.begin("t", 0, 12, None, 1, 1);
        t.advance_to_position("t", 0, 13);
        assert_eq!(t.commit_points()[0].offset, 12);
        t.ack(again);
        t.advance_to_position("t", 0, 15);
        assert_eq!(t.commit_points()[0].offset, 15);
    }
}
