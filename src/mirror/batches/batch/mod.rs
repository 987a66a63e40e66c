//! The batch codec: a partition's `records` bytes from a Fetch response split into record
//! batches ([`split`]), and each batch made ready for our own idempotent Produce ([`prepare`]).
//!
//! Pure: no network, no clock. Most batches are *copied*: the records section is the fetch
//! response's bytes (a `Bytes` slice, no copy) and only the producer's fields of the 61-byte
//! header are rewritten, the CRC-32C computed again. A batch Kafka's `LogValidator` would refuse
//! from a producer as it is, or that would give the target other records than the source holds,
//! is decoded and encoded again, same compression ([`Reencode`] says why): its records as bytes
//! by [`records`], its header written here, its compression [`codec`]'s, as a stream. What
//! is rewritten and why: docs/batch-engine.md.
//!
//! Errors name the source offset of the batch (or record) at fault; the engine adds the topic
//! and partition.
//!
//! - [`records`]: the records section as bytes (keys, values, header names and values; headers
//!   in order, repeats kept), not the crate's `Record`, whose header names are strings in a map;
//! - [`codec`]: the five compressions as streams (a records section read and written record by
//!   record, never decompressed whole; snappy in Kafka's xerial framing);
//! - [`legacy`]: message sets of the formats before Kafka 0.11 (magic 0 and 1), which the
//!   crate cannot read, read here and made v2 batches that take the same path.

// The engine around this codec (issue 22) is built beside it; until it calls the codec, only
// the tests do. Remove once the engine is merged.
#![allow(dead_code)]

mod codec;
mod legacy;
mod records;
// Unit tests beside `tests`: [`reencode_tests`], every path that encodes a batch again, on
// source batches written and outgoing batches read back byte by byte.
#[cfg(test)]
mod reencode_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;

use std::io::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use crc32c::crc32c;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE,
};

use records::{Head, Record, Section, Stream, StreamError};

// Where each field of a v2 record batch header starts (Kafka's `DefaultRecordBatch`). The
// only place the layout is written down.
const BASE_OFFSET_AT: usize = 0;
const LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// The CRC-32C covers the batch from here to its end.
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;
/// The header's length, where the records section starts.
pub(crate) const HEADER_LEN: usize = 61;
/// The base offset and the length field: the bytes the length does not count.
const LOG_OVERHEAD: usize = 12;

// The attribute bits (`DefaultRecordBatch`'s masks).
const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;
const DELETE_HORIZON_BIT: i16 = 0x40;

/// The record batch format this codec forwards (Kafka 0.11 and later).
const MAGIC_V2: i8 = 2;

/// The CRC-32C polynomial, reflected (bit 31 is x^0).
const CRC32C_POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the CRC-32C polynomial (zlib's `multmodp`).
const fn mul_mod_poly(a: u32, mut b: u32) -> u32 {
    let mut m: u32 = 1 << 31;
    let mut p: u32 = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 {
            (b >> 1) ^ CRC32C_POLY
        } else {
            b >> 1
        };
    }
}

/// `x^(2^n)` modulo the polynomial, for n from 0 to 31.
const X_POW_2N: [u32; 32] = {
    let mut table = [0; 32];
    let mut p: u32 = 1 << 30; // x^1
    let mut n = 0;
    while n < 32 {
        table[n] = p;
        p = mul_mod_poly(p, p);
        n += 1;
    }
    table
};

/// The CRC-32C of `A` then `B` from the CRC-32C of each and the length of `B` (zlib's
/// `crc32_combine`): about 32 shifts per bit set in the length. The `crc32c` crate's own
/// combine squares 32x32 matrices per bit of the length, which measured 45 µs per 830 KB batch,
/// more than reading a 16 KB batch again.
fn crc_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    // x^(8 * len_b): k starts at 3, x^(2^3) being one byte of zeros.
    let mut shift: u32 = 1 << 31;
    let (mut len, mut k) = (len_b, 3);
    while len != 0 {
        if len & 1 != 0 {
            shift = mul_mod_poly(X_POW_2N[k & 31], shift);
        }
        len >>= 1;
        k += 1;
    }
    mul_mod_poly(shift, crc_a) ^ crc_b
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

fn i16_at(bytes: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(field(bytes, at))
}

fn i32_at(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(field(bytes, at))
}

fn i64_at(bytes: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(field(bytes, at))
}

