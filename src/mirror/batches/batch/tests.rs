//! Unit tests of the batch codec: source batches built with the `kafka-protocol` crate's
//! encoder (every codec), prepared, and read back with the crate's decoder.

use super::*;

use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, RecordSet, TimestampType,
};

pub(super) const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

pub(super) const STAMP: Stamp = Stamp {
    producer_id: 4242,
    producer_epoch: 3,
    base_sequence: 17,
};

/// No limit from the target.
pub(super) const UNLIMITED: usize = usize::MAX;

/// What a source batch is made of.
#[derive(Clone)]
struct Source {
    compression: Compression,
    /// Absolute offsets of the records, ascending.
    offsets: Vec<i64>,
    /// Bytes of each record's value.
    value_len: usize,
    transactional: bool,
    control: bool,
    delete_horizon: bool,
}

impl Source {
    fn new(compression: Compression, base: i64, count: i64) -> Self {
        Self {
            compression,
            offsets: (base..base + count).collect(),
            value_len: 20,
            transactional: false,
            control: false,
            delete_horizon: false,
        }
    }

    /// The records a producer sent: keys, values, headers and timestamps differ per record.
    fn records(&self) -> Vec<Record> {
        self.offsets
            .iter()
            .enumerate()
            .map(|(i, &offset)| {
                let mut headers = IndexMap::new();
                headers.insert(
                    StrBytes::from_static_str("trace"),
                    Some(Bytes::from(format!("t-{offset}"))),
                );
                if i % 3 == 0 {
                    headers.insert(StrBytes::from_static_str("empty"), None);
                }
                // Values that compress, but not to nothing.
                let value: Vec<u8> = (0..self.value_len)
                    .map(|j| b"abcdefghij"[(j * 7 + offset as usize) % 10] ^ (j as u8 & 3))
                    .collect();
                Record {
                    transactional: self.transactional,
                    control: self.control,
                    delete_horizon: self.delete_horizon,
                    partition_leader_epoch: 9,
                    producer_id: 77,
                    producer_epoch: 5,
                    timestamp_type: TimestampType::Creation,
                    offset,
                    sequence: 1000 + (offset - self.offsets[0]) as i32,
                    timestamp: 1_700_000_000_000 + 13 * offset,
                    key: (i % 4 != 1).then(|| Bytes::from(format!("key-{offset}"))),
                    value: (i % 5 != 2).then(|| Bytes::from(value)),
                    headers,
                }
            })
            .collect()
    }

