//! Target topic names as the producer needs them: C strings, made once per source topic.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::settings::routing::TopicTemplate;

/// Target topic names as C strings, made once per source topic (renamed by the template,
/// if any); a stream keeps one, so producing a record allocates no name.
#[derive(Debug, Default)]
pub struct TargetNames {
    template: TopicTemplate,
    /// Looked up for every record, hence the fast hash.
    cache: RefCell<FxHashMap<String, Rc<CStr>>>,
    /// The previous record's topic and target: records come in runs from one topic, and
    /// comparing one name is cheaper than hashing it.
    last: RefCell<Option<(String, Rc<CStr>)>>,
}

impl TargetNames {
    pub fn new(template: TopicTemplate) -> TargetNames {
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
        let name: Rc<CStr> = CString::new(self.template.render(topic)).ok()?.into();
        self.cache
            .borrow_mut()
            .insert(topic.to_owned(), name.clone());
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_rendered_once_per_topic() {
        let names = TargetNames::new(TopicTemplate::parse("dr.{topic}").unwrap());
        assert_eq!(names.of("a").unwrap().to_str(), Ok("dr.a"));
        assert!(Rc::ptr_eq(&names.of("a").unwrap(), &names.of("a").unwrap()));
        let same = TargetNames::new(TopicTemplate::default());
        assert_eq!(same.of("a").unwrap().to_str(), Ok("a"));
        assert_eq!(same.of("a\0b"), None);
    }
}
