//! Write mirror-maker plugins in safe Rust.
//!
//! ```ignore
//! use mirror_maker_plugin::{export_message_handler, MessageHandler, Output, Record};
//!
//! struct DropEmpty;
//!
//! impl MessageHandler for DropEmpty {
//!     fn init(_args: &str) -> Result<Self, String> {
//!         Ok(DropEmpty)
//!     }
//!     fn handle(&mut self, record: &Record<'_>, out: &mut Output<'_>) -> Result<(), String> {
//!         if record.value().is_some_and(|v| !v.is_empty()) {
//!             out.emit(&record.as_output())?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! export_message_handler!(DropEmpty);
//! ```
//!
//! Build it as a `cdylib` and run `mirror-maker --message.handler path/to/libdrop_empty.so`.
//! Panics are caught at the boundary and reported to the mirror as errors (which stop it
//! without losing anything).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod ffi;

/// A consumed record, borrowed for one call.
pub struct Record<'a> {
    raw: &'a ffi::Record,
}

fn text<'a>(b: ffi::Bytes) -> &'a str {
    // SAFETY: the host passes valid views for the duration of the call; the returned
    // reference is only handed out tied to the record's lifetime by the accessors below.
    let bytes = unsafe { b.as_opt() }.unwrap_or_default();
    std::str::from_utf8(bytes).unwrap_or_default()
}

impl<'a> Record<'a> {
    pub fn topic(&self) -> &'a str {
        text(self.raw.topic)
    }

    pub fn partition(&self) -> i32 {
        self.raw.partition
    }

    pub fn offset(&self) -> i64 {
        self.raw.offset
    }

    pub fn key(&self) -> Option<&'a [u8]> {
        // SAFETY: valid for the call (the host's contract).
        unsafe { self.raw.key.as_opt() }
    }

    pub fn value(&self) -> Option<&'a [u8]> {
        // SAFETY: valid for the call (the host's contract).
        unsafe { self.raw.value.as_opt() }
    }

    pub fn timestamp(&self) -> Option<i64> {
        (self.raw.timestamp != ffi::NO_TIMESTAMP).then_some(self.raw.timestamp)
    }

    /// Headers in order, repeated names included; a `None` value is a null header value.
    /// Names are bytes, as Kafka has them: a producer may write a name that is not UTF-8, and
    /// a handler that passes headers on must keep it as it is (`std::str::from_utf8` where a
    /// handler wants text).
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        let raw: &'a [ffi::Header] = if self.raw.header_count == 0 || self.raw.headers.is_null() {
            &[]
        } else {
            // SAFETY: the host passes `header_count` valid headers for the call.
            unsafe { std::slice::from_raw_parts(self.raw.headers, self.raw.header_count) }
        };
        raw.iter().map(|h| {
            // SAFETY: valid for the call (the host's contract); a name is never null.
            let (key, value) = unsafe { (h.key.as_opt().unwrap_or_default(), h.value.as_opt()) };
            (key, value)
        })
    }

    /// This record as an output, unchanged (same topic, partition choice left to the mirror).
    pub fn as_output(&self) -> OutRecord<'a> {
        OutRecord {
            topic: self.topic(),
            partition: None,
            key: self.key(),
            value: self.value(),
            headers: self.headers().collect(),
            timestamp: self.timestamp(),
        }
    }
}

/// A record to produce. `partition: None` lets the mirror choose (per `--partitioning`).
#[derive(Debug, Clone)]
pub struct OutRecord<'a> {
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Names as bytes (see [`Record::headers`]); `b"name".as_slice()` for a literal.
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
    pub timestamp: Option<i64>,
}

/// Where a handler's output goes: the host copies each record when it is emitted.
pub struct Output<'e> {
    emit: ffi::EmitFn,
    ctx: *mut c_void,
    headers: Vec<ffi::Header>,
    _call: std::marker::PhantomData<&'e mut ()>,
}