    /// The batch as a broker's fetch response carries it.
    fn batch(&self) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &self.records(),
            &RecordEncodeOptions {
                version: MAGIC_V2,
                compression: self.compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn source_batch(&self) -> SourceBatch {
        only(self.batch())
    }
}

/// The one batch in `bytes`.
fn only(bytes: Bytes) -> SourceBatch {
    let mut batches = split(bytes);
    let batch = batches.next().unwrap().unwrap();
    assert!(batches.next().is_none());
    batch
}

/// Changes header fields as a broker does (`setMaxTimestamp`, the cleaner keeping the last
/// offset delta), and computes the CRC-32C again.
fn patched(batch: &Bytes, patch: impl FnOnce(&mut [u8])) -> Bytes {
    let mut bytes = batch.to_vec();
    patch(&mut bytes);
    let crc = crc32c(&bytes[ATTRIBUTES_AT..]);
    bytes[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(bytes)
}

/// The broker stamped `append_time` on the batch (LogAppendTime).
fn with_log_append_time(batch: &Bytes, append_time: i64) -> Bytes {
    patched(batch, |b| {
        let attributes = i16_at(b, ATTRIBUTES_AT) | TIMESTAMP_TYPE_BIT;
        b[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&attributes.to_be_bytes());
        b[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&append_time.to_be_bytes());
    })
}

/// What the target's decoder reads from an outgoing batch (it checks the CRC-32C).
fn decoded(out: &OutBatch) -> RecordSet {
    RecordBatchDecoder::decode(&mut out.to_bytes()).unwrap()
}

/// Asserts that `outs` carry exactly `expected` (source records), in order, with their keys,
/// values, headers and timestamps, each at its source offset.
fn assert_same_records(expected: &[Record], outs: &[OutBatch]) {
    let mut got = Vec::new();
    for out in outs {
        let set = decoded(out);
        assert_eq!(set.records.len(), out.records as usize);
        for (i, record) in set.records.into_iter().enumerate() {
            got.push((out.source_offset(i), record));
        }
    }
    assert_eq!(got.len(), expected.len(), "records lost or added");
    for ((source_offset, got), want) in got.iter().zip(expected) {
        assert_eq!(*source_offset, want.offset);
        assert_eq!(got.key, want.key, "key of offset {}", want.offset);
        assert_eq!(got.value, want.value, "value of offset {}", want.offset);
        assert_eq!(
            got.headers, want.headers,
            "headers of offset {}",
            want.offset
        );
        assert_eq!(
            got.timestamp, want.timestamp,
            "timestamp of offset {}",
            want.offset
        );
        assert_eq!(got.timestamp_type, TimestampType::Creation);
    }
}

/// Asserts what `LogValidator.validateBatch` asks of a client batch, and our stamp.
fn assert_producer_batch(out: &OutBatch, stamp: Stamp) {
    let set = decoded(out);
    let first = &set.records[0];
    let last = &set.records[set.records.len() - 1];
    assert_eq!(first.offset, 0, "base offset");
    assert_eq!(last.offset - first.offset + 1, set.records.len() as i64);
    assert!(!first.control && !first.transactional && !first.delete_horizon);
    assert_eq!(first.partition_leader_epoch, NO_PARTITION_LEADER_EPOCH);
    assert_eq!(first.producer_id, stamp.producer_id);
    assert_eq!(first.producer_epoch, stamp.producer_epoch);
    for (i, record) in set.records.iter().enumerate() {
        assert_eq!(record.sequence, stamp.base_sequence + i as i32);
    }
    assert_eq!(out.base_sequence(), stamp.base_sequence);
}

#[test]
fn crc_combine_gives_the_crc_of_the_joined_bytes() {
    // Bytes that are not all alike, cut at lengths around every power of two a batch meets.
    let bytes: Vec<u8> = (0..(1u32 << 21) + 7)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for cut in [0, 1, 2, 7, 40, 61, 1000, 4096, 65_535, 1 << 20, bytes.len()] {
        for tail in [0, 1, 3, 61, 1 << 12, 1 << 21] {
            let end = (cut + tail).min(bytes.len());
            let (a, b) = (&bytes[..cut], &bytes[cut..end]);
            assert_eq!(
                crc_combine(crc32c(a), crc32c(b), b.len()),
                crc32c(&bytes[..end]),
                "{cut} + {}",
                b.len()
            );
        }
    }
}

#[test]
fn copied_batch_keeps_the_records_section_byte_for_byte() {
    for codec in CODECS {
        let source = Source::new(codec, 500, 10).source_batch();
        let outs = prepare(&source, 500, UNLIMITED, STAMP).unwrap();
        assert_eq!(outs.len(), 1);
        assert!(!outs[0].reencoded, "{codec:?}");
        assert_eq!(
            &outs[0].body[..],
            &source.bytes()[HEADER_LEN..],
            "{codec:?}"
        );
        // A slice of the fetch response, not a copy.
        assert_eq!(outs[0].body.as_ptr(), source.bytes()[HEADER_LEN..].as_ptr());
    }
}

#[test]
fn detached_batch_lets_go_of_the_fetch_answer_it_was_cut_from() {
    for codec in CODECS {
        let answer = Source::new(codec, 500, 10).batch();
        let outs = prepare(&only(answer.clone()), 500, UNLIMITED, STAMP).unwrap();
        let (out, bytes) = outs.into_iter().next().unwrap().detach();
        assert_eq!(&bytes[HEADER_LEN..], &answer[HEADER_LEN..], "{codec:?}");
        assert_eq!(&out.body[..], &bytes[HEADER_LEN..], "{codec:?}");
        // Nothing but `answer` itself refers to the answer's buffer any more: the connection
        // reads the next answer into it.
        assert!(answer.is_unique(), "{codec:?}");
    }
}

#[test]
fn copied_batch_carries_our_producer_stamp_and_a_valid_crc() {
    for codec in CODECS {
        let source = Source::new(codec, 500, 10).source_batch();
        let outs = prepare(&source, 0, UNLIMITED, STAMP).unwrap();
        assert_producer_batch(&outs[0], STAMP);
        // Our own split reads it too (it checks the CRC-32C as well).
        let again = only(outs[0].to_bytes());
        assert_eq!(again.record_count(), 10);
        assert_eq!(again.compression(), codec);
    }
}

#[test]
fn copied_batch_keeps_every_record() {
    for codec in CODECS {
        let source = Source::new(codec, 500, 10);
        let outs = prepare(&source.source_batch(), 500, UNLIMITED, STAMP).unwrap();
        assert_eq!(
            (outs[0].first_source_offset, outs[0].last_source_offset),
            (500, 509)
        );
        assert_eq!(outs[0].source_offsets, None);
        assert_same_records(&source.records(), &outs);
    }
}

#[test]
fn transactional_batch_is_sent_as_a_plain_idempotent_one() {
    let mut source = Source::new(Compression::Lz4, 40, 6);
    source.transactional = true;
    let batch = source.source_batch();
    assert!(batch.is_transactional());
    assert_eq!(batch.producer_id(), 77);
    let outs = prepare(&batch, 40, UNLIMITED, STAMP).unwrap();
    assert!(!outs[0].reencoded);
    assert_producer_batch(&outs[0], STAMP);
    assert_same_records(&source.records(), &outs);
}

#[test]
fn control_batch_is_dropped() {
    let mut source = Source::new(Compression::None, 40, 1);
    source.control = true;
    let batch = source.source_batch();
    assert!(batch.is_control());
    assert_eq!(plan(&batch, 0, UNLIMITED), Plan::Drop(Dropped::Control));
    assert!(prepare(&batch, 0, UNLIMITED, STAMP).unwrap().is_empty());
}

#[test]
fn batch_entirely_before_the_start_is_dropped() {
    let batch = Source::new(Compression::Zstd, 40, 6).source_batch();
    assert_eq!(
        plan(&batch, 46, UNLIMITED),
        Plan::Drop(Dropped::BeforeStart)
    );
    assert!(prepare(&batch, 46, UNLIMITED, STAMP).unwrap().is_empty());
    // Its last record is still wanted at 45.
    assert_eq!(prepare(&batch, 45, UNLIMITED, STAMP).unwrap().len(), 1);
}

#[test]
fn empty_batch_kept_by_compaction_is_dropped() {
    let batch = Source::new(Compression::None, 40, 3).batch();
    // What the cleaner keeps of a producer's last batch when it removed all its records.
    let empty = patched(&batch.slice(..HEADER_LEN), |b| {
        let length = (HEADER_LEN - LOG_OVERHEAD) as i32;
        b[LENGTH_AT..PARTITION_LEADER_EPOCH_AT].copy_from_slice(&length.to_be_bytes());
        b[RECORD_COUNT_AT..HEADER_LEN].copy_from_slice(&0i32.to_be_bytes());
    });
    let batch = only(empty);
    assert_eq!(batch.last_offset(), 42);
    assert_eq!(plan(&batch, 40, UNLIMITED), Plan::Drop(Dropped::Empty));
    assert!(prepare(&batch, 40, UNLIMITED, STAMP).unwrap().is_empty());
}

#[test]
fn start_inside_a_batch_drops_exactly_the_records_before_it() {
    for codec in CODECS {
        let source = Source::new(codec, 100, 10);
        let batch = source.source_batch();
        assert_eq!(
            plan(&batch, 103, UNLIMITED),
            Plan::Reencode(Reencode::StartInside)
        );
        let outs = prepare(&batch, 103, UNLIMITED, STAMP).unwrap();
        assert_eq!(outs.len(), 1);
        assert!(outs[0].reencoded);
        assert_eq!(outs[0].records, 7);
        assert_eq!(
            (outs[0].first_source_offset, outs[0].last_source_offset),
            (103, 109)
        );
        assert_eq!(decoded(&outs[0]).compression, codec);
        assert_producer_batch(&outs[0], STAMP);
        assert_same_records(&source.records()[3..], &outs);
    }
}

#[test]
fn batch_with_gaps_is_sent_with_contiguous_offsets_and_its_source_offsets() {
    for codec in CODECS {
        let mut source = Source::new(codec, 200, 0);
        source.offsets = vec![200, 201, 204, 205, 209];
        // The cleaner keeps the batch's last offset delta (here 11: offsets 210 and 211 gone).
        let batch = only(patched(&source.batch(), |b| {
            b[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT].copy_from_slice(&11i32.to_be_bytes());
        }));
        assert!(batch.has_gaps());
        assert_eq!(batch.last_offset(), 211);
        assert_eq!(plan(&batch, 200, UNLIMITED), Plan::Reencode(Reencode::Gaps));
        let outs = prepare(&batch, 200, UNLIMITED, STAMP).unwrap();
        assert_eq!(outs.len(), 1);
        assert_eq!(
            outs[0].source_offsets.as_deref(),
            Some(&[200, 201, 204, 205, 209][..])
        );
        assert_eq!(decoded(&outs[0]).compression, codec);
        assert_producer_batch(&outs[0], STAMP);
        assert_same_records(&source.records(), &outs);
    }
}

#[test]
fn log_append_time_batch_gives_each_record_the_append_time_as_create_time() {
    let append_time = 1_800_000_000_000;
    for codec in CODECS {
        let source = Source::new(codec, 0, 8);
        let batch = only(with_log_append_time(&source.batch(), append_time));
        assert!(batch.log_append_time());
        assert_eq!(
            plan(&batch, 0, UNLIMITED),
            Plan::Reencode(Reencode::LogAppendTime)
        );
        let outs = prepare(&batch, 0, UNLIMITED, STAMP).unwrap();
        let mut expected = source.records();
        for record in &mut expected {
            record.timestamp = append_time;
        }
        assert_producer_batch(&outs[0], STAMP);
        assert_same_records(&expected, &outs);
        let sent = only(outs[0].to_bytes());
        assert!(
            !sent.log_append_time(),
            "a producer may not send LogAppendTime"
        );
        assert_eq!(sent.max_timestamp(), append_time);
    }
}

#[test]
fn delete_horizon_bit_is_cleared_and_timestamps_kept() {
    let mut source = Source::new(Compression::Snappy, 60, 5);
    source.delete_horizon = true;
    let batch = source.source_batch();
    assert!(batch.has_delete_horizon());
    let outs = prepare(&batch, 60, UNLIMITED, STAMP).unwrap();
    assert!(!outs[0].reencoded);
    assert!(!only(outs[0].to_bytes()).has_delete_horizon());
    assert_same_records(&source.records(), &outs);
}

#[test]
fn batch_larger_than_max_bytes_is_split_into_batches_within_it_losing_nothing() {
    for codec in CODECS {
        let mut source = Source::new(codec, 1000, 200);
        source.value_len = 300;
        let batch = source.source_batch();
        let max_bytes = batch.size() / 3;
        assert_eq!(
            plan(&batch, 1000, max_bytes),
            Plan::Reencode(Reencode::TooLarge)
        );
        let outs = prepare(&batch, 1000, max_bytes, STAMP).unwrap();
        assert!(outs.len() >= 3, "{codec:?}: {} batches", outs.len());
        for out in &outs {
            assert!(out.size() <= max_bytes, "{codec:?}: {} bytes", out.size());
            assert_eq!(decoded(out).compression, codec);
        }
        assert_same_records(&source.records(), &outs);
    }
}

#[test]
fn each_outgoing_batch_charges_the_throttle_its_bytes_as_sent_and_its_records() {
    for codec in CODECS {
        let mut source = Source::new(codec, 0, 120);
        source.value_len = 200;
        let batch = source.source_batch();
        // Copied: the source batch's own bytes, compressed as they came.
        let copied = prepare(&batch, 0, UNLIMITED, STAMP).unwrap();
        assert_eq!(copied.len(), 1);
        assert_eq!(
            copied[0].throttle_cost(),
            (batch.size() as u64, 120),
            "{codec:?}"
        );
        assert_eq!(copied[0].to_bytes().len(), batch.size());
        // Split: each part its own bytes as sent; the records counted once in all.
        let split = prepare(&batch, 0, batch.size() / 3, STAMP).unwrap();
        assert!(split.len() > 1, "{codec:?}");
        let mut records = 0;
        for out in &split {
            let (bytes, n) = out.throttle_cost();
            assert_eq!(bytes, out.to_bytes().len() as u64, "{codec:?}");
            records += n;
        }
        assert_eq!(records, 120, "{codec:?}");
    }
}

#[test]
fn split_batches_take_consecutive_sequences_from_the_stamp() {
    let mut source = Source::new(Compression::None, 0, 50);
    source.value_len = 100;
    let batch = source.source_batch();
    let outs = prepare(&batch, 0, batch.size() / 4, STAMP).unwrap();
    assert!(outs.len() > 1);
    let mut sequence = STAMP.base_sequence;
    for out in &outs {
        assert_producer_batch(
            out,
            Stamp {
                base_sequence: sequence,
                ..STAMP
            },
        );
        sequence += out.records;
    }
    assert_eq!(sequence, STAMP.base_sequence + 50);
}

#[test]
fn restamped_batch_carries_the_new_stamp_and_the_same_records() {
    let source = Source::new(Compression::Zstd, 0, 10);
    let batch = source.source_batch();
    let new = Stamp {
        producer_id: 9001,
        producer_epoch: 0,
        base_sequence: 0,
    };
    // Copied and re-encoded (a start inside) alike.
    for start in [0, 2] {
        let mut outs = prepare(&batch, start, UNLIMITED, STAMP).unwrap();
        let body = outs[0].body.clone();
        outs[0].restamp(new);
        assert_producer_batch(&outs[0], new);
        assert_eq!(outs[0].body, body);
        assert_same_records(&source.records()[start as usize..], &outs);
    }
}

/// What skip mode sends in place of a batch the target refused for some of its records: the
/// others, each with its source offset, sequences from the refused batch's first, in batches
/// the target takes. Copied and re-encoded batches (a compacted source's gaps) alike.
#[test]
fn a_batch_without_its_refused_records_keeps_the_others_and_their_source_offsets() {
    let mut compacted = Source::new(Compression::Lz4, 100, 12);
    compacted.offsets = vec![100, 101, 103, 104, 107, 108, 110, 111, 112, 115, 116, 119];
    for source in [Source::new(Compression::None, 100, 12), compacted] {
        let outs = prepare(&source.source_batch(), 0, UNLIMITED, STAMP).unwrap();
        assert_eq!(outs.len(), 1);
        let refused = [0, 5, 11];
        let again = Stamp {
            base_sequence: 40,
            ..STAMP
        };
        let rest = without(&outs[0], &refused, UNLIMITED, again).unwrap();
        let expected: Vec<Record> = source
            .records()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !refused.contains(i))
            .map(|(_, r)| r)
            .collect();
        assert_same_records(&expected, &rest);
        assert_producer_batch(&rest[0], again);
        assert_eq!(rest[0].records, 9);
    }
}

#[test]
fn sequences_wrap_to_zero_as_kafka_does() {
    assert_eq!(next_sequence(5, 3), 8);
    assert_eq!(next_sequence(i32::MAX - 2, 2), i32::MAX);
    assert_eq!(next_sequence(i32::MAX - 2, 3), 0);
    assert_eq!(next_sequence(i32::MAX, 5), 4);
}

#[test]
fn record_larger_than_max_bytes_is_an_error_naming_offset_size_and_limit() {
    let mut source = Source::new(Compression::None, 300, 3);
    source.value_len = 5000;
    let batch = source.source_batch();
    let err = prepare(&batch, 300, 2000, STAMP).unwrap_err();
    let BatchError::RecordTooLarge {
        offset,
        size,
        limit,
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!((offset, limit), (300, 2000));
    assert!(size > 5000, "{size}");
    let message = err.to_string();
    assert!(
        message.contains("offset 300") && message.contains("2000"),
        "{message}"
    );
}

#[test]
fn split_yields_every_batch_of_a_fetch_response_in_order() {
    let mut records = BytesMut::new();
    for (i, codec) in CODECS.into_iter().enumerate() {
        records.extend_from_slice(&Source::new(codec, 10 * i as i64, 10).batch());
    }
    let batches: Vec<SourceBatch> = split(records.freeze()).map(Result::unwrap).collect();
    assert_eq!(batches.len(), CODECS.len());
    for (i, batch) in batches.iter().enumerate() {
        assert_eq!(batch.base_offset(), 10 * i as i64);
        assert_eq!(batch.last_offset(), 10 * i as i64 + 9);
        assert_eq!(batch.record_count(), 10);
        assert_eq!(batch.compression(), CODECS[i]);
        assert_eq!(batch.magic(), MAGIC_V2);
        assert_eq!(batch.producer_id(), 77);
    }
}

#[test]
fn truncated_last_batch_ends_split_without_error() {
    let first = Source::new(Compression::Lz4, 0, 5).batch();
    let second = Source::new(Compression::Lz4, 5, 5).batch();
    for cut in [1, LOG_OVERHEAD, HEADER_LEN, second.len() - 1] {
        let mut records = BytesMut::from(&first[..]);
        records.extend_from_slice(&second[..cut]);
        let mut batches = split(records.freeze());
        assert_eq!(batches.next().unwrap().unwrap().base_offset(), 0);
        assert!(batches.next().is_none(), "cut at {cut}");
        assert_eq!(batches.remainder(), cut);
    }
}

#[test]
fn corrupt_crc_is_an_error_naming_the_offset() {
    let batch = Source::new(Compression::Gzip, 777, 5).batch();
    let mut bytes = batch.to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let mut batches = split(Bytes::from(bytes));
    let err = batches.next().unwrap().unwrap_err();
    assert!(matches!(err, BatchError::Crc { offset: 777, .. }), "{err}");
    assert!(err.to_string().contains("offset 777"), "{err}");
    assert!(batches.next().is_none(), "nothing after a corrupt batch");
}

#[test]
fn batch_length_shorter_than_a_header_is_an_error_naming_the_offset() {
    let batch = Source::new(Compression::None, 31, 2).batch();
    let mut bytes = batch.to_vec();
    bytes[LENGTH_AT..PARTITION_LEADER_EPOCH_AT].copy_from_slice(&20i32.to_be_bytes());
    let err = split(Bytes::from(bytes)).next().unwrap().unwrap_err();
    assert!(
        matches!(err, BatchError::Malformed { offset: 31, .. }),
        "{err}"
    );
}

/// A message of format v0 or v1 as Kafka before 0.11 writes it (`LegacyRecord.write`): the
/// tests' own fixture, as nothing else here writes the format (the crate cannot); the trial on
/// Kafka 2.8 reads ones its broker wrote.
fn legacy(
    offset: i64,
    magic: u8,
    attributes: u8,
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Vec<u8> {
    let mut body = vec![magic, attributes];
    if magic == 1 {
        body.extend(timestamp.to_be_bytes());
    }
    for field in [key, value] {
        match field {
            None => body.extend((-1i32).to_be_bytes()),
            Some(bytes) => {
                body.extend((bytes.len() as i32).to_be_bytes());
                body.extend(bytes);
            }
        }
    }
    let mut message = offset.to_be_bytes().to_vec();
    message.extend(((body.len() + 4) as i32).to_be_bytes());
    message.extend(crc32fast::hash(&body).to_be_bytes());
    message.extend(body);
    message
}

/// `inner` messages compressed with `codec` into a wrapper message at `offset`.
fn legacy_wrapper(
    offset: i64,
    magic: u8,
    codec: Compression,
    log_append_time: bool,
    timestamp: i64,
    inner: &[Vec<u8>],
) -> Vec<u8> {
    use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy};
    let plain = inner.concat();
    let mut out = BytesMut::new();
    let put = |buf: &mut BytesMut| {
        buf.put_slice(&plain);
        Ok(())
    };
    let (bits, compressed) = match codec {
        Compression::Gzip => (1, <Gzip as Compressor<BytesMut>>::compress(&mut out, put)),
        Compression::Snappy => (2, <Snappy as Compressor<BytesMut>>::compress(&mut out, put)),
        Compression::Lz4 => (3, <Lz4 as Compressor<BytesMut>>::compress(&mut out, put)),
        other => panic!("{other:?} is no codec of a legacy wrapper"),
    };
    compressed.unwrap();
    let attributes = bits | if log_append_time { 0x08 } else { 0 };
    legacy(offset, magic, attributes, timestamp, None, Some(&out))
}

/// A record as the engine should forward a legacy one: at `offset`, CreateTime `timestamp`.
fn forwarded(offset: i64, timestamp: i64, key: Option<&str>, value: &str) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp,
        key: key.map(|k| Bytes::from(k.to_owned())),
        value: Some(Bytes::from(value.to_owned())),
        headers: Default::default(),
    }
}

