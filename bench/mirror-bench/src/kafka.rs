//! `mirror-bench --brokers kafka`: this mirror against Kafka's own mirrors (MirrorMaker 1 and
//! MirrorMaker 2 of Kafka 3.9.2), a batched hand-written loop, and the client limits
//! (consume-only, produce-only), on two Apache Kafka clusters (one broker each, loopback)
//! started by the benchmark, in one run.
//!
//! Every contender runs in its own process on the same preloaded backlog; before each pass the
//! target topic is deleted and created again (the source's partitions, `LogAppendTime`), so a
//! pass sees nothing of the one before. The steady window is read from the target's append
//! times (the first record appended to the last), so it costs the contenders nothing to
//! measure; CPU (user + system) and peak RSS are read from `/proc/<pid>` of the contender when
//! its last record is on the target. After each pass the target is checked: the record count,
//! and partition 0 record by record against the source; a lost record fails the benchmark.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use mirror_maker::mirror::flush::send_waiting;
use mirror_maker::settings::client::{ClientProps, Role};
use mirror_maker::settings::routing::TopicFilter;
use mirror_maker::settings::{Settings, SettingsOptions};
use mirror_maker::tools::compare::OwnedRecord;
pub use mirror_test_harness::kafka::MM2_HEAP;
use mirror_test_harness::kafka::{
    spawn_tied_to_this_process, KafkaCluster, KAFKA_3, MM2_ON_ONE_BROKER, TOOL_JVM,
};

/// The backlog's topic, on both clusters.
pub const TOPIC: &str = "bench";

/// The brokers' heap, as `kafka-server-start.sh` sets it; with `kafka-run-class.sh`'s
/// collector options ([`TOOL_JVM`]) it is the brokers' JVM.
const BROKER_HEAP: &[&str] = &["-Xmx1G", "-Xms1G"];

/// `kafka-mirror-maker.sh` sets no heap: `kafka-run-class.sh`'s default applies.
pub const MM1_HEAP: &[&str] = &["-Xmx256M"];

/// MirrorMaker 1's producer tuning as its users apply it: bigger batches, some linger, five
/// requests in flight (ordered by idempotence).
pub const MM1_TUNING: &[(&str, &str)] = &[
    ("batch.size", "262144"),
    ("linger.ms", "20"),
    ("max.in.flight.requests.per.connection", "5"),
    ("enable.idempotence", "true"),
];

#[derive(clap::Args, Clone, Debug)]
pub struct KafkaArgs {
    /// Source batches' compression (the preload producer's `compression.type`).
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// Seconds of the latency phase (records at --latency-rate through each mirror once its
    /// backlog is copied); 0 skips it.
    #[arg(long = "latency-secs", default_value_t = 20)]
    pub latency_secs: u64,
    /// Records per second in the latency phase.
    #[arg(long = "latency-rate", default_value_t = 1000)]
    pub latency_rate: u64,
    /// Contenders to run (default: all): consume-only, produce-only, mirror, mirror-batches,
    /// mm1, mm1-tuned, mm2, batched-loop.
    #[arg(long, value_delimiter = ',')]
    pub contenders: Vec<String>,
    /// The mirror binary (default: `mirror-maker` next to this executable).
    #[arg(long = "mirror-bin")]
    pub mirror_bin: Option<PathBuf>,
    /// Records the batched loop consumes before it produces, flushes and commits.
    #[arg(long = "loop-batch", default_value_t = 5000)]
    pub loop_batch: usize,
    /// Instead of the contenders: the mirror under each of these
    /// `--throttle.bytes.per.second` limits (0: unthrottled), its byte rate measured on the
    /// target over --throttle-secs (see [`Bench::throttled`]).
    #[arg(long = "throttle-bytes", value_delimiter = ',')]
    pub throttle_bytes: Vec<u64>,
    /// The measured window of each throttled pass, after a 2 s warm-up (the bucket's
    /// one-second burst is spent before the window opens).
    #[arg(long = "throttle-secs", default_value_t = 30)]
    pub throttle_secs: u64,
    /// The throttled passes' copy engine: `mirror` (records) or `mirror-batches` (the batch
    /// engine, which charges each batch its bytes as sent rather than keys and values).
    #[arg(long = "throttle-contender", default_value = "mirror")]
    pub throttle_contender: Contender,
}

/// One throttled pass: the limit, and the byte rate the target received.
#[derive(Debug, Serialize, Deserialize)]
pub struct ThrottleResult {
    /// `--throttle.bytes.per.second` (`None`: unthrottled).
    pub limit: Option<u64>,
    pub streams: u32,
    /// `mirror` or `mirror-batches` (absent in lines written before the batch engine took
    /// the throttle: `mirror`).
    #[serde(default)]
    pub contender: Option<Contender>,
    /// Source bytes (key, value: what the throttle charges) per second on the target.
    pub measured: f64,
    /// The window measured, in seconds (shorter than asked if the backlog ran out).
    pub window_secs: f64,
    pub records: i64,
    /// Whether the backlog ran out before the window closed.
    pub backlog_ran_out: bool,
    /// `mirror_throttled_seconds_total` when the window closed: how long the streams were
    /// paused by the limit, summed over streams, since the mirror started.
    pub throttled_secs: Option<f64>,
}

/// A free port on loopback, for a pass's `--metrics.addr`.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The value of the unlabelled sample `name` at `http://127.0.0.1:port/metrics`.
fn scraped(port: u16, name: &str) -> anyhow::Result<Option<f64>> {
    use std::io::Read;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    conn.read_to_string(&mut body)?;
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok()))
}

