//! `gpusnap inspect`: what a checkpoint holds, and whether gpusnap would restore it.
//!
//! Sources are resolved to a manifest (and, when verifying, a directory holding the images);
//! [`inspect_dir`] is the entry point for anything that already has a directory (an extracted
//! archive, a pulled checkpoint image), and [`render`] / [`Inspection::to_json`] print it.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::beneath;
use gpusnap_checkpoint::layout::MANIFEST_FILE;
use gpusnap_checkpoint::layout::MANIFEST_MAX_BYTES;
use gpusnap_checkpoint::{self as bridge, Manifest, RestoreRefusal, ValidateOptions};
use rustix::fs::FileType;
use serde::Serialize;

use crate::term;

/// Where a CRI checkpoint archive keeps the CRIU images (containerd and CRI-O alike).
pub const ARCHIVE_CHECKPOINT_DIR: &str = "checkpoint";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    Directory,
    Archive,
}

/// How much to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Presence, sizes and SHA-256 of every file: what restore does.
    Full,
    /// Presence and sizes only.
    Sizes,
    /// Read the manifest only.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Validation {
    /// Restore would proceed.
    Complete,
    /// Restore would be refused before CRIU runs.
    Refused {
        reason: String,
    },
    NotVerified {
        why: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub source: PathBuf,
    pub kind: SourceKind,
    /// How an archive was compressed (`none` for directories).
    pub compression: Compression,
    /// Directory holding the images and the gpusnap manifest (inside the source for archives).
    pub checkpoint_dir: String,
    /// `None` when the manifest itself is missing or unreadable (then `validation` says why).
    pub manifest: Option<Manifest>,
    pub validation: Validation,
}

impl Inspection {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn is_complete(&self) -> bool {
        self.validation == Validation::Complete
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{}: {}/ holds more than {} of files while its manifest lists {} — not a checkpoint \
         gpusnap wrote; take a new one",
        path.display(),
        ARCHIVE_CHECKPOINT_DIR,
        human_bytes(*limit),
        human_bytes(*listed)
    )]
    TooLarge {
        path: PathBuf,
        limit: u64,
        listed: u64,
    },
}

/// How an archive's bytes are stored; Podman's `--export` writes zstd whatever the file is
/// called (`.tar.gz` included), CRI's exports are plain tar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// From the first bytes of the file, never its name.
    pub fn sniff(magic: &[u8]) -> Compression {
        match magic {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// The tar stream of `path`, decompressed as its magic says.
fn open_tar(path: &Path) -> io::Result<(Compression, Box<dyn Read>)> {
    let mut magic = [0u8; 4];
    let n = File::open(path)?.read(&mut magic)?;
    let compression = Compression::sniff(&magic[..n]);
    let file = io::BufReader::new(File::open(path)?);
    let reader: Box<dyn Read> = match compression {
        Compression::None => Box::new(file),
        // Multi-member: `gzip` of concatenated streams is still one archive.
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(file)?),
    };
    Ok((compression, reader))
}

/// A directory or a tar archive.
pub fn inspect_path(path: &Path, verify: Verify) -> Result<Inspection, InspectError> {
    let io_err = |source| InspectError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if !meta.is_dir() {
        return inspect_archive(path, verify);
    }
    // Everything below `path` is looked at beneath it: a manifest or a `checkpoint/` that is a
    // symlink is never followed out of the tree.
    let root = beneath::open_root(path).map_err(io_err)?;
    let kind_of = |dir: BorrowedFd<'_>, name: &str| {
        beneath::stat_at(dir, OsStr::new(name))
            .map(|st| st.map(|st| FileType::from_raw_mode(st.st_mode)))
    };
    if kind_of(root.as_fd(), MANIFEST_FILE)
        .map_err(io_err)?
        .is_none()
    {
        // An extracted CRI archive holds the images in checkpoint/.
        let inner = path.join(ARCHIVE_CHECKPOINT_DIR);
        match kind_of(root.as_fd(), ARCHIVE_CHECKPOINT_DIR).map_err(io_err)? {
            Some(FileType::Directory) => {
                let fd = beneath::open_dir(root.as_fd(), Path::new(ARCHIVE_CHECKPOINT_DIR))
                    .map_err(|source| InspectError::Io {
                        path: inner.clone(),
                        source,
                    })?;
                if kind_of(fd.as_fd(), MANIFEST_FILE)
                    .map_err(|source| InspectError::Io {
                        path: inner.clone(),
                        source,
                    })?
                    .is_some()
                {
                    return Ok(inspect_dir_at(fd.as_fd(), &inner, verify));
                }
            }
            Some(FileType::Symlink) => {
                let mut insp = inspection_of(path, SourceKind::Directory, Compression::None);
                insp.validation = Validation::Refused {
                    reason: format!(
                        "{} is a symlink: gpusnap never follows a symlink inside a checkpoint \
                         tree (runc and CRIU would read whatever it points at) — give the \
                         directory it should point at instead",
                        inner.display()
                    ),
                };
                return Ok(insp);
            }
            _ => {}
        }
    }
    Ok(inspect_dir_at(root.as_fd(), path, verify))
}

