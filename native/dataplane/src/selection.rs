//! Which replica to ask first: freshroute.routing.selection.FreshestFirst, for the bounds this path serves (lag
//! and staleness limits). Freshest first (offset lag, unknown last, then staleness); equally fresh ones by requests
//! in flight, then at random weighted by the inverse of their latency. tests/unit/test_data_plane.py holds both
//! implementations to the same cases.

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::snapshot::{Replica, State};

pub const UNKNOWN_LAG_RANK: i64 = 1 << 62;

/// A caller's limits on lag and staleness (None: no limit), and the applied offset its position asks of the
/// partition read (0: any).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Bound {
    pub max_lag: Option<i64>,
    pub max_staleness_ms: Option<i64>,
    pub min_offset: i64,
}

impl Bound {
    /// Whether nothing limits the answer (a position of 0 still limits: the caller gave one).
    pub fn unbounded(&self) -> bool {
        self.max_lag.is_none() && self.max_staleness_ms.is_none() && self.min_offset == 0
    }

    /// freshroute.bound.Bound.refusal, as a yes or no.
    pub fn refuses(&self, applied: i64, end: Option<i64>, staleness_ms: i64) -> bool {
        self.min_offset > applied || self.lag_refuses(applied, end, staleness_ms)
    }

    /// Refused for the position alone: below it, within every other limit (a replica tailing its changelog gets
    /// there; freshroute.bound.Bound.behind_position_only).
    pub fn behind_position_only(&self, applied: i64, end: Option<i64>, staleness_ms: i64) -> bool {
        self.min_offset > applied && !self.lag_refuses(applied, end, staleness_ms)
    }

    /// freshroute.bound.Bound.lag_refusal, as a yes or no.
    pub fn lag_refuses(&self, applied: i64, end: Option<i64>, staleness_ms: i64) -> bool {
        if let Some(max_lag) = self.max_lag {
            match end {
                None => return true,
                Some(end) if end - applied > max_lag => return true,
                _ => {}
            }
        }
        matches!(self.max_staleness_ms, Some(ms) if staleness_ms > ms)
    }

    pub fn with_defaults(self, max_lag: Option<i64>, max_staleness_ms: Option<i64>) -> Bound {
        Bound { max_lag: self.max_lag.or(max_lag), max_staleness_ms: self.max_staleness_ms.or(max_staleness_ms),
                ..self }
    }
}

pub fn rank_lag(lag: Option<i64>) -> i64 {
    lag.unwrap_or(UNKNOWN_LAG_RANK)
}

/// A replica with its best-known lag at selection time.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub index: usize, // in the partition's replicas
    pub lag: Option<i64>,
    pub staleness_ms: i64,
    pub applied: i64,
}

/// A replica's lag as its own latest answer reported it.
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    pub applied: i64,
    pub end: Option<i64>,
    pub staleness_ms: i64,
    pub observed_ms: i64,
}

/// Lag piggy-backed on answers, newer than heartbeats between refreshes: node → table → by partition. Nested, so
/// that a lookup's reads of it borrow its names rather than build a key.
#[derive(Default)]
pub struct Overlay {
    by_node: HashMap<String, HashMap<String, Vec<Option<Observation>>>>,
}

impl Overlay {
    pub fn observe(&mut self, node: &str, table: &str, partition: usize, o: Observation) {
        if !self.by_node.contains_key(node) {
            self.by_node.insert(node.to_owned(), HashMap::new());
        }
        let tables = self.by_node.get_mut(node).expect("inserted above");
        if !tables.contains_key(table) {
            tables.insert(table.to_owned(), Vec::new());
        }
        let slots = tables.get_mut(table).expect("inserted above");
        if slots.len() <= partition {
            slots.resize(partition + 1, None);
        }
        slots[partition] = Some(o);
    }

    pub fn get(&self, node: &str, table: &str, partition: usize) -> Option<&Observation> {
        self.by_node.get(node)?.get(table)?.get(partition)?.as_ref()
    }

