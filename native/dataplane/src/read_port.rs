//! A store node's read port on a thread of its own (store_node/read_port_front.py wires it): the port's connections
//! accepted, their bytes split into frames, and the complete frames of each read of a socket answered under one hold
//! of the GIL, in order — a batch of plain key reads by compiled code (key_reads.rs), any other by the node's Python
//! reader (store_node.read_port.Answers), which also admits each connection by its first batch. A lone key read then
//! runs no Python bytecode but the replica's own figures and store read, and no turn of the node's event loop.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::{Buf, BytesMut};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use crate::key_reads::KeyReads;
use crate::messages::MAX_FRAME;

const HEADER: usize = 4;

struct Shared {
    /// `answer(peer, payloads, admitted) -> (frames, open)` and `refuse(peer, why)` (store_node.read_port.Answers).
    answers: Py<PyAny>,
    keys: Py<KeyReads>,
    tls: Mutex<Option<tokio_rustls::TlsAcceptor>>,
    stopping: AtomicBool,
    stop: Notify,
}

/// The compiled front of one store node's read port.
#[pyclass(frozen)]
pub struct ReadPortFront {
    shared: Arc<Shared>,
    listen_fd: RawFd,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl ReadPortFront {
    /// `listen_fd`: the read port's listening socket (the caller keeps it open until stop() returns); `answers`: what
    /// answers a connection's frames (store_node.read_port.Answers); `keys`: the node's plain key reads.
    #[new]
    fn new(listen_fd: RawFd, answers: Py<PyAny>, keys: Py<KeyReads>) -> ReadPortFront {
        let shared = Shared { answers, keys, tls: Mutex::new(None), stopping: AtomicBool::new(false),
                              stop: Notify::new() };
        ReadPortFront { shared: Arc::new(shared), listen_fd, thread: Mutex::new(None) }
    }

    /// Speak only TLS from now on, with this certificate chain and key (PEM), requiring client certificates signed by
    /// `client_ca_pem` when given: at the start, and after the files are reloaded; connections open keep theirs.
    #[pyo3(signature = (cert_pem, key_pem, client_ca_pem=None))]
    fn tls(&self, cert_pem: &[u8], key_pem: &[u8], client_ca_pem: Option<&[u8]>) -> PyResult<()> {
        let acceptor = crate::tls::port_acceptor(cert_pem, key_pem, client_ca_pem).map_err(PyValueError::new_err)?;
        *self.shared.tls.lock().expect("never poisoned") = Some(acceptor);
        Ok(())
    }

    /// Start accepting on the port's thread.
    fn start(&self) -> PyResult<()> {
        let listener = crate::listener(self.listen_fd)?;
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name("read-port".into())
            .spawn(move || run(shared, listener))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        *self.thread.lock().expect("never poisoned") = Some(handle);
        Ok(())
    }

    /// Stop accepting and drop every connection: a read in flight is answered by no one, as when the node ends.
    fn stop(&self, py: Python<'_>) {
        self.shared.stopping.store(true, Relaxed);
        self.shared.stop.notify_waiters();
        let handle = self.thread.lock().expect("never poisoned").take();
        // Without the GIL: the port's thread may be waiting for it to answer a read.
        py.allow_threads(|| {
            if let Some(h) = handle {
                let _ = h.join();
            }
        });
    }
}

fn run(shared: Arc<Shared>, listener: std::net::TcpListener) {
    // This thread keeps its Python thread state for good: each answer then takes the GIL without making one anew.
    Python::with_gil(|py| py.allow_threads(|| serve_port(shared, listener)));
}

fn serve_port(shared: Arc<Shared>, listener: std::net::TcpListener) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
        loop {
            // Registered before the flag is read: a stop between the two still wakes this loop.
            let stop = shared.stop.notified();
            tokio::pin!(stop);
            stop.as_mut().enable();
            if shared.stopping.load(Relaxed) {
                break;
            }
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, peer)) = accepted else { crate::pause_after_refused_accept().await; continue };
                    let _ = stream.set_nodelay(true);
                    let tls = shared.tls.lock().expect("never poisoned").clone();
                    let shared = shared.clone();
                    tokio::task::spawn_local(async move {
                        let peer = peer.to_string();
                        match tls {
                            None => connection(&shared, stream, &peer).await,
                            Some(tls) => {
                                let handshake = tokio::time::timeout(crate::tls::HANDSHAKE, tls.accept(stream));
                                if let Ok(Ok(stream)) = handshake.await {
                                    connection(&shared, stream, &peer).await;
                                }
                            }
                        }
                    });
                }
                _ = &mut stop => {}
            }
        }
        // Returning drops the runtime, and with it every connection's task.
    });
}

