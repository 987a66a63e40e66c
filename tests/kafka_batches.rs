//! Trials of the batch engine (`--copy.mode batches`) on Apache Kafka: the source's batches
//! forwarded as they are, each guarantee of the record engine checked record by record.
//!
//! The trials share one pair of clusters per Kafka version ([`SharedPair`]), each with a
//! topic and a group of its own: a pair costs 7 to 14 s to start on a loaded runner.

use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use mirror_maker::mirror::flush::send_waiting;
use mirror_maker::tools::compare::{compare, read_partition, Comparison, OwnedRecord as Record};
use mirror_test_harness::failover::{
    app_read_and_commit, commit_offsets, group_offsets, read_from, resume, send_id, translate,
    write_ids, write_transactions, Resumption,
};
use mirror_test_harness::faults::{FaultProxy, ReplicatedPair};
use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const PARTITIONS: i32 = 2;

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

/// Sends the sample records `range` (spread over the partitions) and waits for them.
fn write(p: &BaseProducer, topic: &str, range: std::ops::Range<u64>) {
    write_values(p, topic, range, 100);
}

/// As [`write`], with values of `value_bytes`.
fn write_values(p: &BaseProducer, topic: &str, range: std::ops::Range<u64>, value_bytes: usize) {
    for i in range {
        let s = sample(i, PARTITIONS, value_bytes);
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(s.partition)
            .timestamp(s.timestamp);
        record.key = s.key.as_deref();
        record.payload = s.value.as_deref();
        send_waiting(p, record, None).expect("producing to the source");
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))
        .expect("flushing the source producer");
}

/// A batch mirror of `lane` (the target topic's configs left as they are) run until it has
/// committed the source's end, then stopped: exit 0.
fn copied_with_batches(lane: &Endpoints) {
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .flag("--sync.topic.configs", "false")
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
}

fn same_records(lane: &Endpoints) {
    for p in 0..PARTITIONS {
        let s: Vec<Record> = lane.source_records(p);
        let t: Vec<Record> = lane.target_records(lane.topic, p);
        assert_eq!(s.len(), t.len(), "partition {p}: record counts");
        assert!(s == t, "partition {p}: the records differ");
    }
}

/// The default engine choice (`--copy.mode auto`, no flag given) copies batches on Kafka where
/// no setting needs the record engine, and says so once at start.
#[test]
fn the_default_copies_batches_on_kafka() {
    let lane = SharedPair::get(KAFKA_4).lane("default-engine", PARTITIONS);
    let p = producer(
        &lane.src(),
        &[("compression.type", "lz4"), ("linger.ms", "20")],
    );
    write(&p, "default-engine", 0..1000);
    let checked = lane.check(&[]);
    assert!(
        checked.contains("engine: batches (--copy.mode auto)"),
        "check:\n{checked}"
    );
    let mut mirror = lane.mirror().default_copy_mode().commit_ms(300).start();
    mirror.wait_for_log(
        "copying record batches as they are (--copy.mode auto)",
        "the batch engine, chosen by default",
    );
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    same_records(&lane);
    assert!(
        !mirror.log().contains("copying records"),
        "the record engine never started:\n{}",
        mirror.log()
    );
}

