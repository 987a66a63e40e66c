//! User plugins, loaded at run time: a message handler and a rebalance listener.
//!
//! The ABI is `mirror_maker_plugin::ffi` (and `include/mirror_maker_plugin.h` for C). A library
//! is checked at start-up (its path, entry symbol, ABI version, vtable size and required
//! functions, and an `init` with the user's arguments) so that a bad plugin is refused before
//! anything is consumed. Each stream gets its own instance, used only from that stream's thread.
//!
//! What the checks cannot do: a library's constructors (`__attribute__((constructor))`, C++
//! static initialisers, any `.init_array` entry) run inside `dlopen`, before the host can look
//! up its entry symbol or read its ABI version; nothing can check a library before that. The
//! defence is where the file may come from ([`trusted_path`]): a path, not a name looked up in
//! the system's library path, to a file that only root or the running user can change or
//! replace.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::native::record::Record;
use mirror_maker_plugin::ffi;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("the {kind} {name:?} is a bare name, which dlopen would look up in the system's library path, not here: write ./{name} for the file in the current directory, or an absolute path")]
    BareName { kind: &'static str, name: String },
    #[error("refusing the {kind} {}{}: {reason}", path.display(), canonical_note(path, canonical))]
    Untrusted {
        kind: &'static str,
        path: PathBuf,
        canonical: PathBuf,
        reason: String,
    },
    #[error("the {kind} {} has no `{function}` function (NULL in its vtable), which is required: see include/mirror_maker_plugin.h", path.display())]
    MissingFunction {
        kind: &'static str,
        path: PathBuf,
        function: &'static str,
    },
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
    /// The arguments are not shown (they may hold secrets); the plugin's own message is
    /// shown as it wrote it (the host masks the arguments in it where it reports the error).
    #[error("the {kind} {} refused its arguments: {message}", path.display())]
    Init {
        kind: &'static str,
        path: PathBuf,
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

/// ` (resolved to CANONICAL)` when the path given is not the canonical one.
fn canonical_note(path: &Path, canonical: &Path) -> String {
    if path == canonical {
        String::new()
    } else {
        format!(" (resolved to {})", canonical.display())
    }
}

/// The canonical path of a plugin library the user named, once it is known to be a file that
/// only root or the running user can change or replace.
///
/// The rule is OpenSSH's `StrictModes` (`safe_path`: the path resolved, then the file and every
/// directory up to `/` owned by root or the user and not writable by group or others), with the
/// one exception Perl's `File::Temp` makes: a directory writable by others but with the sticky
/// bit (`/tmp`, 1777) is accepted, because the sticky bit lets no one but an entry's owner, the
/// directory's owner and root rename or remove an entry, so nobody else can replace the
/// directory or file of ours inside it. Write access granted by an ACL shows in the group bits
/// (the ACL mask), so it is refused as group write.
///
/// A bare name (no `/`) is refused: `dlopen` looks a bare name up in the system's library path,
/// not in the current directory, so the file checked would not be the file opened.
pub fn trusted_path(kind: &'static str, path: &Path) -> Result<PathBuf, PluginError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;

    if !path.as_os_str().as_bytes().contains(&b'/') {
        return Err(PluginError::BareName {
            kind,
            name: path.display().to_string(),
        });
    }
    let canonical = std::fs::canonicalize(path).map_err(|e| PluginError::Load {
        kind,
        path: path.to_owned(),
        reason: if e.kind() == std::io::ErrorKind::NotFound {
            "no such file".to_owned()
        } else {
            e.to_string()
        },
    })?;
    let untrusted = |reason: String| PluginError::Untrusted {
        kind,
        path: path.to_owned(),
        canonical: canonical.clone(),
        reason,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    for (i, p) in canonical.ancestors().enumerate() {
        // `canonical` holds no symlink: `symlink_metadata` is the file itself.
        let meta = std::fs::symlink_metadata(p)
            .map_err(|e| untrusted(format!("cannot read {}: {e}", p.display())))?;
        let what = if i == 0 { "file" } else { "directory" };
        if i == 0 && !meta.is_file() {
            return Err(untrusted(format!("{} is not a regular file", p.display())));
        }
        let mode = meta.mode() & 0o7777;
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(untrusted(format!(
                "{what} {} is owned by uid {}, neither root nor this process's user (uid {euid}): \
                 its owner could replace the plugin; chown it to root or move the plugin",
                p.display(),
                meta.uid()
            )));
        }
        let sticky_dir = i > 0 && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_dir {
            return Err(untrusted(format!(
                "{what} {} is writable by group or others (mode {mode:04o}), so they could \
                 change the plugin: chmod go-w {}, or move the plugin",
                p.display(),
                p.display()
            )));
        }
    }
    Ok(canonical)
}

/// Opens the library at `canonical` (checked by [`trusted_path`]); `path` is the one the user
/// gave, for messages.
fn load_library(
    kind: &'static str,
    path: &Path,
    canonical: &Path,
) -> Result<libloading::Library, PluginError> {
    // SAFETY: loading a library runs its constructors, before any check of ours but the
    // path's; the user chose to run this code, from a file only root or the user can change
    // (`trusted_path`).
    unsafe { libloading::Library::new(canonical) }.map_err(|e| PluginError::Load {
        kind,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// What the host needs of a plugin's vtable, whatever the kind of plugin.
pub trait VTable: Sync + 'static {
    const KIND: &'static str;
    const SYMBOL: &'static str;
    /// The vtable's functions once the required ones are known to be there.
    type Functions: Functions;
    /// `(abi_version, struct_size)`, the fields every ABI version keeps first.
    fn version(&self) -> (u32, u32);
    /// The functions, or the name of the first required one that is NULL.
    fn functions(&self) -> Result<Self::Functions, &'static str>;
}

/// A plugin's checked functions: pointers into the library, valid while it stays loaded.
pub trait Functions: Copy + Send + Sync + 'static {
    fn init(&self) -> ffi::InitFn;
    fn destroy(&self) -> Option<ffi::DestroyFn>;
}

/// A message handler's functions: `init` and `handle` are required.
#[derive(Clone, Copy)]
pub struct HandlerFunctions {
    init: ffi::InitFn,
    handle: ffi::HandleFn,
    destroy: Option<ffi::DestroyFn>,
}

impl Functions for HandlerFunctions {
    fn init(&self) -> ffi::InitFn {
        self.init
    }
    fn destroy(&self) -> Option<ffi::DestroyFn> {
        self.destroy
    }
}

impl VTable for ffi::HandlerVTable {
    const KIND: &'static str = "message handler";
    const SYMBOL: &'static str = ffi::HANDLER_SYMBOL;
    type Functions = HandlerFunctions;
    fn version(&self) -> (u32, u32) {
        (self.abi_version, self.struct_size)
    }
    fn functions(&self) -> Result<HandlerFunctions, &'static str> {
        Ok(HandlerFunctions {
            init: self.init.ok_or("init")?,
            handle: self.handle.ok_or("handle")?,
            destroy: self.destroy,
        })
    }
}

/// A rebalance listener's functions: only `init` is required.
#[derive(Clone, Copy)]
pub struct ListenerFunctions {
    init: ffi::InitFn,
    before_releasing_partitions: Option<ffi::ReleasingFn>,
    before_starting_fetchers: Option<ffi::StartingFn>,
    destroy: Option<ffi::DestroyFn>,
}

impl Functions for ListenerFunctions {
    fn init(&self) -> ffi::InitFn {
        self.init
    }
    fn destroy(&self) -> Option<ffi::DestroyFn> {
        self.destroy
    }
}

impl VTable for ffi::ListenerVTable {
    const KIND: &'static str = "rebalance listener";
    const SYMBOL: &'static str = ffi::LISTENER_SYMBOL;
    type Functions = ListenerFunctions;
    fn version(&self) -> (u32, u32) {
        (self.abi_version, self.struct_size)
    }
    fn functions(&self) -> Result<ListenerFunctions, &'static str> {
        Ok(ListenerFunctions {
            init: self.init.ok_or("init")?,
            before_releasing_partitions: self.before_releasing_partitions,
            before_starting_fetchers: self.before_starting_fetchers,
            destroy: self.destroy,
        })
    }
}

/// A loaded and checked plugin library of one kind.
pub struct Plugin<V: VTable> {
    path: PathBuf,
    args: String,
    /// Point into the library, which `_lib` keeps loaded as long as this lives.
    functions: V::Functions,
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
    /// Checks where the library comes from, loads it, checks its entry symbol, ABI and
    /// required functions, and tries its `init` once with `args`, so that every way a plugin
    /// can be wrong shows before anything is consumed.
    ///
    /// The ABI checks come after the library's constructors, which `dlopen` runs: only the
    /// path check ([`trusted_path`]) comes before any of the library's code runs.
    pub fn load(path: &Path, args: &str) -> Result<Arc<Plugin<V>>, PluginError> {
        let kind = V::KIND;
        let canonical = trusted_path(kind, path)?;
        let lib = load_library(kind, path, &canonical)?;
        let missing = || PluginError::Symbol {
            kind,
            path: path.to_owned(),
            symbol: V::SYMBOL,
        };
        // SAFETY: the ABI declares the symbol as `const V *symbol(void)`.
        let entry: libloading::Symbol<'_, unsafe extern "C" fn() -> *const V> =
            unsafe { lib.get(V::SYMBOL.as_bytes()) }.map_err(|_| missing())?;
        // SAFETY: calling the entry point as declared; a non-null result points to a static
        // vtable in the library, read only while `lib` is loaded (and its fields past the
        // first two only once its version and size are ours). The function pointers copied
        // out of it stay valid as long as `Plugin` keeps `lib` loaded.
        let vtable: &V = unsafe { entry().as_ref() }.ok_or_else(missing)?;
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
        let functions = vtable
            .functions()
            .map_err(|function| PluginError::MissingFunction {
                kind,
                path: path.to_owned(),
                function,
            })?;
        let plugin = Arc::new(Plugin {
            path: path.to_owned(),
            args: args.to_owned(),
            functions,
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
        let rc = unsafe { (self.functions.init())(args, &mut ptr, err.reset()) };
        if rc != 0 {
            return Err(PluginError::Init {
                kind: V::KIND,
                path: self.path.clone(),
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
        if let Some(destroy) = self.plugin.functions.destroy() {
            // SAFETY: made by this plugin's `init`, destroyed once.
            unsafe { destroy(self.ptr) };
        }
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
    /// Names as bytes: Kafka does not require a header name to be UTF-8.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
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
            (self.instance.plugin.functions.handle)(
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
            // SAFETY: valid views for the call. A name is any bytes (never null), as on the
            // wire.
            let key = unsafe { h.key.as_opt() }?;
            // SAFETY: as above.
            copied_headers.push((
                key.to_vec(),
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
        let Some(f) = self.instance.plugin.functions.before_releasing_partitions else {
            return Ok(());
        };
        let raw = raw_partitions(partitions);
        // SAFETY: the vtable's function as the ABI declares; `raw` (and the strings it views)
        // and the error buffer outlive the call.
        let rc = unsafe { f(self.instance.ptr, raw.as_ptr(), raw.len(), self.err.reset()) };
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
        let Some(f) = self.instance.plugin.functions.before_starting_fetchers else {
            return Ok(());
        };
        let raw = raw_partitions(partitions);
        // SAFETY: as above.
        let rc = unsafe {
            f(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_named_without_a_slash_is_refused_before_the_file_system_is_asked() {
        let e = trusted_path("message handler", Path::new("libc.so.6")).unwrap_err();
        assert!(matches!(e, PluginError::BareName { .. }), "{e}");
        assert!(e.to_string().contains("./libc.so.6"), "{e}");
    }

    #[test]
    fn the_path_checked_and_opened_is_the_symlinks_target() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("libreal.so");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("liblink.so");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let canonical = trusted_path("message handler", &link).unwrap();
        assert_eq!(canonical, std::fs::canonicalize(&file).unwrap());
    }
}
