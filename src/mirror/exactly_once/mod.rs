//! Exactly-once mode (`--exactly.once true`): one stream's loop with a transactional producer
//! on the target.
//!
//! Here: the stream and its incarnations ([`TxStream`], [`run_incarnations`]); beside it
//! [`transaction`] (begin, commit with the progress, abort and rewind), [`handover`] (starts,
//! claims, fencing, revocations), [`delivery`] (the delivery log of the open transaction),
//! [`state`] (the owned partitions), [`store_reader`] (reading the store for a hand-over) and
//! [`context`] (the source consumer's context, which runs the hand-over in rebalances).
//!
//! Each transaction holds the records mirrored during `--transaction.interval.ms` and, written
//! last, the offset-mapping records of those partitions ([`super::mapping`]): the segments
//! the delivery reports built and one [`Progress`] per partition, whose `next` is the next
//! source offset to copy and whose `txid` is this stream's transactional id. Records and
//! progress commit together or not at all, so the store's progress is where a partition
//! resumes: it is authoritative in this mode; the source group's commits follow it for
//! monitoring (lag) only.
//!
//! Hand-overs. Newly assigned partitions stay paused until the stream's loop has read their
//! progress (`read_committed`: first to the store's last stable offset, then, once every
//! previous owner named there that is not this stream, and did not release them past it, is
//! fenced, to the high watermark as it was when the read began, so that no release committed
//! before the assignment is missed; an owner still named there is fenced then),
//! has produced a claim (the same `next`, its own id) in a transaction, has then committed each
//! `next` to the source group (synchronously, the claim's transaction still open: refused, the
//! stream has lost them meanwhile and the claim is aborted, see `TxShared::still_assigned`),
//! has committed the claim and has moved them to their `next`.
//! Fencing a transactional id means initialising a producer with it: the target aborts the
//! transaction it left open and refuses its producer for good. The read is not made in the
//! rebalance callback: it may wait for a crashed owner's transaction on the store to end, and
//! a blocked callback holds the group's rebalance. On a clean revocation the open
//! transaction is committed with a release (progress with `txid` null): the next owner has no
//! one to fence. A partition whose progress names another id was not released cleanly (its
//! owner crashed, or was cut off from the group and may be a zombie): that owner is fenced,
//! and if it is still running, its next transactional call fails, having committed nothing
//! after the fence, and it rejoins as a new incarnation. A stream whose assignment is lost
//! writes nothing more with its producer (it may be fenced already), leaves, and rejoins as a
//! new incarnation with a new transactional id. Transactional ids are unique per run
//! ([`ExactlyOnce::transactional_id`]), so a restarted instance is never fenced by whoever
//! fences its predecessor.
//!
//! Failures. A transaction the target aborts or refuses to commit (a record that timed out,
//! say, during a target outage longer than `transaction.timeout.ms`) is aborted and its
//! partitions are read again from their last committed progress. A fenced producer (the
//! coordinator aborted a transaction that outlived its timeout, or another instance took the
//! partitions over) is retired, and the stream rejoins as a new incarnation, as after a lost
//! assignment. A fatal error (a record refused for good) aborts what can be aborted and stops the
//! mirror: nothing of the open transaction becomes visible, and the next owner copies on from the
//! store.

mod context;
mod delivery;
mod handover;
mod state;
mod store_reader;
mod transaction;

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::clients::{self, Cluster};
use super::mapping::Recorder;
use super::metadata::{self, Next, UnknownPartitions};
use super::state::{Control, ShutdownGate, Stats, StreamShared};
use super::target::TargetNames;
use super::throttle::Hold;
use super::topics::TopicCreator;
use crate::mirror::route::{outgoing, route, Destination, StreamReport};
use crate::mirror::source::committed;
use crate::mirror::subscription::{SubscribeError, Subscription};
use crate::native::produce::{produce, Outgoing};
use crate::native::queue::{Polled, Source};
use crate::native::record::Record;
use crate::plugin::Handler;
use crate::settings::exactly_once::ExactlyOnce;
use crate::settings::Settings;

use self::context::TxSourceContext;
use self::delivery::{SentLog, TxDelivery};
use self::transaction::TxShared;
use crate::mirror::Partition;

type TxProducer = BaseProducer<TxDelivery>;
type TxConsumer = BaseConsumer<TxSourceContext>;

