//! Restores from a checkpoint image mounted read-only into the pod (a Kubernetes image
//! volume), with nothing done on the node beforehand.
//!
//! The volume holds the image's layers unpacked: the CRI archive layout (`checkpoint/`,
//! `rootfs-diff.tar`, the `.dump` files) or a bare checkpoint directory, and in a chunked image
//! `checkpoint/.gpusnap-chunks/` plus the chunk list instead of the page images. Everything in
//! it is hostile. It cannot be restored in place (CRIU needs the page images whole, and the
//! volume is read-only), so the checkpoint is first *materialized* into a root-only directory
//! of the node:
//!
//! ```text
//! <cache>/<image digest>/checkpoint/     the flat checkpoint: manifest, signature, listing and
//!                                        every file the manifest lists (chunked ones assembled)
//!                       /rootfs-diff.tar the writable layer, copied
//!                       /gpusnap-volume.json  what the copy was made from (root-only record)
//! <cache>/<image digest>.lock            one flock per image: builds, holders and removal
//! <cache>/<image digest>.holders.json    the image volumes (one per pod) that use the copy
//! <cache>/.build-<image digest>.<pid>    a copy being made; renamed into place when complete
//!                  /gpusnap-reserved     the bytes the build said it needs (the node cap)
//! ```
//!
//! - **Refused before anything is copied** when the node's policy is
//!   `restore.signature_policy = require` and the volume's manifest has no signature by a
//!   trusted key (checked on the volume, beneath it, before any file is copied), when the
//!   rootfs diff is past `restore.max_rootfs_diff_bytes`, when the file system lacks room, and
//!   when the copies on the node would hold more than `restore.max_volume_bytes` with this one
//!   (the node store is full; checked under a lock of the whole cache, so that two pods copying
//!   different images at once cannot both pass it).
//! - **Under the restore's one deadline.** The deadline (`deadline.rs`) starts before the copy
//!   and is checked after every file copied, after the assembly and as the copy ends (the
//!   `volume-copy` phase); the transaction's phases run under the same deadline after it.
//! - **Copied beneath the volume, capped.** Only what a restore reads is copied: the manifest
//!   (read capped), its signature, the writable layer's listing, the chunk list and each file
//!   the manifest lists, each opened beneath the volume's checkpoint directory (no symlink
//!   followed, a regular file with one link) and copied up to the size the manifest gives it,
//!   no further; what else the volume holds is never read. Chunked files are assembled from
//!   the volume's chunk directory (`chunks::assemble_at`: every chunk SHA-256-checked, every
//!   file BLAKE3-checked against the manifest before it is renamed into place). With
//!   `restore.page_fill_min_bytes`, the chunked page images of at least that size are not
//!   copied: the record names them, and each restore reads them from its own pod's volume
//!   (`RestoreRequest::in_place`), every 64 MiB piece checked against the verified manifest.
//! - **Then the one restore transaction**, which verifies the copy as every door's
//!   checkpoint: the signature policy on its directory signature, every file against the
//!   manifest, the rootfs diff against the digest taken of the copy, the GPU gate, the
//!   privilege bound, the writable layer under `require`.
//! - **One copy per image per node.** The copy is keyed by the image's digest, which
//!   containerd names the volume's mount directory by after it verified the image it pulled.
//!   Pods that mount the same image share the copy (the second waits on the image's lock while
//!   the first makes it, then restores from it); a pod whose container is started again (the
//!   kubelet's retry after a failed start) finds it made. Keyed by the image rather than by
//!   the checkpoint's manifest, a pod only ever gets a copy of an image containerd mounted for
//!   it: knowing another image's manifest gives nothing.
//! - **Held by the pods' volumes.** Each pod whose container restores from the copy records
//!   its volume's mount directory as a holder. containerd removes that directory when the pod
//!   stops, and [`sweep`] (run before every volume restore, by the shim when a pod's sandbox
//!   goes, and by `gpusnap store gc`) removes every copy whose holders are all gone, and every
//!   build whose process is gone (a shim killed mid-copy); a copy a restore reads, or a build
//!   that runs (both hold the image's lock), is never touched.
//! - **Nothing left after a restore that does not run.** A refused restore (the signature, the
//!   contents, the GPU, the privilege bound) and a failed one (CRIU, the deadline after the
//!   rootfs diff was applied) drop their pod's hold, and the copy goes with the last hold: no
//!   container uses it. The error says which. A copy that could not be made leaves nothing. A
//!   retry copies again from the volume, which containerd keeps mounted (and the image
//!   pulled) for the pod: nothing is pulled again.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpusnap_config::{Config, SignaturePolicy};

use gpusnap_checkpoint::chunks::{self, DirSource, CHUNK_LIST_FILE, MAX_CHUNK_LIST_BYTES};
use gpusnap_checkpoint::layout::{
    LISTING_FILE, LISTING_MAX_BYTES, MANIFEST_MAX_BYTES, SIGNATURE_FILE, SIGNATURE_MAX_BYTES,
};
use gpusnap_checkpoint::{beneath, layout::MANIFEST_FILE, validate};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::bundle_spec::SpecMount;

use crate::deadline::{Changed, Deadline, Phase};
use crate::error::{Error, Result};
use crate::host::Host;
use crate::restore::{RestoreReport, RestoreRequest, RootfsDiff};

/// The directory under `restore.checkpoint_root` that holds the copies.
pub const CACHE_DIR: &str = ".gpusnap-volumes";
/// The checkpoint directory inside a copy (and inside a volume of the archive layout).
const CHECKPOINT_SUBDIR: &str = "checkpoint";
const ROOTFS_DIFF: &str = "rootfs-diff.tar";
/// The record of what a copy was made from.
const RECORD_FILE: &str = "gpusnap-volume.json";
const BUILD_PREFIX: &str = ".build-";
/// Largest holders file read back (one line per pod on the node using the image).
const HOLDERS_MAX_BYTES: u64 = 1 << 20;
/// Largest record read back.
const RECORD_MAX_BYTES: u64 = 64 << 10;
/// In a build directory: the bytes the build reserved of `restore.max_volume_bytes`.
const RESERVED_FILE: &str = "gpusnap-reserved";

