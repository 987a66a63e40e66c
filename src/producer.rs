//! The target side: a producer whose delivery reports feed the offset tracker.
//!
//! Each produced record carries its [`Ticket`] as the delivery opaque (a `usize`, no
//! allocation). An acknowledgement advances the tracker; a failure is either fatal
//! (`--abort.on.send.failure true`: the commit point stays below the record and the mirror
//! stops) or counted as dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use crate::control::{Control, Stats};
use crate::offsets::{OffsetTracker, Ticket};

pub type MirrorProducer = BaseProducer<DeliveryContext>;

/// State one stream shares between its loop, its producer's delivery callbacks and its
/// consumer's rebalance callbacks. All of them run on the stream's own thread, so the
/// tracker's mutex is never contended.
#[derive(Debug)]
pub struct StreamShared {
    pub stream: usize,
    pub tracker: Mutex<OffsetTracker>,
    pub control: Arc<Control>,
    pub stats: Arc<Stats>,
    pub abort_on_send_failure: bool,
    /// Set by the first assignment (possibly empty) this stream receives.
    pub assigned: AtomicBool,
    /// Whether the producer's latest statistics showed a target broker connected.
    pub target_up: AtomicBool,
    /// When the stream's loop last turned (ms since start), for the systemd watchdog.
    pub last_turn: std::sync::atomic::AtomicU64,
    /// Per assigned source partition, the consumer's lag in its latest statistics.
    pub lag: Mutex<Vec<(String, i32, i64)>>,
}

impl StreamShared {
    pub fn tracker(&self) -> MutexGuard<'_, OffsetTracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A record produced from `ticket` will never reach the target.
    pub fn send_failed(
        &self,
        ticket: Ticket,
        target_topic: &str,
        target_partition: Option<i32>,
        error: &KafkaError,
    ) {
        let reason = describe_send_error(error, target_topic, target_partition);
        self.stats.telemetry.count_send_error(
            error
                .rdkafka_error_code()
                .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}")),
        );
        let mut tracker = self.tracker();
        let source = match tracker.source_of(ticket) {
            Some(s) => format!("{}/{} offset {}", s.topic, s.partition, s.offset),
            None => "a record of a partition released since".to_owned(),
        };
        if self.abort_on_send_failure {
            tracker.fail(ticket);
            drop(tracker);
            self.control.fail(format!(
                "cannot mirror {source} to target topic {target_topic}: {reason}. Stopping \
                 (--abort.on.send.failure true); the committed offset stays before this record"
            ));
        } else {
            tracker.ack(ticket);
            drop(tracker);
            Stats::add(&self.stats.dropped, 1);
            tracing::warn!(
                stream = self.stream,
                "dropped {source} (target topic {target_topic}): {reason} (--abort.on.send.failure false)"
            );
        }
    }
}

fn describe_send_error(error: &KafkaError, topic: &str, partition: Option<i32>) -> String {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::UnknownPartition) => format!(
            "the target topic {topic} has no partition {}: --partitioning preserve needs at \
             least as many partitions on the target as on the source; add partitions to the \
             target topic or use --partitioning hash",
            partition.map_or_else(|| "?".to_owned(), |p| p.to_string())
        ),
        Some(code) => code.to_string(),
        None => error.to_string(),
    }
}

/// The producer's context: routes delivery reports to the stream's tracker.
pub struct DeliveryContext {
    pub shared: Arc<StreamShared>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        crate::logging::librdkafka_log("target", level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            self.shared
                .control
                .fail(format!("the target producer hit a fatal error: {reason}"));
        } else {
            tracing::warn!(
                stream = self.shared.stream,
                "target cluster: {reason} (retrying)"
            );
        }
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.target_state(&statistics);
    }
}

impl DeliveryContext {
    /// The producer's statistics say whether any target broker is connected.
    fn target_state(&self, statistics: &rdkafka::Statistics) {
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        self.shared.target_up.store(up, Ordering::Relaxed);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let ticket = Ticket::from_opaque(opaque);
        match result {
            Ok(message) => {
                Stats::add(&self.shared.stats.acknowledged, 1);
                if let Some(t) = message.timestamp().to_millis() {
                    self.shared.stats.telemetry.observe_latency(t);
                }
                self.shared.tracker().ack(ticket);
            }
            Err((error, _))
                if matches!(
                    error.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::PurgeQueue
                            | RDKafkaErrorCode::PurgeInflight
                            | RDKafkaErrorCode::BrokerDestroy
                    )
                ) =>
            {
                // The producer is being closed with records still unacknowledged (a
                // shutdown flush that timed out): they stay uncommitted, not failed.
                tracing::debug!(
                    stream = self.shared.stream,
                    "not acknowledged at close: {error}"
                );
            }
            Err((error, message)) => {
                self.shared
                    .send_failed(ticket, message.topic(), Some(message.partition()), error);
            }
        }
    }
}

