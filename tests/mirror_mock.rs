//! The mirror's guarantees, proved against librdkafka's mock clusters (real Kafka protocol,
//! in this process) with the real binary in a child process.

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::ClientConfig;

use mirror_test_harness::*;

const TOPIC: &str = "orders";

#[test]
fn every_record_is_copied_faithfully_and_shutdown_commits_what_was_acknowledged() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..3000);
    // A commit interval longer than the test: only the shutdown commit can commit.
    let mut mirror = clusters.mirror().streams(2).commit_ms(600_000).start();
    wait_until(Duration::from_secs(60), "all records on the target", || {
        let c = clusters.compare();
        c.target >= 3000 || !mirror.is_running()
    });
    assert_eq!(
        clusters.committed(),
        vec![-1; 4],
        "nothing committed before shutdown"
    );
    let status = mirror.stop();
    assert_eq!(status.code(), Some(0), "log:\n{}", mirror.log());
    let c = clusters.compare();
    assert!(c.is_exact() && c.source == 3000, "{c:?}");
    assert_eq!(clusters.committed(), vec![750; 4]);
}

/// The default engine choice (`--copy.mode auto`) asks one broker of each cluster at start
/// whether the batch engine can speak to it; librdkafka's mock cluster does not answer its
/// ApiVersions v3, so the mirror copies records, says why once, and loses nothing.
#[test]
fn the_default_copies_records_where_the_batch_engine_cannot_speak_to_the_brokers() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..1000);
    let mut mirror = clusters.mirror().default_copy_mode().commit_ms(300).start();
    mirror.wait_for_log(
        "--copy.mode auto: copying records, the batch engine cannot serve the source cluster: broker",
        "the fallback to the record engine, with its reason",
    );
    wait_until(Duration::from_secs(60), "all records on the target", || {
        clusters.compare().target >= 1000 || !mirror.is_running()
    });
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = clusters.compare();
    assert!(c.is_exact() && c.source == 1000, "{c:?}");
    let log = mirror.log();
    assert!(
        log.contains("ApiVersions"),
        "the reason names the request refused:\n{log}"
    );
    assert!(
        !log.contains("copying record batches"),
        "the batch engine never started:\n{log}"
    );
}

/// The default engine choice copies records when a setting needs them (here hash
/// partitioning, which the batch engine cannot serve: it keeps each batch's partition), and
/// names that setting once at start, before asking any broker.
#[test]
fn the_default_copies_records_where_a_setting_needs_them() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..1000);
    let mut mirror = clusters
        .mirror()
        .default_copy_mode()
        .flag("--partitioning", "hash")
        .commit_ms(300)
        .start();
    mirror.wait_for_log(
        "--copy.mode auto: copying records, the batch engine cannot serve --partitioning hash",
        "the fallback to the record engine, naming the setting",
    );
    wait_until(Duration::from_secs(60), "all records on the target", || {
        clusters.compare().target >= 1000 || !mirror.is_running()
    });
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    assert_eq!(clusters.compare().target, 1000);
    let log = mirror.log();
    assert!(
        !log.contains("cannot serve the source cluster") && !log.contains("ApiVersions"),
        "the setting decided before any broker was asked:\n{log}"
    );
}

#[test]
fn a_mirror_killed_mid_stream_resumes_from_its_commits_without_loss() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..20000);
    // A slow target and a small producer queue make the copy take seconds.
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_millis(30))
        .unwrap();
    let mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.messages", "400")])
        .commit_ms(100);
    let mut first = mirror.start();
    wait_until(Duration::from_secs(60), "some offsets committed", || {
        committed_total(&clusters.src(), TOPIC, 4) > 0
    });
    first.signal("KILL");
    first.wait(Duration::from_secs(10));
    let at_kill = committed_total(&clusters.src(), TOPIC, 4);
    assert!(at_kill < 20000, "the kill came after the whole copy");
    let mut second = mirror.start();
    wait_committed(&mut second, &clusters.src(), TOPIC, 4, 20000);
    assert_eq!(second.stop().code(), Some(0));
    let c = clusters.compare();
    assert_eq!((c.source, c.lost, c.changed), (20000, 0, 0), "{c:?}");
    assert!(c.in_order, "{c:?}");
    // Records acknowledged after the last commit before the kill are mirrored again.
    eprintln!(
        "killed at {at_kill} committed; {} duplicates after the restart",
        c.duplicated
    );
}

#[test]
fn offsets_are_committed_on_the_interval_while_running() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..1000);
    let mut mirror = clusters.mirror().commit_ms(500).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 1000);
    assert!(mirror.is_running());
    mirror.signal("INT");
    assert_eq!(mirror.wait(Duration::from_secs(30)).code(), Some(0));
    assert!(clusters.compare().is_exact());
}

