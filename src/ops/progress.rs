//! A progress line in the log every `--progress.interval.ms`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::Snapshot;
use crate::mirror::state::{Control, Stats};

/// Logs a progress line every `interval` until the process ends: rates in and out since the
/// last line, lag, records in flight, dropped and filtered totals.
pub fn log_progress(stats: Arc<Stats>, control: Arc<Control>, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            let mut last = (Instant::now(), 0u64, 0u64);
            while !control.stop_requested() {
                std::thread::sleep(interval);
                let now = Instant::now();
                let consumed = Stats::get(&stats.consumed);
                let acknowledged = Stats::get(&stats.acknowledged);
                let seconds = now.duration_since(last.0).as_secs_f64().max(1e-9);
                let snapshot = Snapshot::take(&stats);
                tracing::info!(
                    "progress: in {:.0} records/s, out {:.0} records/s acknowledged, lag {}, in flight {}, dropped {}, filtered {}",
                    (consumed - last.1) as f64 / seconds,
                    (acknowledged - last.2) as f64 / seconds,
                    snapshot.total_lag(),
                    snapshot.total_in_flight(),
                    Stats::get(&stats.dropped),
                    Stats::get(&stats.filtered),
                );
                last = (now, consumed, acknowledged);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the progress logger: {e}");
    }
}
