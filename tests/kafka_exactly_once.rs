//! `--exactly.once true` on Apache Kafka: a `read_committed` reader of the target sees every
//! committed source record once, in source order, and no record of an aborted source
//! transaction, through SIGKILLs, rebalances among several instances, and a paused instance
//! (a zombie) that wakes up after its partitions moved. Each trial ends with
//! `mirror-maker verify --exactly.once --isolation read_committed`, which fails on any
//! record lost, changed, out of order or duplicated.

use std::time::{Duration, Instant};

use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const TOPIC: &str = "orders";

/// The flags of an exactly-once mirror named `instance`, committing the source group (for
/// monitoring and for the tests' catching-up checks) every 200 ms.
fn exactly_once(instance: &'static str) -> [&'static str; 6] {
    [
        "--exactly.once",
        "true",
        "--instance.id",
        instance,
        "--offset.commit.interval.ms",
        "200",
    ]
}

/// The group's session ends 2 s after a member stops heart-beating (a SIGKILL, a SIGSTOP).
const QUICK_SESSION: &[(&str, &str)] = &[
    ("session.timeout.ms", "2000"),
    ("heartbeat.interval.ms", "300"),
];

/// `verify --exactly.once --isolation read_committed --json` over the pair's topic: asserts
/// exit 0 and returns the report's totals (source records, duplicated).
fn verified_exactly_once(pair: &KafkaPair) -> serde_json::Value {
    let (code, stdout, stderr) =
        pair.verify(&["--exactly.once", "--isolation", "read_committed", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    assert_eq!(
        code,
        Some(0),
        "verify --exactly.once failed: {json}\n{stderr}"
    );
    json["totals"].clone()
}

/// Waits until the mirror's group has committed the source's end offsets.
fn wait_caught_up(mirror: &mut Mirror, pair: &KafkaPair) -> Vec<i64> {
    let end = pair.end_offsets();
    wait_committed(
        mirror,
        &pair.src(),
        pair.topic,
        pair.partitions,
        end.iter().sum(),
    );
    end
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// 10 SIGKILLs of the mirror at seeded moments while a writer keeps adding records; each
/// restart (same --instance.id) aborts what its predecessor left open and resumes from the
/// store. Then 0 lost, 0 duplicated, order kept.
#[test]
fn hard_kills_during_a_steady_load_copy_each_record_once() {
    const KILLS: usize = 10;
    const PARTITIONS: i32 = 8;
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    pair.write(0..20_000);
    let trickle = pair.trickle(20_000, 100);
    let args = exactly_once("a");
    let mut rng = Rng(0x5eed_1234_abcd_0011);
    let started = Instant::now();
    let mut on_target_at_kills = Vec::new();
    for _ in 0..KILLS {
        let mut mirror = pair.start(QUICK_SESSION, &[], &args);
        wait_until(
            Duration::from_secs(60),
            "the mirror to start copying",
            || mirror.log().contains("starting from the offset mapping") || !mirror.is_running(),
        );
        assert!(mirror.is_running(), "log:\n{}", mirror.log());
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        mirror.signal("KILL");
        mirror.wait(Duration::from_secs(10));
        on_target_at_kills.push(
            end_offsets(&pair.dst(), TOPIC, PARTITIONS)
                .iter()
                .sum::<i64>(),
        );
    }
    let written = trickle.stop();
    let mut last = pair.start(QUICK_SESSION, &[], &args);
    wait_caught_up(&mut last, &pair);
    assert_eq!(last.stop().code(), Some(0), "log:\n{}", last.log());
    let totals = verified_exactly_once(&pair);
    eprintln!(
        "TRIAL exactly-once hard-kills kafka 4.4.0: {KILLS} SIGKILLs (target end offsets at \
         each, aborted transactions included: {on_target_at_kills:?}), {written} records, \
         verify: {totals}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(totals["source_records"], written);
    assert_eq!(totals["duplicated"], 0);
    // The mirror was copying when killed, not idle.
    assert!(
        on_target_at_kills
            .windows(2)
            .filter(|w| w[1] > w[0])
            .count()
            >= KILLS / 2
    );
}
