//! A stream's target producers (one by default, `--producers.per.stream`): each target
//! partition always through the same one, so its records stay in order; and the cut of
//! `linger.ms` when the stream has caught up with its source.
//!
//! The record engine's latency came from two places (a trickle of 1,000 records/s over 16
//! partitions, one stream: the median record 8–13 ms later on the target, MirrorMaker 1's
//! 1–3 ms; docs/benchmark.md):
//! - librdkafka holds each partition's records for `linger.ms` (5 ms) hoping for more. A
//!   stream that has read everything there is ([`Producers::cut_linger`]) knows no more
//!   are coming, and has librdkafka send at once: a trickle goes out record by record, a
//!   backlog still in full batches;
//! - librdkafka puts one partition in each Produce request (confluentinc/librdkafka#1700)
//!   and a Kafka broker serves one request per connection at a time, so a trickle over many
//!   partitions queues at the broker. Several producers are several connections; it costs
//!   throughput with small records, so it is a choice, not the default.

use std::ffi::CStr;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rdkafka::error::KafkaResult;
use rdkafka::producer::{Producer, PurgeConfig};

use super::delivery::{DeliveryContext, MirrorProducer};
use crate::mirror::flush::Reports;
use crate::mirror::limits::TargetLimits;
use crate::mirror::state::StreamShared;
use crate::native::produce::send_lingering;
use crate::settings::Settings;

/// A stream's producers.
pub(crate) struct Producers {
    set: Arc<Set>,
    /// Asks the stream's linger cutter (a thread of its own) for a round; `None` if it could
    /// not be started: the stream's own thread cuts, waiting [`LINGER_CUT`] for each producer.
    cutter: Option<SyncSender<()>>,
}

/// The producers, shared with the linger cutter.
struct Set {
    producers: Vec<Arc<MirrorProducer>>,
    /// Per producer: records handed to it since it was last seen with nothing in flight (0:
    /// none). A count, not a flag, so that the cutter's reset after finding nothing in
    /// flight cannot erase a record handed over meanwhile.
    handed: Vec<AtomicU64>,
}

/// How long each cut of `linger.ms` lasts: records handed to the producer meanwhile go at
/// once too.
const LINGER_CUT: Duration = Duration::from_millis(1);

impl Producers {
    /// `count` producers of the target config, their delivery reports feeding `shared`.
    pub(crate) fn new(
        settings: &Settings,
        shared: &Arc<StreamShared>,
        limits: &Arc<TargetLimits>,
        count: usize,
    ) -> KafkaResult<Producers> {
        let mut producers = Vec::with_capacity(count.max(1));
        for _ in 0..count.max(1) {
            let producer: MirrorProducer =
                settings
                    .producer
                    .client_config()
                    .create_with_context(DeliveryContext {
                        shared: shared.clone(),
                        limits: limits.clone(),
                        producer: OnceLock::new(),
                    })?;
            let producer = Arc::new(producer);
            let _ = producer.context().producer.set(Arc::downgrade(&producer));
            producers.push(producer);
        }
        let handed = producers.iter().map(|_| AtomicU64::new(0)).collect();
        let set = Arc::new(Set { producers, handed });
        // The cutter waits out each cut, so the stream's thread does not: it goes on reading
        // the source, and what it hands over during a cut goes at once too. It ends with the
        // stream (its channel closed).
        let (ask, asked) = sync_channel::<()>(1);
        let cut = set.clone();
        let cutter = std::thread::Builder::new()
            .name(format!("linger-cut-{}", shared.stream))
            .spawn(move || {
                while asked.recv().is_ok() {
                    cut.cut_linger();
                }
            })
            .map_err(|e| {
                tracing::debug!(
                    stream = shared.stream,
                    "no linger cutter thread ({e}): the stream cuts the linger itself"
                );
            })
            .ok()
            .map(|_| ask);
        Ok(Producers { set, cutter })
    }

    /// The producer of target partition `topic`/`partition`, with its index for
    /// [`Self::handed`]: always the same one. A record with no partition (`--partitioning
    /// hash`: librdkafka's partitioner picks it) goes through the first, so that records of
    /// one key stay in order.
    pub(crate) fn of(&self, topic: &CStr, partition: Option<i32>) -> (usize, &MirrorProducer) {
        let i = index_of(topic, partition, self.set.producers.len());
        (i, &self.set.producers[i])
    }

