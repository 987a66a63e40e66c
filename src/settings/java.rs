//! Java client settings: what a `.properties` file written for Kafka's Java MirrorMaker (its
//! Java clients, or the pre-0.9 Scala clients its templates still carry) becomes in librdkafka.
//!
//! One table, [`RULES`], says for every Java key that librdkafka does not take as it is what
//! happens to it: renamed, its value translated, read into other settings (`sasl.jaas.config`),
//! refused with what to use instead (a JKS truststore), or ignored with a warning. A key in
//! no rule is passed to librdkafka if librdkafka has it (same name, same meaning), and ignored
//! with a warning if it does not, as the Java clients do with keys they do not use. TOML files
//! are not read through this table: their keys are librdkafka's own names.
//!
//! Nothing here puts the value of a secret (a JAAS config, a password) into a message.

use std::collections::BTreeMap;

use super::jaas;

/// What a Java key becomes.
#[derive(Debug, Clone, Copy)]
pub enum Action {
    /// librdkafka has the same setting under this name.
    Rename(&'static str),
    /// Under this librdkafka name (possibly the same), with these Java values spelled
    /// differently (`(java, librdkafka)`, compared without case); other values are kept.
    Values(&'static str, &'static [(&'static str, &'static str)]),
    /// `partition.assignment.strategy`: Java assignor class names to librdkafka's names.
    Assignors,
    /// `sasl.jaas.config`: the PLAIN and SCRAM login modules' `username` and `password` into
    /// `sasl.username` and `sasl.password`; other login modules are refused.
    Jaas,
    /// `ssl.truststore.location`: a PEM truststore is librdkafka's `ssl.ca.location`; a JKS or
    /// PKCS#12 one is refused.
    Truststore,
    /// `ssl.keystore.location`: PKCS#12 is taken as it is, PEM becomes
    /// `ssl.certificate.location` and `ssl.key.location`, JKS is refused.
    Keystore,
    /// Read by the rule of this other key (a store's type or password).
    ReadWith(&'static str),
    /// librdkafka has no such setting: ignored, with a warning.
    Ignore,
}

/// One entry of [`RULES`].
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub java: &'static str,
    pub action: Action,
    /// Why (for the warning and docs/java-migration.md).
    pub note: &'static str,
}

const fn rule(java: &'static str, action: Action, note: &'static str) -> Rule {
    Rule { java, action, note }
}

use Action::*;

const BYTES_AS_IS: &str = "records are copied as bytes, never deserialized";
const JAVA_CLASS: &str = "a Java class; librdkafka cannot load it";
const JAVA_METRICS: &str = "Java client metrics; `--metrics.addr` serves Prometheus metrics";
const JAVA_TLS: &str = "Java's TLS machinery; librdkafka uses OpenSSL";
const JAVA_LOGIN: &str = "token refresh of Java's login modules";
const ZOOKEEPER: &str =
    "pre-0.9 Scala consumer: the mirror reads from brokers (`bootstrap.servers`), not ZooKeeper";
const SCALA_OFFSETS: &str =
    "pre-0.9 Scala consumer: offsets are committed to Kafka, only what the target acknowledged";
const SCALA_GROUP: &str = "pre-0.9 Scala consumer: the group coordinator runs rebalances";
const PARTITIONER: &str =
    "`--partitioning` decides (`preserve`, or `hash`: Java's murmur2 partitioner)";

/// Every Java key that librdkafka does not take as it is.
pub static RULES: &[Rule] = &[
    // Renamed: the same setting under librdkafka's name.
    rule("fetch.max.wait.ms", Rename("fetch.wait.max.ms"), ""),
    rule("max.request.size", Rename("message.max.bytes"), ""),
    rule(
        "auto.commit.enable",
        Rename("enable.auto.commit"),
        "pre-0.9 Scala consumer; the no-data-loss rule then applies",
    ),
    rule(
        "metadata.broker.list",
        Rename("bootstrap.servers"),
        "pre-0.9 Scala producer",
    ),
    rule(
        "receive.buffer.bytes",
        Values("socket.receive.buffer.bytes", &[("-1", "0")]),
        "Java's -1 (the OS default) is librdkafka's 0",
    ),
    rule(
        "send.buffer.bytes",
        Values("socket.send.buffer.bytes", &[("-1", "0")]),
        "Java's -1 (the OS default) is librdkafka's 0",
    ),
    rule(
        "ssl.truststore.certificates",
        Rename("ssl.ca.pem"),
        "PEM text",
    ),
    rule(
        "ssl.keystore.certificate.chain",
        Rename("ssl.certificate.pem"),
        "PEM text",
    ),
    rule("ssl.keystore.key", Rename("ssl.key.pem"), "PEM text"),
    // Values spelled differently.
    rule(
        "auto.offset.reset",
        Values(
            "auto.offset.reset",
            &[
                ("smallest", "earliest"),
                ("largest", "latest"),
                ("none", "error"),
            ],
        ),
        "`smallest`/`largest`: pre-0.9 Scala consumer",
    ),
    rule(
        "delivery.timeout.ms",
        Values("delivery.timeout.ms", &[("2147483647", "0")]),
        "Java's largest value, which MirrorMaker deployments set to retry for ever, is \
         librdkafka's 0 (no timeout)",
    ),
    rule(
        "ssl.endpoint.identification.algorithm",
        Values("ssl.endpoint.identification.algorithm", &[("", "none")]),
        "Java's empty value turns host name verification off",
    ),
    rule(
        "client.dns.lookup",
        Values("client.dns.lookup", &[("default", "use_all_dns_ips")]),
        "`default`: Java clients before 3.0",
    ),
    rule(
        "partition.assignment.strategy",
        Assignors,
        "`StickyAssignor` becomes `cooperative-sticky` (librdkafka has no eager sticky \
         assignor; stop Java members using it first: the group needs a protocol all members \
         have); a list mixing eager and cooperative assignors keeps `cooperative-sticky`; other \
         classes are refused",
    ),
    // Read into other settings, or refused with what to use instead.
    rule(
        "sasl.jaas.config",
        Jaas,
        "Kerberos (`Krb5LoginModule`: use `sasl.kerberos.*`), OAUTHBEARER (use \
         `sasl.oauthbearer.*`) and other login modules are refused",
    ),
    rule(
        "ssl.truststore.location",
        Truststore,
        "librdkafka reads CA certificates from PEM files only: export a JKS or PKCS#12 \
         truststore with `keytool -exportcert -rfc`",
    ),
    rule(
        "ssl.keystore.location",
        Keystore,
        "JKS (Java's default type): convert it to PKCS#12 or to PEM files \
         (`ssl.certificate.location`, `ssl.key.location`)",
    ),
    rule(
        "ssl.truststore.type",
        ReadWith("ssl.truststore.location"),
        "",
    ),
    rule(
        "ssl.truststore.password",
        ReadWith("ssl.truststore.location"),
        "a PEM truststore needs none",
    ),
    rule("ssl.keystore.type", ReadWith("ssl.keystore.location"), ""),
    // Ignored: librdkafka has no such setting.
    rule("key.serializer", Ignore, BYTES_AS_IS),
    rule("value.serializer", Ignore, BYTES_AS_IS),
    rule("key.deserializer", Ignore, BYTES_AS_IS),
    rule("value.deserializer", Ignore, BYTES_AS_IS),
    rule("serializer.class", Ignore, BYTES_AS_IS),
    rule("key.serializer.class", Ignore, BYTES_AS_IS),
    rule(
        "interceptor.classes",
        Ignore,
        "Java classes; librdkafka cannot load them (a `--message.handler` plugin sees every \
         record)",
    ),
    rule("metric.reporters", Ignore, JAVA_METRICS),
    rule("metrics.num.samples", Ignore, JAVA_METRICS),
    rule("metrics.sample.window.ms", Ignore, JAVA_METRICS),
    rule("metrics.recording.level", Ignore, JAVA_METRICS),
    rule("auto.include.jmx.reporter", Ignore, JAVA_METRICS),
    rule("security.providers", Ignore, JAVA_TLS),
    rule("ssl.provider", Ignore, JAVA_TLS),
    rule("ssl.engine.factory.class", Ignore, JAVA_CLASS),
    rule("ssl.keymanager.algorithm", Ignore, JAVA_TLS),
    rule("ssl.trustmanager.algorithm", Ignore, JAVA_TLS),
    rule("ssl.secure.random.implementation", Ignore, JAVA_TLS),
    rule(
        "ssl.protocol",
        Ignore,
        "OpenSSL negotiates the highest TLS version both sides have",
    ),
    rule(
        "ssl.enabled.protocols",
        Ignore,
        "OpenSSL negotiates the highest TLS version both sides have",
    ),
    rule("sasl.login.class", Ignore, JAVA_CLASS),
    rule("sasl.login.callback.handler.class", Ignore, JAVA_CLASS),
    rule("sasl.client.callback.handler.class", Ignore, JAVA_CLASS),
    rule("sasl.login.refresh.window.factor", Ignore, JAVA_LOGIN),
    rule("sasl.login.refresh.window.jitter", Ignore, JAVA_LOGIN),
    rule("sasl.login.refresh.min.period.seconds", Ignore, JAVA_LOGIN),
    rule("sasl.login.refresh.buffer.seconds", Ignore, JAVA_LOGIN),
    rule("sasl.login.connect.timeout.ms", Ignore, JAVA_LOGIN),
    rule("sasl.login.read.timeout.ms", Ignore, JAVA_LOGIN),
    rule("sasl.login.retry.backoff.ms", Ignore, JAVA_LOGIN),
    rule("sasl.login.retry.backoff.max.ms", Ignore, JAVA_LOGIN),
    rule(
        "sasl.kerberos.ticket.renew.window.factor",
        Ignore,
        "librdkafka runs kinit every `sasl.kerberos.min.time.before.relogin`",
    ),
    rule(
        "sasl.kerberos.ticket.renew.jitter",
        Ignore,
        "librdkafka runs kinit every `sasl.kerberos.min.time.before.relogin`",
    ),
    rule(
        "socket.connection.setup.timeout.max.ms",
        Ignore,
        "librdkafka has `socket.connection.setup.timeout.ms` only",
    ),
    rule(
        "default.api.timeout.ms",
        Ignore,
        "the mirror bounds its own waits (`--startup.timeout.ms`, `--shutdown.timeout.ms`)",
    ),
    rule(
        "buffer.memory",
        Ignore,
        "the producer queue is `queue.buffering.max.kbytes` (65536 here unless set)",
    ),
    rule(
        "max.block.ms",
        Ignore,
        "a send never blocks: the stream waits for acknowledgements when half the queue is in \
         flight",
    ),
    rule(
        "queue.enqueue.timeout.ms",
        Ignore,
        "pre-0.9 Scala producer; as `max.block.ms`",
    ),
    rule("metadata.max.idle.ms", Ignore, "Java producer"),
    rule("partitioner.class", Ignore, PARTITIONER),
    rule("partitioner.ignore.keys", Ignore, PARTITIONER),
    rule(
        "partitioner.adaptive.partitioning.enable",
        Ignore,
        PARTITIONER,
    ),
    rule("partitioner.availability.timeout.ms", Ignore, PARTITIONER),
    rule(
        "compression.gzip.level",
        Ignore,
        "librdkafka has one `compression.level`",
    ),
    rule(
        "compression.lz4.level",
        Ignore,
        "librdkafka has one `compression.level`",
    ),
    rule(
        "compression.zstd.level",
        Ignore,
        "librdkafka has one `compression.level`",
    ),
    rule(
        "producer.type",
        Ignore,
        "pre-0.9 Scala producer: the mirror always sends asynchronously and waits for \
         acknowledgements",
    ),
    rule(
        "compressed.topics",
        Ignore,
        "pre-0.9 Scala producer: compression applies to every topic",
    ),
    rule(
        "max.poll.records",
        Ignore,
        "records are taken one at a time from librdkafka's prefetch queue",
    ),
    rule(
        "exclude.internal.topics",
        Ignore,
        "internal topics (`__*`) are never mirrored",
    ),
    rule("internal.leave.group.on.close", Ignore, "Java internal"),
    rule("zookeeper.connect", Ignore, ZOOKEEPER),
    rule("zookeeper.connection.timeout.ms", Ignore, ZOOKEEPER),
    rule("zookeeper.session.timeout.ms", Ignore, ZOOKEEPER),
    rule("zookeeper.sync.time.ms", Ignore, ZOOKEEPER),
    rule(
        "consumer.timeout.ms",
        Ignore,
        "pre-0.9 Scala consumer: the mirror runs until stopped",
    ),
    rule(
        "queued.max.message.chunks",
        Ignore,
        "pre-0.9 Scala consumer: the prefetch is bounded by `queued.min.messages` and \
         `queued.max.messages.kbytes`",
    ),
    rule(
        "num.consumer.fetchers",
        Ignore,
        "pre-0.9 Scala consumer: librdkafka fetches from every broker at once",
    ),
    rule("rebalance.max.retries", Ignore, SCALA_GROUP),
    rule("rebalance.backoff.ms", Ignore, SCALA_GROUP),
    rule("refresh.leader.backoff.ms", Ignore, SCALA_GROUP),
    rule(
        "consumer.id",
        Ignore,
        "pre-0.9 Scala consumer: the coordinator gives each member its id",
    ),
    rule("offsets.storage", Ignore, SCALA_OFFSETS),
    rule("dual.commit.enabled", Ignore, SCALA_OFFSETS),
    rule("offsets.channel.backoff.ms", Ignore, SCALA_OFFSETS),
    rule("offsets.channel.socket.timeout.ms", Ignore, SCALA_OFFSETS),
    rule("offsets.commit.max.retries", Ignore, SCALA_OFFSETS),
];

/// Whether librdkafka has a property named `key` (whatever it thinks of `value`): librdkafka
/// answers "unknown" only for a name it does not have.
pub fn librdkafka_knows(key: &str, value: &str) -> bool {
    use rdkafka::config::ClientConfig;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaConfRes;
    !matches!(
        ClientConfig::new().set(key, value).create_native_config(),
        Err(KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            ..
        ))
    )
}

