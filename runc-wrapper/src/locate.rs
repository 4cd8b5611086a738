//! Finding runc and CRIU when the caller gives no `PATH`.
//!
//! Podman runs the OCI runtime's `kill` and `delete` with an empty environment; a wrapper that
//! looks runc up on `PATH` then cannot run it, and `podman rm -f` forgets a container that is
//! still running. So: an absolute `runc.binary` is used as configured (`gpusnap install`
//! writes one); a bare name is looked up on the caller's `PATH` and then on the standard
//! system path; runc itself runs with the caller's `PATH`, or the system path when there is
//! none, so it finds CRIU too.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use gpusnap_config::Config;

use crate::RUNC_ENV;

/// The standard system path (what a login shell and systemd give root).
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The `PATH` runc runs with: the caller's, else the system path; `criu_dir` in front.
pub fn runc_path_env(inherited: Option<OsString>, criu_dir: Option<&Path>) -> OsString {
    let base = inherited
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| OsString::from(SYSTEM_PATH));
    let mut parts: Vec<PathBuf> = criu_dir.map(Path::to_path_buf).into_iter().collect();
    parts.extend(std::env::split_paths(&base));
    std::env::join_paths(parts).unwrap_or(base)
}

/// Why the real runc cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error(
        "runc `{name}` not found (searched {searched} and {SYSTEM_PATH}): install runc, or set \
         runc.binary in the gpusnap config (or {RUNC_ENV}) to its absolute path"
    )]
    NotFound { name: String, searched: String },
    #[error("runc resolves to {0} itself; set runc.binary (or {RUNC_ENV}) to the real runc")]
    Itself(String),
}

/// Resolves the real runc: `$GPUSNAP_RUNC`, else `runc.binary`; an absolute path as given, a
/// bare name on `search` (see [`runc_path_env`]) and then the system path. Refuses to resolve
/// to this very binary (installed as `runc`), which would recurse forever.
pub fn resolve_runc(config: &Config, search: &OsStr) -> Result<PathBuf, LocateError> {
    let name = std::env::var_os(RUNC_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| config.runc.binary.clone());
    let found = if name.is_absolute() {
        is_executable(&name).then(|| name.clone())
    } else {
        let text = name.to_string_lossy();
        gpusnap_criu_bridge::find_in_path(&text, search)
            .or_else(|| gpusnap_criu_bridge::find_in_path(&text, OsStr::new(SYSTEM_PATH)))
    };
    let path = found.ok_or_else(|| LocateError::NotFound {
        name: name.display().to_string(),
        searched: search.to_string_lossy().into_owned(),
    })?;
    let me = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
    if me.is_some() && path.canonicalize().ok() == me {
        return Err(LocateError::Itself(path.display().to_string()));
    }
    Ok(path)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_path_means_the_system_path_with_criu_first() {
        let p = runc_path_env(None, Some(Path::new("/opt/criu/bin")));
        assert_eq!(p, OsString::from(format!("/opt/criu/bin:{SYSTEM_PATH}")));
        assert_eq!(
            runc_path_env(Some("".into()), None),
            OsString::from(SYSTEM_PATH)
        );
        assert_eq!(runc_path_env(Some("/x".into()), None), OsString::from("/x"));
    }

    #[test]
    fn runc_is_found_without_a_path_and_absolute_names_are_checked() {
        let config = Config::default();
        // Debian's runc is in /usr/sbin, on the system path even when the caller's PATH is
        // empty.
        if Path::new("/usr/sbin/runc").exists() {
            assert_eq!(
                resolve_runc(&config, OsStr::new("")).unwrap(),
                Path::new("/usr/sbin/runc")
            );
        }
        let mut config = Config::default();
        config.runc.binary = "/nonexistent/runc".into();
        let err = resolve_runc(&config, OsStr::new(SYSTEM_PATH)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/runc"), "{err}");
    }
}
