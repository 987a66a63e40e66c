//! Network faults between the mirror and a cluster: a TCP proxy per broker that the test
//! switches while it runs ([`FaultProxy`]), and a source and a target Kafka cluster whose
//! brokers advertise their proxies ([`FaultyPair`]), so that every connection the mirror makes,
//! after bootstrap too, goes through them, while the harness's own clients (records, offsets,
//! `compare`, `verify`) reach the brokers directly.
//!
//! What the proxy emulates, and how, for a TCP stream (it sees bytes, not packets):
//! - a blackhole ([`FaultProxy::blackhole`]): nothing passes in either direction and no socket
//!   is closed or reset, so neither end sees a FIN or an RST; what is sent waits (in the
//!   proxy, then in the kernels' buffers, until the sender's writes block), as unacknowledged
//!   segments wait for retransmission behind a real partition. [`FaultProxy::heal`] lets it
//!   through, in order, as TCP delivers it once the path is back (a client that gave up on a
//!   request meanwhile has closed the connection, and its FIN follows the data);
//! - [`FaultProxy::hold_requests`]: a blackhole in the client-to-upstream direction only, so
//!   a request either reached the broker before it began (and its answer comes back) or
//!   never does while it lasts: an unanswered request is one the broker never took;
//! - [`FaultProxy::reset_all`]: every open connection gets an RST on both sides
//!   (`SO_LINGER 0`, then close);
//! - [`FaultProxy::latency`] with jitter, one-way per direction (a round trip pays it twice),
//!   never reordering within a connection;
//! - [`FaultProxy::delay_answers`]: latency in the upstream-to-client direction only, so a
//!   request reaches the broker on time and its answer comes late (a broker answering after
//!   the client's request timeout);
//! - [`FaultProxy::bandwidth`]: each direction's bytes, all connections together, at most so
//!   many per second;
//! - [`FaultProxy::loss`]: a chunk read is held an extra 200 ms with this probability (a lost
//!   segment costs TCP a retransmission timeout, Linux's minimum being 200 ms; the stream
//!   itself never loses bytes).
//!
//! What it cannot do: drop SYNs (a connection opened during a blackhole is accepted by the
//! proxy's kernel, then gets no answer), reorder or corrupt packets, shrink windows or MTUs,
//! or cut the brokers from each other (they talk over their direct listener).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kafka::{end_offsets, Front, KafkaCluster, KafkaVersion};
use super::{free_port, wait_committed, Endpoints, Mirror, GROUP};

/// The faults in force, switched by the test.
#[derive(Debug, Clone, Default)]
struct Faults {
    /// Per direction ([`UP`], [`DOWN`]): nothing passes.
    held: [bool; 2],
    latency: Duration,
    jitter: Duration,
    /// Added in the upstream -> client direction only.
    answer_delay: Duration,
    bandwidth: Option<u64>,
    loss: f64,
}

/// The two directions of a connection.
const UP: usize = 0; // client -> upstream
const DOWN: usize = 1; // upstream -> client

/// How long a thread blocks before it looks at the faults and its connection again.
const TICK: Duration = Duration::from_millis(50);

/// What a lost segment costs TCP (Linux's minimum retransmission timeout).
const RETRANSMISSION: Duration = Duration::from_millis(200);

