//! What the manifest records of the container besides its CRIU images — the privilege-relevant
//! fields of its spec and its writable layer — made at seal ([`record`]), and compared with the
//! container being restored ([`check_spec`], [`check_layer`]) when the node's signature policy
//! says so (`signature.rs` decides).
//!
//! Both comparisons run in the restore transaction, so every door gets them alike: the spec
//! is the bundle's `config.json` whoever wrote it (containerd from the checkpoint image on
//! `ctr containers restore`, CRI from the pod, CRI-O and Podman from the archive), and the
//! writable layer is the root filesystem's overlay upper layer after whatever the runtime or
//! gpusnap applied to it (containerd's rw layer or `rootfs-diff.tar`, CRI-O's and Podman's
//! `rootfs-diff.tar` and `deleted.files`, gpusnap's own application for
//! `gpusnap.io/restore-from`), before CRIU runs.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::spec_grants::{NodeFacts, SpecError, SpecGrants};
use gpusnap_checkpoint::writable_layer::{
    self as layer, Difference, LayerError, Overlay, WritableLayerRecord,
};
use gpusnap_checkpoint::{ContainerRecord, SpecRecord, CONTAINER_RECORD_FORMAT};
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::bundle_spec::SpecMount;

/// Why a part of the container could not be recorded at seal (the message becomes the
/// manifest's reason for an unavailable part), or why the container being restored is not the
/// one recorded (the message leads the refusal or the warning).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("{}: {source}", path.display())]
    SpecUnreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is larger than {cap} bytes", path.display())]
    SpecTooLarge { path: PathBuf, cap: u64 },
    /// The spec's grants cannot be read from it.
    #[error("{}: {source}", path.display())]
    SpecInvalid {
        path: PathBuf,
        #[source]
        source: SpecError,
    },
    /// The spec is not an OCI runtime spec (the writable layer needs its root and cwd).
    #[error("{0}")]
    SpecNotOci(#[source] serde_json::Error),
    #[error("the container's mount table (/proc/{pid}/mountinfo): {source}")]
    MountTable {
        pid: u32,
        #[source]
        source: io::Error,
    },
    /// The writable layer could not be described or its listing written at seal.
    #[error("{0}")]
    Layer(#[source] LayerError),
    #[error("the signed checkpoint records no spec")]
    NoSignedSpec,
    #[error(
        "the spec of the container being restored ({}) grants more than the spec signed with \
         the checkpoint: {}",
        path.display(),
        excess.join("; ")
    )]
    SpecGrantsMore { path: PathBuf, excess: Vec<String> },
    #[error("{}: {source}", path.display())]
    CheckpointDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the signed record of the writable layer cannot be used: {0}")]
    SignedListing(#[source] LayerError),
    #[error(
        "the writable layer signed with the checkpoint cannot be compared with the \
         container's: {0}. Restore it where the container's root filesystem is an overlay \
         (containerd's overlayfs snapshotter, CRI-O's or Podman's overlay storage driver)"
    )]
    NotOverlay(#[source] LayerError),
    #[error("the writable layer of the container being restored cannot be read: {0}")]
    LayerUnreadable(#[source] LayerError),
    #[error(
        "the writable layer of the container being restored ({part}) is not the one signed \
         with the checkpoint: {difference}{}",
        if difference.found.is_none() && difference.recorded.is_some() {
            // What the signed layer has and the container lacks: the door may not have
            // applied the layer at all.
            " (a restore without the checkpoint's writable layer — `ctr containers restore` \
             without --rw, or a checkpoint directory without its rootfs-diff.tar — lacks it: \
             restore with the layer)"
        } else {
            ""
        }
    )]
    LayerDiffers {
        part: String,
        difference: Box<Difference>,
    },
}

