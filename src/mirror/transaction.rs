//! Exactly-once mode (`--exactly.once true`): one stream's loop with a transactional producer
//! on the target.
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
//! previous owner named there that is not this stream is fenced, to the high watermark as it
//! was when the read began, so that no release committed before the assignment is missed),
//! has committed each `next` to the source group (synchronously: refused, the stream has lost
//! them meanwhile, see `Core::still_assigned`), has committed a claim (the same `next`, its
//! own id) and has moved them to their `next`.
//! Fencing a transactional id means initialising a producer with it: the target aborts the
//! transaction it left open and refuses its producer for good. The read is not made in the
//! rebalance callback: it may wait for a crashed owner's transaction on the store to end, and
//! a blocked callback holds the group's rebalance. On a clean revocation the open
//! transaction is committed with a release (progress with `txid` null): the next owner has no
//! one to fence. A partition whose progress names another id was not released cleanly (its
//! owner crashed, or was cut off from the group and may be a zombie): that owner is fenced,
//! and if it is still running, its next transactional call fails and it stops (exit 1)
//! without having committed anything after the fence. A stream whose assignment is lost
//! writes nothing more with its producer (it may be fenced already), leaves, and rejoins as a
//! new incarnation with a new transactional id. Transactional ids are unique per run
//! ([`ExactlyOnce::transactional_id`]), so a restarted instance is never fenced by whoever
//! fences its predecessor.
//!
//! Failures. A transaction the target aborts or refuses to commit (a record that timed out,
//! say, during a target outage longer than `transaction.timeout.ms`) is aborted and its
//! partitions are read again from their last committed progress. A fatal error (fenced, a
//! record refused for good) aborts what can be aborted and stops the mirror: nothing of the
//! open transaction becomes visible, and the next owner copies on from the store.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::Offset;

use super::clients::{self, Cluster, ReaderContext};
use super::commit::committed;
use super::delivery::{flush, purged};
use super::mapping::{OffsetMap, Progress, Recorder, StoreRecord};
use super::probe::topics_to_follow;
use super::rebalance::{call_listener, make_target_topics, seek_failures, source_statistics};
use super::state::{Control, ShutdownGate, Stats, StreamShared};
use super::stream::{route, same_partition, stamped, Route, StreamReport};
use super::target::TargetNames;
use super::topics::TopicCreator;
use crate::native::failpoint;
use crate::native::produce::{produce, Outgoing, RawHeaders};
use crate::native::queue::{Polled, Source};
use crate::native::record::Record;
use crate::plugin::{Handler, Listener};
use crate::settings::client::ClientProps;
use crate::settings::exactly_once::ExactlyOnce;
use crate::settings::{counted, Settings};

type Partition = (String, i32);
type TxProducer = BaseProducer<TxDelivery>;
type TxConsumer = BaseConsumer<TxContext>;

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
    /// The producer cannot go on (fenced, a record refused for good): stop.
    Fatal(String),
}

/// Where the records of the open transaction came from, for the delivery reports.
#[derive(Default)]
struct Book {
    /// Bumped whenever the transaction's records are forgotten (a new transaction, an
    /// abort): reports of older ones are stale.
    generation: u32,
    /// The source partitions seen, by slot.
    sources: Vec<Partition>,
    /// Per record produced in the open transaction: the slot of its source partition and
    /// its source offset. A record's opaque is its generation and its index here.
    sent: Vec<(u32, i64)>,
    /// Segments of source → target offsets, from the reports.
    recorder: Recorder,
    /// The first delivery failure of the open transaction.
    failure: Option<TxFailure>,
}

impl Book {
    fn forget_sent(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.sent.clear();
        self.failure = None;
    }

    fn slot(&mut self, topic: &str, partition: i32) -> u32 {
        let found = self
            .sources
            .iter()
            .rposition(|(t, p)| *p == partition && t == topic);
        let slot = found.unwrap_or_else(|| {
            self.sources.push((topic.to_owned(), partition));
            self.sources.len() - 1
        });
        u32::try_from(slot).unwrap_or(u32::MAX)
    }
}

/// The transactional producer's context: delivery reports feed the offset mapping.
pub struct TxDelivery {
    shared: Arc<StreamShared>,
    txid: String,
    book: Mutex<Book>,
    /// Set when the stream lost its assignment: this producer is done with, and its errors
    /// (fenced, most often) no longer stop the mirror.
    retired: AtomicBool,
}

impl TxDelivery {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `e` says that this producer's transactional id was fenced by a newer producer.
fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

/// What a fenced stream says as it stops.
fn fenced(txid: &str, e: &KafkaError, what: &str) -> String {
    format!(
        "the target fenced transactional id {txid} ({e}) when trying to {what}: another \
         instance took over this stream's partitions (this one was paused or cut off from the \
         group past session.timeout.ms, or, on the classic group protocol, the group gave them \
         away without revoking them: see the README, Exactly once); stopping. Nothing of the \
         open transaction is visible to read_committed readers, and the partitions' new owner \
         copies on from the offset-mapping topic"
    )
}

impl ClientContext for TxDelivery {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.retired.load(Ordering::SeqCst) {
            tracing::info!(
                stream = self.shared.stream,
                "transactional id {} (retired after the assignment was lost): {error}: {reason}",
                self.txid
            );
            return;
        }
        self.shared.target_error(&error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.shared.target_statistics(&statistics);
    }
}

impl ProducerContext for TxDelivery {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let mut book = self.book();
        if opaque == STORE_OPAQUE {
            if let Err((e, m)) = result {
                if !purged(e) && book.failure.is_none() {
                    book.failure = Some(TxFailure::Fatal(format!(
                        "cannot write the offset mapping to topic {} on the target: {e}; grant \
                         the mirror's principal WRITE on it. {STOPPING}",
                        m.topic()
                    )));
                }
            }
            return;
        }
        let (generation, index) = (opaque >> 32, opaque & 0xffff_ffff);
        if generation != book.generation as usize {
            return;
        }
        let Some(&(slot, offset)) = book.sent.get(index) else {
            return;
        };
        let Book {
            sources,
            recorder,
            failure,
            ..
        } = &mut *book;
        let (topic, partition) = &sources[slot as usize];
        match result {
            Ok(m) => {
                Stats::add(&self.shared.stats.acknowledged, 1);
                recorder.acked(
                    (topic, *partition),
                    offset,
                    (m.topic(), m.partition()),
                    m.offset(),
                );
            }
            Err((e, _)) if purged(e) => {}
            Err((e, m)) => {
                let code = e
                    .rdkafka_error_code()
                    .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"));
                self.shared.stats.recorded.count_send_error(code);
                if failure.is_some() {
                    return;
                }
                let what = format!(
                    "{topic}/{partition} offset {offset} to target topic {} partition {}: {e}",
                    m.topic(),
                    m.partition()
                );
                *failure = Some(if is_fenced(e) {
                    TxFailure::Fatal(fenced(
                        &self.txid,
                        e,
                        &format!("mirror {topic}/{partition} offset {offset}"),
                    ))
                } else if e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut) {
                    TxFailure::Abortable(format!(
                        "the target did not acknowledge {what} within message.timeout.ms \
                             (the transaction timeout)"
                    ))
                } else {
                    TxFailure::Fatal(format!("cannot mirror {what}. {STOPPING}"))
                });
            }
        }
    }
}

