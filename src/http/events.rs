//! Server-Sent Events: every topic a socket can subscribe to, over plain HTTP, for `curl -N`
//! and the browser's `EventSource`.
//!
//! `GET /v1/events?topic=election:scheduler&topic=lock:orders` (the topics as the bus names
//! them, [topics::parse_name]) or `GET /v1/<kind>/<name>/events` answers `text/event-stream`:
//! first each topic's state, then every event of every topic as it comes, each as one SSE event
//! whose `data` is the event as the socket sends it (`topic`, `seq`, `position`, `type`,
//! `state`...) and whose `id` is the stream's position: the `position` of the last event of
//! each topic, in the order the topics were named, joined by `,`.
//!
//! A client that reconnects with that id (`Last-Event-ID`, which `EventSource` sends by itself,
//! or `?since=`) resumes: a topic whose missed events are still among its recent ones
//! ([crate::events::EventSettings]) sends just those, without its state; one whose gap is
//! longer (or whose topic has since ended on this instance, or which was followed on another
//! instance) sends a `resync` with its state (reason `cannot_resume`).
//!
//! A comment line every `--ws-ping-interval` keeps proxies from closing a quiet stream and
//! tells a client the connection still lives. A stream counts as a socket against the
//! principal's and the address's limits, and each of its topics as a subscription; its Host
//! and `Origin` are checked as a socket's are ([super::origin]); a client that stops reading
//! falls behind (a `resync` when it reads again) and is cut after `--write-timeout`.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::Value;

use super::error::{ApiError, Place, Problem};
use super::extract::ApiPath;
use crate::AppState;
use crate::auth::Caller;
use crate::events::topics::{self, TopicError};
use crate::events::{Position, Subscription};
use crate::kind::Kind;
use crate::limits::ClientAddr;
use crate::metrics::Counted;
use utoipa_axum::router::OpenApiRouter;

use topics::MAX_TOPICS;

/// How long a client waits before reconnecting a dropped stream (sent as `retry:`).
const RETRY: Duration = Duration::from_secs(1);

/// The header a reconnecting `EventSource` sends.
const LAST_EVENT_ID: &str = "last-event-id";

/// Follows topics as Server-Sent Events.
///
/// `topic` (repeat it, up to 64) names each topic as events name it: `KIND:NAME` for a
/// resource (`lock:orders`; the kinds are listed below), `lease:ID` (a lease of this instance),
/// `summary:KIND` (every resource of a kind at a glance: `summary:locks`, `summary:queues`...),
/// or `znode:data|children|recursive:PATH` (relative to the root). Each SSE event's `data` is one
/// event (`{"topic":...,"seq":N,"position":"...","type":"state","state":{...}}`): first each
/// topic's `state`, then its changes, `resync` (with a `reason`) where changes may have been
/// missed. Its `id` is where the stream is; reconnect with it as `Last-Event-ID` (or
/// `?since=`) to resume without the states again. A comment line is sent every
/// `--ws-ping-interval`.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(
        ("topic" = Vec<String>, Query, description = "A topic to follow, e.g. `election:scheduler`, `lock:orders`, `lease:<id>`, `summary:locks`, `znode:data:kv/app`; repeat for more (at most 64)."),
        ("since" = Option<String>, Query, description = "The `id` of the last event taken on an earlier stream of the same topics: resume after it. `Last-Event-ID` takes precedence."),
        ("Last-Event-ID" = Option<String>, Header, description = "Sent by a reconnecting `EventSource`: the `id` of the last event it took."),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "The events, as they come, until the client leaves"),
        super::error::Problems<(super::error::p::InvalidField, super::error::p::ZookeeperUnavailable)>,
    ))]
pub async fn events(
    State(state): State<AppState>,
    caller: Caller,
    address: Option<axum::Extension<ClientAddr>>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (topics, since) = stream_query(&uri, true)?;
    if topics.is_empty() {
        let detail = "name at least one topic, e.g. `?topic=election:scheduler`";
        return Err(ApiError::invalid(Place::Query, "topic", detail));
    }
    let topics = topics
        .iter()
        .map(|name| topics::parse_name(name).map_err(|err| topic_error(err, name)))
        .collect::<Result<Vec<Value>, ApiError>>()?;
    open(state, caller, address.map(|a| a.0), topics, since, &headers).await
}

/// A stream's query: its `topic`s (where it takes them) and `since`; any other parameter is a
/// 400 naming it.
fn stream_query(uri: &Uri, takes_topics: bool) -> Result<(Vec<String>, Option<String>), ApiError> {
    let (mut topics, mut since) = (Vec::new(), None);
    for (name, value) in form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match &*name {
            "topic" if takes_topics => topics.push(value.into_owned()),
            "since" => since = Some(value.into_owned()),
            other => {
                let known = if takes_topics { "`topic`, `since`" } else { "`since`" };
                let detail = format!("is not a parameter of an event stream ({known})");
                return Err(ApiError::invalid(Place::Query, other, detail));
            }
        }
    }
    Ok((topics, since))
}

