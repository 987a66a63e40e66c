//! Target topics made to match the source (`--create.topics true`): before an assigned
//! partition is fetched, its target topic is created with the source's partition count, a
//! replication factor capped at the target's brokers, and the topic configs that matter; a
//! target topic with fewer partitions than the source gets the missing ones.
//!
//! Called from the rebalance callback (the stream's thread), before fetching starts. A cache
//! of the partitions each target topic is known to have answers repeats without a request
//! (its lock is held only to read and update it; two streams making the same topic at once
//! is harmless: the second finds it exists). Errors say whether they are transient (a time-out,
//! brokers down: the caller retries) or permanent (authorization, policy: fatal).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::Metadata;

use crate::settings::client::ClientProps;
use crate::settings::counted;
use crate::settings::routing::TopicTemplate;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TopicError {
    #[error("cannot create target topic {topic} ({}, replication factor {replication}): the target cluster refused: {reason}. Create it yourself, or grant the mirror's principal CREATE on it", counted(.partitions, "partition"))]
    CreateRefused {
        topic: String,
        partitions: usize,
        replication: i32,
        reason: String,
        transient: bool,
    },
    #[error("target topic {topic} has {} and source topic {source_topic} has {want}; adding partitions was refused: {reason}. Add them yourself, or use --partitioning hash", counted(.have, "partition"))]
    GrowRefused {
        topic: String,
        source_topic: String,
        have: usize,
        want: usize,
        reason: String,
        transient: bool,
    },
    #[error("cannot read the metadata of topic {topic} on the {cluster} cluster: {reason}")]
    Metadata {
        cluster: &'static str,
        topic: String,
        reason: String,
        transient: bool,
    },
}

impl TopicError {
    /// Whether trying again later may succeed (a time-out, a broker down or moving, a
    /// controller changing); the others (authorization, policy, invalid settings) will not.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            TopicError::CreateRefused { transient, .. }
            | TopicError::GrowRefused { transient, .. }
            | TopicError::Metadata { transient, .. } => *transient,
        }
    }
}

/// Whether an error code from an admin or metadata request is worth retrying.
pub(crate) fn transient_code(code: Option<RDKafkaErrorCode>) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        Some(
            C::OperationTimedOut
                | C::RequestTimedOut
                | C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::Resolve
                | C::BrokerNotAvailable
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::NotController
                | C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::CoordinatorLoadInProgress
                | C::NetworkException
                | C::ReplicaNotAvailable
                | C::NotEnoughReplicas
                | C::NotEnoughReplicasAfterAppend
                | C::KafkaStorageError
                | C::UnknownTopicOrPartition
                | C::ThrottlingQuotaExceeded
                | C::WaitingForCoordinator
                | C::NoEnt
        )
    )
}

/// Creates target topics and partitions as the source has them.
pub(crate) struct TopicCreator {
    source: AdminClient<DefaultClientContext>,
    target: AdminClient<DefaultClientContext>,
    template: TopicTemplate,
    copied: Vec<String>,
    /// Partitions each target topic is known to have (after creating or growing it).
    known: Mutex<HashMap<String, usize>>,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    /// Whether the target must have every source partition number (`--partitioning preserve`).
    preserve: bool,
}

impl std::fmt::Debug for TopicCreator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCreator")
            .field("copied", &self.copied)
            .finish_non_exhaustive()
    }
}

fn partitions_of(metadata: &Metadata, topic: &str) -> Option<(usize, i32)> {
    let t = metadata.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() || t.partitions().is_empty() {
        return None;
    }
    let replication = t.partitions()[0].replicas().len() as i32;
    Some((t.partitions().len(), replication))
}

impl TopicCreator {
    pub(crate) fn new(
        consumer: &ClientProps,
        producer: &ClientProps,
        template: TopicTemplate,
        copied: &str,
        preserve: bool,
        timeout: Duration,
    ) -> Result<TopicCreator, String> {
        // An admin client is a producer to librdkafka, whose metadata requests ask the broker
        // to auto-create the topics they name unless told not to: asking whether a target
        // topic exists would create it with the broker's defaults (auto.create.topics.enable
        // is on by default in Kafka), bypassing the creation below.
        let admin = |props: &ClientProps| {
            props
                .connection_config()
                .set("allow.auto.create.topics", "false")
                .create::<AdminClient<DefaultClientContext>>()
                .map_err(|e| format!("{}: {e}", props.path.display()))
        };
        Ok(TopicCreator {
            source: admin(consumer)?,
            target: admin(producer)?,
            template,
            copied: copied
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            known: Mutex::default(),
            runtime: crate::native::runtime().map_err(|e| e.to_string())?,
            timeout,
            preserve,
        })
    }