/// What went wrong with a batch; each names the source offset at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BatchError {
    #[error(
        "the record batch at offset {offset} fails its CRC-32C check (stored {stored:#010x}, \
         computed {computed:#010x}): the fetch response or the source log is damaged; fetch \
         from offset {offset} again, and if it recurs check the source partition's log segment"
    )]
    Crc {
        offset: i64,
        stored: u32,
        computed: u32,
    },
    #[error(
        "the record batch at offset {offset} is malformed: {reason}; fetch from offset {offset} \
         again, and if it recurs check the source partition's log segment"
    )]
    Malformed { offset: i64, reason: String },
    #[error(
        "the message at offset {offset}, in the message format v{magic} of Kafka before 0.11, \
         cannot be read: {reason}; fetch from offset {offset} again, and if it recurs check \
         the source partition's log segment (kafka-dump-log --deep-iteration)"
    )]
    Legacy {
        offset: i64,
        magic: i8,
        reason: String,
    },
    #[error(
        "the record batch at offset {offset} could not be decoded to be encoded again: {reason}; \
         mirror this topic with --copy.mode records"
    )]
    Decode { offset: i64, reason: String },
    #[error("the records from offset {offset} could not be encoded again: {reason}")]
    Encode { offset: i64, reason: String },
    #[error(
        "the record at offset {offset} makes a batch of {size} bytes alone, above the target \
         topic's limit of {limit} bytes (max.message.bytes): raise the target topic's \
         max.message.bytes to at least {size}"
    )]
    RecordTooLarge {
        offset: i64,
        size: usize,
        limit: usize,
    },
    #[error(
        "the record batch at offset {offset} (to offset {last_offset}) cannot be encoded again: \
         a snappy block of its records section states {size} bytes uncompressed, more than the \
         {limit} bytes the batch engine decompresses at once (raw snappy, as librdkafka writes \
         it, is one block): its records are a send failure; copy this topic with --copy.mode \
         records, or skip them with --abort.on.send.failure false"
    )]
    BlockTooLarge {
        offset: i64,
        last_offset: i64,
        size: usize,
        limit: usize,
    },
    #[error(
        "the producer stamp for the batch at offset {offset} has producer id {producer_id} \
         and base sequence {base_sequence}; Kafka refuses a negative sequence with a producer \
         id (a defect of the batch engine: report it)"
    )]
    Stamp {
        offset: i64,
        producer_id: i64,
        base_sequence: i32,
    },
}

/// One record batch (magic 2) as a view over the fetch response's bytes (no copy); its length
/// and CRC-32C were checked when [`split`] made it.
#[derive(Clone, Debug)]
pub(crate) struct SourceBatch {
    /// The whole batch, header included.
    bytes: Bytes,
    /// The CRC-32C of the records section alone, kept so a copy computes the batch's new CRC
    /// from its new header without reading the records again.
    records_crc: u32,
}

impl SourceBatch {
    /// Checks a whole batch (its length field already matched against `bytes`).
    fn new(bytes: Bytes) -> Result<Self, BatchError> {
        let offset = i64_at(&bytes, BASE_OFFSET_AT);
        let malformed = |reason: String| BatchError::Malformed { offset, reason };
        let records_crc = crc32c(&bytes[HEADER_LEN..]);
        let computed = crc_combine(
            crc32c(&bytes[ATTRIBUTES_AT..HEADER_LEN]),
            records_crc,
            bytes.len() - HEADER_LEN,
        );
        let stored = u32::from_be_bytes(field(&bytes, CRC_AT));
        if stored != computed {
            return Err(BatchError::Crc {
                offset,
                stored,
                computed,
            });
        }
        let batch = Self { bytes, records_crc };
        let codec = batch.attributes() & COMPRESSION_MASK;
        if codec > Compression::Zstd as i16 {
            return Err(malformed(format!(
                "its compression codec {codec} is none Kafka knows (0 to 4)"
            )));
        }
        if batch.record_count() < 0 || batch.last_offset_delta() < 0 {
            return Err(malformed(format!(
                "it counts {} records and a last offset delta of {}",
                batch.record_count(),
                batch.last_offset_delta()
            )));
        }
        Ok(batch)
    }

    pub(crate) fn base_offset(&self) -> i64 {
        i64_at(&self.bytes, BASE_OFFSET_AT)
    }

    /// The offset of the batch's last record as the source wrote it: base + lastOffsetDelta,
    /// also when compaction removed that record. The engine resumes after it.
    pub(crate) fn last_offset(&self) -> i64 {
        self.base_offset() + i64::from(self.last_offset_delta())
    }

    pub(crate) fn last_offset_delta(&self) -> i32 {
        i32_at(&self.bytes, LAST_OFFSET_DELTA_AT)
    }

    pub(crate) fn record_count(&self) -> i32 {
        i32_at(&self.bytes, RECORD_COUNT_AT)
    }

    /// Compaction removed records from it: its offsets are not contiguous.
    pub(crate) fn has_gaps(&self) -> bool {
        i64::from(self.last_offset_delta()) + 1 != i64::from(self.record_count())
    }

    fn attributes(&self) -> i16 {
        i16_at(&self.bytes, ATTRIBUTES_AT)
    }

    pub(crate) fn is_control(&self) -> bool {
        self.attributes() & CONTROL_BIT != 0
    }

