//! A client's direct key reads on the compiled path (freshroute.client.compiled): the key's partition, the freshest
//! replica within the bound, the read — hedged to a second replica when slow — and the answer with its labels, as
//! the router's path decides them (lookup.rs), with no I/O of its own. The caller's asyncio loop owns the
//! connections (one transport per store node's read port) and the one timer: a read leaves by its transport's
//! `write`, an answer comes in through `received`, and `expire` runs when `due` is reached. Whatever this does not
//! serve — a bound it does not know, no replica the view trusts, a refusal, a failure, a timeout — resolves to None,
//! and the client's Python path answers it with every rule of freshroute.routing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};
use rand::rngs::SmallRng;

use crate::lookup::{murmur2, now_ms, served_by};
use crate::messages::{KeyRead, ReadBatch, ReadBound, ResultBatch, NOT_FOUND, OK};
use crate::selection::{self, Bound as ReadLimits, Candidate, LatencyWindow, Load, Observation, Overlay, Tolerances};
use crate::snapshot::{Snapshot, State, ValueFormat};
use crate::Config;

/// Far above any batch a node answers; a longer frame means the peer does not speak this protocol.
const MAX_FRAME: usize = 64 << 20;

/// How early a timer of the caller's loop may fire and still be on time.
const EARLY_US: u64 = 1000;

/// `get` took the read: its future resolves to the answer, or to None for the Python path.
pub const SERVED: u8 = 1;
/// Reads wait in an outbox: call `flush` once the loop's current callbacks have run (reads issued together leave
/// together).
pub const FLUSH: u8 = 2;
/// Arm the loop's timer at `due` (earlier than the one armed, or none was).
pub const TIMER: u8 = 4;

/// One store node's read port, as the client's transport to it carries it.
struct Conn {
    transport: PyObject,
    outbox: Vec<KeyRead>,
    /// Batches written and not answered yet: while there are none, a read leaves at once.
    unanswered: usize,
    /// The first batch of a connection carries the cluster secret.
    secret_due: bool,
    inbuf: Vec<u8>,
    /// Attempt id → its lookup, the replica it asked, and when it was sent (loop time).
    waiting: HashMap<u64, (u64, Candidate, f64)>,
}

/// A lookup in flight.
struct Pending {
    fut: PyObject,
    key: PyObject,
    snap: Arc<Snapshot>,
    table: String,
    partition: usize,
    cands: Vec<Candidate>,
    read: KeyRead,
    /// Attempts still open (first, hedge).
    open: u8,
    /// When to hedge (None: no second replica to hedge to, or hedged already) and when to give up.
    hedge_at: Option<f64>,
    deadline: f64,
}

#[pyclass(unsendable, module = "freshroute_dataplane")]
pub struct DirectReads {
    config: Config,
    snapshot: Arc<Snapshot>,
    conns: HashMap<String, Conn>,
    pending: HashMap<u64, Pending>,
    timers: BinaryHeap<Reverse<(u64, u64)>>, // (due in µs of loop time, lookup id)
    armed_us: Option<u64>,
    next_id: u64,
    overlay: Overlay,
    load: Load,
    latency: LatencyWindow,
    rng: SmallRng,
    hedge_tokens: f64,
    pruned_at: i64,
    /// The answer's type (freshroute.client.lookup.Lookup), made by tuple.__new__ as the Python path makes it.
    lookup_cls: Py<PyType>,
    tuple_new: PyObject,
    hedges: u64,
}

fn micros(t: f64) -> u64 {
    (t.max(0.0) * 1e6) as u64
}

