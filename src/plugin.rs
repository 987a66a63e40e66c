//! User plugins, loaded at run time: a message handler and a rebalance listener.
//!
//! The ABI is `mirror_maker_plugin::ffi` (and `include/mirror_maker_plugin.h` for C). A library
//! is checked at start-up (file, entry symbol, ABI version, vtable size, and an `init` with the
//! user's arguments) so that a bad plugin is refused before anything is consumed. Each stream
//! gets its own instance, used only from that stream's thread.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mirror_maker_plugin::ffi;
use rdkafka::message::{BorrowedMessage, Headers, Message, Timestamp};

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot load the {kind} {}: {reason}", path.display())]
    Load {
        kind: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{} is not a mirror-maker {kind}: it has no `{symbol}` symbol (export one with mirror_maker_plugin::export_* or see include/mirror_maker_plugin.h)", path.display())]
    Symbol {
        kind: &'static str,
        path: PathBuf,
        symbol: &'static str,
    },
    #[error("the {kind} {} was built for plugin ABI version {found} (vtable of {size} bytes); this mirror-maker needs version {expected} ({expected_size} bytes): rebuild it against this release", path.display())]
    Abi {
        kind: &'static str,
        path: PathBuf,
        found: u32,
        size: u32,
        expected: u32,
        expected_size: usize,
    },
    #[error("the {kind} {} refused its arguments {args:?}: {message}", path.display())]
    Init {
        kind: &'static str,
        path: PathBuf,
        args: String,
        message: String,
    },
}

const ERROR_CAPACITY: usize = 1024;

/// Error text the plugin wrote into a host buffer.
struct ErrorText {
    buf: Vec<u8>,
    raw: ffi::ErrorBuf,
}

impl ErrorText {
    fn new() -> Box<ErrorText> {
        let mut e = Box::new(ErrorText {
            buf: vec![0; ERROR_CAPACITY],
            raw: ffi::ErrorBuf {
                ptr: std::ptr::null_mut(),
                cap: ERROR_CAPACITY,
                len: 0,
            },
        });
        e.raw.ptr = e.buf.as_mut_ptr();
        e
    }

    fn reset(&mut self) -> *mut ffi::ErrorBuf {
        self.raw.len = 0;
        &mut self.raw
    }

    /// The message on one line (a plugin's message may span several).
    fn take(&self) -> String {
        let n = self.raw.len.min(self.buf.len());
        let text = String::from_utf8_lossy(&self.buf[..n]);
        let line: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if line.is_empty() {
            "(no message)".to_owned()
        } else {
            line.join(" ")
        }
    }
}

fn load_library(kind: &'static str, path: &Path) -> Result<libloading::Library, PluginError> {
    let load_error = |reason: String| PluginError::Load {
        kind,
        path: path.to_owned(),
        reason,
    };
    if !path.exists() {
        return Err(load_error("no such file".to_owned()));
    }
    // SAFETY: loading a library runs its initialisers; the user chose to run this code.
    unsafe { libloading::Library::new(path) }.map_err(|e| load_error(e.to_string()))
}

/// Looks up the entry symbol and calls it for the vtable.
fn vtable<T>(
    kind: &'static str,
    path: &Path,
    lib: &libloading::Library,
    symbol: &'static str,
) -> Result<&'static T, PluginError> {
    let missing = || PluginError::Symbol {
        kind,
        path: path.to_owned(),
        symbol,
    };
    // SAFETY: the ABI declares the symbol as `const T *symbol(void)`.
    let entry: libloading::Symbol<'_, unsafe extern "C" fn() -> *const T> =
        unsafe { lib.get(symbol.as_bytes()) }.map_err(|_| missing())?;
    // SAFETY: calling the entry point as declared; it returns a pointer to a static vtable
    // that lives as long as the library, which the plugin keeps loaded for the process.
    let table = unsafe { entry() };
    // SAFETY: non-null pointers returned by the entry point point to a static vtable.
    unsafe { table.as_ref() }.ok_or_else(missing)
}

/// Checks the version and size fields, which every ABI version keeps first.
fn check_abi(
    kind: &'static str,
    path: &Path,
    version: u32,
    size: u32,
    expected_size: usize,
) -> Result<(), PluginError> {
    if version != ffi::ABI_VERSION || size as usize != expected_size {
        return Err(PluginError::Abi {
            kind,
            path: path.to_owned(),
            found: version,
            size,
            expected: ffi::ABI_VERSION,
            expected_size,
        });
    }
    Ok(())
}

type InitFn = unsafe extern "C" fn(ffi::Bytes, *mut *mut c_void, *mut ffi::ErrorBuf) -> i32;

