//! ZooKeeper's own hard quotas (3.7 and later): a limit in bytes (of data) and in znodes on a
//! subtree, kept by every server and enforced by each when it runs with
//! `zookeeper.enforceQuota=true`. A write past one fails with `QuotaExceeded` (a multi-op as a
//! whole), whichever instance of zkgate sends it, so a quota holds across instances and
//! survives their restarts.
//!
//! A quota on `/a/b` lives in `/zookeeper/quota/a/b/zookeeper_limits` (the limits, written by
//! whoever sets them) and `.../zookeeper_stats` (the usage, kept by the servers once the node
//! exists); a node counts against the quota of its nearest ancestor that has one (itself
//! included). The limits are read at each write, so changing them takes effect at once. The
//! paths are absolute: a session with a chroot sets and reads them through a clone without it.

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use super::retry_on_loss;

/// A subtree's hard limits (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub bytes: Option<u64>,
    pub znodes: Option<u64>,
}

/// What a subtree holds, as its quota's statistics count it: the bytes of its nodes' data and
/// its nodes (its root included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub bytes: i64,
    pub znodes: i64,
}

/// Which limit of a quota is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    Bytes,
    Znodes,
}

impl Limits {
    /// The limits node's data, in ZooKeeper's `StatsTrack` form.
    fn data(&self) -> String {
        let limit = |l: Option<u64>| l.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        format!(
            "count=-1,bytes=-1,countHardLimit={},byteHardLimit={}",
            limit(self.znodes),
            limit(self.bytes)
        )
    }

    fn parse(data: &[u8]) -> Limits {
        let fields = fields(data);
        let limit = |key| {
            fields
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| u64::try_from(*v).ok())
        };
        Limits {
            bytes: limit("byteHardLimit"),
            znodes: limit("countHardLimit"),
        }
    }

    /// The limit that `more` bytes and znodes would pass, on top of `usage`, if any: the
    /// servers' own test.
    pub fn reached(&self, usage: Usage, more: Usage) -> Option<Reached> {
        let past = |limit: Option<u64>, used: i64, more: i64| {
            limit.is_some_and(|l| i64::try_from(l).unwrap_or(i64::MAX) < used.saturating_add(more))
        };
        if past(self.znodes, usage.znodes, more.znodes) {
            Some(Reached::Znodes)
        } else if past(self.bytes, usage.bytes, more.bytes) {
            Some(Reached::Bytes)
        } else {
            None
        }
    }
}

impl Usage {
    fn parse(data: &[u8]) -> Usage {
        let fields = fields(data);
        let value = |key| fields.iter().find(|(k, _)| *k == key).map_or(0, |(_, v)| *v);
        Usage {
            bytes: value("bytes"),
            znodes: value("count"),
        }
    }
}

