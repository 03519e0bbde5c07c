//! What a socket or an event stream may subscribe to, and what feeds it: `{"<topic>": "<name>"}`
//! for a resource of any kind the registry gives a topic ([Kind::topic]: `lock`, `election`,
//! `queue`...), a lease of this instance (`{"lease": "<id>"}`), or a znode under the root
//! (`{"znode": {"path": "kv/app", "watch": "data|children|recursive"}}`). An event stream names
//! the same topics as the bus does (`lock:orders`, `lease:<id>`, `znode:data:kv/app`,
//! [parse_name]).
//!
//! Both count what they hold the same way ([stream_permits], [subscription_permit]).
//! A kind's resource is followed as its recipe's topic ([feed_of]).

use serde::Deserialize;
use serde_json::Value;

use super::Feed;
use crate::auth::{Access, Caller};
use crate::kind::Kind;
use crate::limits::{ClientAddr, Permit};
use crate::problem::ApiError;
use crate::recipes::Recipes;
use crate::recipes::leases::LeaseError;
use crate::recipes::validate_name;
use crate::recipes::znode::{KeyBinding, ZnodeChildren, ZnodeData, under_root};

/// The kinds' topics as the API documents them, from the registry: `lock`, `rwlock`... (every
/// [Kind] with a topic, in [Kind::ALL]'s order).
pub fn kind_topics() -> Vec<&'static str> {
    Kind::ALL.into_iter().filter_map(Kind::topic).collect()
}

/// The kinds' topics, each as `example` writes it, joined by commas.
pub fn listed(example: fn(&str) -> String) -> String {
    kind_topics().into_iter().map(example).collect::<Vec<_>>().join(", ")
}

/// The topic of resource `name` of `kind`, if the kind has topics: its [crate::recipes::topic::Source]
/// followed. Every kind decides here (no wildcard arm).
pub fn feed_of(recipes: &Recipes, kind: Kind, name: &str) -> Option<Feed> {
    Some(match kind {
        Kind::Lock => Feed::of(recipes.lock_topic(name)),
        Kind::RwLock => Feed::of(recipes.rwlock_topic(name)),
        Kind::Semaphore => Feed::of(recipes.semaphore_topic(name)),
        Kind::Election => Feed::of(recipes.election_topic(name)),
        Kind::Barrier => Feed::of(recipes.barrier_topic(name)),
        Kind::DoubleBarrier => Feed::of(recipes.double_barrier_topic(name)),
        Kind::Queue => Feed::of(recipes.queue_topic(name)),
        Kind::Counter => Feed::of(recipes.counter_topic(name)),
        Kind::Group => Feed::of(recipes.group_topic(name)),
        Kind::Service => Feed::of(recipes.service_topic(name)),
        Kind::Txn => Feed::of(recipes.txn_topic(name)),
        Kind::Kv => return None,
    })
}

/// Most topics one socket or one event stream may follow.
pub const MAX_TOPICS: usize = 64;

/// A znode topic's `{"path": ..., "watch": ...}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZnodeTopic {
    /// Relative to zkgate's root (`kv/app/flags`); empty for the root itself.
    path: String,
    #[serde(default)]
    watch: ZnodeWatch,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ZnodeWatch {
    /// Its data: `created`, `changed`, `deleted`.
    #[default]
    Data,
    /// Its children: `children` (and `created`, `deleted` of the node itself).
    Children,
    /// Everything below it: `created`, `changed`, `deleted` with the node's `path`.
    Recursive,
}

/// Most segments of a znode topic's path.
const MAX_ZNODE_DEPTH: usize = 32;

/// Why a topic cannot be subscribed to.
pub enum TopicError {
    /// Not a topic at all (no such key): the message is malformed.
    Unknown(String),
    Invalid(String),
    Forbidden(String),
}

impl From<String> for TopicError {
    fn from(detail: String) -> TopicError {
        TopicError::Invalid(detail)
    }
}