/// What ran in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    ConsumeOnly,
    ProduceOnly,
    Mirror,
    /// The same binary with `--copy.mode batches` (the batch engine).
    MirrorBatches,
    Mm1,
    Mm1Tuned,
    Mm2,
    BatchedLoop,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::ConsumeOnly => "consume-only",
            Contender::ProduceOnly => "produce-only",
            Contender::Mirror => "mirror",
            Contender::MirrorBatches => "mirror-batches",
            Contender::Mm1 => "mm1",
            Contender::Mm1Tuned => "mm1-tuned",
            Contender::Mm2 => "mm2",
            Contender::BatchedLoop => "batched-loop",
        }
    }

    fn copies(self) -> bool {
        !matches!(self, Contender::ConsumeOnly | Contender::ProduceOnly)
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct KafkaResult {
    pub contender: Contender,
    pub streams: u32,
    pub records: u64,
    /// Key and value bytes of the records.
    pub bytes: u64,
    /// The first record on the target to the last (append times), or, for consume-only, the
    /// first record consumed to the last.
    pub steady_secs: f64,
    /// The process's start to the last record.
    pub total_secs: f64,
    /// The process's start to the first record on the target (consume-only: consumed).
    pub first_record_secs: f64,
    /// User + system CPU of the process when its last record was on the target (start-up
    /// included).
    pub cpu_secs: f64,
    /// The CPU of the copy alone: from the first time records were seen on the target (polled
    /// every 50 ms) to the last; start-up and group join excluded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_cpu: Option<SteadyCpu>,
    /// The CPU of the second half of the backlog: from the first poll that finds at least half
    /// of the records on the target to the last. A JVM has compiled its hot code by then (its
    /// JIT threads are still counted apart), so this is the warmed-up figure. Not given when
    /// the copy was too fast for the polls to see its half: a window of less than a quarter
    /// of the backlog would be mostly the idle time until the last poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_half_cpu: Option<SteadyCpu>,
    pub peak_rss_kib: u64,
    /// The JVM's heap options (JVM contenders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap: Option<String>,
    /// Latency phase: target append time minus source append time, per record (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_records: Option<u64>,
    /// The machine's and the two brokers' CPU over the copy (the steady window; for a limit,
    /// its whole run): on a small machine the brokers can be what bounds a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brokers_cpu: Option<BrokersCpu>,
}

/// CPU seconds spent by the source and target brokers, and by the whole machine, over one
/// window of a pass.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct BrokersCpu {
    pub window_secs: f64,
    pub source_secs: f64,
    pub target_secs: f64,
    /// Every process's CPU on the machine (all cores): `/proc/stat` minus idle and iowait.
    pub machine_secs: f64,
}

/// CPU seconds so far: the source's brokers, the target's, and the machine's busy time.
#[derive(Clone, Copy)]
struct CpuMark {
    at: Instant,
    source: f64,
    target: f64,
    machine: f64,
}

impl CpuMark {
    fn now(source: &KafkaCluster, target: &KafkaCluster) -> CpuMark {
        let sum = |c: &KafkaCluster| {
            c.pids()
                .iter()
                .filter_map(|pid| stat_cpu(&format!("/proc/{pid}/stat")).ok())
                .sum()
        };
        CpuMark {
            at: Instant::now(),
            source: sum(source),
            target: sum(target),
            machine: machine_busy_secs().unwrap_or(0.0),
        }
    }

    fn until(self, end: CpuMark) -> BrokersCpu {
        BrokersCpu {
            window_secs: end.at.duration_since(self.at).as_secs_f64(),
            source_secs: end.source - self.source,
            target_secs: end.target - self.target,
            machine_secs: end.machine - self.machine,
        }
    }
}

/// Busy CPU seconds of the whole machine since boot (all cores): the first line of
/// `/proc/stat` without its idle and iowait ticks.
fn machine_busy_secs() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .context("an empty /proc/stat")?
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    // Guest time is counted in user time already.
    let busy: f64 = ticks.iter().take(8).sum::<f64>() - idle;
    Ok(busy / 100.0)
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SteadyCpu {
    pub cpu_secs: f64,
    /// Of which the JVM's JIT compiler threads (0 for other processes).
    #[serde(default)]
    pub jit_secs: f64,
    /// Records that reached the target meanwhile.
    pub records: u64,
}

/// The backlog's record `i`: an 8-byte key and a value of text words (compressible as log
/// lines are, so lz4 has something to do).
pub fn record_value(i: u64, bytes: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "order", "payment", "user", "id", "amount", "EUR", "status", "shipped", "created", "item",
        "sku", "price", "true", "false", "region", "eu-west",
    ];
    let mut v = format!("{i:012} ").into_bytes();
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while v.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(WORDS[(x % WORDS.len() as u64) as usize].as_bytes());
        v.push(if x & 0x100 == 0 { b' ' } else { b'=' });
    }
    v.truncate(bytes);
    v
}

fn admin(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()?)
}

fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

/// Creates `topic` (`partitions`, one replica, `LogAppendTime`), deleting it first when it
/// exists; retries while the broker still holds the deleted one.
fn recreate_topic(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin = admin(bootstrap)?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let _ = block_on(admin.delete_topics(&[topic], &options))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
            .set("message.timestamp.type", "LogAppendTime");
        let results = block_on(admin.create_topics(&[new], &options))??;
        match results.into_iter().next() {
            Some(Ok(_)) => break,
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Some(Err((t, e))) => bail!("creating topic {t} on {bootstrap}: {e}"),
            None => bail!("creating topic {topic} on {bootstrap}: no answer"),
        }
    }
    wait_for_leaders(bootstrap, topic, partitions)
}