/// `key=value,key=value` with integer values.
fn fields(data: &[u8]) -> Vec<(&str, i64)> {
    std::str::from_utf8(data)
        .unwrap_or_default()
        .split(',')
        .filter_map(|field| {
            let (key, value) = field.split_once('=')?;
            Some((key.trim(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The session of `client` without its chroot, and the absolute path of `path`.
fn absolute(client: &Client, path: &str) -> (Client, String) {
    let chroot = client.path().trim_end_matches('/');
    let admin = client.clone().chroot("/").unwrap_or_else(|same| same);
    (admin, format!("{chroot}{path}"))
}

fn quota_dir(absolute: &str) -> String {
    format!("/zookeeper/quota{absolute}")
}

/// Sets the hard limits of the subtree at `path` (relative to `client`'s chroot; it must
/// exist), creating the quota or changing its limits. Safe to call from several instances at
/// once.
pub async fn set(client: &Client, path: &str, limits: Limits) -> Result<(), ZkError> {
    let (admin, absolute) = absolute(client, path);
    let dir = quota_dir(&absolute);
    let limits_path = format!("{dir}/zookeeper_limits");
    let wanted = limits.data();
    loop {
        match retry_on_loss(|| admin.get_data(&limits_path)).await {
            Ok((data, _)) if data == wanted.as_bytes() => return Ok(()),
            Ok((_, stat)) => {
                match retry_on_loss(|| admin.set_data(&limits_path, wanted.as_bytes(), Some(stat.version))).await {
                    Ok(_) => return Ok(()),
                    Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                    Err(err) => return Err(err),
                }
            }
            Err(ZkError::NoNode) => {}
            Err(err) => return Err(err),
        }
        super::session::ensure_path(&admin, &dir).await?;
        // The limits, then the statistics: creating the statistics node is what makes the
        // servers count the subtree's current usage into it.
        let mode = CreateMode::Persistent.with_acls(super::acls());
        let mut multi = super::Multi::new(&admin);
        multi.create((), &limits_path, wanted.as_bytes(), &mode)?;
        multi.create((), &format!("{dir}/zookeeper_stats"), b"count=0,bytes=0", &mode)?;
        match multi.commit().await {
            Ok(_) => return Ok(()),
            // Another instance (or a lost reply of ours) made it: compare again.
            Err(super::Failed::Refused {
                error: ZkError::NodeExists,
                ..
            }) => continue,
            Err(failed) if failed.is_loss() => continue,
            Err(failed) => return Err(failed.error()),
        }
    }
}

/// The usage and limits of the quota on `path`, in one round trip; `None` if it has none.
pub async fn read(client: &Client, path: &str) -> Result<Option<(Usage, Limits)>, ZkError> {
    Ok(read_many(client, &[path]).await?.pop().flatten())
}

/// [read] for each of `paths`, in one round trip.
pub async fn read_many(client: &Client, paths: &[&str]) -> Result<Vec<Option<(Usage, Limits)>>, ZkError> {
    let (admin, _) = absolute(client, "/");
    let dirs: Vec<String> = paths.iter().map(|p| quota_dir(&absolute(client, p).1)).collect();
    let results = retry_on_loss(|| {
        let mut reader = admin.new_multi_reader();
        for dir in &dirs {
            let _ = reader.add_get_data(&format!("{dir}/zookeeper_stats"));
            let _ = reader.add_get_data(&format!("{dir}/zookeeper_limits"));
        }
        reader.commit()
    })
    .await?;
    Ok(results
        .chunks(2)
        .map(|pair| match pair {
            [
                zookeeper_client::MultiReadResult::Data { data: stats, .. },
                zookeeper_client::MultiReadResult::Data { data: limits, .. },
            ] => Some((Usage::parse(stats), Limits::parse(limits))),
            _ => None,
        })
        .collect())
}

/// Whether the server `client` is connected to enforces quotas: it tries to create a child of
/// `probe` (relative to the chroot), a node whose quota allows no more than itself. The child
/// is deleted again if it was created (the server does not enforce).
pub async fn enforced(client: &Client, probe: &str) -> Result<bool, ZkError> {
    super::session::ensure_path(client, probe).await?;
    let just_itself = Limits {
        bytes: None,
        znodes: Some(1),
    };
    set(client, probe, just_itself).await?;
    let child = format!("{probe}/child");
    let mode = CreateMode::Ephemeral.with_acls(super::acls());
    match retry_on_loss(|| client.create(&child, &[], &mode)).await {
        Err(ZkError::QuotaExceeded) => Ok(true),
        Ok(_) | Err(ZkError::NodeExists) => {
            let _ = retry_on_loss(|| client.delete(&child, None)).await;
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_usage_read_zookeepers_form() {
        let limits = Limits {
            bytes: Some(1024),
            znodes: None,
        };
        assert_eq!(limits.data(), "count=-1,bytes=-1,countHardLimit=-1,byteHardLimit=1024");
        assert_eq!(Limits::parse(limits.data().as_bytes()), limits);
        assert_eq!(Usage::parse(b"count=4,bytes=6"), Usage { bytes: 6, znodes: 4 });
    }

    #[test]
    fn a_limit_is_reached_when_a_write_would_pass_it() {
        let limits = Limits {
            bytes: Some(100),
            znodes: Some(3),
        };
        let usage = |bytes, znodes| Usage { bytes, znodes };
        assert_eq!(limits.reached(usage(10, 2), usage(0, 1)), None);
        assert_eq!(limits.reached(usage(10, 3), usage(0, 1)), Some(Reached::Znodes));
        assert_eq!(limits.reached(usage(95, 1), usage(10, 1)), Some(Reached::Bytes));
        assert_eq!(
            limits.reached(usage(95, 1), usage(5, 1)),
            None,
            "up to the limit itself"
        );
        assert_eq!(Limits::default().reached(usage(1 << 40, 1 << 40), usage(1, 1)), None);
    }
}
