//! The producers' view of target topics, for both wings: a record for a partition the
//! producer does not know (a source topic that grew, its target topic grown since the
//! producer's metadata was fetched; librdkafka renews it only every
//! `topic.metadata.refresh.interval.ms`, 5 minutes by default) refreshes the producer's
//! metadata of that topic and is tried again. Each target topic keeps its own clock: its
//! metadata is asked for at most every [`REFRESH_EVERY`], and a partition that is still
//! unknown `topic.metadata.propagation.max.ms` (librdkafka's own bound on how long a topic's
//! metadata may take to reach every broker, 30 s by default) after the first refusal is a
//! send failure that says so. A refresh for one topic never holds back another's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};

use crate::mirror::probe::METADATA_TIMEOUT;
use crate::settings::client::ClientProps;

/// librdkafka's default `topic.metadata.propagation.max.ms`.
const DEFAULT_PROPAGATION_MS: u64 = 30_000;

/// The least time between two refreshes of one target topic's metadata: a target that truly
/// lacks a partition does not cost a request per record.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// How long a record for a partition the producer does not know is tried again: the
/// producer's `topic.metadata.propagation.max.ms`, how long librdkafka itself allows a topic's
/// metadata to take to reach every broker.
pub(crate) fn propagation_limit(producer: &ClientProps) -> Duration {
    Duration::from_millis(
        producer
            .get("topic.metadata.propagation.max.ms")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_PROPAGATION_MS),
    )
}

/// One target topic with a partition the producer did not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unknown {
    /// When a record for it was first refused.
    pub(crate) since: Instant,
    /// When its metadata was last asked for.
    pub(crate) refreshed: Instant,
}

/// What to do with a record refused for a partition the producer does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Ask the target for the topic's metadata, then try again.
    Refresh,
    /// Asked recently: wait a little (serving the clients), then try again.
    Wait,
    /// Still unknown after the limit: a send failure, after this long.
    GiveUp(Duration),
}

/// The decision, from the topic's state (`None`: the first refusal) and the time.
pub(crate) fn decide(unknown: Option<Unknown>, now: Instant, limit: Duration) -> Next {
    match unknown {
        None => Next::Refresh,
        Some(u) if now.duration_since(u.since) >= limit => {
            Next::GiveUp(now.duration_since(u.since))
        }
        Some(u) if now.duration_since(u.refreshed) >= REFRESH_EVERY => Next::Refresh,
        Some(_) => Next::Wait,
    }
}

/// A stream's target topics with a partition its producer did not know, each on its own
/// clock (only the stream's thread uses it).
#[derive(Debug)]
pub(crate) struct UnknownPartitions {
    topics: RefCell<HashMap<String, Unknown>>,
    limit: Duration,
}

impl UnknownPartitions {
    /// `limit`: [`propagation_limit`] of the stream's producer.
    pub(crate) fn new(limit: Duration) -> UnknownPartitions {
        UnknownPartitions {
            topics: RefCell::default(),
            limit,
        }
    }

    /// The limit after which a partition still unknown is a send failure.
    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// A record for `target` was refused for a partition `client` does not know: refreshes
    /// the topic's metadata when [`decide`] says so, and returns the decision.
    pub(crate) fn refused<C: ClientContext>(
        &self,
        client: &Client<C>,
        stream: usize,
        target: &CStr,
    ) -> Next {
        let name = target.to_string_lossy();
        let now = Instant::now();
        let unknown = self.topics.borrow().get(name.as_ref()).copied();
        let next = decide(unknown, now, self.limit);
        match next {
            Next::Refresh => {
                self.topics.borrow_mut().insert(
                    name.clone().into_owned(),
                    Unknown {
                        since: unknown.map_or(now, |u| u.since),
                        refreshed: now,
                    },
                );
                refresh_now(client, stream, target);
            }
            Next::GiveUp(_) => {
                // A later record starts a new round (the topic may have grown by then).
                self.topics.borrow_mut().remove(name.as_ref());
            }
            Next::Wait => {}
        }
        next
    }

    /// A record for `target` was taken: its partition is known (again).
    pub(crate) fn known(&self, target: &CStr) {
        if self.topics.borrow().is_empty() {
            return;
        }
        self.topics
            .borrow_mut()
            .remove(target.to_string_lossy().as_ref());
    }
}

/// Refreshes `client`'s metadata of target topic `target` now.
pub(crate) fn refresh_now<C: ClientContext>(client: &Client<C>, stream: usize, target: &CStr) {
    let name = target.to_string_lossy();
    match client.fetch_metadata(Some(&name), METADATA_TIMEOUT) {
        Ok(_) => tracing::info!(
            stream,
            "refreshed the target's metadata of topic {name} (a partition was unknown)"
        ),
        Err(e) => tracing::warn!(
            stream,
            "cannot refresh the target's metadata of topic {name}: {e}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(30);

    #[test]
    fn the_first_refusal_refreshes_at_once() {
        assert_eq!(decide(None, Instant::now(), LIMIT), Next::Refresh);
    }

    #[test]
    fn a_topic_is_refreshed_again_only_after_the_interval_until_the_limit() {
        let t0 = Instant::now();
        let u = |refreshed: Duration| {
            Some(Unknown {
                since: t0,
                refreshed: t0 + refreshed,
            })
        };
        let at = |d: Duration| t0 + d;
        let ms = Duration::from_millis;
        assert_eq!(decide(u(ms(0)), at(ms(100)), LIMIT), Next::Wait);
        assert_eq!(decide(u(ms(0)), at(REFRESH_EVERY), LIMIT), Next::Refresh);
        assert_eq!(decide(u(ms(29_800)), at(ms(29_999)), LIMIT), Next::Wait);
        assert_eq!(decide(u(ms(29_800)), at(LIMIT), LIMIT), Next::GiveUp(LIMIT));
        // The limit runs from the first refusal, not from the last refresh.
        assert_eq!(
            decide(u(ms(29_900)), at(ms(31_000)), LIMIT),
            Next::GiveUp(ms(31_000))
        );
    }

    #[test]
    fn each_topic_keeps_its_own_clock() {
        let unknown = UnknownPartitions::new(LIMIT);
        let t0 = Instant::now();
        unknown.topics.borrow_mut().insert(
            "a".to_owned(),
            Unknown {
                since: t0,
                refreshed: t0,
            },
        );
        // Topic b was never refused: refreshed at once, whatever a's state.
        let b = unknown.topics.borrow().get("b").copied();
        assert_eq!(decide(b, t0, LIMIT), Next::Refresh);
        let a = unknown.topics.borrow().get("a").copied();
        assert_eq!(decide(a, t0, LIMIT), Next::Wait);
        unknown.known(c"a");
        assert!(unknown.topics.borrow().is_empty());
    }
}
