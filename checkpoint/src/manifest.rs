//! The gpusnap manifest: `gpusnap-manifest.json` directly in the checkpoint directory (flat, see
//! [`crate::layout`] for why).
//!
//! The manifest is written last, atomically, and is the only completeness marker: a checkpoint
//! directory without it is, by definition, incomplete (interrupted, failed, or made by another
//! runtime) and restore refuses it before CRIU runs.
//!
//! # Compatibility
//!
//! `format_version` is bumped for any change an older gpusnap would misinterpret (a field whose
//! meaning changes, a new file a restore needs). Within one format version, fields may only be
//! *added*, and readers ignore fields they do not know. That lets an older gpusnap restore a
//! checkpoint made by a newer one during a rolling upgrade, which `deny_unknown_fields` would
//! refuse for no safety gain. Unknown fields in the `gpu` section are kept (flattened into
//! `extra`) because that section is owned by the cuda crate and may carry details this crate
//! does not model.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::inventory::{ImageInventory, InventoryError};
use crate::layout::CheckpointLayout;
use crate::spec_grants::SpecGrants;
use crate::writable_layer::WritableLayerRecord;
use gpusnap_criu_bridge::CriuFlags;

/// Value of `kind`.
pub const MANIFEST_KIND: &str = "gpusnap-checkpoint";
/// The format this build writes and reads.
///
/// 2: `options` became `criu` (the dump's CRIU flags by runc's names); the processes list and
/// the bundle path no longer carry host paths or host pids (the `gpu` section still records each
/// CUDA process's host pid at checkpoint time, for matching restored processes).
pub const MANIFEST_FORMAT_VERSION: u32 = 2;

/// Everything gpusnap records about a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub kind: String,
    pub container_id: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Version of the gpusnap build that wrote this.
    pub gpusnap_version: String,
    #[serde(default)]
    pub processes: Vec<ProcessRecord>,
    /// `criu --version` of the CRIU runc used, e.g. `4.2.1`.
    pub criu_version: Option<String>,
    /// `runc --version` first line, e.g. `1.1.5+ds1`.
    pub runc_version: Option<String>,
    pub host: HostRecord,
    /// The CRIU flags the dump ran with. Informational: a restore takes its CRIU flags from the
    /// node's configuration and the request, never from the image.
    pub criu: CriuFlags,
    /// Phase durations in the order they ran.
    #[serde(default)]
    pub timings: Vec<PhaseTiming>,
    pub images: ImageInventory,
    /// Filled by the cuda crate for GPU containers; absent for CPU-only checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSection>,
    /// What else shapes the restored container — the privilege-relevant fields of its spec and
    /// its writable layer — recorded at seal, so that a signature of this manifest covers them.
    /// Absent in manifests of gpusnap releases before it was recorded: such a checkpoint is
    /// refused under `restore.signature_policy = require`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_container"
    )]
    pub container: Option<ContainerRecord>,
}

/// A container record this build cannot read (a later format, a part of a kind it does not
/// know) does not make the manifest unreadable — an older gpusnap restores newer checkpoints
/// where the policy does not need the record — but is read as a record whose parts are
/// unavailable, which `require` refuses with why.
fn lenient_container<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ContainerRecord>, D::Error> {
    let Some(v) = Option::<serde_json::Value>::deserialize(d)? else {
        return Ok(None);
    };
    let format = v
        .get("format")
        .and_then(|f| f.as_u64())
        .and_then(|f| u32::try_from(f).ok())
        .unwrap_or(0);
    Ok(Some(
        serde_json::from_value::<ContainerRecord>(v).unwrap_or_else(|e| {
            let reason = format!("this gpusnap cannot read the record ({e})");
            ContainerRecord {
                format,
                spec: SpecRecord::Unavailable {
                    reason: reason.clone(),
                },
                writable_layer: WritableLayerRecord::Unavailable { reason },
            }
        }),
    ))
}

