//! One mirror stream: a consumer in the group and its producers ([`Producers`]), on one thread.
//!
//! The loop: poll the producers (delivery reports advance the tracker), poll the consumer,
//! produce each record as it is (borrowed from the consumer, no copy of our own), commit on the
//! timer. When too much is unacknowledged the assigned partitions are paused, and the consumer
//! keeps being polled so the stream stays in the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{Producer, PurgeConfig};

use super::delivery::{send_failed, send_failed_because};
use super::producers::Producers;
use super::rebalance::{MirrorConsumer, MirrorSource, SourceContext};
use crate::mirror::clients::{self, Cluster};
use crate::mirror::commit::{commit_async, commit_stored, final_commit, follow_positions};
use crate::mirror::flush::{self, serve_deliveries, Reports};
use crate::mirror::limits::TargetLimits;
use crate::mirror::mapping::ledger::StreamMapping;
use crate::mirror::mapping::store::MappingStore;
use crate::mirror::metadata::{self, Next, UnknownPartitions};
use crate::mirror::offsets::Ticket;
use crate::mirror::route::{outgoing, route, Destination, StreamReport};
use crate::mirror::state::{Control, ShutdownGate, Stats, StreamShared};
use crate::mirror::subscription::{SubscribeError, Subscription};
use crate::mirror::target::TargetNames;
use crate::mirror::throttle::Hold;
use crate::mirror::topic_ids::TopicIds;
use crate::mirror::topics::TopicCreator;
use crate::mirror::Partition;
use crate::native::cached_low_watermark;
use crate::native::produce::{produce, Outgoing};
use crate::native::queue::{Polled, Source};
use crate::native::record::Record;
use crate::plugin::{Handler, PluginError};
use crate::settings::flags::SourceGap;
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
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    #[error("stream {stream}: {source}")]
    Plugin { stream: usize, source: PluginError },
    #[error("stream {stream}: final commit failed: {source}; the records after the last committed offsets will be mirrored again on restart (duplicates, no loss)")]
    FinalCommit { stream: usize, source: KafkaError },
}

/// What a stream shares with the others on the target side: the maker of target topics
/// (`--create.topics`), the offset-mapping store, the target topics' limits.
pub(crate) type TargetClients = (
    Option<Arc<TopicCreator>>,
    Option<Arc<MappingStore>>,
    Arc<TargetLimits>,
);

pub(crate) struct Stream<'s> {
    stream: usize,
    settings: &'s Settings,
    shared: Arc<StreamShared>,
    producer: Arc<Producers>,
    /// The source consumer and our poll of its queue.
    source: MirrorSource,
    subscription: Subscription,
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
    /// Target topics with a partition the producer did not know, each on its own clock.
    unknown_partitions: UnknownPartitions,
    gate: Arc<ShutdownGate>,
    /// The target topics' `max.message.bytes`: a topic met for the first time is checked
    /// against the producer's `batch.size`.
    limits: Arc<TargetLimits>,
    /// The hold of `--throttle.bytes.per.second` and `--throttle.records.per.second`: its
    /// partitions paused until the shared buckets' debt is paid; the time until the first
    /// record after they resume (the consumer fetches again) is the time throttled
    /// (`mirror_throttled_seconds_total`).
    hold: Hold,
    /// The source topics' ids: a topic deleted and created again is mirrored again from its
    /// beginning.
    topic_ids: TopicIds,
}

impl<'s> Stream<'s> {
    pub(crate) fn new(
        stream: usize,
        settings: &'s Settings,
        control: Arc<Control>,
        stats: Arc<Stats>,
        gate: Arc<ShutdownGate>,
        (topics, store, limits): TargetClients,
    ) -> Result<Stream<'s>, StreamError> {
        let id = stream;
        let shared = StreamShared::new(
            stream,
            control,
            stats,
            settings.options.abort_on_send_failure,
            store.map(|s| StreamMapping::new(s)),
        );
        let producer = Producers::new(settings, &shared, &limits, settings.producers_per_stream)
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
            .create_with_context(SourceContext {
                shared: shared.clone(),
                producer: producer.clone(),
                revoke_flush_timeout: release_limits(settings).0,
                drain_limit: release_limits(settings).1,
                shutdown_timeout: settings.options.shutdown_timeout,
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
        if let crate::settings::OnHandlerError::DeadLetter(topic) = &settings.on_handler_error {
            let _ = shared.dead_letter.set(topic.clone());
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
            subscription: Subscription::new(stream, ""),
            paused: std::cell::Cell::new(false),
            last_consumer_poll: std::cell::Cell::new(Instant::now()),
            handler: std::cell::RefCell::new(handler),
            stall_limit: stall_limit(settings),
            targets: TargetNames::new(settings.target_topic.clone()),
            unknown_partitions: UnknownPartitions::new(metadata::propagation_limit(
                &settings.producer,
            )),
            gate,
            limits,
            hold: Hold::default(),
            topic_ids: TopicIds::new(stream, settings.options.topic_refresh_interval),
        })
    }

