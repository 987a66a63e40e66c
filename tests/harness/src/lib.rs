//! The end-to-end tests' shared harness: clusters (librdkafka's mock in the test process,
//! tansu brokers, Apache Kafka in [`kafka`]), config files, the mirror binary as a child
//! process, and what tests read back (committed offsets, records). A crate of its own, so
//! that each test file uses what it needs and nothing is compiled as dead code.

pub mod failover;
pub mod kafka;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub use mirror_maker::tools::compare::Comparison;
pub use mirror_maker::tools::demo::{compare_topic, sample, write_samples};

pub const GROUP: &str = "mirror-test";

/// Client settings that make group changes quick on test clusters (see tests/README.md).
pub const FAST_GROUP: &[(&str, &str)] = &[
    ("session.timeout.ms", "6000"),
    ("max.poll.interval.ms", "10000"),
    ("heartbeat.interval.ms", "500"),
    ("fetch.wait.max.ms", "10"),
];

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// Writes a TOML config with `bootstrap.servers` and the given extra keys.
pub fn write_config(dir: &Path, name: &str, bootstrap: &str, extra: &[(&str, &str)]) -> PathBuf {
    let mut text = format!("bootstrap.servers = \"{bootstrap}\"\n");
    for (k, v) in extra {
        text.push_str(&format!("{k} = \"{v}\"\n"));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing a config file");
    path
}

/// Consumer and producer configs for a mirror from `source` to `target` in group [`GROUP`].
pub fn mirror_configs(
    dir: &Path,
    source: &str,
    target: &str,
    consumer_extra: &[(&str, &str)],
    producer_extra: &[(&str, &str)],
) -> (PathBuf, PathBuf) {
    let mut consumer: Vec<(&str, &str)> = vec![("group.id", GROUP)];
    consumer.extend_from_slice(FAST_GROUP);
    // The test's own settings override the defaults above.
    consumer.retain(|(k, _)| !consumer_extra.iter().any(|(e, _)| e == k));
    // Under KIP-848 the broker sets the session and the heartbeat; the mirror refuses both.
    if consumer_extra.contains(&("group.protocol", "consumer")) {
        consumer.retain(|(k, _)| !matches!(*k, "session.timeout.ms" | "heartbeat.interval.ms"));
    }
    consumer.extend_from_slice(consumer_extra);
    (
        write_config(dir, "consumer.toml", source, &consumer),
        write_config(dir, "producer.toml", target, producer_extra),
    )
}

/// The mirror binary, run as a child process with its stderr kept in a file.
pub struct Mirror {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    /// The config files, when the harness wrote them for this mirror.
    pub _configs: Option<tempfile::TempDir>,
}

/// The repository's root (this crate lives in tests/harness).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `mirror-maker` binary cargo built for the running test: next to the test executable's
/// `deps` folder.
pub fn mirror_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test executable in <target>/<profile>/deps");
    dir.join("mirror-maker")
}

pub fn binary() -> Command {
    Command::new(mirror_binary())
}

/// The mirror binary run through a wrapper command when one is given: `MIRROR_WRAPPER` in
/// `env` (one mirror) or in the test's environment (every mirror), split at spaces, e.g.
/// `valgrind --error-exitcode=99 -q`. The wrapper must run the program in its own process
/// (as valgrind does), so that signals sent to the child reach the mirror.
pub fn wrapped_binary(env: &[(&str, &str)]) -> Command {
    let wrapper = env
        .iter()
        .find(|(k, _)| *k == "MIRROR_WRAPPER")
        .map(|(_, v)| (*v).to_owned())
        .or_else(|| std::env::var("MIRROR_WRAPPER").ok())
        .filter(|w| !w.trim().is_empty());
    let Some(wrapper) = wrapper else {
        return binary();
    };
    let mut words = wrapper.split_whitespace();
    let mut cmd = Command::new(words.next().expect("a wrapper command"));
    cmd.args(words).arg(mirror_binary());
    cmd
}

impl Mirror {
    pub fn start(consumer: &Path, producer: &Path, whitelist: &str, extra: &[&str]) -> Mirror {
        let log = std::env::var("MIRROR_LOG").unwrap_or_else(|_| "info".into());
        Mirror::start_logged(consumer, producer, whitelist, extra, &log)
    }

