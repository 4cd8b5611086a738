//! The gpusnap checkpoint directory.
//!
//! - [`layout`]: which files a checkpoint directory holds (CRIU images, GPU extents, the
//!   manifest) and how they are told apart; flat, because CRI unpacks archives without
//!   creating directories.
//! - [`manifest`]: `gpusnap-manifest.json`, written last and atomically; its presence is the
//!   only completeness marker.
//! - [`inventory`]: every file's size and BLAKE3 digests, recorded in the manifest.
//! - [`follow`]: hashing CRIU's page images while the dump writes them, so little is left to
//!   hash once it ends.
//! - [`validate`]: refusing, before any CRIU work, a checkpoint that is incomplete, foreign or
//!   damaged.
//! - [`signature`]: `gpusnap-manifest.json.sig`, the directory's own cosign-format signature
//!   of the manifest, which every restore door can check.
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
pub mod origin;
pub mod rootfs_diff;
pub mod scrub;
pub mod signature;
pub mod validate;

pub use follow::{FollowedInventory, ImageFollower};
pub use inventory::{FileRecord, ImageInventory, InventoryError};
pub use layout::CheckpointLayout;
pub use manifest::{
    seal_checkpoint, seal_checkpoint_with, write_manifest_atomically, GpuProcessRecord, GpuSection,
    HostRecord, Manifest, ManifestError, PhaseTiming, ProcessRecord, MANIFEST_FORMAT_VERSION,
    MANIFEST_KIND,
};
pub use scrub::{begin_checkpoint, scrub_incomplete, ScrubError, ScrubReport};
pub use validate::{
    read_manifest, validate_for_restore, validate_for_restore_with, RestoreRefusal, ValidateOptions,
};
