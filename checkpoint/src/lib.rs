//! The gpusnap checkpoint directory.
//!
//! - [`layout`]: which files a checkpoint directory holds (CRIU images, GPU extents, the
//!   manifest, its signature, the origin record) and how they are told apart; flat, because
//!   CRI unpacks archives without creating directories. Also the size cap of every file read
//!   back, the one capped (JSON) reader, and the one rule for checkpoint names under the
//!   checkpoint root. It imports no other module but [`beneath`], so every module may use it.
//! - [`manifest`]: `gpusnap-manifest.json`, written last and atomically; its presence is the
//!   only completeness marker.
//! - [`inventory`]: every file's size and BLAKE3 digests, recorded in the manifest.
//! - [`follow`]: hashing CRIU's page images while the dump writes them, so little is left to
//!   hash once it ends.
//! - [`validate`]: refusing, before any CRIU work, a checkpoint that is incomplete, foreign or
//!   damaged.
//! - [`signature`]: `gpusnap-manifest.json.sig`, the directory's own cosign-format signature
//!   of the manifest, which every restore door can check.
//! - [`spec_grants`]: the privilege-relevant fields of a container's spec, recorded in the
//!   manifest at seal and compared with the restore target's spec.
//! - [`writable_layer`]: the container's writable layer (the overlay's upper layer) described
//!   by its effect on the image, recorded beside the manifest at seal and compared with the
//!   restored container's.
//! - [`node_origin`]: the node's root-only record of the checkpoints it sealed under
//!   `restore.checkpoint_root` or root adopted, for restores by pod annotation.
//! - [`chunks`]: chunked files (content-defined chunks, the chunk list) and their assembly
//!   back into the flat directory before validation.
//! - [`scrub`]: preparing a directory for a new checkpoint and cleaning up after a failed one,
//!   so nothing partial looks complete.
//!
//! ```text
//! begin_checkpoint(dir)             // scrub leftovers, create dir
//! ... CRIU dump, GPU engine ...     // on failure: scrub_incomplete(dir)
//! seal_checkpoint(dir, manifest)    // hash, then write the manifest last
//! validate_for_restore(dir)         // before a restore runs anything
//! ```

pub mod beneath;
pub mod chunks;
pub mod follow;
pub mod inventory;
pub mod layout;
pub mod manifest;
pub mod node_origin;
pub mod origin;
pub mod rootfs_diff;
pub mod scrub;
pub mod signature;
pub mod spec_grants;
pub mod validate;
pub mod writable_layer;

pub use follow::{FollowedInventory, ImageFollower};
pub use inventory::{FileRecord, ImageInventory, InventoryError};
pub use layout::CheckpointLayout;
pub use manifest::{
    seal_checkpoint, seal_checkpoint_with, write_manifest_atomically, ContainerRecord,
    GpuProcessRecord, GpuSection, HostRecord, Manifest, ManifestError, PhaseTiming, ProcessRecord,
    SpecRecord, CONTAINER_RECORD_FORMAT, MANIFEST_FORMAT_VERSION, MANIFEST_KIND,
};
pub use scrub::{begin_checkpoint, scrub_incomplete, ScrubError, ScrubReport};
pub use validate::{
    read_manifest, validate_for_restore, validate_for_restore_at, validate_for_restore_in_place,
    validate_for_restore_with, RestoreRefusal, ValidateOptions,
};
