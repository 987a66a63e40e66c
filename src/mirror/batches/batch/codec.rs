//! The records section's compression as streams: a compressed section read as its plain bytes
//! ([`reader`]) and plain bytes written compressed ([`Encoder`]), so that a batch encoded again
//! never holds its records decompressed (issue 42: one zstd batch of a few hundred KB on the
//! wire held 30 records of 32 MiB of zeros, and decompressing it whole took the mirror to
//! 1,891 MiB).
//!
//! Each codec as Kafka's Java client reads and writes it:
//! - gzip: members read one after another (`MultiGzDecoder`: Java's `GZIPInputStream` reads
//!   concatenated members), written as one member at the default level;
//! - snappy: the xerial framing Kafka's `SnappyOutputStream` writes (a 16-byte header,
//!   `\x82SNAPPY\0` and two version ints, then blocks of a big-endian u32 length and a raw
//!   snappy block), read one block at a time and written in blocks of 32 KiB as Java writes
//!   them; a section without that header is raw snappy (librdkafka writes it; Java's
//!   `SnappyInputStream` falls back to it), one block that states its plain length first;
//! - lz4: one frame (the `lz4` crate's, level 4, independent blocks, as the `kafka-protocol`
//!   crate wrote it);
//! - zstd: frames read one after another, written as one frame at level 3 (the
//!   `kafka-protocol` crate's level; zstd-jni's default too).
//!
//! A raw snappy block is decompressed whole (the format cannot be read as a stream): the
//! length it states is checked against [`SNAPPY_BLOCK_BOUND`] before anything is allocated,
//! and a larger one is the error [`BlockTooLarge`] in the reader's `io::Error`.

use std::io::{self, BufRead, Read, Write};

use kafka_protocol::records::Compression;

/// The xerial framing's header: magic, version 1, compatible version 1.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
/// The magic that tells xerial framing from raw snappy (Java's `SnappyCodec.MAGIC_HEADER`).
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
/// The plain bytes of a block Kafka's `SnappyOutputStream` writes (its default).
const XERIAL_BLOCK: usize = 32 * 1024;

/// The most plain bytes one raw snappy block may state (a block of xerial framing, or a whole
/// section of raw snappy as librdkafka writes it): such a block is decompressed whole, so this
/// bounds what one block holds in memory. 128 MiB lets through a section of librdkafka's
/// holding a record of tens of MiB; Java's producer writes blocks of 32 KiB.
pub(crate) const SNAPPY_BLOCK_BOUND: usize = 128 << 20;

/// A raw snappy block that states more plain bytes than [`SNAPPY_BLOCK_BOUND`]: carried in the
/// reader's `io::Error` (kind `Other`), found again by [`BlockTooLarge::of`].
#[derive(Debug, thiserror::Error)]
#[error(
    "a snappy block of its records section states {size} bytes uncompressed, more than the \
     {limit} the batch engine decompresses at once"
)]
pub(crate) struct BlockTooLarge {
    pub(crate) size: usize,
    pub(crate) limit: usize,
}

impl BlockTooLarge {
    /// The bound's refusal carried by `error`, if it is one.
    pub(crate) fn of(error: &io::Error) -> Option<&BlockTooLarge> {
        error.get_ref()?.downcast_ref::<BlockTooLarge>()
    }
}

/// The plain bytes of a compressed records section, as a stream over `body`.
pub(crate) fn reader<'a>(
    body: &'a [u8],
    compression: Compression,
) -> io::Result<Box<dyn BufRead + 'a>> {
    const BUFFER: usize = 64 * 1024;
    Ok(match compression {
        Compression::None => Box::new(body),
        Compression::Gzip => Box::new(io::BufReader::with_capacity(
            BUFFER,
            flate2::bufread::MultiGzDecoder::new(body),
        )),
        Compression::Snappy => Box::new(io::BufReader::with_capacity(
            BUFFER,
            SnappyReader::new(body)?,
        )),
        Compression::Lz4 => Box::new(io::BufReader::with_capacity(
            BUFFER,
            lz4::Decoder::new(body)?,
        )),
        Compression::Zstd => Box::new(io::BufReader::with_capacity(
            BUFFER,
            zstd::stream::read::Decoder::with_buffer(body)?,
        )),
    })
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Snappy, xerial-framed or raw: the current block's plain bytes, and the blocks left.
struct SnappyReader<'a> {
    /// The blocks not yet decompressed (after the header; empty for raw snappy once read).
    rest: &'a [u8],
    framed: bool,
    block: Vec<u8>,
    at: usize,
}

