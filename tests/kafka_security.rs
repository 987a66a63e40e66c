//! Security trials on Apache Kafka: the mirror between clusters
//! that authenticate it (SASL_SSL with SCRAM-SHA-512 on the source, mutual TLS on the target),
//! with both copy engines, and one that authorizes it with ACLs. Certificates are made by the
//! test with `openssl` (`TestPki`), SCRAM users at format time, ACLs with Kafka's
//! `AclCommand`. Each cluster keeps a PLAINTEXT listener for the harness's own clients (see
//! `KafkaSecurity`); the authenticating pair is shared by its trials ([`Secured`]), each on its
//! own topic and group.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

/// The line the batch engine logs at start.
const BATCH_ENGINE: &str = "copying record batches as they are";
const PARTITIONS: i32 = 3;
const PASSWORD: &str = "s3cret-Pa55word-0x5eed";
const WRONG_PASSWORD: &str = "wr0ng-Pa55word-0xbad";

/// Source and target of one trial: both started side by side.
fn clusters(
    source: &KafkaSecurity<'_>,
    target: &KafkaSecurity<'_>,
) -> (KafkaCluster, KafkaCluster) {
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            KafkaCluster::start_secured(
                KAFKA_4,
                1,
                &[("auto.create.topics.enable", "false")],
                target,
            )
        });
        let source = KafkaCluster::start_secured(KAFKA_4, 1, &[], source);
        (source, t.join().expect("starting the target cluster"))
    })
}

/// The authenticating pair: a SASL_SSL/SCRAM-SHA-512 source (with a SASL_PLAINTEXT listener
/// for PLAIN and SCRAM-SHA-256 beside it) and a mutual-TLS target, started once per test
/// process.
struct Secured {
    pki: TestPki,
    source: KafkaCluster,
    target: KafkaCluster,
}

fn secured() -> &'static Secured {
    static SECURED: OnceLock<Secured> = OnceLock::new();
    SECURED.get_or_init(|| {
        let pki = TestPki::generate();
        let users = [("mirror", PASSWORD)];
        let (source, target) = clusters(
            &KafkaSecurity {
                listener: SecureListener::SaslSslScram { users: &users },
                pki: &pki,
                authorizer: false,
            },
            &KafkaSecurity {
                listener: SecureListener::MutualTls,
                pki: &pki,
                authorizer: false,
            },
        );
        Secured {
            pki,
            source,
            target,
        }
    })
}

/// The consumer's settings for the SASL_SSL source, in `group`.
fn sasl_consumer<'a>(group: &'a str, ca: &'a str, password: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut c = vec![
        ("group.id", group),
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "mirror"),
        ("sasl.password", password),
        ("ssl.ca.location", ca),
    ];
    c.extend_from_slice(FAST_GROUP);
    c
}

/// The producer's settings for the mutual-TLS target.
fn tls_producer(pki: &TestPki) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SSL".to_owned()),
        ("ssl.ca.location", pki.ca()),
        ("ssl.certificate.location", pki.client_cert()),
        ("ssl.key.location", pki.client_key()),
    ]
}

fn pairs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `mirror-maker check` of `topic` with these configs: its output (stdout and stderr), exit
/// code and how long it took.
fn check(consumer: &Path, producer: &Path, topic: &str, flags: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let out: Output = binary()
        .arg("check")
        .arg("--consumer.config")
        .arg(consumer)
        .arg("--producer.config")
        .arg(producer)
        .args(["--whitelist", topic])
        .args(flags)
        .env("RUST_LOG", "debug")
        .output()
        .expect("running mirror-maker check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text, started.elapsed())
}

/// The secrets no output may show: the passwords, and every base64 line of the client's
/// private key.
fn secrets(pki: &TestPki) -> Vec<String> {
    let key = std::fs::read_to_string(pki.client_key()).expect("the client key");
    let mut s: Vec<String> = key
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_owned)
        .collect();
    assert!(!s.is_empty(), "the key has base64 lines");
    s.push(PASSWORD.to_owned());
    s.push(WRONG_PASSWORD.to_owned());
    s
}

