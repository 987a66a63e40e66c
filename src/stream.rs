//! One mirror stream: a consumer in the group and a producer, on one thread.
//!
//! The loop: poll the producer (delivery reports advance the tracker), poll the consumer,
//! produce each record as it is (borrowed from the consumer, no copy of our own), commit on the
//! timer. When too much is unacknowledged the assigned partitions are paused, and the consumer
//! keeps being polled so the stream stays in the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::Producer;

use crate::cli::Partitioning;
use crate::control::{Control, ShutdownGate, Stats};
use crate::offsets::OffsetTracker;
use crate::plugin::{Handler, PluginError};
use crate::producer::{
    produce, DeliveryContext, MirrorProducer, Outgoing, RawHeaders, StreamShared,
};
use crate::rebalance::{commit, MirrorConsumer, RebalanceContext};
use crate::settings::Settings;
use crate::source::{Polled, Record, Source};
use crate::target::{TargetNames, PROVENANCE_HEADER};
use crate::topics::TopicCreator;

/// How long one consumer poll may block when nothing arrives.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a metadata request for the topic list may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("stream {stream}: cannot create the {client}: {source}")]
    Create {
        stream: usize,
        client: &'static str,
        source: KafkaError,
    },
    #[error("stream {stream}: cannot subscribe to {topics:?}: {source}")]
    Subscribe {
        stream: usize,
        topics: Vec<String>,
        source: KafkaError,
    },
    #[error("stream {stream}: {source}")]
    Plugin { stream: usize, source: PluginError },
    #[error("stream {stream} panicked; see the log above")]
    Panicked { stream: usize },
    #[error("stream {stream}: final commit failed: {source}; the records after the last committed offsets will be mirrored again on restart (duplicates, no loss)")]
    FinalCommit { stream: usize, source: KafkaError },
}

/// How a stream ended.
#[derive(Debug, Default)]
pub struct StreamReport {
    /// Records still unacknowledged when the shutdown flush gave up.
    pub unacknowledged: usize,
}

pub struct Stream<'s> {
    id: usize,
    settings: &'s Settings,
    shared: Arc<StreamShared>,
    producer: Arc<MirrorProducer>,
    /// The source consumer and our poll of its queue.
    source: Source,
    subscribed: Vec<String>,
    paused: bool,
    /// Only this stream's thread calls it; a `RefCell` because records borrow the consumer.
    handler: std::cell::RefCell<Option<Handler>>,
    /// How long a stream may wait for acknowledgements without polling the consumer.
    stall_limit: Duration,
    /// Target topic names (after `--target.topic`) as C strings, made once per topic.
    targets: TargetNames,
    gate: Arc<ShutdownGate>,
}

