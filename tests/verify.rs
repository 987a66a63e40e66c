//! `mirror-maker verify` against deliberately broken mirrors: each kind of damage is found and
//! counted, and an intact or live mirror passes.

use std::process::Output;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 2;

/// Writes the source's sample records into the target in the order given, as a mirror would
/// (same partition, key, value, headers, timestamp).
fn copy_samples(clusters: &MockPair, order: impl IntoIterator<Item = u64>) {
    write_samples(&clusters.dst(), TOPIC, order, PARTITIONS, 100).unwrap();
}

fn clusters_with_source() -> MockPair {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..200);
    clusters
}

/// Runs `mirror-maker verify` on the clusters' topic with `extra` arguments.
fn run_verify(clusters: &MockPair, extra: &[&str]) -> Output {
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    binary()
        .arg("verify")
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", TOPIC, "--timeout.ms", "10000"])
        .args(extra)
        .output()
        .unwrap()
}

fn verify(clusters: &MockPair, extra: &[&str]) -> (Output, serde_json::Value) {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let out = run_verify(clusters, &args);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

fn totals(json: &serde_json::Value) -> [u64; 5] {
    let t = &json["totals"];
    [
        "missing",
        "changed",
        "duplicated",
        "out_of_order",
        "misplaced",
    ]
    .map(|k| t[k].as_u64().unwrap())
}

#[test]
fn an_intact_copy_passes() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, 0..200);
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(0), "{json}");
    assert_eq!(totals(&json), [0; 5]);
    assert_eq!(json["totals"]["source_records"], 200);
    // The end of a partition is not an error: a clean verification prints none.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

#[test]
fn a_copy_whose_header_names_are_not_utf8_passes() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    let headers = vec![(b"caf\xe9".to_vec(), Some(b"latin-1 name".to_vec()))];
    write_with_raw_headers(&clusters.src(), TOPIC, 0, 10, &headers);
    clusters.mirror_until_committed(&[], 10);
    let out = run_verify(&clusters, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_removed_record_is_missing() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, (0..200).filter(|&i| i != 17));
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(totals(&json), [1, 0, 0, 0, 0]);
    let p1 = &json["topics"][0]["partitions"][1];
    assert_eq!(p1["missing"], 1, "record 17 is in partition 1: {json}");
}

#[test]
fn an_altered_record_is_changed_and_its_original_missing() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, 0..50);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.dst())
        .create()
        .unwrap();
    let s = mirror_maker::tools::demo::sample(50, PARTITIONS, 100);
    producer
        .send(
            BaseRecord::<[u8], [u8]>::to(TOPIC)
                .partition(s.partition)
                .key(s.key.as_deref().unwrap())
                .payload(b"tampered".as_slice())
                .timestamp(s.timestamp),
        )
        .unwrap();
    producer.flush(std::time::Duration::from_secs(10)).unwrap();
    copy_samples(&clusters, 51..200);
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(totals(&json), [1, 1, 0, 0, 0]);
}

#[test]
fn a_duplicated_record_is_counted_but_does_not_fail() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, (0..200).chain([30]));
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(0), "{json}");
    assert_eq!(totals(&json), [0, 0, 1, 0, 0]);
}

#[test]
fn reordered_records_are_out_of_order() {
    let clusters = clusters_with_source();
    // Records 60 and 62 are both in partition 0: swap them.
    copy_samples(&clusters, (0..60).chain([62, 61, 60]).chain(63..200));
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(totals(&json), [0, 0, 0, 1, 0]);
}

#[test]
fn a_record_in_another_partition_is_misplaced_under_preserve_only() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, (0..200).filter(|&i| i != 40));
    // Record 40 belongs in partition 0; the broken mirror put it in partition 1.
    let s = mirror_maker::tools::demo::sample(40, PARTITIONS, 100);
    write_sample_to_partition(&clusters.dst(), 40, 1);
    assert_eq!(s.partition, 0);
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(totals(&json), [0, 0, 0, 0, 1]);
    let (out, json) = verify(&clusters, &["--partitioning", "hash"]);
    assert_eq!(out.status.code(), Some(0), "{json}");
}

fn write_sample_to_partition(bootstrap: &str, i: u64, partition: i32) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let s = sample(i, PARTITIONS, 100);
    producer
        .send(sample_as_record(&s, TOPIC, partition))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(std::time::Duration::from_secs(10)).unwrap();
}

