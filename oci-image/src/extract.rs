//! `image::extract`: materialise a checkpoint image back into a directory, verifying every blob
//! digest and every layer's diff_id on the way. The reverse of [`crate::build`].
//!
//! Layers are unpacked into a staging directory (0700) beside the destination and renamed into
//! place only after every digest matched, so a damaged or tampered image never leaves a
//! plausible checkpoint directory behind. Entries are created beneath the staging directory
//! with `gpusnap_checkpoint::beneath` (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), never
//! through a path: see [`unpack_tar`] for what is refused.

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use flate2::read::GzDecoder;
use gpusnap_checkpoint::beneath;
use gpusnap_checkpoint::chunks::StreamAssembly;
use rustix::fs::{self as rfs, Mode, OFlags};

use super::annotations::{keys, SourceLayout};
use super::digest::{io_to_image, Digest, HashingReader, Verified, VerifyingReader};
use super::error::ImageError;
use super::interrupt;
use super::oci_layout::{entry_name, ImageSource, RemoveOnDrop};
use super::source::{normalize_member, CHECKPOINT_DIR, ROOTFS_DIFF_TAR};
use super::spec::{layer_compression, Compression, Descriptor, ImageConfig, ImageManifest};
use gpusnap_checkpoint::layout::ORIGIN_FILE;
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
    /// What the origin record says of the signature: the seed's, or, for a pull under
    /// `require` without a registry signature, the directory signature verified.
    pub signature: SignatureCheck,
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

/// Limits for [`extract_with`].
#[derive(Debug, Clone)]
pub struct ExtractOptions {
    /// Largest layer accepted, compressed (its descriptor) or decompressed (a gzip layer is
    /// refused as soon as it inflates past this).
    pub max_layer_bytes: u64,
    /// Keys for encrypted layers (ocicrypt format); none: an encrypted layer is refused.
    pub decryption: crate::crypt::Decryption,
    /// A pull under `restore.signature_policy = require` without a valid registry signature:
    /// the checkpoint directory's own signature must verify before it is put in place
    /// ([`crate::registry::cosign::verify_directory`]).
    pub directory_signature: Option<crate::registry::cosign::DirectorySignatureRequired>,
}

impl Default for ExtractOptions {
    fn default() -> Self {
        ExtractOptions {
            max_layer_bytes: crate::registry::DEFAULT_MAX_BLOB_BYTES,
            decryption: Default::default(),
            directory_signature: None,
        }
    }
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
    extract_with(image, name, dest, seed, &ExtractOptions::default())
}

/// Like [`extract_as`], with limits.
pub fn extract_with(
    image: &Path,
    name: Option<&str>,
    dest: &Path,
    seed: &OriginSeed,
    opts: &ExtractOptions,
) -> Result<Extracted, ImageError> {
    let started = std::time::Instant::now();
    let src = ImageSource::open(image)?;
    let resolved = src.resolve(name)?;
    let plan = ExtractPlan::new(
        &resolved.manifest,
        &resolved.config,
        resolved.manifest_desc.digest.clone(),
        entry_name(&resolved.top).map(str::to_owned),
        &src.location(),
        opts,
    )?;
    let staging = Staging::create(dest)?;
    plan.check_space(&staging)?;
    let mut dir_times = Vec::new();
    for layer in &plan.layers {
        let blob = src.blob(&layer.desc, "layer")?;
        unpack_layer(
            blob,
            layer,
            staging.root(),
            opts,
            staging.budget(),
            &mut dir_times,
            None,
        )?;
    }
    let extracted = staging.finish(&plan, dir_times, seed, opts.directory_signature.as_ref())?;
    tracing::info!(
        image = %src.location(),
        dest = %dest.display(),
        manifest_digest = %plan.manifest_digest,
        layers = plan.layers.len(),
        layer_bytes = extracted.layer_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image extracted"
    );
    Ok(extracted)
}

/// One layer to unpack, checked against the manifest and config before any byte is read.
#[derive(Debug, Clone)]
pub(crate) struct PlannedLayer {
    pub(crate) desc: Descriptor,
    pub(crate) diff_id: Digest,
    compression: Compression,
    /// The most a compressed layer may inflate to: `max_layer_bytes`, or less where the
    /// descriptor declares its uncompressed size.
    inflate_limit: u64,
    /// `<image> layer <i> (<digest>)`, for errors.
    pub(crate) location: String,
    /// An encrypted layer's unwrapped key.
    key: Option<std::sync::Arc<gpusnap_image_crypt::LayerKey>>,
}

