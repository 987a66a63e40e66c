//! User plugins: each example changes exactly what it should; a failing plugin stops the
//! mirror without losing anything; a bad library is refused before anything is consumed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mirror_maker::tools::compare::OwnedRecord as Record;

use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 2;

fn clusters(extra_target_topics: &[&str]) -> MockPair {
    MockPair::new(TOPIC, PARTITIONS).with_target_topics(extra_target_topics)
}

fn with_header(mut r: Record, name: &str, value: &str) -> Record {
    r.headers
        .push((name.to_owned(), Some(value.as_bytes().to_vec())));
    r
}

#[test]
fn the_filter_handler_drops_matching_records_and_nothing_else() {
    let clusters = clusters(&[]);
    clusters.write(0..400);
    let lib = build_plugin("filter-handler");
    // Keys customer-1, customer-10..19, customer-100..199 are dropped; null keys never match.
    clusters.mirror_until_committed(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "key=^customer-1",
        ],
        400,
    );
    let mut dropped = 0;
    for p in 0..PARTITIONS {
        let expected: Vec<Record> = clusters
            .source_records(p)
            .into_iter()
            .filter(|r| {
                !r.key
                    .as_deref()
                    .is_some_and(|k| k.starts_with(b"customer-1"))
            })
            .collect();
        let got = clusters.target_records(TOPIC, p);
        dropped += 200 - expected.len();
        assert_eq!(got, expected, "partition {p}");
    }
    assert!(
        dropped > 0 && dropped < 400,
        "the filter dropped {dropped} of 400"
    );
}

#[test]
fn the_rename_handler_renames_the_topic_and_adds_the_provenance_header() {
    let clusters = clusters(&["eu.orders"]);
    clusters.write(0..200);
    let lib = build_plugin("rename-handler");
    let args = "topic=eu.{topic};header=mirror-source:eu-west";
    clusters.mirror_until_committed(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            args,
        ],
        200,
    );
    for p in 0..PARTITIONS {
        let expected: Vec<Record> = clusters
            .source_records(p)
            .into_iter()
            .map(|r| with_header(r, "mirror-source", "eu-west"))
            .collect();
        assert_eq!(
            clusters.target_records("eu.orders", p),
            expected,
            "partition {p}"
        );
        assert!(
            clusters.target_records(TOPIC, p).is_empty(),
            "nothing under the old name"
        );
    }
}

#[test]
fn the_fan_out_handler_writes_every_record_twice_and_offsets_stay_right_across_a_restart() {
    let clusters = clusters(&["orders.a", "orders.b"]);
    let lib = build_plugin("fanout-handler");
    let plugin = [
        "--message.handler",
        lib.to_str().unwrap(),
        "--message.handler.args",
        "{topic}.a,{topic}.b",
    ];
    clusters.write(0..200);
    clusters.mirror_until_committed(&plugin, 200);
    clusters.write(200..400);
    clusters.mirror_until_committed(&plugin, 400);
    assert_eq!(
        committed(&clusters.src(), TOPIC, PARTITIONS),
        vec![200, 200]
    );
    for p in 0..PARTITIONS {
        let source = clusters.source_records(p);
        assert_eq!(source.len(), 200);
        assert_eq!(
            clusters.target_records("orders.a", p),
            source,
            "orders.a/{p}"
        );
        assert_eq!(
            clusters.target_records("orders.b", p),
            source,
            "orders.b/{p}"
        );
    }
}

#[test]
fn the_c_handler_built_against_the_header_adds_its_header() {
    let clusters = clusters(&[]);
    clusters.write(0..100);
    let lib = build_c_handler("c_handler", &[]);
    clusters.mirror_until_committed(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "from-c",
        ],
        100,
    );
    for p in 0..PARTITIONS {
        let expected: Vec<Record> = clusters
            .source_records(p)
            .into_iter()
            .map(|r| with_header(r, "handled-by", "from-c"))
            .collect();
        assert_eq!(clusters.target_records(TOPIC, p), expected, "partition {p}");
    }
}

/// Headers no handler may lose: a name that is not UTF-8 (Latin-1 `é`), a null value, and a
/// repeated name.
fn awkward_headers() -> Vec<RawHeader> {
    vec![
        (b"caf\xe9".to_vec(), Some(b"latin-1 name".to_vec())),
        (b"plain".to_vec(), None),
        (b"plain".to_vec(), Some(vec![0xff, 0x00])),
    ]
}

