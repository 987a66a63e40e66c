//! The whole mirror: probe both clusters, start the streams, wait for them, report.

use std::sync::Arc;
use std::thread;

use super::at_least_once::stream::{Stream, StreamError};
use super::batches::stream::{BatchStream, BatchStreamError};
use super::clients::{self, Cluster};
use super::exactly_once::{self, TransactionError};
use super::heartbeats::{HeartbeatError, Heartbeater};
use super::limits::TargetLimits;
use super::mapping::groups;
use super::mapping::ledger::StoreWriter;
use super::mapping::store::MappingStore;
use super::probe::{probe, Unreachable};
use super::route::StreamReport;
use super::state::{Control, ShutdownGate, Stats};
use super::throttle::Throttle;
use super::topics::TopicCreator;
use crate::settings::client::ClientProps;
use crate::settings::flags::Partitioning;
use crate::settings::{batch_unapplied, counted, Settings};

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    #[error(transparent)]
    Batches(#[from] BatchStreamError),
    #[error("{0}")]
    Fatal(String),
    #[error("stream {0} panicked; see the log above")]
    Panicked(usize),
}

/// Asks the brokers whether the batch engine the settings chose can copy there (run at start,
/// and by `check`): where it cannot, `--copy.mode auto` falls back to records, the reason kept
/// in `batches_refused`, and `--copy.mode batches` is `Err(reason)`. Settings on the record
/// engine are left as they are.
pub fn choose_engine(settings: &mut Settings) -> Result<(), String> {
    if !settings.batches {
        return Ok(());
    }
    let wait = crate::settings::batch_probe_wait(settings);
    let Some(reason) =
        super::batches::cluster::unspoken(&settings.consumer, &settings.producer, wait)
    else {
        return Ok(());
    };
    if !settings.batches_by_auto {
        return Err(reason);
    }
    settings.batches = false;
    settings.batches_by_auto = false;
    settings.batches_refused = Some(reason);
    Ok(())
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
    let Some(started) = start_unless_stopped(settings, &control, &stats)? else {
        tracing::info!("stopped during the start: nothing was copied, nothing committed");
        return Ok(Summary::default());
    };
    run_streams(started, control, stats)
}

/// How often the wait for the start looks at the stop request.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// [`start`] on a thread of its own, while this one watches the stop request: every wait of
/// the start (the probes of both clusters for up to `--startup.timeout.ms`, the engine's look
/// at the brokers, the topics made before the streams, ...) ends at once when a stop is asked
/// for, and `None` says so. A start cut short is left to the end of the process: nothing was
/// copied, so there is nothing to flush or commit.
fn start_unless_stopped(
    settings: &Settings,
    control: &Arc<Control>,
    stats: &Arc<Stats>,
) -> Result<Option<Started>, MirrorError> {
    use std::sync::mpsc::RecvTimeoutError;
    let (done, result) = std::sync::mpsc::channel();
    let (settings, starting, stats) = (settings.clone(), control.clone(), stats.clone());
    thread::Builder::new()
        .name("start".to_owned())
        .spawn(move || {
            let _ = done.send(start(&settings, &starting, &stats));
        })
        .map_err(|e| MirrorError::Fatal(format!("cannot start the start-up thread: {e}")))?;
    loop {
        match result.recv_timeout(STOP_POLL) {
            Ok(started) => return started.map(Some),
            Err(RecvTimeoutError::Timeout) if control.stop_requested() => {
                return match control.failure() {
                    Some(message) => Err(MirrorError::Fatal(message)),
                    None => Ok(None),
                };
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(MirrorError::Fatal(
                    "the start panicked; see the log above".to_owned(),
                ))
            }
        }
    }
}

/// What the start hands the streams.
struct Started {
    /// The settings as the brokers leave them (`batch.size` capped, the engine chosen).
    settings: Settings,
    topics: Vec<String>,
    creator: Option<Arc<TopicCreator>>,
    store: Option<Arc<MappingStore>>,
    limits: Arc<TargetLimits>,
}