fn wait_for_leaders(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let client = reader(bootstrap)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = client
            .fetch_metadata(Some(topic), Duration::from_secs(2))
            .is_ok_and(|md| {
                md.topics().first().is_some_and(|t| {
                    t.error().is_none()
                        && t.partitions().len() == partitions as usize
                        && t.partitions().iter().all(|p| p.leader() >= 0)
                })
            });
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("topic {topic} on {bootstrap} has no leaders after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reader(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        // Never joins or commits: assign() only; librdkafka wants a group for that.
        .set("group.id", "mirror-bench-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("log_level", "3")
        .create()?)
}

/// The high watermarks of `topic`'s partitions (each asked up to three times: the brokers
/// share the cores with the contenders and may answer late).
fn end_offsets(client: &BaseConsumer, topic: &str, partitions: i32) -> anyhow::Result<Vec<i64>> {
    (0..partitions)
        .map(|p| {
            let mut tries = 0;
            loop {
                match client.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                    Ok((_, high)) => return Ok(high),
                    Err(e) if tries >= 5 => {
                        bail!("asking for the watermarks of {topic}/{p}: {e:?}")
                    }
                    Err(_) => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            }
        })
        .collect()
}

fn ms(t: &Timestamp) -> Option<i64> {
    match *t {
        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
        Timestamp::NotAvailable => None,
    }
}

/// The earliest and the latest timestamp (ms since the epoch) of `topic`'s records: the first
/// and last record of each partition, whose append times bound the partition's.
fn first_and_last_append(bootstrap: &str, topic: &str, ends: &[i64]) -> anyhow::Result<(i64, i64)> {
    let client = reader(bootstrap)?;
    let read_at = |offsets: Vec<(i32, i64)>| -> anyhow::Result<Vec<i64>> {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &offsets {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
        }
        client.assign(&tpl)?;
        let mut got: HashMap<i32, i64> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < offsets.len() {
            if Instant::now() > deadline {
                bail!("reading the first and last records of {topic}: time-out");
            }
            if let Some(m) = client.poll(Duration::from_millis(200)) {
                let m = m?;
                let want = offsets.iter().find(|(p, _)| *p == m.partition());
                if want.is_some_and(|(_, o)| *o == m.offset()) {
                    got.insert(m.partition(), ms(&m.timestamp()).unwrap_or(0));
                }
            }
        }
        Ok(got.into_values().collect())
    };
    let non_empty: Vec<(i32, i64)> = ends
        .iter()
        .enumerate()
        .filter(|(_, e)| **e > 0)
        .map(|(p, e)| (p as i32, *e))
        .collect();
    let firsts = read_at(non_empty.iter().map(|(p, _)| (*p, 0)).collect())?;
    let lasts = read_at(non_empty.iter().map(|(p, e)| (*p, e - 1)).collect())?;
    Ok((
        firsts.into_iter().min().unwrap_or(0),
        lasts.into_iter().max().unwrap_or(0),
    ))
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

/// CPU seconds (user + system, all threads) and peak RSS (KiB) of a running process.
fn proc_usage(pid: u32) -> anyhow::Result<(f64, u64)> {
    let cpu = stat_cpu(&format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let peak = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    Ok((cpu, peak))
}

/// User + system CPU seconds in a `/proc/.../stat` file (a process's or a thread's).
fn stat_cpu(path: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("a /proc stat line")?
        .1
        .split_whitespace()
        .collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, man proc).
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // Clock ticks: the kernel's USER_HZ, 100 on Linux.
    Ok(ticks / 100.0)
}

/// How often a pass's target is polled for its records: the steady and second-half CPU
/// windows start at a poll.
const POLL_TARGET: Duration = Duration::from_millis(50);

/// CPU seconds per million records of a window, with the JIT threads, or "-" when not measured.
fn per_million(window: Option<SteadyCpu>) -> String {
    match window {
        Some(s) if s.records > 0 => format!("{:.2}", s.cpu_secs / s.records as f64 * 1e6),
        _ => "-".to_owned(),
    }
}

/// CPU seconds of a JVM's JIT compiler threads (`C1 CompilerThre…`, `C2 CompilerThre…`) that
/// are alive; 0 for other processes. A long-running JVM has compiled its hot code, so the
/// steady phase is also reported without them. A compiler thread that ended took its CPU
/// with it (it stays in the process's total): the figure can only be low.
fn jit_cpu(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("C1 Compiler") || c.starts_with("C2 Compiler"))
        })
        .filter_map(|t| stat_cpu(&t.path().join("stat").display().to_string()).ok())
        .sum()
}

/// Extra client properties (KEY, VALUE) for this mirror's passes: consumer, producer.
pub type Tuning = (Vec<(String, String)>, Vec<(String, String)>);

/// The benchmark's two clusters and what every pass shares.
pub struct Bench<'a> {
    args: &'a KafkaArgs,
    /// Extra consumer and producer properties for this mirror's passes.
    tuning: Tuning,
    records: u64,
    value_bytes: usize,
    partitions: i32,
    source: KafkaCluster,
    target: KafkaCluster,
    dir: tempfile::TempDir,
    pass: u32,
    /// Flags added to the mirror's command line in its passes.
    mirror_flags: Vec<String>,
}

