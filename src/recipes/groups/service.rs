//! Service discovery as Apache Curator's `curator-x-discovery` lays it out, so that a JVM
//! service using Curator's `ServiceDiscovery` and HTTP clients see each other's instances:
//! `<root>/services/<service>/<instance id>`, a znode per live instance (persistent, bound to a
//! lease where Curator makes it ephemeral) holding the
//! instance as Curator's `JsonInstanceSerializer` writes it (`name`, `id`, `address`, `port`,
//! `sslPort`, `payload`, `registrationTimeUTC`, `serviceType`, `uriSpec`). Point Curator's
//! `ServiceDiscoveryBuilder.basePath` at `<root>/services`.
//!
//! An instance registered through zkgate is bound to a lease like a group member (see
//! [crate::recipes::engine::node]); its JSON carries one field more, `zkgate` (its lease and principal),
//! which Curator's reader ignores. Curator writes an object payload with Jackson's type tag
//! (`"@class": "java.util.HashMap"`); zkgate writes payloads as given, which a
//! `ServiceDiscovery<Map>` reads as a map.

use crate::zk::{Failure, Session};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::watch::Mode;

/// One part of a URI template, as Curator's `UriSpec` is serialized.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct UriPart {
    pub value: String,
    pub variable: bool,
}

/// A URI template (`{scheme}://{address}:{port}/api`), as Curator serializes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct UriSpecJson {
    pub parts: Vec<UriPart>,
}

impl UriSpecJson {
    /// Parses a template: text in braces is a variable, the rest is literal. `None` if a brace
    /// is not closed (or a variable is empty).
    pub fn parse(template: &str) -> Option<UriSpecJson> {
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}')?;
                    let name = &rest[1..end];
                    if name.is_empty() || name.contains('{') {
                        return None;
                    }
                    parts.push(UriPart {
                        value: name.to_string(),
                        variable: true,
                    });
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    if rest[..end].contains('}') {
                        return None;
                    }
                    parts.push(UriPart {
                        value: rest[..end].to_string(),
                        variable: false,
                    });
                    rest = &rest[end..];
                }
            }
        }
        Some(UriSpecJson { parts })
    }

    /// The template as text.
    pub fn template(&self) -> String {
        self.parts
            .iter()
            .map(|p| {
                if p.variable {
                    format!("{{{}}}", p.value)
                } else {
                    p.value.clone()
                }
            })
            .collect()
    }
}

/// Who registered an instance through zkgate (absent on others').
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Registrar {
    pub lease: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// An instance as its znode holds it: Curator's JSON.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CuratorInstance {
    pub name: String,
    pub id: String,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(rename = "sslPort", default)]
    pub ssl_port: Option<u16>,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(rename = "registrationTimeUTC", default)]
    pub registration_time_utc: i64,
    #[serde(rename = "serviceType", default = "dynamic")]
    pub service_type: String,
    #[serde(rename = "uriSpec", default)]
    pub uri_spec: Option<UriSpecJson>,
    /// Curator 5 writes it only when it is false (a disabled instance is not picked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zkgate: Option<Registrar>,
}

fn dynamic() -> String {
    "DYNAMIC".into()
}

/// An instance as the API shows it.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct InstanceView {
    #[schema(example = "billing-1")]
    pub id: String,
    #[schema(example = "10.0.0.5")]
    pub address: Option<String>,
    #[schema(example = 8080)]
    pub port: Option<u16>,
    pub ssl_port: Option<u16>,
    /// Whatever the instance published (JSON); Curator's object payloads carry its `@class`.
    #[schema(example = json!({"zone": "eu-1"}))]
    pub payload: serde_json::Value,
    /// Its URI template (`{scheme}://{address}:{port}`), if it has one.
    pub uri_spec: Option<String>,
    /// The template filled in (`scheme` is `https` with an SSL port), if every variable is
    /// known.
    #[schema(example = "http://10.0.0.5:8080")]
    pub uri: Option<String>,
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub registered_at: String,
    /// `DYNAMIC` (ephemeral) as registered here; Curator also knows `STATIC` and `PERMANENT`.
    pub service_type: String,
    /// `false` for an instance Curator marked disabled: listed, never picked.
    pub enabled: bool,
    /// The lease it is bound to, when registered through zkgate.
    pub lease: Option<String>,
}