/// One owned source partition.
#[derive(Debug)]
struct Part {
    topic: String,
    partition: i32,
    /// The next source offset to copy, as of the open transaction.
    next: i64,
    /// The next source offset as of the last committed transaction (`None` for a partition
    /// just assigned, whose claim is still to be written).
    committed: Option<i64>,
    /// Whether the consumer's position may move `next` (past records a `read_committed`
    /// consumer never returns): only while every record polled from the partition since it
    /// was assigned or rewound went into a transaction. A record polled and not mirrored
    /// (stopping, a failed send) clears it until the next one mirrored.
    followable: bool,
}

impl Part {
    fn key(&self) -> Partition {
        (self.topic.clone(), self.partition)
    }

    fn is(&self, topic: &str, partition: i32) -> bool {
        self.partition == partition && self.topic == topic
    }

    fn dirty(&self) -> bool {
        self.committed != Some(self.next)
    }
}

/// The open transaction and the partitions it covers.
#[derive(Debug, Default)]
struct TxState {
    /// When the open transaction began.
    open: Option<Instant>,
    /// The owned partitions (few per stream: found by a scan, no allocation per record).
    parts: Vec<Part>,
    /// The index of the part last found.
    last: usize,
    /// The producer cannot be used any more (fenced, or a fatal error).
    broken: bool,
    /// Assigned partitions whose start could not be read yet (a crashed owner's open
    /// transaction on the store): paused until it is; and since when.
    pending: Vec<Partition>,
    pending_since: Option<Instant>,
    /// When the pending partitions' start was last tried.
    pending_tried: Option<Instant>,
}

impl TxState {
    fn find(&mut self, topic: &str, partition: i32) -> Option<&mut Part> {
        if !self
            .parts
            .get(self.last)
            .is_some_and(|p| p.is(topic, partition))
        {
            self.last = self.parts.iter().position(|p| p.is(topic, partition))?;
        }
        self.parts.get_mut(self.last)
    }

    fn remove(&mut self, topic: &str, partition: i32) {
        self.parts.retain(|p| !p.is(topic, partition));
        self.last = 0;
    }

    /// Back to the last commit: what the open transaction held is aborted.
    fn rewind(&mut self) {
        self.open = None;
        for p in &mut self.parts {
            if let Some(c) = p.committed {
                p.next = c;
            }
            p.followable = false;
        }
    }
}

/// What the stream's loop and its rebalance callback share.
pub struct Core {
    stream: usize,
    txid: String,
    shared: Arc<StreamShared>,
    producer: TxProducer,
    /// The target's connection, for store readers and fencing producers.
    target: ClientProps,
    store_topic: String,
    /// How long a transactional call (commit, abort, a fencing initialisation) may take.
    timeout: Duration,
    state: Mutex<TxState>,
    /// Set once the stream has left the group: what the close still serves does nothing.
    closing: AtomicBool,
    /// Set when the group took the assignment back without a revocation: the stream ends
    /// and rejoins as a new incarnation.
    lost: AtomicBool,
    listener: Option<Mutex<Listener>>,
    creator: Option<Arc<TopicCreator>>,
    topic_retry_limit: Duration,
    /// Where a partition with neither progress nor a committed offset starts: the earliest
    /// offset, or the end (`auto.offset.reset`).
    earliest: bool,
    /// A read of the store for pending partitions that ran out of patience, taken up again.
    reader: Mutex<Option<StoreReader>>,
}

impl Core {
    fn state(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.producer.context().book()
    }

    /// Begins a transaction unless one is open.
    fn begin(&self) -> Result<(), TxFailure> {
        let mut state = self.state();
        if state.open.is_some() {
            return Ok(());
        }
        self.producer
            .begin_transaction()
            .map_err(|e| self.classify("begin a transaction", &e))?;
        self.book().forget_sent();
        state.open = Some(Instant::now());
        Ok(())
    }

    /// The opaque of the next record produced from `topic/partition` at `offset`.
    fn opaque(&self, topic: &str, partition: i32, offset: i64) -> usize {
        let mut book = self.book();
        let slot = book.slot(topic, partition);
        book.sent.push((slot, offset));
        ((book.generation as usize) << 32) | (book.sent.len() - 1)
    }

    /// A record of `topic/partition` was polled: until it is copied, the position of its
    /// partition is past a record no transaction holds.
    /// Returns whether the stream copies that partition now (not: released, or its start
    /// still pending).
    fn polled(&self, topic: &str, partition: i32) -> bool {
        match self.state().find(topic, partition) {
            Some(p) => {
                p.followable = false;
                true
            }
            None => false,
        }
    }

    /// `topic/partition` was copied up to `offset` (included) in the open transaction.
    fn copied(&self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self.state().find(topic, partition) {
            p.next = offset + 1;
            p.followable = true;
        }
    }

    fn classify(&self, what: &str, e: &KafkaError) -> TxFailure {
        let (fatal, abortable) = match e {
            KafkaError::Transaction(r) => (r.is_fatal(), r.txn_requires_abort()),
            _ => (false, true),
        };
        if is_fenced(e) {
            TxFailure::Fatal(fenced(&self.txid, e, what))
        } else if fatal || !abortable {
            TxFailure::Fatal(format!(
                "transactional id {}: cannot {what}: {e}; stopping. Nothing of the open \
                 transaction is visible to read_committed readers; a restart copies on from the \
                 offset-mapping topic",
                self.txid
            ))
        } else {
            TxFailure::Abortable(format!("cannot {what}: {e}"))
        }
    }

