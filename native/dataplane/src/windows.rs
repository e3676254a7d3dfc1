//! A key's windows on the compiled path (GET /v1/tables/{table}/keys/{key}/windows?from&to): one range read of the
//! key's windows on the freshest replica within the bound, hedged as key reads are, answered with each window's
//! end and whether it is final (freshroute.windows). A range the Python path would refuse — from after to, more
//! windows than max_windows, a table without windows — goes there.

use std::time::Instant;

use crate::answer;
use crate::lookup::{now_ms, parse_query, segment, served_by, Answered, Routing};
use crate::messages::{RangeRead, Read, Reply, WindowFilter};
use crate::snapshot::ValueFormat;

/// The changelog key of `key`'s window starting at `start_ms` (freshroute.windows.window_key).
pub fn window_key(key: &[u8], start_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 17);
    out.extend_from_slice(key);
    out.push(0);
    out.extend_from_slice(format!("{start_ms:016x}").as_bytes());
    out
}

/// (table key bytes, window start) of a window's changelog key; None for any other row (the watermark).
pub fn split_window_key(raw: &[u8]) -> Option<(&[u8], i64)> {
    let cut = raw.len().checked_sub(17)?;
    let (key, suffix) = raw.split_at(cut);
    if suffix[0] != 0 || !suffix[1..].iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let start = u64::from_str_radix(std::str::from_utf8(&suffix[1..]).ok()?, 16).ok()?;
    Some((key, i64::try_from(start).ok()?))
}

/// How many window starts of a slide fall in [from_ms, to_ms) at most (WindowSpec.windows_in).
pub fn windows_in(slide_ms: i64, from_ms: i64, to_ms: i64) -> i64 {
    let span = to_ms as i128 - from_ms as i128;
    (-(-span).div_euclid(slide_ms.max(1) as i128)).clamp(0, i64::MAX as i128) as i64
}

impl Routing {
    /// The answer to GET /v1/tables/{table}/keys/{key}/windows?{query}, or None for the Python path.
    pub async fn windows(&self, table: &[u8], key: &[u8], query: &[u8]) -> Option<Answered> {
        let started = Instant::now();
        let query = parse_query(query).filter(|q| q.as_of_ms.is_none() && q.after.is_none() && q.wait_ms.is_none())?;
        let (from_ms, to_ms) = (query.from_ms?, query.to_ms?);
        let r = self.route(segment(table)?, segment(key)?, &query, |t| t.window.is_some() && t.value_format == ValueFormat::Json)?;
        let spec = &r.snap.tables[&r.table];
        let w = spec.window?;
        let spans = windows_in(w.slide_ms, from_ms, to_ms);
        if from_ms > to_ms || spans > self.shared.config.max_windows {
            return None;
        }
        let replicas = &spec.partitions[r.partition];
        let read = Read::Range(RangeRead {
            id: 0,
            table: spec.physical.clone(),
            partition: r.partition as i32,
            start: window_key(r.key.as_bytes(), from_ms),
            end: window_key(r.key.as_bytes(), to_ms),
            limit: spans.clamp(1, u32::MAX as i64) as u32,
            bound: r.read_bound(),
            window: Some(WindowFilter { from_ms, to_ms, life_ms: w.size_ms.saturating_add(w.retention_ms) }),
        });
        let (cand, reply) = self.attempts(replicas, &spec.physical, r.partition, &r.cands, read, &self.window_latency)
            .await?;
        let Reply::Range(result) = reply else { return None };
        let who = served_by(&replicas[cand.index], result.replica.as_ref()?);
        let watermark = (result.watermark_ms >= 0).then_some(result.watermark_ms);
        let seen = watermark.unwrap_or(-1);
        let windows: Vec<answer::Window> = result.entries.iter()
            .filter_map(|e| {
                let (k, start) = split_window_key(&e.key)?;
                // Another key that happens to share the range's bytes is not this key's.
                (k == r.key.as_bytes()).then(|| answer::Window {
                    start, end: start.saturating_add(w.size_ms), value: &e.value,
                    is_final: start.saturating_add(w.size_ms) <= seen,
                })
            })
            .collect();
        let body = answer::windows(&r.table, spec.version, &spec.physical, &r.key, r.partition, &windows, watermark,
                                   &who, spec.input_lag_at(now_ms()));
        self.counts().lookup(!windows.is_empty(), who.role == "active", started.elapsed());
        Some((200, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_keys_are_the_pipelines() {
        // freshroute.windows.window_key(b"sensor-1", 1_700_000_000_000)
        let raw = [&b"sensor-1\x00"[..], b"0000018bcfe56800"].concat();
        assert_eq!(window_key(b"sensor-1", 1_700_000_000_000), raw);
        assert_eq!(split_window_key(&raw), Some((&b"sensor-1"[..], 1_700_000_000_000)));
        assert_eq!(split_window_key(b"\x00watermark"), None);
        assert_eq!(split_window_key(b"k\x01000000000000000a"), None);
        assert_eq!(split_window_key(&[&b"k\x00"[..], b"000000000000000g"].concat()), None);
        assert_eq!(split_window_key(&[&b"\x00"[..], b"000000000000000a"].concat()), Some((&b""[..], 10)));
    }

    #[test]
    fn windows_in_counts_starts_as_window_spec_does() {
        assert_eq!(windows_in(10, 0, 0), 0);
        assert_eq!(windows_in(10, 0, 1), 1);
        assert_eq!(windows_in(10, 0, 10), 1);
        assert_eq!(windows_in(10, 0, 11), 2);
        assert_eq!(windows_in(10, 20, 10), 0);
        assert_eq!(windows_in(1, 0, i64::MAX), i64::MAX);
    }
}
