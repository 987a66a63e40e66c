//! One mirror stream: a consumer in the group and a producer, on one thread.
//!
//! The loop: poll the producer (delivery reports advance the tracker), poll the consumer,
//! produce each record as it is (borrowed from the consumer, no copy of our own), commit on the
//! timer. When too much is unacknowledged the assigned partitions are paused, and the consumer
//! keeps being polled so the stream stays in the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{Producer, PurgeConfig};

use super::clients::{self, Cluster};
use super::commit::{commit_async, commit_stored, final_commit, follow_positions};
use super::delivery::{self, serve_deliveries, DeliveryContext, MirrorProducer};
use super::ledger::StreamMapping;
use super::offsets::Ticket;
use super::probe::{topics_to_follow, METADATA_TIMEOUT};
use super::rebalance::{MirrorConsumer, MirrorSource, RebalanceContext};
use super::state::{Control, ShutdownGate, Stats, StreamShared};
use super::store::MappingStore;
use super::target::TargetNames;
use super::topics::TopicCreator;
use crate::native::cached_low_watermark;
use crate::native::produce::{produce, Outgoing, RawHeaders};
use crate::native::queue::{Polled, Source};
use crate::native::record::Record;
use crate::plugin::{Emitted, Handler, PluginError};
use crate::settings::flags::Partitioning;
use crate::settings::routing::PROVENANCE_HEADER;
use crate::settings::{counted, Settings};

/// How long one consumer poll may block when nothing arrives.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

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
    stream: usize,
    settings: &'s Settings,
    shared: Arc<StreamShared>,
    producer: Arc<MirrorProducer>,
    /// The source consumer and our poll of its queue.
    source: MirrorSource,
    subscribed: Vec<String>,
    /// Whether the assigned partitions are paused (backpressure); a `Cell` because a send
    /// that waits for room in the producer queue pauses them too.
    paused: std::cell::Cell<bool>,
    /// When the consumer was last polled: `max.poll.interval.ms` runs from there.
    last_consumer_poll: std::cell::Cell<Instant>,
    /// Only this stream's thread calls it; a `RefCell` because records borrow the consumer.
    handler: std::cell::RefCell<Option<Handler>>,
    /// How long a stream may wait for acknowledgements without polling the consumer.
    stall_limit: Duration,
    /// Target topic names (after `--target.topic`) as C strings, made once per topic.
    targets: TargetNames,
    /// When the producer's view of a target topic was last refreshed for a partition it did
    /// not know.
    last_target_refresh: std::cell::Cell<Option<Instant>>,
    gate: Arc<ShutdownGate>,
}