    /// Whether the open transaction is due: older than the interval, or holding as many
    /// records as the stream may have in flight.
    fn due(&self, interval: Duration, max_records: usize) -> bool {
        let open = self.state().open;
        open.is_some_and(|began| {
            began.elapsed() >= interval || self.book().sent.len() >= max_records
        })
    }

    /// Commits the open transaction, with the store's records of every partition whose
    /// progress moved (and of those just assigned: their claim), and the release of
    /// `released` (progress with no transactional id). Begins one first if there is
    /// something to write and none is open.
    fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        released: &[Partition],
    ) -> Result<(), TxFailure> {
        if self.state().broken {
            return Err(TxFailure::Fatal(
                "the transactional producer failed earlier".to_owned(),
            ));
        }
        self.follow_positions(consumer);
        let pending = {
            let state = self.state();
            state.open.is_some() || !released.is_empty() || state.parts.iter().any(Part::dirty)
        };
        if !pending {
            return Ok(());
        }
        self.begin()?;
        let began = self.state().open;
        let records_sent = self.book().sent.len();
        let flushing = Instant::now();
        // Every record's delivery report first: the segments come from them.
        if let Err(e) = flush(&self.producer, self.timeout) {
            return Err(TxFailure::Abortable(format!(
                "the target did not acknowledge the transaction's records within {:?}: {e}",
                self.timeout
            )));
        }
        let (segments, failure) = {
            let mut book = self.book();
            (book.recorder.take_dirty(), book.failure.take())
        };
        if let Some(failure) = failure {
            return Err(failure);
        }
        let progress: Vec<Progress> = {
            let state = self.state();
            let releasing = |p: &Part| released.iter().any(|(t, n)| p.is(t, *n));
            state
                .parts
                .iter()
                .filter(|p| p.dirty() || releasing(p))
                .map(|p| Progress {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    next: p.next,
                    transactional_id: (!releasing(p)).then(|| self.txid.clone()),
                })
                .collect()
        };
        let records: Vec<StoreRecord> = segments
            .into_iter()
            .map(StoreRecord::Segment)
            .chain(progress.into_iter().map(StoreRecord::Progress))
            .collect();
        for record in &records {
            self.write_store(record)?;
        }
        // The store records acknowledged here, so that the commit's own flush (rust-rdkafka's,
        // in 100 ms steps) finds nothing to wait for.
        if let Err(e) = flush(&self.producer, self.timeout) {
            return Err(TxFailure::Abortable(format!(
                "the target did not acknowledge the offset-mapping records within {:?}: {e}",
                self.timeout
            )));
        }
        let committing = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            match self.producer.commit_transaction(self.timeout) {
                Ok(()) => break,
                Err(KafkaError::Transaction(e)) if e.is_retriable() && tries < COMMIT_TRIES => {
                    tracing::info!(
                        stream = self.stream,
                        "committing the transaction: {e}; trying again"
                    );
                }
                Err(e) => return Err(self.classify("commit the transaction", &e)),
            }
        }
        tracing::debug!(
            stream = self.stream,
            "committed a transaction of {records_sent} records and {} store records: open \
             {:?}, flush {:?}, commit {:?}",
            records.len(),
            began.map_or(Duration::ZERO, |b| flushing.duration_since(b)),
            committing.duration_since(flushing),
            committing.elapsed()
        );
        let mut state = self.state();
        state.open = None;
        for p in &mut state.parts {
            p.committed = Some(p.next);
        }
        Ok(())
    }

    /// Produces one store record into the open transaction.
    fn write_store(&self, record: &StoreRecord) -> Result<(), TxFailure> {
        let (key, value) = (record.key(), record.value());
        let mut pending = BaseRecord::with_opaque_to(&self.store_topic, STORE_OPAQUE)
            .key(&key)
            .payload(&value);
        let started = Instant::now();
        loop {
            match self.producer.send(pending) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if started.elapsed() < self.timeout =>
                {
                    pending = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    return Err(TxFailure::Abortable(format!(
                        "cannot queue an offset-mapping record for topic {}: {e}",
                        self.store_topic
                    )))
                }
            }
        }
    }

    /// Lets the progress of partitions follow the consumer's position past records a
    /// `read_committed` consumer never returns (transaction markers, aborted transactions):
    /// every record below the position was handed to the open transaction or an earlier one.
    /// Only for partitions polled since they were assigned or rewound.
    fn follow_positions<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) {
        let Ok(positions) = consumer.position() else {
            return;
        };
        let mut state = self.state();
        for e in positions.elements() {
            let Offset::Offset(position) = e.offset() else {
                continue;
            };
            if let Some(p) = state.find(e.topic(), e.partition()) {
                if p.followable {
                    p.next = p.next.max(position);
                }
            }
        }
    }

    /// Forgets what the aborted transaction held: its records and the segments built from
    /// their delivery reports (a later commit must not map source offsets to aborted target
    /// records).
    fn forget_transaction(&self) {
        let mut book = self.book();
        book.forget_sent();
        book.recorder = Recorder::transactional();
    }

    /// Aborts the open transaction and reads every owned partition again from its last
    /// committed progress.
    fn abort_and_rewind<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        why: &str,
    ) -> Result<(), TxFailure> {
        tracing::warn!(
            stream = self.stream,
            "{why}; aborting the transaction and copying its partitions again from the last \
             commit (nothing of it is visible to read_committed readers)"
        );
        let open = self.state().open.is_some();
        if open {
            if let Err(e) = self.producer.abort_transaction(self.timeout) {
                let failure = self.classify("abort the transaction", &e);
                self.state().broken = true;
                return Err(failure);
            }
        }
        self.forget_transaction();
        let committed: Vec<(Partition, i64)> = {
            let mut state = self.state();
            state.rewind();
            // A partition whose claim never committed has nothing to go back to: it is
            // claimed again from where it was assigned.
            state.parts.iter().map(|p| (p.key(), p.next)).collect()
        };
        if committed.is_empty() {
            return Ok(());
        }
        let tpl = offset_list(&committed);
        let failed = seek_failures(consumer, tpl, self.timeout);
        if !failed.is_empty() {
            self.state().broken = true;
            return Err(TxFailure::Fatal(format!(
                "cannot read {} again from the last commit after an aborted transaction; \
                 stopping rather than going on past what was aborted",
                failed.join(", ")
            )));
        }
        Ok(())
    }

    /// Commits, or on an abortable failure aborts and rewinds; a fatal failure stops the
    /// mirror. Returns whether the transaction committed.
    fn commit_or_abort<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        released: &[Partition],
    ) -> bool {
        let failure = match self.commit(consumer, released) {
            Ok(()) => return true,
            Err(f) => f,
        };
        let failure = match failure {
            TxFailure::Abortable(why) => match self.abort_and_rewind(consumer, &why) {
                Ok(()) => return false,
                Err(f) => f,
            },
            fatal => {
                if self.state().open.is_some() {
                    // Fenced producers cannot abort; the coordinator has aborted for them.
                    let _ = self.producer.abort_transaction(self.timeout);
                }
                fatal
            }
        };
        let (TxFailure::Abortable(m) | TxFailure::Fatal(m)) = failure;
        self.state().broken = true;
        self.shared
            .control
            .fail(format!("stream {}: {m}", self.stream));
        false
    }

    /// The source group's offsets, for monitoring: each owned partition's committed progress.
    fn monitoring_offsets(&self, only: Option<&[Partition]>) -> Option<TopicPartitionList> {
        let state = self.state();
        let mut tpl = TopicPartitionList::new();
        for p in &state.parts {
            let Some(committed) = p.committed else {
                continue;
            };
            if only.is_some_and(|o| !o.iter().any(|(t, n)| p.is(t, *n))) {
                continue;
            }
            let _ = tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(committed));
        }
        (tpl.count() > 0).then_some(tpl)
    }

    /// Where each of `partitions` starts: its progress in the store, after fencing every
    /// previous owner named there that is not this stream; the source group's committed
    /// offset where the store has none; else `auto.offset.reset`.
    fn starts(
        &self,
        consumer: &TxConsumer,
        partitions: &[Partition],
        patience: Duration,
    ) -> Result<Vec<(Partition, i64)>, ReadError> {
        // First what is readable now (a crashed owner's open transaction may hold the
        // store's last stable offset back until it is fenced), then, once the owners found
        // there are fenced, everything up to the high watermark; owners found only there are
        // fenced in turn, and the store read again.
        // A read that ran out of patience is taken up again where it stopped: a store that
        // takes longer than one try to read whole is still read.
        let kept = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut reader = match kept {
            Some(r) => r,
            None => StoreReader::open(&self.target, &self.store_topic, patience)?,
        };
        let result = self.fence_and_read(&mut reader, partitions, patience);
        if let Err(ReadError::NotYet(_)) = result {
            *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader);
        }
        let map = result?;
        let mut starts = Vec::with_capacity(partitions.len());
        let mut missing = TopicPartitionList::new();
        for (topic, partition) in partitions {
            match map.progress(topic, *partition) {
                Some(p) => starts.push(((topic.clone(), *partition), p.next)),
                None => {
                    missing.add_partition(topic, *partition);
                }
            }
        }
        if missing.count() == 0 {
            return Ok(starts);
        }
        let committed = consumer
            .committed_offsets(missing.clone(), self.timeout)
            .map_err(|e| {
                ReadError::NotYet(format!(
                    "cannot read the source group's committed offsets: {e}"
                ))
            })?;
        let earliest = self.earliest;
        for e in missing.elements() {
            let key = (e.topic().to_owned(), e.partition());
            let from_group =
                committed
                    .find_partition(e.topic(), e.partition())
                    .and_then(|c| match c.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
            let start = match from_group {
                Some(o) => o,
                None => {
                    let (low, high) = consumer
                        .fetch_watermarks(e.topic(), e.partition(), self.timeout)
                        .map_err(|err| {
                            ReadError::NotYet(format!(
                                "cannot read the source watermarks of {}/{}: {err}",
                                e.topic(),
                                e.partition()
                            ))
                        })?;
                    if earliest {
                        low
                    } else {
                        high
                    }
                }
            };
            starts.push((key, start));
        }
        Ok(starts)
    }

    /// Reads the store on (to its stable end, then, once every owner of `partitions` named
    /// there is fenced, to its high watermark, again until no new owner appears) and returns
    /// what it holds.
    fn fence_and_read(
        &self,
        reader: &mut StoreReader,
        partitions: &[Partition],
        patience: Duration,
    ) -> Result<OffsetMap, ReadError> {
        reader.read_to_stable_end(patience)?;
        let mut fenced: Vec<String> = Vec::new();
        let mut complete = false;
        loop {
            let mut owners: Vec<String> = partitions
                .iter()
                .filter_map(|(t, p)| reader.map.progress(t, *p))
                .filter_map(|p| p.transactional_id.clone())
                .filter(|id| *id != self.txid && !fenced.contains(id))
                .collect();
            owners.sort();
            owners.dedup();
            if owners.is_empty() && complete {
                break;
            }
            for owner in owners {
                self.fence(&owner).map_err(ReadError::Failed)?;
                fenced.push(owner);
            }
            reader.read_to_high_watermark(patience)?;
            complete = true;
        }
        Ok(std::mem::take(&mut reader.map))
    }

    /// Fences transactional id `owner`: a producer initialised with it aborts the
    /// transaction `owner` left open (if any) and makes its producer unusable.
    fn fence(&self, owner: &str) -> Result<(), String> {
        let started = Instant::now();
        let producer: BaseProducer<FencingContext> = self
            .target
            .connection_config()
            .set("transactional.id", owner)
            .create_with_context(FencingContext)
            .map_err(|e| {
                format!("cannot make a producer to fence transactional id {owner}: {e}")
            })?;
        producer.init_transactions(self.timeout).map_err(|e| {
            format!(
                "cannot fence transactional id {owner}, the previous owner of some of the \
                 assigned partitions: {e}; stopping rather than copying beside it"
            )
        })?;
        tracing::info!(
            stream = self.stream,
            "fenced transactional id {owner} (the last committer of some assigned partitions; \
             its open transaction, if any, is aborted) in {:?}",
            started.elapsed()
        );
        Ok(())
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let partitions = partition_list(tpl);
        if partitions.is_empty() {
            return;
        }
        let list: Vec<String> = partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect();
        tracing::info!(
            stream = self.stream,
            "assigned {}: {}",
            counted(list.len(), "partition"),
            list.join(" ")
        );
        if self.shared.control.stop_requested() || self.state().broken {
            return;
        }
        if let Some(creator) = &self.creator {
            make_target_topics(creator, &partitions, &self.shared, self.topic_retry_limit);
        }
        // Their start is read from the store by the stream's loop, not here: the read may
        // wait for transactions on the store to end, and a rebalance callback that blocks
        // holds the whole group's rebalance (and, past the session timeout, loses the
        // assignment). Until then they stay paused.
        let mut state = self.state();
        state.pending.extend(partitions);
        state.pending_since.get_or_insert_with(Instant::now);
    }

    /// Makes sure this stream still owns `starts` before it claims them: a stream paused (or
    /// cut off) since they were assigned may have lost them to an owner that read the store
    /// before this claim lands. The claim would then be the store's latest progress of those
    /// partitions, behind the new owner's, and it would name this stream instead of the new
    /// owner: once the store is compacted, whoever reads it next would copy again from there
    /// and leave the new owner unfenced. The source group's coordinator refuses a commit
    /// from a member that is no longer in the group's current generation (classic) or epoch
    /// (KIP-848), as after a pause past the session timeout, so each start is committed
    /// there first, synchronously (for monitoring it is what the store says); refused, the
    /// partitions stay paused and unclaimed until the rebalance that took them is served, or
    /// the commit goes through. The coordinator checks membership, not which member owns
    /// which partition: a live member whose partitions the assignor gave away without a
    /// revocation (the classic protocol's case in the README) is not caught here; the next
    /// owner fences it.
    fn still_assigned(
        &self,
        consumer: &TxConsumer,
        starts: &[(Partition, i64)],
    ) -> Result<(), ReadError> {
        let tpl = offset_list(starts);
        consumer.commit(&tpl, CommitMode::Sync).map_err(|e| {
            ReadError::NotYet(format!(
                "the source group refused a commit of their start, {} ({e}): if this member \
                 has left the group's generation (or epoch), the revocation of its partitions \
                 follows; otherwise the commit is tried again",
                described(starts)
            ))
        })
    }

    /// Starts copying `starts` (each partition at its offset): claims them, in a transaction,
    /// before anything of them is copied, so that a later owner fences this stream if it
    /// does not release them cleanly.
    fn start<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, starts: &[(Partition, i64)]) {
        {
            let mut state = self.state();
            for ((topic, partition), next) in starts {
                state.remove(topic, *partition);
                state
                    .pending
                    .retain(|(t, p)| !(t == topic && p == partition));
                state.parts.push(Part {
                    topic: topic.clone(),
                    partition: *partition,
                    next: *next,
                    committed: None,
                    followable: false,
                });
            }
            if state.pending.is_empty() {
                state.pending_since = None;
            }
        }
        let claimed = self.commit_or_abort(consumer, &[])
            || self.shared.control.stop_requested()
            || self.commit_or_abort(consumer, &[]);
        if !claimed {
            self.shared.control.fail(format!(
                "stream {}: cannot claim the assigned partitions in the offset-mapping topic \
                 {}; stopping",
                self.stream, self.store_topic
            ));
        }
        tracing::info!(
            stream = self.stream,
            "starting from the offset mapping's progress: {}",
            described(starts)
        );
    }

    /// Tries again to start the partitions whose start could not be read when they were
    /// assigned: on success they are claimed, moved to their start and resumed. Gives up
    /// (stopping the mirror) after twice the transaction timeout, by which the target has
    /// aborted any transaction a crashed owner left open.
    fn start_pending(&self, consumer: &TxConsumer) {
        let (partitions, since) = {
            let mut state = self.state();
            let due = state
                .pending_tried
                .is_none_or(|t| t.elapsed() >= PENDING_RETRY);
            if state.pending.is_empty() || !due || state.broken {
                return;
            }
            state.pending_tried = Some(Instant::now());
            (state.pending.clone(), state.pending_since)
        };
        let read = self
            .starts(consumer, &partitions, READ_PATIENCE)
            .and_then(|starts| {
                failpoint::reached(failpoint::BEFORE_CLAIM);
                self.still_assigned(consumer, &starts)?;
                Ok(starts)
            });
        let starts = match read {
            Ok(s) => s,
            Err(ReadError::NotYet(why)) if since.is_none_or(|t| t.elapsed() < self.timeout * 2) => {
                tracing::info!(
                    stream = self.stream,
                    "{} cannot be started yet ({why}); they stay paused, and the stream \
                     tries again while it serves the group",
                    counted(partitions.len(), "assigned partition")
                );
                return;
            }
            Err(ReadError::NotYet(e) | ReadError::Failed(e)) => {
                self.shared
                    .control
                    .fail(format!("stream {}: {e}", self.stream));
                return;
            }
        };
        self.start(consumer, &starts);
        let tpl = offset_list(&starts);
        let moved = consumer
            .seek_partitions(tpl.clone(), self.timeout)
            .map_err(|e| e.to_string())
            .and_then(
                |r| match r.elements().iter().find_map(|e| e.error().err()) {
                    Some(e) => Err(e.to_string()),
                    None => Ok(()),
                },
            )
            .and_then(|()| consumer.resume(&tpl).map_err(|e| e.to_string()));
        if let Err(e) = moved {
            self.state().broken = true;
            self.shared.control.fail(format!(
                "stream {}: cannot move the assigned partitions to their start: {e}; stopping",
                self.stream
            ));
        }
    }

    fn revoke(&self, consumer: &TxConsumer, partitions: &[Partition]) {
        if partitions.is_empty() {
            return;
        }
        let stream = self.stream;
        let closing = self.closing.load(Ordering::SeqCst);
        if !closing && !self.state().broken {
            if consumer.assignment_lost() {
                // The group gave the partitions away without this member (its session timed
                // out: paused, cut off, or too slow): their next owner fences this stream's
                // transactional id, so this producer may be unusable already. Nothing more is
                // written with it: the stream aborts, leaves, and rejoins as a new
                // incarnation with a transactional id of its own, which reads the store and
                // fences whoever it names, this id included, like any new owner.
                self.producer
                    .context()
                    .retired
                    .store(true, Ordering::SeqCst);
                if self.state().open.is_some() {
                    let _ = self.producer.abort_transaction(self.timeout);
                }
                self.state().broken = true;
                self.lost.store(true, Ordering::SeqCst);
                tracing::warn!(
                    stream,
                    "the group took back {} from this stream (assignment lost: its session \
                     timed out, e.g. the process was paused or cut off from the source \
                     cluster); the open transaction of transactional id {} is aborted, and the \
                     stream rejoins the group under a new transactional id",
                    counted(partitions.len(), "partition"),
                    self.txid
                );
            } else if self.commit_or_abort(consumer, partitions) {
                tracing::info!(
                    stream,
                    "released {} after committing the open transaction",
                    counted(partitions.len(), "partition")
                );
                if let Some(tpl) = self.monitoring_offsets(Some(partitions)) {
                    if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                        tracing::debug!(stream, "source group commit (monitoring only): {e}");
                    }
                }
            } else if !self.state().broken {
                // Aborted: release at the last committed progress, in a transaction of its own.
                if !self.commit_or_abort(consumer, partitions) {
                    tracing::warn!(
                        stream,
                        "cannot release {} cleanly: their next owner fences this stream's \
                         transactional id {}",
                        counted(partitions.len(), "partition"),
                        self.txid
                    );
                }
            }
        }
        let mut state = self.state();
        let mut book = self.book();
        for (topic, partition) in partitions {
            state.remove(topic, *partition);
            state
                .pending
                .retain(|(t, p)| !(t == topic && p == partition));
            book.recorder.forget(topic, *partition);
        }
        if state.pending.is_empty() {
            state.pending_since = None;
        }
    }

    fn call_listener(&self, what: &str, call: impl FnOnce(&mut Listener) -> Result<(), String>) {
        call_listener(&self.listener, &self.shared, what, call);
    }
}

