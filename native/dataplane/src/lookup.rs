//! One key lookup on the compiled path: the key's partition, the freshest replica within the bound, the read over
//! the read port (hedged to a second replica when slow), and the answer with its labels. Whatever it does not
//! serve — another bound parameter, a table with other keys, no replica the view trusts, a refusal, a failure — it
//! leaves to the Python path (`None`), which answers it with every rule of freshroute.routing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;

use crate::answer::{self, Served, NEVER_CAUGHT_UP_MS};
use crate::counts::Counts;
use crate::messages::{KeyRead, Read, ReadBound, Reply, ReplicaStatus, NOT_FOUND, NOT_YET_VISIBLE, OK, ROLE_ACTIVE,
                      ROLE_STANDBY, SERVING_ACTIVE};
use crate::read_after::{self, After, WriteToken};
use crate::selection::{self, Bound, Candidate, LatencyWindow, Load, Observation, Overlay, Tolerances};
use crate::snapshot::{Replica, Snapshot, State, Table, ValueFormat};
use crate::store::{Answer, Stores};
use crate::Shared;

/// freshroute.bound.MAX_WAIT_MS.
const MAX_WAIT_MS: i64 = 60_000;

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// What one runtime thread keeps of its lookups: connections, load, lag answers, latency, the hedge budget.
pub struct Routing {
    pub shared: std::sync::Arc<Shared>,
    pub stores: Rc<Stores>,
    overlay: RefCell<Overlay>,
    load: RefCell<Load>,
    latency: RefCell<LatencyWindow>,
    /// Windows reads' latency, which hedges them (RoutingCore keeps one apart from key reads').
    pub(crate) window_latency: RefCell<LatencyWindow>,
    rng: RefCell<SmallRng>,
    hedge_tokens: RefCell<f64>,
    pruned_at: RefCell<i64>,
}

/// A lookup's answer: HTTP status and JSON body.
pub type Answered = (u16, Vec<u8>);

impl Routing {
    pub fn new(shared: std::sync::Arc<Shared>, seed: u64) -> Routing {
        use rand::SeedableRng;
        let c = &shared.config;
        let tls = shared.cluster_tls.lock().expect("never poisoned").clone();
        let stores = Stores::new(c.cluster_secret.clone(), Duration::from_millis(c.attempt_timeout_ms), tls);
        let load = Load::new(c.failure_backoff_ms);
        let (latency, window_latency) = (LatencyWindow::new(c.hedge_quantile), LatencyWindow::new(c.hedge_quantile));
        Routing { shared, stores, overlay: RefCell::default(), load: RefCell::new(load),
                  latency: RefCell::new(latency), window_latency: RefCell::new(window_latency),
                  rng: RefCell::new(SmallRng::seed_from_u64(seed)), hedge_tokens: RefCell::new(0.0),
                  pruned_at: RefCell::new(0) }
    }

    pub(crate) fn counts(&self) -> &Counts {
        &self.shared.counts
    }

    /// The answer to GET /v1/tables/{table}/keys/{key}?{query} (raw, percent-encoded), or None for the Python path.
    pub async fn lookup(&self, table: &[u8], key: &[u8], query: &[u8]) -> Option<Answered> {
        let unseen = |physical: &str, partition, said: &str, after: &After| {
            Some((503, read_after::not_yet_visible(physical, partition, said, after)))
        };
        let (table, key, query) = (segment(table)?, segment(key)?, parse_query(query)?);
        self.key(table, key, query, |a| {
            let body = match a.value {
                Some(value) => answer::found(a.table, a.table_version, a.physical, a.key, a.partition, value, a.format,
                                             &a.who, a.input_lag, a.version.as_ref())?,
                None => answer::not_found(a.physical, a.key, a.partition, &a.who, a.input_lag, a.version.as_ref())?,
            };
            Some((if a.value.is_some() { 200 } else { 404 }, body))
        }, unseen).await
    }