struct Shared {
    faults: Mutex<Faults>,
    changed: Condvar,
    conns: Mutex<Vec<Weak<Conn>>>,
    stop: AtomicBool,
    rng: Mutex<u64>,
    /// Per direction, when the link is free again (the bandwidth's token bucket).
    free_at: [Mutex<Instant>; 2],
    accepted: AtomicU64,
    forwarded: [AtomicU64; 2],
    resets: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut lock(&self.faults));
        self.changed.notify_all();
    }

    /// A number in [0, 1) (xorshift; the seed is fixed, so runs are repeatable).
    fn random(&self) -> f64 {
        let mut s = lock(&self.rng);
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Waits while `direction` is held; the faults then in force, or `None` once the
    /// connection is reset.
    fn wait_open(&self, conn: &Conn, direction: usize) -> Option<Faults> {
        let mut f = lock(&self.faults);
        loop {
            if conn.is_reset() {
                return None;
            }
            if !f.held[direction] {
                return Some(f.clone());
            }
            f = self
                .changed
                .wait_timeout(f, TICK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn live(&self) -> Vec<Arc<Conn>> {
        let mut conns = lock(&self.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.iter().filter_map(Weak::upgrade).collect()
    }
}

/// One proxied connection: both sockets, closed when the last of its four threads ends.
struct Conn {
    client: TcpStream,
    upstream: TcpStream,
    reset: AtomicBool,
}

impl Conn {
    fn is_reset(&self) -> bool {
        self.reset.load(Ordering::Relaxed)
    }

    /// (read from, write to) for a direction.
    fn sides(&self, direction: usize) -> (&TcpStream, &TcpStream) {
        if direction == UP {
            (&self.client, &self.upstream)
        } else {
            (&self.upstream, &self.client)
        }
    }

    /// Both sockets will close with an RST (`SO_LINGER 0`) once the threads let go of them;
    /// `shutdown(SHUT_RD)` sends nothing to the peers and wakes the blocked readers.
    fn abort(&self) {
        if self.reset.swap(true, Ordering::Relaxed) {
            return;
        }
        for s in [&self.client, &self.upstream] {
            let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
            let _ = s.shutdown(Shutdown::Read);
        }
    }
}

/// Bytes read from one side, with when; or the end of that side's stream.
enum Chunk {
    Data(Instant, Vec<u8>),
    End(Instant),
}

/// A TCP proxy on a loopback port in front of one address, with faults switched while it
/// runs (see the module's documentation). Dropping it resets its connections.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream` (connected
    /// when the client connects; a refused upstream resets the client).
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            faults: Mutex::new(Faults::default()),
            changed: Condvar::new(),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            rng: Mutex::new(0x9e37_79b9_7f4a_7c15),
            free_at: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
            accepted: AtomicU64::new(0),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            resets: AtomicU64::new(0),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(&s, &listener, upstream))
            .expect("starting the proxy's thread");
        FaultProxy {
            shared,
            addr,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Nothing passes in either direction from now on; no connection is closed (no FIN, no
    /// RST), and new ones are accepted and get no answer.
    pub fn blackhole(&self) {
        self.shared.set(|f| f.held = [true, true]);
    }

    /// Nothing the client sends passes from now on, while the broker's answers to what passed
    /// before still come back: a request unanswered while this lasts never reached the broker
    /// (a [`blackhole`](Self::blackhole) holds answers too, so a request that passed just
    /// before it looks as unanswered as one that never did). Connections stay open.
    pub fn hold_requests(&self) {
        self.shared.set(|f| f.held[UP] = true);
    }

    /// Every fault lifted: what waited passes, in order.
    pub fn heal(&self) {
        self.shared.set(|f| *f = Faults::default());
    }

    /// An RST to both ends of every open connection (`SO_LINGER 0`, then close).
    pub fn reset_all(&self) {
        for c in self.shared.live() {
            if !c.is_reset() {
                self.shared.resets.fetch_add(1, Ordering::Relaxed);
            }
            c.abort();
        }
    }

    /// Each chunk passes `delay` plus up to `jitter` (uniform) after it was read, each
    /// direction (order within a connection kept).
    pub fn latency(&self, delay: Duration, jitter: Duration) {
        self.shared.set(|f| {
            f.latency = delay;
            f.jitter = jitter;
        });
    }

    /// What the upstream sends passes `delay` after it was read (on top of any
    /// [`latency`](Self::latency)); what the client sends passes on time.
    pub fn delay_answers(&self, delay: Duration) {
        self.shared.set(|f| f.answer_delay = delay);
    }

    /// At most `bytes_per_sec` in each direction, all connections together.
    pub fn bandwidth(&self, bytes_per_sec: u64) {
        assert!(bytes_per_sec > 0);
        self.shared.set(|f| f.bandwidth = Some(bytes_per_sec));
    }

    /// With this probability a chunk waits an extra 200 ms (TCP's retransmission of a lost
    /// segment).
    pub fn loss(&self, probability: f64) {
        assert!((0.0..=1.0).contains(&probability));
        self.shared.set(|f| f.loss = probability);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.live().len()
    }

    /// Bytes forwarded so far: (client to upstream, upstream to client).
    pub fn forwarded(&self) -> (u64, u64) {
        (
            self.shared.forwarded[UP].load(Ordering::Relaxed),
            self.shared.forwarded[DOWN].load(Ordering::Relaxed),
        )
    }

    /// Connections reset by [`FaultProxy::reset_all`] so far.
    pub fn resets(&self) -> u64 {
        self.shared.resets.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wakes the acceptor.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for c in self.shared.live() {
            c.abort();
        }
        self.shared.changed.notify_all();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, upstream: SocketAddr) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        let upstream = match TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) {
            Ok(u) => u,
            Err(_) => {
                let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                continue;
            }
        };
        for s in [&client, &upstream] {
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(TICK));
            let _ = s.set_write_timeout(Some(TICK));
        }
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            client,
            upstream,
            reset: AtomicBool::new(false),
        });
        lock(&shared.conns).push(Arc::downgrade(&conn));
        for direction in [UP, DOWN] {
            // A bounded queue: a held direction stops reading once it is full, and the
            // sender's kernel buffers fill as they would behind a partition.
            let (tx, rx) = mpsc::sync_channel::<Chunk>(64);
            let (c, s) = (conn.clone(), shared.clone());
            std::thread::spawn(move || read_side(&c, direction, &tx));
            let c = conn.clone();
            std::thread::spawn(move || write_side(&s, &c, direction, &rx));
        }
    }
}

