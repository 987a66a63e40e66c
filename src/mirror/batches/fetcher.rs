//! Our own Fetch: per source leader one request for the assigned partitions at their
//! positions, `read_committed` unless the consumer config says
//! `isolation.level=read_uncommitted`, sizes from `fetch.max.bytes` and
//! `max.partition.fetch.bytes`. The answer's records are returned as they came (a `Bytes`
//! slice of the response, no copy), with the aborted transactions listed beside them; which
//! batches that drops is [`AbortedFilter`]'s.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::batch::SourceBatch;
use super::cluster::{leader_moved, Cluster, ClusterError};
use super::wire::error_name;
use crate::settings::client::ClientProps;

/// One partition's part of a fetch answer.
pub(crate) struct Fetched {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// The offset it was fetched from.
    pub(crate) from: i64,
    pub(crate) result: Result<PartitionData, i16>,
}

pub(crate) struct PartitionData {
    pub(crate) records: Bytes,
    /// (producer id, first offset) of each aborted transaction in the range.
    pub(crate) aborted: Vec<(i64, i64)>,
    pub(crate) high_watermark: i64,
}

/// A partition to fetch: topic, partition, the offset to fetch from.
type Wanted = (String, i32, i64);

/// Fetch requests sent and not yet answered ([`Fetcher::send`]).
pub(crate) struct PendingFetch {
    wanted: Vec<Wanted>,
    /// The partitions already answered: no leader known, or their request not sent.
    out: Vec<Fetched>,
    /// Per broker, the partitions of the request sent to it.
    sent: Vec<(i32, Vec<Wanted>)>,
}

pub(crate) struct Fetcher {
    pub(crate) cluster: Cluster,
    read_committed: bool,
    max_bytes: i32,
    partition_max_bytes: i32,
    /// The latest request or answer that failed, for a warning when a partition's fetches
    /// keep failing.
    pub(crate) last_failure: Option<String>,
}

impl Fetcher {
    pub(crate) fn new(props: &ClientProps, timeout: Duration) -> Result<Fetcher, ClusterError> {
        let number = |key: &str, default: i32| {
            props
                .get(key)
                .and_then(|v| v.trim().parse::<i32>().ok())
                .unwrap_or(default)
        };
        Ok(Fetcher {
            cluster: Cluster::new("source", props, timeout)?,
            read_committed: !props
                .get("isolation.level")
                .is_some_and(|v| v.eq_ignore_ascii_case("read_uncommitted")),
            // librdkafka's defaults.
            max_bytes: number("fetch.max.bytes", 52_428_800),
            partition_max_bytes: number("max.partition.fetch.bytes", 1_048_576),
            last_failure: None,
        })
    }

    /// Fetches each of `wanted` (topic, partition, offset) from its leader, waiting at most
    /// `max_wait` for records: sends the requests and returns without reading their answers,
    /// so that the caller can do other work (a Produce round) while the source's leaders
    /// answer; [`receive`](Self::receive) reads them. Nothing else may use the source
    /// connections in between. Partitions without a known leader, or whose leader failed,
    /// come back with an error code (-1 for a lost connection) and are fetched again later.
    pub(crate) fn send(
        &mut self,
        wanted: Vec<(String, i32, i64)>,
        max_wait: Duration,
    ) -> PendingFetch {
        if wanted
            .iter()
            .any(|(t, p, _)| self.cluster.leader(t, *p).is_none())
        {
            self.refresh_for(&wanted);
        }
        let mut out = Vec::with_capacity(wanted.len());
        let mut by_broker: HashMap<i32, Vec<(String, i32, i64)>> = HashMap::new();
        for w in &wanted {
            match self.cluster.leader(&w.0, w.1) {
                Some((leader, _)) => by_broker.entry(leader).or_default().push(w.clone()),
                None => out.push(failed(w, 5)),
            }
        }
        let max_wait_ms = i32::try_from(max_wait.as_millis()).unwrap_or(500);
        let mut sent = Vec::new();
        for (broker, members) in by_broker {
            let mut topics: Vec<FetchTopic> = Vec::new();
            for (topic, partition, offset) in &members {
                let epoch = self.cluster.leader(topic, *partition).map_or(-1, |l| l.1);
                let p = FetchPartition::default()
                    .with_partition(*partition)
                    .with_fetch_offset(*offset)
                    .with_current_leader_epoch(epoch)
                    .with_partition_max_bytes(self.partition_max_bytes);
                match topics.iter_mut().find(|t| t.topic.0.as_str() == topic) {
                    Some(t) => t.partitions.push(p),
                    None => topics.push(
                        FetchTopic::default()
                            .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                            .with_partitions(vec![p]),
                    ),
                }
            }
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(max_wait_ms)
                .with_min_bytes(1)
                .with_max_bytes(self.max_bytes)
                .with_isolation_level(i8::from(self.read_committed))
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_topics(topics);
            let result = self
                .cluster
                .connection(broker)
                .map_err(|e| e.to_string())
                .and_then(|c| c.send(&request).map_err(|e| e.to_string()));
            match result {
                Ok(()) => sent.push((broker, members)),
                Err(reason) => {
                    tracing::debug!("source fetch: {reason}");
                    self.cluster.drop_connection(broker);
                    out.extend(members.iter().map(|w| failed(w, -1)));
                    self.last_failure = Some(reason);
                }
            }
        }
        PendingFetch { wanted, out, sent }
    }