#[test]
fn a_small_producer_queue_slows_the_mirror_down_and_loses_nothing() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..5000);
    // A tiny producer queue and a slow target: the stream keeps waiting for room.
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_millis(20))
        .unwrap();
    let mut mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.messages", "64")])
        .commit_ms(300)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 4, 5000);
    assert_eq!(mirror.stop().code(), Some(0));
    let c = clusters.compare();
    assert!(c.is_exact(), "{c:?}");
}

#[test]
fn a_target_outage_pauses_consumption_keeps_the_group_and_loses_nothing() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..1000);
    // max.poll.interval.ms is 10 s (FAST_GROUP): the stream pauses after 3.3 s without acks
    // once 100 records (half the producer queue) are in flight.
    let mut mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.messages", "200")])
        .commit_ms(300)
        .log("info,mirror_maker::mirror::at_least_once::stream=debug")
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 1000);
    clusters.target.broker_down(1).unwrap();
    clusters.write(1000..3000);
    // Not a condition: the outage itself, longer than max.poll.interval.ms, so that a stream
    // that stopped polling would be thrown out of the group.
    std::thread::sleep(Duration::from_secs(12));
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 3000);
    assert_eq!(mirror.stop().code(), Some(0));
    let log = mirror.log();
    assert!(
        log.contains("pausing consumption") && log.contains("resuming consumption"),
        "log:\n{log}"
    );
    assert_eq!(
        log.matches("assigned").count(),
        1,
        "the stream left the group during the outage:\n{log}"
    );
    let c = clusters.compare();
    assert_eq!((c.lost, c.changed, c.source), (0, 0, 3000), "{c:?}");
    assert!(c.in_order);
}

#[test]
fn a_shutdown_while_the_target_is_down_commits_only_what_was_acknowledged_and_exits_0() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..1000);
    let mut mirror = clusters.mirror().commit_ms(300).shutdown_ms(2000).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 1000);
    clusters.target.broker_down(1).unwrap();
    clusters.write(1000..1500);
    // Not a condition one can watch: time for the stream to fetch and queue the new records
    // (nothing outside the process tells that they are queued; none may be committed).
    std::thread::sleep(Duration::from_secs(2));
    let started = std::time::Instant::now();
    let status = mirror.stop();
    let log = mirror.log();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(
        log.contains("not acknowledged by the target before the shutdown timeout"),
        "log:\n{log}"
    );
    assert_eq!(
        clusters.committed(),
        vec![500, 500],
        "nothing unacknowledged was committed"
    );
}

#[test]
fn topics_that_start_matching_while_running_are_mirrored() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..100);
    let mut mirror = clusters
        .mirror()
        .whitelist("orders.*")
        .commit_ms(300)
        .topic_refresh_ms(500)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 100);
    clusters.source.create_topic("orders.late", 2, 1).unwrap();
    clusters.target.create_topic("orders.late", 2, 1).unwrap();
    write_samples(&clusters.src(), "orders.late", 0..200, 2, 50).unwrap();
    wait_committed(&mut mirror, &clusters.src(), "orders.late", 2, 200);
    assert_eq!(mirror.stop().code(), Some(0));
    let c = compare_topic(&clusters.src(), &clusters.dst(), "orders.late", 2).unwrap();
    assert!(c.is_exact() && c.source == 200, "{c:?}");
}

/// A producer config whose client-side size limit refuses one record of the test data.
fn small_message_limit() -> [(&'static str, &'static str); 1] {
    [("message.max.bytes", "3000")]
}

/// Writes records 0..20 (small) into partition 0 with record 5 too large for the mirror.
fn write_with_oversized_record(clusters: &MockPair) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    for i in 0..20 {
        let value = if i == 5 {
            vec![b'x'; 5000]
        } else {
            vec![b'v'; 100]
        };
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::<str, [u8]>::to(TOPIC)
                    .partition(0)
                    .key(&key)
                    .payload(&value),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_non_retriable_send_failure_aborts_and_commits_only_before_the_failed_record() {
    let clusters = MockPair::new(TOPIC, 1);
    write_with_oversized_record(&clusters);
    let mut mirror = clusters.mirror().producer(&small_message_limit()).start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("orders/0 offset 5") && last.contains("abort.on.send.failure"),
        "the last line names the record and the flag: {last}"
    );
    assert_eq!(
        clusters.committed(),
        vec![5],
        "committed up to, not past, the failed record"
    );
}

#[test]
fn skip_mode_drops_the_failed_record_counts_it_and_goes_on() {
    let clusters = MockPair::new(TOPIC, 1);
    write_with_oversized_record(&clusters);
    let mut mirror = clusters
        .mirror()
        .producer(&small_message_limit())
        .flag("--abort.on.send.failure", "false")
        .commit_ms(300)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 20);
    assert_eq!(mirror.stop().code(), Some(0));
    assert!(
        mirror.log().contains("dropped orders/0 offset 5"),
        "log:\n{}",
        mirror.log()
    );
    let c = clusters.compare();
    assert_eq!(
        (c.source, c.target, c.lost, c.changed),
        (20, 19, 1, 0),
        "{c:?}"
    );
}