fn inspection_of(source: &Path, kind: SourceKind, compression: Compression) -> Inspection {
    Inspection {
        source: source.to_path_buf(),
        kind,
        compression,
        checkpoint_dir: source.display().to_string(),
        manifest: None,
        validation: Validation::NotVerified {
            why: "manifest only (--no-verify)".to_owned(),
        },
    }
}

/// The extension point: a directory that holds the CRIU images and the gpusnap manifest.
pub fn inspect_dir(dir: &Path, verify: Verify) -> Inspection {
    match beneath::open_root(dir) {
        Ok(fd) => inspect_dir_at(fd.as_fd(), dir, verify),
        Err(source) => {
            let mut insp = inspection_of(dir, SourceKind::Directory, Compression::None);
            insp.validation = refused(&RestoreRefusal::Io {
                path: dir.to_path_buf(),
                source,
            });
            insp
        }
    }
}

/// [`inspect_dir`] of the directory opened as `root` (shown as `dir`): the manifest and every
/// image are read beneath it.
fn inspect_dir_at(root: BorrowedFd<'_>, dir: &Path, verify: Verify) -> Inspection {
    let mut insp = inspection_of(dir, SourceKind::Directory, Compression::None);
    match bridge::validate::read_manifest_at(root, dir) {
        Ok(m) => insp.manifest = Some(m),
        Err(refusal) => {
            insp.validation = refused(&refusal);
            return insp;
        }
    }
    let digests = match verify {
        Verify::None => return insp,
        Verify::Full => true,
        Verify::Sizes => false,
    };
    insp.validation = match bridge::validate_for_restore_at(
        root,
        dir,
        ValidateOptions {
            verify_digests: digests,
        },
    ) {
        Ok(_) if digests => Validation::Complete,
        Ok(_) => Validation::NotVerified {
            why: "files present with the recorded sizes; digests not checked (--sizes-only)"
                .to_owned(),
        },
        Err(r) => refused(&r),
    };
    insp
}

fn refused(r: &RestoreRefusal) -> Validation {
    Validation::Refused {
        reason: r.to_string(),
    }
}

fn normalise(entry_path: &Path) -> PathBuf {
    entry_path
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect()
}

