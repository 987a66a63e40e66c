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
use crate::native::admin::{authorized_operations, DescribedTopic};
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
    report.lines.extend(
        settings
            .exposures()
            .into_iter()
            .map(|line| format!("security: {line}")),
    );
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
                "offset mapping: topic {store} is missing, will be created (compacted, 1 \
                 partition; the producer's principal needs CREATE on it)"
            ),
        });
        // Who else may write it is DescribeAcls's to say: Kafka answers it only to a
        // principal with DESCRIBE on the cluster, and rust-rdkafka does not wrap it.
        report.lines.push(format!(
            "offset mapping: not checked who else may write topic {store} (that needs \
             DescribeAcls, which the mirror's principal should not be allowed): only the \
             mirror's principal may (docs/security.md shows the kafka-acls commands)"
        ));
    }
    if let crate::settings::OnHandlerError::DeadLetter(topic) = &settings.on_handler_error {
        report.lines.push(match target.get(topic) {
            Some(_) => {
                target_topics.push(topic.clone());
                format!("dead-letter topic {topic} exists (--on.handler.error dead-letter)")
            }
            None if settings.create_topics.is_some() => format!(
                "dead-letter topic {topic} is missing, will be created (1 partition; the \
                 producer's principal needs CREATE on it)"
            ),
            None => {
                report.problems.push(format!(
                    "dead-letter topic {topic} (--dead.letter.topic) does not exist on the \
                     target and --create.topics is false: create it, or run with \
                     --create.topics true"
                ));
                format!("dead-letter topic {topic} is missing")
            }
        });
    } else if settings.handler.is_some() {
        report.lines.push(format!(
            "a record the message handler refuses: {}",
            match settings.on_handler_error {
                crate::settings::OnHandlerError::Skip =>
                    "skipped and counted (--on.handler.error skip)",
                _ => "stops the mirror (--on.handler.error stop)",
            }
        ));
    }
    report.lines.push(batch_size_line(settings, &target_topics));
    engine_line(&mut report, settings);
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
                if have < *partitions
                    && settings.options.partitioning == Partitioning::Preserve =>
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
    if let Some(heartbeats) = &settings.heartbeats {
        heartbeat_lines(&mut report, settings, heartbeats, &source);
    }
    if let Some(throttle) = crate::mirror::throttle::Throttle::new(
        settings.throttle_bytes_per_second,
        settings.throttle_records_per_second,
    ) {
        report.lines.push(format!(
            "throttle: {} over all streams",
            throttle.describe()
        ));
    }
    let existing: Vec<(String, String)> = settings
        .topics
        .select(&source)
        .into_iter()
        .map(|(t, _)| {
            let target_topic = settings.target_topic.render(&t);
            (t, target_topic)
        })
        .filter(|(_, t)| target.contains_key(t))
        .collect();
    report.lines.extend(crate::mirror::timestamps::compare(
        &settings.consumer,
        &settings.producer,
        &existing,
        settings.options.startup_timeout.min(PERMISSIONS_TIMEOUT),
    ));
    if settings.sync_topic_configs.is_some() {
        topic_configs(&mut report, settings);
    }
    if settings.sync_topic_acls.is_some() {
        topic_acls(&mut report, settings);
    }
    report
}

/// Which engine `run` would copy with, and why: the brokers are asked as `run` asks them at
/// start; `--copy.mode batches` with a broker the batch engine cannot speak to is a problem
/// (`run` would stop with it).
fn engine_line(report: &mut CheckReport, settings: &Settings) {
    let mut chosen = settings.clone();
    let line = match crate::mirror::pipeline::choose_engine(&mut chosen) {
        Err(reason) => {
            report.problems.push(format!(
                "--copy.mode batches cannot serve {reason}: run would stop; use \
                 --copy.mode records or auto there"
            ));
            "engine: batches (--copy.mode batches), which cannot serve these brokers".to_owned()
        }
        Ok(()) => match (
            &chosen.batches_refused,
            chosen.batches,
            chosen.batches_by_auto,
        ) {
            (Some(reason), _, _) => format!(
                "engine: records (--copy.mode auto: the batch engine cannot serve {reason})"
            ),
            (None, false, _) => "engine: records (--copy.mode records)".to_owned(),
            (None, true, true) => "engine: batches (--copy.mode auto)".to_owned(),
            (None, true, false) => "engine: batches (--copy.mode batches)".to_owned(),
        },
    };
    report.lines.push(line);
}

