//! A blocking connection to one broker: size-prefixed frames, requests and responses encoded
//! and decoded only by the `kafka-protocol` crate, correlation ids checked, and each API
//! spoken at the highest version both sides support within the range this engine handles
//! (ApiVersions asked once at connect). Over TCP or TLS ([`super::tls`]), authenticated with
//! SASL after ApiVersions where the config asks for it ([`super::sasl`]).
//!
//! Requests can be pipelined: [`Connection::send`] writes one and returns its ticket,
//! [`Connection::receive`] reads the answers in the order they were sent (Kafka answers in
//! order on one connection).
//!
//! Waits are bounded by deadlines, not per call: [`Connection::receive_by`] waits for an
//! answer until a deadline its caller shares among several brokers (requests sent together
//! wait together), and [`Connection::connect`] ends its handshake by one, so that a round over
//! brokers that do not answer costs one timeout, not one per broker.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiVersionsRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use zeroize::Zeroize;

use super::sasl::Sasl;
use super::tls::{Stream, Tls};

/// The versions of each API this engine speaks. Fetch stays at or below 12 and Produce at or
/// below 12: later versions name topics by id only.
fn supported(api_key: i16) -> Option<(i16, i16)> {
    use kafka_protocol::messages::*;
    Some(match api_key {
        ProduceRequest::KEY => (3, 12),
        FetchRequest::KEY => (4, 12),
        ListOffsetsRequest::KEY => (2, 7),
        MetadataRequest::KEY => (4, 12),
        InitProducerIdRequest::KEY => (0, 4),
        ApiVersionsRequest::KEY => (3, 3),
        SaslHandshakeRequest::KEY => (1, 1),
        SaslAuthenticateRequest::KEY => (0, 2),
        _ => return None,
    })
}

/// The largest answer accepted to a Fetch: `fetch.max.bytes` (50 MiB by default) and one
/// batch larger than that returned whole (KIP-74), with their framing.
const MAX_FETCH_FRAME: usize = 256 * 1024 * 1024;

/// The largest answer accepted to a request of `api_key`: what such a request can bring back,
/// with room. A size prefix past it is not believed (a broker that is not Kafka, or a broken
/// one), so that four bytes never make the engine take memory that no answer needs.
fn answer_bound(api_key: i16) -> usize {
    use kafka_protocol::messages::*;
    match api_key {
        FetchRequest::KEY => MAX_FETCH_FRAME,
        // A Produce answer can name every record of its request (KIP-467's record errors).
        ProduceRequest::KEY => MAX_FETCH_FRAME,
        // Metadata of tens of thousands of partitions is a few MB; a ListOffsets answer names
        // each partition of its request once.
        MetadataRequest::KEY | ListOffsetsRequest::KEY => 64 << 20,
        // ApiVersions, SASL, InitProducerId: a few hundred bytes.
        _ => 1 << 20,
    }
}

/// An answer's buffer is made ready for twice this before its bytes arrive, then doubles
/// with what has come, so that a size prefix alone commits no memory.
const FIRST_READ: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("broker {broker}: {what}: {source}")]
    Io {
        broker: String,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("broker {broker}: cannot encode or decode {api}: {reason}")]
    Codec {
        broker: String,
        api: &'static str,
        reason: String,
    },
    #[error("broker {broker}: answered correlation id {got}, expected {expected}; the connection is dropped")]
    Correlation {
        broker: String,
        expected: i32,
        got: i32,
    },
    #[error("broker {broker}: speaks {api} versions {theirs}, this engine {ours}; use --copy.mode records with this broker")]
    Version {
        broker: String,
        api: &'static str,
        ours: String,
        theirs: String,
    },
    #[error("broker {broker}: an answer to {api} says it is {size} bytes, more than such an answer can be ({bound}): a broken broker, or not Kafka; the connection is dropped")]
    Frame {
        broker: String,
        api: &'static str,
        size: i64,
        bound: usize,
    },
    #[error("broker {broker}: ApiVersions v3 failed with {} (a broker older than Kafka 2.4, or not Kafka)", error_name(*.code))]
    ApiVersions { broker: String, code: i16 },
    #[error("the {role} cluster's broker {broker}: the TLS handshake failed: {reason}; check the ssl.* keys of the {config}")]
    Tls {
        role: &'static str,
        config: &'static str,
        broker: String,
        reason: String,
    },
    #[error(
        "the {role} cluster's broker {broker} refused SASL {mechanism} authentication: {message}"
    )]
    Auth {
        role: &'static str,
        broker: String,
        mechanism: &'static str,
        message: String,
    },
}

