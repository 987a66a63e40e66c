//! Topic ACLs kept in step (`--sync.topic.acls true`), as MirrorMaker 2 does: after a failover
//! the consumers' principals find their READ on the target topics.
//!
//! Every interval (`--sync.topic.configs.interval.ms`), the source's ACLs on TOPIC resources
//! (DescribeAcls) that name mirrored topics are copied onto the target (CreateAcls) where
//! missing, so that access to the copies is never wider than to the source topics:
//!
//! - a LITERAL ACL whose topic the whitelist matches: its name through `--target.topic`;
//! - a PREFIXED ACL with a prefix some whitelisted source topic starts with: the template's
//!   prefix before it (`pay` becomes `primary.pay` under `primary.{topic}`), when the template
//!   adds nothing after `{topic}`; otherwise no one prefix names the target topics, and the
//!   ACL is warned about once and skipped;
//! - principals and hosts as they are; READ, DESCRIBE and DESCRIBE_CONFIGS as they are, ALL as
//!   READ; WRITE is dropped (only the mirror writes a mirrored topic), and CREATE, DELETE,
//!   ALTER and ALTER_CONFIGS are not copied, said once ([`granted`]); the LITERAL wildcard
//!   `*` is not copied as an ALLOW (it would grant on every target topic, mirrored or not),
//!   nor a binding that would cover the mirror's own topics on the target ([`covered_own`]);
//! - DENY entries with every operation ([`refused`]), as their pattern or, where it cannot
//!   travel, one LITERAL DENY per mirrored topic they cover ([`translate_deny`]); not a
//!   refusal to `User:*` or the mirror's own principal of what the mirror does on its
//!   copies, and then not the ALLOWs it overrides either ([`shadows`]). DENYs are made before
//!   the ALLOWs of a round, and a DENY the sync made is removed only once the source DENY it
//!   copied is gone.
//!
//! What the sync made is recorded in a compacted topic of its own on the target
//! (`mirror-maker.acls.SOURCE NAME`), keyed by the binding, its value the source binding it
//! copies, a tombstone when removed; it is
//! read at start. An ACL the sync made that the source no longer has is removed (DeleteAcls
//! with an exact filter); an ACL it did not make is never touched, even where it is the same
//! binding the source has (the sync then leaves it unrecorded). An ACL made just before a
//! crash, before its record is acknowledged, stays unrecorded too: never removed by the sync.
//!
//! A principal without DESCRIBE on the source cluster or without DESCRIBE/ALTER on the target
//! cluster: one line naming the operation, the cluster and the config file whose credentials
//! are used, and the sync stops until restart (mirroring goes on). A cluster that does not
//! answer is tried again next round. `check` shows what a round would create or remove.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::clients::{Cluster, ReaderContext};
use super::state::Control;
use crate::native::admin::{
    create_topic_acls, delete_topic_acls, describe_topic_acls, AclAnswer, AclOperation, AclPattern,
    AclPermission, AdminFailure, TopicAcl,
};
use crate::settings::client::ClientProps;
use crate::settings::routing::{TopicFilter, TopicTemplate};
use crate::settings::{counted, Settings};

#[derive(Debug, thiserror::Error)]
pub(crate) enum AclSyncError {
    /// The principal may not do what the sync needs: the sync stops until restart.
    #[error(
        "ACL sync: the {cluster} cluster does not allow the mirror's principal (the \
         credentials of {config}) to {operation} ({request}: {reason}): grant it (kafka-acls \
         --add --allow-principal User:NAME --operation {grant} --cluster), or run with \
         --sync.topic.acls false; the ACL sync stops until restart, mirroring goes on"
    )]
    Denied {
        cluster: &'static str,
        config: String,
        operation: &'static str,
        grant: &'static str,
        request: &'static str,
        reason: String,
    },
    /// The cluster has no authorizer: nothing to read or make; the sync stops.
    #[error(
        "ACL sync: the {cluster} cluster has no authorizer ({reason}): it holds no ACLs to \
         {what}; the ACL sync stops until restart (run with --sync.topic.acls false), \
         mirroring goes on"
    )]
    NoAuthorizer {
        cluster: &'static str,
        what: &'static str,
        reason: String,
    },
    /// The record of what the sync made cannot be made, read or written: the sync stops
    /// (without it, it could remove an ACL it did not make).
    #[error(
        "ACL sync: the record topic {topic} on the target cluster: {reason}. Grant the \
         mirror's principal (the credentials of {config}) CREATE, READ, WRITE and DESCRIBE on \
         it, or run with --sync.topic.acls false; the ACL sync stops until restart, mirroring \
         goes on"
    )]
    Record {
        topic: String,
        config: String,
        reason: String,
    },
    /// Tried again next round.
    #[error("ACL sync: {request} on the {cluster} cluster failed: {reason}")]
    Transient {
        cluster: &'static str,
        request: &'static str,
        reason: String,
    },
}

impl AclSyncError {
    /// Whether the sync stops trying until restart.
    pub(crate) fn stops(&self) -> bool {
        !matches!(self, AclSyncError::Transient { .. })
    }
}

fn is_denied(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
        )
    )
}

/// A source ACL as the target gets it, or why it is not copied (`Ignored`: not a mirrored
/// topic's, or an ALLOW WRITE, which is dropped without a word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Copied {
    /// The target bindings that copy it: one, or for a DENY whose pattern cannot travel as
    /// it is, one LITERAL binding per mirrored topic it covers.
    As(Vec<TopicAcl>),
    Skipped(String),
    Ignored,
}

/// What a source ACL is weighed against: the mirror's topics on both sides and its own
/// principal on the target.
#[derive(Debug)]
pub(crate) struct Scope<'a> {
    pub(crate) filter: &'a TopicFilter,
    pub(crate) template: &'a TopicTemplate,
    /// The source topics the whitelist matches now.
    pub(crate) sources: &'a [String],
    /// The mirror's own topics on the target, which no copied binding may cover.
    pub(crate) own: &'a [&'a str],
    /// The principal the mirror writes the target as, where its config says it
    /// (`User:NAME` for SASL PLAIN and SCRAM); `User:*` covers it whatever it is.
    pub(crate) mirror: Option<&'a str>,
}

