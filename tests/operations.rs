//! Running it in production: metrics and health over HTTP, progress and JSON log lines, and
//! secrets kept out of every output.

use std::time::Duration;

use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 4;

/// Statistics twice a second, so that lag and target reachability move quickly.
const STATISTICS: &[(&str, &str)] = &[("statistics.interval.ms", "500")];

/// A mirror of `clusters` serving metrics and health, with statistics twice a second, once
/// it says it is ready; and its metrics address.
fn ready_mirror(clusters: &MockPair) -> (Mirror, String) {
    let addr = free_local_addr();
    let mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .metrics_addr(&addr)
        .start();
    wait_until(Duration::from_secs(30), "ready", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    (mirror, addr)
}

fn sum_over_partitions(exposition: &str, name: &str) -> f64 {
    (0..PARTITIONS)
        .filter_map(|p| {
            metric(
                exposition,
                name,
                &format!("topic=\"{TOPIC}\",partition=\"{p}\""),
            )
        })
        .sum()
}

#[test]
fn metrics_move_as_records_flow_and_ready_follows_the_target() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..4000);
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(&addr)
        .flag("--progress.interval.ms", "500")
        .start();
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    wait_until(Duration::from_secs(30), "ready", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 4000);
    // Lag comes from the consumers' statistics: wait for a report after the catch-up.
    wait_until(Duration::from_secs(10), "lag to reach zero", || {
        let m = scrape(&addr);
        metric(
            &m,
            "mirror_consumer_lag",
            &format!("topic=\"{TOPIC}\",partition=\"0\""),
        ) == Some(0.0)
            && sum_over_partitions(&m, "mirror_consumer_lag") == 0.0
    });
    let first = scrape(&addr);
    assert_eq!(
        sum_over_partitions(&first, "mirror_records_consumed_total"),
        4000.0,
        "{first}"
    );
    assert_eq!(
        sum_over_partitions(&first, "mirror_records_acknowledged_total"),
        4000.0
    );
    assert_eq!(sum_over_partitions(&first, "mirror_records_in_flight"), 0.0);
    assert!(sum_over_partitions(&first, "mirror_bytes_consumed_total") > 4000.0 * 100.0);
    assert_eq!(
        metric(&first, "mirror_records_produced_total", ""),
        Some(4000.0)
    );
    assert_eq!(
        metric(&first, "mirror_replication_latency_seconds_count", ""),
        Some(4000.0)
    );
    assert!(metric(&first, "mirror_commits_total", "").unwrap() >= 1.0);
    assert!(metric(&first, "mirror_rebalances_total", "").unwrap() >= 1.0);
    assert!(metric(&first, "mirror_uptime_seconds", "").unwrap() > 0.0);
    assert!(first.contains("mirror_build_info{version=\""), "{first}");

    clusters.write(4000..6000);
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 6000);
    let second = scrape(&addr);
    assert_eq!(
        sum_over_partitions(&second, "mirror_records_consumed_total"),
        6000.0
    );

    // The target goes away: not ready (the mirror keeps running and waits); back: ready.
    clusters.target.broker_down(1).unwrap();
    wait_until(
        Duration::from_secs(30),
        "not ready while the target is down",
        || http_get(&addr, "/health/ready").0 == 503,
    );
    let (_, why) = http_get(&addr, "/health/ready");
    assert!(why.contains("reach the target"), "{why}");
    assert_eq!(http_get(&addr, "/health/live").0, 200);
    clusters.target.broker_up(1).unwrap();
    wait_until(Duration::from_secs(30), "ready again", || {
        http_get(&addr, "/health/ready").0 == 200
    });

    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    assert!(log.contains("progress: in "), "{log}");
    assert!(log.contains("serving metrics at http://"), "{log}");
    assert!(clusters.compare().is_exact());
}

#[test]
fn a_metrics_address_in_use_is_a_usage_error() {
    let clusters = MockPair::new(TOPIC, 1);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let mut mirror = clusters.mirror().metrics_addr(&addr).start();
    let status = mirror.wait(Duration::from_secs(30));
    let log = mirror.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("--metrics.addr") && log.contains(&addr),
        "{log}"
    );
    let mut mirror = clusters.mirror().metrics_addr("not-an-address").start();
    assert_eq!(mirror.wait(Duration::from_secs(30)).code(), Some(2));
    assert!(
        mirror.log().contains("not a HOST:PORT address"),
        "{}",
        mirror.log()
    );
}

#[test]
fn json_log_lines_are_one_object_each() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..200);
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .flag("--log.format", "json")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 200);
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    let mut messages = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(
            value["level"].is_string() && value["timestamp"].is_string(),
            "{line}"
        );
        messages.push(value["message"].as_str().unwrap_or_default().to_owned());
    }
    assert!(messages.iter().any(|m| m.starts_with("assigned")), "{log}");
    assert!(messages.iter().any(|m| m.starts_with("stopped")), "{log}");
}

#[test]
fn secrets_in_the_configs_never_reach_logs_errors_or_metrics() {
    const SECRET: &str = "s3cr3t-Pa55word";
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..200);
    let secrets = [
        ("sasl.password", SECRET),
        ("ssl.key.password", SECRET),
        ("statistics.interval.ms", "500"),
        ("debug", "conf,security"),
    ];
    let addr = free_local_addr();
    // Debug logs, with librdkafka's configuration dump.
    let mut mirror = clusters
        .mirror()
        .consumer(&secrets)
        .producer(&secrets)
        .commit_ms(300)
        .metrics_addr(&addr)
        .log("debug")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 200);
    let metrics = scrape(&addr);
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    assert!(
        log.contains("sasl.password"),
        "expected the configuration dump:\n{log}"
    );
    assert!(!log.contains(SECRET), "the log shows a secret");
    assert!(!metrics.contains(SECRET), "the metrics show a secret");

    // A value librdkafka rejects in a file that also holds a secret: the error names the
    // key at fault and still hides the secret.
    let dir = tempdir();
    let consumer = write_config(
        dir.path(),
        "consumer.toml",
        &clusters.src(),
        &[
            ("group.id", "g"),
            ("sasl.password", SECRET),
            ("auto.offset.reset", SECRET),
        ],
    );
    let producer = write_config(dir.path(), "producer.toml", &clusters.dst(), &[]);
    let out = binary()
        .args(["--whitelist", TOPIC, "--consumer.config"])
        .arg(&consumer)
        .arg("--producer.config")
        .arg(&producer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("auto.offset.reset"), "{stderr}");
    assert!(
        !stderr.contains(SECRET),
        "the error shows a secret: {stderr}"
    );
}

