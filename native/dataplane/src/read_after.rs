//! A lookup after a write token (`after=`, read your writes) on the compiled path: the token decoded as
//! freshroute.write_tokens.token.WriteToken.decode reads it, narrowed to the table read as
//! freshroute.write_tokens.read_after.narrowed narrows it, and the wait for a replica whose answer includes the events
//! (freshroute.routing.attempts: asked again after 2 ms, then every 4, until the read's deadline). Whatever the Python
//! path refuses — a token malformed, cut or altered, a partition the table has not, an offset past where its input
//! ends, an event the pipeline rejected — is None here, and the Python path answers it in its own words.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::lookup::{partition, Position};
use crate::snapshot::Table;

const PREFIX: &[u8] = b"w1.";
/// freshroute.position.MAX_TOKEN_LENGTH.
const MAX_TOKEN_LENGTH: usize = 8192;
/// Input ends read this long after a write must include it (read_after.ENDS_SETTLE_MS).
const ENDS_SETTLE_MS: i64 = 1000;
/// attempts.AFTER_RETRY_FIRST_S, AFTER_RETRY_MAX_S and TIMER_SLACK_S.
pub const RETRY_FIRST: Duration = Duration::from_millis(2);
pub const RETRY_MAX: Duration = Duration::from_millis(4);
pub const TIMER_SLACK: Duration = Duration::from_millis(1);

/// Offsets by partition, in partition order.
pub type Offsets = BTreeMap<i64, i64>;

/// A write token's events written (input topic → offsets of the latest) and changelog positions read (table →
/// applied offsets), and when its latest event was written.
#[derive(Debug, PartialEq, Eq)]
pub struct WriteToken {
    pub inputs: HashMap<String, Offsets>,
    pub reads: HashMap<String, Offsets>,
    pub written_ms: i64,
}

/// `w1.` + base64url(JSON) + `.` + the JSON's CRC-32 in hex; None wherever WriteToken.decode raises, and where it
/// reads what this does not (Python's looser int() of a number, base64 with characters outside its alphabet).
pub fn decode(token: &[u8]) -> Option<WriteToken> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    #[derive(serde::Deserialize)]
    struct Doc {
        i: HashMap<String, HashMap<String, serde_json::Value>>,
        r: HashMap<String, HashMap<String, serde_json::Value>>,
        t: i64,
    }
    let rest = token.strip_prefix(PREFIX).filter(|_| token.len() <= MAX_TOKEN_LENGTH)?;
    let dot = rest.iter().rposition(|&b| b == b'.')?;
    let (body, crc) = (&rest[..dot], &rest[dot + 1..]);
    let raw = URL_SAFE_NO_PAD.decode(body).ok()?;
    if crc != format!("{:08x}", crc32(&raw)).as_bytes() {
        return None;
    }
    let doc: Doc = serde_json::from_slice(&raw).ok()?;
    let token = WriteToken { inputs: offsets(doc.i)?, reads: offsets(doc.r)?, written_ms: doc.t };
    (!token.inputs.is_empty() || !token.reads.is_empty()).then_some(token)
}

fn offsets(doc: HashMap<String, HashMap<String, serde_json::Value>>) -> Option<HashMap<String, Offsets>> {
    let mut out = HashMap::with_capacity(doc.len());
    for (name, parts) in doc {
        if name.is_empty() {
            return None;
        }
        let mut offsets = Offsets::new();
        for (p, o) in parts {
            // An offset a JSON integer in [0, 2^63).
            let p = partition(&p)?;
            let o = o.as_i64().filter(|&o| o >= 0)?;
            if offsets.insert(p, o).is_some() {
                return None;  // "1" and "01": which one Python keeps is its to say
            }
        }
        out.insert(name, offsets);
    }
    Some(out)
}

/// zlib.crc32.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A token narrowed to a table's input events (what a replica's rows must reflect).
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct After {
    pub topic: String,
    pub written: Offsets,
}

/// What a token asks of one table: a changelog position (what was read of it, or written straight to it) and the
/// events of its input; None where narrowed() raises.
#[derive(Debug, PartialEq, Eq, Default)]
pub struct Narrowed {
    pub read: Option<Offsets>,
    pub after: Option<After>,
}

pub fn narrow(token: &WriteToken, physical: &str, spec: &Table) -> Option<Narrowed> {
    let written = spec.input_topic.as_ref().and_then(|t| token.inputs.get(t)).filter(|w| !w.is_empty());
    let direct = spec.changelog_topic.as_ref().and_then(|t| token.inputs.get(t)).filter(|w| !w.is_empty());
    let mut read = token.reads.get(physical).filter(|r| !r.is_empty()).cloned();
    if let Some(direct) = direct {
        let mine = read.get_or_insert_with(Offsets::new);
        for (&p, &o) in direct {
            let o = o.checked_add(1)?;
            let at = mine.entry(p).or_insert(0);
            *at = (*at).max(o);
        }
    }
    if written.is_none() && read.is_none() {
        return None;
    }
    if read.as_ref().is_some_and(|r| r.keys().any(|&p| p >= spec.partitions.len() as i64)) {
        return None;
    }
    let Some(written) = written else { return Some(Narrowed { read, after: None }) };
    if let Some(ends) = &spec.input_ends {
        if written.keys().any(|&p| p >= ends.ends.len() as i64) {
            return None;
        }
        let settled = ends.at_ms >= token.written_ms.saturating_add(ENDS_SETTLE_MS);
        if settled && written.iter().any(|(&p, &o)| o >= ends.ends.get(&(p as i32)).copied().unwrap_or(0)) {
            return None;
        }
    }
    let topic = spec.input_topic.clone()?;
    Some(Narrowed { read, after: Some(After { topic, written: written.clone() }) })
}