impl PlannedLayer {
    /// What the image says the layer carries (a hint for the order of a pull, never trusted
    /// for what the layer may contain).
    pub(crate) fn role(&self) -> super::annotations::LayerRole {
        self.desc
            .annotations
            .get(keys::GPUSNAP_LAYER_ROLE)
            .map_or(super::annotations::LayerRole::Unknown, |r| {
                super::annotations::LayerRole::parse(r)
            })
    }
}

/// What an extraction will do, and what the result is checked against: every refusal that
/// the manifest and config alone justify happens here, before a layer is read or fetched.
#[derive(Debug, Clone)]
pub(crate) struct ExtractPlan {
    pub(crate) layers: Vec<PlannedLayer>,
    source_layout: SourceLayout,
    manifest_digest: Digest,
    annotations: std::collections::BTreeMap<String, String>,
    /// The inflated size the manifest claims for the rootfs diff (a hostile claim: a bound).
    rootfs_inflated: Option<u64>,
    image_name: Option<String>,
    location: String,
}

impl ExtractPlan {
    pub(crate) fn new(
        manifest: &ImageManifest,
        config: &ImageConfig,
        manifest_digest: Digest,
        image_name: Option<String>,
        location: &str,
        opts: &ExtractOptions,
    ) -> Result<ExtractPlan, ImageError> {
        let diff_ids = &config.rootfs.diff_ids;
        if diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::malformed(
                "image config",
                location,
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
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (index, (desc, diff_id)) in manifest.layers.iter().zip(diff_ids).enumerate() {
            let location = format!("{location} layer {index} ({})", desc.digest);
            // Encrypted layers: the key is unwrapped here, so a missing key is refused before
            // any layer is fetched.
            let key = opts.decryption.open(desc, &location)?;
            let plain_type = gpusnap_image_crypt::plain_media_type(&desc.media_type);
            let Some(compression) = layer_compression(plain_type.unwrap_or(&desc.media_type))
            else {
                return Err(ImageError::UnsupportedMediaType {
                    what: "layer",
                    media_type: desc.media_type.clone(),
                    location,
                });
            };
            // An encrypted uncompressed layer's plain stream is checked against the diff_id
            // once decrypted (unpack_layer).
            if key.is_none() && compression == Compression::None && desc.digest != *diff_id {
                // For an uncompressed layer the blob *is* the diff: the two digests must agree.
                return Err(ImageError::malformed(
                    "image config",
                    &location,
                    format!("diff_id {diff_id} differs from the uncompressed layer's digest"),
                ));
            }
            if desc.size > opts.max_layer_bytes {
                return Err(ImageError::TooLarge {
                    what: "layer".into(),
                    name: desc.digest.to_string(),
                    size: desc.size,
                    limit: opts.max_layer_bytes,
                    location,
                    setting: "--max-blob-bytes",
                });
            }
            let declared = match desc.annotations.get(keys::GPUSNAP_LAYER_UNCOMPRESSED_SIZE) {
                None => None,
                Some(v) => Some(v.parse::<u64>().map_err(|_| {
                    ImageError::malformed(
                        "image manifest",
                        &location,
                        format!(
                            "{} is {v:?}, not a byte count",
                            keys::GPUSNAP_LAYER_UNCOMPRESSED_SIZE
                        ),
                    )
                })?),
            };
            layers.push(PlannedLayer {
                desc: desc.clone(),
                diff_id: diff_id.clone(),
                compression,
                inflate_limit: declared
                    .map_or(opts.max_layer_bytes, |d| d.min(opts.max_layer_bytes)),
                location,
                key,
            });
        }
        Ok(ExtractPlan {
            layers,
            source_layout,
            manifest_digest,
            rootfs_inflated: super::inflated::declared(&manifest.annotations, location)?,
            annotations: manifest.annotations.clone(),
            image_name,
            location: location.to_owned(),
        })
    }

    /// The layers fit on the destination's file system: their declared sizes (what an
    /// uncompressed layer writes, and the least a compressed one does, or its declared
    /// uncompressed size) against the free space, before any layer is read or fetched.
    pub(crate) fn check_space(&self, staging: &Staging) -> Result<(), ImageError> {
        let needed = self
            .layers
            .iter()
            .map(|l| match l.compression {
                Compression::None => l.desc.size,
                _ if l.inflate_limit < u64::MAX => l.inflate_limit.max(l.desc.size),
                _ => l.desc.size,
            })
            .fold(0u64, u64::saturating_add)
            // A restore writes the inflated rootfs diff beside the checkpoint.
            .saturating_add(self.rootfs_inflated.unwrap_or(0));
        let budget = staging.budget();
        if needed > budget.free {
            return Err(ImageError::NoSpace {
                what: format!("{} (its {} layers)", self.location, self.layers.len()),
                needed,
                free: budget.free,
                dest: staging.dest().to_path_buf(),
            });
        }
        Ok(())
    }
}

/// What an extraction may write: the bytes free on the destination's file system when it
/// began. Every byte unpacked is charged, from all layers together, so no layer (a gzip bomb
/// above all) fills the disk.
pub(crate) struct DiskBudget {
    free: u64,
    used: AtomicU64,
    dest: PathBuf,
}

impl DiskBudget {
    fn charge(&self, n: u64, location: &str) -> Result<(), ImageError> {
        let used = self.used.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if used > self.free {
            return Err(ImageError::NoSpace {
                what: format!("unpacking {location} (with the layers before it)"),
                needed: used,
                free: self.free,
                dest: self.dest.clone(),
            });
        }
        Ok(())
    }

