//! The FFI edge to librdkafka and the C library: every `unsafe` line of the crate except the
//! plugin host ([`crate::plugin`]). What leaves this module is safe to use: raw pointers stay
//! inside, and borrowed views carry the lifetime of their owner.
//!
//! - [`queue`]: our own poll of the source consumer's queue, dispatching rebalances, commit
//!   results, statistics, logs and errors to the consumer's context;
//! - [`record`]: a consumed record borrowed from librdkafka (no copy of ours) and its headers;
//! - [`produce`]: `rd_kafka_producev` with a ready C topic name and headers copied natively;
//! - [`admin`]: DescribeTopics with the principal's authorized operations (for `check`), and
//!   IncrementalAlterConfigs (SET of named topic configs, for the topic-config sync),
//!   DescribeAcls, CreateAcls and DeleteAcls on topic ACLs (for the ACL sync);
//! - [`failpoint`]: a trial's named point where the process stops itself (SIGSTOP);
//! - [`malloc`]: glibc's malloc thresholds for the batch engine's buffers;
//! - [`NativePtr`]: the one owner type of a native handle, released once by its [`NativeDrop`];
//! - [`host_name`]: the kernel's host name, without `/proc` (which `ProcSubset=pid` hides);
//! - [`librdkafka_property_names`]: every configuration property librdkafka has.

pub mod admin;
pub mod failpoint;
pub mod malloc;
pub mod produce;
pub mod queue;
pub mod record;

use std::ffi::CStr;
use std::ptr::NonNull;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// This machine's host name from `gethostname`, which needs no `/proc`: the systemd unit's
/// `ProcSubset=pid` hides `/proc/sys/kernel/hostname`.
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, which gethostname writes at most.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..n]).ok().map(str::to_owned)
}

/// The name of every configuration property this librdkafka has (global and topic, aliases
/// included, hidden ones not), read from the table `rd_kafka_conf_properties_show` prints: the
/// one complete list it gives (a dump of a configuration leaves out the strings without a
/// default, `group.id` and `ssl.ca.location` among them). Empty if the table cannot be had.
pub fn librdkafka_property_names() -> Vec<String> {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: `buf` and `len` outlive the stream, which writes them until it is closed below.
    let stream = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if stream.is_null() {
        return Vec::new();
    }
    // SAFETY: `stream` is an open stream; librdkafka only writes to it.
    unsafe { rdsys::rd_kafka_conf_properties_show(stream.cast()) };
    // SAFETY: `stream` is open and not used afterwards; closing it sets `buf` and `len`.
    let closed = unsafe { libc::fclose(stream) };
    if buf.is_null() {
        return Vec::new();
    }
    let text = if closed == 0 {
        // SAFETY: after a successful close, `buf` holds `len` bytes written by the stream.
        let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        String::new()
    };
    // SAFETY: `buf` was allocated by the stream with malloc, is ours, and is freed once.
    unsafe { libc::free(buf.cast()) };
    property_names(&text)
}

/// The first column of each row of librdkafka's property table (`name | C/P | ...`), without
/// its headers and rules.
fn property_names(table: &str) -> Vec<String> {
    table
        .lines()
        .filter_map(|line| line.split_once(" | "))
        .map(|(name, _)| name.trim())
        .filter(|name| {
            name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c))
        })
        .map(str::to_owned)
        .collect()
}

/// A librdkafka type with one function that releases what we own of it.
pub trait NativeDrop {
    /// Releases `ptr`.
    ///
    /// # Safety
    /// `ptr` must be a live reference that the caller owns; it is not used afterwards.
    unsafe fn release(ptr: NonNull<Self>);
}

/// Owns one native handle and releases it once when dropped (as rust-rdkafka's `NativePtr`).
pub struct NativePtr<T: NativeDrop>(NonNull<T>);

impl<T: NativeDrop> NativePtr<T> {
    /// Takes ownership of `ptr`; `None` if it is null.
    ///
    /// # Safety
    /// A non-null `ptr` must be a live reference that nothing else will release.
    unsafe fn from_ptr(ptr: *mut T) -> Option<NativePtr<T>> {
        NonNull::new(ptr).map(NativePtr)
    }

