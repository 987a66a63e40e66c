//! The soak (not part of the suite; `scripts/soak` runs it): steady writes to the source while,
//! one after another at random, the mirror is SIGKILLed and restarted or bounced with SIGTERM,
//! a broker of either cluster restarted, either link blackholed, its connections reset again
//! and again, or the target link slowed with latency, jitter and loss; then every fault
//! healed, the mirror caught up and stopped, and `mirror-maker verify` compares the topics
//! record by record. It fails on any record lost, changed, out of order or misplaced, on a
//! duplicate with `--exactly.once`, on a mirror that exits when nobody stopped it, and on a
//! SIGTERM that does not end in exit 0.
//!
//! Settings from the environment: `SOAK_MINUTES` (default 60), `SOAK_EXACTLY_ONCE=1`,
//! `SOAK_COPY_MODE` (`records`, the default, or `batches`), `SOAK_SEED` (default: from the clock; printed, so a run can be repeated in its order of
//! events; the timing of each still varies).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirror_test_harness::faults::{FaultProxy, FaultyPair};
use mirror_test_harness::kafka::*;
use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 4;

/// A deterministic source of choices (xorshift).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn secs(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_secs(from + self.below(to - from + 1))
    }
}

/// Writes sample records to the source from a thread, 100 every 50 ms, except while held
/// (while the source's broker restarts: the writer's own client would fail).
struct Writer {
    hold: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(bootstrap: String) -> Writer {
        let hold = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (h, i, s, w) = (hold.clone(), idle.clone(), stop.clone(), written.clone());
        let thread = std::thread::spawn(move || {
            let mut next = 0;
            while !s.load(Ordering::SeqCst) {
                if h.load(Ordering::SeqCst) {
                    i.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                i.store(false, Ordering::SeqCst);
                write_samples(&bootstrap, TOPIC, next..next + 100, PARTITIONS, 100)
                    .expect("writing source records");
                next += 100;
                w.store(next, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Writer {
            hold,
            idle,
            stop,
            written,
            thread: Some(thread),
        }
    }

    /// Holds the writer and waits until its last batch is written.
    fn hold(&self) {
        self.idle.store(false, Ordering::SeqCst);
        self.hold.store(true, Ordering::SeqCst);
        wait_until(Duration::from_secs(120), "the writer to pause", || {
            self.idle.load(Ordering::SeqCst)
        });
    }

    fn resume(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("once")
            .join()
            .expect("the writer");
        self.written.load(Ordering::SeqCst)
    }
}

/// The mirror under soak, restarted whenever the soak stopped it; what went wrong with it.
struct Soaked {
    builder: MirrorBuilder<'static>,
    mirror: Mirror,
    /// Exits nobody asked for, and SIGTERMs that did not end in exit 0 or in time, each with
    /// the tail of its log.
    failures: Vec<String>,
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Soaked {
    /// Notes and replaces a mirror that exited by itself.
    fn check(&mut self, during: &str) {
        if !self.mirror.is_running() {
            let status = self.mirror.wait(Duration::from_secs(1));
            self.failures.push(format!(
                "the mirror exited by itself ({status}) during {during}; log:\n{}",
                tail(&self.mirror.log(), 40)
            ));
            self.mirror = self.builder.start();
        }
    }

    /// Waits `span`, checking the mirror every 200 ms.
    fn hold_for(&mut self, span: Duration, during: &str) {
        let until = Instant::now() + span;
        while Instant::now() < until {
            self.check(during);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn kill(&mut self) {
        self.check("the run before a SIGKILL");
        self.mirror.signal("KILL");
        let _ = self.mirror.wait(Duration::from_secs(10));
        self.mirror = self.builder.start();
    }

    /// SIGTERM; exit 0 within 60 s expected.
    fn stop(&mut self, why: &str) {
        self.check(why);
        self.mirror.signal("TERM");
        let until = Instant::now() + Duration::from_secs(60);
        while self.mirror.is_running() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.mirror.is_running() {
            self.failures.push(format!(
                "SIGTERM ({why}) did not stop the mirror within 60 s; log:\n{}",
                tail(&self.mirror.log(), 40)
            ));
            self.mirror.signal("KILL");
        }
        let status = self.mirror.wait(Duration::from_secs(10));
        if status.code() != Some(0) {
            self.failures.push(format!(
                "SIGTERM ({why}) ended in {status}; log:\n{}",
                tail(&self.mirror.log(), 40)
            ));
        }
    }

    fn bounce(&mut self) {
        self.stop("a bounce");
        self.mirror = self.builder.start();
    }
}

/// Resets every connection of `links` every 2 s for `span`.
fn reset_storm(soaked: &mut Soaked, links: &[&FaultProxy], span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        for l in links {
            l.reset_all();
        }
        soaked.hold_for(Duration::from_secs(2), "connection resets");
    }
}

#[test]
#[ignore = "an hour by default; run by scripts/soak (SOAK_MINUTES, SOAK_EXACTLY_ONCE, SOAK_SEED)"]
fn soak_through_kills_bounces_broker_restarts_and_network_faults() {
    let minutes: u64 = std::env::var("SOAK_MINUTES")
        .map(|m| m.parse().expect("SOAK_MINUTES: a whole number"))
        .unwrap_or(60);
    let exactly_once = std::env::var("SOAK_EXACTLY_ONCE").is_ok_and(|v| v == "1");
    let seed: u64 = std::env::var("SOAK_SEED")
        .map(|s| s.parse().expect("SOAK_SEED: a number"))
        .unwrap_or_else(|_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("a clock after 1970")
                .as_nanos() as u64
        })
        | 1;
    let copy_mode = match std::env::var("SOAK_COPY_MODE").as_deref() {
        Ok("batches") => CopyMode::Batches,
        Ok("records") | Err(_) => CopyMode::Records,
        Ok(other) => panic!("SOAK_COPY_MODE: records or batches, not {other}"),
    };
    let mode = match (exactly_once, copy_mode) {
        (true, _) => "exactly once",
        (false, CopyMode::Records) => "at least once",
        (false, CopyMode::Batches) => "at least once, batches",
    };
    announce(&format!(
        "SOAK {mode}: {minutes} min, SOAK_SEED={seed}, Kafka 4.4.0"
    ));
    let started = Instant::now();
    let mut dice = Dice(seed);
    let mut pair = FaultyPair::new(KAFKA_4, TOPIC, PARTITIONS);
    let configs = tempdir();
    // Request timeouts below the faults' spans (as in tests/kafka_faults.rs), so requests in
    // flight when a fault begins time out and are retried during it.
    let (consumer, producer) = mirror_configs(
        configs.path(),
        &pair.source.fronted_bootstrap(),
        &pair.target.fronted_bootstrap(),
        &[
            ("socket.timeout.ms", "5000"),
            ("max.poll.interval.ms", "30000"),
        ],
        &[
            ("request.timeout.ms", "5000"),
            ("socket.timeout.ms", "5000"),
        ],
    );
    let mut builder = Mirror::with_configs(&consumer, &producer)
        .whitelist(TOPIC)
        .commit_ms(300)
        .copy_mode(copy_mode);
    if exactly_once {
        builder = builder.exactly_once("soak");
    }
    let writer = Writer::start(pair.src());
    let mut soaked = Soaked {
        mirror: builder.start(),
        builder,
        failures: Vec::new(),
    };
    let mut events: BTreeMap<&str, u32> = BTreeMap::new();
    let deadline = started + Duration::from_secs(60 * minutes);
    while Instant::now() < deadline {
        let quiet = dice.secs(3, 12);
        soaked.hold_for(quiet, "a quiet spell");
        let event = match dice.below(9) {
            0 => {
                soaked.kill();
                "mirror SIGKILLed"
            }
            1 => {
                soaked.bounce();
                "mirror bounced (SIGTERM)"
            }
            2 => {
                writer.hold();
                pair.source.kill(1);
                pair.source.restart(1);
                writer.resume();
                "source broker restarted"
            }
            3 => {
                pair.target.kill(1);
                pair.target.restart(1);
                "target broker restarted"
            }
            4 => {
                pair.source_link.blackhole();
                soaked.hold_for(dice.secs(3, 20), "a source blackhole");
                pair.source_link.heal();
                "source blackholed 3-20 s"
            }
            5 => {
                pair.target_link.blackhole();
                soaked.hold_for(dice.secs(3, 20), "a target blackhole");
                pair.target_link.heal();
                "target blackholed 3-20 s"
            }
            6 => {
                let links = [&pair.source_link, &pair.target_link];
                reset_storm(&mut soaked, &links, dice.secs(6, 20));
                "both links reset every 2 s for 6-20 s"
            }
            7 => {
                reset_storm(&mut soaked, &[&pair.target_link], dice.secs(6, 20));
                "target link reset every 2 s for 6-20 s"
            }
            _ => {
                pair.target_link
                    .latency(Duration::from_millis(100), Duration::from_millis(50));
                pair.target_link.loss(0.02);
                soaked.hold_for(dice.secs(5, 20), "latency");
                pair.target_link.heal();
                "target link 100 ms + 0-50 ms, 2 % loss, 5-20 s"
            }
        };
        *events.entry(event).or_default() += 1;
    }
    let written = writer.stop();
    // Everything healed: the mirror must catch up and stop cleanly.
    let end: i64 = end_offsets(&pair.src(), TOPIC, PARTITIONS).iter().sum();
    let catch_up = Instant::now();
    while committed_total(&pair.src(), TOPIC, PARTITIONS) < end
        && catch_up.elapsed() < Duration::from_secs(300)
    {
        soaked.hold_for(Duration::from_secs(1), "the catch-up");
    }
    let committed = committed_total(&pair.src(), TOPIC, PARTITIONS);
    if committed < end {
        soaked.failures.push(format!(
            "not caught up 300 s after the last fault: committed {committed} of {end}; log:\n{}",
            tail(&soaked.mirror.log(), 40)
        ));
    }
    soaked.stop("the end");
    let mut args = vec!["--json"];
    if exactly_once {
        args.extend(["--exactly.once", "--isolation", "read_committed"]);
    }
    let (code, stdout, stderr) = pair.verify(&args);
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("verify's output is not JSON ({e}): {stdout}\n{stderr}"));
    let t = &json["totals"];
    let events: Vec<String> = events.iter().map(|(e, n)| format!("{n} × {e}")).collect();
    announce(&format!(
        "SOAK {mode}: {:.1} min, SOAK_SEED={seed}: {}; {written} records written, source \
         {end}; verify: {} source records, {} lost, {} duplicated, {} out of order, {} \
         changed, {} misplaced; {} mirror failure(s)",
        started.elapsed().as_secs_f64() / 60.0,
        events.join(", "),
        t["source_records"],
        t["missing"],
        t["duplicated"],
        t["out_of_order"],
        t["changed"],
        t["misplaced"],
        soaked.failures.len()
    ));
    for f in &soaked.failures {
        eprintln!("SOAK failure: {f}\n");
    }
    assert_eq!(t["source_records"], end, "{json}\n{stderr}");
    assert_eq!(code, Some(0), "verify failed: {json}\n{stderr}");
    assert!(soaked.failures.is_empty(), "the mirror failed: see above");
}