/// The operations a mirror grants on the target: what reading the copy needs. The target
/// topics are the mirror's (it alone writes them, and `--sync.topic.configs` sets their
/// configs), so a source grant to change or delete a topic (CREATE, DELETE, ALTER,
/// ALTER_CONFIGS) is not copied: on the target it would let that principal delete the copy
/// or set `retention.ms=1` on it. ALL becomes READ; WRITE is dropped without a word.
fn granted(operation: AclOperation) -> Option<AclOperation> {
    match operation {
        AclOperation::All => Some(AclOperation::Read),
        op @ (AclOperation::Read | AclOperation::Describe | AclOperation::DescribeConfigs) => {
            Some(op)
        }
        _ => None,
    }
}

/// The operations the mirror itself does on its copies on the target (write them, read
/// their metadata, create them, grow them, read and set their configs): a DENY of one of
/// them that may apply to the mirror's principal would stop the copy.
fn used_by_the_mirror(operation: AclOperation) -> bool {
    matches!(
        operation,
        AclOperation::All
            | AclOperation::Write
            | AclOperation::Describe
            | AclOperation::Create
            | AclOperation::Alter
            | AclOperation::AlterConfigs
            | AclOperation::DescribeConfigs
    )
}

/// What a DENY refuses on the target: a refusal narrows access, so every operation travels
/// as it is, except one the mirror needs on its copies where the DENY may name the mirror
/// itself (`User:*`, or its own principal): ALL becomes READ (nobody reads the copy), the
/// others are not copied.
fn refused(deny: &TopicAcl, mirror: Option<&str>) -> Option<AclOperation> {
    let names_the_mirror = deny.principal == "User:*" || mirror == Some(deny.principal.as_str());
    match deny.operation {
        AclOperation::Other => None,
        AclOperation::All if names_the_mirror => Some(AclOperation::Read),
        op if names_the_mirror && used_by_the_mirror(op) => None,
        op => Some(op),
    }
}

/// Whether a target binding of `pattern` and `name` covers `topic`.
fn covers(pattern: AclPattern, name: &str, topic: &str) -> bool {
    match pattern {
        AclPattern::Literal => name == topic || name == "*",
        AclPattern::Prefixed => topic.starts_with(name),
    }
}

/// Whether `deny` refuses some of what `allow` grants: its resource covers the allow's, its
/// principal and host are the allow's or every one, its operation the allow's or ALL.
fn shadows(deny: &TopicAcl, allow: &TopicAcl) -> bool {
    let resource = match (deny.pattern, allow.pattern) {
        (AclPattern::Literal, AclPattern::Prefixed) => deny.name == "*",
        (pattern, _) => covers(pattern, &deny.name, &allow.name),
    };
    resource
        && (deny.principal == "User:*" || deny.principal == allow.principal)
        && (deny.host == "*" || deny.host == allow.host)
        && (deny.operation == AclOperation::All || deny.operation == allow.operation)
}

/// The mirror's own topic, or the mirror-maker bookkeeping topics, that a target binding of
/// `pattern` and `name` would cover, if any.
fn covered_own(pattern: AclPattern, name: &str, own: &[&str]) -> Option<String> {
    use crate::settings::routing::{ACL_RECORD_TOPIC_PREFIX, STORE_TOPIC_PREFIX};
    if let Some(topic) = own.iter().find(|t| covers(pattern, name, t)) {
        return Some((*topic).to_owned());
    }
    [STORE_TOPIC_PREFIX, ACL_RECORD_TOPIC_PREFIX]
        .iter()
        .find(|b| {
            (pattern == AclPattern::Literal && name == "*")
                || name.starts_with(*b)
                || (pattern == AclPattern::Prefixed && b.starts_with(name))
        })
        .map(|b| format!("{b}* (mirror-maker's bookkeeping)"))
}

/// `LITERAL topic orders`, `topics with PREFIX pay`, `every topic (LITERAL *)`.
fn resource(pattern: AclPattern, name: &str) -> String {
    match pattern {
        AclPattern::Literal if name == "*" => "every topic (LITERAL *)".to_owned(),
        AclPattern::Literal => format!("LITERAL topic {name}"),
        AclPattern::Prefixed => format!("topics with PREFIX {name}"),
    }
}

/// What a source ACL becomes on the target.
pub(crate) fn translate(acl: &TopicAcl, scope: &Scope<'_>) -> Copied {
    match acl.permission {
        AclPermission::Allow => translate_allow(acl, scope),
        AclPermission::Deny => translate_deny(acl, scope),
    }
}

/// An ALLOW: only what reading the copy needs, on a binding that covers mirrored topics and
/// none of the mirror's own.
fn translate_allow(acl: &TopicAcl, scope: &Scope<'_>) -> Copied {
    if matches!(acl.operation, AclOperation::Write | AclOperation::Other) {
        return Copied::Ignored;
    }
    let name = match acl.pattern {
        AclPattern::Literal if acl.name == "*" => {
            return Copied::Skipped(format!(
                "ACL sync: the source's {} for {} on every topic (LITERAL *) is not copied: it \
                 would grant it on every target topic, mirrored or not; add it on the target by \
                 hand if wanted",
                acl.operation.name(),
                acl.principal
            ))
        }
        AclPattern::Literal => {
            if !scope.filter.matches(&acl.name) || scope.own.contains(&acl.name.as_str()) {
                return Copied::Ignored;
            }
            scope.template.render(&acl.name)
        }
        AclPattern::Prefixed => {
            if !scope.sources.iter().any(|t| t.starts_with(&acl.name)) {
                return Copied::Ignored;
            }
            match scope.template.render_prefix(&acl.name) {
                Some(name) => name,
                None => {
                    return Copied::Skipped(format!(
                        "ACL sync: the source's PREFIXED {} for {} on topics starting with {} \
                         is not copied: --target.topic adds text after {{topic}}, so no one \
                         prefix names their target topics; add LITERAL ACLs on the target by \
                         hand",
                        acl.operation.name(),
                        acl.principal,
                        acl.name
                    ))
                }
            }
        }
    };
    if let Some(topic) = covered_own(acl.pattern, &name, scope.own) {
        return Copied::Skipped(format!(
            "ACL sync: the source's {} for {} on {} is not copied: on the target, {} would \
             cover {topic}, the mirror's own; add a narrower one on the target by hand if \
             wanted",
            acl.operation.name(),
            acl.principal,
            resource(acl.pattern, &acl.name),
            resource(acl.pattern, &name),
        ));
    }
    let Some(operation) = granted(acl.operation) else {
        return Copied::Skipped(format!(
            "ACL sync: the source's {} for {} on {} is not copied: a mirror grants on the \
             target only what reading the copy needs (READ, DESCRIBE, DESCRIBE_CONFIGS; ALL as \
             READ), and {} would let that principal change or delete the copy; add it on the \
             target by hand if wanted",
            acl.operation.name(),
            acl.principal,
            resource(acl.pattern, &acl.name),
            acl.operation.name(),
        ));
    };
    Copied::As(vec![TopicAcl {
        pattern: acl.pattern,
        name,
        principal: acl.principal.clone(),
        host: acl.host.clone(),
        operation,
        permission: AclPermission::Allow,
    }])
}

