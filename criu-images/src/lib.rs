//! CRIU's images, read as untrusted input, and the privilege they give restored processes
//! bounded by the spec of the container they are restored into.
//!
//! CRIU's restorer takes each task's credentials, capabilities, securebits, no_new_privs, LSM
//! label and seccomp filters, and the namespaces and mounts it recreates, from the images
//! themselves; runc, containerd and CRI-O hand it none of the spec's. [`bound_by_spec`]
//! refuses, before CRIU runs, a checkpoint whose images give any task more than the restore
//! target's spec allows (see [`bound`] for the rules and why each holds).
//! [`open_files_in_rootfs`] names the files the checkpoint's processes hold open that the
//! root filesystem they are restored onto lacks, which CRIU would fail on mid-restore.
//!
//! # The model
//!
//! [`proto`] holds types generated at build time from CRIU 4.2.1's own `images/*.proto`
//! (`build.rs`: `protox` + `prost-build`, no `protoc`; the files are checked against a
//! committed SHA-256 list), and their descriptors. Before any bound, [`allowlist`] walks every
//! file of the checkpoint directory: a file that is neither gpusnap's, the runtime's nor an
//! image type of [`catalog`] is refused, an image type the catalog refuses is refused, and
//! every entry of an allowed image is decoded against the descriptors ([`schema`]): a field
//! number CRIU 4.2.1 does not have, an enum value it does not define, a field without a row in
//! the rule table ([`rules`]) or one whose row refuses it, is refused with the image, the
//! message and the field. The bounded fields are then checked by [`bound`].
//!
//! [`image`] reads the framing (magics, length-prefixed entries) with caps on every size, and
//! opens files only beneath the checkpoint directory. [`forge`] writes images with the
//! generated types, for tests that play an attacker with write access to a checkpoint.

pub mod allowlist;
pub mod bound;
pub mod caps;
pub mod catalog;
pub mod finding;
pub mod forge;
pub mod image;
pub mod open_files;
pub mod page_split;
pub mod proto;
pub mod rules;
pub mod schema;
pub mod seccomp;

pub use bound::{
    bound_by_spec, bound_by_spec_host, bound_by_spec_on, Host, HostLsm, Refusal, Report,
};
pub use finding::Finding;
pub use image::{ImageDir, ImageError, Kind, Limits};
pub use open_files::{open_files_in_rootfs, OpenFiles, Problem, Unmatched};
