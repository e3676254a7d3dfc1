//! The input position rule of `freshroute.input_position` (`applies`), word for word: a changelog row
//! whose position does not cover the one held for its key is a replayed Real-time query's older row, and is not
//! applied. One corpus holds the two to each other: `tests/data/position_corpus.json`, whose expectations
//! `tests/unit/test_position_rule.py` makes from the Python rule and `cargo test` (below) holds this one to.

/// A position header's offsets, one per input partition (None: none of that partition); None for a header that is
/// not a JSON array of integers and nulls (its row is applied as one without a position). Read by hand, as Python's
/// JSON reader takes it: an integer is one from -2^63 to 2^64-1 (past those it reads a float), "-0" is 0.
pub fn decode(raw: &[u8]) -> Option<Vec<Option<i128>>> {
    let mut at = skip_space(raw, 0);
    if raw.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_space(raw, at + 1);
    let mut offsets = Vec::new();
    if raw.get(at) == Some(&b']') {
        at += 1;
    } else {
        loop {
            let (offset, next) = element(raw, at)?;
            offsets.push(offset);
            at = skip_space(raw, next);
            match raw.get(at) {
                Some(b',') => at = skip_space(raw, at + 1),
                Some(b']') => {
                    at += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    (skip_space(raw, at) == raw.len()).then_some(offsets)
}

fn skip_space(raw: &[u8], mut at: usize) -> usize {
    while matches!(raw.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// A null or a JSON integer at ``at``, and where it ends; None for anything else.
fn element(raw: &[u8], at: usize) -> Option<(Option<i128>, usize)> {
    if raw[at..].starts_with(b"null") {
        return Some((None, at + 4));
    }
    let negative = raw.get(at) == Some(&b'-');
    let start = at + usize::from(negative);
    let digits = raw[start..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 1 && raw[start] == b'0' || digits > 20 {
        return None;
    }
    let end = start + digits;
    if matches!(raw.get(end), Some(b'.' | b'e' | b'E')) {
        return None; // a float
    }
    let magnitude: i128 = std::str::from_utf8(&raw[start..end]).ok()?.parse().ok()?;
    let value = if negative { -magnitude } else { magnitude };
    (i128::from(i64::MIN)..=i128::from(u64::MAX)).contains(&value).then_some((Some(value), end))
}

/// Whether a row at ``new`` reflects every input record the row at ``held`` does: partition by partition, at least
/// as far.
pub fn covers(new: &[Option<i128>], held: &[Option<i128>]) -> bool {
    held.iter().enumerate().all(|(partition, offset)| match offset {
        None => true,
        Some(offset) => matches!(new.get(partition), Some(Some(at)) if at >= offset),
    })
}

/// Whether a replica holding a key's row at ``held`` applies the key's next row, at ``raw`` (``delete``: a
/// tombstone), and if so the position the key then holds: None when it is not applied. An applied row's key holds
/// the row's own position; for a row without one, the held position stays, and a delete forgets it.
pub fn applies<'a>(held: Option<&'a [u8]>, raw: Option<&'a [u8]>, delete: bool) -> Option<Option<&'a [u8]>> {
    let new = raw.and_then(decode);
    if let (Some(new), Some(held)) = (&new, held) {
        if raw != Some(held) && decode(held).is_some_and(|before| !covers(new, &before)) {
            return None;
        }
    }
    Some(if new.is_some() { raw } else if delete { None } else { held })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{bytes, corpus, unhex};
    use std::collections::HashMap;

    /// Every history of the corpus, replayed row by row: the rows taken and each key's position held at the end are
    /// the Python rule's.
    #[test]
    fn the_rule_is_freshroute_input_position_on_the_shared_corpus() {
        let corpus = corpus("position_corpus.json");
        let mut checked = 0;
        for history in corpus["histories"].as_array().unwrap() {
            let mut held: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
            let mut taken = Vec::new();
            for row in history["rows"].as_array().unwrap() {
                let key = bytes(&row["key"]).unwrap();
                let raw = bytes(&row["position"]);
                let before = held.get(&key).cloned().flatten();
                let after = applies(before.as_deref(), raw.as_deref(), row["value"].is_null());
                taken.push(after.is_some());
                if let Some(after) = after {
                    held.insert(key, after.map(<[u8]>::to_vec));
                }
                checked += 1;
            }
            let want_taken: Vec<bool> = history["taken"].as_array().unwrap().iter().map(|t| t.as_bool().unwrap()).collect();
            assert_eq!(taken, want_taken, "history {}", history["name"]);
            for (key, want) in history["held"].as_object().unwrap() {
                let got = held.get(&unhex(key)).cloned().flatten();
                assert_eq!(got, bytes(want), "history {} key {key}", history["name"]);
            }
        }
        assert!(checked > 30, "{checked} rows");
    }
}
