//! Client configuration files and the no-data-loss rules.
//!
//! Both `--consumer.config` and `--producer.config` hold librdkafka properties. A file ending in
//! `.properties` is read as a Java properties file (so MirrorMaker users can reuse theirs), its
//! Java keys translated by [`super::java`]'s table; a file ending in `.toml` is TOML, whose
//! dotted keys (`bootstrap.servers = "..."`) TOML parses as nested tables and we flatten back
//! to `bootstrap.servers`. Any other name (`consumer.config`): TOML if it parses as TOML, else
//! Java properties if it plainly is that, else an error saying how to name it.
//!
//! [`ClientProps::apply_consumer_rules`] and [`ClientProps::apply_producer_rules`] turn what the
//! user wrote into what the mirror runs with: with no-data-loss on, settings that could lose
//! records are refused by name, and the safe ones are filled in where the user left them out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::toml_file::{self, TomlError};
use rdkafka::config::ClientConfig;

/// The context of the clients made only to validate a configuration: they have no broker,
/// and what librdkafka says about that is not for the user.
struct Silent;

impl rdkafka::ClientContext for Silent {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: rdkafka::error::KafkaError, _: &str) {}
}

impl rdkafka::consumer::ConsumerContext for Silent {}
impl rdkafka::producer::ProducerContext for Silent {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Which client a configuration file is for; used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Consumer,
    Producer,
}

impl Role {
    /// The flag that names this client's config file.
    pub fn flag(self) -> &'static str {
        match self {
            Role::Consumer => "--consumer.config",
            Role::Producer => "--producer.config",
        }
    }

    /// "consumer config", "producer config": what the file is, in messages.
    pub fn config(self) -> &'static str {
        match self {
            Role::Consumer => "consumer config",
            Role::Producer => "producer config",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Consumer => "consumer",
            Role::Producer => "producer",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] super::files::FileError),
    #[error("{role} config {} is not UTF-8 (at byte {at}), which TOML files are; a Java .properties file (ISO-8859-1) must end in .properties", path.display())]
    NotUtf8 {
        role: Role,
        path: PathBuf,
        at: usize,
    },
    #[error("{role} config {} is not valid TOML: {message}", path.display())]
    Toml {
        role: Role,
        path: PathBuf,
        message: String,
    },
    #[error("{role} config {} is neither TOML ({not_toml}) nor plainly a Java properties file; name it *.toml to have it read as TOML, or *.properties as Java properties", path.display())]
    Unrecognised {
        role: Role,
        path: PathBuf,
        /// What the TOML parser said, on one line.
        not_toml: String,
    },
    #[error("{role} config {}, line {line}: {message}", path.display())]
    Properties {
        role: Role,
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{role} config {}: key `{key}` has a {kind} value; librdkafka properties take a string, number or boolean (write lists as \"a,b\")", path.display())]
    UnsupportedValue {
        role: Role,
        path: PathBuf,
        key: String,
        kind: &'static str,
    },
    #[error("{role} config {}: `{key}` is required ({hint})", path.display())]
    Missing {
        role: Role,
        path: PathBuf,
        key: &'static str,
        hint: &'static str,
    },
    #[error("{role} config {}: `{key} = {value}` could lose records; the mirror needs {required}. Remove the key, or run with --no.data.loss false to use your settings as given", path.display())]
    Weakening {
        role: Role,
        path: PathBuf,
        key: String,
        value: String,
        required: &'static str,
    },
    #[error("{role} config {}: {message}", path.display())]
    Rejected {
        role: Role,
        path: PathBuf,
        message: String,
    },
}

/// Whether a property holds a secret (passwords, tokens, private keys, JAAS configs): its
/// value never appears in a log line, an error or a metric.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "jaas",
        "credential",
        "private",
    ]
    .iter()
    .any(|word| key.contains(word))
        || key.ends_with(".key")
        || key.ends_with("oauthbearer.config")
        || key.ends_with(".key.pem")
        || key.contains("key.pem")
}

/// Group settings of the classic protocol that librdkafka refuses with
/// `group.protocol = consumer` (KIP-848): the broker decides them.
const CLASSIC_GROUP_ONLY: [&str; 4] = [
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
];

/// librdkafka's default `max.poll.interval.ms`.
pub const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;
/// librdkafka's default `transaction.timeout.ms`.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;
/// librdkafka's default `request.timeout.ms` for producers.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;