#[test]
fn a_broker_side_non_retriable_error_aborts_without_committing_past_it() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..200);
    // The target refuses the first produce request for good.
    clusters.target.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let mut mirror = clusters.mirror().start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    assert!(
        log.contains("orders/0 offset 0") && log.contains("uthorization"),
        "log:\n{log}"
    );
    let committed = clusters.committed()[0];
    assert!(
        committed <= 0,
        "committed {committed}, past the first (failed) record"
    );
}

#[test]
fn an_abort_lets_no_queued_record_of_the_failed_partition_reach_the_target() {
    // The copy of offset n fails for good while n+1.. are queued: were they delivered by the
    // shutdown flush, a restart would copy n, n+1.. again after them, and the target would
    // hold n+1..n+k, n, n+1..n+k (out of order).
    const BATCH: usize = 100;
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..3000);
    clusters
        .target
        .broker_round_trip_time(1, Duration::from_millis(200))
        .unwrap();
    clusters.target.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    // One request in flight at a time, so that what follows the failed batch waits in the
    // queue. librdkafka sends the next batch as soon as the failed one's answer arrives,
    // before the stream hears of the failure: Kafka's sequence check refuses that batch of an
    // idempotent producer (it follows a batch that was never written); the mock cluster does
    // not check sequences and writes it, so one batch is allowed here.
    let producer = [
        ("batch.num.messages", "100"),
        ("max.in.flight.requests.per.connection", "1"),
    ];
    let mut mirror = clusters.mirror().producer(&producer).start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let committed = clusters.committed()[0].max(0) as usize;
    let source = clusters.source_records(0);
    let target = clusters.target_records(TOPIC, 0);
    let late: Vec<usize> = target
        .iter()
        .filter_map(|r| source.iter().position(|s| s == r))
        .filter(|&offset| offset >= committed)
        .collect();
    assert!(
        late.len() <= BATCH,
        "{} records at or after the committed offset {committed} reached the target (first: \
         {:?}); log:\n{log}",
        late.len(),
        late.first()
    );
}

#[test]
fn retriable_produce_errors_are_retried_without_loss() {
    let clusters = MockPair::new(TOPIC, 2);
    clusters.write(0..2000);
    clusters.target.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ],
    );
    // One request in flight: the mock cluster checks no sequence numbers for an idempotent
    // producer without a transactional id (`rd_kafka_mock_validate_records` returns early), so
    // with several in flight a later batch of a partition is written while an earlier one
    // waits to be sent again, and librdkafka then reports the earlier one "implicitly acked"
    // though it was never written (Kafka refuses that later batch: OUT_OF_ORDER_SEQUENCE).
    // With one in flight no later batch is sent before the earlier one is answered. The same
    // guarantee with 5 in flight is proved on Kafka by
    // `kafka_faults::connections_reset_every_two_seconds_lose_nothing` (docs/testing.md).
    let mut mirror = clusters
        .mirror()
        .commit_ms(300)
        .producer(&[("max.in.flight.requests.per.connection", "1")])
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 2000);
    assert_eq!(mirror.stop().code(), Some(0));
    let c = clusters.compare();
    let log = mirror.log();
    assert_eq!((c.lost, c.changed), (0, 0), "{c:?}\nlog:\n{log}");
    assert!(c.in_order, "{c:?}\nlog:\n{log}");
}

#[test]
fn user_settings_are_used_as_given_when_no_data_loss_is_off() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..100);
    let mut mirror = clusters
        .mirror()
        .producer(&[("acks", "1")])
        .flag("--no.data.loss", "false")
        .commit_ms(300)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 100);
    assert_eq!(mirror.stop().code(), Some(0));
}

/// murmur2 hashes computed by Kafka's Java client, from its own test suite
/// (`UtilsTest.testMurmur2`, apache/kafka clients/src/test/java/.../utils/UtilsTest.java).
const JAVA_MURMUR2: &[(&str, i32)] = &[
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    (
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        -58897971,
    ),
    ("abc", 479470107),
];