/// The bundle's `config.json`, capped as every reader of it is ([`crate::bundle_spec`]).
fn config_bytes(bundle: &Path) -> Result<Vec<u8>, RecordError> {
    let path = crate::bundle_spec::path(bundle);
    crate::bundle_spec::read_bytes(bundle).map_err(|e| match e {
        crate::bundle_spec::SpecReadError::Unreadable(source) => {
            RecordError::SpecUnreadable { path, source }
        }
        crate::bundle_spec::SpecReadError::TooLarge => RecordError::SpecTooLarge {
            path,
            cap: crate::bundle_spec::MAX_SPEC_BYTES,
        },
    })
}

/// The record of the container `bundle` (its init `init_pid`, frozen or stopped by now) for a
/// checkpoint sealed into `image_dir`: its spec's grants, and its writable layer described into
/// the listing file beside the manifest. A part that cannot be recorded is recorded as
/// unavailable, with why: the checkpoint is still sealed, and a restore under `require`
/// refuses it naming that part.
pub(crate) fn record(bundle: &Path, init_pid: u32, image_dir: &Path) -> ContainerRecord {
    let bytes = config_bytes(bundle);
    let spec = match &bytes {
        Ok(b) => match SpecGrants::from_json(b) {
            Ok(grants) => SpecRecord::Recorded {
                grants: Box::new(grants),
            },
            Err(e) => SpecRecord::Unavailable {
                reason: format!("{}: {e}", bundle.join("config.json").display()),
            },
        },
        Err(e) => SpecRecord::Unavailable {
            reason: e.to_string(),
        },
    };
    let writable_layer = match &bytes {
        Ok(b) => writable_layer(bundle, b, init_pid, image_dir).map_err(|e| e.to_string()),
        // The layer needs the spec's root: the same reason as the spec's.
        Err(e) => Err(e.to_string()),
    }
    .unwrap_or_else(|reason| WritableLayerRecord::Unavailable { reason });
    if let WritableLayerRecord::Unavailable { reason } = &writable_layer {
        tracing::info!(bundle = %bundle.display(), reason, "the container's writable layer is not recorded in the checkpoint; a restore under restore.signature_policy = require will refuse it");
    }
    ContainerRecord {
        format: CONTAINER_RECORD_FORMAT,
        spec,
        writable_layer,
    }
}

fn writable_layer(
    bundle: &Path,
    config: &[u8],
    init_pid: u32,
    image_dir: &Path,
) -> Result<WritableLayerRecord, RecordError> {
    let spec: Spec = crate::bundle_spec::BundleSpec::from_bytes(config)
        .map_err(RecordError::SpecNotOci)?
        .into_spec();
    let rootfs = crate::open_files::rootfs_of(bundle, &spec);
    let ov = Overlay::locate(&rootfs).map_err(RecordError::Layer)?;
    // The container's own mount table: where runc mounted, as the container sees it.
    let table =
        std::fs::read_to_string(format!("/proc/{init_pid}/mountinfo")).map_err(|source| {
            RecordError::MountTable {
                pid: init_pid,
                source,
            }
        })?;
    let mount_points = layer::mount_points(&table);
    let cwd = spec
        .process()
        .as_ref()
        .and_then(|p| ov.resolve_in_root(p.cwd()));
    let entries =
        layer::describe_for_seal(&ov, &mount_points, cwd.as_deref()).map_err(RecordError::Layer)?;
    layer::write_listing(image_dir, &entries).map_err(RecordError::Layer)
}

/// The node the container is restored on, as the spec comparison asks about it.
struct ThisNode;

impl NodeFacts for ThisNode {
    fn host_namespace(&self, typ: LinuxNamespaceType, path: &Path) -> bool {
        host_namespace(typ, path)
    }

    fn runtime_owned(&self, path: &Path) -> bool {
        runtime_owned(path)
    }
}

