//! Asking a cluster what it has: the one probe of each cluster at start-up (used by the
//! mirror and by `check`), and the source's matching topics (at start-up and on every
//! refresh).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use super::clients::{self, Cluster};
use crate::settings::client::ClientProps;
use crate::settings::routing::TopicFilter;
use crate::settings::Settings;

/// A cluster that did not answer within `--startup.timeout.ms`, or refused the mirror's
/// credentials.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("cannot reach the {} cluster (bootstrap.servers = {servers}) within {timeout:?}: {reason}. Check the address in {config} and that the brokers are up", cluster.name())]
    Silent {
        cluster: Cluster,
        servers: String,
        config: String,
        timeout: Duration,
        /// librdkafka's reason, secrets redacted.
        reason: String,
    },
    /// A broker answered but the connection failed its security handshake: SASL
    /// authentication or TLS. Retrying does not help, so it is reported at once.
    #[error("the {} cluster (bootstrap.servers = {servers}) refused the connection: {reason}. Check the security settings (security.protocol, sasl.*, ssl.*) in {config}", cluster.name())]
    Refused {
        cluster: Cluster,
        servers: String,
        config: String,
        /// What failed and librdkafka's reason, secrets redacted.
        reason: String,
    },
}

impl Unreachable {
    fn silent(
        props: &ClientProps,
        cluster: Cluster,
        timeout: Duration,
        reason: &str,
    ) -> Unreachable {
        Unreachable::Silent {
            cluster,
            servers: servers(props),
            config: props.path.display().to_string(),
            timeout,
            reason: props.redact(reason),
        }
    }

    fn refused(props: &ClientProps, cluster: Cluster, reason: &str) -> Unreachable {
        Unreachable::Refused {
            cluster,
            servers: servers(props),
            config: props.path.display().to_string(),
            reason: props.redact(reason),
        }
    }
}

fn servers(props: &ClientProps) -> String {
    props
        .get("bootstrap.servers")
        .unwrap_or_default()
        .to_owned()
}

fn props_of(settings: &Settings, cluster: Cluster) -> &ClientProps {
    match cluster {
        Cluster::Source => &settings.consumer,
        Cluster::Target => &settings.producer,
    }
}

/// The probe client's context: keeps the first security handshake failure librdkafka reports
/// (an error event with its reason) and the last other error (the best reason when the
/// cluster never answers: "SSL handshake failed: ...", "Connection refused"), and passes librdkafka's log lines on at debug level (the
/// probe's outcome is the one line that matters).
struct ProbeContext {
    cluster: Cluster,
    refusal: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
}

/// Whether an error a client reports means the cluster refused the connection's security
/// handshake (a wrong password, an untrusted or missing certificate): retrying does not help.
/// A broker that rejects a client certificate under TLS 1.3 does so after the handshake, with
/// an alert that librdkafka reports as a transport failure ("... ssl/tls alert bad
/// certificate: SSL alert number 42"): an alert is the peer's verdict, not a network fault.
pub(crate) fn is_refusal(code: Option<RDKafkaErrorCode>, reason: &str) -> bool {
    match code {
        Some(
            RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL,
        ) => true,
        Some(RDKafkaErrorCode::BrokerTransportFailure) => reason.contains("SSL alert number"),
        _ => false,
    }
}

/// How a refusal reads: what failed, then librdkafka's reason.
pub(crate) fn describe_refusal(code: Option<RDKafkaErrorCode>, reason: &str) -> String {
    let what = match code {
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
            "authentication failed"
        }
        _ => "TLS handshake failed",
    };
    format!("{what}: {reason}")
}

impl ClientContext for ProbeContext {
    fn log(&self, _level: RDKafkaLogLevel, facility: &str, message: &str) {
        clients::librdkafka_log(self.cluster, RDKafkaLogLevel::Debug, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if is_refusal(code, reason) {
            let mut refusal = self.refusal.lock().unwrap_or_else(|e| e.into_inner());
            refusal.get_or_insert_with(|| describe_refusal(code, reason));
        } else {
            tracing::debug!(cluster = self.cluster.name(), "probe: {reason}");
            if code == Some(RDKafkaErrorCode::AllBrokersDown) {
                return; // says less than the broker's own error before it
            }
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_owned());
        }
    }
}

