//! Finding CRIU the way runc will, and checking its version.
//!
//! runc runs `criu swrk` from its own `PATH` (runc `libcontainer`, `criuSwrk`), so the probe takes the search path
//! explicitly: pass [`crate::RuncGlobal::effective_search_path`] and the probe sees the same
//! binary runc will exec.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::exec::RunTool;

/// A CRIU release number. Missing components read as 0, so "4.2" == "4.2.0".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl CriuVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        CriuVersion {
            major,
            minor,
            patch,
        }
    }
}

/// containerd's CRI `checkCriu` and CRI-O both require 3.16.
pub const MIN_CRIU_CPU: CriuVersion = CriuVersion::new(3, 16, 0);
/// 4.1 thaws frozen cgroups for the cuda plugin and enforces inventory plugins (CRIU 4.1 release notes).
pub const MIN_CRIU_GPU: CriuVersion = CriuVersion::new(4, 1, 0);

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // CRIU prints "4.2" for x.y.0 releases; match it so messages read like `criu --version`.
        if self.patch == 0 {
            write!(f, "{}.{}", self.major, self.minor)
        } else {
            write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
        }
    }
}

/// Parse failure for a version string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse CRIU version from {input:?}: expected MAJOR.MINOR[.PATCH]")]
pub struct VersionParseError {
    pub input: String,
}

impl FromStr for CriuVersion {
    type Err = VersionParseError;

    /// Accepts `4.2`, `4.2.1`, and suffixed forms such as `4.0-dev` or `3.17.1-rc2`: the
    /// numeric prefix of each component counts.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || VersionParseError {
            input: s.to_owned(),
        };
        let mut nums = s.trim().splitn(3, '.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>()
        });
        let major = nums.next().ok_or_else(err)?.map_err(|_| err())?;
        let minor = nums.next().ok_or_else(err)?.map_err(|_| err())?;
        let patch = match nums.next() {
            Some(p) => p.map_err(|_| err())?,
            None => 0,
        };
        Ok(CriuVersion::new(major, minor, patch))
    }
}

/// Parses `criu --version` output:
///
/// ```text
/// Version: 4.2.1
/// GitID: v4.2.1-12-gabcdef
/// ```
///
/// Returns the version and the GitID if present.
pub fn parse_criu_version_output(
    output: &str,
) -> Result<(CriuVersion, Option<String>), VersionParseError> {
    let mut version = None;
    let mut git_id = None;
    for line in output.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().parse()?);
        } else if let Some(g) = line.strip_prefix("GitID:") {
            git_id = Some(g.trim().to_owned()).filter(|g| !g.is_empty());
        }
    }
    let version = version.ok_or_else(|| VersionParseError {
        input: output.trim().to_owned(),
    })?;
    Ok((version, git_id))
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriuInfo {
    pub path: PathBuf,
    pub version: CriuVersion,
    pub git_id: Option<String>,
}

impl CriuInfo {
    /// Fails with [`ProbeError::CriuTooOld`] below `min`.
    pub fn require(&self, min: CriuVersion) -> Result<(), ProbeError> {
        if self.version < min {
            return Err(ProbeError::CriuTooOld {
                path: self.path.clone(),
                found: self.version,
                required: min,
            });
        }
        Ok(())
    }
}

/// Probe failures. `Clone` so the per-process cache can hand out copies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "criu not found on PATH {}: checkpoint/restore needs CRIU >= {MIN_CRIU_GPU} on the host \
         (install it with scripts/setup-env.sh, or set criu.binary_dir in \
         /etc/gpusnap/config.toml to the directory holding it)",
        display_path(path_searched)
    )]
    CriuNotFound { path_searched: OsString },
    #[error(
        "{} is CRIU {found}, but gpusnap needs CRIU >= {required} here: upgrade CRIU \
         (scripts/setup-env.sh installs a suitable one) or point criu.binary_dir at a newer build",
        path.display()
    )]
    CriuTooOld {
        path: PathBuf,
        found: CriuVersion,
        required: CriuVersion,
    },
    #[error("running `{} --version` failed: {reason}", path.display())]
    Exec { path: PathBuf, reason: String },
    #[error("`{} --version` printed something unexpected: {source}", path.display())]
    BadVersion {
        path: PathBuf,
        #[source]
        source: VersionParseError,
    },
}

fn display_path(p: &OsStr) -> String {
    if p.is_empty() {
        "(empty)".to_owned()
    } else {
        format!("{:?}", p.to_string_lossy())
    }
}

