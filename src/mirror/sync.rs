//! Topic configs kept in step (`--sync.topic.configs`): every interval, each mirrored topic (a
//! source topic the whitelist matches whose target topic exists) gets on its target topic the
//! configs of `--create.topics.configs` that the source topic sets explicitly (a dynamic topic
//! config, not a broker's or Kafka's default), with IncrementalAlterConfigs: only those keys
//! are SET, every other config of the target topic stays as it is.
//!
//! The rule for a listed key the source does not set explicitly (never did, or no longer
//! does): the target is left as it is. MirrorMaker 2 (`MirrorSourceConnector`, with
//! `use.incremental.alter.configs`) DELETEs such a key on the target, reverting it to the
//! *target's* default; here a target topic made by `--create.topics` holds the source's
//! effective values (defaults included) on purpose, and a target topic made by hand may hold
//! values an operator chose: deleting them on the first round would change topics nobody
//! changed on the source. So the sync only ever sets, never deletes; a key the source stopped
//! setting explicitly while the mirror ran, and whose target value differs, is warned about
//! once (the operator deletes it on the target if it should follow), and `check` lists it.
//!
//! A change that would make the target refuse what the source holds (a lower
//! `max.message.bytes`, compaction turned on) is not taken, said once ([`guard`]); the keys a
//! copy never takes at all are refused in the list at start
//! (`settings::NEVER_COPIED_TOPIC_CONFIGS`).
//!
//! One thread ([`run`]) runs the rounds, off the data path: a refusal (policy, authorization,
//! an invalid value) is warned once per topic and key, counted
//! (`mirror_config_sync_failures_total{topic,key}`), and mirroring goes on; a cluster that
//! does not answer is tried again next round. `check` shows what a round would change
//! ([`ConfigSync::plan`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use super::clients::Cluster;
use super::state::{Control, Stats};
use super::topics::transient_code;
use crate::native::admin::set_topic_configs;
use crate::settings::client::ClientProps;
use crate::settings::routing::{TopicFilter, TopicTemplate};
use crate::settings::{counted, Settings};

/// A round that could not be made at all (a cluster that does not answer, a request refused
/// as a whole): tried again next round.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error("cannot list the topics of the {cluster} cluster: {reason}")]
    Metadata {
        cluster: &'static str,
        reason: String,
    },
    #[error("cannot read topic configs from the {cluster} cluster (DescribeConfigs): {reason}")]
    Describe {
        cluster: &'static str,
        reason: String,
    },
    #[error("cannot make the admin clients for the topic-config sync: {0}")]
    Client(String),
}

/// One config of a topic as DescribeConfigs said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) value: Option<String>,
    /// Set on the topic itself (a dynamic topic config), not inherited from a broker's
    /// configuration or Kafka's default.
    pub(crate) explicit: bool,
}

/// A listed key whose target value differs from the value the source topic sets explicitly:
/// the round sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) key: String,
    pub(crate) source: String,
    pub(crate) target: Option<String>,
}

/// A listed key the source does not set explicitly whose target value differs: left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) key: String,
    pub(crate) source: Option<String>,
    pub(crate) target: Option<String>,
}

/// A change the source asks for that the copy must not take: it would make the target refuse
/// records the source holds or may still send. Not set; said once, and by `check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guarded {
    pub(crate) change: Change,
    /// Why, and what to do instead.
    pub(crate) why: String,
}

/// What a round would do to one mirrored topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TopicPlan {
    pub(crate) source_topic: String,
    pub(crate) target_topic: String,
    pub(crate) changes: Vec<Change>,
    pub(crate) kept: Vec<Kept>,
    pub(crate) guarded: Vec<Guarded>,
}

/// A topic whose configs a cluster would not describe (authorization, mostly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) cluster: Cluster,
    pub(crate) topic: String,
    pub(crate) code: RDKafkaErrorCode,
}

