//! The source side of a stream: our own poll of the consumer's queue.
//!
//! rust-rdkafka's `BaseConsumer::poll` wraps every consumed message's event in an `Arc`, one
//! heap allocation per record. This poll reads the same queue through librdkafka's event API
//! and hands the record out as a [`Record`] that owns the event directly, so a record costs no
//! allocation of ours. Every other event is dispatched as rust-rdkafka does it: rebalances to
//! the consumer context's `rebalance` (which runs our listener and assigns), commit results to
//! `commit_callback`, statistics and logs to the context; errors are returned to the caller
//! (as rust-rdkafka's poll returns them), which applies its one error policy.

use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::topic_partition_list::TopicPartitionList;

use super::record::Record;
use super::NativePtr;

/// The source consumer with our own reference to its queue (where librdkafka also forwards
/// the main queue: rebalances, statistics, logs and errors arrive there too). Together, so that
/// the queue is always released before the consumer and only ever polled with its own.
pub struct Source<C: ConsumerContext> {
    /// Declared first: released before `consumer` is dropped.
    queue: NativePtr<rdsys::rd_kafka_queue_t>,
    consumer: BaseConsumer<C>,
}

// SAFETY: a librdkafka queue handle may be used from any thread; it moves with its consumer,
// which is `Send` itself when its context is.
unsafe impl<C: ConsumerContext + Send> Send for Source<C> {}

/// What one poll returned.
pub enum Polled<'a> {
    /// Nothing within the timeout, or an event that was served (a rebalance, a log line).
    Nothing,
    Record(Record<'a>),
    /// An error the consumer reports (including end of partition, when enabled), with
    /// librdkafka's text for it. The context does not hear of it: the caller decides.
    Error {
        error: KafkaError,
        reason: String,
    },
}

impl<C: ConsumerContext> Source<C> {
    /// The OAuth refresh event is dropped below as rust-rdkafka drops it for a context that
    /// does not refresh tokens; a context that did would need it handled here.
    const NO_OAUTH_REFRESH: () = assert!(!C::ENABLE_REFRESH_OAUTH_TOKEN);

    /// `None` if the consumer has no group (no consumer queue to read).
    pub fn new(consumer: BaseConsumer<C>) -> Option<Source<C>> {
        #[allow(clippy::let_unit_value)]
        let () = Self::NO_OAUTH_REFRESH;
        // SAFETY: the client pointer is live while we hold `consumer`; the call returns a
        // new reference (or null) that this value owns and releases once, before the
        // consumer (field order).
        let queue = unsafe {
            NativePtr::from_ptr(rdsys::rd_kafka_queue_get_consumer(
                consumer.client().native_ptr(),
            ))
        };
        queue.map(|queue| Source { queue, consumer })
    }

    pub fn consumer(&self) -> &BaseConsumer<C> {
        &self.consumer
    }

    /// The events waiting on the queue now (records, rebalances, commit results, logs,
    /// statistics): a caller that polls with a zero timeout serves one of them a call.
    pub fn queued(&self) -> usize {
        // SAFETY: `self.queue` is a live queue reference owned by `self`; the call only reads
        // its length.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.ptr()) }
    }

