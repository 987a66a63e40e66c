//! The suite runner of `./scripts/test`: builds every test target once, then runs the test
//! binaries side by side, as many at a time as their weights allow, longest first.
//!
//! Most trials wait on brokers and timers, not on the CPU, so one binary at a time leaves the
//! machine idle; but every binary starts clusters and mirrors of its own, so running all at
//! once would starve them. Each binary has a weight (`tests/suite.tsv`: about how many Kafka
//! clusters or busy processes it keeps running at once) and the runner keeps the sum of the
//! weights running at most `--capacity`. Within a binary libtest runs `--test-threads` tests at
//! a time, as `cargo test` did: the binaries' shared clusters (one pair per binary, a lane per
//! trial) stay shared. Each binary's output goes to `target/suite/logs/NAME.log`; a failing
//! binary's output is printed when it ends, and the run goes on so that every failure shows.
//!
//! ```text
//! suite [--capacity N] [--threads N] [--only a,b] [--skip a,b] [--gate NAME=FILE]
//!       [--timeout SECONDS] [--list] [-- CARGO-TEST-ARGS...]
//! ```
//!
//! `--gate kfake=FILE` holds the binary `kfake` until FILE exists (`./scripts/test` writes
//! `ok` into it once the kfake broker is built, anything else when its build failed).
//! At the end it prints a table of what ran (start, duration, weight, tests passed) and keeps
//! it in `target/suite/last-run.tsv`, whose durations order the next run.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// One test executable (or the doc tests) to run.
#[derive(Clone)]
struct Job {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<(String, String)>,
    weight: u32,
    expected: f64,
    /// Files that must exist (and say `ok`) before it starts.
    gates: Vec<PathBuf>,
    /// libtest's `--test-threads` for this one (`--threads` when none).
    threads: Option<u32>,
    /// Run only these tests (`--exact`): one shard of a binary.
    tests: Vec<String>,
    /// Run through cargo (the doc tests): libtest's options go after `--`.
    through_cargo: bool,
}

/// What `tests/suite.tsv` says of a binary.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Plan {
    weight: u32,
    seconds: f64,
    /// Run as this many processes side by side, each a share of its tests.
    shards: u32,
    threads: Option<u32>,
}

struct Running {
    job: Job,
    child: Child,
    started: Instant,
    log: PathBuf,
}

struct Done {
    name: String,
    weight: u32,
    start: f64,
    seconds: f64,
    outcome: String,
    ok: bool,
}

struct Options {
    capacity: u32,
    threads: u32,
    only: Option<HashSet<String>>,
    skip: HashSet<String>,
    /// By binary name, `*` for every binary.
    gates: Vec<(String, PathBuf)>,
    /// Rows for `./scripts/test`'s time table, and its start (seconds since the epoch).
    phases: Option<(PathBuf, f64)>,
    timeout: Duration,
    list: bool,
    cargo_args: Vec<String>,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "suite: {problem}\nusage: suite [--capacity N] [--threads N] [--only a,b] [--skip a,b] \
         [--gate NAME=FILE] [--timeout SECONDS] [--list] [-- CARGO-TEST-ARGS...]"
    );
    std::process::exit(2)
}