#[pymethods]
impl DirectReads {
    /// `config`: the routing policy's settings as JSON (freshroute.routing.compiled_view.policy_doc); `lookup_cls`:
    /// the named tuple every answer is made as.
    #[new]
    fn new(py: Python<'_>, config: &str, lookup_cls: Bound<'_, PyType>) -> PyResult<DirectReads> {
        use rand::SeedableRng;
        let config: Config = serde_json::from_str(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let tuple_new = py.get_type::<PyTuple>().getattr("__new__")?.unbind();
        Ok(DirectReads {
            load: Load::new(config.failure_backoff_ms),
            latency: LatencyWindow::new(config.hedge_quantile),
            config,
            snapshot: Arc::new(Snapshot::default()),
            conns: HashMap::new(),
            pending: HashMap::new(),
            timers: BinaryHeap::new(),
            armed_us: None,
            next_id: 1,
            overlay: Overlay::default(),
            rng: SmallRng::seed_from_u64(std::process::id() as u64),
            hedge_tokens: 0.0,
            pruned_at: 0,
            lookup_cls: lookup_cls.unbind(),
            tuple_new,
            hedges: 0,
        })
    }

    /// Swap in a new routing view (freshroute.routing.compiled_view.snapshot_doc's JSON).
    fn update(&mut self, doc: &[u8]) -> PyResult<()> {
        self.snapshot = Arc::new(Snapshot::parse(doc).map_err(PyValueError::new_err)?);
        Ok(())
    }

    /// The read port at `address` is reached by `transport` (an asyncio transport) from now on.
    fn connected(&mut self, address: String, transport: PyObject) {
        self.conns.insert(address, Conn { transport, outbox: Vec::new(), unanswered: 0, secret_due: true,
                                          inbuf: Vec::new(), waiting: HashMap::new() });
    }

    /// Whether a transport to `address` is known.
    fn reaches(&self, address: &str) -> bool {
        self.conns.contains_key(address)
    }

    /// Read `key` of `table` (the name read by, and the served version's own table `physical`) from the freshest
    /// replica within the bound: `position`, a min_position's (table, {partition: offset}). Flags: SERVED, FLUSH,
    /// TIMER; without SERVED the Python path reads it (the future is left alone).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (table, physical, key, max_lag, max_staleness_ms, position, fut, now))]
    fn get(&mut self, py: Python<'_>, table: &str, physical: &str, key: Bound<'_, PyAny>, max_lag: Option<i64>,
           max_staleness_ms: Option<i64>, position: Option<(String, HashMap<i64, i64>)>, fut: PyObject,
           now: f64) -> PyResult<u8> {
        let snap = self.snapshot.clone();
        let Some(spec) = snap.tables.get(table).filter(|t| t.served && t.physical == physical) else { return Ok(0) };
        let text = key.downcast::<pyo3::types::PyString>()?.to_str()?;
        let partition = (murmur2(text.as_bytes()) & 0x7fff_ffff) as usize % spec.partitions.len().max(1);
        let Some(replicas) = spec.partitions.get(partition) else { return Ok(0) };
        // A position of another table, or another version's, is the Python path's to refuse or set aside.
        let min_offset = match &position {
            Some((t, _)) if t != physical => return Ok(0),
            Some((_, offsets)) => offsets.get(&(partition as i64)).copied().unwrap_or(0),
            None => 0,
        };
        let bound = ReadLimits { max_lag, max_staleness_ms, min_offset }.with_defaults(spec.max_lag, spec.max_staleness_ms);
        let wall = now_ms();
        if wall - self.pruned_at > 1000 {
            // Heartbeats published since then carry newer lag than these answers did.
            self.pruned_at = wall;
            self.overlay.prune(snap.built_ms - 2 * self.config.node_expiry_ms);
        }
        let c = &self.config;
        let tol = Tolerances { offsets: c.freshness_tolerance_offsets, ms: c.freshness_tolerance_ms,
                               view_trust_ms: c.view_trust_ms };
        let cands = selection::select(replicas, physical, partition, bound, &self.overlay, &self.load, tol, wall,
                                      &mut self.rng);
        let Some(first) = cands.first().copied() else { return Ok(0) };
        let Some(address) = replicas[first.index].read_address.as_deref().filter(|a| self.conns.contains_key(*a))
        else { return Ok(0) };
        let address = address.to_owned();
        let attempt_s = c.attempt_timeout_ms as f64 / 1000.0;
        self.hedge_tokens = (self.hedge_tokens + c.hedge_budget).min(10.0);
        let second = cands.get(1).filter(|s| c.hedge && replicas[s.index].state != State::Restoring);
        let hedge_after = match (second, self.latency.value_ms) {
            (Some(_), Some(ms)) => (ms.max(c.hedge_min_ms) / 1000.0).min(attempt_s),
            _ => attempt_s,
        };
        let read = KeyRead { id: 0, table: physical.to_owned(), partition: partition as i32,
                             key: text.as_bytes().to_vec(),
                             bound: (!bound.unbounded()).then_some(ReadBound { max_lag: bound.max_lag,
                                                                                max_staleness_ms: bound.max_staleness_ms,
                                                                                min_offset: bound.min_offset }),
                             as_of_ms: None };
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + attempt_s;
        let hedge_at = (hedge_after < attempt_s).then_some(now + hedge_after);
        self.pending.insert(id, Pending { fut, key: key.unbind(), snap: snap.clone(), table: table.to_owned(),
                                          partition, cands, read, open: 1, hedge_at, deadline });
        let mut flags = SERVED | self.send(py, &address, id, first, now)?;
        flags |= self.timer(id, hedge_at.unwrap_or(deadline));
        Ok(flags)
    }

    /// Write every outbox's reads, one batch per node.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        let addresses: Vec<String> = self.conns.iter().filter(|(_, c)| !c.outbox.is_empty()).map(|(a, _)| a.clone())
            .collect();
        for address in addresses {
            self.write(py, &address)?;
        }
        Ok(())
    }

