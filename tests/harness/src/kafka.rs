//! Apache Kafka as a test peer: KRaft clusters of combined broker+controller nodes (on 2.8, the
//! oldest line the batch engine claims, brokers and a ZooKeeper of their own), run from the
//! jars that `scripts/kafka-jars` collects from Maven Central (poms in `kafka/`).
//!
//! Every JVM is started from one long-lived spawner thread with `PR_SET_PDEATHSIG = SIGKILL`,
//! so the kernel kills it when the test process dies, however it dies (a panic, SIGKILL, ^C).
//! [`KafkaCluster`]'s drop SIGKILLs and reaps its JVMs; a failed test keeps the cluster's
//! folder (configs and broker logs) and prints where it is.

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use super::{admin, block_on, free_port, wait_committed_by, Endpoints, Mirror, GROUP};

/// A pinned Apache Kafka version (a pom `kafka/pom-VERSION.xml` exists for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaVersion {
    /// The newest 2.8.x, in ZooKeeper mode (its KRaft was an early-access preview): the oldest
    /// line the batch engine claims.
    V2_8,
    /// The newest 3.9.x: the last line with the Java MirrorMaker 1.
    V3_9,
    /// The newest 4.x: KIP-848's consumer group protocol is generally available.
    V4,
}

pub const KAFKA_2: KafkaVersion = KafkaVersion::V2_8;
pub const KAFKA_3: KafkaVersion = KafkaVersion::V3_9;
pub const KAFKA_4: KafkaVersion = KafkaVersion::V4;

impl KafkaVersion {
    pub fn version(self) -> &'static str {
        match self {
            KafkaVersion::V2_8 => "2.8.2",
            KafkaVersion::V3_9 => "3.9.2",
            KafkaVersion::V4 => "4.4.0",
        }
    }

    /// Its brokers keep their metadata in ZooKeeper (no KRaft controllers).
    pub fn zookeeper(self) -> bool {
        self == KafkaVersion::V2_8
    }

    /// The folder of this version's jars, fetched by `scripts/kafka-jars` when absent (the
    /// script returns at once when they are there).
    pub fn libs(self) -> PathBuf {
        static FETCH: Mutex<()> = Mutex::new(());
        let _one_at_a_time = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        let script = super::workspace_root().join("scripts/kafka-jars");
        let out = Command::new(&script)
            .arg(self.version())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "scripts/kafka-jars {} failed (needs mvn and Maven Central; ./scripts/test installs \
             maven and a JRE)",
            self.version()
        );
        let libs = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(libs.is_dir(), "{} is not a folder", libs.display());
        libs
    }
}

/// One combined broker+controller node.
struct Node {
    id: i32,
    port: u16,
    controller_port: u16,
    /// The secured listener's port, when the cluster has one ([`KafkaSecurity`]).
    secure_port: Option<u16>,
    /// The SASL_PLAINTEXT listener's port, beside a SASL_SSL one ([`SecureListener::SaslSslScram`]).
    sasl_plaintext_port: Option<u16>,
    dir: PathBuf,
    child: Option<Child>,
}

/// A KRaft cluster of `n` combined broker+controller nodes on loopback ports.
pub struct KafkaCluster {
    pub version: KafkaVersion,
    libs: PathBuf,
    nodes: Vec<Node>,
    dir: Option<tempfile::TempDir>,
    /// How long [`KafkaCluster::start`] took, formatting included.
    pub startup: Duration,
    /// The brokers' JVM options instead of the tests' small, quick-starting ones (empty: those).
    jvm: Vec<String>,
    /// Per node, the `FRONTED` listener's ports (see [`KafkaCluster::start_fronted`]).
    fronts: Vec<Front>,
    /// The cluster's own ZooKeeper ([`KafkaVersion::zookeeper`]).
    zookeeper: Option<Child>,
}

/// A node's `FRONTED` listener: it listens on `listen` and advertises `advertise`, the port of
/// something in front of it (a fault proxy, `faults::FaultProxy`, forwarding to `listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    pub listen: u16,
    pub advertise: u16,
}

/// A random Kafka cluster id: 16 bytes, base64url without padding (22 characters), not
/// starting with '-' (the storage tool would take it for an option).
fn cluster_id() -> String {
    loop {
        let id = random_uuid_base64();
        if !id.starts_with('-') {
            return id;
        }
    }
}

fn random_uuid_base64() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 16];
    let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    std::io::Read::read_exact(&mut f, &mut bytes).expect("random bytes");
    let mut bits = u128::from_be_bytes(bytes);
    // 22 characters carry 132 bits: the last one holds 2 bits of the value and 4 zero bits.
    let mut out = vec![0u8; 22];
    out[21] = ALPHABET[((bits & 0b11) << 4) as usize];
    bits >>= 2;
    for c in out[..21].iter_mut().rev() {
        *c = ALPHABET[(bits & 63) as usize];
        bits >>= 6;
    }
    String::from_utf8(out).expect("ASCII")
}

