//! The HTTP server: accepts connections (plain or TLS), bounds them, and serves the app on them
//! with HTTP/1.1 and its upgrades (WebSockets), and HTTP/2 on the same port: in clear text with
//! prior knowledge (the connection opens with HTTP/2's preface), over TLS when ALPN picks `h2`.
//! Many long polls and event streams then share one connection (a browser gets six HTTP/1.1
//! connections to a host).
//!
//! What a client can make the server hold is bounded here, before any request is read:
//! - **connections**: at most [Limits::max_connections] in all and
//!   [Limits::max_per_address] from one client address; one past either is closed at once (a
//!   TLS one before its handshake costs anything). A WebSocket keeps its connection's slot for
//!   as long as it lives, since the slot travels inside the connection's IO.
//! - **time**: a connection must start its first request within [Limits::header_timeout] of
//!   being accepted (whichever its protocol: a silent connection, or one that stops inside
//!   HTTP/2's preface, is closed then); an HTTP/1.1 one must also send each later request head
//!   within it of its previous response (hyper's header-read timeout also bounds keep-alive
//!   idleness). An HTTP/2 connection is pinged every [Limits::header_timeout] and closed when a
//!   ping goes unanswered as long, so a peer gone without a word does not hold it. A request
//!   being served (a long poll) is not cut. A response the client stops taking (a write that
//!   makes no progress for [Limits::write_timeout]: an event stream, a large read, a socket)
//!   fails, and the connection with it.
//! - **streams**: an HTTP/2 connection carries at most [H2_MAX_STREAMS] requests at once, and
//!   buffers at most HTTP/2's connection window (1 MiB, hyper's default) of unread request
//!   bodies in all; what each principal may keep waiting is [crate::limits]'s to bound.
//! - **handshakes**: each TLS handshake runs in its own task, bounded by its own timeout, so a
//!   client that connects and sends nothing never holds up the accept loop.
//! - **files**: the process's open-file limit is raised to its hard limit at start, so that
//!   the caps, not `EMFILE`, decide who is refused.
//! - **bodies**: at most [BODY_LIMIT_BYTES] (the app refuses more with 413).
//!
//! A connection is kept alive through every refusal ([answer_keeping_alive]): an answer given
//! before the request's body was read (a bad query, no token, a write over the rate...) drains
//! the body when it is small enough, or says `Connection: close`; hyper alone would close the
//! connection without a word, and a pooled client would send its next request into it.
//!
//! A request hyper refuses before the app sees it (a head it cannot parse, a URI over 64 KiB,
//! a head over its buffer) is answered with a problem too ([early]), on a new connection; the
//! app bounds URIs and heads well below hyper's, with problems of its own.
//!
//! `axum::serve` has none of these knobs (it says so itself), so this is its loop with them.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::locked::Locked;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tower::Service;

mod early;
mod keep_alive;
pub use early::EarlyAnswer;
use keep_alive::answer_keeping_alive;

/// Largest request body the server takes: well below ZooKeeper's 1 MB `jute.maxbuffer`.
pub const BODY_LIMIT_BYTES: usize = 512 * 1024;

/// Requests one HTTP/2 connection may carry at once: enough for a client's long polls (a
/// principal may hold 1,000 by default) on one connection.
pub const H2_MAX_STREAMS: u32 = 1_024;

/// When a request's head had been read and the request was handed to the application: where
/// its time in zkgate starts (its queueing delay, its stages in `/metrics`).
#[derive(Clone, Copy, Debug)]
pub struct Arrived(pub tokio::time::Instant);

/// The address a request came from, put in its extensions here (absent for requests built
/// in-process).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub IpAddr);

/// How connections are bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
    pub max_per_address: usize,
}

/// The connections open now, in all and per client address.
#[derive(Default)]
pub struct Caps {
    limits: Option<Limits>,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    /// Sent whenever a connection is counted or goes, for [Caps::wait_open].
    changed: tokio::sync::watch::Sender<()>,
}

/// One connection counted in [Caps] until it is dropped (with the connection's IO).
pub struct Slot {
    caps: Arc<Caps>,
    address: IpAddr,
}