/// How long one consumer poll may block when nothing arrives.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a stopping stream serves the revocation of its partitions after unsubscribing.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a commit the target calls retriable is tried before the transaction is aborted.
const COMMIT_TRIES: u32 = 3;
/// How long one read of the store may wait for transactions on it to end, at each try from
/// the stream's loop.
const READ_PATIENCE: Duration = Duration::from_secs(2);
/// How often the start of pending partitions is tried again.
const PENDING_RETRY: Duration = Duration::from_millis(500);
/// What a stream that stops on a record or a store write says will happen.
const STOPPING: &str = "Stopping (--exactly.once true): the open transaction is aborted, and a \
                        restart copies on from the last commit";
/// The delivery opaque of the store's records (a mirrored record's is a generation and an
/// index, never this).
const STORE_OPAQUE: usize = usize::MAX;

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    #[error("stream {stream}: cannot create the {client}: {source}")]
    Create {
        stream: usize,
        client: &'static str,
        source: KafkaError,
    },
    #[error(
        "stream {stream}: cannot initialise transactional id {txid} on the target: {source}; \
         check that the target allows transactions (transaction.state.log.* settings, \
         WRITE and DESCRIBE on the transactional id for the mirror's principal)"
    )]
    Init {
        stream: usize,
        txid: String,
        source: KafkaError,
    },
    #[error("stream {stream}: {message}")]
    Stream { stream: usize, message: String },
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// The group took the stream's partitions back without a revocation (its session timed
    /// out): the stream has tried to abort its open transaction (its producer may be fenced
    /// already) and left; it rejoins as a new incarnation, under a new transactional id.
    #[error("stream {stream}: the assignment was lost")]
    Lost { stream: usize },
}

/// What went wrong with a transaction.
#[derive(Debug)]
enum TxFailure {
    /// The transaction was aborted or must be: copy again from the last commit.
    Abortable(String),
    /// The producer cannot go on (a record refused for good): stop.
    Fatal(String),
    /// The target fenced this stream's transactional id (see [`delivery::fenced`]): nothing
    /// of the open transaction is visible. The stream retires its producer and rejoins as a
    /// new incarnation, which copies on from the store; stopping, it stops.
    Fenced(String),
}

/// One exactly-once stream's thread: a stream whose assignment was lost starts again as a new
/// incarnation (a new consumer and a new transactional id) unless the mirror is stopping. A
/// new incarnation that cannot initialise its transactional id (the target still down, its
/// coordinator still loading) tries again every 2 s for up to twice the transaction timeout.
pub(crate) fn run_incarnations(
    stream: usize,
    settings: &Settings,
    store_topic: &str,
    (control, stats, gate): (Arc<Control>, Arc<Stats>, Arc<ShutdownGate>),
    creator: Option<Arc<TopicCreator>>,
    topics: Vec<String>,
) -> Result<StreamReport, TransactionError> {
    let mut incarnation = 0;
    let mut retrying_since: Option<Instant> = None;
    loop {
        let created = TxStream::new(
            stream,
            settings,
            store_topic,
            (control.clone(), stats.clone(), gate.clone()),
            creator.clone(),
            incarnation,
        );
        let result = match created {
            Ok(s) => {
                retrying_since = None;
                s.run(topics.clone())
            }
            Err(e @ TransactionError::Init { .. })
                if incarnation > 0
                    && !control.stop_requested()
                    && retrying_since.get_or_insert_with(Instant::now).elapsed()
                        < 2 * settings.producer.transaction_timeout() =>
            {
                tracing::warn!(stream, "{e}; trying again in 2 s");
                std::thread::sleep(Duration::from_secs(2));
                incarnation += 1;
                continue;
            }
            Err(e) => {
                gate.arrive();
                return Err(e);
            }
        };
        match result {
            Err(TransactionError::Lost { .. }) if !control.stop_requested() => {
                incarnation += 1;
            }
            Err(TransactionError::Lost { .. }) => {
                gate.arrive();
                return Ok(StreamReport::default());
            }
            other => return other,
        }
    }
}