/// See [`NodeFacts::runtime_owned`]: every component of `path` exists, is no symlink, and
/// belongs to root; every directory above the last is writable by root alone or is sticky.
fn runtime_owned(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if !path.is_absolute() {
        return false;
    }
    let mut cur = PathBuf::from("/");
    let mut any = false;
    for c in path.components().skip(1) {
        let Ok(dir) = std::fs::symlink_metadata(&cur) else {
            return false;
        };
        let writable_by_others = dir.mode() & 0o022 != 0;
        let sticky = dir.mode() & 0o1000 != 0;
        if dir.uid() != 0 || !dir.is_dir() || (writable_by_others && !sticky) {
            return false;
        }
        cur.push(c);
        let Ok(m) = std::fs::symlink_metadata(&cur) else {
            return false;
        };
        if m.uid() != 0 || m.file_type().is_symlink() {
            return false;
        }
        any = true;
    }
    any
}

/// Whether the namespace file `path` is pid 1's namespace of that type (the node's own).
fn host_namespace(typ: LinuxNamespaceType, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let name = match typ {
        LinuxNamespaceType::Mount => "mnt",
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::Network => "net",
        LinuxNamespaceType::Time => "time",
    };
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(path),
        std::fs::metadata(format!("/proc/1/ns/{name}")),
    ) else {
        return false;
    };
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Compares the spec of the container being created (`<bundle>/config.json`) with the signed
/// record: `Err` names every field it grants beyond it.
pub(crate) fn check_spec(
    record: &ContainerRecord,
    bundle: &Path,
    checkpoint_mount: Option<&SpecMount>,
) -> Result<(), RecordError> {
    let SpecRecord::Recorded { grants: signed } = &record.spec else {
        return Err(RecordError::NoSignedSpec);
    };
    let path = bundle.join("config.json");
    let mut target = SpecGrants::from_json(&config_bytes(bundle)?).map_err(|source| {
        RecordError::SpecInvalid {
            path: path.clone(),
            source,
        }
    })?;
    if let Some(volume) = checkpoint_mount {
        // Exactly the mount the volume was recognised in (destination, type, source and
        // options): anything else at the same place is compared like every other mount.
        target.mounts.retain(|m| SpecMount::from(m) != *volume);
    }
    let excess = signed.excess(&target, &ThisNode);
    if excess.is_empty() {
        return Ok(());
    }
    Err(RecordError::SpecGrantsMore {
        path,
        excess: excess.iter().map(ToString::to_string).collect(),
    })
}

/// The part of a restore that brought the writable layer, for messages: the rootfs diff
/// gpusnap applied, a `rootfs-diff.tar` beside the checkpoint (a CRI, CRI-O or Podman archive
/// the runtime applied), or the checkpoint's rw layer (containerd's checkpoint image).
pub(crate) fn layer_part(checkpoint_dir: &Path, applied_here: Option<&Path>) -> String {
    if let Some(p) = applied_here {
        return format!("rootfs-diff.tar ({}), applied by gpusnap", p.display());
    }
    let beside = checkpoint_dir.parent().and_then(|parent| {
        let fd = gpusnap_checkpoint::beneath::open_root(parent).ok()?;
        gpusnap_checkpoint::beneath::stat_at(fd.as_fd(), std::ffi::OsStr::new("rootfs-diff.tar"))
            .ok()
            .flatten()
            .map(|_| parent.join("rootfs-diff.tar"))
    });
    match beside {
        Some(p) => format!(
            "rootfs-diff.tar ({}), applied by the container runtime",
            p.display()
        ),
        None => "the checkpoint's rw layer, applied by the container runtime".into(),
    }
}

