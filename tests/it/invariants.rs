//! Invariants over the whole served spec: every operation of `/openapi.json` (so that one added
//! later is covered without anyone remembering it), called validly (its spec's example body, a
//! value for every query parameter, each optional header) and with hostile parameters and
//! bodies, through both instances:
//!
//! 1. a principal that may only read leaves ZooKeeper's tree under the root as it was (every
//!    znode's path, data and version: a recursive watch on the root sees no change);
//! 2. a principal acting on another's leases, handles, sets, claims, members, participants,
//!    instances and bound keys answers 403 or 404 and leaves them as they were;
//! 3. every znode under the root is a value charged to a principal (its charge is there, and
//!    covers its bytes) or zkgate's own bookkeeping, of a size the test states and checks;
//! 4. while ZooKeeper is away every operation answers;
//! 5. a write guarded by a holding its writer no longer has writes nothing.
//!
//! An operation the generator cannot call, or that an invariant does not apply to, is listed
//! with its reason below; any other operation of the spec fails the run. Each test prints how
//! many operations it covered.
//!
//! Why this file is long (some 1,300 lines): the five invariants share one world (what alice
//! holds), one generator of requests from the spec and one watch of the tree; apart, each
//! would carry its own copy of them.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::{Gate, Reply, grant, tree, within, zk_client};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use zookeeper_client::{AddWatchMode, Client, EventType, PersistentWatcher};

/// Operations no request of the generator can exercise, with the reason.
const NOT_CALLED: &[(&str, &str)] = &[(
    "GET /v1/ws",
    "a WebSocket: its calls are the API's own routes (the same handlers and guards), sent over the socket",
)];

/// Two instances on one ZooKeeper with alice and bob (each may write everything), a reader
/// (who may read everything), and what alice holds ([World]).
struct Setup {
    both: common::TwoInstances<3>,
    alice: String,
    bob: String,
    reader: String,
    world: World,
}

impl std::ops::Deref for Setup {
    type Target = common::TwoInstances<3>;

    fn deref(&self) -> &Self::Target {
        &self.both
    }
}

/// What alice made, through instance a: one resource of each kind named `w`, held with her
/// lease, and the ids a request about them takes.
#[derive(Debug, Default)]
struct World {
    lease: String,
    /// A handle of each contended kind (by its URL segment).
    handles: HashMap<&'static str, String>,
    /// The fencing token of each kind's holder (by its URL segment).
    tokens: HashMap<&'static str, String>,
    set: String,
    claim: String,
    dead: String,
}

async fn setup() -> Setup {
    setup_on(common::zookeeper().await).await
}

/// [setup] on `zk`.
async fn setup_on(zk: common::TestZooKeeper) -> Setup {
    let principals = [
        ("alice", grant("", "write")),
        ("bob", grant("", "write")),
        ("reader", grant("", "read")),
    ];
    let both = common::two_instances_on(zk, principals, |config| {
        // One delivery: an item taken and given back once is dead-lettered at its next take.
        config.queue_max_deliveries = 1;
        // A long poll sent without `wait` waits this long: the requests that leave it out.
        config.max_wait = Duration::from_millis(300);
    })
    .await;
    let [alice, bob, reader] = both.tokens.clone();
    let world = World::make(&both.a, &alice).await;
    Setup {
        both,
        alice,
        bob,
        reader,
        world,
    }
}

impl World {
    async fn make(gate: &Gate, alice: &str) -> World {
        let call = |method: Method, path: String, body: Option<Value>| async move {
            let reply = gate.call_as(Some(alice), method, &path, body).await;
            assert!(reply.status.is_success(), "making the world, {path}: {reply:?}");
            reply
        };
        let lease = call(Method::POST, "/v1/leases".into(), Some(json!({"ttl": "10m"})))
            .await
            .str("id");
        let mut world = World {
            lease,
            ..World::default()
        };
        let with = json!({ "lease": world.lease });
        for (segment, path) in [
            ("locks", "/v1/locks/w/acquire?wait=0"),
            ("rwlocks", "/v1/rwlocks/w/read?wait=0"),
            ("semaphores", "/v1/semaphores/w/acquire?permits=2&wait=0"),
            ("elections", "/v1/elections/w/campaign?wait=0"),
        ] {
            let held = call(Method::POST, path.into(), Some(with.clone())).await;
            world.handles.insert(segment, held.str("handle"));
            let token = held.body["fencing_token"].as_u64().or(held.body["term"].as_u64());
            if let Some(token) = token {
                world.tokens.insert(segment, token.to_string());
            }
        }
        let set = json!({"locks": ["w-1", "w-2"], "lease": world.lease});
        world.set = call(Method::POST, "/v1/lock-sets?wait=0".into(), Some(set))
            .await
            .str("set");
        call(Method::PUT, "/v1/barriers/w".into(), Some(with.clone())).await;
        let enter = json!({"participant": "p", "size": 2, "lease": world.lease});
        call(Method::POST, "/v1/double-barriers/w/enter?wait=0".into(), Some(enter)).await;
        let txn = json!({"id": "w", "participants": ["p", "q"], "deadline": "10m", "payload": {"order": 1}});
        call(Method::POST, "/v1/txns".into(), Some(txn)).await;
        call(Method::PUT, "/v1/txns/w/participants/p".into(), Some(with.clone())).await;
        call(
            Method::PUT,
            "/v1/groups/w/members/m".into(),
            Some(json!({"lease": world.lease, "data": {"at": 1}})),
        )
        .await;
        let instance = json!({"lease": world.lease, "address": "10.0.0.5", "port": 8080});
        call(Method::PUT, "/v1/services/w/instances/i".into(), Some(instance)).await;
        call(Method::PUT, "/v1/kv/w".into(), Some(json!({"plain": true}))).await;
        call(
            Method::PUT,
            format!("/v1/kv/w/bound?lease={}", world.lease),
            Some(json!("bound")),
        )
        .await;
        call(Method::POST, "/v1/counters/w/add".into(), Some(json!({"delta": 3}))).await;
        // A queue item dead-lettered (taken and given back once), one claimed, one waiting.
        call(Method::POST, "/v1/queues/w/items".into(), Some(json!({"job": "dead"}))).await;
        let claim = call(Method::POST, "/v1/queues/w/take?wait=0".into(), None)
            .await
            .str("claim");
        call(Method::POST, format!("/v1/queues/w/claims/{claim}/nack"), None).await;
        let taken = gate
            .call_as(Some(alice), Method::POST, "/v1/queues/w/take?wait=0", None)
            .await;
        assert_eq!(taken.status, StatusCode::NO_CONTENT, "dead-lettered: {taken:?}");
        let dead = call(Method::GET, "/v1/queues/w/dead-letters".into(), None).await;
        world.dead = dead.body[0]["item"].as_str().expect("a dead letter").to_string();
        call(
            Method::POST,
            "/v1/queues/w/items".into(),
            Some(json!({"job": "claimed"})),
        )
        .await;
        world.claim = call(Method::POST, "/v1/queues/w/take?wait=0&ack_deadline=10m".into(), None)
            .await
            .str("claim");
        call(
            Method::POST,
            "/v1/queues/w/items".into(),
            Some(json!({"job": "waiting"})),
        )
        .await;
        world
    }
}

