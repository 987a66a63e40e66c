//! User plugins: each example changes exactly what it should; a failing plugin stops the
//! mirror without losing anything; a bad library is refused before anything is consumed.

use std::path::Path;
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

fn a_failing_handler_stops_the_mirror_before_the_record(args: &str, expected_message: &str) {
    let clusters = clusters(&[]);
    write_twenty(&clusters);
    let lib = build_plugin("faulty-handler");
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let mut mirror = Mirror::start(
        &c,
        &p,
        TOPIC,
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            args,
        ],
    );
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
    a_failing_handler_stops_the_mirror_before_the_record(
        "panic-at=5",
        "panicked: deliberate panic at offset 5",
    );
}

#[test]
fn an_erroring_handler_stops_the_mirror_and_loses_nothing() {
    a_failing_handler_stops_the_mirror_before_the_record(
        "error-at=5",
        "deliberate error at offset 5",
    );
}

/// A bad plugin is refused with exit 2 and one line, within a second, before any broker is
/// contacted (the configs point at a closed port).
fn assert_plugin_refused(plugin_args: &[&str], needles: &[&str]) {
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), "127.0.0.1:1", "127.0.0.1:1", &[], &[]);
    let started = Instant::now();
    let out = binary()
        .arg("--consumer.config")
        .arg(&c)
        .arg("--producer.config")
        .arg(&p)
        .args(["--whitelist", TOPIC])
        .args(plugin_args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
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
        &["refused its arguments", "key=("],
    );
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

/// Issue 12 #4: a fan-out handler fills the producer queue (the byte backpressure counts the
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
    let (c, p) = mirror_configs(
        dir.path(),
        &clusters.src(),
        &clusters.dst(),
        &[],
        &[("queue.buffering.max.kbytes", "2")],
    );
    let mut mirror = Mirror::start_with_env(
        &c,
        &p,
        TOPIC,
        &[
            "--offset.commit.interval.ms",
            "300",
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "{topic}.a,{topic}.b,{topic}.c,{topic}.d",
        ],
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
            ("RUST_LOG", "info,mirror_maker::mirror::stream=debug"),
        ],
    );
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

/// Issue 12 #3: only the target topics `--create.topics` makes (the source topic through
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
    let dir = tempdir();
    let (c, p) = mirror_configs(
        dir.path(),
        &clusters.src(),
        &clusters.dst(),
        &[],
        &[("topic.metadata.propagation.max.ms", "1000")],
    );
    let mut mirror = Mirror::start(
        &c,
        &p,
        TOPIC,
        &[
            "--message.handler",
            lib.to_str().unwrap(),
            "--message.handler.args",
            "topic=__missing.{topic}",
            "--create.topics",
            "true",
        ],
    );
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        !log.contains("mirroring orders/0 again") && log.contains("__missing.orders"),
        "log:\n{log}"
    );
}
