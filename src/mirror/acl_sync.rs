//! Topic ACLs kept in step (`--sync.topic.acls true`), as MirrorMaker 2 does: after a failover
//! the consumers' principals find their READ on the target topics.
//!
//! Every interval (`--sync.topic.configs.interval.ms`), the source's ALLOW ACLs on TOPIC
//! resources (DescribeAcls) that name mirrored topics are copied onto the target
//! (CreateAcls) where missing:
//!
//! - a LITERAL ACL whose topic the whitelist matches: its name through `--target.topic`;
//! - a PREFIXED ACL with a prefix some whitelisted source topic starts with: the template's
//!   prefix before it (`pay` becomes `primary.pay` under `primary.{topic}`), when the template
//!   adds nothing after `{topic}`; otherwise no one prefix names the target topics, and the
//!   ACL is warned about once and skipped;
//! - principals and hosts as they are; READ, DESCRIBE and DESCRIBE_CONFIGS as they are, ALL as
//!   READ; WRITE is dropped (only the mirror writes a mirrored topic), and CREATE, DELETE,
//!   ALTER and ALTER_CONFIGS are not copied, said once ([`granted`]); DENY entries are never
//!   copied; the LITERAL wildcard `*` is not copied (it would grant on every target topic,
//!   mirrored or not), nor a binding that would cover the mirror's own topics on the target
//!   ([`covered_own`]).
//!
//! What the sync made is recorded in a compacted topic of its own on the target
//! (`mirror-maker.acls.SOURCE NAME`), keyed by the binding, a tombstone when removed; it is
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
    AdminFailure, TopicAcl,
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

/// A source ACL as the target gets it, or why it is not copied (`None`: not a mirrored
/// topic's, or WRITE, which is dropped without a word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Copied {
    As(TopicAcl),
    Skipped(String),
    Ignored,
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

/// Whether a target binding of `pattern` and `name` covers `topic`.
fn covers(pattern: AclPattern, name: &str, topic: &str) -> bool {
    match pattern {
        AclPattern::Literal => name == topic,
        AclPattern::Prefixed => topic.starts_with(name),
    }
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
        .find(|b| name.starts_with(*b) || (pattern == AclPattern::Prefixed && b.starts_with(name)))
        .map(|b| format!("{b}* (mirror-maker's bookkeeping)"))
}

