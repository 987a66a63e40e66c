//! What the streams share with each other and with the operators' side: the stop request and
//! the first fatal error ([`Control`]), the counters and what the data path records
//! ([`Stats`], [`Recorded`]), each stream's own state ([`StreamShared`]) and the list of them
//! ([`Streams`]), handed to metrics, health and systemd notification, which only read it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use super::offsets::OffsetTracker;
use crate::mirror::Partition;

/// Stop requests and fatal errors. Signals, streams and delivery callbacks write here;
/// every stream loop reads it on each turn.
#[derive(Debug, Default)]
pub struct Control {
    stop: AtomicBool,
    fatal: Mutex<Option<Fatal>>,
}

#[derive(Debug)]
struct Fatal {
    message: String,
    /// Only a consequence of another failure (a record failed because the producer had
    /// failed already): the failure that names its cause takes its place.
    consequence: bool,
}

impl Control {
    pub fn new() -> Control {
        Control::default()
    }

    /// Asks every stream to stop consuming, flush, commit and return (a clean shutdown).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Records a fatal error (the first one wins, over consequences only) and asks every
    /// stream to stop.
    pub fn fail(&self, message: String) {
        self.record(message, false);
    }

    /// Records a failure that is only the consequence of another (librdkafka fails every
    /// record queued behind a fatal producer error with `Fatal`, and their reports can come
    /// before the report of the record the broker refused): it stands only until a failure
    /// that names the cause comes, which takes its place. Asks every stream to stop.
    pub fn fail_as_consequence(&self, message: String) {
        self.record(message, true);
    }

    fn record(&self, message: String, consequence: bool) {
        let mut fatal = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
        let replaces = match fatal.as_ref() {
            None => true,
            Some(first) => first.consequence && !consequence,
        };
        if replaces {
            tracing::error!("{message}");
            *fatal = Some(Fatal {
                message,
                consequence,
            });
        }
        drop(fatal);
        self.request_stop();
    }

    pub fn failure(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|f| f.message.clone())
    }
}

/// Counters since start, summed over streams.
#[derive(Debug, Default)]
pub struct Stats {
    /// Whether the replication delay was above `--max.replication.delay.ms` when readiness
    /// was last asked (its crossings are logged once each).
    pub delay_over_limit: AtomicBool,
    pub consumed: AtomicU64,
    pub consumed_bytes: AtomicU64,
    pub produced: AtomicU64,
    pub acknowledged: AtomicU64,
    pub dropped: AtomicU64,
    /// Source records a message handler turned into no record.
    pub filtered: AtomicU64,
    /// Source records not mirrored because they came from the target (`--loop.prevention`).
    pub looped: AtomicU64,
    pub commits: AtomicU64,
    pub rebalances: AtomicU64,
    /// Histograms and error counts.
    pub recorded: Recorded,
    /// Every stream of this process, for the operators' side to read.
    pub streams: Streams,
    /// `--sync.group.offsets`.
    pub group_sync: SyncStats,
    /// `--sync.topic.configs`: target topic configs set since start.
    pub topic_configs_synced: AtomicU64,
    /// `--throttle.bytes.per.second`, `--throttle.records.per.second`: the buckets every
    /// stream charges.
    pub throttle: std::sync::OnceLock<super::throttle::Throttle>,
    /// Microseconds streams spent paused by the throttle, summed over streams.
    pub throttled_micros: AtomicU64,
    /// `--heartbeats.interval.ms`: heartbeats the source acknowledged.
    pub heartbeats_written: AtomicU64,
}

/// `--sync.group.offsets`: what its rounds did, for metrics.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Groups whose offsets a round committed on the target (counted per round).
    pub groups_synced: AtomicU64,
    /// Partitions waiting for the mirror to copy up to their group's offset (last round).
    pub partitions_waiting: AtomicU64,
    /// Records the mirror has still to copy before those offsets (last round).
    pub translation_lag: AtomicU64,
    /// Translated offsets not committed: outside the target partition's watermarks.
    pub offsets_refused: AtomicU64,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// What the data path records beyond plain counters. Metrics serve these; nothing here knows
