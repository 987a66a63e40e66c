//! Where records go on the target: topic renaming (`--target.topic`) and the provenance
//! header that keeps active-active mirrors from sending records back where they came from.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::rc::Rc;

use crate::source::Header;

/// The header every mirrored record carries with `--loop.prevention true`: one per hop, each
/// naming the cluster the record was copied from.
pub const PROVENANCE_HEADER: &str = "mirror-source";

/// Characters Kafka allows in a topic name.
fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}

/// `--target.topic`: the target topic of a record, made from its source topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    prefix: String,
    suffix: String,
}

impl TopicTemplate {
    /// Parses a template with exactly one `{topic}` and otherwise only characters Kafka
    /// allows in topic names. `None` for `{topic}` itself (names unchanged).
    pub fn parse(template: &str) -> Result<Option<TopicTemplate>, String> {
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
        if prefix.is_empty() && suffix.is_empty() {
            return Ok(None);
        }
        Ok(Some(TopicTemplate {
            prefix: prefix.to_owned(),
            suffix: suffix.to_owned(),
        }))
    }

    pub fn render(&self, topic: &str) -> String {
        format!("{}{topic}{}", self.prefix, self.suffix)
    }
}

/// Target topic names as C strings, made once per source topic (renamed by the template,
/// if any); a stream keeps one, so producing a record allocates no name.
#[derive(Debug, Default)]
pub struct TargetNames {
    template: Option<TopicTemplate>,
    /// Looked up for every record, hence the fast hash.
    cache: RefCell<FxHashMap<String, Rc<CStr>>>,
    /// The previous record's topic and target: records come in runs from one topic, and
    /// comparing one name is cheaper than hashing it.
    last: RefCell<Option<(String, Rc<CStr>)>>,
}

impl TargetNames {
    pub fn new(template: Option<TopicTemplate>) -> TargetNames {
        TargetNames {
            template,
            cache: RefCell::default(),
            last: RefCell::default(),
        }
    }

    /// The target topic of records from `topic`; `None` if the name holds a NUL byte (no
    /// Kafka topic does).
    pub fn of(&self, topic: &str) -> Option<Rc<CStr>> {
        if let Some((last, name)) = &*self.last.borrow() {
            if last == topic {
                return Some(name.clone());
            }
        }
        let name = self.lookup(topic)?;
        let mut last = self.last.borrow_mut();
        match &mut *last {
            // Reuses the String's buffer: no allocation once it is long enough.
            Some((t, n)) => {
                t.clear();
                t.push_str(topic);
                *n = name.clone();
            }
            None => *last = Some((topic.to_owned(), name.clone())),
        }
        Some(name)
    }

    fn lookup(&self, topic: &str) -> Option<Rc<CStr>> {
        if let Some(name) = self.cache.borrow().get(topic) {
            return Some(name.clone());
        }
        let rendered = match &self.template {
            Some(t) => t.render(topic),
            None => topic.to_owned(),
        };
        let name: Rc<CStr> = CString::new(rendered).ok()?.into();
        self.cache
            .borrow_mut()
            .insert(topic.to_owned(), name.clone());
        Some(name)
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
    fn templates_put_the_source_topic_where_it_says() {
        let t = TopicTemplate::parse("primary.{topic}").unwrap().unwrap();
        assert_eq!(t.render("orders"), "primary.orders");
        let t = TopicTemplate::parse("{topic}-copy").unwrap().unwrap();
        assert_eq!(t.render("orders"), "orders-copy");
        assert_eq!(TopicTemplate::parse("{topic}").unwrap(), None);
        let names = TargetNames::new(TopicTemplate::parse("dr.{topic}").unwrap());
        assert_eq!(names.of("a").unwrap().to_str(), Ok("dr.a"));
        assert!(Rc::ptr_eq(&names.of("a").unwrap(), &names.of("a").unwrap()));
        assert_eq!(TargetNames::new(None).of("a").unwrap().to_str(), Ok("a"));
        assert_eq!(TargetNames::new(None).of("a\0b"), None);
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
}