/// Mirrors 10 records with `headers` into partition 0 through the handler `lib` with `args`,
/// and checks that each reached the target with its headers and then `added` (byte for byte).
fn handler_keeps_raw_headers(lib: &Path, args: &str, headers: Vec<RawHeader>, added: RawHeader) {
    let clusters = clusters(&[]);
    write_with_raw_headers(&clusters.src(), TOPIC, 0, 10, &headers);
    let log = clusters.mirror_until_committed(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            args,
        ],
        10,
    );
    let mut expected = headers;
    expected.push(added);
    let got = raw_headers(&clusters.dst(), TOPIC, 0, 10);
    for (i, record) in got.iter().enumerate() {
        assert_eq!(record, &expected, "record {i}; log:\n{log}");
    }
}

#[test]
fn a_header_name_that_is_not_utf8_reaches_the_target_through_a_rust_handler() {
    handler_keeps_raw_headers(
        &build_plugin("rename-handler"),
        "header=tag:rust",
        awkward_headers(),
        (b"tag".to_vec(), Some(b"rust".to_vec())),
    );
}

#[test]
fn a_header_name_that_is_not_utf8_reaches_the_target_through_the_c_handler() {
    handler_keeps_raw_headers(
        &build_c_handler("c_handler", &[]),
        "from-c",
        awkward_headers(),
        (b"handled-by".to_vec(), Some(b"from-c".to_vec())),
    );
}

#[test]
fn the_c_handler_copies_a_record_with_more_than_64_headers() {
    let headers: Vec<RawHeader> = (0..100)
        .map(|i| (format!("h{i}").into_bytes(), Some(vec![i as u8])))
        .collect();
    handler_keeps_raw_headers(
        &build_c_handler("c_handler", &[]),
        "from-c",
        headers,
        (b"handled-by".to_vec(), Some(b"from-c".to_vec())),
    );
}

fn line_of(log: &str, needle: &str) -> usize {
    log.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in log:\n{log}"))
}

#[test]
fn the_listener_runs_after_the_internal_flush_and_commit() {
    let clusters = clusters(&[]);
    clusters.write(0..100);
    let lib = build_plugin("recording-listener");
    let log = clusters.mirror_until_committed(
        &["--consumer.rebalance.listener", lib.to_str().unwrap()],
        100,
    );
    // Assignment: the mirror logs it, then the listener is told before fetching starts.
    let assigned = line_of(&log, "assigned 2 partitions");
    let starting = line_of(&log, "recording-listener: before_starting_fetchers");
    assert!(assigned < starting, "log:\n{log}");
    assert!(
        log.lines().nth(starting).unwrap().contains("orders/0")
            && log.lines().nth(starting).unwrap().contains("orders/1")
    );
    // Release at shutdown: flushed and committed first (by the final commit, which leaves
    // the release nothing to commit), then the listener.
    let released = line_of(&log, "released 2 partitions");
    let releasing = line_of(&log, "recording-listener: before_releasing_partitions");
    assert!(released < releasing, "log:\n{log}");
}

/// Writes 20 records into partition 0 only.
fn write_twenty(clusters: &MockPair) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    for i in 0..20 {
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::<str, str>::to(TOPIC)
                    .partition(0)
                    .key(&key)
                    .payload("v"),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

fn a_failing_handler_stops_the_mirror_before_the_record(
    args: &str,
    policy: &[&str],
    expected_message: &str,
) {
    let clusters = clusters(&[]);
    write_twenty(&clusters);
    let lib = build_plugin("faulty-handler");
    let mut mirror = clusters.mirror().handler(&lib, args).args(policy).start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("orders/0 offset 5") && last.contains(expected_message),
        "last line: {last}"
    );
    assert_eq!(
        committed(&clusters.src(), TOPIC, PARTITIONS)[0],
        5,
        "committed up to, not past, the failing record"
    );
    let target = clusters.target_records(TOPIC, 0);
    assert_eq!(
        target,
        clusters.source_records(0)[..5].to_vec(),
        "exactly the records before it"
    );
}

#[test]
fn a_panicking_handler_stops_the_mirror_and_loses_nothing() {
    // The default policy (--on.handler.error stop).
    a_failing_handler_stops_the_mirror_before_the_record(
        "panic-at=5",
        &[],
        "panicked: deliberate panic at offset 5",
    );
}

