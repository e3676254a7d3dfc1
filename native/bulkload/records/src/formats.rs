//! The checks of `freshroute.formats` (`key_problem`, `value_problem`), word for word: a record that fails them is
//! skipped and counted, as the store node's tailer does. One corpus holds the two to each other:
//! `tests/data/record_corpus.json`, whose expectations `tests/unit/test_bulkload_formats.py` makes from the Python
//! checks and `cargo test` (below) holds these to.

#[derive(Clone, Copy)]
pub enum Format {
    Bytes,
    Text,
    Json,
}

impl Format {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "bytes" => Ok(Format::Bytes),
            "string" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown format {other:?}")),
        }
    }

    fn accepts(self, raw: &[u8]) -> bool {
        match self {
            Format::Bytes => true,
            Format::Text => std::str::from_utf8(raw).is_ok(),
            // One JSON document in UTF-8. serde_json skips a string's escapes without decoding them, and
            // nesting without limit: both are checked apart, by a scan only values that may fail them need.
            Format::Json => {
                std::str::from_utf8(raw).is_ok()
                    && serde_json::from_slice::<serde::de::IgnoredAny>(raw).is_ok()
                    && (!may_nest_too_deep(raw) && !has_unicode_escape(raw) || escapes_and_depth_ok(raw))
            }
        }
    }
}

/// The deepest nesting of arrays and objects a JSON document may have (`freshroute.formats.MAX_JSON_DEPTH`).
const MAX_JSON_DEPTH: usize = 512;

fn has_unicode_escape(raw: &[u8]) -> bool {
    raw.contains(&b'\\') && raw.windows(2).any(|w| w == b"\\u")
}

fn may_nest_too_deep(raw: &[u8]) -> bool {
    raw.iter().filter(|&&b| b == b'[' || b == b'{').count() > MAX_JSON_DEPTH
}

/// Of a syntactically valid document: nested at most MAX_JSON_DEPTH deep, and every `\\u` escape a character (a
/// surrogate only as the first of a pair).
fn escapes_and_depth_ok(raw: &[u8]) -> bool {
    let (mut depth, mut in_string, mut i) = (0usize, false, 0usize);
    let unit = |at: usize| -> Option<u32> {
        let hex = raw.get(at..at + 4)?;
        u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    while i < raw.len() {
        let b = raw[i];
        if in_string {
            match b {
                b'"' => in_string = false,
                b'\\' if raw.get(i + 1) == Some(&b'u') => {
                    let Some(first) = unit(i + 2) else { return false };
                    i += 6;
                    if (0xDC00..0xE000).contains(&first) {
                        return false; // a second half without a first
                    }
                    if (0xD800..0xDC00).contains(&first) {
                        if raw.get(i..i + 2) != Some(&b"\\u"[..]) {
                            return false;
                        }
                        match unit(i + 2) {
                            Some(second) if (0xDC00..0xE000).contains(&second) => i += 6,
                            _ => return false,
                        }
                    }
                    continue;
                }
                b'\\' => i += 1,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_JSON_DEPTH {
                        return false;
                    }
                }
                b']' | b'}' => depth -= 1,
                _ => {}
            }
        }
        i += 1;
    }
    true
}

pub fn key_problem(format: Format, key: Option<&[u8]>) -> Option<&'static str> {
    match key {
        None => Some("null key"),
        Some(raw) if !format.accepts(raw) => Some(match format {
            Format::Json => "key is not JSON",
            _ => "key is not UTF-8",
        }),
        _ => None,
    }
}

pub fn value_problem(format: Format, value: Option<&[u8]>) -> Option<&'static str> {
    match value {
        Some(raw) if !format.accepts(raw) => Some(match format {
            Format::Json => "value is not JSON",
            _ => "value is not UTF-8 text",
        }),
        _ => None, // a tombstone deletes its key
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{bytes, corpus};

    /// Every (key format, value format, key, value) of the corpus gets the problem the Python checks give it.
    #[test]
    fn the_checks_are_freshroute_formats_on_the_shared_corpus() {
        let corpus = corpus("record_corpus.json");
        let (keys, values) = (corpus["keys"].as_array().unwrap(), corpus["values"].as_array().unwrap());
        let mut checked = 0;
        for case in corpus["expected"].as_array().unwrap() {
            let key_format = Format::parse(case["key_format"].as_str().unwrap()).unwrap();
            let value_format = Format::parse(case["value_format"].as_str().unwrap()).unwrap();
            let mut problems = case["problems"].as_array().unwrap().iter();
            for key in keys {
                for value in values {
                    let (key, value) = (bytes(key), bytes(value));
                    let got = key_problem(key_format, key.as_deref())
                        .or_else(|| value_problem(value_format, value.as_deref()));
                    let want = problems.next().unwrap().as_str();
                    assert_eq!(got, want, "key {key:?} value {:?}", value.as_deref().map(String::from_utf8_lossy));
                    checked += 1;
                }
            }
            assert!(problems.next().is_none());
        }
        assert!(checked > 3000, "{checked} cases");
    }

    #[test]
    fn unknown_formats_are_refused() {
        assert_eq!(Format::parse("avro").err().unwrap(), "unknown format \"avro\"");
    }
}