/// Every codec's batches reach the target as the same batches (same record counts, same
/// codec), every record identical field by field.
fn every_codec_is_forwarded_batch_for_batch(version: KafkaVersion) {
    let started = Instant::now();
    let pair = SharedPair::get(version);
    let lane = pair.lane("codecs", PARTITIONS);
    for (c, codec) in ["none", "gzip", "snappy", "lz4", "zstd"].iter().enumerate() {
        let p = producer(
            &lane.src(),
            &[("compression.type", codec), ("linger.ms", "20")],
        );
        write(&p, "codecs", c as u64 * 600..(c as u64 + 1) * 600);
    }
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .start();
    mirror.wait_for_log("copying record batches as they are", "the batch engine");
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    same_records(&lane);
    let mut batches = 0;
    for p in 0..PARTITIONS {
        let shape = |b: &StoredBatch| (b.last_offset - b.base_offset, b.codec);
        let s: Vec<_> = pair
            .source
            .stored_batches("codecs", p)
            .iter()
            .map(shape)
            .collect();
        let t: Vec<_> = pair
            .target
            .stored_batches("codecs", p)
            .iter()
            .map(shape)
            .collect();
        assert_eq!(
            s, t,
            "partition {p}: the target's batches are not the source's"
        );
        batches += s.len();
    }
    eprintln!(
        "TRIAL batches codecs kafka {}: 3000 records in {batches} batches (none, gzip, snappy, \
         lz4, zstd) forwarded batch for batch, {:.0} s",
        version.version(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn every_codec_is_forwarded_batch_for_batch_on_kafka_4() {
    every_codec_is_forwarded_batch_for_batch(KAFKA_4);
}

#[test]
fn every_codec_is_forwarded_batch_for_batch_on_kafka_3() {
    every_codec_is_forwarded_batch_for_batch(KAFKA_3);
}

/// The oldest line the engine claims (ZooKeeper mode; Fetch v12, Produce v9, InitProducerId
/// v4 at most).
#[test]
fn every_codec_is_forwarded_batch_for_batch_on_kafka_2() {
    every_codec_is_forwarded_batch_for_batch(KAFKA_2);
}

/// Source topics whose logs hold message sets of the formats before Kafka 0.11 (v1 written
/// under `message.format.version` 0.10.2, v0 under 0.9.0, which Kafka 2.8 still honours),
/// uncompressed and in the codecs those formats have: every record copied in order with its
/// key, value and timestamp (v0 has none), as v2 batches. librdkafka 2.12.1's consumer reads
/// nothing from such a log (no record, no error, while Kafka's console consumer reads it), so
/// the records expected are the ones written, not read back from the source. v0 with lz4 is
/// left out: Kafka writes its frame with Kafka 0.8's wrong header checksum, which the batch
/// engine does not read.
#[test]
fn legacy_message_sets_are_copied_as_v2_batches_on_kafka_2() {
    const RECORDS_A_CODEC: u64 = 400;
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_2);
    for (topic, format, magic, codecs) in [
        (
            "legacy-v1",
            "0.10.2-IV0",
            1,
            &["none", "gzip", "snappy", "lz4"][..],
        ),
        ("legacy-v0", "0.9.0", 0, &["none", "gzip", "snappy"][..]),
    ] {
        let lane = pair.lane_with(topic, PARTITIONS, &[("message.format.version", format)]);
        pair.target.create_topic(topic, PARTITIONS, 1, &[]);
        let written = RECORDS_A_CODEC * codecs.len() as u64;
        for (n, codec) in codecs.iter().enumerate() {
            let p = producer(
                &lane.src(),
                &[("compression.codec", codec), ("linger.ms", "20")],
            );
            let from = n as u64 * RECORDS_A_CODEC;
            write_values(&p, topic, from..from + RECORDS_A_CODEC, 200);
        }
        let magics = pair.source.stored_magics(topic, 0);
        assert!(
            !magics.is_empty() && magics.iter().all(|&m| m == magic),
            "the premise: {topic} holds message sets of format v{magic}, not {magics:?}"
        );
        copied_with_batches(&lane);
        for p in 0..PARTITIONS {
            let expected: Vec<Record> = (0..written)
                .map(|i| sample(i, PARTITIONS, 200))
                .filter(|s| s.partition == p)
                .map(|s| Record {
                    key: s.key,
                    value: s.value,
                    headers: Vec::new(),
                    timestamp: (magic == 1).then_some(s.timestamp),
                })
                .collect();
            let mut target = lane.target_records(topic, p);
            if magic == 0 {
                // No timestamp (-1), however the reader gives it.
                for r in &mut target {
                    r.timestamp = r.timestamp.filter(|&t| t >= 0);
                }
            }
            assert_eq!(target.len(), expected.len(), "{topic}/{p}: record counts");
            assert!(target == expected, "{topic}/{p}: the records differ");
        }
        let stored = pair.target.stored_magics(topic, 0);
        assert!(
            stored.iter().all(|&m| m == 2),
            "the target holds {stored:?}"
        );
        eprintln!(
            "TRIAL batches legacy-v{magic} kafka 2.8.2: {written} records in {} source message \
             sets of format v{magic} on partition 0 ({}), as {} v2 batches on the target; \
             {:.0} s",
            magics.len(),
            codecs.join(", "),
            stored.len(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// A target topic that takes smaller batches (`max.message.bytes` 64 KiB) than the source
/// holds (uncompressed, up to a megabyte): each source batch is split into batches it takes,
/// every record copied, in order.
#[test]
fn source_batches_larger_than_the_target_topic_takes_are_split() {
    const LIMIT: usize = 64 * 1024;
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane("small-target", PARTITIONS);
    pair.target.create_topic(
        "small-target",
        PARTITIONS,
        1,
        &[("max.message.bytes", &LIMIT.to_string())],
    );
    let p = producer(&lane.src(), &[("linger.ms", "50")]);
    write_values(&p, "small-target", 0..2000, 1024);
    let largest = |cluster: &KafkaCluster| {
        (0..PARTITIONS)
            .flat_map(|p| cluster.stored_batches("small-target", p))
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    };
    let source_largest = largest(&pair.source);
    assert!(
        source_largest > LIMIT,
        "the source's largest batch ({source_largest} bytes) fits the target topic: nothing to split"
    );
    copied_with_batches(&lane);
    same_records(&lane);
    let target_largest = largest(&pair.target);
    eprintln!(
        "TRIAL batches split: source batches up to {source_largest} bytes, target batches up \
         to {target_largest} bytes (max.message.bytes {LIMIT})"
    );
    assert!(
        target_largest <= LIMIT,
        "a target batch of {target_largest} bytes"
    );
}

/// The librdkafka consumer keeps the group but never fetches: its statistics count no
/// record received.
#[test]
fn the_source_consumer_never_fetches() {
    let lane = SharedPair::get(KAFKA_4).lane("unfetched", PARTITIONS);
    write(
        &producer(&lane.src(), &[("linger.ms", "20")]),
        "unfetched",
        0..1000,
    );
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .consumer(&[("statistics.interval.ms", "100")])
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    // A few statistics intervals after the copy.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    same_records(&lane);
    let log = mirror.log();
    assert!(
        log.contains("the source consumer fetched 0 records itself"),
        "log:\n{log}"
    );
}

/// The group's commit of `lane`'s partition 0 set two records into its first source batch of
/// five or more records (the other partitions' commits as `others` say), then a batch mirror
/// until it has caught up and stopped (exit 0). Returns that batch, the start and the log.
fn mirror_from_inside_a_batch(
    pair: &SharedPair,
    lane: &Endpoints,
    others: &[(i32, i64)],
) -> (StoredBatch, i64, String) {
    let big = pair
        .source
        .stored_batches(lane.topic, 0)
        .into_iter()
        .find(|b| b.last_offset - b.base_offset >= 4)
        .expect("a batch of several records");
    let start = big.base_offset + 2;
    let mut commits = vec![(0, start)];
    commits.extend_from_slice(others);
    commit_offsets(&lane.src(), lane.group, lane.topic, &commits);
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    (big, start, mirror.log())
}

/// A committed offset inside a source batch: the records before it are not copied again.
#[test]
fn a_committed_offset_inside_a_batch_copies_nothing_before_it() {
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane("inside", PARTITIONS);
    write(
        &producer(&lane.src(), &[("linger.ms", "50")]),
        "inside",
        0..1000,
    );
    let (_, start, _) = mirror_from_inside_a_batch(pair, &lane, &[(1, 0)]);
    let s: Vec<Record> = lane.source_records(0);
    let t: Vec<Record> = lane.target_records(lane.topic, 0);
    assert!(
        t == s[start as usize..],
        "partition 0: the target holds {} records, the source from offset {start} {}",
        t.len(),
        s.len() - start as usize
    );
}

/// A LogAppendTime source topic, whose every batch the engine encodes again, its records
/// carrying a header named `0xFF 0xFE` (not UTF-8) and a repeated name (`hop` with a value,
/// then without): every record reaches the target with its headers byte for byte, in order,
/// and the mirror stops cleanly (exit 0). Before the engine's own record codec the re-encode
/// path stopped the mirror at the first such batch, at every restart ("could not be decoded
/// to be encoded again: invalid utf-8"; issue 42, item 1), and a repeated name alone sent the
/// batch through librdkafka's producer.
#[test]
fn header_names_not_utf8_or_repeated_reach_the_target_byte_for_byte_when_encoded_again() {
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane_with(
        "raw-headers",
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let headers: Vec<RawHeader> = vec![
        (vec![0xFF, 0xFE], Some(b"not utf-8".to_vec())),
        (b"hop".to_vec(), Some(b"a".to_vec())),
        (b"hop".to_vec(), None),
    ];
    write_with_raw_headers(&lane.src(), lane.topic, 0, 200, &headers);
    let log = lane.mirror_until_committed(&["--copy.mode", "batches"], 200);
    let got = raw_headers(&lane.dst(), lane.topic, 0, 200);
    assert_eq!(got.len(), 200, "records on the target; log:\n{log}");
    for (i, record) in got.iter().enumerate() {
        assert_eq!(record, &headers, "record {i}; log:\n{log}");
    }
    let s: Vec<Record> = lane.source_records(0);
    let t: Vec<Record> = lane.target_records(lane.topic, 0);
    assert!(
        t == s,
        "the target's records differ from the source's; log:\n{log}"
    );
    eprintln!(
        "TRIAL batches raw-headers kafka 4.4.0: 200 LogAppendTime records with a header name \
         0xFF 0xFE and a repeated one, each identical on the target; {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// One zstd batch of 16 records of 32 MiB of zeros (a few KB on the wire, 512 MiB
/// uncompressed) on a LogAppendTime topic, which the engine encodes again: the mirror copies
/// every record and its memory stays within a stream's budget (peak RSS under 256 MiB).
/// Before, the engine decompressed the whole records section and encoded it again in memory:
/// about twice the batch's uncompressed size (a trial with 30 such records peaked at
/// 1,891 MiB; issue 42, item 2).
#[test]
fn a_batch_that_expands_a_thousandfold_is_copied_in_bounded_memory() {
    const RECORDS: usize = 16;
    const SIZE: usize = 32 << 20;
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane_with("zeros", 1, &[("message.timestamp.type", "LogAppendTime")]);
    write_zeros_in_one_batch(&lane.src(), lane.topic, 0, RECORDS, SIZE, "zstd");
    let mut mirror = lane
        .mirror()
        .args(&[
            "--copy.mode",
            "batches",
            "--offset.commit.interval.ms",
            "300",
        ])
        .start();
    lane.wait_caught_up(&mut mirror);
    let status = std::fs::read_to_string(format!("/proc/{}/status", mirror.pid()))
        .expect("the mirror's /proc status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    assert_eq!(
        end_offsets(&lane.dst(), lane.topic, 1),
        vec![RECORDS as i64],
        "records on the target; log:\n{}",
        mirror.log()
    );
    let peak_mib = peak_kib / 1024;
    assert!(
        peak_mib < 256,
        "the mirror's peak RSS was {peak_mib} MiB for a batch of {} MiB uncompressed",
        (RECORDS * SIZE) >> 20
    );
    eprintln!(
        "TRIAL batches zeros kafka 4.4.0: one zstd LogAppendTime batch of {RECORDS} x 32 MiB \
         of zeros copied, peak RSS {peak_mib} MiB; {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// A committed offset inside an lz4 source batch whose records each repeat a header key (`hop`
/// three times): the batch must be encoded again from the start, every header kept in order
/// (the codec keeps headers as bytes, in a list). Every record from the start on reaches the
/// target with every header, in order; none before it; the records after that batch are
/// forwarded as batches as they came.
#[test]
fn a_start_inside_a_batch_with_repeated_header_keys_keeps_every_header() {
    use rdkafka::message::{Header, OwnedHeaders};
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane("repeated-headers", 1);
    let p = producer(
        &lane.src(),
        &[("linger.ms", "50"), ("compression.type", "lz4")],
    );
    for i in 0..400u64 {
        // Batches of 100 or fewer: a flush ends each.
        if i % 100 == 0 {
            p.flush(Duration::from_secs(30)).unwrap();
        }
        let key = format!("key-{i}");
        let value = format!("value-{i}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "hop",
                value: Some(format!("a-{i}").as_bytes()),
            })
            .insert(Header {
                key: "hop",
                value: Some(format!("b-{i}").as_bytes()),
            })
            .insert(Header {
                key: "hop",
                value: None::<&[u8]>,
            });
        let record: BaseRecord<'_, str, str> = BaseRecord::to("repeated-headers")
            .partition(0)
            .key(key.as_str())
            .payload(value.as_str())
            .timestamp(1_700_000_000_000 + i as i64)
            .headers(headers);
        send_waiting(&p, record, None).expect("producing to the source");
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let batches = pair.source.stored_batches("repeated-headers", 0);
    let (big, start, _log) = mirror_from_inside_a_batch(pair, &lane, &[]);
    let s: Vec<Record> = lane.source_records(0);
    let t: Vec<Record> = lane.target_records(lane.topic, 0);
    assert!(
        s.iter().all(|r| r.headers.len() == 3),
        "the source's headers"
    );
    assert!(
        t == s[start as usize..],
        "the target holds {} records, the source from offset {start} {}; first: {:?}",
        t.len(),
        s.len() - start as usize,
        t.first()
    );
    // Only the batch with the start inside was encoded again: the rest are the source's.
    let shape = |b: &StoredBatch| (b.last_offset - b.base_offset, b.codec);
    let source_after: Vec<_> = batches
        .iter()
        .filter(|b| b.base_offset > big.last_offset)
        .map(shape)
        .collect();
    let target = pair.target.stored_batches("repeated-headers", 0);
    let target_after: Vec<_> = target
        .iter()
        .filter(|b| b.base_offset > big.last_offset - start)
        .map(shape)
        .collect();
    assert!(!source_after.is_empty(), "source batches: {batches:?}");
    assert_eq!(
        source_after, target_after,
        "the batches after the one encoded again"
    );
    eprintln!(
        "TRIAL batches repeated-headers kafka 4.4.0: start {start} inside the batch {}..={}, \
         {} records with 3 `hop` headers each identical, {} later batches forwarded as they are",
        big.base_offset,
        big.last_offset,
        t.len(),
        target_after.len()
    );
}

/// Batches of aborted transactions and transaction markers are dropped: only committed
/// records reach the target.
#[test]
fn a_transactional_source_is_copied_committed_records_only() {
    transactional_source_copied_committed_records_only(KAFKA_4);
}

/// The same from a Kafka 2.8 source (ZooKeeper mode): its Fetch answers list the aborted
/// transactions as 4.x does.
#[test]
fn a_transactional_source_is_copied_committed_records_only_on_kafka_2() {
    transactional_source_copied_committed_records_only(KAFKA_2);
}

fn transactional_source_copied_committed_records_only(version: KafkaVersion) {
    let lane = SharedPair::get(version).lane("txn", PARTITIONS);
    let p = producer(&lane.src(), &[("transactional.id", "batch-trial")]);
    p.init_transactions(Duration::from_secs(30)).unwrap();
    let mut committed = 0;
    for t in 0..12u64 {
        p.begin_transaction().unwrap();
        let aborted = t % 3 == 1;
        for i in 0..50u64 {
            let value = if aborted { "aborted" } else { "committed" };
            let key = format!("t{t}-{i}");
            let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to("txn")
                .partition((i % PARTITIONS as u64) as i32)
                .key(key.as_bytes())
                .payload(value.as_bytes())
                .timestamp(1_700_000_000_000 + (t * 50 + i) as i64);
            send_waiting(&p, record, None).unwrap();
        }
        p.flush(Duration::from_secs(30)).unwrap();
        if aborted {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
            committed += 50;
        }
    }
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .start();
    wait_until(
        Duration::from_secs(60),
        "the committed records copied",
        || {
            (0..PARTITIONS)
                .map(|p| {
                    mirror_maker::tools::compare::read_partition(
                        &lane.dst(),
                        "txn",
                        p,
                        Duration::from_secs(5),
                    )
                    .map_or(0, |r| r.len())
                })
                .sum::<usize>()
                >= committed
                || !mirror.is_running()
        },
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let mut copied = 0;
    for part in 0..PARTITIONS {
        let t = lane.target_records(lane.topic, part);
        assert!(
            t.iter()
                .all(|r| r.value.as_deref() == Some(&b"committed"[..])),
            "an aborted record reached the target"
        );
        let s = lane.source_records(part);
        assert!(s == t, "partition {part} differs");
        copied += t.len();
    }
    assert_eq!(copied, committed);
}

/// SIGKILLs of a batch-engine mirror at moments of its copy while a writer keeps adding
/// records, then a mirror that catches up: every source record on the target, unchanged, in
/// order per partition. Records acknowledged after a kill's last commit are copied again (at
/// least once): counted, not refused.
#[test]
fn hard_kills_of_the_batch_engine_lose_nothing_and_keep_order() {
    hard_kills_of_the_batch_engine(KAFKA_4);
}

/// The same with Kafka 2.8 (ZooKeeper mode) on both sides: the group coordinator, the fetch
/// sessions and the producer state of the oldest line claimed.
#[test]
fn hard_kills_of_the_batch_engine_lose_nothing_and_keep_order_on_kafka_2() {
    hard_kills_of_the_batch_engine(KAFKA_2);
}

fn hard_kills_of_the_batch_engine(version: KafkaVersion) {
    const KILLS: usize = 5;
    let lane = SharedPair::get(version).lane("killed", 4);
    lane.write(0..10_000);
    let trickle = lane.trickle(10_000, 50);
    let instance = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .consumer(&[
            ("session.timeout.ms", "2000"),
            ("heartbeat.interval.ms", "300"),
        ])
        .commit_ms(200);
    let mut rng = Rng(0x5eed_ba7c_4e50_0d11);
    let started = Instant::now();
    let mut committed_at_kills = Vec::new();
    for _ in 0..KILLS {
        let mut mirror = instance.start();
        mirror.wait_for_log("assigned", "the mirror to get partitions");
        // Not a condition: the kill comes at a random moment of the copy.
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        mirror.signal("KILL");
        mirror.wait(Duration::from_secs(10));
        committed_at_kills.push(lane.committed().iter().map(|c| c.max(&0)).sum::<i64>());
    }
    let written = trickle.stop();
    let mut last = instance.start();
    lane.wait_caught_up(&mut last);
    assert_eq!(last.stop().code(), Some(0), "log:\n{}", last.log());
    let c = lane.compare();
    eprintln!(
        "TRIAL batches hard-kills kafka {}: {KILLS} SIGKILLs (committed at each: \
         {committed_at_kills:?}), {}, {:.0} s",
        version.version(),
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (written, 0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
}

/// A second batch-engine instance joins the group while the first copies, then the first is
/// stopped with SIGTERM (it flushes and commits before its partitions move): every source
/// record on the target, unchanged, in order per partition, and both exit 0.
#[test]
fn a_clean_hand_over_between_batch_instances_loses_nothing_and_keeps_order() {
    let lane = SharedPair::get(KAFKA_4).lane("handed-over", 6);
    lane.write(0..3000);
    let trickle = lane.trickle(3000, 50);
    let instance = lane.mirror().flag("--copy.mode", "batches").commit_ms(300);
    let mut first = instance.start();
    first.wait_for("the first instance to commit", |_| {
        lane.committed().iter().any(|&c| c > 0)
    });
    let started = Instant::now();
    let mut second = instance.start();
    // Cooperative rebalancing first hands the newcomer nothing ("assigned 0 partitions"):
    // wait until it owns some, so that both copy before the first one goes.
    second.wait_for("the second instance to own partitions", |m| {
        m.log()
            .lines()
            .any(|l| l.contains("(batch engine): ") && !l.contains("assigned 0 partitions"))
    });
    let before = lane.committed();
    first.wait_for("the group to commit with both instances in it", |_| {
        lane.committed() != before
    });
    assert_eq!(first.stop().code(), Some(0), "first log:\n{}", first.log());
    let written = trickle.stop();
    lane.wait_caught_up(&mut second);
    assert_eq!(
        second.stop().code(),
        Some(0),
        "second log:\n{}",
        second.log()
    );
    let c = lane.compare();
    eprintln!(
        "TRIAL batches clean-hand-over kafka 4.4.0: 2 processes, 1 SIGTERM, {}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (written, 0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
}

/// The source topic gains partitions (CreatePartitions) while a batch-engine mirror runs:
/// the target topic is grown and the new partitions are copied after the next metadata
/// refresh, every record in order, nothing lost (the batch engine's twin of
/// `kafka_trials::partition_growth_is_mirrored_in_abort_mode`).
#[test]
fn partition_growth_is_followed_by_the_batch_engine() {
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let mut lane = pair.lane("grown", 2);
    lane.write(0..1000);
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .topic_refresh_ms(1000)
        .start();
    lane.wait_caught_up(&mut mirror);
    pair.source.add_partitions("grown", 4);
    lane.partitions = 4;
    lane.write(1000..2000);
    let end = lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = lane.compare();
    eprintln!(
        "TRIAL batches partition-growth kafka 4.4.0: source grown from 2 to 4 partitions \
         mid-stream; end offsets {end:?}; {}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (2000, 0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
}

/// Records the source deleted (its log start moved past the committed offset, as retention
/// moves it) before a batch-engine mirror read them: the fetch's OFFSET_OUT_OF_RANGE makes
/// it go on from the log start, with a warning naming the partition and the offsets skipped,
/// and `mirror_records_skipped_total{reason="retention"}` counting them, as the record engine
/// counts them (`mirror_mock::records_deleted_by_retention_before_they_were_mirrored_are_logged_and_counted`).
#[test]
fn records_deleted_by_retention_before_the_batch_engine_read_them_are_logged_and_counted() {
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("retention", PARTITIONS);
    // The log start moved inside a batch makes the engine encode that batch again.
    let p = producer(&lane.src(), &[("linger.ms", "20")]);
    write(&p, "retention", 0..200);
    lane.mirror_until_committed(&["--copy.mode", "batches"], 200);
    let committed = lane.committed();
    let first: Vec<Vec<Record>> = (0..PARTITIONS)
        .map(|p| lane.target_records(lane.topic, p))
        .collect();
    write(&p, "retention", 200..1000);
    let low: Vec<i64> = committed.iter().map(|c| c + 150).collect();
    delete_records(&lane.src(), lane.topic, &low);
    let addr = free_local_addr();
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    lane.wait_caught_up(&mut mirror);
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    for p in 0..PARTITIONS as usize {
        let expected = format!("retention/{p} offsets {} to {}", committed[p], low[p] - 1);
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains(&expected) && l.contains("retention")),
            "no warning naming {expected}:\n{log}"
        );
    }
    let skipped = metric(
        &body,
        "mirror_records_skipped_total",
        "reason=\"retention\"",
    );
    eprintln!(
        "TRIAL batches retention kafka 4.4.0: committed {committed:?}, log start moved to \
         {low:?}; skipped counted {skipped:?}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(skipped, Some(150.0 * PARTITIONS as f64), "{body}");
    for p in 0..PARTITIONS {
        // The first run's copy, then the source from its new log start.
        let mut expected = first[p as usize].clone();
        expected.extend(lane.source_records(p));
        let t = lane.target_records(lane.topic, p);
        assert!(
            t == expected,
            "partition {p}: the target holds {} records, not the {} of the first copy and \
             the source from its log start",
            t.len(),
            expected.len()
        );
    }
}

/// Where a record of `topic` is refused: a lane whose partition 0 holds a record of 500 KB at
/// offset [`REFUSED_AT`] among 4,000 small ones, partition 1 small ones only, and a target
/// topic of `max.message.bytes` 100,000.
const REFUSED_AT: u64 = 2000;

fn a_lane_with_a_record_the_target_refuses(topic: &'static str) -> Endpoints {
    lane_with_a_refused_record(topic, false)
}

/// As [`a_lane_with_a_record_the_target_refuses`]; with `repeated_headers`, every record
/// carries the header `hop` twice.
fn lane_with_a_refused_record(topic: &'static str, repeated_headers: bool) -> Endpoints {
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    pair.target
        .create_topic(topic, PARTITIONS, 1, &[("max.message.bytes", "100000")]);
    let p = producer(&lane.src(), &[("linger.ms", "5")]);
    let big = vec![b'x'; 500_000];
    for i in 0..REFUSED_AT * 2 + 1 {
        for partition in 0..PARTITIONS {
            let s = sample(i, 1, 100);
            let value = if partition == 0 && i == REFUSED_AT {
                Some(&big[..])
            } else {
                s.value.as_deref()
            };
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition(partition)
                .timestamp(s.timestamp);
            record.key = s.key.as_deref();
            record.payload = value;
            if repeated_headers {
                use rdkafka::message::{Header, OwnedHeaders};
                let hop = |value: &'static str| Header {
                    key: "hop",
                    value: Some(value),
                };
                record = record.headers(OwnedHeaders::new().insert(hop("a")).insert(hop("b")));
            }
            send_waiting(&p, record, None).expect("producing to the source");
        }
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30)).unwrap();
    lane
}

/// What an abort-mode batch mirror of a lane with a refused record left: its exit, its log,
/// the group's commits, and partition 0 of both sides.
struct Refusal {
    status: std::process::ExitStatus,
    log: String,
    committed: Vec<i64>,
    source: Vec<Record>,
    target: Vec<Record>,
}

/// Runs a batch mirror of `lane` until it exits (60 s at most) and prints the `TRIAL batches
/// {name}` line. The target topic's smaller limit is the premise: the topic-config sync, off
/// here, would raise it to the source's.
fn run_until_refused(lane: &Endpoints, name: &str, started: Instant) -> Refusal {
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .flag("--sync.topic.configs", "false")
        .commit_ms(200)
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let refusal = Refusal {
        status,
        log: mirror.log(),
        committed: lane.committed(),
        source: lane.source_records(0),
        target: lane.target_records(lane.topic, 0),
    };
    eprintln!(
        "TRIAL batches {name} kafka 4.4.0: exit {:?}, committed {:?}, target partition 0 holds \
         {} records (the refused one at offset {REFUSED_AT}), {:.0} s",
        refusal.status.code(),
        refusal.committed,
        refusal.target.len(),
        started.elapsed().as_secs_f64()
    );
    refusal
}

/// A record the target refuses for good (larger than the target topic's `max.message.bytes`)
/// in abort mode: exit 1, the committed offset of its partition stops at it, and every record
/// before it, none after it, of that partition is on the target (the batch engine's twin of
/// `kafka_trials::a_record_the_target_refuses_stops_its_partition_in_abort_mode`).
#[test]
fn a_record_the_target_refuses_stops_the_batch_engine_at_it_in_abort_mode() {
    let started = Instant::now();
    let lane = a_lane_with_a_record_the_target_refuses("refused");
    let Refusal {
        status,
        log,
        committed,
        source,
        target,
    } = run_until_refused(&lane, "refused-record", started);
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(log.contains("refused/0 offset 2000"), "log:\n{log}");
    assert_eq!(
        committed[0], REFUSED_AT as i64,
        "the commit stops at the refused record; log:\n{log}"
    );
    assert!(
        target == source[..REFUSED_AT as usize],
        "partition 0: the target holds {} records, not the {REFUSED_AT} before the refused one",
        target.len()
    );
}

/// The same refused record in a batch whose records repeat a header key: that batch is too
/// large for the target topic and must be split (encoded again, every header kept). The engine
/// meets the record that alone is too large in its turn, so abort mode holds exactly: exit 1,
/// the commit at the refused record, every record before it and none after it on the target,
/// each with both its `hop` headers.
#[test]
fn a_record_refused_among_repeated_header_keys_stops_the_batch_engine_in_abort_mode() {
    let started = Instant::now();
    let lane = lane_with_a_refused_record("refused-plain", true);
    let Refusal {
        status,
        log,
        committed,
        source,
        target,
    } = run_until_refused(&lane, "refused-record plain", started);
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(log.contains("refused-plain/0 offset 2000"), "log:\n{log}");
    assert_eq!(
        committed[0], REFUSED_AT as i64,
        "the commit stops at the refused record; log:\n{log}"
    );
    assert!(
        target == source[..REFUSED_AT as usize],
        "partition 0: the target holds {} records, not the {REFUSED_AT} before the refused one",
        target.len()
    );
}

/// A skip-mode (`--abort.on.send.failure false`) batch mirror of `lane` run until it has
/// committed the source's end and stopped (exit 0 asserted): its log and its
/// `mirror_records_dropped_total` (with the whole scrape, for messages).
fn copied_in_skip_mode(lane: &Endpoints) -> (String, Option<f64>, String) {
    copied_in_skip_mode_by(lane, "batches")
}

/// [`copied_in_skip_mode`] with `--copy.mode engine`.
fn copied_in_skip_mode_by(lane: &Endpoints, engine: &str) -> (String, Option<f64>, String) {
    let addr = free_local_addr();
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", engine)
        .flag("--sync.topic.configs", "false")
        .flag("--abort.on.send.failure", "false")
        .metrics_addr(&addr)
        .commit_ms(200)
        .start();
    lane.wait_caught_up(&mut mirror);
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let dropped = metric(&body, "mirror_records_dropped_total", "");
    (mirror.log(), dropped, body)
}

/// Every partition of `lane` holds on the target the source's records but partition 0's at
/// [`REFUSED_AT`], in order.
fn all_but_the_refused_record_copied(lane: &Endpoints) {
    for p in 0..PARTITIONS {
        let mut s = lane.source_records(p);
        if p == 0 {
            s.remove(REFUSED_AT as usize);
        }
        let t = lane.target_records(lane.topic, p);
        assert!(
            s == t,
            "partition {p}: the target holds {} records, not the source's {} but the refused one",
            t.len(),
            s.len()
        );
    }
}

/// The same refused record with `--abort.on.send.failure false`: skipped, logged and counted
/// (`mirror_records_dropped_total`), every other record copied in order, exit 0.
#[test]
fn a_record_the_target_refuses_is_skipped_and_counted_by_the_batch_engine_in_skip_mode() {
    skip_the_record_too_large("refused-skipped", false);
}

/// The same refused record among records that repeat a header key (their batch, which must
/// be split, encoded again with every header) in skip mode: that record alone is dropped and
/// counted, every other record copied in order, exit 0.
#[test]
fn a_record_refused_among_repeated_header_keys_is_skipped_alone_in_skip_mode() {
    skip_the_record_too_large("refused-plain-skipped", true);
}

/// A skip-mode mirror of [`lane_with_a_refused_record`]: a warning names the refused record,
/// it alone is counted as dropped, every other record is copied in order; with
/// `repeated_headers`, every record repeats a header key.
fn skip_the_record_too_large(topic: &'static str, repeated_headers: bool) {
    let started = Instant::now();
    let lane = lane_with_a_refused_record(topic, repeated_headers);
    let (log, dropped, body) = copied_in_skip_mode(&lane);
    eprintln!(
        "TRIAL batches refused-record-skipped{} kafka 4.4.0: dropped {dropped:?}, {:.0} s",
        if repeated_headers {
            " repeated-headers"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    let named = format!("{topic}/0 offset {REFUSED_AT}");
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&named) && l.contains("skipped")),
        "no warning naming {named:?}; log:\n{log}"
    );
    assert_eq!(dropped, Some(1.0), "{body}");
    all_but_the_refused_record_copied(&lane);
}

/// A record the target refuses once it has it (two days old, into a target topic that takes
/// records up to an hour old) among records that repeat a header key: the source batches are
/// larger than the target topic takes (`max.message.bytes` 20,000), so they are split and
/// encoded again, every header kept. The target refuses the batch that holds the old record;
/// skip mode must count exactly the records that are not on the target, and copy every other
/// one in order.
#[test]
fn skip_mode_counts_exactly_the_records_the_target_refused_among_repeated_header_keys() {
    skip_mode_counts_exactly_the_refused("refused-old-plain", "batches");
}

/// The same old record with the record engine (`--copy.mode records`; no header repeated,
/// which it does not mind): librdkafka's producer fails every record of the batch the target
/// refused, and skip mode must count exactly the records that are not on the target.
#[test]
fn the_record_engine_in_skip_mode_counts_exactly_the_records_the_target_refused() {
    skip_mode_counts_exactly_the_refused("refused-old-records", "records");
}

/// Partition 0 of `topic` holds a record two days old at [`REFUSED_AT`] among 4,000 of now,
/// partition 1 records of now only, in source batches of 100 KB or more; the target topic
/// takes records up to an hour old and batches of 20,000 bytes. With `engine` "batches" every
/// record repeats a header key (the batches must be split and encoded again, every header
/// kept). A skip-mode mirror must leave on the target the source's records
/// but some, in order, the old one among those missing, and count exactly the missing ones.
fn skip_mode_counts_exactly_the_refused(topic: &'static str, engine: &str) {
    use rdkafka::message::{Header, OwnedHeaders};
    let started = Instant::now();
    let repeated = engine == "batches";
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    pair.target.create_topic(
        topic,
        PARTITIONS,
        1,
        &[
            ("message.timestamp.before.max.ms", "3600000"),
            ("max.message.bytes", "20000"),
        ],
    );
    // Source batches of about 100 KB or more.
    let p = producer(&lane.src(), &[("linger.ms", "100")]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    for i in 0..REFUSED_AT * 2 + 1 {
        for partition in 0..PARTITIONS {
            let s = sample(i, 1, 100);
            let old = i == REFUSED_AT && partition == 0;
            let hop = |value: &'static str| Header {
                key: "hop",
                value: Some(value),
            };
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition(partition)
                .timestamp(if old { now - 2 * 24 * 3600 * 1000 } else { now });
            if repeated {
                record = record.headers(OwnedHeaders::new().insert(hop("a")).insert(hop("b")));
            }
            record.key = s.key.as_deref();
            record.payload = s.value.as_deref();
            send_waiting(&p, record, None).expect("producing to the source");
        }
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))
        .expect("flushing the source");
    let (log, dropped, body) = copied_in_skip_mode_by(&lane, engine);
    let source = lane.source_records(0);
    let target = lane.target_records(topic, 0);
    // The target's records, in order, are the source's but some: which ones.
    let mut on_target = target.iter().peekable();
    let mut missing = Vec::new();
    for (offset, record) in source.iter().enumerate() {
        if on_target.peek() == Some(&record) {
            on_target.next();
        } else {
            missing.push(offset);
        }
    }
    eprintln!(
        "TRIAL batches refused-by-the-broker-skipped {} kafka 4.4.0: dropped {dropped:?}, {} \
         records not on the target ({:?}...), {:.0} s",
        if repeated {
            "repeated-headers"
        } else {
            "record-engine"
        },
        missing.len(),
        &missing[..missing.len().min(5)],
        started.elapsed().as_secs_f64()
    );
    if repeated {
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains(topic) && l.contains("skipped")),
            "no warning of the skipped refusal; log:\n{log}"
        );
    }
    assert!(
        on_target.next().is_none(),
        "partition 0: the target holds records out of the source's order"
    );
    assert!(
        missing.contains(&(REFUSED_AT as usize)),
        "the old record is on the target"
    );
    assert_eq!(dropped, Some(missing.len() as f64), "{body}");
    // What the metrics say beside: every record handed to the target once, and acknowledged
    // exactly those on the target.
    let acknowledged = metric(
        &body,
        "mirror_records_acknowledged_total",
        &format!("topic=\"{topic}\",partition=\"0\""),
    );
    assert_eq!(
        acknowledged,
        Some((source.len() - missing.len()) as f64),
        "{body}"
    );
    let all = (source.len() + lane.source_records(1).len()) as f64;
    assert_eq!(
        metric(&body, "mirror_records_produced_total", ""),
        Some(all),
        "{body}"
    );
    assert!(
        lane.target_records(topic, 1) == lane.source_records(1),
        "partition 1 is not copied whole"
    );
}

/// A batch the target refuses once it has it (its record's timestamp is older than the target
/// topic's `message.timestamp.before.max.ms`, which the engine does not check beforehand), with
/// `--abort.on.send.failure false`: that batch alone is skipped and counted, and every batch
/// after it lands. The target took none of the refused batch's sequence numbers, so the
/// batches stamped after it must be stamped again from the refused one's first sequence:
/// stamped as they were, the target sees a gap before each of them
/// (OUT_OF_ORDER_SEQUENCE_NUMBER) and the partition's every later batch was refused too.
#[test]
fn the_batches_after_one_the_target_refuses_land_in_skip_mode() {
    skip_a_record_older_than_the_target_takes("refused-old", true);
}

/// The same old record in a batch of others: the target names it (Produce `record_errors`),
/// and skip mode drops it alone, as the record engine does, sending the batch's other records
/// again without it, in order, before the batches after them.
#[test]
fn skip_mode_drops_only_the_record_the_target_names_in_a_refused_batch() {
    skip_a_record_older_than_the_target_takes("refused-old-among", false);
}

/// Partition 0 of `topic` holds a record two days old at offset [`REFUSED_AT`] (`alone`: in a
/// batch of its own) among 4,000 records of now, partition 1 records of now only; the target
/// topic takes records up to an hour old. A skip-mode batch mirror must copy every record but
/// that one, drop and count it alone, and never meet a sequence gap.
fn skip_a_record_older_than_the_target_takes(topic: &'static str, alone: bool) {
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    pair.target.create_topic(
        topic,
        PARTITIONS,
        1,
        &[("message.timestamp.before.max.ms", "3600000")],
    );
    let p = producer(&lane.src(), &[("linger.ms", "5")]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let two_days = 2 * 24 * 3600 * 1000;
    for i in 0..REFUSED_AT * 2 + 1 {
        let old = i == REFUSED_AT;
        if old && alone {
            p.flush(Duration::from_secs(30))
                .expect("flushing the source");
        }
        for partition in 0..PARTITIONS {
            let s = sample(i, 1, 100);
            let timestamp = if old && partition == 0 {
                now - two_days
            } else {
                now
            };
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                .partition(partition)
                .timestamp(timestamp);
            record.key = s.key.as_deref();
            record.payload = s.value.as_deref();
            send_waiting(&p, record, None).expect("producing to the source");
        }
        if old && alone {
            p.flush(Duration::from_secs(30))
                .expect("flushing the source");
        }
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))
        .expect("flushing the source");
    let (log, dropped, body) = copied_in_skip_mode(&lane);
    let target = lane.target_records(topic, 0);
    eprintln!(
        "TRIAL batches refused-by-the-broker-skipped{} kafka 4.4.0: dropped {dropped:?}, target \
         partition 0 holds {} records, {:.0} s",
        if alone { "" } else { " among-others" },
        target.len(),
        started.elapsed().as_secs_f64()
    );
    let named = if alone {
        format!("{topic}/0 offsets {REFUSED_AT} to {REFUSED_AT}")
    } else {
        format!("{topic}/0 offset {REFUSED_AT} (of the batch")
    };
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&named) && l.contains("skipped")),
        "no warning naming {named:?}; log:\n{log}"
    );
    assert!(
        !log.contains("OutOfOrderSequenceNumber"),
        "the target saw a sequence gap after the refused batch; log:\n{log}"
    );
    assert_eq!(dropped, Some(1.0), "{body}");
    // The partitions' counters count records, the refused one consumed and not acknowledged.
    let all = (REFUSED_AT * 2 + 1) as f64;
    for (partition, acknowledged) in [(0, all - 1.0), (1, all)] {
        let labels = format!("topic=\"{topic}\",partition=\"{partition}\"");
        let counted = |name| metric(&body, name, &labels);
        assert_eq!(
            (
                counted("mirror_records_consumed_total"),
                counted("mirror_records_acknowledged_total")
            ),
            (Some(all), Some(acknowledged)),
            "partition {partition}: {body}"
        );
    }
    all_but_the_refused_record_copied(&lane);
}

/// A consumer group's source offsets, synced to the target by a batch-engine mirror
/// (`--sync.group.offsets`), make it resume there with exactly the records it had not read,
/// and `translate` gives the same target offsets: the offset mapping is recorded per batch from
/// the target's answers. The target topic holds 7 records of another writer first (its offsets
/// are not the source's), and the source holds committed and aborted transactions between
/// plain records (markers and aborted batches take source offsets the target does not have).
/// The batch engine's twin of `kafka_failover::a_failed_over_group_reads_exactly_the_records_it_had_not_read`.
#[test]
fn a_group_synced_after_a_batch_engine_copy_resumes_on_the_target_exactly() {
    const TOPIC: &str = "failed-over";
    const APP: &str = "failed-over-app";
    const PARTS: i32 = 3;
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(TOPIC, PARTS);
    pair.target.create_topic(TOPIC, PARTS, 1, &[]);
    let other = mirror_test_harness::failover::producer(&lane.dst(), &[]);
    for p in 0..PARTS {
        for i in 0..7 {
            send_id(&other, TOPIC, p, None, &format!("other-writer/{p}/{i}"));
        }
    }
    other.flush(Duration::from_secs(30)).unwrap();
    write_ids(&lane.src(), TOPIC, PARTS, 0..100);
    // 6 transactions of 10 records per partition; 1 and 4 aborted.
    let committed_txn = write_transactions(&lane.src(), TOPIC, PARTS, 6, 10, |t| t % 3 == 1);
    write_ids(&lane.src(), TOPIC, PARTS, 100..200);
    let total = 200 + committed_txn as usize;
    // Inside the first plain records, inside the transactions, and at the end.
    let read = app_read_and_commit(&lane.src(), APP, TOPIC, &[50, 130, total]);
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .flag("--sync.group.offsets", APP)
        .flag("--sync.group.offsets.interval.ms", "500")
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    mirror.wait_for("the application group synced on the target", |_| {
        group_offsets(&lane.dst(), APP, TOPIC, PARTS)
            .iter()
            .all(|o| *o >= 0)
    });
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let synced = group_offsets(&lane.dst(), APP, TOPIC, PARTS);
    let dir = tempdir();
    let (consumer, producer) = mirror_configs(dir.path(), &lane.src(), &lane.dst(), &[], &[]);
    let check = translate(&consumer, &producer, APP, &[]);
    assert_eq!(check.code, Some(0), "{check:?}");
    let on_source = group_offsets(&lane.src(), APP, TOPIC, PARTS);
    let resumed = resume(&lane.dst(), APP, TOPIC, PARTS);
    let mut wrong = Vec::new();
    for p in 0..PARTS {
        let t = check.get(TOPIC, p);
        assert_eq!(
            (t.status.as_str(), t.target_offset),
            ("exact", Some(synced[p as usize])),
            "{TOPIC}/{p}: translate and the sync disagree: {check:?}"
        );
        let left = read_from(&lane.src(), TOPIC, p, on_source[p as usize]);
        let r = Resumption::of(&read[p as usize], &left, &resumed[p as usize]);
        if !r.exact {
            wrong.push(format!(
                "{TOPIC}/{p}: source offset {} -> target offset {}: {}",
                on_source[p as usize],
                synced[p as usize],
                r.summary()
            ));
        }
    }
    eprintln!(
        "TRIAL batches failover kafka 4.4.0: source offsets {on_source:?} synced as target \
         offsets {synced:?} (target began with 7 other records a partition; {committed_txn} \
         committed transactional records a partition among 200 plain); {} partitions not \
         exact, {:.0} s",
        wrong.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The target topic deleted while the record engine runs (`--create.topics`, the default): it
/// is created again and every source record not acknowledged before the deletion is on it,
/// in order. What the deletion took (the records acknowledged, and committed, before it) is
/// not copied again: the mirror mirrors each affected partition again from its oldest
/// unacknowledged record, as `docs/configuration.md` (`--create.topics`) says. On Kafka what
/// `mirror_mock::a_target_topic_deleted_while_running_is_created_again_and_nothing_is_lost`
/// shows on the mock; on Kafka 4.4.0 the records queued for the deleted topic fail as an
/// unknown *partition* (librdkafka saw its partition count go to 0), not an unknown topic.
#[test]
fn a_target_topic_deleted_while_the_record_engine_runs_is_created_again() {
    target_topic_deleted_while_running(CopyMode::Records, "recreated-records");
}

/// The same with the batch engine: its batches retried on a topic the target's Metadata says
/// does not exist, it makes the topic again and sends them to it in order.
#[test]
fn a_target_topic_deleted_while_the_batch_engine_runs_is_created_again() {
    target_topic_deleted_while_running(CopyMode::Batches, "recreated");
}

/// The target forgets the batch engine's producer id while the mirror idles
/// (`producer.id.expiration.ms` 30 s, checked every second): the target's partition leaders keep
/// no state for it (`describe-producers` lists none), and the engine writes on with its next
/// sequences, as Kafka since 2.5 (KIP-360) accepts from a producer it has no state for. No
/// refusal (UNKNOWN_PRODUCER_ID would stop it), every record once, in order.
///
/// A producer's state expires that long after its newest record's *timestamp*, and the engine
/// keeps the source's: the first records are written only once the mirror holds its partitions,
/// so the state cannot expire before it is looked at (it did once in CI, where the clusters'
/// start and the group's join took longer than the expiry). The expiry is 30 s, not less: the
/// look is one `kafka-transactions.sh` JVM per partition, and with 15 s the second partition's
/// state expired before its look on a machine loaded by two test threads besides (once).
#[test]
fn a_producer_id_the_target_expired_is_written_on_with_batches() {
    let started = Instant::now();
    let topic = "expired-producer";
    let expiry = Duration::from_secs(30);
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[
            ("producer.id.expiration.ms", &expiry.as_millis().to_string()),
            ("producer.id.expiration.check.interval.ms", "1000"),
        ],
        topic,
        PARTITIONS,
        &[],
    );
    // Stamped now: a producer's state expires that long after its newest record's timestamp,
    // and the samples' are from 2023.
    let p = producer(&pair.src(), &[("linger.ms", "20")]);
    let write_now = |range: std::ops::Range<u64>| {
        for i in range {
            let s = sample(i, PARTITIONS, 100);
            let mut record: BaseRecord<'_, [u8], [u8]> =
                BaseRecord::to(topic).partition(s.partition);
            record.key = s.key.as_deref();
            record.payload = s.value.as_deref();
            send_waiting(&p, record, None).expect("producing to the source");
            p.poll(Duration::ZERO);
        }
        p.flush(Duration::from_secs(30))
            .expect("flushing the source producer");
    };
    let mut mirror = pair
        .mirror()
        .copy_mode(CopyMode::Batches)
        .commit_ms(300)
        .start();
    mirror.wait_for_log("assigned", "the mirror to get partitions");
    let written = Instant::now();
    write_now(0..500);
    pair.wait_caught_up(&mut mirror);
    let copied_in = written.elapsed();
    assert!(
        copied_in < expiry,
        "copying 500 records took {copied_in:?}, longer than the target's producer expiry"
    );
    let before: Vec<usize> = (0..PARTITIONS)
        .map(|n| pair.target.producers(topic, n).len())
        .collect();
    assert!(
        before.iter().all(|n| *n == 1),
        "the batch engine's producer is not on each target partition: {before:?}, looked at \
         {:?} after the records were written (the expiry is {expiry:?})",
        written.elapsed()
    );
    let forgotten = Instant::now();
    while (0..PARTITIONS).any(|n| !pair.target.producers(topic, n).is_empty()) {
        assert!(
            forgotten.elapsed() < expiry * 3,
            "the target still keeps the producer's state after {:?}",
            expiry * 3
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = forgotten.elapsed();
    write_now(500..1000);
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    eprintln!(
        "TRIAL batches expired-producer-id kafka 4.4.0: producers per target partition {before:?} \
         after the first 500 records, none {:.1} s later; 500 more written: {:.0} s",
        after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(!log.contains("refused"), "log:\n{log}");
    same_records(&pair);
}

/// Without `--create.topics`, a target topic deleted while the batch engine runs is a send
/// failure once it has been missing for `topic.metadata.propagation.max.ms` (as librdkafka's
/// producer waits): in abort mode the mirror stops, exit 1, naming the topic and what to do,
/// its commit at the first batch not acknowledged.
#[test]
fn a_target_topic_deleted_while_the_batch_engine_runs_without_create_topics_stops_it() {
    let started = Instant::now();
    let topic = "deleted-not-made";
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    pair.target.create_topic(topic, PARTITIONS, 1, &[]);
    let p = producer(&lane.src(), &[("linger.ms", "20")]);
    write(&p, topic, 0..500);
    let mut mirror = lane
        .mirror()
        .copy_mode(CopyMode::Batches)
        .flag("--create.topics", "false")
        .producer(&[("topic.metadata.propagation.max.ms", "3000")])
        .commit_ms(300)
        .start();
    let acknowledged = lane.wait_caught_up(&mut mirror);
    pair.target.delete_topic(topic);
    write(&p, topic, 500..1000);
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    let committed = lane.committed();
    eprintln!(
        "TRIAL batches target-topic-deleted-not-made kafka 4.4.0: exit {:?}, committed \
         {committed:?} (caught up at {acknowledged:?} before the deletion), {:.0} s",
        status.code(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        log.contains(&format!("target topic {topic} does not exist"))
            && log.contains("--create.topics"),
        "the failure names the topic and the flag; log:\n{log}"
    );
    assert_eq!(committed, acknowledged, "log:\n{log}");
}

/// A target topic with fewer partitions than the source, and nothing to grow it
/// (`--create.topics false`): the batch for the partition it lacks is tried again, the
/// topic's metadata asked for again, for `topic.metadata.propagation.max.ms`, then it is a
/// send failure naming the topic and the partition, as with the record engine: in abort mode
/// exit 1, the partition the target has copied and committed, nothing committed for the other.
#[test]
fn a_target_partition_that_never_appears_stops_the_batch_engine_naming_it() {
    let started = Instant::now();
    let topic = "partition-missing";
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    pair.target.create_topic(topic, 1, 1, &[]);
    let p = producer(&lane.src(), &[("linger.ms", "20")]);
    write(&p, topic, 0..500);
    let ends = end_offsets(&lane.src(), topic, PARTITIONS);
    let mut mirror = lane
        .mirror()
        .copy_mode(CopyMode::Batches)
        .flag("--create.topics", "false")
        .producer(&[("topic.metadata.propagation.max.ms", "3000")])
        .commit_ms(300)
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    let committed = lane.committed();
    eprintln!(
        "TRIAL batches target-partition-missing kafka 4.4.0: exit {:?}, committed {committed:?} \
         of {ends:?}, {:.0} s",
        status.code(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        log.contains(&format!("the target topic {topic} has no partition 1")),
        "the failure names the topic and the partition; log:\n{log}"
    );
    assert_eq!(committed[0], ends[0], "log:\n{log}");
    assert!(committed[1] <= 0, "committed {committed:?}; log:\n{log}");
}

fn target_topic_deleted_while_running(mode: CopyMode, topic: &'static str) {
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(topic, PARTITIONS);
    let p = producer(&lane.src(), &[("linger.ms", "20")]);
    write(&p, topic, 0..500);
    let mut mirror = lane
        .mirror()
        .copy_mode(mode)
        .commit_ms(300)
        .topic_refresh_ms(1000)
        .start();
    lane.wait_caught_up(&mut mirror);
    // Acknowledged and committed: what the deletion takes with it.
    let acknowledged = lane.committed();
    pair.target.delete_topic(topic);
    write(&p, topic, 500..1000);
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    // Which partitions were mirrored again, and why (an unknown partition for records
    // queued at the deletion; BrokerDestroy for those on the wire, dropped by librdkafka
    // with their removed partition).
    let log = mirror.log();
    let again: Vec<String> = log
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("a record sent to it failed with ")?;
            let (code, rest) = rest.split_once(')')?;
            let partition = rest.split_once("mirroring ")?.1.split_once(' ')?.0;
            Some(format!("{partition}: {code}"))
        })
        .collect();
    let mut c = Comparison {
        in_order: true,
        ..Comparison::default()
    };
    for (partition, from) in (0..PARTITIONS).zip(&acknowledged) {
        let wait = Duration::from_secs(60);
        let source = read_partition(&lane.src(), topic, partition, wait).expect("reading source");
        let target = read_partition(&lane.dst(), topic, partition, wait).expect("reading target");
        c.add(&compare(&source[*from as usize..], &target));
    }
    eprintln!(
        "TRIAL {mode:?} target-topic-deleted kafka 4.4.0: from the commit points {acknowledged:?} \
         on, {}; made again after {again:?}, {:.0} s",
        c.summary(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((c.source, c.lost, c.changed), (500, 0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
}

/// Partitions of the trials on the replicated pair: each of the three brokers leads one.
const SPREAD: i32 = 3;

/// The committed offsets of `lane`'s group, summed.
fn committed_sum(lane: &Endpoints) -> i64 {
    lane.committed().iter().map(|c| c.max(&0)).sum()
}

/// Waits until the group has committed `more` offsets past what it had, the mirror running
/// (a lost assignment or a stuck round would stop the commits).
fn commits_advance(lane: &Endpoints, mirror: &mut Mirror, more: i64, what: &str) {
    let from = committed_sum(lane);
    mirror.wait_for(what, |_| committed_sum(lane) >= from + more);
}

/// How the mirror of a trial on the replicated pair reaches the target.
#[derive(Clone, Copy)]
enum Reach {
    /// Directly, as the harness's own clients do.
    Direct,
    /// Through the target's fault proxies (`ReplicatedPair::target_links`).
    TargetProxies,
}

/// The trial `name` on the replicated pair, held meanwhile: a batch-engine mirror of the lane
/// `topic` ([`SPREAD`] partitions; the mirror reaching the target as `reach` says) copying
/// while a writer adds records and `disturb` moves leaders, takes brokers down or switches the
/// target's proxies; then it catches up and stops. Every source record is on the target once,
/// unchanged, in order per partition, and the mirror exits 0. Prints the `TRIAL batches
/// {name}` line (the comparison's summary with what `disturb` reported, and the trial's own
/// time); returns the mirror's log.
fn copies_each_record_once_in_order_through(
    name: &str,
    topic: &'static str,
    reach: Reach,
    producer: &[(&str, &str)],
    disturb: impl FnOnce(&mut ReplicatedPair, &mut Mirror, &Endpoints) -> String,
) -> String {
    copies_in_order_through(name, topic, reach, producer, disturb, false)
}

/// As [`copies_each_record_once_in_order_through`]; with `group_may_drop`, a source broker
/// killed may be the group's coordinator, and when the group then drops the mirror (its
/// assignment lost, nothing committed), the next assignment copies again from the last
/// commit, as any consumer group would: those duplicates are the group's and are allowed.
fn copies_in_order_through(
    name: &str,
    topic: &'static str,
    reach: Reach,
    producer: &[(&str, &str)],
    disturb: impl FnOnce(&mut ReplicatedPair, &mut Mirror, &Endpoints) -> String,
    group_may_drop: bool,
) -> String {
    let mut pair = ReplicatedPair::lock();
    // The trial's own time: not the pair's start, nor the wait for another trial to end.
    let started = Instant::now();
    let lane = pair.lane(topic, SPREAD);
    let proxied = match reach {
        Reach::Direct => None,
        Reach::TargetProxies => Some(pair.proxied(&lane)),
    };
    let mirror_lane = proxied.as_ref().unwrap_or(&lane);
    let lane = &lane;
    lane.write(0..1500);
    let trickle = lane.trickle(1500, 25);
    let mut mirror = mirror_lane
        .mirror()
        .flag("--copy.mode", "batches")
        .producer(producer)
        .commit_ms(300)
        .log("mirror_maker=debug")
        .start();
    commits_advance(lane, &mut mirror, 1, "the first commits");
    let what = disturb(&mut pair, &mut mirror, lane);
    commits_advance(lane, &mut mirror, 200, "commits after the disturbance");
    let written = trickle.stop();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = lane.compare();
    let retried = mirror
        .log()
        .matches("sending the batch of source offsets")
        .count();
    // The writer's producer is not idempotent: a retry of its own while a source leader
    // moves can write a record twice, so the source may hold more than it wrote.
    assert!(c.source >= written, "{c:?}: {written} written");
    let lost_by_the_group = group_may_drop && mirror.log().contains("(assignment lost)");
    let duplicated = if lost_by_the_group { 0 } else { c.duplicated };
    assert_eq!(
        (
            c.target - (c.duplicated - duplicated),
            c.lost,
            c.changed,
            duplicated
        ),
        (c.source, 0, 0, 0),
        "{c:?}; log:\n{}",
        mirror.log()
    );
    assert!(c.in_order, "{c:?}");
    eprintln!(
        "TRIAL batches {name} kafka 4.4.0: {what}; {retried} batch sends retried; {written} \
         written, {}{}, {:.0} s",
        c.summary(),
        if lost_by_the_group {
            " (the group dropped the mirror: its duplicates allowed)"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    mirror.log()
}

/// The leader of `topic`/`partition` on `cluster` stopped (a controlled shutdown moves its
/// partitions' leadership), the mirror copying without it, the broker started again and the
/// preferred leaders elected (leadership moves back): two moves under load.
fn move_leadership(
    cluster: &mut KafkaCluster,
    topic: &str,
    mirror: &mut Mirror,
    lane: &Endpoints,
) -> String {
    let leader = cluster.leader(topic, 0);
    assert!(leader > 0, "{topic}/0 has no leader");
    cluster.stop(leader);
    let moved = cluster.leader(topic, 0);
    commits_advance(lane, mirror, 200, "commits with the old leader stopped");
    cluster.restart(leader);
    wait_until(
        Duration::from_secs(60),
        "the restarted broker back in every in-sync replica set",
        || cluster.under_replicated(topic, 3).is_empty(),
    );
    cluster.elect_preferred_leaders();
    wait_until(
        Duration::from_secs(30),
        "the preferred leader elected",
        || cluster.leader(topic, 0) == leader,
    );
    format!("{topic}/0 led by broker {leader}, then {moved} (controlled shutdown), then {leader} again (preferred election)")
}

/// The leader of `lane`'s partition 0 on `cluster` (the `side`) SIGKILLed, the mirror copying
/// without it (its partitions led by others once it is fenced), then started again.
fn kill_and_restart_leader(
    cluster: &mut KafkaCluster,
    side: &str,
    mirror: &mut Mirror,
    lane: &Endpoints,
) -> String {
    let leader = cluster.leader(lane.topic, 0);
    cluster.kill(leader);
    commits_advance(
        lane,
        mirror,
        200,
        &format!("commits with a {side} broker dead"),
    );
    let moved = cluster.leader(lane.topic, 0);
    cluster.restart(leader);
    format!(
        "{}/0's {side} leader, broker {leader}, SIGKILLed (then led by {moved}) and restarted",
        lane.topic
    )
}

/// Leadership of the source's partitions moves twice under load (the leader's controlled
/// shutdown, then a preferred leader election after its restart): the fetcher follows the
/// leader (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, a closed connection), and every record
/// is copied once, in order.
#[test]
fn leadership_moving_on_the_source_loses_nothing_and_keeps_order() {
    copies_each_record_once_in_order_through(
        "source-leadership",
        "source-leaders",
        Reach::Direct,
        &[],
        |p, m, lane| move_leadership(&mut p.source, lane.topic, m, lane),
    );
}

/// Leadership of the target's partitions moves twice under load: our idempotent producer
/// sends the batch again to the new leader with the same sequence, and every record is on the
/// target once, in order.
#[test]
fn leadership_moving_on_the_target_loses_nothing_and_keeps_order() {
    copies_each_record_once_in_order_through(
        "target-leadership",
        "target-leaders",
        Reach::Direct,
        &[],
        |p, m, lane| move_leadership(&mut p.target, lane.topic, m, lane),
    );
}

/// The target leader of a partition SIGKILLed while the mirror sends to it (Produce requests
/// in flight), the copy going on with the two brokers left once it is fenced, then the broker
/// started again: every record on the target once, in order.
#[test]
fn a_target_leader_killed_mid_request_loses_nothing_and_keeps_order() {
    copies_each_record_once_in_order_through(
        "target-leader-killed",
        "target-killed",
        Reach::Direct,
        &[],
        |p, m, lane| kill_and_restart_leader(&mut p.target, "target", m, lane),
    );
}

/// The source leader of a partition SIGKILLed while the engine fetches from it, the copy going
/// on from the new leader once the dead one is fenced, then the broker started again (it
/// truncates what it had not replicated): the engine reads only up to the high watermark, so
/// nothing the new leader lacks reaches the target. Every record on the target once, in order,
/// unless the dead broker was the group's coordinator (one of the three) and the group dropped
/// the mirror: then the records after the last commit are copied again.
#[test]
fn a_source_leader_killed_mid_fetch_loses_nothing_and_keeps_order() {
    let log = copies_in_order_through(
        "source-leader-killed",
        "source-killed",
        Reach::Direct,
        &[],
        |p, m, lane| kill_and_restart_leader(&mut p.source, "source", m, lane),
        true,
    );
    // The kill met the fetcher: a fetch failed (the connection, or a leader that moved).
    let failures: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("source fetch: ").map(|(_, why)| why))
        .collect();
    assert!(!failures.is_empty(), "no fetch failed; log:\n{log}");
    let mut reasons = failures.clone();
    reasons.sort_unstable();
    reasons.dedup();
    eprintln!(
        "TRIAL batches source-leader-killed: {} fetches failed and were sent again ({})",
        failures.len(),
        reasons.join("; ")
    );
}

/// Produce answers held back beyond the engine's request timeout (2 s; the target's
/// answers 3 s late for about 6 s, the requests on time, so each was applied): the engine
/// gives up on the answer, sends the same batch with the same sequence again, and the target
/// keeps one copy. Every record on the target once, in order.
#[test]
fn a_produce_answered_after_its_timeout_is_sent_again_without_a_duplicate() {
    let log = copies_each_record_once_in_order_through(
        "late-answers",
        "answered-late",
        Reach::TargetProxies,
        &[("request.timeout.ms", "2000")],
        |p, m, _| {
            for link in &p.target_links {
                link.delay_answers(Duration::from_secs(3));
            }
            let retried = |m: &Mirror| {
                m.log()
                    .matches("sending the batch of source offsets")
                    .count()
            };
            let before = retried(m);
            m.wait_for("a Produce answer to time out", |m| retried(m) > before);
            // Not a condition: the outage's length.
            std::thread::sleep(Duration::from_secs(6));
            for link in &p.target_links {
                link.heal();
            }
            "target answers 3 s late for 6 s, request timeout 2 s".to_owned()
        },
    );
    // The waits for the target do not keep the stream from its consumer's polls: it keeps
    // its assignment (max.poll.interval.ms 10 s) and never copies from an older commit.
    assert_eq!(
        log.matches("partitions (batch engine)").count(),
        1,
        "the stream was assigned its partitions more than once; log:\n{log}"
    );
}

/// One partition whose batches come from a plain producer (no producer id), an idempotent
/// one and a transactional one (committed), in turns, and change codec from batch to batch
/// (none, lz4, zstd, gzip): each batch is forwarded as it is (same records, same codec; the
/// transaction markers dropped) and every record is the source's, key, value, headers and
/// timestamp.
#[test]
fn batches_of_mixed_producers_and_codecs_in_one_partition_are_copied_as_they_are() {
    const TOPIC: &str = "mixed";
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane(TOPIC, 1);
    let codecs = ["none", "lz4", "zstd", "gzip"];
    let kinds = ["plain", "idempotent", "transactional"];
    for turn in 0..12u64 {
        let (kind, codec) = (kinds[turn as usize % 3], codecs[turn as usize % 4]);
        let mut settings = vec![("compression.type", codec), ("linger.ms", "20")];
        let id = format!("mixed-{turn}");
        match kind {
            "plain" => settings.push(("enable.idempotence", "false")),
            "idempotent" => settings.push(("enable.idempotence", "true")),
            _ => settings.push(("transactional.id", &id)),
        }
        let p = producer(&lane.src(), &settings);
        if kind == "transactional" {
            p.init_transactions(Duration::from_secs(30)).unwrap();
            p.begin_transaction().unwrap();
        }
        for i in turn * 50..(turn + 1) * 50 {
            let s = sample(i, 1, 100);
            send_waiting(&p, sample_as_record(&s, TOPIC, 0), None)
                .expect("producing to the source");
            p.poll(Duration::ZERO);
        }
        p.flush(Duration::from_secs(30)).expect("flushing");
        if kind == "transactional" {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    let source = pair.source.stored_batches(TOPIC, 0);
    let data: Vec<&StoredBatch> = source.iter().filter(|b| !b.control).collect();
    let seen = |f: &dyn Fn(&StoredBatch) -> bool| data.iter().any(|b| f(b));
    for codec in codecs {
        assert!(
            seen(&|b| b.codec == codec),
            "no {codec} batch on the source"
        );
    }
    assert!(seen(&|b| b.producer_id < 0), "no plain batch on the source");
    assert!(
        seen(&|b| b.producer_id >= 0 && !b.transactional),
        "no idempotent batch on the source"
    );
    assert!(seen(&|b| b.transactional), "no transactional batch");
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .start();
    lane.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let s: Vec<Record> = lane.source_records(0);
    let t: Vec<Record> = lane.target_records(TOPIC, 0);
    assert_eq!(s.len(), 600, "source records");
    assert!(s == t, "the records differ ({} on the target)", t.len());
    let shape = |b: &&StoredBatch| (b.last_offset - b.base_offset, b.codec);
    let target = pair.target.stored_batches(TOPIC, 0);
    assert_eq!(
        data.iter().map(shape).collect::<Vec<_>>(),
        target
            .iter()
            .collect::<Vec<_>>()
            .iter()
            .map(shape)
            .collect::<Vec<_>>(),
        "the target's batches are not the source's"
    );
    eprintln!(
        "TRIAL batches mixed kafka 4.4.0: 600 records in {} batches (plain, idempotent, \
         transactional; none, lz4, zstd, gzip) forwarded batch for batch, {:.0} s",
        data.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Every connection to the target reset (an RST, no broker fault) four times a second apart
/// while the mirror sends: answers lost with their connections, each batch sent again on a
/// new one with the same sequence, and every record on the target once, in order.
#[test]
fn lost_connections_to_the_target_are_sent_again_without_a_duplicate() {
    copies_each_record_once_in_order_through(
        "target-resets",
        "reset",
        Reach::TargetProxies,
        &[],
        |p, _, _| {
            let before: u64 = p.target_links.iter().map(FaultProxy::resets).sum();
            for _ in 0..4 {
                for link in &p.target_links {
                    link.reset_all();
                }
                // Not a condition: the resets come a second apart.
                std::thread::sleep(Duration::from_secs(1));
            }
            let resets = p.target_links.iter().map(FaultProxy::resets).sum::<u64>() - before;
            assert!(resets > 0, "no connection to reset");
            format!("every target connection reset 4 times ({resets} resets counted)")
        },
    );
}

/// A source topic deleted and created again while the batch engine runs, written past the old
/// position before it fetches again, is copied from its beginning (issue 23): the same
/// topic-id check as the record engine's, and the group ends at the new topic's end offsets.
#[test]
fn a_recreated_source_topic_is_copied_from_its_beginning() {
    let started = Instant::now();
    let pair = SharedPair::get(KAFKA_4);
    let lane = pair.lane("source-recreated", PARTITIONS);
    // Without headers: sample headers repeat names, which a batch encoded again would lose.
    let p = producer(&lane.src(), &[("linger.ms", "5")]);
    write(&p, lane.topic, 0..200);
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .commit_ms(300)
        .topic_refresh_ms(1000)
        .start();
    lane.wait_caught_up(&mut mirror);
    let old: Vec<Vec<Record>> = (0..PARTITIONS).map(|p| lane.source_records(p)).collect();
    // Held still while the topic is made again and written past the old position: its next
    // fetch is at the old position inside the new log (no OFFSET_OUT_OF_RANGE to tell it).
    mirror.signal("STOP");
    pair.source.recreate_topic(lane.topic, PARTITIONS);
    write(&p, lane.topic, 200..800);
    mirror.signal("CONT");
    let new: Vec<Vec<Record>> = (0..PARTITIONS).map(|p| lane.source_records(p)).collect();
    let new_end = lane.end_offsets();
    let twice = lane.wait_copied_after(&mirror, &old, &new);
    wait_until(
        Duration::from_secs(60),
        "committed offsets at the new topic's end",
        || lane.committed() == new_end,
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("was deleted and created again"))
            .count(),
        1,
        "log:\n{log}"
    );
    eprintln!(
        "TRIAL batch-engine recreated-source-topic kafka 4.4.0: new end offsets {new_end:?}, \
         copied from offset 0 ({twice} copied twice), committed there; {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// `--throttle.bytes.per.second` with the batch engine: every record copied, the throttle
/// served on `/metrics` and holding the stream for more than 0 s, and the stream kept in its
/// group (one rebalance) through a pause longer than `max.poll.interval.ms`: the backlog,
/// fetched at once, charges over 6 s of debt, and the records written after it can only be
/// fetched once it is paid; the consumer is polled all along. Rates are the benchmark's
/// (`bench/throttle`).
#[test]
fn a_throttled_batch_mirror_copies_everything_and_stays_in_its_group() {
    const RATE: u64 = 40_000;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("throttled", PARTITIONS);
    let source = producer(&lane.src(), &[("linger.ms", "50")]);
    write_values(&source, "throttled", 0..600, 500);
    let addr = free_local_addr();
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .flag("--throttle.bytes.per.second", &RATE.to_string())
        .consumer(&[
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "1000"),
            ("max.poll.interval.ms", "6000"),
        ])
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    mirror.wait_for_log("copying record batches as they are", "the batch engine");
    lane.wait_caught_up(&mut mirror);
    let consumed = |m: &str| -> f64 {
        (0..PARTITIONS)
            .filter_map(|p| {
                metric(
                    m,
                    "mirror_bytes_consumed_total",
                    &format!("topic=\"throttled\",partition=\"{p}\""),
                )
            })
            .sum()
    };
    let backlog = consumed(&scrape(&addr));
    // Over 6 s of debt beyond the one-second burst: longer than max.poll.interval.ms.
    assert!(
        backlog > 7.0 * RATE as f64,
        "too little to hold the stream past max.poll.interval.ms: {backlog} bytes"
    );
    write_values(&source, "throttled", 600..650, 500);
    lane.wait_caught_up(&mut mirror);
    let m = scrape(&addr);
    assert_eq!(
        metric(&m, "mirror_throttle_bytes_per_second", ""),
        Some(RATE as f64),
        "{m}"
    );
    let throttled = metric(&m, "mirror_throttled_seconds_total", "").unwrap_or(0.0);
    assert!(throttled > 0.0, "{m}");
    assert_eq!(metric(&m, "mirror_rebalances_total", ""), Some(1.0), "{m}");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    same_records(&lane);
    eprintln!(
        "TRIAL batches throttle kafka 4.4.0: 650 records, {:.0} bytes at {RATE} bytes/s, \
         throttled {throttled:.1} s, 1 rebalance, {:.0} s",
        consumed(&m),
        started.elapsed().as_secs_f64()
    );
}

/// With the batch engine and `--heartbeats.interval.ms`, the source idle but for the
/// heartbeats: the heartbeats are mirrored from the start (the whitelist names only the lane's
/// topic; the heartbeats topic, made at this start, is in the first subscription) and the
/// replication delay, fed by the batch loop from its fetches' high watermarks, stays within
/// 2 s.
#[test]
fn an_idle_batch_mirror_with_heartbeats_stays_within_two_seconds_of_delay() {
    const HEARTBEATS: &str = "batch-heartbeats";
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane("beating", PARTITIONS);
    write(
        &producer(&lane.src(), &[("linger.ms", "20")]),
        "beating",
        0..200,
    );
    let addr = free_local_addr();
    let mut mirror = lane
        .mirror()
        .flag("--copy.mode", "batches")
        .flag("--heartbeats.interval.ms", "500")
        .flag("--heartbeats.topic", HEARTBEATS)
        // Not looked for again during the trial: the heartbeats topic made at this start must
        // be in the first subscription.
        .topic_refresh_ms(600_000)
        .consumer(&[("statistics.interval.ms", "500")])
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    lane.wait_caught_up(&mut mirror);
    mirror.wait_for("heartbeats on the target and their delay served", |_| {
        end_offset_or_zero(&lane.dst(), HEARTBEATS) >= 2
            && metric(
                &scrape(&addr),
                "mirror_replication_delay_seconds",
                &format!("topic=\"{HEARTBEATS}\""),
            )
            .is_some()
    });
    let copied_before = end_offset_or_zero(&lane.dst(), HEARTBEATS);
    let idle_since = Instant::now();
    let mut worst: f64 = 0.0;
    while idle_since.elapsed() < Duration::from_secs(6) {
        let delay = max_delay(&addr);
        assert!(delay <= 2.0, "a delay of {delay} s: {}", scrape(&addr));
        worst = worst.max(delay);
        std::thread::sleep(Duration::from_millis(250)); // Not a condition: sampling a gauge.
    }
    let copied = end_offset_or_zero(&lane.dst(), HEARTBEATS) - copied_before;
    // 12 intervals in 6 s; a few slow ones allowed.
    assert!(copied >= 6, "{copied} heartbeats copied in 6 s");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    same_records(&lane);
    eprintln!(
        "TRIAL batches heartbeats kafka 4.4.0: worst delay {worst:.2} s over 6 s idle, {copied} \
         heartbeats copied, {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// A broker closes the connection, without answering, on a request larger than its
/// `socket.request.max.bytes`. A round of 16 partitions' 1 MB batches to a target broker that
/// takes 1.5 MiB goes out as four requests of about 4 MB: sent again as it was, it would be
/// closed on for ever (before: 0 copied in 90 s, nothing at warn). The engine says at warn
/// that the broker closed the connection on a request, carries less in each request to that
/// broker, and copies every record as it was.
#[test]
fn a_round_larger_than_the_target_takes_in_one_request_is_sent_in_smaller_requests() {
    let started = Instant::now();
    let topic = "oversized-rounds";
    let partitions = 16;
    let pair = KafkaPair::with(
        KAFKA_4,
        1,
        &[("socket.request.max.bytes", "1572864")],
        topic,
        partitions,
        &[],
    );
    // 1 MB batches on the source, at least half full however slowly the records are written
    // (the lingering ends at the flush below): librdkafka's requests stay within its
    // message.max.bytes (1,000,000), below the brokers' limit.
    let p = producer(
        &pair.src(),
        &[("batch.size", "1000000"), ("linger.ms", "2000")],
    );
    let records = 16 * 2000;
    for i in 0..records {
        let s = sample(i, partitions, 1000);
        send_waiting(&p, sample_as_record(&s, topic, s.partition), None)
            .expect("producing to the source");
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30))
        .expect("flushing the source producer");
    let mut mirror = pair
        .mirror()
        .copy_mode(CopyMode::Batches)
        .commit_ms(300)
        .start();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let said = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("requests to it carry at most"));
    let closings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("closed the connection"))
        .count();
    eprintln!(
        "TRIAL batches oversized-round kafka 4.4.0: {records} records of 1 KB in 1 MB batches \
         over {partitions} partitions, the target taking requests of 1.5 MiB: copied, {closings} \
         closings said, the first: {said:?}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(said.is_some(), "nothing said at warn; log:\n{log}");
    for n in 0..partitions {
        let s: Vec<Record> = pair.source_records(n);
        let t: Vec<Record> = pair.target_records(topic, n);
        assert_eq!(s.len(), t.len(), "partition {n}: record counts");
        assert!(s == t, "partition {n}: the records differ");
    }
}

/// A broker returns a batch larger than `max.partition.fetch.bytes` only to the first
/// partition of a Fetch that has records; to the others it returns none. Each of 8 partitions
/// holds 20 small records, one of 256 KB (its own batch) and then 2 MB of small records; the
/// mirror fetches 64 KB a partition, into a target topic that stamps each record with its
/// append time. Listed in a fixed order (before), the partitions behind the first made no
/// progress past their large record while a partition ahead had records: their records after
/// it landed after another partition had been copied to its end. Now a partition that
/// brought nothing goes ahead in the next Fetch: every large record lands before any
/// partition's last record; each partition's is said at warn once; every record is copied.
#[test]
fn a_batch_larger_than_a_partitions_fetch_waits_behind_no_busy_partition() {
    let started = Instant::now();
    let topic = "large-batch-turns";
    let partitions = 8;
    let pair = KafkaPair::with(KAFKA_4, 1, &[], topic, partitions, &[]);
    pair.target.create_topic(
        topic,
        partitions,
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let p = producer(&pair.src(), &[("batch.size", "16384"), ("linger.ms", "5")]);
    let send = |partition: i32, index: u64, value_bytes: usize| {
        let s = sample(index, partitions, value_bytes);
        send_waiting(&p, sample_as_record(&s, topic, partition), None)
            .expect("producing to the source");
        p.poll(Duration::ZERO);
    };
    const LARGE_AT: usize = 20;
    for partition in 0..partitions {
        for i in 0..LARGE_AT as u64 {
            send(partition, i, 1000);
        }
        p.flush(Duration::from_secs(30)).expect("flushing");
        send(partition, LARGE_AT as u64, 256 * 1024);
        p.flush(Duration::from_secs(30)).expect("flushing");
        for i in 0..2000 {
            send(partition, 100 + i, 1000);
        }
    }
    p.flush(Duration::from_secs(30))
        .expect("flushing the source producer");
    let mut mirror = pair
        .mirror()
        .copy_mode(CopyMode::Batches)
        .consumer(&[("max.partition.fetch.bytes", "65536")])
        .commit_ms(300)
        .start();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let said = log
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("more than the consumer's max.partition.fetch.bytes")
        })
        .count();
    // Append times on the target: of the record after each large one, of each last record.
    let mut after_large = Vec::new();
    let mut last = Vec::new();
    for n in 0..partitions {
        let s: Vec<Record> = pair.source_records(n);
        let t: Vec<Record> = pair.target_records(topic, n);
        assert_eq!(s.len(), t.len(), "partition {n}: record counts");
        let content = |r: &Record| (r.key.clone(), r.value.clone(), r.headers.clone());
        assert!(
            s.iter().map(content).eq(t.iter().map(content)),
            "partition {n}: the records differ"
        );
        after_large.push(t[LARGE_AT + 1].timestamp.expect("an append time"));
        last.push(t.last().and_then(|r| r.timestamp).expect("an append time"));
    }
    let first = *after_large.iter().min().expect("8 partitions");
    let latest_after_large = *after_large.iter().max().expect("8 partitions");
    let first_end = *last.iter().min().expect("8 partitions");
    eprintln!(
        "TRIAL batches large-batch-turns kafka 4.4.0: 8 partitions of 20 small records, one of \
         256 KB and 2,000 more, 64 KB fetched a partition: the last large record passed at \
         +{} ms, the first partition ended at +{} ms (append times); {said} warnings; {:.0} s",
        latest_after_large - first,
        first_end - first,
        started.elapsed().as_secs_f64()
    );
    assert!(
        latest_after_large <= first_end,
        "a partition's records after its large one landed after another partition was copied \
         to its end: after the large records {after_large:?}, last records {last:?}"
    );
    assert_eq!(
        said, partitions as usize,
        "one warning a partition; log:\n{log}"
    );
}
