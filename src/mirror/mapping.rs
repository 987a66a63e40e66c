//! The offset mapping: which target offset each copied source record landed at, kept as
//! segments, and the translation of a consumer group's source offsets through it.
//!
//! Every delivery report names the target offset of one copied record. Per pair of source
//! partition and target partition, consecutive reports that advance both offsets by one extend
//! a [`Segment`]; anything else (a gap in the source offsets, a restart that copies records
//! again, another writer on the target partition) starts a new one. A long run costs a few
//! segments.
//!
//! The mapping lives in a compacted topic of the target cluster (see [`super::store`]); its
//! records ([`StoreRecord`]) are an interface, documented in the README ("Failover").

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// `count` records of `source_topic/source_partition`, from `source_offset` on, were copied in
/// order to target offsets `target_offset .. target_offset + count` of
/// `target_topic/target_partition`: every source offset from `source_offset` to the segment's
/// end except those in `gaps` (source offsets that hold no copied record: transaction markers,
/// aborted, compacted or filtered records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub source_topic: String,
    pub source_partition: i32,
    pub target_topic: String,
    pub target_partition: i32,
    pub source_offset: i64,
    pub target_offset: i64,
    pub count: i64,
    /// `(first source offset, length)` of each gap, ascending, inside the segment.
    pub gaps: Vec<(i64, i64)>,
    /// `(first target offset, length)` of each run of target offsets inside the segment that
    /// holds no copied record: the transaction markers of an exactly-once mirror.
    pub target_gaps: Vec<(i64, i64)>,
    /// The first segment of a copy: a mirror began (or took over) the source partition here,
    /// at its committed offset, copying again whatever the previous copy had copied past it.
    pub copy_start: bool,
}

/// Gaps one segment holds at most; the next one starts a new segment. A transactional source
/// has a gap at every transaction marker: this keeps its store at one record per this many
/// transactions, each record a few kilobytes.
pub const MAX_GAPS: usize = 500;

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
    pub topic: String,
    pub partition: i32,
    pub next: i64,
    /// The transactional.id that wrote it (exactly-once mode).
    pub transactional_id: Option<String>,
}

/// One record of the store topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreRecord {
    Segment(Segment),
    Progress(Progress),
}

