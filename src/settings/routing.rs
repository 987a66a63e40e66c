//! Validated routing values: which source topics are mirrored (`--whitelist`), where their
//! records go on the target (`--target.topic`), and the provenance header that keeps
//! active-active mirrors from sending records back where they came from.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rdkafka::metadata::Metadata;
use regex::Regex;

use super::SettingsError;
use crate::native::record::Header;

/// What every mirror-maker offset-mapping store is named by default
/// (`mirror-maker.offsets.<source cluster name>`): such topics are a mirror's bookkeeping,
/// never mirrored.
pub const STORE_TOPIC_PREFIX: &str = "mirror-maker.offsets.";

/// What every mirror-maker ACL record topic is named (`mirror-maker.acls.<source cluster
/// name>`, `--sync.topic.acls`): a mirror's bookkeeping, never mirrored.
pub const ACL_RECORD_TOPIC_PREFIX: &str = "mirror-maker.acls.";

/// The names of mirror-maker's bookkeeping topics, with what each holds.
const BOOKKEEPING: &[(&str, &str)] = &[
    (STORE_TOPIC_PREFIX, "offset-mapping store"),
    (ACL_RECORD_TOPIC_PREFIX, "ACL record topic"),
];

/// Which topics to mirror: the whole topic name must match (Java's `String.matches`).
#[derive(Debug, Clone)]
pub struct TopicFilter {
    pattern: String,
    regex: Regex,
    /// The topics this mirror keeps its bookkeeping in on the target (its offset-mapping
    /// store, its ACL record topic), with what each holds, and `--target.topic`: a source
    /// topic named like one, or whose target topic would be one, is not mirrored.
    owned: Vec<(String, &'static str)>,
    template: TopicTemplate,
    /// Source topics already warned about as not mirrored for the bookkeeping's sake.
    warned: Arc<Mutex<HashSet<String>>>,
    /// Mirrored whatever the whitelist says: `--heartbeats.topic`.
    also: Option<String>,
}

impl TopicFilter {
    /// Reads `--whitelist` as Java MirrorMaker's `TopicFilter` did (see [`java_whitelist`]).
    /// An empty one (`''`, or only quotes, spaces and commas) is refused: it would match no
    /// topic, a mirror that copies nothing.
    pub fn new(given: &str) -> Result<TopicFilter, SettingsError> {
        let pattern = java_whitelist(given);
        if pattern.split('|').all(str::is_empty) {
            return Err(SettingsError::Usage(format!(
                "--whitelist {given:?} is empty and would match no topic: give a pattern, \
                 e.g. 'orders|payments.*', or '.*' to mirror every topic"
            )));
        }
        let regex = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| SettingsError::Regex {
            pattern: given.to_owned(),
            message: one_line_regex_error(&e),
        })?;
        Ok(TopicFilter {
            pattern,
            regex,
            owned: Vec::new(),
            template: TopicTemplate::default(),
            warned: Arc::default(),
            also: None,
        })
    }

    /// Never mirrors into `topic`, one of this mirror's own topics on the target (`what`: its
    /// offset-mapping store, its ACL record topic): a source topic named `topic`, or whose
    /// target name under `template` is `topic`, is skipped (with one warning). Were it
    /// mirrored, the mirror would read another's bookkeeping as its own: in a chain
    /// X -> Y -> Z with default names, Y -> Z would take X -> Y's ACL records for those it
    /// made on Z, and delete ACLs an administrator made there.
    pub fn protect_own(&mut self, topic: &str, what: &'static str, template: &TopicTemplate) {
        self.owned.push((topic.to_owned(), what));
        self.template = template.clone();
    }

    /// Mirrors `topic` too, whether the whitelist matches it or not (the heartbeats topic:
    /// MirrorMaker 2 mirrors its `heartbeats` topic the same way).
    pub fn always_mirror(&mut self, topic: &str) {
        self.also = Some(topic.to_owned());
    }

