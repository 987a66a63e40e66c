//! What a record of the offset-mapping store must be for the mirror to take it: anyone who
//! can write the store topic could otherwise misdirect offsets.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::*;
use crate::mirror::state::Stats;
use crate::settings::exactly_once::transactional_id_prefix;
use crate::settings::routing::{TopicFilter, TopicTemplate};
use crate::settings::Settings;

/// Why a record of the store was not taken: the `reason` of
/// `mirror_store_records_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Rejection {
    /// Its key or value is not what a mirror writes.
    Undecodable,
    /// Its source topic is one `--whitelist` does not match: this mirror does not copy it.
    SourceTopic,
    /// A segment's target topic is not the `--target.topic` rendering of its source topic
    /// (with a message handler: of any topic).
    TargetTopic,
    /// A progress record names a transactional id outside this mirror's (`<group.id>-`):
    /// fencing it would abort another application's transactions.
    TransactionalId,
}

impl Rejection {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Rejection::Undecodable => "undecodable",
            Rejection::SourceTopic => "source_topic",
            Rejection::TargetTopic => "target_topic",
            Rejection::TransactionalId => "transactional_id",
        }
    }
}

/// Where a record lies in the store topic, for what a warning about it names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreOffset<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// What a record of the store must be for the mirror to take it. Anyone who can write to the
/// store topic could otherwise send a group's offsets anywhere on the target, or have the
/// mirror fence another application's transactional id. The default trusts every decodable
/// record (tests, and readers that know nothing of the mirror's flags).
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// The source topics the mirror copies (`--whitelist`); `None`: any (`translate`, which
    /// does not need `--whitelist`, without one).
    pub(crate) topics: Option<TopicFilter>,
    /// `--target.topic`; `None`: any target topic.
    pub(crate) target_topic: Option<TopicTemplate>,
    /// A message handler is loaded: it may send a record to another topic, so a segment's
    /// target topic need only be the rendering of some topic.
    pub(crate) handler: bool,
    /// What the transactional id of a progress record starts with
    /// ([`transactional_id_prefix`]); `None`: any.
    pub(crate) transactional_prefix: Option<String>,
    counted: Option<Family<Vec<(String, String)>, Counter>>,
    /// Reasons already warned of: one warning per reason and process, the rest counted.
    warned: Arc<Mutex<HashSet<Rejection>>>,
}

impl Trust {
    /// What a mirror of `group_id` (its consumer's `group.id`) writes with these flags.
    pub(crate) fn new(
        topics: Option<TopicFilter>,
        target_topic: TopicTemplate,
        handler: bool,
        group_id: Option<&str>,
    ) -> Trust {
        Trust {
            topics,
            target_topic: Some(target_topic),
            handler,
            transactional_prefix: group_id.map(transactional_id_prefix),
            ..Trust::default()
        }
    }

    /// What the mirror run with `settings` writes.
    pub(crate) fn of(settings: &Settings) -> Trust {
        Trust::new(
            Some(settings.topics.clone()),
            settings.target_topic.clone(),
            settings.handler.is_some(),
            settings.consumer.get("group.id"),
        )
    }

    /// Counts rejections in `stats` (`mirror_store_records_rejected_total`).
    pub(crate) fn counting(mut self, stats: &Stats) -> Trust {
        self.counted = Some(stats.recorded.store_rejected.clone());
        self
    }

    /// Why `record` is not to be taken, if it is not, and what is wrong with it.
    pub(crate) fn check(&self, record: &StoreRecord) -> Result<(), (Rejection, String)> {
        let (topic, partition) = match record {
            StoreRecord::Segment(s) => (&s.source_topic, s.source_partition),
            StoreRecord::Progress(p) => (&p.topic, p.partition),
        };
        if let Some(filter) = &self.topics {
            if !filter.matches(topic) {
                return Err((
                    Rejection::SourceTopic,
                    format!(
                        "source topic {topic} (partition {partition}) is not one --whitelist \
                         {:?} matches",
                        filter.pattern()
                    ),
                ));
            }
        }
        match record {
            StoreRecord::Segment(s) => {
                let Some(template) = &self.target_topic else {
                    return Ok(());
                };
                let expected = template.render(&s.source_topic);
                let rendered = if self.handler {
                    template.source_of(&s.target_topic).is_some()
                } else {
                    s.target_topic == expected
                };
                if !rendered {
                    return Err((
                        Rejection::TargetTopic,
                        format!(
                            "a segment of {}/{} from source offset {} names target {}/{} offset \
                             {}, not the --target.topic rendering of its source topic ({expected})",
                            s.source_topic,
                            s.source_partition,
                            s.source_offset,
                            s.target_topic,
                            s.target_partition,
                            s.target_offset
                        ),
                    ));
                }
            }
            StoreRecord::Progress(p) => {
                if let (Some(id), Some(prefix)) = (&p.transactional_id, &self.transactional_prefix)
                {
                    if !id.starts_with(prefix.as_str()) {
                        return Err((
                            Rejection::TransactionalId,
                            format!(
                                "the progress of {}/{} (next {}) names transactional id {id:?}, \
                                 not one of this mirror's (they start with {prefix:?}): it is \
                                 neither trusted nor fenced",
                                p.topic, p.partition, p.next
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts a record not taken, and warns of it if it is the first for its reason.
    pub(super) fn reject(&self, why: Rejection, at: StoreOffset<'_>, what: &str) {
        if let Some(counted) = &self.counted {
            counted
                .get_or_create(&vec![("reason".to_owned(), why.label().to_owned())])
                .inc();
        }
        let first = self
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(why);
        if first {
            tracing::warn!(
                "offset-mapping topic {}: skipped the record at partition {} offset {}: {what}. \
                 Only the mirror's principal should write to this topic (docs/security.md); \
                 further records skipped for this reason ({}) are counted in \
                 mirror_store_records_rejected_total, not logged",
                at.topic,
                at.partition,
                at.offset,
                why.label()
            );
        }
    }
}
