//! hyper's own answers as problems. A request whose head hyper cannot parse never reaches the
//! app: hyper answers it itself (400 for a malformed head, 414 for a URI over 65,534 bytes,
//! 431 for a head over its buffer or with too many fields) with an empty body, and closes the
//! connection. Every other refusal of zkgate's is a problem document, so such an answer is
//! rewritten into one on its way out ([EarlyAnswer] renders the body).
//!
//! Only the connection's first bytes are looked at: there an answer can only be a response's
//! head, so a head of hyper's shape (`HTTP/1.1 4xx`, `content-length: 0`, no content type,
//! nothing after it) is surely hyper's own. Later on a kept-alive connection a write may begin
//! anywhere (a value that only looks like such a head, in a body written in several parts),
//! so nothing after the first answer is touched: the app's own bounds on a request's URI and
//! head (`crate::http::limits::request_head`), well below hyper's, answer those requests with
//! problems themselves.

use std::io;
use std::task::Poll;

/// The problem document (JSON) that answers status `status` given before routing, if it is
/// one zkgate names.
pub type EarlyAnswer = fn(status: u16) -> Option<Vec<u8>>;

/// Longest head of hyper's that is looked at (its own are under 200 bytes).
const MAX_HEAD: usize = 512;

/// What becomes of a connection's first answer: rewritten if hyper made it.
pub(super) enum First {
    /// Nothing written yet.
    Ahead(EarlyAnswer),
    /// Writing `bytes` in place of hyper's head of `replaced` bytes; `written` so far.
    Replacing {
        bytes: Vec<u8>,
        written: usize,
        replaced: usize,
    },
    /// Past the first answer: every write as it comes.
    Through,
}

impl First {
    /// Writes `buf` with `write` (the connection's own), in its place a problem if it is
    /// hyper's own first answer; hyper's head counts as written once the whole replacement is.
    pub(super) fn poll_write(
        &mut self,
        buf: &[u8],
        mut write: impl FnMut(&[u8]) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if let First::Ahead(answer) = *self {
            *self = match hypers_own(buf).and_then(answer) {
                Some(body) => First::Replacing {
                    bytes: replacement(buf, &body),
                    written: 0,
                    replaced: buf.len(),
                },
                None => First::Through,
            };
        }
        let First::Replacing {
            bytes,
            written,
            replaced,
        } = self
        else {
            return write(buf);
        };
        while *written < bytes.len() {
            match write(&bytes[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                other => return other,
            }
        }
        let replaced = *replaced;
        *self = First::Through;
        Poll::Ready(Ok(replaced))
    }

    /// Whether the first answer may still be on its way (a write of several parts is not).
    pub(super) fn pending(&self) -> bool {
        !matches!(self, First::Through)
    }
}

/// The status of `head` if it is an answer hyper wrote itself: a whole HTTP/1.1 head of a
/// client error, with an empty body and no content type.
fn hypers_own(head: &[u8]) -> Option<u16> {
    if head.len() > MAX_HEAD || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?.to_ascii_lowercase();
    let status: u16 = text.strip_prefix("http/1.1 ")?.get(..3)?.parse().ok()?;
    let empty = text.contains("\r\ncontent-length: 0\r\n") && !text.contains("\r\ncontent-type:");
    ((400..500).contains(&status) && empty && text.matches("\r\n\r\n").count() == 1).then_some(status)
}

/// The response that replaces hyper's head `head` of `status`: the same status line, the
/// problem, and `connection: close` (hyper closes the connection after it).
fn replacement(head: &[u8], body: &[u8]) -> Vec<u8> {
    let status_line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut bytes = Vec::with_capacity(status_line.len() + body.len() + 128);
    bytes.extend_from_slice(status_line);
    bytes.extend_from_slice(b"\r\ncontent-type: application/problem+json\r\nconnection: close\r\n");
    bytes.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    bytes.extend_from_slice(body);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYPERS: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 12:00:00 GMT\r\n\r\n";

    #[test]
    fn only_a_whole_empty_client_error_head_is_hypers() {
        assert_eq!(hypers_own(HYPERS), Some(431));
        assert_eq!(hypers_own(&HYPERS.to_ascii_lowercase()), Some(431));
        // zkgate's own answers carry a content type, a body, or are not client errors.
        let typed = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hypers_own(typed), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(hypers_own(with_body), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hypers_own(ok), None);
        let two = [HYPERS, HYPERS].concat();
        assert_eq!(hypers_own(&two), None);
        assert_eq!(hypers_own(&HYPERS[..HYPERS.len() - 2]), None);
    }

    #[test]
    fn the_replacement_keeps_the_status_line_and_carries_the_problem() {
        let body = br#"{"status":431}"#;
        let text = String::from_utf8(replacement(HYPERS, body)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{text}"
        );
        assert!(text.contains("content-type: application/problem+json\r\n"), "{text}");
        assert!(text.contains("connection: close\r\n"), "{text}");
        assert!(text.ends_with("content-length: 14\r\n\r\n{\"status\":431}"), "{text}");
    }
}
