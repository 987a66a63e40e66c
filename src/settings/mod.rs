//! Validated settings: the command line ([`flags`], as typed) and both config files
//! ([`client`], with Java client keys translated by [`java`] (JAAS lines read by [`jaas`]) and `.properties` files read as
//! Java reads them by [`properties`]; TOML files by [`toml_file`]; every file a flag names is read by [`files`]; secret
//! values masked by [`secrets`]), with the no-data-loss rules applied, the routing values ([`routing`]) and what `--exactly.once true` needs
//! ([`exactly_once`]); the security of the batch engine's own connections ([`wire_security`]).
//! Everything a user can get wrong is found here, before any broker is contacted.

pub mod client;
pub mod exactly_once;
pub mod files;
pub mod flags;
mod jaas;
pub mod java;
pub mod properties;
pub mod routing;
pub mod secrets;
mod toml_file;
pub mod wire_security;

use std::sync::Arc;
use std::time::Duration;

use crate::plugin::{HandlerPlugin, ListenerPlugin, PluginError};
use client::{ClientProps, ConfigError, Role};
use exactly_once::ExactlyOnce;
use flags::{MirrorArgs, Partitioning};
use routing::{Provenance, TopicFilter, TopicTemplate};

/// Every default of a flag that [`SettingsOptions`] also has, written once.
pub mod defaults {
    use super::flags::Partitioning;

    pub const NUM_STREAMS: u32 = 1;
    pub const PRODUCERS_PER_STREAM: u32 = 1;
    pub const COMMIT_INTERVAL_MS: u64 = 60_000;
    pub const ABORT_ON_SEND_FAILURE: bool = true;
    pub const NO_DATA_LOSS: bool = true;
    pub const PARTITIONING: Partitioning = Partitioning::Preserve;
    /// The batch engine wherever it can serve the settings (issue 22).
    pub const COPY_MODE: super::flags::CopyMode = super::flags::CopyMode::Auto;
    pub const ON_SOURCE_GAP: super::flags::SourceGap = super::flags::SourceGap::Skip;
    /// As before the policy existed: a handler error stops the mirror.
    pub const ON_HANDLER_ERROR: super::flags::HandlerErrorPolicy =
        super::flags::HandlerErrorPolicy::Stop;
    pub const SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
    pub const TOPIC_REFRESH_INTERVAL_MS: u64 = 30_000;
    pub const STARTUP_TIMEOUT_MS: u64 = 30_000;
    pub const EXACTLY_ONCE: bool = false;
    pub const TRANSACTION_INTERVAL_MS: u64 = 100;
    pub const SYNC_GROUP_OFFSETS_INTERVAL_MS: u64 = 10_000;
    pub const TARGET_TOPIC: &str = "{topic}";
    pub const CREATE_TOPICS: bool = true;
    /// Off: records are copied byte for byte unless active-active needs the header.
    pub const LOOP_PREVENTION: bool = false;
    pub const OFFSET_MAPPING: bool = true;
    pub const PROGRESS_INTERVAL_MS: u64 = 30_000;
    /// `check`, `verify` and `translate`: how long a cluster may take to answer.
    pub const TOOL_TIMEOUT_MS: u64 = 30_000;
    /// `demo`: sample records, partitions, streams and value size.
    pub const DEMO_RECORDS: u64 = 200_000;
    pub const DEMO_PARTITIONS: i32 = 8;
    pub const DEMO_STREAMS: u32 = 2;
    pub const DEMO_VALUE_BYTES: usize = 100;
    /// As MirrorMaker 2's `sync.topic.configs.interval.seconds` (600).
    pub const SYNC_TOPIC_CONFIGS_INTERVAL_MS: u64 = 600_000;
    /// Where heartbeats go on the source (`--heartbeats.topic`).
    pub const HEARTBEATS_TOPIC: &str = "mirror-maker.heartbeats";
    /// Off: ACLs are the target's operators' until they ask.
    pub const SYNC_TOPIC_ACLS: bool = false;

    /// The ACL sync's record of the ACLs it made on the target.
    pub fn acl_record_topic(source_cluster_name: Option<&str>) -> String {
        format!(
            "mirror-maker.acls.{}",
            source_cluster_name.unwrap_or("source")
        )
    }

    /// The offset-mapping topic unless `--offset.mapping.topic` names one.
    pub fn offset_mapping_topic(source_cluster_name: Option<&str>) -> String {
        format!(
            "mirror-maker.offsets.{}",
            source_cluster_name.unwrap_or("source")
        )
    }
    /// Topic configs copied from a source topic onto the target topic made for it. Not
    /// `message.timestamp.type`: a LogAppendTime target topic would stamp its own append time
    /// over the source's, which the mirror copies as each record's timestamp.
    pub const COPIED_TOPIC_CONFIGS: &str = "cleanup.policy,retention.ms,retention.bytes,\
        delete.retention.ms,min.compaction.lag.ms,max.compaction.lag.ms,min.cleanable.dirty.ratio,\
        max.message.bytes";
}

