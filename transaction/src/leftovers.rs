//! What a failed restore may leave, cleared: processes CRIU restored before it failed or was
//! killed (in the container's cgroup, wherever they are in the process tree), the cgroup
//! itself, runc's state of the id, and CRIU's yards.
//!
//! runc removes its state after a CRIU failure, but a half-restored task that CRIU could not
//! kill (or that outlived a killed CRIU) keeps running in the container's cgroup with whatever
//! CRIU had given it. So after every failed restore the cgroup is emptied, and what could not
//! be killed is named in the error.
//!
//! A CRIU killed mid-restore cannot undo what it set up in the host's mount namespace and
//! file system (CRIU 4.2.1): its cgroup yard, a tmpfs with every cgroup hierarchy mounted
//! below it, in its work directory (`.criu.cgyard.XXXXXX`; a dozen rw mounts of the host's
//! cgroups that keep containerd from removing the bundle), and its mount-namespace yard, an
//! empty 0777 directory in `/tmp` (`.criu.mntns.XXXXXX`). Only ours are touched: the yards in
//! the restore's own work directory (one restore per work directory: CRIU's `restore.log` is
//! there too), and the `/tmp` directories that restore's `restore.log` names; each is
//! detached (lazily, never followed), then removed with `rmdir` (never recursively).

use std::fmt;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpusnap_checkpoint::beneath;
use gpusnap_criu_bridge::{classify_runc_error, RuncErrorKind};

use crate::host::{Runc, RuncFailure};

/// How long the killed processes of a failed restore get to disappear.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Why runc's state of a container could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum RuncStateError {
    /// `runc delete --force` failed, for another reason than an unknown container.
    #[error("{0}")]
    Delete(#[source] RuncFailure),
    /// An entry of runc's directory of a container without `state.json` could not be removed.
    #[error("cannot remove {}: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What clearing a failed restore found and did.
#[derive(Debug, Default)]
pub struct Cleared {
    /// Processes of the restore killed in the container's cgroup.
    pub killed: usize,
    /// Pids still in the cgroup afterwards (not killable: e.g. stuck in the kernel).
    pub remaining: Vec<u32>,
    /// The cgroup directories looked at.
    pub cgroups: Vec<PathBuf>,
    /// runc's state of the id could not be removed.
    pub runc_state_left: Option<String>,
    /// CRIU's yards found and removed.
    pub yards_removed: Vec<PathBuf>,
    /// CRIU's yards that could not be removed, and why.
    pub yards_left: Vec<(PathBuf, String)>,
}

impl Cleared {
    /// Nothing of the checkpoint runs any more.
    pub fn nothing_left(&self) -> bool {
        self.remaining.is_empty()
    }
}

impl fmt::Display for Cleared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.killed > 0 {
            write!(
                f,
                "{} restored process(es) were killed in the container's cgroup",
                self.killed
            )?;
        } else {
            f.write_str("no restored process was left in the container's cgroup")?;
        }
        if !self.remaining.is_empty() {
            let cgroups: Vec<String> = self
                .cgroups
                .iter()
                .map(|c| c.display().to_string())
                .collect();
            write!(
                f,
                "; pids {:?} are still in {} and could not be killed",
                self.remaining,
                cgroups.join(", ")
            )?;
        }
        match &self.runc_state_left {
            None => f.write_str("; runc's state of the container was removed")?,
            Some(e) => write!(
                f,
                "; runc's state of the container could not be removed ({e}): run `runc delete \
                 --force` on it"
            )?,
        }
        if !self.yards_removed.is_empty() {
            let names: Vec<String> = self
                .yards_removed
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            write!(f, "; CRIU's yards {} were removed", names.join(", "))?;
        }
        for (yard, e) in &self.yards_left {
            write!(
                f,
                "; CRIU's yard {} could not be removed ({e}): run `umount -l {0}` and `rmdir {0}`",
                yard.display()
            )?;
        }
        Ok(())
    }
}