/// Where the complete frames at the front of `buf` end, or why the bytes are not frames.
pub fn complete_frames(buf: &[u8]) -> Result<Vec<(usize, usize)>, String> {
    let mut frames = Vec::new();
    let mut at = 0;
    while buf.len() - at >= HEADER {
        let size = u32::from_be_bytes(buf[at..at + HEADER].try_into().expect("four bytes")) as usize;
        if size > MAX_FRAME {
            return Err(format!("frame of {size} bytes announced; the limit is {MAX_FRAME}"));
        }
        if buf.len() - at - HEADER < size {
            break;
        }
        frames.push((at + HEADER, at + HEADER + size));
        at += HEADER + size;
    }
    Ok(frames)
}

/// One peer's connection: frames in, each read's frames answered at once, until it closes, is refused or stops
/// speaking frames.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(shared: &Shared, mut stream: S, peer: &str) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut admitted = false;
    loop {
        if buf.capacity() - buf.len() < 16 << 10 {
            buf.reserve(64 << 10); // else a full buffer grows 64 bytes a read
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let frames = match complete_frames(&buf) {
            Ok(frames) if frames.is_empty() => continue,
            Ok(frames) => frames,
            Err(why) => {
                Python::with_gil(|py| {
                    if let Err(e) = shared.answers.call_method1(py, "refuse", (peer, why)) {
                        e.print(py);
                    }
                });
                return;
            }
        };
        let answered = Python::with_gil(|py| answer(py, shared, peer, &buf, &frames, admitted));
        let (out, open) = match answered {
            Ok(answered) => answered,
            Err(e) => {
                // A defect of the reader, not of the peer's bytes: said on stderr, the connection dropped.
                Python::with_gil(|py| e.print(py));
                return;
            }
        };
        buf.advance(frames.last().expect("not empty").1);
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            return;
        }
        if !open {
            let _ = stream.shutdown().await;
            return;
        }
        admitted = true;
    }
}

/// The frames answering `frames` of `buf`, and whether the connection stays open (`admitted`: by an earlier batch).
fn answer(py: Python<'_>, shared: &Shared, peer: &str, buf: &[u8], frames: &[(usize, usize)], mut admitted: bool)
          -> PyResult<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    let keys = shared.keys.get();
    for &(a, b) in frames {
        if admitted {
            if let Some(answer) = keys.answer_batch(py, &buf[a..b]) {
                out.extend_from_slice(&(answer.len() as u32).to_be_bytes());
                out.extend_from_slice(&answer);
                continue;
            }
        }
        let payloads = PyList::new(py, [PyBytes::new(py, &buf[a..b])])?;
        let got = shared.answers.call_method1(py, "answer", (peer, payloads, admitted))?;
        let (answered, open): (Bound<'_, PyBytes>, bool) = got.extract(py)?;
        out.extend_from_slice(answered.as_bytes());
        if !open {
            return Ok((out, false));
        }
        admitted = true;
    }
    Ok((out, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        payloads.iter().flat_map(|p| (p.len() as u32).to_be_bytes().into_iter().chain(p.iter().copied())).collect()
    }

    #[test]
    fn whole_frames_are_split_and_a_partial_one_waits() {
        let mut bytes = framed(&[b"ab", b"", b"cde"]);
        bytes.extend_from_slice(&[0, 0, 0, 9, 1, 2]);
        let frames = complete_frames(&bytes).expect("frames");
        let got: Vec<&[u8]> = frames.iter().map(|&(a, b)| &bytes[a..b]).collect();
        assert_eq!(got, vec![&b"ab"[..], b"", b"cde"]);
        assert_eq!(frames.last().unwrap().1, bytes.len() - 6);
        assert_eq!(complete_frames(&[0, 0]).expect("frames"), vec![]);
    }

    #[test]
    fn a_length_beyond_the_limit_is_not_a_frame() {
        let why = complete_frames(b"GET / HTTP/1.1\r\n").err().expect("refused");
        assert!(why.contains("the limit is 67108864"), "{why}");
    }
}