    /// What is left of the free space.
    fn left(&self) -> u64 {
        self.free.saturating_sub(self.used.load(Ordering::Relaxed))
    }
}

/// The staging directory (0700) an extraction unpacks into, beside the destination; removed
/// on drop unless [`Staging::finish`] renamed it into place.
pub(crate) struct Staging {
    path: PathBuf,
    dest: PathBuf,
    root: Arc<OwnedFd>,
    budget: Arc<DiskBudget>,
    cleanup: RemoveOnDrop,
    /// The directory's lock, held until it is renamed into place or removed (declared after
    /// `cleanup`, so it is let go after the removal).
    _held: crate::staging::Held,
}

impl Staging {
    /// Refuses a non-empty destination, then creates the staging directory.
    pub(crate) fn create(dest: &Path) -> Result<Staging, ImageError> {
        crate::registry::check_destination(dest)?;
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(ImageError::io("creating", &parent))?;
        // Named for this process and locked while it unpacks: if it is killed, the next pull
        // or `gpusnap store gc` removes what it left (`staging`).
        let held = crate::staging::create(dest, crate::staging::Kind::Extract)?;
        let staging = held.path().to_path_buf();
        let cleanup = RemoveOnDrop::new(&staging, true);
        let root = beneath::open_root(&staging).map_err(ImageError::io("opening", &staging))?;
        rfs::fchmod(&root, Mode::from_raw_mode(0o700))
            .map_err(|e| ImageError::io("chmod", &staging)(e.into()))?;
        let free =
            beneath::available_bytes(root.as_fd()).map_err(ImageError::io("statvfs", &staging))?;
        Ok(Staging {
            path: staging,
            dest: dest.to_path_buf(),
            root: Arc::new(root),
            budget: Arc::new(DiskBudget {
                free,
                used: AtomicU64::new(0),
                dest: dest.to_path_buf(),
            }),
            cleanup,
            _held: held,
        })
    }

    /// What unpacking may still write.
    pub(crate) fn budget(&self) -> &DiskBudget {
        &self.budget
    }

    /// The budget, for unpacking on other threads.
    pub(crate) fn shared_budget(&self) -> Arc<DiskBudget> {
        Arc::clone(&self.budget)
    }

    /// Where the result goes.
    pub(crate) fn dest(&self) -> &Path {
        &self.dest
    }

    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The root, for unpacking on other threads.
    pub(crate) fn shared_root(&self) -> Arc<OwnedFd> {
        Arc::clone(&self.root)
    }