    /// Runs until a stop is requested or a fatal error occurs, then flushes and commits.
    pub(crate) fn run(mut self, initial_topics: Vec<String>) -> Result<StreamReport, StreamError> {
        let subscribed =
            self.subscription
                .subscribe(self.source.consumer(), self.settings, initial_topics);
        if let Err(e) = subscribed {
            self.gate.arrive();
            return Err(e.into());
        }
        self.check_topic_ids();
        let mut next_commit = Instant::now() + self.settings.options.commit_interval;
        let mut next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
        while !self.shared.control.stop_requested() {
            self.producer.serve();
            self.make_room();
            self.recreate_missing_targets();
            // Partitions of a topic found created again, assigned since the check.
            self.restart_recreated();
            // Caught up with the source: what the producers hold back for linger.ms waits for
            // no more records, so it goes now (a trickle is copied at once, a backlog still
            // in full batches). Held by the throttle: back as its debt is paid, not a whole
            // interval later.
            let mut polled = self.source.poll(Duration::ZERO);
            if matches!(polled, Polled::Nothing) {
                self.producer.cut_linger();
                polled = self.source.poll(self.hold.poll_wait(POLL_INTERVAL));
            }
            self.last_consumer_poll.set(Instant::now());
            match polled {
                Polled::Nothing => {}
                Polled::Record(record) => self.mirror(&record),
                Polled::Error { error, reason } => self.source_error(&error, &reason),
            }
            let now = Instant::now();
            self.shared.turned(now);
            if now >= next_commit {
                // Between polls: every record the position passed has begun in the tracker,
                // or is held below (put back while the producer queue was full).
                follow_positions(self.source.consumer(), &self.shared);
                // A failure is counted and logged where its result arrives (`committed`).
                let _ = commit_async(&self.source, &self.shared);
                next_commit = now + self.settings.options.commit_interval;
            } else {
                // The offset mapping acknowledged since the timer: commit what it holds.
                let _ = commit_stored(&self.source, &self.shared);
            }
            if now >= next_refresh {
                self.subscription
                    .refresh(self.source.consumer(), self.settings);
                self.check_topic_ids();
                next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
            }
        }
        self.shutdown()
    }

    /// Asks the source for the ids of the subscribed topics (see [`crate::mirror::topic_ids`]):
    /// a topic whose id changed was deleted and created again, and librdkafka would fetch the
    /// new topic on from the old position; its partitions are started again from offset 0.
    fn check_topic_ids(&mut self) {
        self.topic_ids.check(
            self.source.consumer().client(),
            self.subscription.topics(),
            &self.shared.stats.recorded,
        );
        self.restart_recreated();
    }