    /// Commits `offsets` asynchronously; the result comes back through this queue as an
    /// offset-commit event, served by [`Source::poll`] to the context's `commit_callback`.
    /// (librdkafka's `rd_kafka_commit`, which rust-rdkafka calls, reports the result of an
    /// asynchronous commit to no one when the event API is used.)
    pub fn commit_async(&self, offsets: &TopicPartitionList) -> KafkaResult<()> {
        // SAFETY: the client and queue are live while `self` is; librdkafka copies the
        // partition list, which the borrow keeps alive for the call. No callback: with the
        // event API the result is an event on `self.queue`.
        let err = unsafe {
            rdsys::rd_kafka_commit_queue(
                self.consumer.client().native_ptr(),
                offsets.ptr(),
                self.queue.ptr(),
                None,
                std::ptr::null_mut(),
            )
        };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(KafkaError::ConsumerCommit(err.into()))
        }
    }

    /// Waits up to `timeout` for the next record, serving other events on the way. Returns
    /// after a rebalance even if time is left, as rust-rdkafka does, so that the caller sees
    /// the new assignment before the next record.
    pub fn poll(&self, timeout: Duration) -> Polled<'_> {
        let consumer = &self.consumer;
        // The clock is read only once the queue is found empty: while records are waiting,
        // a poll costs no time-keeping.
        let mut deadline: Option<Instant> = None;
        loop {
            let ms = deadline.map_or(0, |d| {
                let left = d.saturating_duration_since(Instant::now());
                c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
            });
            // SAFETY: `self.queue` is a live queue reference owned by `self`; the event
            // returned (or null) is ours to release.
            let event =
                unsafe { NativePtr::from_ptr(rdsys::rd_kafka_queue_poll(self.queue.ptr(), ms)) };
            let Some(event) = event else {
                let now = Instant::now();
                match deadline {
                    None if !timeout.is_zero() => deadline = Some(now + timeout),
                    Some(d) if now < d => {}
                    _ => return Polled::Nothing,
                }
                continue;
            };
            let event = Event(event);
            match event.kind() {
                rdsys::RD_KAFKA_EVENT_FETCH => {
                    if let Some(polled) = record(self, event) {
                        return polled;
                    }
                }
                rdsys::RD_KAFKA_EVENT_ERROR => {
                    if let Some(polled) = error(&event) {
                        return polled;
                    }
                }
                rdsys::RD_KAFKA_EVENT_REBALANCE => {
                    rebalance(consumer, &event);
                    return Polled::Nothing;
                }
                rdsys::RD_KAFKA_EVENT_OFFSET_COMMIT => {
                    commit_result(consumer, &event);
                    return Polled::Nothing;
                }
                rdsys::RD_KAFKA_EVENT_STATS => {
                    // SAFETY: a stats event's JSON is a NUL-terminated string it owns.
                    let json = unsafe { CStr::from_ptr(rdsys::rd_kafka_event_stats(event.ptr())) };
                    consumer.context().stats_raw(json.to_bytes());
                }
                rdsys::RD_KAFKA_EVENT_LOG => log(consumer, &event),
                // The context does not refresh OAuth tokens itself (rust-rdkafka drops the
                // event the same way); librdkafka's built-in methods refresh on their own.
                rdsys::RD_KAFKA_EVENT_OAUTHBEARER_TOKEN_REFRESH => {}
                _ => {
                    // SAFETY: the event's name is a static NUL-terminated string.
                    let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_event_name(event.ptr())) };
                    tracing::warn!("ignored event {:?} on the source consumer's queue", name);
                }
            }
            // A served event starts the clock too, so that a stream of them (say, debug
            // logging) cannot keep the caller from its timers.
            let now = Instant::now();
            match deadline {
                None => deadline = Some(now + timeout),
                Some(d) if now >= d => return Polled::Nothing,
                Some(_) => {}
            }
        }
    }
}

/// An event we own until dropped.
struct Event(NativePtr<rdsys::rd_kafka_event_t>);

impl Event {
    fn ptr(&self) -> *mut rdsys::rd_kafka_event_t {
        self.0.ptr()
    }

    fn kind(&self) -> rdsys::rd_kafka_event_type_t {
        // SAFETY: a live event.
        unsafe { rdsys::rd_kafka_event_type(self.ptr()) }
    }

    fn error(&self) -> rdsys::rd_kafka_resp_err_t {
        // SAFETY: a live event.
        unsafe { rdsys::rd_kafka_event_error(self.ptr()) }
    }

    /// The event's partition list as a `TopicPartitionList` of our own (a copy: rust-rdkafka
    /// cannot wrap a list the event owns): topic, partition, offset, leader epoch and error of
    /// each element. Only rebalances and commits, never per record.
    fn partitions(&self) -> TopicPartitionList {
        let copy = TopicPartitionList::new();
        // SAFETY: the list (or null) belongs to the live event; its `cnt` elements are
        // initialised, and each element's topic is a NUL-terminated string, which
        // rd_kafka_topic_partition_list_add copies into an element of `copy` (ours).
        unsafe {
            let Some(list) = rdsys::rd_kafka_event_topic_partition_list(self.ptr()).as_ref() else {
                return copy;
            };
            if list.elems.is_null() {
                return copy;
            }
            let elems = std::slice::from_raw_parts(list.elems, list.cnt.max(0) as usize);
            for e in elems {
                let added =
                    rdsys::rd_kafka_topic_partition_list_add(copy.ptr(), e.topic, e.partition);
                (*added).offset = e.offset;
                (*added).err = e.err;
                rdsys::rd_kafka_topic_partition_set_leader_epoch(
                    added,
                    rdsys::rd_kafka_topic_partition_get_leader_epoch(e),
                );
            }
        }
        copy
    }
}

