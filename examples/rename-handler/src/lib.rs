//! Renames the target topic from a template and adds a provenance header.
//!
//! Args: `topic=TEMPLATE;header=NAME:VALUE`, e.g. `topic=eu-west.{topic};header=mirror-source:eu-west`.
//! `{topic}` is the source topic. Both parts are optional; everything else is kept as it is.

use mirror_maker_plugin::{export_message_handler, MessageHandler, Output, Record};

pub struct Rename {
    template: String,
    header: Option<(String, Vec<u8>)>,
}

impl MessageHandler for Rename {
    fn init(args: &str) -> Result<Self, String> {
        let mut rename = Rename {
            template: "{topic}".to_owned(),
            header: None,
        };
        for part in args.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("topic", t)) if !t.is_empty() => rename.template = t.to_owned(),
                Some(("header", h)) => {
                    let (name, value) = h
                        .split_once(':')
                        .filter(|(n, _)| !n.is_empty())
                        .ok_or_else(|| format!("{part:?}: expected header=NAME:VALUE"))?;
                    rename.header = Some((name.to_owned(), value.as_bytes().to_vec()));
                }
                _ => {
                    return Err(format!(
                        "{part:?}: expected topic=TEMPLATE or header=NAME:VALUE"
                    ))
                }
            }
        }
        Ok(rename)
    }

    fn handle(&mut self, record: &Record<'_>, out: &mut Output<'_>) -> Result<(), String> {
        let topic = self.template.replace("{topic}", record.topic());
        let mut output = record.as_output();
        output.topic = &topic;
        if let Some((name, value)) = &self.header {
            output.headers.push((name.as_bytes(), Some(value)));
        }
        out.emit(&output)
    }
}

export_message_handler!(Rename);