/// An operation of the served spec.
#[derive(Clone, Debug)]
struct Operation {
    method: Method,
    template: String,
    /// Its parameters: name, where (`path`, `query`, `header`), schema.
    params: Vec<(String, String, Value)>,
    /// The examples of its request body (none if it takes none).
    examples: Vec<Value>,
    /// The properties its request body's schema names.
    body_fields: Vec<String>,
}

impl Operation {
    fn name(&self) -> String {
        format!("{} {}", self.method, self.template)
    }

    /// A response that never ends (an event stream), or a socket.
    fn streams(&self) -> bool {
        self.template.ends_with("/events") || self.template.ends_with("/observe") || self.template == "/v1/ws"
    }
}

/// Every operation of the spec zkgate serves, but for the probes and `/metrics` (no ZooKeeper
/// state behind them).
fn operations() -> Vec<Operation> {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let resolve = |schema: &Value| -> Value {
        match schema["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
        {
            Some(name) => spec["components"]["schemas"][name].clone(),
            None => schema.clone(),
        }
    };
    let mut all = Vec::new();
    for (template, item) in spec["paths"].as_object().expect("paths") {
        if ["/healthz", "/readyz", "/metrics"].contains(&template.as_str()) {
            continue;
        }
        for (method, operation) in item.as_object().expect("operations") {
            let params = (operation["parameters"].as_array().into_iter().flatten())
                .map(|p| {
                    match p["$ref"]
                        .as_str()
                        .and_then(|r| r.strip_prefix("#/components/parameters/"))
                    {
                        Some(shared) => &spec["components"]["parameters"][shared],
                        None => p,
                    }
                })
                .map(|p| {
                    let name = p["name"].as_str().expect("name").to_string();
                    let place = p["in"].as_str().expect("in").to_string();
                    (name, place, resolve(&p["schema"]))
                })
                .collect();
            let content = operation["requestBody"]["content"].as_object();
            let examples = common::examples(&operation["requestBody"]);
            let schema = content
                .and_then(|c| c.get("application/json"))
                .map(|c| resolve(&c["schema"]))
                .unwrap_or(Value::Null);
            let body_fields = (schema["properties"].as_object().into_iter().flatten())
                .map(|(field, _)| field.clone())
                .collect();
            all.push(Operation {
                method: method.to_uppercase().parse().expect("method"),
                template: template.clone(),
                params,
                examples,
                body_fields,
            });
        }
    }
    all
}

/// One request.
#[derive(Clone, Debug)]
struct Request {
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    /// Whether it names something of alice's that only she may act on (see [World::owned]).
    names_owned: bool,
}

/// The path parameters that name something a lease holds, and so its principal's alone (with
/// a lease's own id, a service instance's and a bound key: [World::path_value]; and the body
/// fields `lease`, `handle` and `claims`: [World::body]).
const OWNED_PARAMS: [&str; 5] = ["handle", "set", "claim", "member", "participant"];

impl World {
    /// The value of path parameter `param` of a route under `/v1/<segment>`: alice's.
    fn path_value(&self, segment: &str, param: &str) -> Option<(String, bool)> {
        let owned = OWNED_PARAMS.contains(&param);
        let value = match (segment, param) {
            (_, "name" | "group") => "w".to_string(),
            ("kv", "key") => "w/bound".to_string(),
            ("leases", "id") => self.lease.clone(),
            ("services", "id") => "i".to_string(),
            ("txns", "id") => "w".to_string(),
            (_, "set") => self.set.clone(),
            (_, "claim") => self.claim.clone(),
            (_, "item") => self.dead.clone(),
            (_, "member") => "m".to_string(),
            (_, "participant") => "p".to_string(),
            (segment, "handle") => self.handles.get(segment)?.clone(),
            (segment, "token") => self.tokens.get(segment)?.clone(),
            _ => return None,
        };
        // A lease's own routes, a service instance and a bound key are owned too.
        let owned = owned || matches!((segment, param), ("leases" | "services" | "kv", "id" | "key"));
        Some((value, owned))
    }

    /// A value for query parameter `name` with `schema`.
    fn query_value(&self, name: &str, schema: &Value) -> String {
        let plain = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match name {
            "wait" => "50ms".into(),
            "lease" => self.lease.clone(),
            "topic" => "lock:w".into(),
            "prefix" => "w".into(),
            "permits" => "2".into(),
            "ack_deadline" => "10m".into(),
            "since" | "cursor" => "w".into(),
            _ => (schema.get("example").map(plain))
                .or_else(|| schema["enum"].get(0).map(plain))
                .or_else(|| schema.get("default").map(plain))
                .unwrap_or_else(|| match schema["type"].as_str() {
                    Some("boolean") => "true".into(),
                    Some("integer") => schema["minimum"].as_i64().unwrap_or(1).max(1).to_string(),
                    _ => "1s".into(),
                }),
        }
    }

    /// An example body of the operation, naming alice's lease, handle and claim where it names
    /// one (and her lease instead of a new one's TTL).
    fn body(&self, operation: &Operation, example: &Value) -> (Value, bool) {
        let segment = operation.template.split('/').nth(2).unwrap_or_default();
        let mut body = example.clone();
        let mut owned = false;
        if let Some(object) = body.as_object_mut() {
            if operation.body_fields.iter().any(|f| f == "lease") {
                object.remove("ttl");
                object.insert("lease".into(), json!(self.lease));
                owned = true;
            }
            if object.contains_key("handle") {
                object.insert("handle".into(), json!(self.handles.get(segment)));
                owned = true;
            }
            if object.contains_key("claims") {
                object.insert("claims".into(), json!([self.claim]));
                owned = true;
            }
        }
        (body, owned)
    }

    /// The operation, called validly: every path parameter alice's, every query parameter set,
    /// each of its example bodies; then the first of those without each query parameter, and
    /// with each optional header. `None` if a path parameter names nothing the world has.
    fn valid(&self, operation: &Operation) -> Option<Vec<Request>> {
        let segment = operation.template.split('/').nth(2).unwrap_or_default();
        let mut path = operation.template.clone();
        let mut query = Vec::new();
        let mut headers = Vec::new();
        let mut owned = false;
        for (name, place, schema) in &operation.params {
            match place.as_str() {
                "path" => {
                    let (value, names_owned) = self.path_value(segment, name)?;
                    owned |= names_owned;
                    let value = percent_encoding::utf8_percent_encode(&value, percent_encoding::NON_ALPHANUMERIC)
                        .to_string()
                        .replace("%2F", "/");
                    path = path.replace(&format!("{{{name}}}"), &value);
                }
                "query" => query.push(format!("{name}={}", self.query_value(name, schema))),
                "header" => headers.push(name.clone()),
                _ => {}
            }
        }
        let with_query = |query: &[String]| match query {
            [] => path.clone(),
            query => format!("{path}?{}", query.join("&")),
        };
        let bodies: Vec<Option<(Value, bool)>> = match operation.examples.as_slice() {
            [] => vec![None],
            examples => examples.iter().map(|e| Some(self.body(operation, e))).collect(),
        };
        // A request names what alice's lease holds by a path parameter, its body, or her lease
        // as a query parameter.
        let names_lease = |query: &[String]| query.iter().any(|q| q.starts_with("lease="));
        let first_owned = bodies.first().and_then(|b| b.as_ref()).is_some_and(|(_, owned)| *owned);
        let mut requests: Vec<Request> = (bodies.into_iter())
            .map(|body| Request {
                method: operation.method.clone(),
                path: with_query(&query),
                headers: Vec::new(),
                names_owned: owned || names_lease(&query) || body.as_ref().is_some_and(|(_, owned)| *owned),
                body: body.map(|(body, _)| body.to_string().into_bytes()),
            })
            .collect();
        let base = requests[0].clone();
        let examples = requests.clone();
        for left_out in 0..query.len() {
            let mut fewer = query.clone();
            fewer.remove(left_out);
            requests.push(Request {
                path: with_query(&fewer),
                names_owned: owned || names_lease(&fewer) || first_owned,
                ..base.clone()
            });
        }
        // Each header with each example body.
        for header in headers {
            let value = match header.to_ascii_lowercase().as_str() {
                "idempotency-key" => "invariant-key".to_string(),
                "if-match" => "*".to_string(),
                "if-none-match" if operation.method == Method::GET => "\"4294967311\"".to_string(),
                "if-none-match" => "*".to_string(),
                // Alice's lock's handle: a write guarded by what her lease holds.
                "zkgate-guard" => format!("lock/w; handle={}", self.handles.get("locks")?),
                _ => "w-1".to_string(),
            };
            let guard = header.eq_ignore_ascii_case("zkgate-guard");
            for example in &examples {
                let mut with = example.clone();
                with.headers.push((header.clone(), value.clone()));
                with.names_owned |= guard;
                requests.push(with);
            }
        }
        Some(requests)
    }

    /// Hostile versions of `valid`: each path parameter and query parameter replaced by
    /// something no route takes, each body field by junk, the body by one that is not JSON.
    fn hostile(&self, operation: &Operation, valid: &Request) -> Vec<Request> {
        let mut hostile = Vec::new();
        let (route, query) = valid.path.split_once('?').unwrap_or((&valid.path, ""));
        let segments: Vec<&str> = route.split('/').collect();
        // The segments that hold a path parameter (a key's own `/`s aside: its first one).
        let params = (operation.template.split('/').enumerate())
            .filter(|(_, segment)| segment.starts_with('{'))
            .map(|(at, _)| at);
        for at in params {
            // Encoded, so that the client sends them as they are (it would resolve `..`).
            for junk in ["%2E%2E", "%00", &"n".repeat(300)] {
                let mut bad = segments.clone();
                bad[at] = junk;
                let path = match query {
                    "" => bad.join("/"),
                    query => format!("{}?{query}", bad.join("/")),
                };
                hostile.push(Request { path, ..valid.clone() });
            }
        }
        let pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        for at in 0..pairs.len() {
            let mut bad = pairs.clone();
            let name = pairs[at].split('=').next().unwrap_or_default();
            let junk = format!("{name}=-99999999999999999999h");
            bad[at] = &junk;
            hostile.push(Request {
                path: format!("{route}?{}", bad.join("&")),
                ..valid.clone()
            });
        }
        if let Some(body) = &valid.body {
            let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            for field in parsed.as_object().into_iter().flat_map(|o| o.keys()) {
                for junk in [json!(-1), json!("x".repeat(300)), json!({"": [null]})] {
                    let mut bad = parsed.clone();
                    bad[field] = junk;
                    hostile.push(Request {
                        body: Some(bad.to_string().into_bytes()),
                        ..valid.clone()
                    });
                }
            }
            hostile.push(Request {
                body: Some(b"{\"unterminated".to_vec()),
                ..valid.clone()
            });
        }
        hostile
    }
}

/// Sends `request` as `token` to `gate`: its status (a stream's, once its head came).
async fn send(gate: &Gate, token: &str, request: &Request, streams: bool) -> Reply {
    try_send(gate, token, request, streams).await.expect("request")
}

/// [send], or why no answer came (a stream's head within 2 s, any other within 30 s).
async fn try_send(gate: &Gate, token: &str, request: &Request, streams: bool) -> Result<Reply, reqwest::Error> {
    let mut builder = gate
        .http
        .request(request.method.clone(), format!("{}{}", gate.url, request.path))
        .bearer_auth(token)
        .timeout(Duration::from_secs(if streams { 2 } else { 30 }));
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if let Some(body) = &request.body {
        builder = builder.header("content-type", "application/json").body(body.clone());
    }
    let response = builder.send().await?;
    if streams {
        return Ok(Reply {
            status: response.status(),
            content_type: String::new(),
            body: Value::Null,
            retry_after: None,
            replayed: false,
        });
    }
    Ok(Reply::read(response).await)
}

/// What changes under the root, seen by a recursive watch: after each step, the changes since
/// the one before, up to a write of a marker node of its own (ZooKeeper delivers a session's
/// events in zxid order, so once the marker's event arrives every earlier change has).
struct Changes {
    client: Client,
    watcher: PersistentWatcher,
    marker: String,
    /// Znodes with neither data nor children when watching began: empty containers, which
    /// ZooKeeper removes itself any time (it does not say which znodes are containers: their
    /// `ephemeralOwner` reads 0), or resources the janitor removes once seen empty. A removal of
    /// one of them is nobody's request.
    empty: Vec<String>,
    /// Subtrees whose changes are not counted (a principal's own usage, say).
    ignored: Vec<String>,
}

/// Znodes that change with time alone: the instances' registrations and heartbeats, and the
/// leadership of the janitor and the reaper.
const VOLATILE: [&str; 4] = [
    "/zkgate/instances",
    "/zkgate/keepers",
    "/zkgate/janitor",
    "/zkgate/reaper",
];

impl Changes {
    async fn watch(connect: &str) -> Changes {
        let client = zk_client(connect).await;
        let marker = "/zkgate/zz-invariants-marker".to_string();
        let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        client.create(&marker, b"", &options).await.expect("marker");
        let watcher = client
            .watch("/zkgate", AddWatchMode::PersistentRecursive)
            .await
            .expect("recursive watch");
        let mut changes = Changes {
            client,
            watcher,
            marker,
            empty: Vec::new(),
            ignored: Vec::new(),
        };
        // What the world's making still sets off (a container ZooKeeper removes, say) is
        // nobody's request: drained, before the empty znodes are listed.
        changes.since().await;
        changes.empty = changes.empty_now().await;
        // And what happened while they were listed.
        changes.since().await;
        changes
    }

    /// The znodes under the root with neither data nor children.
    async fn empty_now(&self) -> Vec<String> {
        let mut empty = Vec::new();
        let mut pending = vec!["/zkgate".to_string()];
        while let Some(path) = pending.pop() {
            let Ok(Some(stat)) = self.client.check_stat(&path).await else {
                continue;
            };
            if stat.num_children == 0 && stat.data_length == 0 {
                empty.push(path.clone());
            }
            for child in self.client.list_children(&path).await.unwrap_or_default() {
                pending.push(format!("{path}/{child}"));
            }
        }
        empty
    }

    /// Whether a change of `path` (of `kind`) is none of the invariant's business: a
    /// [VOLATILE] znode, an empty znode's removal, an ignored subtree.
    fn not_counted(&self, kind: EventType, path: &str) -> bool {
        VOLATILE.iter().any(|v| path.starts_with(v))
            || (kind == EventType::NodeDeleted && self.empty.iter().any(|c| c == path))
            || self
                .ignored
                .iter()
                .any(|i| path == i || path.starts_with(&format!("{i}/")))
    }

    /// The changes since the last call, but for [VOLATILE] znodes: "type path" each.
    async fn since(&mut self) -> Vec<String> {
        // One write of the marker at a time: its next event is this one's.
        self.client.set_data(&self.marker, b"", None).await.expect("marker");
        let mut changes = Vec::new();
        within(Duration::from_secs(10), "the marker's event", async {
            loop {
                let event = self.watcher.changed().await;
                if event.path == self.marker {
                    return;
                }
                if self.not_counted(event.event_type, &event.path) {
                    continue;
                }
                if event.event_type != EventType::Session {
                    changes.push(format!("{:?} {}", event.event_type, event.path));
                }
            }
        })
        .await;
        changes
    }
}

/// Every znode under the root but the [VOLATILE] ones, the marker, the empty ones and the
/// ignored subtrees ([Changes::not_counted]): its data and data version.
async fn snapshot(changes: &Changes) -> BTreeMap<String, (Vec<u8>, i32)> {
    let client = &changes.client;
    let mut nodes = BTreeMap::new();
    let mut pending = vec!["/zkgate".to_string()];
    while let Some(path) = pending.pop() {
        if path == changes.marker || changes.not_counted(EventType::NodeDeleted, &path) {
            continue;
        }
        let Ok((data, stat)) = client.get_data(&path).await else {
            continue;
        };
        for child in client.list_children(&path).await.unwrap_or_default() {
            pending.push(format!("{path}/{child}"));
        }
        nodes.insert(path, (data, stat.version));
    }
    nodes
}

/// What differs between two snapshots: the paths added, removed or changed.
fn differences(before: &BTreeMap<String, (Vec<u8>, i32)>, after: &BTreeMap<String, (Vec<u8>, i32)>) -> Vec<String> {
    let mut differ = Vec::new();
    for (path, was) in before {
        match after.get(path) {
            None => differ.push(format!("removed {path}")),
            Some(now) if now != was => differ.push(format!("changed {path}")),
            Some(_) => {}
        }
    }
    differ.extend(
        after
            .keys()
            .filter(|p| !before.contains_key(*p))
            .map(|p| format!("added {p}")),
    );
    differ
}

/// The operations the generator calls (with their valid requests), and fails on one it cannot.
fn callable(world: &World) -> Vec<(Operation, Vec<Request>)> {
    let mut callable = Vec::new();
    let mut cannot = Vec::new();
    for operation in operations() {
        if NOT_CALLED.iter().any(|(name, _)| *name == operation.name()) {
            continue;
        }
        match world.valid(&operation) {
            Some(requests) => callable.push((operation, requests)),
            None => cannot.push(operation.name()),
        }
    }
    assert!(
        cannot.is_empty(),
        "operations of the spec neither called nor listed in NOT_CALLED with a reason: {cannot:?}"
    );
    callable
}

/// Invariant 1: a principal that may only read changes nothing, whatever it calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_leaves_the_tree_as_it_was_whatever_it_calls() {
    let s = setup().await;
    let mut changes = Changes::watch(&s.zk.connect_string()).await;
    let before = snapshot(&changes).await;
    let operations = callable(&s.world);
    let mut wrong = Vec::new();
    let mut sent = 0;
    for (operation, valid) in &operations {
        let hostile = s.world.hostile(operation, &valid[0]);
        for request in valid.iter().chain(&hostile) {
            for gate in [&s.a, &s.b] {
                let reply = send(gate, &s.reader, request, operation.streams()).await;
                sent += 1;
                if reply.status.is_server_error() {
                    wrong.push(format!("{} {}: {reply:?}", request.method, request.path));
                }
            }
        }
        let changed = without_transient_pins(changes.since().await);
        if !changed.is_empty() {
            wrong.push(format!("{}: {changed:?}", operation.name()));
        }
    }
    println!(
        "invariant 1 (a reader changes nothing): {} operations covered ({} listed: {:?}), {sent} requests through both instances",
        operations.len(),
        NOT_CALLED.len(),
        NOT_CALLED.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));
    let differ = differences(&before, &snapshot(&changes).await);
    assert!(differ.is_empty(), "the tree changed: {differ:?}");
}

