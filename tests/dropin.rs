//! Drop-in for Java MirrorMaker users, on librdkafka's mock clusters: the settings a Java
//! deployment brings (its `.properties` files, its flags) and the KIP-848 group protocol.

use mirror_test_harness::*;

const TOPIC: &str = "orders";

/// `group.protocol=consumer` (KIP-848): the broker assigns the partitions. The mock cluster
/// speaks the protocol (ConsumerGroupHeartbeat), so the mirror runs end to end.
#[test]
fn a_mirror_in_a_kip_848_group_copies_everything() {
    let clusters = MockPair::new(TOPIC, 4);
    clusters.write(0..1000);
    let dir = tempdir();
    // Not the harness's FAST_GROUP: session and heartbeat are the broker's under KIP-848.
    let c = write_config(
        dir.path(),
        "consumer.toml",
        &clusters.src(),
        &[
            ("group.id", GROUP),
            ("group.protocol", "consumer"),
            ("fetch.wait.max.ms", "10"),
        ],
    );
    let p = write_config(dir.path(), "producer.toml", &clusters.dst(), &[]);
    let mut mirror = Mirror::start(&c, &p, TOPIC, &["--offset.commit.interval.ms", "300"]);
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 4, 1000);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let c = clusters.compare();
    assert!(c.source == 1000 && c.is_exact(), "{c:?}");
}

/// A consumer.properties as a Java MirrorMaker deployment has it: Kafka's
/// config/consumer.properties template, what MirrorMaker's docs add, and pre-0.9 leftovers.
fn java_consumer_properties(bootstrap: &str) -> String {
    format!(
        "# Kafka's config/consumer.properties\n\
         bootstrap.servers={bootstrap}\n\
         group.id={GROUP}\n\
         #consumer.timeout.ms=5000\n\
         # MirrorMaker's consumer\n\
         enable.auto.commit=false\n\
         auto.offset.reset=smallest\n\
         partition.assignment.strategy=org.apache.kafka.clients.consumer.RoundRobinAssignor\n\
         key.deserializer=org.apache.kafka.common.serialization.ByteArrayDeserializer\n\
         value.deserializer=org.apache.kafka.common.serialization.ByteArrayDeserializer\n\
         exclude.internal.topics=true\n\
         client.id=mirror-maker\n\
         security.protocol=PLAINTEXT\n\
         fetch.max.wait.ms=10\n\
         max.poll.records=500\n\
         receive.buffer.bytes=-1\n\
         session.timeout.ms=6000\n\
         heartbeat.interval.ms=500\n\
         max.poll.interval.ms=10000\n\
         # pre-0.9 (Scala consumer) leftovers\n\
         zookeeper.connect=localhost:2181\n\
         zookeeper.connection.timeout.ms=6000\n\
         offsets.storage=kafka\n\
         dual.commit.enabled=false\n"
    )
}

/// Kafka's config/producer.properties with what MirrorMaker sets for its producer.
fn java_producer_properties(bootstrap: &str) -> String {
    format!(
        "bootstrap.servers={bootstrap}\n\
         compression.type=none\n\
         #partitioner.class=\n\
         key.serializer=org.apache.kafka.common.serialization.ByteArraySerializer\n\
         value.serializer=org.apache.kafka.common.serialization.ByteArraySerializer\n\
         acks=all\n\
         retries=2147483647\n\
         max.block.ms=9223372036854775807\n\
         max.in.flight.requests.per.connection=1\n\
         delivery.timeout.ms=2147483647\n\
         buffer.memory=33554432\n\
         batch.size=16384\n\
         linger.ms=5\n\
         send.buffer.bytes=131072\n\
         request.timeout.ms=30000\n\
         max.request.size=1048576\n"
    )
}

#[test]
fn java_mirror_maker_properties_files_and_whitelist_work_unchanged() {
    let clusters = MockPair::new(TOPIC, 4).with_target_topics(&["payments"]);
    clusters.source.create_topic("payments", 4, 1).unwrap();
    clusters.write(0..600);
    write_samples(&clusters.src(), "payments", 0..400, 4, 100).unwrap();
    let dir = tempdir();
    let c = dir.path().join("consumer.properties");
    let p = dir.path().join("producer.properties");
    std::fs::write(&c, java_consumer_properties(&clusters.src())).unwrap();
    std::fs::write(&p, java_producer_properties(&clusters.dst())).unwrap();
    let mut mirror = Mirror::start(
        &c,
        &p,
        "'orders, payments'",
        &["--num.streams", "2", "--offset.commit.interval.ms", "300"],
    );
    wait_committed(&mut mirror, &clusters.src(), TOPIC, 4, 600);
    wait_committed(&mut mirror, &clusters.src(), "payments", 4, 400);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    // Exact, unless the group refused a commit before a release: librdkafka's mock cluster
    // refuses commits while a join is under way (Kafka accepts them from the current
    // generation), and the mirror then says that the next owner copies those partitions again
    // (at least once: duplicates, never a loss). Seen once in a CI run, two streams joining.
    let refused = log.contains("commit before releasing");
    for (topic, records) in [(TOPIC, 600), ("payments", 400)] {
        let c = compare_topic(&clusters.src(), &clusters.dst(), topic, 4).unwrap();
        assert!(
            c.source == records
                && c.lost == 0
                && c.changed == 0
                && c.in_order
                && (c.duplicated == 0 || refused),
            "{topic}: {c:?}, log:\n{log}"
        );
    }
    // Each Java-only key is named once, at warn, with its file.
    for (key, file) in [
        ("offsets.storage", "consumer.properties"),
        ("zookeeper.connect", "consumer.properties"),
        ("key.deserializer", "consumer.properties"),
        ("max.poll.records", "consumer.properties"),
        ("buffer.memory", "producer.properties"),
        ("max.block.ms", "producer.properties"),
        ("value.serializer", "producer.properties"),
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("ignoring Java client key `{key}`")))
            .collect();
        assert_eq!(lines.len(), 1, "{key}: {lines:?}\n{log}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains(file),
            "{}",
            lines[0]
        );
    }
}
