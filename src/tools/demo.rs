//! `mirror-maker demo`: the real pipeline between two embedded Kafka-protocol clusters.
//!
//! Starts two librdkafka mock clusters in this process, writes sample records (keys, null keys,
//! tombstones, repeated headers, explicit timestamps) into the source, mirrors them with the
//! default settings through [`pipeline::run`], then compares source and target record by record.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use super::compare::{compare, read_partition, Comparison};
use crate::mirror::flush::send_waiting;
use crate::mirror::pipeline;
use crate::mirror::state::{Control, Stats};
use crate::settings::client::{ClientProps, Role};
use crate::settings::flags::DemoArgs;
use crate::settings::routing::TopicFilter;
use crate::settings::{Settings, SettingsOptions};

const TOPIC: &str = "demo.orders";
const GROUP: &str = "mirror-maker-demo";
/// The mock cluster deletes older records beyond about 5 MB per partition.
const MOCK_PARTITION_BYTES: u64 = 4 * 1024 * 1024;

/// One sample record; every field the mirror must keep varies across records.
pub struct Sample {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: i64,
}

pub fn sample(i: u64, partitions: i32, value_bytes: usize) -> Sample {
    let key = (!i.is_multiple_of(15)).then(|| format!("customer-{}", i % 1000).into_bytes());
    let value = (i % 25 != 7).then(|| {
        let mut v = format!("{{\"order\":{i},\"amount\":{}}}", i * 7 % 10_000).into_bytes();
        v.resize(value_bytes, b' ');
        v
    });
    let mut headers = vec![("trace-id".to_owned(), Some(i.to_string().into_bytes()))];
    if i.is_multiple_of(3) {
        headers.push(("hop".to_owned(), Some(b"eu-west".to_vec())));
        headers.push(("hop".to_owned(), Some(b"eu-central".to_vec())));
    }
    if i.is_multiple_of(11) {
        headers.push(("empty".to_owned(), None));
    }
    Sample {
        partition: (i % partitions as u64) as i32,
        key,
        value,
        headers,
        timestamp: 1_700_000_000_000 + i as i64,
    }
}

/// Writes the sample records `indices` (in that order) into `topic` on the cluster at
/// `bootstrap`.
pub fn write_samples(
    bootstrap: &str,
    topic: &str,
    indices: impl IntoIterator<Item = u64>,
    partitions: i32,
    value_bytes: usize,
) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("log_level", "3")
        .create()?;
    for i in indices {
        let s = sample(i, partitions, value_bytes);
        let mut headers = OwnedHeaders::new_with_capacity(s.headers.len());
        for (k, v) in &s.headers {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(s.partition)
            .timestamp(s.timestamp)
            .headers(headers);
        record.key = s.key.as_deref();
        record.payload = s.value.as_deref();
        send_waiting(&producer, record, None)
            .map_err(|e| anyhow::anyhow!("writing sample record {i}: {e}"))?;
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(60))
        .context("flushing the sample records")?;
    Ok(())
}

/// Compares every partition of `topic` between the two clusters.
pub fn compare_topic(
    source: &str,
    target: &str,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<Comparison> {
    let mut total = Comparison {
        in_order: true,
        ..Comparison::default()
    };
    for p in 0..partitions {
        let s = read_partition(source, topic, p, Duration::from_secs(60))?;
        let t = read_partition(target, topic, p, Duration::from_secs(60))?;
        total.add(&compare(&s, &t));
    }
    Ok(total)
}

/// Runs the demo; `Ok(false)` if the copy was not exact (already reported).
pub fn run(args: &DemoArgs) -> anyhow::Result<bool> {
    check_fits(args)?;
    let source = MockCluster::new(1).context("starting the embedded source cluster")?;
    let target = MockCluster::new(1).context("starting the embedded target cluster")?;
    source.create_topic(TOPIC, args.partitions, 1)?;
    target.create_topic(TOPIC, args.partitions, 1)?;
    let (src, dst) = (source.bootstrap_servers(), target.bootstrap_servers());
    println!("source cluster {src}, target cluster {dst}");

    let started = Instant::now();
    write_samples(
        &src,
        TOPIC,
        0..args.records,
        args.partitions,
        args.value_bytes,
    )?;
    println!(
        "wrote {} sample records into {TOPIC} ({} partitions) in {:.1?}",
        args.records,
        args.partitions,
        started.elapsed()
    );
    let settings = demo_settings(&src, &dst, args)?;
    let run = mirror_watched(&settings, args.records)?;
    let c = compare_topic(&src, &dst, TOPIC, args.partitions)?;
    let committed = committed_total(&src, args.partitions)?;
    Ok(report(args, &c, committed, &run))
}

/// The embedded cluster keeps about 5 MB per partition; a larger backlog would be deleted
/// before it is mirrored.
fn check_fits(args: &DemoArgs) -> anyhow::Result<()> {
    let record_bytes = args.value_bytes as u64 + 64;
    let per_partition = args.records.div_ceil(args.partitions as u64) * record_bytes;
    if per_partition > MOCK_PARTITION_BYTES {
        anyhow::bail!(
            "{} records of {} bytes over {} partitions is about {} KiB per partition; the embedded \
             cluster keeps only about 5 MB per partition. Use more --partitions (at least {})",
            args.records,
            args.value_bytes,
            args.partitions,
            per_partition / 1024,
            (args.records * record_bytes).div_ceil(MOCK_PARTITION_BYTES)
        );
    }
    Ok(())
}

/// The mirror's settings for the demo: defaults, but for a short session and commit interval.
fn demo_settings(src: &str, dst: &str, args: &DemoArgs) -> anyhow::Result<Settings> {
    Ok(Settings::new(
        ClientProps::from_pairs(
            Role::Consumer,
            "demo consumer config",
            [
                ("bootstrap.servers", src),
                ("group.id", GROUP),
                // The embedded cluster waits a whole session timeout for a member that is
                // slow to rejoin; keep it short (see docs/testing.md).
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "500"),
            ],
        ),
        ClientProps::from_pairs(
            Role::Producer,
            "demo producer config",
            [("bootstrap.servers", dst)],
        ),
        TopicFilter::new(TOPIC)?,
        SettingsOptions {
            num_streams: args.streams as usize,
            commit_interval: Duration::from_secs(1),
            ..SettingsOptions::default()
        },
    )?)
}