impl Refusal {
    /// The line users read: the operation, the topic, the principal and the way out.
    pub(crate) fn describe(&self) -> String {
        let (config, cluster) = match self.cluster {
            Cluster::Source => ("consumer", "source"),
            Cluster::Target => ("producer", "target"),
        };
        if is_authorization(self.code) {
            format!(
                "topic-config sync: the {cluster} cluster does not allow the mirror's principal \
                 (the {config} config's credentials) to DESCRIBE_CONFIGS topic {topic} \
                 ({code}): grant it DescribeConfigs (kafka-acls --add --allow-principal \
                 User:NAME --operation DescribeConfigs --topic {topic}), or run with \
                 --sync.topic.configs false",
                topic = self.topic,
                code = self.code
            )
        } else {
            format!(
                "topic-config sync: the {cluster} cluster did not describe the configs of \
                 topic {} ({})",
                self.topic, self.code
            )
        }
    }
}

/// What a round found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Every mirrored topic both clusters described, by source topic name.
    pub(crate) topics: Vec<TopicPlan>,
    pub(crate) refused: Vec<Refusal>,
}

fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
    )
}

/// Why the copy must not take `change`, if it must not: a change that would make the target
/// refuse what the source holds. `max.message.bytes` only grows on the target (a lower limit
/// refuses the batches already in the source's log, up to the old one); `cleanup.policy`
/// never turns compaction on (a compacted topic refuses records without a key, which the
/// source's log may hold from before its own change). Every other listed key follows the
/// source; the keys a copy never takes at all are refused in `--create.topics.configs`
/// (`settings::NEVER_COPIED_TOPIC_CONFIGS`).
pub(crate) fn guard(change: &Change) -> Option<String> {
    let target = change.target.as_deref();
    match change.key.as_str() {
        "max.message.bytes" => {
            let (Ok(source), Some(Ok(target))) = (
                change.source.trim().parse::<i64>(),
                target.map(|t| t.trim().parse::<i64>()),
            ) else {
                return None;
            };
            (source < target).then(|| {
                format!(
                    "it would lower the target's limit from {target} to {source} bytes, and \
                     the target would refuse the batches between the two that the source's log \
                     holds or may still send; lower it on the target by hand once the source's \
                     log holds no such batch"
                )
            })
        }
        "cleanup.policy" => {
            let compacts = |v: &str| v.split(',').any(|p| p.trim() == "compact");
            (compacts(&change.source) && !target.is_some_and(compacts)).then(|| {
                "it would make the target topic compacted, and Kafka refuses records without \
                 a key on a compacted topic, which the source's log may hold from before its \
                 change; set it on the target by hand once the source's log holds only keyed \
                 records"
                    .to_owned()
            })
        }
        _ => None,
    }
}

/// For each of `keys`: a change where the source sets the key explicitly and the target's
/// value (explicit or not) differs, guarded where the copy must not take it ([`guard`]); a
/// kept key where the source does not and the target's value differs from the source's.
/// Sensitive keys are never described with a value and never synced. Keys neither cluster
/// names are skipped.
pub(crate) fn diff(
    keys: &[String],
    source: &HashMap<String, Described>,
    target: &HashMap<String, Described>,
) -> (Vec<Change>, Vec<Kept>, Vec<Guarded>) {
    let (mut changes, mut kept) = (Vec::new(), Vec::new());
    for key in keys {
        let Some(s) = source.get(key) else { continue };
        let t = target.get(key).and_then(|t| t.value.clone());
        match &s.value {
            Some(v) if s.explicit => changes.extend((t.as_ref() != Some(v)).then(|| Change {
                key: key.clone(),
                source: v.clone(),
                target: t,
            })),
            other if t != *other => kept.push(Kept {
                key: key.clone(),
                source: other.clone(),
                target: t,
            }),
            _ => {}
        }
    }
    let (changes, guarded): (Vec<Change>, Vec<Change>) =
        changes.into_iter().partition(|c| guard(c).is_none());
    let guarded = guarded
        .into_iter()
        .map(|change| Guarded {
            why: guard(&change).unwrap_or_default(),
            change,
        })
        .collect();
    (changes, kept, guarded)
}

/// The listed configs of each topic a cluster described.
type ByTopic = HashMap<String, HashMap<String, Described>>;

