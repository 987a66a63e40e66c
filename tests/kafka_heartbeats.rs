//! `--heartbeats.interval.ms` on Apache Kafka: heartbeats written to the source's heartbeats
//! topic are mirrored whatever the whitelist says and keep the replication delay
//! (`mirror_replication_delay_seconds`, from `/metrics`) honest while the source has no
//! traffic: near 0 while the target keeps up, growing with wall time while the target is
//! blackholed. Two instances in one group write one heartbeat stream between them.
//!
//! Past `--max.replication.delay.ms` (the target blackholed), `/health/ready` answers 503
//! naming the flag until the target is back. Records an hour old, once copied, give a delay of
//! 0 (their age shows in the latency histogram instead). The blackhole and old-records trials
//! run with both copy engines.
//!
//! With `--exactly.once true`, heartbeats are written and copied once, in order, in the
//! mirror's transactions.
//!
//! Run: `cargo test --test kafka_heartbeats -- --test-threads 1`.

use std::time::{Duration, Instant};

use mirror_test_harness::failover::read_all;
use mirror_test_harness::faults::FaultyPair;
use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const TOPIC: &str = "orders";
/// The default `--heartbeats.topic`.
const HEARTBEATS: &str = "mirror-maker.heartbeats";
const INTERVAL_MS: u64 = 500;
/// Statistics (where the delay comes from) twice a second.
const STATISTICS: &[(&str, &str)] = &[("statistics.interval.ms", "500")];

fn heartbeats_written(addr: &str) -> f64 {
    metric(&scrape(addr), "mirror_heartbeats_written_total", "").unwrap_or(0.0)
}

/// Heartbeats on the `bootstrap` cluster's heartbeats topic so far (0 before the topic is
/// there: the mirror makes it on the target once it copies it).
fn heartbeats_on(bootstrap: &str) -> i64 {
    end_offset_or_zero(bootstrap, HEARTBEATS)
}

fn with_heartbeats(builder: MirrorBuilder<'_>, addr: &str) -> Mirror {
    builder
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(addr)
        .flag("--heartbeats.interval.ms", &INTERVAL_MS.to_string())
        // Not looked for again during a trial: a heartbeats topic made at the start must be in
        // the first subscription.
        .topic_refresh_ms(600_000)
        .start()
}

/// With the source idle, heartbeats are copied (the whitelist names only `orders`) and the
/// delay stays within 2 s for 10 s.
#[test]
fn an_idle_source_with_heartbeats_stays_within_two_seconds_of_delay() {
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..100);
    let addr = free_local_addr();
    let mut mirror = with_heartbeats(pair.mirror(), &addr);
    pair.wait_caught_up(&mut mirror);
    mirror.wait_for("heartbeats on the target", |_| {
        heartbeats_written(&addr) >= 2.0
            && heartbeats_on(&pair.dst()) >= 1
            && metric(
                &scrape(&addr),
                "mirror_replication_delay_seconds",
                &format!("topic=\"{HEARTBEATS}\""),
            )
            .is_some()
    });
    let copied_before = heartbeats_on(&pair.dst());
    let idle_since = Instant::now();
    let mut worst: f64 = 0.0;
    while idle_since.elapsed() < Duration::from_secs(10) {
        let delay = max_delay(&addr);
        assert!(delay <= 2.0, "a delay of {delay} s: {}", scrape(&addr));
        worst = worst.max(delay);
        std::thread::sleep(Duration::from_millis(250)); // Not a condition: sampling a gauge.
    }
    let copied = heartbeats_on(&pair.dst()) - copied_before;
    // 20 intervals in 10 s; a few slow ones allowed.
    assert!(copied >= 10, "{copied} heartbeats copied in 10 s");
    println!("TRIAL idle source: worst delay {worst:.2} s over 10 s, {copied} heartbeats copied");
    assert_eq!(mirror.stop().code(), Some(0));
}

/// Two instances in one group: one writes (the owner of the heartbeats topic's partition 0),
/// the other does not; the source receives one heartbeat per interval, not two.
#[test]
fn two_instances_in_one_group_write_one_heartbeat_stream() {
    two_instances_write_one_stream(CopyMode::Records);
}

#[test]
fn two_instances_in_one_group_write_one_heartbeat_stream_with_batches() {
    two_instances_write_one_stream(CopyMode::Batches);
}

