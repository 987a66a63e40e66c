//! The offset mapping: which target offset each copied source record landed at, kept as
//! segments, and the translation of a consumer group's source offsets through it.
//!
//! Every delivery report names the target offset of one copied record. Per pair of source
//! partition and target partition, consecutive reports that advance both offsets by one extend
//! a [`Segment`]; anything else (a gap in the source offsets, a restart that copies records
//! again, another writer on the target partition) starts a new one. A long run costs a few
//! segments.
//!
//! The mapping lives in a compacted topic of the target cluster ([`store`]); its records
//! ([`StoreRecord`]) are an interface, documented in docs/failover.md. [`recorder`] builds the
//! segments from delivery reports; [`trust`] decides which records of the store the mirror
//! takes; [`ledger`] keeps a stream's writes to the store and what they make committable;
//! [`groups`] translates consumer groups and syncs them to the target.

pub mod groups;
pub mod ledger;
mod recorder;
pub mod store;
mod trust;

pub(crate) use recorder::Recorder;
pub use trust::Trust;
pub(crate) use trust::{Rejection, StoreOffset};

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::Partition;

/// `count` records of `source_topic/source_partition`, from `source_offset` on, were copied in
/// order to target offsets `target_offset .. target_offset + count` of
/// `target_topic/target_partition`: every source offset from `source_offset` to the segment's
/// end except those in `gaps` (source offsets that hold no copied record: transaction markers,
/// aborted, compacted or filtered records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) source_topic: String,
    pub(crate) source_partition: i32,
    pub(crate) target_topic: String,
    pub(crate) target_partition: i32,
    pub(crate) source_offset: i64,
    pub(crate) target_offset: i64,
    pub(crate) count: i64,
    /// `(first source offset, length)` of each gap, ascending, inside the segment.
    pub(crate) gaps: Vec<(i64, i64)>,
    /// `(first target offset, length)` of each run of target offsets inside the segment that
    /// holds no copied record: the transaction markers of an exactly-once mirror.
    pub(crate) target_gaps: Vec<(i64, i64)>,
    /// The first segment of a copy: a mirror began (or took over) the source partition here,
    /// at its committed offset, copying again whatever the previous copy had copied past it.
    pub(crate) copy_start: bool,
}

/// Gaps one segment holds at most; the next one starts a new segment. A transactional source
/// has a gap at every transaction marker: this keeps its store at one record per this many
/// transactions, each record a few kilobytes.
pub(crate) const MAX_GAPS: usize = 500;

impl Segment {
    /// The source offset after the segment's last copied record.
    fn source_end(&self) -> i64 {
        self.source_offset + self.count + self.gaps.iter().map(|g| g.1).sum::<i64>()
    }

    /// One past the target offset of the segment's `k`-th copied record (`k` from 1): where
    /// a group that read the first `k` resumes; the segment's start for 0.
    fn target_after(&self, k: i64) -> i64 {
        if k == 0 {
            return self.target_offset;
        }
        let mut t = self.target_offset + k - 1;
        for &(start, len) in &self.target_gaps {
            if start <= t {
                t += len;
            } else {
                break;
            }
        }
        t + 1
    }

    /// The source offset of this segment's first copied record at or after `offset`, if any.
    fn first_copied_from(&self, offset: i64) -> Option<i64> {
        if self.copied_below(offset) >= self.count {
            return None;
        }
        let mut at = offset.max(self.source_offset);
        // Gaps are ascending and never adjacent: at most one holds `at`, and its end is not
        // in another.
        if let Some(&(start, len)) = self.gaps.iter().find(|g| g.0 <= at && at < g.0 + g.1) {
            at = start + len;
        }
        Some(at)
    }

    /// Copied records of this segment whose source offset is below `offset`.
    fn copied_below(&self, offset: i64) -> i64 {
        if offset <= self.source_offset {
            return 0;
        }
        let skipped: i64 = self
            .gaps
            .iter()
            .map(|&(start, len)| (offset.min(start + len) - start).max(0))
            .sum();
        (offset - self.source_offset - skipped).min(self.count)
    }
}

/// Every source record of `topic/partition` below `next` is on the target, and every segment
/// covering it is in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub next: i64,
    /// The transactional.id that wrote it (exactly-once mode).
    pub(crate) transactional_id: Option<String>,
}

