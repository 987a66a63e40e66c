//! `mirror-maker verify`: every matching source topic compared with its mirror, record by
//! record (see [`super::compare`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::compare::{fingerprint, fingerprint_stamped, reader_from, scan, Reader};
use crate::mirror::clients::Cluster;
use crate::mirror::probe::reach;
use crate::settings::client::{ClientProps, Role};
use crate::settings::flags::{Isolation, Partitioning, Until, VerifyArgs};
use crate::settings::routing::{Provenance, TopicFilter, TopicTemplate};
use crate::settings::{counted, SettingsError};

/// Where each source partition's checked range starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Beginning,
    Offset(i64),
    /// Milliseconds since the epoch: the first record at or after it.
    Time(i64),
}

/// What `mirror-maker verify` checks.
#[derive(Debug, Clone)]
pub struct Verification {
    pub source: ClientProps,
    pub target: ClientProps,
    pub topics: TopicFilter,
    /// `--target.topic`: where each source topic's records are on the target.
    pub target_topic: TopicTemplate,
    /// `--loop.prevention`: the source cluster's name, which the mirror appended to every
    /// record as its provenance header (left out of the target records' comparison).
    pub stamp: Option<String>,
    pub from: Start,
    pub until: Until,
    /// Whether records must sit in the same partition number on the target.
    pub preserve: bool,
    pub idle_timeout: Duration,
    /// `--isolation`: how both clusters are read.
    pub isolation: Isolation,
    /// `--exactly.once`: a duplicated record fails the check, and each is named.
    pub exactly_once: bool,
}

impl Verification {
    /// From the mirror's own flags: its configs, `--whitelist`, `--target.topic`,
    /// `--partitioning` and `--loop.prevention` (the provenance header its records carry).
    pub fn from_args(args: &VerifyArgs) -> Result<Verification, SettingsError> {
        let m = &args.mirror;
        let missing = |flag: &str| SettingsError::Usage(format!("{flag} is required"));
        let topics = TopicFilter::new(
            m.whitelist
                .as_deref()
                .ok_or_else(|| missing("--whitelist"))?,
        )?;
        let consumer_config = m.consumer_config.as_deref();
        let producer_config = m.producer_config.as_deref();
        let source = ClientProps::load(
            Role::Consumer,
            consumer_config.ok_or_else(|| missing("--consumer.config"))?,
        )?;
        let target = ClientProps::load(
            Role::Producer,
            producer_config.ok_or_else(|| missing("--producer.config"))?,
        )?;
        for props in [&source, &target] {
            if props.get("bootstrap.servers").is_none() {
                return Err(SettingsError::Usage(format!(
                    "{} config {}: `bootstrap.servers` is required",
                    props.role,
                    props.path.display()
                )));
            }
        }
        let target_topic = TopicTemplate::parse(&m.target_topic).map_err(SettingsError::Usage)?;
        let provenance = m
            .loop_prevention
            .then(|| {
                Provenance::new(
                    m.source_cluster_name.as_deref(),
                    m.target_cluster_name.as_deref(),
                )
            })
            .transpose()
            .map_err(SettingsError::Usage)?;
        if m.message_handler.is_some() {
            tracing::warn!(
                "verify does not run --message.handler: records the handler changed, dropped or \
                 added are reported as changed or missing"
            );
        }
        Ok(Verification {
            source,
            target,
            topics,
            target_topic,
            stamp: provenance.map(|p| p.source),
            from: match (args.from_offset, args.from_time) {
                (Some(o), _) => Start::Offset(o),
                (None, Some(t)) => Start::Time(t),
                (None, None) => Start::Beginning,
            },
            until: args.until,
            preserve: m.partitioning == Partitioning::Preserve,
            idle_timeout: Duration::from_millis(args.timeout_ms),
            isolation: args.isolation,
            exactly_once: m.exactly_once,
        })
    }

