//! One status file per archive, `<status dir>/<archive name>.json`: what the agent did with it
//! (pushed where, with which digest and tags; refused or failed, and why; still trying), for
//! operators (`gpusnap agent push-status`, or the file itself) and for the agent after a
//! restart, which pushes again only an archive whose record is missing, not final, or about
//! another file (a different inode, size or time at the same name).

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::{beneath, layout};
use serde::{Deserialize, Serialize};

use super::archive::{Identity, PodRef};

/// Largest status file read back (they are well under 4 KiB).
const MAX_RECORD_BYTES: u64 = 64 << 10;
/// Longest archive name used as is in a status file's name.
const NAME_MAX_AS_IS: usize = 200;

/// What happened to one archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum State {
    /// The pod asked for no push (no `gpusnap.io/checkpoint-to`).
    NotRequested,
    /// Still being written, or cut short: looked at again when its writer closes it.
    Incomplete { reason: String },
    /// Not pushed, and never will be as it is: the destination is not allowed, the annotation
    /// or the archive is invalid, the registry refused the node's credentials.
    Refused {
        #[serde(skip_serializing_if = "Option::is_none")]
        destination: Option<String>,
        reason: String,
    },
    /// Attempt `attempt` of at most `of` is running (a record left in this state by an agent
    /// that stopped is taken up again by the next one).
    Pushing {
        destination: String,
        attempt: u32,
        of: u32,
    },
    /// Attempt `attempt` failed for a reason that may pass; the next one starts at
    /// `next_attempt`.
    Retrying {
        destination: String,
        attempt: u32,
        of: u32,
        reason: String,
        next_attempt: String,
    },
    Pushed {
        destination: String,
        /// `REGISTRY/REPOSITORY:TAG`, one per tag.
        references: Vec<String>,
        /// The image index the tags point at.
        digest: String,
        /// Whether the node signed it (cosign, `checkpoint.signing_key`).
        signed: bool,
        attempts: u32,
        /// Blobs the registry lacked and got, in bytes.
        bytes_uploaded: u64,
    },
    /// Every attempt failed; the last reason.
    Failed {
        destination: String,
        attempts: u32,
        reason: String,
    },
}

impl State {
    /// Whether the agent is done with the archive.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            State::NotRequested
                | State::Refused { .. }
                | State::Pushed { .. }
                | State::Failed { .. }
        )
    }

    /// The `state` field's value.
    pub fn name(&self) -> &'static str {
        match self {
            State::NotRequested => "not-requested",
            State::Incomplete { .. } => "incomplete",
            State::Refused { .. } => "refused",
            State::Pushing { .. } => "pushing",
            State::Retrying { .. } => "retrying",
            State::Pushed { .. } => "pushed",
            State::Failed { .. } => "failed",
        }
    }
}

/// A status file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The archive's path on the node.
    pub archive: PathBuf,
    pub identity: Identity,
    #[serde(flatten)]
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    pub node: String,
    /// When the record was written, RFC 3339.
    pub updated: String,
}

/// The directory of status files (root-only).
pub struct StatusDir {
    path: PathBuf,
    fd: std::os::fd::OwnedFd,
}

impl StatusDir {
    /// Opens `path`, creating it 0700 when missing.
    pub fn open(path: &Path) -> std::io::Result<StatusDir> {
        beneath::create_private_dir(path)?;
        Ok(StatusDir {
            path: path.to_path_buf(),
            fd: beneath::open_root(path)?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The status file's name for archive `name`: the name itself plus `.json` when it is
    /// short UTF-8 without a leading dot, else a digest of it.
    pub fn file_name(name: &OsStr) -> String {
        match name.to_str() {
            Some(s) if s.len() <= NAME_MAX_AS_IS && !s.starts_with('.') && !s.contains('/') => {
                format!("{s}.json")
            }
            _ => format!(
                "archive-{}.json",
                &crate::fsutil::sha256_hex(name.as_bytes())[..32]
            ),
        }
    }

    /// The record of archive `name`, `None` when there is none (or it is unreadable, which
    /// only means the archive is looked at again).
    pub fn load(&self, name: &OsStr) -> Option<Record> {
        layout::read_json_capped(self.fd.as_fd(), &Self::file_name(name), MAX_RECORD_BYTES).ok()
    }

    /// Writes the record of archive `name` (atomically, 0600).
    pub fn save(&self, name: &OsStr, record: &Record) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(record)?;
        beneath::write_atomically(
            self.fd.as_fd(),
            OsStr::new(&Self::file_name(name)),
            &bytes,
            0o600,
        )
    }

    /// Every record, newest first.
    pub fn all(&self) -> std::io::Result<Vec<Record>> {
        let mut out: Vec<Record> = beneath::names(self.fd.as_fd())?
            .into_iter()
            .filter(|n| n.as_bytes().ends_with(b".json"))
            // Record names are ASCII (`file_name`); any other name is not a record.
            .filter_map(|n| {
                let n = n.to_str()?;
                layout::read_json_capped(self.fd.as_fd(), n, MAX_RECORD_BYTES).ok()
            })
            .collect();
        out.sort_by(|a, b| b.updated.cmp(&a.updated));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State) -> Record {
        Record {
            archive: "/var/lib/kubelet/checkpoints/a.tar".into(),
            identity: Identity {
                dev: 1,
                ino: 2,
                size: 3,
                mtime_ns: 4,
            },
            state,
            pod: None,
            container: Some("main".into()),
            node: "n".into(),
            updated: "2026-12-02T13:30:53Z".into(),
        }
    }

    #[test]
    fn records_round_trip_with_their_state() {
        let d = tempfile::tempdir().unwrap();
        let s = StatusDir::open(&d.path().join("status")).unwrap();
        let name = OsStr::new("checkpoint-p_ns-c-2026-12-02T13:30:53Z.tar");
        assert_eq!(s.load(name), None);
        let r = record(State::Failed {
            destination: "r.io/x".into(),
            attempts: 3,
            reason: "unreachable".into(),
        });
        s.save(name, &r).unwrap();
        assert_eq!(s.load(name), Some(r.clone()));
        let text = std::fs::read_to_string(
            d.path()
                .join("status/checkpoint-p_ns-c-2026-12-02T13:30:53Z.tar.json"),
        )
        .unwrap();
        assert!(text.contains("\"state\": \"failed\""), "{text}");
        assert_eq!(s.all().unwrap(), [r]);
        assert!(State::NotRequested.is_final());
        assert!(!State::Incomplete {
            reason: String::new()
        }
        .is_final());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join("status"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn odd_names_get_a_digest() {
        assert_eq!(StatusDir::file_name(OsStr::new("a.tar")), "a.tar.json");
        for odd in [".hidden.tar".to_string(), "x".repeat(250)] {
            let f = StatusDir::file_name(OsStr::new(&odd));
            assert!(f.starts_with("archive-") && f.len() < 60, "{f}");
        }
    }
}
