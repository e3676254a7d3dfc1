//! Answers as the public gRPC API writes them (router.grpc_messages, router.grpc_errors): a found key's
//! GetResponse, and a failed call's status — its code, its message percent-encoded as gRPC asks, and the trailer
//! `freshroute-error` carrying REST's JSON body in ASCII — what the Python front writes, field for field.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::answer::{self, position_token};
use crate::lookup::KeyAnswer;
use crate::messages::{GetResponse, InputLag, Lag, ServedBy};
use crate::read_after::{self, After};
use crate::snapshot::ValueFormat;

// gRPC status codes.
pub const NOT_FOUND: u32 = 5;
pub const UNAVAILABLE: u32 = 14;
pub const UNAUTHENTICATED: u32 = 16;

/// How a Get ends: its answer's message, or a status other than OK.
pub enum Outcome {
    Message(Bytes),
    Status(Status),
}

pub struct Status {
    pub code: u32,
    pub message: String,
    /// REST's JSON error body, for the `freshroute-error` trailer (none: no trailer).
    pub body: Option<Vec<u8>>,
}

/// One gRPC message as it travels: uncompressed, its length, its bytes.
pub fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    message.encode(&mut out).expect("a buffer of the message's length");
    out.freeze()
}

/// A Get after a write token whose events no replica reflected within its wait: NOT_YET_VISIBLE as UNAVAILABLE.
pub fn not_yet_visible(physical: &str, partition: usize, said: &str, after: &After) -> Option<Outcome> {
    Some(Outcome::Status(Status { code: UNAVAILABLE, message: format!("{physical}/{partition}: {said}"),
                                  body: Some(read_after::not_yet_visible(physical, partition, said, after)) }))
}

/// Get's answer to a key read (router.grpc_get.answer_get): the GetResponse, or KEY_NOT_FOUND's status; None where
/// the Python front would write something else (a value not of the table's format, a message needing repr). The
/// response names the table as the call did, and its position the version's own table; the status, as the Python
/// front's does, names the version's own table.
pub fn get(a: &KeyAnswer) -> Option<Outcome> {
    let Some(value) = a.value else {
        let body = answer::not_found(a.physical, a.key, a.partition, &a.who, a.input_lag, a.version.as_ref())?;
        return Some(Outcome::Status(Status { code: NOT_FOUND, message: answer::not_found_message(a.physical, a.key)?,
                                             body: Some(body) }));
    };
    let (value_json, value_bytes) = match a.format {
        ValueFormat::Json => (std::str::from_utf8(value).ok()?.to_owned(), Vec::new()),
        ValueFormat::Text => (serde_json::to_string(std::str::from_utf8(value).ok()?).ok()?, Vec::new()),
        ValueFormat::Bytes => (String::new(), value.to_vec()),
    };
    let (valid_from, valid_to) = match &a.version {
        Some(v) if v.valid_from.is_some() => (v.valid_from, v.valid_to),
        _ => (None, None),
    };
    let response = GetResponse {
        table: a.table.to_owned(),
        key: a.key.to_owned(),
        value_json,
        partition: a.partition as i32,
        served_by: Some(ServedBy { node: a.who.node.to_owned(), role: a.who.role.to_owned() }),
        lag: Some(Lag { offsets: a.who.lag_offsets, ms: a.who.lag_ms }),
        position: position_token(a.physical, a.partition, a.who.applied),
        found: true,
        // Unset while the pipeline is caught up (router.grpc_messages.input_lag_message).
        input_lag: (a.input_lag.0 != 0).then_some(InputLag { records: a.input_lag.0, ms: a.input_lag.1 }),
        value_bytes,
        valid_from,
        valid_to,
        r#final: a.version.as_ref().is_some_and(|v| v.settled),
        table_version: a.table_version,
    };
    Some(Outcome::Message(framed(&response)))
}

/// `grpc-message`'s value: the text percent-encoded where gRPC asks (router.transports.grpc_calls.status_block).
pub fn percent_encoded(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// JSON text with every character outside printable ASCII escaped, as Python's json.dumps(ensure_ascii=True)
/// writes it (metadata values must be ASCII): the trailer's form of an error body.
pub fn ascii_json(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::Served;

    #[test]
    fn a_get_response_names_the_tables_version() {
        let who = Served { node: "n1", role: "active", lag_offsets: Some(0), lag_ms: Some(0), applied: 7 };
        let mut a = KeyAnswer { table: "t", table_version: 2, physical: "t-v2", key: "k", partition: 0,
                                value: Some(b"1"), format: ValueFormat::Json, who, input_lag: (0, 0), version: None };
        let Some(Outcome::Message(framed)) = get(&a) else { panic!("a found key's message") };
        // Field 16 as a varint, last: as Python's protobuf writes it.
        assert!(framed.ends_with(&[0x80, 0x01, 0x02]));
        let response = GetResponse::decode(&framed[5..]).unwrap();
        assert_eq!((response.table.as_str(), response.table_version), ("t", 2));
        assert_eq!(response.position, position_token("t-v2", 0, 7));
        a.value = None;
        let Some(Outcome::Status(status)) = get(&a) else { panic!("KEY_NOT_FOUND") };
        // As router.grpc_get's: the error of the read of version 2's own table.
        assert_eq!(status.message, "key 'k' not found in table 't-v2'");
        assert!(!String::from_utf8(status.body.unwrap()).unwrap().contains("table_version"));
    }

    #[test]
    fn messages_and_bodies_as_python_writes_them() {
        // urllib.parse.quote(m, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
        assert_eq!(percent_encoded("key 'k' not found: 100% \u{e9}"), "key 'k' not found: 100%25 %C3%A9");
        // json.dumps({"m": "\u{e9}\u{1f600}\u{7f}"}, ensure_ascii=True, separators=(",", ":"))
        assert_eq!(ascii_json("{\"m\":\"\u{e9}\u{1f600}\u{7f}\"}".as_bytes()),
                   "{\"m\":\"\\u00e9\\ud83d\\ude00\\u007f\"}");
    }
}