    /// Reads the answers to the requests [`send`](Self::send) sent: one [`Fetched`] per
    /// wanted partition.
    pub(crate) fn receive(&mut self, pending: PendingFetch) -> Vec<Fetched> {
        let PendingFetch {
            wanted,
            mut out,
            sent,
        } = pending;
        let mut refresh = false;
        for (broker, members) in sent {
            let answer = self
                .cluster
                .connection(broker)
                .map_err(|e| e.to_string())
                .and_then(|c| c.receive::<FetchRequest>().map_err(|e| e.to_string()));
            let response = match answer {
                Ok(r) if r.error_code == 0 => r,
                Ok(r) => {
                    tracing::debug!("source fetch: {}", error_name(r.error_code));
                    out.extend(members.iter().map(|w| failed(w, r.error_code)));
                    continue;
                }
                Err(reason) => {
                    tracing::debug!("source fetch: {reason}");
                    self.cluster.drop_connection(broker);
                    refresh = true;
                    out.extend(members.iter().map(|w| failed(w, -1)));
                    self.last_failure = Some(reason);
                    continue;
                }
            };
            let mut answered: HashSet<(String, i32)> = HashSet::new();
            for t in response.responses {
                let topic = t.topic.0.as_str().to_owned();
                for p in t.partitions {
                    let Some(w) = members
                        .iter()
                        .find(|w| w.0 == topic && w.1 == p.partition_index)
                    else {
                        continue;
                    };
                    answered.insert((topic.clone(), p.partition_index));
                    if p.error_code != 0 {
                        refresh |= leader_moved(p.error_code);
                        out.push(failed(w, p.error_code));
                        continue;
                    }
                    out.push(Fetched {
                        topic: topic.clone(),
                        partition: p.partition_index,
                        from: w.2,
                        result: Ok(PartitionData {
                            records: p.records.unwrap_or_default(),
                            aborted: p
                                .aborted_transactions
                                .unwrap_or_default()
                                .iter()
                                .map(|a| (a.producer_id.0, a.first_offset))
                                .collect(),
                            high_watermark: p.high_watermark,
                        }),
                    });
                }
            }
            for w in members {
                if !answered.contains(&(w.0.clone(), w.1)) {
                    out.push(failed(&w, -1));
                }
            }
        }
        if refresh {
            self.refresh_for(&wanted);
        }
        out
    }

    fn refresh_for(&mut self, wanted: &[(String, i32, i64)]) {
        let mut topics: Vec<&str> = wanted.iter().map(|w| w.0.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        if let Err(e) = self.cluster.refresh(&topics) {
            tracing::debug!("source metadata: {e}");
        }
    }

    /// The earliest (`timestamp` -2) or latest (-1) offset of a partition, from its leader.
    pub(crate) fn list_offset(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<i64, String> {
        if self.cluster.leader(topic, partition).is_none() {
            self.cluster.refresh(&[topic]).map_err(|e| e.to_string())?;
        }
        let (leader, epoch) = self
            .cluster
            .leader(topic, partition)
            .ok_or_else(|| format!("no leader known for source {topic}/{partition}"))?;
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(i8::from(self.read_committed))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(epoch)
                    .with_timestamp(timestamp)])]);
        let result = self
            .cluster
            .connection(leader)
            .map_err(|e| e.to_string())
            .and_then(|c| c.call(&request).map_err(|e| e.to_string()));
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                self.cluster.drop_connection(leader);
                return Err(e);
            }
        };
        let p = response
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| format!("ListOffsets of source {topic}/{partition}: not answered"))?;
        if p.error_code != 0 {
            if leader_moved(p.error_code) {
                let _ = self.cluster.refresh(&[topic]);
            }
            return Err(format!(
                "ListOffsets of source {topic}/{partition}: {}",
                error_name(p.error_code)
            ));
        }
        Ok(p.offset)
    }
}

fn failed(w: &(String, i32, i64), code: i16) -> Fetched {
    Fetched {
        topic: w.0.clone(),
        partition: w.1,
        from: w.2,
        result: Err(code),
    }
}

/// Drops the batches of aborted transactions, as the Java consumer's `CompletedFetch` does:
/// the aborted transactions (producer id, first offset) in offset order; a producer id is
/// "aborting" from its transaction's first offset until its next control batch (its abort
/// marker: between an aborted transaction's first offset and its marker the producer writes no
/// other marker, transactions of one producer being sequential), and its transactional batches
/// meanwhile are dropped.
pub(crate) struct AbortedFilter {
    pending: Vec<(i64, i64)>,
    next: usize,
    aborting: HashSet<i64>,
}

impl AbortedFilter {
    pub(crate) fn new(mut aborted: Vec<(i64, i64)>) -> AbortedFilter {
        aborted.sort_by_key(|a| a.1);
        AbortedFilter {
            pending: aborted,
            next: 0,
            aborting: HashSet::new(),
        }
    }

    /// Whether `batch` belongs to an aborted transaction (control batches end one and are
    /// never kept by the engine either: the codec drops them).
    pub(crate) fn is_aborted(&mut self, batch: &SourceBatch) -> bool {
        while let Some(&(producer, first)) = self.pending.get(self.next) {
            if first > batch.last_offset() {
                break;
            }
            self.aborting.insert(producer);
            self.next += 1;
        }
        if batch.is_control() {
            self.aborting.remove(&batch.producer_id());
            return false;
        }
        batch.is_transactional() && self.aborting.contains(&batch.producer_id())
    }
}