    /// Bytes from the read port at `address`: each answer settles its attempt. Returns TIMER when a hedge was sent.
    fn received(&mut self, py: Python<'_>, address: &str, data: &[u8], now: f64) -> PyResult<u8> {
        let Some(conn) = self.conns.get_mut(address) else { return Ok(0) };
        conn.inbuf.extend_from_slice(data);
        let mut batches = Vec::new();
        let mut at = 0;
        let broken = loop {
            let buf = &conn.inbuf[at..];
            if buf.len() < 4 {
                break None;
            }
            let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if size > MAX_FRAME {
                break Some(format!("frame of {size} bytes announced"));
            }
            if buf.len() < 4 + size {
                break None;
            }
            match ResultBatch::decode(&buf[4..4 + size]) {
                Ok(b) if b.refused.is_empty() => batches.push(b),
                Ok(b) => break Some(format!("refused the read: {}", b.refused)),
                Err(e) => break Some(format!("not a result batch ({e})")),
            }
            at += 4 + size;
        };
        conn.inbuf.drain(..at);
        let mut flags = 0;
        for batch in batches {
            if let Some(conn) = self.conns.get_mut(address) {
                conn.unanswered = conn.unanswered.saturating_sub(1);
            }
            for result in batch.results {
                let Some((lookup, cand, sent)) = self.conns.get_mut(address).and_then(|c| c.waiting.remove(&result.id))
                else { continue };
                flags |= self.settle(py, lookup, cand, sent, Some(result), now)?;
            }
        }
        if let Some(why) = broken {
            self.lost(py, address, Some(why), now)?;
        } else if self.conns.get(address).is_some_and(|c| !c.outbox.is_empty() && c.unanswered == 0) {
            self.write(py, address)?;
        }
        Ok(flags)
    }

    /// The read port at `address` is gone (`why`: a reason, for the abort): every attempt in flight on it failed.
    #[pyo3(signature = (address, why=None, now=0.0))]
    fn lost(&mut self, py: Python<'_>, address: &str, why: Option<String>, now: f64) -> PyResult<u8> {
        let Some(conn) = self.conns.remove(address) else { return Ok(0) };
        if why.is_some() {
            let _ = conn.transport.call_method0(py, "abort");
        }
        let mut flags = 0;
        for (_, (lookup, cand, sent)) in conn.waiting {
            flags |= self.settle(py, lookup, cand, sent, None, now)?;
        }
        Ok(flags)
    }

