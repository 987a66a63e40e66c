//! The benchmark's harness keeps working: `mirror-bench --brokers kafka` with a tiny backlog
//! runs every contender (the limits, this mirror with records and with batches, MirrorMaker 1
//! default and tuned, MirrorMaker 2, the batched loop) on Apache Kafka, checks each target and
//! writes a result line, the brokers' CPU beside each pass. Nothing is timed here: the figures
//! of so small a run mean nothing.

use std::path::Path;
use std::process::Command;

#[test]
fn every_contender_mirrors_a_small_backlog_on_kafka() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The mirror binary the benchmark starts: next to mirror-bench in the same profile.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "mirror-maker",
            "--bin",
            "mirror-maker",
        ])
        .current_dir(&root)
        .status()
        .expect("running cargo build");
    assert!(built.success(), "building the mirror-maker binary failed");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("results.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_mirror-bench"))
        .args([
            "--brokers",
            "kafka",
            "--records",
            "3000",
            "--value-bytes",
            "100",
        ])
        .args([
            "--partitions",
            "4",
            "--streams",
            "1",
            "--compression",
            "lz4",
        ])
        .args(["--latency-secs", "1", "--latency-rate", "100"])
        .arg("--out")
        .arg(&out)
        .env("RUST_BACKTRACE", "0")
        .status()
        .expect("running mirror-bench");
    assert!(
        status.success(),
        "mirror-bench --brokers kafka failed ({status})"
    );
    let text = std::fs::read_to_string(&out).expect("the results file");
    let run: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    let contenders: Vec<&str> = run["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["contender"].as_str().expect("a contender"))
        .collect();
    assert_eq!(
        contenders,
        [
            "consume-only",
            "produce-only",
            "mirror",
            "mirror-batches",
            "mm1",
            "mm2",
            "mm1-tuned",
            "batched-loop"
        ]
    );
    for r in run["results"].as_array().expect("results") {
        assert_eq!(r["records"], 3000, "{r}");
        let limit = r["contender"] == "consume-only" || r["contender"] == "produce-only";
        if !limit {
            assert_eq!(r["latency_records"], 100, "{r}");
        }
        // The brokers' CPU over the copy: always for a limit (its whole run); for a mirror
        // only when a poll saw its records arrive, which so small a backlog may not give.
        let cpu = &r["brokers_cpu"];
        if limit {
            assert!(
                cpu.is_object(),
                "a limit's result without its brokers' CPU: {r}"
            );
        }
        if cpu.is_object() {
            let secs = |k: &str| cpu[k].as_f64().unwrap_or_else(|| panic!("{k} in {cpu}"));
            assert!(secs("window_secs") > 0.0, "{r}");
            assert!(
                secs("source_secs") >= 0.0 && secs("target_secs") >= 0.0,
                "{r}"
            );
            // The machine's busy time includes the brokers' (ticks are 10 ms: some slack).
            assert!(
                secs("machine_secs") + 0.05 >= secs("source_secs") + secs("target_secs"),
                "the machine was busy for less than its two brokers: {r}"
            );
        }
    }
}