/// The one exception to invariant 1, with its reason: a transaction over kv keys pins each key
/// it read absent by creating and deleting it in its commit (README, Transactions over keys), so
/// that one that appeared meanwhile refuses the commit. A reader's transaction leaves nothing, but
/// watchers of such a key see it come and go. These pairs (a key created, then deleted, in one
/// request) are taken out of what a reader changed; anything else a transaction leaves counts.
fn without_transient_pins(changes: Vec<String>) -> Vec<String> {
    let created = |path: &str| changes.iter().any(|c| c == &format!("NodeCreated {path}"));
    let deleted = |path: &str| changes.iter().any(|c| c == &format!("NodeDeleted {path}"));
    (changes.iter())
        .filter(|change| {
            let path = change.split_once(' ').map_or("", |(_, path)| path);
            !(path.starts_with("/zkgate/kv/") && created(path) && deleted(path))
        })
        .cloned()
        .collect()
}

/// Reads another principal may make of what alice's lease holds, by design, with the reason.
const READABLE: &[(&str, &str)] = &[
    (
        "GET /v1/kv/{key}",
        "a key's value is any reader's of the key; its binding shows as `ZKGATE-Lease`",
    ),
    (
        "GET /v1/services/{name}/instances/{id}",
        "service discovery: an instance is any reader's of the service",
    ),
];