#[test]
fn a_live_mirror_checks_out_up_to_its_committed_offsets() {
    let clusters = clusters_with_source();
    clusters.mirror_until_committed(&[], 200);
    // More records arrive that no mirror has copied yet: up to the committed offsets, all is
    // there; up to the end, they are missing.
    clusters.write(200..220);
    let (out, json) = verify(&clusters, &["--until", "committed"]);
    assert_eq!(out.status.code(), Some(0), "{json}");
    assert_eq!(json["totals"]["source_records"], 200);
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(totals(&json), [20, 0, 0, 0, 0]);
    // From an offset: only the later records are checked.
    let (_, json) = verify(&clusters, &["--from.offset", "90", "--until", "committed"]);
    assert_eq!(
        json["totals"]["source_records"], 20,
        "offsets 90..100 of both partitions"
    );
}

#[test]
fn the_human_summary_says_ok_or_failed() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, (0..200).filter(|&i| i != 3));
    let out = run_verify(&clusters, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout.contains("partition 1 [0, 100): 1 missing"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("FAILED: 200 source records checked, 1 missing"),
        "{stdout}"
    );
}

/// `verify` takes the mirror's own command line (its flags after `verify`), so a renamed mirror
/// is checked against its renamed target topic.
#[test]
fn a_renamed_mirror_is_verified_with_the_mirrors_own_flags() {
    let clusters = MockPair::new(TOPIC, PARTITIONS).with_target_topics(&["dr.orders"]);
    clusters.write(0..200);
    let mirror_flags = [
        "--target.topic",
        "dr.{topic}",
        "--num.streams",
        "2",
        "--abort.on.send.failure",
        "true",
        "--no.data.loss",
        "true",
        "--create.topics",
        "true",
        "--shutdown.timeout.ms",
        "5000",
    ];
    clusters.mirror_until_committed(&mirror_flags, 200);
    let (out, json) = verify(&clusters, &mirror_flags);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{json}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A clean verification prints no error (the end of each partition is not one).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert_eq!(json["topics"][0]["target_topic"], "dr.orders");
    assert_eq!(json["totals"]["source_records"], 200);
    assert_eq!(json["totals"]["target_records"], 200);
    assert_eq!(totals(&json), [0; 5]);
    // The topic of the same name on the target is empty: checking it would find all missing.
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json["totals"]["missing"], 200);
}

/// With `--loop.prevention` every copy carries a provenance header naming the source cluster;
/// `verify` with the mirror's flags leaves that header out of the comparison.
#[test]
fn a_mirror_with_loop_prevention_is_verified_with_the_mirrors_own_flags() {
    let clusters = clusters_with_source();
    let mirror_flags = [
        "--loop.prevention",
        "true",
        "--source.cluster.name",
        "eu",
        "--target.cluster.name",
        "us",
    ];
    clusters.mirror_until_committed(&mirror_flags, 200);
    let (out, json) = verify(&clusters, &mirror_flags);
    assert_eq!(out.status.code(), Some(0), "{json}");
    assert_eq!(totals(&json), [0; 5]);
    // Without the flag the header is part of each copy: every record differs.
    let (out, json) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json["totals"]["changed"], 200);
}

/// Runs `mirror-maker verify` with exactly these arguments after the config files.
fn run_verify_args(clusters: &MockPair, args: &[&str]) -> Output {
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    binary()
        .arg("verify")
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--timeout.ms", "10000"])
        .args(args)
        .output()
        .unwrap()
}

/// A whitelist that matches nothing checks nothing, and that is not a pass.
#[test]
fn a_whitelist_that_matches_nothing_fails_and_says_so() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, 0..200);
    let out = run_verify_args(&clusters, &["--whitelist", "nothing-like-this"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("no source topic matches --whitelist \"nothing-like-this\""),
        "{stdout}"
    );
    assert!(!stdout.contains("OK"), "{stdout}");
}

/// `--until committed` with a group that never committed checks nothing.
#[test]
fn until_committed_with_a_group_that_never_committed_fails_and_says_so() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, 0..200);
    let out = run_verify(&clusters, &["--until", "committed"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("group mirror-test has committed no offset for topic orders"),
        "{stdout}"
    );
    let (out, json) = verify(&clusters, &["--until", "committed"]);
    assert_eq!(out.status.code(), Some(1), "{json}");
    assert_eq!(json["ok"], false, "{json}");
}