impl<'a> Bench<'a> {
    pub fn start(
        args: &'a KafkaArgs,
        tuning: Tuning,
        records: u64,
        value_bytes: usize,
        partitions: i32,
    ) -> anyhow::Result<Bench<'a>> {
        let started = Instant::now();
        // Kafka's default (the test clusters use 0): members of a group that start together
        // join its first generation together. With 0, the first stream of a mirror takes every
        // partition and the others get theirs only after one or two more rebalances (a
        // heartbeat interval each), well into the pass.
        let source_extra: &[(&str, &str)] = &[("group.initial.rebalance.delay.ms", "3000")];
        let target_extra = [("auto.create.topics.enable", "false")];
        let broker_jvm: Vec<&str> = BROKER_HEAP.iter().chain(TOOL_JVM).copied().collect();
        let (source, target) = std::thread::scope(|s| {
            let target =
                s.spawn(|| KafkaCluster::start_with_jvm(KAFKA_3, 1, &target_extra, &broker_jvm));
            let source = KafkaCluster::start_with_jvm(KAFKA_3, 1, source_extra, &broker_jvm);
            (source, target.join())
        });
        let target = target.map_err(|_| anyhow::anyhow!("starting the target cluster failed"))?;
        eprintln!(
            "kafka {}: source {} and target {} up in {:.1} s",
            KAFKA_3.version(),
            source.bootstrap(),
            target.bootstrap(),
            started.elapsed().as_secs_f64()
        );
        for cluster in [&source, &target] {
            warm_up(&cluster.bootstrap())?;
        }
        Ok(Bench {
            args,
            tuning,
            records,
            value_bytes,
            partitions,
            source,
            target,
            dir: tempfile::Builder::new().prefix("mirror-bench-").tempdir()?,
            pass: 0,
            mirror_flags: Vec::new(),
        })
    }

    pub fn preload(&self) -> anyhow::Result<()> {
        let src = self.source.bootstrap();
        let admin = admin(&src)?;
        let new = NewTopic::new(TOPIC, self.partitions, TopicReplication::Fixed(1));
        for r in block_on(admin.create_topics(&[new], &AdminOptions::new()))?? {
            r.map_err(|(t, e)| anyhow::anyhow!("creating {t} on the source: {e}"))?;
        }
        wait_for_leaders(&src, TOPIC, self.partitions)?;
        let started = Instant::now();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &src)
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .set("batch.num.messages", "100000")
            .set("compression.type", &self.args.compression)
            .set("queue.buffering.max.messages", "1000000")
            .set("log_level", "3")
            .create()?;
        send_records(
            &producer,
            TOPIC,
            self.records,
            self.value_bytes,
            self.partitions,
            1,
            Values::Backlog,
        )?;
        producer.flush(Duration::from_secs(300))?;
        eprintln!(
            "preloaded {} records of {} B ({} batches) over {} partitions in {:.1} s",
            self.records,
            self.value_bytes,
            self.args.compression,
            self.partitions,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn bytes(&self) -> u64 {
        self.records * (self.value_bytes as u64 + 8)
    }

    /// With `BENCH_KEEP` set, keeps the passes' folders (configs and logs) and says where.
    pub fn keep_logs(self) {
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!(
                "passes' configs and logs kept in {}",
                self.dir.keep().display()
            );
        }
    }

    /// The mirror with `--throttle.bytes.per.second limit` (`None`: none) over the backlog:
    /// once records reach the target and 2 s more have passed (the bucket starts full: its
    /// one-second burst is spent then), the target's end offsets are read, and again
    /// `secs` later (or when the whole backlog is there, if sooner). The rate: records
    /// between the two readings times the bytes the throttle charges per record (its key and
    /// value), over the time between them. The target is not checked record by record
    /// here: the contenders' passes do that.
    pub fn throttled(
        &mut self,
        contender: Contender,
        limit: Option<u64>,
        streams: u32,
        secs: u64,
    ) -> anyhow::Result<ThrottleResult> {
        if !matches!(contender, Contender::Mirror | Contender::MirrorBatches) {
            bail!(
                "--throttle-contender {}: only mirror and mirror-batches take a throttle",
                contender.name()
            );
        }
        self.pass += 1;
        let dst = self.target.bootstrap();
        recreate_topic(&dst, TOPIC, self.partitions)?;
        let dir = self.dir.path().join(format!("pass-{}", self.pass));
        std::fs::create_dir_all(&dir)?;
        // Metrics on in every throttled pass, unthrottled too: the time throttled is read
        // from them (the contenders' passes run with metrics off).
        let port = free_port()?;
        self.mirror_flags = vec!["--metrics.addr".into(), format!("127.0.0.1:{port}")];
        if let Some(l) = limit {
            self.mirror_flags
                .extend(["--throttle.bytes.per.second".into(), l.to_string()]);
        }
        let (mut child, _) = self.spawn(contender, streams, &[TOPIC], &dir)?;
        self.mirror_flags.clear();
        let result = (|| -> anyhow::Result<ThrottleResult> {
            let client = reader(&dst)?;
            let total = |client: &BaseConsumer| -> anyhow::Result<i64> {
                Ok(end_offsets(client, TOPIC, self.partitions)?.iter().sum())
            };
            let first_seen = Instant::now();
            while total(&client)? == 0 {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "the mirror exited early ({status}); its log: {}",
                        dir.join("log").display()
                    );
                }
                if first_seen.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "no record on the target after 120 s; log: {}",
                        dir.join("log").display()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(Duration::from_secs(2));
            let (from, from_at) = (total(&client)?, Instant::now());
            let window = Duration::from_secs(secs);
            let (to, to_at) = loop {
                std::thread::sleep(Duration::from_millis(200));
                let (now, at) = (total(&client)?, Instant::now());
                if now as u64 >= self.records || at - from_at >= window {
                    break (now, at);
                }
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "the mirror exited early ({status}); its log: {}",
                        dir.join("log").display()
                    );
                }
            };
            let throttled_secs = scraped(port, "mirror_throttled_seconds_total")?;
            let window_secs = (to_at - from_at).as_secs_f64();
            let per_record = self.value_bytes as f64 + 8.0;
            Ok(ThrottleResult {
                limit,
                streams,
                contender: Some(contender),
                measured: (to - from) as f64 * per_record / window_secs,
                window_secs,
                records: to - from,
                backlog_ran_out: to as u64 >= self.records,
                throttled_secs,
            })
        })();
        stop(&mut child);
        let r = result?;
        eprintln!(
            "throttle {:>11} {} streams={streams}: {:>7.2} MB/s measured over {:.1} s ({} records){}{}",
            r.limit.map_or("none".to_owned(), |l| format!("{:.0} MB/s", l as f64 / 1e6)),
            contender.name(),
            r.measured / 1e6,
            r.window_secs,
            r.records,
            r.limit.map_or(String::new(), |l| format!(
                ", {:+.1}% of the limit",
                (r.measured / l as f64 - 1.0) * 100.0
            )),
            if r.backlog_ran_out { "; the backlog ran out before the window closed" } else { "" },
        );
        if let Some(paused) = r.throttled_secs {
            eprintln!("  paused by the throttle: {paused:.1} s summed over streams since start");
        }
        Ok(r)
    }

    /// Runs one contender's pass, checks the target, prints a line and returns the result.
    pub fn run(&mut self, contender: Contender, streams: u32) -> anyhow::Result<KafkaResult> {
        self.pass += 1;
        let (src, dst) = (self.source.bootstrap(), self.target.bootstrap());
        let lat_topic = format!("lat-{}", self.pass);
        let latency = contender.copies() && self.args.latency_secs > 0;
        if contender.copies() || contender == Contender::ProduceOnly {
            recreate_topic(&dst, TOPIC, self.partitions)?;
        }
        if latency {
            recreate_topic(&src, &lat_topic, self.partitions)?;
            recreate_topic(&dst, &lat_topic, self.partitions)?;
        }
        let topics: Vec<&str> = if latency {
            vec![TOPIC, &lat_topic]
        } else {
            vec![TOPIC]
        };
        let dir = self.dir.path().join(format!("pass-{}", self.pass));
        std::fs::create_dir_all(&dir)?;
        let spawned_at = SystemTime::now();
        let spawned = Instant::now();
        let (mut child, heap) = self.spawn(contender, streams, &topics, &dir)?;
        let pid = child.id();
        if std::env::var_os("BENCH_LOG").is_some() {
            eprintln!("{} started: pid {pid}", contender.name());
        }
        let result = (|| -> anyhow::Result<KafkaResult> {
            if !contender.copies() {
                // The limits measure themselves and exit.
                let started = CpuMark::now(&self.source, &self.target);
                let out = wait_output(&mut child, &dir, Duration::from_secs(600))?;
                let mut r: KafkaResult = serde_json::from_str(out.trim())
                    .with_context(|| format!("{} printed {out:?}", contender.name()))?;
                r.streams = streams;
                r.brokers_cpu = Some(started.until(CpuMark::now(&self.source, &self.target)));
                return Ok(r);
            }
            // Wait for the whole backlog on the target.
            let client = reader(&dst)?;
            let mut progress = (0, Instant::now());
            // CPU and records on the target when records were first seen there.
            let mut at_first: Option<(f64, f64, i64)> = None;
            // The same when half of them were.
            let mut at_half: Option<(f64, f64, i64)> = None;
            // The brokers' and the machine's CPU from then on.
            let mut brokers_at_first: Option<CpuMark> = None;
            let (cpu_secs, peak_rss_kib, ends, jit_at_end) = loop {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "{} exited early ({status}); its log: {}\n{}",
                        contender.name(),
                        dir.join("log").display(),
                        mirror_test_harness::kafka::tail(&dir.join("log"), 30)
                    );
                }
                let ends = end_offsets(&client, TOPIC, self.partitions)?;
                let total: i64 = ends.iter().sum();
                if total as u64 >= self.records {
                    let (cpu, rss) = proc_usage(pid)?;
                    break (cpu, rss, ends, jit_cpu(pid));
                }
                if at_first.is_none() && total > 0 {
                    at_first = Some((proc_usage(pid)?.0, jit_cpu(pid), total));
                    brokers_at_first = Some(CpuMark::now(&self.source, &self.target));
                }
                if at_half.is_none() && 2 * total as u64 >= self.records {
                    at_half = Some((proc_usage(pid)?.0, jit_cpu(pid), total));
                }
                if total != progress.0 {
                    progress = (total, Instant::now());
                } else if progress.1.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "{} stalled at {total} of {} records on the target; its log: {}",
                        contender.name(),
                        self.records,
                        dir.join("log").display()
                    );
                }
                std::thread::sleep(POLL_TARGET);
            };
            let (first, last) = first_and_last_append(&dst, TOPIC, &ends)?;
            let start = epoch_ms(spawned_at);
            let since = |(cpu, jit, seen): (f64, f64, i64)| SteadyCpu {
                cpu_secs: cpu_secs - cpu,
                jit_secs: jit_at_end - jit,
                records: self.records - seen as u64,
            };
            let mut r = KafkaResult {
                contender,
                streams,
                records: self.records,
                bytes: self.bytes(),
                steady_secs: (last - first).max(1) as f64 / 1000.0,
                total_secs: (last - start) as f64 / 1000.0,
                first_record_secs: (first - start) as f64 / 1000.0,
                cpu_secs,
                steady_cpu: at_first.map(since),
                second_half_cpu: at_half
                    .filter(|&(_, _, seen)| 4 * (self.records - seen as u64) >= self.records)
                    .map(since),
                peak_rss_kib,
                heap,
                latency_p50_ms: None,
                latency_p99_ms: None,
                latency_records: None,
                brokers_cpu: brokers_at_first
                    .map(|m| m.until(CpuMark::now(&self.source, &self.target))),
            };
            if latency {
                let lat = self.latency(&lat_topic, &mut child)?;
                r.latency_p50_ms = Some(lat.0);
                r.latency_p99_ms = Some(lat.1);
                r.latency_records = Some(lat.2);
            }
            Ok(r)
        })();
        let _ = spawned;
        stop(&mut child);
        let r = result?;
        if contender.copies() {
            self.check_target(contender)
                .with_context(|| format!("checking the target after {}", contender.name()))?;
        }
        eprintln!(
            "{:<13} streams={streams}: {:>9.0} records/s steady, {:>6.1} MB/s, {:>5.1} s total, first record after {:>5.1} s, {:>6.2} CPU s per million ({} steady, {} second half), {:>6.1} MB per CPU s, peak RSS {:>5} MiB{}{}",
            contender.name(),
            r.records as f64 / r.steady_secs,
            r.bytes as f64 / r.steady_secs / 1e6,
            r.total_secs,
            r.first_record_secs,
            r.cpu_secs / r.records as f64 * 1e6,
            per_million(r.steady_cpu),
            per_million(r.second_half_cpu),
            r.bytes as f64 / 1e6 / r.cpu_secs.max(1e-9),
            r.peak_rss_kib / 1024,
            match (r.latency_p50_ms, r.latency_p99_ms) {
                (Some(a), Some(b)) => format!(", latency p50 {a:.0} ms p99 {b:.0} ms"),
                _ => String::new(),
            },
            match r.brokers_cpu {
                Some(b) if b.window_secs > 0.0 => format!(
                    "; cores busy over the copy: source broker {:.2}, target broker {:.2}, \
                     machine {:.2}",
                    b.source_secs / b.window_secs,
                    b.target_secs / b.window_secs,
                    b.machine_secs / b.window_secs
                ),
                _ => String::new(),
            }
        );
        Ok(r)
    }

    fn spawn(
        &self,
        contender: Contender,
        streams: u32,
        topics: &[&str],
        dir: &Path,
    ) -> anyhow::Result<(Child, Option<String>)> {
        let (src, dst) = (self.source.bootstrap(), self.target.bootstrap());
        let log = std::fs::File::create(dir.join("log"))?;
        let group = format!("bench-{}-{}", contender.name(), self.pass);
        let whitelist = topics.join("|");
        let mut heap = None;
        let mut cmd = match contender {
            Contender::ConsumeOnly | Contender::ProduceOnly | Contender::BatchedLoop => {
                let mut cmd = Command::new(std::env::current_exe()?);
                cmd.args(["kafka-pass", contender.name()])
                    .args(["--source", &src, "--target", &dst, "--group", &group])
                    .args(["--topics", &topics.join(",")])
                    .args(["--records", &self.records.to_string()])
                    .args(["--value-bytes", &self.value_bytes.to_string()])
                    .args(["--partitions", &self.partitions.to_string()])
                    .args(["--loop-batch", &self.args.loop_batch.to_string()]);
                cmd
            }
            Contender::Mirror | Contender::MirrorBatches => {
                let c = dir.join("consumer.toml");
                let p = dir.join("producer.toml");
                let toml = |pairs: &[(String, String)]| -> String {
                    pairs
                        .iter()
                        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
                        .collect()
                };
                std::fs::write(
                    &c,
                    format!(
                        "bootstrap.servers = \"{src}\"\ngroup.id = \"{group}\"\n{}",
                        toml(&self.tuning.0)
                    ),
                )?;
                std::fs::write(
                    &p,
                    format!("bootstrap.servers = \"{dst}\"\n{}", toml(&self.tuning.1)),
                )?;
                let bin = match &self.args.mirror_bin {
                    Some(b) => b.clone(),
                    None => std::env::current_exe()?
                        .parent()
                        .context("the executable's folder")?
                        .join("mirror-maker"),
                };
                let mut cmd = Command::new(&bin);
                cmd.arg("--consumer.config")
                    .arg(&c)
                    .arg("--producer.config")
                    .arg(&p)
                    .args(["--whitelist", &whitelist])
                    .args(["--num.streams", &streams.to_string()])
                    .args(&self.mirror_flags)
                    .env(
                        "RUST_LOG",
                        std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
                    )
                    .env("NO_COLOR", "1");
                // Each contender names its engine: the default (`auto`) would give the
                // records contender the batch engine.
                cmd.args([
                    "--copy.mode",
                    if contender == Contender::MirrorBatches {
                        "batches"
                    } else {
                        "records"
                    },
                ]);
                cmd
            }
            Contender::Mm1 | Contender::Mm1Tuned => {
                let c = dir.join("consumer.properties");
                let p = dir.join("producer.properties");
                std::fs::write(
                    &c,
                    format!(
                        "bootstrap.servers={src}\ngroup.id={group}\nauto.offset.reset=earliest\n"
                    ),
                )?;
                let mut producer = format!("bootstrap.servers={dst}\n");
                if contender == Contender::Mm1Tuned {
                    for (k, v) in MM1_TUNING {
                        producer.push_str(&format!("{k}={v}\n"));
                    }
                }
                std::fs::write(&p, producer)?;
                heap = Some(MM1_HEAP.join(" "));
                let mut cmd = self.java(MM1_HEAP, &KAFKA_3.libs(), dir)?;
                cmd.arg("kafka.tools.MirrorMaker")
                    .arg("--consumer.config")
                    .arg(&c)
                    .arg("--producer.config")
                    .arg(&p)
                    .args(["--whitelist", &whitelist])
                    .args(["--num.streams", &streams.to_string()]);
                cmd
            }
            Contender::Mm2 => {
                // Fresh cluster aliases per pass: MM2's internal topics (offsets, configs,
                // status, offset syncs, checkpoints) are named after them, so a pass starts
                // from nothing.
                let (a, b) = (format!("src{}", self.pass), format!("dst{}", self.pass));
                let props = format!(
                    "clusters = {a}, {b}\n\
                     {a}.bootstrap.servers = {src}\n\
                     {b}.bootstrap.servers = {dst}\n\
                     {a}->{b}.enabled = true\n\
                     {a}->{b}.topics = {topics}\n\
                     replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n\
                     tasks.max = {streams}\n\
                     {MM2_ON_ONE_BROKER}",
                    topics = topics.join(", ")
                );
                let file = dir.join("mm2.properties");
                std::fs::write(&file, props)?;
                heap = Some(MM2_HEAP.join(" "));
                let mut cmd = self.java(MM2_HEAP, &mm2_libs()?, dir)?;
                cmd.arg("org.apache.kafka.connect.mirror.MirrorMaker")
                    .arg(&file);
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(if contender.copies() {
                Stdio::from(log.try_clone()?)
            } else {
                Stdio::piped()
            })
            .stderr(log);
        let child = spawn_tied_to_this_process(cmd)
            .with_context(|| format!("starting {}", contender.name()))?;
        Ok((child, heap))
    }

    /// `java` as Kafka's scripts run a tool: this heap, `kafka-run-class.sh`'s collector
    /// options, a log4j configuration (WARN to the pass's log).
    fn java(&self, heap: &[&str], libs: &Path, dir: &Path) -> anyhow::Result<Command> {
        let log4j = dir.join("log4j.properties");
        std::fs::write(
            &log4j,
            "log4j.rootLogger=WARN, stderr\n\
             log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n\
             log4j.appender.stderr.Target=System.err\n\
             log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n",
        )?;
        let mut cmd = Command::new(std::env::var_os("JAVA").unwrap_or_else(|| "java".into()));
        cmd.args(heap)
            .args(TOOL_JVM)
            .arg(format!("-Dlog4j.configuration=file:{}", log4j.display()))
            .arg("-cp")
            .arg(format!("{}/*", libs.display()));
        Ok(cmd)
    }

    /// Sends `--latency-rate` records per second to the source's `topic` for
    /// `--latency-secs`, waits for all of them on the target, and returns the p50 and p99 of
    /// target append time minus source append time (ms) and the count.
    fn latency(&self, topic: &str, child: &mut Child) -> anyhow::Result<(f64, f64, u64)> {
        let (src, dst) = (self.source.bootstrap(), self.target.bootstrap());
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &src)
            .set("linger.ms", "0")
            .set("log_level", "3")
            .create()?;
        let total = self.args.latency_rate * self.args.latency_secs;
        let started = Instant::now();
        let value = record_value(0, 100);
        for i in 0..total {
            // Paced: record i leaves at i / rate seconds.
            let due = started + Duration::from_secs_f64(i as f64 / self.args.latency_rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let key = i.to_be_bytes();
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition((i % self.partitions as u64) as i32)
                .key(key.as_slice())
                .payload(value.as_slice());
            producer
                .send(record)
                .map_err(|(e, _)| anyhow::anyhow!("latency record {i}: {e}"))?;
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(30))?;
        let client = reader(&dst)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("the mirror exited during the latency phase ({status})");
            }
            let got: i64 = end_offsets(&client, topic, self.partitions)?.iter().sum();
            if got as u64 >= total {
                break;
            }
            if Instant::now() > deadline {
                bail!("latency phase: {got} of {total} records on the target after 120 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let stamps = |bootstrap: &str| -> anyhow::Result<HashMap<Vec<u8>, i64>> {
            let mut out = HashMap::new();
            for p in 0..self.partitions {
                for r in mirror_maker::tools::compare::read_records(
                    bootstrap,
                    topic,
                    p,
                    Duration::from_secs(60),
                )? {
                    if let (Some(k), Some(t)) = (r.key, r.timestamp) {
                        out.entry(k).or_insert(t);
                    }
                }
            }
            Ok(out)
        };
        let source = stamps(&src)?;
        let target = stamps(&dst)?;
        let mut lat: Vec<i64> = source
            .iter()
            .filter_map(|(k, s)| target.get(k).map(|t| t - s))
            .collect();
        if (lat.len() as u64) < total {
            bail!(
                "latency phase: {} of {total} records found on the target",
                lat.len()
            );
        }
        lat.sort_unstable();
        let at = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize] as f64;
        Ok((at(0.5), at(0.99), lat.len() as u64))
    }

    /// Every record is on the target, and partition 0's records are all there, in order
    /// (key, value and headers; timestamps differ by design: the target topic stamps append
    /// times). MirrorMaker 1 places records by the hash of their key (its default message
    /// handler), not by source partition: for it, partition 0's records are looked for in the
    /// whole target topic, and their order is not checked (records of one key stay in order
    /// in one partition).
    fn check_target(&self, contender: Contender) -> anyhow::Result<()> {
        let (src, dst) = (self.source.bootstrap(), self.target.bootstrap());
        let client = reader(&dst)?;
        let total: i64 = end_offsets(&client, TOPIC, self.partitions)?.iter().sum();
        if (total as u64) < self.records {
            bail!(
                "MISSING RECORDS: the target holds {total} of {}",
                self.records
            );
        }
        let read = |bootstrap: &str, partition: i32| -> anyhow::Result<Vec<u64>> {
            Ok(mirror_maker::tools::compare::read_records(
                bootstrap,
                TOPIC,
                partition,
                Duration::from_secs(120),
            )?
            .iter()
            .map(content)
            .collect())
        };
        let source = read(&src, 0)?;
        let keeps_partitions = !matches!(contender, Contender::Mm1 | Contender::Mm1Tuned);
        let target = if keeps_partitions {
            read(&dst, 0)?
        } else {
            let mut all = Vec::new();
            for p in 0..self.partitions {
                all.extend(read(&dst, p)?);
            }
            all
        };
        let c = mirror_maker::tools::compare::compare(&source, &target);
        let differs = if keeps_partitions {
            c.lost > 0 || c.changed > 0 || !c.in_order
        } else {
            c.lost > 0
        };
        if differs {
            bail!("partition 0 differs from the source: {}", c.summary());
        }
        Ok(())
    }
}

