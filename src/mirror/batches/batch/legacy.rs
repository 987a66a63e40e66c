//! Message sets in the formats before Kafka 0.11 (magic 0 and 1: Kafka's `LegacyRecord` and
//! `AbstractLegacyRecordBatch`), which the `kafka-protocol` crate does not read. A broker
//! serves them as its log holds them (written before 0.11, or under a topic's
//! `message.format.version` below 0.11, which Kafka 2.8 and older honour), and a producer of
//! v2 batches cannot send them. So a run of them is read here, read only (each message's
//! CRC-32 checked), and becomes one v2 batch (its records written as bytes, `super::records`),
//! in the source's codec, each record at its source offset with the timestamp a consumer reads; that batch
//! then takes the engine's usual path (copied under our stamp, or encoded again where its
//! offsets have gaps or it is too large for the target topic).
//!
//! A message: offset (int64), size (int32, of what follows it), CRC-32 (of what follows it),
//! magic (int8), attributes (int8: the codec in bits 0 to 2, LogAppendTime in bit 3 of v1),
//! timestamp (int64, v1 only), key and value (each an int32 length, -1 for null, then the
//! bytes). A compressed message (a wrapper) holds the inner messages, compressed, as its
//! value: in v1 their offsets are relative and the wrapper's is the last one's absolute
//! offset (absolute = wrapper - last + inner), and under LogAppendTime the wrapper's timestamp
//! is each one's; in v0 they are absolute. v0 has no timestamps: its records get none (-1), as
//! Kafka's own conversion to v2 gives them.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::records::Compression;

use super::records::Record;
use super::{codec, encode, i32_at, i64_at, BatchError, SourceBatch, LOG_OVERHEAD};

/// Where a legacy message's fields start (after the offset and size, `LOG_OVERHEAD`).
const CRC_AT: usize = 12;
const MAGIC_AT: usize = 16;
const ATTRIBUTES_AT: usize = 17;
const TIMESTAMP_AT: usize = 18;

const CODEC_MASK: u8 = 0x07;
const LOG_APPEND_TIME_BIT: u8 = 0x08;

/// A run is cut once its keys and values pass this many bytes (then at the next message).
const RUN_BYTES: usize = 1 << 20;

/// The most plain bytes a compressed wrapper may hold: its records are read whole (a run
/// becomes one v2 batch in memory), so a wrapper that expands past this is refused, naming
/// its offset, as it is read (never decompressed further than this).
pub(super) const WRAPPER_BOUND: usize = 128 << 20;

/// The records a compressed wrapper holds, decompressed as a stream up to [`WRAPPER_BOUND`].
fn decompress_wrapper(value: &[u8], compression: Compression) -> Result<Bytes, String> {
    use std::io::Read as _;
    let mut plain = Vec::new();
    codec::reader(value, compression)
        .and_then(|r| r.take(WRAPPER_BOUND as u64 + 1).read_to_end(&mut plain))
        .map_err(|e| match codec::BlockTooLarge::of(&e) {
            Some(refused) => refused.to_string(),
            None => format!("{e}"),
        })?;
    if plain.len() > WRAPPER_BOUND {
        return Err(format!(
            "the records it wraps are more than {WRAPPER_BOUND} bytes uncompressed, the most the \
             batch engine reads of a message of the formats before Kafka 0.11 (copy this topic \
             with --copy.mode records)"
        ));
    }
    Ok(Bytes::from(plain))
}

/// The least a message's size field can say: CRC, magic, attributes, (timestamp,) the key's
/// and the value's lengths.
fn least_size(magic: i8) -> i32 {
    if magic == 0 {
        14
    } else {
        22
    }
}

/// One record of a legacy message set, at its absolute offset.
#[derive(Debug)]
struct LegacyRecord {
    offset: i64,
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
}