fn partition_list(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// The context of a producer made only to fence a transactional id.
struct FencingContext;

impl ClientContext for FencingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }
}

impl ProducerContext for FencingContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// A reader of the whole store topic, committed records only, from its beginning.
struct StoreReader {
    topic: String,
    /// A read_uncommitted client: its watermarks are the high watermarks, not the stable
    /// ones.
    watermarks: BaseConsumer<ReaderContext>,
    consumer: BaseConsumer<ReaderContext>,
    partitions: Vec<i32>,
    map: OffsetMap,
}

impl StoreReader {
    fn open(
        target: &ClientProps,
        topic: &str,
        timeout: Duration,
    ) -> Result<StoreReader, ReadError> {
        let client = |isolation: &str| {
            target
                .connection_config()
                .set("group.id", "mirror-maker-offset-mapping-reader")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                .set("isolation.level", isolation)
                .set("allow.auto.create.topics", "false")
                .create_with_context::<_, BaseConsumer<ReaderContext>>(ReaderContext)
                .map_err(|e| {
                    ReadError::Failed(format!(
                        "cannot make a reader of the offset-mapping topic {topic}: {e}"
                    ))
                })
        };
        let mut reader = StoreReader {
            topic: topic.to_owned(),
            watermarks: client("read_uncommitted")?,
            consumer: client("read_committed")?,
            partitions: Vec::new(),
            map: OffsetMap::default(),
        };
        let metadata = reader
            .watermarks
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| reader.not_yet(e.to_string()))?;
        reader.partitions = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for p in &reader.partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .map_err(|e| reader.not_yet(e.to_string()))?;
        }
        reader
            .consumer
            .assign(&tpl)
            .map_err(|e| reader.not_yet(e.to_string()))?;
        Ok(reader)
    }

    fn not_yet(&self, why: String) -> ReadError {
        ReadError::NotYet(format!(
            "cannot read the offset-mapping topic {}: {why}",
            self.topic
        ))
    }

    /// Reads on up to what is readable now: each partition's last stable offset (the first
    /// record of the oldest open transaction on it) as it is now.
    fn read_to_stable_end(&mut self, patience: Duration) -> Result<(), ReadError> {
        // A read_committed client's watermarks are the last stable offsets (librdkafka asks
        // with its isolation level). Not the end-of-partition events: under a writer that
        // commits every 100 ms, a fetch rarely comes back empty, and they rarely come.
        let ends = self.ends(&self.consumer, patience)?;
        self.read_to(&ends, patience, "its last stable offset")
    }

    /// Reads on up to each partition's high watermark as it is now: this waits for every
    /// transaction begun before now to end, so that a progress committed just before this
    /// stream was assigned its partition (the previous owner's release) is never missed
    /// behind another stream's open transaction.
    fn read_to_high_watermark(&mut self, patience: Duration) -> Result<(), ReadError> {
        let ends = self.ends(&self.watermarks, patience)?;
        self.read_to(
            &ends,
            patience,
            "its high watermark (a transaction on it is still open: \
             a crashed instance's, aborted when its partitions' next owner fences it, or by the \
             target after its transaction.timeout.ms)",
        )
    }

    /// Each partition's end offset as `client` sees it (by its isolation level).
    fn ends(
        &self,
        client: &BaseConsumer<ReaderContext>,
        patience: Duration,
    ) -> Result<Vec<(i32, i64)>, ReadError> {
        let mut ends = Vec::with_capacity(self.partitions.len());
        for p in &self.partitions {
            let (_, end) = client
                .fetch_watermarks(&self.topic, *p, patience)
                .map_err(|e| self.not_yet(e.to_string()))?;
            ends.push((*p, end));
        }
        Ok(ends)
    }

    /// Polls until the reader's position in each partition reaches its end in `ends`
    /// (librdkafka moves the position past transaction markers and aborted records).
    fn read_to(
        &mut self,
        ends: &[(i32, i64)],
        patience: Duration,
        what: &str,
    ) -> Result<(), ReadError> {
        let deadline = Instant::now() + patience;
        loop {
            let positions = self
                .consumer
                .position()
                .map_err(|e| self.not_yet(e.to_string()))?;
            let done = ends.iter().all(|(p, end)| {
                *end <= 0
                    || positions
                        .find_partition(&self.topic, *p)
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
            });
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.not_yet(format!("not read up to {what} within {patience:?}")));
            }
            self.poll()?;
        }
    }

    /// One poll: a record is applied to the map.
    fn poll(&mut self) -> Result<(), ReadError> {
        match self.consumer.poll(Duration::from_millis(100)) {
            None => Ok(()),
            Some(Ok(m)) => {
                let Some(key) = m.key() else { return Ok(()) };
                let record = StoreRecord::decode(key, m.payload())
                    .map_err(|e| ReadError::Failed(format!("topic {}: {e}", self.topic)))?;
                if let Some(record) = record {
                    self.map.apply(record);
                }
                Ok(())
            }
            Some(Err(KafkaError::PartitionEOF(_))) => Ok(()),
            Some(Err(e)) => Err(self.not_yet(e.to_string())),
        }
    }
}

