//! Plain Rust checkpoint/restore options.
//!
//! `CheckpointOptions` mirrors `containerd.runc.v1.CheckpointOptions` field for field so the shim
//! can convert the proto without losing anything; `RestoreOptions` mirrors what the Go runc shim
//! passes to `runc restore` (reference §9). Neither type knows about protobuf or ttrpc.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Errors found while validating options, before anything is run.
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
    RelativePath { field: &'static str, path: PathBuf },
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error(
        "container id {id:?} is not valid for runc: use letters, digits, '_', '+', '-' and '.', \
         not starting with '.' or '-'"
    )]
    InvalidContainerId { id: String },
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

    /// Parses the proto's free-form string: empty means "not set" (runc then uses soft).
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
/// (runc `checkpoint.go`); we reject the rest up front so the error names the bad value instead
/// of surfacing as a runc exit status.
pub const SUPPORTED_EMPTY_NAMESPACES: [&str; 1] = ["network"];

/// Mirror of `containerd.runc.v1.CheckpointOptions` (fields 1–9).
///
/// `Default` leaves the container running with no extra CRIU permissions: that is what a nil
/// `options` Any from CRI means (CRI only fills options for `io.containerd.runc.v2`, reference
/// §8), and what the Go shim does with nil options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointOptions {
    /// Stop the container after the dump (`false` → `--leave-running`).
    pub exit: bool,
    /// `--tcp-established`
    pub open_tcp: bool,
    /// `--ext-unix-sk`
    pub external_unix_sockets: bool,
    /// `--shell-job`
    pub terminal: bool,
    /// `--file-locks`
    pub file_locks: bool,
    /// Repeated `--empty-ns`.
    pub empty_namespaces: Vec<String>,
    /// `--manage-cgroups-mode`; `None` lets runc pick (soft).
    pub cgroups_mode: Option<CgroupsMode>,
    /// Where the daemon asked the images to go. containerd already passes this as the
    /// Checkpoint request's `path`, so it only matters when that path is empty.
    pub image_path: Option<PathBuf>,
    /// CRIU work directory (`--work-path`): dump.log lands here.
    pub work_path: Option<PathBuf>,
}

impl CheckpointOptions {
    /// Checks everything that can be checked without touching the host.
    pub fn validate(&self) -> Result<(), OptionsError> {
        validate_empty_namespaces(&self.empty_namespaces)?;
        validate_optional_abs("image_path", self.image_path.as_deref())?;
        validate_optional_abs("work_path", self.work_path.as_deref())?;
        Ok(())
    }

    /// The directory the images go to: the request's `path` when set (containerd always sets it,
    /// reference §10), else `image_path`.
    pub fn resolve_image_dir(&self, request_path: &Path) -> Result<PathBuf, OptionsError> {
        let dir = if request_path.as_os_str().is_empty() {
            self.image_path.clone().ok_or(OptionsError::Empty {
                field: "checkpoint path (request path and image_path)",
            })?
        } else {
            request_path.to_path_buf()
        };
        validate_abs("checkpoint path", &dir)?;
        Ok(dir)
    }

    /// Where CRIU writes `dump.log`: the work path if set, otherwise the image directory
    /// (CRIU's default work dir is its images dir).
    pub fn criu_log_dir<'a>(&'a self, image_dir: &'a Path) -> &'a Path {
        self.work_path.as_deref().unwrap_or(image_dir)
    }
}

/// What `runc restore` needs. There is no meaningful `Default` (image path and bundle are
/// required), so [`RestoreOptions::new`] sets the same defaults as the Go runc shim:
/// `--detach --no-subreaper` (the shim is the subreaper and reaps the restored init itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOptions {
    /// Directory holding the CRIU images (`--image-path`).
    pub image_path: PathBuf,
    /// CRIU work directory (`--work-path`): restore.log lands here.
    pub work_path: Option<PathBuf>,
    /// OCI bundle (`--bundle`).
    pub bundle: PathBuf,
    /// `--pid-file`: runc writes the restored init's host pid here.
    pub pid_file: Option<PathBuf>,
    /// `--console-socket` for terminal containers.
    pub console_socket: Option<PathBuf>,
    /// `--detach`
    pub detach: bool,
    /// `--no-subreaper`
    pub no_subreaper: bool,
    /// `--no-pivot`
    pub no_pivot: bool,
    /// `--tcp-established`
    pub open_tcp: bool,
    /// `--ext-unix-sk`
    pub external_unix_sockets: bool,
    /// `--shell-job`
    pub terminal: bool,
    /// `--file-locks`
    pub file_locks: bool,
    /// Repeated `--empty-ns`.
    pub empty_namespaces: Vec<String>,
    /// `--manage-cgroups-mode`
    pub cgroups_mode: Option<CgroupsMode>,
}

impl RestoreOptions {
    pub fn new(image_path: impl Into<PathBuf>, bundle: impl Into<PathBuf>) -> Self {
        RestoreOptions {
            image_path: image_path.into(),
            work_path: None,
            bundle: bundle.into(),
            pid_file: None,
            console_socket: None,
            detach: true,
            no_subreaper: true,
            no_pivot: false,
            open_tcp: false,
            external_unix_sockets: false,
            terminal: false,
            file_locks: false,
            empty_namespaces: Vec::new(),
            cgroups_mode: None,
        }
    }

    /// Carries the CRIU permissions a checkpoint was taken with over to its restore: CRIU
    /// refuses to restore e.g. established TCP connections unless the same flag is given again.
    pub fn with_checkpoint_flags(mut self, checkpoint: &CheckpointOptions) -> Self {
        self.open_tcp = checkpoint.open_tcp;
        self.external_unix_sockets = checkpoint.external_unix_sockets;
        self.terminal = checkpoint.terminal;
        self.file_locks = checkpoint.file_locks;
        self.empty_namespaces = checkpoint.empty_namespaces.clone();
        self.cgroups_mode = checkpoint.cgroups_mode;
        self
    }