/// Spawns `cmd` so that the kernel SIGKILLs it when this process dies.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process,
/// so every JVM is forked by one spawner thread that lives as long as the process (its
/// channel's sender is in a static and never dropped).
#[allow(unsafe_code)] // pre_exec: the harness's one FFI edge
pub fn spawn_tied_to_this_process(mut cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("jvm-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply))
        .expect("the spawner thread runs");
    answer.recv().expect("the spawner thread answers")
}

/// The last `n` lines of a file (for failure messages).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl KafkaCluster {
    /// A cluster of `brokers` nodes with the test defaults (see [`KafkaCluster::start_with`]).
    pub fn start(version: KafkaVersion, brokers: usize) -> KafkaCluster {
        KafkaCluster::start_with(version, brokers, &[])
    }

    /// A cluster of `brokers` nodes; `extra` server properties override the defaults.
    pub fn start_with(
        version: KafkaVersion,
        brokers: usize,
        extra: &[(&str, &str)],
    ) -> KafkaCluster {
        KafkaCluster::start_inner(version, brokers, extra, None, &[], &[])
    }

    /// As [`KafkaCluster::start_with`], the brokers run with these JVM options (heap and
    /// collector) instead of the tests' (`-Xmx384m`, serial GC, C1 only): the benchmark runs
    /// them as `kafka-server-start.sh` does.
    pub fn start_with_jvm(
        version: KafkaVersion,
        brokers: usize,
        extra: &[(&str, &str)],
        jvm: &[&str],
    ) -> KafkaCluster {
        KafkaCluster::start_inner(version, brokers, extra, None, jvm, &[])
    }

    /// A cluster with a secured listener besides the PLAINTEXT one (see [`KafkaSecurity`]);
    /// [`KafkaCluster::secure_bootstrap`] is its address.
    pub fn start_secured(
        version: KafkaVersion,
        brokers: usize,
        extra: &[(&str, &str)],
        security: &KafkaSecurity<'_>,
    ) -> KafkaCluster {
        KafkaCluster::start_inner(version, brokers, extra, Some(security), &[], &[])
    }

    /// As [`KafkaCluster::start_with`], each node `i` also listening on `fronts[i].listen` (a
    /// PLAINTEXT listener named `FRONTED`) and advertising `fronts[i].advertise` there: a
    /// client that bootstraps through what listens on the advertised port (a fault proxy)
    /// reaches every broker through it, while [`KafkaCluster::bootstrap`] (the brokers among
    /// themselves, the harness's own clients) stays direct. See
    /// [`KafkaCluster::fronted_bootstrap`].
    pub fn start_fronted(
        version: KafkaVersion,
        brokers: usize,
        extra: &[(&str, &str)],
        fronts: &[Front],
    ) -> KafkaCluster {
        assert_eq!(fronts.len(), brokers, "one front per node");
        KafkaCluster::start_inner(version, brokers, extra, None, &[], fronts)
    }

    /// The advertised `FRONTED` addresses, comma-separated (a cluster started with
    /// [`KafkaCluster::start_fronted`]).
    pub fn fronted_bootstrap(&self) -> String {
        assert!(
            !self.fronts.is_empty(),
            "a cluster started with start_fronted"
        );
        self.fronts
            .iter()
            .map(|f| format!("127.0.0.1:{}", f.advertise))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn start_inner(
        version: KafkaVersion,
        brokers: usize,
        extra: &[(&str, &str)],
        security: Option<&KafkaSecurity<'_>>,
        jvm: &[&str],
        fronts: &[Front],
    ) -> KafkaCluster {
        assert!(brokers >= 1);
        if jvm.is_empty() {
            make_class_archive(version);
        }
        let started = Instant::now();
        let libs = version.libs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("kafka-{}-", version.version()))
            .tempdir()
            .expect("a temporary directory");
        // A port found free is not held: the next search may find it again, and the fronts'
        // listeners were found the same way. Each port of the cluster is a different one.
        let mut taken: Vec<u16> = fronts
            .iter()
            .flat_map(|f| [f.listen, f.advertise])
            .collect();
        let mut port = || loop {
            let p = free_port();
            if !taken.contains(&p) {
                taken.push(p);
                return p;
            }
        };
        let nodes: Vec<Node> = (1..=brokers as i32)
            .map(|id| Node {
                id,
                port: port(),
                controller_port: port(),
                secure_port: security.map(|_| port()),
                sasl_plaintext_port: security
                    .filter(|s| matches!(s.listener, SecureListener::SaslSslScram { .. }))
                    .map(|_| port()),
                dir: dir.path().join(format!("node-{id}")),
                child: None,
            })
            .collect();
        let voters = nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        let replication = brokers.min(3).to_string();
        let min_isr = brokers.min(2).to_string();
        let id = cluster_id();
        let zookeeper = version.zookeeper().then(|| {
            assert!(
                security.is_none() && fronts.is_empty(),
                "a ZooKeeper-mode cluster has the PLAINTEXT listener only"
            );
            (port(), dir.path().join("zookeeper"))
        });
        for node in &nodes {
            std::fs::create_dir_all(node.dir.join("data")).expect("a node folder");
            let metadata: Vec<(&str, String)> = match &zookeeper {
                Some((zk_port, _)) => vec![
                    ("broker.id", node.id.to_string()),
                    ("zookeeper.connect", format!("127.0.0.1:{zk_port}")),
                    ("listeners", format!("PLAINTEXT://127.0.0.1:{}", node.port)),
                ],
                None => vec![
                    ("process.roles", "broker,controller".to_owned()),
                    ("node.id", node.id.to_string()),
                    ("controller.quorum.voters", voters.clone()),
                    (
                        "listeners",
                        format!(
                            "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                            node.port, node.controller_port
                        ),
                    ),
                    ("controller.listener.names", "CONTROLLER".to_owned()),
                    (
                        "listener.security.protocol.map",
                        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_owned(),
                    ),
                ],
            };
            let mut props: Vec<(String, String)> = metadata
                .into_iter()
                .chain([
                    (
                        "advertised.listeners",
                        format!("PLAINTEXT://127.0.0.1:{}", node.port),
                    ),
                    ("inter.broker.listener.name", "PLAINTEXT".to_owned()),
                    ("log.dirs", node.dir.join("data").display().to_string()),
                    ("offsets.topic.replication.factor", replication.clone()),
                    (
                        "transaction.state.log.replication.factor",
                        replication.clone(),
                    ),
                    ("transaction.state.log.min.isr", min_isr.clone()),
                    // Fewer internal partitions: the first group or transaction of a test creates
                    // them, and 50 of each take seconds on 2 cores.
                    ("offsets.topic.num.partitions", "4".to_owned()),
                    ("transaction.state.log.num.partitions", "4".to_owned()),
                    ("group.initial.rebalance.delay.ms", "0".to_owned()),
                    // Lets trials that kill mirrors use short sessions (Kafka's floor is 6 s).
                    ("group.min.session.timeout.ms", "1000".to_owned()),
                    // The sample records carry timestamps from 2023: time-based retention would
                    // delete them (the first check runs 30 s after start).
                    ("log.retention.ms", "-1".to_owned()),
                    // Kafka 4.4 refuses (INVALID_TIMESTAMP, the whole batch) a record stamped more
                    // than an hour ahead of its clock and, as seen, one stamped 0; the fidelity
                    // trials write both. 3.9's defaults are these already.
                    ("log.message.timestamp.after.max.ms", i64::MAX.to_string()),
                    ("log.message.timestamp.before.max.ms", i64::MAX.to_string()),
                    ("num.network.threads", "2".to_owned()),
                    ("num.io.threads", "4".to_owned()),
                ])
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            if let (Some(security), Some(port)) = (security, node.secure_port) {
                security.apply(&mut props, port, node.sasl_plaintext_port);
            }
            if let Some(front) = fronts.get((node.id - 1) as usize) {
                front.apply(&mut props);
            }
            for (k, v) in extra {
                props.retain(|(key, _)| key != k);
                props.push(((*k).to_owned(), (*v).to_owned()));
            }
            let text: String = props.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            std::fs::write(node.dir.join("server.properties"), text).expect("server.properties");
            let log = node.dir.join("server.log");
            // 2.8 and 3.9 log through reload4j, 4.x through log4j2: each reads its own file.
            write_reload4j_config(&node.dir, &log);
            std::fs::write(
                node.dir.join("log4j2.properties"),
                format!(
                    "status = warn\n\
                     appender.file.type = File\n\
                     appender.file.name = file\n\
                     appender.file.fileName = {}\n\
                     appender.file.layout.type = PatternLayout\n\
                     appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
                     rootLogger.level = info\n\
                     rootLogger.appenderRef.file.ref = file\n",
                    log.display()
                ),
            )
            .expect("log4j2.properties");
            if zookeeper.is_some() {
                // The brokers register in ZooKeeper: no storage to format.
                continue;
            }
            let mut scram = Vec::new();
            if let Some(KafkaSecurity {
                listener: SecureListener::SaslSslScram { users },
                ..
            }) = security
            {
                // SCRAM credentials go into the metadata log at format time (KIP-900).
                for (name, password) in *users {
                    for mechanism in ["SCRAM-SHA-512", "SCRAM-SHA-256"] {
                        scram.push("--add-scram".to_owned());
                        scram.push(format!("{mechanism}=[name={name},password={password}]"));
                    }
                }
            }
            format_storage(&libs, node, &id, &scram, extra);
        }
        let mut cluster = KafkaCluster {
            version,
            libs,
            nodes,
            dir: Some(dir),
            startup: Duration::ZERO,
            jvm: jvm.iter().map(|o| (*o).to_owned()).collect(),
            fronts: fronts.to_vec(),
            zookeeper: None,
        };
        if let Some((zk_port, zk_dir)) = &zookeeper {
            cluster.zookeeper = Some(start_zookeeper(&cluster.libs, *zk_port, zk_dir));
        }
        for i in 0..brokers {
            cluster.spawn(i);
        }
        cluster.wait_ready(Duration::from_secs(180));
        cluster.startup = started.elapsed();
        eprintln!(
            "kafka {} cluster of {brokers} at {} started in {:.1} s ({})",
            version.version(),
            cluster.bootstrap(),
            cluster.startup.as_secs_f64(),
            cluster.dir().display()
        );
        cluster
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the cluster's folder").path()
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "node {} runs already", node.id);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.join("stdout.log"))
            .expect("stdout.log");
        let mut cmd = java_with(&self.libs, &node.dir, &self.jvm);
        cmd.arg("kafka.Kafka")
            .arg(node.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("stdout.log"))
            .stderr(out);
        node.child = Some(spawn_tied_to_this_process(cmd).expect("starting the JVM (java)"));
    }

    /// Waits until every node answers and a metadata request lists all brokers.
    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let client = self.client();
        loop {
            for node in &mut self.nodes {
                if let Some(child) = node.child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "kafka node {} exited at start ({status}); stdout:\n{}\nserver.log:\n{}",
                            node.id,
                            tail(&node.dir.join("stdout.log"), 30),
                            tail(&node.dir.join("server.log"), 30)
                        );
                    }
                }
            }
            let listening = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| TcpStream::connect(("127.0.0.1", n.port)).is_ok());
            if listening {
                if let Ok(md) = client.fetch_metadata(None, Duration::from_secs(2)) {
                    let up = self.nodes.iter().filter(|n| n.child.is_some()).count();
                    if md.brokers().len() >= up {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "kafka {} did not answer within {timeout:?} (logs in {})",
                self.version.version(),
                self.dir().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn client(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("log_level", "0")
            .create()
            .expect("a metadata client")
    }

    /// `host:port` of every broker's secured listener, comma-separated (a cluster started
    /// with [`KafkaCluster::start_secured`]).
    pub fn secure_bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "127.0.0.1:{}",
                    n.secure_port.expect("a cluster started with start_secured")
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `host:port` of every broker's SASL_PLAINTEXT listener (PLAIN and SCRAM-SHA-256, the
    /// same users), comma-separated (a cluster started with [`SecureListener::SaslSslScram`]).
    pub fn sasl_plaintext_bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "127.0.0.1:{}",
                    n.sasl_plaintext_port
                        .expect("a cluster started with SecureListener::SaslSslScram")
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What `user` (SASL PLAIN on the SASL_PLAINTEXT listener, a cluster started with
    /// [`SecureListener::SaslSslScram`]) gets reading `topic`/0 from its start, assigned (its
    /// group `reader`, whose offsets it neither reads nor commits: the user needs READ on
    /// the topic and DESCRIBE on that group): `Ok` at its first record, `Err` with the
    /// broker's refusal; panics if neither comes within 30 s.
    pub fn read_as(&self, user: &str, password: &str, topic: &str) -> Result<(), String> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.sasl_plaintext_bootstrap())
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "PLAIN")
            .set("sasl.username", user)
            .set("sasl.password", password)
            .set("group.id", "reader")
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
            .expect("a partition");
        consumer.assign(&tpl).expect("assigning the partition");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(_)) => return Ok(()),
                Some(Err(e)) => return Err(e.to_string()),
                None => {}
            }
        }
        panic!("{user} read no record of {topic}/0 and was refused nothing in 30 s");
    }

    /// Runs Kafka's `AclCommand` (kafka-acls) against this cluster's PLAINTEXT listener, whose
    /// principal (`User:ANONYMOUS`) is a super user of a [`KafkaSecurity`] cluster with an
    /// authorizer: e.g. `["--add", "--allow-principal", "User:mirror", "--operation", "Read",
    /// "--topic", "orders"]`. Panics with its output when it fails.
    pub fn acls(&self, args: &[&str]) -> String {
        let mut cmd = java(&self.libs, &self.nodes[0].dir);
        cmd.arg("org.apache.kafka.tools.AclCommand")
            .arg("--bootstrap-server")
            .arg(self.bootstrap())
            .args(args)
            .stdin(Stdio::null());
        let out = cmd.output().expect("running the JVM (java)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "AclCommand {args:?} failed: {text}");
        text
    }

    /// The producer ids the partition's leader keeps state for (Kafka's `TransactionsCommand
    /// describe-producers`, KIP-664): one line per producer, its id first.
    pub fn producers(&self, topic: &str, partition: i32) -> Vec<String> {
        let mut cmd = java(&self.libs, &self.nodes[0].dir);
        cmd.arg("org.apache.kafka.tools.TransactionsCommand")
            .arg("--bootstrap-server")
            .arg(self.bootstrap())
            .args(["describe-producers", "--topic", topic, "--partition"])
            .arg(partition.to_string())
            .stdin(Stdio::null());
        let out = cmd.output().expect("running the JVM (java)");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "describe-producers {topic}/{partition} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(str::to_owned)
            .collect()
    }

    /// `host:port` of every broker, comma-separated.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The process ids of the running JVMs.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// SIGKILLs node `node` (1-based, as `node.id`) and reaps it.
    pub fn kill(&mut self, node: i32) {
        let n = &mut self.nodes[(node - 1) as usize];
        let mut child = n.child.take().expect("the node runs");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops node `node` (1-based) with SIGTERM, a controlled shutdown: the controller moves
    /// the leadership of its partitions to other in-sync replicas before it exits. Waits for
    /// the exit (SIGKILL after 60 s).
    pub fn stop(&mut self, node: i32) {
        let n = &mut self.nodes[(node - 1) as usize];
        let mut child = n.child.take().expect("the node runs");
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM of node {node} failed");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("kafka node {node} did not stop within 60 s of SIGTERM: SIGKILLed");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts every node that is not running (stopped or killed by a trial that then failed).
    pub fn restart_stopped(&mut self) {
        let stopped: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_none())
            .collect();
        for &i in &stopped {
            self.spawn(i);
        }
        if !stopped.is_empty() {
            self.wait_ready(Duration::from_secs(180));
        }
    }

    /// The leader (node id) of `topic`/`partition` in a metadata answer, -1 when none.
    pub fn leader(&self, topic: &str, partition: i32) -> i32 {
        let md = self
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        md.topics()
            .first()
            .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
            .map_or(-1, |p| p.leader())
    }

    /// Runs Kafka's `LeaderElectionCommand` (kafka-leader-election) with `--election-type
    /// PREFERRED` over every partition: each partition's leadership goes back to its first
    /// replica where that replica is in sync. Panics with its output when it fails (a
    /// partition already led by its preferred replica is no failure).
    pub fn elect_preferred_leaders(&self) -> String {
        let mut cmd = java(&self.libs, &self.nodes[0].dir);
        cmd.arg("org.apache.kafka.tools.LeaderElectionCommand")
            .arg("--bootstrap-server")
            .arg(self.bootstrap())
            .args(["--election-type", "PREFERRED", "--all-topic-partitions"])
            .stdin(Stdio::null());
        let out = cmd.output().expect("running the JVM (java)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() || text.contains("Valid replica already elected"),
            "LeaderElectionCommand failed: {text}"
        );
        text
    }

    /// Starts node `node` again with its properties and data; waits until it answers.
    pub fn restart(&mut self, node: i32) {
        self.spawn((node - 1) as usize);
        self.wait_ready(Duration::from_secs(180));
    }

    /// Creates a topic and waits until every partition has a leader.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication: i32,
        configs: &[(&str, &str)],
    ) {
        let mut new_topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
        for (k, v) in configs {
            new_topic = new_topic.set(k, v);
        }
        let results = block_on(admin(&self.bootstrap()).create_topics(
            &[new_topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .expect("CreateTopics");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
        }
        self.wait_for_leaders(name, partitions);
    }

    /// Deletes `topic` (DeleteTopics) and waits until metadata no longer lists it.
    pub fn delete_topic(&self, topic: &str) {
        let results = block_on(admin(&self.bootstrap()).delete_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .expect("DeleteTopics");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("deleting {t}: {e}"));
        }
        let client = self.client();
        super::wait_until(
            Duration::from_secs(30),
            &format!("{topic} gone from the metadata"),
            || {
                client
                    .fetch_metadata(Some(topic), Duration::from_secs(2))
                    .is_ok_and(|md| md.topics().first().is_none_or(|t| t.error().is_some()))
            },
        );
    }

    /// Deletes `topic` and creates it again with `partitions` partitions (a new topic id, its
    /// offsets from 0): created once metadata no longer lists it (tried again while the
    /// controller still finishes the deletion), then waits for its leaders.
    pub fn recreate_topic(&self, topic: &str, partitions: i32) {
        self.delete_topic(topic);
        let admin = admin(&self.bootstrap());
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        super::wait_until(
            Duration::from_secs(30),
            &format!("topic {topic} created again"),
            || {
                let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
                block_on(admin.create_topics(&[new_topic], &options))
                    .is_ok_and(|results| results.iter().all(Result::is_ok))
            },
        );
        self.wait_for_leaders(topic, partitions);
    }

    /// Grows `topic` to `partitions` partitions (CreatePartitions) and waits for their leaders.
    pub fn add_partitions(&self, topic: &str, partitions: i32) {
        let grown = block_on(admin(&self.bootstrap()).create_partitions(
            &[NewPartitions::new(topic, partitions as usize)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .expect("CreatePartitions");
        for r in grown {
            r.unwrap_or_else(|(t, e)| panic!("adding partitions to {t}: {e}"));
        }
        self.wait_for_leaders(topic, partitions);
    }

    /// Waits until metadata shows `topic` with `partitions` partitions, each with a leader.
    pub fn wait_for_leaders(&self, topic: &str, partitions: i32) {
        let client = self.client();
        super::wait_until(
            Duration::from_secs(30),
            &format!("leaders for {topic}"),
            || {
                client
                    .fetch_metadata(Some(topic), Duration::from_secs(2))
                    .is_ok_and(|md| {
                        md.topics().first().is_some_and(|t| {
                            t.error().is_none()
                                && t.partitions().len() == partitions as usize
                                && t.partitions().iter().all(|p| p.leader() >= 0)
                        })
                    })
            },
        );
    }

    /// The partitions of a topic whose in-sync replicas number fewer than `replicas`.
    pub fn under_replicated(&self, topic: &str, replicas: usize) -> Vec<i32> {
        let md = self
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .expect("metadata");
        md.topics()
            .first()
            .map(|t| {
                t.partitions()
                    .iter()
                    .filter(|p| p.isr().len() < replicas)
                    .map(|p| p.id())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `topic`/`partition`'s segment files on node 1, oldest first.
    fn segment_files(&self, topic: &str, partition: i32) -> Vec<PathBuf> {
        let dir = self.nodes[0]
            .dir
            .join("data")
            .join(format!("{topic}-{partition}"));
        let mut segments: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segments.sort();
        segments
    }

    /// Each message or batch at the top of `topic`/`partition`'s segment files on node 1, read
    /// straight from disk, whole: every format starts with its offset (8 bytes) and the length
    /// of the rest (4). A frame cut short (a segment still being written) ends its file.
    fn stored_frames(&self, topic: &str, partition: i32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for segment in self.segment_files(topic, partition) {
            let bytes = std::fs::read(&segment).expect("a segment file");
            let mut pos = 0;
            while pos + 12 <= bytes.len() {
                let length =
                    i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
                if length == 0 || pos + 12 + length > bytes.len() {
                    break;
                }
                out.push(bytes[pos..pos + 12 + length].to_vec());
                pos += 12 + length;
            }
        }
        out
    }

    /// The magic byte (the record format: 0 and 1 before Kafka 0.11, 2 since) of each message
    /// or batch at the top of `topic`/`partition`'s segment files on node 1, read straight
    /// from disk (after offset, length, and a CRC (v0, v1) or leader epoch (v2)).
    pub fn stored_magics(&self, topic: &str, partition: i32) -> Vec<i8> {
        self.stored_frames(topic, partition)
            .iter()
            .filter_map(|frame| frame.get(16).map(|&magic| magic as i8))
            .collect()
    }

    /// The record batches of `topic`/`partition` as stored in node 1's segment files, read
    /// straight from disk (independent of any client).
    pub fn stored_batches(&self, topic: &str, partition: i32) -> Vec<StoredBatch> {
        let be = |frame: &[u8], at: usize, len: usize| -> i64 {
            frame[at..at + len]
                .iter()
                .fold(0i64, |n, &b| (n << 8) | i64::from(b))
        };
        self.stored_frames(topic, partition)
            .into_iter()
            .filter(|frame| frame.len() >= 61)
            .map(|frame| {
                // RecordBatch v2: baseOffset i64, batchLength i32, partitionLeaderEpoch i32,
                // magic i8, crc u32, attributes i16, lastOffsetDelta i32, baseTimestamp i64,
                // maxTimestamp i64, producerId i64 (at byte 43), producerEpoch i16,
                // baseSequence i32, recordCount i32 (at byte 57; the header is 61 bytes).
                let base_offset = be(&frame, 0, 8);
                let attributes = be(&frame, 21, 2);
                StoredBatch {
                    base_offset,
                    last_offset: base_offset + be(&frame, 23, 4) as i32 as i64,
                    records: be(&frame, 57, 4) as i32 as i64,
                    size: frame.len(),
                    codec: ["none", "gzip", "snappy", "lz4", "zstd"]
                        .get((attributes & 7) as usize)
                        .copied()
                        .unwrap_or("?"),
                    log_append_time: attributes & 8 != 0,
                    transactional: attributes & 16 != 0,
                    control: attributes & 32 != 0,
                    producer_id: be(&frame, 43, 8),
                }
            })
            .collect()
    }

    /// The last `lines` lines of every node's server log.
    pub fn logs(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- node {} server.log\n{}\n",
                    n.id,
                    tail(&n.dir.join("server.log"), lines)
                )
            })
            .collect()
    }
}

/// One record batch as a broker stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The record count of its header: fewer than its offset range where the cleaner
    /// removed records (gaps).
    pub records: i64,
    /// Bytes on disk, the batch header included (what `max.message.bytes` limits).
    pub size: usize,
    pub codec: &'static str,
    pub log_append_time: bool,
    pub transactional: bool,
    pub control: bool,
    /// -1 for a producer that is neither idempotent nor transactional.
    pub producer_id: i64,
}

/// Formats `node`'s storage (`kafka.tools.StorageTool format`) for cluster `cluster_id`. A
/// format takes a JVM of its own (0.7 CPU seconds with the class archive, a third of what a
/// node takes to listen), and every cluster of the suite needs one per node; yet what it
/// writes differs between nodes and clusters only in `meta.properties` (the node id, the
/// cluster id and a random directory id). So the first format of each kind (the jars, the
/// SCRAM credentials and the extra broker settings, which could change what it writes) is
/// kept beside the jars, and later nodes copy it and write their own `meta.properties`.
fn format_storage(
    libs: &Path,
    node: &Node,
    cluster_id: &str,
    scram: &[String],
    extra: &[(&str, &str)],
) {
    use std::hash::{Hash, Hasher};
    let data = node.dir.join("data");
    // Storage elsewhere than `data` is formatted each time.
    let elsewhere = extra
        .iter()
        .any(|(k, _)| matches!(*k, "log.dir" | "log.dirs" | "metadata.log.dir"));
    let kept = libs.parent().filter(|_| !elsewhere).and_then(|base| {
        let jars = std::fs::metadata(base.join(".complete"))
            .and_then(|m| m.modified())
            .ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (jars, scram, extra).hash(&mut h);
        Some(base.join("formatted").join(format!("{:016x}", h.finish())))
    });
    // A kept format with its marker and its meta.properties (anything else it holds is the
    // metadata log's bootstrap, copied whole).
    let usable = |k: &&PathBuf| {
        k.join(".complete").exists() && k.join("data").join("meta.properties").is_file()
    };
    if let Some(kept) = kept.as_ref().filter(usable) {
        copy_tree(&kept.join("data"), &data).expect("copying a formatted node's storage");
        let meta = data.join("meta.properties");
        let text = std::fs::read_to_string(&meta).expect("the formatted meta.properties");
        let own: String = text
            .lines()
            .map(|line| match line.split_once('=').map(|(k, _)| k) {
                Some("node.id") => format!("node.id={}\n", node.id),
                Some("cluster.id") => format!("cluster.id={cluster_id}\n"),
                Some("directory.id") => format!("directory.id={}\n", random_uuid_base64()),
                _ => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&meta, own).expect("writing meta.properties");
        return;
    }
    let out = java(libs, &node.dir)
        .args(["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c"])
        .arg(node.dir.join("server.properties"))
        .args(scram)
        .stdin(Stdio::null())
        .output()
        .expect("running the JVM (java)");
    assert!(
        out.status.success(),
        "formatting node {}'s storage failed: {}{}",
        node.id,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Kept for the next: copied aside, then renamed into place whole (another process, or
    // another test of this one, may be doing the same; the first rename wins, and either copy
    // serves).
    if let Some(kept) = kept {
        static ASIDE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = ASIDE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let aside = kept.with_extension(format!("{}-{n}.tmp", std::process::id()));
        let _ = std::fs::remove_dir_all(&aside);
        let saved = copy_tree(&data, &aside.join("data"))
            .and_then(|()| std::fs::write(aside.join(".complete"), ""))
            .and_then(|()| std::fs::create_dir_all(kept.parent().expect("a parent")))
            .and_then(|()| std::fs::rename(&aside, &kept));
        if saved.is_err() {
            let _ = std::fs::remove_dir_all(&aside);
        }
    }
}

/// Copies the files and folders under `from` into `to` (made if missing).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `java` (or `$JAVA`) with a small heap and start-up-friendly flags, Kafka's jars on the class
/// path and the node's logging configs.
fn java(libs: &Path, node_dir: &Path) -> Command {
    java_with(libs, node_dir, &[])
}

/// The tests' JVM options: a small heap, the serial collector, C1 only (a test broker is
/// short-lived: start-up matters more than peak speed).
const QUICK_JVM: &[&str] = &[
    "-Xmx384m",
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
];

/// As [`java`], with these JVM options instead of the small heap and quick-start flags (none:
/// those, and the version's class-data archive where there is one: [`class_archive`]).
fn java_with(libs: &Path, node_dir: &Path, options: &[String]) -> Command {
    let mut cmd = Command::new(java_program());
    if options.is_empty() {
        cmd.args(QUICK_JVM);
        if let Some(archive) = class_archive_of(libs).filter(|a| a.exists()) {
            cmd.arg(format!("-XX:SharedArchiveFile={}", archive.display()));
        }
    } else {
        cmd.args(options);
    }
    cmd.arg(format!(
        "-Dlog4j.configuration=file:{}",
        node_dir.join("log4j.properties").display()
    ))
    .arg(format!(
        "-Dlog4j2.configurationFile={}",
        node_dir.join("log4j2.properties").display()
    ))
    .arg("-cp")
    .arg(format!("{}/*", libs.display()));
    cmd
}

fn java_program() -> std::ffi::OsString {
    std::env::var_os("JAVA").unwrap_or_else(|| "java".into())
}

/// Where the class-data archive of the jars in `libs` is kept for the JVM that runs the tests:
/// beside `libs`, named by that JVM's binary (its size and time) and by when the jars were
/// fetched (`scripts/kafka-jars`' marker), since an archive serves only the JVM that wrote it
/// and the jars it was made of. None when the JVM or the marker cannot be found.
fn class_archive_of(libs: &Path) -> Option<PathBuf> {
    static JVM_KEY: OnceLock<Option<String>> = OnceLock::new();
    let seconds = |path: &Path| -> Option<u64> {
        let modified = std::fs::metadata(path).ok()?.modified().ok()?;
        Some(
            modified
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs(),
        )
    };
    let jvm = JVM_KEY.get_or_init(|| {
        let program = PathBuf::from(java_program());
        let found = if program.components().count() > 1 {
            Some(program)
        } else {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join(&program))
                .find(|p| p.is_file())
        }?;
        let binary = std::fs::canonicalize(found).ok()?;
        let size = std::fs::metadata(&binary).ok()?.len();
        Some(format!("{size:x}-{:x}", seconds(&binary)?))
    });
    let base = libs.parent()?;
    let jars = seconds(&base.join(".complete"))?;
    Some(base.join(format!("classes-{}-{jars:x}.jsa", jvm.as_ref()?)))
}

/// Makes the class-data sharing archive of `version`'s jars once (`-XX:ArchiveClassesAtExit`,
/// JDK 13 and later): a node is started, given a topic and some records and stopped, and the
/// classes it loaded are kept in one file that every later JVM on these jars maps instead of
/// loading and verifying them again. Measured on 2 cores: a broker takes 1.4 CPU seconds
/// instead of 2.5 to listen, and 1.1 s instead of 2.2. Across test processes one makes it
/// (a file lock) while the others wait. It never fails a test: an archive that cannot be made
/// (an older JVM, a node that does not start) is said once and marked (`.failed` beside it),
/// and the JVMs run without it.
fn make_class_archive(version: KafkaVersion) {
    static TRIED: [Mutex<bool>; 3] = [Mutex::new(false), Mutex::new(false), Mutex::new(false)];
    let slot = match version {
        KafkaVersion::V2_8 => 0,
        KafkaVersion::V3_9 => 1,
        KafkaVersion::V4 => 2,
    };
    let mut tried = TRIED[slot].lock().unwrap_or_else(|e| e.into_inner());
    if *tried {
        return;
    }
    *tried = true;
    let libs = version.libs();
    let Some(archive) = class_archive_of(&libs) else {
        return;
    };
    let failed = archive.with_extension("failed");
    let made_or_given_up = || archive.exists() || failed.exists();
    if made_or_given_up() {
        return;
    }
    let Ok(lock) = std::fs::File::create(archive.with_extension("lock")) else {
        return;
    };
    if lock.lock().is_err() || made_or_given_up() {
        return;
    }
    let started = Instant::now();
    let dumped = archive.with_extension(format!("{}.tmp", std::process::id()));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dump_classes(version, &libs, &dumped)
    }))
    .unwrap_or_else(|_| Err("the warm-up node failed (its panic is above)".to_owned()))
    .and_then(|()| {
        std::fs::rename(&dumped, &archive).map_err(|e| format!("{}: {e}", dumped.display()))
    });
    match outcome {
        Ok(()) => eprintln!(
            "kafka {}: class-data archive {} made in {:.1} s",
            version.version(),
            archive.display(),
            started.elapsed().as_secs_f64()
        ),
        Err(why) => {
            let _ = std::fs::remove_file(&dumped);
            eprintln!(
                "kafka {}: no class-data archive ({why}); the JVMs load the classes themselves \
                 (delete {} to try again)",
                version.version(),
                failed.display()
            );
            let _ = std::fs::write(&failed, format!("{why}\n"));
        }
    }
}

/// Starts a node of `version` that writes the classes it loaded into `dumped` as it exits,
/// warms it up, stops it (SIGTERM: the JVM writes the archive on its way out) and checks that
/// a JVM maps the archive (`-Xshare:on` refuses one that is cut short or not its own).
fn dump_classes(version: KafkaVersion, libs: &Path, dumped: &Path) -> Result<(), String> {
    let at_exit = format!("-XX:ArchiveClassesAtExit={}", dumped.display());
    let jvm: Vec<&str> = QUICK_JVM
        .iter()
        .copied()
        .chain([at_exit.as_str()])
        .collect();
    let mut cluster = KafkaCluster::start_inner(version, 1, &[], None, &jvm, &[]);
    cluster.create_topic("warm-up", 1, 1, &[]);
    let _ = super::write_samples(&cluster.bootstrap(), "warm-up", 0..100, 1, 10);
    cluster.stop(1);
    drop(cluster);
    // A JVM given a broken archive can abort: its crash report goes to the temporary folder.
    let check = Command::new(java_program())
        .args(QUICK_JVM)
        .current_dir(std::env::temp_dir())
        .arg("-XX:-CreateCoredumpOnCrash")
        .arg("-Xshare:on")
        .arg(format!("-XX:SharedArchiveFile={}", dumped.display()))
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg("-version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running java: {e}"))?;
    if check.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the archive the node wrote does not map: {}",
            String::from_utf8_lossy(&check.stderr).trim()
        ))
    }
}