/// Uncompressed v1 messages (a compacted log: offset 12 gone) become one v2 batch, each record
/// at its source offset with its own timestamp, which the engine copies under its stamp.
#[test]
fn legacy_v1_messages_are_forwarded_as_one_v2_batch_at_their_offsets() {
    let mut set = legacy(10, 1, 0, 1_500_000_000_010, Some(b"a"), Some(b"one"));
    set.extend(legacy(11, 1, 0, 1_500_000_000_011, None, Some(b"two")));
    set.extend(legacy(
        13,
        1,
        0,
        1_500_000_000_013,
        Some(b"c"),
        Some(b"three"),
    ));
    let batch = only(Bytes::from(set));
    assert_eq!((batch.base_offset(), batch.last_offset()), (10, 13));
    let outs = prepare(&batch, 0, UNLIMITED, STAMP).unwrap();
    assert_producer_batch(&outs[0], STAMP);
    assert_same_records(
        &[
            forwarded(10, 1_500_000_000_010, Some("a"), "one"),
            forwarded(11, 1_500_000_000_011, None, "two"),
            forwarded(13, 1_500_000_000_013, Some("c"), "three"),
        ],
        &outs,
    );
}

/// A compressed v1 wrapper holds relative offsets, its own being the last one's absolute
/// offset; under LogAppendTime its timestamp is each record's. The batch keeps the codec.
#[test]
fn a_compressed_v1_wrapper_gives_its_records_absolute_offsets_and_its_append_time() {
    for codec in [Compression::Gzip, Compression::Snappy, Compression::Lz4] {
        let inner: Vec<Vec<u8>> = (0..3)
            .map(|i| legacy(i, 1, 0, 1_500_000_000_000 + i, None, Some(b"v")))
            .collect();
        let appended = 1_600_000_000_000;
        let wrapper = legacy_wrapper(52, 1, codec, true, appended, &inner);
        let batch = only(Bytes::from(wrapper));
        assert_eq!(batch.compression(), codec);
        let outs = prepare(&batch, 0, UNLIMITED, STAMP).unwrap();
        let expected: Vec<Record> = (50..53)
            .map(|o| forwarded(o, appended, None, "v"))
            .collect();
        assert_same_records(&expected, &outs);
    }
}

