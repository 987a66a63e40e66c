//! Writes each record to several target topics.
//!
//! Args: comma-separated topic templates, e.g. `{topic},{topic}.audit` (the default).

use mirror_maker_plugin::{export_message_handler, MessageHandler, Output, Record};

pub struct FanOut {
    templates: Vec<String>,
}

impl MessageHandler for FanOut {
    fn init(args: &str) -> Result<Self, String> {
        let args = if args.trim().is_empty() {
            "{topic},{topic}.audit"
        } else {
            args
        };
        let templates: Vec<String> = args.split(',').map(|t| t.trim().to_owned()).collect();
        if templates.iter().any(String::is_empty) {
            return Err(format!("{args:?}: an empty topic template"));
        }
        Ok(FanOut { templates })
    }

    fn handle(&mut self, record: &Record<'_>, out: &mut Output<'_>) -> Result<(), String> {
        for template in &self.templates {
            let topic = template.replace("{topic}", record.topic());
            let mut output = record.as_output();
            output.topic = &topic;
            out.emit(&output)?;
        }
        Ok(())
    }
}

export_message_handler!(FanOut);