/// Everything before the streams: both clusters probed, the engine chosen, the topics the
/// streams need made, the background threads started.
fn start(
    settings: &Settings,
    control: &Arc<Control>,
    stats: &Arc<Stats>,
) -> Result<Started, MirrorError> {
    let source = probe(settings, Cluster::Source)?;
    probe(settings, Cluster::Target)?;
    let (mut capped, limits) = cap_batch_size(settings, &source)?;
    choose_engine(&mut capped).map_err(|reason| {
        MirrorError::Fatal(format!(
            "--copy.mode batches cannot serve {reason}; use --copy.mode records or auto"
        ))
    })?;
    let settings = &capped;
    for line in settings.exposures() {
        tracing::warn!("{line}");
    }
    if !settings.batches {
        // librdkafka's producer is not the one that writes the records in the batch engine.
        clients::explain_gapless(&settings.producer);
    }
    if settings.batches {
        let mode = if settings.batches_by_auto {
            "auto"
        } else {
            "batches"
        };
        tracing::info!("copying record batches as they are (--copy.mode {mode})");
        if crate::native::malloc::keep_freed_buffers() {
            tracing::debug!("malloc: freed batch buffers kept for the next ones");
        }
        for line in batch_unapplied(settings) {
            tracing::warn!("{line}");
        }
    } else if let Some(reason) = &settings.batches_refused {
        tracing::info!("--copy.mode auto: copying records, the batch engine cannot serve {reason}");
    }
    let throttle = Throttle::new(
        settings.throttle_bytes_per_second,
        settings.throttle_records_per_second,
    );
    if let Some(throttle) = throttle {
        tracing::info!("throttled to {} over all streams", throttle.describe());
        let _ = stats.throttle.set(throttle);
    }
    let mut topics: Vec<String> = settings
        .topics
        .select(&source)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    tracing::info!(
        "mirroring topics matching {:?} with {} ({} matching now)",
        settings.topics.pattern(),
        counted(settings.options.num_streams, "stream"),
        topics.len()
    );
    if settings.exactly_once.is_some() {
        for warning in
            crate::settings::exactly_once::warnings(&settings.consumer, &settings.producer)
        {
            tracing::warn!("{warning}");
        }
    }
    if let crate::settings::OnHandlerError::DeadLetter(topic) = &settings.on_handler_error {
        if let Some(source_topic) = topics
            .iter()
            .find(|t| settings.target_topic.render(t) == *topic)
        {
            return Err(MirrorError::Fatal(format!(
                "--dead.letter.topic {topic} is the target topic of source topic \
                 {source_topic}, which the whitelist matches: refused records would land \
                 among mirrored ones; name another dead-letter topic"
            )));
        }
        let done = super::topics::ensure_dead_letter_topic(
            &settings.producer,
            topic,
            settings.create_topics.is_some(),
            settings.options.startup_timeout,
        )
        .map_err(MirrorError::Fatal)?;
        tracing::info!("{done}");
    }
    let creator = topic_creator(settings)?;
    let store = match &settings.offset_mapping {
        Some(topic) => Some(Arc::new(
            MappingStore::open(
                &settings.producer,
                topic,
                control.clone(),
                super::mapping::Trust::of(settings).counting(stats),
                settings.options.startup_timeout,
            )
            .map_err(|e| MirrorError::Fatal(e.to_string()))?,
        )),
        None => None,
    };
    if let Some(store) = store.clone() {
        // Not joined: a stop never waits for it (a slow cluster makes it take its timeout).
        let (source, target) = (settings.consumer.clone(), settings.producer.clone());
        let timeout = settings.options.startup_timeout;
        thread::Builder::new()
            .name("mapping-prune".to_owned())
            .spawn(move || prune_mapping(&store, &source, &target, timeout))
            .expect("spawning the offset-mapping prune");
    }
    if settings.sync_topic_configs.is_some() {
        // Not joined either: a round waiting on a slow cluster never holds up a stop.
        let (settings, control, stats) = (settings.clone(), control.clone(), stats.clone());
        thread::Builder::new()
            .name("config-sync".to_owned())
            .spawn(move || super::sync::run(settings, control, stats))
            .expect("spawning the topic-config sync thread");
    }
    if settings.sync_topic_acls.is_some() {
        // Not joined: as the config sync.
        let (settings, control) = (settings.clone(), control.clone());
        thread::Builder::new()
            .name("acl-sync".to_owned())
            .spawn(move || super::acl_sync::run(settings, control))
            .expect("spawning the ACL sync thread");
    }
    if let Some(heartbeats) = &settings.heartbeats {
        // Made now if it was not there when the source was listed above: in the streams'
        // first subscription all the same, not only after a topic refresh
        // (`--topic.refresh.interval.ms`; until then no stream owns it, no heartbeat is
        // written).
        if start_heartbeats(settings, heartbeats, control, stats)
            && !topics.contains(&heartbeats.topic)
        {
            topics.push(heartbeats.topic.clone());
            topics.sort();
        }
    }
    Ok(Started {
        settings: capped,
        topics,
        creator,
        store,
        limits,
    })
}

