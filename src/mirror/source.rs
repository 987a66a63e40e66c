//! What both stream kinds do with their source consumer beside their own hand-over: its
//! client callbacks (librdkafka's log lines, statistics, client-wide errors), the results of
//! its offset commits, the target topics made before assigned partitions are fetched, the
//! user's rebalance listener, and seeks.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::TopicPartitionList;

use super::clients;
use super::delay::Observation;
use super::state::{PartitionLag, Stats, StreamShared};
use super::topics::TopicCreator;
use super::Partition;
use crate::plugin::Listener;

/// The `ClientContext` of a stream's source consumer, whichever its kind: librdkafka's log
/// lines, the consumer's statistics and its client-wide errors, each applied to the
/// stream's shared state, which `$shared` reaches from the context; `$unreplicated` gives, for
/// the replication delay, the oldest offset of a partition consumed and not yet on the target
/// (`None`: nothing consumed is missing there).
macro_rules! source_client_context {
    ($context:ty, |$this:ident| $shared:expr, $unreplicated:expr) => {
        impl rdkafka::client::ClientContext for $context {
            fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
                $crate::mirror::clients::librdkafka_log(
                    $crate::mirror::clients::Cluster::Source,
                    level,
                    fac,
                    message,
                );
            }

            fn stats(&self, statistics: rdkafka::Statistics) {
                let $this = self;
                let unreplicated: fn(&Self, &str, i32) -> Option<i64> = $unreplicated;
                $crate::mirror::source::statistics($shared, &statistics, |topic, partition| {
                    unreplicated(self, topic, partition)
                });
            }

            /// Rarely called for the source consumer (the stream's poll returns its errors,
            /// which it applies the same way); kept for errors raised outside the queue.
            fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
                let $this = self;
                let shared: &$crate::mirror::state::StreamShared = $shared;
                $crate::mirror::clients::client_error(
                    &shared.control,
                    $crate::mirror::clients::Cluster::Source,
                    shared.stream,
                    &error,
                    reason,
                );
            }
        }
    };
}
pub(crate) use source_client_context;

/// Records the result of a commit of `partitions` offsets: successes are counted; a failure
/// is counted by its error code and logged (the next commit sends every offset again).
pub(crate) fn committed(shared: &StreamShared, result: &KafkaResult<()>, partitions: usize) {
    let recorded = &shared.stats.recorded;
    match result {
        Ok(()) => {
            Stats::add(&shared.stats.commits, 1);
            recorded.commit_succeeded();
        }
        // Nothing to commit: not a failure.
        Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::NoOffset) => {}
        Err(e) => {
            let in_a_row = recorded.commit_failed(clients::code_name(e));
            tracing::warn!(
                stream = shared.stream,
                "offset commit of {partitions} partitions failed ({in_a_row} in a row): {e}; \
                 the next commit sends them again"
            );
        }
    }
}

/// Makes the target topics of the assigned partitions (`--create.topics`). Transient
/// errors (a time-out, brokers down during a rolling restart) are retried with backoff
/// for at most `topic_retry_limit`; permanent ones (authorization, policy), and transient
/// ones that outlast it, are fatal.
pub(crate) fn make_target_topics(
    creator: &TopicCreator,
    partitions: &[Partition],
    shared: &StreamShared,
    retry_limit: Duration,
) {
    let mut topics: Vec<(&str, usize)> = Vec::new();
    for (topic, partition) in partitions {
        let needed = usize::try_from(*partition).unwrap_or(0) + 1;
        match topics.iter_mut().find(|(t, _)| t == topic) {
            Some((_, n)) => *n = (*n).max(needed),
            None => topics.push((topic, needed)),
        }
    }
    let deadline = Instant::now() + retry_limit;
    for (topic, needed) in topics {
        let mut backoff = Duration::from_millis(200);
        loop {
            match creator.ensure(topic, needed) {
                Ok(_) => break,
                Err(e)
                    if e.is_transient()
                        && Instant::now() + backoff < deadline
                        && !shared.control.stop_requested() =>
                {
                    tracing::warn!(
                        stream = shared.stream,
                        "{e}; retrying in {backoff:?} (transient; for at most {:?} in all)",
                        retry_limit
                    );
                    std::thread::sleep(backoff);
                    shared.turned(Instant::now());
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    let why = if e.is_transient() {
                        format!(" (still failing after retrying for {:?})", retry_limit)
                    } else {
                        String::new()
                    };
                    shared.control.fail(format!("{e}{why}"));
                    return;
                }
            }
        }
    }
}

/// Keeps the lag of the assigned partitions (from the position of the next record to the
/// high watermark), their replication delay ([`super::delay`]), and whether the source
/// cluster is in reach ([`clients::in_reach`]). `unreplicated` gives the oldest offset of a
/// partition consumed and not yet on the target, if any.
pub(crate) fn statistics(
    shared: &StreamShared,
    statistics: &rdkafka::Statistics,
    unreplicated: impl Fn(&str, i32) -> Option<i64>,
) {
    shared.source_up.observe(clients::in_reach(statistics));
    let mut lag = Vec::new();
    let mut observations = Vec::new();
    for (topic, t) in &statistics.topics {
        for (partition, p) in &t.partitions {
            if *partition < 0 || p.fetch_state == "none" || p.fetch_state == "stopped" {
                continue;
            }
            let value = if p.app_offset >= 0 && p.hi_offset >= 0 {
                (p.hi_offset - p.app_offset).max(0)
            } else {
                p.consumer_lag
            };
            if value >= 0 {
                lag.push(PartitionLag {
                    topic: topic.clone(),
                    partition: *partition,
                    records: value,
                });
            }
            if p.hi_offset >= 0 {
                // What the target has: up to the oldest record in flight, else everything
                // consumed (the position) or committed (never past what the target has).
                let consumed = p.app_offset.max(p.committed_offset);
                let replicated_to =
                    unreplicated(topic, *partition).or((consumed >= 0).then_some(consumed));
                observations.push(Observation {
                    partition: (topic.clone(), *partition),
                    high_watermark: p.hi_offset,
                    replicated_to,
                });
            }
        }
    }
    *shared.lag.lock().unwrap_or_else(|e| e.into_inner()) = lag;
    shared.delay.observe(Instant::now(), &observations);
}

/// The partitions of `tpl`.
pub(crate) fn partition_list(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// Moves each partition of `tpl` to its offset; returns those that did not move (or the
/// request's error): empty when all did.
pub(crate) fn seek_failures<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: TopicPartitionList,
    timeout: Duration,
) -> Vec<String> {
    match consumer.seek_partitions(tpl, timeout) {
        Ok(result) => result
            .elements()
            .iter()
            .filter(|e| e.error().is_err())
            .map(|e| format!("{}/{}", e.topic(), e.partition()))
            .collect(),
        Err(e) => vec![e.to_string()],
    }
}

/// Calls the user's rebalance listener, if any; its error is fatal for the mirror. Both
/// stream kinds (at least once and exactly once) call it from their rebalance callbacks.
pub(crate) fn call_listener(
    listener: &Option<Mutex<Listener>>,
    shared: &StreamShared,
    what: &str,
    call: impl FnOnce(&mut Listener) -> Result<(), String>,
) {
    let Some(listener) = listener else {
        return;
    };
    let mut listener = listener.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = call(&mut listener) {
        shared
            .control
            .fail(format!("the rebalance listener failed in {what}: {e}"));
    }
}
