//! What operators see: Prometheus metrics and health over HTTP (`--metrics.addr`), and a
//! progress line in the log (`--progress.interval.ms`).
//!
//! Counters on the record path are plain integers the streams already keep (the offset
//! tracker counts per source partition); they are read at scrape time by a collector, so
//! metrics add no label look-up or allocation per record. Only the replication-latency
//! histogram is observed per acknowledged record, and only while metrics are served.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::control::{Control, Stats};
use crate::offsets::PartitionCounters;
use crate::producer::StreamShared;

/// Process-wide metrics that are not plain counters, and the streams to read at scrape time.
#[derive(Debug)]
pub struct Telemetry {
    pub started: Instant,
    /// Set when metrics are served: only then is the latency observed per record.
    pub enabled: AtomicBool,
    /// Acknowledgement time minus the source record's timestamp, in seconds.
    pub latency: Histogram,
    /// Duration of synchronous commits (before a release and at shutdown), in seconds.
    pub commit_seconds: Histogram,
    /// Records the target refused for good, by librdkafka error code.
    pub send_errors: Family<Vec<(String, String)>, Counter>,
    streams: Mutex<Vec<Weak<StreamShared>>>,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        Telemetry {
            started: Instant::now(),
            enabled: AtomicBool::new(false),
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            send_errors: Family::default(),
            streams: Mutex::new(Vec::new()),
        }
    }
}

impl Telemetry {
    pub fn register(&self, stream: &Arc<StreamShared>) {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(stream));
    }

    pub fn count_send_error(&self, code: String) {
        self.send_errors
            .get_or_create(&vec![("code".to_owned(), code)])
            .inc();
    }

    /// Observes the replication latency of a record whose source timestamp is `timestamp_ms`.
    pub fn observe_latency(&self, timestamp_ms: i64) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.latency
            .observe((now - timestamp_ms).max(0) as f64 / 1000.0);
    }

    /// When each stream's loop last turned, in milliseconds since start.
    pub fn streams_turned(&self) -> Vec<u64> {
        self.streams()
            .iter()
            .map(|s| s.last_turn.load(Ordering::Relaxed))
            .collect()
    }

    fn streams(&self) -> Vec<Arc<StreamShared>> {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// One snapshot of every stream, summed per source partition.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub partitions: Vec<(String, i32, PartitionCounters)>,
    /// Records between each partition's position and its high watermark, per the consumers'
    /// latest statistics.
    pub lag: Vec<(String, i32, i64)>,
}

impl Snapshot {
    pub fn take(stats: &Stats) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for stream in stats.telemetry.streams() {
            snapshot
                .partitions
                .extend(stream.tracker().partition_counters());
            snapshot.lag.extend(
                stream
                    .lag
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned(),
            );
        }
        snapshot
            .partitions
            .sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        snapshot.lag.sort();
        snapshot
    }

    pub fn total_lag(&self) -> i64 {
        self.lag.iter().map(|(_, _, l)| *l).sum()
    }

    pub fn total_in_flight(&self) -> u64 {
        self.partitions.iter().map(|(_, _, c)| c.in_flight).sum()
    }
}

/// Whether the mirror is ready: every stream has had its assignment (possibly empty) and
/// reaches the target, and no stop was requested. `Err` says why not.
pub fn readiness(stats: &Stats, control: &Control, streams: usize) -> Result<(), String> {
    if control.stop_requested() {
        return Err("stopping".to_owned());
    }
    // Flags only: no tracker is locked and nothing is copied (systemd's notifier asks often).
    let live = stats.telemetry.streams();
    let count = |flag: fn(&StreamShared) -> &AtomicBool| {
        live.iter()
            .filter(|s| flag(s).load(Ordering::Relaxed))
            .count()
    };
    let assigned = count(|s| &s.assigned);
    if live.len() < streams || assigned < streams {
        return Err(format!(
            "{assigned} of {streams} streams have their assignment"
        ));
    }
    let up = count(|s| &s.target_up);
    if up < live.len() {
        return Err(format!(
            "{up} of {} stream producers reach the target cluster",
            live.len()
        ));
    }
    Ok(())
}

