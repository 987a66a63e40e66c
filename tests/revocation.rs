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
    let instance = clusters
        .mirror()
        .producer(&producer)
        .commit_ms(300)
        .shutdown_ms(1000);
    let started = std::time::Instant::now();
    let writer = clusters.trickle(0, 40);
    let mut first = instance.start();
    wait_until(
        Duration::from_secs(60),
        "the first instance's partitions",
        || first.log().contains("assigned ") || !first.is_running(),
    );
    // Not a condition: load against the slow target fills the first instance's producer queue
    // (nothing outside the process tells how full it is).
    std::thread::sleep(Duration::from_secs(3));
    let mut second = instance.start();
    wait_until(
        Duration::from_secs(60),
        "the second instance's partitions",
        || second.log().contains("assigned ") && second.log().contains("orders/"),
    );
    // Not a condition: records keep arriving a while after the rebalance.
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
    let mut mirror = clusters.mirror().commit_ms(300).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 2000);
    let writer = clusters.trickle(2000, 20);
    wait_until(
        Duration::from_secs(30),
        "records written after the catch-up mirrored",
        || committed_total(&clusters.src(), TOPIC, PARTITIONS) > 2000,
    );
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

/// SIGTERM while a revocation waits for a slow target: the revocation's flush (up to four
/// fifths of `max.poll.interval.ms` less the drain's `request.timeout.ms` + 2 s, 96 - 32 =
/// 64 s here) gives way to the stop, which is bounded by
/// `--shutdown.timeout.ms`, and what the stream commits was acknowledged (every record below
/// a committed offset is on the target).
#[test]
fn a_stop_during_a_slow_revocation_is_bounded_by_the_shutdown_timeout() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    // A slow target with a deep producer queue: a flush of what is queued takes about a
    // minute (10 records a request, 1 s a request).
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_millis(1000))
        .unwrap();
    let consumer = [("max.poll.interval.ms", "120000")];
    let producer = [
        ("batch.num.messages", "10"),
        ("linger.ms", "0"),
        ("queue.buffering.max.messages", "4000"),
    ];
    let mirror = clusters
        .mirror()
        .consumer(&consumer)
        .producer(&producer)
        .commit_ms(300)
        .shutdown_ms(2000);
    let writer = clusters.trickle(0, 40);
    let mut first = mirror
        .clone()
        .log("info,mirror_maker::mirror::at_least_once::rebalance=debug")
        .start();
    wait_until(
        Duration::from_secs(60),
        "the first instance's partitions",
        || first.log().contains("assigned 4 partitions") || !first.is_running(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let mut second = mirror.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !first
        .log()
        .contains(": flushing the producer (at most 64s)")
    {
        assert!(
            std::time::Instant::now() < deadline && first.is_running(),
            "no revocation of the first instance's partitions; log:\n{}\nsecond:\n{}",
            first.log(),
            second.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let written = writer.stop();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !first.log().contains("flush before releasing"),
        "the revocation's flush ended before the stop; log:\n{}",
        first.log()
    );
    let stopped = std::time::Instant::now();
    first.signal("TERM");
    let status = first.wait(Duration::from_secs(120));
    let took = stopped.elapsed();
    let log = first.log();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(
        took < Duration::from_secs(2 + 15),
        "the stop took {took:?} (shutdown timeout 2 s); log:\n{log}"
    );
    assert_eq!(second.stop().code(), Some(0), "log:\n{}", second.log());
    clusters
        .target
        .broker_round_trip_time(1, Duration::ZERO)
        .unwrap();
    // Both instances committed only what the target holds.
    let committed = clusters.committed();
    for p in 0..PARTITIONS {
        let on_target: std::collections::HashSet<Option<i64>> = clusters
            .target_records(TOPIC, p)
            .into_iter()
            .map(|r| r.timestamp)
            .collect();
        let source = clusters.source_records(p);
        let below = usize::try_from(committed[p as usize].max(0)).unwrap();
        let missing = source[..below]
            .iter()
            .filter(|r| !on_target.contains(&r.timestamp))
            .count();
        assert_eq!(
            missing, 0,
            "partition {p} committed at {below} with {missing} records below it not on the \
             target; log:\n{log}"
        );
    }
    eprintln!("stop took {took:?}; {written} written, committed {committed:?}");
}
