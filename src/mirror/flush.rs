//! Waits for a producer's delivery reports, for both stream kinds; the drain of a release
//! ([`drain`]): purge, and wait for the requests on the wire; and the one way to hand a
//! record to a producer whose queue may be full ([`send_waiting`]), which the tools, the
//! tests and the benchmark share.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::{
    BaseProducer, BaseRecord, Producer, ProducerContext, PurgeConfig, ThreadedProducer,
};

use super::state::Stats;
use crate::native::produce::send_lingering;
use crate::settings::client::ClientProps;

/// How long a wait for delivery reports waits when none was waiting ([`flush`],
/// [`serve_deliveries`]).
const REPORT_WAIT_STEP: Duration = Duration::from_millis(1);

/// What the waits of this module need of a producer, or of a stream's producers together
/// ([`Producers`](crate::mirror::at_least_once::producers::Producers)).
pub(crate) trait Reports {
    /// Serves waiting delivery reports: at most one event per producer.
    fn serve(&self);
    /// Records handed over and not yet reported.
    fn in_flight(&self) -> i32;
    /// Waits `wait` while librdkafka sends at once what it holds back for `linger.ms`
    /// ([`send_lingering`]); serves no report.
    fn send_held(&self, wait: Duration);
    /// Purges what is queued and not yet on the wire.
    fn purge_queued(&self);
}

impl<C: ProducerContext> Reports for BaseProducer<C> {
    fn serve(&self) {
        self.poll(Duration::ZERO);
    }

    fn in_flight(&self) -> i32 {
        self.in_flight_count()
    }

    fn send_held(&self, wait: Duration) {
        send_lingering(self, wait);
    }

    fn purge_queued(&self) {
        self.purge(PurgeConfig::default().queue());
    }
}

impl<R: Reports + ?Sized> Reports for std::sync::Arc<R> {
    fn serve(&self) {
        (**self).serve();
    }

    fn in_flight(&self) -> i32 {
        (**self).in_flight()
    }

    fn send_held(&self, wait: Duration) {
        (**self).send_held(wait);
    }

    fn purge_queued(&self) {
        (**self).purge_queued();
    }
}

/// Waits until every record handed to `producer` has its delivery report served, for at most
/// `timeout`; fails with the librdkafka timeout error otherwise. Not rust-rdkafka's own
/// `flush`: it waits in steps of 100 ms that each last their whole 100 ms, so a flush of
/// anything took 100 ms at least, and an exactly-once transaction (a flush, then the commit's
/// own flush) 200 ms. Nor `poll` with a short timeout: below a millisecond left, it polls
/// without waiting, in a loop (a spinning core). Here each waiting report is served at once,
/// and the thread waits a millisecond only when none was waiting, in a librdkafka flush
/// ([`Reports::send_held`]): what librdkafka holds back for `linger.ms` goes at once, so a
/// revocation's, a shutdown's or a transaction's flush does not wait the linger out.
pub(crate) fn flush<R: Reports + ?Sized>(producer: &R, timeout: Duration) -> KafkaResult<()> {
    flush_unless_stopped(producer, timeout, || false, Duration::ZERO)
}

