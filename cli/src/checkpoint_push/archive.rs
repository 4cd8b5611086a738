//! One CRI checkpoint archive in the watched directory, read as untrusted input: opened once
//! beneath the directory (a regular file, no symlink followed), identified by its inode, size
//! and modification time, checked complete, and its `spec.dump` / `config.dump` read (each
//! capped) for the pod, the container, the checkpoint time and the `gpusnap.io/checkpoint-to`
//! annotation.
//!
//! containerd 2.1–2.3 writes the archive in place (`os.OpenFile(location, O_RDWR|O_CREATE)`,
//! then one `io.Copy` of the tar stream and `Close`; no temporary name, no rename), so a
//! reader can meet a file that is still growing. It is complete when its tar stream ends with
//! the end-of-archive marker (two zero blocks) that the writer's `Close` adds last; a
//! half-written file ends in the middle of an entry and is left for the `IN_CLOSE_WRITE` that
//! containerd's close brings.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::beneath;
use serde::{Deserialize, Serialize};

/// Largest `spec.dump` / `config.dump` read (containerd's are a few KiB).
pub const MAX_METADATA_BYTES: u64 = 1 << 20;
/// The tar end-of-archive marker: two zero blocks.
const END_OF_ARCHIVE: usize = 1024;

/// CRI's annotations on the container's OCI spec (containerd `internal/cri/annotations`).
pub mod cri_keys {
    pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
}

