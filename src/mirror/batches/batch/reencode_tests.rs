//! The re-encode path on records as Kafka keeps them: bytes. Each path that encodes a batch
//! again (LogAppendTime, a start offset inside a batch, compacted gaps, a split of a batch
//! larger than the target takes, skip mode's batch without its refused records) must give the
//! target exactly the source's records: keys, values, header names and values as bytes (a
//! name that is not UTF-8 too), headers in order with their repeats, nulls as nulls.
//!
//! The source batches are written byte by byte here ([`write_batch`]) and the outgoing ones
//! read back byte by byte ([`read_back`]), with nothing of the codec under test: the
//! `kafka-protocol` crate's `Record` cannot hold such records, so neither its encoder nor its
//! decoder can be the judge. Only the compression is shared: the codec's `compress` and
//! `decompress`, around the crate's codecs.

use bytes::{BufMut, Bytes};
use kafka_protocol::records::Compression;

use super::tests::{CODECS, STAMP, UNLIMITED};
use super::{prepare, split, without, BatchError, OutBatch, SourceBatch};

/// A record as a consumer reads it, every field as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rec {
    offset: i64,
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Records no `Record` of the crate can carry, and the other odd ones, in turn: a header name
/// `0xFF 0xFE`; one header name twice with different values, then once more without a value;
/// a null key and a null value; an empty key and value with a header without a value; a
/// binary key and a value long enough for two-byte lengths (and that compresses little).
/// Timestamps go back and forth, some before the batch's first record.
fn odd_records(offsets: &[i64]) -> Vec<Rec> {
    offsets
        .iter()
        .enumerate()
        .map(|(i, &offset)| {
            let timestamp = 1_700_000_000_000 + ((i as i64 * 7919) % 13) * 1000 - 5000;
            // Bytes that hardly compress, so that a batch split from a compressed one still
            // holds several records.
            let value: Vec<u8> = (0..300u64)
                .map(|j| {
                    let x = (offset as u64 * 300 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    (x >> 56) as u8
                })
                .collect();
            let (key, value, headers) = match i % 5 {
                0 => (
                    Some(format!("key-{offset}").into_bytes()),
                    Some(value),
                    vec![
                        (vec![0xFF, 0xFE], Some(b"not utf-8".to_vec())),
                        (b"trace".to_vec(), Some(format!("t-{offset}").into_bytes())),
                    ],
                ),
                1 => (
                    Some(format!("key-{offset}").into_bytes()),
                    Some(value),
                    vec![
                        (b"k".to_vec(), Some(b"first".to_vec())),
                        (b"k".to_vec(), Some(b"second".to_vec())),
                        (b"k".to_vec(), None),
                    ],
                ),
                2 => (None, None, vec![(vec![0xC3, 0x28], Some(vec![0xFF]))]),
                3 => (
                    Some(Vec::new()),
                    Some(Vec::new()),
                    vec![(b"".to_vec(), None)],
                ),
                _ => (Some(vec![0, 1, 0xFF, 0x80]), Some(value), Vec::new()),
            };
            Rec {
                offset,
                timestamp,
                key,
                value,
                headers,
            }
        })
        .collect()
}

fn put_varlong(buf: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

fn put_field(buf: &mut Vec<u8>, field: Option<&[u8]>) {
    match field {
        None => put_varlong(buf, -1),
        Some(bytes) => {
            put_varlong(buf, bytes.len() as i64);
            buf.extend_from_slice(bytes);
        }
    }
}

/// One record of a records section (Kafka's `DefaultRecord.writeTo`).
fn put_record(buf: &mut Vec<u8>, rec: &Rec, base_offset: i64, base_timestamp: i64) {
    let mut body = vec![0]; // attributes
    put_varlong(&mut body, rec.timestamp - base_timestamp);
    put_varlong(&mut body, rec.offset - base_offset);
    put_field(&mut body, rec.key.as_deref());
    put_field(&mut body, rec.value.as_deref());
    put_varlong(&mut body, rec.headers.len() as i64);
    for (name, value) in &rec.headers {
        put_field(&mut body, Some(name));
        put_field(&mut body, value.as_deref());
    }
    put_varlong(buf, body.len() as i64);
    buf.extend_from_slice(&body);
}

/// `plain` compressed with the crate's codec (the codec's own `compress`, as the batch header
/// is not under test here).
fn compress(plain: &[u8], compression: Compression) -> Vec<u8> {
    super::compress(compression, |buf| buf.put_slice(plain))
        .unwrap()
        .to_vec()
}

fn decompress(body: Bytes, compression: Compression) -> Vec<u8> {
    super::decompress(body, compression).unwrap().to_vec()
}

/// How a source batch is written besides its records.
#[derive(Clone, Copy)]
struct Shape {
    compression: Compression,
    /// The broker's append time (LogAppendTime), the batch's max timestamp.
    append_time: Option<i64>,
    /// The last offset delta when the cleaner removed records after the last one kept.
    last_offset_delta: Option<i32>,
}

impl Shape {
    fn of(compression: Compression) -> Shape {
        Shape {
            compression,
            append_time: None,
            last_offset_delta: None,
        }
    }
}

/// A v2 batch as a broker serves it (Kafka's `DefaultRecordBatch`): the records section
/// written by [`put_record`], compressed, behind a 61-byte header with a producer's fields and
/// the CRC-32C. `records` hold their create times; under LogAppendTime the max timestamp is
/// the append time.
fn write_batch(records: &[Rec], shape: Shape) -> Bytes {
    let base_offset = records[0].offset;
    let base_timestamp = records[0].timestamp;
    let mut plain = Vec::new();
    for rec in records {
        put_record(&mut plain, rec, base_offset, base_timestamp);
    }
    let body = compress(&plain, shape.compression);
    let last_delta = shape
        .last_offset_delta
        .unwrap_or((records[records.len() - 1].offset - base_offset) as i32);
    let max_timestamp = shape
        .append_time
        .unwrap_or_else(|| records.iter().map(|r| r.timestamp).max().unwrap());
    let attributes = shape.compression as i16 | if shape.append_time.is_some() { 0x08 } else { 0 };
    let mut after_crc = Vec::new();
    after_crc.extend(attributes.to_be_bytes());
    after_crc.extend(last_delta.to_be_bytes());
    after_crc.extend(base_timestamp.to_be_bytes());
    after_crc.extend(max_timestamp.to_be_bytes());
    after_crc.extend(77i64.to_be_bytes()); // producer id
    after_crc.extend(5i16.to_be_bytes()); // producer epoch
    after_crc.extend(1000i32.to_be_bytes()); // base sequence
    after_crc.extend((records.len() as i32).to_be_bytes());
    after_crc.extend(body);
    let mut batch = base_offset.to_be_bytes().to_vec();
    batch.extend(((after_crc.len() + 9) as i32).to_be_bytes());
    batch.extend(9i32.to_be_bytes()); // partition leader epoch
    batch.push(2); // magic
    batch.extend(crc32c::crc32c(&after_crc).to_be_bytes());
    batch.extend(after_crc);
    Bytes::from(batch)
}

/// The one batch in `bytes`.
fn only(bytes: Bytes) -> SourceBatch {
    let mut batches = split(bytes);
    let batch = batches.next().unwrap().unwrap();
    assert!(batches.next().is_none());
    batch
}

/// A zigzag varint from the front of `buf`.
fn take_varlong(buf: &mut &[u8]) -> i64 {
    let mut z: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = buf[0];
        *buf = &buf[1..];
        z |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

fn take_field(buf: &mut &[u8]) -> Option<Vec<u8>> {
    let len = take_varlong(buf);
    if len < 0 {
        return None;
    }
    let (field, rest) = buf.split_at(len as usize);
    *buf = rest;
    Some(field.to_vec())
}

fn i64_of(bytes: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn i32_of(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// The records of an outgoing batch as the target reads them (Kafka's `DefaultRecordBatch`
/// and `DefaultRecord.readFrom`), each at its source offset, after checking what a producer's
/// batch must be: CRC-32C, CreateTime, offsets from 0 without gaps, the last offset delta and
/// record count agreeing, the max timestamp the records' greatest, every record's bytes read.
fn read_back(out: &OutBatch) -> Vec<Rec> {
    let bytes = out.to_bytes();
    assert_eq!(i32_of(&bytes, 8) as usize + 12, bytes.len(), "batch length");
    assert_eq!(bytes[16], 2, "magic");
    let crc = u32::from_be_bytes(bytes[17..21].try_into().unwrap());
    assert_eq!(crc, crc32c::crc32c(&bytes[21..]), "CRC-32C");
    let attributes = i16::from_be_bytes(bytes[21..23].try_into().unwrap());
    assert_eq!(
        attributes & 0x78,
        0,
        "CreateTime, not transactional, control or deleted"
    );
    let compression = match attributes & 0x07 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        _ => Compression::Zstd,
    };
    assert_eq!(i64_of(&bytes, 0), 0, "base offset");
    let last_offset_delta = i32_of(&bytes, 23);
    let base_timestamp = i64_of(&bytes, 27);
    let max_timestamp = i64_of(&bytes, 35);
    let count = i32_of(&bytes, 57);
    assert_eq!(count, out.records);
    assert_eq!(last_offset_delta, count - 1, "offsets without gaps");
    let plain = decompress(bytes.slice(61..), compression);
    let mut rest = &plain[..];
    let mut read = Vec::new();
    for i in 0..count {
        let size = take_varlong(&mut rest) as usize;
        let (mut record, after) = rest.split_at(size);
        rest = after;
        assert_eq!(record[0], 0, "record attributes");
        record = &record[1..];
        let timestamp = base_timestamp + take_varlong(&mut record);
        assert_eq!(take_varlong(&mut record), i64::from(i), "offset delta");
        let key = take_field(&mut record);
        let value = take_field(&mut record);
        let headers = (0..take_varlong(&mut record))
            .map(|_| {
                let name = take_field(&mut record).expect("a header name is never null");
                (name, take_field(&mut record))
            })
            .collect();
        assert!(record.is_empty(), "bytes left in record {i}");
        read.push(Rec {
            offset: out.source_offset(i as usize),
            timestamp,
            key,
            value,
            headers,
        });
    }
    assert!(rest.is_empty(), "bytes after the last record");
    let greatest = read.iter().map(|r| r.timestamp).max().unwrap();
    assert_eq!(max_timestamp, greatest, "max timestamp");
    read
}

/// Every record the outgoing batches carry, in order.
fn read_all(outs: &[OutBatch]) -> Vec<Rec> {
    outs.iter().flat_map(read_back).collect()
}

/// Asserts that `outs` carry `want` exactly, record by record.
fn assert_carry(outs: &[OutBatch], want: &[Rec], codec: Compression) {
    let got = read_all(outs);
    assert_eq!(got.len(), want.len(), "{codec:?}: records lost or added");
    for (got, want) in got.iter().zip(want) {
        assert_eq!(got, want, "{codec:?}: source offset {}", want.offset);
    }
}

#[test]
fn a_log_append_time_batch_is_encoded_again_with_every_record_byte_for_byte() {
    let append_time = 1_800_000_000_000;
    for codec in CODECS {
        let offsets: Vec<i64> = (100..110).collect();
        let source = odd_records(&offsets);
        let shape = Shape {
            append_time: Some(append_time),
            ..Shape::of(codec)
        };
        let batch = only(write_batch(&source, shape));
        let outs = prepare(&batch, 100, UNLIMITED, STAMP).unwrap();
        assert!(outs.iter().all(|o| o.reencoded), "{codec:?}");
        let want: Vec<Rec> = source
            .into_iter()
            .map(|r| Rec {
                timestamp: append_time,
                ..r
            })
            .collect();
        assert_carry(&outs, &want, codec);
    }
}

#[test]
fn a_start_inside_a_batch_sends_the_records_from_it_on_byte_for_byte() {
    for codec in CODECS {
        let offsets: Vec<i64> = (100..110).collect();
        let source = odd_records(&offsets);
        let batch = only(write_batch(&source, Shape::of(codec)));
        let outs = prepare(&batch, 103, UNLIMITED, STAMP).unwrap();
        assert!(outs.iter().all(|o| o.reencoded), "{codec:?}");
        assert_carry(&outs, &source[3..], codec);
    }
}

#[test]
fn a_batch_with_compacted_gaps_is_encoded_again_with_every_record_byte_for_byte() {
    for codec in CODECS {
        let offsets = [200, 201, 204, 205, 209, 210, 214];
        let source = odd_records(&offsets);
        // The cleaner keeps the batch's last offset delta (offsets 215 and 216 gone).
        let shape = Shape {
            last_offset_delta: Some(16),
            ..Shape::of(codec)
        };
        let batch = only(write_batch(&source, shape));
        assert!(batch.has_gaps());
        let outs = prepare(&batch, 200, UNLIMITED, STAMP).unwrap();
        assert!(outs.iter().all(|o| o.reencoded), "{codec:?}");
        assert_carry(&outs, &source, codec);
    }
}

#[test]
fn a_batch_larger_than_the_target_takes_is_split_with_every_record_byte_for_byte() {
    for codec in CODECS {
        let offsets: Vec<i64> = (1000..1060).collect();
        let source = odd_records(&offsets);
        let batch = only(write_batch(&source, Shape::of(codec)));
        let max_bytes = batch.size() / 3;
        let outs = prepare(&batch, 1000, max_bytes, STAMP).unwrap();
        assert!(outs.len() >= 3, "{codec:?}: {} batches", outs.len());
        for out in &outs {
            assert!(out.size() <= max_bytes, "{codec:?}: {} bytes", out.size());
        }
        assert_carry(&outs, &source, codec);
    }
}

#[test]
fn a_batch_without_its_refused_records_keeps_the_others_byte_for_byte() {
    for codec in CODECS {
        let offsets: Vec<i64> = (100..110).collect();
        let source = odd_records(&offsets);
        // Copied first (the records section as it came), then refused for two records.
        let batch = only(write_batch(&source, Shape::of(codec)));
        let outs = prepare(&batch, 100, UNLIMITED, STAMP).unwrap();
        assert!(!outs[0].reencoded);
        let refused = [1, 4];
        let rest = without(&outs[0], &refused, UNLIMITED, STAMP).unwrap();
        let want: Vec<Rec> = source
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !refused.contains(i))
            .map(|(_, r)| r)
            .collect();
        assert_carry(&rest, &want, codec);
    }
}

/// Repeated header names alone (each name valid UTF-8), so that nothing but the repeats is
/// at stake: a name given twice with two values and once more without one, in that order,
/// through a LogAppendTime batch (encoded again) and skip mode's batch without a refused
/// record, every codec.
#[test]
fn repeated_header_names_are_encoded_again_in_order_with_every_repeat() {
    let append_time = 1_800_000_000_000;
    for codec in CODECS {
        let source: Vec<Rec> = (300..306)
            .map(|offset| Rec {
                offset,
                timestamp: 1_700_000_000_000 + offset,
                key: Some(format!("key-{offset}").into_bytes()),
                value: Some(format!("value-{offset}").into_bytes()),
                headers: vec![
                    (b"hop".to_vec(), Some(b"a".to_vec())),
                    (b"hop".to_vec(), Some(b"b".to_vec())),
                    (b"other".to_vec(), Some(b"c".to_vec())),
                    (b"hop".to_vec(), None),
                ],
            })
            .collect();
        let shape = Shape {
            append_time: Some(append_time),
            ..Shape::of(codec)
        };
        let batch = only(write_batch(&source, shape));
        let outs = prepare(&batch, 300, UNLIMITED, STAMP).unwrap();
        let want: Vec<Rec> = source
            .iter()
            .cloned()
            .map(|r| Rec {
                timestamp: append_time,
                ..r
            })
            .collect();
        assert_carry(&outs, &want, codec);

        let copied = only(write_batch(&source, Shape::of(codec)));
        let outs = prepare(&copied, 300, UNLIMITED, STAMP).unwrap();
        let rest = without(&outs[0], &[2], UNLIMITED, STAMP).unwrap();
        let want: Vec<Rec> = source
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 2)
            .map(|(_, r)| r.clone())
            .collect();
        assert_carry(&rest, &want, codec);
    }
}

#[test]
fn a_batch_encoded_again_takes_the_compression_of_the_source() {
    for codec in CODECS {
        let offsets: Vec<i64> = (100..110).collect();
        let batch = only(write_batch(&odd_records(&offsets), Shape::of(codec)));
        let outs = prepare(&batch, 101, UNLIMITED, STAMP).unwrap();
        let attributes = i16::from_be_bytes(outs[0].header[21..23].try_into().unwrap());
        assert_eq!(attributes & 0x07, codec as i16);
    }
}

/// A records section whose one record says `header_count` headers and holds none; the rest
/// of the record well formed. Under LogAppendTime, so that the batch is decoded.
fn batch_claiming_headers(header_count: i64) -> Bytes {
    let rec = Rec {
        offset: 40,
        timestamp: 1_700_000_000_000,
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        headers: Vec::new(),
    };
    let mut body = vec![0];
    put_varlong(&mut body, 0);
    put_varlong(&mut body, 0);
    put_field(&mut body, rec.key.as_deref());
    put_field(&mut body, rec.value.as_deref());
    put_varlong(&mut body, header_count);
    let mut plain = Vec::new();
    put_varlong(&mut plain, body.len() as i64);
    plain.extend(body);
    // The section of a one-record batch, its record replaced by this one.
    let shape = Shape {
        append_time: Some(1_800_000_000_000),
        ..Shape::of(Compression::None)
    };
    let well_formed = write_batch(&[rec], shape);
    let mut bytes = well_formed[..61].to_vec();
    bytes.extend(plain);
    let length = (bytes.len() - 12) as i32;
    bytes[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&bytes[21..]);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(bytes)
}

/// The count a broker sends sizes nothing: a header count of 2^31 - 1 in a record of a few
/// bytes is refused before anything is allocated for it (were it allocated, 2^31 headers
/// would ask the allocator for tens of gigabytes and abort the test).
#[test]
fn a_header_count_beyond_the_bytes_left_is_refused_naming_the_offset_and_count() {
    let batch = only(batch_claiming_headers(i64::from(i32::MAX)));
    let err = prepare(&batch, 40, UNLIMITED, STAMP).unwrap_err();
    assert!(
        matches!(err, BatchError::Decode { offset: 40, .. }),
        "{err}"
    );
    let message = err.to_string();
    for needle in ["offset 40", "2147483647 headers", "bytes"] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
}

/// A record count in the header that the records section cannot hold is refused before
/// anything is allocated for it.
#[test]
fn a_record_count_beyond_the_bytes_left_is_refused_naming_the_offset() {
    let offsets: Vec<i64> = (40..43).collect();
    let bytes = write_batch(&odd_records(&offsets), Shape::of(Compression::None));
    let mut bytes = bytes.to_vec();
    bytes[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = crc32c::crc32c(&bytes[21..]);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    // It now has gaps (its last offset delta, 2, and its count disagree): decoded.
    let batch = only(Bytes::from(bytes));
    let err = prepare(&batch, 40, UNLIMITED, STAMP).unwrap_err();
    assert!(
        matches!(err, BatchError::Decode { offset: 40, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("2147483647"), "{err}");
}

/// Whatever bytes a records section holds, decoding it for the re-encode path returns an
/// answer, never a panic: every prefix of a valid batch's records section, and that section
/// with each byte changed in turn, as a batch under LogAppendTime (decoded).
#[test]
fn no_records_section_makes_the_re_encode_path_panic() {
    let offsets: Vec<i64> = (0..6).collect();
    let shape = Shape {
        append_time: Some(1_800_000_000_000),
        ..Shape::of(Compression::None)
    };
    let good = write_batch(&odd_records(&offsets), shape).to_vec();
    let with_section = |section: &[u8]| {
        let mut bytes = good[..61].to_vec();
        bytes.extend_from_slice(section);
        let length = (bytes.len() - 12) as i32;
        bytes[8..12].copy_from_slice(&length.to_be_bytes());
        let crc = crc32c::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        only(Bytes::from(bytes))
    };
    let section = &good[61..];
    for cut in 0..section.len() {
        let _ = prepare(&with_section(&section[..cut]), 0, UNLIMITED, STAMP);
    }
    for at in 0..section.len() {
        for byte in [0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff] {
            let mut changed = section.to_vec();
            changed[at] = byte;
            let _ = prepare(&with_section(&changed), 0, UNLIMITED, STAMP);
        }
    }
}
