//! TLS for the batch engine's connections (SSL and SASL_SSL), from the librdkafka keys of the
//! client config, with OpenSSL (the one librdkafka is built with): the CA certificates
//! (`ssl.ca.location` file or folder, `ssl.ca.pem`; without either, the system's), the
//! client's certificate and key (`ssl.certificate.location`/`.pem`, `ssl.key.location`/`.pem`
//! with `ssl.key.password`, or a PKCS#12 `ssl.keystore.location` with
//! `ssl.keystore.password`), host name verification (`ssl.endpoint.identification.algorithm`,
//! `https` by default as in librdkafka, or `none`), `enable.ssl.certificate.verification`, and
//! `ssl.cipher.suites`, `ssl.curves.list`, `ssl.sigalgs.list`. Which keys are honoured at all
//! is decided by `settings::wire_security`.
//!
//! As in librdkafka, a configured CA (`ssl.ca.location`, `ssl.ca.pem`) is the whole trust set:
//! OpenSSL's default paths and `SSL_CERT_FILE`/`SSL_CERT_DIR` only serve when neither is
//! given. The files are read as config files are (`settings::files`): regular files of at
//! most 1 MiB that not anyone may write (one its group may write, and a private key others
//! may read, warned about).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use openssl::pkcs12::Pkcs12;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;

use crate::settings::client::ClientProps;
use crate::settings::files::{self, FileError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("{key} in the {config} ({path}): cannot read {what}: {reason}; check the file")]
    File {
        key: &'static str,
        config: &'static str,
        path: String,
        what: &'static str,
        reason: String,
    },
    #[error("{key} in the {config}: not {what}: {reason}; check the value")]
    Value {
        key: &'static str,
        config: &'static str,
        what: &'static str,
        reason: String,
    },
    #[error("the {config}'s TLS settings: {reason}")]
    Setup {
        config: &'static str,
        reason: String,
    },
    #[error("{} in the {config}: {source}", source.flag)]
    Unsafe {
        config: &'static str,
        source: FileError,
    },
}

/// Reads the file a TLS key names as config files are read ([`files::read_guarded`]): a
/// FIFO, a device such as `/dev/zero` or a file of a wrong size fails at start naming the
/// key, instead of hanging or taking memory without end; a file anyone may write is refused,
/// and one its group may write, or a private key (`secret`) others may read, warned about.
fn read_file(
    props: &ClientProps,
    key: &'static str,
    location: &str,
    what: &'static str,
    secret: bool,
) -> Result<Vec<u8>, TlsError> {
    let path = Path::new(location);
    let contents =
        files::read_guarded(what, key, path, files::TRUST_AND_IDENTITY).map_err(|source| {
            TlsError::Unsafe {
                config: props.role.config(),
                source,
            }
        })?;
    let config = props.role.config();
    if contents.mode & 0o020 != 0 {
        tracing::warn!(
            "{key} in the {config}: {what} {location} may be written by its group (mode \
             {:04o}), and {}: chmod g-w {location} (a Kubernetes volume with an fsGroup makes \
             its files group-writable: mount it read-only)",
            contents.mode,
            files::TRUST_AND_IDENTITY.because
        );
    }
    if secret {
        let holding = "a private key";
        if let Some(warning) = files::exposure_warning(what, path, &contents, holding) {
            tracing::warn!("{key} in the {config}: {warning}");
        }
    }
    Ok(contents.bytes)
}

/// The system's CA bundles and folders that librdkafka linked with a static OpenSSL probes, in
/// its order, the first one found used (`rd_kafka_ssl_probe_and_set_default_ca_location`,
/// librdkafka 2.x, its non-Apple list): the vendored OpenSSL's own default folder is not where
/// the system keeps them.
const SYSTEM_CA_PATHS: &[&str] = &[
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/certs/ca-bundle.crt",
    "/etc/pki/tls/certs/ca-bundle.trust.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
    "/etc/ssl/cacert.pem",
    "/etc/certs/ca-certificates.crt",
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/certs",
    "/usr/local/etc/ssl/cert.pem",
    "/usr/local/etc/ssl/cacert.pem",
    "/usr/local/etc/ssl/certs/cert.pem",
    "/usr/local/etc/ssl/certs/cacert.pem",
    "/usr/local/share/certs/ca-root-nss.crt",
    "/etc/openssl/certs/ca-certificates.crt",
];