/// The format of [`ContainerRecord`] this build writes and reads. Within a format fields are
/// only added; a record of another format is refused under `require` (made by a newer gpusnap).
pub const CONTAINER_RECORD_FORMAT: u32 = 1;

/// What shapes a restored container besides its CRIU images (see [`Manifest::container`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub format: u32,
    /// The privilege-relevant fields of the dumped container's spec (`config.json` of its
    /// bundle; [`crate::spec_grants`]).
    pub spec: SpecRecord,
    /// The container's writable layer at the dump ([`crate::writable_layer`]).
    pub writable_layer: WritableLayerRecord,
}

impl Manifest {
    /// The container record, when a signature of this manifest covers everything that shapes
    /// the restored container; otherwise why not, naming the part: no record (sealed by a
    /// gpusnap before it was recorded), another format, or a part that could not be recorded.
    pub fn covered_container(&self) -> Result<&ContainerRecord, NotCovered> {
        let Some(r) = &self.container else {
            return Err(NotCovered::NoRecord);
        };
        if r.format != CONTAINER_RECORD_FORMAT {
            return Err(NotCovered::NewerFormat { format: r.format });
        }
        if let SpecRecord::Unavailable { reason } = &r.spec {
            return Err(NotCovered::SpecNotRecorded {
                reason: reason.clone(),
            });
        }
        if let WritableLayerRecord::Unavailable { reason } = &r.writable_layer {
            return Err(NotCovered::LayerNotRecorded {
                reason: reason.clone(),
            });
        }
        Ok(r)
    }
}

/// Why a signature of a manifest does not cover everything that shapes the restored container
/// ([`Manifest::covered_container`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotCovered {
    #[error(
        "its manifest records neither the container's spec nor its writable layer (it was \
         sealed by a gpusnap before they were recorded), so a signature of it covers only the \
         CRIU images; take the checkpoint again with this gpusnap, whose seal records them"
    )]
    NoRecord,
    #[error(
        "its container record has format {format} (this gpusnap reads \
         {CONTAINER_RECORD_FORMAT}): it was made by a newer gpusnap; update this node"
    )]
    NewerFormat { format: u32 },
    #[error("the container's spec was not recorded at the checkpoint ({reason})")]
    SpecNotRecorded { reason: String },
    #[error("the container's writable layer was not recorded at the checkpoint ({reason})")]
    LayerNotRecorded { reason: String },
}

/// The spec part of a [`ContainerRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SpecRecord {
    Recorded {
        grants: Box<SpecGrants>,
    },
    /// It could not be read (why); a restore under `require` is refused.
    Unavailable {
        reason: String,
    },
}

/// One process of the checkpointed container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Pid inside the container's pid namespace, when known.
    pub container_pid: Option<u32>,
    /// argv, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
}

/// Facts about the host that took the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub kernel_release: String,
    /// Rust spelling (`x86_64`, `aarch64`); restore refuses another architecture.
    pub arch: String,
}

impl HostRecord {
    /// This host. An unreadable kernel release is recorded as `unknown`: it is informational and
    /// must not fail a checkpoint.
    pub fn current() -> Self {
        HostRecord {
            kernel_release: gpusnap_criu_bridge::versions::kernel_release()
                .unwrap_or_else(|_| "unknown".to_owned()),
            arch: gpusnap_criu_bridge::versions::host_arch().to_owned(),
        }
    }
}

/// Duration of one named phase (`freeze`, `gpu-lock`, `criu-dump`, `digest`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTiming {
    pub name: String,
    pub ms: u64,
}