fn init_instance(
    kind: &'static str,
    path: &Path,
    args: &str,
    init: InitFn,
) -> Result<*mut c_void, PluginError> {
    let mut err = ErrorText::new();
    let mut instance = std::ptr::null_mut();
    // SAFETY: `init` is the plugin's, called as the ABI declares; `args` and `err` outlive it.
    let rc = unsafe {
        init(
            ffi::Bytes::from_opt(Some(args.as_bytes())),
            &mut instance,
            err.reset(),
        )
    };
    if rc != 0 {
        return Err(PluginError::Init {
            kind,
            path: path.to_owned(),
            args: args.to_owned(),
            message: err.take(),
        });
    }
    Ok(instance)
}

const HANDLER: &str = "message handler";
const LISTENER: &str = "rebalance listener";

/// A loaded message handler library.
pub struct HandlerPlugin {
    path: PathBuf,
    args: String,
    vtable: &'static ffi::HandlerVTable,
    _lib: libloading::Library,
}

impl std::fmt::Debug for HandlerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandlerPlugin({})", self.path.display())
    }
}

impl HandlerPlugin {
    /// Loads and checks the library, and tries its `init` once with `args`.
    pub fn load(path: &Path, args: &str) -> Result<Arc<HandlerPlugin>, PluginError> {
        let lib = load_library(HANDLER, path)?;
        let vtable: &'static ffi::HandlerVTable = vtable(HANDLER, path, &lib, ffi::HANDLER_SYMBOL)?;
        check_abi(
            HANDLER,
            path,
            vtable.abi_version,
            vtable.struct_size,
            std::mem::size_of::<ffi::HandlerVTable>(),
        )?;
        let plugin = Arc::new(HandlerPlugin {
            path: path.to_owned(),
            args: args.to_owned(),
            vtable,
            _lib: lib,
        });
        drop(plugin.instance()?);
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new instance for one stream.
    pub fn instance(self: &Arc<Self>) -> Result<Handler, PluginError> {
        let ptr = init_instance(HANDLER, &self.path, &self.args, self.vtable.init)?;
        Ok(Handler {
            plugin: self.clone(),
            ptr,
            headers: Vec::new(),
            out: Vec::new(),
            err: ErrorText::new(),
        })
    }
}

/// A record a handler emitted, copied out of the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

/// One stream's handler instance.
pub struct Handler {
    plugin: Arc<HandlerPlugin>,
    ptr: *mut c_void,
    headers: Vec<ffi::Header>,
    out: Vec<Emitted>,
    err: Box<ErrorText>,
}

// SAFETY: the plugin contract lets an instance be used from any thread, one at a time; the
// stream that owns a `Handler` is the only one that calls it.
unsafe impl Send for Handler {}

impl Handler {
    pub fn path(&self) -> &Path {
        &self.plugin.path
    }

    /// Runs the handler on one consumed record; returns what it emitted.
    pub fn handle(&mut self, m: &BorrowedMessage<'_>) -> Result<&[Emitted], String> {
        self.out.clear();
        self.headers.clear();
        if let Some(hs) = m.headers() {
            self.headers.extend(hs.iter().map(|h| ffi::Header {
                key: ffi::Bytes::from_opt(Some(h.key.as_bytes())),
                value: ffi::Bytes::from_opt(h.value),
            }));
        }
        let record = ffi::Record {
            topic: ffi::Bytes::from_opt(Some(m.topic().as_bytes())),
            partition: m.partition(),
            offset: m.offset(),
            key: ffi::Bytes::from_opt(m.key()),
            value: ffi::Bytes::from_opt(m.payload()),
            headers: self.headers.as_ptr(),
            header_count: self.headers.len(),
            timestamp: match m.timestamp() {
                Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => t,
                Timestamp::NotAvailable => ffi::NO_TIMESTAMP,
            },
        };
        let ctx: *mut Vec<Emitted> = &mut self.out;
        // SAFETY: the vtable's `handle` as the ABI declares; `record`, the headers it points
        // to, the emit context and the error buffer all outlive the call.
        let rc = unsafe {
            (self.plugin.vtable.handle)(
                self.ptr,
                &record,
                copy_emitted,
                ctx.cast(),
                self.err.reset(),
            )
        };
        if rc != 0 {
            return Err(self.err.take());
        }
        Ok(&self.out)
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        // SAFETY: made by this plugin's `init`, destroyed once.
        unsafe { (self.plugin.vtable.destroy)(self.ptr) };
    }
}

/// The host's emit callback: copies the record so that nothing the plugin owns is kept.
unsafe extern "C" fn copy_emitted(ctx: *mut c_void, record: *const ffi::Record) -> i32 {
    // SAFETY: `ctx` is the `Vec<Emitted>` passed by `Handler::handle` for this call; `record`
    // and its views are valid until we return (the plugin's side of the contract).
    let (out, r) = unsafe { (&mut *ctx.cast::<Vec<Emitted>>(), &*record) };
    let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: valid views for the call (see above).
        let topic = std::str::from_utf8(unsafe { r.topic.as_opt() }?).ok()?;
        if topic.is_empty() {
            return None;
        }
        let headers: &[ffi::Header] = if r.header_count == 0 || r.headers.is_null() {
            &[]
        } else {
            // SAFETY: `header_count` valid headers for the call.
            unsafe { std::slice::from_raw_parts(r.headers, r.header_count) }
        };
        let mut copied_headers = Vec::with_capacity(headers.len());
        for h in headers {
            // SAFETY: valid views for the call.
            let key = std::str::from_utf8(unsafe { h.key.as_opt() }?).ok()?;
            // SAFETY: as above.
            copied_headers.push((
                key.to_owned(),
                unsafe { h.value.as_opt() }.map(<[u8]>::to_vec),
            ));
        }
        Some(Emitted {
            topic: topic.to_owned(),
            partition: (r.partition >= 0).then_some(r.partition),
            // SAFETY: as above.
            key: unsafe { r.key.as_opt() }.map(<[u8]>::to_vec),
            // SAFETY: as above.
            value: unsafe { r.value.as_opt() }.map(<[u8]>::to_vec),
            headers: copied_headers,
            timestamp: (r.timestamp != ffi::NO_TIMESTAMP).then_some(r.timestamp),
        })
    }));
    match copied {
        Ok(Some(e)) => {
            out.push(e);
            0
        }
        _ => 1,
    }
}

