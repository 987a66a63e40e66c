//! The plugin ABI, as C sees it (`include/mirror_maker_plugin.h` is the same contract).
//!
//! Everything that crosses the boundary is `#[repr(C)]`, borrowed for the duration of one call,
//! and owned by the side that made it: records reach the plugin as (pointer, length) views,
//! output records go back through a host callback that copies them before returning, and error
//! messages are written into a buffer the host owns. No allocation crosses the boundary, so
//! host and plugin may use different allocators, compilers, or languages.

use std::ffi::c_void;

/// Bumped on any incompatible change to the structures below.
pub const ABI_VERSION: u32 = 1;

/// `const HandlerVTable *mirror_maker_message_handler(void)`
pub const HANDLER_SYMBOL: &str = "mirror_maker_message_handler";
/// `const ListenerVTable *mirror_maker_rebalance_listener(void)`
pub const LISTENER_SYMBOL: &str = "mirror_maker_rebalance_listener";

/// Timestamp value meaning "none" (as in Kafka).
pub const NO_TIMESTAMP: i64 = -1;
/// Partition value meaning "let the mirror choose" (per `--partitioning`).
pub const ANY_PARTITION: i32 = -1;

/// A borrowed byte string. `ptr == NULL` means absent (a null key or value), which is not the
/// same as empty (`len == 0` with a non-null pointer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Bytes {
    pub ptr: *const u8,
    pub len: usize,
}

impl Bytes {
    pub const NULL: Bytes = Bytes {
        ptr: std::ptr::null(),
        len: 0,
    };

    pub fn from_opt(b: Option<&[u8]>) -> Bytes {
        match b {
            Some(s) => Bytes {
                ptr: s.as_ptr(),
                len: s.len(),
            },
            None => Bytes::NULL,
        }
    }

    /// # Safety
    /// `ptr` must be null or valid for `len` bytes for the lifetime `'a`.
    pub unsafe fn as_opt<'a>(self) -> Option<&'a [u8]> {
        if self.ptr.is_null() {
            None
        } else if self.len == 0 {
            Some(&[])
        } else {
            // SAFETY: the caller guarantees validity for `len` bytes.
            Some(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
        }
    }
}

/// One header: a name (never null; any bytes, as Kafka has it: not necessarily UTF-8) and a
/// value (may be null).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub key: Bytes,
    pub value: Bytes,
}

/// A record: input to a handler (with the source topic, partition and offset) or output
/// from it (`offset` ignored; `partition` may be [`ANY_PARTITION`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub topic: Bytes,
    pub partition: i32,
    pub offset: i64,
    pub key: Bytes,
    pub value: Bytes,
    pub headers: *const Header,
    pub header_count: usize,
    pub timestamp: i64,
}

/// A topic partition, for the rebalance listener.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Partition {
    pub topic: Bytes,
    pub partition: i32,
}

/// A host-owned buffer for an error message (UTF-8, truncated to `cap`); the plugin sets
/// `len`.
#[repr(C)]
#[derive(Debug)]
pub struct ErrorBuf {
    pub ptr: *mut u8,
    pub cap: usize,
    pub len: usize,
}

/// Hands one output record to the host, which copies it before returning. Returns 0, or
/// non-zero if the record was refused (the handler should then return an error).
pub type EmitFn = unsafe extern "C" fn(ctx: *mut c_void, record: *const Record) -> i32;

/// The type of `init`: makes an instance from the plugin's args string.
pub type InitFn =
    unsafe extern "C" fn(args: Bytes, instance: *mut *mut c_void, err: *mut ErrorBuf) -> i32;
/// The type of `destroy`: frees an instance made by `init`.
pub type DestroyFn = unsafe extern "C" fn(instance: *mut c_void);
/// The type of a handler's `handle`.
pub type HandleFn = unsafe extern "C" fn(
    instance: *mut c_void,
    record: *const Record,
    emit: EmitFn,
    emit_ctx: *mut c_void,
    err: *mut ErrorBuf,
) -> i32;
/// The type of a listener's `before_releasing_partitions`.
pub type ReleasingFn = unsafe extern "C" fn(
    instance: *mut c_void,
    partitions: *const Partition,
    count: usize,
    err: *mut ErrorBuf,
) -> i32;
/// The type of a listener's `before_starting_fetchers`.
pub type StartingFn = unsafe extern "C" fn(
    instance: *mut c_void,
    consumer_id: Bytes,
    partitions: *const Partition,
    count: usize,
    err: *mut ErrorBuf,
) -> i32;

/// Returned by a plugin's entry symbol.
///
/// The function pointers are `Option`s because a C plugin may leave one NULL (`Option<fn>` has
/// the layout of a nullable C function pointer). The host refuses a plugin at load when a
/// required one (`init`, `handle`) is NULL; a NULL `destroy` means nothing to free.
#[repr(C)]
pub struct HandlerVTable {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// `size_of::<HandlerVTable>()` as the plugin was built.
    pub struct_size: u32,
    /// Required. Makes an instance from the `--message.handler.args` string. Called once per
    /// stream; an instance is used by one thread at a time. Returns 0 or non-zero with `err`
    /// set.
    pub init: Option<InitFn>,
    /// Required. Handles one record: calls `emit` zero (filter), one or several (fan-out)
    /// times. Returns 0, or non-zero with `err` set: the record is refused (what was emitted
    /// for it is not sent) and `--on.handler.error` says what follows (stop by default).
    pub handle: Option<HandleFn>,
    /// Optional (NULL: nothing to free).
    pub destroy: Option<DestroyFn>,
}

/// Returned by a listener plugin's entry symbol. `init` is required; a NULL callback is
/// skipped (as if it returned 0), a NULL `destroy` means nothing to free.
#[repr(C)]
pub struct ListenerVTable {
    pub abi_version: u32,
    pub struct_size: u32,
    /// Required.
    pub init: Option<InitFn>,
    /// Optional. After the mirror flushed and committed these partitions, before they are
    /// released.
    pub before_releasing_partitions: Option<ReleasingFn>,
    /// Optional. After a new assignment, before any of its records is fetched.
    pub before_starting_fetchers: Option<StartingFn>,
    /// Optional.
    pub destroy: Option<DestroyFn>,
}

impl ErrorBuf {
    /// Writes `message` (truncated at a character boundary) into the host's buffer.
    ///
    /// # Safety
    /// `this` must be null or point to a valid `ErrorBuf` whose `ptr` is valid for `cap` bytes.
    pub unsafe fn write(this: *mut ErrorBuf, message: &str) {
        // SAFETY: the caller guarantees `this` is null or valid.
        let Some(buf) = (unsafe { this.as_mut() }) else {
            return;
        };
        if buf.ptr.is_null() {
            return;
        }
        let mut n = message.len().min(buf.cap);
        while !message.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `ptr` is valid for `cap >= n` bytes and does not overlap `message`.
        unsafe { std::ptr::copy_nonoverlapping(message.as_ptr(), buf.ptr, n) };
        buf.len = n;
    }
}