#[test]
fn an_erroring_handler_stops_the_mirror_and_loses_nothing() {
    a_failing_handler_stops_the_mirror_before_the_record(
        "error-at=5",
        &["--on.handler.error", "stop"],
        "deliberate error at offset 5",
    );
}

/// Runs the faulty handler failing at offset 5 of partition 0 (20 records there) with
/// `policy` until all 20 are committed; returns the metrics scraped then and the log.
fn mirror_past_a_refused_record(clusters: &MockPair, policy: &[&str]) -> (String, String) {
    write_twenty(clusters);
    let lib = build_plugin("faulty-handler");
    let addr = free_local_addr();
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .handler(&lib, "error-at=5")
        .metrics_addr(&addr)
        .args(policy)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 20);
    let (_, metrics) = http_get(&addr, "/metrics");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(
        committed(&clusters.src(), TOPIC, PARTITIONS)[0],
        20,
        "committed past the refused record"
    );
    let mut others = clusters.source_records(0);
    others.remove(5);
    assert_eq!(
        clusters.target_records(TOPIC, 0),
        others,
        "every other record copied, in order"
    );
    (metrics, mirror.log())
}

#[test]
fn with_skip_a_record_the_handler_refuses_is_logged_counted_and_committed_past() {
    let clusters = clusters(&[]);
    let (metrics, log) = mirror_past_a_refused_record(&clusters, &["--on.handler.error", "skip"]);
    assert_eq!(
        metric(
            &metrics,
            "mirror_handler_refused_total",
            "topic=\"orders\",action=\"skip\""
        ),
        Some(1.0),
        "metrics:\n{metrics}"
    );
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("orders/0 offset 5")
            && l.contains("deliberate error at offset 5")
            && l.contains("skipped")),
        "no warning naming the record:\n{log}"
    );
}

#[test]
fn with_dead_letter_a_refused_record_lands_in_the_dead_letter_topic_with_its_position() {
    let clusters = clusters(&["orders.refused"]);
    let (metrics, _) = mirror_past_a_refused_record(
        &clusters,
        &[
            "--on.handler.error",
            "dead-letter",
            "--dead.letter.topic",
            "orders.refused",
        ],
    );
    assert_eq!(
        metric(
            &metrics,
            "mirror_handler_refused_total",
            "topic=\"orders\",action=\"dead-letter\""
        ),
        Some(1.0),
        "metrics:\n{metrics}"
    );
    let dead: Vec<Record> = (0..PARTITIONS)
        .flat_map(|p| clusters.target_records("orders.refused", p))
        .collect();
    let source = clusters.source_records(0)[5].clone();
    let header = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    let mut expected = source;
    expected.headers.extend([
        header("mirror-handler-error", "deliberate error at offset 5"),
        header("mirror-source-topic", "orders"),
        header("mirror-source-partition", "0"),
        header("mirror-source-offset", "5"),
    ]);
    assert_eq!(
        dead,
        vec![expected],
        "the refused record, as it is, with its position"
    );
}

#[test]
fn with_dead_letter_the_commit_stays_below_a_refused_record_the_target_did_not_take() {
    let clusters = clusters(&["orders.refused"]);
    // The dead-letter topic refuses every write; the mirrored topic takes them.
    clusters
        .target
        .topic_error(
            "orders.refused",
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    write_twenty(&clusters);
    let lib = build_plugin("faulty-handler");
    // The records before the refused one still linger in the producer when the dead-letter
    // topic's refusal arrives (it comes with the topic's metadata, at once): they are
    // delivered, not purged with the records behind the refusal.
    let mut mirror = clusters
        .mirror()
        .handler(&lib, "error-at=5")
        .producer(&[("linger.ms", "1000")])
        .args(&[
            "--on.handler.error",
            "dead-letter",
            "--dead.letter.topic",
            "orders.refused",
        ])
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("orders/0 offset 5") && last.contains("orders.refused"),
        "last line: {last}"
    );
    assert_eq!(
        committed(&clusters.src(), TOPIC, PARTITIONS)[0],
        5,
        "committed up to, not past, the record whose dead-letter copy was refused"
    );
}

