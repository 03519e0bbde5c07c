//! The ids zkgate hands out (leases, handles, claims) and what they tell.
//!
//! Every id an instance issues is `<8 hex>-<32 hex>`: the id of the instance that issued it,
//! then 128 random bits. A lease moves between instances, so its prefix says only where it was
//! made; a handle's says which instance served the request that made it. A handle's random
//! part is also the GUID in the name of its znode ([guid_of]), and a claim's id ends with its
//! item's name ([claim_id]), so that any instance finds a handle's or a claim's znode from its
//! id alone.

/// A new instance id: 8 lowercase hex digits, random.
pub fn new_instance_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// A new id owned by `instance`: `<instance>-<32 hex>`.
pub fn owned_id(instance: &str) -> String {
    format!("{instance}-{}", uuid::Uuid::new_v4().simple())
}

/// The GUID in the znode names of the handle `id` (Curator's `_c_<guid>-lock-<seq>`): its
/// random part, written as a UUID (`None` if `id` is not one of ours).
pub fn guid_of(id: &str) -> Option<String> {
    owner_of(id)?;
    let (_, random) = id.split_once('-')?;
    let bytes: [u8; 16] = unhex(random)?.try_into().ok()?;
    Some(uuid::Uuid::from_bytes(bytes).hyphenated().to_string())
}

/// The instance that issued a lease id, handle or claim (`None` if it is not one of ours).
pub fn owner_of(id: &str) -> Option<&str> {
    let (instance, rest) = id.split_once('-')?;
    let hex_of = |s: &str, n: usize| s.len() == n && is_hex(s);
    (hex_of(instance, 8) && hex_of(rest, 32)).then_some(instance)
}

/// A new claim id for `item`, issued by `instance`: `<instance>-<32 hex>.<item's name in
/// hex>`.
pub fn claim_id(instance: &str, item: &str) -> String {
    format!("{}.{}", owned_id(instance), hex(item.as_bytes()))
}

/// The name of the item the claim `id` claims (`None` if `id` is not a claim id of ours).
/// Only a name an item can have: printable ASCII without `/`, not `.` or `..` (queue items,
/// zkgate's and its peers', are named so; anything else, a NUL say, is no znode name at all).
pub fn claimed_item(id: &str) -> Option<String> {
    let (owned, item) = id.split_once('.')?;
    owner_of(owned)?;
    let item = String::from_utf8(unhex(item)?).ok()?;
    let printable = item.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    (printable && !matches!(item.as_str(), "" | "." | "..")).then_some(item)
}

/// `bytes` in lowercase hexadecimal, the form of every id, token, hash and cursor zkgate writes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `text` is lowercase hexadecimal digits only.
pub fn is_hex(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The bytes [hex] wrote as `text` (`None` if it is not lowercase hexadecimal of whole bytes).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !is_hex(text) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_reads_back_what_it_wrote_and_nothing_else() {
        let bytes = [0u8, 1, 0x7f, 0xab, 0xff];
        assert_eq!(hex(&bytes), "00017fabff");
        assert_eq!(unhex(&hex(&bytes)).as_deref(), Some(&bytes[..]));
        for bad in ["0", "abc", "AB", "zz", "0x"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_name_their_instance() {
        let instance = new_instance_id();
        let id = owned_id(&instance);
        assert_eq!(owner_of(&id), Some(instance.as_str()));
        assert_eq!(owner_of("6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"), None);
        assert_eq!(owner_of("zzzzzzzz-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"), None);
        assert_eq!(owner_of("0123abcd-short"), None);
    }

    #[test]
    fn a_claim_names_its_item() {
        let id = claim_id("0123abcd", "queue-05|18c3a2b|0000000012");
        assert_eq!(claimed_item(&id).as_deref(), Some("queue-05|18c3a2b|0000000012"));
        assert_eq!(claimed_item(&owned_id("0123abcd")), None, "a claim id of before");
        assert_eq!(claimed_item("0123abcd-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b."), None);
        assert_eq!(claimed_item("0123abcd-6f1c.71756575"), None);
        assert_eq!(claimed_item("0123abcd-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b.7g"), None);
        // Hex of what no znode may be named (schemathesis sent a NUL: ZooKeeper refused the
        // path and the ack answered 500).
        for name in ["\0", "a/b", ".", "..", "caf\u{e9}", "tab\there"] {
            assert_eq!(claimed_item(&claim_id("0123abcd", name)), None, "{name:?}");
        }
    }

    #[test]
    fn a_handle_names_the_guid_of_its_znode() {
        let id = "0123abcd-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b";
        assert_eq!(guid_of(id).as_deref(), Some("6f1c2a9e-0b7d-4e3f-8a5b-6c7d8e9f0a1b"));
        assert_eq!(guid_of("6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"), None);
    }
}
