//! Trials on Apache Kafka: the mirror binary between real KRaft clusters started
//! from Maven Central's jars (see `tests/harness/src/kafka.rs`). Each trial asserts its guarantee
//! and prints a `TRIAL` line with its figures for docs/guarantees.md.

use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use mirror_maker::mirror::flush::send_waiting;
use mirror_maker::mirror::mapping::Translation;
use mirror_test_harness::dropin::*;
use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

use mirror_maker::tools::compare::OwnedRecord as Record;

const TOPIC: &str = "orders";

/// A producer to `bootstrap` with these settings.
fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().expect("a producer")
}

/// Sends one record (retrying while the queue is full).
fn send(p: &BaseProducer, topic: &str, partition: i32, r: &Record) {
    let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
    for (k, v) in &r.headers {
        headers = headers.insert(Header {
            key: k,
            value: v.as_deref(),
        });
    }
    let mut record: BaseRecord<'_, [u8], [u8]> =
        BaseRecord::to(topic).partition(partition).headers(headers);
    if let Some(t) = r.timestamp {
        record = record.timestamp(t);
    }
    record.key = r.key.as_deref();
    record.payload = r.value.as_deref();
    send_waiting(p, record, None)
        .unwrap_or_else(|e| panic!("producing to {topic}/{partition}: {e}"));
    p.poll(Duration::ZERO);
}

fn sample_record(i: u64, partitions: i32) -> (i32, Record) {
    let s = sample(i, partitions, 100);
    (
        s.partition,
        Record {
            key: s.key,
            value: s.value,
            headers: s.headers,
            timestamp: Some(s.timestamp),
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The harness itself.

const ORPHAN_HELPER: &str = "KAFKA_TRIALS_ORPHAN_HELPER";

/// Not a trial: the child process of `a_killed_test_process_leaves_no_jvm` (does nothing
/// unless that test runs it).
#[test]
fn orphan_check_helper() {
    if std::env::var_os(ORPHAN_HELPER).is_none() {
        return;
    }
    let cluster = KafkaCluster::start(KAFKA_4, 1);
    announce(&format!("JVMS {:?}", cluster.pids()));
    // Not a condition: the helper lives until its parent SIGKILLs it.
    std::thread::sleep(Duration::from_secs(120));
}

/// A test process that dies by SIGKILL (no destructor runs) leaves no JVM behind: each JVM has
/// PR_SET_PDEATHSIG set, so the kernel kills it with its parent.
#[test]
fn a_killed_test_process_leaves_no_jvm() {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args(["--exact", "orphan_check_helper", "--nocapture"])
        .env(ORPHAN_HELPER, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = spawn_tied_to_this_process(cmd).expect("starting the helper");
    let mut out = BufReader::new(child.stdout.take().expect("its stdout"));
    let pids = read_line_starting(&mut out, "JVMS ", Duration::from_secs(120))
        .expect("the helper started a cluster");
    let pids: Vec<u32> = pids
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert!(!pids.is_empty());
    assert!(pids.iter().all(|p| !process_gone(*p)), "the JVMs run");
    child.kill().expect("SIGKILL to the helper");
    child.wait().expect("reaping the helper");
    let killed = Instant::now();
    wait_until(Duration::from_secs(10), "the helper's JVMs to die", || {
        pids.iter().all(|p| process_gone(*p))
    });
    eprintln!(
        "TRIAL no-orphans: test process SIGKILLed, its JVMs {pids:?} gone after {:.2} s",
        killed.elapsed().as_secs_f64()
    );
}

/// Starts, SIGKILLs and restarts a node of a 3-node cluster; a topic of replication factor 3
/// stays writable and readable.
#[test]
fn a_three_node_cluster_survives_a_killed_node() {
    let mut cluster = KafkaCluster::start(KAFKA_4, 3);
    eprintln!(
        "TRIAL cluster-start: 3 nodes of Kafka {} in {:.1} s",
        cluster.version.version(),
        cluster.startup.as_secs_f64()
    );
    cluster.create_topic("replicated", 3, 3, &[("min.insync.replicas", "2")]);
    write_samples(&cluster.bootstrap(), "replicated", 0..300, 3, 100).unwrap();
    cluster.kill(2);
    write_samples(&cluster.bootstrap(), "replicated", 300..600, 3, 100).unwrap();
    let started = Instant::now();
    cluster.restart(2);
    eprintln!(
        "node 2 restarted in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    wait_until(Duration::from_secs(60), "node 2 back in sync", || {
        cluster.under_replicated("replicated", 3).is_empty()
    });
    let n: usize = (0..3)
        .map(|p| records(&cluster.bootstrap(), "replicated", p).len())
        .sum();
    assert_eq!(n, 600);
}

// ---------------------------------------------------------------------------------------------
// Fidelity.

/// Records with every odd field: null and empty keys and values, tombstones, repeated and
/// null-valued headers, empty header names and values, explicit CreateTime timestamps
/// (including 0 and one far in the future).
fn odd_records() -> Vec<Record> {
    let r =
        |key: Option<&[u8]>, value: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)], t| Record {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.map(<[u8]>::to_vec)))
                .collect(),
            timestamp: Some(t),
        };
    vec![
        r(None, None, &[], 1_600_000_000_000),
        r(Some(b""), Some(b""), &[], 1_600_000_000_001),
        r(Some(b"k"), None, &[], 1_600_000_000_002),
        r(None, Some(b"v"), &[("h", None)], 1_600_000_000_003),
        r(
            Some(b"k"),
            Some(b"v"),
            &[
                ("hop", Some(b"a")),
                ("hop", Some(b"b")),
                ("hop", None),
                ("hop", Some(b"")),
                ("", Some(b"x")),
            ],
            1,
        ),
        // (A timestamp of 0 means "now" to librdkafka's producer.)
        r(
            Some(&[0, 255, 0]),
            Some(&[0; 3000]),
            &[("bin", Some(&[0, 1, 255]))],
            1000,
        ),
        r(Some(b"late"), Some(b"clock"), &[], 1_900_000_000_000),
        r(
            Some(b"earlier"),
            Some(b"than the one before"),
            &[],
            1_600_000_000_000,
        ),
    ]
}

