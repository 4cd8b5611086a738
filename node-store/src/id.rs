use std::fmt;

use crate::error::StoreError;

/// A blob's digest, accepted only in the one form the store names files by: `sha256:` followed
/// by exactly 64 lowercase hex digits. Everything else (other algorithms, upper case, `/`, `..`,
/// NUL, trailing bytes) is refused before it comes near a path.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlobId(String);

const PREFIX: &str = "sha256:";

impl BlobId {
    pub fn parse(digest: &str) -> Result<BlobId, StoreError> {
        let bad = |reason| StoreError::InvalidDigest {
            digest: digest.chars().take(100).collect(),
            reason,
        };
        let hex = digest
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("only sha256: digests are stored"))?;
        if hex.len() != 64 {
            return Err(bad("a sha256 digest has exactly 64 hex digits"));
        }
        if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("the hex digits must be 0-9 and a-f (lower case)"));
        }
        Ok(BlobId(digest.to_owned()))
    }

    /// The id of the sha256 `hash` (32 bytes).
    pub(crate) fn from_hash(hash: &[u8]) -> BlobId {
        let mut s = String::with_capacity(PREFIX.len() + 64);
        s.push_str(PREFIX);
        for b in hash {
            s.push_str(&format!("{b:02x}"));
        }
        BlobId(s)
    }

    /// The 64 hex digits: the blob's file name.
    pub fn hex(&self) -> &str {
        &self.0[PREFIX.len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A file name under `blobs/` or `locks/` back to its id, when it is one.
    pub(crate) fn from_file_name(name: &[u8]) -> Option<BlobId> {
        let name = std::str::from_utf8(name).ok()?;
        BlobId::parse(&format!("{PREFIX}{name}")).ok()
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for BlobId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for BlobId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        BlobId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_digests_are_refused() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(BlobId::parse(&good).unwrap().hex(), "ab".repeat(32));
        for bad in [
            String::new(),
            "sha256:".into(),
            format!("sha512:{}", "ab".repeat(64)),
            format!("SHA256:{}", "ab".repeat(32)),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha256:{}", "ab".repeat(31)),
            format!("sha256:{}a", "ab".repeat(32)),
            format!("sha256:../{}", "ab".repeat(31)),
            format!("sha256:{}/", "ab".repeat(32)),
            format!("sha256:{}\0", "ab".repeat(32)),
            format!("sha256:{}..", "ab".repeat(31)),
            format!("sha256:/{}", &"ab".repeat(32)[1..]),
            format!(" sha256:{}", "ab".repeat(32)),
            format!("sha256:{}g", &"ab".repeat(32)[1..]),
        ] {
            assert!(BlobId::parse(&bad).is_err(), "{bad:?} accepted");
        }
        assert!(BlobId::from_file_name(b"..").is_none());
        assert!(BlobId::from_file_name("ab".repeat(32).as_bytes()).is_some());
    }
}