fn parse_options() -> Options {
    let mut options = Options {
        capacity: 6,
        threads: 2,
        only: None,
        skip: HashSet::new(),
        gates: Vec::new(),
        phases: None,
        // A gate's writer always writes it when its build ends, ok or not; the bound is for a
        // writer that was killed. On a fresh machine a peer's build at the lowest priority
        // (tansu's, since replaced by kfake) ended past 1,800 s after the tests began, and its
        // binary failed unrun: the bound stays under CI's 90 minutes with room for the binary.
        timeout: Duration::from_secs(4200),
        list: false,
        cargo_args: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    let names = |v: String| -> HashSet<String> {
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        let number = |flag: &str, v: String| -> u64 {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{flag} takes a number, not {v:?}")))
        };
        match arg.as_str() {
            "--capacity" => options.capacity = number(&arg, value(&arg)).max(1) as u32,
            "--threads" => options.threads = number(&arg, value(&arg)).max(1) as u32,
            "--timeout" => options.timeout = Duration::from_secs(number(&arg, value(&arg))),
            "--only" => options.only = Some(names(value(&arg))),
            "--skip" => options.skip.extend(names(value(&arg))),
            "--gate" => {
                let v = value(&arg);
                let (name, file) = v
                    .split_once('=')
                    .unwrap_or_else(|| usage(&format!("--gate takes NAME=FILE, not {v:?}")));
                options.gates.push((name.to_owned(), PathBuf::from(file)));
            }
            "--phases" => {
                let file = PathBuf::from(value(&arg));
                options.phases = Some((file, options.phases.map_or(0.0, |p| p.1)));
            }
            "--t0" => {
                let v = value(&arg);
                let t0: f64 = v
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("--t0 takes seconds, not {v:?}")));
                let file = options.phases.take().map(|p| p.0).unwrap_or_default();
                options.phases = Some((file, t0));
            }
            "--list" => options.list = true,
            "--" => options.cargo_args.extend(args.by_ref()),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    options
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `tests/suite.tsv`, read from `path`.
fn read_plan(path: &Path) -> HashMap<String, Plan> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| usage(&format!("reading {}: {e}", path.display())));
    parse_plan(&text).unwrap_or_else(|e| usage(&format!("{}:{e}", path.display())))
}

/// `tests/suite.tsv`: NAME WEIGHT SECONDS [SHARDS [THREADS]] per line: the weight, the expected
/// duration (the durations of the last run, when there is one, order the run instead), how many
/// processes share its tests (1) and libtest's `--test-threads` in each (`-`: `--threads`).
fn parse_plan(text: &str) -> Result<HashMap<String, Plan>, String> {
    let mut plan = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parsed = match fields.as_slice() {
            [name, weight, seconds, rest @ ..] if rest.len() <= 2 => (|| {
                let shards = match rest.first() {
                    Some(v) => v.parse().ok().filter(|&k: &u32| k >= 1)?,
                    None => 1,
                };
                let threads = match rest.get(1) {
                    Some(&"-") | None => None,
                    Some(v) => Some(v.parse().ok().filter(|&t: &u32| t >= 1)?),
                };
                Some((
                    name.to_string(),
                    Plan {
                        weight: weight.parse().ok()?,
                        seconds: seconds.parse().ok()?,
                        shards,
                        threads,
                    },
                ))
            })(),
            _ => None,
        };
        let Some((name, entry)) = parsed else {
            return Err(format!(
                "{}: expected NAME WEIGHT SECONDS [SHARDS [THREADS]] (numbers, SHARDS and \
                 THREADS at least 1, THREADS `-` for --threads), found {line:?}",
                n + 1
            ));
        };
        plan.insert(name, entry);
    }
    Ok(plan)
}

/// The tests of a binary (`--list --format terse`), ignored ones too, in its order.
fn list_tests(job: &Job) -> Result<Vec<String>, String> {
    let out = Command::new(&job.program)
        .args(["--list", "--format", "terse"])
        .current_dir(&job.dir)
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} --list: {e}", job.program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --list: {}: {}",
            job.program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// `shards` jobs of `tests`, dealt in turn so that neighbours (a trial and its twin of the
/// other engine, named alike) go to different shards: `NAME#1`, `NAME#2`, ...
fn shard(job: &Job, tests: &[String], shards: u32) -> Vec<Job> {
    let shards = (shards as usize).min(tests.len()).max(1);
    (0..shards)
        .map(|i| Job {
            name: format!("{}#{}", job.name, i + 1),
            expected: job.expected / shards as f64,
            tests: tests.iter().skip(i).step_by(shards).cloned().collect(),
            ..job.clone()
        })
        .collect()
}

