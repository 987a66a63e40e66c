//! The offset-mapping store: a compacted topic in the target cluster holding the
//! [`mapping`](super::mapping) records, written after acknowledgement and read by
//! `translate` and the group-offset sync.
//!
//! At-least-once mode writes through one producer of its own per process. A stream's commit
//! to the source group never passes what the store holds: the segments of every record below
//! a commit point, and the point itself as progress, are acknowledged by the target before the
//! point is committed. Otherwise a crash between the two would leave records on the target
//! that no segment maps, and a translation over them would skip them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::clients::{self, Cluster};
use super::mapping::{OffsetMap, Progress, Recorder, Segment, StoreRecord};
use super::offsets::CommitPoint;
use super::state::Control;
use crate::settings::client::ClientProps;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot create the offset-mapping topic {topic} on the target cluster: {reason}. \
         Create it (cleanup.policy=compact, 1 partition), grant the mirror's principal CREATE, \
         or turn the mapping off with --offset.mapping false"
    )]
    Create { topic: String, reason: String },
    #[error("cannot read the offset-mapping topic {topic} on the target cluster: {reason}")]
    Read { topic: String, reason: String },
    #[error("offset-mapping topic {topic}: {source}")]
    Decode {
        topic: String,
        source: super::mapping::DecodeError,
    },
    #[error("cannot make the offset-mapping {client}: {source}")]
    Client {
        client: &'static str,
        source: KafkaError,
    },
}

/// The process's writer of the store topic.
pub struct MappingStore {
    topic: String,
    producer: ThreadedProducer<StoreContext>,
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
pub struct StoreContext {
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
    pub fn open(
        producer: &ClientProps,
        topic: &str,
        control: Arc<Control>,
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
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn write(&self, records: &[StoreRecord], flush: &Arc<Flush>) {
        for record in records {
            let (key, value) = (record.key(), record.value());
            let mut pending = BaseRecord::with_opaque_to(&self.topic, flush.clone())
                .key(&key)
                .payload(&value);
            loop {
                match self.producer.send(pending) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        pending = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((e, _)) => {
                        // Never acknowledged: the flush stays incomplete, commits stop.
                        tracing::error!(
                            "cannot queue an offset-mapping record for topic {}: {e}",
                            self.topic
                        );
                        break;
                    }
                }
            }
        }
    }
}

/// One write of a stream's segments and progress; its points become committable once every
/// record of it is acknowledged.
#[derive(Debug)]
pub struct Flush {
    id: u64,
    remaining: AtomicUsize,
    points: Mutex<Vec<CommitPoint>>,
    persisted: Arc<Persisted>,
}

impl Flush {
    fn acknowledged(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let points =
                std::mem::take(&mut *self.points.lock().unwrap_or_else(|e| e.into_inner()));
            self.persisted.done(self.id, points);
        }
    }
}

/// What a stream's flushes made committable.
#[derive(Debug, Default)]
pub struct Persisted {
    state: Mutex<PersistedState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct PersistedState {
    points: HashMap<(String, i32), i64>,
    /// Every flush up to this id is acknowledged, and its points applied.
    done_through: u64,
    /// Flushes acknowledged while an earlier one is not: applied once it is (a flush with
    /// nothing to write completes at once, and its points are only as good as the write
    /// before it).
    early: std::collections::BTreeMap<u64, Vec<CommitPoint>>,
    /// Per released partition, the first flush id made after the release: points of
    /// earlier flushes that complete later belong to the previous ownership.
    released: HashMap<(String, i32), u64>,
}

impl PersistedState {
    fn apply(&mut self, id: u64, points: Vec<CommitPoint>) {
        for p in points {
            let key = (p.topic, p.partition);
            if self.released.get(&key).is_some_and(|&after| id < after) {
                continue;
            }
            let e = self.points.entry(key).or_insert(p.offset);
            *e = (*e).max(p.offset);
        }
        self.done_through = id;
    }
}

impl Persisted {
    fn done(&self, id: u64, points: Vec<CommitPoint>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.early.insert(id, points);
        loop {
            let next = state.done_through + 1;
            let Some(points) = state.early.remove(&next) else {
                break;
            };
            state.apply(next, points);
        }
        self.changed.notify_all();
    }
}

/// A stream's side of the store: its segments not yet written, its flushes, and the
/// commit points the store holds.
#[derive(Debug)]
pub struct StreamMapping {
    store: Arc<MappingStore>,
    pub recorder: Mutex<Recorder>,
    persisted: Arc<Persisted>,
    /// The progress last written per partition (only changes are written).
    written: Mutex<HashMap<(String, i32), i64>>,
    next_flush: Mutex<u64>,
    /// The periodic commit's write, until the target acknowledges it.
    awaiting: Mutex<Option<u64>>,
}

impl StreamMapping {
    pub fn new(store: Arc<MappingStore>) -> StreamMapping {
        StreamMapping {
            store,
            recorder: Mutex::default(),
            persisted: Arc::default(),
            written: Mutex::default(),
            next_flush: Mutex::new(0),
            awaiting: Mutex::new(None),
        }
    }

