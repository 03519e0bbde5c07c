//! Work through an outage (issue 53, part 3): two zkgate processes and their clients go on
//! while ZooKeeper is away for longer than any session timeout, and nothing they were told is
//! broken.
//!
//! On one lock, `outage`: HTTP clients cycling through both instances (acquire, a short
//! critical section, release) on leases whose TTL (5 s) runs out in the outage, two Apache
//! Curator `InterProcessMutex` holders on the same znodes (tests/interop/CuratorHolder.java),
//! and one patient HTTP holder whose lease (60 s) outlives the outage and who holds across it.
//! Beside them a queue is filled and drained, and a counter added to, through both instances,
//! each write retried with its idempotency key until it is acknowledged; and an item is taken
//! just before the outage and never acknowledged, so that its ack deadline passes in it.
//!
//! Afterwards:
//! - **no two holders at once**, from the clients' own timestamps (microseconds of the wall
//!   clock, which the Java holders read too): a hold lasts from the grant's answer to the
//!   release's sending, cut short where the holder should stop trusting it (an HTTP holder at
//!   its lease's TTL after the last keepalive it was answered, sent time; a Curator holder at
//!   `SUSPENDED`, Curator's rule);
//! - the patient holder is told its lease survived (its keepalive answers 200) and still
//!   holds the lock;
//! - **no acknowledged queue put or counter add lost**, none applied twice, no item whose ack
//!   was acknowledged delivered again, and the item whose claim lapsed in the outage delivered
//!   again;
//! - **every lease alive or ended with a reason** its holder reads (`410` and a `reason`);
//! - no request hung (each has 30 s; the README's bound for an answer in an outage is 10 s
//!   past the session's own timeout), and the instances serve again within the README's bound.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

use super::BACK_WITHIN;
use crate::common::process::Process;
use crate::common::{self, Ensemble, until_answered, within};

/// How long ZooKeeper stays away: longer than every session timeout involved (the
/// instances' 2 s, the Curator holders' 10 s) and than the cycling clients' TTL.
const AWAY: Duration = Duration::from_secs(15);

/// The lock everyone contends for, and its znodes (shared with Curator).
const LOCK: &str = "outage";
const LOCK_PATH: &str = "/zkgate/locks/outage";

/// The cycling clients' lease TTL (shorter than [AWAY]: their leases run out in the outage),
/// and the patient holder's (longer: its lease survives it).
const CYCLING_TTL: Duration = Duration::from_secs(5);
const PATIENT_TTL: Duration = Duration::from_secs(60);

/// How long any one request may take before the run counts it as hung.
const HUNG: Duration = Duration::from_secs(30);

/// HTTP clients cycling on the lock per instance, and Curator holders.
const CYCLERS_PER_INSTANCE: usize = 2;
const CURATORS: usize = 2;

/// Microseconds since the epoch: the clock both the test and the Java holders read.
fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// One time a client believed it held the lock.
#[derive(Debug, Clone)]
struct Hold {
    holder: String,
    from: u64,
    to: u64,
    /// How it ended: `released`, `suspended` (Curator lost its connection), `ttl` (the HTTP
    /// holder's lease ran out before the release was sent).
    how: String,
}

/// No two holds overlap. Holds that end before they begin (granted when the holder already
/// had to distrust it) are empty and overlap nothing. Returns the number of holds checked.
fn one_holder_at_a_time(holds: &[Hold]) -> Result<usize, String> {
    let mut holds: Vec<&Hold> = holds.iter().filter(|h| h.to > h.from).collect();
    holds.sort_by_key(|h| h.from);
    let mut latest: Option<&Hold> = None;
    for hold in &holds {
        if let Some(earlier) = latest
            && hold.from < earlier.to
        {
            return Err(format!(
                "two holders: {hold:?} began {} µs before {earlier:?} ended",
                earlier.to - hold.from
            ));
        }
        if latest.is_none_or(|l| hold.to > l.to) {
            latest = Some(hold);
        }
    }
    Ok(holds.len())
}