/// Finds an executable regular file `name` on `search_path`, like `execvp` would.
pub fn find_in_path(name: &str, search_path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(search_path)
        // An empty PATH element means cwd to execvp; never trust that for a root helper.
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Resolves `criu` on `search_path` and runs `criu --version`. Not cached.
pub fn probe_criu(search_path: &OsStr) -> Result<CriuInfo, ProbeError> {
    probe_criu_with(search_path, &crate::exec::Direct)
}

/// [`probe_criu`], running `criu --version` through `tool`.
pub fn probe_criu_with(search_path: &OsStr, tool: &dyn RunTool) -> Result<CriuInfo, ProbeError> {
    let path = find_in_path("criu", search_path).ok_or_else(|| ProbeError::CriuNotFound {
        path_searched: search_path.to_owned(),
    })?;
    let mut cmd = Command::new(&path);
    cmd.arg("--version");
    let output = tool.output(cmd).map_err(|e| ProbeError::Exec {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(ProbeError::Exec {
            path,
            reason: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let (version, git_id) =
        parse_criu_version_output(&text).map_err(|source| ProbeError::BadVersion {
            path: path.clone(),
            source,
        })?;
    tracing::debug!(path = %path.display(), %version, git_id = git_id.as_deref(), "found CRIU");
    Ok(CriuInfo {
        path,
        version,
        git_id,
    })
}

/// [`probe_criu_with`], remembering successes per search path for the life of the process
/// (failures are not kept, so installing CRIU fixes a running shim).
pub fn probe_criu_cached(search_path: &OsStr, tool: &dyn RunTool) -> Result<CriuInfo, ProbeError> {
    static CACHE: OnceLock<Mutex<HashMap<OsString, CriuInfo>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-probe; the map is still usable.
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(search_path)
    {
        return Ok(hit.clone());
    }
    let info = probe_criu_with(search_path, tool)?;
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(search_path.to_owned(), info.clone());
    Ok(info)
}

/// Result of `criu check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriuCheck {
    /// `criu check` exited 0 ("Looks good.").
    pub passed: bool,
    /// stdout and stderr together, trimmed.
    pub output: String,
}

/// Runs `criu check` (needs root). A failure is reported, not an error: CRIU often complains
/// about optional kernel features that a given container never uses.
pub fn criu_check(info: &CriuInfo) -> std::io::Result<CriuCheck> {
    let out = crate::exec::output(Command::new(&info.path).arg("check").stdin(Stdio::null()))?;
    let mut output = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        if !output.is_empty() {
            output.push('\n');
        }
        output.push_str(stderr.trim());
    }
    Ok(CriuCheck {
        passed: out.status.success(),
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        let (v, g) =
            parse_criu_version_output("Version: 4.2.1\nGitID: v4.2.1-3-gdeadbee\n").unwrap();
        assert_eq!(v, CriuVersion::new(4, 2, 1));
        assert_eq!(g.as_deref(), Some("v4.2.1-3-gdeadbee"));
        let (v, g) = parse_criu_version_output("Version: 3.17\n").unwrap();
        assert_eq!(v, CriuVersion::new(3, 17, 0));
        assert_eq!(g, None);
        assert_eq!(
            "4.0-dev".parse::<CriuVersion>().unwrap(),
            CriuVersion::new(4, 0, 0)
        );
        assert_eq!(
            "3.17.1-rc2".parse::<CriuVersion>().unwrap(),
            CriuVersion::new(3, 17, 1)
        );
        assert!("4".parse::<CriuVersion>().is_err());
        assert!("x.y".parse::<CriuVersion>().is_err());
        let err = parse_criu_version_output("criu: unknown option").unwrap_err();
        assert!(err.to_string().contains("unknown option"));
    }

    #[test]
    fn version_order_and_display() {
        assert!(CriuVersion::new(3, 16, 0) < CriuVersion::new(3, 16, 1));
        assert!(CriuVersion::new(3, 19, 9) < MIN_CRIU_GPU);
        assert!(MIN_CRIU_CPU < MIN_CRIU_GPU);
        assert_eq!(MIN_CRIU_GPU.to_string(), "4.1");
        assert_eq!(CriuVersion::new(4, 2, 1).to_string(), "4.2.1");
    }

    #[test]
    fn require_reports_found_and_required() {
        let info = CriuInfo {
            path: "/usr/sbin/criu".into(),
            version: CriuVersion::new(3, 17, 1),
            git_id: None,
        };
        info.require(MIN_CRIU_CPU).unwrap();
        let err = info.require(MIN_CRIU_GPU).unwrap_err();
        assert_eq!(
            err,
            ProbeError::CriuTooOld {
                path: "/usr/sbin/criu".into(),
                found: CriuVersion::new(3, 17, 1),
                required: MIN_CRIU_GPU
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("3.17.1") && msg.contains(">= 4.1"), "{msg}");
    }

    fn fake_criu(dir: &Path, version_output: &str) {
        let p = dir.join("criu");
        std::fs::write(&p, format!("#!/bin/sh\nprintf '{version_output}'\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn probe_uses_the_given_search_path() {
        let old = tempfile::tempdir().unwrap();
        let new = tempfile::tempdir().unwrap();
        fake_criu(old.path(), "Version: 3.15\\n");
        fake_criu(new.path(), "Version: 4.2.1\\nGitID: v4.2.1\\n");
        let path = std::env::join_paths([new.path(), old.path()]).unwrap();
        let info = probe_criu(&path).unwrap();
        assert_eq!(info.path, new.path().join("criu"));
        assert_eq!(info.version, CriuVersion::new(4, 2, 1));
        let path = std::env::join_paths([old.path(), new.path()]).unwrap();
        let info = probe_criu(&path).unwrap();
        assert_eq!(info.version, CriuVersion::new(3, 15, 0));
        assert!(matches!(
            info.require(MIN_CRIU_CPU),
            Err(ProbeError::CriuTooOld { .. })
        ));
    }

    #[test]
    fn non_executable_and_relative_entries_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("criu"), "not executable").unwrap();
        let mut path = OsString::from("relative/dir:");
        path.push(dir.path());
        assert_eq!(find_in_path("criu", &path), None);
    }

    #[test]
    fn garbage_version_output_is_bad_version() {
        let dir = tempfile::tempdir().unwrap();
        fake_criu(dir.path(), "hello\\n");
        let err = probe_criu(dir.path().as_os_str()).unwrap_err();
        assert!(matches!(err, ProbeError::BadVersion { .. }), "{err}");
    }

    #[test]
    fn cached_probe_returns_same_answer() {
        let dir = tempfile::tempdir().unwrap();
        fake_criu(dir.path(), "Version: 4.1\\n");
        let first = probe_criu_cached(dir.path().as_os_str(), &crate::Direct).unwrap();
        // Replacing the binary is not noticed: the answer is cached per search path.
        fake_criu(dir.path(), "Version: 3.0\\n");
        let second = probe_criu_cached(dir.path().as_os_str(), &crate::Direct).unwrap();
        assert_eq!(first, second);
        assert_eq!(second.version, MIN_CRIU_GPU);
        // A failure is not kept: a missing CRIU is noticed once it is installed.
        let empty = tempfile::tempdir().unwrap();
        assert!(probe_criu_cached(empty.path().as_os_str(), &crate::Direct).is_err());
        fake_criu(empty.path(), "Version: 4.2\\n");
        assert!(probe_criu_cached(empty.path().as_os_str(), &crate::Direct).is_ok());
    }

    /// The rig's real CRIU when it is installed; otherwise the not-found error on an empty
    /// PATH. Both branches assert.
    #[test]
    fn real_criu_probe_or_not_found() {
        let rig = Path::new("/opt/gpusnap-rig/bin");
        if rig.join("criu").exists() {
            let info = probe_criu(rig.as_os_str()).unwrap();
            assert_eq!(info.path, rig.join("criu"));
            info.require(MIN_CRIU_GPU).unwrap();
            let check = criu_check(&info).unwrap();
            assert!(!check.output.is_empty(), "criu check printed nothing");
        } else {
            let err = probe_criu(OsStr::new("")).unwrap_err();
            assert_eq!(
                err,
                ProbeError::CriuNotFound {
                    path_searched: OsString::new()
                }
            );
            let msg = err.to_string();
            assert!(
                msg.contains("scripts/setup-env.sh") && msg.contains(">= 4.1"),
                "{msg}"
            );
        }
    }

    #[test]
    fn empty_path_is_not_found() {
        let err = probe_criu(OsStr::new("")).unwrap_err();
        assert!(matches!(err, ProbeError::CriuNotFound { .. }));
        assert!(err.to_string().contains("(empty)"), "{err}");
    }
}
