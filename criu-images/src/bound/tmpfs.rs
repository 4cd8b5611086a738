//! The tmpfs tarballs (`tmpfs-dev-<n>.tar.gz.img`, `tmpfs-<n>.tar.gz.img`): the content of
//! each tmpfs of the container, which CRIU untars as root into the restored mount
//! (`tar --extract --gzip` with ownership and modes kept).
//!
//! Every entry is read (gzip and tar parsed in Rust, decompressed size and entry count capped)
//! and refused when it is: a setuid or setgid file; a device node other than the ones runc
//! creates for the spec (`linux.devices` plus runc's defaults) at their paths with their
//! type and numbers; an absolute name, a `..` component, or a name below a symlink of the
//! archive (tar would write through it); a hard link to a name outside the archive; or a
//! type other than a file, directory, symlink, hard link, FIFO or those device nodes.

use std::collections::BTreeSet;
use std::io::Read;

use oci_spec::runtime::Linux;

use super::files::odd_mode;
use super::{Check, Refusal};
use crate::allowlist::Listing;
use crate::image::{ImageDir, ImageError};
use crate::proto::MntEntry;

/// The most bytes a tarball may decompress to, and the most entries it may hold. A tmpfs of
/// a container holds what its processes wrote (`/dev/shm`); both are far above `/dev`'s.
pub const MAX_BYTES: u64 = 4 << 30;
pub const MAX_ENTRIES: u64 = 1 << 20;

/// The device nodes runc creates in every container (`libcontainer/specconv`), as (path,
/// type, major, minor).
const RUNC_DEVICES: [(&str, char, i64, i64); 6] = [
    ("/dev/null", 'c', 1, 3),
    ("/dev/random", 'c', 1, 8),
    ("/dev/full", 'c', 1, 7),
    ("/dev/tty", 'c', 5, 0),
    ("/dev/zero", 'c', 1, 5),
    ("/dev/urandom", 'c', 1, 9),
];

/// The spec's devices and runc's defaults.
pub fn devices(linux: Option<&Linux>) -> Vec<(String, char, i64, i64)> {
    let mut out: Vec<(String, char, i64, i64)> = RUNC_DEVICES
        .iter()
        .map(|(p, t, ma, mi)| (p.to_string(), *t, *ma, *mi))
        .collect();
    for d in linux
        .and_then(|l| l.devices().as_ref())
        .into_iter()
        .flatten()
    {
        let typ = serde_json::to_value(d.typ())
            .ok()
            .and_then(|v| v.as_str().and_then(|s| s.chars().next()))
            .unwrap_or('?');
        let typ = if typ == 'u' { 'c' } else { typ };
        out.push((
            d.path().to_string_lossy().into_owned(),
            typ,
            d.major(),
            d.minor(),
        ));
    }
    out
}