fn two_instances_write_one_stream(mode: CopyMode) {
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..100);
    let (a_addr, b_addr) = (free_local_addr(), free_local_addr());
    let mut a = with_heartbeats(pair.mirror().copy_mode(mode), &a_addr);
    a.wait_for_log(
        "heartbeats: this instance owns",
        "the first instance writing",
    );
    let mut b = with_heartbeats(pair.mirror().copy_mode(mode), &b_addr);
    // The group settled: the second instance has its share (with cooperative-sticky, only
    // once the first released it).
    b.wait_for("the second instance's share", |b| {
        let log = b.log();
        log.contains("assigned 1 partition") || log.contains("assigned 2 partitions")
    });
    let window = Duration::from_secs(6);
    let (before, a_before, b_before) = (
        heartbeats_on(&pair.src()),
        heartbeats_written(&a_addr),
        heartbeats_written(&b_addr),
    );
    let at = Instant::now();
    std::thread::sleep(window); // Not a condition: counting over a window.
    let elapsed = at.elapsed().as_secs_f64();
    let written = heartbeats_on(&pair.src()) - before;
    let by_a = heartbeats_written(&a_addr) - a_before;
    let by_b = heartbeats_written(&b_addr) - b_before;
    let one_stream = elapsed * 1000.0 / INTERVAL_MS as f64;
    println!(
        "TRIAL {}: {written} heartbeats in {elapsed:.1} s (one stream: {one_stream:.0}); \
         {by_a} by the first, {by_b} by the second",
        mode.named("two instances")
    );
    assert!(a.is_running() && b.is_running());
    assert!(
        (written as f64) <= one_stream * 1.3 + 1.0 && (written as f64) >= one_stream * 0.5,
        "{written} heartbeats in {elapsed:.1} s at one per {INTERVAL_MS} ms"
    );
    assert!(
        (by_a == 0.0) != (by_b == 0.0),
        "one writer: the first wrote {by_a}, the second {by_b}"
    );
    assert_eq!(b.stop().code(), Some(0));
    assert_eq!(a.stop().code(), Some(0));
}

/// The readiness limit of the blackhole trial: passed a few seconds into the blackhole.
const MAX_DELAY_MS: u64 = 3000;

/// The target blackholed, the source idle but for the heartbeats: the delay grows with wall
/// time (without heartbeats an idle source shows 0 however long the target is gone), and once
/// past `--max.replication.delay.ms` the mirror is not ready, saying why, until the target is
/// back (each crossing logged once).
#[test]
fn a_blackholed_target_grows_the_delay_with_wall_time_past_the_readiness_limit() {
    blackholed_target(CopyMode::Records);
}

#[test]
fn a_blackholed_target_grows_the_delay_with_wall_time_past_the_readiness_limit_with_batches() {
    blackholed_target(CopyMode::Batches);
}

/// `/health/ready` now: its status, and its body.
fn ready(addr: &str) -> (u16, String) {
    http_get(addr, "/health/ready")
}

fn blackholed_target(mode: CopyMode) {
    let started = Instant::now();
    let pair = FaultyPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..100);
    let addr = free_local_addr();
    let limit = MAX_DELAY_MS.to_string();
    let builder = pair
        .mirror()
        .copy_mode(mode)
        .flag("--max.replication.delay.ms", &limit);
    let mut mirror = with_heartbeats(builder, &addr);
    pair.wait_caught_up(&mut mirror);
    mirror.wait_for("heartbeats copied, the delay under 2 s, ready", |_| {
        heartbeats_on(&pair.dst()) >= 2 && max_delay(&addr) <= 2.0 && ready(&addr).0 == 200
    });
    pair.target_link.blackhole();
    let cut = Instant::now();
    // Readiness is asked as a probe would, so that the crossing is seen (and logged) as it
    // happens.
    let mut not_ready = None;
    mirror.wait_for("not ready for the delay", |_| {
        let (status, body) = ready(&addr);
        let why = status == 503 && body.contains("--max.replication.delay.ms");
        if why {
            not_ready = Some((cut.elapsed().as_secs_f64(), body));
        }
        why
    });
    let (not_ready_at, body) = not_ready.expect("seen not ready");
    mirror.wait_for("a delay above 5 s", |_| max_delay(&addr) > 5.0);
    let (first, first_at) = (max_delay(&addr), cut.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(3)); // Not a condition: the gauge over time.
    let (later, later_at) = (max_delay(&addr), cut.elapsed().as_secs_f64());
    assert_eq!(ready(&addr).0, 503, "still above the limit");
    // Never ahead of the wall clock (plus one statistics interval), and following it.
    assert!(
        later <= later_at + 1.0,
        "{later} s of delay {later_at} s in"
    );
    let grew = later - first;
    let passed = later_at - first_at;
    assert!(
        (grew - passed).abs() <= 1.0,
        "grew {grew:.1} s in {passed:.1} s"
    );
    // Not ready only once the limit was passed: never before MAX_DELAY_MS of wall time.
    assert!(
        not_ready_at * 1000.0 >= MAX_DELAY_MS as f64 - 500.0,
        "not ready {not_ready_at:.1} s into the blackhole, the limit {MAX_DELAY_MS} ms"
    );
    pair.target_link.heal();
    let healed = Instant::now();
    mirror.wait_for("the delay back under 2 s, ready", |_| {
        max_delay(&addr) <= 2.0 && ready(&addr).0 == 200
    });
    let ready_again = healed.elapsed().as_secs_f64();
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    let log = mirror.log();
    for line in [
        "is above --max.replication.delay.ms",
        "back under --max.replication.delay.ms",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line:?} once:\n{log}");
    }
    println!(
        "TRIAL blackholed target ({}): delay {first:.1} s at {first_at:.1} s, {later:.1} s at \
         {later_at:.1} s into the blackhole; not ready at {not_ready_at:.1} s ({}), ready \
         {ready_again:.1} s after the heal; {:.0} s",
        mode.flag(),
        body.lines().next().unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
}

