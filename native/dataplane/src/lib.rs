//! freshroute's compiled lookup path. In the router process (`Front`), threads of their own serve the REST port's key
//! lookups and the gRPC port's `Router.Get` — HTTP/1.1 or HTTP/2, the key's partition, the freshest replica within
//! the bound, the read over the read port, the answer with its labels — while the Python control plane pushes the
//! routing view (`Front.update`) and serves everything else (router/data_plane.py wires it). In a client process
//! (`DirectReads`, direct.rs), the same routing decides `AsyncClient`'s key reads, whose bytes its event loop
//! carries (freshroute/client/compiled.py). In a store node (`ReadPortFront`, read_port.rs), a thread of its own
//! serves the read port, answering plain key reads itself (`KeyReads`, key_reads.rs).

mod answer;
mod counts;
mod direct;
mod grpc;
mod grpc_answer;
mod grpc_relay;
mod guard;
mod http1;
mod key_reads;
mod lookup;
mod messages;
mod peer_frames;
mod read_port;
mod read_after;
mod relay;
mod selection;
mod snapshot;
mod store;
mod tls;
mod windows;

use std::os::fd::{BorrowedFd, RawFd};
use std::rc::Rc;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Deserialize;
use tokio::sync::Notify;

use counts::{Counts, LATENCY_BUCKETS};
use guard::{Lease, Principals};
use snapshot::Snapshot;

/// The routing policy's settings this path follows (freshroute.routing.policy.RoutingPolicy), and the front's own.
#[derive(Deserialize, Clone, Debug)]
pub struct Config {
    pub attempt_timeout_ms: u64,
    /// A read's deadline, unless it names one (`wait_ms`): a read after a write token waits until then.
    #[serde(default = "request_timeout_ms")]
    pub request_timeout_ms: u64,
    pub hedge: bool,
    pub hedge_quantile: f64,
    pub hedge_min_ms: f64,
    pub hedge_budget: f64,
    /// The most windows one windows read may span (RoutingPolicy.max_windows).
    pub max_windows: i64,
    pub freshness_tolerance_offsets: i64,
    pub freshness_tolerance_ms: i64,
    pub view_trust_ms: i64,
    pub failure_backoff_ms: i64,
    pub node_expiry_ms: i64,
    pub cluster_secret: String,
    /// The router's front alone: how long it keeps an idle connection, and whether it authenticates (router.auth),
    /// judging every lookup against the principals pushed. A client's direct reads have neither.
    #[serde(default)]
    pub keep_alive_s: f64,
    #[serde(default)]
    pub authenticates: bool,
}

fn request_timeout_ms() -> u64 {
    2000
}

/// What every thread of the front shares: the routing view, the counts, and the stop signal.
pub struct Shared {
    pub config: Config,
    snapshot: Mutex<Arc<Snapshot>>,
    principals: Mutex<Arc<Principals>>,
    /// The REST and gRPC ports' TLS, when the router speaks it.
    tls: Mutex<Option<Acceptors>>,
    /// TLS to store nodes, when the router reaches them so (cluster_ca).
    cluster_tls: Mutex<Option<tokio_rustls::TlsConnector>>,
    leases: Mutex<HashMap<String, Arc<Lease>>>,
    pub counts: Counts,
    stopping: AtomicBool,
    forced: AtomicBool,  // past the grace: connections still open are dropped
    pub stop: Notify,
    open: AtomicU64,
}