/// The librdkafka properties of one client, with the file they came from.
#[derive(Clone)]
pub struct ClientProps {
    pub role: Role,
    pub path: PathBuf,
    pub props: BTreeMap<String, String>,
}

impl std::fmt::Debug for ClientProps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let props: BTreeMap<&str, &str> = self
            .props
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_key(k) {
                    "[redacted]"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("ClientProps")
            .field("role", &self.role)
            .field("path", &self.path)
            .field("props", &props)
            .finish()
    }
}

impl ClientProps {
    /// Reads a `.properties` or TOML file by the rules of [`super::files`] (a regular file of
    /// a config's size that only its owner may write); warns, at warn, when the file holds a
    /// secret and its group or others may read it.
    pub fn load(role: Role, path: &Path) -> Result<ClientProps, ConfigError> {
        let contents = super::files::read(role.config(), role.flag(), path)?;
        let (props, secret_keys) = match Format::named(path) {
            Some(Format::Properties) => read_properties(role, path, &contents.bytes)?,
            Some(Format::Toml) => read_toml(role, path, &contents.bytes)?,
            None => read_by_content(role, path, &contents.bytes)?,
        };
        if !secret_keys.is_empty() {
            let holding = secret_keys
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            if let Some(warning) =
                super::files::exposure_warning(role.config(), path, &contents, &holding)
            {
                tracing::warn!("{warning}");
            }
        }
        Ok(ClientProps {
            role,
            path: path.to_owned(),
            props,
        })
    }

    /// Builds properties given in code (the demo, tests), as if read from `origin`.
    pub fn from_pairs<'a>(
        role: Role,
        origin: &str,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> ClientProps {
        ClientProps {
            role,
            path: PathBuf::from(origin),
            props: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// `text` with the value of every secret property replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (k, v) in &self.props {
            if is_secret_key(k) && !v.is_empty() {
                out = out.replace(v.as_str(), "[redacted]");
            }
        }
        out
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.props.get(key).map(String::as_str)
    }

    pub(crate) fn set(&mut self, key: &str, value: &str) {
        self.props.insert(key.to_owned(), value.to_owned());
    }

    pub(crate) fn remove(&mut self, key: &str) {
        self.props.remove(key);
    }

    pub(crate) fn set_default(&mut self, key: &str, value: &str) {
        self.props
            .entry(key.to_owned())
            .or_insert_with(|| value.to_owned());
    }

    fn require(&self, key: &'static str, hint: &'static str) -> Result<(), ConfigError> {
        match self.get(key) {
            Some(v) if !v.trim().is_empty() => Ok(()),
            _ => Err(ConfigError::Missing {
                role: self.role,
                path: self.path.clone(),
                key,
                hint,
            }),
        }
    }

    /// Refuses `key` unless its value (case-insensitive) is one of `allowed`.
    fn refuse_unless(
        &self,
        key: &str,
        allowed: &[&str],
        required: &'static str,
    ) -> Result<(), ConfigError> {
        match self.get(key) {
            Some(v) if !allowed.iter().any(|a| a.eq_ignore_ascii_case(v.trim())) => {
                Err(ConfigError::Weakening {
                    role: self.role,
                    path: self.path.clone(),
                    key: key.to_owned(),
                    value: v.to_owned(),
                    required,
                })
            }
            _ => Ok(()),
        }
    }