    /// Kafka's internal topics (`__consumer_offsets`, `__transaction_state`, ...) are never
    /// mirrored, as with MirrorMaker's `exclude.internal.topics`; nor are mirror-maker's
    /// bookkeeping topics (offset-mapping stores and ACL record topics, see [`BOOKKEEPING`],
    /// [`protect_own`](Self::protect_own)), whatever the whitelist says: in a chain
    /// X → Y → Z, Y's bookkeeping copied to Z would land in the Y → Z mirror's own.
    pub fn matches(&self, topic: &str) -> bool {
        let named = self.regex.is_match(topic) || self.also.as_deref() == Some(topic);
        if topic.starts_with("__") || !named {
            return false;
        }
        let Some(why) = self.store_conflict(topic) else {
            return true;
        };
        let first = self
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.to_owned());
        if first {
            tracing::warn!(
                "not mirroring source topic {topic}, which --whitelist {:?} matches: {why}",
                self.pattern
            );
        }
        false
    }

    /// Why `topic` must not be mirrored for a bookkeeping topic's sake, if it must not.
    fn store_conflict(&self, topic: &str) -> Option<String> {
        if let Some((prefix, what)) = BOOKKEEPING.iter().find(|(p, _)| topic.starts_with(p)) {
            return Some(format!(
                "it is named like a mirror-maker {what} ({prefix}*), another mirror's \
                 bookkeeping"
            ));
        }
        if let Some((own, what)) = self.owned.iter().find(|(own, _)| own == topic) {
            return Some(format!(
                "it has the name of this mirror's {what} ({own}), another mirror's bookkeeping"
            ));
        }
        if self.owned.is_empty() {
            return None;
        }
        let target = self.template.render(topic);
        let (own, what) = self.owned.iter().find(|(own, _)| *own == target)?;
        Some(format!(
            "its target topic would be {own}, this mirror's own {what}; change --target.topic \
             (or the name of the {what})"
        ))
    }

    /// The regex matched against topic names (after [`java_whitelist`]).
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The topics of `metadata` this filter selects, sorted by name, with their partition ids
    /// (sorted): the one place where the source's topic list meets the whitelist.
    pub fn select(&self, metadata: &Metadata) -> Vec<(String, Vec<i32>)> {
        let mut topics: Vec<(String, Vec<i32>)> = metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && self.matches(t.name()))
            .map(|t| {
                let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                ids.sort_unstable();
                (t.name().to_owned(), ids)
            })
            .collect();
        topics.sort();
        topics
    }
}

/// `--whitelist` as Java MirrorMaker's `TopicFilter` read it: surrounding quotes stripped
/// (a properties file or a script may keep them), spaces removed (topic names have none), and
/// a comma-separated list made an alternation (`orders,payments` is `orders|payments`; topic
/// names have no commas). Unlike Java, which replaced every comma, a comma between the braces
/// of a counted repetition (`[0-9]{1,3}`) stays part of the quantifier.
pub fn java_whitelist(given: &str) -> String {
    let unquoted = given
        .trim()
        .trim_start_matches(['"', '\''])
        .trim_end_matches(['"', '\'']);
    let chars: Vec<char> = unquoted.chars().filter(|c| *c != ' ').collect();
    let mut out = String::with_capacity(chars.len());
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                // An escape and the character it escapes are copied as they are.
                out.extend(&chars[i..(i + 2).min(chars.len())]);
                i += 2;
                continue;
            }
            '{' => {
                if let Some(len) = repetition_len(&chars[i..]) {
                    out.extend(&chars[i..i + len]);
                    i += len;
                    continue;
                }
                out.push('{');
            }
            ',' => out.push('|'),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The length of a counted repetition (`{n}`, `{n,}`, `{n,m}`, `{,m}`) at the start of `s`.
fn repetition_len(s: &[char]) -> Option<usize> {
    let close = s.iter().position(|c| *c == '}')?;
    let inside = &s[1..close];
    let counted = !inside.is_empty()
        && inside.iter().all(|c| c.is_ascii_digit() || *c == ',')
        && inside.iter().filter(|c| **c == ',').count() <= 1
        && inside.iter().any(char::is_ascii_digit);
    counted.then_some(close + 1)
}

