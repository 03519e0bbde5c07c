//! The raw floor: what a native ZooKeeper client must do for an uncontended lock cycle with
//! zookeeper-client: create an ephemeral sequential contender, list the lock's children,
//! delete the contender; and the durable floor, zkgate's own cycle shape on the raw client.

use std::time::{Duration, Instant};

use zookeeper_client::{Acls, Client, CreateMode, EventType, MultiWriteResult};

pub struct Floor {
    client: Client,
    /// As many sessions as zkgate opens by default, for the contended workloads.
    sessions: Vec<Client>,
    dir: &'static str,
    prefix: String,
    /// The load's locks made already (the warm-up makes each), so that a measured cycle sends
    /// only the recipe's requests.
    made: std::sync::Mutex<std::collections::HashSet<usize>>,
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
            made: Default::default(),
        }
    }

    /// `count` multi-ops of `ops` `setData`s each (`0`: single `setData`s instead), one after
    /// the other, of the nodes `/bench-floor-kv/k<i>` (made first): what a transaction of puts
    /// of existing keys costs ZooKeeper, with nothing read or pinned.
    pub async fn kv_writes(&self, ops: usize, count: usize) -> Vec<Duration> {
        let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let _ = self.client.create("/bench-floor-kv", &[], &options).await;
        for i in 0..ops.max(1) {
            let _ = self
                .client
                .create(&format!("/bench-floor-kv/k{i}"), b"v", &options)
                .await;
        }
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            match ops {
                0 => {
                    self.client
                        .set_data("/bench-floor-kv/k0", b"v", None)
                        .await
                        .expect("set");
                }
                ops => {
                    let mut multi = self.client.new_multi_writer();
                    for i in 0..ops {
                        multi
                            .add_set_data(&format!("/bench-floor-kv/k{i}"), b"v", None)
                            .expect("op");
                    }
                    multi.commit().await.expect("multi");
                }
            }
            samples.push(start.elapsed());
        }
        samples
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
        let dir = self.load_lock(client, lock).await;
        let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
        recipe_cycle(client, &dir, &prefix).await
    }

    /// The path of the load's lock `lock`, made if this floor has not made it yet.
    async fn load_lock(&self, client: &Client, lock: usize) -> String {
        let dir = format!("{}/load-{lock}", self.dir);
        let known = self.made.lock().expect("made locks").contains(&lock);
        if !known {
            let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
            let _ = client.create(&dir, &[], &persistent).await;
            self.made.lock().expect("made locks").insert(lock);
        }
        dir
    }
}

/// How many lease records the durable floor's cycles take turns on (as the load's 32 leases).
const DURABLE_LEASES: usize = 32;

impl Floor {
    /// Makes the lease records [Floor::durable_acquired_at] guards its writes with.
    pub async fn prepare_durable(&self) {
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let leases = format!("{}/leases", self.dir);
        let _ = self.client.create(&leases, &[], &persistent).await;
        for lease in 0..DURABLE_LEASES {
            let _ = self
                .client
                .create(&format!("{leases}/lease-{lease}"), &[], &persistent)
                .await;
        }
    }

    /// The *durable floor*: zkgate's cycle shape on the raw client, without HTTP or zkgate.
    /// The acquire is one multi-op guarded by a lease record's version (check the record,
    /// create a reference under it, stamp the reference, create a persistent sequential
    /// contender) with the listing sent behind it; the release one multi-op deleting the
    /// contender and the reference. Against the plain recipe (ephemeral contender, no
    /// reference) it is the price of holdings that outlive a session; against zkgate, the
    /// price of the gateway. Lock `/bench-floor/load-<lock>` (made if missing), session `i` in
    /// turn, lease record `i % 32` ([Floor::prepare_durable] first): when it was granted.
    pub async fn durable_acquired_at(&self, i: usize, lock: usize) -> Instant {
        let client = &self.sessions[i % self.sessions.len()];
        let dir = self.load_lock(client, lock).await;
        let record = format!("{}/leases/lease-{}", self.dir, i % DURABLE_LEASES);
        let reference = format!("{record}/{}", uuid::Uuid::new_v4());
        let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let mut multi = client.new_multi_writer();
        multi.add_check_version(&record, 0).expect("check");
        multi.add_create(&reference, b"reference", &persistent).expect("create");
        multi.add_set_data(&reference, b"reference", Some(0)).expect("stamp");
        let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        multi.add_create(&prefix, b"", &sequential).expect("create");
        let (committed, listed) = tokio::join!(multi.commit(), client.list_children(&dir));
        let created = match committed.expect("acquire multi-op").pop() {
            Some(MultiWriteResult::Create { path, .. }) => path,
            other => panic!("the contender's create answered {other:?}"),
        };
        let sequence = created
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .expect("sequence");
        let granted = wait_turn(client, &dir, sequence, listed.expect("list")).await;
        let mut release = client.new_multi_writer();
        release.add_delete(&created, None).expect("delete");
        release.add_delete(&reference, Some(1)).expect("delete");
        release.commit().await.expect("release multi-op");
        granted
    }
}

/// One acquire and release of the lock at `dir` by the ZooKeeper guide's recipe: when it was
/// granted.
async fn recipe_cycle(client: &Client, dir: &str, prefix: &str) -> Instant {
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (created, listed) = tokio::join!(client.create(prefix, b"", &options), client.list_children(dir));
    let sequence = created.expect("create").1.into_i64();
    let granted = wait_turn(client, dir, sequence, listed.expect("list")).await;
    client
        .delete(&format!("{prefix}{sequence:010}"), None)
        .await
        .expect("delete");
    granted
}

/// The recipe's wait: while a contender of `dir` with a lower sequence than `sequence` is in
/// `children`, watch the next lower one and list again once it goes. When the turn came.
async fn wait_turn(client: &Client, dir: &str, sequence: i64, mut children: Vec<String>) -> Instant {
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
    Instant::now()
}
