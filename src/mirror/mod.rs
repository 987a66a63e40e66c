//! The data path, in the order a record takes it:
//!
//! - [`pipeline`]: probes both clusters ([`probe`]) and runs one [`stream`] per thread;
//! - [`stream`]: poll the source, route each record (as it is, through the message handler,
//!   or not at all), register it with the [`offsets`] tracker, produce it to its [`target`]
//!   topic; pause when too much is unacknowledged;
//! - [`delivery`]: the target's delivery reports advance the tracker (or fail the record);
//! - [`commit`]: the tracker's commit points committed to the source group;
//! - [`rebalance`]: before partitions move, flush and commit; [`topics`] makes target topics
//!   before their partitions are fetched;
//! - [`clients`]: one policy for client-wide errors and librdkafka's log lines;
//! - [`state`]: what the streams share with each other and with the operators' side.

pub mod clients;
pub mod commit;
pub mod delivery;
pub mod groups;
pub mod ledger;
pub mod mapping;
pub mod offsets;
pub mod pipeline;
pub mod probe;
pub mod rebalance;
pub mod state;
pub mod store;
pub mod stream;
pub mod target;
pub mod topics;
pub mod transaction;
