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
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple, PyType};
use rand::rngs::SmallRng;

use crate::answer::Served;
use crate::lookup::{murmur2, now_ms, served_by};
use crate::messages::{GroupRead, GroupResult, KeyRead, KeyResult, ReadBatch, ReadBound, ReplicaStatus, ResultBatch,
                      MAX_FRAME, NOT_FOUND, OK};
use crate::selection::{self, Bound as ReadLimits, Candidate, LatencyWindow, Load, Observation, Overlay, Tolerances};
use crate::snapshot::{Snapshot, State, ValueFormat};
use crate::Config;


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
    /// Reads waiting to leave as one batch (its secret and the other fields set when written).
    outbox: ReadBatch,
    /// Batches written and not answered yet: while there are none, a read leaves at once.
    unanswered: usize,
    /// The first batch of a connection carries the cluster secret.
    secret_due: bool,
    inbuf: Vec<u8>,
    /// Attempt id → whose read it is.
    waiting: HashMap<u64, Waiter>,
}

/// An attempt in flight: its lookup (a key's, or a batch's group), the replica it asked, when it left (loop time).
#[derive(Clone, Copy)]
struct Waiter {
    owner: u64,
    group: Option<usize>,
    cand: Candidate,
    sent: f64,
}

/// An attempt a lookup keeps open: where it went, under which id, and the node whose load counts it.
struct Attempt {
    address: String,
    id: u64,
    node: String,
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
    /// Attempts still open (first, hedge): each ends its node's load count once — answered, lost, or abandoned when
    /// the lookup resolves or gives up (as lookup.rs's InFlight does).
    attempts: Vec<Attempt>,
    /// When to hedge (None: no second replica to hedge to, or hedged already) and when to give up.
    hedge_at: Option<f64>,
    deadline: f64,
}

/// A batch of keys in flight: one group read per partition, answered when every group is (no hedges: a group that
/// fails sends the whole batch to the Python path).
struct Batch {
    fut: PyObject,
    keys: Py<PyList>,
    snap: Arc<Snapshot>,
    table: String,
    /// Each partition's group: (partition, the keys' indices in the batch).
    groups: Vec<(usize, Vec<usize>)>,
    answers: Vec<Option<PyObject>>,
    left: usize,
    attempts: Vec<Attempt>,
}