/// Keeps the listed topic configs of mirrored topics in step with the source.
pub(crate) struct ConfigSync {
    source: AdminClient<DefaultClientContext>,
    target: AdminClient<DefaultClientContext>,
    runtime: tokio::runtime::Runtime,
    keys: Vec<String>,
    filter: TopicFilter,
    template: TopicTemplate,
    /// The offset-mapping topic: never a mirrored topic's target.
    store: Option<String>,
    timeout: Duration,
    /// What has been warned about (a refusal per topic and key; a key the source stopped
    /// setting): once each.
    warned: HashSet<String>,
    /// (source topic, key) the source was seen to set explicitly during this run.
    explicit_seen: HashSet<(String, String)>,
}

impl std::fmt::Debug for ConfigSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSync")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The keys of `--create.topics.configs`, as the list names them.
pub fn listed_keys(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl ConfigSync {
    /// The admin clients for `keys`; `timeout` bounds each request.
    pub(crate) fn new(
        settings: &Settings,
        keys: Vec<String>,
        timeout: Duration,
    ) -> Result<ConfigSync, SyncError> {
        // As in topics.rs: a metadata request must never auto-create a topic.
        let admin = |props: &ClientProps| {
            props
                .connection_config()
                .set("allow.auto.create.topics", "false")
                .create::<AdminClient<DefaultClientContext>>()
                .map_err(|e| SyncError::Client(format!("{}: {e}", props.path.display())))
        };
        Ok(ConfigSync {
            source: admin(&settings.consumer)?,
            target: admin(&settings.producer)?,
            runtime: crate::native::runtime().map_err(|e| SyncError::Client(e.to_string()))?,
            keys,
            filter: settings.topics.clone(),
            template: settings.target_topic.clone(),
            store: settings.offset_mapping.clone(),
            timeout,
            warned: HashSet::new(),
            explicit_seen: HashSet::new(),
        })
    }

    fn admin(&self, cluster: Cluster) -> &AdminClient<DefaultClientContext> {
        match cluster {
            Cluster::Source => &self.source,
            Cluster::Target => &self.target,
        }
    }

    /// The mirrored topics: (source, target) for each source topic the whitelist matches
    /// whose target topic exists.
    fn mirrored(&self) -> Result<Vec<(String, String)>, SyncError> {
        let metadata = |cluster: Cluster| {
            self.admin(cluster)
                .inner()
                .fetch_metadata(None, self.timeout)
                .map_err(|e| SyncError::Metadata {
                    cluster: cluster.name(),
                    reason: e.to_string(),
                })
        };
        let source = metadata(Cluster::Source)?;
        let target = metadata(Cluster::Target)?;
        let existing: HashSet<&str> = target
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| t.name())
            .collect();
        Ok(self
            .filter
            .select(&source)
            .into_iter()
            .map(|(topic, _)| {
                let target_topic = self.template.render(&topic);
                (topic, target_topic)
            })
            .filter(|(_, t)| existing.contains(t.as_str()) && self.store.as_ref() != Some(t))
            .collect())
    }

    /// The listed configs of `topics` on `cluster`, by topic; the topics it refused apart.
    fn describe(
        &self,
        cluster: Cluster,
        topics: &[&str],
    ) -> Result<(ByTopic, Vec<Refusal>), SyncError> {
        let (mut described, mut refused) = (HashMap::new(), Vec::new());
        if topics.is_empty() {
            return Ok((described, refused));
        }
        let specifiers: Vec<ResourceSpecifier<'_>> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let results = self
            .runtime
            .block_on(self.admin(cluster).describe_configs(&specifiers, &opts))
            .map_err(|e| SyncError::Describe {
                cluster: cluster.name(),
                reason: e.to_string(),
            })?;
        // librdkafka answers in the order of the request.
        for (topic, result) in topics.iter().zip(results) {
            match result {
                Ok(resource) => {
                    let configs = resource
                        .entries
                        .into_iter()
                        .filter(|e| !e.is_sensitive && self.keys.contains(&e.name))
                        .map(|e| {
                            let explicit = e.source == ConfigSource::DynamicTopic;
                            (
                                e.name,
                                Described {
                                    value: e.value,
                                    explicit,
                                },
                            )
                        })
                        .collect();
                    described.insert((*topic).to_owned(), configs);
                }
                Err(code) => refused.push(Refusal {
                    cluster,
                    topic: (*topic).to_owned(),
                    code,
                }),
            }
        }
        Ok((described, refused))
    }

    /// What a round would change: both clusters asked, nothing altered.
    pub(crate) fn plan(&self) -> Result<Plan, SyncError> {
        let mirrored = self.mirrored()?;
        let sources: Vec<&str> = mirrored.iter().map(|(s, _)| s.as_str()).collect();
        let targets: Vec<&str> = mirrored.iter().map(|(_, t)| t.as_str()).collect();
        let (source, mut refused) = self.describe(Cluster::Source, &sources)?;
        let (target, target_refused) = self.describe(Cluster::Target, &targets)?;
        refused.extend(target_refused);
        let mut topics = Vec::new();
        for (source_topic, target_topic) in mirrored {
            let (Some(s), Some(t)) = (source.get(&source_topic), target.get(&target_topic)) else {
                continue;
            };
            let (changes, kept, guarded) = diff(&self.keys, s, t);
            topics.push(TopicPlan {
                source_topic,
                target_topic,
                changes,
                kept,
                guarded,
            });
        }
        Ok(Plan { topics, refused })
    }

    fn warn_once(&mut self, key: String, line: impl FnOnce() -> String) {
        if self.warned.insert(key) {
            tracing::warn!("{}", line());
        }
    }

    /// One round: plan, then set what differs. Returns how many configs were set.
    pub(crate) fn round(&mut self, stats: &Stats) -> Result<usize, SyncError> {
        let plan = self.plan()?;
        for refusal in &plan.refused {
            let line = refusal.describe();
            self.warn_once(
                format!("describe {:?} {}", refusal.cluster, refusal.topic),
                || line,
            );
        }
        for topic in &plan.topics {
            for change in &topic.changes {
                self.explicit_seen
                    .insert((topic.source_topic.clone(), change.key.clone()));
            }
            for guarded in &topic.guarded {
                let line = guarded_line(topic, guarded);
                let change = &guarded.change;
                self.warn_once(
                    format!(
                        "guarded {} {}={}",
                        topic.target_topic, change.key, change.source
                    ),
                    || line,
                );
            }
            for kept in &topic.kept {
                let seen = (topic.source_topic.clone(), kept.key.clone());
                if !self.explicit_seen.contains(&seen) {
                    continue;
                }
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "unset".to_owned());
                let (source_value, target_value) = (show(&kept.source), show(&kept.target));
                self.warn_once(format!("kept {} {}", topic.target_topic, kept.key), || {
                    format!(
                        "topic-config sync: source topic {} no longer sets {} (its value is \
                             now {source_value}, inherited); target topic {} keeps \
                             {target_value}: the sync never deletes a target config. Delete it \
                             on the target if it should follow (kafka-configs --alter \
                             --entity-type topics --entity-name {} --delete-config {})",
                        topic.source_topic,
                        kept.key,
                        topic.target_topic,
                        topic.target_topic,
                        kept.key
                    )
                });
            }
        }
        let wanted: Vec<&TopicPlan> = plan
            .topics
            .iter()
            .filter(|t| !t.changes.is_empty())
            .collect();
        if wanted.is_empty() {
            return Ok(0);
        }
        let request: Vec<(String, Vec<(String, String)>)> = wanted
            .iter()
            .map(|t| {
                let configs = t
                    .changes
                    .iter()
                    .map(|c| (c.key.clone(), c.source.clone()))
                    .collect();
                (t.target_topic.clone(), configs)
            })
            .collect();
        let answers =
            set_topic_configs(self.target.inner(), &request, self.timeout).map_err(|e| {
                SyncError::Describe {
                    cluster: "target",
                    reason: format!("IncrementalAlterConfigs: {e}"),
                }
            })?;
        let answers: HashMap<String, Option<(RDKafkaErrorCode, String)>> =
            answers.into_iter().collect();
        let mut set = 0;
        for topic in wanted {
            match answers.get(&topic.target_topic) {
                Some(None) => {
                    set += topic.changes.len();
                    self.applied(topic, &topic.changes);
                }
                Some(Some((code, reason))) => {
                    set += self.refused(stats, topic, *code, reason);
                }
                None => tracing::warn!(
                    "topic-config sync: the target cluster did not answer for topic {}; trying \
                     again next round",
                    topic.target_topic
                ),
            }
        }
        Stats::add(&stats.topic_configs_synced, set as u64);
        Ok(set)
    }

    fn applied(&self, topic: &TopicPlan, changes: &[Change]) {
        let shown: Vec<String> = changes
            .iter()
            .map(|c| {
                format!(
                    "{} {} -> {}",
                    c.key,
                    c.target.as_deref().unwrap_or("unset"),
                    c.source
                )
            })
            .collect();
        tracing::info!(
            "topic-config sync: target topic {}: {} (as source topic {} sets them)",
            topic.target_topic,
            shown.join(", "),
            topic.source_topic
        );
    }

    /// A topic whose SETs the target refused as a whole: authorization is the topic's; for
    /// anything else each key is tried alone, to name the keys at fault and apply the others.
    /// Returns how many configs were set after all.
    fn refused(
        &mut self,
        stats: &Stats,
        topic: &TopicPlan,
        code: RDKafkaErrorCode,
        reason: &str,
    ) -> usize {
        let count = |key: &str| {
            stats
                .recorded
                .config_sync_failures
                .get_or_create(&vec![
                    ("topic".to_owned(), topic.target_topic.clone()),
                    ("key".to_owned(), key.to_owned()),
                ])
                .inc();
        };
        if transient_code(Some(code)) {
            tracing::warn!(
                "topic-config sync: target topic {}: {reason} ({code}); trying again next round",
                topic.target_topic
            );
            return 0;
        }
        if is_authorization(code) {
            topic.changes.iter().for_each(|c| count(&c.key));
            let keys: Vec<&str> = topic.changes.iter().map(|c| c.key.as_str()).collect();
            self.warn_once(format!("alter {}", topic.target_topic), || {
                format!(
                    "topic-config sync: the target cluster does not allow the mirror's principal \
                     (the producer config's credentials) to ALTER_CONFIGS topic {t} ({reason}): \
                     {keys} not kept in step with source topic {s}. Grant it AlterConfigs \
                     (kafka-acls --add --allow-principal User:NAME --operation AlterConfigs \
                     --topic {t}), or run with --sync.topic.configs false",
                    t = topic.target_topic,
                    s = topic.source_topic,
                    keys = keys.join(", "),
                )
            });
            return 0;
        }
        let alone: Vec<Vec<Change>> = if topic.changes.len() == 1 {
            vec![topic.changes.clone()]
        } else {
            topic.changes.iter().map(|c| vec![c.clone()]).collect()
        };
        let mut set = 0;
        for changes in alone {
            let change = &changes[0];
            let answer = if topic.changes.len() == 1 {
                Some((code, reason.to_owned()))
            } else {
                let request = vec![(
                    topic.target_topic.clone(),
                    vec![(change.key.clone(), change.source.clone())],
                )];
                match set_topic_configs(self.target.inner(), &request, self.timeout) {
                    Ok(answers) => answers.into_iter().next().and_then(|(_, e)| e),
                    Err(e) => Some((e.code.unwrap_or(code), e.reason)),
                }
            };
            match answer {
                None => {
                    set += 1;
                    self.applied(topic, &changes);
                }
                Some((code, reason)) => {
                    count(&change.key);
                    self.warn_once(
                        format!("set {} {} {code:?}", topic.target_topic, change.key),
                        || {
                            format!(
                                "topic-config sync: target topic {} refused {}={} (as source \
                                 topic {} sets it): {reason} ({code}); mirroring goes on, the \
                                 key is tried again every round (remove it from \
                                 --create.topics.configs, or change the target's policy)",
                                topic.target_topic, change.key, change.source, topic.source_topic
                            )
                        },
                    );
                }
            }
        }
        set
    }
}