/// `dir/log4j.properties`: reload4j logging everything from INFO into `log`.
fn write_reload4j_config(dir: &Path, log: &Path) {
    std::fs::write(
        dir.join("log4j.properties"),
        format!(
            "log4j.rootLogger=INFO, file\n\
             log4j.appender.file=org.apache.log4j.FileAppender\n\
             log4j.appender.file.File={}\n\
             log4j.appender.file.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n",
            log.display()
        ),
    )
    .unwrap_or_else(|e| panic!("writing {}/log4j.properties: {e}", dir.display()));
}

/// A standalone ZooKeeper on `port` keeping its data in `dir` (the one Kafka 2.8 ships), once
/// it answers `srvr`.
fn start_zookeeper(libs: &Path, port: u16, dir: &Path) -> Child {
    std::fs::create_dir_all(dir.join("data")).expect("a ZooKeeper folder");
    std::fs::write(
        dir.join("zoo.cfg"),
        format!(
            "dataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\n\
             admin.enableServer=false\n4lw.commands.whitelist=srvr\n",
            dir.join("data").display()
        ),
    )
    .expect("zoo.cfg");
    write_reload4j_config(dir, &dir.join("zookeeper.log"));
    let out = std::fs::File::create(dir.join("stdout.log")).expect("stdout.log");
    let mut cmd = java(libs, dir);
    cmd.arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(dir.join("zoo.cfg"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("stdout.log"))
        .stderr(out);
    let mut child = spawn_tied_to_this_process(cmd).expect("starting the JVM (java)");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // A ZooKeeper still starting may take the connection and not answer: each try is
        // bounded (once, the read waited for ever).
        let answered = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.set_write_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"srvr")?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut s, &mut text)?;
            Ok(text)
        });
        if answered.is_ok_and(|t| t.contains("Mode: standalone")) {
            return child;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "ZooKeeper exited at start ({status}):\n{}",
                tail(&dir.join("stdout.log"), 30)
            );
        }
        assert!(
            Instant::now() < deadline,
            "ZooKeeper did not answer within 60 s (logs in {})",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Some(mut zookeeper) = self.zookeeper.take() {
            let _ = zookeeper.kill();
            let _ = zookeeper.wait();
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!(
                    "kafka {} cluster's configs and logs kept in {}",
                    self.version.version(),
                    kept.display()
                );
            }
        }
    }
}

