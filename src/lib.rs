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
//!    sets topic configs and reads, makes and deletes topic ACLs (for the syncs),
//!    [`native::failpoint`] stops the process where a trial asks (SIGSTOP).
//! 2. [`plugin`]: the host of user plugins (message handler, rebalance listener), loaded at run
//!    time; the other module allowed `unsafe`.
//! 3. [`settings`]: [`settings::flags`] (the command line as typed), [`settings::client`]
//!    (librdkafka properties from TOML or `.properties` files, the no-data-loss rules),
//!    [`settings::java`] (what Java client keys become in librdkafka), [`settings::properties`]
//!    (Java `.properties` files, read as Java reads them), [`settings::files`] (reading the
//!    files flags name: regular files, size, permissions), [`settings::secrets`] (secret
//!    values masked in what is printed), [`settings::routing`] (whitelist, target-topic template, provenance),
//!    [`settings::exactly_once`] (what `--exactly.once true` needs), validated into
//!    [`settings::Settings`] before any broker is contacted.
//! 4. [`mirror`]: the data path, in three wings (two guarantees, and a second copy engine)
//!    over what they share: [`mirror::pipeline`] probes both clusters ([`mirror::probe`]) and
//!    runs one stream per thread; [`mirror::at_least_once`] (records through librdkafka:
//!    consume, route, produce, track, commit, flush and commit before partitions move),
//!    [`mirror::batches`] (the default engine: record batches copied as they came, through
//!    our own Fetch and idempotent Produce) and [`mirror::exactly_once`] (copy in target
//!    transactions with each partition's progress); shared by them: [`mirror::route`],
//!    [`mirror::subscription`], [`mirror::source`], [`mirror::flush`], [`mirror::offsets`]
//!    (the in-flight tracker), [`mirror::target`], [`mirror::topics`], [`mirror::clients`],
//!    [`mirror::state`]; and the offset mapping, [`mirror::mapping`] (segments, the store on
//!    the target, translation, consumer groups synced to the target). The wings never import
//!    each other. Each folder's `mod.rs` maps its own files.
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
