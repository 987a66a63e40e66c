//! Record-by-record comparison of a source partition with its mirror.
//!
//! Each record is reduced to a fingerprint of everything the mirror must keep (key, value,
//! headers in order with repeats and null values, timestamp), so that millions of records can
//! be compared without holding them.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message, Timestamp};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The fingerprint of one record's content.
pub fn fingerprint<M: Message>(m: &M) -> u64 {
    let mut h = DefaultHasher::new();
    m.key().hash(&mut h);
    m.payload().hash(&mut h);
    match m.timestamp() {
        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
        Timestamp::NotAvailable => None,
    }
    .hash(&mut h);
    if let Some(headers) = m.headers() {
        for header in headers.iter() {
            header.key.hash(&mut h);
            header.value.hash(&mut h);
        }
    }
    h.finish()
}

/// Reads every record of `topic`/`partition` up to its high watermark (as of the start),
/// as fingerprints.
pub fn read_partition(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> anyhow::Result<Vec<u64>> {
    read_partition_as(bootstrap, topic, partition, timeout, |m| fingerprint(m))
}

/// Like [`read_partition`], every field of each record.
pub fn read_records(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> anyhow::Result<Vec<Record>> {
    read_partition_as(bootstrap, topic, partition, timeout, |m| Record::of(m))
}

/// A consumer for reading partitions by assignment (it never commits).
fn reader(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    reader_from(
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .clone(),
    )
}

fn reader_from(mut config: ClientConfig) -> anyhow::Result<BaseConsumer> {
    Ok(config
        .set("group.id", "mirror-maker-verify")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10")
        .set("log_level", "3")
        .create()?)
}

/// Reads `topic`'s partitions over `[start, end)` each, calling `f(partition, message)` in
/// order per partition. Fails if nothing arrives for `idle` while records are still due.
pub fn scan(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    idle: Duration,
    mut f: impl FnMut(i32, &BorrowedMessage<'_>),
) -> anyhow::Result<()> {
    let mut pending: HashMap<i32, i64> = ranges
        .iter()
        .filter(|(_, start, end)| start < end)
        .map(|(p, _, end)| (*p, *end))
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for (p, start, end) in ranges {
        if start < end {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*start))?;
        }
    }
    consumer.assign(&tpl)?;
    let mut last = Instant::now();
    while !pending.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Instant::now();
                let p = m.partition();
                let Some(&end) = pending.get(&p) else {
                    continue;
                };
                if m.offset() < end {
                    f(p, &m);
                }
                if m.offset() + 1 >= end {
                    pending.remove(&p);
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => anyhow::bail!("reading {topic}: {e}"),
            None => {}
        }
        if last.elapsed() > idle {
            let mut left: Vec<_> = pending.keys().copied().collect();
            left.sort_unstable();
            anyhow::bail!(
                "reading {topic}: partitions {left:?} sent nothing for {idle:?} before their end"
            );
        }
    }
    consumer.unassign()?;
    Ok(())
}

fn read_partition_as<T>(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timeout: Duration,
    mut convert: impl FnMut(&BorrowedMessage<'_>) -> T,
) -> anyhow::Result<Vec<T>> {
    let consumer = reader(bootstrap)?;
    let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
    let mut out = Vec::with_capacity(usize::try_from(high - low).unwrap_or(0));
    scan(
        &consumer,
        topic,
        &[(partition, low, high)],
        timeout,
        |_, m| out.push(convert(m)),
    )?;
    Ok(out)
}

/// Every field of a record that the mirror must keep, for field-by-field comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

impl Record {
    pub fn of<M: Message>(m: &M) -> Record {
        Record {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp: match m.timestamp() {
                Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
                Timestamp::NotAvailable => None,
            },
        }
    }
}

/// Reads `topic`/`partition` from the beginning until nothing new arrives for `quiet`, for
/// brokers whose high watermarks cannot be trusted (tansu 0.6). Small volumes only.
pub fn read_until_quiet(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    quiet: Duration,
) -> anyhow::Result<Vec<Record>> {
    let consumer = reader(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                out.push(Record::of(&m));
                last = Instant::now();
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => anyhow::bail!("reading {topic}/{partition}: {e}"),
        }
    }
    Ok(out)
}

/// How a mirrored partition differs from its source.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub source: u64,
    pub target: u64,
    /// Source records with no copy on the target.
    pub lost: u64,
    /// Extra copies of source records.
    pub duplicated: u64,
    /// Target records that match no source record.
    pub changed: u64,
    /// Whether the target holds the source's records in the source's order (duplicates aside).
    pub in_order: bool,
}

impl Comparison {
    /// One line for trial reports: checked, lost, changed, duplicated, order.
    pub fn summary(&self) -> String {
        format!(
            "{} records checked, {} lost, {} changed, {} duplicated, order kept: {}",
            self.source, self.lost, self.changed, self.duplicated, self.in_order
        )
    }

    pub fn add(&mut self, other: &Comparison) {
        self.source += other.source;
        self.target += other.target;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.changed += other.changed;
        self.in_order &= other.in_order;
    }