    /// One key read from the freshest replica within the query's bound, its answer written by `write` (REST's body
    /// or gRPC's message) — or, for a read after a write token whose events no replica reflected within its wait, by
    /// `unseen` (the table, partition, what the last replica said, the events) — or None for the Python path, also
    /// when `write` finds it cannot write it.
    pub(crate) async fn key<T>(&self, table: String, key: String, query: Query,
                               write: impl FnOnce(&KeyAnswer) -> Option<T>,
                               unseen: impl FnOnce(&str, usize, &str, &After) -> Option<T>) -> Option<T> {
        let started = Instant::now();
        // A wait is a deadline for a write token's events (a position's wait, and one the Python path refuses, are
        // its own).
        let wait_served = match query.wait_ms {
            Some(ms) => query.after.is_some() && (1..=MAX_WAIT_MS).contains(&ms),
            None => true,
        };
        if query.from_ms.is_some() || query.to_ms.is_some() || !wait_served
            || query.after.is_some() && query.as_of_ms.is_some() {
            return None;
        }
        let as_of = query.as_of_ms;
        let r = self.route(table, key, &query, |t| t.served && (as_of.is_none() || t.history_retention_ms.is_some()))?;
        let spec = &r.snap.tables[&r.table];
        // A time older than the table keeps versions for is refused by the Python path, which says since when.
        if let (Some(at), Some(kept)) = (as_of, spec.history_retention_ms) {
            if at < now_ms().saturating_sub(kept) {
                return None;
            }
        }
        let replicas = &spec.partitions[r.partition];
        let read = |bound| Read::Key(KeyRead { id: 0, table: spec.physical.clone(), partition: r.partition as i32,
                                               key: r.key.as_bytes().to_vec(), bound, as_of_ms: as_of });
        let (cand, reply) = match &r.after {
            None => self.attempts(replicas, &spec.physical, r.partition, &r.cands, read(r.read_bound()),
                                  &self.latency).await?,
            Some(after) => {
                let wait = query.wait_ms.map_or(self.shared.config.request_timeout_ms, |ms| ms as u64);
                match self.wait_for(&r, after, started + Duration::from_millis(wait), read).await? {
                    Ok(answered) => answered,
                    Err(said) => return unseen(&spec.physical, r.partition, &said, after),
                }
            }
        };
        let Reply::Key(result) = reply else { return None };
        if result.status == NOT_YET_VISIBLE {
            return None;
        }
        let rep = result.replica.as_ref()?;
        let now = now_ms();
        let input_lag = spec.input_lag_at(now);
        let found = result.status == OK;
        // Final once the replica had every change up to then (HistoryReads.final).
        let version = as_of.map(|at| answer::AsOf { at, valid_from: result.valid_from_ms,
                                                   valid_to: result.valid_to_ms,
                                                   settled: at <= now - rep.staleness_ms - input_lag.1 });
        if found && version.as_ref().is_some_and(|v| v.valid_from.is_none()) {
            return None;  // a version without its time: the Python path says what is wrong
        }
        let answered = KeyAnswer { table: &r.table, table_version: spec.version, physical: &spec.physical,
                                   key: &r.key, partition: r.partition, value: found.then_some(&result.value[..]),
                                   format: spec.value_format,
                                   who: served_by(&replicas[cand.index], rep), input_lag, version };
        let written = write(&answered)?;
        self.counts().lookup(found, answered.who.role == "active", started.elapsed());
        Some(written)
    }

