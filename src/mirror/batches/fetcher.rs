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

/// The order partitions are listed in a Fetch. A broker fills a Fetch answer in its
/// request's order, and returns a batch larger than `max.partition.fetch.bytes` whole only to
/// the first partition that has records (KIP-74): to the others it returns no records at all
/// (Fetch v3 and later; older versions a cut batch). Listed in a fixed order, a partition
/// behind a busy one whose next batch is that large made no progress for as long as the other
/// had records. So, as the Java consumer moves a partition that returned records to the end of
/// its fetch order (`movePartitionToEnd`), a partition that brought a whole batch goes behind
/// those that did not, and one that brought none goes ahead of them in the next Fetch.
#[derive(Default)]
struct FetchOrder {
    /// When each partition last brought a whole batch (a count of such answers).
    served: HashMap<(String, i32), u64>,
    answers: u64,
}

impl FetchOrder {
    /// Sorts one broker's partitions: those served longest ago (or never) first, ties kept in
    /// their order.
    fn arrange(&self, members: &mut [Wanted]) {
        members.sort_by_cached_key(|w| self.served.get(&(w.0.clone(), w.1)).copied().unwrap_or(0));
    }

    /// Notes what a partition's answer held; the size of its first batch, whole or cut.
    fn note(&mut self, topic: &str, partition: i32, records: &[u8]) -> Option<usize> {
        let first = first_batch_size(records)?;
        if first <= records.len() {
            self.answers += 1;
            self.served
                .insert((topic.to_owned(), partition), self.answers);
        }
        Some(first)
    }
}

/// A Fetch's topics for `members`, listed in their order: a new topic entry whenever the
/// topic changes, as the Java consumer's builder does (a broker reads the partitions in
/// request order), not each partition gathered under its topic's first place, which would
/// undo [`FetchOrder`]'s order whenever several topics share a leader. `epoch` gives each
/// partition's leader epoch.
fn fetch_topics(
    members: &[Wanted],
    partition_max_bytes: i32,
    epoch: impl Fn(&str, i32) -> i32,
) -> Vec<FetchTopic> {
    let mut topics: Vec<FetchTopic> = Vec::new();
    for (topic, partition, offset) in members {
        let p = FetchPartition::default()
            .with_partition(*partition)
            .with_fetch_offset(*offset)
            .with_current_leader_epoch(epoch(topic, *partition))
            .with_partition_max_bytes(partition_max_bytes);
        match topics.last_mut().filter(|t| t.topic.0.as_str() == topic) {
            Some(t) => t.partitions.push(p),
            None => topics.push(
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(vec![p]),
            ),
        }
    }
    topics
}

/// The size of the first batch (or legacy message set entry) in `records`, by its header:
/// the base offset (8 bytes) and the length of the rest (4 bytes) come first in every format.
fn first_batch_size(records: &[u8]) -> Option<usize> {
    let length = i32::from_be_bytes(records.get(8..12)?.try_into().ok()?);
    Some(12 + usize::try_from(length).ok()?)
}