#[test]
fn target_topic_template_renames_every_record() {
    let clusters = MockPair::new(TOPIC, 2).with_target_topics(&["primary.orders"]);
    clusters.write(0..300);
    let log = clusters.mirror_until_committed(&["--target.topic", "primary.{topic}"], 300);
    for partition in 0..2 {
        assert_eq!(
            clusters.target_records("primary.orders", partition),
            clusters.source_records(partition),
            "partition {partition}\n{log}"
        );
        assert!(clusters.target_records(TOPIC, partition).is_empty());
    }
}

/// The provenance headers of a record, in order.
fn provenance(r: &mirror_maker::tools::compare::OwnedRecord) -> Vec<String> {
    r.headers
        .iter()
        .filter(|(k, _)| k == mirror_maker::settings::routing::PROVENANCE_HEADER)
        .map(|(_, v)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

#[test]
fn active_active_mirrors_with_loop_prevention_copy_each_record_once_each_way() {
    // Two clusters, "east" (MockPair's source) and "west" (its target), each with its own
    // producers writing to the same topic name, and a mirror each way.
    let clusters = MockPair::new(TOPIC, 2);
    let (east, west) = (clusters.src(), clusters.dst());
    write_samples(&east, TOPIC, 0..300, 2, 50).unwrap();
    write_samples(&west, TOPIC, 1000..1200, 2, 50).unwrap();
    let dir = tempdir();
    let (ec, wp) = mirror_configs(dir.path(), &east, &west, &[], &[]);
    let dir2 = tempdir();
    let (wc, ep) = mirror_configs(dir2.path(), &west, &east, &[], &[]);
    let start = |c: &std::path::Path, p: &std::path::Path, from: &str, to: &str| {
        Mirror::with_configs(c, p)
            .whitelist(TOPIC)
            .commit_ms(300)
            .args(&["--loop.prevention"])
            .flag("--source.cluster.name", from)
            .flag("--target.cluster.name", to)
            .start()
    };
    let mut east_to_west = start(&ec, &wp, "east", "west");
    let mut west_to_east = start(&wc, &ep, "west", "east");
    // Each cluster ends with its own records and a copy of the other's: 500, and no more
    // however long the mirrors keep running.
    wait_committed(&mut east_to_west, &east, TOPIC, 2, 500);
    wait_committed(&mut west_to_east, &west, TOPIC, 2, 500);
    // Not a condition: the mirrors keep running a while, in which a loop would copy more.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        east_to_west.stop().code(),
        Some(0),
        "{}",
        east_to_west.log()
    );
    assert_eq!(
        west_to_east.stop().code(),
        Some(0),
        "{}",
        west_to_east.log()
    );
    for (cluster, own, copied_from) in [(&east, "east", "west"), (&west, "west", "east")] {
        let all: Vec<_> = (0..2).flat_map(|p| records(cluster, TOPIC, p)).collect();
        assert_eq!(all.len(), 500, "{own}");
        let copies = all.iter().filter(|r| !provenance(r).is_empty()).count();
        let expected_copies = if own == "east" { 200 } else { 300 };
        assert_eq!(copies, expected_copies, "{own}");
        assert!(
            all.iter()
                .all(|r| provenance(r).is_empty() || provenance(r) == [copied_from]),
            "{own}: a record went round"
        );
    }
    assert!(committed_total(&east, TOPIC, 2) == 500 && committed_total(&west, TOPIC, 2) == 500);
}

#[test]
fn systemd_hears_ready_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..100);
    let dir = tempdir();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .env(&[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "1000000"),
        ])
        .start();
    let mut heard: Vec<String> = Vec::new();
    let listen = |heard: &mut Vec<String>, until: &dyn Fn(&[String]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut buf = [0u8; 512];
        while !until(heard) && std::time::Instant::now() < deadline {
            if let Ok(n) = socket.recv(&mut buf) {
                heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    };
    listen(&mut heard, &|h| {
        h.iter().any(|m| m.contains("READY=1"))
            && h.iter().filter(|m| m.as_str() == "WATCHDOG=1").count() >= 3
    });
    assert!(heard.iter().any(|m| m.starts_with("READY=1")), "{heard:?}");
    assert!(
        heard.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3,
        "{heard:?}"
    );
    mirror.signal("TERM");
    listen(&mut heard, &|h| h.iter().any(|m| m.contains("STOPPING=1")));
    assert!(
        heard.iter().any(|m| m.starts_with("STOPPING=1")),
        "{heard:?}"
    );
    assert_eq!(
        mirror.wait(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        mirror.log()
    );
}

/// Runs `mirror-maker check` with these configs and flags: exit code and stdout.
fn check(consumer: &std::path::Path, producer: &std::path::Path, flags: &[&str]) -> (i32, String) {
    let out = binary()
        .arg("check")
        .arg("--consumer.config")
        .arg(consumer)
        .arg("--producer.config")
        .arg(producer)
        .args(flags)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

/// `check` shows the heartbeats (where they go, whether the topic must be made, its target
/// topic) and the throttle's limits, as a run would apply them.
#[test]
fn check_shows_the_heartbeats_and_the_throttle() {
    let clusters = MockPair::new(TOPIC, 2);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let flags = [
        "--whitelist",
        "orders",
        "--heartbeats.interval.ms",
        "1000",
        "--target.topic",
        "dr.{topic}",
        "--throttle.bytes.per.second",
        "5000000",
        "--throttle.records.per.second",
        "2000",
    ];
    let (code, out) = check(&c, &p, &flags);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "heartbeats: every 1s to source topic mirror-maker.heartbeats (missing, will be \
             created with 1 partition: the consumer config's principal needs CREATE on it), \
             mirrored to target topic dr.mirror-maker.heartbeats"
        ),
        "{out}"
    );
    assert!(
        out.contains("throttle: 5000000 bytes/s and 2000 records/s over all streams"),
        "{out}"
    );
    clusters
        .source
        .create_topic("mirror-maker.heartbeats", 1, 1)
        .unwrap();
    let (_, out) = check(&c, &p, &flags);
    assert!(
        out.contains("heartbeats: every 1s to source topic mirror-maker.heartbeats (exists)"),
        "{out}"
    );
    // Once it exists it is listed with the mirrored topics, though the whitelist names only
    // orders.
    assert!(
        out.contains("mirror-maker.heartbeats (1 partition) -> dr.mirror-maker.heartbeats"),
        "{out}"
    );
}

#[test]
fn check_lists_what_would_be_mirrored_and_explains_each_problem() {
    let clusters = MockPair::new(TOPIC, 2).with_target_topics(&["dr.orders"]);
    clusters.source.create_topic("payments", 4, 1).unwrap();
    clusters.target.create_topic("payments", 2, 1).unwrap();
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);

    let (code, out) = check(&c, &p, &["--whitelist", "orders"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("orders (2 partitions) -> orders: exists, 2 partitions"),
        "{out}"
    );
    assert!(out.contains("OK: ready to mirror"), "{out}");
    // Which engine run would copy with: the mock cluster refuses the batch engine's
    // ApiVersions v3, so the default copies records, and says why.
    assert!(
        out.contains(
            "engine: records (--copy.mode auto: the batch engine cannot serve the source \
             cluster: broker"
        ),
        "{out}"
    );
    // Who else may write the offset-mapping topic is said not to be checked, and where the
    // ACL is shown.
    assert!(
        out.contains("not checked who else may write topic mirror-maker.offsets.source")
            && out.contains("docs/security.md"),
        "{out}"
    );
    // Which limit bounds a record's size.
    assert!(
        out.contains("record size: bounded by each target topic's max.message.bytes"),
        "{out}"
    );

    let (code, out) = check(
        &c,
        &p,
        &["--whitelist", "orders", "--target.topic", "dr.{topic}"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("orders (2 partitions) -> dr.orders: exists"),
        "{out}"
    );

    let renamed = [
        "--whitelist",
        "orders|payments",
        "--target.topic",
        "x.{topic}",
    ];
    let (code, out) = check(&c, &p, &renamed);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "orders (2 partitions) -> x.orders: missing, will be created with 2 partitions"
        ),
        "{out}"
    );
    let (code, out) = check(
        &c,
        &p,
        &[&renamed[..], &["--create.topics", "false"]].concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: target topic x.orders does not exist: create it with 2 partitions"),
        "{out}"
    );
    assert!(
        out.contains(
            "problem: target topic x.payments does not exist: create it with 4 partitions"
        ),
        "{out}"
    );

    let (code, out) = check(&c, &p, &["--whitelist", "payments"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("payments (4 partitions) -> payments: 2 partitions, 2 will be added"),
        "{out}"
    );
    let fixed = ["--whitelist", "payments", "--create.topics", "false"];
    let (code, out) = check(&c, &p, &fixed);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("has 2 partitions, source topic payments has 4"),
        "{out}"
    );
    let (code, out) = check(&c, &p, &[&fixed[..], &["--partitioning", "hash"]].concat());
    assert_eq!(code, 0, "{out}");

    let nowhere = write_config(dir.path(), "nowhere.toml", "127.0.0.1:1", &[]);
    let (code, out) = check(
        &c,
        &nowhere,
        &["--whitelist", "orders", "--startup.timeout.ms", "2000"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("cannot reach the target cluster (bootstrap.servers = 127.0.0.1:1"),
        "{out}"
    );

    let (code, out) = check(&c, &p, &["--whitelist", "("]);
    assert_eq!(code, 2, "{out}");
}

/// The buckets of the histogram `name`: (upper bound, cumulative count), +Inf last.
fn buckets(exposition: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    exposition
        .lines()
        .filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The replication latency runs from the source record's timestamp to the
/// target's acknowledgement (not from the broker's append time in the delivery report).
#[test]
fn replication_latency_runs_from_the_source_timestamp_to_the_acknowledgement() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    let addr = free_local_addr();
    let mut mirror = clusters.mirror().commit_ms(300).metrics_addr(&addr).start();
    wait_until(Duration::from_secs(30), "ready", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    // Records stamped now (the producer's default), mirrored while the mirror runs.
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    for i in 0..50 {
        let key = format!("k{i}");
        producer
            .send(BaseRecord::<String, str>::to(TOPIC).key(&key).payload("v"))
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 50);
    let m = scrape(&addr);
    let buckets = buckets(&m, "mirror_replication_latency_seconds");
    assert_eq!(buckets.last(), Some(&(f64::INFINITY, 50.0)), "{m}");
    // Mirrored within seconds of being written: all of them in the buckets up to 5 s.
    let within = buckets
        .iter()
        .filter(|(le, _)| *le <= 5.0)
        .map(|(_, n)| *n)
        .fold(0.0, f64::max);
    assert_eq!(within, 50.0, "{m}");
    let sum = metric(&m, "mirror_replication_latency_seconds_sum", "").unwrap();
    assert!(sum < 50.0 * 5.0, "{m}");
    assert_eq!(mirror.stop().code(), Some(0));
}

/// GNU `timeout` sends SIGTERM to the mirror and then to its process group,
/// microseconds apart: one stop request, a clean stop (exit 0), not "exit now".
#[test]
fn two_sigterms_at_once_from_timeout_stop_cleanly() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..100);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let log = dir.path().join("stderr.log");
    let status = std::process::Command::new("timeout")
        .args(["--preserve-status", "--signal", "TERM", "6"])
        .arg(env!("CARGO_BIN_EXE_mirror-maker"))
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", TOPIC, "--offset.commit.interval.ms", "300"])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .expect("running timeout (GNU coreutils)");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("SIGTERM: stopping"), "{log}");
    assert!(!log.contains("exiting now"), "{log}");
    assert_eq!(status.code(), Some(0), "{log}");
    assert_eq!(committed_total(&clusters.src(), TOPIC, 2), 100, "{log}");
}