    /// A read after a write token (attempts.AttemptPlan's rules for one): the candidates in turn, then those whose rows
    /// did not reflect the events yet asked again, the nearest first, after 2 ms and then every 4, each time with the
    /// offset the latest marks say reflects them, until `deadline`. Ok: an answer; Err: what the last replica asked
    /// said when the deadline came; None for the Python path — a failure, a refusal, an event the pipeline rejected.
    async fn wait_for(&self, r: &Routed, after: &After, deadline: Instant, read: impl Fn(Option<ReadBound>) -> Read)
                      -> Option<Result<(Candidate, Reply), String>> {
        let spec = &r.snap.tables[&r.table];
        let replicas = &spec.partitions[r.partition];
        let input = after.input();
        let mut cands = r.cands.clone();
        let mut said = String::new();
        let rounds = read_after::retry_limit(deadline.saturating_duration_since(Instant::now()));
        for round in 0..=rounds {
            let mut catching_up: Vec<(i64, Candidate)> = Vec::with_capacity(cands.len());
            let mut i = 0;
            while i < cands.len() {
                if round > 0 {
                    self.counts().after_retries.fetch_add(1, Relaxed);
                }
                let reflected = after.reflected(self.shared.snapshot().tables.get(&r.table), r.partition);
                let bound = ReadBound { max_lag: r.bound.max_lag, max_staleness_ms: r.bound.max_staleness_ms,
                                        min_offset: r.bound.min_offset, after_input: input.clone(),
                                        after_offset: reflected };
                let asked = self.attempts(replicas, &spec.physical, r.partition, &cands[i..], read(Some(bound)),
                                          &self.latency);
                let (cand, reply) = match tokio::time::timeout_at(deadline.into(), asked).await {
                    Ok(answered) => answered?,
                    Err(_) => return (!said.is_empty()).then_some(Err(said)),
                };
                if reply.status() != NOT_YET_VISIBLE {
                    return Some(Ok((cand, reply)));
                }
                if let Reply::Key(k) = &reply {
                    said.clone_from(&k.message);
                }
                // A hedge's answer leaves the slower attempts before it unanswered: they are asked again with it (a
                // replica not yet reflecting the events may answer first, the one that will reflect them later).
                let at = cands[i..].iter().position(|c| c.index == cand.index).map_or(i, |at| i + at);
                catching_up.extend(cands[i..at].iter().map(|c| (c.applied, *c)));
                catching_up.push((reply.replica().map_or(0, |rep| rep.applied_offset), cand));
                i = at + 1;
            }
            if after.rejected(self.shared.snapshot().tables.get(&r.table)) {
                return None;  // the Python path says why the pipeline rejected it
            }
            let wait = if round == 0 { read_after::RETRY_FIRST } else { read_after::RETRY_MAX };
            tokio::time::sleep_until((Instant::now() + wait).min(deadline).into()).await;
            if Instant::now() + read_after::TIMER_SLACK >= deadline {
                break;
            }
            catching_up.sort_by_key(|&(applied, _)| std::cmp::Reverse(applied));
            cands = catching_up.into_iter().map(|(_, cand)| cand).collect();
        }
        Some(Err(said))
    }

    /// A read of one key routed: its table's view, partition and bound, and the replicas to ask in order; None when
    /// the table is not one `serves` says this path answers, or no replica the view trusts can answer. Replicas,
    /// their lag and positions are those of the table's served version (`Table::physical`).
    pub(crate) fn route(&self, table: String, key: String, query: &Query, serves: impl Fn(&Table) -> bool)
                        -> Option<Routed> {
        let snap = self.shared.snapshot();
        let spec = snap.tables.get(&table).filter(|t| serves(t))?;
        let partition = (murmur2(key.as_bytes()) & 0x7fff_ffff) as usize % spec.partitions.len().max(1);
        let replicas = spec.partitions.get(partition)?;
        // A position of another table is the caller's mistake, which the Python path names; one of another version of
        // this table holds offsets of another changelog, which the Python path sets aside.
        if query.position.as_ref().is_some_and(|p| p.table != spec.physical) {
            return None;
        }
        let narrowed = match &query.after {
            Some(token) => read_after::narrow(token, &spec.physical, spec)?,
            None => read_after::Narrowed::default(),
        };
        let min_offset = read_after::merged(query.position.as_ref(), narrowed.read.as_ref(), partition as i64);
        let bound = Bound { min_offset, ..query.bound }.with_defaults(spec.max_lag, spec.max_staleness_ms);
        let now = now_ms();
        self.prune(&snap, now);
        let c = &self.shared.config;
        let tol = Tolerances { offsets: c.freshness_tolerance_offsets, ms: c.freshness_tolerance_ms,
                               view_trust_ms: c.view_trust_ms };
        // By the version's own table: lag answers of the version served before the switch say nothing of its lag.
        let cands = selection::select(replicas, &spec.physical, partition, bound, &self.overlay.borrow(),
                                      &self.load.borrow(), tol, now, &mut self.rng.borrow_mut());
        cands.first()?;
        Some(Routed { snap: snap.clone(), table, key, partition, bound, cands, after: narrowed.after })
    }

