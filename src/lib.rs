//! zkgate: Apache ZooKeeper's coordination recipes behind HTTP.
//!
//! [app] builds the HTTP application from an [AppState]; [start] binds it to a listener and
//! runs it in the background (tests use it to run zkgate in-process); [runner] is the client
//! side of `zkgate lock` / `zkgate elect`; `main.rs` is only the command line around them.

pub mod admission;
pub mod auth;
pub mod config;

pub mod events;
pub mod http;
pub mod ids;
pub mod instances;
pub mod kind;
pub mod limits;
pub mod listen;
pub mod locked;
pub mod metrics;
pub mod peer;
pub mod problem;
pub mod recipes;
pub mod remembered;
pub mod runner;
pub mod spec;
pub mod time;
pub mod tls;
pub mod ws;
pub mod zk;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::{Config as SwaggerConfig, SwaggerUi};

use crate::config::ServeConfig;
use crate::events::Events;
use crate::recipes::Recipes;
use crate::recipes::holdings::Registries;
use crate::recipes::leases::Leases;
use crate::recipes::queues::service::Queues;
use crate::zk::session::ZkSession;
use crate::zk::watch::ExistsWatches;

pub use tls::install_crypto_provider;

/// Everything the handlers share. Cloned for every request by every layer and extractor that
/// takes the state, so it is one `Arc`: cloning the fields one by one (a `CancellationToken`
/// clone takes a lock) cost a sixth of zkgate's CPU per request under load.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [AppState] holds: the recipes and what they act with (reached through `Deref`:
/// `state.leases`, `state.locks`), and what only the edges use.
pub struct Shared {
    pub config: Arc<ServeConfig>,
    pub recipes: Recipes,
    pub events: Events,
    /// Cancelled when the instance shuts down: sockets close with a close frame.
    pub shutdown: CancellationToken,
    /// The principals of `--auth-config`; `None` when auth is off.
    pub authority: Option<Arc<auth::Authority>>,
    /// The requests in service and their queue (`--max-in-service`, shedding by queueing delay).
    pub admission: Arc<admission::Admission>,
    /// This instance (its id prefixes the leases, handles and claims it issues) and the
    /// registry of all of them, for forwarding.
    pub instance: instances::Instance,
    pub instances: instances::Instances,
    /// The HTTP client that forwards requests to other instances.
    pub peers: reqwest::Client,
    /// The bytes all sockets of the instance may have queued for their clients
    /// (`--ws-send-budget`, see [ws::outbox]).
    pub ws_budget: ws::outbox::Budget,
    /// Whether the reaper has made its first pass (here, or another instance is the reaper):
    /// after a restart of every instance, the leases that expired meanwhile have ended.
    pub reaped: tokio::sync::watch::Receiver<bool>,
}

impl std::ops::Deref for Shared {
    type Target = Recipes;

    fn deref(&self) -> &Recipes {
        &self.recipes
    }
}

impl Shared {
    /// Returns once the instance is ready (what `/readyz` says): registered, its heartbeat
    /// answered, and the leases of instances that are gone taken over or ended.
    pub async fn wait_ready(&self) {
        self.instances.wait_registered().await;
        self.leases.wait_fresh().await;
        let mut reaped = self.reaped.clone();
        let _ = reaped.wait_for(|reaped| *reaped).await;
    }
}