/// Topic configs a copy never takes from its source, neither when it creates a target topic
/// nor in `--sync.topic.configs`, with why: the target's durability, its brokers and the
/// records' timestamps are the target's own. MirrorMaker 2 leaves out the same keys by default
/// (`config.properties.exclude`).
pub const NEVER_COPIED_TOPIC_CONFIGS: &[(&str, &str)] = &[
    (
        "min.insync.replicas",
        "the target's durability is its own: a lower value weakens it, a value above the target \
         topic's replicas makes it refuse every write",
    ),
    (
        "unclean.leader.election.enable",
        "it lets the target lose acknowledged records",
    ),
    (
        "message.timestamp.type",
        "LogAppendTime on the target replaces every copied record's timestamp with the target's \
         clock",
    ),
    (
        "message.timestamp.difference.max.ms",
        "the target would refuse the source's older records as they are copied",
    ),
    (
        "message.timestamp.before.max.ms",
        "the target would refuse the source's older records as they are copied",
    ),
    (
        "message.timestamp.after.max.ms",
        "the target would refuse records whose timestamps the source took",
    ),
    (
        "leader.replication.throttled.replicas",
        "it names the source's brokers, not the target's",
    ),
    (
        "follower.replication.throttled.replicas",
        "it names the source's brokers, not the target's",
    ),
];

/// `n` and the noun, plural unless `n` is 1 ("1 partition", "2 partitions"): for the lines
/// users read, from every layer above this one.
pub fn counted(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    if n == "1" {
        format!("1 {noun}")
    } else if ["s", "x", "ch", "sh"].iter().any(|end| noun.ends_with(end)) {
        format!("{n} {noun}es")
    } else {
        format!("{n} {noun}s")
    }
}

/// A usage or configuration error: the process exits 2.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--whitelist {pattern:?} is not a valid regex: {message}")]
    Regex { pattern: String, message: String },
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("{0}")]
    Usage(String),
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub consumer: ClientProps,
    pub producer: ClientProps,
    pub topics: TopicFilter,
    /// The run's options as the command line (or a tool, the tests, the bench) gave them.
    pub options: SettingsOptions,
    /// `--on.source.gap`: records the source deleted before they were mirrored.
    pub on_source_gap: flags::SourceGap,
    /// `--on.handler.error` (and `--dead.letter.topic`): records the message handler refuses.
    pub on_handler_error: OnHandlerError,
    /// `--throttle.bytes.per.second`: the process's byte rate limit towards the target.
    pub throttle_bytes_per_second: Option<u64>,
    /// `--producers.per.stream`: the record engine's producers per stream.
    pub producers_per_stream: usize,
    /// `--throttle.records.per.second`: its record rate limit.
    pub throttle_records_per_second: Option<u64>,
    /// `--heartbeats.interval.ms`: heartbeats written to the source, and where.
    pub heartbeats: Option<Heartbeats>,
    /// Per stream: consumption pauses while this many source records are unacknowledged...
    pub max_in_flight_records: usize,
    /// ...or this many bytes of them.
    pub max_in_flight_bytes: usize,
    pub handler: Option<Arc<HandlerPlugin>>,
    pub listener: Option<Arc<ListenerPlugin>>,
    /// `--target.topic` (`{topic}`: names unchanged).
    pub target_topic: TopicTemplate,
    /// `--loop.prevention true`.
    pub provenance: Option<Provenance>,
    /// `--create.topics`: the topic configs to copy, or `None` not to create topics.
    pub create_topics: Option<String>,
    /// `--exactly.once true`: each stream copies in target transactions.
    pub exactly_once: Option<ExactlyOnce>,
    /// The offset-mapping topic in the target cluster, or `None` (`--offset.mapping false`).
    pub offset_mapping: Option<String>,
    /// `--sync.group.offsets`: which source groups to sync to the target, and how often.
    pub sync_groups: Option<GroupSync>,
    /// `--sync.topic.configs`: which topic configs to keep in step, and how often.
    pub sync_topic_configs: Option<TopicConfigSync>,
    /// `--sync.topic.acls`: how often, and the target topic recording the ACLs it made.
    pub sync_topic_acls: Option<AclSync>,
    /// `--copy.mode`: whether the batch engine copies (batches, or auto where it can).
    pub batches: bool,
    /// `--copy.mode auto` fell back to records: why (logged once at start).
    pub batches_refused: Option<String>,
    /// `--copy.mode auto` chose the batch engine: a broker it cannot speak to at start makes it
    /// copy records instead (with `--copy.mode batches` that is an error).
    pub batches_by_auto: bool,
    /// `--metrics.addr`, resolved: where metrics and health are served.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// `--heartbeats.interval.ms` and `--heartbeats.topic`.
#[derive(Debug, Clone)]
pub struct Heartbeats {
    pub interval: Duration,
    pub topic: String,
    /// What each heartbeat names as its source: `--source.cluster.name`, or the source's
    /// `bootstrap.servers`.
    pub source: String,
}

/// `--sync.topic.acls true`: on the interval of `--sync.topic.configs.interval.ms`.
#[derive(Debug, Clone)]
pub struct AclSync {
    pub interval: Duration,
    pub record_topic: String,
}

/// `--sync.topic.configs` and its interval: the keys are those of `--create.topics.configs`.
#[derive(Debug, Clone)]
pub struct TopicConfigSync {
    pub keys: Vec<String>,
    pub interval: Duration,
}

