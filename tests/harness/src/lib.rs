//! The end-to-end tests' shared harness: clusters (librdkafka's mock in the test process,
//! kfake brokers, Apache Kafka in [`kafka`]), config files, the mirror binary as a child
//! process, and what tests read back (committed offsets, records). A crate of its own, so
//! that each test file uses what it needs and nothing is compiled as dead code.

pub mod dropin;
pub mod failover;
pub mod faults;
pub mod kafka;
pub mod podman;

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

/// Client settings that make group changes quick on test clusters (see docs/testing.md).
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
    write_private(&path, text);
    path
}

/// Writes a file only its owner may read or write (mode 0600, whatever the umask), as a
/// config file must be: the mirror refuses a config file its group or others may write, and
/// warns about one holding a secret that they may read.
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    // An existing file keeps its mode through `open`: set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(contents.as_ref()))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
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

/// The copy engine a mirror under test runs (`--copy.mode`): a trial's body takes it, so
/// that one body proves its guarantee for both engines (a `..._with_batches` twin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMode {
    /// librdkafka's consumer and producer, record by record.
    Records,
    /// The batch engine: the source's record batches forwarded as they are.
    Batches,
}

impl CopyMode {
    /// The value of `--copy.mode`.
    pub fn flag(self) -> &'static str {
        match self {
            CopyMode::Records => "records",
            CopyMode::Batches => "batches",
        }
    }

    /// A name for the trial's topic, group or TRIAL line: `base`, or `base-batches`.
    pub fn named(self, base: &'static str) -> &'static str {
        match self {
            CopyMode::Records => base,
            CopyMode::Batches => Box::leak(format!("{base}-batches").into_boxed_str()),
        }
    }
}

/// Where a mirror under test gets its client configs.
#[derive(Clone)]
enum Configs<'a> {
    /// Written for these clusters: the test defaults ([`mirror_configs`]) and the test's settings.
    Defaults(&'a Endpoints),
    /// Written for these clusters with only the test's settings (`group.id` is the endpoints'
    /// group unless given).
    Exact(&'a Endpoints),
    /// These files, as they are.
    Files(PathBuf, PathBuf),
}

/// A mirror under test, described before it starts: [`Endpoints::mirror`] (config files
/// written for a pair of clusters) or [`Mirror::with_configs`] (config files the test wrote).
/// Flags are passed in the order the methods are called; [`MirrorBuilder::start`] may be
/// called again for another process with the same settings.
///
/// A mirror whose test chooses no engine (`--copy.mode`) runs the record engine, the engine
/// those trials were written for (their batch engine twins choose it), or the one
/// `MIRROR_TEST_COPY_MODE` names; only a test that asks for
/// [`MirrorBuilder::default_copy_mode`] gets the binary's default (`auto`).
#[derive(Clone)]
#[must_use = "a mirror starts only with .start()"]
pub struct MirrorBuilder<'a> {
    configs: Configs<'a>,
    consumer: Vec<(String, String)>,
    producer: Vec<(String, String)>,
    whitelist: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Run without `--copy.mode` unless the test gives one ([`MirrorBuilder::default_copy_mode`]).
    default_copy_mode: bool,
}

fn owned_pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn borrowed_pairs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

impl<'a> MirrorBuilder<'a> {
    fn new(configs: Configs<'a>) -> Self {
        MirrorBuilder {
            configs,
            consumer: Vec::new(),
            producer: Vec::new(),
            whitelist: None,
            args: Vec::new(),
            env: Vec::new(),
            default_copy_mode: false,
        }
    }

    /// Consumer settings, added to the test defaults (they override a default of the same
    /// key).
    pub fn consumer(mut self, settings: &[(&str, &str)]) -> Self {
        self.consumer.extend(owned_pairs(settings));
        self
    }

    /// Producer settings.
    pub fn producer(mut self, settings: &[(&str, &str)]) -> Self {
        self.producer.extend(owned_pairs(settings));
        self
    }