/// An image volume to restore from, as the front end found it in the container's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSource {
    /// The volume's mount directory on the host (containerd's, from the spec's bind mount).
    pub mount: PathBuf,
    /// The image's digest (64 lowercase hex digits), the last component of `mount`.
    pub image_digest: String,
    /// Where the container sees it: the mount's destination in the spec.
    pub destination: PathBuf,
    /// How the pod named it, for messages (the annotation's value).
    pub shown: String,
    /// Where copies are made: `<restore.checkpoint_root>/.gpusnap-volumes`.
    pub cache: PathBuf,
    /// The spec's mount the volume was recognised in, exactly as the runtime wrote it:
    /// containerd's read-only bind, or CRI-O's overlay of the image with no upper layer.
    pub spec_mount: SpecMount,
}

impl VolumeSource {
    /// `mount` as containerd names an image volume's directory:
    /// `…/image-volumes/<sandbox id>/<image digest hex>`. `None` when it is not one.
    pub fn digest_of_mount(mount: &Path, sandbox_id: &str) -> Option<String> {
        let digest = mount.file_name()?.to_str()?;
        let sandbox = mount.parent()?;
        let base = sandbox.parent()?;
        let is_hex64 =
            |s: &str| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        (is_hex64(digest)
            && sandbox.file_name()? == OsStr::new(sandbox_id)
            && base.file_name()? == OsStr::new("image-volumes"))
        .then(|| digest.to_owned())
    }

    fn entry(&self) -> PathBuf {
        self.cache.join(&self.image_digest)
    }
}

/// The record written into a copy when it is complete (root-only, never from the volume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    image_digest: String,
    /// SHA-256 (hex) and size of the copied `rootfs-diff.tar`, when the volume had one.
    rootfs_diff: Option<(String, u64)>,
    /// The checkpoint's files assembled from chunks (0: none).
    assembled_files: usize,
    /// The page images not copied: each restore reads them from its own volume's chunks
    /// (`restore.page_fill_min_bytes`), checked against the verified manifest as it reads.
    /// Their entries in the image's chunk list, bound to the manifest before use.
    #[serde(default)]
    in_place: Vec<chunks::ChunkedFile>,
}

/// What [`restore`] did besides the transaction, for the front end's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Materialized {
    /// The copy restored from.
    pub checkpoint_dir: PathBuf,
    /// Made by this restore (false: another pod's restore or an earlier attempt made it).
    pub made: bool,
    pub elapsed_ms: u64,
}

/// Restores `req` (whose `checkpoint_dir` and `rootfs_diff` are filled in here) from the image
/// volume `source`: the copy is found or made, then the one restore transaction runs on it,
/// under one deadline that starts before the copy. A refusal or a failure drops this volume's
/// hold on the copy (and the copy with the last hold), and says so.
pub fn restore(
    source: &VolumeSource,
    mut req: RestoreRequest,
    host: &dyn Host,
) -> Result<(RestoreReport, Materialized)> {
    let id = req.container_id.clone();
    let began = Instant::now();
    let made = materialize(source, &req.config, began).map_err(|e| e.of("restore", &id))?;
    req.began = Some(began);
    req.checkpoint_dir = made.0.checkpoint_dir.clone();
    req.rootfs_diff = made.1;
    if !made.2.is_empty() {
        // This pod's own volume: the copy may have been made from another pod's.
        match open_chunks(source) {
            Ok(chunk_source) => {
                req.in_place = Some(crate::restore::InPlacePages {
                    source: std::sync::Arc::new(chunk_source),
                    files: made.2,
                })
            }
            Err(e) => {
                let released = release(source);
                return Err(e
                    .map_message(|m| format!("{m}; {released}"))
                    .of("restore", &id));
            }
        }
    }
    // What vouches for the copy is its own directory signature, as at the CRI door: the
    // volume brings no registry signature the runtime could check.
    req.signature_evidence = crate::SignatureEvidence::DirectoryOnly;
    req.checkpoint_mount = Some(source.spec_mount.clone());
    match crate::restore::restore(&req, host) {
        Ok(report) => Ok((report, made.0)),
        Err(e) => {
            // Refused or failed, no container runs from the copy: the kubelet's retry
            // creates another container, which copies again if no other pod kept it.
            let released = release(source);
            Err(e.map_message(|m| format!("{m}; {released}")))
        }
    }
}

/// The copy, the rootfs diff in it, and the page images read from the volume's chunks.
type Made = (Materialized, Option<RootfsDiff>, Vec<chunks::ChunkedFile>);

