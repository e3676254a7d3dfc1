//! What a gRPC peer sends, watched before h2 reads it: a connection that does not open with HTTP/2's preface is
//! told PROTOCOL_ERROR; one that floods the port with frames the server must acknowledge (SETTINGS, PING) or with
//! RST_STREAM frames (any, where the Python reader counts resets of streams still open) is told ENHANCE_YOUR_CALM; one whose header block grows past the header list size the port
//! advertises is told COMPRESSION_ERROR; a frame of the wrong size, FRAME_SIZE_ERROR — limits h2 keeps otherwise
//! (with other error codes than RFC 9113 names) or not at all, kept as router.transports.http2.reader keeps them.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;

pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const COMPRESSION_ERROR: u32 = 0x9;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;
/// The header list size the port advertises (router.transports.http2.state.MAX_HEADER_LIST).
pub const MAX_HEADER_LIST: usize = 64 << 10;
/// The largest frame the port takes (HTTP/2's default, never raised): h2 refuses a longer one itself.
const MAX_FRAME: usize = 16_384;

/// (burst, per second) of streams a peer may reset, and of SETTINGS and PING frames it may send.
const RESET_BUDGET: (f64, f64) = (1_000.0, 200.0);
const CONTROL_BUDGET: (f64, f64) = (1_000.0, 100.0);
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const INITIAL_WINDOW_SIZE: u16 = 0x4;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

struct Budget {
    tokens: f64,
    burst: f64,
    per_s: f64,
    at: Instant,
}

impl Budget {
    fn new((burst, per_s): (f64, f64)) -> Budget {
        Budget { tokens: burst, burst, per_s, at: Instant::now() }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.per_s).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        self.tokens >= 0.0
    }
}

/// The error code a connection is to be closed with, once the watch has found one.
#[derive(Default)]
pub struct Verdict {
    reason: Cell<Option<u32>>,
    given: Notify,
}

impl Verdict {
    fn give(&self, reason: u32) {
        self.reason.set(Some(reason));
        self.given.notify_one();
    }

    pub async fn given(&self) -> u32 {
        loop {
            if let Some(reason) = self.reason.get() {
                return reason;
            }
            self.given.notified().await;
        }
    }
}

/// A connection's bytes on their way to h2, the preface already read replayed first: frames counted against the
/// budgets, and nothing passed on from the frame that broke one.
pub struct Watched<S> {
    inner: S,
    replay: Bytes,
    head: [u8; 9],
    have: usize,
    skip: usize,
    /// Bytes of the header block not ended yet.
    block: usize,
    /// The SETTINGS frame being read, whose values h2 would misname an error of.
    settings: Option<Vec<u8>>,
    resets: Budget,
    control: Budget,
    verdict: std::rc::Rc<Verdict>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, verdict: std::rc::Rc<Verdict>) -> Watched<S> {
        Watched { inner, replay: Bytes::from_static(PREFACE), head: [0; 9], have: 0, skip: 0, block: 0, settings: None,
                  resets: Budget::new(RESET_BUDGET), control: Budget::new(CONTROL_BUDGET), verdict }
    }

    /// Where in `data` the first frame over a limit starts, and the error code it earns, if one is.
    fn over_limits(&mut self, data: &[u8]) -> Option<(usize, u32)> {
        let mut i = 0;
        let mut start = 0;  // where the current frame began in `data` (0: in an earlier read)
        while i < data.len() {
            if self.skip > 0 {
                let n = self.skip.min(data.len() - i);
                if let Some(settings) = &mut self.settings {
                    settings.extend_from_slice(&data[i..i + n]);
                }
                self.skip -= n;
                i += n;
                if self.skip == 0 {
                    if let Some(reason) = self.settings.take().and_then(|s| settings_problem(&s)) {
                        return Some((start, reason));
                    }
                }
                continue;
            }
            if self.have == 0 {
                start = i;
            }
            let n = (9 - self.have).min(data.len() - i);
            self.head[self.have..self.have + n].copy_from_slice(&data[i..i + n]);
            self.have += n;
            i += n;
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.head;
            self.skip = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
            if let Some(reason) = self.frame(h[3], h[4], self.skip) {
                return Some((start, reason));
            }
            if h[3] == SETTINGS && h[4] & ACK == 0 && self.skip > 0 && self.skip <= MAX_FRAME {
                self.settings = Some(Vec::with_capacity(self.skip));
            }
        }
        None
    }

    /// The error code a frame earns by its head alone: a size the frame's type does not have (h2 answers those
    /// PROTOCOL_ERROR where RFC 9113 says FRAME_SIZE_ERROR), a flood, a header block too large.
    fn frame(&mut self, kind: u8, flags: u8, length: usize) -> Option<u32> {
        match kind {
            PING if length != 8 => Some(FRAME_SIZE_ERROR),
            SETTINGS if length % 6 != 0 || (flags & ACK != 0 && length != 0) => Some(FRAME_SIZE_ERROR),
            PRIORITY if length != 5 => Some(FRAME_SIZE_ERROR),
            RST_STREAM | WINDOW_UPDATE if length != 4 => Some(FRAME_SIZE_ERROR),
            RST_STREAM => (!self.resets.take()).then_some(ENHANCE_YOUR_CALM),
            SETTINGS | PING if flags & ACK == 0 => (!self.control.take()).then_some(ENHANCE_YOUR_CALM),
            HEADERS | CONTINUATION => {
                self.block = if kind == HEADERS { length } else { self.block + length };
                let over = self.block > MAX_HEADER_LIST;
                if flags & END_HEADERS != 0 {
                    self.block = 0;
                }
                over.then_some(COMPRESSION_ERROR)
            }
            _ => None,
        }
    }
}

