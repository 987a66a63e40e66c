//! Source topics told apart by their ids (KIP-516: Metadata v10+, Kafka 2.8+), for the record
//! engine: a source topic deleted and created again under the same name has a new id, though
//! librdkafka fetches it on at the old position (it has no topic-id check of its own,
//! confluentinc/librdkafka#3255, #4898), so the new topic's first records would be skipped
//! without a word. Each stream asks the source for the ids of the topics it follows, at start
//! and with every topic refresh (`--topic.refresh.interval.ms`), through its own consumer's
//! connection (librdkafka's DescribeTopics, so every security protocol works), and reports
//! the topics whose id changed; the stream then mirrors them again from their beginning.
//!
//! A topic the source does not describe for a while (deleted, not yet created again) keeps
//! its last id, so a recreation between two checks is still seen. A source that gives no ids
//! (Kafka before 2.8, or a broker that answers an older Metadata) turns the check off for
//! those topics, said once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};

use crate::mirror::state::Recorded;
use crate::native::admin::{topic_ids, DescribedTopic};

/// How long one check may wait for the source's answer (the stream's loop waits meanwhile).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A source topic whose id changed since the last check.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recreated {
    topic: String,
    old: String,
    new: String,
}

/// A recreated topic whose partitions are still started again when assigned to the stream.
#[derive(Debug)]
struct Pending {
    recreated: Recreated,
    until: Instant,
    /// Its partitions started again already.
    done: Vec<i32>,
    /// Not yet said in the log (the warning goes with the first partitions started again,
    /// or says that none is assigned).
    fresh: bool,
}

/// The ids a stream has seen of the source topics it follows, and the recreated topics whose
/// partitions it still starts again from offset 0.
#[derive(Debug)]
pub(crate) struct TopicIds {
    stream: usize,
    ids: HashMap<String, String>,
    /// How long after a check found a topic created again its partitions assigned to the
    /// stream are still started again from offset 0 (a rebalance that follows the topic's
    /// return may assign them after the check): two topic refreshes, at least
    /// [`MIN_WINDOW`].
    window: Duration,
    pending: Vec<Pending>,
    /// The assignment at the last [`due`](Self::due) call while something was pending.
    assigned: Vec<(String, i32)>,
    /// Said once: the source gives no topic ids, the check is off.
    said_no_ids: bool,
    /// Said once at warn level (then at debug): a check failed as a whole.
    said_failure: bool,
}

/// The least [`TopicIds::window`]: a subscription change after the topic's return is noticed
/// within one topic refresh, and its rebalance served within seconds (a guess with margin,
/// not a measurement; a partition started again twice costs duplicates, never a loss).
const MIN_WINDOW: Duration = Duration::from_secs(30);

impl TopicIds {
    /// For a stream whose topic refresh runs every `refresh`.
    pub(crate) fn new(stream: usize, refresh: Duration) -> TopicIds {
        TopicIds {
            stream,
            ids: HashMap::new(),
            window: (refresh * 2).max(MIN_WINDOW),
            pending: Vec::new(),
            assigned: Vec::new(),
            said_no_ids: false,
            said_failure: false,
        }
    }

