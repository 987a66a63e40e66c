//! A stream's subscription, for both stream kinds: the topics matching `--whitelist` now,
//! subscribed at start and followed as topics come and go.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

use super::probe::topics_to_follow;
use crate::settings::{counted, Settings};

/// The source refused a subscription.
#[derive(Debug, thiserror::Error)]
#[error("stream {stream}: cannot subscribe to {topics:?}: {source}")]
pub struct SubscribeError {
    pub(crate) stream: usize,
    pub(crate) topics: Vec<String>,
    pub(crate) source: KafkaError,
}

/// The topics one stream's consumer is subscribed to.
pub(crate) struct Subscription {
    stream: usize,
    /// Said after "subscribed to N topics" in the log: which kind of stream subscribed.
    kind: &'static str,
    topics: Vec<String>,
}

impl Subscription {
    pub(crate) fn new(stream: usize, kind: &'static str) -> Subscription {
        Subscription {
            stream,
            kind,
            topics: Vec::new(),
        }
    }

    /// The topics subscribed to now.
    pub(crate) fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Subscribes `consumer` to `topics` unless it is subscribed to exactly those already;
    /// none unsubscribes it (and says that nothing matches).
    pub(crate) fn subscribe<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        settings: &Settings,
        topics: Vec<String>,
    ) -> Result<(), SubscribeError> {
        if topics == self.topics {
            return Ok(());
        }
        if topics.is_empty() {
            tracing::warn!(
                stream = self.stream,
                "no topic on the source matches --whitelist {:?}; checking again every {:?}",
                settings.topics.pattern(),
                settings.options.topic_refresh_interval
            );
            consumer.unsubscribe();
        } else {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer
                .subscribe(&names)
                .map_err(|source| SubscribeError {
                    stream: self.stream,
                    topics: topics.clone(),
                    source,
                })?;
            tracing::info!(
                stream = self.stream,
                "subscribed to {}{}: {}",
                counted(topics.len(), "topic"),
                self.kind,
                topics.join(" ")
            );
        }
        self.topics = topics;
        Ok(())
    }

    /// Asks the source which topics match now and follows them; a failure keeps the current
    /// subscription (and is logged).
    pub(crate) fn refresh<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        settings: &Settings,
    ) {
        if let Some(topics) = topics_to_follow(consumer, &settings.topics, self.stream) {
            if let Err(e) = self.subscribe(consumer, settings, topics) {
                tracing::warn!("{e}");
            }
        }
    }
}
