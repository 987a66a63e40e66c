//! A revocation while the target is slow: the records still queued for the released
//! partitions never reach the target after the release (they would land among the next
//! owner's copies, out of order).

use std::collections::HashMap;
use std::time::Duration;

use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 4;

/// How often a partition's copy on the target goes back to an earlier source record. Each
/// hand-over may go back once (the next owner starts at the last commit, before what the
/// previous owner had copied); records of the previous owner arriving among the next owner's
/// copies make it go back again, and again.
fn rewinds(clusters: &MockPair, partition: i32) -> usize {
    let position: HashMap<Option<i64>, usize> = clusters
        .source_records(partition)
        .into_iter()
        .enumerate()
        .map(|(i, r)| (r.timestamp, i))
        .collect();
    let copies: Vec<usize> = clusters
        .target_records(TOPIC, partition)
        .iter()
        .map(|r| position[&r.timestamp])
        .collect();
    copies.windows(2).filter(|w| w[1] < w[0]).count()
}

#[test]
fn records_queued_for_a_revoked_partition_never_land_among_the_next_owners_copies() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    // A slow target: records arrive faster than the target takes them, so the producer's
    // queue is full when the second instance joins and the first one's partitions are
    // revoked. The stop timeout (which bounded the revocation's flush) is short.
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_millis(1000))
        .unwrap();
    let producer = [
        ("batch.num.messages", "10"),
        ("linger.ms", "0"),
        ("queue.buffering.max.messages", "4000"),
    ];
    let args = [
        "--offset.commit.interval.ms",
        "300",
        "--shutdown.timeout.ms",
        "1000",
    ];
    let started = std::time::Instant::now();
    let writer = clusters.trickle(0, 40);
    let mut first = clusters.start(&[], &producer, &args);
    wait_until(
        Duration::from_secs(60),
        "the first instance's partitions",
        || first.log().contains("assigned ") || !first.is_running(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let mut second = clusters.start(&[], &producer, &args);
    wait_until(
        Duration::from_secs(60),
        "the second instance's partitions",
        || second.log().contains("assigned ") && second.log().contains("orders/"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let written = writer.stop();
    // The target recovers: everything queued drains.
    clusters
        .target
        .broker_round_trip_time(1, Duration::ZERO)
        .unwrap();
    eprintln!(
        "{written} written; second assigned after {:?}",
        started.elapsed()
    );
    wait_committed(
        &mut second,
        &clusters.src(),
        TOPIC,
        PARTITIONS,
        written as i64,
    );
    assert_eq!(first.stop().code(), Some(0), "log:\n{}", first.log());
    assert_eq!(second.stop().code(), Some(0), "log:\n{}", second.log());

    let c = clusters.compare();
    for line in first.log().lines().chain(second.log().lines()) {
        if line.contains("flush before") || line.contains("rewound") || line.contains("released") {
            eprintln!("{line}");
        }
    }
    eprintln!("{c:?} after {:?}", started.elapsed());
    assert_eq!(c.source, written);
    assert_eq!((c.lost, c.changed), (0, 0), "{c:?}");
    let rewinds: Vec<usize> = (0..PARTITIONS).map(|p| rewinds(&clusters, p)).collect();
    assert!(
        rewinds.iter().all(|&n| n <= 1),
        "a partition's copy went back more than once per hand-over: {rewinds:?} ({c:?}); \
         log of the first instance:\n{}",
        first.log()
    );
}

#[test]
fn a_lost_assignment_is_released_without_a_commit_and_loses_nothing() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..2000);
    let mut mirror = clusters.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 2000);
    let writer = clusters.trickle(2000, 20);
    std::thread::sleep(Duration::from_secs(1));
    // The coordinator no longer knows the member: librdkafka declares its assignment lost,
    // revokes it and joins again.
    clusters.source.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID],
    );
    wait_until(
        Duration::from_secs(60),
        "the partitions to come back",
        || mirror.log().matches("assigned 4 partitions").count() >= 2 || !mirror.is_running(),
    );
    let written = writer.stop();
    wait_committed(
        &mut mirror,
        &clusters.src(),
        TOPIC,
        PARTITIONS,
        written as i64,
    );
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert!(log.contains("assignment lost"), "log:\n{log}");
    assert!(
        !log.contains("commit before releasing"),
        "a lost assignment was committed as if revoked cleanly; log:\n{log}"
    );
    let c = clusters.compare();
    assert_eq!(c.source, written);
    assert_eq!((c.lost, c.changed), (0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
}
