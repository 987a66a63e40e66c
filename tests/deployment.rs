//! What ships for deployment, checked by reading it: the systemd unit with systemd's own
//! verifier (no systemd as init here), the compose file and the Dockerfiles by reading them
//! (tests/container.rs builds and runs the image with podman), the example configs by loading
//! them as a mirror would.

use std::path::{Path, PathBuf};
use std::process::Command;

use mirror_maker::settings::client::{ClientProps, Role};
use yaml_rust2::{Yaml, YamlLoader};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Loads an example config as the mirror would, from a private copy: a checkout made under
/// umask 002 leaves the repository's files group-writable, which the mirror refuses.
fn load_example(role: Role, path: &Path) -> Result<ClientProps, String> {
    let dir = mirror_test_harness::tempdir();
    let copy = dir.path().join(path.file_name().expect("a file name"));
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    mirror_test_harness::write_private(&copy, bytes);
    ClientProps::load(role, &copy).map_err(|e| e.to_string())
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The hardening directives beyond the sandbox basics, each a line of the unit.
const HARDENING: &[&str] = &[
    "PrivateUsers=yes",
    "ProtectProc=invisible",
    "ProcSubset=pid",
    "MemoryDenyWriteExecute=yes",
    "SystemCallFilter=~@privileged @resources",
    "SystemCallErrorNumber=EPERM",
    "UMask=0077",
    "LimitCORE=0",
];

/// The unit, with its binary paths pointed at the one just built (the verifier wants the
/// binaries to exist), in a temporary directory kept as long as the first value lives.
fn unit_with_built_binary() -> (tempfile::TempDir, PathBuf) {
    let dir = mirror_test_harness::tempdir();
    let path = dir.path().join("mirror-maker.service");
    std::fs::write(
        &path,
        read("config/mirror-maker.service").replace(
            "/usr/local/bin/mirror-maker",
            env!("CARGO_BIN_EXE_mirror-maker"),
        ),
    )
    .unwrap();
    (dir, path)
}

/// What `systemd-analyze security --offline=yes` rated the unit when its hardening was last
/// reviewed (1.8 before the block of `HARDENING`); 0 is best, 10 worst.
const EXPOSURE_AT_MOST: f64 = 1.2;

#[test]
fn the_systemd_units_exposure_stays_at_most_its_reviewed_score() {
    let (_dir, path) = unit_with_built_binary();
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--man=no", "--no-pager"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd; scripts/test installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let score: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("→ Overall exposure level for mirror-maker.service: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level:\n{stdout}\n{stderr}"));
    assert!(
        score <= EXPOSURE_AT_MOST,
        "exposure {score} > {EXPOSURE_AT_MOST}: a hardening line was lost or weakened\n{stdout}"
    );
}

#[test]
fn the_systemd_unit_passes_systemds_verifier() {
    let unit = read("config/mirror-maker.service");
    assert!(unit.contains("\nType=notify\n"), "{unit}");
    assert!(unit.contains("ExecStartPre=/usr/local/bin/mirror-maker check"));
    assert!(unit.contains("WatchdogSec="));
    assert!(unit.contains("RestartPreventExitStatus=2"));
    for directive in HARDENING {
        assert!(
            unit.lines().any(|l| l == *directive),
            "{directive} is not a line of the unit"
        );
    }
    // The configs stay root-only: systemd hands them to the dynamic user as credentials, and
    // both the check and the mirror read them from the credentials directory.
    assert!(unit.contains("\nDynamicUser=yes\n"));
    for file in ["consumer.toml", "producer.toml"] {
        assert!(
            unit.contains(&format!(
                "\nLoadCredential={file}:/etc/mirror-maker/{file}\n"
            )),
            "no LoadCredential for {file}"
        );
        let flag = if file == "consumer.toml" {
            "--consumer.config"
        } else {
            "--producer.config"
        };
        assert_eq!(
            unit.matches(&format!("{flag} %d/{file}")).count(),
            2,
            "ExecStartPre and ExecStart read {flag} from %d"
        );
        assert!(
            !unit.contains(&format!("{flag} /etc/")),
            "{flag} reads /etc"
        );
    }
    let (_dir, path) = unit_with_built_binary();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd; scripts/test installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("mirror-maker.service"))
        .collect();
    assert!(out.status.success() && about_unit.is_empty(), "{stderr}");
}

