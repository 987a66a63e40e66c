//! What the failover tests share: records that carry their source identity in their
//! value, a transactional writer that interleaves committed and aborted transactions, an
//! "application" that reads part of a group's partitions and commits, a reader that resumes a
//! group from its committed offsets, a member that keeps a group active, and `mirror-maker
//! translate` run as a child process.
//!
//! Every record these helpers write has a value naming it uniquely (`plain/2/17`,
//! `txn/t4/9`, `compacted/r3/k12`), so a test compares what a group reads on each cluster id by
//! id, whatever offsets the records have there.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use mirror_maker::mirror::flush::send_waiting;
use mirror_maker::tools::compare::{reader_from, scan};

/// One record as a group reads it: where it is, and the identity its value carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub offset: i64,
    pub id: String,
}

/// A producer to `bootstrap` with these settings.
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("log_level", "3");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().expect("a producer")
}

/// Sends one record whose value is `id` (retrying while the queue is full).
pub fn send_id(p: &BaseProducer, topic: &str, partition: i32, key: Option<&str>, id: &str) {
    // Stamped now (the producer's default): segment.ms rolls segments by record timestamps.
    let mut record: BaseRecord<'_, str, str> =
        BaseRecord::to(topic).partition(partition).payload(id);
    record.key = key;
    send_waiting(p, record, None)
        .unwrap_or_else(|e| panic!("producing to {topic}/{partition}: {e}"));
    p.poll(Duration::ZERO);
}

/// Writes records `range` to each partition of `topic`; record `i` of partition `p` has the id
/// `{topic}/{p}/{i}`.
pub fn write_ids(bootstrap: &str, topic: &str, partitions: i32, range: std::ops::Range<u64>) {
    let p = producer(bootstrap, &[]);
    for i in range {
        for part in 0..partitions {
            send_id(&p, topic, part, None, &format!("{topic}/{part}/{i}"));
        }
    }
    p.flush(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("flushing records to {topic}: {e}"));
}

/// Writes `transactions` transactions of `per_partition` records to each partition of `topic`
/// with one transactional producer, aborting those `aborted(t)` names. Record `i` of
/// transaction `t` has the id `{topic}/t{t}/{i}` (`aborted:...` in an aborted one, so that a
/// reader that saw one could not take it for a committed record). Returns how many records
/// were committed per partition.
pub fn write_transactions(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    transactions: u64,
    per_partition: u64,
    aborted: impl Fn(u64) -> bool,
) -> u64 {
    let p = producer(
        bootstrap,
        &[("transactional.id", &format!("{topic}-writer"))],
    );
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    let mut committed = 0;
    for t in 0..transactions {
        p.begin_transaction().expect("begin_transaction");
        for i in 0..per_partition * partitions as u64 {
            let prefix = if aborted(t) { "aborted:" } else { "" };
            let part = (i % partitions as u64) as i32;
            send_id(&p, topic, part, None, &format!("{prefix}{topic}/t{t}/{i}"));
        }
        p.flush(Duration::from_secs(30)).expect("flush");
        if aborted(t) {
            p.abort_transaction(Duration::from_secs(30))
                .expect("abort_transaction");
        } else {
            p.commit_transaction(Duration::from_secs(30))
                .expect("commit_transaction");
            committed += per_partition;
        }
    }
    committed
}