    fn prune(&self, snap: &Snapshot, now: i64) {
        // Heartbeats published since then carry newer lag than these answers did (RoutingCore.on_snapshot).
        let mut at = self.pruned_at.borrow_mut();
        if now - *at > 1000 {
            *at = now;
            self.overlay.borrow_mut().prune(snap.built_ms - 2 * self.shared.config.node_expiry_ms);
        }
    }

    /// The first candidate's answer, or the second's when the first is slower than reads of its kind lately (a hedge,
    /// within the hedge budget); None when neither gave an answer this path may serve.
    pub(crate) async fn attempts(&self, replicas: &[Replica], table: &str, partition: usize, cands: &[Candidate],
                                 read: Read, latency: &RefCell<LatencyWindow>) -> Option<(Candidate, Reply)> {
        let c = &self.shared.config;
        let attempt = Duration::from_millis(c.attempt_timeout_ms);
        let second = cands.get(1).filter(|s| c.hedge && replicas[s.index].state != State::Restoring).copied();
        {
            let mut tokens = self.hedge_tokens.borrow_mut();
            *tokens = (*tokens + c.hedge_budget).min(10.0);
        }
        let first = cands[0];
        let hedge_after = match (second, latency.borrow().value_ms) {
            (Some(_), Some(ms)) => Duration::from_secs_f64(ms.max(c.hedge_min_ms) / 1000.0).min(attempt),
            _ => attempt,
        };
        let mut one = Box::pin(self.attempt(replicas, table, partition, first, read.clone(), latency));
        if let Ok(outcome) = tokio::time::timeout(hedge_after, &mut one).await {
            return outcome.map(|r| (first, r));
        }
        let second = second.filter(|_| hedge_after < attempt && *self.hedge_tokens.borrow() >= 1.0)?;
        *self.hedge_tokens.borrow_mut() -= 1.0;
        self.counts().hedge();
        let mut two = Box::pin(self.attempt(replicas, table, partition, second, read, latency));
        let deadline = tokio::time::sleep(attempt);
        tokio::pin!(deadline);
        let (mut one_done, mut two_done) = (false, false);
        loop {
            tokio::select! {
                r = &mut one, if !one_done => match r { Some(r) => return Some((first, r)), None => one_done = true },
                r = &mut two, if !two_done => match r { Some(r) => return Some((second, r)), None => two_done = true },
                _ = &mut deadline => return None,
            }
            if one_done && two_done {
                return None;
            }
        }
    }

    /// One read of one replica: its result if it is an answer (found or not), else None.
    async fn attempt(&self, replicas: &[Replica], table: &str, partition: usize, cand: Candidate, read: Read,
                     latency: &RefCell<LatencyWindow>) -> Option<Reply> {
        let replica = &replicas[cand.index];
        let address = replica.read_address.as_deref()?;
        self.load.borrow_mut().started(&replica.node);
        let guard = InFlight { routing: self, node: &replica.node, done: false };
        let sent = Instant::now();
        let answer: Answer = self.stores.read(address, read).await;
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        guard.finish();
        match answer {
            Err(_) => {
                let mut load = self.load.borrow_mut();
                load.finished(&replica.node, None);
                load.failed(&replica.node, now_ms());
                None
            }
            Ok(result) => {
                self.load.borrow_mut().finished(&replica.node, Some(ms));
                if let Some(rep) = result.replica() {
                    self.overlay.borrow_mut().observe(&replica.node, table, partition, Observation {
                        applied: rep.applied_offset,
                        end: rep.end_offset,
                        staleness_ms: rep.staleness_ms.max(0),
                        observed_ms: now_ms(),
                    });
                }
                if result.status() == OK || result.status() == NOT_FOUND {
                    latency.borrow_mut().record(ms);
                    return Some(result);
                }
                // Not yet reflecting a write token's events: the read waits for them (Routing::wait_for).
                (result.status() == NOT_YET_VISIBLE).then_some(result)
            }
        }
    }
}

