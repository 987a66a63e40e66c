//! Health and metrics over HTTP (`--metrics.addr`): `/metrics`, `/health/live` and
//! `/health/ready`, and what "ready" means.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::metrics::registry;
use crate::mirror::state::{Control, Stats, StreamShared};

/// Commits failing in a row before the mirror says it is not ready: one failure is mended by
/// the next commit; several mean the source refuses them (authorization, a group gone wrong).
const COMMIT_FAILURES_NOT_READY: u64 = 3;

/// Whether the mirror is ready: running (every stream made, which happens once both
/// clusters answered at start), both clusters reachable (every stream's consumer and producer
/// had a broker connected in their latest statistics), and no stop requested. `Err` says why
/// not. An assignment is not needed: a mirror whose whitelist matches nothing yet, or one of
/// more instances than partitions, is running as it should; [`assignment`] tells it apart.
pub fn readiness(stats: &Stats, control: &Control, streams: usize) -> Result<(), String> {
    if control.stop_requested() {
        return Err("stopping".to_owned());
    }
    // Flags only: no tracker is locked and nothing is copied (systemd's notifier asks often).
    let live = stats.streams.live();
    if live.len() < streams {
        return Err(format!("{} of {streams} streams started", live.len()));
    }
    let count = |flag: fn(&StreamShared) -> &AtomicBool| {
        live.iter()
            .filter(|s| flag(s).load(Ordering::Relaxed))
            .count()
    };
    for (flag, client, cluster) in [
        (
            (|s| &s.source_up) as fn(&StreamShared) -> &AtomicBool,
            "consumers",
            "source",
        ),
        (|s| &s.target_up, "producers", "target"),
    ] {
        let up = count(flag);
        if up < live.len() {
            return Err(format!(
                "{up} of {} stream {client} reach the {cluster} cluster",
                live.len()
            ));
        }
    }
    let failing = stats
        .recorded
        .commit_failures_in_a_row
        .load(Ordering::Relaxed);
    if failing >= COMMIT_FAILURES_NOT_READY {
        return Err(format!(
            "the last {failing} offset commits failed (see mirror_commit_failures_total and \
             the log)"
        ));
    }
    Ok(())
}

/// How many streams have had their assignment (possibly empty), as a line.
pub fn assignment(stats: &Stats, streams: usize) -> String {
    format!(
        "streams with an assignment: {} of {streams}",
        stats.streams.with_assignment()
    )
}

/// Serves `/metrics`, `/health/live` and `/health/ready` on `addr` from a thread of its own.
/// Binding happens here, so a bad address is reported before the mirror starts.
pub fn serve(
    addr: SocketAddr,
    stats: Arc<Stats>,
    control: Arc<Control>,
    streams: usize,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    stats
        .recorded
        .latency_enabled
        .store(true, Ordering::Relaxed);
    let registry = registry(&stats);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for connection in listener.incoming() {
                let Ok(connection) = connection else { continue };
                if let Err(e) = answer(connection, &registry, &stats, &control, streams) {
                    tracing::debug!("metrics endpoint: {e}");
                }
            }
        })?;
    tracing::info!(
        "serving metrics at http://{bound}/metrics, health at /health/live and /health/ready"
    );
    Ok(bound)
}

fn answer(
    mut connection: TcpStream,
    registry: &Registry,
    stats: &Stats,
    control: &Control,
    streams: usize,
) -> std::io::Result<()> {
    connection.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(&connection);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Read the headers too: closing a socket with unread input resets the connection, and
    // the client could lose the response.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // HEAD is answered as GET is, headers only (monitoring probes use it).
    let head = method == "HEAD";
    let (status, content_type, body) = if method != "GET" && !head {
        (
            "405 Method Not Allowed\r\nAllow: GET, HEAD",
            "text/plain",
            "use GET or HEAD\n".to_owned(),
        )
    } else {
        match path {
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::prometheus_text::encode(&mut body, registry) {
                    Ok(()) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body),
                    Err(_) => (
                        "500 Internal Server Error",
                        "text/plain",
                        "cannot encode the metrics\n".to_owned(),
                    ),
                }
            }
            "/health/live" => ("200 OK", "text/plain", "live\n".to_owned()),
            "/health/ready" => {
                let assignment = assignment(stats, streams);
                match readiness(stats, control, streams) {
                    Ok(()) => ("200 OK", "text/plain", format!("ready\n{assignment}\n")),
                    Err(why) => (
                        "503 Service Unavailable",
                        "text/plain",
                        format!("not ready: {why}\n{assignment}\n"),
                    ),
                }
            }
            _ => (
                "404 Not Found",
                "text/plain",
                "try /metrics, /health/live or /health/ready\n".to_owned(),
            ),
        }
    };
    write!(
        connection,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        body.len(),
        if head { "" } else { &body }
    )?;
    connection.flush()
}