    /// Every layer is unpacked and verified: restores directory times, checks the gpusnap
    /// manifest against the image, writes the origin record, syncs the file system once (a
    /// checkpoint that is visible after a crash is complete) and renames the result into place.
    pub(crate) fn finish(
        mut self,
        plan: &ExtractPlan,
        mut dir_times: Vec<(String, u64)>,
        seed: &OriginSeed,
        directory_signature: Option<&crate::registry::cosign::DirectorySignatureRequired>,
    ) -> Result<Extracted, ImageError> {
        let staging = self.path.clone();
        let dest = self.dest.clone();
        // Parents were modified by their children's creation; restore the recorded times
        // last, deepest first.
        dir_times
            .sort_by_key(|(dir, _): &(String, u64)| std::cmp::Reverse(dir.matches('/').count()));
        for (dir, mtime) in &dir_times {
            if let Ok(fd) = beneath::open_dir(self.root(), Path::new(dir)) {
                let _ = File::from(fd).set_modified(UNIX_EPOCH + Duration::from_secs(*mtime));
            }
        }

        // Everything below goes through descriptors of the staging tree: what the layers
        // put there (a symlink where gpusnap writes or reads, a chain of them) is never
        // followed.
        let root = self.root.as_fd();
        let staged_cp = staging.join(CHECKPOINT_DIR);
        // Both layouts stage the checkpoint as `checkpoint/` (a checkpoint-dir image is renamed
        // into place from there).
        let cp_fd = match beneath::open_dir(root, Path::new(CHECKPOINT_DIR)) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::ManifestMissing {
                    source_path: PathBuf::from(&plan.location),
                })
            }
            Err(e) => {
                return Err(ImageError::malformed(
                    "image",
                    &plan.location,
                    format!("{CHECKPOINT_DIR}/ is not a plain directory ({e}); refused"),
                ))
            }
        };
        let gpusnap_manifest =
            read_gpusnap_manifest(cp_fd.as_fd(), &staged_cp, &plan.annotations, &plan.location)?;
        // A chunked image: its files assembled from the chunks and checked against the manifest
        // just verified; the chunks go, so the result is the classic checkpoint directory.
        if let Some(done) = gpusnap_checkpoint::chunks::assemble_opened(cp_fd.as_fd(), &staged_cp)?
        {
            tracing::debug!(
                files = done.files,
                bytes = done.bytes,
                distinct_chunks = done.distinct_chunks,
                "chunked files assembled"
            );
        }
        let diff = staging.join(ROOTFS_DIFF_TAR);
        let rootfs_diff = match beneath::open_file(root, Path::new(ROOTFS_DIFF_TAR)) {
            Ok(file) => Some(self.rootfs_diff_record(file, &diff, plan.rootfs_inflated)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(ImageError::malformed(
                    "image",
                    &plan.location,
                    format!("{ROOTFS_DIFF_TAR} is not a regular file ({e}); refused"),
                ))
            }
        };
        // Under `require` without a registry signature: the directory's own signature, checked
        // on the staged checkpoint, before anything is put in place.
        let signature = match directory_signature {
            Some(req) => crate::registry::cosign::verify_directory(
                &staged_cp,
                &gpusnap_manifest,
                req,
                &seed.source,
                &plan.manifest_digest,
            )?,
            None => seed.signature.clone(),
        };
        let origin = Origin {
            format: ORIGIN_FORMAT,
            source: seed.source.clone(),
            manifest_digest: plan.manifest_digest.to_string(),
            pinned: seed.pinned,
            signature: signature.clone(),
            rootfs_diff,
        };
        let (origin_fd, origin_dir) = match plan.source_layout {
            SourceLayout::CriArchive => (root, &staging),
            SourceLayout::CheckpointDir => (cp_fd.as_fd(), &staged_cp),
        };
        origin
            .write_at(origin_fd)
            .map_err(ImageError::io("writing the origin record in", origin_dir))?;
        rfs::syncfs(&*self.root).map_err(|e| ImageError::io("syncing", &staging)(e.into()))?;

        // Into place: rename(2) replaces an empty destination directory.
        let checkpoint_dir = match plan.source_layout {
            SourceLayout::CriArchive => {
                fs::rename(&staging, &dest)
                    .map_err(ImageError::io("renaming into place", &dest))?;
                self.cleanup.disarm();
                dest.join(CHECKPOINT_DIR)
            }
            SourceLayout::CheckpointDir => {
                // The name is resolved in the staging descriptor: `checkpoint` was opened above
                // as a directory, and rename(2) moves a name, never what it points at.
                rfs::renameat(&*self.root, CHECKPOINT_DIR, rfs::CWD, &dest)
                    .map_err(|e| ImageError::io("renaming into place", &dest)(e.into()))?;
                dest.clone()
            }
        };
        Ok(Extracted {
            root: dest,
            checkpoint_dir,
            source_layout: plan.source_layout,
            image_name: plan.image_name.clone(),
            manifest_digest: plan.manifest_digest.clone(),
            gpusnap_manifest,
            layers: plan.layers.len(),
            layer_bytes: plan.layers.iter().map(|l| l.desc.size).sum(),
            signature,
        })
    }
}

