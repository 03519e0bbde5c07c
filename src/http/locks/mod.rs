//! The lock family over HTTP: exclusive locks, read/write locks, semaphores and lock sets, one
//! file each. Here the handle and fencing routes each contended kind declares with a macro. The
//! words (an acquire's query, body and answer, a handle's view) and the protocol are
//! [crate::recipes::locks::contention]'s.

pub mod exclusive;
pub mod lock_sets;
pub mod rwlocks;
pub mod semaphores;

/// A lock kind's handle routes, the same for exclusive and read/write locks: `GET` and
/// `DELETE .../handles/{handle}` (read a handle, release it) and `POST .../revoke` (ask the
/// holders to give it up), on the kind's registry `state.$registry`, a node's role told by
/// `$role`.
macro_rules! lock_handle_handlers {
    (
        $registry:ident, $role:expr, tag = $tag:tt,
        get = ($get_id:tt, $handle_path:tt),
        release = ($release_id:tt, $(#[doc = $release_doc:tt])*),
        revoke = ($revoke_id:tt, $revoke_path:tt, $(#[doc = $revoke_doc:tt])*)
    ) => {
        /// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
        #[utoipa::path(operation_id = $get_id, get, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire"), $crate::recipes::locks::contention::HandleQuery),
            responses(
                (status = 200, description = "The handle", body = $crate::recipes::locks::contention::HandleView),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn get_handle(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
            $crate::http::extract::ApiQuery(query): $crate::http::extract::ApiQuery<$crate::recipes::locks::contention::HandleQuery>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<$crate::http::json::Json<$crate::recipes::locks::contention::HandleView>, $crate::http::error::ApiError> {
            let wait = query.wait.map(|w| w.0);
            let seen = $crate::recipes::locks::contention::read_handle(&state, &state.$registry, &caller, (&name, &handle), wait, consistency).await?;
            Ok($crate::http::json::Json($crate::recipes::locks::contention::HandleView::of(&state, seen).await))
        }

        $(#[doc = $release_doc])*
        #[utoipa::path(operation_id = $release_id, delete, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
            responses(
                (status = 204, description = "Released"),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn release(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
        ) -> Result<axum::http::StatusCode, $crate::http::error::ApiError> {
            $crate::recipes::locks::contention::release_by_id(&state, &state.$registry, &caller, &name, &handle).await?;
            Ok(axum::http::StatusCode::NO_CONTENT)
        }

        $(#[doc = $revoke_doc])*
        #[utoipa::path(operation_id = $revoke_id, post, path = $revoke_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name")),
            request_body(content = $crate::recipes::locks::contention::RevokeBody, example = json!({"by": "ops@example.com", "reason": "deploy in progress", "grace": "30s"})),
            responses(
                (status = 202, description = "Asked; the holders decide (or the grace decides)", body = $crate::recipes::locks::contention::Revoked),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::MalformedBody, $crate::http::error::p::NotFound, $crate::http::error::p::NothingToRevoke, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn revoke(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath(name): $crate::http::extract::ApiPath<String>,
            $crate::http::extract::ApiJson(body): $crate::http::extract::ApiJson<$crate::recipes::locks::contention::RevokeBody>,
        ) -> Result<axum::response::Response, $crate::http::error::ApiError> {
            let revoked = $crate::recipes::locks::contention::revoke(&state, &caller, &state.$registry, &name, $role, body).await?;
            Ok(axum::response::IntoResponse::into_response((axum::http::StatusCode::ACCEPTED, $crate::http::json::Json(revoked))))
        }
    };
}

pub(crate) use lock_handle_handlers;

/// Declares a kind's `GET /v1/<kind>/{name}/fencing/{token}`
/// ([crate::recipes::locks::contention::check_fencing]): `handles` picks
/// the kind's handles from the state (for the directory), `holding` says how many of its
/// contenders in queue order hold.
macro_rules! fencing_handler {
    ($(#[doc = $doc:tt])* $handler:ident, $path:tt, $tag:tt, $what:tt, |$state:ident| $handles:expr, $holding:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag,
            params(("name" = String, Path, description = "Its name"), ("token" = i64, Path, description = "The fencing token to check, as the acquire (or campaign) answered it")),
            responses(
                (status = 200, description = "The token is current", body = $crate::recipes::locks::contention::FencingCheck),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotHeld, $crate::http::error::p::StaleFencingToken, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn $handler(
            axum::extract::State($state): axum::extract::State<$crate::AppState>,
            $crate::http::extract::ApiPath((name, token)): $crate::http::extract::ApiPath<(String, String)>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<$crate::http::json::Json<$crate::recipes::locks::contention::FencingCheck>, $crate::http::error::ApiError> {
            let dir = $handles.dir(&name);
            let check = $crate::recipes::locks::contention::check_fencing(&$state, $what, dir, &name, &token, consistency, $holding).await?;
            Ok($crate::http::json::Json(check))
        }
    };
}

pub(crate) use fencing_handler;

/// An acquire's status: 200 when granted, 202 when still queued.
pub fn status(granted: bool) -> axum::http::StatusCode {
    match granted {
        true => axum::http::StatusCode::OK,
        false => axum::http::StatusCode::ACCEPTED,
    }
}
