//! The transaction lifecycle: begin, produce into it, commit with the partitions' progress in
//! the store, or abort and rewind to the last commit; and the source group's monitoring offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use crate::mirror::flush::{flush, send_waiting};
use crate::mirror::mapping::{Progress, Recorder, StoreRecord};
use crate::mirror::source::seek_failures;
use crate::mirror::state::StreamShared;
use crate::mirror::topics::TopicCreator;
use crate::native::failpoint;
use crate::plugin::Listener;
use crate::settings::client::ClientProps;

use super::delivery::{fenced, is_fenced, SentLog};
use super::state::{OwnedPartition, TxState};
use super::store_reader::StoreReader;
use super::{offset_list, TxFailure, TxProducer, COMMIT_TRIES, STORE_OPAQUE};
use crate::mirror::Partition;

/// A transaction whose records and store records the target has acknowledged, still open:
/// what [`TxShared::finish`] commits.
pub(super) struct Prepared {
    began: Option<Instant>,
    flushing: Instant,
    records_sent: usize,
    store_records: usize,
}

/// What the stream's loop and its rebalance callback share.
pub(crate) struct TxShared {
    pub(super) stream: usize,
    pub(super) txid: String,
    pub(super) shared: Arc<StreamShared>,
    pub(super) producer: TxProducer,
    /// The target's connection, for store readers and fencing producers.
    pub(super) target: ClientProps,
    pub(super) store_topic: String,
    /// How long a transactional call (commit, abort, a fencing initialisation) may take.
    pub(super) timeout: Duration,
    pub(super) state: Mutex<TxState>,
    /// Set once the stream has left the group: what the close still serves does nothing.
    pub(super) closing: AtomicBool,
    /// Set when the group took the assignment back without a revocation: the stream ends
    /// and rejoins as a new incarnation.
    pub(super) lost: AtomicBool,
    pub(super) listener: Option<Mutex<Listener>>,
    pub(super) creator: Option<Arc<TopicCreator>>,
    pub(super) topic_retry_limit: Duration,
    /// Where a partition with neither progress nor a committed offset starts: the earliest
    /// offset, or the end (`auto.offset.reset`).
    pub(super) earliest: bool,
    /// A read of the store for pending partitions that ran out of patience, taken up again.
    pub(super) reader: Mutex<Option<StoreReader>>,
    /// What a record of the store must be to be taken (and its transactional id fenced).
    pub(super) trust: crate::mirror::mapping::Trust,
}

impl TxShared {
    pub(super) fn state(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn sent_log(&self) -> MutexGuard<'_, SentLog> {
        self.producer.context().sent_log()
    }

    /// Begins a transaction unless one is open.
    pub(super) fn begin(&self) -> Result<(), TxFailure> {
        let mut state = self.state();
        if state.open.is_some() {
            return Ok(());
        }
        self.producer
            .begin_transaction()
            .map_err(|e| self.classify("begin a transaction", &e))?;
        self.sent_log().forget_sent();
        state.open = Some(Instant::now());
        Ok(())
    }

    /// The opaque of the next record produced from `topic/partition` at `offset`.
    pub(super) fn opaque(&self, topic: &str, partition: i32, offset: i64) -> usize {
        let mut sent_log = self.sent_log();
        let slot = sent_log.slot(topic, partition);
        sent_log.sent.push((slot, offset));
        ((sent_log.generation as usize) << 32) | (sent_log.sent.len() - 1)
    }

    /// A record of `topic/partition` was polled: until it is copied, the position of its
    /// partition is past a record no transaction holds.
    /// Returns whether the stream copies that partition now (not: released, or its start
    /// still pending).
    pub(super) fn polled(&self, topic: &str, partition: i32) -> bool {
        match self.state().find(topic, partition) {
            Some(p) => {
                p.followable = false;
                true
            }
            None => false,
        }
    }

    /// `topic/partition` was copied up to `offset` (included) in the open transaction.
    pub(super) fn copied(&self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self.state().find(topic, partition) {
            p.next = offset + 1;
            p.followable = true;
        }
    }