    pub fn prune(&mut self, older_than_ms: i64) {
        for tables in self.by_node.values_mut() {
            for slots in tables.values_mut() {
                for slot in slots.iter_mut() {
                    if slot.is_some_and(|o| o.observed_ms < older_than_ms) {
                        *slot = None;
                    }
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct NodeLoad {
    pub in_flight: i64,
    pub ewma_ms: f64,
    pub failing_until_ms: i64,
}

impl Default for NodeLoad {
    fn default() -> Self {
        NodeLoad { in_flight: 0, ewma_ms: 1.0, failing_until_ms: 0 }
    }
}

/// Per-node load, fed by every attempt of this thread.
pub struct Load {
    nodes: HashMap<String, NodeLoad>,
    backoff_ms: i64,
}

const ALPHA: f64 = 0.2;

impl Load {
    pub fn new(backoff_ms: i64) -> Self {
        Load { nodes: HashMap::new(), backoff_ms }
    }

    pub fn of(&self, node: &str) -> NodeLoad {
        self.nodes.get(node).copied().unwrap_or_default()
    }

    fn entry(&mut self, node: &str) -> &mut NodeLoad {
        if !self.nodes.contains_key(node) {
            self.nodes.insert(node.to_owned(), NodeLoad::default());
        }
        self.nodes.get_mut(node).expect("inserted above")
    }

    pub fn started(&mut self, node: &str) {
        self.entry(node).in_flight += 1;
    }

    /// An attempt ended; `latency_ms` when the node answered (any status).
    pub fn finished(&mut self, node: &str, latency_ms: Option<f64>) {
        let load = self.entry(node);
        load.in_flight = (load.in_flight - 1).max(0);
        if let Some(ms) = latency_ms {
            load.ewma_ms += ALPHA * (ms - load.ewma_ms);
            load.failing_until_ms = 0;
        }
    }

    /// The node could not be reached: the back of the line for a while.
    pub fn failed(&mut self, node: &str, now_ms: i64) {
        let backoff = self.backoff_ms;
        self.entry(node).failing_until_ms = now_ms + backoff;
    }
}

/// What selection is tuned by (the router's routing policy).
#[derive(Clone, Copy, Debug)]
pub struct Tolerances {
    pub offsets: i64,
    pub ms: i64,
    pub view_trust_ms: i64,
}

/// The replica's best-known lag (its report's, or a newer answer's) and that view's age.
pub fn estimate(r: &Replica, index: usize, table: &str, partition: usize, overlay: &Overlay, now: i64) -> (Candidate, i64) {
    let (mut applied, mut end, mut staleness, mut observed) = (r.applied, r.end, r.staleness_ms, r.observed_ms);
    if let Some(o) = overlay.get(&r.node, table, partition) {
        if o.observed_ms >= observed {
            (applied, end, staleness, observed) = (o.applied, o.end, o.staleness_ms, o.observed_ms);
        }
    }
    let lag = end.map(|e| if e > applied { e - applied } else { 0 });
    let age = if now > observed { now - observed } else { 0 };
    // A replica that was behind (or does not know how far) keeps getting staler until it catches up.
    if lag != Some(0) {
        staleness += age;
    }
    (Candidate { index, lag, staleness_ms: staleness, applied }, age)
}

/// The replicas to try, in order: those the view puts within the bound, then those it cannot judge (a view older
/// than `view_trust_ms`, or one behind the caller's position alone: the position came from an answer, so the view
/// is what is old). Replicas it knows to be outside the bound are not tried here (the Python path's fallback).
pub fn select(replicas: &[Replica], table: &str, partition: usize, bound: Bound, overlay: &Overlay, load: &Load,
              tol: Tolerances, now: i64, rng: &mut SmallRng) -> Vec<Candidate> {
    let usable = |r: &Replica| r.state != State::Unreported && r.state != State::Failed;
    let any_live = replicas.iter().any(|r| usable(r) && r.alive);
    let unbounded = bound.unbounded();
    let mut within = Vec::with_capacity(replicas.len());
    let mut unsure = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        if !usable(r) || (any_live && !r.alive) {
            continue;
        }
        let (c, age) = estimate(r, i, table, partition, overlay, now);
        let end = c.lag.map(|l| c.applied + l);
        if unbounded || !bound.refuses(c.applied, end, c.staleness_ms) {
            within.push(c);
        } else if age > tol.view_trust_ms || bound.behind_position_only(c.applied, end, c.staleness_ms) {
            unsure.push(c);
        }
    }
    let mut ordered = order(within, replicas, load, tol, now, rng);
    if !unsure.is_empty() {
        ordered.extend(order(unsure, replicas, load, tol, now, rng));
    }
    ordered
}

type Rank = (bool, bool, u8, i64, i64, i64);

/// Replicas backing off last, restoring ones after serving ones, then fresher first; equally fresh by in flight.
fn rank(c: &Candidate, r: &Replica, load: &NodeLoad, lag_cut: i64, ms_cut: i64, now: i64) -> Rank {
    let backoff = r.draining || load.failing_until_ms > now;
    let restoring = r.state == State::Restoring;
    let lag = rank_lag(c.lag);
    if lag <= lag_cut && c.staleness_ms <= ms_cut {
        (backoff, restoring, 0, 0, 0, load.in_flight)
    } else {
        (backoff, restoring, 1, lag, c.staleness_ms, load.in_flight)
    }
}

fn weight(load: &NodeLoad) -> f64 {
    1.0 / load.ewma_ms.max(0.01)
}

fn order(mut cands: Vec<Candidate>, replicas: &[Replica], load: &Load, tol: Tolerances, now: i64,
         rng: &mut SmallRng) -> Vec<Candidate> {
    let n = cands.len();
    if n < 2 {
        return cands;
    }
    let lag_cut = cands.iter().map(|c| rank_lag(c.lag)).min().unwrap_or(0).saturating_add(tol.offsets);
    let ms_cut = cands.iter().map(|c| c.staleness_ms).min().unwrap_or(0).saturating_add(tol.ms);
    let loads: Vec<NodeLoad> = cands.iter().map(|c| load.of(&replicas[c.index].node)).collect();
    let mut keyed: Vec<(Rank, usize)> = cands
        .iter()
        .enumerate()
        .map(|(i, c)| (rank(c, &replicas[c.index], &loads[i], lag_cut, ms_cut, now), i))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && keyed[j].0 == keyed[i].0 {
            j += 1;
        }
        // Equally fresh, equally busy: a random order, faster replicas more likely first, so that every replica's
        // latency estimate stays current.
        let mut run: Vec<usize> = keyed[i..j].iter().map(|k| k.1).collect();
        while run.len() > 1 {
            let weights: Vec<f64> = run.iter().map(|&k| weight(&loads[k])).collect();
            let mut x = rng.gen::<f64>() * weights.iter().sum::<f64>();
            let mut pick = run.len() - 1;
            for (k, w) in weights.iter().enumerate() {
                x -= w;
                if x < 0.0 {
                    pick = k;
                    break;
                }
            }
            out.push(cands[run.remove(pick)]);
        }
        out.push(cands[run[0]]);
        i = j;
    }
    cands.clear();
    out
}

/// A latency quantile of recent reads, for when to give a slow attempt up to the Python path's hedging.
pub struct LatencyWindow {
    q: f64,
    buf: Vec<f64>,
    n: usize,
    pub value_ms: Option<f64>,
}

impl LatencyWindow {
    pub fn new(q: f64) -> Self {
        LatencyWindow { q, buf: vec![0.0; 512], n: 0, value_ms: None }
    }

    pub fn record(&mut self, ms: f64) {
        let len = self.buf.len();
        self.buf[self.n % len] = ms;
        self.n += 1;
        if self.n >= 32 && self.n % 64 == 0 {
            let mut filled: Vec<f64> = self.buf[..self.n.min(len)].to_vec();
            filled.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            let at = ((self.q * filled.len() as f64) as usize).min(filled.len() - 1);
            self.value_ms = Some(filled[at]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn replica(node: &str, applied: i64, end: Option<i64>, staleness: i64, alive: bool) -> Replica {
        Replica { node: node.into(), read_address: Some("127.0.0.1:1".into()), active: node == "a",
                  state: State::Active, applied, end, staleness_ms: staleness, observed_ms: 1000, alive,
                  draining: false }
    }

    const TOL: Tolerances = Tolerances { offsets: 0, ms: 0, view_trust_ms: 1000 };

    #[test]
    fn freshest_first_and_bound_excludes_a_known_laggard() {
        let rs = vec![replica("a", 5, Some(10), 0, true), replica("b", 10, Some(10), 0, true)];
        let mut rng = SmallRng::seed_from_u64(1);
        let load = Load::new(1000);
        let got = select(&rs, "t", 0, Bound::default(), &Overlay::default(), &load, TOL, 1000, &mut rng);
        assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1, 0]);
        let bound = Bound { max_lag: Some(2), ..Bound::default() };
        let got = select(&rs, "t", 0, bound, &Overlay::default(), &load, TOL, 1000, &mut rng);
        assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1]);
        // An old view never excludes a replica: it is tried after those within the bound.
        let got = select(&rs, "t", 0, bound, &Overlay::default(), &load, TOL, 2500, &mut rng);
        assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1, 0]);
    }