    pub fn validate(&self) -> Result<(), OptionsError> {
        validate_abs("image_path", &self.image_path)?;
        validate_abs("bundle", &self.bundle)?;
        validate_optional_abs("work_path", self.work_path.as_deref())?;
        validate_optional_abs("pid_file", self.pid_file.as_deref())?;
        validate_optional_abs("console_socket", self.console_socket.as_deref())?;
        validate_empty_namespaces(&self.empty_namespaces)?;
        Ok(())
    }

    /// Where CRIU writes `restore.log`.
    pub fn criu_log_dir(&self) -> &Path {
        self.work_path.as_deref().unwrap_or(&self.image_path)
    }
}

fn validate_empty_namespaces(namespaces: &[String]) -> Result<(), OptionsError> {
    for ns in namespaces {
        if !SUPPORTED_EMPTY_NAMESPACES.contains(&ns.as_str()) {
            return Err(OptionsError::UnsupportedEmptyNamespace { value: ns.clone() });
        }
    }
    Ok(())
}

// Relative paths would resolve against runc's cwd (the bundle), which is never what a caller
// holding a containerd path meant.
fn validate_abs(field: &'static str, path: &Path) -> Result<(), OptionsError> {
    if path.as_os_str().is_empty() {
        return Err(OptionsError::Empty { field });
    }
    if !path.is_absolute() {
        return Err(OptionsError::RelativePath {
            field,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn validate_optional_abs(field: &'static str, path: Option<&Path>) -> Result<(), OptionsError> {
    path.map_or(Ok(()), |p| validate_abs(field, p))
}

/// runc's container id rule (libcontainer `validateID`): `^[\w+-\.]+$`, and not `.`/`..`.
/// We also refuse a leading `-` so an id can never be parsed as a flag.
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
    fn default_checkpoint_leaves_running_with_no_permissions() {
        let o = CheckpointOptions::default();
        assert!(!o.exit);
        assert!(!o.open_tcp && !o.external_unix_sockets && !o.terminal && !o.file_locks);
        assert!(o.empty_namespaces.is_empty());
        assert_eq!(o.cgroups_mode, None);
        o.validate().unwrap();
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
        let o = CheckpointOptions {
            empty_namespaces: vec!["network".into(), "pid".into()],
            ..Default::default()
        };
        let msg = o.validate().unwrap_err().to_string();
        assert!(msg.contains("\"pid\"") && msg.contains("network"), "{msg}");
    }

    #[test]
    fn relative_paths_are_refused() {
        let o = CheckpointOptions {
            work_path: Some("work".into()),
            ..Default::default()
        };
        assert_eq!(
            o.validate().unwrap_err(),
            OptionsError::RelativePath {
                field: "work_path",
                path: "work".into()
            }
        );
        let mut r = RestoreOptions::new("/img", "bundle");
        assert!(r.validate().unwrap_err().to_string().contains("bundle"));
        r.bundle = "/b".into();
        r.validate().unwrap();
    }

    #[test]
    fn image_dir_prefers_request_path() {
        let o = CheckpointOptions {
            image_path: Some("/opt".into()),
            ..Default::default()
        };
        assert_eq!(
            o.resolve_image_dir(Path::new("/req")).unwrap(),
            Path::new("/req")
        );
        assert_eq!(
            o.resolve_image_dir(Path::new("")).unwrap(),
            Path::new("/opt")
        );
        let none = CheckpointOptions::default();
        assert!(matches!(
            none.resolve_image_dir(Path::new("")),
            Err(OptionsError::Empty { .. })
        ));
    }

    #[test]
    fn log_dir_falls_back_to_image_dir() {
        let mut o = CheckpointOptions::default();
        assert_eq!(o.criu_log_dir(Path::new("/img")), Path::new("/img"));
        o.work_path = Some("/work".into());
        assert_eq!(o.criu_log_dir(Path::new("/img")), Path::new("/work"));
        let mut r = RestoreOptions::new("/img", "/b");
        assert_eq!(r.criu_log_dir(), Path::new("/img"));
        r.work_path = Some("/w".into());
        assert_eq!(r.criu_log_dir(), Path::new("/w"));
    }

    #[test]
    fn restore_defaults_match_go_shim_and_inherit_checkpoint_flags() {
        let cp = CheckpointOptions {
            open_tcp: true,
            file_locks: true,
            empty_namespaces: vec!["network".into()],
            cgroups_mode: Some(CgroupsMode::Full),
            ..Default::default()
        };
        let r = RestoreOptions::new("/img", "/b").with_checkpoint_flags(&cp);
        assert!(r.detach && r.no_subreaper && !r.no_pivot);
        assert!(r.open_tcp && r.file_locks && !r.terminal && !r.external_unix_sockets);
        assert_eq!(r.empty_namespaces, vec!["network".to_string()]);
        assert_eq!(r.cgroups_mode, Some(CgroupsMode::Full));
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
    fn serde_round_trip_uses_lowercase_modes() {
        let o = CheckpointOptions {
            cgroups_mode: Some(CgroupsMode::Strict),
            ..Default::default()
        };
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains("\"strict\""), "{json}");
        assert_eq!(serde_json::from_str::<CheckpointOptions>(&json).unwrap(), o);
        // Missing fields read as defaults, so older manifests stay readable.
        assert_eq!(
            serde_json::from_str::<CheckpointOptions>("{}").unwrap(),
            CheckpointOptions::default()
        );
    }
}