    /// The consumer: explicit commits only, cooperative rebalancing unless the user chose.
    pub fn apply_consumer_rules(&mut self, no_data_loss: bool) -> Result<(), ConfigError> {
        self.require(
            "bootstrap.servers",
            "the source cluster's brokers, host:port[,host:port]",
        )?;
        self.require(
            "group.id",
            "the consumer group the mirror instances share, e.g. group.id = \"mirror\"",
        )?;
        if no_data_loss {
            self.refuse_unless(
                "enable.auto.commit",
                &["false"],
                "enable.auto.commit = false (it commits only what the target acknowledged)",
            )?;
            self.set_default("enable.auto.commit", "false");
            self.refuse_unless(
                "isolation.level",
                &["read_committed"],
                "isolation.level = read_committed (read_uncommitted copies the records of aborted \
                 transactions as if they were committed)",
            )?;
        }
        // Offsets are committed explicitly from the acknowledged-offset tracker; the
        // consumer's own offset store is never used.
        self.props
            .insert("enable.auto.offset.store".into(), "false".into());
        if self.uses_kip_848_protocol() {
            // The broker assigns the partitions (KIP-848); librdkafka refuses the classic
            // protocol's group settings at client creation, so they are refused here by name.
            for key in CLASSIC_GROUP_ONLY {
                if self.get(key).is_some() {
                    return Err(ConfigError::Rejected {
                        role: self.role,
                        path: self.path.clone(),
                        message: format!(
                            "`{key}` cannot be used with `group.protocol=consumer` (KIP-848): the \
                             broker sets it for the group (the assignor: `group.remote.assignor` \
                             = uniform or range; timeouts: the broker's \
                             group.consumer.* configs). Remove the key, or use \
                             `group.protocol=classic`"
                        ),
                    });
                }
            }
        } else {
            self.set_default("partition.assignment.strategy", "cooperative-sticky");
        }
        // A topic that starts matching the whitelist is mirrored from its first record.
        self.set_default("auto.offset.reset", "earliest");
        // A mirror consumes slower than it can fetch, so its prefetch queue fills up; with
        // librdkafka's default (1000 ms) every partition then waits a second before fetching
        // again, and the stream starves. Measured with mirror-bench: see docs/benchmark.md.
        self.set_default("fetch.queue.backoff.ms", "10");
        // The prefetch queue holds up to queued.min.messages records (librdkafka: 100,000)
        // before the byte limit applies; with small records that was most of a stream's
        // memory (about 45 MiB of 100-byte records and their per-record overhead). 10,000
        // keeps 4 streams of 1 KiB records under 256 MiB; it cost about 13% of one stream's
        // throughput over 96 partitions in mirror-bench. The trade-off is in docs/benchmark.md (Memory).
        self.set_default("queued.min.messages", "10000");
        self.validate()
    }

    /// Whether the consumer joins its group with the KIP-848 protocol (`group.protocol =
    /// consumer`), where the broker assigns partitions.
    pub fn uses_kip_848_protocol(&self) -> bool {
        self.get("group.protocol")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("consumer"))
    }

    /// The consumer's `max.poll.interval.ms`, the group's rebalance timeout (librdkafka's
    /// default where it is not set or not a number of milliseconds).
    pub fn max_poll_interval(&self) -> Duration {
        self.millis("max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL_MS)
    }

    /// The producer's `request.timeout.ms`, how long a request may wait for its answer
    /// (librdkafka's default where it is not set or not a number of milliseconds).
    pub fn request_timeout(&self) -> Duration {
        self.millis("request.timeout.ms", DEFAULT_REQUEST_TIMEOUT_MS)
    }

    /// The producer's `transaction.timeout.ms`, how long one transactional call may take
    /// (librdkafka's default where it is not set or not a number of milliseconds).
    pub fn transaction_timeout(&self) -> Duration {
        self.millis("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    }

    fn millis(&self, key: &str, default: u64) -> Duration {
        Duration::from_millis(
            self.get(key)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default),
        )
    }

    /// The producer: acknowledged by all replicas, idempotent, retried for ever.
    pub fn apply_producer_rules(&mut self, no_data_loss: bool) -> Result<(), ConfigError> {
        self.require(
            "bootstrap.servers",
            "the target cluster's brokers, host:port[,host:port]",
        )?;
        if no_data_loss {
            for key in ["acks", "request.required.acks"] {
                self.refuse_unless(key, &["all", "-1"], "acks = all")?;
            }
            self.refuse_unless(
                "enable.idempotence",
                &["true"],
                "enable.idempotence = true (ordered retries without duplicates)",
            )?;
            for key in ["message.timeout.ms", "delivery.timeout.ms"] {
                self.refuse_unless(key, &["0"], "no delivery timeout (0: retry for ever)")?;
            }
            for key in ["retries", "message.send.max.retries"] {
                self.refuse_unless(
                    key,
                    &["2147483647"],
                    "unlimited retries (2147483647, the default)",
                )?;
            }
            self.set_default("acks", "all");
            self.set_default("enable.idempotence", "true");
            self.set_default("message.timeout.ms", "0");
        }
        self.validate()
    }

    /// Checks every key and value with librdkafka itself, without connecting to anything:
    /// each key as it is set, then the whole by making the client, as the mirror will (some
    /// values, such as an unknown `partition.assignment.strategy`, are only refused then).
    /// The client is made without `bootstrap.servers`, so it has no broker to contact.
    fn validate(&self) -> Result<(), ConfigError> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::error::KafkaError;
        use rdkafka::producer::BaseProducer;
        use rdkafka::types::RDKafkaConfRes;
        let rejected = |e: KafkaError| ConfigError::Rejected {
            role: self.role,
            path: self.path.clone(),
            message: self.redact(&match e {
                KafkaError::ClientConfig(
                    RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
                    description,
                    key,
                    _,
                ) => match nearest_property(&key) {
                    Some(near) => format!("key `{key}`: {description}; did you mean `{near}`?"),
                    None => format!("key `{key}`: {description}"),
                },
                KafkaError::ClientConfig(_, description, key, _) => {
                    format!("key `{key}`: {description}")
                }
                KafkaError::ClientCreation(reason) => {
                    format!("librdkafka cannot make a {} from it: {reason}", self.role)
                }
                other => other.to_string(),
            }),
        };
        let mut config = self.client_config();
        config.create_native_config().map_err(rejected)?;
        config.remove("bootstrap.servers");
        match self.role {
            Role::Consumer => config
                .create_with_context::<_, BaseConsumer<Silent>>(Silent)
                .map(drop),
            Role::Producer => config
                .create_with_context::<_, BaseProducer<Silent>>(Silent)
                .map(drop),
        }
        .map_err(rejected)
    }

    /// Only what it takes to connect (address, security, client id), for short-lived helper
    /// clients such as start-up probes and verification readers.
    pub fn connection_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in &self.props {
            let connection = k == "bootstrap.servers"
                || k == "client.id"
                || k.starts_with("security.")
                || k.starts_with("ssl.")
                || k.starts_with("sasl.")
                || k.starts_with("broker.")
                || k.starts_with("socket.")
                || k.starts_with("api.version");
            if connection {
                config.set(k, v);
            }
        }
        config.set("log_level", "3");
        config
    }

    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in &self.props {
            config.set(k, v);
        }
        config
    }
}