/// A key's answer as the path read it: what REST's body and gRPC's message are written from.
pub(crate) struct KeyAnswer<'a> {
    /// The table as the read named it.
    pub table: &'a str,
    /// The table's version that answered (the one served: a read of another goes to the Python path).
    pub table_version: i32,
    /// That version's own table, read on the store nodes: what the position and KEY_NOT_FOUND's details name.
    pub physical: &'a str,
    pub key: &'a str,
    pub partition: usize,
    /// The value, when the key was found.
    pub value: Option<&'a [u8]>,
    pub format: ValueFormat,
    pub who: Served<'a>,
    /// (records, ms) the table's changelog is behind its input.
    pub input_lag: (i64, i64),
    /// A read as of a time: the version answered.
    pub version: Option<answer::AsOf>,
}

/// A read of one key routed (Routing::route).
pub(crate) struct Routed {
    pub snap: std::sync::Arc<Snapshot>,
    /// The table as the read named it (its view's key in the snapshot).
    pub table: String,
    pub key: String,
    pub partition: usize,
    pub bound: Bound,
    pub cands: Vec<Candidate>,
    /// A write token's events the answer must reflect.
    pub after: Option<After>,
}

impl Routed {
    /// The bound the node checks (None: unbounded).
    pub fn read_bound(&self) -> Option<ReadBound> {
        ReadBound::of(self.bound)
    }
}

/// Who answered, and how fresh it was, as the answer says.
pub(crate) fn served_by<'a>(replica: &'a Replica, rep: &'a ReplicaStatus) -> Served<'a> {
    let (lag_offsets, staleness) = match rep.end_offset {
        Some(_) => (Some(rep.lag_offsets.unwrap_or(0).max(0)), rep.staleness_ms.max(0)),
        None => (None, rep.staleness_ms.max(0)),
    };
    let role = match rep.role {
        ROLE_ACTIVE => "active",
        ROLE_STANDBY => "standby",
        _ if rep.state == SERVING_ACTIVE => "active",
        _ => "standby",
    };
    Served {
        node: if rep.node.is_empty() { &replica.node } else { &rep.node },
        role,
        lag_offsets,
        lag_ms: (staleness < NEVER_CAUGHT_UP_MS).then_some(staleness),
        applied: rep.applied_offset,
    }
}

/// An attempt in flight, counted in its node's load until it ends — also when a hedge's winner drops it.
struct InFlight<'a> {
    routing: &'a Routing,
    node: &'a str,
    done: bool,
}

impl InFlight<'_> {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.routing.load.borrow_mut().finished(self.node, None);
        }
    }
}

/// A position token's table and applied offsets by partition (freshroute.position.Position).
#[derive(Debug, PartialEq, Eq)]
pub struct Position {
    pub table: String,
    pub offsets: HashMap<i64, i64>,
}

/// A query this path serves: the bound's limits as plain numbers, a position, a write token and how long to wait for
/// its events, and a windows read's time range.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub bound: Bound,
    pub position: Option<Position>,
    pub after: Option<WriteToken>,
    pub wait_ms: Option<i64>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    /// A versioned table's key as of this time (ms since the epoch; RFC 3339 text goes to the Python path).
    pub as_of_ms: Option<i64>,
}

