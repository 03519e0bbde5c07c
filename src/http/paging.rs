//! Paged lists: `?limit=` and `?cursor=` on every list, and a `Link: <...>; rel="next"` header
//! (RFC 8288) on each page after which more follow.
//!
//! A list is ordered by a key of its entries (a name, or a lease's creation time and id), and
//! the cursor is the last key of the page, opaque to clients (its bytes in hexadecimal). The next page holds
//! the entries whose keys come after it: an entry added or removed between two pages moves no
//! other across the page boundary, so a client that follows the links sees every entry that
//! existed throughout exactly once, in order (an entry added meanwhile is seen if its key comes
//! after the cursor). etcd's range and Kubernetes' `continue` work alike.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::{ApiError, Place};

/// Entries on a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 1000;
/// Most entries on a page.
pub const MAX_LIMIT: usize = 10_000;
/// The longest cursor accepted (a key is at most a few hundred bytes, two digits each).
const MAX_CURSOR: usize = 4096;

/// The paging parameters, for the spec (the [Paging] extractor reads them).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct PageQuery {
    /// Most entries in the answer (1 to 10000, default 1000). When more follow, the answer's
    /// `Link` header (`rel="next"`) is the URL of the next page.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    /// Where the page starts: the `cursor` of the previous page's `Link` (opaque).
    #[param(max_length = 4096, pattern = "^([0-9a-f]{2})*$")]
    cursor: Option<String>,
}

/// A request's page: how many entries, after which key; and the request's path and other
/// parameters, for the next page's link.
#[derive(Debug, Clone)]
pub struct Paging {
    pub limit: usize,
    pub after: Option<String>,
    path: String,
    /// The query without `limit` and `cursor`.
    rest: Vec<(String, String)>,
}

impl<S: Send + Sync> FromRequestParts<S> for Paging {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Paging::parse(
            parts.uri.path(),
            parts.uri.query().unwrap_or_default(),
            DEFAULT_LIMIT,
            MAX_LIMIT,
        )
    }
}

impl Paging {
    /// Reads `limit` (default `default`, at most `max`) and `cursor` from `query`.
    pub fn parse(path: &str, query: &str, default: usize, max: usize) -> Result<Paging, ApiError> {
        let mut paging = Paging {
            limit: default,
            after: None,
            path: path.to_string(),
            rest: Vec::new(),
        };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "limit" => {
                    paging.limit =
                        value.parse().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| {
                            ApiError::invalid(Place::Query, "limit", format!("must be from 1 to {max}"))
                        })?;
                }
                "cursor" => {
                    // Any position is a place to start from: only the form is checked.
                    let cursor = (value.len() <= MAX_CURSOR)
                        .then(|| crate::ids::unhex(&value))
                        .flatten()
                        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                        .ok_or_else(|| {
                            ApiError::invalid(
                                Place::Query,
                                "cursor",
                                "not a cursor this list gave (take it from the `Link` header of the previous page)",
                            )
                        })?;
                    paging.after = Some(cursor);
                }
                _ => paging.rest.push((name.into_owned(), value.into_owned())),
            }
        }
        Ok(paging)
    }

    /// The page of `entries` this request asks for: sorted by `key`, those after the cursor,
    /// at most `limit`; and the cursor of the next page if more follow.
    pub fn page<T>(&self, entries: Vec<T>, key: impl Fn(&T) -> String) -> Page<T> {
        let mut keyed: Vec<(String, T)> = entries.into_iter().map(|e| (key(&e), e)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let start = match &self.after {
            Some(after) => keyed.partition_point(|(k, _)| k.as_str() <= after.as_str()),
            None => 0,
        };
        let mut rest = keyed.split_off(start);
        let more = rest.len() > self.limit;
        rest.truncate(self.limit);
        let next = rest.last().filter(|_| more).map(|(last, _)| self.link(last));
        Page {
            entries: rest.into_iter().map(|(_, e)| e).collect(),
            next,
        }
    }

    /// The link to the page after `last`.
    fn link(&self, last: &str) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.extend_pairs(&self.rest);
        query.append_pair("limit", &self.limit.to_string());
        // A cursor's form: the key's bytes in hexadecimal (safe in a URL as it is).
        query.append_pair("cursor", &crate::ids::hex(last.as_bytes()));
        format!("<{}?{}>; rel=\"next\"", self.path, query.finish())
    }
}

/// One page of a list: its entries, and the link to the next page if more follow.
pub struct Page<T> {
    pub entries: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// The same page with each entry turned into another.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            entries: self.entries.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

/// `body` (which holds a page's entries) with the page's `Link` header to `next`, if any.
pub fn with_link(next: Option<String>, body: impl IntoResponse) -> Response {
    let mut response = body.into_response();
    if let Some(value) = next.and_then(|link| HeaderValue::from_str(&link).ok()) {
        response.headers_mut().insert(header::LINK, value);
    }
    response
}

impl<T: Serialize> IntoResponse for Page<T> {
    fn into_response(self) -> Response {
        with_link(self.next, crate::http::json::Json(self.entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:03}")).collect()
    }

    fn cursor_of(link: &str) -> String {
        let query = link.split_once('?').unwrap().1.split_once('>').unwrap().0;
        let (_, cursor) = form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| name == "cursor")
            .unwrap();
        cursor.into_owned()
    }

    #[test]
    fn following_the_links_sees_each_entry_once_in_order() {
        let mut seen = Vec::new();
        let mut query = "limit=7&prefix=a".to_string();
        loop {
            let paging = Paging::parse("/v1/x", &query, 1000, 10_000).unwrap();
            let page = paging.page(names(30), |n| n.clone());
            seen.extend(page.entries);
            let Some(link) = page.next else { break };
            assert!(link.starts_with("</v1/x?prefix=a&limit=7&cursor="), "{link}");
            query = format!("limit=7&prefix=a&cursor={}", cursor_of(&link));
        }
        assert_eq!(seen, names(30));
    }

    #[test]
    fn an_entry_added_or_removed_between_pages_moves_no_other() {
        let first = Paging::parse("/v1/x", "limit=10", 1000, 10_000)
            .unwrap()
            .page(names(30), |n| n.clone());
        let cursor = cursor_of(first.next.as_deref().unwrap());
        // Meanwhile n002 goes, n0055 comes (before the cursor), n0155 comes (after it).
        let mut now: Vec<String> = names(30).into_iter().filter(|n| n != "n002").collect();
        now.extend(["n0055".to_string(), "n0155".to_string()]);
        let second = Paging::parse("/v1/x", &format!("limit=10&cursor={cursor}"), 1000, 10_000)
            .unwrap()
            .page(now, |n| n.clone());
        assert_eq!(second.entries.first().map(String::as_str), Some("n010"));
        assert!(second.entries.contains(&"n0155".to_string()));
        assert!(!second.entries.contains(&"n0055".to_string()));
    }

    #[test]
    fn bad_limits_and_cursors_are_refused() {
        for query in [
            "limit=0",
            "limit=10001",
            "limit=x",
            "cursor=***",
            "cursor=abc",
            "cursor=%FF%FE",
        ] {
            assert!(Paging::parse("/v1/x", query, 1000, 10_000).is_err(), "{query}");
        }
        let last = Paging::parse("/v1/x", "limit=30", 1000, 10_000)
            .unwrap()
            .page(names(30), |n| n.clone());
        assert!(last.next.is_none(), "no link after the last page");
    }
}
