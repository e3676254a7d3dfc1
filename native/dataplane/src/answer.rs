//! Answers as the REST API writes them (freshroute.routing.results): a found key's body and KEY_NOT_FOUND's, byte
//! for byte what the Python path's orjson writes — tests/integration/test_data_plane.py compares the two.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;

use crate::snapshot::ValueFormat;

/// A replica's staleness at or past this is "never caught up": shown as unknown (freshroute.lag).
pub const NEVER_CAUGHT_UP_MS: i64 = 20 * 365 * 86_400_000;

/// Who answered and how fresh it was.
pub struct Served<'a> {
    pub node: &'a str,
    pub role: &'static str,
    pub lag_offsets: Option<i64>,
    pub lag_ms: Option<i64>,
    pub applied: i64,
}

fn string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string serializes");
}

fn number(out: &mut Vec<u8>, n: Option<i64>) {
    match n {
        Some(n) => out.extend_from_slice(n.to_string().as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// freshroute.position.single: the position token of one partition's applied offset.
pub fn position_token(table: &str, partition: usize, applied: i64) -> String {
    let mut doc = Vec::with_capacity(table.len() + 32);
    doc.extend_from_slice(b"{\"t\":");
    string(&mut doc, table);
    doc.extend_from_slice(format!(",\"o\":{{\"{partition}\":{applied}}}}}").as_bytes());
    format!("p1.{}", URL_SAFE_NO_PAD.encode(doc))
}

/// The "table" and "key" fields KEY_NOT_FOUND's details open with, without braces.
fn where_fields(out: &mut Vec<u8>, table: &str, key: &str) {
    out.extend_from_slice(b"\"table\":");
    string(out, table);
    key_field(out, key);
}

/// The "table", "table_version" and "key" fields an answer opens with (an error's details name no version).
fn answer_fields(out: &mut Vec<u8>, table: &str, version: i32, key: &str) {
    out.extend_from_slice(b"\"table\":");
    string(out, table);
    out.extend_from_slice(format!(",\"table_version\":{version}").as_bytes());
    key_field(out, key);
}

fn key_field(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(b",\"key\":");
    string(out, key);
}

/// Who answered, its lag and its position, which names the table read on the store nodes (`physical`).
fn served_fields(out: &mut Vec<u8>, physical: &str, partition: usize, who: &Served) {
    out.extend_from_slice(format!(",\"partition\":{partition},\"served_by\":{{\"node\":").as_bytes());
    string(out, who.node);
    out.extend_from_slice(b",\"role\":\"");
    out.extend_from_slice(who.role.as_bytes());
    out.extend_from_slice(b"\"},\"lag\":{\"offsets\":");
    number(out, who.lag_offsets);
    out.extend_from_slice(b",\"ms\":");
    number(out, who.lag_ms);
    out.extend_from_slice(b"},\"position\":");
    string(out, &position_token(physical, partition, who.applied));
}

fn input_lag_field(out: &mut Vec<u8>, input_lag: (i64, i64)) {
    out.extend_from_slice(format!(",\"input_lag\":{{\"records\":{},\"ms\":{}}}", input_lag.0, input_lag.1).as_bytes());
}

/// What an answer as of a time adds (freshroute.routing.history.AsOf): the time, the version's interval (none: the
/// key had no version then) and whether it can still change.
pub struct AsOf {
    pub at: i64,
    pub valid_from: Option<i64>,
    pub valid_to: Option<i64>,
    pub settled: bool,
}

impl AsOf {
    fn interval(&self) -> (Option<i64>, Option<i64>) {
        match self.valid_from {
            Some(from) => (Some(from), self.valid_to),
            None => (None, None),
        }
    }
}

/// A found key's body (as of a time, with `as_of`) from version `version` of the table, read from its own table
/// `physical` (which the position names); None when its value is not of the table's format (the Python path says
/// why).
#[allow(clippy::too_many_arguments)]
pub fn found(table: &str, version: i32, physical: &str, key: &str, partition: usize, value: &[u8], format: ValueFormat,
             who: &Served, input_lag: (i64, i64), as_of: Option<&AsOf>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value.len() + table.len() + key.len() + 256);
    out.push(b'{');
    answer_fields(&mut out, table, version, key);
    match format {
        ValueFormat::Json => {
            out.extend_from_slice(b",\"value\":");
            out.extend_from_slice(value);
        }
        ValueFormat::Text => {
            out.extend_from_slice(b",\"value\":");
            string(&mut out, std::str::from_utf8(value).ok()?);
        }
        ValueFormat::Bytes => {
            out.extend_from_slice(b",\"value_b64\":\"");
            out.extend_from_slice(STANDARD.encode(value).as_bytes());
            out.push(b'"');
        }
    }
    if let Some(v) = as_of {
        let (from, to) = v.interval();
        out.extend_from_slice(format!(",\"as_of\":{},\"valid_from\":", v.at).as_bytes());
        number(&mut out, from);
        out.extend_from_slice(b",\"valid_to\":");
        number(&mut out, to);
        out.extend_from_slice(if v.settled { b",\"final\":true" } else { b",\"final\":false" });
    }
    served_fields(&mut out, physical, partition, who);
    input_lag_field(&mut out, input_lag);
    out.push(b'}');
    Some(out)
}

/// Python's repr of a string, where it is simply the text in single quotes; None where repr would escape or
/// switch quotes (the Python path answers those).
fn plain_repr(s: &str) -> Option<String> {
    s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'\'' && b != b'\\').then(|| format!("'{s}'"))
}

/// KEY_NOT_FOUND's message, or None where it needs Python's repr.
pub fn not_found_message(table: &str, key: &str) -> Option<String> {
    Some(format!("key {} not found in table {}", plain_repr(key)?, plain_repr(table)?))
}

/// KEY_NOT_FOUND's body (freshroute.routing.results.key_not_found; as of a time, AsOf.not_found), or None where its
/// message needs Python's repr. `table` is the table read on the store nodes (`t-v2`), which the Python path's
/// error names throughout.
pub fn not_found(table: &str, key: &str, partition: usize, who: &Served, input_lag: (i64, i64),
                 as_of: Option<&AsOf>) -> Option<Vec<u8>> {
    let message = not_found_message(table, key)?;
    let mut out = Vec::with_capacity(table.len() * 2 + key.len() * 2 + 320);
    out.extend_from_slice(b"{\"error\":{\"code\":\"KEY_NOT_FOUND\",\"message\":");
    string(&mut out, &message);
    out.push(b',');
    where_fields(&mut out, table, key);
    served_fields(&mut out, table, partition, who);
    input_lag_field(&mut out, input_lag);
    if let Some(v) = as_of {
        let (from, to) = v.interval();
        out.extend_from_slice(format!(",\"as_of\":{},\"final\":{},\"valid_from\":", v.at, v.settled).as_bytes());
        number(&mut out, from);
        out.extend_from_slice(b",\"valid_to\":");
        number(&mut out, to);
    }
    out.extend_from_slice(b"}}");
    Some(out)
}

/// UNAUTHENTICATED's body (freshroute.errors.Unauthenticated).
pub fn unauthenticated(message: &str) -> Vec<u8> {
    let mut out = b"{\"error\":{\"code\":\"UNAUTHENTICATED\",\"message\":".to_vec();
    string(&mut out, message);
    out.extend_from_slice(b"}}");
    out
}

/// One window of a key as its windows' body lists it.
pub struct Window<'a> {
    pub start: i64,
    pub end: i64,
    /// The changelog value, JSON as stored (empty: null).
    pub value: &'a [u8],
    pub is_final: bool,
}

