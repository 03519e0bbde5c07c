//! The raw floor: what a native ZooKeeper client must do for an uncontended lock cycle with
//! zookeeper-client: create an ephemeral sequential contender, list the lock's children,
//! delete the contender.

use std::time::{Duration, Instant};

use zookeeper_client::{Acls, Client, CreateMode, EventType};

pub struct Floor {
    client: Client,
    /// As many sessions as zkgate opens by default, for the contended workloads.
    sessions: Vec<Client>,
    dir: &'static str,
    prefix: String,
}

impl Floor {
    pub async fn connect(connect: &str) -> Floor {
        let client = Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(connect)
            .await
            .expect("connect");
        let dir = "/bench-floor";
        let _ = client
            .create(dir, &[], &CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .await;
        let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
        let mut sessions = vec![client.clone()];
        for _ in 1..zkgate::config::DEFAULT_ZOOKEEPER_SESSIONS {
            let session = Client::connector()
                .with_session_timeout(Duration::from_secs(10))
                .connect(connect)
                .await
                .expect("connect");
            sessions.push(session);
        }
        // As zkgate does (zookeeper-client leaves Nagle's algorithm on, which costs a pipelined
        // pair a round trip): the floor is the best a native client can do.
        zkgate::zk::nodelay::disable_nagle_towards(&zkgate::zk::nodelay::server_ports(connect));
        Floor {
            client,
            sessions,
            dir,
            prefix,
        }
    }

    /// Create, then list, then delete: three round trips one after the other.
    pub async fn serial(&self, count: usize) -> Vec<Duration> {
        self.cycles(count, false).await
    }

    /// The create and the listing sent together (a session's requests are served in order,
    /// so the listing sees the new node), then the delete: two round trips.
    pub async fn pipelined(&self, count: usize) -> Vec<Duration> {
        self.cycles(count, true).await
    }

    async fn cycles(&self, count: usize, pipelined: bool) -> Vec<Duration> {
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            let sequence = if pipelined {
                let (created, listed) = tokio::join!(
                    self.client.create(&self.prefix, b"", &options),
                    self.client.list_children(self.dir)
                );
                assert!(!listed.expect("list").is_empty());
                created.expect("create").1
            } else {
                let (_, sequence) = self.client.create(&self.prefix, b"", &options).await.expect("create");
                assert!(!self.client.list_children(self.dir).await.expect("list").is_empty());
                sequence
            };
            self.client
                .delete(&format!("{}{sequence}", self.prefix), None)
                .await
                .expect("delete");
            samples.push(start.elapsed());
        }
        samples
    }

    /// The lock recipe itself on as many sessions as zkgate opens by default (client `i` on
    /// session `i % sessions`, as zkgate gives leases sessions in turn), `clients` tasks on
    /// `locks` locks (task `i` on lock `i % locks`) for `duration`: grants per second. Each
    /// cycle: create + list together, then while not lowest an exists-watch on the next lower
    /// node and a new listing once it goes, then the delete. No HTTP, no lease, no bookkeeping:
    /// what ZooKeeper and those sessions can do on this machine.
    pub async fn contended(&self, clients: usize, locks: usize, duration: Duration) -> f64 {
        super::stats::rate(clients, duration, |i, deadline| {
            let client = self.sessions[i % self.sessions.len()].clone();
            let dir = format!("{}/c{locks}-{}", self.dir, i % locks);
            async move {
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                let _ = client.create(&dir, &[], &persistent).await;
                let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
                let mut granted = 0;
                while Instant::now() < deadline {
                    recipe_cycle(&client, &dir, &prefix).await;
                    if Instant::now() < deadline {
                        granted += 1;
                    }
                }
                granted
            }
        })
        .await
    }
}

impl Floor {
    /// The recipe on lock `/bench-floor/load-<lock>` (made if missing), on session `i` in
    /// turn: when it was granted (before the release).
    pub async fn acquired_at(&self, i: usize, lock: usize) -> Instant {
        let client = &self.sessions[i % self.sessions.len()];
        let dir = format!("{}/load-{lock}", self.dir);
        let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        if client.check_stat(&dir).await.expect("exists").is_none() {
            let _ = client.create(&dir, &[], &persistent).await;
        }
        recipe_cycle(client, &dir, &prefix).await
    }
}

/// One acquire and release of the lock at `dir` by the ZooKeeper guide's recipe: when it was
/// granted.
async fn recipe_cycle(client: &Client, dir: &str, prefix: &str) -> Instant {
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (created, listed) = tokio::join!(client.create(prefix, b"", &options), client.list_children(dir));
    let sequence = created.expect("create").1.into_i64();
    let mut children = listed.expect("list");
    loop {
        let mut lower: Vec<(i64, &String)> = children
            .iter()
            .filter_map(|c| Some((c.rsplit('-').next()?.parse::<i64>().ok()?, c)))
            .filter(|(s, _)| *s < sequence)
            .collect();
        lower.sort();
        let Some((_, predecessor)) = lower.last() else {
            break;
        };
        let path = format!("{dir}/{predecessor}");
        if let (Some(_), watcher) = client.check_and_watch_stat(&path).await.expect("exists") {
            assert_eq!(watcher.changed().await.event_type, EventType::NodeDeleted);
        }
        children = client.list_children(dir).await.expect("list");
    }
    let granted = Instant::now();
    client
        .delete(&format!("{prefix}{sequence:010}"), None)
        .await
        .expect("delete");
    granted
}
