//! What every stream shares: the stop request, the first fatal error, and the counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

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
    /// Histograms, error counts and the streams' own state, for `--metrics.addr`.
    pub telemetry: crate::metrics::Telemetry,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
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
