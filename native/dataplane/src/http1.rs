//! The REST port's HTTP/1.1 connections: key lookups (GET /v1/tables/{table}/keys/{key}) parsed with httparse and
//! answered here, in order, pipelined ones included; the other key routes relayed to the Python path one request
//! at a time; a connection whose request is anything else (another route or method, a body, an upgrade, a head
//! httparse refuses or that is too large or too slow) handed to the Python front whole, which answers, or refuses,
//! it exactly as it does without this path.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::answer;
use crate::guard::{Guard, Judgement};
use crate::lookup::{segment, Routing};
use crate::relay::Python;
use std::os::fd::RawFd;

/// What a request's head may take before it is the Python front's to judge (router.transports.http1: 32 KiB).
const MAX_HEAD: usize = 32 << 10;
/// A request line's URL longer than this is the Python front's to refuse (router.transports.http1: 8 KiB).
const MAX_URL: usize = 8 << 10;
/// A head still incomplete after this is handed over: the Python front times slow heads out.
const HEAD_GRACE: Duration = Duration::from_secs(1);
const PREFIX: &[u8] = b"/v1/tables/";

pub struct Conns {
    pub routing: Rc<Routing>,
    pub python: Python,
    guard: Guard,
    date: RefCell<(u64, Vec<u8>)>,
}

enum Request {
    /// A key lookup or a key's windows: (table, key, query, its last Authorization value) as ranges of the head, and
    /// whether the connection stays open after it.
    Lookup {
        windows: bool,
        head: usize,
        table: (usize, usize),
        key: (usize, usize),
        query: (usize, usize),
        authorization: Option<(usize, usize)>,
        keep_alive: bool,
    },
    /// Another key route (metadata, versions): one request for the Python path.
    KeyRoute { head: usize },
    /// Anything else: the connection is the Python front's from here on.
    Other,
    Partial,
}

fn parse(buf: &[u8]) -> Request {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Request::Partial,
        Err(_) => return Request::Other,
    };
    if req.method != Some("GET") || head > MAX_HEAD || req.path.map_or(0, str::len) > MAX_URL {
        return Request::Other;
    }
    let mut keep_alive = req.version == Some(1);
    let mut authorization = None;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"authorization") {
            let at = h.value.as_ptr() as usize - buf.as_ptr() as usize;
            authorization = Some((at, at + h.value.len()));
        }
        if [&b"content-length"[..], b"transfer-encoding", b"expect", b"upgrade"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            return Request::Other;
        }
        if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|&b| b == b',').map(|t| t.trim_ascii()) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && req.version == Some(0) {
                    keep_alive = true;
                }
            }
        }
    }
    let path = req.path.unwrap_or("").as_bytes();
    let base = path.as_ptr() as usize - buf.as_ptr() as usize;
    let (route, query) = match path.iter().position(|&b| b == b'?') {
        Some(q) => ((base, base + q), (base + q + 1, base + path.len())),
        None => ((base, base + path.len()), (0, 0)),
    };
    let route_bytes = &buf[route.0..route.1];
    if !route_bytes.starts_with(PREFIX) {
        return Request::Other;
    }
    let rest = route.0 + PREFIX.len();
    let parts: Vec<&[u8]> = buf[rest..route.1].split(|&b| b == b'/').collect();
    if parts.len() < 3 || parts.len() > 4 || parts[1] != b"keys" || parts[0].is_empty() || parts[2].is_empty() {
        return Request::Other;
    }
    let windows = parts.get(3) == Some(&&b"windows"[..]);
    if parts.len() == 4 && !windows {
        return if matches!(parts[3], b"metadata" | b"versions") { Request::KeyRoute { head } } else { Request::Other };
    }
    let table = (rest, rest + parts[0].len());
    let key_start = table.1 + 1 + parts[1].len() + 1;
    Request::Lookup { windows, head, table, key: (key_start, key_start + parts[2].len()), query, authorization,
                      keep_alive }
}

impl Conns {
    pub fn new(routing: Rc<Routing>, python: Python) -> Conns {
        Conns { routing, python, guard: Guard::default(), date: RefCell::new((0, Vec::new())) }
    }