    /// Starts the assigned partitions of source topics found created again from offset 0 of
    /// the new topic, each once: the tracker's commit point is 0 at once, and acknowledgements
    /// of records copied from the old topic never move it.
    fn restart_recreated(&mut self) {
        if !self.topic_ids.has_pending() {
            return;
        }
        let Ok(assignment) = self.source.consumer().assignment() else {
            return;
        };
        let assigned: Vec<Partition> = assignment
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let mut started = Vec::new();
        for (topic, partition) in self.topic_ids.due(&assigned) {
            let abandoned = self.shared.tracker().restart_at(&topic, partition, 0);
            let seek = self.source.consumer().seek(
                &topic,
                partition,
                rdkafka::Offset::Offset(0),
                Duration::ZERO,
            );
            if let Err(e) = seek {
                // The commit point is 0 already: the stop's commit makes a restart mirror
                // the new topic from its beginning.
                self.shared.control.fail(format!(
                    "stream {}: cannot move {topic}/{partition} to offset 0 of the source topic \
                     created again: {e}; stopping with the committed offset at 0, so a restart \
                     mirrors the new topic from its beginning",
                    self.stream
                ));
            }
            started.push((topic, partition, abandoned));
        }
        self.topic_ids.report(&started);
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
        // `--throttle.*.per.second`: paused until the shared buckets' debt is paid; the loop
        // keeps polling, so the stream stays in its group. Once paid, resumed below unless
        // the in-flight limits still hold it back.
        if self.hold.holds(Instant::now()) {
            if changed || !self.paused.get() {
                let (_, records, bytes) = self.over_limit(1);
                self.set_paused(true, records, bytes);
            }
            return;
        }
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
            let _ = flush::flush(&self.producer, Duration::from_millis(200));
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
        let mut partitions: Vec<Partition> = Vec::new();
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
                for producer in self.producer.all() {
                    metadata::refresh_now(producer.client(), self.stream, &name);
                }
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

    fn rebalance_context(&self) -> &SourceContext {
        self.source.consumer().context()
    }

    /// Mirrors one consumed record: routes it (as it is, through the handler, or not at all),
    /// registers it with the tracker once with the number of target records it became, and
    /// sends those.
    fn mirror(&self, record: &Record<'_>) {
        let stats = &self.shared.stats;
        self.hold.resumed(&stats.throttled_micros);
        let bytes = record.size();
        Stats::add(&stats.consumed, 1);
        Stats::add(&stats.consumed_bytes, bytes as u64);
        if self.settings.on_source_gap == SourceGap::Abort && self.stops_at_a_gap(record, bytes) {
            return;
        }
        let mut handler = self.handler.borrow_mut();
        let Some(route) = route(self.settings, &self.shared, record, handler.as_mut()) else {
            // A handler error is fatal. The consumer's position is past the record already:
            // registered as failed, it keeps its partition's commit point below it (the
            // commits still made before the stream stops would otherwise follow the position).
            self.shared.tracker().begin_failed(
                record.topic(),
                record.partition(),
                record.offset(),
                record.timestamp(),
                bytes,
            );
            return;
        };
        let (ticket, gap_from) = self.shared.tracker().begin_after(
            record.topic(),
            record.partition(),
            record.offset(),
            record.timestamp(),
            bytes,
            u32::try_from(route.len()).unwrap_or(u32::MAX),
        );
        if let Some(expected) = gap_from {
            self.skipped_before(record, expected);
        }
        // A skipped record makes no output: acknowledged at once, the commit point may pass it.
        for (topic, out) in outgoing(self.settings, record, &route, || ticket.to_opaque()) {
            if !self.send(topic, out) {
                // Stopping, or the record's partition was released meanwhile.
                break;
            }
        }
        if let (Some(throttle), true) = (self.shared.stats.throttle.get(), route.len() > 0) {
            // Paused from the next turn until the debt is paid.
            self.hold.charge(throttle, bytes as u64, 1);
        }
    }

    /// `--on.source.gap abort`: whether `record` comes after records the source deleted
    /// before they were mirrored; if so the stream stops, naming them, and the record is
    /// registered as failed (never sent), so that nothing past the gap is committed.
    fn stops_at_a_gap(&self, record: &Record<'_>, bytes: usize) -> bool {
        let (topic, partition) = (record.topic(), record.partition());
        let expected = self
            .shared
            .tracker()
            .gap_before(topic, partition, record.offset());
        let Some((expected, end)) = expected.and_then(|e| self.deleted_before(record, e)) else {
            return false;
        };
        self.shared.tracker().begin_failed(
            topic,
            partition,
            record.offset(),
            record.timestamp(),
            bytes,
        );
        self.shared
            .stats
            .recorded
            .count_skipped("retention", (end - expected) as u64);
        self.shared.control.fail(format!(
            "source records {topic}/{partition} offsets {expected} to {} ({} records) were \
             deleted by the source's retention before they were mirrored; they are not on the \
             target. Stopping (--on.source.gap abort) with the committed offset at or before \
             {expected}; to mirror on from offset {} anyway, restart with --on.source.gap skip",
            end - 1,
            end - expected,
            record.offset()
        ));
        true
    }

    /// The offsets `expected..end` the source deleted before `record`, which came after a gap
    /// from `expected`. Gaps above the partition's low watermark are normal (compaction,
    /// transaction markers); records below it were deleted by the source's retention before
    /// they were read (librdkafka reset the position to the earliest offset and only logged
    /// it).
    fn deleted_before(&self, record: &Record<'_>, expected: i64) -> Option<(i64, i64)> {
        let (topic, partition) = (record.topic(), record.partition());
        let low = cached_low_watermark(self.source.consumer(), topic, partition)?;
        let end = low.min(record.offset());
        (end > expected).then_some((expected, end))
    }

    /// `record` came after a gap from `expected`: say which records of it the source deleted
    /// before they were read (see [`Self::deleted_before`]), and count them.
    fn skipped_before(&self, record: &Record<'_>, expected: i64) {
        let (topic, partition) = (record.topic(), record.partition());
        let Some((expected, end)) = self.deleted_before(record, expected) else {
            return;
        };
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

    /// Hands a record for the target topic of `topic` to the producer. A full queue (rare:
    /// consumption pauses before it fills, but a handler that enlarges records or fans out
    /// can fill it first) is waited out while serving delivery reports, feeding the watchdog
    /// and, once the wait endangers the group membership, with the assigned partitions paused
    /// and the consumer polled. Any other refusal is a send failure. Returns whether the
    /// record's other outputs, if any, should still be sent: not when stopping, nor when its
    /// partition was released during the wait (its next owner mirrors it again).
    fn send(&self, to: Destination<'_>, mut out: Outgoing<'_>) -> bool {
        let topic = to.name();
        let ticket = Ticket::from_opaque(out.opaque);
        let target = match to {
            // A mirrored topic met for the first time is checked against `batch.size`.
            Destination::Mirrored(_) => self
                .targets
                .of_admitted(topic, |target| self.limits.admit(target)),
            Destination::DeadLetter(_) => Ok(self.targets.of_destination(to)),
        };
        let target = match target {
            Ok(Some(target)) => target,
            Ok(None) => {
                let error = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
                send_failed(&self.shared, ticket, topic, out.partition, &error);
                return true;
            }
            Err(refused) => {
                // Nothing of it is sent: failed, the commit point stays before it, whatever
                // --abort.on.send.failure says (no record could be copied there).
                self.shared.tracker().fail(ticket);
                self.shared
                    .control
                    .fail(format!("stream {}: {refused}", self.stream));
                return false;
            }
        };
        let mut waiting_since: Option<Instant> = None;
        let (lane, producer) = self.producer.of(&target, out.partition);
        loop {
            match produce(producer, &target, &mut out) {
                Ok(()) => {
                    self.producer.handed(lane);
                    Stats::add(&self.shared.stats.produced, 1);
                    self.unknown_partitions.known(&target);
                    if let Destination::DeadLetter(_) = to {
                        self.dead_letter_produced();
                    }
                    return true;
                }
                Err(RDKafkaErrorCode::UnknownPartition) => {
                    // The producer's view of the target topic may predate partitions added
                    // since (a source topic that grew, its target grown before the new
                    // partitions were assigned, metadata not yet on every broker): ask the
                    // target, per topic, until topic.metadata.propagation.max.ms has passed.
                    let client = producer.client();
                    match self
                        .unknown_partitions
                        .refused(client, self.stream, &target)
                    {
                        Next::Refresh => {}
                        Next::Wait => {
                            if !self.wait_turn(ticket, Instant::now()) {
                                return false;
                            }
                        }
                        Next::GiveUp(after) => {
                            let name = target.to_str().unwrap_or(topic);
                            let partition = out
                                .partition
                                .map_or_else(|| "?".to_owned(), |p| p.to_string());
                            send_failed_because(
                                &self.shared,
                                ticket,
                                name,
                                "UnknownPartition",
                                &format!(
                                    "the target topic {name} has no partition {partition}, still \
                                     after refreshing its metadata for {after:?} (the producer's \
                                     topic.metadata.propagation.max.ms is {:?}): --partitioning \
                                     preserve needs at least as many partitions on the target as \
                                     on the source; add partitions to the target topic or use \
                                     --partitioning hash",
                                    self.unknown_partitions.limit()
                                ),
                            );
                            return !self.shared.control.stop_requested();
                        }
                    }
                }
                Err(RDKafkaErrorCode::QueueFull) => {
                    let now = Instant::now();
                    if waiting_since.is_none() {
                        tracing::debug!(stream = self.stream, "producer queue full; waiting");
                        waiting_since = Some(now);
                    }
                    if producer.in_flight_count() == 0 {
                        // Nothing queued that could make room: this record alone is larger
                        // than the queue's byte limit, and would wait for ever.
                        let name = target.to_str().unwrap_or(topic);
                        let bytes = out.value.map_or(0, <[u8]>::len);
                        let limit = self
                            .settings
                            .producer
                            .get("queue.buffering.max.kbytes")
                            .unwrap_or("?");
                        send_failed_because(
                            &self.shared,
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
                    if !self.wait_turn(ticket, now) {
                        return false;
                    }
                }
                Err(code) => {
                    let name = target.to_str().unwrap_or(topic);
                    send_failed(
                        &self.shared,
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

    /// A dead-letter record was handed to the producer: counted until its report, and, if
    /// the target refused an earlier one, one that must not land after it.
    fn dead_letter_produced(&self) {
        self.shared
            .dead_letters_in_flight
            .fetch_add(1, Ordering::SeqCst);
        if self.shared.dead_letter_refused.load(Ordering::SeqCst) {
            self.shared
                .failed_with_records_behind
                .store(true, Ordering::SeqCst);
        }
    }

    /// One turn of a wait before a record is tried again (room in the producer queue, a
    /// partition's metadata): delivery reports served, the watchdog fed, and once the wait
    /// endangers the group membership, the consumer polled with the partitions paused.
    /// Returns whether to try again: not when stopping (the record stays unacknowledged:
    /// the commit point stays before it), nor when its partition was released meanwhile (the
    /// commit point stayed before it, and its partition's next owner mirrors it).
    fn wait_turn(&self, ticket: Ticket, now: Instant) -> bool {
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
        !self.shared.control.stop_requested() && self.shared.tracker().is_tracked(ticket)
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
        self.producer.serve();
        let polled = self.source.poll(Duration::from_millis(10));
        self.last_consumer_poll.set(Instant::now());
        match polled {
            Polled::Nothing => {}
            Polled::Record(record) => {
                let (_, records, bytes) = self.over_limit(1);
                self.set_paused(true, records, bytes);
                // The position stays past it until the seek takes effect (librdkafka applies
                // it on its own thread): a revocation served meanwhile must not let the
                // commit point follow the position past a record never registered.
                self.shared
                    .tracker()
                    .hold(record.topic(), record.partition(), record.offset());
                let rewound = self.source.consumer().seek(
                    record.topic(),
                    record.partition(),
                    rdkafka::Offset::Offset(record.offset()),
                    Duration::ZERO,
                );
                if let Err(e) = rewound {
                    // The position stays past it: registered as failed, the commit point
                    // stays before it.
                    self.shared.tracker().begin_failed(
                        record.topic(),
                        record.partition(),
                        record.offset(),
                        record.timestamp(),
                        record.size(),
                    );
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
    fn leave_group(&self, timeout: Duration) -> LeaveOutcome {
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
        LeaveOutcome {
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
        let timeout = self.settings.options.shutdown_timeout;
        if self.settings.options.abort_on_send_failure
            && self
                .shared
                .failed_with_records_behind
                .load(Ordering::SeqCst)
        {
            // The target refused a record for good after later ones were produced: those
            // must not land after it, or a restart copies it again before them (out of
            // order). Purged records are not acknowledged, so they stay uncommitted and are
            // mirrored again, in order. (A record refused when it was produced has nothing
            // behind it: the stream stopped producing there, and what came before is flushed.
            // Nor has a refused dead-letter record with no other dead-letter record after it:
            // the mirrored records around it are flushed and committed below it.)
            tracing::debug!(
                stream = self.stream,
                "purging the records produced after the one the target refused"
            );
            self.producer
                .purge(PurgeConfig::default().queue().inflight());
        }
        if let Err(e) = flush::flush(&self.producer, timeout) {
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

/// How long a release may take in all: four fifths of the group's rebalance timeout
/// (`max.poll.interval.ms`), leaving the rest to commit and rejoin before the group gives up on
/// this member. Split into the flush's limit and the drain's bound (see
/// [`flush::drain`](crate::mirror::flush::drain)): the drain gets the producer's
/// `request.timeout.ms` and a margin, so that every request on the wire is answered or timed
/// out within it, but at most half the release; the flush gets the rest.
fn release_limits(settings: &Settings) -> (Duration, Duration) {
    let release =
        Duration::from_millis((settings.consumer.max_poll_interval().as_millis() as u64) / 5 * 4);
    let drain =
        (crate::mirror::flush::request_timeout(&settings.producer) + DRAIN_MARGIN).min(release / 2);
    (release - drain, drain)
}

/// What the drain waits beyond `request.timeout.ms`: librdkafka looks for timed-out requests
/// once a second, and their records' delivery reports are served after that.
const DRAIN_MARGIN: Duration = Duration::from_secs(2);

/// How leaving the group went.
struct LeaveOutcome {
    /// Every partition the stream held was revoked, and the revocations' commits succeeded.
    committed: bool,
    /// How many partitions' offsets those commits carried.
    partitions: usize,
}
