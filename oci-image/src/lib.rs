//! Combined OCI checkpoint images: build, inspect, extract, push and pull.
//!
//! [`build`] turns a CRI checkpoint archive (what containerd's or CRI-O's `CheckpointContainer`
//! writes) or a bare gpusnap checkpoint directory into an OCI image that both Kubernetes
//! runtimes recognise as a checkpoint image and that still carries gpusnap's GPU state and
//! sealed manifest. [`extract`] is its inverse, [`inspect`] describes one, [`push`] / [`pull`]
//! move one through an OCI distribution registry, and [`pull_extract`] pulls and extracts in
//! one pass (a module above both [`registry`] and extraction). The `gpusnap image ...`
//! subcommands are thin wrappers around these.
//!
//! # Image layout: many layers, all of them plain filesystem layers
//!
//! **What the engines require.** Neither engine reads individual layers of a checkpoint image:
//!
//! - containerd 2.1–2.3 (`CRImportCheckpoint`, `internal/cri/server/container_checkpoint_linux.go`)
//!   computes the image's `ChainID` from *all* `rootfs.diff_ids`, takes a snapshotter `View` of
//!   it, mounts it, and reads `spec.dump`, `config.dump` and `status.dump` at the mount root;
//!   it then copies the whole mount into the container's root directory.
//! - CRI-O (`server/container_restore.go`) calls containers/storage `MountImage` (the union of all
//!   layers) and reads `spec.dump` / `config.dump` at the mount root.
//!
//! So the contract is "the **union** of the layers equals the extracted archive", not "one
//! layer". `checkpointctl build` happens to make one layer because it shells out to `buildah
//! add`; nothing downstream depends on that. What *would* break restore: a layer that is not a
//! filesystem layer. containerd's unpacker (`core/unpack/unpacker.go`) treats descriptors that
//! are not layer media types as non-layers and never applies them, so their files would be
//! missing from the mount and the GPU state would silently not arrive; older containers/image
//! (CRI-O) releases reject an OCI manifest with an unknown layer media type outright
//! (`OCI1FromManifest` → `SupportedOCI1MediaType`). A custom
//! `application/vnd.gpusnap.gpu.extent.v1` media type is therefore *not* used; GPU extents are
//! standard layers told apart by annotation.
//!
//! **What gpusnap builds.** An image index (annotated) → one image manifest (annotated, platform
//! `linux/<arch of the checkpoint host>`) → these `application/vnd.oci.image.layer.v1.tar`
//! layers, all rooted at the archive root, each with an `io.gpusnap.layer.role` annotation:
//!
//! | role | content |
//! |---|---|
//! | `metadata` | `spec.dump`, `config.dump`, `status.dump`, `status`, `container.log`, `dump.log`, `stats-dump`, … (every archive-root file except `rootfs-diff.tar`) |
//! | `criu-images` | `checkpoint/` (all directories, CRIU images, `descriptors.json`, logs) minus GPU extents and the gpusnap manifest |
//! | `rootfs-diff` | `rootfs-diff.tar` |
//! | `gpu-extent` | one per GPU state file `checkpoint/gpusnap-gpu-<name>`, annotated `io.gpusnap.gpu.extent.path` / `.size` |
//! | `gpusnap-manifest` | `checkpoint/gpusnap-manifest.json` alone, last |
//!
//! The union is byte-for-byte the CRI archive, so CRI restore by image works unchanged; each GPU
//! extent is nevertheless its own content-addressed blob, so it can be fetched, deduplicated
//! across checkpoints and verified independently, and the small manifest layer lets
//! [`inspect`] read the gpusnap manifest without touching gigabytes. Paths never overlap between
//! layers (directories live only in `criu-images`, which precedes the extents), so no whiteouts
//! or overrides are ever needed.
//!
//! Layers are **uncompressed**: CRIU pages and GPU memory barely compress, gzip would be the
//! bottleneck, and an uncompressed layer's digest is its `diff_id` (hashed once). Extract also
//! accepts gzip layers, in case a mirror recompressed the image.
//!
//! # Chunked images (the default)
//!
//! Built without `--classic`, an image carries CRIU page images (`pages-*.img`) and GPU state
//! files (`gpusnap-gpu-*`) as content-defined chunks (FastCDC, 256 KiB / 1 MiB / 4 MiB, see
//! [`gpusnap_checkpoint::chunks`]), so identical bytes — a zero region, the same weights in
//! two replicas or in two checkpoints of one model — are stored and moved once. Chunks stay
//! ordinary filesystem layers, so containerd and CRI-O still mount the image as before:
//!
//! | role | content |
//! |---|---|
//! | `metadata` | as above |
//! | `criu-images` | as above, without the chunked files, plus the directory `checkpoint/.gpusnap-chunks/` |
//! | `chunk-list` | `checkpoint/gpusnap-chunks.json`: for each chunked file its size, modification time and ordered `(sha256, length)` chunks |
//! | `rootfs-diff` | as above |
//! | `chunk-pack` | chunk files `checkpoint/.gpusnap-chunks/<sha256 hex>`, each distinct chunk of the image once; annotated `io.gpusnap.chunk.count` |
//! | `gpusnap-manifest` | as above, last |
//!
//! **Packs.** The distinct chunks, in order of first appearance (files sorted by name), are grouped
//! into packs: a pack closes after a chunk whose digest has its low `log2(pack_bytes / avg chunk)`
//! bits zero (128 MiB of new chunks on average), or at four times that. Boundaries therefore follow
//! content, and chunk entries have fixed headers (mode 0600, owner 0:0, mtime 0), so the same run
//! of chunks makes the same pack blob — the same layer digest — in another replica's image and on
//! another node; a zero region is one chunk in one pack. New content that follows a long run of
//! chunks already packed (half a pack: the zeros of a pre-allocated buffer between weights and
//! state) starts a pack of its own, so the pack before it stays the same when only what follows
//! changes. Lower layers are bounded (overlayfs stacks at most 500, Docker uses 125): an image has
//! at most [`Chunking::max_packs`] (64) packs plus five other layers; past that the pack size
//! doubles, which merges packs along the same boundaries.
//!
//! **Assembly.** Every door turns the chunks back into the flat checkpoint directory before
//! anything reads it, with [`gpusnap_checkpoint::chunks::assemble`]: [`extract`] and `gpusnap
//! image pull --extract` on their staging tree (the result is what the classic layout gives,
//! byte for byte and time for time, with no chunk left); the restore transaction on the
//! directory a runtime hands
//! it — containerd's CRI restore from the image (it copies the mounted union), CRI-O's, and
//! Podman's import through gpusnap-runc — under an exclusive lock on the directory. Every
//! assembled file is checked against the sealed gpusnap manifest before it is renamed into
//! place; a hostile list or chunk is refused with nothing assembled left behind. Times are
//! kept: each assembled file gets the modification time the list records (whole seconds, the
//! precision of the classic layout's tar headers), and the checkpoint directory keeps the times
//! it had before assembly created and removed entries in it (extract has set the image's time
//! on it by then; a runtime's copy keeps what that runtime set). A list of the first format,
//! which records no times, still assembles, with files timed at assembly.
//!
//! **Which door takes which.** Every gpusnap door takes both layouts: `pull --extract` +
//! `restore-from`, CRI restore from the image through containerd or CRI-O with gpusnap as the
//! runtime, Podman/CRI-O through gpusnap-runc, `ctr`. A runtime *without* gpusnap (plain runc
//! restoring a gpusnap image, or `checkpointctl` inspecting CRIU pages) would see chunk files
//! instead of `pages-*.img`: build with `gpusnap image build --classic` for those.
//!
//! **Annotations.** containerd's `org.criu.checkpoint.container.name`, CRI-O's
//! `io.kubernetes.cri-o.annotations.checkpoint.name` and Podman's
//! `io.podman.annotations.checkpoint.name`, plus the `org.criu.checkpoint.*` keys checkpointctl
//! defines that `config.dump`, `spec.dump` and the gpusnap manifest can fill, plus
//! `io.gpusnap.manifest.digest` (SHA-256 of the manifest file) and other `io.gpusnap.*` keys —
//! on both the image index and the manifest (see [`annotations`]). `index.json` names the image
//! with `org.opencontainers.image.ref.name` and `io.containerd.image.name`, which `ctr images
//! import` uses.
//!
//! Every blob is addressed and verified by SHA-256; [`extract`] and [`pull`] refuse any blob,
//! manifest or diff_id that does not match. What [`pull`] verifies, in which order, and what a
//! tag pull does *not* verify is in `registry/pull.rs`; signatures in [`registry::cosign`].

