//! What a user's Prometheus and Grafana see of the mirror (deploy/prometheus, deploy/grafana):
//! the alert rules checked and unit-tested by promtool, Debian's Prometheus scraping a running
//! mirror with the rules loaded (the record engine on librdkafka's mock clusters; its batch
//! engine twin on Apache Kafka, since that engine does not speak to the mock), and every
//! metric the dashboard and the rules name read from the `/metrics` of a running mirror.
//!
//! promtool and prometheus come with Debian's package `prometheus`, which `./scripts/test`
//! installs when absent; `PROMTOOL` and `PROMETHEUS` name other binaries.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mirror_test_harness::*;
use serde_json::Value;
use yaml_rust2::YamlLoader;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 4;
const RECORDS: u64 = 1000;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Debian's `prometheus` package's binary `name`, or the one the variable `var` names.
fn tool(name: &str, var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin").join(name));
    assert!(
        path.is_file(),
        "{} not found (set {var} to another one): it comes with Debian's package prometheus; \
         run ./scripts/test, which installs it when absent",
        path.display()
    );
    path
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtools_check_and_each_alert_fires_and_stays_quiet_as_tested() {
    let promtool = tool("promtool", "PROMTOOL");
    let dir = repo("deploy/prometheus");
    let checked = run(Command::new(&promtool)
        .args(["check", "rules", "alerts.yml"])
        .current_dir(&dir));
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = run(Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(&dir));
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert is exercised by the unit tests, firing at least once.
    let rules = YamlLoader::load_from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    let tests = YamlLoader::load_from_str(&read("deploy/prometheus/alerts_test.yml")).unwrap();
    let fired: BTreeSet<&str> = tests[0]["tests"]
        .as_vec()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_vec().unwrap())
        .filter(|a| !a["exp_alerts"].as_vec().unwrap().is_empty())
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    for rule in alert_rules(&rules[0]) {
        let name = rule["alert"].as_str().unwrap();
        assert!(fired.contains(name), "alerts_test.yml never fires {name}");
    }
}

fn alert_rules(file: &yaml_rust2::Yaml) -> Vec<&yaml_rust2::Yaml> {
    file["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules"))
        .collect()
}

/// A mirror of [`RECORDS`] records of [`PARTITIONS`] partitions, serving metrics, once it
/// has committed them all: the record engine on mock clusters, the batch engine (which does
/// not speak to librdkafka's mock) on a lane of this process's shared Kafka pair.
struct RunningMirror {
    _clusters: Option<MockPair>,
    _mirror: Mirror,
    metrics: String,
    /// The source topic.
    topic: &'static str,
}

fn running_mirror(mode: CopyMode) -> RunningMirror {
    let mock = (mode == CopyMode::Records).then(|| MockPair::new(TOPIC, PARTITIONS));
    let on_kafka;
    let lane: &Endpoints = match &mock {
        Some(pair) => pair,
        None => {
            on_kafka = kafka::SharedPair::get(kafka::KAFKA_4).lane(mode.named(TOPIC), PARTITIONS);
            &on_kafka
        }
    };
    lane.write(0..RECORDS);
    let metrics = free_local_addr();
    let mut mirror = lane
        .mirror()
        .copy_mode(mode)
        .commit_ms(200)
        .metrics_addr(&metrics)
        .start();
    wait_until(Duration::from_secs(30), "the mirror ready", || {
        http_get(&metrics, "/health/ready").0 == 200
    });
    lane.wait_caught_up(&mut mirror);
    let topic = lane.topic;
    RunningMirror {
        _clusters: mock,
        _mirror: mirror,
        metrics,
        topic,
    }
}