/// What a source ACL becomes on the target. `sources` are the source topics the whitelist
/// matches (for a PREFIXED ACL: copied when one starts with its prefix); `own` the mirror's
/// own topics on the target, which no copied binding may cover.
pub(crate) fn translate(
    acl: &TopicAcl,
    filter: &TopicFilter,
    template: &TopicTemplate,
    sources: &[String],
    own: &[&str],
) -> Copied {
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
            if !filter.matches(&acl.name) || own.contains(&acl.name.as_str()) {
                return Copied::Ignored;
            }
            template.render(&acl.name)
        }
        AclPattern::Prefixed => {
            if !sources.iter().any(|t| t.starts_with(&acl.name)) {
                return Copied::Ignored;
            }
            match template.render_prefix(&acl.name) {
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
    let shown = |name: &str| match acl.pattern {
        AclPattern::Literal => format!("LITERAL topic {name}"),
        AclPattern::Prefixed => format!("topics with PREFIX {name}"),
    };
    if let Some(topic) = covered_own(acl.pattern, &name, own) {
        return Copied::Skipped(format!(
            "ACL sync: the source's {} for {} on {} is not copied: on the target, {} would \
             cover {topic}, the mirror's own; add a narrower one on the target by hand if \
             wanted",
            acl.operation.name(),
            acl.principal,
            shown(&acl.name),
            shown(&name),
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
            shown(&acl.name),
            acl.operation.name(),
        ));
    };
    Copied::As(TopicAcl {
        pattern: acl.pattern,
        name,
        principal: acl.principal.clone(),
        host: acl.host.clone(),
        operation,
    })
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

/// The plan of a round from what the source wants (target ACL -> source ACL), what the target
/// has and what the sync recorded making.
pub(crate) fn plan(
    wanted: &BTreeMap<TopicAcl, TopicAcl>,
    existing: &BTreeSet<TopicAcl>,
    recorded: &BTreeSet<TopicAcl>,
) -> AclPlan {
    let mut plan = AclPlan::default();
    for (target, source) in wanted {
        if !existing.contains(target) {
            plan.create.push((target.clone(), source.clone()));
        }
    }
    for acl in recorded {
        if wanted.contains_key(acl) {
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

/// A binding as the record topic's key: a JSON array, one string per field.
pub(crate) fn record_key(acl: &TopicAcl) -> Vec<u8> {
    let pattern = match acl.pattern {
        AclPattern::Literal => "LITERAL",
        AclPattern::Prefixed => "PREFIXED",
    };
    serde_json::to_vec(&[
        pattern,
        acl.name.as_str(),
        acl.principal.as_str(),
        acl.host.as_str(),
        acl.operation.name(),
    ])
    .expect("an array of strings is JSON")
}

/// The binding of a record key; `None` for a key this version does not read.
pub(crate) fn parse_record_key(key: &[u8]) -> Option<TopicAcl> {
    let fields: Vec<String> = serde_json::from_slice(key).ok()?;
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
    })
}

/// `READ for User:alice (host *) on LITERAL topic primary.orders`.
pub(crate) fn shown(acl: &TopicAcl) -> String {
    let pattern = match acl.pattern {
        AclPattern::Literal => "LITERAL topic",
        AclPattern::Prefixed => "topics with PREFIX",
    };
    format!(
        "{} for {} (host {}) on {pattern} {}",
        acl.operation.name(),
        acl.principal,
        acl.host,
        acl.name
    )
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
    record_topic: String,
    timeout: Duration,
    recorded: BTreeSet<TopicAcl>,
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
            record_topic,
            timeout,
            recorded: BTreeSet::new(),
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
        let mut wanted = BTreeMap::new();
        let mut skipped = Vec::new();
        for acl in self.describe(Cluster::Source)? {
            match translate(&acl, &self.filter, &self.template, &sources, &own) {
                Copied::As(target) => {
                    wanted.entry(target).or_insert(acl);
                }
                Copied::Skipped(line) => skipped.push(line),
                Copied::Ignored => {}
            }
        }
        let existing: BTreeSet<TopicAcl> = self.describe(Cluster::Target)?.into_iter().collect();
        let mut plan = plan(&wanted, &existing, &self.recorded);
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
            BTreeSet::new()
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

    /// Writes `acls` to the record (a tombstone where `made` is false), acknowledged.
    fn write_record(&self, acls: &[&TopicAcl], made: bool) -> Result<(), AclSyncError> {
        let Some(writer) = &self.writer else {
            return Err(self.record_error("not opened"));
        };
        for acl in acls {
            let key = record_key(acl);
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.record_topic).key(&key);
            if made {
                record = record.payload(&key);
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

    /// One round: plan, create what is missing, remove what the source no longer has.
    /// Returns how many ACLs were created and removed.
    pub(crate) fn round(&mut self) -> Result<(usize, usize), AclSyncError> {
        if self.writer.is_none() {
            self.open_record()?;
        }
        let plan = self.plan()?;
        for line in plan.skipped.clone() {
            self.warn_once(line);
        }
        let create: Vec<TopicAcl> = plan.create.iter().map(|(t, _)| t.clone()).collect();
        let answers = create_topic_acls(self.target.inner(), &create, self.timeout)
            .map_err(|f| self.failure(Cluster::Target, "CreateAcls", f))?;
        let made = self.answered(Cluster::Target, "CreateAcls", &create, &answers)?;
        self.write_record(&made, true)?;
        for acl in &made {
            tracing::info!("ACL sync: created {} on the target", shown(acl));
            self.recorded.insert((*acl).clone());
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
        self.write_record(&gone, false)?;
        for acl in &gone {
            self.recorded.remove(*acl);
        }
        Ok((made.len(), gone.len() - plan.forget.len()))
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
    fn read_record(&self, timeout: Duration) -> Result<BTreeSet<TopicAcl>, AclSyncError> {
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

/// Reads the record topic to its end: the ACLs the sync made and has not removed.
fn read_record(
    props: &ClientProps,
    topic: &str,
    timeout: Duration,
) -> Result<BTreeSet<TopicAcl>, KafkaError> {
    let consumer: BaseConsumer<ReaderContext> = props
        .connection_config()
        .set("group.id", "mirror-maker-acl-record-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create_with_context(ReaderContext)?;
    let (_, end) = consumer.fetch_watermarks(topic, 0, timeout)?;
    let mut recorded = BTreeSet::new();
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
                if m.payload().is_some() {
                    recorded.insert(acl);
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
        "ACL sync: every {:?}, the source's ALLOW ACLs on mirrored topics (record: {})",
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
        }
    }

    fn copy(a: &TopicAcl, template: &str) -> Copied {
        let filter = TopicFilter::new("orders|payments|pay.*").unwrap();
        let template = TopicTemplate::parse(template).unwrap();
        let sources = vec!["orders".to_owned(), "payments".to_owned()];
        translate(
            a,
            &filter,
            &template,
            &sources,
            &["mirror-maker.offsets.source"],
        )
    }

    use AclOperation::*;
    use AclPattern::*;

    #[test]
    fn a_literal_acl_is_renamed_by_the_template_and_all_becomes_read() {
        let alice = acl(Literal, "orders", "User:alice", Read);
        assert_eq!(
            copy(&alice, "primary.{topic}"),
            Copied::As(acl(Literal, "primary.orders", "User:alice", Read))
        );
        let dave = acl(Literal, "orders", "User:dave", All);
        assert_eq!(
            copy(&dave, "{topic}"),
            Copied::As(acl(Literal, "orders", "User:dave", Read))
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
            Copied::As(acl(Prefixed, "primary.pay", "User:bob", Read))
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
        let own = ["mirror-maker.offsets.source", "mirror-maker.acls.source"];
        let ops = acl(Prefixed, "m", "User:ops", Read);
        let Copied::Skipped(line) = translate(&ops, &filter, &template, &sources, &own) else {
            panic!("copied");
        };
        assert!(
            line.contains("would cover mirror-maker.offsets.source"),
            "{line}"
        );
        let bob = acl(Prefixed, "pay", "User:bob", Read);
        assert!(matches!(
            translate(&bob, &filter, &template, &sources, &own),
            Copied::As(_)
        ));
    }

    #[test]
    fn only_what_reading_the_copy_needs_is_granted() {
        for op in [Read, Describe, DescribeConfigs] {
            let a = acl(Literal, "orders", "User:alice", op);
            assert_eq!(copy(&a, "{topic}"), Copied::As(a.clone()), "{}", op.name());
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
    fn only_acls_the_sync_made_are_ever_removed() {
        let wanted_acl = acl(Literal, "orders", "User:alice", Read);
        let by_hand = acl(Literal, "orders", "User:ops", Read);
        let made_gone = acl(Literal, "orders", "User:old", Read);
        let made_vanished = acl(Literal, "orders", "User:older", Read);
        let wanted = BTreeMap::from([(wanted_acl.clone(), wanted_acl.clone())]);
        let existing = BTreeSet::from([by_hand.clone(), made_gone.clone()]);
        let recorded = BTreeSet::from([made_gone.clone(), made_vanished.clone()]);
        let p = plan(&wanted, &existing, &recorded);
        assert_eq!(p.create, vec![(wanted_acl.clone(), wanted_acl)]);
        assert_eq!(p.remove, vec![made_gone]);
        assert_eq!(p.forget, vec![made_vanished]);
    }

    #[test]
    fn a_record_key_reads_back_as_its_binding() {
        let a = acl(Prefixed, "primary.pay", "User:bob|x", DescribeConfigs);
        assert_eq!(parse_record_key(&record_key(&a)), Some(a));
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
