//! Process-wide rate limits, `--throttle.bytes.per.second` and
//! `--throttle.records.per.second`: a token bucket for each limit given, shared by every
//! stream, charged with each record as it is handed to the producer (its bytes, and 1; in the
//! exactly-once mode too, as it joins the open transaction), or, by the batch engine, with
//! each batch as it is readied for the target (its bytes as sent, and its record count) at
//! once.
//!
//! Each bucket holds at most one second of tokens (the burst) and refills continuously at its
//! rate. [`Throttle::charge_batch`] always takes what records cost from every bucket, going
//! into debt if it must (a record is never held back or refused), and says how long until the
//! deeper debt is paid: the stream pauses its partitions (or its fetches) and keeps polling
//! (rebalances, delivery reports, commits go on) for that long. Every stream pays the same
//! shared debt, so the streams together keep to the rate; a stream that comes after a large
//! charge waits behind it. With both limits, whichever is the tighter for the records at hand
//! holds the rate.
//!
//! [`Hold`] is one stream's side of it, the same in every engine: until when its debt holds
//! it back, and since when it has been held (`mirror_throttled_seconds_total`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least debt a stream pauses for; a smaller one is carried by the next records (the
/// bucket forgets none of it): a pause and the fetch after it cost more than that.
pub(crate) const MIN_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug)]
struct Tokens {
    /// May be negative: a reservation or an oversized grant not yet paid for.
    tokens: f64,
    last: Instant,
}

/// One token bucket of `rate` tokens (bytes or records) per second.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: Mutex<Tokens>,
}

impl Bucket {
    /// `per_second` is at least 1; the bucket starts full.
    fn new(per_second: u64, now: Instant) -> Bucket {
        let rate = per_second.max(1) as f64;
        Bucket {
            rate,
            burst: rate,
            tokens: Mutex::new(Tokens {
                tokens: rate,
                last: now,
            }),
        }
    }

    /// Takes `cost` tokens at once: how long until the bucket is out of debt again (zero if
    /// it had them).
    fn charge(&self, cost: u64, now: Instant) -> Duration {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(t.last).as_secs_f64();
        t.tokens = (t.tokens + elapsed * self.rate).min(self.burst);
        t.last = now;
        t.tokens -= cost as f64;
        Duration::from_secs_f64((-t.tokens / self.rate).max(0.0))
    }
}

/// The limits of one process, shared by reference (`OnceLock<Throttle>` in the stats).
#[derive(Debug)]
pub struct Throttle {
    bytes: Option<Bucket>,
    records: Option<Bucket>,
}

impl Throttle {
    /// Either limit, or both; `None` when neither is given. Each is at least 1.
    pub(crate) fn new(
        bytes_per_second: Option<u64>,
        records_per_second: Option<u64>,
    ) -> Option<Throttle> {
        Throttle::starting_at(bytes_per_second, records_per_second, Instant::now())
    }

    fn starting_at(
        bytes_per_second: Option<u64>,
        records_per_second: Option<u64>,
        now: Instant,
    ) -> Option<Throttle> {
        if bytes_per_second.is_none() && records_per_second.is_none() {
            return None;
        }
        Some(Throttle {
            bytes: bytes_per_second.map(|r| Bucket::new(r, now)),
            records: records_per_second.map(|r| Bucket::new(r, now)),
        })
    }

    /// Charges one record of `bytes` at `now`: how long until every bucket is out of debt
    /// again (zero if they all had the tokens).
    #[cfg(test)]
    fn charge_at(&self, bytes: u64, now: Instant) -> Duration {
        self.charge_batch_at(bytes, 1, now)
    }

    /// Charges `records` records of `bytes` in all (one record batch), at once: the same
    /// debt as charging them one by one.
    pub(crate) fn charge_batch(&self, bytes: u64, records: u64) -> Duration {
        self.charge_batch_at(bytes, records, Instant::now())
    }