/// A partition's progress held against its source partition's watermarks: where an
/// exactly-once stream starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckedStart {
    /// `next` lies within the watermarks: start there.
    Trusted(i64),
    /// `next` lies below the log start: the `lost` records from it up to `low` are gone from
    /// the source (retention, a deleted and remade topic, or a forged record); start at `low`.
    Gone { low: i64, lost: i64 },
    /// `next` lies past the high watermark: no copy read the source that far (a forged or
    /// stale record, or a topic made again). Trusted, it would skip every record the source
    /// writes up to it; start as if the store had no progress (the source group's committed
    /// offset, else `auto.offset.reset`).
    Ahead { high: i64 },
}

impl Progress {
    /// Where a partition starts from this progress, given its source partition's `low` and
    /// `high` watermarks.
    pub(crate) fn checked_against(&self, low: i64, high: i64) -> CheckedStart {
        if self.next > high {
            CheckedStart::Ahead { high }
        } else if self.next < low {
            CheckedStart::Gone {
                low,
                lost: low - self.next,
            }
        } else {
            CheckedStart::Trusted(self.next)
        }
    }

    /// [`checked_against`](Progress::checked_against) the `watermarks` read from the source,
    /// warned of, the records gone from the source given to `count_lost` (the statistics'
    /// `skipped{reason="retention"}`): the offset to start at, or `None` to start as if the
    /// store had no progress. `Err` (to try again) when the watermarks could not be read.
    pub(crate) fn checked_start<E: std::fmt::Display>(
        &self,
        watermarks: Result<(i64, i64), E>,
        count_lost: impl FnOnce(u64),
    ) -> Result<Option<i64>, String> {
        let (low, high) = watermarks.map_err(|e| {
            format!(
                "cannot read the source watermarks of {}/{} to check its progress in the \
                 offset mapping (next {}): {e}",
                self.topic, self.partition, self.next
            )
        })?;
        Ok(match self.checked_against(low, high) {
            CheckedStart::Trusted(next) => Some(next),
            CheckedStart::Gone { low, lost } => {
                tracing::warn!(
                    "{}/{}: its progress in the offset mapping (next {}) lies below the source's \
                     log start {low}: {lost} records from there are gone from the source and \
                     never mirrored; starting at {low}",
                    self.topic,
                    self.partition,
                    self.next
                );
                count_lost(lost as u64);
                Some(low)
            }
            CheckedStart::Ahead { high } => {
                tracing::warn!(
                    "{}/{}: its progress in the offset mapping (next {}) lies past the source's \
                     high watermark {high}, where no copy can have read: not trusted (starting at \
                     the source group's committed offset, else auto.offset.reset, so that no \
                     record is skipped)",
                    self.topic,
                    self.partition,
                    self.next
                );
                None
            }
        })
    }
}

/// One record of the store topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreRecord {
    Segment(Segment),
    Progress(Progress),
}

/// A store record that cannot be read: its key or value is not what [`StoreRecord`] writes.
#[derive(Debug, thiserror::Error)]
#[error("offset-mapping record with key {key:?} cannot be read: {reason}")]
pub(crate) struct DecodeError {
    pub(crate) key: String,
    pub(crate) reason: String,
}

const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Key {
    v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    segment: Option<SegmentKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress: Option<ProgressKey>,
}

#[derive(Serialize, Deserialize)]
struct SegmentKey {
    source: String,
    sp: i32,
    target: String,
    tp: i32,
    /// The segment's first target offset: unique per target partition, so a copy made
    /// again (a restart) is a new record, and a growing segment rewrites its own.
    to: i64,
}