/// Headers going out with one record. Ours until librdkafka accepts the record, then its.
#[derive(Debug)]
pub struct RawHeaders(*mut rdkafka::bindings::rd_kafka_headers_t);

impl RawHeaders {
    pub fn none() -> RawHeaders {
        RawHeaders(std::ptr::null_mut())
    }

    /// A copy of a consumed record's headers (allocated by librdkafka, not on our heap).
    pub fn copy_of(message: &crate::source::Record<'_>) -> RawHeaders {
        let list = message.header_list();
        if list.is_null() {
            return RawHeaders::none();
        }
        // SAFETY: `list` belongs to the live message; rd_kafka_headers_copy only reads it and
        // makes an independent copy that we own.
        RawHeaders(unsafe { rdkafka::bindings::rd_kafka_headers_copy(list) })
    }

    /// Appends a header (repeated names are kept, in order).
    pub fn add(&mut self, key: &str, value: Option<&[u8]>) {
        // SAFETY: `self.0` is null or headers we own; rd_kafka_headers_new returns a new list;
        // rd_kafka_header_add copies the name and value, whose pointers and lengths describe
        // live slices (a null value with length 0 is a null header value).
        unsafe {
            if self.0.is_null() {
                self.0 = rdkafka::bindings::rd_kafka_headers_new(4);
            }
            rdkafka::bindings::rd_kafka_header_add(
                self.0,
                key.as_ptr().cast(),
                key.len() as isize,
                value.map_or(std::ptr::null(), |v| v.as_ptr().cast()),
                value.map_or(0, |v| v.len() as isize),
            );
        }
    }
}

impl Drop for RawHeaders {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: non-null means we still own the list (librdkafka did not take it).
            unsafe { rdkafka::bindings::rd_kafka_headers_destroy(self.0) }
        }
    }
}

/// One record for the target, borrowing its bytes from the consumed record (or the
/// handler's output).
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// `None`: the producer's partitioner chooses.
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// `None`: the producer stamps the current time.
    pub timestamp: Option<i64>,
    pub headers: RawHeaders,
    pub ticket: Ticket,
}

/// Hands `out` to librdkafka for `topic`, which copies key and value. Unlike rust-rdkafka's
/// `send`, the topic name comes ready as a C string (no allocation per record). On error
/// nothing was taken: `out` can be retried.
pub fn produce(
    producer: &MirrorProducer,
    topic: &std::ffi::CStr,
    out: &mut Outgoing<'_>,
) -> Result<(), RDKafkaErrorCode> {
    use rdkafka::bindings::rd_kafka_vtype_t::*;
    fn bytes(b: Option<&[u8]>) -> (*mut std::ffi::c_void, usize) {
        b.map_or((std::ptr::null_mut(), 0), |b| {
            (b.as_ptr() as *mut _, b.len())
        })
    }
    let (value, value_len) = bytes(out.value);
    let (key, key_len) = bytes(out.key);
    // SAFETY: the producer handle is live for the borrow of `producer`; every pointer passed
    // is valid for the call (topic: a NUL-terminated string; key and value: slices, copied
    // because of RD_KAFKA_MSG_F_COPY); the argument list is typed per vtype and ends with
    // RD_KAFKA_VTYPE_END, as rd_kafka_producev requires. The opaque is the ticket as an
    // integer, read back as such by the delivery callback (`DeliveryOpaque = usize`). The
    // headers pass to librdkafka only when it returns no error.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_producev(
            producer.client().native_ptr(),
            RD_KAFKA_VTYPE_TOPIC,
            topic.as_ptr(),
            RD_KAFKA_VTYPE_PARTITION,
            out.partition.unwrap_or(-1),
            RD_KAFKA_VTYPE_MSGFLAGS,
            rdkafka::bindings::RD_KAFKA_MSG_F_COPY,
            RD_KAFKA_VTYPE_VALUE,
            value,
            value_len,
            RD_KAFKA_VTYPE_KEY,
            key,
            key_len,
            RD_KAFKA_VTYPE_OPAQUE,
            out.ticket.to_opaque() as *mut std::ffi::c_void,
            RD_KAFKA_VTYPE_TIMESTAMP,
            out.timestamp.unwrap_or(0),
            RD_KAFKA_VTYPE_HEADERS,
            out.headers.0,
            RD_KAFKA_VTYPE_END,
        )
    };
    if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // librdkafka owns the headers now.
        out.headers.0 = std::ptr::null_mut();
        Ok(())
    } else {
        Err(err.into())
    }
}
