//! What the API's values look like, written into the spec: the rules the server checks for
//! names, keys, ids, fencing tokens, durations and topics, as JSON Schema patterns and bounds on
//! every parameter that takes one. Generated clients can then validate before they send, and a
//! fuzzer generates what the server accepts rather than mostly what it refuses.
//!
//! The patterns are the server's rules or a subset of them (a duration may be written in more
//! ways than the pattern allows, never fewer); a name's bound is in bytes on the server and in
//! characters here, so a name of many multi-byte characters may still be refused.

use axum::http::Method;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::schema::{Object, Schema, SchemaType, Type};
use utoipa::openapi::{OpenApi, RefOr};

use crate::recipes::MAX_NAME_BYTES;
use crate::recipes::locks::contention::MAX_GRACE;
use crate::recipes::queues::{MAX_ACK_DEADLINE, MAX_DELAY};
use crate::recipes::txns::MAX_DEADLINE as MAX_TXN_DEADLINE;

/// One segment: the characters a name may have (ZooKeeper's path rules, `zk::names`): no `/`,
/// no control character, nothing from the private-use area, the specials or beyond U+FFFF
/// (written as the ranges allowed, so that a generator draws only from those).
const SEGMENT: &str = r"[\x20-\x2e\x30-\x7e\xa0-\ud7ff\uf900-\uffef]+";

/// A queue claim's id: a lease-like id, `.`, and its item's name in hex, each byte printable
/// ASCII other than `/` (the only names an item has), at least three of them (`.` and `..`
/// are no names; every issued item name is longer).
const CLAIM_ID: &str = r"[0-9a-f]{8}-[0-9a-f]{32}\.(2[1-9a-e]|[3-6][0-9a-f]|7[0-9a-e]){3,}";

/// What a parameter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// A resource name (a lock's, a member's...): one segment, 1 to 128 bytes.
    Name,
    /// A kv key: segments joined by `/`.
    Key,
    /// An id zkgate issued (a lease, a handle, a lock set): `<instance>-<32 hex>`.
    Id,
    /// A queue claim's id: an [Format::Id], `.`, its item's name in hex.
    ClaimId,
    /// A fencing token: a znode's `czxid`, positive.
    Token,
    /// A duration: `0`, `500ms`, `5s`, `2m`, `1h`.
    Duration,
    /// A duration above zero, at most so long (`ttl`, `deadline`, `ack_deadline`).
    PositiveDuration(Option<std::time::Duration>),
    /// A duration, zero or more, at most so long (a revocation's `grace`).
    DurationUpTo(std::time::Duration),
    /// A service instance's address: no control characters, at most 253 bytes.
    Address,
    /// A URI template: text, and names in braces.
    UriTemplate,
    /// A UTC time in RFC 3339 (`2026-11-23T10:00:00Z`): exactly what the server takes
    /// ([crate::time::parse_utc]).
    Timestamp,
    /// An ETag zkgate issued (`"4294967311"`), for a read's `If-None-Match`.
    ETag,
    /// An ETag or `*` (it exists), for `If-Match`.
    ETagOrAny,
    /// `*` alone (create only), for a write's `If-None-Match`.
    Any,
    /// A topic as events name it: `lock:orders`, `znode:data:kv/app`.
    Topic,
    /// An event stream's position(s), as its ids carry them.
    Positions,
    /// An `Idempotency-Key`: 1 to 255 visible ASCII characters.
    IdempotencyKey,
    /// A `ZKGATE-Guard`: `lock/NAME; handle=HANDLE`, several separated by `,`.
    Guard,
}

/// `--max-lock-delay`'s default.
const DEFAULT_MAX_LOCK_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