/// The rule for a Java key, if any.
pub fn rule_for(key: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.java == key)
}

/// The Java assignor classes and the librdkafka assignor each becomes.
const ASSIGNORS: &[(&str, &str)] = &[
    ("org.apache.kafka.clients.consumer.RangeAssignor", "range"),
    (
        "org.apache.kafka.clients.consumer.RoundRobinAssignor",
        "roundrobin",
    ),
    (
        "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
        "cooperative-sticky",
    ),
    (
        "org.apache.kafka.clients.consumer.StickyAssignor",
        "cooperative-sticky",
    ),
    ("range", "range"),
    ("roundrobin", "roundrobin"),
    ("cooperative-sticky", "cooperative-sticky"),
];

/// A Java `.properties` file's settings as librdkafka properties.
#[derive(Debug, Default)]
pub struct Translated {
    pub props: BTreeMap<String, String>,
    /// Warnings: each key ignored, and translations that change behaviour, one line each
    /// (without the file name, which the caller adds).
    pub warnings: Vec<String>,
    /// Keys read under another librdkafka name or value (for an info line).
    pub translated: Vec<String>,
}

/// Applies [`RULES`] to the settings of a Java `.properties` file. `librdkafka_knows` says
/// whether librdkafka has a property of that name (the fallback for keys in no rule). The
/// error is one line naming the key and what to use instead, never a secret value.
pub fn translate(
    java: &BTreeMap<String, String>,
    librdkafka_knows: impl Fn(&str, &str) -> bool,
) -> Result<Translated, String> {
    let mut out = Translated::default();
    for (key, value) in java {
        let Some(rule) = rule_for(key) else {
            if librdkafka_knows(key, value) {
                out.set(key, key, value.clone())?;
            } else {
                out.warnings.push(format!(
                    "ignoring Java client key `{key}`: librdkafka has no such setting"
                ));
            }
            continue;
        };
        match rule.action {
            Rename(to) => {
                out.set(key, to, value.clone())?;
                out.translated.push(format!("`{key}` as `{to}`"));
            }
            Values(to, values) => {
                let v = value.trim();
                let mapped = values
                    .iter()
                    .find(|(java, _)| java.eq_ignore_ascii_case(v))
                    .map_or(v, |(_, librdkafka)| librdkafka);
                if to != key || mapped != v {
                    out.translated
                        .push(format!("`{key} = {v}` as `{to} = {mapped}`"));
                }
                out.set(key, to, mapped.to_owned())?;
            }
            Assignors => {
                let (names, warning) = assignors(value)?;
                out.warnings.extend(warning);
                if names != value.trim() {
                    out.translated
                        .push(format!("`{key} = {}` as `{names}`", value.trim()));
                }
                out.set(key, key, names)?;
            }
            Jaas => {
                let (username, password) = jaas::credentials(value)?;
                out.set(key, "sasl.username", username)?;
                out.set(key, "sasl.password", password)?;
                out.translated
                    .push(format!("`{key}` as `sasl.username` and `sasl.password`"));
            }
            Truststore => {
                let kind = store_type(java, "ssl.truststore.type");
                if kind != "PEM" {
                    return Err(format!(
                        "`ssl.truststore.location` is a {kind} truststore (`ssl.truststore.type`, \
                         JKS unless set), which librdkafka cannot read: librdkafka takes CA \
                         certificates from PEM files. Export them (keytool -exportcert -rfc \
                         -keystore FILE -alias ALIAS > ca.pem) and set `ssl.ca.location` to the \
                         PEM file (a client certificate: `ssl.certificate.location` and \
                         `ssl.key.location`, PEM too)"
                    ));
                }
                out.set(key, "ssl.ca.location", value.clone())?;
                out.translated
                    .push(format!("`{key}` (PEM) as `ssl.ca.location`"));
            }
            Keystore => match store_type(java, "ssl.keystore.type").as_str() {
                "PKCS12" => out.set(key, key, value.clone())?,
                "PEM" => {
                    // OpenSSL reads the certificate chain and the key from the same PEM file,
                    // each skipping the other's blocks.
                    out.set(key, "ssl.certificate.location", value.clone())?;
                    out.set(key, "ssl.key.location", value.clone())?;
                    out.translated.push(format!(
                        "`{key}` (PEM) as `ssl.certificate.location` and `ssl.key.location`"
                    ));
                }
                kind => {
                    return Err(format!(
                        "`ssl.keystore.location` is a {kind} keystore (`ssl.keystore.type`, JKS \
                         unless set), which librdkafka cannot read: use PEM files \
                         (`ssl.certificate.location` and `ssl.key.location`, the CA in \
                         `ssl.ca.location`), or convert the keystore to PKCS#12 (keytool \
                         -importkeystore -deststoretype PKCS12) and set `ssl.keystore.type=PKCS12`"
                    ))
                }
            },
            ReadWith(_) => {}
            Ignore => out.warnings.push(format!(
                "ignoring Java client key `{key}`: librdkafka has no such setting ({})",
                rule.note
            )),
        }
    }
    Ok(out)
}