impl<'s> Stream<'s> {
    pub fn new(
        id: usize,
        settings: &'s Settings,
        control: Arc<Control>,
        stats: Arc<Stats>,
        gate: Arc<ShutdownGate>,
        topics: Option<Arc<TopicCreator>>,
    ) -> Result<Stream<'s>, StreamError> {
        let shared = Arc::new(StreamShared {
            stream: id,
            tracker: std::sync::Mutex::new(OffsetTracker::new()),
            control,
            stats,
            abort_on_send_failure: settings.abort_on_send_failure,
            assigned: false.into(),
            target_up: true.into(),
            lag: Default::default(),
            last_turn: Default::default(),
        });
        shared.stats.telemetry.register(&shared);
        let producer: MirrorProducer = settings
            .producer
            .client_config()
            .create_with_context(DeliveryContext {
                shared: shared.clone(),
            })
            .map_err(|source| StreamError::Create {
                stream: id,
                client: "target producer",
                source,
            })?;
        let producer = Arc::new(producer);
        let plugin_error = |source| StreamError::Plugin { stream: id, source };
        let handler = settings
            .handler
            .as_ref()
            .map(|h| h.instance())
            .transpose()
            .map_err(plugin_error)?;
        let listener = settings
            .listener
            .as_ref()
            .map(|l| l.instance().map(std::sync::Mutex::new))
            .transpose()
            .map_err(plugin_error)?;
        let consumer: MirrorConsumer = settings
            .consumer
            .client_config()
            .create_with_context(RebalanceContext {
                shared: shared.clone(),
                producer: producer.clone(),
                revoke_flush_timeout: settings.shutdown_timeout,
                closing: false.into(),
                assignment_changed: false.into(),
                listener,
                topics,
            })
            .map_err(|source| StreamError::Create {
                stream: id,
                client: "source consumer",
                source,
            })?;
        let source = Source::new(consumer).ok_or_else(|| StreamError::Create {
            stream: id,
            client: "source consumer queue (is group.id set?)",
            source: KafkaError::ClientCreation("no consumer queue".to_owned()),
        })?;
        Ok(Stream {
            id,
            settings,
            shared,
            producer,
            source,
            subscribed: Vec::new(),
            paused: false,
            handler: std::cell::RefCell::new(handler),
            stall_limit: stall_limit(settings),
            targets: TargetNames::new(settings.target_topic.clone()),
            gate,
        })
    }

    /// Runs until a stop is requested or a fatal error occurs, then flushes and commits.
    pub fn run(mut self, initial_topics: Vec<String>) -> Result<StreamReport, StreamError> {
        if let Err(e) = self.subscribe(initial_topics) {
            self.gate.arrive();
            return Err(e);
        }
        let mut next_commit = Instant::now() + self.settings.commit_interval;
        let mut next_refresh = Instant::now() + self.settings.topic_refresh_interval;
        while !self.shared.control.stop_requested() {
            self.producer.poll(Duration::ZERO);
            self.make_room();
            match self.source.poll(POLL_INTERVAL) {
                Polled::Nothing => {}
                Polled::Record(record) => self.mirror(&record),
                Polled::Error(e) => self.consumer_error(e),
            }
            let now = Instant::now();
            crate::notify::turned(&self.shared.stats, &self.shared.last_turn, now);
            if now >= next_commit {
                if let Err(e) = commit(
                    self.source.consumer(),
                    &self.shared,
                    None,
                    CommitMode::Async,
                ) {
                    tracing::warn!(
                        stream = self.id,
                        "offset commit failed: {e}; retrying at the next commit"
                    );
                }
                next_commit = now + self.settings.commit_interval;
            }
            if now >= next_refresh {
                self.refresh_topics();
                next_refresh = Instant::now() + self.settings.topic_refresh_interval;
            }
        }
        self.shutdown()
    }

    fn subscribe(&mut self, topics: Vec<String>) -> Result<(), StreamError> {
        if topics == self.subscribed {
            return Ok(());
        }
        if topics.is_empty() {
            tracing::warn!(
                stream = self.id,
                "no topic on the source matches --whitelist {:?}; checking again every {:?}",
                self.settings.topics.pattern(),
                self.settings.topic_refresh_interval
            );
            self.source.consumer().unsubscribe();
        } else {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            self.source
                .consumer()
                .subscribe(&names)
                .map_err(|source| StreamError::Subscribe {
                    stream: self.id,
                    topics: topics.clone(),
                    source,
                })?;
            tracing::info!(
                stream = self.id,
                "subscribed to {} topics: {}",
                topics.len(),
                topics.join(" ")
            );
        }
        self.subscribed = topics;
        Ok(())
    }

    fn refresh_topics(&mut self) {
        match matching_topics(self.source.consumer(), self.settings, METADATA_TIMEOUT) {
            Ok(topics) => {
                if let Err(e) = self.subscribe(topics) {
                    tracing::warn!("{e}");
                }
            }
            Err(e) => tracing::warn!(
                stream = self.id,
                "cannot list the source's topics: {e}; keeping the current subscription"
            ),
        }
    }

    /// Whether more than `1/fraction` of the in-flight limits is used. Records of released
    /// partitions that the producer still holds (a flush that timed out) count too: they
    /// still take room in its queue.
    fn over_limit(&self, fraction: usize) -> (bool, usize, usize) {
        let (tracked, bytes) = {
            let t = self.shared.tracker();
            (t.in_flight(), t.in_flight_bytes())
        };
        let queued = usize::try_from(self.producer.in_flight_count()).unwrap_or(0);
        let records = tracked.max(queued);
        let over = records >= (self.settings.max_in_flight_records / fraction).max(1)
            || bytes >= (self.settings.max_in_flight_bytes / fraction).max(1);
        (over, records, bytes)
    }

    /// Backpressure. While too much is unacknowledged, wait for acknowledgements without
    /// consuming: the records already fetched stay in the consumer's queue. If the wait
    /// lasts long enough to endanger the group membership (`max.poll.interval.ms`), pause the
    /// assigned partitions and go back to polling the consumer; resume once half drained.
    fn make_room(&mut self) {
        let changed = self
            .shared_context()
            .assignment_changed
            .swap(false, Ordering::SeqCst);
        if self.paused {
            let (still_over, records, bytes) = self.over_limit(2);
            if !still_over {
                self.set_paused(false, records, bytes);
            } else if changed {
                // Newly assigned partitions start unpaused.
                self.set_paused(true, records, bytes);
            }
            if self.paused {
                self.producer.poll(Duration::from_millis(10));
            }
            return;
        }
        if changed {
            // librdkafka keeps a partition's pause flag across unassign and assign: a
            // partition paused before a rebalance may come back paused.
            let (_, records, bytes) = self.over_limit(1);
            self.set_paused(false, records, bytes);
        }
        let started = Instant::now();
        loop {
            let (over, records, bytes) = self.over_limit(1);
            if !over || self.shared.control.stop_requested() {
                return;
            }
            if started.elapsed() >= self.stall_limit {
                tracing::info!(
                    stream = self.id,
                    "the target has not acknowledged {records} records ({bytes} bytes) for {:?}; \
                     pausing consumption until it catches up",
                    self.stall_limit
                );
                self.set_paused(true, records, bytes);
                return;
            }
            crate::notify::turned(&self.shared.stats, &self.shared.last_turn, Instant::now());
            self.producer.poll(Duration::from_millis(5));
        }
    }

    fn set_paused(&mut self, pause: bool, records: usize, bytes: usize) {
        let assignment = match self.source.consumer().assignment() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(stream = self.id, "cannot read the assignment: {e}");
                return;
            }
        };
        let result = if pause {
            self.source.consumer().pause(&assignment)
        } else {
            self.source.consumer().resume(&assignment)
        };
        match result {
            Ok(()) => {
                if pause != self.paused {
                    tracing::debug!(
                        stream = self.id,
                        records,
                        bytes,
                        "{} consumption",
                        if pause { "pausing" } else { "resuming" }
                    );
                }
                self.paused = pause;
            }
            Err(e) => tracing::warn!(stream = self.id, "cannot pause or resume consumption: {e}"),
        }
    }

    fn shared_context(&self) -> &RebalanceContext {
        self.source.consumer().context()
    }

    /// Produces one consumed record as it is: key, value, headers, timestamp, and (with
    /// `--partitioning preserve`) the partition number.
    fn mirror(&self, message: &Record<'_>) {
        let stats = &self.shared.stats;
        let bytes = message.payload_len() + message.key().map_or(0, <[u8]>::len);
        Stats::add(&stats.consumed, 1);
        Stats::add(&stats.consumed_bytes, bytes as u64);
        if let Some(p) = &self.settings.provenance {
            if p.came_from_target(message.headers()) {
                // Not mirrored back where it came from; acknowledged at once.
                Stats::add(&stats.looped, 1);
                self.shared.tracker().begin(
                    message.topic(),
                    message.partition(),
                    message.offset(),
                    bytes,
                    0,
                );
                return;
            }
        }
        if let Some(handler) = self.handler.borrow_mut().as_mut() {
            self.mirror_handled(handler, message, bytes);
            return;
        }
        let ticket = self.shared.tracker().begin(
            message.topic(),
            message.partition(),
            message.offset(),
            bytes,
            1,
        );
        let mut headers = RawHeaders::copy_of(message);
        if let Some(p) = &self.settings.provenance {
            headers.add(PROVENANCE_HEADER, Some(p.source.as_bytes()));
        }
        let timestamp = message.timestamp();
        self.send(
            message.topic(),
            Outgoing {
                partition: self.same_partition(message),
                key: message.key(),
                value: message.payload(),
                timestamp,
                headers,
                ticket,
            },
        );
    }

    /// The target partition `--partitioning` gives a record of `message`: the same number
    /// (preserve), or none for the producer's partitioner to choose (hash).
    fn same_partition(&self, message: &Record<'_>) -> Option<i32> {
        match self.settings.partitioning {
            Partitioning::Preserve => Some(message.partition()),
            Partitioning::Hash => None,
        }
    }

    /// With a message handler: the source record counts as acknowledged once every record
    /// the handler made from it is (at once if it made none). A handler error is fatal; the
    /// failing record is not registered, so the commit point stays before it.
    fn mirror_handled(&self, handler: &mut Handler, message: &Record<'_>, bytes: usize) {
        let outputs = match handler.handle(message) {
            Ok(outputs) => outputs,
            Err(e) => {
                self.shared.control.fail(format!(
                    "the message handler {} failed on {}/{} offset {}: {e}",
                    handler.path().display(),
                    message.topic(),
                    message.partition(),
                    message.offset()
                ));
                return;
            }
        };
        if outputs.is_empty() {
            Stats::add(&self.shared.stats.filtered, 1);
        }
        let ticket = self.shared.tracker().begin(
            message.topic(),
            message.partition(),
            message.offset(),
            bytes,
            u32::try_from(outputs.len()).unwrap_or(u32::MAX),
        );
        for out in outputs {
            let mut headers = RawHeaders::none();
            for (key, value) in &out.headers {
                headers.add(key, value.as_deref());
            }
            if let Some(p) = &self.settings.provenance {
                headers.add(PROVENANCE_HEADER, Some(p.source.as_bytes()));
            }
            self.send(
                &out.topic,
                Outgoing {
                    partition: out.partition.or(self.same_partition(message)),
                    key: out.key.as_deref(),
                    value: out.value.as_deref(),
                    timestamp: out.timestamp,
                    headers,
                    ticket,
                },
            );
        }
    }

    /// Hands a record for the target topic of `topic` to the producer. A full queue (rare:
    /// consumption pauses before it fills) is waited out while serving delivery reports; any
    /// other refusal is a send failure.
    fn send(&self, topic: &str, mut out: Outgoing<'_>) {
        let Some(target) = self.targets.of(topic) else {
            let error = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
            self.shared
                .send_failed(out.ticket, topic, out.partition, &error);
            return;
        };
        let mut waited = false;
        loop {
            match produce(&self.producer, &target, &mut out) {
                Ok(()) => {
                    Stats::add(&self.shared.stats.produced, 1);
                    return;
                }
                Err(RDKafkaErrorCode::QueueFull) => {
                    if !waited {
                        tracing::debug!(stream = self.id, "producer queue full; waiting");
                        waited = true;
                    }
                    self.producer.poll(Duration::from_millis(10));
                    if self.shared.control.stop_requested() {
                        // Left unacknowledged: the commit point stays before it.
                        return;
                    }
                }
                Err(code) => {
                    let name = target.to_str().unwrap_or(topic);
                    self.shared.send_failed(
                        out.ticket,
                        name,
                        out.partition,
                        &KafkaError::MessageProduction(code),
                    );
                    return;
                }
            }
        }
    }

    /// Errors the consumer returns from `poll` (rust-rdkafka does not route them to the
    /// context's `error`).
    fn consumer_error(&self, error: KafkaError) {
        match (&error, error.rdkafka_error_code()) {
            (KafkaError::MessageConsumptionFatal(_), _) | (_, Some(RDKafkaErrorCode::Fatal)) => {
                self.shared.control.fail(format!(
                    "stream {}: the source consumer failed: {error}",
                    self.id
                ))
            }
            (_, Some(RDKafkaErrorCode::AutoOffsetReset)) => tracing::error!(
                stream = self.id,
                "{error}: the committed offset is no longer on the source (deleted by retention \
                 before it was mirrored); continuing from auto.offset.reset"
            ),
            (_, Some(code @ RDKafkaErrorCode::AllBrokersDown)) => crate::logging::client_error(
                &self.shared.control,
                "source",
                KafkaError::Global(code),
                &error.to_string(),
            ),
            (_, Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::Resolve)) => {
                // librdkafka logs these itself, once per broker.
                tracing::debug!(stream = self.id, "source consumer: {error}")
            }
            _ => tracing::warn!(stream = self.id, "source consumer: {error}"),
        }
    }

    /// Stop consuming, wait (bounded) for the records in flight, commit what was
    /// acknowledged, leave the group.
    fn shutdown(self) -> Result<StreamReport, StreamError> {
        let started = Instant::now();
        let timeout = self.settings.shutdown_timeout;
        if let Err(e) = self.producer.flush(timeout) {
            tracing::warn!(
                stream = self.id,
                "shutdown flush did not finish within {timeout:?} ({e}); committing only what \
                 the target acknowledged"
            );
        }
        let unacknowledged = self.shared.tracker().in_flight();
        let committed = self.final_commit();
        self.gate.arrive();
        self.gate.wait(timeout);
        self.shared_context().closing.store(true, Ordering::SeqCst);
        let id = self.id;
        drop(self.source);
        let n = committed.map_err(|source| StreamError::FinalCommit { stream: id, source })?;
        tracing::info!(
            stream = id,
            "stopped: committed {n} partitions, {unacknowledged} records unacknowledged, in {:?}",
            started.elapsed()
        );
        Ok(StreamReport { unacknowledged })
    }
}

