//! The HTTP server: accepts connections (plain or TLS), bounds them, and serves the app on them
//! with HTTP/1.1 and its upgrades (WebSockets).
//!
//! What a client can make the server hold is bounded here, before any request is read:
//! - **connections**: at most [Limits::max_connections] in all and
//!   [Limits::max_per_address] from one client address; one past either is closed at once (a
//!   TLS one before its handshake costs anything). A WebSocket keeps its connection's slot for
//!   as long as it lives, since the slot travels inside the connection's IO.
//! - **time**: a connection must send a complete request head within
//!   [Limits::header_timeout] of being accepted, and of finishing its previous response (hyper's
//!   header-read timeout also bounds keep-alive idleness); a partial head or a silent
//!   connection is closed then. A request being served (a long poll) is not cut. A response
//!   the client stops taking (a write that makes no progress for [Limits::write_timeout]: an
//!   event stream, a large read, a socket) fails, and the connection with it.
//! - **handshakes**: each TLS handshake runs in its own task, bounded by its own timeout, so a
//!   client that connects and sends nothing never holds up the accept loop.
//! - **files**: the process's open-file limit is raised to its hard limit at start, so that
//!   the caps, not `EMFILE`, decide who is refused.
//!
//! `axum::serve` has none of these knobs (it says so itself), so this is its loop with them.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::locked::Locked;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

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
        if let Some(mine) = per_address.get_mut(&self.address) {
            *mine -= 1;
            if *mine == 0 {
                per_address.remove(&self.address);
            }
        }
        drop(open);
        self.caps.changed.send_replace(());
    }
}

/// A connection's IO, carrying its [Slot]: through an upgrade the IO moves to the WebSocket,
/// and the slot with it. Its writes fail once one has waited [Limits::write_timeout] for the
/// client to take anything: a client that stops reading (its TCP window full, or gone without
/// a word) would otherwise hold the connection, and a stream's subscriptions, for ever.
struct Counted<IO> {
    io: IO,
    _slot: Slot,
    write_timeout: Duration,
    /// Set while writes are blocked: when they give up.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Counted<IO> {
    fn new(io: IO, slot: Slot, write_timeout: Duration) -> Counted<IO> {
        Counted {
            io,
            _slot: slot,
            write_timeout,
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
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
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
pub async fn serve(listener: Listener, caps: Arc<Caps>, app: Router, shutdown: CancellationToken) {
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
            let accepted = tokio::select! {
                accepted = tcp.accept() => accepted,
                _ = shutdown.cancelled() => break,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Past a cap: closed at once (dropping the stream).
            let Some(slot) = caps.take(peer.ip()) else {
                tracing::debug!(%peer, "connection refused: too many open");
                continue;
            };
            // Small request/response exchanges: do not let Nagle's algorithm hold a reply back.
            let _ = stream.set_nodelay(true);
            tokio::spawn(connection(peer).serve(Counted::new(stream, slot, write_timeout)));
        },
        Listener::Tls(mut tls) => loop {
            let accepted = tokio::select! {
                accepted = tls.next() => accepted,
                _ = shutdown.cancelled() => break,
            };
            let Some((stream, peer, slot)) = accepted else { break };
            tokio::spawn(connection(peer).serve(Counted::new(stream, slot, write_timeout)));
        },
    }
    drop(all_closed);
    let _ = signal.send(());
    closed.closed().await;
}

/// One connection being served.
struct Connection {
    app: Router,
    peer: SocketAddr,
    header_timeout: Duration,
    signalled: watch::Receiver<()>,
    /// Held while the connection lives: the server waits for every one to drop it.
    closed: watch::Receiver<()>,
}

impl Connection {
    async fn serve<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: IO) {
        let peer = self.peer;
        // The client's address, as `into_make_service_with_connect_info` would give it.
        let app = self
            .app
            .clone()
            .map_request(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        let connection = builder
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
            .with_upgrades();
        let mut connection = pin!(connection);
        let mut shutting_down = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%peer, timeout = err.is_timeout(), error = %err, "connection ended");
                    }
                    break;
                }
                _ = self.signalled.changed(), if !shutting_down => {
                    shutting_down = true;
                    connection.as_mut().graceful_shutdown();
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
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = deliver.closed() => return,
        };
        let Some(slot) = caps.take(peer.ip()) else {
            tracing::debug!(%peer, "connection refused: too many open");
            continue;
        };
        let _ = stream.set_nodelay(true);
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