#[test]
fn hash_partitioning_places_keyed_records_as_a_java_producer_would() {
    let clusters = MockPair::new(TOPIC, 1);
    // One source partition mirrored to a target with 7: preserve would put all in 0.
    let target_partitions = 7;
    clusters
        .target
        .create_topic("keyed", target_partitions, 1)
        .unwrap();
    clusters.source.create_topic("keyed", 1, 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    for (key, _) in JAVA_MURMUR2 {
        producer
            .send(
                BaseRecord::<str, str>::to("keyed")
                    .partition(0)
                    .key(*key)
                    .payload("v"),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut mirror = clusters
        .mirror()
        .whitelist("keyed")
        .flag("--partitioning", "hash")
        .commit_ms(300)
        .start();
    wait_committed(
        &mut mirror,
        &clusters.src(),
        "keyed",
        1,
        JAVA_MURMUR2.len() as i64,
    );
    assert_eq!(mirror.stop().code(), Some(0));
    let placed = keys_by_partition(
        &clusters.dst(),
        "keyed",
        target_partitions,
        JAVA_MURMUR2.len(),
    );
    for (key, hash) in JAVA_MURMUR2 {
        // Java's DefaultPartitioner: Utils.toPositive(murmur2(key)) % numPartitions.
        let java_partition = ((*hash as u32 & 0x7fff_ffff) % target_partitions as u32) as i32;
        assert_eq!(
            placed.get(*key),
            Some(&java_partition),
            "key {key}: {placed:?}"
        );
    }
    let distinct: std::collections::HashSet<_> = placed.values().collect();
    assert!(distinct.len() > 1, "all keys in one partition: {placed:?}");
}

fn keys_by_partition(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> std::collections::HashMap<String, i32> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "keys")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = std::collections::HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while out.len() < expected && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let key = String::from_utf8_lossy(m.key().unwrap()).into_owned();
            out.insert(key, m.partition());
        }
    }
    out
}

#[test]
fn preserve_partitioning_with_too_few_target_partitions_is_a_clear_error() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.source.create_topic("wide", 4, 1).unwrap();
    clusters.target.create_topic("wide", 2, 1).unwrap();
    write_samples(&clusters.src(), "wide", 0..40, 4, 50).unwrap();
    let mut mirror = clusters.mirror().whitelist("wide").startup_ms(3000).start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    // The mock cluster cannot add partitions (no CreatePartitions), so the mirror stops
    // before fetching and says what to do.
    assert!(
        log.contains("target topic wide has 2 partitions and source topic wide has 4")
            && log.contains("--partitioning hash"),
        "log:\n{log}"
    );
    let committed = committed(&clusters.src(), "wide", 4);
    assert!(committed[2] <= 0 && committed[3] <= 0, "{committed:?}");
}

/// Two instances in one group: one starts, a second joins, the first leaves, while a writer
/// keeps records arriving through both hand-overs. Returns the comparison of source and target.
fn two_instances_while_records_arrive(strategy: &str) -> Comparison {
    let clusters = MockPair::new(TOPIC, 8);
    let instance = clusters
        .mirror()
        .consumer(&[("partition.assignment.strategy", strategy)])
        .commit_ms(300);
    clusters.write(0..4000);
    let mut a = instance.start();
    wait_committed(&mut a, &clusters.src(), TOPIC, 8, 4000);
    let writer = clusters.trickle(4000, 80);
    let mut b = instance.start();
    wait_until(
        Duration::from_secs(30),
        "the second instance to get partitions",
        || b.log().contains("assigned") && b.log().contains("orders/"),
    );
    assert_eq!(a.stop().code(), Some(0), "log A:\n{}", a.log());
    let written = writer.stop();
    wait_committed(&mut b, &clusters.src(), TOPIC, 8, written as i64);
    assert_eq!(b.stop().code(), Some(0), "log B:\n{}", b.log());
    let c = clusters.compare();
    assert_eq!(c.source, written);
    assert_eq!(
        (c.lost, c.changed),
        (0, 0),
        "{c:?}\nlog A:\n{}\nlog B:\n{}",
        a.log(),
        b.log()
    );
    assert!(c.in_order, "{c:?}");
    eprintln!(
        "hand-overs ({strategy}) on the mock cluster while records arrive: {} records, 0 lost, {} duplicated",
        c.source, c.duplicated
    );
    c
}

// While a group rebalances, librdkafka's mock cluster refuses offset commits
// (REBALANCE_IN_PROGRESS, then ILLEGAL_GENERATION for the revoking member's commit); Kafka
// accepts them from the current generation. So on the mock, records mirrored while a member
// joins can be mirrored again by their next owner: duplicates, never loss.

#[test]
fn two_instances_cooperative_sticky_lose_nothing() {
    two_instances_while_records_arrive("cooperative-sticky");
}

#[test]
fn two_instances_eager_range_lose_nothing() {
    two_instances_while_records_arrive("range");
}