    pub(super) fn classify(&self, what: &str, e: &KafkaError) -> TxFailure {
        let (fatal, abortable) = match e {
            KafkaError::Transaction(r) => (r.is_fatal(), r.txn_requires_abort()),
            _ => (false, true),
        };
        if is_fenced(e) {
            TxFailure::Fenced(fenced(&self.txid, e, what))
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
    pub(super) fn due(&self, interval: Duration, max_records: usize) -> bool {
        let open = self.state().open;
        open.is_some_and(|began| {
            began.elapsed() >= interval || self.sent_log().sent.len() >= max_records
        })
    }

    /// Commits the open transaction, with the store's records of every partition whose
    /// progress moved (and of those just assigned: their claim), and the release of
    /// `released` (progress with no transactional id). Begins one first if there is
    /// something to write and none is open.
    pub(super) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        released: &[Partition],
    ) -> Result<(), TxFailure> {
        match self.prepare(consumer, released)? {
            Some(prepared) => {
                failpoint::reached(failpoint::BEFORE_COMMIT);
                self.finish(prepared)
            }
            None => Ok(()),
        }
    }

    /// The first part of [`TxShared::commit`]: the open transaction's records and then its
    /// store records produced and acknowledged by the target, the transaction still open
    /// (`None`: nothing to commit, no transaction open).
    pub(super) fn prepare<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        released: &[Partition],
    ) -> Result<Option<Prepared>, TxFailure> {
        if self.state().broken {
            return Err(TxFailure::Fatal(
                "the transactional producer failed earlier".to_owned(),
            ));
        }
        self.follow_positions(consumer);
        let pending = {
            let state = self.state();
            state.open.is_some()
                || !released.is_empty()
                || state.parts.iter().any(OwnedPartition::dirty)
        };
        if !pending {
            return Ok(None);
        }
        self.begin()?;
        let began = self.state().open;
        let records_sent = self.sent_log().sent.len();
        let flushing = Instant::now();
        // Every record's delivery report first: the segments come from them.
        if let Err(e) = flush(&self.producer, self.timeout) {
            return Err(TxFailure::Abortable(format!(
                "the target did not acknowledge the transaction's records within {:?}: {e}",
                self.timeout
            )));
        }
        let (segments, failure) = {
            let mut sent_log = self.sent_log();
            (sent_log.recorder.take_dirty(), sent_log.failure.take())
        };
        if let Some(failure) = failure {
            return Err(failure);
        }
        let progress: Vec<Progress> = {
            let state = self.state();
            let releasing = |p: &OwnedPartition| released.iter().any(|(t, n)| p.is(t, *n));
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
        Ok(Some(Prepared {
            began,
            flushing,
            records_sent,
            store_records: records.len(),
        }))
    }

    /// The second part of [`TxShared::commit`]: commits the prepared transaction.
    pub(super) fn finish(&self, prepared: Prepared) -> Result<(), TxFailure> {
        let Prepared {
            began,
            flushing,
            records_sent,
            store_records,
        } = prepared;
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
            "committed a transaction of {records_sent} records and {store_records} store \
             records: open {:?}, flush {:?}, commit {:?}",
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
    pub(super) fn write_store(&self, record: &StoreRecord) -> Result<(), TxFailure> {
        let (key, value) = (record.key(), record.value());
        let pending = BaseRecord::with_opaque_to(&self.store_topic, STORE_OPAQUE)
            .key(&key)
            .payload(&value);
        send_waiting(&self.producer, pending, Some(self.timeout)).map_err(|e| {
            TxFailure::Abortable(format!(
                "cannot queue an offset-mapping record for topic {}: {e}",
                self.store_topic
            ))
        })
    }

    /// Lets the progress of partitions follow the consumer's position past records a
    /// `read_committed` consumer never returns (transaction markers, aborted transactions):
    /// every record below the position was handed to the open transaction or an earlier one.
    /// Only for partitions polled since they were assigned or rewound.
    pub(super) fn follow_positions<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) {
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
    pub(super) fn forget_transaction(&self) {
        let mut sent_log = self.sent_log();
        sent_log.forget_sent();
        sent_log.recorder = Recorder::transactional();
    }

    /// Aborts the open transaction and reads every owned partition again from its last
    /// committed progress.
    pub(super) fn abort_and_rewind<C: ConsumerContext>(
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
            self.abort_open()?;
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

    /// Aborts the open transaction. An abort the target cannot take yet (it is unreachable:
    /// the abort's own flush of the records in flight timed out, which librdkafka calls
    /// retriable) is tried again, each try up to the transaction timeout, until it succeeds
    /// or a stop is requested: nothing of the transaction becomes visible meanwhile, and a
    /// stream whose assignment is lost while it waits rejoins as a new incarnation. Fenced
    /// meanwhile, the stream retires its producer and rejoins as a new incarnation (the
    /// caller's loop sees `lost`). Any other failure breaks the producer.
    fn abort_open(&self) -> Result<(), TxFailure> {
        /// How long delivery reports are served between two tries of an abort.
        const REPORTS_BETWEEN_ABORTS: Duration = Duration::from_secs(1);
        let mut tries = 0u32;
        loop {
            let e = match self.producer.abort_transaction(self.timeout) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if is_fenced(&e) && !self.shared.control.stop_requested() {
                self.retire_fenced(&fenced(&self.txid, &e, "abort the transaction"));
                return Ok(());
            }
            if tries > 0
                && e.rdkafka_error_code() == Some(RDKafkaErrorCode::InvalidTransactionalState)
                && !self.shared.control.stop_requested()
            {
                // Refused as "in an invalid state" after tries that waited out the target: the
                // coordinator ended the transaction itself meanwhile (it outlived
                // transaction.timeout.ms) and holds no transaction of this producer to abort.
                // Nothing of it is visible; a new incarnation's producer (InitProducerId on
                // the same transactional id) finds the id's transaction ended either way.
                self.retire_fenced(&format!(
                    "the target refused the abort of transactional id {}'s open transaction \
                     ({e}) after {tries} tries: its coordinator ended that transaction itself \
                     (it outlived transaction.timeout.ms while the target was unreachable); \
                     nothing of it is visible to read_committed readers",
                    self.txid
                ));
                return Ok(());
            }
            let retriable = matches!(&e, KafkaError::Transaction(r) if r.is_retriable());
            if !retriable || self.shared.control.stop_requested() {
                let failure = self.classify("abort the transaction", &e);
                self.state().broken = true;
                return Err(failure);
            }
            tries += 1;
            tracing::warn!(
                stream = self.stream,
                "cannot abort the transaction yet ({e}); trying again (try {tries}; nothing of \
                 it is visible to read_committed readers)"
            );
            // The abort waits for the records in flight, whose delivery reports only this
            // thread serves: serve them (purged or failed, they are forgotten with the
            // transaction), then try again.
            let _ = flush(&self.producer, REPORTS_BETWEEN_ABORTS);
            // Waiting for the target is the stream's work now: the watchdog sees it turn.
            self.shared.turned(std::time::Instant::now());
        }
    }

    /// The target fenced this stream's transactional id (`why`): this producer is done with
    /// and nothing of its open transaction is visible. The stream retires it, leaves and
    /// rejoins as a new incarnation, which reads the store and copies on from the last
    /// commit, as after a lost assignment (the caller's loop sees `lost`). A commit refused
    /// as fenced may still have reached the coordinator before the fence: the store tells
    /// the next incarnation whether it did.
    fn retire_fenced(&self, why: &str) {
        tracing::warn!(
            stream = self.stream,
            "{why}; rejoining the group as a new incarnation, which copies on from the last \
             commit"
        );
        self.retire();
    }

    /// This producer is done with (fenced, or the assignment lost): its errors no longer
    /// stop the mirror, nothing more is written with it, and the caller's loop sees `lost`
    /// and rejoins as a new incarnation.
    pub(super) fn retire(&self) {
        self.producer
            .context()
            .retired
            .store(true, Ordering::SeqCst);
        self.state().broken = true;
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Commits, or on an abortable failure aborts and rewinds; a fatal failure stops the
    /// mirror. Returns whether the transaction committed.
    pub(super) fn commit_or_abort<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        released: &[Partition],
    ) -> bool {
        match self.commit(consumer, released) {
            Ok(()) => true,
            Err(f) => self.failed(consumer, f),
        }
    }

    /// After a failed commit: an abortable failure aborts and rewinds; a fenced producer is
    /// retired and the stream rejoins (unless a stop is requested); a fatal one (or a failed
    /// abort) stops the mirror. Returns false (the transaction did not commit, or its outcome
    /// is the store's to say).
    pub(super) fn failed<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        failure: TxFailure,
    ) -> bool {
        let failure = match failure {
            TxFailure::Abortable(why) => match self.abort_and_rewind(consumer, &why) {
                Ok(()) => return false,
                Err(f) => f,
            },
            TxFailure::Fenced(why) if !self.shared.control.stop_requested() => {
                self.retire_fenced(&why);
                return false;
            }
            fatal => {
                if self.state().open.is_some() {
                    // Fenced producers cannot abort; the coordinator has aborted for them.
                    let _ = self.producer.abort_transaction(self.timeout);
                }
                fatal
            }
        };
        let m = match failure {
            TxFailure::Abortable(m) | TxFailure::Fatal(m) => m,
            TxFailure::Fenced(m) => format!(
                "{m}; stopping, and the partitions' next owner copies on from the offset-mapping \
                 topic"
            ),
        };
        self.state().broken = true;
        self.shared
            .control
            .fail(format!("stream {}: {m}", self.stream));
        false
    }

    /// The source group's offsets, for monitoring: each owned partition's committed progress.
    pub(super) fn monitoring_offsets(
        &self,
        only: Option<&[Partition]>,
    ) -> Option<TopicPartitionList> {
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
}
