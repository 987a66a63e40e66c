//! The command line, as the user types it (raw flags). [`crate::settings`] turns it into what
//! runs; defaults come from [`super::defaults`], written once.
//!
//! Flag names follow Kafka's MirrorMaker (`--consumer.config`, `--num.streams`, ...) so that
//! existing users feel at home.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use super::defaults;

#[derive(Debug, Parser)]
#[command(
    name = "mirror-maker",
    version,
    about = "Mirror Kafka topics from a source cluster to a target cluster without losing a record.",
    long_about = "Mirror Kafka topics from a source cluster to a target cluster without losing a \
                  record: commits on the source only what the target acknowledged (KIP-3).\n\n\
                  Exit codes: 0 clean shutdown (SIGINT/SIGTERM, during the start too), 1 runtime \
                  failure, 2 bad usage or configuration, 130 a second SIGINT/SIGTERM a second or \
                  more after the first (exit at once, without waiting for the flush).",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub mirror: MirrorArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mirror sample records between two embedded Kafka-protocol clusters and verify the copy.
    Demo(DemoArgs),
    /// Validate the configs, connect to both clusters and show each matching topic with its
    /// target topic; exit 0 if a mirror with the same flags would find everything it needs,
    /// 1 with each problem explained, 2 for bad usage. Use it as ExecStartPre.
    Check(Box<MirrorArgs>),
    /// Compare source topics with their mirror record by record; takes the mirror's flags
    /// unchanged (--target.topic, --partitioning, --loop.prevention decide what is compared). Exit 0 if nothing is missing,
    /// changed, out of order or misplaced (duplicates are reported, not failures, unless
    /// --exactly.once: then each is named and fails the check), 1 otherwise, 2 for bad usage.
    Verify(Box<VerifyArgs>),
    /// Translate a source consumer group's committed offsets to target offsets through the
    /// offset mapping the mirror stores; with --apply, commit them to the same group on the
    /// target (refused while the group has active members there; never backwards). Exit 0
    /// when every partition is exact (and, with --apply, committed), 1 when any waits for
    /// the mirror or cannot be translated, 2 for bad usage.
    Translate(Box<TranslateArgs>),
}

/// `translate` takes the mirror's command line (the configs, `--source.cluster.name`,
/// `--offset.mapping.topic`; `--whitelist` is not needed) and the group.
#[derive(Debug, Args)]
#[command(mut_arg("whitelist", |a| a.required(false)))]
pub struct TranslateArgs {
    #[command(flatten)]
    pub mirror: MirrorArgs,

    /// The consumer group to translate (its committed offsets on the source).
    #[arg(long, value_name = "GROUP", required = true)]
    pub group: String,

    /// Commit the exact translations to the same group on the target cluster.
    #[arg(long)]
    pub apply: bool,

    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,

    /// How long each cluster may take to answer.
    #[arg(long = "timeout.ms", value_name = "MS", default_value_t = defaults::TOOL_TIMEOUT_MS)]
    pub timeout_ms: u64,
}

/// `verify` takes the mirror's command line unchanged (its flags after `verify`): the configs,
/// `--whitelist`, `--target.topic`, `--partitioning` and `--loop.prevention` decide what is
/// compared; flags that only shape a running mirror (`--num.streams`, ...) are accepted and
/// ignored.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub mirror: MirrorArgs,

    /// Check from this source offset in every partition (default: the beginning).
    #[arg(
        long = "from.offset",
        value_name = "OFFSET",
        conflicts_with = "from_time"
    )]
    pub from_offset: Option<i64>,

    /// Check from the first record at or after this time (milliseconds since the epoch).
    #[arg(long = "from.time", value_name = "MS")]
    pub from_time: Option<i64>,

    /// Check up to the source's end, or up to what the mirror committed (a live mirror).
    #[arg(long = "until", value_enum, default_value_t = Until::End)]
    pub until: Until,

    /// Give up when a cluster sends nothing for this long while records are due.
    #[arg(long = "timeout.ms", value_name = "MS", default_value_t = defaults::TOOL_TIMEOUT_MS)]
    pub timeout_ms: u64,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// How both clusters are read: read_committed (librdkafka's default) skips the records
    /// of aborted and still open transactions, as the target's transactional readers do;
    /// read_uncommitted shows them too. With --exactly.once, duplicates fail the check.
    #[arg(long = "isolation", value_enum, default_value_t = Isolation::ReadCommitted)]
    pub isolation: Isolation,
}

