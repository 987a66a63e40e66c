//! The batches the target topics take. librdkafka fills a batch up to the producer's
//! `batch.size` (1,000,000 bytes by default) and never splits one the broker refuses as too
//! large: a target topic whose `max.message.bytes` is smaller refuses whole batches of small
//! records, and the mirror stops with nothing copied. So at start the `max.message.bytes` of
//! the target topics that exist are read (DescribeConfigs) and `batch.size` is capped at the
//! smallest, said once in the log (and by `check`). A target topic met later (a topic that
//! appears, one `--create.topics` makes) is read before the stream's first record for it:
//! a limit below the `batch.size` in force stops the mirror before anything is sent to it,
//! naming the topic, its limit and what to do (one producer's `batch.size` serves every
//! topic; a restart caps it again). Its limit also names a record refused as too large.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};

use super::clients::QuietContext;
use crate::settings::client::ClientProps;

/// librdkafka's default `batch.size`.
pub(crate) const DEFAULT_BATCH_SIZE: usize = 1_000_000;

/// The producer's `batch.size`: the user's, else librdkafka's default.
pub(crate) fn batch_size(producer: &ClientProps) -> usize {
    producer
        .get("batch.size")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_BATCH_SIZE)
}

/// `batch.size` lowered to the smallest target topic limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cap {
    /// The new `batch.size`.
    pub(crate) batch_size: usize,
    /// The value it replaces.
    pub(crate) was: usize,
    /// Whether the user set the value it replaces.
    pub(crate) user_set: bool,
    /// The target topic with the smallest limit.
    pub(crate) topic: String,
}

impl Cap {
    /// The line said once at start (a warning when the user's value was lowered).
    pub(crate) fn describe(&self, producer: &ClientProps) -> String {
        let whose = if self.user_set {
            format!(
                "the batch.size {} set in {}",
                self.was,
                producer.path.display()
            )
        } else {
            format!("librdkafka's default batch.size {}", self.was)
        };
        format!(
            "producer batch.size capped at {}, the max.message.bytes of target topic {} (the \
             smallest of the target topics), down from {whose}: librdkafka does not split a batch \
             the target refuses as too large",
            self.batch_size, self.topic
        )
    }
}

/// The decision: `batch_size` (the user's, if `user_set`) capped at the smallest of
/// `limits` (target topic, `max.message.bytes`); `None` when every topic takes it.
pub(crate) fn batch_cap(
    batch_size: usize,
    user_set: bool,
    limits: &[(String, usize)],
) -> Option<Cap> {
    let (topic, limit) = limits
        .iter()
        .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))?;
    (*limit < batch_size).then(|| Cap {
        batch_size: *limit,
        was: batch_size,
        user_set,
        topic: topic.clone(),
    })
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LimitError {
    #[error("target topic {topic} takes batches of at most {limit} bytes (its max.message.bytes), less than the producer's batch.size {batch_size} chosen at start, and librdkafka does not split a batch the target refuses; stopping before any record is sent to it. Restart the mirror (batch.size is capped at start at the smallest max.message.bytes of the target topics), or set batch.size to at most {limit} in {producer}, or raise max.message.bytes of {topic}")]
    BelowBatchSize {
        topic: String,
        limit: usize,
        batch_size: usize,
        producer: String,
    },
}

/// The target topics' `max.message.bytes`, read once per topic and shared by the streams.
pub(crate) struct TargetLimits {
    admin: AdminClient<QuietContext>,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    /// The producers' `batch.size`, after the cap.
    batch_size: usize,
    producer: String,
    /// Per target topic: its limit, or `None` when it could not be read (a target that does
    /// not answer DescribeConfigs, such as librdkafka's mock cluster, or a topic not made yet).
    known: Mutex<HashMap<String, Option<usize>>>,
    /// Set once the target left a DescribeConfigs request unanswered (librdkafka's mock
    /// cluster does not implement it): it is not asked again, every limit stays unknown.
    unanswered: AtomicBool,
}

