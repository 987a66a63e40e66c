//! Trials on Apache Kafka (issue 11): the mirror binary between real KRaft clusters started
//! from Maven Central's jars (see `tests/harness/src/kafka.rs`). Each trial asserts its guarantee
//! and prints a `TRIAL` line with its figures for the README.

use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use mirror_maker::mirror::mapping::Translation;
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
    loop {
        match p.send(record) {
            Ok(()) => break,
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                back,
            )) => {
                record = back;
                p.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("producing to {topic}/{partition}: {e}"),
        }
    }
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
/// through a mirror whose producer compresses with zstd.
fn fidelity(version: KafkaVersion) {
    const PARTITIONS: i32 = 3;
    let started = Instant::now();
    let pair = KafkaPair::new(version, "fidelity", PARTITIONS);
    let src = pair.src();
    let odd = producer(&src, &[("compression.type", "none"), ("linger.ms", "5")]);
    for (i, r) in odd_records().iter().enumerate() {
        send(&odd, "fidelity", i as i32 % PARTITIONS, r);
    }
    odd.flush(Duration::from_secs(30)).unwrap();
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    for (c, codec) in codecs.iter().enumerate() {
        let p = producer(&src, &[("compression.type", codec), ("linger.ms", "20")]);
        for i in c as u64 * 1000..(c as u64 + 1) * 1000 {
            let (partition, r) = sample_record(i, PARTITIONS);
            send(&p, "fidelity", partition, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
    }
    let mut mirror = pair.start(
        &[],
        &[("compression.type", "zstd")],
        &["--offset.commit.interval.ms", "300"],
    );
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    // The source holds every odd record (a broker may refuse a timestamp it finds too far
    // off: delivery reports are not read above).
    let all: Vec<Record> = (0..PARTITIONS)
        .flat_map(|p| pair.source_records(p))
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
        let s = pair.source_records(p);
        let t = pair.target_records(pair.topic, p);
        assert_eq!(s.len() as i64, end[p as usize]);
        assert!(
            s == t,
            "partition {p} differs: {}",
            first_difference(&s, &t)
        );
        checked += s.len();
        source_codecs.extend(
            pair.source
                .stored_batches("fidelity", p)
                .iter()
                .map(|b| b.codec),
        );
        // librdkafka sends a batch uncompressed when compressing would not shrink it (seen:
        // a batch of 3 records, 140 bytes).
        let target_batches = pair.target.stored_batches("fidelity", p);
        assert!(
            target_batches
                .iter()
                .all(|b| b.codec == "zstd" || (b.codec == "none" && b.size < 1024))
                && target_batches.iter().any(|b| b.codec == "zstd"),
            "the target's batches are not zstd: {target_batches:?}"
        );
    }
    let expected: std::collections::BTreeSet<_> = ["none", "gzip", "snappy", "lz4", "zstd"].into();
    assert_eq!(source_codecs, expected);
    eprintln!(
        "TRIAL fidelity kafka {}: {checked} records (odd fields, source batches {:?}, target zstd) \
         identical field by field in 3 partitions, {:.0} s",
        version.version(),
        source_codecs,
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
    fidelity(KAFKA_4);
}

#[test]
fn fidelity_on_kafka_3() {
    fidelity(KAFKA_3);
}

/// Kafka's default `auto.create.topics.enable=true` on the target: the mirror must still create
/// the target topic with the source's partition count and configs.
#[test]
fn a_target_with_auto_create_gets_the_source_partitions() {
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[("auto.create.topics.enable", "true")],
        TOPIC,
        3,
        &[("retention.ms", "123456789")],
    );
    pair.write(0..300);
    pair.mirror_until_committed(&[], 300);
    let configs = topic_configs(&pair.dst(), TOPIC);
    assert!(
        configs.contains(&("retention.ms".into(), "123456789".into())),
        "{configs:?}"
    );
    let c = pair.compare();
    assert!(c.is_exact() && c.source == 300, "{c:?}");
}

/// A LogAppendTime source topic: the target must hold each record with the source's append
/// time as its timestamp (the time the record entered the mirrored system), not the time the
/// mirror wrote it.
#[test]
fn a_log_append_time_source_keeps_its_timestamps() {
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
    // The target's append times would be later than every source append time.
    std::thread::sleep(Duration::from_millis(1500));
    pair.mirror_until_committed(&[], 500);
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
        "TRIAL log-append-time kafka 4.4.0: {checked} records keep the source's append times, \
         {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// A record whose batch is exactly the target topic's `max.message.bytes` is mirrored (the
/// producer's `message.max.bytes` set to the same limit, as an operator would).
#[test]
fn a_record_at_the_target_topics_max_message_bytes_is_mirrored() {
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
    let mut mirror = pair.start(
        &[("fetch.message.max.bytes", "1048576")],
        &[
            ("message.max.bytes", "1000000"),
            ("compression.type", "none"),
        ],
        &["--offset.commit.interval.ms", "300"],
    );
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
        "TRIAL max-message-bytes kafka 4.4.0: source batches {sizes:?} bytes, target batches \
         {target_sizes:?} bytes (limit {LIMIT}), 3 records identical"
    );
    assert!(target_sizes.contains(&LIMIT), "{target_sizes:?}");
}

// ---------------------------------------------------------------------------------------------
// Hard kills and clean hand-overs.

/// A small deterministic generator (xorshift), so kill moments are "random" but repeatable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Per partition: lost, changed and order asserted; duplicates counted.
fn compare_each(pair: &KafkaPair) -> Comparison {
    let mut total = Comparison {
        in_order: true,
        ..Comparison::default()
    };
    for p in 0..pair.partitions {
        let read = |bootstrap: &str| {
            mirror_maker::tools::compare::read_partition(
                bootstrap,
                pair.topic,
                p,
                Duration::from_secs(60),
            )
            .expect("reading a partition")
        };
        let c = mirror_maker::tools::compare::compare(&read(&pair.src()), &read(&pair.dst()));
        assert!(
            c.lost == 0 && c.changed == 0 && c.in_order,
            "partition {p}: {c:?}"
        );
        total.add(&c);
    }
    total
}

/// At least 10 SIGKILLs of the mirror while a writer keeps adding records: nothing lost, order
/// kept per partition; duplicates (the records acknowledged by the target after the last
/// commit before each kill) counted.
#[test]
fn hard_kills_during_a_steady_load_lose_nothing() {
    const KILLS: usize = 10;
    const PARTITIONS: i32 = 8;
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    pair.write(0..20_000);
    let trickle = pair.trickle(20_000, 100);
    let consumer = [
        ("session.timeout.ms", "2000"),
        ("heartbeat.interval.ms", "300"),
    ];
    let args = ["--offset.commit.interval.ms", "200"];
    let mut rng = Rng(0x5eed_1234_abcd_0011);
    let started = Instant::now();
    let mut committed_at_kills = Vec::new();
    let mut kill_points: Vec<Vec<i64>> = Vec::new();
    for _ in 0..KILLS {
        let mut mirror = pair.start(&consumer, &[], &args);
        wait_until(
            Duration::from_secs(60),
            "the mirror to get partitions",
            || mirror.log().contains("assigned") || !mirror.is_running(),
        );
        assert!(mirror.is_running(), "log:\n{}", mirror.log());
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        mirror.signal("KILL");
        mirror.wait(Duration::from_secs(10));
        let committed = committed(&pair.src(), TOPIC, PARTITIONS);
        // The source commit never passes what the offset mapping holds: a kill at any moment
        // leaves no committed record unmapped on the target.
        let mapping = stored_mapping(&pair.dst());
        for (p, &c) in committed.iter().enumerate().filter(|(_, &c)| c > 0) {
            let progress = mapping.progress(TOPIC, p as i32).map(|pr| pr.next);
            assert!(
                progress.is_some_and(|next| next >= c),
                "partition {p}: committed {c} on the source, the mapping holds {progress:?}"
            );
        }
        committed_at_kills.push(committed.iter().map(|c| c.max(&0)).sum::<i64>());
        kill_points.push(committed);
    }
    let written = trickle.stop();
    let mut last = pair.start(&consumer, &[], &args);
    let end = pair.wait_caught_up(&mut last);
    assert_eq!(last.stop().code(), Some(0), "log:\n{}", last.log());
    assert_eq!(end.iter().sum::<i64>() as u64, written);
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL hard-kills kafka 4.4.0: {KILLS} SIGKILLs (committed at each: {committed_at_kills:?}), \
         {}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (written, 0, 0), "{c:?}");
    // After ten restarts the target holds copies made twice. For each offset a group could
    // have committed (the restart points among them), the mapping's target offset is the
    // latest that loses nothing (from there the target holds every source record from that
    // offset on), and from there the group reads nothing it had read.
    let mapping = stored_mapping(&pair.dst());
    let mut translated = 0;
    for p in 0..PARTITIONS {
        let copied = copied_from(&pair.src(), &pair.dst(), TOPIC, p);
        let mut offsets: Vec<i64> = kill_points.iter().map(|k| k[p as usize]).collect();
        offsets.extend([0, 1, end[p as usize] / 2, end[p as usize]]);
        for offset in offsets.into_iter().filter(|&o| o >= 0) {
            let at = match &mapping.translate(TOPIC, p, offset)[..] {
                [Translation::Exact { offset: at, .. }] => *at,
                other => panic!("partition {p}, source offset {offset}: {other:?}"),
            };
            let lossless = latest_lossless_resume(&copied, offset);
            assert!(
                at <= lossless,
                "partition {p}: a group at source offset {offset} resumes at target offset \
                 {at}, past {lossless}: it would lose records"
            );
            let read_again = copied
                .iter()
                .filter(|&&(t, s)| t >= at && s < offset)
                .count();
            assert_eq!(
                read_again, 0,
                "partition {p}: a group at source offset {offset} resuming at {at} reads \
                 {read_again} records it had read"
            );
            assert_eq!(
                at, lossless,
                "partition {p}: a group at source offset {offset} resumes at {at}, before \
                 {lossless}: it reads copies made twice"
            );
            translated += 1;
        }
    }
    eprintln!(
        "TRIAL hard-kills kafka 4.4.0: {translated} offsets translated exactly (nothing lost, \
         nothing read twice)"
    );
    // Progress between kills: the trial killed a mirror that was copying, not one idle.
    assert!(
        committed_at_kills
            .windows(2)
            .filter(|w| w[1] > w[0])
            .count()
            >= KILLS / 2
    );
}