/// `--sync.group.offsets REGEX` and its interval.
#[derive(Debug, Clone)]
pub struct GroupSync {
    pub groups: regex::Regex,
    pub interval: Duration,
}

/// The producer queue we configure unless the user chose: small enough that memory stays
/// bounded per stream, large enough to keep batches full.
const DEFAULT_QUEUE_MESSAGES: usize = 100_000;
const DEFAULT_QUEUE_KBYTES: usize = 64 * 1024;
/// What the record engine's streams hold between them unless the user chose, split evenly
/// among them: the consumers' prefetch (`queued.max.messages.kbytes`, librdkafka's default is
/// 64 MiB per consumer) and the bytes sent and not yet acknowledged. Per stream, these used
/// to be fixed (64 MiB of prefetch and 32 MiB in flight), so memory grew by 40-70 MiB a
/// stream; split, 4 streams of 1 KiB records peaked at 147-153 MiB instead of 340-348 with no
/// loss of throughput (docs/benchmark.md, "Later still"). The producer's queue itself stays
/// 64 MiB per stream, so a record up to that size still fits in it.
const PREFETCH_BUDGET_KBYTES: usize = 32 * 1024;
const IN_FLIGHT_BUDGET_BYTES: usize = 16 * 1024 * 1024;
/// The least any stream gets of those budgets, however many streams there are.
const MIN_STREAM_SHARE_BYTES: usize = 1024 * 1024;
/// The producer's `message.max.bytes` unless the user chose: librdkafka's maximum. It is the
/// client-side limit on one record (and on a batch, with `batch.size`, whichever is smaller).
/// librdkafka's default (1,000,000) is below Kafka's default topic `max.message.bytes`
/// (1,048,588), and a target topic made by `--create.topics` copies the source topic's limit,
/// which may be larger still: a record the target would take must not be refused before it
/// is sent. The bound on a record is then the target topic's `max.message.bytes`, enforced by
/// its brokers (a send failure that names it). Batches stay bounded by `batch.size`.
pub const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000_000;

impl Settings {
    /// What the two client configs leave open on the network ([`wire_security::exposures`]):
    /// said at start and by `check`.
    pub fn exposures(&self) -> Vec<String> {
        let mut lines = wire_security::exposures(&self.consumer, "source");
        lines.extend(wire_security::exposures(&self.producer, "target"));
        lines
    }

    /// Asks both clients for statistics every `interval` (lag and target reachability for
    /// metrics and progress), unless the configs set `statistics.interval.ms` themselves.
    pub fn enable_statistics(&mut self, interval: Duration) {
        let ms = interval.as_millis().max(100).to_string();
        self.consumer.set_default("statistics.interval.ms", &ms);
        self.producer.set_default("statistics.interval.ms", &ms);
    }

