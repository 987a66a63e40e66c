//! Records the batch codec cannot encode again, sent through librdkafka's producer.
//!
//! A batch that must be encoded again (a start inside it, gaps, LogAppendTime, too large) and
//! holds a record whose headers repeat a key cannot go through the `kafka-protocol` crate's
//! encoder, whose `Record` keeps headers in a map. Its records, read as they are
//! ([`plain_records`](super::batch::plain_records)), go instead through a librdkafka producer
//! of the target (idempotent, `acks=all`, the source batch's codec, the producer config's
//! connection and security keys), which carries headers as a list. The engine sends them only
//! once everything before them of their partition is acknowledged, and waits for every report
//! before anything after them is sent: order per partition holds across the two producers.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_protocol::records::Compression;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientConfig;

use super::batch::PlainRecord;
use crate::mirror::clients::{self, Cluster};
// librdkafka's default `batch.size`, which is its default `message.max.bytes` too.
use crate::mirror::limits::DEFAULT_BATCH_SIZE;
use crate::native::produce::{produce, Outgoing, RawHeaders};

/// Collects one send's delivery reports: per record (the opaque is its index), its target
/// offset or the error.
#[derive(Default)]
pub(crate) struct Reports(Mutex<Vec<(usize, Result<i64, KafkaError>)>>);

impl ClientContext for Reports {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        clients::librdkafka_log(Cluster::Target, level, fac, message);
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let outcome = match result {
            Ok(delivered) => Ok(delivered.offset()),
            Err((error, _)) => Err(error.clone()),
        };
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, outcome));
    }
}

/// A send that did not land whole: the code and what happened, for the engine's refusal.
#[derive(Debug, Clone)]
pub(crate) struct PlainFailure {
    pub(crate) code: String,
    pub(crate) message: String,
}

/// The librdkafka producers for plain records, one per codec and batch limit, made when first
/// needed.
pub(crate) struct PlainProducers {
    config: ClientConfig,
    /// How long one send may take: librdkafka's `message.timeout.ms` for these producers.
    wait: Duration,
    by_codec: HashMap<(i16, usize), BaseProducer<Reports>>,
}

fn codec_name(compression: Compression) -> &'static str {
    match compression {
        Compression::None => "none",
        Compression::Gzip => "gzip",
        Compression::Snappy => "snappy",
        Compression::Lz4 => "lz4",
        Compression::Zstd => "zstd",
    }
}

impl PlainProducers {
    /// From the target producer's librdkafka config; a send waits at most `wait`.
    pub(crate) fn new(mut config: ClientConfig, wait: Duration) -> PlainProducers {
        let ms = wait.as_millis().max(1).to_string();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            // A send is over when every record is reported: delivered, or failed in time.
            // `enable.gapless.guarantee` stays the config's (on with --abort.on.send.failure
            // true): a record refused for good lets none after it land.
            .set("message.timeout.ms", &ms);
        PlainProducers {
            config,
            wait,
            by_codec: HashMap::new(),
        }
    }

    /// Sends `records` to `topic`/`partition` with `compression`, in batches of at most
    /// `max_batch` bytes (the target topic's limit: librdkafka's `batch.size`, which it would
    /// otherwise fill up to 1 MB whatever the topic takes), in order, and waits for every
    /// report: the target offset of each, or why it is not there. With `every_report` false
    /// the first failure ends the send (`Err`; the records may then be on the target in part,
    /// or whole: a report may be lost); with it true (skip mode), each record's outcome is in
    /// its place of the answer: refused, not queued, or unreported within the wait (given up:
    /// it may still land), and the others landed. A producer that failed is not used again:
    /// the next send makes a new one.
    pub(crate) fn send(
        &mut self,
        topic: &str,
        partition: i32,
        compression: Compression,
        max_batch: usize,
        records: &[PlainRecord],
        every_report: bool,
    ) -> Result<Vec<Result<i64, PlainFailure>>, PlainFailure> {
        let codec = (compression as i16, max_batch);
        let producer = match self.by_codec.remove(&codec) {
            Some(producer) => producer,
            None => {
                let mut config = self.config.clone();
                let limit = config
                    .get("message.max.bytes")
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(DEFAULT_BATCH_SIZE)
                    .min(DEFAULT_BATCH_SIZE)
                    .min(max_batch);
                config
                    .set("compression.type", codec_name(compression))
                    .set("batch.size", limit.to_string());
                config
                    .create_with_context(Reports::default())
                    .map_err(|e| failure("ProducerCreate", e.to_string()))?
            }
        };
        let reports = send_with(
            &producer,
            self.wait,
            topic,
            partition,
            records,
            every_report,
        )?;
        if reports.iter().all(Result::is_ok) {
            self.by_codec.insert(codec, producer);
        }
        Ok(reports)
    }
}