/// One exactly-once stream.
pub(crate) struct TxStream<'s> {
    stream: usize,
    settings: &'s Settings,
    exactly_once: &'s ExactlyOnce,
    core: Arc<TxShared>,
    source: Source<TxSourceContext>,
    handler: RefCell<Option<Handler>>,
    targets: TargetNames,
    subscription: Subscription,
    gate: Arc<ShutdownGate>,
    /// Target topics with a partition the producer did not know, each on its own clock.
    unknown_partitions: UnknownPartitions,
    /// The hold of `--throttle.*.per.second`, and the owned partitions it paused: only
    /// those are resumed when it ends (a partition whose start is pending stays paused).
    hold: Hold,
    held: RefCell<Vec<Partition>>,
}

impl<'s> TxStream<'s> {
    pub(crate) fn new(
        stream: usize,
        settings: &'s Settings,
        store_topic: &str,
        (control, stats, gate): (Arc<Control>, Arc<Stats>, Arc<ShutdownGate>),
        creator: Option<Arc<TopicCreator>>,
        incarnation: u32,
    ) -> Result<TxStream<'s>, TransactionError> {
        let exactly_once =
            settings
                .exactly_once
                .as_ref()
                .ok_or_else(|| TransactionError::Stream {
                    stream,
                    message: "a transactional stream without --exactly.once true".to_owned(),
                })?;
        let txid = exactly_once.transactional_id(stream, incarnation);
        let shared = StreamShared::new(stream, control, stats, true, None);
        let create = |client, source| TransactionError::Create {
            stream,
            client,
            source,
        };
        let producer: TxProducer = settings
            .producer
            .client_config()
            .set("transactional.id", &txid)
            .create_with_context(TxDelivery {
                shared: shared.clone(),
                txid: txid.clone(),
                sent_log: Mutex::new(SentLog {
                    // Its own transaction markers continue a segment (as target gaps).
                    recorder: Recorder::transactional(),
                    ..SentLog::default()
                }),
                retired: false.into(),
            })
            .map_err(|e| create("transactional target producer", e))?;
        let timeout = settings.producer.transaction_timeout();
        let started = Instant::now();
        // A new id (one per run): registers it with the target's transaction coordinator.
        producer
            .init_transactions(timeout)
            .map_err(|source| TransactionError::Init {
                stream,
                txid: txid.clone(),
                source,
            })?;
        tracing::info!(
            stream,
            "transactional id {txid} initialised in {:?}",
            started.elapsed()
        );
        let listener = settings
            .listener
            .as_ref()
            .map(|l| l.instance().map(Mutex::new))
            .transpose()
            .map_err(|e| TransactionError::Stream {
                stream,
                message: e.to_string(),
            })?;
        let handler = settings
            .handler
            .as_ref()
            .map(|h| h.instance())
            .transpose()
            .map_err(|e| TransactionError::Stream {
                stream,
                message: e.to_string(),
            })?;
        let max_poll = settings.consumer.max_poll_interval();
        let core = Arc::new(TxShared {
            stream,
            txid,
            trust: crate::mirror::mapping::Trust::of(settings).counting(&shared.stats),
            shared,
            producer,
            target: settings.producer.clone(),
            store_topic: store_topic.to_owned(),
            timeout,
            state: Mutex::default(),
            closing: false.into(),
            lost: false.into(),
            listener,
            creator,
            topic_retry_limit: max_poll / 3,
            reader: Mutex::default(),
            earliest: !matches!(
                settings.consumer.get("auto.offset.reset").map(str::trim),
                Some("latest" | "largest" | "end")
            ),
        });
        let consumer: TxConsumer = settings
            .consumer
            .client_config()
            .create_with_context(TxSourceContext { core: core.clone() })
            .map_err(|e| create("source consumer", e))?;
        let source = Source::new(consumer).ok_or_else(|| {
            create(
                "source consumer queue (is group.id set?)",
                KafkaError::ClientCreation("no consumer queue".to_owned()),
            )
        })?;
        Ok(TxStream {
            stream,
            settings,
            exactly_once,
            core,
            source,
            handler: RefCell::new(handler),
            targets: TargetNames::new(settings.target_topic.clone()),
            subscription: Subscription::new(stream, " (exactly once)"),
            gate,
            unknown_partitions: UnknownPartitions::new(metadata::propagation_limit(
                &settings.producer,
            )),
            hold: Hold::default(),
            held: RefCell::default(),
        })
    }

    fn shared(&self) -> &StreamShared {
        &self.core.shared
    }

    /// Runs until a stop is requested or a fatal error occurs, then commits (or aborts) and
    /// leaves the group; or, once the assignment is lost, leaves without committing and returns
    /// [`TransactionError::Lost`].
    pub(crate) fn run(
        mut self,
        initial_topics: Vec<String>,
    ) -> Result<StreamReport, TransactionError> {
        let subscribed =
            self.subscription
                .subscribe(self.source.consumer(), self.settings, initial_topics);
        if let Err(e) = subscribed {
            self.gate.arrive();
            return Err(e.into());
        }
        let interval = self.exactly_once.transaction_interval;
        let max_records = self.settings.max_in_flight_records;
        let mut next_group_commit = Instant::now() + self.settings.options.commit_interval;
        let mut next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
        while !self.shared().control.stop_requested() {
            if self.core.lost.load(Ordering::SeqCst) {
                return Err(self.leave_lost());
            }
            self.core.producer.poll(Duration::ZERO);
            let failure = self.core.sent_log().failure.take();
            match failure {
                // Aborted and rewound, or fenced and retired (the stream rejoins below).
                Some(f @ (TxFailure::Abortable(_) | TxFailure::Fenced(_))) => {
                    self.core.failed(self.source.consumer(), f);
                }
                Some(TxFailure::Fatal(why)) => {
                    self.shared()
                        .control
                        .fail(format!("stream {}: {why}", self.stream));
                    break;
                }
                None => {}
            }
            // An abort may have retired the producer (fenced): nothing more with it.
            if self.core.lost.load(Ordering::SeqCst) {
                return Err(self.leave_lost());
            }
            self.core.start_pending(self.source.consumer());
            if self.core.due(interval, max_records) {
                self.core.commit_or_abort(self.source.consumer(), &[]);
            }
            if self.core.lost.load(Ordering::SeqCst) {
                return Err(self.leave_lost());
            }
            self.throttle_turn();
            let wait = self.core.state().open.map_or(POLL_INTERVAL, |began| {
                interval.saturating_sub(began.elapsed()).min(POLL_INTERVAL)
            });
            match self.source.poll(self.hold.poll_wait(wait)) {
                Polled::Nothing => {}
                Polled::Record(record) => self.mirror(&record),
                Polled::Error { error, reason } => clients::client_error(
                    &self.shared().control,
                    Cluster::Source,
                    self.stream,
                    &error,
                    &reason,
                ),
            }
            // The poll may have served the revocation of a lost assignment: nothing more is
            // committed with this producer.
            if self.core.lost.load(Ordering::SeqCst) {
                return Err(self.leave_lost());
            }
            let now = Instant::now();
            self.shared().turned(now);
            if now >= next_group_commit {
                // Progress that only followed the position (past transaction markers and
                // aborted source transactions, no record) is committed here: nothing else
                // would open a transaction for it.
                self.core.commit_or_abort(self.source.consumer(), &[]);
                if let Some(tpl) = self.core.monitoring_offsets(None) {
                    if let Err(e) = self.source.commit_async(&tpl) {
                        committed(self.shared(), &Err(e), tpl.count());
                    }
                }
                next_group_commit = now + self.settings.options.commit_interval;
            }
            if now >= next_refresh {
                self.subscription
                    .refresh(self.source.consumer(), self.settings);
                next_refresh = Instant::now() + self.settings.options.topic_refresh_interval;
            }
        }
        if self.core.lost.load(Ordering::SeqCst) {
            return Err(self.leave_lost());
        }
        self.shutdown()
    }

    /// Mirrors one consumed record into the open transaction: every record the handler
    /// makes of it, or none, and then its partition's progress passes it.
    fn mirror(&self, record: &Record<'_>) {
        let shared = self.shared();
        let owned = self.core.polled(record.topic(), record.partition());
        // A retired producer (the assignment lost, or fenced) writes nothing more: the next
        // incarnation copies this record again from the last commit.
        if !owned || shared.control.stop_requested() || self.core.lost.load(Ordering::SeqCst) {
            return;
        }
        Stats::add(&shared.stats.consumed, 1);
        Stats::add(&shared.stats.consumed_bytes, record.size() as u64);
        let mut handler = self.handler.borrow_mut();
        let Some(route) = route(self.settings, shared, record, handler.as_mut()) else {
            return;
        };
        if let Err(f) = self.core.begin() {
            self.core.failed(self.source.consumer(), f);
            return;
        }
        let (topic, partition, offset) = (record.topic(), record.partition(), record.offset());
        let opaque = || self.core.opaque(topic, partition, offset);
        let mut sent = true;
        for (i, (to, out)) in outgoing(self.settings, record, &route, opaque).enumerate() {
            if !self.send(to, out, record) {
                if i > 0 {
                    // Some of the record's outputs are in the transaction, not all: it must
                    // not commit (all or none).
                    self.core
                        .sent_log()
                        .failure
                        .get_or_insert(TxFailure::Abortable(format!(
                            "the stop came between the outputs of {topic}/{partition} offset \
                             {offset}"
                        )));
                }
                sent = false;
                break;
            }
        }
        if sent {
            self.core.copied(topic, partition, offset);
            if let (Some(throttle), true) = (shared.stats.throttle.get(), route.len() > 0) {
                // Paused from the next turn until the debt is paid.
                self.hold.charge(throttle, record.size() as u64, 1);
            }
        }
    }

    /// `--throttle.*.per.second`: while the debt holds the stream, its owned partitions are
    /// paused (those claimed during the hold too) and the loop keeps polling, so it stays in
    /// its group and its transactions commit on time; once paid, the partitions it paused
    /// and still owns are resumed. Partitions whose start is pending are never touched: the
    /// hand-over resumes them when they are claimed.
    fn throttle_turn(&self) {
        if self.shared().stats.throttle.get().is_none() {
            return;
        }
        let holding = self.hold.holds(Instant::now());
        if !holding && self.held.borrow().is_empty() {
            // Nothing paused (none owned when the hold began, or no hold): no list to make.
            self.hold.resumed(&self.shared().stats.throttled_micros);
            return;
        }
        let consumer = self.source.consumer();
        let owned: Vec<Partition> = self.core.state().parts.iter().map(|p| p.key()).collect();
        let mut held = self.held.borrow_mut();
        // A partition released during the hold is no longer this stream's to resume.
        held.retain(|p| owned.contains(p));
        let names = |list: &[Partition]| {
            let names: Vec<String> = list.iter().map(|(t, p)| format!("{t}/{p}")).collect();
            names.join(" ")
        };
        if holding {
            let new: Vec<Partition> = owned.into_iter().filter(|p| !held.contains(p)).collect();
            if new.is_empty() {
                return;
            }
            match consumer.pause(&partitions_of(&new)) {
                Ok(()) => held.extend(new),
                // Not held: the next turn tries again.
                Err(e) => tracing::warn!(
                    stream = self.stream,
                    "cannot pause {} for the throttle: {e}",
                    names(&new)
                ),
            }
            return;
        }
        self.hold.resumed(&self.shared().stats.throttled_micros);
        let paused = std::mem::take(&mut *held);
        if paused.is_empty() {
            return;
        }
        if let Err(e) = consumer.resume(&partitions_of(&paused)) {
            // Left paused, they would stall: stop (exit 1) with nothing lost, as when any
            // other consumer call fails.
            self.shared().control.fail(format!(
                "stream {}: cannot resume {} after the throttle's hold: {e}",
                self.stream,
                names(&paused)
            ));
        }
    }

    /// Hands one record to the producer, waiting out a full queue (the target acknowledges
    /// records of an open transaction as they come). A record it refuses stops the mirror.
    fn send(&self, to: Destination<'_>, mut out: Outgoing<'_>, record: &Record<'_>) -> bool {
        let topic = to.name();
        let shared = self.shared();
        let refuse = |why: String| {
            self.core
                .sent_log()
                .failure
                .get_or_insert(TxFailure::Fatal(format!(
                    "cannot mirror {}/{} offset {} to the target topic of {topic}: {why}. \
                     {STOPPING}",
                    record.topic(),
                    record.partition(),
                    record.offset()
                )));
            false
        };
        let Some(target) = self.targets.of_destination(to) else {
            return refuse("not a valid topic name".to_owned());
        };
        let started = Instant::now();
        loop {
            match produce(&self.core.producer, &target, &mut out) {
                Ok(()) => {
                    Stats::add(&shared.stats.produced, 1);
                    self.unknown_partitions.known(&target);
                    return true;
                }
                Err(RDKafkaErrorCode::QueueFull) if started.elapsed() < self.core.timeout => {
                    shared.turned(Instant::now());
                    self.core.producer.poll(Duration::from_millis(10));
                    if shared.control.stop_requested() {
                        return false;
                    }
                }
                Err(RDKafkaErrorCode::UnknownPartition) => {
                    // The producer's view of the target topic may predate partitions added
                    // since (the source topic grew, and its target with it when the new
                    // partitions were assigned): ask the target, per topic, until the
                    // producer's topic.metadata.propagation.max.ms has passed.
                    let client = self.core.producer.client();
                    match self
                        .unknown_partitions
                        .refused(client, self.stream, &target)
                    {
                        Next::Refresh | Next::Wait => {
                            shared.turned(Instant::now());
                            self.core.producer.poll(Duration::from_millis(50));
                            if shared.control.stop_requested() {
                                return false;
                            }
                        }
                        Next::GiveUp(after) => {
                            return refuse(format!(
                                "{} (still after refreshing the target's metadata for {after:?}; \
                                 the producer's topic.metadata.propagation.max.ms is {:?}): the \
                                 target topic lacks partition {}; add partitions to it, or use \
                                 --partitioning hash",
                                RDKafkaErrorCode::UnknownPartition,
                                self.unknown_partitions.limit(),
                                out.partition
                                    .map_or_else(|| "?".to_owned(), |p| p.to_string())
                            ))
                        }
                    }
                }
                Err(code) => return refuse(code.to_string()),
            }
        }
    }

    /// After a lost assignment: nothing is committed or released (the partitions are no
    /// longer this stream's), the consumer leaves, and the caller starts a new incarnation.
    /// The retired producer's errors (fenced, most often) are only logged as it goes.
    fn leave_lost(self) -> TransactionError {
        let stream = self.stream;
        self.core.closing.store(true, Ordering::SeqCst);
        drop(self.source);
        tracing::info!(stream, "left the group after losing the assignment");
        TransactionError::Lost { stream }
    }

    /// Commits the open transaction (or aborts it after a failure), commits the source
    /// group for monitoring, and leaves the group, releasing the partitions cleanly.
    fn shutdown(self) -> Result<StreamReport, TransactionError> {
        let started = Instant::now();
        let stream = self.stream;
        let failed = self.shared().control.failure().is_some();
        if failed {
            if self.core.state().open.is_some() && !self.core.state().broken {
                if let Err(e) = self.core.producer.abort_transaction(self.core.timeout) {
                    tracing::warn!(stream, "aborting the open transaction: {e}");
                }
                self.core.forget_transaction();
                self.core.state().rewind();
            }
        } else {
            self.core.commit_or_abort(self.source.consumer(), &[]);
        }
        if let Some(tpl) = self.core.monitoring_offsets(None) {
            if let Err(e) = self.source.consumer().commit(&tpl, CommitMode::Sync) {
                tracing::debug!(stream, "source group commit (monitoring only): {e}");
            }
        }
        self.gate.arrive();
        self.gate.wait(self.settings.options.shutdown_timeout);
        // What the polls below return is not mirrored: positions say nothing any more.
        for p in &mut self.core.state().parts {
            p.followable = false;
        }
        // Unsubscribing revokes the partitions: each is released in a transaction of its
        // own (after a failure too, at its last committed progress, if the producer still
        // works), so that the next owner has no one to fence.
        self.source.consumer().unsubscribe();
        let deadline = Instant::now() + LEAVE_TIMEOUT;
        while Instant::now() < deadline {
            let _ = self.source.poll(Duration::from_millis(20));
            let unassigned = self
                .source
                .consumer()
                .assignment()
                .is_ok_and(|a| a.count() == 0);
            if unassigned {
                break;
            }
        }
        self.core.closing.store(true, Ordering::SeqCst);
        drop(self.source);
        tracing::info!(stream, "stopped (exactly once) in {:?}", started.elapsed());
        Ok(StreamReport::default())
    }
}

/// `positions` as a partition list with offsets, to seek to or to commit.
fn partitions_of(parts: &[Partition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (topic, partition) in parts {
        tpl.add_partition(topic, *partition);
    }
    tpl
}

fn offset_list(positions: &[(Partition, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(positions.len());
    for ((topic, partition), next) in positions {
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
    }
    tpl
}

/// `positions` for a log line: `orders/0 at 1000 orders/1 at 980`.
fn described(positions: &[(Partition, i64)]) -> String {
    let list: Vec<String> = positions
        .iter()
        .map(|((t, p), n)| format!("{t}/{p} at {n}"))
        .collect();
    list.join(" ")
}
