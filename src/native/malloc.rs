//! glibc's malloc, set up for the batch engine.

/// Makes glibc's malloc keep freed large buffers for the next allocation instead of handing
/// them back to the kernel. Returns whether it did.
///
/// The batch engine copies each source batch (about 1 MB) once, and frees it when the
/// target acknowledged it. With glibc's defaults, a freed buffer that size is unmapped, or
/// trimmed off its arena's top, and the next copy faults fresh zeroed pages in, one by one:
/// copying uncompressed 1 KiB records (`mirror-bench`, 200,000 records, 16 partitions), the
/// process took about 50,000 minor faults and 1.3–1.9 CPU s per million records; with
/// these settings about 11,000 and 0.65–0.90, at the same peak RSS (48–54 MiB; the passes in
/// `docs/benchmark.md`, "After the run"). The record
/// engine is left as it is: its peak RSS grew (215 → 268 MiB with 4 streams) and its CPU did
/// not fall.
///
/// Settings already in the environment win: nothing is changed when `MALLOC_TRIM_THRESHOLD_`,
/// `MALLOC_MMAP_THRESHOLD_` or `GLIBC_TUNABLES` is set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_buffers() -> bool {
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    const TRIM_THRESHOLD: libc::c_int = 64 << 20;
    let set_by_user = [
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_MMAP_THRESHOLD_",
        "GLIBC_TUNABLES",
    ]
    .iter()
    .any(|key| std::env::var_os(key).is_some());
    if set_by_user {
        return false;
    }
    // SAFETY: mallopt takes two integers (no pointer) and changes glibc's malloc parameters
    // under malloc's own lock; any thread may call it at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

/// Another C library's malloc: left as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_buffers() -> bool {
    false
}
