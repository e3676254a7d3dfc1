//! The checks of `freshroute.formats` (`key_problem`, `value_problem`), word for word: a record that fails them is
//! skipped and counted, as the store node's tailer does. `tests/unit/test_bulkload_formats.py` holds the two to one
//! corpus.

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

#[derive(Clone, Copy)]
pub enum Format {
    Bytes,
    Text,
    Json,
}

impl Format {
    pub fn parse(name: &str) -> PyResult<Self> {
        match name {
            "bytes" => Ok(Format::Bytes),
            "string" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(PyValueError::new_err(format!("unknown format {other:?}"))),
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

