//! Secret values kept out of what the mirror prints: [`Secrets::redact`] replaces every
//! occurrence of a secret value, and of each whitespace-separated token of one with at least
//! [`MIN_TOKEN_CHARS`] characters, by [`MASK`]: a password a library quotes in part (a JAAS
//! line split at a space, a word of a passphrase) is masked too.
//!
//! The secrets of the configs a command runs with are registered once ([`register`]) for
//! librdkafka's own log lines, which pass through [`redact_log_line`] before they are logged:
//! librdkafka's callback has no settings at hand.

use std::borrow::Cow;
use std::sync::RwLock;

use super::client::{is_secret_key, ClientProps};

/// What a secret becomes.
pub const MASK: &str = "***";

/// A token of a secret shorter than this is not masked on its own (it would mask common
/// words); the whole secret always is.
pub const MIN_TOKEN_CHARS: usize = 4;

/// Strings never to print: secret values and their longer tokens, longest first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Secrets {
    patterns: Vec<String>,
}

impl Secrets {
    /// The secrets among `values` (empty values are ignored).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Secrets {
        let mut secrets = Secrets::default();
        for value in values {
            secrets.add(value);
        }
        secrets
    }

    /// The values of every secret property (per [`is_secret_key`]) of these configs.
    pub fn of<'a>(configs: impl IntoIterator<Item = &'a ClientProps>) -> Secrets {
        Secrets::new(configs.into_iter().flat_map(|c| {
            c.props
                .iter()
                .filter(|(k, _)| is_secret_key(k))
                .map(|(_, v)| v.as_str())
        }))
    }

    /// As [`Secrets::new`], and each run of letters and digits of a value with at least
    /// [`MIN_TOKEN_CHARS`] characters is masked on its own too: for text whose shape is not
    /// known (a plugin's arguments, which its message may quote in pieces: `(hunter2` of
    /// `key=(hunter2`).
    pub fn with_words<'a>(values: impl IntoIterator<Item = &'a str>) -> Secrets {
        let mut secrets = Secrets::default();
        for value in values {
            secrets.add(value);
            for word in value.split(|c: char| !c.is_alphanumeric()) {
                if word.chars().count() >= MIN_TOKEN_CHARS {
                    secrets.push(word);
                }
            }
        }
        secrets
    }

    /// A secret value: itself, whatever its length, and its long enough tokens.
    fn add(&mut self, value: &str) {
        if value.is_empty() {
            return;
        }
        self.push(value);
        for token in value.split_whitespace() {
            if token.chars().count() >= MIN_TOKEN_CHARS {
                self.push(token);
            }
        }
    }

    fn push(&mut self, pattern: &str) {
        if self.patterns.iter().any(|p| p == pattern) {
            return;
        }
        self.patterns.push(pattern.to_owned());
        // Longest first: a secret is masked whole before any token of it is looked for.
        self.patterns
            .sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    }

    fn extend(&mut self, other: &Secrets) {
        for p in &other.patterns {
            self.push(p);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `text` with every secret and every long enough token of one replaced by [`MASK`].
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.patterns.iter().any(|p| text.contains(p.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            match self.patterns.iter().find(|p| rest.starts_with(p.as_str())) {
                Some(p) => {
                    out.push_str(MASK);
                    rest = &rest[p.len()..];
                }
                None => {
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        Cow::Owned(out)
    }
}

/// The secrets [`redact_log_line`] masks, from every config this process loaded for a run.
static FOR_LOGS: RwLock<Secrets> = RwLock::new(Secrets {
    patterns: Vec::new(),
});

/// Adds `secrets` to those masked in librdkafka's log lines.
pub fn register(secrets: &Secrets) {
    let mut registered = FOR_LOGS.write().unwrap_or_else(|e| e.into_inner());
    registered.extend(secrets);
}

/// A log line of librdkafka's with every registered secret masked.
pub fn redact_log_line(line: &str) -> Cow<'_, str> {
    let registered = FOR_LOGS.read().unwrap_or_else(|e| e.into_inner());
    if registered.is_empty() {
        return Cow::Borrowed(line);
    }
    match registered.redact(line) {
        Cow::Borrowed(_) => Cow::Borrowed(line),
        Cow::Owned(masked) => Cow::Owned(masked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::client::Role;

    #[test]
    fn every_occurrence_of_a_secret_is_masked() {
        let s = Secrets::new(["hunter2"]);
        assert_eq!(
            s.redact("auth hunter2 failed; retrying with hunter2"),
            "auth *** failed; retrying with ***"
        );
        assert!(matches!(s.redact("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn tokens_of_four_characters_or_more_are_masked_on_their_own() {
        let s = Secrets::new(["Secret Part2 ab"]);
        assert_eq!(s.redact("password=Secret Part2 ab"), "password=***");
        assert_eq!(
            s.redact("option `Part2` has no `=`; Secret"),
            "option `***` has no `=`; ***"
        );
        // "ab" is too short to mask alone: it would mask every "ab" in every line.
        assert_eq!(s.redact("about ab"), "about ab");
    }

    #[test]
    fn with_words_the_longer_words_of_a_value_are_masked_too() {
        let s = Secrets::with_words(["key=(hunter2"]);
        assert_eq!(
            s.redact("rule \"key=(hunter2\": regex parse error: (hunter2 ^ unclosed group"),
            "rule \"***\": regex parse error: (*** ^ unclosed group"
        );
    }

    #[test]
    fn a_short_secret_is_still_masked_whole() {
        assert_eq!(Secrets::new(["pw1"]).redact("user:pw1"), "user:***");
    }

    #[test]
    fn the_longest_secret_is_masked_first() {
        let s = Secrets::new(["abcd", "abcdefgh"]);
        assert_eq!(s.redact("x abcdefgh y abcd"), "x *** y ***");
    }

    #[test]
    fn non_ascii_text_around_secrets_is_kept() {
        let s = Secrets::new(["p\u{e4}ss"]);
        assert_eq!(
            s.redact("\u{e9}t\u{e9} p\u{e4}ss \u{1F600}"),
            "\u{e9}t\u{e9} *** \u{1F600}"
        );
    }

    #[test]
    fn the_secrets_of_both_configs_are_those_of_their_secret_keys() {
        let consumer = ClientProps::from_pairs(
            Role::Consumer,
            "c.toml",
            [("sasl.password", "source pass"), ("sasl.username", "alice")],
        );
        let producer = ClientProps::from_pairs(
            Role::Producer,
            "p.toml",
            [
                ("ssl.key.password", "target-key-pass"),
                ("client.id", "mirror"),
            ],
        );
        let s = Secrets::of([&consumer, &producer]);
        assert_eq!(
            s.redact("alice source pass mirror target-key-pass"),
            "alice *** mirror ***"
        );
    }

    #[test]
    fn registered_secrets_are_masked_in_log_lines() {
        register(&Secrets::new(["registered-secret-4711"]));
        assert_eq!(
            redact_log_line("SASL auth with registered-secret-4711 failed"),
            "SASL auth with *** failed"
        );
        assert_eq!(redact_log_line("unrelated"), "unrelated");
    }
}
