//! `mirror-maker check`: everything a mirror would need, verified without mirroring. Configs
//! are validated as for a run, both clusters are contacted, and each matching source topic is
//! shown with its target topic and whether the target can take it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rdkafka::metadata::Metadata;

use crate::mirror::clients::Cluster;
use crate::mirror::probe::probe;
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