#[test]
fn a_clean_stop_hands_its_partitions_over_exactly() {
    // The stopping instance flushes and commits in a stable group before it leaves, and the
    // survivor keeps its own partitions (cooperative), so no commit meets a rebalance: the
    // survivor starts exactly after what reached the target.
    let clusters = MockPair::new(TOPIC, 8);
    let instance = clusters
        .mirror()
        .consumer(&[("partition.assignment.strategy", "cooperative-sticky")])
        .commit_ms(300);
    clusters.write(0..4000);
    let mut a = instance.start();
    wait_committed(&mut a, &clusters.src(), TOPIC, 8, 4000);
    let mut b = instance.start();
    // Not a bound on the hand-over: on the mock a start waits out an unanswered
    // DescribeConfigs (1 s) and a cooperative join takes two rounds.
    wait_until(
        Duration::from_secs(60),
        "the second instance to get partitions",
        || b.log().contains("assigned") && b.log().contains("orders/"),
    );
    let writer = clusters.trickle(4000, 80);
    let src = clusters.src();
    let progress = |past: i64| {
        let src = &src;
        move || committed_total(src, TOPIC, 8) > past
    };
    wait_until(
        Duration::from_secs(30),
        "records written after the join mirrored",
        progress(4000),
    );
    assert_eq!(a.stop().code(), Some(0), "log A:\n{}", a.log());
    let at_stop = committed_total(&clusters.src(), TOPIC, 8);
    wait_until(
        Duration::from_secs(30),
        "the survivor to mirror records written after the stop",
        progress(at_stop),
    );
    let written = writer.stop();
    wait_committed(&mut b, &clusters.src(), TOPIC, 8, written as i64);
    assert_eq!(b.stop().code(), Some(0), "log B:\n{}", b.log());
    let c = clusters.compare();
    assert_eq!(c.source, written);
    assert!(
        c.is_exact(),
        "{c:?}\nlog A:\n{}\nlog B:\n{}",
        a.log(),
        b.log()
    );
}

#[test]
fn the_demo_mirrors_and_verifies() {
    let out = binary()
        .args(["demo", "--records", "20000", "--partitions", "4"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("lost                     0"), "{stdout}");
    assert!(stdout.contains("OK: nothing lost"), "{stdout}");
}

/// The partitions of `topic` on `bootstrap`, asked without auto-creation (0: no such topic).
fn partition_count(bootstrap: &str, topic: &str) -> usize {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .set("log_level", "3")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len())
}

/// Asking the target whether the topic exists must not create it with the
/// broker's defaults (the mock auto-creates unknown topics with 4 partitions, as Kafka does
/// with auto.create.topics.enable=true); the mirror creates it like the source. The mock has
/// no CreateTopics, so the mirror's creation is refused there and it stops saying so.
#[test]
fn a_missing_target_topic_is_created_like_the_source_not_auto_created_by_the_probe() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.source.create_topic("single", 1, 1).unwrap();
    write_samples(&clusters.src(), "single", 0..10, 1, 50).unwrap();
    let mut mirror = clusters
        .mirror()
        .whitelist("single")
        .target_topic("z.{topic}")
        .startup_ms(3000)
        .start();
    wait_until(
        Duration::from_secs(30),
        "the mirror to stop, or z.single to be auto-created",
        || !mirror.is_running() || partition_count(&clusters.dst(), "z.single") > 1,
    );
    let have = partition_count(&clusters.dst(), "z.single");
    if mirror.is_running() {
        mirror.stop();
    }
    let log = mirror.log();
    assert!(
        have <= 1,
        "z.single was auto-created with {have} partitions; log:\n{log}"
    );
    assert!(
        log.contains("cannot create target topic z.single (1 partition,"),
        "the mirror did not ask to create the topic; log:\n{log}"
    );
}

/// A clean stop of a process with several streams commits everything in the
/// final commits; releasing the partitions afterwards (the streams leaving the group one by
/// one, which the mock answers with REBALANCE_IN_PROGRESS to the later ones) has nothing left
/// to commit, so no warning promises duplicates that cannot happen.
#[test]
fn a_clean_stop_with_several_streams_warns_of_no_duplicates() {
    let clusters = MockPair::new(TOPIC, 8);
    clusters.write(0..3000);
    let mut mirror = clusters.mirror().streams(8).commit_ms(300).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 8, 3000);
    // A stable group (no rebalance for 2 s): the mock refuses commits while one is under way,
    // which is another matter (docs/testing.md).
    let rebalances = |log: &str| {
        log.lines()
            .filter(|l| l.contains("assigned") || l.contains("released"))
            .count()
    };
    let (mut seen, mut since) = (rebalances(&mirror.log()), std::time::Instant::now());
    wait_until(Duration::from_secs(30), "a stable group", || {
        let now = rebalances(&mirror.log());
        if now != seen {
            (seen, since) = (now, std::time::Instant::now());
        }
        since.elapsed() >= Duration::from_secs(2)
    });
    let writer = clusters.trickle(3000, 40);
    wait_until(
        Duration::from_secs(30),
        "records written after the group settled mirrored",
        || committed_total(&clusters.src(), TOPIC, 8) > 3000,
    );
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    let written = writer.stop();
    let log = mirror.log();
    let committed = clusters.committed();
    let total: i64 = committed.iter().sum();
    assert!(total > 3000 && total <= written as i64, "{log}");
    // What is true: every record mirrored is committed (the final commits), so a restart
    // mirrors nothing again, whatever the releases after them met.
    let mirrored: Vec<i64> = (0..8)
        .map(|p| clusters.target_records(TOPIC, p).len() as i64)
        .collect();
    assert_eq!(committed, mirrored, "{log}");
    // The stop itself warns of nothing (librdkafka may warn earlier of timer commits the mock
    // refused while the group formed).
    let stop = log.find("SIGTERM: stopping").expect("the stop");
    assert!(!log[stop..].contains("WARN"), "{log}");
    assert!(!log.contains("duplicates"), "{log}");
}

