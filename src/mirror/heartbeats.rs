//! Heartbeats (`--heartbeats.interval.ms`): every interval, a small record written to the
//! heartbeats topic on the SOURCE (`--heartbeats.topic`, made if absent: 1 partition, one
//! hour of retention), which the streams mirror like any other topic (the topic filter names
//! it whatever `--whitelist` says). So the source is never idle: the replication delay
//! ([`super::delay`]) stays near 0 while the source has no traffic, and grows with wall time
//! while the target is cut off, which a quiet source would otherwise hide.
//!
//! One heartbeat stream per group, not one per instance: the instance whose streams own
//! partition 0 of the heartbeats topic writes (it knows from its assignment); the others wait
//! until a rebalance gives it to them.
//!
//! Each heartbeat: key the source's name (`--source.cluster.name`, or its
//! `bootstrap.servers`), value `{"source":"...","written_ms":N}`, timestamp the write time:
//! on the target, its age is how far behind the target is.
//!
//! A source that refuses CREATE or WRITE on the topic turns heartbeats off with one line
//! naming the operation and the topic; the mirror goes on copying (a probe never stops the
//! copy it watches). `mirror_heartbeats_written_total` then stays flat.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use super::clients::{self, Cluster};
use super::state::{Control, Stats};
use crate::settings::Heartbeats;

/// The heartbeats topic's retention: heartbeats are read when written, never later.
const RETENTION_MS: &str = "3600000";

/// Why heartbeats could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeartbeatError {
    /// The source will not let the consumer config's principal do `operation` on `topic`:
    /// heartbeats stay off until the mirror restarts.
    #[error(
        "heartbeats off: the source cluster does not allow the mirror (the consumer config's \
         principal) to {operation} topic {topic} ({code}): grant it {operation} on topic \
         {topic}{hint}, or leave --heartbeats.interval.ms out; the mirror goes on without \
         heartbeats"
    )]
    Refused {
        operation: &'static str,
        topic: String,
        code: RDKafkaErrorCode,
        hint: &'static str,
    },
    /// Anything else (the source slow, a leader moving): tried again next interval.
    #[error("heartbeats: cannot {operation} topic {topic} on the source: {reason}; trying again every {interval:?}")]
    Passing {
        operation: &'static str,
        topic: String,
        reason: String,
        interval: Duration,
    },
    #[error("heartbeats off: cannot make the clients that write them: {0}")]
    Client(String),
}

fn refused(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::PolicyViolation
    )
}

/// The heartbeat producer's context: librdkafka's lines as the source's, deliveries kept for
/// the loop.
struct Deliveries {
    outcomes: Mutex<Vec<Result<(), RDKafkaErrorCode>>>,
}

impl ClientContext for Deliveries {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Source, level, fac, message);
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)),
        };
        self.outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(outcome);
    }
}

/// The heartbeat writer of this process.
pub(crate) struct Heartbeater {
    heartbeats: Heartbeats,
    admin: AdminClient<DefaultClientContext>,
    producer: BaseProducer<Deliveries>,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    /// Whether the topic is known to exist on the source.
    topic_ready: bool,
}

impl Heartbeater {
    /// The clients, on the source; `--startup.timeout.ms` bounds each admin request.
    pub(crate) fn new(
        settings: &crate::settings::Settings,
        heartbeats: &Heartbeats,
    ) -> Result<Heartbeater, HeartbeatError> {
        let client = |e: KafkaError| HeartbeatError::Client(e.to_string());
        // As in topics.rs: a metadata request must never auto-create the topic.
        let admin = settings
            .consumer
            .connection_config()
            .set("allow.auto.create.topics", "false")
            .create::<AdminClient<DefaultClientContext>>()
            .map_err(client)?;
        // A heartbeat lost costs nothing (the next one comes an interval later): no
        // idempotence, and given up after a few intervals.
        let give_up = (heartbeats.interval * 5).max(Duration::from_secs(10));
        let producer = settings
            .consumer
            .connection_config()
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("message.timeout.ms", give_up.as_millis().to_string())
            .create_with_context(Deliveries {
                outcomes: Mutex::default(),
            })
            .map_err(client)?;
        Ok(Heartbeater {
            heartbeats: heartbeats.clone(),
            admin,
            producer,
            runtime: crate::native::runtime().map_err(|e| HeartbeatError::Client(e.to_string()))?,
            timeout: settings.options.startup_timeout,
            topic_ready: false,
        })
    }

    fn topic(&self) -> &str {
        &self.heartbeats.topic
    }

    fn passing(&self, operation: &'static str, reason: String) -> HeartbeatError {
        HeartbeatError::Passing {
            operation,
            topic: self.topic().to_owned(),
            reason,
            interval: self.heartbeats.interval,
        }
    }