impl Check<'_> {
    pub(super) fn tmpfs(&mut self, dir: &mut ImageDir, listing: &Listing) -> Result<(), Refusal> {
        let mounts = self.all_mounts(dir)?;
        for id in ["TMPFS_DEV", "TMPFS_IMG"] {
            for (name, dev) in listing.of(id) {
                // CRIU names a tmpfs's tarball by its device number (`root_dev`).
                let at = mounts
                    .iter()
                    .find(|m| {
                        // The tmpfs itself, not a bind of it (runc binds /dev/null of it over
                        // masked paths).
                        u64::from(m.root_dev) == dev
                            && m.root == b"/"
                            && m.ext_key.as_ref().is_none_or(|k| k.is_empty())
                    })
                    .map(|m| String::from_utf8_lossy(&m.mountpoint).into_owned());
                let file = dir.open_file(name).map_err(|source| ImageError::Open {
                    name: name.into(),
                    source,
                })?;
                match self.tarball(file, at.as_deref()) {
                    Ok(()) => {}
                    Err(why) => self.find(None, name, "content", why),
                }
            }
        }
        Ok(())
    }

    /// Every mount of every `mountpoints-*.img` (already walked).
    fn all_mounts(&self, dir: &mut ImageDir) -> Result<Vec<MntEntry>, Refusal> {
        let mut out = Vec::new();
        let names = dir.names().map_err(|source| ImageError::Read {
            name: dir.path().display().to_string(),
            source,
        })?;
        for n in names.iter().filter(|n| n.starts_with("mountpoints-")) {
            out.extend(
                dir.read::<MntEntry>(n, crate::image::Kind::Mountpoints)?
                    .unwrap_or_default(),
            );
        }
        Ok(out)
    }

    /// One tarball; `at` is where its tmpfs is mounted in the container (for device paths).
    fn tarball(&self, file: std::fs::File, at: Option<&str>) -> Result<(), String> {
        let gz = flate2::read::GzDecoder::new(file);
        let capped = gz.take(MAX_BYTES + 1);
        let mut archive = tar::Archive::new(capped);
        let mut names = BTreeSet::new();
        let mut links: Vec<String> = Vec::new();
        let mut count = 0u64;
        let entries = archive
            .entries()
            .map_err(|e| format!("is not a tar archive: {e}"))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("is not a readable tar archive: {e}"))?;
            count += 1;
            if count > MAX_ENTRIES {
                return Err(format!("holds more than {MAX_ENTRIES} entries"));
            }
            let raw = entry.path_bytes().into_owned();
            let name = String::from_utf8_lossy(&raw).into_owned();
            let shown = name.escape_debug().to_string();
            let rel = plain(&raw)
                .ok_or_else(|| format!("holds {shown:?}: an absolute name or one with `..`"))?;
            if let Some(l) = links.iter().find(|l| rel.starts_with(&format!("{l}/"))) {
                return Err(format!(
                    "holds {shown:?} below the symlink {l:?} of the archive: tar would write \
                     through the link"
                ));
            }
            let h = entry.header();
            let mode = h.mode().map_err(|e| format!("{shown:?}: {e}"))?;
            let typ = h.entry_type();
            use tar::EntryType as T;
            match typ {
                T::Regular | T::Continuous | T::Directory | T::Fifo => {}
                T::Symlink => links.push(rel.clone()),
                T::Link => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| t.into_owned())
                        .unwrap_or_default();
                    let target_rel = plain(&target);
                    if !target_rel.as_ref().is_some_and(|t| names.contains(t)) {
                        return Err(format!(
                            "holds {shown:?}, a hard link to {:?}, which is not an earlier \
                             entry of the archive",
                            String::from_utf8_lossy(&target)
                        ));
                    }
                }
                T::Char | T::Block => {
                    let c = if typ == T::Char { 'c' } else { 'b' };
                    let major = h.device_major().ok().flatten().unwrap_or(0);
                    let minor = h.device_minor().ok().flatten().unwrap_or(0);
                    let path = at.map(|a| format!("{}/{rel}", a.trim_end_matches('/')));
                    let ok = path.as_ref().is_some_and(|p| {
                        self.bound.devices.iter().any(|(dp, dt, dma, dmi)| {
                            dp == p
                                && *dt == c
                                && *dma == i64::from(major)
                                && *dmi == i64::from(minor)
                        })
                    });
                    if !ok {
                        return Err(format!(
                            "holds {shown:?}, a {} device {major}:{minor}{}, which is not one \
                             runc creates for the spec (its linux.devices and runc's defaults)",
                            if c == 'c' { "character" } else { "block" },
                            path.map(|p| format!(" at {p}")).unwrap_or_default()
                        ));
                    }
                }
                other => {
                    return Err(format!(
                        "holds {shown:?} of tar type {:?}, which is not modeled",
                        other.as_byte() as char
                    ))
                }
            }
            if typ != T::Directory && typ != T::Char && typ != T::Block {
                if let Some(odd) = odd_mode(mode) {
                    return Err(format!("holds {shown:?}, which is {odd} (mode {mode:#o})"));
                }
            }
            if typ == T::Directory && mode & 0o4000 != 0 {
                return Err(format!("holds {shown:?}, a setuid directory"));
            }
            names.insert(rel);
        }
        if archive.into_inner().limit() == 0 {
            return Err(format!("decompresses to more than {MAX_BYTES} bytes"));
        }
        Ok(())
    }
}

/// A tar member name as tar extracts it relative to the mount: `./a/b` → `a/b`; `None` for an
/// absolute name or one with `..`.
fn plain(raw: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(raw);
    if s.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for p in s.split('/') {
        match p {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}
