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

use super::store;
use super::{OffsetMap, Translation, Trust};
use crate::mirror::clients::QuietContext;
use crate::mirror::state::{Control, Stats, SyncStats};
use crate::mirror::Partition;
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
pub(crate) struct Clusters<'a> {
    pub(crate) source: &'a ClientProps,
    pub(crate) target: &'a ClientProps,
}

impl<'a> Clusters<'a> {
    pub(crate) fn of(settings: &'a Settings) -> Clusters<'a> {
        Clusters {
            source: &settings.consumer,
            target: &settings.producer,
        }
    }
}

/// One source partition of a group, translated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionResult {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) source_offset: i64,
    /// `exact`, `waiting`, `untranslatable` or `unknown`.
    pub(crate) status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_topic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Waiting: how many records the mirror has still to copy before the group's offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) behind: Option<i64>,
}

impl PartitionResult {
    pub(crate) fn is_exact(&self) -> bool {
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
    partitions: &[Partition],
    timeout: Duration,
) -> Result<HashMap<Partition, i64>, GroupError> {
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
pub(crate) fn translate_group(
    clusters: Clusters<'_>,
    map: &OffsetMap,
    group: &str,
    also: &[Partition],
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
pub(crate) fn source_partitions(
    clusters: Clusters<'_>,
    timeout: Duration,
) -> Result<Vec<Partition>, GroupError> {
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
    pub(crate) committed: usize,
    /// Left as they were: the target group is already there or further.
    pub(crate) kept: usize,
    /// Not committed: the offset lies outside its target partition's watermarks (or they
    /// could not be read), so no mirror copy put it there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) refused: Vec<Refused>,
}

/// A translated offset [`apply`] did not commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Refused {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// The target partition's low and high watermarks, when they could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) watermarks: Option<(i64, i64)>,
    pub(crate) reason: String,
}

/// Whether a translated `offset` can be where a group resumes on a target partition whose
/// watermarks are `low` and `high`: from its first record held to its end. Anything else did
/// not come from the mirror's copies (a forged or stale offset-mapping record): past the end
/// it would skip every record written there up to it; below the start, records are gone.
pub(crate) fn within_watermarks(offset: i64, low: i64, high: i64) -> bool {
    low <= offset && offset <= high
}

/// Commits the exact translations of `results` to `group` on the target: refused while the
/// group has active members there; never moves an offset backwards; never commits an offset
/// outside its target partition's watermarks (skipped with a warning, listed in
/// [`Applied::refused`]).
pub(crate) fn apply(
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
    commit_translated(clusters, group, results, timeout)
}

/// [`apply`] once the group is known to have no active member on the target.
fn commit_translated(
    clusters: Clusters<'_>,
    group: &str,
    results: &[PartitionResult],
    timeout: Duration,
) -> Result<Applied, GroupError> {
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
    let mut applied = Applied::default();
    // The high watermark, not the last stable offset: a read_uncommitted client.
    let watermarks: BaseConsumer<QuietContext> = clusters
        .target
        .connection_config()
        .set("isolation.level", "read_uncommitted")
        .create_with_context(QuietContext)
        .map_err(|source| GroupError::Commit {
            group: group.to_owned(),
            source,
        })?;
    let exact: Vec<(String, i32, i64)> = exact
        .into_iter()
        .filter(|(t, p, offset)| {
            let (marks, reason) = match watermarks.fetch_watermarks(t, *p, timeout) {
                Ok((low, high)) if within_watermarks(*offset, low, high) => return true,
                Ok((low, high)) => (
                    Some((low, high)),
                    format!(
                        "outside the partition's watermarks [{low}, {high}]: no copy of the \
                         mirror's put it there (a forged or stale offset-mapping record?)"
                    ),
                ),
                Err(e) => (
                    None,
                    format!("its watermarks cannot be read to check it: {e}"),
                ),
            };
            tracing::warn!(
                "not committing offset {offset} of group {group} on target partition {t}/{p}: \
                 {reason}"
            );
            applied.refused.push(Refused {
                topic: t.clone(),
                partition: *p,
                offset: *offset,
                watermarks: marks,
                reason,
            });
            false
        })
        .collect();
    let keys: Vec<Partition> = exact.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
    let current = committed(clusters.target, "target", group, &keys, timeout)?;
    let mut tpl = TopicPartitionList::new();
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
/// committed on the target; the store's records taken as `trust` allows.
pub(crate) fn sync_round(
    settings: &Settings,
    topic: &str,
    trust: &Trust,
    stats: &SyncStats,
    timeout: Duration,
) -> Result<(), GroupError> {
    let map = store::load(&settings.producer, topic, trust.clone(), timeout)?;
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
        let applied = apply(Clusters::of(settings), &group, &results, timeout);
        if let Ok(a) = &applied {
            Stats::add(&stats.offsets_refused, a.refused.len() as u64);
        }
        match applied {
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
pub(crate) fn run_sync(settings: &Settings, control: &Control, stats: &Stats) {
    let (Some(sync), Some(topic)) = (&settings.sync_groups, &settings.offset_mapping) else {
        return;
    };
    let timeout = settings.options.startup_timeout;
    // One for every round: a record it skips is warned of once, and counted at every read.
    let trust = Trust::of(settings).counting(stats);
    let mut next = Instant::now() + sync.interval;
    while !control.stop_requested() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if let Err(e) = sync_round(settings, topic, &trust, &stats.group_sync, timeout) {
            tracing::warn!(
                "group offset sync: {e}; trying again in {:?}",
                sync.interval
            );
        }
        next = Instant::now() + sync.interval;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::mapping::{Progress, Segment, StoreRecord};
    use crate::settings::client::Role;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

    const STORE: &str = "mirror-maker.offsets.source";

    fn props(cluster: &MockCluster<'static, DefaultProducerContext>) -> ClientProps {
        ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [("bootstrap.servers", cluster.bootstrap_servers().as_str())],
        )
    }

    fn write(props: &ClientProps, topic: &str, records: &[(Vec<u8>, Vec<u8>)]) {
        let producer: BaseProducer = props.connection_config().create().expect("a producer");
        for (key, value) in records {
            producer
                .send(BaseRecord::to(topic).partition(0).key(key).payload(value))
                .expect("queued");
        }
        producer
            .flush(Duration::from_secs(10))
            .expect("acknowledged");
    }

    #[test]
    fn a_group_resumes_only_between_a_partition_s_first_record_and_its_end() {
        assert!(within_watermarks(10, 10, 20));
        assert!(within_watermarks(20, 10, 20));
        assert!(!within_watermarks(21, 10, 20));
        assert!(!within_watermarks(9, 10, 20));
        assert!(within_watermarks(0, 0, 0));
    }

    #[test]
    fn a_translated_offset_past_the_target_high_watermark_is_not_committed() {
        let (source, target) = (
            MockCluster::new(1).expect("a mock source"),
            MockCluster::new(1).expect("a mock target"),
        );
        source.create_topic("orders", 1, 1).unwrap();
        target.create_topic("orders", 1, 1).unwrap();
        target.create_topic(STORE, 1, 1).unwrap();
        let (source_props, target_props) = (props(&source), props(&target));
        // The target holds 10 records of orders/0; a forged segment claims 1,000 were copied.
        let ten: Vec<(Vec<u8>, Vec<u8>)> = (0..10).map(|i| (vec![i], vec![i])).collect();
        write(&target_props, "orders", &ten);
        let forged = StoreRecord::Segment(Segment {
            source_topic: "orders".into(),
            source_partition: 0,
            target_topic: "orders".into(),
            target_partition: 0,
            source_offset: 0,
            target_offset: 0,
            count: 1000,
            gaps: Vec::new(),
            target_gaps: Vec::new(),
            copy_start: true,
        });
        let progress = StoreRecord::Progress(Progress {
            topic: "orders".into(),
            partition: 0,
            next: 1000,
            transactional_id: None,
        });
        write(
            &target_props,
            STORE,
            &[
                (forged.key(), forged.value()),
                (progress.key(), progress.value()),
            ],
        );
        // The application's group is at 500 on the source.
        let app = group_client(&source_props, "app").unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("orders", 0, Offset::Offset(500))
            .unwrap();
        app.commit(&tpl, CommitMode::Sync).unwrap();
        let clusters = Clusters {
            source: &source_props,
            target: &target_props,
        };
        let timeout = Duration::from_secs(10);
        let map = store::load(&target_props, STORE, Trust::default(), timeout).unwrap();
        let results = translate_group(clusters, &map, "app", &[], timeout).unwrap();
        assert_eq!(results[0].target_offset, Some(500), "{results:?}");
        // (The mock cluster lists no groups: what `apply` does once the group is idle.)
        let applied = commit_translated(clusters, "app", &results, timeout).unwrap();
        assert_eq!(applied.committed, 0, "{applied:?}");
        assert_eq!(
            applied
                .refused
                .iter()
                .map(|r| (r.offset, r.watermarks))
                .collect::<Vec<_>>(),
            vec![(500, Some((0, 10)))]
        );
        let keys = [("orders".to_owned(), 0)];
        let on_target = committed(&target_props, "target", "app", &keys, timeout).unwrap();
        assert!(on_target.is_empty(), "{on_target:?}");
    }
}