impl<'a> SnappyReader<'a> {
    fn new(body: &'a [u8]) -> io::Result<Self> {
        let framed = body.starts_with(XERIAL_MAGIC);
        let rest = if framed {
            body.get(XERIAL_HEADER.len()..)
                .ok_or_else(|| invalid("the xerial snappy header is cut short".into()))?
        } else {
            body
        };
        Ok(Self {
            rest,
            framed,
            block: Vec::new(),
            at: 0,
        })
    }

    /// Decompresses the next block into `self.block`; false when none is left.
    fn next_block(&mut self) -> io::Result<bool> {
        if self.rest.is_empty() {
            return Ok(false);
        }
        let compressed = if self.framed {
            let (len, rest) = self
                .rest
                .split_first_chunk::<4>()
                .ok_or_else(|| invalid("a xerial snappy block length is cut short".into()))?;
            let len = u32::from_be_bytes(*len) as usize;
            let block = rest.get(..len).ok_or_else(|| {
                invalid(format!(
                    "a xerial snappy block says {len} bytes and {} are left",
                    rest.len()
                ))
            })?;
            self.rest = &rest[len..];
            block
        } else {
            std::mem::take(&mut self.rest)
        };
        let size = snap::raw::decompress_len(compressed)
            .map_err(|e| invalid(format!("a snappy block's length: {e}")))?;
        if size > SNAPPY_BLOCK_BOUND {
            return Err(io::Error::other(BlockTooLarge {
                size,
                limit: SNAPPY_BLOCK_BOUND,
            }));
        }
        self.block.clear();
        self.block.resize(size, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut self.block)
            .map_err(|e| invalid(format!("a snappy block: {e}")))?;
        self.at = 0;
        Ok(true)
    }
}

impl Read for SnappyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Where an [`Encoder`] writes: the compressed bytes up to `cap`, past it only their count (a
/// batch that grew past what the target takes is refused by its size: its bytes are not
/// needed, and a record of hundreds of MiB that hardly compresses is never held).
#[derive(Debug, Default)]
pub(crate) struct Sink {
    bytes: Vec<u8>,
    len: usize,
    cap: usize,
}

impl Sink {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            bytes: Vec::new(),
            len: 0,
            cap,
        }
    }

    /// The bytes written, when they are all here (not past the cap).
    pub(crate) fn into_bytes(self) -> Option<Vec<u8>> {
        (self.len <= self.cap).then_some(self.bytes)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.len = self.len.saturating_add(buf.len());
        if self.len <= self.cap {
            self.bytes.extend_from_slice(buf);
        } else if !self.bytes.is_empty() {
            self.bytes = Vec::new();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Xerial-framed snappy written as Kafka's `SnappyOutputStream` writes it: the header, then
/// a block for every 32 KiB of plain bytes (and for what is left at a flush).
pub(crate) struct SnappyWriter<W: Write> {
    out: W,
    plain: Vec<u8>,
    block: Vec<u8>,
}

impl<W: Write> SnappyWriter<W> {
    fn new(mut out: W) -> io::Result<Self> {
        out.write_all(XERIAL_HEADER)?;
        Ok(Self {
            out,
            plain: Vec::with_capacity(XERIAL_BLOCK),
            block: vec![0; snap::raw::max_compress_len(XERIAL_BLOCK)],
        })
    }

    fn put_block(&mut self) -> io::Result<()> {
        if self.plain.is_empty() {
            return Ok(());
        }
        let n = snap::raw::Encoder::new()
            .compress(&self.plain, &mut self.block)
            .map_err(io::Error::other)?;
        self.out.write_all(&(n as u32).to_be_bytes())?;
        self.out.write_all(&self.block[..n])?;
        self.plain.clear();
        Ok(())
    }

    fn finish(mut self) -> io::Result<W> {
        self.put_block()?;
        Ok(self.out)
    }
}

impl<W: Write> Write for SnappyWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(XERIAL_BLOCK - self.plain.len());
        self.plain.extend_from_slice(&buf[..n]);
        if self.plain.len() == XERIAL_BLOCK {
            self.put_block()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.put_block()?;
        self.out.flush()
    }
}

/// A records section written compressed as a stream into a [`Sink`].
pub(crate) enum Encoder {
    None(Sink),
    Gzip(flate2::write::GzEncoder<Sink>),
    Snappy(SnappyWriter<Sink>),
    Lz4(lz4::Encoder<Sink>),
    Zstd(zstd::stream::write::Encoder<'static, Sink>),
}

impl Encoder {
    pub(crate) fn new(compression: Compression, sink: Sink) -> io::Result<Self> {
        Ok(match compression {
            Compression::None => Self::None(sink),
            Compression::Gzip => Self::Gzip(flate2::write::GzEncoder::new(
                sink,
                flate2::Compression::default(),
            )),
            Compression::Snappy => Self::Snappy(SnappyWriter::new(sink)?),
            Compression::Lz4 => Self::Lz4(
                lz4::EncoderBuilder::new()
                    .level(4)
                    .block_mode(lz4::BlockMode::Independent)
                    .build(sink)?,
            ),
            Compression::Zstd => Self::Zstd(zstd::stream::write::Encoder::new(sink, 3)?),
        })
    }

    /// The compressed bytes written so far (what the codec still holds not counted: after a
    /// [`Write::flush`], all of it).
    pub(crate) fn written(&self) -> usize {
        match self {
            Self::None(s) => s.len(),
            Self::Gzip(e) => e.get_ref().len(),
            Self::Snappy(e) => e.out.len(),
            Self::Lz4(e) => e.writer().len(),
            Self::Zstd(e) => e.get_ref().len(),
        }
    }

    /// Ends the stream (a codec's trailer written): the sink.
    pub(crate) fn finish(self) -> io::Result<Sink> {
        match self {
            Self::None(s) => Ok(s),
            Self::Gzip(e) => e.finish(),
            Self::Snappy(e) => e.finish(),
            Self::Lz4(e) => {
                let (sink, result) = e.finish();
                result.map(|()| sink)
            }
            Self::Zstd(e) => e.finish(),
        }
    }
}

impl Write for Encoder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::None(s) => s.write(buf),
            Self::Gzip(e) => e.write(buf),
            Self::Snappy(e) => e.write(buf),
            Self::Lz4(e) => e.write(buf),
            Self::Zstd(e) => e.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::None(s) => s.flush(),
            Self::Gzip(e) => e.flush(),
            Self::Snappy(e) => e.flush(),
            Self::Lz4(e) => e.flush(),
            Self::Zstd(e) => e.flush(),
        }
    }
}

