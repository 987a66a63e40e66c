//! `mirror-bench`: the mirror against its limits, against Kafka's own mirrors and against a
//! hand-written peer, in one run.
//!
//! ```sh
//! cargo run --release --bin mirror-bench -- --brokers kafka [--records N] [--value-bytes B] [--partitions P] [--streams 1,2,4] [--compression lz4]
//! cargo run --release --bin mirror-bench -- --brokers mock [--records N] [--value-bytes B] [--partitions P] [--streams 1,2,4]
//! ```
//!
//! `--brokers kafka`: see [`kafka`] (Apache Kafka clusters; MirrorMaker 1 and 2, a batched
//! hand-written loop, the limits).
//!
//! `--brokers mock`: source and target are librdkafka mock clusters, each in its own process (this binary with
//! `host-cluster`), on loopback. Every measured pass also runs in its own process (`pass`), so
//! that its CPU time and peak RSS are its own. Passes, on the same preloaded backlog:
//! consume-only (the source-side limit), produce-only (the target-side limit), the mirror with
//! default settings, the mirror in KIP-3 strict mode (one request in flight), and the
//! at-least-once loop users write by hand (consume, produce, await the delivery, store the
//! offset). After each mirror pass the target is checked: the record count, and one partition
//! record by record; a missing record fails the benchmark.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use mirror_maker::mirror::flush::send_waiting;
use mirror_maker::mirror::state::{Control, Stats};
use mirror_maker::settings::client::{ClientProps, Role};
use mirror_maker::settings::routing::TopicFilter;
use mirror_maker::settings::{Settings, SettingsOptions};

mod kafka;

const TOPIC: &str = "bench";

