//! The records section of a v2 batch (Kafka's `DefaultRecord`), read and written as bytes:
//! keys, values, header names and header values are slices of the section, headers a list in
//! the order they came, a name repeated as often as it is, a name that is not UTF-8 as it is.
//! The `kafka-protocol` crate's `Record` keeps header names as strings in a map, which a
//! mirror cannot use: it would refuse the one and drop the other.
//!
//! A record: its size (varint, of what follows), attributes (int8, unused), timestamp delta
//! (varlong, from the batch's base timestamp), offset delta (varint, from the batch's base
//! offset), key and value (each a varint length, negative for null, then the bytes), header
//! count (varint), and each header's name (varint length, then the bytes; never null) and
//! value (as a key).
//!
//! Reading trusts no length or count: each is checked against the bytes left before anything
//! is sized by it, so a count of 2^31 allocates nothing, and no input makes it panic.

use bytes::{BufMut, Bytes};

/// The fewest bytes a record takes: size, attributes, timestamp delta, offset delta, key
/// length, value length and header count, one byte each.
const LEAST_RECORD: usize = 7;
/// The fewest bytes a header takes: its name's length and its value's length.
const LEAST_HEADER: usize = 2;

/// One header: its name and value as the record holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) name: Bytes,
    pub(crate) value: Option<Bytes>,
}

/// One record as a consumer reads it, its fields slices of the records section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// Its offset: the batch's base offset plus its offset delta.
    pub(crate) offset: i64,
    /// Its timestamp: the batch's base timestamp plus its delta, or the batch's max timestamp
    /// under LogAppendTime.
    pub(crate) timestamp: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    /// In order, repeats kept.
    pub(crate) headers: Vec<Header>,
}

impl Record {
    /// At least the bytes it takes in a records section (its varints at their widest).
    pub(crate) fn size_bound(&self) -> usize {
        let field = |b: &Option<Bytes>| 5 + b.as_ref().map_or(0, Bytes::len);
        let headers: usize = self
            .headers
            .iter()
            .map(|h| 5 + h.name.len() + field(&h.value))
            .sum();
        // size, attributes, timestamp delta, offset delta, key, value, header count, headers
        5 + 1 + 10 + 5 + field(&self.key) + field(&self.value) + 5 + headers
    }
}

/// What a batch's header says about its records, for reading them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Section {
    pub(crate) base_offset: i64,
    pub(crate) last_offset_delta: i32,
    pub(crate) base_timestamp: i64,
    /// The max timestamp of a LogAppendTime batch: every record's timestamp.
    pub(crate) append_time: Option<i64>,
    pub(crate) record_count: i32,
}

/// Why a records section cannot be read. Each names the record (by offset where it is
/// known, else by its place in the batch) and the field at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ReadError {
    #[error(
        "its header counts {count} records, and its records section of {bytes} bytes holds \
         at most {most} ({LEAST_RECORD} bytes each at least)"
    )]
    CountBeyondBytes {
        count: i32,
        bytes: usize,
        most: usize,
    },
    #[error("record {index} of {count} (from 0) is cut short in its {field}")]
    Truncated {
        index: usize,
        count: i32,
        field: &'static str,
    },
    #[error("record {index} (from 0) says it takes {size} bytes, and {left} are left")]
    SizeBeyondBytes {
        index: usize,
        size: i64,
        left: usize,
    },
    #[error("the {field} of record {index} (from 0) is a varint longer than {max} bytes")]
    VarintTooLong {
        index: usize,
        field: &'static str,
        max: usize,
    },
    #[error(
        "the record at offset {offset} says {count} headers, and {left} bytes are left in it \
         ({LEAST_HEADER} bytes each at least)"
    )]
    HeadersBeyondBytes {
        offset: i64,
        count: i64,
        left: usize,
    },
    #[error("the {field} of the record at offset {offset} says {len} bytes, and {left} are left")]
    FieldBeyondBytes {
        offset: i64,
        field: &'static str,
        len: i64,
        left: usize,
    },
    #[error("a header name of the record at offset {offset} has the length {len}")]
    NullHeaderName { offset: i64, len: i64 },
    #[error("the record at offset {offset} says it takes {size} bytes and {extra} of them are left over")]
    SizeMismatch {
        offset: i64,
        size: usize,
        extra: usize,
    },
    #[error(
        "record {index} (from 0) has the offset delta {delta}, which does not follow the one \
         before it ({previous}) or passes the batch's last offset delta ({last})"
    )]
    OffsetOutOfOrder {
        index: usize,
        delta: i32,
        previous: i64,
        last: i32,
    },
    #[error("{extra} bytes follow its last record")]
    Trailing { extra: usize },
}