/// Finds or makes the copy of `source`, holding it for `source`'s pod; the restore began at
/// `began` (its deadline counts from there).
fn materialize(source: &VolumeSource, config: &Config, began: Instant) -> Result<Made> {
    let started = Instant::now();
    beneath::create_private_dir(&source.cache).map_err(|e| {
        Error::precondition(format!(
            "cannot create {} for the checkpoint of the image volume at {}: {e}",
            source.cache.display(),
            source.shown
        ))
    })?;
    // Copies whose pods are gone go first, so that the node holds only what runs.
    sweep(&source.cache);
    let cache = beneath::open_root(&source.cache).map_err(|e| io_refusal(&source.cache, e))?;
    let _lock = ImageLock::take(cache.as_fd(), &source.cache, &source.image_digest)?;
    let entry = source.entry();
    let mut holders = Holders::read(cache.as_fd(), &source.image_digest);
    holders.add(&source.mount);
    holders
        .write(cache.as_fd(), &source.image_digest)
        .map_err(|e| io_refusal(&source.cache, e))?;
    let existing = match read_record(cache.as_fd(), &source.image_digest) {
        Some(r) if r.image_digest == source.image_digest => Some(r),
        _ => None,
    };
    let (record, made) = match existing {
        Some(r) => (r, false),
        None => match build(cache.as_fd(), source, config, began) {
            Ok(r) => (r, true),
            Err(e) => {
                // Nothing of a copy that could not be made stays, nor this pod's hold.
                drop_hold_locked(cache.as_fd(), source);
                return Err(e);
            }
        },
    };
    let rootfs_diff = record.rootfs_diff.map(|(sha256, _)| RootfsDiff {
        path: entry.join(ROOTFS_DIFF),
        sha256,
        content_bytes: None,
    });
    let m = Materialized {
        checkpoint_dir: entry.join(CHECKPOINT_SUBDIR),
        made,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    tracing::info!(
        volume = %source.shown,
        image_digest = %source.image_digest,
        dir = %m.checkpoint_dir.display(),
        made = m.made,
        assembled_files = record.assembled_files,
        in_place_files = record.in_place.len(),
        elapsed_ms = m.elapsed_ms,
        "checkpoint of the image volume ready"
    );
    Ok((m, rootfs_diff, record.in_place))
}

/// The chunk directory of `source`'s volume, opened beneath it (the page images the restore
/// reads where they lie).
fn open_chunks(source: &VolumeSource) -> Result<DirSource> {
    let root = beneath::open_root(&source.mount).map_err(|e| io_refusal(&source.mount, e))?;
    let (vol, rel) = match beneath::open_dir(root.as_fd(), Path::new(CHECKPOINT_SUBDIR)) {
        Ok(fd) => (fd, format!("{CHECKPOINT_SUBDIR}/")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (root, String::new()),
        Err(e) => return Err(io_refusal(&source.mount, e)),
    };
    let shown = format!("{}/{rel}", source.shown.trim_end_matches('/'));
    DirSource::open_in(vol.as_fd(), Path::new(shown.trim_end_matches('/')))
        .map_err(|e| io_refusal(&source.mount, e))?
        .ok_or_else(|| {
            Error::precondition(format!(
                "the image volume at {} has no {shown}.gpusnap-chunks, whose page images the \
                 checkpoint on this node reads from it: mount the image the copy was made from",
                source.shown
            ))
        })
}

/// What dropping a pod's hold did to the node's copy, as the restore's error says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// No other pod held it: the copy was removed (or there was none).
    Removed(PathBuf),
    /// Other pods' volumes hold it: kept for them.
    KeptForOthers(PathBuf, usize),
    /// A restore still reads it: the next sweep removes it.
    InUse(PathBuf),
    /// The hold could not be dropped (why); `gpusnap store gc` removes the copy once the pod
    /// is gone.
    Unknown(PathBuf, String),
}

impl std::fmt::Display for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Released::Removed(p) => write!(
                f,
                "the node's copy of the image volume's checkpoint ({}) was removed: no other pod \
                 uses it",
                p.display()
            ),
            Released::KeptForOthers(p, n) => write!(
                f,
                "the node's copy of the image volume's checkpoint ({}) is kept for the {n} other \
                 pod(s) that use it",
                p.display()
            ),
            Released::InUse(p) => write!(
                f,
                "the node's copy of the image volume's checkpoint ({}) is read by another \
                 restore, and removed after it if no pod holds it",
                p.display()
            ),
            Released::Unknown(p, why) => write!(
                f,
                "this pod's hold on the node's copy of the image volume's checkpoint ({}) could \
                 not be dropped ({why}); `gpusnap store gc` removes the copy once the pod is gone",
                p.display()
            ),
        }
    }
}

/// Drops `source`'s pod's hold on its copy, and the copy when no other pod holds it and no
/// restore reads it.
pub fn release(source: &VolumeSource) -> Released {
    let cache = match beneath::open_root(&source.cache) {
        Ok(c) => c,
        Err(e) => return Released::Unknown(source.entry(), e.to_string()),
    };
    let released = match ImageLock::take(cache.as_fd(), &source.cache, &source.image_digest) {
        Ok(_lock) => drop_hold_locked(cache.as_fd(), source),
        Err(e) => Released::Unknown(source.entry(), e.to_string()),
    };
    tracing::info!(volume = %source.shown, image_digest = %source.image_digest, released = ?released, "hold on the volume's checkpoint dropped");
    released
}

/// [`release`] under the image's lock.
fn drop_hold_locked(cache: BorrowedFd<'_>, source: &VolumeSource) -> Released {
    let entry = source.entry();
    let mut holders = Holders::read(cache, &source.image_digest);
    holders.remove(&source.mount);
    holders.prune();
    if let Err(e) = holders.write(cache, &source.image_digest) {
        tracing::warn!(error = %e, "cannot record the volume checkpoint's holders");
    }
    if !holders.mounts.is_empty() {
        return Released::KeptForOthers(entry, holders.mounts.len());
    }
    // A copy a restore still reads stays; the next sweep removes it.
    match remove_copy(cache, &source.cache, &source.image_digest) {
        Ok(true) => Released::Removed(entry),
        Ok(false) => Released::InUse(entry),
        Err(e) => Released::Unknown(entry, e.to_string()),
    }
}

/// Removes every copy in `cache` whose holders' volumes are all gone, and builds whose
/// process died (a shim killed mid-copy); returns what it removed. Copies in use (their lock
/// held, a restore reading them) and builds that run (they hold the image's lock) are left.
pub fn sweep(cache_path: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(cache) = beneath::open_root(cache_path) else {
        return removed;
    };
    let Ok(names) = beneath::names(cache.as_fd()) else {
        return removed;
    };
    for name in names {
        let Some(name) = name.to_str() else { continue };
        let digest = match name.strip_prefix(BUILD_PREFIX) {
            Some(rest) => rest.split('.').next().unwrap_or_default(),
            None => name
                .strip_suffix(".lock")
                .or_else(|| name.strip_suffix(".holders.json"))
                .unwrap_or(name),
        };
        if !is_digest(digest) {
            continue;
        }
        let Ok(_lock) = ImageLock::try_take(cache.as_fd(), cache_path, digest) else {
            continue;
        };
        // Under the lock no build runs: a build directory is a dead build's.
        if name.starts_with(BUILD_PREFIX) {
            let path = cache_path.join(name);
            match beneath::remove_all_at(cache.as_fd(), OsStr::new(name)) {
                Ok(()) => {
                    tracing::info!(dir = %path.display(), "removed the copy a killed restore left half-made");
                    removed.push(path);
                }
                Err(e) => {
                    tracing::warn!(dir = %path.display(), error = %e, "cannot remove the copy a killed restore left half-made");
                    continue;
                }
            }
            // Then its image's lock and holders, unless a pod holds them.
        }
        let mut holders = Holders::read(cache.as_fd(), digest);
        holders.prune();
        let _ = holders.write(cache.as_fd(), digest);
        if holders.mounts.is_empty() {
            // (Also the holders and lock of a copy never made: its build was killed.)
            let had_copy = name == digest;
            if remove_copy(cache.as_fd(), cache_path, digest).unwrap_or(false) && had_copy {
                removed.push(cache_path.join(digest));
            }
        }
    }
    removed
}

