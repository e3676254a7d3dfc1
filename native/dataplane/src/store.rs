//! Reads over store nodes' read ports (freshroute.wire): one connection per node and thread — over TLS when the
//! router reaches the nodes so (cluster_ca) — results matched back by id. Reads asked for in one turn of the runtime
//! leave together as one ReadBatch frame: under load a frame carries many lookups, while a lone read waits for
//! nothing. A broken connection fails every read in flight on it, and the next read opens a new one.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use prost::Message;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio_rustls::TlsConnector;

use crate::messages::{Read, ReadBatch, Reply, ResultBatch, MAX_FRAME};


pub type Answer = Result<Reply, String>;

struct Conn {
    address: String,
    outbox: RefCell<Vec<Read>>,
    waiting: RefCell<HashMap<u64, oneshot::Sender<Answer>>>,
    wake: Notify,
    dead: Cell<bool>,
}

pub struct Stores {
    conns: RefCell<HashMap<String, Rc<Conn>>>,
    secret: String,
    connect_timeout: Duration,
    tls: Option<TlsConnector>,
    next_id: Cell<u64>,
}

impl Stores {
    pub fn new(secret: String, connect_timeout: Duration, tls: Option<TlsConnector>) -> Rc<Stores> {
        Rc::new(Stores { conns: RefCell::new(HashMap::new()), secret, connect_timeout, tls, next_id: Cell::new(1) })
    }

    /// Send `read` to the node at `address`; resolves with its result, or why the connection failed.
    pub async fn read(self: &Rc<Self>, address: &str, mut read: Read) -> Answer {
        let conn = self.conn(address);
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        match &mut read {
            Read::Key(r) => r.id = id,
            Read::Range(r) => r.id = id,
        }
        let (tx, rx) = oneshot::channel();
        conn.waiting.borrow_mut().insert(id, tx);
        conn.outbox.borrow_mut().push(read);
        conn.wake.notify_one();
        rx.await.unwrap_or_else(|_| Err(format!("store node {address}: connection closed")))
    }

    fn conn(self: &Rc<Self>, address: &str) -> Rc<Conn> {
        if let Some(c) = self.conns.borrow().get(address) {
            if !c.dead.get() {
                return c.clone();
            }
        }
        let conn = Rc::new(Conn {
            address: address.to_owned(),
            outbox: RefCell::new(Vec::new()),
            waiting: RefCell::new(HashMap::new()),
            wake: Notify::new(),
            dead: Cell::new(false),
        });
        self.conns.borrow_mut().insert(address.to_owned(), conn.clone());
        tokio::task::spawn_local(run(self.clone(), conn.clone()));
        conn
    }

    fn kill(&self, conn: &Rc<Conn>, why: String) {
        if conn.dead.replace(true) {
            return;
        }
        let mut conns = self.conns.borrow_mut();
        if conns.get(&conn.address).is_some_and(|c| Rc::ptr_eq(c, conn)) {
            conns.remove(&conn.address);
        }
        drop(conns);
        conn.outbox.borrow_mut().clear();
        for (_, tx) in conn.waiting.borrow_mut().drain() {
            let _ = tx.send(Err(why.clone()));
        }
        conn.wake.notify_one();
    }
}

async fn run(stores: Rc<Stores>, conn: Rc<Conn>) {
    let connected = tokio::time::timeout(stores.connect_timeout, async {
        let stream = TcpStream::connect(conn.address.as_str()).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        match &stores.tls {
            None => Ok::<Connected, String>(Connected::Plain(stream)),
            Some(tls) => {
                // The certificate must name the host the node advertises, as the Python path checks it.
                let host = conn.address.rsplit_once(':').map_or(conn.address.as_str(), |(h, _)| h);
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned()).map_err(|e| e.to_string())?;
                let stream = tls.connect(name, stream).await.map_err(|e| format!("TLS: {e}"))?;
                Ok(Connected::Tls(Box::new(stream)))
            }
        }
    }).await;
    match connected {
        Ok(Ok(Connected::Plain(stream))) => {
            let (reader, writer) = stream.into_split();
            tokio::task::spawn_local(read_results(stores.clone(), conn.clone(), reader));
            write_batches(&stores, &conn, writer).await;
        }
        Ok(Ok(Connected::Tls(stream))) => {
            let (reader, writer) = tokio::io::split(*stream);
            tokio::task::spawn_local(read_results(stores.clone(), conn.clone(), reader));
            write_batches(&stores, &conn, writer).await;
        }
        Ok(Err(e)) => stores.kill(&conn, format!("store node {}: {e}", conn.address)),
        Err(_) => stores.kill(&conn, format!("store node {}: connect timed out", conn.address)),
    }
}

