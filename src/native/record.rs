//! A consumed record, borrowed from librdkafka: its bytes stay in the fetch buffer until the
//! record is dropped, and no view of it outlives the poll that returned it.

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;

use rdkafka::bindings as rdsys;

use super::produce::RawHeaders;
use super::NativePtr;

/// One consumed record. `'a` is the borrow of the [`super::queue::Source`] that polled it.
pub struct Record<'a> {
    /// The fetch event that owns the message.
    _event: NativePtr<rdsys::rd_kafka_event_t>,
    message: NonNull<rdsys::rd_kafka_message_t>,
    _source: PhantomData<&'a ()>,
}

impl<'a> Record<'a> {
    /// A record that owns `event`, whose message is `message`.
    pub(super) fn new(
        event: NativePtr<rdsys::rd_kafka_event_t>,
        message: NonNull<rdsys::rd_kafka_message_t>,
        _source: PhantomData<&'a ()>,
    ) -> Record<'a> {
        Record {
            _event: event,
            message,
            _source,
        }
    }
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

    /// Key, value and header bytes (each header's name and value): what the in-flight limits
    /// and the consumed-bytes counters count. Headers count too, or records that are mostly
    /// headers would be bounded by their number alone.
    pub fn size(&self) -> usize {
        self.payload_len() + self.key().map_or(0, <[u8]>::len) + self.header_bytes()
    }

    /// The bytes of the record's header names and values.
    pub fn header_bytes(&self) -> usize {
        self.headers()
            .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
            .sum()
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
    fn header_list(&self) -> *const rdsys::rd_kafka_headers_t {
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
        // SAFETY: the list (or null) belongs to the message, which `self` keeps alive for
        // the borrow.
        unsafe { headers_of(self.header_list()) }
    }

    /// A copy of the record's headers for the producer, made by librdkafka (not on our heap).
    pub fn copy_headers(&self) -> RawHeaders {
        let list = self.header_list();
        if list.is_null() {
            return RawHeaders::none();
        }
        // SAFETY: `list` belongs to the live message; rd_kafka_headers_copy only reads it and
        // returns an independent copy that the new value owns.
        unsafe { RawHeaders::from_ptr(rdsys::rd_kafka_headers_copy(list)) }
    }
}

/// The headers of a message rust-rdkafka consumed (`verify`, the tools' readers), in order,
/// names as bytes: rust-rdkafka's own `Headers` panics on a name that is not UTF-8, which Kafka
/// allows.
pub fn message_headers<'m>(
    message: &'m rdkafka::message::BorrowedMessage<'_>,
) -> impl Iterator<Item = Header<'m>> + 'm {
    let mut list: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: a live message (borrowed for 'm); librdkafka points `list` at headers the
    // message owns, or leaves it null.
    let err = unsafe { rdsys::rd_kafka_message_headers(message.ptr(), &mut list) };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        list = std::ptr::null_mut();
    }
    // SAFETY: the list belongs to the message, which outlives 'm.
    unsafe { headers_of(list) }
}

/// The headers of `list`, in order.
///
/// # Safety
/// `list` must be null or a header list that stays valid and unchanged for 'a.
unsafe fn headers_of<'a>(
    list: *const rdsys::rd_kafka_headers_t,
) -> impl Iterator<Item = Header<'a>> + 'a {
    (0..).map_while(move |i| {
        if list.is_null() {
            return None;
        }
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `list` is valid for 'a (the caller's contract); on success the name is
        // NUL-terminated and the value is `size` bytes (or null), both owned by the list.
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
pub(super) unsafe fn bytes<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: the caller's contract.
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}