#[test]
fn the_hold_checker_finds_two_holders() {
    let hold = |holder: &str, from, to| Hold {
        holder: holder.into(),
        from,
        to,
        how: "released".into(),
    };
    assert_eq!(one_holder_at_a_time(&[hold("a", 0, 10), hold("b", 10, 20)]), Ok(2));
    assert!(one_holder_at_a_time(&[hold("a", 0, 10), hold("b", 9, 20)]).is_err());
    // A long hold overlapping a later one past a short one in between.
    assert!(one_holder_at_a_time(&[hold("a", 0, 100), hold("b", 100, 90), hold("c", 50, 60)]).is_err());
}

/// What the clients were told.
#[derive(Default)]
struct Ledger {
    holds: Vec<Hold>,
    /// Every lease a client made.
    leases: Vec<String>,
    /// Counter adds acknowledged (each key once).
    added: u64,
    /// Queue items whose put was acknowledged.
    put: BTreeSet<u64>,
    /// Acknowledged acks per item.
    acked: BTreeMap<u64, usize>,
    /// Items whose ack went unanswered (503) and then found its claim gone: done or not.
    in_doubt: BTreeSet<u64>,
    deliveries: usize,
    /// Requests answered 503, and requests that took longer than [HUNG].
    unavailable: usize,
    hung: Vec<String>,
    /// Curator's connection states as its holders heard them, for the report.
    states: Vec<String>,
    /// Each client's last request and its answer, for a failure's message.
    doing: BTreeMap<String, String>,
}

/// The ledger, and a counter that moves whenever it changes (to wait on).
struct Shared {
    ledger: Mutex<Ledger>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn record(&self, change: impl FnOnce(&mut Ledger)) {
        change(&mut self.ledger.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
    }

    fn read<T>(&self, read: impl FnOnce(&Ledger) -> T) -> T {
        read(&self.ledger.lock().unwrap())
    }

    /// Waits (bounded) until `test` holds of the ledger.
    async fn until(&self, limit: Duration, what: &str, test: impl Fn(&Ledger) -> bool) {
        let mut changed = self.changed.subscribe();
        within(limit, what, async {
            while !self.read(&test) {
                changed.changed().await.expect("the ledger lives");
            }
        })
        .await;
    }
}

/// One instance as a client sees it.
#[derive(Clone)]
struct Instance {
    http: reqwest::Client,
    url: String,
    shared: Arc<Shared>,
    /// The client's name, for [Ledger::doing].
    who: String,
}

impl Instance {
    /// The same instance, for client `who`.
    fn named(&self, who: String) -> Instance {
        Instance { who, ..self.clone() }
    }

    /// Sends a request; `None` if it failed or hung (both recorded). A 503 is counted.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> Option<(StatusCode, Value)> {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let sent = Instant::now();
        let answer = async {
            let reply = request.send().await.ok()?;
            let status = reply.status();
            let text = reply.text().await.ok()?;
            Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
        };
        let answer = tokio::time::timeout(HUNG, answer).await;
        let said = match &answer {
            Ok(Some((status, _))) => status.to_string(),
            Ok(None) => "no answer".to_string(),
            Err(_) => "hung".to_string(),
        };
        let doing = format!("{method} {path}: {said} at {}", now_micros());
        self.shared.record(|l| {
            l.doing.insert(self.who.clone(), doing);
        });
        match answer {
            Err(_) => {
                let what = format!("{method} {path} after {:?}", sent.elapsed());
                self.shared.record(|l| l.hung.push(what));
                None
            }
            Ok(Some((StatusCode::SERVICE_UNAVAILABLE, _))) => {
                self.shared.record(|l| l.unavailable += 1);
                None
            }
            Ok(answer) => answer,
        }
    }
}

/// A client's pause after an unavailable answer, as a client would (not a synchronisation).
async fn back_off() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A lease and when its holder must stop trusting it: its TTL after the sending of the last
/// request that was answered as keeping it alive.
struct Lease {
    id: String,
    ttl: Duration,
    trust_until: AtomicU64,
}

impl Lease {
    async fn create(at: &Instance, ttl: Duration) -> Option<Lease> {
        let sent = now_micros();
        let body = json!({ "ttl": format!("{}s", ttl.as_secs()) });
        match at.call(Method::POST, "/v1/leases", Some(body), None).await? {
            (StatusCode::CREATED, lease) => {
                let id = lease["id"].as_str().expect("an id").to_string();
                at.shared.record(|l| l.leases.push(id.clone()));
                Some(Lease {
                    id,
                    ttl,
                    trust_until: AtomicU64::new(sent + ttl.as_micros() as u64),
                })
            }
            (status, body) => panic!("a lease's create answered {status}: {body}"),
        }
    }