/// The producer's client-side `message.max.bytes` (librdkafka's default: 1 MB)
/// must not refuse a record that the target topic takes (Kafka's default topic
/// `max.message.bytes` is 1,048,588; a topic created with the source's value takes whatever
/// the source topic holds): the target topic's limit is the one that bounds.
#[test]
fn a_record_larger_than_librdkafkas_default_message_max_bytes_is_mirrored() {
    let clusters = MockPair::new(TOPIC, 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .set("message.max.bytes", "3000000")
        .create()
        .unwrap();
    for i in 0..3 {
        let value = vec![b'x'; if i == 1 { 1_500_000 } else { 100 }];
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::<str, [u8]>::to(TOPIC)
                    .partition(0)
                    .key(&key)
                    .payload(&value),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut mirror = clusters.mirror().commit_ms(300).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 3);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = clusters.compare();
    assert!(c.is_exact() && c.source == 3, "{c:?}");
}

/// A record larger than the producer queue's byte limit
/// (`queue.buffering.max.kbytes`) can never be queued; it is refused with a clear error
/// (abort mode: the mirror stops, committed before it) instead of being retried for ever.
#[test]
fn a_record_larger_than_the_producer_queue_is_refused_not_retried_for_ever() {
    let clusters = MockPair::new(TOPIC, 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .set("message.max.bytes", "3000000")
        .create()
        .unwrap();
    for i in 0..3 {
        let value = vec![b'x'; if i == 1 { 1_500_000 } else { 100 }];
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::<str, [u8]>::to(TOPIC)
                    .partition(0)
                    .key(&key)
                    .payload(&value),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.kbytes", "1000")])
        .commit_ms(300)
        .start();
    let status = mirror.wait(Duration::from_secs(40));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("orders/0 offset 1") && last.contains("queue.buffering.max.kbytes"),
        "the last line names the record and the limit: {last}"
    );
    assert_eq!(clusters.committed(), vec![1]);
}

/// Records the source's retention deleted before the mirror read them (offset
/// out of range, reset to earliest: librdkafka only logs it) are reported: a warning naming
/// the partition and the offsets skipped, and `mirror_records_skipped_total{reason}`. The mock
/// keeps about 5 MB per partition: a mirror stopped after committing, then a larger backlog,
/// then the mirror again.
/// Writes `n` records of `size` bytes into partition 0, waiting out a full queue.
fn write_sized(clusters: &MockPair, n: usize, size: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let value = vec![b'r'; size];
    for i in 0..n {
        let key = format!("k{i}");
        loop {
            let record = BaseRecord::<str, [u8]>::to(TOPIC)
                .partition(0)
                .key(&key)
                .payload(&value);
            match producer.send(record) {
                Ok(()) => break,
                Err(_) => {
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Mirrors 100 records, then writes 12 MB more so that the mock's retention deletes offsets
/// 100 and up before the next mirror reads them; returns the partition's low watermark.
fn a_gap_the_source_retention_made(clusters: &MockPair) -> i64 {
    write_sized(clusters, 100, 100);
    clusters.mirror_until_committed(&[], 100);
    assert_eq!(clusters.committed(), vec![100]);
    write_sized(clusters, 1200, 10_000);
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    let (low, _) =
        rdkafka::consumer::Consumer::fetch_watermarks(&consumer, TOPIC, 0, Duration::from_secs(10))
            .unwrap();
    assert!(low > 100, "the mock kept offset 100 (low watermark {low})");
    low
}

/// `--on.source.gap abort`: records the source's retention deleted before they were mirrored
/// stop the mirror (exit 1) with a line naming the topic, partition and offsets lost, and
/// nothing past the gap is committed or copied.
#[test]
fn on_source_gap_abort_stops_at_records_deleted_before_they_were_mirrored() {
    let clusters = MockPair::new(TOPIC, 1);
    let low = a_gap_the_source_retention_made(&clusters);
    let on_target = clusters.target_records(TOPIC, 0).len();
    let mut mirror = clusters
        .mirror()
        .commit_ms(100)
        .flag("--on.source.gap", "abort")
        .start();
    let status = mirror.wait(Duration::from_secs(60));
    let log = mirror.log();
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let expected = format!("{TOPIC}/0 offsets 100 to {}", low - 1);
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains(&expected) && l.contains("--on.source.gap")),
        "no error naming {expected}:\n{log}"
    );
    assert_eq!(clusters.committed(), vec![100], "committed past the gap");
    assert_eq!(
        clusters.target_records(TOPIC, 0).len(),
        on_target,
        "records after the gap were copied"
    );
}

#[test]
fn records_deleted_by_retention_before_they_were_mirrored_are_logged_and_counted() {
    let clusters = MockPair::new(TOPIC, 1);
    let low = a_gap_the_source_retention_made(&clusters);
    let addr = free_local_addr();
    let mut mirror = clusters.mirror().commit_ms(300).metrics_addr(&addr).start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 1300);
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    let expected = format!("{TOPIC}/0 offsets 100 to {}", low - 1);
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&expected) && l.contains("retention")),
        "no warning naming {expected}:\n{log}"
    );
    assert_eq!(
        metric(
            &body,
            "mirror_records_skipped_total",
            "reason=\"retention\""
        ),
        Some((low - 100) as f64),
        "{body}"
    );
}

/// A target that does not answer while a new topic is assigned (a rolling
/// restart) is a transient error for `--create.topics`: retried with backoff inside the
/// rebalance callback (bounded by a third of `max.poll.interval.ms`, 10 s here), not fatal.
#[test]
fn a_transient_metadata_failure_while_making_target_topics_is_retried_not_fatal() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..100);
    let mut mirror = clusters
        .mirror()
        .consumer(&[("max.poll.interval.ms", "30000")])
        .whitelist("orders.*")
        .commit_ms(300)
        .topic_refresh_ms(500)
        .startup_ms(1500)
        .create_topics()
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 100);
    clusters.target.create_topic("orders.late", 2, 1).unwrap();
    clusters.target.broker_down(1).unwrap();
    clusters.source.create_topic("orders.late", 2, 1).unwrap();
    write_samples(&clusters.src(), "orders.late", 0..200, 2, 50).unwrap();
    // The assignment of orders.late finds the target down for a few seconds.
    wait_until(
        Duration::from_secs(30),
        "the assignment of orders.late",
        || mirror.log().contains("orders.late/") || !mirror.is_running(),
    );
    mirror.wait_for_log("retrying", "a retry while the target is down");
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), "orders.late", 2, 200);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert!(log.contains("retrying"), "log:\n{log}");
    let c = compare_topic(&clusters.src(), &clusters.dst(), "orders.late", 2).unwrap();
    assert!(c.is_exact() && c.source == 200, "{c:?}");
}