    /// Producer `i` (as [`Self::of`] gave it) took a record: the next cut of the linger
    /// covers it.
    pub(crate) fn handed(&self, i: usize) {
        self.set.handed[i].fetch_add(1, Ordering::SeqCst);
    }

    /// Every producer.
    pub(crate) fn all(&self) -> impl Iterator<Item = &MirrorProducer> {
        self.set.producers.iter().map(|p| &**p)
    }

    /// Records handed to any of them and not yet reported.
    pub(crate) fn in_flight_count(&self) -> i32 {
        self.all().map(Producer::in_flight_count).sum()
    }

    /// The stream has read everything there is: what the producers hold back for
    /// `linger.ms`, hoping for more records, goes now (see [`Set::cut_linger`]). Does not
    /// wait: a cut already asked for and not yet begun covers this one.
    pub(crate) fn cut_linger(&self) {
        match &self.cutter {
            Some(ask) => {
                let _ = ask.try_send(());
            }
            None => self.set.cut_linger(),
        }
    }

    /// Purges each producer as `config` says.
    pub(crate) fn purge(&self, config: PurgeConfig) {
        for p in self.all() {
            p.purge(config);
        }
    }
}

impl Set {
    /// Has each producer handed a record since it last had nothing in flight send what it
    /// holds back, for [`LINGER_CUT`] each ([`send_lingering`]). Not only those handed one
    /// since the last cut: a producer that could not send then (its producer id not yet
    /// granted, its broker away) would hold its records for the whole linger.
    fn cut_linger(&self) {
        for (p, handed) in self.producers.iter().zip(&self.handed) {
            let seen = handed.load(Ordering::SeqCst);
            if seen == 0 {
                continue;
            }
            if p.in_flight_count() > 0 {
                send_lingering(p, LINGER_CUT);
            } else {
                // Unless a record was handed over since `seen` was read.
                let _ = handed.compare_exchange(seen, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }
}

impl Reports for Producers {
    fn serve(&self) {
        for p in self.all() {
            p.serve();
        }
    }

    fn in_flight(&self) -> i32 {
        self.in_flight_count()
    }

    fn send_held(&self, wait: Duration) {
        // Each producer that holds records, in turn: each has its own broker threads.
        for p in self.all().filter(|p| p.in_flight_count() > 0) {
            p.send_held(wait);
        }
    }

    fn purge_queued(&self) {
        for p in self.all() {
            p.purge_queued();
        }
    }
}

/// Which of `count` producers target partition `topic`/`partition` goes through.
fn index_of(topic: &CStr, partition: Option<i32>, count: usize) -> usize {
    match partition {
        Some(p) if count > 1 => {
            // DefaultHasher::new has fixed keys: the same producer for the stream's whole life.
            let mut h = std::collections::hash_map::DefaultHasher::new();
            topic.hash(&mut h);
            (h.finish() as usize).wrapping_add(p.unsigned_abs() as usize) % count
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> std::ffi::CString {
        std::ffi::CString::new(s).expect("name")
    }

    #[test]
    fn a_partition_always_goes_through_the_same_producer() {
        let orders = name("orders");
        for p in 0..64 {
            assert_eq!(index_of(&orders, Some(p), 4), index_of(&orders, Some(p), 4));
        }
    }

    #[test]
    fn the_partitions_of_a_topic_spread_evenly_over_the_producers() {
        let orders = name("orders");
        let mut per_producer = [0; 4];
        for p in 0..16 {
            per_producer[index_of(&orders, Some(p), 4)] += 1;
        }
        assert_eq!(per_producer, [4, 4, 4, 4]);
    }

    #[test]
    fn records_without_a_partition_share_the_first_producer() {
        assert_eq!(index_of(&name("orders"), None, 4), 0);
        assert_eq!(index_of(&name("payments"), None, 4), 0);
    }

    #[test]
    fn one_producer_takes_everything() {
        assert_eq!(index_of(&name("orders"), Some(7), 1), 0);
    }
}
