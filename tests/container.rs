//! The container image, built and run with podman: Dockerfile.prebuilt (./Dockerfile's runtime
//! stage, tests/deployment.rs checks they agree) around the binary cargo built for this test,
//! on the bookworm base scripts/base-image makes without a registry. The mirror runs in it
//! with host networking between two Apache Kafka clusters on loopback, unprivileged as the
//! Dockerfile says, and stops on `podman stop` as it does under Docker or Kubernetes.
//!
//! Needs root, podman and runc (./scripts/test installs them); fails, does not skip, without.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mirror_test_harness::kafka::*;
use mirror_test_harness::podman::{
    base_image, containers_conf, one_build_at_a_time, podman, run_ok, stdout_of,
};
use mirror_test_harness::*;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 3;
const RECORDS: u64 = 3000;
/// The Dockerfile's `USER`.
const UID: &str = "10001";

/// The image, built once per test process from the binary cargo built for these tests, its
/// debug information stripped (the release binary keeps line tables only: debug = 1).
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let started = Instant::now();
        let base = base_image();
        let context = tempdir();
        let binary = context.path().join("mirror-maker");
        run_ok(
            std::process::Command::new("objcopy")
                .arg("--strip-debug")
                .arg(env!("CARGO_BIN_EXE_mirror-maker"))
                .arg(&binary),
        );
        let tag = "localhost/mirror-maker:test";
        let building = one_build_at_a_time();
        let before = image_id(tag);
        run_ok(
            podman()
                .args([
                    "build",
                    "--quiet",
                    "--format",
                    "docker",
                    "--network",
                    "host",
                ])
                .arg("--file")
                .arg(workspace_root().join("Dockerfile.prebuilt"))
                .args(["--build-arg", &format!("RUNTIME_IMAGE={base}")])
                .args(["--tag", tag])
                .arg(context.path()),
        );
        // The image this tag named before, unless the build found it unchanged: not left
        // behind as a dangling image at every run.
        if let Some(old) = before.filter(|old| Some(old) != image_id(tag).as_ref()) {
            let _ = podman().args(["rmi", &old]).output();
        }
        drop(building);
        let size: u64 =
            stdout_of(podman().args(["image", "inspect", "--format", "{{.Size}}", tag]))
                .parse()
                .expect("podman's image size in bytes");
        eprintln!(
            "IMAGE {tag} on {base}: {size} bytes ({:.1} MB), built in {:.1} s",
            size as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
        tag.to_owned()
    })
}

fn image_id(tag: &str) -> Option<String> {
    let out = podman()
        .args(["image", "inspect", "--format", "{{.Id}}", tag])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Client configs in a folder the container's user can read, mounted at /etc/mirror-maker:
/// owned by that user (uid 10001) and private to it (0600), as a config with secrets should be.
fn config_dir(source: &str, target: &str, producer_extra: &[(&str, &str)]) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir();
    let (c, p) = mirror_configs(dir.path(), source, target, &[], producer_extra);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for file in [c, p] {
        std::os::unix::fs::chown(&file, Some(10001), Some(10001))
            .unwrap_or_else(|e| panic!("chown {}: {e}", file.display()));
    }
    dir
}

/// The mirror's flags reading the mounted configs.
fn mirror_flags(extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--consumer.config",
        "/etc/mirror-maker/consumer.toml",
        "--producer.config",
        "/etc/mirror-maker/producer.toml",
        "--whitelist",
        TOPIC,
    ]
    .map(str::to_owned)
    .to_vec();
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    flags
}

/// A named container, removed (killed if need be) when dropped.
struct Container {
    name: String,
}

impl Container {
    fn name(test: &str) -> Container {
        let name = format!("mirror-maker-{test}-{}", std::process::id());
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &name])
            .output();
        Container { name }
    }

    /// `podman run` with the unprivileged settings every test uses, then `options`; detached
    /// when `detach`.
    fn run(
        &self,
        detach: bool,
        options: &[&str],
        configs: &Path,
        flags: &[String],
    ) -> std::process::Output {
        let mut cmd = podman();
        cmd.args(["run", "--name", &self.name, "--network", "host"])
            .args([
                "--read-only",
                "--cap-drop=ALL",
                "--security-opt",
                "no-new-privileges",
            ])
            // No systemd timer for the health check (there is no systemd here); the test runs
            // it with `podman healthcheck run`.
            .args(["--health-interval", "disable"])
            .arg("--volume")
            .arg(format!("{}:/etc/mirror-maker:ro", configs.display()))
            .args(options);
        if detach {
            cmd.arg("--detach");
        }
        cmd.arg(image()).args(flags);
        cmd.output().expect("running podman run")
    }

    fn inspect(&self, format: &str) -> String {
        stdout_of(podman().args(["inspect", "--format", format, &self.name]))
    }

    fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    fn logs(&self) -> String {
        let out = podman()
            .args(["logs", &self.name])
            .output()
            .expect("running podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
    }
}

