//! The records section of a v2 batch (Kafka's `DefaultRecord`), read and written as bytes:
//! a record's key, value, header names and header values pass as the bytes they are, headers
//! in the order they came, a name repeated as often as it is, a name that is not UTF-8 as it
//! is. The `kafka-protocol` crate's `Record` keeps header names as strings in a map, which a
//! mirror cannot use: it would refuse the one and drop the other.
//!
//! A section is read as a stream ([`Stream`]), one record after another from a decompressor:
//! only a record's front (size, timestamp and offset deltas) is decoded, and the rest of it
//! (key, value, headers), which is the same in the batch encoded again, is checked as it is
//! copied to the compressor ([`Stream::copy_rest`]), so no record is ever held whole.
//!
//! A record: its size (varint, of what follows), attributes (int8, unused), timestamp delta
//! (varlong, from the batch's base timestamp), offset delta (varint, from the batch's base
//! offset), key and value (each a varint length, negative for null, then the bytes), header
//! count (varint), and each header's name (varint length, then the bytes; never null) and
//! value (as a key).
//!
//! Reading trusts no length or count: each is checked against the bytes its record has left,
//! nothing is sized by one, and no input makes it panic.

use std::io::{self, BufRead, Write};

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
    #[error(
        "its header counts {count} records, and its records section ends after {found} of them"
    )]
    CountBeyondRecords { count: i32, found: usize },
    #[error("{extra} bytes or more follow its last record")]
    Trailing { extra: usize },
}

/// Why a records section read as a stream stops: the section is malformed, the stream
/// could not be read (decompression), or the record could not be written where it is copied.
#[derive(Debug)]
pub(crate) enum StreamError {
    Malformed(ReadError),
    Read(io::Error),
    Write(io::Error),
}

impl From<ReadError> for StreamError {
    fn from(e: ReadError) -> Self {
        Self::Malformed(e)
    }
}

/// The front of a record read from a [`Stream`]: where it is and when, and how many bytes
/// follow (key, value, headers), which [`Stream::copy_rest`] reads (or copies) next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    /// Its place in the batch, from 0.
    pub(crate) index: usize,
    /// The batch's base offset plus its offset delta.
    pub(crate) offset: i64,
    /// Its timestamp: the batch's base timestamp plus its delta, or the batch's max timestamp
    /// under LogAppendTime.
    pub(crate) timestamp: i64,
    /// The bytes after its offset delta: key, value, header count and headers.
    pub(crate) rest: usize,
    /// The size its record says (of what follows the size).
    size: usize,
}

/// The records of a records section read one after another from its plain bytes (a
/// decompressor's stream): never more than a byte of it held here, the fields of each record
/// checked as they pass, every length and count against the bytes its record has left.
pub(crate) struct Stream<R: BufRead> {
    src: R,
    batch: Section,
    /// The next record's place.
    index: usize,
    /// The offset delta of the record before.
    previous: i64,
    /// The size the current record says, and the bytes it has left.
    size: usize,
    left: usize,
}

impl<R: BufRead> Stream<R> {
    /// The records of `src`, a records section of `batch`; `plain_len`, when known (an
    /// uncompressed section), checks the record count against it at once.
    pub(crate) fn new(src: R, batch: Section, plain_len: Option<usize>) -> Result<Self, ReadError> {
        if let Some(len) = plain_len {
            let most = len / LEAST_RECORD;
            if usize::try_from(batch.record_count).unwrap_or(0) > most {
                return Err(ReadError::CountBeyondBytes {
                    count: batch.record_count,
                    bytes: len,
                    most,
                });
            }
        }
        Ok(Self {
            src,
            batch,
            index: 0,
            previous: -1,
            size: 0,
            left: 0,
        })
    }