fn read_side(conn: &Conn, direction: usize, tx: &mpsc::SyncSender<Chunk>) {
    let (mut from, _) = conn.sides(direction);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if conn.is_reset() {
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = tx.send(Chunk::End(Instant::now()));
                return;
            }
            Ok(n) => {
                if tx
                    .send(Chunk::Data(Instant::now(), buf[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            // The peer reset (or the socket failed): so does the other side.
            Err(_) => {
                conn.abort();
                return;
            }
        }
    }
}

fn write_side(shared: &Shared, conn: &Conn, direction: usize, rx: &mpsc::Receiver<Chunk>) {
    let (_, mut to) = conn.sides(direction);
    let mut last_due = Instant::now();
    loop {
        let chunk = match rx.recv_timeout(TICK) {
            Ok(c) => c,
            Err(mpsc::RecvTimeoutError::Timeout) if !conn.is_reset() => continue,
            Err(_) => return,
        };
        let (Chunk::Data(read_at, _) | Chunk::End(read_at)) = chunk;
        let Some(faults) = shared.wait_open(conn, direction) else {
            return;
        };
        let mut delay = faults.latency;
        if direction == DOWN {
            delay += faults.answer_delay;
        }
        if !faults.jitter.is_zero() {
            delay += faults.jitter.mul_f64(shared.random());
        }
        if faults.loss > 0.0 && shared.random() < faults.loss {
            delay += RETRANSMISSION;
        }
        // Never before an earlier chunk of this connection: a stream is not reordered.
        let due = (read_at + delay).max(last_due);
        last_due = due;
        loop {
            // A blackhole that begins while a chunk waits for its time holds it too.
            if shared.wait_open(conn, direction).is_none() {
                return;
            }
            let now = Instant::now();
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(TICK));
        }
        let data = match chunk {
            Chunk::End(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Chunk::Data(_, data) => data,
        };
        if let Some(rate) = shared.faults().bandwidth {
            let until = {
                let mut free = lock(&shared.free_at[direction]);
                let start = (*free).max(Instant::now());
                *free = start + Duration::from_secs_f64(data.len() as f64 / rate as f64);
                *free
            };
            while Instant::now() < until {
                if conn.is_reset() {
                    return;
                }
                std::thread::sleep((until - Instant::now()).min(TICK));
            }
        }
        let mut rest = &data[..];
        while !rest.is_empty() {
            match to.write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    if conn.is_reset() {
                        return;
                    }
                }
                Err(_) => {
                    conn.abort();
                    return;
                }
            }
        }
        shared.forwarded[direction].fetch_add(data.len() as u64, Ordering::Relaxed);
    }
}

