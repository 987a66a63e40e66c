//! Java `.properties` files, read as Java's MirrorMaker reads its `--consumer.config` and
//! `--producer.config`: Kafka's `Utils.loadProps` hands a file's `InputStream` to
//! `java.util.Properties.load(InputStream)`, which reads the bytes as ISO-8859-1. This is a
//! port of that method (Java 17's `Properties.LineReader` and `loadConvert`): the same line
//! ends (LF, CR, CR LF), whitespace (space, tab, form feed), comments, continuations,
//! separators and escapes, checked against Java itself (the tests).
//!
//! Encoding: each byte is one character (ISO-8859-1), as in Java. A file written as UTF-8
//! therefore reads its non-ASCII characters as Java does, as two or three characters each:
//! a password that works with Java's MirrorMaker works here (librdkafka then sends the
//! characters as UTF-8, as Java's SASL clients do), which is what a user migrating from Java
//! needs. Reading UTF-8 as UTF-8 would turn such a password into another one. The caller warns
//! about keys whose values hold such bytes ([`Parsed::non_ascii`]), since a new user may not
//! expect it; `\uXXXX` escapes read the same in both.
//!
//! Java keeps what UTF-8 cannot hold, half a surrogate pair (`\uD83D` alone), in its strings;
//! librdkafka takes UTF-8, so such a value is refused. Errors never hold a character of a
//! value: they name the key, the line and the position.

use std::collections::BTreeMap;

/// What a `.properties` file holds.
#[derive(Debug, Default)]
pub struct Parsed {
    pub props: BTreeMap<String, String>,
    /// `(line, key)` of each property whose text holds bytes above 0x7F, in file order.
    pub non_ascii: Vec<(usize, String)>,
}

/// An error at a 1-based line; the message names no character of a value.
#[derive(Debug, PartialEq, Eq)]
pub struct Error {
    pub line: usize,
    pub message: String,
}

/// Reads a `.properties` file as Java's `Properties.load(InputStream)`. A later key replaces an
/// earlier one, as in Java.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Error> {
    let mut out = Parsed::default();
    let mut lines = LineReader::new(bytes);
    while let Some(line) = lines.next_line() {
        let (key_end, value_start) = split(&line.chars);
        let key = convert(&line.chars[..key_end]).map_err(|e| Error {
            line: line.number,
            message: format!("the key {}", e.describe()),
        })?;
        if key.is_empty() {
            return Err(Error {
                line: line.number,
                message: "a property with an empty key".to_owned(),
            });
        }
        let value = convert(&line.chars[value_start..]).map_err(|e| Error {
            line: line.number,
            message: format!("the value of `{key}` {}", e.describe()),
        })?;
        if line.non_ascii {
            out.non_ascii.push((line.number, key.clone()));
        }
        out.props.insert(key, value);
    }
    Ok(out)
}

/// Whether `bytes` are plainly a Java properties file of client settings, for a file whose
/// name says no format and that is not TOML: it reads without error, holds at least one
/// property, every key is a property name (ASCII letters, digits, `.`, `_`, `-`) and one at
/// least is dotted (`bootstrap.servers`), and no value starts as TOML's strings, arrays and
/// tables do (`"`, `'`, `[`, `{`). A TOML file with a mistake is no properties file: read so,
/// its quotes would end up in the values.
pub fn is_plain(bytes: &[u8]) -> bool {
    let Ok(parsed) = parse(bytes) else {
        return false;
    };
    let name = |key: &str| {
        key.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let tomlish = |value: &str| value.starts_with(['"', '\'', '[', '{']);
    !parsed.props.is_empty()
        && parsed.props.keys().any(|k| k.contains('.'))
        && parsed
            .props
            .iter()
            .all(|(key, value)| name(key) && !tomlish(value))
}

/// One logical line: continuations joined, without the backslashes that join them.
struct Line {
    /// ISO-8859-1: one character per byte, each at most U+00FF.
    chars: Vec<char>,
    /// The physical line it starts on, from 1.
    number: usize,
    non_ascii: bool,
}

/// Java's whitespace in a `.properties` file: not Unicode's (U+00A0 and U+0085 are not).
fn java_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\x0c')
}

/// Java 17's `Properties.LineReader.readLine`, over bytes read as ISO-8859-1.
struct LineReader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The physical line of `bytes[at]`, from 1.
    line: usize,
}

