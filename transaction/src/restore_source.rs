//! Which checkpoint a container asks to start from, by its annotations: the resolution every
//! front end shares (the containerd shim, gpusnap-runc for CRI-O and Podman).
//!
//! A pod asks with `gpusnap.io/restore-from[.CONTAINER]: NAME`, a checkpoint under
//! `restore.checkpoint_root` ([`by_name`]), or `gpusnap.io/restore-from-volume[.CONTAINER]:
//! MOUNT_PATH`, a checkpoint image the container mounts as an image volume ([`by_volume`]).
//! Everything read here — the annotations, the checkpoint directory, the spec's mounts — is
//! hostile: names resolve beneath the checkpoint root through no symlink, and only the image
//! volume the runtime itself mounted is accepted.
//!
//! Nothing here knows the protocol of the front end: it gets the annotations and the spec's
//! mounts as plain data and answers a [`RestoreSource`] or a [`RestoreSourceError`] whose
//! message says what to do.

use std::collections::HashMap;
use std::path::PathBuf;

use gpusnap_config::{Config, RESTORE_FROM_ANNOTATION, RESTORE_FROM_VOLUME_ANNOTATION};

use crate::host::Host;
use crate::restore::{RestoreReport, RestoreRequest, RootfsDiff};
use crate::signature::SignatureEvidence;
use crate::volume::VolumeSource;

pub mod by_name;
pub mod by_volume;

pub use crate::bundle_spec::SpecMount;
pub use by_name::ByNameError;
pub use by_volume::ByVolumeError;

/// containerd's CRI annotations naming the container, its kind and its pod.
const CONTAINERD_NAME: &str = "io.kubernetes.cri.container-name";
const CONTAINERD_TYPE: &str = "io.kubernetes.cri.container-type";
const CONTAINERD_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// CRI-O's: its own type and sandbox id, and the kubelet's container-name label, which CRI-O
/// adds to the spec's annotations.
const CRIO_NAME: &str = "io.kubernetes.container.name";
const CRIO_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
const CRIO_SANDBOX_ID: &str = "io.kubernetes.cri-o.SandboxID";
/// CRI-O's record of the container's volumes (JSON): for an image volume, the image's id.
const CRIO_VOLUMES: &str = "io.kubernetes.cri-o.Volumes";

/// The checkpoint a container restores from instead of starting fresh.
#[derive(Debug, Clone)]
pub struct RestoreSource {
    /// The checkpoint's images (for a volume: the volume's mount, until the node's copy of
    /// it is made at restore).
    pub image: PathBuf,
    /// Writable-layer changes to apply to the rootfs before CRIU runs (a CRI checkpoint
    /// archive's `rootfs-diff.tar`), with the digest recorded when it came onto the node.
    pub rootfs_diff: Option<RootfsDiff>,
    /// What vouches for the checkpoint; the restore transaction decides the signature policy
    /// on it.
    pub signature_evidence: SignatureEvidence,
    /// A checkpoint image mounted as an image volume: the restore makes (or finds) the
    /// node's copy of it ([`crate::volume::restore`]) and restores from that.
    pub volume: Option<Box<VolumeSource>>,
}

/// Why a container's restore annotations cannot be followed. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreSourceError {
    #[error(transparent)]
    ByName(#[from] ByNameError),
    #[error(transparent)]
    ByVolume(#[from] ByVolumeError),
    #[error(
        "the container is annotated both {RESTORE_FROM_ANNOTATION} and \
         {RESTORE_FROM_VOLUME_ANNOTATION}: restore from one checkpoint, the node-local one by \
         name or the image volume"
    )]
    Both,
}

/// The restore a container's annotations ask for: a node-local checkpoint by name, or a
/// checkpoint image mounted as an image volume (found among `mounts`, the spec's); `None`
/// when neither is asked; both at once is refused.
pub fn resolve(
    annotations: &HashMap<String, String>,
    mounts: &[SpecMount],
    config: &Config,
) -> Result<Option<RestoreSource>, RestoreSourceError> {
    let named = by_name::resolve(annotations, config)?;
    let volume = by_volume::resolve(annotations, mounts, config)?;
    match (named, volume) {
        (Some(_), Some(_)) => Err(RestoreSourceError::Both),
        (named, volume) => Ok(named.or(volume)),
    }
}

/// Restores `request` from the source it was resolved from: the node's copy of the image
/// volume's checkpoint, found or made first ([`crate::volume::restore`]), when `volume` names
/// one; else the checkpoint directory as it is. One choice for every door.
pub fn restore(
    volume: Option<&VolumeSource>,
    request: RestoreRequest,
    host: &dyn Host,
) -> crate::Result<RestoreReport> {
    match volume {
        Some(v) => crate::volume::restore(v, request, host).map(|(r, m)| {
            tracing::info!(
                id = %r.manifest.container_id,
                dir = %m.checkpoint_dir.display(),
                made = m.made,
                materialize_ms = m.elapsed_ms,
                "restored from the image volume"
            );
            r
        }),
        None => crate::restore(&request, host),
    }
}

/// Whether the container's annotations ask for a restore at all (either annotation, the
/// container's own or the pod's), before anything is resolved.
pub fn requested(annotations: &HashMap<String, String>) -> bool {
    annotation(annotations, RESTORE_FROM_ANNOTATION).is_some()
        || annotation(annotations, RESTORE_FROM_VOLUME_ANNOTATION).is_some()
}

/// The CRI runtime that wrote the spec, as its annotations say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Containerd,
    CriO,
}