    /// Exactly the given client settings, without the test defaults of [`mirror_configs`]
    /// (`group.id` is the endpoints' group unless given).
    pub fn exact_configs(mut self) -> Self {
        if let Configs::Defaults(endpoints) = self.configs {
            self.configs = Configs::Exact(endpoints);
        }
        self
    }

    /// `--whitelist` (default with [`Endpoints::mirror`]: the pair's topic).
    pub fn whitelist(mut self, whitelist: &str) -> Self {
        self.whitelist = Some(whitelist.to_owned());
        self
    }

    /// More command-line arguments, as given.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// One flag and its value.
    pub fn flag(mut self, name: &str, value: &str) -> Self {
        self.args.push(name.to_owned());
        self.args.push(value.to_owned());
        self
    }

    /// `--copy.mode` (given explicitly, so that a trial of the record engine stays one if
    /// the default changes).
    pub fn copy_mode(self, mode: CopyMode) -> Self {
        self.flag("--copy.mode", mode.flag())
    }

    /// No `--copy.mode`: the binary's default engine choice (`auto`), for the trials of that
    /// choice; other mirrors without one run `--copy.mode records`.
    pub fn default_copy_mode(mut self) -> Self {
        self.default_copy_mode = true;
        self
    }

    /// `--num.streams`.
    pub fn streams(self, streams: u32) -> Self {
        self.flag("--num.streams", &streams.to_string())
    }

    /// `--offset.commit.interval.ms`.
    pub fn commit_ms(self, ms: u64) -> Self {
        self.flag("--offset.commit.interval.ms", &ms.to_string())
    }

    /// `--metrics.addr`.
    pub fn metrics_addr(self, addr: &str) -> Self {
        self.flag("--metrics.addr", addr)
    }

    /// `--startup.timeout.ms`.
    pub fn startup_ms(self, ms: u64) -> Self {
        self.flag("--startup.timeout.ms", &ms.to_string())
    }

    /// `--shutdown.timeout.ms`.
    pub fn shutdown_ms(self, ms: u64) -> Self {
        self.flag("--shutdown.timeout.ms", &ms.to_string())
    }

    /// `--create.topics true`.
    pub fn create_topics(self) -> Self {
        self.flag("--create.topics", "true")
    }

    /// `--target.topic`.
    pub fn target_topic(self, pattern: &str) -> Self {
        self.flag("--target.topic", pattern)
    }

    /// `--topic.refresh.interval.ms`.
    pub fn topic_refresh_ms(self, ms: u64) -> Self {
        self.flag("--topic.refresh.interval.ms", &ms.to_string())
    }

    /// `--message.handler lib --message.handler.args args`.
    pub fn handler(self, lib: &Path, args: &str) -> Self {
        let lib = lib.to_str().expect("a UTF-8 plugin path");
        self.flag("--message.handler", lib)
            .flag("--message.handler.args", args)
    }

    /// `--exactly.once true --instance.id instance`.
    pub fn exactly_once(self, instance: &str) -> Self {
        self.flag("--exactly.once", "true")
            .flag("--instance.id", instance)
    }

    /// Environment variables of the process (`MIRROR_WRAPPER` among them runs it through a
    /// wrapper: [`wrapped_binary`]).
    pub fn env(mut self, vars: &[(&str, &str)]) -> Self {
        self.env.extend(owned_pairs(vars));
        self
    }

    /// `RUST_LOG` (default: `$MIRROR_LOG`, else `info`).
    pub fn log(self, rust_log: &str) -> Self {
        self.env(&[("RUST_LOG", rust_log)])
    }