    /// A keepalive: `Some(true)` if answered alive, `Some(false)` if the lease is gone (410),
    /// `None` if unanswered.
    async fn keepalive(&self, at: &Instance) -> Option<bool> {
        let sent = now_micros();
        let path = format!("/v1/leases/{}/keepalive", self.id);
        match at.call(Method::POST, &path, None, None).await? {
            (StatusCode::OK, _) => {
                self.trust_until
                    .fetch_max(sent + self.ttl.as_micros() as u64, Ordering::SeqCst);
                Some(true)
            }
            (StatusCode::GONE, _) => Some(false),
            (status, body) => panic!("a keepalive answered {status}: {body}"),
        }
    }

    fn trusted_until(&self) -> u64 {
        self.trust_until.load(Ordering::SeqCst)
    }
}

/// `POST /v1/locks/outage/acquire` with `lease`: the grant, or why not.
enum Acquired {
    Granted(Value),
    /// The wait ended (409), or no answer: try again.
    NotYet,
    /// The lease is gone (410).
    LeaseGone,
}

async fn acquire(at: &Instance, lease: &Lease, wait: &str) -> Acquired {
    let path = format!("/v1/locks/{LOCK}/acquire?wait={wait}");
    match at
        .call(Method::POST, &path, Some(json!({ "lease": lease.id })), None)
        .await
    {
        Some((StatusCode::OK, granted)) => Acquired::Granted(granted),
        Some((StatusCode::CONFLICT, _)) | None => Acquired::NotYet,
        Some((StatusCode::GONE, _)) => Acquired::LeaseGone,
        Some((status, body)) => panic!("an acquire answered {status}: {body}"),
    }
}

/// Releases `handle`, asking again while unanswered, as a client would: 204, or the handle
/// already gone (its lease ended, or an earlier attempt did it).
async fn release(at: &Instance, handle: &str) {
    let path = format!("/v1/locks/{LOCK}/handles/{handle}");
    loop {
        match at.call(Method::DELETE, &path, None, None).await {
            Some((StatusCode::NO_CONTENT | StatusCode::GONE | StatusCode::NOT_FOUND, _)) => return,
            Some((status, body)) => panic!("a release answered {status}: {body}"),
            None => back_off().await,
        }
    }
}

/// An HTTP client cycling on the lock until `stop`: acquire, hold 10 to 60 ms, release; a new
/// lease when its own is gone.
async fn cycle(name: String, at: Instance, stop: Arc<AtomicBool>) {
    let mut lease: Option<Lease> = None;
    while !stop.load(Ordering::SeqCst) {
        let Some(held) = &lease else {
            lease = Lease::create(&at, CYCLING_TTL).await;
            if lease.is_none() {
                back_off().await;
            }
            continue;
        };
        match acquire(&at, held, "1s").await {
            Acquired::Granted(granted) => {
                let from = now_micros();
                let millis = 10 + (from % 50);
                tokio::time::sleep(Duration::from_millis(millis)).await; // the critical section
                let (to, how) = match now_micros() {
                    now if now <= held.trusted_until() => (now, "released"),
                    _ => (held.trusted_until(), "ttl"),
                };
                let hold = Hold {
                    holder: name.clone(),
                    from,
                    to,
                    how: how.into(),
                };
                at.shared.record(|l| l.holds.push(hold));
                release(&at, granted["handle"].as_str().expect("a handle")).await;
            }
            Acquired::NotYet => back_off().await,
            Acquired::LeaseGone => {
                lease = None;
                continue;
            }
        }
        if held.keepalive(&at).await == Some(false) {
            lease = None;
        }
    }
}

/// A Curator holder process and the task reading what it says.
struct Curator {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    /// Whether it said BYE before its output ended.
    said: JoinHandle<bool>,
}