/// Three mirror processes in one group, stopped with SIGTERM and started again in turns while
/// a writer keeps adding records: nothing lost and nothing duplicated.
fn clean_hand_overs(version: KafkaVersion, consumer: &[(&str, &str)], exact: bool, name: &str) {
    const PARTITIONS: i32 = 12;
    let pair = KafkaPair::new(version, TOPIC, PARTITIONS);
    let args = ["--offset.commit.interval.ms", "300"];
    let start = |pair: &KafkaPair| {
        if exact {
            pair.start_exact(consumer, &[], &args)
        } else {
            pair.start(consumer, &[], &args)
        }
    };
    pair.write(0..3000);
    let trickle = pair.trickle(3000, 50);
    let mut mirrors: Vec<Mirror> = (0..3).map(|_| start(&pair)).collect();
    let started = Instant::now();
    let mut bounces = 0;
    for step in 0..6 {
        let i = step % 3;
        std::thread::sleep(Duration::from_millis(1500));
        let status = mirrors[i].stop();
        assert_eq!(
            status.code(),
            Some(0),
            "mirror {i} log:\n{}",
            mirrors[i].log()
        );
        bounces += 1;
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
    wait_committed(&mut mirrors[0], &pair.src(), TOPIC, PARTITIONS, total);
    for (i, m) in mirrors.iter_mut().enumerate() {
        assert_eq!(m.stop().code(), Some(0), "mirror {i} log:\n{}", m.log());
    }
    let c = pair.compare();
    eprintln!(
        "TRIAL clean-hand-overs kafka {} {name}: 3 processes, {bounces} SIGTERM bounces, {}, {:.0} s",
        version.version(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    if !c.is_exact() {
        for (i, m) in mirrors.iter().enumerate() {
            eprintln!("--- mirror {i} (last) log:\n{}", m.log());
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
    clean_hand_overs(
        KAFKA_4,
        &[("partition.assignment.strategy", "range")],
        false,
        "range",
    );
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact() {
    clean_hand_overs(
        KAFKA_4,
        &[("partition.assignment.strategy", "cooperative-sticky")],
        false,
        "cooperative-sticky",
    );
}

#[test]
fn clean_hand_overs_with_cooperative_sticky_are_exact_on_kafka_3() {
    clean_hand_overs(
        KAFKA_3,
        &[("partition.assignment.strategy", "cooperative-sticky")],
        false,
        "cooperative-sticky",
    );
}

/// KIP-848: the broker assigns partitions; the client sets none of the classic protocol's
/// timing or assignor settings.
#[test]
fn clean_hand_overs_with_the_consumer_group_protocol_are_exact() {
    clean_hand_overs(
        KAFKA_4,
        &[("group.protocol", "consumer"), ("fetch.wait.max.ms", "10")],
        true,
        "group.protocol=consumer",
    );
}

// ---------------------------------------------------------------------------------------------
// Transactions, compaction, broker faults.

/// Committed and aborted transactions interleaved (the last one aborted): the mirror copies the
/// committed records only, and its committed offsets reach each partition's end (past the
/// control records), so its lag is 0.
fn transactional_source(check_lag: bool) {
    const PARTITIONS: i32 = 3;
    const TRANSACTIONS: u64 = 30;
    const PER_TRANSACTION: u64 = 60;
    let started = Instant::now();
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    let p = producer(&pair.src(), &[("transactional.id", "trial-writer")]);
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
            send(&p, TOPIC, (i % PARTITIONS as u64) as i32, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
        if aborted {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
            committed_records += PER_TRANSACTION;
        }
    }
    let mut mirror = pair.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
    wait_until(
        Duration::from_secs(60),
        "the committed records on the target",
        || {
            (0..PARTITIONS)
                .map(|p| {
                    // Nothing yet while the mirror has not created the target topic.
                    mirror_maker::tools::compare::read_partition(
                        &pair.dst(),
                        TOPIC,
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
        let batches = pair.source.stored_batches(TOPIC, part);
        assert!(batches.iter().any(|b| b.control), "no control records");
    }
    assert_eq!(copied, committed_records);
    eprintln!(
        "transactions: end offsets {end:?}, committed {committed:?} while running, \
         {after_stop:?} after SIGTERM"
    );
    eprintln!(
        "TRIAL transactions kafka 4.4.0: {TRANSACTIONS} transactions ({} aborted, the last two \
         among them), {copied} committed records copied, 0 aborted ones; end offsets {end:?}, \
         committed {after_stop:?}, {:.0} s",
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
    transactional_source(false);
}

/// The same, and the group's committed offsets reach each partition's end: past the last
/// commit marker and past aborted transactions at the tail, so that the group's lag (end
/// offset minus committed offset, as Kafka's tools compute it) is 0.
#[test]
fn a_transactional_source_leaves_no_lag() {
    transactional_source(true);
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

/// Writes `rounds` rounds of the same `keys` keys (values naming the round) to partition
/// `i % partitions`.
fn write_keyed(bootstrap: &str, rounds: std::ops::Range<u64>, keys: u64, partitions: i32) {
    let p = producer(bootstrap, &[("linger.ms", "5")]);
    for round in rounds {
        for k in 0..keys {
            let r = Record {
                key: Some(format!("key-{k}").into_bytes()),
                value: Some(format!("round {round} of key {k}").into_bytes()),
                headers: vec![("round".into(), Some(round.to_string().into_bytes()))],
                timestamp: Some(1_700_000_000_000 + (round * keys + k) as i64),
            };
            send(&p, TOPIC, (k % partitions as u64) as i32, &r);
        }
        p.flush(Duration::from_secs(30)).unwrap();
        // Each round in its own segment (segment.ms = 100).
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
fn compacted_source(freeze: bool) {
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
    write_keyed(&pair.src(), 0..10, KEYS, PARTITIONS);
    // The cleaner leaves the active segment alone: one more write rolls the last round's.
    write_keyed(&pair.src(), 10..11, 1, PARTITIONS);
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
    let args = ["--offset.commit.interval.ms", "300"];
    let mut mirror = pair.start(&[], &[], &args);
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    write_keyed(&pair.src(), 11..16, KEYS, PARTITIONS);
    let mut mirror = pair.start(&[], &[], &args);
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let (code, json, stderr) = verify(&pair);
    let totals = &json["totals"];
    eprintln!(
        "TRIAL compacted kafka 4.4.0 (cleaner {}): {} records left of offsets 0..{end_before} at \
         the first run; end offsets {end:?} after the restart, {} source records then; verify: \
         {totals}, {:.0} s",
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
    compacted_source(true);
}

/// The source's cleaner keeps compacting after records were mirrored: the target then holds
/// versions of keys the source no longer has (until the target's own cleaner runs).
#[test]
fn verify_passes_when_the_source_compacts_mirrored_records() {
    compacted_source(false);
}

/// A 3-broker target with replication factor 3 and min.insync.replicas=2: one target broker
/// SIGKILLed and restarted mid-stream; the mirror keeps going and loses nothing.
#[test]
fn a_target_broker_killed_and_restarted_mid_stream_loses_nothing() {
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
    let mut mirror = pair.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
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
    std::thread::sleep(Duration::from_secs(2));
    let written = trickle.stop();
    let end = pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(end.iter().sum::<i64>() as u64, written);
    let c = compare_each(&pair);
    eprintln!(
        "TRIAL target-broker-restart kafka 4.4.0: broker 2 of 3 SIGKILLed at {killed} committed; \
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
    const PARTITIONS: i32 = 4;
    const RECORDS: u64 = 40_000;
    let started = Instant::now();
    let mut pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    pair.write(0..RECORDS);
    // A small producer queue keeps the copy going long enough to be cut.
    let mut mirror = pair.start(
        &[],
        &[("queue.buffering.max.messages", "500")],
        &["--offset.commit.interval.ms", "200"],
    );
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&pair.src(), TOPIC, PARTITIONS) > 0
    });
    pair.source.kill(1);
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
        "TRIAL source-broker-restart kafka 4.4.0: the source's broker SIGKILLed mid-copy, down 5 s; \
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
    let mut mirror = pair.start(
        &[],
        &[("message.max.bytes", "2000000"), ("batch.size", "50000")],
        &["--offset.commit.interval.ms", "200"],
    );
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
    let mut mirror = pair.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&pair.src(), TOPIC, PARTITIONS) > 3000
    });
    pair.target.kill(2);
    pair.target.kill(3);
    // What was in flight settles within a few seconds; then nothing more is committed.
    std::thread::sleep(Duration::from_secs(4));
    let held = committed_total(&pair.src(), TOPIC, PARTITIONS);
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
        "TRIAL two-target-brokers-down kafka 4.4.0: committed {held} then {still} over 6 s with \
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
fn partition_growth(abort: bool) {
    let started = Instant::now();
    let mut pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..2000);
    let mode = if abort { "true" } else { "false" };
    let mut mirror = pair.start(
        &[],
        &[],
        &[
            "--offset.commit.interval.ms",
            "300",
            "--topic.refresh.interval.ms",
            "1000",
            "--abort.on.send.failure",
            mode,
        ],
    );
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
        "TRIAL partition-growth kafka 4.4.0 (abort.on.send.failure {mode}): source grown from 2 to \
         4 partitions mid-stream; end offsets {end:?}; {}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (4000, 0, 0), "{c:?}");
}

#[test]
fn partition_growth_is_mirrored_in_abort_mode() {
    partition_growth(true);
}

#[test]
fn partition_growth_is_mirrored_in_skip_mode() {
    partition_growth(false);
}

/// Each start adds a segment per partition to the offset mapping. At start the mirror removes
/// those wholly below the source's log start (the latest of them stays), and every
/// translation from the log start on is what it was.
#[test]
fn the_offset_mapping_is_pruned_below_the_sources_log_start() {
    const PARTITIONS: i32 = 2;
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    let mut after_two = Vec::new();
    for round in 0..3u64 {
        pair.write(round * 100..(round + 1) * 100);
        pair.mirror_until_committed(&[], ((round + 1) * 100) as i64);
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
    let mut mirror = pair.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
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