#[test]
fn a_missing_dead_letter_topic_is_refused_at_start_without_create_topics() {
    let clusters = clusters(&[]);
    let lib = build_plugin("faulty-handler");
    let mut mirror = clusters
        .mirror()
        .handler(&lib, "error-at=5")
        .args(&[
            "--on.handler.error",
            "dead-letter",
            "--dead.letter.topic",
            "orders.refused",
            "--create.topics",
            "false",
        ])
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("dead-letter topic orders.refused") && last.contains("--create.topics"),
        "last line: {last}"
    );
}

#[test]
fn a_dead_letter_topic_that_a_mirrored_topic_lands_in_is_refused_at_start() {
    let clusters = clusters(&[]);
    let lib = build_plugin("faulty-handler");
    let mut mirror = clusters
        .mirror()
        .handler(&lib, "error-at=5")
        .args(&[
            "--on.handler.error",
            "dead-letter",
            "--dead.letter.topic",
            TOPIC,
        ])
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("--dead.letter.topic orders is the target topic of source topic orders"),
        "last line: {last}"
    );
}

#[test]
fn check_reports_the_dead_letter_topic_and_a_missing_one_as_a_problem() {
    let clusters = clusters(&["orders.refused"]);
    let lib = build_plugin("faulty-handler");
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let check = |topic: &str| {
        let out = binary()
            .arg("check")
            .arg("--consumer.config")
            .arg(&c)
            .arg("--producer.config")
            .arg(&p)
            .args(["--whitelist", TOPIC, "--message.handler"])
            .arg(&lib)
            .args([
                "--message.handler.args",
                "error-at=5",
                "--create.topics",
                "false",
            ])
            .args([
                "--on.handler.error",
                "dead-letter",
                "--dead.letter.topic",
                topic,
            ])
            .output()
            .expect("running check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = check("orders.refused");
    assert!(
        text.contains("dead-letter topic orders.refused exists"),
        "{text}"
    );
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = check("orders.absent");
    assert!(
        text.lines()
            .any(|l| l.starts_with("problem: dead-letter topic orders.absent")),
        "{text}"
    );
    assert_eq!(code, Some(1), "{text}");
}

/// A bad plugin is refused with exit 2 and one line, within a second, before any broker is
/// contacted (the configs point at a closed port).
/// Asserts exit 2 with one line holding every needle, in under 1 s; returns the line.
fn assert_plugin_refused(plugin_args: &[&str], needles: &[&str]) -> String {
    assert_plugin_refused_in(None, plugin_args, needles)
}

/// As [`assert_plugin_refused`], with the mirror started in `cwd`.
fn assert_plugin_refused_in(cwd: Option<&Path>, plugin_args: &[&str], needles: &[&str]) -> String {
    let stderr = refusal(cwd, plugin_args);
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
    stderr
}

/// Runs the mirror with `plugin_args` (against a closed port) and returns its one line of
/// refusal, asserting exit 2 within a second. A mirror that does not refuse is killed after
/// 10 s, so that a loader that lets a plugin through fails the test instead of hanging it.
fn refusal(cwd: Option<&Path>, plugin_args: &[&str]) -> String {
    use std::io::Read;
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), "127.0.0.1:1", "127.0.0.1:1", &[], &[]);
    let started = Instant::now();
    let mut cmd = binary();
    cmd.arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", TOPIC])
        .args(plugin_args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = status.unwrap_or_else(|| panic!("not refused within 10 s: {stderr}"));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");
    stderr
}

#[test]
fn a_missing_library_is_refused() {
    assert_plugin_refused(
        &["--message.handler", "/nonexistent/libnothing.so"],
        &["/nonexistent/libnothing.so", "no such file"],
    );
}

#[test]
fn a_library_without_the_entry_symbol_is_refused() {
    // A listener is not a handler.
    let lib = build_plugin("recording-listener");
    assert_plugin_refused(
        &["--message.handler", lib.to_str().unwrap()],
        &["mirror_maker_message_handler"],
    );
    let handler = build_plugin("filter-handler");
    assert_plugin_refused(
        &["--consumer.rebalance.listener", handler.to_str().unwrap()],
        &["mirror_maker_rebalance_listener"],
    );
}

#[test]
fn a_library_built_for_another_abi_version_is_refused() {
    let lib = build_c_handler("c_handler_abi99", &["ABI_VERSION=99"]);
    assert_plugin_refused(
        &["--message.handler", lib.to_str().unwrap()],
        &["ABI version 99", "rebuild"],
    );
}

#[test]
fn an_init_that_rejects_its_args_is_refused() {
    let lib = build_plugin("filter-handler");
    assert_plugin_refused(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "key=(",
        ],
        &["refused its arguments"],
    );
}

