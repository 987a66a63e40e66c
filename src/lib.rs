//! mirror-maker: mirrors Kafka topics from a source cluster to a target cluster with KIP-3's
//! guarantees. A record's path through the code, in order:
//!
//! - [`cli`] and [`config`] → [`settings`]: flags and config files, validated, no-data-loss rules
//!   applied, before any broker is contacted;
//! - [`pipeline`]: checks both clusters and runs the streams;
//! - [`stream`]: one consumer and producer on a thread: consume ([`source`]) → produce;
//! - [`producer`]: delivery reports → [`offsets`], the acknowledged-offset tracker;
//! - [`plugin`]: the user's message handler and rebalance listener, loaded at run time;
//! - [`rebalance`]: flush and commit before partitions move, and the commits themselves;
//! - [`control`]: stop requests, fatal errors, counters; [`demo`]: the embedded default.

pub mod check;
pub mod cli;
pub mod config;
pub mod control;
pub mod demo;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod offsets;
pub mod pipeline;
pub mod plugin;
pub mod producer;
pub mod rebalance;
pub mod settings;
pub mod source;
pub mod stream;
pub mod target;
pub mod topics;
pub mod verify;