#[test]
fn the_systemd_verifier_catches_a_broken_unit() {
    // So that the test above cannot pass by the verifier saying nothing at all.
    let dir = mirror_test_harness::tempdir();
    let path = dir.path().join("mirror-maker.service");
    let broken = read("config/mirror-maker.service")
        .replace(
            "/usr/local/bin/mirror-maker",
            env!("CARGO_BIN_EXE_mirror-maker"),
        )
        .replace("Type=notify", "Type=notfy");
    std::fs::write(&path, broken).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("notfy"));
}

fn service<'a>(compose: &'a Yaml, name: &str) -> &'a Yaml {
    let s = &compose["services"][name];
    assert!(!s.is_badvalue(), "service {name} missing");
    s
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_compose_file_wires_two_kraft_clusters_a_producer_and_the_mirror() {
    let docs = YamlLoader::load_from_str(&read("docker-compose.yml")).expect("valid YAML");
    let compose = &docs[0];
    for (name, port) in [
        ("source-kafka", "19092:9092"),
        ("target-kafka", "29092:9092"),
    ] {
        let s = service(compose, name);
        assert!(s["image"].as_str().unwrap().starts_with("apache/kafka:"));
        assert_eq!(strings(&s["ports"]), [port]);
        let environment = &s["environment"];
        // Compose applies YAML merge keys (`<<: *kafka-env`); the YAML reader does not.
        let env = |key: &str| {
            let own = &environment[key];
            if own.is_badvalue() {
                environment["<<"][key].clone()
            } else {
                own.clone()
            }
        };
        assert_eq!(
            env("KAFKA_PROCESS_ROLES").as_str(),
            Some("broker,controller"),
            "{name} runs KRaft"
        );
        assert_eq!(
            env("KAFKA_ADVERTISED_LISTENERS").as_str(),
            Some(format!("PLAINTEXT://{name}:9092").as_str())
        );
        assert_eq!(
            env("KAFKA_CONTROLLER_QUORUM_VOTERS").as_str(),
            Some(format!("1@{name}:9093").as_str())
        );
    }
    let producer = strings(&service(compose, "producer")["command"]);
    let topic = &producer[producer.iter().position(|a| a == "--topic").unwrap() + 1];
    assert!(producer.contains(&"bootstrap.servers=source-kafka:9092".to_owned()));

    let mirror = service(compose, "mirror-maker");
    assert_eq!(mirror["build"].as_str(), Some("."));
    assert_eq!(
        strings(&mirror["volumes"]),
        ["./config:/etc/mirror-maker:ro"]
    );
    assert_eq!(mirror["image"].as_str(), Some("mirror-maker:local"));
    // Hardened as the Helm chart's pods.
    assert_eq!(strings(&mirror["cap_drop"]), ["ALL"]);
    assert_eq!(strings(&mirror["security_opt"]), ["no-new-privileges:true"]);
    assert_eq!(mirror["read_only"].as_bool(), Some(true));
    // The metrics and health endpoints are unauthenticated: the host's loopback only.
    assert_eq!(strings(&mirror["ports"]), ["127.0.0.1:9464:9464"]);
    let args = strings(&mirror["command"]);
    let arg = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].clone();
    // The mirror's configs are the repository's, mounted read-only, and point at the
    // compose services; its whitelist takes the producer's topic.
    let consumer = load_example(
        Role::Consumer,
        &repo(&arg("--consumer.config").replace("/etc/mirror-maker", "config")),
    )
    .unwrap();
    let target = load_example(
        Role::Producer,
        &repo(&arg("--producer.config").replace("/etc/mirror-maker", "config")),
    )
    .unwrap();
    assert_eq!(consumer.get("bootstrap.servers"), Some("source-kafka:9092"));
    assert_eq!(target.get("bootstrap.servers"), Some("target-kafka:9092"));
    let whitelist = mirror_maker::settings::routing::TopicFilter::new(&arg("--whitelist")).unwrap();
    assert!(whitelist.matches(topic), "{topic}");
    assert_eq!(arg("--metrics.addr"), "0.0.0.0:9464");
    // `docker compose stop` waits long enough for the flush (up to
    // --shutdown.timeout.ms) and the close after it (up to 30 s more) before SIGKILL; Docker's
    // default is 10 s.
    let grace = mirror["stop_grace_period"]
        .as_str()
        .expect("stop_grace_period on the mirror");
    let seconds: u64 = grace
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("stop_grace_period {grace:?}: write it as <seconds>s"));
    let shutdown_ms: u64 = args
        .iter()
        .position(|a| a == "--shutdown.timeout.ms")
        .map_or(mirror_maker::settings::defaults::SHUTDOWN_TIMEOUT_MS, |i| {
            args[i + 1].parse().unwrap()
        });
    assert!(
        seconds * 1000 > shutdown_ms + 30_000,
        "stop_grace_period {grace} does not cover the flush ({shutdown_ms} ms) and the close"
    );
}