/// Which file an archive is: a new write at the same name (containerd opens without
/// truncating), or the file replaced, is another archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }

    /// How long ago the archive was last written (zero when its time is in the future).
    pub fn age(&self) -> std::time::Duration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let ns = (now - self.mtime_ns).max(0);
        std::time::Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// The pod a checkpointed container belonged to, from CRI's spec annotations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// The pod's `metadata.uid` (what `kubectl describe pod` matches events by).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What the archive says about itself.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// `spec.dump`'s annotations (the pod annotations CRI passed to the runtime among them).
    pub annotations: BTreeMap<String, String>,
    pub pod: Option<PodRef>,
    /// The container's name in its pod.
    pub container: Option<String>,
    /// `config.dump`'s `checkpointedTime`.
    pub checkpointed_at: Option<time::OffsetDateTime>,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{}: not a complete CRI checkpoint archive ({reason}); it is read again when its writer \
         closes it",
        path.display()
    )]
    Incomplete { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

impl ArchiveError {
    fn io(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
        move |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn invalid(path: &Path, reason: impl Into<String>) -> ArchiveError {
        ArchiveError::Invalid {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// An archive opened beneath the watched directory. Everything the agent does with it reads
/// this descriptor (the build through [`Archive::fd_path`]), so a name swapped after the checks
/// changes nothing.
pub struct Archive {
    file: File,
    /// The archive's path on the node, for records and messages.
    pub path: PathBuf,
    pub name: OsString,
    pub identity: Identity,
}

impl Archive {
    /// Opens `name` in the directory `dir` (its descriptor, opened from `dir_path`): a regular
    /// file reached without a symlink. `Ok(None)` when it no longer exists.
    pub fn open(
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        name: &OsStr,
    ) -> Result<Option<Archive>, ArchiveError> {
        let path = dir_path.join(name);
        let file = match beneath::open_file(dir, Path::new(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ArchiveError::io(&path)(e)),
        };
        let meta = file.metadata().map_err(ArchiveError::io(&path))?;
        Ok(Some(Archive {
            identity: Identity::of(&meta),
            file,
            path,
            name: name.to_os_string(),
        }))
    }

    /// `/proc/self/fd/N` of the open archive: the inode checked here, whatever the name now
    /// points at.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_fd().as_raw_fd()))
    }

    /// Refuses an archive that is not a plain tar ending with the end-of-archive marker.
    pub fn check_complete(&self) -> Result<(), ArchiveError> {
        let size = self.identity.size;
        let incomplete = |reason: String| ArchiveError::Incomplete {
            path: self.path.clone(),
            reason,
        };
        if size < END_OF_ARCHIVE as u64 || !size.is_multiple_of(512) {
            return Err(incomplete(format!(
                "{size} bytes, not a whole number of tar blocks"
            )));
        }
        let mut magic = [0u8; 4];
        let n = self
            .file
            .read_at(&mut magic, 0)
            .map_err(ArchiveError::io(&self.path))?;
        if matches!(
            crate::inspect::Compression::sniff(&magic[..n]),
            crate::inspect::Compression::Gzip | crate::inspect::Compression::Zstd
        ) {
            return Err(ArchiveError::invalid(
                &self.path,
                "a compressed archive: CRI's CheckpointContainer writes a plain tar, so this one \
                 was not written by the node's runtime",
            ));
        }
        let mut tail = [0u8; END_OF_ARCHIVE];
        self.file
            .read_exact_at(&mut tail, size - END_OF_ARCHIVE as u64)
            .map_err(ArchiveError::io(&self.path))?;
        if tail.iter().any(|b| *b != 0) {
            return Err(incomplete(
                "no end-of-archive marker at its end: still being written, or cut short".into(),
            ));
        }
        Ok(())
    }

    /// `spec.dump` and `config.dump`, read from the archive's top level (each refused past
    /// [`MAX_METADATA_BYTES`], and when it appears twice), and what they say.
    pub fn metadata(&self) -> Result<Metadata, ArchiveError> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))
            .map_err(ArchiveError::io(&self.path))?;
        let mut archive = tar::Archive::new(file);
        let mut spec: Option<Vec<u8>> = None;
        let mut config: Option<Vec<u8>> = None;
        let entries = archive
            .entries_with_seek()
            .map_err(ArchiveError::io(&self.path))?;
        for entry in entries {
            let entry = entry.map_err(ArchiveError::io(&self.path))?;
            let name = {
                let p = entry.path().map_err(ArchiveError::io(&self.path))?;
                let s = p.to_string_lossy();
                s.trim_start_matches("./").to_owned()
            };
            let slot = match name.as_str() {
                "spec.dump" => &mut spec,
                "config.dump" => &mut config,
                _ => continue,
            };
            if !entry.header().entry_type().is_file() {
                return Err(ArchiveError::invalid(
                    &self.path,
                    format!("{name} is not a regular file"),
                ));
            }
            if slot.is_some() {
                return Err(ArchiveError::invalid(
                    &self.path,
                    format!("{name} appears twice"),
                ));
            }
            let shown = format!("{}!/{name}", self.path.display());
            let size = entry.size();
            let bytes = beneath::read_file_capped_from(entry, &shown, size, MAX_METADATA_BYTES)
                .map_err(|e| ArchiveError::invalid(&self.path, e.to_string()))?;
            *slot = Some(bytes);
        }
        let Some(spec) = spec else {
            return Err(ArchiveError::invalid(
                &self.path,
                "no spec.dump: not a CRI checkpoint archive",
            ));
        };
        parse_metadata(&self.path, &spec, config.as_deref())
    }
}

/// Annotation values are strings; anything else in `annotations` is refused rather than
/// skipped, as no runtime writes it.
fn parse_metadata(
    path: &Path,
    spec: &[u8],
    config: Option<&[u8]>,
) -> Result<Metadata, ArchiveError> {
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: BTreeMap<String, String>,
    }
    #[derive(Deserialize)]
    struct Config {
        #[serde(default, rename = "checkpointedTime")]
        checkpointed_time: Option<String>,
    }
    let spec: Spec = serde_json::from_slice(spec)
        .map_err(|e| ArchiveError::invalid(path, format!("spec.dump: {e}")))?;
    let checkpointed_at = match config {
        Some(bytes) => {
            let c: Config = serde_json::from_slice(bytes)
                .map_err(|e| ArchiveError::invalid(path, format!("config.dump: {e}")))?;
            c.checkpointed_time
                .map(|t| {
                    time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339)
                        .map_err(|e| {
                            ArchiveError::invalid(
                                path,
                                format!("config.dump: checkpointedTime {t:?}: {e}"),
                            )
                        })
                })
                .transpose()?
        }
        None => None,
    };
    let a = &spec.annotations;
    let get = |k: &str| a.get(k).filter(|v| !v.is_empty()).cloned();
    let pod = match (
        get(cri_keys::SANDBOX_NAMESPACE),
        get(cri_keys::SANDBOX_NAME),
    ) {
        (Some(namespace), Some(name)) => Some(PodRef {
            namespace,
            name,
            uid: get(cri_keys::SANDBOX_UID),
        }),
        _ => None,
    };
    Ok(Metadata {
        container: get(cri_keys::CONTAINER_NAME),
        pod,
        checkpointed_at,
        annotations: spec.annotations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tar_of(entries: &[(&str, &[u8])], finish: bool) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        if finish {
            b.into_inner().unwrap()
        } else {
            // What a writer that has not closed yet leaves: entries, no marker.
            b.get_ref().clone()
        }
    }

    fn open(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> Archive {
        std::fs::write(dir.path().join(name), bytes).unwrap();
        let root = beneath::open_root(dir.path()).unwrap();
        Archive::open(root.as_fd(), dir.path(), OsStr::new(name))
            .unwrap()
            .unwrap()
    }

    fn spec() -> Vec<u8> {
        serde_json::to_vec(&json!({"annotations": {
            "io.kubernetes.cri.sandbox-name": "trainer",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.sandbox-uid": "u-1",
            "io.kubernetes.cri.container-name": "main",
            "gpusnap.io/checkpoint-to": "registry.example.com/ckpt/trainer",
        }}))
        .unwrap()
    }

    #[test]
    fn metadata_of_a_complete_archive() {
        let d = tempfile::tempdir().unwrap();
        let config = br#"{"name":"main","checkpointedTime":"2026-12-02T13:30:53.123456789Z"}"#;
        let big = vec![7u8; 64 << 10];
        let a = open(
            &d,
            "a.tar",
            &tar_of(
                &[
                    ("checkpoint/pages-1.img", &big),
                    ("config.dump", config),
                    ("rootfs-diff.tar", &big),
                    ("spec.dump", &spec()),
                ],
                true,
            ),
        );
        a.check_complete().unwrap();
        let m = a.metadata().unwrap();
        assert_eq!(
            m.pod,
            Some(PodRef {
                namespace: "ml".into(),
                name: "trainer".into(),
                uid: Some("u-1".into())
            })
        );
        assert_eq!(m.container.as_deref(), Some("main"));
        assert_eq!(
            m.annotations["gpusnap.io/checkpoint-to"],
            "registry.example.com/ckpt/trainer"
        );
        assert_eq!(
            m.checkpointed_at.unwrap().unix_timestamp(),
            time::macros::datetime!(2026-12-02 13:30:53 UTC).unix_timestamp()
        );
        assert_eq!(
            a.identity.size,
            std::fs::metadata(d.path().join("a.tar")).unwrap().len()
        );
    }

    #[test]
    fn unfinished_truncated_and_compressed_archives_are_not_complete() {
        let d = tempfile::tempdir().unwrap();
        let entries: [(&str, &[u8]); 1] = [("spec.dump", &spec())];
        let open_one = open(&d, "open.tar", &tar_of(&entries, false));
        assert!(matches!(
            open_one.check_complete(),
            Err(ArchiveError::Incomplete { .. })
        ));
        let full = tar_of(&entries, true);
        let cut = open(&d, "cut.tar", &full[..full.len() - 700]);
        assert!(matches!(
            cut.check_complete(),
            Err(ArchiveError::Incomplete { .. })
        ));
        let mut gz = vec![0x1f, 0x8b];
        gz.resize(2048, 0);
        assert!(matches!(
            open(&d, "gz.tar", &gz).check_complete(),
            Err(ArchiveError::Invalid { .. })
        ));
    }

    #[test]
    fn hostile_metadata_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let big = vec![b' '; (MAX_METADATA_BYTES + 1) as usize];
        let twice = tar_of(&[("spec.dump", &spec()), ("./spec.dump", &spec())], true);
        let not_strings = br#"{"annotations": {"gpusnap.io/checkpoint-to": 5}}"#;
        for (name, bytes) in [
            ("huge.tar", tar_of(&[("spec.dump", &big)], true)),
            ("twice.tar", twice),
            ("none.tar", tar_of(&[("config.dump", b"{}")], true)),
            ("types.tar", tar_of(&[("spec.dump", not_strings)], true)),
            (
                "time.tar",
                tar_of(
                    &[
                        ("spec.dump", &spec()),
                        ("config.dump", br#"{"checkpointedTime":"yesterday"}"#),
                    ],
                    true,
                ),
            ),
        ] {
            let err = open(&d, name, &bytes).metadata().unwrap_err();
            assert!(matches!(err, ArchiveError::Invalid { .. }), "{name}: {err}");
        }
    }

    #[test]
    fn a_symlink_is_not_opened() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("real"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link.tar")).unwrap();
        let root = beneath::open_root(d.path()).unwrap();
        assert!(Archive::open(root.as_fd(), d.path(), OsStr::new("link.tar")).is_err());
        assert!(
            Archive::open(root.as_fd(), d.path(), OsStr::new("gone.tar"))
                .unwrap()
                .is_none()
        );
    }
}
