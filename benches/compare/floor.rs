//! The raw floor: what a native ZooKeeper client must do for an uncontended lock cycle with
//! zookeeper-client: create an ephemeral sequential contender, list the lock's children,
//! delete the contender.

use std::time::{Duration, Instant};

use zookeeper_client::{Acls, Client, CreateMode};

pub struct Floor {
    client: Client,
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
        Floor { client, dir, prefix }
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
}