/// Like [`flush`], for a wait that may outlast a stop (a revocation's, up to most of
/// `max.poll.interval.ms`): once `stopped()` says a stop is requested, the wait goes on for
/// at most `after_stop` more (the stop's own bound, `--shutdown.timeout.ms`).
pub(crate) fn flush_unless_stopped<R: Reports + ?Sized>(
    producer: &R,
    timeout: Duration,
    stopped: impl Fn() -> bool,
    after_stop: Duration,
) -> KafkaResult<()> {
    let mut deadline = StopBound::new(timeout, after_stop);
    let mut in_flight = producer.in_flight();
    while in_flight > 0 {
        // Serves at most one event (a batch of delivery reports, or another event librdkafka
        // counts in flight: statistics), before the deadline is looked at, so that a flush
        // with no time left still ends well when nothing but such an event was waiting.
        producer.serve();
        let left = producer.in_flight();
        if left > 0 {
            if deadline.passed(&stopped) {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            if left == in_flight {
                // Not a sleep: records librdkafka holds for `linger.ms` would wait it out (a
                // minute if the producer file says so), the flush's whole bound.
                producer.send_held(REPORT_WAIT_STEP);
            }
        }
        in_flight = left;
    }
    Ok(())
}

/// The end of a wait that may outlast a stop: `bound` from its start, cut to `after_stop`
/// from the moment a stop is first seen.
struct StopBound {
    at: Instant,
    after_stop: Duration,
    stop_seen: bool,
}

impl StopBound {
    fn new(bound: Duration, after_stop: Duration) -> StopBound {
        StopBound {
            at: Instant::now() + bound,
            after_stop,
            stop_seen: false,
        }
    }

    /// Whether the wait is over, asking `stopped()` until it first says yes.
    fn passed(&mut self, stopped: &impl Fn() -> bool) -> bool {
        if !self.stop_seen && stopped() {
            self.stop_seen = true;
            self.at = self.at.min(Instant::now() + self.after_stop);
        }
        Instant::now() >= self.at
    }
}

/// How often [`drain`] purges again what librdkafka queued anew.
const PURGE_STEP: Duration = Duration::from_millis(10);

/// How long a produce request may wait for its answer: the producer config's
/// `request.timeout.ms` (librdkafka's default, 30 s).
pub(crate) fn request_timeout(producer: &ClientProps) -> Duration {
    producer.request_timeout()
}

/// Empties `producer` before partitions are released: purges every record still queued
/// (never sent), then waits until nothing handed to it is left, purging again, every 10 ms,
/// what librdkafka queues anew meanwhile: the records of a request on the wire that fails
/// retriably (a connection reset, a retriable error code) go back to its queue and would be
/// sent again after the release, among the next owner's copies. A request answered in time is
/// settled either way: acknowledged (it lies before anything the next owner writes) or
/// purged (it never reaches the target). Waits at most `bound` (cut to `after_stop` once
/// `stopped()`, as [`flush_unless_stopped`]); fails with the librdkafka timeout error if
/// something is still in flight then.
pub(crate) fn drain<R: Reports + ?Sized>(
    producer: &R,
    bound: Duration,
    stopped: impl Fn() -> bool,
    after_stop: Duration,
) -> KafkaResult<()> {
    let mut deadline = StopBound::new(bound, after_stop);
    let mut purged_at: Option<Instant> = None;
    loop {
        if purged_at.is_none_or(|at| at.elapsed() >= PURGE_STEP) {
            producer.purge_queued();
            purged_at = Some(Instant::now());
        }
        // Serves at most one event (a batch of delivery reports).
        producer.serve();
        if producer.in_flight() == 0 {
            return Ok(());
        }
        if deadline.passed(&stopped) {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        std::thread::sleep(REPORT_WAIT_STEP);
    }
}

/// Serves a producer's delivery reports for about `wait`, returning as soon as one
/// acknowledged something (the caller looks again at what it waits for).
///
/// Not `producer.poll(wait)`: rust-rdkafka's poll goes on until its deadline and hands
/// librdkafka the time left in whole milliseconds, so the last partial millisecond of every
/// wait is a loop of zero-timeout polls. The benchmark's profile of a stream waiting for room
/// (1 KiB records, the target the bottleneck) had 30% of the thread reading the clock.
pub(crate) fn serve_deliveries<R: Reports + ?Sized>(producer: &R, stats: &Stats, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        let acknowledged = Stats::get(&stats.acknowledged);
        producer.serve();
        if Stats::get(&stats.acknowledged) != acknowledged {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(REPORT_WAIT_STEP));
    }
}

/// A delivery report that says the record was purged (partitions released while it was
/// queued, a shutdown flush that timed out) or the producer closed: not acknowledged, not
/// failed either; it stays uncommitted.
pub(crate) fn purged(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
                | RDKafkaErrorCode::BrokerDestroy
        )
    )
}

/// A producer a record can be handed to: rust-rdkafka's `BaseProducer`, whose delivery reports
/// its caller serves, and `ThreadedProducer`, whose own thread serves them.
pub trait RecordQueue {
    type Context: ProducerContext;

