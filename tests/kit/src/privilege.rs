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

/// Writes the CRIU images of one task that a restore's privilege check accepts for any spec
/// running as root without seccomp or an LSM label: `inventory.img`, `pstree.img`,
/// `ids-1.img`, `core-1.img` (uid and gid 0, no capabilities, every namespace its own) and
/// `mountpoints-13.img` (the rootfs only). For tests whose checkpoints must reach a later
/// check with made-up images; CRIU itself would not restore them.
pub fn minimal_images(dir: &Path) -> Result<()> {
    use gpusnap_criu_images::proto::{
        CoreEntry, InventoryEntry, MntEntry, PstreeEntry, TaskCoreEntry, TaskKobjIdsEntry,
    };
    use gpusnap_criu_images::Kind;
    let ids = |first: u32| TaskKobjIdsEntry {
        pid_ns_id: Some(first),
        net_ns_id: Some(first + 1),
        ipc_ns_id: Some(first + 2),
        uts_ns_id: Some(first + 3),
        mnt_ns_id: Some(first + 4),
        user_ns_id: Some(7),
        cgroup_ns_id: Some(8),
        time_ns_id: Some(5),
        ..Default::default()
    };
    let mut creds = forge::creds(0, 0, 0);
    creds.no_new_privs = None;
    let put = |name: &str, bytes: Vec<u8>| fs::write(dir.join(name), bytes);
    put(
        "inventory.img",
        forge::image_of(
            Kind::Inventory,
            &[InventoryEntry {
                img_version: 2,
                root_ids: Some(ids(1)),
                lsmtype: None,
                ..Default::default()
            }],
        ),
    )?;
    put(
        "pstree.img",
        forge::image_of(
            Kind::Pstree,
            &[PstreeEntry {
                pid: 1,
                ppid: 0,
                pgid: 1,
                sid: 1,
                threads: vec![1],
            }],
        ),
    )?;
    put("ids-1.img", forge::image_of(Kind::Ids, &[ids(9)]))?;
    put(
        "core-1.img",
        forge::image_of(
            Kind::Core,
            &[CoreEntry {
                mtype: 1,
                tc: Some(TaskCoreEntry::default()),
                thread_core: Some(ThreadCoreEntry {
                    creds: Some(creds),
                    seccomp_mode: None,
                    seccomp_filter: None,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        ),
    )?;
    put(
        "mountpoints-13.img",
        forge::image_of(
            Kind::Mountpoints,
            &[MntEntry {
                fstype: 0,
                mnt_id: 1,
                parent_mnt_id: 0,
                flags: 0,
                root: b"/".to_vec(),
                mountpoint: b"/".to_vec(),
                source: b"none".to_vec(),
                options: vec![],
                ..Default::default()
            }],
        ),
    )?;
    Ok(())
}