/// A fingerprint of what a mirror must keep, timestamps aside.
fn content(r: &OwnedRecord) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&r.key, &r.value, &r.headers).hash(&mut h);
    h.finish()
}

/// Makes a cluster's internal topics (`__consumer_offsets`, `__transaction_state`) before the
/// first pass, which would otherwise wait for them ("coordinator load in progress"): an
/// idempotent producer writes a record, a consumer group reads it and commits.
fn warm_up(bootstrap: &str) -> anyhow::Result<()> {
    const WARM_UP: &str = "mirror-bench-warm-up";
    let admin = admin(bootstrap)?;
    let new = NewTopic::new(WARM_UP, 1, TopicReplication::Fixed(1));
    for r in block_on(admin.create_topics(&[new], &AdminOptions::new()))?? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t} on {bootstrap}: {e}"))?;
    }
    wait_for_leaders(bootstrap, WARM_UP, 1)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("log_level", "3")
        .create()?;
    producer
        .send(BaseRecord::<'_, [u8], [u8]>::to(WARM_UP).payload(b"warm-up".as_slice()))
        .map_err(|(e, _)| anyhow::anyhow!("warm-up record to {bootstrap}: {e}"))?;
    producer.flush(Duration::from_secs(120))?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", WARM_UP)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    consumer.subscribe(&[WARM_UP])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            m?;
            consumer.commit_consumer_state(CommitMode::Sync)?;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("warming up {bootstrap}: the warm-up record was not read within 120 s");
        }
    }
}

