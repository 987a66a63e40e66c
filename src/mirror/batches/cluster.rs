//! One cluster as the batch engine sees it: bootstrapped from the `bootstrap.servers` of a
//! client config, the leader of each partition from Metadata, one [`Connection`] per broker,
//! made when first needed (over TLS and with SASL as the config's `security.protocol` says)
//! and dropped when it fails. A caller that gets
//! NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION or a lost
//! connection calls [`Cluster::refresh`] and tries again. A refresh asks one broker after
//! another until one answers, all within one request timeout.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, FetchRequest, InitProducerIdRequest, ListOffsetsRequest, MetadataRequest,
    ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::sasl::Sasl;
use super::tls::{Tls, TlsError};
use super::wire::{error_name, Connection, Dial, WireError};
use crate::settings::client::ClientProps;
use crate::settings::wire_security::wire_security;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    #[error("the {role} config has no bootstrap.servers; set it")]
    NoBootstrap { role: &'static str },
    #[error("{0} in the {1}: --copy.mode batches cannot serve it; use --copy.mode records")]
    Security(String, &'static str),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("no {role} broker answered Metadata (tried {tried}): {last}")]
    Unreachable {
        role: &'static str,
        tried: String,
        last: String,
    },
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("{role} broker {broker} is in no Metadata answer; the cluster changed, refreshing")]
    UnknownBroker { role: &'static str, broker: i32 },
}

/// The partitions' leaders and the brokers' connections of one cluster.
pub(crate) struct Cluster {
    role: &'static str,
    bootstrap: Vec<String>,
    dial: Dial,
    brokers: HashMap<i32, String>,
    /// Per broker and lane: a Produce round goes out on up to
    /// [`LANES`](super::producer::LANES) connections to a broker; everything else uses lane 0.
    connections: HashMap<(i32, usize), Connection>,
    leaders: HashMap<(String, i32), (i32, i32)>,
    /// Topics the latest Metadata answer said do not exist (UNKNOWN_TOPIC_OR_PARTITION), and
    /// since when: a target topic deleted while running.
    missing_since: HashMap<String, Instant>,
    /// How many partitions each topic has, as the latest Metadata answer for it said.
    partition_counts: HashMap<String, i32>,
}

impl Cluster {
    /// The cluster that `props` (a consumer's or producer's config) points at.
    pub(crate) fn new(
        role: &'static str,
        props: &ClientProps,
        timeout: Duration,
    ) -> Result<Cluster, ClusterError> {
        let security = wire_security(props)
            .map_err(|reason| ClusterError::Security(reason, props.role.config()))?;
        let bootstrap: Vec<String> = props
            .get("bootstrap.servers")
            .or_else(|| props.get("metadata.broker.list"))
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim())
            .map(|s| strip_scheme(s).to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if bootstrap.is_empty() {
            return Err(ClusterError::NoBootstrap { role });
        }
        let dial = Dial {
            role,
            config: props.role.config(),
            client_id: props.get("client.id").unwrap_or("mirror-maker").to_owned(),
            timeout,
            tls: if security.protocol.tls() {
                Some(Tls::new(props)?)
            } else {
                None
            },
            sasl: security.mechanism.map(|m| Sasl::new(m, props)),
        };
        Ok(Cluster {
            role,
            bootstrap,
            dial,
            brokers: HashMap::new(),
            connections: HashMap::new(),
            leaders: HashMap::new(),
            missing_since: HashMap::new(),
            partition_counts: HashMap::new(),
        })
    }

    /// Asks for the leaders of `topics` (all partitions) and the brokers, from any broker
    /// that answers: a known one first, then the bootstrap list; within one request timeout.
    pub(crate) fn refresh(&mut self, topics: &[&str]) -> Result<(), ClusterError> {
        self.refresh_by(topics, Instant::now() + self.dial.timeout)
    }

    /// As [`refresh`](Self::refresh), giving up at `deadline` (a release's, which every wait
    /// within it shares).
    pub(crate) fn refresh_by(
        &mut self,
        topics: &[&str],
        deadline: Instant,
    ) -> Result<(), ClusterError> {
        let request = MetadataRequest::default()
            .with_topics(Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string((*t).to_owned()))))
                    })
                    .collect(),
            ))
            .with_allow_auto_topic_creation(false);
        let mut candidates: Vec<String> = self.brokers.values().cloned().collect();
        candidates.extend(self.bootstrap.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|a| seen.insert(a.clone()));
        // One deadline for the whole refresh: brokers that do not answer must not hold the
        // stream (and its consumer's polls) one timeout each.
        let mut last = String::from("nothing tried");
        for address in &candidates {
            if Instant::now() >= deadline {
                last = format!("{last}; no time left within the request timeout");
                break;
            }
            let mut conn = match Connection::connect(address, &self.dial, deadline) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let response = match conn
                .send(&request)
                .and_then(|()| conn.receive_by::<MetadataRequest>(deadline))
            {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            self.brokers = response
                .brokers
                .iter()
                .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
                .collect();
            self.connections
                .retain(|(id, _), c| self.brokers.get(id).is_some_and(|a| a == c.broker()));
            for t in &response.topics {
                let Some(name) = &t.name else { continue };
                let name = name.0.as_str().to_owned();
                if t.error_code != 0 {
                    tracing::debug!(
                        "{} topic {name}: Metadata says {}",
                        self.role,
                        error_name(t.error_code)
                    );
                    self.leaders.retain(|(topic, _), _| *topic != name);
                    self.partition_counts.remove(&name);
                    if t.error_code == UNKNOWN_TOPIC_OR_PARTITION {
                        self.missing_since.entry(name).or_insert_with(Instant::now);
                    }
                    continue;
                }
                self.missing_since.remove(&name);
                self.partition_counts
                    .insert(name.clone(), t.partitions.len() as i32);
                for p in &t.partitions {
                    let key = (name.clone(), p.partition_index);
                    if p.error_code == 0 && p.leader_id.0 >= 0 {
                        self.leaders.insert(key, (p.leader_id.0, p.leader_epoch));
                    } else {
                        self.leaders.remove(&key);
                    }
                }
            }
            return Ok(());
        }
        Err(ClusterError::Unreachable {
            role: self.role,
            tried: candidates.join(","),
            last,
        })
    }

    /// Since when Metadata has said `topic` does not exist (`None`: it was found, or never
    /// asked for).
    pub(crate) fn missing_since(&self, topic: &str) -> Option<Instant> {
        self.missing_since.get(topic).copied()
    }

    /// Whether the latest Metadata answer for `topic` listed fewer partitions than
    /// `partition + 1`: the topic exists but has no such partition (not merely no leader).
    pub(crate) fn lacks_partition(&self, topic: &str, partition: i32) -> bool {
        self.partition_counts
            .get(topic)
            .is_some_and(|count| partition >= *count)
    }

    /// How long one request may take (`request.timeout.ms`).
    pub(crate) fn timeout(&self) -> Duration {
        self.dial.timeout
    }

    /// The leader of a partition and its epoch, as last known.
    pub(crate) fn leader(&self, topic: &str, partition: i32) -> Option<(i32, i32)> {
        self.leaders.get(&(topic.to_owned(), partition)).copied()
    }

    /// The connection to a broker, made if there is none.
    pub(crate) fn connection(&mut self, broker: i32) -> Result<&mut Connection, ClusterError> {
        self.lane_by(broker, 0, Instant::now() + self.dial.timeout)
    }

    /// The connection of `lane` to a broker, a new one made by `deadline` or not at all (a
    /// round connecting to several brokers and lanes waits for them together).
    pub(crate) fn lane_by(
        &mut self,
        broker: i32,
        lane: usize,
        deadline: Instant,
    ) -> Result<&mut Connection, ClusterError> {
        let key = (broker, lane);
        if self
            .connections
            .get(&key)
            .is_some_and(Connection::due_for_renewal)
        {
            self.connections.remove(&key);
        }
        if !self.connections.contains_key(&key) {
            let address = self
                .brokers
                .get(&broker)
                .ok_or(ClusterError::UnknownBroker {
                    role: self.role,
                    broker,
                })?;
            let conn = Connection::connect(address, &self.dial, deadline)?;
            self.connections.insert(key, conn);
        }
        Ok(self.connections.get_mut(&key).expect("inserted above"))
    }

    /// Drops a broker's connections, every lane (after one failed, or with answers still
    /// owed on it).
    pub(crate) fn drop_connection(&mut self, broker: i32) {
        self.connections.retain(|(b, _), _| *b != broker);
    }

    /// Drops one lane's connection to a broker (it failed, or an answer is still owed on it).
    pub(crate) fn drop_lane(&mut self, broker: i32, lane: usize) {
        self.connections.remove(&(broker, lane));
    }

    /// Any broker known, for requests that any broker answers (InitProducerId).
    pub(crate) fn any_broker(&mut self) -> Result<i32, ClusterError> {
        if self.brokers.is_empty() {
            self.refresh(&[])?;
        }
        self.brokers
            .keys()
            .min()
            .copied()
            .ok_or(ClusterError::Unreachable {
                role: self.role,
                tried: self.bootstrap.join(","),
                last: "Metadata listed no broker".to_owned(),
            })
    }
}

