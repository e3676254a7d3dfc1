//! The gRPC port's connections, HTTP/2 by the h2 crate: `Router.Get` answered here — the same key read as REST's,
//! written as a GetResponse — and every other call, or a Get this path does not serve (typed values, a bound of a
//! write token, the input's lag or a wait, a version by number, anything the Python path would refuse), relayed to
//! the router's Python gRPC front (grpc_relay), which answers it exactly as it does without this path.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Method, Response};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::grpc_answer::{self, Outcome, Status, UNAUTHENTICATED};
use crate::grpc_relay::{Pending, PythonGrpc};
use crate::guard::{Guard, Judgement};
use crate::lookup::{position, Query, Routing};
use crate::read_after;
use crate::messages::GetRequest;
use crate::peer_frames::{self, Verdict, Watched};
use crate::selection::Bound;

const GET_PATH: &str = "/freshroute.v1.Router/Get";
const NOT_GRPC_BODY: &[u8] = b"this port serves gRPC: a call is a POST with content-type application/grpc\n";
/// The largest Get request read here; a larger one goes on to the Python front, which refuses it.
const MAX_GET: usize = 64 << 10;
/// How long a new connection may take to send HTTP/2's preface.
const PREFACE_WAIT: Duration = Duration::from_secs(10);
/// How long a connection told to go away has to read its GOAWAY before it is dropped.
const CLOSING: Duration = Duration::from_secs(1);

pub struct Conns {
    pub routing: Rc<Routing>,
    python_port: u16,
    guard: Guard,
}

impl Conns {
    pub fn new(routing: Rc<Routing>, python_port: u16) -> Conns {
        Conns { routing, python_port, guard: Guard::default() }
    }
}

/// Serve one connection (plain, or TLS already accepted) until it closes, or the front stops.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + 'static>(conns: Rc<Conns>, mut io: S) {
    let shared = conns.routing.shared.clone();
    if !peer_frames::opens_with_preface(&mut io, PREFACE_WAIT).await {
        return;
    }
    let verdict = Rc::new(Verdict::default());
    // A connection of its own to the Python front for this client's relayed calls, opened at the first: a client
    // that stops reading its answers holds up only its own calls, under the Python front's limits for one client.
    let python = Rc::new(PythonGrpc::new(conns.python_port));
    // The settings router.transports.http2 advertises.
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(1_000)
        .initial_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .max_header_list_size(64 << 10)
        .handshake::<_, Bytes>(Watched::new(io, verdict.clone()));
    let Ok(Ok(mut connection)) = tokio::time::timeout(PREFACE_WAIT, handshake).await else { return };
    let mut going_away = false;
    loop {
        tokio::select! {
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => {
                    tokio::task::spawn_local(call(conns.clone(), python.clone(), request, respond));
                }
                _ => return,
            },
            reason = verdict.given() => {
                connection.abrupt_shutdown(h2::Reason::from(reason));
                break;
            }
            _ = shared.stop.notified() => {
                if shared.forced() {
                    return;
                }
                if shared.stopping() && !going_away {
                    going_away = true;
                    connection.graceful_shutdown();  // calls opened finish; newer ones are refused
                }
            }
        }
    }
    let _ = tokio::time::timeout(CLOSING, std::future::poll_fn(|cx| connection.poll_closed(cx))).await;
}