impl Caps {
    pub fn new(limits: Limits) -> Arc<Caps> {
        Arc::new(Caps {
            limits: Some(limits),
            open: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(()),
        })
    }

    /// A slot for a connection from `address`, or `None` past a cap.
    pub fn take(self: &Arc<Caps>, address: IpAddr) -> Option<Slot> {
        let limits = self.limits?;
        let mut open = self.open.locked();
        let (total, per_address) = &mut *open;
        let mine = per_address.entry(address).or_default();
        if *total >= limits.max_connections || *mine >= limits.max_per_address {
            return None;
        }
        *mine += 1;
        *total += 1;
        self.changed.send_replace(());
        Some(Slot {
            caps: self.clone(),
            address,
        })
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.open.locked().0
    }

    /// Waits until `test` accepts the number of connections open (a drain, or a test
    /// waiting for connections to be accepted).
    pub async fn wait_open(&self, test: impl Fn(usize) -> bool) {
        // Subscribed before looking, so that a change after the look is not missed.
        let mut changes = self.changed.subscribe();
        while !test(self.open()) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.caps.open.locked();
        let (total, per_address) = &mut *open;
        *total = total.saturating_sub(1);
        crate::locked::count_down(per_address, &self.address);
        drop(open);
        self.caps.changed.send_replace(());
    }
}

/// A connection's IO, carrying its [Slot]: through an upgrade the IO moves to the WebSocket,
/// and the slot with it. Its writes fail once one has waited [Limits::write_timeout] for the
/// client to take anything: a client that stops reading (its TCP window full, or gone without
/// a word) would otherwise hold the connection, and a stream's subscriptions, for ever. Its
/// first answer goes out as a problem if hyper made it ([early]).
struct Counted<IO> {
    io: IO,
    _slot: Slot,
    write_timeout: Duration,
    first: early::First,
    /// Set while writes are blocked: when they give up.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Counted<IO> {
    fn new(io: IO, slot: Slot, write_timeout: Duration, early: EarlyAnswer) -> Counted<IO> {
        Counted {
            io,
            _slot: slot,
            write_timeout,
            first: early::First::Ahead(early),
            stalled: None,
        }
    }