fn assert_no_secrets(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        if let Some(line) = text.lines().find(|l| l.contains(secret.as_str())) {
            panic!("{what} shows secret material ({secret:?}) in: {line}");
        }
    }
}

fn configs(
    dir: &Path,
    source: &KafkaCluster,
    target: &KafkaCluster,
    consumer: &[(&str, &str)],
    producer: &[(&str, &str)],
) -> (PathBuf, PathBuf) {
    (
        write_config(dir, "consumer.toml", &source.secure_bootstrap(), consumer),
        write_config(dir, "producer.toml", &target.secure_bootstrap(), producer),
    )
}

// ---------------------------------------------------------------------------------------------
// Trial 9: authentication and encryption on both sides.

/// The source authenticates the mirror with SASL_SSL/SCRAM-SHA-512, the target with a client
/// certificate (mutual TLS): every record is mirrored, and no password or private key shows
/// in the log (at debug), the metrics or `check`'s output. A wrong password is one clear line
/// and exit 1 within `--startup.timeout.ms`. The record engine (the default).
#[test]
fn sasl_scram_source_and_mutual_tls_target() {
    scram_source_and_mutual_tls_target("orders", &[]);
}

/// As [`sasl_scram_source_and_mutual_tls_target`], with the batch engine: its own Fetch and
/// Produce connections speak SASL_SSL/SCRAM-SHA-512 to the source and mutual TLS to the target.
#[test]
fn sasl_scram_source_and_mutual_tls_target_with_the_batch_engine() {
    scram_source_and_mutual_tls_target("orders-batches", &["--copy.mode", "batches"]);
}