/// The keys of `props` that hold a secret with a value.
fn secret_keys(props: &BTreeMap<String, String>) -> Vec<String> {
    props
        .iter()
        .filter(|(k, v)| is_secret_key(k) && !v.is_empty())
        .map(|(k, _)| k.clone())
        .collect()
}

/// The librdkafka property nearest to `key`, a name librdkafka does not have: the one fewest
/// edits away (a character added, removed or changed), if it is near enough to be a slip of
/// the keyboard (at most a third of the name, and 3, edited).
fn nearest_property(key: &str) -> Option<String> {
    nearest(key, crate::native::librdkafka_property_names())
}

fn nearest(key: &str, names: impl IntoIterator<Item = String>) -> Option<String> {
    let limit = (key.chars().count() / 3).min(3);
    names
        .into_iter()
        .map(|name| (edit_distance(key, &name), name))
        .filter(|(distance, _)| *distance <= limit)
        .min()
        .map(|(_, name)| name)
}

/// Levenshtein's distance between `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// The two formats a config file may be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Toml,
    Properties,
}

impl Format {
    /// The format a file's name says (`*.toml`, `*.properties`), if it says one.
    fn named(path: &Path) -> Option<Format> {
        let ext = path.extension()?;
        if ext.eq_ignore_ascii_case("properties") {
            Some(Format::Properties)
        } else if ext.eq_ignore_ascii_case("toml") {
            Some(Format::Toml)
        } else {
            None
        }
    }
}

/// A config's settings, with the keys that hold secrets.
type Read = (BTreeMap<String, String>, Vec<String>);

fn read_properties(role: Role, path: &Path, bytes: &[u8]) -> Result<Read, ConfigError> {
    let parsed = super::properties::parse(bytes).map_err(|e| ConfigError::Properties {
        role,
        path: path.to_owned(),
        line: e.line,
        message: e.message,
    })?;
    warn_utf8_read_as_latin1(role, path, bytes, &parsed.non_ascii);
    let secret_keys = secret_keys(&parsed.props);
    Ok((read_java_keys(role, path, &parsed.props)?, secret_keys))
}

fn read_toml(role: Role, path: &Path, bytes: &[u8]) -> Result<Read, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::NotUtf8 {
        role,
        path: path.to_owned(),
        at: e.valid_up_to(),
    })?;
    let props = toml_file::parse(text).map_err(|e| match e {
        TomlError::Parse(message) => ConfigError::Toml {
            role,
            path: path.to_owned(),
            message,
        },
        TomlError::Unsupported { key, kind } => ConfigError::UnsupportedValue {
            role,
            path: path.to_owned(),
            key,
            kind,
        },
    })?;
    let secret_keys = secret_keys(&props);
    Ok((props, secret_keys))
}