impl Curator {
    async fn start(name: String, connect: &str, shared: Arc<Shared>) -> Curator {
        let mut child = common::java::command("CuratorHolder", &[connect, LOCK_PATH, "40"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the Curator holder (is the test command's install step done?)");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        // READY once connected (its first connection's STATE line may come before).
        within(Duration::from_secs(60), "the Curator holder to connect", async {
            loop {
                match lines.next_line().await.expect("read the holder").as_deref() {
                    Some("READY") => return,
                    Some(line) if line.starts_with("STATE ") => {}
                    other => panic!("{name} said {other:?} before READY"),
                }
            }
        })
        .await;
        let said = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let words: Vec<&str> = line.split(' ').collect();
                match words[..] {
                    ["HELD", from, to, how] => {
                        let hold = Hold {
                            holder: name.clone(),
                            from: from.parse().expect("micros"),
                            to: to.parse().expect("micros"),
                            how: how.into(),
                        };
                        shared.record(|l| l.holds.push(hold));
                    }
                    ["STATE", state, _] => shared.record(|l| l.states.push(format!("{name}: {state}"))),
                    ["BYE"] => return true,
                    _ => panic!("{name} said: {line}"),
                }
            }
            false
        });
        Curator { child, stdin, said }
    }

    async fn stop(mut self) {
        self.stdin.write_all(b"quit\n").await.expect("tell the holder to stop");
        let said_bye = within(Duration::from_secs(30), "the Curator holder's last hold", self.said)
            .await
            .expect("the holder's lines");
        assert!(said_bye, "the Curator holder exited without saying BYE");
        within(Duration::from_secs(30), "the Curator holder to exit", self.child.wait())
            .await
            .expect("exit");
    }
}

/// Sends a keyed write (`POST path` with `body` and `Idempotency-Key: key`) again until it is
/// acknowledged, as a client that must not lose it does: with the key it lands once however
/// many times it is sent.
async fn until_acknowledged(at: &Instance, path: &str, body: Value, key: &str) {
    loop {
        match at.call(Method::POST, path, Some(body.clone()), Some(key)).await {
            Some((status, _)) if status.is_success() => return,
            Some((status, answer)) => panic!("POST {path} answered {status}: {answer}"),
            None => back_off().await,
        }
    }
}

/// Puts items `from..` on queue `drained` until `stop`, each acknowledged.
async fn produce(at: Instance, from: u64, stop: Arc<AtomicBool>) {
    for id in from.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        until_acknowledged(
            &at,
            "/v1/queues/drained/items",
            json!({ "id": id }),
            &format!("item-{id}"),
        )
        .await;
        at.shared.record(|l| {
            l.put.insert(id);
        });
    }
}

/// Takes items of queue `drained` and acks each, until `stop` and the queue is empty (its
/// claimed items included).
async fn consume(at: Instance, stop: Arc<AtomicBool>) {
    loop {
        let taken = at
            .call(
                Method::POST,
                "/v1/queues/drained/take?wait=1s&ack_deadline=3s",
                None,
                None,
            )
            .await;
        let item = match taken {
            Some((StatusCode::OK, item)) => item,
            Some((StatusCode::NO_CONTENT, _)) => {
                // Done when asked to stop and nothing is left, claimed items included.
                if stop.load(Ordering::SeqCst)
                    && let Some((StatusCode::OK, queue)) = at.call(Method::GET, "/v1/queues/drained", None, None).await
                    && queue["depth"] == 0
                    && queue["in_flight"] == 0
                {
                    return;
                }
                continue;
            }
            Some((status, body)) => panic!("a take answered {status}: {body}"),
            None => {
                back_off().await;
                continue;
            }
        };
        let id = item["body"]["id"].as_u64().expect("an id");
        at.shared.record(|l| l.deliveries += 1);
        let ack = format!(
            "/v1/queues/drained/claims/{}/ack",
            item["claim"].as_str().expect("a claim")
        );
        let mut unanswered = false;
        loop {
            match at.call(Method::POST, &ack, None, None).await {
                Some((StatusCode::NO_CONTENT, _)) => {
                    at.shared.record(|l| *l.acked.entry(id).or_default() += 1);
                    break;
                }
                Some((StatusCode::GONE, _)) => {
                    // The claim ran out (the item comes back), or an unanswered ack did it.
                    if unanswered {
                        at.shared.record(|l| {
                            l.in_doubt.insert(id);
                        });
                    }
                    break;
                }
                Some((status, body)) => panic!("an ack answered {status}: {body}"),
                None => {
                    unanswered = true;
                    back_off().await;
                }
            }
        }
    }
}