/// The format of parameter `name` in `place` of the operation `method` at `path`.
fn format_of(path: &str, method: &Method, place: &ParameterIn, name: &str) -> Option<Format> {
    match (place, name) {
        (ParameterIn::Query, "ack_deadline") => Some(Format::PositiveDuration(Some(MAX_ACK_DEADLINE))),
        (ParameterIn::Query, "delay") => Some(Format::DurationUpTo(MAX_DELAY)),
        (ParameterIn::Query, "not_before") => Some(Format::Timestamp),
        (ParameterIn::Header, "If-Match") => Some(Format::ETagOrAny),
        (ParameterIn::Header, "If-None-Match") if *method == Method::GET => Some(Format::ETag),
        (ParameterIn::Header, "If-None-Match") => Some(Format::Any),
        (ParameterIn::Path, "name" | "group" | "member" | "participant" | "item") => Some(Format::Name),
        (ParameterIn::Path, "id") if path.starts_with("/v1/leases/") => Some(Format::Id),
        (ParameterIn::Path, "id") => Some(Format::Name),
        (ParameterIn::Path, "handle" | "set") => Some(Format::Id),
        (ParameterIn::Path, "claim") => Some(Format::ClaimId),
        (ParameterIn::Path, "key") => Some(Format::Key),
        (ParameterIn::Path, "token") => Some(Format::Token),
        (ParameterIn::Query, "wait") => Some(Format::Duration),
        (ParameterIn::Query, "prefix") => Some(Format::Key),
        (ParameterIn::Query, "topic") => Some(Format::Topic),
        (ParameterIn::Query, "since") | (ParameterIn::Header, "Last-Event-ID") => Some(Format::Positions),
        (ParameterIn::Header, "Idempotency-Key") => Some(Format::IdempotencyKey),
        (ParameterIn::Header, "ZKGATE-Guard") => Some(Format::Guard),
        _ => None,
    }
}

/// The schema of `format`, described by `description`.
fn schema_of(format: Format, description: Option<String>) -> Schema {
    let string = |pattern: String| {
        Object::builder()
            .schema_type(SchemaType::Type(Type::String))
            .pattern(Some(pattern))
    };
    let schema = match format {
        Format::Name => string(format!("^{SEGMENT}$"))
            .min_length(Some(1))
            .max_length(Some(MAX_NAME_BYTES)),
        Format::Key => string(format!("^{SEGMENT}(/{SEGMENT})*$")).min_length(Some(1)),
        Format::Id => string("^[0-9a-f]{8}-[0-9a-f]{32}$".into()),
        Format::IdempotencyKey => string("^[!-~]+$".into())
            .min_length(Some(1))
            .max_length(Some(crate::recipes::idempotency::MAX_KEY_BYTES)),
        Format::ClaimId => string(format!("^{CLAIM_ID}$")),
        Format::Guard => {
            // A name here has no `,` or `;` (the server takes those, but a pattern that allowed
            // them could not tell where a guard ends).
            let guard = r"(lock|rwlock|semaphore|election)/[\x20-\x2b\x2d\x2e\x30-\x3a\x3c-\x7e\xa0-\ud7ff\uf900-\uffef]+; ?handle=[0-9a-f]{8}-[0-9a-f]{32}";
            string(format!("^{guard}(, ?{guard}){{0,7}}$"))
        }
        Format::Duration => string(crate::time::DURATION_PATTERN.into()),
        Format::PositiveDuration(max) => string(crate::time::positive_duration_pattern(max)),
        Format::DurationUpTo(max) => string(crate::time::duration_pattern_up_to(max)),
        Format::Address => string(r"^[^\x00-\x1f\x7f-\x9f]+$".into())
            .min_length(Some(1))
            .max_length(Some(crate::recipes::groups::MAX_ADDRESS)),
        Format::UriTemplate => string(r"^([^{}]|\{[^{}]+\})*$".into()),
        Format::Timestamp => string(crate::time::UTC_PATTERN.into()),
        Format::ETag => string(r#"^(W/)?"[0-9]{1,18}"$"#.into()),
        Format::ETagOrAny => string(r#"^(\*|(W/)?"[0-9]{1,18}")$"#.into()),
        Format::Any => string(r"^\*$".into()),
        Format::Topic => {
            let with_topic = || crate::kind::Kind::ALL.iter().filter(|k| k.topic().is_some());
            string(format!(
                "^(({topics}):{SEGMENT}|lease:[0-9a-f]{{8}}-[0-9a-f]{{32}}|summary:({dirs})|znode:(data|children|recursive):({SEGMENT}(/{SEGMENT})*)?)$",
                topics = with_topic().filter_map(|k| k.topic()).collect::<Vec<_>>().join("|"),
                dirs = with_topic().map(|k| k.dir()).collect::<Vec<_>>().join("|"),
            ))
        }
        Format::Positions => string("^[0-9a-f]{1,16}-[0-9]{1,20}(,[0-9a-f]{1,16}-[0-9]{1,20})*$".into()),
        Format::Token => Object::builder()
            .schema_type(SchemaType::Type(Type::Integer))
            .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                utoipa::openapi::schema::KnownFormat::Int64,
            )))
            .minimum(Some(1)),
    };
    Schema::Object(schema.description(description).build())
}

/// Body fields that hold names (a list's items for a list): (schema, property).
const BODY_NAMES: &[(&str, &str)] = &[
    ("CreateTxn", "id"),
    ("CreateTxn", "participants"),
    ("EnterBody", "participant"),
    ("LeaveBody", "participant"),
    ("LockSetBody", "locks"),
    ("RevokeBody", "node"),
];