#[derive(Parser)]
#[command(
    name = "mirror-bench",
    about = "Benchmark the mirror against its limits and a hand-written peer"
)]
struct Cli {
    #[command(subcommand)]
    internal: Option<Internal>,
    /// The clusters: Apache Kafka (started by the benchmark; the head-to-head with
    /// MirrorMaker 1 and 2) or librdkafka's mock clusters.
    #[arg(long, value_enum, default_value_t = Brokers::Mock)]
    brokers: Brokers,
    /// Records in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Size of each record's value.
    #[arg(long = "value-bytes", default_value_t = 100)]
    value_bytes: usize,
    /// Partitions of the topic (the mock cluster keeps about 5 MB per partition).
    #[arg(long, default_value_t = 48)]
    partitions: i32,
    /// Stream counts to sweep for the mirror with default settings.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    streams: Vec<u32>,
    /// Skip the hand-written peer.
    #[arg(long)]
    skip_peer: bool,
    /// Records the hand-written peer copies (it handles one at a time, so it gets the start
    /// of the backlog only; its rate is what is compared).
    #[arg(long = "peer-records", default_value_t = 20_000)]
    peer_records: u64,
    /// Where to append the results (one JSON object per run).
    #[arg(long, default_value = "bench/results.jsonl")]
    out: std::path::PathBuf,
    #[command(flatten)]
    tuning: Tuning,
    #[command(flatten)]
    kafka: kafka::KafkaArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Brokers {
    Kafka,
    Mock,
}

/// Extra client properties for the mirror passes (to measure a setting; the limits and the
/// peer are not affected).
#[derive(clap::Args, Clone, Debug, Default)]
struct Tuning {
    /// A consumer property for the mirror, KEY=VALUE (repeatable).
    #[arg(long = "mirror-consumer", value_name = "KEY=VALUE", value_parser = key_value)]
    consumer: Vec<(String, String)>,
    /// A producer property for the mirror, KEY=VALUE (repeatable).
    #[arg(long = "mirror-producer", value_name = "KEY=VALUE", value_parser = key_value)]
    producer: Vec<(String, String)>,
}

impl Tuning {
    fn args(&self) -> Vec<String> {
        let pairs = |flag: &str, kv: &[(String, String)]| {
            kv.iter()
                .map(|(k, v)| format!("{flag}={k}={v}"))
                .collect::<Vec<_>>()
        };
        let mut args = pairs("--mirror-consumer", &self.consumer);
        args.extend(pairs("--mirror-producer", &self.producer));
        args
    }
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[derive(Subcommand)]
enum Internal {
    /// Host a mock cluster with the benchmark topic: print its bootstrap address, live until
    /// stdin closes.
    HostCluster {
        #[arg(long)]
        partitions: i32,
    },
    /// Run one measured pass and print its result as JSON.
    Pass(PassArgs),
    /// Run one in-process pass on Kafka (a limit, printing its result as JSON, or the
    /// batched loop, until stopped).
    KafkaPass(kafka::KafkaPassArgs),
}

#[derive(clap::Args)]
struct PassArgs {
    #[arg(value_enum)]
    kind: PassKind,
    #[arg(long)]
    source: String,
    #[arg(long)]
    target: String,
    #[arg(long)]
    records: u64,
    #[arg(long)]
    value_bytes: usize,
    #[arg(long)]
    partitions: i32,
    #[arg(long, default_value_t = 1)]
    streams: u32,
    #[command(flatten)]
    tuning: Tuning,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
enum PassKind {
    ConsumeOnly,
    ProduceOnly,
    Mirror,
    MirrorStrict,
    Peer,
}

#[derive(Debug, Serialize, Deserialize)]
struct PassResult {
    kind: PassKind,
    streams: u32,
    records: u64,
    bytes: u64,
    /// From the first record to the last acknowledged (group join excluded).
    steady_secs: f64,
    /// From the start of the pass (clients created) to the end.
    total_secs: f64,
    cpu_secs: f64,
    peak_rss_kib: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.internal {
        Some(Internal::HostCluster { partitions }) => host_cluster(partitions),
        Some(Internal::Pass(pass)) => {
            mirror_maker::ops::logging::init(mirror_maker::settings::flags::LogFormat::Text);
            let result = run_pass(&pass)?;
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        }
        Some(Internal::KafkaPass(pass)) => kafka::kafka_pass(&pass),
        None if cli.brokers == Brokers::Kafka => orchestrate_kafka(&cli),
        None => orchestrate(&cli),
    }
}

fn host_cluster(partitions: i32) -> anyhow::Result<()> {
    let cluster = rdkafka::mocking::MockCluster::new(1)?;
    cluster.create_topic(TOPIC, partitions, 1)?;
    println!("{}", cluster.bootstrap_servers());
    std::io::stdout().flush()?;
    // Live until the orchestrator closes our stdin.
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line)? > 0 {}
    Ok(())
}

/// A mock cluster in a child process.
struct Host {
    child: Child,
    bootstrap: String,
}

impl Host {
    fn start(partitions: i32) -> anyhow::Result<Host> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["host-cluster", "--partitions", &partitions.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("host stdout")?).read_line(&mut line)?;
        Ok(Host {
            child,
            bootstrap: line.trim().to_owned(),
        })
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn value(i: u64, bytes: usize) -> Vec<u8> {
    let mut v = format!("record-{i:012}").into_bytes();
    v.resize(bytes, b'.');
    v
}

/// Sends the backlog's records (key = index, same value) round-robin over the partitions,
/// waiting out a full queue and serving delivery reports every `poll_every` records.
fn send_backlog(
    producer: &BaseProducer,
    records: u64,
    value_bytes: usize,
    partitions: i32,
    poll_every: u64,
) -> anyhow::Result<()> {
    let v = value(0, value_bytes);
    for i in 0..records {
        let key = i.to_be_bytes();
        let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(TOPIC)
            .partition((i % partitions as u64) as i32)
            .key(key.as_slice())
            .payload(v.as_slice());
        send_waiting(producer, record, None)
            .map_err(|e| anyhow::anyhow!("sending backlog record {i}: {e}"))?;
        if i % poll_every == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    Ok(())
}

fn preload(
    bootstrap: &str,
    records: u64,
    value_bytes: usize,
    partitions: i32,
) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("log_level", "3")
        .create()?;
    send_backlog(&producer, records, value_bytes, partitions, 10_000)?;
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// CPU seconds and peak RSS (KiB) of this process so far. The peak comes from /proc's
/// VmHWM: getrusage's ru_maxrss keeps the parent's peak across fork and exec.
#[allow(unsafe_code)] // the benchmark's one FFI call
fn usage() -> (f64, u64) {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    (secs(ru.ru_utime) + secs(ru.ru_stime), peak)
}

fn run_pass(pass: &PassArgs) -> anyhow::Result<PassResult> {
    let (kind, source, target, records) = (pass.kind, &pass.source, &pass.target, pass.records);
    let started = Instant::now();
    let (first, last) = match kind {
        PassKind::ConsumeOnly => consume_only(source, records, pass.partitions)?,
        PassKind::ProduceOnly => produce_only(target, records, pass.value_bytes, pass.partitions)?,
        PassKind::Mirror | PassKind::MirrorStrict => {
            mirror(kind, source, target, records, pass.streams, &pass.tuning)?
        }
        PassKind::Peer => peer(source, target, records)?,
    };
    let total_secs = started.elapsed().as_secs_f64();
    let (cpu_secs, peak_rss_kib) = usage();
    Ok(PassResult {
        kind,
        streams: pass.streams,
        records,
        bytes: records * (pass.value_bytes as u64 + 8),
        steady_secs: last.duration_since(first).as_secs_f64(),
        total_secs,
        cpu_secs,
        peak_rss_kib,
    })
}

fn consume_only(source: &str, records: u64, partitions: i32) -> anyhow::Result<(Instant, Instant)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", source)
        .set("group.id", "bench-consume-only")
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    let (first, last) = consume_all(&consumer, partitions, records, Duration::from_secs(30))?;
    Ok((first.unwrap_or(last), last))
}

/// The consume-only limit's loop (mock and Kafka passes alike): reads `records` records of
/// the benchmark topic's `partitions` from their beginning, touching each payload; returns
/// when the first arrived (`None` if none was due) and when the last did. Nothing for
/// `patience` is an error.
pub(crate) fn consume_all(
    consumer: &BaseConsumer,
    partitions: i32,
    records: u64,
    patience: Duration,
) -> anyhow::Result<(Option<Instant>, Instant)> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut seen, mut first) = (0, None);
    while seen < records {
        match consumer.poll(patience) {
            Some(Ok(m)) => {
                first.get_or_insert_with(Instant::now);
                seen += 1;
                std::hint::black_box(m.payload());
            }
            Some(Err(e)) => bail!("consuming {TOPIC}: {e}"),
            None => bail!("consuming {TOPIC}: nothing for {patience:?} after {seen} records"),
        }
    }
    Ok((first, Instant::now()))
}

fn produce_only(
    target: &str,
    records: u64,
    value_bytes: usize,
    partitions: i32,
) -> anyhow::Result<(Instant, Instant)> {
    // The mirror's producer settings: idempotent, acks=all.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", target)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("log_level", "3")
        .create()?;
    let first = Instant::now();
    // Delivery reports served after every record, as the mirror does.
    send_backlog(&producer, records, value_bytes, partitions, 1)?;
    producer.flush(Duration::from_secs(300))?;
    Ok((first, Instant::now()))
}

fn mirror(
    kind: PassKind,
    source: &str,
    target: &str,
    records: u64,
    streams: u32,
    tuning: &Tuning,
) -> anyhow::Result<(Instant, Instant)> {
    let mut producer = vec![("bootstrap.servers", target)];
    if kind == PassKind::MirrorStrict {
        producer.push(("max.in.flight.requests.per.connection", "1"));
    }
    producer.extend(
        tuning
            .producer
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    // A group of its own: every pass starts from the beginning of the backlog.
    let group = format!("bench-mirror-{}", std::process::id());
    let settings = Settings::new(
        ClientProps::from_pairs(
            Role::Consumer,
            "bench consumer config",
            [
                ("bootstrap.servers", source),
                ("group.id", group.as_str()),
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "500"),
            ]
            .into_iter()
            .chain(
                tuning
                    .consumer
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            ),
        ),
        ClientProps::from_pairs(Role::Producer, "bench producer config", producer),
        TopicFilter::new(TOPIC)?,
        SettingsOptions {
            num_streams: streams as usize,
            commit_interval: Duration::from_secs(1),
            ..SettingsOptions::default()
        },
    )?;
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    let mut first = None;
    let result = std::thread::scope(|scope| {
        let handle = {
            let (control, stats, settings) = (control.clone(), stats.clone(), &settings);
            scope.spawn(move || mirror_maker::mirror::pipeline::run(settings, control, stats))
        };
        let mut progress = (0, Instant::now());
        let mut stalled = false;
        while Stats::get(&stats.acknowledged) < records && !handle.is_finished() {
            if first.is_none() && Stats::get(&stats.consumed) > 0 {
                first = Some(Instant::now());
            }
            let acked = Stats::get(&stats.acknowledged);
            if acked != progress.0 {
                progress = (acked, Instant::now());
            } else if progress.1.elapsed() > Duration::from_secs(60) {
                stalled = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let last = Instant::now();
        control.request_stop();
        (
            handle.join(),
            last,
            stalled,
            Stats::get(&stats.acknowledged),
        )
    });
    let (joined, last, stalled, acked) = result;
    if stalled {
        bail!("the mirror stalled at {acked} of {records} records acknowledged");
    }
    match joined {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => bail!("the mirror failed: {e}"),
        Err(_) => bail!("the mirror panicked"),
    }
    Ok((first.unwrap_or(last), last))
}

/// The loop users write by hand (rust-rdkafka's at_least_once example): one record at a
/// time, await its delivery, then store its offset for the next auto-commit.
fn peer(source: &str, target: &str, records: u64) -> anyhow::Result<(Instant, Instant)> {
    use rdkafka::consumer::StreamConsumer;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", source)
            .set("group.id", format!("bench-peer-{}", std::process::id()))
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("log_level", "3")
            .create()?;
        consumer.subscribe(&[TOPIC])?;
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", target)
            .set("enable.idempotence", "true")
            .set("log_level", "3")
            .create()?;
        let mut first = None;
        for _ in 0..records {
            let m = consumer.recv().await?;
            first.get_or_insert_with(Instant::now);
            let mut record = FutureRecord::<[u8], [u8]>::to(TOPIC).partition(m.partition());
            record.key = m.key();
            record.payload = m.payload();
            producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| anyhow::anyhow!("peer send: {e}"))?;
            consumer.store_offset_from_message(&m)?;
        }
        Ok((first.unwrap_or_else(Instant::now), Instant::now()))
    })
}

