//! Our idempotent producer: InitProducerId (no transactional id), a sequence per target
//! partition from 0, `acks=-1`, rounds carrying the next batch of each partition: to each
//! target broker up to [`LANES`] Produce requests of about equal bytes, each on a connection
//! of its own (a Kafka broker works on one request of a connection at a time; on several
//! connections its request handlers validate and append them at once).
//!
//! Order: **one batch in flight per partition** (this slice's choice). A round sends at most
//! one batch per partition and reads every answer before the next round, so a retried batch
//! (same bytes, same sequence) always lands before its successor, which is not sent until it
//! is acknowledged. A batch answered DUPLICATE_SEQUENCE_NUMBER can only be a retry of one the
//! target already has: acknowledged, target offset unknown (so the sequences of a send left
//! unanswered, which may be the target's, are never given to another batch: see
//! [`Outcome::Retry`]). A batch the target refused took none of its sequences: the batches
//! after it are stamped again from its first (`BatchStream`'s skip). OUT_OF_ORDER_SEQUENCE_NUMBER
//! means the target lacks a batch sent before: the producer takes a new id
//! ([`BatchProducer::renew`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    InitProducerIdRequest, ProduceRequest, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::batch::{next_sequence, Stamp};
use super::cluster::{leader_moved, Cluster, ClusterError};
use super::wire::{error_name, WireError};
use crate::settings::client::ClientProps;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProducerError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("target InitProducerId failed: {0}; check that the principal may IdempotentWrite on the target cluster")]
    Init(String),
}

/// One batch of a round: where it goes and its bytes.
pub(crate) struct RoundItem<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) batch: Bytes,
}

/// A record of a refused batch that the target named as a cause (`record_errors`).
#[derive(Clone, Debug)]
pub(crate) struct RefusedRecord {
    /// Its index in the batch.
    pub(crate) index: usize,
    /// What the target said of it.
    pub(crate) message: String,
}

/// What became of one batch of a round.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// On the target from this offset (-1: landed before, offset not known).
    Acked { base_offset: i64 },
    /// Not (known to be) written: send the same bytes again. `maybe_written`: the request
    /// may have been applied all the same (its answer was lost or late, or the broker said it
    /// appended without enough replicas): the batch's sequences may be the target's already.
    Retry { reason: String, maybe_written: bool },
    /// Refused for good: a send failure. `records`: the records of the batch the target named
    /// as the cause (Produce v8 and later; empty when it named none).
    Refused {
        code: String,
        message: String,
        records: Vec<RefusedRecord>,
    },
    /// OUT_OF_ORDER_SEQUENCE_NUMBER: the target lacks a batch this producer sent the
    /// partition before this one, which was not written (see [`BatchProducer::renew`]).
    Gap,
    /// Not sent this round: its broker's round was full ([`BatchProducer`]'s byte budget).
    /// Sent in a later round, before anything after it of its partition.
    Deferred,
}

pub(crate) struct BatchProducer {
    pub(crate) cluster: Cluster,
    producer_id: i64,
    epoch: i16,
    /// The sequence of the next batch prepared for each target partition.
    sequences: HashMap<(String, i32), i32>,
    timeout_ms: i32,
    /// Per target broker, the most bytes one Produce request carries: none until a request
    /// went unanswered within the wait (a link too slow for the round), then halved at each
    /// such request and doubled at each answered within a quarter of the wait.
    budgets: HashMap<i32, usize>,
    /// Which partition of a broker's round goes first, turning each round, so that a budget
    /// defers no partition for ever.
    turn: usize,
    /// The most batch bytes one Produce request carries (a request of one batch excepted,
    /// which nothing divides): the producer config's `message.max.bytes` (Java:
    /// `max.request.size`), as librdkafka and the Java producer bound a request.
    request_cap: usize,
    /// Per target broker, what its closing of connections on requests taught
    /// ([`closed_on`](Self::closed_on)).
    closings: HashMap<i32, Closings>,
    /// Brokers whose closing of a connection on a request was said at warn and that have not
    /// answered a Produce since.
    closing_said: HashSet<i32>,
}