/// The format of `property` of body schema `schema`: the names above, every `lease` and
/// `handle` and a batch's `claims` (ids zkgate issued), and the durations that must be above
/// zero.
fn body_format(schema: &str, property: &str) -> Option<Format> {
    if BODY_NAMES.contains(&(schema, property)) {
        return Some(Format::Name);
    }
    match (schema, property) {
        (_, "lease" | "handle") => Some(Format::Id),
        ("AckBody", "claims") => Some(Format::ClaimId),
        (_, "ttl") => Some(Format::PositiveDuration(None)),
        ("CreateTxn", "deadline") => Some(Format::PositiveDuration(Some(MAX_TXN_DEADLINE))),
        ("RevokeBody", "grace") => Some(Format::DurationUpTo(MAX_GRACE)),
        // At most `--max-lock-delay`: the spec says its default's bound.
        ("CreateLease", "lock_delay") => Some(Format::DurationUpTo(DEFAULT_MAX_LOCK_DELAY)),
        ("InstanceBody", "address") => Some(Format::Address),
        ("InstanceBody", "uri_spec") => Some(Format::UriTemplate),
        _ => None,
    }
}

/// Writes the formats into every parameter that has one (an array's items for a repeated
/// query parameter), and into the body fields that hold names.
pub fn document(spec: &mut OpenApi) {
    // Only the schemas of request bodies: a response's `lease` is the lease itself.
    let bodies = request_bodies(spec);
    if let Some(components) = spec.components.as_mut() {
        for (schema, body) in components.schemas.iter_mut() {
            if !bodies.contains(schema) {
                continue;
            }
            let RefOr::T(Schema::Object(object)) = body else {
                continue;
            };
            for (property, field) in object.properties.iter_mut() {
                if let (Some(format), RefOr::T(field)) = (body_format(schema, property), field) {
                    set_format(field, format);
                }
            }
            // The server refuses a participant (or a set's lock, or a claim) named twice.
            for list in ["participants", "locks", "claims"] {
                if let Some(RefOr::T(Schema::Array(items))) = object.properties.get_mut(list) {
                    items.unique_items = true;
                }
            }
            if let Some(either) = lease_or_ttl(schema, object) {
                *body = RefOr::T(either);
            }
        }
    }
    for (method, path, operation) in super::operations_mut(spec) {
        for parameter in operation.parameters.iter_mut().flatten() {
            if let RefOr::T(parameter) = parameter {
                apply(path, &method, parameter);
            }
        }
    }
}

/// A body that names a lease or asks for a new one with a `ttl` (never both: the server refuses
/// that) as the two shapes it takes: `oneOf` the body with `lease` required and without `ttl`,
/// and the body without `lease`.
fn lease_or_ttl(name: &str, body: &utoipa::openapi::schema::Object) -> Option<Schema> {
    if !(body.properties.contains_key("lease") && body.properties.contains_key("ttl")) {
        return None;
    }
    // Titled, so that generated clients name the two shapes (`AcquireBodyWithLease`) rather
    // than number them (`AcquireBodyType0`); a title is a class name to some generators, so
    // each body's are its own.
    let without = |field: &str, title: &str, description: &str| {
        let mut shape = body.clone();
        shape.properties.remove(field);
        shape.title = Some(format!("{name}{title}"));
        shape.description = Some(description.to_string());
        shape
    };
    let mut yours = without("ttl", "WithLease", "With a lease of yours.");
    yours.required.push("lease".to_string());
    let new = without(
        "lease",
        "WithNewLease",
        "With a new lease (of `ttl`, or the server's default).",
    );
    Some(Schema::OneOf(
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(Schema::Object(yours))
            .item(Schema::Object(new))
            .description(body.description.clone())
            .build(),
    ))
}

/// The names of the schemas that request bodies refer to.
fn request_bodies(spec: &OpenApi) -> std::collections::HashSet<String> {
    let text = serde_json::to_value(&spec.paths).unwrap_or_default();
    let mut names = std::collections::HashSet::new();
    let mut stack = vec![&text];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(body) = map.get("requestBody") {
                    collect_refs(body, &mut names);
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    names
}

fn collect_refs(value: &serde_json::Value, names: &mut std::collections::HashSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(|r| r.as_str())
                .and_then(|r| r.rsplit('/').next())
            {
                names.insert(name.to_string());
            }
            map.values().for_each(|v| collect_refs(v, names));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_refs(v, names)),
        _ => {}
    }
}