/// Writes rounds of keyed records: round `r` writes the keys `keys(r)` (key `k` to partition
/// `k % partitions`); the record of key `k` in round `r` has the id `{topic}/r{r}/k{k}`. Each
/// round in its own segment when the topic has a `segment.ms` below 150.
pub fn write_keyed_rounds(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    rounds: std::ops::Range<u64>,
    keys: impl Fn(u64) -> std::ops::Range<u64>,
) {
    let p = producer(bootstrap, &[]);
    for r in rounds {
        for k in keys(r) {
            let part = (k % partitions as u64) as i32;
            send_id(
                &p,
                topic,
                part,
                Some(&format!("key-{k}")),
                &format!("{topic}/r{r}/k{k}"),
            );
        }
        p.flush(Duration::from_secs(30)).expect("flush");
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn read_committed_reader(bootstrap: &str) -> mirror_maker::tools::compare::Reader {
    reader_from(
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", "read_committed")
            .clone(),
    )
    .expect("a reader")
}

fn seen(m: &rdkafka::message::BorrowedMessage<'_>) -> Seen {
    Seen {
        offset: m.offset(),
        id: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
    }
}

/// The records (read_committed) of `topic`/`partition` from offset `from` to the partition's
/// end.
pub fn read_from(bootstrap: &str, topic: &str, partition: i32, from: i64) -> Vec<Seen> {
    let reader = read_committed_reader(bootstrap);
    let (_, high) = reader
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("watermarks of {topic}/{partition} on {bootstrap}: {e}"));
    let mut out = Vec::new();
    scan(
        &reader,
        topic,
        &[(partition, from, high)],
        Duration::from_secs(30),
        |_, m| out.push(seen(m)),
    )
    .unwrap_or_else(|e| panic!("reading {topic}/{partition} from {from} on {bootstrap}: {e}"));
    out
}

/// Every record (read_committed) of `topic`/`partition`.
pub fn read_all(bootstrap: &str, topic: &str, partition: i32) -> Vec<Seen> {
    read_from(bootstrap, topic, partition, 0)
}

/// `group`'s committed offsets on partitions `0..partitions` of `topic` (-1: none).
pub fn group_offsets(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // A cluster's first group waits for its offsets topic: NOT_COORDINATOR until it is made.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let committed = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("committed offsets of {group} on {bootstrap}: {e}; asking again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("committed offsets of {group} on {bootstrap}: {e}"),
        }
    };
    committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => -1,
        })
        .collect()
}

/// Commits these offsets of `topic` to `group` (as a consumer that is no member, the way a
/// tool or an application using `assign` commits).
pub fn commit_offsets(bootstrap: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("an offset");
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .unwrap_or_else(|e| panic!("committing {offsets:?} of {topic} to {group}: {e}"));
}

/// Commits these offsets of `topic` to `group` as a member of it: subscribes (with `extra`
/// settings, e.g. `group.protocol=consumer` for a KIP-848 group), waits for every listed
/// partition, commits, and leaves.
pub fn commit_as_member(
    bootstrap: &str,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64)],
    extra: &[(&str, &str)],
) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("log_level", "3");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    let consumer: BaseConsumer = config.create().expect("a consumer");
    consumer
        .subscribe(&[topic])
        .unwrap_or_else(|e| panic!("subscribing {group} to {topic}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        let assigned = consumer.assignment().unwrap_or_default();
        if offsets
            .iter()
            .all(|(p, _)| assigned.find_partition(topic, *p).is_some())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{group} got no partitions {offsets:?} of {topic} within 60 s"
        );
    }
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("an offset");
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap_or_else(|e| {
        panic!("committing {offsets:?} of {topic} as a member of {group}: {e}")
    });
    consumer.unsubscribe();
    let _ = consumer.poll(Duration::from_millis(500));
}

/// An application in consumer group `group`: on each partition `p` of `topic` it reads
/// `counts[p]` records from the group's committed offset (the partition's start when none),
/// then commits the offset after the last one it read (the start offset when it read none)
/// and stops. Returns what it read, per partition.
pub fn app_read_and_commit(
    bootstrap: &str,
    group: &str,
    topic: &str,
    counts: &[usize],
) -> Vec<Vec<Seen>> {
    let partitions = counts.len() as i32;
    let starts = group_offsets(bootstrap, group, topic, partitions);
    let mut read = Vec::new();
    let mut commits = Vec::new();
    for (p, &count) in counts.iter().enumerate() {
        let p = p as i32;
        let start = starts[p as usize].max(0);
        let got: Vec<Seen> = read_from(bootstrap, topic, p, start)
            .into_iter()
            .take(count)
            .collect();
        assert_eq!(
            got.len(),
            count,
            "{topic}/{p} has only {} records after offset {start}; the application wants {count}",
            got.len()
        );
        commits.push((p, got.last().map_or(start, |s| s.offset + 1)));
        read.push(got);
    }
    commit_offsets(bootstrap, group, topic, &commits);
    read
}