/// A source and a target cluster of one Kafka version, each with `topic` in `partitions`
/// partitions (started side by side).
pub struct KafkaPair {
    pub source: KafkaCluster,
    pub target: KafkaCluster,
    endpoints: Endpoints,
}

impl std::ops::Deref for KafkaPair {
    type Target = Endpoints;

    fn deref(&self) -> &Endpoints {
        &self.endpoints
    }
}

impl std::ops::DerefMut for KafkaPair {
    fn deref_mut(&mut self) -> &mut Endpoints {
        &mut self.endpoints
    }
}

/// A source of one broker and a target of `target_brokers`, started side by side; the target
/// has `auto.create.topics.enable=false` unless `broker_extra` says otherwise.
fn start_pair(
    version: KafkaVersion,
    target_brokers: usize,
    broker_extra: &[(&str, &str)],
) -> (KafkaCluster, KafkaCluster) {
    let mut target_extra = vec![("auto.create.topics.enable", "false")];
    target_extra.retain(|(k, _)| !broker_extra.iter().any(|(e, _)| e == k));
    target_extra.extend_from_slice(broker_extra);
    std::thread::scope(|s| {
        let target = s.spawn(|| KafkaCluster::start_with(version, target_brokers, &target_extra));
        let source = KafkaCluster::start_with(version, 1, broker_extra);
        (source, target.join().expect("starting the target cluster"))
    })
}