/// Gives a body field `format`, keeping its description (a list's items for a list; an optional
/// field stays optional, as a field left out).
fn set_format(field: &mut Schema, format: Format) {
    match field {
        Schema::Array(array) => {
            array.items = utoipa::openapi::schema::ArrayItems::RefOrSchema(Box::new(RefOr::T(schema_of(format, None))))
        }
        // An optional field that may be `null` (`oneOf` a schema and null): the schema's side.
        Schema::OneOf(one_of) => {
            for item in one_of.items.iter_mut() {
                if let RefOr::Ref(reference) = item {
                    let description = Some(reference.description.clone()).filter(|d| !d.is_empty());
                    *item = RefOr::T(schema_of(format, description));
                }
            }
        }
        field => {
            let description = match field {
                Schema::Object(object) => object.description.clone(),
                _ => None,
            };
            *field = schema_of(format, description);
        }
    }
}

fn apply(path: &str, method: &Method, parameter: &mut Parameter) {
    let Some(format) = format_of(path, method, &parameter.parameter_in, &parameter.name) else {
        return;
    };
    // A duration of any length is the `HumanDuration` component (the same pattern).
    let schema = match format {
        Format::Duration => RefOr::Ref(utoipa::openapi::Ref::from_schema_name("HumanDuration")),
        format => RefOr::T(schema_of(format, None)),
    };
    match parameter.schema.as_mut() {
        Some(RefOr::T(Schema::Array(array))) => {
            array.items = utoipa::openapi::schema::ArrayItems::RefOrSchema(Box::new(schema))
        }
        _ => parameter.schema = Some(schema),
    }
}

/// A JSON value as a request body that may be any (a queue item's, a kv value's: the server
/// checks only that it parses): the schema that allows every value, `{}`, described. Its
/// operations list `application/json` alone (text and bytes are taken too, and said in the
/// description): with several media types, generators could not tell what to send (orval's
/// fetch client sent JSON with no `Content-Type`; openapi-python-client dispatched on the value's
/// type with `isinstance`, which raises for `Any`), and an `anyOf` of primitives, written for
/// that dispatch, made openapi-generator's typescript-fetch emit code that does not compile.
pub struct JsonValue;

impl utoipa::PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(
                "Any JSON value: an object, an array, a string, a number, a boolean or `null`.",
            ))
            .into()
    }
}

impl utoipa::ToSchema for JsonValue {}

/// Writes the nullable fields the way OpenAPI 3.1 generators read them. utoipa writes an
/// `Option<T>` as `oneOf: [T, {type: null}]`, which openapi-generator (7.26) reads as the 3.0
/// `nullable` it no longer supports (and warns about): an inline schema of one type becomes
/// that schema with `null` added to its `type` (`type: ["string", "null"]`, its pattern and
/// description kept), a `$ref` becomes `anyOf: [{$ref}, {type: null}]`. The same values either
/// way. Applied once, to the whole spec (components, bodies, responses, parameters), after
/// everything else has written its schemas.
pub fn nullable_as_types(spec: &mut OpenApi) {
    if let Some(components) = spec.components.as_mut() {
        components.schemas.values_mut().for_each(nullable_in);
    }
    for (_, _, operation) in super::operations_mut(spec) {
        for parameter in operation.parameters.iter_mut().flatten() {
            if let RefOr::T(parameter) = parameter {
                parameter.schema.iter_mut().for_each(nullable_in);
            }
        }
        if let Some(RefOr::T(body)) = operation.request_body.as_mut() {
            for content in body.content.values_mut() {
                if let RefOr::T(content) = content {
                    content.schema.iter_mut().for_each(nullable_in);
                }
            }
        }
        for response in operation.responses.responses.values_mut() {
            if let RefOr::T(response) = response {
                for content in response.content.values_mut() {
                    if let RefOr::T(content) = content {
                        content.schema.iter_mut().for_each(nullable_in);
                    }
                }
            }
        }
    }
}

/// An optional JSON body (`Option<Json<T>>`) comes from utoipa as `anyOf: [T, null]`, which
/// generators turn into an inline type of their own named after the operation (orval's
/// `<Operation>Body`, beside the schema it wraps: `RaiseBody` twice), so the generated code
/// does not compile. Written instead as `T` in a body that is not required, which says what the
/// server takes: the body, or none.
pub fn optional_bodies_as_refs(spec: &mut OpenApi) {
    use utoipa::openapi::Required;
    for (_, _, operation) in super::operations_mut(spec) {
        let Some(RefOr::T(body)) = operation.request_body.as_mut() else {
            continue;
        };
        let mut unwrapped = false;
        for content in body.content.values_mut() {
            let RefOr::T(content) = content else { continue };
            let Some(RefOr::T(Schema::AnyOf(any))) = &content.schema else {
                continue;
            };
            if let [RefOr::Ref(reference), RefOr::T(Schema::Object(null))] = any.items.as_slice()
                && null.schema_type == SchemaType::Type(Type::Null)
            {
                content.schema = Some(RefOr::Ref(reference.clone()));
                unwrapped = true;
            }
        }
        if unwrapped {
            body.required = Some(Required::False);
        }
    }
}

