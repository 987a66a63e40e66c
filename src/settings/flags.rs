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
                  Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad usage or configuration.",
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
    /// --exactly.once: then each is named and fails the check), 1 otherwise.
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
    #[arg(long = "timeout.ms", value_name = "MS", default_value_t = 30_000)]
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
    #[arg(long = "timeout.ms", value_name = "MS", default_value_t = 30_000)]
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

    /// Mirror threads; each is one consumer in the group and runs consume → produce.
    #[arg(
        long = "num.streams",
        value_name = "N",
        default_value_t = defaults::NUM_STREAMS,
        value_parser = clap::value_parser!(u32).range(1..=256)
    )]
    pub num_streams: u32,

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

    /// Refuse client settings that could lose records (acks other than all, auto commit,
    /// delivery timeouts, ...). false uses your settings as given.
    #[arg(long = "no.data.loss", value_name = "BOOL", default_value_t = defaults::NO_DATA_LOSS, num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub no_data_loss: bool,

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
    /// filters, reshapes or fans out each record.
    #[arg(long = "message.handler", value_name = "PATH")]
    pub message_handler: Option<PathBuf>,

    /// The string passed to the message handler's init.
    #[arg(
        long = "message.handler.args",
        value_name = "STRING",
        default_value = "",
        requires = "message_handler"
    )]
    pub message_handler_args: String,

    /// A rebalance listener plugin (exporting `mirror_maker_rebalance_listener`), called after
    /// the mirror's own flush and commit.
    #[arg(long = "consumer.rebalance.listener", value_name = "PATH")]
    pub rebalance_listener: Option<PathBuf>,

    /// The string passed to the rebalance listener's init.
    #[arg(
        long = "rebalance.listener.args",
        visible_alias = "consumer.rebalance.listener.args",
        value_name = "STRING",
        default_value = "",
        requires = "rebalance_listener"
    )]
    pub rebalance_listener_args: String,

    /// The target topic of each record, made from its source topic: "{topic}" keeps the
    /// name, "primary.{topic}" adds a prefix. Applied after the message handler, if any.
    #[arg(
        long = "target.topic",
        value_name = "TEMPLATE",
        default_value = "{topic}"
    )]
    pub target_topic: String,

    /// Before a partition of a new topic is fetched, create its target topic with the
    /// source's partition count, a replication factor capped at the target's brokers, and the
    /// configs of --create.topics.configs; add partitions the target lacks.
    #[arg(long = "create.topics", value_name = "BOOL", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub create_topics: bool,

    /// Topic configs copied from the source topic when its target topic is created
    /// (comma-separated; the source topic's effective values, defaults included).
    #[arg(long = "create.topics.configs", value_name = "LIST",
          default_value = defaults::COPIED_TOPIC_CONFIGS)]
    pub create_topics_configs: String,

    /// Active-active: add a provenance header (mirror-source: SOURCE NAME) to every mirrored
    /// record, and do not mirror records whose provenance names the target cluster. Off by
    /// default, so that records are copied byte for byte.
    #[arg(long = "loop.prevention", value_name = "BOOL", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub loop_prevention: bool,

    /// This mirror's source cluster, as written into provenance headers.
    #[arg(long = "source.cluster.name", value_name = "NAME")]
    pub source_cluster_name: Option<String>,

    /// This mirror's target cluster: records that came from it are not mirrored back.
    #[arg(long = "target.cluster.name", value_name = "NAME")]
    pub target_cluster_name: Option<String>,

    /// Record where each copied record landed (segments of source → target offsets) in a
    /// compacted topic of the target cluster, for `translate` and --sync.group.offsets. Source
    /// offsets are committed only once their mapping is stored.
    #[arg(long = "offset.mapping", value_name = "BOOL", default_value = "true", num_args = 0..=1,
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

    /// Log a progress line (rates in and out, lag, in flight, dropped) this often; 0 turns
    /// it off.
    #[arg(
        long = "progress.interval.ms",
        value_name = "MS",
        default_value_t = 30_000
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
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,

    /// Partitions of the sample topic.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub partitions: i32,

    /// Mirror streams (as --num.streams).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,

    /// Size of each record's value in bytes.
    #[arg(long = "value.bytes", default_value_t = 100)]
    pub value_bytes: usize,
}