impl KafkaPair {
    /// One broker each; the source topic created, the target topic left to the mirror.
    pub fn new(version: KafkaVersion, topic: &'static str, partitions: i32) -> KafkaPair {
        KafkaPair::with(version, 1, &[], topic, partitions, &[])
    }

    /// `target_brokers` target nodes, `broker_extra` server properties on both clusters (the
    /// target has `auto.create.topics.enable=false` unless `broker_extra` says otherwise); the
    /// source topic created with these topic configs.
    pub fn with(
        version: KafkaVersion,
        target_brokers: usize,
        broker_extra: &[(&str, &str)],
        topic: &'static str,
        partitions: i32,
        source_topic_configs: &[(&str, &str)],
    ) -> KafkaPair {
        // Topics the trials expect are made by the mirror (`--create.topics`) or the test;
        // `a_target_with_auto_create_gets_the_source_partitions` runs with Kafka's default.
        let (source, target) = start_pair(version, target_brokers, broker_extra);
        source.create_topic(topic, partitions, 1, source_topic_configs);
        // A node restarts on its own ports: the addresses stay valid.
        let endpoints = Endpoints {
            src: source.bootstrap(),
            dst: target.bootstrap(),
            topic,
            partitions,
            group: GROUP,
        };
        KafkaPair {
            source,
            target,
            endpoints,
        }
    }
}