/// The sync's thread: a round at start, then one every `interval`, until the mirror stops.
/// Never fatal: a round that fails is warned about and made again next interval.
pub(crate) fn run(settings: Settings, control: Arc<Control>, stats: Arc<Stats>) {
    let Some(wanted) = settings.sync_topic_configs.clone() else {
        return;
    };
    let (keys, interval) = (wanted.keys, wanted.interval);
    if keys.is_empty() {
        return;
    }
    let mut sync = match ConfigSync::new(&settings, keys, settings.options.startup_timeout) {
        Ok(sync) => sync,
        Err(e) => {
            tracing::warn!("{e}; topic configs are not kept in step");
            return;
        }
    };
    tracing::info!(
        "topic-config sync: every {:?}, {} of mirrored topics ({})",
        interval,
        counted(sync.keys.len(), "listed config"),
        sync.keys.join(", ")
    );
    let mut next = Instant::now();
    let mut failing = false;
    while !control.stop_requested() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        match sync.round(&stats) {
            Ok(_) => failing = false,
            // Once per outage, not every round of it.
            Err(e) if !failing => {
                failing = true;
                tracing::warn!("topic-config sync: {e}; trying again every {interval:?}");
            }
            Err(e) => tracing::debug!("topic-config sync: {e}"),
        }
        next = Instant::now() + interval;
    }
}

