//! The way to the router's Python gRPC front (router.transports.grpc_front, on a loopback port of its own): a call
//! this path does not answer goes there as it came — headers, messages, its end — on an HTTP/2 connection of the
//! client connection's own, and its answer comes back the same way as it arrives, with flow control both ways and
//! a reset on either side passed on. So every other method, and every Get this path leaves, is answered by the one
//! implementation the router has without this path.

use std::cell::RefCell;
use std::future::poll_fn;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, Reason, SendStream};
use http::{Request, Response};
use tokio::net::TcpStream;

use crate::grpc::trailers_only;
use crate::grpc_answer::{Status, UNAVAILABLE};

pub struct PythonGrpc {
    port: u16,
    connection: RefCell<Option<SendRequest<Bytes>>>,
}

/// What the client sent of a call so far: the bytes already read, and the rest of its body if it has not ended.
pub struct Pending {
    pub read: Bytes,
    pub rest: Option<RecvStream>,
}

impl PythonGrpc {
    pub fn new(port: u16) -> PythonGrpc {
        PythonGrpc { port, connection: RefCell::new(None) }
    }

    /// A connection ready for one more stream: the one kept, or a new one if it is gone.
    async fn ready(&self) -> Result<SendRequest<Bytes>, h2::Error> {
        let kept = self.connection.borrow().clone();
        if let Some(kept) = kept {
            if let Ok(ready) = kept.ready().await {
                return Ok(ready);
            }
        }
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await.map_err(|_| h2::Error::from(Reason::REFUSED_STREAM))?;
        let _ = tcp.set_nodelay(true);
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake::<_, Bytes>(tcp)
            .await?;
        tokio::task::spawn_local(async move {
            let _ = connection.await;
        });
        *self.connection.borrow_mut() = Some(send.clone());
        send.ready().await
    }

    /// Carry one call to the Python front and its answer back to `respond`.
    pub async fn call(&self, head: http::request::Parts, pending: Pending, mut respond: SendResponse<Bytes>) {
        let mut answered = false;
        if let Err(e) = self.exchange(head, pending, &mut respond, &mut answered).await {
            if answered {
                respond.send_reset(e.reason().unwrap_or(Reason::INTERNAL_ERROR));
            } else {
                trailers_only(&mut respond, &Status { code: UNAVAILABLE, body: None,
                                                      message: "the router's Python path did not answer".into() });
            }
        }
    }

    async fn exchange(&self, head: http::request::Parts, pending: Pending, respond: &mut SendResponse<Bytes>,
                      answered: &mut bool) -> Result<(), h2::Error> {
        let mut sender = self.ready().await?;
        let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = Request::builder().method(head.method).uri(format!("http://127.0.0.1{path}"))
            .body(()).expect("a valid request: its parts were");
        *request.headers_mut() = head.headers;
        let ended = pending.rest.is_none();
        let (response, mut upstream) = sender.send_request(request, ended && pending.read.is_empty())?;
        let up = async {
            if !pending.read.is_empty() {
                send_all(&mut upstream, pending.read, ended).await.map_err(Broken::To)?;
            }
            match pending.rest {
                Some(body) => pipe(body, &mut upstream).await,
                None => Ok(()),
            }
        };
        let down = async {
            let answer = tokio::select! {
                answer = response => answer?,
                // The client gave up on the call before its answer began: so does the Python front, as the
                // dropped stream is reset.
                reset = poll_fn(|cx| respond.poll_reset(cx)) => return Err(reset.map_or_else(|e| e, h2::Error::from)),
            };
            let (parts, body) = answer.into_parts();
            let end = body.is_end_stream();
            let mut downstream = respond.send_response(Response::from_parts(parts, ()), end)?;
            *answered = true;
            if !end {
                pipe(body, &mut downstream).await.map_err(Broken::error)?;
            }
            Ok::<(), h2::Error>(())
        };
        tokio::pin!(up, down);
        let mut sent = false;
        loop {
            tokio::select! {
                r = &mut up, if !sent => match r {
                    Err(Broken::From(e)) => return Err(e),  // the client reset its call
                    // Done, or the Python front stopped reading the call: its answer says why.
                    Ok(()) | Err(Broken::To(_)) => sent = true,
                },
                r = &mut down => return r,
            }
        }
    }
}

/// Which side of a pipe broke it.
enum Broken {
    From(h2::Error),
    To(h2::Error),
}

impl Broken {
    fn error(self) -> h2::Error {
        match self {
            Broken::From(e) | Broken::To(e) => e,
        }
    }
}

/// A stream's data and its end (trailers, or an empty last frame) from `body` to `to`, as `to`'s window opens; a
/// reset of `to` while `body` is quiet ends it too.
async fn pipe(mut body: RecvStream, to: &mut SendStream<Bytes>) -> Result<(), Broken> {
    loop {
        let next = tokio::select! {
            next = body.data() => next,
            reset = poll_fn(|cx| to.poll_reset(cx)) => return Err(Broken::To(reset.map_or_else(|e| e, h2::Error::from))),
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(Broken::From)?;
        let n = chunk.len();
        send_all(to, chunk, false).await.map_err(Broken::To)?;
        let _ = body.flow_control().release_capacity(n);
    }
    let trailers = tokio::select! {
        trailers = body.trailers() => trailers.map_err(Broken::From)?,
        reset = poll_fn(|cx| to.poll_reset(cx)) => return Err(Broken::To(reset.map_or_else(|e| e, h2::Error::from))),
    };
    match trailers {
        Some(trailers) => to.send_trailers(trailers),
        None => to.send_data(Bytes::new(), true),
    }
    .map_err(Broken::To)
}

async fn send_all(to: &mut SendStream<Bytes>, mut data: Bytes, end: bool) -> Result<(), h2::Error> {
    while !data.is_empty() {
        to.reserve_capacity(data.len());
        match poll_fn(|cx| to.poll_capacity(cx)).await {
            None => return Err(Reason::CANCEL.into()),
            Some(Err(e)) => return Err(e),
            Some(Ok(0)) => continue,
            Some(Ok(n)) => {
                let part = data.split_to(n.min(data.len()));
                to.send_data(part, end && data.is_empty())?;
            }
        }
    }
    Ok(())
}
