//! Failpoints for the trials: the first time the data path reaches the point named in
//! `MIRROR_MAKER_STOP_AT`, the whole process stops itself (SIGSTOP, as a frozen VM, a
//! debugger or a long pause would), so that a trial can hold the mirror inside a window a
//! signal sent from outside hits only by chance; the trial wakes it with SIGCONT. Unset, as in
//! production, a reached point costs one read of a cached value.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The variable that names the point to stop at.
pub const VARIABLE: &str = "MIRROR_MAKER_STOP_AT";

/// Exactly once: a stream has read its newly assigned partitions' progress from the store and
/// has not yet claimed them (`mirror::exactly_once::handover`).
pub const BEFORE_CLAIM: &str = "before-claim";

/// Exactly once: a stream's source group has accepted the commit of its newly assigned
/// partitions' start (the check that it still owns them), and the transaction that claims
/// them is not yet committed (`mirror::exactly_once::handover`).
pub const BEFORE_CLAIM_COMMIT: &str = "before-claim-commit";

/// Exactly once: a stream's open transaction has its records and its offset-mapping records
/// acknowledged by the target, and is not yet committed (`mirror::exactly_once::transaction`).
pub const BEFORE_COMMIT: &str = "before-commit";

const POINTS: &[&str] = &[BEFORE_CLAIM, BEFORE_CLAIM_COMMIT, BEFORE_COMMIT];

static ARMED: OnceLock<Option<String>> = OnceLock::new();
static FIRED: AtomicBool = AtomicBool::new(false);

fn armed() -> Option<&'static str> {
    ARMED
        .get_or_init(|| std::env::var(VARIABLE).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Checks at start that `MIRROR_MAKER_STOP_AT`, if set, names a point there is.
pub fn check() -> Result<(), String> {
    match armed() {
        Some(point) if !POINTS.contains(&point) => Err(format!(
            "{VARIABLE}={point} names no failpoint; known: {}; unset it to run normally",
            POINTS.join(", ")
        )),
        _ => Ok(()),
    }
}

/// The data path is at `point`: stops the process if `MIRROR_MAKER_STOP_AT` names it and it
/// has not stopped there before.
pub fn reached(point: &str) {
    if armed() != Some(point) || FIRED.swap(true, Ordering::SeqCst) {
        return;
    }
    tracing::warn!(
        "failpoint {point}: this process stops itself (SIGSTOP) as {VARIABLE} asks; SIGCONT \
         wakes it"
    );
    // SAFETY: raise(3) takes a signal number and touches no memory of ours; SIGSTOP stops
    // every thread of the process until SIGCONT.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}