/// Why the batch engine cannot speak to the source's or the target's brokers, if it cannot:
/// asked once at start, so that `--copy.mode auto` copies records instead (and
/// `--copy.mode batches` stops with the reason) where a broker does not speak the engine's
/// requests: older than Kafka 2.5, librdkafka's mock cluster (no ApiVersions v3), a broker
/// that is not Kafka, TLS or SASL the engine's own connections cannot make.
///
/// One broker of each cluster is asked (the first bootstrap address that answers), both
/// clusters at once, within `wait`. A broker that cannot be reached or does not answer in time
/// is no reason: librdkafka's probe has just reached the cluster, and the engine rides out
/// such failures as it does while running.
pub(crate) fn unspoken(
    source: &ClientProps,
    target: &ClientProps,
    wait: Duration,
) -> Option<String> {
    let (source, target) = std::thread::scope(|s| {
        let target = s.spawn(|| speaks("target", target, wait, TARGET_APIS, metadata));
        let source = speaks("source", source, wait, SOURCE_APIS, |conn| {
            metadata(conn)?;
            // No partitions, no wait: an answer the engine can read (tansu 0.6 answers Fetch
            // v12 with a field of v16, which the engine cannot decode).
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_min_bytes(0)
                .with_session_id(0)
                .with_session_epoch(-1);
            conn.call(&request).map(drop)
        });
        (source, target.join().unwrap_or(Ok(())))
    });
    source.and(target).err()
}

