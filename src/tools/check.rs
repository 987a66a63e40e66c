//! `mirror-maker check`: everything a mirror would need, verified without mirroring. Configs
//! are validated as for a run, both clusters are contacted, and each matching source topic is
//! shown with its target topic and whether the target can take it. Where the clusters say what
//! the mirror's principals may do (DescribeTopics with authorized operations), a source topic
//! it may not READ and a target topic it may not WRITE are problems too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};

use crate::mirror::clients::Cluster;
use crate::mirror::probe::probe;
use crate::native::admin::{authorized_operations, TopicOperations};
use crate::settings::client::ClientProps;
use crate::settings::flags::Partitioning;
use crate::settings::{counted, Settings};

/// What `check` found. `problems` empty means a mirror would start and find every target
/// topic it needs.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for line in &self.lines {
            let _ = writeln!(out, "{line}");
        }
        if self.problems.is_empty() {
            let _ = writeln!(out, "OK: ready to mirror");
        } else {
            for p in &self.problems {
                let _ = writeln!(out, "problem: {p}");
            }
        }
        out
    }
}

fn partitions_by_topic(metadata: &Metadata) -> BTreeMap<String, usize> {
    metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_owned(), t.partitions().len()))
        .collect()
}

/// Reports whether `cluster` answered; its metadata if it did.
fn reached(report: &mut CheckReport, settings: &Settings, cluster: Cluster) -> Option<Metadata> {
    match probe(settings, cluster) {
        Ok(m) => {
            let props = match cluster {
                Cluster::Source => &settings.consumer,
                Cluster::Target => &settings.producer,
            };
            report.lines.push(format!(
                "{} cluster {}: reachable ({})",
                cluster.name(),
                props.get("bootstrap.servers").unwrap_or("?"),
                counted(m.brokers().len(), "broker")
            ));
            Some(m)
        }
        Err(e) => {
            report.problems.push(e.to_string());
            None
        }
    }
}

/// Runs the checks. An unreachable cluster ends them early with a problem that names it.
pub fn check(settings: &Settings) -> CheckReport {
    let mut report = CheckReport::default();
    let Some(source) = reached(&mut report, settings, Cluster::Source) else {
        return report;
    };
    let Some(target) = reached(&mut report, settings, Cluster::Target) else {
        return report;
    };
    let target = partitions_by_topic(&target);
    report
        .lines
        .push(crate::settings::record_size_bound(&settings.producer));
    let matching = settings.topics.select(&source);
    let source_topics: Vec<String> = matching.iter().map(|(t, _)| t.clone()).collect();
    let mut target_topics: Vec<String> = source_topics
        .iter()
        .map(|t| settings.target_topic.render(t))
        .filter(|t| target.contains_key(t))
        .collect();
    if let Some(store) = &settings.offset_mapping {
        // The mirror writes its offset mapping there: WRITE as for a target topic.
        report.lines.push(match target.get(store) {
            Some(_) => {
                target_topics.push(store.clone());
                format!("offset mapping: topic {store} exists")
            }
            None => format!(
                "offset mapping: topic {store} is missing, will be created (compacted, 1                  partition; the producer's principal needs CREATE on it)"
            ),
        });
    }
    // Both clusters are asked at once: one that does not answer (librdkafka's mock cluster
    // has no controller to send DescribeTopics to) costs one wait, not two.
    let (source_ops, target_ops) = std::thread::scope(|s| {
        let target_ops = s.spawn(|| ask(settings, Cluster::Target, &target_topics));
        let source_ops = ask(settings, Cluster::Source, &source_topics);
        (
            source_ops,
            target_ops.join().unwrap_or_else(|_| Ok(Vec::new())),
        )
    });
    permissions(&mut report, settings, Cluster::Source, source_ops, "READ");
    permissions(&mut report, settings, Cluster::Target, target_ops, "WRITE");
    if matching.is_empty() {
        report.lines.push(format!(
            "no source topic matches --whitelist {:?} yet; the mirror waits for one",
            settings.topics.pattern()
        ));
    }
    for (topic, partitions) in matching {
        let partitions = &partitions.len();
        let n_partitions = counted(partitions, "partition");
        let target_topic = settings.target_topic.render(&topic);
        let creates = settings.create_topics.is_some();
        let status = match target.get(&target_topic) {
            None if creates => format!("missing, will be created with {n_partitions}"),
            None => {
                report.problems.push(format!(
                    "target topic {target_topic} does not exist: create it with {n_partitions}, \
                     or run with --create.topics true"
                ));
                "missing".to_owned()
            }
            Some(&have) if have < *partitions && creates => {
                format!(
                    "{}, {} will be added",
                    counted(have, "partition"),
                    partitions - have
                )
            }
            Some(&have)
                if have < *partitions && settings.partitioning == Partitioning::Preserve =>
            {
                report.problems.push(format!(
                    "target topic {target_topic} has {}, source topic {topic} has \
                     {partitions}: --partitioning preserve needs at least as many; add \
                     partitions or use --partitioning hash",
                    counted(have, "partition")
                ));
                format!("{}, too few", counted(have, "partition"))
            }
            Some(&have) => format!("exists, {}", counted(have, "partition")),
        };
        report.lines.push(format!(
            "{topic} ({n_partitions}) -> {target_topic}: {status}"
        ));
    }
    report
}

