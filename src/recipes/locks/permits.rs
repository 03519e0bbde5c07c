//! A semaphore's permits as the API takes and answers them: a permit's acquire (a long poll,
//! as a lock's) and its reads (a long poll for news, as a lock handle's).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::contention::{self, Phase, Recorded, held_since};
use super::semaphore::{self, Permit};
use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::Recipes;
use crate::recipes::check_name;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::lease::Lease;
use crate::recipes::leases::LeaseView;
use crate::time::HumanDuration;

/// Most permits a semaphore may have.
const MAX_PERMITS: u32 = 10_000;

/// Query of `POST /v1/semaphores/{name}/acquire`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PermitParams {
    /// How many permits the semaphore has (1 to 10000). The first request records it; later
    /// ones must agree.
    #[param(minimum = 1, maximum = 10000)]
    pub permits: u32,
    /// How long to wait for a permit: `0` tries once. Capped by the server's maximum wait,
    /// which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
    /// When the wait ends without a permit: `false` (default) leaves the queue; `true` stays
    /// and answers 202.
    pub keep_queued: Option<bool>,
}

/// A permit request: held (200) or still waiting (202).
#[derive(Serialize, utoipa::ToSchema)]
pub struct PermitView {
    #[schema(example = "exports")]
    pub semaphore: String,
    pub permits: u32,
    /// `true` while a permit is held.
    pub acquired: bool,
    /// While a permit is held: its fencing token (the `czxid` of its lease node), higher for
    /// each permit granted later, as a lock's is.
    #[schema(example = 4294967310i64)]
    pub fencing_token: Option<i64>,
    /// Give the permit back with `DELETE /v1/semaphores/{name}/permits/{handle}`.
    pub handle: String,
    /// `pending`, `waiting`, `held`, `lost`, `released` or `failed`.
    pub state: &'static str,
    /// Acquirers ahead while waiting (0: next, waiting for a permit to come back).
    pub position: Option<usize>,
    /// When it was granted (known to the instance that keeps its lease).
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
    /// The lease holding it, when answered by the instance that keeps it; else its id is in
    /// `lease_id`.
    pub lease: Option<LeaseView>,
    pub lease_id: String,
}

impl PermitView {
    /// A permit kept here: its task's view.
    pub fn of(permit: &Permit) -> PermitView {
        let current = permit.state();
        PermitView {
            semaphore: permit.name.clone(),
            permits: permit.protocol.permits,
            acquired: matches!(current.phase, Phase::Held { .. }),
            fencing_token: current.fencing_token(),
            handle: permit.id.clone(),
            state: current.phase.name(),
            position: match current.phase {
                Phase::Waiting { position } => Some(position),
                _ => None,
            },
            held_since: held_since(&current.phase),
            lease: Some(LeaseView::of(&permit.lease)),
            lease_id: permit.lease.id.clone(),
        }
    }

    /// A permit request as ZooKeeper has it (its lease kept by another instance).
    pub fn recorded(recorded: &Recorded, permits: u32) -> PermitView {
        PermitView {
            semaphore: recorded.name.clone(),
            permits,
            acquired: recorded.holds(),
            fencing_token: recorded.holds().then_some(recorded.node.czxid),
            handle: recorded.handle.clone(),
            state: if recorded.holds() { "held" } else { "waiting" },
            position: recorded.position,
            held_since: None,
            lease: None,
            lease_id: recorded.owner().map(|o| o.lease).unwrap_or_default(),
        }
    }
}

/// A permit of semaphore `request.name` of `permits` (a long poll, as a lock's acquire): the
/// semaphore records its number of permits first (409 `permits-mismatch` if it has another).
pub async fn acquire_permit(
    recipes: &Recipes,
    caller: &Caller,
    name: &str,
    params: PermitParams,
    body: Option<contention::AcquireBody>,
) -> Result<PermitView, ApiError> {
    check_name(name)?;
    let permits = params.permits;
    if permits == 0 || permits > MAX_PERMITS {
        let detail = format!("must be 1 to {MAX_PERMITS}");
        return Err(ApiError::invalid(Place::Query, "permits", detail));
    }
    let asked = contention::AcquireParams {
        wait: params.wait,
        keep_queued: params.keep_queued,
    };
    let request = contention::Request::of(caller, name, asked, body);
    let open = async |lease: Arc<Lease>| {
        // On the lease's session, where the permit's task reads the count back.
        let session = lease.session().await?;
        let dir = recipes.semaphores.dir(name);
        semaphore::agree_on_permits(&session, &dir, permits)
            .await
            .map_err(|err| match err {
                crate::recipes::SettingError::Mismatch(recorded) => {
                    let detail = format!("semaphore `{name}` has {recorded} permits, not {permits}");
                    ApiError::new(Problem::PermitsMismatch, detail).with("permits", recorded)
                }
                crate::recipes::SettingError::ZooKeeper(err) => err.into(),
            })?;
        recipes
            .semaphores
            .request(&lease, name, permits)
            .ok_or_else(|| recipes.leases.gone(&lease))
    };
    let granted = contention::contend(recipes, &recipes.semaphores, request, open).await?;
    Ok(PermitView::of(&granted.handle))
}

/// Permit `handle` of semaphore `name`, if `caller` may see it, after waiting (up to the
/// query's `wait`) for news as a lock handle's read does ([contention::read_handle]: a loss,
/// or a waiter's grant); read at `consistency`.
pub async fn read_permit(
    recipes: &Recipes,
    caller: &Caller,
    (name, handle): (&str, &str),
    query: contention::HandleQuery,
    consistency: Consistency,
) -> Result<PermitView, ApiError> {
    let wait = query.wait.map(|wait| wait.0);
    let semaphores = &recipes.semaphores;
    match contention::read_handle(recipes, semaphores, caller, (name, handle), wait, consistency).await? {
        contention::Seen::Here(permit) => Ok(PermitView::of(&permit)),
        contention::Seen::There(recorded) => {
            let session = recipes.reader(consistency).await?;
            let permits = semaphore::permits_of(&session, &semaphores.dir(name))
                .await?
                .unwrap_or(0) as u32;
            Ok(PermitView::recorded(&recorded, permits))
        }
    }
}