#[derive(Serialize, Deserialize)]
struct SegmentValue {
    so: i64,
    to: i64,
    n: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gaps: Vec<(i64, i64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tgaps: Vec<(i64, i64)>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    start: bool,
    ms: i64,
}

#[derive(Serialize, Deserialize)]
struct ProgressKey {
    source: String,
    sp: i32,
}

#[derive(Serialize, Deserialize)]
struct ProgressValue {
    next: i64,
    txid: Option<String>,
    ms: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl StoreRecord {
    /// The record's key: JSON, one per segment (by its first target offset) or per source
    /// partition (progress). Compaction keeps the latest value of each.
    pub(crate) fn key(&self) -> Vec<u8> {
        let key = match self {
            StoreRecord::Segment(s) => Key {
                v: FORMAT_VERSION,
                segment: Some(SegmentKey {
                    source: s.source_topic.clone(),
                    sp: s.source_partition,
                    target: s.target_topic.clone(),
                    tp: s.target_partition,
                    to: s.target_offset,
                }),
                progress: None,
            },
            StoreRecord::Progress(p) => Key {
                v: FORMAT_VERSION,
                segment: None,
                progress: Some(ProgressKey {
                    source: p.topic.clone(),
                    sp: p.partition,
                }),
            },
        };
        serde_json::to_vec(&key).expect("a key serialises")
    }

    pub(crate) fn value(&self) -> Vec<u8> {
        let ms = now_ms();
        match self {
            StoreRecord::Segment(s) => serde_json::to_vec(&SegmentValue {
                so: s.source_offset,
                to: s.target_offset,
                n: s.count,
                gaps: s.gaps.clone(),
                tgaps: s.target_gaps.clone(),
                start: s.copy_start,
                ms,
            }),
            StoreRecord::Progress(p) => serde_json::to_vec(&ProgressValue {
                next: p.next,
                txid: p.transactional_id.clone(),
                ms,
            }),
        }
        .expect("a value serialises")
    }

    /// Reads a record of the store topic; `Ok(None)` for a tombstone or a record of a later
    /// format version (skipped: written by a newer mirror).
    pub(crate) fn decode(
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<Option<StoreRecord>, DecodeError> {
        let error = |reason: String| DecodeError {
            key: String::from_utf8_lossy(key).into_owned(),
            reason,
        };
        let k: Key = serde_json::from_slice(key).map_err(|e| error(e.to_string()))?;
        if k.v != FORMAT_VERSION {
            return Ok(None);
        }
        let Some(value) = value else {
            return Ok(None);
        };
        match (k.segment, k.progress) {
            (Some(s), None) => {
                let v: SegmentValue =
                    serde_json::from_slice(value).map_err(|e| error(e.to_string()))?;
                if v.n < 1 || v.to != s.to {
                    return Err(error(format!(
                        "a segment of {} records at target offset {} under the key of {}",
                        v.n, v.to, s.to
                    )));
                }
                let ordered = |gaps: &[(i64, i64)], from: i64| {
                    gaps.iter().all(|g| g.1 > 0 && g.0 > from)
                        && gaps.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0)
                };
                if !ordered(&v.gaps, v.so) || !ordered(&v.tgaps, v.to) {
                    return Err(error(format!(
                        "gaps {:?} or target gaps {:?} out of order",
                        v.gaps, v.tgaps
                    )));
                }
                Ok(Some(StoreRecord::Segment(Segment {
                    source_topic: s.source,
                    source_partition: s.sp,
                    target_topic: s.target,
                    target_partition: s.tp,
                    source_offset: v.so,
                    target_offset: v.to,
                    count: v.n,
                    gaps: v.gaps,
                    target_gaps: v.tgaps,
                    copy_start: v.start,
                })))
            }
            (None, Some(p)) => {
                let v: ProgressValue =
                    serde_json::from_slice(value).map_err(|e| error(e.to_string()))?;
                Ok(Some(StoreRecord::Progress(Progress {
                    topic: p.source,
                    partition: p.sp,
                    next: v.next,
                    transactional_id: v.txid,
                })))
            }
            _ => Err(error(
                "the key names neither one segment nor one progress".to_owned(),
            )),
        }
    }
}

/// Where a source group's offset lands on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Translation {
    /// The group resumes at `offset` of `topic/partition` on the target and reads exactly
    /// the records it had not read on the source (those copied more than once after that
    /// point excepted).
    Exact {
        topic: String,
        partition: i32,
        offset: i64,
    },
    /// The mirror has not copied up to the group's offset yet (it has up to `copied_through`,
    /// exclusive): a target offset now would make the group read records twice.
    Waiting { copied_through: i64 },
    /// The relation cannot be translated (stated why).
    Untranslatable { reason: String },
    /// The store knows nothing of this partition (not mirrored, or mirrored before the store).
    Unknown,
}

/// The store's content in memory: segments per source partition, and progress.
#[derive(Debug, Default)]
pub struct OffsetMap {
    /// What a record read must be to be taken ([`OffsetMap::read`]).
    trust: Trust,
    /// Records read and not taken, by reason.
    rejected: BTreeMap<Rejection, u64>,
    /// Per source partition, per target partition, segments by first target offset.
    segments: HashMap<Partition, HashMap<Partition, BTreeMap<i64, Segment>>>,
    progress: HashMap<Partition, Progress>,
    /// Per target partition, the source partitions that fed it.
    feeders: HashMap<Partition, Vec<Partition>>,
}

impl OffsetMap {
    /// An empty map whose [`read`](OffsetMap::read) takes only what `trust` allows.
    pub(crate) fn trusting(trust: Trust) -> OffsetMap {
        OffsetMap {
            trust,
            ..OffsetMap::default()
        }
    }

