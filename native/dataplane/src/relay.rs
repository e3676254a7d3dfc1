//! The way to the Python path: the router's own HTTP/1.1 front (router.transports.http1 under uvicorn) on a
//! loopback port of its own. A key route this path does not answer goes there as one request over a kept-alive
//! connection, its answer relayed back; a connection whose request is anything else is handed over whole, every
//! byte not yet answered included — so the Python app serves the rest of the API exactly as it does without this
//! path. A plain connection's socket itself goes to the Python front's event loop (router/handover.py adopts it),
//! which serves it with no process in between from then on; a TLS one, whose session is this path's, is spliced
//! through to the loopback port.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixDatagram;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Larger than any answer head the Python front writes.
const MAX_ANSWER_HEAD: usize = 64 << 10;
/// The most bytes read and not answered that go with an adopted socket: more are spliced (a head is at most 32 KiB).
const MAX_ADOPTED: usize = 60 << 10;

pub struct Python {
    port: u16,
    idle: RefCell<Vec<TcpStream>>,
    /// Where sockets go to be adopted: this thread's duplicate of the inbox's end the Python side gave.
    inbox: Option<UnixDatagram>,
}

impl Python {
    /// `inbox`: the Python side's handover inbox (a datagram socket), when it adopts sockets.
    pub fn new(port: u16, inbox: Option<RawFd>) -> Python {
        // SAFETY: the Python side keeps the inbox open as long as the path runs.
        let inbox = inbox.and_then(|fd| unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().ok())
            .map(UnixDatagram::from)
            .filter(|inbox| inbox.set_nonblocking(true).is_ok());
        Python { port, idle: RefCell::new(Vec::new()), inbox }
    }

    /// Give the connection on socket `fd` (plain TCP) to the Python front whole, with `pending` (the request not
    /// answered yet, and all after it): a duplicate of the socket and those bytes in one datagram, the duplicate the
    /// Python side's from then on. False when it cannot be (no inbox, too many bytes, the inbox full): the caller
    /// still has the connection.
    pub fn adopt(&self, fd: RawFd, pending: &[u8]) -> bool {
        let Some(inbox) = &self.inbox else { return false };
        if pending.len() > MAX_ADOPTED {
            return false;
        }
        // SAFETY: `fd` is the caller's open connection, borrowed for the duplicate alone.
        let Ok(socket) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else { return false };
        let mut message = Vec::with_capacity(4 + pending.len());
        message.extend_from_slice(&socket.as_raw_fd().to_le_bytes());
        message.extend_from_slice(pending);
        match inbox.send(&message) {
            Ok(sent) if sent == message.len() => {
                let _ = socket.into_raw_fd();  // the Python side's now
                true
            }
            _ => false,  // the duplicate closes as it drops
        }
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let s = TcpStream::connect(("127.0.0.1", self.port)).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// From `pending` (the request not answered yet, and all after it) on, the client talks to the Python front.
    pub async fn hand_over<S: AsyncRead + AsyncWrite + Unpin>(&self, mut client: S, pending: &[u8]) {
        let Ok(mut python) = self.connect().await else { return };
        if python.write_all(pending).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut python).await;
    }

    /// The Python front's answer to one request (its whole head, no body): the answer's bytes, and whether it
    /// closes the connection.
    pub async fn answer(&self, request: &[u8]) -> io::Result<(Vec<u8>, bool)> {
        let pooled = self.idle.borrow_mut().pop();
        if let Some(conn) = pooled {
            // A kept-alive connection the Python front closed meanwhile fails before any answer: asked again anew.
            if let Ok(answer) = self.exchange(conn, request).await {
                return Ok(answer);
            }
        }
        let conn = self.connect().await?;
        self.exchange(conn, request).await
    }

    async fn exchange(&self, mut conn: TcpStream, request: &[u8]) -> io::Result<(Vec<u8>, bool)> {
        conn.write_all(request).await?;
        let mut buf = BytesMut::with_capacity(4096);
        let (head, length, closes) = loop {
            if conn.read_buf(&mut buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut answer = httparse::Response::new(&mut headers);
            match answer.parse(&buf) {
                Ok(httparse::Status::Complete(head)) => {
                    let mut length = None;
                    let mut closes = false;
                    for h in answer.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            length = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<usize>().ok());
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            closes = h.value.eq_ignore_ascii_case(b"close");
                        }
                    }
                    break (head, length, closes);
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_ANSWER_HEAD => continue,
                _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "not an HTTP/1.1 answer")),
            }
        };
        match length {
            Some(length) => {
                while buf.len() < head + length {
                    if conn.read_buf(&mut buf).await? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                buf.truncate(head + length);
            }
            None => {
                // No length: the answer ends with the connection.
                while conn.read_buf(&mut buf).await? != 0 {}
                return Ok((buf.to_vec(), true));
            }
        }
        if !closes {
            self.idle.borrow_mut().push(conn);
        }
        Ok((buf.to_vec(), closes))
    }
}
