//! Timestamp bounds: a target whose brokers or topics accept a narrower range of record
//! timestamps than the source's refuses records the source took (INVALID_TIMESTAMP, or
//! INVALID_RECORD from Kafka 4), and with `--abort.on.send.failure true` the mirror then stops
//! at the same record on every restart. `check` compares the bounds of both clusters
//! ([`compare`]); a refusal's message names them ([`refusal_advice`]).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, Producer};

use crate::settings::client::ClientProps;

/// The bounds, as (broker default, topic override): how far before and after the broker's
/// clock a record's CreateTime may be. `difference` is the one setting before Kafka 3.6
/// (KIP-937 split it), removed in Kafka 4.
pub const BOUNDS: [(&str, &str); 3] = [
    (
        "log.message.timestamp.before.max.ms",
        "message.timestamp.before.max.ms",
    ),
    (
        "log.message.timestamp.after.max.ms",
        "message.timestamp.after.max.ms",
    ),
    (
        "log.message.timestamp.difference.max.ms",
        "message.timestamp.difference.max.ms",
    ),
];

/// What to say about a record the target refused as invalid: which settings bound its
/// timestamp, and what to do. `age_ms` is how old the record's timestamp was when it was
/// refused (negative: in the future), if it had one.
pub fn refusal_advice(target_topic: &str, age_ms: Option<i64>) -> String {
    let age = match age_ms {
        Some(ms) if ms >= 0 => format!("the record's timestamp was {} old", human_ms(ms)),
        Some(ms) => format!("the record's timestamp was {} ahead", human_ms(-ms)),
        None => "the record's timestamp is not known here".to_owned(),
    };
    format!(
        "{age}; the source took it, so the target topic {target_topic} likely bounds \
         timestamps more tightly: its message.timestamp.before.max.ms or \
         message.timestamp.after.max.ms (broker defaults log.message.timestamp.before.max.ms \
         and log.message.timestamp.after.max.ms; message.timestamp.difference.max.ms before \
         Kafka 3.6). Raise them on the target topic to at least the source's (kafka-configs \
         --alter --entity-type topics --entity-name {target_topic} --add-config \
         message.timestamp.before.max.ms=...), or mirror past it with --abort.on.send.failure \
         false (the record is dropped); `mirror-maker check` compares both clusters' settings"
    )
}

fn human_ms(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// The bound values (`BOUNDS`' names of one column) a config answer holds.
type Values = HashMap<String, i64>;

fn admin(props: &ClientProps) -> Result<AdminClient<DefaultClientContext>, String> {
    props
        .connection_config()
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|e| format!("{}: {e}", props.path.display()))
}

