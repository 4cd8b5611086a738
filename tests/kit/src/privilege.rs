//! Forging the CRIU images of a real checkpoint the way an attacker with write access to it
//! would: edit the images with `gpusnap_criu_images::forge`, then reseal the gpusnap manifest
//! (a list of checksums, not a signature) so that every digest matches again.

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use gpusnap_criu_images::forge;
use gpusnap_criu_images::proto::ThreadCoreEntry;

/// Rewrites every `core-<tid>.img` of `dir` with `edit(tid, thread)`; returns how many.
pub fn forge_cores(dir: &Path, edit: impl Fn(u32, &mut ThreadCoreEntry)) -> Result<usize> {
    let mut n = 0;
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(tid) = name
            .strip_prefix("core-")
            .and_then(|n| n.strip_suffix(".img"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = dir.join(&name);
        let forged = forge::edit_core(&fs::read(&path)?, |t| edit(tid, t))
            .with_context(|| format!("forging {name}"))?;
        fs::write(&path, forged)?;
        n += 1;
    }
    ensure!(n > 0, "no core-*.img in {}", dir.display());
    Ok(n)
}

/// Recomputes the manifest's digests over the directory as it is now.
pub fn reseal(dir: &Path) -> Result<()> {
    let manifest = gpusnap_checkpoint::read_manifest(dir)
        .with_context(|| format!("reading the manifest in {}", dir.display()))?;
    gpusnap_checkpoint::seal_checkpoint(dir, manifest)?;
    Ok(())
}

/// [`forge_cores`] then [`reseal`].
pub fn forge_and_reseal(dir: &Path, edit: impl Fn(u32, &mut ThreadCoreEntry)) -> Result<usize> {
    let n = forge_cores(dir, edit)?;
    reseal(dir)?;
    Ok(n)
}

/// The files of a flat directory as a tar, as containerd's `criu.tar` holds a checkpoint.
pub fn tar_flat_dir(dir: &Path) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    for n in names {
        b.append_path_with_name(dir.join(&n), &n)?;
    }
    Ok(b.into_inner()?)
}