/// A producer id and epoch from InitProducerId (no transactional id) on any target broker,
/// retriable answers asked again until `deadline`.
fn init_producer_id(cluster: &mut Cluster, deadline: Instant) -> Result<(i64, i16), ProducerError> {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(i32::MAX)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let response = loop {
        // A broker that cannot be reached is tried again as well: a renewal follows a fault
        // of the link as often as not.
        let answer = cluster.any_broker().and_then(|broker| {
            cluster
                .connection(broker)?
                .call(&request)
                .map_err(ClusterError::from)
        });
        let response = match answer {
            Ok(response) => response,
            Err(
                e @ (ClusterError::Unreachable { .. }
                | ClusterError::UnknownBroker { .. }
                | ClusterError::Wire(WireError::Io { .. })),
            ) if Instant::now() < deadline => {
                tracing::debug!("target InitProducerId: {e}; trying again");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(ProducerError::Init(e.to_string())),
        };
        match response.error_code {
            0 => break response,
            code if retriable(code) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            code => return Err(ProducerError::Init(error_name(code))),
        }
    };
    tracing::debug!(
        "batch producer: producer id {} epoch {}",
        response.producer_id.0,
        response.producer_epoch
    );
    Ok((response.producer_id.0, response.producer_epoch))
}

/// A budget that has grown back to this is lifted.
const UNBOUNDED_FROM: usize = 64 << 20;

/// What a target broker's closing of connections on Produce requests taught. A broker closes
/// a connection, without answering, on a request larger than its `socket.request.max.bytes`,
/// and the same request sent again would be closed on for ever; but a broker also closes
/// connections when it restarts, when a lane sat idle past `connections.max.idle.ms`, or
/// behind a load balancer, and that says nothing of sizes. So a round with closings (one
/// event, however many of its requests were closed on) halves the requests, and each round
/// answered in full doubles them back, up to what was closed on; a request that large is
/// tried again only [`PROBE_AFTER`] after the closing (a limit then costs one closing every
/// so often, a restart a few minutes of smaller requests), and beyond it the cap is lifted.
#[derive(Debug)]
struct Closings {
    /// The most batch bytes a request to the broker carries for now.
    cap: usize,
    /// The smallest request closed on in the latest round with closings.
    closed_at: usize,
    /// When a request of `closed_at` may be tried again.
    probe_at: Instant,
}

/// How long after a closing a request as large as the one closed on is tried again.
const PROBE_AFTER: Duration = Duration::from_secs(300);

impl Closings {
    fn new(now: Instant) -> Closings {
        Closings {
            cap: usize::MAX,
            closed_at: usize::MAX,
            probe_at: now,
        }
    }

    /// A round's requests of `bytes` at the least (more than [`LEAST_LEARNT_CAP`]) were
    /// closed on at `now`: the new cap if this lowers it.
    fn closed(&mut self, bytes: usize, now: Instant) -> Option<usize> {
        self.closed_at = bytes;
        self.probe_at = now + PROBE_AFTER;
        let cap = (bytes / 2).max(LEAST_LEARNT_CAP);
        (cap < self.cap).then(|| {
            self.cap = cap;
            cap
        })
    }

    /// A round's requests were all answered at `now`: the cap doubles, short of what was
    /// closed on until its probe is due; false once it is large enough to be lifted.
    fn grown(&mut self, now: Instant) -> bool {
        let next = self.cap.saturating_mul(2);
        if next >= self.closed_at && now < self.probe_at {
            return true;
        }
        self.cap = next;
        next < UNBOUNDED_FROM
    }
}

/// The least a cap learnt from a broker's closing of connections goes down to: a request of
/// one batch of about Kafka's default `max.message.bytes` (1,048,588), which a broker must
/// take; a closing on a request no larger is the broker going away, not the request's size.
const LEAST_LEARNT_CAP: usize = 1 << 20;

/// The most Produce requests (and connections) one round sends a target broker: within
/// Kafka's default `num.io.threads` (8). One stream's steady rate rose 1.15 times from one
/// lane to four on 16 partitions of 1 KiB records (docs/benchmark.md, Lanes).
pub(crate) const LANES: usize = 4;

impl BatchProducer {
    /// A producer for the target `props` points at, with a producer id of its own.
    pub(crate) fn new(props: &ClientProps, timeout: Duration) -> Result<Self, ProducerError> {
        let mut cluster = Cluster::new("target", props, timeout)?;
        // Retriable answers (the coordinator still loading, say) are asked again within the
        // config's request timeout (`timeout` may be shorter, bounded by the poll interval
        // for the waits of a running stream; none of those runs yet).
        let deadline = Instant::now() + props.request_timeout().max(timeout);
        let (producer_id, epoch) = init_producer_id(&mut cluster, deadline)?;
        Ok(BatchProducer {
            cluster,
            producer_id,
            epoch,
            sequences: HashMap::new(),
            timeout_ms: i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
            budgets: HashMap::new(),
            turn: 0,
            request_cap: props
                .get("message.max.bytes")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&v: &usize| v > 0)
                .unwrap_or(usize::MAX),
            closings: HashMap::new(),
            closing_said: HashSet::new(),
        })
    }

    /// A new producer id, every target partition's sequences from 0 again: what follows a
    /// sequence gap ([`Outcome::Gap`]). The target lacks a batch this producer sent before
    /// the one it refused: a batch released unanswered that never landed (its records were
    /// copied again by the partition's next owner), or records it acknowledged and then lost
    /// (an unclean leader election). Under a new id the target takes the batches from any
    /// sequence, as from a producer it does not know, and a late request of the old id cannot
    /// be taken for one of the new (DUPLICATE_SEQUENCE_NUMBER).
    pub(crate) fn renew(&mut self) -> Result<(), ProducerError> {
        let deadline = Instant::now() + self.cluster.timeout();
        let (producer_id, epoch) = init_producer_id(&mut self.cluster, deadline)?;
        self.producer_id = producer_id;
        self.epoch = epoch;
        self.sequences.clear();
        Ok(())
    }

    /// The stamp for the next batch of a target partition; [`advance`](Self::advance) moves
    /// the sequence past the records prepared with it.
    pub(crate) fn stamp(&self, topic: &str, partition: i32) -> Stamp {
        Stamp {
            producer_id: self.producer_id,
            producer_epoch: self.epoch,
            base_sequence: self
                .sequences
                .get(&(topic.to_owned(), partition))
                .copied()
                .unwrap_or(0),
        }
    }

    /// The next batch of a target partition starts `records` sequences later.
    pub(crate) fn advance(&mut self, topic: &str, partition: i32, records: i32) {
        let s = self
            .sequences
            .entry((topic.to_owned(), partition))
            .or_insert(0);
        *s = next_sequence(*s, records);
    }

    /// Batches prepared but never sent were dropped (their partition released): the next one
    /// takes the sequence the first of them had.
    pub(crate) fn rewind(&mut self, topic: &str, partition: i32, sequence: i32) {
        self.sequences
            .insert((topic.to_owned(), partition), sequence);
    }

    /// Sends one round (at most one batch per partition) and reads every answer. The
    /// outcomes are in the order of `items`.
    pub(crate) fn send_round(&mut self, items: &[RoundItem<'_>]) -> Vec<Outcome> {
        self.send_round_by(items, None)
    }

    /// As [`send_round`](Self::send_round), every wait within it (a metadata refresh, a
    /// connection, the answers, the refresh after them) ending at `deadline` at the latest: a
    /// release's rounds share its one deadline, so that the release ends within it whatever
    /// the target does. What the deadline cuts short is an outcome to retry, as a timeout.
    pub(crate) fn send_round_by(
        &mut self,
        items: &[RoundItem<'_>],
        deadline: Option<Instant>,
    ) -> Vec<Outcome> {
        let timeout = self.cluster.timeout();
        let by = |wait: Duration| {
            let own = Instant::now() + wait;
            deadline.map_or(own, |d| own.min(d))
        };
        let mut outcomes: Vec<Option<Outcome>> = items.iter().map(|_| None).collect();
        let mut refresh = false;
        // Leaders, refreshed once if one is unknown.
        if items
            .iter()
            .any(|i| self.cluster.leader(i.topic, i.partition).is_none())
        {
            let mut topics: Vec<&str> = items.iter().map(|i| i.topic).collect();
            topics.sort_unstable();
            topics.dedup();
            if let Err(e) = self.cluster.refresh_by(&topics, by(timeout)) {
                tracing::debug!("target metadata: {e}");
            }
        }
        let mut by_broker: HashMap<i32, Vec<usize>> = HashMap::new();
        for (n, item) in items.iter().enumerate() {
            match self.cluster.leader(item.topic, item.partition) {
                Some((leader, _)) => by_broker.entry(leader).or_default().push(n),
                None => {
                    outcomes[n] = Some(Outcome::Retry {
                        reason: format!(
                            "no leader known for target {}/{}",
                            item.topic, item.partition
                        ),
                        maybe_written: false,
                    })
                }
            }
        }
        // Each broker's round within its budget: the first member always (a round carries at
        // least one batch), the others while they fit, from a member that turns each round.
        self.turn = self.turn.wrapping_add(1);
        let mut round_bytes: HashMap<i32, usize> = HashMap::new();
        for (broker, members) in by_broker.iter_mut() {
            let len = members.len();
            members.rotate_left(self.turn % len);
            let Some(&budget) = self.budgets.get(broker) else {
                continue;
            };
            let mut bytes = 0;
            let mut kept = 0;
            for &n in members.iter() {
                let size = items[n].batch.len();
                if kept > 0 && bytes + size > budget {
                    outcomes[n] = Some(Outcome::Deferred);
                    continue;
                }
                bytes += size;
                kept += 1;
            }
            members.retain(|&n| outcomes[n].is_none());
        }
        // Send every lane of every broker, then read every answer: connections made within one
        // timeout, answers awaited within one more, for all brokers together.
        // Each request within the cap, what fits in none of the lanes deferred.
        let connect_by = by(timeout);
        let mut sent: Vec<(i32, usize, Vec<usize>, usize)> = Vec::new();
        let mut closed: Vec<(i32, usize)> = Vec::new();
        let mut unsent: HashSet<i32> = HashSet::new();
        for (broker, members) in by_broker.iter_mut() {
            let sizes: Vec<usize> = members.iter().map(|&n| items[n].batch.len()).collect();
            let (lanes, deferred) = pack_lanes(&sizes, LANES, self.cap_of(*broker));
            for k in deferred {
                outcomes[members[k]] = Some(Outcome::Deferred);
            }
            let lanes: Vec<Vec<usize>> = lanes
                .into_iter()
                .map(|picked| picked.into_iter().map(|k| members[k]).collect())
                .collect();
            members.retain(|&n| outcomes[n].is_none());
            round_bytes.insert(*broker, members.iter().map(|&n| items[n].batch.len()).sum());
            for (lane, members) in lanes.into_iter().enumerate() {
                let bytes = members.iter().map(|&n| items[n].batch.len()).sum();
                let request = self.request(items, &members);
                let result = match self.cluster.lane_by(*broker, lane, connect_by) {
                    Err(e) => Err(e.to_string()),
                    Ok(c) => c.send(&request).map_err(|e| {
                        if e.closed_by_broker() {
                            closed.push((*broker, bytes));
                        }
                        e.to_string()
                    }),
                };
                match result {
                    Ok(()) => sent.push((*broker, lane, members, bytes)),
                    Err(reason) => {
                        self.cluster.drop_lane(*broker, lane);
                        unsent.insert(*broker);
                        refresh = true;
                        for &n in &members {
                            outcomes[n] = Some(Outcome::Retry {
                                reason: reason.clone(),
                                // An unfinished frame is never read.
                                maybe_written: false,
                            });
                        }
                    }
                }
            }
        }
        let waited_from = Instant::now();
        let answers_by = by(timeout);
        // Per broker, over its lanes: whether one went unanswered within the wait, and the
        // slowest answer; its budget learns from the whole round.
        let mut late: HashMap<i32, bool> = HashMap::new();
        let mut slowest: HashMap<i32, Duration> = HashMap::new();
        for (broker, lane, members, bytes) in sent {
            let answer = self
                .cluster
                .lane_by(broker, lane, answers_by)
                .map_err(|e| (e.to_string(), false, false))
                .and_then(|c| {
                    c.receive_by::<ProduceRequest>(answers_by)
                        .map_err(|e| (e.to_string(), e.timed_out(), e.closed_by_broker()))
                });
            let response = match answer {
                Ok(r) => {
                    let took = slowest.entry(broker).or_default();
                    *took = (*took).max(waited_from.elapsed());
                    r
                }
                Err((reason, timed_out, closed_on_it)) => {
                    *late.entry(broker).or_default() |= timed_out;
                    if closed_on_it {
                        closed.push((broker, bytes));
                    }
                    // The batches may or may not have landed: sent again with the same
                    // sequences, the target keeps one copy.
                    self.cluster.drop_lane(broker, lane);
                    refresh = true;
                    for &n in &members {
                        outcomes[n] = Some(Outcome::Retry {
                            reason: reason.clone(),
                            maybe_written: true,
                        });
                    }
                    continue;
                }
            };
            Self::read_answer(items, &members, &response, &mut outcomes, &mut refresh);
        }
        // One event per broker: the smallest of its requests closed on.
        let mut closed_brokers: HashMap<i32, usize> = HashMap::new();
        for (broker, bytes) in closed {
            let least = closed_brokers.entry(broker).or_insert(bytes);
            *least = (*least).min(bytes);
        }
        for (&broker, &bytes) in &closed_brokers {
            self.closed_on(broker, bytes);
        }
        for broker in by_broker.keys() {
            let answered = slowest.contains_key(broker)
                && !late.contains_key(broker)
                && !unsent.contains(broker);
            if answered && !closed_brokers.contains_key(broker) {
                self.grow_back(*broker);
            }
        }
        for (broker, members) in &by_broker {
            if late.get(broker).copied().unwrap_or(false) {
                let bytes = round_bytes.get(broker).copied().unwrap_or(0);
                self.unanswered(*broker, bytes, members.len());
            } else if let Some(took) = slowest.get(broker) {
                self.answered(*broker, *took);
            }
        }
        if refresh && deadline.is_none_or(|d| Instant::now() < d) {
            let mut topics: Vec<&str> = items.iter().map(|i| i.topic).collect();
            topics.sort_unstable();
            topics.dedup();
            if let Err(e) = self.cluster.refresh_by(&topics, by(timeout)) {
                tracing::debug!("target metadata: {e}");
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or(Outcome::Retry {
                    reason: "not sent".to_owned(),
                    maybe_written: false,
                })
            })
            .collect()
    }

    /// The outcome of each batch of one Produce request (`members` of `items`) from its answer.
    fn read_answer(
        items: &[RoundItem<'_>],
        members: &[usize],
        response: &ProduceResponse,
        outcomes: &mut [Option<Outcome>],
        refresh: &mut bool,
    ) {
        for topic in &response.responses {
            let name = topic.name.0.as_str();
            for p in &topic.partition_responses {
                let Some(&n) = members
                    .iter()
                    .find(|&&n| items[n].topic == name && items[n].partition == p.index)
                else {
                    continue;
                };
                let outcome = match p.error_code {
                    0 => Outcome::Acked {
                        base_offset: p.base_offset,
                    },
                    // DUPLICATE_SEQUENCE_NUMBER: a retry of a batch the target has.
                    46 => Outcome::Acked { base_offset: -1 },
                    code if leader_moved(code) || retriable(code) => {
                        *refresh |= leader_moved(code);
                        Outcome::Retry {
                            reason: error_name(code),
                            // REQUEST_TIMED_OUT (the broker's own wait for its replicas)
                            // and NOT_ENOUGH_REPLICAS_AFTER_APPEND: appended, not replicated.
                            maybe_written: matches!(code, 7 | 20),
                        }
                    }
                    45 => Outcome::Gap,
                    // TOPIC_AUTHORIZATION_FAILED: what is missing, and what to do, as the
                    // record engine says it.
                    29 => Outcome::Refused {
                        code: error_name(29),
                        message: format!(
                            "the target cluster does not allow the mirror's principal (the \
                             producer's credentials: its sasl.username or its \
                             certificate's subject) to WRITE to target topic {name}: \
                             grant it WRITE on topic {name}, e.g. kafka-acls --add \
                             --allow-principal User:NAME --operation Write --topic {name}"
                        ),
                        records: Vec::new(),
                    },
                    code => Outcome::Refused {
                        code: error_name(code),
                        message: p
                            .error_message
                            .as_ref()
                            .map(|m| m.as_str().to_owned())
                            .unwrap_or_default(),
                        records: p
                            .record_errors
                            .iter()
                            .filter_map(|e| {
                                Some(RefusedRecord {
                                    index: usize::try_from(e.batch_index).ok()?,
                                    message: e
                                        .batch_index_error_message
                                        .as_ref()
                                        .map(|m| m.as_str().to_owned())
                                        .unwrap_or_default(),
                                })
                            })
                            .collect(),
                    },
                };
                outcomes[n] = Some(outcome);
            }
        }
        for &n in members {
            if outcomes[n].is_none() {
                outcomes[n] = Some(Outcome::Retry {
                    reason: "the answer did not name this partition".to_owned(),
                    maybe_written: true,
                });
            }
        }
    }

    /// A Produce of `bytes` (`batches` batches) to `broker` went unanswered within the wait:
    /// the link carries less than that in time, so its next rounds carry half (at least one
    /// batch, which no budget divides).
    fn unanswered(&mut self, broker: i32, bytes: usize, batches: usize) {
        let wait = self.cluster.timeout();
        if batches <= 1 {
            if self.budgets.insert(broker, bytes.max(1)) != Some(bytes.max(1)) {
                // Once until it is answered: a target down says so at each retry already.
                tracing::warn!(
                    "target broker {broker} did not answer a Produce of one batch ({bytes} \
                     bytes) within {wait:?}: it is down, or the link to it carries less than \
                     that in time; the batch is sent again until it is answered. The wait is \
                     the producer's request.timeout.ms, at most a fifth of the consumer's \
                     max.poll.interval.ms: raise them if the link is merely this slow"
                );
            }
            return;
        }
        let budget = (bytes / 2).max(1);
        tracing::info!(
            "target broker {broker} did not answer a Produce of {batches} batches ({bytes} \
             bytes) within {wait:?}: its next rounds carry at most {budget} bytes (a link \
             slower than the round), growing again as answers come in time"
        );
        self.budgets.insert(broker, budget);
    }

    /// The most batch bytes one Produce request to `broker` carries.
    fn cap_of(&self, broker: i32) -> usize {
        self.closings
            .get(&broker)
            .map_or(self.request_cap, |c| c.cap.min(self.request_cap))
    }

    /// `broker` closed the connection on Produce requests of `bytes` batch bytes at the
    /// least, without answering them ([`Closings`]): its requests carry at most half of that
    /// for now (never less than [`LEAST_LEARNT_CAP`]), and the batches are sent again with
    /// the same sequences. Said at warn when the cap is lowered; a closing on a request no
    /// larger than [`LEAST_LEARNT_CAP`] is said once until the broker answers again.
    fn closed_on(&mut self, broker: i32, bytes: usize) {
        if bytes <= LEAST_LEARNT_CAP {
            if self.closing_said.insert(broker) {
                tracing::warn!(
                    "target broker {broker} closed the connection on a Produce request of \
                     {bytes} bytes without answering it; its batches are sent again (the \
                     broker going away, or refusing this client: the broker's log says which)"
                );
            }
            return;
        }
        let now = Instant::now();
        let closings = self
            .closings
            .entry(broker)
            .or_insert_with(|| Closings::new(now));
        let Some(cap) = closings
            .closed(bytes, now)
            .filter(|&cap| cap < self.request_cap)
        else {
            return;
        };
        self.closing_said.insert(broker);
        tracing::warn!(
            "target broker {broker} closed the connection on a Produce request of {bytes} \
             bytes of batches without answering it: requests to it carry at most {cap} bytes \
             from now on, growing back as rounds are answered, and one as large as that is \
             tried again in {PROBE_AFTER:?}; the batches are sent again. A broker closes a \
             connection on a request over its socket.request.max.bytes (set the producer's \
             message.max.bytes below it to start there), or when it goes away"
        );
    }

    /// Every request to `broker` of a round was answered: a cap its closings left grows back
    /// ([`Closings::grown`]).
    fn grow_back(&mut self, broker: i32) {
        self.closing_said.remove(&broker);
        let now = Instant::now();
        if self
            .closings
            .get_mut(&broker)
            .is_some_and(|c| !c.grown(now))
        {
            self.closings.remove(&broker);
        }
    }

    /// A Produce to `broker` was answered after `took`: a budget that it beat by four times
    /// doubles (lifted once large).
    fn answered(&mut self, broker: i32, took: Duration) {
        if took * 4 > self.cluster.timeout() {
            return;
        }
        if let Some(budget) = self.budgets.get_mut(&broker) {
            *budget = budget.saturating_mul(2);
            if *budget >= UNBOUNDED_FROM {
                self.budgets.remove(&broker);
            }
        }
    }

    fn request(&self, items: &[RoundItem<'_>], members: &[usize]) -> ProduceRequest {
        let mut topics: Vec<TopicProduceData> = Vec::new();
        for &n in members {
            let item = &items[n];
            let data = PartitionProduceData::default()
                .with_index(item.partition)
                .with_records(Some(item.batch.clone()));
            match topics.iter_mut().find(|t| t.name.0.as_str() == item.topic) {
                Some(t) => t.partition_data.push(data),
                None => topics.push(
                    TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_string(item.topic.to_owned())))
                        .with_partition_data(vec![data]),
                ),
            }
        }
        ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(self.timeout_ms)
            .with_topic_data(topics)
    }
}

/// Splits a broker's round (the batches' sizes) into at most `lanes` requests of about equal
/// bytes: the largest batch first, each into the lightest request so far. Indices into
/// `sizes`, ascending within a request; no request is empty.
fn split_lanes(sizes: &[usize], lanes: usize) -> Vec<Vec<usize>> {
    let lanes = lanes.clamp(1, sizes.len().max(1));
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(sizes[k]));
    let mut split: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); lanes];
    for k in order {
        let lightest = split
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("at least one lane");
        lightest.0 += sizes[k];
        lightest.1.push(k);
    }
    split
        .into_iter()
        .filter(|(_, picked)| !picked.is_empty())
        .map(|(_, mut picked)| {
            picked.sort_unstable();
            picked
        })
        .collect()
}