fn spawn_pass(
    kind: PassKind,
    source: &str,
    target: &str,
    cli: &Cli,
    streams: u32,
) -> anyhow::Result<PassResult> {
    let records = if kind == PassKind::Peer {
        cli.peer_records.min(cli.records)
    } else {
        cli.records
    };
    let out = Command::new(std::env::current_exe()?)
        .args([
            "pass",
            kind.to_possible_value().expect("a value").get_name(),
        ])
        .args(["--source", source, "--target", target])
        .args([
            "--records",
            &records.to_string(),
            "--value-bytes",
            &cli.value_bytes.to_string(),
        ])
        .args([
            "--partitions",
            &cli.partitions.to_string(),
            "--streams",
            &streams.to_string(),
        ])
        .args(cli.tuning.args())
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("pass {kind:?} failed ({})", out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).with_context(|| format!("pass {kind:?} printed {line:?}"))
}

/// After a mirror pass: every record is on the target, and one partition is identical.
fn check_target(source: &str, target: &str, records: u64, partitions: i32) -> anyhow::Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", target)
        .set("log_level", "3")
        .create()?;
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(10))?;
        total += (high - low) as u64;
    }
    if total < records {
        bail!("MISSING RECORDS: the target holds {total} of {records}");
    }
    let s =
        mirror_maker::tools::compare::read_partition(source, TOPIC, 0, Duration::from_secs(60))?;
    let t =
        mirror_maker::tools::compare::read_partition(target, TOPIC, 0, Duration::from_secs(60))?;
    let c = mirror_maker::tools::compare::compare(&s, &t);
    if c.lost > 0 || c.changed > 0 {
        bail!("partition 0 differs from the source: {c:?}");
    }
    Ok(())
}

