//! `--sync.topic.configs` on Apache Kafka: configs changed on a source topic after its target
//! topic was made reach the target within an interval, except the changes that would make the
//! target refuse what the source holds (compaction turned on, a lower `max.message.bytes`),
//! which are said once and not taken; and a config set by hand on the target that
//! `--create.topics.configs` does not list survives every round; with both copy engines, each
//! on a lane of one shared pair.

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

#[test]
fn source_config_changes_reach_the_target_and_target_only_keys_survive() {
    config_changes_reach_the_target(CopyMode::Records);
}

#[test]
fn source_config_changes_reach_the_target_and_target_only_keys_survive_with_batches() {
    config_changes_reach_the_target(CopyMode::Batches);
}

/// The trial, with either engine: a lane of the shared pair, the topic named for the engine.
fn config_changes_reach_the_target(mode: CopyMode) {
    let started = Instant::now();
    let topic = mode.named(TOPIC);
    let pair = SharedPair::get(KAFKA_4).lane_with(topic, 2, &[("retention.ms", "86400000")]);
    pair.write(0..200);
    let interval = INTERVAL_MS.to_string();
    let args = [
        "--copy.mode",
        mode.flag(),
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
        config(&dst, topic, "retention.ms").as_deref(),
        Some("86400000")
    );

    // By hand on the target: keys the list does not name.
    set_topic_configs(
        &dst,
        topic,
        &[("segment.bytes", "10485760"), ("min.insync.replicas", "1")],
    );
    // While the mirror is down, the source's retention changes: check says what will change.
    set_topic_configs(&pair.src(), topic, &[("retention.ms", "3600000")]);
    let checked = pair.check(&[]);
    assert!(
        checked.contains(&format!(
            "topic-config sync: {topic} -> {topic}: retention.ms will be set: source 3600000, \
             target 86400000"
        )),
        "{checked}"
    );
    assert!(!checked.contains("segment.bytes"), "{checked}");

    let mut mirror = pair.mirror().args(&args).start();
    wait_until(
        Duration::from_secs(30),
        "retention.ms on the target after the restart",
        || config(&dst, topic, "retention.ms").as_deref() == Some("3600000"),
    );
    // While the mirror runs: a change reaches the target within an interval; compaction
    // turned on and a lower limit do not (the source's log holds keyless records and 1 KB
    // batches the target would then refuse).
    let max_bytes = config(&dst, topic, "max.message.bytes").expect("max.message.bytes");
    let changed = Instant::now();
    set_topic_configs(
        &pair.src(),
        topic,
        &[
            ("cleanup.policy", "compact"),
            ("retention.ms", "7200000"),
            ("max.message.bytes", "500"),
        ],
    );
    wait_until(
        Duration::from_millis(INTERVAL_MS * 3),
        "retention.ms on the target",
        || config(&dst, topic, "retention.ms").as_deref() == Some("7200000"),
    );
    let took = changed.elapsed();
    // A round or two later, the keys set by hand are still there, and so are the guarded ones.
    std::thread::sleep(Duration::from_millis(INTERVAL_MS * 2));
    let checked = pair.check(&[]);
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    let log = mirror.log();
    assert_eq!(
        config(&dst, topic, "cleanup.policy").as_deref(),
        Some("delete"),
        "{log}"
    );
    assert_eq!(
        config(&dst, topic, "max.message.bytes"),
        Some(max_bytes.clone()),
        "{log}"
    );
    assert_eq!(
        config(&dst, topic, "segment.bytes").as_deref(),
        Some("10485760"),
        "{log}"
    );
    assert_eq!(
        config(&dst, topic, "min.insync.replicas").as_deref(),
        Some("1"),
        "{log}"
    );
    for (key, value, kept) in [
        ("cleanup.policy", "compact", "delete"),
        ("max.message.bytes", "500", max_bytes.as_str()),
    ] {
        let said = format!(
            "topic-config sync: source topic {topic} sets {key}={value}; target topic {topic} \
             keeps {kept}"
        );
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("WARN") && l.contains(&said))
                .count(),
            1,
            "once at WARN: {said}\n{log}"
        );
        assert!(checked.contains(&said), "{said}\n{checked}");
    }
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("topic-config sync"))
        .collect();
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(
        log.contains(&format!(
            "topic-config sync: target topic {topic}: retention.ms 3600000 -> 7200000"
        )),
        "{log}"
    );
    assert!(
        took <= Duration::from_millis(INTERVAL_MS + 1500),
        "took {took:?} for an interval of {INTERVAL_MS} ms"
    );
    eprintln!(
        "TRIAL config-sync kafka 4.4.0 ({}): retention.ms reached the target {:.1} s after the \
         change (interval {} s), cleanup.policy=compact and a lower max.message.bytes said and \
         not taken; segment.bytes and min.insync.replicas set on the target kept; {:.0} s",
        mode.flag(),
        took.as_secs_f64(),
        INTERVAL_MS / 1000,
        started.elapsed().as_secs_f64()
    );
}