/// Two signals 50 ms apart (a supervisor signalling the process and its group,
/// as `timeout`, `docker stop` or systemd's KillMode=control-group may) are one stop request.
#[test]
fn two_sigterms_50_ms_apart_stop_cleanly() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..100);
    let mut mirror = clusters.mirror().commit_ms(300).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 100);
    mirror.signal("TERM");
    // Not a condition: the 50 ms between the signals is the scenario.
    std::thread::sleep(Duration::from_millis(50));
    if mirror.is_running() {
        mirror.signal("TERM");
    }
    let status = mirror.wait(Duration::from_secs(30));
    let log = mirror.log();
    assert!(!log.contains("exiting now"), "{log}");
    assert_eq!(status.code(), Some(0), "{log}");
}

/// A second signal well after the first (a person pressing Ctrl-C again while
/// the flush waits for an unreachable target) exits at once with 130.
#[test]
fn a_second_signal_seconds_later_exits_now_with_130() {
    let clusters = MockPair::new(TOPIC, 2);
    let mut mirror = clusters.mirror().shutdown_ms(20000).start();
    wait_until(Duration::from_secs(30), "an assignment", || {
        mirror.log().contains("assigned 2 partitions")
    });
    clusters.target.broker_down(1).unwrap();
    clusters.write(0..100);
    // Not a condition one can watch: time for the records to reach the stream and wait for
    // the target (nothing outside the process tells that they are queued).
    std::thread::sleep(Duration::from_millis(500));
    mirror.signal("TERM");
    // Not a condition: the seconds between the two signals are the scenario.
    std::thread::sleep(Duration::from_secs(2));
    assert!(mirror.is_running(), "{}", mirror.log());
    mirror.signal("TERM");
    let status = mirror.wait(Duration::from_secs(10));
    let log = mirror.log();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("SIGTERM again: exiting now"), "{log}");
}