/// A file whose name says no format (`consumer.config`, `consumer.cfg`): TOML if it is TOML,
/// else a Java properties file if it is plainly one ([`super::properties::is_plain`]: what Java
/// MirrorMaker users bring, under whatever name their deployment gave it); else neither, and
/// the error says how to name it.
fn read_by_content(role: Role, path: &Path, bytes: &[u8]) -> Result<Read, ConfigError> {
    let not_toml = match read_toml(role, path, bytes) {
        Err(ConfigError::Toml { message, .. }) => message,
        Err(ConfigError::NotUtf8 { at, .. }) => format!("not UTF-8 at byte {at}"),
        other => return other,
    };
    if super::properties::is_plain(bytes) {
        tracing::debug!(
            "{role} config {}: read as a Java properties file (it is not TOML)",
            path.display()
        );
        return read_properties(role, path, bytes);
    }
    Err(ConfigError::Unrecognised {
        role,
        path: path.to_owned(),
        not_toml,
    })
}

/// A `.properties` file is read as ISO-8859-1, as Java reads it ([`super::properties`]); a
/// file that is valid UTF-8 with non-ASCII characters was probably written as UTF-8, and its
/// user may expect otherwise: each such key is named (never its value), at warn.
fn warn_utf8_read_as_latin1(role: Role, path: &Path, bytes: &[u8], keys: &[(usize, String)]) {
    if keys.is_empty() || std::str::from_utf8(bytes).is_err() {
        return;
    }
    for (line, key) in keys {
        tracing::warn!(
            "{role} config {}, line {line}: `{key}` holds non-ASCII text written as UTF-8,              read as ISO-8859-1 as Java's MirrorMaker reads .properties files (each byte one              character: what works with Java works here). If it is meant as UTF-8 text, write              its non-ASCII characters as \\uXXXX escapes, or use a TOML file",
            path.display()
        );
    }
}