/// What `group` reads of `topic` on `bootstrap` when it resumes from its committed offsets,
/// to each partition's end; panics on a partition where the group has no committed offset.
pub fn resume(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<Vec<Seen>> {
    group_offsets(bootstrap, group, topic, partitions)
        .into_iter()
        .enumerate()
        .map(|(p, o)| {
            assert!(o >= 0, "{group} has no committed offset on {topic}/{p}");
            read_from(bootstrap, topic, p as i32, o)
        })
        .collect()
}

/// How a group's reads on the target after a failover differ from what it had left to read on
/// the source, for one partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resumption {
    /// Records left to read on the source.
    pub expected: usize,
    /// Records read on the target.
    pub read: usize,
    /// Records left to read on the source that the target group did not read.
    pub lost: Vec<String>,
    /// Records the target group read more than once, or had already read on the source.
    pub read_twice: Vec<String>,
    /// Records read on the target that the source does not hold after the group's offset.
    pub foreign: Vec<String>,
    /// Whether the target reads are exactly the source's remainder, in order.
    pub exact: bool,
}

impl Resumption {
    /// Compares `read` on the target with what was `read_before` on the source and what was
    /// `left` there.
    pub fn of(read_before: &[Seen], left: &[Seen], read: &[Seen]) -> Resumption {
        use std::collections::{HashMap, HashSet};
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for s in read {
            *counts.entry(&s.id).or_default() += 1;
        }
        let before: HashSet<&str> = read_before.iter().map(|s| s.id.as_str()).collect();
        let left_ids: HashSet<&str> = left.iter().map(|s| s.id.as_str()).collect();
        let mut read_twice: Vec<String> = counts
            .iter()
            .filter(|(id, n)| **n > 1 || before.contains(*id))
            .map(|(id, _)| (*id).to_owned())
            .collect();
        read_twice.sort();
        let lost = left
            .iter()
            .filter(|s| !counts.contains_key(s.id.as_str()))
            .map(|s| s.id.clone())
            .collect();
        let foreign = read
            .iter()
            .filter(|s| !left_ids.contains(s.id.as_str()) && !before.contains(s.id.as_str()))
            .map(|s| s.id.clone())
            .collect();
        let exact = left.iter().map(|s| &s.id).eq(read.iter().map(|s| &s.id));
        Resumption {
            expected: left.len(),
            read: read.len(),
            lost,
            read_twice,
            foreign,
            exact,
        }
    }

    /// Counts and the first few ids of each kind.
    pub fn summary(&self) -> String {
        let few = |v: &[String]| -> String {
            let shown: Vec<&str> = v.iter().take(5).map(String::as_str).collect();
            format!(
                "{}{}",
                shown.join(","),
                if v.len() > 5 { ",..." } else { "" }
            )
        };
        format!(
            "{} left on the source, {} read on the target: {} lost [{}], {} read twice [{}], {} \
             foreign [{}], in order: {}",
            self.expected,
            self.read,
            self.lost.len(),
            few(&self.lost),
            self.read_twice.len(),
            few(&self.read_twice),
            self.foreign.len(),
            few(&self.foreign),
            self.exact
        )
    }
}

