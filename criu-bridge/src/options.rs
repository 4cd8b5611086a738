//! The CRIU flags of a checkpoint or a restore, in one place.
//!
//! [`CriuFlags`] is the only type that knows runc's spelling of CRIU's permissions
//! (`--tcp-established`, `--ext-unix-sk`, ...). Front ends convert their own requests into it
//! (containerd's `CheckpointOptions` proto, runc's command line) and everything else — the
//! runc command lines, the manifest, `gpusnap inspect` — reads it. Adding a CRIU switch is one
//! field here, one entry in [`CriuFlags::switches`], and one line in each front end's converter.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Errors found while validating flags or ids, before anything is run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("unknown cgroups mode {value:?}: valid modes are {}", CgroupsMode::NAMES.join(", "))]
    UnknownCgroupsMode { value: String },
    #[error(
        "namespace {value:?} cannot be restored empty: runc supports --empty-ns only for {}",
        SUPPORTED_EMPTY_NAMESPACES.join(", ")
    )]
    UnsupportedEmptyNamespace { value: String },
    #[error("{field} must be an absolute path, got {path:?}")]
    RelativePath {
        field: &'static str,
        path: std::path::PathBuf,
    },
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error(
        "container id {id:?} is not valid for runc: use letters, digits, '_', '+', '-' and '.', \
         not starting with '.' or '-'"
    )]
    InvalidContainerId { id: String },
    #[error("unknown CRIU flag {value:?}: valid flags are {}", CriuFlags::SWITCH_NAMES.join(", "))]
    UnknownFlag { value: String },
}

/// runc's `--manage-cgroups-mode` values (runc `checkpoint.go`, `criuOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupsMode {
    Soft,
    Full,
    Strict,
    Ignore,
}

impl CgroupsMode {
    /// Valid spellings, in the order runc documents them.
    pub const NAMES: [&'static str; 4] = ["soft", "full", "strict", "ignore"];

    pub fn as_str(self) -> &'static str {
        match self {
            CgroupsMode::Soft => "soft",
            CgroupsMode::Full => "full",
            CgroupsMode::Strict => "strict",
            CgroupsMode::Ignore => "ignore",
        }
    }

    /// Parses a free-form string where empty means "not set" (runc then uses soft).
    pub fn parse_optional(value: &str) -> Result<Option<Self>, OptionsError> {
        if value.is_empty() {
            Ok(None)
        } else {
            value.parse().map(Some)
        }
    }
}

impl FromStr for CgroupsMode {
    type Err = OptionsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "soft" => Ok(CgroupsMode::Soft),
            "full" => Ok(CgroupsMode::Full),
            "strict" => Ok(CgroupsMode::Strict),
            "ignore" => Ok(CgroupsMode::Ignore),
            other => Err(OptionsError::UnknownCgroupsMode {
                value: other.to_owned(),
            }),
        }
    }
}

impl fmt::Display for CgroupsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Namespaces runc accepts for `--empty-ns`. runc's own table has only the network namespace
/// (runc `checkpoint.go`); the rest are refused up front so the error names the bad value.
pub const SUPPORTED_EMPTY_NAMESPACES: [&str; 1] = ["network"];

/// CRIU's permissions and modes as runc spells them, shared by `runc checkpoint` and
/// `runc restore`. `Default` grants nothing: what containerd's CRI asks for, and what
/// containerd-shim-runc-v2 passes to every restore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriuFlags {
    /// `--tcp-established`: established TCP connections.
    pub tcp_established: bool,
    /// `--ext-unix-sk`: unix sockets connected outside the container.
    pub ext_unix_sk: bool,
    /// `--shell-job`: the container's terminal.
    pub shell_job: bool,
    /// `--file-locks`: file locks.
    pub file_locks: bool,
    /// Repeated `--empty-ns`.
    pub empty_ns: Vec<String>,
    /// `--manage-cgroups-mode`; `None` lets runc pick (soft).
    pub manage_cgroups_mode: Option<CgroupsMode>,
}

impl CriuFlags {
    /// The boolean switches by runc's name, in go-runc's order.
    pub const SWITCH_NAMES: [&'static str; 4] =
        ["tcp-established", "ext-unix-sk", "shell-job", "file-locks"];

    /// Every boolean switch with its state, in [`Self::SWITCH_NAMES`] order.
    pub fn switches(&self) -> [(&'static str, bool); 4] {
        [
            ("tcp-established", self.tcp_established),
            ("ext-unix-sk", self.ext_unix_sk),
            ("shell-job", self.shell_job),
            ("file-locks", self.file_locks),
        ]
    }

    /// Turns the switch runc calls `name` on.
    pub fn enable(&mut self, name: &str) -> Result<(), OptionsError> {
        let slot = match name {
            "tcp-established" => &mut self.tcp_established,
            "ext-unix-sk" => &mut self.ext_unix_sk,
            "shell-job" => &mut self.shell_job,
            "file-locks" => &mut self.file_locks,
            other => {
                return Err(OptionsError::UnknownFlag {
                    value: other.to_owned(),
                })
            }
        };
        *slot = true;
        Ok(())
    }

    /// Flags from runc switch names (`["tcp-established", ...]`).
    pub fn from_switch_names<S: AsRef<str>>(names: &[S]) -> Result<Self, OptionsError> {
        let mut flags = CriuFlags::default();
        for n in names {
            flags.enable(n.as_ref())?;
        }
        Ok(flags)
    }

    /// Checks everything that can be checked without touching the host.
    pub fn validate(&self) -> Result<(), OptionsError> {
        for ns in &self.empty_ns {
            if !SUPPORTED_EMPTY_NAMESPACES.contains(&ns.as_str()) {
                return Err(OptionsError::UnsupportedEmptyNamespace { value: ns.clone() });
            }
        }
        Ok(())
    }

    /// The command-line form, as runc takes it.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .switches()
            .iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| format!("--{name}"))
            .collect();
        if let Some(mode) = self.manage_cgroups_mode {
            args.push("--manage-cgroups-mode".into());
            args.push(mode.as_str().into());
        }
        for ns in &self.empty_ns {
            args.push("--empty-ns".into());
            args.push(ns.clone());
        }
        args
    }