/// Removes the copy `digest` and its holders (under its lock), unless a restore reads it:
/// `Ok(false)` then.
fn remove_copy(cache: BorrowedFd<'_>, cache_path: &Path, digest: &str) -> io::Result<bool> {
    let entry = cache_path.join(digest);
    let checkpoint = entry.join(CHECKPOINT_SUBDIR);
    // A restore holds the checkpoint directory's lock shared from before it reads it.
    let in_use = checkpoint.is_dir() && crate::lock::DirLock::exclusive(&checkpoint).is_err();
    if in_use {
        return Ok(false);
    }
    if let Err(e) = beneath::remove_all_at(cache, OsStr::new(digest)) {
        tracing::warn!(dir = %entry.display(), error = %e, "cannot remove the volume's checkpoint copy");
        return Err(e);
    }
    let _ = beneath::remove_all_at(cache, OsStr::new(&format!("{digest}.holders.json")));
    // The lock file goes last; a waiter on it finds it unlinked and takes the new one.
    let _ = beneath::remove_all_at(cache, OsStr::new(&format!("{digest}.lock")));
    tracing::info!(dir = %entry.display(), "volume checkpoint copy removed");
    Ok(true)
}

fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn io_refusal(path: &Path, e: io::Error) -> Error {
    Error::precondition(format!("{}: {e}", path.display()))
}

/// The flock of one image's copy: `<cache>/<digest>.lock`, taken on a file that is still the
/// one at that name (a remover unlinks it last, after which a waiter takes it again).
struct ImageLock {
    _lock: Flock<File>,
}

impl ImageLock {
    /// Waits for the lock (another pod may be making the copy).
    fn take(cache: BorrowedFd<'_>, shown: &Path, digest: &str) -> Result<ImageLock> {
        Self::lock(cache, shown, digest, FlockArg::LockExclusive)
    }

    fn try_take(cache: BorrowedFd<'_>, shown: &Path, digest: &str) -> Result<ImageLock> {
        Self::lock(cache, shown, digest, FlockArg::LockExclusiveNonblock)
    }

    fn lock(cache: BorrowedFd<'_>, shown: &Path, digest: &str, arg: FlockArg) -> Result<Self> {
        let name = format!("{digest}.lock");
        let path = shown.join(&name);
        for _ in 0..16 {
            let file = open_lock_file(cache, &name).map_err(|e| io_refusal(&path, e))?;
            let lock = Flock::lock(file, arg)
                .map_err(|(_, e)| Error::busy(format!("{}: {e}", path.display())))?;
            let held = lock.metadata().map_err(|e| io_refusal(&path, e))?;
            match beneath::stat_at(cache, OsStr::new(&name)) {
                Ok(Some(st)) if st.st_ino == held.ino() && st.st_dev == held.dev() => {
                    return Ok(ImageLock { _lock: lock })
                }
                // Removed (or replaced) while this waited: take the one there now.
                Ok(_) => continue,
                Err(e) => return Err(io_refusal(&path, e)),
            }
        }
        Err(Error::busy(format!(
            "{} keeps being replaced; try again",
            path.display()
        )))
    }
}

fn open_lock_file(cache: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    // O_CREAT without O_EXCL, never through a symlink: the cache is root-only, 0700.
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    opts.open(beneath::proc_path(cache, OsStr::new(name)))
}

/// The volumes (one per pod) that hold a copy: `<digest>.holders.json`, one mount directory
/// per line.
struct Holders {
    mounts: Vec<PathBuf>,
}

impl Holders {
    fn read(cache: BorrowedFd<'_>, digest: &str) -> Holders {
        let name = format!("{digest}.holders.json");
        let mounts = beneath::read_capped(cache, Path::new(&name), HOLDERS_MAX_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<PathBuf>>(&b).ok())
            .unwrap_or_default();
        Holders { mounts }
    }

    fn add(&mut self, mount: &Path) {
        if !self.mounts.iter().any(|m| m == mount) {
            self.mounts.push(mount.to_path_buf());
        }
    }

    fn remove(&mut self, mount: &Path) {
        self.mounts.retain(|m| m != mount);
    }

    /// Drops the holders whose volume directory is gone (containerd removes it when the pod
    /// stops).
    fn prune(&mut self) {
        self.mounts
            .retain(|m| std::fs::symlink_metadata(m).is_ok_and(|md| md.is_dir()));
    }

    fn write(&self, cache: BorrowedFd<'_>, digest: &str) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.mounts).map_err(io::Error::other)?;
        beneath::write_atomically(
            cache,
            OsStr::new(&format!("{digest}.holders.json")),
            &bytes,
            0o600,
        )
    }
}