    /// A reader of `props`'s cluster with `--isolation`.
    fn reader(&self, props: &ClientProps) -> anyhow::Result<Reader> {
        let mut config = props.connection_config();
        config.set("isolation.level", self.isolation.level());
        reader_from(config)
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct PartitionReport {
    pub partition: i32,
    /// The checked source range `[from, until)`.
    pub from: i64,
    pub until: i64,
    pub source_records: u64,
    pub missing: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub misplaced: u64,
    /// Jumps in the source offsets inside the range (compaction or transaction markers, or
    /// records deleted): reported, not failures.
    pub offset_gaps: u64,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TopicReport {
    pub topic: String,
    pub target_topic: String,
    pub partitions: Vec<PartitionReport>,
    pub target_records: u64,
    /// Target records that match no record of the source topic.
    pub changed: u64,
    /// Target records that match no source record, of a key the source topic (compacted)
    /// still has a record of: the source's cleaner removed them after they were mirrored.
    pub compacted_away: u64,
    /// The first [`NAMED_DUPLICATES`] extra copies found (with `--exactly.once`), in the
    /// target's order.
    pub duplicates: Vec<Duplicate>,
}

/// One extra copy of a source record on the target.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Duplicate {
    /// The source record: its partition and offset (the first of identical records).
    pub partition: i32,
    pub offset: i64,
    /// Where the extra copy is on the target topic.
    pub target_partition: i32,
    pub target_offset: i64,
}

/// How many duplicates of each topic `--exactly.once` names (all are counted).
pub const NAMED_DUPLICATES: usize = 20;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Totals {
    pub source_records: u64,
    pub target_records: u64,
    pub missing: u64,
    pub changed: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub misplaced: u64,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub until: Option<Until>,
    pub isolation: Option<Isolation>,
    /// Whether duplicates fail the check (`--exactly.once`).
    pub exactly_once: bool,
    pub topics: Vec<TopicReport>,
    pub totals: Totals,
    /// Why some or all of what was asked was not checked (no topic matched, a group that
    /// never committed, no source records in the ranges): checking nothing is not a pass.
    pub not_checked: Vec<String>,
    /// Something was checked, and nothing is missing, changed, out of order or misplaced
    /// (duplicates are allowed: a mirror that was killed copies again what it had not
    /// committed; not with `--exactly.once`).
    pub ok: bool,
}

/// One source record's fingerprint: where it is in the source, how often it occurs in the
/// checked range and in the whole partition, and how often the target holds it. Identical
/// records share one entry, at the first one's place.
struct Seen {
    partition: i32,
    offset: i64,
    in_range: u32,
    total: u32,
    copies: u32,
}

/// Compares every matching source topic with its target topic (`--target.topic`).
/// Both clusters are reached first, as the mirror and `check` reach them: one that does not
/// answer within `--timeout.ms` is named with its address and config file.
pub fn verify(v: &Verification) -> anyhow::Result<Report> {
    let metadata = reach(&v.source, Cluster::Source, v.idle_timeout)?;
    reach(&v.target, Cluster::Target, v.idle_timeout)?;
    let source = v.reader(&v.source)?;
    let target = v.reader(&v.target)?;
    let topics = v.topics.select(&metadata);
    let mut report = Report {
        until: Some(v.until),
        isolation: Some(v.isolation),
        exactly_once: v.exactly_once,
        ..Report::default()
    };
    if topics.is_empty() {
        report.not_checked.push(format!(
            "no source topic matches --whitelist {:?}",
            v.topics.pattern()
        ));
    }
    for (topic, partitions) in topics {
        let (t, not_checked) = verify_topic(v, &source, &target, &topic, partitions)?;
        report.not_checked.extend(not_checked);
        let totals = &mut report.totals;
        for p in &t.partitions {
            totals.source_records += p.source_records;
            totals.missing += p.missing;
            totals.duplicated += p.duplicated;
            totals.out_of_order += p.out_of_order;
            totals.misplaced += p.misplaced;
        }
        totals.target_records += t.target_records;
        totals.changed += t.changed;
        report.topics.push(t);
    }
    if report.not_checked.is_empty() && report.totals.source_records == 0 {
        report
            .not_checked
            .push("the checked ranges hold no source records".to_owned());
    }
    let t = &report.totals;
    report.ok = report.not_checked.is_empty()
        && t.missing == 0
        && t.changed == 0
        && t.out_of_order == 0
        && t.misplaced == 0
        && (!v.exactly_once || t.duplicated == 0);
    Ok(report)
}

fn verify_topic(
    v: &Verification,
    source: &Reader,
    target: &Reader,
    topic: &str,
    mut partitions: Vec<i32>,
) -> anyhow::Result<(TopicReport, Option<String>)> {
    partitions.sort_unstable();
    let (ranges, mut reports, not_checked) = checked_ranges(v, source, topic, &partitions)?;
    let mut seen = index_source(v, source, topic, &ranges, &partitions, &mut reports)?;
    let source_keys = if source_is_compacted(v, topic)? {
        Some(source_keys(v, source, topic, &ranges)?)
    } else {
        None
    };
    let target_topic = v.target_topic.render(topic);
    let mut report = TopicReport {
        topic: topic.to_owned(),
        target_topic: target_topic.clone(),
        ..TopicReport::default()
    };
    check_target(
        v,
        target,
        &target_topic,
        &mut seen,
        source_keys.as_ref(),
        (&partitions, &mut reports),
        &mut report,
    )?;
    for e in seen.values().filter(|e| e.in_range > 0) {
        let r = &mut reports[partitions.binary_search(&e.partition).unwrap_or(0)];
        r.missing += u64::from(e.in_range.saturating_sub(e.copies));
        r.duplicated += u64::from(e.copies.saturating_sub(e.total));
    }
    report.partitions = reports;
    Ok((report, not_checked))
}

/// Whether the source topic is compacted (`cleanup.policy` includes `compact`): its cleaner
/// may remove records after they were mirrored.
fn source_is_compacted(v: &Verification, topic: &str) -> anyhow::Result<bool> {
    use anyhow::Context;
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = v
        .source
        .connection_config()
        .create()
        .context("creating an admin client for the source")?;
    let runtime = crate::native::runtime()?;
    let options = AdminOptions::new().request_timeout(Some(v.idle_timeout));
    let described =
        runtime.block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], &options));
    Ok(match described.as_deref() {
        Ok([Ok(resource)]) => resource
            .get("cleanup.policy")
            .and_then(|e| e.value.as_deref())
            .is_some_and(|policy| policy.contains("compact")),
        // A cluster that cannot describe configs: judged as not compacted (strict).
        other => {
            tracing::debug!("cannot describe source topic {topic}: {other:?}");
            false
        }
    })
}

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The keys of the source topic's records, hashed.
fn source_keys(
    v: &Verification,
    source: &Reader,
    topic: &str,
    ranges: &[Watermarks],
) -> anyhow::Result<HashSet<u64>> {
    use anyhow::Context;
    let mut keys = HashSet::new();
    scan(source, topic, ranges, v.idle_timeout, |_, m| {
        if let Some(key) = m.key() {
            keys.insert(key_hash(key));
        }
    })
    .with_context(|| format!("reading the keys of source topic {topic}"))?;
    Ok(keys)
}

