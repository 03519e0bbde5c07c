//! The served spec beyond what each handler declares: every operation of it, and the formats of
//! the API's values ([formats]). Rewritten once, when the spec is built; nothing here runs per
//! request. (The spec is assembled by [crate::http], whose extractors add what they take.)

use axum::http::Method;
use utoipa::openapi::path::Operation;

pub mod formats;

/// Every operation of `spec`, with its method and path.
pub fn operations(spec: &utoipa::openapi::OpenApi) -> impl Iterator<Item = (Method, &String, &Operation)> {
    spec.paths.paths.iter().flat_map(|(path, item)| {
        let methods = [&item.get, &item.put, &item.post, &item.delete, &item.patch];
        SPEC_METHODS
            .into_iter()
            .zip(methods)
            .filter_map(move |(method, operation)| Some((method, path, operation.as_ref()?)))
    })
}

/// [operations], to change.
pub fn operations_mut(spec: &mut utoipa::openapi::OpenApi) -> impl Iterator<Item = (Method, &String, &mut Operation)> {
    spec.paths.paths.iter_mut().flat_map(|(path, item)| {
        let methods = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        SPEC_METHODS
            .into_iter()
            .zip(methods)
            .filter_map(move |(method, operation)| Some((method, &*path, operation.as_mut()?)))
    })
}

/// The methods of a spec's path item, in the order [operations] gives them.
pub const SPEC_METHODS: [Method; 5] = [Method::GET, Method::PUT, Method::POST, Method::DELETE, Method::PATCH];