/// The records the target topic holds (0 while the mirror has not created it).
fn target_records(bootstrap: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .expect("a consumer");
    (0..PARTITIONS)
        .filter_map(|p| {
            consumer
                .fetch_watermarks(TOPIC, p, Duration::from_secs(5))
                .ok()
        })
        .map(|(low, high)| high - low)
        .sum()
}

/// The `Name:` line of /proc/PID/status, its fields after the colon.
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("{name} not in /proc/PID/status:\n{status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_image_mirrors_as_uid_10001_without_capabilities_and_commits_everything_on_podman_stop() {
    let image = image();
    let pair = KafkaPair::new(KAFKA_4, TOPIC, PARTITIONS);
    pair.write(0..RECORDS);
    let configs = config_dir(&pair.src(), &pair.dst(), &[]);
    let metrics = free_local_addr();
    let container = Container::name("mirror");
    // No periodic commit within the test: whatever is committed at the end, the stop committed.
    let flags = mirror_flags(&[
        "--metrics.addr",
        &metrics,
        "--offset.commit.interval.ms",
        "600000",
    ]);
    let health_addr = format!("MIRROR_HEALTH_ADDR={metrics}");
    let out = container.run(true, &["--env", &health_addr], configs.path(), &flags);
    assert!(
        out.status.success(),
        "podman run {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let source_end = pair.end_offsets();
    wait_until(
        Duration::from_secs(90),
        "the target to hold every record",
        || !container.running() || target_records(&pair.dst()) == RECORDS as i64,
    );
    assert!(
        container.running(),
        "the mirror exited:\n{}",
        container.logs()
    );

    // Ready, asked from inside the container: the image's HEALTHCHECK (bash's /dev/tcp), run
    // by podman in the container; and from the host through the host network.
    let health = podman()
        .args(["healthcheck", "run", &container.name])
        .output()
        .unwrap();
    assert!(
        health.status.success(),
        "HEALTHCHECK: {}{}\nlog:\n{}",
        String::from_utf8_lossy(&health.stdout),
        String::from_utf8_lossy(&health.stderr),
        container.logs()
    );
    let (status, body) = http_get(&metrics, "/health/ready");
    assert_eq!(status, 200, "{body}");

    // The container's process (its PID 1, seen from the host): the mirror, as uid 10001, no
    // capability in any set, no way to gain one, on a read-only root.
    let pid = container.inspect("{{.State.Pid}}");
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        cmdline.starts_with("/usr/local/bin/mirror-maker\0"),
        "{cmdline:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_eq!(
        status_field(&status, "Uid"),
        [UID; 4].join(" "),
        "the container's process runs as the Dockerfile's USER"
    );
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(&status, set), "0000000000000000", "{set}");
    }
    assert_eq!(
        status_field(&status, "NoNewPrivs"),
        "1",
        "no-new-privileges"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .expect("the root mount");
    assert!(root[5].split(',').any(|o| o == "ro"), "root mount {root:?}");
    let before_stop = pair.committed();
    assert_ne!(
        before_stop, source_end,
        "committed before the stop: the test could not tell the stop's commit"
    );

    // SIGTERM with a 30 s grace period: a clean exit well within it, every offset the target
    // acknowledged committed.
    let stopping = Instant::now();
    run_ok(podman().args(["stop", "--time", "30", &container.name]));
    let took = stopping.elapsed();
    let exit = container.inspect("{{.State.ExitCode}}");
    assert_eq!(exit, "0", "log:\n{}", container.logs());
    assert!(took < Duration::from_secs(30), "stopped in {took:?}");
    assert_eq!(
        pair.committed(),
        source_end,
        "committed before the stop: {before_stop:?}; log:\n{}",
        container.logs()
    );
    let c = pair.compare();
    assert!(c.is_exact() && c.source == RECORDS, "{c:?}");
    eprintln!(
        "CONTAINER {image}: {RECORDS} records mirrored, committed before the stop {before_stop:?}, \
         after {source_end:?}; podman stop took {:.1} s",
        took.as_secs_f64()
    );
}

