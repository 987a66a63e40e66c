//! Consumer groups across the two clusters: a source group's committed offsets translated
//! through the offset mapping, and committed to the same group on the target (`translate
//! --apply`, and `--sync.group.offsets` while the mirror runs).
//!
//! A target group is written only while it has no active member there (its applications
//! have not moved yet), and never backwards (an application that already moved and committed
//! further keeps its place).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::clients::QuietContext;
use super::mapping::{OffsetMap, Translation};
use super::state::{Control, SyncStats};
use super::store;
use crate::settings::client::ClientProps;
use crate::settings::Settings;

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error(
        "cannot read the committed offsets of group {group} on the {cluster} cluster: {source}"
    )]
    Committed {
        group: String,
        cluster: &'static str,
        source: KafkaError,
    },
    #[error("cannot list the topics of the {cluster} cluster: {source}")]
    Topics {
        cluster: &'static str,
        source: KafkaError,
    },
    #[error("cannot list the consumer groups of the {cluster} cluster: {source}")]
    List {
        cluster: &'static str,
        source: KafkaError,
    },
    #[error(
        "group {group} has {members} on the target cluster: its applications run there \
         already, and their commits are theirs. Stop them first (or leave the group alone)"
    )]
    Active { group: String, members: String },
    #[error("cannot commit offsets of group {group} on the target cluster: {source}")]
    Commit { group: String, source: KafkaError },
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// The two clusters' client properties (their connection keys are used).
#[derive(Debug, Clone, Copy)]
pub struct Clusters<'a> {
    pub source: &'a ClientProps,
    pub target: &'a ClientProps,
}

impl<'a> Clusters<'a> {
    pub fn of(settings: &'a Settings) -> Clusters<'a> {
        Clusters {
            source: &settings.consumer,
            target: &settings.producer,
        }
    }
}

/// One source partition of a group, translated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionResult {
    pub topic: String,
    pub partition: i32,
    pub source_offset: i64,
    /// `exact`, `waiting`, `untranslatable` or `unknown`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_topic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Waiting: how many records the mirror has still to copy before the group's offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind: Option<i64>,
}

impl PartitionResult {
    pub fn is_exact(&self) -> bool {
        self.status == "exact"
    }
}

/// A client of one cluster that reads and commits a group's offsets without joining it.
fn group_client(
    props: &ClientProps,
    group: &str,
) -> Result<BaseConsumer<QuietContext>, KafkaError> {
    props
        .connection_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create_with_context(QuietContext)
}

/// The committed offsets of `group` on `partitions` (those it has one for).
fn committed(
    props: &ClientProps,
    cluster: &'static str,
    group: &str,
    partitions: &[(String, i32)],
    timeout: Duration,
) -> Result<HashMap<(String, i32), i64>, GroupError> {
    let error = |source| GroupError::Committed {
        group: group.to_owned(),
        cluster,
        source,
    };
    if partitions.is_empty() {
        return Ok(HashMap::new());
    }
    let client = group_client(props, group).map_err(error)?;
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition(t, *p);
    }
    let answer = client.committed_offsets(tpl, timeout).map_err(error)?;
    Ok(answer
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
            _ => None,
        })
        .collect())
}

