//! Byte sizes written as integers or with binary suffixes (`64MiB`, `64Mi`).

use std::fmt;

use serde::de::{self, Visitor};
use serde::Deserializer;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Why a text is not a byte size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("{text:?} is not a byte size (e.g. 67108864 or 64MiB)")]
    NotANumber { text: String },
    #[error("{text:?} uses a decimal or ambiguous unit; use KiB, MiB or GiB")]
    AmbiguousUnit { text: String },
    #[error("{text:?} has unknown unit {unit:?}; use KiB, MiB or GiB")]
    UnknownUnit { text: String, unit: String },
    #[error("{text:?} is too large")]
    TooLarge { text: String },
}

/// Parses `67108864`, `65536KiB`, `64MiB`, `64Mi`, `1GiB`. Decimal units (`MB`) are refused
/// rather than guessed: 64 MB and 64 MiB differ by 5%, enough to break a 4096 alignment.
pub fn parse_bytes(text: &str) -> Result<u64, ByteSizeError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| ByteSizeError::NotANumber {
        text: text.to_owned(),
    })?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "Ki" => KIB,
        "MiB" | "Mi" => MIB,
        "GiB" | "Gi" => GIB,
        "K" | "KB" | "k" | "kB" | "M" | "MB" | "G" | "GB" => {
            return Err(ByteSizeError::AmbiguousUnit {
                text: text.to_owned(),
            })
        }
        other => {
            return Err(ByteSizeError::UnknownUnit {
                text: text.to_owned(),
                unit: other.to_owned(),
            })
        }
    };
    n.checked_mul(mult).ok_or_else(|| ByteSizeError::TooLarge {
        text: text.to_owned(),
    })
}

/// `67108864 (64 MiB)`, for error messages.
pub fn describe(bytes: u64) -> String {
    let human = if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        return bytes.to_string();
    };
    format!("{bytes} ({human})")
}

/// serde helper: an integer or a suffixed string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte count such as 67108864 or \"64MiB\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_bytes(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 * MIB);
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 * MIB);
        assert_eq!(parse_bytes(" 1GiB ").unwrap(), GIB);
        assert_eq!(parse_bytes("512KiB").unwrap(), 512 * KIB);
        assert!(parse_bytes("64MB")
            .unwrap_err()
            .to_string()
            .contains("use KiB, MiB or GiB"));
        assert!(parse_bytes("64 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999999GiB")
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }

    #[test]
    fn describes() {
        assert_eq!(describe(64 * MIB), "67108864 (64 MiB)");
        assert_eq!(describe(GIB), "1073741824 (1 GiB)");
        assert_eq!(describe(1000), "1000");
    }
}