    /// What a write that `poll` answered comes to: progress clears the stall, a wait starts
    /// (or continues) its timer, and a wait past it is an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.write_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took nothing for {timeout:?} (--write-timeout)"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = this
            .first
            .poll_write(buf, |bytes| Pin::new(&mut this.io).poll_write(cx, bytes));
        self.watch(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.first.pending() {
            // A first write of one part may be hyper's head: looked at as a plain write.
            if let [one] = bufs {
                return self.poll_write(cx, one);
            }
            self.first = early::First::Through;
        }
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Where connections come from.
pub enum Listener {
    Plain(TcpListener),
    Tls(TlsListener),
}

/// Serves `app` on `listener` until `shutdown`, then stops accepting, lets each connection
/// finish its request in flight (keep-alive off), and returns once all have closed.
pub async fn serve<A: App>(
    listener: Listener,
    caps: Arc<Caps>,
    app: A,
    early: EarlyAnswer,
    shutdown: CancellationToken,
) {
    let header_timeout = caps.limits.map_or(Duration::from_secs(30), |l| l.header_timeout);
    let write_timeout = caps.limits.map_or(Duration::from_secs(45), |l| l.write_timeout);
    let (signal, signalled) = watch::channel(());
    let (closed, all_closed) = watch::channel(());
    let connection = |peer| Connection {
        app: app.clone(),
        peer,
        header_timeout,
        signalled: signalled.clone(),
        closed: all_closed.clone(),
    };
    match listener {
        Listener::Plain(tcp) => loop {
            let (stream, peer, slot) = tokio::select! {
                accepted = accept(&tcp, &caps) => accepted,
                _ = shutdown.cancelled() => break,
            };
            tokio::spawn(connection(peer).serve(Counted::new(stream, slot, write_timeout, early)));
        },
        Listener::Tls(mut tls) => loop {
            let accepted = tokio::select! {
                accepted = tls.next() => accepted,
                _ = shutdown.cancelled() => break,
            };
            let Some((stream, peer, slot)) = accepted else { break };
            tokio::spawn(connection(peer).serve(Counted::new(stream, slot, write_timeout, early)));
        },
    }
    drop(all_closed);
    let _ = signal.send(());
    closed.closed().await;
}

/// What is served: a service of requests with axum's body, which answers every one.
pub trait App:
    Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static> + Clone + Send + Sync + 'static
{
}

impl<A> App for A where
    A: Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// One connection being served.
struct Connection<A> {
    app: A,
    peer: SocketAddr,
    header_timeout: Duration,
    signalled: watch::Receiver<()>,
    /// Held while the connection lives: the server waits for every one to drop it.
    closed: watch::Receiver<()>,
}

impl<A: App> Connection<A> {
    async fn serve<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: IO) {
        let peer = self.peer;
        let (app, drain_timeout) = (self.app.clone(), self.header_timeout);
        // Whether a request has started on the connection (see `first_request` below).
        let started = Arc::new(AtomicBool::new(false));
        let app = {
            let started = started.clone();
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                started.store(true, Ordering::Relaxed);
                // The client's address, for the limits per address.
                request.extensions_mut().insert(ClientAddr(peer.ip()));
                request.extensions_mut().insert(Arrived(tokio::time::Instant::now()));
                answer_keeping_alive(app.clone(), request, drain_timeout)
            })
        };
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_STREAMS)
            .keep_alive_interval(self.header_timeout)
            .keep_alive_timeout(self.header_timeout);
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), app);
        let mut connection = pin!(connection);
        // The first request must start within the header timeout: hyper's own timeout begins
        // only once the protocol is known, and telling HTTP/2 from HTTP/1.1 waits for bytes.
        let first_request = tokio::time::sleep(self.header_timeout);
        let mut first_request = pin!(first_request);
        let mut waiting_first = true;
        let mut shutting_down = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%peer, error = %err, "connection ended");
                    }
                    break;
                }
                _ = self.signalled.changed(), if !shutting_down => {
                    shutting_down = true;
                    connection.as_mut().graceful_shutdown();
                }
                _ = first_request.as_mut(), if waiting_first => {
                    waiting_first = false;
                    if !started.load(Ordering::Relaxed) {
                        tracing::debug!(%peer, "no request within the header timeout: closed");
                        break;
                    }
                }
            }
        }
        drop(self.closed);
    }
}

/// Longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server.
const READY_QUEUE: usize = 128;

/// A listener whose connections are TLS: each counted in [Caps] from its TCP accept, before its
/// handshake costs anything.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr, Slot)>,
}

impl TlsListener {
    /// Accepts on `tcp` in the background (until the listener is dropped).
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor, caps: Arc<Caps>) -> TlsListener {
        let (deliver, ready) = mpsc::channel(READY_QUEUE);
        tokio::spawn(accept_loop(tcp, acceptor, caps, deliver));
        TlsListener { ready }
    }

    /// The next handshaken connection; `None` once the accept loop has stopped.
    pub async fn next(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr, Slot)> {
        self.ready.recv().await
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    caps: Arc<Caps>,
    deliver: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr, Slot)>,
) {
    loop {
        let (stream, peer, slot) = tokio::select! {
            accepted = accept(&tcp, &caps) => accepted,
            _ = deliver.closed() => return,
        };
        let (acceptor, deliver) = (acceptor.clone(), deliver.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = deliver.send((tls, peer, slot)).await;
                }
                Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// The next connection on `tcp` within the caps, with its slot. One past a cap is closed at once
/// (dropping the stream); a failed accept (out of file descriptors and the like) backs off
/// instead of spinning.
async fn accept(tcp: &TcpListener, caps: &Arc<Caps>) -> (TcpStream, SocketAddr, Slot) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = caps.take(peer.ip()) else {
            tracing::debug!(%peer, "connection refused: too many open");
            continue;
        };
        // Small request/response exchanges: do not let Nagle's algorithm hold a reply back.
        let _ = stream.set_nodelay(true);
        return (stream, peer, slot);
    }
}

/// Raises the process's open-file limit to its hard limit, and returns the limit in force.
pub fn raise_open_files() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let wanted = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            limit = wanted;
        }
    }
    Ok(limit.rlim_cur)
}