    pub fn from_args(args: &MirrorArgs) -> Result<Settings, SettingsError> {
        let missing = |flag: &str| SettingsError::Usage(format!("{flag} is required"));
        let topics = TopicFilter::new(
            args.whitelist
                .as_deref()
                .ok_or_else(|| missing("--whitelist"))?,
        )?;
        let (consumer, producer) = load_client_files(args)?;
        exactly_once::refuse_user_transactional_id(&producer)?;
        let exactly_once =
            exactly_once::from_args(args, &consumer, &producer, exactly_once::host_name)?;
        let mut settings = Settings::new(
            consumer,
            producer,
            topics,
            SettingsOptions {
                num_streams: args.num_streams as usize,
                commit_interval: Duration::from_millis(args.offset_commit_interval_ms),
                abort_on_send_failure: args.abort_on_send_failure,
                no_data_loss: args.no_data_loss,
                partitioning: args.partitioning,
                shutdown_timeout: Duration::from_millis(args.shutdown_timeout_ms),
                topic_refresh_interval: Duration::from_millis(args.topic_refresh_interval_ms),
                startup_timeout: Duration::from_millis(args.startup_timeout_ms),
            },
        )?;
        if exactly_once.is_some() && args.on_source_gap == flags::SourceGap::Abort {
            return Err(SettingsError::Usage(
                "--on.source.gap abort: the exactly-once mode (--exactly.once true) does not \
                 look for records the source deleted before they were mirrored; drop one of \
                 the two"
                    .to_owned(),
            ));
        }
        settings.on_source_gap = args.on_source_gap;
        settings.throttle_bytes_per_second = args.throttle_bytes_per_second;
        settings.throttle_records_per_second = args.throttle_records_per_second;
        let n = args.producers_per_stream;
        if exactly_once.is_some() && n > 1 {
            return Err(SettingsError::Usage(format!(
                "--producers.per.stream {n}: with --exactly.once true each stream has one \
                 transactional producer; drop --producers.per.stream"
            )));
        }
        settings.producers_per_stream = n as usize;
        if let Some(eo) = exactly_once {
            exactly_once::producer_props(&mut settings.producer);
            settings.exactly_once = Some(eo);
        }
        if let Some((key, why)) = args
            .create_topics_configs
            .split(',')
            .map(str::trim)
            .find_map(|k| NEVER_COPIED_TOPIC_CONFIGS.iter().find(|(n, _)| *n == k))
        {
            return Err(SettingsError::Usage(format!(
                "--create.topics.configs lists {key}: a copy never takes it from its source \
                 ({why}); remove it from the list and set it on the target topics by hand"
            )));
        }
        settings.create_topics = args
            .create_topics
            .then(|| args.create_topics_configs.clone());
        // Unless asked, the sync follows --create.topics: a user who makes target topics
        // himself (--create.topics false) may have chosen their configs.
        if args.sync_topic_configs.unwrap_or(args.create_topics) {
            let keys: Vec<String> = args
                .create_topics_configs
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            settings.sync_topic_configs = (!keys.is_empty()).then(|| TopicConfigSync {
                keys,
                interval: Duration::from_millis(args.sync_topic_configs_interval_ms),
            });
        }
        settings.target_topic =
            TopicTemplate::parse(&args.target_topic).map_err(SettingsError::Usage)?;
        if args.sync_topic_acls {
            settings.sync_topic_acls = Some(AclSync {
                interval: Duration::from_millis(args.sync_topic_configs_interval_ms),
                record_topic: defaults::acl_record_topic(args.source_cluster_name.as_deref()),
            });
        }
        if args.loop_prevention {
            settings.provenance = Some(
                Provenance::new(
                    args.source_cluster_name.as_deref(),
                    args.target_cluster_name.as_deref(),
                )
                .map_err(SettingsError::Usage)?,
            );
        }
        settings.offset_mapping = args.offset_mapping.then(|| {
            args.offset_mapping_topic.clone().unwrap_or_else(|| {
                defaults::offset_mapping_topic(args.source_cluster_name.as_deref())
            })
        });
        if let Some(ms) = args.heartbeats_interval_ms {
            let topic = args.heartbeats_topic.clone();
            let source = match &args.source_cluster_name {
                Some(name) => name.clone(),
                None => settings
                    .consumer
                    .get("bootstrap.servers")
                    .unwrap_or("source")
                    .to_owned(),
            };
            // Mirrored like any other topic, whether the whitelist names it or not.
            settings.topics.always_mirror(&topic);
            settings.heartbeats = Some(Heartbeats {
                interval: Duration::from_millis(ms),
                topic,
                source,
            });
        }
        // Never mirror into the mirror's own topics on the target.
        let template = settings.target_topic.clone();
        if let Some(store) = &settings.offset_mapping {
            settings
                .topics
                .protect_own(store, "offset-mapping store", &template);
        }
        if let Some(acls) = &settings.sync_topic_acls {
            settings
                .topics
                .protect_own(&acls.record_topic, "ACL record topic", &template);
        }
        if let Some(given) = &args.sync_group_offsets {
            if settings.offset_mapping.is_none() {
                return Err(SettingsError::Usage(
                    "--sync.group.offsets translates through the offset mapping: it cannot run \
                     with --offset.mapping false"
                        .to_owned(),
                ));
            }
            let groups = regex::Regex::new(&format!("^(?:{given})$")).map_err(|e| {
                SettingsError::Usage(format!(
                    "--sync.group.offsets {given:?} is not a valid regex: {}",
                    e.to_string().lines().last().unwrap_or_default().trim()
                ))
            })?;
            settings.sync_groups = Some(GroupSync {
                groups,
                interval: Duration::from_millis(args.sync_group_offsets_interval_ms),
            });
        }
        settings.metrics_addr = args
            .metrics_addr
            .as_deref()
            .map(metrics_addr)
            .transpose()
            .map_err(SettingsError::Usage)?;
        let handler_args = plugin_args(
            "message handler arguments",
            "--message.handler.args.file",
            &args.message_handler_args,
            args.message_handler_args_file.as_deref(),
        )?;
        let listener_args = plugin_args(
            "rebalance listener arguments",
            "--rebalance.listener.args.file",
            &args.rebalance_listener_args,
            args.rebalance_listener_args_file.as_deref(),
        )?;
        settings.on_handler_error = on_handler_error(args, &settings)?;
        // Plugins last: loading runs their code, so only once everything else is valid.
        if let Some(path) = &args.message_handler {
            refuse_java_class("--message.handler", "message handler", path)?;
            settings.handler = Some(
                HandlerPlugin::load(path, &handler_args).map_err(|e| masked(e, &handler_args))?,
            );
        }
        if let Some(path) = &args.rebalance_listener {
            refuse_java_class("--consumer.rebalance.listener", "rebalance listener", path)?;
            settings.listener = Some(
                ListenerPlugin::load(path, &listener_args)
                    .map_err(|e| masked(e, &listener_args))?,
            );
        }
        match (args.copy_mode, batch_refusal(&settings)) {
            (flags::CopyMode::Records, _) => {}
            (flags::CopyMode::Batches, Some(reason)) => {
                return Err(SettingsError::Usage(format!(
                    "--copy.mode batches cannot serve {reason}; drop it or use --copy.mode records"
                )))
            }
            (flags::CopyMode::Batches, None) => settings.batches = true,
            (flags::CopyMode::Auto, Some(reason)) => settings.batches_refused = Some(reason),
            (flags::CopyMode::Auto, None) => {
                settings.batches = true;
                settings.batches_by_auto = true;
            }
        }
        Ok(settings)
    }