/// Adds 1 to counter `added` until `stop`, each add acknowledged.
async fn add(at: Instance, client: usize, stop: Arc<AtomicBool>) {
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        until_acknowledged(
            &at,
            "/v1/counters/added/add",
            json!({ "delta": 1 }),
            &format!("add-{client}-{n}"),
        )
        .await;
        at.shared.record(|l| l.added += 1);
    }
}

/// The patient holder: holds the lock across the outage on a lease that outlives it, kept
/// alive every second by a task of its own.
struct Patient {
    at: Instance,
    lease: Arc<Lease>,
    handle: String,
    from: u64,
    keeping: JoinHandle<()>,
}

impl Patient {
    async fn hold(at: Instance) -> Patient {
        let lease = Arc::new(Lease::create(&at, PATIENT_TTL).await.expect("ZooKeeper is up"));
        let granted = within(Duration::from_secs(60), "the patient holder's grant", async {
            loop {
                match acquire(&at, &lease, "5s").await {
                    Acquired::Granted(granted) => return granted,
                    Acquired::NotYet => continue,
                    Acquired::LeaseGone => panic!("the patient lease ended"),
                }
            }
        })
        .await;
        let from = now_micros();
        let keeping = {
            let (at, lease) = (at.clone(), lease.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await; // the keepalive's period
                    assert_ne!(lease.keepalive(&at).await, Some(false), "the patient lease ended");
                }
            })
        };
        Patient {
            at,
            lease,
            handle: granted["handle"].as_str().expect("a handle").to_string(),
            from,
            keeping,
        }
    }

    /// After the outage: the holder is told its lease survived and that it still holds the
    /// lock; it lets go.
    async fn told_and_let_go(self) {
        let keepalive = format!("/v1/leases/{}/keepalive", self.lease.id);
        let at = &self.at;
        until_answered(
            BACK_WITHIN,
            "the patient holder to be told its lease lives",
            async || at.call(Method::POST, &keepalive, None, None).await.map(|(s, _)| s) == Some(StatusCode::OK),
        )
        .await;
        let path = format!("/v1/locks/{LOCK}/handles/{}", self.handle);
        let (status, handle) = at.call(Method::GET, &path, None, None).await.expect("an answer");
        assert_eq!(status, StatusCode::OK, "{handle}");
        assert_eq!(
            handle["state"], "held",
            "the patient holder still holds the lock: {handle}"
        );
        self.keeping.abort();
        let to = now_micros().min(self.lease.trusted_until());
        let hold = Hold {
            holder: "patient".into(),
            from: self.from,
            to,
            how: "released".into(),
        };
        at.shared.record(|l| l.holds.push(hold));
        release(at, &self.handle).await;
    }
}

/// An item of queue `claimed` taken just before the outage and never acknowledged: its ack
/// deadline (3 s) passes in the outage, and the item is delivered again once ZooKeeper is back.
struct Unacked {
    at: Instance,
    item: String,
}

impl Unacked {
    async fn take(at: Instance) -> Unacked {
        let put = at
            .call(Method::POST, "/v1/queues/claimed/items", Some(json!("across")), None)
            .await;
        assert_eq!(put.as_ref().map(|(s, _)| *s), Some(StatusCode::CREATED), "{put:?}");
        let taken = at
            .call(
                Method::POST,
                "/v1/queues/claimed/take?wait=5s&ack_deadline=3s",
                None,
                None,
            )
            .await;
        let Some((StatusCode::OK, taken)) = taken else {
            panic!("the take before the outage: {taken:?}")
        };
        Unacked {
            item: taken["item"].as_str().expect("an item").to_string(),
            at,
        }
    }

    /// After the outage: the item comes again, its deadline having passed.
    async fn delivered_again(self) {
        let taken = self
            .at
            .call(Method::POST, "/v1/queues/claimed/take?wait=20s", None, None)
            .await;
        let Some((StatusCode::OK, taken)) = taken else {
            panic!("the item whose claim lapsed in the outage was not delivered again: {taken:?}")
        };
        assert_eq!(taken["item"], json!(self.item), "{taken}");
        assert_eq!(taken["deliveries"], 2, "{taken}");
    }
}

/// Everything running on two instances.
struct Work {
    instances: [Process; 2],
    at: [Instance; 2],
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    curators: Vec<Curator>,
    /// What is held across the outage: the lock, and a claim left unacknowledged.
    patient: Patient,
    unacked: Unacked,
}

