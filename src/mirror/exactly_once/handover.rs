//! Hand-overs: where newly assigned partitions start (their progress in the store, after
//! fencing whoever it names), claiming them, and releasing revoked ones.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use crate::mirror::clients::{self, Cluster};
use crate::mirror::mapping::OffsetMap;
use crate::mirror::source::{call_listener, make_target_topics, partition_list};
use crate::native::failpoint;
use crate::plugin::Listener;
use crate::settings::counted;

use super::state::OwnedPartition;
use super::store_reader::{ReadError, StoreReader};
use super::transaction::TxShared;
use super::TxFailure;
use super::{described, offset_list, TxConsumer, PENDING_RETRY, READ_PATIENCE};
use crate::mirror::Partition;

impl TxShared {
    /// Where each of `partitions` starts: its progress in the store, after fencing every
    /// previous owner named there that is not this stream; the source group's committed
    /// offset where the store has none; else `auto.offset.reset`.
    pub(super) fn starts(
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
            None => StoreReader::open(&self.target, &self.store_topic, &self.trust, patience)?,
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
                Some(p) => match p
                    .checked_start(
                        consumer.fetch_watermarks(topic, *partition, self.timeout),
                        |lost| self.shared.stats.recorded.count_skipped("retention", lost),
                    )
                    .map_err(ReadError::NotYet)?
                {
                    Some(next) => starts.push(((topic.clone(), *partition), next)),
                    None => drop(missing.add_partition(topic, *partition)),
                },
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
    /// there that did not release them later is fenced, to its high watermark, again until
    /// no new owner appears) and returns what it holds.
    pub(super) fn fence_and_read(
        &self,
        reader: &mut StoreReader,
        partitions: &[Partition],
        patience: Duration,
    ) -> Result<OffsetMap, ReadError> {
        reader.read_to_stable_end(patience)?;
        let mut fenced: Vec<String> = Vec::new();
        let mut complete = false;
        loop {
            let named: Vec<(Partition, String)> = partitions
                .iter()
                .filter_map(|(t, p)| {
                    let owner = reader.map.progress(t, *p)?.transactional_id.clone()?;
                    Some(((t.clone(), *p), owner))
                })
                .filter(|(_, id)| *id != self.txid && !fenced.contains(id))
                .collect();
            if named.is_empty() && complete {
                break;
            }
            // Up to the stable end only, an owner named there may have released the
            // partition since, in a transaction committed behind one still open: it is left
            // to the read of the high watermark, which shows whether it did.
            let released = if complete || named.is_empty() {
                Vec::new()
            } else {
                let asked: Vec<Partition> = named.iter().map(|(p, _)| p.clone()).collect();
                reader.released_past_stable_end(&asked, patience)?
            };
            let owners = to_fence(&named, &released);
            for (partition, owner) in &named {
                if !owners.contains(owner) {
                    tracing::info!(
                        stream = self.stream,
                        "transactional id {owner}, named by {}/{} up to the offset-mapping \
                         topic's last stable offset, released it past there: not fenced \
                         unless the read up to the high watermark still names it",
                        partition.0,
                        partition.1
                    );
                }
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
    pub(super) fn fence(&self, owner: &str) -> Result<(), String> {
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

    pub(super) fn assign(&self, tpl: &TopicPartitionList) {
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

    /// Makes sure this stream still owns `starts` before its claim of them commits: a stream
    /// paused (or cut off) since they were assigned may have lost them to an owner that read
    /// the store before this claim lands. The claim would then be the store's latest
    /// progress of those partitions, behind the new owner's, and it would name this stream
    /// instead of the new owner: once the store is compacted, whoever reads it next would
    /// copy again from there and leave the new owner unfenced. The source group's
    /// coordinator refuses a commit from a member that is no longer in the group's current
    /// generation (classic) or epoch (KIP-848), as after a pause past the session timeout,
    /// so each start is committed there, synchronously (for monitoring it is what the store
    /// says), while the claim's transaction is open on the store ([`TxShared::start`]):
    /// a new owner assigned after this check reads the store to its high watermark, which
    /// waits for that transaction, and one assigned before it makes the check fail.
    /// Refused, the claim is aborted and the partitions stay paused and unclaimed until the
    /// rebalance that took them is served, or the commit goes through. The coordinator
    /// checks membership, not which member owns which partition: a live member whose
    /// partitions the assignor gave away without a revocation (the classic protocol's case in
    /// docs/exactly-once.md) is not caught here; the next owner fences it.
    pub(super) fn still_assigned(
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
    /// does not release them cleanly. The claim is produced and acknowledged first, then
    /// [`TxShared::still_assigned`] checks the assignment, then the transaction commits: no
    /// pause between the check and the commit can let the claim land unseen behind a new
    /// owner's progress. A refused check aborts the claim (and whatever the open transaction
    /// held: its partitions are copied again from their last commit) and returns
    /// [`ReadError::NotYet`]: the partitions are pending again.
    pub(super) fn start(
        &self,
        consumer: &TxConsumer,
        starts: &[(Partition, i64)],
    ) -> Result<(), ReadError> {
        let since = {
            let mut state = self.state();
            for ((topic, partition), next) in starts {
                state.remove(topic, *partition);
                state
                    .pending
                    .retain(|(t, p)| !(t == topic && p == partition));
                state.parts.push(OwnedPartition {
                    topic: topic.clone(),
                    partition: *partition,
                    next: *next,
                    committed: None,
                    followable: false,
                });
            }
            let since = state.pending_since;
            if state.pending.is_empty() {
                state.pending_since = None;
            }
            since
        };
        let claimed = match self.claim(consumer, starts) {
            Ok(true) => true,
            Ok(false) if self.shared.control.stop_requested() => false,
            Ok(false) => self
                .claim(consumer, starts)
                .map_err(|e| self.unclaimed(starts, since, e))?,
            Err(e) => return Err(self.unclaimed(starts, since, e)),
        };
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
        Ok(())
    }

    /// One try at the claim of `starts` (the open transaction with their progress, checked
    /// before its commit). Returns whether it committed; an error when the check was refused
    /// (the transaction aborted).
    fn claim(&self, consumer: &TxConsumer, starts: &[(Partition, i64)]) -> Result<bool, ReadError> {
        let prepared = match self.prepare(consumer, &[]) {
            Ok(p) => p,
            Err(f) => return Ok(self.failed(consumer, f)),
        };
        if let Err(refused) = self.still_assigned(consumer, starts) {
            if prepared.is_some() {
                {
                    // Out of the owned partitions before the abort: the rewind does not seek
                    // them, and they are pending again (still paused).
                    let mut state = self.state();
                    for ((topic, partition), _) in starts {
                        state.remove(topic, *partition);
                    }
                }
                if let Err(TxFailure::Abortable(m) | TxFailure::Fatal(m) | TxFailure::Fenced(m)) =
                    self.abort_and_rewind(
                        consumer,
                        "the claim of newly assigned partitions cannot commit: the source \
                         group refused the check that this stream still owns them",
                    )
                {
                    self.shared
                        .control
                        .fail(format!("stream {}: {m}", self.stream));
                }
            }
            return Err(refused);
        }
        failpoint::reached(failpoint::BEFORE_CLAIM_COMMIT);
        match prepared {
            None => Ok(true),
            Some(prepared) => match self.finish(prepared) {
                Ok(()) => Ok(true),
                Err(f) => Ok(self.failed(consumer, f)),
            },
        }
    }

    /// `starts` could not be claimed now: they are pending again (paused), since `since`.
    fn unclaimed(
        &self,
        starts: &[(Partition, i64)],
        since: Option<Instant>,
        refused: ReadError,
    ) -> ReadError {
        let mut state = self.state();
        for ((topic, partition), _) in starts {
            state.remove(topic, *partition);
            let key = (topic.clone(), *partition);
            if !state.pending.contains(&key) {
                state.pending.push(key);
            }
        }
        state.pending_since = match (state.pending_since, since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b).or_else(|| Some(Instant::now())),
        };
        refused
    }

    /// Tries again to start the partitions whose start could not be read when they were
    /// assigned: on success they are claimed, moved to their start and resumed. Gives up
    /// (stopping the mirror) after twice the transaction timeout, by which the target has
    /// aborted any transaction a crashed owner left open.
    pub(super) fn start_pending(&self, consumer: &TxConsumer) {
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
        let started = self
            .starts(consumer, &partitions, READ_PATIENCE)
            .and_then(|starts| {
                failpoint::reached(failpoint::BEFORE_CLAIM);
                self.start(consumer, &starts)?;
                Ok(starts)
            });
        let starts = match started {
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

    pub(super) fn revoke(&self, consumer: &TxConsumer, partitions: &[Partition]) {
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
                let open = self.state().open.is_some();
                self.retire();
                if open {
                    let _ = self.producer.abort_transaction(self.timeout);
                }
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
        let mut sent_log = self.sent_log();
        for (topic, partition) in partitions {
            state.remove(topic, *partition);
            state
                .pending
                .retain(|(t, p)| !(t == topic && p == partition));
            sent_log.recorder.forget(topic, *partition);
        }
        if state.pending.is_empty() {
            state.pending_since = None;
        }
    }

    pub(super) fn call_listener(
        &self,
        what: &str,
        call: impl FnOnce(&mut Listener) -> Result<(), String>,
    ) {
        call_listener(&self.listener, &self.shared, what, call);
    }
}

/// The owners to fence among `named` (each partition's owner as the store names it), leaving
/// out an owner whose every named partition is in `released` (given up later, past what was
/// read): sorted, each once.
fn to_fence(named: &[(Partition, String)], released: &[Partition]) -> Vec<String> {
    let mut owners: Vec<String> = named
        .iter()
        .filter(|(partition, _)| !released.contains(partition))
        .map(|(_, owner)| owner.clone())
        .collect();
    owners.sort();
    owners.dedup();
    owners
}

/// The context of a producer made only to fence a transactional id.
pub(super) struct FencingContext;

impl ClientContext for FencingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }
}

impl ProducerContext for FencingContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(partition: i32, owner: &str) -> (Partition, String) {
        (("orders".to_owned(), partition), owner.to_owned())
    }

    #[test]
    fn an_owner_that_released_every_partition_named_past_the_read_is_not_fenced() {
        let named = [
            named(0, "m-a-1-0"),
            named(1, "m-a-1-0"),
            named(2, "m-c-1-0"),
        ];
        let released = [("orders".to_owned(), 0), ("orders".to_owned(), 1)];
        assert_eq!(to_fence(&named, &released), ["m-c-1-0"]);
    }

    #[test]
    fn an_owner_that_kept_one_named_partition_is_fenced_once() {
        // a released orders/0 later, not orders/1: it may hold orders/1 in a transaction
        // left open (crashed, or a zombie), so it is fenced.
        let named = [
            named(0, "m-a-1-0"),
            named(1, "m-a-1-0"),
            named(2, "m-a-1-0"),
        ];
        let released = [("orders".to_owned(), 0)];
        assert_eq!(to_fence(&named, &released), ["m-a-1-0"]);
    }

    #[test]
    fn without_releases_every_named_owner_is_fenced() {
        let named = [
            named(3, "m-b-1-0"),
            named(0, "m-a-1-0"),
            named(1, "m-b-1-0"),
        ];
        assert_eq!(to_fence(&named, &[]), ["m-a-1-0", "m-b-1-0"]);
    }
}