    /// Settings built in code (`demo`, the benchmark's helpers, tests): the record engine,
    /// whatever `--copy.mode`'s default is; set `batches` to choose the batch engine.
    pub fn new(
        mut consumer: ClientProps,
        mut producer: ClientProps,
        topics: TopicFilter,
        opts: SettingsOptions,
    ) -> Result<Settings, SettingsError> {
        if opts.num_streams == 0 {
            return Err(SettingsError::Usage(
                "--num.streams must be at least 1".to_owned(),
            ));
        }
        // New partitions of subscribed topics are noticed when librdkafka refreshes its
        // metadata (default every 5 minutes): as often as new topics are looked for.
        consumer.set_default(
            "topic.metadata.refresh.interval.ms",
            &opts.topic_refresh_interval.as_millis().to_string(),
        );
        let streams = opts.num_streams;
        consumer.set_default(
            "queued.max.messages.kbytes",
            &stream_share(PREFETCH_BUDGET_KBYTES * 1024, streams)
                .div_ceil(1024)
                .to_string(),
        );
        consumer.apply_consumer_rules(opts.no_data_loss)?;
        let queue_kbytes_chosen = producer.get("queue.buffering.max.kbytes").is_some();
        if opts.partitioning == Partitioning::Hash {
            // librdkafka's default partitioner differs from Java's; this one matches it.
            producer.set_default("partitioner", "murmur2_random");
        }
        producer.set_default(
            "queue.buffering.max.messages",
            &DEFAULT_QUEUE_MESSAGES.to_string(),
        );
        producer.set_default(
            "queue.buffering.max.kbytes",
            &DEFAULT_QUEUE_KBYTES.to_string(),
        );
        producer.set_default("message.max.bytes", &DEFAULT_MESSAGE_MAX_BYTES.to_string());
        producer.apply_producer_rules(opts.no_data_loss)?;
        if opts.abort_on_send_failure && producer.get("enable.idempotence") == Some("true") {
            // A record the target refuses for good stops the mirror; without this, librdkafka
            // goes on sending the records queued behind it (bumping the idempotent epoch), and
            // they land before the refused record is copied again on restart: out of order.
            // With it, the refusal is a fatal producer error and nothing behind it is sent.
            producer.set_default("enable.gapless.guarantee", "true");
        }

        // Keep below the producer's queue limits so that sends practically never find the
        // queue full: consumption pauses first, and the consumer keeps polling meanwhile.
        let queue_messages = parse_or(
            &producer,
            "queue.buffering.max.messages",
            DEFAULT_QUEUE_MESSAGES,
        )?;
        let queue_kbytes = parse_or(
            &producer,
            "queue.buffering.max.kbytes",
            DEFAULT_QUEUE_KBYTES,
        )?;
        Ok(Settings {
            consumer,
            producer,
            topics,
            options: opts,
            on_source_gap: defaults::ON_SOURCE_GAP,
            on_handler_error: OnHandlerError::Stop,
            throttle_bytes_per_second: None,
            producers_per_stream: defaults::PRODUCERS_PER_STREAM as usize,
            throttle_records_per_second: None,
            heartbeats: None,
            max_in_flight_records: (queue_messages / 2).max(1),
            max_in_flight_bytes: if queue_kbytes_chosen {
                (queue_kbytes * 1024 / 2).max(1)
            } else {
                stream_share(IN_FLIGHT_BUDGET_BYTES, streams)
            },
            handler: None,
            listener: None,
            target_topic: TopicTemplate::default(),
            provenance: None,
            create_topics: None,
            exactly_once: None,
            offset_mapping: Some(defaults::offset_mapping_topic(None)),
            sync_groups: None,
            sync_topic_configs: None,
            sync_topic_acls: None,
            batches: false,
            batches_refused: None,
            batches_by_auto: false,
            metrics_addr: None,
        })
    }
}

/// The two config files of a command line (`--consumer.config`, `--producer.config`), read
/// as they are, before the no-data-loss rules.
pub fn load_client_files(args: &MirrorArgs) -> Result<(ClientProps, ClientProps), SettingsError> {
    let missing = |flag: &str| SettingsError::Usage(format!("{flag} is required"));
    let consumer = ClientProps::load(
        Role::Consumer,
        args.consumer_config
            .as_deref()
            .ok_or_else(|| missing("--consumer.config"))?,
    )?;
    let producer = ClientProps::load(
        Role::Producer,
        args.producer_config
            .as_deref()
            .ok_or_else(|| missing("--producer.config"))?,
    )?;
    // librdkafka's log lines about these clients are logged with their secrets masked.
    secrets::register(&secrets::Secrets::of([&consumer, &producer]));
    Ok((consumer, producer))
}

/// The options of [`Settings::new`] other than the client properties and the topic filter.
#[derive(Debug, Clone)]
pub struct SettingsOptions {
    pub num_streams: usize,
    pub commit_interval: Duration,
    pub abort_on_send_failure: bool,
    pub no_data_loss: bool,
    pub partitioning: Partitioning,
    pub shutdown_timeout: Duration,
    pub topic_refresh_interval: Duration,
    pub startup_timeout: Duration,
}

