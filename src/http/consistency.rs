//! `?consistency=linearizable` (the default) or `sequential` of a read: the parameter parsed
//! into [Consistency] (what it promises is said in [crate::recipes::consistency]), and added to
//! the spec of every `GET` that takes it ([document]).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::{ApiError, Place};
pub use crate::recipes::consistency::Consistency;

/// The query parameter's name.
pub const PARAMETER: &str = "consistency";

/// `value` of the parameter.
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

/// `?consistency=` of a request: the last one given, [Consistency::Linearizable] without.
impl<S: Send + Sync> FromRequestParts<S> for Consistency {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let given = form_urlencoded::parse(query.as_bytes())
            .filter(|(name, _)| name == PARAMETER)
            .last();
        given.map_or(Ok(Consistency::default()), |(_, value)| parse(&value))
    }
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
        super::error::declare(operation, vec![super::error::Problem::InvalidField]);
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
