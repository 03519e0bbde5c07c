//! Whether a fencing token is a current holder's: for a resource server, before it accepts a
//! write that carries the token (Chubby's sequencer check).

use super::*;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::view::{self, Fencing};

/// Whether `token` is a current holder's (`GET /v1/<kind>/{name}/fencing/{token}`) of the resource at `dir`, whose holders are the
/// first `holding(names)` contenders: `Ok` if it is, 409
/// `stale-fencing-token` with the newest holder's token otherwise, 404 `not-held` when nobody
/// holds. One linearizable read (a `sync` shared with concurrent reads, then the listing and
/// a few `exists`): a resource server may ask on every write it guards.
pub async fn check_fencing(
    recipes: &Recipes,
    what: &str,
    dir: String,
    name: &str,
    token: &str,
    consistency: Consistency,
    holding: impl Fn(&[String]) -> usize,
) -> Result<FencingCheck, ApiError> {
    let token: i64 = token.parse().ok().filter(|t: &i64| *t > 0).ok_or_else(|| {
        let detail = format!(
            "`{}` is not a fencing token (a positive integer, as acquire answered it)",
            token.escape_debug()
        );
        ApiError::invalid(crate::problem::Place::Path, "token", detail)
    })?;
    check_name(name)?;
    let session = recipes.reader(consistency).await?;
    match view::check_fencing(&session, &dir, holding, token).await? {
        Fencing::Holds => Ok(FencingCheck {
            name: name.to_string(),
            token,
        }),
        Fencing::Superseded { current } => Err(ApiError::new(
            Problem::StaleFencingToken,
            format!("{token} is not the token of {what} `{name}`'s holder now: {current} is"),
        )
        .with("current_token", current)),
        Fencing::NotHeld => Err(ApiError::new(
            Problem::NotHeld,
            format!("nobody holds {what} `{name}`: no token is current"),
        )),
    }
}
