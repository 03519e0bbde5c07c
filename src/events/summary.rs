//! A kind's summary topic (`summary:locks`): [crate::recipes::summary::Tallies] kept current
//! from one persistent recursive watch on the kind's directory.
//!
//! Why this shape: following each resource would cost a watch and a topic per resource (tens of
//! thousands), and re-listing the directory on a timer would be polling. The recursive watch
//! is one watch whatever the number of resources; each event below the directory names the
//! resource it touched, which is marked dirty, and the dirty ones are measured again together
//! (a multi-read of their stats), at most [INTERVAL] apart, however many events came. The
//! watch is set before the first listing and a resource is taken off the dirty set before it is
//! measured, so a change is always either in a measurement or in a later one. After a
//! reconnection or a new session the watch may have missed events, so the whole kind is
//! listed and measured again and published as a `resync`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Publisher, to_json};
use crate::kind::Kind;
use crate::locked::Locked;
use crate::recipes::summary::{Tallies, measure, names};
use crate::zk::recursive::Change;

/// How many of the busiest resources a summary names.
pub const TOP: usize = 25;

/// The shortest time between two measurements (and so between two events of the topic).
const INTERVAL: Duration = Duration::from_millis(500);

/// What the watch has reported and the measurer not yet read.
#[derive(Default)]
struct Pending {
    /// Everything is to be listed again: the first time (`Some(None)`), or after a gap
    /// (`Some(Some(reason))`).
    rescan: Option<Option<&'static str>>,
    dirty: HashSet<String>,
}

pub(super) async fn follow_summary(publisher: Publisher, kind: Kind, base: String) {
    let pending = Arc::new(Mutex::new(Pending::default()));
    let wake = Arc::new(Notify::new());
    let watch = crate::zk::recursive::follow(publisher.zk(), &base, {
        let (pending, wake, base) = (pending.clone(), wake.clone(), base.clone());
        move |change| {
            let mut pending = pending.locked();
            match change {
                Change::Start { .. } => pending.rescan = Some(None),
                Change::Resync { reason, .. } => pending.rescan = Some(Some(reason)),
                // The resource a change below the kind's directory is in.
                Change::Node { path, .. } => match path.strip_prefix(base.as_str()).and_then(|p| p.strip_prefix('/')) {
                    Some(below) => {
                        let name = below.split('/').next().unwrap_or(below);
                        pending.dirty.insert(name.to_string());
                    }
                    // The directory itself was created or deleted.
                    None => pending.rescan = Some(pending.rescan.flatten()),
                },
            }
            drop(pending);
            wake.notify_one();
        }
    });
    let measure = async {
        let mut tallies = Tallies::new(kind, TOP);
        let mut last: Option<serde_json::Value> = None;
        loop {
            wake.notified().await;
            let (rescan, dirty) = {
                let mut pending = pending.locked();
                (pending.rescan.take(), std::mem::take(&mut pending.dirty))
            };
            if rescan.is_none() && dirty.is_empty() {
                continue;
            }
            match measure_now(&publisher, kind, &base, &mut tallies, rescan, &dirty).await {
                Ok(()) => {
                    let state = to_json(&tallies.state(crate::time::now_ms()));
                    match (rescan, &last) {
                        (Some(Some(reason)), Some(_)) => publisher.resync(reason, state.clone()),
                        (_, None) => publisher.publish("state", state.clone(), None),
                        (_, Some(before)) if *before != state => publisher.publish("changed", state.clone(), None),
                        _ => {}
                    }
                    last = Some(state);
                }
                Err(err) => {
                    // Measured nothing: all of it again, in a moment.
                    tracing::debug!(kind = kind.dir(), error = %err, "summary measurement failed; again");
                    let mut pending = pending.locked();
                    pending.dirty.extend(dirty);
                    if let Some(rescan) = rescan {
                        pending.rescan = Some(pending.rescan.unwrap_or(rescan));
                    }
                    wake.notify_one();
                }
            }
            // Events that come meanwhile wait for the next round, together.
            tokio::time::sleep(INTERVAL).await;
        }
    };
    tokio::select! {
        _ = watch => {}
        _ = measure => {}
        _ = publisher.idle() => {}
    }
}

/// Measures everything (`rescan`, after a `sync` as for any topic's first state) or the dirty
/// resources.
async fn measure_now(
    publisher: &Publisher,
    kind: Kind,
    base: &str,
    tallies: &mut Tallies,
    rescan: Option<Option<&'static str>>,
    dirty: &HashSet<String>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let session = publisher.zk().connected().await?;
    if rescan.is_some() {
        session.sync().await?;
        let all = names(session.client(), base).await?;
        tallies.reset(measure(session.client(), kind, base, all).await?, crate::time::now_ms());
    } else {
        let dirty = dirty.iter().cloned().collect();
        tallies.update(
            measure(session.client(), kind, base, dirty).await?,
            crate::time::now_ms(),
        );
    }
    Ok(())
}