/// The durations of the last run (`target/suite/last-run.tsv`), by binary.
fn last_durations(path: &Path) -> HashMap<String, f64> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Some((f.first()?.to_string(), f.get(3)?.parse().ok()?))
        })
        .collect()
}

/// Builds every test target of the workspace (`cargo test --no-run`) and returns one job per
/// test executable, named by its target (`kafka_trials`; `PACKAGE` for a library's unit tests,
/// `PACKAGE/bin/NAME` for a binary's).
fn build(cargo_args: &[String]) -> Vec<Job> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(&cargo)
        // The message format before the caller's arguments: after a `--` among them it would
        // go to the test binaries, and cargo would print no artifacts.
        .args(["test", "--workspace", "--no-run"])
        .arg("--message-format=json-diagnostic-rendered-ansi")
        .args(cargo_args)
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| usage(&format!("running {cargo}: {e}")));
    let mut jobs = Vec::new();
    let stdout = child.stdout.take().expect("cargo's stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reading cargo's output");
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        match message["reason"].as_str() {
            Some("compiler-message") => {
                if let Some(rendered) = message["message"]["rendered"].as_str() {
                    eprint!("{rendered}");
                }
            }
            Some("compiler-artifact") => {
                if let Some(job) = job_of(&message) {
                    jobs.push(job);
                }
            }
            _ => {}
        }
    }
    let status = child.wait().expect("waiting for cargo");
    if !status.success() {
        eprintln!("suite: the test build failed ({status})");
        std::process::exit(1);
    }
    if jobs.is_empty() {
        eprintln!("suite: the build named no test executable (cargo arguments: {cargo_args:?})");
        std::process::exit(1);
    }
    jobs
}

fn job_of(artifact: &serde_json::Value) -> Option<Job> {
    let program = PathBuf::from(artifact["executable"].as_str()?);
    if !artifact["profile"]["test"].as_bool()? {
        return None;
    }
    let target = &artifact["target"];
    let kind = target["kind"][0].as_str()?;
    let name = target["name"].as_str()?;
    let manifest = PathBuf::from(artifact["manifest_path"].as_str()?);
    let dir = manifest.parent()?.to_path_buf();
    let package = artifact["package_id"].as_str()?;
    // "path+file:///…/mirror-maker#0.1.0" or "…#mirror-test-harness@0.1.0".
    let (_, tail) = package.rsplit_once('#')?;
    let (package_name, version) = match tail.split_once('@') {
        Some((n, v)) => (n.to_owned(), v.to_owned()),
        None => (dir.file_name()?.to_str()?.to_owned(), tail.to_owned()),
    };
    let job_name = match kind {
        "test" | "bench" => name.to_owned(),
        "bin" => format!("{package_name}/bin/{name}"),
        _ => package_name.clone(),
    };
    Some(Job {
        name: job_name,
        program,
        args: Vec::new(),
        env: vec![
            ("CARGO_MANIFEST_DIR".into(), dir.display().to_string()),
            ("CARGO_PKG_NAME".into(), package_name),
            ("CARGO_PKG_VERSION".into(), version),
        ],
        dir,
        weight: 1,
        expected: 60.0,
        gates: Vec::new(),
        threads: None,
        tests: Vec::new(),
        through_cargo: false,
    })
}

fn doc_job(cargo_args: &[String]) -> Job {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec![
        "test".to_owned(),
        "--workspace".to_owned(),
        "--doc".to_owned(),
    ];
    args.extend(without_target_selection(cargo_args));
    Job {
        name: "doc".into(),
        program: cargo.into(),
        args,
        dir: workspace_root(),
        env: Vec::new(),
        weight: 1,
        expected: 60.0,
        gates: Vec::new(),
        threads: None,
        tests: Vec::new(),
        through_cargo: true,
    }
}