/// A cursor over a records section: every read checked against the bytes left.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(b)
    }

    /// An unsigned varint of at most `max` bytes, its bits past 64 dropped as Kafka's
    /// `ByteUtils` drops them. `Err(true)`: longer than `max`; `Err(false)`: cut short.
    fn raw_varint(&mut self, max: usize) -> Result<u64, bool> {
        let mut value: u64 = 0;
        for i in 0..max {
            let byte = self.byte().ok_or(false)?;
            value |= u64::from(byte & 0x7f)
                .checked_shl(7 * i as u32)
                .unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(true)
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.rest.len() {
            return None;
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(taken)
    }
}

/// Reads one record's fields, naming its place (`index` of `count`) when it goes wrong.
struct RecordReader<'a, 'c> {
    cursor: &'c mut Cursor<'a>,
    index: usize,
    count: i32,
}

impl RecordReader<'_, '_> {
    fn varint(&mut self, field: &'static str) -> Result<i32, ReadError> {
        // Kafka's `readVarint`: 5 bytes at most, the low 32 bits, zigzag.
        let raw = self.raw(field, 5)? as u32;
        Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
    }

    fn varlong(&mut self, field: &'static str) -> Result<i64, ReadError> {
        let raw = self.raw(field, 10)?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    fn raw(&mut self, field: &'static str, max: usize) -> Result<u64, ReadError> {
        self.cursor.raw_varint(max).map_err(|too_long| {
            if too_long {
                ReadError::VarintTooLong {
                    index: self.index,
                    field,
                    max,
                }
            } else {
                self.truncated(field)
            }
        })
    }

    fn truncated(&self, field: &'static str) -> ReadError {
        ReadError::Truncated {
            index: self.index,
            count: self.count,
            field,
        }
    }
}

/// A length-prefixed field (a negative length is null, as Kafka's `DefaultRecord.readFrom`
/// reads it) as a slice of `whole`.
fn field(
    reader: &mut RecordReader<'_, '_>,
    whole: &Bytes,
    offset: i64,
    name: &'static str,
) -> Result<Option<Bytes>, ReadError> {
    let len = reader.varint(name)?;
    if len < 0 {
        return Ok(None);
    }
    slice(reader, whole, (offset, name), len).map(Some)
}

/// The next `len` bytes (not negative) as a slice of `whole`, `len` checked against the
/// bytes left.
fn slice(
    reader: &mut RecordReader<'_, '_>,
    whole: &Bytes,
    (offset, name): (i64, &'static str),
    len: i32,
) -> Result<Bytes, ReadError> {
    let left = reader.cursor.rest.len();
    let bytes = usize::try_from(len)
        .ok()
        .and_then(|len| reader.cursor.take(len))
        .ok_or(ReadError::FieldBeyondBytes {
            offset,
            field: name,
            len: i64::from(len),
            left,
        })?;
    Ok(whole.slice_ref(bytes))
}

/// The records of an uncompressed records section, each field a slice of `section`.
pub(crate) fn read(section: &Bytes, batch: Section) -> Result<Vec<Record>, ReadError> {
    let most = section.len() / LEAST_RECORD;
    let count = usize::try_from(batch.record_count).unwrap_or(0);
    if count > most {
        return Err(ReadError::CountBeyondBytes {
            count: batch.record_count,
            bytes: section.len(),
            most,
        });
    }
    let mut cursor = Cursor { rest: section };
    let mut records = Vec::with_capacity(count);
    let mut previous: i64 = -1;
    for index in 0..count {
        let mut reader = RecordReader {
            cursor: &mut cursor,
            index,
            count: batch.record_count,
        };
        let size = reader.varint("size")?;
        let left = reader.cursor.rest.len();
        let body = usize::try_from(size)
            .ok()
            .and_then(|size| reader.cursor.take(size))
            .ok_or(ReadError::SizeBeyondBytes {
                index,
                size: i64::from(size),
                left,
            })?;
        let mut inner = Cursor { rest: body };
        let mut reader = RecordReader {
            cursor: &mut inner,
            index,
            count: batch.record_count,
        };
        reader
            .cursor
            .byte()
            .ok_or_else(|| reader.truncated("attributes"))?;
        let timestamp_delta = reader.varlong("timestamp delta")?;
        let delta = reader.varint("offset delta")?;
        if i64::from(delta) <= previous || delta > batch.last_offset_delta {
            return Err(ReadError::OffsetOutOfOrder {
                index,
                delta,
                previous,
                last: batch.last_offset_delta,
            });
        }
        previous = i64::from(delta);
        let offset = batch.base_offset.wrapping_add(i64::from(delta));
        let key = field(&mut reader, section, offset, "key")?;
        let value = field(&mut reader, section, offset, "value")?;
        let header_count = reader.varint("header count")?;
        let left = reader.cursor.rest.len();
        let header_count = usize::try_from(header_count)
            .ok()
            .filter(|&n| n <= left / LEAST_HEADER)
            .ok_or(ReadError::HeadersBeyondBytes {
                offset,
                count: i64::from(header_count),
                left,
            })?;
        let mut headers = Vec::with_capacity(header_count);
        for _ in 0..header_count {
            let len = reader.varint("header name length")?;
            if len < 0 {
                // Kafka's `readFrom` refuses it too ("Invalid negative header key size").
                return Err(ReadError::NullHeaderName {
                    offset,
                    len: i64::from(len),
                });
            }
            let name = slice(&mut reader, section, (offset, "header name"), len)?;
            let value = field(&mut reader, section, offset, "header value")?;
            headers.push(Header { name, value });
        }
        if !reader.cursor.rest.is_empty() {
            return Err(ReadError::SizeMismatch {
                offset,
                size: body.len(),
                extra: reader.cursor.rest.len(),
            });
        }
        records.push(Record {
            offset,
            timestamp: batch
                .append_time
                .unwrap_or(batch.base_timestamp.wrapping_add(timestamp_delta)),
            key,
            value,
            headers,
        });
    }
    if !cursor.rest.is_empty() {
        return Err(ReadError::Trailing {
            extra: cursor.rest.len(),
        });
    }
    Ok(records)
}

fn put_varlong(buf: &mut impl BufMut, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        buf.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

fn varlong_len(n: i64) -> usize {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut len = 1;
    while z >= 0x80 {
        z >>= 7;
        len += 1;
    }
    len
}

fn field_len(field: Option<&Bytes>) -> usize {
    field.map_or(1, |b| varlong_len(b.len() as i64) + b.len())
}

fn put_field(buf: &mut impl BufMut, field: Option<&Bytes>) {
    match field {
        None => put_varlong(buf, -1),
        Some(bytes) => {
            put_varlong(buf, bytes.len() as i64);
            buf.put_slice(bytes);
        }
    }
}

/// Writes `record` as a records section holds it (Kafka's `DefaultRecord.writeTo`): its
/// timestamp as a delta from `base_timestamp`, `offset_delta`, attributes 0, every field as
/// it came.
pub(crate) fn write(
    buf: &mut impl BufMut,
    record: &Record,
    offset_delta: i32,
    base_timestamp: i64,
) {
    let timestamp_delta = record.timestamp.wrapping_sub(base_timestamp);
    let headers: usize = record
        .headers
        .iter()
        .map(|h| field_len(Some(&h.name)) + field_len(h.value.as_ref()))
        .sum();
    let size = 1
        + varlong_len(timestamp_delta)
        + varlong_len(i64::from(offset_delta))
        + field_len(record.key.as_ref())
        + field_len(record.value.as_ref())
        + varlong_len(record.headers.len() as i64)
        + headers;
    put_varlong(buf, size as i64);
    buf.put_u8(0);
    put_varlong(buf, timestamp_delta);
    put_varlong(buf, i64::from(offset_delta));
    put_field(buf, record.key.as_ref());
    put_field(buf, record.value.as_ref());
    put_varlong(buf, record.headers.len() as i64);
    for header in &record.headers {
        put_field(buf, Some(&header.name));
        put_field(buf, header.value.as_ref());
    }
}