    /// Every admin request waits at most `timeout` for the broker's answer.
    fn options(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(self.timeout))
            .operation_timeout(Some(self.timeout))
    }

    fn metadata(&self, cluster: &'static str, topic: &str) -> Result<Metadata, TopicError> {
        let client = if cluster == "source" {
            self.source.inner()
        } else {
            self.target.inner()
        };
        client
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| TopicError::Metadata {
                cluster,
                topic: topic.to_owned(),
                reason: e.to_string(),
                transient: transient_code(e.rdkafka_error_code()),
            })
    }

    /// Makes sure the target topic of `source_topic` exists and has at least as many
    /// partitions as the source, and at least `assigned` (one more than the highest source
    /// partition number assigned). Returns the target topic's name. The cache is consulted
    /// first: a target topic known to have the assigned partitions costs no request.
    pub(crate) fn ensure(&self, source_topic: &str, assigned: usize) -> Result<String, TopicError> {
        let target_topic = self.template.render(source_topic);
        if self.known_partitions(&target_topic) >= assigned.max(1) {
            return Ok(target_topic);
        }
        let source = self.metadata("source", source_topic)?;
        let Some((want, source_replication)) = partitions_of(&source, source_topic) else {
            // Gone from the source: nothing to create; the stream handles the topic's error.
            return Ok(target_topic);
        };
        let want = want.max(assigned);
        if self.known_partitions(&target_topic) >= want {
            return Ok(target_topic);
        }
        let target = self.metadata("target", &target_topic)?;
        let have = match partitions_of(&target, &target_topic) {
            Some((have, _)) => have,
            None => {
                let brokers = target.brokers().len().max(1) as i32;
                let replication = source_replication.clamp(1, brokers);
                self.create(source_topic, &target_topic, want, replication)?;
                want
            }
        };
        if have < want {
            self.grow(source_topic, &target_topic, have, want)?;
        }
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target_topic.clone(), want.max(have));
        Ok(target_topic)
    }

    fn known_partitions(&self, target_topic: &str) -> usize {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(target_topic)
            .copied()
            .unwrap_or(0)
    }

    /// Forgets what is known of `target_topic` (it was found missing): the next
    /// [`ensure`](Self::ensure) asks the clusters again and creates it.
    pub(crate) fn forget(&self, target_topic: &str) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(target_topic);
    }

    /// The topic configs to copy: the source topic's effective values of the listed keys
    /// (defaults included, so the target topic behaves as the source topic does even where
    /// the brokers' defaults differ). A source that cannot describe them gets a warning, not
    /// a failure.
    fn configs_to_copy(&self, source_topic: &str) -> Vec<(String, String)> {
        if self.copied.is_empty() {
            return Vec::new();
        }
        let opts = self.options();
        let described = self.runtime.block_on(
            self.source
                .describe_configs([&ResourceSpecifier::Topic(source_topic)], &opts),
        );
        let warn = |why: String| {
            tracing::warn!(
                "cannot read the configs of source topic {source_topic} ({why}); creating its \
                 target topic with the target's defaults"
            );
            Vec::new()
        };
        match described.as_deref() {
            Ok([Ok(resource)]) => resource
                .entries
                .iter()
                .filter(|e| !e.is_sensitive && self.copied.contains(&e.name))
                .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                .collect(),
            Ok([Err(code)]) => warn(code.to_string()),
            Ok(_) => warn("no answer for the topic".to_owned()),
            Err(e) => warn(e.to_string()),
        }
    }

    fn create(
        &self,
        source_topic: &str,
        target_topic: &str,
        partitions: usize,
        replication: i32,
    ) -> Result<(), TopicError> {
        let configs = self.configs_to_copy(source_topic);
        let mut new_topic = NewTopic::new(
            target_topic,
            partitions as i32,
            TopicReplication::Fixed(replication),
        );
        for (k, v) in &configs {
            new_topic = new_topic.set(k, v);
        }
        let opts = self.options();
        let refused = |reason: String, code: Option<RDKafkaErrorCode>| TopicError::CreateRefused {
            topic: target_topic.to_owned(),
            partitions,
            replication,
            reason,
            transient: transient_code(code),
        };
        let results = self
            .runtime
            .block_on(self.target.create_topics([&new_topic], &opts))
            .map_err(|e| refused(e.to_string(), e.rdkafka_error_code()))?;
        for result in results {
            match result {
                Ok(_) => {}
                // Another instance of the group created it first.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(()),
                Err((_, code)) => return Err(refused(code.to_string(), Some(code))),
            }
        }
        let shown: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        tracing::info!(
            "created target topic {target_topic}: {}, replication factor {replication}, configs \
             from {source_topic}: [{}]",
            counted(partitions, "partition"),
            shown.join(", ")
        );
        Ok(())
    }

    fn grow(
        &self,
        source_topic: &str,
        target_topic: &str,
        have: usize,
        want: usize,
    ) -> Result<(), TopicError> {
        let opts = self.options();
        let request = NewPartitions::new(target_topic, want);
        let refused = |reason: String, code: Option<RDKafkaErrorCode>| TopicError::GrowRefused {
            topic: target_topic.to_owned(),
            source_topic: source_topic.to_owned(),
            have,
            want,
            reason,
            transient: transient_code(code),
        };
        let outcome = self
            .runtime
            .block_on(self.target.create_partitions([&request], &opts))
            .map_err(|e| refused(e.to_string(), e.rdkafka_error_code()))
            .and_then(|results| match results.into_iter().next() {
                Some(Err((_, code))) => Err(refused(code.to_string(), Some(code))),
                _ => Ok(()),
            });
        match outcome {
            Ok(()) => {
                tracing::info!(
                    "added partitions to target topic {target_topic}: {have} -> {want}, as \
                     source topic {source_topic} has"
                );
                Ok(())
            }
            // With hash partitioning every record still has somewhere to go.
            Err(e) if !self.preserve && !e.is_transient() => {
                tracing::warn!("{e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// `--on.handler.error dead-letter`: makes sure the dead-letter topic exists on the target
/// before anything is consumed: created with 1 partition (replication factor the target's
/// brokers, at most 3) under `--create.topics true`, otherwise refused. Returns what it did,
/// for the log.
pub(crate) fn ensure_dead_letter_topic(
    producer: &ClientProps,
    topic: &str,
    create: bool,
    timeout: Duration,
) -> Result<String, String> {
    let admin = producer
        .connection_config()
        .set("allow.auto.create.topics", "false")
        .create::<AdminClient<DefaultClientContext>>()
        .map_err(|e| format!("{}: {e}", producer.path.display()))?;
    let cannot = |why: String| {
        format!(
            "dead-letter topic {topic} (--dead.letter.topic): {why}. Create it on the target \
             yourself, or grant the producer's principal CREATE on it"
        )
    };
    let metadata = admin
        .inner()
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| cannot(format!("cannot read its metadata: {e}")))?;
    if partitions_of(&metadata, topic).is_some() {
        return Ok(format!("dead-letter topic {topic} exists"));
    }
    if !create {
        return Err(format!(
            "dead-letter topic {topic} (--dead.letter.topic) does not exist on the target and \
             --create.topics is false: create it, or run with --create.topics true"
        ));
    }
    let cluster_id = admin.inner().fetch_cluster_id(timeout).unwrap_or_default();
    if cluster_id.starts_with("mockCluster") {
        // librdkafka's mock cluster has no CreateTopics; it makes a topic on the first produce.
        return Ok(format!(
            "dead-letter topic {topic}: made by the mock cluster on first write"
        ));
    }
    let replication = (metadata.brokers().len() as i32).clamp(1, 3);
    let new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(replication));
    let options = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let runtime = crate::native::runtime().map_err(|e| cannot(e.to_string()))?;
    let results = runtime
        .block_on(admin.create_topics([&new_topic], &options))
        .map_err(|e| cannot(format!("the target cluster refused to create it: {e}")))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(cannot(format!(
                    "the target cluster refused to create it: {code}"
                )))
            }
        }
    }
    Ok(format!(
        "created the dead-letter topic {topic} (1 partition, replication factor {replication})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_outs_and_brokers_down_are_transient_refusals_are_not() {
        for code in [
            RDKafkaErrorCode::OperationTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotController,
            RDKafkaErrorCode::LeaderNotAvailable,
        ] {
            assert!(transient_code(Some(code)), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
            RDKafkaErrorCode::PolicyViolation,
            RDKafkaErrorCode::InvalidReplicationFactor,
            RDKafkaErrorCode::InvalidConfig,
        ] {
            assert!(!transient_code(Some(code)), "{code:?}");
        }
        assert!(!transient_code(None));
    }
}