/// The TLS side of one client config: a connector made once, used for every broker.
pub(crate) struct Tls {
    connector: SslConnector,
    verify_hostname: bool,
}

impl Tls {
    /// The TLS settings of `props` (a config whose `security.protocol` is SSL or SASL_SSL):
    /// every file named is read now, so a bad one fails at start, naming its key.
    pub(crate) fn new(props: &ClientProps) -> Result<Tls, TlsError> {
        let config = props.role.config();
        let setup = |e: openssl::error::ErrorStack| TlsError::Setup {
            config,
            reason: e.to_string(),
        };
        let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(setup)?;
        // `probe` is librdkafka's word for what it does without the key, built as it is here.
        let location = props.get("ssl.ca.location").filter(|l| *l != "probe");
        match (location, props.get("ssl.ca.pem")) {
            (None, None) => {
                builder.set_default_verify_paths().map_err(setup)?;
                let found = SYSTEM_CA_PATHS.iter().map(Path::new).find(|p| p.exists());
                match found {
                    Some(dir) if dir.is_dir() => builder
                        .load_verify_locations(None, Some(dir))
                        .map_err(setup)?,
                    Some(file) => builder.set_ca_file(file).map_err(setup)?,
                    None => {}
                }
            }
            (location, pem) => {
                // The configured CA alone: the connector's builder trusts OpenSSL's default
                // paths (and SSL_CERT_FILE, SSL_CERT_DIR) from the start, librdkafka does not.
                builder.set_cert_store(X509StoreBuilder::new().map_err(setup)?.build());
                if let Some(location) = location {
                    let path = Path::new(location);
                    let file = |reason: String| TlsError::File {
                        key: "ssl.ca.location",
                        config,
                        path: location.to_owned(),
                        what: "the CA certificates (PEM)",
                        reason,
                    };
                    if path.is_dir() {
                        builder
                            .load_verify_locations(None, Some(path))
                            .map_err(|e| file(reason(&e)))?;
                    } else {
                        // Checked as a config file, then loaded by OpenSSL itself, which also
                        // reads the "TRUSTED CERTIFICATE" blocks of a trust bundle.
                        read_file(
                            props,
                            "ssl.ca.location",
                            location,
                            "the CA certificates",
                            false,
                        )?;
                        builder.set_ca_file(path).map_err(|e| file(reason(&e)))?;
                    }
                }
                if let Some(pem) = pem {
                    let value = |reason: String| TlsError::Value {
                        key: "ssl.ca.pem",
                        config,
                        what: "PEM CA certificates",
                        reason,
                    };
                    let certs =
                        X509::stack_from_pem(pem.as_bytes()).map_err(|e| value(reason(&e)))?;
                    if certs.is_empty() {
                        return Err(value("no certificate in it".to_owned()));
                    }
                    for cert in certs {
                        builder
                            .cert_store_mut()
                            .add_cert(cert)
                            .map_err(|e| value(reason(&e)))?;
                    }
                }
            }
        }
        if let Some((key, chain)) = client_identity(props)? {
            let mut chain = chain.into_iter();
            if let Some(leaf) = chain.next() {
                builder.set_certificate(&leaf).map_err(setup)?;
            }
            for extra in chain {
                builder.add_extra_chain_cert(extra).map_err(setup)?;
            }
            builder.set_private_key(&key).map_err(setup)?;
            builder.check_private_key().map_err(|e| TlsError::Setup {
                config,
                reason: format!(
                    "the client key does not match the client certificate: {}",
                    reason(&e)
                ),
            })?;
        }
        for (key, set) in [
            (
                "ssl.cipher.suites",
                openssl::ssl::SslContextBuilder::set_cipher_list
                    as fn(&mut openssl::ssl::SslContextBuilder, &str) -> _,
            ),
            (
                "ssl.curves.list",
                openssl::ssl::SslContextBuilder::set_groups_list,
            ),
            (
                "ssl.sigalgs.list",
                openssl::ssl::SslContextBuilder::set_sigalgs_list,
            ),
        ] {
            if let Some(v) = props.get(key) {
                set(&mut builder, v).map_err(|e| TlsError::Value {
                    key,
                    config,
                    what: "a list OpenSSL accepts",
                    reason: reason(&e),
                })?;
            }
        }
        let verify_certificate = !props
            .get("enable.ssl.certificate.verification")
            .is_some_and(|v| v.eq_ignore_ascii_case("false"));
        builder.set_verify(if verify_certificate {
            SslVerifyMode::PEER
        } else {
            SslVerifyMode::NONE
        });
        let verify_hostname = verify_certificate
            && !props
                .get("ssl.endpoint.identification.algorithm")
                .is_some_and(|v| v.eq_ignore_ascii_case("none"));
        Ok(Tls {
            connector: builder.build(),
            verify_hostname,
        })
    }