/// A cluster of one broker with a [`FaultProxy`] in front of its `FRONTED` listener.
fn fronted_cluster(version: KafkaVersion, extra: &[(&str, &str)]) -> (KafkaCluster, FaultProxy) {
    let (cluster, mut proxies) = fronted_brokers(version, 1, extra);
    (cluster, proxies.remove(0))
}

/// A cluster of `brokers` brokers, each with a [`FaultProxy`] in front of its `FRONTED`
/// listener (the proxies in node order).
fn fronted_brokers(
    version: KafkaVersion,
    brokers: usize,
    extra: &[(&str, &str)],
) -> (KafkaCluster, Vec<FaultProxy>) {
    let mut proxies: Vec<FaultProxy> = Vec::new();
    let mut fronts: Vec<Front> = Vec::new();
    for _ in 0..brokers {
        // Not a port another front listens on or a proxy holds (found free, not held).
        let listen = loop {
            let p = free_port();
            if !fronts.iter().any(|f| f.listen == p) && !proxies.iter().any(|x| x.port() == p) {
                break p;
            }
        };
        let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], listen)));
        fronts.push(Front {
            listen,
            advertise: proxy.port(),
        });
        proxies.push(proxy);
    }
    let cluster = KafkaCluster::start_fronted(version, brokers, extra, &fronts);
    (cluster, proxies)
}

/// A source and a target cluster of three brokers each (Kafka 4), for trials that move
/// leaders or take brokers down: started once per test process by the first trial that asks,
/// and held by one trial at a time ([`ReplicatedPair::lock`]: a broker one trial stops would
/// disturb another's copy). Each trial takes a topic and a group of its own
/// ([`ReplicatedPair::lane`]), replication factor 3 and `min.insync.replicas=2` on both
/// sides. A dead broker is fenced 4 s after its last heartbeat (Kafka's default: 9 s). The
/// target's brokers advertise a [`FaultProxy`] each: a mirror started from
/// [`ReplicatedPair::proxied`] reaches the target through them only.
///
/// As [`SharedPair`](crate::kafka::SharedPair), never dropped: the JVMs die with the test
/// process.
pub struct ReplicatedPair {
    pub source: KafkaCluster,
    pub target: KafkaCluster,
    /// Between a proxied mirror and each target broker, in node order.
    pub target_links: Vec<FaultProxy>,
}

impl ReplicatedPair {
    /// This process's replicated pair (started on the first call), held until the guard
    /// drops. Brokers a failed trial left down are started again, and faults it left on
    /// lifted.
    pub fn lock() -> MutexGuard<'static, ReplicatedPair> {
        static PAIR: OnceLock<Mutex<ReplicatedPair>> = OnceLock::new();
        let mut pair = lock(PAIR.get_or_init(|| Mutex::new(ReplicatedPair::start())));
        pair.source.restart_stopped();
        pair.target.restart_stopped();
        for link in &pair.target_links {
            link.heal();
        }
        pair
    }

    fn start() -> ReplicatedPair {
        let fencing = [
            ("broker.session.timeout.ms", "4000"),
            ("broker.heartbeat.interval.ms", "1000"),
        ];
        let mut target_extra = fencing.to_vec();
        target_extra.push(("auto.create.topics.enable", "false"));
        let (source, (target, target_links)) = std::thread::scope(|s| {
            let target = s.spawn(|| fronted_brokers(KafkaVersion::V4, 3, &target_extra));
            let source = KafkaCluster::start_with(KafkaVersion::V4, 3, &fencing);
            (source, target.join().expect("starting the target cluster"))
        });
        for cluster in [&source, &target] {
            crate::kafka::mark_shared(cluster);
        }
        ReplicatedPair {
            source,
            target,
            target_links,
        }
    }

    /// `topic` made on both clusters with `partitions` partitions of 3 replicas
    /// (`min.insync.replicas=2`), for a mirror in the group of the same name that reaches
    /// both clusters directly.
    pub fn lane(&self, topic: &'static str, partitions: i32) -> Endpoints {
        for cluster in [&self.source, &self.target] {
            cluster.create_topic(topic, partitions, 3, &[("min.insync.replicas", "2")]);
        }
        Endpoints::lane(&self.source, &self.target, topic, partitions)
    }

    /// `lane`'s endpoints as a mirror sees them through the target's proxies (the source
    /// direct): start the mirror from these, read and compare through `lane`.
    pub fn proxied(&self, lane: &Endpoints) -> Endpoints {
        Endpoints {
            src: lane.src.clone(),
            dst: self.target.fronted_bootstrap(),
            topic: lane.topic,
            partitions: lane.partitions,
            group: lane.group,
        }
    }
}

