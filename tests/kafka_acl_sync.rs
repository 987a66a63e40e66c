//! `--sync.topic.acls` on Apache Kafka 4 with `StandardAuthorizer`: the source's ALLOW ACLs
//! on mirrored topics reach the target (renamed by `--target.topic`; WRITE dropped, ALL made
//! READ), an ACL made by hand on the target survives every round, and an ACL removed on the
//! source is removed from the target within a round, or, removed while the mirror was down,
//! in the first round after a restart (the record of what the sync made is read at start);
//! with both copy engines. A principal the source refuses a topic (DENY) is refused its copy
//! on the target, where another principal reads it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const TOPIC: &str = "orders";
const INTERVAL_MS: u64 = 2000;
/// Both clusters authorize; the harness's PLAINTEXT clients (and the mirror's, here) are
/// `User:ANONYMOUS`, a super user.
const AUTHORIZER: &[(&str, &str)] = &[
    (
        "authorizer.class.name",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    ),
    ("super.users", "User:ANONYMOUS"),
];

/// (pattern type, resource name, principal, operation) of every ALLOW topic ACL, as
/// kafka-acls --list prints them.
fn topic_acls(cluster: &KafkaCluster) -> BTreeSet<(String, String, String, String)> {
    let text = cluster.acls(&["--list"]);
    let mut out = BTreeSet::new();
    let mut resource: Option<(String, String)> = None;
    for line in text.lines() {
        let field = |line: &str, key: &str| {
            line.split(&format!("{key}="))
                .nth(1)
                .map(|rest| rest.split([',', ')']).next().unwrap_or("").to_owned())
        };
        if line.contains("ResourcePattern(") {
            resource = (field(line, "resourceType").as_deref() == Some("TOPIC")).then(|| {
                (
                    field(line, "patternType").unwrap_or_default(),
                    field(line, "name").unwrap_or_default(),
                )
            });
        } else if let (Some((pattern, name)), Some(principal)) =
            (&resource, field(line, "principal"))
        {
            if field(line, "permissionType").as_deref() == Some("ALLOW") {
                out.insert((
                    pattern.clone(),
                    name.clone(),
                    principal,
                    field(line, "operation").unwrap_or_default(),
                ));
            }
        }
    }
    out
}

fn acl(pattern: &str, name: &str, principal: &str, op: &str) -> (String, String, String, String) {
    (pattern.into(), name.into(), principal.into(), op.into())
}

fn add(cluster: &KafkaCluster, principal: &str, op: &str, resource: &[&str]) {
    let mut args = vec!["--add", "--allow-principal", principal, "--operation", op];
    args.extend_from_slice(resource);
    cluster.acls(&args);
}

#[test]
fn source_topic_acls_reach_the_target_and_only_the_syncs_own_are_removed() {
    acls_reach_the_target(CopyMode::Records);
}

#[test]
fn source_topic_acls_reach_the_target_and_only_the_syncs_own_are_removed_with_batches() {
    acls_reach_the_target(CopyMode::Batches);
}