/// The bound's position merged with what the token read of the table: the later offset of each partition.
pub fn merged(position: Option<&Position>, read: Option<&Offsets>, partition: i64) -> i64 {
    let given = position.and_then(|p| p.offsets.get(&partition)).copied().unwrap_or(0);
    given.max(read.and_then(|r| r.get(&partition)).copied().unwrap_or(0))
}

impl After {
    /// The changelog offset of `partition` from which every row reflects the events, as the table's latest marks say
    /// (progress.reflected_at: the first mark past all of them); 0 while none is.
    pub fn reflected(&self, spec: Option<&Table>, partition: usize) -> i64 {
        let Some(spec) = spec else { return 0 };
        let past = |m: &&crate::snapshot::Mark| {
            self.written.iter().all(|(&p, &o)| m.input.get(&(p as i32)).copied().unwrap_or(0) > o)
        };
        spec.marks.iter().find(past).and_then(|m| m.changelog.get(&(partition as i32)).copied()).unwrap_or(0)
    }

    /// Whether the pipeline rejected one of the events, as the latest view says (the Python path says why).
    pub fn rejected(&self, spec: Option<&Table>) -> bool {
        let Some(spec) = spec else { return false };
        self.written.iter().any(|(&p, o)| spec.rejected.get(&(p as i32)).is_some_and(|r| r.contains(o)))
    }

    /// The input partitions' offsets as a read carries them (ReadBound.after_input).
    pub fn input(&self) -> HashMap<i32, i64> {
        self.written.iter().map(|(&p, &o)| (p as i32, o)).collect()
    }
}

/// How many times a read waits for the events within `timeout` (attempts.AttemptPlan's retry limit).
pub fn retry_limit(timeout: Duration) -> u64 {
    (timeout.as_millis() / (RETRY_MAX - TIMER_SLACK).as_millis()) as u64 + 8
}