/// Identical records (null key and value, same timestamp) of one source partition
/// spread over target partitions by hash partitioning are not an ordering error: which copy
/// stands for which source record cannot be told.
#[test]
fn identical_records_spread_by_hash_partitioning_are_not_out_of_order() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    let send = |bootstrap: &str, partition: i32, key: Option<&str>, timestamp: i64| {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .unwrap();
        let mut record: BaseRecord<'_, str, str> = BaseRecord::to(TOPIC)
            .partition(partition)
            .timestamp(timestamp);
        record.key = key;
        record.payload = key;
        producer.send(record).unwrap();
        producer.flush(std::time::Duration::from_secs(10)).unwrap();
    };
    let t0 = 1_700_000_000_000;
    for i in 0..20 {
        let y = format!("y{i}");
        let t = t0 + i;
        // Source partition 0: X, Y, X (the two X identical).
        send(&clusters.src(), 0, None, t);
        send(&clusters.src(), 0, Some(&y), t);
        send(&clusters.src(), 0, None, t);
        // On the target, the first X in one partition, Y and the second X in the other (each
        // partition in source order, as a correct mirror writes them).
        let (first, rest) = if i % 2 == 0 { (1, 0) } else { (0, 1) };
        send(&clusters.dst(), first, None, t);
        send(&clusters.dst(), rest, Some(&y), t);
        send(&clusters.dst(), rest, None, t);
    }
    let (out, json) = verify(&clusters, &["--partitioning", "hash"]);
    assert_eq!(totals(&json), [0; 5], "{json}");
    assert_eq!(out.status.code(), Some(0), "{json}");
}

/// Reaching the end of a partition is normal; verify prints no error line for it
/// (librdkafka's PartitionEOF), whatever it finds.
#[test]
fn reaching_the_end_of_a_partition_prints_no_error() {
    let clusters = clusters_with_source();
    clusters.mirror_until_committed(&[], 200);
    // Records no mirror copied yet (as on a live mirror): reading the source to its end while
    // checking up to the commits meets the end of a partition more often than not.
    clusters.write(200..220);
    for until in ["end", "committed", "end", "committed", "end", "committed"] {
        let out = run_verify(&clusters, &["--until", until]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = if until == "end" { 1 } else { 0 };
        assert_eq!(out.status.code(), Some(expected), "{stderr}");
        assert!(
            !stderr.contains("ERROR") && !stderr.contains("PartitionEOF"),
            "{stderr}"
        );
    }
}

/// A matching topic with no records has nothing for the group to commit; with
/// `--until committed` it is not a topic left unchecked (the others are checked).
#[test]
fn an_empty_topic_without_commits_is_not_a_failure_of_until_committed() {
    let clusters = clusters_with_source();
    clusters.mirror_until_committed(&[], 200);
    clusters.source.create_topic("quiet", 2, 1).unwrap();
    clusters.target.create_topic("quiet", 2, 1).unwrap();
    let out = run_verify_args(
        &clusters,
        &["--whitelist", "orders|quiet", "--until", "committed"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("OK: 200 source records checked"),
        "{stdout}"
    );
}

#[test]
fn under_exactly_once_a_duplicate_fails_and_is_named() {
    let clusters = clusters_with_source();
    copy_samples(&clusters, (0..200).chain([30]));
    // Without --exactly.once a duplicate is counted, not a failure (see above).
    let (out, _) = verify(&clusters, &[]);
    assert_eq!(out.status.code(), Some(0));
    let (out, json) = verify(&clusters, &["--exactly.once", "true"]);
    assert_eq!(out.status.code(), Some(1), "{json}");
    assert_eq!(totals(&json), [0, 0, 1, 0, 0]);
    let named = &json["topics"][0]["duplicates"];
    let record = mirror_maker::tools::demo::sample(30, PARTITIONS, 100);
    assert_eq!(named.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(named[0]["partition"], record.partition);
    // Sample 30 is the 16th record of its partition in the source (offset 15), and its
    // second copy is the last record of that partition on the target (offset 100).
    assert_eq!(named[0]["offset"], 15, "{json}");
    assert_eq!(named[0]["target_partition"], record.partition);
    assert_eq!(named[0]["target_offset"], 100, "{json}");
    // The text report names it in one line.
    let out = run_verify(&clusters, &["--exactly.once"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!(
        "duplicated: {TOPIC}/{p} offset 15 copied again to {TOPIC}/{p} offset 100",
        p = record.partition
    );
    assert!(text.contains(&line), "{line:?} not in {text}");
    assert!(text.contains("FAILED"), "{text}");
}