    /// Makes the heartbeats topic on the source unless it is there.
    pub(crate) fn make_topic(&mut self) -> Result<(), HeartbeatError> {
        if self.topic_ready {
            return Ok(());
        }
        let topic = self.topic().to_owned();
        let metadata = self
            .admin
            .inner()
            .fetch_metadata(Some(&topic), self.timeout)
            .map_err(|e| self.passing("describe", e.to_string()))?;
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            let new_topic = NewTopic::new(&topic, 1, TopicReplication::Fixed(-1))
                .set("cleanup.policy", "delete")
                .set("retention.ms", RETENTION_MS);
            let opts = AdminOptions::new()
                .request_timeout(Some(self.timeout))
                .operation_timeout(Some(self.timeout));
            let results = self
                .runtime
                .block_on(self.admin.create_topics([&new_topic], &opts))
                .map_err(|e| self.passing("create", e.to_string()))?;
            for result in results {
                match result {
                    Ok(_) => tracing::info!(
                        "heartbeats: created source topic {topic} (1 partition, retention.ms \
                         {RETENTION_MS})"
                    ),
                    // Another instance of the group made it first.
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, code)) if refused(code) => {
                        return Err(HeartbeatError::Refused {
                            operation: "CREATE",
                            topic,
                            code,
                            hint: " (or create the topic yourself: 1 partition)",
                        })
                    }
                    Err((_, code)) => return Err(self.passing("create", code.to_string())),
                }
            }
        }
        self.topic_ready = true;
        Ok(())
    }

    /// Hands one heartbeat to the producer.
    fn write(&self) -> Result<(), HeartbeatError> {
        let written_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let value = serde_json::json!({
            "source": self.heartbeats.source,
            "written_ms": written_ms,
        })
        .to_string();
        let record = BaseRecord::to(self.topic())
            .partition(0)
            .key(self.heartbeats.source.as_str())
            .payload(value.as_str())
            .timestamp(written_ms);
        self.producer
            .send(record)
            .map_err(|(e, _)| self.passing("write", e.to_string()))
    }

    /// Serves delivery reports for up to `wait`: the outcomes since the last call.
    fn deliveries(&self, wait: Duration) -> Vec<Result<(), RDKafkaErrorCode>> {
        self.producer.poll(wait);
        std::mem::take(
            &mut *self
                .producer
                .context()
                .outcomes
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }
}

/// The heartbeat loop, until the mirror stops or the source refuses (logged once).
pub(crate) fn run(mut writer: Heartbeater, control: Arc<Control>, stats: Arc<Stats>) {
    let interval = writer.heartbeats.interval;
    let owned = (writer.topic().to_owned(), 0);
    let mut writing = false;
    // One line per streak of passing failures, not one per interval.
    let mut failing = false;
    let mut next = Instant::now();
    while !control.stop_requested() {
        let wait = next.saturating_duration_since(Instant::now());
        for outcome in writer.deliveries(wait.min(Duration::from_millis(200))) {
            match outcome {
                Ok(()) => {
                    Stats::add(&stats.heartbeats_written, 1);
                    failing = false;
                }
                Err(code) if refused(code) => {
                    tracing::warn!(
                        "{}",
                        HeartbeatError::Refused {
                            operation: "WRITE",
                            topic: owned.0.clone(),
                            code,
                            hint: "",
                        }
                    );
                    return;
                }
                Err(code) if !failing => {
                    failing = true;
                    tracing::warn!("{}", writer.passing("write", code.to_string()));
                }
                Err(_) => {}
            }
        }
        if Instant::now() < next {
            continue;
        }
        // Late (a slow source held a request up): the next one an interval from now, no burst.
        next = (next + interval).max(Instant::now());
        if let Err(e) = writer.make_topic() {
            if let HeartbeatError::Refused { .. } = e {
                tracing::warn!("{e}");
                return;
            }
            if !failing {
                failing = true;
                tracing::warn!("{e}");
            }
            continue;
        }
        let owner = stats.streams.own(&owned);
        if owner != writing {
            writing = owner;
            if owner {
                tracing::info!(
                    "heartbeats: this instance owns {}/0, writing a heartbeat every {interval:?}",
                    owned.0
                );
            } else {
                tracing::info!(
                    "heartbeats: {}/0 moved to another instance of the group, which writes them now",
                    owned.0
                );
            }
        }
        if owner {
            if let Err(e) = writer.write() {
                if !failing {
                    failing = true;
                    tracing::warn!("{e}");
                }
            }
        }
    }
    let _ = writer.producer.flush(Duration::from_secs(1));
}