impl Staging {
    /// The origin record's entry for the rootfs diff: its size, SHA-256 and the bytes of file
    /// content it holds once decompressed, counted now and held to the free space left at the
    /// destination (a restore writes that much beside it), so a diff that inflates into a disk
    /// filler is refused here, and a restore writes no more than recorded.
    /// `declared` is the image's claim of that size: the diff is refused as soon as it inflates
    /// past it.
    fn rootfs_diff_record(
        &self,
        file: File,
        shown: &Path,
        declared: Option<u64>,
    ) -> Result<FileDigest, ImageError> {
        let size = file
            .metadata()
            .map_err(ImageError::io("reading", shown))?
            .len();
        let again = file.try_clone().map_err(ImageError::io("reading", shown))?;
        let sha256 = gpusnap_checkpoint::rootfs_diff::sha256_of(file)
            .map_err(ImageError::io("reading", shown))?;
        let cap = self.budget.left();
        let bound = declared.map_or(cap, |d| d.min(cap));
        let content_bytes = gpusnap_checkpoint::rootfs_diff::content_bytes(again, shown, bound)
            .map_err(|e| match e {
                gpusnap_checkpoint::rootfs_diff::DiffError::TooLarge { .. }
                    if declared.is_some_and(|d| d < cap) =>
                {
                    ImageError::malformed(
                        "rootfs diff",
                        shown.display().to_string(),
                        format!(
                            "it inflates past the {} bytes the image's {} declares; refused \
                             (rebuild the image with `gpusnap image build`)",
                            declared.unwrap_or_default(),
                            super::annotations::keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE
                        ),
                    )
                }
                gpusnap_checkpoint::rootfs_diff::DiffError::TooLarge { .. } => {
                    ImageError::NoSpace {
                        what: format!("{ROOTFS_DIFF_TAR}, once decompressed,"),
                        needed: cap.saturating_add(1),
                        free: cap,
                        dest: self.dest.clone(),
                    }
                }
                other => ImageError::malformed("rootfs diff", shown.display().to_string(), other),
            })?;
        Ok(FileDigest {
            size,
            sha256,
            content_bytes: Some(content_bytes),
        })
    }
}

/// For a pull: once the chunk list and the gpusnap manifest are unpacked beneath `staging`,
/// the assembly that takes the chunks of the packs still to come (`None`: the image has no
/// chunk list there, so chunks, if any, are unpacked as files and assembled after the fact).
/// The gpusnap manifest is checked against the image first, as [`Staging::finish`] does; the
/// assembled files are charged to the extraction's disk budget up front.
pub(crate) fn open_chunk_stream(
    plan: &ExtractPlan,
    staging: &Staging,
) -> Result<Option<StreamAssembly>, ImageError> {
    let staged_cp = staging.path.join(CHECKPOINT_DIR);
    let cp_fd = match beneath::open_dir(staging.root(), Path::new(CHECKPOINT_DIR)) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ImageError::io("opening", &staged_cp)(e)),
    };
    let listed = beneath::stat_at(
        cp_fd.as_fd(),
        std::ffi::OsStr::new(gpusnap_checkpoint::chunks::CHUNK_LIST_FILE),
    )
    .map_err(ImageError::io("stat", &staged_cp))?;
    if listed.is_none() {
        return Ok(None);
    }
    read_gpusnap_manifest(cp_fd.as_fd(), &staged_cp, &plan.annotations, &plan.location)?;
    let source = format!("the chunk packs of {}", plan.location);
    let Some(assembly) = StreamAssembly::begin(cp_fd, &staged_cp, source)? else {
        return Ok(None);
    };
    staging
        .budget()
        .charge(assembly.bytes(), "the chunked files")?;
    Ok(Some(assembly))
}

/// Reads (beneath the opened checkpoint directory, capped) and checks the extracted gpusnap
/// manifest against the image's annotation.
fn read_gpusnap_manifest(
    checkpoint_dir: BorrowedFd<'_>,
    shown: &Path,
    annotations: &std::collections::BTreeMap<String, String>,
    location: &str,
) -> Result<Manifest, ImageError> {
    use gpusnap_checkpoint::layout::{MANIFEST_FILE, MANIFEST_MAX_BYTES};
    let path = shown.join(MANIFEST_FILE);
    let bytes =
        match beneath::read_capped(checkpoint_dir, Path::new(MANIFEST_FILE), MANIFEST_MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::ManifestMissing {
                    source_path: PathBuf::from(location),
                })
            }
            Err(e) if beneath::too_large(&e).is_some() => {
                return Err(ImageError::ManifestInvalid {
                    source_path: PathBuf::from(location),
                    reason: e.to_string(),
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
                    location,
                    keys::GPUSNAP_MANIFEST_DIGEST
                ),
            });
        }
    }
    gpusnap_checkpoint::validate::parse_manifest(&bytes, &path).map_err(|e| {
        ImageError::ManifestInvalid {
            source_path: PathBuf::from(location),
            reason: e.to_string(),
        }
    })
}