/// Requests that name an id alice's lease holds to take it for another lease: refused 409
/// (`member-taken`), as for any other lease (the owner's own included), rather than 403.
const TAKEN: &[(&str, &str)] = &[
    (
        "PUT /v1/groups/{group}/members/{member}",
        "a member id is one lease's: joining with it under another lease is `409 member-taken`, whoever asks",
    ),
    (
        "PUT /v1/services/{name}/instances/{id}",
        "an instance id is one lease's: registering it under another lease is `409 member-taken`, whoever asks",
    ),
];

/// Invariant 2: bob, acting on what alice's lease holds (a handle, a set, a claim, a member, a
/// participant, an instance, a bound key, her lease itself), is refused (403 or 404) and leaves
/// it as it was; with hostile parameters and bodies too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_cannot_act_on_what_a_lease_holds() {
    let s = setup().await;
    let mut changes = Changes::watch(&s.zk.connect_string()).await;
    // What bob stores of his own is not alice's.
    changes.ignored = vec!["/zkgate/usage/bob".into(), "/zkgate/idempotency/bob".into()];
    let before = snapshot(&changes).await;
    let operations = callable(&s.world);
    let mut wrong = Vec::new();
    let (mut covered, mut readable, mut sent) = (0, 0, 0);
    for (operation, valid) in &operations {
        let owned: Vec<&Request> = valid.iter().filter(|r| r.names_owned).collect();
        if owned.is_empty() {
            continue;
        }
        if READABLE.iter().any(|(name, _)| *name == operation.name()) {
            readable += 1;
            continue;
        }
        covered += 1;
        let hostile = s.world.hostile(operation, owned[0]);
        for request in owned.iter().copied().chain(&hostile) {
            for gate in [&s.a, &s.b] {
                let reply = send(gate, &s.bob, request, operation.streams()).await;
                sent += 1;
                let taken = TAKEN.iter().any(|(name, _)| *name == operation.name());
                let refused = [StatusCode::FORBIDDEN, StatusCode::NOT_FOUND].contains(&reply.status)
                    || (taken && reply.status == StatusCode::CONFLICT);
                let hostile = !owned.iter().any(|r| r.path == request.path && r.body == request.body);
                // A request refused as malformed for a parameter that names nothing of alice's
                // (a combination of the generator's that contradicts itself) acts on nothing.
                let field = reply.body["field"].as_str().unwrap_or_default();
                let names_alices = OWNED_PARAMS.contains(&field) || ["lease", "ZKGATE-Guard"].contains(&field);
                let malformed_elsewhere = reply.status == StatusCode::BAD_REQUEST && !field.is_empty() && !names_alices;
                // A valid request is refused; a hostile one may be refused as malformed instead.
                let accepted = refused || malformed_elsewhere || (hostile && reply.status.is_client_error());
                if !accepted {
                    wrong.push(format!("{} {} as bob: {reply:?}", request.method, request.path));
                }
            }
        }
        let changed = changes.since().await;
        if !changed.is_empty() {
            wrong.push(format!("{}: {changed:?}", operation.name()));
        }
    }
    println!(
        "invariant 2 (another principal cannot act on what a lease holds): {covered} operations name something \
         alice's lease holds and were refused ({readable} are reads any reader may make, listed; the other {} name \
         nothing a lease holds), {sent} requests through both instances",
        operations.len() - covered - readable
    );
    assert!(covered > 20, "{covered}");
    assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));
    let differ = differences(&before, &snapshot(&changes).await);
    assert!(differ.is_empty(), "alice's things changed: {differ:?}");
}

