//! Running it in production: metrics and health over HTTP, progress and JSON log lines, and
//! secrets kept out of every output.

use std::time::Duration;

use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 4;

/// Statistics twice a second, so that lag and target reachability move quickly.
const STATISTICS: &[(&str, &str)] = &[("statistics.interval.ms", "500")];

fn scrape(addr: &str) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
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
    let mut mirror = clusters.start(
        STATISTICS,
        STATISTICS,
        &[
            "--offset.commit.interval.ms",
            "300",
            "--metrics.addr",
            &addr,
            "--progress.interval.ms",
            "500",
        ],
    );
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
    let mut mirror = clusters.start(&[], &[], &["--metrics.addr", &addr]);
    let status = mirror.wait(Duration::from_secs(30));
    let log = mirror.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("--metrics.addr") && log.contains(&addr),
        "{log}"
    );
    let mut mirror = clusters.start(&[], &[], &["--metrics.addr", "not-an-address"]);
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
    let mut mirror = clusters.start(
        &[],
        &[],
        &["--offset.commit.interval.ms", "300", "--log.format", "json"],
    );
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
    let mut mirror = clusters.start_logged(
        &secrets,
        &secrets,
        &[
            "--offset.commit.interval.ms",
            "300",
            "--metrics.addr",
            &addr,
        ],
        "debug",
    );
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
    let flags = |from: &'static str, to: &'static str| {
        vec![
            "--offset.commit.interval.ms",
            "300",
            "--loop.prevention",
            "--source.cluster.name",
            from,
            "--target.cluster.name",
            to,
        ]
    };
    let mut east_to_west = Mirror::start(&ec, &wp, TOPIC, &flags("east", "west"));
    let mut west_to_east = Mirror::start(&wc, &ep, TOPIC, &flags("west", "east"));
    // Each cluster ends with its own records and a copy of the other's: 500, and no more
    // however long the mirrors keep running.
    wait_committed(&mut east_to_west, &east, TOPIC, 2, 500);
    wait_committed(&mut west_to_east, &west, TOPIC, 2, 500);
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
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let mut mirror = Mirror::start_with_env(
        &c,
        &p,
        TOPIC,
        &["--offset.commit.interval.ms", "300"],
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "1000000"),
        ],
    );
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
    // Issue 12 #9: which limit bounds a record's size.
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

/// Issue 16 #3: the replication latency runs from the source record's timestamp to the
/// target's acknowledgement (not from the broker's append time in the delivery report).
#[test]
fn replication_latency_runs_from_the_source_timestamp_to_the_acknowledgement() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let clusters = MockPair::new(TOPIC, PARTITIONS);
    let addr = free_local_addr();
    let mut mirror = clusters.start(
        &[],
        &[],
        &[
            "--offset.commit.interval.ms",
            "300",
            "--metrics.addr",
            &addr,
        ],
    );
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

/// Issue 16 #5: GNU `timeout` sends SIGTERM to the mirror and then to its process group,
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

/// Issue 16 #5: two signals 50 ms apart (a supervisor signalling the process and its group,
/// as `timeout`, `docker stop` or systemd's KillMode=control-group may) are one stop request.
#[test]
fn two_sigterms_50_ms_apart_stop_cleanly() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..100);
    let mut mirror = clusters.start(&[], &[], &["--offset.commit.interval.ms", "300"]);
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 100);
    mirror.signal("TERM");
    std::thread::sleep(Duration::from_millis(50));
    if mirror.is_running() {
        mirror.signal("TERM");
    }
    let status = mirror.wait(Duration::from_secs(30));
    let log = mirror.log();
    assert!(!log.contains("exiting now"), "{log}");
    assert_eq!(status.code(), Some(0), "{log}");
}