impl Output<'_> {
    pub fn emit(&mut self, out: &OutRecord<'_>) -> Result<(), String> {
        self.headers.clear();
        self.headers
            .extend(out.headers.iter().map(|(k, v)| ffi::Header {
                key: ffi::Bytes::from_opt(Some(k)),
                value: ffi::Bytes::from_opt(*v),
            }));
        let raw = ffi::Record {
            topic: ffi::Bytes::from_opt(Some(out.topic.as_bytes())),
            partition: out.partition.unwrap_or(ffi::ANY_PARTITION),
            offset: -1,
            key: ffi::Bytes::from_opt(out.key),
            value: ffi::Bytes::from_opt(out.value),
            headers: self.headers.as_ptr(),
            header_count: self.headers.len(),
            timestamp: out.timestamp.unwrap_or(ffi::NO_TIMESTAMP),
        };
        // SAFETY: `emit` and `ctx` come from the host for this call; `raw` and everything it
        // points to live until the host returns (it copies).
        match unsafe { (self.emit)(self.ctx, &raw) } {
            0 => Ok(()),
            _ => Err(format!(
                "the mirror refused an output record for topic {}",
                out.topic
            )),
        }
    }
}

/// A message handler: filters, reshapes or fans out records.
pub trait MessageHandler: Sized + Send + 'static {
    /// Builds the handler from `--message.handler.args`; an error stops the mirror at start-up.
    fn init(args: &str) -> Result<Self, String>;
    /// Emits zero, one or several records for `record`. An error refuses the record (what was
    /// emitted for it is not sent): by default (`--on.handler.error stop`) the mirror stops,
    /// committing what was acknowledged before it, not it; `skip` and `dead-letter` go on.
    fn handle(&mut self, record: &Record<'_>, out: &mut Output<'_>) -> Result<(), String>;
}

/// A rebalance listener, called after the mirror's own flush and commit.
pub trait RebalanceListener: Sized + Send + 'static {
    fn init(args: &str) -> Result<Self, String>;
    /// After the mirror flushed and committed these partitions, before they are released.
    fn before_releasing_partitions(&mut self, partitions: &[(&str, i32)]) -> Result<(), String>;
    /// After a new assignment, before any of its records is fetched.
    fn before_starting_fetchers(
        &mut self,
        consumer_id: &str,
        partitions: &[(&str, i32)],
    ) -> Result<(), String>;
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned());
    format!("panicked: {what}")
}

/// Runs `f`, turning an error or a panic into a non-zero return with `err` written.
fn guarded(err: *mut ffi::ErrorBuf, f: impl FnOnce() -> Result<(), String>) -> i32 {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return 0,
        Ok(Err(message)) => message,
        Err(payload) => panic_message(payload),
    };
    // SAFETY: `err` comes from the host, valid for the call.
    unsafe { ffi::ErrorBuf::write(err, &message) };
    1
}

fn init_instance<T>(
    args: ffi::Bytes,
    instance: *mut *mut c_void,
    err: *mut ffi::ErrorBuf,
    make: fn(&str) -> Result<T, String>,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host passes a valid view for the call.
        let args = std::str::from_utf8(unsafe { args.as_opt() }.unwrap_or_default())
            .map_err(|_| "the arguments are not UTF-8".to_owned())?;
        let value = make(args)?;
        // SAFETY: `instance` is a valid out-pointer from the host.
        unsafe { *instance = Box::into_raw(Box::new(value)).cast() };
        Ok(())
    })
}

fn partitions<'a>(raw: *const ffi::Partition, count: usize) -> Vec<(&'a str, i32)> {
    if raw.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: the host passes `count` valid partitions for the call.
    let raw = unsafe { std::slice::from_raw_parts(raw, count) };
    raw.iter().map(|p| (text(p.topic), p.partition)).collect()
}

#[doc(hidden)]
pub unsafe extern "C" fn __handler_init<H: MessageHandler>(
    args: ffi::Bytes,
    instance: *mut *mut c_void,
    err: *mut ffi::ErrorBuf,
) -> i32 {
    init_instance(args, instance, err, H::init)
}