/// Under CreateTime each record a v1 wrapper holds keeps its own timestamp.
#[test]
fn a_compressed_v1_wrapper_under_create_time_keeps_each_records_timestamp() {
    let inner: Vec<Vec<u8>> = (0..3)
        .map(|i| legacy(i, 1, 0, 1_500_000_000_000 + i, None, Some(b"v")))
        .collect();
    let wrapper = legacy_wrapper(9, 1, Compression::Gzip, false, 1_500_000_000_002, &inner);
    let outs = prepare(&only(Bytes::from(wrapper)), 0, UNLIMITED, STAMP).unwrap();
    let expected: Vec<Record> = (7..10)
        .map(|o| forwarded(o, 1_500_000_000_000 + o - 7, None, "v"))
        .collect();
    assert_same_records(&expected, &outs);
}

/// v0 has no timestamps (the records get none, -1) and its wrappers hold absolute offsets.
#[test]
fn legacy_v0_records_have_no_timestamp_and_keep_their_absolute_offsets() {
    let inner: Vec<Vec<u8>> = (5..8)
        .map(|o| legacy(o, 0, 0, 0, Some(b"k"), Some(b"v0")))
        .collect();
    let mut set = legacy_wrapper(7, 0, Compression::Snappy, false, 0, &inner);
    set.extend(legacy(8, 0, 0, 0, None, Some(b"plain")));
    let mut batches = split(Bytes::from(set));
    let wrapped = batches.next().unwrap().unwrap();
    let plain = batches.next().unwrap().unwrap();
    assert!(
        batches.next().is_none(),
        "a codec change starts a new batch"
    );
    let expected: Vec<Record> = (5..8).map(|o| forwarded(o, -1, Some("k"), "v0")).collect();
    assert_same_records(&expected, &prepare(&wrapped, 0, UNLIMITED, STAMP).unwrap());
    assert_same_records(
        &[forwarded(8, -1, None, "plain")],
        &prepare(&plain, 0, UNLIMITED, STAMP).unwrap(),
    );
}