/// The page fill's images for CRIU, in CRIU's work directory (`restore/fill.rs`).
pub(crate) const SPLIT_IMAGES_DIR: &str = "gpusnap-split-images";
/// The page fill's CRIU config file (`leave-stopped`), in CRIU's work directory.
pub(crate) const LEAVE_STOPPED_CONFIG: &str = "gpusnap-leave-stopped.conf";

/// Removes the page fill's split images and config file from CRIU's `work_dir`, for a restore
/// whose front end was killed before it removed them itself: with an image volume, the split
/// images can hold whole page images. Returns whether there was anything.
pub(crate) fn remove_split_images(work_dir: &Path) -> bool {
    let images = std::fs::remove_dir_all(work_dir.join(SPLIT_IMAGES_DIR)).is_ok();
    let config = std::fs::remove_file(work_dir.join(LEAVE_STOPPED_CONFIG)).is_ok();
    images || config
}

/// Clears what a failed restore of `runc.id` left. `observed` is the cgroup runc put CRIU in,
/// when the watch saw it; the bundle's runtime spec and runc's state name it otherwise.
/// `criu_work_dir` is the restore's CRIU work directory (where its `restore.log` is).
pub fn clear_failed_restore(
    runc: &Runc<'_>,
    bundle: &Path,
    observed: Option<PathBuf>,
    criu_work_dir: &Path,
) -> Cleared {
    let mut cgroups: Vec<PathBuf> = Vec::new();
    let mut add = |p: Option<PathBuf>| {
        if let Some(p) = p {
            if !cgroups.contains(&p) {
                cgroups.push(p);
            }
        }
    };
    add(observed);
    add(runc_state_cgroup(runc));
    add(crate::cgroup::of_spec(
        bundle,
        &runc.id,
        runc.global.systemd_cgroup,
    ));
    let mut cleared = Cleared::default();
    let host = runc.host();
    for dir in &cgroups {
        let (found, left) = host.kill_cgroup(dir, KILL_WAIT);
        cleared.killed += found.saturating_sub(left.len());
        cleared.remaining.extend(left);
    }
    cleared.remaining.sort_unstable();
    cleared.remaining.dedup();
    cleared.runc_state_left = remove_runc_state(runc).err().map(|e| e.to_string());
    // After the cgroup is empty: no CRIU is left to use them.
    (cleared.yards_removed, cleared.yards_left) = host.clear_criu_yards(criu_work_dir);
    // The page fill's split images (whole page images, with an image volume) and its config.
    if remove_split_images(criu_work_dir) {
        tracing::info!(work_dir = %criu_work_dir.display(), "removed the split images of a failed restore");
    }
    if cleared.remaining.is_empty() {
        // runc removes the cgroup with its state; one it never recorded is ours to remove.
        for dir in &cgroups {
            host.remove_cgroup(dir);
        }
    }
    cleared.cgroups = cgroups;
    tracing::info!(
        id = %runc.id,
        killed = cleared.killed,
        remaining = cleared.remaining.len(),
        runc_state_left = cleared.runc_state_left.is_some(),
        yards_removed = cleared.yards_removed.len(),
        yards_left = cleared.yards_left.len(),
        "failed restore cleared"
    );
    cleared
}

/// Removes the private CRIU plugin directories (and their config files) that the front end
/// whose pid was `writer_pid` made in `scratch` (`gpusnap_criu_bridge::PluginDir`): a
/// runtime killed mid-transaction never dropped them.
pub fn remove_plugin_dirs_of(scratch: &Path, writer_pid: u32) {
    let Ok(fd) = beneath::open_root(scratch) else {
        return;
    };
    for name in beneath::names(fd.as_fd()).unwrap_or_default() {
        if gpusnap_criu_bridge::plugins::is_plugin_dir_of(&name, writer_pid) {
            if let Err(e) = beneath::remove_all_at(fd.as_fd(), &name) {
                tracing::warn!(dir = %scratch.display(), name = ?name, error = %e, "cannot remove a killed runtime's CRIU plugin directory");
            }
        }
    }
}