impl Translated {
    /// Sets `to` (from Java key `from`); two Java keys that land on the same librdkafka
    /// property with different values are refused.
    fn set(&mut self, from: &str, to: &str, value: String) -> Result<(), String> {
        match self.props.get(to) {
            Some(existing) if *existing != value => Err(format!(
                "`{from}` sets `{to}`, which another key of the file sets to another value; \
                 keep one of them"
            )),
            _ => {
                self.props.insert(to.to_owned(), value);
                Ok(())
            }
        }
    }
}

/// A store's type in upper case, JKS (Java's default) when not set.
fn store_type(java: &BTreeMap<String, String>, key: &str) -> String {
    java.get(key)
        .map(|t| t.trim().to_ascii_uppercase())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "JKS".to_owned())
}

/// `partition.assignment.strategy`: a comma-separated list of Java classes (or librdkafka
/// names) as librdkafka's names, with a warning when the meaning changes.
fn assignors(value: &str) -> Result<(String, Option<String>), String> {
    let mut names: Vec<&str> = Vec::new();
    let mut warning = None;
    for class in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let Some((_, name)) = ASSIGNORS.iter().find(|(java, _)| *java == class) else {
            return Err(format!(
                "`partition.assignment.strategy`: `{class}` is not an assignor librdkafka has \
                 (a Java class cannot be loaded); use range, roundrobin or cooperative-sticky \
                 (Java's RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor)"
            ));
        };
        if class.ends_with(".StickyAssignor") {
            warning = Some(
                "reading Java's StickyAssignor as `cooperative-sticky`: librdkafka has no eager \
                 sticky assignor; a group needs an assignor all its members have, so stop Java \
                 members that use StickyAssignor before this mirror joins"
                    .to_owned(),
            );
        }
        if !names.contains(name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err("`partition.assignment.strategy` is empty".to_owned());
    }
    if names.contains(&"cooperative-sticky") && names.len() > 1 {
        warning = Some(format!(
            "`partition.assignment.strategy` lists eager and cooperative assignors ({}), which \
             librdkafka cannot mix: using cooperative-sticky",
            names.join(",")
        ));
        names = vec!["cooperative-sticky"];
    }
    Ok((names.join(","), warning))
}