    pub fn is_exact(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.changed == 0 && self.in_order
    }
}

/// Compares one partition's fingerprints, source against target.
pub fn compare(source: &[u64], target: &[u64]) -> Comparison {
    let mut counts: HashMap<u64, i64> = HashMap::with_capacity(source.len());
    for f in source {
        *counts.entry(*f).or_default() += 1;
    }
    let mut c = Comparison {
        source: source.len() as u64,
        target: target.len() as u64,
        in_order: true,
        ..Comparison::default()
    };
    let mut seen: HashMap<u64, i64> = HashMap::with_capacity(target.len());
    for f in target {
        match counts.get(f) {
            None => c.changed += 1,
            Some(&n) => {
                let s = seen.entry(*f).or_default();
                *s += 1;
                if *s > n {
                    c.duplicated += 1;
                }
            }
        }
    }
    for (f, n) in &counts {
        let got = seen.get(f).copied().unwrap_or(0);
        if got < *n {
            c.lost += (n - got) as u64;
        }
    }
    // Order: the first copy of each source record must appear in source order.
    let mut position: HashMap<u64, usize> = HashMap::with_capacity(source.len());
    for (i, f) in source.iter().enumerate() {
        position.entry(*f).or_insert(i);
    }
    let mut first_seen = std::collections::HashSet::with_capacity(target.len());
    let mut last = None;
    for f in target {
        if let Some(&p) = position.get(f) {
            if first_seen.insert(*f) {
                if last.is_some_and(|l| p < l) {
                    c.in_order = false;
                }
                last = Some(p);
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_partitions_compare_exact() {
        let c = compare(&[1, 2, 3], &[1, 2, 3]);
        assert!(c.is_exact(), "{c:?}");
    }

    #[test]
    fn each_kind_of_difference_is_counted() {
        let c = compare(&[1, 2, 3, 4], &[1, 3, 3, 9, 4]);
        assert_eq!((c.lost, c.duplicated, c.changed), (1, 1, 1));
        assert!(c.in_order);
        let c = compare(&[1, 2, 3], &[2, 1, 3]);
        assert!(!c.in_order);
        assert_eq!((c.lost, c.duplicated, c.changed), (0, 0, 0));
    }
}

/// Where each source partition's checked range starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Beginning,
    Offset(i64),
    /// Milliseconds since the epoch: the first record at or after it.
    Time(i64),
}

/// Where each source partition's checked range ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Until {
    /// The source's high watermark when the check starts.
    End,
    /// The mirror group's committed offset (what the mirror says is done).
    Committed,
}

/// What `mirror-maker verify` checks.
#[derive(Debug, Clone)]
pub struct Verification {
    pub source: crate::config::ClientProps,
    pub target: crate::config::ClientProps,
    pub topics: crate::settings::TopicFilter,
    pub from: From,
    pub until: Until,
    /// Whether records must sit in the same partition number on the target.
    pub preserve: bool,
    pub idle_timeout: Duration,
}

impl Verification {
    pub fn from_args(
        args: &crate::cli::VerifyArgs,
    ) -> Result<Verification, crate::settings::SettingsError> {
        use crate::config::{ClientProps, Role};
        let source = ClientProps::load(Role::Consumer, &args.consumer_config)?;
        let target = ClientProps::load(Role::Producer, &args.producer_config)?;
        for props in [&source, &target] {
            if props.get("bootstrap.servers").is_none() {
                return Err(crate::settings::SettingsError::Usage(format!(
                    "{} config {}: `bootstrap.servers` is required",
                    props.role,
                    props.path.display()
                )));
            }
        }
        Ok(Verification {
            source,
            target,
            topics: crate::settings::TopicFilter::new(&args.whitelist)?,
            from: match (args.from_offset, args.from_time) {
                (Some(o), _) => From::Offset(o),
                (None, Some(t)) => From::Time(t),
                (None, None) => From::Beginning,
            },
            until: args.until,
            preserve: args.partitioning == crate::cli::Partitioning::Preserve,
            idle_timeout: Duration::from_millis(args.timeout_ms),
        })
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
}

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
    pub topics: Vec<TopicReport>,
    pub totals: Totals,
    /// Nothing missing, changed, out of order or misplaced (duplicates are allowed: a mirror
    /// that was killed copies again what it had not committed).
    pub ok: bool,
}

/// One source record's fingerprint: where it is in the source, how often it occurs in the
/// checked range and in the whole partition, and how often the target holds it.
struct Seen {
    partition: i32,
    offset: i64,
    in_range: u32,
    total: u32,
    copies: u32,
}

/// Compares every matching source topic with the target topic of the same name.
pub fn verify(v: &Verification) -> anyhow::Result<Report> {
    use anyhow::Context;
    let source = reader_from(v.source.connection_config())?;
    let target = reader_from(v.target.connection_config())?;
    let metadata = source
        .fetch_metadata(None, v.idle_timeout)
        .with_context(|| format!("listing the source's topics ({})", v.source.path.display()))?;
    let mut topics: Vec<(String, Vec<i32>)> = metadata
        .topics()
        .iter()
        .filter(|t| v.topics.matches(t.name()))
        .map(|t| {
            (
                t.name().to_owned(),
                t.partitions().iter().map(|p| p.id()).collect(),
            )
        })
        .collect();
    topics.sort();
    let mut report = Report {
        until: Some(v.until),
        ..Report::default()
    };
    for (topic, partitions) in topics {
        let t = verify_topic(v, &source, &target, &topic, partitions)?;
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
    let t = &report.totals;
    report.ok = t.missing == 0 && t.changed == 0 && t.out_of_order == 0 && t.misplaced == 0;
    Ok(report)
}

fn verify_topic(
    v: &Verification,
    source: &BaseConsumer,
    target: &BaseConsumer,
    topic: &str,
    mut partitions: Vec<i32>,
) -> anyhow::Result<TopicReport> {
    use anyhow::Context;
    partitions.sort_unstable();
    let timeout = v.idle_timeout;
    // The checked range of each source partition.
    let mut ranges = Vec::with_capacity(partitions.len());
    let mut reports = Vec::with_capacity(partitions.len());
    let committed = match v.until {
        Until::Committed => Some(committed_offsets(v, topic, &partitions)?),
        Until::End => None,
    };
    for (i, &p) in partitions.iter().enumerate() {
        let (low, high) = source
            .fetch_watermarks(topic, p, timeout)
            .with_context(|| format!("source watermarks of {topic}/{p}"))?;
        let from = match v.from {
            From::Beginning => low,
            From::Offset(o) => o.clamp(low, high),
            From::Time(t) => offset_for_time(source, topic, p, t, timeout)?.unwrap_or(high),
        };
        let until = committed.as_ref().map_or(high, |c| c[i].clamp(low, high));
        ranges.push((p, low, high));
        reports.push(PartitionReport {
            partition: p,
            from,
            until: until.max(from),
            ..PartitionReport::default()
        });
    }
    // Index the whole source partitions: a target record is "changed" only if it matches no
    // source record at all, in the range or not.
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut last_offset: HashMap<i32, i64> = HashMap::new();
    scan(source, topic, &ranges, timeout, |p, m| {
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

    // The target topic: every record, in each partition's order.
    let target_topic = topic.to_owned();
    let target_partitions: Vec<i32> = target
        .fetch_metadata(Some(&target_topic), timeout)
        .with_context(|| format!("target topic {target_topic}"))?
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut target_ranges = Vec::with_capacity(target_partitions.len());
    for &p in &target_partitions {
        let (low, high) = target
            .fetch_watermarks(&target_topic, p, timeout)
            .with_context(|| format!("target watermarks of {target_topic}/{p}"))?;
        target_ranges.push((p, low, high));
    }
    let mut report = TopicReport {
        topic: topic.to_owned(),
        target_topic: target_topic.clone(),
        ..TopicReport::default()
    };
    // Per (target partition, source partition): the source offset of the last first copy.
    let mut order: HashMap<(i32, i32), i64> = HashMap::new();
    scan(target, &target_topic, &target_ranges, timeout, |tp, m| {
        report.target_records += 1;
        let Some(e) = seen.get_mut(&fingerprint(m)) else {
            report.changed += 1;
            return;
        };
        e.copies += 1;
        if e.copies > 1 || e.in_range == 0 {
            return;
        }
        let r = &mut reports[partitions.binary_search(&e.partition).unwrap_or(0)];
        if v.preserve && tp != e.partition {
            r.misplaced += 1;
        }
        let last = order.entry((tp, e.partition)).or_insert(i64::MIN);
        if e.offset < *last {
            r.out_of_order += 1;
        } else {
            *last = e.offset;
        }
    })
    .with_context(|| format!("reading target topic {target_topic}"))?;
    for e in seen.values().filter(|e| e.in_range > 0) {
        let r = &mut reports[partitions.binary_search(&e.partition).unwrap_or(0)];
        r.missing += u64::from(e.in_range.saturating_sub(e.copies));
        r.duplicated += u64::from(e.copies.saturating_sub(e.total));
    }
    report.partitions = reports;
    Ok(report)
}

fn committed_offsets(
    v: &Verification,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<Vec<i64>> {
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
                .unwrap_or(0)
        })
        .collect())
}

fn offset_for_time(
    consumer: &BaseConsumer,
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
                "{} -> {}: {} partitions, {source} source records checked, {} records on the target, {} changed",
                t.topic,
                t.target_topic,
                t.partitions.len(),
                t.target_records,
                t.changed
            );
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
        let t = &self.totals;
        let _ = writeln!(
            out,
            "{}: {} source records checked, {} missing, {} changed, {} duplicated, {} out of order, {} misplaced",
            if self.ok { "OK" } else { "FAILED" },
            t.source_records,
            t.missing,
            t.changed,
            t.duplicated,
            t.out_of_order,
            t.misplaced
        );
        out
    }
}
