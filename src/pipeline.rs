//! The whole mirror: check both clusters, start the streams, wait for them, report.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::{BaseProducer, Producer};

use crate::control::{Control, ShutdownGate, Stats};
use crate::settings::Settings;
use crate::stream::{matching_topics, Stream, StreamError};
use crate::topics::TopicCreator;

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("cannot reach the {cluster} cluster (bootstrap.servers = {servers}) within {timeout:?}: {reason}. Check the address in {config} and that the brokers are up")]
    Unreachable {
        cluster: &'static str,
        servers: String,
        config: String,
        timeout: Duration,
        reason: String,
    },
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("{0}")]
    Fatal(String),
    #[error("stream {0} panicked; see the log above")]
    Panicked(usize),
}

/// How a run ended when it ended well.
#[derive(Debug, Default)]
pub struct Summary {
    /// Records the shutdown flush gave up on (not committed; mirrored again on restart).
    pub unacknowledged: usize,
}

/// Runs the mirror until `control` asks it to stop (clean) or a fatal error occurs.
pub fn run(
    settings: &Settings,
    control: Arc<Control>,
    stats: Arc<Stats>,
) -> Result<Summary, MirrorError> {
    let topics = probe_source(settings)?;
    probe_target(settings)?;
    tracing::info!(
        "mirroring topics matching {:?} with {} streams ({} matching now)",
        settings.topics.pattern(),
        settings.num_streams,
        topics.len()
    );

    let creator = match &settings.create_topics {
        Some(configs) => Some(Arc::new(
            TopicCreator::new(
                &settings.consumer,
                &settings.producer,
                settings.target_topic.clone(),
                configs,
                settings.partitioning == crate::cli::Partitioning::Preserve,
                settings.startup_timeout,
            )
            .map_err(|e| MirrorError::Fatal(format!("cannot create the admin clients: {e}")))?,
        )),
        None => None,
    };
    let gate = Arc::new(ShutdownGate::new(settings.num_streams));
    let results: Vec<Result<Result<crate::stream::StreamReport, StreamError>, usize>> =
        thread::scope(|scope| {
            let handles: Vec<_> = (0..settings.num_streams)
                .map(|id| {
                    let control = control.clone();
                    let stats = stats.clone();
                    let topics = topics.clone();
                    let gate = gate.clone();
                    let creator = creator.clone();
                    let handle = thread::Builder::new()
                        .name(format!("stream-{id}"))
                        .spawn_scoped(scope, move || {
                            let result = match Stream::new(
                                id,
                                settings,
                                control.clone(),
                                stats,
                                gate.clone(),
                                creator,
                            ) {
                                Ok(stream) => stream.run(topics),
                                Err(e) => {
                                    gate.arrive();
                                    Err(e)
                                }
                            };
                            if let Err(e) = &result {
                                // One stream failing stops all of them.
                                control.fail(e.to_string());
                            }
                            result
                        })
                        .expect("spawning a stream thread");
                    (id, handle)
                })
                .collect();
            handles
                .into_iter()
                .map(|(id, h)| {
                    h.join().map_err(|_| {
                        control.fail(format!("stream {id} panicked"));
                        id
                    })
                })
                .collect()
        });

    let mut summary = Summary::default();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(Ok(report)) => summary.unacknowledged += report.unacknowledged,
            Ok(Err(e)) => {
                first_error.get_or_insert(MirrorError::Stream(e));
            }
            Err(id) => {
                first_error.get_or_insert(MirrorError::Panicked(id));
            }
        }
    }
    if let Some(message) = control.failure() {
        return Err(MirrorError::Fatal(message));
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

fn unreachable(settings: &Settings, source: bool, reason: String) -> MirrorError {
    let props = if source {
        &settings.consumer
    } else {
        &settings.producer
    };
    MirrorError::Unreachable {
        cluster: if source { "source" } else { "target" },
        servers: props
            .get("bootstrap.servers")
            .unwrap_or_default()
            .to_owned(),
        config: props.path.display().to_string(),
        timeout: settings.startup_timeout,
        reason,
    }
}

/// Lists the source's matching topics, waiting at most `startup.timeout.ms` for an answer.
fn probe_source(settings: &Settings) -> Result<Vec<String>, MirrorError> {
    // A consumer that never subscribes does not join the group.
    let consumer: BaseConsumer = settings
        .consumer
        .connection_config()
        .create()
        .map_err(|e| unreachable(settings, true, e.to_string()))?;
    matching_topics(&consumer, settings, settings.startup_timeout)
        .map_err(|e| unreachable(settings, true, e.to_string()))
}

fn probe_target(settings: &Settings) -> Result<(), MirrorError> {
    let producer: BaseProducer = settings
        .producer
        .connection_config()
        .create()
        .map_err(|e| unreachable(settings, false, e.to_string()))?;
    producer
        .client()
        .fetch_metadata(None, settings.startup_timeout)
        .map(drop)
        .map_err(|e| unreachable(settings, false, e.to_string()))
}