impl Endpoints {
    /// A lane of clusters shared by several trials: `topic` from `source` to `target`, both
    /// reached directly, for a mirror in the group named as the topic, so that no trial sees
    /// another's commits or rebalances ([`SharedPair::lane`], `faults::ReplicatedPair::lane`;
    /// each makes the topics its way).
    pub fn lane(
        source: &KafkaCluster,
        target: &KafkaCluster,
        topic: &'static str,
        partitions: i32,
    ) -> Endpoints {
        Endpoints {
            src: source.bootstrap(),
            dst: target.bootstrap(),
            topic,
            partitions,
            group: topic,
        }
    }

    /// The source topic's end offsets (high watermarks), per partition.
    pub fn end_offsets(&self) -> Vec<i64> {
        end_offsets(&self.src(), self.topic, self.partitions)
    }

    /// Waits until the mirror's group has committed the source's end offsets (lag 0);
    /// returns them.
    pub fn wait_caught_up(&self, mirror: &mut Mirror) -> Vec<i64> {
        let end = self.end_offsets();
        wait_committed_by(
            self.group,
            mirror,
            &self.src(),
            self.topic,
            self.partitions,
            end.iter().sum(),
        );
        end
    }
}

/// A source and a target cluster of one broker each, started once per test process by the
/// first trial that asks and shared by the trials that can share clusters: each takes a topic
/// and a group of its own ([`SharedPair::lane`]), so none sees another's records, commits or
/// rebalances. A cluster start costs 7 to 14 s on a loaded runner; a trial file whose trials
/// share one pair pays it once.
///
/// Statics are never dropped: the JVMs die with the test process (`PR_SET_PDEATHSIG`), and
/// the next shared pair of any test process removes the folders of pairs whose process is
/// gone (so a failed run's logs stay until then).
pub struct SharedPair {
    pub source: KafkaCluster,
    pub target: KafkaCluster,
}

/// Marks a shared pair's cluster folder with the pid of the test process that owns it.
const SHARED_BY: &str = "shared-by-pid";