    fn charge_batch_at(&self, bytes: u64, records: u64, now: Instant) -> Duration {
        let by_bytes = self.bytes.as_ref().map(|b| b.charge(bytes, now));
        let by_records = self.records.as_ref().map(|b| b.charge(records, now));
        by_bytes.max(by_records).unwrap_or_default()
    }

    /// The byte limit, in bytes per second.
    pub fn bytes_per_second(&self) -> Option<u64> {
        self.bytes.as_ref().map(|b| b.rate as u64)
    }

    /// The record limit, in records per second.
    pub fn records_per_second(&self) -> Option<u64> {
        self.records.as_ref().map(|b| b.rate as u64)
    }

    /// How the limits read in a log line: `1000 bytes/s and 50 records/s`.
    pub fn describe(&self) -> String {
        let limits: Vec<String> = [
            self.bytes_per_second().map(|r| format!("{r} bytes/s")),
            self.records_per_second().map(|r| format!("{r} records/s")),
        ]
        .into_iter()
        .flatten()
        .collect();
        limits.join(" and ")
    }
}

/// One stream's hold by the throttle: until when the debt of its last charge holds it back
/// (its partitions paused or its fetches not sent), and since when it has been held.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    until: Cell<Option<Instant>>,
    since: Cell<Option<Instant>>,
}

impl Hold {
    /// Charges `records` records of `bytes` in all to `throttle`: a debt of [`MIN_PAUSE`] or
    /// more holds the stream from now until it is paid; a smaller one is carried by the next
    /// charges.
    pub(crate) fn charge(&self, throttle: &Throttle, bytes: u64, records: u64) {
        let wait = throttle.charge_batch(bytes, records);
        if wait >= MIN_PAUSE {
            let until = Instant::now() + wait;
            if self.until.get().is_none_or(|u| until > u) {
                self.until.set(Some(until));
            }
        }
    }

    /// Whether the stream is held at `now`. The first turn held starts the time throttled;
    /// the first turn past the debt ends the hold (the time throttled runs on until
    /// [`Hold::resumed`]).
    pub(crate) fn holds(&self, now: Instant) -> bool {
        match self.until.get() {
            Some(until) if now < until => {
                if self.since.get().is_none() {
                    self.since.set(Some(now));
                }
                true
            }
            Some(_) => {
                self.until.set(None);
                false
            }
            None => false,
        }
    }

