//! SASL for the batch engine's connections (SASL_PLAINTEXT and SASL_SSL): what goes inside the
//! auth bytes of SaslAuthenticate, which [`super::wire`] sends after SaslHandshake v1
//! (KIP-152). PLAIN (RFC 4616) or SCRAM-SHA-256/512 (RFC 5802, RFC 7677), the server's
//! signature checked. Credentials from `sasl.username` and `sasl.password`; no error ever
//! shows the password.

use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

use bytes::Bytes;
use zeroize::Zeroizing;

use crate::settings::client::ClientProps;
use crate::settings::wire_security::Mechanism;

/// A message of the exchange that holds a secret (PLAIN's password, SCRAM's proof): its
/// bytes are cleared when the last reference to them goes (after the request is encoded).
fn secret_message(bytes: Vec<u8>) -> Bytes {
    Bytes::from_owner(Zeroizing::new(bytes))
}

/// The credentials of one client config.
pub(crate) struct Sasl {
    pub(crate) mechanism: Mechanism,
    username: String,
    password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Sasl {
    /// The credentials of `props` for `mechanism` (checked present by `settings::wire_security`).
    pub(crate) fn new(mechanism: Mechanism, props: &ClientProps) -> Sasl {
        Sasl {
            mechanism,
            username: props.get("sasl.username").unwrap_or_default().to_owned(),
            password: props.get("sasl.password").unwrap_or_default().to_owned(),
        }
    }

    /// The mechanism's first message, and the exchange that answers the broker's messages.
    pub(crate) fn start(&self) -> (Bytes, Exchange) {
        match self.mechanism {
            Mechanism::Plain => {
                let mut token = Vec::with_capacity(2 + self.username.len() + self.password.len());
                token.push(0);
                token.extend_from_slice(self.username.as_bytes());
                token.push(0);
                token.extend_from_slice(self.password.as_bytes());
                (secret_message(token), Exchange::Done)
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let scram = Scram::new(self.mechanism, &self.username, &nonce());
                (
                    Bytes::from(scram.client_first().into_bytes()),
                    Exchange::ServerFirst(scram),
                )
            }
        }
    }
}

/// Where an exchange is: what the broker's next message is.
pub(crate) enum Exchange {
    /// SCRAM's server-first-message.
    ServerFirst(Scram),
    /// SCRAM's server-final-message, checked against the signature computed.
    ServerFinal(Scram),
    /// Nothing more is expected (PLAIN, or SCRAM verified).
    Done,
}

impl Exchange {
    /// The answer to the broker's message `server`: the next message to send, or `None` when
    /// the exchange is complete. Errors never hold the password.
    pub(crate) fn answer(&mut self, sasl: &Sasl, server: &[u8]) -> Result<Option<Bytes>, String> {
        let server = String::from_utf8_lossy(server);
        match std::mem::replace(self, Exchange::Done) {
            Exchange::ServerFirst(mut scram) => {
                let client_final = scram.client_final(&server, &sasl.password)?;
                *self = Exchange::ServerFinal(scram);
                Ok(Some(secret_message(client_final.into_bytes())))
            }
            Exchange::ServerFinal(scram) => scram.verify_server_final(&server).map(|()| None),
            Exchange::Done => Ok(None),
        }
    }
}

/// A fresh client nonce: 24 random bytes, base64 (printable, no comma).
fn nonce() -> String {
    let mut bytes = [0u8; 24];
    openssl::rand::rand_bytes(&mut bytes).expect("OpenSSL's random generator");
    openssl::base64::encode_block(&bytes)
}

/// Kafka's floor for SCRAM iterations (`ScramMechanism.minIterations`); the Java client
/// refuses a server that asks for fewer.
const MIN_ITERATIONS: u32 = 4096;

/// The most SCRAM iterations run for a broker: librdkafka's ceiling
/// (`rd_kafka_sasl_scram_handle_server_first_message`: "Invalid value (not integer or too
/// large) for Iteration count"), so that the record engine and this one take the same brokers.
/// Kafka's own credentials have at most 16384 (`ScramMechanism.maxIterations`, enforced when
/// they are made). PBKDF2 runs on the stream's thread, before any deadline can interrupt it:
/// 2^32 - 1 iterations would hold it for hours; this many took 0.23 s (SHA-256) and 0.52 s
/// (SHA-512) on the 2-core development VM (OpenSSL's PBKDF2 through Python's `hashlib`).
const MAX_ITERATIONS: u32 = 1_000_000;

/// One SCRAM exchange, client side (RFC 5802 without channel binding: gs2 header `n,,`).
pub(crate) struct Scram {
    digest: MessageDigest,
    client_first_bare: String,
    client_nonce: String,
    server_signature: Option<Vec<u8>>,
}

impl Scram {
    fn new(mechanism: Mechanism, username: &str, client_nonce: &str) -> Scram {
        let digest = match mechanism {
            Mechanism::ScramSha512 => MessageDigest::sha512(),
            _ => MessageDigest::sha256(),
        };
        // saslname: '=' and ',' escaped (RFC 5802 section 5.1).
        let name = username.replace('=', "=3D").replace(',', "=2C");
        Scram {
            digest,
            client_first_bare: format!("n={name},r={client_nonce}"),
            client_nonce: client_nonce.to_owned(),
            server_signature: None,
        }
    }

    fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The client-final-message for `server_first`; errors never hold the password.
    fn client_final(&mut self, server_first: &str, password: &str) -> Result<String, String> {
        let field = |name: char| {
            server_first
                .split(',')
                .find_map(|f| f.strip_prefix(name).and_then(|f| f.strip_prefix('=')))
        };
        if let Some(e) = field('e') {
            return Err(format!("the broker's SCRAM error: {e}"));
        }
        let nonce = field('r').ok_or("the broker's SCRAM message has no nonce")?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err("the broker's SCRAM nonce does not extend ours".to_owned());
        }
        let salt = field('s')
            .and_then(|s| openssl::base64::decode_block(s).ok())
            .ok_or("the broker's SCRAM message has no valid salt")?;
        let iterations: u32 = field('i')
            .and_then(|i| i.parse().ok())
            .ok_or("the broker's SCRAM message has no valid iteration count")?;
        if iterations < MIN_ITERATIONS {
            return Err(format!(
                "the broker asks for {iterations} SCRAM iterations, fewer than the minimum \
                 {MIN_ITERATIONS}"
            ));
        }
        if iterations > MAX_ITERATIONS {
            return Err(format!(
                "the broker asks for {iterations} SCRAM iterations, more than the ceiling of \
                 {MAX_ITERATIONS} (librdkafka's; Kafka's credentials have at most 16384): \
                 check that the bootstrap address is the Kafka cluster meant, or store the \
                 user's SCRAM credentials again with fewer iterations"
            ));
        }
        let crypto = |e: openssl::error::ErrorStack| format!("SCRAM: {e}");
        let mut salted = Zeroizing::new(vec![0u8; self.digest.size()]);
        openssl::pkcs5::pbkdf2_hmac(
            password.as_bytes(),
            &salt,
            iterations as usize,
            self.digest,
            &mut salted,
        )
        .map_err(crypto)?;
        let client_key = Zeroizing::new(self.hmac(&salted, b"Client Key").map_err(crypto)?);
        let stored_key = openssl::hash::hash(self.digest, &client_key).map_err(crypto)?;
        let without_proof = format!("c={},r={nonce}", openssl::base64::encode_block(b"n,,"));
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = self
            .hmac(&stored_key, auth_message.as_bytes())
            .map_err(crypto)?;
        let proof: Zeroizing<Vec<u8>> = Zeroizing::new(
            client_key
                .iter()
                .zip(&client_signature)
                .map(|(k, s)| k ^ s)
                .collect(),
        );
        let server_key = self.hmac(&salted, b"Server Key").map_err(crypto)?;
        self.server_signature = Some(
            self.hmac(&server_key, auth_message.as_bytes())
                .map_err(crypto)?,
        );
        Ok(format!(
            "{without_proof},p={}",
            openssl::base64::encode_block(&proof)
        ))
    }

