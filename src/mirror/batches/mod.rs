//! The batch engine (`--copy.mode batches`): the source's record batches forwarded to the
//! target as they came, records section byte for byte, only the producer's header fields
//! rewritten. A third wing beside `at_least_once` and `exactly_once`; it imports neither.
//!
//! - [`stream`]: the loop: librdkafka's consumer keeps the group with its partitions paused,
//!   our fetcher reads them, our producer writes them, acknowledgements advance the tracker;
//! - [`fetcher`]: our Fetch (read_committed), ListOffsets, and the aborted-transaction filter;
//! - [`batch`]: the batch codec, pure: a fetch response's records split into batches, and each
//!   batch prepared for our Produce (header rewritten and CRC-32C computed again, or decoded
//!   and encoded again, its records as bytes, where Kafka's `LogValidator` would refuse it as
//!   it is);
//! - [`producer`]: our idempotent producer: sequences per partition, one batch in flight per
//!   partition, Produce rounds over the target's brokers;
//! - [`cluster`]: bootstrap, Metadata, the leaders and one connection per broker;
//! - [`wire`]: one blocking connection: frames, correlation ids, API versions;
//! - [`tls`]: TLS on a connection, from the config's `ssl.*` keys (SSL, SASL_SSL);
//! - [`sasl`]: SASL PLAIN and SCRAM-SHA-256/512 on a connection (SASL_PLAINTEXT, SASL_SSL).

pub(crate) mod batch;
pub(crate) mod cluster;
pub(crate) mod fetcher;
pub(crate) mod producer;
pub(crate) mod sasl;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod wire;