/// What a znode under the root is, for invariant 3.
#[derive(Debug)]
enum Class {
    /// A client's value, charged to its principal: how its charge is found.
    Charged(ChargeAt),
    /// zkgate's own bookkeeping, at most this many bytes; what bounds how many there are.
    Bookkeeping(usize, &'static str),
}

/// Where a value's charge is.
#[derive(Debug)]
enum ChargeAt {
    /// `usage/<principal>/<prefix>-<hash of the value's path>` (a kv key, an election's value).
    PathId(&'static str),
    /// Named in the item's own header (a queue item).
    Envelope,
    /// Named by the holding record of the lease that holds it (a member's or an instance's data).
    HoldingRecord,
    /// `usage/<principal>/ik-<id>` (an idempotency key's record `idempotency/<principal>/<id>`).
    KeyRecord,
}

/// The largest bookkeeping record (a lease's, a holding's, an owner's, a claim's...): its ids,
/// a resource's path (a kv key may have 16 segments of 128 bytes) and a few fields.
const RECORD_BYTES: usize = 4 * 1024;

/// Every kind of znode zkgate keeps under its root, by its path (`*`: one segment, `**`: any
/// number), with its class. A znode that matches none fails invariant 3.
const LAYOUT: &[(&str, Class)] = &[
    ("kv/**", Class::Charged(ChargeAt::PathId("kv"))),
    ("queues/*/items/*", Class::Charged(ChargeAt::Envelope)),
    ("queues/*/dead/*", Class::Charged(ChargeAt::Envelope)),
    ("groups/*/*", Class::Charged(ChargeAt::HoldingRecord)),
    ("services/*/*", Class::Charged(ChargeAt::HoldingRecord)),
    ("idempotency/*/*", Class::Charged(ChargeAt::KeyRecord)),
    ("elections/*/leader", Class::Charged(ChargeAt::PathId("el"))),
    (
        "leases/*",
        Class::Bookkeeping(RECORD_BYTES, "live leases: --max-leases-per-principal per instance"),
    ),
    (
        "leases/*/*",
        Class::Bookkeeping(RECORD_BYTES, "a lease's holdings: its contenders, members, bindings"),
    ),
    (
        "bindings/*",
        Class::Bookkeeping(RECORD_BYTES, "one per member or bound key a lease holds"),
    ),
    (
        "locks/*/*",
        Class::Bookkeeping(RECORD_BYTES, "contenders: --max-waiters-per-principal, -per-lock"),
    ),
    (
        "rwlocks/*/*",
        Class::Bookkeeping(RECORD_BYTES, "contenders: --max-waiters-per-principal, -per-lock"),
    ),
    (
        "elections/*/*",
        Class::Bookkeeping(RECORD_BYTES, "candidates: --max-waiters-per-principal, -per-lock"),
    ),
    (
        "semaphores/*",
        Class::Bookkeeping(64, "the permits it was made with: one a semaphore"),
    ),
    (
        "semaphores/*/*/*",
        Class::Bookkeeping(RECORD_BYTES, "permit requests: --max-waiters-per-principal"),
    ),
    (
        "barriers/*",
        Class::Bookkeeping(RECORD_BYTES, "one a lease's barrier (or a client's own)"),
    ),
    (
        "double-barriers/*",
        Class::Bookkeeping(64, "its size: one a double barrier, removed empty"),
    ),
    (
        "double-barriers/*/*",
        Class::Bookkeeping(RECORD_BYTES, "participants: each a lease's holding"),
    ),
    (
        "txns/*/members/*",
        Class::Bookkeeping(RECORD_BYTES, "participants: each a lease's holding"),
    ),
    ("txns/*/votes/*", Class::Bookkeeping(RECORD_BYTES, "one a participant")),
    ("txns/*/decision", Class::Bookkeeping(RECORD_BYTES, "one a transaction")),
    (
        "queues/*/claims/*",
        Class::Bookkeeping(RECORD_BYTES, "one an item taken (--queue-max-depth)"),
    ),
    (
        "lock-sets/*",
        Class::Bookkeeping(16 * 1024, "one a set a lease holds: at most 64 lock names"),
    ),
    (
        "usage/**",
        Class::Bookkeeping(
            1024,
            "a charge: a byte per KiB it charges, bounded by the quotas it counts in",
        ),
    ),
    ("quota-probe", Class::Bookkeeping(0, "one")),
    (
        "revocations/*",
        Class::Bookkeeping(
            RECORD_BYTES,
            "the revocation log keeps the newest 1000, `by` and `reason` 500 bytes each",
        ),
    ),
];

/// Client data no charge covers yet, found by invariant 3's first run, with the reason it is
/// left (each is in docs/SECURITY.md's list of exceptions).
const UNCHARGED: &[(&str, &str)] = &[
    (
        "counters/*",
        "a counter's value is 8 bytes, a znode each, bounded by the whole tree's quota (--quota-znodes) alone",
    ),
    (
        "txns/*",
        "a two-phase commit's record and payload (at most --max-value-bytes), removed --txn-retention after \
         its decision; bounded by the whole tree's quota alone",
    ),
];

/// The class of `path` (relative to the root, like `kv/a/b`), if [LAYOUT] names it.
fn class_of(path: &str) -> Option<&'static Class> {
    let segments: Vec<&str> = path.split('/').collect();
    LAYOUT.iter().find_map(|(pattern, class)| {
        let parts: Vec<&str> = pattern.split('/').collect();
        let matches = match parts.iter().position(|p| *p == "**") {
            Some(at) => segments.len() > at && parts[..at].iter().zip(&segments).all(|(p, s)| *p == "*" || p == s),
            None => parts.len() == segments.len() && parts.iter().zip(&segments).all(|(p, s)| *p == "*" || p == s),
        };
        matches.then_some(class)
    })
}

/// Invariant 3: after alice has called every operation validly (through both instances), every
/// znode under the root is a value charged to a principal, whose charge is there and covers its
/// bytes, or zkgate's bookkeeping of at most its stated size; and again once she has deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_byte_stored_is_charged_or_bounded_bookkeeping() {
    let s = setup().await;
    let client = zk_client(&s.zk.connect_string()).await;
    let operations = callable(&s.world);
    let (deletes, others): (Vec<_>, Vec<_>) = operations.iter().partition(|(o, _)| o.method == Method::DELETE);
    let mut key = 0;
    let mut wrong = Vec::new();
    for phase in [others, deletes] {
        for (operation, valid) in &phase {
            for request in valid {
                for gate in [&s.a, &s.b] {
                    // A key of its own for each request that takes one.
                    let mut request = request.clone();
                    for (name, value) in &mut request.headers {
                        if name.eq_ignore_ascii_case("idempotency-key") {
                            key += 1;
                            *value = format!("stored-{key}");
                        }
                    }
                    let reply = send(gate, &s.alice, &request, operation.streams()).await;
                    if reply.status.is_server_error() {
                        wrong.push(format!("{} {}: {reply:?}", request.method, request.path));
                    }
                }
            }
        }
        wrong.extend(unaccounted(&client).await);
    }
    println!(
        "invariant 3 (every byte charged, or bounded bookkeeping): {} operations called by a writer through both \
         instances, the tree checked against {} kinds of znode ({} kinds of client data listed as not charged: {:?})",
        operations.len(),
        LAYOUT.len(),
        UNCHARGED.len(),
        UNCHARGED.iter().map(|(kind, _)| kind).collect::<Vec<_>>()
    );
    assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));
}