    #[test]
    fn dead_replicas_only_when_none_lives_and_unknown_end_refused_by_max_lag() {
        let rs = vec![replica("a", 10, Some(10), 0, false), replica("b", 3, None, 0, true)];
        let mut rng = SmallRng::seed_from_u64(1);
        let load = Load::new(1000);
        let got = select(&rs, "t", 0, Bound::default(), &Overlay::default(), &load, TOL, 1000, &mut rng);
        assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1]);
        assert_eq!(got[0].lag, None);
        let bound = Bound { max_lag: Some(100), ..Bound::default() };
        assert!(select(&rs, "t", 0, bound, &Overlay::default(), &load, TOL, 1000, &mut rng).is_empty());
        // A position the view says no live replica has reached: asked all the same, the node judges it.
        let bound = Bound { min_offset: 7, ..Bound::default() };
        let got = select(&rs, "t", 0, bound, &Overlay::default(), &load, TOL, 1000, &mut rng);
        assert_eq!(got.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1]);
        let bound = Bound { min_offset: 7, max_lag: Some(100), ..Bound::default() };
        assert!(select(&rs, "t", 0, bound, &Overlay::default(), &load, TOL, 1000, &mut rng).is_empty());
    }

    #[test]
    fn a_replica_behind_keeps_getting_staler_and_an_answer_overrides_the_report() {
        let rs = vec![replica("a", 5, Some(10), 0, true)];
        let mut overlay = Overlay::default();
        let (c, age) = estimate(&rs[0], 0, "t", 0, &overlay, 1300);
        assert_eq!((c.lag, c.staleness_ms, age), (Some(5), 300, 300));
        overlay.observe("a", "t", 0, Observation { applied: 10, end: Some(10), staleness_ms: 0, observed_ms: 1200 });
        let (c, _) = estimate(&rs[0], 0, "t", 0, &overlay, 1300);
        assert_eq!((c.lag, c.staleness_ms, c.applied), (Some(0), 0, 10));
        // Observations older than a heartbeat since are forgotten: the report speaks again.
        overlay.prune(1201);
        assert!(overlay.get("a", "t", 0).is_none());
    }
}