    /// Records read and not taken, by reason.
    pub(crate) fn rejected(&self) -> &BTreeMap<Rejection, u64> {
        &self.rejected
    }

    pub(crate) fn apply(&mut self, record: StoreRecord) {
        match record {
            StoreRecord::Segment(s) => {
                let source = (s.source_topic.clone(), s.source_partition);
                let target = (s.target_topic.clone(), s.target_partition);
                let feeders = self.feeders.entry(target.clone()).or_default();
                if !feeders.contains(&source) {
                    feeders.push(source.clone());
                }
                self.segments
                    .entry(source)
                    .or_default()
                    .entry(target)
                    .or_default()
                    .insert(s.target_offset, s);
            }
            StoreRecord::Progress(p) => {
                // The latest record of a partition is its progress, lower or not: the source
                // offset itself moves back (an unclean leader election truncated the
                // partition, the topic was recreated, a reset) and the copy follows it, and
                // a higher `next` kept from before would skip what was written again there.
                // Records are read in the order they were written: one key, one store
                // partition; in exactly-once mode each comes from a committed transaction,
                // one owner's in order, and a new owner's claim is written only after it has
                // fenced the previous owner (or read its release) and read the store to its
                // high watermark, so no older owner's record follows it. Compaction keeps
                // this latest one.
                self.progress.insert((p.topic.clone(), p.partition), p);
            }
        }
    }

    pub fn progress(&self, topic: &str, partition: i32) -> Option<&Progress> {
        self.progress.get(&(topic.to_owned(), partition))
    }

    /// Segments no translation needs any more: wholly below their source partition's log
    /// start (`log_start`; `None`: unknown, nothing is pruned), except the latest such
    /// segment of each pair of partitions, which a group at or past the log start may still
    /// resume after. A group below the log start resumes at the log start on the source too.
    pub(crate) fn prunable(&self, log_start: impl Fn(&str, i32) -> Option<i64>) -> Vec<Segment> {
        let mut out = Vec::new();
        for ((topic, partition), by_target) in &self.segments {
            let Some(start) = log_start(topic, *partition) else {
                continue;
            };
            for segments in by_target.values() {
                let below: Vec<&Segment> = segments
                    .values()
                    .filter(|s| s.source_end() <= start)
                    .collect();
                // Keyed by target offset: the last one below is the latest copy.
                if let Some((_, older)) = below.split_last() {
                    out.extend(older.iter().map(|s| (*s).clone()));
                }
            }
        }
        out
    }

    /// Applies one record of the store topic as read (at `at`): a record, or a tombstone that
    /// removes a segment (pruned below the source's log start). A record that cannot be
    /// decoded, or that [`Trust::check`] refuses, is skipped and counted: one bad record never
    /// stops a read of the store.
    pub(crate) fn read(&mut self, key: &[u8], value: Option<&[u8]>, at: StoreOffset<'_>) {
        if value.is_none() {
            if let Ok(Key {
                v: FORMAT_VERSION,
                segment: Some(k),
                ..
            }) = serde_json::from_slice::<Key>(key)
            {
                self.remove(&Segment {
                    source_topic: k.source,
                    source_partition: k.sp,
                    target_topic: k.target,
                    target_partition: k.tp,
                    source_offset: 0,
                    target_offset: k.to,
                    count: 0,
                    gaps: Vec::new(),
                    target_gaps: Vec::new(),
                    copy_start: false,
                });
            }
            return;
        }
        let checked = match StoreRecord::decode(key, value) {
            Ok(None) => return,
            Ok(Some(record)) => self.trust.check(&record).map(|()| record),
            Err(e) => Err((Rejection::Undecodable, e.to_string())),
        };
        match checked {
            Ok(record) => self.apply(record),
            Err((why, what)) => {
                *self.rejected.entry(why).or_default() += 1;
                self.trust.reject(why, at, &what);
            }
        }
    }