/// What under the root is neither charged nor bounded bookkeeping, as the tree is now.
async fn unaccounted(client: &Client) -> Vec<String> {
    let nodes = tree(client, "/zkgate").await;
    let charges: HashMap<&str, usize> = (nodes.iter())
        .filter_map(|(path, data)| Some((path.strip_prefix("/zkgate/usage/")?, data.len())))
        .collect();
    // The charge each lease's holding record names for the node it holds.
    let held: HashMap<String, String> = (nodes.iter())
        .filter(|(path, _)| path.starts_with("/zkgate/leases/") && path.matches('/').count() == 4)
        .filter_map(|(_, data)| {
            let record: Value = serde_json::from_slice(data).ok()?;
            Some((
                record["path"].as_str()?.to_string(),
                record["charge"].as_str()?.to_string(),
            ))
        })
        .collect();
    let covers = |charge: &str, bytes: usize| charges.get(charge).is_some_and(|units| units * 1024 >= bytes);
    let mut wrong = Vec::new();
    for (path, data) in &nodes {
        let Some(relative) = path.strip_prefix("/zkgate/") else {
            continue;
        };
        if data.is_empty() || VOLATILE.iter().any(|v| path.starts_with(v)) || relative.contains("zz-invariants") {
            continue;
        }
        let listed = |kind: &str| {
            let parts = kind.split('/').count();
            relative.split('/').count() == parts && relative.starts_with(kind.trim_end_matches('*'))
        };
        if UNCHARGED.iter().any(|(kind, _)| listed(kind)) {
            continue;
        }
        let charge = match class_of(relative) {
            None => {
                wrong.push(format!("{path} ({} bytes): no kind of znode zkgate keeps", data.len()));
                continue;
            }
            Some(Class::Bookkeeping(most, bounded_by)) => {
                if data.len() > *most {
                    wrong.push(format!(
                        "{path}: {} bytes of bookkeeping, more than {most} ({bounded_by})",
                        data.len()
                    ));
                }
                continue;
            }
            Some(Class::Charged(ChargeAt::PathId(prefix))) => {
                // An election's acknowledgement holds a value only once one was proclaimed.
                if *prefix == "el" && serde_json::from_slice::<Value>(data).is_ok_and(|ack| ack["value"].is_null()) {
                    continue;
                }
                let id = zkgate::recipes::usage::path_id(prefix, path);
                charges
                    .keys()
                    .find(|c| c.ends_with(&format!("/{id}")))
                    .map(|c| c.to_string())
            }
            Some(Class::Charged(ChargeAt::Envelope)) => String::from_utf8_lossy(data)
                .lines()
                .nth(1)
                .and_then(|header| serde_json::from_str::<Value>(header).ok())
                .and_then(|h| {
                    Some(format!(
                        "{}/{}",
                        h["charge"]["principal"].as_str()?,
                        h["charge"]["id"].as_str()?
                    ))
                }),
            Some(Class::Charged(ChargeAt::HoldingRecord)) => held
                .get(path.as_str())
                .and_then(|c| c.strip_prefix("/zkgate/usage/"))
                .map(String::from),
            Some(Class::Charged(ChargeAt::KeyRecord)) => {
                let mut parts = relative.split('/').skip(1);
                parts
                    .next()
                    .zip(parts.next())
                    .map(|(principal, id)| format!("{principal}/ik-{id}"))
            }
        };
        match charge {
            Some(charge) if covers(&charge, data.len()) => {}
            charge => wrong.push(format!(
                "{path} ({} bytes): charged to nothing that covers it ({charge:?})",
                data.len()
            )),
        }
    }
    wrong
}