/// Debian's Prometheus on a free loopback port with a data folder of its own, scraping
/// `target` every second as job `mirror-maker` and evaluating deploy/prometheus/alerts.yml;
/// killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let binary = tool("prometheus", "PROMETHEUS");
        let dir = tempdir();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{rules:?}]\n\
                 scrape_configs:\n  - job_name: mirror-maker\n    \
                 static_configs:\n      - targets: [{target:?}]\n",
                rules = repo("deploy/prometheus/alerts.yml").display().to_string(),
            ),
        )
        .unwrap();
        let addr = free_local_addr();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        wait_until(Duration::from_secs(20), "prometheus ready", || {
            http_get(&prometheus.addr, "/-/ready").0 == 200
        });
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/PATH?QUERY`'s `data`, asserting `"status": "success"`.
    fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        let url = format!("/api/v1/{path}?{}", query.join("&"));
        let (status, body) = http_get(&self.addr, &url);
        let json: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {status} {e}: {body}"));
        assert_eq!(json["status"], "success", "{url}: {body}");
        json["data"].clone()
    }

    /// An instant query's samples as (labels, value).
    fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let data = self.api("query", &[("query", promql)]);
        data["result"]
            .as_array()
            .map(|samples| {
                samples
                    .iter()
                    .map(|s| {
                        let value = s["value"][1].as_str().unwrap().parse().unwrap();
                        (s["metric"].clone(), value)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding of a URL query's key or value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The dashboard's queries, each with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/mirror-maker.json")).expect("dashboard JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = vec![];
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().expect("a panel title").to_owned();
        let targets = panel["targets"].as_array().expect("a panel's targets");
        assert!(!targets.is_empty(), "panel {title} has no target");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(
                !expr.trim().is_empty(),
                "panel {title}: a target without expr"
            );
            queries.push((title.clone(), expr.to_owned()));
        }
    }
    assert!(queries.len() >= 10, "{queries:?}");
    queries
}

/// A dashboard query as Grafana sends it with every job and instance selected.
fn as_grafana_sends_it(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", ".*")
        .replace("$instance", ".*")
}

/// The metric names (identifiers starting with `mirror_`) a PromQL expression names, string
/// literals left out.
fn mirror_metrics_named(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_string = false;
    let mut word = String::new();
    for c in expr.chars().chain([' ']) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
            continue;
        }
        if word.starts_with("mirror_") {
            names.insert(word.clone());
        }
        word.clear();
    }
    names
}

/// The series names an exposition serves: each sample's, and for each family declared by a
/// `# TYPE` line the names Prometheus stores its samples under (a family with no sample yet,
/// such as `mirror_commit_failures` before a failure, is served all the same).
fn served_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (family, kind) = declared.split_once(' ').expect("# TYPE name kind");
            match kind.trim() {
                "counter" => {
                    // OpenMetrics names the family without `_total`, text format 0.0.4 with.
                    let base = family.strip_suffix("_total").unwrap_or(family);
                    names.insert(format!("{base}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{family}{suffix}"));
                    }
                }
                "info" => {
                    names.insert(format!("{family}_info"));
                }
                _ => {
                    names.insert(family.to_owned());
                }
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

#[test]
fn a_prometheus_scraping_a_running_mirror_stores_its_records_series_and_evaluates_the_rules() {
    scraped(CopyMode::Records);
}

#[test]
fn a_prometheus_scraping_a_running_mirror_stores_its_records_series_and_evaluates_the_rules_with_batches(
) {
    scraped(CopyMode::Batches);
}

/// Prometheus scraping a mirror of `mode` that has copied [`RECORDS`] records stores its
/// records series, per source partition where the mirror keeps them so, every dashboard
/// query is one it accepts, and the alert rules evaluate, none firing.
fn scraped(mode: CopyMode) {
    let started = Instant::now();
    let mirror = running_mirror(mode);
    let prometheus = Prometheus::start(&mirror.metrics);
    let consumed = "sum(mirror_records_consumed_total{job=\"mirror-maker\"})";
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.query(consumed).first().map(|s| s.1) != Some(RECORDS as f64) {
        assert!(
            Instant::now() < deadline,
            "prometheus never stored {RECORDS} consumed records: {:?}\nlog:\n{}",
            prometheus.query(consumed),
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let up = prometheus.query("up{job=\"mirror-maker\"}");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].1, 1.0);

    // The records series, per source partition where the mirror keeps them so.
    let series = prometheus.api(
        "series",
        &[("match[]", "{__name__=~\"mirror_records_.*\"}")],
    );
    let series = series.as_array().expect("a list of series");
    let names: BTreeSet<&str> = series
        .iter()
        .map(|s| s["__name__"].as_str().unwrap())
        .collect();
    for name in [
        "mirror_records_consumed_total",
        "mirror_records_acknowledged_total",
        "mirror_records_in_flight",
        "mirror_records_produced_total",
        "mirror_records_dropped_total",
    ] {
        assert!(names.contains(name), "{name} not stored: {names:?}");
    }
    for name in [
        "mirror_records_consumed_total",
        "mirror_records_acknowledged_total",
    ] {
        let partitions: BTreeSet<&str> = series
            .iter()
            .filter(|s| s["__name__"] == name && s["topic"] == mirror.topic)
            .map(|s| s["partition"].as_str().unwrap())
            .collect();
        assert_eq!(partitions, BTreeSet::from(["0", "1", "2", "3"]), "{name}");
    }
    let acknowledged = prometheus.query("sum(mirror_records_acknowledged_total)");
    assert_eq!(acknowledged[0].1, RECORDS as f64);

    // Every dashboard query is PromQL this Prometheus accepts, and the throughput and stream
    // panels show data.
    for (panel, expr) in dashboard_queries() {
        let samples = prometheus.query(&as_grafana_sends_it(&expr));
        if panel.starts_with("Streams assigned") || panel.starts_with("Uptime") {
            assert!(!samples.is_empty(), "panel {panel}: {expr} shows nothing");
        }
    }

    // The alert rules loaded and evaluate without error; none fires on a healthy mirror.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let groups = prometheus.api("rules", &[("type", "alert")]);
        let rules: Vec<Value> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        assert_eq!(rules.len(), 7, "{groups}");
        if rules.iter().all(|r| r["health"] == "ok") {
            for rule in &rules {
                assert_eq!(rule["state"], "inactive", "{rule}");
            }
            break;
        }
        let failing: Vec<&Value> = rules.iter().filter(|r| r["health"] == "err").collect();
        assert!(failing.is_empty(), "rules failing: {failing:?}");
        assert!(Instant::now() < deadline, "rules not evaluated: {groups}");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("scrape test ({}) took {:?}", mode.flag(), started.elapsed());
}

