//! `image::extract`: materialise a checkpoint image back into a directory, verifying every blob
//! digest and every layer's diff_id on the way. The reverse of [`crate::build`].
//!
//! Layers are unpacked into a staging directory beside the destination and renamed into place
//! only after every digest matched, so a damaged or tampered image never leaves a plausible
//! checkpoint directory behind.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use flate2::read::GzDecoder;

use super::annotations::{keys, SourceLayout};
use super::digest::{io_to_image, Digest, HashingReader};
use super::error::ImageError;
use super::oci_layout::{entry_name, prepare_empty_dir, ImageSource, RemoveOnDrop};
use super::source::{normalize_member, CHECKPOINT_DIR, ROOTFS_DIFF_TAR};
use super::spec::{layer_compression, Compression, Descriptor};
use gpusnap_checkpoint::layout::CheckpointLayout;
use gpusnap_checkpoint::manifest::Manifest;
use gpusnap_checkpoint::origin::{FileDigest, Origin, SignatureCheck, ORIGIN_FORMAT};

/// What [`extract`] produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Extracted {
    /// The destination directory.
    pub root: PathBuf,
    /// The checkpoint directory to restore from: `root/checkpoint` for a CRI-archive image,
    /// `root` itself for an image built from a checkpoint directory.
    pub checkpoint_dir: PathBuf,
    pub source_layout: SourceLayout,
    pub image_name: Option<String>,
    pub manifest_digest: Digest,
    pub gpusnap_manifest: Manifest,
    pub layers: usize,
    /// Sum of the layer blob sizes read.
    pub layer_bytes: u64,
}

/// What [`extract_as`] records about where an extracted checkpoint came from
/// ([`gpusnap_checkpoint::origin`]).
#[derive(Debug, Clone)]
pub struct OriginSeed {
    /// The reference it was pulled by, or the local image.
    pub source: String,
    /// The reference named the manifest digest itself.
    pub pinned: bool,
    pub signature: SignatureCheck,
}

/// Extracts the only image of `image` (an OCI layout directory or oci-archive) into `dest`, which
/// must not exist or be an empty directory.
pub fn extract(image: &Path, dest: &Path) -> Result<Extracted, ImageError> {
    extract_named(image, None, dest)
}

/// Like [`extract`], choosing the image by name when `image` holds several.
pub fn extract_named(
    image: &Path,
    name: Option<&str>,
    dest: &Path,
) -> Result<Extracted, ImageError> {
    let seed = OriginSeed {
        source: image.display().to_string(),
        pinned: false,
        signature: SignatureCheck::NotChecked,
    };
    extract_as(image, name, dest, &seed)
}