fn one_line_regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| l.trim_start().starts_with("error:"))
        .map(|l| {
            l.trim_start()
                .trim_start_matches("error:")
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|| text.lines().last().unwrap_or_default().trim().to_owned())
}

/// The header every mirrored record carries with `--loop.prevention true`: one per hop, each
/// naming the cluster the record was copied from.
pub const PROVENANCE_HEADER: &str = "mirror-source";

/// Characters Kafka allows in a topic name.
fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}

/// Checks a topic name given by `flag`: 1 to 249 characters Kafka allows, not `.` or `..`.
pub fn check_topic_name(flag: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 || name == "." || name == ".." {
        return Err(format!(
            "{flag} {name:?} is not a Kafka topic name: 1 to 249 characters, not \".\" or \"..\""
        ));
    }
    if let Some(c) = name.chars().find(|&c| !is_topic_char(c)) {
        return Err(format!(
            "{flag} {name:?} holds {c:?}, which Kafka does not allow in a topic name (only \
             ASCII letters, digits, '.', '_' and '-')"
        ));
    }
    Ok(())
}

/// `--target.topic`: the target topic of a record, made from its source topic. The default,
/// `{topic}`, keeps names unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicTemplate {
    prefix: String,
    suffix: String,
}

impl TopicTemplate {
    /// Parses a template with exactly one `{topic}` and otherwise only characters Kafka
    /// allows in topic names.
    pub fn parse(template: &str) -> Result<TopicTemplate, String> {
        let bad = |why: &str| {
            format!(
                "--target.topic {template:?} {why}; write the target name around {{topic}}, e.g. \
                 \"primary.{{topic}}\""
            )
        };
        let Some((prefix, suffix)) = template.split_once("{topic}") else {
            return Err(bad("has no {topic}"));
        };
        if suffix.contains("{topic}") {
            return Err(bad("has {topic} more than once"));
        }
        if let Some(c) = prefix
            .chars()
            .chain(suffix.chars())
            .find(|c| !is_topic_char(*c))
        {
            return Err(bad(&format!(
                "contains {c:?}, which Kafka does not allow in topic names (letters, digits, \
                 '.', '_' and '-' only)"
            )));
        }
        Ok(TopicTemplate {
            prefix: prefix.to_owned(),
            suffix: suffix.to_owned(),
        })
    }

    /// The topic whose rendering `target` is, if it is one (what a record written to `target`
    /// was routed to before `--target.topic`).
    pub fn source_of<'t>(&self, target: &'t str) -> Option<&'t str> {
        let topic = target
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        (!topic.is_empty()).then_some(topic)
    }

    /// The target topic of `topic`: the one place where a target name is made.
    pub fn render(&self, topic: &str) -> String {
        let mut name = String::with_capacity(self.prefix.len() + topic.len() + self.suffix.len());
        name.push_str(&self.prefix);
        name.push_str(topic);
        name.push_str(&self.suffix);
        name
    }

    /// The target prefix of a source topic-name prefix (a PREFIXED ACL's): the template's
    /// prefix before it, when the template adds nothing after `{topic}` (every target topic of
    /// a source topic starting with `prefix` then starts with the result, and only those do).
    /// `None` for a template with a suffix: no one prefix names those target topics.
    pub fn render_prefix(&self, prefix: &str) -> Option<String> {
        self.suffix
            .is_empty()
            .then(|| format!("{}{prefix}", self.prefix))
    }
}

/// `--loop.prevention true`: the names of both clusters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// Written into every mirrored record's provenance header.
    pub source: String,
    /// Records whose provenance already names this cluster are not mirrored back to it.
    pub target: String,
}