impl<'a> LineReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        LineReader {
            bytes,
            at: 0,
            line: 1,
        }
    }

    fn next_line(&mut self) -> Option<Line> {
        let mut chars = Vec::new();
        let mut skip_white_space = true;
        let mut appended_line_begin = false;
        let mut preceding_backslash = false;
        let mut non_ascii = false;
        let mut number = self.line;
        loop {
            let Some(&byte) = self.bytes.get(self.at) else {
                if chars.is_empty() {
                    return None;
                }
                if preceding_backslash {
                    chars.pop();
                }
                return Some(Line {
                    chars,
                    number,
                    non_ascii,
                });
            };
            self.at += 1;
            let c = char::from(byte);
            if skip_white_space {
                if java_space(c) {
                    continue;
                }
                if !appended_line_begin && (c == '\r' || c == '\n') {
                    self.end_of_line(c);
                    continue;
                }
                skip_white_space = false;
                appended_line_begin = false;
            }
            if chars.is_empty() {
                // A new logical line (or what a continuation left empty) starts here.
                number = self.line;
                if c == '#' || c == '!' {
                    // A comment, to the end of the physical line; it never continues.
                    while let Some(&b) = self.bytes.get(self.at) {
                        self.at += 1;
                        if b == b'\n' || b == b'\r' {
                            self.end_of_line(char::from(b));
                            break;
                        }
                    }
                    skip_white_space = true;
                    continue;
                }
            }
            if c != '\n' && c != '\r' {
                non_ascii |= byte > 0x7f;
                chars.push(c);
                preceding_backslash = c == '\\' && !preceding_backslash;
                continue;
            }
            // The end of a physical line.
            self.end_of_line(c);
            if chars.is_empty() {
                skip_white_space = true;
                continue;
            }
            if self.at >= self.bytes.len() {
                if preceding_backslash {
                    chars.pop();
                }
                return Some(Line {
                    chars,
                    number,
                    non_ascii,
                });
            }
            if !preceding_backslash {
                return Some(Line {
                    chars,
                    number,
                    non_ascii,
                });
            }
            // A continuation: the backslash goes, the next line's leading whitespace too.
            chars.pop();
            skip_white_space = true;
            appended_line_begin = true;
            preceding_backslash = false;
        }
    }

    /// After the line end `c` (just read): CR LF is one line end.
    fn end_of_line(&mut self, c: char) {
        if c == '\r' && self.bytes.get(self.at) == Some(&b'\n') {
            self.at += 1;
        }
        self.line += 1;
    }
}

/// Where the key ends and the value starts (Java's `Properties.load0`): the key ends at the
/// first unescaped `=`, `:` or whitespace; whitespace and one `=` or `:` follow it.
fn split(line: &[char]) -> (usize, usize) {
    let mut key_len = 0;
    let mut value_start = line.len();
    let mut has_separator = false;
    let mut preceding_backslash = false;
    while key_len < line.len() {
        let c = line[key_len];
        if (c == '=' || c == ':') && !preceding_backslash {
            value_start = key_len + 1;
            has_separator = true;
            break;
        } else if java_space(c) && !preceding_backslash {
            value_start = key_len + 1;
            break;
        }
        preceding_backslash = c == '\\' && !preceding_backslash;
        key_len += 1;
    }
    while value_start < line.len() {
        let c = line[value_start];
        if !java_space(c) {
            if !has_separator && (c == '=' || c == ':') {
                has_separator = true;
            } else {
                break;
            }
        }
        value_start += 1;
    }
    (key_len, value_start)
}

/// What is wrong with a key's or value's escapes, at a 1-based character position.
enum Bad {
    /// `\u` without four hex digits.
    Escape(usize),
    /// Half a UTF-16 surrogate pair.
    Surrogate(usize),
}

impl Bad {
    fn describe(&self) -> String {
        match self {
            Bad::Escape(at) => format!(
                "has a malformed \\uxxxx escape at character {at}: \\u takes exactly 4 hex \
                 digits (Java refuses it too)"
            ),
            Bad::Surrogate(at) => format!(
                "has half a UTF-16 surrogate pair (\\uD800 to \\uDFFF) without its other half at \
                 character {at}: librdkafka takes UTF-8 text, which cannot hold it; escape a \
                 character above U+FFFF as both halves of its pair"
            ),
        }
    }
}