/// Why the store could not be read.
#[derive(Debug)]
enum ReadError {
    /// Not now (a transaction on it still open, a time-out): try again.
    NotYet(String),
    /// For good.
    Failed(String),
}

/// The consumer's context: rebalances run the transactional hand-over.
pub struct TxContext {
    core: Arc<Core>,
}

impl ClientContext for TxContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Source, level, fac, message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        source_statistics(&self.core.shared, &statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let shared = &self.core.shared;
        clients::client_error(
            &shared.control,
            Cluster::Source,
            shared.stream,
            &error,
            reason,
        );
    }
}

impl ConsumerContext for TxContext {
    /// Revocations commit (releasing the partitions) before the partitions go; assignments
    /// fence, read the store and start each partition at its progress.
    fn rebalance(&self, consumer: &TxConsumer, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let core = &self.core;
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                core.assign(tpl);
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                let pending = core.state().pending.clone();
                if !pending.is_empty() {
                    let mut paused = TopicPartitionList::new();
                    for (topic, partition) in &pending {
                        paused.add_partition(topic, *partition);
                    }
                    if let Err(e) = consumer.pause(&paused) {
                        core.state().broken = true;
                        core.shared.control.fail(format!(
                            "stream {}: cannot pause the partitions whose start is pending: \
                             {e}; stopping",
                            core.stream
                        ));
                    }
                }
                let partitions = partition_list(tpl);
                if !partitions.is_empty() {
                    let id = crate::native::member_id(consumer);
                    core.call_listener("before_starting_fetchers", |l| {
                        l.before_starting_fetchers(&id, &partitions)
                    });
                }
                core.shared.assigned.store(true, Ordering::SeqCst);
                result
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let partitions = partition_list(tpl);
                core.revoke(consumer, &partitions);
                if !partitions.is_empty() {
                    core.call_listener("before_releasing_partitions", |l| {
                        l.before_releasing_partitions(&partitions)
                    });
                }
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(
                    stream = core.stream,
                    "rebalance error: {}",
                    KafkaError::Rebalance(other.into())
                );
                if cooperative {
                    Ok(())
                } else {
                    consumer.unassign()
                }
            }
        };
        Stats::add(&core.shared.stats.rebalances, 1);
        if let Err(e) = result {
            tracing::warn!(stream = core.stream, "applying the rebalance: {e}");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        committed(&self.core.shared, &result, offsets.count());
    }
}