async fn call(conns: Rc<Conns>, python: Rc<PythonGrpc>, request: http::Request<RecvStream>,
              mut respond: SendResponse<Bytes>) {
    let (head, mut body) = request.into_parts();
    if head.uri.path().is_empty() {
        // A request without :path, which h2 passes on (RFC 9113 §8.3.1: malformed).
        return respond.send_reset(h2::Reason::PROTOCOL_ERROR);
    }
    if !is_grpc(&head) {
        // Answered once the request has ended well (a malformed one is reset by h2 meanwhile), or once it has sent
        // more than a request of its kind needs: then the rest of its body is refused with the answer.
        let mut read = 0;
        while let Some(chunk) = body.data().await {
            let Ok(chunk) = chunk else { return };
            let _ = body.flow_control().release_capacity(chunk.len());
            read += chunk.len();
            if read > MAX_GET {
                return not_grpc(&mut respond, head.method == Method::HEAD);
            }
        }
        if body.trailers().await.is_err() {
            return;
        }
        return not_grpc(&mut respond, head.method == Method::HEAD);
    }
    if !is_get(&head) {
        conns.routing.counts().grpc_relayed.fetch_add(1, Relaxed);
        return python.call(head, Pending { read: Bytes::new(), rest: Some(body) }, respond).await;
    }
    let mut read = BytesMut::new();
    let mut ended = true;
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return };  // reset by the client
        let _ = body.flow_control().release_capacity(chunk.len());
        read.extend_from_slice(&chunk);
        if read.len() > MAX_GET {
            ended = false;
            break;
        }
    }
    let read = read.freeze();
    if ended {
        if let Some(outcome) = get(&conns, &head.headers, &read).await {
            return answer(&mut respond, outcome);
        }
    }
    conns.routing.counts().grpc_relayed.fetch_add(1, Relaxed);
    let rest = (!ended).then_some(body);
    python.call(head, Pending { read, rest }, respond).await
}

/// A gRPC call: a POST of gRPC's content type.
fn is_grpc(head: &http::request::Parts) -> bool {
    head.method == Method::POST
        && head.headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A call of Router.Get that this path may answer: its messages uncompressed.
fn is_get(head: &http::request::Parts) -> bool {
    head.uri.path() == GET_PATH
        && head.headers.get("grpc-encoding").is_none_or(|v| v.as_bytes() == b"identity")
}

/// A request that is no gRPC call: a plain HTTP 415 and why, as gRPC asks (router.transports.grpc_calls).
fn not_grpc(respond: &mut SendResponse<Bytes>, head_only: bool) {
    let mut answer = Response::new(());
    *answer.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
    answer.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    let Ok(mut stream) = respond.send_response(answer, head_only) else { return };
    if !head_only {
        let _ = stream.send_data(Bytes::from_static(NOT_GRPC_BODY), true);
    }
}

/// Router.Get's answer to `body` (the call's one message), or None for the Python front.
async fn get(conns: &Conns, headers: &HeaderMap, body: &[u8]) -> Option<Outcome> {
    let (prefix, message) = (body.get(..5)?, &body[5..]);
    if prefix[0] != 0 || u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize != message.len() {
        return None;
    }
    let request = known_fields(message)?;
    let query = query(&request)?;
    let shared = &conns.routing.shared;
    let judged = if shared.config.authenticates {
        // The call's first authorization metadata, as router.transports.grpc_calls reads it.
        let authorization = headers.get("authorization").map(HeaderValue::as_bytes);
        conns.guard.judge(&shared.principals(), authorization, &request.table)
    } else {
        Judgement::Admitted(None)
    };
    let lease = match judged {
        Judgement::Admitted(lease) => lease,
        Judgement::Unauthenticated(message) => {
            return Some(Outcome::Status(Status { code: UNAUTHENTICATED, message: message.into(),
                                                 body: Some(crate::answer::unauthenticated(message)) }));
        }
        Judgement::Python => return None,
    };
    let outcome = conns.routing.key(request.table, request.key, query, grpc_answer::get, grpc_answer::not_yet_visible)
        .await;
    if let (None, Some(lease)) = (&outcome, lease) {
        lease.give_back();  // the Python path admits the call again
    }
    outcome
}

/// The call's message, or None where it holds a field this path does not know (prost drops such fields): a bound
/// parameter added to router.proto is then judged by the Python front, never ignored here.
fn known_fields(message: &[u8]) -> Option<GetRequest> {
    let request = GetRequest::decode(message).ok()?;
    (request.encoded_len() == message.len()).then_some(request)
}

/// The bound of a Get this path serves, or None: a typed answer, the input's lag, a version named by number, and
/// limits the Python path refuses are its to answer (a wait, Routing::key judges).
fn query(request: &GetRequest) -> Option<Query> {
    if request.typed_values {
        return None;
    }
    let b = request.bound.clone().unwrap_or_default();
    if b.max_input_lag_ms.is_some() || b.version.is_some() {
        return None;
    }
    if [b.max_lag, b.max_staleness_ms, b.as_of].iter().any(|v| v.is_some_and(|v| v < 0)) {
        return None;
    }
    let position = if b.min_position.is_empty() { None } else { Some(position(b.min_position.as_bytes())?) };
    let after = if b.after.is_empty() { None } else { Some(read_after::decode(b.after.as_bytes())?) };
    Some(Query { bound: Bound { max_lag: b.max_lag, max_staleness_ms: b.max_staleness_ms, min_offset: 0 },
                 position, after, wait_ms: b.wait_ms, as_of_ms: b.as_of, ..Query::default() })
}

fn answer(respond: &mut SendResponse<Bytes>, outcome: Outcome) {
    let message = match outcome {
        Outcome::Message(message) => message,
        Outcome::Status(status) => return trailers_only(respond, &status),
    };
    let mut head = Response::new(());
    *head.headers_mut() = grpc_headers();
    let Ok(mut stream) = respond.send_response(head, false) else { return };
    if stream.send_data(message, false).is_ok() {
        let mut trailers = HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let _ = stream.send_trailers(trailers);
    }
}

/// gRPC's content type: the headers of every answer.
pub fn grpc_headers() -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers
}