impl<'s> Stream<'s> {
    pub fn new(
        stream: usize,
        settings: &'s Settings,
        control: Arc<Control>,
        stats: Arc<Stats>,
        gate: Arc<ShutdownGate>,
        topics: Option<Arc<TopicCreator>>,
        store: Option<Arc<MappingStore>>,
    ) -> Result<Stream<'s>, StreamError> {
        let id = stream;
        let shared = StreamShared::new(
            stream,
            control,
            stats,
            settings.abort_on_send_failure,
            store.map(|s| StreamMapping::new(s)),
        );
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
                revoke_flush_timeout: revoke_flush_limit(settings),
                closing: false.into(),
                assignment_changed: false.into(),
                rebalances_served: 0.into(),
                release_commits: 0.into(),
                release_commit_failed: false.into(),
                listener,
                topics,
                topic_retry_limit: stall_limit(settings),
            })
            .map_err(|source| StreamError::Create {
                stream: id,
                client: "source consumer",
                source,
            })?;
        if settings.create_topics.is_some() {
            let _ = shared.recreatable.set(settings.target_topic.clone());
        }
        let source = Source::new(consumer).ok_or_else(|| StreamError::Create {
            stream: id,
            client: "source consumer queue (is group.id set?)",
            source: KafkaError::ClientCreation("no consumer queue".to_owned()),
        })?;
        Ok(Stream {
            stream,
            settings,
            shared,
            producer,
            source,
            subscribed: Vec::new(),
            paused: std::cell::Cell::new(false),
            last_consumer_poll: std::cell::Cell::new(Instant::now()),
            handler: std::cell::RefCell::new(handler),
            stall_limit: stall_limit(settings),
            targets: TargetNames::new(settings.target_topic.clone()),
            last_target_refresh: std::cell::Cell::new(None),
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
            self.recreate_missing_targets();
            let polled = self.source.poll(POLL_INTERVAL);
            self.last_consumer_poll.set(Instant::now());
            match polled {
                Polled::Nothing => {}
                Polled::Record(record) => self.mirror(&record),
                Polled::Error { error, reason } => self.source_error(&error, &reason),
            }
            let now = Instant::now();
            self.shared.turned(now);
            if now >= next_commit {
                // A failure is counted and logged where its result arrives (`committed`).
                let _ = commit_async(&self.source, &self.shared);
                next_commit = now + self.settings.commit_interval;
            } else {
                // The offset mapping acknowledged since the timer: commit what it holds.
                let _ = commit_stored(&self.source, &self.shared);
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
                stream = self.stream,
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
                    stream: self.stream,
                    topics: topics.clone(),
                    source,
                })?;
            tracing::info!(
                stream = self.stream,
                "subscribed to {}: {}",
                counted(topics.len(), "topic"),
                topics.join(" ")
            );
        }
        self.subscribed = topics;
        Ok(())
    }

    fn refresh_topics(&mut self) {
        let now = topics_to_follow(self.source.consumer(), &self.settings.topics, self.stream);
        if let Some(topics) = now {
            if let Err(e) = self.subscribe(topics) {
                tracing::warn!("{e}");
            }
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
            .rebalance_context()
            .assignment_changed
            .swap(false, Ordering::SeqCst);
        if self.paused.get() {
            let (still_over, records, bytes) = self.over_limit(2);
            if !still_over {
                self.set_paused(false, records, bytes);
            } else if changed {
                // Newly assigned partitions start unpaused.
                self.set_paused(true, records, bytes);
            }
            if self.paused.get() {
                serve_deliveries(
                    &self.producer,
                    &self.shared.stats,
                    Duration::from_millis(10),
                );
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
                    stream = self.stream,
                    "the target has not acknowledged {} ({bytes} bytes) for {:?}; pausing \
                     consumption until it catches up",
                    counted(records, "record"),
                    self.stall_limit
                );
                self.set_paused(true, records, bytes);
                return;
            }
            self.shared.turned(Instant::now());
            serve_deliveries(&self.producer, &self.shared.stats, Duration::from_millis(5));
        }
    }

    /// Target topics found missing while running (`--create.topics`): with consumption
    /// paused, once nothing is in flight any more (records still queued for an affected
    /// partition must land or fail before it is rewound, or they would land after their
    /// re-sent predecessors), create them again (transient errors retried, permanent ones
    /// fatal, as on assignment), then rewind each affected source partition to its oldest
    /// record not acknowledged: everything from there is mirrored again, in order
    /// (duplicates of what had landed after it, no loss).
    fn recreate_missing_targets(&self) {
        let pending = !self
            .shared
            .missing_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if !pending {
            return;
        }
        let Some(creator) = self.rebalance_context().topics.clone() else {
            return;
        };
        let (_, records, bytes) = self.over_limit(1);
        self.set_paused(true, records, bytes);
        if self.producer.in_flight_count() > 0 {
            // Short: the consumer keeps being polled between tries.
            let _ = delivery::flush(&self.producer, Duration::from_millis(200));
            if self.producer.in_flight_count() > 0 {
                return;
            }
        }
        let missing = std::mem::take(
            &mut *self
                .shared
                .missing_targets
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let mut partitions: Vec<(String, i32)> = Vec::new();
        for m in &missing {
            creator.forget(&m.target_topic);
            let p = (m.source_topic.clone(), m.partition);
            if !partitions.contains(&p) {
                partitions.push(p);
            }
        }
        self.rebalance_context()
            .make_target_topics(&creator, &partitions);
        if self.shared.control.stop_requested() {
            return;
        }
        for m in &missing {
            if let Ok(name) = std::ffi::CString::new(m.target_topic.as_str()) {
                self.last_target_refresh.set(None);
                self.refresh_target_metadata(&name);
            }
        }
        let assignment = self.source.consumer().assignment().unwrap_or_default();
        for (topic, partition) in partitions {
            let mut tracker = self.shared.tracker();
            let point = tracker.rewind_point(&topic, partition);
            tracker.release(&topic, partition);
            drop(tracker);
            let assigned = assignment
                .elements()
                .iter()
                .any(|e| e.topic() == topic && e.partition() == partition);
            let (Some(offset), true) = (point, assigned) else {
                // Released since (its next owner starts from the commit point, which stayed
                // below the refused record), or nothing tracked.
                continue;
            };
            match self.source.consumer().seek(
                &topic,
                partition,
                rdkafka::Offset::Offset(offset),
                Duration::ZERO,
            ) {
                Ok(()) => tracing::info!(
                    stream = self.stream,
                    "mirroring {topic}/{partition} again from offset {offset}, its target topic \
                     made again"
                ),
                // Its records after the refused one were consumed already: stopping keeps
                // the commit point below it.
                Err(e) => self.shared.control.fail(format!(
                    "stream {}: cannot rewind {topic}/{partition} to offset {offset} after \
                     making its target topic again: {e}; stopping, the committed offset stays \
                     before it",
                    self.stream
                )),
            }
        }
    }

    fn set_paused(&self, pause: bool, records: usize, bytes: usize) {
        let assignment = match self.source.consumer().assignment() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(stream = self.stream, "cannot read the assignment: {e}");
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
                if pause != self.paused.get() {
                    tracing::debug!(
                        stream = self.stream,
                        records,
                        bytes,
                        "{} consumption",
                        if pause { "pausing" } else { "resuming" }
                    );
                }
                self.paused.set(pause);
            }
            Err(e) => tracing::warn!(
                stream = self.stream,
                "cannot pause or resume consumption: {e}"
            ),
        }
    }

    fn rebalance_context(&self) -> &RebalanceContext {
        self.source.consumer().context()
    }

    /// Mirrors one consumed record: routes it (as it is, through the handler, or not at all),
    /// registers it with the tracker once with the number of target records it became, and
    /// sends those.
    fn mirror(&self, record: &Record<'_>) {
        let stats = &self.shared.stats;
        let bytes = record.size();
        Stats::add(&stats.consumed, 1);
        Stats::add(&stats.consumed_bytes, bytes as u64);
        let mut handler = self.handler.borrow_mut();
        let Some(route) = self.route(record, handler.as_mut()) else {
            // A handler error is fatal; the failing record is not registered, so the commit
            // point stays before it.
            return;
        };
        let outputs = match &route {
            Route::Skip => 0,
            Route::AsItIs => 1,
            Route::Handled(outputs) => outputs.len(),
        };
        let (ticket, gap_from) = self.shared.tracker().begin_after(
            record.topic(),
            record.partition(),
            record.offset(),
            record.timestamp(),
            bytes,
            u32::try_from(outputs).unwrap_or(u32::MAX),
        );
        if let Some(expected) = gap_from {
            self.skipped_before(record, expected);
        }
        match route {
            // Acknowledged at once: the commit point may pass it.
            Route::Skip => {}
            Route::AsItIs => {
                self.send(
                    record.topic(),
                    Outgoing {
                        partition: self.same_partition(record),
                        key: record.key(),
                        value: record.payload(),
                        timestamp: record.timestamp(),
                        headers: self.stamped(record.copy_headers()),
                        opaque: ticket.to_opaque(),
                    },
                );
            }
            Route::Handled(outputs) => {
                for out in outputs {
                    let mut headers = RawHeaders::none();
                    for (key, value) in &out.headers {
                        headers.add(key, value.as_deref());
                    }
                    let sent = self.send(
                        &out.topic,
                        Outgoing {
                            partition: out.partition.or(self.same_partition(record)),
                            key: out.key.as_deref(),
                            value: out.value.as_deref(),
                            timestamp: out.timestamp,
                            headers: self.stamped(headers),
                            opaque: ticket.to_opaque(),
                        },
                    );
                    if !sent {
                        // Stopping, or the record's partition was released meanwhile.
                        break;
                    }
                }
            }
        }
    }

    /// `record` came after a gap from `expected`. Gaps above the partition's low watermark are
    /// normal (compaction, transaction markers); records below it were deleted by the
    /// source's retention before they were read (librdkafka reset the position to the
    /// earliest offset and only logged it): say which, and count them.
    fn skipped_before(&self, record: &Record<'_>, expected: i64) {
        let (topic, partition) = (record.topic(), record.partition());
        let Some(low) = cached_low_watermark(self.source.consumer(), topic, partition) else {
            return;
        };
        let end = low.min(record.offset());
        if end <= expected {
            return;
        }
        let skipped = end - expected;
        self.shared
            .stats
            .recorded
            .count_skipped("retention", skipped as u64);
        tracing::warn!(
            stream = self.stream,
            "source records {topic}/{partition} offsets {expected} to {} ({skipped} records) \
             were deleted by the source's retention before they were mirrored; they are not on \
             the target. Mirroring goes on from offset {}",
            end - 1,
            record.offset()
        );
    }

    /// Where a record goes: see [`route`].
    fn route<'h>(
        &self,
        record: &Record<'_>,
        handler: Option<&'h mut Handler>,
    ) -> Option<Route<'h>> {
        route(self.settings, &self.shared, record, handler)
    }

    fn stamped(&self, headers: RawHeaders) -> RawHeaders {
        stamped(self.settings, headers)
    }

    fn same_partition(&self, record: &Record<'_>) -> Option<i32> {
        same_partition(self.settings, record)
    }

    /// Hands a record for the target topic of `topic` to the producer. A full queue (rare:
    /// consumption pauses before it fills, but a handler that enlarges records or fans out
    /// can fill it first) is waited out while serving delivery reports, feeding the watchdog
    /// and, once the wait endangers the group membership, with the assigned partitions paused
    /// and the consumer polled. Any other refusal is a send failure. Returns whether the
    /// record's other outputs, if any, should still be sent: not when stopping, nor when its
    /// partition was released during the wait (its next owner mirrors it again).
    fn send(&self, topic: &str, mut out: Outgoing<'_>) -> bool {
        let ticket = Ticket::from_opaque(out.opaque);
        let Some(target) = self.targets.of(topic) else {
            let error = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
            self.shared
                .send_failed(ticket, topic, out.partition, &error);
            return true;
        };
        let mut waiting_since: Option<Instant> = None;
        let mut refreshed = false;
        loop {
            match produce(&self.producer, &target, &mut out) {
                Ok(()) => {
                    Stats::add(&self.shared.stats.produced, 1);
                    return true;
                }
                Err(RDKafkaErrorCode::UnknownPartition) if !refreshed => {
                    // The producer's view of the target topic may predate partitions added
                    // since (a source topic that grew, its target grown before the new
                    // partitions were assigned): ask the target once, then decide.
                    refreshed = true;
                    self.refresh_target_metadata(&target);
                }
                Err(RDKafkaErrorCode::QueueFull) => {
                    let now = Instant::now();
                    if waiting_since.is_none() {
                        tracing::debug!(stream = self.stream, "producer queue full; waiting");
                        waiting_since = Some(now);
                    }
                    if self.producer.in_flight_count() == 0 {
                        // Nothing queued that could make room: this record alone is larger
                        // than the queue's byte limit, and would wait for ever.
                        let name = target.to_str().unwrap_or(topic);
                        let bytes = out.value.map_or(0, <[u8]>::len);
                        let limit = self
                            .settings
                            .producer
                            .get("queue.buffering.max.kbytes")
                            .unwrap_or("?");
                        self.shared.send_failed_because(
                            ticket,
                            name,
                            "QueueFull",
                            &format!(
                                "the record's value ({bytes} bytes) is larger than the producer \
                                 queue (queue.buffering.max.kbytes = {limit}), so it can never be \
                                 queued; raise queue.buffering.max.kbytes in the producer config"
                            ),
                        );
                        return !self.shared.control.stop_requested();
                    }
                    self.shared.turned(now);
                    if now.duration_since(self.last_consumer_poll.get()) >= self.stall_limit
                        || self.paused.get()
                    {
                        self.poll_consumer_while_full();
                    } else {
                        serve_deliveries(
                            &self.producer,
                            &self.shared.stats,
                            Duration::from_millis(10),
                        );
                    }
                    if self.shared.control.stop_requested() {
                        // Left unacknowledged: the commit point stays before it.
                        return false;
                    }
                    if !self.shared.tracker().is_tracked(ticket) {
                        // Released in a rebalance during the wait: the commit point stayed
                        // before it, and its partition's next owner mirrors it.
                        return false;
                    }
                }
                Err(code) => {
                    let name = target.to_str().unwrap_or(topic);
                    self.shared.send_failed(
                        ticket,
                        name,
                        out.partition,
                        &KafkaError::MessageProduction(code),
                    );
                    return true;
                }
            }
        }
    }

    /// One turn of a wait for room in the producer queue that has lasted long enough to
    /// endanger the group membership: the assigned partitions are paused (librdkafka drops
    /// what it prefetched for them and fetches again from the record after the last one
    /// consumed when they resume), and the consumer is polled, which keeps the membership
    /// and serves rebalances. A record it still returns (a partition assigned meanwhile) is
    /// not mirrored now: its partition is paused and rewound to it, so it comes again, in
    /// order, after the pause.
    fn poll_consumer_while_full(&self) {
        let context = self.rebalance_context();
        if !self.paused.get() || context.assignment_changed.load(Ordering::SeqCst) {
            let (_, records, bytes) = self.over_limit(1);
            if !self.paused.get() {
                tracing::info!(
                    stream = self.stream,
                    "the producer queue has been full for a while (the target is slow or down); \
                     pausing consumption and polling the consumer to stay in the group"
                );
            }
            self.set_paused(true, records, bytes);
        }
        self.producer.poll(Duration::ZERO);
        let polled = self.source.poll(Duration::from_millis(10));
        self.last_consumer_poll.set(Instant::now());
        match polled {
            Polled::Nothing => {}
            Polled::Record(record) => {
                let (_, records, bytes) = self.over_limit(1);
                self.set_paused(true, records, bytes);
                let rewound = self.source.consumer().seek(
                    record.topic(),
                    record.partition(),
                    rdkafka::Offset::Offset(record.offset()),
                    Duration::ZERO,
                );
                if let Err(e) = rewound {
                    // Not registered: the commit point stays before it.
                    self.shared.control.fail(format!(
                        "stream {}: cannot rewind {}/{} to offset {} while the producer queue \
                         is full: {e}; stopping, the committed offset stays before it",
                        self.stream,
                        record.topic(),
                        record.partition(),
                        record.offset()
                    ));
                }
            }
            Polled::Error { error, reason } => self.source_error(&error, &reason),
        }
    }

    /// An error the source consumer's poll returned, through the one client-error policy.
    fn source_error(&self, error: &KafkaError, reason: &str) {
        clients::client_error(
            &self.shared.control,
            Cluster::Source,
            self.stream,
            error,
            reason,
        );
    }

    /// Refreshes the producer's metadata of `target` (librdkafka's cache is otherwise renewed
    /// every `topic.metadata.refresh.interval.ms`, 5 minutes by default), at most once a
    /// second: a target that truly lacks a partition fails its records without a request each.
    fn refresh_target_metadata(&self, target: &std::ffi::CStr) {
        let now = Instant::now();
        if self
            .last_target_refresh
            .get()
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.last_target_refresh.set(Some(now));
        let name = target.to_string_lossy();
        match self
            .producer
            .client()
            .fetch_metadata(Some(&name), METADATA_TIMEOUT)
        {
            Ok(_) => tracing::info!(
                stream = self.stream,
                "refreshed the target's metadata of topic {name} (a partition was unknown)"
            ),
            Err(e) => tracing::warn!(
                stream = self.stream,
                "cannot refresh the target's metadata of topic {name}: {e}"
            ),
        }
    }

    /// Whether the stream has no partition assigned and nothing consumed to commit.
    fn holds_nothing(&self) -> bool {
        let unassigned = self
            .source
            .consumer()
            .assignment()
            .is_ok_and(|a| a.count() == 0);
        unassigned && self.shared.tracker().commit_points().is_empty()
    }

    /// Leaves the group before the consumer is closed: unsubscribes, then serves the queue
    /// (revocations, and any assignment still queued) until no partition is assigned and no
    /// rebalance event comes for [`LEAVE_QUIET`], at most `timeout`; records polled meanwhile
    /// are not mirrored (they are after the commit point). Closing the consumer with a
    /// rebalance event still queued makes librdkafka (2.12) treat that event's assign call as
    /// the close's unassign, terminate the group, and then abort on the commit that the next
    /// queued revocation makes (`rd_kafka_cgrp_terminated: assert:
    /// !rd_kafka_assignment_in_progress`); librdkafka's advice is to unsubscribe and wait for
    /// the assignment to go before closing (confluentinc/librdkafka#4527, #4792). Then marks
    /// the context as closing: whatever the close still serves neither flushes nor commits.
    fn leave_group(&self, timeout: Duration) -> Left {
        let context = self.rebalance_context();
        self.source.consumer().unsubscribe();
        let deadline = Instant::now() + timeout;
        let mut quiet_since: Option<Instant> = None;
        loop {
            let served = context.rebalances_served.load(Ordering::SeqCst);
            if let Polled::Record(r) = self.source.poll(Duration::from_millis(20)) {
                tracing::trace!(
                    stream = self.stream,
                    "not mirrored at shutdown: {}/{} offset {}",
                    r.topic(),
                    r.partition(),
                    r.offset()
                );
            }
            let now = Instant::now();
            let unassigned = self
                .source
                .consumer()
                .assignment()
                .is_ok_and(|a| a.count() == 0);
            if !unassigned || context.rebalances_served.load(Ordering::SeqCst) != served {
                quiet_since = None;
            } else if now.duration_since(*quiet_since.get_or_insert(now)) >= LEAVE_QUIET {
                break;
            }
            if now >= deadline {
                tracing::warn!(
                    stream = self.stream,
                    "the group did not revoke this stream's partitions within {timeout:?} of \
                     unsubscribing; closing anyway"
                );
                break;
            }
        }
        context.closing.store(true, Ordering::SeqCst);
        let unassigned = self
            .source
            .consumer()
            .assignment()
            .is_ok_and(|a| a.count() == 0);
        Left {
            committed: unassigned
                && self.shared.tracker().commit_points().is_empty()
                && !context.release_commit_failed.load(Ordering::SeqCst),
            partitions: context.release_commits.load(Ordering::SeqCst),
        }
    }

    /// Stop consuming, wait (bounded) for the records in flight, commit what was
    /// acknowledged, leave the group.
    fn shutdown(self) -> Result<StreamReport, StreamError> {
        let started = Instant::now();
        let timeout = self.settings.shutdown_timeout;
        if self.settings.abort_on_send_failure
            && self
                .shared
                .failed_with_records_behind
                .load(Ordering::SeqCst)
        {
            // The target refused a record for good after later ones were produced: those
            // must not land after it, or a restart copies it again before them (out of
            // order). Purged records are not acknowledged, so they stay uncommitted and are
            // mirrored again, in order. (A record refused when it was produced has nothing
            // behind it: the stream stopped producing there, and what came before is flushed.)
            tracing::debug!(
                stream = self.stream,
                "purging the records produced after the one the target refused"
            );
            self.producer
                .purge(PurgeConfig::default().queue().inflight());
        }
        if let Err(e) = delivery::flush(&self.producer, timeout) {
            tracing::warn!(
                stream = self.stream,
                "shutdown flush did not finish within {timeout:?} ({e}); committing only what \
                 the target acknowledged"
            );
        }
        let unacknowledged = self.shared.tracker().in_flight();
        let id = self.stream;
        if self.holds_nothing() {
            // Never assigned anything (say, still joining): nothing to commit, and nothing
            // for the others to wait for. Leaving at once lets a rebalance stuck on this
            // member complete, so that the others can make their final commits.
            self.gate.arrive();
            let _ = self.leave_group(LEAVE_TIMEOUT);
            drop(self.source);
            tracing::info!(
                stream = id,
                "stopped: held no partitions, in {:?}",
                started.elapsed()
            );
            return Ok(StreamReport { unacknowledged });
        }
        // Retried while the group rebalances, within the shutdown timeout (at least 10 s).
        let retry = timeout
            .saturating_sub(started.elapsed())
            .max(MIN_FINAL_COMMIT_RETRY);
        {
            // Revocations from here on say whether their commits made up for this one.
            let context = self.rebalance_context();
            context.release_commits.store(0, Ordering::SeqCst);
            context.release_commit_failed.store(false, Ordering::SeqCst);
        }
        if self.shared.control.failure().is_none() {
            // After a fatal error the position may have passed a record that was never
            // tracked (a message handler that failed on it): commit points stay as they are.
            follow_positions(self.source.consumer(), &self.shared);
        }
        let committed = final_commit(&self.source, &self.shared, retry);
        self.gate.arrive();
        self.gate.wait(timeout);
        let left = self.leave_group(LEAVE_TIMEOUT);
        drop(self.source);
        // A final commit refused by a rebalance is made good by the commit of the revocation
        // that leaving the group served (it commits the same points).
        let committed = match committed {
            Err(e) if left.committed => {
                tracing::info!(
                    stream = id,
                    "final commit: {e}; committed when the partitions were revoked on leaving"
                );
                Ok(left.partitions)
            }
            other => other,
        };
        let n = committed.map_err(|source| StreamError::FinalCommit { stream: id, source })?;
        tracing::info!(
            stream = id,
            "stopped: committed {}, {} unacknowledged, in {:?}",
            counted(n, "partition"),
            counted(unacknowledged, "record"),
            started.elapsed()
        );
        Ok(StreamReport { unacknowledged })
    }
}