impl Stream<'_> {
    /// The shutdown commit, retried while the group is rebalancing (another instance joining
    /// or leaving): the broker refuses commits until the rebalance completes.
    fn final_commit(&self) -> KafkaResult<usize> {
        let deadline = Instant::now() + FINAL_COMMIT_RETRY;
        loop {
            match commit(self.source.consumer(), &self.shared, None, CommitMode::Sync) {
                Err(e) if is_retriable_commit_error(&e) && Instant::now() < deadline => {
                    tracing::info!(stream = self.id, "final commit: {e}; retrying");
                    // Serve the rebalance (its revocation commits and releases partitions).
                    if let Polled::Record(m) = self.source.poll(Duration::from_millis(200)) {
                        tracing::debug!(
                            stream = self.id,
                            "not mirrored at shutdown: {}/{} offset {}",
                            m.topic(),
                            m.partition(),
                            m.offset()
                        );
                    }
                }
                other => return other,
            }
        }
    }
}

/// How long the final commit is retried while the group rebalances.
const FINAL_COMMIT_RETRY: Duration = Duration::from_secs(10);

fn is_retriable_commit_error(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::RequestTimedOut
        )
    )
}

/// A third of the consumer's `max.poll.interval.ms` (librdkafka's default: 300 s): a stream
/// that waits longer than that for the target pauses its partitions and polls again.
fn stall_limit(settings: &Settings) -> Duration {
    let max_poll = settings
        .consumer
        .get("max.poll.interval.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(300_000);
    Duration::from_millis(max_poll / 3)
}

/// The source's topics that match the whitelist, sorted.
pub fn matching_topics<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    settings: &Settings,
    timeout: Duration,
) -> KafkaResult<Vec<String>> {
    let metadata = consumer.fetch_metadata(None, timeout)?;
    let mut topics: Vec<String> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && settings.topics.matches(t.name()))
        .map(|t| t.name().to_owned())
        .collect();
    topics.sort();
    Ok(topics)
}
