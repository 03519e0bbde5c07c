//! What a recipe shows the world: its state, read from ZooKeeper, and what changed between two
//! states.
//!
//! One type per kind serves both ways of looking: `GET /v1/<kind>/<name>` answers a [Source]'s
//! [Source::read], and a socket or an event stream subscribed to the resource starts with the
//! same state and then receives one event per [Source::change], each carrying the state after
//! it. The event bus (`events`, a layer up) sets the watches a source asks for, one per znode
//! per instance however many subscribers there are, and reads the state again when they fire.
//!
//! [Source::change] is pure: two states in, the kind of event out. Each recipe unit-tests it.

use crate::zk::{Failure, Session};
use std::future::Future;

use serde::Serialize;

use crate::zk::watch::Mode;

/// The kind of an event of a topic: `granted`, `leader`, `joined`... (its `type` on the wire).
pub trait EventKind: Copy + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    fn name(self) -> &'static str;
}

/// A recipe's resource as a topic.
pub trait Source: Send + Sync + 'static {
    /// The resource's state, as `GET` answers it and events carry it.
    type State: Serialize + PartialEq + Clone + std::fmt::Debug + Send + Sync + utoipa::ToSchema + 'static;

    /// The kinds of its events.
    type Event: EventKind;

    /// The znodes the topic follows, and how (their children, or their existence and data),
    /// given its last state (`None` before the first read): a lock follows its current
    /// holder's node, say.
    fn watches(&self, state: Option<&Self::State>) -> Vec<(Mode, String)>;

    /// Reads the state now.
    fn read(&self, session: &Session) -> impl Future<Output = Result<Self::State, Failure>> + Send;

    /// What kind of event leads from `before` to `after`, or `None` if nothing changed that
    /// subscribers care about.
    fn change(&self, before: &Self::State, after: &Self::State) -> Option<Self::Event>;
}

/// Declares a topic's event kinds as an enum whose variants are their wire names.
macro_rules! event_kinds {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $crate::recipes::topic::EventKind for $name {
            fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $wire),+
                }
            }
        }

        impl $name {
            /// Every kind, as on the wire.
            pub const ALL: &'static [&'static str] = &[$($wire),+];
        }
    };
}

pub(crate) use event_kinds;