/// A `.properties` file's keys as librdkafka properties ([`super::java`]'s rules): each key
/// ignored is logged once here, at warn; each one read under another name or value at info.
fn read_java_keys(
    role: Role,
    path: &Path,
    java: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let translated =
        super::java::translate(java, super::java::librdkafka_knows).map_err(|message| {
            ConfigError::Rejected {
                role,
                path: path.to_owned(),
                message,
            }
        })?;
    for warning in &translated.warnings {
        tracing::warn!("{role} config {}: {warning}", path.display());
    }
    if !translated.translated.is_empty() {
        tracing::info!(
            "{role} config {}: read Java {}",
            path.display(),
            translated.translated.join(", ")
        );
    }
    Ok(translated.props)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_redacted_wherever_the_props_are_shown() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "ssl.key.pem",
            "sasl.jaas.config",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "bootstrap.servers",
            "ssl.key.location",
            "sasl.username",
            "acks",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
        let props = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [("sasl.password", "hunter2"), ("sasl.username", "alice")],
        );
        assert_eq!(
            props.redact("login alice/hunter2 failed"),
            "login alice/[redacted] failed"
        );
        let debug = format!("{props:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("alice"),
            "{debug}"
        );
    }

    #[test]
    fn java_properties_with_comments_separators_and_continuations() {
        let text = "# comment\n! other\nbootstrap.servers=a:1,\\\n    b:2\ngroup.id : mirror\nclient.id  x\nsasl.jaas.config=a\\=b\n";
        let props = super::super::properties::parse(text.as_bytes())
            .unwrap()
            .props;
        assert_eq!(props["bootstrap.servers"], "a:1,b:2");
        assert_eq!(props["group.id"], "mirror");
        assert_eq!(props["client.id"], "x");
        assert_eq!(props["sasl.jaas.config"], "a=b");
    }

    #[test]
    fn weakening_settings_are_refused_by_name_unless_no_data_loss_is_off() {
        let mut p = ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [("bootstrap.servers", "x:1"), ("acks", "1")],
        );
        let err = p
            .clone()
            .apply_producer_rules(true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`acks = 1`") && err.contains("--no.data.loss false"),
            "{err}"
        );
        p.apply_producer_rules(false).unwrap();
        assert_eq!(p.get("acks"), Some("1"));

        let mut c = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [
                ("bootstrap.servers", "x:1"),
                ("group.id", "g"),
                ("enable.auto.commit", "true"),
            ],
        );
        let err = c.apply_consumer_rules(true).unwrap_err().to_string();
        assert!(err.contains("enable.auto.commit"), "{err}");
    }

    #[test]
    fn safe_defaults_are_filled_in() {
        let mut p =
            ClientProps::from_pairs(Role::Producer, "p.toml", [("bootstrap.servers", "x:1")]);
        p.apply_producer_rules(true).unwrap();
        assert_eq!(p.get("acks"), Some("all"));
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        assert_eq!(p.get("message.timeout.ms"), Some("0"));
        let mut c = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [("bootstrap.servers", "x:1"), ("group.id", "g")],
        );
        c.apply_consumer_rules(true).unwrap();
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(
            c.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
    }

    #[test]
    fn the_kip_848_group_protocol_leaves_the_assignor_to_the_broker() {
        let mut c = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [
                ("bootstrap.servers", "127.0.0.1:1"),
                ("group.id", "g"),
                ("group.protocol", "consumer"),
            ],
        );
        c.apply_consumer_rules(true).unwrap();
        assert_eq!(c.get("partition.assignment.strategy"), None);
        // librdkafka itself accepts the result (it checks the group protocol's rules when
        // the client is created, not when each property is set).
        let consumer: Result<rdkafka::consumer::BaseConsumer, _> = c.client_config().create();
        assert!(consumer.is_ok(), "{:?}", consumer.err());
    }

    #[test]
    fn classic_group_settings_under_the_kip_848_protocol_are_refused_by_name() {
        for key in [
            "partition.assignment.strategy",
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "group.protocol.type",
        ] {
            let value = match key {
                "partition.assignment.strategy" => "range",
                "group.protocol.type" => "consumer",
                _ => "3000",
            };
            let mut c = ClientProps::from_pairs(
                Role::Consumer,
                "c.toml",
                [
                    ("bootstrap.servers", "127.0.0.1:1"),
                    ("group.id", "g"),
                    ("group.protocol", "consumer"),
                    (key, value),
                ],
            );
            let err = c.apply_consumer_rules(true).unwrap_err().to_string();
            assert!(
                err.contains("c.toml")
                    && err.contains(key)
                    && err.contains("group.protocol=consumer")
                    && err.contains("broker"),
                "{err}"
            );
        }
    }

    fn java_file(name: &str, text: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        // Whatever the umask: a config file others may write is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (dir, path)
    }

    /// The properties a `.properties` file of these bytes loads as, or the error's text.
    fn java_load(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
        let (_dir, path) = java_file("c.properties", bytes);
        ClientProps::load(Role::Consumer, &path)
            .map(|p| p.props)
            .map_err(|e| e.to_string())
    }

    // What Java's `Properties.load(InputStream)` (Java 17, as Kafka's `Utils.loadProps`
    // reads a MirrorMaker config) makes of each input, checked with Java itself.

    #[test]
    fn a_surrogate_pair_escape_is_one_character_as_in_java() {
        let props = java_load(b"client.id=\\uD83D\\uDE00\n").unwrap();
        assert_eq!(props["client.id"], "\u{1F600}");
    }

    #[test]
    fn a_unicode_escape_without_four_hex_digits_is_refused_as_in_java() {
        for bytes in [
            &b"client.id=\\u41\n"[..],
            b"client.id=x\\u004\n",
            b"client.id=\\u41zz\n",
        ] {
            let err = java_load(bytes).unwrap_err();
            assert!(
                err.contains("line 1") && err.contains("client.id") && err.contains("4 hex digits"),
                "{err}"
            );
        }
    }

    #[test]
    fn bytes_are_read_as_iso_8859_1_as_java_reads_a_mirrormaker_config() {
        // A Latin-1 file: one byte, one character.
        let props = java_load(b"client.id=p\xe4ss\n").unwrap();
        assert_eq!(props["client.id"], "p\u{e4}ss");
        // A UTF-8 file reads as Java reads it: each byte one character, so a password that
        // works with Java's MirrorMaker works here (librdkafka sends it as UTF-8, as Java does).
        let props = java_load(b"client.id=p\xc3\xa4ss\n").unwrap();
        assert_eq!(props["client.id"], "p\u{c3}\u{a4}ss");
    }

    #[test]
    fn a_lone_carriage_return_ends_a_line_as_in_java() {
        let props = java_load(
            b"client.id=1\rgroup.id=2\r\nsasl.username=3\nsasl.password=4\\\r  5\rbootstrap.servers=6",
        )
        .unwrap();
        let want = [
            ("bootstrap.servers", "6"),
            ("client.id", "1"),
            ("group.id", "2"),
            ("sasl.password", "45"),
            ("sasl.username", "3"),
        ];
        let got: Vec<(&str, &str)> = props
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn only_space_tab_and_form_feed_are_whitespace_as_in_java() {
        let props = java_load(b"client.id=\xa0x\xa0\n \x0c\tgroup.id \t = : v \n").unwrap();
        assert_eq!(props["client.id"], "\u{a0}x\u{a0}");
        assert_eq!(props["group.id"], ": v ");
    }

    #[test]
    fn comments_and_continuations_end_where_java_ends_them() {
        // A line of one backslash continues into a comment; a comment does not continue; a
        // continuation into an empty line ends there; a backslash at the end of the file is
        // dropped.
        let props = java_load(
            b"\\\n#client.id=1\ngroup.id=2\n#x\\\nsasl.username=u\\\n\nsasl.password=p\\\n",
        )
        .unwrap();
        let got: Vec<(&str, &str)> = props
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("group.id", "2"),
                ("sasl.password", "p"),
                ("sasl.username", "u")
            ]
        );
    }

    #[test]
    fn a_bad_escape_in_a_secret_is_located_without_its_characters() {
        for (bytes, what) in [
            (&b"sasl.password=hunter2\\uZZZZsecret\n"[..], "4 hex digits"),
            (b"sasl.password=hunter2\\u41\n", "4 hex digits"),
            // Half a surrogate pair: Java keeps it, UTF-8 cannot hold it.
            (b"sasl.password=hunter2\\uD83Dsecret\n", "surrogate"),
            (b"sasl.password=\\uDE00hunter2\n", "surrogate"),
        ] {
            let err = java_load(bytes).unwrap_err();
            assert!(
                err.contains("`sasl.password`") && err.contains("line 1") && err.contains(what),
                "{err}"
            );
            for fragment in ["hunter2", "ZZZZ", "secret", "D83D", "DE00", "\\u41"] {
                assert!(!err.contains(fragment), "{fragment:?} in {err}");
            }
        }
    }

    #[test]
    fn a_jaas_syntax_error_names_no_fragment_of_a_value() {
        for jaas in [
            // An unquoted password with a space: `Part2` reads as an option without `=`.
            "required username=\"a\" password=Secret Part2;",
            "required username=\"a\" password=Secret Part2=;",
            "required username=\"a\" password=Secret Part2=x Part3;",
        ] {
            let (_dir, path) = java_file(
                "c.properties",
                format!(
                    "bootstrap.servers=x:1\ngroup.id=g\nsasl.jaas.config=\
                     org.apache.kafka.common.security.plain.PlainLoginModule {jaas}\n"
                ),
            );
            let err = ClientProps::load(Role::Consumer, &path).unwrap_err();
            let (shown, debug) = (err.to_string(), format!("{err:?}"));
            assert!(shown.contains("sasl.jaas.config"), "{shown}");
            for fragment in ["Secret", "Part2", "Part3"] {
                assert!(
                    !shown.contains(fragment) && !debug.contains(fragment),
                    "{fragment:?} in {shown}"
                );
            }
        }
    }

    #[test]
    fn jaas_plain_and_scram_credentials_become_sasl_username_and_password() {
        for module in [
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            "org.apache.kafka.common.security.scram.ScramLoginModule",
        ] {
            let (_dir, path) = java_file(
                "consumer.properties",
                format!(
                    "bootstrap.servers=x:1\ngroup.id=g\nsecurity.protocol=SASL_SSL\n\
                     sasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={module} required \\\n  \
                     username=\"alice\" password=\"hunter2;\\\\\\\"x\";\n"
                ),
            );
            let mut props = ClientProps::load(Role::Consumer, &path).unwrap();
            assert_eq!(props.get("sasl.username"), Some("alice"));
            assert_eq!(props.get("sasl.password"), Some("hunter2;\"x"));
            assert_eq!(props.get("sasl.jaas.config"), None);
            let debug = format!("{props:?}");
            assert!(
                !debug.contains("hunter2") && debug.contains("alice"),
                "{debug}"
            );
            props.apply_consumer_rules(true).unwrap();
        }
    }

    #[test]
    fn a_jaas_password_never_appears_in_an_error() {
        for jaas in [
            // No username: refused, naming the option, not the password.
            "org.apache.kafka.common.security.plain.PlainLoginModule required password=\"hunter2\";",
            // Not closed.
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\" password=\"hunter2",
            "org.example.CustomLoginModule required password=\"hunter2\";",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientSecret=\"hunter2\";",
        ] {
            let (_dir, path) = java_file(
                "c.properties",
                format!("bootstrap.servers=x:1\ngroup.id=g\nsasl.jaas.config={jaas}\n"),
            );
            let err = ClientProps::load(Role::Consumer, &path).unwrap_err();
            let (shown, debug) = (err.to_string(), format!("{err:?}"));
            assert!(shown.contains("sasl.jaas.config"), "{shown}");
            assert!(!shown.contains("hunter2") && !debug.contains("hunter2"), "{shown}");
        }
        // A librdkafka error after the translation is redacted too.
        let (_dir, path) = java_file(
            "c.properties",
            "bootstrap.servers=x:1\ngroup.id=g\nsasl.mechanism=PLAIN\nsasl.jaas.config=\
             org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\" \
             password=\"hunter2\";\nsocket.timeout.ms=hunter2\n",
        );
        let mut props = ClientProps::load(Role::Consumer, &path).unwrap();
        let err = props.apply_consumer_rules(true).unwrap_err().to_string();
        assert!(
            err.contains("socket.timeout.ms") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn java_keys_are_read_only_from_properties_files() {
        // TOML files hold librdkafka's own names: a Java key is refused there.
        let (_dir, path) = java_file(
            "c.toml",
            "bootstrap.servers = \"x:1\"\ngroup.id = \"g\"\nfetch.max.wait.ms = 10\n",
        );
        let mut props = ClientProps::load(Role::Consumer, &path).unwrap();
        let err = props.apply_consumer_rules(true).unwrap_err().to_string();
        assert!(err.contains("fetch.max.wait.ms"), "{err}");
        let (_dir, path) = java_file(
            "c.properties",
            "bootstrap.servers=x:1\ngroup.id=g\nfetch.max.wait.ms=10\noffsets.storage=kafka\n",
        );
        let mut props = ClientProps::load(Role::Consumer, &path).unwrap();
        assert_eq!(props.get("fetch.wait.max.ms"), Some("10"));
        assert_eq!(props.get("offsets.storage"), None);
        props.apply_consumer_rules(true).unwrap();
    }

    #[test]
    fn unknown_librdkafka_keys_are_rejected_with_the_file_name() {
        let mut c = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [
                ("bootstrap.servers", "x:1"),
                ("group.id", "g"),
                ("no.such.key", "1"),
            ],
        );
        let err = c.apply_consumer_rules(true).unwrap_err().to_string();
        assert!(
            err.contains("c.toml") && err.contains("no.such.key"),
            "{err}"
        );
    }

    #[test]
    fn a_java_properties_file_named_otherwise_is_read_by_its_content() {
        for name in ["consumer.config", "consumer.cfg", "consumer"] {
            let (_dir, path) = java_file(name, "bootstrap.servers=host:9092\ngroup.id: g\n");
            let props =
                ClientProps::load(Role::Consumer, &path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(props.get("bootstrap.servers"), Some("host:9092"), "{name}");
            assert_eq!(props.get("group.id"), Some("g"), "{name}");
        }
    }

    #[test]
    fn a_file_neither_toml_nor_plainly_java_properties_names_both_ways_out() {
        // A TOML file with an unclosed string: as Java properties, the quote would become part
        // of the value.
        let (_dir, path) = java_file("consumer.config", "bootstrap.servers = \"host:9092\n");
        let err = ClientProps::load(Role::Consumer, &path)
            .unwrap_err()
            .to_string();
        for needle in ["consumer.config", "line 1", "*.toml", "*.properties"] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn a_misspelt_property_is_matched_to_the_known_one_fewest_edits_away() {
        let known =
            || ["fetch.wait.max.ms", "fetch.max.bytes", "linger.ms", "acks"].map(str::to_owned);
        assert_eq!(edit_distance("fetch.wait.max.msec", "fetch.wait.max.ms"), 2);
        assert_eq!(
            nearest("fetch.wait.max.msec", known()).as_deref(),
            Some("fetch.wait.max.ms")
        );
        assert_eq!(nearest("lingr.ms", known()).as_deref(), Some("linger.ms"));
        assert_eq!(nearest("no.such.key", known()), None, "nothing near");
        assert_eq!(nearest("ack", known()).as_deref(), Some("acks"));
    }
}