/// The legacy messages at the front of `rest` as one v2 batch: the whole ones that follow, up
/// to a v2 batch, a change of codec or [`RUN_BYTES`] of keys and values, taken off `rest`.
/// `Ok(None)` when the first is cut short (the end of a fetch: fetch more bytes).
pub(super) fn next_run(rest: &mut Bytes) -> Result<Option<SourceBatch>, BatchError> {
    let mut records: Vec<LegacyRecord> = Vec::new();
    let mut codec = None;
    let mut taken = 0;
    let mut bytes = 0;
    loop {
        let at = &rest[taken..];
        if at.len() <= ATTRIBUTES_AT || bytes >= RUN_BYTES {
            break;
        }
        let magic = at[MAGIC_AT] as i8;
        let this_codec = at[ATTRIBUTES_AT] & CODEC_MASK;
        if !matches!(magic, 0 | 1) || codec.is_some_and(|c| c != this_codec) {
            break;
        }
        let offset = i64_at(at, 0);
        let size = i32_at(at, 8);
        if size < least_size(magic) {
            return Err(BatchError::Legacy {
                offset,
                magic,
                reason: format!(
                    "its size field says {size} bytes, less than the {} of a message",
                    least_size(magic)
                ),
            });
        }
        let total = LOG_OVERHEAD + size as usize;
        if at.len() < total {
            break;
        }
        let message = rest.slice(taken..taken + total);
        let before = records.len();
        read_message(&message, &mut records)?;
        bytes += records[before..]
            .iter()
            .map(|r| r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len))
            .sum::<usize>();
        codec = Some(this_codec);
        taken += total;
    }
    if taken == 0 {
        return Ok(None);
    }
    let run = rest.split_to(taken);
    let compression = codec.and_then(compression_of).unwrap_or(Compression::None);
    to_batch(records, compression, i64_at(&run, 0), run[MAGIC_AT] as i8).map(Some)
}

/// The codec of a legacy message's attributes (none, gzip, snappy, lz4).
fn compression_of(codec: u8) -> Option<Compression> {
    match codec {
        0 => Some(Compression::None),
        1 => Some(Compression::Gzip),
        2 => Some(Compression::Snappy),
        3 => Some(Compression::Lz4),
        _ => None,
    }
}

