//! Whether a fencing token is a current holder's, and the macro that declares each kind's
//! fencing route.

use super::*;

/// Answer of a fencing check: the token is a current holder's (the leader's term).
#[derive(Serialize, utoipa::ToSchema)]
pub struct FencingCheck {
    #[schema(example = "orders")]
    pub name: String,
    #[schema(example = 4294967310i64)]
    pub token: i64,
}

/// `GET /v1/<kind>/{name}/fencing/{token}` for the resource at `dir`, whose holders are the
/// first `holding(names)` contenders: 200 if `token` is a current holder's, 409
/// `stale-fencing-token` with the newest holder's token otherwise, 404 `not-held` when nobody
/// holds. One linearizable read (a `sync` shared with concurrent reads, then the listing and
/// a few `exists`): a resource server may ask on every write it guards.
pub async fn check_fencing(
    state: &AppState,
    what: &str,
    dir: String,
    name: &str,
    token: &str,
    consistency: crate::http::consistency::Consistency,
    holding: impl Fn(&[String]) -> usize,
) -> Result<Json<FencingCheck>, ApiError> {
    use crate::recipes::engine::view::Fencing;
    check_name(name)?;
    let token: i64 = token.parse().ok().filter(|t: &i64| *t > 0).ok_or_else(|| {
        ApiError::invalid(
            Place::Path,
            "token",
            format!(
                "`{}` is not a fencing token (a positive integer, as acquire answered it)",
                token.escape_debug()
            ),
        )
    })?;
    let session = state.reader(consistency).await?;
    match crate::recipes::engine::view::check_fencing(&session, &dir, holding, token).await? {
        Fencing::Holds => Ok(Json(FencingCheck {
            name: name.to_string(),
            token,
        })),
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

/// Declares a kind's `GET /v1/<kind>/{name}/fencing/{token}` ([check_fencing]): `handles` picks
/// the kind's handles from the state (for the directory), `holding` says how many of its
/// contenders in queue order hold.
macro_rules! fencing_handler {
    ($(#[doc = $doc:tt])* $handler:ident, $path:tt, $tag:tt, $what:tt, |$state:ident| $handles:expr, $holding:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag,
            params(("name" = String, Path, description = "Its name"), ("token" = i64, Path, description = "The fencing token to check, as the acquire (or campaign) answered it")),
            responses(
                (status = 200, description = "The token is current", body = $crate::http::contention::FencingCheck),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotHeld, $crate::http::error::p::StaleFencingToken, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn $handler(
            axum::extract::State($state): axum::extract::State<$crate::AppState>,
            $crate::http::extract::ApiPath((name, token)): $crate::http::extract::ApiPath<(String, String)>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<axum::Json<$crate::http::contention::FencingCheck>, $crate::http::error::ApiError> {
            let dir = $handles.dir(&name);
            $crate::http::contention::check_fencing(&$state, $what, dir, &name, &token, consistency, $holding).await
        }
    };
}

pub(crate) use fencing_handler;