/// Java's `Properties.loadConvert`: the escapes `\t`, `\n`, `\r`, `\f`, `\uXXXX` (UTF-16
/// code units, a pair for a character above U+FFFF); a backslash before any other character
/// is dropped.
fn convert(text: &[char]) -> Result<String, Bad> {
    // UTF-16 code units, each with the character position it came from.
    let mut units: Vec<(u16, usize)> = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        let at = i + 1;
        i += 1;
        if c != '\\' {
            // ISO-8859-1: at most U+00FF, one unit.
            units.push((c as u16, at));
            continue;
        }
        // A backslash never ends a key or value (the line reader drops one at a line end).
        let Some(&escaped) = text.get(i) else { break };
        i += 1;
        let unit = match escaped {
            'u' => {
                let digits = text.get(i..i + 4).ok_or(Bad::Escape(at))?;
                let mut value: u16 = 0;
                for d in digits {
                    let digit = d.to_digit(16).ok_or(Bad::Escape(at))?;
                    value = (value << 4) | digit as u16;
                }
                i += 4;
                value
            }
            't' => '\t' as u16,
            'r' => '\r' as u16,
            'n' => '\n' as u16,
            'f' => 0x0c,
            other => other as u16,
        };
        units.push((unit, at));
    }
    let mut out = String::with_capacity(units.len());
    let decoded = char::decode_utf16(units.iter().map(|(u, _)| *u));
    let mut consumed = 0;
    for c in decoded {
        match c {
            Ok(c) => {
                consumed += c.len_utf16();
                out.push(c);
            }
            Err(_) => return Err(Bad::Surrogate(units[consumed].1)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(bytes: &[u8]) -> Vec<(String, String)> {
        parse(bytes).unwrap().props.into_iter().collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_dotted_property_names_with_values_no_toml_would_quote_are_plainly_properties() {
        for plain in [
            &b"bootstrap.servers=a:9092\ngroup.id=g\n"[..],
            b"# comment\n! comment\nbootstrap.servers: a:9092\nacks all\n",
            b"sasl.jaas.config=org.Module required \\\n  username=\"u\";\n",
        ] {
            assert!(is_plain(plain), "{}", String::from_utf8_lossy(plain));
        }
        for not in [
            &b""[..],
            b"# only a comment\n",
            b"acks=all\n",
            b"bootstrap.servers = \"a:9092\n",
            b"[consumer]\nbootstrap.servers=a:9092\n",
            b"bootstrap.servers = ['a:9092']\n",
            b"ssl = { key = 1 }\nbootstrap.servers=a\n",
        ] {
            assert!(!is_plain(not), "{}", String::from_utf8_lossy(not));
        }
    }

    // Each expectation below is what Java 17's `Properties.load(InputStream)` returns for the
    // same bytes (checked with a small Java program).

    #[test]
    fn separators_whitespace_and_escaped_separators_as_in_java() {
        assert_eq!(
            props(b"k\\=x=y\nk2\\ x y\n"),
            pairs(&[("k2 x", "y"), ("k=x", "y")])
        );
        assert_eq!(props(b" \x0c\tk \t = : v \n"), pairs(&[("k", ": v ")]));
        assert_eq!(props(b"k\n"), pairs(&[("k", "")]));
        assert_eq!(props(b"k=a\x85b\n"), pairs(&[("k", "a\u{85}b")]));
        assert_eq!(
            props(b"a\xa0b=1\n\xa0c=2\n"),
            pairs(&[("a\u{a0}b", "1"), ("\u{a0}c", "2")])
        );
    }

    #[test]
    fn continuations_as_in_java() {
        assert_eq!(props(b"k=a\\\n   \\\n   b\n"), pairs(&[("k", "ab")]));
        assert_eq!(props(b"a=b\\\n\nc=d\n"), pairs(&[("a", "b"), ("c", "d")]));
        assert_eq!(props(b"a=b\\"), pairs(&[("a", "b")]));
        // An even number of backslashes does not continue.
        assert_eq!(props(b"a=b\\\\\nc=d\n"), pairs(&[("a", "b\\"), ("c", "d")]));
    }

    #[test]
    fn escapes_as_in_java() {
        assert_eq!(
            props(b"k=\\t\\n\\r\\f\\q\\u00e9\\uD83D\\uDE00\n"),
            pairs(&[("k", "\t\n\r\x0cq\u{e9}\u{1F600}")])
        );
    }

    #[test]
    fn errors_carry_the_line_of_the_logical_line_and_no_value() {
        let err = parse(b"# one\n\na=1\r\nb=\\\n  \\u12\n").unwrap_err();
        assert_eq!(err.line, 4, "{}", err.message);
        assert!(
            err.message.starts_with("the value of `b`"),
            "{}",
            err.message
        );
        let err = parse(b"a=1\rb\\u1=2\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.starts_with("the key has"), "{}", err.message);
        let err = parse(b"=v\n").unwrap_err();
        assert_eq!(err.line, 1);
    }

    #[test]
    fn the_keys_of_lines_with_non_ascii_bytes_are_listed() {
        let parsed = parse(b"a=1\nb=p\xc3\xa4ss\nc=\\u00e4\n").unwrap();
        assert_eq!(parsed.non_ascii, [(2, "b".to_owned())]);
    }
}