/// A partition with its low and high watermarks.
type Watermarks = (i32, i64, i64);

/// Each source partition's whole range `(partition, low, high)`, the report of the part
/// checked (`--from.*` to `--until`), and why the topic is not checked at all if it is not
/// (`--until committed` with a group that committed nothing for it).
fn checked_ranges(
    v: &Verification,
    source: &Reader,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<(Vec<Watermarks>, Vec<PartitionReport>, Option<String>)> {
    use anyhow::Context;
    let timeout = v.idle_timeout;
    let mut ranges = Vec::with_capacity(partitions.len());
    let mut reports = Vec::with_capacity(partitions.len());
    let committed = match v.until {
        Until::Committed => Some(committed_offsets(v, topic, partitions)?),
        Until::End => None,
    };
    for (i, &p) in partitions.iter().enumerate() {
        let (low, high) = source
            .fetch_watermarks(topic, p, timeout)
            .with_context(|| format!("source watermarks of {topic}/{p}"))?;
        let from = match v.from {
            Start::Beginning => low,
            Start::Offset(o) => o.clamp(low, high),
            Start::Time(t) => offset_for_time(source, topic, p, t, timeout)?.unwrap_or(high),
        };
        let until = committed
            .as_ref()
            .map_or(high, |c| c[i].unwrap_or(0).clamp(low, high));
        ranges.push((p, low, high));
        reports.push(PartitionReport {
            partition: p,
            from,
            until: until.max(from),
            ..PartitionReport::default()
        });
    }
    // A group that committed nothing for a topic with records to check leaves it unchecked
    // (a topic without records has nothing for the group to commit).
    let has_records = reports
        .iter()
        .zip(&ranges)
        .any(|(r, (_, _, high))| *high > r.from);
    let not_checked = committed
        .as_ref()
        .filter(|c| has_records && c.iter().all(Option::is_none))
        .map(|_| {
            format!(
                "group {} has committed no offset for topic {topic}: nothing of it is checked \
                 (--until committed checks up to the group's committed offsets)",
                v.source.get("group.id").unwrap_or_default()
            )
        });
    Ok((ranges, reports, not_checked))
}

/// Indexes the whole source partitions by fingerprint (a target record is "changed" only if
/// it matches no source record at all, in the checked range or not), counting the checked
/// records and offset gaps into `reports`.
fn index_source(
    v: &Verification,
    source: &Reader,
    topic: &str,
    ranges: &[Watermarks],
    partitions: &[i32],
    reports: &mut [PartitionReport],
) -> anyhow::Result<HashMap<u64, Seen>> {
    use anyhow::Context;
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut last_offset: HashMap<i32, i64> = HashMap::new();
    scan(source, topic, ranges, v.idle_timeout, |p, m| {
        let r = &mut reports[partitions.binary_search(&p).unwrap_or(0)];
        let in_range = m.offset() >= r.from && m.offset() < r.until;
        if in_range {
            r.source_records += 1;
            if let Some(prev) = last_offset.insert(p, m.offset()) {
                if m.offset() != prev + 1 {
                    r.offset_gaps += 1;
                }
            }
        }
        let e = seen.entry(fingerprint(m)).or_insert(Seen {
            partition: p,
            offset: m.offset(),
            in_range: 0,
            total: 0,
            copies: 0,
        });
        e.total += 1;
        e.in_range += u32::from(in_range);
    })
    .with_context(|| format!("reading source topic {topic}"))?;
    Ok(seen)
}

/// Reads every record of the target topic, in each partition's order: counts copies into
/// `seen`, and changed, misplaced and out-of-order records into the reports.
fn check_target(
    v: &Verification,
    target: &Reader,
    target_topic: &str,
    seen: &mut HashMap<u64, Seen>,
    source_keys: Option<&HashSet<u64>>,
    (partitions, reports): (&[i32], &mut [PartitionReport]),
    report: &mut TopicReport,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let timeout = v.idle_timeout;
    let target_partitions: Vec<i32> = target
        .fetch_metadata(Some(target_topic), timeout)
        .with_context(|| format!("target topic {target_topic}"))?
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut target_ranges = Vec::with_capacity(target_partitions.len());
    for &p in &target_partitions {
        let (low, high) = target
            .fetch_watermarks(target_topic, p, timeout)
            .with_context(|| format!("target watermarks of {target_topic}/{p}"))?;
        target_ranges.push((p, low, high));
    }
    // Per (target partition, source partition): the source offset of the last first copy.
    let mut order: HashMap<(i32, i32), i64> = HashMap::new();
    scan(target, target_topic, &target_ranges, timeout, |tp, m| {
        report.target_records += 1;
        let Some(e) = seen.get_mut(&fingerprint_stamped(m, v.stamp.as_deref())) else {
            match (source_keys, m.key()) {
                (Some(keys), Some(key)) if keys.contains(&key_hash(key)) => {
                    report.compacted_away += 1
                }
                _ => report.changed += 1,
            }
            return;
        };
        e.copies += 1;
        if v.exactly_once
            && e.in_range > 0
            && e.copies > e.total
            && report.duplicates.len() < NAMED_DUPLICATES
        {
            report.duplicates.push(Duplicate {
                partition: e.partition,
                offset: e.offset,
                target_partition: tp,
                target_offset: m.offset(),
            });
        }
        if e.copies > 1 || e.in_range == 0 {
            return;
        }
        let r = &mut reports[partitions.binary_search(&e.partition).unwrap_or(0)];
        if v.preserve && tp != e.partition {
            r.misplaced += 1;
        }
        // Identical records (same key, value, headers and timestamp) spread over several
        // target partitions by hash partitioning: which copy stands for which source record
        // cannot be told, so their order is not judged.
        if !v.preserve && e.total > 1 {
            return;
        }
        let last = order.entry((tp, e.partition)).or_insert(i64::MIN);
        if e.offset < *last {
            r.out_of_order += 1;
        } else {
            *last = e.offset;
        }
    })
    .with_context(|| format!("reading target topic {target_topic}"))?;
    Ok(())
}

fn committed_offsets(
    v: &Verification,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<Vec<Option<i64>>> {
    let group = v.source.get("group.id").ok_or_else(|| {
        anyhow::anyhow!(
            "--until committed needs the mirror's group.id in {}",
            v.source.path.display()
        )
    })?;
    let mut config = v.source.connection_config();
    let consumer: BaseConsumer = config.set("group.id", group).create()?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, v.idle_timeout)?;
    Ok(partitions
        .iter()
        .map(|p| {
            committed
                .find_partition(topic, *p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        })
        .collect())
}

fn offset_for_time(
    consumer: &Reader,
    topic: &str,
    partition: i32,
    time: i64,
    timeout: Duration,
) -> anyhow::Result<Option<i64>> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(time))?;
    let found = consumer.offsets_for_times(tpl, timeout)?;
    Ok(found
        .find_partition(topic, partition)
        .and_then(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }))
}