/// GPU section, owned by the cuda crate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSection {
    /// Storage engine used (`driver-managed` or `posix`).
    pub engine: String,
    #[serde(default)]
    pub processes: Vec<GpuProcessRecord>,
    /// Everything else the cuda crate records; preserved on read.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One GPU-using process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcessRecord {
    pub host_pid: u32,
    /// GPU UUIDs the process had contexts on.
    #[serde(default)]
    pub devices: Vec<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Manifest {
    /// A manifest for this host, now, with an empty inventory; the caller fills processes,
    /// versions, timings and `gpu`, then seals it with [`seal_checkpoint`].
    pub fn new(container_id: impl Into<String>, criu: CriuFlags) -> Self {
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            kind: MANIFEST_KIND.to_owned(),
            container_id: container_id.into(),
            created_at: now_rfc3339(),
            gpusnap_version: env!("CARGO_PKG_VERSION").to_owned(),
            processes: Vec::new(),
            criu_version: None,
            runc_version: None,
            host: HostRecord::current(),
            criu,
            timings: Vec::new(),
            images: ImageInventory {
                total_bytes: 0,
                chunk_bytes: crate::inventory::CHUNK_BYTES,
                files: Vec::new(),
            },
            gpu: None,
            container: None,
        }
    }

    /// Appends a phase timing (rounded down to whole milliseconds).
    pub fn record_phase(&mut self, name: impl Into<String>, elapsed: Duration) {
        self.timings.push(PhaseTiming {
            name: name.into(),
            ms: elapsed.as_millis() as u64,
        });
    }
}