/// For `check`: per mirrored topic, what a round would change and what it leaves, as lines.
pub(crate) fn preview(settings: &Settings, timeout: Duration) -> Result<Plan, SyncError> {
    let keys = settings
        .sync_topic_configs
        .as_ref()
        .map(|s| s.keys.clone())
        .unwrap_or_default();
    ConfigSync::new(settings, keys, timeout)?.plan()
}

/// The line for a change the copy does not take.
fn guarded_line(topic: &TopicPlan, guarded: &Guarded) -> String {
    let change = &guarded.change;
    format!(
        "topic-config sync: source topic {} sets {}={}; target topic {} keeps {}: {}",
        topic.source_topic,
        change.key,
        change.source,
        topic.target_topic,
        change.target.as_deref().unwrap_or("unset"),
        guarded.why
    )
}

/// `check`'s lines for a plan: one per key that would change, is left different, or is not
/// taken.
pub(crate) fn plan_lines(plan: &Plan) -> Vec<String> {
    let mut lines = Vec::new();
    let mut by_topic: BTreeMap<&str, &TopicPlan> = BTreeMap::new();
    for t in &plan.topics {
        by_topic.insert(&t.source_topic, t);
    }
    let unset = |v: &Option<String>| v.clone().unwrap_or_else(|| "unset".to_owned());
    for t in by_topic.values() {
        for c in &t.changes {
            lines.push(format!(
                "topic-config sync: {} -> {}: {} will be set: source {}, target {}",
                t.source_topic,
                t.target_topic,
                c.key,
                c.source,
                unset(&c.target)
            ));
        }
        for g in &t.guarded {
            lines.push(format!("{} (not set)", guarded_line(t, g)));
        }
        for k in &t.kept {
            lines.push(format!(
                "topic-config sync: {} -> {}: {} left as it is (the source does not set it \
                 explicitly): source {}, target {}",
                t.source_topic,
                t.target_topic,
                k.key,
                unset(&k.source),
                unset(&k.target)
            ));
        }
    }
    if lines.is_empty() && !plan.topics.is_empty() {
        lines.push(format!(
            "topic-config sync: {} in step",
            counted(plan.topics.len(), "mirrored topic")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(entries: &[(&str, Option<&str>, bool)]) -> HashMap<String, Described> {
        entries
            .iter()
            .map(|(k, v, explicit)| {
                (
                    (*k).to_owned(),
                    Described {
                        value: v.map(str::to_owned),
                        explicit: *explicit,
                    },
                )
            })
            .collect()
    }

    fn keys(list: &str) -> Vec<String> {
        listed_keys(list)
    }

    #[test]
    fn a_value_the_source_sets_explicitly_is_set_where_the_target_differs() {
        let source = configs(&[
            ("retention.ms", Some("3600000"), true),
            ("cleanup.policy", Some("delete"), true),
            ("max.message.bytes", Some("1048588"), true),
        ]);
        let target = configs(&[
            ("retention.ms", Some("604800000"), true),
            ("cleanup.policy", Some("compact"), false),
            ("max.message.bytes", Some("1048588"), false),
        ]);
        let (changes, kept, _) = diff(
            &keys("retention.ms,cleanup.policy,max.message.bytes"),
            &source,
            &target,
        );
        assert_eq!(
            changes,
            vec![
                Change {
                    key: "retention.ms".into(),
                    source: "3600000".into(),
                    target: Some("604800000".into())
                },
                Change {
                    key: "cleanup.policy".into(),
                    source: "delete".into(),
                    target: Some("compact".into())
                },
            ]
        );
        assert!(kept.is_empty());
    }

    #[test]
    fn a_key_the_source_does_not_set_explicitly_is_never_changed() {
        // A broker default on the source, a value set by hand (or at creation) on the target.
        let source = configs(&[("retention.ms", Some("604800000"), false)]);
        let target = configs(&[("retention.ms", Some("86400000"), true)]);
        let (changes, kept, _) = diff(&keys("retention.ms"), &source, &target);
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(
            kept,
            vec![Kept {
                key: "retention.ms".into(),
                source: Some("604800000".into()),
                target: Some("86400000".into())
            }]
        );
    }

    #[test]
    fn keys_outside_the_list_are_never_touched() {
        let source = configs(&[("segment.bytes", Some("1000"), true)]);
        let target = configs(&[("segment.bytes", Some("2000"), true)]);
        let (changes, kept, _) = diff(&keys("retention.ms"), &source, &target);
        assert!(changes.is_empty() && kept.is_empty());
    }

    #[test]
    fn a_target_missing_the_key_gets_it() {
        let source = configs(&[("retention.ms", Some("1"), true)]);
        let (changes, _, _) = diff(&keys("retention.ms"), &source, &HashMap::new());
        assert_eq!(changes[0].target, None);
    }

    #[test]
    fn a_change_that_would_make_the_target_refuse_what_the_source_holds_is_not_taken() {
        let keys = keys("max.message.bytes,cleanup.policy,retention.ms");
        let source = configs(&[
            ("max.message.bytes", Some("1048588"), true),
            ("cleanup.policy", Some("compact"), true),
            ("retention.ms", Some("60000"), true),
        ]);
        let target = configs(&[
            ("max.message.bytes", Some("8388608"), true),
            ("cleanup.policy", Some("delete"), false),
            ("retention.ms", Some("604800000"), false),
        ]);
        let (changes, _, guarded) = diff(&keys, &source, &target);
        assert_eq!(
            changes.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
            ["retention.ms"]
        );
        let why: Vec<(&str, &str)> = guarded
            .iter()
            .map(|g| (g.change.key.as_str(), g.why.as_str()))
            .collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].0 == "max.message.bytes" && why[0].1.contains("from 8388608 to 1048588"));
        assert!(why[1].0 == "cleanup.policy" && why[1].1.contains("without a key"));
        // The safe directions follow the source: a higher limit, compaction turned off, or
        // compaction kept where the target compacts already.
        let source = configs(&[
            ("max.message.bytes", Some("16777216"), true),
            ("cleanup.policy", Some("compact,delete"), true),
        ]);
        let target = configs(&[
            ("max.message.bytes", Some("8388608"), true),
            ("cleanup.policy", Some("compact"), true),
        ]);
        let (changes, _, guarded) = diff(&keys, &source, &target);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(guarded.is_empty(), "{guarded:?}");
        let source = configs(&[("cleanup.policy", Some("delete"), true)]);
        let target = configs(&[("cleanup.policy", Some("compact"), true)]);
        assert_eq!(diff(&keys, &source, &target).0.len(), 1);
    }

    #[test]
    fn a_describe_refusal_names_the_operation_the_topic_and_the_principal() {
        let line = Refusal {
            cluster: Cluster::Target,
            topic: "orders".into(),
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        }
        .describe();
        for needle in [
            "DESCRIBE_CONFIGS",
            "orders",
            "producer config",
            "--sync.topic.configs false",
        ] {
            assert!(line.contains(needle), "{needle} not in {line}");
        }
    }
}