/// Invariant 4: while ZooKeeper is away, every operation of the served spec answers, none waits
/// for ZooKeeper to come back, and none answers a server error other than `503` (README, How it
/// behaves: Through a ZooKeeper outage); once ZooKeeper is back, both instances serve. Each
/// valid request of each operation is sent through one instance, 16 at a time; a request
/// answers within 2 s (a stream's head) or 30 s (any other: the session's timeout, for which a
/// request in flight waits for a reconnection, plus the 10 s bound of a release or a long poll
/// that gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_while_zookeeper_is_away() {
    use futures::StreamExt;
    let mut s = setup_on(common::TestZooKeeper::Own(common::zookeeper_own().await)).await;
    let operations = callable(&s.world);
    let Setup {
        both: common::TwoInstances { zk, a, b, .. },
        alice,
        ..
    } = &mut s;
    let (a, b, alice) = (&*a, &*b, &*alice);
    let common::TestZooKeeper::Own(server) = zk else {
        unreachable!("a server of the test's own")
    };
    server.kill();
    let readiness = |gate: &Gate| {
        let url = format!("{}/readyz", gate.url);
        let http = gate.http.clone();
        async move { http.get(url).send().await.map(|r| r.status()).ok() }
    };
    common::until_answered(
        Duration::from_secs(30),
        "the instance to see ZooKeeper gone",
        async || readiness(a).await == Some(StatusCode::SERVICE_UNAVAILABLE),
    )
    .await;
    let requests: Vec<(String, &Request, bool)> = operations
        .iter()
        .flat_map(|(operation, valid)| valid.iter().map(move |r| (operation.name(), r, operation.streams())))
        .collect();
    let sent = requests.len();
    let started = std::time::Instant::now();
    let answers: Vec<(String, String, Result<Reply, reqwest::Error>)> = futures::stream::iter(requests)
        .map(|(name, request, streams)| async move {
            let answer = try_send(a, alice, request, streams).await;
            (name, format!("{} {}", request.method, request.path), answer)
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut wrong = Vec::new();
    let mut statuses = BTreeMap::<u16, usize>::new();
    for (name, request, answer) in &answers {
        match answer {
            Ok(reply)
                if reply.status == StatusCode::INTERNAL_SERVER_ERROR
                    || (reply.status.is_server_error() && reply.status != StatusCode::SERVICE_UNAVAILABLE) =>
            {
                wrong.push(format!("{name}: {request}: {reply:?}"))
            }
            Ok(reply) => *statuses.entry(reply.status.as_u16()).or_default() += 1,
            Err(error) => wrong.push(format!("{name}: {request}: no answer: {error}")),
        }
    }
    println!(
        "invariant 4 (every operation answers while ZooKeeper is away): {} operations, {sent} requests in {} ms; answers by status: {statuses:?}",
        operations.len(),
        started.elapsed().as_millis()
    );
    assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));

    server.restart(&common::test_server_options()).expect("restart");
    server
        .wait_serving(Duration::from_secs(60))
        .await
        .expect("serves again");
    for gate in [a, b] {
        common::until_answered(Duration::from_secs(30), "the instance to serve again", async || {
            readiness(gate).await == Some(StatusCode::OK)
        })
        .await;
    }
}

