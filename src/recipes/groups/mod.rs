//! The group family: group membership (lease-bound members with data) and service discovery
//! (lease-bound instances, picked round robin or at random).

pub mod group;
pub mod service;
mod views;

pub use views::*;

use std::time::Duration;

use crate::problem::ApiError;
use crate::recipes::Recipes;
use crate::recipes::consistency::Consistency;
use crate::recipes::topic::Source;

/// Group `name`'s live members, read at `consistency`; with `wait`, after waiting (up to it,
/// capped) for membership to differ from the index given (without one, for the next change).
pub async fn members(
    recipes: &Recipes,
    name: &str,
    wait: Option<(Duration, Option<i64>)>,
    consistency: Consistency,
) -> Result<group::GroupState, ApiError> {
    let session = recipes.reader(consistency).await?;
    if let Some((wait, index)) = wait {
        // Without `index`, the wait is for the next change after the watch's first look.
        let dir = recipes.groups.dir(name);
        let changed = group::wait_for_change(&session, &dir, index);
        crate::admission::park();
        let _ = tokio::time::timeout(recipes.wait(Some(wait)), changed).await;
    }
    Ok(recipes.group_topic(name).read(&session).await?)
}
