//! What a read promises: `?consistency=linearizable` (the default) or `sequential`.
//!
//! Every `GET` that reads ZooKeeper takes the parameter (the spec's is added here to each of
//! them, [document]) and asks [reader] for the client to read with:
//!
//! - `linearizable`: the read reflects every write acknowledged before it began, by any
//!   instance: a barrier on the primary session first (on an ensemble a transaction that changes
//!   nothing, since ZooKeeper's `sync` does nothing on the leader; on a standalone server a
//!   `sync`), shared with the reads that may share it ([crate::zk::sync]). A read of a lease or of a handle (which the owning instance answers
//!   from what it knows) first confirms with a `sync` on the lease's own session that the
//!   session, and with it everything the lease holds, was alive after the read began
//!   ([confirm]).
//! - `sequential`: the server's state as it is, which may lag a write acknowledged elsewhere by
//!   a few milliseconds (ZooKeeper's own guarantee: every read sees a prefix of the writes in
//!   their order, and never goes back in time on one session). No extra round trip.
//!
//! Where no `sync` is needed, and why:
//! - writes, and reads of a write's result on the session that wrote it: ZooKeeper's writes
//!   are linearizable and a session sees its own writes (compare-and-set is a versioned write,
//!   decided by the leader);
//! - the recipes' own decisions (a contender's children after its create, a queue claim's
//!   multi-op): they read on the session that wrote, and are correct under sequential
//!   consistency by construction (a watch fires for anything the read missed);
//! - topics after their first read: a watch event and the read after it come in the order the
//!   server applied them.

use crate::zk::Session;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::Deserialize;

use super::error::{ApiError, Place};
use crate::AppState;
use crate::recipes::engine::lease::Lease;

/// The query parameter's name.
pub const PARAMETER: &str = "consistency";

/// What a read promises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Reflects every write acknowledged (by any instance) before the read began. One barrier (on an
    /// ensemble a transaction that changes nothing) per read, shared by concurrent reads.
    #[default]
    Linearizable,
    /// The state of this instance's ZooKeeper server: may miss a write acknowledged elsewhere a
    /// moment ago; never older than what an earlier read through this instance returned.
    Sequential,
}

impl Consistency {
    fn parse(value: &str) -> Result<Consistency, ApiError> {
        match value {
            "linearizable" => Ok(Consistency::Linearizable),
            "sequential" => Ok(Consistency::Sequential),
            other => Err(ApiError::invalid(
                Place::Query,
                PARAMETER,
                format!(
                    "must be `linearizable` (the default) or `sequential`, not `{}`",
                    other.escape_debug()
                ),
            )),
        }
    }
}

/// `?consistency=` of a request: the last one given, [Consistency::Linearizable] without.
impl<S: Send + Sync> FromRequestParts<S> for Consistency {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let given = form_urlencoded::parse(query.as_bytes())
            .filter(|(name, _)| name == PARAMETER)
            .last();
        given.map_or(Ok(Consistency::default()), |(_, value)| Consistency::parse(&value))
    }
}

/// The session to read with at `consistency`: the primary one, synced first when the read
/// must be linearizable.
pub async fn reader(state: &AppState, consistency: Consistency) -> Result<Session, ApiError> {
    let session = state.zk().current()?;
    if consistency == Consistency::Linearizable {
        session.sync().await?;
    }
    Ok(session)
}

/// The primary session after a `sync`: for a write that acts on what another instance may have
/// just written (a release of a handle acquired through it), which must see it.
pub async fn synced(state: &AppState) -> Result<Session, ApiError> {
    reader(state, Consistency::Linearizable).await
}

/// Before answering a read of `lease` (or of what it holds) from what this instance knows: at
/// `linearizable`, that it still keeps the lease as ZooKeeper has it after the read began (a
/// `sync` and a read of its record), so that a lease another instance took over or ended (and
/// whose locks may have been granted since) is not shown as alive here.
pub async fn confirm(
    state: &AppState,
    lease: &std::sync::Arc<Lease>,
    consistency: Consistency,
) -> Result<(), ApiError> {
    if consistency == Consistency::Linearizable {
        state.leases.confirm(lease).await?;
    }
    Ok(())
}

/// Adds the parameter to the spec of every operation that takes it: the `GET`s under `/v1/`
/// (the socket, the event streams and the election's observation stream excepted: they follow,
/// not read, and each topic's first state is read after a `sync` anyway).
pub fn document(spec: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{SchemaType, Type};
    use utoipa::openapi::{Object, RefOr, Required};
    for (path, item) in spec.paths.paths.iter_mut() {
        if !takes_it(path) {
            continue;
        }
        let Some(operation) = item.get.as_mut() else { continue };
        let schema = Object::builder()
            .schema_type(SchemaType::Type(Type::String))
            .enum_values(Some(["linearizable", "sequential"]))
            .default(Some(serde_json::json!("linearizable")));
        let parameter = ParameterBuilder::new()
            .name(PARAMETER)
            .parameter_in(ParameterIn::Query)
            .required(Required::False)
            .description(Some(
                "`linearizable` (default): reflects every write acknowledged by any instance before the read \
                 began (one barrier, on an ensemble a transaction that changes nothing, shared by concurrent reads). `sequential`: this instance's \
                 ZooKeeper server as it is, which may lag a write acknowledged elsewhere; no extra round trip.",
            ))
            .schema(Some(schema))
            .build();
        operation
            .parameters
            .get_or_insert_with(Vec::new)
            .push(RefOr::T(parameter));
        // A mode it does not know is a 400 naming the parameter.
        super::declare(operation, vec![super::error::Problem::InvalidField]);
    }
}

/// Whether `GET path` takes `?consistency=`.
pub fn takes_it(path: &str) -> bool {
    // `/v1/leases` lists this instance's own leases, from its memory.
    path.starts_with("/v1/")
        && !matches!(path, "/v1/ws" | "/v1/leases")
        && !path.ends_with("/observe")
        && !super::routed::is_stream(path)
}