pub mod annotations;
mod build;
mod chunked;
pub mod crypt;
pub mod digest;
mod error;
mod extract;
mod inflated;
mod inspect;
pub mod interrupt;
mod layer;
mod oci_layout;
mod parallel;
mod pull_extract;
pub mod registry;
mod source;
pub mod spec;
pub mod staging;

pub use annotations::{keys, LayerRole, SourceLayout};
pub use build::{build, BuildOptions, BuiltImage};
pub use chunked::{ChunkSummary, Chunking};
pub use digest::Digest;
pub use error::ImageError;
pub use extract::{
    extract, extract_as, extract_named, extract_with, ExtractOptions, Extracted, OriginSeed,
};
pub use inspect::{inspect, inspect_named, inspect_with, EncryptionInfo, ImageInfo, ManifestLayer};
pub use pull_extract::pull_extract;
pub use registry::{
    pull, push, push_checkpoint, sign, Credentials, NodeStore, Progress, ProgressSnapshot,
    PullReport, PushReport, Reference, RegistryOptions, SignReport, SignatureOptions, Transfer,
};
pub use source::{CHECKPOINT_DIR, ROOTFS_DIFF_TAR};

use spec::Descriptor;

/// Whether `path` is an OCI image (layout directory or oci-archive, as [`push`] takes) rather
/// than something else, such as a checkpoint for [`push_checkpoint`]. Errors other than "not
/// an image" (unreadable, malformed `oci-layout`) are returned.
pub fn is_image(path: &std::path::Path) -> Result<bool, ImageError> {
    match oci_layout::ImageSource::open(path) {
        Ok(_) => Ok(true),
        Err(ImageError::NotAnImage { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One layer of a checkpoint image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LayerInfo {
    pub role: LayerRole,
    pub descriptor: Descriptor,
    /// Digest of the uncompressed layer (equal to the blob digest for gpusnap's layers).
    pub diff_id: Digest,
    /// For GPU-extent layers: the extent's path relative to the checkpoint directory.
    pub gpu_extent: Option<String>,
}