/// One exactly-once stream.
pub struct TxStream<'s> {
    stream: usize,
    settings: &'s Settings,
    exactly_once: &'s ExactlyOnce,
    core: Arc<Core>,
    source: Source<TxContext>,
    handler: RefCell<Option<Handler>>,
    targets: TargetNames,
    subscribed: Vec<String>,
    gate: Arc<ShutdownGate>,
}

impl<'s> TxStream<'s> {
    pub fn new(
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
                book: Mutex::new(Book {
                    // Its own transaction markers continue a segment (as target gaps).
                    recorder: Recorder::transactional(),
                    ..Book::default()
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
        let core = Arc::new(Core {
            stream,
            txid,
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
            .create_with_context(TxContext { core: core.clone() })
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
            subscribed: Vec::new(),
            gate,
        })
    }

    fn shared(&self) -> &StreamShared {
        &self.core.shared
    }

    /// Runs until a stop is requested or a fatal error occurs, then commits (or aborts) and
    /// leaves the group; or, once the assignment is lost, leaves without committing and returns
    /// [`TransactionError::Lost`].
    pub fn run(mut self, initial_topics: Vec<String>) -> Result<StreamReport, TransactionError> {
        if let Err(e) = self.subscribe(initial_topics) {
            self.gate.arrive();
            return Err(e);
        }
        let interval = self.exactly_once.transaction_interval;
        let max_records = self.settings.max_in_flight_records;
        let mut next_group_commit = Instant::now() + self.settings.commit_interval;
        let mut next_refresh = Instant::now() + self.settings.topic_refresh_interval;
        while !self.shared().control.stop_requested() {
            if self.core.lost.load(Ordering::SeqCst) {
                return Err(self.leave_lost());
            }
            self.core.producer.poll(Duration::ZERO);
            let failure = self.core.book().failure.take();
            match failure {
                Some(TxFailure::Abortable(why)) => {
                    if let Err(TxFailure::Abortable(m) | TxFailure::Fatal(m)) =
                        self.core.abort_and_rewind(self.source.consumer(), &why)
                    {
                        self.shared()
                            .control
                            .fail(format!("stream {}: {m}", self.stream));
                    }
                }
                Some(TxFailure::Fatal(why)) => {
                    self.shared()
                        .control
                        .fail(format!("stream {}: {why}", self.stream));
                    break;
                }
                None => {}
            }
            self.core.start_pending(self.source.consumer());
            if self.core.due(interval, max_records) {
                self.core.commit_or_abort(self.source.consumer(), &[]);
            }
            let wait = self.core.state().open.map_or(POLL_INTERVAL, |began| {
                interval.saturating_sub(began.elapsed()).min(POLL_INTERVAL)
            });
            match self.source.poll(wait) {
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
                next_group_commit = now + self.settings.commit_interval;
            }
            if now >= next_refresh {
                self.refresh_topics();
                next_refresh = Instant::now() + self.settings.topic_refresh_interval;
            }
        }
        if self.core.lost.load(Ordering::SeqCst) {
            return Err(self.leave_lost());
        }
        self.shutdown()
    }

    fn subscribe(&mut self, topics: Vec<String>) -> Result<(), TransactionError> {
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
                .map_err(|e| TransactionError::Stream {
                    stream: self.stream,
                    message: format!("cannot subscribe to {topics:?}: {e}"),
                })?;
            tracing::info!(
                stream = self.stream,
                "subscribed to {} (exactly once): {}",
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

    /// Mirrors one consumed record into the open transaction: every record the handler
    /// makes of it, or none, and then its partition's progress passes it.
    fn mirror(&self, record: &Record<'_>) {
        let shared = self.shared();
        let owned = self.core.polled(record.topic(), record.partition());
        if !owned || shared.control.stop_requested() {
            return;
        }
        Stats::add(&shared.stats.consumed, 1);
        Stats::add(&shared.stats.consumed_bytes, record.size() as u64);
        let mut handler = self.handler.borrow_mut();
        let Some(route) = route(self.settings, shared, record, handler.as_mut()) else {
            return;
        };
        if let Err(TxFailure::Abortable(m) | TxFailure::Fatal(m)) = self.core.begin() {
            self.core.state().broken = true;
            shared.control.fail(format!("stream {}: {m}", self.stream));
            return;
        }
        let (topic, partition, offset) = (record.topic(), record.partition(), record.offset());
        let sent = match route {
            Route::Skip => true,
            Route::AsItIs => self.send(
                topic,
                Outgoing {
                    partition: same_partition(self.settings, record),
                    key: record.key(),
                    value: record.payload(),
                    timestamp: record.timestamp(),
                    headers: stamped(self.settings, record.copy_headers()),
                    opaque: self.core.opaque(topic, partition, offset),
                },
                record,
            ),
            Route::Handled(outputs) => {
                let mut all = true;
                for (i, out) in outputs.iter().enumerate() {
                    let mut headers = RawHeaders::none();
                    for (key, value) in &out.headers {
                        headers.add(key, value.as_deref());
                    }
                    let sent = self.send(
                        &out.topic,
                        Outgoing {
                            partition: out.partition.or(same_partition(self.settings, record)),
                            key: out.key.as_deref(),
                            value: out.value.as_deref(),
                            timestamp: out.timestamp,
                            headers: stamped(self.settings, headers),
                            opaque: self.core.opaque(topic, partition, offset),
                        },
                        record,
                    );
                    if !sent {
                        if i > 0 {
                            // Some of the record's outputs are in the transaction, not all:
                            // it must not commit (all or none).
                            self.core
                                .book()
                                .failure
                                .get_or_insert(TxFailure::Abortable(format!(
                                    "the stop came between the outputs of {topic}/{partition} \
                                     offset {offset}"
                                )));
                        }
                        all = false;
                        break;
                    }
                }
                all
            }
        };
        if sent {
            self.core.copied(topic, partition, offset);
        }
    }

    /// Hands one record to the producer, waiting out a full queue (the target acknowledges
    /// records of an open transaction as they come). A record it refuses stops the mirror.
    fn send(&self, topic: &str, mut out: Outgoing<'_>, record: &Record<'_>) -> bool {
        let shared = self.shared();
        let refuse = |why: String| {
            self.core
                .book()
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
        let Some(target) = self.targets.of(topic) else {
            return refuse("not a valid topic name".to_owned());
        };
        let started = Instant::now();
        loop {
            match produce(&self.core.producer, &target, &mut out) {
                Ok(()) => {
                    Stats::add(&shared.stats.produced, 1);
                    return true;
                }
                Err(RDKafkaErrorCode::QueueFull) if started.elapsed() < self.core.timeout => {
                    shared.turned(Instant::now());
                    self.core.producer.poll(Duration::from_millis(10));
                    if shared.control.stop_requested() {
                        return false;
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
        self.gate.wait(self.settings.shutdown_timeout);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, partition: i32, next: i64, committed: Option<i64>) -> Part {
        Part {
            topic: topic.to_owned(),
            partition,
            next,
            committed,
            followable: true,
        }
    }

    #[test]
    fn an_abort_rewinds_each_partition_to_its_last_committed_progress() {
        let mut state = TxState {
            open: Some(Instant::now()),
            parts: vec![
                part("orders", 0, 150, Some(100)),
                // Just assigned: its claim is not committed yet; it keeps its start.
                part("orders", 1, 40, None),
            ],
            ..TxState::default()
        };
        assert!(state.parts.iter().all(Part::dirty));
        state.rewind();
        assert!(state.open.is_none());
        let found = |s: &mut TxState, p: i32| {
            let part = s.find("orders", p).expect("owned");
            (part.next, part.followable, part.dirty())
        };
        // Copied again from 100: the aborted copies of 100..150 are never visible.
        assert_eq!(found(&mut state, 0), (100, false, false));
        // Still to be claimed: the next commit writes its progress.
        assert_eq!(found(&mut state, 1), (40, false, true));
    }

    #[test]
    fn a_released_partition_is_no_longer_found() {
        let mut state = TxState {
            parts: vec![
                part("orders", 0, 10, Some(10)),
                part("orders", 1, 20, Some(20)),
                part("payments", 0, 30, Some(30)),
            ],
            ..TxState::default()
        };
        assert_eq!(state.find("payments", 0).map(|p| p.next), Some(30));
        state.remove("payments", 0);
        assert!(state.find("payments", 0).is_none());
        assert_eq!(state.find("orders", 1).map(|p| p.next), Some(20));
        assert!(state.find("orders", 2).is_none());
    }

    #[test]
    fn reports_of_a_forgotten_transaction_are_told_apart_by_generation() {
        let mut book = Book::default();
        let a = book.slot("orders", 0);
        let b = book.slot("orders", 1);
        assert_ne!(a, b);
        // A partition keeps its slot: no allocation per record.
        assert_eq!(book.slot("orders", 0), a);
        assert_eq!(book.sources.len(), 2);
        book.sent.push((a, 7));
        book.failure = Some(TxFailure::Abortable("a record timed out".into()));
        let before = book.generation;
        book.forget_sent();
        assert_ne!(book.generation, before);
        assert!(book.sent.is_empty() && book.failure.is_none());
        // The slots outlive transactions.
        assert_eq!(book.slot("orders", 1), b);
    }

    #[test]
    fn fencing_errors_are_recognised_and_named() {
        for code in [
            RDKafkaErrorCode::Fenced,
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
        ] {
            let e = KafkaError::MessageProduction(code);
            assert!(is_fenced(&e), "{code:?}");
            let said = fenced("mirror-a-1-0", &e, "commit the transaction");
            assert!(
                said.contains("transactional id mirror-a-1-0") && said.contains("stopping"),
                "{said}"
            );
        }
        assert!(!is_fenced(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut
        )));
    }
}