    pub(crate) fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_BIT != 0
    }

    /// The log cleaner set a delete horizon (KIP-534): the base timestamp is that horizon, and
    /// the records' timestamp deltas are relative to it.
    pub(crate) fn has_delete_horizon(&self) -> bool {
        self.attributes() & DELETE_HORIZON_BIT != 0
    }

    pub(crate) fn producer_id(&self) -> i64 {
        i64_at(&self.bytes, PRODUCER_ID_AT)
    }

    pub(crate) fn producer_epoch(&self) -> i16 {
        i16_at(&self.bytes, PRODUCER_EPOCH_AT)
    }

    pub(crate) fn base_sequence(&self) -> i32 {
        i32_at(&self.bytes, BASE_SEQUENCE_AT)
    }

    pub(crate) fn compression(&self) -> Compression {
        match self.attributes() & COMPRESSION_MASK {
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            // 5 to 7 were refused in `new`.
            _ => Compression::None,
        }
    }

    /// The broker stamped its append time on the batch: every record's timestamp is the
    /// batch's max timestamp.
    pub(crate) fn log_append_time(&self) -> bool {
        self.attributes() & TIMESTAMP_TYPE_BIT != 0
    }

    pub(crate) fn magic(&self) -> i8 {
        self.bytes[MAGIC_AT] as i8
    }

    /// The whole batch in bytes, header included: what `max.message.bytes` is compared with.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn base_timestamp(&self) -> i64 {
        i64_at(&self.bytes, BASE_TIMESTAMP_AT)
    }

    pub(crate) fn max_timestamp(&self) -> i64 {
        i64_at(&self.bytes, MAX_TIMESTAMP_AT)
    }

    pub(crate) fn partition_leader_epoch(&self) -> i32 {
        i32_at(&self.bytes, PARTITION_LEADER_EPOCH_AT)
    }

    /// The whole batch as it came.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// Splits a partition's `records` bytes from a Fetch response into batches.
///
/// A truncated batch at the end (the broker cuts the last batch at the fetch's max bytes) ends
/// the iteration without an error; [`Batches::remainder`] then says how many bytes it had. A
/// corrupt batch (CRC-32C, length, codec) is an error naming its offset; the iteration ends
/// after an error. Messages of the formats before Kafka 0.11 (magic 0 and 1) come as v2
/// batches made from them (`legacy`).
pub(crate) fn split(records: Bytes) -> Batches {
    Batches {
        rest: records,
        stopped: false,
    }
}

/// The batches of one partition's `records` bytes; see [`split`].
#[derive(Debug)]
pub(crate) struct Batches {
    rest: Bytes,
    stopped: bool,
}

impl Batches {
    /// The bytes not yet read: after the iteration ends without an error, the length of the
    /// truncated batch at the end (0 when there is none). A fetch whose first batch is cut
    /// yields nothing and leaves its length here: fetch more bytes.
    pub(crate) fn remainder(&self) -> usize {
        self.rest.len()
    }

    fn next_batch(&mut self) -> Result<Option<SourceBatch>, BatchError> {
        let rest = &self.rest;
        // Too short to hold the magic byte: a batch cut short (or nothing).
        if rest.len() <= MAGIC_AT {
            return Ok(None);
        }
        let offset = i64_at(rest, BASE_OFFSET_AT);
        let length = i32_at(rest, LENGTH_AT);
        let magic = rest[MAGIC_AT] as i8;
        match magic {
            MAGIC_V2 => {}
            0 | 1 => return legacy::next_run(&mut self.rest),
            _ => {
                return Err(BatchError::Malformed {
                    offset,
                    reason: format!("its magic byte {magic} is none Kafka knows (0, 1 or 2)"),
                })
            }
        }
        let least = (HEADER_LEN - LOG_OVERHEAD) as i32;
        if length < least {
            return Err(BatchError::Malformed {
                offset,
                reason: format!(
                    "its length field says {length} bytes, less than the {least} of a header"
                ),
            });
        }
        let total = LOG_OVERHEAD + length as usize;
        if rest.len() < total {
            return Ok(None);
        }
        let bytes = self.rest.split_to(total);
        SourceBatch::new(bytes).map(Some)
    }
}

impl Iterator for Batches {
    type Item = Result<SourceBatch, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.stopped {
            return None;
        }
        match self.next_batch() {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => None,
            Err(e) => {
                self.stopped = true;
                Some(Err(e))
            }
        }
    }
}

/// Producer fields our idempotent producer stamps on an outgoing batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// The sequence that follows `increment` records from `sequence`: Kafka's
/// `DefaultRecordBatch.incrementSequence`, which wraps from `i32::MAX` to 0.
pub(crate) fn next_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// A batch ready for a Produce request, plus what the engine needs to track it.
///
/// The batch is `header` followed by `body`: for a copied batch `body` is the source's records
/// section, a slice of the fetch response (no copy), so a vectored write can send both without
/// joining them; [`OutBatch::to_bytes`] joins them (one copy of the records) where the request
/// is encoded into one buffer, as the `kafka-protocol` crate's `ProduceRequest` does with its
/// `records: Option<Bytes>`. A Produce request carries exactly one v2 batch per partition
/// (Kafka refuses more: `ProduceRequest.validateRecords`), so each `OutBatch` is one
/// partition's records of one request.
#[derive(Clone, Debug)]
pub(crate) struct OutBatch {
    /// The rewritten header, CRC-32C included.
    pub(crate) header: [u8; HEADER_LEN],
    /// The records section.
    pub(crate) body: Bytes,
    /// Records in it: the sequence numbers it uses.
    pub(crate) records: i32,
    /// The source offsets of its first and last records.
    pub(crate) first_source_offset: i64,
    pub(crate) last_source_offset: i64,
    /// The source offset of each record, in order, when they are not contiguous (a compacted
    /// source): target offset `base + i` holds source offset `source_offsets[i]`. `None` means
    /// `first_source_offset + i`.
    pub(crate) source_offsets: Option<Vec<i64>>,
    /// Decoded and encoded again rather than copied.
    pub(crate) reencoded: bool,
    /// The CRC-32C of `body` alone, for [`OutBatch::restamp`].
    body_crc: u32,
}