/// about serving.
#[derive(Debug)]
pub struct Recorded {
    pub started: Instant,
    /// Set when metrics are served: only then is the latency observed per record.
    pub latency_enabled: AtomicBool,
    /// Acknowledgement time minus the source record's timestamp, in seconds.
    pub latency: Histogram,
    /// Duration of synchronous commits (before a release and at shutdown), in seconds.
    pub commit_seconds: Histogram,
    /// Records the target refused for good, by librdkafka error code.
    pub send_errors: Family<Vec<(String, String)>, Counter>,
    /// Offset commits the source cluster refused, by librdkafka error code.
    pub commit_failures: Family<Vec<(String, String)>, Counter>,
    /// Commits failed since the last one that succeeded, over all streams.
    pub commit_failures_in_a_row: AtomicU64,
    /// Source records never mirrored because the source no longer had them, by reason
    /// (`retention`: deleted before they were read).
    pub skipped: Family<Vec<(String, String)>, Counter>,
    /// Topic configs the target refused to set (`--sync.topic.configs`), by target topic and
    /// key.
    pub config_sync_failures: Family<Vec<(String, String)>, Counter>,
    /// Offset-mapping records not taken on a read of the store, by reason (see
    /// `mapping::Rejection`).
    pub store_rejected: Family<Vec<(String, String)>, Counter>,
    /// Source records the message handler refused and `--on.handler.error` let the mirror go
    /// past, by source topic and action (`skip`, `dead-letter`).
    pub handler_refused: Family<Vec<(String, String)>, Counter>,
    /// Source topics found deleted and created again (a new topic id), by source topic.
    pub source_recreated: Family<Vec<(String, String)>, Counter>,
    /// The latest id each recreated source topic was counted with: several streams (or one
    /// stream's later checks) seeing the same new id count it once.
    recreated_ids: Mutex<HashMap<String, String>>,
}

impl Default for Recorded {
    fn default() -> Recorded {
        Recorded {
            started: Instant::now(),
            latency_enabled: AtomicBool::new(false),
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            send_errors: Family::default(),
            commit_failures: Family::default(),
            commit_failures_in_a_row: AtomicU64::new(0),
            skipped: Family::default(),
            config_sync_failures: Family::default(),
            store_rejected: Family::default(),
            handler_refused: Family::default(),
            source_recreated: Family::default(),
            recreated_ids: Mutex::default(),
        }
    }
}

impl Recorded {
    pub fn count_send_error(&self, code: String) {
        self.send_errors
            .get_or_create(&vec![("code".to_owned(), code)])
            .inc();
    }

    pub fn count_skipped(&self, reason: &str, records: u64) {
        self.skipped
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc_by(records);
    }

    pub fn count_handler_refused(&self, topic: &str, action: &str) {
        self.handler_refused
            .get_or_create(&vec![
                ("topic".to_owned(), topic.to_owned()),
                ("action".to_owned(), action.to_owned()),
            ])
            .inc();
    }

    /// Counts source topic `topic` as created again with id `id`, once per id whichever
    /// stream sees it first; returns whether this call counted it.
    pub fn count_recreated(&self, topic: &str, id: &str) -> bool {
        let mut ids = self.recreated_ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.get(topic).is_some_and(|known| known == id) {
            return false;
        }
        ids.insert(topic.to_owned(), id.to_owned());
        self.source_recreated
            .get_or_create(&vec![("topic".to_owned(), topic.to_owned())])
            .inc();
        true
    }