/// Splits a broker's round (the batches' sizes, in the order the round admits them) into at
/// most `lanes` requests of at most `cap` bytes each, a request of one batch excepted (nothing
/// divides it): balanced by [`split_lanes`] when that fits, otherwise each batch in turn into
/// the lightest request it fits in, so that the batches first in the round go first, and what
/// fits in none deferred. (requests, deferred), as indices into `sizes`.
fn pack_lanes(sizes: &[usize], lanes: usize, cap: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let balanced = split_lanes(sizes, lanes);
    let fits = |picked: &Vec<usize>| {
        picked.len() == 1 || picked.iter().map(|&k| sizes[k]).sum::<usize>() <= cap
    };
    if balanced.iter().all(fits) {
        return (balanced, Vec::new());
    }
    let mut split: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); lanes.max(1)];
    let mut deferred = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        let lightest = split
            .iter_mut()
            .filter(|(bytes, picked)| picked.is_empty() || bytes + size <= cap)
            .min_by_key(|(bytes, _)| *bytes);
        match lightest {
            Some((bytes, picked)) => {
                *bytes += size;
                picked.push(k);
            }
            None => deferred.push(k),
        }
    }
    let requests = split
        .into_iter()
        .filter(|(_, picked)| !picked.is_empty())
        .map(|(_, picked)| picked)
        .collect();
    (requests, deferred)
}

