//! A TCP proxy between zkgate and ZooKeeper that injects network faults on loopback:
//! a partition (cut every connection, refuse new ones) and the lost create reply of the
//! recipes guide (forward a create, let the server apply it, drop its reply with the
//! connection, so the client cannot know whether it happened). A cut closes the connection
//! cleanly (FIN) by default, or with a reset (RST, as from a host that died) after
//! [Proxy::reset_on_cut]: clients report the two differently. A black hole
//! ([Proxy::black_hole]) keeps the connections open but forwards nothing until lifted, as a
//! network that silently drops everything.
//!
//! To find creates and their replies it reads ZooKeeper's framing: every packet is a 4-byte
//! big-endian length and a body; after the connect handshake (first packet each way), a
//! request body starts with `xid: i32, type: i32` and a reply body with `xid: i32`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// ZooKeeper request types that create a znode: create, create2, createContainer, createTTL.
const CREATE_TYPES: [i32; 4] = [1, 15, 19, 21];

pub struct Proxy {
    pub addr: SocketAddr,
    /// The chroot of the connect string it was given (a test's root on a shared server),
    /// kept on the one it gives.
    chroot: String,
    blocked: Arc<watch::Sender<bool>>,
    drop_next_create_reply: Arc<AtomicBool>,
    /// How many create replies were dropped (to wait on).
    create_replies_dropped: Arc<watch::Sender<usize>>,
    /// What the path of a create whose reply is lost contains.
    doomed_path: Arc<std::sync::Mutex<String>>,
    /// Whether dropping the armed reply partitions the proxy too (see
    /// [Proxy::lose_next_create_reply_and_partition]).
    partition_on_loss: Arc<AtomicBool>,
    reset_on_cut: Arc<AtomicBool>,
    silent: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target` (a connect
    /// string: `host:port`, with a chroot or without).
    pub async fn start(target: &str) -> Proxy {
        let (target, chroot) = target.split_at(target.find('/').unwrap_or(target.len()));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let blocked = Arc::new(watch::channel(false).0);
        let (silent, _) = watch::channel(false);
        let faults = Faults {
            blocked: blocked.clone(),
            drop_next_create_reply: Arc::new(AtomicBool::new(false)),
            create_replies_dropped: Arc::new(watch::channel(0).0),
            doomed_path: Arc::new(std::sync::Mutex::new(LOCK_CONTENDER.to_string())),
            partition_on_loss: Arc::new(AtomicBool::new(false)),
            reset_on_cut: Arc::new(AtomicBool::new(false)),
            silent: silent.subscribe(),
        };
        let (drop_next_create_reply, create_replies_dropped, doomed_path, partition_on_loss, reset_on_cut) = (
            faults.drop_next_create_reply.clone(),
            faults.create_replies_dropped.clone(),
            faults.doomed_path.clone(),
            faults.partition_on_loss.clone(),
            faults.reset_on_cut.clone(),
        );
        let target = target.to_string();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *faults.blocked.borrow() {
                    drop(inbound); // partitioned: the connection is refused
                    continue;
                }
                tokio::spawn(forward(inbound, target.clone(), faults.clone()));
            }
        });
        Proxy {
            addr,
            chroot: chroot.to_string(),
            blocked,
            drop_next_create_reply,
            create_replies_dropped,
            doomed_path,
            partition_on_loss,
            reset_on_cut,
            silent,
            task,
        }
    }

    /// The connect string to give zkgate (with the chroot of the target's).
    pub fn connect_string(&self) -> String {
        format!("{}{}", self.addr, self.chroot)
    }

    /// Cuts every open connection and refuses new ones until [Proxy::heal].
    pub fn partition(&self) {
        self.blocked.send_replace(true);
    }

    pub fn heal(&self) {
        self.blocked.send_replace(false);
    }

    /// Arms the lost-create-reply fault for the next lock contender create that succeeds.
    pub fn lose_next_create_reply(&self) {
        self.lose_next_create_reply_of(LOCK_CONTENDER);
    }

    /// Arms the lost-create-reply fault for the next create (alone or in a multi-op) whose path
    /// contains `path` and that succeeds.
    pub fn lose_next_create_reply_of(&self, path: impl Into<String>) {
        *self.doomed_path.lock().expect("lock") = path.into();
        self.drop_next_create_reply.store(true, Ordering::SeqCst);
    }

    /// [Proxy::lose_next_create_reply_of], and the proxy is partitioned in the same moment
    /// (until [Proxy::heal]): the client cannot look at what became of its request until the
    /// test lets it, and the test can change things meanwhile.
    pub fn lose_next_create_reply_and_partition(&self, path: impl Into<String>) {
        self.partition_on_loss.store(true, Ordering::SeqCst);
        self.lose_next_create_reply_of(path);
    }

    /// Waits (bounded) until `count` create replies have been dropped in all.
    pub async fn create_replies_lost_reach(&self, count: usize) {
        let mut dropped = self.create_replies_dropped.subscribe();
        super::within(
            std::time::Duration::from_secs(30),
            "a create's reply to be lost",
            async {
                dropped.wait_for(|n| *n >= count).await.expect("the proxy runs");
            },
        )
        .await;
    }

    /// Stops forwarding anything, either way, on every connection (open ones stay open, new
    /// ones are accepted), until called with `false`.
    pub fn black_hole(&self, silent: bool) {
        self.silent.send_replace(silent);
    }

    /// From now on, connections accepted by the proxy are cut with a TCP reset instead of a
    /// clean close, so the client's next read or write fails with an I/O error.
    pub fn reset_on_cut(&self) {
        self.reset_on_cut.store(true, Ordering::SeqCst);
    }

    /// How many creates were applied by the server with their replies dropped.
    pub fn create_replies_lost(&self) -> usize {
        *self.create_replies_dropped.borrow()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Faults {
    blocked: Arc<watch::Sender<bool>>,
    drop_next_create_reply: Arc<AtomicBool>,
    create_replies_dropped: Arc<watch::Sender<usize>>,
    doomed_path: Arc<std::sync::Mutex<String>>,
    partition_on_loss: Arc<AtomicBool>,
    reset_on_cut: Arc<AtomicBool>,
    silent: watch::Receiver<bool>,
}

async fn forward(inbound: TcpStream, target: String, faults: Faults) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    if faults.reset_on_cut.load(Ordering::SeqCst) {
        // With a zero linger, dropping the socket sends RST instead of FIN.
        inbound.set_zero_linger().expect("SO_LINGER on the proxy's client side");
    }
    let (client_read, mut client_write) = inbound.into_split();
    let (server_read, server_write) = outbound.into_split();
    // The xid of a create whose reply must be swallowed, set by the client-to-server pump.
    let (doomed_tx, doomed_rx) = watch::channel(None::<i32>);
    let doomed_path = faults.doomed_path.clone();
    let upstream = pump(client_read, server_write, faults.silent.clone(), move |body| {
        if is_create_of(body, &doomed_path.lock().expect("lock")) {
            let xid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            doomed_tx.send_replace(Some(xid));
        }
        Verdict::Forward
    });
    let armed = faults.drop_next_create_reply.clone();
    let dropped = faults.create_replies_dropped.clone();
    let (partition_on_loss, blocked) = (faults.partition_on_loss.clone(), faults.blocked.clone());
    let downstream = pump(server_read, &mut client_write, faults.silent.clone(), move |body| {
        let xid = (body.len() >= 4).then(|| i32::from_be_bytes([body[0], body[1], body[2], body[3]]));
        if xid.is_some() && xid == *doomed_rx.borrow() && is_success(body) && armed.swap(false, Ordering::SeqCst) {
            if partition_on_loss.swap(false, Ordering::SeqCst) {
                blocked.send_replace(true);
            }
            dropped.send_modify(|n| *n += 1);
            return Verdict::Cut;
        }
        Verdict::Forward
    });
    let mut blocked = faults.blocked.subscribe();
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = blocked.wait_for(|b| *b) => {}
    }
    if faults.reset_on_cut.load(Ordering::SeqCst) {
        // Dropping the write half would send FIN first (it shuts down writing), and the
        // client would read a clean end of stream before the reset.
        client_write.forget();
    }
}

/// ZooKeeper's multi-op request type: a contender is created in one, with its lease's
/// reference to it.
const MULTI: i32 = 14;

/// What a lock contender's path contains.
const LOCK_CONTENDER: &str = "-lock-";

/// Whether a request body creates a znode whose path contains `pattern`: a create (its type
/// is the second i32) whose path (a length-prefixed string after the header) has it, or a
/// multi-op that creates one.
fn is_create_of(body: &[u8], pattern: &str) -> bool {
    let int = |at: usize| {
        body.get(at..at + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let Some(kind) = int(4) else { return false };
    if kind == MULTI {
        return CREATE_TYPES
            .iter()
            .any(|create| body.windows(4).any(|w| w == create.to_be_bytes()))
            && String::from_utf8_lossy(body).contains(pattern);
    }
    let Some(len) = int(8) else { return false };
    let path = body.get(12..12 + len.max(0) as usize).unwrap_or_default();
    CREATE_TYPES.contains(&kind) && String::from_utf8_lossy(path).contains(pattern)
}

/// Whether a reply body reports success (`xid: i32, zxid: i64, err: i32`).
fn is_success(body: &[u8]) -> bool {
    body.get(12..16).is_some_and(|b| b == [0, 0, 0, 0])
}

enum Verdict {
    Forward,
    Cut,
}

/// Copies packets from `from` to `to`, asking `inspect` about each one after the first (the
/// handshake); stops at EOF, an error, or a `Cut`.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut silent: watch::Receiver<bool>,
    mut inspect: impl FnMut(&[u8]) -> Verdict,
) {
    let mut first = true;
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut body = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
        if from.read_exact(&mut body).await.is_err() {
            return;
        }
        if !first && matches!(inspect(&body), Verdict::Cut) {
            return;
        }
        first = false;
        // A black hole holds everything back (the bytes stay in this pump, as in a queue of
        // a router that drops nothing but delivers nothing either) until it is lifted.
        if silent.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&len).await.is_err() || to.write_all(&body).await.is_err() {
            return;
        }
    }
}
