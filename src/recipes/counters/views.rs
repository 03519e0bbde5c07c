//! A counter's words as the API says them: an add's body and answer, a set's body; and the add
//! as the API asks it.

use serde::{Deserialize, Serialize};

use super::{Bounds, CounterError, add, counter_error, etag};
use crate::auth::Caller;
use crate::kind::Kind;
use crate::problem::{ApiError, Place};
use crate::recipes::guards::Guard;
use crate::recipes::guards::{Guards, retry_guarded};
use crate::recipes::idempotency::Key;
use crate::recipes::idempotency::Keyed;
use crate::recipes::{Recipes, check_name};
use crate::zk::Failure;

/// Body of an add (optional: without it, the add is `+1`).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct AddBody {
    /// What to add (negative to subtract); 1 when absent.
    #[schema(example = 5)]
    pub delta: Option<i64>,
    /// The lowest value the add may leave (inclusive): an add below it is refused with 409
    /// `out-of-bounds` and changes nothing.
    #[schema(example = 0)]
    pub min: Option<i64>,
    /// The highest value the add may leave (inclusive).
    #[schema(example = 100)]
    pub max: Option<i64>,
}

/// What an add did.
#[derive(Serialize, utoipa::ToSchema)]
pub struct AddResult {
    #[schema(example = "orders-shipped")]
    pub name: String,
    /// The value before the add.
    #[schema(example = 37)]
    pub previous: i64,
    /// The value after it.
    #[schema(example = 42)]
    pub value: i64,
    /// The new version, as in the `ETag` header.
    #[schema(example = "\"4294967311\"")]
    pub etag: String,
    /// `true` when an earlier add with the same `Idempotency-Key` made it: this is its answer
    /// (the counter may have moved on since).
    pub repeated: bool,
}

/// Body of a set.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBody {
    /// The new value.
    #[schema(example = 0)]
    pub value: i64,
}

/// Adds the body's `delta` (1 without one) to counter `name` within its bounds, creating it at 0
/// first if need be, at most once for an idempotency `key` whatever replies are lost; the write
/// and its conflicts counted.
pub async fn add_to(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    body: AddBody,
    key: Option<&Key>,
) -> Result<AddResult, ApiError> {
    check_name(name)?;
    let delta = body.delta.unwrap_or(1);
    let bounds = Bounds {
        min: body.min,
        max: body.max,
    };
    if let (Some(min), Some(max)) = (bounds.min, bounds.max)
        && min > max
    {
        let detail = format!("must not be above `max` ({min} > {max})");
        return Err(ApiError::invalid(Place::Body, "min", detail));
    }
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.zk().connected().await?;
    let path = Kind::Counter.path(&recipes.root, name);
    let keyed = key.map(|key| Keyed {
        keys: &recipes.idempotency,
        key,
    });
    let added = retry_guarded!(
        guards,
        recipes,
        Err(CounterError::ZooKeeper(Failure::Unguarded)),
        add(&session, &path, delta, bounds, (keyed, guards)).await
    );
    let added = added.map_err(|e| counter_error(name, e))?;
    if !added.repeated {
        let m = crate::metrics::get();
        let label = m.counter(name);
        m.counter_writes.with_label_values(&[label, "add"]).inc();
        m.counter_conflicts
            .with_label_values(&[label])
            .inc_by(u64::from(added.conflicts));
    }
    Ok(AddResult {
        name: name.to_string(),
        previous: added.previous,
        value: added.value,
        etag: etag(added.mzxid),
        repeated: added.repeated,
    })
}