fn rate(r: &PassResult) -> f64 {
    r.records as f64 / r.steady_secs.max(1e-9)
}

fn orchestrate(cli: &Cli) -> anyhow::Result<()> {
    let per_partition = cli.records / cli.partitions as u64 * (cli.value_bytes as u64 + 40);
    if per_partition > 4_500_000 {
        bail!(
            "about {} KB per partition: the mock cluster keeps only about 5 MB per partition; use more --partitions",
            per_partition / 1000
        );
    }
    let source = Host::start(cli.partitions)?;
    eprintln!(
        "preloading {} records of {} bytes over {} partitions",
        cli.records, cli.value_bytes, cli.partitions
    );
    preload_topic(&source.bootstrap, cli)?;
    let mut results = Vec::new();
    let run = |kind: PassKind, streams: u32, results: &mut Vec<PassResult>| -> anyhow::Result<()> {
        let target = Host::start(cli.partitions)?;
        let r = spawn_pass(kind, &source.bootstrap, &target.bootstrap, cli, streams)?;
        if matches!(kind, PassKind::Mirror | PassKind::MirrorStrict) {
            check_target(
                &source.bootstrap,
                &target.bootstrap,
                cli.records,
                cli.partitions,
            )?;
        }
        eprintln!(
            "{kind:?} streams={streams}: {:.0} records/s steady, {:.1} s total, {:.2} CPU s per million, peak RSS {} MiB",
            rate(&r),
            r.total_secs,
            r.cpu_secs / r.records as f64 * 1e6,
            r.peak_rss_kib / 1024
        );
        results.push(r);
        Ok(())
    };
    run(PassKind::ConsumeOnly, 1, &mut results)?;
    run(PassKind::ProduceOnly, 1, &mut results)?;
    for &s in &cli.streams {
        run(PassKind::Mirror, s, &mut results)?;
    }
    run(PassKind::MirrorStrict, 1, &mut results)?;
    if !cli.skip_peer {
        run(PassKind::Peer, 1, &mut results)?;
    }
    report(cli, &results)
}

