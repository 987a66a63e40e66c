//! Health and metrics over HTTP (`--metrics.addr`): `/metrics`, `/health/live` and
//! `/health/ready`, and what "ready" means.
//!
//! The server is hyper's HTTP/1, on a single-threaded tokio runtime of its own thread (a busy
//! or stuck mirror does not delay a probe). Bounded: at most [`MAX_CONNECTIONS`] at once (one
//! more closes the oldest), a request's line and headers within [`HEADER_READ_TIMEOUT`] and
//! [`MAX_HEAD_BYTES`] (the timeout also ends a keep-alive connection left idle), request
//! bodies never read. A request for a host name that is not ours gets 421 ([`host_allowed`]):
//! a web page cannot read the endpoints through DNS rebinding.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;

use super::metrics::registry;
use crate::mirror::state::{Control, Reach, Stats, StreamShared};

/// Commits failing in a row before the mirror says it is not ready: one failure is mended by
/// the next commit; several mean the source refuses them (authorization, a group gone wrong).
const COMMIT_FAILURES_NOT_READY: u64 = 3;

/// Whether the mirror is ready: running (every stream made, which happens once both
/// clusters answered at start), both clusters reachable (every stream's consumer and producer
/// has a broker connected, or none failed yet, by `mirror::clients::in_reach`; out of reach
/// once two statistics in a row say so, `state::Reach`; what the batch engine's own requests
/// find counts at once), and no stop requested. `Err` says why not. An assignment is not
/// needed: a mirror whose whitelist matches nothing yet, or one of more instances than
/// partitions, is running as it should; [`assignment`] tells it apart.
///
/// With `--max.replication.delay.ms`, a replication delay above it is not ready either
/// (logged once as it passes the limit and once as it comes back under, whatever else is
/// wrong meanwhile). Every reason that holds is named, `; ` between them.
pub fn readiness(
    stats: &Stats,
    control: &Control,
    streams: usize,
    max_delay: Option<Duration>,
) -> Result<(), String> {
    if control.stop_requested() {
        return Err("stopping".to_owned());
    }
    // Flags only: no tracker is locked and nothing is copied (systemd's notifier asks often).
    let live = stats.streams.live();
    let mut reasons = Vec::new();
    if live.len() < streams {
        reasons.push(format!("{} of {streams} streams started", live.len()));
    }
    for (reach, client, cluster) in [
        (
            (|s| &s.source_up) as fn(&StreamShared) -> &Reach,
            "consumers",
            "source",
        ),
        (|s| &s.target_up, "producers", "target"),
    ] {
        let up = live.iter().filter(|s| reach(s).up()).count();
        if up < live.len() {
            reasons.push(format!(
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
        reasons.push(format!(
            "the last {failing} offset commits failed (see mirror_commit_failures_total and \
             the log)"
        ));
    }
    // Weighed whatever else is wrong: a target that stops answering is also a delay that
    // grows, and its crossing of the limit is logged as it happens.
    if let Some(limit) = max_delay {
        let now = std::time::Instant::now();
        let worst = live
            .iter()
            .flat_map(|s| s.delay.delays(now))
            .max_by_key(|(_, d)| *d);
        let over = worst.as_ref().is_some_and(|(_, d)| *d > limit);
        if stats.delay_over_limit.swap(over, Ordering::Relaxed) != over {
            match &worst {
                Some(((topic, partition), delay)) if over => tracing::warn!(
                    "replication delay {delay:.1?} ({topic}/{partition}) is above \
                     --max.replication.delay.ms ({limit:?}): not ready until it is back under"
                ),
                _ => tracing::info!(
                    "replication delay back under --max.replication.delay.ms ({limit:?})"
                ),
            }
        }
        if let (true, Some(((topic, partition), delay))) = (over, worst) {
            reasons.push(format!(
                "replication delay {delay:.1?} ({topic}/{partition}) is above \
                 --max.replication.delay.ms ({limit:?})"
            ));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("; "))
    }
}

/// How many streams have had their assignment (possibly empty), as a line.
pub fn assignment(stats: &Stats, streams: usize) -> String {
    format!(
        "streams with an assignment: {} of {streams}",
        stats.streams.with_assignment()
    )
}

/// At most this many connections at once. One more closes the oldest: the endpoints answer in
/// microseconds, so the oldest is a slow or idle client, and a probe's connection is young.
const MAX_CONNECTIONS: usize = 64;

/// A request's line and headers must have arrived this long after the connection opened (or
/// after the previous response on a kept-alive connection): a slow client is cut off.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The most a request's line and headers may take; beyond, 431 and the connection is closed.
const MAX_HEAD_BYTES: usize = 16 << 10;

/// After a failed accept (out of file descriptors), how long before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The host names served besides IP addresses and `localhost`: those listed
/// (`--metrics.allowed.hosts`) and the host of `--metrics.addr` itself when it is a name.
pub fn allowed_hosts(metrics_addr: &str, listed: &[String]) -> Vec<String> {
    let mut names: Vec<String> = listed.iter().map(|n| normalized(n)).collect();
    let host = metrics_addr
        .rsplit_once(':')
        .map_or(metrics_addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<IpAddr>().is_err() && !host.is_empty() {
        names.push(normalized(host));
    }
    names
}

/// A host name as compared: lowercase, without the final dot of a fully qualified name.
fn normalized(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Whether a request for `authority` (HOST or HOST:PORT, from the Host header or an absolute
/// request URI) is served: an IP address, `localhost`, or a name in `allowed` (normalized),
/// whatever the port. A name that another site's page can be loaded from is refused: DNS
/// rebinding points such a name at this machine, and the browser then lets that page read
/// what it fetches from it; an IP address or localhost cannot be that other site.
pub fn host_allowed(authority: &str, allowed: &[String]) -> bool {
    let host = if let Some(bracketed) = authority.strip_prefix('[') {
        // [IPv6] or [IPv6]:PORT
        let Some((ip, rest)) = bracketed.split_once(']') else {
            return false;
        };
        let port_ok = rest.is_empty()
            || rest
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
        return port_ok && ip.parse::<std::net::Ipv6Addr>().is_ok();
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            Some(_) => return false,
            None => authority,
        }
    };
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let host = normalized(host);
    host == "localhost" || allowed.contains(&host)
}

/// What every connection's requests are answered from.
struct Endpoints {
    registry: Registry,
    stats: Arc<Stats>,
    control: Arc<Control>,
    streams: usize,
    max_delay: Option<Duration>,
    allowed_hosts: Vec<String>,
}

/// Serves `/metrics`, `/health/live` and `/health/ready` on `addr` from a thread of its own.
/// Binding happens here, so a bad address is reported before the mirror starts.
/// `allowed_hosts`: [`allowed_hosts`].
pub fn serve(
    addr: SocketAddr,
    allowed_hosts: Vec<String>,
    stats: Arc<Stats>,
    control: Arc<Control>,
    streams: usize,
    max_delay: Option<Duration>,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    stats
        .recorded
        .latency_enabled
        .store(true, Ordering::Relaxed);
    let endpoints = Arc::new(Endpoints {
        registry: registry(&stats),
        stats,
        control,
        streams,
        max_delay,
        allowed_hosts,
    });
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept(listener, endpoints)))?;
    tracing::info!(
        "serving metrics at http://{bound}/metrics, health at /health/live and /health/ready"
    );
    Ok(bound)
}

/// Accepts connections for ever, each served by a task of its own; at [`MAX_CONNECTIONS`],
/// a new one closes the oldest still open.
async fn accept(listener: tokio::net::TcpListener, endpoints: Arc<Endpoints>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true)
        // Header names as the old server wrote them (Content-Type, Allow): scripts grep them.
        .title_case_headers(true);
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    loop {
        let (connection, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!("metrics endpoint: cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        open.retain(|task| !task.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.pop_front() {
                tracing::debug!(
                    "metrics endpoint: {MAX_CONNECTIONS} connections open; closing the oldest \
                     for one from {peer}"
                );
                oldest.abort();
            }
        }
        let endpoints = endpoints.clone();
        let serving = http.serve_connection(
            TokioIo::new(connection),
            hyper::service::service_fn(move |request| {
                let response = endpoints.answer(&request);
                async move { Ok::<_, Infallible>(response) }
            }),
        );
        open.push_back(
            tokio::spawn(async move {
                if let Err(e) = serving.await {
                    tracing::debug!("metrics endpoint: connection from {peer}: {e}");
                }
            })
            .abort_handle(),
        );
    }
}

impl Endpoints {
    /// The response to one request (its body, if any, is never read).
    fn answer(&self, request: &Request<Incoming>) -> Response<String> {
        let authority = match request.uri().authority() {
            Some(authority) => Some(authority.as_str()),
            None => match request.headers().get(HOST).map(HeaderValue::to_str) {
                Some(Ok(host)) => Some(host),
                Some(Err(_)) => Some(""),
                None => None,
            },
        };
        // No Host at all (an HTTP/1.0 script): no browser sends such a request.
        if let Some(host) = authority.filter(|h| !host_allowed(h, &self.allowed_hosts)) {
            return text(
                StatusCode::MISDIRECTED_REQUEST,
                "text/plain",
                format!(
                    "host {host:?} is not served here (a guard against DNS rebinding): ask \
                     by IP address or localhost, or add the name to --metrics.allowed.hosts\n"
                ),
            );
        }
        // HEAD is answered as GET is, headers only (monitoring probes use it); hyper leaves
        // the body out and keeps its Content-Length.
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "use GET or HEAD\n".to_owned(),
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        match request.uri().path() {
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::prometheus_text::encode(
                    &mut body,
                    &self.registry,
                ) {
                    Ok(()) => text(
                        StatusCode::OK,
                        "text/plain; version=0.0.4; charset=utf-8",
                        body,
                    ),
                    Err(_) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        "cannot encode the metrics\n".to_owned(),
                    ),
                }
            }
            "/health/live" => text(StatusCode::OK, "text/plain", "live\n".to_owned()),
            "/health/ready" => {
                let assignment = assignment(&self.stats, self.streams);
                match readiness(&self.stats, &self.control, self.streams, self.max_delay) {
                    Ok(()) => text(
                        StatusCode::OK,
                        "text/plain",
                        format!("ready\n{assignment}\n"),
                    ),
                    Err(why) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        format!("not ready: {why}\n{assignment}\n"),
                    ),
                }
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "try /metrics, /health/live or /health/ready\n".to_owned(),
            ),
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_and_localhost_pass_the_host_check_with_any_port() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:9464",
            "10.244.3.17:9464",
            "[::1]",
            "[::1]:9464",
            "[fe80::1]:80",
            "localhost",
            "LOCALHOST:1",
            "localhost.:9464",
        ] {
            assert!(host_allowed(host, &[]), "{host}");
        }
    }

    #[test]
    fn other_names_fail_the_host_check_unless_allowed() {
        for host in [
            "rebound.example",
            "rebound.example:9464",
            "127.0.0.1.rebound.example",
            "localhost.rebound.example",
            "[::1].rebound.example",
            "[::1]x",
            "[rebound.example]",
            "::1",
            "127.0.0.1:http",
            "",
        ] {
            assert!(!host_allowed(host, &[]), "{host}");
        }
        let allowed = allowed_hosts("mirror.internal:9464", &["Mirror.Monitoring.svc.".into()]);
        assert_eq!(allowed, ["mirror.monitoring.svc", "mirror.internal"]);
        assert!(host_allowed(
            "mirror-maker.example",
            &["mirror-maker.example".into()]
        ));
        assert!(host_allowed("MIRROR.internal:80", &allowed));
        assert!(host_allowed("mirror.monitoring.svc:9464", &allowed));
        assert!(!host_allowed("other.monitoring.svc:9464", &allowed));
    }

    #[test]
    fn an_address_given_as_ip_adds_no_name() {
        assert!(allowed_hosts("0.0.0.0:9464", &[]).is_empty());
        assert!(allowed_hosts("[::]:9464", &[]).is_empty());
    }

    /// A target that stops answering shows twice, unreachable and behind: the delay is
    /// weighed (and its crossing recorded for the log) whatever else is wrong.
    #[test]
    fn a_delay_above_the_limit_is_named_even_with_the_target_unreachable() {
        use crate::mirror::delay::Observation;
        use crate::mirror::state::{Control, Stats, StreamShared};
        use std::sync::Arc;
        let stats = Arc::new(Stats::default());
        let stream = StreamShared::new(0, Arc::new(Control::new()), stats.clone(), true, None);
        let then = std::time::Instant::now() - Duration::from_secs(10);
        stream.delay.observe(
            then,
            &[Observation {
                partition: ("orders".to_owned(), 0),
                high_watermark: 20,
                replicated_to: Some(10),
            }],
        );
        stream.target_up.set(false);
        let why = readiness(&stats, &Control::new(), 1, Some(Duration::from_secs(3)))
            .expect_err("not ready");
        assert!(
            why.contains("reach the target cluster")
                && why.contains("(orders/0) is above --max.replication.delay.ms"),
            "{why}"
        );
        assert!(stats.delay_over_limit.load(Ordering::Relaxed));
    }
}