fn now_rfc3339() -> String {
    // Formatting a UTC timestamp with the well-known RFC 3339 format cannot fail for years
    // 0..=9999; the fallback only keeps this infallible.
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// Errors writing or reading a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("serialising the manifest: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("building the checkpoint inventory: {0}")]
    Inventory(#[from] InventoryError),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ManifestError {
    let path = path.to_path_buf();
    move |source| ManifestError::Io {
        action,
        path,
        source,
    }
}

/// Writes `<dir>/gpusnap-manifest.json` so that it either exists completely or not at all:
/// temporary file `.gpusnap-manifest.json.tmp.<pid>.<n>` created with `O_EXCL | O_NOFOLLOW`
/// through a descriptor of `dir` (same filesystem, so the rename is atomic), fsync, rename over
/// the final name inside the same descriptor, then fsync of `dir`
/// ([`crate::beneath::write_atomically`]): nothing planted in `dir` is written through. `dir`
/// must exist. Call it last: its presence means "complete".
pub fn write_manifest_atomically(dir: &Path, manifest: &Manifest) -> Result<(), ManifestError> {
    let layout = CheckpointLayout::new(dir);
    let final_path = layout.manifest_path();
    let mut json = serde_json::to_vec_pretty(manifest)?;
    json.push(b'\n');
    let root = crate::beneath::open_root(dir).map_err(io_err("opening", dir))?;
    crate::beneath::write_atomically(
        root.as_fd(),
        std::ffi::OsStr::new(crate::layout::MANIFEST_FILE),
        &json,
        0o600,
    )
    .map_err(io_err("writing", &final_path))
}

/// The checkpoint holds process memory (keys, tokens): the directory becomes 0700 and every
/// file in it 0600, whatever modes CRIU, the engines or an existing directory had. Entries are
/// looked at and changed through a descriptor of the directory, never through a symlink.
fn make_private(dir: &Path) -> Result<(), ManifestError> {
    use rustix::fs::FileType;
    crate::beneath::create_private_dir(dir).map_err(io_err("making private", dir))?;
    let root = crate::beneath::open_root(dir).map_err(io_err("opening", dir))?;
    for name in crate::beneath::names(root.as_fd()).map_err(io_err("reading", dir))? {
        let path = dir.join(&name);
        // Flat layout: only files directly in the directory; symlinks have no mode of their own.
        let Some(st) =
            crate::beneath::stat_at(root.as_fd(), &name).map_err(io_err("reading", &path))?
        else {
            continue;
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && st.st_mode & 0o7777 != 0o600
        {
            crate::beneath::chmod_at(root.as_fd(), &name, 0o600)
                .map_err(io_err("making private", &path))?;
        }
    }
    Ok(())
}

/// Hashes the checkpoint directory into `manifest.images`, records the time that took as phase
/// `digest`, and writes the manifest atomically. Returns the sealed manifest.
pub fn seal_checkpoint(dir: &Path, manifest: Manifest) -> Result<Manifest, ManifestError> {
    let started = std::time::Instant::now();
    let inventory = ImageInventory::scan(dir)?;
    seal_checkpoint_with(dir, manifest, inventory, started.elapsed())
}

/// [`seal_checkpoint`] with an inventory hashed beforehand (while other work ran), which took
/// `digest` to compute: makes the checkpoint private, records the inventory and phase `digest`,
/// and writes the manifest atomically.
pub fn seal_checkpoint_with(
    dir: &Path,
    mut manifest: Manifest,
    inventory: ImageInventory,
    digest: Duration,
) -> Result<Manifest, ManifestError> {
    make_private(dir)?;
    manifest.images = inventory;
    manifest.record_phase("digest", digest);
    write_manifest_atomically(dir, &manifest)?;
    tracing::info!(
        dir = %dir.display(),
        container_id = %manifest.container_id,
        files = manifest.images.files.len(),
        total_bytes = manifest.images.total_bytes,
        "checkpoint sealed"
    );
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusnap_criu_bridge::CgroupsMode;
    use std::fs;

    pub(crate) fn sample() -> Manifest {
        let mut m = Manifest::new(
            "ctr1",
            CriuFlags {
                tcp_established: true,
                manage_cgroups_mode: Some(CgroupsMode::Soft),
                ..Default::default()
            },
        );
        m.processes.push(ProcessRecord {
            container_pid: Some(1),
            command: Some(vec!["python".into(), "train.py".into()]),
        });
        m.criu_version = Some("4.2.1".into());
        m.runc_version = Some("1.1.5+ds1".into());
        m.record_phase("criu-dump", Duration::from_millis(1234));
        let mut extra = serde_json::Map::new();
        extra.insert("driver_version".into(), "570.86".into());
        m.gpu = Some(GpuSection {
            engine: "driver-managed".into(),
            processes: vec![GpuProcessRecord {
                host_pid: 4242,
                devices: vec!["GPU-1234".into()],
                extra: serde_json::Map::new(),
            }],
            extra,
        });
        m
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let json = serde_json::to_string_pretty(&m).unwrap();
        assert!(json.contains("\"kind\": \"gpusnap-checkpoint\""), "{json}");
        assert!(json.contains("\"format_version\": 2"), "{json}");
        assert!(json.contains("\"driver_version\": \"570.86\""), "{json}");
        let back: Manifest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
        OffsetDateTime::parse(&m.created_at, &Rfc3339).unwrap();
    }

    #[test]
    fn unknown_fields_are_ignored_and_gpu_extras_kept() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["added_in_a_later_release"] = serde_json::json!({"x": 1});
        v["gpu"]["future_gpu_field"] = serde_json::json!(true);
        let m: Manifest = serde_json::from_value(v).unwrap();
        assert_eq!(
            m.gpu.unwrap().extra.get("future_gpu_field"),
            Some(&serde_json::json!(true))
        );
    }

    /// A record of a later format or of kinds this build does not know leaves the manifest
    /// readable, and is not usable for `require`.
    #[test]
    fn an_unreadable_container_record_is_unavailable_not_fatal() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["container"] = serde_json::json!({"format": 2, "spec": {"kind": "future"}, "writable_layer": {"kind": "zfs"}});
        let m: Manifest = serde_json::from_value(v).unwrap();
        let why = m.covered_container().unwrap_err();
        assert_eq!(why, NotCovered::NewerFormat { format: 2 });
        assert!(why.to_string().contains("format 2"), "{why}");
        let mut v = serde_json::to_value(sample()).unwrap();
        v["container"] = serde_json::json!({"format": 1, "spec": {"kind": "recorded", "grants": {}}, "writable_layer": {"kind": "zfs"}});
        let m: Manifest = serde_json::from_value(v).unwrap();
        let why = m.covered_container().unwrap_err();
        assert!(
            matches!(
                why,
                NotCovered::SpecNotRecorded { .. } | NotCovered::LayerNotRecorded { .. }
            ),
            "{why:?}"
        );
        assert!(why.to_string().contains("cannot read the record"), "{why}");
        assert!(sample()
            .covered_container()
            .unwrap_err()
            .to_string()
            .contains("sealed by a gpusnap before"));
    }

    #[test]
    fn cpu_only_manifest_has_no_gpu_key() {
        let mut m = sample();
        m.gpu = None;
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("\"gpu\""), "{json}");
    }

    #[test]
    fn atomic_write_leaves_only_the_final_file() {
        let dir = tempfile::tempdir().unwrap();
        let m = sample();
        write_manifest_atomically(dir.path(), &m).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // Flat: one plain file, no directory (containerd's CRI unpack creates none).
        assert_eq!(names, ["gpusnap-manifest.json"]);
        let path = dir.path().join("gpusnap-manifest.json");
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        let back: Manifest = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, m);
        // Overwriting replaces it whole.
        let mut m2 = m.clone();
        m2.container_id = "other".into();
        write_manifest_atomically(dir.path(), &m2).unwrap();
        let back: Manifest = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.container_id, "other");
    }

    #[test]
    fn atomic_write_failure_reports_path_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory where the manifest goes: the rename cannot replace it.
        fs::create_dir(dir.path().join("gpusnap-manifest.json")).unwrap();
        fs::write(dir.path().join("gpusnap-manifest.json/x"), b"").unwrap();
        let err = write_manifest_atomically(dir.path(), &sample()).unwrap_err();
        assert!(err.to_string().contains("gpusnap-manifest.json"), "{err}");
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["gpusnap-manifest.json"]);
        // A missing directory is not created.
        let missing = dir.path().join("missing");
        let err = write_manifest_atomically(&missing, &sample()).unwrap_err();
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
        assert!(!missing.exists());
    }

    /// Whatever is planted in the directory under the manifest's names — a symlink at the
    /// final name, symlinks at every temporary name this process could use — is replaced or
    /// refused, never written through; files that are symlinks are not chmodded through.
    #[test]
    fn sealing_writes_through_no_planted_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("ck");
        fs::create_dir(&dir).unwrap();
        let outside = top.path().join("outside");
        fs::write(&outside, b"host file").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("gpusnap-manifest.json")).unwrap();
        for n in 0..4 {
            let tmp = format!(".gpusnap-manifest.json.tmp.{}.{n}", std::process::id());
            std::os::unix::fs::symlink(&outside, dir.join(tmp)).unwrap();
        }
        std::os::unix::fs::symlink(&outside, dir.join("pages-9.img")).unwrap();
        fs::write(dir.join("pages-1.img"), b"pages").unwrap();
        seal_checkpoint(&dir, sample()).unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"host file");
        assert_eq!(
            fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let written = dir.join("gpusnap-manifest.json");
        assert!(fs::symlink_metadata(&written).unwrap().is_file());
        let back: Manifest = serde_json::from_slice(&fs::read(&written).unwrap()).unwrap();
        assert_eq!(back.images.files.len(), 1, "{:?}", back.images.files);
    }

    #[test]
    fn seal_records_inventory_and_digest_phase() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("pages-1.img"), vec![7u8; 100_000]).unwrap();
        fs::write(dir.path().join("dump.log"), b"log").unwrap();
        let sealed = seal_checkpoint(dir.path(), sample()).unwrap();
        assert_eq!(sealed.images.total_bytes, 100_000);
        assert_eq!(sealed.images.files.len(), 1);
        assert_eq!(sealed.timings.last().unwrap().name, "digest");
        assert!(dir.path().join("gpusnap-manifest.json").is_file());
    }

    #[test]
    fn sealed_checkpoints_are_private_whatever_the_modes_were() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.path().join("pages-1.img"), b"secret").unwrap();
        fs::set_permissions(
            dir.path().join("pages-1.img"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        seal_checkpoint(dir.path(), sample()).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(mode(&dir.path().join("pages-1.img")), 0o600);
        assert_eq!(mode(&dir.path().join("gpusnap-manifest.json")), 0o600);
    }
}
