//! Validated settings: the command line ([`flags`], as typed) and both config files
//! ([`client`]), with the no-data-loss rules applied, and the routing values ([`routing`]).
//! Everything a user can get wrong is found here, before any broker is contacted.

pub mod client;
pub mod exactly_once;
pub mod flags;
pub mod java;
pub mod routing;

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
    pub const COMMIT_INTERVAL_MS: u64 = 60_000;
    pub const ABORT_ON_SEND_FAILURE: bool = true;
    pub const NO_DATA_LOSS: bool = true;
    pub const PARTITIONING: Partitioning = Partitioning::Preserve;
    pub const SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
    pub const TOPIC_REFRESH_INTERVAL_MS: u64 = 30_000;
    pub const STARTUP_TIMEOUT_MS: u64 = 30_000;
    pub const EXACTLY_ONCE: bool = false;
    pub const TRANSACTION_INTERVAL_MS: u64 = 100;
    pub const SYNC_GROUP_OFFSETS_INTERVAL_MS: u64 = 10_000;

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

/// `n` and the noun, plural unless `n` is 1 ("1 partition", "2 partitions"): for the lines
/// users read, from every layer above this one.
pub fn counted(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    if n == "1" {
        format!("1 {noun}")
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
    pub num_streams: usize,
    pub commit_interval: Duration,
    pub abort_on_send_failure: bool,
    pub no_data_loss: bool,
    pub partitioning: Partitioning,
    pub shutdown_timeout: Duration,
    pub topic_refresh_interval: Duration,
    pub startup_timeout: Duration,
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
/// The producer's `message.max.bytes` unless the user chose: librdkafka's maximum. It is the
/// client-side limit on one record (and on a batch, with `batch.size`, whichever is smaller).
/// librdkafka's default (1,000,000) is below Kafka's default topic `max.message.bytes`
/// (1,048,588), and a target topic made by `--create.topics` copies the source topic's limit,
/// which may be larger still: a record the target would take must not be refused before it
/// is sent. The bound on a record is then the target topic's `max.message.bytes`, enforced by
/// its brokers (a send failure that names it). Batches stay bounded by `batch.size`.
pub const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000_000;

impl Settings {
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
        if let Some(eo) = exactly_once {
            exactly_once::producer_props(&mut settings.producer);
            settings.exactly_once = Some(eo);
        }
        settings.create_topics = args
            .create_topics
            .then(|| args.create_topics_configs.clone());
        settings.target_topic =
            TopicTemplate::parse(&args.target_topic).map_err(SettingsError::Usage)?;
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
        // Plugins last: loading runs their code, so only once everything else is valid.
        if let Some(path) = &args.message_handler {
            refuse_java_class("--message.handler", "message handler", path)?;
            settings.handler = Some(HandlerPlugin::load(path, &args.message_handler_args)?);
        }
        if let Some(path) = &args.rebalance_listener {
            refuse_java_class("--consumer.rebalance.listener", "rebalance listener", path)?;
            settings.listener = Some(ListenerPlugin::load(path, &args.rebalance_listener_args)?);
        }
        Ok(settings)
    }

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
        consumer.apply_consumer_rules(opts.no_data_loss)?;
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
            num_streams: opts.num_streams,
            commit_interval: opts.commit_interval,
            abort_on_send_failure: opts.abort_on_send_failure,
            no_data_loss: opts.no_data_loss,
            partitioning: opts.partitioning,
            shutdown_timeout: opts.shutdown_timeout,
            topic_refresh_interval: opts.topic_refresh_interval,
            startup_timeout: opts.startup_timeout,
            max_in_flight_records: (queue_messages / 2).max(1),
            max_in_flight_bytes: (queue_kbytes * 1024 / 2).max(1),
            handler: None,
            listener: None,
            target_topic: TopicTemplate::default(),
            provenance: None,
            create_topics: None,
            exactly_once: None,
            offset_mapping: Some(defaults::offset_mapping_topic(None)),
            sync_groups: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(producer_extra: &[(&str, &str)]) -> Settings {
        let consumer = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [("bootstrap.servers", "x:1"), ("group.id", "g")],
        );
        let mut pairs = vec![("bootstrap.servers", "y:1")];
        pairs.extend_from_slice(producer_extra);
        let producer = ClientProps::from_pairs(Role::Producer, "p.toml", pairs);
        Settings::new(
            consumer,
            producer,
            TopicFilter::new("t").unwrap(),
            SettingsOptions::default(),
        )
        .unwrap()
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