/// Sendable: a client may be dropped on another thread than its loop's (a blocking client's caller), and pyo3's borrow
/// check keeps two threads from using one at once.
#[pyclass(module = "freshroute_dataplane")]
pub struct DirectReads {
    config: Config,
    snapshot: Arc<Snapshot>,
    conns: HashMap<String, Conn>,
    pending: HashMap<u64, Pending>,
    batches: HashMap<u64, Batch>,
    timers: BinaryHeap<Reverse<(u64, u64)>>, // (due in µs of loop time, lookup id)
    armed_us: Option<u64>,
    next_id: u64,
    overlay: Overlay,
    load: Load,
    latency: LatencyWindow,
    rng: SmallRng,
    hedge_tokens: f64,
    pruned_at: i64,
    /// The answer's type (freshroute.client.lookup.Lookup), a tuple subclass, and its allocator.
    lookup_cls: Py<PyType>,
    lookup_alloc: ffi::allocfunc,
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
    fn new(config: &str, lookup_cls: Bound<'_, PyType>) -> PyResult<DirectReads> {
        use rand::SeedableRng;
        let config: Config = serde_json::from_str(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        if !lookup_cls.is_subclass_of::<PyTuple>()? {
            return Err(PyValueError::new_err("the answer's type must be a named tuple"));
        }
        // SAFETY: a type object's slot, read by the limited API's accessor; a tuple subclass has tp_alloc.
        let lookup_alloc = unsafe {
            let slot = ffi::PyType_GetSlot(lookup_cls.as_type_ptr(), ffi::Py_tp_alloc);
            if slot.is_null() { ffi::PyType_GenericAlloc } else { std::mem::transmute::<_, ffi::allocfunc>(slot) }
        };
        Ok(DirectReads {
            load: Load::new(config.failure_backoff_ms),
            latency: LatencyWindow::new(config.hedge_quantile),
            config,
            snapshot: Arc::new(Snapshot::default()),
            conns: HashMap::new(),
            pending: HashMap::new(),
            batches: HashMap::new(),
            timers: BinaryHeap::new(),
            armed_us: None,
            next_id: 1,
            overlay: Overlay::default(),
            rng: SmallRng::seed_from_u64(std::process::id() as u64),
            hedge_tokens: 0.0,
            pruned_at: 0,
            lookup_cls: lookup_cls.unbind(),
            lookup_alloc,
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
        self.conns.insert(address, Conn { transport, outbox: ReadBatch::default(), unanswered: 0, secret_due: true,
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
        // Not text, or text that is not UTF-8 (a lone surrogate): the Python path says what is wrong with it.
        let Ok(text) = key.downcast::<PyString>().map_err(PyErr::from).and_then(|k| k.to_str()) else { return Ok(0) };
        let partition = (murmur2(text.as_bytes()) & 0x7fff_ffff) as usize % spec.partitions.len().max(1);
        let Some(replicas) = spec.partitions.get(partition) else { return Ok(0) };
        // A position of another table, or another version's, is the Python path's to refuse or set aside.
        let min_offset = match &position {
            Some((t, _)) if t != physical => return Ok(0),
            Some((_, offsets)) => offsets.get(&(partition as i64)).copied().unwrap_or(0),
            None => 0,
        };
        let bound = ReadLimits { max_lag, max_staleness_ms, min_offset }
            .with_defaults(spec.max_lag, spec.max_staleness_ms);
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
                             bound: ReadBound::of(bound),
                             as_of_ms: None };
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + attempt_s;
        let hedge_at = (hedge_after < attempt_s).then_some(now + hedge_after);
        self.pending.insert(id, Pending { fut, key: key.unbind(), snap: snap.clone(), table: table.to_owned(),
                                          partition, cands, read, attempts: Vec::new(), hedge_at, deadline });
        let mut flags = SERVED | self.send(py, &address, id, first, now)?;
        flags |= self.timer(id, hedge_at.unwrap_or(deadline));
        Ok(flags)
    }

    /// Read `keys` of `table` (as `get`), one group per partition, each from the freshest replica within the bound;
    /// `fut` resolves to their Lookups in the keys' order, or None for the Python path (any group unanswered). Flags
    /// as `get`'s; 0 when some partition has no replica this path reaches (nothing is sent then).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (table, physical, keys, max_lag, max_staleness_ms, position, fut, now))]
    fn get_many(&mut self, py: Python<'_>, table: &str, physical: &str, keys: Bound<'_, PyList>,
                max_lag: Option<i64>, max_staleness_ms: Option<i64>, position: Option<(String, HashMap<i64, i64>)>,
                fut: PyObject, now: f64) -> PyResult<u8> {
        let snap = self.snapshot.clone();
        let Some(spec) = snap.tables.get(table).filter(|t| t.served && t.physical == physical) else { return Ok(0) };
        if matches!(&position, Some((t, _)) if t != physical) {
            return Ok(0);
        }
        let n = spec.partitions.len().max(1);
        let mut by_partition: HashMap<usize, (Vec<usize>, Vec<Vec<u8>>)> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let Ok(raw) = key.downcast::<PyString>().map_err(PyErr::from).and_then(|k| k.to_str()).map(str::as_bytes)
            else { return Ok(0) };
            let group = by_partition.entry((murmur2(raw) & 0x7fff_ffff) as usize % n).or_default();
            group.0.push(i);
            group.1.push(raw.to_vec());
        }
        let wall = now_ms();
        let c = &self.config;
        let tol = Tolerances { offsets: c.freshness_tolerance_offsets, ms: c.freshness_tolerance_ms,
                               view_trust_ms: c.view_trust_ms };
        // Every group planned before any leaves: a batch this path cannot read whole is the Python path's.
        let mut plans = Vec::with_capacity(by_partition.len());
        for (partition, (indices, raw)) in by_partition {
            let Some(replicas) = spec.partitions.get(partition) else { return Ok(0) };
            let min_offset = position.as_ref().and_then(|(_, o)| o.get(&(partition as i64)).copied()).unwrap_or(0);
            let bound = ReadLimits { max_lag, max_staleness_ms, min_offset }
                .with_defaults(spec.max_lag, spec.max_staleness_ms);
            let cands = selection::select(replicas, physical, partition, bound, &self.overlay, &self.load, tol, wall,
                                          &mut self.rng);
            let Some(first) = cands.first().copied() else { return Ok(0) };
            let Some(address) = replicas[first.index].read_address.clone().filter(|a| self.conns.contains_key(a))
            else { return Ok(0) };
            let read = GroupRead { id: 0, table: physical.to_owned(), partition: partition as i32, keys: raw,
                                   bound: ReadBound::of(bound) };
            plans.push((partition, indices, first, address, read));
        }
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + c.attempt_timeout_ms as f64 / 1000.0;
        let answers = (0..keys.len()).map(|_| None).collect();
        self.batches.insert(id, Batch { fut, keys: keys.unbind(), snap: snap.clone(), table: table.to_owned(),
                                        groups: Vec::with_capacity(plans.len()), answers, left: plans.len(),
                                        attempts: Vec::new() });
        // Every group queued before any leaves: a node's groups travel in one frame.
        let mut touched: Vec<String> = Vec::new();
        for (group, (partition, indices, cand, address, mut read)) in plans.into_iter().enumerate() {
            self.batches.get_mut(&id).expect("inserted above").groups.push((partition, indices));
            let attempt = self.next_id;
            self.next_id += 1;
            read.id = attempt;
            let node = spec.partitions[partition][cand.index].node.clone();
            self.load.started(&node);
            let b = self.batches.get_mut(&id).expect("inserted above");
            b.attempts.push(Attempt { address: address.clone(), id: attempt, node });
            let conn = self.conns.get_mut(&address).expect("planned only for a node reached");
            conn.waiting.insert(attempt, Waiter { owner: id, group: Some(group), cand, sent: now });
            conn.outbox.groups.push(read);
            if !touched.contains(&address) {
                touched.push(address);
            }
        }
        let mut flags = SERVED;
        for address in touched {
            if self.conns[&address].unanswered == 0 {
                self.write(py, &address)?;
            } else {
                flags |= FLUSH;
            }
        }
        Ok(flags | self.timer(id, deadline))
    }

    /// Write every outbox's reads, one batch per node.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        let addresses: Vec<String> = self.conns.iter().filter(|(_, c)| queued(c)).map(|(a, _)| a.clone()).collect();
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
                let Some(w) = self.conns.get_mut(address).and_then(|c| c.waiting.remove(&result.id)) else { continue };
                flags |= self.settle(py, result.id, w, Some(result), now)?;
            }
            for result in batch.groups {
                let Some(w) = self.conns.get_mut(address).and_then(|c| c.waiting.remove(&result.id)) else { continue };
                self.settle_group(py, result.id, w, Some(result), now)?;
            }
        }
        if let Some(why) = broken {
            self.lost(py, address, Some(why), now)?;
        } else if self.conns.get(address).is_some_and(|c| queued(c) && c.unanswered == 0) {
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
        for (attempt, w) in conn.waiting {
            match w.group {
                None => flags |= self.settle(py, attempt, w, None, now)?,
                Some(_) => self.settle_group(py, attempt, w, None, now)?,
            }
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
            if self.batches.contains_key(&id) {
                self.give_up_batch(py, id)?;  // a batch's only timer is its deadline
                continue;
            }
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
        let p = self.pending.get_mut(&id).expect("sent only for a lookup in flight");
        let node = p.snap.tables[&p.table].partitions[p.partition][cand.index].node.clone();
        p.attempts.push(Attempt { address: address.to_owned(), id: attempt, node: node.clone() });
        let mut read = p.read.clone();
        read.id = attempt;
        let conn = self.conns.get_mut(address).expect("sent only to a node reached");
        conn.waiting.insert(attempt, Waiter { owner: id, group: None, cand, sent: now });
        conn.outbox.reads.push(read);
        self.load.started(&node);
        if conn.unanswered == 0 {
            self.write(py, address)?;
            return Ok(0);
        }
        Ok(FLUSH)
    }

    fn write(&mut self, py: Python<'_>, address: &str) -> PyResult<()> {
        let conn = self.conns.get_mut(address).expect("written only to a node reached");
        if !queued(conn) {
            return Ok(());
        }
        let mut batch = std::mem::take(&mut conn.outbox);
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
    fn settle(&mut self, py: Python<'_>, attempt: u64, w: Waiter, result: Option<KeyResult>, now: f64) -> PyResult<u8> {
        let (id, cand) = (w.owner, w.cand);
        let ms = ((now - w.sent) * 1000.0).max(0.0);
        let Some(p) = self.pending.get_mut(&id) else { return Ok(0) };  // never: its waiters went with it
        p.attempts.retain(|a| a.id != attempt);
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
        self.observe(&replica.node, &spec.physical, partition, rep);
        if result.status != OK && result.status != NOT_FOUND {
            return self.attempt_failed(py, id);
        }
        self.latency.record(ms);
        let p = self.pending.remove(&id).expect("looked up above");
        self.abandon(&p.attempts);  // the hedge's other attempt
        let value = (result.status == OK).then_some(&result.value[..]);
        let labels = self.labels(py, spec, partition, served_by(replica, rep))?;
        let physical = PyString::new(py, &spec.physical).into_any();
        let answer = self.answer(py, &physical, p.key.into_bound(py), value, &labels)?;
        resolve(py, &p.fut, answer)?;
        Ok(0)
    }

    fn attempt_failed(&mut self, py: Python<'_>, id: u64) -> PyResult<u8> {
        let Some(p) = self.pending.get(&id) else { return Ok(0) };
        // The first attempt failing before the hedge, or both failing: the Python path, which tries the others.
        if p.attempts.is_empty() {
            self.give_up(py, id)?;
        }
        Ok(0)
    }

    fn give_up(&mut self, py: Python<'_>, id: u64) -> PyResult<()> {
        if let Some(p) = self.pending.remove(&id) {
            self.abandon(&p.attempts);
            resolve(py, &p.fut, py.None())?;
        }
        Ok(())
    }

    fn give_up_batch(&mut self, py: Python<'_>, id: u64) -> PyResult<()> {
        if let Some(b) = self.batches.remove(&id) {
            self.abandon(&b.attempts);
            resolve(py, &b.fut, py.None())?;
        }
        Ok(())
    }

    /// Attempts whose lookup no longer waits for them: their answers, should they come, are dropped unread, and each
    /// ends its count in its node's load now.
    fn abandon(&mut self, attempts: &[Attempt]) {
        for a in attempts {
            if self.conns.get_mut(&a.address).and_then(|c| c.waiting.remove(&a.id)).is_some() {
                self.load.finished(&a.node, None);
            }
        }
    }

    /// A replica's report of itself, newer than the view's until the next view.
    fn observe(&mut self, node: &str, table: &str, partition: usize, rep: &ReplicaStatus) {
        self.overlay.observe(node, table, partition, Observation {
            applied: rep.applied_offset, end: rep.end_offset, staleness_ms: rep.staleness_ms.max(0),
            observed_ms: now_ms() });
    }

    /// What every key read from one replica of `partition` shares, from the partition on (Lookup's fields after the
    /// value): partition, node, role, lag offsets, lag ms, applied offset, input lag records and ms, value format.
    fn labels<'py>(&self, py: Python<'py>, spec: &crate::snapshot::Table, partition: usize, who: Served<'_>)
                   -> PyResult<Vec<Bound<'py, PyAny>>> {
        let (records, behind_ms) = spec.input_lag_at(now_ms());
        let format = match spec.value_format {
            ValueFormat::Json => "json",
            ValueFormat::Text => "string",
            ValueFormat::Bytes => "bytes",
        };
        Ok(vec![partition.into_pyobject(py)?.into_any(), who.node.into_pyobject(py)?.into_any(),
                who.role.into_pyobject(py)?.into_any(), who.lag_offsets.into_pyobject(py)?.into_any(),
                who.lag_ms.into_pyobject(py)?.into_any(), who.applied.into_pyobject(py)?.into_any(),
                records.into_pyobject(py)?.into_any(), behind_ms.into_pyobject(py)?.into_any(),
                format.into_pyobject(py)?.into_any()])
    }

    /// One key's Lookup: the named tuple allocated by its type and filled, as tuple.__new__ makes it, without the
    /// tuple of fields and the call that one would take (a batch makes one per key). `physical`: the table's name,
    /// one string for all the keys of an answer.
    fn answer<'py>(&self, py: Python<'py>, physical: &Bound<'py, PyAny>, key: Bound<'py, PyAny>,
                   value: Option<&[u8]>, labels: &[Bound<'py, PyAny>]) -> PyResult<PyObject> {
        let found = value.is_some().into_pyobject(py)?.to_owned().into_any();
        let raw = match value {
            Some(v) => PyBytes::new(py, v).into_any(),
            None => py.None().into_bound(py),
        };
        let head = [physical.clone(), key, found, raw];
        let len = head.len() + labels.len();
        // SAFETY: the type's own allocator gives a tuple of `len` empty items with one reference, ours; each item is
        // set once, its reference given to the tuple (PyTuple_SetItem steals it).
        unsafe {
            let obj = (self.lookup_alloc)(self.lookup_cls.as_ptr().cast(), len as ffi::Py_ssize_t);
            if obj.is_null() {
                return Err(PyErr::fetch(py));
            }
            let obj = PyObject::from_owned_ptr(py, obj);
            for (i, item) in head.into_iter().chain(labels.iter().cloned()).enumerate() {
                if ffi::PyTuple_SetItem(obj.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr()) != 0 {
                    return Err(PyErr::fetch(py));
                }
            }
            Ok(obj)
        }
    }

    /// A batch's group ended: with the node's answer, or without (its connection failed).
    fn settle_group(&mut self, py: Python<'_>, attempt: u64, w: Waiter, result: Option<GroupResult>, now: f64)
                    -> PyResult<()> {
        let ms = ((now - w.sent) * 1000.0).max(0.0);
        let Some(b) = self.batches.get_mut(&w.owner) else { return Ok(()) };  // never: its waiters went with it
        b.attempts.retain(|a| a.id != attempt);
        let snap = b.snap.clone();
        let spec = &snap.tables[&b.table];
        let (partition, _) = b.groups[w.group.expect("a group's waiter")];
        let replica = &spec.partitions[partition][w.cand.index];
        let Some(result) = result else {
            self.load.finished(&replica.node, None);
            self.load.failed(&replica.node, now_ms());
            return self.give_up_batch(py, w.owner);
        };
        self.load.finished(&replica.node, Some(ms));
        let Some(rep) = result.replica.as_ref() else { return self.give_up_batch(py, w.owner) };
        self.observe(&replica.node, &spec.physical, partition, rep);
        let b = self.batches.get(&w.owner).expect("looked up above");
        let (_, indices) = &b.groups[w.group.expect("a group's waiter")];
        if result.status != OK || result.values.len() != indices.len() {
            return self.give_up_batch(py, w.owner);
        }
        let labels = self.labels(py, spec, partition, served_by(replica, rep))?;
        let keys = b.keys.bind(py).clone();
        let physical = PyString::new(py, &spec.physical).into_any();
        let mut made = Vec::with_capacity(indices.len());
        for (&i, value) in indices.iter().zip(&result.values) {
            // A group answers an absent key with empty bytes (a stored value is never empty).
            let value = (!value.is_empty()).then_some(&value[..]);
            made.push((i, self.answer(py, &physical, keys.get_item(i)?, value, &labels)?));
        }
        let b = self.batches.get_mut(&w.owner).expect("looked up above");
        for (i, answer) in made {
            b.answers[i] = Some(answer);
        }
        b.left -= 1;
        if b.left == 0 {
            let b = self.batches.remove(&w.owner).expect("looked up above");
            let answers: Vec<PyObject> = b.answers.into_iter().map(|a| a.expect("every group answered")).collect();
            resolve(py, &b.fut, PyList::new(py, answers)?.into_any().unbind())?;
        }
        Ok(())
    }
}

/// Whether reads wait in the connection's outbox.
fn queued(conn: &Conn) -> bool {
    !conn.outbox.reads.is_empty() || !conn.outbox.groups.is_empty()
}

/// The future's result, unless its caller gave up on it (cancelled).
fn resolve(py: Python<'_>, fut: &PyObject, value: PyObject) -> PyResult<()> {
    let fut = fut.bind(py);
    if !fut.call_method0("done")?.is_truthy()? {
        fut.call_method1("set_result", (value,))?;
    }
    Ok(())
}