/// `--heartbeats.interval.ms`: where heartbeats go and whether the source lets the mirror
/// write them there (a refusal is a problem: the mirror would run without heartbeats).
fn heartbeat_lines(
    report: &mut CheckReport,
    settings: &Settings,
    heartbeats: &crate::settings::Heartbeats,
    source: &Metadata,
) {
    let topic = &heartbeats.topic;
    let exists = source.topics().iter().any(|t| t.name() == topic);
    report.lines.push(format!(
        "heartbeats: every {:?} to source topic {topic} ({}), mirrored to target topic {}",
        heartbeats.interval,
        if exists {
            "exists"
        } else {
            "missing, will be created with 1 partition: the consumer config's principal needs \
             CREATE on it"
        },
        settings.target_topic.render(topic)
    ));
    if exists {
        let answer = ask(settings, Cluster::Source, std::slice::from_ref(topic));
        permissions(report, settings, Cluster::Source, answer, "WRITE");
    }
}

/// The producer's `batch.size` against the target topics' `max.message.bytes`: capped at the
/// smallest at start (librdkafka does not split a batch the target refuses).
fn batch_size_line(settings: &Settings, target_topics: &[String]) -> String {
    use crate::mirror::limits::{batch_cap, batch_size, TargetLimits};
    let timeout = settings.options.startup_timeout.min(PERMISSIONS_TIMEOUT);
    let read = match TargetLimits::new(&settings.producer, timeout) {
        Ok(limits) => limits.read(target_topics),
        Err(e) => return format!("batch size: not checked ({e})"),
    };
    let user_set = settings.producer.get("batch.size").is_some();
    let size = batch_size(&settings.producer);
    match batch_cap(size, user_set, &read) {
        Some(cap) => format!("batch size: {}", cap.describe(&settings.producer)),
        None => match read.iter().min_by_key(|(_, l)| *l) {
            Some((topic, limit)) => format!(
                "batch size: the producer's batch.size {size} is taken by every target topic \
                 (the smallest max.message.bytes is {limit}, of {topic})"
            ),
            None => format!(
                "batch size: the producer's batch.size {size}; no target topic's \
                 max.message.bytes read (none exists yet, or the target does not answer \
                 DescribeConfigs)"
            ),
        },
    }
}

/// `--sync.topic.configs`: per mirrored topic, each listed key a round would set (source and
/// target values) or leaves different; a topic whose configs a cluster will not describe is a
/// problem (the sync could not keep it in step).
fn topic_configs(report: &mut CheckReport, settings: &Settings) {
    let timeout = settings.options.startup_timeout.min(PERMISSIONS_TIMEOUT);
    match crate::mirror::sync::preview(settings, timeout) {
        Ok(plan) => {
            report.lines.extend(crate::mirror::sync::plan_lines(&plan));
            report
                .problems
                .extend(plan.refused.iter().map(|r| r.describe()));
        }
        Err(e) => report.lines.push(format!(
            "topic-config sync: not checked ({})",
            settings.producer.redact(&e.to_string())
        )),
    }
}

/// `--sync.topic.acls`: each ACL a round would create or remove on the target; a principal
/// that may not describe or alter ACLs is a problem (the sync would stop).
fn topic_acls(report: &mut CheckReport, settings: &Settings) {
    let timeout = settings.options.startup_timeout.min(PERMISSIONS_TIMEOUT);
    match crate::mirror::acl_sync::preview(settings, timeout) {
        Ok(plan) => report
            .lines
            .extend(crate::mirror::acl_sync::plan_lines(&plan)),
        Err(e) if e.stops() => report.problems.push(e.to_string()),
        Err(e) => report.lines.push(format!(
            "ACL sync: not checked ({})",
            settings.producer.redact(&e.to_string())
        )),
    }
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
) -> Result<Vec<DescribedTopic>, String> {
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
                settings.options.startup_timeout.min(PERMISSIONS_TIMEOUT),
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
    answer: Result<Vec<DescribedTopic>, String>,
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
    for DescribedTopic {
        topic,
        error,
        operations,
        ..
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