    /// Writes the config files (unless given) and starts the process.
    pub fn start(&self) -> Mirror {
        let mut consumer = borrowed_pairs(&self.consumer);
        let producer = borrowed_pairs(&self.producer);
        if let Configs::Defaults(e) | Configs::Exact(e) = &self.configs {
            if !consumer.iter().any(|(k, _)| *k == "group.id") {
                consumer.insert(0, ("group.id", e.group));
            }
        }
        let (dir, c, p, topic) = match &self.configs {
            Configs::Files(c, p) => {
                assert!(
                    consumer.is_empty() && producer.is_empty(),
                    "client settings go into the config files a test writes itself"
                );
                (None, c.clone(), p.clone(), None)
            }
            Configs::Defaults(e) => {
                let dir = tempdir();
                let (c, p) = mirror_configs(dir.path(), &e.src, &e.dst, &consumer, &producer);
                (Some(dir), c, p, Some(e.topic))
            }
            Configs::Exact(e) => {
                let dir = tempdir();
                let c = write_config(dir.path(), "consumer.toml", &e.src, &consumer);
                let p = write_config(dir.path(), "producer.toml", &e.dst, &producer);
                (Some(dir), c, p, Some(e.topic))
            }
        };
        let whitelist = self
            .whitelist
            .as_deref()
            .or(topic)
            .expect("Mirror::with_configs(..) needs .whitelist(..)");
        let env = borrowed_pairs(&self.env);
        let mut args = self.args.clone();
        if !self.default_copy_mode && !args.iter().any(|a| a == "--copy.mode") {
            // MIRROR_TEST_COPY_MODE runs these trials with another engine choice, e.g. `auto`
            // to try the binary's default on them; `records` unless set.
            let mode = std::env::var("MIRROR_TEST_COPY_MODE")
                .ok()
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| CopyMode::Records.flag().to_owned());
            args.extend(["--copy.mode".to_owned(), mode]);
        }
        let mut mirror = Mirror::spawn(&c, &p, whitelist, &args, &env);
        mirror._configs = dir;
        mirror
    }
}