impl SharedPair {
    /// This process's shared pair of `version` (started on the first call).
    pub fn get(version: KafkaVersion) -> &'static SharedPair {
        static KAFKA_2: OnceLock<SharedPair> = OnceLock::new();
        static KAFKA_3: OnceLock<SharedPair> = OnceLock::new();
        static KAFKA_4: OnceLock<SharedPair> = OnceLock::new();
        let cell = match version {
            KafkaVersion::V2_8 => &KAFKA_2,
            KafkaVersion::V3_9 => &KAFKA_3,
            KafkaVersion::V4 => &KAFKA_4,
        };
        cell.get_or_init(|| {
            let (source, target) = start_pair(version, 1, &[]);
            for cluster in [&source, &target] {
                mark_shared(cluster);
            }
            SharedPair { source, target }
        })
    }

    /// `topic` made on the source with `partitions` partitions (the target topic left to the
    /// mirror), for a mirror in the group of the same name.
    pub fn lane(&self, topic: &'static str, partitions: i32) -> Endpoints {
        self.lane_with(topic, partitions, &[])
    }

    /// As [`SharedPair::lane`], the source topic made with these topic configs.
    pub fn lane_with(
        &self,
        topic: &'static str,
        partitions: i32,
        source_topic_configs: &[(&str, &str)],
    ) -> Endpoints {
        self.source
            .create_topic(topic, partitions, 1, source_topic_configs);
        Endpoints::lane(&self.source, &self.target, topic, partitions)
    }
}

/// Marks a cluster that lives as long as this test process (a shared pair's) with its pid, so
/// that a later process removes its folder once this one is gone; removes the folders of
/// shared clusters whose process is gone.
pub(crate) fn mark_shared(cluster: &KafkaCluster) {
    remove_folders_of_gone_shared_pairs();
    let mark = cluster.dir().join(SHARED_BY);
    std::fs::write(&mark, std::process::id().to_string())
        .unwrap_or_else(|e| panic!("writing {}: {e}", mark.display()));
}