/// `verify --isolation`: the `isolation.level` of both readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    #[value(name = "read_committed")]
    ReadCommitted,
    #[value(name = "read_uncommitted")]
    ReadUncommitted,
}

impl Isolation {
    /// The value of librdkafka's `isolation.level`.
    pub fn level(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

#[derive(Debug, Args)]
pub struct MirrorArgs {
    /// librdkafka properties of the source consumer (TOML, or Java .properties by extension).
    /// `bootstrap.servers` and `group.id` are required.
    #[arg(long = "consumer.config", value_name = "FILE", required = true)]
    pub consumer_config: Option<PathBuf>,

    /// librdkafka properties of the target producer (TOML, or Java .properties by extension).
    /// `bootstrap.servers` is required.
    #[arg(long = "producer.config", value_name = "FILE", required = true)]
    pub producer_config: Option<PathBuf>,

    /// Topics to mirror: a regex matched against the whole topic name (as Java's
    /// `String.matches`); as in Java's MirrorMaker, `a,b` means `a|b`, spaces are removed and
    /// surrounding quotes stripped. Topics created later that match are picked up while running.
    #[arg(
        long = "whitelist",
        visible_alias = "include",
        value_name = "REGEX",
        required = true
    )]
    pub whitelist: Option<String>,

    /// Mirror threads (1 to 256); each is one consumer in the group and runs consume →
    /// produce.
    #[arg(
        long = "num.streams",
        value_name = "N",
        default_value_t = defaults::NUM_STREAMS,
        value_parser = clap::value_parser!(u32).range(1..=256)
    )]
    pub num_streams: u32,

    /// Target producers (1 to 16) per stream of the record engine (`--copy.mode records`), each target
    /// partition always through the same one: librdkafka sends one partition per Produce
    /// request and a broker serves one request per connection at a time, so more producers
    /// cut the wait of records spread over many partitions. The batch engine puts many
    /// partitions in one request and has no use for it; with --exactly.once true a stream
    /// keeps its one transactional producer.
    #[arg(long = "producers.per.stream", value_name = "N",
          default_value_t = defaults::PRODUCERS_PER_STREAM,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub producers_per_stream: u32,

    /// How often acknowledged offsets are committed on the source.
    #[arg(long = "offset.commit.interval.ms", value_name = "MS", default_value_t = defaults::COMMIT_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub offset_commit_interval_ms: u64,

    /// On a record the target refuses for good: true stops the mirror (exit 1) after
    /// committing what was acknowledged; false logs it, counts it as dropped and goes on.
    #[arg(long = "abort.on.send.failure", visible_alias = "abort.on.send.fail",
          value_name = "BOOL", default_value_t = defaults::ABORT_ON_SEND_FAILURE, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub abort_on_send_failure: bool,

    /// Records the source's retention deleted before they were mirrored (found as a gap below
    /// the partition's low watermark): skip logs and counts them and goes on; abort stops the
    /// mirror (exit 1), naming topic, partition and offsets, committing nothing past the gap.
    #[arg(long = "on.source.gap", value_enum, value_name = "POLICY", default_value_t = defaults::ON_SOURCE_GAP)]
    pub on_source_gap: SourceGap,

    /// A record the message handler refuses (an error or a panic on it): stop ends the
    /// mirror (exit 1) with the commit below the record; skip logs and counts it
    /// (mirror_handler_refused_total) and goes on; dead-letter copies the source record as it
    /// is to --dead.letter.topic with headers naming the error and its source position, and
    /// goes on once the target acknowledged it. Not skip or dead-letter with --exactly.once.
    #[arg(long = "on.handler.error", value_enum, value_name = "POLICY", default_value_t = defaults::ON_HANDLER_ERROR)]
    pub on_handler_error: HandlerErrorPolicy,

    /// The target topic of --on.handler.error dead-letter (created at start with 1 partition
    /// under --create.topics true, otherwise it must exist).
    #[arg(long = "dead.letter.topic", value_name = "TOPIC")]
    pub dead_letter_topic: Option<String>,

    /// Cap the bytes (key, value and headers) this process hands to the target per second,
    /// over all streams: a throttled stream pauses its partitions and keeps polling, so it
    /// stays in its group (with --exactly.once true its transactions commit on time).
    #[arg(long = "throttle.bytes.per.second", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub throttle_bytes_per_second: Option<u64>,

    /// Cap the source records this process copies per second, over all streams, as
    /// --throttle.bytes.per.second does bytes (either or both).
    #[arg(long = "throttle.records.per.second", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub throttle_records_per_second: Option<u64>,

    /// Write a heartbeat to --heartbeats.topic on the SOURCE this often (off unless given; it
    /// needs CREATE and WRITE on that topic there). The topic is mirrored like any other,
    /// whatever --whitelist says, so the replication delay moves while the source is idle.
    /// Of the instances in one group, only the one owning the topic's partition 0 writes.
    #[arg(long = "heartbeats.interval.ms", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub heartbeats_interval_ms: Option<u64>,

    /// The source topic heartbeats are written to (created if absent: 1 partition, one hour
    /// of retention).
    #[arg(long = "heartbeats.topic", value_name = "NAME", value_parser = topic_name,
          default_value = defaults::HEARTBEATS_TOPIC, requires = "heartbeats_interval_ms")]
    pub heartbeats_topic: String,

    /// Refuse client settings that could lose records (acks other than all, auto commit,
    /// delivery timeouts, ...). false uses your settings as given.
    #[arg(long = "no.data.loss", value_name = "BOOL", default_value_t = defaults::NO_DATA_LOSS, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub no_data_loss: bool,

    /// records: every record goes through librdkafka's consumer and producer (handlers,
    /// hashing, loop prevention, security). batches: the source's record batches forwarded as
    /// they are, by the batch engine (see docs/configuration.md for what it cannot serve:
    /// exit 2). auto: batches where the settings allow, else records (the
    /// reason logged once at start).
    #[arg(long = "copy.mode", value_enum, value_name = "MODE", default_value_t = defaults::COPY_MODE)]
    pub copy_mode: CopyMode,

    /// preserve: each record goes to the same partition number as in the source (the target
    /// topic needs at least as many partitions). hash: Kafka's Java-compatible murmur2 hash of
    /// the key.
    #[arg(long = "partitioning", value_enum, default_value_t = defaults::PARTITIONING)]
    pub partitioning: Partitioning,

    /// On SIGINT/SIGTERM or a fatal error: how long to wait for the target to acknowledge the
    /// records in flight before committing what was acknowledged and exiting.
    #[arg(
        long = "shutdown.timeout.ms",
        value_name = "MS",
        default_value_t = defaults::SHUTDOWN_TIMEOUT_MS
    )]
    pub shutdown_timeout_ms: u64,

    /// How often the source is asked for topics that newly match the whitelist.
    #[arg(long = "topic.refresh.interval.ms", value_name = "MS", default_value_t = defaults::TOPIC_REFRESH_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub topic_refresh_interval_ms: u64,

    /// A message handler plugin (a shared library exporting `mirror_maker_message_handler`):
    /// filters, reshapes or fans out each record. A path with a `/` (`./libx.so` or absolute),
    /// to a file that, like every directory above it, is owned by root or the user and not
    /// writable by group or others.
    #[arg(long = "message.handler", value_name = "PATH")]
    pub message_handler: Option<PathBuf>,

    /// The string passed to the message handler's init. Anyone on the machine can read a
    /// command line (`ps`): put secrets in --message.handler.args.file instead.
    #[arg(
        long = "message.handler.args",
        value_name = "STRING",
        default_value = "",
        requires = "message_handler"
    )]
    pub message_handler_args: String,

    /// A file holding the string passed to the message handler's init (without one trailing
    /// newline), read as config files are (a regular file of at most 1 MiB that only its owner
    /// may write). Instead of --message.handler.args.
    #[arg(
        long = "message.handler.args.file",
        value_name = "PATH",
        requires = "message_handler",
        conflicts_with = "message_handler_args"
    )]
    pub message_handler_args_file: Option<PathBuf>,

    /// A rebalance listener plugin (exporting `mirror_maker_rebalance_listener`), called after
    /// the mirror's own flush and commit. A path, checked as `--message.handler`'s.
    #[arg(long = "consumer.rebalance.listener", value_name = "PATH")]
    pub rebalance_listener: Option<PathBuf>,

    /// The string passed to the rebalance listener's init. Anyone on the machine can read a
    /// command line (`ps`): put secrets in --rebalance.listener.args.file instead.
    #[arg(
        long = "rebalance.listener.args",
        visible_alias = "consumer.rebalance.listener.args",
        value_name = "STRING",
        default_value = "",
        requires = "rebalance_listener"
    )]
    pub rebalance_listener_args: String,

    /// A file holding the string passed to the rebalance listener's init (without one
    /// trailing newline), read as config files are. Instead of --rebalance.listener.args.
    #[arg(
        long = "rebalance.listener.args.file",
        value_name = "PATH",
        requires = "rebalance_listener",
        conflicts_with = "rebalance_listener_args"
    )]
    pub rebalance_listener_args_file: Option<PathBuf>,

    /// The target topic of each record, made from its source topic: "{topic}" keeps the
    /// name, "primary.{topic}" adds a prefix. Applied after the message handler, if any.
    #[arg(
        long = "target.topic",
        value_name = "TEMPLATE",
        default_value = defaults::TARGET_TOPIC
    )]
    pub target_topic: String,

    /// Before a partition of a new topic is fetched, create its target topic with the
    /// source's partition count, a replication factor capped at the target's brokers, and the
    /// configs of --create.topics.configs; add partitions the target lacks.
    #[arg(long = "create.topics", value_name = "BOOL", default_value_t = defaults::CREATE_TOPICS, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub create_topics: bool,

    /// Topic configs copied from the source topic when its target topic is created
    /// (comma-separated; the source topic's effective values, defaults included).
    #[arg(long = "create.topics.configs", value_name = "LIST",
          default_value = defaults::COPIED_TOPIC_CONFIGS)]
    pub create_topics_configs: String,

    /// Keep the configs of --create.topics.configs in step: every
    /// --sync.topic.configs.interval.ms, set on each mirrored target topic the ones its source
    /// topic sets explicitly (IncrementalAlterConfigs: no other target config is touched,
    /// none is deleted). [default: as --create.topics]
    #[arg(long = "sync.topic.configs", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub sync_topic_configs: Option<bool>,

    /// How often --sync.topic.configs and --sync.topic.acls run (the first time at start).
    #[arg(long = "sync.topic.configs.interval.ms", value_name = "MS", default_value_t = defaults::SYNC_TOPIC_CONFIGS_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub sync_topic_configs_interval_ms: u64,

    /// Copy the source's ALLOW ACLs on mirrored topics (LITERAL and PREFIXED, names through
    /// --target.topic; READ, DESCRIBE, DESCRIBE_CONFIGS, ALL made READ; never WRITE, CREATE,
    /// DELETE, ALTER, ALTER_CONFIGS, or a binding over the mirror's own topics) and the DENY
    /// ACLs that override them onto the target every --sync.topic.configs.interval.ms, and
    /// remove those it made that the source no longer has. ACLs it did not make are never touched; what it made is kept in the target topic
    /// mirror-maker.acls.SOURCE NAME.
    #[arg(long = "sync.topic.acls", value_name = "BOOL", num_args = 0..=1,
          default_value_t = defaults::SYNC_TOPIC_ACLS, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub sync_topic_acls: bool,

    /// Active-active: add a provenance header (mirror-source: SOURCE NAME) to every mirrored
    /// record, and do not mirror records whose provenance names the target cluster. Off by
    /// default, so that records are copied byte for byte.
    #[arg(long = "loop.prevention", value_name = "BOOL", default_value_t = defaults::LOOP_PREVENTION, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub loop_prevention: bool,

    /// This mirror's source cluster, as written into provenance headers. Unset by default:
    /// then the offset-mapping and ACL-sync topics are named after "source", and heartbeats
    /// are keyed by the source's bootstrap.servers (--loop.prevention needs it set).
    #[arg(long = "source.cluster.name", value_name = "NAME")]
    pub source_cluster_name: Option<String>,

    /// This mirror's target cluster: records that came from it are not mirrored back.
    #[arg(long = "target.cluster.name", value_name = "NAME")]
    pub target_cluster_name: Option<String>,

    /// Record where each copied record landed (segments of source → target offsets) in a
    /// compacted topic of the target cluster, for `translate` and --sync.group.offsets. Source
    /// offsets are committed only once their mapping is stored.
    #[arg(long = "offset.mapping", value_name = "BOOL", default_value_t = defaults::OFFSET_MAPPING, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub offset_mapping: bool,

    /// The offset-mapping topic in the target cluster (default
    /// mirror-maker.offsets.<--source.cluster.name, or "source">).
    #[arg(long = "offset.mapping.topic", value_name = "TOPIC")]
    pub offset_mapping_topic: Option<String>,

    /// Source consumer groups (a regex matched against the whole group name) whose committed
    /// offsets are translated and committed to the same groups on the target, while those
    /// have no active members there; never backwards, never the mirror's own group.
    #[arg(long = "sync.group.offsets", value_name = "REGEX")]
    pub sync_group_offsets: Option<String>,

    /// How often --sync.group.offsets runs.
    #[arg(long = "sync.group.offsets.interval.ms", value_name = "MS", default_value_t = defaults::SYNC_GROUP_OFFSETS_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub sync_group_offsets_interval_ms: u64,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics, and /health/live and
    /// /health/ready (ready once every stream has its assignment and reaches the target).
    #[arg(long = "metrics.addr", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,

    /// Host names (comma-separated, any port) that requests to --metrics.addr may name in
    /// their Host header, e.g. a Kubernetes service's name; IP addresses, localhost and the
    /// host of --metrics.addr are always served. Any other name gets 421: a web page cannot
    /// read the endpoints through DNS rebinding.
    #[arg(long = "metrics.allowed.hosts", value_name = "NAME,...", value_delimiter = ',',
          value_parser = host_name, requires = "metrics_addr")]
    pub metrics_allowed_hosts: Vec<String>,

    /// Not ready (/health/ready 503, systemd's status) while the replication delay (how long
    /// ago the oldest source record not yet on the target was appended; the gauge
    /// mirror_replication_delay_seconds) is above this; logged once as it passes.
    #[arg(long = "max.replication.delay.ms", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_replication_delay_ms: Option<u64>,

    /// Log a progress line (rates in and out, lag, in flight, dropped) this often; 0 turns
    /// it off.
    #[arg(
        long = "progress.interval.ms",
        value_name = "MS",
        default_value_t = defaults::PROGRESS_INTERVAL_MS
    )]
    pub progress_interval_ms: u64,

    /// Log lines as text or as one JSON object per line. The level comes from RUST_LOG
    /// (default info).
    #[arg(long = "log.format", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// How long to wait at start-up for each cluster to answer before giving up (exit 1).
    #[arg(
        long = "startup.timeout.ms",
        value_name = "MS",
        default_value_t = defaults::STARTUP_TIMEOUT_MS
    )]
    pub startup_timeout_ms: u64,

    /// Exactly once: each stream copies in target transactions that also record the source
    /// progress in the offset-mapping topic; a read_committed reader of the target sees each
    /// source record once, through crashes, rebalances and paused (zombie) instances.
    #[arg(long = "exactly.once", value_name = "BOOL", default_value_t = defaults::EXACTLY_ONCE, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub exactly_once: bool,

    /// With --exactly.once true: how long one target transaction collects records before it
    /// is committed (shorter: fresher for read_committed readers; longer: fewer commits).
    #[arg(long = "transaction.interval.ms", value_name = "MS", default_value_t = defaults::TRANSACTION_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub transaction_interval_ms: u64,

    /// With --exactly.once true: this instance's name in its transactional ids
    /// (<group.id>-<instance id>-<run>-<stream>, where <run> is unique per process run).
    /// Default: the host name.
    #[arg(long = "instance.id", value_name = "NAME")]
    pub instance_id: Option<String>,
}

