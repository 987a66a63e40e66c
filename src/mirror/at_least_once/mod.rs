//! At least once (the default): every record reaches the target, and the source group's
//! commits never pass a record the target has not acknowledged.
//!
//! - [`stream`]: the loop: poll the source, route, register with the tracker, produce; pause
//!   when too much is unacknowledged;
//! - [`producers`]: the stream's producers, each target partition always through the same one;
//! - [`delivery`]: the target's delivery reports advance the tracker (or fail the record);
//! - [`rebalance`]: the source consumer's context; before partitions move, flush and commit,
//!   then the user's listener.

pub mod delivery;
pub mod producers;
pub mod rebalance;
pub mod stream;
