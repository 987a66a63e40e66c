//! A progress line in the log every `--progress.interval.ms`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::Snapshot;
use crate::mirror::state::{Control, Stats};

/// Logs a progress line every `interval` until the process ends: rates in and out since the
/// last line, lag (unknown until the consumers' first statistics of an assigned partition) and
/// records in flight now, then totals since start (consumed, acknowledged, dropped, filtered,
/// looped).
pub fn log_progress(stats: Arc<Stats>, control: Arc<Control>, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            let mut last = (Instant::now(), 0u64, 0u64, 0u64);
            while !control.stop_requested() {
                std::thread::sleep(interval);
                let now = Instant::now();
                let consumed = Stats::get(&stats.consumed);
                let acknowledged = Stats::get(&stats.acknowledged);
                let seconds = now.duration_since(last.0).as_secs_f64().max(1e-9);
                let snapshot = Snapshot::take(&stats);
                tracing::info!(
                    "progress: in {:.0} records/s, out {:.0} records/s acknowledged, {}, in flight {}; totals: consumed {consumed}, acknowledged {acknowledged}, dropped {}, filtered {}, looped {}",
                    consumed.saturating_sub(last.1) as f64 / seconds,
                    acknowledged.saturating_sub(last.2) as f64 / seconds,
                    snapshot.lag_text(),
                    snapshot.total_in_flight(),
                    Stats::get(&stats.dropped),
                    Stats::get(&stats.filtered),
                    Stats::get(&stats.looped),
                );
                if let Some(throttle) = stats.throttle.get() {
                    tracing::info!(
                        "throttle: {} over all streams (in {:.0} bytes/s, {:.0} records/s); \
                         paused by it {:.1} s in all since start",
                        throttle.describe(),
                        Stats::get(&stats.consumed_bytes).saturating_sub(last.3) as f64 / seconds,
                        consumed.saturating_sub(last.1) as f64 / seconds,
                        Stats::get(&stats.throttled_micros) as f64 / 1e6,
                    );
                }
                last = (
                    now,
                    consumed,
                    acknowledged,
                    Stats::get(&stats.consumed_bytes),
                );
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the progress logger: {e}");
    }
}
