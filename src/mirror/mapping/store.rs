//! The offset-mapping store: a compacted topic in the target cluster holding the
//! [`mapping`](super) records, written after acknowledgement and read by
//! `translate` and the group-offset sync.
//!
//! At-least-once mode writes through one producer of its own per process. A stream's commit
//! to the source group never passes what the store holds: the segments of every record below
//! a commit point, and the point itself as progress, are acknowledged by the target before the
//! point is committed. Otherwise a crash between the two would leave records on the target
//! that no segment maps, and a translation over them would skip them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::ledger::{Flush, StoreWriter};
use super::{OffsetMap, StoreOffset, StoreRecord, Trust};
use crate::mirror::clients::{self, Cluster, QuietContext, ReaderContext};
use crate::mirror::flush::send_waiting;
use crate::mirror::state::Control;
use crate::settings::client::ClientProps;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot create the offset-mapping topic {topic} on the target cluster: {reason}. \
         Create it (cleanup.policy=compact, 1 partition), grant the mirror's principal CREATE, \
         or turn the mapping off with --offset.mapping false"
    )]
    Create { topic: String, reason: String },
    #[error(
        "the offset-mapping topic {topic} does not exist on the target cluster: a mirror makes \
         it when it starts (unless --offset.mapping false); give the mirror's \
         --source.cluster.name or --offset.mapping.topic"
    )]
    Missing { topic: String },
    #[error("cannot read the offset-mapping topic {topic} on the target cluster: {reason}")]
    Read { topic: String, reason: String },
    #[error("cannot make the offset-mapping {client}: {source}")]
    Client {
        client: &'static str,
        source: KafkaError,
    },
}

/// The process's writer of the store topic.
pub(crate) struct MappingStore {
    topic: String,
    producer: ThreadedProducer<StoreContext>,
    /// What a record read back (to prune) must be to be taken.
    trust: Trust,
}

impl std::fmt::Debug for MappingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappingStore")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Delivery reports of the store's producer: a write the target refuses stops the mirror
/// (commits would stop advancing, and failover would find the mapping behind).
pub(crate) struct StoreContext {
    control: Arc<Control>,
    topic: String,
}

impl ClientContext for StoreContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }
}

impl ProducerContext for StoreContext {
    type DeliveryOpaque = Arc<Flush>;

    fn delivery(&self, result: &DeliveryResult<'_>, flush: Arc<Flush>) {
        match result {
            Ok(_) => flush.acknowledged(),
            Err((e, _)) => self.control.fail(format!(
                "cannot write the offset mapping to topic {} on the target cluster: {e}. \
                 Stopping: offsets are committed only once their mapping is stored \
                 (grant the mirror's principal WRITE on {}, or set --offset.mapping false)",
                self.topic, self.topic
            )),
        }
    }
}

impl MappingStore {
    /// Makes sure the store topic exists (creating it compacted, replicated as far as the
    /// target's brokers allow, up to 3), and opens its producer.
    pub(crate) fn open(
        producer: &ClientProps,
        topic: &str,
        control: Arc<Control>,
        trust: Trust,
        timeout: Duration,
    ) -> Result<MappingStore, StoreError> {
        ensure_topic(producer, topic, timeout)?;
        let mut config = producer.connection_config();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "0");
        let producer = config
            .create_with_context(StoreContext {
                control,
                topic: topic.to_owned(),
            })
            .map_err(|source| StoreError::Client {
                client: "producer",
                source,
            })?;
        Ok(MappingStore {
            topic: topic.to_owned(),
            producer,
            trust,
        })
    }
}

impl MappingStore {
    /// Queues one record (`value` `None`: a tombstone), waiting while the queue is full.
    fn send(&self, key: &[u8], value: Option<&[u8]>, flush: &Arc<Flush>) -> Result<(), KafkaError> {
        let mut pending = BaseRecord::with_opaque_to(&self.topic, flush.clone()).key(key);
        if let Some(value) = value {
            pending = pending.payload(value);
        }
        send_waiting(&self.producer, pending, None)
    }