/// A source and a target cluster of one broker each, each behind its own [`FaultProxy`]:
/// mirrors started by [`FaultyPair::start`] reach them through the proxies only; everything
/// else (the [`Endpoints`] this derefs to: writing, reading, offsets, `verify`) directly.
pub struct FaultyPair {
    pub source: KafkaCluster,
    pub target: KafkaCluster,
    /// Between the mirror and the source cluster.
    pub source_link: FaultProxy,
    /// Between the mirror and the target cluster.
    pub target_link: FaultProxy,
    direct: Endpoints,
    proxied: Endpoints,
}

impl std::ops::Deref for FaultyPair {
    type Target = Endpoints;

    fn deref(&self) -> &Endpoints {
        &self.direct
    }
}

impl FaultyPair {
    /// As `KafkaPair::new`: the source topic created, the target topic left to the mirror
    /// (the target does not auto-create topics).
    pub fn new(version: KafkaVersion, topic: &'static str, partitions: i32) -> FaultyPair {
        let ((source, source_link), (target, target_link)) = std::thread::scope(|s| {
            let target =
                s.spawn(|| fronted_cluster(version, &[("auto.create.topics.enable", "false")]));
            let source = fronted_cluster(version, &[]);
            (source, target.join().expect("starting the target cluster"))
        });
        source.create_topic(topic, partitions, 1, &[]);
        let direct = Endpoints {
            src: source.bootstrap(),
            dst: target.bootstrap(),
            topic,
            partitions,
            group: GROUP,
        };
        let proxied = Endpoints {
            src: source.fronted_bootstrap(),
            dst: target.fronted_bootstrap(),
            topic,
            partitions,
            group: GROUP,
        };
        FaultyPair {
            source,
            target,
            source_link,
            target_link,
            direct,
            proxied,
        }
    }

