//! The restore target's spec bounds what the checkpoint's CRIU images give the restored
//! processes.
//!
//! CRIU restores each task's credentials, capabilities, securebits, no_new_privs, LSM label,
//! seccomp filters, namespaces and mounts from the images, and runc passes it none of the
//! spec's. So before anything changes, the images are checked against the spec of the
//! container being created: `<bundle>/config.json`, which containerd, CRI-O or Podman wrote
//! for this container. The checkpoint's own copy of a spec (`config.dump`, `spec.dump`) is
//! as hostile as its images and is never read here. First the whole checkpoint directory is
//! held against the model of what CRIU 4.2.1 applies (`gpusnap_criu_images::allowlist`:
//! unknown files, image types and fields are refused), then each bounded field against the
//! spec (`gpusnap_criu_images::bound`). The restore runs this before the rootfs diff and
//! runc, on every door, and logs its time as `privilege_check_ms`.

use std::path::Path;

use gpusnap_criu_images::{bound_by_spec, Report};
use oci_spec::runtime::Spec;

use crate::error::{Error, Result};

/// Refuses (nothing changed) a checkpoint whose CRIU images give any task more than `spec`
/// (the bundle's, [`read_spec`]) allows.
pub fn check(spec: &Spec, checkpoint_dir: &Path) -> Result<Report> {
    let started = std::time::Instant::now();
    let report =
        bound_by_spec(checkpoint_dir, spec).map_err(|e| Error::precondition(e.to_string()))?;
    tracing::debug!(
        tasks = report.tasks,
        threads = report.threads,
        files = report.files_read,
        elapsed_us = started.elapsed().as_micros() as u64,
        "CRIU images within the container's spec"
    );
    Ok(report)
}

/// The spec of the container being created: `<bundle>/config.json`, read once per restore
/// for the privilege bound and the root filesystem's path.
pub(crate) fn read_spec(bundle: &Path) -> Result<Spec> {
    let unreadable = |why: String| {
        Error::precondition(format!(
            "cannot read the spec of the container being restored ({}): {why}",
            crate::bundle_spec::path(bundle).display()
        ))
    };
    crate::bundle_spec::BundleSpec::read(bundle)
        .map(crate::bundle_spec::BundleSpec::into_spec)
        .map_err(|e| unreadable(e.to_string()))
}
