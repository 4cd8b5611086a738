//! Which GPU each checkpointed GPU is restored onto.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::driver::{DeviceInfo, GpuRemap, GpuUuid, ParseUuidError};

/// Old GPU → new GPU. Empty means "the same GPUs" (the driver gets a NULL
/// `gpuPairs`, valid on every driver). GPUs the map does not mention stay
/// where they were.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuMap(BTreeMap<GpuUuid, GpuUuid>);

impl GpuMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, old: GpuUuid, new: GpuUuid) -> &mut Self {
        self.0.insert(old, new);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&GpuUuid, &GpuUuid)> {
        self.0.iter()
    }

    /// The pairs for one process. The driver wants every checkpointed GPU
    /// covered, so each of `checkpointed` maps to its target or to itself.
    /// When the process's GPUs are unknown, the map's own pairs are used.
    pub fn remap_for(&self, checkpointed: &[DeviceInfo]) -> Vec<GpuRemap> {
        if self.0.is_empty() {
            return Vec::new();
        }
        if checkpointed.is_empty() {
            return self
                .0
                .iter()
                .map(|(&old, &new)| GpuRemap { old, new })
                .collect();
        }
        checkpointed
            .iter()
            .map(|d| GpuRemap {
                old: d.uuid,
                new: self.0.get(&d.uuid).copied().unwrap_or(d.uuid),
            })
            .collect()
    }
}

impl fmt::Display for GpuMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (old, new)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{old}={new}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseGpuMapError {
    #[error("GPU map entry `{0}` is not OLD=NEW (for example GPU-…=GPU-…)")]
    Entry(String),
    #[error(transparent)]
    Uuid(#[from] ParseUuidError),
    #[error("GPU map lists {0} twice")]
    Duplicate(GpuUuid),
}

/// `cuda-checkpoint --device-map` syntax: `GPU-a=GPU-b,GPU-c=GPU-d`.
impl FromStr for GpuMap {
    type Err = ParseGpuMapError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut map = GpuMap::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (old, new) = entry
                .split_once('=')
                .ok_or_else(|| ParseGpuMapError::Entry(entry.into()))?;
            let old: GpuUuid = old.trim().parse()?;
            if map.0.insert(old, new.trim().parse()?).is_some() {
                return Err(ParseGpuMapError::Duplicate(old));
            }
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-00000000-0000-4000-8000-00000000000a";
    const B: &str = "GPU-00000000-0000-4000-8000-00000000000b";
    const C: &str = "GPU-00000000-0000-4000-8000-00000000000c";

    fn dev(uuid: &str) -> DeviceInfo {
        DeviceInfo {
            index: 0,
            uuid: uuid.parse().unwrap(),
            name: "x".into(),
            total_memory_bytes: 0,
        }
    }

    #[test]
    fn empty_map_means_same_gpus() {
        assert!(GpuMap::new().remap_for(&[dev(A)]).is_empty());
    }

    #[test]
    fn unmapped_gpus_map_to_themselves() {
        let map: GpuMap = format!("{A}={C}").parse().unwrap();
        let pairs = map.remap_for(&[dev(A), dev(B)]);
        let text: Vec<String> = pairs
            .iter()
            .map(|p| format!("{}>{}", p.old, p.new))
            .collect();
        assert_eq!(text, vec![format!("{A}>{C}"), format!("{B}>{B}")]);
    }

    #[test]
    fn unknown_gpus_use_the_map_verbatim() {
        let map: GpuMap = format!("{A}={C}").parse().unwrap();
        let pairs = map.remap_for(&[]);
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].new.to_string(), C);
    }

    #[test]
    fn parses_and_prints_device_map_syntax() {
        let text = format!("{A}={B}, {B}={A}");
        let map: GpuMap = text.parse().unwrap();
        assert_eq!(map.to_string(), format!("{A}={B},{B}={A}"));
        assert!(matches!(
            A.parse::<GpuMap>(),
            Err(ParseGpuMapError::Entry(_))
        ));
        assert!(matches!(
            format!("{A}={B},{A}={C}").parse::<GpuMap>(),
            Err(ParseGpuMapError::Duplicate(_))
        ));
        assert!("".parse::<GpuMap>().unwrap().is_empty());
    }
}