    /// The loop's timer fired: hedges due leave, lookups past their deadline go to the Python path. Returns TIMER
    /// when another is due.
    fn expire(&mut self, py: Python<'_>, now: f64) -> PyResult<u8> {
        self.armed_us = None;
        let mut flags = 0;
        while let Some(Reverse((due, id))) = self.timers.peek().copied() {
            // The loop's timers fire up to a millisecond early (uvloop's are libuv's, in whole ms): that is on time.
            if due > micros(now) + EARLY_US {
                break;
            }
            self.timers.pop();
            let Some(p) = self.pending.get_mut(&id) else { continue };
            if micros(now) + EARLY_US >= micros(p.deadline) {
                self.give_up(py, id)?;
                continue;
            }
            if p.hedge_at.is_none_or(|at| micros(at) > micros(now) + EARLY_US) {
                continue;
            }
            p.hedge_at = None;
            let deadline = p.deadline;
            let second = p.cands.get(1).copied().and_then(|s| {
                let address = p.snap.tables[&p.table].partitions[p.partition][s.index].read_address.clone()?;
                Some((s, address))
            });
            match second {
                Some((second, address)) if self.hedge_tokens >= 1.0 && self.conns.contains_key(&address) => {
                    self.hedge_tokens -= 1.0;
                    self.hedges += 1;
                    p.open += 1;
                    flags |= self.send(py, &address, id, second, now)?;
                    self.timers.push(Reverse((micros(deadline), id)));
                }
                _ => self.give_up(py, id)?,
            }
        }
        if let Some(Reverse((due, _))) = self.timers.peek() {
            self.armed_us = Some(*due);
            flags |= TIMER;
        }
        Ok(flags)
    }

    /// When the loop's timer is due (loop time), if a lookup waits on one.
    #[getter]
    fn due(&self) -> Option<f64> {
        self.armed_us.map(|us| us as f64 / 1e6)
    }

    /// Lookups in flight.
    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Hedges sent so far.
    fn hedges(&self) -> u64 {
        self.hedges
    }
}

impl DirectReads {
    /// Queue the lookup's read for `cand` on `address`'s connection; written at once on an idle connection.
    fn send(&mut self, py: Python<'_>, address: &str, id: u64, cand: Candidate, now: f64) -> PyResult<u8> {
        let attempt = self.next_id;
        self.next_id += 1;
        let p = &self.pending[&id];
        let node = p.snap.tables[&p.table].partitions[p.partition][cand.index].node.clone();
        let mut read = p.read.clone();
        read.id = attempt;
        let conn = self.conns.get_mut(address).expect("sent only to a node reached");
        conn.waiting.insert(attempt, (id, cand, now));
        conn.outbox.push(read);
        self.load.started(&node);
        if conn.unanswered == 0 {
            self.write(py, address)?;
            return Ok(0);
        }
        Ok(FLUSH)
    }

    fn write(&mut self, py: Python<'_>, address: &str) -> PyResult<()> {
        let conn = self.conns.get_mut(address).expect("written only to a node reached");
        let mut batch = ReadBatch { reads: std::mem::take(&mut conn.outbox), ..Default::default() };
        if batch.reads.is_empty() {
            return Ok(());
        }
        if std::mem::replace(&mut conn.secret_due, false) {
            batch.cluster_secret = self.config.cluster_secret.clone();
        }
        let mut frame = Vec::with_capacity(4 + batch.encoded_len());
        frame.extend_from_slice(&(batch.encoded_len() as u32).to_be_bytes());
        batch.encode(&mut frame).expect("a Vec grows");
        conn.unanswered += 1;
        conn.transport.call_method1(py, "write", (PyBytes::new(py, &frame),))?;
        Ok(())
    }