/// Kubernetes sends one SIGTERM and kills 30 s later: one signal while the mirror still waits
/// for brokers that do not answer ends the start at once, a clean stop (exit 0, nothing was
/// copied), not a wait for `--startup.timeout.ms`.
#[test]
fn one_signal_during_start_up_stops_at_once_with_0() {
    let dir = tempdir();
    let nowhere = "127.0.0.1:1";
    let (c, p) = mirror_configs(dir.path(), nowhere, nowhere, &[], &[]);
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(TOPIC)
        .startup_ms(60_000)
        .start();
    // Not a condition: the second is the scenario (the mirror waits for the brokers and says
    // nothing meanwhile).
    std::thread::sleep(Duration::from_secs(1));
    assert!(mirror.is_running(), "{}", mirror.log());
    let signalled = std::time::Instant::now();
    mirror.signal("TERM");
    let status = mirror.wait(Duration::from_secs(20));
    let took = signalled.elapsed();
    let log = mirror.log();
    assert_eq!(status.code(), Some(0), "{log}");
    // Not a speed test: well within the 60 s start-up timeout it used to wait out, with room
    // for a busy machine.
    assert!(took < Duration::from_secs(10), "took {took:?}: {log}");
    assert!(!log.contains("cannot reach"), "{log}");
}

/// A mirror that logs a few lines and exits 1 by itself within seconds: source topic `wide` has
/// 4 partitions, its target 2, under `--partitioning preserve` (the mock cannot add any).
/// Returns the clusters (keep them alive) and the mirror's arguments.
fn a_mirror_that_stops_by_itself(dir: &std::path::Path) -> (MockPair, Vec<String>) {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.source.create_topic("wide", 4, 1).unwrap();
    clusters.target.create_topic("wide", 2, 1).unwrap();
    let (c, p) = mirror_configs(dir, &clusters.src(), &clusters.dst(), &[], &[]);
    let args = [
        "--consumer.config",
        c.to_str().unwrap(),
        "--producer.config",
        p.to_str().unwrap(),
        "--whitelist",
        "wide",
        "--startup.timeout.ms",
        "3000",
    ]
    .map(str::to_owned)
    .to_vec();
    (clusters, args)
}