/// Unpacks one layer read through `blob` (which checks its size and digest) beneath `root`,
/// and checks the decompressed stream against the diff_id for a gzip layer. Nothing it wrote
/// may be trusted unless it returns `Ok`: the blob's digest, as `blob` computed and matched it.
/// With `chunks`, chunk files go into that assembly instead of the chunk directory.
pub(crate) fn unpack_layer<R: Read>(
    mut blob: VerifyingReader<R>,
    layer: &PlannedLayer,
    root: BorrowedFd<'_>,
    opts: &ExtractOptions,
    budget: &DiskBudget,
    dir_times: &mut Vec<(String, u64)>,
    chunks: Option<&StreamAssembly>,
) -> Result<Verified, ImageError> {
    let _ = opts; // the layer's own limits were planned from it
    let location = &layer.location;
    let mut source = crate::crypt::decrypting(layer.key.as_deref(), &mut blob, location)?;
    let diff_digest = {
        // Gzip layers: the decompressed stream is hashed too, against the config's diff_id,
        // and capped.
        let mut decoded: Option<HashingReader<CappedReader<GzDecoder<&mut dyn Read>>>> = None;
        let reader: &mut dyn Read = match layer.compression {
            Compression::None => &mut source,
            Compression::Gzip => decoded.insert(HashingReader::new(CappedReader {
                inner: GzDecoder::new(&mut source as &mut dyn Read),
                limit: layer.inflate_limit,
                read: 0,
                location: location.clone(),
            })),
        };
        match unpack_tar(reader, root, budget, dir_times, location, chunks) {
            Ok(()) => {}
            // A damaged blob explains a refused entry, not the reverse: when the blob's own
            // digest is wrong, that is the error. (Draining is bounded by the blob's size.)
            Err(e) if !matches!(e, ImageError::Interrupted) => {
                drop(decoded);
                // Likewise a failed HMAC explains the garbage a tampered encrypted layer
                // decrypts to (draining is bounded by the blob's size).
                let tampered = source.finish_read(location).err();
                drop(source);
                let e = tampered.unwrap_or(e);
                return Err(match blob.finish() {
                    Err(
                        digest @ (ImageError::DigestMismatch { .. }
                        | ImageError::SizeMismatch { .. }),
                    ) => digest,
                    _ => e,
                });
            }
            Err(e) => return Err(e),
        }
        let diff = match decoded {
            Some(h) => Some(
                h.drain_and_finish()
                    .map_err(|e| io_to_image(e, location))?
                    .0,
            ),
            None => None,
        };
        // An encrypted layer: the rest of the ciphertext, then its HMAC and plain digest. A
        // refusal here fails the extraction, which removes everything unpacked.
        let decrypted = match source.finish_read(location) {
            Ok(d) => d,
            Err(e) => {
                drop(source);
                return Err(match blob.finish() {
                    Err(
                        digest @ (ImageError::DigestMismatch { .. }
                        | ImageError::SizeMismatch { .. }),
                    ) => digest,
                    _ => e,
                });
            }
        };
        drop(source);
        // Uncompressed: the decrypted stream is the diff.
        diff.or(decrypted)
    };
    // The blob digest first: a corrupted blob explains a diff_id mismatch, not the reverse.
    let verified = blob.finish_verified()?;
    if let Some(actual) = diff_digest {
        if actual != layer.diff_id {
            return Err(ImageError::DigestMismatch {
                what: "layer diff_id".into(),
                expected: layer.diff_id.clone(),
                actual,
                location: location.clone(),
            });
        }
    }
    Ok(verified)
}

/// Refuses a layer past `limit` bytes once decompressed (a gzip bomb), as soon as it passes.
struct CappedReader<R> {
    inner: R,
    limit: u64,
    read: u64,
    location: String,
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(std::io::Error::other(ImageError::TooLarge {
                what: "layer".into(),
                name: "(decompressed)".into(),
                size: self.read,
                limit: self.limit,
                location: self.location.clone(),
                setting: "--max-blob-bytes",
            }));
        }
        Ok(n)
    }
}