/// The cargo arguments less those that select targets (`--all-targets`, `--test NAME`, ...),
/// which cargo refuses beside `--doc`.
fn without_target_selection(cargo_args: &[String]) -> Vec<String> {
    const FLAGS: &[&str] = &[
        "--all-targets",
        "--lib",
        "--bins",
        "--tests",
        "--benches",
        "--examples",
    ];
    const WITH_VALUE: &[&str] = &["--bin", "--test", "--bench", "--example"];
    let mut kept = Vec::new();
    let mut args = cargo_args.iter();
    while let Some(arg) = args.next() {
        let name = arg.split('=').next().unwrap_or(arg);
        if FLAGS.contains(&name) {
            continue;
        }
        if WITH_VALUE.contains(&name) {
            if !arg.contains('=') {
                args.next();
            }
            continue;
        }
        kept.push(arg.clone());
    }
    kept
}

/// The libtest summary of a log: "N passed, M failed, K ignored" (summed over its
/// `test result:` lines), or what ended it when there is none.
fn summary(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let (mut passed, mut failed, mut ignored, mut found) = (0u64, 0u64, 0u64, false);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("test result: ") else {
            continue;
        };
        found = true;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(count)) = (words.next(), words.next()) else {
                continue;
            };
            let count: u64 = count.parse().unwrap_or(0);
            match what {
                "passed" => passed += count,
                "failed" => failed += count,
                "ignored" => ignored += count,
                _ => {}
            }
        }
    }
    if found {
        format!("{passed} passed, {failed} failed, {ignored} ignored")
    } else {
        "no test result".into()
    }
}

/// Starts `job` in a process group of its own, its output into `logs/NAME.log`, and notes its
/// group in `running/` (its pid), for `./scripts/test` to kill what still runs when it is
/// interrupted: a group of its own does not get the terminal's Ctrl-C.
fn start(job: Job, threads: u32, logs: &Path, running: &Path) -> Running {
    let log = logs.join(format!("{}.log", job.name.replace('/', "-")));
    let out = File::create(&log).unwrap_or_else(|e| usage(&format!("{}: {e}", log.display())));
    // The doc tests run through cargo (`cargo test --doc ARGS`), which passes what follows
    // `--` on to libtest; a test binary takes libtest's options itself.
    let mut cmd = Command::new(&job.program);
    cmd.args(&job.args);
    if job.through_cargo {
        cmd.arg("--");
    }
    let threads = job.threads.unwrap_or(threads);
    cmd.args(["--test-threads", &threads.to_string()]);
    if !job.tests.is_empty() {
        cmd.arg("--exact").args(&job.tests);
    }
    use std::os::unix::process::CommandExt;
    cmd.current_dir(&job.dir)
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the log file"))
        .stderr(out)
        // Its own process group: a binary past its time is killed with everything it started.
        .process_group(0);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| usage(&format!("starting {}: {e}", job.program.display())));
    let _ = std::fs::write(running.join(child.id().to_string()), &job.name);
    Running {
        job,
        child,
        started: Instant::now(),
        log,
    }
}

/// Appends a row to `./scripts/test`'s time table: NAME, its start (seconds from the
/// script's), how long it took, and its result. It ended now.
fn phase_row(phases: &Option<(PathBuf, f64)>, name: &str, seconds: f64, result: &str) {
    let Some((file, t0)) = phases else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(file)
    {
        let _ = writeln!(
            f,
            "{name}\t{:.0}\t{seconds:.0}\t{result}",
            now - seconds - t0
        );
    }
}

fn kill_group(child: &Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
}

