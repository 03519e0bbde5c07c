//! A TCP proxy between zkgate and ZooKeeper that can cut every connection and refuse new ones
//! for a while: a network partition on loopback.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    blocked: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (blocked, _) = watch::channel(false);
        let target = target.to_string();
        let blocked_rx = blocked.subscribe();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *blocked_rx.borrow() {
                    drop(inbound); // partitioned: the connection is refused
                    continue;
                }
                tokio::spawn(forward(inbound, target.clone(), blocked_rx.clone()));
            }
        });
        Proxy { addr, blocked, task }
    }

    /// The connect string to give zkgate.
    pub fn connect_string(&self) -> String {
        self.addr.to_string()
    }

    /// Cuts every open connection and refuses new ones until [Proxy::heal].
    pub fn partition(&self) {
        self.blocked.send_replace(true);
    }

    pub fn heal(&self) {
        self.blocked.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(mut inbound: TcpStream, target: String, mut blocked: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(&target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = blocked.wait_for(|b| *b) => {}
    }
}