/// A loaded rebalance listener library.
pub struct ListenerPlugin {
    path: PathBuf,
    args: String,
    vtable: &'static ffi::ListenerVTable,
    _lib: libloading::Library,
}

impl std::fmt::Debug for ListenerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ListenerPlugin({})", self.path.display())
    }
}

impl ListenerPlugin {
    pub fn load(path: &Path, args: &str) -> Result<Arc<ListenerPlugin>, PluginError> {
        let lib = load_library(LISTENER, path)?;
        let vtable: &'static ffi::ListenerVTable =
            vtable(LISTENER, path, &lib, ffi::LISTENER_SYMBOL)?;
        check_abi(
            LISTENER,
            path,
            vtable.abi_version,
            vtable.struct_size,
            std::mem::size_of::<ffi::ListenerVTable>(),
        )?;
        let plugin = Arc::new(ListenerPlugin {
            path: path.to_owned(),
            args: args.to_owned(),
            vtable,
            _lib: lib,
        });
        drop(plugin.instance()?);
        Ok(plugin)
    }

    pub fn instance(self: &Arc<Self>) -> Result<Listener, PluginError> {
        let ptr = init_instance(LISTENER, &self.path, &self.args, self.vtable.init)?;
        Ok(Listener {
            plugin: self.clone(),
            ptr,
            err: ErrorText::new(),
        })
    }
}

/// One stream's listener instance.
pub struct Listener {
    plugin: Arc<ListenerPlugin>,
    ptr: *mut c_void,
    err: Box<ErrorText>,
}

// SAFETY: as for `Handler`: one stream's thread calls it.
unsafe impl Send for Listener {}

fn raw_partitions(partitions: &[(String, i32)]) -> Vec<ffi::Partition> {
    partitions
        .iter()
        .map(|(t, p)| ffi::Partition {
            topic: ffi::Bytes::from_opt(Some(t.as_bytes())),
            partition: *p,
        })
        .collect()
}

impl Listener {
    pub fn before_releasing_partitions(
        &mut self,
        partitions: &[(String, i32)],
    ) -> Result<(), String> {
        let raw = raw_partitions(partitions);
        // SAFETY: the vtable's function as the ABI declares; `raw` (and the strings it views)
        // and the error buffer outlive the call.
        let rc = unsafe {
            (self.plugin.vtable.before_releasing_partitions)(
                self.ptr,
                raw.as_ptr(),
                raw.len(),
                self.err.reset(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.err.take())
        }
    }

    pub fn before_starting_fetchers(
        &mut self,
        consumer_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<(), String> {
        let raw = raw_partitions(partitions);
        // SAFETY: as above.
        let rc = unsafe {
            (self.plugin.vtable.before_starting_fetchers)(
                self.ptr,
                ffi::Bytes::from_opt(Some(consumer_id.as_bytes())),
                raw.as_ptr(),
                raw.len(),
                self.err.reset(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.err.take())
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: made by this plugin's `init`, destroyed once.
        unsafe { (self.plugin.vtable.destroy)(self.ptr) };
    }
}