/// A DENY: on every mirrored topic it covers, as its pattern where that names the same
/// target topics and none of the mirror's own, else one LITERAL binding per mirrored topic
/// (new ones get theirs in the round that first sees them).
fn translate_deny(acl: &TopicAcl, scope: &Scope<'_>) -> Copied {
    let covered: Vec<&String> = match acl.pattern {
        AclPattern::Literal if acl.name != "*" => {
            if !scope.filter.matches(&acl.name) || scope.own.contains(&acl.name.as_str()) {
                return Copied::Ignored;
            }
            Vec::new()
        }
        _ => {
            let covered: Vec<&String> = scope
                .sources
                .iter()
                .filter(|t| covers(acl.pattern, &acl.name, t))
                .collect();
            if covered.is_empty() {
                return Copied::Ignored;
            }
            covered
        }
    };
    let Some(operation) = refused(acl, scope.mirror) else {
        if acl.operation == AclOperation::Other {
            return Copied::Ignored;
        }
        return Copied::Skipped(format!(
            "ACL sync: the source's DENY {} for {} on {} is not copied: on the target it \
             would refuse the mirror itself {} on its copies and stop the copy; the ALLOWs it \
             overrides are not copied either; add a DENY for the other principals on the \
             target by hand if wanted",
            acl.operation.name(),
            acl.principal,
            resource(acl.pattern, &acl.name),
            acl.operation.name(),
        ));
    };
    let binding = |pattern, name| TopicAcl {
        pattern,
        name,
        principal: acl.principal.clone(),
        host: acl.host.clone(),
        operation,
        permission: AclPermission::Deny,
    };
    let as_is = match acl.pattern {
        AclPattern::Literal if acl.name != "*" => Some(scope.template.render(&acl.name)),
        AclPattern::Literal => None,
        AclPattern::Prefixed => scope.template.render_prefix(&acl.name),
    };
    if let Some(name) = as_is.filter(|n| covered_own(acl.pattern, n, scope.own).is_none()) {
        return Copied::As(vec![binding(acl.pattern, name)]);
    }
    Copied::As(
        covered
            .into_iter()
            .map(|t| scope.template.render(t))
            .filter(|t| covered_own(AclPattern::Literal, t, scope.own).is_none())
            .map(|t| binding(AclPattern::Literal, t))
            .collect(),
    )
}

/// What a round would do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AclPlan {
    /// Target ACLs to create, each with the source ACL it copies.
    pub(crate) create: Vec<(TopicAcl, TopicAcl)>,
    /// ACLs the sync made that the source no longer has: removed from the target.
    pub(crate) remove: Vec<TopicAcl>,
    /// ACLs the sync made that neither the source nor the target has any more: the record
    /// forgets them.
    pub(crate) forget: Vec<TopicAcl>,
    /// Source ACLs not copied, and why.
    pub(crate) skipped: Vec<String>,
}

/// What the sync recorded making: each target binding with the source binding it copied
/// (`None` in a record that does not say).
pub(crate) type Recorded = BTreeMap<TopicAcl, Option<TopicAcl>>;

/// The plan of a round from what the source wants (target ACL -> source ACL), the source's
/// ACLs, what the target has and what the sync recorded making. A DENY the sync made is
/// removed only once the source DENY it copied is gone: not when its topic leaves the
/// source or the whitelist (the copy stays on the target, and so does what refuses it).
pub(crate) fn plan(
    wanted: &BTreeMap<TopicAcl, TopicAcl>,
    source: &BTreeSet<TopicAcl>,
    existing: &BTreeSet<TopicAcl>,
    recorded: &Recorded,
) -> AclPlan {
    let mut plan = AclPlan::default();
    for (target, from) in wanted {
        if !existing.contains(target) {
            plan.create.push((target.clone(), from.clone()));
        }
    }
    for (acl, from) in recorded {
        if wanted.contains_key(acl) {
            continue;
        }
        let refusal_still_held = acl.permission == AclPermission::Deny
            && from.as_ref().is_none_or(|from| source.contains(from));
        if refusal_still_held {
            continue;
        }
        if existing.contains(acl) {
            plan.remove.push(acl.clone());
        } else {
            plan.forget.push(acl.clone());
        }
    }
    plan
}

/// A binding as the record topic's key: a JSON array, one string per field (the permission
/// last, for a DENY only: the keys of ALLOWs recorded before DENYs were copied stay valid).
pub(crate) fn record_key(acl: &TopicAcl) -> Vec<u8> {
    let pattern = match acl.pattern {
        AclPattern::Literal => "LITERAL",
        AclPattern::Prefixed => "PREFIXED",
    };
    let mut fields = vec![
        pattern,
        acl.name.as_str(),
        acl.principal.as_str(),
        acl.host.as_str(),
        acl.operation.name(),
    ];
    if acl.permission == AclPermission::Deny {
        fields.push(acl.permission.name());
    }
    serde_json::to_vec(&fields).expect("an array of strings is JSON")
}