/// Translates `group`'s committed source offsets on every partition the store knows, and on
/// `also` (those the store does not know come out `unknown`).
pub fn translate_group(
    clusters: Clusters<'_>,
    map: &OffsetMap,
    group: &str,
    also: &[(String, i32)],
    timeout: Duration,
) -> Result<Vec<PartitionResult>, GroupError> {
    let mut partitions = map.source_partitions();
    partitions.extend_from_slice(also);
    partitions.sort();
    partitions.dedup();
    let offsets = committed(clusters.source, "source", group, &partitions, timeout)?;
    let mut results = Vec::new();
    for (topic, partition) in &partitions {
        let Some(&offset) = offsets.get(&(topic.clone(), *partition)) else {
            continue;
        };
        for t in map.translate(topic, *partition, offset) {
            let mut r = PartitionResult {
                topic: topic.clone(),
                partition: *partition,
                source_offset: offset,
                status: "exact",
                target_topic: None,
                target_partition: None,
                target_offset: None,
                reason: None,
                behind: None,
            };
            match t {
                Translation::Exact {
                    topic,
                    partition,
                    offset,
                } => {
                    r.target_topic = Some(topic);
                    r.target_partition = Some(partition);
                    r.target_offset = Some(offset);
                }
                Translation::Waiting { copied_through } => {
                    r.status = "waiting";
                    r.behind = Some(offset - copied_through);
                    r.reason = Some(format!(
                        "the mirror has copied up to source offset {copied_through}; the group \
                         is at {offset}"
                    ));
                }
                Translation::Untranslatable { reason } => {
                    r.status = "untranslatable";
                    r.reason = Some(reason);
                }
                Translation::Unknown => {
                    r.status = "unknown";
                    r.reason = Some("the offset mapping knows nothing of this partition".into());
                }
            }
            results.push(r);
        }
    }
    Ok(results)
}

/// The consumer groups of a cluster (only `group`, if given), with their members.
fn groups_of(
    props: &ClientProps,
    cluster: &'static str,
    group: Option<&str>,
    timeout: Duration,
) -> Result<rdkafka::groups::GroupList, GroupError> {
    let error = |source| GroupError::List { cluster, source };
    let client: BaseConsumer<QuietContext> = props
        .connection_config()
        .create_with_context(QuietContext)
        .map_err(error)?;
    client.fetch_group_list(group, timeout).map_err(error)
}

/// Every partition of the source cluster's topics (Kafka's internal ones aside): where a
/// group may have offsets the mirror does not copy.
pub fn source_partitions(
    clusters: Clusters<'_>,
    timeout: Duration,
) -> Result<Vec<(String, i32)>, GroupError> {
    let error = |source| GroupError::Topics {
        cluster: "source",
        source,
    };
    let client: BaseConsumer<QuietContext> = clusters
        .source
        .connection_config()
        .create_with_context(QuietContext)
        .map_err(error)?;
    let metadata = client.fetch_metadata(None, timeout).map_err(error)?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.name().starts_with("__"))
        .flat_map(|t| t.partitions().iter().map(|p| (t.name().to_owned(), p.id())))
        .collect())
}

/// Active members of `group` on the target cluster.
fn target_members(
    clusters: Clusters<'_>,
    group: &str,
    timeout: Duration,
) -> Result<usize, GroupError> {
    let list = groups_of(clusters.target, "target", Some(group), timeout)?;
    Ok(list
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .map(|g| g.members().len())
        .sum())
}

/// What [`apply`] did with each exact translation.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Committed on the target (moved forward, or set where the group had none).
    pub committed: usize,
    /// Left as they were: the target group is already there or further.
    pub kept: usize,
}

/// Commits the exact translations of `results` to `group` on the target: refused while the
/// group has active members there; never moves an offset backwards.
pub fn apply(
    clusters: Clusters<'_>,
    group: &str,
    results: &[PartitionResult],
    timeout: Duration,
) -> Result<Applied, GroupError> {
    let members = target_members(clusters, group, timeout)?;
    if members > 0 {
        return Err(GroupError::Active {
            group: group.to_owned(),
            members: crate::settings::counted(members, "active member"),
        });
    }
    let exact: Vec<(String, i32, i64)> = results
        .iter()
        .filter_map(|r| {
            Some((
                r.target_topic.clone()?,
                r.target_partition?,
                r.target_offset?,
            ))
        })
        .collect();
    let keys: Vec<(String, i32)> = exact.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
    let current = committed(clusters.target, "target", group, &keys, timeout)?;
    let mut tpl = TopicPartitionList::new();
    let mut applied = Applied::default();
    for (t, p, offset) in &exact {
        if current.get(&(t.clone(), *p)).is_some_and(|c| c >= offset) {
            applied.kept += 1;
            continue;
        }
        tpl.add_partition_offset(t, *p, Offset::Offset(*offset))
            .map_err(|source| GroupError::Commit {
                group: group.to_owned(),
                source,
            })?;
        applied.committed += 1;
    }
    if tpl.count() > 0 {
        let error = |source| GroupError::Commit {
            group: group.to_owned(),
            source,
        };
        let client = group_client(clusters.target, group).map_err(error)?;
        client
            .commit(&tpl, CommitMode::Sync)
            .map_err(|e| match e.rdkafka_error_code() {
                // The group has members the listing did not show (a KIP-848 consumer group
                // is "Dead" with no member to the classic DescribeGroups): the broker refuses
                // a commit from outside the group.
                Some(
                    code @ (RDKafkaErrorCode::UnknownMemberId
                    | RDKafkaErrorCode::IllegalGeneration
                    | RDKafkaErrorCode::RebalanceInProgress
                    | RDKafkaErrorCode::StaleMemberEpoch
                    | RDKafkaErrorCode::FencedMemberEpoch),
                ) => GroupError::Active {
                    group: group.to_owned(),
                    members: format!(
                        "active members (it refused a commit from outside the group: {code:?})"
                    ),
                },
                _ => error(e),
            })?;
    }
    Ok(applied)
}