/// What bounds the size of a mirrored record, in words for `check` and the logs.
pub fn record_size_bound(producer: &ClientProps) -> String {
    match producer.get("message.max.bytes").map(str::trim) {
        Some(v) if v != DEFAULT_MESSAGE_MAX_BYTES.to_string() => format!(
            "record size: bounded by the producer's message.max.bytes = {v} ({}): a larger \
             record is refused before it is sent, even where the target topic's \
             max.message.bytes would take it; the target topic's max.message.bytes bounds too",
            producer.path.display()
        ),
        _ => format!(
            "record size: bounded by each target topic's max.message.bytes (enforced by the \
             target's brokers; --create.topics copies the source topic's value); the producer's \
             message.max.bytes is librdkafka's maximum, {DEFAULT_MESSAGE_MAX_BYTES}, so it never \
             refuses a record first"
        ),
    }
}

impl Default for SettingsOptions {
    /// The command line's defaults.
    fn default() -> Self {
        SettingsOptions {
            num_streams: defaults::NUM_STREAMS as usize,
            commit_interval: Duration::from_millis(defaults::COMMIT_INTERVAL_MS),
            abort_on_send_failure: defaults::ABORT_ON_SEND_FAILURE,
            no_data_loss: defaults::NO_DATA_LOSS,
            partitioning: defaults::PARTITIONING,
            shutdown_timeout: Duration::from_millis(defaults::SHUTDOWN_TIMEOUT_MS),
            topic_refresh_interval: Duration::from_millis(defaults::TOPIC_REFRESH_INTERVAL_MS),
            startup_timeout: Duration::from_millis(defaults::STARTUP_TIMEOUT_MS),
        }
    }
}

/// A plugin flag given what Java's MirrorMaker took there, a class name
/// (`kafka.tools.MirrorMaker$IdentityMessageHandler`, `com.example.MyHandler`), is explained:
/// here plugins are shared libraries. A name counts as a class name when no such file exists
/// and it is dotted Java identifiers without a path separator or a library extension.
fn refuse_java_class(flag: &str, kind: &str, path: &std::path::Path) -> Result<(), SettingsError> {
    let text = path.to_string_lossy();
    let identifier = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
            && part
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
    };
    let library = [".so", ".dylib", ".dll"]
        .iter()
        .any(|ext| text.ends_with(ext) || text.contains(&format!("{ext}.")));
    let class_like = !text.contains('/')
        && !library
        && (text.contains('.') || text.contains('$'))
        && text.split('.').all(identifier);
    if !class_like || path.exists() {
        return Ok(());
    }
    Err(SettingsError::Usage(format!(
        "{flag} {text} looks like a Java class name; mirror-maker cannot run Java code: a \
         {kind} here is a shared library (.so) built against its plugin ABI. Build one from the \
         examples in examples/ (Rust or C, see examples/README.md) and give its path, e.g. \
         {flag} /opt/mirror/lib{example}.so; leave the flag out to copy records unchanged",
        example = if flag == "--message.handler" {
            "rename_handler"
        } else {
            "recording_listener"
        }
    )))
}