/// Records stamped an hour ago, all copied: the delay (from the mirror's clocks) is 0 and
/// stays 0 while the source is idle, whatever the timestamps say; the latency histogram
/// (from the timestamps) shows their age.
#[test]
fn records_an_hour_old_all_copied_give_no_replication_delay() {
    old_records_all_copied(CopyMode::Records);
}

#[test]
fn records_an_hour_old_all_copied_give_no_replication_delay_with_batches() {
    old_records_all_copied(CopyMode::Batches);
}

fn old_records_all_copied(mode: CopyMode) {
    const HOUR_MS: i64 = 3_600_000;
    let started = Instant::now();
    let lane = SharedPair::get(KAFKA_4).lane(mode.named("stamped"), 2);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64;
    lane.write_stamped(100, now_ms - HOUR_MS);
    let addr = free_local_addr();
    let mut mirror = lane
        .mirror()
        .copy_mode(mode)
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    lane.wait_caught_up(&mut mirror);
    let delay_of_topic = || {
        metric(
            &scrape(&addr),
            "mirror_replication_delay_seconds",
            &format!("topic=\"{}\"", lane.topic),
        )
    };
    mirror.wait_for("the topic's delay at 0", |_| delay_of_topic() == Some(0.0));
    // Idle for a while: still 0 (2 s is four statistics intervals).
    let idle_since = Instant::now();
    while idle_since.elapsed() < Duration::from_secs(2) {
        assert_eq!(delay_of_topic(), Some(0.0), "{}", scrape(&addr));
        std::thread::sleep(Duration::from_millis(200)); // Not a condition: sampling a gauge.
    }
    let m = scrape(&addr);
    let sum = metric(&m, "mirror_replication_latency_seconds_sum", "").unwrap_or(0.0);
    let count = metric(&m, "mirror_replication_latency_seconds_count", "").unwrap_or(0.0);
    assert!(
        count > 0.0 && sum / count >= HOUR_MS as f64 / 1000.0,
        "the latency histogram shows the records' age (an hour): sum {sum} s over {count} \
         observations:\n{m}"
    );
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    println!(
        "TRIAL records an hour old ({}): 200 copied, delay 0 over 2 s idle, mean latency \
         {:.0} s over {count} observations; {:.0} s",
        mode.flag(),
        sum / count,
        started.elapsed().as_secs_f64()
    );
}

/// `--exactly.once true`: heartbeats are written to the source and copied in the mirror's
/// transactions, each once and in order (read_committed on the target: a prefix of the
/// source's heartbeats, none repeated).
#[test]
fn with_exactly_once_heartbeats_are_written_and_copied_once() {
    let started = Instant::now();
    let pair = KafkaPair::new(KAFKA_4, TOPIC, 2);
    pair.write(0..100);
    let addr = free_local_addr();
    let mut mirror = with_heartbeats(pair.mirror().exactly_once("beats"), &addr);
    pair.wait_caught_up(&mut mirror);
    mirror.wait_for("four heartbeats committed on the target", |_| {
        heartbeats_written(&addr) >= 4.0 && read_all(&pair.dst(), HEARTBEATS, 0).len() >= 4
    });
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let ids = |bootstrap: &str| -> Vec<String> {
        read_all(bootstrap, HEARTBEATS, 0)
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    let (source, target) = (ids(&pair.src()), ids(&pair.dst()));
    assert!(target.len() >= 4, "{} heartbeats copied", target.len());
    assert!(
        target.len() <= source.len() && target[..] == source[..target.len()],
        "the target's heartbeats are not the source's, once each, in order:\nsource {source:?}\n\
         target {target:?}"
    );
    println!(
        "TRIAL exactly once: {} heartbeats written, {} copied once each, {:.0} s",
        source.len(),
        target.len(),
        started.elapsed().as_secs_f64()
    );
}
