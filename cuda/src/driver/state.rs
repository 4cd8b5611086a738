//! `CUprocessState`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The driver's view of a CUDA process. Open-ended: drivers newer than this
/// code may report states it does not know, kept as `Unknown(value)`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING`: CUDA calls proceed.
    Running,
    /// `CU_PROCESS_STATE_LOCKED`: new CUDA calls block.
    Locked,
    /// `CU_PROCESS_STATE_CHECKPOINTED`: device memory saved, GPU resources released.
    Checkpointed,
    /// `CU_PROCESS_STATE_FAILED`: an uncorrectable error during checkpoint or restore.
    Failed,
    /// `CU_PROCESS_STATE_CHECKPOINTING` (13.4): CustomStorage mapping outstanding.
    Checkpointing,
    /// `CU_PROCESS_STATE_RESTORING` (13.4): CustomStorage mapping outstanding.
    Restoring,
    /// A value this build does not know.
    Unknown(u32),
}

impl ProcessState {
    pub fn from_raw(value: u32) -> Self {
        match value {
            0 => Self::Running,
            1 => Self::Locked,
            2 => Self::Checkpointed,
            3 => Self::Failed,
            4 => Self::Checkpointing,
            5 => Self::Restoring,
            other => Self::Unknown(other),
        }
    }

    pub fn as_raw(self) -> u32 {
        match self {
            Self::Running => 0,
            Self::Locked => 1,
            Self::Checkpointed => 2,
            Self::Failed => 3,
            Self::Checkpointing => 4,
            Self::Restoring => 5,
            Self::Unknown(other) => other,
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Running => f.write_str("running"),
            Self::Locked => f.write_str("locked"),
            Self::Checkpointed => f.write_str("checkpointed"),
            Self::Failed => f.write_str("failed"),
            Self::Checkpointing => f.write_str("checkpointing"),
            Self::Restoring => f.write_str("restoring"),
            Self::Unknown(v) => write!(f, "unknown state {v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_stay_open() {
        for raw in 0..8 {
            assert_eq!(ProcessState::from_raw(raw).as_raw(), raw);
        }
        assert_eq!(ProcessState::from_raw(2), ProcessState::Checkpointed);
        assert_eq!(ProcessState::from_raw(7), ProcessState::Unknown(7));
        assert_eq!(ProcessState::Unknown(7).to_string(), "unknown state 7");
    }
}