/// Issue 16 #5: a second signal well after the first (a person pressing Ctrl-C again while
/// the flush waits for an unreachable target) exits at once with 130.
#[test]
fn a_second_signal_seconds_later_exits_now_with_130() {
    let clusters = MockPair::new(TOPIC, 2);
    let mut mirror = clusters.start(&[], &[], &["--shutdown.timeout.ms", "20000"]);
    wait_until(Duration::from_secs(30), "an assignment", || {
        mirror.log().contains("assigned 2 partitions")
    });
    clusters.target.broker_down(1).unwrap();
    clusters.write(0..100);
    // Let the records reach the stream and wait for the target.
    std::thread::sleep(Duration::from_millis(500));
    mirror.signal("TERM");
    std::thread::sleep(Duration::from_secs(2));
    assert!(mirror.is_running(), "{}", mirror.log());
    mirror.signal("TERM");
    let status = mirror.wait(Duration::from_secs(10));
    let log = mirror.log();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("SIGTERM again: exiting now"), "{log}");
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

/// Issue 16 #9: log lines written to a file or a pipe carry no ANSI colour codes.
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

/// Issue 16 #9: on a terminal, colour, unless NO_COLOR is set (https://no-color.org).
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

/// Issue 16 #10: with `--log.format json`, the final error line is a JSON object too.
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

/// Issue 16 #8: before any statistics of an assigned partition the lag is unknown (not 0,
/// with a backlog waiting); rates and totals are kept apart, looped records included.
#[test]
fn progress_lines_say_lag_unknown_until_known_and_keep_rates_and_totals_apart() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..1000);
    let mut mirror = clusters.start(
        &[],
        &[],
        &[
            "--offset.commit.interval.ms",
            "300",
            "--progress.interval.ms",
            "200",
        ],
    );
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 1000);
    // A few more lines once the lag is known.
    std::thread::sleep(Duration::from_millis(1500));
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

/// Issue 16 #12: one of a thing is not plural, in the mirror's log and in `check`.
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

/// Issue 16 #12: HEAD is answered like GET, without a body (monitoring probes use it); other
/// methods get 405 with the allowed ones.
#[test]
fn head_is_answered_like_get_without_a_body() {
    let clusters = MockPair::new(TOPIC, 2);
    let addr = free_local_addr();
    let mut mirror = clusters.start(&[], &[], &["--metrics.addr", &addr]);
    wait_until(Duration::from_secs(10), "live", || {
        http_get(&addr, "/health/live").0 == 200
    });
    for path in ["/metrics", "/health/live"] {
        let response = http_raw(&addr, "HEAD", path);
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{response}");
        assert!(head.contains("Content-Length: "), "{response}");
        assert_eq!(body, "", "{response}");
    }
    let response = http_raw(&addr, "POST", "/metrics");
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
    assert!(response.contains("Allow: GET, HEAD"), "{response}");
    assert_eq!(mirror.stop().code(), Some(0));
}

/// Issue 16 #6: ready (HTTP and systemd's READY=1) means running with both clusters
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
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let addr = free_local_addr();
    let mut mirror = Mirror::start_with_env(
        &c,
        &p,
        "nothing-matches-this.*",
        &["--metrics.addr", &addr],
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())],
    );
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

/// Issue 16 #6: ready means both clusters reachable: the source going away is not ready too.
#[test]
fn not_ready_while_the_source_is_down() {
    let clusters = MockPair::new(TOPIC, 2);
    let addr = free_local_addr();
    let mut mirror = clusters.start(STATISTICS, STATISTICS, &["--metrics.addr", &addr]);
    wait_until(Duration::from_secs(30), "ready", || {
        http_get(&addr, "/health/ready").0 == 200
    });
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
    let mirror = clusters.start(
        STATISTICS,
        STATISTICS,
        &[
            "--offset.commit.interval.ms",
            "200",
            "--metrics.addr",
            &addr,
        ],
    );
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while failures(&scrape(&addr)) < 3.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "three failed commits not counted; metrics:\n{}\nlog:\n{}",
            scrape(&addr),
            mirror.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