impl InstanceView {
    /// The view of an instance's znode data; `None` if it is not an instance.
    pub fn of(data: &[u8]) -> Option<InstanceView> {
        let instance: CuratorInstance = serde_json::from_slice(data).ok()?;
        let uri = instance.uri_spec.as_ref().and_then(|spec| build_uri(spec, &instance));
        Some(InstanceView {
            uri_spec: instance.uri_spec.as_ref().map(UriSpecJson::template),
            uri,
            registered_at: timestamp(from_millis(instance.registration_time_utc)),
            enabled: instance.enabled != Some(false),
            lease: instance.zkgate.map(|r| r.lease),
            id: instance.id,
            address: instance.address,
            port: instance.port,
            ssl_port: instance.ssl_port,
            payload: instance.payload,
            service_type: instance.service_type,
        })
    }
}

/// Fills a URI template with the instance's fields, as Curator's `UriSpec.build` does for
/// these variables; `None` if one is unknown or missing.
fn build_uri(spec: &UriSpecJson, instance: &CuratorInstance) -> Option<String> {
    let mut uri = String::new();
    for part in &spec.parts {
        if !part.variable {
            uri.push_str(&part.value);
            continue;
        }
        let value = match part.value.as_str() {
            "scheme" => Some(if instance.ssl_port.is_some() { "https" } else { "http" }.to_string()),
            "name" => Some(instance.name.clone()),
            "id" => Some(instance.id.clone()),
            "address" => instance.address.clone(),
            "port" => instance.port.map(|p| p.to_string()),
            "ssl-port" => instance.ssl_port.map(|p| p.to_string()),
            _ => None,
        }?;
        uri.push_str(&value);
    }
    Some(uri)
}

/// A service's live instances: what `GET /v1/services/{name}` answers and the `service` topic
/// carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct ServiceState {
    #[schema(example = "billing")]
    pub name: String,
    /// Sorted by id.
    pub instances: Vec<InstanceView>,
}

event_kinds! {
    /// The events of a service topic.
    ServiceEvent {
        Registered => "registered",
        Unregistered => "unregistered",
        /// As many instances as before, not the same ones (or changed).
        Instances => "instances",
    }
}

/// A service as a topic (and as `GET` reads it): a children watch on its znode.
pub struct ServiceTopic {
    pub name: String,
    pub dir: String,
}

impl Source for ServiceTopic {
    type State = ServiceState;
    type Event = ServiceEvent;

    fn watches(&self, _: Option<&ServiceState>) -> Vec<(Mode, String)> {
        vec![(Mode::Children, self.dir.clone())]
    }

    /// The instances in two round trips (a listing, a multi-read); children that are not
    /// instances are left out.
    async fn read(&self, session: &Session) -> Result<ServiceState, Failure> {
        let client = session.client();
        let mut ids = crate::zk::children(client, &self.dir).await?;
        ids.sort();
        let instances = crate::zk::read_each(client, &self.dir, ids)
            .await?
            .into_iter()
            .filter_map(|(_, data, _)| InstanceView::of(&data))
            .collect();
        Ok(ServiceState {
            name: self.name.clone(),
            instances,
        })
    }

    fn change(&self, before: &ServiceState, after: &ServiceState) -> Option<ServiceEvent> {
        match after.instances.len().cmp(&before.instances.len()) {
            std::cmp::Ordering::Greater => Some(ServiceEvent::Registered),
            std::cmp::Ordering::Less => Some(ServiceEvent::Unregistered),
            std::cmp::Ordering::Equal => (before.instances != after.instances).then_some(ServiceEvent::Instances),
        }
    }
}

/// How to pick one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, ToSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Any enabled instance, uniformly.
    #[default]
    Random,
    /// Each enabled instance in turn (per service, on this instance of zkgate), as Curator's
    /// `RoundRobinStrategy` does per provider.
    RoundRobin,
}

/// Most services whose round-robin turn is remembered; past it the turns start again (a
/// bound against clients that pick from ever new names).
const TURNS_KEPT: usize = 10_000;