#[test]
fn a_bad_config_in_the_image_exits_2_with_one_line_in_podman_logs() {
    image();
    // Fewer acknowledgements than all in-sync replicas could lose records: refused.
    let dir = config_dir("127.0.0.1:1", "127.0.0.1:1", &[("acks", "1")]);
    let container = Container::name("bad-config");
    let out = container.run(false, &[], dir.path(), &mirror_flags(&[]));
    let logs = container.logs();
    assert_eq!(
        out.status.code(),
        Some(2),
        "podman run: {out:?}\nlogs:\n{logs}"
    );
    assert_eq!(container.inspect("{{.State.ExitCode}}"), "2");
    assert_eq!(logs.trim_end().lines().count(), 1, "not one line:\n{logs}");
    for needle in ["/etc/mirror-maker/producer.toml", "acks"] {
        assert!(logs.contains(needle), "{needle:?} not in {logs:?}");
    }
}

/// The build context ./Dockerfile gets from a working copy, as podman reads .dockerignore:
/// the whole workspace that `cargo build --locked` needs, and none of target/, .git, the
/// configs (mounted at run time) or key and certificate files wherever they sit.
#[test]
fn the_build_context_holds_the_workspace_and_no_target_git_configs_or_keys() {
    let base = base_image();
    let root = workspace_root();
    let context = tempdir();
    let files = stdout_of(
        std::process::Command::new("git")
            .args(["ls-files", "--cached", "--others", "--exclude-standard"])
            .current_dir(&root),
    );
    for file in files.lines() {
        let to = context.path().join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join(file), &to).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    // What a working copy holds besides the repository's files.
    let strays = [
        "target/release/mirror-maker",
        ".git/HEAD",
        "config/local-consumer.toml",
        "config/sasl-ssl/mirror-maker.key",
        "client.pem",
        "plugin/src/test.key",
        "consumer.toml",
    ];
    for stray in strays {
        let path = context.path().join(stray);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "stray").unwrap();
    }
    let probe = tempdir();
    let probe_file = probe.path().join("Dockerfile");
    std::fs::write(&probe_file, format!("FROM {base}\nCOPY . /context\n")).unwrap();
    let tag = format!("localhost/mirror-maker-context:{}", std::process::id());
    let building = one_build_at_a_time();
    run_ok(
        podman()
            .args(["build", "--quiet", "--network", "host", "--file"])
            .arg(&probe_file)
            .args(["--tag", &tag])
            .arg(context.path()),
    );
    // The context as the build saw it, copied back out of the probe image.
    let seen = tempdir();
    let copied = std::process::Command::new("sh")
        .arg("-c")
        .arg("\"$0\" run --rm --network host \"$1\" tar -C /context -cf - . | tar -C \"$2\" -xf -")
        .arg("podman")
        .arg(&tag)
        .arg(seen.path())
        .env("CONTAINERS_CONF", containers_conf())
        .output()
        .unwrap();
    let _ = podman().args(["rmi", &tag]).output();
    drop(building);
    assert!(copied.status.success(), "{copied:?}");

    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    let mut needed = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        "src/main.rs".to_owned(),
    ];
    needed.extend(
        members
            .iter()
            .map(|m| format!("{}/Cargo.toml", m.as_str().unwrap())),
    );
    for file in &needed {
        assert!(
            seen.path().join(file).is_file(),
            "{file} not in the build context"
        );
    }
    // Cargo reads the whole workspace from it, offline.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_ok(
        std::process::Command::new(cargo)
            .args([
                "metadata",
                "--no-deps",
                "--offline",
                "--locked",
                "--format-version",
                "1",
            ])
            .arg("--manifest-path")
            .arg(seen.path().join("Cargo.toml")),
    );
    for stray in strays {
        assert!(
            !seen.path().join(stray).exists(),
            "{stray} is in the build context"
        );
    }
    for kept_out in ["target", ".git", "config"] {
        assert!(
            !seen.path().join(kept_out).exists(),
            "{kept_out}/ is in the build context"
        );
    }
}
