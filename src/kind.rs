//! The resource kinds zkgate serves, declared once.
//!
//! Everything that needs to know a kind (the router and the spec, authorisation,
//! the socket's topics, metrics, the lease's list of holdings, the znode layout) asks [Kind]
//! instead of spelling `"locks"` or `"double_barrier"` itself. A kind has two names:
//!
//! - its **segment** (plural, kebab-case: `double-barriers`): the URL segment after `/v1/`, the
//!   znode directory under the root, and the kind a grant of `--auth-config` names;
//! - its **name** (singular, snake_case: `double_barrier`): the socket topic
//!   (`{"double_barrier": "batch-7"}` and `double_barrier:batch-7`), the `kind` label of the
//!   metrics, and the `kind` of a holding on a lease.
//!
//! Adding a kind is one variant here and one row in [Kind::entry]; the compiler then names every
//! `match` that must learn of it.

/// A kind of resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Lock,
    RwLock,
    Semaphore,
    Election,
    Barrier,
    DoubleBarrier,
    Txn,
    Queue,
    Group,
    Kv,
    Counter,
    Service,
}

/// What the registry knows of a kind.
struct Entry {
    segment: &'static str,
    name: &'static str,
    /// The OpenAPI tag its operations are listed under.
    tag: &'static str,
    /// Whether its resources can be followed as socket topics by name (kv is followed as
    /// znodes instead).
    topic: bool,
    /// Whether a node holding of it keeps its member's own data, so that who owns it is
    /// recorded apart, in an owner record (a group's member).
    owner_recorded_apart: bool,
    /// Whether a resource's znode is a container (a group's, a service's, as Curator makes them).
    in_container: bool,
    /// Whether its holdings are contended (they queue, one or some at a time hold): what a
    /// write's guard may name.
    contended: bool,
}

impl Kind {
    /// Every kind, in the order the API documents them.
    pub const ALL: [Kind; 12] = [
        Kind::Lock,
        Kind::RwLock,
        Kind::Semaphore,
        Kind::Election,
        Kind::Barrier,
        Kind::DoubleBarrier,
        Kind::Txn,
        Kind::Queue,
        Kind::Group,
        Kind::Kv,
        Kind::Counter,
        Kind::Service,
    ];

    const fn entry(self) -> Entry {
        // segment, name, tag, topic, owner recorded apart, in a container, contended
        let (segment, name, tag, topic, owner_recorded_apart, in_container, contended) = match self {
            Kind::Lock => ("locks", "lock", "locks", true, false, false, true),
            Kind::RwLock => ("rwlocks", "rwlock", "rwlocks", true, false, false, true),
            Kind::Semaphore => ("semaphores", "semaphore", "semaphores", true, false, false, true),
            Kind::Election => ("elections", "election", "elections", true, false, false, true),
            Kind::Barrier => ("barriers", "barrier", "barriers", true, false, false, false),
            Kind::DoubleBarrier => (
                "double-barriers",
                "double_barrier",
                "barriers",
                true,
                false,
                false,
                false,
            ),
            Kind::Txn => ("txns", "txn", "txns", true, false, false, false),
            Kind::Queue => ("queues", "queue", "queues", true, false, false, false),
            Kind::Group => ("groups", "group", "groups", true, true, true, false),
            Kind::Kv => ("kv", "kv", "kv", false, false, false, false),
            Kind::Counter => ("counters", "counter", "counters", true, false, false, false),
            Kind::Service => ("services", "service", "services", true, false, true, false),
        };
        Entry {
            segment,
            name,
            tag,
            topic,
            owner_recorded_apart,
            in_container,
            contended,
        }
    }

    /// Whether a node holding of this kind keeps its member's own data (a group's member), so
    /// that who owns it is recorded apart, in an owner record, rather than in the node.
    pub const fn owner_recorded_apart(self) -> bool {
        self.entry().owner_recorded_apart
    }

    /// Whether a resource's znode is a container, which ZooKeeper removes with its last child.
    pub const fn in_container(self) -> bool {
        self.entry().in_container
    }

    /// Whether its holdings are contended (a lock, a read/write lock, a semaphore, an
    /// election): a write's guard names one of those.
    pub const fn contended(self) -> bool {
        self.entry().contended
    }

    /// The URL segment after `/v1/` (`double-barriers`).
    pub const fn segment(self) -> &'static str {
        self.entry().segment
    }

    /// The znode directory under zkgate's root that holds this kind's resources.
    pub const fn dir(self) -> &'static str {
        self.entry().segment
    }

    /// The kind a grant of `--auth-config` names.
    pub const fn auth(self) -> &'static str {
        self.entry().segment
    }

    /// The singular name (`double_barrier`): topic, metric label, a holding's kind.
    pub const fn name(self) -> &'static str {
        self.entry().name
    }

    /// The socket topic of a resource of this kind (`{"<topic>": "<name>"}`), if it has one.
    pub const fn topic(self) -> Option<&'static str> {
        let entry = self.entry();
        if entry.topic { Some(entry.name) } else { None }
    }

    /// The `kind` label of its metrics.
    pub const fn label(self) -> &'static str {
        self.entry().name
    }

    /// The OpenAPI tag of its operations.
    pub const fn tag(self) -> &'static str {
        self.entry().tag
    }

    /// The kind whose URL segment (and znode directory) is `segment`.
    pub fn from_segment(segment: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.segment() == segment)
    }

    /// The kind whose socket topic is `topic`.
    pub fn from_topic(topic: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.topic() == Some(topic))
    }

    /// The kind named `name` (as holding records and metrics name it).
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind whose znode directory (and URL segment) is `dir`.
    pub fn from_dir(dir: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.dir() == dir)
    }

    /// `<root>/<dir>`: the znode that holds every resource of this kind.
    pub fn base(self, root: &str) -> String {
        format!("{root}/{}", self.dir())
    }

    /// `<root>/<dir>/<name>`: the znode of one resource (`name` already validated).
    pub fn path(self, root: &str, name: &str) -> String {
        format!("{root}/{}/{name}", self.dir())
    }

    /// The topic's name on the event bus: `lock:orders`.
    pub fn topic_name(self, name: &str) -> String {
        format!("{}:{name}", self.name())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found_again() {
        let mut segments = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for kind in Kind::ALL {
            assert!(segments.insert(kind.segment()), "{kind:?}");
            assert!(names.insert(kind.name()), "{kind:?}");
            assert_eq!(Kind::from_segment(kind.segment()), Some(kind));
            if let Some(topic) = kind.topic() {
                assert_eq!(Kind::from_topic(topic), Some(kind));
            }
        }
        assert_eq!(Kind::from_segment("leases"), None);
        assert_eq!(Kind::from_topic("kv"), None, "kv is followed as znodes");
    }

    #[test]
    fn paths_are_under_the_root() {
        assert_eq!(Kind::DoubleBarrier.path("/zkgate", "b"), "/zkgate/double-barriers/b");
        assert_eq!(Kind::Lock.base("/r"), "/r/locks");
        assert_eq!(Kind::DoubleBarrier.topic_name("b"), "double_barrier:b");
    }
}