/// The default of `ARG name=...` in a Dockerfile.
fn build_arg(dockerfile: &str, name: &str) -> String {
    dockerfile
        .lines()
        .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
        .unwrap_or_else(|| panic!("no ARG {name}=<default>"))
        .to_owned()
}

#[test]
fn the_dockerfile_builds_in_its_own_stage_and_runs_small_and_unprivileged() {
    let dockerfile = read("Dockerfile");
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    // The base images are build arguments whose defaults are what users pull.
    assert_eq!(froms[0], "FROM ${BUILD_IMAGE} AS build");
    assert_eq!(froms[1], "FROM ${RUNTIME_IMAGE}");
    assert_eq!(build_arg(&dockerfile, "BUILD_IMAGE"), "rust:1-bookworm");
    assert_eq!(
        build_arg(&dockerfile, "RUNTIME_IMAGE"),
        "debian:bookworm-slim"
    );
    let user = dockerfile
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert_eq!(user.trim(), "USER 10001");
    assert!(dockerfile.contains("--bin mirror-maker"));
    assert!(dockerfile.contains("EXPOSE 9464"));
    assert!(dockerfile.contains("\nHEALTHCHECK ") && dockerfile.contains("/health/ready"));
    let ignored = read(".dockerignore");
    for kept_out in ["target", ".git", "config", "**/*.pem", "**/*.key"] {
        assert!(
            ignored.lines().any(|l| l.trim() == kept_out),
            ".dockerignore lacks {kept_out}"
        );
    }
}

/// The image the container test builds (tests/container.rs) is the image users build: after
/// its FROM, Dockerfile.prebuilt is the Dockerfile's runtime stage line for line, but the COPY
/// of the binary.
#[test]
fn the_prebuilt_dockerfile_is_the_dockerfiles_runtime_stage() {
    let runtime_stage = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| *l != "FROM ${RUNTIME_IMAGE}")
            .map(|l| {
                l.replace(
                    "COPY --from=build /src/target/release/mirror-maker ",
                    "COPY mirror-maker ",
                )
            })
            .collect()
    };
    let dockerfile = read("Dockerfile");
    let prebuilt = read("Dockerfile.prebuilt");
    let stage = runtime_stage(&dockerfile);
    assert!(stage.len() > 5, "no runtime stage in the Dockerfile");
    assert_eq!(runtime_stage(&prebuilt), stage);
    assert_eq!(
        build_arg(&prebuilt, "RUNTIME_IMAGE"),
        build_arg(&dockerfile, "RUNTIME_IMAGE")
    );
    assert!(stage.contains(&"COPY mirror-maker /usr/local/bin/mirror-maker".to_owned()));
}

#[test]
fn every_example_config_loads_and_passes_the_no_data_loss_rules() {
    let mut checked = 0;
    let mut dirs = vec![repo("config")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let role = if name.contains("consumer") {
                Role::Consumer
            } else if name.contains("producer") {
                Role::Producer
            } else {
                continue;
            };
            let mut props =
                load_example(role, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // The certificate and key files the examples name exist only where the mirror is
            // deployed; validation makes the client, which reads them (exit 2 if it cannot).
            props.props.retain(|k, _| !k.ends_with(".location"));
            let result = match role {
                Role::Consumer => props.apply_consumer_rules(true),
                Role::Producer => props.apply_producer_rules(true),
            };
            result.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} example configs found");
}
