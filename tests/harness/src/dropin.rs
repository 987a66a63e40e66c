//! The files a Java MirrorMaker deployment brings to a drop-in replacement: its
//! `consumer.properties` and `producer.properties` as Kafka's templates and MirrorMaker's
//! docs have them (used by `tests/dropin.rs` on mock clusters and `tests/kafka_trials.rs` on
//! Apache Kafka, with both copy engines).

/// The Java-only keys of [`java_consumer_properties`] and [`java_producer_properties`] the
/// mirror warns of (once each, at warn, naming the file): a sample of each kind.
pub const JAVA_ONLY_KEYS: &[(&str, &str)] = &[
    ("offsets.storage", "consumer.properties"),
    ("zookeeper.connect", "consumer.properties"),
    ("key.deserializer", "consumer.properties"),
    ("max.poll.records", "consumer.properties"),
    ("buffer.memory", "producer.properties"),
    ("max.block.ms", "producer.properties"),
    ("value.serializer", "producer.properties"),
];

/// Asserts that each of [`JAVA_ONLY_KEYS`] is named once in `log`, at warn, with its file.
pub fn assert_java_keys_warned_once(log: &str) {
    for (key, file) in JAVA_ONLY_KEYS {
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

/// A consumer.properties as a Java MirrorMaker deployment has it: Kafka's
/// config/consumer.properties template, what MirrorMaker's docs add, and pre-0.9 leftovers.
pub fn java_consumer_properties(bootstrap: &str, group: &str) -> String {
    format!(
        "# Kafka's config/consumer.properties\n\
         bootstrap.servers={bootstrap}\n\
         group.id={group}\n\
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
pub fn java_producer_properties(bootstrap: &str) -> String {
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