enum Connected {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn write_batches<W: AsyncWrite + Unpin>(stores: &Rc<Stores>, conn: &Rc<Conn>, mut writer: W) {
    let mut frame = Vec::with_capacity(4096);
    loop {
        // Every connection task the runtime polled this turn has put its read in the outbox by now.
        conn.wake.notified().await;
        if conn.dead.get() {
            return;
        }
        let out = std::mem::take(&mut *conn.outbox.borrow_mut());
        if out.is_empty() {
            continue;
        }
        let mut batch = ReadBatch { cluster_secret: stores.secret.clone(), ..Default::default() };
        for read in out {
            match read {
                Read::Key(r) => batch.reads.push(r),
                Read::Range(r) => batch.ranges.push(r),
            }
        }
        frame.clear();
        frame.extend_from_slice(&(batch.encoded_len() as u32).to_be_bytes());
        batch.encode(&mut frame).expect("a Vec grows");
        // Flushed: a TLS stream holds what it was given until then.
        if let Err(e) = async { writer.write_all(&frame).await?; writer.flush().await }.await {
            return stores.kill(conn, format!("store node {}: {e}", conn.address));
        }
    }
}

async fn read_results<R: AsyncRead + Unpin>(stores: Rc<Stores>, conn: Rc<Conn>, mut reader: R) {
    let why = loop {
        let mut head = [0u8; 4];
        if let Err(e) = reader.read_exact(&mut head).await {
            break format!("store node {}: {e}", conn.address);
        }
        let size = u32::from_be_bytes(head) as usize;
        if size > MAX_FRAME {
            break format!("store node {}: frame of {size} bytes announced", conn.address);
        }
        let mut payload = BytesMut::zeroed(size);
        if let Err(e) = reader.read_exact(&mut payload).await {
            break format!("store node {}: {e}", conn.address);
        }
        let batch = match ResultBatch::decode(payload.freeze()) {
            Ok(b) => b,
            Err(e) => break format!("store node {}: not a result batch ({e})", conn.address),
        };
        if !batch.refused.is_empty() {
            break format!("store node {} refused the read: {}", conn.address, batch.refused);
        }
        let mut waiting = conn.waiting.borrow_mut();
        let replies = batch.results.into_iter().map(|r| (r.id, Reply::Key(r)))
            .chain(batch.ranges.into_iter().map(|r| (r.id, Reply::Range(r))));
        for (id, reply) in replies {
            if let Some(tx) = waiting.remove(&id) {
                let _ = tx.send(Ok(reply));
            }
        }
        if conn.dead.get() {
            return;
        }
    };
    stores.kill(&conn, why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    fn run_local<F: std::future::Future<Output = ()>>(f: F) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f);
    }

    async fn node_answering(answer: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::task::spawn_local(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4];
            s.read_exact(&mut head).await.unwrap();
            let mut read = vec![0u8; u32::from_be_bytes(head) as usize];
            s.read_exact(&mut read).await.unwrap();
            s.write_all(&answer).await.unwrap();
        });
        address
    }

    fn read() -> Read {
        Read::Key(crate::messages::KeyRead { id: 0, table: "t".into(), partition: 0, key: b"k".to_vec(), bound: None,
                                                  as_of_ms: None })
    }

    #[test]
    fn a_node_answering_garbage_fails_the_read_and_the_next_read_connects_anew() {
        run_local(async {
            let stores = Stores::new(String::new(), Duration::from_secs(1), None);
            let garbage = node_answering(b"\x00\x00\x00\x05\xff\xff\xff\xff\xff".to_vec()).await;
            let got = stores.read(&garbage, read()).await;
            assert!(got.unwrap_err().contains("not a result batch"));
            let oversized = node_answering(b"\xff\xff\xff\xff".to_vec()).await;
            assert!(stores.read(&oversized, read()).await.unwrap_err().contains("announced"));
            let closed = node_answering(Vec::new()).await;
            assert!(stores.read(&closed, read()).await.is_err());
            assert!(stores.read("127.0.0.1:1", read()).await.is_err());
            assert!(stores.conns.borrow().is_empty(), "broken connections are dropped");
        });
    }

    #[test]
    fn a_result_is_matched_to_its_read_by_id() {
        run_local(async {
            let stores = Stores::new("s3cret".into(), Duration::from_secs(1), None);
            use crate::messages::{KeyResult, RangeRead, RangeResult};
            let batch = ResultBatch { groups: vec![], results: vec![KeyResult { id: 1, status: crate::messages::OK,
                                                               value: bytes::Bytes::from_static(b"{}"),
                                                               ..Default::default() }],
                                      ranges: vec![RangeResult { id: 2, watermark_ms: 7, ..Default::default() }],
                                      refused: String::new() };
            let mut frame = (batch.encoded_len() as u32).to_be_bytes().to_vec();
            batch.encode(&mut frame).unwrap();
            let node = node_answering(frame).await;
            let range = Read::Range(RangeRead { table: "t".into(), ..Default::default() });
            let (key, range) = tokio::join!(stores.read(&node, read()), stores.read(&node, range));
            match (key.unwrap(), range.unwrap()) {
                (Reply::Key(k), Reply::Range(r)) => {
                    assert_eq!((k.id, &k.value[..]), (1, &b"{}"[..]));
                    assert_eq!((r.id, r.watermark_ms), (2, 7));
                }
                other => panic!("each reply to its read: {other:?}"),
            }
        });
    }
}