/// The binding of a record key; `None` for a key this version does not read.
pub(crate) fn parse_record_key(key: &[u8]) -> Option<TopicAcl> {
    let mut fields: Vec<String> = serde_json::from_slice(key).ok()?;
    let permission = match fields.len() {
        5 => AclPermission::Allow,
        6 => match fields.pop()?.as_str() {
            "ALLOW" => AclPermission::Allow,
            "DENY" => AclPermission::Deny,
            _ => return None,
        },
        _ => return None,
    };
    let [pattern, name, principal, host, operation] = <[String; 5]>::try_from(fields).ok()?;
    Some(TopicAcl {
        pattern: match pattern.as_str() {
            "LITERAL" => AclPattern::Literal,
            "PREFIXED" => AclPattern::Prefixed,
            _ => return None,
        },
        name,
        principal,
        host,
        operation: AclOperation::parse(&operation)?,
        permission,
    })
}

/// `READ for User:alice (host *) on LITERAL topic primary.orders`, `DENY READ for ...`.
pub(crate) fn shown(acl: &TopicAcl) -> String {
    let deny = match acl.permission {
        AclPermission::Allow => "",
        AclPermission::Deny => "DENY ",
    };
    format!(
        "{deny}{} for {} (host {}) on {}",
        acl.operation.name(),
        acl.principal,
        acl.host,
        resource(acl.pattern, &acl.name)
    )
}

/// The principal Kafka's default principal builder gives the client of `props`, where the
/// config says it: `User:NAME` for SASL PLAIN and SCRAM. `None` for mutual TLS (mapping
/// rules), GSSAPI and OAUTHBEARER, whose principal the broker decides.
fn sasl_principal(props: &ClientProps) -> Option<String> {
    let protocol = props.get("security.protocol")?.to_ascii_uppercase();
    let mechanism = props
        .get("sasl.mechanism")
        .or_else(|| props.get("sasl.mechanisms"))
        .unwrap_or("GSSAPI")
        .to_ascii_uppercase();
    (protocol.starts_with("SASL_") && (mechanism == "PLAIN" || mechanism.starts_with("SCRAM-")))
        .then(|| props.get("sasl.username").map(|u| format!("User:{u}")))
        .flatten()
}

/// The sync's clients and what it knows.
pub(crate) struct AclSync {
    source: AdminClient<DefaultClientContext>,
    target: AdminClient<DefaultClientContext>,
    producer_props: ClientProps,
    consumer_path: PathBuf,
    filter: TopicFilter,
    template: TopicTemplate,
    /// Topics of the mirror's own on the target: never a mirrored topic's.
    own: Vec<String>,
    /// The principal the mirror writes the target as, where its config says it.
    mirror: Option<String>,
    record_topic: String,
    timeout: Duration,
    recorded: Recorded,
    writer: Option<ThreadedProducer<DefaultProducerContext>>,
    warned: HashSet<String>,
}

impl std::fmt::Debug for AclSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclSync")
            .field("record_topic", &self.record_topic)
            .finish_non_exhaustive()
    }
}

impl AclSync {
    fn new(
        settings: &Settings,
        record_topic: String,
        timeout: Duration,
    ) -> Result<AclSync, AclSyncError> {
        let admin = |props: &ClientProps, cluster: Cluster| {
            props
                .connection_config()
                .set("allow.auto.create.topics", "false")
                .create::<AdminClient<DefaultClientContext>>()
                .map_err(|e| AclSyncError::Transient {
                    cluster: cluster.name(),
                    request: "making an admin client",
                    reason: format!("{}: {e}", props.path.display()),
                })
        };
        let mut own = vec![record_topic.clone()];
        own.extend(settings.offset_mapping.clone());
        Ok(AclSync {
            source: admin(&settings.consumer, Cluster::Source)?,
            target: admin(&settings.producer, Cluster::Target)?,
            producer_props: settings.producer.clone(),
            consumer_path: settings.consumer.path.clone(),
            filter: settings.topics.clone(),
            template: settings.target_topic.clone(),
            own,
            mirror: sasl_principal(&settings.producer),
            record_topic,
            timeout,
            recorded: Recorded::new(),
            writer: None,
            warned: HashSet::new(),
        })
    }

    fn config(&self, cluster: Cluster) -> String {
        match cluster {
            Cluster::Source => format!("the consumer config {}", self.consumer_path.display()),
            Cluster::Target => {
                format!("the producer config {}", self.producer_props.path.display())
            }
        }
    }

    fn record_error(&self, reason: impl std::fmt::Display) -> AclSyncError {
        AclSyncError::Record {
            topic: self.record_topic.clone(),
            config: self.config(Cluster::Target),
            reason: self.producer_props.redact(&reason.to_string()),
        }
    }

    fn failure(
        &self,
        cluster: Cluster,
        request: &'static str,
        failure: AdminFailure,
    ) -> AclSyncError {
        let (operation, grant) = match request {
            "DescribeAcls" => ("DESCRIBE the cluster's ACLs", "Describe"),
            _ => ("ALTER the cluster's ACLs", "Alter"),
        };
        if is_denied(failure.code) {
            AclSyncError::Denied {
                cluster: cluster.name(),
                config: self.config(cluster),
                operation,
                grant,
                request,
                reason: failure.reason,
            }
        } else if failure.code == Some(RDKafkaErrorCode::SecurityDisabled) {
            AclSyncError::NoAuthorizer {
                cluster: cluster.name(),
                what: if cluster == Cluster::Source {
                    "copy"
                } else {
                    "make"
                },
                reason: failure.reason,
            }
        } else {
            AclSyncError::Transient {
                cluster: cluster.name(),
                request,
                reason: failure.reason,
            }
        }
    }

    fn describe(&self, cluster: Cluster) -> Result<Vec<TopicAcl>, AclSyncError> {
        let admin = match cluster {
            Cluster::Source => &self.source,
            Cluster::Target => &self.target,
        };
        describe_topic_acls(admin.inner(), self.timeout)
            .map_err(|f| self.failure(cluster, "DescribeAcls", f))
    }

