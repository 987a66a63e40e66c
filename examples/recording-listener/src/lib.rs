//! Records every rebalance callback with its partitions, one line on stderr each (interleaved
//! with the mirror's own log, so the order of events can be read there), and in a file when
//! the args name one.
//!
//! Args: an optional file path to append to.
//!
//! `before_starting_fetchers` records the consumer's group member id as the broker gave it:
//! `rdkafka-<uuid>` on Kafka; librdkafka's mock cluster names members after a pointer
//! (`0x7f...`, rdkafka_mock_cgrp.c), so that is what the tests' logs show.

use std::io::Write;

use mirror_maker_plugin::{export_rebalance_listener, RebalanceListener};

pub struct Recorder {
    file: Option<std::fs::File>,
}

impl Recorder {
    fn record(&mut self, line: String) -> Result<(), String> {
        eprintln!("recording-listener: {line}");
        if let Some(f) = &mut self.file {
            writeln!(f, "{line}").map_err(|e| format!("cannot record: {e}"))?;
        }
        Ok(())
    }
}

fn list(partitions: &[(&str, i32)]) -> String {
    let items: Vec<String> = partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect();
    items.join(",")
}

impl RebalanceListener for Recorder {
    fn init(args: &str) -> Result<Self, String> {
        let file = match args.trim() {
            "" => None,
            path => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("cannot open {path}: {e}"))?,
            ),
        };
        Ok(Recorder { file })
    }

    fn before_releasing_partitions(&mut self, partitions: &[(&str, i32)]) -> Result<(), String> {
        self.record(format!("before_releasing_partitions {}", list(partitions)))
    }

    fn before_starting_fetchers(
        &mut self,
        consumer_id: &str,
        partitions: &[(&str, i32)],
    ) -> Result<(), String> {
        self.record(format!(
            "before_starting_fetchers {consumer_id} {}",
            list(partitions)
        ))
    }
}

export_rebalance_listener!(Recorder);