/// [`RULES`] as the table of docs/java-migration.md ("Coming from Java MirrorMaker").
pub fn markdown_table() -> String {
    let mut out = String::from("| Java key | in librdkafka | note |\n|---|---|---|\n");
    for r in RULES {
        let becomes = match r.action {
            Rename(to) => format!("`{to}`"),
            Values(to, values) => {
                let pairs: Vec<String> = values
                    .iter()
                    .map(|(java, librdkafka)| match *java {
                        "" => format!("empty → `{librdkafka}`"),
                        java => format!("`{java}` → `{librdkafka}`"),
                    })
                    .collect();
                let name = if to == r.java {
                    "same key".to_owned()
                } else {
                    format!("`{to}`")
                };
                format!("{name}; {}", pairs.join(", "))
            }
            Assignors => ASSIGNORS
                .iter()
                .filter(|(java, _)| java.contains('.'))
                .map(|(java, name)| {
                    format!("`{}` → `{name}`", java.rsplit('.').next().unwrap_or(java))
                })
                .collect::<Vec<_>>()
                .join(", "),
            Jaas => "PLAIN and SCRAM login modules: `username` → `sasl.username`, `password` → \
                     `sasl.password` (redacted)"
                .to_owned(),
            Truststore => {
                "`ssl.ca.location` if `ssl.truststore.type=PEM`; JKS, PKCS12: refused".to_owned()
            }
            Keystore => "as is if `ssl.keystore.type=PKCS12`; `ssl.certificate.location` and \
                         `ssl.key.location` if `PEM`; JKS: refused"
                .to_owned(),
            ReadWith(other) => format!("read with `{other}`"),
            Ignore => "ignored (a warning)".to_owned(),
        };
        out.push_str(&format!("| `{}` | {becomes} | {} |\n", r.java, r.note));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one example of Java settings must become.
    enum Expect {
        /// Exactly these librdkafka properties, and no warning.
        Props(&'static [(&'static str, &'static str)]),
        /// These properties, and a warning containing the text.
        Warned(&'static [(&'static str, &'static str)], &'static str),
        /// Refused with a message containing each text.
        Refused(&'static [&'static str]),
    }
    use Expect::*;

    const PLAIN: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
    const RANGE: &str = "org.apache.kafka.clients.consumer.RangeAssignor";
    const ROUND_ROBIN: &str = "org.apache.kafka.clients.consumer.RoundRobinAssignor";
    const COOPERATIVE: &str = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor";
    const STICKY: &str = "org.apache.kafka.clients.consumer.StickyAssignor";
    const IGNORED: &str = "librdkafka has no such setting";

    /// Every rule of the table, with the Java settings that exercise it.
    fn examples() -> Vec<(Vec<(&'static str, String)>, Expect)> {
        let one = |k: &'static str, v: &str| vec![(k, v.to_owned())];
        let mut out = vec![
            (one("fetch.max.wait.ms", "10"), Props(&[("fetch.wait.max.ms", "10")])),
            (one("max.request.size", "2097152"), Props(&[("message.max.bytes", "2097152")])),
            (one("auto.commit.enable", "false"), Props(&[("enable.auto.commit", "false")])),
            (one("metadata.broker.list", "a:9092"), Props(&[("bootstrap.servers", "a:9092")])),
            (one("receive.buffer.bytes", "-1"), Props(&[("socket.receive.buffer.bytes", "0")])),
            (one("receive.buffer.bytes", "65536"), Props(&[("socket.receive.buffer.bytes", "65536")])),
            (one("send.buffer.bytes", "-1"), Props(&[("socket.send.buffer.bytes", "0")])),
            (one("ssl.truststore.certificates", "-----BEGIN"), Props(&[("ssl.ca.pem", "-----BEGIN")])),
            (one("ssl.keystore.certificate.chain", "-----BEGIN"), Props(&[("ssl.certificate.pem", "-----BEGIN")])),
            (one("ssl.keystore.key", "-----BEGIN"), Props(&[("ssl.key.pem", "-----BEGIN")])),
            (one("auto.offset.reset", "smallest"), Props(&[("auto.offset.reset", "earliest")])),
            (one("auto.offset.reset", "LARGEST"), Props(&[("auto.offset.reset", "latest")])),
            (one("auto.offset.reset", "none"), Props(&[("auto.offset.reset", "error")])),
            (one("auto.offset.reset", "earliest"), Props(&[("auto.offset.reset", "earliest")])),
            (one("delivery.timeout.ms", "2147483647"), Props(&[("delivery.timeout.ms", "0")])),
            (one("delivery.timeout.ms", "120000"), Props(&[("delivery.timeout.ms", "120000")])),
            (one("ssl.endpoint.identification.algorithm", ""), Props(&[("ssl.endpoint.identification.algorithm", "none")])),
            (one("ssl.endpoint.identification.algorithm", "https"), Props(&[("ssl.endpoint.identification.algorithm", "https")])),
            (one("client.dns.lookup", "default"), Props(&[("client.dns.lookup", "use_all_dns_ips")])),
            (one("partition.assignment.strategy", RANGE), Props(&[("partition.assignment.strategy", "range")])),
            (
                one("partition.assignment.strategy", &format!("{ROUND_ROBIN}, {RANGE}")),
                Props(&[("partition.assignment.strategy", "roundrobin,range")]),
            ),
            (one("partition.assignment.strategy", COOPERATIVE), Props(&[("partition.assignment.strategy", "cooperative-sticky")])),
            (one("partition.assignment.strategy", "range,roundrobin"), Props(&[("partition.assignment.strategy", "range,roundrobin")])),
            (
                one("partition.assignment.strategy", STICKY),
                Warned(&[("partition.assignment.strategy", "cooperative-sticky")], "StickyAssignor"),
            ),
            (
                one("partition.assignment.strategy", &format!("{RANGE},{COOPERATIVE}")),
                Warned(&[("partition.assignment.strategy", "cooperative-sticky")], "cannot mix"),
            ),
            (
                one("partition.assignment.strategy", "com.example.MyAssignor"),
                Refused(&["com.example.MyAssignor", "range, roundrobin or cooperative-sticky"]),
            ),
            (
                one("sasl.jaas.config", &format!("{PLAIN} required username=\"u\" password=\"p w\";")),
                Props(&[("sasl.password", "p w"), ("sasl.username", "u")]),
            ),
            (
                one("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=u password=p"),
                Props(&[("sasl.password", "p"), ("sasl.username", "u")]),
            ),
            (
                one("sasl.jaas.config", "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;"),
                Refused(&["Kerberos", "sasl.kerberos.keytab", "sasl.kerberos.principal"]),
            ),
            (
                one("sasl.jaas.config", "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"),
                Refused(&["OAUTHBEARER", "sasl.oauthbearer.method=oidc"]),
            ),
            (
                one("sasl.jaas.config", &format!("{PLAIN} required username=u password=p; {PLAIN} required username=v password=q;")),
                Refused(&["more than one login module"]),
            ),
            (
                one("sasl.jaas.config", &format!("{PLAIN} username=u password=p;")),
                Refused(&["required"]),
            ),
            (
                one("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=u password=p tokenauth=true;"),
                Refused(&["delegation token"]),
            ),
            (
                vec![("ssl.truststore.location", "/ca.pem".into()), ("ssl.truststore.type", "PEM".into()), ("ssl.truststore.password", "x".into())],
                Props(&[("ssl.ca.location", "/ca.pem")]),
            ),
            (
                vec![("ssl.truststore.location", "/t.jks".into()), ("ssl.truststore.password", "x".into())],
                Refused(&["JKS truststore", "ssl.ca.location", "PEM"]),
            ),
            (
                vec![("ssl.truststore.location", "/t.p12".into()), ("ssl.truststore.type", "pkcs12".into())],
                Refused(&["PKCS12 truststore", "ssl.ca.location"]),
            ),
            (
                vec![("ssl.keystore.location", "/k.p12".into()), ("ssl.keystore.type", "PKCS12".into())],
                Props(&[("ssl.keystore.location", "/k.p12")]),
            ),
            (
                vec![("ssl.keystore.location", "/k.pem".into()), ("ssl.keystore.type", "PEM".into())],
                Props(&[("ssl.certificate.location", "/k.pem"), ("ssl.key.location", "/k.pem")]),
            ),
            (
                one("ssl.keystore.location", "/k.jks"),
                Refused(&["JKS keystore", "ssl.certificate.location", "ssl.key.location"]),
            ),
            // Keys in no rule: librdkafka's own pass, others are ignored.
            (one("linger.ms", "5"), Props(&[("linger.ms", "5")])),
            (one("schema.registry.url", "http://r"), Warned(&[], IGNORED)),
            // Two keys for one librdkafka property must agree.
            (
                vec![("fetch.max.wait.ms", "10".into()), ("fetch.wait.max.ms", "20".into())],
                Refused(&["fetch.wait.max.ms", "keep one"]),
            ),
            (
                vec![("fetch.max.wait.ms", "10".into()), ("fetch.wait.max.ms", "10".into())],
                Props(&[("fetch.wait.max.ms", "10")]),
            ),
        ];
        for r in RULES.iter().filter(|r| matches!(r.action, Ignore)) {
            out.push((one(r.java, "1"), Warned(&[], r.java)));
        }
        out
    }

    #[test]
    fn every_rule_does_what_the_table_says() {
        let examples = examples();
        for r in RULES {
            assert!(
                examples
                    .iter()
                    .any(|(input, _)| input.iter().any(|(k, _)| *k == r.java)),
                "no example exercises the rule for {}",
                r.java
            );
        }
        for (input, expect) in examples {
            let java: BTreeMap<String, String> = input
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            let result = translate(&java, librdkafka_knows);
            let props = |t: &Translated| -> Vec<(String, String)> {
                t.props
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            let owned = |p: &[(&str, &str)]| -> Vec<(String, String)> {
                p.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            };
            match (expect, result) {
                (Props(want), Ok(t)) => {
                    assert_eq!(props(&t), owned(want), "{input:?}");
                    assert!(t.warnings.is_empty(), "{input:?}: {:?}", t.warnings);
                }
                (Warned(want, text), Ok(t)) => {
                    assert_eq!(props(&t), owned(want), "{input:?}");
                    assert_eq!(t.warnings.len(), 1, "{input:?}: {:?}", t.warnings);
                    assert!(t.warnings[0].contains(text), "{input:?}: {:?}", t.warnings);
                }
                (Refused(texts), Err(message)) => {
                    for text in texts {
                        assert!(message.contains(text), "{input:?}: {message}");
                    }
                }
                (_, result) => panic!("{input:?}: unexpected {result:?}"),
            }
        }
    }

    #[test]
    fn the_table_matches_what_librdkafka_has() {
        for r in RULES {
            match r.action {
                // An ignored key must not hide a setting librdkafka has.
                Ignore => assert!(!librdkafka_knows(r.java, "1"), "librdkafka has {}", r.java),
                Rename(to) | Values(to, _) => {
                    assert!(librdkafka_knows(to, "1"), "librdkafka lacks {to}")
                }
                _ => {}
            }
        }
        // Every value a rule writes is one librdkafka takes.
        let takes = |key: &str, value: &str| {
            rdkafka::config::ClientConfig::new()
                .set(key, value)
                .create_native_config()
                .is_ok()
        };
        for r in RULES {
            if let Values(to, values) = r.action {
                for (_, value) in values {
                    assert!(takes(to, value), "{to} = {value}");
                }
            }
        }
        for (_, name) in ASSIGNORS {
            assert!(takes("partition.assignment.strategy", name), "{name}");
        }
        for to in [
            "ssl.ca.location",
            "ssl.certificate.location",
            "ssl.key.location",
            "sasl.username",
        ] {
            assert!(librdkafka_knows(to, "x"), "{to}");
        }
    }

    #[test]
    fn the_java_migration_page_documents_the_table() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/java-migration.md"
        ))
        .unwrap();
        let table = markdown_table();
        assert!(
            page.contains(&table),
            "docs/java-migration.md's table differs from \
             settings::java::RULES; replace it with:\n{table}"
        );
    }
}