impl OutBatch {
    /// The whole batch in bytes: what the target compares with its `max.message.bytes`.
    pub(crate) fn size(&self) -> usize {
        HEADER_LEN + self.body.len()
    }

    /// What it charges `--throttle.bytes.per.second` and `--throttle.records.per.second`: its
    /// bytes as sent (header and records section, compressed as it came; the records are not
    /// decompressed to count their keys and values) and its record count.
    pub(crate) fn throttle_cost(&self) -> (u64, u64) {
        (self.size() as u64, self.records.max(0) as u64)
    }

    /// The timestamp of its newest record (its header's max timestamp: the source's, or, for
    /// a LogAppendTime batch, the source's append time); negative when the batch has none.
    pub(crate) fn max_timestamp(&self) -> i64 {
        i64_at(&self.header, MAX_TIMESTAMP_AT)
    }

    /// The base sequence stamped on it.
    pub(crate) fn base_sequence(&self) -> i32 {
        i32_at(&self.header, BASE_SEQUENCE_AT)
    }

    /// The source offset of the record at `index` in this batch.
    pub(crate) fn source_offset(&self, index: usize) -> i64 {
        match &self.source_offsets {
            Some(offsets) => offsets[index],
            None => self.first_source_offset + index as i64,
        }
    }

    /// Stamps other producer fields on the batch (a new producer id or epoch, or sequences
    /// moved after an earlier batch was refused): the header rewritten and its CRC-32C computed
    /// again, the records untouched.
    pub(crate) fn restamp(&mut self, stamp: Stamp) {
        let attributes = i16_at(&self.header, ATTRIBUTES_AT);
        stamp_header(
            &mut self.header,
            attributes,
            stamp,
            self.body_crc,
            self.body.len(),
        );
    }

    /// Writes the batch, header then records section.
    pub(crate) fn put_into(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.header);
        buf.put_slice(&self.body);
    }

    /// The batch in one buffer (a copy of the records section).
    pub(crate) fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(self.size());
        self.put_into(&mut buf);
        buf.freeze()
    }

    /// The batch in one buffer to send, and itself with its records section now a part of
    /// that buffer: it no longer holds the fetch answer it was cut from, whose buffer is then
    /// free for the next answer (a queued batch would otherwise keep the whole answer alive
    /// beside its own copy, for as long as it waits and is in flight).
    pub(crate) fn detach(mut self) -> (OutBatch, Bytes) {
        let bytes = self.rejoin();
        (self, bytes)
    }

    /// The batch in one buffer to send, its records section now a part of that buffer (see
    /// [`OutBatch::detach`]); after [`OutBatch::restamp`], the bytes that carry the new stamp.
    pub(crate) fn rejoin(&mut self) -> Bytes {
        let bytes = self.to_bytes();
        self.body = bytes.slice(HEADER_LEN..);
        bytes
    }
}

/// Why a batch is dropped rather than sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// A transaction marker: the target's own markers come from its own transactions, and
    /// `LogValidator.validateBatch` refuses control batches from clients.
    Control,
    /// All its records are before the start offset: copied already.
    BeforeStart,
    /// No records left (compaction keeps empty batches for a producer's state).
    Empty,
}

/// Why a batch is decoded and encoded again instead of copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reencode {
    /// The start offset falls inside it: the records before it were copied already.
    StartInside,
    /// Its offsets have gaps (compaction): `LogValidator.validateBatch` refuses a client
    /// batch whose offset range disagrees with its record count.
    Gaps,
    /// LogAppendTime: the records' timestamps are the batch's max timestamp, which a header
    /// rewrite cannot give them (their deltas sit in the records section), and a producer may
    /// not send LogAppendTime (`LogValidator.validateTimestamp`).
    LogAppendTime,
    /// Larger than the target topic takes (`max.message.bytes`): split.
    TooLarge,
}

/// What [`prepare`] does with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Drop(Dropped),
    Copy,
    Reencode(Reencode),
}

/// What [`prepare`] does with `batch` when the engine wants records from `start` on and the
/// target takes batches of at most `max_bytes`: the first reason that applies.
pub(crate) fn plan(batch: &SourceBatch, start: i64, max_bytes: usize) -> Plan {
    if batch.is_control() {
        Plan::Drop(Dropped::Control)
    } else if batch.last_offset() < start {
        Plan::Drop(Dropped::BeforeStart)
    } else if batch.record_count() == 0 {
        Plan::Drop(Dropped::Empty)
    } else if start > batch.base_offset() {
        Plan::Reencode(Reencode::StartInside)
    } else if batch.has_gaps() {
        Plan::Reencode(Reencode::Gaps)
    } else if batch.log_append_time() {
        Plan::Reencode(Reencode::LogAppendTime)
    } else if batch.size() > max_bytes {
        Plan::Reencode(Reencode::TooLarge)
    } else {
        Plan::Copy
    }
}