/// A call ended with `status` and no message: gRPC's trailers-only answer.
pub fn trailers_only(respond: &mut SendResponse<Bytes>, status: &Status) {
    let mut head = Response::new(());
    let headers = head.headers_mut();
    *headers = grpc_headers();
    headers.insert("grpc-status", HeaderValue::from(status.code));
    if let Ok(message) = HeaderValue::from_str(&grpc_answer::percent_encoded(&status.message)) {
        headers.insert("grpc-message", message);
    }
    if let Some(body) = &status.body {
        if let Ok(body) = HeaderValue::from_str(&grpc_answer::ascii_json(body)) {
            headers.insert("freshroute-error", body);
        }
    }
    let _ = respond.send_response(head, true);
}

#[cfg(test)]
mod tests {
    use super::{known_fields, query};

    #[test]
    fn a_get_with_a_field_unknown_here_is_left_to_the_python_front() {
        // table "t", key "k", bound {max_lag: 1}
        let known = [0x0a, 1, b't', 0x12, 1, b'k', 0x1a, 2, 0x08, 0x01];
        assert_eq!(known_fields(&known).and_then(|r| r.bound).and_then(|b| b.max_lag), Some(1));
        assert!(known_fields(&known).and_then(|r| query(&r)).is_some());
        // the same bound with a field 9 (a varint 5) that router.proto might add
        let newer = [0x0a, 1, b't', 0x12, 1, b'k', 0x1a, 4, 0x08, 0x01, 0x48, 0x05];
        assert!(known_fields(&newer).is_none());
        // and a field 9 of the request itself
        let newer = [0x0a, 1, b't', 0x12, 1, b'k', 0x48, 0x01];
        assert!(known_fields(&newer).is_none());
    }

    #[test]
    fn a_get_of_a_version_by_number_is_left_to_the_python_front() {
        // bound {max_lag: 1, version: 2}, and {version: 1}: the Python path resolves every version named
        for bound in [&[0x08, 0x01, 0x40, 0x02][..], &[0x40, 0x01]] {
            let mut get = vec![0x0a, 1, b't', 0x12, 1, b'k', 0x1a, bound.len() as u8];
            get.extend_from_slice(bound);
            let request = known_fields(&get).expect("a field router.proto has");
            assert!(request.bound.as_ref().is_some_and(|b| b.version.is_some()));
            assert!(query(&request).is_none());
        }
    }
}