    /// A mirror whose clients reach both clusters through the proxies only (the test
    /// defaults, as [`Endpoints::mirror`]).
    pub fn mirror(&self) -> crate::MirrorBuilder<'_> {
        self.proxied.mirror()
    }

    /// Waits until the mirror's group has committed the source's end offsets (lag 0);
    /// returns them.
    pub fn wait_caught_up(&self, mirror: &mut Mirror) -> Vec<i64> {
        let end = end_offsets(&self.src, self.topic, self.partitions);
        wait_committed(
            mirror,
            &self.src,
            self.topic,
            self.partitions,
            end.iter().sum(),
        );
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; counts the bytes it received.
    fn echo() -> (SocketAddr, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let r = received.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                r.fetch_add(n as u64, Ordering::Relaxed);
                                if s.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    fn client(proxy: &FaultProxy) -> TcpStream {
        let c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    }

    /// Waits until the upstream has received `n` bytes, panicking once `within` has passed
    /// since `since`.
    fn wait_received(received: &AtomicU64, n: u64, since: Instant, within: Duration) {
        while received.load(Ordering::Relaxed) < n {
            assert!(
                since.elapsed() < within,
                "the upstream got {} of {n} bytes within {within:?}",
                received.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn round_trip(c: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
        c.write_all(bytes).unwrap();
        let mut got = vec![0u8; bytes.len()];
        c.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn the_proxy_forwards_bytes_both_ways() {
        let (upstream, received) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        assert_eq!(round_trip(&mut c, &data), data);
        assert_eq!(received.load(Ordering::Relaxed), 100_000);
        // The proxy counts a chunk after writing it, so the client can read the last
        // chunk a moment before it is counted.
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.forwarded() != (100_000, 100_000) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(proxy.forwarded(), (100_000, 100_000));
        assert_eq!(proxy.connections(), 1);
    }

    #[test]
    fn a_blackhole_passes_nothing_and_keeps_the_connection_open() {
        let (upstream, received) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        assert_eq!(round_trip(&mut c, b"before"), b"before");
        proxy.blackhole();
        c.write_all(b"during").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        let mut buf = [0u8; 16];
        // Neither data nor an end of stream (0) nor a reset: the read times out.
        let err = c.read(&mut buf).expect_err("nothing passes a blackhole");
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{err:?}"
        );
        assert_eq!(
            received.load(Ordering::Relaxed),
            6,
            "the upstream got nothing"
        );
        // A connection opened during the blackhole is accepted and gets no answer either.
        let mut late = client(&proxy);
        late.write_all(b"late").unwrap();
        late.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(late.read(&mut buf).is_err());
        proxy.heal();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = [0u8; 6];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"during", "what waited passes once healed, in order");
        assert_eq!(round_trip(&mut c, b"after"), b"after");
        late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = [0u8; 4];
        late.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"late");
    }

    #[test]
    fn held_requests_pass_nothing_upstream_while_earlier_answers_still_come_back() {
        let (upstream, received) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        proxy.delay_answers(Duration::from_millis(500));
        c.write_all(b"sent").unwrap();
        wait_received(&received, 4, Instant::now(), Duration::from_secs(5));
        // The answer to "sent" is on its way back (500 ms late) when the hold begins.
        proxy.hold_requests();
        c.write_all(b"held").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        assert_eq!(
            &got, b"sent",
            "an answer to a request that passed comes back"
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            received.load(Ordering::Relaxed),
            4,
            "a request sent during the hold never reaches the upstream"
        );
        proxy.heal();
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"held", "what waited passes once healed");
    }

    #[test]
    fn a_reset_gives_the_client_econnreset() {
        let (upstream, _) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        assert_eq!(round_trip(&mut c, b"hello"), b"hello");
        proxy.reset_all();
        let mut buf = [0u8; 16];
        let err = c.read(&mut buf).expect_err("a reset, not an end of stream");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err:?}");
        assert_eq!(proxy.resets(), 1);
        // New connections work as before.
        let mut again = client(&proxy);
        assert_eq!(round_trip(&mut again, b"again"), b"again");
    }

    #[test]
    fn delayed_answers_let_requests_through_on_time() {
        let (upstream, received) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        proxy.delay_answers(Duration::from_millis(400));
        let started = Instant::now();
        c.write_all(b"request").unwrap();
        // Within 300 ms: the request did not wait with its answer.
        wait_received(&received, 7, started, Duration::from_millis(300));
        let mut got = [0u8; 7];
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut got).unwrap();
        let rtt = started.elapsed();
        assert_eq!(&got, b"request");
        assert!(rtt >= Duration::from_millis(400), "{rtt:?}");
    }

    #[test]
    fn latency_delays_each_direction_and_bandwidth_caps_the_rate() {
        let (upstream, _) = echo();
        let proxy = FaultProxy::start(upstream);
        let mut c = client(&proxy);
        proxy.latency(Duration::from_millis(100), Duration::from_millis(20));
        let started = Instant::now();
        assert_eq!(round_trip(&mut c, b"slow"), b"slow");
        let rtt = started.elapsed();
        assert!(
            rtt >= Duration::from_millis(200) && rtt < Duration::from_millis(600),
            "{rtt:?}"
        );
        proxy.heal();
        proxy.bandwidth(100_000);
        let data = vec![7u8; 100_000];
        let started = Instant::now();
        assert_eq!(round_trip(&mut c, &data), data);
        let took = started.elapsed();
        // 100 kB each way at 100 kB/s; the directions overlap.
        assert!(took >= Duration::from_millis(900), "{took:?}");
    }
}