/// What to do with one source batch when the engine wants records from `start` on and the
/// target topic takes batches of at most `max_bytes` (its `max.message.bytes`): copied (header
/// rewritten), encoded again (one or more batches, each at most `max_bytes`), or dropped (an
/// empty list: a control batch, or nothing at or after `start`). The batches use sequences
/// from `stamp.base_sequence` on, one per record, in order.
///
/// Aborted transactions are the engine's to drop (it has the fetch response's list); a
/// transactional batch that reaches here is sent as a plain idempotent one.
pub(crate) fn prepare(
    batch: &SourceBatch,
    start: i64,
    max_bytes: usize,
    stamp: Stamp,
) -> Result<Vec<OutBatch>, BatchError> {
    if stamp.producer_id >= 0 && stamp.base_sequence < 0 {
        return Err(BatchError::Stamp {
            offset: batch.base_offset(),
            producer_id: stamp.producer_id,
            base_sequence: stamp.base_sequence,
        });
    }
    match plan(batch, start, max_bytes) {
        Plan::Drop(_) => Ok(Vec::new()),
        Plan::Copy => Ok(vec![copy(batch, stamp)]),
        Plan::Reencode(_) => reencode(batch, start..i64::MAX, max_bytes, stamp),
    }
}

/// The records of `batch` from `start` up to `end` (not included), encoded again as
/// [`prepare`] encodes them: the part of a batch before a record that the target topic cannot
/// take ([`BatchError::RecordTooLarge`]), sent before that record's refusal. An empty list when
/// none is in the range.
pub(crate) fn prepare_before(
    batch: &SourceBatch,
    start: i64,
    end: i64,
    max_bytes: usize,
    stamp: Stamp,
) -> Result<Vec<OutBatch>, BatchError> {
    if batch.is_control() || batch.record_count() == 0 || end <= start {
        return Ok(Vec::new());
    }
    reencode(batch, start..end, max_bytes, stamp)
}

