//! User plugins, loaded at run time: a message handler and a rebalance listener.
//!
//! The ABI is `mirror_maker_plugin::ffi` (and `include/mirror_maker_plugin.h` for C). A library
//! is checked at start-up (file, entry symbol, ABI version, vtable size, and an `init` with the
//! user's arguments) so that a bad plugin is refused before anything is consumed. Each stream
//! gets its own instance, used only from that stream's thread.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::native::record::Record;
use mirror_maker_plugin::ffi;

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

type InitFn = unsafe extern "C" fn(ffi::Bytes, *mut *mut c_void, *mut ffi::ErrorBuf) -> i32;
type DestroyFn = unsafe extern "C" fn(*mut c_void);

/// What the host needs of a plugin's vtable, whatever the kind of plugin.
pub trait VTable: Sync + 'static {
    const KIND: &'static str;
    const SYMBOL: &'static str;
    /// `(abi_version, struct_size)`, the fields every ABI version keeps first.
    fn version(&self) -> (u32, u32);
    fn init_fn(&self) -> InitFn;
    fn destroy_fn(&self) -> DestroyFn;
}

impl VTable for ffi::HandlerVTable {
    const KIND: &'static str = "message handler";
    const SYMBOL: &'static str = ffi::HANDLER_SYMBOL;
    fn version(&self) -> (u32, u32) {
        (self.abi_version, self.struct_size)
    }
    fn init_fn(&self) -> InitFn {
        self.init
    }
    fn destroy_fn(&self) -> DestroyFn {
        self.destroy
    }
}

impl VTable for ffi::ListenerVTable {
    const KIND: &'static str = "rebalance listener";
    const SYMBOL: &'static str = ffi::LISTENER_SYMBOL;
    fn version(&self) -> (u32, u32) {
        (self.abi_version, self.struct_size)
    }
    fn init_fn(&self) -> InitFn {
        self.init
    }
    fn destroy_fn(&self) -> DestroyFn {
        self.destroy
    }
}

/// A loaded and checked plugin library of one kind.
pub struct Plugin<V: VTable> {
    path: PathBuf,
    args: String,
    /// Points into the library, which `_lib` keeps loaded as long as this lives.
    vtable: &'static V,
    _lib: libloading::Library,
}

pub type HandlerPlugin = Plugin<ffi::HandlerVTable>;
pub type ListenerPlugin = Plugin<ffi::ListenerVTable>;

impl<V: VTable> std::fmt::Debug for Plugin<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", V::KIND, self.path.display())
    }
}