/// Log lines written to a file or a pipe carry no ANSI colour codes.
#[test]
fn logs_off_a_terminal_have_no_colour() {
    let dir = tempdir();
    let (_clusters, args) = a_mirror_that_stops_by_itself(dir.path());
    let out = binary()
        .args(&args)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("mirroring topics matching"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

/// Runs the binary with `args` on a pseudo-terminal (util-linux `script`), returning what the
/// terminal showed.
fn on_a_terminal(args: &[String], env: &[(&str, &str)]) -> String {
    let command = std::iter::once(env!("CARGO_BIN_EXE_mirror-maker").to_owned())
        .chain(args.iter().cloned())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running script (util-linux)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// On a terminal, colour, unless NO_COLOR is set (https://no-color.org).
#[test]
fn logs_on_a_terminal_are_coloured_unless_no_color_is_set() {
    let dir = tempdir();
    let (_clusters, args) = a_mirror_that_stops_by_itself(dir.path());
    let shown = on_a_terminal(&args, &[]);
    assert!(shown.contains("mirroring topics matching"), "{shown}");
    assert!(
        shown.contains("\u{1b}["),
        "no colour on a terminal: {shown:?}"
    );
    let shown = on_a_terminal(&args, &[("NO_COLOR", "1")]);
    assert!(shown.contains("mirroring topics matching"), "{shown}");
    assert!(
        !shown.contains('\u{1b}'),
        "colour despite NO_COLOR: {shown:?}"
    );
}

/// With `--log.format json`, the final error line is a JSON object too.
#[test]
fn json_logs_end_with_a_json_error_line() {
    let dir = tempdir();
    let (_clusters, mut args) = a_mirror_that_stops_by_itself(dir.path());
    args.extend(["--log.format".to_owned(), "json".to_owned()]);
    let out = binary()
        .args(&args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}\nall:\n{stderr}"));
    }
    let last: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("target topic wide has 2 partitions"),
        "{stderr}"
    );
}

/// Before any statistics of an assigned partition the lag is unknown (not 0,
/// with a backlog waiting); rates and totals are kept apart, looped records included.
#[test]
fn progress_lines_say_lag_unknown_until_known_and_keep_rates_and_totals_apart() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..1000);
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .flag("--progress.interval.ms", "200")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 1000);
    // A line once the lag is known.
    mirror.wait_for("a progress line with lag 0", |m| {
        m.log()
            .lines()
            .any(|l| l.contains("progress:") && l.contains("lag 0"))
    });
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    let assigned_at = log.find("assigned 2 partitions").expect("an assignment");
    let before: Vec<&str> = log[..assigned_at]
        .lines()
        .filter(|l| l.contains("progress:"))
        .collect();
    assert!(
        !before.is_empty(),
        "no progress line before the assignment:\n{log}"
    );
    for line in &before {
        assert!(line.contains("lag unknown"), "{line}\n{log}");
    }
    let stopping = log.find("SIGTERM: stopping").expect("the stop");
    let last = log[..stopping]
        .lines()
        .rfind(|l| l.contains("progress:"))
        .expect("a progress line");
    assert!(last.contains("lag 0"), "{last}");
    let (rates, totals) = last
        .split_once("; totals: ")
        .unwrap_or_else(|| panic!("rates and totals not apart: {last}"));
    assert!(rates.contains("records/s"), "{last}");
    for word in [
        "consumed 1000",
        "acknowledged 1000",
        "dropped 0",
        "filtered 0",
        "looped 0",
    ] {
        assert!(totals.contains(word), "{word:?} not in the totals: {last}");
    }
    assert!(!totals.contains("/s"), "{last}");
}

/// `text` has no "1 partitions", "1 brokers" and the like.
fn assert_singulars(text: &str) {
    for noun in [
        "partitions",
        "brokers",
        "records",
        "streams",
        "topics",
        "offsets",
    ] {
        for lead in [" ", "(", "\n"] {
            let wrong = format!("{lead}1 {noun}");
            assert!(!text.contains(&wrong), "{wrong:?} in:\n{text}");
        }
    }
}