#[doc(hidden)]
pub unsafe extern "C" fn __handler_handle<H: MessageHandler>(
    instance: *mut c_void,
    record: *const ffi::Record,
    emit: ffi::EmitFn,
    emit_ctx: *mut c_void,
    err: *mut ffi::ErrorBuf,
) -> i32 {
    guarded(err, || {
        // SAFETY: `instance` was made by `__handler_init::<H>`; the host uses it from one
        // thread at a time. `record` is valid for the call.
        let (handler, raw) = unsafe { (&mut *instance.cast::<H>(), &*record) };
        let mut out = Output {
            emit,
            ctx: emit_ctx,
            headers: Vec::new(),
            _call: std::marker::PhantomData,
        };
        handler.handle(&Record { raw }, &mut out)
    })
}

#[doc(hidden)]
pub unsafe extern "C" fn __destroy<T>(instance: *mut c_void) {
    if !instance.is_null() {
        // SAFETY: made by `Box::into_raw` in `init_instance::<T>`, destroyed once by the host.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(unsafe { Box::from_raw(instance.cast::<T>()) })
        }));
    }
}

#[doc(hidden)]
pub unsafe extern "C" fn __listener_init<L: RebalanceListener>(
    args: ffi::Bytes,
    instance: *mut *mut c_void,
    err: *mut ffi::ErrorBuf,
) -> i32 {
    init_instance(args, instance, err, L::init)
}

#[doc(hidden)]
pub unsafe extern "C" fn __listener_releasing<L: RebalanceListener>(
    instance: *mut c_void,
    parts: *const ffi::Partition,
    count: usize,
    err: *mut ffi::ErrorBuf,
) -> i32 {
    guarded(err, || {
        // SAFETY: made by `__listener_init::<L>`, used from one thread at a time.
        let listener = unsafe { &mut *instance.cast::<L>() };
        listener.before_releasing_partitions(&partitions(parts, count))
    })
}

#[doc(hidden)]
pub unsafe extern "C" fn __listener_starting<L: RebalanceListener>(
    instance: *mut c_void,
    consumer_id: ffi::Bytes,
    parts: *const ffi::Partition,
    count: usize,
    err: *mut ffi::ErrorBuf,
) -> i32 {
    guarded(err, || {
        // SAFETY: made by `__listener_init::<L>`, used from one thread at a time.
        let listener = unsafe { &mut *instance.cast::<L>() };
        listener.before_starting_fetchers(text(consumer_id), &partitions(parts, count))
    })
}

/// Exports `$t` (a [`MessageHandler`]) as the library's message handler.
#[macro_export]
macro_rules! export_message_handler {
    ($t:ty) => {
        #[no_mangle]
        pub extern "C" fn mirror_maker_message_handler() -> *const $crate::ffi::HandlerVTable {
            static VTABLE: $crate::ffi::HandlerVTable = $crate::ffi::HandlerVTable {
                abi_version: $crate::ffi::ABI_VERSION,
                struct_size: ::std::mem::size_of::<$crate::ffi::HandlerVTable>() as u32,
                init: Some($crate::__handler_init::<$t>),
                handle: Some($crate::__handler_handle::<$t>),
                destroy: Some($crate::__destroy::<$t>),
            };
            &VTABLE
        }
    };
}

/// Exports `$t` (a [`RebalanceListener`]) as the library's rebalance listener.
#[macro_export]
macro_rules! export_rebalance_listener {
    ($t:ty) => {
        #[no_mangle]
        pub extern "C" fn mirror_maker_rebalance_listener() -> *const $crate::ffi::ListenerVTable {
            static VTABLE: $crate::ffi::ListenerVTable = $crate::ffi::ListenerVTable {
                abi_version: $crate::ffi::ABI_VERSION,
                struct_size: ::std::mem::size_of::<$crate::ffi::ListenerVTable>() as u32,
                init: Some($crate::__listener_init::<$t>),
                before_releasing_partitions: Some($crate::__listener_releasing::<$t>),
                before_starting_fetchers: Some($crate::__listener_starting::<$t>),
                destroy: Some($crate::__destroy::<$t>),
            };
            &VTABLE
        }
    };
}