impl Shared {
    /// A front's shared state before its first routing view and principals.
    fn new(config: Config) -> Shared {
        Shared {
            config,
            snapshot: Mutex::new(Arc::new(Snapshot::default())),
            principals: Mutex::new(Arc::new(Principals::default())),
            tls: Mutex::new(None),
            cluster_tls: Mutex::new(None),
            leases: Mutex::new(HashMap::new()),
            counts: Counts::default(),
            stopping: AtomicBool::new(false),
            forced: AtomicBool::new(false),
            stop: Notify::new(),
            open: AtomicU64::new(0),
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.lock().expect("never poisoned: nothing panics holding it").clone()
    }

    pub fn principals(&self) -> Arc<Principals> {
        self.principals.lock().expect("never poisoned").clone()
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    pub fn forced(&self) -> bool {
        self.forced.load(Relaxed)
    }
}

#[derive(Clone)]
struct Acceptors {
    rest: tokio_rustls::TlsAcceptor,
    grpc: tokio_rustls::TlsAcceptor,
}

/// The compiled front of one router process: its REST port, and its gRPC port when it serves that too.
#[pyclass(frozen)]
struct Front {
    shared: Arc<Shared>,
    listen_fd: RawFd,
    python_port: u16,
    grpc: Option<(RawFd, u16)>,
    inbox: Option<RawFd>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[pymethods]
impl Front {
    /// `listen_fd`: the REST port's listening socket (the caller keeps it open); `python_port`: the loopback port of
    /// the router's Python front; `config`: the routing policy's settings as JSON; `grpc`: the gRPC port's listening
    /// socket and the loopback port of the router's Python gRPC front, when the path serves gRPC too; `inbox`: the
    /// datagram socket the Python front adopts handed-over connections' sockets from (router/handover.py), kept open
    /// by the caller (without one, they are spliced through to `python_port`).
    #[new]
    #[pyo3(signature = (listen_fd, python_port, config, grpc=None, inbox=None))]
    fn new(listen_fd: RawFd, python_port: u16, config: &str, grpc: Option<(RawFd, u16)>, inbox: Option<RawFd>)
           -> PyResult<Front> {
        let config: Config = serde_json::from_str(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Front {
            shared: Arc::new(Shared::new(config)),
            listen_fd,
            python_port,
            grpc,
            inbox,
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Swap in a new routing view (router.data_plane.snapshot_doc's JSON).
    fn update(&self, doc: &[u8]) -> PyResult<()> {
        let snap = Snapshot::parse(doc).map_err(PyValueError::new_err)?;
        *self.shared.snapshot.lock().expect("never poisoned") = Arc::new(snap);
        Ok(())
    }

    /// Swap in the principals in force (router.data_plane.principals_doc's JSON): at the start, after the auth file
    /// is reloaded, and when the tables change.
    fn principals(&self, doc: &[u8]) -> PyResult<()> {
        let mut leases = self.shared.leases.lock().expect("never poisoned");
        let mut principals = self.shared.principals.lock().expect("never poisoned");
        let fresh = Principals::parse(doc, principals.generation() + 1, &mut leases).map_err(PyValueError::new_err)?;
        *principals = Arc::new(fresh);
        Ok(())
    }

    /// Speak TLS on the ports from now on with this certificate chain and key (PEM): at the start, and after the
    /// files are reloaded; handshakes already done keep theirs. Files rustls cannot use are a ValueError.
    fn tls(&self, cert_pem: &[u8], key_pem: &[u8]) -> PyResult<()> {
        let rest = tls::acceptor(cert_pem, key_pem, b"http/1.1").map_err(PyValueError::new_err)?;
        let grpc = tls::acceptor(cert_pem, key_pem, b"h2").map_err(PyValueError::new_err)?;
        *self.shared.tls.lock().expect("never poisoned") = Some(Acceptors { rest, grpc });
        Ok(())
    }

    /// Reach store nodes over TLS, trusting the CA certificates of `ca_pem` and presenting `cert_pem` with `key_pem`
    /// to nodes that require a client certificate: called before start(). Files rustls cannot use are a ValueError.
    #[pyo3(signature = (ca_pem, cert_pem=None, key_pem=None))]
    fn cluster_tls(&self, ca_pem: &[u8], cert_pem: Option<&[u8]>, key_pem: Option<&[u8]>) -> PyResult<()> {
        let connector = tls::connector(ca_pem, cert_pem.zip(key_pem)).map_err(PyValueError::new_err)?;
        *self.shared.cluster_tls.lock().expect("never poisoned") = Some(connector);
        Ok(())
    }

    /// Each rated principal's tokens leased and not spent yet, and the lookups of it asked since the last call:
    /// what the control plane sizes the next lease by.
    fn rates(&self) -> HashMap<String, (i64, u64)> {
        let leases = self.shared.leases.lock().expect("never poisoned");
        leases.iter().map(|(name, l)| (name.clone(), (l.tokens.load(Relaxed), l.asked.swap(0, Relaxed)))).collect()
    }

    /// Add `tokens` leased from principal `name`'s shared bucket (false if it has no rate here any more).
    fn grant(&self, name: &str, tokens: i64) -> bool {
        let leases = self.shared.leases.lock().expect("never poisoned");
        leases.get(name).map(|l| l.tokens.fetch_add(tokens, Relaxed)).is_some()
    }

    /// Start serving on `threads` threads, each accepting on the listening sockets.
    fn start(&self, threads: usize) -> PyResult<()> {
        let mut handles = self.threads.lock().expect("never poisoned");
        for i in 0..threads.max(1) {
            let rest = listener(self.listen_fd)?;
            let grpc = self.grpc.map(|(fd, _)| listener(fd)).transpose()?;
            let (shared, ports) = (self.shared.clone(), (self.python_port, self.grpc.map_or(0, |(_, port)| port)));
            let python = relay::Python::new(self.python_port, self.inbox);
            let handle = std::thread::Builder::new()
                .name(format!("front-{i}"))
                .spawn(move || run(shared, rest, grpc, python, ports.1, i as u64))
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            handles.push(handle);
        }
        Ok(())
    }

    /// Stop accepting; connections close once idle, and those still open after `grace_s` are dropped.
    fn stop(&self, py: Python<'_>, grace_s: f64) {
        self.shared.stopping.store(true, Relaxed);
        self.shared.stop.notify_waiters();
        let handles: Vec<JoinHandle<()>> = self.threads.lock().expect("never poisoned").drain(..).collect();
        let grace = Duration::from_secs_f64(grace_s.max(0.0));
        py.allow_threads(|| {
            let until = std::time::Instant::now() + grace;
            while self.shared.open.load(Relaxed) > 0 && std::time::Instant::now() < until {
                self.shared.stop.notify_waiters();
                std::thread::sleep(Duration::from_millis(20));
            }
            self.shared.forced.store(true, Relaxed);
            self.shared.stop.notify_waiters();
            for h in handles {
                let _ = h.join();
            }
        });
    }

    /// What the path has counted so far (router.data_plane adds it to the router's metrics).
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.shared.counts;
        let d = PyDict::new(py);
        let lookups = PyDict::new(py);
        for (i, outcome) in ["ok", "not_found"].iter().enumerate() {
            for (j, role) in ["active", "standby"].iter().enumerate() {
                lookups.set_item((*outcome, *role), c.lookups[i][j].load(Relaxed))?;
            }
        }
        d.set_item("lookups", lookups)?;
        let buckets: Vec<u64> = c.buckets.iter().map(|b| b.load(Relaxed)).collect();
        d.set_item("buckets", buckets)?;
        d.set_item("bucket_bounds", LATENCY_BUCKETS.to_vec())?;
        d.set_item("sum_s", c.sum_us.load(Relaxed) as f64 / 1e6)?;
        d.set_item("hedges", c.hedges.load(Relaxed))?;
        d.set_item("after_retries", c.after_retries.load(Relaxed))?;
        d.set_item("relayed", c.relayed.load(Relaxed))?;
        d.set_item("handed_over", c.handed_over.load(Relaxed))?;
        d.set_item("adopted", c.adopted.load(Relaxed))?;
        d.set_item("connections", c.connections.load(Relaxed))?;
        d.set_item("grpc_relayed", c.grpc_relayed.load(Relaxed))?;
        d.set_item("grpc_connections", c.grpc_connections.load(Relaxed))?;
        Ok(d)
    }
}

/// A thread's own handle on a listening socket the caller keeps open.
fn listener(fd: RawFd) -> PyResult<std::net::TcpListener> {
    // SAFETY: the caller keeps the listening socket open until stop() returns.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(listener)
}

/// The next connection on `listener`, or never without one.
async fn next(listener: &Option<tokio::net::TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// One thread of the front: its lookups' routing, shared by its REST and gRPC connections.
fn run(shared: Arc<Shared>, rest: std::net::TcpListener, grpc: Option<std::net::TcpListener>, python: relay::Python,
       python_grpc_port: u16, seed: u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let Ok(rest) = tokio::net::TcpListener::from_std(rest) else { return };
        let Ok(grpc) = grpc.map(tokio::net::TcpListener::from_std).transpose() else { return };
        let routing = Rc::new(lookup::Routing::new(shared.clone(), seed));
        let rest_conns = Rc::new(http1::Conns::new(routing.clone(), python));
        let grpc_conns = Rc::new(grpc::Conns::new(routing, python_grpc_port));
        loop {
            tokio::select! {
                accepted = rest.accept() => {
                    let Ok((stream, _)) = accepted else { pause_after_refused_accept().await; continue };
                    shared.counts.connections.fetch_add(1, Relaxed);
                    let tls = shared.tls.lock().expect("never poisoned").clone().map(|t| t.rest);
                    let conns = rest_conns.clone();
                    spawn_connection(&shared, stream, tls, move |s, plain| http1::serve(conns, s, plain));
                }
                accepted = next(&grpc) => {
                    let Ok(stream) = accepted else { pause_after_refused_accept().await; continue };
                    shared.counts.grpc_connections.fetch_add(1, Relaxed);
                    let tls = shared.tls.lock().expect("never poisoned").clone().map(|t| t.grpc);
                    let conns = grpc_conns.clone();
                    spawn_connection(&shared, stream, tls, move |s, _| grpc::serve(conns, s));
                }
                _ = shared.stop.notified() => {}
            }
            if shared.stopping() {
                break;
            }
        }
        drop((rest, grpc));
        // Connections finish the requests they have; stop() waits for them within its grace.
        while shared.open.load(Relaxed) > 0 && !shared.forced.load(Relaxed) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = shared.stop.notified() => {}
            }
        }
    });
}

/// After an accept the kernel refused (out of file descriptors, say): a pause rather than a loop spinning on it.
async fn pause_after_refused_accept() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A connection served by `serve` on this thread, over TLS when the port speaks it (else with its socket), counted
/// open until it ends.
fn spawn_connection<F, R>(shared: &Arc<Shared>, stream: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>,
                          serve: F)
where
    F: FnOnce(Box<dyn Connection>, Option<RawFd>) -> R + 'static,
    R: std::future::Future<Output = ()> + 'static,
{
    let _ = stream.set_nodelay(true);
    shared.open.fetch_add(1, Relaxed);
    let shared = shared.clone();
    tokio::task::spawn_local(async move {
        match tls {
            None => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                serve(Box::new(stream), Some(fd)).await
            }
            Some(tls) => {
                if let Ok(Ok(stream)) = tokio::time::timeout(tls::HANDSHAKE, tls.accept(stream)).await {
                    serve(Box::new(stream), None).await;
                }
            }
        }
        shared.open.fetch_sub(1, Relaxed);
    });
}

/// A client's connection, plain or TLS.
pub trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Connection for T {}

/// The nodes of a partition's replicas in the order this path would ask them, for a bound of lag and staleness at
/// `now_ms`, with no load and no answers seen: what tests/unit/test_data_plane.py holds to FreshestFirst's order.
#[pyfunction]
#[pyo3(signature = (doc, config, table, partition, max_lag, max_staleness_ms, min_offset, now_ms))]
#[allow(clippy::too_many_arguments)]
fn order(doc: &[u8], config: &str, table: &str, partition: usize, max_lag: Option<i64>, max_staleness_ms: Option<i64>,
         min_offset: i64, now_ms: i64) -> PyResult<Vec<String>> {
    use rand::SeedableRng;
    let snap = Snapshot::parse(doc).map_err(PyValueError::new_err)?;
    let c: Config = serde_json::from_str(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let replicas = snap.tables.get(table).and_then(|t| t.partitions.get(partition)).cloned().unwrap_or_default();
    let tol = selection::Tolerances { offsets: c.freshness_tolerance_offsets, ms: c.freshness_tolerance_ms,
                                      view_trust_ms: c.view_trust_ms };
    let cands = selection::select(&replicas, table, partition, selection::Bound { max_lag, max_staleness_ms, min_offset },
                                  &selection::Overlay::default(), &selection::Load::new(c.failure_backoff_ms), tol,
                                  now_ms, &mut rand::rngs::SmallRng::seed_from_u64(0));
    Ok(cands.into_iter().map(|c| replicas[c.index].node.clone()).collect())
}

/// What keeps rustls from serving this certificate chain and key (PEM), or None: the path is not used then.
#[pyfunction]
fn tls_problem(cert_pem: &[u8], key_pem: &[u8]) -> Option<String> {
    tls::acceptor(cert_pem, key_pem, b"http/1.1").err()
}

/// What keeps rustls from reaching store nodes with these files (cluster_ca, and cluster_cert with cluster_key), or
/// None: the path is not used then.
#[pyfunction]
#[pyo3(signature = (ca_pem, cert_pem=None, key_pem=None))]
fn cluster_tls_problem(ca_pem: &[u8], cert_pem: Option<&[u8]>, key_pem: Option<&[u8]>) -> Option<String> {
    tls::connector(ca_pem, cert_pem.zip(key_pem)).err()
}

#[pymodule]
fn freshroute_dataplane(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    m.add_class::<direct::DirectReads>()?;
    m.add_class::<read_port::ReadPortFront>()?;
    m.add_class::<key_reads::KeyReads>()?;
    m.add_function(wrap_pyfunction!(tls_problem, m)?)?;
    m.add_function(wrap_pyfunction!(cluster_tls_problem, m)?)?;
    m.add_function(wrap_pyfunction!(order, m)?)?;
    Ok(())
}