/// One of a thing is not plural, in the mirror's log and in `check`.
#[test]
fn one_partition_one_broker_one_record_are_singular() {
    let clusters = MockPair::new(TOPIC, 1);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let (code, out) = check(
        &c,
        &p,
        &["--whitelist", "orders", "--target.topic", "z.{topic}"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("reachable (1 broker)"), "{out}");
    assert!(out.contains("will be created with 1 partition"), "{out}");
    assert_singulars(&out);
    clusters.write(0..1);
    let log = clusters.mirror_until_committed(&[], 1);
    assert!(log.contains("assigned 1 partition: orders/0"), "{log}");
    assert_singulars(&log);
}

/// Sends `METHOD path` over HTTP/1.0 and returns the whole response.
fn http_raw(addr: &str, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// HEAD is answered like GET, without a body (monitoring probes use it); other
/// methods get 405 with the allowed ones.
#[test]
fn head_is_answered_like_get_without_a_body() {
    let clusters = MockPair::new(TOPIC, 2);
    let addr = free_local_addr();
    let mut mirror = clusters.mirror().metrics_addr(&addr).start();
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    for path in ["/metrics", "/health/live"] {
        let response = http_raw(&addr, "HEAD", path);
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        // HTTP/1.0 asked, HTTP/1.0 answered (hyper answers in the version asked in).
        assert!(head.starts_with("HTTP/1.0 200"), "{response}");
        assert!(head.contains("Content-Length: "), "{response}");
        assert_eq!(body, "", "{response}");
    }
    let response = http_raw(&addr, "POST", "/metrics");
    assert!(response.starts_with("HTTP/1.0 405"), "{response}");
    assert!(response.contains("Allow: GET, HEAD"), "{response}");
    assert_eq!(mirror.stop().code(), Some(0));
}

/// `GET path` over HTTP/1.1 with this Host header, answered within 2 s: status and body.
fn get_for_host(addr: &str, host: &str, path: &str) -> (u16, String) {
    http_exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        Duration::from_secs(2),
    )
}

/// A liveness probe that times out gets a healthy mirror killed: the endpoints answer within
/// a second each while one client sends its request a byte a second and never finishes it,
/// and 200 more connections sit idle.
#[test]
fn health_answers_within_a_second_while_one_client_stalls_and_200_sit_idle() {
    use std::io::Write;
    use std::sync::mpsc;
    let clusters = MockPair::new(TOPIC, 2);
    let (mut mirror, addr) = ready_mirror(&clusters);
    let (stop, stopped) = mpsc::channel::<()>();
    let (started, first_byte) = mpsc::channel();
    let stalling = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            // One byte a second, the request line never ended; again when the server hangs up.
            while let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                let _ = started.send(());
                while stream.write_all(b"G").is_ok() {
                    if stopped.recv_timeout(Duration::from_secs(1))
                        != Err(mpsc::RecvTimeoutError::Timeout)
                    {
                        return;
                    }
                }
            }
        })
    };
    first_byte
        .recv_timeout(Duration::from_secs(5))
        .expect("the stalling client connected");
    let socket: std::net::SocketAddr = addr.parse().unwrap();
    let idle: Vec<_> = (0..200)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&socket, Duration::from_millis(200)).ok()
        })
        .collect();
    let began = std::time::Instant::now();
    let mut rounds = 0;
    while began.elapsed() < Duration::from_secs(6) {
        for path in ["/health/live", "/health/ready"] {
            let asked = std::time::Instant::now();
            let (status, body) = get_for_host(&addr, &addr, path);
            let took = asked.elapsed();
            // Answered: live, and ready or not as the readiness rules say (under load, the
            // mock's producer statistics can report the target unreached for a moment).
            let answered = match path {
                "/health/live" => status == 200,
                _ => matches!(status, 200 | 503) && body.contains("streams with an assignment"),
            };
            assert!(
                answered,
                "{path}, {:?} into the stall ({} idle connections): {status} {body:?}",
                began.elapsed(),
                idle.len()
            );
            assert!(took < Duration::from_secs(1), "{path} took {took:?}");
        }
        rounds += 1;
        // A probe period, as a kubelet's; nothing is waited for.
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(rounds >= 10, "{rounds} rounds of probes in 6 s");
    drop(stop);
    stalling.join().unwrap();
    drop(idle);
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// A request line or a header without end is cut off at a bound: the connection is closed
/// long before 64 MiB are read, the mirror's resident memory does not grow by more than a
/// few MiB, and the endpoints still answer.
#[test]
fn an_endless_request_line_or_header_is_cut_off_without_growing_memory() {
    use std::io::Write;
    const ENDLESS: usize = 64 << 20;
    const GROWTH_KIB: u64 = 8 << 10;
    let clusters = MockPair::new(TOPIC, 1);
    let addr = free_local_addr();
    let mut mirror = clusters.mirror().metrics_addr(&addr).start();
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    let pid = mirror.pid();
    let chunk = vec![b'a'; 64 << 10];
    for (what, start) in [
        ("request line", "GET /".to_owned()),
        (
            "header",
            format!("GET /health/live HTTP/1.1\r\nHost: {addr}\r\nX-Endless: "),
        ),
    ] {
        let before = process_memory_kib(pid, "VmRSS");
        // The peak since now, where the kernel lets it be reset; else the size after.
        let peak = if reset_peak_memory(pid) {
            "VmHWM"
        } else {
            "VmRSS"
        };
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut sent = 0;
        if stream.write_all(start.as_bytes()).is_ok() {
            while sent < ENDLESS && stream.write_all(&chunk).is_ok() {
                sent += chunk.len();
            }
        }
        let after = process_memory_kib(pid, peak);
        assert!(
            after < before + GROWTH_KIB,
            "a {what} of {sent} bytes took the mirror from {before} KiB to {after} KiB ({peak})"
        );
        assert!(
            sent < ENDLESS,
            "the mirror read a {what} of {ENDLESS} bytes without closing the connection"
        );
    }
    assert_eq!(http_get(&addr, "/health/live").0, 200);
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// DNS rebinding: a web page whose own host name is made to resolve to this machine must not
/// read /metrics or /health/*. A Host that is no IP address, not localhost and not a name in
/// --metrics.allowed.hosts gets 421; IP addresses pass (Prometheus and the kubelet ask by
/// pod IP), and so does localhost, whatever the port.
#[test]
fn a_host_name_that_is_not_ours_is_refused_with_421() {
    let clusters = MockPair::new(TOPIC, 1);
    let addr = free_local_addr();
    let port = addr.rsplit_once(':').unwrap().1;
    let mut mirror = clusters.mirror().metrics_addr(&addr).start();
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    for host in [
        "rebound.example".to_owned(),
        format!("rebound.example:{port}"),
        format!("127.0.0.1.rebound.example:{port}"),
        format!("localhost.rebound.example:{port}"),
    ] {
        for path in ["/metrics", "/health/live", "/health/ready"] {
            let (status, body) = get_for_host(&addr, &host, path);
            assert_eq!(status, 421, "Host {host}, {path}: {body}");
            assert!(!body.contains("mirror_"), "Host {host}, {path}: {body}");
            assert!(
                body.contains("--metrics.allowed.hosts"),
                "says what to do: {body}"
            );
        }
    }
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        "LocalHost".to_owned(),
        format!("[::1]:{port}"),
        // A pod's address as Prometheus writes it (a documentation address: nothing is sent).
        "192.0.2.7:9464".to_owned(),
    ] {
        let (status, body) = get_for_host(&addr, &host, "/metrics");
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(
            body.contains("mirror_uptime_seconds"),
            "Host {host}: {body}"
        );
    }
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// A Kubernetes service name (or any other) listed in --metrics.allowed.hosts is served,
/// whatever its case and port; one not listed is still refused.
#[test]
fn names_in_metrics_allowed_hosts_are_served() {
    let clusters = MockPair::new(TOPIC, 1);
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .args(&[
            "--metrics.addr",
            &addr,
            "--metrics.allowed.hosts",
            "mirror-maker.monitoring.svc,Mirror.Example",
        ])
        .start();
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    for host in [
        "mirror-maker.monitoring.svc:9464",
        "mirror-maker.monitoring.svc",
        "mirror.example",
    ] {
        let (status, body) = get_for_host(&addr, host, "/metrics");
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    let (status, body) = get_for_host(&addr, "other.monitoring.svc:9464", "/health/live");
    assert_eq!(status, 421, "{body}");
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// Ready (HTTP and systemd's READY=1) means running with both clusters
/// reachable; a whitelist that matches nothing yet leaves the mirror waiting, ready, with no
/// assignment, which /health/ready and a metric say apart.
#[test]
fn ready_does_not_wait_for_an_assignment() {
    use std::os::unix::net::UnixDatagram;
    let clusters = MockPair::new(TOPIC, 2);
    let dir = tempdir();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .whitelist("nothing-matches-this.*")
        .metrics_addr(&addr)
        .env(&[("NOTIFY_SOCKET", socket_path.to_str().unwrap())])
        .start();
    let mut heard = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 512];
    while !heard.iter().any(|m: &String| m.contains("READY=1"))
        && std::time::Instant::now() < deadline
    {
        if let Ok(n) = socket.recv(&mut buf) {
            heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    assert!(
        heard.iter().any(|m| m.contains("READY=1")),
        "no READY=1: {heard:?}\n{}",
        mirror.log()
    );
    let (status, body) = http_get(&addr, "/health/ready");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("streams with an assignment: 0 of 1"),
        "{body}"
    );
    let m = scrape(&addr);
    assert_eq!(metric(&m, "mirror_streams_assigned", ""), Some(0.0), "{m}");
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// A client's first statistics can come before it has tried any broker (a producer with
/// nothing to send connects when it needs to); that is not a cluster out of reach. Ready once
/// at start, the mirror stays ready while both clusters are up.
#[test]
fn ready_at_start_stays_ready_before_the_clients_connect() {
    let clusters = MockPair::new(TOPIC, 2);
    let (mut mirror, addr) = ready_mirror(&clusters);
    // Several statistics intervals of both clients, the assignment among them.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let (status, why) = http_get(&addr, "/health/ready");
        assert_eq!(status, 200, "{why}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

/// Ready means both clusters reachable: the source going away is not ready too.
#[test]
fn not_ready_while_the_source_is_down() {
    let clusters = MockPair::new(TOPIC, 2);
    let (mut mirror, addr) = ready_mirror(&clusters);
    clusters.source.broker_down(1).unwrap();
    wait_until(
        Duration::from_secs(30),
        "not ready while the source is down",
        || http_get(&addr, "/health/ready").0 == 503,
    );
    let (_, why) = http_get(&addr, "/health/ready");
    assert!(why.contains("reach the source cluster"), "{why}");
    clusters.source.broker_up(1).unwrap();
    wait_until(Duration::from_secs(30), "ready again", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
}

#[test]
fn failed_commits_are_counted_logged_and_make_the_mirror_unready() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..500);
    // The source refuses every offset commit for a while.
    clusters.source.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 200],
    );
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(200)
        .metrics_addr(&addr)
        .start();
    let failures = |m: &str| {
        metric(
            m,
            "mirror_commit_failures_total",
            "code=\"GroupAuthorizationFailed\"",
        )
        .unwrap_or(0.0)
    };
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    mirror.wait_for("three failed commits counted", |_| {
        failures(&scrape(&addr)) >= 3.0
    });
    let m = scrape(&addr);
    assert_eq!(
        metric(&m, "mirror_commits_total", ""),
        Some(0.0),
        "a refused commit is not a commit:\n{m}"
    );
    let (status, why) = http_get(&addr, "/health/ready");
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("offset commits failed"), "{why}");
    let log = mirror.log();
    assert!(
        log.contains("offset commit of") && log.contains("uthoriz"),
        "log:\n{log}"
    );
    mirror.signal("KILL");
}

/// librdkafka warns at every start of every stream that `enable.gapless.guarantee` is
/// experimental, a line nobody can act on: the mirror says once, in its own words, what it
/// relies on that setting for, and keeps librdkafka's line at debug.
#[test]
fn the_gapless_setting_is_explained_once_not_warned_per_stream() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..100);
    let mut mirror = clusters
        .mirror()
        .args(&["--offset.commit.interval.ms", "300", "--num.streams", "2"])
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 100);
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("experimental"))
        .collect();
    assert!(
        warned.is_empty(),
        "librdkafka's warning still shown: {warned:#?}"
    );
    assert_eq!(
        log.matches("enable.gapless.guarantee=true").count(),
        1,
        "the mirror's own line, once: {log}"
    );
}