    /// Removes (tombstones) the segments no translation needs any more: those wholly below
    /// their source partition's log start, but the latest of each pair of partitions (see
    /// [`OffsetMap::prunable`]). Returns how many.
    pub(crate) fn prune(
        &self,
        source: &ClientProps,
        target: &ClientProps,
        timeout: Duration,
    ) -> Result<usize, StoreError> {
        let map = load(target, &self.topic, self.trust.clone(), timeout)?;
        let client: BaseConsumer<QuietContext> = source
            .connection_config()
            .create_with_context(QuietContext)
            .map_err(|source| StoreError::Client {
                client: "source watermark reader",
                source,
            })?;
        let mut log_start = std::collections::HashMap::new();
        for (topic, partition) in map.source_partitions() {
            if let Ok((low, _)) = client.fetch_watermarks(&topic, partition, timeout) {
                log_start.insert((topic, partition), low);
            }
        }
        let pruned = map.prunable(|t, p| log_start.get(&(t.to_owned(), p)).copied());
        if pruned.is_empty() {
            return Ok(0);
        }
        let flush = Flush::detached(pruned.len());
        for segment in &pruned {
            let key = StoreRecord::Segment(segment.clone()).key();
            self.send(&key, None, &flush)
                .map_err(|e| StoreError::Read {
                    topic: self.topic.clone(),
                    reason: format!("cannot queue a tombstone: {e}"),
                })?;
        }
        rdkafka::producer::Producer::flush(&self.producer, timeout).map_err(|e| {
            StoreError::Read {
                topic: self.topic.clone(),
                reason: format!("tombstones not acknowledged: {e}"),
            }
        })?;
        Ok(pruned.len())
    }
}

impl StoreWriter for MappingStore {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn write(&self, records: &[StoreRecord], flush: &Arc<Flush>) {
        for record in records {
            if let Err(e) = self.send(&record.key(), Some(&record.value()), flush) {
                // Never acknowledged: the flush stays incomplete, commits stop.
                tracing::error!(
                    "cannot queue an offset-mapping record for topic {}: {e}",
                    self.topic
                );
            }
        }
    }
}

fn admin(props: &ClientProps) -> Result<AdminClient<DefaultClientContext>, StoreError> {
    props
        .connection_config()
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|source| StoreError::Client {
            client: "admin client",
            source,
        })
}

fn ensure_topic(props: &ClientProps, topic: &str, timeout: Duration) -> Result<(), StoreError> {
    let admin = admin(props)?;
    let create = |reason: String| StoreError::Create {
        topic: topic.to_owned(),
        reason,
    };
    let metadata = admin
        .inner()
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| create(e.to_string()))?;
    let exists = metadata
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
    if exists {
        return Ok(());
    }
    let cluster_id = admin.inner().fetch_cluster_id(timeout).unwrap_or_default();
    if cluster_id.starts_with("mockCluster") {
        // librdkafka's mock cluster (`demo`, tests) has no CreateTopics; it makes a topic
        // on the first produce to it.
        tracing::debug!("offset-mapping topic {topic}: made by the mock cluster on first write");
        return Ok(());
    }
    let replication = (metadata.brokers().len() as i32).clamp(1, 3);
    let new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(replication))
        .set("cleanup.policy", "compact");
    let options = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let runtime = crate::native::runtime().map_err(|e| create(e.to_string()))?;
    let results = runtime
        .block_on(admin.create_topics([&new_topic], &options))
        .map_err(|e| create(e.to_string()))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(
                "created the offset-mapping topic {topic} (compacted, 1 partition, replication \
                 factor {replication})"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(create(code.to_string())),
        }
    }
    Ok(())
}