// Where a plugin may come from: a path (never a name looked up in the system's library path),
// in files and directories only root or the running user can change.

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A copy of the C example handler at `path`, with `mode` (built as `name`: one name per test,
/// so that tests running at once do not write the same file).
fn c_handler_copy(name: &str, path: &Path, mode: u32) -> PathBuf {
    std::fs::copy(build_c_handler(name, &[]), path).unwrap();
    set_mode(path, mode);
    path.to_owned()
}

/// A directory at `path` with `mode`.
fn dir_with_mode(path: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir(path).unwrap();
    set_mode(path, mode);
    path.to_owned()
}

/// Args the C handler's `init` refuses: a plugin refused with them was loaded and reached
/// `init`.
const TOO_LONG_FOR_INIT: &str =
    "a header value of more than sixty-four bytes, which the C handler refuses";

#[test]
fn a_bare_library_name_is_refused_not_looked_up_in_the_system_library_path() {
    // An empty libc.so.6 here: the check saw it, but dlopen would load the system's libc.
    let dir = tempdir();
    std::fs::write(dir.path().join("libc.so.6"), b"").unwrap();
    assert_plugin_refused_in(
        Some(dir.path()),
        &["--message.handler", "libc.so.6"],
        &["libc.so.6", "./libc.so.6", "absolute path"],
    );
}

#[test]
fn a_library_path_opens_that_file_not_the_system_library_of_its_name() {
    let dir = tempdir();
    std::fs::write(dir.path().join("libc.so.6"), b"").unwrap();
    let stderr = refusal(Some(dir.path()), &["--message.handler", "./libc.so.6"]);
    assert!(
        stderr.contains("cannot load") && !stderr.contains("mirror_maker_message_handler"),
        "the system's libc was opened: {stderr}"
    );
}

#[test]
fn a_library_writable_by_group_or_others_is_refused() {
    let dir = tempdir();
    for mode in [0o777, 0o664, 0o646] {
        let lib = c_handler_copy(
            "c_handler_mode",
            &dir.path().join(format!("lib{mode:o}.so")),
            mode,
        );
        assert_plugin_refused(
            &[
                "--message.handler",
                lib.to_str().unwrap(),
                "--message.handler.args",
                TOO_LONG_FOR_INIT,
            ],
            &[lib.to_str().unwrap(), "writable by group or others"],
        );
    }
}

#[test]
fn a_library_in_a_directory_writable_by_others_is_refused() {
    let dir = tempdir();
    let open = dir_with_mode(&dir.path().join("open"), 0o777);
    let lib = c_handler_copy("c_handler_open_dir", &open.join("libc_handler.so"), 0o644);
    assert_plugin_refused(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            TOO_LONG_FOR_INIT,
        ],
        &[
            lib.to_str().unwrap(),
            &format!("directory {}", open.display()),
            "writable by group or others",
        ],
    );
}

#[test]
fn a_symlink_to_a_library_in_a_writable_directory_is_refused() {
    let dir = tempdir();
    let open = dir_with_mode(&dir.path().join("open"), 0o777);
    let lib = c_handler_copy("c_handler_symlinked", &open.join("libc_handler.so"), 0o777);
    let link = dir.path().join("libc_handler.so");
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    assert_plugin_refused(
        &[
            "--message.handler",
            link.to_str().unwrap(),
            "--message.handler.args",
            TOO_LONG_FOR_INIT,
        ],
        &[link.to_str().unwrap(), "writable by group or others"],
    );
}

#[test]
fn a_library_owned_by_another_user_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    if std::fs::metadata(dir.path()).unwrap().uid() != 0 {
        eprintln!("skipped: only root can give a file to another user");
        return;
    }
    let lib = c_handler_copy(
        "c_handler_other_owner",
        &dir.path().join("libc_handler.so"),
        0o644,
    );
    std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).unwrap();
    assert_plugin_refused(
        &["--message.handler", lib.to_str().unwrap()],
        &[lib.to_str().unwrap(), "owned by uid 65534"],
    );
}

