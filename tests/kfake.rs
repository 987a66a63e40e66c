//! End to end against kfake (franz-go's in-memory cluster, tests/peers/kfake), an independent
//! Kafka implementation: one broker as the source, one as the target. Completion is judged
//! from committed offsets and records are read until quiet, as on any peer whose watermarks
//! the suite does not vouch for (docs/testing.md).

use std::time::Duration;

use mirror_maker::tools::compare::{read_until_quiet, OwnedRecord as Record};
use mirror_maker::tools::demo::sample;

use mirror_test_harness::*;

const TOPIC: &str = "events";
const PARTITIONS: i32 = 2;

fn records_quiet(bootstrap: &str, partition: i32) -> Vec<Record> {
    read_until_quiet(bootstrap, TOPIC, partition, Duration::from_secs(3)).unwrap()
}

#[test]
fn every_field_is_copied_and_a_restarted_mirror_resumes_from_its_commits() {
    let source = Kfake::start("source");
    let target = Kfake::start("target");
    create_topic(&source.bootstrap, TOPIC, PARTITIONS);
    create_topic(&target.bootstrap, TOPIC, PARTITIONS);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &source.bootstrap, &target.bootstrap, &[], &[]);
    let mirror = Mirror::with_configs(&c, &p).whitelist(TOPIC).commit_ms(300);

    write_samples(&source.bootstrap, TOPIC, 0..600, PARTITIONS, 40).unwrap();
    let mut first = mirror.start();
    wait_committed(&mut first, &source.bootstrap, TOPIC, PARTITIONS, 600);
    assert_eq!(first.stop().code(), Some(0), "log:\n{}", first.log());

    // Records written while no mirror runs are picked up from the committed offsets.
    write_samples(&source.bootstrap, TOPIC, 600..1200, PARTITIONS, 40).unwrap();
    let mut second = mirror.start();
    wait_committed(&mut second, &source.bootstrap, TOPIC, PARTITIONS, 1200);
    assert_eq!(second.stop().code(), Some(0), "log:\n{}", second.log());
    assert_eq!(
        committed(&source.bootstrap, TOPIC, PARTITIONS),
        vec![600, 600]
    );

    for partition in 0..PARTITIONS {
        let from = records_quiet(&source.bootstrap, partition);
        let to = records_quiet(&target.bootstrap, partition);
        assert_eq!(from.len(), 600, "source partition {partition}");
        // The sample data has null keys, tombstones, repeated and null-valued headers and
        // explicit timestamps; the target must hold the same records, field by field, in order.
        assert!(from.iter().any(|r| r.key.is_none()));
        assert!(from.iter().any(|r| r.value.is_none()));
        assert!(from
            .iter()
            .any(|r| r.headers.iter().filter(|(k, _)| k == "hop").count() == 2));
        for (i, (a, b)) in from.iter().zip(&to).enumerate() {
            assert_eq!(a, b, "partition {partition}, record {i}");
        }
        assert_eq!(
            to.len(),
            from.len(),
            "partition {partition}: target has a different count"
        );
    }
    // The generator is what the records were made from: the first one is as written.
    let s = sample(0, PARTITIONS, 40);
    let first_record = &records_quiet(&target.bootstrap, 0)[0];
    assert_eq!(first_record.timestamp, Some(s.timestamp));
    assert_eq!(first_record.value, s.value);
}

#[test]
fn a_message_handler_renames_and_tags_records_on_kfake() {
    let source = Kfake::start("plugin-source");
    let target = Kfake::start("plugin-target");
    create_topic(&source.bootstrap, TOPIC, PARTITIONS);
    create_topic(&target.bootstrap, "eu.events", PARTITIONS);
    let lib = build_plugin("rename-handler");
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &source.bootstrap, &target.bootstrap, &[], &[]);
    write_samples(&source.bootstrap, TOPIC, 0..400, PARTITIONS, 40).unwrap();
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(TOPIC)
        .commit_ms(300)
        .handler(&lib, "topic=eu.{topic};header=mirror-source:kfake")
        .start();
    wait_committed(&mut mirror, &source.bootstrap, TOPIC, PARTITIONS, 400);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    for partition in 0..PARTITIONS {
        let expected: Vec<Record> = records_quiet(&source.bootstrap, partition)
            .into_iter()
            .map(|mut r| {
                r.headers
                    .push(("mirror-source".to_owned(), Some(b"kfake".to_vec())));
                r
            })
            .collect();
        let got = read_until_quiet(
            &target.bootstrap,
            "eu.events",
            partition,
            Duration::from_secs(3),
        )
        .unwrap();
        assert_eq!(got, expected, "partition {partition}");
    }
}

/// The default engine on an independent implementation: `--copy.mode auto` copies record
/// batches as they are (the batch engine's own Fetch, idempotent Produce and batch codec),
/// and the target holds the source's records field by field, in order.
#[test]
fn the_default_batch_engine_copies_every_field_on_kfake() {
    let source = Kfake::start("default-source");
    let target = Kfake::start("default-target");
    create_topic(&source.bootstrap, TOPIC, PARTITIONS);
    create_topic(&target.bootstrap, TOPIC, PARTITIONS);
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), &source.bootstrap, &target.bootstrap, &[], &[]);
    write_samples(&source.bootstrap, TOPIC, 0..200, PARTITIONS, 40).unwrap();
    let mut mirror = Mirror::with_configs(&c, &p)
        .whitelist(TOPIC)
        .commit_ms(300)
        .default_copy_mode()
        .start();
    wait_committed(&mut mirror, &source.bootstrap, TOPIC, PARTITIONS, 200);
    assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
    let log = mirror.log();
    assert!(
        log.contains("copying record batches as they are (--copy.mode auto)"),
        "the batch engine chosen:\n{log}"
    );
    for partition in 0..PARTITIONS {
        let from = records_quiet(&source.bootstrap, partition);
        assert_eq!(from.len(), 100, "source partition {partition}");
        assert_eq!(
            records_quiet(&target.bootstrap, partition),
            from,
            "partition {partition}"
        );
    }
}