/// The requests the engine sends to one cluster: name, the version a connection would use,
/// and the lowest version the engine accepts for it there.
type Apis = &'static [(&'static str, fn(&Connection) -> Result<i16, WireError>, i16)];

/// The version of `R` a connection would send.
fn version_of<R: kafka_protocol::protocol::Request>(conn: &Connection) -> Result<i16, WireError> {
    conn.version::<R>()
}

const SOURCE_APIS: Apis = &[
    ("Metadata", version_of::<MetadataRequest>, 0),
    ("ListOffsets", version_of::<ListOffsetsRequest>, 0),
    ("Fetch", version_of::<FetchRequest>, 0),
];

/// InitProducerId from v3 (KIP-360, Kafka 2.5): a broker that forgot the producer (its
/// records expired) lets it go on; before it, UNKNOWN_PRODUCER_ID stops the engine's producer.
const TARGET_APIS: Apis = &[
    ("Metadata", version_of::<MetadataRequest>, 0),
    ("InitProducerId", version_of::<InitProducerIdRequest>, 3),
    ("Produce", version_of::<ProduceRequest>, 0),
];

/// A Metadata request for no topic, as a refresh sends (the answer must be readable).
fn metadata(conn: &mut Connection) -> Result<(), WireError> {
    let request = MetadataRequest::default()
        .with_topics(Some(Vec::new()))
        .with_allow_auto_topic_creation(false);
    conn.call(&request).map(drop)
}

/// `Err(reason)` if the first broker of `props`' bootstrap list that answers does not speak
/// every one of `apis`, or cannot answer `tries` in a way the engine reads.
fn speaks(
    role: &'static str,
    props: &ClientProps,
    wait: Duration,
    apis: Apis,
    tries: impl Fn(&mut Connection) -> Result<(), WireError>,
) -> Result<(), String> {
    let cluster = Cluster::new(role, props, wait).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + wait;
    for address in &cluster.bootstrap {
        let refused = |e: &dyn std::fmt::Display| format!("the {role} cluster: {e}");
        match Connection::connect(address, &cluster.dial, deadline) {
            Ok(mut conn) => {
                for (name, version, lowest) in apis {
                    match version(&conn) {
                        Err(e) => return Err(refused(&e)),
                        Ok(v) if v < *lowest => {
                            return Err(refused(&format!(
                                "broker {address} speaks {name} up to v{v}, this engine needs \
                                 v{lowest} or later"
                            )))
                        }
                        Ok(_) => {}
                    }
                }
                return match tries(&mut conn) {
                    Ok(()) | Err(WireError::Io { .. }) => Ok(()),
                    Err(e) => Err(refused(&e)),
                };
            }
            // Not reached, or no answer in time: another broker may answer.
            Err(WireError::Io { .. }) => continue,
            Err(e) => return Err(refused(&e)),
        }
    }
    Ok(())
}

/// A bootstrap address without its listener scheme (`SASL_SSL://host:port`), as librdkafka
/// reads it.
fn strip_scheme(address: &str) -> &str {
    address.split_once("://").map_or(address, |(_, rest)| rest)
}