/// The record of the complete copy `digest`, if there is one.
fn read_record(cache: BorrowedFd<'_>, digest: &str) -> Option<Record> {
    let rel = Path::new(digest).join(RECORD_FILE);
    let bytes = beneath::read_capped(cache, &rel, RECORD_MAX_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Makes the copy of `source` in a build directory and renames it into place; a failure
/// removes the build directory.
fn build(
    cache: BorrowedFd<'_>,
    source: &VolumeSource,
    config: &Config,
    began: Instant,
) -> Result<Record> {
    let build_name = format!(
        "{BUILD_PREFIX}{}.{}",
        source.image_digest,
        std::process::id()
    );
    let build_path = source.cache.join(&build_name);
    // A copy left half-made by a killed build of this image (or an older, unrecorded copy).
    let _ = beneath::remove_all_at(cache, OsStr::new(&build_name));
    let _ = beneath::remove_all_at(cache, OsStr::new(&source.image_digest));
    let made = (|| {
        mkdir_at(cache, &build_name).map_err(|e| io_refusal(&build_path, e))?;
        let dir = beneath::open_dir(cache, Path::new(&build_name))
            .map_err(|e| io_refusal(&build_path, e))?;
        let record = copy_volume(
            source,
            Build {
                cache,
                name: &build_name,
                dir: dir.as_fd(),
                path: &build_path,
            },
            config,
            began,
        )?;
        let bytes = serde_json::to_vec(&record).map_err(|e| Error::precondition(e.to_string()))?;
        beneath::write_atomically(dir.as_fd(), OsStr::new(RECORD_FILE), &bytes, 0o600)
            .map_err(|e| io_refusal(&build_path, e))?;
        beneath::rename_at(
            cache,
            OsStr::new(&build_name),
            OsStr::new(&source.image_digest),
        )
        .map_err(|e| io_refusal(&build_path, e))?;
        Ok(record)
    })();
    if made.is_err() {
        if let Err(e) = beneath::remove_all_at(cache, OsStr::new(&build_name)) {
            tracing::warn!(dir = %build_path.display(), error = %e, "cannot remove a copy that could not be made; the next restore or `gpusnap store gc` removes it");
        }
    }
    made
}

/// The build directory a copy is made in.
#[derive(Clone, Copy)]
struct Build<'a> {
    /// The cache it is in.
    cache: BorrowedFd<'a>,
    /// Its name there.
    name: &'a str,
    dir: BorrowedFd<'a>,
    path: &'a Path,
}

/// Reserves `needed` bytes of `restore.max_volume_bytes` for the build `b`, refusing when the
/// copies and builds in the cache hold too much for it: under an exclusive lock of the cache
/// directory, so that builds of other images check one after the other, each counting the
/// others' reservations.
fn reserve(source: &VolumeSource, b: Build<'_>, needed: u64, cap: u64) -> Result<()> {
    let cache_dir = beneath::open_root(&source.cache).map_err(|e| io_refusal(&source.cache, e))?;
    let _cap_lock = Flock::lock(File::from(cache_dir), FlockArg::LockExclusive)
        .map_err(|(_, e)| io_refusal(&source.cache, e.into()))?;
    let used = usage(b.cache, b.name).map_err(|e| io_refusal(&source.cache, e))?;
    if used.saturating_add(needed) > cap {
        tracing::warn!(volume = %source.shown, needed, used, cap, "image-volume checkpoint refused: the node store is full");
        return Err(Error::precondition(format!(
            "the node store of image-volume checkpoints ({}) is full: the checkpoint of the \
             image volume at {} needs {needed} bytes, and the copies there already hold {used} \
             of the {cap} bytes restore.max_volume_bytes allows; nothing was copied. Remove pods \
             on this node that restore from other checkpoint images (their copies go with \
             them), run the pod on another node, or raise restore.max_volume_bytes in the \
             node's gpusnap configuration",
            source.cache.display(),
            source.shown
        )));
    }
    write_new(b.dir, RESERVED_FILE, needed.to_string().as_bytes())
        .map_err(|e| io_refusal(b.path, e))
}

/// What the copies and builds in the cache hold, but the build `except`: every regular file's
/// size; a build counts at least what it reserved.
fn usage(cache: BorrowedFd<'_>, except: &str) -> io::Result<u64> {
    let mut used = 0u64;
    for name in beneath::names(cache)? {
        if name == OsStr::new(except) {
            continue;
        }
        match beneath::stat_at(cache, &name)? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
            // The locks and holders: small, and not what the cap is about.
            _ => continue,
        }
        let dir = match beneath::open_dir(cache, Path::new(&name)) {
            Ok(d) => d,
            // Removed meanwhile (a sweep, a finished build's rename).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut bytes = 0u64;
        let walked = beneath::walk(dir.as_fd(), &mut |_, _, st| {
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                bytes = bytes.saturating_add(st.st_size.max(0) as u64);
            }
            Ok::<(), io::Error>(())
        });
        match walked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if name.as_encoded_bytes().starts_with(BUILD_PREFIX.as_bytes()) {
            let reserved = beneath::read_capped(dir.as_fd(), Path::new(RESERVED_FILE), 64)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            bytes = bytes.max(reserved);
        }
        used = used.saturating_add(bytes);
    }
    Ok(used)
}

fn mkdir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    nix::sys::stat::Mode::from_bits(0o700)
        .ok_or_else(|| io::Error::other("mode"))
        .and_then(|mode| {
            nix::sys::stat::mkdirat(dir, OsStr::new(name), mode).map_err(io::Error::from)
        })
}

