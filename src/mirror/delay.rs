//! Replication delay in seconds, per source partition: how long ago the oldest record that is
//! on the source and not yet acknowledged by the target (copied, in exactly-once mode:
//! committed) was appended there. It comes from the clocks of this process, not from record
//! timestamps: 0 when nothing is behind whatever the records say, and it grows with wall time
//! while the target is cut off.
//!
//! How: at each of the source consumer's statistics (every few seconds), each partition's
//! high watermark is marked with the time it was seen. The target holds everything below the
//! partition's replicated position; the latest mark at or below that position is a moment by
//! which everything then on the source had reached the target, so the oldest record still
//! missing was appended after it. The delay is the time since that mark: an upper bound, by at
//! most one statistics interval. A partition found behind at its first statistics counts from
//! then (a backlog older than that is not known to be older).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Partition;

/// Marks kept per partition while it is behind; beyond this the oldest are thinned (the
/// delay stays an upper bound, less tight).
const MAX_MARKS: usize = 1024;

/// One stream's replication delay, per partition it owns.
#[derive(Debug, Default)]
pub struct ReplicationDelay {
    partitions: Mutex<HashMap<Partition, Marks>>,
}

/// The high watermarks of one partition, each with when it was seen, oldest first.
#[derive(Debug)]
struct Marks {
    /// `(seen, high watermark)`; the first is the latest mark at or below the replicated
    /// position once pruned, or the first statistics of a partition behind from the start.
    marks: VecDeque<(Instant, i64)>,
    /// Everything on the source is on the target (as of the latest statistics).
    caught_up: bool,
}

/// What one partition's latest statistics say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) partition: Partition,
    /// The source partition's high watermark.
    pub(crate) high_watermark: i64,
    /// The next source offset the target does not have yet (`None`: nothing known).
    pub(crate) replicated_to: Option<i64>,
}

impl ReplicationDelay {
    /// Takes `now`'s statistics of every partition the stream owns; partitions not named
    /// (released) are forgotten.
    pub(crate) fn observe(&self, now: Instant, observations: &[Observation]) {
        let mut partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        partitions.retain(|p, _| observations.iter().any(|o| &o.partition == p));
        for o in observations {
            let marks = partitions
                .entry(o.partition.clone())
                .or_insert_with(|| Marks {
                    marks: VecDeque::new(),
                    caught_up: false,
                });
            marks.observe(now, o.high_watermark, o.replicated_to);
        }
    }

    /// The delay of each owned partition at `now`.
    pub fn delays(&self, now: Instant) -> Vec<(Partition, Duration)> {
        let partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        partitions
            .iter()
            .map(|(p, marks)| (p.clone(), marks.delay(now)))
            .collect()
    }
}

impl Marks {
    fn observe(&mut self, now: Instant, high: i64, replicated: Option<i64>) {
        let only = self.marks.len() == 1;
        match self.marks.back_mut() {
            // The only mark, and the target known not to have everything below it: the first
            // statistics of a partition behind from the start, the moment its delay counts
            // from, stays; the same end seen again is a second mark, the one kept tight.
            Some((_, last)) if *last == high && only && replicated.is_some_and(|r| r < high) => {
                self.marks.push_back((now, high))
            }
            // The same high watermark seen again: everything below it was there by the
            // later time too, which makes the tighter mark.
            Some((seen, last)) if *last == high => *seen = now,
            _ => self.marks.push_back((now, high)),
        }
        if let Some(replicated) = replicated {
            self.caught_up = replicated >= high;
            while self.marks.len() > 1 && self.marks[1].1 <= replicated {
                self.marks.pop_front();
            }
        } else {
            self.caught_up = false;
        }
        if self.marks.len() > MAX_MARKS {
            // Thin the oldest: the delay may then be measured from an earlier mark.
            self.marks.remove(1);
        }
    }