/// A store record that cannot be read: its key or value is not what [`StoreRecord`] writes.
#[derive(Debug, thiserror::Error)]
#[error("offset-mapping record with key {key:?} cannot be read: {reason}")]
pub struct DecodeError {
    pub key: String,
    pub reason: String,
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
    pub fn key(&self) -> Vec<u8> {
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

    pub fn value(&self) -> Vec<u8> {
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
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Option<StoreRecord>, DecodeError> {
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

type Partition = (String, i32);

/// Segments a stream built from its delivery reports and has not written to the store yet.
/// Taken on the stream's thread, behind the stream's lock, for every acknowledged record:
/// no allocation unless a segment starts.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Per pair of source and target partition: the segment being extended.
    open: Vec<OpenSegment>,
    /// Segments that ended and have not been written since they last grew.
    closed: Vec<Segment>,
    /// The index in `open` of the previous report's pair: reports come in runs of one
    /// partition (a produced batch).
    last: usize,
    /// Whether a jump in target offsets continues the segment (exactly-once: the target
    /// partition's transaction markers) rather than starting a new one (another writer).
    target_gaps: bool,
}

#[derive(Debug)]
struct OpenSegment {
    segment: Segment,
    dirty: bool,
    /// The segment's source end, kept rather than summed over its gaps per record.
    end: i64,
    /// The target offset after its last copied record.
    target_end: i64,
}

impl OpenSegment {
    fn is(&self, source: (&str, i32), target: (&str, i32)) -> bool {
        let s = &self.segment;
        s.source_partition == source.1
            && s.target_partition == target.1
            && s.source_topic == source.0
            && s.target_topic == target.0
    }
}

impl Recorder {
    /// The recorder of an exactly-once stream: its own transaction markers lie between the
    /// records of one transaction and the next on every target partition, and do not break
    /// a segment (they are listed as target gaps).
    pub fn transactional() -> Recorder {
        Recorder {
            target_gaps: true,
            ..Recorder::default()
        }
    }

    /// The target acknowledged the record copied from `source_offset` at `target_offset`.
    pub fn acked(
        &mut self,
        source: (&str, i32),
        source_offset: i64,
        target: (&str, i32),
        target_offset: i64,
    ) {
        let found = match self.open.get(self.last) {
            Some(o) if o.is(source, target) => Some(self.last),
            _ => self.open.iter().position(|o| o.is(source, target)),
        };
        if let Some(i) = found {
            self.last = i;
            let open = &mut self.open[i];
            let s = &mut open.segment;
            let (end, target_end) = (open.end, open.target_end);
            let source_fits =
                source_offset == end || (source_offset > end && s.gaps.len() < MAX_GAPS);
            let target_fits = target_offset == target_end
                || (self.target_gaps
                    && target_offset > target_end
                    && s.target_gaps.len() < MAX_GAPS);
            if source_fits && target_fits {
                if source_offset > end {
                    // Offsets the source holds no copied record at (a transaction marker).
                    s.gaps.push((end, source_offset - end));
                }
                if target_offset > target_end {
                    // This mirror's own transaction markers on the target.
                    s.target_gaps.push((target_end, target_offset - target_end));
                }
                s.count += 1;
                open.dirty = true;
                open.end = source_offset + 1;
                open.target_end = target_offset + 1;
                return;
            }
            if source_offset == end - 1 && target_offset >= target_end {
                // A second target record of the same source record (a handler's fan-out
                // into one partition): the first one is where a group resumes.
                return;
            }
        }
        let fresh = OpenSegment {
            segment: Segment {
                source_topic: source.0.to_owned(),
                source_partition: source.1,
                target_topic: target.0.to_owned(),
                target_partition: target.1,
                source_offset,
                target_offset,
                count: 1,
                gaps: Vec::new(),
                target_gaps: Vec::new(),
                copy_start: found.is_none(),
            },
            dirty: true,
            end: source_offset + 1,
            target_end: target_offset + 1,
        };
        match found {
            Some(i) => {
                let ended = std::mem::replace(&mut self.open[i], fresh);
                if ended.dirty {
                    self.closed.push(ended.segment);
                }
            }
            None => {
                self.open.push(fresh);
                self.last = self.open.len() - 1;
            }
        }
    }

    /// The segments written since the last call (each in its latest extent).
    pub fn take_dirty(&mut self) -> Vec<Segment> {
        let mut out = std::mem::take(&mut self.closed);
        for open in &mut self.open {
            if open.dirty {
                out.push(open.segment.clone());
                open.dirty = false;
            }
        }
        out
    }

    /// The partition was released: a later owner starts segments of its own.
    pub fn forget(&mut self, topic: &str, partition: i32) {
        let of = |s: &Segment| s.source_topic == topic && s.source_partition == partition;
        self.open.retain(|o| !of(&o.segment));
        self.closed.retain(|s| !of(s));
        self.last = 0;
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
    /// Per source partition, per target partition, segments by first target offset.
    segments: HashMap<Partition, HashMap<Partition, BTreeMap<i64, Segment>>>,
    progress: HashMap<Partition, Progress>,
    /// Per target partition, the source partitions that fed it.
    feeders: HashMap<Partition, Vec<Partition>>,
}

impl OffsetMap {
    pub fn apply(&mut self, record: StoreRecord) {
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
                let key = (p.topic.clone(), p.partition);
                let newer = self.progress.get(&key).is_none_or(|old| p.next >= old.next);
                // A late writer (a zombie) never takes progress back; the transactional id
                // of the latest owner is kept either way.
                if newer {
                    self.progress.insert(key, p);
                } else if let Some(old) = self.progress.get_mut(&key) {
                    old.transactional_id = p.transactional_id;
                }
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
    pub fn prunable(&self, log_start: impl Fn(&str, i32) -> Option<i64>) -> Vec<Segment> {
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

    /// Applies one record of the store topic as read: a record, or a tombstone that removes
    /// a segment (pruned below the source's log start).
    pub fn read(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), DecodeError> {
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
            return Ok(());
        }
        if let Some(record) = StoreRecord::decode(key, value)? {
            self.apply(record);
        }
        Ok(())
    }

    /// Removes a segment (a tombstone read from the store, or one pruned).
    pub fn remove(&mut self, segment: &Segment) {
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
    pub fn source_partitions(&self) -> Vec<(String, i32)> {
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
fn recopy_start(segments: &BTreeMap<i64, Segment>, offset: i64) -> i64 {
    segments
        .values()
        .filter(|s| s.copy_start && s.source_offset >= offset)
        .filter(|s| {
            segments
                .values()
                .all(|r| r.copied_below(s.source_offset) == r.copied_below(offset))
        })
        .filter(|s| {
            segments
                .values()
                .any(|r| r.target_offset < s.target_offset && r.source_end() >= s.source_offset)
        })
        .map(|s| s.target_offset)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(so: i64, to: i64, n: i64) -> StoreRecord {
        StoreRecord::Segment(Segment {
            source_topic: "orders".into(),
            source_partition: 0,
            target_topic: "orders".into(),
            target_partition: 0,
            source_offset: so,
            target_offset: to,
            count: n,
            gaps: Vec::new(),
            target_gaps: Vec::new(),
            copy_start: false,
        })
    }

    /// A segment that begins a copy (a mirror started on the partition there).
    fn start(so: i64, to: i64, n: i64) -> StoreRecord {
        match seg(so, to, n) {
            StoreRecord::Segment(s) => StoreRecord::Segment(Segment {
                copy_start: true,
                ..s
            }),
            other => other,
        }
    }

    fn progress(next: i64) -> StoreRecord {
        StoreRecord::Progress(Progress {
            topic: "orders".into(),
            partition: 0,
            next,
            transactional_id: None,
        })
    }

    fn exact(offset: i64) -> Vec<Translation> {
        vec![Translation::Exact {
            topic: "orders".into(),
            partition: 0,
            offset,
        }]
    }

    fn map(records: Vec<StoreRecord>) -> OffsetMap {
        let mut m = OffsetMap::default();
        for r in records {
            m.apply(r);
        }
        m
    }

    #[test]
    fn records_round_trip_through_their_json_key_and_value() {
        for r in [seg(10, 7, 3), progress(42)] {
            let back = StoreRecord::decode(&r.key(), Some(&r.value())).unwrap();
            assert_eq!(back, Some(r));
        }
        assert_eq!(
            StoreRecord::decode(&seg(1, 2, 3).key(), None).unwrap(),
            None
        );
        let e = StoreRecord::decode(b"not json", Some(b"{}")).unwrap_err();
        assert!(e.to_string().contains("not json"), "{e}");
    }

    #[test]
    fn a_run_is_one_segment_that_absorbs_source_gaps_and_a_target_jump_starts_another() {
        let mut r = Recorder::default();
        for i in 0..5 {
            r.acked(("orders", 0), 100 + i, ("orders", 0), i);
        }
        // Source offsets 105 and 106 are an aborted record and a transaction marker.
        r.acked(("orders", 0), 107, ("orders", 0), 5);
        let written = r.take_dirty();
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(
            (written[0].source_offset, written[0].count, &written[0].gaps),
            (100, 6, &vec![(105, 2)])
        );
        assert!(r.take_dirty().is_empty(), "nothing new");
        // Another writer appended to the target partition: offset 6 is not ours.
        r.acked(("orders", 0), 108, ("orders", 0), 7);
        let jumped = r.take_dirty();
        assert_eq!(jumped.len(), 1);
        assert_eq!((jumped[0].source_offset, jumped[0].target_offset), (108, 7));
    }

    #[test]
    fn an_exactly_once_stream_s_own_transaction_markers_continue_a_segment() {
        let mut r = Recorder::transactional();
        // Three transactions of 3 records each: a commit marker on the target after each.
        for (i, s) in (0..9).enumerate() {
            let t = s + (i as i64 / 3);
            r.acked(("orders", 0), s, ("orders", 0), t);
        }
        let written = r.take_dirty();
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0].target_gaps, vec![(3, 1), (7, 1)]);
        let back = StoreRecord::decode(
            &StoreRecord::Segment(written[0].clone()).key(),
            Some(&StoreRecord::Segment(written[0].clone()).value()),
        )
        .unwrap();
        let m = map(vec![back.unwrap(), progress(9)]);
        // Target: 0 1 2 [marker] 4 5 6 [marker] 8 9 10.
        assert_eq!(m.translate("orders", 0, 0), exact(0));
        assert_eq!(m.translate("orders", 0, 3), exact(3));
        assert_eq!(m.translate("orders", 0, 4), exact(5));
        assert_eq!(m.translate("orders", 0, 6), exact(7));
        assert_eq!(m.translate("orders", 0, 9), exact(11));
        // An at-least-once stream's target jump is another writer: a new segment.
        let mut plain = Recorder::default();
        plain.acked(("orders", 0), 0, ("orders", 0), 0);
        plain.acked(("orders", 0), 1, ("orders", 0), 2);
        assert_eq!(plain.take_dirty().len(), 2);
    }

    #[test]
    fn a_segment_holds_at_most_max_gaps_gaps() {
        let mut r = Recorder::default();
        // A transactional writer: one record, then a marker, over and over.
        for i in 0..=MAX_GAPS as i64 + 1 {
            r.acked(("orders", 0), 2 * i, ("orders", 0), i);
        }
        let written = r.take_dirty();
        assert_eq!(written.len(), 2, "{written:?}");
        assert_eq!(written[0].gaps.len(), MAX_GAPS);
        assert!(written[1].gaps.len() <= 1);
    }

    #[test]
    fn records_with_gaps_round_trip_and_translate_around_them() {
        let gapped = StoreRecord::Segment(Segment {
            gaps: vec![(10, 1), (15, 3)],
            ..match seg(0, 50, 16) {
                StoreRecord::Segment(s) => s,
                _ => unreachable!(),
            }
        });
        let back = StoreRecord::decode(&gapped.key(), Some(&gapped.value())).unwrap();
        assert_eq!(back.as_ref(), Some(&gapped));
        // Source 0..9 -> 50..59, 10 a marker, 11..14 -> 60..63, 15..17 aborted, 18..19 -> 64..65.
        let m = map(vec![gapped, progress(20)]);
        assert_eq!(m.translate("orders", 0, 5), exact(55));
        assert_eq!(m.translate("orders", 0, 10), exact(60));
        assert_eq!(m.translate("orders", 0, 11), exact(60));
        assert_eq!(m.translate("orders", 0, 16), exact(64));
        assert_eq!(m.translate("orders", 0, 19), exact(65));
        assert_eq!(m.translate("orders", 0, 20), exact(66));
    }

    #[test]
    fn a_group_inside_a_run_resumes_at_the_matching_target_offset() {
        let m = map(vec![seg(100, 0, 50), progress(150)]);
        assert_eq!(m.translate("orders", 0, 120), exact(20));
        assert_eq!(m.translate("orders", 0, 150), exact(50));
        // Before anything was copied: the first copied record.
        assert_eq!(m.translate("orders", 0, 3), exact(0));
    }

    #[test]
    fn a_group_in_a_gap_resumes_at_the_first_record_copied_after_it() {
        let m = map(vec![seg(0, 0, 10), seg(12, 10, 5), progress(17)]);
        assert_eq!(m.translate("orders", 0, 10), exact(10));
        assert_eq!(m.translate("orders", 0, 11), exact(10));
        assert_eq!(m.translate("orders", 0, 13), exact(11));
    }

    #[test]
    fn records_copied_again_after_a_restart_are_skipped_up_to_the_group() {
        // Copied 0..1000 to 0..1000, killed after committing 800, copied 800.. again at 1000.
        let m = map(vec![
            start(0, 0, 1000),
            start(800, 1000, 700),
            progress(1500),
        ]);
        assert_eq!(m.translate("orders", 0, 900), exact(1100));
        assert_eq!(m.translate("orders", 0, 1200), exact(1400));
        // Before the copy made again: the target holds 800..999 twice after this point.
        assert_eq!(m.translate("orders", 0, 700), exact(700));
        // At the restart's commit point: the earlier copy's records from there are skipped.
        assert_eq!(m.translate("orders", 0, 800), exact(1000));
    }

    #[test]
    fn a_copy_killed_before_its_first_commit_is_skipped_from_the_start() {
        // Copied 0..500 to 0..500, killed before any commit, copied from 0 again at 500.
        let m = map(vec![start(0, 0, 500), start(0, 500, 800), progress(800)]);
        assert_eq!(m.translate("orders", 0, 0), exact(500));
        assert_eq!(m.translate("orders", 0, 100), exact(600));
    }

    #[test]
    fn what_a_killed_copy_wrote_after_its_last_mapping_is_skipped_at_the_restart_point() {
        // Mapped and committed up to source 800; records 800..899 reached target 800..899
        // before the kill, unmapped; the restart copied from 800 again at 900.
        let m = map(vec![start(0, 0, 800), start(800, 900, 300), progress(1100)]);
        assert_eq!(m.translate("orders", 0, 800), exact(900));
        assert_eq!(m.translate("orders", 0, 799), exact(799));
    }

    #[test]
    fn pruning_below_the_log_start_keeps_every_translation_from_there_on() {
        // Four copies (restarts), the source's log start now at 2,500.
        let records = vec![
            start(0, 0, 1000),
            start(900, 1000, 1200),
            start(2000, 2200, 400),
            start(2300, 2600, 1000),
            progress(3300),
        ];
        let full = map(records.clone());
        let pruned_segments = full.prunable(|_, _| Some(2500));
        // 0..1000 and 900..2100 go; 2000..2400, the latest wholly below, stays.
        let starts: Vec<i64> = pruned_segments.iter().map(|s| s.target_offset).collect();
        assert_eq!(starts, vec![0, 1000]);
        let mut pruned = map(records);
        for s in &pruned_segments {
            // As the store's readers see it: a tombstone under the segment's key.
            pruned
                .read(&StoreRecord::Segment(s.clone()).key(), None)
                .unwrap();
        }
        for offset in 2500..=3300 {
            assert_eq!(
                pruned.translate("orders", 0, offset),
                full.translate("orders", 0, offset),
                "offset {offset}"
            );
        }
        assert!(full.prunable(|_, _| None).is_empty());
    }

    #[test]
    fn another_writer_between_two_runs_is_not_skipped() {
        // Source 0..10 at 0..10, three records of another writer, source 10..20 at 13..23.
        let m = map(vec![seg(0, 0, 10), seg(10, 13, 10), progress(20)]);
        assert_eq!(m.translate("orders", 0, 10), exact(10));
    }

    #[test]
    fn a_group_ahead_of_the_mirror_waits() {
        let m = map(vec![seg(0, 0, 10), progress(10)]);
        assert_eq!(
            m.translate("orders", 0, 11),
            vec![Translation::Waiting { copied_through: 10 }]
        );
        assert_eq!(m.translate("orders", 1, 0), vec![Translation::Unknown]);
    }

    #[test]
    fn a_target_partition_fed_by_two_source_partitions_is_not_translated() {
        let mut m = map(vec![seg(0, 0, 10), progress(10)]);
        m.apply(StoreRecord::Segment(Segment {
            source_partition: 1,
            target_offset: 10,
            ..match seg(0, 10, 3) {
                StoreRecord::Segment(s) => s,
                _ => unreachable!(),
            }
        }));
        let t = m.translate("orders", 0, 5);
        assert!(
            matches!(&t[0], Translation::Untranslatable { reason } if reason.contains("orders/1")),
            "{t:?}"
        );
    }

    #[test]
    fn progress_never_moves_back() {
        let m = map(vec![seg(0, 0, 10), progress(10), progress(4)]);
        assert_eq!(m.progress("orders", 0).unwrap().next, 10);
    }
}
