//! Reading partitions and comparing them record by record: what `verify`, `demo`, the
//! benchmark and the tests share.
//!
//! Each record is reduced to a fingerprint of everything the mirror must keep (key, value,
//! headers in order with repeats and null values, timestamp), so that millions of records can
//! be compared without holding them.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, Timestamp};

use crate::native::record::{message_headers, Header};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::settings::routing::PROVENANCE_HEADER;

/// The fingerprint of one record's content.
pub fn fingerprint(m: &BorrowedMessage<'_>) -> u64 {
    fingerprint_stamped(m, None)
}

/// As [`fingerprint`], of a mirrored record whose last header is the provenance header naming
/// `stamp` (`--loop.prevention`): that header is left out, so the copy matches its source.
/// Header names are read as bytes (Kafka does not require them to be UTF-8).
pub fn fingerprint_stamped(m: &BorrowedMessage<'_>, stamp: Option<&str>) -> u64 {
    let mut h = DefaultHasher::new();
    m.key().hash(&mut h);
    m.payload().hash(&mut h);
    match m.timestamp() {
        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
        Timestamp::NotAvailable => None,
    }
    .hash(&mut h);
    // Counted first, then read: no allocation per record.
    let mut count = message_headers(m).count();
    if let (Some(stamp), Some(last)) = (stamp, count.checked_sub(1)) {
        let is_stamp = |h: Header<'_>| {
            h.key == PROVENANCE_HEADER.as_bytes() && h.value == Some(stamp.as_bytes())
        };
        if message_headers(m).nth(last).is_some_and(is_stamp) {
            count = last;
        }
    }
    for header in message_headers(m).take(count) {
        header.key.hash(&mut h);
        header.value.hash(&mut h);
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
    read_partition_as(bootstrap, topic, partition, timeout, fingerprint)
}

/// Like [`read_partition`], every field of each record.
pub fn read_records(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> anyhow::Result<Vec<OwnedRecord>> {
    read_partition_as(bootstrap, topic, partition, timeout, OwnedRecord::of)
}

pub use crate::mirror::clients::ReaderContext;

/// A consumer for reading partitions by assignment (it never commits).
pub type Reader = BaseConsumer<ReaderContext>;

fn reader(bootstrap: &str) -> anyhow::Result<Reader> {
    reader_from(
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .clone(),
    )
}

pub fn reader_from(mut config: ClientConfig) -> anyhow::Result<Reader> {
    Ok(config
        .set("group.id", "mirror-maker-verify")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10")
        .set("log_level", "3")
        .create_with_context(ReaderContext)?)
}

/// Reads `topic`'s partitions over `[start, end)` each, calling `f(partition, message)` in
/// order per partition. Fails if nothing arrives for `idle` while records are still due.
pub fn scan(
    consumer: &Reader,
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

/// Reads every record of `topic`/`partition` up to its high watermark (as of the start),
/// each as `f` makes it.
pub fn read_partition_as<T>(
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
pub struct OwnedRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

impl OwnedRecord {
    /// A header name that is not UTF-8 is kept with U+FFFD in place of the bytes that are not
    /// (the tests that need the bytes read them with `native::record::message_headers`).
    pub fn of(m: &BorrowedMessage<'_>) -> OwnedRecord {
        OwnedRecord {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: message_headers(m)
                .map(|h| {
                    (
                        String::from_utf8_lossy(h.key).into_owned(),
                        h.value.map(<[u8]>::to_vec),
                    )
                })
                .collect(),
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
) -> anyhow::Result<Vec<OwnedRecord>> {
    let consumer = reader(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                out.push(OwnedRecord::of(&m));
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