impl Report {
    /// The human summary.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for t in &self.topics {
            let source: u64 = t.partitions.iter().map(|p| p.source_records).sum();
            let _ = writeln!(
                out,
                "{} -> {}: {}, {} checked, {} on the target, {} changed",
                t.topic,
                t.target_topic,
                counted(t.partitions.len(), "partition"),
                counted(source, "source record"),
                counted(t.target_records, "record"),
                t.changed
            );
            if t.compacted_away > 0 {
                let _ = writeln!(
                    out,
                    "  {} target records of keys the source has newer records of: removed by the \
                     source's compaction after they were mirrored (not a failure)",
                    t.compacted_away
                );
            }
            for d in &t.duplicates {
                let _ = writeln!(
                    out,
                    "  duplicated: {}/{} offset {} copied again to {}/{} offset {}",
                    t.topic,
                    d.partition,
                    d.offset,
                    t.target_topic,
                    d.target_partition,
                    d.target_offset
                );
            }
            let named = t.duplicates.len();
            let all: u64 = t.partitions.iter().map(|p| p.duplicated).sum();
            if self.exactly_once && all > named as u64 {
                let _ = writeln!(out, "  ... and {} more duplicated", all - named as u64);
            }
            for p in &t.partitions {
                if p.missing + p.duplicated + p.out_of_order + p.misplaced + p.offset_gaps > 0 {
                    let _ = writeln!(
                        out,
                        "  partition {} [{}, {}): {} missing, {} duplicated, {} out of order, {} misplaced, {} offset gaps",
                        p.partition, p.from, p.until, p.missing, p.duplicated, p.out_of_order, p.misplaced, p.offset_gaps
                    );
                }
            }
        }
        for why in &self.not_checked {
            let _ = writeln!(out, "not checked: {why}");
        }
        let t = &self.totals;
        let _ = writeln!(
            out,
            "{}: {} checked, {} missing, {} changed, {} duplicated{}, {} out of order, {} misplaced",
            if self.ok { "OK" } else { "FAILED" },
            counted(t.source_records, "source record"),
            t.missing,
            t.changed,
            t.duplicated,
            if self.exactly_once {
                " (--exactly.once: none allowed)"
            } else {
                ""
            },
            t.out_of_order,
            t.misplaced
        );
        out
    }
}