/// A target topic deleted while the mirror runs (`--create.topics true`) is
/// created again, and the records that could not be sent are mirrored again, in order,
/// instead of failing the mirror. The mock cannot delete a topic nor create one: the topic's
/// metadata reports UNKNOWN_TOPIC_OR_PART (the producer then refuses records for it), with
/// the target down so that the mirror's first attempts to create it again fail (transient);
/// the test then clears the error ("created") and brings the target back.
#[test]
#[ignore = "flaky (failed 1 run in 6 here, and in a CI run): now and then librdkafka never \
            refuses the records queued while the target is down, so nothing is missing within \
            the minute (a timing of its metadata states the test does not control); on Kafka \
            kafka_batches::a_target_topic_deleted_while_the_record_engine_runs_is_created_again \
            proves the promise"]
fn a_target_topic_deleted_while_running_is_created_again_and_nothing_is_lost() {
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..100);
    let mut mirror = clusters
        .mirror()
        .consumer(&[("max.poll.interval.ms", "30000")])
        .producer(&[
            ("topic.metadata.refresh.interval.ms", "500"),
            // librdkafka waits this long after a topic's state changed before it believes a
            // metadata answer that says it is gone (or back).
            ("topic.metadata.propagation.max.ms", "1000"),
        ])
        .commit_ms(300)
        .startup_ms(1500)
        .create_topics()
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 100);
    // "Deleted": the producer learns it at its next metadata refresh.
    clusters
        .target
        .topic_error(
            TOPIC,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        )
        .unwrap();
    // Not a condition one can watch: the producer's metadata refresh (every 500 ms) that
    // learns the topic is gone is invisible outside the process; 3 s is six of them.
    std::thread::sleep(Duration::from_secs(3));
    clusters.target.broker_down(1).unwrap();
    clusters.write(100..300);
    mirror.wait_for_log("is missing", "the mirror to notice the missing topic");
    // Not a condition: the target stays down a while longer, so that the mirror's first
    // attempts to create the topic again fail (transient) before it comes back.
    std::thread::sleep(Duration::from_secs(2));
    // "Created again".
    clusters
        .target
        .topic_error(TOPIC, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 300);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert!(
        log.contains("mirroring orders/0 again from offset 100"),
        "log:\n{log}"
    );
    let c = clusters.compare();
    assert_eq!((c.lost, c.changed, c.source), (0, 0, 300), "{c:?}");
    assert!(c.in_order, "{c:?}");
}

