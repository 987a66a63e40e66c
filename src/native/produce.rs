//! Producing one record through `rd_kafka_producev`: the topic name comes ready as a C string
//! and the headers as a native list, so a record costs no allocation of ours (rust-rdkafka's
//! `send` makes a `CString` of the topic for every record).

use std::ffi::{c_void, CStr};

use rdkafka::bindings as rdsys;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use super::NativePtr;

/// Headers going out with one record. Ours until librdkafka accepts the record, then its.
#[derive(Debug, Default)]
pub struct RawHeaders(Option<NativePtr<rdsys::rd_kafka_headers_t>>);

impl RawHeaders {
    pub fn none() -> RawHeaders {
        RawHeaders(None)
    }

    /// Takes ownership of a header list (or null for none).
    ///
    /// # Safety
    /// A non-null `ptr` must be a header list that nothing else owns.
    pub(super) unsafe fn from_ptr(ptr: *mut rdsys::rd_kafka_headers_t) -> RawHeaders {
        // SAFETY: the caller's contract.
        RawHeaders(unsafe { NativePtr::from_ptr(ptr) })
    }

    /// Appends a header (repeated names are kept, in order). A name is bytes, as on the wire:
    /// Kafka does not require it to be UTF-8.
    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) {
        let list = match &self.0 {
            Some(list) => list.ptr(),
            None => {
                // SAFETY: rd_kafka_headers_new returns a new list, which we own from here on.
                let list = unsafe { NativePtr::from_ptr(rdsys::rd_kafka_headers_new(4)) };
                self.0
                    .insert(list.expect("librdkafka allocates a header list"))
                    .ptr()
            }
        };
        // SAFETY: `list` is a header list we own; rd_kafka_header_add copies the name and
        // value, whose pointers and lengths describe live slices (a null value with length 0
        // is a null header value).
        unsafe {
            rdsys::rd_kafka_header_add(
                list,
                key.as_ptr().cast(),
                key.len() as isize,
                value.map_or(std::ptr::null(), |v| v.as_ptr().cast()),
                value.map_or(0, |v| v.len() as isize),
            );
        }
    }

    fn ptr(&self) -> *mut rdsys::rd_kafka_headers_t {
        self.0.as_ref().map_or(std::ptr::null_mut(), NativePtr::ptr)
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
    /// Handed back with the delivery report (the producer context's `DeliveryOpaque`).
    pub opaque: usize,
}

/// Hands `out` to librdkafka for `topic`, which copies key and value. On error nothing was
/// taken: `out` can be retried.
pub fn produce<C: ProducerContext<DeliveryOpaque = usize>>(
    producer: &BaseProducer<C>,
    topic: &CStr,
    out: &mut Outgoing<'_>,
) -> Result<(), RDKafkaErrorCode> {
    use rdsys::rd_kafka_vtype_t::*;
    fn bytes(b: Option<&[u8]>) -> (*mut c_void, usize) {
        b.map_or((std::ptr::null_mut(), 0), |b| {
            (b.as_ptr() as *mut _, b.len())
        })
    }
    let (value, value_len) = bytes(out.value);
    let (key, key_len) = bytes(out.key);
    // SAFETY: the producer handle is live for the borrow of `producer`; every pointer passed
    // is valid for the call (topic: a NUL-terminated string; key and value: slices, copied
    // because of RD_KAFKA_MSG_F_COPY); the argument list is typed per vtype and ends with
    // RD_KAFKA_VTYPE_END, as rd_kafka_producev requires. The opaque is an integer, read back
    // as such by the delivery callback (`DeliveryOpaque = usize`). The headers pass to
    // librdkafka only when it returns no error.
    let err = unsafe {
        rdsys::rd_kafka_producev(
            producer.client().native_ptr(),
            RD_KAFKA_VTYPE_TOPIC,
            topic.as_ptr(),
            RD_KAFKA_VTYPE_PARTITION,
            out.partition.unwrap_or(-1),
            RD_KAFKA_VTYPE_MSGFLAGS,
            rdsys::RD_KAFKA_MSG_F_COPY,
            RD_KAFKA_VTYPE_VALUE,
            value,
            value_len,
            RD_KAFKA_VTYPE_KEY,
            key,
            key_len,
            RD_KAFKA_VTYPE_OPAQUE,
            out.opaque as *mut c_void,
            RD_KAFKA_VTYPE_TIMESTAMP,
            out.timestamp.unwrap_or(0),
            RD_KAFKA_VTYPE_HEADERS,
            out.headers.ptr(),
            RD_KAFKA_VTYPE_END,
        )
    };
    if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // librdkafka owns the headers now.
        if let Some(list) = out.headers.0.take() {
            list.into_raw();
        }
        Ok(())
    } else {
        Err(err.into())
    }
}

/// Sends what `producer` holds back for `linger.ms` now: librdkafka's flush tells its broker
/// threads to treat the linger as over for as long as the call lasts, here at most `wait`
/// (whole milliseconds, at least one). The delivery reports are not served here (rust-rdkafka
/// takes them as events, which only its poll serves), so the call lasts `wait` unless nothing
/// is in flight.
pub fn send_lingering<C: ProducerContext>(producer: &BaseProducer<C>, wait: std::time::Duration) {
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX).max(1);
    // SAFETY: a live producer handle; rd_kafka_flush is thread-safe and, with delivery reports
    // as events, only waits for the message count (it serves no callback).
    let _ = unsafe { rdsys::rd_kafka_flush(producer.client().native_ptr(), ms) };
}