impl WireError {
    /// Whether the broker did not answer in time (rather than failing the connection).
    pub(crate) fn timed_out(&self) -> bool {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        matches!(self, WireError::Io { source, .. } if matches!(source.kind(), TimedOut | WouldBlock))
    }

    /// Whether the broker closed (or reset) the connection: a request it would not read
    /// (one over its `socket.request.max.bytes`, say), or the broker going away.
    pub(crate) fn closed_by_broker(&self) -> bool {
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
        matches!(self, WireError::Io { source, .. }
            if matches!(source.kind(), BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof))
    }
}

/// How one cluster's connections are made: what every [`Connection::connect`] needs.
pub(crate) struct Dial {
    /// `source` or `target`, for messages.
    pub(crate) role: &'static str,
    /// `consumer config` or `producer config`, for messages.
    pub(crate) config: &'static str,
    pub(crate) client_id: String,
    pub(crate) timeout: Duration,
    /// With SSL and SASL_SSL.
    pub(crate) tls: Option<Tls>,
    /// With SASL_PLAINTEXT and SASL_SSL.
    pub(crate) sasl: Option<Sasl>,
}

/// A request sent and not yet answered.
struct Sent {
    correlation: i32,
    api_key: i16,
    version: i16,
}

/// One TCP (or TLS) connection to one broker.
pub(crate) struct Connection {
    stream: Stream,
    role: &'static str,
    broker: String,
    client_id: StrBytes,
    next_correlation: i32,
    versions: HashMap<i16, (i16, i16)>,
    sent: VecDeque<Sent>,
    /// When the broker's SASL session (KIP-368 `connections.max.reauth.ms`) is near its end:
    /// the connection is then made again rather than authenticated again.
    renew_at: Option<Instant>,
    /// How long an answer may take (`request.timeout.ms`).
    timeout: Duration,
}

/// Writes `frame` to `out`; a `secret` frame (a SASL message: PLAIN's password, SCRAM's
/// proof) is cleared after, so that it is not left in the thread's buffer for the next
/// request to write over only in part.
fn write_frame(out: &mut impl Write, frame: &mut BytesMut, secret: bool) -> std::io::Result<()> {
    let written = out.write_all(frame);
    if secret {
        frame.as_mut().zeroize();
    }
    written
}

