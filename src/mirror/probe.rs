//! Asking a cluster what it has: the one probe of each cluster at start-up (used by the
//! mirror and by `check`), and the source's matching topics (at start-up and on every
//! refresh).

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};

use super::clients::Cluster;
use crate::settings::client::ClientProps;
use crate::settings::routing::TopicFilter;
use crate::settings::Settings;

/// A cluster that did not answer within `--startup.timeout.ms`.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the {} cluster (bootstrap.servers = {servers}) within {timeout:?}: {reason}. Check the address in {config} and that the brokers are up", cluster.name())]
pub struct Unreachable {
    pub cluster: Cluster,
    pub servers: String,
    pub config: String,
    pub timeout: Duration,
    /// librdkafka's reason, secrets redacted.
    pub reason: String,
}

impl Unreachable {
    fn new(settings: &Settings, cluster: Cluster, reason: String) -> Unreachable {
        let props = props_of(settings, cluster);
        Unreachable {
            cluster,
            servers: props
                .get("bootstrap.servers")
                .unwrap_or_default()
                .to_owned(),
            config: props.path.display().to_string(),
            timeout: settings.startup_timeout,
            reason: props.redact(&reason),
        }
    }
}

fn props_of(settings: &Settings, cluster: Cluster) -> &ClientProps {
    match cluster {
        Cluster::Source => &settings.consumer,
        Cluster::Target => &settings.producer,
    }
}

/// The metadata of every topic of `cluster`, waiting at most `--startup.timeout.ms`. The
/// client is made from the connection settings only: it never joins the group.
pub fn probe(settings: &Settings, cluster: Cluster) -> Result<Metadata, Unreachable> {
    let config = props_of(settings, cluster).connection_config();
    let timeout = settings.startup_timeout;
    let metadata = match cluster {
        Cluster::Source => config
            .create::<BaseConsumer>()
            .and_then(|c| c.fetch_metadata(None, timeout)),
        Cluster::Target => config
            .create::<BaseProducer>()
            .and_then(|p| p.client().fetch_metadata(None, timeout)),
    };
    metadata.map_err(|e| Unreachable::new(settings, cluster, e.to_string()))
}

/// The source's topics that `topics` selects, sorted.
pub fn matching_topics<X: ConsumerContext>(
    consumer: &BaseConsumer<X>,
    topics: &TopicFilter,
    timeout: Duration,
) -> KafkaResult<Vec<String>> {
    let metadata = consumer.fetch_metadata(None, timeout)?;
    Ok(topics
        .select(&metadata)
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}