fn preload_topic(bootstrap: &str, cli: &Cli) -> anyhow::Result<()> {
    preload(bootstrap, cli.records, cli.value_bytes, cli.partitions)
}

fn report(cli: &Cli, results: &[PassResult]) -> anyhow::Result<()> {
    let find = |k: PassKind| results.iter().find(|r| r.kind == k);
    let consume = find(PassKind::ConsumeOnly).context("no consume-only pass")?;
    let produce = find(PassKind::ProduceOnly).context("no produce-only pass")?;
    let serial = 1.0 / (1.0 / rate(consume) + 1.0 / rate(produce));
    println!(
        "\n{} records of {} bytes, {} partitions, mock clusters in separate processes",
        cli.records, cli.value_bytes, cli.partitions
    );
    println!(
        "{:<24} {:>8} {:>12} {:>9} {:>12} {:>10} {:>9} {:>11} {:>10}",
        "pass",
        "streams",
        "records/s",
        "MB/s",
        "total rec/s",
        "CPU s/M",
        "RSS MiB",
        "/consume",
        "/serial"
    );
    for r in results {
        println!(
            "{:<24} {:>8} {:>12.0} {:>9.1} {:>12.0} {:>10.2} {:>9} {:>11.2} {:>10.2}",
            format!("{:?}", r.kind),
            r.streams,
            rate(r),
            r.bytes as f64 / r.steady_secs / 1e6,
            r.records as f64 / r.total_secs,
            r.cpu_secs / r.records as f64 * 1e6,
            r.peak_rss_kib / 1024,
            rate(r) / rate(consume),
            rate(r) / serial
        );
    }
    if let Some(peer) = find(PassKind::Peer) {
        let best = results
            .iter()
            .filter(|r| r.kind == PassKind::Mirror)
            .map(rate)
            .fold(0.0, f64::max);
        println!(
            "mirror (best) / hand-written peer: {:.1}x",
            best / rate(peer)
        );
    }
    if let Some(dir) = cli.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cli.out)?;
    writeln!(
        file,
        "{}",
        serde_json::json!({
            "records": cli.records,
            "value_bytes": cli.value_bytes,
            "partitions": cli.partitions,
            "results": results,
        })
    )?;
    println!("results appended to {}", cli.out.display());
    Ok(())
}