thread_local! {
    /// The buffer every connection of this thread encodes its requests into and reads its
    /// answers into, kept between them:
    /// - a Produce request or a Fetch answer is megabytes, and a fresh allocation of that size
    ///   each time is fresh pages, which the kernel faults in and zeroes one by one (a third
    ///   of the stream thread in a profile);
    /// - one buffer for all of them, not one per connection, because a stream uses its
    ///   connections one after the other: a request is in the kernel once it is written, and
    ///   the round's large Produce request (to the target) and large Fetch answer (from the
    ///   source) then take turns in one allocation instead of holding two (4 MiB a stream
    ///   with 4 partitions of 1 MB batches).
    ///
    /// Each answer is split off as `Bytes` (the batches of a Fetch answer are slices of it);
    /// the next request or answer reuses the allocation once nothing refers to the last answer
    /// any more, and takes a new one otherwise, as without it.
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

impl Connection {
    /// Connects to `address` (host:port), with TLS if `dial` has it, asks which API versions
    /// it speaks, and authenticates if `dial` has SASL credentials, giving up at `deadline`;
    /// later answers may take `dial.timeout` each.
    pub(crate) fn connect(
        address: &str,
        dial: &Dial,
        deadline: Instant,
    ) -> Result<Connection, WireError> {
        let timeout = dial.timeout;
        let io = |what, source| WireError::Io {
            broker: address.to_owned(),
            what,
            source,
        };
        let addr = address
            .to_socket_addrs()
            .map_err(|e| io("cannot resolve the address", e))?
            .next()
            .ok_or_else(|| {
                io(
                    "the address resolves to nothing",
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                )
            })?;
        let left = remaining(deadline).ok_or_else(|| {
            io(
                "cannot connect",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        })?;
        let stream =
            TcpStream::connect_timeout(&addr, left).map_err(|e| io("cannot connect", e))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| io("cannot set up the socket", e))?;
        let stream = match &dial.tls {
            None => Stream::Plain(stream),
            Some(tls) => {
                let host = host_of(address);
                Stream::Tls(Box::new(tls.handshake(host, stream).map_err(|reason| {
                    WireError::Tls {
                        role: dial.role,
                        config: dial.config,
                        broker: address.to_owned(),
                        reason,
                    }
                })?))
            }
        };
        let mut conn = Connection {
            stream,
            role: dial.role,
            broker: address.to_owned(),
            client_id: StrBytes::from_string(dial.client_id.clone()),
            next_correlation: 0,
            versions: HashMap::new(),
            sent: VecDeque::new(),
            renew_at: None,
            timeout,
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("mirror-maker"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        conn.versions.insert(ApiVersionsRequest::KEY, (3, 3));
        conn.send(&request)?;
        let response = conn.receive_by::<ApiVersionsRequest>(deadline)?;
        if response.error_code != 0 {
            return Err(WireError::ApiVersions {
                broker: conn.broker.clone(),
                code: response.error_code,
            });
        }
        conn.versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        if let Some(sasl) = &dial.sasl {
            conn.authenticate(sasl)?;
        }
        Ok(conn)
    }

    /// SaslHandshake v1, then SaslAuthenticate until the mechanism's exchange is complete.
    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), WireError> {
        let started = Instant::now();
        let mechanism = sasl.mechanism.name();
        let refused = |conn: &Connection, message: String| WireError::Auth {
            role: conn.role,
            broker: conn.broker.clone(),
            mechanism,
            message,
        };
        let handshake = self.call(
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        )?;
        if handshake.error_code != 0 {
            let enabled: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(
                self,
                format!(
                    "{} (the broker enables {}); set sasl.mechanism to one of them",
                    error_name(handshake.error_code),
                    enabled.join(", ")
                ),
            ));
        }
        let (mut message, mut exchange) = sasl.start();
        loop {
            let response =
                self.call(&SaslAuthenticateRequest::default().with_auth_bytes(message.clone()))?;
            if response.error_code != 0 {
                let said = response
                    .error_message
                    .as_ref()
                    .map(|m| m.as_str().to_owned())
                    .unwrap_or_default();
                return Err(refused(
                    self,
                    format!(
                        "authentication failed: {} {said}; check sasl.username and \
                         sasl.password",
                        error_name(response.error_code)
                    ),
                ));
            }
            match exchange
                .answer(sasl, &response.auth_bytes)
                .map_err(|e| refused(self, e))?
            {
                Some(next) => message = next,
                None => {
                    if response.session_lifetime_ms > 0 {
                        // Made again at 85 % of the session (KIP-368); librdkafka
                        // reauthenticates at 90 %, this a little earlier as a connection is
                        // only made again between requests.
                        let lifetime = Duration::from_millis(response.session_lifetime_ms as u64);
                        self.renew_at = Some(started + lifetime.mul_f64(0.85));
                    }
                    return Ok(());
                }
            }
        }
    }

    /// The broker's address, as connected to.
    pub(crate) fn broker(&self) -> &str {
        &self.broker
    }

    /// Whether the connection should be made again before the next request: its SASL
    /// session is near its end and no answer is owed on it.
    pub(crate) fn due_for_renewal(&self) -> bool {
        self.sent.is_empty() && self.renew_at.is_some_and(|at| Instant::now() >= at)
    }

    /// The version `R` is sent at: the highest both sides speak.
    pub(crate) fn version<R: Request>(&self) -> Result<i16, WireError> {
        let (our_min, our_max) = supported(R::KEY).unwrap_or((R::VERSIONS.min, R::VERSIONS.max));
        let version_error = |theirs: String| WireError::Version {
            broker: self.broker.clone(),
            api: api_name(R::KEY),
            ours: format!("{our_min}..={our_max}"),
            theirs,
        };
        let (min, max) = *self
            .versions
            .get(&R::KEY)
            .ok_or_else(|| version_error("none".to_owned()))?;
        let version = max.min(our_max);
        if version < our_min || version < min {
            return Err(version_error(format!("{min}..={max}")));
        }
        Ok(version)
    }

    /// Writes one request; its answer is read by [`receive`](Self::receive), in order.
    pub(crate) fn send<R: Request>(&mut self, request: &R) -> Result<(), WireError> {
        let version = self.version::<R>()?;
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(self.client_id.clone()));
        let codec = |e: anyhow::Error| WireError::Codec {
            broker: self.broker.clone(),
            api: api_name(R::KEY),
            reason: format!("{e:#}"),
        };
        let header_version = R::header_version(version);
        let size = header
            .compute_size(header_version)
            .and_then(|h| request.compute_size(version).map(|b| h + b))
            .map_err(codec)?;
        SCRATCH.with_borrow_mut(|frame| {
            frame.clear();
            frame.reserve(4 + size);
            frame.put_i32(i32::try_from(size).unwrap_or(i32::MAX));
            header.encode(frame, header_version).map_err(codec)?;
            request.encode(frame, version).map_err(codec)?;
            write_frame(
                &mut self.stream,
                frame,
                R::KEY == SaslAuthenticateRequest::KEY,
            )
            .map_err(|source| WireError::Io {
                broker: self.broker.clone(),
                what: "cannot send a request",
                source,
            })
        })?;
        self.sent.push_back(Sent {
            correlation,
            api_key: R::KEY,
            version,
        });
        Ok(())
    }

    /// Reads the answer to the oldest request sent and not yet answered, which must be an `R`,
    /// waiting at most the request timeout.
    pub(crate) fn receive<R: Request>(&mut self) -> Result<R::Response, WireError> {
        self.receive_by::<R>(Instant::now() + self.timeout)
    }

    /// As [`receive`](Self::receive), waiting until `deadline` at most (for the whole
    /// answer, not for each read).
    pub(crate) fn receive_by<R: Request>(
        &mut self,
        deadline: Instant,
    ) -> Result<R::Response, WireError> {
        let sent = self.sent.pop_front().ok_or_else(|| WireError::Codec {
            broker: self.broker.clone(),
            api: api_name(R::KEY),
            reason: "no request is waiting for an answer".to_owned(),
        })?;
        if sent.api_key != R::KEY {
            return Err(WireError::Codec {
                broker: self.broker.clone(),
                api: api_name(R::KEY),
                reason: format!("the next answer is to {}", api_name(sent.api_key)),
            });
        }
        let io = |what, source| WireError::Io {
            broker: self.broker.clone(),
            what,
            source,
        };
        let mut size = [0u8; 4];
        read_by(&mut self.stream, &mut size, deadline).map_err(|e| io("no answer", e))?;
        let size = i32::from_be_bytes(size);
        let bound = answer_bound(sent.api_key);
        let Some(size) = usize::try_from(size).ok().filter(|&s| s <= bound) else {
            return Err(WireError::Frame {
                broker: self.broker.clone(),
                api: api_name(sent.api_key),
                size: i64::from(size),
                bound,
            });
        };
        // Growing the cleared buffer reclaims the allocation of the last answer split off
        // when nothing refers to it any more. It grows as the answer's bytes arrive.
        let mut body: Bytes = SCRATCH.with_borrow_mut(|buf| {
            buf.clear();
            while buf.len() < size {
                let filled = buf.len();
                buf.resize(size.min(filled.max(FIRST_READ) * 2), 0);
                read_by(&mut self.stream, &mut buf[filled..], deadline)
                    .map_err(|e| io("the answer broke off", e))?;
            }
            Ok(buf.split().freeze())
        })?;
        let codec = |e: anyhow::Error| WireError::Codec {
            broker: self.broker.clone(),
            api: api_name(R::KEY),
            reason: format!("{e:#}"),
        };
        let header_version = <R::Response as HeaderVersion>::header_version(sent.version);
        let header = ResponseHeader::decode(&mut body, header_version).map_err(codec)?;
        if header.correlation_id != sent.correlation {
            return Err(WireError::Correlation {
                broker: self.broker.clone(),
                expected: sent.correlation,
                got: header.correlation_id,
            });
        }
        R::Response::decode(&mut body, sent.version).map_err(codec)
    }

    /// Sends one request and reads its answer.
    pub(crate) fn call<R: Request>(&mut self, request: &R) -> Result<R::Response, WireError> {
        self.send(request)?;
        self.receive::<R>()
    }
}