/// Copies what a restore reads of the volume into the build directory `b`, under the
/// restore's deadline (begun at `began`).
fn copy_volume(
    source: &VolumeSource,
    b: Build<'_>,
    config: &Config,
    began: Instant,
) -> Result<Record> {
    let (out, out_path) = (b.dir, b.path);
    let max_diff = config.restore.max_rootfs_diff_bytes;
    let shown = |rel: &str| format!("{}/{rel}", source.shown.trim_end_matches('/'));
    let refuse = |what: String| {
        Error::precondition(format!(
            "the image volume at {} does not hold a restorable gpusnap checkpoint: {what}; \
             mount an image built by `gpusnap image build` or pushed by the gpusnap node agent",
            source.shown
        ))
    };
    let root = beneath::open_root(&source.mount).map_err(|e| io_refusal(&source.mount, e))?;
    // The archive layout (`checkpoint/` + `rootfs-diff.tar`), or a bare checkpoint directory.
    let (vol_ckpt, ckpt_rel): (Option<OwnedFd>, &str) =
        match beneath::open_dir(root.as_fd(), Path::new(CHECKPOINT_SUBDIR)) {
            Ok(fd) => (Some(fd), "checkpoint/"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (None, ""),
            Err(e) => return Err(refuse(format!("{}: {e}", shown(CHECKPOINT_SUBDIR)))),
        };
    let vol = vol_ckpt.as_ref().map_or(root.as_fd(), |fd| fd.as_fd());
    let manifest_bytes =
        match beneath::read_capped(vol, Path::new(MANIFEST_FILE), MANIFEST_MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(refuse(format!(
                    "{} is missing",
                    shown(&format!("{ckpt_rel}{MANIFEST_FILE}"))
                )))
            }
            Err(e) => {
                return Err(refuse(format!(
                    "{}: {e}",
                    shown(&format!("{ckpt_rel}{MANIFEST_FILE}"))
                )))
            }
        };
    let manifest_shown = PathBuf::from(shown(&format!("{ckpt_rel}{MANIFEST_FILE}")));
    let manifest = validate::parse_manifest(&manifest_bytes, &manifest_shown)
        .map_err(|e| refuse(e.to_string()))?;
    // An image this node would refuse for its signature costs no copy: the policy is decided
    // on the volume's own manifest and signature, read beneath it, before any file is copied
    // (and again by the transaction on the copy, which restores only the manifest it verified).
    if config.restore.signature_policy == SignaturePolicy::Require {
        let shown_dir = PathBuf::from(shown(ckpt_rel.trim_end_matches('/')));
        crate::signature::admit_at(config, vol, &shown_dir).map_err(|e| {
            e.map_message(|m| {
                format!(
                    "{m}; nothing of the image volume at {} was copied onto the node",
                    source.shown
                )
            })
        })?;
    }

    mkdir_at(out, CHECKPOINT_SUBDIR).map_err(|e| io_refusal(out_path, e))?;
    let out_ckpt = beneath::open_dir(out, Path::new(CHECKPOINT_SUBDIR))
        .map_err(|e| io_refusal(out_path, e))?;
    let out_ckpt_path = out_path.join(CHECKPOINT_SUBDIR);

    // Room for the checkpoint and the rootfs diff, said before anything is written.
    let diff_size = match beneath::stat_at(root.as_fd(), OsStr::new(ROOTFS_DIFF)) {
        Ok(Some(st)) if vol_ckpt.is_some() => Some(st.st_size as u64),
        _ => None,
    };
    // A diff past the setting is refused before anything is copied.
    if let Some(size) = diff_size.filter(|&size| size > max_diff) {
        return Err(refuse(format!(
            "{} is {size} bytes, more than restore.max_rootfs_diff_bytes ({max_diff})",
            shown(ROOTFS_DIFF)
        )));
    }
    // The chunk list, when the image is chunked: which files are assembled from chunks, and
    // which page images are left where they lie (read by the restore from the volume's chunks:
    // `restore.page_fill_min_bytes`, the files of at least that size).
    let list_shown = || shown(&format!("{ckpt_rel}{CHUNK_LIST_FILE}"));
    let list = match beneath::open_file(vol, Path::new(CHUNK_LIST_FILE)) {
        Ok(file) => {
            let bytes = beneath::read_file_capped(file, CHUNK_LIST_FILE, MAX_CHUNK_LIST_BYTES)
                .map_err(|e| refuse(format!("{}: {e}", list_shown())))?;
            Some(
                chunks::ChunkList::parse(&bytes)
                    .map_err(|e| refuse(format!("{}: {e}", list_shown())))?,
            )
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(refuse(format!("{}: {e}", list_shown()))),
    };
    // Where no task can be split (pages other than 4 KiB), a page image read in place would
    // only be written whole for CRIU, once per restore: copy it once per node instead.
    let min_in_place = match config.restore.page_fill_min_bytes {
        min if crate::restore::fill::four_k_pages() => min,
        _ => 0,
    };
    let (in_place, assembled): (Vec<chunks::ChunkedFile>, Vec<chunks::ChunkedFile>) = list
        .as_ref()
        .map(|l| l.files.clone())
        .unwrap_or_default()
        .into_iter()
        .partition(|f| min_in_place > 0 && f.size >= min_in_place && f.path.starts_with("pages-"));
    // What the copy writes: every listed file at its listed size (what a copy or an assembly
    // may write of it), not the manifest's own total, which nothing has checked yet. The page
    // images left in the volume count as well: a restore may write them whole for CRIU (a
    // task it does not split), so the node's cap and free space bound them as if copied.
    let listed = manifest
        .images
        .files
        .iter()
        .fold(0u64, |sum, f| sum.saturating_add(f.size));
    let needed = listed
        .max(manifest.images.total_bytes)
        .saturating_add(diff_size.unwrap_or(0));
    // The restore's one deadline, from what the copy will read (unverified: only ever a
    // larger bound, capped), checked as each file is copied.
    let deadline = Deadline::start_at(began, &config.restore, needed);
    let in_time = || {
        deadline
            .check(Phase::VolumeCopy, Changed::Nothing)
            .map_err(|e| {
                e.map_message(|m| {
                    format!(
                        "{m}; what was copied of the image volume at {} is removed",
                        source.shown
                    )
                })
            })
    };
    let free = beneath::available_bytes(out).map_err(|e| io_refusal(out_path, e))?;
    if needed > free {
        return Err(Error::precondition(format!(
            "the checkpoint of the image volume at {} needs {needed} bytes in {}, which has \
             {free} free; free space there (restore.checkpoint_root)",
            source.shown,
            source.cache.display()
        )));
    }

    reserve(source, b, needed, config.restore.max_volume_bytes)?;

    write_new(out_ckpt.as_fd(), MANIFEST_FILE, &manifest_bytes)
        .map_err(|e| io_refusal(&out_ckpt_path, e))?;
    for (name, cap) in [
        (SIGNATURE_FILE, SIGNATURE_MAX_BYTES),
        (LISTING_FILE, LISTING_MAX_BYTES),
    ] {
        copy_optional(vol, name, cap, out_ckpt.as_fd())
            .map_err(|e| refuse(format!("{}: {e}", shown(&format!("{ckpt_rel}{name}")))))?;
    }
    // The chunk list of the files assembled here (the page images left in the volume are
    // not among them), in the list's own format.
    if let Some(l) = list.as_ref().filter(|_| !assembled.is_empty()) {
        let here = chunks::ChunkList {
            files: assembled.clone(),
            ..l.clone()
        };
        write_new(out_ckpt.as_fd(), CHUNK_LIST_FILE, &here.to_bytes())
            .map_err(|e| io_refusal(&out_ckpt_path, e))?;
    }
    for f in &manifest.images.files {
        // The files assembled from chunks, or read from them, are not in the volume as
        // themselves.
        if assembled.iter().chain(&in_place).any(|c| c.path == f.path) {
            continue;
        }
        copy_listed(vol, &f.path, f.size, out_ckpt.as_fd())
            .map_err(|e| refuse(format!("{}: {e}", shown(&format!("{ckpt_rel}{}", f.path)))))?;
        crate::failpoint::reached(crate::failpoint::VOLUME_COPYING);
        in_time()?;
    }
    let assembled_files = if assembled.is_empty() {
        0
    } else {
        let chunk_source = DirSource::open_in(vol, Path::new(&shown(ckpt_rel)))
            .map_err(|e| {
                refuse(format!(
                    "{}: {e}",
                    shown(&format!("{ckpt_rel}.gpusnap-chunks"))
                ))
            })?
            .ok_or_else(|| {
                refuse(format!(
                    "{} lists chunked files, but {} is missing",
                    shown(&format!("{ckpt_rel}{CHUNK_LIST_FILE}")),
                    shown(&format!("{ckpt_rel}.gpusnap-chunks"))
                ))
            })?;
        let files = chunks::assemble_at(out_ckpt.as_fd(), &out_ckpt_path, &chunk_source)
            .map_err(|e| refuse(e.to_string()))?
            .files;
        crate::failpoint::reached(crate::failpoint::VOLUME_COPYING);
        in_time()?;
        files
    };

    let rootfs_diff = match diff_size {
        None => None,
        Some(size) if size > max_diff => {
            return Err(refuse(format!(
                "{} is {size} bytes, more than restore.max_rootfs_diff_bytes ({max_diff})",
                shown(ROOTFS_DIFF)
            )))
        }
        Some(size) => {
            copy_listed(root.as_fd(), ROOTFS_DIFF, size, out)
                .map_err(|e| refuse(format!("{}: {e}", shown(ROOTFS_DIFF))))?;
            let sha256 = gpusnap_checkpoint::rootfs_diff::sha256_file(&out_path.join(ROOTFS_DIFF))
                .map_err(|e| io_refusal(&out_path.join(ROOTFS_DIFF), e))?;
            Some((sha256, size))
        }
    };
    crate::failpoint::reached(&crate::failpoint::after_phase(Phase::VolumeCopy));
    in_time()?;
    Ok(Record {
        image_digest: source.image_digest.clone(),
        rootfs_diff,
        assembled_files,
        in_place,
    })
}

/// Opens `name` in the volume directory `vol`: beneath it, no symlink, a regular file with one
/// link (another name could be a file outside the image).
fn open_plain(vol: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    let file = beneath::open_file(vol, Path::new(name))?;
    let links = file.metadata()?.nlink();
    if links > 1 {
        return Err(io::Error::other(validate::hard_linked(links)));
    }
    Ok(file)
}

/// Copies the listed file `name` of `size` bytes: refused when it is missing, or holds another
/// number of bytes (read no further than one byte past `size`).
fn copy_listed(vol: BorrowedFd<'_>, name: &str, size: u64, out: BorrowedFd<'_>) -> io::Result<()> {
    let file = match open_plain(vol, name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(io::Error::other(
                "missing (the checkpoint's manifest lists it)",
            ))
        }
        other => other?,
    };
    let found = file.metadata()?.len();
    if found != size {
        return Err(io::Error::other(format!(
            "{found} bytes, where {size} are expected"
        )));
    }
    let mut dst = beneath::create_new(out, OsStr::new(name), 0o600)?;
    let copied = io::copy(&mut file.take(size.saturating_add(1)), &mut dst)?;
    if copied != size {
        return Err(io::Error::other(format!(
            "{copied} bytes read, where {size} are expected"
        )));
    }
    dst.flush()
}