/// The stream of `topics` for `caller`, from the start or after `since` (or `Last-Event-ID`).
async fn open(
    state: AppState,
    caller: Caller,
    address: Option<ClientAddr>,
    topics: Vec<Value>,
    since: Option<String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if topics.len() > MAX_TOPICS {
        let detail = format!("at most {MAX_TOPICS} topics per stream (open another)");
        return Err(ApiError::invalid(Place::Query, "topic", detail));
    }
    let resolved = topics
        .iter()
        .map(|topic| topics::resolve(&state, &caller, topic).map_err(|err| topic_error(err, &topic.to_string())))
        .collect::<Result<Vec<_>, ApiError>>()?;
    for (i, (name, _)) in resolved.iter().enumerate() {
        if resolved[..i].iter().any(|(other, _)| other == name) {
            let detail = format!("`{name}` is named twice");
            return Err(ApiError::invalid(Place::Query, "topic", detail));
        }
    }
    let since = resume_point(headers, since, resolved.len())?;
    state.zk().current()?;
    let mut permits = topics::stream_permits(&state, &caller, address)?;
    for _ in &resolved {
        permits.push(topics::subscription_permit(&state, &caller)?);
    }
    let mut subscriptions = Vec::with_capacity(resolved.len());
    for (i, (name, feed)) in resolved.into_iter().enumerate() {
        let from = since.as_ref().map(|positions| positions[i]);
        subscriptions.push(state.events.subscribe(&name, feed, from).await);
    }
    let metrics = crate::metrics::get();
    let mut counted = vec![Counted::new(&metrics.event_streams)];
    counted.extend(subscriptions.iter().map(|_| Counted::new(&metrics.subscriptions)));
    let held = (permits, counted);
    let events = merged(subscriptions).map(move |event| {
        // The permits and gauges go with the stream.
        let _ = &held;
        Ok::<_, Infallible>(event)
    });
    let start = futures::stream::once(async { Ok(SseEvent::default().retry(RETRY)) });
    let stream = start.chain(events).take_until(state.shutdown.clone().cancelled_owned());
    let keep_alive = KeepAlive::new().interval(state.config.ws_ping_interval);
    let mut response = Sse::new(stream).keep_alive(keep_alive).into_response();
    // Proxies that buffer responses (nginx) would hold the events back.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The events of all `subscriptions`, interleaved as they come, each with the stream's position
/// after it as its id.
fn merged(subscriptions: Vec<Subscription>) -> impl Stream<Item = SseEvent> + Send {
    let mut positions: Vec<Position> = subscriptions.iter().map(Subscription::position).collect();
    let each = subscriptions.into_iter().enumerate().map(|(i, subscription)| {
        futures::stream::unfold(subscription, move |mut subscription| async move {
            let event = subscription.next().await?;
            Some(((i, event), subscription))
        })
        .boxed()
    });
    futures::stream::select_all(each).map(move |(i, event)| {
        positions[i] = event.position;
        let id = positions.iter().map(Position::to_string).collect::<Vec<_>>().join(",");
        let data = serde_json::to_string(&*event).unwrap_or_default();
        SseEvent::default().id(id).data(data)
    })
}

/// Where the stream resumes, one position per topic: `Last-Event-ID` if the client sent one,
/// else `?since=`; `None` for a stream from the start.
fn resume_point(headers: &HeaderMap, since: Option<String>, topics: usize) -> Result<Option<Vec<Position>>, ApiError> {
    let (place, field, text) = match headers.get(LAST_EVENT_ID) {
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| ApiError::invalid(Place::Header, "Last-Event-ID", "is not text"))?;
            (Place::Header, "Last-Event-ID", text.to_string())
        }
        None => match since {
            Some(since) => (Place::Query, "since", since),
            None => return Ok(None),
        },
    };
    // An `EventSource` that never got an event has no id to send.
    if text.is_empty() {
        return Ok(None);
    }
    let positions = text
        .split(',')
        .map(str::parse::<Position>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|detail| ApiError::invalid(place, field, detail))?;
    if positions.len() != topics {
        return Err(ApiError::invalid(
            place,
            field,
            format!(
                "has {} positions for {topics} topics: give back the `id` of the last event of a stream of the same topics",
                positions.len()
            ),
        ));
    }
    Ok(Some(positions))
}

/// A topic that cannot be followed, as the problem of a stream's request.
fn topic_error(err: TopicError, topic: &str) -> ApiError {
    match err {
        TopicError::Unknown(detail) | TopicError::Invalid(detail) => {
            ApiError::invalid(Place::Query, "topic", detail).with("topic", topic)
        }
        TopicError::Forbidden(detail) => ApiError::new(Problem::Forbidden, detail),
    }
}