/// `runc delete --force`; a container runc does not know is already gone. A runc killed
/// before it wrote `state.json` (mid-restore) leaves its directory of the id without one, and
/// in it `criu-root`, a bind mount of the container's rootfs: runc no longer knows the
/// container but refuses to create another of that id, and the rootfs stays mounted. That
/// mount is detached and the directory removed (entry by entry, never recursively: nothing
/// below a mount is deleted).
fn remove_runc_state(runc: &Runc<'_>) -> Result<(), RuncStateError> {
    let root = runc
        .global
        .root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNC_ROOT));
    let dir = root.join(&runc.id);
    let stateless = || {
        gpusnap_criu_bridge::is_plain_id(&runc.id)
            && std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(dir.join("state.json")).is_err()
    };
    // Before runc sees it: `runc delete` removes a directory without `state.json` recursively,
    // into the rootfs bind mount, and then fails on the mount point.
    if stateless() {
        runc.host().detach_criu_root(&dir);
    }
    let cmd = runc.global.helper(&["delete", "--force", runc.id.as_str()]);
    match runc.run(&cmd, None) {
        Ok(_) => {}
        Err(f) if classify_runc_error(&f.message) == RuncErrorKind::ContainerMissing => {}
        Err(f) => return Err(RuncStateError::Delete(f)),
    }
    if stateless() {
        remove_stateless_dir(runc, &dir)?;
    }
    Ok(())
}

/// Removes runc's directory of a container that has no `state.json`: its `criu-root` bind
/// mount detached first, then each entry with `rmdir`/`unlink` (a non-empty directory is left
/// and named in the error).
fn remove_stateless_dir(runc: &Runc<'_>, dir: &Path) -> Result<(), RuncStateError> {
    runc.host().detach_criu_root(dir);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let removed = if is_dir {
            std::fs::remove_dir(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(source) = removed {
            return Err(RuncStateError::Remove { path: p, source });
        }
    }
    std::fs::remove_dir(dir).map_err(|source| RuncStateError::Remove {
        path: dir.to_path_buf(),
        source,
    })
}

/// The container's cgroup as runc's `state.json` records it.
pub(crate) fn runc_state_cgroup(runc: &Runc<'_>) -> Option<PathBuf> {
    let root = runc
        .global
        .root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNC_ROOT));
    runc_state_cgroup_at(&root, &runc.id)
}

/// The cgroup runc's `<root>/<id>/state.json` records for the container (v2: the unified
/// path; v1: the freezer controller's).
pub fn runc_state_cgroup_at(root: &Path, id: &str) -> Option<PathBuf> {
    let state = read_runc_state(&root.join(id))?;
    let paths = state.get("cgroup_paths")?.as_object()?;
    paths
        .get("freezer")
        .or_else(|| paths.get(""))
        .and_then(|v| v.as_str())
        .map(PathBuf::from)
}

/// The most of runc's `state.json` read: the container's whole spec is in it, which is
/// kilobytes.
pub const RUNC_STATE_MAX_BYTES: u64 = 16 << 20;

/// runc's `state.json` in a container's state directory (`<root>/<id>`), as JSON: a regular
/// file beneath the directory, read up to [`RUNC_STATE_MAX_BYTES`]. `None` when there is none
/// or it is not that.
pub fn read_runc_state(state_dir: &Path) -> Option<serde_json::Value> {
    let dir = beneath::open_root(state_dir).ok()?;
    let bytes =
        beneath::read_capped(dir.as_fd(), Path::new("state.json"), RUNC_STATE_MAX_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// runc's `--root` when none is given (as root).
pub const DEFAULT_RUNC_ROOT: &str = "/run/runc";

/// runc's state of `runc.id` when its init is dead (`runc state` says `stopped`): left by a
/// restore or a runtime that was killed, it would make the next restore of the id fail with
/// "container exists". A container that runs is never touched.
pub fn clear_dead_runc_state(runc: &Runc<'_>) {
    if let Some((pid, status)) = runc.state() {
        if status == "stopped" {
            tracing::info!(id = %runc.id, pid, "removing runc's state of a dead container before restoring it");
            if let Err(e) = remove_runc_state(runc) {
                tracing::warn!(id = %runc.id, error = %e, "cannot remove runc's state of a dead container");
            }
        }
    }
}
