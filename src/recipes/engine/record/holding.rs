//! The holding records under a lease's record: one per thing the lease holds, saying what it
//! is and where its znodes are, so that any instance finds them and a new keeper takes their
//! task over (see [super]).

use super::*;
use crate::kind::Kind;

/// What a lease holds, as the holding record under its record says: enough for any instance to find
/// the holding's znodes, and for a new keeper to take its task over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldingRecord {
    /// The kind's name (`lock`, `group`...).
    pub kind: String,
    /// The resource's name.
    pub name: String,
    /// The handle (a member's or participant's own id for node holdings).
    pub handle: String,
    #[serde(flatten)]
    pub shape: Shape,
    /// The instance that drives it (runs its task): the one its request arrived at, or the one
    /// that adopted it since. While that instance lives, a new keeper of the lease leaves the
    /// holding to it; once it is gone, the lease's keeper (or the reaper) takes it up. `None`
    /// in holding records written before zkgate recorded it: the keeper's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

/// The protocol of a holding, and what it needs to be found again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "snake_case")]
pub enum Shape {
    /// An ordered node `_c_<guid><infix><seq>` in the resource's znode (the GUID is the
    /// handle's, see [crate::ids::guid_of]).
    Contender {
        /// `exclusive`, `read`, `write` or `candidate`.
        role: String,
    },
    /// A semaphore permit request: a node in its `locks/`, then one in its `leases/`.
    Permit { permits: u32 },
    /// One node at a known path (a member, a participant, a lease-bound barrier, a service
    /// instance), with the charge of its data and whether an owner record names its lease
    /// (when its data cannot). Stored as `bound` with a `binding` flag, the names it had: a
    /// lease outlives the instance that wrote it, and the version that wrote it.
    #[serde(rename = "bound")]
    Node {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        charge: Option<String>,
        #[serde(default, rename = "binding", skip_serializing_if = "std::ops::Not::not")]
        owner_record: bool,
        /// Not shown among the lease's holdings (a lock set's record).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hidden: bool,
    },
}

impl HoldingRecord {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn parse(data: &[u8]) -> Option<HoldingRecord> {
        serde_json::from_slice(data).ok()
    }

    /// The kind it is of, if zkgate knows it.
    pub fn kind(&self) -> Option<Kind> {
        // By name: a kind without a topic of its own (kv) holds too.
        Kind::from_name(&self.kind)
    }
}

/// The name of the holding record of resource `name` of `kind` under its lease's
/// record: the kind and a hash of the resource, and of the handle (`Some`) for what a lease
/// may hold several of at one resource (members, participants, service instances, found by
/// their own id), so that any instance that knows the holding (and its lease) finds it without
/// a listing. What a lease holds at most one of per resource (a contender, a permit request)
/// is named without its handle: the name *is* the rule, checked by ZooKeeper in the multi-op
/// that creates the holding, whichever instance makes it (a retried acquire through another
/// instance finds the first one's holding instead of queueing twice). Holding records written
/// before this rule name the handle too ([legacy_record_name]).
pub fn record_name(kind: Kind, name: &str, handle: Option<&str>) -> String {
    use sha2::Digest;
    let hashed = match handle {
        Some(handle) => format!("{name}\0{handle}"),
        // (A name has no control characters: this never equals a name and a handle.)
        None => name.to_string(),
    };
    let digest = sha2::Sha256::digest(hashed.as_bytes());
    format!("{}-{}", kind.name(), crate::ids::hex(&digest[..16]))
}

/// The name an earlier zkgate gave the holding record of the one-per-lease holding `handle`: found
/// and removed with the holding, for leases that outlived an upgrade.
pub fn legacy_record_name(kind: Kind, name: &str, handle: &str) -> String {
    record_name(kind, name, Some(handle))
}

/// The holding that the holding record `name` under the lease record at `lease` records, if there
/// is one.
pub async fn holding(client: &Client, lease: &str, name: &str) -> Result<Option<HoldingRecord>, ZkError> {
    Ok(crate::zk::data(client, &format!("{lease}/{name}"))
        .await?
        .and_then(|(data, _)| HoldingRecord::parse(&data)))
}

