//! What `gpusnap install` changed, so `gpusnap uninstall` can put every byte back.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;

/// Default location; `/var/lib` survives reboots, unlike `/run`.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/gpusnap/install-state.json";
const FORMAT: u32 = 1;

/// Which part of the node a file configures; decides which daemon needs a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    Containerd,
    Crio,
    Criu,
    Gpusnap,
    Podman,
}

impl Component {
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Containerd => "containerd",
            Component::Crio => "CRI-O",
            Component::Criu => "CRIU",
            Component::Gpusnap => "gpusnap",
            Component::Podman => "Podman",
        }
    }
}

/// One file gpusnap created or modified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub path: PathBuf,
    pub component: Component,
    /// The file as it was before gpusnap first changed it; `None`: gpusnap created it.
    pub original: Option<String>,
    /// Permission bits of the original file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_mode: Option<u32>,
    /// SHA-256 of what gpusnap last wrote: uninstall only reverts a file that still has it,
    /// so edits made after install are never silently thrown away.
    pub installed_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallState {
    pub format: u32,
    /// gpusnap release that last changed this state.
    pub gpusnap_version: String,
    pub files: Vec<FileRecord>,
    /// Directories gpusnap created, outermost first; removed on uninstall when empty.
    #[serde(default)]
    pub created_dirs: Vec<PathBuf>,
}

impl Default for InstallState {
    fn default() -> Self {
        InstallState {
            format: FORMAT,
            gpusnap_version: crate::VERSION.to_owned(),
            files: Vec::new(),
            created_dirs: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading install state {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "install state {} is damaged ({reason}); it is needed to undo `gpusnap install` — restore \
         it from a backup or revert the files it lists by hand",
        path.display()
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "install state {} has format {found}, but this gpusnap reads format {FORMAT}: use the \
         gpusnap release that installed it",
        path.display()
    )]
    Format { path: PathBuf, found: u32 },
    #[error("writing install state {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl InstallState {
    /// `None` when there is no state file (nothing installed).
    pub fn load(path: &Path) -> Result<Option<InstallState>, StateError> {
        let text = fsutil::read_optional(path).map_err(|source| StateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let Some(text) = text else {
            return Ok(None);
        };
        let state: InstallState = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if state.format != FORMAT {
            return Err(StateError::Format {
                path: path.to_path_buf(),
                found: state.format,
            });
        }
        Ok(Some(state))
    }

    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            fsutil::create_dirs(dir).map_err(err)?;
        }
        let mut json = serde_json::to_vec_pretty(self).map_err(|e| err(io::Error::other(e)))?;
        json.push(b'\n');
        // Originals may hold site secrets (registry credentials in containerd's config).
        fsutil::write_atomically(path, &json, 0o600).map_err(err)
    }

    pub fn record(&self, path: &Path) -> Option<&FileRecord> {
        self.files.iter().find(|f| f.path == path)
    }

    pub fn record_mut(&mut self, path: &Path) -> Option<&mut FileRecord> {
        self.files.iter_mut().find(|f| f.path == path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib/gpusnap/state.json");
        assert_eq!(InstallState::load(&path).unwrap(), None);
        let mut s = InstallState::default();
        s.files.push(FileRecord {
            path: "/etc/x".into(),
            component: Component::Containerd,
            original: Some("a = 1\n".into()),
            original_mode: Some(0o640),
            installed_sha256: "00".into(),
        });
        s.save(&path).unwrap();
        assert_eq!(InstallState::load(&path).unwrap(), Some(s));
        assert_eq!(fsutil::mode_of(&path).unwrap(), Some(0o600));
    }

    #[test]
    fn corrupt_and_future_states_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            InstallState::load(&path),
            Err(StateError::Corrupt { .. })
        ));
        std::fs::write(
            &path,
            r#"{"format": 9, "gpusnap_version": "9", "files": []}"#,
        )
        .unwrap();
        let err = InstallState::load(&path).unwrap_err();
        assert!(matches!(err, StateError::Format { found: 9, .. }), "{err}");
    }
}