/// The time left until `deadline`, `None` once it has passed.
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Fills `buf` from `stream`, each read waiting only until `deadline` (TimedOut after it).
fn read_by(stream: &mut Stream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = remaining(deadline).ok_or(std::io::ErrorKind::TimedOut)?;
        stream.tcp().set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The name of an API, for messages.
pub(crate) fn api_name(key: i16) -> &'static str {
    use kafka_protocol::messages::*;
    match key {
        ProduceRequest::KEY => "Produce",
        FetchRequest::KEY => "Fetch",
        ListOffsetsRequest::KEY => "ListOffsets",
        MetadataRequest::KEY => "Metadata",
        InitProducerIdRequest::KEY => "InitProducerId",
        ApiVersionsRequest::KEY => "ApiVersions",
        SaslHandshakeRequest::KEY => "SaslHandshake",
        SaslAuthenticateRequest::KEY => "SaslAuthenticate",
        _ => "a request",
    }
}

/// The host of a `host:port` address (an IPv6 address without its brackets): the name the
/// broker's certificate must hold.
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The name of a Kafka error code, for messages and metrics.
pub(crate) fn error_name(code: i16) -> String {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        None => "NONE".to_owned(),
        Some(e) => format!("{e:?}"),
    }
}

/// A fake broker for the engine's unit tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    /// A broker on a loopback port that accepts one connection, reads one request frame,
    /// writes back the bytes `answer` makes of the request (framing included), then keeps the
    /// connection open for `hold` before it hangs up. Its address.
    pub(crate) fn one_answer(
        answer: impl FnOnce(&[u8]) -> Vec<u8> + Send + 'static,
        hold: Duration,
    ) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let address = listener.local_addr().expect("its address").to_string();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("the engine connects");
            let mut size = [0u8; 4];
            conn.read_exact(&mut size).expect("a request size");
            let mut request = vec![0u8; i32::from_be_bytes(size) as usize];
            conn.read_exact(&mut request).expect("the request");
            conn.write_all(&answer(&request)).expect("the answer");
            std::thread::sleep(hold);
        });
        address
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{fake, Connection, Dial, WireError};

    /// A broker that answers the first request with a size prefix of `claimed` bytes and
    /// `sent` bytes of it, then keeps the connection open without a word more.
    fn broker_claiming(claimed: i32, sent: usize) -> String {
        let answer = move |_: &[u8]| {
            let mut bytes = claimed.to_be_bytes().to_vec();
            bytes.resize(4 + sent, 0);
            bytes
        };
        fake::one_answer(answer, Duration::from_secs(10))
    }

    fn dial() -> Dial {
        Dial {
            role: "target",
            config: "producer config",
            client_id: "test".to_owned(),
            timeout: Duration::from_secs(5),
            tls: None,
            sasl: None,
        }
    }

    #[test]
    fn an_answer_larger_than_its_request_can_bring_back_is_refused_at_once() {
        // ApiVersions answers in a few hundred bytes; 200 MiB is no ApiVersions answer.
        let address = broker_claiming(200 << 20, 10);
        let started = Instant::now();
        let refused =
            Connection::connect(&address, &dial(), Instant::now() + Duration::from_secs(5));
        let Err(e @ WireError::Frame { .. }) = refused else {
            panic!("not refused by its size: {:?}", refused.err());
        };
        let said = e.to_string();
        assert!(
            said.contains("an answer to ApiVersions says it is 209715200 bytes"),
            "{said}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "waited for the bytes"
        );
    }

    #[test]
    fn an_answers_buffer_grows_with_the_bytes_that_came_not_with_its_size_prefix() {
        // Within ApiVersions' bound, but only 10 bytes of it ever come.
        let address = broker_claiming(1_000_000, 10);
        let broke_off = Connection::connect(
            &address,
            &dial(),
            Instant::now() + Duration::from_millis(500),
        );
        assert!(
            matches!(broke_off, Err(WireError::Io { .. })),
            "{:?}",
            broke_off.err()
        );
        let made_ready = super::SCRATCH.with_borrow(|buf| buf.capacity());
        assert!(
            made_ready <= 2 * super::FIRST_READ,
            "{made_ready} bytes made ready for 10 that came"
        );
    }

    #[test]
    fn a_sasl_message_is_not_left_in_the_request_buffer() {
        let mut frame = bytes::BytesMut::from(&b"\0\0\0\x0e\0alice\0hunter2"[..]);
        let mut wire = Vec::new();
        super::write_frame(&mut wire, &mut frame, true).unwrap();
        assert_eq!(wire, b"\0\0\0\x0e\0alice\0hunter2");
        assert!(frame.iter().all(|b| *b == 0), "{frame:?}");
        let mut other = bytes::BytesMut::from(&b"metadata"[..]);
        super::write_frame(&mut Vec::new(), &mut other, false).unwrap();
        assert_eq!(&other[..], b"metadata");
    }

    #[test]
    fn a_negative_answer_size_is_refused() {
        let address = broker_claiming(-5, 0);
        let refused =
            Connection::connect(&address, &dial(), Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(refused, Err(WireError::Frame { size: -5, .. })),
            "{:?}",
            refused.err()
        );
    }
}
