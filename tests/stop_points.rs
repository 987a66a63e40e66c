//! Stops at any point of a join or a rebalance: a SIGINT or SIGTERM while the group is
//! forming, while partitions are being assigned, or while another instance joins, ends with
//! exit 0 and no crash, and loses nothing. One run is made under valgrind (memory errors are
//! exit 99), as part of the suite.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use mirror_test_harness::*;

const TOPIC: &str = "orders";
/// The second topic of the mirror (2 partitions beside `orders`' 4).
const OTHER: &str = "payments";
const WHITELIST: &str = "orders|payments";

fn clusters() -> MockPair {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.source.create_topic(OTHER, 2, 1).unwrap();
    clusters.target.create_topic(OTHER, 2, 1).unwrap();
    clusters
}

fn start(clusters: &MockPair, env: &[(&str, &str)]) -> Mirror {
    clusters
        .mirror()
        .whitelist(WHITELIST)
        .streams(2)
        .commit_ms(300)
        .env(env)
        .start()
}

fn assigned(mirror: &Mirror) -> bool {
    mirror.log().contains("assigned ")
}

/// Sends `signal`, waits, and checks that the mirror exited 0 without a crash.
fn stop_cleanly(mirror: &mut Mirror, signal: &str, what: &str) -> ExitStatus {
    let started = Instant::now();
    mirror.signal(signal);
    let status = mirror.wait(Duration::from_secs(120));
    let log = mirror.log();
    assert_eq!(
        status.code(),
        Some(0),
        "{what}: SIGINT/SIGTERM must end in exit 0, got {status} after {:?}; log:\n{log}",
        started.elapsed()
    );
    assert!(
        !log.contains("assert") && !log.contains("panicked"),
        "{what}: {log}"
    );
    status
}

/// Every record written to both topics reaches the target, in order and unchanged.
fn assert_nothing_lost(clusters: &MockPair, written: (u64, u64)) {
    let mut mirror = start(clusters, &[]);
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 4, written.0 as i64);
    wait_committed(&mut mirror, &clusters.src(), OTHER, 2, written.1 as i64);
    stop_cleanly(&mut mirror, "TERM", "the last mirror");
    for (topic, partitions, n) in [(TOPIC, 4, written.0), (OTHER, 2, written.1)] {
        let c = compare_topic(&clusters.src(), &clusters.dst(), topic, partitions).unwrap();
        assert_eq!(c.source, n, "{topic}: {c:?}");
        assert_eq!((c.lost, c.changed), (0, 0), "{topic}: {c:?}");
        assert!(c.in_order, "{topic}: {c:?}");
    }
}

#[test]
fn stops_at_any_point_of_a_join_or_a_rebalance_exit_0_and_lose_nothing() {
    let clusters = clusters();
    clusters.write(0..2000);
    write_samples(&clusters.src(), OTHER, 0..1000, 2, 100).unwrap();
    let orders = clusters.trickle(2000, 20);
    let payments = Trickle::start(
        &clusters.src(),
        OTHER,
        2,
        1000,
        10,
        Duration::from_millis(20),
    );

    // Stops while the streams join (the mock's first join takes about 3 s) and just after.
    for (i, ms) in [300, 2400, 2900, 3300, 3800, 5000].into_iter().enumerate() {
        let mut mirror = start(&clusters, &[]);
        // Not a condition: the stop point, ms into the join, is the scenario.
        std::thread::sleep(Duration::from_millis(ms));
        let signal = if i % 2 == 0 { "INT" } else { "TERM" };
        stop_cleanly(&mut mirror, signal, &format!("stop {ms} ms into a join"));
    }

    // Stops while a second instance joins (a rebalance of both) and of the second one
    // while the first leaves.
    for (i, ms) in [0, 1000, 2500, 3500].into_iter().enumerate() {
        let mut first = start(&clusters, &[]);
        wait_until(Duration::from_secs(60), "a first assignment", || {
            assigned(&first) || !first.is_running()
        });
        let mut second = start(&clusters, &[]);
        // Not a condition: the stop point, ms into the rebalance, is the scenario.
        std::thread::sleep(Duration::from_millis(ms));
        let (a, b) = if i % 2 == 0 {
            ("TERM", "INT")
        } else {
            ("INT", "TERM")
        };
        stop_cleanly(&mut first, a, &format!("first, {ms} ms into a rebalance"));
        // Not a condition: the second stop point, while the first leaves.
        std::thread::sleep(Duration::from_millis(ms / 2));
        stop_cleanly(&mut second, b, &format!("second, {ms} ms after the first"));
    }

    let written = (orders.stop(), payments.stop());
    assert_nothing_lost(&clusters, written);
}

/// valgrind around the mirror: a memory error (an invalid read or write, a use after free)
/// ends the run with exit 99.
const VALGRIND: &str = "valgrind --error-exitcode=99 -q";

fn valgrind_installed() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// How long a mirror under valgrind may take to subscribe or to get its assignment: valgrind
/// runs one thread at a time, and a mirror starts several clients (the streams', the offset
/// mapping's producer and its start-up prune): 90 s proved short on this machine once.
const VALGRIND_PATIENCE: Duration = Duration::from_secs(240);

#[test]
fn under_valgrind_joins_rebalances_and_stops_without_a_memory_error() {
    assert!(
        valgrind_installed(),
        "valgrind is not installed: run ./scripts/test, which installs it, or apt-get install \
         valgrind"
    );
    let clusters = clusters();
    clusters.write(0..1000);
    write_samples(&clusters.src(), OTHER, 0..500, 2, 100).unwrap();
    let env = [("MIRROR_WRAPPER", VALGRIND)];

    // A stop while the streams join.
    let mut mirror = start(&clusters, &env);
    wait_until(VALGRIND_PATIENCE, "the streams to subscribe", || {
        mirror.log().contains("subscribed") || !mirror.is_running()
    });
    // Not a condition: the stop point, 1.5 s into the join.
    std::thread::sleep(Duration::from_millis(1500));
    stop_cleanly(&mut mirror, "INT", "valgrind: a stop during the join");

    // A stop while a second instance joins (a rebalance), after records were mirrored.
    let mut mirror = start(&clusters, &env);
    wait_until(VALGRIND_PATIENCE, "an assignment", || {
        assigned(&mirror) || !mirror.is_running()
    });
    // Not a condition: the mirror copies a while before the rebalance.
    std::thread::sleep(Duration::from_secs(2));
    let mut other = start(&clusters, &[]);
    // Not a condition: the stop point, 1.5 s into the rebalance.
    std::thread::sleep(Duration::from_millis(1500));
    stop_cleanly(&mut mirror, "TERM", "valgrind: a stop during a rebalance");
    stop_cleanly(&mut other, "TERM", "the instance beside valgrind's");

    // A stop of an instance that joins a running one, once it has its partitions.
    let mut other = start(&clusters, &[]);
    wait_until(Duration::from_secs(60), "an assignment", || {
        assigned(&other) || !other.is_running()
    });
    let mut mirror = start(&clusters, &env);
    wait_until(VALGRIND_PATIENCE, "an assignment", || {
        assigned(&mirror) || !mirror.is_running()
    });
    // Not a condition: the stop point, a second after the join.
    std::thread::sleep(Duration::from_secs(1));
    stop_cleanly(
        &mut mirror,
        "INT",
        "valgrind: a stop after joining a running group",
    );
    stop_cleanly(&mut other, "INT", "the instance beside valgrind's");
}
