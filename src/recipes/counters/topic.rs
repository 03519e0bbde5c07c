//! A counter as it is shown: the state `GET /v1/counters/{name}` answers and the `counter`
//! topic carries, and the topic that follows it.

use super::*;

/// A counter: what `GET /v1/counters/{name}` answers and the `counter` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct CounterState {
    #[schema(example = "orders-shipped")]
    pub name: String,
    /// The value (0 for a counter that does not exist); `null` when the znode holds data that
    /// is not a counter.
    #[schema(example = 42)]
    pub value: Option<i64>,
    /// Whether its znode exists.
    pub exists: bool,
    /// Its version, for `If-Match` (as in the `ETag` header); `null` when it does not exist.
    #[schema(example = "\"4294967311\"")]
    pub etag: Option<String>,
    /// How many times it was written since it was created.
    pub updates: i32,
    /// When it was last written.
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    pub updated: Option<String>,
}

/// A counter's version as an ETag: its znode's mzxid, quoted.
pub fn etag(mzxid: i64) -> String {
    format!("\"{mzxid}\"")
}

impl CounterState {
    pub fn of(name: &str, value: Option<i64>, stat: Option<&Stat>) -> CounterState {
        CounterState {
            name: name.to_string(),
            value,
            exists: stat.is_some(),
            etag: stat.map(|s| etag(s.mzxid)),
            updates: stat.map_or(0, |s| s.version),
            updated: stat.map(|s| timestamp(from_millis(s.mtime))),
        }
    }
}

event_kinds! {
    /// The events of a counter topic.
    CounterEvent {
        Created => "created",
        Changed => "changed",
        Deleted => "deleted",
    }
}

/// A counter as a topic (and as `GET` reads it): one exists-watch on its znode, which fires on
/// every write.
pub struct CounterTopic {
    pub name: String,
    pub path: String,
}

impl Source for CounterTopic {
    type State = CounterState;
    type Event = CounterEvent;

    fn watches(&self, _: Option<&CounterState>) -> Vec<(Mode, String)> {
        vec![(Mode::Exists, self.path.clone())]
    }

    async fn read(&self, session: &Session) -> Result<CounterState, Failure> {
        let client = session.client();
        Ok(match crate::zk::data(client, &self.path).await? {
            Some((data, stat)) => CounterState::of(&self.name, decode(&data), Some(&stat)),
            None => CounterState::of(&self.name, Some(0), None),
        })
    }

    fn change(&self, before: &CounterState, after: &CounterState) -> Option<CounterEvent> {
        match (before.exists, after.exists) {
            (false, true) => Some(CounterEvent::Created),
            (true, false) => Some(CounterEvent::Deleted),
            // A write of the same value is a change too: its version moved.
            _ => (before.etag != after.etag || before.value != after.value).then_some(CounterEvent::Changed),
        }
    }
}