    pub fn awaiting(&self) -> Option<u64> {
        *self.awaiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_awaiting(&self, id: Option<u64>) {
        *self.awaiting.lock().unwrap_or_else(|e| e.into_inner()) = id;
    }

    pub fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `segments` and the progress of `points` to the store; returns the flush's id.
    /// The caller took both from the tracker and the recorder at one moment, so the segments
    /// cover every record below each point.
    pub fn persist(&self, points: Vec<CommitPoint>, segments: Vec<Segment>) -> u64 {
        let mut records: Vec<StoreRecord> =
            segments.into_iter().map(StoreRecord::Segment).collect();
        {
            let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            for p in &points {
                let key = (p.topic.clone(), p.partition);
                if written.get(&key) != Some(&p.offset) {
                    written.insert(key, p.offset);
                    records.push(StoreRecord::Progress(Progress {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        next: p.offset,
                        transactional_id: None,
                    }));
                }
            }
        }
        let id = {
            let mut next = self.next_flush.lock().unwrap_or_else(|e| e.into_inner());
            *next += 1;
            *next
        };
        let flush = Arc::new(Flush {
            id,
            remaining: AtomicUsize::new(records.len()),
            points: Mutex::new(points),
            persisted: self.persisted.clone(),
        });
        if records.is_empty() {
            flush.remaining.store(1, Ordering::Release);
            flush.acknowledged();
        } else {
            self.store.write(&records, &flush);
        }
        id
    }

    /// Whether flush `id` (and every one before it) is acknowledged.
    pub fn is_done(&self, id: u64) -> bool {
        let state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        state.done_through >= id
    }

    /// Waits up to `timeout` for flush `id`; returns whether it completed.
    pub fn wait(&self, id: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while state.done_through < id {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .persisted
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// The commit point the store holds for a partition (what may be committed), if any.
    pub fn persisted_point(&self, topic: &str, partition: i32) -> Option<i64> {
        let state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        state.points.get(&(topic.to_owned(), partition)).copied()
    }

    /// The partitions were released: their segments and points start again with the next
    /// owner (this stream or another).
    pub fn forget(&self, partitions: &[(String, i32)]) {
        let mut recorder = self.recorder();
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self
            .persisted
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let next = *self.next_flush.lock().unwrap_or_else(|e| e.into_inner()) + 1;
        for (topic, partition) in partitions {
            recorder.forget(topic, *partition);
            let key = (topic.clone(), *partition);
            written.remove(&key);
            state.points.remove(&key);
            state.released.insert(key, next);
        }
    }

    pub fn topic(&self) -> &str {
        self.store.topic()
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| create(e.to_string()))?;
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

/// The reader's context: librdkafka's log lines go where the mirror's go, and the end of a
/// partition (how the reader knows it has read everything) is not an error.
struct ReaderContext;

impl ClientContext for ReaderContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_)) {
            tracing::warn!("offset-mapping reader: {error} ({reason})");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// Reads the whole store topic (committed records only) into an [`OffsetMap`].
pub fn load(props: &ClientProps, topic: &str, timeout: Duration) -> Result<OffsetMap, StoreError> {
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
    let mut map = OffsetMap::default();
    if partitions.is_empty() {
        return Ok(map);
    }
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(|e| read(e.to_string()))?;
    }
    consumer.assign(&tpl).map_err(|e| read(e.to_string()))?;
    let mut at_end = std::collections::HashSet::new();
    let deadline = Instant::now() + timeout;
    while at_end.len() < partitions.len() {
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
                if let Some(record) =
                    StoreRecord::decode(key, m.payload()).map_err(|source| StoreError::Decode {
                        topic: topic.to_owned(),
                        source,
                    })?
                {
                    map.apply(record);
                }
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

    fn point(offset: i64) -> Vec<CommitPoint> {
        vec![CommitPoint {
            topic: "orders".into(),
            partition: 0,
            offset,
        }]
    }

    fn stored(p: &Persisted) -> (u64, Option<i64>) {
        let state = p.state.lock().unwrap();
        (
            state.done_through,
            state.points.get(&("orders".to_owned(), 0)).copied(),
        )
    }

    #[test]
    fn a_write_acknowledged_before_an_earlier_one_commits_nothing_until_that_one_is() {
        let p = Persisted::default();
        // Flush 2 had nothing to write (complete at once); flush 1's records are in flight.
        p.done(2, point(100));
        assert_eq!(stored(&p), (0, None));
        p.done(1, point(100));
        assert_eq!(stored(&p), (2, Some(100)));
    }

    #[test]
    fn a_write_that_completes_after_its_partition_was_released_sets_no_point() {
        let p = Persisted::default();
        p.state
            .lock()
            .unwrap()
            .released
            .insert(("orders".to_owned(), 0), 2);
        p.done(1, point(500));
        assert_eq!(stored(&p), (1, None));
        p.done(2, point(300));
        assert_eq!(stored(&p), (2, Some(300)));
    }
}