    /// How long the stream's poll may wait: until the debt is paid, if it is held, and at
    /// most `idle`.
    pub(crate) fn poll_wait(&self, idle: Duration) -> Duration {
        self.until.get().map_or(idle, |until| {
            until
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), idle)
        })
    }

    /// The stream takes data again (its first record or fetch after a hold, or its
    /// partitions resumed): the time since the hold began is added to `throttled`, once.
    /// Nothing while it is still held.
    pub(crate) fn resumed(&self, throttled: &AtomicU64) {
        if self.until.get().is_some() {
            return;
        }
        if let Some(since) = self.since.take() {
            // A counter of `mirror::state`'s, added to here without importing that module
            // (it holds the throttle: an import back would be a circle).
            throttled.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    fn bytes(per_second: u64, now: Instant) -> Throttle {
        Throttle::starting_at(Some(per_second), None, now).unwrap()
    }

    #[test]
    fn a_debt_holds_the_stream_until_it_is_paid_and_the_time_held_is_counted_once() {
        let t = Throttle::new(Some(1000), None).unwrap();
        let hold = Hold::default();
        // Within the burst: no hold.
        hold.charge(&t, 1000, 1);
        assert!(!hold.holds(Instant::now()));
        // Half a second of debt.
        hold.charge(&t, 500, 1);
        let now = Instant::now();
        assert!(hold.holds(now));
        assert!(hold.poll_wait(Duration::from_secs(5)) <= Duration::from_millis(500));
        let throttled = AtomicU64::new(0);
        hold.resumed(&throttled);
        assert_eq!(
            throttled.load(Ordering::Relaxed),
            0,
            "still held: nothing counted yet"
        );
        assert!(!hold.holds(now + Duration::from_secs(1)));
        hold.resumed(&throttled);
        let counted = throttled.load(Ordering::Relaxed);
        assert!(counted > 0);
        hold.resumed(&throttled);
        assert_eq!(throttled.load(Ordering::Relaxed), counted, "counted once");
    }

    #[test]
    fn a_debt_below_the_least_pause_is_carried_not_held() {
        let t = Throttle::new(Some(1000), None).unwrap();
        let hold = Hold::default();
        // 5 ms of debt: below MIN_PAUSE.
        hold.charge(&t, 1005, 1);
        assert!(!hold.holds(Instant::now()));
        // Carried: the next charge pays for it too.
        hold.charge(&t, 10, 1);
        assert!(hold.holds(Instant::now()));
    }

    fn records(per_second: u64, now: Instant) -> Throttle {
        Throttle::starting_at(None, Some(per_second), now).unwrap()
    }

    #[test]
    fn a_full_bucket_takes_a_second_of_bytes_without_a_wait() {
        let t0 = Instant::now();
        let t = bytes(1000, t0);
        assert_eq!(t.charge_at(600, t0), Duration::ZERO);
        assert_eq!(t.charge_at(400, t0), Duration::ZERO);
        assert!((secs(t.charge_at(100, t0)) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn tokens_refill_at_the_rate_and_never_beyond_the_burst() {
        let t0 = Instant::now();
        let t = bytes(1000, t0);
        assert_eq!(t.charge_at(1000, t0), Duration::ZERO);
        let later = t0 + Duration::from_millis(250);
        assert_eq!(t.charge_at(250, later), Duration::ZERO);
        assert!(t.charge_at(1, later) > Duration::ZERO);
        // An hour idle fills the bucket once, not 3,600 times.
        let idle = later + Duration::from_secs(3600);
        assert_eq!(t.charge_at(999, idle), Duration::ZERO);
        assert!((secs(t.charge_at(1001, idle)) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_record_larger_than_the_burst_is_taken_and_leaves_a_debt() {
        let t0 = Instant::now();
        let t = bytes(1000, t0);
        // 4,000 bytes of debt: four seconds until it is paid.
        assert!((secs(t.charge_at(5000, t0)) - 4.0).abs() < 1e-6);
        // Half of it paid two seconds later.
        let later = t0 + Duration::from_secs(2);
        assert!((secs(t.charge_at(0, later)) - 2.0).abs() < 1e-6);
    }

    /// Four streams charging `t` from `t0` over 10 simulated seconds, each charge of `bytes`
    /// (one record) and each stream waiting out the debt its charge reports before the next.
    /// Returns what they charged, counted `unit` a charge.
    fn four_streams_for_ten_seconds(t: &Throttle, t0: Instant, bytes: u64, unit: u64) -> u64 {
        let mut ready = [t0; 4];
        let mut charged = 0u64;
        let end = t0 + Duration::from_secs(10);
        loop {
            let (stream, at) = ready.iter().enumerate().min_by_key(|(_, at)| **at).unwrap();
            let at = *at;
            if at >= end {
                return charged;
            }
            let wait = t.charge_at(bytes, at);
            charged += unit;
            ready[stream] = at + wait.max(Duration::from_micros(1));
        }
    }

    #[test]
    fn streams_charging_one_bucket_keep_to_the_rate_together() {
        // Four streams each charge 1,000-byte records at 20,000 bytes/s, each waiting out the
        // debt its charge reports before the next: over simulated time, the bytes charged
        // stay within the rate (plus the one-second burst).
        let t0 = Instant::now();
        let charged = four_streams_for_ten_seconds(&bytes(20_000, t0), t0, 1000, 1000);
        let limit = 20_000 * 10 + 20_000;
        assert!(charged <= limit + 4 * 1000, "{charged} bytes in 10 s");
        assert!(charged >= limit - 4 * 1000, "{charged} bytes in 10 s");
    }

    #[test]
    fn a_batch_charges_what_its_records_charge_one_by_one() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(300);
        let (whole, single) = (
            Throttle::starting_at(Some(10_000), Some(100), t0).unwrap(),
            Throttle::starting_at(Some(10_000), Some(100), t0).unwrap(),
        );
        // 250 records of 100 bytes: 25,000 bytes (1.5 s of byte debt), 250 records (1.5 s of
        // record debt); 300 ms later, 0.3 s of each is paid.
        let batch = whole.charge_batch_at(25_000, 250, t0);
        let mut each = Duration::ZERO;
        for _ in 0..250 {
            each = single.charge_at(100, t0);
        }
        assert!((secs(batch) - 1.5).abs() < 1e-6, "{batch:?}");
        assert!(
            (secs(batch) - secs(each)).abs() < 1e-6,
            "{batch:?} {each:?}"
        );
        assert!((secs(whole.charge_batch_at(0, 0, later)) - 1.2).abs() < 1e-6);
        // The record limit alone: 600 records in two batches of any size.
        let records = records(200, t0);
        assert_eq!(records.charge_batch_at(1 << 30, 200, t0), Duration::ZERO);
        assert!((secs(records.charge_batch_at(1, 400, t0)) - 2.0).abs() < 1e-6);
    }

    #[test]
    fn no_limit_makes_no_throttle() {
        assert!(Throttle::new(None, None).is_none());
    }

    #[test]
    fn a_record_limit_counts_records_whatever_their_size() {
        let t0 = Instant::now();
        let t = records(100, t0);
        // A full bucket: 100 records of any size at once, then a hundredth of a second each.
        for _ in 0..100 {
            assert_eq!(t.charge_at(1_000_000, t0), Duration::ZERO);
        }
        assert!((secs(t.charge_at(1, t0)) - 0.01).abs() < 1e-6);
        assert!((secs(t.charge_at(1, t0)) - 0.02).abs() < 1e-6);
        // A quarter of a second later, 25 tokens: the 2 in debt paid, 23 records free.
        let later = t0 + Duration::from_millis(250);
        for _ in 0..23 {
            assert_eq!(t.charge_at(5, later), Duration::ZERO);
        }
        assert!(t.charge_at(5, later) > Duration::ZERO);
    }

    #[test]
    fn streams_charging_one_record_bucket_keep_to_the_rate_together() {
        // As for bytes: four streams at 500 records/s over 10 simulated seconds take the
        // rate's records plus the one-second burst, within one record per stream.
        let t0 = Instant::now();
        let charged = four_streams_for_ten_seconds(&records(500, t0), t0, 100, 1);
        let limit = 500 * 10 + 500;
        assert!(charged.abs_diff(limit) <= 4, "{charged} records in 10 s");
    }

    #[test]
    fn with_both_limits_the_tighter_one_holds() {
        let t0 = Instant::now();
        let both = Throttle::starting_at(Some(10_000), Some(100), t0).unwrap();
        // Small records: 100 records of 10 bytes is 1,000 bytes: the record limit holds.
        for _ in 0..100 {
            assert_eq!(both.charge_at(10, t0), Duration::ZERO);
        }
        assert!((secs(both.charge_at(10, t0)) - 0.01).abs() < 1e-6);
        // Large records a second later: 5,000 bytes each, the byte limit holds (half a
        // second for the second record's debt), though records are still under theirs.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(both.charge_at(5_000, later), Duration::ZERO);
        assert_eq!(both.charge_at(5_000, later), Duration::ZERO);
        assert!((secs(both.charge_at(5_000, later)) - 0.5).abs() < 1e-6);
        assert_eq!(both.describe(), "10000 bytes/s and 100 records/s");
    }
}
