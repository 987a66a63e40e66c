//! `mirror-maker translate`: a source group's committed offsets as target offsets, through
//! the offset mapping the mirror stores; with `--apply`, committed to the same group on the
//! target (a manual failover).

use std::time::Duration;

use serde::Serialize;

use crate::mirror::mapping::groups::{self, Applied, Clusters, GroupError, PartitionResult};
use crate::mirror::mapping::{store, Trust};
use crate::settings::client::ClientProps;
use crate::settings::flags::TranslateArgs;
use crate::settings::routing::{TopicFilter, TopicTemplate};
use crate::settings::{defaults, load_client_files, SettingsError};

/// What `translate` found (and did).
#[derive(Debug, Serialize)]
pub struct Report {
    pub group: String,
    pub mapping_topic: String,
    pub partitions: Vec<PartitionResult>,
    /// With `--apply`: what was committed on the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied: Option<Applied>,
    /// With `--apply`: why nothing was committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Records of the store not taken (undecodable, or not what this mirror writes), by
    /// reason.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rejected: std::collections::BTreeMap<&'static str, u64>,
}

impl Report {
    /// Every partition exact, and applied if asked.
    pub fn ok(&self) -> bool {
        !self.partitions.is_empty()
            && self.partitions.iter().all(PartitionResult::is_exact)
            && self.refused.is_none()
            && self.applied.as_ref().is_none_or(|a| a.refused.is_empty())
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "group {} through offset mapping {}:\n",
            self.group, self.mapping_topic
        );
        if self.partitions.is_empty() {
            out.push_str("  no committed offset of this group on a partition the mirror copied\n");
        }
        for r in &self.partitions {
            let line = match (&r.target_topic, r.target_partition, r.target_offset) {
                (Some(t), Some(p), Some(o)) => format!("-> {t}/{p} offset {o}  exact"),
                _ => format!("{}: {}", r.status, r.reason.as_deref().unwrap_or("")),
            };
            out.push_str(&format!(
                "  {}/{} offset {}  {line}\n",
                r.topic, r.partition, r.source_offset
            ));
        }
        if let Some(a) = &self.applied {
            out.push_str(&format!(
                "applied: {} committed on the target, {} left (already there or further)\n",
                crate::settings::counted(a.committed, "offset"),
                a.kept
            ));
        }
        for r in self.applied.iter().flat_map(|a| &a.refused) {
            out.push_str(&format!(
                "not committed: {}/{} offset {}: {}\n",
                r.topic, r.partition, r.offset, r.reason
            ));
        }
        if !self.rejected.is_empty() {
            let reasons: Vec<String> = self
                .rejected
                .iter()
                .map(|(why, n)| format!("{why} {n}"))
                .collect();
            out.push_str(&format!(
                "skipped store records (not what this mirror writes): {}\n",
                reasons.join(", ")
            ));
        }
        if let Some(why) = &self.refused {
            out.push_str(&format!("not applied: {why}\n"));
        }
        out
    }
}

/// The settings `translate` needs: both clients' files and the mapping topic.
pub struct Translate {
    source: ClientProps,
    target: ClientProps,
    topic: String,
    group: String,
    apply: bool,
    timeout: Duration,
    trust: Trust,
}

impl Translate {
    pub fn from_args(args: &TranslateArgs) -> Result<Translate, SettingsError> {
        let m = &args.mirror;
        let (source, target) = load_client_files(m)?;
        if !m.offset_mapping {
            return Err(SettingsError::Usage(
                "translate reads the offset mapping: --offset.mapping false leaves nothing to \
                 read"
                    .to_owned(),
            ));
        }
        if args.group.trim().is_empty() {
            return Err(SettingsError::Usage("--group must name a group".to_owned()));
        }
        // What the mirror's own flags say it writes: records of the store that are not are
        // skipped (the whitelist only when given; a message handler may rename).
        let trust = Trust::new(
            m.whitelist.as_deref().map(TopicFilter::new).transpose()?,
            TopicTemplate::parse(&m.target_topic).map_err(SettingsError::Usage)?,
            m.message_handler.is_some(),
            source.get("group.id"),
        );
        Ok(Translate {
            source,
            target,
            topic: m.offset_mapping_topic.clone().unwrap_or_else(|| {
                defaults::offset_mapping_topic(m.source_cluster_name.as_deref())
            }),
            group: args.group.clone(),
            apply: args.apply,
            timeout: Duration::from_millis(args.timeout_ms),
            trust,
        })
    }

    pub fn run(&self) -> Result<Report, GroupError> {
        let clusters = Clusters {
            source: &self.source,
            target: &self.target,
        };
        let map = store::load(&self.target, &self.topic, self.trust.clone(), self.timeout)?;
        let all = groups::source_partitions(clusters, self.timeout)?;
        let partitions = groups::translate_group(clusters, &map, &self.group, &all, self.timeout)?;
        let mut report = Report {
            group: self.group.clone(),
            mapping_topic: self.topic.clone(),
            partitions,
            applied: None,
            refused: None,
            rejected: map
                .rejected()
                .iter()
                .map(|(why, n)| (why.label(), *n))
                .collect(),
        };
        if self.apply {
            match groups::apply(clusters, &self.group, &report.partitions, self.timeout) {
                Ok(applied) => report.applied = Some(applied),
                Err(e @ GroupError::Active { .. }) => report.refused = Some(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }
}