/// Reads the whole store topic (committed records only) into an [`OffsetMap`], taking what
/// `trust` allows: a record that cannot be decoded or is not trusted is skipped and counted
/// ([`OffsetMap::read`]), and the read goes on.
pub fn load(
    props: &ClientProps,
    topic: &str,
    trust: Trust,
    timeout: Duration,
) -> Result<OffsetMap, StoreError> {
    let read = |reason: String| StoreError::Read {
        topic: topic.to_owned(),
        reason,
    };
    let consumer: BaseConsumer<ReaderContext> = props
        .connection_config()
        .set("group.id", "mirror-maker-offset-mapping-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("allow.auto.create.topics", "false")
        .create_with_context(ReaderContext)
        .map_err(|source| StoreError::Client {
            client: "reader",
            source,
        })?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| read(e.to_string()))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(StoreError::Missing {
            topic: topic.to_owned(),
        });
    }
    let mut map = OffsetMap::trusting(trust);
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(|e| read(e.to_string()))?;
    }
    // Where reading ends: each partition's last stable offset as of now (a read_committed
    // client's high watermark). The end-of-partition event alone is no signal on a store
    // that an exactly-once mirror writes every few hundred milliseconds: it hardly comes.
    let mut ends = std::collections::HashMap::new();
    for p in &partitions {
        let (_, end) = consumer
            .fetch_watermarks(topic, *p, timeout)
            .map_err(|e| read(e.to_string()))?;
        ends.insert(*p, end);
    }
    consumer.assign(&tpl).map_err(|e| read(e.to_string()))?;
    let mut at_end = std::collections::HashSet::new();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(positions) = consumer.position() {
            for e in positions.elements() {
                if let Offset::Offset(o) = e.offset() {
                    if o >= ends[&e.partition()] {
                        at_end.insert(e.partition());
                    }
                }
            }
        }
        at_end.extend(partitions.iter().filter(|p| ends[p] == 0));
        if at_end.len() >= partitions.len() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(read(format!(
                "not read to its end within {timeout:?} ({} of {} partitions)",
                at_end.len(),
                partitions.len()
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                let Some(key) = m.key() else { continue };
                let at = StoreOffset {
                    topic,
                    partition: m.partition(),
                    offset: m.offset(),
                };
                map.read(key, m.payload(), at);
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(read(e.to_string())),
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::mapping::{Progress, Rejection, Segment};
    use crate::mirror::state::Stats;
    use crate::settings::client::Role;
    use crate::settings::routing::{TopicFilter, TopicTemplate};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    const TOPIC: &str = "mirror-maker.offsets.source";

    fn segment() -> StoreRecord {
        StoreRecord::Segment(Segment {
            source_topic: "orders".into(),
            source_partition: 0,
            target_topic: "orders".into(),
            target_partition: 0,
            source_offset: 0,
            target_offset: 0,
            count: 10,
            gaps: Vec::new(),
            target_gaps: Vec::new(),
            copy_start: true,
        })
    }

    fn progress() -> StoreRecord {
        StoreRecord::Progress(Progress {
            topic: "orders".into(),
            partition: 0,
            next: 10,
            transactional_id: None,
        })
    }

    /// A store holding `records` (key, value) in this order, on a mock target cluster.
    type Mock = MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

    fn store_of(records: &[(Vec<u8>, Vec<u8>)]) -> (Mock, ClientProps) {
        let cluster = MockCluster::new(1).expect("a mock cluster");
        cluster.create_topic(TOPIC, 1, 1).expect("the store topic");
        let props = ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [("bootstrap.servers", cluster.bootstrap_servers().as_str())],
        );
        let producer: BaseProducer = props.connection_config().create().expect("a producer");
        for (key, value) in records {
            producer
                .send(BaseRecord::to(TOPIC).key(key).payload(value))
                .expect("queued");
        }
        producer
            .flush(Duration::from_secs(10))
            .expect("acknowledged");
        (cluster, props)
    }

    #[test]
    fn an_undecodable_record_is_skipped_and_the_rest_of_the_store_loaded() {
        let (s, p) = (segment(), progress());
        let (_cluster, props) = store_of(&[
            (b"not json".to_vec(), b"{}".to_vec()),
            (s.key(), s.value()),
            (p.key(), b"{\"next\": \"ten\"}".to_vec()),
            (p.key(), p.value()),
        ]);
        let stats = Stats::default();
        let trust = Trust::default().counting(&stats);
        let map = load(&props, TOPIC, trust, Duration::from_secs(10)).expect("the store loads");
        assert_eq!(map.progress("orders", 0).map(|p| p.next), Some(10));
        assert_eq!(map.segment_count(), 1);
        assert_eq!(map.rejected().get(&Rejection::Undecodable), Some(&2));
        let counted = stats
            .recorded
            .store_rejected
            .get_or_create(&vec![("reason".to_owned(), "undecodable".to_owned())])
            .get();
        assert_eq!(counted, 2);
    }

    #[test]
    fn records_this_mirror_does_not_write_are_skipped_on_load() {
        let forged = StoreRecord::Segment(Segment {
            target_topic: "payments".into(),
            target_offset: 100,
            ..match segment() {
                StoreRecord::Segment(s) => s,
                _ => unreachable!(),
            }
        });
        let foreign = StoreRecord::Progress(Progress {
            topic: "orders".into(),
            partition: 1,
            next: 5,
            transactional_id: Some("billing-app-1".into()),
        });
        let (s, p) = (segment(), progress());
        let (_cluster, props) = store_of(&[
            (forged.key(), forged.value()),
            (s.key(), s.value()),
            (foreign.key(), foreign.value()),
            (p.key(), p.value()),
        ]);
        let trust = Trust::new(
            Some(TopicFilter::new("orders").unwrap()),
            TopicTemplate::parse("{topic}").unwrap(),
            false,
            Some("mirror"),
        );
        let map = load(&props, TOPIC, trust, Duration::from_secs(10)).expect("the store loads");
        assert_eq!(map.segment_count(), 1);
        assert_eq!(map.progress("orders", 0).map(|p| p.next), Some(10));
        assert!(map.progress("orders", 1).is_none());
        let rejected: Vec<_> = map.rejected().iter().map(|(r, n)| (*r, *n)).collect();
        assert_eq!(
            rejected,
            vec![(Rejection::TargetTopic, 1), (Rejection::TransactionalId, 1)]
        );
    }
}