/// DescribeConfigs of `resources` on one cluster, the bound values of each (in order).
fn describe(
    admin: &AdminClient<DefaultClientContext>,
    resources: &[ResourceSpecifier<'_>],
    timeout: Duration,
) -> Result<Vec<Result<Values, String>>, String> {
    let runtime = crate::native::runtime().map_err(|e| e.to_string())?;
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let answers = runtime
        .block_on(admin.describe_configs(resources, &opts))
        .map_err(|e| e.to_string())?;
    Ok(answers
        .into_iter()
        .map(|answer| {
            answer.map_err(|code| code.to_string()).map(|resource| {
                resource
                    .entries
                    .into_iter()
                    .filter(|e| BOUNDS.iter().any(|(b, t)| e.name == *b || e.name == *t))
                    .filter_map(|e| Some((e.name, e.value?.trim().parse().ok()?)))
                    .collect()
            })
        })
        .collect())
}

/// The bound values of one broker of the cluster `props` reaches (the first it lists).
fn broker_bounds(
    props: &ClientProps,
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> Result<Values, String> {
    let client = props
        .connection_config()
        .create::<BaseProducer>()
        .map_err(|e| e.to_string())?;
    let metadata = client
        .client()
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let broker = metadata
        .brokers()
        .first()
        .ok_or("the cluster lists no broker")?
        .id();
    let mut answers = describe(admin, &[ResourceSpecifier::Broker(broker)], timeout)?;
    answers.pop().ok_or("no answer for the broker")?
}

/// A tighter bound on the target than on the source: `warning:` lines naming the setting, the
/// topic (topic level) and both values; where a cluster did not say, a line saying what was
/// not checked. `topics` pairs each mirrored source topic with its target topic, for those
/// whose target topic exists (topic-level values are the effective ones: an override or the
/// broker default).
pub fn compare(
    source: &ClientProps,
    target: &ClientProps,
    topics: &[(String, String)],
    timeout: Duration,
) -> Vec<String> {
    let mut lines = Vec::new();
    let (source_admin, target_admin) = match (admin(source), admin(target)) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            return vec![format!("timestamp bounds: not checked ({e})")];
        }
    };
    let brokers = std::thread::scope(|s| {
        let t = s.spawn(|| broker_bounds(target, &target_admin, timeout));
        let src = broker_bounds(source, &source_admin, timeout);
        (src, t.join().unwrap_or_else(|_| Err("panicked".to_owned())))
    });
    match brokers {
        (Ok(s), Ok(t)) => {
            for (broker_key, _) in BOUNDS {
                if let Some(line) = tighter(&s, &t, broker_key, "the target brokers'", "") {
                    lines.push(line);
                }
            }
        }
        // A cluster that does not describe its brokers' configs (librdkafka's mock cluster
        // does not answer DescribeConfigs) will not describe its topics' either: one wait.
        (Err(e), _) => {
            lines.push(format!(
                "timestamp bounds: not checked (the source did not describe a broker's \
                 configs: {})",
                source.redact(&e)
            ));
            return lines;
        }
        (_, Err(e)) => {
            lines.push(format!(
                "timestamp bounds: not checked (the target did not describe a broker's \
                 configs: {})",
                target.redact(&e)
            ));
            return lines;
        }
    }
    if topics.is_empty() {
        return lines;
    }
    let source_specs: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|(s, _)| ResourceSpecifier::Topic(s))
        .collect();
    let target_specs: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|(_, t)| ResourceSpecifier::Topic(t))
        .collect();
    let (s, t) = std::thread::scope(|scope| {
        let t = scope.spawn(|| describe(&target_admin, &target_specs, timeout));
        let s = describe(&source_admin, &source_specs, timeout);
        (s, t.join().unwrap_or_else(|_| Err("panicked".to_owned())))
    });
    let (s, t) = match (s, t) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            lines.push(format!(
                "timestamp bounds: topics not checked ({})",
                target.redact(&e)
            ));
            return lines;
        }
    };
    for ((source_topic, target_topic), (s, t)) in topics.iter().zip(s.into_iter().zip(t)) {
        let (Ok(s), Ok(t)) = (s, t) else {
            lines.push(format!(
                "timestamp bounds of {source_topic} -> {target_topic}: not checked (a cluster \
                 did not describe the topic)"
            ));
            continue;
        };
        for (_, topic_key) in BOUNDS {
            let whose = format!("target topic {target_topic}'s");
            let of_source = format!(" of source topic {source_topic}");
            if let Some(line) = tighter(&s, &t, topic_key, &whose, &of_source) {
                lines.push(line);
            }
        }
    }
    lines
}

/// A `warning:` line when the target's `key` is below the source's.
fn tighter(source: &Values, target: &Values, key: &str, whose: &str, of: &str) -> Option<String> {
    let (&s, &t) = (source.get(key)?, target.get(key)?);
    (t < s).then(|| {
        format!(
            "warning: {whose} {key} is {t}, tighter than the {s}{of} on the source: records \
             the source took whose timestamps lie further from the target's clock are refused \
             (INVALID_TIMESTAMP or INVALID_RECORD), which stops the mirror at the same record \
             on every restart under --abort.on.send.failure true; raise it on the target to \
             at least {s}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tighter_target_value_is_warned_about_with_both_values() {
        let source: Values = [("message.timestamp.before.max.ms".to_owned(), i64::MAX)].into();
        let target: Values = [("message.timestamp.before.max.ms".to_owned(), 60_000)].into();
        let key = "message.timestamp.before.max.ms";
        let line = tighter(&source, &target, key, "target topic t's", "").unwrap();
        assert!(
            line.starts_with("warning:") && line.contains("60000"),
            "{line}"
        );
        assert!(line.contains(&i64::MAX.to_string()), "{line}");
        assert_eq!(
            tighter(&target, &source, key, "x", ""),
            None,
            "looser: no warning"
        );
        assert_eq!(
            tighter(&source, &Values::new(), key, "x", ""),
            None,
            "unknown"
        );
    }

    #[test]
    fn the_refusal_advice_names_the_settings_and_the_age() {
        let advice = refusal_advice("orders", Some(3_600_000));
        assert!(advice.contains("60 min old"), "{advice}");
        for key in [
            "message.timestamp.before.max.ms",
            "message.timestamp.after.max.ms",
            "log.message.timestamp.before.max.ms",
        ] {
            assert!(advice.contains(key), "{key} not in {advice}");
        }
    }
}