impl AppState {
    /// Starts the session supervisor for `config.zookeeper` (which must be set) and the
    /// registries on top of it.
    pub fn new(config: ServeConfig, authority: Option<auth::Authority>) -> AppState {
        let connect = config.zookeeper.clone().unwrap_or_default();
        let config_limits = config.limit_settings();
        let admission_settings = config.admission_settings();
        metrics::get().set_names_per_kind(config.metrics_names_per_kind);
        let peers = http::handoff::peer_client(&config);
        let (zk, lanes) = start_sessions(&config, &connect);
        let instance = instances::Instance::new(config.advertised_url());
        let instances = instances::Instances::start(lanes.clone(), &config.root, instance.clone(), config.peer_key());
        let leases = Leases::new(
            config.lease_policy(),
            config.max_leases_per_principal,
            instance.id.clone(),
            &config.root,
            lanes.clone(),
            instances.vouching(),
        );
        let quotas = recipes::usage::Quotas::start(zk.clone(), &config.root, config.quota_settings());
        let registries = Registries::new(&config.root, &quotas);
        let idempotency = recipes::idempotency::Keys::new(&config.root, quotas.clone(), config.idempotency_settings());
        let barrier_watches = ExistsWatches::new(zk.clone());
        let queues = Queues::new(
            zk.clone(),
            &config.root,
            instance.id.clone(),
            quotas.clone(),
            config.event_linger,
            config.max_lingering_topics,
        );
        let events = Events::new(zk.clone(), barrier_watches.clone(), event_settings(&config));
        let ws_budget = ws::outbox::Budget::new(config.ws_send_budget);
        let shutdown = CancellationToken::new();
        let adopting = registries.clone();
        leases.set_adopter(Arc::new(move |lease, holdings| adopting.adopt(lease, holdings)));
        // What cleans up after the clients: the reaper of leases (whose pass says when the
        // instance may serve) and the janitor of what recipes leave behind.
        let reaped = recipes::leases::reaper::start(
            leases.clone(),
            queues.clone(),
            zk.clone(),
            &config.root,
            shutdown.clone(),
        );
        let janitor = config.janitor_settings();
        let keys = idempotency.clone();
        recipes::janitor::start(zk.clone(), &config.root, &instance.id, janitor, keys, shutdown.clone());
        AppState(Arc::new(Shared {
            recipes: Recipes {
                root: config.root.clone(),
                max_wait: config.max_wait,
                max_value_bytes: config.max_value_bytes,
                queue_max_depth: config.queue_max_depth,
                queue_max_deliveries: config.queue_max_deliveries,
                lanes,
                leases,
                registries,
                service_picker: Default::default(),
                queues,
                barrier_watches,
                limits: Arc::new(limits::Limits::new(config_limits)),
                quotas,
                idempotency,
            },
            config: Arc::new(config),
            events,
            shutdown,
            authority: authority.map(Arc::new),
            admission: Arc::new(admission::Admission::new(admission_settings)),
            instance,
            instances,
            peers,
            ws_budget,
            reaped,
        }))
    }
}

/// How topics keep their past, from `--event-backlog`, `--event-linger` and
/// `--max-lingering-topics`.
fn event_settings(config: &ServeConfig) -> events::EventSettings {
    events::EventSettings {
        backlog: config.event_backlog,
        linger: config.event_linger,
        max_lingering: config.max_lingering_topics,
    }
}

/// The primary session and the lanes (the sessions leases' writes go through).
fn start_sessions(config: &ServeConfig, connect: &str) -> (ZkSession, zk::session::Lanes) {
    let zk = ZkSession::start(
        connect,
        &config.root,
        config.session_timeout,
        config.zookeeper_security.clone(),
    );
    let lanes = zk::session::Lanes::start(
        zk.clone(),
        connect,
        &config.root,
        config.session_timeout,
        &config.zookeeper_security,
        config.zookeeper_sessions.into(),
    );
    (zk, lanes)
}

/// Every route of the API and the sockets, each with its spec.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    http::routes().merge(ws::routes())
}

/// The OpenAPI description of the API (what `/openapi.json` serves and
/// `openapi/openapi.json` holds).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut spec = routes().into_openapi();
    http::document(&mut spec);
    spec
}