/// Encodes one metric family with a sample per source partition; `metric` makes the sample
/// (a counter or a gauge) from its value.
fn encode_per_partition<'a, V: Default, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a String, i32, V)>,
    metric: fn(V) -> M,
) -> Result<(), std::fmt::Error> {
    let mut family =
        encoder.encode_descriptor(name, help, None, metric(V::default()).metric_type())?;
    for (topic, partition, value) in samples {
        let labels = partition_labels(topic, partition);
        metric(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Reads the streams at scrape time.
#[derive(Debug)]
struct StreamCollector {
    stats: Arc<Stats>,
}

type PartitionLabels = [(&'static str, String); 2];

/// Reads one counter of a partition.
type CounterOf = fn(&PartitionCounters) -> u64;

fn partition_labels(topic: &str, partition: i32) -> PartitionLabels {
    [
        ("topic", topic.to_owned()),
        ("partition", partition.to_string()),
    ]
}

impl Collector for StreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = Snapshot::take(&self.stats);
        let per_partition: [(&str, &str, CounterOf); 3] = [
            ("mirror_records_consumed", "Source records consumed", |c| {
                c.consumed
            }),
            (
                "mirror_bytes_consumed",
                "Key and value bytes of the source records consumed",
                |c| c.consumed_bytes,
            ),
            (
                "mirror_records_acknowledged",
                "Source records whose every target record the target acknowledged",
                |c| c.acknowledged,
            ),
        ];
        for (name, help, value) in per_partition {
            let samples = snapshot
                .partitions
                .iter()
                .map(|(t, p, c)| (t, *p, value(c)));
            encode_per_partition(&mut encoder, name, help, samples, ConstCounter::new)?;
        }
        let in_flight = snapshot
            .partitions
            .iter()
            .map(|(t, p, c)| (t, *p, c.in_flight as i64));
        encode_per_partition(
            &mut encoder,
            "mirror_records_in_flight",
            "Source records consumed and not yet acknowledged by the target",
            in_flight,
            ConstGauge::new,
        )?;
        let lag = snapshot.lag.iter().map(|(t, p, l)| (t, *p, *l));
        encode_per_partition(
            &mut encoder,
            "mirror_consumer_lag",
            "Records between the mirror's position and the source partition's end",
            lag,
            ConstGauge::new,
        )?;
        let stats = &self.stats;
        let totals = [
            (
                "mirror_records_produced",
                "Target records handed to the producer",
                Stats::get(&stats.produced),
            ),
            (
                "mirror_records_dropped",
                "Records the target refused for good and skipped (--abort.on.send.failure false)",
                Stats::get(&stats.dropped),
            ),
            (
                "mirror_records_filtered",
                "Source records the message handler turned into no record",
                Stats::get(&stats.filtered),
            ),
            (
                "mirror_records_looped",
                "Source records not mirrored back to the cluster they came from (--loop.prevention)",
                Stats::get(&stats.looped),
            ),
            (
                "mirror_commits",
                "Offset commits sent to the source cluster",
                Stats::get(&stats.commits),
            ),
            (
                "mirror_rebalances",
                "Rebalances (assignments and revocations) seen by the streams",
                Stats::get(&stats.rebalances),
            ),
        ];
        for (name, help, value) in totals {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let uptime = ConstGauge::new(stats.telemetry.started.elapsed().as_secs_f64());
        uptime.encode(encoder.encode_descriptor(
            "mirror_uptime_seconds",
            "Seconds since the mirror started",
            None,
            uptime.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The registry served at `/metrics`.
pub fn registry(stats: &Arc<Stats>) -> Registry {
    let mut registry = Registry::default();
    let t = &stats.telemetry;
    registry.register(
        "mirror_replication_latency_seconds",
        "Acknowledgement time minus the source record's timestamp",
        t.latency.clone(),
    );
    registry.register(
        "mirror_commit_seconds",
        "Duration of synchronous offset commits (before releasing partitions, at shutdown)",
        t.commit_seconds.clone(),
    );
    registry.register(
        "mirror_send_errors",
        "Records the target refused for good, by error code",
        t.send_errors.clone(),
    );
    let info = prometheus_client::metrics::info::Info::new(vec![(
        "version".to_owned(),
        env!("CARGO_PKG_VERSION").to_owned(),
    )]);
    registry.register("mirror_build", "Build information", info);
    registry.register_collector(Box::new(StreamCollector {
        stats: stats.clone(),
    }));
    registry
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
    stats.telemetry.enabled.store(true, Ordering::Relaxed);
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
    let (status, content_type, body) = if method != "GET" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "use GET\n".to_owned(),
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
            "/health/ready" => match readiness(stats, control, streams) {
                Ok(()) => ("200 OK", "text/plain", "ready\n".to_owned()),
                Err(why) => (
                    "503 Service Unavailable",
                    "text/plain",
                    format!("not ready: {why}\n"),
                ),
            },
            _ => (
                "404 Not Found",
                "text/plain",
                "try /metrics, /health/live or /health/ready\n".to_owned(),
            ),
        }
    };
    write!(
        connection,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    connection.flush()
}

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
