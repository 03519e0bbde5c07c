//! `ZKGATE-Guard`: how every writing operation reads it ([Guarded]) and what the spec says of it
//! ([document]: one shared parameter, `#/components/parameters/Guard`). What a guard means and
//! how a write checks it is [crate::recipes::guards]'.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use utoipa::openapi::RefOr;
use utoipa::openapi::path::ParameterIn;

use super::error::{ApiError, Place};
use crate::recipes::guards::{Guard, HEADER, MAX_GUARDS, parse};

/// The guards a request names (none without the header), in every `ZKGATE-Guard` it carries.
pub struct Guarded(pub Vec<Guard>);

impl<S: Send + Sync> FromRequestParts<S> for Guarded {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let invalid = |detail: String| ApiError::invalid(Place::Header, "ZKGATE-Guard", detail);
        let mut guards = Vec::new();
        for value in parts.headers.get_all(HEADER) {
            let value = value
                .to_str()
                .map_err(|_| invalid("must be visible ASCII and spaces".into()))?;
            guards.extend(parse(value).map_err(invalid)?);
        }
        if guards.len() > MAX_GUARDS {
            return Err(invalid(format!("at most {MAX_GUARDS} guards ({} given)", guards.len())));
        }
        Ok(Guarded(guards))
    }
}

/// The header as an operation declares it in its `params(...)`; the spec then holds it once
/// ([document]).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub struct GuardHeader {
    /// Writes only if, when ZooKeeper applies the write, the handle still holds what the
    /// guard names: `lock/NAME; handle=HANDLE` (also `rwlock/`, `semaphore/`, `election/` with a
    /// campaign's handle). Repeat the header (or separate guards with `,`) for several, all of
    /// which must hold; at most 8. Otherwise nothing is written: 409 `guard-lost`, saying why
    /// and the holder now. The check is part of the write's own ZooKeeper transaction, so no
    /// holder can lose the lock between the check and the write.
    #[param(
        rename = "ZKGATE-Guard",
        example = "lock/orders; handle=0b9d4c3e-2f1a4b5c8d7e6f5a4b3c2d1e0f1a2b3c"
    )]
    guard: Option<String>,
}

/// The name of the shared parameter.
const SHARED: &str = "Guard";

/// Whether `parameter` is the guard header.
fn is_guard(parameter: &RefOr<utoipa::openapi::path::Parameter>) -> bool {
    match parameter {
        RefOr::T(p) => p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case(HEADER),
        RefOr::Ref(r) => r.ref_location.ends_with(&format!("/{SHARED}")),
    }
}

/// In the spec, the header once (`components.parameters.Guard`), referred to by every
/// operation that declares it, and its refusal (409 `guard-lost`) on those.
pub fn document(spec: &mut utoipa::openapi::OpenApi) {
    let mut shared = None;
    for (_, _, operation) in crate::spec::operations_mut(spec) {
        let Some(parameters) = operation.parameters.as_mut() else {
            continue;
        };
        let Some(at) = parameters.iter().position(is_guard) else {
            continue;
        };
        let declared = std::mem::replace(
            &mut parameters[at],
            RefOr::Ref(utoipa::openapi::Ref::new(format!("#/components/parameters/{SHARED}"))),
        );
        if let RefOr::T(parameter) = declared {
            shared.get_or_insert(parameter);
        }
        super::error::declare(operation, vec![super::error::Problem::GuardLost]);
    }
    if let Some(parameter) = shared {
        let components = spec.components.get_or_insert_with(Default::default);
        components.parameters.insert(SHARED.to_string(), RefOr::T(parameter));
    }
}