    fn ptr(&self) -> *mut T {
        self.0.as_ptr()
    }

    /// Gives up ownership (librdkafka took the handle).
    fn into_raw(self) -> *mut T {
        let ptr = self.0.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl<T: NativeDrop> Drop for NativePtr<T> {
    fn drop(&mut self) {
        // SAFETY: `from_ptr`'s contract: we own the handle, and this is its only release.
        unsafe { T::release(self.0) }
    }
}

impl std::fmt::Debug for NativePtr<rdsys::rd_kafka_headers_t> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NativePtr({:p})", self.0)
    }
}

/// Implements [`NativeDrop`] with librdkafka's release function for each type.
macro_rules! native_drop {
    ($($native:ident => $release:ident: $what:literal;)*) => {$(
        #[doc = $what]
        impl NativeDrop for rdsys::$native {
            unsafe fn release(ptr: NonNull<Self>) {
                // SAFETY: the caller owns this handle and releases it once (the trait's
                // contract).
                unsafe { rdsys::$release(ptr.as_ptr()) }
            }
        }
    )*};
}

native_drop! {
    rd_kafka_queue_t => rd_kafka_queue_destroy: "A queue reference.";
    rd_kafka_event_t => rd_kafka_event_destroy: "An event; a fetch event's message goes with it.";
    rd_kafka_headers_t => rd_kafka_headers_destroy: "A header list librdkafka did not take.";
    rd_kafka_topic_partition_t => rd_kafka_topic_partition_destroy:
        "An end-of-partition event's partition.";
    rd_kafka_AdminOptions_t => rd_kafka_AdminOptions_destroy: "An admin request's options.";
    rd_kafka_TopicCollection_t => rd_kafka_TopicCollection_destroy:
        "The topic names of a DescribeTopics request.";
    rd_kafka_ConfigResource_t => rd_kafka_ConfigResource_destroy:
        "One resource of an IncrementalAlterConfigs request (librdkafka copies it).";
    rd_kafka_AclBinding_t => rd_kafka_AclBinding_destroy:
        "An ACL binding or binding filter of an ACL request (librdkafka copies it).";
}

/// A runtime on the calling thread for the few futures the mirror awaits off the data path:
/// rust-rdkafka's admin requests and tokio's signal streams. The streams never run on it.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The group member id of `consumer`, as the broker assigned it ("" before the first join).
pub fn member_id<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> String {
    let client = consumer.client().native_ptr();
    // SAFETY: the client pointer is valid while `consumer` lives; rd_kafka_memberid returns a
    // NUL-terminated string that we own and free with rd_kafka_mem_free, or NULL.
    unsafe {
        let id = rdsys::rd_kafka_memberid(client);
        if id.is_null() {
            return String::new();
        }
        let owned = CStr::from_ptr(id).to_string_lossy().into_owned();
        rdsys::rd_kafka_mem_free(client, id.cast());
        owned
    }
}

/// The low watermark (log start offset) of `topic`/`partition` as `consumer` last saw it in a
/// fetch response: librdkafka's cache, no request. `None` if it has none yet.
pub fn cached_low_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client pointer is valid while `consumer` lives; `topic` is a NUL-terminated
    // string for the call; librdkafka writes the two offsets through the pointers to our
    // locals and keeps neither pointer.
    let err = unsafe {
        rdsys::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && low >= 0).then_some(low)
}

#[cfg(test)]
mod host_name_tests {
    #[test]
    fn the_host_name_is_the_kernels_read_without_proc() {
        let from_proc = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(super::host_name().as_deref(), Some(from_proc.trim()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_librdkafka_property_is_listed_those_without_a_default_too() {
        let names = librdkafka_property_names();
        for name in [
            "bootstrap.servers",
            "group.id",
            "ssl.ca.location",
            "fetch.wait.max.ms",
            "acks",
            "auto.offset.reset",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n == "Property" || n.starts_with('-')));
    }
}