fn failure(code: &str, message: String) -> PlainFailure {
    PlainFailure {
        code: code.to_owned(),
        message,
    }
}

fn send_with(
    producer: &BaseProducer<Reports>,
    wait: Duration,
    topic: &str,
    partition: i32,
    records: &[PlainRecord],
    every_report: bool,
) -> Result<Vec<Result<i64, PlainFailure>>, PlainFailure> {
    let name = CString::new(topic)
        .map_err(|_| failure("InvalidTopic", format!("topic {topic:?} holds a NUL byte")))?;
    // Records from `queued` on were not handed to librdkafka, for this reason.
    let mut queued = records.len();
    let mut not_queued: Option<PlainFailure> = None;
    'records: for (index, record) in records.iter().enumerate() {
        let mut headers = RawHeaders::none();
        for (key, value) in &record.headers {
            headers.add(key, value.as_deref());
        }
        let mut out = Outgoing {
            partition: Some(partition),
            key: record.key.as_deref(),
            value: record.value.as_deref(),
            timestamp: Some(record.timestamp),
            headers,
            opaque: index,
        };
        // A full queue empties as reports come in.
        let deadline = Instant::now() + wait;
        loop {
            match produce(producer, &name, &mut out) {
                Ok(()) => break,
                Err(RDKafkaErrorCode::QueueFull) if Instant::now() < deadline => {
                    producer.poll(Duration::from_millis(10));
                }
                Err(code) => {
                    let why = failure(
                        &format!("{code:?}"),
                        format!("source offset {}: {code}", record.offset),
                    );
                    if !every_report {
                        return Err(why);
                    }
                    queued = index;
                    not_queued = Some(why);
                    break 'records;
                }
            }
        }
    }
    // librdkafka reports every record within its message timeout (`wait`); a little more for
    // the report itself.
    let limit = wait + Duration::from_secs(5);
    let deadline = Instant::now() + limit;
    let mut outcomes: Vec<Option<Result<i64, PlainFailure>>> = std::iter::repeat_with(|| None)
        .take(records.len())
        .collect();
    let mut reported = 0;
    while reported < queued {
        if Instant::now() >= deadline {
            let unreported = failure(
                "NoReport",
                format!(
                    "{} of {} records unreported by librdkafka within {limit:?}",
                    queued - reported,
                    records.len()
                ),
            );
            if !every_report {
                return Err(unreported);
            }
            for slot in outcomes[..queued].iter_mut().filter(|slot| slot.is_none()) {
                *slot = Some(Err(unreported.clone()));
            }
            break;
        }
        producer.poll(Duration::from_millis(10));
        let reports = std::mem::take(
            &mut *producer
                .context()
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (index, outcome) in reports {
            let Some(slot) = outcomes[..queued]
                .get_mut(index)
                .filter(|slot| slot.is_none())
            else {
                continue;
            };
            reported += 1;
            *slot = Some(match outcome {
                Ok(offset) => Ok(offset),
                Err(error) if every_report => {
                    Err(failure(&clients::code_name(&error), error.to_string()))
                }
                Err(error) => {
                    return Err(failure(
                        &clients::code_name(&error),
                        format!("source offset {}: {error}", records[index].offset),
                    ))
                }
            });
        }
    }
    if let Some(why) = not_queued {
        for slot in &mut outcomes[queued..] {
            *slot = Some(Err(why.clone()));
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}