/// The streams (and the group sync), until they stop; what they report.
fn run_streams(
    started: Started,
    control: Arc<Control>,
    stats: Arc<Stats>,
) -> Result<Summary, MirrorError> {
    let Started {
        settings,
        topics,
        creator,
        store,
        limits,
    } = started;
    let settings = &settings;
    let gate = Arc::new(ShutdownGate::new(settings.options.num_streams));
    let results: Vec<Result<StreamReport, MirrorError>> = thread::scope(|scope| {
        if settings.sync_groups.is_some() {
            let (control, stats) = (control.clone(), stats.clone());
            thread::Builder::new()
                .name("group-sync".to_owned())
                .spawn_scoped(scope, move || groups::run_sync(settings, &control, &stats))
                .expect("spawning the group sync thread");
        }
        let handles: Vec<_> = (0..settings.options.num_streams)
            .map(|stream| {
                let (control, stats) = (control.clone(), stats.clone());
                let (topics, gate, creator) = (topics.clone(), gate.clone(), creator.clone());
                let (store, limits) = (store.clone(), limits.clone());
                let handle = thread::Builder::new()
                    .name(format!("stream-{stream}"))
                    .spawn_scoped(scope, move || {
                        let clients = StreamClients {
                            creator,
                            store,
                            limits,
                        };
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

/// `--heartbeats.interval.ms`: the heartbeats topic made on the source before the streams
/// subscribe (so that their first subscription has it), then the writer's thread, not joined
/// (as the syncs'). A source that refuses turns heartbeats off, said once; the mirror goes on.
/// Returns whether the topic is there now.
fn start_heartbeats(
    settings: &Settings,
    heartbeats: &crate::settings::Heartbeats,
    control: &Arc<Control>,
    stats: &Arc<Stats>,
) -> bool {
    let mut writer = match Heartbeater::new(settings, heartbeats) {
        Ok(writer) => writer,
        Err(e) => {
            tracing::warn!("{e}");
            return false;
        }
    };
    let made = match writer.make_topic() {
        Ok(()) => true,
        Err(e @ HeartbeatError::Passing { .. }) => {
            tracing::warn!("{e}");
            false
        }
        Err(e) => {
            tracing::warn!("{e}");
            return false;
        }
    };
    let (control, stats) = (control.clone(), stats.clone());
    thread::Builder::new()
        .name("heartbeats".to_owned())
        .spawn(move || super::heartbeats::run(writer, control, stats))
        .expect("spawning the heartbeat thread");
    made
}

/// The process-wide clients a stream uses besides its own consumer and producer.
struct StreamClients {
    creator: Option<Arc<TopicCreator>>,
    store: Option<Arc<MappingStore>>,
    limits: Arc<TargetLimits>,
}

/// One stream's thread: made, run, and reported, in the mode the settings choose. One stream
/// failing stops all of them.
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
    let result = match (
        &settings.exactly_once,
        &clients.store,
        &settings.offset_mapping,
    ) {
        (Some(_), Some(_), Some(store_topic)) => exactly_once::run_incarnations(
            stream,
            settings,
            store_topic,
            (control.clone(), stats, gate),
            clients.creator,
            topics,
        )
        .map_err(MirrorError::from),
        _ if settings.batches => match BatchStream::new(
            stream,
            settings,
            control.clone(),
            stats,
            gate.clone(),
            (clients.creator, clients.store, clients.limits),
        ) {
            Ok(s) => s.run(topics),
            Err(e) => {
                gate.arrive();
                Err(e)
            }
        }
        .map_err(MirrorError::from),
        _ => match Stream::new(
            stream,
            settings,
            control.clone(),
            stats,
            gate.clone(),
            (clients.creator, clients.store, clients.limits),
        ) {
            Ok(s) => s.run(topics),
            Err(e) => {
                gate.arrive();
                Err(e)
            }
        }
        .map_err(MirrorError::from),
    };
    result.inspect_err(|e| control.fail(e.to_string()))
}

/// The producers' `batch.size` capped at the smallest `max.message.bytes` of the target
/// topics of the source topics matching now (said once; a user's larger value is lowered with
/// a warning), and the limits read, for the target topics met later.
fn cap_batch_size(
    settings: &Settings,
    source: &rdkafka::metadata::Metadata,
) -> Result<(Settings, Arc<TargetLimits>), MirrorError> {
    // A Kafka answers DescribeConfigs in milliseconds; a target that does not answer it
    // (librdkafka's mock cluster lists it and never answers) would otherwise hold every start
    // for the whole startup timeout. Unanswered, nothing is capped (and it is not asked again).
    let timeout = settings.options.startup_timeout.min(LIMITS_TIMEOUT);
    let mut limits = TargetLimits::new(&settings.producer, timeout)
        .map_err(|e| MirrorError::Fatal(format!("cannot create the admin client: {e}")))?;
    let targets: Vec<String> = settings
        .topics
        .select(source)
        .into_iter()
        .map(|(name, _)| settings.target_topic.render(&name))
        .collect();
    let read = limits.read(&targets);
    let mut settings = settings.clone();
    let user_set = settings.producer.get("batch.size").is_some();
    let batch_size = super::limits::batch_size(&settings.producer);
    if let Some(cap) = super::limits::batch_cap(batch_size, user_set, &read) {
        let line = cap.describe(&settings.producer);
        if cap.user_set {
            tracing::warn!("{line}");
        } else {
            tracing::info!("{line}");
        }
        settings
            .producer
            .set("batch.size", &cap.batch_size.to_string());
        limits.set_batch_size(cap.batch_size);
    }
    Ok((settings, Arc::new(limits)))
}

/// How long the start waits for the target topics' `max.message.bytes`.
const LIMITS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

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
        settings.options.partitioning == Partitioning::Preserve,
        settings.options.startup_timeout,
    )
    .map(|c| Some(Arc::new(c)))
    .map_err(|e| MirrorError::Fatal(format!("cannot create the admin clients: {e}")))
}