/// The topic `topic` names, for `caller`: its name on the bus and what feeds it.
pub fn resolve(state: &Recipes, caller: &Caller, topic: &Value) -> Result<(String, Feed), TopicError> {
    let (key, value) = match topic.as_object().map(|o| o.iter().collect::<Vec<_>>()).as_deref() {
        Some([(key, value)]) => (key.as_str(), *value),
        _ => {
            return Err(TopicError::Unknown(format!(
                "a topic is an object with one key: {}, `lease`, `summary` or `znode`",
                listed(|t| format!("`{t}`"))
            )));
        }
    };
    match key {
        "znode" => {
            let znode: ZnodeTopic = serde_json::from_value(value.clone()).map_err(|e| format!("znode topic: {e}"))?;
            znode_feed(state, caller, znode)
        }
        "lease" => {
            let id = name_of("lease", value)?;
            let lease = state.leases.get(caller, &id).map_err(|e| match e {
                LeaseError::NotYours(_) => TopicError::Forbidden(e.to_string()),
                e => TopicError::Invalid(e.to_string()),
            })?;
            Ok((format!("lease:{id}"), Feed::lease(state.leases.clone(), lease)))
        }
        "summary" => {
            let dir = value.as_str().unwrap_or_default();
            let kind = Kind::from_dir(dir)
                .filter(|k| k.topic().is_some())
                .ok_or_else(|| format!("`summary` takes a kind: one of {}", summary_kinds()))?;
            // It names every resource of the kind, as the kind's directory does.
            if !caller.may(kind.auth(), "", Access::Read) {
                let detail = format!(
                    "the summary of {dir} needs read access to every name of {}",
                    kind.auth()
                );
                return Err(TopicError::Forbidden(detail));
            }
            Ok((format!("summary:{dir}"), Feed::summary(kind, kind.base(&state.root))))
        }
        key => {
            let kind = Kind::from_topic(key).ok_or_else(|| {
                TopicError::Unknown(format!(
                    "unknown topic `{key}`: topics are {}, `lease`, `summary` and `znode`",
                    listed(|t| format!("`{t}`"))
                ))
            })?;
            let name = name_of(key, value)?;
            if !caller.may(kind.auth(), &name, Access::Read) {
                let detail = format!("no read access to {} `{name}`", kind.auth());
                return Err(TopicError::Forbidden(detail));
            }
            let feed = feed_of(state, kind, &name).ok_or_else(|| format!("`{key}` has no topic"))?;
            Ok((kind.topic_name(&name), feed))
        }
    }
}

