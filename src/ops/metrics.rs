//! Prometheus metrics (`--metrics.addr`), served by [`super::health`].
//!
//! Counters on the record path are plain integers the streams already keep (the offset
//! tracker counts per source partition); they are read at scrape time by a collector, so
//! metrics add no label look-up or allocation per record. Only the replication-latency
//! histogram is observed per acknowledged record, and only while metrics are served.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::mirror::offsets::{PartitionCounters, PartitionTotals};
use crate::mirror::state::{PartitionLag, Stats};

/// One snapshot of every stream, summed per source partition.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub partitions: Vec<PartitionTotals>,
    /// Records between each partition's position and its high watermark, per the consumers'
    /// latest statistics.
    pub lag: Vec<PartitionLag>,
    /// Per source topic, its partitions' largest replication delay.
    pub delay: std::collections::BTreeMap<String, std::time::Duration>,
}

impl Snapshot {
    pub fn take(stats: &Stats) -> Snapshot {
        let mut snapshot = Snapshot::default();
        // A partition that moved between streams of this process has counters in both.
        let mut summed: std::collections::BTreeMap<(String, i32), PartitionCounters> =
            Default::default();
        let now = std::time::Instant::now();
        for stream in stats.streams.live() {
            for ((topic, _), delay) in stream.delay.delays(now) {
                let worst = snapshot.delay.entry(topic).or_default();
                *worst = (*worst).max(delay);
            }
            for p in stream.tracker().partition_counters() {
                summed
                    .entry((p.topic, p.partition))
                    .or_default()
                    .add(&p.counters);
            }
            snapshot.lag.extend(
                stream
                    .lag
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned(),
            );
        }
        snapshot.partitions = summed
            .into_iter()
            .map(|((topic, partition), counters)| PartitionTotals {
                topic,
                partition,
                counters,
            })
            .collect();
        snapshot.lag.sort();
        snapshot
    }

    /// The lag summed over the partitions the consumers' statistics report; `None` until
    /// statistics of an assigned partition have come (before the first assignment, a backlog
    /// may be waiting: that is not a lag of 0).
    pub fn total_lag(&self) -> Option<i64> {
        (!self.lag.is_empty()).then(|| self.lag.iter().map(|l| l.records).sum())
    }

    /// `lag N`, or `lag unknown` (see [`total_lag`](Self::total_lag)).
    pub fn lag_text(&self) -> String {
        match self.total_lag() {
            Some(lag) => format!("lag {lag}"),
            None => "lag unknown".to_owned(),
        }
    }

    /// The largest replication delay of any partition; `None` before any statistics.
    pub fn max_delay(&self) -> Option<std::time::Duration> {
        self.delay.values().max().copied()
    }

    pub fn total_in_flight(&self) -> u64 {
        self.partitions.iter().map(|p| p.counters.in_flight).sum()
    }
}

