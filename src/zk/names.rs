//! Validation of user-supplied names (lock names, ...) before they become znode path segments.
//!
//! A name arrives as one URL path segment, already percent-decoded by the router, so `a%2Fb`
//! shows up here as `a/b` and is refused. Everything refused here never reaches ZooKeeper.

/// Longest name accepted, in bytes of UTF-8. Far below ZooKeeper's own limits; it keeps paths,
/// listings and dashboards readable.
pub const MAX_NAME_BYTES: usize = 128;

/// Why a name was refused; the text is shown to the user in the problem document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {MAX_NAME_BYTES} bytes long, got {0}")]
    TooLong(usize),
    #[error("must not be `.` or `..`")]
    Dots,
    #[error("must not contain `/`")]
    Slash,
    #[error("must not contain control characters (found U+{0:04X})")]
    Control(u32),
    #[error("must not contain U+{0:04X}, which ZooKeeper does not allow in paths")]
    Reserved(u32),
}

/// Checks that `name` is a safe single znode name.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong(name.len()));
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots);
    }
    for c in name.chars() {
        let code = c as u32;
        if c == '/' {
            return Err(NameError::Slash);
        }
        if c.is_control() {
            return Err(NameError::Control(code));
        }
        // ZooKeeper's PathUtils rejects these ranges (private use area and specials), and,
        // since it checks Java's UTF-16 code units, every character beyond U+FFFF (written as
        // a surrogate pair, which it refuses as U+D800..U+DFFF).
        if (0xE000..=0xF8FF).contains(&code) || (0xFFF0..=0xFFFF).contains(&code) || code > 0xFFFF {
            return Err(NameError::Reserved(code));
        }
    }
    Ok(())
}

/// Checks a root path given on the command line: absolute, no trailing slash, valid segments.
pub fn validate_root(root: &str) -> Result<(), String> {
    let Some(rest) = root.strip_prefix('/') else {
        return Err(format!("root path `{root}` must start with `/`"));
    };
    if rest.is_empty() {
        return Err("root path must not be `/` itself: zkgate needs a znode of its own".into());
    }
    for segment in rest.split('/') {
        validate_name(segment).map_err(|e| format!("root path `{root}`: segment `{segment}` {e}"))?;
    }
    if rest.split('/').next() == Some("zookeeper") {
        return Err("root path must not be under `/zookeeper`, which the server reserves".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for name in [
            "orders",
            "a.b-c_d",
            "ünïcødé",
            "x".repeat(MAX_NAME_BYTES).as_str(),
            "...",
        ] {
            assert_eq!(validate_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn refuses_unsafe_names() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name(".."), Err(NameError::Dots));
        assert_eq!(validate_name("."), Err(NameError::Dots));
        assert_eq!(validate_name("a/b"), Err(NameError::Slash));
        assert_eq!(validate_name("a\nb"), Err(NameError::Control(10)));
        assert_eq!(validate_name("a\u{0}b"), Err(NameError::Control(0)));
        assert_eq!(validate_name("\u{E000}"), Err(NameError::Reserved(0xE000)));
        // Found by schemathesis: ZooKeeper refused these with "bad arguments" (a 500).
        assert_eq!(validate_name("L\u{3F59B}"), Err(NameError::Reserved(0x3F59B)));
        assert_eq!(validate_name("smile\u{1F600}"), Err(NameError::Reserved(0x1F600)));
        assert_eq!(validate_name("caf\u{E9}-\u{4E2D}"), Ok(()));
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(validate_name(&long), Err(NameError::TooLong(MAX_NAME_BYTES + 1)));
    }

    #[test]
    fn roots() {
        assert!(validate_root("/zkgate").is_ok());
        assert!(validate_root("/apps/zkgate").is_ok());
        assert!(validate_root("zkgate").is_err());
        assert!(validate_root("/").is_err());
        assert!(validate_root("/a//b").is_err());
        assert!(validate_root("/zkgate/").is_err());
        assert!(validate_root("/zookeeper/x").is_err());
    }
}