/// [nullable_as_types] on `schema` and every schema inside it.
fn nullable_in(schema: &mut RefOr<Schema>) {
    let RefOr::T(inner) = schema else { return };
    match inner {
        Schema::Object(object) => {
            object.properties.values_mut().for_each(nullable_in);
            if let Some(extra) = object.additional_properties.as_deref_mut()
                && let utoipa::openapi::schema::AdditionalProperties::RefOr(extra) = extra
            {
                nullable_in(extra);
            }
        }
        Schema::Array(array) => {
            if let utoipa::openapi::schema::ArrayItems::RefOrSchema(items) = &mut array.items {
                nullable_in(items);
            }
        }
        Schema::OneOf(one_of) => one_of.items.iter_mut().for_each(nullable_in),
        Schema::AnyOf(any_of) => any_of.items.iter_mut().for_each(nullable_in),
        Schema::AllOf(all_of) => all_of.items.iter_mut().for_each(nullable_in),
        _ => {}
    }
    let Schema::OneOf(one_of) = inner else { return };
    let is_null = |item: &RefOr<Schema>| matches!(item, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null));
    if one_of.items.len() != 2 || !is_null(&one_of.items[1]) {
        return;
    }
    let description = one_of.description.take();
    let replacement = match one_of.items.swap_remove(0) {
        RefOr::Ref(reference) => Schema::AnyOf(
            utoipa::openapi::schema::AnyOfBuilder::new()
                .item(RefOr::Ref(reference))
                .item(Object::builder().schema_type(SchemaType::Type(Type::Null)))
                .description(description)
                .build(),
        ),
        RefOr::T(Schema::Object(mut object)) if matches!(&object.schema_type, SchemaType::Type(t) if *t != Type::Null) =>
        {
            let SchemaType::Type(ty) = object.schema_type.clone() else {
                return;
            };
            object.schema_type = SchemaType::from_iter([ty, Type::Null]);
            if object.description.is_none() {
                object.description = description;
            }
            Schema::Object(object)
        }
        other => {
            // Not a shape generators stumble on: as it was.
            one_of.items.insert(0, other);
            one_of.description = description;
            return;
        }
    };
    *inner = replacement;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_told_apart_by_place_and_path() {
        let cases = [
            ("/v1/leases/{id}", "get", ParameterIn::Path, "id", Some(Format::Id)),
            ("/v1/txns/{id}", "get", ParameterIn::Path, "id", Some(Format::Name)),
            ("/v1/kv/{key}", "get", ParameterIn::Path, "key", Some(Format::Key)),
            ("/v1/locks", "post", ParameterIn::Query, "wait", Some(Format::Duration)),
            ("/v1/locks", "post", ParameterIn::Query, "name", None),
            (
                "/v1/kv/{key}",
                "get",
                ParameterIn::Header,
                "If-None-Match",
                Some(Format::ETag),
            ),
            (
                "/v1/kv/{key}",
                "put",
                ParameterIn::Header,
                "If-None-Match",
                Some(Format::Any),
            ),
        ];
        for (path, method, place, name, format) in cases {
            let method: Method = method.to_uppercase().parse().expect("a method");
            assert_eq!(format_of(path, &method, &place, name), format, "{method} {path} {name}");
        }
    }

    proptest::proptest! {
        /// Every claim id the pattern allows is one the server takes (the NUL item schemathesis
        /// once sent is outside it; a batch of generated ids is no longer mostly refused).
        #[test]
        fn claim_ids_the_pattern_allows_name_an_item(id in proptest::string::string_regex(CLAIM_ID).unwrap()) {
            proptest::prop_assert!(crate::ids::claimed_item(&id).is_some(), "{}", id);
        }
    }

    /// The patterns agree with the server's own checks on examples of each side.
    #[test]
    fn durations_the_pattern_allows_parse() {
        for text in ["0", "5s", "500ms", "2m", "999h"] {
            assert!(crate::time::parse_duration(text).is_ok(), "{text}");
        }
    }
}
