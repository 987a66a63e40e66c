//! Target topic names as the producer needs them: C strings, made once per source topic.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::settings::routing::TopicTemplate;

use super::route::Destination;

/// Target topic names as C strings, made once per source topic (renamed by the template,
/// if any); a stream keeps one, so producing a record allocates no name.
#[derive(Debug, Default)]
pub(crate) struct TargetNames {
    template: TopicTemplate,
    /// Looked up for every record, hence the fast hash.
    cache: RefCell<FxHashMap<String, Rc<CStr>>>,
    /// The previous record's topic and target: records come in runs from one topic, and
    /// comparing one name is cheaper than hashing it.
    last: RefCell<Option<(String, Rc<CStr>)>>,
    /// Target topics named as they are (the dead-letter topic): no template applies.
    exact: RefCell<FxHashMap<String, Rc<CStr>>>,
}

impl TargetNames {
    pub(crate) fn new(template: TopicTemplate) -> TargetNames {
        TargetNames {
            template,
            cache: RefCell::default(),
            last: RefCell::default(),
            exact: RefCell::default(),
        }
    }

    /// The target topic of a record going to `to`.
    pub(crate) fn of_destination(&self, to: Destination<'_>) -> Option<Rc<CStr>> {
        let topic = match to {
            Destination::Mirrored(topic) => return self.of(topic),
            Destination::DeadLetter(topic) => topic,
        };
        if let Some(name) = self.exact.borrow().get(topic) {
            return Some(name.clone());
        }
        let name: Rc<CStr> = CString::new(topic).ok()?.into();
        self.exact
            .borrow_mut()
            .insert(topic.to_owned(), name.clone());
        Some(name)
    }

    /// The target topic of records from `topic`; `None` if the name holds a NUL byte (no
    /// Kafka topic does).
    pub(crate) fn of(&self, topic: &str) -> Option<Rc<CStr>> {
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

    /// As [`Self::of`]; `first` is asked about a target topic the first time this stream
    /// meets it, and may refuse it (then it is not kept, and asked about again next time).
    pub(crate) fn of_admitted<E>(
        &self,
        topic: &str,
        first: impl FnOnce(&str) -> Result<(), E>,
    ) -> Result<Option<Rc<CStr>>, E> {
        if let Some((last, name)) = &*self.last.borrow() {
            if last == topic {
                return Ok(Some(name.clone()));
            }
        }
        if !self.cache.borrow().contains_key(topic) {
            first(&self.template.render(topic))?;
        }
        Ok(self.of(topic))
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
        let dead = names.of_destination(Destination::DeadLetter("refused"));
        assert_eq!(dead.unwrap().to_str(), Ok("refused"), "no template applies");
    }

    #[test]
    fn a_target_topic_is_admitted_once_and_asked_again_after_a_refusal() {
        let names = TargetNames::new(TopicTemplate::parse("dr.{topic}").unwrap());
        let asked = std::cell::Cell::new(0);
        let refuse = |t: &str| {
            asked.set(asked.get() + 1);
            Err(t.to_owned())
        };
        assert_eq!(names.of_admitted("a", refuse), Err("dr.a".to_owned()));
        assert_eq!(names.of_admitted("a", refuse), Err("dr.a".to_owned()));
        let admit = |_: &str| {
            asked.set(asked.get() + 1);
            Ok::<(), String>(())
        };
        assert_eq!(
            names.of_admitted("a", admit).unwrap().unwrap().to_str(),
            Ok("dr.a")
        );
        assert_eq!(
            names.of_admitted("a", admit).unwrap().unwrap().to_str(),
            Ok("dr.a")
        );
        assert_eq!(asked.get(), 3);
    }
}