    /// The TLS handshake over `tcp` with the broker at `host` (a name or an IP address, which
    /// its certificate must name unless host name verification is off).
    pub(crate) fn handshake(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> Result<SslStream<TcpStream>, String> {
        let mut config = self.connector.configure().map_err(|e| e.to_string())?;
        config.set_verify_hostname(self.verify_hostname);
        config.connect(host, tcp).map_err(|e| match e {
            openssl::ssl::HandshakeError::SetupFailure(e) => reason(&e),
            openssl::ssl::HandshakeError::Failure(m) => handshake_reason(m.error(), m.ssl()),
            openssl::ssl::HandshakeError::WouldBlock(m) => {
                format!("no answer in time ({})", m.error())
            }
        })
    }
}

/// What went wrong in a handshake, with the certificate check's verdict where it failed.
fn handshake_reason(error: &openssl::ssl::Error, ssl: &openssl::ssl::SslRef) -> String {
    let verify = ssl.verify_result();
    if verify != openssl::x509::X509VerifyResult::OK {
        return format!(
            "the broker's certificate is refused: {}",
            verify.error_string()
        );
    }
    match error.ssl_error() {
        Some(stack) => reason(stack),
        None => match error.io_error() {
            Some(io) => format!("the connection broke off during the handshake: {io}"),
            None => error.to_string(),
        },
    }
}

/// OpenSSL's error stack as one line: each reason, without the library's file and line.
fn reason(stack: &openssl::error::ErrorStack) -> String {
    let reasons: Vec<String> = stack
        .errors()
        .iter()
        .map(|e| {
            e.reason()
                .map(str::to_owned)
                .unwrap_or_else(|| e.to_string())
        })
        .collect();
    if reasons.is_empty() {
        "no reason given".to_owned()
    } else {
        reasons.join("; ")
    }
}

/// A client's private key and its certificate chain, leaf first.
type Identity = (PKey<Private>, Vec<X509>);

/// The client's private key and certificate chain, if the config gives one.
fn client_identity(props: &ClientProps) -> Result<Option<Identity>, TlsError> {
    let config = props.role.config();
    if let Some(location) = props.get("ssl.keystore.location") {
        let file = |what, reason| TlsError::File {
            key: "ssl.keystore.location",
            config,
            path: location.to_owned(),
            what,
            reason,
        };
        let der = read_file(
            props,
            "ssl.keystore.location",
            location,
            "the PKCS#12 key store",
            true,
        )?;
        let parsed = Pkcs12::from_der(&der)
            .and_then(|p| p.parse2(props.get("ssl.keystore.password").unwrap_or("")))
            .map_err(|e| {
                file(
                    "the PKCS#12 key store (check ssl.keystore.password)",
                    reason(&e),
                )
            })?;
        let (Some(key), Some(cert)) = (parsed.pkey, parsed.cert) else {
            return Err(file(
                "the PKCS#12 key store",
                "it holds no private key and certificate".to_owned(),
            ));
        };
        let mut chain = vec![cert];
        chain.extend(parsed.ca.into_iter().flatten());
        return Ok(Some((key, chain)));
    }
    let certs = match (
        props.get("ssl.certificate.location"),
        props.get("ssl.certificate.pem"),
    ) {
        (Some(location), _) => {
            let pem = read_file(
                props,
                "ssl.certificate.location",
                location,
                "the client certificate",
                false,
            )?;
            Some(X509::stack_from_pem(&pem).map_err(|e| TlsError::File {
                key: "ssl.certificate.location",
                config,
                path: location.to_owned(),
                what: "the client certificate (PEM)",
                reason: reason(&e),
            })?)
        }
        (None, Some(pem)) => {
            Some(
                X509::stack_from_pem(pem.as_bytes()).map_err(|e| TlsError::Value {
                    key: "ssl.certificate.pem",
                    config,
                    what: "a PEM certificate",
                    reason: reason(&e),
                })?,
            )
        }
        (None, None) => None,
    };
    let password = props.get("ssl.key.password").unwrap_or("").as_bytes();
    // A key's errors never quote the key or its password.
    let key = match (props.get("ssl.key.location"), props.get("ssl.key.pem")) {
        (Some(location), _) => {
            let file = |reason| TlsError::File {
                key: "ssl.key.location",
                config,
                path: location.to_owned(),
                what: "the client's private key (PEM; check ssl.key.password)",
                reason,
            };
            let pem = read_file(
                props,
                "ssl.key.location",
                location,
                "the client's private key",
                true,
            )?;
            Some(
                PKey::private_key_from_pem_passphrase(&pem, password)
                    .map_err(|e| file(reason(&e)))?,
            )
        }
        (None, Some(pem)) => Some(
            PKey::private_key_from_pem_passphrase(pem.as_bytes(), password).map_err(|e| {
                TlsError::Value {
                    key: "ssl.key.pem",
                    config,
                    what: "a PEM private key (check ssl.key.password)",
                    reason: reason(&e),
                }
            })?,
        ),
        (None, None) => None,
    };
    match (key, certs) {
        (None, None) => Ok(None),
        (Some(key), Some(certs)) if !certs.is_empty() => Ok(Some((key, certs))),
        (Some(_), _) => Err(TlsError::Setup {
            config,
            reason: "a client key without its certificate: set ssl.certificate.location".to_owned(),
        }),
        (None, Some(_)) => Err(TlsError::Setup {
            config,
            reason: "a client certificate without its key: set ssl.key.location".to_owned(),
        }),
    }
}

/// A broker connection's byte stream: TCP, or TLS over TCP.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Stream {
    /// The TCP socket under the stream: its timeouts are the stream's.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::client::Role;
    use openssl::asn1::Asn1Time;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::symm::Cipher;
    use openssl::x509::X509NameBuilder;

