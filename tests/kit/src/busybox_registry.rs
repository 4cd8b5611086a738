//! The registry every CRI test starts from: a private [`Registry`] holding the busybox test
//! image under [`BUSYBOX_REPO`], and publishing a checkpoint archive there as a checkpoint
//! image (`gpusnap image build` + `push`, the CLI a node's operator runs).

use std::path::Path;

use anyhow::{Context, Result};

use crate::cmd::gpusnap_ok;
use crate::{paths, Registry};

/// Where the busybox test image lives in the registry.
pub const BUSYBOX_REPO: &str = "gpusnap/busybox:test";

/// A registry holding the busybox test image (pushed with `gpusnap image push`, gpusnap's own
/// registry client, which pushes any OCI image archive).
pub fn registry_with_busybox() -> Result<Registry> {
    let reg = Registry::start()?;
    gpusnap_ok(&[
        "image",
        "push",
        path_str(&paths::busybox_archive())?,
        &reg.url(BUSYBOX_REPO),
    ])
    .context("pushing busybox to the test registry")?;
    Ok(reg)
}

/// `gpusnap image build ARCHIVE -t REF` into `<work>/`, then `gpusnap image push` to
/// `repo_tag` in `reg`; returns the reference CRI pulls (`127.0.0.1:<port>/<repo_tag>`).
pub fn publish_archive(
    reg: &Registry,
    archive: &Path,
    repo_tag: &str,
    work: &Path,
) -> Result<String> {
    let oci = work.join(format!("{}.oci.tar", repo_tag.replace(['/', ':'], "_")));
    let reference = reg.image(repo_tag);
    gpusnap_ok(&[
        "image",
        "build",
        path_str(archive)?,
        "-t",
        &reference,
        "-o",
        path_str(&oci)?,
    ])?;
    gpusnap_ok(&["image", "push", path_str(&oci)?, &reg.url(repo_tag)])?;
    Ok(reference)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}