/// Copies `name` when the volume has it, refusing it past `cap` bytes.
fn copy_optional(vol: BorrowedFd<'_>, name: &str, cap: u64, out: BorrowedFd<'_>) -> io::Result<()> {
    let file = match open_plain(vol, name) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    if size > cap {
        return Err(io::Error::other(format!(
            "{size} bytes, more than the {cap} bytes such a file may have"
        )));
    }
    copy_listed(vol, name, size, out)
}

fn write_new(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
    let mut f = beneath::create_new(dir, OsStr::new(name), 0o600)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusnap_checkpoint::Manifest;
    use gpusnap_criu_bridge::CriuFlags;

    /// A node with an image volume of a sealed checkpoint (archive layout) of `page_bytes`.
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().to_path_buf();
            Fixture { _tmp: tmp, root }
        }

        /// A volume of this node's sandbox `sb` holding a sealed checkpoint whose pages are
        /// `page_bytes` long, named by `digest`.
        fn volume(&self, digest: &str, page_bytes: usize) -> VolumeSource {
            let mount = self.root.join("image-volumes/sb").join(digest);
            let ckpt = mount.join(CHECKPOINT_SUBDIR);
            std::fs::create_dir_all(&ckpt).unwrap();
            std::fs::write(ckpt.join("pages-1.img"), vec![7u8; page_bytes]).unwrap();
            std::fs::write(ckpt.join("core-1.img"), b"core").unwrap();
            gpusnap_checkpoint::seal_checkpoint(&ckpt, Manifest::new("c1", CriuFlags::default()))
                .unwrap();
            VolumeSource {
                spec_mount: SpecMount {
                    destination: "/gpusnap/checkpoint".into(),
                    source: mount.to_string_lossy().into_owned(),
                    kind: "bind".into(),
                    options: vec!["rbind".into(), "ro".into()],
                },
                mount,
                image_digest: digest.to_string(),
                destination: PathBuf::from("/gpusnap/checkpoint"),
                shown: "/gpusnap/checkpoint".into(),
                cache: self.cache(),
            }
        }

        fn cache(&self) -> PathBuf {
            self.root.join("checkpoints").join(CACHE_DIR)
        }

        /// Every entry of the cache.
        fn cache_entries(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(self.cache())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    fn digest(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn refusal(r: Result<Made>) -> String {
        let e = r.expect_err("refused");
        assert!(e.outcome().is_none(), "a refusal, not a failure: {e}");
        e.to_string()
    }

    #[test]
    fn the_node_cap_counts_the_copies_there_and_refuses_before_copying() {
        let f = Fixture::new();
        let mut config = Config::default();
        config.restore.max_volume_bytes = 1 << 20;
        let first = f.volume(&digest('a'), 600 << 10);
        let (m, ..) = materialize(&first, &config, Instant::now()).unwrap();
        assert!(m.made && m.checkpoint_dir.join("pages-1.img").is_file());
        // A second image that would take the copies past the cap: refused, saying what to do,
        // and nothing of it is left (the first copy, which a pod holds, stays).
        let second = f.volume(&digest('b'), 600 << 10);
        let e = refusal(materialize(&second, &config, Instant::now()));
        for part in [
            "node store of image-volume checkpoints",
            "is full",
            "restore.max_volume_bytes",
            "nothing was copied",
            "Remove pods",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        let a = digest('a');
        assert_eq!(
            f.cache_entries(),
            vec![a.clone(), format!("{a}.holders.json"), format!("{a}.lock")]
        );
        // With room for both, the second is copied.
        config.restore.max_volume_bytes = 2 << 20;
        materialize(&second, &config, Instant::now()).unwrap();
    }

    #[test]
    fn a_copy_past_the_deadline_is_refused_naming_its_phase_and_leaves_nothing() {
        let f = Fixture::new();
        let mut config = Config::default();
        config.restore.deadline_seconds = 5;
        let v = f.volume(&digest('c'), 4096);
        let began = Instant::now() - std::time::Duration::from_secs(6);
        let e = refusal(materialize(&v, &config, began));
        for part in [
            "within 5s (restore.deadline_seconds)",
            "in the volume-copy phase",
            "nothing was changed",
            "what was copied of the image volume at /gpusnap/checkpoint is removed",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        assert!(f.cache_entries().is_empty(), "{:?}", f.cache_entries());
        // In time, the same volume is copied.
        materialize(&v, &config, Instant::now()).unwrap();
    }

    #[test]
    fn an_unsigned_volume_under_require_is_refused_before_any_file_is_copied() {
        use std::os::unix::fs::PermissionsExt;
        let f = Fixture::new();
        let key = f.root.join("trusted.key");
        let public = f.root.join("trusted.pub");
        for args in [
            vec![
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                key.to_str().unwrap(),
            ],
            vec![
                "pkey",
                "-in",
                key.to_str().unwrap(),
                "-pubout",
                "-out",
                public.to_str().unwrap(),
            ],
        ] {
            let out = std::process::Command::new("openssl")
                .args(&args)
                .output()
                .unwrap();
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        }
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut config = Config::default();
        config.restore.signature_policy = SignaturePolicy::Require;
        config.restore.signature_keys = vec![public];
        let v = f.volume(&digest('d'), 4096);
        // A page the manifest lists is missing from the volume: a copy would be refused for
        // it. The refusal is the signature's, so nothing was copied before it.
        std::fs::remove_file(v.mount.join("checkpoint/pages-1.img")).unwrap();
        let e = refusal(materialize(&v, &config, Instant::now()));
        assert!(
            e.contains("has no signature this node trusts")
                && e.contains("restore.signature_policy = require")
                && e.contains("nothing of the image volume at /gpusnap/checkpoint was copied"),
            "{e}"
        );
        assert!(!e.contains("the checkpoint's manifest lists it"), "{e}");
        assert!(f.cache_entries().is_empty(), "{:?}", f.cache_entries());
    }

    #[test]
    fn sweep_removes_dead_builds_and_unheld_copies_never_held_or_running_ones() {
        let f = Fixture::new();
        let config = Config::default();
        // A copy a pod holds (its volume directory is there), and one whose pod is gone.
        let held = f.volume(&digest('1'), 64);
        materialize(&held, &config, Instant::now()).unwrap();
        let orphan = f.volume(&digest('2'), 64);
        materialize(&orphan, &config, Instant::now()).unwrap();
        std::fs::remove_dir_all(&orphan.mount).unwrap();
        // A build whose restore was killed (no one holds its image's lock), and one that runs.
        let cache = beneath::open_root(&f.cache()).unwrap();
        let dead = format!("{BUILD_PREFIX}{}.4242", digest('3'));
        let running = format!("{BUILD_PREFIX}{}.4243", digest('4'));
        for b in [&dead, &running] {
            mkdir_at(cache.as_fd(), b).unwrap();
            std::fs::write(f.cache().join(b).join("pages-1.img"), b"half").unwrap();
        }
        let _running =
            ImageLock::take(cache.as_fd(), &f.cache(), &digest('4')).expect("lock of the build");
        let mut removed = sweep(&f.cache());
        removed.sort();
        assert_eq!(
            removed,
            vec![f.cache().join(&dead), f.cache().join(digest('2'))]
        );
        let left = f.cache_entries();
        assert!(left.contains(&digest('1')), "{left:?}");
        assert!(left.contains(&running), "{left:?}");
        assert!(!left.iter().any(|n| n.contains(&digest('2'))), "{left:?}");
        assert!(!left.iter().any(|n| n.contains(&digest('3'))), "{left:?}");
    }

    #[test]
    fn only_containerds_image_volume_directories_name_a_digest() {
        let d = "a".repeat(64);
        let ok = PathBuf::from(format!(
            "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1/{d}"
        ));
        assert_eq!(VolumeSource::digest_of_mount(&ok, "sb1"), Some(d.clone()));
        for (path, sandbox) in [
            (ok.clone(), "sb2"),
            (PathBuf::from(format!("/var/lib/x/sb1/{d}")), "sb1"),
            (PathBuf::from("/run/x/image-volumes/sb1/ABC"), "sb1"),
            (
                PathBuf::from(format!("/run/x/image-volumes/sb1/{}", "A".repeat(64))),
                "sb1",
            ),
            (PathBuf::from(format!("/image-volumes/sb1/{d}/..")), "sb1"),
        ] {
            assert_eq!(
                VolumeSource::digest_of_mount(&path, sandbox),
                None,
                "{}",
                path.display()
            );
        }
    }
}