    fn date(&self) -> Vec<u8> {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let mut cached = self.date.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, format!("date: {}\r\n", httpdate::fmt_http_date(now)).into_bytes());
        }
        cached.1.clone()
    }

    fn write_answer(&self, out: &mut Vec<u8>, status: u16, body: &[u8], keep_alive: bool) {
        out.extend_from_slice(match status {
            200 => b"HTTP/1.1 200 OK\r\n",
            401 => b"HTTP/1.1 401 Unauthorized\r\n",
            503 => b"HTTP/1.1 503 Service Unavailable\r\n",
            _ => b"HTTP/1.1 404 Not Found\r\n",
        });
        out.extend_from_slice(&self.date());
        if status == 401 {
            out.extend_from_slice(b"www-authenticate: Bearer realm=\"freshroute\"\r\n");  // router.auth
        }
        out.extend_from_slice(format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len()).as_bytes());
        out.extend_from_slice(if keep_alive { b"\r\n" } else { b"connection: close\r\n\r\n" });
        out.extend_from_slice(body);
    }
}

/// Bytes written, and sent: a TLS stream holds them until flushed.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, out: &[u8]) -> std::io::Result<()> {
    stream.write_all(out).await?;
    stream.flush().await
}

/// Serve one connection (plain, its socket `plain`; or TLS already accepted) until it closes, idles out or is handed
/// over.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(conns: Rc<Conns>, mut stream: S, plain: Option<RawFd>) {
    let shared = conns.routing.shared.clone();
    let mut buf = BytesMut::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let keep_alive_for = Duration::from_secs_f64(shared.config.keep_alive_s);
    // When the head waiting for its end began to arrive: past HEAD_GRACE it is the Python front's to time out.
    let mut head_since: Option<tokio::time::Instant> = None;
    loop {
        loop {
            if buf.is_empty() {
                break;
            }
            match parse(&buf) {
                Request::Partial if buf.len() <= MAX_HEAD => break,
                Request::Partial | Request::Other => {
                    if !out.is_empty() && send(&mut stream, &out).await.is_err() {
                        return;
                    }
                    return hand_over(&conns, stream, plain, &buf).await;
                }
                Request::KeyRoute { head } => {
                    let request = buf.split_to(head);
                    head_since = None;
                    match relayed(&conns, &request, &mut out).await {
                        Some(false) => {}
                        _ => {
                            let _ = send(&mut stream, &out).await;
                            return;
                        }
                    }
                }
                Request::Lookup { windows, head, table, key, query, authorization, keep_alive } => {
                    let judged = judge(&conns, &buf, table, authorization);
                    let (t, k, q) = (&buf[table.0..table.1], &buf[key.0..key.1], &buf[query.0..query.1]);
                    let answered = match &judged {
                        Judgement::Admitted(_) if windows => conns.routing.windows(t, k, q).await,
                        Judgement::Admitted(_) => conns.routing.lookup(t, k, q).await,
                        Judgement::Unauthenticated(message) => Some((401, answer::unauthenticated(message))),
                        Judgement::Python => None,
                    };
                    if let (None, Judgement::Admitted(Some(lease))) = (&answered, &judged) {
                        lease.give_back();  // the Python path admits the lookup again
                    }
                    let request = buf.split_to(head);
                    head_since = None;
                    let closes = match answered {
                        Some((status, body)) => {
                            conns.write_answer(&mut out, status, &body, keep_alive);
                            !keep_alive
                        }
                        None => relayed(&conns, &request, &mut out).await.unwrap_or(true),
                    };
                    if closes {
                        let _ = send(&mut stream, &out).await;
                        return;
                    }
                }
            }
        }
        if !out.is_empty() {
            if send(&mut stream, &out).await.is_err() {
                return;
            }
            out.clear();
        }
        if shared.stopping() && buf.is_empty() {
            return;
        }
        let until = if buf.is_empty() {
            head_since = None;
            tokio::time::Instant::now() + keep_alive_for
        } else {
            *head_since.get_or_insert_with(tokio::time::Instant::now) + HEAD_GRACE
        };
        tokio::select! {
            read = tokio::time::timeout_at(until, stream.read_buf(&mut buf)) => match read {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
                Err(_) if buf.is_empty() => return,  // idle past the keep-alive timeout
                Err(_) => {
                    return hand_over(&conns, stream, plain, &buf).await;
                }
            },
            _ = shared.stop.notified(), if buf.is_empty() => return,
        }
    }
}

