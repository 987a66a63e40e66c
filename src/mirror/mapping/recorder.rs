//! Segments built from a stream's delivery reports, not written to the store yet.

use super::*;

/// Segments a stream built from its delivery reports and has not written to the store yet.
/// Taken on the stream's thread, behind the stream's lock, for every acknowledged record:
/// no allocation unless a segment starts.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
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
    pub(crate) fn transactional() -> Recorder {
        Recorder {
            target_gaps: true,
            ..Recorder::default()
        }
    }

    /// The target acknowledged the record copied from `source_offset` at `target_offset`.
    pub(crate) fn acked(
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
        if target_offset < 0 {
            // Acknowledged without an offset (librdkafka's RD_KAFKA_OFFSET_INVALID, -1001,
            // after a timeout or DUPLICATE_SEQUENCE_NUMBER): the record landed, where is
            // unknown. No segment holds it, and the open one ends here: no later target
            // offset continues it (it would take this record for a gap or a marker).
            if let Some(i) = found {
                self.last = i;
                self.open[i].target_end = i64::MAX;
            }
            return;
        }
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
    pub(crate) fn take_dirty(&mut self) -> Vec<Segment> {
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
    pub(crate) fn forget(&mut self, topic: &str, partition: i32) {
        let of = |s: &Segment| s.source_topic == topic && s.source_partition == partition;
        self.open.retain(|o| !of(&o.segment));
        self.closed.retain(|s| !of(s));
        self.last = 0;
    }
}