    const PASSWORD: &str = "k3y-Pa55word";

    /// A fresh key and a self-signed certificate for it.
    fn identity() -> (PKey<Private>, X509) {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "mirror").unwrap();
        let name = name.build();
        let mut cert = X509::builder().unwrap();
        cert.set_version(2).unwrap();
        cert.set_subject_name(&name).unwrap();
        cert.set_issuer_name(&name).unwrap();
        cert.set_pubkey(&key).unwrap();
        cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        (key, cert.build())
    }

    fn props(pairs: &[(&str, &str)]) -> ClientProps {
        let mut all = vec![("security.protocol", "SSL")];
        all.extend_from_slice(pairs);
        ClientProps::from_pairs(Role::Producer, "producer.toml", all)
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        match Tls::new(&props(pairs)) {
            Ok(_) => panic!("{pairs:?} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn pem_files_and_pem_values_make_a_connector() {
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = identity();
        let cert_pem = String::from_utf8(cert.to_pem().unwrap()).unwrap();
        let key_pem = key
            .private_key_to_pem_pkcs8_passphrase(Cipher::aes_256_cbc(), PASSWORD.as_bytes())
            .unwrap();
        let (ca, cert_file, key_file) = (
            dir.path().join("ca.pem"),
            dir.path().join("client.pem"),
            dir.path().join("client.key"),
        );
        std::fs::write(&ca, &cert_pem).unwrap();
        std::fs::write(&cert_file, &cert_pem).unwrap();
        std::fs::write(&key_file, &key_pem).unwrap();
        let (ca, cert_file, key_file) = (
            ca.display().to_string(),
            cert_file.display().to_string(),
            key_file.display().to_string(),
        );
        let files = [
            ("ssl.ca.location", ca.as_str()),
            ("ssl.certificate.location", cert_file.as_str()),
            ("ssl.key.location", key_file.as_str()),
            ("ssl.key.password", PASSWORD),
        ];
        let tls = Tls::new(&props(&files)).expect("PEM files");
        assert!(tls.verify_hostname, "librdkafka's default is https");
        let key_text = String::from_utf8(key_pem).unwrap();
        let values = [
            ("ssl.ca.pem", cert_pem.as_str()),
            ("ssl.certificate.pem", cert_pem.as_str()),
            ("ssl.key.pem", key_text.as_str()),
            ("ssl.key.password", PASSWORD),
            ("ssl.endpoint.identification.algorithm", "none"),
        ];
        let tls = Tls::new(&props(&values)).expect("PEM values");
        assert!(!tls.verify_hostname);
        // The encrypted key without its password: the key named, no secret shown.
        let err = error(&files[..3]);
        assert!(
            err.starts_with("ssl.key.location in the producer config"),
            "{err}"
        );
        assert!(err.contains("check ssl.key.password"), "{err}");
    }

    #[test]
    fn a_pkcs12_key_store_gives_the_client_identity_and_a_wrong_password_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = identity();
        let p12 = Pkcs12::builder()
            .name("mirror")
            .pkey(&key)
            .cert(&cert)
            .build2(PASSWORD)
            .unwrap();
        let store = dir.path().join("client.p12");
        std::fs::write(&store, p12.to_der().unwrap()).unwrap();
        let store = store.display().to_string();
        let (pkey, chain) = client_identity(&props(&[
            ("ssl.keystore.location", &store),
            ("ssl.keystore.password", PASSWORD),
        ]))
        .unwrap()
        .expect("an identity");
        assert!(pkey.public_eq(&key));
        assert_eq!(chain[0].to_der().unwrap(), cert.to_der().unwrap());
        let err = error(&[
            ("ssl.keystore.location", &store),
            ("ssl.keystore.password", "wrong-Pa55"),
        ]);
        assert!(
            err.starts_with("ssl.keystore.location in the producer config")
                && err.contains(&store)
                && !err.contains("wrong-Pa55"),
            "{err}"
        );
    }

    /// A TLS server on loopback whose certificate (trusted, self-signed) names `mirror`, not
    /// 127.0.0.1: it serves one handshake per connection.
    fn server(key: &PKey<Private>, cert: &X509) -> std::net::SocketAddr {
        let mut acceptor =
            openssl::ssl::SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
        acceptor.set_private_key(key).unwrap();
        acceptor.set_certificate(cert).unwrap();
        let acceptor = acceptor.build();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                if let Ok(mut tls) = acceptor.accept(tcp) {
                    let _ = tls.write_all(b"ok");
                }
            }
        });
        address
    }

    #[test]
    fn the_host_name_is_verified_unless_the_config_turns_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = identity();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.to_pem().unwrap()).unwrap();
        let ca = ca.display().to_string();
        let address = server(&key, &cert);
        let connect = |pairs: &[(&str, &str)]| {
            let tls = Tls::new(&props(pairs)).unwrap();
            let tcp = TcpStream::connect(address).unwrap();
            tls.handshake("127.0.0.1", tcp).map(|mut s| {
                let mut answer = [0u8; 2];
                s.read_exact(&mut answer).unwrap();
                answer
            })
        };
        let refused = connect(&[("ssl.ca.location", &ca)]).unwrap_err();
        assert!(
            refused.contains("the broker's certificate is refused")
                && refused.contains("IP address mismatch"),
            "{refused}"
        );
        let answer = connect(&[
            ("ssl.ca.location", &ca),
            ("ssl.endpoint.identification.algorithm", "none"),
        ])
        .expect("no host name check");
        assert_eq!(&answer, b"ok");
        // An untrusted certificate is refused whatever the host name check.
        let untrusted = connect(&[("ssl.endpoint.identification.algorithm", "none")]).unwrap_err();
        assert!(untrusted.contains("certificate is refused"), "{untrusted}");
    }

    #[test]
    fn a_tls_setting_that_cannot_be_used_is_an_error_naming_its_key() {
        let err = error(&[("ssl.ca.location", "/nonexistent/ca.pem")]);
        assert!(
            err.starts_with("ssl.ca.location in the producer config")
                && err.contains("/nonexistent/ca.pem"),
            "{err}"
        );
        let err = error(&[("ssl.ca.pem", "not a certificate")]);
        assert!(
            err.starts_with("ssl.ca.pem in the producer config"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let (key, _) = identity();
        let key_file = dir.path().join("client.key");
        std::fs::write(&key_file, key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        let err = error(&[("ssl.key.location", &key_file.display().to_string())]);
        assert!(err.contains("set ssl.certificate.location"), "{err}");
        let err = error(&[("ssl.cipher.suites", "NO-SUCH-CIPHER")]);
        assert!(
            err.starts_with("ssl.cipher.suites in the producer config"),
            "{err}"
        );
    }

    /// A file in a folder of its own with `mode`.
    fn file_with(mode: u32, bytes: &[u8]) -> (tempfile::TempDir, String) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.pem");
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path.display().to_string())
    }

    #[test]
    fn a_tls_file_that_is_no_regular_file_of_a_key_files_size_is_refused_naming_its_key() {
        // Before, each was read whole: a FIFO hung the start, /dev/zero took memory without
        // end, a large file was read and then failed to parse.
        let (_dir, large) = file_with(0o600, &vec![b'#'; 2 << 20]);
        for key in [
            "ssl.key.location",
            "ssl.certificate.location",
            "ssl.keystore.location",
        ] {
            let err = error(&[(key, large.as_str())]);
            assert!(
                err.starts_with(&format!("{key} in the producer config"))
                    && err.contains("more than the 1048576 bytes"),
                "{key}: {err}"
            );
        }
        let err = error(&[("ssl.ca.location", large.as_str())]);
        assert!(err.contains("more than the 1048576 bytes"), "{err}");
        let err = error(&[("ssl.key.location", "/dev/zero")]);
        assert!(
            err.contains("/dev/zero (ssl.key.location) is a character device"),
            "{err}"
        );
    }

    #[test]
    fn a_key_or_ca_file_anyone_may_write_is_refused() {
        let (key, cert) = identity();
        let (_dir, ca) = file_with(0o666, &cert.to_pem().unwrap());
        let err = error(&[("ssl.ca.location", ca.as_str())]);
        assert!(
            err.contains("may be written by others (mode 0666)")
                && err.contains("chooses which brokers the mirror trusts")
                && err.contains("chmod go-w"),
            "{err}"
        );
        let (_dir, key_file) = file_with(0o602, &key.private_key_to_pem_pkcs8().unwrap());
        let err = error(&[("ssl.key.location", key_file.as_str())]);
        assert!(err.contains("(mode 0602)"), "{err}");
        // Group-writable (a volume with an fsGroup): warned about, read as librdkafka reads it.
        let (_dir, ca) = file_with(0o664, &cert.to_pem().unwrap());
        assert!(Tls::new(&props(&[("ssl.ca.location", ca.as_str())])).is_ok());
    }

    /// Run by [`a_configured_ca_is_the_whole_trust_set`] in a process of its own, with
    /// `SSL_CERT_FILE` naming the CA of the server at `TRUST_SET_SERVER`: the configured CA
    /// (another one) must be all that is trusted.
    #[test]
    #[ignore = "run by a_configured_ca_is_the_whole_trust_set, in a process of its own"]
    fn trust_set_in_a_process_of_its_own() {
        let Ok(address) = std::env::var("TRUST_SET_SERVER") else {
            return;
        };
        let ca = std::env::var("TRUST_SET_CA").unwrap();
        let tls = Tls::new(&props(&[
            ("ssl.ca.location", ca.as_str()),
            ("ssl.endpoint.identification.algorithm", "none"),
        ]))
        .unwrap();
        let refused = tls
            .handshake("127.0.0.1", TcpStream::connect(address).unwrap())
            .map(|_| ())
            .expect_err("a server whose CA is only in SSL_CERT_FILE is trusted");
        assert!(refused.contains("certificate is refused"), "{refused}");
    }

    #[test]
    fn a_configured_ca_is_the_whole_trust_set() {
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = identity();
        let (_, other) = identity();
        let env_ca = dir.path().join("env-ca.pem");
        std::fs::write(&env_ca, cert.to_pem().unwrap()).unwrap();
        let configured = dir.path().join("ca.pem");
        std::fs::write(&configured, other.to_pem().unwrap()).unwrap();
        let address = server(&key, &cert);
        // In a process of its own: OpenSSL reads SSL_CERT_FILE from the environment, which a
        // test must not change under the others running beside it.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--ignored",
                "--nocapture",
                "mirror::batches::tls::tests::trust_set_in_a_process_of_its_own",
            ])
            .env("SSL_CERT_FILE", &env_ca)
            .env("TRUST_SET_SERVER", address.to_string())
            .env("TRUST_SET_CA", &configured)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("1 passed"),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