/// A member of `group` on `bootstrap`, subscribed to `topic` and polling in a thread (never
/// committing) until it is stopped: the group has an active member meanwhile.
pub struct ActiveMember {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ActiveMember {
    /// Joins and waits until the member has partitions; `extra` client settings (e.g.
    /// `group.protocol=consumer`) added.
    pub fn join(bootstrap: &str, group: &str, topic: &str, extra: &[(&str, &str)]) -> Self {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest")
            .set("log_level", "3");
        for (k, v) in extra {
            config.set(*k, *v);
        }
        let consumer: BaseConsumer = config.create().expect("a consumer");
        consumer
            .subscribe(&[topic])
            .unwrap_or_else(|e| panic!("subscribing {group} to {topic}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let assigned = Arc::new(AtomicBool::new(false));
        let (flag, has) = (stop.clone(), assigned.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(100));
                if consumer.assignment().is_ok_and(|a| a.count() > 0) {
                    has.store(true, Ordering::Relaxed);
                }
            }
            consumer.unsubscribe();
            // Leave the group now, not at the session's end.
            let _ = consumer.poll(Duration::from_millis(500));
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !assigned.load(Ordering::Relaxed) {
            assert!(
                Instant::now() < deadline,
                "{group} got no partitions of {topic} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        ActiveMember {
            stop,
            thread: Some(thread),
        }
    }

    /// Leaves the group.
    pub fn leave(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ActiveMember {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// One partition of `mirror-maker translate --json`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    pub topic: String,
    pub partition: i32,
    pub source_offset: i64,
    /// `exact`, `waiting`, `untranslatable` or `unknown`.
    pub status: String,
    pub target_topic: Option<String>,
    pub target_partition: Option<i32>,
    pub target_offset: Option<i64>,
    pub reason: Option<String>,
}

/// What `mirror-maker translate` did: its exit code, its partitions (with `--json`), its
/// output.
#[derive(Debug)]
pub struct TranslateRun {
    pub code: Option<i32>,
    pub partitions: Vec<Translated>,
    pub stdout: String,
    pub stderr: String,
}

impl TranslateRun {
    /// The partition `topic`/`partition`; panics with the output when it is not listed.
    pub fn get(&self, topic: &str, partition: i32) -> &Translated {
        self.partitions
            .iter()
            .find(|t| t.topic == topic && t.partition == partition)
            .unwrap_or_else(|| panic!("translate lists no {topic}/{partition}: {self:?}"))
    }
}

/// Runs `mirror-maker translate --consumer.config consumer --producer.config producer --group
/// group --json` with `extra` arguments (e.g. `--apply`).
pub fn translate(consumer: &Path, producer: &Path, group: &str, extra: &[&str]) -> TranslateRun {
    let out = super::binary()
        .arg("translate")
        .arg("--consumer.config")
        .arg(consumer)
        .arg("--producer.config")
        .arg(producer)
        .args(["--group", group, "--json"])
        .args(extra)
        .env("RUST_LOG", "info")
        .output()
        .expect("running mirror-maker translate");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let partitions = serde_json::from_str::<serde_json::Value>(stdout.trim())
        .ok()
        .and_then(|v| {
            if v["group"].as_str() != Some(group) {
                return None;
            }
            v["partitions"].as_array().map(|ps| {
                ps.iter()
                    .map(|p| Translated {
                        topic: p["topic"].as_str().unwrap_or_default().to_owned(),
                        partition: p["partition"].as_i64().unwrap_or(-1) as i32,
                        source_offset: p["source_offset"].as_i64().unwrap_or(-1),
                        status: p["status"].as_str().unwrap_or_default().to_owned(),
                        target_topic: p["target_topic"].as_str().map(str::to_owned),
                        target_partition: p["target_partition"].as_i64().map(|q| q as i32),
                        target_offset: p["target_offset"].as_i64(),
                        reason: p["reason"].as_str().map(str::to_owned),
                    })
                    .collect()
            })
        })
        .unwrap_or_default();
    TranslateRun {
        code: out.status.code(),
        partitions,
        stdout,
        stderr,
    }
}