/// How long `check` waits for a cluster to say what the principal may do: a real cluster
/// answers in milliseconds; one that does not answer gets "not checked".
const PERMISSIONS_TIMEOUT: Duration = Duration::from_secs(3);

fn props_of(settings: &Settings, cluster: Cluster) -> &ClientProps {
    match cluster {
        Cluster::Source => &settings.consumer,
        Cluster::Target => &settings.producer,
    }
}

/// Asks `cluster` what the mirror's principal may do with `topics` (none: nothing asked).
fn ask(
    settings: &Settings,
    cluster: Cluster,
    topics: &[String],
) -> Result<Vec<TopicOperations>, String> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    props_of(settings, cluster)
        .connection_config()
        .create::<BaseProducer>()
        .map_err(|e| e.to_string())
        .and_then(|client| {
            authorized_operations(
                client.client(),
                &names,
                settings.startup_timeout.min(PERMISSIONS_TIMEOUT),
            )
        })
}

/// Reports each topic `cluster` says the mirror's principal may not perform `needed` on
/// (READ on the source, WRITE on the target) as a problem. A cluster that does not say (an
/// error, or no answer) gets a line, not a problem: the check is then not made.
fn permissions(
    report: &mut CheckReport,
    settings: &Settings,
    cluster: Cluster,
    answer: Result<Vec<TopicOperations>, String>,
    needed: &str,
) {
    let props = props_of(settings, cluster);
    let name = cluster.name();
    let described = match answer {
        Ok(described) => described,
        Err(reason) => {
            report.lines.push(format!(
                "{name} cluster: permissions not checked ({})",
                props.redact(&reason)
            ));
            return;
        }
    };
    for TopicOperations {
        topic,
        error,
        operations,
    } in described
    {
        match (error, operations) {
            (Some(code), _) => report.lines.push(format!(
                "{name} topic {topic}: permissions not checked ({code})"
            )),
            (None, None) => report.lines.push(format!(
                "{name} topic {topic}: permissions not checked (the cluster did not say)"
            )),
            (None, Some(ops)) if ops.iter().any(|o| o == needed || o == "ALL") => {}
            (None, Some(ops)) => report.problems.push(format!(
                "the {name} cluster does not allow the mirror's principal (the {} config's \
                 credentials) to {needed} topic {topic} (it may: {}): grant it {needed}, e.g. \
                 kafka-acls --add --allow-principal User:NAME --operation {} --topic {topic}",
                match cluster {
                    Cluster::Source => "consumer",
                    Cluster::Target => "producer",
                },
                if ops.is_empty() {
                    "nothing".to_owned()
                } else {
                    ops.join(", ")
                },
                capitalized(needed)
            )),
        }
    }
}

/// `WRITE` as kafka-acls spells it: `Write`.
fn capitalized(operation: &str) -> String {
    let lower = operation.to_ascii_lowercase();
    let mut chars = lower.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}