impl<V: VTable> Plugin<V> {
    /// Loads the library, checks its entry symbol and ABI, and tries its `init` once with
    /// `args`, so that every way a plugin can be wrong shows before anything is consumed.
    pub fn load(path: &Path, args: &str) -> Result<Arc<Plugin<V>>, PluginError> {
        let kind = V::KIND;
        let lib = load_library(kind, path)?;
        let missing = || PluginError::Symbol {
            kind,
            path: path.to_owned(),
            symbol: V::SYMBOL,
        };
        // SAFETY: the ABI declares the symbol as `const V *symbol(void)`.
        let entry: libloading::Symbol<'_, unsafe extern "C" fn() -> *const V> =
            unsafe { lib.get(V::SYMBOL.as_bytes()) }.map_err(|_| missing())?;
        // SAFETY: calling the entry point as declared; a non-null result points to a static
        // vtable in the library, which `Plugin` keeps loaded for as long as it is used.
        let vtable: &'static V = unsafe { entry().as_ref() }.ok_or_else(missing)?;
        let (found, size) = vtable.version();
        let expected_size = std::mem::size_of::<V>();
        if found != ffi::ABI_VERSION || size as usize != expected_size {
            return Err(PluginError::Abi {
                kind,
                path: path.to_owned(),
                found,
                size,
                expected: ffi::ABI_VERSION,
                expected_size,
            });
        }
        let plugin = Arc::new(Plugin {
            path: path.to_owned(),
            args: args.to_owned(),
            vtable,
            _lib: lib,
        });
        drop(plugin.new_instance()?);
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn new_instance(self: &Arc<Self>) -> Result<Instance<V>, PluginError> {
        let mut err = ErrorText::new();
        let mut ptr = std::ptr::null_mut();
        let args = ffi::Bytes::from_opt(Some(self.args.as_bytes()));
        // SAFETY: the plugin's `init`, called as the ABI declares; `args`, `ptr` and `err`
        // outlive the call.
        let rc = unsafe { (self.vtable.init_fn())(args, &mut ptr, err.reset()) };
        if rc != 0 {
            return Err(PluginError::Init {
                kind: V::KIND,
                path: self.path.clone(),
                args: self.args.clone(),
                message: err.take(),
            });
        }
        Ok(Instance {
            plugin: self.clone(),
            ptr,
        })
    }
}

/// An instance made by a plugin's `init`, destroyed when dropped.
struct Instance<V: VTable> {
    plugin: Arc<Plugin<V>>,
    ptr: *mut c_void,
}

impl<V: VTable> Drop for Instance<V> {
    fn drop(&mut self) {
        // SAFETY: made by this plugin's `init`, destroyed once.
        unsafe { (self.plugin.vtable.destroy_fn())(self.ptr) };
    }
}

impl HandlerPlugin {
    /// A new instance for one stream.
    pub fn instance(self: &Arc<Self>) -> Result<Handler, PluginError> {
        Ok(Handler {
            instance: self.new_instance()?,
            headers: Vec::new(),
            out: Vec::new(),
            err: ErrorText::new(),
        })
    }
}

impl ListenerPlugin {
    /// A new instance for one stream.
    pub fn instance(self: &Arc<Self>) -> Result<Listener, PluginError> {
        Ok(Listener {
            instance: self.new_instance()?,
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
    instance: Instance<ffi::HandlerVTable>,
    /// Views of the current record's headers, valid during one `handle` call only.
    headers: Vec<ffi::Header>,
    out: Vec<Emitted>,
    err: Box<ErrorText>,
}

// SAFETY: the plugin contract lets an instance be used from any thread, one at a time; the
// stream that owns a `Handler` is the only one that calls it. The header views are cleared
// before each call and never read outside it.
unsafe impl Send for Handler {}

impl Handler {
    pub fn path(&self) -> &Path {
        self.instance.plugin.path()
    }

    /// Runs the handler on one consumed record; returns what it emitted.
    pub fn handle(&mut self, m: &Record<'_>) -> Result<&[Emitted], String> {
        self.out.clear();
        self.headers.clear();
        self.headers.extend(m.headers().map(|h| ffi::Header {
            key: ffi::Bytes::from_opt(Some(h.key)),
            value: ffi::Bytes::from_opt(h.value),
        }));
        let record = ffi::Record {
            topic: ffi::Bytes::from_opt(Some(m.topic().as_bytes())),
            partition: m.partition(),
            offset: m.offset(),
            key: ffi::Bytes::from_opt(m.key()),
            value: ffi::Bytes::from_opt(m.payload()),
            headers: self.headers.as_ptr(),
            header_count: self.headers.len(),
            timestamp: m.timestamp().unwrap_or(ffi::NO_TIMESTAMP),
        };
        let ctx: *mut Vec<Emitted> = &mut self.out;
        // SAFETY: the vtable's `handle` as the ABI declares; `record`, the headers it points
        // to, the emit context and the error buffer all outlive the call.
        let rc = unsafe {
            (self.instance.plugin.vtable.handle)(
                self.instance.ptr,
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

/// One stream's listener instance.
pub struct Listener {
    instance: Instance<ffi::ListenerVTable>,
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
            (self.instance.plugin.vtable.before_releasing_partitions)(
                self.instance.ptr,
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
            (self.instance.plugin.vtable.before_starting_fetchers)(
                self.instance.ptr,
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