/// A plugin's arguments: the inline flag's, or the file's (read by the rules of a config
/// file, without one trailing newline). clap refuses both at once.
fn plugin_args(
    what: &'static str,
    flag: &'static str,
    inline: &str,
    file: Option<&std::path::Path>,
) -> Result<String, SettingsError> {
    let Some(path) = file else {
        return Ok(inline.to_owned());
    };
    let contents = files::read(what, flag, path).map_err(ConfigError::from)?;
    if let Some(warning) = files::exposure_warning(what, path, &contents, "them") {
        tracing::warn!("{warning}");
    }
    let mut text = String::from_utf8(contents.bytes).map_err(|e| {
        SettingsError::Usage(format!(
            "{what} {} ({flag}) are not UTF-8 text (at byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// A plugin's refusal of its arguments, with the arguments (their whitespace-separated tokens
/// and their words, of at least 4 characters) masked in the plugin's own message: they may
/// hold secrets.
fn masked(e: PluginError, args: &str) -> PluginError {
    match e {
        PluginError::Init {
            kind,
            path,
            message,
        } => PluginError::Init {
            kind,
            path,
            message: secrets::Secrets::with_words([args])
                .redact(&message)
                .into_owned(),
        },
        other => other,
    }
}

/// One stream's share of a budget the record engine's streams split between them.
fn stream_share(budget: usize, streams: usize) -> usize {
    (budget / streams.max(1)).max(MIN_STREAM_SHARE_BYTES)
}

fn parse_or(props: &ClientProps, key: &str, default: usize) -> Result<usize, SettingsError> {
    match props.get(key) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| {
            SettingsError::Usage(format!(
                "producer config {}: `{key} = {v}` is not a whole number",
                props.path.display()
            ))
        }),
    }
}

/// The first setting the batch engine (`--copy.mode batches`) cannot serve, if any.
pub fn batch_refusal(settings: &Settings) -> Option<String> {
    if settings.handler.is_some() {
        return Some("--message.handler (it sees each record)".to_owned());
    }
    if settings.options.partitioning == Partitioning::Hash {
        return Some("--partitioning hash (batches keep their partition)".to_owned());
    }
    if settings.provenance.is_some() {
        return Some("--loop.prevention true (a header on every record)".to_owned());
    }
    if settings.exactly_once.is_some() {
        return Some("--exactly.once true".to_owned());
    }
    for (role, props) in [
        ("consumer", &settings.consumer),
        ("producer", &settings.producer),
    ] {
        if let Err(reason) = wire_security::wire_security(props) {
            return Some(format!("{reason} in the {role} config"));
        }
    }
    None
}

/// The producer settings the batch engine does not apply, one line each for a start-up
/// warning: it sends the source's records sections compressed as the source's producers wrote
/// them, so a `compression.*` of the producer config has no effect there. Not refused: Kafka's
/// stock config/producer.properties sets `compression.type=none`.
///
/// Also a `request.timeout.ms` that [`batch_request_wait`] shortens, naming both keys.
pub fn batch_unapplied(settings: &Settings) -> Vec<String> {
    let mut lines: Vec<String> = ["compression.type", "compression.codec", "compression.level"]
        .into_iter()
        .filter_map(|key| {
            let value = settings.producer.get(key)?;
            Some(format!(
                "`{key} = {value}` in the producer config {} is not applied by the batch \
                 engine (--copy.mode auto or batches): record batches go to the target \
                 compressed as the source's producers wrote them (use --copy.mode records to \
                 compress them again)",
                settings.producer.path.display()
            ))
        })
        .collect();
    if settings.producers_per_stream > 1 {
        lines.push(format!(
            "--producers.per.stream {} is not applied by the batch engine (--copy.mode auto or \
             batches): it puts many partitions in each Produce request, over one connection \
             per target broker and stream",
            settings.producers_per_stream
        ));
    }
    let wait = batch_request_wait(settings);
    let asked = settings.producer.request_timeout();
    if wait < asked {
        lines.push(format!(
            "`request.timeout.ms = {}` in the producer config {} is above a fifth of the \
             consumer's max.poll.interval.ms ({} ms, {}): in the batch engine each \
             request waits at most {} ms, so that a stream whose requests get no answer still \
             polls its group within the interval (raise max.poll.interval.ms to wait longer)",
            asked.as_millis(),
            settings.producer.path.display(),
            settings.consumer.max_poll_interval().as_millis(),
            settings.consumer.path.display(),
            wait.as_millis()
        ));
    }
    lines
}

/// How long one request of the batch engine waits (its connects, Fetch, Metadata and Produce
/// answers): the producer config's `request.timeout.ms`, at most a fifth of the consumer's
/// `max.poll.interval.ms`. The engine polls the consumer between its rounds only, and a round
/// whose broker does not answer waits up to four of these (a leader refresh, the connects,
/// the answers, the refresh after a failure) with the fetch's answer besides: a longer wait
/// would keep the stream from its group past the interval, and librdkafka would leave the
/// group (its partitions lost, copied again from the last commit).
pub fn batch_request_wait(settings: &Settings) -> Duration {
    settings
        .producer
        .request_timeout()
        .min(settings.consumer.max_poll_interval() / 5)
}

/// How long the batch engine's look at the brokers at start may take
/// ([`batch_request_wait`], at most 10 s): a broker that does not answer it in time is no
/// reason to copy records, so a longer wait would only hold the start.
pub fn batch_probe_wait(settings: &Settings) -> Duration {
    batch_request_wait(settings).min(Duration::from_secs(10))
}

/// `--metrics.addr`: a HOST:PORT that resolves.
fn metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .map_err(|e| format!("--metrics.addr {text:?} is not a HOST:PORT address: {e}"))?
        .next()
        .ok_or_else(|| format!("--metrics.addr {text:?} resolves to no address"))
}

/// `--on.handler.error`: what a record the message handler refuses does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnHandlerError {
    /// The mirror stops (exit 1); the record is not committed.
    Stop,
    /// Logged and counted; the commit moves past it.
    Skip,
    /// Copied as it is to this target topic; the commit moves past it once the target
    /// acknowledged the copy.
    DeadLetter(String),
}

/// `--on.handler.error` and `--dead.letter.topic`, checked against each other and the rest.
fn on_handler_error(
    args: &MirrorArgs,
    settings: &Settings,
) -> Result<OnHandlerError, SettingsError> {
    use flags::HandlerErrorPolicy as P;
    let usage = |m: String| Err(SettingsError::Usage(m));
    let policy = args.on_handler_error;
    let name = match policy {
        P::Stop => "stop",
        P::Skip => "skip",
        P::DeadLetter => "dead-letter",
    };
    if policy != P::Stop && args.message_handler.is_none() {
        return usage(format!(
            "--on.handler.error {name}: there is no message handler (--message.handler) to \
             refuse a record; drop the flag or name a handler"
        ));
    }
    if policy != P::Stop && settings.exactly_once.is_some() {
        return usage(format!(
            "--on.handler.error {name} is not served in the exactly-once mode (--exactly.once \
             true): a handler error there stops the mirror; drop one of the two"
        ));
    }
    match (policy, &args.dead_letter_topic) {
        (P::Stop, None) => Ok(OnHandlerError::Stop),
        (P::Skip, None) => Ok(OnHandlerError::Skip),
        (P::DeadLetter, None) => usage(
            "--on.handler.error dead-letter needs --dead.letter.topic NAME: the target topic \
             the refused records are copied to"
                .to_owned(),
        ),
        (P::DeadLetter, Some(topic)) => {
            routing::check_topic_name("--dead.letter.topic", topic)
                .map_err(SettingsError::Usage)?;
            if settings.offset_mapping.as_deref() == Some(topic.as_str()) {
                return usage(format!(
                    "--dead.letter.topic {topic:?} is the offset-mapping topic \
                     (--offset.mapping.topic); name another topic"
                ));
            }
            Ok(OnHandlerError::DeadLetter(topic.clone()))
        }
        (_, Some(topic)) => usage(format!(
            "--dead.letter.topic {topic:?} is used only with --on.handler.error dead-letter \
             (the policy is {name}); drop it or add --on.handler.error dead-letter"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(producer_extra: &[(&str, &str)]) -> Settings {
        with_streams(defaults::NUM_STREAMS as usize, &[], producer_extra)
    }

    fn with_streams(
        streams: usize,
        consumer_extra: &[(&str, &str)],
        producer_extra: &[(&str, &str)],
    ) -> Settings {
        let mut pairs = vec![("bootstrap.servers", "x:1"), ("group.id", "g")];
        pairs.extend_from_slice(consumer_extra);
        let consumer = ClientProps::from_pairs(Role::Consumer, "c.toml", pairs);
        let mut pairs = vec![("bootstrap.servers", "y:1")];
        pairs.extend_from_slice(producer_extra);
        let producer = ClientProps::from_pairs(Role::Producer, "p.toml", pairs);
        let options = SettingsOptions {
            num_streams: streams,
            ..SettingsOptions::default()
        };
        Settings::new(consumer, producer, TopicFilter::new("t").unwrap(), options).unwrap()
    }

    #[test]
    fn counted_nouns_take_their_plural() {
        assert_eq!(counted(1, "batch"), "1 batch");
        assert_eq!(counted(0, "batch"), "0 batches");
        assert_eq!(counted(3, "stream"), "3 streams");
    }

    #[test]
    fn the_streams_split_one_prefetch_and_one_in_flight_budget() {
        for (streams, prefetch_kbytes, in_flight) in [
            (1, "32768", 16 << 20),
            (4, "8192", 4 << 20),
            (64, "1024", 1 << 20),
        ] {
            let s = with_streams(streams, &[], &[]);
            assert_eq!(
                s.consumer.get("queued.max.messages.kbytes"),
                Some(prefetch_kbytes),
                "{streams} streams"
            );
            assert_eq!(s.max_in_flight_bytes, in_flight, "{streams} streams");
            // The queue itself is not split: a large record still fits in it.
            assert_eq!(s.producer.get("queue.buffering.max.kbytes"), Some("65536"));
        }
    }

    #[test]
    fn a_prefetch_or_queue_the_user_chose_is_not_split() {
        let s = with_streams(
            4,
            &[("queued.max.messages.kbytes", "65536")],
            &[("queue.buffering.max.kbytes", "16384")],
        );
        assert_eq!(s.consumer.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(s.max_in_flight_bytes, 8 << 20);
    }

    #[test]
    fn a_producer_compression_the_batch_engine_cannot_apply_is_named() {
        assert!(batch_unapplied(&settings(&[])).is_empty());
        let lines = batch_unapplied(&settings(&[("compression.type", "zstd")]));
        assert_eq!(lines.len(), 1, "{lines:?}");
        for needle in ["`compression.type = zstd`", "p.toml", "--copy.mode records"] {
            assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
        }
    }

    #[test]
    fn producers_per_stream_the_batch_engine_does_not_use_are_named() {
        let mut s = settings(&[]);
        s.producers_per_stream = 4;
        let lines = batch_unapplied(&s);
        assert_eq!(lines.len(), 1, "{lines:?}");
        for needle in [
            "--producers.per.stream 4",
            "not applied by the batch engine",
        ] {
            assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
        }
    }

    #[test]
    fn the_batch_engine_waits_at_most_a_fifth_of_the_poll_interval_per_request() {
        let s = settings(&[("request.timeout.ms", "5000")]);
        assert_eq!(batch_request_wait(&s), Duration::from_millis(5000));
        assert!(batch_unapplied(&s).is_empty());
        let mut s = settings(&[("request.timeout.ms", "5000")]);
        s.consumer = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [
                ("bootstrap.servers", "x:1"),
                ("group.id", "g"),
                ("max.poll.interval.ms", "3000"),
            ],
        );
        assert_eq!(batch_request_wait(&s), Duration::from_millis(600));
        let lines = batch_unapplied(&s);
        assert_eq!(lines.len(), 1, "{lines:?}");
        for needle in [
            "`request.timeout.ms = 5000`",
            "p.toml",
            "max.poll.interval.ms (3000 ms, c.toml)",
            "at most 600 ms",
        ] {
            assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
        }
    }

    #[test]
    fn the_target_topic_not_the_producer_bounds_a_record_unless_the_user_chose() {
        let s = settings(&[]);
        assert_eq!(s.producer.get("message.max.bytes"), Some("1000000000"));
        let bound = record_size_bound(&s.producer);
        assert!(
            bound.contains("each target topic's max.message.bytes"),
            "{bound}"
        );
        let s = settings(&[("message.max.bytes", "3000")]);
        assert_eq!(s.producer.get("message.max.bytes"), Some("3000"));
        let bound = record_size_bound(&s.producer);
        assert!(
            bound.contains("producer's message.max.bytes = 3000 (p.toml)"),
            "{bound}"
        );
    }
}
