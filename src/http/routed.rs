//! What the router matched for a request, for the guards that run after routing: the route's
//! template (`/v1/locks/{name}/handles/{handle}`), the resource kind it serves (from the
//! registry, by the template's segment after `/v1/`), and the path parameters as the handlers
//! will see them (percent-decoded by axum).

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use axum::http::request::Parts;

use super::error::{ApiError, Place};
use crate::kind::Kind;

/// A routed request's route.
pub struct Routed {
    pub template: String,
    pub kind: Option<Kind>,
    params: Vec<(String, String)>,
}

impl Routed {
    /// The route of `parts`. A path parameter that is not UTF-8 once decoded is refused here as
    /// the handlers' extractors would refuse it.
    pub async fn of(parts: &mut Parts) -> Result<Routed, ApiError> {
        let template = parts
            .extensions
            .get::<MatchedPath>()
            .map(|m| m.as_str().to_string())
            .unwrap_or_default();
        let params = RawPathParams::from_request_parts(parts, &())
            .await
            .map_err(|rejection| ApiError::invalid(Place::Path, "path", rejection.body_text()))?;
        let kind = template
            .strip_prefix("/v1/")
            .and_then(|rest| rest.split('/').next())
            .and_then(Kind::from_segment);
        Ok(Routed {
            template,
            kind,
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }

    /// A route as the router would have matched it (for tests).
    #[cfg(test)]
    pub fn new(template: &str, params: &[(&str, &str)]) -> Routed {
        Routed {
            template: template.to_string(),
            kind: template
                .strip_prefix("/v1/")
                .and_then(|rest| rest.split('/').next())
                .and_then(Kind::from_segment),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    /// The parameter `name`, if the route has it.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The resource a kind's route names: its first parameter (`name`, `group`, `id`, `key`).
    pub fn resource(&self) -> Option<&str> {
        self.kind.and(self.params.first().map(|(_, v)| v.as_str()))
    }
}

/// Whether `path` (as requested, percent-encoded) is an event stream's: its Host and Origin are
/// checked like a socket's.
pub fn is_stream(path: &str) -> bool {
    if path == "/v1/events" {
        return true;
    }
    match path
        .strip_prefix("/v1/")
        .map(|rest| rest.split('/').collect::<Vec<_>>())
        .as_deref()
    {
        Some([segment, _, "events"]) => Kind::from_segment(segment).is_some_and(|k| k.topic().is_some()),
        _ => false,
    }
}

/// Whether `route` opens a socket or an event stream, whose answer lasts as long as it is open.
pub fn is_long_lived(route: &str) -> bool {
    route == "/v1/ws" || route.ends_with("/observe") || is_stream(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_told_apart_from_other_reads() {
        assert!(is_stream("/v1/events"));
        assert!(is_stream("/v1/locks/orders/events"));
        assert!(is_stream("/v1/double-barriers/b%2F1/events"));
        assert!(!is_stream("/v1/kv/app/events"));
        assert!(!is_stream("/v1/locks/orders"));
        assert!(!is_stream("/v1/locks/orders/events/x"));
        assert!(!is_stream("/v1/nothing/orders/events"));
    }
}