/// The HTTP application: the API and the sockets behind their guards, `/openapi.json`, Swagger
/// UI at `/docs`, the status page at `/`, problem documents for unknown routes and methods,
/// and the outer layers every request passes (origin check, authentication, CORS, tracing).
pub fn app(state: AppState) -> http::App {
    let (routes, mut spec) = routes().split_for_parts();
    http::document(&mut spec);
    let docs = SwaggerUi::new("/docs")
        .url("/openapi.json", spec)
        .config(SwaggerConfig::default().validator_url("none"));
    let api = http::guard(routes, &state)
        .merge(docs)
        .route("/", axum::routing::get(index))
        .route("/favicon.ico", axum::routing::get(favicon));
    let app = http::finish(api).with_state(state.clone());
    http::edge(app, &state)
}

/// The status page from `web/`, compiled into the binary (it loads nothing from elsewhere).
async fn index() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("../web/index.html"))
}

/// The status page's icon (browsers ask for it whatever the page says).
async fn favicon() -> impl axum::response::IntoResponse {
    (
        [
            (axum::http::header::CONTENT_TYPE, "image/x-icon"),
            (axum::http::header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        include_bytes!("../web/favicon.ico").as_slice(),
    )
}

/// A zkgate instance serving in the background.
pub struct Running {
    pub addr: SocketAddr,
    /// Whether the listener speaks TLS (`--tls-cert`).
    pub tls: bool,
    pub state: AppState,
    caps: Arc<listen::Caps>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Binds `config.listen` and serves [app] until [Running::stop] (or drop).
///
/// # Notable errors
/// * `InvalidInput` when `--auth-config`, `--tls-cert` or `--tls-key` cannot be read or are
///   wrong (the message says why).
pub async fn start(mut config: ServeConfig) -> std::io::Result<Running> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let authority = config.load_authority().map_err(invalid)?;
    let acceptor = config.tls_acceptor().map_err(invalid)?;
    let open_files = listen::raise_open_files().unwrap_or(1024);
    let caps = listen::Caps::new(config.connection_limits(open_files));
    let tcp = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = tcp.local_addr()?;
    // The port actually bound (for `--listen host:0`), which the advertised URL is made of.
    config.listen = addr;
    let state = AppState::new(config, authority);
    let stop = CancellationToken::new();
    let tls = acceptor.is_some();
    let listener = match acceptor {
        Some(acceptor) => listen::Listener::Tls(listen::TlsListener::new(tcp, acceptor, caps.clone())),
        None => listen::Listener::Plain(tcp),
    };
    let task = tokio::spawn(listen::serve(
        listener,
        caps.clone(),
        app(state.clone()),
        http::limits::early_answer,
        stop.clone(),
    ));
    Ok(Running {
        addr,
        tls,
        state,
        caps,
        stop,
        task,
    })
}

impl Running {
    /// `http://<addr>` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// How many connections are open now (WebSockets included).
    pub fn open_connections(&self) -> usize {
        self.caps.open()
    }

    /// Waits until `test` accepts the number of connections open.
    pub async fn wait_connections(&self, test: impl Fn(usize) -> bool) {
        self.caps.wait_open(test).await
    }

    /// Shuts down gracefully: stops accepting, closes the WebSockets (close frame 1001),
    /// removes its registration at once (so that the other instances take its leases over now,
    /// not one session timeout later) and stops keeping its leases without ending any (their
    /// locks, leaderships and memberships stay as they are, kept by another instance), lets
    /// requests in flight finish (briefly), and closes the ZooKeeper sessions.
    pub async fn stop(mut self) -> std::io::Result<()> {
        self.stop.cancel();
        self.state.shutdown.cancel();
        self.state.instances.deregister(&self.state.instance).await;
        let handed = self.state.leases.hand_over_all();
        tracing::info!(leases = handed, "leases handed over for shutdown");
        self.state.lanes.shutdown();
        let abort = self.task.abort_handle();
        // Long polls may hold connections for up to `max_wait`; do not wait for them.
        match tokio::time::timeout(std::time::Duration::from_secs(2), &mut self.task).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(std::io::Error::other(err)),
            Err(_) => {
                abort.abort();
                Ok(())
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.lanes.shutdown();
    }
}