    /// Like [`Mirror::start`] with `RUST_LOG` set to `rust_log`.
    pub fn start_logged(
        consumer: &Path,
        producer: &Path,
        whitelist: &str,
        extra: &[&str],
        rust_log: &str,
    ) -> Mirror {
        Mirror::start_with_env(
            consumer,
            producer,
            whitelist,
            extra,
            &[("RUST_LOG", rust_log)],
        )
    }

    /// Like [`Mirror::start`] with these environment variables set (`RUST_LOG` defaults to
    /// `info`).
    pub fn start_with_env(
        consumer: &Path,
        producer: &Path,
        whitelist: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Mirror {
        let dir = tempdir();
        let log = dir.path().join("stderr.log");
        let mut cmd = wrapped_binary(env);
        cmd.arg("--consumer.config")
            .arg(consumer)
            .arg("--producer.config")
            .arg(producer)
            .arg("--whitelist")
            .arg(whitelist)
            .args(extra)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = cmd.spawn().expect("starting mirror-maker");
        Mirror {
            child,
            log,
            _dir: dir,
            _configs: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit, at most `timeout`; panics with its log if it does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for mirror-maker") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "mirror-maker did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit status (bounded).
    pub fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait(Duration::from_secs(30))
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The group's committed offsets for partitions `0..partitions` of `topic` (-1: none).
pub fn committed(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    committed_by(GROUP, bootstrap, topic, partitions)
}

/// The offsets `group` committed for partitions `0..partitions` of `topic` (-1: none).
pub fn committed_by(group: &str, bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    match consumer.committed_offsets(tpl, Duration::from_secs(10)) {
        Ok(c) => c
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            })
            .collect(),
        Err(_) => vec![-1; partitions as usize],
    }
}

pub fn committed_total(bootstrap: &str, topic: &str, partitions: i32) -> i64 {
    committed(bootstrap, topic, partitions)
        .iter()
        .map(|o| o.max(&0))
        .sum()
}

/// Polls `cond` every 100 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the group has committed `expected` offsets in all, or the mirror dies.
pub fn wait_committed(
    mirror: &mut Mirror,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = committed_total(bootstrap, topic, partitions);
        if got >= expected {
            return;
        }
        if !mirror.is_running() {
            panic!(
                "mirror exited early (committed {got} of {expected}); log:\n{}",
                mirror.log()
            );
        }
        if Instant::now() > deadline {
            panic!(
                "committed {got} of {expected} after 90 s; log:\n{}",
                mirror.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Creates topics with the admin API (tansu; the mock cluster has no CreateTopics).
pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    create_topic_with(bootstrap, topic, partitions, &[]);
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .expect("an admin client")
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// Creates a topic with these topic configs.
pub fn create_topic_with(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new_topic = new_topic.set(k, v);
    }
    let results = block_on(admin(bootstrap).create_topics(
        &[new_topic],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
    ))
    .expect("CreateTopics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t} on {bootstrap}: {e}"));
    }
}

/// A topic's configs, as the cluster describes them (tansu marks every one as a default).
pub fn topic_configs(bootstrap: &str, topic: &str) -> Vec<(String, String)> {
    let results = block_on(admin(bootstrap).describe_configs(
        &[rdkafka::admin::ResourceSpecifier::Topic(topic)],
        &AdminOptions::new(),
    ))
    .expect("DescribeConfigs");
    let resource = results
        .into_iter()
        .next()
        .expect("one resource")
        .expect("described");
    let mut out: Vec<(String, String)> = resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect();
    out.sort();
    out
}

/// A tansu broker (an independent Kafka implementation) on a free loopback port.
pub struct Tansu {
    child: Child,
    pub bootstrap: String,
}

pub fn tansu_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU_BIN") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo_bin = home.join(".cargo/bin/tansu");
    if cargo_bin.exists() {
        return cargo_bin;
    }
    panic!(
        "the tansu broker is not installed: run ./scripts/test, which installs it \
         (cargo install tansu --version 0.6.0 --locked --features dynostore), or set TANSU_BIN"
    );
}

impl Tansu {
    pub fn start(name: &str) -> Tansu {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(tansu_binary())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", &format!("memory://{name}/")])
            .args(["--cluster-id", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting tansu");
        let bootstrap = format!("127.0.0.1:{port}");
        let mut broker = Tansu { child, bootstrap };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&broker.bootstrap).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("tansu exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "tansu did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        broker
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's target directory (where `cargo build` puts the example plugins).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds a plugin crate of the workspace and returns its shared library.
pub fn build_plugin(package: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", package])
        .current_dir(workspace_root())
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building plugin {package} failed");
    let lib = target_dir()
        .join("debug")
        .join(format!("lib{}.so", package.replace('-', "_")));
    assert!(lib.exists(), "{} missing after the build", lib.display());
    lib
}

/// Builds the C example handler with the system C compiler; `defines` are `-D` flags.
pub fn build_c_handler(name: &str, defines: &[&str]) -> PathBuf {
    let root = workspace_root();
    let root = root.as_path();
    let out_dir = target_dir().join("c-plugins");
    std::fs::create_dir_all(&out_dir).expect("creating target/c-plugins");
    let lib = out_dir.join(format!("lib{name}.so"));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(compiler)
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&lib)
        .arg(root.join("examples/c-handler/handler.c"))
        .status()
        .expect("running the C compiler (cc)");
    assert!(status.success(), "compiling the C handler failed");
    lib
}

/// Every record of `topic`/`partition` with all its fields (watermark-based: mock clusters).
pub fn records(
    bootstrap: &str,
    topic: &str,
    partition: i32,
) -> Vec<mirror_maker::tools::compare::OwnedRecord> {
    mirror_maker::tools::compare::read_records(bootstrap, topic, partition, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("reading {topic}/{partition} on {bootstrap}: {e}"))
}

/// The two clusters of a test and the topic between them: what every pair of clusters (mock or
/// Kafka) offers, whichever brokers serve it.
pub struct Endpoints {
    pub src: String,
    pub dst: String,
    pub topic: &'static str,
    pub partitions: i32,
}

impl Endpoints {
    pub fn src(&self) -> String {
        self.src.clone()
    }

    pub fn dst(&self) -> String {
        self.dst.clone()
    }

    /// Writes sample records `range` (see `mirror_maker::tools::demo::sample`) into the source topic.
    pub fn write(&self, range: std::ops::Range<u64>) {
        write_samples(&self.src, self.topic, range, self.partitions, 100).expect("writing samples");
    }

    /// Starts writing sample records from index `from` in the background, `batch` at a time.
    pub fn trickle(&self, from: u64, batch: u64) -> Trickle {
        Trickle::start(
            &self.src,
            self.topic,
            self.partitions,
            from,
            batch,
            Duration::from_millis(20),
        )
    }

    pub fn compare(&self) -> Comparison {
        compare_topic(&self.src, &self.dst, self.topic, self.partitions).expect("comparing")
    }

    pub fn committed(&self) -> Vec<i64> {
        committed(&self.src, self.topic, self.partitions)
    }

    pub fn source_records(&self, partition: i32) -> Vec<mirror_maker::tools::compare::OwnedRecord> {
        records(&self.src, self.topic, partition)
    }

    pub fn target_records(
        &self,
        topic: &str,
        partition: i32,
    ) -> Vec<mirror_maker::tools::compare::OwnedRecord> {
        records(&self.dst, topic, partition)
    }

    /// Starts a mirror of the source topic with these client settings (added to the test
    /// defaults: [`mirror_configs`]) and flags.
    pub fn start(
        &self,
        consumer_extra: &[(&str, &str)],
        producer_extra: &[(&str, &str)],
        args: &[&str],
    ) -> Mirror {
        let log = std::env::var("MIRROR_LOG").unwrap_or_else(|_| "info".into());
        self.start_logged(consumer_extra, producer_extra, args, &log)
    }

    /// Like [`Endpoints::start`] with `RUST_LOG` set to `rust_log`.
    pub fn start_logged(
        &self,
        consumer_extra: &[(&str, &str)],
        producer_extra: &[(&str, &str)],
        args: &[&str],
        rust_log: &str,
    ) -> Mirror {
        self.start_with_env(
            consumer_extra,
            producer_extra,
            args,
            &[("RUST_LOG", rust_log)],
        )
    }

    /// Like [`Endpoints::start`] with these environment variables set (`RUST_LOG` defaults to
    /// `info`).
    pub fn start_with_env(
        &self,
        consumer_extra: &[(&str, &str)],
        producer_extra: &[(&str, &str)],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Mirror {
        let dir = tempdir();
        let (c, p) = mirror_configs(
            dir.path(),
            &self.src,
            &self.dst,
            consumer_extra,
            producer_extra,
        );
        let mut mirror = Mirror::start_with_env(&c, &p, self.topic, args, env);
        mirror._configs = Some(dir);
        mirror
    }

    /// Starts a mirror with exactly these client configs (no test defaults added; `group.id`
    /// is [`GROUP`] unless given).
    pub fn start_exact(
        &self,
        consumer: &[(&str, &str)],
        producer: &[(&str, &str)],
        args: &[&str],
    ) -> Mirror {
        let dir = tempdir();
        let mut consumer = consumer.to_vec();
        if !consumer.iter().any(|(k, _)| *k == "group.id") {
            consumer.push(("group.id", GROUP));
        }
        let c = write_config(dir.path(), "consumer.toml", &self.src, &consumer);
        let p = write_config(dir.path(), "producer.toml", &self.dst, producer);
        let mut mirror = Mirror::start(&c, &p, self.topic, args);
        mirror._configs = Some(dir);
        mirror
    }

    /// Runs `mirror-maker verify` over the source topic with the test's client configs and
    /// `args` (e.g. `--exactly.once`, `--json`); returns its exit code, stdout and stderr.
    pub fn verify(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let dir = tempdir();
        let (c, p) = mirror_configs(dir.path(), &self.src, &self.dst, &[], &[]);
        let out = binary()
            .arg("verify")
            .arg("--consumer.config")
            .arg(&c)
            .arg("--producer.config")
            .arg(&p)
            .args(["--whitelist", self.topic, "--timeout.ms", "20000"])
            .args(args)
            .output()
            .expect("running mirror-maker verify");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs a mirror with `args` until `expected` source offsets are committed, stops it
    /// cleanly, and returns its log.
    pub fn mirror_until_committed(&self, args: &[&str], expected: i64) -> String {
        let mut all = vec!["--offset.commit.interval.ms", "300"];
        all.extend_from_slice(args);
        let mut mirror = self.start(&[], &[], &all);
        wait_committed(
            &mut mirror,
            &self.src,
            self.topic,
            self.partitions,
            expected,
        );
        assert_eq!(mirror.stop().code(), Some(0), "log:\n{}", mirror.log());
        mirror.log()
    }
}

/// A source and a target mock cluster (librdkafka's, in this process), each with `topic` in
/// `partitions` partitions.
pub struct MockPair {
    pub source: rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    pub target: rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    endpoints: Endpoints,
}

impl std::ops::Deref for MockPair {
    type Target = Endpoints;

    fn deref(&self) -> &Endpoints {
        &self.endpoints
    }
}

impl std::ops::DerefMut for MockPair {
    fn deref_mut(&mut self) -> &mut Endpoints {
        &mut self.endpoints
    }
}

impl MockPair {
    pub fn new(topic: &'static str, partitions: i32) -> MockPair {
        let source = rdkafka::mocking::MockCluster::new(1).expect("a mock source cluster");
        let target = rdkafka::mocking::MockCluster::new(1).expect("a mock target cluster");
        source
            .create_topic(topic, partitions, 1)
            .expect("creating the source topic");
        target
            .create_topic(topic, partitions, 1)
            .expect("creating the target topic");
        let endpoints = Endpoints {
            src: source.bootstrap_servers(),
            dst: target.bootstrap_servers(),
            topic,
            partitions,
        };
        MockPair {
            source,
            target,
            endpoints,
        }
    }

    /// Also creates `topics` on the target, with as many partitions.
    pub fn with_target_topics(self, topics: &[&str]) -> MockPair {
        for t in topics {
            self.target
                .create_topic(t, self.partitions, 1)
                .expect("creating a target topic");
        }
        self
    }
}

/// Writes sample records to a source topic from a background thread, a small batch at a time,
/// so that records are in flight while a test changes the group. `stop` returns how many were
/// written in all.
pub struct Trickle {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Trickle {
    /// Starts writing at index `from`, `batch` records every `every`.
    pub fn start(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        from: u64,
        batch: u64,
        every: Duration,
    ) -> Trickle {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
        let thread = std::thread::spawn(move || {
            let mut next = from;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                write_samples(&bootstrap, &topic, next..next + batch, partitions, 40)
                    .expect("writing a batch of source records");
                next += batch;
                std::thread::sleep(every);
            }
            next
        });
        Trickle {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the writer and returns the index after the last record written.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .expect("stopped once")
            .join()
            .expect("the writer thread")
    }
}

/// A loopback address with a port that was free a moment ago.
pub fn free_local_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").to_string()
}

/// `GET path` over HTTP/1.0: the status code and the body (status 0 if nothing answers).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample `name{labels}` in a Prometheus text exposition, if present.
/// `labels` is the exact label text, e.g. `topic="orders",partition="0"`, or empty.
pub fn metric(exposition: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// The offset mapping the mirror stored in the target cluster (its default topic).
pub fn stored_mapping(target_bootstrap: &str) -> mirror_maker::mirror::mapping::OffsetMap {
    use mirror_maker::settings::client::{ClientProps, Role};
    let props = ClientProps::from_pairs(
        Role::Producer,
        "producer.toml",
        [("bootstrap.servers", target_bootstrap)],
    );
    let topic = mirror_maker::settings::defaults::offset_mapping_topic(None);
    mirror_maker::mirror::store::load(&props, &topic, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("reading the offset mapping on {target_bootstrap}: {e}"))
}

/// For each record of the target partition, in target order: its target offset and the source
/// offset of the source record it copies (found by content; source records must be distinct,
/// as the sample records are).
pub fn copied_from(
    source_bootstrap: &str,
    target_bootstrap: &str,
    topic: &str,
    partition: i32,
) -> Vec<(i64, i64)> {
    use mirror_maker::tools::compare::{fingerprint, read_partition_as};
    use rdkafka::Message;
    let read = |bootstrap: &str| {
        read_partition_as(bootstrap, topic, partition, Duration::from_secs(60), |m| {
            (m.offset(), fingerprint(m))
        })
        .unwrap_or_else(|e| panic!("reading {topic}/{partition} on {bootstrap}: {e}"))
    };
    let source: std::collections::HashMap<u64, i64> = read(source_bootstrap)
        .into_iter()
        .map(|(offset, fp)| (fp, offset))
        .collect();
    read(target_bootstrap)
        .into_iter()
        .map(|(t, fp)| {
            let s = *source
                .get(&fp)
                .unwrap_or_else(|| panic!("target record {topic}/{partition}@{t} has no source"));
            (t, s)
        })
        .collect()
}

/// The latest target offset a group that read every source record below `offset` can resume
/// at without losing one: from there on, the target holds a copy of every source record at or
/// after `offset` that it holds at all.
pub fn latest_lossless_resume(copied: &[(i64, i64)], offset: i64) -> i64 {
    let needed: std::collections::HashSet<i64> = copied
        .iter()
        .map(|&(_, s)| s)
        .filter(|&s| s >= offset)
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut resume = copied.last().map_or(0, |&(t, _)| t + 1);
    for &(t, s) in copied.iter().rev() {
        if seen.len() == needed.len() {
            break;
        }
        if s >= offset {
            seen.insert(s);
        }
        resume = t;
    }
    resume
}

/// Deletes the records of `topic` below `offsets[p]` in each partition p (DeleteRecords): the
/// source's log start moves there, as retention would move it.
pub fn delete_records(bootstrap: &str, topic: &str, offsets: &[i64]) {
    let mut tpl = TopicPartitionList::new();
    for (p, &o) in offsets.iter().enumerate() {
        tpl.add_partition_offset(topic, p as i32, Offset::Offset(o))
            .expect("a partition offset");
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let result = block_on(admin(bootstrap).delete_records(&tpl, &opts))
        .unwrap_or_else(|e| panic!("deleting records of {topic}: {e}"));
    for e in result.elements() {
        if let Err(err) = e.error() {
            panic!("deleting records of {topic}/{}: {err}", e.partition());
        }
    }
}