    fn delay(&self, now: Instant) -> Duration {
        if self.caught_up {
            return Duration::ZERO;
        }
        // The mark by which everything then on the source was on the target, or, for a
        // partition behind since its first statistics, that first mark.
        self.marks.front().map_or(Duration::ZERO, |(seen, _)| {
            now.saturating_duration_since(*seen)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(high: i64, replicated: i64) -> Vec<Observation> {
        vec![Observation {
            partition: ("orders".to_owned(), 0),
            high_watermark: high,
            replicated_to: Some(replicated),
        }]
    }

    /// A partition's statistics when what the target has is not known (nothing consumed by
    /// this process).
    fn seen_unknown(high: i64) -> Vec<Observation> {
        vec![Observation {
            partition: ("orders".to_owned(), 0),
            high_watermark: high,
            replicated_to: None,
        }]
    }

    fn delay_of(d: &ReplicationDelay, now: Instant) -> Duration {
        d.delays(now)[0].1
    }

    #[test]
    fn an_idle_source_that_is_all_copied_has_no_delay() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        for i in 0..10 {
            d.observe(t0 + Duration::from_secs(5 * i), &seen(1000, 1000));
        }
        assert_eq!(delay_of(&d, t0 + Duration::from_secs(60)), Duration::ZERO);
    }

    #[test]
    fn a_cut_off_target_makes_the_delay_grow_with_wall_time() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        d.observe(t0, &seen(1000, 1000));
        // Records keep arriving on the source; none reaches the target after 1000.
        for i in 1..=12 {
            d.observe(
                t0 + Duration::from_secs(5 * i),
                &seen(1000 + 100 * i as i64, 1000),
            );
        }
        let now = t0 + Duration::from_secs(60);
        assert_eq!(delay_of(&d, now), Duration::from_secs(60));
        assert_eq!(
            delay_of(&d, now + Duration::from_secs(30)),
            Duration::from_secs(90)
        );
    }

    #[test]
    fn a_mirror_that_keeps_up_is_at_most_one_interval_behind() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        // Each statistics: 100 new records, the target a few records short of the end.
        for i in 0..20 {
            let high = 100 * (i + 1);
            d.observe(
                t0 + Duration::from_secs(5 * i as u64),
                &seen(high, high - 3),
            );
        }
        let now = t0 + Duration::from_secs(5 * 19);
        assert!(
            delay_of(&d, now) <= Duration::from_secs(5),
            "{:?}",
            delay_of(&d, now)
        );
    }

    #[test]
    fn record_timestamps_play_no_part() {
        // The same offsets seen at the same instants give the same delay, whatever the
        // records' timestamps were: the observations do not carry them.
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        d.observe(t0, &seen(10, 10));
        d.observe(t0 + Duration::from_secs(5), &seen(20, 10));
        assert_eq!(
            delay_of(&d, t0 + Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn catching_up_brings_the_delay_back_to_zero() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        d.observe(t0, &seen(1000, 1000));
        d.observe(t0 + Duration::from_secs(30), &seen(2000, 1000));
        d.observe(t0 + Duration::from_secs(35), &seen(2000, 2000));
        assert_eq!(delay_of(&d, t0 + Duration::from_secs(35)), Duration::ZERO);
    }

    #[test]
    fn a_partition_behind_from_its_first_statistics_counts_from_then_while_its_end_stays() {
        // The target cut off before any statistics saw the partition caught up, and no new
        // record on the source: the same high watermark seen again does not move the moment
        // from which it counts.
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        for i in 0..=12 {
            d.observe(t0 + Duration::from_secs(5 * i), &seen(500, 250));
        }
        assert_eq!(
            delay_of(&d, t0 + Duration::from_secs(60)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_partition_behind_from_its_first_statistics_counts_from_its_last_end_once_copied() {
        // Behind from the first statistics, then the target has everything up to that end in
        // the interval in which one more record arrives: the delay counts from the last time
        // that end was seen, not from the first.
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        for i in 0..12 {
            d.observe(t0 + Duration::from_secs(5 * i), &seen(500, 250));
        }
        d.observe(t0 + Duration::from_secs(60), &seen(501, 500));
        assert_eq!(
            delay_of(&d, t0 + Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_partition_with_nothing_known_replicated_and_no_new_record_is_at_most_one_interval_behind()
    {
        // Nothing consumed by this process yet (an idle partition after a restart): what the
        // target has is not known, and no record arrives to be behind on.
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        for i in 0..=12 {
            d.observe(t0 + Duration::from_secs(5 * i), &seen_unknown(1000));
        }
        assert_eq!(
            delay_of(&d, t0 + Duration::from_secs(64)),
            Duration::from_secs(4)
        );
    }

    #[test]
    fn marks_stay_bounded_while_what_the_target_has_is_not_known() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        for i in 0..5000 {
            d.observe(t0 + Duration::from_secs(i), &seen_unknown(i as i64));
        }
        let len = d.partitions.lock().unwrap()[&("orders".to_owned(), 0)]
            .marks
            .len();
        assert!(len <= MAX_MARKS, "{len}");
    }

    #[test]
    fn a_partition_released_is_forgotten() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        d.observe(t0, &seen(1000, 10));
        d.observe(t0 + Duration::from_secs(5), &[]);
        assert!(d.delays(t0 + Duration::from_secs(5)).is_empty());
    }

    #[test]
    fn marks_stay_bounded_through_a_long_outage() {
        let d = ReplicationDelay::default();
        let t0 = Instant::now();
        d.observe(t0, &seen(0, 0));
        for i in 1..5000 {
            d.observe(t0 + Duration::from_secs(i), &seen(i as i64, 0));
        }
        let len = d.partitions.lock().unwrap()[&("orders".to_owned(), 0)]
            .marks
            .len();
        assert!(len <= MAX_MARKS + 1, "{len}");
        assert_eq!(
            delay_of(&d, t0 + Duration::from_secs(5000)),
            Duration::from_secs(5000)
        );
    }
}
