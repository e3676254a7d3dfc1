//! A store node's key reads answered in compiled code, the read port's common case (read_port.rs): a batch of
//! key reads — of the latest values, or of a versioned table's as of a time — each within its bound on a replica
//! that is readable, answered as the node's Python reader (store_node.read_port) answers it, byte for byte: each
//! replica's figures from its own `LagTracker`, its row from its own store, under the GIL held once for the batch.
//! A batch with anything else — a write token's events, groups, ranges, a replica not hosted, failed, rebuilt or
//! loading in bulk, a bound it is outside of, a commit running while a read did — is left to the Python reader
//! whole (None): its refusals, their messages and the retries of a read a commit overlapped have one implementation.

use prost::Message;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::messages::{KeyRead, KeyResult, ReadBatch, ReplicaStatus, ResultBatch, NOT_FOUND, OK, RESTORING,
                      ROLE_ACTIVE, ROLE_STANDBY, SERVING_ACTIVE, SERVING_STANDBY};
use crate::selection;

/// The node's replicas as its key reads see them.
#[pyclass(frozen)]
pub struct KeyReads {
    /// store_node.read_port.HostedReplicas: `node_id`, and `serving` at each moment.
    node: Py<PyAny>,
    node_id: String,
    /// A callable giving the time in ms (freshroute.lag.now_ms, or a test's clock), called once a batch.
    clock: Py<PyAny>,
    /// freshroute.metadata.roles.Role.ACTIVE, which a replica's role is (by identity) or is not.
    active: Py<PyAny>,
}

#[pymethods]
impl KeyReads {
    #[new]
    fn new(py: Python<'_>, node: Py<PyAny>, clock: Py<PyAny>) -> PyResult<KeyReads> {
        let node_id = node.bind(py).getattr("node_id")?.extract()?;
        let active = py.import("freshroute.metadata.roles")?.getattr("Role")?.getattr("ACTIVE")?.unbind();
        Ok(KeyReads { node, node_id, clock, active })
    }

    /// The ResultBatch answering `payload` (a ReadBatch), or None when the Python reader is to answer it.
    fn answer<'py>(&self, py: Python<'py>, payload: &[u8]) -> Option<Bound<'py, PyBytes>> {
        self.answer_batch(py, payload).map(|out| PyBytes::new(py, &out))
    }
}

impl KeyReads {
    pub fn answer_batch(&self, py: Python<'_>, payload: &[u8]) -> Option<Vec<u8>> {
        let batch = ReadBatch::decode(payload).ok()?;
        if batch.reads.is_empty() || !batch.groups.is_empty() || !batch.ranges.is_empty() {
            return None;
        }
        let now: i64 = self.clock.call0(py).ok()?.extract(py).ok()?;
        let serving = self.node.bind(py).getattr(intern!(py, "serving")).ok()?;
        let mut out = ResultBatch::default();
        for read in &batch.reads {
            out.results.push(self.key(py, &serving, read, now).ok()??);
        }
        Some(out.encode_to_vec())
    }

    /// One read's answer as store_node.read_port._Reader.answer gives it, taking the replica's figures in the same
    /// order (its write count, its store, its lag, then the row, then the write count again); None if not plain.
    fn key(&self, py: Python<'_>, serving: &Bound<'_, PyAny>, read: &KeyRead, now: i64)
           -> PyResult<Option<KeyResult>> {
        let bound = match &read.bound {
            Some(b) if !b.after_input.is_empty() => return Ok(None),
            Some(b) => {
                selection::Bound { max_lag: b.max_lag, max_staleness_ms: b.max_staleness_ms, min_offset: b.min_offset }
            }
            None => selection::Bound::default(),
        };
        let rep = serving.call_method1(intern!(py, "get"), ((read.table.as_str(), read.partition),))?;
        if rep.is_none() {
            return Ok(None);
        }
        let writes: i64 = rep.getattr(intern!(py, "writes"))?.extract()?;
        let store = rep.getattr(intern!(py, "store"))?;
        let figures = rep.getattr(intern!(py, "lag"))?.call_method1(intern!(py, "figures"), (now,))?;
        let (applied, end, staleness_ms): (i64, Option<i64>, i64) = figures.extract()?;
        if writes & 1 == 1 || !rep.getattr(intern!(py, "failure"))?.is_none() || store.is_none()
            || store.getattr(intern!(py, "bulk_load"))?.is_truthy()?
            || bound.refuses(applied, end, staleness_ms) {
            return Ok(None);
        }
        let active = rep.getattr(intern!(py, "role"))?.is(&self.active);
        // Replica.state of a replica that has not failed.
        let state = if rep.getattr(intern!(py, "restoring"))?.is_truthy()? {
            RESTORING
        } else if active {
            SERVING_ACTIVE
        } else {
            SERVING_STANDBY
        };
        let key = PyBytes::new(py, &read.key);
        // A versioned table's version valid then (store_node.read_port._key_as_of), or the latest value.
        let row = match read.as_of_ms {
            None => store.call_method1(intern!(py, "get"), (key,)),
            Some(at) => {
                store.getattr(intern!(py, "history")).and_then(|h| h.call_method1(intern!(py, "at"), (key, at)))
            }
        };
        let Ok(row) = row else {
            return Ok(None); // StoreCorrupt: the Python reader fails the replica, or says it moved
        };
        if rep.getattr(intern!(py, "writes"))?.extract::<i64>()? != writes {
            return Ok(None);
        }
        let end = end.map(|e| e.max(applied)); // freshroute.wire.replica_status_message
        let replica = ReplicaStatus {
            node: self.node_id.clone(),
            role: if active { ROLE_ACTIVE } else { ROLE_STANDBY },
            state,
            applied_offset: applied,
            end_offset: end,
            lag_offsets: end.map(|e| e - applied),
            staleness_ms,
            failure: String::new(),
        };
        let (mut valid_from_ms, mut valid_to_ms) = (None, None);
        let value = match read.as_of_ms {
            Some(_) if !row.is_none() => {
                let (from, to, value): (i64, Option<i64>, Bound<'_, PyAny>) = row.extract()?;
                (valid_from_ms, valid_to_ms) = (Some(from), to);
                value // None: a delete's version
            }
            _ => row, // None: no such key, or no version then
        };
        let (status, value) = if value.is_none() {
            (NOT_FOUND, bytes::Bytes::new())
        } else {
            (OK, bytes::Bytes::copy_from_slice(value.downcast::<PyBytes>()?.as_bytes()))
        };
        let result = KeyResult { id: read.id, status, value, replica: Some(replica), valid_from_ms, valid_to_ms,
                                 ..Default::default() };
        Ok(Some(result))
    }
}