/// A SETTINGS payload's error the way RFC 9113 names it where h2 names another: an initial window above 2^31-1 is
/// a FLOW_CONTROL_ERROR.
fn settings_problem(payload: &[u8]) -> Option<u32> {
    payload.chunks_exact(6).any(|s| u16::from_be_bytes([s[0], s[1]]) == INITIAL_WINDOW_SIZE
                                     && u32::from_be_bytes([s[2], s[3], s[4], s[5]]) > 0x7fff_ffff)
        .then_some(FLOW_CONTROL_ERROR)
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.verdict.reason.get().is_some() {
            return Poll::Pending;  // the connection is being closed: h2 reads nothing more
        }
        if !this.replay.is_empty() {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some((cut, reason)) = this.over_limits(&buf.filled()[before..]) {
            this.verdict.give(reason);
            buf.set_filled(before + cut);
            if cut == 0 {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>])
                           -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether the connection opens with HTTP/2's preface; a peer that sends something else is told PROTOCOL_ERROR in
/// a GOAWAY and the connection closed, what it sent meanwhile read so that the close does not reset it.
pub async fn opens_with_preface<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, wait: Duration) -> bool {
    let mut preface = [0u8; 24];
    match tokio::time::timeout(wait, io.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == PREFACE => return true,
        Ok(Ok(_)) => {}
        _ => return false,
    }
    let mut goaway = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];  // our (empty) SETTINGS, the server's preface
    goaway.extend_from_slice(&[0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    goaway.extend_from_slice(&PROTOCOL_ERROR.to_be_bytes());
    if io.write_all(&goaway).await.is_ok() && io.flush().await.is_ok() {
        let _ = io.shutdown().await;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
        }).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0, (payload.len() >> 8) as u8, payload.len() as u8, kind, flags, 0, 0, 0, 0];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn floods_are_found_where_they_start() {
        let mut w = Watched::new((), Default::default());
        let pings: Vec<u8> = (0..1_000).flat_map(|_| frame(PING, 0, b"12345678")).collect();
        assert_eq!(w.over_limits(&pings), None, "the burst is allowed");
        let acks: Vec<u8> = (0..5).flat_map(|_| frame(PING, ACK, b"12345678")).collect();
        assert_eq!(w.over_limits(&acks), None, "acknowledgements cost nothing");
        let data = frame(0x0, 0, &[7; 300]);
        let mut more = data.clone();
        more.extend(frame(SETTINGS, 0, b""));
        assert_eq!(w.over_limits(&more[..5]), None, "a head split across reads");
        assert_eq!(w.over_limits(&more[5..]), Some((data.len() - 5, ENHANCE_YOUR_CALM)));
        let block: Vec<u8> = [frame(HEADERS, 0, &[0; 16_000])].into_iter()
            .chain((0..4).map(|_| frame(CONTINUATION, 0, &[0; 16_000]))).flatten().collect();
        let mut w = Watched::new((), Default::default());
        assert_eq!(w.over_limits(&block), Some((4 * 16_009, COMPRESSION_ERROR)), "the block's fifth frame");
        let mut w = Watched::new((), Default::default());
        let mut settings = frame(SETTINGS, 0, &[0, 3, 0, 0, 0, 100]);
        settings.extend(frame(SETTINGS, 0, &[0, 4, 0x80, 0, 0, 0]));
        assert_eq!(w.over_limits(&settings[..20]), None);
        assert_eq!(w.over_limits(&settings[20..]), Some((0, FLOW_CONTROL_ERROR)),
                   "found where it ends, cut where it began in this read");
        let mut w = Watched::new((), Default::default());
        assert_eq!(w.over_limits(&frame(PING, 0, b"1234")), Some((0, FRAME_SIZE_ERROR)));
    }
}