/// Legacy messages, then v2 batches, as a log upgraded in place holds them: both read, in
/// order; and a message cut at the end of the fetch ends the split with its bytes left over.
#[test]
fn legacy_messages_then_v2_batches_are_read_in_order_and_a_cut_one_is_left_over() {
    let mut bytes = legacy(0, 1, 0, 1_500_000_000_000, None, Some(b"old"));
    bytes.extend_from_slice(&Source::new(Compression::None, 1, 3).batch());
    let cut = legacy(4, 1, 0, 1_500_000_000_004, None, Some(b"cut"));
    bytes.extend_from_slice(&cut[..cut.len() - 2]);
    let mut batches = split(Bytes::from(bytes));
    let first = batches.next().unwrap().unwrap();
    let second = batches.next().unwrap().unwrap();
    assert!(batches.next().is_none());
    assert_eq!((first.base_offset(), first.last_offset()), (0, 0));
    assert_eq!((second.base_offset(), second.last_offset()), (1, 3));
    assert_eq!(batches.remainder(), cut.len() - 2);
}

#[test]
fn a_legacy_message_failing_its_crc_is_an_error_naming_its_offset_and_magic() {
    let mut message = legacy(900, 1, 0, 1_600_000_000_000, None, Some(b"v"));
    let last = message.len() - 1;
    message[last] = b'w';
    let err = split(Bytes::from(message)).next().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            BatchError::Legacy {
                offset: 900,
                magic: 1,
                ..
            }
        ),
        "{err}"
    );
    for needle in ["offset 900", "v1", "CRC-32", "log segment"] {
        assert!(err.to_string().contains(needle), "{needle:?} not in {err}");
    }
}