    fn timer(&mut self, id: u64, at: f64) -> u8 {
        let due = micros(at);
        self.timers.push(Reverse((due, id)));
        if self.armed_us.is_none_or(|armed| due < armed) {
            self.armed_us = Some(due);
            return TIMER;
        }
        0
    }

    /// An attempt ended: with the node's result, or without (its connection failed).
    fn settle(&mut self, py: Python<'_>, id: u64, cand: Candidate, sent: f64,
              result: Option<crate::messages::KeyResult>, now: f64) -> PyResult<u8> {
        let ms = ((now - sent) * 1000.0).max(0.0);
        let Some(p) = self.pending.get(&id) else { return Ok(0) };
        let (snap, partition) = (p.snap.clone(), p.partition);
        let spec = &snap.tables[&p.table];
        let replica = &spec.partitions[partition][cand.index];
        let Some(result) = result else {
            self.load.finished(&replica.node, None);
            self.load.failed(&replica.node, now_ms());
            return self.attempt_failed(py, id);
        };
        self.load.finished(&replica.node, Some(ms));
        let Some(rep) = result.replica.as_ref() else { return self.attempt_failed(py, id) };
        self.overlay.observe(&replica.node, &spec.physical, partition, Observation {
            applied: rep.applied_offset, end: rep.end_offset, staleness_ms: rep.staleness_ms.max(0),
            observed_ms: now_ms() });
        if result.status != OK && result.status != NOT_FOUND {
            return self.attempt_failed(py, id);
        }
        self.latency.record(ms);
        let p = self.pending.remove(&id).expect("looked up above");
        let who = served_by(replica, rep);
        let (records, behind_ms) = spec.input_lag_at(now_ms());
        let found = result.status == OK;
        let format = match spec.value_format {
            ValueFormat::Json => "json",
            ValueFormat::Text => "string",
            ValueFormat::Bytes => "bytes",
        };
        let value = if found { PyBytes::new(py, &result.value).into_any() } else { py.None().into_bound(py) };
        let fields = PyTuple::new(py, [
            spec.physical.as_str().into_pyobject(py)?.into_any(), p.key.into_bound(py),
            found.into_pyobject(py)?.to_owned().into_any(), value,
            partition.into_pyobject(py)?.into_any(), who.node.into_pyobject(py)?.into_any(),
            who.role.into_pyobject(py)?.into_any(), who.lag_offsets.into_pyobject(py)?.into_any(),
            who.lag_ms.into_pyobject(py)?.into_any(), who.applied.into_pyobject(py)?.into_any(),
            records.into_pyobject(py)?.into_any(), behind_ms.into_pyobject(py)?.into_any(),
            format.into_pyobject(py)?.into_any(),
        ])?;
        let answer = self.tuple_new.call1(py, (self.lookup_cls.clone_ref(py), fields))?;
        resolve(py, &p.fut, answer)?;
        Ok(0)
    }

    fn attempt_failed(&mut self, py: Python<'_>, id: u64) -> PyResult<u8> {
        let Some(p) = self.pending.get_mut(&id) else { return Ok(0) };
        p.open = p.open.saturating_sub(1);
        // The first attempt failing before the hedge, or both failing: the Python path, which tries the others.
        if p.open == 0 {
            self.give_up(py, id)?;
        }
        Ok(0)
    }

    fn give_up(&mut self, py: Python<'_>, id: u64) -> PyResult<()> {
        if let Some(p) = self.pending.remove(&id) {
            resolve(py, &p.fut, py.None())?;
        }
        Ok(())
    }
}

/// The future's result, unless its caller gave up on it (cancelled).
fn resolve(py: Python<'_>, fut: &PyObject, value: PyObject) -> PyResult<()> {
    let fut = fut.bind(py);
    if !fut.call_method0("done")?.is_truthy()? {
        fut.call_method1("set_result", (value,))?;
    }
    Ok(())
}