pub(crate) struct Fetcher {
    pub(crate) cluster: Cluster,
    read_committed: bool,
    max_bytes: i32,
    partition_max_bytes: i32,
    order: FetchOrder,
    /// Partitions said at warn to hold a batch larger than `max.partition.fetch.bytes`.
    oversized_said: HashSet<(String, i32)>,
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
            order: FetchOrder::default(),
            oversized_said: HashSet::new(),
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
        for (broker, mut members) in by_broker {
            self.order.arrange(&mut members);
            let cluster = &self.cluster;
            let topics = fetch_topics(&members, self.partition_max_bytes, |t, p| {
                cluster.leader(t, p).map_or(-1, |l| l.1)
            });
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
                    let records = p.records.unwrap_or_default();
                    if let Some(first) = self.order.note(&topic, p.partition_index, &records) {
                        self.oversized(&topic, p.partition_index, w.2, first);
                    }
                    out.push(Fetched {
                        topic: topic.clone(),
                        partition: p.partition_index,
                        from: w.2,
                        result: Ok(PartitionData {
                            records,
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

    /// A partition's first batch fetched (`size` bytes, at or after `offset`): said at warn
    /// once per partition when it is larger than `max.partition.fetch.bytes`, since such a
    /// batch comes only when its partition is the first with records in a Fetch.
    fn oversized(&mut self, topic: &str, partition: i32, offset: i64, size: usize) {
        let limit = usize::try_from(self.partition_max_bytes).unwrap_or(0);
        if size <= limit || !self.oversized_said.insert((topic.to_owned(), partition)) {
            return;
        }
        tracing::warn!(
            "source {topic}/{partition}: a batch at offset {offset} or after is {size} bytes, \
             more than the consumer's max.partition.fetch.bytes ({limit}): a broker returns \
             such a batch only to the first partition with records in a Fetch, so \
             {topic}/{partition} waits its turn to be first while its broker's other \
             partitions are busy; raise max.partition.fetch.bytes above {size} to fetch such \
             batches at full rate"
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch header claiming `size` bytes in all, followed by `present` bytes of it.
    fn batch(size: usize, present: usize) -> Vec<u8> {
        let mut b = vec![0u8; present.max(12)];
        b[8..12].copy_from_slice(&((size - 12) as i32).to_be_bytes());
        b.truncate(present.max(12));
        b
    }

    fn wanted(partitions: &[i32]) -> Vec<Wanted> {
        partitions.iter().map(|&p| ("t".to_owned(), p, 0)).collect()
    }

    #[test]
    fn a_partition_whose_batch_came_cut_goes_first_in_the_next_fetch() {
        let mut order = FetchOrder::default();
        let mut members = wanted(&[0, 1, 2, 3]);
        order.arrange(&mut members);
        // 0, 1 and 3 brought whole batches; 2's came cut (Fetch v2 and older).
        assert_eq!(order.note("t", 0, &batch(100, 100)), Some(100));
        assert_eq!(order.note("t", 1, &batch(100, 150)), Some(100));
        assert_eq!(order.note("t", 2, &batch(2_000_000, 1000)), Some(2_000_000));
        assert_eq!(order.note("t", 3, &batch(100, 100)), Some(100));
        order.arrange(&mut members);
        let listed: Vec<i32> = members.iter().map(|w| w.1).collect();
        assert_eq!(listed, vec![2, 0, 1, 3]);
    }

    #[test]
    fn partitions_that_brought_records_go_behind_in_the_order_served() {
        let mut order = FetchOrder::default();
        let mut members = wanted(&[0, 1, 2]);
        order.note("t", 0, &batch(50, 50));
        order.note("t", 1, &batch(50, 50));
        // 2 brought nothing: it stays ahead of both.
        assert_eq!(order.note("t", 2, &[]), None);
        order.note("t", 0, &batch(50, 50));
        order.arrange(&mut members);
        let listed: Vec<i32> = members.iter().map(|w| w.1).collect();
        assert_eq!(listed, vec![2, 1, 0]);
    }

    #[test]
    fn a_fetch_lists_partitions_in_their_order_across_topics() {
        let members: Vec<Wanted> = [("b", 0), ("a", 3), ("b", 1), ("b", 2)]
            .iter()
            .map(|&(t, p)| (t.to_owned(), p, 0))
            .collect();
        let listed: Vec<(String, Vec<i32>)> = fetch_topics(&members, 1, |_, _| -1)
            .iter()
            .map(|t| {
                let partitions = t.partitions.iter().map(|p| p.partition).collect();
                (t.topic.0.as_str().to_owned(), partitions)
            })
            .collect();
        assert_eq!(
            listed,
            vec![
                ("b".to_owned(), vec![0]),
                ("a".to_owned(), vec![3]),
                ("b".to_owned(), vec![1, 2]),
            ]
        );
    }

    #[test]
    fn the_first_batchs_size_is_read_from_its_header_or_not_at_all() {
        assert_eq!(first_batch_size(&batch(61, 61)), Some(61));
        assert_eq!(first_batch_size(&[0u8; 11]), None);
        let mut negative = vec![0u8; 12];
        negative[8..12].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(first_batch_size(&negative), None);
    }
}
