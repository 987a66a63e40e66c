//! The security of the batch engine's own connections (`--copy.mode batches`), read from the
//! same librdkafka keys of the same client config as the record engine's: `security.protocol`,
//! the `ssl.*` keys of TLS and the `sasl.*` keys of PLAIN and SCRAM. What the engine cannot
//! honour is a refusal naming the key, never a key silently ignored. Only the keys are read
//! here; the files they name are read when the engine connects (`mirror::batches::tls`).

use super::client::ClientProps;

/// `security.protocol`, as librdkafka names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl Protocol {
    pub fn tls(self) -> bool {
        matches!(self, Protocol::Ssl | Protocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, Protocol::SaslPlaintext | Protocol::SaslSsl)
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Plaintext => "PLAINTEXT",
            Protocol::Ssl => "SSL",
            Protocol::SaslPlaintext => "SASL_PLAINTEXT",
            Protocol::SaslSsl => "SASL_SSL",
        }
    }
}

/// The SASL mechanisms the batch engine speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// What one client config asks of the batch engine's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireSecurity {
    pub protocol: Protocol,
    /// With SASL_PLAINTEXT and SASL_SSL.
    pub mechanism: Option<Mechanism>,
}

/// The `ssl.*` keys the batch engine honours (with SSL and SASL_SSL); any other `ssl.*` key
/// set in a TLS config is refused.
pub const TLS_KEYS: &[&str] = &[
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.sigalgs.list",
];

/// The keys outside `ssl.*` that change TLS in librdkafka and that the engine honours.
const TLS_OTHER_KEYS: &[&str] = &["enable.ssl.certificate.verification"];

/// What the batch engine's connections need from `props`, or the reason it cannot serve
/// them (naming the key and its value, never a secret's value).
pub fn wire_security(props: &ClientProps) -> Result<WireSecurity, String> {
    let protocol = match props.get("security.protocol").map(str::to_ascii_uppercase) {
        None => Protocol::Plaintext,
        Some(p) => match p.as_str() {
            "PLAINTEXT" => Protocol::Plaintext,
            "SSL" => Protocol::Ssl,
            "SASL_PLAINTEXT" => Protocol::SaslPlaintext,
            "SASL_SSL" => Protocol::SaslSsl,
            _ => {
                return Err(format!(
                    "security.protocol={p} (PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL are spoken)"
                ))
            }
        },
    };
    let mechanism = if protocol.sasl() {
        // librdkafka's default mechanism is GSSAPI.
        let m = props
            .get("sasl.mechanism")
            .or_else(|| props.get("sasl.mechanisms"))
            .unwrap_or("GSSAPI");
        let mechanism = match m.to_ascii_uppercase().as_str() {
            "PLAIN" => Mechanism::Plain,
            "SCRAM-SHA-256" => Mechanism::ScramSha256,
            "SCRAM-SHA-512" => Mechanism::ScramSha512,
            _ => {
                return Err(format!(
                    "sasl.mechanism={m} (the batch engine speaks PLAIN, SCRAM-SHA-256 and \
                     SCRAM-SHA-512)"
                ))
            }
        };
        for key in ["sasl.username", "sasl.password"] {
            if props.get(key).is_none() {
                return Err(format!(
                    "sasl.mechanism={} without {key} (set it)",
                    mechanism.name()
                ));
            }
        }
        Some(mechanism)
    } else {
        None
    };
    if protocol.tls() {
        if let Some(key) = props
            .props
            .keys()
            .find(|k| k.starts_with("ssl.") && !TLS_KEYS.contains(&k.as_str()))
        {
            return Err(format!(
                "{key} (the batch engine's TLS honours {})",
                TLS_KEYS.join(", ")
            ));
        }
        if let Some(v) = props.get("ssl.endpoint.identification.algorithm") {
            if !v.eq_ignore_ascii_case("https") && !v.eq_ignore_ascii_case("none") {
                return Err(format!(
                    "ssl.endpoint.identification.algorithm={v} (https or none)"
                ));
            }
        }
        for key in TLS_OTHER_KEYS {
            if let Some(v) = props.get(key) {
                if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                    return Err(format!("{key}={v} (true or false)"));
                }
            }
        }
        if props.get("ssl.keystore.location").is_some()
            && (props.get("ssl.certificate.location").is_some()
                || props.get("ssl.certificate.pem").is_some())
        {
            return Err(
                "ssl.keystore.location with ssl.certificate.location or ssl.certificate.pem \
                 (give the client certificate once)"
                    .to_owned(),
            );
        }
    }
    Ok(WireSecurity {
        protocol,
        mechanism,
    })
}