/// The bound a query gives (max_lag, max_staleness_ms, min_position, after, wait_ms) and the window range (from, to),
/// or None for any other query, or one the Python path would refuse (it says why).
pub fn parse_query(query: &[u8]) -> Option<Query> {
    let mut q = Query::default();
    for pair in query.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = (&pair[..eq], &pair[eq + 1..]);
        if name == b"min_position" {
            q.position = Some(position(value)?);
            continue;
        }
        if name == b"after" {
            q.after = Some(read_after::decode(value)?);
            continue;
        }
        if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let value: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
        let value = i64::try_from(value).ok()?;
        match name {
            b"max_lag" => q.bound.max_lag = Some(value),
            b"max_staleness_ms" => q.bound.max_staleness_ms = Some(value),
            b"from" => q.from_ms = Some(value),
            b"to" => q.to_ms = Some(value),
            b"as_of" => q.as_of_ms = Some(value),
            b"wait_ms" => q.wait_ms = Some(value),
            _ => return None,
        }
    }
    Some(q)
}

/// Position.decode: `p1.` and base64url of {"t": table, "o": {partition: offset}}; None where it raises.
pub(crate) fn position(token: &[u8]) -> Option<Position> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    #[derive(serde::Deserialize)]
    struct Doc {
        t: String,
        o: HashMap<String, serde_json::Value>,
    }
    let body = token.strip_prefix(b"p1.").filter(|_| token.len() <= 8192)?;
    let raw = URL_SAFE_NO_PAD.decode(body.strip_suffix(b"==").or(body.strip_suffix(b"=")).unwrap_or(body)).ok()?;
    let doc: Doc = serde_json::from_slice(&raw).ok()?;
    let mut offsets = HashMap::with_capacity(doc.o.len());
    for (p, o) in doc.o {
        // int() of each: plain decimal text for a partition, a JSON integer for an offset (others: the Python path).
        let p = partition(&p)?;
        let o = o.as_i64()?;
        if o < 0 {
            return None;
        }
        offsets.insert(p, o);
    }
    Some(Position { table: doc.t, offsets })
}

/// A partition named in a token's JSON as Python's int() reads it, where it is plain decimal text (None otherwise:
/// the Python path reads the rest).
pub(crate) fn partition(text: &str) -> Option<i64> {
    text.parse().ok().filter(|_| text.bytes().all(|b| b.is_ascii_digit()))
}