    /// What a round would do, and the lines of source ACLs not copied.
    pub(crate) fn plan(&self) -> Result<AclPlan, AclSyncError> {
        let metadata = self
            .source
            .inner()
            .fetch_metadata(None, self.timeout)
            .map_err(|e| AclSyncError::Transient {
                cluster: "source",
                request: "Metadata",
                reason: e.to_string(),
            })?;
        let sources: Vec<String> = self
            .filter
            .select(&metadata)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        let own: Vec<&str> = self.own.iter().map(String::as_str).collect();
        let scope = Scope {
            filter: &self.filter,
            template: &self.template,
            sources: &sources,
            own: &own,
            mirror: self.mirror.as_deref(),
        };
        let source: BTreeSet<TopicAcl> = self.describe(Cluster::Source)?.into_iter().collect();
        let mut wanted = BTreeMap::new();
        let mut skipped = Vec::new();
        let mut uncopied_denies = Vec::new();
        for acl in &source {
            match translate(acl, &scope) {
                Copied::As(targets) => {
                    for target in targets {
                        wanted.entry(target).or_insert_with(|| acl.clone());
                    }
                }
                Copied::Skipped(line) => {
                    if acl.permission == AclPermission::Deny {
                        uncopied_denies.push(acl);
                    }
                    skipped.push(line);
                }
                Copied::Ignored => {}
            }
        }
        // An ALLOW a source DENY overrides is copied only with that DENY: never a grant on
        // the target that the source refuses.
        wanted.retain(|_, from: &mut TopicAcl| {
            let Some(deny) = uncopied_denies.iter().find(|d| shadows(d, from)) else {
                return true;
            };
            skipped.push(format!(
                "ACL sync: the source's {} is not copied: the source's {}, which is not copied, \
                 overrides it",
                shown(from),
                shown(deny)
            ));
            false
        });
        let existing: BTreeSet<TopicAcl> = self.describe(Cluster::Target)?.into_iter().collect();
        let mut plan = plan(&wanted, &source, &existing, &self.recorded);
        plan.skipped = skipped;
        Ok(plan)
    }

    /// Makes the record topic if missing (compacted, 1 partition) and reads it.
    fn open_record(&mut self) -> Result<(), AclSyncError> {
        let metadata = self
            .target
            .inner()
            .fetch_metadata(Some(&self.record_topic), self.timeout)
            .map_err(|e| AclSyncError::Transient {
                cluster: "target",
                request: "Metadata",
                reason: e.to_string(),
            })?;
        let exists = metadata.topics().iter().any(|t| {
            t.name() == self.record_topic && t.error().is_none() && !t.partitions().is_empty()
        });
        let mut created = false;
        if !exists {
            let replication = (metadata.brokers().len() as i32).clamp(1, 3);
            let topic = NewTopic::new(&self.record_topic, 1, TopicReplication::Fixed(replication))
                .set("cleanup.policy", "compact");
            let options = AdminOptions::new()
                .request_timeout(Some(self.timeout))
                .operation_timeout(Some(self.timeout));
            let runtime = crate::native::runtime().map_err(|e| self.record_error(e))?;
            let results = runtime
                .block_on(self.target.create_topics([&topic], &options))
                .map_err(|e| self.record_error(e))?;
            for result in results {
                match result {
                    Ok(_) => {
                        created = true;
                        tracing::info!(
                            "ACL sync: created its record topic {} (compacted, 1 partition, \
                             replication factor {replication})",
                            self.record_topic
                        )
                    }
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, code)) => {
                        return Err(self.record_error(format!("cannot create it: {code}")))
                    }
                }
            }
        }
        // A topic made just now holds nothing, and its partition may not be known to every
        // broker yet (a watermark request would fail with UnknownPartition).
        self.recorded = if created {
            Recorded::new()
        } else {
            self.read_record(self.timeout)?
        };
        let mut config = self.producer_props.connection_config();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0");
        self.writer = Some(config.create().map_err(|e| self.record_error(e))?);
        Ok(())
    }

    /// Writes each of `acls` to the record with the source binding it copies, or a tombstone
    /// where that is `None`; acknowledged.
    fn write_record(&self, acls: &[(&TopicAcl, Option<&TopicAcl>)]) -> Result<(), AclSyncError> {
        let Some(writer) = &self.writer else {
            return Err(self.record_error("not opened"));
        };
        for (acl, from) in acls {
            let key = record_key(acl);
            let value = from.map(record_key);
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.record_topic).key(&key);
            if let Some(value) = &value {
                record = record.payload(value);
            }
            writer
                .send(record)
                .map_err(|(e, _)| self.record_error(format!("cannot queue a record: {e}")))?;
        }
        writer
            .flush(self.timeout)
            .map_err(|e| self.record_error(format!("records not acknowledged: {e}")))
    }

    fn warn_once(&mut self, line: String) {
        if self.warned.insert(line.clone()) {
            tracing::warn!("{line}");
        }
    }

    /// One round: plan, create what is missing (the DENYs first: an ALLOW is made only once
    /// every DENY the round makes is there), remove what the source no longer has.
    /// Returns how many ACLs were created and removed.
    pub(crate) fn round(&mut self) -> Result<(usize, usize), AclSyncError> {
        if self.writer.is_none() {
            self.open_record()?;
        }
        let plan = self.plan()?;
        for line in plan.skipped.clone() {
            self.warn_once(line);
        }
        let (denies, allows): (Vec<_>, Vec<_>) = plan
            .create
            .iter()
            .partition(|(t, _)| t.permission == AclPermission::Deny);
        let mut created = self.create(&denies)?;
        if created == denies.len() {
            created += self.create(&allows)?;
        } else if !allows.is_empty() {
            self.warn_once(format!(
                "ACL sync: {} not created this round: {} of the source's DENY ACLs could not \
                 be made on the target; tried again next round",
                counted(allows.len(), "ALLOW ACL"),
                denies.len() - created
            ));
        }
        let answers = delete_topic_acls(self.target.inner(), &plan.remove, self.timeout)
            .map_err(|f| self.failure(Cluster::Target, "DeleteAcls", f))?;
        let mut gone = self.answered(Cluster::Target, "DeleteAcls", &plan.remove, &answers)?;
        for acl in &gone {
            tracing::info!(
                "ACL sync: removed {} from the target (the sync made it; the source no longer \
                 has it)",
                shown(acl)
            );
        }
        gone.extend(plan.forget.iter());
        let tombstones: Vec<_> = gone.iter().map(|a| (*a, None)).collect();
        self.write_record(&tombstones)?;
        for acl in &gone {
            self.recorded.remove(*acl);
        }
        Ok((created, gone.len() - plan.forget.len()))
    }

    /// Creates `acls` (target binding, source binding) on the target and records those
    /// made; returns how many were.
    fn create(&mut self, acls: &[&(TopicAcl, TopicAcl)]) -> Result<usize, AclSyncError> {
        let targets: Vec<TopicAcl> = acls.iter().map(|(t, _)| t.clone()).collect();
        let answers = create_topic_acls(self.target.inner(), &targets, self.timeout)
            .map_err(|f| self.failure(Cluster::Target, "CreateAcls", f))?;
        let made = self.answered(Cluster::Target, "CreateAcls", &targets, &answers)?;
        let records: Vec<(&TopicAcl, Option<&TopicAcl>)> = made
            .iter()
            .map(|t| {
                let from = acls.iter().find(|(a, _)| a == *t).map(|(_, s)| s);
                (*t, from)
            })
            .collect();
        self.write_record(&records)?;
        for (acl, from) in &records {
            tracing::info!("ACL sync: created {} on the target", shown(acl));
            self.recorded.insert((*acl).clone(), from.cloned());
        }
        Ok(made.len())
    }

    /// The ACLs of `acls` the cluster applied; a refusal of authorization stops the sync, any
    /// other is warned about (once) and tried again next round.
    fn answered<'a>(
        &mut self,
        cluster: Cluster,
        request: &'static str,
        acls: &'a [TopicAcl],
        answers: &[AclAnswer],
    ) -> Result<Vec<&'a TopicAcl>, AclSyncError> {
        let mut applied = Vec::new();
        for (acl, answer) in acls.iter().zip(answers) {
            match answer {
                None => applied.push(acl),
                Some((code, reason)) => {
                    let failure = AdminFailure {
                        code: Some(*code),
                        reason: reason.clone(),
                    };
                    match self.failure(cluster, request, failure) {
                        AclSyncError::Transient { reason, .. } => self.warn_once(format!(
                            "ACL sync: {request} of {} on the target refused: {reason} \
                             ({code}); tried again next round",
                            shown(acl)
                        )),
                        stop => return Err(stop),
                    }
                }
            }
        }
        Ok(applied)
    }
}