/// A CRI checkpoint archive (`kubelet` / `crictl checkpoint --export`). The manifest is read
/// from `checkpoint/` by streaming the tar (refused unread when its header says it is larger
/// than any manifest); nothing is extracted unless `verify` asks for digests or sizes, and
/// then only `checkpoint/`, into a private temporary directory, through a descriptor of it
/// (regular files and directories only, each created new, nothing followed).
pub fn inspect_archive(path: &Path, verify: Verify) -> Result<Inspection, InspectError> {
    let io_err = |source| InspectError::Io {
        path: path.to_path_buf(),
        source,
    };
    let wanted = Path::new(ARCHIVE_CHECKPOINT_DIR).join(MANIFEST_FILE);
    let inner = format!("{}!/{ARCHIVE_CHECKPOINT_DIR}", path.display());
    let shown_manifest = PathBuf::from(format!("{inner}/{MANIFEST_FILE}"));
    let (compression, stream) = open_tar(path).map_err(io_err)?;
    let mut insp = inspection_of(path, SourceKind::Archive, compression);
    insp.checkpoint_dir = inner.clone();
    let mut manifest_bytes = None;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        if normalise(&entry.path().map_err(io_err)?) == wanted {
            let size = entry.size();
            manifest_bytes = Some(beneath::read_file_capped_from(
                entry,
                &shown_manifest.to_string_lossy(),
                size,
                MANIFEST_MAX_BYTES,
            ));
            break;
        }
    }
    let bytes = match manifest_bytes {
        None => {
            insp.validation = Validation::Refused {
                reason: format!(
                    "not a complete gpusnap checkpoint: {} is missing — the checkpoint \
                     was interrupted or made by another runtime",
                    shown_manifest.display()
                ),
            };
            return Ok(insp);
        }
        Some(Err(e)) if beneath::too_large(&e).is_some() => {
            insp.validation = Validation::Refused {
                reason: format!(
                    "{e} — no gpusnap manifest is that large: this is not a checkpoint gpusnap \
                     sealed; take a new one"
                ),
            };
            return Ok(insp);
        }
        Some(r) => r.map_err(io_err)?,
    };
    // Parsed by the same reader restore uses, so kind/format errors read identically.
    match bridge::validate::parse_manifest(&bytes, &shown_manifest) {
        Ok(m) => insp.manifest = Some(m),
        Err(r) => {
            insp.validation = refused(&r);
            return Ok(insp);
        }
    }
    if verify == Verify::None {
        return Ok(insp);
    }
    let extracted = tempfile::tempdir().map_err(io_err)?;
    let listed = insp.manifest.as_ref().map_or(0, |m| m.images.total_bytes);
    if let Err(refusal) = extract_checkpoint(path, extracted.path(), &inner, listed)? {
        insp.validation = refusal;
        return Ok(insp);
    }
    let scratch = extracted.path().join(ARCHIVE_CHECKPOINT_DIR);
    let mut verified = inspect_dir(&scratch, verify);
    // Paths in messages should name the archive, not the scratch copy.
    if let Validation::Refused { reason } = &mut verified.validation {
        *reason = reason.replace(&scratch.display().to_string(), &inner);
    }
    insp.validation = verified.validation;
    Ok(insp)
}

