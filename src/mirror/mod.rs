//! The data path. Three wings (two guarantees, and a second copy engine) over what they share:
//!
//! - [`pipeline`]: probes both clusters ([`probe`]), opens the offset store, and runs one
//!   stream per thread: an [`at_least_once`] stream, an [`exactly_once`] one under
//!   `--exactly.once true`, or a [`batches`] one under `--copy.mode batches` (and `auto`, the default, where it can);
//! - [`at_least_once`]: poll the source, route each record, register it with the [`offsets`]
//!   tracker, produce it; delivery reports advance the tracker; commit points go to the
//!   source group; before partitions move, flush and commit;
//! - [`exactly_once`]: copy in target transactions whose last records are the partitions'
//!   progress in the offset store;
//! - [`mapping`]: the offset mapping (segments from delivery reports, the store on the
//!   target, translation, consumer groups synced to the target), used by both wings;
//! - shared by the wings: [`commit`] (the tracker's commit points committed to the source
//!   group), [`route`] (where a record goes), [`subscription`] (subscribe and
//!   follow the whitelist), [`source`] (the source consumer's common callbacks), [`flush`]
//!   (waits for delivery reports; a release's drain), [`target`] (target topic names), [`topics`] (target topics
//!   made before their partitions are fetched), [`limits`] (the batches the target topics
//!   take: `batch.size` capped at their `max.message.bytes`), [`clients`] (one policy for client-wide
//!   errors and librdkafka's log lines), [`metadata`] (the producers' view of target topics,
//!   refreshed for a partition they do not know), [`state`] (what the streams share with each
//!   other and with the operators' side), [`delay`] (the replication delay in seconds),
//!   [`topic_ids`] (source topics told apart by their ids: one deleted and created again is
//!   mirrored again from its beginning);
//! - [`batches`]: the batch engine (`--copy.mode auto`, the default, or `batches`): source record batches forwarded
//!   as they came, only the producer's header fields rewritten;
//! - [`sync`]: the source's explicitly set topic configs kept in step on the target topics
//!   (`--sync.topic.configs`), a thread of its own beside the streams;
//! - [`acl_sync`]: the source's ALLOW ACLs on mirrored topics copied onto the target, and
//!   those it made removed when the source drops them (`--sync.topic.acls`), a thread too;
//! - [`timestamps`]: the record-timestamp bounds of both clusters compared (for `check`), and
//!   what a record the target refused for its timestamp says;
//! - [`throttle`]: the process-wide token buckets of `--throttle.bytes.per.second` and
//!   `--throttle.records.per.second`, charged by the at-least-once stream with each record it
//!   copies;
//! - [`heartbeats`]: a record written to the source's heartbeats topic every
//!   `--heartbeats.interval.ms` (by the instance owning its partition 0), mirrored like any
//!   other, so the replication delay moves while the source is idle; a thread beside the
//!   streams.
//!
//! The wings never import each other: what they share lives here, beside them.

pub mod acl_sync;
pub mod at_least_once;
pub mod batches;
pub mod clients;
pub mod commit;
pub mod delay;
pub mod exactly_once;
pub mod flush;
pub mod heartbeats;
pub mod limits;
pub mod mapping;
pub mod metadata;
pub mod offsets;
pub mod pipeline;
pub mod probe;
pub mod route;
pub mod source;
pub mod state;
pub mod subscription;
pub mod sync;
pub mod target;
pub mod throttle;
pub mod timestamps;
pub mod topic_ids;
pub mod topics;

/// A source or target partition: its topic and number.
pub type Partition = (String, i32);