    /// Checks the server's signature: the broker knew the password's keys.
    fn verify_server_final(&self, server_final: &str) -> Result<(), String> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(format!("the broker's SCRAM error: {e}"));
        }
        let signature = server_final
            .split(',')
            .find_map(|f| f.strip_prefix("v="))
            .and_then(|v| openssl::base64::decode_block(v).ok())
            .ok_or("the broker's final SCRAM message has no valid signature")?;
        match &self.server_signature {
            // `memcmp::eq` compares in constant time and asserts equal lengths.
            Some(expected) if expected.len() != signature.len() => Err(format!(
                "the broker's SCRAM signature has {} bytes, not the {} bytes of {}: it does not \
                 speak this mechanism (a broker impersonated, or sasl.mechanism other than the \
                 broker's?)",
                signature.len(),
                expected.len(),
                self.mechanism_name()
            )),
            Some(expected) if openssl::memcmp::eq(expected, &signature) => Ok(()),
            Some(_) => Err(
                "the broker's SCRAM signature is wrong: it does not know this user's \
                 credentials (a broker impersonated?)"
                    .to_owned(),
            ),
            None => Err("SCRAM: the final message came before the first".to_owned()),
        }
    }

    /// The mechanism's name, for errors.
    fn mechanism_name(&self) -> &'static str {
        if self.digest.size() == MessageDigest::sha512().size() {
            "SCRAM-SHA-512"
        } else {
            "SCRAM-SHA-256"
        }
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Result<Vec<u8>, openssl::error::ErrorStack> {
        let key = PKey::hmac(key)?;
        let mut signer = Signer::new(self.digest, &key)?;
        signer.update(data)?;
        signer.sign_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3: user "user", password "pencil".
    #[test]
    fn scram_sha_256_gives_the_rfc_7677_proof_and_checks_the_servers_signature() {
        let mut scram = Scram::new(Mechanism::ScramSha256, "user", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(scram.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            scram.client_final(server_first, "pencil").unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram
            .verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .expect("the RFC's server signature");
        let forged = scram
            .verify_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap_err();
        assert!(forged.contains("signature is wrong"), "{forged}");
    }

    #[test]
    fn a_scram_server_that_does_not_extend_our_nonce_or_asks_few_iterations_is_refused() {
        let mut scram = Scram::new(Mechanism::ScramSha512, "user", "abc");
        let err = scram
            .client_final("r=xyz123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "pencil")
            .unwrap_err();
        assert!(err.contains("nonce"), "{err}");
        let err = scram
            .client_final("r=abc123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1", "pencil")
            .unwrap_err();
        assert!(
            err.contains("iterations") && !err.contains("pencil"),
            "{err}"
        );
    }

    /// A server-final-message whose signature decodes to another length than the digest's (a
    /// fake broker, or anyone on a SASL_PLAINTEXT path) is refused by name, not a panic of the
    /// stream (`openssl::memcmp::eq` asserts equal lengths).
    #[test]
    fn a_server_signature_of_another_length_is_refused_naming_both_lengths() {
        let mut scram = Scram::new(Mechanism::ScramSha256, "user", "rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        scram.client_final(server_first, "pencil").unwrap();
        for signature in [
            "AAAA",
            "",
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4AAAA=",
        ] {
            let err = scram
                .verify_server_final(&format!("v={signature}"))
                .unwrap_err();
            assert!(
                err.contains("signature") && err.contains("32 bytes"),
                "{signature}: {err}"
            );
        }
    }

    /// An iteration count above the ceiling is refused before PBKDF2 runs: a broker asking
    /// for 2^32 - 1 would otherwise hold the stream's thread for hours. Just above the ceiling
    /// comes first, so that before the refusal existed this test failed in a second rather
    /// than hang; Kafka's own largest (16384) is taken.
    #[test]
    fn an_iteration_count_above_the_ceiling_is_refused_before_any_is_run() {
        let server_first = |i: &str| format!("r=abc123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i={i}");
        for i in ["1000001", "4294967295"] {
            let mut scram = Scram::new(Mechanism::ScramSha512, "user", "abc");
            let err = scram.client_final(&server_first(i), "pencil").expect_err(i);
            assert!(
                err.contains(i) && err.contains("1000000") && !err.contains("pencil"),
                "{err}"
            );
        }
        let mut scram = Scram::new(Mechanism::ScramSha512, "user", "abc");
        scram
            .client_final(&server_first("16384"), "pencil")
            .expect("Kafka's largest iteration count");
    }

    #[test]
    fn plain_sends_user_and_password_in_one_message() {
        let props = ClientProps::from_pairs(
            crate::settings::client::Role::Consumer,
            "consumer.toml",
            [("sasl.username", "alice"), ("sasl.password", "hunter2")],
        );
        let sasl = Sasl::new(Mechanism::Plain, &props);
        let (first, mut exchange) = sasl.start();
        assert_eq!(&first[..], b"\0alice\0hunter2");
        assert_eq!(exchange.answer(&sasl, b""), Ok(None));
        assert!(!format!("{sasl:?}").contains("hunter2"));
    }

    #[test]
    fn a_scram_user_name_escapes_equals_and_comma() {
        let scram = Scram::new(Mechanism::ScramSha512, "a=b,c", "n0nce");
        assert_eq!(scram.client_first(), "n,,n=a=3Db=2Cc,r=n0nce");
    }
}
