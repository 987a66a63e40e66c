//! The source side of a stream: our own poll of the consumer's queue.
//!
//! rust-rdkafka's `BaseConsumer::poll` wraps every consumed message's event in an `Arc`, one
//! heap allocation per record. This poll reads the same queue through librdkafka's event API
//! and hands the record out as a [`Record`] that owns the event directly, so a record costs no
//! allocation of ours. Every other event is dispatched as rust-rdkafka does it: rebalances to
//! the consumer context's `rebalance` (which runs our listener and assigns), commit results to
//! `commit_callback`, statistics, logs and errors to the context.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::TopicPartitionList;

use crate::rebalance::MirrorConsumer;

/// The source consumer with our own reference to its queue (where librdkafka also forwards
/// the main queue: rebalances, statistics, logs and errors arrive there too). Together, so that
/// the queue is always released before the consumer and only ever polled with its own.
pub struct Source {
    /// Released in `drop`, before `consumer` is dropped.
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    consumer: MirrorConsumer,
}

// SAFETY: a librdkafka queue handle may be used from any thread; it moves with its consumer,
// which is `Send` itself.
unsafe impl Send for Source {}

// The OAuth refresh event is dropped below as rust-rdkafka drops it for a context that does
// not refresh tokens; a context that did would need it handled here.
const _: () =
    assert!(!<crate::rebalance::RebalanceContext as ClientContext>::ENABLE_REFRESH_OAUTH_TOKEN);

/// What one poll returned.
pub enum Polled<'a> {
    /// Nothing within the timeout, or an event that was served (a rebalance, a log line).
    Nothing,
    Record(Record<'a>),
    /// An error the consumer reports (including end of partition, when enabled).
    Error(KafkaError),
}

impl Source {
    /// `None` if the consumer has no group (no consumer queue to read).
    pub fn new(consumer: MirrorConsumer) -> Option<Source> {
        // SAFETY: the client pointer is live while we hold `consumer`; the call returns a
        // new reference (or null) that this value owns and releases in `drop`.
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        NonNull::new(queue).map(|queue| Source { queue, consumer })
    }