impl Mirror {
    /// A mirror with these config files (written by the test): see [`MirrorBuilder`]; its
    /// `--whitelist` must be given.
    pub fn with_configs(consumer: &Path, producer: &Path) -> MirrorBuilder<'static> {
        MirrorBuilder::new(Configs::Files(consumer.to_owned(), producer.to_owned()))
    }

    fn spawn(
        consumer: &Path,
        producer: &Path,
        whitelist: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Mirror {
        let dir = tempdir();
        let log = dir.path().join("stderr.log");
        let rust_log = std::env::var("MIRROR_LOG").unwrap_or_else(|_| "info".into());
        let mut cmd = wrapped_binary(env);
        cmd.arg("--consumer.config")
            .arg(consumer)
            .arg("--producer.config")
            .arg(producer)
            .arg("--whitelist")
            .arg(whitelist)
            .args(args)
            .env("RUST_LOG", rust_log)
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

    /// Waits up to 60 s until `cond` holds; fails with the log if the mirror exits first or
    /// the time passes.
    pub fn wait_for(&mut self, what: &str, mut cond: impl FnMut(&Mirror) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond(self) {
            assert!(
                self.is_running(),
                "the mirror exited while waiting for {what}; log:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "timed out after 60 s waiting for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits up to 60 s for `needle` in the log (see [`Mirror::wait_for`]).
    pub fn wait_for_log(&mut self, needle: &str, what: &str) {
        self.wait_for(&format!("{what} ({needle:?} in the log)"), |m| {
            m.log().contains(needle)
        });
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

/// A small deterministic generator (xorshift), so kill moments are "random" but repeatable.
pub struct Rng(pub u64);

impl Rng {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
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
    wait_committed_by(GROUP, mirror, bootstrap, topic, partitions, expected);
}

/// Waits until `group` has committed `expected` offsets in all, or the mirror dies.
pub fn wait_committed_by(
    group: &str,
    mirror: &mut Mirror,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got: i64 = committed_by(group, bootstrap, topic, partitions)
            .iter()
            .map(|o| o.max(&0))
            .sum();
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

/// Creates topics with the admin API (kfake; the mock cluster has no CreateTopics).
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

/// Sets these configs of `topic` with IncrementalAlterConfigs (the topic's other configs stay
/// as they are), as an operator's `kafka-configs --alter --add-config` does.
pub fn set_topic_configs(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    let configs = configs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let answers = mirror_maker::native::admin::set_topic_configs(
        admin(bootstrap).inner(),
        &[(topic.to_owned(), configs)],
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("IncrementalAlterConfigs of {topic}: {e}"));
    for (t, error) in answers {
        assert!(error.is_none(), "setting configs of {t}: {error:?}");
    }
}

/// A kfake broker (franz-go's in-memory cluster, an independent Kafka implementation:
/// tests/peers/kfake) on a free loopback port.
pub struct Kfake {
    child: Child,
    pub bootstrap: String,
}

/// The kfake broker `./scripts/test` built (`KFAKE_BIN`).
pub fn kfake_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("KFAKE_BIN") {
        return PathBuf::from(p);
    }
    panic!(
        "the kfake broker is not built: run ./scripts/test, which builds it, or build it \
         (cd tests/peers/kfake && go build -o /tmp/kfake .) and set KFAKE_BIN=/tmp/kfake"
    );
}

impl Kfake {
    pub fn start(name: &str) -> Kfake {
        let port = free_port();
        let child = Command::new(kfake_binary())
            .args(["-port", &port.to_string(), "-cluster-id", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting kfake");
        let bootstrap = format!("127.0.0.1:{port}");
        let mut broker = Kfake { child, bootstrap };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&broker.bootstrap).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("kfake exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "kfake did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        broker
    }
}

impl Drop for Kfake {
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
    // Built aside and renamed into place: a test binary beside this one may be loading the
    // same library, and must never read it half written.
    let building = out_dir.join(format!("lib{name}.so.{}.tmp", std::process::id()));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(compiler)
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&building)
        .arg(root.join("examples/c-handler/handler.c"))
        .status()
        .expect("running the C compiler (cc)");
    assert!(status.success(), "compiling the C handler failed");
    std::fs::rename(&building, &lib)
        .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", building.display(), lib.display()));
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

/// The sample record `s` (see [`sample`]) for `topic`/`partition`, as a producer of the
/// test's own sends it: its key, value, headers (repeated and null ones kept) and timestamp.
pub fn sample_as_record<'a>(
    s: &'a mirror_maker::tools::demo::Sample,
    topic: &'a str,
    partition: i32,
) -> rdkafka::producer::BaseRecord<'a, [u8], [u8]> {
    use rdkafka::message::{Header, OwnedHeaders};
    let mut headers = OwnedHeaders::new();
    for (k, v) in &s.headers {
        headers = headers.insert(Header {
            key: k,
            value: v.as_deref(),
        });
    }
    let mut record = rdkafka::producer::BaseRecord::to(topic)
        .partition(partition)
        .timestamp(s.timestamp)
        .headers(headers);
    record.key = s.key.as_deref();
    record.payload = s.value.as_deref();
    record
}

/// One header as bytes: a name (Kafka does not require UTF-8) and a value (`None`: null).
pub type RawHeader = (Vec<u8>, Option<Vec<u8>>);

/// The producer context of [`write_with_raw_headers`]: delivery reports carry an integer.
struct RawProducerContext;

impl rdkafka::ClientContext for RawProducerContext {}

impl rdkafka::producer::ProducerContext for RawProducerContext {
    type DeliveryOpaque = usize;
    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, _: usize) {
        if let Err((e, _)) = result {
            panic!("writing a record with raw headers: {e}");
        }
    }
}

/// Writes `count` records (key `k{i}`, value `v{i}`) to `topic`/`partition`, each with
/// `headers`, through the mirror's own native producer call: rust-rdkafka's `OwnedHeaders`
/// takes names as `&str` only, so it cannot write a name that is not UTF-8.
pub fn write_with_raw_headers(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    count: usize,
    headers: &[RawHeader],
) {
    use mirror_maker::native::produce::{produce, Outgoing, RawHeaders};
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer<RawProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create_with_context(RawProducerContext)
        .expect("a producer");
    let name = std::ffi::CString::new(topic).expect("a topic name without NUL");
    for i in 0..count {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        let mut raw = RawHeaders::none();
        for (k, v) in headers {
            raw.add(k, v.as_deref());
        }
        let mut out = Outgoing {
            partition: Some(partition),
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
            timestamp: None,
            headers: raw,
            opaque: i,
        };
        produce(&producer, &name, &mut out).expect("queueing a record with raw headers");
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(10))
        .expect("flushing the records with raw headers");
}

/// `count` records of `size` zero bytes each (keys `k0`, `k1`, ...) to `topic`/`partition`
/// in one batch compressed with `codec` (librdkafka's `compression.type` names): a batch a
/// few KB on the wire that holds `count * size` bytes uncompressed. librdkafka takes at most
/// 1,000,000,000 bytes of records in one batch.
pub fn write_zeros_in_one_batch(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    count: usize,
    size: usize,
    codec: &str,
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("message.max.bytes", "1000000000")
        .set("batch.size", "1000000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("linger.ms", "2000")
        .create()
        .expect("a producer");
    let zeros = vec![0u8; size];
    for i in 0..count {
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(&key)
                    .payload(&zeros),
            )
            .map_err(|(e, _)| e)
            .expect("queueing a record of zeros");
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("flushing the records of zeros");
}

/// The headers (names as bytes) of the first `count` records of `topic`/`partition`, read
/// with the mirror's native record view (rust-rdkafka's `Headers` panics on a name that is
/// not UTF-8).
pub fn raw_headers(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    count: usize,
) -> Vec<Vec<RawHeader>> {
    use mirror_maker::native::queue::{Polled, Source};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirror-test-raw-header-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .expect("a partition list");
    consumer.assign(&tpl).expect("assigning the partition");
    let source = Source::new(consumer).expect("a consumer queue");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "{topic}/{partition} on {bootstrap}: {} of {count} records within 30 s",
            out.len()
        );
        if let Polled::Record(r) = source.poll(Duration::from_millis(200)) {
            out.push(
                r.headers()
                    .map(|h| (h.key.to_vec(), h.value.map(<[u8]>::to_vec)))
                    .collect(),
            );
        }
    }
    out
}

/// The two clusters of a test and the topic between them: what every pair of clusters (mock or
/// Kafka) offers, whichever brokers serve it.
pub struct Endpoints {
    pub src: String,
    pub dst: String,
    pub topic: &'static str,
    pub partitions: i32,
    /// The mirror's consumer group: [`GROUP`], or a group of its own where trials share
    /// clusters (`kafka::SharedPair::lane`).
    pub group: &'static str,
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

    /// Writes `count` records to each partition of the source topic, each stamped
    /// `timestamp_ms` (CreateTime, set by the producer): records as old as a test needs.
    pub fn write_stamped(&self, count: u64, timestamp_ms: i64) {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.src)
            .set("linger.ms", "5")
            .set("log_level", "3")
            .create()
            .expect("a producer");
        for i in 0..count {
            for partition in 0..self.partitions {
                let value = format!("{}/{partition}/{i}", self.topic);
                let record: BaseRecord<'_, str, str> = BaseRecord::to(self.topic)
                    .partition(partition)
                    .timestamp(timestamp_ms)
                    .payload(&value);
                mirror_maker::mirror::flush::send_waiting(&producer, record, None)
                    .unwrap_or_else(|e| panic!("producing to {}/{partition}: {e}", self.topic));
                producer.poll(Duration::ZERO);
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("flushing the records to {}: {e}", self.topic));
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
        committed_by(self.group, &self.src, self.topic, self.partitions)
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

    /// Waits (up to 90 s) until each partition `p` of the target topic holds `old[p]` first
    /// and ends with `new[p]`, in order: a source topic created again (`new`, its records
    /// from offset 0) copied from its beginning after the old topic (`old`). Records between
    /// them are new-topic records copied twice (from the old position on, before the new
    /// topic was noticed); returns how many.
    pub fn wait_copied_after(
        &self,
        mirror: &Mirror,
        old: &[Vec<mirror_maker::tools::compare::OwnedRecord>],
        new: &[Vec<mirror_maker::tools::compare::OwnedRecord>],
    ) -> usize {
        let copied_after = |p: usize| {
            let t = self.target_records(self.topic, p as i32);
            (t.len() >= old[p].len() + new[p].len()
                && t[..old[p].len()] == old[p][..]
                && t[t.len() - new[p].len()..] == new[p][..])
                .then(|| t.len() - old[p].len() - new[p].len())
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let each: Option<Vec<usize>> = (0..old.len()).map(copied_after).collect();
            if let Some(each) = each {
                return each.iter().sum();
            }
            assert!(
                Instant::now() < deadline,
                "timed out after 90 s waiting for the new topic copied from offset 0 after the \
                 old one; log:\n{}",
                mirror.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A mirror of the source topic, its config files written with the test defaults
    /// ([`mirror_configs`]): see [`MirrorBuilder`].
    pub fn mirror(&self) -> MirrorBuilder<'_> {
        MirrorBuilder::new(Configs::Defaults(self))
    }

    /// Runs `mirror-maker check` with the test's client configs ([`mirror_configs`]) and
    /// `flags`, of the source topic unless `flags` name a `--whitelist`; returns its stdout and
    /// stderr together.
    pub fn check(&self, flags: &[&str]) -> String {
        let dir = tempdir();
        let (c, p) = mirror_configs(dir.path(), &self.src, &self.dst, &[], &[]);
        let whitelist: &[&str] = if flags.contains(&"--whitelist") {
            &[]
        } else {
            &["--whitelist", self.topic]
        };
        let out = binary()
            .arg("check")
            .arg("--consumer.config")
            .arg(&c)
            .arg("--producer.config")
            .arg(&p)
            .args(whitelist)
            .args(flags)
            .output()
            .expect("running check");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
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
        let mut mirror = self.mirror().commit_ms(300).args(args).start();
        wait_committed_by(
            self.group,
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
            group: GROUP,
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
    format!("127.0.0.1:{}", free_port())
}

/// A loopback port that was free a moment ago, for a listener that a process the test starts
/// binds later (a Kafka node, kfake, the mirror's metrics). It is taken below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`): a port that `bind(0)` gives is one that
/// an outgoing connection may get as its source port before the listener binds it, and a
/// Kafka node of a CI run failed to start so ("Address already in use").
///
/// Test binaries run side by side (`./scripts/test`), and a port one hands out stays free
/// until its node binds it, seconds later: another binary must not hand out the same one
/// meanwhile. So the range is cut into blocks of [`PORT_BLOCK`] ports, and a test process
/// claims a block for itself by locking its file in `$TMPDIR/mirror-test-ports/` (the kernel
/// lets the lock go when the process ends, however it ends); it hands each port of its blocks
/// out once, and claims another block when one runs out.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    struct Blocks {
        held: Vec<std::fs::File>,
        next: u32,
        end: u32,
    }
    static BLOCKS: Mutex<Blocks> = Mutex::new(Blocks {
        held: Vec::new(),
        next: 0,
        end: 0,
    });
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(1024).clamp(PORT_BLOCK, 10_000);
    let first = low - span;
    let count = span / PORT_BLOCK;
    let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        while blocks.next < blocks.end {
            let port = blocks.next as u16;
            blocks.next += 1;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
        let block = claim_port_block(count, blocks.held.len() as u32);
        blocks.next = first + block.0 * PORT_BLOCK;
        blocks.end = blocks.next + PORT_BLOCK;
        blocks.held.push(block.1);
    }
}

/// How many ports a test process claims at a time ([`free_port`]).
pub const PORT_BLOCK: u32 = 200;

/// Claims one of `count` port blocks no other live process holds: its number and its locked
/// file. Starts from a place that differs between processes (and moves on by `taken`).
fn claim_port_block(count: u32, taken: u32) -> (u32, std::fs::File) {
    let dir = std::env::temp_dir().join("mirror-test-ports");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
    for k in 0..count {
        let block = start.wrapping_add(k).wrapping_add(taken) % count;
        let path = dir.join(format!("block-{block}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        if file.try_lock().is_ok() {
            return (block, file);
        }
    }
    panic!(
        "all {count} blocks of {PORT_BLOCK} loopback ports are held by other test processes \
         (locks in {})",
        dir.display()
    );
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

/// Sends `request` (raw bytes: request line, headers, blank line) to `addr` and reads the
/// response until the server closes it, connecting and reading within `limit` each: the
/// status code and the body (status 0 if nothing answered in time).
pub fn http_exchange(addr: &str, request: &str, limit: Duration) -> (u16, String) {
    use std::io::Write;
    let Some(Ok(mut stream)) = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| TcpStream::connect_timeout(&a, limit))
    else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(limit));
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
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

/// A field of `/proc/PID/status` in KiB, e.g. `VmRSS` (resident now) or `VmHWM` (the peak).
pub fn process_memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status:\n{status}"))
}

/// Sets the process's peak resident size (`VmHWM`) back to its current one, so that a later
/// `VmHWM` tells the peak since now; false where the kernel refuses it.
pub fn reset_peak_memory(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The mirror's `/metrics` at `addr` (a failing request fails the test).
pub fn scrape(addr: &str) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The largest replication delay the mirror at `addr` serves, in seconds (NaN if none).
pub fn max_delay(addr: &str) -> f64 {
    metric(&scrape(addr), "mirror_replication_delay_max_seconds", "").unwrap_or(f64::NAN)
}

/// A copy of `bytes` under `--throttle.bytes.per.second` `rate` took `took` seconds: asserts
/// it took at least as long as the limit allows (the bytes beyond the one-second burst, at
/// the rate; 5% allowed for the clocks) and that the throttle's limit is served on `/metrics`
/// (`m`). A lower bound only: a slow machine makes the copy slower, never faster. Returns
/// that least time.
pub fn assert_kept_to_byte_rate(m: &str, bytes: f64, rate: u64, took: f64) -> f64 {
    let least = (bytes - rate as f64) / rate as f64;
    assert!(
        took >= least * 0.95,
        "{bytes} bytes in {took:.1} s at {rate} bytes/s"
    );
    assert_eq!(
        metric(m, "mirror_throttle_bytes_per_second", ""),
        Some(rate as f64),
        "{m}"
    );
    least
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
    let trust = mirror_maker::mirror::mapping::Trust::default();
    mirror_maker::mirror::mapping::store::load(&props, &topic, trust, Duration::from_secs(60))
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

/// Runs an expensive scenario (clusters, a long load) once per test process and returns its
/// outcome, for several tests that each assert one guarantee on it. A scenario that panics
/// fails every test that asks for it, with its message, and is not run again.
pub fn scenario_once<T: Send + Sync>(
    cell: &'static std::sync::OnceLock<Result<T, String>>,
    scenario: impl FnOnce() -> T,
) -> &'static T {
    let outcome = cell.get_or_init(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(scenario)).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned())
        })
    });
    match outcome {
        Ok(outcome) => outcome,
        Err(message) => panic!("the shared scenario failed: {message}"),
    }
}