/// A kind's `GET /v1/<segment>/{name}/events`: one of its resources' topic as Server-Sent
/// Events (as `GET /v1/events` follows it), with its operation in the spec (`<kind>_events`, summarised by
/// `summary`); one per kind with topics, from the registry.
pub fn events_route(kind: Kind, followed: &super::Followed) -> OpenApiRouter<AppState> {
    use super::error::{Problems, p};
    use utoipa::IntoResponses;
    use utoipa::openapi::path::{OperationBuilder, ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ContentBuilder, ObjectBuilder, Required, ResponseBuilder, ResponsesBuilder, schema::Type};
    let (summary, param) = (followed.summary, followed.param);
    let topic = kind.topic().expect("an events route only for kinds with topics");
    let handler = move |State(state): State<AppState>,
                        caller: Caller,
                        address: Option<axum::Extension<ClientAddr>>,
                        ApiPath(name): ApiPath<String>,
                        uri: Uri,
                        headers: HeaderMap| async move {
        super::check_name(&name)?;
        let (_, since) = stream_query(&uri, false)?;
        let topics = vec![serde_json::json!({ topic: name })];
        open(state, caller, address.map(|a| a.0), topics, since, &headers).await
    };
    let path = format!("/v1/{}/{{{param}}}/events", kind.segment());
    let parameter = |name: &str, place: ParameterIn, required: bool, description: &str| {
        ParameterBuilder::new()
            .name(name)
            .parameter_in(place)
            .required(if required { Required::True } else { Required::False })
            .description(Some(description))
            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
            .build()
    };
    let parameters = vec![
        parameter(param, ParameterIn::Path, true, "Its name"),
        parameter(
            "since",
            ParameterIn::Query,
            false,
            "The `id` of the last event taken on an earlier stream: resume after it. `Last-Event-ID` takes precedence.",
        ),
        parameter(
            "Last-Event-ID",
            ParameterIn::Header,
            false,
            "Sent by a reconnecting `EventSource`: the `id` of the last event it took.",
        ),
    ];
    let stream = ResponseBuilder::new()
        .description("The events, as they come, until the client leaves")
        .content(
            "text/event-stream",
            ContentBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .build(),
        )
        .build();
    let mut responses = Problems::<(p::InvalidField, p::ZookeeperUnavailable)>::responses();
    responses.insert("200".to_string(), stream.into());
    let operation = OperationBuilder::new()
        .tag(kind.tag())
        .summary(Some(summary))
        .description(Some(
            "The stream's first event is the state, then one per change, as on `GET /v1/events`;\nreconnect with the last `id` (`Last-Event-ID` or `?since=`) to resume.",
        ))
        .operation_id(Some(format!("{}_events", kind.name())))
        .parameters(Some(parameters))
        .responses(ResponsesBuilder::new().responses_from_iter(responses))
        .build();
    super::get_route(&path, axum::routing::get(handler), operation)
}

/// Appends to the descriptions of the socket and the event stream the topics of every kind
/// that has them, written from the registry here rather than by hand in their doc comments (a
/// hand list missed three kinds).
pub fn document(spec: &mut utoipa::openapi::OpenApi) {
    let endings = [
        (
            "/v1/ws",
            format!(
                "Resource topics: {}.",
                topics::listed(|t| format!("`{{\"{t}\":\"NAME\"}}`"))
            ),
        ),
        (
            "/v1/events",
            format!("Resource topics: {}.", topics::listed(|t| format!("`{t}:NAME`"))),
        ),
    ];
    for (path, ending) in endings {
        if let Some(operation) = spec.paths.paths.get_mut(path).and_then(|item| item.get.as_mut()) {
            let description = operation.description.get_or_insert_with(String::new);
            description.push_str("\n\n");
            description.push_str(&ending);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_point_has_one_position_per_topic() {
        let mut headers = HeaderMap::new();
        assert_eq!(resume_point(&headers, None, 2).ok(), Some(None));
        let both = resume_point(&headers, Some("1a-3,1b-4".into()), 2).ok().flatten();
        assert_eq!(
            both,
            Some(vec![Position { epoch: 0x1a, seq: 3 }, Position { epoch: 0x1b, seq: 4 }])
        );
        assert!(resume_point(&headers, Some("1a-3".into()), 2).is_err());
        assert!(resume_point(&headers, Some("zz-3,1b-4".into()), 2).is_err());
        // The header wins: it is the newer of the two when an EventSource reconnects.
        headers.insert(LAST_EVENT_ID, HeaderValue::from_static("2-9"));
        let header = resume_point(&headers, Some("1-1".into()), 1).ok().flatten();
        assert_eq!(header, Some(vec![Position { epoch: 2, seq: 9 }]));
    }
}
