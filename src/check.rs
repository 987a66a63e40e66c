//! `mirror-maker check`: everything a mirror would need, verified without mirroring. Configs
//! are validated as for a run, both clusters are contacted, and each matching source topic is
//! shown with its target topic and whether the target can take it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};

use crate::cli::Partitioning;
use crate::config::ClientProps;
use crate::settings::Settings;
use rdkafka::error::KafkaResult;

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

/// Reports whether `cluster` answered; its topics and partition counts if it did.
fn reached(
    report: &mut CheckReport,
    cluster: &str,
    props: &ClientProps,
    metadata: KafkaResult<Metadata>,
) -> Option<BTreeMap<String, usize>> {
    let servers = props.get("bootstrap.servers").unwrap_or("?");
    match metadata {
        Ok(m) => {
            report.lines.push(format!(
                "{cluster} cluster {servers}: reachable ({} brokers)",
                m.brokers().len()
            ));
            Some(partitions_by_topic(&m))
        }
        Err(e) => {
            report.problems.push(format!(
                "cannot reach the {cluster} cluster (bootstrap.servers = {servers} in {}): {}",
                props.path.display(),
                props.redact(&e.to_string())
            ));
            None
        }
    }
}

/// Runs the checks. An unreachable cluster ends them early with a problem that names it.
pub fn check(settings: &Settings) -> CheckReport {
    let mut report = CheckReport::default();
    let source = settings
        .consumer
        .connection_config()
        .create::<BaseConsumer>()
        .and_then(|c| c.fetch_metadata(None, settings.startup_timeout));
    let Some(source) = reached(&mut report, "source", &settings.consumer, source) else {
        return report;
    };
    let target = settings
        .producer
        .connection_config()
        .create::<BaseProducer>()
        .and_then(|p| p.client().fetch_metadata(None, settings.startup_timeout));
    let Some(target) = reached(&mut report, "target", &settings.producer, target) else {
        return report;
    };
    let matching: Vec<(&String, &usize)> = source
        .iter()
        .filter(|(t, _)| settings.topics.matches(t))
        .collect();
    if matching.is_empty() {
        report.lines.push(format!(
            "no source topic matches --whitelist {:?} yet; the mirror waits for one",
            settings.topics.pattern()
        ));
    }
    for (topic, partitions) in matching {
        let target_topic = settings
            .target_topic
            .as_ref()
            .map_or_else(|| topic.clone(), |t| t.render(topic));
        let creates = settings.create_topics.is_some();
        let status = match target.get(&target_topic) {
            None if creates => format!("missing, will be created with {partitions} partitions"),
            None => {
                report.problems.push(format!(
                    "target topic {target_topic} does not exist: create it with {partitions} \
                     partitions, or run with --create.topics true"
                ));
                "missing".to_owned()
            }
            Some(&have) if have < *partitions && creates => {
                format!("{have} partitions, {} will be added", partitions - have)
            }
            Some(&have)
                if have < *partitions && settings.partitioning == Partitioning::Preserve =>
            {
                report.problems.push(format!(
                    "target topic {target_topic} has {have} partitions, source topic {topic} \
                     has {partitions}: --partitioning preserve needs at least as many; add \
                     partitions or use --partitioning hash"
                ));
                format!("{have} partitions, too few")
            }
            Some(&have) => format!("exists, {have} partitions"),
        };
        report.lines.push(format!(
            "{topic} ({partitions} partitions) -> {target_topic}: {status}"
        ));
    }
    report
}