/// Reads one whole message (its size already checked) into `out`: itself, or the records it
/// wraps.
fn read_message(message: &Bytes, out: &mut Vec<LegacyRecord>) -> Result<(), BatchError> {
    let offset = i64_at(message, 0);
    let magic = message[MAGIC_AT] as i8;
    let fail = |reason: String| BatchError::Legacy {
        offset,
        magic,
        reason,
    };
    let stored = u32::from_be_bytes(super::field(message, CRC_AT));
    let computed = crc32fast::hash(&message[MAGIC_AT..]);
    if stored != computed {
        return Err(fail(format!(
            "its CRC-32 check fails (stored {stored:#010x}, computed {computed:#010x}): the \
             fetch response or the source log is damaged"
        )));
    }
    let attributes = message[ATTRIBUTES_AT];
    let (timestamp, fields_at) = if magic == 1 {
        (i64_at(message, TIMESTAMP_AT), TIMESTAMP_AT + 8)
    } else {
        (-1, TIMESTAMP_AT)
    };
    let mut cursor = &message[fields_at..];
    let key =
        read_bytes(&mut cursor, message).ok_or_else(|| fail("its key runs past it".into()))?;
    let value =
        read_bytes(&mut cursor, message).ok_or_else(|| fail("its value runs past it".into()))?;
    if !cursor.is_empty() {
        return Err(fail(format!("{} bytes follow its value", cursor.len())));
    }
    let codec = attributes & CODEC_MASK;
    if codec == 0 {
        out.push(LegacyRecord {
            offset,
            timestamp,
            key,
            value,
        });
        return Ok(());
    }
    let compression = compression_of(codec).ok_or_else(|| {
        fail(format!(
            "its codec {codec} is none a message of format v{magic} can have (1 to 3)"
        ))
    })?;
    let value = value.ok_or_else(|| fail("it is compressed but has no value".into()))?;
    let mut inner = decompress_wrapper(&value, compression).map_err(|e| {
        let why = if magic == 0 && compression == Compression::Lz4 {
            " (a v0 lz4 frame, which Kafka writes with Kafka 0.8's wrong header checksum: the \
             batch engine does not read it)"
        } else {
            ""
        };
        fail(format!(
            "the records it wraps could not be decompressed ({compression:?}){why}: {e}"
        ))
    })?;
    let mut wrapped = Vec::new();
    while !inner.is_empty() {
        if inner.len() <= ATTRIBUTES_AT {
            return Err(fail("the records it wraps end inside a message".into()));
        }
        let size = i32_at(&inner, 8);
        let total = LOG_OVERHEAD + usize::try_from(size).unwrap_or(0);
        if size < least_size(magic) || inner.len() < total {
            return Err(fail(format!(
                "a message it wraps says {size} bytes, and {} are left",
                inner.len() - LOG_OVERHEAD
            )));
        }
        let one = inner.split_to(total);
        if one[MAGIC_AT] as i8 != magic || one[ATTRIBUTES_AT] & CODEC_MASK != 0 {
            return Err(fail(format!(
                "a message it wraps has magic {} and codec {}, not {magic} and none",
                one[MAGIC_AT] as i8,
                one[ATTRIBUTES_AT] & CODEC_MASK
            )));
        }
        read_message(&one, &mut wrapped)?;
    }
    let Some(last) = wrapped.last().map(|r| r.offset) else {
        return Err(fail("it wraps no record".into()));
    };
    if magic == 1 {
        let base = offset - last;
        let append_time = attributes & LOG_APPEND_TIME_BIT != 0;
        for record in &mut wrapped {
            record.offset += base;
            if append_time {
                record.timestamp = timestamp;
            }
        }
    }
    out.extend(wrapped);
    Ok(())
}

/// An int32-length-prefixed field (-1: null) from the front of `cursor`, a slice of `whole`.
fn read_bytes(cursor: &mut &[u8], whole: &Bytes) -> Option<Option<Bytes>> {
    let (len, rest) = cursor.split_first_chunk::<4>()?;
    let len = i32::from_be_bytes(*len);
    *cursor = rest;
    if len < 0 {
        return Some(None);
    }
    let bytes = cursor.get(..len as usize)?;
    *cursor = &cursor[len as usize..];
    Some(Some(whole.slice_ref(bytes)))
}

/// `records` (of the run of messages of format v`magic` at offset `at`) as one v2 batch
/// (`super::encode`, the records as bytes): at their offsets, CreateTime, no producer.
fn to_batch(
    records: Vec<LegacyRecord>,
    compression: Compression,
    at: i64,
    magic: i8,
) -> Result<SourceBatch, BatchError> {
    let first = records.first().map_or(at, |r| r.offset);
    let mut previous = first - 1;
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        // A v2 batch holds offsets that increase, within an int32 of its base offset.
        if r.offset <= previous || i32::try_from(r.offset - first).is_err() {
            return Err(BatchError::Legacy {
                offset: r.offset,
                magic,
                reason: format!("its offset does not follow {previous}"),
            });
        }
        previous = r.offset;
        out.push(Record {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key,
            value: r.value,
            headers: Vec::new(),
        });
    }
    if out.is_empty() {
        return Err(BatchError::Legacy {
            offset: at,
            magic,
            reason: "its messages hold no record".into(),
        });
    }
    let encoded = encode(&out, compression, first)?;
    let mut bytes = BytesMut::with_capacity(encoded.size());
    bytes.put_slice(&encoded.header);
    bytes.put_slice(&encoded.body);
    SourceBatch::new(bytes.freeze())
}