/// `plain` compressed whole (for what is small and in memory already: a legacy run's batch, the
/// tests' batches).
pub(crate) fn compress(compression: Compression, plain: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = Encoder::new(compression, Sink::new(usize::MAX))?;
    encoder.write_all(plain)?;
    Ok(encoder
        .finish()?
        .into_bytes()
        .expect("an uncapped sink keeps its bytes"))
}

/// The header of a raw snappy block that states `len` bytes uncompressed (an unsigned
/// varint), for the tests of the bound on it.
#[cfg(test)]
pub(super) fn snappy_length_header(len: u64) -> Vec<u8> {
    let mut header = Vec::new();
    let mut n = len;
    while n >= 0x80 {
        header.push((n as u8) | 0x80);
        n >>= 7;
    }
    header.push(n as u8);
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// Bytes that compress some: a cycle of 251 with every 7th byte a counter.
    fn plain(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                if i % 7 == 0 {
                    (i / 7) as u8
                } else {
                    (i % 251) as u8
                }
            })
            .collect()
    }

    fn read_all(body: &[u8], compression: Compression) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        reader(body, compression)?.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Written in pieces of odd sizes with flushes between (as the re-encode path flushes near
    /// a batch's limit), read back as a stream: the same bytes, in every codec.
    #[test]
    fn every_codec_reads_back_what_it_wrote_as_a_stream() {
        for compression in CODECS {
            for len in [0, 1, 100, XERIAL_BLOCK - 1, XERIAL_BLOCK + 1, 300_000] {
                let want = plain(len);
                let mut encoder = Encoder::new(compression, Sink::new(usize::MAX)).unwrap();
                for (i, piece) in want.chunks(7_777).enumerate() {
                    encoder.write_all(piece).unwrap();
                    if i % 3 == 1 {
                        encoder.flush().unwrap();
                    }
                }
                let body = encoder.finish().unwrap().into_bytes().unwrap();
                assert_eq!(
                    read_all(&body, compression).unwrap(),
                    want,
                    "{compression:?}, {len} bytes"
                );
            }
        }
    }

    /// What the streaming encoders write, the `kafka-protocol` crate's decoders read, and
    /// what its encoders write, the streaming readers read: byte for byte.
    #[test]
    fn the_streams_and_the_crates_codecs_read_each_other() {
        use bytes::{BufMut as _, Bytes, BytesMut};
        use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};
        let want = plain(200_000);
        for compression in &CODECS[1..] {
            let ours = Bytes::from(compress(*compression, &want).unwrap());
            let keep = |plain: &mut Bytes| Ok(plain.clone());
            let theirs_read = match compression {
                Compression::Gzip => {
                    <Gzip as Decompressor<Bytes>>::decompress(&mut ours.clone(), keep)
                }
                Compression::Snappy => {
                    <Snappy as Decompressor<Bytes>>::decompress(&mut ours.clone(), keep)
                }
                Compression::Lz4 => {
                    <Lz4 as Decompressor<Bytes>>::decompress(&mut ours.clone(), keep)
                }
                _ => <Zstd as Decompressor<Bytes>>::decompress(&mut ours.clone(), keep),
            }
            .unwrap();
            assert_eq!(&theirs_read[..], &want[..], "{compression:?}");
            let mut theirs = BytesMut::new();
            let put = |buf: &mut BytesMut| {
                buf.put_slice(&want);
                Ok(())
            };
            match compression {
                Compression::Gzip => <Gzip as Compressor<BytesMut>>::compress(&mut theirs, put),
                Compression::Snappy => <Snappy as Compressor<BytesMut>>::compress(&mut theirs, put),
                Compression::Lz4 => <Lz4 as Compressor<BytesMut>>::compress(&mut theirs, put),
                _ => <Zstd as Compressor<BytesMut>>::compress(&mut theirs, put),
            }
            .unwrap();
            assert_eq!(
                read_all(&theirs, *compression).unwrap(),
                want,
                "{compression:?}"
            );
        }
    }

    /// Java's `GZIPInputStream` reads concatenated members as one stream, and so do we.
    #[test]
    fn concatenated_gzip_members_read_as_one_stream() {
        let (a, b) = (plain(50_000), plain(70_001));
        let mut body = compress(Compression::Gzip, &a).unwrap();
        body.extend(compress(Compression::Gzip, &b).unwrap());
        assert_eq!(read_all(&body, Compression::Gzip).unwrap(), [a, b].concat());
    }

    /// Xerial framing with several blocks is read block by block; raw snappy (librdkafka's)
    /// as one block; a block that states more than the bound is refused before anything is
    /// allocated for it.
    #[test]
    fn snappy_reads_xerial_blocks_and_raw_snappy_and_refuses_a_block_past_the_bound() {
        let want = plain(5 * XERIAL_BLOCK + 123);
        let framed = compress(Compression::Snappy, &want).unwrap();
        assert!(framed.starts_with(XERIAL_HEADER));
        let mut blocks = 0;
        let mut rest = &framed[XERIAL_HEADER.len()..];
        while let Some((len, after)) = rest.split_first_chunk::<4>() {
            rest = &after[u32::from_be_bytes(*len) as usize..];
            blocks += 1;
        }
        assert_eq!(blocks, 6);
        assert_eq!(read_all(&framed, Compression::Snappy).unwrap(), want);

        let raw = snap::raw::Encoder::new().compress_vec(&want).unwrap();
        assert_eq!(read_all(&raw, Compression::Snappy).unwrap(), want);

        // A raw block that states SNAPPY_BLOCK_BOUND + 1 bytes (its varint header alone).
        let mut claim = snappy_length_header(SNAPPY_BLOCK_BOUND as u64 + 1);
        claim.extend([0u8; 16]);
        for body in [claim.clone(), {
            let mut framed = XERIAL_HEADER.to_vec();
            framed.extend((claim.len() as u32).to_be_bytes());
            framed.extend(&claim);
            framed
        }] {
            let err = read_all(&body, Compression::Snappy).unwrap_err();
            let refused = BlockTooLarge::of(&err).expect("the bound's refusal");
            assert_eq!(refused.size, SNAPPY_BLOCK_BOUND + 1);
        }
    }

    /// A sink past its cap keeps counting and lets go of its bytes.
    #[test]
    fn a_sink_past_its_cap_counts_without_holding() {
        let mut sink = Sink::new(10);
        sink.write_all(&[1; 8]).unwrap();
        sink.write_all(&[2; 8]).unwrap();
        assert_eq!(sink.len(), 16);
        assert!(sink.bytes.capacity() == 0);
        assert!(sink.into_bytes().is_none());
    }
}