    /// `send` of the producer: on an error the record is handed back.
    #[allow(clippy::type_complexity, clippy::result_large_err)] // rust-rdkafka's own send signature
    fn try_send<'a, K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        &self,
        record: Record<'a, K, P, Self::Context>,
    ) -> Result<(), (KafkaError, Record<'a, K, P, Self::Context>)>;

    /// Lets the queue drain a little: serves waiting delivery reports, or waits a step.
    fn make_room(&self);
}

/// A record for a producer of context `C`.
pub type Record<'a, K, P, C> = BaseRecord<'a, K, P, <C as ProducerContext>::DeliveryOpaque>;

impl<C: ProducerContext> RecordQueue for BaseProducer<C> {
    type Context = C;

    fn try_send<'a, K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        &self,
        record: Record<'a, K, P, C>,
    ) -> Result<(), (KafkaError, Record<'a, K, P, C>)> {
        self.send(record)
    }

    fn make_room(&self) {
        // Not poll(step): rust-rdkafka's poll spins through its last partial millisecond.
        self.poll(Duration::ZERO);
        std::thread::sleep(REPORT_WAIT_STEP);
    }
}

impl<C: ProducerContext + 'static> RecordQueue for ThreadedProducer<C> {
    type Context = C;

    fn try_send<'a, K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        &self,
        record: Record<'a, K, P, C>,
    ) -> Result<(), (KafkaError, Record<'a, K, P, C>)> {
        self.send(record)
    }

    fn make_room(&self) {
        std::thread::sleep(REPORT_WAIT_STEP);
    }
}

/// Hands `record` to `producer`, waiting out a full queue for at most `patience` (`None`: as
/// long as it takes); any other refusal, or a queue still full after `patience`, is the
/// producer's error.
pub fn send_waiting<Q: RecordQueue, K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
    producer: &Q,
    mut record: Record<'_, K, P, Q::Context>,
    patience: Option<Duration>,
) -> KafkaResult<()> {
    let deadline = patience.map(|p| Instant::now() + p);
    loop {
        match producer.try_send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if deadline.is_none_or(|d| Instant::now() < d) =>
            {
                record = back;
                producer.make_room();
            }
            Err((e, _)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdkafka::config::ClientConfig;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

    use super::flush;

    const TOPIC: &str = "orders";

    /// A mock target with `TOPIC`, and a producer to it with the config `key` = `value`.
    fn producer_with(
        key: &str,
        value: &str,
    ) -> (MockCluster<'static, DefaultProducerContext>, BaseProducer) {
        let cluster = MockCluster::new(1).expect("a mock cluster");
        cluster.create_topic(TOPIC, 1, 1).expect("the topic");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set(key, value)
            .create()
            .expect("a producer");
        (cluster, producer)
    }

    #[test]
    fn a_flush_with_no_time_left_ends_well_when_only_statistics_wait() {
        let (_cluster, producer) = producer_with("statistics.interval.ms", "1000");
        // A statistics event queues up (one a second: not two before the flush, which serves
        // one event a step); no record was ever handed over.
        let deadline = Instant::now() + Duration::from_secs(10);
        while producer.in_flight_count() == 0 {
            assert!(Instant::now() < deadline, "no statistics event was queued");
            std::thread::sleep(Duration::from_millis(50));
        }
        // A revocation's flush while stopping has no time left (`timeout` zero).
        flush(&producer, Duration::ZERO).expect("nothing unreported: the flush ends well");
    }

    #[test]
    fn a_flush_sends_what_linger_ms_holds_back_at_once() {
        // It holds records for a minute.
        let (_cluster, producer) = producer_with("linger.ms", "60000");
        producer
            .send(BaseRecord::to(TOPIC).key("k").payload("v"))
            .expect("queued");
        let started = Instant::now();
        // A revocation's flush waits far less than the linger: it must not wait it out.
        flush(&producer, Duration::from_secs(10)).unwrap_or_else(|e| {
            panic!(
                "the record held for linger.ms (60 s) was not sent by the flush: {e} after {:?}",
                started.elapsed()
            )
        });
    }
}