#[test]
fn a_library_below_a_sticky_directory_writable_by_all_reaches_init() {
    // As in /tmp (1777): the sticky bit keeps others from renaming or removing what they do
    // not own, so they cannot replace the user's own directory inside it.
    let dir = tempdir();
    let sticky = dir_with_mode(&dir.path().join("tmp"), 0o1777);
    let own = dir_with_mode(&sticky.join("mine"), 0o755);
    let lib = c_handler_copy("c_handler_sticky", &own.join("libc_handler.so"), 0o644);
    assert_plugin_refused(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            TOO_LONG_FOR_INIT,
        ],
        // init ran and refused: its own words are masked where they repeat the arguments
        // (arguments may hold secrets), so the refusal itself is what shows it ran.
        &["refused its arguments"],
    );
}

/// A C handler whose vtable holds `init`, `handle` and `destroy` unless a define
/// (`HANDLE=NULL`, ...) replaces one. Its `init` refuses the args "refuse".
fn c_handler_with(name: &str, defines: &[&str]) -> PathBuf {
    let dir = target_dir().join("c-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(
        &src,
        r#"#include <string.h>
#include "mirror_maker_plugin.h"
#ifndef INIT
#define INIT init
#endif
#ifndef HANDLE
#define HANDLE handle
#endif
#ifndef DESTROY
#define DESTROY destroy
#endif
__attribute__((unused)) static int32_t init(mm_bytes args, void **instance, mm_error_buf *err) {
    *instance = NULL;
    if (args.len == 6 && memcmp(args.ptr, "refuse", 6) == 0) {
        memcpy(err->ptr, "refused as asked", 16);
        err->len = 16;
        return 1;
    }
    return 0;
}
__attribute__((unused)) static int32_t handle(void *instance, const mm_record *record,
                                              mm_emit_fn emit, void *emit_ctx,
                                              mm_error_buf *err) {
    (void)instance; (void)err;
    return emit(emit_ctx, record);
}
__attribute__((unused)) static void destroy(void *instance) { (void)instance; }
static const mm_handler_vtable VTABLE = {
    MM_PLUGIN_ABI_VERSION, sizeof(mm_handler_vtable), INIT, HANDLE, DESTROY,
};
const mm_handler_vtable *mirror_maker_message_handler(void) { return &VTABLE; }
"#,
    )
    .unwrap();
    let lib = dir.join(format!("lib{name}.so"));
    let status = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("running the C compiler (cc)");
    assert!(status.success(), "compiling {}", src.display());
    lib
}

#[test]
fn a_c_handler_without_a_required_function_is_refused_naming_it() {
    for (missing, define) in [("handle", "HANDLE=NULL"), ("init", "INIT=NULL")] {
        let lib = c_handler_with(&format!("c_handler_without_{missing}"), &[define]);
        assert_plugin_refused(
            &["--message.handler", lib.to_str().unwrap()],
            &[lib.to_str().unwrap(), &format!("`{missing}`"), "required"],
        );
    }
}

#[test]
fn a_c_handler_without_the_optional_destroy_reaches_init() {
    let lib = c_handler_with("c_handler_without_destroy", &["DESTROY=NULL"]);
    assert_plugin_refused(
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "refuse",
        ],
        // init ran and refused ("refused as asked", masked where it repeats the argument).
        &["refused its arguments", "as asked"],
    );
}