/// Like [`extract_named`], recording `seed` in the extracted checkpoint's origin record.
pub fn extract_as(
    image: &Path,
    name: Option<&str>,
    dest: &Path,
    seed: &OriginSeed,
) -> Result<Extracted, ImageError> {
    let started = std::time::Instant::now();
    let src = ImageSource::open(image)?;
    let resolved = src.resolve(name)?;
    let manifest = &resolved.manifest;
    let diff_ids = &resolved.config.rootfs.diff_ids;
    if diff_ids.len() != manifest.layers.len() {
        return Err(ImageError::malformed(
            "image config",
            src.location(),
            format!(
                "{} diff_ids for {} layers",
                diff_ids.len(),
                manifest.layers.len()
            ),
        ));
    }
    let source_layout = manifest
        .annotations
        .get(keys::GPUSNAP_SOURCE_LAYOUT)
        .and_then(|s| SourceLayout::parse(s))
        .unwrap_or(SourceLayout::CriArchive);

    // Refuse a non-empty destination before doing any work.
    if fs::read_dir(dest).is_ok_and(|mut d| d.next().is_some()) || dest.is_file() {
        return Err(ImageError::DestinationExists {
            path: dest.to_path_buf(),
        });
    }
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(ImageError::io("creating", &parent))?;
    let staging = parent.join(format!(
        ".{}.extract-{}",
        dest.file_name()
            .map_or_else(|| "image".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(ImageError::io("removing", &staging))?;
    }
    prepare_empty_dir(&staging)?;
    let mut cleanup = RemoveOnDrop::new(&staging, true);
    let as_root = fs::metadata(&staging)
        .map_err(ImageError::io("reading", &staging))?
        .uid()
        == 0;

    let mut dir_times = Vec::new();
    let mut layer_bytes = 0;
    for (i, (desc, diff_id)) in manifest.layers.iter().zip(diff_ids).enumerate() {
        unpack_layer(&src, desc, diff_id, i, &staging, as_root, &mut dir_times)?;
        layer_bytes += desc.size;
    }
    // Parents were modified by their children's creation; restore the recorded times last,
    // deepest first.
    dir_times.sort_by_key(|(dir, _): &(PathBuf, u64)| std::cmp::Reverse(dir.components().count()));
    for (dir, mtime) in &dir_times {
        if let Ok(f) = File::open(dir) {
            let _ = f.set_modified(UNIX_EPOCH + Duration::from_secs(*mtime));
        }
    }

    let staged_cp = staging.join(CHECKPOINT_DIR);
    let gpusnap_manifest = read_gpusnap_manifest(&staged_cp, &resolved.manifest.annotations, &src)?;
    let diff = staging.join(ROOTFS_DIFF_TAR);
    let rootfs_diff = match fs::symlink_metadata(&diff) {
        Ok(m) if m.is_file() => Some(FileDigest {
            size: m.len(),
            sha256: gpusnap_checkpoint::rootfs_diff::sha256_file(&diff)
                .map_err(ImageError::io("reading", &diff))?,
        }),
        _ => None,
    };
    let origin = Origin {
        format: ORIGIN_FORMAT,
        source: seed.source.clone(),
        manifest_digest: resolved.manifest_desc.digest.to_string(),
        pinned: seed.pinned,
        signature: seed.signature.clone(),
        rootfs_diff,
    };
    let origin_dir = match source_layout {
        SourceLayout::CriArchive => &staging,
        SourceLayout::CheckpointDir => &staged_cp,
    };
    origin
        .write(origin_dir)
        .map_err(ImageError::io("writing the origin record in", origin_dir))?;

    // Into place: rename(2) replaces an empty destination directory.
    let checkpoint_dir = match source_layout {
        SourceLayout::CriArchive => {
            fs::rename(&staging, dest).map_err(ImageError::io("renaming into place", dest))?;
            cleanup.disarm();
            dest.join(CHECKPOINT_DIR)
        }
        SourceLayout::CheckpointDir => {
            fs::rename(&staged_cp, dest).map_err(ImageError::io("renaming into place", dest))?;
            dest.to_path_buf()
        }
    };
    drop(cleanup);
    tracing::info!(
        image = %src.location(),
        dest = %dest.display(),
        manifest_digest = %resolved.manifest_desc.digest,
        layers = manifest.layers.len(),
        layer_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image extracted"
    );
    Ok(Extracted {
        root: dest.to_path_buf(),
        checkpoint_dir,
        source_layout,
        image_name: entry_name(&resolved.top).map(str::to_owned),
        manifest_digest: resolved.manifest_desc.digest.clone(),
        gpusnap_manifest,
        layers: manifest.layers.len(),
        layer_bytes,
    })
}

/// Reads and checks the extracted gpusnap manifest against the image's annotation.
fn read_gpusnap_manifest(
    checkpoint_dir: &Path,
    annotations: &std::collections::BTreeMap<String, String>,
    src: &ImageSource,
) -> Result<Manifest, ImageError> {
    let path = CheckpointLayout::new(checkpoint_dir).manifest_path();
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ImageError::ManifestMissing {
                source_path: PathBuf::from(src.location()),
            })
        }
        Err(e) => return Err(ImageError::io("reading", &path)(e)),
    };
    if let Some(want) = annotations.get(keys::GPUSNAP_MANIFEST_DIGEST) {
        let want = Digest::parse(want)?;
        let got = Digest::of(&bytes);
        if got != want {
            return Err(ImageError::DigestMismatch {
                what: "gpusnap manifest".into(),
                expected: want,
                actual: got,
                location: format!(
                    "{} (annotation {})",
                    src.location(),
                    keys::GPUSNAP_MANIFEST_DIGEST
                ),
            });
        }
    }
    gpusnap_checkpoint::validate::read_manifest(checkpoint_dir).map_err(|e| {
        ImageError::ManifestInvalid {
            source_path: PathBuf::from(src.location()),
            reason: e.to_string(),
        }
    })
}