fn mm2_libs() -> anyhow::Result<PathBuf> {
    let script = mirror_test_harness::workspace_root().join("scripts/kafka-jars");
    let out = Command::new(&script)
        .arg("mm2-3.9.2")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("scripts/kafka-jars mm2-3.9.2 failed (needs mvn and Maven Central)");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// SIGTERM, then SIGKILL after 5 s (a JVM's orderly shutdown is not measured, and the
/// target is checked from the brokers); reaps the child.
fn stop(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

fn wait_output(child: &mut Child, dir: &Path, timeout: Duration) -> anyhow::Result<String> {
    let mut stdout = child.stdout.take().context("the pass's stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            let out = reader.join().unwrap_or_default();
            if !status.success() {
                bail!(
                    "the pass failed ({status}): {}",
                    mirror_test_harness::kafka::tail(&dir.join("log"), 30)
                );
            }
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("the pass did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `records` backlog records to `topic`, over the partitions in turn, `run` records to
/// each (1: round-robin; a mirror sends runs of records of one source partition, as fetched).
fn send_records(
    producer: &BaseProducer,
    topic: &str,
    records: u64,
    value_bytes: usize,
    partitions: i32,
    run: u64,
    values: Values,
) -> anyhow::Result<()> {
    // Produce-only makes no value per record (a mirror does not either): it cycles through
    // 4,096 made beforehand.
    let pool: Vec<Vec<u8>> = match values {
        Values::Backlog => Vec::new(),
        Values::Pool => (0..4096).map(|i| record_value(i, value_bytes)).collect(),
    };
    for i in 0..records {
        let key = i.to_be_bytes();
        let made;
        let value: &[u8] = match values {
            Values::Backlog => {
                made = record_value(i, value_bytes);
                &made
            }
            Values::Pool => &pool[(i % 4096) as usize],
        };
        let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition((i / run % partitions as u64) as i32)
            .key(key.as_slice())
            .payload(value);
        send_waiting(producer, record, None)
            .map_err(|e| anyhow::anyhow!("sending record {i} to {topic}: {e}"))?;
        producer.poll(Duration::ZERO);
    }
    Ok(())
}

/// The values [`send_records`] sends.
#[derive(Clone, Copy)]
enum Values {
    /// Record i's value is [`record_value`]`(i)`.
    Backlog,
    /// Values from a pool made beforehand (content not checked).
    Pool,
}

/// The arguments of one in-process pass on Kafka (`mirror-bench kafka-pass`).
#[derive(clap::Args)]
pub struct KafkaPassArgs {
    #[arg(value_enum)]
    contender: Contender,
    #[arg(long)]
    source: String,
    #[arg(long)]
    target: String,
    #[arg(long)]
    group: String,
    #[arg(long, value_delimiter = ',')]
    topics: Vec<String>,
    #[arg(long)]
    records: u64,
    #[arg(long)]
    value_bytes: usize,
    #[arg(long)]
    partitions: i32,
    #[arg(long)]
    loop_batch: usize,
}

/// The mirror's own client settings for these clusters (what the limits use).
fn mirror_settings(a: &KafkaPassArgs) -> anyhow::Result<Settings> {
    Ok(Settings::new(
        ClientProps::from_pairs(
            Role::Consumer,
            "bench consumer config",
            [
                ("bootstrap.servers", a.source.as_str()),
                ("group.id", a.group.as_str()),
            ],
        ),
        ClientProps::from_pairs(
            Role::Producer,
            "bench producer config",
            [("bootstrap.servers", a.target.as_str())],
        ),
        TopicFilter::new(TOPIC)?,
        SettingsOptions::default(),
    )?)
}

/// Runs a limit (consume-only, produce-only) or the batched loop; prints its result (the
/// limits) as JSON.
pub fn kafka_pass(a: &KafkaPassArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let bytes = a.records * (a.value_bytes as u64 + 8);
    let (first, last) = match a.contender {
        Contender::ConsumeOnly => {
            let mut config = mirror_settings(a)?.consumer.client_config();
            config.set("log_level", "3");
            let consumer: BaseConsumer = config.create()?;
            let (first, last) =
                crate::consume_all(&consumer, a.partitions, a.records, Duration::from_secs(60))?;
            (first.unwrap_or(started), last)
        }
        Contender::ProduceOnly => {
            let mut config = mirror_settings(a)?.producer.client_config();
            config.set("log_level", "3");
            let producer: BaseProducer = config.create()?;
            let first = Instant::now();
            // Runs of 500 records per partition, as a mirror gets them from its fetches.
            send_records(
                &producer,
                TOPIC,
                a.records,
                a.value_bytes,
                a.partitions,
                500,
                Values::Pool,
            )?;
            producer.flush(Duration::from_secs(600))?;
            (first, Instant::now())
        }
        Contender::BatchedLoop => return batched_loop(a),
        other => bail!("{} is not an in-process pass", other.name()),
    };
    let (cpu_secs, peak_rss_kib) = proc_usage(std::process::id())?;
    let r = KafkaResult {
        contender: a.contender,
        streams: 1,
        records: a.records,
        bytes,
        steady_secs: last.duration_since(first).as_secs_f64(),
        total_secs: last.duration_since(started).as_secs_f64(),
        first_record_secs: first.duration_since(started).as_secs_f64(),
        cpu_secs,
        steady_cpu: None,
        second_half_cpu: None,
        peak_rss_kib,
        heap: None,
        latency_p50_ms: None,
        latency_p99_ms: None,
        latency_records: None,
        brokers_cpu: None,
    };
    println!("{}", serde_json::to_string(&r)?);
    std::io::stdout().flush()?;
    Ok(())
}

/// The hand-written loop as a careful user writes it with rust-rdkafka (and as Kafka's
/// MirrorMaker 1 works): consume a batch, produce it, flush, commit; librdkafka's defaults
/// otherwise, idempotent `acks=all` producer. Runs until stopped.
fn batched_loop(a: &KafkaPassArgs) -> anyhow::Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a.source)
        .set("group.id", &a.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "3")
        .create()?;
    let pattern = format!("^({})$", a.topics.join("|"));
    consumer.subscribe(&[pattern.as_str()])?;
    let producer: BaseProducer<FailureCount> = ClientConfig::new()
        .set("bootstrap.servers", &a.target)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("log_level", "3")
        .create_with_context(FailureCount::default())?;
    loop {
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_millis(100);
        while n < a.loop_batch {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Some(m) = consumer.poll(wait) else { break };
            let m = m?;
            let mut record: BaseRecord<'_, [u8], [u8]> =
                BaseRecord::to(m.topic()).partition(m.partition());
            record.key = m.key();
            record.payload = m.payload();
            if let Some(t) = ms(&m.timestamp()) {
                record = record.timestamp(t);
            }
            if let Some(h) = m.headers() {
                record = record.headers(h.detach());
            }
            send_waiting(&producer, record, None)
                .map_err(|e| anyhow::anyhow!("producing to {}: {e}", m.topic()))?;
            n += 1;
        }
        if n > 0 {
            producer.flush(Duration::from_secs(60))?;
            let failed = producer.context().0.load(Ordering::Relaxed);
            if failed > 0 {
                bail!("{failed} records were not delivered: not committing");
            }
            consumer.commit_consumer_state(CommitMode::Sync)?;
        }
    }
}

/// Counts failed deliveries (the batched loop commits only when there are none).
#[derive(Default)]
struct FailureCount(AtomicU64);

impl ClientContext for FailureCount {}

impl ProducerContext for FailureCount {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}