impl Provenance {
    pub fn new(source: Option<&str>, target: Option<&str>) -> Result<Provenance, String> {
        let need = |flag: &str| {
            format!(
                "--loop.prevention true needs {flag} NAME (a name for the cluster, the same in \
                 every mirror that reads or writes it)"
            )
        };
        let source = source.ok_or_else(|| need("--source.cluster.name"))?;
        let target = target.ok_or_else(|| need("--target.cluster.name"))?;
        if source.is_empty() || target.is_empty() {
            return Err("cluster names must not be empty".to_owned());
        }
        if source == target {
            return Err(format!(
                "--source.cluster.name and --target.cluster.name are both {source:?}; give each \
                 cluster its own name"
            ));
        }
        Ok(Provenance {
            source: source.to_owned(),
            target: target.to_owned(),
        })
    }

    /// Whether `message` was mirrored out of the target cluster before (any hop).
    pub fn came_from_target<'h>(&self, mut headers: impl Iterator<Item = Header<'h>>) -> bool {
        headers.any(|h| {
            h.key == PROVENANCE_HEADER.as_bytes() && h.value == Some(self.target.as_bytes())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeats_topic_is_mirrored_whatever_the_whitelist_says() {
        let mut orders = TopicFilter::new("orders").unwrap();
        assert!(!orders.matches("mirror-maker.heartbeats"));
        orders.always_mirror("mirror-maker.heartbeats");
        assert!(orders.matches("mirror-maker.heartbeats"));
        assert!(orders.matches("orders"));
        // Only that name: neither a prefix of it nor another topic.
        assert!(!orders.matches("mirror-maker.heartbeats.old"));
        assert!(!orders.matches("payments"));
    }

    #[test]
    fn an_offset_mapping_store_is_never_mirrored_even_by_dot_star() {
        // A chain X -> Y -> Z with default names: Y holds the first mirror's store.
        let all = TopicFilter::new(".*").unwrap();
        assert!(all.matches("orders"));
        assert!(!all.matches("mirror-maker.offsets.source"));
        assert!(!all.matches("mirror-maker.offsets.dc1"));
        assert!(!all.matches("__consumer_offsets"));
    }

    #[test]
    fn an_acl_record_topic_is_never_mirrored_even_by_dot_star() {
        // A chain X -> Y -> Z with default names and --sync.topic.acls: Y holds X -> Y's
        // record of the ACLs it made there.
        let all = TopicFilter::new(".*").unwrap();
        assert!(!all.matches("mirror-maker.acls.source"));
        assert!(!all.matches("mirror-maker.acls.dc1"));
        assert!(all.matches("mirror-maker.aclsource"));
    }

    #[test]
    fn no_source_topic_is_mirrored_into_this_mirrors_own_acl_record_topic() {
        let mut renamed = TopicFilter::new(".*").unwrap();
        let template = TopicTemplate::parse("dc1.{topic}").unwrap();
        renamed.protect_own("dc1.offsets", "offset-mapping store", &template);
        renamed.protect_own("dc1.grants", "ACL record topic", &template);
        assert!(
            !renamed.matches("grants"),
            "its target name would be the record topic"
        );
        assert!(!renamed.matches("offsets"));
        assert!(renamed.matches("orders"));
    }

    #[test]
    fn no_source_topic_is_mirrored_into_this_mirrors_own_store() {
        let mut renamed = TopicFilter::new(".*").unwrap();
        renamed.protect_own(
            "dc1.offsets",
            "offset-mapping store",
            &TopicTemplate::parse("dc1.{topic}").unwrap(),
        );
        // Its target name would be the store.
        assert!(!renamed.matches("offsets"));
        assert!(renamed.matches("orders"));
        // Named like the store itself (a store of another mirror on the source).
        assert!(!renamed.matches("dc1.offsets"));
        let mut plain = TopicFilter::new("orders|mapping").unwrap();
        plain.protect_own("mapping", "offset-mapping store", &TopicTemplate::default());
        assert!(!plain.matches("mapping"));
        assert!(plain.matches("orders"));
    }

    #[test]
    fn templates_put_the_source_topic_where_it_says() {
        let t = TopicTemplate::parse("primary.{topic}").unwrap();
        assert_eq!(t.render("orders"), "primary.orders");
        let t = TopicTemplate::parse("{topic}-copy").unwrap();
        assert_eq!(t.render("orders"), "orders-copy");
        assert_eq!(
            TopicTemplate::parse("{topic}").unwrap(),
            TopicTemplate::default()
        );
        assert_eq!(TopicTemplate::default().render("orders"), "orders");
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        for (template, why) in [
            ("primary", "has no {topic}"),
            ("{topic}.{topic}", "more than once"),
            ("a/{topic}", "'/'"),
            ("{topic} x", "' '"),
            ("{topc}", "has no {topic}"),
        ] {
            let e = TopicTemplate::parse(template).unwrap_err();
            assert!(e.contains(why), "{template}: {e}");
        }
    }

    #[test]
    fn provenance_needs_two_distinct_names() {
        assert!(Provenance::new(Some("eu"), None)
            .unwrap_err()
            .contains("--target.cluster.name"));
        assert!(Provenance::new(Some("eu"), Some("eu"))
            .unwrap_err()
            .contains("its own name"));
        assert_eq!(
            Provenance::new(Some("eu"), Some("us")).unwrap().target,
            "us"
        );
    }

    #[test]
    fn whitelist_matches_the_whole_topic_name() {
        let f = TopicFilter::new("orders|payments.*").unwrap();
        assert!(f.matches("orders"));
        assert!(f.matches("payments.eu"));
        assert!(!f.matches("orders2"));
        assert!(!f.matches("old.orders"));
        assert!(!TopicFilter::new(".*")
            .unwrap()
            .matches("__consumer_offsets"));
    }

    #[test]
    fn a_java_style_comma_list_is_an_alternation() {
        // As Java MirrorMaker's TopicFilter: commas are alternatives, spaces are removed,
        // surrounding quotes (a properties file or a shell script's) are stripped.
        for given in [
            "orders,payments",
            "orders, payments",
            " orders , payments ",
            "'orders,payments'",
            "\"orders,payments\"",
            "\"'orders, payments'\"",
        ] {
            let f = TopicFilter::new(given).unwrap();
            assert!(f.matches("orders") && f.matches("payments"), "{given:?}");
            assert!(!f.matches("orders,payments"), "{given:?}");
            assert!(!f.matches("refunds"), "{given:?}");
            assert_eq!(f.pattern(), "orders|payments", "{given:?}");
        }
        let f = TopicFilter::new("orders.*,payments").unwrap();
        assert!(f.matches("orders.eu") && f.matches("payments") && !f.matches("payments.eu"));
    }

    #[test]
    fn a_comma_inside_a_repetition_quantifier_stays_a_quantifier() {
        // Java's TopicFilter turns every comma into `|`, which breaks `{1,3}`; here a comma
        // between the braces of a counted repetition is left alone.
        let f = TopicFilter::new("t[0-9]{1,3}").unwrap();
        assert!(f.matches("t1") && f.matches("t123") && !f.matches("t1234"));
        assert_eq!(f.pattern(), "t[0-9]{1,3}");
        let f = TopicFilter::new("a{2,},b{0,1}x").unwrap();
        assert!(f.matches("aa") && f.matches("aaa") && f.matches("x") && f.matches("bx"));
        assert!(!f.matches("a") && !f.matches("bbx"));
        // An escaped brace is a literal, not a quantifier: the comma after it separates.
        let f = TopicFilter::new(r"a\{1,b").unwrap();
        assert_eq!(f.pattern(), r"a\{1|b");
    }

    #[test]
    fn a_bad_regex_is_one_line() {
        let err = TopicFilter::new("orders(").unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("orders("), "{err}");
    }

    #[test]
    fn a_whitelist_that_is_empty_once_read_as_java_reads_it_is_refused() {
        for given in ["", "  ", "''", "\"\"", ",", " , "] {
            let err = TopicFilter::new(given).unwrap_err().to_string();
            assert!(err.contains("'.*'"), "{given:?}: {err}");
        }
    }
}