/// Rewrites what belongs to the producer: base offset 0, no partition leader epoch,
/// `attributes`, our producer id, epoch and base sequence; then the CRC-32C from the new header
/// and the records section's own CRC.
fn stamp_header(
    header: &mut [u8; HEADER_LEN],
    attributes: i16,
    stamp: Stamp,
    records_crc: u32,
    records_len: usize,
) {
    header[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&0i64.to_be_bytes());
    header[PARTITION_LEADER_EPOCH_AT..MAGIC_AT]
        .copy_from_slice(&NO_PARTITION_LEADER_EPOCH.to_be_bytes());
    header[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&attributes.to_be_bytes());
    header[PRODUCER_ID_AT..PRODUCER_EPOCH_AT].copy_from_slice(&stamp.producer_id.to_be_bytes());
    header[PRODUCER_EPOCH_AT..BASE_SEQUENCE_AT]
        .copy_from_slice(&stamp.producer_epoch.to_be_bytes());
    header[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&stamp.base_sequence.to_be_bytes());
    let crc = crc_combine(crc32c(&header[ATTRIBUTES_AT..]), records_crc, records_len);
    header[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
}

/// The copy path: the header rewritten, the records section untouched. The transactional bit
/// is cleared (our producer is idempotent, not transactional), and so is the delete horizon
/// (the target's cleaner keeps its own; the records' timestamps stay right, their deltas being
/// relative to the base timestamp, which stays).
fn copy(batch: &SourceBatch, stamp: Stamp) -> OutBatch {
    let mut header = field::<HEADER_LEN>(&batch.bytes, 0);
    let attributes = batch.attributes() & !(TRANSACTIONAL_BIT | DELETE_HORIZON_BIT);
    let body = batch.bytes.slice(HEADER_LEN..);
    stamp_header(
        &mut header,
        attributes,
        stamp,
        batch.records_crc,
        body.len(),
    );
    OutBatch {
        header,
        body,
        records: batch.record_count(),
        first_source_offset: batch.base_offset(),
        last_source_offset: batch.last_offset(),
        source_offsets: None,
        reencoded: false,
        body_crc: batch.records_crc,
    }
}

/// The records section decompressed whole (the tests' judge, never the engine's path: the
/// engine reads a section as a stream, [`encode_again`]).
#[cfg(test)]
fn decompress(body: Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    use std::io::Read as _;
    let mut plain = Vec::new();
    codec::reader(&body, compression)?.read_to_end(&mut plain)?;
    Ok(Bytes::from(plain))
}

/// The records section compressed whole, the records written into it by `write`: for what is
/// in memory already and small (a legacy run's batch, the tests' batches).
fn compress(
    compression: Compression,
    write: impl FnOnce(&mut BytesMut),
) -> anyhow::Result<BytesMut> {
    let mut plain = BytesMut::new();
    write(&mut plain);
    if compression == Compression::None {
        return Ok(plain);
    }
    Ok(BytesMut::from(&codec::compress(compression, &plain)?[..]))
}

/// An encoded batch: its header (no producer, CreateTime, CRC-32C computed) and its records
/// section, with that section's own CRC-32C.
struct Encoded {
    header: [u8; HEADER_LEN],
    body: Bytes,
    body_crc: u32,
}

impl Encoded {
    fn size(&self) -> usize {
        HEADER_LEN + self.body.len()
    }
}

/// What a batch header says besides its records section.
struct HeaderFields {
    base_offset: i64,
    compression: Compression,
    last_offset_delta: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
}

/// A v2 batch of `fields` around `body`, as Kafka's `DefaultRecordBatch` lays it out: no
/// partition leader epoch, no producer, CreateTime. `offset` names the records in an error.
fn encoded(fields: HeaderFields, body: Bytes, offset: i64) -> Result<Encoded, BatchError> {
    let length =
        i32::try_from(HEADER_LEN - LOG_OVERHEAD + body.len()).map_err(|_| BatchError::Encode {
            offset,
            reason: format!(
                "a records section of {} bytes is too large for a batch",
                body.len()
            ),
        })?;
    let mut header = [0u8; HEADER_LEN];
    header[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&fields.base_offset.to_be_bytes());
    header[LENGTH_AT..PARTITION_LEADER_EPOCH_AT].copy_from_slice(&length.to_be_bytes());
    header[PARTITION_LEADER_EPOCH_AT..MAGIC_AT]
        .copy_from_slice(&NO_PARTITION_LEADER_EPOCH.to_be_bytes());
    header[MAGIC_AT] = MAGIC_V2 as u8;
    header[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT]
        .copy_from_slice(&(fields.compression as i16).to_be_bytes());
    header[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT]
        .copy_from_slice(&fields.last_offset_delta.to_be_bytes());
    header[BASE_TIMESTAMP_AT..MAX_TIMESTAMP_AT]
        .copy_from_slice(&fields.base_timestamp.to_be_bytes());
    header[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&fields.max_timestamp.to_be_bytes());
    header[PRODUCER_ID_AT..PRODUCER_EPOCH_AT].copy_from_slice(&NO_PRODUCER_ID.to_be_bytes());
    header[PRODUCER_EPOCH_AT..BASE_SEQUENCE_AT].copy_from_slice(&NO_PRODUCER_EPOCH.to_be_bytes());
    header[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&NO_SEQUENCE.to_be_bytes());
    header[RECORD_COUNT_AT..HEADER_LEN].copy_from_slice(&fields.count.to_be_bytes());
    let body_crc = crc32c(&body);
    let crc = crc_combine(crc32c(&header[ATTRIBUTES_AT..]), body_crc, body.len());
    header[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
    Ok(Encoded {
        header,
        body,
        body_crc,
    })
}

/// One v2 batch of `records` (at least one, at increasing offsets within an int32 of the
/// first's, checked) in `compression`, made in memory: a legacy run's records, read already.
/// Base offset the first record's, each record's fields as it holds them (`records::write`),
/// base timestamp the least of the records', max timestamp the greatest. `offset` names the
/// records at fault in an error.
fn encode(
    records: &[Record],
    compression: Compression,
    offset: i64,
) -> Result<Encoded, BatchError> {
    let failed = |reason: String| BatchError::Encode { offset, reason };
    let (Some(base_timestamp), Some(max_timestamp)) = (
        records.iter().map(|r| r.timestamp).min(),
        records.iter().map(|r| r.timestamp).max(),
    ) else {
        return Err(failed("no record to encode".to_owned()));
    };
    let base_offset = records[0].offset;
    let mut deltas = Vec::with_capacity(records.len());
    let mut previous = -1;
    for record in records {
        let d = record.offset.wrapping_sub(base_offset);
        match i32::try_from(d) {
            Ok(d) if i64::from(d) > previous => {
                deltas.push(d);
                previous = i64::from(d);
            }
            _ => {
                return Err(failed(format!(
                    "the record at offset {} has the offset delta {d}, which does not follow \
                     {previous} within a batch",
                    record.offset
                )))
            }
        }
    }
    let count = i32::try_from(records.len()).map_err(|_| {
        failed(format!(
            "{} records are too many for a batch",
            records.len()
        ))
    })?;
    let body = compress(compression, |buf| {
        for (record, &d) in records.iter().zip(&deltas) {
            records::write(buf, record, d, base_timestamp);
        }
    })
    .map_err(|e| failed(format!("compressing the records ({compression:?}): {e:#}")))?
    .freeze();
    let fields = HeaderFields {
        base_offset,
        compression,
        last_offset_delta: deltas.last().copied().unwrap_or_default(),
        base_timestamp,
        max_timestamp,
        count,
    };
    encoded(fields, body, offset)
}

/// The re-encode path: the records in `range`, offsets contiguous from 0, timestamps as the
/// source gives them (a LogAppendTime batch's max timestamp for each), CreateTime, no
/// transactional, control or delete-horizon bit, the source's codec; split into batches of at
/// most `max_bytes`.
fn reencode(
    batch: &SourceBatch,
    range: Range<i64>,
    max_bytes: usize,
    stamp: Stamp,
) -> Result<Vec<OutBatch>, BatchError> {
    encode_again(
        batch,
        |head| {
            if head.offset >= range.end {
                Keep::Stop
            } else if head.offset < range.start {
                Keep::Skip
            } else {
                Keep::As(head.offset)
            }
        },
        max_bytes,
        stamp,
    )
}

/// `out` without its records at `refused` (their indexes in it, as a Produce answer names the
/// records it refused: `record_errors`), encoded again as [`prepare`] encodes, with sequences
/// from `stamp.base_sequence` on: what skip mode sends in place of a batch the target refused
/// for some of its records. Each record keeps its source offset.
pub(crate) fn without(
    out: &OutBatch,
    refused: &[usize],
    max_bytes: usize,
    stamp: Stamp,
) -> Result<Vec<OutBatch>, BatchError> {
    // `out` is a whole batch of its own (base offset 0, its records' offsets their indexes).
    let batch = SourceBatch::new(out.to_bytes())?;
    encode_again(
        &batch,
        |head| {
            if refused.contains(&head.index) {
                Keep::Skip
            } else {
                Keep::As(out.source_offset(head.index))
            }
        },
        max_bytes,
        stamp,
    )
}

/// What [`encode_again`] does with a record.
enum Keep {
    /// Sends it, under this source offset.
    As(i64),
    /// Reads past it.
    Skip,
    /// Stops before it: nothing from it on is sent.
    Stop,
}

/// A compressed section's worst growth for `plain` more bytes, and a codec's trailer: more
/// than any of the five codecs can add (snappy's `32 + n + n/6` per block, and a block length
/// each 32 KiB, the most).
fn worst_growth(plain: usize) -> usize {
    plain.saturating_add(plain / 4).saturating_add(256)
}

/// An outgoing batch being written: its records compressed as they come.
struct Building {
    encoder: codec::Encoder,
    compression: Compression,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    first_source: i64,
    last_source: i64,
    /// The source offset of each record, once they are not contiguous.
    sources: Option<Vec<i64>>,
    /// Plain bytes written since the encoder's output was last exact (a flush).
    pending: usize,
}

impl Building {
    fn new(compression: Compression, base_timestamp: i64, room: usize) -> std::io::Result<Self> {
        Ok(Self {
            encoder: codec::Encoder::new(compression, codec::Sink::new(room))?,
            compression,
            base_timestamp,
            max_timestamp: base_timestamp,
            count: 0,
            first_source: 0,
            last_source: 0,
            sources: None,
            pending: 0,
        })
    }

    /// The bytes `head` takes as this batch's next record.
    fn len_of(&self, head: &Head) -> usize {
        records::record_len(
            head.timestamp.wrapping_sub(self.base_timestamp),
            self.count,
            head.rest,
        )
    }

    /// Whether a record of `len` plain bytes surely fits `room` after what is written: from a
    /// bound of what the codec may still add, then, when that is in doubt, from the exact
    /// size after a flush (a flush costs a codec a few bytes, so only near the limit; a
    /// batch within 1/32 of it is full).
    fn has_room(&mut self, len: usize, room: usize) -> std::io::Result<bool> {
        if self.compression == Compression::None {
            return Ok(self.encoder.written().saturating_add(len) <= room);
        }
        if self
            .encoder
            .written()
            .saturating_add(worst_growth(self.pending.saturating_add(len)))
            <= room
        {
            return Ok(true);
        }
        if self.count <= 1 {
            // A flush costs bytes that stay in the batch: a lone record's batch is finished
            // unflushed, at its least size, so that only a record too large alone is
            // `RecordTooLarge` (a flush once pushed a record that fits over the limit).
            return Ok(false);
        }
        self.encoder.flush()?;
        self.pending = 0;
        let written = self.encoder.written();
        Ok(written.saturating_add(worst_growth(len)) <= room && room - written >= room / 32)
    }

    /// Writes the record `head` (its front anew, the rest copied from `stream`) as this
    /// batch's next, from source offset `source`.
    fn put<R: std::io::BufRead>(
        &mut self,
        head: &Head,
        source: i64,
        stream: &mut Stream<R>,
    ) -> Result<(), StreamError> {
        let timestamp_delta = head.timestamp.wrapping_sub(self.base_timestamp);
        records::put_head(&mut self.encoder, timestamp_delta, self.count, head.rest)
            .map_err(StreamError::Write)?;
        stream.copy_rest(head, Some(&mut self.encoder))?;
        self.pending = self.pending.saturating_add(records::record_len(
            timestamp_delta,
            self.count,
            head.rest,
        ));
        self.max_timestamp = self.max_timestamp.max(head.timestamp);
        if self.count == 0 {
            self.first_source = source;
        } else {
            if self.sources.is_none() && source != self.last_source.wrapping_add(1) {
                self.sources = Some((self.first_source..=self.last_source).collect());
            }
            if let Some(sources) = &mut self.sources {
                sources.push(source);
            }
        }
        self.last_source = source;
        self.count += 1;
        Ok(())
    }

    /// The batch, stamped with `stamp` at `sequence`; a lone record whose batch is larger than
    /// `max_bytes` is [`BatchError::RecordTooLarge`].
    fn finish(self, stamp: Stamp, sequence: i32, max_bytes: usize) -> Result<OutBatch, BatchError> {
        let offset = self.first_source;
        let failed = |reason: String| BatchError::Encode { offset, reason };
        let compression = self.compression;
        let sink = self
            .encoder
            .finish()
            .map_err(|e| failed(format!("compressing the records ({compression:?}): {e}")))?;
        let size = HEADER_LEN.saturating_add(sink.len());
        if size > max_bytes {
            if self.count == 1 {
                return Err(BatchError::RecordTooLarge {
                    offset,
                    size,
                    limit: max_bytes,
                });
            }
            return Err(failed(format!(
                "{} records came to a batch of {size} bytes, above the limit of {max_bytes} \
                 (a defect of the batch engine: report it)",
                self.count
            )));
        }
        let body = sink
            .into_bytes()
            .ok_or_else(|| failed("the compressed records passed their bound".to_owned()))?;
        let fields = HeaderFields {
            base_offset: 0,
            compression,
            last_offset_delta: self.count - 1,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            count: self.count,
        };
        let Encoded {
            mut header,
            body,
            body_crc,
        } = encoded(fields, Bytes::from(body), offset)?;
        let attributes = i16_at(&header, ATTRIBUTES_AT);
        stamp_header(
            &mut header,
            attributes,
            Stamp {
                base_sequence: sequence,
                ..stamp
            },
            body_crc,
            body.len(),
        );
        Ok(OutBatch {
            header,
            body,
            records: self.count,
            first_source_offset: self.first_source,
            last_source_offset: self.last_source,
            source_offsets: self.sources,
            reencoded: true,
            body_crc,
        })
    }
}

/// The records of `batch` that `keep` keeps, under the source offsets it gives, in batches of
/// at most `max_bytes`, sequences from `stamp.base_sequence` on: see [`reencode`].
///
/// As a stream, record by record: the records section is read through its decompressor and
/// each kept record written into the compressor of the batch it goes to, its front (size,
/// timestamp and offset deltas) anew and the rest (key, value, headers) copied as it passes.
/// What is held: the source batch (compressed, as it came), the outgoing batches (compressed),
/// and the codecs' own windows; never a record whole, so a batch that expands a thousandfold
/// costs what it costs compressed. A batch takes records while they surely fit (a bound of
/// what its codec may add, checked by a flush near the limit), so none is encoded twice; a
/// record that alone makes a batch larger than `max_bytes` is [`BatchError::RecordTooLarge`].
/// Each batch's base timestamp is its first record's, as Kafka's `MemoryRecordsBuilder` sets
/// it (a later record's delta may be negative).
fn encode_again(
    batch: &SourceBatch,
    mut keep: impl FnMut(&Head) -> Keep,
    max_bytes: usize,
    stamp: Stamp,
) -> Result<Vec<OutBatch>, BatchError> {
    let offset = batch.base_offset();
    let compression = batch.compression();
    let failed = |e: StreamError| match e {
        StreamError::Malformed(e) => BatchError::Decode {
            offset,
            reason: e.to_string(),
        },
        StreamError::Read(e) => match codec::BlockTooLarge::of(&e) {
            Some(refused) => BatchError::BlockTooLarge {
                offset,
                last_offset: batch.last_offset(),
                size: refused.size,
                limit: refused.limit,
            },
            None => BatchError::Decode {
                offset,
                reason: format!(
                    "its records section could not be decompressed ({compression:?}): {e}"
                ),
            },
        },
        StreamError::Write(e) => BatchError::Encode {
            offset,
            reason: format!("compressing the records ({compression:?}): {e}"),
        },
    };
    let body = &batch.bytes[HEADER_LEN..];
    let src = codec::reader(body, compression).map_err(|e| failed(StreamError::Read(e)))?;
    let section = Section {
        base_offset: offset,
        last_offset_delta: batch.last_offset_delta(),
        base_timestamp: batch.base_timestamp(),
        append_time: batch.log_append_time().then(|| batch.max_timestamp()),
        record_count: batch.record_count(),
    };
    let plain_len = (compression == Compression::None).then_some(body.len());
    let mut stream = Stream::new(src, section, plain_len).map_err(|e| failed(e.into()))?;
    let room = max_bytes.saturating_sub(HEADER_LEN);
    let mut out = Vec::new();
    let mut sequence = stamp.base_sequence;
    let mut building: Option<Building> = None;
    let mut stopped = false;
    while let Some(head) = stream.next_head().map_err(failed)? {
        let source = match keep(&head) {
            Keep::As(source) => source,
            Keep::Skip => {
                stream.copy_rest(&head, None).map_err(failed)?;
                continue;
            }
            Keep::Stop => {
                stopped = true;
                break;
            }
        };
        if let Some(b) = &mut building {
            let len = b.len_of(&head);
            let fits = b
                .has_room(len, room)
                .map_err(|e| failed(StreamError::Write(e)))?;
            if !fits {
                let done = building
                    .take()
                    .map(|b| b.finish(stamp, sequence, max_bytes));
                if let Some(done) = done {
                    let done = done?;
                    sequence = next_sequence(sequence, done.records);
                    out.push(done);
                }
            }
        }
        let b = match &mut building {
            Some(b) => b,
            None => building.insert(
                Building::new(compression, head.timestamp, room)
                    .map_err(|e| failed(StreamError::Write(e)))?,
            ),
        };
        b.put(&head, source, &mut stream).map_err(failed)?;
    }
    if !stopped {
        stream.finish().map_err(failed)?;
    }
    if let Some(b) = building {
        out.push(b.finish(stamp, sequence, max_bytes)?);
    }
    Ok(out)
}