impl Work {
    /// Starts two instances on `connect` and every client, waits until each kind of client has
    /// done some work, then has the patient holder hold the lock and an item claimed, both
    /// through instance `across`.
    async fn start(connect: &str, across: usize) -> Work {
        let instances = [Process::start(connect).await, Process::start(connect).await];
        let shared = Arc::new(Shared {
            ledger: Mutex::default(),
            changed: tokio::sync::watch::channel(0).0,
        });
        let http = common::http_client();
        let at = instances.each_ref().map(|p| Instance {
            http: http.clone(),
            url: p.url.clone(),
            shared: shared.clone(),
            who: "test".to_string(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (i, at) in at.iter().enumerate() {
            for c in 0..CYCLERS_PER_INSTANCE {
                let name = format!("http-{i}-{c}");
                tasks.push(tokio::spawn(cycle(name.clone(), at.named(name), stop.clone())));
            }
            let (producer, consumer, adder) = (format!("producer-{i}"), format!("consumer-{i}"), format!("adder-{i}"));
            tasks.push(tokio::spawn(produce(
                at.named(producer),
                i as u64 * 1_000_000,
                stop.clone(),
            )));
            tasks.push(tokio::spawn(consume(at.named(consumer), stop.clone())));
            tasks.push(tokio::spawn(add(at.named(adder), i, stop.clone())));
        }
        let curators = futures::future::join_all(
            (0..CURATORS).map(|c| Curator::start(format!("curator-{c}"), connect, shared.clone())),
        )
        .await;
        shared
            .until(Duration::from_secs(60), "work before the outage", |l| {
                l.holds.iter().any(|h| h.holder.starts_with("curator"))
                    && l.holds.iter().any(|h| h.holder.starts_with("http"))
                    && l.acked.len() >= 10
                    && l.added >= 10
            })
            .await;
        let patient = Patient::hold(at[across].named("patient".into())).await;
        let unacked = Unacked::take(at[across].named("unacked".into())).await;
        Work {
            instances,
            at,
            shared,
            stop,
            tasks,
            curators,
            patient,
            unacked,
        }
    }

    /// After ZooKeeper is back (`back`: when it answered): the instances serve within the
    /// README's bound, the patient holder is told, the lock passes to HTTP and Curator holders
    /// again, the unacknowledged item comes again; then everything stops and is checked.
    async fn check(self, what: &str, back: Instant) {
        for at in &self.at {
            until_answered(BACK_WITHIN, "the instance to be ready again", async || {
                at.call(Method::GET, "/readyz", None, None).await.map(|(s, _)| s) == Some(StatusCode::OK)
            })
            .await;
        }
        self.patient.told_and_let_go().await;
        let serving = back.elapsed();
        self.unacked.delivered_again().await;
        let let_go = now_micros();
        let shared = &self.shared;
        shared
            .until(
                Duration::from_secs(60),
                "HTTP and Curator holders after the outage",
                |l| {
                    let after = |prefix| {
                        l.holds
                            .iter()
                            .any(|h: &Hold| h.holder.starts_with(prefix) && h.from > let_go)
                    };
                    after("http") && after("curator")
                },
            )
            .await;
        let acked_then = shared.read(|l| l.acked.len());
        let added_then = shared.read(|l| l.added);
        shared
            .until(
                Duration::from_secs(60),
                "queue and counter work after the outage",
                |l| l.acked.len() >= acked_then + 10 && l.added >= added_then + 10,
            )
            .await;
        self.stop.store(true, Ordering::SeqCst);
        let finished = tokio::time::timeout(Duration::from_secs(90), futures::future::join_all(self.tasks)).await;
        if finished.is_err() {
            let doing = shared.read(|l| l.doing.clone());
            let queue = self.at[0].call(Method::GET, "/v1/queues/drained", None, None).await;
            let items = self.at[0]
                .call(Method::GET, "/v1/queues/drained/items", None, None)
                .await;
            panic!(
                "{what}: the clients did not finish within 90 s (now {}): {doing:#?}; the queue: {queue:?}, its items: {items:?}",
                now_micros()
            );
        }
        for curator in self.curators {
            curator.stop().await;
        }

        let (added, leases, report) = {
            let ledger = shared.ledger.lock().unwrap();
            assert!(ledger.hung.is_empty(), "requests hung: {:?}", ledger.hung);
            let holds = one_holder_at_a_time(&ledger.holds).unwrap_or_else(|two| panic!("{what}: {two}"));
            let missing: Vec<_> = ledger
                .put
                .iter()
                .filter(|id| !ledger.acked.contains_key(id) && !ledger.in_doubt.contains(id))
                .collect();
            assert!(
                missing.is_empty(),
                "{what}: acknowledged puts never delivered: {missing:?}"
            );
            let twice: Vec<_> = ledger.acked.iter().filter(|(_, n)| **n > 1).collect();
            assert!(
                twice.is_empty(),
                "{what}: delivered again after an acknowledged ack: {twice:?}"
            );
            let (added, leases) = (ledger.added, ledger.leases.clone());
            let suspended = ledger.holds.iter().filter(|h| h.how == "suspended").count();
            let cut = ledger.holds.iter().filter(|h| h.how == "ttl").count();
            let losses = ledger
                .states
                .iter()
                .filter(|s| s.ends_with("SUSPENDED") || s.ends_with("LOST"))
                .count();
            let report = format!(
                "{what}: {holds} holds, one holder at a time ({} by Curator, whose clients saw {losses} connection losses; {suspended} holds ended by SUSPENDED, {cut} by the TTL); {} puts acknowledged, {} acked, {} acks in doubt, {} deliveries; {added} adds; {} answers 503; {} leases; serving and the patient holder told {} ms after ZooKeeper answered",
                ledger.holds.iter().filter(|h| h.holder.starts_with("curator")).count(),
                ledger.put.len(),
                ledger.acked.len(),
                ledger.in_doubt.len(),
                ledger.deliveries,
                ledger.unavailable,
                leases.len(),
                serving.as_millis()
            );
            (added, leases, report)
        };

        let (status, counter) = self.at[0]
            .call(Method::GET, "/v1/counters/added", None, None)
            .await
            .expect("an answer");
        assert_eq!(status, StatusCode::OK, "{counter}");
        assert_eq!(counter["value"], json!(added), "{what}: every acknowledged add once");
        let mut ended = BTreeMap::<String, usize>::new();
        for lease in &leases {
            let (status, body) = self.at[1]
                .call(Method::GET, &format!("/v1/leases/{lease}"), None, None)
                .await
                .expect("an answer");
            let reason = match status {
                StatusCode::OK => "alive".to_string(),
                StatusCode::GONE => body["reason"].as_str().expect("an ended lease says why").to_string(),
                _ => panic!("{what}: lease {lease} answered {status}: {body}"),
            };
            *ended.entry(reason).or_default() += 1;
        }
        println!("{report}; leases afterwards: {ended:?}");
        drop(self.instances);
    }
}

/// A standalone ZooKeeper killed for [AWAY] and started again, under work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_through_a_standalone_zookeeper_killed_and_restarted_breaks_no_promise() {
    let mut zookeeper = common::zookeeper_own().await;
    let work = Work::start(&zookeeper.connect_string(), 0).await;
    zookeeper.kill();
    tokio::time::sleep(AWAY).await; // the outage's length, not a synchronisation
    zookeeper.restart(&common::test_server_options()).expect("restart");
    zookeeper
        .wait_serving(Duration::from_secs(60))
        .await
        .expect("serves again");
    work.check("a standalone ZooKeeper killed for 15 s", Instant::now())
        .await;
}

/// An ensemble that loses its quorum (two of three servers killed) for [AWAY] and regains it,
/// under work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_through_an_ensemble_that_lost_its_quorum_breaks_no_promise() {
    let mut ensemble = Ensemble::start(3).await;
    let work = Work::start(&ensemble.connect_string(), 1).await;
    for server in ensemble.servers.iter_mut().take(2) {
        server.kill();
    }
    tokio::time::sleep(AWAY).await; // the outage's length, not a synchronisation
    for server in ensemble.servers.iter_mut().take(2) {
        server.restart(&ensemble.options).expect("restart");
    }
    for server in ensemble.servers.iter_mut() {
        server
            .wait_serving(Duration::from_secs(60))
            .await
            .expect("serves again");
    }
    work.check("an ensemble without its quorum for 15 s", Instant::now())
        .await;
}