fn main() -> ExitCode {
    let options = parse_options();
    let root = workspace_root();
    let plan = read_plan(&root.join("tests/suite.tsv"));
    let suite_dir = target_dir().join("suite");
    let logs = suite_dir.join("logs");
    std::fs::create_dir_all(&logs).expect("creating target/suite/logs");
    let last_run = suite_dir.join("last-run.tsv");
    let running_dir = suite_dir.join("running");
    let _ = std::fs::remove_dir_all(&running_dir);
    std::fs::create_dir_all(&running_dir).expect("creating target/suite/running");
    let last = last_durations(&last_run);

    let began = Instant::now();
    let mut jobs = build(&options.cargo_args);
    jobs.push(doc_job(&options.cargo_args));
    let built = began.elapsed().as_secs_f64();
    eprintln!("suite: built in {built:.0} s");
    phase_row(
        &options.phases,
        "build: every target, with clippy's lints",
        built,
        "ok",
    );
    let mut planned = Vec::new();
    for mut job in jobs {
        let mut shards = 1;
        if let Some(entry) = plan.get(&job.name) {
            job.weight = entry.weight.clamp(1, options.capacity);
            job.expected = entry.seconds;
            job.threads = entry.threads;
            shards = entry.shards;
        } else {
            eprintln!(
                "suite: {} is not in tests/suite.tsv: weight 1, expected 60 s",
                job.name
            );
        }
        job.gates = options
            .gates
            .iter()
            .filter(|(name, _)| name == "*" || *name == job.name)
            .map(|(_, file)| file.clone())
            .collect();
        let mut parts = match shards {
            1 => vec![job],
            _ => match list_tests(&job) {
                Ok(tests) => shard(&job, &tests, shards),
                Err(e) => {
                    eprintln!("suite: {} runs as one process: {e}", job.name);
                    vec![job]
                }
            },
        };
        for part in &mut parts {
            if let Some(&seconds) = last.get(&part.name) {
                part.expected = seconds;
            }
        }
        planned.extend(parts);
    }
    let mut jobs = planned;
    // --only and --skip take binary names (all its shards) and shard names (`kafka_faults#2`);
    // a name that is neither is refused, not taken for an empty selection.
    let named =
        |name: &str, job: &Job| job.name == name || job.name.split('#').next() == Some(name);
    let asked = options.only.iter().flatten().chain(options.skip.iter());
    let unknown: Vec<&String> = asked
        .filter(|name| !jobs.iter().any(|job| named(name, job)))
        .collect();
    if !unknown.is_empty() {
        let mut known: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        known.sort_unstable();
        usage(&format!(
            "no test binary or shard named {}; there are: {}",
            unknown
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            known.join(" ")
        ));
    }
    jobs.retain(|job| {
        !options.skip.iter().any(|name| named(name, job))
            && options
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|name| named(name, job)))
    });
    // Longest first: the long binaries start at once, the short ones fill the gaps.
    jobs.sort_by(|a, b| b.expected.total_cmp(&a.expected));
    if options.list {
        for job in &jobs {
            println!(
                "{}\t{}\t{:.0}\t{}",
                job.name,
                job.weight,
                job.expected,
                job.threads.unwrap_or(options.threads)
            );
        }
        return ExitCode::SUCCESS;
    }

    let mut waiting = jobs;
    let mut running: Vec<Running> = Vec::new();
    let mut done: Vec<Done> = Vec::new();
    let tests_began = Instant::now();
    while !waiting.is_empty() || !running.is_empty() {
        let used: u32 = running.iter().map(|r| r.job.weight).sum();
        let mut free = options.capacity - used;
        let mut i = 0;
        while i < waiting.len() {
            let job = &waiting[i];
            // A gate never opened (what writes it was killed) fails its binary at --timeout.
            let gates_open =
                job.gates.iter().all(|g| g.exists()) || tests_began.elapsed() > options.timeout;
            if gates_open && job.weight <= free {
                let job = waiting.remove(i);
                let closed: Vec<String> = job
                    .gates
                    .iter()
                    .map(|g| {
                        std::fs::read_to_string(g).unwrap_or_else(|_| {
                            format!("{} was not written within --timeout", g.display())
                        })
                    })
                    .filter(|said| said.trim() != "ok")
                    .map(|said| said.trim().to_owned())
                    .collect();
                if !closed.is_empty() {
                    eprintln!("FAIL {}: not run: {}", job.name, closed.join("; "));
                    done.push(Done {
                        name: job.name,
                        weight: job.weight,
                        start: tests_began.elapsed().as_secs_f64(),
                        seconds: 0.0,
                        outcome: format!("not run: {}", closed.join("; ")),
                        ok: false,
                    });
                    continue;
                }
                free -= job.weight;
                eprintln!(
                    "suite: {:>6.0} s  start {} (weight {}, about {:.0} s)",
                    tests_began.elapsed().as_secs_f64(),
                    job.name,
                    job.weight,
                    job.expected
                );
                running.push(start(job, options.threads, &logs, &running_dir));
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut still = Vec::new();
        for mut r in running.drain(..) {
            let status = match r.child.try_wait() {
                Ok(Some(status)) => Some(status),
                Ok(None) if r.started.elapsed() > options.timeout => {
                    kill_group(&r.child);
                    let status = r.child.wait().expect("waiting for a killed test binary");
                    let mut log = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&r.log)
                        .expect("the log file");
                    let _ = writeln!(
                        log,
                        "suite: killed after {} s (--timeout)",
                        options.timeout.as_secs()
                    );
                    Some(status)
                }
                Ok(None) => None,
                Err(e) => panic!("waiting for {}: {e}", r.job.name),
            };
            let Some(status) = status else {
                still.push(r);
                continue;
            };
            // What it started in its group and left behind (a mirror, a JVM) goes with it.
            kill_group(&r.child);
            let _ = std::fs::remove_file(running_dir.join(r.child.id().to_string()));
            let seconds = r.started.elapsed().as_secs_f64();
            let outcome = summary(&r.log);
            let ok = status.success();
            eprintln!(
                "{} {} in {seconds:.0} s: {outcome}{}",
                if ok { "ok  " } else { "FAIL" },
                r.job.name,
                if ok {
                    String::new()
                } else {
                    format!(" ({status}; log {})", r.log.display())
                }
            );
            if !ok {
                let text = std::fs::read_to_string(&r.log).unwrap_or_default();
                eprintln!(
                    "---- {} ----\n{text}---- end of {} ----",
                    r.job.name, r.job.name
                );
            }
            phase_row(
                &options.phases,
                &format!("test {}", r.job.name),
                seconds,
                &outcome,
            );
            done.push(Done {
                name: r.job.name.clone(),
                weight: r.job.weight,
                start: (r.started - tests_began).as_secs_f64(),
                seconds,
                outcome,
                ok,
            });
        }
        running = still;
    }

    let total = tests_began.elapsed().as_secs_f64();
    done.sort_by(|a, b| a.start.total_cmp(&b.start));
    let mut table = String::new();
    for d in &done {
        table.push_str(&format!(
            "{}\t{}\t{:.0}\t{:.1}\t{}\n",
            d.name, d.weight, d.start, d.seconds, d.outcome
        ));
    }
    if done.iter().all(|d| d.ok) && options.only.is_none() {
        let _ = std::fs::write(&last_run, &table);
    }
    println!(
        "\nsuite: the build {built:.0} s, the tests {total:.0} s (capacity {}, {} test threads a binary)",
        options.capacity, options.threads
    );
    // ./scripts/test prints these rows in its own table.
    let rows = if options.phases.is_some() {
        &[][..]
    } else {
        &done[..]
    };
    if !rows.is_empty() {
        println!(
            "{:<34} {:>6} {:>7} {:>8}  result",
            "binary", "weight", "start s", "took s"
        );
    }
    for d in rows {
        println!(
            "{:<34} {:>6} {:>7.0} {:>8.1}  {}{}",
            d.name,
            d.weight,
            d.start,
            d.seconds,
            if d.ok { "" } else { "FAILED: " },
            d.outcome
        );
    }
    let mut totals = [0u64; 3];
    for d in &done {
        for (i, what) in ["passed", "failed", "ignored"].iter().enumerate() {
            totals[i] += d
                .outcome
                .split(", ")
                .find_map(|p| p.strip_suffix(&format!(" {what}"))?.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    println!(
        "suite: {} binaries, {} tests passed, {} failed, {} ignored",
        done.len(),
        totals[0],
        totals[1],
        totals[2]
    );
    let failed: Vec<&str> = done
        .iter()
        .filter(|d| !d.ok)
        .map(|d| d.name.as_str())
        .collect();
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("suite: failed: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    fn a_job(name: &str) -> Job {
        Job {
            name: name.into(),
            program: PathBuf::from("/bin/true"),
            args: Vec::new(),
            dir: PathBuf::from("/"),
            env: Vec::new(),
            weight: 2,
            expected: 90.0,
            gates: Vec::new(),
            threads: Some(1),
            tests: Vec::new(),
            through_cargo: false,
        }
    }

    #[test]
    fn a_plan_line_may_give_shards_and_threads() {
        let plan = parse_plan(
            "# comment\nkafka_faults 2 900 3 1\nkafka_trials 2 700 1 4\nsmoke 2 60\nx 1 5 2 -\n",
        )
        .unwrap();
        let entry = |weight, seconds, shards, threads| Plan {
            weight,
            seconds,
            shards,
            threads,
        };
        assert_eq!(plan["kafka_faults"], entry(2, 900.0, 3, Some(1)));
        assert_eq!(plan["kafka_trials"], entry(2, 700.0, 1, Some(4)));
        assert_eq!(plan["smoke"], entry(2, 60.0, 1, None));
        assert_eq!(plan["x"], entry(1, 5.0, 2, None));
    }

    #[test]
    fn a_plan_line_that_cannot_be_read_is_refused_naming_its_line() {
        for bad in ["a 1", "a 1 5 0", "a 1 5 2 0", "a x 5", "a 1 5 2 3 4"] {
            let e = parse_plan(&format!("ok 1 1\n{bad}\n")).unwrap_err();
            assert!(e.starts_with("2: "), "{bad}: {e}");
        }
    }

    #[test]
    fn shards_take_every_test_once_neighbours_apart() {
        let tests = strings(&["a", "a_with_batches", "b", "b_with_batches", "c"]);
        let shards = shard(&a_job("kafka_faults"), &tests, 2);
        let names: Vec<&str> = shards.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["kafka_faults#1", "kafka_faults#2"]);
        assert_eq!(shards[0].tests, strings(&["a", "b", "c"]));
        assert_eq!(
            shards[1].tests,
            strings(&["a_with_batches", "b_with_batches"])
        );
        assert_eq!(shards[0].expected, 45.0);
        assert_eq!(shards[0].threads, Some(1));
    }

    #[test]
    fn no_more_shards_than_tests() {
        let tests = strings(&["only"]);
        let shards = shard(&a_job("one"), &tests, 3);
        assert_eq!(shards.len(), 1);
        assert_eq!(shards[0].tests, tests);
    }

    #[test]
    fn the_doc_tests_get_the_cargo_arguments_but_those_that_select_targets() {
        let job = doc_job(&strings(&[
            "--locked",
            "--all-targets",
            "--test",
            "smoke",
            "--bin=mirror-maker",
            "--features",
            "x",
        ]));
        assert_eq!(
            job.args,
            strings(&[
                "test",
                "--workspace",
                "--doc",
                "--locked",
                "--features",
                "x"
            ])
        );
    }

    #[test]
    fn the_suite_file_parses() {
        // A malformed line stops every run at once (a name glued to its weight did).
        let path = workspace_root().join("tests/suite.tsv");
        let text = std::fs::read_to_string(&path).expect("tests/suite.tsv");
        let plan = parse_plan(&text).unwrap_or_else(|e| panic!("{}:{e}", path.display()));
        assert!(plan.contains_key("kafka_trials") && plan.contains_key("mirror-maker"));
    }
}