/// Errors the protocol calls retriable, for a Produce.
fn retriable(code: i16) -> bool {
    kafka_protocol::error::ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_split_into_lanes_of_about_equal_bytes() {
        let sizes = [900, 100, 500, 400, 300, 300, 200, 100];
        let split = split_lanes(&sizes, 4);
        assert_eq!(split.len(), 4);
        let bytes: Vec<usize> = split
            .iter()
            .map(|lane| lane.iter().map(|&k| sizes[k]).sum())
            .collect();
        assert_eq!(bytes.iter().sum::<usize>(), 2800);
        assert!(
            bytes.iter().max().unwrap() - bytes.iter().min().unwrap() <= 300,
            "{bytes:?}"
        );
        let mut all: Vec<usize> = split.concat();
        all.sort_unstable();
        assert_eq!(all, (0..sizes.len()).collect::<Vec<_>>(), "each batch once");
    }

    /// The outcome of one batch of `orders/0` answered with `code`.
    fn answered(code: i16) -> Outcome {
        answered_naming(code, &[])
    }

    /// The same, the answer naming the records at `indexes` as the cause.
    fn answered_naming(code: i16, indexes: &[i32]) -> Outcome {
        use kafka_protocol::messages::produce_response::{
            BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
        };
        let items = [RoundItem {
            topic: "orders",
            partition: 0,
            batch: Bytes::new(),
        }];
        let named = indexes
            .iter()
            .map(|&i| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(i)
                    .with_batch_index_error_message(Some(StrBytes::from_static_str("too old")))
            })
            .collect();
        let partition = PartitionProduceResponse::default()
            .with_index(0)
            .with_error_code(code)
            .with_record_errors(named);
        let response =
            ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_static_str("orders")))
                .with_partition_responses(vec![partition])]);
        let mut outcomes = vec![None];
        BatchProducer::read_answer(&items, &[0], &response, &mut outcomes, &mut false);
        outcomes.pop().flatten().expect("an outcome")
    }

    /// A sequence gap is not a refusal of the batch: the producer starts again under a new
    /// producer id and sends it again.
    #[test]
    fn a_sequence_gap_is_not_a_refusal_of_the_batch() {
        assert!(matches!(answered(45), Outcome::Gap), "{:?}", answered(45));
    }

    /// A refusal of the batch itself (here an invalid timestamp) is a send failure.
    #[test]
    fn a_refusal_of_the_batch_itself_is_a_send_failure() {
        match answered(32) {
            Outcome::Refused { code, .. } => assert_eq!(code, "InvalidTimestamp"),
            other => panic!("{other:?}"),
        }
    }

    /// The records a refusal names (Produce v8 and later) reach the stream, which skips only
    /// them in skip mode.
    #[test]
    fn a_refusal_names_the_records_the_target_gave_as_its_cause() {
        match answered_naming(32, &[3, 7]) {
            Outcome::Refused { records, .. } => {
                let named: Vec<(usize, &str)> = records
                    .iter()
                    .map(|r| (r.index, r.message.as_str()))
                    .collect();
                assert_eq!(named, [(3, "too old"), (7, "too old")]);
            }
            other => panic!("{other:?}"),
        }
    }

    const MB: usize = 1_000_000;

    #[test]
    fn requests_within_the_cap_are_balanced_as_without_it() {
        let sizes = [4 * MB, MB, MB, MB, MB];
        assert_eq!(
            pack_lanes(&sizes, 2, 4 * MB),
            (split_lanes(&sizes, 2), vec![])
        );
    }

    #[test]
    fn no_request_carries_more_than_the_cap_and_what_fits_nowhere_waits() {
        let sizes = [MB; 16];
        let (requests, deferred) = pack_lanes(&sizes, 4, 2 * MB + MB / 2);
        assert_eq!(requests.len(), 4);
        for r in &requests {
            assert_eq!(r.len(), 2, "{requests:?}");
        }
        // The first in the round's order go first: the partition whose turn it is.
        let mut sent: Vec<usize> = requests.concat();
        sent.sort_unstable();
        assert_eq!(sent, (0..8).collect::<Vec<_>>());
        assert_eq!(deferred, (8..16).collect::<Vec<_>>());
    }

    #[test]
    fn a_closing_halves_requests_until_a_probe_is_due_then_they_grow_back() {
        // A broker restarting under a round of 4 MB requests.
        let t0 = Instant::now();
        let mut c = Closings::new(t0);
        assert_eq!(c.closed(4 * MB, t0), Some(2 * MB));
        for _ in 0..10 {
            assert!(c.grown(t0 + Duration::from_secs(1)));
            assert_eq!(
                c.cap,
                2 * MB,
                "not back to what was closed on before the probe"
            );
        }
        let later = t0 + PROBE_AFTER;
        let mut rounds = 0;
        while c.grown(later) {
            rounds += 1;
        }
        assert!(rounds < 8, "lifted after {rounds} answered rounds");
    }

    #[test]
    fn a_limit_costs_one_closing_a_probe_and_the_cap_stays_under_it() {
        // A broker taking 1.5 MiB: 4 MB closed on, then 2 MB, then 1 MiB answered.
        let t0 = Instant::now();
        let mut c = Closings::new(t0);
        assert_eq!(c.closed(4 * MB, t0), Some(2 * MB));
        assert_eq!(c.closed(2 * MB, t0), Some(LEAST_LEARNT_CAP));
        assert!(c.grown(t0));
        assert_eq!(
            c.cap, LEAST_LEARNT_CAP,
            "2 MB closed on: not tried before the probe"
        );
        // The probe, closed on again: no lower, and the next probe later.
        let probe = t0 + PROBE_AFTER;
        assert!(c.grown(probe));
        assert_eq!(c.cap, 2 * LEAST_LEARNT_CAP);
        assert_eq!(
            c.closed(2 * LEAST_LEARNT_CAP, probe),
            Some(LEAST_LEARNT_CAP)
        );
        assert_eq!(c.probe_at, probe + PROBE_AFTER);
    }

    #[test]
    fn a_batch_larger_than_the_cap_goes_alone() {
        let sizes = [5 * MB, MB, MB, MB, MB];
        assert_eq!(
            pack_lanes(&sizes, 2, 2 * MB),
            (vec![vec![0], vec![1, 2]], vec![3, 4])
        );
    }

    #[test]
    fn a_round_of_fewer_batches_than_lanes_has_one_request_a_batch() {
        assert_eq!(split_lanes(&[10, 20], 4), vec![vec![1], vec![0]]);
        assert_eq!(split_lanes(&[10], 4), vec![vec![0]]);
        assert!(split_lanes(&[], 4).is_empty());
    }
}
