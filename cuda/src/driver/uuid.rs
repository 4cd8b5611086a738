//! GPU UUIDs in NVIDIA's text form, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ffi::CuUuid;

/// A GPU UUID (`CUuuid`). Serialised as its `GPU-…` string, the form
/// `nvidia-smi -L`, CDI and `cuda-checkpoint --device-map` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuUuid(pub [u8; 16]);

impl GpuUuid {
    pub(crate) fn to_ffi(self) -> CuUuid {
        CuUuid { bytes: self.0 }
    }
}

impl From<CuUuid> for GpuUuid {
    fn from(raw: CuUuid) -> Self {
        Self(raw.bytes)
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-\
             {:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[0],
            b[1],
            b[2],
            b[3],
            b[4],
            b[5],
            b[6],
            b[7],
            b[8],
            b[9],
            b[10],
            b[11],
            b[12],
            b[13],
            b[14],
            b[15]
        )
    }
}

/// Why a UUID string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a GPU UUID (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
pub struct ParseUuidError {
    pub input: String,
}

impl FromStr for GpuUuid {
    type Err = ParseUuidError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = || ParseUuidError {
            input: input.to_owned(),
        };
        let hex = input.strip_prefix("GPU-").ok_or_else(err)?;
        let groups: Vec<&str> = hex.split('-').collect();
        let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lengths != [8, 4, 4, 4, 12] {
            return Err(err());
        }
        let digits: String = groups.concat();
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(Self(bytes))
    }
}

impl Serialize for GpuUuid {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuUuid {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Restore a process checkpointed on `old` onto `new` (`CUcheckpointGpuPair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuRemap {
    pub old: GpuUuid,
    pub new: GpuUuid,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "GPU-a1b2c3d4-0000-4000-8000-00000000000f";

    #[test]
    fn round_trips_text() {
        let uuid: GpuUuid = TEXT.parse().expect("parses");
        assert_eq!(uuid.0[0], 0xa1);
        assert_eq!(uuid.0[15], 0x0f);
        assert_eq!(uuid.to_string(), TEXT);
        assert_eq!(serde_json::to_string(&uuid).unwrap(), format!("\"{TEXT}\""));
        let back: GpuUuid = serde_json::from_str(&format!("\"{TEXT}\"")).unwrap();
        assert_eq!(back, uuid);
    }

    #[test]
    fn accepts_upper_case_hex() {
        let uuid: GpuUuid = "GPU-A1B2C3D4-0000-4000-8000-00000000000F".parse().unwrap();
        assert_eq!(uuid.to_string(), TEXT);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "a1b2c3d4-0000-4000-8000-00000000000f",
            "GPU-a1b2c3d4-0000-4000-8000-00000000000",
            "GPU-a1b2c3d40000-4000-8000-00000000000f",
            "GPU-z1b2c3d4-0000-4000-8000-00000000000f",
            "MIG-a1b2c3d4-0000-4000-8000-00000000000f",
        ] {
            assert!(bad.parse::<GpuUuid>().is_err(), "{bad}");
        }
    }
}
