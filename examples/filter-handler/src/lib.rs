//! Drops records whose key, or a given header, matches a pattern; passes the rest unchanged.
//!
//! Args: `key=REGEX` or `header:NAME=REGEX`, several separated by `;`. A record is dropped
//! if any rule matches (a null key or a missing header never matches).
//!
//! `mirror-maker ... --message.handler target/debug/libfilter_handler.so --message.handler.args 'key=^test-;header:env=^staging$'`

use mirror_maker_plugin::{export_message_handler, MessageHandler, Output, Record};
use regex::bytes::Regex;

enum Rule {
    Key(Regex),
    Header(String, Regex),
}

pub struct Filter {
    rules: Vec<Rule>,
}

impl MessageHandler for Filter {
    fn init(args: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for rule in args.split(';').map(str::trim).filter(|r| !r.is_empty()) {
            let (target, pattern) = rule
                .split_once('=')
                .ok_or_else(|| format!("rule {rule:?}: expected key=REGEX or header:NAME=REGEX"))?;
            let regex = Regex::new(pattern).map_err(|e| format!("rule {rule:?}: {e}"))?;
            rules.push(match target.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Rule::Header(name.to_owned(), regex),
                None if target == "key" => Rule::Key(regex),
                _ => {
                    return Err(format!(
                        "rule {rule:?}: expected key=REGEX or header:NAME=REGEX"
                    ))
                }
            });
        }
        if rules.is_empty() {
            return Err("no rule given: expected key=REGEX or header:NAME=REGEX".to_owned());
        }
        Ok(Filter { rules })
    }

    fn handle(&mut self, record: &Record<'_>, out: &mut Output<'_>) -> Result<(), String> {
        let dropped = self.rules.iter().any(|rule| match rule {
            Rule::Key(re) => record.key().is_some_and(|k| re.is_match(k)),
            Rule::Header(name, re) => record
                .headers()
                .any(|(k, v)| k == name.as_bytes() && v.is_some_and(|v| re.is_match(v))),
        });
        if !dropped {
            out.emit(&record.as_output())?;
        }
        Ok(())
    }
}

export_message_handler!(Filter);