/// What a client config of the `cluster` (`source` or `target`) leaves open on the network,
/// one line each, for both engines (librdkafka reads the same keys): a PLAIN password sent
/// without TLS, a broker certificate not checked, a broker host name not checked. Said once
/// at start and by `check`; the config is honoured as it is.
pub fn exposures(props: &ClientProps, cluster: &str) -> Vec<String> {
    let config = props.path.display();
    let is = |key: &str, value: &str| {
        props
            .get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case(value))
    };
    let protocol = props
        .get("security.protocol")
        .map(str::to_ascii_uppercase)
        .unwrap_or_default();
    let mechanism = props
        .get("sasl.mechanism")
        .or_else(|| props.get("sasl.mechanisms"))
        .unwrap_or("GSSAPI");
    let mut lines = Vec::new();
    if protocol == "SASL_PLAINTEXT" && mechanism.eq_ignore_ascii_case("PLAIN") {
        lines.push(format!(
            "the {cluster} cluster ({config}): SASL PLAIN over SASL_PLAINTEXT sends the \
             password in clear text to whoever is on the path: use security.protocol=SASL_SSL, \
             or SCRAM-SHA-512 if TLS cannot be had"
        ));
    }
    if protocol.ends_with("SSL") {
        if is("enable.ssl.certificate.verification", "false") {
            lines.push(format!(
                "the {cluster} cluster ({config}): enable.ssl.certificate.verification=false: \
                 the brokers' certificates are not checked, so anyone on the path can pose as \
                 a broker and read the credentials and the records: give the brokers' CA in \
                 ssl.ca.location instead"
            ));
        } else if is("ssl.endpoint.identification.algorithm", "none") {
            lines.push(format!(
                "the {cluster} cluster ({config}): ssl.endpoint.identification.algorithm=none: \
                 the brokers' host names are not checked against their certificates, so any \
                 certificate of the same CA passes as a broker: remove the key (https is the \
                 default)"
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> ClientProps {
        ClientProps::from_pairs(
            crate::settings::client::Role::Consumer,
            "consumer.toml",
            pairs.iter().copied(),
        )
    }

    #[test]
    fn each_protocol_and_mechanism_the_engine_speaks_is_served() {
        for (p, protocol) in [
            ("plaintext", Protocol::Plaintext),
            ("SSL", Protocol::Ssl),
            ("sasl_plaintext", Protocol::SaslPlaintext),
            ("SASL_SSL", Protocol::SaslSsl),
        ] {
            let mut pairs = vec![("security.protocol", p)];
            if protocol.sasl() {
                pairs.extend([
                    ("sasl.mechanism", "SCRAM-SHA-256"),
                    ("sasl.username", "u"),
                    ("sasl.password", "hunter2"),
                ]);
            }
            let security = wire_security(&props(&pairs)).expect("served");
            assert_eq!(security.protocol, protocol);
            assert_eq!(
                security.mechanism,
                protocol.sasl().then_some(Mechanism::ScramSha256)
            );
        }
        assert_eq!(
            wire_security(&props(&[])).unwrap().protocol,
            Protocol::Plaintext
        );
    }

    #[test]
    fn a_mechanism_the_engine_does_not_speak_is_refused_by_name() {
        let gssapi = props(&[("security.protocol", "SASL_SSL")]);
        let reason = wire_security(&gssapi).unwrap_err();
        assert!(reason.contains("sasl.mechanism=GSSAPI"), "{reason}");
        let oauth = props(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "OAUTHBEARER"),
        ]);
        let reason = wire_security(&oauth).unwrap_err();
        assert!(reason.contains("sasl.mechanism=OAUTHBEARER"), "{reason}");
    }

    #[test]
    fn an_ssl_key_the_engine_cannot_honour_is_refused_by_name() {
        for (key, value) in [
            ("ssl.crl.location", "/etc/crl.pem"),
            ("ssl.engine.id", "pkcs11"),
            ("ssl.providers", "legacy"),
        ] {
            let reason =
                wire_security(&props(&[("security.protocol", "SSL"), (key, value)])).unwrap_err();
            assert!(reason.starts_with(key), "{reason}");
        }
        let reason = wire_security(&props(&[
            ("security.protocol", "SSL"),
            ("ssl.endpoint.identification.algorithm", "dns"),
        ]))
        .unwrap_err();
        assert!(reason.contains("https or none"), "{reason}");
        // Without TLS, librdkafka ignores the ssl.* keys, and so does the engine.
        assert!(wire_security(&props(&[("ssl.crl.location", "/x")])).is_ok());
    }

    #[test]
    fn a_sasl_config_without_its_password_is_refused_without_a_secret() {
        let reason = wire_security(&props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "alice"),
        ]))
        .unwrap_err();
        assert!(reason.contains("without sasl.password"), "{reason}");
    }

    #[test]
    fn what_a_config_leaves_open_is_said_naming_the_cluster_and_file() {
        let plain = props(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "mirror"),
            ("sasl.password", "hunter2"),
        ]);
        let lines = exposures(&plain, "source");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("the source cluster (consumer.toml): SASL PLAIN over SASL_PLAINTEXT")
                && !lines[0].contains("hunter2"),
            "{lines:?}"
        );
        let scram = props(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
        ]);
        assert!(exposures(&scram, "source").is_empty());
        let unchecked = props(&[
            ("security.protocol", "SSL"),
            ("enable.ssl.certificate.verification", "false"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ]);
        let lines = exposures(&unchecked, "target");
        assert_eq!(lines.len(), 1, "one line: nothing is checked: {lines:?}");
        assert!(
            lines[0].contains("certificates are not checked"),
            "{lines:?}"
        );
        let hostless = props(&[
            ("security.protocol", "SASL_SSL"),
            ("ssl.endpoint.identification.algorithm", "NONE"),
        ]);
        assert!(exposures(&hostless, "target")[0].contains("host names are not checked"));
        // Without TLS, the TLS keys change nothing.
        let plaintext = props(&[("enable.ssl.certificate.verification", "false")]);
        assert!(exposures(&plaintext, "target").is_empty());
        assert!(exposures(&props(&[("security.protocol", "SSL")]), "target").is_empty());
    }
}