/// A key's windows' body (freshroute.routing.results.WindowsResult.to_dict) from version `version` of the table, read
/// from its own table `physical` (which the position names).
#[allow(clippy::too_many_arguments)]
pub fn windows(table: &str, version: i32, physical: &str, key: &str, partition: usize, windows: &[Window],
               watermark_ms: Option<i64>, who: &Served, input_lag: (i64, i64)) -> Vec<u8> {
    let mut out = Vec::with_capacity(windows.iter().map(|w| w.value.len() + 64).sum::<usize>() + 320);
    out.push(b'{');
    answer_fields(&mut out, table, version, key);
    out.extend_from_slice(b",\"windows\":[");
    for (i, w) in windows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(format!("{{\"start\":{},\"end\":{},\"value\":", w.start, w.end).as_bytes());
        out.extend_from_slice(if w.value.is_empty() { b"null" } else { w.value });
        out.extend_from_slice(if w.is_final { b",\"final\":true}" } else { b",\"final\":false}" });
    }
    out.push(b']');
    served_fields(&mut out, physical, partition, who);
    out.extend_from_slice(b",\"watermark_ms\":");
    number(&mut out, watermark_ms);
    input_lag_field(&mut out, input_lag);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_tokens_are_the_python_ones() {
        // freshroute.position.single("sensor_stats", 3, 42)
        assert_eq!(position_token("sensor_stats", 3, 42), "p1.eyJ0Ijoic2Vuc29yX3N0YXRzIiwibyI6eyIzIjo0Mn19");
    }

    #[test]
    fn a_found_body_and_a_not_found_body() {
        let who = Served { node: "n1", role: "active", lag_offsets: Some(0), lag_ms: None, applied: 7 };
        let body = found("t", 1, "t", "k\"1", 2, b"{\"a\":1}", ValueFormat::Json, &who, (3, 4), None).unwrap();
        assert_eq!(String::from_utf8(body).unwrap(),
                   format!("{{\"table\":\"t\",\"table_version\":1,\"key\":\"k\\\"1\",\"value\":{{\"a\":1}},\
                            \"partition\":2,\"served_by\":{{\"node\":\"n1\",\"role\":\"active\"}},\"lag\":\
                            {{\"offsets\":0,\"ms\":null}},\"position\":\"{}\",\"input_lag\":\
                            {{\"records\":3,\"ms\":4}}}}", position_token("t", 2, 7)));
        assert!(not_found("t", "it's", 2, &who, (0, 0), None).is_none());
        let body = String::from_utf8(not_found("t", "k", 2, &who, (0, 0), None).unwrap()).unwrap();
        assert!(body.starts_with("{\"error\":{\"code\":\"KEY_NOT_FOUND\",\"message\":\"key 'k' not found in table 't'\",\"table\""));
        // An error's details name the table and key, never a version.
        assert!(body.contains(",\"table\":\"t\",\"key\":\"k\",\"partition\":2,"));
        assert!(!body.contains("table_version"));
        let as_of = AsOf { at: 50, valid_from: Some(40), valid_to: None, settled: true };
        let body = String::from_utf8(not_found("t", "k", 2, &who, (0, 0), Some(&as_of)).unwrap()).unwrap();
        assert!(!body.contains("table_version"));
    }

    #[test]
    fn an_answer_names_the_tables_version_after_the_table() {
        let who = Served { node: "n1", role: "active", lag_offsets: Some(0), lag_ms: Some(0), applied: 7 };
        let as_of = AsOf { at: 50, valid_from: Some(40), valid_to: None, settled: false };
        let body = found("t", 3, "t-v3", "k", 0, b"v", ValueFormat::Text, &who, (0, 0), Some(&as_of)).unwrap();
        assert!(String::from_utf8(body).unwrap().starts_with("{\"table\":\"t\",\"table_version\":3,\"key\":\"k\",\
                                                               \"value\":\"v\",\"as_of\":50,\"valid_from\":40,"));
        let body = found("t", 2, "t-v2", "k", 0, b"\x01", ValueFormat::Bytes, &who, (0, 0), None).unwrap();
        let body = String::from_utf8(body).unwrap();
        assert!(body.starts_with("{\"table\":\"t\",\"table_version\":2,\"key\":\"k\",\"value_b64\":\"AQ==\","));
        // Its position names version 2's own table, whose changelog's offsets it holds.
        assert!(body.contains(&format!(",\"position\":\"{}\",", position_token("t-v2", 0, 7))));
    }

    #[test]
    fn a_windows_body() {
        let who = Served { node: "n1", role: "standby", lag_offsets: None, lag_ms: Some(5), applied: 3 };
        let listed = [Window { start: 0, end: 10, value: b"{\"n\":1}", is_final: true },
                      Window { start: 10, end: 20, value: b"", is_final: false }];
        let body = String::from_utf8(windows("w", 1, "w", "k", 1, &listed, Some(12), &who, (0, 0))).unwrap();
        assert_eq!(body, format!("{{\"table\":\"w\",\"table_version\":1,\"key\":\"k\",\"windows\":[{{\"start\":0,\
                                  \"end\":10,\"value\":{{\"n\":1}},\"final\":true}},{{\"start\":10,\"end\":20,\
                                  \"value\":null,\"final\":false}}],\
                                  \"partition\":1,\"served_by\":{{\"node\":\"n1\",\"role\":\"standby\"}},\"lag\":\
                                  {{\"offsets\":null,\"ms\":5}},\"position\":\"{}\",\"watermark_ms\":12,\"input_lag\":\
                                  {{\"records\":0,\"ms\":0}}}}", position_token("w", 1, 3)));
        let body = String::from_utf8(windows("w", 4, "w-v4", "k", 1, &[], None, &who, (0, 0))).unwrap();
        assert!(body.starts_with("{\"table\":\"w\",\"table_version\":4,\"key\":\"k\",\"windows\":[],\"partition\":1,"));
        assert!(body.contains(&format!(",\"position\":\"{}\",", position_token("w-v4", 1, 3))));
    }
}