/// The holdings recorded under the lease record at `path`, by holding record name.
pub async fn holdings(client: &Client, path: &str) -> Result<Vec<(String, HoldingRecord)>, ZkError> {
    let names = crate::zk::children(client, path).await?;
    let read = crate::zk::read_each(client, path, names).await?;
    Ok(read
        .into_iter()
        .filter_map(|(name, data, _)| HoldingRecord::parse(&data).map(|record| (name, record)))
        .collect())
}

/// Rewrites the holding record `name` under the lease record at `lease` to say that instance `me`
/// drives its holding now (it took it up from an instance gone), if it still records
/// `holding`'s handle: a holding record named after its resource alone may be a successor's by
/// now (the holding released, the resource acquired again), which must not be overwritten.
/// Whether it still was `holding`'s.
pub async fn redrive(
    client: &Client,
    lease: &str,
    name: &str,
    holding: &HoldingRecord,
    me: &str,
) -> Result<bool, ZkError> {
    let path = format!("{lease}/{name}");
    let record = HoldingRecord {
        driver: Some(me.to_string()),
        ..holding.clone()
    };
    let data = record.to_bytes();
    write_if_naming(client, &path, &holding.handle, |version| {
        client.set_data(&path, &data, Some(version))
    })
    .await
}

/// Makes `write` (conditional on the version read, which it is given) on the holding record at
/// `path` if it names `handle`; whether it did.
pub async fn write_if_naming<T, Fut: Future<Output = Result<T, ZkError>>>(
    client: &Client,
    path: &str,
    handle: &str,
    write: impl Fn(i32) -> Fut,
) -> Result<bool, ZkError> {
    loop {
        let Some((data, stat)) = crate::zk::data(client, path).await? else {
            return Ok(false);
        };
        if HoldingRecord::parse(&data).is_none_or(|held| held.handle != handle) {
            return Ok(false);
        }
        match write(stat.version).await {
            Ok(_) => return Ok(true),
            Err(ZkError::NoNode) => return Ok(false),
            // Changed meanwhile (its driver rewritten), or the answer lost: read again.
            Err(ZkError::BadVersion) => {}
            Err(err) if crate::zk::is_loss(&err) => {}
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_record_their_protocol() {
        let bound = HoldingRecord {
            kind: "group".into(),
            name: "workers".into(),
            handle: "w-1".into(),
            shape: Shape::Node {
                path: "/zkgate/groups/workers/w-1".into(),
                charge: Some("/zkgate/usage/anyone/x".into()),
                owner_record: true,
                hidden: false,
            },
            driver: Some("0123abcd".into()),
        };
        let text = String::from_utf8(bound.to_bytes()).expect("utf-8");
        assert!(text.contains(r#""protocol":"bound""#), "{text}");
        assert_eq!(HoldingRecord::parse(text.as_bytes()), Some(bound));
        let contender = HoldingRecord {
            kind: "lock".into(),
            name: "orders".into(),
            handle: "0123abcd-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b".into(),
            shape: Shape::Contender {
                role: "exclusive".into(),
            },
            driver: None,
        };
        assert_eq!(HoldingRecord::parse(&contender.to_bytes()), Some(contender.clone()));
        assert_eq!(contender.kind(), Some(Kind::Lock));
    }

    #[test]
    fn records_differ_by_kind_resource_and_handle() {
        let a = record_name(Kind::Group, "g", Some("m"));
        assert!(a.starts_with("group-") && a.len() == "group-".len() + 32, "{a}");
        assert_ne!(a, record_name(Kind::Group, "g", Some("n")));
        assert_ne!(a, record_name(Kind::Group, "h", Some("m")));
        assert_ne!(a, record_name(Kind::Service, "g", Some("m")));
        // The separator keeps `a`+`bc` and `ab`+`c` apart.
        assert_ne!(
            record_name(Kind::Group, "a", Some("bc")),
            record_name(Kind::Group, "ab", Some("c"))
        );
        // One per lease: the resource alone, which no resource and handle hash to.
        let lock = record_name(Kind::Lock, "orders", None);
        assert_eq!(lock, record_name(Kind::Lock, "orders", None));
        assert_ne!(lock, record_name(Kind::Lock, "orders", Some("h")));
        assert_ne!(lock, record_name(Kind::Lock, "other", None));
    }
}