    /// Removes a segment (a tombstone read from the store, or one pruned).
    pub(crate) fn remove(&mut self, segment: &Segment) {
        let source = (segment.source_topic.clone(), segment.source_partition);
        let target = (segment.target_topic.clone(), segment.target_partition);
        if let Some(segments) = self
            .segments
            .get_mut(&source)
            .and_then(|m| m.get_mut(&target))
        {
            segments.remove(&segment.target_offset);
        }
    }

    /// Segments held, over every pair of partitions.
    pub fn segment_count(&self) -> usize {
        self.segments
            .values()
            .flat_map(|by_target| by_target.values())
            .map(BTreeMap::len)
            .sum()
    }

    /// The source partitions the store knows.
    pub(crate) fn source_partitions(&self) -> Vec<Partition> {
        let mut all: Vec<Partition> = self
            .segments
            .keys()
            .chain(self.progress.keys())
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Translates a source group's committed `offset` (the next record it would read) on
    /// `topic/partition`: one answer per target partition that received records from it.
    ///
    /// The target offset is one past the last target record copied from a source offset
    /// below `offset` (over every copy: a restart's copy lies after the earlier one), or the
    /// start of a copy that begins at `offset` (see [`recopy_start`]) if that lies further,
    /// or the first copied record's if none is below. It is exact once the mirror has copied
    /// up to `offset`; before that the group would read again what the mirror copies next.
    pub fn translate(&self, topic: &str, partition: i32, offset: i64) -> Vec<Translation> {
        let source = (topic.to_owned(), partition);
        let Some(by_target) = self.segments.get(&source) else {
            return vec![match self.progress.get(&source) {
                // Progress but no segment: nothing copied (all filtered or gaps).
                Some(_) => Translation::Untranslatable {
                    reason: format!(
                        "{topic}/{partition} has progress in the store but no copied record \
                         to resume at"
                    ),
                },
                None => Translation::Unknown,
            }];
        };
        let copied_through = self.progress.get(&source).map_or(0, |p| p.next);
        let mut targets: Vec<&Partition> = by_target.keys().collect();
        targets.sort();
        targets
            .into_iter()
            .map(|target| {
                let feeders = &self.feeders[target];
                if feeders.len() > 1 {
                    let names: Vec<String> =
                        feeders.iter().map(|(t, p)| format!("{t}/{p}")).collect();
                    return Translation::Untranslatable {
                        reason: format!(
                            "target partition {}/{} holds records of several source \
                             partitions ({}): no single offset there matches a group's \
                             position in one of them (--partitioning hash, or a handler that \
                             merges partitions)",
                            target.0,
                            target.1,
                            names.join(", ")
                        ),
                    };
                }
                if offset > copied_through {
                    return Translation::Waiting { copied_through };
                }
                let segments = &by_target[target];
                let below = segments
                    .values()
                    .filter(|s| s.source_offset < offset)
                    .map(|s| s.target_after(s.copied_below(offset)))
                    .max();
                let first = || {
                    segments
                        .values()
                        .next()
                        .map_or(0, |first| first.target_offset)
                };
                let at = below
                    .unwrap_or_else(first)
                    .max(recopy_start(segments, offset));
                Translation::Exact {
                    topic: target.0.clone(),
                    partition: target.1,
                    offset: at,
                }
            })
            .collect()
    }
}

/// Where the latest copy that starts at or after `offset` begins, if nothing from `offset` up
/// to its first record was copied anywhere and an earlier copy reached its first record (a
/// restart from a commit point): a group at `offset` skips the earlier copy's records from
/// there on, mapped or copied after its last write to the store, which the later copy holds
/// too. 0 when there is none.
///
/// One pass over the segments (and their gaps): nothing is copied anywhere from `offset` up to
/// a copy's first record exactly when that record is the first one copied at or after
/// `offset` over all segments (`first`); whether an earlier copy (a lower target offset)
/// reached it is the greatest source end among the segments before it in target order.
fn recopy_start(segments: &BTreeMap<i64, Segment>, offset: i64) -> i64 {
    let Some(first) = segments
        .values()
        .filter_map(|s| s.first_copied_from(offset))
        .min()
    else {
        return 0;
    };
    let mut reached = i64::MIN;
    let mut found = 0;
    for s in segments.values() {
        if s.copy_start
            && s.source_offset >= offset
            && s.source_offset <= first
            && reached >= s.source_offset
        {
            found = s.target_offset;
        }
        reached = reached.max(s.source_end());
    }
    found
}

#[cfg(test)]
mod tests;
