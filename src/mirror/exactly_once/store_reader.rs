//! Reading the offset-mapping store for a hand-over: committed records only, to the stable end
//! and then to the high watermark; and a look at the releases past the stable end.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use crate::mirror::clients::ReaderContext;
use crate::mirror::mapping::{OffsetMap, StoreOffset, StoreRecord, Trust};
use crate::mirror::Partition;
use crate::settings::client::ClientProps;

/// A reader of the whole store topic, committed records only, from its beginning.
pub(super) struct StoreReader {
    pub(super) topic: String,
    /// A read_uncommitted client: its watermarks are the high watermarks, not the stable
    /// ones; it also reads what lies past the stable end ([`StoreReader::released_past_stable_end`]).
    pub(super) watermarks: BaseConsumer<ReaderContext>,
    pub(super) consumer: BaseConsumer<ReaderContext>,
    pub(super) partitions: Vec<i32>,
    pub(super) map: OffsetMap,
    /// What a record must be to be taken: the map's rules, for the look past the stable end.
    pub(super) trust: Trust,
    /// Each store partition's last stable offset as the last [`StoreReader::read_to_stable_end`]
    /// found it.
    pub(super) stable_ends: Vec<(i32, i64)>,
}

impl StoreReader {
    pub(super) fn open(
        target: &ClientProps,
        topic: &str,
        trust: &Trust,
        timeout: Duration,
    ) -> Result<StoreReader, ReadError> {
        let client = |isolation: &str| {
            target
                .connection_config()
                .set("group.id", "mirror-maker-offset-mapping-reader")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                .set("isolation.level", isolation)
                .set("allow.auto.create.topics", "false")
                .create_with_context::<_, BaseConsumer<ReaderContext>>(ReaderContext)
                .map_err(|e| {
                    ReadError::Failed(format!(
                        "cannot make a reader of the offset-mapping topic {topic}: {e}"
                    ))
                })
        };
        let mut reader = StoreReader {
            topic: topic.to_owned(),
            watermarks: client("read_uncommitted")?,
            consumer: client("read_committed")?,
            partitions: Vec::new(),
            map: OffsetMap::trusting(trust.clone()),
            trust: trust.clone(),
            stable_ends: Vec::new(),
        };
        let metadata = reader
            .watermarks
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| reader.not_yet(e.to_string()))?;
        reader.partitions = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for p in &reader.partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .map_err(|e| reader.not_yet(e.to_string()))?;
        }
        reader
            .consumer
            .assign(&tpl)
            .map_err(|e| reader.not_yet(e.to_string()))?;
        Ok(reader)
    }

    pub(super) fn not_yet(&self, why: String) -> ReadError {
        ReadError::NotYet(format!(
            "cannot read the offset-mapping topic {}: {why}",
            self.topic
        ))
    }

    /// Reads on up to what is readable now: each partition's last stable offset (the first
    /// record of the oldest open transaction on it) as it is now.
    pub(super) fn read_to_stable_end(&mut self, patience: Duration) -> Result<(), ReadError> {
        // A read_committed client's watermarks are the last stable offsets (librdkafka asks
        // with its isolation level). Not the end-of-partition events: under a writer that
        // commits every 100 ms, a fetch rarely comes back empty, and they rarely come.
        let ends = self.ends(&self.consumer, patience)?;
        self.read_to(&ends, patience, "its last stable offset")?;
        self.stable_ends = ends;
        Ok(())
    }

    /// Which of `partitions` have a release (progress with no transactional id) past the
    /// stable end the last [`StoreReader::read_to_stable_end`] reached, up to the high
    /// watermark: records of open transactions included, read uncommitted. What the store
    /// says of such a partition up to the stable end is not its last word: its owner gave it
    /// up later, in a transaction committed behind another one still open (a stream's claim
    /// waiting for its ownership check, a crashed instance's), or about to commit. An owner
    /// named up to the stable end is fenced only if it has no such release: fencing a live
    /// instance that released cleanly would stop it. Records of aborted transactions are read
    /// too: a release among them only defers the decision to the read of the high watermark.
    pub(super) fn released_past_stable_end(
        &mut self,
        partitions: &[Partition],
        patience: Duration,
    ) -> Result<Vec<Partition>, ReadError> {
        let highs = self.ends(&self.watermarks, patience)?;
        let mut tail = TopicPartitionList::new();
        let mut ends = Vec::new();
        for (p, high) in &highs {
            let stable = self
                .stable_ends
                .iter()
                .find(|(s, _)| s == p)
                .map_or(0, |(_, end)| *end);
            if stable < *high {
                tail.add_partition_offset(&self.topic, *p, Offset::Offset(stable))
                    .map_err(|e| self.not_yet(e.to_string()))?;
                ends.push((*p, *high));
            }
        }
        let mut released = Vec::new();
        if ends.is_empty() {
            return Ok(released);
        }
        self.watermarks
            .assign(&tail)
            .map_err(|e| self.not_yet(e.to_string()))?;
        let deadline = Instant::now() + patience;
        loop {
            let positions = self
                .watermarks
                .position()
                .map_err(|e| self.not_yet(e.to_string()))?;
            let done = ends.iter().all(|(p, end)| {
                positions
                    .find_partition(&self.topic, *p)
                    .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
            });
            if done {
                break;
            }
            if Instant::now() >= deadline {
                let _ = self.watermarks.unassign();
                return Err(self.not_yet(format!(
                    "not read past its last stable offset up to its high watermark within \
                     {patience:?}"
                )));
            }
            match self.watermarks.poll(Duration::from_millis(100)) {
                None | Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Ok(m)) => {
                    let Some(key) = m.key() else { continue };
                    let Ok(Some(record)) = StoreRecord::decode(key, m.payload()) else {
                        continue;
                    };
                    if let StoreRecord::Progress(p) = &record {
                        let key = (p.topic.clone(), p.partition);
                        if p.transactional_id.is_none()
                            && partitions.contains(&key)
                            && !released.contains(&key)
                            && self.trust.check(&record).is_ok()
                        {
                            released.push(key);
                        }
                    }
                }
                Some(Err(e)) => {
                    let _ = self.watermarks.unassign();
                    return Err(self.not_yet(e.to_string()));
                }
            }
        }
        let _ = self.watermarks.unassign();
        Ok(released)
    }

    /// Reads on up to each partition's high watermark as it is now: this waits for every
    /// transaction begun before now to end, so that a progress committed just before this
    /// stream was assigned its partition (the previous owner's release) is never missed
    /// behind another stream's open transaction.
    pub(super) fn read_to_high_watermark(&mut self, patience: Duration) -> Result<(), ReadError> {
        let ends = self.ends(&self.watermarks, patience)?;
        self.read_to(
            &ends,
            patience,
            "its high watermark (a transaction on it is still open: \
             a crashed instance's, aborted when its partitions' next owner fences it, or by the \
             target after its transaction.timeout.ms)",
        )
    }

    /// Each partition's end offset as `client` sees it (by its isolation level).
    pub(super) fn ends(
        &self,
        client: &BaseConsumer<ReaderContext>,
        patience: Duration,
    ) -> Result<Vec<(i32, i64)>, ReadError> {
        let mut ends = Vec::with_capacity(self.partitions.len());
        for p in &self.partitions {
            let (_, end) = client
                .fetch_watermarks(&self.topic, *p, patience)
                .map_err(|e| self.not_yet(e.to_string()))?;
            ends.push((*p, end));
        }
        Ok(ends)
    }

    /// Polls until the reader's position in each partition reaches its end in `ends`
    /// (librdkafka moves the position past transaction markers and aborted records).
    pub(super) fn read_to(
        &mut self,
        ends: &[(i32, i64)],
        patience: Duration,
        what: &str,
    ) -> Result<(), ReadError> {
        let deadline = Instant::now() + patience;
        loop {
            let positions = self
                .consumer
                .position()
                .map_err(|e| self.not_yet(e.to_string()))?;
            let done = ends.iter().all(|(p, end)| {
                *end <= 0
                    || positions
                        .find_partition(&self.topic, *p)
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
            });
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.not_yet(format!("not read up to {what} within {patience:?}")));
            }
            self.poll()?;
        }
    }

    /// One poll: a record is applied to the map (one it cannot decode or trust is skipped and
    /// counted there: a bad record never stops the hand-over).
    pub(super) fn poll(&mut self) -> Result<(), ReadError> {
        match self.consumer.poll(Duration::from_millis(100)) {
            None => Ok(()),
            Some(Ok(m)) => {
                let Some(key) = m.key() else { return Ok(()) };
                let at = StoreOffset {
                    topic: &self.topic,
                    partition: m.partition(),
                    offset: m.offset(),
                };
                self.map.read(key, m.payload(), at);
                Ok(())
            }
            Some(Err(KafkaError::PartitionEOF(_))) => Ok(()),
            Some(Err(e)) => Err(self.not_yet(e.to_string())),
        }
    }
}

/// Why the store could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// Not now (a transaction on it still open, a time-out): try again.
    NotYet(String),
    /// For good.
    Failed(String),
}