    pub fn commit_succeeded(&self) {
        self.commit_failures_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Counts a failed commit; returns how many failed in a row.
    pub fn commit_failed(&self, code: String) -> u64 {
        self.commit_failures
            .get_or_create(&vec![("code".to_owned(), code)])
            .inc();
        self.commit_failures_in_a_row
            .fetch_add(1, Ordering::Relaxed)
            + 1
    }

    /// Observes the replication latency of a record whose source timestamp is `timestamp_ms`.
    pub fn observe_latency(&self, timestamp_ms: i64) {
        if !self.latency_enabled.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.latency
            .observe((now - timestamp_ms).max(0) as f64 / 1000.0);
    }

    /// Milliseconds since the process started.
    pub fn millis_since_start(&self, now: Instant) -> u64 {
        now.duration_since(self.started).as_millis() as u64
    }
}

/// The streams of this process, registered as they start. Readers get the live ones.
#[derive(Debug, Default)]
pub struct Streams(Mutex<Vec<Weak<StreamShared>>>);

impl Streams {
    pub fn register(&self, stream: &Arc<StreamShared>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(stream));
    }

    /// How many live streams have had their first assignment (possibly empty).
    pub fn with_assignment(&self) -> usize {
        self.live()
            .iter()
            .filter(|s| s.assigned.load(Ordering::Relaxed))
            .count()
    }

    /// Whether a live stream of this process has `partition` assigned now.
    pub fn own(&self, partition: &Partition) -> bool {
        self.live().iter().any(|s| {
            s.owned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(partition)
        })
    }

    pub fn live(&self) -> Vec<Arc<StreamShared>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// The lag of one assigned source partition, from the consumer's latest statistics.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    /// Records between the partition's position and its high watermark.
    pub records: i64,
}

/// Whether one stream's clients reach a cluster, for readiness. In reach until told
/// otherwise: the stream is made once both clusters answered at start.
#[derive(Debug, Default)]
pub struct Reach {
    /// Client statistics in a row that said the cluster is out of reach.
    misses: AtomicU64,
}

impl Reach {
    /// Statistics in a row that must say "out of reach" before the cluster is: one alone can
    /// fall in a healthy connection's short windows (a re-authentication, a first try moving
    /// to the broker's next address, a coordinator being looked up).
    const MISSES: u64 = 2;

    /// Whether the cluster is in reach.
    pub fn up(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < Self::MISSES
    }