/// `--brokers kafka`: every contender on the same Kafka clusters and backlog.
fn orchestrate_kafka(cli: &Cli) -> anyhow::Result<()> {
    use kafka::Contender;
    let all = [
        "consume-only",
        "produce-only",
        "mirror",
        "mirror-batches",
        "mm1",
        "mm1-tuned",
        "mm2",
        "batched-loop",
    ];
    let wanted: Vec<String> = if cli.kafka.contenders.is_empty() {
        all.iter().map(|s| (*s).to_owned()).collect()
    } else {
        cli.kafka.contenders.clone()
    };
    for w in &wanted {
        if !all.contains(&w.as_str()) {
            bail!(
                "--contenders: unknown contender {w:?} (one of {})",
                all.join(", ")
            );
        }
    }
    let has = |name: &str| wanted.iter().any(|w| w == name);
    let started = Instant::now();
    let mut bench = kafka::Bench::start(
        &cli.kafka,
        (cli.tuning.consumer.clone(), cli.tuning.producer.clone()),
        cli.records,
        cli.value_bytes,
        cli.partitions,
    )?;
    bench.preload()?;
    if !cli.kafka.throttle_bytes.is_empty() {
        // The throttle's passes only: the rate under each limit.
        let streams = cli.streams.first().copied().unwrap_or(1);
        for &limit in &cli.kafka.throttle_bytes {
            let r = bench.throttled(
                cli.kafka.throttle_contender,
                (limit > 0).then_some(limit),
                streams,
                cli.kafka.throttle_secs,
            )?;
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&cli.out)?;
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "brokers": "kafka",
                    "kafka": "3.9.2",
                    "throttle": r,
                    "records": cli.records,
                    "value_bytes": cli.value_bytes,
                    "partitions": cli.partitions,
                })
            )?;
        }
        bench.keep_logs();
        eprintln!("took {:.0} s", started.elapsed().as_secs_f64());
        return Ok(());
    }
    let mut results = Vec::new();
    if has("consume-only") {
        results.push(bench.run(Contender::ConsumeOnly, 1)?);
    }
    if has("produce-only") {
        results.push(bench.run(Contender::ProduceOnly, 1)?);
    }
    for &s in &cli.streams {
        if has("mirror") {
            results.push(bench.run(Contender::Mirror, s)?);
        }
        if has("mirror-batches") {
            results.push(bench.run(Contender::MirrorBatches, s)?);
        }
        if has("mm1") {
            results.push(bench.run(Contender::Mm1, s)?);
        }
        if has("mm2") {
            results.push(bench.run(Contender::Mm2, s)?);
        }
    }
    if has("mm1-tuned") {
        results.push(bench.run(Contender::Mm1Tuned, 1)?);
    }
    if has("batched-loop") {
        results.push(bench.run(Contender::BatchedLoop, 1)?);
    }
    bench.keep_logs();
    let line = serde_json::json!({
        "brokers": "kafka",
        "kafka": "3.9.2",
        "records": cli.records,
        "value_bytes": cli.value_bytes,
        "partitions": cli.partitions,
        "compression": cli.kafka.compression,
        "latency_rate": cli.kafka.latency_rate,
        "latency_secs": cli.kafka.latency_secs,
        "mm1_heap": kafka::MM1_HEAP.join(" "),
        "mm2_heap": kafka::MM2_HEAP.join(" "),
        "mirror_consumer": cli.tuning.consumer.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "mirror_producer": cli.tuning.producer.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "mm1_tuning": kafka::MM1_TUNING.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
        "wall_secs": started.elapsed().as_secs_f64(),
        "results": results,
    });
    if let Some(dir) = cli.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cli.out)?;
    writeln!(file, "{line}")?;
    eprintln!(
        "{} contenders in {:.0} s; results appended to {}",
        results.len(),
        started.elapsed().as_secs_f64(),
        cli.out.display()
    );
    Ok(())
}