/// The source groups `--sync.group.offsets` selects: matching, not the mirror's own.
fn source_groups(settings: &Settings, timeout: Duration) -> Result<Vec<String>, GroupError> {
    let Some(sync) = &settings.sync_groups else {
        return Ok(Vec::new());
    };
    let own = settings.consumer.get("group.id").unwrap_or_default();
    let list = groups_of(&settings.consumer, "source", None, timeout)?;
    let mut groups: Vec<String> = list
        .groups()
        .iter()
        .map(|g| g.name().to_owned())
        .filter(|g| g != own && sync.groups.is_match(g))
        .collect();
    groups.sort();
    Ok(groups)
}

/// One round of the sync: every selected group translated and, where exact and allowed,
/// committed on the target.
pub fn sync_round(
    settings: &Settings,
    topic: &str,
    stats: &SyncStats,
    timeout: Duration,
) -> Result<(), GroupError> {
    let map = store::load(&settings.producer, topic, timeout)?;
    let (mut waiting, mut lag) = (0u64, 0u64);
    for group in source_groups(settings, timeout)? {
        let results = match translate_group(Clusters::of(settings), &map, &group, &[], timeout) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("group offset sync: {e}");
                continue;
            }
        };
        for r in results.iter().filter(|r| r.status == "waiting") {
            waiting += 1;
            lag += r.behind.unwrap_or(0).max(0) as u64;
        }
        if !results.iter().any(PartitionResult::is_exact) {
            continue;
        }
        match apply(Clusters::of(settings), &group, &results, timeout) {
            Ok(applied) if applied.committed > 0 => {
                stats.groups_synced.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    "group offset sync: committed {} of group {group} on the target ({} \
                     already there or further)",
                    crate::settings::counted(applied.committed, "offset"),
                    applied.kept
                );
            }
            Ok(_) => {}
            Err(GroupError::Active { .. }) => {
                tracing::debug!("group offset sync: {group} is active on the target; left alone");
            }
            Err(e) => tracing::warn!("group offset sync: {e}"),
        }
    }
    stats.partitions_waiting.store(waiting, Ordering::Relaxed);
    stats.translation_lag.store(lag, Ordering::Relaxed);
    Ok(())
}

/// Runs [`sync_round`] every interval until the mirror stops.
pub fn run_sync(settings: &Settings, control: &Control, stats: &SyncStats) {
    let (Some(sync), Some(topic)) = (&settings.sync_groups, &settings.offset_mapping) else {
        return;
    };
    let timeout = settings.startup_timeout;
    let mut next = Instant::now() + sync.interval;
    while !control.stop_requested() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if let Err(e) = sync_round(settings, topic, stats, timeout) {
            tracing::warn!(
                "group offset sync: {e}; trying again in {:?}",
                sync.interval
            );
        }
        next = Instant::now() + sync.interval;
    }
}