fn unpack_layer(
    src: &ImageSource,
    desc: &Descriptor,
    diff_id: &Digest,
    index: usize,
    staging: &Path,
    as_root: bool,
    dir_times: &mut Vec<(PathBuf, u64)>,
) -> Result<(), ImageError> {
    let location = format!("{} layer {index} ({})", src.location(), desc.digest);
    let Some(compression) = layer_compression(&desc.media_type) else {
        return Err(ImageError::UnsupportedMediaType {
            what: "layer",
            media_type: desc.media_type.clone(),
            location,
        });
    };
    if compression == Compression::None && desc.digest != *diff_id {
        // For an uncompressed layer the blob *is* the diff: the two digests must agree.
        return Err(ImageError::malformed(
            "image config",
            &location,
            format!("diff_id {diff_id} differs from the uncompressed layer's digest"),
        ));
    }
    let mut blob = src.blob(desc, "layer")?;
    let diff_digest = {
        // Gzip layers: the decompressed stream is hashed too, against the config's diff_id.
        let mut decoded: Option<HashingReader<GzDecoder<&mut dyn Read>>> = None;
        let reader: &mut dyn Read = match compression {
            Compression::None => &mut blob,
            Compression::Gzip => decoded.insert(HashingReader::new(GzDecoder::new(
                &mut blob as &mut dyn Read,
            ))),
        };
        unpack_tar(reader, staging, as_root, dir_times, &location)?;
        match decoded {
            Some(h) => Some(
                h.drain_and_finish()
                    .map_err(|e| io_to_image(e, &location))?
                    .0,
            ),
            None => None,
        }
    };
    // The blob digest first: a corrupted blob explains a diff_id mismatch, not the reverse.
    blob.finish()?;
    if let Some(actual) = diff_digest {
        if actual != *diff_id {
            return Err(ImageError::DigestMismatch {
                what: "layer diff_id".into(),
                expected: diff_id.clone(),
                actual,
                location,
            });
        }
    }
    Ok(())
}

fn unpack_tar(
    reader: &mut dyn Read,
    staging: &Path,
    as_root: bool,
    dir_times: &mut Vec<(PathBuf, u64)>,
    location: &str,
) -> Result<(), ImageError> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_preserve_ownerships(as_root);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let entries = archive.entries().map_err(|e| io_to_image(e, location))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| io_to_image(e, location))?;
        let raw = entry
            .path()
            .map_err(|e| io_to_image(e, location))?
            .into_owned();
        let Some(name) = normalize_member(Path::new(location), &raw)? else {
            continue;
        };
        // gpusnap never writes whiteouts; one means the image is not ours or was altered.
        if name
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with(".wh."))
        {
            return Err(ImageError::malformed(
                "layer",
                location,
                format!("whiteout entry {name:?}"),
            ));
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file()
            || kind.is_dir()
            || kind.is_symlink()
            || kind == tar::EntryType::Continuous)
        {
            return Err(ImageError::malformed(
                "layer",
                location,
                format!("entry {name:?} has unsupported type {kind:?}"),
            ));
        }
        if kind.is_dir() {
            if let Ok(mtime) = entry.header().mtime() {
                dir_times.push((staging.join(&name), mtime));
            }
        }
        let unpacked = entry
            .unpack_in(staging)
            .map_err(|e| io_to_image(e, location))?;
        if !unpacked {
            return Err(ImageError::malformed(
                "layer",
                location,
                format!("entry {name:?} points outside the image root"),
            ));
        }
    }
    Ok(())
}