/// Kafka's error code for a topic or partition the broker does not have.
pub(crate) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// Whether a partition error means the leader moved (refresh the metadata and try again).
pub(crate) fn leader_moved(code: i16) -> bool {
    // NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION,
    // FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_ENOUGH_REPLICAS(_AFTER_APPEND) are
    // transient too but do not mean a move; REPLICA_NOT_AVAILABLE, KAFKA_STORAGE_ERROR.
    matches!(code, 6 | 5 | 3 | 74 | 75 | 9 | 56)
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::{ApiVersionsResponse, ResponseHeader};
    use kafka_protocol::protocol::Encodable;

    use super::*;
    use crate::settings::client::Role;

    /// A broker that answers one ApiVersions request with `apis` (key, min, max), then hangs
    /// up: enough for [`speaks`] to judge it.
    fn fake_broker(apis: &'static [(i16, i16, i16)]) -> String {
        let answer = move |request: &[u8]| {
            // The request header v2: api key, version, then the correlation id.
            let correlation = i32::from_be_bytes(request[4..8].try_into().expect("4 bytes"));
            let response = ApiVersionsResponse::default().with_api_keys(
                apis.iter()
                    .map(|&(key, min, max)| {
                        ApiVersion::default()
                            .with_api_key(key)
                            .with_min_version(min)
                            .with_max_version(max)
                    })
                    .collect(),
            );
            let mut body = BytesMut::new();
            // ApiVersions answers with response header v0 at every version.
            ResponseHeader::default()
                .with_correlation_id(correlation)
                .encode(&mut body, 0)
                .expect("a header");
            response.encode(&mut body, 3).expect("a body");
            let mut frame = BytesMut::new();
            frame.put_i32(body.len() as i32);
            frame.extend_from_slice(&body);
            frame.to_vec()
        };
        crate::mirror::batches::wire::fake::one_answer(answer, Duration::ZERO)
    }

    fn target_at(address: &str) -> ClientProps {
        ClientProps::from_pairs(Role::Producer, "p.toml", [("bootstrap.servers", address)])
    }

    /// A fake target broker with `apis`, and why [`speaks`] refuses it as a target (nothing is
    /// tried on a broker whose versions do not do).
    fn refused_target(apis: &'static [(i16, i16, i16)]) -> (String, String) {
        let address = fake_broker(apis);
        let reason = speaks(
            "target",
            &target_at(&address),
            Duration::from_secs(5),
            TARGET_APIS,
            |_| panic!("something was tried on a broker whose versions do not do"),
        )
        .expect_err("the broker is refused");
        (address, reason)
    }

    /// ApiVersions 18, Metadata 3, InitProducerId 22, Produce 0.
    const KAFKA_2_4: &[(i16, i16, i16)] = &[(18, 0, 3), (3, 0, 9), (22, 0, 2), (0, 0, 8)];

    #[test]
    fn a_target_without_init_producer_id_v3_is_named_with_the_version_it_speaks() {
        let (address, reason) = refused_target(KAFKA_2_4);
        for needle in [
            "the target cluster",
            &address,
            "InitProducerId up to v2",
            "v3",
        ] {
            assert!(reason.contains(needle), "{needle:?} not in {reason}");
        }
    }

    #[test]
    fn a_broker_without_an_api_the_engine_sends_is_named_with_that_api() {
        // Kafka 2.8's versions, but no Produce at all.
        let (_, reason) = refused_target(&[(18, 0, 3), (3, 0, 11), (22, 0, 4)]);
        for needle in ["the target cluster", "Produce", "none"] {
            assert!(reason.contains(needle), "{needle:?} not in {reason}");
        }
    }

    #[test]
    fn a_broker_that_cannot_be_reached_is_no_reason_to_copy_records() {
        // A port nothing listens on: the probe found the cluster a moment ago, so a refused
        // connection now is a passing failure the engine rides out.
        let address = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
            listener.local_addr().expect("its address").to_string()
        };
        let spoken = speaks(
            "target",
            &target_at(&address),
            Duration::from_secs(2),
            TARGET_APIS,
            metadata,
        );
        assert_eq!(spoken, Ok(()));
    }

    #[test]
    fn a_refresh_ends_at_its_deadline_not_a_request_timeout_later() {
        // A broker that takes connections and never answers: ApiVersions waits.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
        let address = listener.local_addr().expect("its address").to_string();
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().take(4).collect();
            std::thread::sleep(Duration::from_secs(30));
            drop(held);
        });
        let mut cluster =
            Cluster::new("target", &target_at(&address), Duration::from_secs(10)).unwrap();
        let started = Instant::now();
        let refreshed = cluster.refresh_by(&["t"], started + Duration::from_millis(300));
        assert!(refreshed.is_err());
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "a refresh with 300 ms left took {took:?} (the request timeout is 10 s)"
        );
    }
}