impl ProducerContext for ProbeContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// The metadata of every topic of `cluster`, waiting at most `--startup.timeout.ms`; a
/// security handshake failure ends the wait at once. The client is made from the connection
/// settings only: it never joins the group.
pub(crate) fn probe(settings: &Settings, cluster: Cluster) -> Result<Metadata, Unreachable> {
    let props = props_of(settings, cluster);
    reach(props, cluster, settings.options.startup_timeout)
}

/// [`probe`] of the cluster `props` connects to, waiting at most `timeout` (for the tools,
/// which have their own timeout).
pub(crate) fn reach(
    props: &ClientProps,
    cluster: Cluster,
    timeout: Duration,
) -> Result<Metadata, Unreachable> {
    let config = props.connection_config();
    let context = ProbeContext {
        cluster,
        refusal: Mutex::new(None),
        last_error: Mutex::new(None),
    };
    let client: BaseProducer<ProbeContext> = config
        .create_with_context(context)
        .map_err(|e| Unreachable::silent(props, cluster, timeout, &e.to_string()))?;
    let deadline = Instant::now() + timeout;
    // Short waits first, so that a refusal (reported by an error event, served by `poll`
    // between the waits) ends the probe early; then longer ones, for clusters whose metadata
    // takes a while to answer (the connection made by the first wait is kept).
    let mut wait = Duration::from_millis(250);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let result = client.client().fetch_metadata(None, wait.min(left));
        client.poll(Duration::ZERO);
        let refusal = client
            .context()
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match (result, refusal) {
            (Ok(metadata), _) => return Ok(metadata),
            (Err(_), Some(refusal)) => return Err(Unreachable::refused(props, cluster, &refusal)),
            (Err(e), None) if Instant::now() >= deadline => {
                let last = client
                    .context()
                    .last_error
                    .lock()
                    .ok()
                    .and_then(|l| l.clone());
                let reason = match last {
                    Some(last) => format!("{e}; last error: {last}"),
                    None => e.to_string(),
                };
                return Err(Unreachable::silent(props, cluster, timeout, &reason));
            }
            (Err(_), None) => wait = (wait * 2).min(Duration::from_secs(4)),
        }
    }
}

/// The source's topics that `topics` selects, sorted.
pub(crate) fn matching_topics<X: ConsumerContext>(
    consumer: &BaseConsumer<X>,
    topics: &TopicFilter,
    timeout: Duration,
) -> KafkaResult<Vec<String>> {
    let metadata = consumer.fetch_metadata(None, timeout)?;
    Ok(topics
        .select(&metadata)
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// How long a metadata request for the topic list may take.
pub(crate) const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// For a stream's periodic refresh: the source's topics that `topics` selects now, or `None`
/// (logged) when the source cannot be listed, the current subscription then being kept.
pub(crate) fn topics_to_follow<X: ConsumerContext>(
    consumer: &BaseConsumer<X>,
    topics: &TopicFilter,
    stream: usize,
) -> Option<Vec<String>> {
    match matching_topics(consumer, topics, METADATA_TIMEOUT) {
        Ok(topics) => Some(topics),
        Err(e) => {
            tracing::warn!(
                stream,
                "cannot list the source's topics: {e}; keeping the current subscription"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_from_network_faults() {
        let alert = "ssl://127.0.0.1:9093/bootstrap: Receive failed: error:0A000412:SSL \
                     routines::ssl/tls alert bad certificate: SSL alert number 42";
        let transport = Some(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(is_refusal(transport, alert));
        assert!(describe_refusal(transport, alert).starts_with("TLS handshake failed: "));
        assert!(!is_refusal(
            transport,
            "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
        ));
        let sasl = Some(RDKafkaErrorCode::Authentication);
        assert!(is_refusal(sasl, "SASL authentication error"));
        assert!(describe_refusal(sasl, "x").starts_with("authentication failed: "));
        assert!(!is_refusal(
            Some(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down"
        ));
    }
}