    /// One client statistics' word on it.
    pub fn observe(&self, in_reach: bool) {
        if in_reach {
            self.misses.store(0, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the stream itself found, taken at once (not statistics: a request answered, or
    /// every try failing).
    pub fn set(&self, up: bool) {
        let misses = if up { 0 } else { Self::MISSES };
        self.misses.store(misses, Ordering::Relaxed);
    }
}

/// State one stream shares between its loop, its producer's delivery callbacks, its
/// consumer's rebalance callbacks (all on the stream's own thread) and the operators' side
/// (metrics scrapes, progress lines and systemd notification, on threads of their own).
/// The tracker's lock is taken on the stream's thread for every record and delivery report,
/// and by those readers at most every few seconds.
#[derive(Debug)]
pub struct StreamShared {
    pub stream: usize,
    pub tracker: Mutex<OffsetTracker>,
    pub control: Arc<Control>,
    pub stats: Arc<Stats>,
    pub abort_on_send_failure: bool,
    /// Set by the first assignment (possibly empty) this stream receives.
    pub assigned: AtomicBool,
    /// Whether the producers' statistics show the target cluster in reach.
    pub target_up: Reach,
    /// Whether the consumer's statistics show the source cluster in reach.
    pub source_up: Reach,
    /// When the stream's loop last turned (ms since start), for the systemd watchdog.
    pub last_turn: AtomicU64,
    /// The source partitions assigned to this stream now (for the heartbeats: the instance
    /// owning the heartbeats topic's partition 0 writes them).
    pub owned: Mutex<std::collections::HashSet<Partition>>,
    /// Per assigned source partition, the consumer's lag in its latest statistics.
    pub lag: Mutex<Vec<PartitionLag>>,
    /// The replication delay of the partitions it owns, from the same statistics.
    pub delay: super::delay::ReplicationDelay,
    /// Set when the target refused a record for good in a delivery report (abort mode):
    /// records produced after it may still be queued, and must not land after it.
    pub failed_with_records_behind: AtomicBool,
    /// `--on.handler.error dead-letter`: the dead-letter records produced and not yet
    /// reported. A refused dead-letter record has records behind it only in its own topic:
    /// the mirrored topics' records around it are not ordered against it (it never goes
    /// there), so they are delivered and committed, not purged with it.
    pub dead_letters_in_flight: AtomicUsize,
    /// Whether the target refused a dead-letter record: one produced after that must not
    /// land after it (see [`Self::failed_with_records_behind`]).
    pub dead_letter_refused: AtomicBool,
    /// Per source partition owned now, the offset its last successful synchronous commit
    /// committed (the shutdown commit, or a commit before a release): a release that finds
    /// the same commit point has nothing to commit.
    pub committed_sync: Mutex<std::collections::HashMap<Partition, i64>>,
    /// `--on.handler.error skip|dead-letter`: the log lines of refused records, at most one
    /// a second per stream (a poison stream of records must not flood the log).
    pub refusals_logged: Mutex<LogLimit>,
    /// `--create.topics`: the target topic of each source topic (`--target.topic`). One of
    /// these found missing while running (deleted) is created again, and the source
    /// partitions whose records it refused are mirrored again. (A handler's other output
    /// topics are not made: a missing one stays a send failure.)
    pub recreatable: std::sync::OnceLock<crate::settings::routing::TopicTemplate>,
    /// `--on.handler.error dead-letter`: the dead-letter topic, whose records the offset
    /// mapping leaves out (they are no copies a consumer group could resume from).
    pub dead_letter: std::sync::OnceLock<String>,
    /// The target topics found missing, with the source partition of each refused record;
    /// the stream's loop creates them again and rewinds those partitions.
    pub missing_targets: Mutex<Vec<MissingTarget>>,
    /// The offset mapping's side of this stream (`--offset.mapping true`): segments built
    /// from delivery reports, and the commit points the store holds.
    pub mapping: Option<super::mapping::ledger::StreamMapping>,
}

/// A record refused because its target topic does not exist (any more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingTarget {
    pub target_topic: String,
    pub source_topic: String,
    pub partition: i32,
}

/// At most one log line per [`LogLimit::EVERY`], with the count of those held back.
#[derive(Debug, Default)]
pub struct LogLimit {
    last: Option<Instant>,
    held_back: u64,
}

impl LogLimit {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    /// `Some(n)` when a line may be logged now (`n` lines were held back since the last),
    /// `None` when this one is held back.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < Self::EVERY => {
                self.held_back += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

impl StreamShared {
    pub fn new(
        stream: usize,
        control: Arc<Control>,
        stats: Arc<Stats>,
        abort_on_send_failure: bool,
        mapping: Option<super::mapping::ledger::StreamMapping>,
    ) -> Arc<StreamShared> {
        let shared = Arc::new(StreamShared {
            stream,
            tracker: Mutex::new(OffsetTracker::new()),
            control,
            stats,
            abort_on_send_failure,
            assigned: false.into(),
            target_up: Reach::default(),
            source_up: Reach::default(),
            last_turn: Default::default(),
            owned: Default::default(),
            lag: Default::default(),
            delay: Default::default(),
            failed_with_records_behind: false.into(),
            dead_letters_in_flight: Default::default(),
            dead_letter_refused: false.into(),
            committed_sync: Default::default(),
            refusals_logged: Default::default(),
            recreatable: std::sync::OnceLock::new(),
            dead_letter: std::sync::OnceLock::new(),
            missing_targets: Mutex::default(),
            mapping,
        });
        // A stream made while the process runs (an exactly-once stream's new incarnation)
        // counts as turning from now on, not since the process started: the watchdog waits
        // for its first turn as for the first streams'.
        shared.turned(Instant::now());
        shared.stats.streams.register(&shared);
        shared
    }

    pub fn tracker(&self) -> MutexGuard<'_, OffsetTracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A rebalance assigned `partitions` to the stream (with the eager protocol: all of them).
    pub fn took(&self, partitions: &[Partition]) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.extend(partitions.iter().cloned());
    }

    /// After a release: `partitions` leave the tracker, the record of their last synchronous
    /// commit and the offset mapping.
    pub fn forget(&self, partitions: &[Partition]) {
        let mut tracker = self.tracker();
        let mut committed = self
            .committed_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in partitions {
            tracker.release(topic, *partition);
            committed.remove(&(topic.clone(), *partition));
        }
        if let Some(mapping) = &self.mapping {
            mapping.forget(partitions);
        }
    }

    /// A rebalance took `partitions` from the stream.
    pub fn released(&self, partitions: &[Partition]) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        for p in partitions {
            owned.remove(p);
        }
    }

    /// Records that the stream's loop turned at `now`.
    pub fn turned(&self, now: Instant) {
        let ms = self.stats.recorded.millis_since_start(now);
        self.last_turn.store(ms, Ordering::Relaxed);
    }
}

/// Lets every stream of this process make its final commit before any of them leaves the
/// group: a stream leaving starts a rebalance, and the broker refuses commits from the others
/// until it completes.
#[derive(Debug)]
pub struct ShutdownGate {
    remaining: Mutex<usize>,
    all_done: std::sync::Condvar,
}

impl ShutdownGate {
    pub fn new(streams: usize) -> ShutdownGate {
        ShutdownGate {
            remaining: Mutex::new(streams),
            all_done: std::sync::Condvar::new(),
        }
    }

    /// This stream has made its final commit (or will make none).
    pub fn arrive(&self) {
        let mut remaining = self.remaining.lock().unwrap_or_else(|e| e.into_inner());
        *remaining = remaining.saturating_sub(1);
        if *remaining == 0 {
            self.all_done.notify_all();
        }
    }

    /// Waits until every stream has arrived, at most `timeout`.
    pub fn wait(&self, timeout: std::time::Duration) {
        let remaining = self.remaining.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .all_done
            .wait_timeout_while(remaining, timeout, |r| *r > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_wins() {
        let control = Control::new();
        control.fail("first".into());
        control.fail("second".into());
        assert_eq!(control.failure().as_deref(), Some("first"));
        assert!(control.stop_requested());
    }

    #[test]
    fn a_failure_naming_its_cause_takes_the_place_of_a_consequence() {
        let control = Control::new();
        control.fail_as_consequence("offset 158: Fatal".into());
        assert!(control.stop_requested());
        control.fail_as_consequence("offset 159: Fatal".into());
        assert_eq!(control.failure().as_deref(), Some("offset 158: Fatal"));
        control.fail("offset 0: topic authorization failed".into());
        control.fail("offset 7: another".into());
        assert_eq!(
            control.failure().as_deref(),
            Some("offset 0: topic authorization failed")
        );
        control.fail_as_consequence("offset 160: Fatal".into());
        assert_eq!(
            control.failure().as_deref(),
            Some("offset 0: topic authorization failed")
        );
    }

    #[test]
    fn a_cluster_is_out_of_reach_after_two_statistics_in_a_row_say_so() {
        let reach = Reach::default();
        assert!(reach.up(), "in reach from the start");
        reach.observe(false);
        assert!(
            reach.up(),
            "one statistics alone can fall in a short window"
        );
        reach.observe(true);
        reach.observe(false);
        assert!(reach.up(), "the count starts again after one in reach");
        reach.observe(false);
        assert!(!reach.up());
        reach.observe(true);
        assert!(reach.up());
    }

    #[test]
    fn what_the_stream_finds_itself_counts_at_once() {
        let reach = Reach::default();
        reach.set(false);
        assert!(!reach.up());
        reach.set(true);
        assert!(reach.up());
    }

    #[test]
    fn a_log_limit_lets_one_line_a_second_through_and_counts_the_rest() {
        let start = Instant::now();
        let mut limit = LogLimit::default();
        assert_eq!(limit.allow(start), Some(0));
        let soon = start + std::time::Duration::from_millis(100);
        assert_eq!(limit.allow(soon), None);
        assert_eq!(limit.allow(soon), None);
        assert_eq!(
            limit.allow(start + LogLimit::EVERY),
            Some(2),
            "two held back"
        );
        assert_eq!(limit.allow(start + LogLimit::EVERY * 3), Some(0));
    }
}
