//! systemd's notification protocol (`Type=notify`): READY=1 once the mirror runs with both
//! clusters reachable (see [`readiness`]; an assignment is not needed), STATUS= lines, STOPPING=1 on shutdown, and WATCHDOG=1
//! while every stream keeps turning. Without `NOTIFY_SOCKET` (not under systemd) nothing is
//! sent.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::health::{assignment, readiness};
use super::metrics::Snapshot;
use crate::mirror::state::{Control, Stats};

/// How often STATUS= reports lag and records in flight while ready.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// The socket systemd gave us, if any.
pub struct Notifier {
    socket: UnixDatagram,
    path: String,
}

impl Notifier {
    /// From `NOTIFY_SOCKET` (a path, or `@name` for Linux's abstract namespace).
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var("NOTIFY_SOCKET").ok()?;
        let socket = UnixDatagram::unbound().ok()?;
        // Never wait for a reader: a notification that does not fit is dropped (logged at
        // debug), so a stuck socket cannot hold up a stop (STOPPING=1 is sent from the
        // signal thread).
        socket.set_nonblocking(true).ok()?;
        Some(Notifier { socket, path })
    }

    pub fn send(&self, message: &str) {
        let result = if let Some(name) = self.path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .and_then(|addr| self.socket.send_to_addr(message.as_bytes(), &addr))
        } else {
            self.socket.send_to(message.as_bytes(), &self.path)
        };
        if let Err(e) = result {
            tracing::debug!("cannot notify systemd at {}: {e}", self.path);
        }
    }
}

/// Tells systemd at once that the service is stopping (from the signal handler, before the
/// flush and commit start).
pub fn stopping() {
    if let Some(notifier) = Notifier::from_env() {
        notifier.send("STOPPING=1\nSTATUS=stopping: flushing and committing");
    }
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`), if it is meant for us.
fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.trim() != std::process::id().to_string() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Tells systemd how the mirror is doing, from a thread of its own, until the process ends.
pub fn start(
    stats: Arc<Stats>,
    control: Arc<Control>,
    streams: usize,
    max_delay: Option<Duration>,
) {
    let Some(notifier) = Notifier::from_env() else {
        return;
    };
    let watchdog = watchdog_interval();
    // Feed the watchdog twice per interval, as systemd recommends.
    let tick = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let spawned = std::thread::Builder::new()
        .name("systemd-notify".into())
        .spawn(move || {
            let mut ready = false;
            let mut last_status = Instant::now();
            loop {
                if control.stop_requested() {
                    // A signal sent STOPPING=1 already; after a fatal error the exit says it.
                    return;
                }
                match readiness(&stats, &control, streams, max_delay) {
                    Ok(()) if !ready => {
                        ready = true;
                        notifier.send(&format!(
                            "READY=1\nSTATUS=mirroring; {}",
                            assignment(&stats, streams)
                        ));
                    }
                    Ok(()) if last_status.elapsed() >= STATUS_INTERVAL => {
                        let s = Snapshot::take(&stats);
                        notifier.send(&format!(
                            "STATUS=mirroring: {}, in flight {}; {}",
                            s.lag_text(),
                            s.total_in_flight(),
                            assignment(&stats, streams)
                        ));
                        last_status = Instant::now();
                    }
                    Err(why) if ready => {
                        ready = false;
                        notifier.send(&format!("STATUS=not ready: {why}"));
                    }
                    _ => {}
                }
                if let Some(interval) = watchdog {
                    if streams_alive(&stats, interval) {
                        notifier.send("WATCHDOG=1");
                    }
                }
                std::thread::sleep(tick);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the systemd notifier: {e}");
    }
}

/// Whether every stream's loop turned within `interval`: a stream stuck in a call that does
/// not return stops the watchdog, and systemd restarts the service.
fn streams_alive(stats: &Stats, interval: Duration) -> bool {
    streams_alive_at(stats, interval, Instant::now())
}

fn streams_alive_at(stats: &Stats, interval: Duration, now: Instant) -> bool {
    let now = stats.recorded.millis_since_start(now);
    stats.streams.live().iter().all(|s| {
        now.saturating_sub(s.last_turn.load(Ordering::Relaxed)) <= interval.as_millis() as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::state::StreamShared;

    #[test]
    fn a_stream_made_late_counts_as_alive_until_its_first_turn_is_overdue() {
        let stats = Arc::new(Stats::default());
        let control = Arc::new(Control::new());
        let interval = Duration::from_millis(40);
        // The process has run for more than the interval when a new incarnation is made.
        std::thread::sleep(interval * 2);
        let made = Instant::now();
        let _late = StreamShared::new(1, control, stats.clone(), true, None);
        assert!(streams_alive_at(&stats, interval, made + interval / 2));
        assert!(!streams_alive_at(&stats, interval, made + interval * 3));
    }
}