/// A fetch event: the record, or the error the fetch carries instead. The record borrows
/// `source`, the queue it came from.
fn record<C: ConsumerContext>(_source: &Source<C>, event: Event) -> Option<Polled<'_>> {
    // SAFETY: a live fetch event; its message (or null) lives as long as the event.
    let message = unsafe { rdsys::rd_kafka_event_message_next(event.ptr()) };
    let message = NonNull::new(message.cast_mut())?;
    // SAFETY: as above.
    let m = unsafe { message.as_ref() };
    if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        let error = match m.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                KafkaError::PartitionEOF(m.partition)
            }
            e => KafkaError::MessageConsumption(e.into()),
        };
        let reason = error.to_string();
        return Some(Polled::Error { error, reason });
    }
    Some(Polled::Record(Record::new(event.0, message, PhantomData)))
}

/// An error event, for the caller (as rust-rdkafka's poll returns it).
fn error(event: &Event) -> Option<Polled<'static>> {
    let code = event.error();
    if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    // SAFETY: the error string of a live error event is NUL-terminated and owned by it.
    let reason = unsafe { CStr::from_ptr(rdsys::rd_kafka_event_error_string(event.ptr())) };
    let reason = reason.to_string_lossy().trim().to_owned();
    let error = if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
        // SAFETY: an end-of-partition event carries a partition that the caller owns (and
        // releases through `NativePtr`).
        let partition = unsafe {
            NativePtr::from_ptr(rdsys::rd_kafka_event_topic_partition(event.ptr()))
                .map_or(-1, |tp| (*tp.ptr()).partition)
        };
        KafkaError::PartitionEOF(partition)
    } else if
    // SAFETY: a live event.
    unsafe { rdsys::rd_kafka_event_error_is_fatal(event.ptr()) } != 0 {
        KafkaError::MessageConsumptionFatal(code.into())
    } else {
        KafkaError::MessageConsumption(code.into())
    };
    Some(Polled::Error { error, reason })
}

/// Assignment or revocation: the context's `rebalance` runs the internal listener, the user's,
/// and the (incremental) assign.
fn rebalance<C: ConsumerContext>(consumer: &BaseConsumer<C>, event: &Event) {
    let code = event.error();
    match code {
        rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS
        | rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
            let mut partitions = event.partitions();
            consumer
                .context()
                .rebalance(consumer, code, &mut partitions);
        }
        _ => tracing::warn!(
            "invalid rebalance event on the source consumer: {}",
            KafkaError::Rebalance(code.into())
        ),
    }
}

fn commit_result<C: ConsumerContext>(consumer: &BaseConsumer<C>, event: &Event) {
    let code = event.error();
    let result = if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::ConsumerCommit(code.into()))
    };
    consumer
        .context()
        .commit_callback(result, &event.partitions());
}

fn log<C: ConsumerContext>(consumer: &BaseConsumer<C>, event: &Event) {
    let mut facility: *const c_char = std::ptr::null();
    let mut message: *const c_char = std::ptr::null();
    let mut level: c_int = 0;
    // SAFETY: a live log event; on success both strings are NUL-terminated and owned by it.
    unsafe {
        if rdsys::rd_kafka_event_log(event.ptr(), &mut facility, &mut message, &mut level) != 0 {
            return;
        }
        let facility = CStr::from_ptr(facility).to_string_lossy();
        let message = CStr::from_ptr(message).to_string_lossy();
        consumer
            .context()
            .log(log_level(level), facility.trim(), message.trim());
    }
}

/// librdkafka's syslog levels.
fn log_level(level: c_int) -> RDKafkaLogLevel {
    match level {
        i32::MIN..=0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}