/// With the source idle and everything copied, the replication delay is 0, although the
/// records carry timestamps from 2023 (the latency histogram, from record timestamps, says
/// years).
#[test]
fn an_idle_source_all_copied_has_no_replication_delay_whatever_the_timestamps() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..2000);
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 2000);
    wait_until(Duration::from_secs(20), "the delay to reach 0", || {
        max_delay(&addr) == 0.0
    });
    // Idle for a while: still 0 (2 s is four statistics intervals).
    let idle_since = std::time::Instant::now();
    while idle_since.elapsed() < Duration::from_secs(2) {
        assert_eq!(max_delay(&addr), 0.0, "{}", scrape(&addr));
        std::thread::sleep(Duration::from_millis(200)); // Not a condition: sampling a gauge.
    }
    let m = scrape(&addr);
    assert_eq!(
        metric(
            &m,
            "mirror_replication_delay_seconds",
            &format!("topic=\"{TOPIC}\"")
        ),
        Some(0.0),
        "{m}"
    );
    assert!(
        metric(&m, "mirror_replication_latency_seconds_sum", "").unwrap() > 3600.0 * 2000.0,
        "the record timestamps are old: {m}"
    );
    assert_eq!(mirror.stop().code(), Some(0));
}

/// While the target is cut off and the source keeps receiving records, the replication
/// delay grows with wall time; once the target is back it falls to 0 again.
#[test]
fn the_replication_delay_grows_with_wall_time_while_the_target_is_cut_off() {
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..1000);
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(&addr)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 1000);
    clusters.target.broker_down(1).unwrap();
    clusters.write(1000..2000);
    wait_until(Duration::from_secs(20), "a delay of 2 s", || {
        max_delay(&addr) >= 2.0
    });
    let first = max_delay(&addr);
    let at = std::time::Instant::now();
    wait_until(Duration::from_secs(20), "the delay to grow by 3 s", || {
        max_delay(&addr) >= first + 3.0
    });
    // It grows as the clock does, not faster: at most one statistics interval (0.5 s) more.
    let grown = max_delay(&addr) - first;
    assert!(
        grown <= at.elapsed().as_secs_f64() + 0.5,
        "grew by {grown} s in {:?}",
        at.elapsed()
    );
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 2000);
    wait_until(Duration::from_secs(20), "the delay back to 0", || {
        max_delay(&addr) == 0.0
    });
    assert_eq!(mirror.stop().code(), Some(0));
    assert!(clusters.compare().is_exact());
}