/// What the watched run measured.
struct Run {
    summary: pipeline::Summary,
    /// From the mirror's start to its first record, and to its last acknowledgement.
    first_record: Option<Duration>,
    done: Duration,
    consumed_bytes: u64,
}

/// Runs the mirror until `records` are acknowledged, printing its progress every second,
/// then stops it.
fn mirror_watched(settings: &Settings, records: u64) -> anyhow::Result<Run> {
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    let started = Instant::now();
    let mut first_record = None;
    let (joined, done) = thread::scope(|scope| {
        let mirror = {
            let (control, stats) = (control.clone(), stats.clone());
            scope.spawn(move || pipeline::run(settings, control, stats))
        };
        let mut last_print = Instant::now();
        let mut said_waiting = false;
        loop {
            let acked = Stats::get(&stats.acknowledged);
            if first_record.is_none() && Stats::get(&stats.consumed) > 0 {
                first_record = Some(started.elapsed());
            }
            if acked >= records || mirror.is_finished() {
                break;
            }
            if last_print.elapsed() >= Duration::from_secs(1) {
                if acked > 0 {
                    println!(
                        "mirrored {acked} of {records} records ({:.0}%)",
                        acked as f64 * 100.0 / records as f64
                    );
                } else if !said_waiting {
                    println!("waiting for the mirror's consumer group to form...");
                    said_waiting = true;
                }
                last_print = Instant::now();
            }
            thread::sleep(Duration::from_millis(20));
        }
        let done = started.elapsed();
        control.request_stop();
        (mirror.join(), done)
    });
    let summary = match joined {
        Ok(Ok(summary)) => summary,
        Ok(Err(e)) => return Err(e).context("the mirror failed"),
        Err(_) => anyhow::bail!("the mirror thread panicked"),
    };
    Ok(Run {
        summary,
        first_record,
        done,
        consumed_bytes: Stats::get(&stats.consumed_bytes),
    })
}

/// Prints the verification and the throughput; whether the copy was exact and complete.
fn report(args: &DemoArgs, c: &Comparison, committed: u64, run: &Run) -> bool {
    let total = run.done.as_secs_f64();
    let steady = run
        .first_record
        .map_or(total, |f| (run.done - f).as_secs_f64());
    println!();
    println!("verification of {TOPIC}, record by record (key, value, headers, timestamp, order):");
    println!("  records in source        {}", c.source);
    println!("  records in target        {}", c.target);
    println!("  lost                     {}", c.lost);
    println!("  changed                  {}", c.changed);
    println!("  duplicated               {}", c.duplicated);
    println!(
        "  order kept per partition {}",
        if c.in_order { "yes" } else { "NO" }
    );
    println!("  committed on source      {committed} of {}", args.records);
    println!("  unacknowledged at stop   {}", run.summary.unacknowledged);
    println!(
        "  throughput               {:.0} records/s, {:.1} MB/s from first record; {:.0} records/s including the group join ({total:.1} s)",
        c.source as f64 / steady,
        run.consumed_bytes as f64 / steady / 1e6,
        c.source as f64 / total
    );
    let ok = c.is_exact() && c.source == args.records && committed == args.records;
    println!(
        "{}",
        if ok {
            "OK: nothing lost, nothing changed"
        } else {
            "FAILED"
        }
    );
    ok
}

fn committed_total(bootstrap: &str, partitions: i32) -> anyhow::Result<u64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("log_level", "3")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(TOPIC, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => o.max(0) as u64,
            _ => 0,
        })
        .sum())
}