/// The folder of a pinned Kafka version's jars (`scripts/kafka-jars` fetches them once).
fn kafka_libs(version: &str) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/kafka-jars"))
        .arg(version)
        .output()
        .expect("scripts/kafka-jars");
    assert!(out.status.success(), "scripts/kafka-jars {version} failed");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// One record as Kafka's `DumpLogSegments --deep-iteration --print-data-log` prints it.
#[derive(Debug, PartialEq, Eq)]
struct Printed {
    create_time: i64,
    key: Option<String>,
    value_size: i64,
    header_keys: String,
}

fn printed(line: &str) -> Printed {
    let after = |name: &str| {
        let at = line
            .find(name)
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + name.len();
        line[at..].split(' ').next().unwrap().to_owned()
    };
    let key_size: i64 = after(" keySize: ").parse().unwrap();
    Printed {
        create_time: after(" CreateTime: ").parse().unwrap(),
        key: (key_size >= 0).then(|| after(" key: ")),
        value_size: after(" valueSize: ").parse().unwrap(),
        header_keys: after(" headerKeys: "),
    }
}

fn expected_printed(record: &Record) -> Printed {
    Printed {
        create_time: record.timestamp,
        key: record
            .key
            .as_ref()
            .map(|k| String::from_utf8(k.to_vec()).unwrap()),
        value_size: record.value.as_ref().map_or(-1, |v| v.len() as i64),
        header_keys: format!(
            "[{}]",
            record
                .headers
                .keys()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

#[test]
fn kafkas_own_reader_accepts_every_prepared_batch() {
    // What prepare makes in every codec and on every path, as a log segment: each batch at
    // the offset a broker would give it (the base offset is outside the CRC).
    let mut segment = BytesMut::new();
    let mut expected = Vec::new();
    let mut batches = 0;
    let mut next = 0i64;
    let append_time = 1_800_000_000_000;
    for codec in CODECS {
        let mut source = Source::new(codec, 100, 10);
        source.value_len = 200;
        let batch = source.source_batch();
        let all = source.records();
        let mut appended = source.records();
        for record in &mut appended {
            record.timestamp = append_time;
        }
        let log_append = only(with_log_append_time(&source.batch(), append_time));
        for (outs, records) in [
            (prepare(&batch, 100, UNLIMITED, STAMP).unwrap(), &all[..]),
            (prepare(&batch, 104, UNLIMITED, STAMP).unwrap(), &all[4..]),
            (
                prepare(&batch, 100, batch.size() / 2, STAMP).unwrap(),
                &all[..],
            ),
            (
                prepare(&log_append, 100, UNLIMITED, STAMP).unwrap(),
                &appended[..],
            ),
        ] {
            for out in outs {
                let mut bytes = out.to_bytes().to_vec();
                bytes[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&next.to_be_bytes());
                next += i64::from(out.records);
                segment.extend_from_slice(&bytes);
                batches += 1;
            }
            expected.extend(records.iter().map(expected_printed));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("00000000000000000000.log");
    std::fs::write(&file, &segment).unwrap();

    for (version, class) in [
        ("3.9.2", "kafka.tools.DumpLogSegments"),
        ("4.4.0", "org.apache.kafka.tools.DumpLogSegments"),
    ] {
        let out = std::process::Command::new("java")
            .arg("-cp")
            .arg(format!("{}/*", kafka_libs(version).display()))
            .args([class, "--deep-iteration", "--print-data-log", "--files"])
            .arg(&file)
            .output()
            .expect("java");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{version}: {text}");
        let valid = text.lines().filter(|l| l.contains("isvalid: true")).count();
        assert_eq!(
            valid, batches,
            "{version}: batches with a valid CRC\n{text}"
        );
        let records: Vec<Printed> = text
            .lines()
            .filter(|l| l.starts_with("| offset: "))
            .map(printed)
            .collect();
        assert_eq!(records, expected, "{version}");
    }
}

/// CPU time this thread has run, in seconds (Linux's schedstat: the measurement below is taken
/// on a shared machine, where wall time says more about the neighbours than about the code).
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    let ns: u64 = stat.split_whitespace().next().unwrap().parse().unwrap();
    ns as f64 / 1e9
}

/// The copy path's cost in CPU time, measured: `cargo test --release --lib
/// copy_path_throughput -- --ignored --nocapture`. Over 10 rounds of 256 batches of 1,000
/// records of 1 KB: split (CRC-32C check of every byte), prepare (header rewrite, CRC-32C from
/// the records' CRC) and `to_bytes` (the join into one buffer); then the re-encode path (a
/// start inside each batch) per codec.
#[test]
#[ignore = "a measurement, not a check: run it in release"]
fn copy_path_throughput() {
    const ROUNDS: usize = 10;
    let mut source = Source::new(Compression::None, 0, 1000);
    source.value_len = 1000;
    let one = source.batch();
    let mut response = BytesMut::new();
    for _ in 0..256 {
        response.extend_from_slice(&one);
    }
    let response = response.freeze();
    let bytes = (ROUNDS * response.len()) as f64;

    let (mut split_s, mut prepare_s, mut join_s) = (0.0, 0.0, 0.0);
    for _ in 0..ROUNDS {
        let began = thread_cpu_seconds();
        let batches: Vec<SourceBatch> = split(response.clone()).map(Result::unwrap).collect();
        let split_done = thread_cpu_seconds();
        let outs: Vec<OutBatch> = batches
            .iter()
            .flat_map(|b| prepare(b, 0, UNLIMITED, STAMP).unwrap())
            .collect();
        let prepare_done = thread_cpu_seconds();
        let joined: usize = outs.iter().map(|o| o.to_bytes().len()).sum();
        let join_done = thread_cpu_seconds();
        assert_eq!(joined, response.len());
        split_s += split_done - began;
        prepare_s += prepare_done - split_done;
        join_s += join_done - prepare_done;
    }
    println!(
        "copy path, {} batches of {} B: split (CRC-32C check) {:.2} GB per CPU second; \
         prepare (header + CRC) {:.0} ns per batch; to_bytes (join) {:.2} GB per CPU second",
        ROUNDS * 256,
        one.len(),
        bytes / split_s / 1e9,
        prepare_s / (ROUNDS * 256) as f64 * 1e9,
        bytes / join_s / 1e9
    );

    for codec in CODECS {
        let mut source = Source::new(codec, 0, 1000);
        source.value_len = 1000;
        let batch = source.source_batch();
        let began = thread_cpu_seconds();
        let mut sent = 0;
        for _ in 0..ROUNDS {
            sent += prepare(&batch, 1, UNLIMITED, STAMP).unwrap()[0].records;
        }
        let seconds = thread_cpu_seconds() - began;
        assert_eq!(sent, ROUNDS as i32 * 999);
        println!(
            "re-encode {codec:?} ({} B batches): {:.0} MB of values per CPU second",
            batch.size(),
            (ROUNDS * 1000 * 1000) as f64 / seconds / 1e6
        );
    }
}

/// The heap a thread holds, counted by a global allocator for the unit tests (as
/// `tests/allocations.rs` counts allocations): live bytes and their peak, per thread, so that
/// the tests running beside the measured one do not count.
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<i64> = const { Cell::new(0) };
        static PEAK: Cell<i64> = const { Cell::new(0) };
    }

    fn add(bytes: i64) {
        // `try_with`: a thread's own allocations while it ends are not counted.
        let _ = LIVE.try_with(|live| {
            let now = live.get() + bytes;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    struct Counting;

    #[allow(unsafe_code)] // a counting allocator is unsafe by its trait
                          // SAFETY: forwards every call to the system allocator unchanged; only counts.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as i64);
            // SAFETY: the caller's contract is passed on as is.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as i64);
            // SAFETY: as above.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            add(-(layout.size() as i64));
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            add(new_size as i64 - layout.size() as i64);
            // SAFETY: as above.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// What `f` returns, and the most heap this thread held at once while it ran, beyond what
    /// it held before (the C libraries' own allocations, zstd's and lz4's, are not counted).
    pub(super) fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let before = LIVE.with(Cell::get);
        PEAK.with(|peak| peak.set(before));
        let out = f();
        let peak = PEAK.with(Cell::get);
        (out, (peak - before).max(0) as usize)
    }
}

const MIB: usize = 1 << 20;

fn put_varint(buf: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

/// `plain` as one member or frame of `codec` (gzip or zstd), compressed as a stream.
fn compressed_part(codec: Compression, plain: impl Fn(&mut dyn std::io::Write)) -> Vec<u8> {
    use std::io::Write as _;
    match codec {
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            plain(&mut e);
            e.finish().unwrap()
        }
        Compression::Zstd => {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            plain(&mut e);
            e.flush().unwrap();
            e.finish().unwrap()
        }
        _ => unreachable!("gzip or zstd"),
    }
}

/// A LogAppendTime batch at offset `base` of `count` records whose values are `value_mib` MiB
/// of zeros each (null keys, no headers), its records section `codec`-compressed as
/// concatenated members (gzip) or frames (zstd), as Kafka's Java reader takes them: built
/// without ever holding the plain records (each record's framing a part of its own, the zeros
/// one part compressed once and repeated).
fn batch_of_zeros(codec: Compression, base: i64, count: i32, value_mib: usize) -> SourceBatch {
    let zeros = vec![0u8; MIB];
    let value = compressed_part(codec, |w| {
        for _ in 0..value_mib {
            w.write_all(&zeros).unwrap();
        }
    });
    let mut section = Vec::new();
    for i in 0..count {
        let mut fields = vec![0]; // attributes
        put_varint(&mut fields, 0); // timestamp delta
        put_varint(&mut fields, i64::from(i)); // offset delta
        put_varint(&mut fields, -1); // key: null
        put_varint(&mut fields, (value_mib * MIB) as i64);
        let size = fields.len() + value_mib * MIB + 1; // and the header count
        let mut prefix = Vec::new();
        put_varint(&mut prefix, size as i64);
        prefix.extend(fields);
        section.extend(compressed_part(codec, |w| w.write_all(&prefix).unwrap()));
        section.extend_from_slice(&value);
        section.extend(compressed_part(codec, |w| w.write_all(&[0]).unwrap()));
    }
    let mut bytes = vec![0u8; HEADER_LEN];
    bytes[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&base.to_be_bytes());
    let length = (HEADER_LEN - LOG_OVERHEAD + section.len()) as i32;
    bytes[LENGTH_AT..PARTITION_LEADER_EPOCH_AT].copy_from_slice(&length.to_be_bytes());
    bytes[MAGIC_AT] = MAGIC_V2 as u8;
    let attributes = codec as i16 | TIMESTAMP_TYPE_BIT;
    bytes[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&attributes.to_be_bytes());
    bytes[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT].copy_from_slice(&(count - 1).to_be_bytes());
    bytes[BASE_TIMESTAMP_AT..MAX_TIMESTAMP_AT].copy_from_slice(&1_700_000_000_000i64.to_be_bytes());
    bytes[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&1_800_000_000_000i64.to_be_bytes());
    bytes[PRODUCER_ID_AT..PRODUCER_EPOCH_AT].copy_from_slice(&(-1i64).to_be_bytes());
    bytes[PRODUCER_EPOCH_AT..BASE_SEQUENCE_AT].copy_from_slice(&(-1i16).to_be_bytes());
    bytes[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&(-1i32).to_be_bytes());
    bytes[RECORD_COUNT_AT..HEADER_LEN].copy_from_slice(&count.to_be_bytes());
    bytes.extend(section);
    let crc = crc32c(&bytes[ATTRIBUTES_AT..]);
    bytes[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
    only(Bytes::from(bytes))
}

/// A zigzag varint read from a stream.
fn read_varint(r: &mut impl std::io::Read) -> i64 {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let mut b = [0u8];
        r.read_exact(&mut b).unwrap();
        z |= u64::from(b[0] & 0x7f) << shift;
        if b[0] & 0x80 == 0 {
            break;
        }
    }
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

/// Each record of `out` read as a stream (never whole): its source offset, timestamp, key and
/// value lengths (-1: null) and header count, its value checked to be zeros.
fn streamed_records(out: &OutBatch, codec: Compression) -> Vec<(i64, i64, i64, i64, i64)> {
    use std::io::Read as _;
    let body: &[u8] = &out.body;
    let mut plain: Box<dyn std::io::Read> = match codec {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(body)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(body).unwrap()),
        _ => unreachable!("gzip or zstd"),
    };
    let base_timestamp = i64_at(&out.header, BASE_TIMESTAMP_AT);
    let mut got = Vec::new();
    let mut chunk = vec![0u8; MIB];
    for i in 0..out.records as usize {
        let _size = read_varint(&mut plain);
        plain.read_exact(&mut [0u8]).unwrap();
        let timestamp = base_timestamp + read_varint(&mut plain);
        assert_eq!(read_varint(&mut plain), i as i64, "offset delta");
        let key = read_varint(&mut plain);
        assert!(key < 0, "the keys are null");
        let value = read_varint(&mut plain);
        let mut left = value.max(0) as usize;
        while left > 0 {
            let n = left.min(MIB);
            plain.read_exact(&mut chunk[..n]).unwrap();
            assert!(chunk[..n].iter().all(|&b| b == 0), "the values are zeros");
            left -= n;
        }
        let headers = read_varint(&mut plain);
        got.push((out.source_offset(i), timestamp, key, value, headers));
    }
    assert_eq!(
        plain.read(&mut [0u8]).unwrap(),
        0,
        "bytes after the last record"
    );
    got
}

/// Issue 42: one zstd batch of 30 records of 32 MiB of zeros (a few hundred KB on the wire),
/// LogAppendTime (so encoded again), took the mirror to 1,891 MiB of RSS: the codec held the
/// whole records section decompressed, then a copy of it to compress. Encoded again record by
/// record as a stream, the heap stays within a bound far below the 960 MiB of plain records,
/// and every record arrives, its offset, timestamp and 32 MiB value as they were.
#[test]
fn a_batch_that_expands_a_thousandfold_is_encoded_again_in_bounded_memory() {
    for (codec, count) in [(Compression::Zstd, 30), (Compression::Gzip, 6)] {
        let batch = batch_of_zeros(codec, 5000, count, 32);
        assert!(batch.size() < 2 * MIB, "{codec:?}: {} bytes", batch.size());
        assert_eq!(
            plan(&batch, 5000, 8 * MIB),
            Plan::Reencode(Reencode::LogAppendTime)
        );
        let (outs, peak) = heap::peak_during(|| prepare(&batch, 5000, 8 * MIB, STAMP).unwrap());
        eprintln!(
            "{codec:?}: {count} records of 32 MiB, {} bytes on the wire: {} batches out, peak \
             heap {} MiB",
            batch.size(),
            outs.len(),
            peak / MIB
        );
        assert!(
            peak < 128 * MIB,
            "{codec:?}: the heap peaked at {} MiB while encoding again",
            peak / MIB
        );
        let mut got = Vec::new();
        for out in &outs {
            assert!(out.size() <= 8 * MIB);
            got.extend(streamed_records(out, codec));
        }
        let want: Vec<_> = (0..i64::from(count))
            .map(|i| (5000 + i, 1_800_000_000_000, -1, (32 * MIB) as i64, 0))
            .collect();
        assert_eq!(got, want, "{codec:?}");
    }
}

/// A raw snappy section (librdkafka's) is one block read whole: one that states more than the
/// engine decompresses at once is refused before anything is allocated for it, naming the
/// batch's offsets, the size and the bound (the stream then meets it as a send failure).
#[test]
fn a_snappy_block_past_the_bound_is_refused_naming_the_offsets_size_and_bound() {
    let bound = codec::SNAPPY_BLOCK_BOUND;
    let mut section = codec::snappy_length_header(bound as u64 + 1);
    section.extend([0u8; 32]);
    let good = Source::new(Compression::Snappy, 700, 3).batch();
    let mut bytes = good[..HEADER_LEN].to_vec();
    bytes.extend(section);
    let length = (bytes.len() - LOG_OVERHEAD) as i32;
    bytes[LENGTH_AT..PARTITION_LEADER_EPOCH_AT].copy_from_slice(&length.to_be_bytes());
    let batch = only(with_log_append_time(&Bytes::from(bytes), 1_800_000_000_000));
    let (result, peak) = heap::peak_during(|| prepare(&batch, 700, UNLIMITED, STAMP));
    let err = result.unwrap_err();
    let BatchError::BlockTooLarge {
        offset,
        last_offset,
        size,
        limit,
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (offset, last_offset, size, limit),
        (700, 702, bound + 1, bound)
    );
    assert!(peak < MIB, "{peak} bytes allocated");
    let message = err.to_string();
    for needle in [
        "offset 700",
        &(bound + 1).to_string(),
        "--abort.on.send.failure",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
}
