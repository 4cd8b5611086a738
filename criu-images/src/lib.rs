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
//! # Why the messages are written by hand
//!
//! [`proto`] declares, with `prost`'s derive, only the messages and fields the check reads,
//! from CRIU's documented image format (`images/*.proto`: names, field numbers, types), instead
//! of generating code from CRIU's `.proto` files:
//! - the check needs a few dozen fields of a dozen messages, not CRIU's ~70 files;
//! - no `protoc` and no build-time download of CRIU's sources: a fresh CI machine builds this
//!   crate like any other;
//! - prost skips fields a message does not declare, so an entry with everything CRIU writes
//!   (registers, signal state, ...) decodes into the declared fields alone.
//!
//! [`image`] reads the framing (magics, length-prefixed entries) with caps on every size, and
//! opens files only beneath the checkpoint directory. [`forge`] writes images, for tests that
//! play an attacker with write access to a checkpoint.

pub mod bound;
pub mod caps;
pub mod forge;
pub mod image;
pub mod open_files;
pub mod proto;
pub mod seccomp;

pub use bound::{bound_by_spec, bound_by_spec_on, Finding, HostLsm, Refusal, Report};
pub use image::{ImageDir, ImageError, Kind, Limits};
pub use open_files::{open_files_in_rootfs, OpenFiles, Problem, Unmatched};
