//! Forging a real checkpoint's seccomp filters as an attacker with write access to it would:
//! every filter of `seccomp.img` replaced by one `SECCOMP_RET_ALLOW`, then the gpusnap
//! manifest resealed. The cores still say "filter mode, chain N": only the content is weaker.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use gpusnap_criu_images::proto::SeccompEntry;
use gpusnap_criu_images::{forge, ImageDir, Kind, Limits};

/// Replaces every filter in `dir/seccomp.img` by [`forge::allow_all_filter`] (the chain's
/// shape kept); returns how many.
pub fn forge_permissive_filters(dir: &Path) -> Result<usize> {
    let mut images = ImageDir::open(dir, Limits::default())
        .with_context(|| format!("opening {}", dir.display()))?;
    let mut entry: SeccompEntry = images
        .read_one("seccomp.img", Kind::Seccomp)
        .context("reading seccomp.img")?
        .context("the checkpoint has no seccomp.img: its container had no seccomp filter")?;
    ensure!(
        !entry.seccomp_filters.is_empty(),
        "seccomp.img holds no filter"
    );
    for f in &mut entry.seccomp_filters {
        f.filter = forge::allow_all_filter();
    }
    std::fs::write(
        dir.join("seccomp.img"),
        forge::image_of(Kind::Seccomp, &[entry.clone()]),
    )?;
    Ok(entry.seccomp_filters.len())
}

/// [`forge_permissive_filters`] then [`crate::privilege::reseal`].
pub fn forge_permissive_and_reseal(dir: &Path) -> Result<usize> {
    let n = forge_permissive_filters(dir)?;
    crate::privilege::reseal(dir)?;
    Ok(n)
}