/// `verify --until`: where each source partition's checked range ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Until {
    /// The source's high watermark when the check starts.
    End,
    /// The mirror group's committed offset (what the mirror says is done).
    Committed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The format `--log.format` asks for in `args` (the program name first), read before the
    /// command line is parsed so that an error in it is reported in that format too. Text
    /// unless `--log.format json` or `--log.format=json` comes before any `--`.
    pub fn requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> LogFormat {
        let mut args = args.into_iter().skip(1);
        let mut format = LogFormat::Text;
        while let Some(arg) = args.next() {
            let value = match arg.to_str() {
                Some("--") => break,
                Some("--log.format") => args.next(),
                Some(a) => a.strip_prefix("--log.format=").map(Into::into),
                None => None,
            };
            if let Some(v) = value {
                format = if v == "json" {
                    LogFormat::Json
                } else {
                    LogFormat::Text
                };
            }
        }
        format
    }
}

/// `--on.source.gap`: what records the source deleted before they were mirrored do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceGap {
    /// Log and count them, and go on.
    Skip,
    /// Stop the mirror (exit 1) without committing past them.
    Abort,
}

/// `--on.handler.error`: what a record the message handler refuses does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HandlerErrorPolicy {
    /// Stop the mirror (exit 1) without committing the record.
    Stop,
    /// Log and count it, and go on without it.
    Skip,
    /// Copy it as it is to --dead.letter.topic, and go on.
    DeadLetter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CopyMode {
    /// Record by record, through librdkafka's consumer and producer.
    Records,
    /// The source's record batches forwarded as they are (the batch engine).
    Batches,
    /// Batches where the engine can serve the settings, else records.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Partitioning {
    /// Same partition number as in the source.
    Preserve,
    /// Java-compatible murmur2 hash of the key (random for records without a key).
    Hash,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Sample records to write into the embedded source cluster.
    #[arg(long, default_value_t = defaults::DEMO_RECORDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,

    /// Partitions of the sample topic.
    #[arg(long, default_value_t = defaults::DEMO_PARTITIONS, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub partitions: i32,

    /// Mirror streams (as --num.streams).
    #[arg(long, default_value_t = defaults::DEMO_STREAMS, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,

    /// Size of each record's value in bytes.
    #[arg(long = "value.bytes", default_value_t = defaults::DEMO_VALUE_BYTES)]
    pub value_bytes: usize,
}

/// A Kafka topic name: 1 to 249 of `a-z A-Z 0-9 . _ -`, not `.` or `..`.
fn topic_name(text: &str) -> Result<String, String> {
    let legal = (1..=249).contains(&text.len())
        && text != "."
        && text != ".."
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if legal {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a Kafka topic name: 1 to 249 letters, digits, '.', '_' or '-'"
        ))
    }
}

/// One name of --metrics.allowed.hosts: a host name alone, without a port or a scheme.
fn host_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a host name: give names alone, without a port (any port is \
             served) or a scheme, e.g. mirror-maker.monitoring.svc"
        ))
    }
}