    /// The next byte of the section; `None` at its end.
    fn next_byte(&mut self) -> Result<Option<u8>, StreamError> {
        let buf = loop {
            match self.src.fill_buf() {
                Ok(buf) => break buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StreamError::Read(e)),
            }
        };
        let Some(&b) = buf.first() else {
            return Ok(None);
        };
        self.src.consume(1);
        Ok(Some(b))
    }

    fn cut(&self, field: &'static str) -> ReadError {
        ReadError::Truncated {
            index: self.index,
            count: self.batch.record_count,
            field,
        }
    }

    /// The next byte of the current record, copied to `out`.
    fn body_byte(
        &mut self,
        field: &'static str,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<u8, StreamError> {
        if self.left == 0 {
            return Err(self.cut(field).into());
        }
        let b = self.next_byte()?.ok_or(ReadError::SizeBeyondBytes {
            index: self.index,
            size: self.size as i64,
            left: self.size - self.left,
        })?;
        self.left -= 1;
        if let Some(out) = out {
            out.write_all(&[b]).map_err(StreamError::Write)?;
        }
        Ok(b)
    }

    /// An unsigned varint of at most `max` bytes of the current record, its bits past 64
    /// dropped as Kafka's `ByteUtils` drops them.
    fn raw(
        &mut self,
        field: &'static str,
        max: usize,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<u64, StreamError> {
        let mut value: u64 = 0;
        for i in 0..max {
            let byte = self.body_byte(field, out)?;
            value |= u64::from(byte & 0x7f)
                .checked_shl(7 * i as u32)
                .unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ReadError::VarintTooLong {
            index: self.index,
            field,
            max,
        }
        .into())
    }

    fn varint(
        &mut self,
        field: &'static str,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<i32, StreamError> {
        // Kafka's `readVarint`: 5 bytes at most, the low 32 bits, zigzag.
        let raw = self.raw(field, 5, out)? as u32;
        Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
    }

    fn varlong(
        &mut self,
        field: &'static str,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<i64, StreamError> {
        let raw = self.raw(field, 10, out)?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    /// The front of the next record, up to its offset delta; `None` after the last one the
    /// batch counts. Its [`Stream::copy_rest`] must be called before the next.
    pub(crate) fn next_head(&mut self) -> Result<Option<Head>, StreamError> {
        let count = usize::try_from(self.batch.record_count).unwrap_or(0);
        if self.index >= count {
            return Ok(None);
        }
        // The size varint, read before the record's bytes are counted.
        let mut raw: u64 = 0;
        let mut i = 0;
        loop {
            let Some(byte) = self.next_byte()? else {
                return Err(if i == 0 {
                    ReadError::CountBeyondRecords {
                        count: self.batch.record_count,
                        found: self.index,
                    }
                } else {
                    self.cut("size")
                }
                .into());
            };
            raw |= u64::from(byte & 0x7f) << (7 * i);
            i += 1;
            if byte & 0x80 == 0 {
                break;
            }
            if i == 5 {
                return Err(ReadError::VarintTooLong {
                    index: self.index,
                    field: "size",
                    max: 5,
                }
                .into());
            }
        }
        let raw = raw as u32;
        let size = (raw >> 1) as i32 ^ -((raw & 1) as i32);
        let size = usize::try_from(size).map_err(|_| ReadError::SizeBeyondBytes {
            index: self.index,
            size: i64::from(size),
            left: 0,
        })?;
        (self.size, self.left) = (size, size);
        let mut none: Option<&mut dyn Write> = None;
        self.body_byte("attributes", &mut none)?;
        let timestamp_delta = self.varlong("timestamp delta", &mut none)?;
        let delta = self.varint("offset delta", &mut none)?;
        let last = self.batch.last_offset_delta;
        if i64::from(delta) <= self.previous || delta > last {
            return Err(ReadError::OffsetOutOfOrder {
                index: self.index,
                delta,
                previous: self.previous,
                last,
            }
            .into());
        }
        self.previous = i64::from(delta);
        Ok(Some(Head {
            index: self.index,
            offset: self.batch.base_offset.wrapping_add(i64::from(delta)),
            timestamp: self
                .batch
                .append_time
                .unwrap_or(self.batch.base_timestamp.wrapping_add(timestamp_delta)),
            rest: self.left,
            size,
        }))
    }

    /// Reads the rest of the record `head` (key, value, headers), each field checked, and
    /// copies its bytes as they are to `out` (none: the record is skipped).
    pub(crate) fn copy_rest(
        &mut self,
        head: &Head,
        mut out: Option<&mut dyn Write>,
    ) -> Result<(), StreamError> {
        let offset = head.offset;
        self.field(offset, "key", &mut out)?;
        self.field(offset, "value", &mut out)?;
        let header_count = self.varint("header count", &mut out)?;
        let left = self.left;
        let header_count = usize::try_from(header_count)
            .ok()
            .filter(|&n| n <= left / LEAST_HEADER)
            .ok_or(ReadError::HeadersBeyondBytes {
                offset,
                count: i64::from(header_count),
                left,
            })?;
        for _ in 0..header_count {
            let len = self.varint("header name length", &mut out)?;
            if len < 0 {
                // Kafka's `readFrom` refuses it too ("Invalid negative header key size").
                return Err(ReadError::NullHeaderName {
                    offset,
                    len: i64::from(len),
                }
                .into());
            }
            self.bytes(offset, "header name", len, &mut out)?;
            self.field(offset, "header value", &mut out)?;
        }
        if self.left != 0 {
            return Err(ReadError::SizeMismatch {
                offset,
                size: head.size,
                extra: self.left,
            }
            .into());
        }
        self.index += 1;
        Ok(())
    }

    /// A length-prefixed field (a negative length is null, as Kafka's `DefaultRecord.readFrom`
    /// reads it), copied to `out`.
    fn field(
        &mut self,
        offset: i64,
        name: &'static str,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<(), StreamError> {
        let len = self.varint(name, out)?;
        if len < 0 {
            return Ok(());
        }
        self.bytes(offset, name, len, out)
    }

    /// The next `len` bytes (not negative) of the record, checked against the bytes it has
    /// left, copied to `out` a buffer at a time.
    fn bytes(
        &mut self,
        offset: i64,
        name: &'static str,
        len: i32,
        out: &mut Option<&mut dyn Write>,
    ) -> Result<(), StreamError> {
        let left = self.left;
        let mut len = usize::try_from(len).ok().filter(|&len| len <= left).ok_or(
            ReadError::FieldBeyondBytes {
                offset,
                field: name,
                len: i64::from(len),
                left,
            },
        )?;
        while len > 0 {
            let buf = loop {
                match self.src.fill_buf() {
                    Ok(buf) => break buf,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(StreamError::Read(e)),
                }
            };
            if buf.is_empty() {
                return Err(ReadError::SizeBeyondBytes {
                    index: self.index,
                    size: self.size as i64,
                    left: self.size - self.left,
                }
                .into());
            }
            let n = buf.len().min(len);
            if let Some(out) = out {
                out.write_all(&buf[..n]).map_err(StreamError::Write)?;
            }
            self.src.consume(n);
            self.left -= n;
            len -= n;
        }
        Ok(())
    }

    /// Checks that nothing follows the last record.
    pub(crate) fn finish(mut self) -> Result<(), StreamError> {
        let extra = loop {
            match self.src.fill_buf() {
                Ok(buf) => break buf.len(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StreamError::Read(e)),
            }
        };
        if extra > 0 {
            return Err(ReadError::Trailing { extra }.into());
        }
        Ok(())
    }
}

/// A record's bytes in a records section when its timestamp delta is `timestamp_delta`, its
/// offset delta `offset_delta`, and `rest` bytes follow them (key, value, headers): the size
/// varint included.
pub(crate) fn record_len(timestamp_delta: i64, offset_delta: i32, rest: usize) -> usize {
    let size = body_len(timestamp_delta, offset_delta, rest);
    varlong_len(size as i64) + size
}

fn body_len(timestamp_delta: i64, offset_delta: i32, rest: usize) -> usize {
    1 + varlong_len(timestamp_delta) + varlong_len(i64::from(offset_delta)) + rest
}

/// Writes the front of a record (Kafka's `DefaultRecord.writeTo`): its size, attributes 0,
/// `timestamp_delta` and `offset_delta`; its `rest` bytes (key, value, headers) are to follow.
pub(crate) fn put_head(
    out: &mut dyn Write,
    timestamp_delta: i64,
    offset_delta: i32,
    rest: usize,
) -> io::Result<()> {
    // The size (at most 5 bytes), attributes, and the deltas (10 and 5 at most).
    let mut head = [0u8; 21];
    let free = {
        let mut at = &mut head[..];
        put_varlong(
            &mut at,
            body_len(timestamp_delta, offset_delta, rest) as i64,
        );
        at.put_u8(0);
        put_varlong(&mut at, timestamp_delta);
        put_varlong(&mut at, i64::from(offset_delta));
        at.len()
    };
    out.write_all(&head[..head.len() - free])
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