    /// The switches turned on here and not in `granted`.
    pub fn not_granted_by(&self, granted: &CriuFlags) -> Vec<&'static str> {
        self.switches()
            .iter()
            .zip(granted.switches())
            .filter(|((_, want), (_, have))| *want && !*have)
            .map(|((name, _), _)| *name)
            .collect()
    }
}

impl fmt::Display for CriuFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = self.to_args();
        if args.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&args.join(" "))
        }
    }
}

/// Whether `id` can name one entry of a directory of ours (a record's file, runc's state
/// directory of the container, CRI's directory of it): not empty, no `/` or NUL, not hidden (so
/// never `.` or `..`). The one rule for every place that joins an id to a path; looser than
/// runc's own ([`validate_container_id`]), which ids of other runtimes need not follow.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty() && !id.contains('/') && !id.contains('\0') && !id.starts_with('.')
}

/// runc's container id rule (libcontainer `validateID`): `^[\w+-\.]+$`, and not `.`/`..`.
/// A leading `-` is refused too, so an id can never be parsed as a flag.
pub fn validate_container_id(id: &str) -> Result<(), OptionsError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.');
    let valid = !id.is_empty()
        && id.chars().all(ok_char)
        && !id.starts_with('-')
        && id != "."
        && id != "..";
    if valid {
        Ok(())
    } else {
        Err(OptionsError::InvalidContainerId { id: id.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grants_nothing() {
        let f = CriuFlags::default();
        assert!(f.to_args().is_empty());
        assert_eq!(f.to_string(), "none");
        f.validate().unwrap();
    }

    #[test]
    fn args_in_go_runc_order() {
        let f = CriuFlags {
            tcp_established: true,
            ext_unix_sk: true,
            shell_job: true,
            file_locks: true,
            empty_ns: vec!["network".into()],
            manage_cgroups_mode: Some(CgroupsMode::Soft),
        };
        assert_eq!(
            f.to_args(),
            [
                "--tcp-established",
                "--ext-unix-sk",
                "--shell-job",
                "--file-locks",
                "--manage-cgroups-mode",
                "soft",
                "--empty-ns",
                "network"
            ]
        );
    }

    #[test]
    fn switch_names_round_trip_and_unknown_names_are_refused() {
        for name in CriuFlags::SWITCH_NAMES {
            let f = CriuFlags::from_switch_names(&[name]).unwrap();
            assert_eq!(f.to_args(), [format!("--{name}")]);
        }
        let err = CriuFlags::from_switch_names(&["tcp"]).unwrap_err();
        assert!(err.to_string().contains("\"tcp\""), "{err}");
    }

    #[test]
    fn not_granted_lists_only_missing_switches() {
        let want = CriuFlags::from_switch_names(&["tcp-established", "file-locks"]).unwrap();
        let granted = CriuFlags::from_switch_names(&["file-locks"]).unwrap();
        assert_eq!(want.not_granted_by(&granted), ["tcp-established"]);
        assert!(granted.not_granted_by(&want).is_empty());
    }

    #[test]
    fn cgroups_mode_parse_and_error_names_value_and_valid_ones() {
        for name in CgroupsMode::NAMES {
            assert_eq!(name.parse::<CgroupsMode>().unwrap().as_str(), name);
        }
        assert_eq!(CgroupsMode::parse_optional("").unwrap(), None);
        let err = CgroupsMode::parse_optional("Soft").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown cgroups mode \"Soft\": valid modes are soft, full, strict, ignore"
        );
    }

    #[test]
    fn empty_namespace_other_than_network_is_refused() {
        let f = CriuFlags {
            empty_ns: vec!["network".into(), "pid".into()],
            ..Default::default()
        };
        let msg = f.validate().unwrap_err().to_string();
        assert!(msg.contains("\"pid\"") && msg.contains("network"), "{msg}");
    }

    #[test]
    fn container_id_rules() {
        for ok in ["abc", "a-b_c.d+e", "0123456789abcdef"] {
            validate_container_id(ok).unwrap();
        }
        for bad in ["", ".", "..", "-x", "a/b", "a b", "ä"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plain_ids_name_one_entry() {
        for ok in ["abc", "a-b_c.d+e", "x..y", "with space", "ä"] {
            assert!(is_plain_id(ok), "{ok:?}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "/abs", "../up", "nul\0"] {
            assert!(!is_plain_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn serde_uses_lowercase_modes_and_refuses_unknown_fields() {
        let f = CriuFlags {
            manage_cgroups_mode: Some(CgroupsMode::Strict),
            ..Default::default()
        };
        let json = serde_json::to_string(&f).unwrap();
        assert!(json.contains("\"strict\""), "{json}");
        assert_eq!(serde_json::from_str::<CriuFlags>(&json).unwrap(), f);
        assert!(serde_json::from_str::<CriuFlags>(r#"{"tcp":true}"#).is_err());
    }
}