#[test]
fn a_plugins_refused_arguments_are_not_shown_they_may_hold_secrets() {
    let lib = build_plugin("filter-handler");
    let dir = tempdir();
    let file = dir.path().join("handler.args");
    write_private(&file, "key=(hunter2\n");
    for args in [
        ["--message.handler.args", "key=(hunter2"],
        ["--message.handler.args.file", file.to_str().unwrap()],
    ] {
        let mut all = vec!["--message.handler", lib.to_str().unwrap()];
        all.extend(args);
        let stderr = assert_plugin_refused(&all, &["refused its arguments"]);
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[test]
fn the_c_header_and_the_rust_abi_agree_on_layout() {
    use mirror_maker_plugin::ffi;
    let dir = tempdir();
    let src = dir.path().join("sizes.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stddef.h>\n#include \"mirror_maker_plugin.h\"\n\
         int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %zu\", sizeof(mm_record), sizeof(mm_header), \
         sizeof(mm_partition), sizeof(mm_error_buf), sizeof(mm_handler_vtable), sizeof(mm_listener_vtable), \
         offsetof(mm_record, timestamp)); return 0; }\n",
    )
    .unwrap();
    let exe = dir.path().join("sizes");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let status = std::process::Command::new("cc")
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    let out = String::from_utf8(std::process::Command::new(&exe).output().unwrap().stdout).unwrap();
    let rust = format!(
        "{} {} {} {} {} {} {}",
        std::mem::size_of::<ffi::Record>(),
        std::mem::size_of::<ffi::Header>(),
        std::mem::size_of::<ffi::Partition>(),
        std::mem::size_of::<ffi::ErrorBuf>(),
        std::mem::size_of::<ffi::HandlerVTable>(),
        std::mem::size_of::<ffi::ListenerVTable>(),
        std::mem::offset_of!(ffi::Record, timestamp),
    );
    assert_eq!(out, rust, "C sizes vs Rust sizes");
}

/// A fan-out handler fills the producer queue (the byte backpressure counts the
/// source records' bytes: 1 KiB in flight, four times that queued, in a queue of 2 KiB) while
/// the target is down for longer than `max.poll.interval.ms` (10 s here). The stream waits in
/// its queue-full loop: it must keep its group membership (pause and poll the consumer) and
/// feed the systemd watchdog, and lose or reorder nothing once the target is back.
#[test]
fn a_fan_out_that_fills_the_producer_queue_keeps_the_group_and_the_watchdog() {
    use std::os::unix::net::UnixDatagram;
    let topics = ["orders.a", "orders.b", "orders.c", "orders.d"];
    let clusters = clusters(&topics);
    let lib = build_plugin("fanout-handler");
    clusters.write(0..100);
    let dir = tempdir();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.kbytes", "2")])
        .commit_ms(300)
        .handler(&lib, "{topic}.a,{topic}.b,{topic}.c,{topic}.d")
        .env(&[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
        ])
        .log("info,mirror_maker::mirror::at_least_once::stream=debug")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 100);
    clusters.target.broker_down(1).unwrap();
    clusters.write(100..2000);
    // Longer than max.poll.interval.ms; the watchdog is listened to meanwhile.
    // A reader that keeps draining the socket (a full socket would block the notifier).
    let outage = Instant::now();
    let late_watchdogs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = late_watchdogs.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let late = (Duration::from_secs(8)..Duration::from_secs(14))
                        .contains(&outage.elapsed());
                    if &buf[..n] == b"WATCHDOG=1" && late {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    });
    // Not a condition: the outage itself, whose 8..14 s window the watchdog count measures.
    std::thread::sleep(Duration::from_secs(14));
    let late_watchdogs = late_watchdogs.load(std::sync::atomic::Ordering::SeqCst);
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, PARTITIONS, 2000);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert!(
        log.contains("producer queue full"),
        "the test did not fill the producer queue:\n{log}"
    );
    assert!(
        late_watchdogs >= 2,
        "the watchdog was not fed while the queue was full ({late_watchdogs}):\n{log}"
    );
    assert!(
        !log.contains("maximum poll interval") && log.matches("assigned").count() == 1,
        "the stream left the group during the outage:\n{log}"
    );
    for p in 0..PARTITIONS {
        let source = clusters.source_records(p);
        assert_eq!(source.len(), 1000);
        for t in topics {
            assert_eq!(clusters.target_records(t, p), source, "{t}/{p}");
        }
    }
}

/// Only the target topics `--create.topics` makes (the source topic through
/// `--target.topic`) are made again when found missing; a handler's output topic that does
/// not exist stays a send failure (abort: exit 1, committed before it), not an endless
/// rewind.
#[test]
fn a_missing_handler_output_topic_is_a_send_failure_not_made_again() {
    let clusters = clusters(&[]);
    // The mock makes unknown topics when asked: this one answers as not existing.
    clusters
        .target
        .topic_error(
            "__missing.orders",
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        )
        .unwrap();
    clusters.write(0..20);
    let lib = build_plugin("rename-handler");
    let mut mirror = clusters
        .mirror()
        .producer(&[("topic.metadata.propagation.max.ms", "1000")])
        .handler(&lib, "topic=__missing.{topic}")
        .create_topics()
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        !log.contains("mirroring orders/0 again") && log.contains("__missing.orders"),
        "log:\n{log}"
    );
}