/// Whether `name` is an entry of the chunk directory (`true`), nothing to do with it
/// (`false`), or a refused one (why).
fn chunk_entry(name: &str, kind: tar::EntryType) -> Result<bool, &'static str> {
    use gpusnap_checkpoint::chunks::{ChunkDigest, CHUNK_DIR};
    let Some(rest) = name
        .strip_prefix(CHECKPOINT_DIR)
        .and_then(|r| r.strip_prefix('/'))
        .and_then(|r| r.strip_prefix(CHUNK_DIR))
    else {
        return Ok(false);
    };
    match rest.strip_prefix('/') {
        None if rest.is_empty() && kind.is_dir() => Ok(true),
        Some(hex)
            if ChunkDigest::parse(hex).is_some()
                && (kind.is_file() || kind == tar::EntryType::Continuous) =>
        {
            Ok(true)
        }
        None if !rest.is_empty() => Ok(false), // `.gpusnap-chunksX`: the general rule refuses it
        _ => Err("only regular files named by their SHA-256 belong in the chunk directory;                   refused"),
    }
}

/// Names a symlink entry may not take: what gpusnap and the runtimes open in the checkpoint.
fn reserved_for_files(name: &str) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    !name.contains('/') || last.starts_with("gpusnap-") || name == CHECKPOINT_DIR
}