/// The container as its runtime's annotations describe it.
struct Container<'a> {
    runtime: Runtime,
    /// The pod's sandbox (pause) container: it sees the pod's annotations but is never
    /// restored.
    sandbox: bool,
    /// The container's name in the pod, for `ANNOTATION.NAME`.
    name: Option<&'a str>,
    /// The pod sandbox's id.
    sandbox_id: Option<&'a str>,
}

impl<'a> Container<'a> {
    /// CRI-O's annotations when it names the container kind, else containerd's when it does,
    /// else CRI-O's (Podman, which writes neither). CRI-O first: it copies the pod's
    /// annotations into the spec and then writes its own keys over them, so a pod on CRI-O can
    /// forge containerd's keys but never CRI-O's (containerd passes a pod only the annotations
    /// its runtime handler allows, `gpusnap.io/` ones). Trusting containerd's keys first would
    /// let such a pod pass a host directory off as containerd's image-volume mount.
    fn of(annotations: &'a HashMap<String, String>) -> Self {
        let get = |k: &str| annotations.get(k).map(String::as_str);
        if get(CRIO_TYPE).is_none()
            && (get(CONTAINERD_TYPE).is_some() || get(CONTAINERD_NAME).is_some())
        {
            Container {
                runtime: Runtime::Containerd,
                sandbox: get(CONTAINERD_TYPE) == Some("sandbox"),
                name: get(CONTAINERD_NAME),
                sandbox_id: get(CONTAINERD_SANDBOX_ID),
            }
        } else {
            Container {
                runtime: Runtime::CriO,
                sandbox: get(CRIO_TYPE) == Some("sandbox"),
                name: get(CRIO_NAME),
                sandbox_id: get(CRIO_SANDBOX_ID),
            }
        }
    }
}

/// The annotation (key, value) `base` of this container: its own (`base.NAME`) wins over the
/// pod's; none for the pod's sandbox container.
fn annotation<'a>(
    annotations: &'a HashMap<String, String>,
    base: &str,
) -> Option<(String, &'a str)> {
    let container = Container::of(annotations);
    if container.sandbox {
        return None;
    }
    container
        .name
        .map(|n| format!("{base}.{n}"))
        .and_then(|k| annotations.get(&k).map(|v| (k, v.as_str())))
        .or_else(|| {
            annotations
                .get(base)
                .map(|v| (base.to_string(), v.as_str()))
        })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_pod_on_cri_o_cannot_pass_for_a_containerd_container() {
        let forged: HashMap<String, String> = [
            (CRIO_TYPE, "container"),
            (CRIO_NAME, "app"),
            (CONTAINERD_TYPE, "container"),
            (CONTAINERD_NAME, "app"),
            (CONTAINERD_SANDBOX_ID, "chosen"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let c = Container::of(&forged);
        assert_eq!(c.runtime, Runtime::CriO);
        assert_ne!(c.sandbox_id, Some("chosen"));
        let sandbox: HashMap<String, String> =
            [(CRIO_TYPE, "sandbox"), (CONTAINERD_TYPE, "container")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into();
        assert!(Container::of(&sandbox).sandbox);
    }
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_checkpoint_or_none_is_asked_for() {
        let root = tempfile::tempdir().unwrap();
        let mut c = Config::default();
        c.restore.checkpoint_root = root.path().to_path_buf();
        assert!(!requested(&ann(&[])));
        assert!(resolve(&ann(&[]), &[], &c).unwrap().is_none());
        // The container's own annotation, or the pod's; never the pod's sandbox.
        let own = ann(&[
            ("gpusnap.io/restore-from.app", "x"),
            (CRIO_NAME, "app"),
            (CRIO_TYPE, "container"),
        ]);
        assert!(requested(&own));
        let sandbox = ann(&[("gpusnap.io/restore-from", "x"), (CRIO_TYPE, "sandbox")]);
        assert!(!requested(&sandbox));
        assert!(resolve(&sandbox, &[], &c).unwrap().is_none());
        // Both at once, each one valid on its own: refused.
        std::fs::create_dir_all(root.path().join("x")).unwrap();
        gpusnap_checkpoint::origin::Origin {
            format: gpusnap_checkpoint::origin::ORIGIN_FORMAT,
            source: "test".into(),
            manifest_digest: "sha256:00".into(),
            pinned: true,
            signature: gpusnap_checkpoint::origin::SignatureCheck::NotChecked,
            rootfs_diff: None,
        }
        .write(&root.path().join("x"))
        .unwrap();
        let both = ann(&[
            ("gpusnap.io/restore-from", "x"),
            ("gpusnap.io/restore-from-volume", "/ckpt"),
            (CONTAINERD_TYPE, "container"),
            (CONTAINERD_SANDBOX_ID, "sb"),
        ]);
        let mounts = [SpecMount {
            destination: "/ckpt".into(),
            source: format!("/run/c/image-volumes/sb/{}", "d".repeat(64)),
            kind: "bind".into(),
            options: vec!["rbind".into(), "ro".into()],
        }];
        assert!(requested(&both));
        let mut one = both.clone();
        one.remove("gpusnap.io/restore-from");
        assert!(resolve(&one, &mounts, &c)
            .unwrap()
            .unwrap()
            .volume
            .is_some());
        let e = resolve(&both, &mounts, &c).unwrap_err();
        assert!(matches!(e, RestoreSourceError::Both), "{e}");
        assert!(e.to_string().starts_with(
            "the container is annotated both gpusnap.io/restore-from and \
             gpusnap.io/restore-from-volume"
        ));
    }
}