/// A mirror that has met every event its labelled families count, since a family with labels
/// is served only once it has a sample: records deleted by the source's retention before it
/// read them (its group's committed offset 0 below the low watermark), one refused offset
/// commit, and records the target refused for good (dropped, with a send error).
fn mirror_that_met_every_event() -> RunningMirror {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let clusters = MockPair::new(TOPIC, 1);
    // The mock keeps about 5 MB per partition: 8 MB deletes the oldest records.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let value = vec![b'r'; 10_000];
    for i in 0..800 {
        let key = format!("k{i}");
        while producer
            .send(
                BaseRecord::<str, [u8]>::to(TOPIC)
                    .partition(0)
                    .key(&key)
                    .payload(&value),
            )
            .is_err()
        {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .set("group.id", GROUP)
        .create()
        .unwrap();
    let (low, _) = consumer
        .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
        .unwrap();
    assert!(low > 0, "the mock kept every record");
    let mut start = TopicPartitionList::new();
    start
        .add_partition_offset(TOPIC, 0, Offset::Offset(0))
        .unwrap();
    consumer.commit(&start, CommitMode::Sync).unwrap();
    drop(consumer);
    clusters.source.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
    );
    clusters.target.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let metrics = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .producer(&[("batch.num.messages", "10")])
        .flag("--abort.on.send.failure", "false")
        .commit_ms(200)
        .metrics_addr(&metrics)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 800);
    wait_until(
        Duration::from_secs(20),
        "every labelled family served",
        || {
            let (_, m) = http_get(&metrics, "/metrics");
            [
                "mirror_commit_failures_total{",
                "mirror_send_errors_total{",
                "mirror_records_skipped_total{",
            ]
            .iter()
            .all(|family| m.contains(family))
        },
    );
    RunningMirror {
        _clusters: Some(clusters),
        _mirror: mirror,
        metrics,
        topic: TOPIC,
    }
}

#[test]
fn every_metric_the_dashboard_and_the_alert_rules_name_is_one_a_running_mirror_serves() {
    let mirror = mirror_that_met_every_event();
    let (status, exposition) = http_get(&mirror.metrics, "/metrics");
    assert_eq!(status, 200, "{exposition}");
    let served = served_names(&exposition);
    assert!(
        served.contains("mirror_replication_latency_seconds_bucket")
            && served.contains("mirror_records_consumed_total")
            && !served.contains("mirror_records_consumed"),
        "the exposition is not read as it should be: {served:?}\n{exposition}"
    );

    let mut named = BTreeSet::new();
    for (panel, expr) in dashboard_queries() {
        for name in mirror_metrics_named(&expr) {
            assert!(
                served.contains(&name),
                "dashboard panel {panel:?} queries {name}, which the mirror does not serve \
                 (served: {served:?})"
            );
            named.insert(name);
        }
    }
    // What the dashboard is for: each of these is on it.
    for family in [
        "mirror_records_consumed_total",
        "mirror_records_produced_total",
        "mirror_consumer_lag",
        "mirror_replication_latency_seconds_bucket",
        "mirror_commits_total",
        "mirror_commit_failures_total",
        "mirror_records_in_flight",
        "mirror_records_dropped_total",
        "mirror_records_skipped_total",
        "mirror_streams_assigned",
    ] {
        assert!(named.contains(family), "the dashboard shows no {family}");
    }

    let rules = YamlLoader::load_from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    for rule in alert_rules(&rules[0]) {
        let expr = rule["expr"].as_str().expect("an expr");
        for name in mirror_metrics_named(expr) {
            assert!(
                served.contains(&name),
                "alert {} uses {name}, which the mirror does not serve",
                rule["alert"].as_str().unwrap()
            );
        }
    }
}

#[test]
fn the_metric_name_reader_tells_families_apart_and_skips_strings() {
    let exposition = "# TYPE mirror_commits counter\nmirror_commits_total 3\n\
        # TYPE mirror_commit_seconds histogram\n# TYPE mirror_lag gauge\n\
        # TYPE mirror_build info\nmirror_build_info{version=\"1\"} 1\n# EOF\n";
    let served = served_names(exposition);
    assert_eq!(
        served,
        [
            "mirror_build_info",
            "mirror_commit_seconds_bucket",
            "mirror_commit_seconds_count",
            "mirror_commit_seconds_sum",
            "mirror_commits_total",
            "mirror_lag",
        ]
        .map(str::to_owned)
        .into(),
    );
    assert_eq!(
        mirror_metrics_named(
            "sum by (le) (rate(mirror_commit_seconds_bucket{job=\"mirror_x\"}[1m])) / mirror_lag"
        ),
        ["mirror_commit_seconds_bucket", "mirror_lag"]
            .map(str::to_owned)
            .into()
    );
}