/// Whether the relative symlink `target`, found at `name`, stays inside the extraction root
/// when resolved lexically from the link's directory.
fn symlink_stays_inside(name: &str, target: &Path) -> bool {
    let mut depth = name.matches('/').count() as i64;
    for c in target.components() {
        match c {
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

fn refuse(location: &str, name: &str, reason: impl std::fmt::Display) -> ImageError {
    ImageError::malformed("layer", location, format!("entry {name:?}: {reason}"))
}

/// An `openat2`/`*at` failure on an entry: the ones the resolution rules produce get a reason.
fn at_error(location: &str, name: &str, e: std::io::Error) -> ImageError {
    let reason = match e.raw_os_error() {
        Some(libc_errno)
            if libc_errno == rustix::io::Errno::NOTDIR.raw_os_error()
                || libc_errno == rustix::io::Errno::LOOP.raw_os_error() =>
        {
            format!("its path passes through a symlink or a non-directory ({e}); refused")
        }
        Some(libc_errno) if libc_errno == rustix::io::Errno::XDEV.raw_os_error() => {
            format!("its path leaves the extraction root ({e}); refused")
        }
        Some(libc_errno) if libc_errno == rustix::io::Errno::EXIST.raw_os_error() => {
            "it appears twice, or overlaps an entry of an earlier layer; refused".to_owned()
        }
        _ => return io_to_image(e, &format!("{location} entry {name:?}")),
    };
    refuse(location, name, reason)
}

/// Unpacks one layer's tar beneath `root` (an open directory): every name is resolved with
/// `openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)` from `root` and every change made with an
/// `*at` call on one name in a trusted parent, so no entry can reach outside the root or through
/// a symlink, including one an earlier entry or layer created. Regular files are created
/// exclusively with mode 0600 and directories get 0700, whatever the tar says; ownership is not
/// taken from the tar. Hard links, device nodes, FIFOs, whiteouts and absolute or escaping
/// symlinks are refused.
fn unpack_tar(
    reader: &mut dyn Read,
    root: BorrowedFd<'_>,
    budget: &DiskBudget,
    dir_times: &mut Vec<(String, u64)>,
    location: &str,
    chunks: Option<&StreamAssembly>,
) -> Result<(), ImageError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| io_to_image(e, location))?;
    for entry in entries {
        interrupt::check()?;
        let mut entry = entry.map_err(|e| io_to_image(e, location))?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            continue;
        }
        let raw = entry
            .path()
            .map_err(|e| io_to_image(e, location))?
            .into_owned();
        let Some(name) = normalize_member(Path::new(location), &raw)? else {
            if kind.is_dir() {
                continue; // "./": the root itself
            }
            return Err(refuse(location, &raw.display().to_string(), "empty name"));
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
        // A chunked image's chunk files: only regular files named by their SHA-256, directly
        // in `checkpoint/.gpusnap-chunks/` (assembled and removed in `Staging::finish`).
        let chunk_entry = chunk_entry(&name, kind).map_err(|r| refuse(location, &name, r))?;
        // Assembled while downloading: a chunk goes straight into the files that use it, and
        // the chunk directory is never made.
        if let (true, Some(assembly)) = (chunk_entry, chunks) {
            if let Some(digest) = name
                .rsplit('/')
                .next()
                .and_then(gpusnap_checkpoint::chunks::ChunkDigest::parse)
                .filter(|_| !kind.is_dir())
            {
                let len = entry
                    .header()
                    .size()
                    .map_err(|e| io_to_image(e, location))?;
                assembly.put(digest, len, &mut entry)?;
            }
            continue;
        }
        // The origin record and gpusnap's temporary files are written by gpusnap alone.
        if !chunk_entry
            && name.rsplit('/').next().is_some_and(|n| {
                n == ORIGIN_FILE
                    || n.starts_with(".gpusnap-")
                    || n.starts_with(&format!(".{ORIGIN_FILE}"))
            })
        {
            return Err(refuse(
                location,
                &name,
                "a name only gpusnap writes (its origin record or a temporary file); refused",
            ));
        }
        // A tar header can carry an mtime past what SystemTime holds (adding it would panic);
        // times are clamped to the end of year 9999, the chunk list's cap too.
        let mtime = entry
            .header()
            .mtime()
            .unwrap_or(0)
            .min(gpusnap_checkpoint::chunks::MAX_MTIME);
        let rel = Path::new(&name);
        let (parent, last) =
            beneath::parent_of(root, rel, Some(0o700)).map_err(|e| at_error(location, &name, e))?;
        if kind.is_dir() {
            match rfs::mkdirat(&parent, &last, Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(rustix::io::Errno::EXIST) => {
                    match beneath::file_type_at(parent.as_fd(), &last)
                        .map_err(|e| at_error(location, &name, e))?
                    {
                        Some(rfs::FileType::Directory) => {}
                        _ => {
                            return Err(refuse(
                                location,
                                &name,
                                "a directory where an earlier entry put something else",
                            ))
                        }
                    }
                }
                Err(e) => return Err(at_error(location, &name, e.into())),
            }
            let fd = beneath::openat2(
                parent.as_fd(),
                Path::new(&last),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| at_error(location, &name, e))?;
            rfs::fchmod(&fd, Mode::from_raw_mode(0o700))
                .map_err(|e| at_error(location, &name, e.into()))?;
            dir_times.push((name, mtime));
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let fd = beneath::openat2(
                parent.as_fd(),
                Path::new(&last),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| at_error(location, &name, e))?;
            let mut file = File::from(fd);
            copy_interruptible(&mut entry, &mut file, budget, location, &name)?;
            rfs::fchmod(&file, Mode::from_raw_mode(0o600))
                .map_err(|e| at_error(location, &name, e.into()))?;
            file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime))
                .map_err(|e| at_error(location, &name, e))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| io_to_image(e, location))?
                .ok_or_else(|| refuse(location, &name, "symlink without a target"))?
                .into_owned();
            if target.is_absolute() {
                return Err(refuse(
                    location,
                    &name,
                    format!("absolute symlink to {}; refused", target.display()),
                ));
            }
            if reserved_for_files(&name) {
                return Err(refuse(
                    location,
                    &name,
                    "a symlink where the checkpoint has its own files; refused",
                ));
            }
            if !symlink_stays_inside(&name, &target) {
                return Err(refuse(
                    location,
                    &name,
                    format!(
                        "symlink to {} leads outside the checkpoint; refused",
                        target.display()
                    ),
                ));
            }
            // Created as data: nothing gpusnap does resolves through it (RESOLVE_NO_SYMLINKS).
            rfs::symlinkat(&target, &parent, &last)
                .map_err(|e| at_error(location, &name, e.into()))?;
        } else {
            let what = match kind {
                tar::EntryType::Link => "a hard link",
                tar::EntryType::Char => "a character device",
                tar::EntryType::Block => "a block device",
                tar::EntryType::Fifo => "a FIFO",
                _ => "an unsupported entry type",
            };
            return Err(ImageError::malformed(
                "layer",
                location,
                format!("entry {name:?} is {what} ({kind:?}); checkpoint images hold only files, directories and symlinks"),
            ));
        }
    }
    Ok(())
}

/// Copies an entry's data, checking for an interruption every few MiB.
fn copy_interruptible(
    from: &mut dyn Read,
    to: &mut File,
    budget: &DiskBudget,
    location: &str,
    name: &str,
) -> Result<(), ImageError> {
    use std::io::Write as _;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        interrupt::check()?;
        // Fill the buffer before writing: a network stream arrives in chunks of a few KiB,
        // and one write per chunk would multiply the system calls for nothing.
        let mut n = 0;
        while n < buf.len() {
            match from.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_to_image(e, location)),
            }
        }
        if n == 0 {
            return Ok(());
        }
        budget.charge(n as u64, location)?;
        to.write_all(&buf[..n])
            .map_err(|e| at_error(location, name, e))?;
    }
}
