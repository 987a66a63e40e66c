//! `--sync.topic.configs` on Apache Kafka: configs changed on a source topic after its target
//! topic was made reach the target within an interval, and a config set by hand on the
//! target that `--create.topics.configs` does not list survives every round.

use std::time::{Duration, Instant};

use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const TOPIC: &str = "orders";
const INTERVAL_MS: u64 = 2000;

fn config(bootstrap: &str, topic: &str, key: &str) -> Option<String> {
    topic_configs(bootstrap, topic)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// Runs `mirror-maker check` of the pair's topic: stdout and stderr.
fn check(pair: &KafkaPair) -> String {
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &pair.src(), &pair.dst(), &[], &[]);
    let out = binary()
        .arg("check")
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", TOPIC])
        .output()
        .expect("running check");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn source_config_changes_reach_the_target_and_target_only_keys_survive() {
    let started = Instant::now();
    let pair = KafkaPair::with(KAFKA_4, 1, &[], TOPIC, 2, &[("retention.ms", "86400000")]);
    pair.write(0..200);
    let interval = INTERVAL_MS.to_string();
    let args = [
        "--offset.commit.interval.ms",
        "300",
        "--sync.topic.configs.interval.ms",
        &interval,
    ];
    let mut mirror = pair.mirror().args(&args).start();
    pair.wait_caught_up(&mut mirror);
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    let dst = pair.dst();
    assert_eq!(
        config(&dst, TOPIC, "retention.ms").as_deref(),
        Some("86400000")
    );

    // By hand on the target: keys the list does not name.
    set_topic_configs(
        &dst,
        TOPIC,
        &[("segment.bytes", "10485760"), ("min.insync.replicas", "1")],
    );
    // While the mirror is down, the source's retention changes: check says what will change.
    set_topic_configs(&pair.src(), TOPIC, &[("retention.ms", "3600000")]);
    let checked = check(&pair);
    assert!(
        checked.contains(
            "topic-config sync: orders -> orders: retention.ms will be set: source 3600000, \
             target 86400000"
        ),
        "{checked}"
    );
    assert!(!checked.contains("segment.bytes"), "{checked}");

    let mut mirror = pair.mirror().args(&args).start();
    wait_until(
        Duration::from_secs(30),
        "retention.ms on the target after the restart",
        || config(&dst, TOPIC, "retention.ms").as_deref() == Some("3600000"),
    );
    // While the mirror runs: a change reaches the target within an interval.
    let changed = Instant::now();
    set_topic_configs(
        &pair.src(),
        TOPIC,
        &[("cleanup.policy", "compact"), ("retention.ms", "7200000")],
    );
    wait_until(
        Duration::from_millis(INTERVAL_MS * 3),
        "cleanup.policy and retention.ms on the target",
        || {
            config(&dst, TOPIC, "cleanup.policy").as_deref() == Some("compact")
                && config(&dst, TOPIC, "retention.ms").as_deref() == Some("7200000")
        },
    );
    let took = changed.elapsed();
    // A round or two later, the keys set by hand are still there.
    std::thread::sleep(Duration::from_millis(INTERVAL_MS * 2));
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    let log = mirror.log();
    assert_eq!(
        config(&dst, TOPIC, "segment.bytes").as_deref(),
        Some("10485760"),
        "{log}"
    );
    assert_eq!(
        config(&dst, TOPIC, "min.insync.replicas").as_deref(),
        Some("1"),
        "{log}"
    );
    assert!(
        log.contains("topic-config sync: target topic orders: cleanup.policy delete -> compact"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("topic-config sync")),
        "{log}"
    );
    assert!(
        took <= Duration::from_millis(INTERVAL_MS + 1500),
        "took {took:?} for an interval of {INTERVAL_MS} ms"
    );
    eprintln!(
        "TRIAL config-sync kafka 4.4.0: retention.ms and cleanup.policy reached the target \
         {:.1} s after the change (interval {} s); segment.bytes and min.insync.replicas set on \
         the target kept; {:.0} s",
        took.as_secs_f64(),
        INTERVAL_MS / 1000,
        started.elapsed().as_secs_f64()
    );
}