/// The connection, from `pending` on, the Python front's: its socket adopted there when plain, else spliced through.
async fn hand_over<S: AsyncRead + AsyncWrite + Unpin>(conns: &Conns, stream: S, plain: Option<RawFd>, pending: &[u8]) {
    let counts = &conns.routing.shared.counts;
    if let Some(fd) = plain {
        // Counted first: the Python front may answer a scrape of the counts on this very connection.
        counts.adopted.fetch_add(1, Relaxed);
        if conns.python.adopt(fd, pending) {
            return;  // dropping the stream closes this path's descriptor alone
        }
        counts.adopted.fetch_sub(1, Relaxed);
    }
    counts.handed_over.fetch_add(1, Relaxed);
    conns.python.hand_over(stream, pending).await
}

/// Whether the lookup may be answered here, when the router authenticates.
fn judge(conns: &Conns, buf: &[u8], table: (usize, usize), authorization: Option<(usize, usize)>) -> Judgement {
    let shared = &conns.routing.shared;
    if !shared.config.authenticates {
        return Judgement::Admitted(None);
    }
    let Some(table) = segment(&buf[table.0..table.1]) else { return Judgement::Python };
    conns.guard.judge(&shared.principals(), authorization.map(|(a, b)| &buf[a..b]), &table)
}

/// The Python path's answer to one key route request appended to `out`; whether it closes the connection (None: the
/// Python front could not be reached, and the client is told so).
async fn relayed(conns: &Conns, request: &[u8], out: &mut Vec<u8>) -> Option<bool> {
    conns.routing.shared.counts.relayed.fetch_add(1, Relaxed);
    match conns.python.answer(request).await {
        Ok((answer, closes)) => {
            out.extend_from_slice(&answer);
            Some(closes)
        }
        Err(_) => {
            let body = b"{\"error\":{\"code\":\"UNAVAILABLE\",\"message\":\"the router's Python path did not answer\"}}";
            out.extend_from_slice(format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                                           content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart() {
        let r = b"GET /v1/tables/t/keys/k%2F1?max_lag=5 HTTP/1.1\r\nHost: x\r\n\r\n";
        match parse(r) {
            Request::Lookup { windows, head, table, key, query, authorization, keep_alive } => {
                assert!(!windows);
                assert_eq!(head, r.len());
                assert_eq!(authorization, None);
                assert_eq!(&r[table.0..table.1], b"t");
                assert_eq!(&r[key.0..key.1], b"k%2F1");
                assert_eq!(&r[query.0..query.1], b"max_lag=5");
                assert!(keep_alive);
            }
            _ => panic!("a lookup"),
        }
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k/windows?from=1 HTTP/1.1\r\n\r\n"),
                         Request::Lookup { windows: true, .. }));
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k/metadata HTTP/1.1\r\n\r\n"), Request::KeyRoute { .. }));
        assert!(matches!(parse(b"GET /v1/tables HTTP/1.1\r\n\r\n"), Request::Other));
        let r = b"GET /v1/tables/t/keys/k HTTP/1.1\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n";
        match parse(r) {
            Request::Lookup { authorization: Some((a, b)), .. } => assert_eq!(&r[a..b], b"Bearer b", "the last one"),
            _ => panic!("a lookup with its authorization"),
        }
        assert!(matches!(parse(b"POST /v1/tables/t/keys/k HTTP/1.1\r\n\r\n"), Request::Other));
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), Request::Other));
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k HTTP/1.1\r\nHost"), Request::Partial));
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k HTTP/1.0\r\n\r\n"),
                         Request::Lookup { keep_alive: false, .. }));
        assert!(matches!(parse(b"GET /v1/tables/t/keys/k HTTP/1.1\r\nConnection: close\r\n\r\n"),
                         Request::Lookup { keep_alive: false, .. }));
        assert!(matches!(parse(b"\x01\x02 nonsense\r\n\r\n"), Request::Other));
        let long = format!("GET /v1/tables/t/keys/{} HTTP/1.1\r\n\r\n", "k".repeat(9000));
        assert!(matches!(parse(long.as_bytes()), Request::Other));
        let big = format!("GET /v1/tables/t/keys/k HTTP/1.1\r\nX-Big: {}\r\n\r\n", "v".repeat(40_000));
        assert!(matches!(parse(big.as_bytes()), Request::Other));
    }
}