/// Removes the cluster folders of shared pairs whose test process is gone.
fn remove_folders_of_gone_shared_pairs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_kafka = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("kafka-"));
        let owner = std::fs::read_to_string(dir.join(SHARED_BY))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        if let (true, Some(pid)) = (is_kafka, owner) {
            if process_gone(pid) {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

/// The high watermark of partition 0 of `topic`, 0 while the topic is not there (a topic the
/// mirror makes on the target once it copies it, as the heartbeats topic).
pub fn end_offset_or_zero(bootstrap: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .map_or(0, |(_, high)| high)
}

/// The end offsets (high watermarks) of partitions `0..partitions` of `topic`.
pub fn end_offsets(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .collect()
}

/// Reads lines from a child's stdout until one starts with `prefix`; returns the rest of it.
pub fn read_line_starting(
    reader: &mut impl BufRead,
    prefix: &str,
    timeout: Duration,
) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(rest) = line.trim_end().strip_prefix(prefix) {
            return Some(rest.to_owned());
        }
    }
    None
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Prints a line to stdout at once (for a parent process that reads it).
pub fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Test certificates made with `openssl` in a temporary folder: a CA, a broker certificate for
/// 127.0.0.1 (subjectAltName IP:127.0.0.1, so librdkafka's default hostname check passes) and
/// a client certificate whose subject is `CN=mirror`. Keys are unencrypted PKCS#8 PEM (what
/// both Kafka's PEM key stores and librdkafka read).
pub struct TestPki {
    dir: tempfile::TempDir,
}

/// The name in the client certificate (`CN=mirror`); with [`KafkaSecurity`]'s principal
/// mapping the principal is `User:mirror`.
pub const CLIENT_CN: &str = "mirror";

impl TestPki {
    pub fn generate() -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix("test-pki-")
            .tempdir()
            .expect("a temporary directory");
        let d = dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .stdin(Stdio::null())
                .output()
                .expect("running openssl (./scripts/test installs it when absent)");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=mirror-test-ca"];
        ca.extend_from_slice(&ec);
        ca.extend_from_slice(&["-keyout", "ca.key", "-out", "ca.pem"]);
        openssl(&ca);
        std::fs::write(d.join("broker.ext"), "subjectAltName=IP:127.0.0.1\n").expect("broker.ext");
        std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("client.ext");
        for (name, subject) in [("broker", "/CN=127.0.0.1"), ("client", "/CN=mirror")] {
            let mut req = vec!["req", "-subj", subject];
            req.extend_from_slice(&ec);
            let (key, csr, cert, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            req.extend_from_slice(&["-keyout", &key, "-out", &csr]);
            openssl(&req);
            openssl(&[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ]);
        }
        // Kafka's file-based PEM key store: the private key and the certificate chain in one
        // file.
        let keystore = [
            std::fs::read_to_string(d.join("broker.key")).expect("broker.key"),
            std::fs::read_to_string(d.join("broker.pem")).expect("broker.pem"),
            std::fs::read_to_string(d.join("ca.pem")).expect("ca.pem"),
        ]
        .concat();
        std::fs::write(d.join("broker-keystore.pem"), keystore).expect("broker-keystore.pem");
        TestPki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The CA certificate (PEM): the clients' `ssl.ca.location`, the brokers' trust store.
    pub fn ca(&self) -> String {
        self.path("ca.pem")
    }

    /// The client certificate (PEM): `ssl.certificate.location`.
    pub fn client_cert(&self) -> String {
        self.path("client.pem")
    }

    /// The client's private key (PEM, unencrypted): `ssl.key.location`.
    pub fn client_key(&self) -> String {
        self.path("client.key")
    }

    fn broker_keystore(&self) -> String {
        self.path("broker-keystore.pem")
    }
}

/// How a secured listener authenticates clients.
pub enum SecureListener<'a> {
    /// SASL_SSL with SCRAM-SHA-512; these `(name, password)` users are created at format time
    /// (for SCRAM-SHA-256 too). A second listener, SASL_PLAINTEXT with PLAIN and SCRAM-SHA-256
    /// for the same users, is at [`KafkaCluster::sasl_plaintext_bootstrap`].
    SaslSslScram { users: &'a [(&'a str, &'a str)] },
    /// SSL with `ssl.client.auth=required` (mutual TLS): the principal is the client
    /// certificate's CN.
    MutualTls,
}

/// A secured listener named `SECURE` next to the PLAINTEXT one. The PLAINTEXT listener stays
/// for the brokers themselves (inter-broker) and the harness's own clients (topics, records,
/// offsets); the controller listener stays PLAINTEXT too. With `authorizer`, Kafka's
/// `StandardAuthorizer` runs and `User:ANONYMOUS` (every PLAINTEXT client, brokers and
/// controllers included) is a super user: only clients of the secured listener are subject to
/// ACLs (see [`KafkaCluster::acls`]).
pub struct KafkaSecurity<'a> {
    pub listener: SecureListener<'a>,
    pub pki: &'a TestPki,
    pub authorizer: bool,
}

impl KafkaSecurity<'_> {
    fn apply(&self, props: &mut Vec<(String, String)>, port: u16, sasl_plaintext: Option<u16>) {
        let get = |k: &str| {
            props
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let listeners = get("listeners");
        let advertised = get("advertised.listeners");
        let map = get("listener.security.protocol.map");
        let mut set = |k: &str, v: String| {
            props.retain(|(key, _)| key != k);
            props.push((k.to_owned(), v));
        };
        let protocol = match self.listener {
            SecureListener::SaslSslScram { .. } => "SASL_SSL",
            SecureListener::MutualTls => "SSL",
        };
        let (mut listeners, mut advertised, mut map) = (
            format!("{listeners},SECURE://127.0.0.1:{port}"),
            format!("{advertised},SECURE://127.0.0.1:{port}"),
            format!("{map},SECURE:{protocol}"),
        );
        if let Some(p) = sasl_plaintext {
            listeners.push_str(&format!(",SASLPLAIN://127.0.0.1:{p}"));
            advertised.push_str(&format!(",SASLPLAIN://127.0.0.1:{p}"));
            map.push_str(",SASLPLAIN:SASL_PLAINTEXT");
        }
        set("listeners", listeners);
        set("advertised.listeners", advertised);
        set("listener.security.protocol.map", map);
        set("ssl.keystore.type", "PEM".into());
        set("ssl.keystore.location", self.pki.broker_keystore());
        set("ssl.truststore.type", "PEM".into());
        set("ssl.truststore.location", self.pki.ca());
        match self.listener {
            SecureListener::SaslSslScram { users } => {
                let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
                set(
                    "listener.name.secure.sasl.enabled.mechanisms",
                    "SCRAM-SHA-512".into(),
                );
                set(
                    "listener.name.secure.scram-sha-512.sasl.jaas.config",
                    scram.into(),
                );
                if sasl_plaintext.is_some() {
                    set(
                        "listener.name.saslplain.sasl.enabled.mechanisms",
                        "PLAIN,SCRAM-SHA-256".into(),
                    );
                    set(
                        "listener.name.saslplain.scram-sha-256.sasl.jaas.config",
                        scram.into(),
                    );
                    // PLAIN's users are its login module's `user_NAME="PASSWORD"` options.
                    let plain_users: String = users
                        .iter()
                        .map(|(name, password)| format!(" user_{name}=\"{password}\""))
                        .collect();
                    set(
                        "listener.name.saslplain.plain.sasl.jaas.config",
                        format!(
                            "org.apache.kafka.common.security.plain.PlainLoginModule \
                             required{plain_users};"
                        ),
                    );
                }
            }
            SecureListener::MutualTls => {
                set("listener.name.secure.ssl.client.auth", "required".into());
                // User:mirror rather than User:CN=mirror.
                set(
                    "ssl.principal.mapping.rules",
                    "RULE:^CN=([^,]*)$/$1/,DEFAULT".into(),
                );
            }
        }
        if self.authorizer {
            set(
                "authorizer.class.name",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
            );
            set("super.users", "User:ANONYMOUS".into());
        }
    }
}

impl Front {
    fn apply(&self, props: &mut [(String, String)]) {
        for (key, value) in props.iter_mut() {
            match key.as_str() {
                "listeners" => value.push_str(&format!(",FRONTED://127.0.0.1:{}", self.listen)),
                "advertised.listeners" => {
                    value.push_str(&format!(",FRONTED://127.0.0.1:{}", self.advertise))
                }
                "listener.security.protocol.map" => value.push_str(",FRONTED:PLAINTEXT"),
                _ => {}
            }
        }
    }
}

/// `kafka-run-class.sh`'s JVM performance options (`KAFKA_JVM_PERFORMANCE_OPTS` unset), which
/// both MirrorMaker scripts use.
pub const TOOL_JVM: &[&str] = &[
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
];

/// MirrorMaker 2's properties for clusters of one broker: every topic it makes has one
/// replica.
pub const MM2_ON_ONE_BROKER: &str = "replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
";

/// `connect-mirror-maker.sh`'s heap.
pub const MM2_HEAP: &[&str] = &["-Xms256M", "-Xmx2G"];

/// Kafka's MirrorMaker 2 of Kafka 3.9.2 in dedicated mode (`org.apache.kafka.connect.mirror.
/// MirrorMaker`), from the jars `scripts/kafka-jars mm2-3.9.2` collects; its log (INFO) in its
/// temporary folder.
pub struct MirrorMaker2 {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl MirrorMaker2 {
    /// The folder of MirrorMaker 2's jars (fetched once).
    pub fn libs() -> PathBuf {
        static FETCH: Mutex<()> = Mutex::new(());
        let _one_at_a_time = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        let script = super::workspace_root().join("scripts/kafka-jars");
        let out = Command::new(&script)
            .arg("mm2-3.9.2")
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "scripts/kafka-jars mm2-3.9.2 failed (needs mvn and Maven Central)"
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// Starts MirrorMaker 2 with these `mm2.properties` (the tests' small, quick-starting
    /// JVM).
    pub fn start(properties: &str) -> MirrorMaker2 {
        MirrorMaker2::start_with_jvm(properties, &[])
    }

    /// Starts MirrorMaker 2 as `connect-mirror-maker.sh` runs it (its heap, the collector
    /// options of `kafka-run-class.sh`): for measurements.
    pub fn start_as_its_script(properties: &str) -> MirrorMaker2 {
        let options: Vec<String> = MM2_HEAP
            .iter()
            .chain(TOOL_JVM)
            .map(|o| o.to_string())
            .collect();
        MirrorMaker2::start_with_jvm(properties, &options)
    }

    fn start_with_jvm(properties: &str, options: &[String]) -> MirrorMaker2 {
        let libs = MirrorMaker2::libs();
        let dir = tempfile::Builder::new()
            .prefix("mm2-")
            .tempdir()
            .expect("a temporary directory");
        let file = dir.path().join("mm2.properties");
        std::fs::write(&file, properties).expect("mm2.properties");
        write_reload4j_config(dir.path(), &dir.path().join("mm2.log"));
        let out = std::fs::File::create(dir.path().join("stdout.log")).expect("stdout.log");
        let mut cmd = java_with(&libs, dir.path(), options);
        cmd.arg("org.apache.kafka.connect.mirror.MirrorMaker")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("stdout.log"))
            .stderr(out);
        let child = spawn_tied_to_this_process(cmd).expect("starting MirrorMaker 2 (java)");
        MirrorMaker2 {
            child: Some(child),
            dir,
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (Connect's graceful shutdown: tasks stop and flush their source offsets), then
    /// waits at most 60 s for the exit.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "MirrorMaker 2 did not stop within 60 s; log:\n{}",
                    self.log(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last `lines` lines of its log and output.
    pub fn log(&self, lines: usize) -> String {
        format!(
            "{}\n{}",
            tail(&self.dir.path().join("mm2.log"), lines),
            tail(&self.dir.path().join("stdout.log"), lines)
        )
    }
}

impl Drop for MirrorMaker2 {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let kept = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("a temporary directory"),
            )
            .keep();
            eprintln!("MirrorMaker 2's config and log kept in {}", kept.display());
        }
    }
}

/// When a copy of `expected` records became readable on a topic: see [`watch_arrival`].
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// The first records were read.
    pub first: Instant,
    /// How many records that first read returned.
    pub at_first: i64,
    /// The `expected`-th record was read.
    pub done: Instant,
}

impl Arrival {
    /// Records per second from the first read to the last (the first read's records left
    /// out): the steady rate of whatever copied them, start-up and group join excluded.
    pub fn rate(&self, expected: i64) -> f64 {
        (expected - self.at_first) as f64 / self.done.duration_since(self.first).as_secs_f64()
    }
}

/// Reads `topic` on `bootstrap` from the beginning as a `read_committed` consumer (a topic
/// that does not exist yet is waited for) until `expected` records have been read; fails
/// after `timeout` or once `alive` says the copier has stopped. The same measure for every
/// copier, transactional or not, whatever it commits where.
pub fn watch_arrival(
    bootstrap: &str,
    topic: &str,
    expected: i64,
    timeout: Duration,
    mut alive: impl FnMut() -> bool,
) -> Arrival {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("arrival-{topic}-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("topic.metadata.refresh.interval.ms", "500")
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribing");
    let deadline = Instant::now() + timeout;
    let mut read = 0i64;
    let mut first = None;
    loop {
        let mut polled = 0i64;
        let mut last_read = None;
        while let Some(m) = consumer.poll(Duration::from_millis(100)) {
            if m.is_ok() {
                polled += 1;
                last_read = Some(Instant::now());
            }
            if polled >= 10_000 || read + polled >= expected {
                break;
            }
        }
        let now = Instant::now();
        if polled > 0 {
            read += polled;
            first.get_or_insert((last_read.unwrap_or(now), read));
        }
        if read >= expected {
            let (first, at_first) = first.expect("records were read");
            return Arrival {
                first,
                at_first,
                done: last_read.unwrap_or(now),
            };
        }
        assert!(
            now < deadline && alive(),
            "{read} of {expected} records of {topic} readable, and the copier stopped or \
             {timeout:?} passed"
        );
    }
}