/// The kinds with a summary topic (`summary:locks`), for error messages.
fn summary_kinds() -> String {
    Kind::ALL
        .iter()
        .filter(|k| k.topic().is_some())
        .map(|k| format!("`{}`", k.dir()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A topic's name: a string that is a valid name.
fn name_of(topic: &str, value: &Value) -> Result<String, TopicError> {
    let name = value
        .as_str()
        .ok_or_else(|| format!("`{topic}` takes a name (a string)"))?;
    validate_name(name).map_err(|e| format!("{topic} name {e}"))?;
    Ok(name.to_string())
}

fn znode_feed(
    state: &Recipes,
    caller: &Caller,
    ZnodeTopic { path, watch }: ZnodeTopic,
) -> Result<(String, Feed), TopicError> {
    let root = state.root.as_str();
    if path.starts_with('/') {
        return Err(TopicError::from(format!(
            "znode path `{path}` must be relative to zkgate's root ({root}), without a leading `/`"
        )));
    }
    let relative = path.as_str();
    let segments: Vec<&str> = if relative.is_empty() {
        Vec::new()
    } else {
        relative.split('/').collect()
    };
    if segments.len() > MAX_ZNODE_DEPTH {
        return Err(format!("znode path must have at most {MAX_ZNODE_DEPTH} segments").into());
    }
    for segment in &segments {
        validate_name(segment).map_err(|e| format!("znode path segment `{segment}` {e}"))?;
    }
    if !may_read_znode(caller, &segments) {
        return Err(TopicError::Forbidden(format!(
            "no read access to the znode `{relative}`"
        )));
    }
    let absolute = under_root(root, relative);
    Ok(match watch {
        ZnodeWatch::Data => {
            // A kv key's topic also follows its binding to a lease (and says `lease-ended`).
            let is_key = segments.len() > 1 && Kind::from_dir(segments[0]) == Some(Kind::Kv);
            let key = is_key.then(|| KeyBinding::new(root));
            let source = ZnodeData { path: absolute, key };
            (format!("znode:data:{relative}"), Feed::of(source))
        }
        ZnodeWatch::Children => (
            format!("znode:children:{relative}"),
            Feed::of(ZnodeChildren { path: absolute }),
        ),
        ZnodeWatch::Recursive => (
            format!("znode:recursive:{relative}"),
            Feed::recursive(absolute, root.to_string()),
        ),
    })
}

/// A znode under the root is readable by whoever may read the resource it belongs to
/// (`locks/orders/...` → lock `orders`, `kv/app/flags` → key `app/flags`); a kind's directory
/// (which lists every name) needs a grant on every name of that kind; the rest (the root
/// itself, `leases/`, the audit log) needs an admin.
fn may_read_znode(caller: &Caller, segments: &[&str]) -> bool {
    match segments {
        [dir, rest @ ..] => match Kind::from_dir(dir) {
            Some(kind) => {
                let name = match (kind, rest) {
                    (Kind::Kv, rest) => rest.join("/"),
                    (_, [name, ..]) => name.to_string(),
                    (_, []) => String::new(),
                };
                caller.may(kind.auth(), &name, Access::Read)
            }
            None => caller.is_admin(),
        },
        [] => caller.is_admin(),
    }
}

/// A topic as the bus names it (`lock:orders`, `lease:<id>`, `znode:children:queues/jobs`):
/// the socket's topic object for it.
pub fn parse_name(text: &str) -> Result<Value, TopicError> {
    let unknown = || {
        TopicError::Unknown(format!(
            "`{}` is not a topic: write `<topic>:<name>` with a topic among {}, `lease` or `summary`, or `znode:<data|children|recursive>:<path>`",
            text.escape_debug(),
            listed(|t| format!("`{t}`"))
        ))
    };
    let (key, rest) = text.split_once(':').ok_or_else(unknown)?;
    if key != "znode" {
        return Ok(serde_json::json!({ key: rest }));
    }
    let (watch, path) = rest.split_once(':').ok_or_else(unknown)?;
    if !matches!(watch, "data" | "children" | "recursive") {
        return Err(TopicError::Invalid(format!(
            "znode watch `{}` must be `data`, `children` or `recursive`",
            watch.escape_debug()
        )));
    }
    Ok(serde_json::json!({ "znode": { "path": path, "watch": watch } }))
}

/// A socket or an event stream, counted against its principal's and its address's limits
/// (429 beyond them) while the permits live.
pub fn stream_permits(state: &Recipes, caller: &Caller, address: Option<ClientAddr>) -> Result<Vec<Permit>, ApiError> {
    let settings = state.limits.settings;
    let mut permits = vec![state.limits.hold(
        format!("sockets of {}", crate::limits::client_key(caller, None)),
        settings.sockets_per_principal,
        "WebSockets and event streams per principal",
    )?];
    if let Some(ClientAddr(ip)) = address {
        permits.push(state.limits.hold(
            format!("sockets of {ip}"),
            settings.sockets_per_address,
            "WebSockets and event streams per address",
        )?);
    }
    Ok(permits)
}

/// One subscription counted against its principal's limit, over all its sockets and streams.
pub fn subscription_permit(state: &Recipes, caller: &Caller) -> Result<Permit, ApiError> {
    let max = state.limits.settings.subscriptions_per_principal;
    Ok(state.limits.hold(
        format!("subscriptions of {}", crate::limits::client_key(caller, None)),
        max,
        "subscriptions per principal",
    )?)
}