/// Writes the archive's `checkpoint/` into `into` (a new private directory), through its
/// descriptor: directories are made and regular files created new (`O_EXCL | O_NOFOLLOW`)
/// beneath it; any other entry (a symlink, a hard link, a device) is refused, as restore
/// refuses it in a directory. At most `listed` bytes (what the manifest lists) plus the
/// manifest's own cap are written: anything beyond is not what gpusnap sealed, and a small
/// compressed archive must not fill the disk.
fn extract_checkpoint(
    path: &Path,
    into: &Path,
    inner: &str,
    listed: u64,
) -> Result<Result<(), Validation>, InspectError> {
    let io_err = |source| InspectError::Io {
        path: path.to_path_buf(),
        source,
    };
    let limit = listed.saturating_add(MANIFEST_MAX_BYTES);
    let mut written = 0u64;
    let root = beneath::open_root(into).map_err(io_err)?;
    let (_, stream) = open_tar(path).map_err(io_err)?;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let p = normalise(&entry.path().map_err(io_err)?);
        let Ok(rel) = p.strip_prefix(ARCHIVE_CHECKPOINT_DIR) else {
            continue;
        };
        let shown = format!("{inner}/{}", rel.display());
        let kind = entry.header().entry_type();
        if rel.as_os_str().is_empty() {
            continue; // checkpoint/ itself
        }
        let placed = |e: io::Error| InspectError::Io {
            path: PathBuf::from(&shown),
            source: e,
        };
        match kind {
            tar::EntryType::Directory => {
                let (parent, name) =
                    beneath::parent_of(root.as_fd(), &p, Some(0o700)).map_err(placed)?;
                match rustix::fs::mkdirat(&parent, &name, rustix::fs::Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(placed(e.into())),
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                written = written.saturating_add(entry.size());
                if written > limit {
                    return Err(InspectError::TooLarge {
                        path: path.to_path_buf(),
                        limit,
                        listed,
                    });
                }
                let (parent, name) =
                    beneath::parent_of(root.as_fd(), &p, Some(0o700)).map_err(placed)?;
                let mut out = beneath::create_new(parent.as_fd(), &name, 0o600).map_err(placed)?;
                io::copy(&mut entry, &mut out).map_err(placed)?;
            }
            other => {
                let what = match other {
                    tar::EntryType::Symlink => "a symlink",
                    tar::EntryType::Link => "a hard link",
                    tar::EntryType::Char | tar::EntryType::Block => "a device",
                    tar::EntryType::Fifo => "a FIFO",
                    _ => "not a regular file",
                };
                return Ok(Err(Validation::Refused {
                    reason: format!(
                        "{shown} is {what} — not a regular file nor a directory: runc and CRIU \
                         open the files of a checkpoint by name, following links — copy the \
                         checkpoint again from its source"
                    ),
                }));
            }
        }
    }
    Ok(Ok(()))
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn options_line(m: &Manifest) -> String {
    // The flags the dump ran with; a restore takes its own from the node's configuration.
    m.criu.to_string()
}

fn gpu_lines(m: &Manifest) -> Vec<String> {
    let Some(gpu) = &m.gpu else {
        return vec!["none (CPU-only checkpoint)".to_owned()];
    };
    let mut lines = vec![format!(
        "engine {}, {} CUDA process(es)",
        gpu.engine,
        gpu.processes.len()
    )];
    for p in &gpu.processes {
        let devices = if p.devices.is_empty() {
            "devices unknown".to_owned()
        } else {
            p.devices.join(", ")
        };
        lines.push(format!("  pid {}: {devices}", p.host_pid));
    }
    // Extents are engine-specific (CustomStorage); show how many and how large when present.
    let extents: Vec<&serde_json::Value> = gpu
        .extra
        .get("extents")
        .and_then(|e| e.as_array())
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if !extents.is_empty() {
        let bytes: u64 = extents
            .iter()
            .filter_map(|e| e.get("size").or_else(|| e.get("bytes")))
            .filter_map(serde_json::Value::as_u64)
            .sum();
        lines.push(format!(
            "  {} extent(s), {}",
            extents.len(),
            human_bytes(bytes)
        ));
    }
    for (k, v) in &gpu.extra {
        if k != "extents" && (v.is_string() || v.is_number() || v.is_boolean()) {
            lines.push(format!("  {k}: {v}"));
        }
    }
    lines
}

/// The terminal summary.
pub fn render(insp: &Inspection, width: usize) -> String {
    let mut rows: Vec<(&str, String)> = vec![(
        "Checkpoint",
        format!(
            "{} ({})",
            insp.checkpoint_dir,
            match insp.kind {
                SourceKind::Directory => "directory",
                SourceKind::Archive => match insp.compression {
                    Compression::None => "checkpoint archive",
                    Compression::Gzip => "checkpoint archive, gzip",
                    Compression::Zstd => "checkpoint archive, zstd",
                },
            }
        ),
    )];
    if let Some(m) = &insp.manifest {
        let this_kernel = gpusnap_criu_bridge::kernel_release().unwrap_or_default();
        rows.push(("Container", m.container_id.clone()));
        rows.push((
            "Created",
            format!(
                "{} by gpusnap {} (manifest format {})",
                m.created_at, m.gpusnap_version, m.format_version
            ),
        ));
        rows.push((
            "Host",
            format!(
                "{}, kernel {}{}",
                m.host.arch,
                m.host.kernel_release,
                if m.host.kernel_release == this_kernel {
                    " (same as this host)"
                } else {
                    ""
                }
            ),
        ));
        rows.push((
            "Versions",
            format!(
                "CRIU {}, runc {}",
                m.criu_version.as_deref().unwrap_or("unknown"),
                m.runc_version.as_deref().unwrap_or("unknown")
            ),
        ));
        rows.push(("CRIU flags", options_line(m)));
        let procs: Vec<String> = m
            .processes
            .iter()
            .map(|p| {
                let mut s = match p.container_pid {
                    Some(c) => format!("pid {c} in the container"),
                    None => "pid unknown".to_owned(),
                };
                if let Some(cmd) = &p.command {
                    s.push(' ');
                    s.push_str(&cmd.join(" "));
                }
                s
            })
            .collect();
        rows.push((
            "Processes",
            format!("{}: {}", procs.len(), procs.join(", ")),
        ));
        let timings: Vec<String> = m
            .timings
            .iter()
            .map(|t| format!("{} {} ms", t.name, t.ms))
            .collect();
        rows.push(("Timings", timings.join(", ")));
        rows.push((
            "Images",
            format!(
                "{} files, {} (digest chunk {})",
                m.images.files.len(),
                human_bytes(m.images.total_bytes),
                human_bytes(m.images.chunk_bytes)
            ),
        ));
        for (i, line) in gpu_lines(m).into_iter().enumerate() {
            rows.push((if i == 0 { "GPU" } else { "" }, line));
        }
    }
    rows.push((
        "Validation",
        match &insp.validation {
            Validation::Complete => "complete: restore would proceed".to_owned(),
            Validation::Refused { reason } => format!("REFUSED: {reason}"),
            Validation::NotVerified { why } => format!("not verified: {why}"),
        },
    ));
    let mut out = String::new();
    for (label, value) in rows {
        // Keep the leading spaces of continuation rows (GPU processes) as indentation.
        let lead = value.len() - value.trim_start().len();
        let prefix = format!("{label:<11} {}", &value[..lead]);
        out.push_str(&term::wrap(&prefix, &value, width, 12 + lead));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusnap_checkpoint::{seal_checkpoint, GpuProcessRecord, GpuSection};
    use gpusnap_criu_bridge::CriuFlags;

    fn sealed(gpu: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), vec![7u8; 5000]).unwrap();
        std::fs::write(dir.path().join("inventory.img"), b"inv").unwrap();
        let mut m = Manifest::new("ctr-a", CriuFlags::default());
        m.criu_version = Some("4.2.1".into());
        if gpu {
            let mut extra = serde_json::Map::new();
            extra.insert(
                "extents".into(),
                serde_json::json!([{"size": 1048576}, {"size": 1048576}]),
            );
            m.gpu = Some(GpuSection {
                engine: "posix".into(),
                processes: vec![GpuProcessRecord {
                    host_pid: 77,
                    devices: vec!["GPU-1234".into()],
                    extra: serde_json::Map::new(),
                }],
                extra,
            });
        }
        seal_checkpoint(dir.path(), m).unwrap();
        dir
    }

    #[test]
    fn directory_complete_and_rendered() {
        let dir = sealed(true);
        let insp = inspect_path(dir.path(), Verify::Full).unwrap();
        assert!(insp.is_complete(), "{:?}", insp.validation);
        let text = render(&insp, 200);
        assert!(text.contains("Container   ctr-a"), "{text}");
        assert!(text.contains("CRIU 4.2.1"), "{text}");
        assert!(text.contains("engine posix, 1 CUDA process(es)"), "{text}");
        assert!(text.contains("2 extent(s), 2.0 MiB"), "{text}");
        assert!(text.contains("Validation  complete"), "{text}");
        let narrow = render(&insp, 40);
        assert!(
            narrow
                .lines()
                .all(|l| l.chars().count() <= 40 || !l[12..].trim().contains(' ')),
            "{narrow}"
        );
    }

    #[test]
    fn tampered_directory_is_refused_with_reason() {
        let dir = sealed(false);
        std::fs::write(dir.path().join("pages-1.img"), vec![8u8; 5000]).unwrap();
        let insp = inspect_dir(dir.path(), Verify::Full);
        let Validation::Refused { reason } = &insp.validation else {
            panic!("{:?}", insp.validation)
        };
        assert!(reason.contains("pages-1.img is corrupted"), "{reason}");
        assert!(insp.manifest.is_some(), "manifest still shown");
        // Sizes-only does not see a same-size change.
        assert!(matches!(
            inspect_dir(dir.path(), Verify::Sizes).validation,
            Validation::NotVerified { .. }
        ));
    }

    #[test]
    fn missing_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let insp = inspect_dir(dir.path(), Verify::Full);
        assert!(insp.manifest.is_none());
        assert!(
            matches!(&insp.validation, Validation::Refused { reason } if reason.contains("manifest.json is missing"))
        );
    }

    fn archive_of(dir: &Path, out: &Path) {
        let mut b = tar::Builder::new(File::create(out).unwrap());
        b.append_dir_all("checkpoint", dir).unwrap();
        let spec = b"{}";
        let mut h = tar::Header::new_gnu();
        h.set_size(spec.len() as u64);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(&mut h, "spec.dump", &spec[..]).unwrap();
        b.finish().unwrap();
    }

    #[test]
    fn archive_manifest_and_verification() {
        let dir = sealed(false);
        let tmp = tempfile::tempdir().unwrap();
        let tar_path = tmp.path().join("checkpoint.tar");
        archive_of(dir.path(), &tar_path);
        let quick = inspect_path(&tar_path, Verify::None).unwrap();
        assert_eq!(quick.kind, SourceKind::Archive);
        assert_eq!(quick.manifest.as_ref().unwrap().container_id, "ctr-a");
        assert!(matches!(quick.validation, Validation::NotVerified { .. }));
        let full = inspect_path(&tar_path, Verify::Full).unwrap();
        assert!(full.is_complete(), "{:?}", full.validation);

        std::fs::write(dir.path().join("pages-1.img"), vec![9u8; 5000]).unwrap();
        archive_of(dir.path(), &tar_path);
        let bad = inspect_path(&tar_path, Verify::Full).unwrap();
        let Validation::Refused { reason } = &bad.validation else {
            panic!("{:?}", bad.validation)
        };
        assert!(
            reason.contains("checkpoint.tar!/checkpoint/pages-1.img"),
            "{reason}"
        );
    }

    #[test]
    fn archive_without_manifest_and_compressed_archives() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        std::fs::write(empty.path().join("pages-1.img"), b"x").unwrap();
        let tar_path = tmp.path().join("foreign.tar");
        archive_of(empty.path(), &tar_path);
        let insp = inspect_path(&tar_path, Verify::Full).unwrap();
        assert!(
            matches!(&insp.validation, Validation::Refused { reason } if reason.contains("manifest.json is missing")),
            "{:?}",
            insp.validation
        );
        // A truncated gzip stream is an error naming the file, not a panic.
        let gz = tmp.path().join("x.tar.gz");
        std::fs::write(&gz, [0x1f, 0x8b, 8, 0]).unwrap();
        let err = inspect_path(&gz, Verify::None).unwrap_err();
        assert!(err.to_string().contains("x.tar.gz"), "{err}");
    }

    /// Podman exports zstd (whatever the name says); `gzip` of a CRI archive is common too.
    #[test]
    fn compressed_archives_are_read_and_verified() {
        let dir = sealed(false);
        let tmp = tempfile::tempdir().unwrap();
        let plain = tmp.path().join("plain.tar");
        archive_of(dir.path(), &plain);
        let bytes = std::fs::read(&plain).unwrap();
        let zst = tmp.path().join("podman.tar.gz");
        std::fs::write(&zst, zstd::encode_all(&bytes[..], 3).unwrap()).unwrap();
        let gz = tmp.path().join("cri.tar.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &bytes).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        for (path, want) in [(&zst, Compression::Zstd), (&gz, Compression::Gzip)] {
            let insp = inspect_path(path, Verify::Full).unwrap();
            assert_eq!(insp.compression, want);
            assert!(insp.is_complete(), "{path:?}: {:?}", insp.validation);
            assert_eq!(insp.manifest.as_ref().unwrap().container_id, "ctr-a");
            let text = render(&insp, 200);
            let name = format!("{want:?}").to_lowercase();
            assert!(text.contains(&format!("archive, {name})")), "{text}");
        }
        // Tampering shows through the compression, naming the file inside the archive.
        std::fs::write(dir.path().join("pages-1.img"), vec![1u8; 5000]).unwrap();
        archive_of(dir.path(), &plain);
        let bytes = std::fs::read(&plain).unwrap();
        std::fs::write(&zst, zstd::encode_all(&bytes[..], 3).unwrap()).unwrap();
        let bad = inspect_path(&zst, Verify::Full).unwrap();
        assert!(
            matches!(&bad.validation, Validation::Refused { reason } if reason.contains("podman.tar.gz!/checkpoint/pages-1.img")),
            "{:?}",
            bad.validation
        );
    }

    /// A small archive whose checkpoint/ holds far more than its manifest lists is refused
    /// before it is written out.
    #[test]
    fn oversized_archive_is_refused_before_extraction() {
        let dir = sealed(false);
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("bomb.tar.zst");
        let mut raw = Vec::new();
        {
            let mut b = tar::Builder::new(&mut raw);
            b.append_dir_all("checkpoint", dir.path()).unwrap();
            let mut h = tar::Header::new_gnu();
            let size = MANIFEST_MAX_BYTES + (1 << 20);
            h.set_size(size);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, "checkpoint/zeros.img", io::repeat(0).take(size))
                .unwrap();
            b.finish().unwrap();
        }
        std::fs::write(&path, zstd::encode_all(&raw[..], 3).unwrap()).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 1 << 20);
        let err = inspect_path(&path, Verify::Full).unwrap_err();
        assert!(err.to_string().contains("bomb.tar.zst"), "{err}");
        assert!(err.to_string().contains("manifest lists"), "{err}");
    }

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