/// A raw path segment as text (router.rest.routes.segment), or None where that raises.
pub fn segment(raw: &[u8]) -> Option<String> {
    if !raw.contains(&b'%') {
        return String::from_utf8(raw.to_vec()).ok();
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw.get(i + 1..i + 3)?;
            let text = std::str::from_utf8(hex).ok()?;
            if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(text, 16).ok()?);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Kafka's murmur2 (freshroute.keys.murmur2) as an unsigned 32-bit value.
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() == 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_is_kafkas() {
        // freshroute.keys.murmur2 of the same bytes (as unsigned).
        for (key, want) in [(&b"sensor-42"[..], 2894623485u32), (b"", 275646681), (b"a", 2731586172),
                            (b"abc", 479470107), (b"abcd", 2971317748),
                            ("\u{e9}t\u{e9}-12345".as_bytes(), 3015333513)] {
            assert_eq!(murmur2(key), want);
        }
    }

    #[test]
    fn queries_and_segments() {
        assert_eq!(parse_query(b""), Some(Query::default()));
        assert_eq!(parse_query(b"max_lag=5&max_staleness_ms=007").map(|q| q.bound),
                   Some(Bound { max_lag: Some(5), max_staleness_ms: Some(7), min_offset: 0 }));
        // freshroute.position.Position("sensor_stats", {3: 42, 1: 7}).encode()
        let q = parse_query(b"min_position=p1.eyJ0Ijoic2Vuc29yX3N0YXRzIiwibyI6eyIzIjo0MiwiMSI6N319").unwrap();
        assert_eq!(q.position, Some(Position { table: "sensor_stats".into(),
                                               offsets: HashMap::from([(3, 42), (1, 7)]) }));
        assert_eq!(parse_query(b"min_position=p1.nonsense"), None);
        assert_eq!(parse_query(b"min_position=x"), None);
        assert_eq!(parse_query(b"max_lag="), None);
        assert_eq!(parse_query(b"max_lag=-1"), None);
        assert_eq!(parse_query(b"max_lag=9223372036854775808"), None);
        assert_eq!(parse_query(b"from=00000000000000000001"), None, "more than 19 digits, as parse_millis says");
        assert_eq!(parse_query(b"from=10&to=20").map(|q| (q.from_ms, q.to_ms)), Some((Some(10), Some(20))));
        assert_eq!(parse_query(b"as_of=1700000000000").map(|q| q.as_of_ms), Some(Some(1_700_000_000_000)));
        assert_eq!(parse_query(b"as_of=2026-12-03T10:00:00Z"), None);
        assert_eq!(parse_query(b"other=5"), None);
        // A version by number is resolved by the Python path alone.
        assert_eq!(parse_query(b"version=2"), None);
        assert_eq!(parse_query(b"max_lag=5&version=1"), None);
        assert_eq!(segment(b"a%2Fb"), Some("a/b".into()));
        assert_eq!(segment(b"%zz"), None);
        assert_eq!(segment(b"%ff"), None);
    }

    fn run_local<F: std::future::Future<Output = ()>>(f: F) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f);
    }

    /// The reads a node was sent: each one's table, and its time (as_of).
    type Seen = Rc<RefCell<Vec<(String, Option<i64>)>>>;

    /// A store node on loopback finding every key (applied offset 9) and every range's window at 0, keeping each
    /// read's table and time.
    async fn node(seen: Seen) -> String {
        use crate::messages::{KeyResult, RangeResult, ReadBatch, ResultBatch, ScanEntry};
        use prost::Message;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::task::spawn_local(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4];
            while s.read_exact(&mut head).await.is_ok() {
                let mut frame = vec![0u8; u32::from_be_bytes(head) as usize];
                s.read_exact(&mut frame).await.unwrap();
                let batch = ReadBatch::decode(&frame[..]).unwrap();
                let replica = ReplicaStatus { node: "n1".into(), role: ROLE_ACTIVE, state: SERVING_ACTIVE,
                                              applied_offset: 9, end_offset: Some(9), lag_offsets: Some(0),
                                              ..Default::default() };
                let mut out = ResultBatch::default();
                for r in batch.reads {
                    seen.borrow_mut().push((r.table, r.as_of_ms));
                    out.results.push(KeyResult { id: r.id, status: OK, value: bytes::Bytes::from_static(b"{\"n\":1}"),
                                                 replica: Some(replica.clone()),
                                                 valid_from_ms: r.as_of_ms.map(|at| at - 10), ..Default::default() });
                }
                for r in batch.ranges {
                    seen.borrow_mut().push((r.table, None));
                    let entry = ScanEntry { key: crate::windows::window_key(b"k", 0), value: b"{\"n\":2}".to_vec() };
                    out.ranges.push(RangeResult { id: r.id, status: OK, entries: vec![entry],
                                                  replica: Some(replica.clone()), watermark_ms: -1,
                                                  ..Default::default() });
                }
                let mut reply = (out.encoded_len() as u32).to_be_bytes().to_vec();
                out.encode(&mut reply).unwrap();
                s.write_all(&reply).await.unwrap();
            }
        });
        address
    }

    /// A routing view as router/data_plane.py writes it: t serving version 2 (versioned), w serving version 3
    /// (windowed), each read from its version's own table on the node at `address`.
    fn routing(address: &str, now: i64) -> Routing {
        let replica = serde_json::json!([["n1", address, "active", "ACTIVE", 9, 9, 0, now, true, false]]);
        let doc = serde_json::json!({"tables": {
            "t": {"partitions": 1, "served": true, "window": null, "history_retention_ms": 3_600_000,
                  "value_format": "json", "max_lag": null, "max_staleness_ms": null, "input_lag": null,
                  "input_ends": null, "version": 2, "physical": "t-v2"},
            "w": {"partitions": 1, "served": false,
                  "window": {"size_ms": 10_000, "slide_ms": 5_000, "retention_ms": 3_600_000},
                  "history_retention_ms": null, "value_format": "json", "max_lag": null, "max_staleness_ms": null,
                  "input_lag": null, "input_ends": null, "version": 3, "physical": "w-v3"}},
            "replicas": [["t", 0, replica], ["w", 0, replica]], "built_ms": now});
        let config = serde_json::from_value(serde_json::json!({
            "attempt_timeout_ms": 2000, "hedge": false, "hedge_quantile": 0.95, "hedge_min_ms": 5.0,
            "hedge_budget": 0.1, "max_windows": 1000, "freshness_tolerance_offsets": 0, "freshness_tolerance_ms": 0,
            "view_trust_ms": 60_000, "failure_backoff_ms": 1000, "node_expiry_ms": 2000, "cluster_secret": "",
            "keep_alive_s": 5.0, "authenticates": false})).unwrap();
        let shared = crate::Shared::new(config);
        *shared.snapshot.lock().unwrap() = std::sync::Arc::new(Snapshot::parse(doc.to_string().as_bytes()).unwrap());
        Routing::new(std::sync::Arc::new(shared), 1)
    }

    #[test]
    fn a_table_serving_another_version_is_read_from_that_versions_own_table_and_answered_by_its_name() {
        use crate::answer::position_token;
        use crate::grpc_answer::{self, Outcome};
        use crate::messages::GetResponse;
        use prost::Message;

        run_local(async {
            let seen = Rc::new(RefCell::new(Vec::new()));
            let now = now_ms();
            let routing = routing(&node(seen.clone()).await, now);
            let v2 = position_token("t-v2", 0, 9);
            let text = |answered: Option<Answered>| String::from_utf8(answered.expect("served here").1).unwrap();

            let body = text(routing.lookup(b"t", b"k", b"").await);
            assert!(body.starts_with("{\"table\":\"t\",\"table_version\":2,\"key\":\"k\",\"value\":{\"n\":1},"));
            assert!(body.contains(&format!(",\"position\":\"{v2}\",")));
            // What the answer said of the replica's lag is kept as version 2's own table's.
            assert!(routing.overlay.borrow().get("n1", "t-v2", 0).is_some());
            assert!(routing.overlay.borrow().get("n1", "t", 0).is_none());
            let at = now - 1000;
            let body = text(routing.lookup(b"t", b"k", format!("as_of={at}").as_bytes()).await);
            assert!(body.starts_with(&format!("{{\"table\":\"t\",\"table_version\":2,\"key\":\"k\",\
                                               \"value\":{{\"n\":1}},\"as_of\":{at},\"valid_from\":{},", at - 10)));
            let body = text(routing.windows(b"w", b"k", b"from=0&to=10000").await);
            assert!(body.starts_with("{\"table\":\"w\",\"table_version\":3,\"key\":\"k\",\"windows\":[{\"start\":0,"));
            assert!(body.contains(&format!(",\"position\":\"{}\",", position_token("w-v3", 0, 9))));
            let reads = [("t-v2".to_owned(), None), ("t-v2".to_owned(), Some(at)), ("w-v3".to_owned(), None)];
            assert_eq!(*seen.borrow(), reads);

            // A position of version 2 bounds a read here; one of version 1 (which the Python path sets aside) or of
            // another table (which it refuses) goes there unread.
            assert!(routing.lookup(b"t", b"k", format!("min_position={v2}").as_bytes()).await.is_some());
            for other in [position_token("t", 0, 9), position_token("w-v3", 0, 9)] {
                assert!(routing.lookup(b"t", b"k", format!("min_position={other}").as_bytes()).await.is_none());
            }
            // A version's own name is no table of the view: the Python path reads it.
            assert!(routing.lookup(b"t-v2", b"k", b"").await.is_none());
            assert_eq!(seen.borrow().len(), 4);

            let got = routing.key("t".into(), "k".into(), Query::default(), grpc_answer::get, |_, _, _, _| None).await;
            let Some(Outcome::Message(framed)) = got else { panic!("a found key's message") };
            let response = GetResponse::decode(&framed[5..]).unwrap();
            assert_eq!((response.table.as_str(), response.table_version, response.position), ("t", 2, v2));
            assert_eq!(seen.borrow().last(), Some(&("t-v2".to_owned(), None)));
        });
    }
}