/// NotYetVisible's body (router.http_errors of freshroute.errors.NotYetVisible), its fields in Python's order: the
/// table's partition, what the last replica asked said, and the events waited for.
pub fn not_yet_visible(physical: &str, partition: usize, unseen: &str, after: &After) -> Vec<u8> {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let offsets: Vec<String> = after.written.iter().map(|(p, o)| format!("\"{p}\":{o}")).collect();
    format!("{{\"error\":{{\"code\":\"NOT_YET_VISIBLE\",\"message\":{},\"table\":{},\"partition\":{partition},\
             \"after\":{{\"topic\":{},\"offsets\":{{{}}}}},\"attempts\":[]}}}}",
            text(&format!("{physical}/{partition}: {unseen}")), text(physical), text(&after.topic), offsets.join(","))
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{InputEnds, Snapshot};

    fn encode(doc: &serde_json::Value) -> String {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let raw = serde_json::to_vec(doc).unwrap();
        format!("w1.{}.{:08x}", URL_SAFE_NO_PAD.encode(&raw), crc32(&raw))
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn tokens_decode_as_python_decodes_them_and_the_rest_is_pythons_to_refuse() {
        // WriteToken({"readings": {0: 41, 2: 7}}, {}, 1700000000000).encode(), as Python wrote it
        let python = "w1.eyJpIjp7InJlYWRpbmdzIjp7IjAiOjQxLCIyIjo3fX0sInIiOnt9LCJ0IjoxNzAwMDAwMDAwMDAwfQ.f2e22948";
        let token = decode(python.as_bytes()).expect("a token");
        assert_eq!(token.inputs["readings"], Offsets::from([(0, 41), (2, 7)]));
        assert_eq!((token.reads.len(), token.written_ms), (0, 1_700_000_000_000));
        let doc = serde_json::json!({"i": {"readings": {"0": 41, "2": 7}}, "r": {}, "t": 1_700_000_000_000i64});
        let made = encode(&doc);
        assert_eq!(made, python);
        let mut altered = made.clone().into_bytes();
        let at = altered.len() - 12;
        altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
        assert_eq!(decode(&altered), None, "its checksum no longer matches");
        assert_eq!(decode(&made.as_bytes()[..made.len() - 1]), None, "cut");
        assert_eq!(decode(b"p1.abc"), None);
        assert_eq!(decode(&encode(&serde_json::json!({"i": {}, "r": {}, "t": 0})).into_bytes()), None, "names nothing");
        for bad in [serde_json::json!({"i": {"x": {"0": -1}}, "r": {}, "t": 0}),
                    serde_json::json!({"i": {"x": {"0": 1.5}}, "r": {}, "t": 0}),
                    serde_json::json!({"i": {"x": {" 1": 1}}, "r": {}, "t": 0}),
                    serde_json::json!({"i": {"": {"0": 1}}, "r": {}, "t": 0}),
                    serde_json::json!({"i": {"x": {"0": 1}}, "t": 0})] {
            assert_eq!(decode(encode(&bad).as_bytes()), None, "{bad}");
        }
        let long = format!("w1.{}.00000000", "A".repeat(9000));
        assert_eq!(decode(long.as_bytes()), None);
    }

    fn table(ends: Option<(i64, Vec<(i32, i64)>)>) -> Table {
        let doc = serde_json::json!({"tables": {"t": {
            "partitions": 2, "served": true, "window": null, "history_retention_ms": null, "value_format": "json",
            "max_lag": null, "max_staleness_ms": null, "input_lag": null, "input_ends": null,
            "input_topic": "readings", "changelog_topic": "t-changelog",
            "marks": [[{"0": 5, "1": 9}, {"0": 100, "1": 200}], [{"0": 50, "1": 90}, {"0": 300, "1": 400}]],
            "rejected": {"1": [12]}}}, "replicas": [], "built_ms": 0});
        let mut snap = Snapshot::parse(doc.to_string().as_bytes()).unwrap();
        let mut t = snap.tables.remove("t").unwrap();
        t.input_ends = ends.map(|(at_ms, ends)| InputEnds { at_ms, ends: ends.into_iter().collect() });
        t
    }

    fn token(inputs: &[(&str, &[(i64, i64)])], reads: &[(&str, &[(i64, i64)])], written_ms: i64) -> WriteToken {
        let map = |xs: &[(&str, &[(i64, i64)])]| xs.iter().map(|(n, o)| (n.to_string(), o.iter().copied().collect()))
            .collect();
        WriteToken { inputs: map(inputs), reads: map(reads), written_ms }
    }

    #[test]
    fn a_token_narrows_to_its_tables_input_events_and_the_position_it_read() {
        let t = table(Some((10_000, vec![(0, 60), (1, 60)])));
        let n = narrow(&token(&[("readings", &[(0, 40)])], &[("t", &[(1, 7)])], 9_500), "t", &t).unwrap();
        assert_eq!(n.read, Some(Offsets::from([(1, 7)])));
        assert_eq!(n.after, Some(After { topic: "readings".into(), written: Offsets::from([(0, 40)]) }));
        assert_eq!(merged(None, n.read.as_ref(), 1), 7);
        // Written straight to the table's changelog: a position one past it.
        let n = narrow(&token(&[("t-changelog", &[(0, 4)])], &[], 0), "t", &t).unwrap();
        assert_eq!((n.read, n.after), (Some(Offsets::from([(0, 5)])), None));
        // Refused by the Python path: nothing of this table, a partition it has not, past the input's settled end.
        assert_eq!(narrow(&token(&[("other", &[(0, 1)])], &[], 0), "t", &t), None);
        assert_eq!(narrow(&token(&[], &[("t", &[(2, 1)])], 0), "t", &t), None);
        assert_eq!(narrow(&token(&[("readings", &[(3, 1)])], &[], 0), "t", &t), None);
        assert_eq!(narrow(&token(&[("readings", &[(0, 60)])], &[], 8_000), "t", &t), None);
        // Ends read too soon after the write say nothing of it.
        assert!(narrow(&token(&[("readings", &[(0, 60)])], &[], 9_500), "t", &t).is_some());
    }

    #[test]
    fn the_first_mark_past_every_event_says_from_where_rows_reflect_them_and_rejections_are_seen() {
        let t = table(None);
        let after = |w: &[(i64, i64)]| After { topic: "readings".into(), written: w.iter().copied().collect() };
        assert_eq!(after(&[(0, 4), (1, 8)]).reflected(Some(&t), 1), 200);
        assert_eq!(after(&[(0, 5)]).reflected(Some(&t), 0), 300, "a mark's input is the next offset");
        assert_eq!(after(&[(0, 50)]).reflected(Some(&t), 0), 0);
        assert_eq!(after(&[(0, 4)]).reflected(None, 0), 0);
        assert!(after(&[(1, 12)]).rejected(Some(&t)));
        assert!(!after(&[(0, 12)]).rejected(Some(&t)));
    }

    #[test]
    fn a_wait_that_ends_says_what_python_says() {
        let after = After { topic: "readings".into(), written: Offsets::from([(0, 41)]) };
        let body = not_yet_visible("t", 1, "the row of key b'k\"' is behind", &after);
        let want = [r#"{"error":{"code":"NOT_YET_VISIBLE","message":"t/1: the row of key b'k\"' is behind","#,
                    r#""table":"t","partition":1,"after":{"topic":"readings","offsets":{"0":41}},"attempts":[]}}"#];
        assert_eq!(String::from_utf8(body).unwrap(), want.concat());
        assert_eq!(retry_limit(Duration::from_secs(2)), 674);
    }
}
