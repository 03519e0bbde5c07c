//! The two background tasks that guard a runner's lock and report [Trouble]: the lease keeper
//! (keepalives every third of the TTL) and the handle watcher (a long poll that zkgate answers
//! at once on news). Each reports at most once, then ends.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::RETRY;
use super::api::{Api, HandleNews, Lease, Target};
use super::supervise::Trouble;

/// The longest a handle long poll asks to wait (zkgate may cut it to its `--max-wait`).
const NEWS_WAIT: Duration = Duration::from_secs(30);

/// Keeps `lease` alive, every third of its TTL, from `alive_since` (when the request that
/// created it was sent, which is no later than zkgate started its TTL).
///
/// Reports the lease lost when zkgate says it is gone (404, 410), or when no keepalive has
/// succeeded for a whole TTL: by then zkgate has let it expire, or is about to, and the lock
/// with it. Other failures are retried meanwhile; a blip must not stop the command.
pub async fn keep_alive(api: Api, lease: Lease, mut alive_since: Instant, troubles: mpsc::Sender<Trouble>) {
    let ttl = lease.ttl();
    let period = ttl / 3;
    let mut next = alive_since + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let expires = alive_since + ttl;
        // A keepalive that arrives after `expires` is no use: it would find the lease gone. And
        // an instance that does not answer within a period (paused, cut off) gives the next
        // instance its turn with time to spare.
        let limit = expires
            .saturating_duration_since(sent)
            .min(period)
            .max(Duration::from_millis(100));
        match api.keepalive(&lease.id, limit).await {
            Ok(()) => {
                alive_since = sent;
                next = sent + period;
            }
            Err(error) if error.is_gone() => {
                let _ = troubles.send(Trouble::Lost(error.to_string())).await;
                return;
            }
            Err(error) if Instant::now() >= expires => {
                let ttl = humantime::format_duration(ttl);
                let why = format!("no keepalive got through for a whole TTL ({ttl}): {error}");
                let _ = troubles.send(Trouble::Lost(why)).await;
                return;
            }
            Err(_) => next = (Instant::now() + RETRY.min(period)).min(expires),
        }
    }
}

/// Long-polls `handle` and reports the first news that matters: a revocation request, or a
/// state other than `held`. Failures are retried after a pause: if zkgate stays unreachable,
/// the keeper reports the lease lost after a TTL.
pub async fn watch_handle(api: Api, target: Target, handle: String, troubles: mpsc::Sender<Trouble>) {
    loop {
        let trouble = match api.news(&target, &handle, NEWS_WAIT).await {
            Ok(news) => trouble_in(news),
            Err(error) if error.is_gone() => Some(Trouble::Lost(error.to_string())),
            Err(_) => {
                tokio::time::sleep(RETRY).await;
                None
            }
        };
        if let Some(trouble) = trouble {
            let _ = troubles.send(trouble).await;
            return;
        }
    }
}

/// The trouble a handle's news tells of, if any (a long poll that ran its course says `held`).
fn trouble_in(news: HandleNews) -> Option<Trouble> {
    if let Some(revocation) = news.revocation {
        return Some(Trouble::Revoked {
            by: revocation.by,
            reason: revocation.reason,
            grace: revocation.grace_ms.map(Duration::from_millis),
        });
    }
    let why = match (news.state.as_str(), news.reason) {
        ("held", _) => return None,
        ("lost", Some(reason)) => reason,
        (state, Some(reason)) => format!("{state}: {reason}"),
        (state, None) => state.to_string(),
    };
    Some(Trouble::Lost(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn news(value: serde_json::Value) -> HandleNews {
        serde_json::from_value(value).expect("news")
    }

    #[test]
    fn held_is_no_news_and_anything_else_is_trouble() {
        assert_eq!(trouble_in(news(serde_json::json!({"state": "held"}))), None);
        assert_eq!(
            trouble_in(news(serde_json::json!({"state": "lost", "reason": "node deleted"}))),
            Some(Trouble::Lost("node deleted".into()))
        );
        assert_eq!(
            trouble_in(news(serde_json::json!({"state": "released"}))),
            Some(Trouble::Lost("released".into()))
        );
        let revoked = serde_json::json!({"state": "held", "revocation": {
            "kind": "lock", "lock": "l", "node": "n", "by": "ops", "reason": "why",
            "at_ms": 1, "grace_ms": 1500}});
        assert_eq!(
            trouble_in(news(revoked)),
            Some(Trouble::Revoked {
                by: "ops".into(),
                reason: "why".into(),
                grace: Some(Duration::from_millis(1500))
            })
        );
    }
}