    /// Asks the source `client` is connected to for the ids of `topics`; a topic whose id
    /// changed since the last check is counted in `recorded` (once per process and id) and
    /// its partitions become [`due`](Self::due). A failed request changes nothing (logged).
    pub(crate) fn check<C: ClientContext>(
        &mut self,
        client: &Client<C>,
        topics: &[String],
        recorded: &Recorded,
    ) {
        if topics.is_empty() {
            return;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let described = match topic_ids(client, &names, CHECK_TIMEOUT) {
            Ok(described) => described,
            Err(reason) => {
                if self.said_failure {
                    tracing::debug!(
                        stream = self.stream,
                        "cannot ask the source for topic ids: {reason}"
                    );
                } else {
                    self.said_failure = true;
                    tracing::warn!(
                        stream = self.stream,
                        "cannot ask the source for topic ids: {reason}; a source topic deleted \
                         and created again is not noticed until a check succeeds (tried again \
                         with every topic refresh, said once)"
                    );
                }
                return;
            }
        };
        let until = Instant::now() + self.window;
        for recreated in self.observe(&described) {
            recorded.count_recreated(&recreated.topic, &recreated.new);
            self.pending
                .retain(|p| p.recreated.topic != recreated.topic);
            self.pending.push(Pending {
                recreated,
                until,
                done: Vec::new(),
                fresh: true,
            });
        }
    }

    /// Whether partitions of recreated topics may still be started again.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The partitions of `assigned` to start again from offset 0 now, while their topic's
    /// window is open: those of recreated topics not started again yet, and those assigned
    /// again since the last call (released meanwhile, perhaps before the commit of offset 0
    /// went through: the group may still hold the old topic's position). Called on every turn
    /// of the stream's loop while [`has_pending`](Self::has_pending).
    pub(crate) fn due(&mut self, assigned: &[(String, i32)]) -> Vec<(String, i32)> {
        let now = Instant::now();
        self.pending.retain(|p| p.fresh || now < p.until);
        let mut due = Vec::new();
        for p in &mut self.pending {
            for (topic, partition) in assigned {
                if *topic != p.recreated.topic {
                    continue;
                }
                let again = !self
                    .assigned
                    .iter()
                    .any(|(t, n)| t == topic && n == partition);
                if again || !p.done.contains(partition) {
                    if !p.done.contains(partition) {
                        p.done.push(*partition);
                    }
                    due.push((topic.clone(), *partition));
                }
            }
        }
        self.assigned = if self.pending.is_empty() {
            Vec::new()
        } else {
            assigned.to_vec()
        };
        due
    }

    /// Says what was started again: one warning per recreated topic when the check found it
    /// (its old and new id, the positions abandoned: `started` holds each partition started
    /// again now and its position in the old topic), an info line for partitions assigned
    /// later.
    pub(crate) fn report(&mut self, started: &[(String, i32, Option<i64>)]) {
        let at = |o: &Option<i64>| o.map_or_else(|| "none".to_owned(), |o| o.to_string());
        for p in &mut self.pending {
            let topic = &p.recreated.topic;
            let positions: Vec<String> = started
                .iter()
                .filter(|(t, _, _)| t == topic)
                .map(|(t, partition, o)| format!("{t}/{partition} at {}", at(o)))
                .collect();
            if p.fresh {
                p.fresh = false;
                let Recreated { old, new, .. } = &p.recreated;
                if positions.is_empty() {
                    tracing::warn!(
                        stream = self.stream,
                        "source topic {topic} was deleted and created again (topic id {old}, \
                         now {new}): none of its partitions is assigned to this stream now; \
                         those assigned within {:?} are mirrored from offset 0 of the new topic",
                        self.window
                    );
                } else {
                    tracing::warn!(
                        stream = self.stream,
                        "source topic {topic} was deleted and created again (topic id {old}, \
                         now {new}): mirroring it again from offset 0 of the new topic; \
                         positions abandoned in the old topic: {}. Records already copied from \
                         the old topic stay on the target; records of the new topic copied \
                         before this check (from the old positions on) are copied again",
                        positions.join(", ")
                    );
                }
            } else if !positions.is_empty() {
                tracing::info!(
                    stream = self.stream,
                    "mirroring {} again from offset 0 of source topic {topic}, created again \
                     (positions abandoned in the old topic)",
                    positions.join(", ")
                );
            }
        }
    }

    /// Takes in one answer: remembers each topic's id and returns the topics whose id
    /// changed. Topics with an error (gone, for now) keep the id they had.
    fn observe(&mut self, described: &[DescribedTopic]) -> Vec<Recreated> {
        let mut recreated = Vec::new();
        for d in described.iter().filter(|d| d.error.is_none()) {
            let Some(id) = &d.id else {
                if !self.said_no_ids {
                    self.said_no_ids = true;
                    tracing::info!(
                        stream = self.stream,
                        "the source gives no id for topic {} (topic ids need Kafka 2.8 or \
                         later, Metadata v10): a source topic deleted and created again under \
                         the same name is not told apart from the old one, and the records of \
                         the new topic below the old position are not mirrored",
                        d.topic
                    );
                }
                continue;
            };
            match self.ids.insert(d.topic.clone(), id.clone()) {
                Some(old) if old != *id => recreated.push(Recreated {
                    topic: d.topic.clone(),
                    old,
                    new: id.clone(),
                }),
                _ => {}
            }
        }
        recreated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    fn topic(name: &str, id: Option<&str>) -> DescribedTopic {
        DescribedTopic {
            topic: name.to_owned(),
            error: None,
            operations: None,
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn a_new_id_is_reported_once_and_a_topic_gone_for_a_while_keeps_its_old_id() {
        let mut ids = TopicIds::new(0, Duration::from_secs(1));
        assert!(ids
            .observe(&[topic("a", Some("A1")), topic("b", Some("B1"))])
            .is_empty());
        assert!(ids.observe(&[topic("a", Some("A1"))]).is_empty());
        // Deleted: an error, no id; the old id stays.
        let gone = DescribedTopic {
            error: Some(RDKafkaErrorCode::UnknownTopicOrPartition),
            ..topic("a", None)
        };
        assert!(ids.observe(&[gone]).is_empty());
        let recreated = ids.observe(&[topic("a", Some("A2")), topic("b", Some("B1"))]);
        assert_eq!(
            recreated,
            vec![Recreated {
                topic: "a".to_owned(),
                old: "A1".to_owned(),
                new: "A2".to_owned(),
            }]
        );
        assert!(ids.observe(&[topic("a", Some("A2"))]).is_empty());
    }

    #[test]
    fn each_assigned_partition_of_a_recreated_topic_is_due_once() {
        let mut ids = TopicIds::new(0, Duration::from_secs(1));
        ids.observe(&[topic("a", Some("A1"))]);
        for r in ids.observe(&[topic("a", Some("A2"))]) {
            ids.pending.push(Pending {
                recreated: r,
                until: Instant::now() + ids.window,
                done: Vec::new(),
                fresh: true,
            });
        }
        let a = |p: i32| ("a".to_owned(), p);
        assert_eq!(ids.due(&[a(0), ("b".to_owned(), 0)]), vec![a(0)]);
        ids.report(&[("a".to_owned(), 0, Some(7))]);
        // Partition 1 assigned later (a rebalance): due then, partition 0 not again.
        assert_eq!(ids.due(&[a(0), a(1)]), vec![a(1)]);
        assert!(ids.due(&[a(0), a(1)]).is_empty());
        // Partition 0 released and assigned again within the window: due again (the group
        // may hold the old position still).
        assert!(ids.due(&[a(1)]).is_empty());
        assert_eq!(ids.due(&[a(0), a(1)]), vec![a(0)]);
        assert!(ids.has_pending());
    }

    #[test]
    fn a_source_without_topic_ids_reports_nothing() {
        let mut ids = TopicIds::new(0, Duration::from_secs(1));
        assert!(ids.observe(&[topic("a", None)]).is_empty());
        assert!(ids.observe(&[topic("a", None)]).is_empty());
        assert!(ids.said_no_ids);
    }
}