/// The trial of both engines, on `topic` (and the group of that name), `engine` the flags
/// that choose the engine.
fn scram_source_and_mutual_tls_target(topic: &'static str, engine: &[&str]) {
    const RECORDS: u64 = 5_000;
    let started = Instant::now();
    let Secured {
        pki,
        source,
        target,
    } = secured();
    let engine_name = if engine.is_empty() {
        "record engine"
    } else {
        "batch engine"
    };
    let secrets = secrets(pki);
    source.create_topic(topic, PARTITIONS, 1, &[]);
    write_samples(&source.bootstrap(), topic, 0..RECORDS, PARTITIONS, 100).expect("writing");
    let ca = pki.ca();
    let producer = tls_producer(pki);
    let producer = pairs(&producer);
    let dir = tempdir();
    let (c, p) = configs(
        dir.path(),
        source,
        target,
        &sasl_consumer(topic, &ca, PASSWORD),
        &producer,
    );

    // `check` first: both clusters reached, nothing to fix, nothing secret printed.
    let (code, out, _) = check(&c, &p, topic, engine);
    assert_no_secrets("check", &out, &secrets);
    assert_eq!(code, 0, "check:\n{out}");
    assert!(out.contains("OK: ready to mirror"), "check:\n{out}");

    let metrics = free_local_addr();
    let mirror_started = Instant::now();
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(topic)
        .commit_ms(300)
        .args(engine)
        .metrics_addr(&metrics)
        .log("debug")
        .start();
    wait_committed_by(
        topic,
        &mut mirror,
        &source.bootstrap(),
        topic,
        PARTITIONS,
        RECORDS as i64,
    );
    let mirrored_in = mirror_started.elapsed();
    let (status, exposition) = http_get(&metrics, "/metrics");
    assert_eq!(status, 200, "/metrics answered {status}");
    assert_no_secrets("/metrics", &exposition, &secrets);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert_no_secrets("the mirror's log", &log, &secrets);
    assert_eq!(
        log.contains(BATCH_ENGINE),
        !engine.is_empty(),
        "the {engine_name} did the copying; log:\n{log}"
    );
    let comparison = compare_topic(&source.bootstrap(), &target.bootstrap(), topic, PARTITIONS)
        .expect("comparing");
    assert_eq!(
        (comparison.source, comparison.lost, comparison.changed),
        (RECORDS, 0, 0),
        "{comparison:?}"
    );
    assert!(comparison.in_order, "{comparison:?}");

    // A wrong password: one line naming the source cluster and the cause, exit 1, within the
    // start-up timeout.
    let wrong_dir = tempdir();
    let (wc, wp) = configs(
        wrong_dir.path(),
        source,
        target,
        &sasl_consumer(topic, &ca, WRONG_PASSWORD),
        &producer,
    );
    let mut timeout = vec!["--startup.timeout.ms", "10000"];
    timeout.extend_from_slice(engine);
    let refused_started = Instant::now();
    let mut refused = Mirror::with_configs(&wc, &wp)
        .whitelist(topic)
        .args(&timeout)
        .log("debug")
        .start();
    let status = refused.wait(Duration::from_secs(30));
    let refused_in = refused_started.elapsed();
    let log = refused.log();
    assert_no_secrets("the refused mirror's log", &log, &secrets);
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    let last = log.lines().last().unwrap_or_default();
    eprintln!("wrong password, the mirror's last line: {last}");
    assert!(
        last.contains("source cluster") && last.to_lowercase().contains("authentication"),
        "the last line names neither the source cluster nor the authentication failure: \
         {last}\nerrors: {errors:#?}\nlog:\n{log}"
    );
    assert!(
        refused_in < Duration::from_secs(10) + Duration::from_secs(5),
        "exit after {refused_in:?}"
    );
    let (code, out, checked_in) = check(&wc, &wp, topic, &timeout);
    assert_no_secrets("check (wrong password)", &out, &secrets);
    assert_eq!(code, 1, "check:\n{out}");
    let problem = out
        .lines()
        .find(|l| l.starts_with("problem:"))
        .unwrap_or_default();
    assert!(
        problem.contains("source cluster") && problem.to_lowercase().contains("authentication"),
        "check:\n{out}"
    );
    // No client certificate for the mutual-TLS target: the target refuses the handshake.
    let anonymous_dir = tempdir();
    let no_cert = [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca.as_str()),
    ];
    let (ac, ap) = configs(
        anonymous_dir.path(),
        source,
        target,
        &sasl_consumer(topic, &ca, PASSWORD),
        &no_cert,
    );
    let (code, out, no_cert_in) = check(&ac, &ap, topic, &timeout);
    assert_no_secrets("check (no client certificate)", &out, &secrets);
    let no_cert_problem = out
        .lines()
        .find(|l| l.starts_with("problem:"))
        .unwrap_or_default()
        .to_owned();
    eprintln!("no client certificate, check says ({no_cert_in:?}): {no_cert_problem}");
    assert_eq!(code, 1, "check:\n{out}");
    assert!(no_cert_problem.contains("target cluster"), "check:\n{out}");
    eprintln!(
        "TRIAL security kafka 4.4.0 ({engine_name}): SASL_SSL/SCRAM-SHA-512 source, mutual-TLS \
         target: {}; {RECORDS} mirrored in {:.1} s; wrong password: exit 1 after {:.1} s \
         (check: {:.1} s) with: {last}; no client certificate: check exits 1 after {:.1} s \
         with: {no_cert_problem}; no secret in the log (debug), /metrics or check; {:.0} s in \
         all",
        comparison.summary(),
        mirrored_in.as_secs_f64(),
        refused_in.as_secs_f64(),
        checked_in.as_secs_f64(),
        no_cert_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// The batch engine authenticates over SASL_PLAINTEXT with PLAIN and with SCRAM-SHA-256 (the
/// source's second listener; the target is the mutual-TLS one): each mechanism's mirror copies
/// every record, and no password shows in its log.
#[test]
fn the_batch_engine_authenticates_with_sasl_plain_and_scram_sha_256() {
    const RECORDS: u64 = 300;
    let started = Instant::now();
    let Secured {
        pki,
        source,
        target,
    } = secured();
    let secrets = secrets(pki);
    let producer = tls_producer(pki);
    let producer = pairs(&producer);
    let mut measured = Vec::new();
    for (topic, mechanism) in [
        ("plain-batches", "PLAIN"),
        ("scram-256-batches", "SCRAM-SHA-256"),
    ] {
        source.create_topic(topic, PARTITIONS, 1, &[]);
        write_samples(&source.bootstrap(), topic, 0..RECORDS, PARTITIONS, 100).expect("writing");
        let mut consumer = vec![
            ("group.id", topic),
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", mechanism),
            ("sasl.username", "mirror"),
            ("sasl.password", PASSWORD),
        ];
        consumer.extend_from_slice(FAST_GROUP);
        let dir = tempdir();
        let c = write_config(
            dir.path(),
            "consumer.toml",
            &source.sasl_plaintext_bootstrap(),
            &consumer,
        );
        let p = write_config(
            dir.path(),
            "producer.toml",
            &target.secure_bootstrap(),
            &producer,
        );
        let mirror_started = Instant::now();
        let mut mirror = Mirror::with_configs(&c, &p)
            .whitelist(topic)
            .commit_ms(300)
            .flag("--copy.mode", "batches")
            .log("debug")
            .start();
        wait_committed_by(
            topic,
            &mut mirror,
            &source.bootstrap(),
            topic,
            PARTITIONS,
            RECORDS as i64,
        );
        let mirrored_in = mirror_started.elapsed();
        assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
        let log = mirror.log();
        assert_no_secrets("the mirror's log", &log, &secrets);
        assert!(log.contains(BATCH_ENGINE), "{mechanism}: log:\n{log}");
        let comparison = compare_topic(&source.bootstrap(), &target.bootstrap(), topic, PARTITIONS)
            .expect("comparing");
        assert_eq!(
            (comparison.source, comparison.lost, comparison.changed),
            (RECORDS, 0, 0),
            "{mechanism}: {comparison:?}"
        );
        measured.push(format!(
            "{mechanism}: {} in {:.1} s",
            comparison.summary(),
            mirrored_in.as_secs_f64()
        ));
    }
    eprintln!(
        "TRIAL security kafka 4.4.0 (batch engine): SASL_PLAINTEXT source, mutual-TLS target: \
         {}; no secret in the logs (debug); {:.0} s in all",
        measured.join("; "),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// Trial 10: authorization on the target.

/// A target running Kafka's `StandardAuthorizer` (mutual TLS; the source is [`Secured`]'s, by
/// its PLAINTEXT listener), started once per test process: the mirror's principal
/// (`User:mirror`, from its client certificate) may describe each topic of [`UNWRITABLE`] and
/// write `other`, but may not WRITE those topics.
struct Authorized {
    target: KafkaCluster,
}

/// The target topics the mirror may describe and not write: one per engine's trial (the
/// source topics of the same names are on the shared source, beside the other trials').
const UNWRITABLE: [&str; 2] = ["unwritable", "unwritable-batches"];

fn authorized() -> &'static Authorized {
    static AUTHORIZED: OnceLock<Authorized> = OnceLock::new();
    AUTHORIZED.get_or_init(|| {
        let target = KafkaCluster::start_secured(
            KAFKA_4,
            1,
            &[("auto.create.topics.enable", "false")],
            &KafkaSecurity {
                listener: SecureListener::MutualTls,
                pki: &secured().pki,
                authorizer: true,
            },
        );
        let principal = format!("User:{CLIENT_CN}");
        for topic in UNWRITABLE {
            target.create_topic(topic, PARTITIONS, 1, &[]);
            target.acls(&[
                "--add",
                "--allow-principal",
                &principal,
                "--operation",
                "Describe",
                "--operation",
                "DescribeConfigs",
                "--topic",
                topic,
            ]);
        }
        target.create_topic("other", 1, 1, &[]);
        // WRITE on some topic implies IDEMPOTENT_WRITE on the cluster (KIP-679): the idempotent
        // producer gets its id, and only the topic's WRITE is missing.
        target.acls(&[
            "--add",
            "--allow-principal",
            &principal,
            "--operation",
            "Write",
            "--operation",
            "Describe",
            "--topic",
            "other",
        ]);
        // The offset-mapping topic is the mirror's own: it may make and write it.
        target.acls(&[
            "--add",
            "--allow-principal",
            &principal,
            "--operation",
            "Create",
            "--operation",
            "Write",
            "--operation",
            "Describe",
            "--topic",
            "mirror-maker.offsets.source",
        ]);
        Authorized { target }
    })
}

/// The target runs Kafka's `StandardAuthorizer`; the mirror's principal (`User:mirror`, from
/// its client certificate) may describe the existing target topic and write another one, but
/// may not WRITE this one. `check` reports the missing permission before anything is consumed,
/// and a mirror in abort mode stops with exit 1 and one line naming the topic and the
/// operation. The record engine (the default).
#[test]
fn a_target_topic_the_mirror_may_not_write() {
    a_target_topic_that_may_not_be_written(UNWRITABLE[0], &[]);
}

/// As [`a_target_topic_the_mirror_may_not_write`], with the batch engine: its own Produce is
/// refused (TOPIC_AUTHORIZATION_FAILED), and its line names the topic and WRITE too.
#[test]
fn a_target_topic_the_mirror_may_not_write_with_the_batch_engine() {
    a_target_topic_that_may_not_be_written(UNWRITABLE[1], &["--copy.mode", "batches"]);
}

/// The trial of both engines, on `topic` (and the group of that name), `engine` the flags
/// that choose the engine.
fn a_target_topic_that_may_not_be_written(topic: &'static str, engine: &[&str]) {
    const RECORDS: u64 = 200;
    let started = Instant::now();
    let Secured { pki, source, .. } = secured();
    let Authorized { target } = authorized();
    let principal = format!("User:{CLIENT_CN}");
    let engine_name = if engine.is_empty() {
        "record engine"
    } else {
        "batch engine"
    };
    source.create_topic(topic, PARTITIONS, 1, &[]);
    write_samples(&source.bootstrap(), topic, 0..RECORDS, PARTITIONS, 100).expect("writing");
    let producer = tls_producer(pki);
    let producer = pairs(&producer);
    let dir = tempdir();
    let mut consumer = vec![("group.id", topic)];
    consumer.extend_from_slice(FAST_GROUP);
    let c = write_config(dir.path(), "consumer.toml", &source.bootstrap(), &consumer);
    let p = write_config(
        dir.path(),
        "producer.toml",
        &target.secure_bootstrap(),
        &producer,
    );

    let (code, out, checked_in) = check(&c, &p, topic, engine);
    eprintln!("check:\n{out}");
    let committed_after_check = committed_by(topic, &source.bootstrap(), topic, PARTITIONS);
    assert_eq!(committed_after_check, vec![-1; PARTITIONS as usize]);

    let mirror_started = Instant::now();
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(topic)
        .flag("--abort.on.send.failure", "true")
        .args(engine)
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let stopped_in = mirror_started.elapsed();
    let log = mirror.log();
    let last = log.lines().last().unwrap_or_default().to_owned();
    eprintln!("mirror log:\n{log}");
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert_eq!(
        log.contains(BATCH_ENGINE),
        !engine.is_empty(),
        "the {engine_name} did the copying; log:\n{log}"
    );
    assert!(
        last.contains(&format!("target topic {topic}")) && last.contains("WRITE"),
        "the last line names neither the topic nor the missing operation: {last}"
    );
    assert_eq!(
        committed_by(topic, &source.bootstrap(), topic, PARTITIONS),
        vec![-1; PARTITIONS as usize],
        "nothing committed past the refused records"
    );
    let target_end = end_offsets(&target.bootstrap(), topic, PARTITIONS);
    assert_eq!(
        target_end,
        vec![0; PARTITIONS as usize],
        "nothing reached the target"
    );
    let problem = out
        .lines()
        .find(|l| l.starts_with("problem:"))
        .unwrap_or_default()
        .to_owned();
    assert_eq!(code, 1, "check:\n{out}");
    assert!(
        problem.contains(topic) && problem.contains("WRITE"),
        "check:\n{out}"
    );
    eprintln!(
        "TRIAL authorization kafka 4.4.0 ({engine_name}): target topic without WRITE for \
         {principal}: check (exit {code}, {:.1} s, nothing consumed) says: {problem}; the mirror \
         (abort mode) exits 1 after {:.1} s with: {last}; {:.0} s in all",
        checked_in.as_secs_f64(),
        stopped_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
