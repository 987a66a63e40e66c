//! TOML config files: their keys are librdkafka's own names (dotted keys and tables flattened
//! back to them), their values strings, numbers, booleans or arrays of those.

use std::collections::BTreeMap;

/// What is wrong with a TOML config file; the caller names the file.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TomlError {
    /// Not TOML: the parser's message, on one line.
    Parse(String),
    /// A value librdkafka cannot take (a date-time, a nested array or table).
    Unsupported { key: String, kind: &'static str },
}

/// A TOML config file's settings as librdkafka properties: dotted keys and tables flattened
/// back to librdkafka's names, arrays as comma-separated lists.
pub(super) fn parse(text: &str) -> Result<BTreeMap<String, String>, TomlError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| TomlError::Parse(one_line_toml_error(&e)))?;
    let mut out = BTreeMap::new();
    flatten("", &table, &mut out)?;
    Ok(out)
}

/// "TOML parse error at line 2, column 12: invalid string ..." (the source excerpt dropped).
fn one_line_toml_error(e: &toml::de::Error) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let head = lines.next().unwrap_or_default().to_owned();
    let last = lines
        .rfind(|l| !l.starts_with('|') && !l.contains(" | ") && !l.starts_with(char::is_numeric));
    match last {
        Some(detail) => format!("{head}: {detail}"),
        None => head,
    }
}

fn flatten(
    prefix: &str,
    table: &toml::Table,
    out: &mut BTreeMap<String, String>,
) -> Result<(), TomlError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let unsupported = |kind| TomlError::Unsupported {
            key: key.clone(),
            kind,
        };
        let value = match v {
            toml::Value::Table(t) => {
                flatten(&key, t, out)?;
                continue;
            }
            toml::Value::Array(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for item in items {
                    parts.push(scalar(item).ok_or_else(|| unsupported("nested array or table"))?);
                }
                parts.join(",")
            }
            other => scalar(other).ok_or_else(|| unsupported("date-time"))?,
        };
        out.insert(key, value);
    }
    Ok(())
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_dotted_keys_are_flattened_back_to_librdkafka_names() {
        let text = "bootstrap.servers = \"a:9092\"\ngroup.id = \"mirror\"\nfetch.wait.max.ms = 10\nenable.auto.commit = false\n";
        let props = parse(text).unwrap();
        assert_eq!(props["bootstrap.servers"], "a:9092");
        assert_eq!(props["group.id"], "mirror");
        assert_eq!(props["fetch.wait.max.ms"], "10");
        assert_eq!(props["enable.auto.commit"], "false");
    }

    #[test]
    fn toml_arrays_become_comma_lists_and_errors_name_the_line() {
        let props = parse("partition.assignment.strategy = [\"range\", \"roundrobin\"]").unwrap();
        assert_eq!(props["partition.assignment.strategy"], "range,roundrobin");
        let TomlError::Parse(err) = parse("a = 1\nb = = 2\n").unwrap_err() else {
            panic!("not a parse error");
        };
        assert!(err.contains("line 2"), "{err}");
    }
}