/// The operations that write a resource's data, from the spec: every one but the probes'
/// reads, those of leases, and those that take, release or revoke a contended holding (a lock,
/// a read/write lock, a semaphore's permit, a candidacy: what a guard names, not what it
/// guards). Each must take `ZKGATE-Guard` (the shared parameter).
fn writes_data(operation: &Operation) -> bool {
    let segment = operation.template.split('/').nth(2).unwrap_or_default();
    let holdings = ["leases", "locks", "rwlocks", "semaphores", "lock-sets", "elections"];
    let proclaim = operation.template.ends_with("/leader");
    operation.method != Method::GET && (!holdings.contains(&segment) || proclaim)
}

/// Writing operations that do not take a guard yet, with the reason (none now: a new writing
/// operation that takes none is listed here with why, or fails the run).
const NOT_GUARDED_YET: &[(&str, &str)] = &[];

/// Invariant 5: a write guarded by a holding its writer no longer has writes nothing, through
/// either instance, whatever the operation: 409 `guard-lost`, and the tree as it was. The same
/// write guarded by a holding the writer has is not refused for its guard. Every operation
/// that writes data takes the guard, but those listed in [NOT_GUARDED_YET].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_guarded_by_a_lost_holding_writes_nothing() {
    let s = setup().await;
    let operations = callable(&s.world);
    let takes_guard = |operation: &Operation| {
        (operation.params.iter()).any(|(name, place, _)| place == "header" && name.eq_ignore_ascii_case("ZKGATE-Guard"))
    };
    let missing: Vec<String> = (operations.iter().map(|(o, _)| o))
        .filter(|o| writes_data(o) && !takes_guard(o))
        .map(Operation::name)
        .filter(|name| !NOT_GUARDED_YET.iter().any(|(listed, _)| listed == name))
        .collect();
    assert!(missing.is_empty(), "writing operations that take no guard: {missing:?}");
    let stale_listed: Vec<&str> = (NOT_GUARDED_YET.iter().map(|(name, _)| *name))
        .filter(|name| operations.iter().any(|(o, _)| o.name() == *name && takes_guard(o)))
        .collect();
    assert!(
        stale_listed.is_empty(),
        "guarded now, listed as not yet: {stale_listed:?}"
    );

    // A lock alice held and released: its guard is stale.
    let with = Some(json!({ "lease": s.world.lease }));
    let held = (s.a).call_as(Some(&s.alice), Method::POST, "/v1/locks/gone/acquire?wait=5s", with);
    let held = held.await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let stale = format!("lock/gone; handle={}", held.str("handle"));
    let release = format!("/v1/locks/gone/handles/{}", held.str("handle"));
    let released = s.a.call_as(Some(&s.alice), Method::DELETE, &release, None).await;
    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
    let live = format!("lock/w; handle={}", s.world.handles["locks"]);

    let mut changes = Changes::watch(&s.zk.connect_string()).await;
    let mut wrong = Vec::new();
    let mut checked = 0;
    let is_lost =
        |reply: &Reply| reply.status == StatusCode::CONFLICT && reply.body["type"] == "urn:zkgate:problem:guard-lost";
    let guarded = |request: &Request, guard: &str| {
        let mut request = request.clone();
        request
            .headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case("ZKGATE-Guard"));
        request.headers.push(("ZKGATE-Guard".into(), guard.to_string()));
        request
    };
    // Every operation with a stale guard first, so that nothing a live guard's write does (a
    // container ZooKeeper removes once it empties, say) happens meanwhile.
    let mut refused = Vec::new();
    for (operation, valid) in operations.iter().filter(|(o, _)| takes_guard(o)) {
        // Each valid request: refused for its guard, or (the generator's combinations that
        // contradict themselves) for its parameters, which are checked first.
        let mut first = None;
        for request in valid {
            for gate in [&s.a, &s.b] {
                let reply = send(gate, &s.alice, &guarded(request, &stale), operation.streams()).await;
                match reply.status {
                    _ if is_lost(&reply) => {
                        first.get_or_insert(request);
                        checked += 1;
                    }
                    StatusCode::BAD_REQUEST => {}
                    _ => wrong.push(format!("{} with a stale guard: {reply:?}", operation.name())),
                }
            }
        }
        let changed = without_transient_pins(changes.since().await);
        if !changed.is_empty() {
            wrong.push(format!("{} with a stale guard changed {changed:?}", operation.name()));
        }
        match first {
            Some(request) => refused.push((operation, request)),
            None => wrong.push(format!("{}: no request refused for its stale guard", operation.name())),
        }
    }
    // Then each with alice's live guard: not refused for it.
    for (operation, request) in refused {
        let reply = send(&s.b, &s.alice, &guarded(request, &live), operation.streams()).await;
        if is_lost(&reply) || reply.status.is_server_error() {
            wrong.push(format!("{} with a live guard: {reply:?}", operation.name()));
        }
    }
    let guarded = operations.iter().filter(|(o, _)| takes_guard(o)).count();
    println!("{checked} writes refused for a stale guard, over {guarded} operations");
    assert!(guarded >= 9, "too few operations take a guard: {guarded}");
    assert!(wrong.is_empty(), "{wrong:#?}");
}