impl AclSync {
    /// [`read_record`]; a refusal stops the sync, anything else is tried again next round.
    fn read_record(&self, timeout: Duration) -> Result<Recorded, AclSyncError> {
        read_record(&self.producer_props, &self.record_topic, timeout).map_err(|e| {
            if is_denied(e.rdkafka_error_code()) {
                self.record_error(&e)
            } else {
                AclSyncError::Transient {
                    cluster: "target",
                    request: "reading the record topic",
                    reason: format!("{}: {e}", self.record_topic),
                }
            }
        })
    }
}

/// Reads the record topic to its end: the ACLs the sync made and has not removed, each with
/// the source binding it copied.
fn read_record(
    props: &ClientProps,
    topic: &str,
    timeout: Duration,
) -> Result<Recorded, KafkaError> {
    let consumer: BaseConsumer<ReaderContext> = props
        .connection_config()
        .set("group.id", "mirror-maker-acl-record-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create_with_context(ReaderContext)?;
    let (_, end) = consumer.fetch_watermarks(topic, 0, timeout)?;
    let mut recorded = Recorded::new();
    if end <= 0 {
        return Ok(recorded);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    loop {
        let at_end = consumer.position().ok().is_some_and(|p| {
            p.elements()
                .iter()
                .any(|e| matches!(e.offset(), Offset::Offset(o) if o >= end))
        });
        if at_end {
            return Ok(recorded);
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Ok(m)) => {
                let Some(acl) = m.key().and_then(parse_record_key) else {
                    continue;
                };
                if let Some(value) = m.payload() {
                    recorded.insert(acl, parse_record_key(value));
                } else {
                    recorded.remove(&acl);
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
}

/// The sync's thread: a round at start, then one every interval, until the mirror stops or a
/// refusal stops the sync. Never fatal to the mirror.
pub(crate) fn run(settings: Settings, control: Arc<Control>) {
    let Some(wanted) = settings.sync_topic_acls.clone() else {
        return;
    };
    let mut sync = match AclSync::new(
        &settings,
        wanted.record_topic,
        settings.options.startup_timeout,
    ) {
        Ok(sync) => sync,
        Err(e) => {
            tracing::warn!("{e}; topic ACLs are not kept in step");
            return;
        }
    };
    tracing::info!(
        "ACL sync: every {:?}, the source's ALLOW and DENY ACLs on mirrored topics (record: \
         {})",
        wanted.interval,
        sync.record_topic
    );
    let mut next = Instant::now();
    let mut failing = false;
    while !control.stop_requested() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        match sync.round() {
            Ok((created, removed)) => {
                failing = false;
                if created + removed > 0 {
                    tracing::info!(
                        "ACL sync: {} created, {} removed on the target",
                        counted(created, "ACL"),
                        removed
                    );
                }
            }
            Err(e) if e.stops() => {
                tracing::error!("{e}");
                return;
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!("{e}; trying again every {:?}", wanted.interval);
            }
            Err(e) => tracing::debug!("{e}"),
        }
        next = Instant::now() + wanted.interval;
    }
}

/// For `check`: what a round would create and remove (the record read if it exists, never
/// made).
pub(crate) fn preview(settings: &Settings, timeout: Duration) -> Result<AclPlan, AclSyncError> {
    let topic = settings
        .sync_topic_acls
        .as_ref()
        .map(|s| s.record_topic.clone())
        .unwrap_or_else(|| crate::settings::defaults::acl_record_topic(None));
    let mut sync = AclSync::new(settings, topic, timeout)?;
    let metadata = sync
        .target
        .inner()
        .fetch_metadata(Some(&sync.record_topic), timeout)
        .map_err(|e| sync.record_error(e))?;
    let exists = metadata.topics().iter().any(|t| {
        t.name() == sync.record_topic && t.error().is_none() && !t.partitions().is_empty()
    });
    if exists {
        sync.recorded = sync.read_record(timeout)?;
    }
    sync.plan()
}

/// `check`'s lines for a plan.
pub(crate) fn plan_lines(plan: &AclPlan) -> Vec<String> {
    let mut lines: Vec<String> = plan
        .create
        .iter()
        .map(|(t, s)| {
            format!(
                "ACL sync: will create {} (the source has {})",
                shown(t),
                shown(s)
            )
        })
        .collect();
    lines.extend(plan.remove.iter().map(|a| {
        format!(
            "ACL sync: will remove {} (the sync made it; the source no longer has it)",
            shown(a)
        )
    }));
    lines.extend(plan.skipped.iter().cloned());
    if plan.create.is_empty() && plan.remove.is_empty() {
        lines.push("ACL sync: the target's topic ACLs are in step".to_owned());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(pattern: AclPattern, name: &str, principal: &str, op: AclOperation) -> TopicAcl {
        TopicAcl {
            pattern,
            name: name.into(),
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission: AclPermission::Allow,
        }
    }

    fn deny(pattern: AclPattern, name: &str, principal: &str, op: AclOperation) -> TopicAcl {
        TopicAcl {
            permission: AclPermission::Deny,
            ..acl(pattern, name, principal, op)
        }
    }

    const SOURCES: &[&str] = &["orders", "payments"];

    fn copy(a: &TopicAcl, template: &str) -> Copied {
        let filter = TopicFilter::new("orders|payments|pay.*").unwrap();
        let template = TopicTemplate::parse(template).unwrap();
        let sources: Vec<String> = SOURCES.iter().map(|s| s.to_string()).collect();
        translate(
            a,
            &Scope {
                filter: &filter,
                template: &template,
                sources: &sources,
                own: &["mirror-maker.offsets.source"],
                mirror: Some("User:mirror"),
            },
        )
    }

    fn one(a: TopicAcl) -> Copied {
        Copied::As(vec![a])
    }

    use AclOperation::*;
    use AclPattern::*;

    #[test]
    fn a_literal_acl_is_renamed_by_the_template_and_all_becomes_read() {
        let alice = acl(Literal, "orders", "User:alice", Read);
        assert_eq!(
            copy(&alice, "primary.{topic}"),
            one(acl(Literal, "primary.orders", "User:alice", Read))
        );
        let dave = acl(Literal, "orders", "User:dave", All);
        assert_eq!(
            copy(&dave, "{topic}"),
            one(acl(Literal, "orders", "User:dave", Read))
        );
    }

    #[test]
    fn write_is_never_copied() {
        let carol = acl(Literal, "orders", "User:carol", Write);
        assert_eq!(copy(&carol, "{topic}"), Copied::Ignored);
    }

    #[test]
    fn a_prefix_is_copied_only_where_the_template_keeps_prefixes_meaningful() {
        let bob = acl(Prefixed, "pay", "User:bob", Read);
        assert_eq!(
            copy(&bob, "primary.{topic}"),
            one(acl(Prefixed, "primary.pay", "User:bob", Read))
        );
        assert!(matches!(copy(&bob, "{topic}.dr"), Copied::Skipped(line) if line.contains("pay")));
        // No mirrored topic starts with it: not the mirror's business.
        let other = acl(Prefixed, "zzz", "User:bob", Read);
        assert_eq!(copy(&other, "{topic}"), Copied::Ignored);
    }

    #[test]
    fn a_prefix_covering_the_mirrors_own_topics_is_not_copied_and_said() {
        // `orders|payments` mirrored with the template {topic}: PREFIXED `m` would cover the
        // offset store mirror-maker.offsets.source on the target (and any mirror-maker
        // bookkeeping topic), `pay` does not.
        let filter = TopicFilter::new("orders|payments|metrics").unwrap();
        let template = TopicTemplate::parse("{topic}").unwrap();
        let sources = vec!["metrics".to_owned(), "payments".to_owned()];
        let scope = Scope {
            filter: &filter,
            template: &template,
            sources: &sources,
            own: &["mirror-maker.offsets.source", "mirror-maker.acls.source"],
            mirror: None,
        };
        let ops = acl(Prefixed, "m", "User:ops", Read);
        let Copied::Skipped(line) = translate(&ops, &scope) else {
            panic!("copied");
        };
        assert!(
            line.contains("would cover mirror-maker.offsets.source"),
            "{line}"
        );
        let bob = acl(Prefixed, "pay", "User:bob", Read);
        assert!(matches!(translate(&bob, &scope), Copied::As(_)));
    }

    #[test]
    fn only_what_reading_the_copy_needs_is_granted() {
        for op in [Read, Describe, DescribeConfigs] {
            let a = acl(Literal, "orders", "User:alice", op);
            assert_eq!(copy(&a, "{topic}"), one(a.clone()), "{}", op.name());
        }
        for op in [Delete, Alter, AlterConfigs, Create] {
            let a = acl(Prefixed, "pay", "User:ops", op);
            let Copied::Skipped(line) = copy(&a, "primary.{topic}") else {
                panic!("{} copied", op.name());
            };
            assert!(
                line.contains(&format!("{} for User:ops", op.name()))
                    && line.contains("change or delete the copy"),
                "{line}"
            );
        }
    }

    #[test]
    fn topics_outside_the_whitelist_and_the_wildcard_are_not_copied() {
        let outside = acl(Literal, "secrets", "User:eve", Read);
        assert_eq!(copy(&outside, "{topic}"), Copied::Ignored);
        let star = acl(Literal, "*", "User:eve", Read);
        assert!(matches!(copy(&star, "{topic}"), Copied::Skipped(_)));
    }

    #[test]
    fn a_deny_travels_with_its_topic_whatever_it_refuses() {
        // A DENY narrows access: every operation as it is, for a named principal.
        for op in [Read, Write, Describe, Delete, AlterConfigs, All] {
            let intruder = deny(Literal, "orders", "User:intruder", op);
            assert_eq!(
                copy(&intruder, "primary.{topic}"),
                one(deny(Literal, "primary.orders", "User:intruder", op)),
                "{}",
                op.name()
            );
        }
        let prefixed = deny(Prefixed, "pay", "User:intruder", Read);
        assert_eq!(
            copy(&prefixed, "primary.{topic}"),
            one(deny(Prefixed, "primary.pay", "User:intruder", Read))
        );
        let outside = deny(Literal, "secrets", "User:intruder", Read);
        assert_eq!(copy(&outside, "{topic}"), Copied::Ignored);
    }

    #[test]
    fn a_deny_whose_pattern_cannot_travel_becomes_one_per_mirrored_topic() {
        // Every topic: on the target, each mirrored one (not the target's others).
        let everywhere = deny(Literal, "*", "User:intruder", Read);
        assert_eq!(
            copy(&everywhere, "primary.{topic}"),
            Copied::As(vec![
                deny(Literal, "primary.orders", "User:intruder", Read),
                deny(Literal, "primary.payments", "User:intruder", Read),
            ])
        );
        // A prefix under a template with a suffix names no target prefix.
        let prefixed = deny(Prefixed, "pay", "User:intruder", Read);
        assert_eq!(
            copy(&prefixed, "{topic}.dr"),
            one(deny(Literal, "payments.dr", "User:intruder", Read))
        );
        // A prefix over the mirror's own topics: each mirrored topic it covers.
        let filter = TopicFilter::new("metrics").unwrap();
        let template = TopicTemplate::parse("{topic}").unwrap();
        let sources = vec!["metrics".to_owned()];
        let scope = Scope {
            filter: &filter,
            template: &template,
            sources: &sources,
            own: &["mirror-maker.offsets.source"],
            mirror: None,
        };
        let m = deny(Prefixed, "m", "User:intruder", Read);
        assert_eq!(
            translate(&m, &scope),
            one(deny(Literal, "metrics", "User:intruder", Read))
        );
    }

    #[test]
    fn a_deny_that_would_refuse_the_mirror_its_copy_is_not_copied_nor_what_it_overrides() {
        for principal in ["User:*", "User:mirror"] {
            for op in [
                Write,
                Describe,
                Create,
                Alter,
                AlterConfigs,
                DescribeConfigs,
            ] {
                let d = deny(Literal, "orders", principal, op);
                let Copied::Skipped(line) = copy(&d, "{topic}") else {
                    panic!("DENY {} for {principal} copied", op.name());
                };
                assert!(line.contains("refuse the mirror itself"), "{line}");
            }
            // Nobody reads the copy: that much of ALL travels.
            assert_eq!(
                copy(&deny(Literal, "orders", principal, All), "{topic}"),
                one(deny(Literal, "orders", principal, Read))
            );
            assert_eq!(
                copy(&deny(Literal, "orders", principal, Read), "{topic}"),
                one(deny(Literal, "orders", principal, Read))
            );
        }
        let describe = deny(Literal, "orders", "User:*", Describe);
        let alice = acl(Literal, "orders", "User:alice", Describe);
        let prefixed = acl(Prefixed, "ord", "User:bob", Describe);
        assert!(shadows(&describe, &alice));
        assert!(!shadows(&describe, &prefixed));
        assert!(!shadows(
            &describe,
            &acl(Literal, "orders", "User:alice", Read)
        ));
        let everywhere = deny(Literal, "*", "User:alice", All);
        assert!(shadows(&everywhere, &alice) && !shadows(&everywhere, &prefixed));
        assert!(shadows(
            &deny(Prefixed, "o", "User:bob", Describe),
            &prefixed
        ));
    }

    #[test]
    fn only_acls_the_sync_made_are_ever_removed() {
        let wanted_acl = acl(Literal, "orders", "User:alice", Read);
        let by_hand = acl(Literal, "orders", "User:ops", Read);
        let made_gone = acl(Literal, "orders", "User:old", Read);
        let made_vanished = acl(Literal, "orders", "User:older", Read);
        let wanted = BTreeMap::from([(wanted_acl.clone(), wanted_acl.clone())]);
        let existing = BTreeSet::from([by_hand.clone(), made_gone.clone()]);
        let recorded = Recorded::from([
            (made_gone.clone(), Some(made_gone.clone())),
            (made_vanished.clone(), None),
        ]);
        let p = plan(&wanted, &BTreeSet::new(), &existing, &recorded);
        assert_eq!(p.create, vec![(wanted_acl.clone(), wanted_acl)]);
        assert_eq!(p.remove, vec![made_gone]);
        assert_eq!(p.forget, vec![made_vanished]);
    }

    #[test]
    fn a_copied_deny_is_removed_only_once_the_source_deny_is_gone() {
        // The topic left the source (a DENY spread over each mirrored topic no longer covers
        // it): its copy stays on the target, and so does what refuses it.
        let source_deny = deny(Literal, "*", "User:intruder", Read);
        let copied = deny(Literal, "payments", "User:intruder", Read);
        let existing = BTreeSet::from([copied.clone()]);
        let recorded = Recorded::from([(copied.clone(), Some(source_deny.clone()))]);
        let source = BTreeSet::from([source_deny]);
        let kept = plan(&BTreeMap::new(), &source, &existing, &recorded);
        assert!(kept.remove.is_empty() && kept.forget.is_empty(), "{kept:?}");
        let gone = plan(&BTreeMap::new(), &BTreeSet::new(), &existing, &recorded);
        assert_eq!(gone.remove, vec![copied]);
    }

    #[test]
    fn a_record_key_reads_back_as_its_binding() {
        let a = acl(Prefixed, "primary.pay", "User:bob|x", DescribeConfigs);
        assert_eq!(parse_record_key(&record_key(&a)), Some(a.clone()));
        // The keys of ALLOWs recorded before DENYs were copied are read the same.
        assert_eq!(
            record_key(&a),
            br#"["PREFIXED","primary.pay","User:bob|x","*","DESCRIBE_CONFIGS"]"#
        );
        let d = deny(Literal, "orders", "User:intruder", Read);
        assert_eq!(parse_record_key(&record_key(&d)), Some(d));
        assert_eq!(parse_record_key(b"[\"LITERAL\"]"), None);
    }

    #[test]
    fn a_refusal_names_the_operation_the_cluster_and_the_config_file() {
        let line = AclSyncError::Denied {
            cluster: "source",
            config: "the consumer config /etc/mm/consumer.toml".into(),
            operation: "DESCRIBE the cluster's ACLs",
            grant: "Describe",
            request: "DescribeAcls",
            reason: "Cluster authorization failed".into(),
        }
        .to_string();
        for needle in [
            "source cluster",
            "DESCRIBE",
            "/etc/mm/consumer.toml",
            "stops until restart",
        ] {
            assert!(line.contains(needle), "{needle} not in {line}");
        }
    }
}
