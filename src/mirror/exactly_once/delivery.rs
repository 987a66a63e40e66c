//! The delivery log of the open transaction: where its records came from, and what the
//! target's delivery reports say of them (segments of the offset mapping, the first failure).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;

use crate::mirror::clients::{self, Cluster};
use crate::mirror::flush::purged;
use crate::mirror::mapping::Recorder;
use crate::mirror::state::{Stats, StreamShared};

use super::{TxFailure, STOPPING, STORE_OPAQUE};
use crate::mirror::Partition;

/// Where the records of the open transaction came from, for the delivery reports.
#[derive(Default)]
pub(super) struct SentLog {
    /// Bumped whenever the transaction's records are forgotten (a new transaction, an
    /// abort): reports of older ones are stale.
    pub(super) generation: u32,
    /// The source partitions seen, by slot.
    pub(super) sources: Vec<Partition>,
    /// Per record produced in the open transaction: the slot of its source partition and
    /// its source offset. A record's opaque is its generation and its index here.
    pub(super) sent: Vec<(u32, i64)>,
    /// Segments of source → target offsets, from the reports.
    pub(super) recorder: Recorder,
    /// The first delivery failure of the open transaction.
    pub(super) failure: Option<TxFailure>,
}

impl SentLog {
    pub(super) fn forget_sent(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.sent.clear();
        self.failure = None;
    }

    pub(super) fn slot(&mut self, topic: &str, partition: i32) -> u32 {
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
pub(crate) struct TxDelivery {
    pub(super) shared: Arc<StreamShared>,
    pub(super) txid: String,
    pub(super) sent_log: Mutex<SentLog>,
    /// Set when the stream lost its assignment: this producer is done with, and its errors
    /// (fenced, most often) no longer stop the mirror.
    pub(super) retired: AtomicBool,
}

impl TxDelivery {
    pub(super) fn sent_log(&self) -> MutexGuard<'_, SentLog> {
        self.sent_log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `e` says that this producer's transactional id was fenced by a newer producer.
pub(super) fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

/// Why a stream was fenced. Either the transaction coordinator aborted the open transaction
/// itself once it outlived `transaction.timeout.ms`, bumping the producer's epoch (the target
/// was cut off, or the process paused, with no other instance about), or another instance
/// took this stream's partitions over and fenced its id.
pub(super) fn fenced(txid: &str, e: &KafkaError, what: &str) -> String {
    format!(
        "the target fenced transactional id {txid} ({e}) when trying to {what}: the \
         transaction coordinator aborted the open transaction, which outlived \
         transaction.timeout.ms (the target was cut off or this process paused), or another \
         instance took over this stream's partitions (this one was paused or cut off from the \
         group past session.timeout.ms, or, on the classic group protocol, the group gave them \
         away without revoking them: see docs/exactly-once.md). Nothing of the open \
         transaction is visible to read_committed readers"
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
        clients::target_error(&self.shared, &error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        clients::target_statistics(&self.shared, &statistics);
    }
}

impl ProducerContext for TxDelivery {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let mut sent_log = self.sent_log();
        if opaque == STORE_OPAQUE {
            if let Err((e, m)) = result {
                if !purged(e) && sent_log.failure.is_none() {
                    sent_log.failure = Some(TxFailure::Fatal(format!(
                        "cannot write the offset mapping to topic {} on the target: {e}; grant \
                         the mirror's principal WRITE on it. {STOPPING}",
                        m.topic()
                    )));
                }
            }
            return;
        }
        let (generation, index) = (opaque >> 32, opaque & 0xffff_ffff);
        if generation != sent_log.generation as usize {
            return;
        }
        let Some(&(slot, offset)) = sent_log.sent.get(index) else {
            return;
        };
        let SentLog {
            sources,
            recorder,
            failure,
            ..
        } = &mut *sent_log;
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
                    TxFailure::Fenced(fenced(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_of_a_forgotten_transaction_are_told_apart_by_generation() {
        let mut sent_log = SentLog::default();
        let a = sent_log.slot("orders", 0);
        let b = sent_log.slot("orders", 1);
        assert_ne!(a, b);
        // A partition keeps its slot: no allocation per record.
        assert_eq!(sent_log.slot("orders", 0), a);
        assert_eq!(sent_log.sources.len(), 2);
        sent_log.sent.push((a, 7));
        sent_log.failure = Some(TxFailure::Abortable("a record timed out".into()));
        let before = sent_log.generation;
        sent_log.forget_sent();
        assert_ne!(sent_log.generation, before);
        assert!(sent_log.sent.is_empty() && sent_log.failure.is_none());
        // The slots outlive transactions.
        assert_eq!(sent_log.slot("orders", 1), b);
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
                said.contains("transactional id mirror-a-1-0")
                    && said.contains("transaction.timeout.ms")
                    && said.contains("another instance"),
                "{said}"
            );
        }
        assert!(!is_fenced(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut
        )));
    }
}