/// A message handler that fails on record k stops the mirror with the group's commit at k,
/// never past it: the consumer's position is past k when the handler fails, and the commit
/// made in the same turn of the loop (here every 1 ms) must not follow it. Each round writes
/// the failing record only once everything before it is mirrored and committed (the window
/// in which the position alone would move the commit point), and the next round's handler
/// lets it through, so a round that committed past it would have lost it.
#[test]
fn a_failing_handler_never_lets_the_commit_pass_its_record() {
    let clusters = MockPair::new(TOPIC, 1);
    let lib = build_plugin("faulty-handler");
    let lib = lib.to_str().unwrap();
    clusters.write(0..2000);
    for round in 0..3_i64 {
        let k = 2000 + round;
        let args = format!("error-at={k}");
        let mut mirror = clusters
            .mirror()
            .args(&["--message.handler", lib, "--message.handler.args", &args])
            .commit_ms(1)
            .start();
        wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, k);
        clusters.write(k as u64..k as u64 + 1);
        let status = mirror.wait(Duration::from_secs(60));
        let log = mirror.log();
        assert_eq!(status.code(), Some(1), "round {round}; log:\n{log}");
        assert!(
            log.contains(&format!("{TOPIC}/0 offset {k}")),
            "round {round}: the failure names the record; log:\n{log}"
        );
        assert_eq!(
            clusters.committed(),
            vec![k],
            "round {round}: committed past the record the handler failed on; log:\n{log}"
        );
    }
}

/// `--whitelist '.*'` never copies an offset-mapping store: in a chain X → Y → Z with default
/// names, the Y → Z mirror would copy the X → Y mirror's store on Y into its own store on Z.
#[test]
fn a_dot_star_whitelist_never_copies_a_store_into_the_mirrors_own_store() {
    const STORE: &str = "mirror-maker.offsets.source";
    let clusters = MockPair::new(TOPIC, 2);
    clusters.source.create_topic(STORE, 1, 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    producer
        .send(
            BaseRecord::<str, str>::to(STORE)
                .key("from-the-first-mirror")
                .payload("{}"),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    clusters.write(0..200);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &clusters.src(), &clusters.dst(), &[], &[]);
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(".*")
        .commit_ms(300)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 2, 200);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert_eq!(
        log.matches(&format!("not mirroring source topic {STORE}"))
            .count(),
        1,
        "one warning; log:\n{log}"
    );
    let copied = records(&clusters.dst(), STORE, 0)
        .into_iter()
        .filter(|r| r.key.as_deref() == Some(b"from-the-first-mirror".as_slice()))
        .count();
    assert_eq!(copied, 0, "the source's store was copied into the target's");
}

/// Header bytes count toward `queue.buffering.max.kbytes`'s in-flight bound (half of it, per
/// stream): records that are nearly all headers, about 10 KB each with an empty key and value,
/// stop being consumed after about 53 of them wait for a target that is down (1 MiB queue,
/// 512 KiB bound), not after the record-count bound.
#[test]
fn header_bytes_count_toward_the_in_flight_byte_bound() {
    use rdkafka::message::{Header, OwnedHeaders};
    let clusters = MockPair::new(TOPIC, 1);
    clusters.write(0..10);
    let mut mirror = clusters
        .mirror()
        .producer(&[("queue.buffering.max.kbytes", "1024")])
        .commit_ms(300)
        .start();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 10);
    clusters.target.broker_down(1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", clusters.src())
        .create()
        .unwrap();
    let value = vec![b'h'; 1000];
    for _ in 0..300 {
        let mut headers = OwnedHeaders::new();
        for h in 0..10 {
            headers = headers.insert(Header {
                key: &format!("h{h}"),
                value: Some(&value),
            });
        }
        producer
            .send(BaseRecord::<[u8], [u8]>::to(TOPIC).headers(headers))
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    // The stream pauses once the wait for acknowledgements nears max.poll.interval.ms (3.3 s),
    // saying how much it holds.
    wait_until(Duration::from_secs(60), "the stream to pause", || {
        mirror.log().contains("pausing consumption") || !mirror.is_running()
    });
    let log = mirror.log();
    let held = log
        .lines()
        .find_map(|l| {
            let rest = l.split("the target has not acknowledged ").nth(1)?;
            rest.split(' ').next()?.parse::<u64>().ok()
        })
        .unwrap_or_else(|| panic!("no pause for unacknowledged records; log:\n{log}"));
    eprintln!("paused with {held} header-heavy records in flight");
    assert!(
        held <= 60,
        "{held} records of 10 KB headers in flight, past the 512 KiB bound; log:\n{log}"
    );
    clusters.target.broker_up(1).unwrap();
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 1, 310);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = clusters.compare();
    assert_eq!((c.lost, c.changed, c.source), (0, 0, 310), "{c:?}");
}