/// How long a stopping stream serves the revocation of its partitions after unsubscribing.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The least time the final commit is retried while the group rebalances.
const MIN_FINAL_COMMIT_RETRY: Duration = Duration::from_secs(10);
/// How long no rebalance event may arrive before a stream that unsubscribed closes.
const LEAVE_QUIET: Duration = Duration::from_millis(100);

/// A third of `max.poll.interval.ms`: a stream that waits longer than that for the target
/// pauses its partitions and polls again.
fn stall_limit(settings: &Settings) -> Duration {
    Duration::from_millis((settings.consumer.max_poll_interval().as_millis() as u64) / 3)
}

/// How long a revocation may wait for the target: four fifths of the group's rebalance
/// timeout (`max.poll.interval.ms`), leaving the rest to purge, commit and rejoin before the
/// group gives up on this member.
fn revoke_flush_limit(settings: &Settings) -> Duration {
    Duration::from_millis((settings.consumer.max_poll_interval().as_millis() as u64) / 5 * 4)
}

/// How leaving the group went.
struct Left {
    /// Every partition the stream held was revoked, and the revocations' commits succeeded.
    committed: bool,
    /// How many partitions' offsets those commits carried.
    partitions: usize,
}

/// Where a record goes: nowhere (it came from the target, or the handler filtered it
/// out), as it is, or as the handler made it. `None` if the handler failed (fatal).
pub(super) fn route<'h>(
    settings: &Settings,
    shared: &StreamShared,
    record: &Record<'_>,
    handler: Option<&'h mut Handler>,
) -> Option<Route<'h>> {
    let stats = &shared.stats;
    if let Some(p) = &settings.provenance {
        if p.came_from_target(record.headers()) {
            Stats::add(&stats.looped, 1);
            return Some(Route::Skip);
        }
    }
    let Some(handler) = handler else {
        return Some(Route::AsItIs);
    };
    match handler.handle(record) {
        Ok([]) => {
            Stats::add(&stats.filtered, 1);
            Some(Route::Skip)
        }
        Ok(outputs) => Some(Route::Handled(outputs)),
        Err(e) => {
            let path = settings.handler.as_ref().map(|h| h.path().display());
            shared.control.fail(format!(
                "the message handler {} failed on {}/{} offset {}: {e}",
                path.map_or_else(String::new, |p| p.to_string()),
                record.topic(),
                record.partition(),
                record.offset()
            ));
            None
        }
    }
}

/// The headers of an outgoing record, with the provenance header under
/// `--loop.prevention true`.
pub(super) fn stamped(settings: &Settings, mut headers: RawHeaders) -> RawHeaders {
    if let Some(p) = &settings.provenance {
        headers.add(PROVENANCE_HEADER, Some(p.source.as_bytes()));
    }
    headers
}

/// The target partition `--partitioning` gives a record: the same number (preserve), or
/// none for the producer's partitioner to choose (hash).
pub(super) fn same_partition(settings: &Settings, record: &Record<'_>) -> Option<i32> {
    match settings.partitioning {
        Partitioning::Preserve => Some(record.partition()),
        Partitioning::Hash => None,
    }
}

/// What becomes of one consumed record.
pub(super) enum Route<'h> {
    /// Not mirrored; acknowledged at once.
    Skip,
    /// Mirrored as it is.
    AsItIs,
    /// What the message handler made of it (at least one record).
    Handled(&'h [Emitted]),
}