/// Encodes one metric family with a sample per source partition; `metric` makes the sample
/// (a counter or a gauge) from its value.
fn encode_per_partition<'a, V: Default, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a String, i32, V)>,
    metric: fn(V) -> M,
) -> Result<(), std::fmt::Error> {
    let mut family =
        encoder.encode_descriptor(name, help, None, metric(V::default()).metric_type())?;
    for (topic, partition, value) in samples {
        let labels = partition_labels(topic, partition);
        metric(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Reads the streams at scrape time.
#[derive(Debug)]
struct StreamCollector {
    stats: Arc<Stats>,
}

type PartitionLabels = [(&'static str, String); 2];

/// Reads one counter of a partition.
type CounterOf = fn(&PartitionCounters) -> u64;

fn partition_labels(topic: &str, partition: i32) -> PartitionLabels {
    [
        ("topic", topic.to_owned()),
        ("partition", partition.to_string()),
    ]
}

impl Collector for StreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = Snapshot::take(&self.stats);
        let per_partition: [(&str, &str, CounterOf); 3] = [
            ("mirror_records_consumed", "Source records consumed", |c| {
                c.consumed
            }),
            (
                "mirror_bytes_consumed",
                "Bytes of the source records consumed: key, value and headers (record engine), \
                 record batches as sent (batch engine)",
                |c| c.consumed_bytes,
            ),
            (
                "mirror_records_acknowledged",
                "Source records whose every target record the target acknowledged",
                |c| c.acknowledged,
            ),
        ];
        for (name, help, value) in per_partition {
            let samples = snapshot
                .partitions
                .iter()
                .map(|p| (&p.topic, p.partition, value(&p.counters)));
            encode_per_partition(&mut encoder, name, help, samples, ConstCounter::new)?;
        }
        let in_flight = snapshot
            .partitions
            .iter()
            .map(|p| (&p.topic, p.partition, p.counters.in_flight as i64));
        encode_per_partition(
            &mut encoder,
            "mirror_records_in_flight",
            "Source records consumed and not yet acknowledged by the target",
            in_flight,
            ConstGauge::new,
        )?;
        let lag = snapshot
            .lag
            .iter()
            .map(|l| (&l.topic, l.partition, l.records));
        encode_per_partition(
            &mut encoder,
            "mirror_consumer_lag",
            "Records between the mirror's position and the source partition's end",
            lag,
            ConstGauge::new,
        )?;
        let mut family = encoder.encode_descriptor(
            "mirror_replication_delay_seconds",
            "How long ago the oldest source record not yet on the target was appended, per \
             source topic (its partitions' largest; from this process's clocks, not record \
             timestamps)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (topic, delay) in &snapshot.delay {
            let labels = [("topic", topic.clone())];
            ConstGauge::new(delay.as_secs_f64()).encode(family.encode_family(&labels)?)?;
        }
        let worst = ConstGauge::new(snapshot.max_delay().unwrap_or_default().as_secs_f64());
        worst.encode(encoder.encode_descriptor(
            "mirror_replication_delay_max_seconds",
            "The largest replication delay of any source partition this process owns",
            None,
            worst.metric_type(),
        )?)?;
        let stats = &self.stats;
        if let Some(throttle) = stats.throttle.get() {
            let limits = [
                (
                    "mirror_throttle_bytes_per_second",
                    "The byte rate limit of --throttle.bytes.per.second, over all streams",
                    throttle.bytes_per_second(),
                ),
                (
                    "mirror_throttle_records_per_second",
                    "The record rate limit of --throttle.records.per.second, over all streams",
                    throttle.records_per_second(),
                ),
            ];
            for (name, help, limit) in limits {
                if let Some(limit) = limit {
                    let limit = ConstGauge::new(limit as i64);
                    limit.encode(encoder.encode_descriptor(
                        name,
                        help,
                        None,
                        limit.metric_type(),
                    )?)?;
                }
            }
            let throttled = ConstCounter::new(Stats::get(&stats.throttled_micros) as f64 / 1e6);
            throttled.encode(encoder.encode_descriptor(
                "mirror_throttled_seconds",
                "Seconds streams spent paused by the --throttle.*.per.second limits, summed over \
                 streams",
                None,
                throttled.metric_type(),
            )?)?;
        }
        let totals = [
            (
                "mirror_records_produced",
                "Target records handed to the producer",
                Stats::get(&stats.produced),
            ),
            (
                "mirror_records_dropped",
                "Records the target refused for good and skipped (--abort.on.send.failure false)",
                Stats::get(&stats.dropped),
            ),
            (
                "mirror_records_filtered",
                "Source records the message handler turned into no record",
                Stats::get(&stats.filtered),
            ),
            (
                "mirror_records_looped",
                "Source records not mirrored back to the cluster they came from (--loop.prevention)",
                Stats::get(&stats.looped),
            ),
            (
                "mirror_heartbeats_written",
                "Heartbeats the source acknowledged (--heartbeats.interval.ms; only the \
                 instance owning the heartbeats topic's partition 0 writes them)",
                Stats::get(&stats.heartbeats_written),
            ),
            (
                "mirror_commits",
                "Offset commits the source cluster accepted",
                Stats::get(&stats.commits),
            ),
            (
                "mirror_rebalances",
                "Rebalances (assignments and revocations) seen by the streams",
                Stats::get(&stats.rebalances),
            ),
            (
                "mirror_groups_synced",
                "Times --sync.group.offsets committed a group's translated offsets on the target",
                Stats::get(&stats.group_sync.groups_synced),
            ),
            (
                "mirror_topic_configs_synced",
                "Target topic configs --sync.topic.configs set as their source topics set them",
                Stats::get(&stats.topic_configs_synced),
            ),
            (
                "mirror_group_sync_offsets_refused",
                "Translated offsets --sync.group.offsets did not commit: outside the target \
                 partition's watermarks (a forged or stale offset-mapping record)",
                Stats::get(&stats.group_sync.offsets_refused),
            ),
        ];
        for (name, help, value) in totals {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let assigned = ConstGauge::new(stats.streams.with_assignment() as i64);
        assigned.encode(encoder.encode_descriptor(
            "mirror_streams_assigned",
            "Streams that have had their assignment from the group (possibly empty)",
            None,
            assigned.metric_type(),
        )?)?;
        let sync_gauges = [
            (
                "mirror_group_sync_partitions_waiting",
                "Group partitions whose offset the mirror has not copied up to yet (last sync)",
                &stats.group_sync.partitions_waiting,
            ),
            (
                "mirror_group_sync_translation_lag",
                "Records the mirror has still to copy before those groups' offsets (last sync)",
                &stats.group_sync.translation_lag,
            ),
        ];
        for (name, help, value) in sync_gauges {
            let gauge = ConstGauge::new(Stats::get(value) as i64);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let uptime = ConstGauge::new(stats.recorded.started.elapsed().as_secs_f64());
        uptime.encode(encoder.encode_descriptor(
            "mirror_uptime_seconds",
            "Seconds since the mirror started",
            None,
            uptime.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The registry served at `/metrics`.
pub fn registry(stats: &Arc<Stats>) -> Registry {
    let mut registry = Registry::default();
    let t = &stats.recorded;
    // Served at 0 from the start for the label values known now (the Prometheus guidelines
    // on missing series): a series that first appears at 1 is not an increase to `rate()`
    // or `increase()`, so an alert on it would miss the first records skipped.
    let _ = t
        .skipped
        .get_or_create(&vec![("reason".to_owned(), "retention".to_owned())]);
    registry.register(
        "mirror_replication_latency_seconds",
        "Acknowledgement time minus the source record's timestamp",
        t.latency.clone(),
    );
    registry.register(
        "mirror_commit_seconds",
        "Duration of synchronous offset commits (before releasing partitions, at shutdown)",
        t.commit_seconds.clone(),
    );
    registry.register(
        "mirror_send_errors",
        "Records the target refused for good, by error code",
        t.send_errors.clone(),
    );
    registry.register(
        "mirror_records_skipped",
        "Source records never mirrored because the source no longer had them (reason \
         retention: deleted before they were read, an offset reset)",
        t.skipped.clone(),
    );
    registry.register(
        "mirror_handler_refused",
        "Source records the message handler refused that --on.handler.error let the mirror go \
         past, by source topic and action (skip, dead-letter)",
        t.handler_refused.clone(),
    );
    registry.register(
        "mirror_store_records_rejected",
        "Offset-mapping records not taken on a read of the store, by reason (undecodable, \
         source_topic, target_topic, transactional_id); each read counts what it rejects",
        t.store_rejected.clone(),
    );
    registry.register(
        "mirror_commit_failures",
        "Offset commits the source cluster refused, by error code",
        t.commit_failures.clone(),
    );
    registry.register(
        "mirror_source_topic_recreated",
        "Source topics found deleted and created again (a new topic id) and mirrored again from \
         their beginning, by source topic",
        t.source_recreated.clone(),
    );
    registry.register(
        "mirror_config_sync_failures",
        "Topic configs the target refused to set (--sync.topic.configs), by target topic and key",
        t.config_sync_failures.clone(),
    );
    let info = prometheus_client::metrics::info::Info::new(vec![(
        "version".to_owned(),
        env!("CARGO_PKG_VERSION").to_owned(),
    )]);
    registry.register("mirror_build", "Build information", info);
    registry.register_collector(Box::new(StreamCollector {
        stats: stats.clone(),
    }));
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_skipped_for_retention_is_served_at_zero_from_the_start() {
        let stats = Arc::new(Stats::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry(&stats)).unwrap();
        assert!(
            text.contains("mirror_records_skipped_total{reason=\"retention\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn store_records_rejected_and_offsets_refused_are_served() {
        let stats = Arc::new(Stats::default());
        stats
            .recorded
            .store_rejected
            .get_or_create(&vec![("reason".to_owned(), "undecodable".to_owned())])
            .inc();
        Stats::add(&stats.group_sync.offsets_refused, 2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry(&stats)).unwrap();
        assert!(
            text.contains("mirror_store_records_rejected_total{reason=\"undecodable\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mirror_group_sync_offsets_refused_total 2"),
            "{text}"
        );
    }
}
