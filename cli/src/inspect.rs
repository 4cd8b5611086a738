//! `gpusnap inspect`: what a checkpoint holds, and whether gpusnap would restore it.
//!
//! Sources are resolved to a manifest (and, when verifying, a directory holding the images);
//! [`inspect_dir`] is the entry point for anything that already has a directory (an extracted
//! archive, a pulled checkpoint image), and [`render`] / [`Inspection::to_json`] print it.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::{
    self as bridge, layout::CheckpointLayout, Manifest, RestoreRefusal, ValidateOptions,
};
use serde::Serialize;

use crate::term;

/// Where a CRI checkpoint archive keeps the CRIU images (containerd and CRI-O alike).
pub const ARCHIVE_CHECKPOINT_DIR: &str = "checkpoint";
/// A manifest larger than this is not a gpusnap manifest; refuse instead of reading it all.
const MANIFEST_MAX_BYTES: u64 = 64 << 20;

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
    let meta = std::fs::metadata(path).map_err(|source| InspectError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        // An extracted CRI archive holds the images in checkpoint/.
        let inner = path.join(ARCHIVE_CHECKPOINT_DIR);
        let dir = if !CheckpointLayout::new(path).manifest_path().exists()
            && CheckpointLayout::new(&inner).manifest_path().exists()
        {
            inner
        } else {
            path.to_path_buf()
        };
        Ok(inspect_dir(&dir, verify))
    } else {
        inspect_archive(path, verify)
    }
}

/// The extension point: a directory that holds the CRIU images and the gpusnap manifest.
pub fn inspect_dir(dir: &Path, verify: Verify) -> Inspection {
    let mut insp = Inspection {
        source: dir.to_path_buf(),
        kind: SourceKind::Directory,
        compression: Compression::None,
        checkpoint_dir: dir.display().to_string(),
        manifest: None,
        validation: Validation::NotVerified {
            why: "manifest only (--no-verify)".to_owned(),
        },
    };
    match bridge::read_manifest(dir) {
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
    insp.validation = match bridge::validate_for_restore_with(
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
/// from `checkpoint/` by streaming the tar; nothing is extracted unless
/// `verify` asks for digests or sizes, and then only `checkpoint/`, into a private temporary
/// directory.
pub fn inspect_archive(path: &Path, verify: Verify) -> Result<Inspection, InspectError> {
    let io_err = |source| InspectError::Io {
        path: path.to_path_buf(),
        source,
    };
    let wanted = Path::new(ARCHIVE_CHECKPOINT_DIR).join(bridge::layout::MANIFEST_FILE);
    let mut manifest_bytes = None;
    let (compression, stream) = open_tar(path).map_err(io_err)?;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        if normalise(&entry.path().map_err(io_err)?) == wanted {
            let mut buf = Vec::new();
            entry
                .by_ref()
                .take(MANIFEST_MAX_BYTES)
                .read_to_end(&mut buf)
                .map_err(io_err)?;
            manifest_bytes = Some(buf);
            break;
        }
    }
    let inner = format!("{}!/{ARCHIVE_CHECKPOINT_DIR}", path.display());
    let mut insp = Inspection {
        source: path.to_path_buf(),
        kind: SourceKind::Archive,
        compression,
        checkpoint_dir: inner.clone(),
        manifest: None,
        validation: Validation::NotVerified {
            why: "manifest only (--no-verify)".to_owned(),
        },
    };
    // Parse through the same reader restore uses, so kind/format errors read identically.
    let scratch = tempfile::tempdir().map_err(io_err)?;
    let layout = CheckpointLayout::new(scratch.path());
    if let Some(bytes) = &manifest_bytes {
        let manifest_path = layout.manifest_path();
        if let Some(parent) = manifest_path.parent() {
            std::fs::create_dir_all(parent).map_err(io_err)?;
        }
        std::fs::write(manifest_path, bytes).map_err(io_err)?;
    }
    match bridge::read_manifest(scratch.path()) {
        Ok(m) => insp.manifest = Some(m),
        Err(RestoreRefusal::ManifestMissing { .. }) => {
            insp.validation = Validation::Refused {
                reason: format!(
                    "not a complete gpusnap checkpoint: {inner}/{} is missing — the checkpoint \
                     was interrupted or made by another runtime",
                    bridge::layout::MANIFEST_FILE
                ),
            };
            return Ok(insp);
        }
        Err(r) => {
            insp.validation = refused(&r);
            return Ok(insp);
        }
    }
    if verify == Verify::None {
        return Ok(insp);
    }
    // What the manifest lists, plus room for the manifest itself: anything beyond is not
    // what gpusnap sealed, and a small compressed archive must not fill the disk.
    let listed = insp.manifest.as_ref().map_or(0, |m| m.images.total_bytes);
    let limit = listed.saturating_add(MANIFEST_MAX_BYTES);
    let mut written = 0u64;
    let extracted = tempfile::tempdir().map_err(io_err)?;
    let (_, stream) = open_tar(path).map_err(io_err)?;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let p = normalise(&entry.path().map_err(io_err)?);
        if p.starts_with(ARCHIVE_CHECKPOINT_DIR) {
            written = written.saturating_add(entry.size());
            if written > limit {
                return Err(InspectError::TooLarge {
                    path: path.to_path_buf(),
                    limit,
                    listed,
                });
            }
            // unpack_in refuses entries that would land outside the directory.
            entry.unpack_in(extracted.path()).map_err(io_err)?;
        }
    }
    let mut verified = inspect_dir(&extracted.path().join(ARCHIVE_CHECKPOINT_DIR), verify);
    // Paths in messages should name the archive, not the scratch copy.
    if let Validation::Refused { reason } = &mut verified.validation {
        *reason = reason.replace(
            &extracted
                .path()
                .join(ARCHIVE_CHECKPOINT_DIR)
                .display()
                .to_string(),
            &inner,
        );
    }
    insp.validation = verified.validation;
    Ok(insp)
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
