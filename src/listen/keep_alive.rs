//! An HTTP/1.1 connection kept usable after an answer given before its request's body was read
//! ([answer_keeping_alive]).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use hyper::body::Incoming;
use tower::ServiceExt;

use super::{App, BODY_LIMIT_BYTES};

/// Answers `request` with `app`, and keeps the connection usable after an answer given before
/// the request's body was read.
///
/// Why: the app answers many requests without reading their bodies (a refusal by a guard or
/// an extractor, an unknown route). hyper then has unread bytes in front of the next request;
/// it reads what is already buffered, and otherwise closes the connection after the answer,
/// which it has already sent as keep-alive (no `Connection: close`). A pooled client learns of
/// it only when its next request meets a broken pipe — right after being told to retry. So:
/// - a body of declared length up to [BODY_LIMIT_BYTES] is drained (read and dropped) in the
///   background, while the answer goes out, so a client that sends its body after the head,
///   or only after seeing the answer, keeps its connection; a body that does not come within
///   `drain_timeout` (the time a request's head gets) closes it, as an idle one would;
/// - a larger body, one of unknown length (chunked: whether it ends under the limit is known
///   only once read), or one the client holds back for `100 Continue` (a final answer has
///   been sent instead, so it must not be asked for now) gets `Connection: close` on the answer,
///   and hyper closes the connection after it.
///
/// HTTP/1 only: HTTP/2 ends an unread stream with a reset that costs the connection nothing.
pub(super) async fn answer_keeping_alive<A: App>(
    app: A,
    request: hyper::Request<Incoming>,
    drain_timeout: Duration,
) -> Result<Response, Infallible> {
    // HTTP/2, or a request without a body (a `GET`): nothing to drain.
    if request.version() > hyper::Version::HTTP_11 || hyper::body::Body::is_end_stream(request.body()) {
        return app.oneshot(request.map(Body::new)).await;
    }
    let declared = request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let held_back = request
        .headers()
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (parts, incoming) = request.into_parts();
    let (body, mut unread) = Returned::new(incoming);
    let mut response = app.oneshot(hyper::Request::from_parts(parts, Body::new(body))).await?;
    // The body comes back only if the app dropped it before its end; `Err` is a body read to
    // its end, or one still held (streamed by a handler).
    if let Ok(unread) = unread.try_recv() {
        let drainable = declared.is_some_and(|length| length <= BODY_LIMIT_BYTES as u64);
        if drainable && !held_back {
            tokio::spawn(async move {
                let drained = tokio::time::timeout(drain_timeout, drain(unread)).await;
                if !matches!(drained, Ok(Ok(()))) {
                    tracing::debug!("an unread request body did not come; the connection closes");
                }
            });
        } else {
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
    }
    Ok(response)
}

/// Reads `body` to its end (or at most [BODY_LIMIT_BYTES] of it) and drops what it reads.
async fn drain(mut body: Incoming) -> Result<(), ()> {
    use hyper::body::Body;
    let mut read = 0;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| ())?;
        read += frame.data_ref().map_or(0, |data| data.len());
        if read > BODY_LIMIT_BYTES {
            return Err(());
        }
    }
    Ok(())
}

/// A request body that hands itself back, through a one-shot channel, when it is dropped
/// before its end: so that what the app did not read can still be drained.
struct Returned {
    body: Option<Incoming>,
    back: Option<tokio::sync::oneshot::Sender<Incoming>>,
}

impl Returned {
    fn new(body: Incoming) -> (Returned, tokio::sync::oneshot::Receiver<Incoming>) {
        let (back, unread) = tokio::sync::oneshot::channel();
        let returned = Returned {
            body: Some(body),
            back: Some(back),
        };
        (returned, unread)
    }
}

impl hyper::body::Body for Returned {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // Read to its end (or failed): nothing to give back.
            self.back = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| hyper::body::SizeHint::with_exact(0), hyper::body::Body::size_hint)
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        if let (Some(body), Some(back)) = (self.body.take(), self.back.take())
            && !hyper::body::Body::is_end_stream(&body)
        {
            let _ = back.send(body);
        }
    }
}
