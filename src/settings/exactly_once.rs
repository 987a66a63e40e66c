//! `--exactly.once true`: what it needs from the other flags and the configs, refused here with
//! the reason, and the transactional ids it makes.
//!
//! A message handler keeps its meaning: the records one source record becomes (none, one or
//! several) are produced in the same target transaction, so a `read_committed` reader sees all
//! of them or none; a filtered record is on the target zero times, by the handler's choice, and
//! the progress recorded in the store passes it like any other.
//!
//! `--partitioning hash` is allowed: a transaction is atomic across target partitions, and each
//! source partition is read by one stream at a time, in order, so each source record still lands
//! once and in source order within its target partition. Only offset translation is lost there
//! (a target partition fed by several source partitions), as in at-least-once mode.

use std::time::Duration;

use super::client::{ClientProps, DEFAULT_TRANSACTION_TIMEOUT_MS};
use super::flags::MirrorArgs;
use super::SettingsError;

/// The exactly-once mode's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactlyOnce {
    /// How long one target transaction collects records before it is committed.
    pub transaction_interval: Duration,
    /// The consumer's `group.id`, the first part of every transactional id.
    pub group_id: String,
    /// This instance's name (`--instance.id`, or the host name).
    pub instance_id: String,
    /// This run of the process: its start time (ms since the epoch) and process id, in hex.
    pub run: String,
}

impl ExactlyOnce {
    /// The transactional id of stream `stream` of this run: `<group.id>-<instance
    /// id>-<run>-<stream>`, and `.<incarnation>` after it once the stream has rejoined the
    /// group after losing its assignment. Unique per run and incarnation, so that a stream is
    /// never fenced by the owner that takes over the partitions of an earlier one (which may
    /// have the same instance id): the offset-mapping topic names the id that last committed
    /// each partition, and the next owner fences exactly that one.
    pub fn transactional_id(&self, stream: usize, incarnation: u32) -> String {
        let id = format!(
            "{}-{}-{}-{stream}",
            self.group_id, self.instance_id, self.run
        );
        match incarnation {
            0 => id,
            n => format!("{id}.{n}"),
        }
    }
}

/// What every transactional id of a mirror whose consumer has `group.id` `group_id` starts
/// with ([`ExactlyOnce::transactional_id`]): a progress record in the offset-mapping store
/// naming an id without it was not written by this mirror, and the id is not fenced.
pub fn transactional_id_prefix(group_id: &str) -> String {
    format!("{}-", group_id.trim())
}

/// A name for this run of the process: its start time in milliseconds and its process id.
fn this_run() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:x}{:x}", std::process::id())
}

/// The producer's `transactional.id` set by the user, refused in every mode: the mirror makes
/// its own (one per stream) with `--exactly.once true`, and a transactional producer that no
/// one initialises refuses every record.
pub fn refuse_user_transactional_id(producer: &ClientProps) -> Result<(), SettingsError> {
    match producer.get("transactional.id") {
        Some(id) => Err(SettingsError::Usage(format!(
            "producer config {}: transactional.id = {id:?} is not for the user to set: with \
             --exactly.once true the mirror makes one per stream and run (<group.id>-<instance \
             id>-<run>-<stream>; name the instance with --instance.id); remove the key",
            producer.path.display()
        ))),
        None => Ok(()),
    }
}

/// Checks what `--exactly.once true` needs before anything else is built, and returns its
/// settings; `None` when the mode is off. `host_name` is asked only when `--instance.id` is
/// absent.
pub fn from_args(
    args: &MirrorArgs,
    consumer: &ClientProps,
    producer: &ClientProps,
    host_name: impl FnOnce() -> Option<String>,
) -> Result<Option<ExactlyOnce>, SettingsError> {
    if !args.exactly_once {
        return Ok(None);
    }
    let refuse = |why: &str| Err(SettingsError::Usage(format!("--exactly.once true: {why}")));
    if !args.no_data_loss {
        return refuse(
            "--no.data.loss false lets settings that lose records through, and a lost record \
             is on the target zero times; drop --no.data.loss false or --exactly.once true",
        );
    }
    if !args.abort_on_send_failure {
        return refuse(
            "--abort.on.send.failure false skips a record the target refuses, and a skipped \
             record is on the target zero times; drop --abort.on.send.failure false or \
             --exactly.once true",
        );
    }
    if !args.offset_mapping {
        return refuse(
            "--offset.mapping false: each transaction records the source progress in the \
             offset-mapping topic, where the next owner of a partition resumes; drop \
             --offset.mapping false",
        );
    }
    if let Some(v) = producer.get("enable.idempotence") {
        if !v.trim().eq_ignore_ascii_case("true") {
            return refuse(&format!(
                "producer config {}: enable.idempotence = {v} (transactions need the \
                 idempotent producer); remove the key or set it to true",
                producer.path.display()
            ));
        }
    }
    refuse_user_transactional_id(producer)?;
    let group_id = consumer
        .get("group.id")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let instance_id = match &args.instance_id {
        Some(id) => id.trim().to_owned(),
        None => host_name().unwrap_or_default().trim().to_owned(),
    };
    if instance_id.is_empty() {
        return refuse(
            "no instance id: --instance.id is empty or absent and the host name cannot be \
             read; give each instance its own --instance.id NAME",
        );
    }
    if let Some(c) = instance_id
        .chars()
        .find(|c| c.is_control() || c.is_whitespace())
    {
        return refuse(&format!(
            "--instance.id {instance_id:?} contains {c:?}; use letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(Some(ExactlyOnce {
        transaction_interval: Duration::from_millis(args.transaction_interval_ms),
        group_id,
        instance_id,
        run: this_run(),
    }))
}

