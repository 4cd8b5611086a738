//! Host facts recorded in the manifest: runc version, kernel release, architecture.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::exec::RunTool;

/// Parsed `runc --version`:
///
/// ```text
/// runc version 1.1.5+ds1
/// commit: 1.1.5+ds1-1+deb12u1
/// spec: 1.0.2-dev
/// go: go1.19.8
/// libseccomp: 2.5.4
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuncVersion {
    /// The version as printed, distro suffixes included (e.g. `1.1.5+ds1`).
    pub version: String,
    pub commit: Option<String>,
    pub spec: Option<String>,
    pub go: Option<String>,
    pub libseccomp: Option<String>,
}

/// Why the runc version could not be determined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("running `{} --version` failed: {reason}", binary.display())]
    Exec { binary: PathBuf, reason: String },
    #[error("`runc --version` output has no \"runc version\" line: {output:?}")]
    Unrecognised { output: String },
}

/// Parses `runc --version` output; only the first line is required.
pub fn parse_runc_version(output: &str) -> Result<RuncVersion, VersionError> {
    let mut version = None;
    let mut v = RuncVersion {
        version: String::new(),
        commit: None,
        spec: None,
        go: None,
        libseccomp: None,
    };
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("runc version") {
            version = Some(rest.trim().to_owned()).filter(|s| !s.is_empty());
        } else if let Some((key, value)) = line.split_once(':') {
            let value = Some(value.trim().to_owned());
            match key.trim() {
                "commit" => v.commit = value,
                "spec" => v.spec = value,
                "go" => v.go = value,
                "libseccomp" => v.libseccomp = value,
                _ => {}
            }
        }
    }
    v.version = version.ok_or_else(|| VersionError::Unrecognised {
        output: output.trim().to_owned(),
    })?;
    Ok(v)
}

/// Runs `<binary> --version` and parses it.
pub fn runc_version(binary: &Path) -> Result<RuncVersion, VersionError> {
    runc_version_with(binary, &crate::exec::Direct)
}

/// [`runc_version`], running runc through `tool`.
pub fn runc_version_with(binary: &Path, tool: &dyn RunTool) -> Result<RuncVersion, VersionError> {
    let exec_err = |reason: String| VersionError::Exec {
        binary: binary.to_path_buf(),
        reason,
    };
    let mut cmd = Command::new(binary);
    cmd.arg("--version");
    let out = tool.output(cmd).map_err(|e| exec_err(e.to_string()))?;
    if !out.status.success() {
        return Err(exec_err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_runc_version(&String::from_utf8_lossy(&out.stdout))
}

/// The running kernel's release (`uname -r`). Read from procfs rather than calling uname(2)
/// so this crate needs no unsafe code; gpusnap is Linux-only and procfs is always mounted
/// where runc runs.
pub fn kernel_release() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_owned())
}

/// The architecture this binary was built for, in Rust's spelling (`x86_64`, `aarch64`).
/// A checkpoint cannot be restored on another architecture.
pub fn host_arch() -> &'static str {
    std::env::consts::ARCH
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debian_runc() {
        let v = parse_runc_version(
            "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\n\
             libseccomp: 2.5.4\n",
        )
        .unwrap();
        assert_eq!(v.version, "1.1.5+ds1");
        assert_eq!(v.commit.as_deref(), Some("1.1.5+ds1-1+deb12u1"));
        assert_eq!(v.spec.as_deref(), Some("1.0.2-dev"));
        assert_eq!(v.go.as_deref(), Some("go1.19.8"));
        assert_eq!(v.libseccomp.as_deref(), Some("2.5.4"));
    }

    #[test]
    fn parses_minimal_and_rejects_garbage() {
        let v = parse_runc_version("runc version 1.3.0-rc.1\n").unwrap();
        assert_eq!(v.version, "1.3.0-rc.1");
        assert_eq!(v.commit, None);
        assert!(matches!(
            parse_runc_version("crun version 1.8"),
            Err(VersionError::Unrecognised { .. })
        ));
        assert!(parse_runc_version("runc version \n").is_err());
    }

    #[test]
    fn host_facts() {
        let k = kernel_release().unwrap();
        assert!(k.chars().next().unwrap().is_ascii_digit(), "{k}");
        assert_eq!(host_arch(), std::env::consts::ARCH);
    }

    #[test]
    fn missing_binary_is_exec_error() {
        let err = runc_version(Path::new("/nonexistent/runc")).unwrap_err();
        assert!(matches!(err, VersionError::Exec { .. }));
    }

    /// The host's runc when installed (the rig installs it from apt); otherwise the error path.
    #[test]
    fn real_runc_version_or_error() {
        match crate::criu_probe::find_in_path("runc", &std::env::var_os("PATH").unwrap_or_default())
        {
            Some(runc) => {
                let v = runc_version(&runc).unwrap();
                assert!(v.version.chars().next().unwrap().is_ascii_digit(), "{v:?}");
            }
            None => assert!(runc_version(Path::new("runc")).is_err()),
        }
    }
}