/// The trial, with either engine (each on a pair of its own: both clusters authorize, and
/// the record of what the sync made is the target's).
fn acls_reach_the_target(mode: CopyMode) {
    let started = Instant::now();
    let pair = KafkaPair::with(KAFKA_4, 1, AUTHORIZER, TOPIC, 1, &[]);
    pair.source.create_topic("payments", 1, 1, &[]);
    let (src, dst) = (&pair.source, &pair.target);
    add(src, "User:alice", "Read", &["--topic", TOPIC]);
    add(
        src,
        "User:bob",
        "Read",
        &["--topic", "pay", "--resource-pattern-type", "prefixed"],
    );
    add(src, "User:carol", "Write", &["--topic", TOPIC]);
    // A grant to delete the copy: never the mirror's to give on the target.
    add(
        src,
        "User:ops",
        "Delete",
        &["--topic", "pay", "--resource-pattern-type", "prefixed"],
    );
    add(src, "User:dave", "All", &["--topic", TOPIC]);
    // Made by hand on the target: never the sync's to touch.
    add(dst, "User:ops", "Describe", &["--topic", "primary.orders"]);
    pair.write(0..50);
    let interval = INTERVAL_MS.to_string();
    let flags = [
        "--whitelist",
        "orders|payments",
        "--target.topic",
        "primary.{topic}",
        "--sync.topic.acls",
        "true",
        "--sync.topic.configs.interval.ms",
        &interval,
    ];

    let checked = pair.check(&flags);
    assert!(
        checked.contains(
            "ACL sync: will create READ for User:alice (host *) on LITERAL topic primary.orders"
        ) && checked.contains("READ for User:bob (host *) on topics with PREFIX primary.pay"),
        "{checked}"
    );
    assert!(
        checked.contains("DELETE for User:ops on topics with PREFIX pay is not copied"),
        "{checked}"
    );

    let mut mirror = pair
        .mirror()
        .whitelist("orders|payments")
        .copy_mode(mode)
        .args(&flags[2..])
        .start();
    let wanted = [
        acl("LITERAL", "primary.orders", "User:alice", "READ"),
        acl("PREFIXED", "primary.pay", "User:bob", "READ"),
        acl("LITERAL", "primary.orders", "User:dave", "READ"),
        acl("LITERAL", "primary.orders", "User:ops", "DESCRIBE"),
    ];
    let copy_started = Instant::now();
    let mut seen = topic_acls(dst);
    while !wanted.iter().all(|a| seen.contains(a)) {
        assert!(
            copy_started.elapsed() < Duration::from_secs(90),
            "the source's ACLs not on the target after 90 s: {seen:?}\nlog:\n{}",
            mirror.log()
        );
        std::thread::sleep(Duration::from_millis(200));
        seen = topic_acls(dst);
    }
    let copied_in = copy_started.elapsed();
    let to_target: Vec<_> = seen
        .iter()
        .filter(|(_, name, _, _)| name.starts_with("primary."))
        .cloned()
        .collect();
    assert_eq!(
        to_target,
        wanted
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>(),
        "no WRITE for carol, nothing else: {seen:?}"
    );

    // alice loses her READ on the source: gone from the target within a round; ops's stays.
    src.acls(&[
        "--remove",
        "--force",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--topic",
        TOPIC,
    ]);
    let removed_at = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "alice's READ removed from the target",
        || {
            seen = topic_acls(dst);
            !seen.contains(&wanted[0])
        },
    );
    let removed_in = removed_at.elapsed();
    assert!(
        seen.contains(&wanted[3]),
        "the hand-made ACL survives: {seen:?}"
    );
    assert!(
        seen.contains(&wanted[1]) && seen.contains(&wanted[2]),
        "{seen:?}"
    );
    assert!(
        removed_in < Duration::from_millis(INTERVAL_MS) * 3 + Duration::from_secs(5),
        "removed after {removed_in:?}"
    );
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());

    // While the mirror is down, dave loses his ALL on the source: the next mirror reads what
    // the first one made from the record topic, and removes dave's READ in its first round.
    src.acls(&[
        "--remove",
        "--force",
        "--allow-principal",
        "User:dave",
        "--operation",
        "All",
        "--topic",
        TOPIC,
    ]);
    let mut mirror = pair
        .mirror()
        .whitelist("orders|payments")
        .copy_mode(mode)
        .args(&flags[2..])
        .start();
    let restarted_at = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "dave's READ removed by the restarted mirror",
        || {
            seen = topic_acls(dst);
            !seen.contains(&wanted[2])
        },
    );
    let after_restart = restarted_at.elapsed();
    assert!(
        seen.contains(&wanted[1]) && seen.contains(&wanted[3]),
        "bob's and the hand-made ACL stay: {seen:?}"
    );
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    eprintln!(
        "TRIAL ACL sync kafka 4.4.0 ({}): alice/bob(prefix)/dave copied as READ to primary.*, carol's \
         WRITE not, in {:.1} s; alice's removal followed in {:.1} s; the hand-made ACL kept; \
         dave's, removed while the mirror was down, gone {:.1} s after a restart; {:.0} s in all",
        mode.flag(),
        copied_in.as_secs_f64(),
        removed_in.as_secs_f64(),
        after_restart.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// A DENY travels with the ALLOW it overrides: the source lets every principal read `orders`
/// but `User:intruder`; on the target (SASL PLAIN users, an authorizer), `reader` reads the
/// copy and `intruder` is refused it. Before, only the ALLOW was copied and `intruder` read
/// the copy.
#[test]
fn a_principal_the_source_refuses_a_topic_is_refused_its_copy() {
    let started = Instant::now();
    let users = [("intruder", "intruder-secret"), ("reader", "reader-secret")];
    let pki = TestPki::generate();
    let security = KafkaSecurity {
        listener: SecureListener::SaslSslScram { users: &users },
        pki: &pki,
        authorizer: true,
    };
    let (src, dst) = std::thread::scope(|s| {
        let target = s.spawn(|| {
            KafkaCluster::start_secured(
                KAFKA_4,
                1,
                &[("auto.create.topics.enable", "false")],
                &security,
            )
        });
        let source = KafkaCluster::start_with(KAFKA_4, 1, AUTHORIZER);
        (source, target.join().expect("starting the target cluster"))
    });
    src.create_topic(TOPIC, 1, 1, &[]);
    let lane = Endpoints::lane(&src, &dst, TOPIC, 1);
    lane.write(0..20);
    add(&src, "User:*", "Read", &["--topic", TOPIC]);
    src.acls(&[
        "--add",
        "--deny-principal",
        "User:intruder",
        "--operation",
        "Read",
        "--topic",
        TOPIC,
    ]);
    let flags = [
        "--sync.topic.acls",
        "true",
        "--sync.topic.configs.interval.ms",
        "1000",
    ];
    // The readers' group on the target, by hand (the sync copies topic ACLs only).
    add(&dst, "User:*", "Describe", &["--group", "reader"]);
    let checked = lane.check(&flags);
    let mut mirror = lane.mirror().args(&flags).start();
    lane.wait_caught_up(&mut mirror);
    let mut listed = String::new();
    wait_until(
        Duration::from_secs(60),
        "the source's ALLOW on the target",
        || {
            listed = dst.acls(&["--list", "--topic", TOPIC]);
            listed.contains("principal=User:*")
        },
    );
    assert_eq!(dst.read_as("reader", "reader-secret", TOPIC), Ok(()));
    let refused = dst
        .read_as("intruder", "intruder-secret", TOPIC)
        .expect_err("intruder read the copy of a topic the source refuses it");
    assert!(refused.contains("authorization"), "{refused}");
    assert!(
        listed.contains("principal=User:intruder, host=*, operation=READ, permissionType=DENY"),
        "{listed}"
    );
    assert!(
        checked.contains(
            "ACL sync: will create DENY READ for User:intruder (host *) on LITERAL topic orders"
        ),
        "{checked}"
    );
    assert_eq!(mirror.stop().code(), Some(0), "{}", mirror.log());
    eprintln!(
        "TRIAL ACL sync DENY kafka 4.4.0: User:* READ and User:intruder's DENY READ copied; \
         reader read the copy, intruder refused ({refused}); {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
}