/// This machine's host name (`gethostname`, else `$HOSTNAME`). Not from
/// `/proc/sys/kernel/hostname`: the systemd unit's `ProcSubset=pid` hides it.
pub fn host_name() -> Option<String> {
    crate::native::host_name()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// The producer properties of a transactional stream: librdkafka refuses a transactional
/// producer whose `message.timeout.ms` is 0 (our no-data-loss default) or above
/// `transaction.timeout.ms`. Bounded here by the transaction timeout: a record that times out
/// fails its transaction, which is aborted and copied again, so nothing is lost.
/// `enable.gapless.guarantee` is left to the transaction too (a failed record aborts all of it).
pub fn producer_props(producer: &mut ClientProps) {
    let timeout = producer
        .get("transaction.timeout.ms")
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| DEFAULT_TRANSACTION_TIMEOUT_MS.to_string());
    producer.remove("delivery.timeout.ms");
    producer.set("message.timeout.ms", &timeout);
    producer.remove("enable.gapless.guarantee");
}

/// What this mode warns of at start, given the client configs: combinations that keep every
/// record once but cost a stopped instance or a rebalance.
pub fn warnings(consumer: &ClientProps, producer: &ClientProps) -> Vec<String> {
    let mut warnings = Vec::new();
    if !consumer.uses_kip_848_protocol() {
        warnings.push(
            "exactly once on the classic group protocol: in our rebalance-storm trials \
             librdkafka's cooperative-sticky assignor sometimes gave a live instance's \
             partitions to another without revoking them first; that instance is then fenced, \
             and its stream rejoins the group under a new transactional id (nothing is lost or \
             duplicated, the partitions it copied restart from their last commit and the \
             group rebalances again). On Kafka 4.0 or later set \
             group.protocol = \"consumer\" in the consumer config (KIP-848: the broker assigns)"
                .to_owned(),
        );
    }
    let max_poll = consumer.max_poll_interval().as_millis();
    let transaction = producer.transaction_timeout().as_millis();
    if max_poll < 3 * transaction {
        warnings.push(format!(
            "max.poll.interval.ms ({max_poll} ms, {}) is below three times \
             transaction.timeout.ms ({transaction} ms, {}): while the target cannot be \
             reached, a stream's flush, commit and abort may each wait that long without \
             serving the source group, which then takes its partitions away (they move, the \
             stream rejoins; nothing is lost or duplicated). Raise the first or lower the second",
            consumer.path.display(),
            producer.path.display(),
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::client::Role;
    use crate::settings::flags::Cli;
    use clap::Parser;

    fn args(extra: &[&str]) -> MirrorArgs {
        let mut argv = vec![
            "mirror-maker",
            "--consumer.config",
            "c.toml",
            "--producer.config",
            "p.toml",
            "--whitelist",
            "t",
            "--exactly.once",
            "true",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().mirror
    }

    fn check(extra: &[&str], producer: &[(&str, &str)]) -> Result<Option<ExactlyOnce>, String> {
        let consumer = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [("bootstrap.servers", "x:1"), ("group.id", "mirror")],
        );
        let mut pairs = vec![("bootstrap.servers", "y:1")];
        pairs.extend_from_slice(producer);
        let producer = ClientProps::from_pairs(Role::Producer, "p.toml", pairs);
        from_args(&args(extra), &consumer, &producer, || Some("host-a".into()))
            .map_err(|e| e.to_string())
    }

    fn refused(extra: &[&str], producer: &[(&str, &str)], needles: &[&str]) {
        let e = check(extra, producer).expect_err("refused");
        assert!(!e.contains('\n'), "one line: {e}");
        for n in needles {
            assert!(e.contains(n), "{n:?} in {e}");
        }
    }

    #[test]
    fn defaults_are_off_and_a_tenth_of_a_second() {
        let cli = Cli::try_parse_from([
            "mirror-maker",
            "--consumer.config",
            "c",
            "--producer.config",
            "p",
            "--whitelist",
            "t",
        ])
        .unwrap();
        assert!(!cli.mirror.exactly_once);
        assert_eq!(cli.mirror.transaction_interval_ms, 100);
    }

    #[test]
    fn every_id_starts_with_the_prefix_of_its_group() {
        let eo = check(&[], &[]).unwrap().unwrap();
        let prefix = transactional_id_prefix(&eo.group_id);
        assert!(eo.transactional_id(3, 2).starts_with(&prefix), "{prefix}");
        assert!(prefix.ends_with('-'), "{prefix}");
    }

    #[test]
    fn the_ids_are_group_instance_run_and_stream() {
        let eo = check(&[], &[]).unwrap().unwrap();
        assert_eq!(
            eo.transactional_id(3, 0),
            format!("mirror-host-a-{}-3", eo.run)
        );
        // After a lost assignment the stream rejoins under an id of its own.
        assert_eq!(
            eo.transactional_id(3, 2),
            format!("mirror-host-a-{}-3.2", eo.run)
        );
        assert!(eo.run.len() > 8 && eo.run.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(eo.transaction_interval, Duration::from_millis(100));
        let eo = check(
            &["--instance.id", "dc1-b", "--transaction.interval.ms", "250"],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            eo.transactional_id(0, 0),
            format!("mirror-dc1-b-{}-0", eo.run)
        );
        assert_eq!(eo.transaction_interval, Duration::from_millis(250));
    }

    #[test]
    fn settings_that_can_lose_a_record_are_refused() {
        refused(
            &["--no.data.loss", "false"],
            &[],
            &["--exactly.once true", "--no.data.loss false"],
        );
        refused(
            &["--abort.on.send.failure", "false"],
            &[],
            &["--exactly.once true", "--abort.on.send.failure false"],
        );
        refused(
            &["--offset.mapping", "false"],
            &[],
            &["--exactly.once true", "--offset.mapping false"],
        );
        refused(
            &[],
            &[("enable.idempotence", "false")],
            &["p.toml", "enable.idempotence = false"],
        );
    }

    #[test]
    fn a_transactional_id_of_the_users_is_refused() {
        refused(
            &[],
            &[("transactional.id", "mine")],
            &[
                "p.toml",
                "transactional.id",
                "--instance.id",
                "remove the key",
            ],
        );
    }

    #[test]
    fn an_instance_id_must_be_a_name() {
        refused(&["--instance.id", " "], &[], &["--instance.id"]);
        refused(&["--instance.id", "a b"], &[], &["--instance.id \"a b\""]);
    }

    #[test]
    fn the_message_timeout_is_bounded_by_the_transaction_timeout() {
        let mut p = ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [
                ("message.timeout.ms", "0"),
                ("enable.gapless.guarantee", "true"),
            ],
        );
        producer_props(&mut p);
        assert_eq!(p.get("message.timeout.ms"), Some("60000"));
        assert_eq!(p.get("enable.gapless.guarantee"), None);
        let mut p = ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [("transaction.timeout.ms", "20000")],
        );
        producer_props(&mut p);
        assert_eq!(p.get("message.timeout.ms"), Some("20000"));
    }

    #[test]
    fn the_classic_protocol_and_a_short_poll_interval_are_warned_of() {
        let consumer = |pairs: &[(&'static str, &'static str)]| {
            let mut all = vec![("bootstrap.servers", "x:1"), ("group.id", "mirror")];
            all.extend_from_slice(pairs);
            ClientProps::from_pairs(Role::Consumer, "c.toml", all)
        };
        let producer = |pairs: &[(&'static str, &'static str)]| {
            let mut all = vec![("bootstrap.servers", "y:1")];
            all.extend_from_slice(pairs);
            ClientProps::from_pairs(Role::Producer, "p.toml", all)
        };
        let kip_848 = consumer(&[("group.protocol", "consumer")]);
        // librdkafka's defaults: 300 s against 3 x 60 s.
        assert!(warnings(&kip_848, &producer(&[])).is_empty());
        let classic = warnings(&consumer(&[]), &producer(&[]));
        assert_eq!(classic.len(), 1);
        assert!(classic[0].contains("group.protocol = \"consumer\""));
        let short = warnings(
            &consumer(&[
                ("group.protocol", "consumer"),
                ("max.poll.interval.ms", "10000"),
            ]),
            &producer(&[]),
        );
        assert_eq!(short.len(), 1);
        for needle in [
            "max.poll.interval.ms (10000 ms, c.toml)",
            "(60000 ms, p.toml)",
        ] {
            assert!(short[0].contains(needle), "{needle:?} in {}", short[0]);
        }
        let shorter_transactions = producer(&[("transaction.timeout.ms", "3000")]);
        assert!(warnings(
            &consumer(&[
                ("group.protocol", "consumer"),
                ("max.poll.interval.ms", "10000")
            ]),
            &shorter_transactions
        )
        .is_empty());
    }

    #[test]
    fn off_means_nothing_is_checked() {
        let consumer = ClientProps::from_pairs(Role::Consumer, "c.toml", [("group.id", "g")]);
        let producer =
            ClientProps::from_pairs(Role::Producer, "p.toml", [("enable.idempotence", "false")]);
        let mut a = args(&[]);
        a.exactly_once = false;
        assert_eq!(from_args(&a, &consumer, &producer, || None).unwrap(), None);
    }
}