/// Compares the writable layer of the container being restored (the overlay mounted at
/// `rootfs`) with the signed record in `checkpoint_dir`. `part` names what brought it. The walk
/// of the layer stops once `deadline` passes (the caller ends the restore then).
pub(crate) fn check_layer(
    record: &ContainerRecord,
    checkpoint_dir: &Path,
    rootfs: &Path,
    part: &str,
    deadline: std::time::Instant,
) -> Result<(), RecordError> {
    let started = std::time::Instant::now();
    let dir = gpusnap_checkpoint::beneath::open_root(checkpoint_dir).map_err(|source| {
        RecordError::CheckpointDir {
            path: checkpoint_dir.to_path_buf(),
            source,
        }
    })?;
    let signed = layer::read_listing(
        dir.as_fd(),
        checkpoint_dir,
        &record.writable_layer,
        Some(deadline),
    )
    .map_err(RecordError::SignedListing)?;
    let ov = Overlay::locate(rootfs).map_err(RecordError::NotOverlay)?;
    let found = layer::describe_until(&ov, Some(deadline)).map_err(RecordError::LayerUnreadable)?;
    let compared = layer::compare(&signed, &found);
    tracing::debug!(
        rootfs = %rootfs.display(),
        upper = %ov.upper_dir().map(PathBuf::from).unwrap_or_default().display(),
        signed_entries = signed.len(),
        found_entries = found.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        same = compared.is_ok(),
        "writable layer compared with the signed record"
    );
    compared.map_err(|difference| RecordError::LayerDiffers {
        part: part.to_owned(),
        difference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusnap_checkpoint::writable_layer::record_of;

    /// A record whose signed spec grants nothing beyond a bare container.
    fn signed_bare() -> ContainerRecord {
        ContainerRecord {
            format: CONTAINER_RECORD_FORMAT,
            spec: SpecRecord::Recorded {
                grants: Default::default(),
            },
            writable_layer: record_of(&[], &[]),
        }
    }

    /// CRI-O's image volume as it writes it into the container's spec.
    fn crio_volume(lower: &str) -> SpecMount {
        SpecMount {
            destination: "/ckpt".into(),
            source: "overlay".into(),
            kind: "overlay".into(),
            options: vec![format!(
                "lowerdir={lower}:/var/lib/containers/storage/overlay-containers/c/userdata/image-volumes"
            )],
        }
    }

    fn bundle_with(dir: &Path, mounts: &[&SpecMount]) {
        let mounts: Vec<serde_json::Value> = mounts
            .iter()
            .map(|m| {
                serde_json::json!({
                    "destination": m.destination,
                    "type": m.kind,
                    "source": m.source,
                    "options": m.options,
                })
            })
            .collect();
        let spec = serde_json::json!({"ociVersion": "1.0.2", "mounts": mounts});
        std::fs::write(dir.join("config.json"), spec.to_string()).unwrap();
    }

    /// The volume's mount is left out of the comparison only as the resolution recognised it,
    /// on CRI-O as on containerd: the same mount anywhere else, or changed in any field, is
    /// compared like every other mount and refused.
    #[test]
    fn only_the_recognised_volume_mount_is_left_out() {
        let t = tempfile::tempdir().unwrap();
        let record = signed_bare();
        let volume = crio_volume("/var/lib/containers/storage/overlay/l1/merged");
        bundle_with(t.path(), &[&volume]);
        assert!(matches!(
            check_spec(&record, t.path(), None),
            Err(RecordError::SpecGrantsMore { .. })
        ));
        check_spec(&record, t.path(), Some(&volume)).unwrap();

        let other_image = crio_volume("/var/lib/containers/storage/overlay/l2/merged");
        for changed in [
            other_image,
            SpecMount {
                destination: "/elsewhere".into(),
                ..volume.clone()
            },
            SpecMount {
                options: [volume.options.clone(), vec!["upperdir=/tmp/u".into()]].concat(),
                ..volume.clone()
            },
        ] {
            bundle_with(t.path(), &[&changed]);
            assert!(
                matches!(
                    check_spec(&record, t.path(), Some(&volume)),
                    Err(RecordError::SpecGrantsMore { .. })
                ),
                "{changed:?} was left out"
            );
        }
        // The volume's mount beside another one: only the volume goes.
        let extra = SpecMount {
            destination: "/data".into(),
            source: "/srv/data".into(),
            kind: "bind".into(),
            options: vec!["rbind".into(), "rw".into()],
        };
        bundle_with(t.path(), &[&volume, &extra]);
        assert!(matches!(
            check_spec(&record, t.path(), Some(&volume)),
            Err(RecordError::SpecGrantsMore { .. })
        ));
    }
}