/// The round-robin turn of each service on this instance of zkgate (Curator's
/// `RoundRobinStrategy` keeps one per provider), at most [TURNS_KEPT] of them.
#[derive(Default)]
pub struct Picker {
    turns: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

impl Picker {
    /// The instance of `service` that `strategy` picks among the enabled ones in `instances`;
    /// a round-robin pick takes the service's turn.
    pub fn pick<'a>(
        &self,
        service: &str,
        instances: &'a [InstanceView],
        strategy: Strategy,
    ) -> Option<&'a InstanceView> {
        let turn = match strategy {
            Strategy::RoundRobin => self.next_turn(service),
            Strategy::Random => rand::random::<u32>() as usize,
        };
        pick(instances, turn)
    }

    fn next_turn(&self, service: &str) -> usize {
        use crate::locked::Locked;
        let mut turns = self.turns.locked();
        if turns.len() >= TURNS_KEPT && !turns.contains_key(service) {
            turns.clear();
        }
        let turn = turns.entry(service.to_string()).or_insert(0);
        let current = *turn;
        *turn = turn.wrapping_add(1);
        current
    }
}

/// The enabled instance at `turn` (modulo their number), if any is enabled.
fn pick(instances: &[InstanceView], turn: usize) -> Option<&InstanceView> {
    let enabled: Vec<&InstanceView> = instances.iter().filter(|i| i.enabled).collect();
    (!enabled.is_empty()).then(|| enabled[turn % enabled.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance exactly as Curator 5.4's `JsonInstanceSerializer` wrote it (captured from
    /// `ServiceDiscovery<Map>` with a map payload and a URI template).
    const CURATOR: &str = r#"{"name":"billing","id":"e5ab42bb-d7b8-4bd8-96a6-a57bee4a0ee6","address":"10.0.0.5","port":8080,"sslPort":null,"payload":{"@class":"java.util.HashMap","zone":"eu-1","weight":3},"registrationTimeUTC":1795476517123,"serviceType":"DYNAMIC","uriSpec":{"parts":[{"value":"scheme","variable":true},{"value":"://","variable":false},{"value":"address","variable":true},{"value":":","variable":false},{"value":"port","variable":true}]}}"#;

    #[test]
    fn curators_instances_are_read() {
        let view = InstanceView::of(CURATOR.as_bytes()).expect("an instance");
        assert_eq!(view.address.as_deref(), Some("10.0.0.5"));
        assert_eq!(view.port, Some(8080));
        assert_eq!(view.payload["zone"], "eu-1");
        assert_eq!(view.uri_spec.as_deref(), Some("{scheme}://{address}:{port}"));
        assert_eq!(view.uri.as_deref(), Some("http://10.0.0.5:8080"));
        assert!(view.enabled);
        assert_eq!(view.lease, None);
        assert_eq!(InstanceView::of(b"not json"), None);
    }

    #[test]
    fn uri_templates_round_trip_as_curator_serializes_them() {
        let spec = UriSpecJson::parse("{scheme}://{address}:{port}/api").expect("parses");
        assert_eq!(spec.parts.len(), 6);
        assert_eq!(spec.template(), "{scheme}://{address}:{port}/api");
        let curator: CuratorInstance = serde_json::from_str(CURATOR).expect("parses");
        assert_eq!(
            UriSpecJson::parse("{scheme}://{address}:{port}").as_ref(),
            curator.uri_spec.as_ref()
        );
        for bad in ["{scheme", "a}b", "{}", "{a{b}}"] {
            assert_eq!(UriSpecJson::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn picks_skip_disabled_instances_and_take_turns() {
        let instance = |id: &str, enabled| InstanceView {
            id: id.into(),
            address: None,
            port: None,
            ssl_port: None,
            payload: serde_json::Value::Null,
            uri_spec: None,
            uri: None,
            registered_at: String::new(),
            service_type: "DYNAMIC".into(),
            enabled,
            lease: None,
        };
        let all = [instance("a", true), instance("b", false), instance("c", true)];
        let picker = Picker::default();
        let turns: Vec<&str> = (0..4)
            .map(|_| picker.pick("billing", &all, Strategy::RoundRobin).unwrap().id.as_str())
            .collect();
        assert_eq!(turns, ["a", "c", "a", "c"]);
        // Each service has its own turn.
        assert_eq!(picker.pick("orders", &all, Strategy::RoundRobin).unwrap().id, "a");
        assert_eq!(pick(&all, 1).unwrap().id, "c");
        assert_eq!(picker.pick("billing", &[instance("b", false)], Strategy::Random), None);
    }
}
