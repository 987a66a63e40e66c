//! What the streams share with each other and with the operators' side: the stop request and
//! the first fatal error ([`Control`]), the counters and what the data path records
//! ([`Stats`], [`Recorded`]), each stream's own state ([`StreamShared`]) and the list of them
//! ([`Streams`]), handed to metrics, health and systemd notification, which only read it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use super::offsets::OffsetTracker;

/// Stop requests and fatal errors. Signals, streams and delivery callbacks write here;
/// every stream loop reads it on each turn.
#[derive(Debug, Default)]
pub struct Control {
    stop: AtomicBool,
    fatal: Mutex<Option<String>>,
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

    /// Records a fatal error (the first one wins) and asks every stream to stop.
    pub fn fail(&self, message: String) {
        let mut fatal = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
        if fatal.is_none() {
            tracing::error!("{message}");
            *fatal = Some(message);
        }
        drop(fatal);
        self.request_stop();
    }

    pub fn failure(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Counters since start, summed over streams.
#[derive(Debug, Default)]
pub struct Stats {
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
    /// Whether the producer's latest statistics showed a target broker connected.
    pub target_up: AtomicBool,
    /// Whether the consumer's latest statistics showed a source broker connected.
    pub source_up: AtomicBool,
    /// When the stream's loop last turned (ms since start), for the systemd watchdog.
    pub last_turn: AtomicU64,
    /// Per assigned source partition, the consumer's lag in its latest statistics.
    pub lag: Mutex<Vec<PartitionLag>>,
    /// Set when the target refused a record for good in a delivery report (abort mode):
    /// records produced after it may still be queued, and must not land after it.
    pub failed_with_records_behind: AtomicBool,
    /// Per source partition owned now, the offset its last successful synchronous commit
    /// committed (the shutdown commit, or a commit before a release): a release that finds
    /// the same commit point has nothing to commit.
    pub committed_sync: Mutex<std::collections::HashMap<(String, i32), i64>>,
    /// `--create.topics`: the target topic of each source topic (`--target.topic`). One of
    /// these found missing while running (deleted) is created again, and the source
    /// partitions whose records it refused are mirrored again. (A handler's other output
    /// topics are not made: a missing one stays a send failure.)
    pub recreatable: std::sync::OnceLock<crate::settings::routing::TopicTemplate>,
    /// The target topics found missing, with the source partition of each refused record;
    /// the stream's loop creates them again and rewinds those partitions.
    pub missing_targets: Mutex<Vec<MissingTarget>>,
    /// The offset mapping's side of this stream (`--offset.mapping true`): segments built
    /// from delivery reports, and the commit points the store holds.
    pub mapping: Option<super::ledger::StreamMapping>,
}

/// A record refused because its target topic does not exist (any more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingTarget {
    pub target_topic: String,
    pub source_topic: String,
    pub partition: i32,
}

impl StreamShared {
    pub fn new(
        stream: usize,
        control: Arc<Control>,
        stats: Arc<Stats>,
        abort_on_send_failure: bool,
        mapping: Option<super::ledger::StreamMapping>,
    ) -> Arc<StreamShared> {
        let shared = Arc::new(StreamShared {
            stream,
            tracker: Mutex::new(OffsetTracker::new()),
            control,
            stats,
            abort_on_send_failure,
            assigned: false.into(),
            target_up: true.into(),
            source_up: true.into(),
            last_turn: Default::default(),
            lag: Default::default(),
            failed_with_records_behind: false.into(),
            committed_sync: Default::default(),
            recreatable: std::sync::OnceLock::new(),
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