/// `--max.replication.delay.ms`: a target that answers, but slowly, puts the mirror behind by
/// more than the limit: not ready, saying why, and logged once; under the limit again, ready.
#[test]
fn a_replication_delay_above_the_limit_is_not_ready() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..200);
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .consumer(STATISTICS)
        .producer(STATISTICS)
        .commit_ms(300)
        .metrics_addr(&addr)
        .flag("--max.replication.delay.ms", "1500")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 200);
    wait_until(Duration::from_secs(20), "ready", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_secs(4))
        .unwrap();
    clusters.write(200..300);
    wait_until(Duration::from_secs(30), "not ready for the delay", || {
        let (status, body) = http_get(&addr, "/health/ready");
        status == 503 && body.contains("--max.replication.delay.ms")
    });
    clusters
        .target
        .broker_round_trip_time(1, Duration::ZERO)
        .unwrap();
    wait_until(Duration::from_secs(30), "ready again", || {
        http_get(&addr, "/health/ready").0 == 200
    });
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    assert_eq!(
        log.matches("is above --max.replication.delay.ms").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("back under --max.replication.delay.ms").count(),
        1,
        "{log}"
    );
}

/// `--throttle.bytes.per.second`: the copy takes at least as long as the limit allows (the
/// bytes beyond the one-second burst at the rate), the throttled stream stays in its group
/// (one assignment, no rebalance), the time throttled is served, and nothing is lost.
#[test]
fn a_throttled_mirror_keeps_to_its_byte_rate_and_stays_in_its_group() {
    const RATE: u64 = 100_000;
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..8000);
    let addr = free_local_addr();
    let started = std::time::Instant::now();
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .metrics_addr(&addr)
        .flag("--throttle.bytes.per.second", &RATE.to_string())
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 8000);
    let took = started.elapsed().as_secs_f64();
    let m = scrape(&addr);
    let bytes = sum_over_partitions(&m, "mirror_bytes_consumed_total");
    let least = assert_kept_to_byte_rate(&m, bytes, RATE, took);
    assert!(least > 5.0, "too few bytes to see the limit: {bytes}");
    // The time the partitions were held paused, from each pause to its resume.
    assert!(
        metric(&m, "mirror_throttled_seconds_total", "").unwrap() > 0.0,
        "{m}"
    );
    assert_eq!(metric(&m, "mirror_rebalances_total", ""), Some(1.0), "{m}");
    assert_eq!(mirror.stop().code(), Some(0));
    assert!(clusters.compare().is_exact());
}

/// `--throttle.records.per.second`: the copy takes at least as long as the record limit
/// allows (the records beyond the one-second burst at the rate), whatever their size; the
/// limit is served, and nothing is lost.
#[test]
fn a_record_throttled_mirror_keeps_to_its_record_rate() {
    const RATE: u64 = 1500;
    const RECORDS: u64 = 12_000;
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    clusters.write(0..RECORDS);
    let addr = free_local_addr();
    let started = std::time::Instant::now();
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .metrics_addr(&addr)
        .flag("--throttle.records.per.second", &RATE.to_string())
        .start();
    wait_committed(
        &mut mirror,
        &clusters.src(),
        TOPIC,
        PARTITIONS,
        RECORDS as i64,
    );
    let took = started.elapsed().as_secs_f64();
    // A lower bound only, as for bytes.
    let least = (RECORDS - RATE) as f64 / RATE as f64;
    assert!(
        took >= least * 0.95,
        "{RECORDS} records in {took:.1} s at {RATE} records/s"
    );
    let m = scrape(&addr);
    assert_eq!(
        metric(&m, "mirror_throttle_records_per_second", ""),
        Some(RATE as f64),
        "{m}"
    );
    assert_eq!(
        metric(&m, "mirror_throttle_bytes_per_second", ""),
        None,
        "{m}"
    );
    // Unthrottled the copy takes well under a second here: the stream was held paused for
    // most of the time the limit made it take, and that time is what is served.
    let held = metric(&m, "mirror_throttled_seconds_total", "").unwrap();
    assert!(held >= least * 0.5, "held {held:.2} s of {took:.1} s: {m}");
    assert_eq!(mirror.stop().code(), Some(0));
    assert!(clusters.compare().is_exact());
}