/// Every field of every record, partitions preserved, from source batches of every codec,
/// through a mirror whose producer compresses with zstd: the record engine's target batches
/// are zstd; the batch engine forwards the source's batches as they are (same record counts,
/// same codecs).
fn fidelity(version: KafkaVersion, mode: CopyMode) {
    const PARTITIONS: i32 = 3;
    let started = Instant::now();
    let pair = SharedPair::get(version);
    let topic = mode.named("fidelity");
    let lane = pair.lane(topic, PARTITIONS);
    let src = lane.src();
    let odd = producer(&src, &[("compression.type", "none"), ("linger.ms", "5")]);
    for (i, r) in odd_records().iter().enumerate() {
        send(&odd, topic, i as i32 % PARTITIONS, r);
    }
    odd.flush(Duration::from_secs(30)).unwrap();
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    for (c, codec) in codecs.iter().enumerate() {
        let p = producer(&src, &[("compression.type", codec), ("linger.ms", "20")]);
        for i in c as u64 * 1000..(c as u64 + 1) * 1000 {
            let (partition, r) = sample_record(i, PARTITIONS);
            send(&p, topic, partition, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
    }
    let mut mirror = lane
        .mirror()
        .copy_mode(mode)
        .producer(&[("compression.type", "zstd")])
        .commit_ms(300)
        .start();
    let end = lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    // The source holds every odd record (a broker may refuse a timestamp it finds too far
    // off: delivery reports are not read above).
    let all: Vec<Record> = (0..PARTITIONS)
        .flat_map(|p| lane.source_records(p))
        .collect();
    let refused: Vec<(Option<Vec<u8>>, Option<i64>)> = odd_records()
        .into_iter()
        .filter(|r| !all.contains(r))
        .map(|r| (r.key, r.timestamp))
        .collect();
    assert!(
        refused.is_empty(),
        "the source lacks these (key, timestamp): {refused:?}"
    );
    let mut source_codecs = std::collections::BTreeSet::new();
    let mut checked = 0;
    for p in 0..PARTITIONS {
        let s = lane.source_records(p);
        let t = lane.target_records(topic, p);
        assert_eq!(s.len() as i64, end[p as usize]);
        assert!(
            s == t,
            "partition {p} differs: {}",
            first_difference(&s, &t)
        );
        checked += s.len();
        let source_batches = pair.source.stored_batches(topic, p);
        source_codecs.extend(source_batches.iter().map(|b| b.codec));
        let target_batches = pair.target.stored_batches(topic, p);
        match mode {
            // librdkafka sends a batch uncompressed when compressing would not shrink it
            // (seen: a batch of 3 records, 140 bytes).
            CopyMode::Records => assert!(
                target_batches
                    .iter()
                    .all(|b| b.codec == "zstd" || (b.codec == "none" && b.size < 1024))
                    && target_batches.iter().any(|b| b.codec == "zstd"),
                "the target's batches are not zstd: {target_batches:?}"
            ),
            CopyMode::Batches => {
                let shape = |b: &StoredBatch| (b.last_offset - b.base_offset, b.codec);
                let s: Vec<_> = source_batches.iter().map(shape).collect();
                let t: Vec<_> = target_batches.iter().map(shape).collect();
                assert_eq!(
                    s, t,
                    "partition {p}: the target's batches are not the source's"
                );
            }
        }
    }
    let expected: std::collections::BTreeSet<_> = ["none", "gzip", "snappy", "lz4", "zstd"].into();
    assert_eq!(source_codecs, expected);
    eprintln!(
        "TRIAL fidelity kafka {} {}: {checked} records (odd fields, source batches {:?}, target {}) \
         identical field by field in 3 partitions, {:.0} s",
        version.version(),
        mode.flag(),
        source_codecs,
        match mode {
            CopyMode::Records => "zstd",
            CopyMode::Batches => "the source's batches",
        },
        started.elapsed().as_secs_f64()
    );
}

fn first_difference(s: &[Record], t: &[Record]) -> String {
    if s.len() != t.len() {
        return format!("{} source records, {} target records", s.len(), t.len());
    }
    s.iter()
        .zip(t)
        .position(|(a, b)| a != b)
        .map(|i| {
            format!(
                "record {i}: (key, timestamp, headers) {:?} and {:?}",
                (&s[i].key, s[i].timestamp, &s[i].headers),
                (&t[i].key, t[i].timestamp, &t[i].headers)
            )
        })
        .unwrap_or_default()
}

#[test]
fn fidelity_on_kafka_4() {
    fidelity(KAFKA_4, CopyMode::Records);
}

#[test]
fn fidelity_on_kafka_3() {
    fidelity(KAFKA_3, CopyMode::Records);
}

#[test]
fn fidelity_on_kafka_4_with_batches() {
    fidelity(KAFKA_4, CopyMode::Batches);
}

#[test]
fn fidelity_on_kafka_3_with_batches() {
    fidelity(KAFKA_3, CopyMode::Batches);
}

/// Kafka 2.8 (ZooKeeper mode), the oldest line the batch engine claims, as a source and
/// target: a migration off an old cluster.
#[test]
fn fidelity_on_kafka_2() {
    fidelity(KAFKA_2, CopyMode::Records);
}

#[test]
fn fidelity_on_kafka_2_with_batches() {
    fidelity(KAFKA_2, CopyMode::Batches);
}

/// Kafka's default `auto.create.topics.enable=true` on the target: the mirror must still create
/// the target topic with the source's partition count and configs.
#[test]
fn a_target_with_auto_create_gets_the_source_partitions() {
    target_with_auto_create(CopyMode::Records);
}

/// The same with the batch engine, whose own Metadata requests to the target must not let the
/// broker create the topic with its defaults before the mirror creates it.
#[test]
fn a_target_with_auto_create_gets_the_source_partitions_with_batches() {
    target_with_auto_create(CopyMode::Batches);
}

fn target_with_auto_create(mode: CopyMode) {
    let started = Instant::now();
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[("auto.create.topics.enable", "true")],
        TOPIC,
        3,
        &[("retention.ms", "123456789")],
    );
    pair.write(0..300);
    pair.mirror_until_committed(&["--copy.mode", mode.flag()], 300);
    let configs = topic_configs(&pair.dst(), TOPIC);
    assert!(
        configs.contains(&("retention.ms".into(), "123456789".into())),
        "{configs:?}"
    );
    let c = pair.compare();
    eprintln!(
        "TRIAL auto-create kafka 4.4.0 {}: target topic made with the source's configs, {}, \
         {:.0} s",
        mode.flag(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(c.is_exact() && c.source == 300, "{c:?}");
}

/// A LogAppendTime source topic: the target must hold each record with the source's append
/// time as its timestamp (the time the record entered the mirrored system), not the time the
/// mirror wrote it.
#[test]
fn a_log_append_time_source_keeps_its_timestamps() {
    log_append_time_source(CopyMode::Records);
}

/// The same with the batch engine, which encodes each LogAppendTime batch again with the append
/// time as each record's CreateTime. Source orders/1 offset 1 repeats the header key `hop` (3
/// headers, 2 distinct keys): its batch is encoded again like the others, every header kept in
/// order (the records compared field by field).
#[test]
fn a_log_append_time_source_keeps_its_timestamps_with_batches() {
    log_append_time_source(CopyMode::Batches);
}

fn log_append_time_source(mode: CopyMode) {
    let started = Instant::now();
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[],
        TOPIC,
        2,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    pair.write(0..500);
    // Not a condition: time passes, so that the target's append times would be later than
    // every source append time.
    std::thread::sleep(Duration::from_millis(1500));
    pair.mirror_until_committed(&["--copy.mode", mode.flag()], 500);
    let target_type = topic_configs(&pair.dst(), TOPIC)
        .into_iter()
        .find(|(k, _)| k == "message.timestamp.type");
    eprintln!("target topic: {target_type:?}");
    let mut checked = 0;
    for p in 0..2 {
        let s = pair.source_records(p);
        let t = pair.target_records(pair.topic, p);
        assert!(
            s.iter().all(|r| r.timestamp > Some(1_700_000_100_000)),
            "the source did not stamp append times"
        );
        assert!(s == t, "partition {p}: {}", first_difference(&s, &t));
        checked += s.len();
    }
    eprintln!(
        "TRIAL log-append-time kafka 4.4.0 {}: {checked} records keep the source's append \
         times, {:.0} s",
        mode.flag(),
        started.elapsed().as_secs_f64()
    );
}

/// A record whose batch is exactly the target topic's `max.message.bytes` is mirrored (the
/// producer's `message.max.bytes` set to the same limit, as an operator would).
#[test]
fn a_record_at_the_target_topics_max_message_bytes_is_mirrored() {
    record_at_max_message_bytes(CopyMode::Records);
}

/// The same with the batch engine: the source's batch of exactly the limit forwarded as it is.
#[test]
fn a_record_at_the_target_topics_max_message_bytes_is_mirrored_with_batches() {
    record_at_max_message_bytes(CopyMode::Batches);
}

fn record_at_max_message_bytes(mode: CopyMode) {
    const LIMIT: usize = 1_000_000;
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[],
        TOPIC,
        1,
        &[("max.message.bytes", "1000000")],
    );
    let p = producer(
        &pair.src(),
        &[("message.max.bytes", "1000000"), ("linger.ms", "0")],
    );
    // A batch of one record with a null key, no headers and a value of V bytes (V needing a
    // 3-byte varint) takes V + 72 bytes on disk (measured; 61 of them are the batch header).
    let big = Record {
        key: None,
        value: Some(vec![b'x'; LIMIT - 72]),
        headers: vec![],
        timestamp: Some(1_700_000_000_000),
    };
    let small = |i: u8| Record {
        key: Some(vec![i]),
        value: Some(vec![i; 10]),
        headers: vec![],
        timestamp: Some(1_700_000_000_000),
    };
    send(&p, TOPIC, 0, &small(1));
    p.flush(Duration::from_secs(30)).unwrap();
    send(&p, TOPIC, 0, &big);
    p.flush(Duration::from_secs(30)).unwrap();
    send(&p, TOPIC, 0, &small(2));
    p.flush(Duration::from_secs(30)).unwrap();
    let sizes: Vec<usize> = pair
        .source
        .stored_batches(TOPIC, 0)
        .iter()
        .map(|b| b.size)
        .collect();
    assert!(
        sizes.contains(&LIMIT),
        "no batch of {LIMIT} bytes: {sizes:?}"
    );
    let mut mirror = pair
        .mirror()
        .copy_mode(mode)
        .consumer(&[("fetch.message.max.bytes", "1048576")])
        .producer(&[
            ("message.max.bytes", "1000000"),
            ("compression.type", "none"),
        ])
        .commit_ms(300)
        .start();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let configs = topic_configs(&pair.dst(), TOPIC);
    assert!(configs.contains(&("max.message.bytes".into(), "1000000".into())));
    let (s, t) = (pair.source_records(0), pair.target_records(pair.topic, 0));
    assert!(s == t, "{}", first_difference(&s, &t));
    let target_sizes: Vec<usize> = pair
        .target
        .stored_batches(TOPIC, 0)
        .iter()
        .map(|b| b.size)
        .collect();
    eprintln!(
        "TRIAL {mode:?} max-message-bytes kafka 4.4.0: source batches {sizes:?} bytes, target batches \
         {target_sizes:?} bytes (limit {LIMIT}), 3 records identical"
    );
    assert!(target_sizes.contains(&LIMIT), "{target_sizes:?}");
}

/// What a target topic whose `message.timestamp.before.max.ms` (60 s) is tighter than the
/// source's (Kafka's default, unbounded) does to source records an hour old: `check`'s output,
/// then the mirror's exit code and last log line.
struct TighterTimestamps {
    check: String,
    exit: Option<i32>,
    last_line: String,
}

fn tighter_timestamps(mode: CopyMode) -> &'static TighterTimestamps {
    static RECORDS: std::sync::OnceLock<Result<TighterTimestamps, String>> =
        std::sync::OnceLock::new();
    static BATCHES: std::sync::OnceLock<Result<TighterTimestamps, String>> =
        std::sync::OnceLock::new();
    let outcome = match mode {
        CopyMode::Records => &RECORDS,
        CopyMode::Batches => &BATCHES,
    };
    scenario_once(outcome, || {
        let pair = KafkaPair::new(KAFKA_4, TOPIC, 1);
        pair.target
            .create_topic(TOPIC, 1, 1, &[("message.timestamp.before.max.ms", "60000")]);
        let hour_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 3_600_000;
        let p = producer(&pair.src(), &[("linger.ms", "0")]);
        for i in 0..3u8 {
            let r = Record {
                key: Some(vec![i]),
                value: Some(vec![i; 10]),
                headers: vec![],
                timestamp: Some(hour_ago),
            };
            send(&p, TOPIC, 0, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
        let dir = tempdir();
        let (c, pc) = mirror_configs(dir.path(), &pair.src(), &pair.dst(), &[], &[]);
        let out = binary()
            .arg("check")
            .arg("--consumer.config")
            .arg(&c)
            .arg("--producer.config")
            .arg(&pc)
            .args(["--whitelist", TOPIC])
            .output()
            .expect("running check");
        let check = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut mirror = pair.mirror().copy_mode(mode).commit_ms(300).start();
        let exit = mirror.wait(Duration::from_secs(60)).code();
        let log = mirror.log();
        let last_line = log.lines().last().unwrap_or_default().to_owned();
        TighterTimestamps {
            check,
            exit,
            last_line,
        }
    })
}

#[test]
fn a_target_refusing_old_timestamps_stops_the_mirror_naming_the_setting() {
    target_refusing_old_timestamps(CopyMode::Records);
}

#[test]
fn a_target_refusing_old_timestamps_stops_the_mirror_naming_the_setting_with_batches() {
    target_refusing_old_timestamps(CopyMode::Batches);
}

fn target_refusing_old_timestamps(mode: CopyMode) {
    let outcome = tighter_timestamps(mode);
    assert_eq!(outcome.exit, Some(1), "last line: {}", outcome.last_line);
    let line = &outcome.last_line;
    // The record engine names the refused record; the batch engine the refused batch, by its
    // first and last source offsets.
    let refused = match mode {
        CopyMode::Records => "orders/0 offset 0",
        CopyMode::Batches => "orders/0 offsets 0 to ",
    };
    assert!(
        line.contains(refused)
            && line.contains("message.timestamp.before.max.ms")
            && line.contains("message.timestamp.after.max.ms"),
        "last line: {line}"
    );
}

#[test]
fn check_warns_of_a_target_topic_with_a_tighter_timestamp_bound() {
    let check = &tighter_timestamps(CopyMode::Records).check;
    assert!(
        check.lines().any(|l| l.starts_with("warning:")
            && l.contains("orders")
            && l.contains("message.timestamp.before.max.ms")
            && l.contains("60000")
            && l.contains("9223372036854775807")),
        "check:\n{check}"
    );
}

/// A target topic made beforehand with a `max.message.bytes` (64 KiB) far below the producer's
/// default `batch.size` (1,000,000): the producer builds batches that topic takes (librdkafka
/// never splits a batch the broker refuses), so every record is copied, in order, and the
/// mirror says once why its batches are smaller.
#[test]
fn a_target_topic_that_takes_smaller_batches_gets_every_record() {
    const RECORDS: u64 = 3000;
    const LIMIT: usize = 64 * 1024;
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 1);
    pair.target
        .create_topic(TOPIC, 1, 1, &[("max.message.bytes", "65536")]);
    let p = producer(&pair.src(), &[("linger.ms", "20")]);
    for i in 0..RECORDS {
        let (_, mut r) = sample_record(i, 1);
        r.value = Some(vec![b'a' + (i % 26) as u8; 1024]);
        send(&p, TOPIC, 0, &r);
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let checked = pair.check(&[]);
    assert!(
        checked.contains(
            "producer batch.size capped at 65536, the max.message.bytes of target topic orders"
        ),
        "check:\n{checked}"
    );
    let started = Instant::now();
    let mut mirror = pair
        .mirror()
        .commit_ms(300)
        .flag("--sync.topic.configs", "false")
        .start();
    pair.wait_caught_up(&mut mirror);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let (s, t) = (pair.source_records(0), pair.target_records(pair.topic, 0));
    assert!(s == t, "{}", first_difference(&s, &t));
    let largest = pair
        .target
        .stored_batches(TOPIC, 0)
        .iter()
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    eprintln!(
        "TRIAL smaller-batches kafka 4.4.0: {RECORDS} records of 1 KiB to a target topic with \
         max.message.bytes {LIMIT}: all copied in {seconds:.1} s, largest target batch \
         {largest} bytes"
    );
    assert!(largest <= LIMIT, "a target batch of {largest} bytes");
    let said = log.matches("batch.size capped at").count();
    assert_eq!(said, 1, "the cap said {said} times; log:\n{log}");
}

// ---------------------------------------------------------------------------------------------
// Hard kills and clean hand-overs.

/// Per partition: lost, changed and order asserted; duplicates counted.
fn compare_each(pair: &KafkaPair) -> Comparison {
    let mut total = Comparison {
        in_order: true,
        ..Comparison::default()
    };
    for (p, c) in compare_partitions(pair).iter().enumerate() {
        assert!(
            c.lost == 0 && c.changed == 0 && c.in_order,
            "partition {p}: {c:?}"
        );
        total.add(c);
    }
    total
}

/// Each partition's comparison of source and target.
fn compare_partitions(pair: &KafkaPair) -> Vec<Comparison> {
    (0..pair.partitions)
        .map(|p| {
            let read = |bootstrap: &str| {
                mirror_maker::tools::compare::read_partition(
                    bootstrap,
                    pair.topic,
                    p,
                    Duration::from_secs(60),
                )
                .expect("reading a partition")
            };
            mirror_maker::tools::compare::compare(&read(&pair.src()), &read(&pair.dst()))
        })
        .collect()
}

/// What the hard-kill trial saw: at least 10 SIGKILLs of the mirror while a writer keeps
/// adding records, then a last mirror that catches up.
///
/// One run of the trial (a Kafka pair and a minute of load) serves the four tests that follow,
/// each asserting one guarantee on it ([`scenario_once`]): running it once per guarantee would
/// add minutes of CI on 2 cores for the same observations.
struct HardKills {
    /// Per kill: the group's committed offsets on the source, per partition.
    kill_points: Vec<Vec<i64>>,
    /// Per kill: partitions whose source commit passed what the offset mapping held.
    unmapped_at_kills: Vec<String>,
    /// Records written in all, and the source's end offsets at the end.
    written: u64,
    end: Vec<i64>,
    /// Per partition, once the last mirror caught up.
    comparisons: Vec<Comparison>,
    /// For each offset a group could have committed: partition, source offset, its target
    /// offset in the mapping (or what the mapping said instead), the latest lossless resume
    /// there, and how many records a group resuming there reads again.
    translations: Vec<Translated>,
}

/// Partition, source offset, its target offset in the mapping (or what the mapping said
/// instead), the latest lossless resume, and how many records a group resuming there reads
/// again.
type Translated = (i32, i64, Result<i64, String>, i64, usize);

const HARD_KILLS: usize = 10;

fn hard_kills(mode: CopyMode) -> &'static HardKills {
    static RECORDS: std::sync::OnceLock<Result<HardKills, String>> = std::sync::OnceLock::new();
    static BATCHES: std::sync::OnceLock<Result<HardKills, String>> = std::sync::OnceLock::new();
    let outcome = match mode {
        CopyMode::Records => &RECORDS,
        CopyMode::Batches => &BATCHES,
    };
    scenario_once(outcome, || {
        const PARTITIONS: i32 = 8;
        let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
        pair.write(0..20_000);
        let trickle = pair.trickle(20_000, 100);
        let instance = pair
            .mirror()
            .copy_mode(mode)
            .consumer(&[
                ("session.timeout.ms", "2000"),
                ("heartbeat.interval.ms", "300"),
            ])
            .commit_ms(200);
        let mut rng = Rng(0x5eed_1234_abcd_0011);
        let started = Instant::now();
        let mut kill_points: Vec<Vec<i64>> = Vec::new();
        let mut unmapped_at_kills = Vec::new();
        for kill in 0..HARD_KILLS {
            let mut mirror = instance.start();
            wait_until(
                Duration::from_secs(60),
                "the mirror to get partitions",
                || mirror.log().contains("assigned") || !mirror.is_running(),
            );
            assert!(mirror.is_running(), "log:\n{}", mirror.log());
            // Not a condition: the kill comes at a random moment of the copy.
            std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
            mirror.signal("KILL");
            mirror.wait(Duration::from_secs(10));
            let committed = committed(&pair.src(), TOPIC, PARTITIONS);
            let mapping = stored_mapping(&pair.dst());
            for (p, &c) in committed.iter().enumerate().filter(|(_, &c)| c > 0) {
                let progress = mapping.progress(TOPIC, p as i32).map(|pr| pr.next);
                if progress.is_none_or(|next| next < c) {
                    unmapped_at_kills.push(format!(
                        "kill {kill}, partition {p}: committed {c} on the source, the mapping \
                         holds {progress:?}"
                    ));
                }
            }
            kill_points.push(committed);
        }
        let written = trickle.stop();
        let mut last = instance.start();
        let end = pair.wait_caught_up(&mut last);
        assert_eq!(last.stop().code(), Some(0), "log:\n{}", last.log());
        let comparisons = compare_partitions(&pair);
        // (`add` keeps `in_order` only while every partition's is true.)
        let mut total = Comparison {
            in_order: true,
            ..Comparison::default()
        };
        comparisons.iter().for_each(|c| total.add(c));
        let committed_at_kills: Vec<i64> = kill_points
            .iter()
            .map(|k| k.iter().map(|c| c.max(&0)).sum())
            .collect();
        eprintln!(
            "TRIAL hard-kills kafka 4.4.0 {}: {HARD_KILLS} SIGKILLs (committed at each: \
             {committed_at_kills:?}), {}, {:.0} s",
            mode.flag(),
            total.summary(),
            started.elapsed().as_secs_f64()
        );
        // After ten restarts the target holds copies made twice: for each offset a group could
        // have committed (the restart points among them), what the mapping translates it to.
        let mapping = stored_mapping(&pair.dst());
        let mut translations = Vec::new();
        for p in 0..PARTITIONS {
            let copied = copied_from(&pair.src(), &pair.dst(), TOPIC, p);
            let mut offsets: Vec<i64> = kill_points.iter().map(|k| k[p as usize]).collect();
            offsets.extend([0, 1, end[p as usize] / 2, end[p as usize]]);
            for offset in offsets.into_iter().filter(|&o| o >= 0) {
                let at = match &mapping.translate(TOPIC, p, offset)[..] {
                    [Translation::Exact { offset: at, .. }] => Ok(*at),
                    other => Err(format!("{other:?}")),
                };
                let lossless = latest_lossless_resume(&copied, offset);
                let read_again = at.as_ref().map_or(0, |&at| {
                    copied
                        .iter()
                        .filter(|&&(t, s)| t >= at && s < offset)
                        .count()
                });
                translations.push((p, offset, at, lossless, read_again));
            }
        }
        HardKills {
            kill_points,
            unmapped_at_kills,
            written,
            end,
            comparisons,
            translations,
        }
    })
}

/// The source commit never passes what the offset mapping holds: a kill at any moment leaves
/// no committed record unmapped on the target.
#[test]
fn a_hard_kill_at_any_moment_leaves_no_committed_record_unmapped() {
    hard_kills_leave_no_committed_record_unmapped(CopyMode::Records);
}

#[test]
fn a_hard_kill_at_any_moment_leaves_no_committed_record_unmapped_with_batches() {
    hard_kills_leave_no_committed_record_unmapped(CopyMode::Batches);
}

fn hard_kills_leave_no_committed_record_unmapped(mode: CopyMode) {
    let trial = hard_kills(mode);
    assert!(
        trial.unmapped_at_kills.is_empty(),
        "{:#?}",
        trial.unmapped_at_kills
    );
}

/// Nothing lost or changed, order kept per partition; duplicates (the records acknowledged by
/// the target after the last commit before each kill) counted, not refused.
#[test]
fn hard_kills_during_a_steady_load_lose_nothing() {
    hard_kills_lose_nothing(CopyMode::Records);
}

#[test]
fn hard_kills_during_a_steady_load_lose_nothing_with_batches() {
    hard_kills_lose_nothing(CopyMode::Batches);
}

fn hard_kills_lose_nothing(mode: CopyMode) {
    let trial = hard_kills(mode);
    assert_eq!(trial.end.iter().sum::<i64>() as u64, trial.written);
    let mut total = Comparison::default();
    for (p, c) in trial.comparisons.iter().enumerate() {
        assert!(
            c.lost == 0 && c.changed == 0 && c.in_order,
            "partition {p}: {c:?}"
        );
        total.add(c);
    }
    assert_eq!(
        (total.source, total.lost, total.changed),
        (trial.written, 0, 0),
        "{total:?}"
    );
}

/// After the kills, every offset a group could have committed translates to one target
/// offset, at or before the latest that loses nothing (from there the target holds every
/// source record from that offset on).
#[test]
fn after_hard_kills_a_translated_group_offset_loses_no_record() {
    translated_offsets_lose_no_record(CopyMode::Records);
}

#[test]
fn after_hard_kills_a_translated_group_offset_loses_no_record_with_batches() {
    translated_offsets_lose_no_record(CopyMode::Batches);
}

fn translated_offsets_lose_no_record(mode: CopyMode) {
    let trial = hard_kills(mode);
    for (p, offset, at, lossless, _) in &trial.translations {
        let at = at.as_ref().unwrap_or_else(|other| {
            panic!("partition {p}, source offset {offset}: not one exact translation: {other}")
        });
        assert!(
            at <= lossless,
            "partition {p}: a group at source offset {offset} resumes at target offset {at}, \
             past {lossless}: it would lose records"
        );
    }
}

/// After the kills, a group resuming at a translated offset reads no record it had read: the
/// translation is exactly the latest lossless resume, not before it among copies made twice.
#[test]
fn after_hard_kills_a_translated_group_offset_reads_no_record_twice() {
    translated_offsets_read_no_record_twice(CopyMode::Records);
}

#[test]
fn after_hard_kills_a_translated_group_offset_reads_no_record_twice_with_batches() {
    translated_offsets_read_no_record_twice(CopyMode::Batches);
}

fn translated_offsets_read_no_record_twice(mode: CopyMode) {
    let trial = hard_kills(mode);
    for (p, offset, at, lossless, read_again) in &trial.translations {
        let Ok(at) = at else { continue };
        assert_eq!(
            *read_again, 0,
            "partition {p}: a group at source offset {offset} resuming at {at} reads \
             {read_again} records it had read"
        );
        assert_eq!(
            at, lossless,
            "partition {p}: a group at source offset {offset} resumes at {at}, before \
             {lossless}: it reads copies made twice"
        );
    }
    eprintln!(
        "TRIAL hard-kills kafka 4.4.0 {}: {} offsets translated",
        mode.flag(),
        trial.translations.len()
    );
}

/// The trial means something only if its kills hit a mirror that was copying: the committed
/// total advanced between most kills.
#[test]
fn the_hard_kill_trial_kills_mirrors_while_they_copy() {
    hard_kills_hit_copying_mirrors(CopyMode::Records);
}

#[test]
fn the_hard_kill_trial_kills_mirrors_while_they_copy_with_batches() {
    hard_kills_hit_copying_mirrors(CopyMode::Batches);
}

fn hard_kills_hit_copying_mirrors(mode: CopyMode) {
    let trial = hard_kills(mode);
    let committed_at_kills: Vec<i64> = trial
        .kill_points
        .iter()
        .map(|k| k.iter().map(|c| c.max(&0)).sum())
        .collect();
    assert!(
        committed_at_kills
            .windows(2)
            .filter(|w| w[1] > w[0])
            .count()
            >= HARD_KILLS / 2,
        "committed at each kill: {committed_at_kills:?}"
    );
}

/// A group protocol of the hand-over trials: the consumer settings that choose it.
struct GroupProtocol {
    /// For the TRIAL line.
    name: &'static str,
    /// The trial's topic (and group) on the shared pair.
    topic: &'static str,
    consumer: &'static [(&'static str, &'static str)],
    /// Only these client settings, without the test defaults (KIP-848 refuses the classic
    /// protocol's timing settings).
    exact: bool,
}

const EAGER_RANGE: GroupProtocol = GroupProtocol {
    name: "range",
    topic: "handed-over-range",
    consumer: &[("partition.assignment.strategy", "range")],
    exact: false,
};

const COOPERATIVE_STICKY: GroupProtocol = GroupProtocol {
    name: "cooperative-sticky",
    topic: "handed-over-cooperative",
    consumer: &[("partition.assignment.strategy", "cooperative-sticky")],
    exact: false,
};

/// KIP-848: the broker assigns partitions; the client sets none of the classic protocol's
/// timing or assignor settings.
const CONSUMER_PROTOCOL: GroupProtocol = GroupProtocol {
    name: "group.protocol=consumer",
    topic: "handed-over-kip848",
    consumer: &[("group.protocol", "consumer"), ("fetch.wait.max.ms", "10")],
    exact: true,
};

/// Three mirror processes in one group, stopped with SIGTERM and started again in turns while
/// a writer keeps adding records: nothing lost and nothing duplicated.
fn clean_hand_overs(version: KafkaVersion, protocol: &GroupProtocol, mode: CopyMode) {
    const PARTITIONS: i32 = 12;
    let name = protocol.name;
    let pair = SharedPair::get(version).lane(mode.named(protocol.topic), PARTITIONS);
    let start = |pair: &Endpoints| {
        let mirror = pair.mirror();
        let mirror = if protocol.exact {
            mirror.exact_configs()
        } else {
            mirror
        };
        mirror
            .copy_mode(mode)
            .consumer(protocol.consumer)
            .commit_ms(300)
            .start()
    };
    pair.write(0..3000);
    let trickle = pair.trickle(3000, 50);
    let mut mirrors: Vec<Mirror> = (0..3).map(|_| start(&pair)).collect();
    let started = Instant::now();
    let mut bounces = 0;
    for step in 0..6 {
        let i = step % 3;
        // Not a condition: the cadence of the hand-overs under load.
        std::thread::sleep(Duration::from_millis(1500));
        let status = mirrors[i].stop();
        assert_eq!(
            status.code(),
            Some(0),
            "mirror {i} log:\n{}",
            mirrors[i].log()
        );
        bounces += 1;
        // Not a condition: the instance stays away a moment (its partitions move).
        std::thread::sleep(Duration::from_millis(500));
        let old = std::mem::replace(&mut mirrors[i], start(&pair));
        print_log_if_asked(&format!("mirror {i} before bounce {bounces}"), old.log());
        wait_until(
            Duration::from_secs(60),
            "the restarted mirror to get partitions",
            || mirrors[i].log().contains("assigned") || !mirrors[i].is_running(),
        );
        assert!(mirrors[i].is_running(), "log:\n{}", mirrors[i].log());
    }
    let written = trickle.stop();
    let total = written as i64;
    wait_committed_by(
        pair.group,
        &mut mirrors[0],
        &pair.src(),
        pair.topic,
        PARTITIONS,
        total,
    );
    for (i, m) in mirrors.iter_mut().enumerate() {
        assert_eq!(m.stop().code(), Some(0), "mirror {i} log:\n{}", m.log());
    }
    let c = pair.compare();
    eprintln!(
        "TRIAL clean-hand-overs kafka {} {name} {}: 3 processes, {bounces} SIGTERM bounces, {}, \
         {:.0} s",
        version.version(),
        mode.flag(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    if !c.is_exact() {
        for (i, m) in mirrors.iter().enumerate() {
            eprintln!("--- mirror {i} (last) log:\n{}", m.log());
        }
        // Where: per partition, the records on each side and the first that differs.
        for p in 0..PARTITIONS {
            let (s, t) = (pair.source_records(p), pair.target_records(pair.topic, p));
            let first = s.iter().zip(&t).position(|(a, b)| a != b);
            if s.len() != t.len() || first.is_some() {
                eprintln!(
                    "partition {p}: {} on the source, {} on the target, first differing at \
                     offset {first:?}",
                    s.len(),
                    t.len()
                );
            }
        }
    }
    assert_eq!(
        (c.source, c.lost, c.changed, c.duplicated),
        (written, 0, 0, 0),
        "{c:?}"
    );
    assert!(c.in_order, "{c:?}");
}

/// Prints a mirror's whole log when `KAFKA_TRIALS_LOGS` is set (to study a trial's run).
fn print_log_if_asked(name: &str, log: String) {
    if std::env::var_os("KAFKA_TRIALS_LOGS").is_some() {
        eprintln!("--- {name} log:\n{log}");
    }
}

#[test]
fn clean_hand_overs_with_eager_range_assignment_are_exact() {
    clean_hand_overs(KAFKA_4, &EAGER_RANGE, CopyMode::Records);
}

#[test]
fn clean_hand_overs_with_eager_range_assignment_are_exact_with_batches() {
    clean_hand_overs(KAFKA_4, &EAGER_RANGE, CopyMode::Batches);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact() {
    clean_hand_overs(KAFKA_4, &COOPERATIVE_STICKY, CopyMode::Records);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_with_batches() {
    clean_hand_overs(KAFKA_4, &COOPERATIVE_STICKY, CopyMode::Batches);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_on_kafka_3() {
    clean_hand_overs(KAFKA_3, &COOPERATIVE_STICKY, CopyMode::Records);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_on_kafka_3_with_batches() {
    clean_hand_overs(KAFKA_3, &COOPERATIVE_STICKY, CopyMode::Batches);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_on_kafka_2() {
    clean_hand_overs(KAFKA_2, &COOPERATIVE_STICKY, CopyMode::Records);
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_on_kafka_2_with_batches() {
    clean_hand_overs(KAFKA_2, &COOPERATIVE_STICKY, CopyMode::Batches);
}

#[test]
fn clean_hand_overs_with_the_consumer_group_protocol_are_exact() {
    clean_hand_overs(KAFKA_4, &CONSUMER_PROTOCOL, CopyMode::Records);
}

#[test]
fn clean_hand_overs_with_the_consumer_group_protocol_are_exact_with_batches() {
    clean_hand_overs(KAFKA_4, &CONSUMER_PROTOCOL, CopyMode::Batches);
}

// ---------------------------------------------------------------------------------------------
// Drop-in.

/// A Java MirrorMaker deployment's `consumer.properties` and `producer.properties` as they are
/// (Kafka's templates, MirrorMaker's settings, pre-0.9 keys; the round-robin assignor, an eager
/// protocol) with two streams: every record copied exactly, each Java-only key warned once.
fn java_properties_files_work_unchanged(mode: CopyMode) {
    const PARTITIONS: i32 = 4;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane(mode.named("dropin"), PARTITIONS);
    lane.write(0..1000);
    let dir = tempdir();
    let c = dir.path().join("consumer.properties");
    let p = dir.path().join("producer.properties");
    write_private(&c, java_consumer_properties(&lane.src(), lane.group));
    write_private(&p, java_producer_properties(&lane.dst()));
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(lane.topic)
        .copy_mode(mode)
        .streams(2)
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let c = lane.compare();
    eprintln!(
        "TRIAL drop-in kafka 4.4.0 {}: Java consumer.properties and producer.properties, 2 \
         streams, {}, {:.0} s",
        mode.flag(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(c.source == 1000 && c.is_exact(), "{c:?}, log:\n{log}");
    assert_java_keys_warned_once(&log);
}

#[test]
fn java_mirror_maker_properties_files_work_unchanged_on_kafka() {
    java_properties_files_work_unchanged(CopyMode::Records);
}

#[test]
fn java_mirror_maker_properties_files_work_unchanged_on_kafka_with_batches() {
    java_properties_files_work_unchanged(CopyMode::Batches);
}

// ---------------------------------------------------------------------------------------------
// The record engine's producers.

/// A record that arrives once the mirror has caught up is sent at once, not after the
/// producer's `linger.ms`: with nothing more to read, the stream tells librdkafka to send
/// what it holds back. Here `linger.ms` is a minute, so the record landing within 30 s is
/// the stream's doing, not the linger running out.
#[test]
fn a_record_after_the_backlog_is_sent_without_waiting_for_linger_ms() {
    const PARTITIONS: i32 = 2;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("lingering", PARTITIONS);
    lane.write(0..100);
    let mut mirror = lane
        .mirror()
        .producer(&[("linger.ms", "60000")])
        .copy_mode(CopyMode::Records)
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    lane.write(100..101);
    let waited = wait_on_target(&lane, 101, Duration::from_secs(30));
    assert!(
        waited < Duration::from_secs(30),
        "the record after the backlog waited for linger.ms: not on the target after {waited:?}"
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = lane.compare();
    eprintln!(
        "TRIAL linger kafka 4.4.0 records: linger.ms 60000, the record after the backlog on \
         the target {:.1} s after it was written, {}, {:.0} s",
        waited.as_secs_f64(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(c.source == 101 && c.is_exact(), "{c:?}");
}

/// An exactly-once transaction does not wait out the producer's `linger.ms` before it
/// commits: its flush has librdkafka send what it holds back at once. Here `linger.ms` is
/// 30 s, so records committed within 15 s of being written, once the mirror has copied a
/// first one, is the flush's doing, not the linger running out (each transaction waited the
/// whole linger before).
#[test]
fn an_exactly_once_transaction_does_not_wait_out_linger_ms() {
    const PARTITIONS: i32 = 2;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("lingering-transactions", PARTITIONS);
    lane.write(0..1);
    let mut mirror = lane
        .mirror()
        .producer(&[("linger.ms", "30000")])
        .exactly_once("lingering")
        .flag("--offset.mapping.topic", "lingering-transactions.offsets")
        .commit_ms(300)
        .start();
    // Started, its transactional producer ready, the target topic made.
    lane.wait_caught_up(&mut mirror);
    lane.write(1..101);
    // The target read `read_committed` (librdkafka's default): a record counts once its
    // transaction committed.
    let waited = wait_on_target(&lane, 101, Duration::from_secs(15));
    assert!(
        waited < Duration::from_secs(15),
        "the transactions waited for linger.ms: {} of 101 records committed on the target \
         after {waited:?}; log:\n{}",
        records_on_target(&lane),
        mirror.log()
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = lane.compare();
    eprintln!(
        "TRIAL linger kafka 4.4.0 exactly once: linger.ms 30000, 100 records committed on the \
         target {:.1} s after they were written, {}, {:.0} s",
        waited.as_secs_f64(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(c.source == 101 && c.is_exact(), "{c:?}");
}

/// How many records the target holds in `lane`'s topic, every partition.
fn records_on_target(lane: &Endpoints) -> usize {
    (0..lane.partitions)
        .map(|p| lane.target_records(lane.topic, p).len())
        .sum()
}

/// Waits, from now, until the target holds `count` records in `lane`'s topic or `within`
/// has passed; returns how long it waited.
fn wait_on_target(lane: &Endpoints, count: usize, within: Duration) -> Duration {
    let from = Instant::now();
    while records_on_target(lane) < count && from.elapsed() < within {
        std::thread::sleep(Duration::from_millis(100));
    }
    from.elapsed()
}

/// With several producers per stream (`--producers.per.stream 4`), each target partition
/// goes through one of them: every record lands, in order, while the source is written to.
#[test]
fn records_through_four_producers_per_stream_land_in_order() {
    const PARTITIONS: i32 = 8;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("producers-per-stream", PARTITIONS);
    lane.write(0..2000);
    let mut mirror = lane
        .mirror()
        .copy_mode(CopyMode::Records)
        .flag("--producers.per.stream", "4")
        .commit_ms(300)
        .start();
    let trickle = lane.trickle(2000, 50);
    std::thread::sleep(Duration::from_secs(3));
    let written = trickle.stop();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = lane.compare();
    eprintln!(
        "TRIAL producers-per-stream kafka 4.4.0 records: 4 producers, {PARTITIONS} partitions, \
         {}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        c.source == written && c.is_exact(),
        "{c:?}, log:\n{}",
        mirror.log()
    );
}

// ---------------------------------------------------------------------------------------------
// Transactions, compaction, broker faults.

/// Committed and aborted transactions interleaved (the last one aborted): the mirror copies the
/// committed records only, and its committed offsets reach each partition's end (past the
/// control records), so its lag is 0.
fn transactional_source(check_lag: bool, mode: CopyMode) {
    const PARTITIONS: i32 = 3;
    const TRANSACTIONS: u64 = 30;
    const PER_TRANSACTION: u64 = 60;
    let started = Instant::now();
    let shared = SharedPair::get(KAFKA_4);
    let topic = mode.named(if check_lag {
        "transactions-lag"
    } else {
        "transactions"
    });
    let pair = shared.lane(topic, PARTITIONS);
    let p = producer(&pair.src(), &[("transactional.id", topic)]);
    p.init_transactions(Duration::from_secs(30)).unwrap();
    let mut committed_records = 0;
    for t in 0..TRANSACTIONS {
        p.begin_transaction().unwrap();
        let aborted = t % 3 == 1 || t == TRANSACTIONS - 1;
        for i in 0..PER_TRANSACTION {
            let r = Record {
                key: Some(format!("t{t}-{i}").into_bytes()),
                value: Some(if aborted {
                    b"aborted".to_vec()
                } else {
                    b"committed".to_vec()
                }),
                headers: vec![],
                timestamp: Some(1_700_000_000_000 + (t * PER_TRANSACTION + i) as i64),
            };
            send(&p, topic, (i % PARTITIONS as u64) as i32, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
        if aborted {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
            committed_records += PER_TRANSACTION;
        }
    }
    let mut mirror = pair.mirror().copy_mode(mode).commit_ms(300).start();
    wait_until(
        Duration::from_secs(60),
        "the committed records on the target",
        || {
            (0..PARTITIONS)
                .map(|p| {
                    // Nothing yet while the mirror has not created the target topic.
                    mirror_maker::tools::compare::read_partition(
                        &pair.dst(),
                        topic,
                        p,
                        Duration::from_secs(5),
                    )
                    .map_or(0, |r| r.len() as u64)
                })
                .sum::<u64>()
                >= committed_records
                || !mirror.is_running()
        },
    );
    let end = pair.end_offsets();
    // A few commit intervals for the commits to reach the end.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pair.committed() != end && Instant::now() < deadline {
        // The poll of a bounded wait (the end is not reached when check_lag is off).
        std::thread::sleep(Duration::from_millis(200));
    }
    let committed = pair.committed();
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let after_stop = pair.committed();
    let mut copied = 0;
    for part in 0..PARTITIONS {
        let t = pair.target_records(pair.topic, part);
        assert!(
            t.iter()
                .all(|r| r.value.as_deref() == Some(&b"committed"[..])),
            "an aborted record reached the target"
        );
        let s = pair.source_records(part);
        assert!(s == t, "partition {part}: {}", first_difference(&s, &t));
        copied += t.len() as u64;
        let batches = shared.source.stored_batches(topic, part);
        assert!(batches.iter().any(|b| b.control), "no control records");
    }
    assert_eq!(copied, committed_records);
    eprintln!(
        "transactions: end offsets {end:?}, committed {committed:?} while running, \
         {after_stop:?} after SIGTERM"
    );
    eprintln!(
        "TRIAL transactions kafka 4.4.0 {}: {TRANSACTIONS} transactions ({} aborted, the last two \
         among them), {copied} committed records copied, 0 aborted ones; end offsets {end:?}, \
         committed {after_stop:?}, {:.0} s",
        mode.flag(),
        TRANSACTIONS - committed_records / PER_TRANSACTION,
        started.elapsed().as_secs_f64()
    );
    if check_lag {
        assert_eq!(
            committed, end,
            "lag 0: committed offsets at each partition's end"
        );
        assert_eq!(after_stop, end);
    }
}

#[test]
fn a_transactional_source_is_mirrored_committed_records_only() {
    transactional_source(false, CopyMode::Records);
}

/// The same, and the group's committed offsets reach each partition's end: past the last
/// commit marker and past aborted transactions at the tail, so that the group's lag (end
/// offset minus committed offset, as Kafka's tools compute it) is 0.
#[test]
fn a_transactional_source_leaves_no_lag() {
    transactional_source(true, CopyMode::Records);
}

/// The same with the batch engine: control batches and the batches of aborted transactions
/// are dropped, and the commit still moves past them.
#[test]
fn a_transactional_source_leaves_no_lag_with_batches() {
    transactional_source(true, CopyMode::Batches);
}

/// Runs `mirror-maker verify` over the pair's topic; returns its exit code and JSON report.
fn verify(pair: &KafkaPair) -> (Option<i32>, serde_json::Value, String) {
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &pair.src(), &pair.dst(), &[], &[]);
    let out = binary()
        .arg("verify")
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", pair.topic, "--timeout.ms", "20000", "--json"])
        .output()
        .expect("running mirror-maker verify");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `rounds` rounds of `keys` keys (values naming the round), key `k` to partition
/// `k % partitions`; with `every` > 1 only every `every`-th key of each partition.
fn write_keyed(
    bootstrap: &str,
    rounds: std::ops::Range<u64>,
    keys: u64,
    every: u64,
    partitions: i32,
) {
    let p = producer(bootstrap, &[("linger.ms", "5")]);
    for round in rounds {
        for k in (0..keys).filter(|k| (k / partitions as u64).is_multiple_of(every)) {
            let r = Record {
                key: Some(format!("key-{k}").into_bytes()),
                value: Some(format!("round {round} of key {k}").into_bytes()),
                headers: vec![("round".into(), Some(round.to_string().into_bytes()))],
                timestamp: Some(1_700_000_000_000 + (round * keys + k) as i64),
            };
            send(&p, TOPIC, (k % partitions as u64) as i32, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
        // Not a condition: each round in its own segment (segment.ms = 100 rolls by time).
        std::thread::sleep(Duration::from_millis(150));
    }
}

const COMPACTED: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "100"),
    ("min.cleanable.dirty.ratio", "0.01"),
    ("delete.retention.ms", "0"),
];

/// A compacted source topic whose offsets have gaps, mirrored, written to again and mirrored
/// by a restarted mirror; then `verify`. With `freeze`, the source's cleaner is stopped (its
/// segments no longer roll) before the second round of writes, so no record is compacted
/// away after it was mirrored.
fn compacted_source(freeze: bool, mode: CopyMode) {
    const PARTITIONS: i32 = 2;
    const KEYS: u64 = 200;
    let started = Instant::now();
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[("log.cleaner.backoff.ms", "200")],
        TOPIC,
        PARTITIONS,
        COMPACTED,
    );
    // A first round of every key, then rounds of half of them: the cleaner leaves the first
    // round's batches with gaps inside (the other half kept) and drops the rounds between.
    write_keyed(&pair.src(), 0..1, KEYS, 1, PARTITIONS);
    write_keyed(&pair.src(), 1..10, KEYS, 2, PARTITIONS);
    // The cleaner leaves the active segment alone: one more write rolls the last round's.
    write_keyed(&pair.src(), 10..11, 1, 1, PARTITIONS);
    let count =
        |pair: &KafkaPair| -> usize { (0..PARTITIONS).map(|p| pair.source_records(p).len()).sum() };
    let end_before: i64 = pair.end_offsets().iter().sum();
    wait_until(Duration::from_secs(60), "the cleaner to compact", || {
        (count(&pair) as i64) < end_before / 2
    });
    // Then until the cleaner is done with what has rolled: the count holds still for 3 s.
    let mut last = (count(&pair), Instant::now());
    wait_until(Duration::from_secs(60), "the cleaner to finish", || {
        let n = count(&pair);
        if n != last.0 {
            last = (n, Instant::now());
        }
        last.1.elapsed() > Duration::from_secs(3)
    });
    let left = last.0;
    // Batches the cleaner left with fewer records than offsets: a copy of one as it is would
    // be refused ("Inconsistent batch offset range"); the batch engine encodes them again.
    let gapped: usize = (0..PARTITIONS)
        .flat_map(|p| pair.source.stored_batches(TOPIC, p))
        .filter(|b| b.last_offset - b.base_offset + 1 != b.records)
        .count();
    assert!(
        gapped > 0,
        "no source batch has gaps: the trial proves nothing"
    );
    if freeze {
        let mut configs = COMPACTED.to_vec();
        configs.retain(|(k, _)| *k != "segment.ms");
        configs.push(("segment.ms", "604800000"));
        let mut alter =
            rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(TOPIC));
        for (k, v) in &configs {
            alter = alter.set(k, v);
        }
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            ClientConfig::new()
                .set("bootstrap.servers", pair.src())
                .create()
                .unwrap();
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(admin.alter_configs(&[alter], &rdkafka::admin::AdminOptions::new()))
            .expect("AlterConfigs");
        assert!(result.iter().all(Result::is_ok), "{result:?}");
    }
    let instance = pair.mirror().copy_mode(mode).commit_ms(300);
    let mut mirror = instance.start();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    write_keyed(&pair.src(), 11..16, KEYS, 1, PARTITIONS);
    let mut mirror = instance.start();
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let (code, json, stderr) = verify(&pair);
    let totals = &json["totals"];
    eprintln!(
        "TRIAL compacted kafka 4.4.0 {} (cleaner {}): {} records left of offsets 0..{end_before} \
         ({gapped} batches with gaps) at the first run; end offsets {end:?} after the restart, {} source records then; verify: \
         {totals}, {:.0} s",
        mode.flag(),
        if freeze {
            "stopped after the first run"
        } else {
            "running throughout"
        },
        left,
        count(&pair),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(pair.committed(), end);
    assert_eq!(code, Some(0), "verify failed: {json}\n{stderr}");
    for k in [
        "missing",
        "changed",
        "duplicated",
        "out_of_order",
        "misplaced",
    ] {
        assert_eq!(totals[k].as_u64(), Some(0), "{k}: {json}");
    }
}

#[test]
fn a_compacted_source_with_offset_gaps_is_mirrored_and_verifies() {
    compacted_source(true, CopyMode::Records);
}

/// The batches with gaps are encoded again with contiguous offsets (Kafka's `LogValidator`
/// refuses a client batch whose offset range disagrees with its count).
#[test]
fn a_compacted_source_with_offset_gaps_is_mirrored_and_verifies_with_batches() {
    compacted_source(true, CopyMode::Batches);
}

/// The source's cleaner keeps compacting after records were mirrored: the target then holds
/// versions of keys the source no longer has (until the target's own cleaner runs).
#[test]
fn verify_passes_when_the_source_compacts_mirrored_records() {
    compacted_source(false, CopyMode::Records);
}

#[test]
fn verify_passes_when_the_source_compacts_mirrored_records_with_batches() {
    compacted_source(false, CopyMode::Batches);
}

/// A 3-broker target with replication factor 3 and min.insync.replicas=2: one target broker
/// SIGKILLed and restarted mid-stream; the mirror keeps going and loses nothing.
#[test]
fn a_target_broker_killed_and_restarted_mid_stream_loses_nothing() {
    target_broker_killed_mid_stream(CopyMode::Records);
}

/// The same with the batch engine: its Produce to the dead broker fails or times out, the
/// batches are sent again to the new leaders with their sequences.
#[test]
fn a_target_broker_killed_and_restarted_mid_stream_loses_nothing_with_batches() {
    target_broker_killed_mid_stream(CopyMode::Batches);
}

fn target_broker_killed_mid_stream(mode: CopyMode) {
    const PARTITIONS: i32 = 6;
    let started = Instant::now();
    // A dead broker is fenced after broker.session.timeout.ms (9 s by default): 4 s here.
    let mut pair = KafkaPair::with(
        KAFKA_4,
        3,
        &[
            ("broker.session.timeout.ms", "4000"),
            ("broker.heartbeat.interval.ms", "1000"),
        ],
        TOPIC,
        PARTITIONS,
        &[],
    );
    pair.target
        .create_topic(TOPIC, PARTITIONS, 3, &[("min.insync.replicas", "2")]);
    pair.write(0..5000);
    let trickle = pair.trickle(5000, 100);
    let mut mirror = pair.mirror().copy_mode(mode).commit_ms(300).start();
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&pair.src(), TOPIC, PARTITIONS) > 0
    });
    pair.target.kill(2);
    let killed_at = Instant::now();
    let killed = committed_total(&pair.src(), TOPIC, PARTITIONS);
    // Writes with acks=all wait until the controller fences the dead broker
    // (broker.session.timeout.ms) and shrinks the ISRs; then the two brokers left suffice.
    wait_until(
        Duration::from_secs(40),
        "commits to advance while a target broker is down",
        || committed_total(&pair.src(), TOPIC, PARTITIONS) > killed + 1000,
    );
    let stalled = killed_at.elapsed();
    let while_down = committed_total(&pair.src(), TOPIC, PARTITIONS);
    assert!(mirror.is_running(), "log:\n{}", mirror.log());
    pair.target.restart(2);
    // Not a condition: the load goes on a while after the broker is back.
    std::thread::sleep(Duration::from_secs(2));
    let written = trickle.stop();
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(end.iter().sum::<i64>() as u64, written);
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL {mode:?} target-broker-restart kafka 4.4.0: broker 2 of 3 SIGKILLed at {killed} committed; \
         commits advanced again after {:.1} s ({while_down} committed while it was down); {}, \
         {:.0} s",
        stalled.as_secs_f64(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (written, 0, 0), "{c:?}");
}

/// The source's only broker SIGKILLed mid-copy and restarted 5 s later: the mirror waits
/// (no exit) and then finishes; nothing lost, order kept.
#[test]
fn a_source_broker_killed_and_restarted_mid_copy_loses_nothing() {
    source_broker_killed_mid_copy(CopyMode::Records);
}

/// The same with the batch engine: its fetches from the dead broker fail or time out and are
/// made again once it is back, from the positions it had.
#[test]
fn a_source_broker_killed_and_restarted_mid_copy_loses_nothing_with_batches() {
    source_broker_killed_mid_copy(CopyMode::Batches);
}

fn source_broker_killed_mid_copy(mode: CopyMode) {
    const PARTITIONS: i32 = 4;
    const RECORDS: u64 = 40_000;
    let started = Instant::now();
    let mut pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    pair.write(0..RECORDS);
    // A small producer queue keeps the copy going long enough to be cut; the batch engine,
    // which has none, is throttled instead (the backlog is about 5 MB: some 10 s).
    let mirror = pair.mirror().copy_mode(mode);
    let mirror = match mode {
        CopyMode::Records => mirror.producer(&[("queue.buffering.max.messages", "500")]),
        CopyMode::Batches => mirror.flag("--throttle.bytes.per.second", "500000"),
    };
    let mut mirror = mirror.commit_ms(200).start();
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&pair.src(), TOPIC, PARTITIONS) > 0
    });
    pair.source.kill(1);
    // Not a condition: the outage itself, which the mirror must wait out.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        mirror.is_running(),
        "the mirror exited while the source was down; log:\n{}",
        mirror.log()
    );
    pair.source.restart(1);
    let restarted = Instant::now();
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(end.iter().sum::<i64>() as u64, RECORDS);
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL {mode:?} source-broker-restart kafka 4.4.0: the source's broker SIGKILLed mid-copy, down 5 s; \
         caught up {:.1} s after its restart; {}, {:.0} s",
        restarted.elapsed().as_secs_f64(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    print_log_if_asked("the mirror", mirror.log());
    assert_eq!((c.source, c.lost, c.changed), (RECORDS, 0, 0), "{c:?}");
}

/// A record the target refuses for good (larger than the target topic's `max.message.bytes`)
/// in abort mode: exit 1, the committed offset of its partition stops at it, and no later
/// record of that partition reaches the target (other partitions are unaffected).
#[test]
fn a_record_the_target_refuses_stops_its_partition_in_abort_mode() {
    const PARTITIONS: i32 = 2;
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[],
        TOPIC,
        PARTITIONS,
        &[("max.message.bytes", "2000000")],
    );
    pair.target
        .create_topic(TOPIC, PARTITIONS, 1, &[("max.message.bytes", "100000")]);
    let p = producer(
        &pair.src(),
        &[("message.max.bytes", "2000000"), ("linger.ms", "5")],
    );
    const BEFORE: u64 = 2000;
    const AFTER: u64 = 2000;
    for i in 0..BEFORE + 1 + AFTER {
        let (_, mut r) = sample_record(i, 1);
        if i == BEFORE {
            r.value = Some(vec![b'x'; 500_000]);
        }
        send(&p, TOPIC, 0, &r);
        let (_, r) = sample_record(1_000_000 + i, 1);
        send(&p, TOPIC, 1, &r);
    }
    p.flush(Duration::from_secs(30)).unwrap();
    // The big record passes the producer's own check (message.max.bytes) and reaches the
    // broker; batches of small records stay under the target's limit (batch.size: librdkafka
    // does not split a batch the broker refuses as too large).
    // The target topic's smaller limit is the premise: the topic-config sync would raise it to
    // the source's (max.message.bytes is one of the configs it keeps in step).
    let mut mirror = pair
        .mirror()
        .producer(&[("message.max.bytes", "2000000"), ("batch.size", "50000")])
        .commit_ms(200)
        .flag("--sync.topic.configs", "false")
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    let committed = pair.committed();
    let target = pair.target_records(pair.topic, 0);
    let after_refused = target
        .iter()
        .filter(|r| {
            r.headers
                .first()
                .and_then(|(_, v)| v.as_deref())
                .is_some_and(|v| {
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .is_some_and(|i| i > BEFORE)
                })
        })
        .count();
    eprintln!(
        "TRIAL refused-record kafka 4.4.0: exit {:?}, committed {committed:?}, target partition 0 \
         holds {} records ({after_refused} of them after the refused one at offset {BEFORE})",
        status.code(),
        target.len()
    );
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(log.contains("orders/0 offset 2000"), "log:\n{log}");
    // The refusal names the target partition, the record's size and the topic's limit.
    assert!(
        log.contains(
            "bytes of key and value) is larger than target topic orders partition 0 takes \
             (max.message.bytes 100000)"
        ),
        "log:\n{log}"
    );
    assert_eq!(
        committed[0], BEFORE as i64,
        "the commit stops at the refused record"
    );
    assert_eq!(
        after_refused, 0,
        "records after the refused one reached the target"
    );
    assert_eq!(target.len() as u64, BEFORE);
}

/// Two of three target brokers SIGKILLed (replication factor 3, min.insync.replicas=2; the
/// controller quorum is lost too): the mirror holds back, does not exit, and drains once they
/// return; nothing lost.
#[test]
fn two_target_brokers_down_hold_the_mirror_back_and_it_drains_when_they_return() {
    two_target_brokers_down(CopyMode::Records);
}

/// The same with the batch engine: NOT_ENOUGH_REPLICAS and the lost leaders retried, its
/// rounds bounded by the poll interval meanwhile.
#[test]
fn two_target_brokers_down_hold_the_mirror_back_and_it_drains_when_they_return_with_batches() {
    two_target_brokers_down(CopyMode::Batches);
}

fn two_target_brokers_down(mode: CopyMode) {
    const PARTITIONS: i32 = 6;
    let started = Instant::now();
    let mut pair = KafkaPair::with(
        KAFKA_4,
        3,
        &[
            ("broker.session.timeout.ms", "4000"),
            ("broker.heartbeat.interval.ms", "1000"),
        ],
        TOPIC,
        PARTITIONS,
        &[],
    );
    pair.target
        .create_topic(TOPIC, PARTITIONS, 3, &[("min.insync.replicas", "2")]);
    pair.write(0..3000);
    let trickle = pair.trickle(3000, 100);
    let mut mirror = pair.mirror().copy_mode(mode).commit_ms(300).start();
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&pair.src(), TOPIC, PARTITIONS) > 3000
    });
    pair.target.kill(2);
    pair.target.kill(3);
    // What was in flight settles (no commit for 3 s); then nothing more is committed.
    let (mut held, mut since) = (
        committed_total(&pair.src(), TOPIC, PARTITIONS),
        Instant::now(),
    );
    wait_until(Duration::from_secs(60), "the commits to settle", || {
        let now = committed_total(&pair.src(), TOPIC, PARTITIONS);
        if now != held {
            (held, since) = (now, Instant::now());
        }
        since.elapsed() >= Duration::from_secs(3)
    });
    // Not a condition: the window in which nothing may be committed.
    std::thread::sleep(Duration::from_secs(6));
    let still = committed_total(&pair.src(), TOPIC, PARTITIONS);
    assert!(mirror.is_running(), "log:\n{}", mirror.log());
    let back = Instant::now();
    pair.target.restart(2);
    pair.target.restart(3);
    let written = trickle.stop();
    let end = pair.wait_caught_up(&mut mirror);
    let drained = back.elapsed();
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(end.iter().sum::<i64>() as u64, written);
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL {mode:?} two-target-brokers-down kafka 4.4.0: committed {held} then {still} over 6 s with \
         2 of 3 brokers down (mirror running); drained {:.1} s after they were restarted; {}, \
         {:.0} s",
        drained.as_secs_f64(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        still, held,
        "records were committed without 2 in-sync replicas"
    );
    assert_eq!((c.source, c.lost, c.changed), (written, 0, 0), "{c:?}");
}

/// The source topic gains partitions (CreatePartitions) while the mirror runs: the target
/// topic is grown, the new partitions are mirrored after the next metadata refresh, nothing
/// lost.
fn partition_growth(abort: bool, engine: CopyMode) {
    let started = Instant::now();
    let mut pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..2000);
    let mode = if abort { "true" } else { "false" };
    let mut mirror = pair
        .mirror()
        .copy_mode(engine)
        .commit_ms(300)
        .topic_refresh_ms(1000)
        .flag("--abort.on.send.failure", mode)
        .start();
    wait_committed(&mut mirror, &pair.src(), TOPIC, 2, 2000);
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", pair.src())
            .create()
            .unwrap();
    let grown = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(admin.create_partitions(
            &[rdkafka::admin::NewPartitions::new(TOPIC, 4)],
            &rdkafka::admin::AdminOptions::new(),
        ))
        .expect("CreatePartitions");
    assert!(grown.iter().all(Result::is_ok), "{grown:?}");
    pair.source.wait_for_leaders(TOPIC, 4);
    pair.partitions = 4;
    write_samples(&pair.src(), TOPIC, 2000..4000, 4, 100).unwrap();
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL {} kafka 4.4.0 (abort.on.send.failure {mode}): source grown from 2 to 4 \
         partitions mid-stream; end offsets {end:?}; {}, {:.0} s",
        engine.named("partition-growth"),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (4000, 0, 0), "{c:?}");
}

/// A record for a target partition the producer does not know yet is tried again, its
/// topic's metadata refreshed, until the producer's `topic.metadata.propagation.max.ms`: a
/// partition added to the target a few seconds after the first refusal is written, not a
/// send failure (`--create.topics false`, so nothing else adds it). Partition 0 is copied
/// first, so that the producer knows the target topic (one partition) when partition 1's
/// first record comes: librdkafka then refuses it at once, as after a source topic grew.
#[test]
fn a_target_partition_added_after_the_first_refusal_is_written() {
    target_partition_added_late(CopyMode::Records);
}

#[test]
fn a_target_partition_added_after_the_first_refusal_is_written_with_batches() {
    target_partition_added_late(CopyMode::Batches);
}

fn target_partition_added_late(mode: CopyMode) {
    let started = Instant::now();
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.target.create_topic(TOPIC, 1, 1, &[]);
    let p = producer(&pair.src(), &[("linger.ms", "5")]);
    let write = |partition: i32, range: std::ops::Range<u64>| {
        for i in range {
            send(&p, TOPIC, partition, &sample_record(i, 1).1);
        }
        p.flush(Duration::from_secs(30)).unwrap();
    };
    write(0, 0..500);
    let mut mirror = pair
        .mirror()
        .copy_mode(mode)
        .commit_ms(300)
        .flag("--create.topics", "false")
        .start();
    wait_committed(&mut mirror, &pair.src(), TOPIC, 1, 500);
    write(1, 500..1000);
    mirror.wait_for_log(
        match mode {
            CopyMode::Records => {
                "refreshed the target's metadata of topic orders (a partition was unknown)"
            }
            CopyMode::Batches => "target topic orders has no partition 1 (yet)",
        },
        "a record for the missing target partition",
    );
    let refused = Instant::now();
    // Metadata that comes late: the partition appears seconds after the first refusal.
    std::thread::sleep(Duration::from_secs(3));
    pair.target.add_partitions(TOPIC, 2);
    let added = refused.elapsed();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    for p in 0..2 {
        let (s, t) = (pair.source_records(p), pair.target_records(pair.topic, p));
        assert!(s == t, "partition {p}: {}", first_difference(&s, &t));
    }
    eprintln!(
        "TRIAL {} kafka 4.4.0: target partition added {:.1} s after the first refusal; 1000 \
         records copied in order, {:.0} s",
        mode.named("partition-added-late"),
        added.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn partition_growth_is_mirrored_in_abort_mode() {
    partition_growth(true, CopyMode::Records);
}

#[test]
fn partition_growth_is_mirrored_in_skip_mode() {
    partition_growth(false, CopyMode::Records);
}

/// The batch engine's abort-mode twin is `kafka_batches::partition_growth_is_followed_by_the_batch_engine`.
#[test]
fn partition_growth_is_mirrored_in_skip_mode_with_batches() {
    partition_growth(false, CopyMode::Batches);
}

/// A source topic deleted and created again while the mirror runs, and written past the old
/// position before the mirror fetches it again (so no OFFSET_OUT_OF_RANGE says anything), is
/// copied from its beginning (issue 23): its new topic id gives it away, the mirror says so
/// and counts it, and the group's committed offsets end at the new topic's end offsets.
#[test]
fn a_recreated_source_topic_is_copied_from_its_beginning() {
    let started = Instant::now();
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..200);
    let metrics = free_local_addr();
    let mut mirror = pair
        .mirror()
        .commit_ms(300)
        .topic_refresh_ms(1000)
        .metrics_addr(&metrics)
        .start();
    let old_end = pair.wait_caught_up(&mut mirror);
    let old: Vec<Vec<Record>> = (0..2).map(|p| pair.source_records(p)).collect();
    // Held still (SIGSTOP) while the topic is made again and written past the old position,
    // so that its next fetch is at the old position inside the new log (no
    // OFFSET_OUT_OF_RANGE to tell it) whatever the timing.
    mirror.signal("STOP");
    pair.source.recreate_topic(TOPIC, 2);
    // Three times the old position per partition.
    pair.write(200..800);
    mirror.signal("CONT");
    let new: Vec<Vec<Record>> = (0..2).map(|p| pair.source_records(p)).collect();
    let new_end = pair.end_offsets();
    assert!(
        new_end.iter().zip(&old_end).all(|(n, o)| n > o),
        "{new_end:?}"
    );
    // Every record of the new topic after the old ones, in order (records copied from the
    // old position before the new id was seen come again: duplicates, never a loss).
    let duplicates = pair.wait_copied_after(&mirror, &old, &new);
    pair.wait_caught_up(&mut mirror);
    wait_until(
        Duration::from_secs(30),
        "committed offsets at the new topic's end",
        || pair.committed() == new_end,
    );
    let (_, exposition) = http_get(&metrics, "/metrics");
    let recreated = metric(
        &exposition,
        "mirror_source_topic_recreated_total",
        "topic=\"orders\"",
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("was deleted and created again"))
        .collect();
    assert_eq!(warned.len(), 1, "log:\n{log}");
    assert_eq!(recreated, Some(1.0), "{exposition}");
    eprintln!(
        "TRIAL recreated-source-topic kafka 4.4.0: old end offsets {old_end:?}, new {new_end:?}; \
         the new topic copied from offset 0 ({duplicates} copied twice), committed {new_end:?}; \
         {}; {:.0} s",
        warned[0].trim(),
        started.elapsed().as_secs_f64()
    );
}

/// Each start adds a segment per partition to the offset mapping. At start the mirror removes
/// those wholly below the source's log start (the latest of them stays), and every
/// translation from the log start on is what it was.
#[test]
fn the_offset_mapping_is_pruned_below_the_sources_log_start() {
    mapping_pruned_below_the_log_start(CopyMode::Records);
}

/// The same with the batch engine, which records its mapping per batch.
#[test]
fn the_offset_mapping_is_pruned_below_the_sources_log_start_with_batches() {
    mapping_pruned_below_the_log_start(CopyMode::Batches);
}

fn mapping_pruned_below_the_log_start(mode: CopyMode) {
    const PARTITIONS: i32 = 2;
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    let mut after_two = Vec::new();
    for round in 0..3u64 {
        pair.write(round * 100..(round + 1) * 100);
        pair.mirror_until_committed(&["--copy.mode", mode.flag()], ((round + 1) * 100) as i64);
        if round == 1 {
            after_two = pair.end_offsets();
        }
    }
    let before = stored_mapping(&pair.dst());
    assert_eq!(before.segment_count(), 3 * PARTITIONS as usize);
    // The source drops everything the first two runs copied.
    delete_records(&pair.src(), TOPIC, &after_two);
    let ends = pair.end_offsets();
    pair.write(300..400);
    let mut mirror = pair.mirror().copy_mode(mode).commit_ms(300).start();
    wait_until(Duration::from_secs(60), "the mapping pruned", || {
        mirror.log().contains("removed 2 segments") || !mirror.is_running()
    });
    wait_committed(&mut mirror, &pair.src(), TOPIC, PARTITIONS, 400);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let after = stored_mapping(&pair.dst());
    // Two pruned, two added by this run.
    assert_eq!(after.segment_count(), 3 * PARTITIONS as usize);
    for p in 0..PARTITIONS {
        for offset in after_two[p as usize]..=ends[p as usize] {
            assert_eq!(
                after.translate(TOPIC, p, offset),
                before.translate(TOPIC, p, offset),
                "partition {p}, source offset {offset}"
            );
        }
    }
}
