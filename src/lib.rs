//! mirror-maker: mirrors Kafka topics from a source cluster to a target cluster with KIP-3's
//! guarantees: nothing is lost, and the source's committed offsets never pass a record the
//! target has not acknowledged.
//!
//! # Module map
//!
//! Layers, lowest first; a module imports only from its own layer's siblings or from layers
//! below it, so there is no import circle:
//!
//! 1. [`native`]: the FFI edge to librdkafka (every `unsafe` line but the plugin host's):
//!    [`native::queue`] polls the source consumer's queue, [`native::record`] is a consumed
//!    record borrowed from librdkafka, [`native::produce`] hands records to the producer,
//!    [`native::admin`] asks a cluster what the principal may do with topics (for `check`),
//!    [`native::failpoint`] stops the process where a trial asks (SIGSTOP).
//! 2. [`plugin`]: the host of user plugins (message handler, rebalance listener), loaded at run
//!    time; the other module allowed `unsafe`.
//! 3. [`settings`]: [`settings::flags`] (the command line as typed), [`settings::client`]
//!    (librdkafka properties from TOML or `.properties` files, the no-data-loss rules),
//!    [`settings::java`] (what Java client keys become in librdkafka), [`settings::routing`] (whitelist, target-topic template, provenance),
//!    [`settings::exactly_once`] (what `--exactly.once true` needs), validated into
//!    [`settings::Settings`] before any broker is contacted.
//! 4. [`mirror`]: the data path: [`mirror::pipeline`] → [`mirror::stream`] (consume, route,
//!    produce) → [`mirror::delivery`] → [`mirror::offsets`] → [`mirror::commit`];
//!    [`mirror::rebalance`] and [`mirror::topics`] before partitions move; [`mirror::probe`],
//!    [`mirror::target`], [`mirror::clients`], [`mirror::state`]. The offset mapping beside
//!    it: [`mirror::mapping`] (segments from delivery reports, the store's records, the
//!    translation), [`mirror::ledger`] (a stream's writes to the store and what they make
//!    committable), [`mirror::store`] (the compacted topic on the target), and
//!    [`mirror::groups`] (consumer groups translated and synced to the target).
//!    Exactly once (`--exactly.once true`): [`mirror::transaction`] runs each stream instead.
//! 5. [`ops`] ([`ops::metrics`], [`ops::health`], [`ops::progress`], systemd notification in
//!    [`ops::notify`], [`ops::logging`]) and [`tools`] ([`tools::check`], [`tools::verify`],
//!    [`tools::demo`], [`tools::translate`], record comparison in [`tools::compare`]): they read the mirror's state
//!    and run it; the mirror never calls them.
//!
//! `main.rs` sits on top: subcommand dispatch and the one place where an error becomes an
//! exit code.

#[allow(unsafe_code)]
pub mod native;
#[allow(unsafe_code)]
pub mod plugin;

pub mod settings;

pub mod mirror;

pub mod ops;
pub mod tools;