    pub fn consumer(&self) -> &MirrorConsumer {
        &self.consumer
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
            // SAFETY: `self.queue` is a live queue reference owned by `self`.
            let event = unsafe { rdsys::rd_kafka_queue_poll(self.queue.as_ptr(), ms) };
            let Some(event) = NonNull::new(event) else {
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
                    if let Some(polled) = record(event) {
                        return polled;
                    }
                }
                rdsys::RD_KAFKA_EVENT_ERROR => {
                    if let Some(error) = error(consumer, &event) {
                        return Polled::Error(error);
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

impl Drop for Source {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`, released once, while the consumer (dropped
        // after this) is still alive.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// An event we own until dropped.
struct Event(NonNull<rdsys::rd_kafka_event_t>);

impl Event {
    fn ptr(&self) -> *mut rdsys::rd_kafka_event_t {
        self.0.as_ptr()
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

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: we own the event (from rd_kafka_queue_poll); destroyed once. A fetch event's
        // message goes with it, which is why a `Record` keeps the event.
        unsafe { rdsys::rd_kafka_event_destroy(self.ptr()) }
    }
}

/// A fetch event: the record, or the error the fetch carries instead.
fn record<'a>(event: Event) -> Option<Polled<'a>> {
    // SAFETY: a live fetch event; its message (or null) lives as long as the event.
    let message = unsafe { rdsys::rd_kafka_event_message_next(event.ptr()) };
    let message = NonNull::new(message.cast_mut())?;
    // SAFETY: as above.
    let m = unsafe { message.as_ref() };
    if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Some(Polled::Error(match m.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                KafkaError::PartitionEOF(m.partition)
            }
            e => KafkaError::MessageConsumption(e.into()),
        }));
    }
    Some(Polled::Record(Record {
        _event: event,
        message,
        _borrow: PhantomData,
    }))
}

/// An error event: the context hears it first (as in rust-rdkafka), then the caller.
fn error(consumer: &MirrorConsumer, event: &Event) -> Option<KafkaError> {
    let code = event.error();
    if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    // SAFETY: the error string of a live error event is NUL-terminated and owned by it.
    let reason = unsafe { CStr::from_ptr(rdsys::rd_kafka_event_error_string(event.ptr())) };
    consumer.context().error(
        KafkaError::Global(code.into()),
        reason.to_string_lossy().trim(),
    );
    if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
        // SAFETY: an end-of-partition event carries a partition that the caller must free.
        let partition = unsafe {
            let tp = rdsys::rd_kafka_event_topic_partition(event.ptr());
            if tp.is_null() {
                -1
            } else {
                let p = (*tp).partition;
                rdsys::rd_kafka_topic_partition_destroy(tp);
                p
            }
        };
        return Some(KafkaError::PartitionEOF(partition));
    }
    // SAFETY: a live event.
    if unsafe { rdsys::rd_kafka_event_error_is_fatal(event.ptr()) } != 0 {
        Some(KafkaError::MessageConsumptionFatal(code.into()))
    } else {
        Some(KafkaError::MessageConsumption(code.into()))
    }
}

/// Assignment or revocation: the context's `rebalance` runs the internal listener, the user's,
/// and the (incremental) assign.
fn rebalance(consumer: &MirrorConsumer, event: &Event) {
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

fn commit_result(consumer: &MirrorConsumer, event: &Event) {
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

fn log(consumer: &MirrorConsumer, event: &Event) {
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

/// One consumed record, borrowed from librdkafka: its bytes stay in the fetch buffer until
/// the record is dropped.
pub struct Record<'a> {
    _event: Event,
    message: NonNull<rdsys::rd_kafka_message_t>,
    _borrow: PhantomData<&'a MirrorConsumer>,
}

impl Record<'_> {
    fn raw(&self) -> &rdsys::rd_kafka_message_t {
        // SAFETY: the message belongs to the event this record owns.
        unsafe { self.message.as_ref() }
    }

    fn ptr(&self) -> *const rdsys::rd_kafka_message_t {
        self.message.as_ptr()
    }

    pub fn topic(&self) -> &str {
        // SAFETY: a consumed message has its topic handle; the name is NUL-terminated and
        // lives as long as the handle, which the message holds.
        let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(self.raw().rkt)) };
        // Kafka topic names are ASCII (the brokers refuse others).
        name.to_str().unwrap_or("<topic name not UTF-8>")
    }

    pub fn partition(&self) -> i32 {
        self.raw().partition
    }

    pub fn offset(&self) -> i64 {
        self.raw().offset
    }

    pub fn key(&self) -> Option<&[u8]> {
        // SAFETY: the key belongs to the message, which lives as long as `self`.
        unsafe { bytes(self.raw().key, self.raw().key_len) }
    }

    pub fn payload(&self) -> Option<&[u8]> {
        // SAFETY: the payload belongs to the message, which lives as long as `self`.
        unsafe { bytes(self.raw().payload, self.raw().len) }
    }

    pub fn payload_len(&self) -> usize {
        if self.raw().payload.is_null() {
            0
        } else {
            self.raw().len
        }
    }

    /// Creation or log-append time in ms, if the record has one (-1 is none, as in
    /// rust-rdkafka; other negative times are kept as they are).
    pub fn timestamp(&self) -> Option<i64> {
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message; the call only reads it.
        let t = unsafe { rdsys::rd_kafka_message_timestamp(self.ptr(), &mut kind) };
        (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && t != -1)
            .then_some(t)
    }

    /// The record's header list (owned by the message, parsed by librdkafka on first use);
    /// null when it has none.
    pub fn header_list(&self) -> *const rdsys::rd_kafka_headers_t {
        let mut list = std::ptr::null_mut();
        // SAFETY: a live message; librdkafka points `list` at headers the message owns.
        let err = unsafe { rdsys::rd_kafka_message_headers(self.ptr(), &mut list) };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            list.cast_const()
        } else {
            std::ptr::null()
        }
    }

    /// The record's headers (parsed by librdkafka on first use), in order.
    pub fn headers(&self) -> impl Iterator<Item = Header<'_>> {
        let list = self.header_list();
        (0..).map_while(move |i| {
            if list.is_null() {
                return None;
            }
            let mut name: *const c_char = std::ptr::null();
            let mut value: *const c_void = std::ptr::null();
            let mut size = 0usize;
            // SAFETY: `list` belongs to the message, which outlives the iterator; on success
            // the name is NUL-terminated and the value is `size` bytes (or null), both owned
            // by the list.
            unsafe {
                if rdsys::rd_kafka_header_get_all(list, i, &mut name, &mut value, &mut size)
                    != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                {
                    return None;
                }
                Some(Header {
                    key: CStr::from_ptr(name).to_bytes(),
                    value: bytes(value, size),
                })
            }
        })
    }
}

/// One header of a consumed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A byte view of librdkafka memory; null is `None`.
///
/// # Safety
/// A non-null `ptr` must point at `len` readable bytes that stay valid and unchanged for 'a.
unsafe fn bytes<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: the caller's contract.
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}