impl std::fmt::Debug for TargetLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetLimits")
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl TargetLimits {
    /// An admin client to the target (`producer`'s connection settings); each request waits
    /// at most `timeout`.
    pub(crate) fn new(producer: &ClientProps, timeout: Duration) -> Result<TargetLimits, String> {
        let admin = producer
            .connection_config()
            .set("allow.auto.create.topics", "false")
            .create_with_context(QuietContext)
            .map_err(|e| format!("{}: {e}", producer.path.display()))?;
        Ok(TargetLimits {
            admin,
            runtime: crate::native::runtime().map_err(|e| e.to_string())?,
            timeout,
            batch_size: batch_size(producer),
            producer: producer.path.display().to_string(),
            known: Mutex::default(),
            unanswered: AtomicBool::new(false),
        })
    }

    /// Reads the `max.message.bytes` of `topics` (those not known yet) and remembers them;
    /// returns the limits now known of `topics`.
    pub(crate) fn read(&self, topics: &[String]) -> Vec<(String, usize)> {
        let missing: Vec<&String> = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            topics.iter().filter(|t| !known.contains_key(*t)).collect()
        };
        if !missing.is_empty() && !self.unanswered.load(Ordering::Relaxed) {
            let read = self.describe(&missing);
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            for topic in missing {
                known.insert(topic.clone(), read.get(topic).copied());
            }
        }
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        topics
            .iter()
            .filter_map(|t| Some((t.clone(), (*known.get(t)?)?)))
            .collect()
    }

    /// One DescribeConfigs request for `topics`; a topic whose limit cannot be read is left
    /// out (logged at debug: the batches are then bounded by `batch.size` alone, as before).
    fn describe(&self, topics: &[&String]) -> HashMap<String, usize> {
        let specifiers: Vec<ResourceSpecifier<'_>> = topics
            .iter()
            .map(|t| ResourceSpecifier::Topic(t.as_str()))
            .collect();
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let results = match self
            .runtime
            .block_on(self.admin.describe_configs(&specifiers, &options))
        {
            Ok(results) => results,
            Err(e) => {
                if !self.unanswered.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "the target did not answer DescribeConfigs ({e}): the target topics' \
                         max.message.bytes are not read, and batch.size ({}) is not capped; a \
                         target topic whose max.message.bytes is smaller refuses whole batches",
                        self.batch_size
                    );
                }
                return HashMap::new();
            }
        };
        let mut limits = HashMap::new();
        // librdkafka answers in the order of the request.
        for (topic, result) in topics.iter().zip(results) {
            let limit = result.map_err(|e| e.to_string()).and_then(|resource| {
                resource
                    .get("max.message.bytes")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| "no max.message.bytes in the answer".to_owned())
            });
            match limit {
                Ok(limit) => {
                    limits.insert((*topic).clone(), limit);
                }
                Err(e) => {
                    tracing::debug!("cannot read max.message.bytes of target topic {topic}: {e}")
                }
            }
        }
        limits
    }

    /// Before a stream's first record for target topic `topic`: refused when the topic takes
    /// smaller batches than the producers build.
    pub(crate) fn admit(&self, topic: &str) -> Result<(), LimitError> {
        match self.read(&[topic.to_owned()]).first() {
            Some((_, limit)) if *limit < self.batch_size => Err(LimitError::BelowBatchSize {
                topic: topic.to_owned(),
                limit: *limit,
                batch_size: self.batch_size,
                producer: self.producer.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The `max.message.bytes` of `topic`, if it was read.
    pub(crate) fn limit_of(&self, topic: &str) -> Option<usize> {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(topic)
            .copied()
            .flatten()
    }

    /// The producers' `batch.size` in force.
    pub(crate) fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Sets the `batch.size` in force after the cap.
    pub(crate) fn set_batch_size(&mut self, batch_size: usize) {
        self.batch_size = batch_size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, usize)]) -> Vec<(String, usize)> {
        pairs.iter().map(|(t, l)| ((*t).to_owned(), *l)).collect()
    }

    #[test]
    fn batch_size_is_capped_at_the_smallest_target_topic_limit() {
        let cap = batch_cap(
            1_000_000,
            false,
            &limits(&[("a", 1_048_588), ("b", 65_536)]),
        );
        assert_eq!(
            cap,
            Some(Cap {
                batch_size: 65_536,
                was: 1_000_000,
                user_set: false,
                topic: "b".to_owned()
            })
        );
    }

    #[test]
    fn batch_size_is_kept_when_every_target_topic_takes_it() {
        assert_eq!(
            batch_cap(1_000_000, false, &limits(&[("a", 1_000_000)])),
            None
        );
        assert_eq!(batch_cap(50_000, true, &limits(&[("a", 100_000)])), None);
        assert_eq!(batch_cap(1_000_000, false, &[]), None);
    }

    #[test]
    fn a_batch_size_the_user_set_above_a_limit_is_capped_too() {
        let cap = batch_cap(2_000_000, true, &limits(&[("a", 1_048_588)])).unwrap();
        assert_eq!((cap.batch_size, cap.user_set), (1_048_588, true));
    }
}
