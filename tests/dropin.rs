//! Drop-in for Java MirrorMaker users, on librdkafka's mock clusters: the settings a Java
//! deployment brings (its `.properties` files, its flags) and the KIP-848 group protocol.

mod common;

use common::*;

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
