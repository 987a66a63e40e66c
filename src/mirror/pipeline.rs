//! The whole mirror: probe both clusters, start the streams, wait for them, report.

use std::sync::Arc;
use std::thread;

use super::clients::Cluster;
use super::groups;
use super::ledger::StoreWriter;
use super::probe::{probe, Unreachable};
use super::state::{Control, ShutdownGate, Stats};
use super::store::MappingStore;
use super::stream::{Stream, StreamError, StreamReport};
use super::topics::TopicCreator;
use super::transaction::{TransactionError, TxStream};
use crate::settings::client::ClientProps;
use crate::settings::exactly_once;
use crate::settings::flags::Partitioning;
use crate::settings::{counted, Settings};

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
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
    let source = probe(settings, Cluster::Source)?;
    probe(settings, Cluster::Target)?;
    let topics: Vec<String> = settings
        .topics
        .select(&source)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    tracing::info!(
        "mirroring topics matching {:?} with {} ({} matching now)",
        settings.topics.pattern(),
        counted(settings.num_streams, "stream"),
        topics.len()
    );
    if settings.exactly_once.is_some() {
        for warning in exactly_once::warnings(&settings.consumer, &settings.producer) {
            tracing::warn!("{warning}");
        }
    }
    let creator = topic_creator(settings)?;
    let store = match &settings.offset_mapping {
        Some(topic) => Some(Arc::new(
            MappingStore::open(
                &settings.producer,
                topic,
                control.clone(),
                settings.startup_timeout,
            )
            .map_err(|e| MirrorError::Fatal(e.to_string()))?,
        )),
        None => None,
    };
    if let Some(store) = store.clone() {
        // Not joined: a stop never waits for it (a slow cluster makes it take its timeout).
        let (source, target) = (settings.consumer.clone(), settings.producer.clone());
        let timeout = settings.startup_timeout;
        thread::Builder::new()
            .name("mapping-prune".to_owned())
            .spawn(move || prune_mapping(&store, &source, &target, timeout))
            .expect("spawning the offset-mapping prune");
    }
    let gate = Arc::new(ShutdownGate::new(settings.num_streams));
    let results: Vec<Result<StreamReport, MirrorError>> = thread::scope(|scope| {
        if settings.sync_groups.is_some() {
            let (control, stats) = (control.clone(), stats.clone());
            thread::Builder::new()
                .name("group-sync".to_owned())
                .spawn_scoped(scope, move || {
                    groups::run_sync(settings, &control, &stats.group_sync)
                })
                .expect("spawning the group sync thread");
        }
        let handles: Vec<_> = (0..settings.num_streams)
            .map(|stream| {
                let (control, stats) = (control.clone(), stats.clone());
                let (topics, gate, creator) = (topics.clone(), gate.clone(), creator.clone());
                let store = store.clone();
                let handle = thread::Builder::new()
                    .name(format!("stream-{stream}"))
                    .spawn_scoped(scope, move || {
                        let clients = StreamClients { creator, store };
                        run_stream(stream, settings, control, stats, gate, clients, topics)
                    })
                    .expect("spawning a stream thread");
                (stream, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(stream, handle)| {
                handle.join().unwrap_or_else(|_| {
                    control.fail(format!("stream {stream} panicked"));
                    Err(MirrorError::Panicked(stream))
                })
            })
            .collect()
    });

    let mut summary = Summary::default();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(report) => summary.unacknowledged += report.unacknowledged,
            Err(e) => {
                first_error.get_or_insert(e);
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

/// Once at start: removes the offset-mapping segments below the source's log start (each
/// restart and rebalance adds a segment per partition; this keeps the store to the source's
/// retention). A failure costs nothing but the store's size: logged, not fatal.
fn prune_mapping(
    store: &MappingStore,
    source: &ClientProps,
    target: &ClientProps,
    timeout: std::time::Duration,
) {
    match store.prune(source, target, timeout) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            "offset mapping: removed {} below the source's log start from {}",
            counted(n, "segment"),
            store.topic()
        ),
        Err(e) => tracing::warn!("offset mapping: not pruned: {e}"),
    }
}

/// The process-wide clients a stream uses besides its own consumer and producer.
struct StreamClients {
    creator: Option<Arc<TopicCreator>>,
    store: Option<Arc<MappingStore>>,
}

/// One stream's thread: made, run, and reported. One stream failing stops all of them.
fn run_stream(
    stream: usize,
    settings: &Settings,
    control: Arc<Control>,
    stats: Arc<Stats>,
    gate: Arc<ShutdownGate>,
    clients: StreamClients,
    topics: Vec<String>,
) -> Result<StreamReport, MirrorError> {
    // The store was opened (its topic made) above; exactly once writes it in its own
    // transactions.
    if let (Some(_), Some(_), Some(store_topic)) = (
        &settings.exactly_once,
        &clients.store,
        &settings.offset_mapping,
    ) {
        return run_transactional(
            stream,
            settings,
            (control, stats, gate),
            clients.creator,
            store_topic,
            topics,
        );
    }
    let result = match Stream::new(
        stream,
        settings,
        control.clone(),
        stats,
        gate.clone(),
        clients.creator,
        clients.store,
    ) {
        Ok(s) => s.run(topics),
        Err(e) => {
            gate.arrive();
            Err(e)
        }
    };
    result.map_err(|e| {
        control.fail(e.to_string());
        MirrorError::Stream(e)
    })
}

/// One exactly-once stream's thread (`--exactly.once true`): see [`super::transaction`].
fn run_transactional(
    stream: usize,
    settings: &Settings,
    (control, stats, gate): (Arc<Control>, Arc<Stats>, Arc<ShutdownGate>),
    creator: Option<Arc<TopicCreator>>,
    store_topic: &str,
    topics: Vec<String>,
) -> Result<StreamReport, MirrorError> {
    // A stream whose assignment was lost starts again as a new incarnation (a new consumer
    // and a new transactional id) unless the mirror is stopping. A new incarnation that
    // cannot initialise its transactional id (the target still down, its coordinator still
    // loading) tries again every 2 s for up to twice the transaction timeout.
    let mut incarnation = 0;
    let mut retrying_since: Option<std::time::Instant> = None;
    let result = loop {
        let created = TxStream::new(
            stream,
            settings,
            store_topic,
            (control.clone(), stats.clone(), gate.clone()),
            creator.clone(),
            incarnation,
        );
        let result = match created {
            Ok(s) => {
                retrying_since = None;
                s.run(topics.clone())
            }
            Err(e @ TransactionError::Init { .. })
                if incarnation > 0
                    && !control.stop_requested()
                    && retrying_since
                        .get_or_insert_with(std::time::Instant::now)
                        .elapsed()
                        < 2 * settings.producer.transaction_timeout() =>
            {
                tracing::warn!(stream, "{e}; trying again in 2 s");
                std::thread::sleep(std::time::Duration::from_secs(2));
                incarnation += 1;
                continue;
            }
            Err(e) => {
                gate.arrive();
                break Err(e);
            }
        };
        match result {
            Err(TransactionError::Lost { .. }) if !control.stop_requested() => {
                incarnation += 1;
            }
            Err(TransactionError::Lost { .. }) => {
                gate.arrive();
                break Ok(StreamReport::default());
            }
            other => break other,
        }
    };
    result.map_err(|e| {
        control.fail(e.to_string());
        MirrorError::Fatal(e.to_string())
    })
}

/// `--create.topics`: the admin clients that make target topics as the source has them.
fn topic_creator(settings: &Settings) -> Result<Option<Arc<TopicCreator>>, MirrorError> {
    let Some(configs) = &settings.create_topics else {
        return Ok(None);
    };
    TopicCreator::new(
        &settings.consumer,
        &settings.producer,
        settings.target_topic.clone(),
        configs,
        settings.partitioning == Partitioning::Preserve,
        settings.startup_timeout,
    )
    .map(|c| Some(Arc::new(c)))
    .map_err(|e| MirrorError::Fatal(format!("cannot create the admin clients: {e}")))
}
