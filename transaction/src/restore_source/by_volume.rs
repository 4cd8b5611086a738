//! Restore from a checkpoint image the pod mounts as an image volume (Kubernetes
//! `volumes[].image`, KEP-4639): a pod spec alone restores on whatever node it lands on.
//!
//! The pod carries `gpusnap.io/restore-from-volume: MOUNT_PATH` (or
//! `gpusnap.io/restore-from-volume.CONTAINER: MOUNT_PATH`), the `mountPath` at which the
//! container mounts the volume. The kubelet passes neither volume names nor image references
//! to the runtime, only mounts, so the path is what identifies the volume. containerd (2.1+)
//! mounts the pulled image read-only at `…/io.containerd.grpc.v1.cri/image-volumes/<sandbox
//! id>/<image digest>` and gives the container a read-only bind of it there; that mount,
//! and nothing else, is accepted: a pod cannot point gpusnap at another directory of the
//! host. What the volume holds is hostile, and goes through the transaction's volume door
//! ([`crate::volume`]).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use gpusnap_config::{Config, RESTORE_FROM_VOLUME_ANNOTATION};

use super::{Container, RestoreSource, Runtime, CRIO_VOLUMES};
use crate::bundle_spec::SpecMount;
use crate::volume::{VolumeSource, CACHE_DIR};

/// Why the image volume an annotation names cannot be restored from. `key` is the annotation,
/// `value` its value.
#[derive(Debug, thiserror::Error)]
pub enum ByVolumeError {
    #[error(
        "annotation {key}: {value:?} is not an absolute path without '..' or control \
         characters; it names the mountPath at which the container mounts the checkpoint image \
         volume"
    )]
    NotAPath { key: String, value: String },
    #[error(
        "annotation {key} asks to restore from the image volume at {value}, but the container \
         mounts nothing there; mount the checkpoint image as a volume \
         (`volumes[].image.reference`, `readOnly: true`) at volumeMounts[].mountPath {value}"
    )]
    NothingMounted { key: String, value: String },
    #[error(
        "annotation {key}: the mount at {value} is not a read-only image volume (options \
         {options:?}); mount the checkpoint image as `volumes[].image` with `readOnly: true`"
    )]
    NotReadOnly {
        key: String,
        value: String,
        options: Vec<String>,
    },
    #[error(
        "annotation {key}: the mount at {value} is not an image volume of this pod (containerd \
         mounts those from …/image-volumes/{sandbox}/<image digest>; this one comes from {}); \
         mount the checkpoint image as `volumes[].image`, on containerd 2.1 or later with the \
         ImageVolume feature",
        mounted_from.display()
    )]
    NotThisPods {
        key: String,
        value: String,
        sandbox: String,
        /// The mount's source.
        mounted_from: PathBuf,
    },
    #[error(
        "annotation {key}: the mount at {value} is not an image volume of this pod (CRI-O mounts \
         those as a read-only overlay of the image it pulled, recorded in \
         io.kubernetes.cri-o.Volumes; this one is a {kind:?} mount from {mounted_from:?}); mount \
         the checkpoint image as `volumes[].image`, on CRI-O 1.31 or later with the ImageVolume \
         feature"
    )]
    NotCrioImageVolume {
        key: String,
        value: String,
        kind: String,
        mounted_from: String,
    },
}

/// The annotation (key, value) asking this container to restore from a volume, if any: the
/// container's own wins over the pod's; none for the pod's sandbox container.
pub fn requested(annotations: &HashMap<String, String>) -> Option<(String, &str)> {
    super::annotation(annotations, RESTORE_FROM_VOLUME_ANNOTATION)
}

/// The restore a container's annotations ask for from an image volume, if any, checked
/// against the container's `mounts`.
pub fn resolve(
    annotations: &HashMap<String, String>,
    mounts: &[SpecMount],
    config: &Config,
) -> Result<Option<RestoreSource>, ByVolumeError> {
    let Some((key, value)) = requested(annotations) else {
        return Ok(None);
    };
    let Some(wanted) = clean_absolute(value) else {
        return Err(ByVolumeError::NotAPath {
            key,
            value: value.to_owned(),
        });
    };
    let Some(mount) = mounts
        .iter()
        .rev() // the last mount at a path is the one the container sees
        .find(|m| clean_absolute(&m.destination).is_some_and(|d| d == wanted))
    else {
        return Err(ByVolumeError::NothingMounted {
            key,
            value: value.to_owned(),
        });
    };
    let container = Container::of(annotations);
    let (source, digest) = match container.runtime {
        Runtime::Containerd => {
            containerd_volume(key, value, mount, container.sandbox_id.unwrap_or(""))?
        }
        Runtime::CriO => crio_volume(key, value, mount, &wanted, annotations)?,
    };
    Ok(Some(RestoreSource {
        image: source.clone(),
        rootfs_diff: None,
        signature_evidence: Default::default(),
        volume: Some(Box::new(VolumeSource {
            mount: source,
            image_digest: digest,
            destination: PathBuf::from(&mount.destination),
            shown: value.to_string(),
            cache: config.restore.checkpoint_root.join(CACHE_DIR),
            spec_mount: mount.clone(),
        })),
    }))
}

/// containerd's image volume: a read-only bind of `…/image-volumes/<sandbox id>/<image
/// digest>`, the directory it mounted the image it pulled for this pod at. Returns the
/// directory and the digest.
fn containerd_volume(
    key: String,
    value: &str,
    mount: &SpecMount,
    sandbox: &str,
) -> Result<(PathBuf, String), ByVolumeError> {
    let has = |o: &str| mount.options.iter().any(|m| m == o);
    let bind = mount.kind == "bind" || has("bind") || has("rbind");
    if !bind || !has("ro") {
        return Err(ByVolumeError::NotReadOnly {
            key,
            value: value.to_owned(),
            options: mount.options.clone(),
        });
    }
    let source = PathBuf::from(&mount.source);
    match VolumeSource::digest_of_mount(&source, sandbox) {
        Some(digest) => Ok((source, digest)),
        None => Err(ByVolumeError::NotThisPods {
            key,
            value: value.to_owned(),
            sandbox: sandbox.to_owned(),
            mounted_from: source,
        }),
    }
}

/// One entry of CRI-O's `io.kubernetes.cri-o.Volumes` (its `oci.ContainerVolume`).
#[derive(Debug, serde::Deserialize)]
struct CrioVolume {
    container_path: String,
    host_path: String,
    #[serde(default)]
    image: Option<CrioImage>,
}

#[derive(Debug, serde::Deserialize)]
struct CrioImage {
    image: String,
}

/// CRI-O's image volume (`server/container_create_linux.go`, `mountImage`): an overlay with
/// no upper layer (read-only whatever the pod says) of exactly two lower directories, the
/// image CRI-O mounted from its storage and its empty `image-volumes` directory; the image's
/// id is in CRI-O's own record of the container's volumes, for that mount and that directory.
/// CRI-O writes that annotation after the pod's, so a pod cannot forge it; a pod's host path
/// becomes a bind mount, never an overlay. Returns the image's directory and id.
fn crio_volume(
    key: String,
    value: &str,
    mount: &SpecMount,
    wanted: &Path,
    annotations: &HashMap<String, String>,
) -> Result<(PathBuf, String), ByVolumeError> {
    let refuse = || ByVolumeError::NotCrioImageVolume {
        key: key.clone(),
        value: value.to_owned(),
        kind: mount.kind.clone(),
        mounted_from: mount.source.clone(),
    };
    let [option] = mount.options.as_slice() else {
        return Err(refuse());
    };
    let lower = option.strip_prefix("lowerdir=").ok_or_else(refuse)?;
    let (image_dir, empty) = lower.split_once(':').ok_or_else(refuse)?;
    // Plain absolute paths; no third lower directory (overlay splits on ':').
    let plain = |p: &str| !p.contains(':') && clean_absolute(p).is_some_and(|c| c == Path::new(p));
    if mount.kind != "overlay"
        || mount.source != "overlay"
        || !plain(image_dir)
        || !plain(empty)
        || Path::new(empty).file_name() != Some(std::ffi::OsStr::new("image-volumes"))
    {
        return Err(refuse());
    }
    let volumes: Vec<CrioVolume> = annotations
        .get(CRIO_VOLUMES)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let id = volumes
        .iter()
        .find(|v| {
            v.host_path == image_dir && clean_absolute(&v.container_path).as_deref() == Some(wanted)
        })
        .and_then(|v| v.image.as_ref())
        .map(|i| i.image.strip_prefix("sha256:").unwrap_or(&i.image))
        .filter(|id| id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .ok_or_else(refuse)?;
    Ok((PathBuf::from(image_dir), id.to_owned()))
}

/// `p` as an absolute path of plain components (no `..`, `.` or repeated `/`), or `None`.
fn clean_absolute(p: &str) -> Option<PathBuf> {
    // The value goes into errors, events and logs: no control character, no page of text.
    if p.len() > 4096 || p.chars().any(char::is_control) {
        return None;
    }
    let path = Path::new(p);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle_spec::BundleSpec;
    use crate::restore_source::{
        CONTAINERD_NAME as CONTAINER_NAME, CONTAINERD_SANDBOX_ID as SANDBOX_ID,
        CONTAINERD_TYPE as CONTAINER_TYPE,
    };

    /// The resolution from `spec`'s mounts, its refusal as the message a front end shows.
    fn pending_restore(
        spec: Option<&serde_json::Value>,
        annotations: &HashMap<String, String>,
        config: &Config,
    ) -> Result<Option<RestoreSource>, String> {
        let spec = spec.map(|v| BundleSpec::from_bytes(&serde_json::to_vec(v).unwrap()).unwrap());
        let mounts = spec.as_ref().map(SpecMount::of).unwrap_or_default();
        resolve(annotations, &mounts, config).map_err(|e| e.to_string())
    }

    const SANDBOX: &str = "5b1c";

    fn digest() -> String {
        "d".repeat(64)
    }

    fn volume_source() -> String {
        format!(
            "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/{SANDBOX}/{}",
            digest()
        )
    }

    fn spec(mounts: serde_json::Value) -> serde_json::Value {
        serde_json::json!({ "mounts": mounts })
    }

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut a: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.insert(SANDBOX_ID.into(), SANDBOX.into());
        a.insert(CONTAINER_TYPE.into(), "container".into());
        a
    }

    fn image_mount(dest: &str) -> serde_json::Value {
        serde_json::json!({
            "destination": dest, "type": "bind", "source": volume_source(),
            "options": ["rbind", "rprivate", "ro"]
        })
    }

    #[test]
    fn the_image_volume_at_the_annotated_path_is_found() {
        let mut c = Config::default();
        c.restore.checkpoint_root = "/var/lib/gpusnap/checkpoints".into();
        let s = spec(serde_json::json!([
            {"destination": "/etc/hosts", "type": "bind", "source": "/x/hosts", "options": ["rbind", "ro"]},
            image_mount("/ckpt"),
        ]));
        for value in ["/ckpt", "/ckpt/", "//ckpt/."] {
            let r = pending_restore(
                Some(&s),
                &ann(&[("gpusnap.io/restore-from-volume", value)]),
                &c,
            )
            .unwrap()
            .unwrap();
            let v = r.volume.unwrap();
            assert_eq!(v.mount, PathBuf::from(volume_source()));
            assert_eq!(v.image_digest, digest());
            assert_eq!(
                v.cache,
                PathBuf::from("/var/lib/gpusnap/checkpoints/.gpusnap-volumes")
            );
        }
        // The container's own annotation wins; other containers and the sandbox: none.
        let mut a = ann(&[
            ("gpusnap.io/restore-from-volume", "/elsewhere"),
            ("gpusnap.io/restore-from-volume.app", "/ckpt"),
        ]);
        a.insert(CONTAINER_NAME.into(), "app".into());
        assert!(pending_restore(Some(&s), &a, &c).unwrap().is_some());
        a.insert(CONTAINER_TYPE.into(), "sandbox".into());
        assert!(pending_restore(Some(&s), &a, &c).unwrap().is_none());
        assert!(pending_restore(Some(&s), &ann(&[]), &c).unwrap().is_none());
    }

    #[test]
    fn other_mounts_and_paths_are_refused_with_what_to_do() {
        let c = Config::default();
        let refuse = |mounts: serde_json::Value, value: &str| {
            pending_restore(
                Some(&spec(mounts)),
                &ann(&[("gpusnap.io/restore-from-volume", value)]),
                &c,
            )
            .unwrap_err()
        };
        for bad in ["ckpt", "/ckpt/../etc", "", "/ckpt\n\x1b[2Jforged log line"] {
            let e = refuse(serde_json::json!([image_mount("/ckpt")]), bad);
            assert!(e.contains("not an absolute path"), "{bad}: {e}");
        }
        let e = refuse(serde_json::json!([image_mount("/ckpt")]), "/other");
        assert!(
            e.contains("mounts nothing there") && e.contains("volumes[].image"),
            "{e}"
        );
        let mut rw = image_mount("/ckpt");
        rw["options"] = serde_json::json!(["rbind", "rw"]);
        let e = refuse(serde_json::json!([rw]), "/ckpt");
        assert!(e.contains("not a read-only image volume"), "{e}");
        // A host path (or another pod's image volume) at the path is not this pod's volume.
        let mut host = image_mount("/ckpt");
        host["source"] = serde_json::json!("/var/lib/gpusnap/checkpoints/x");
        let e = refuse(serde_json::json!([host]), "/ckpt");
        assert!(e.contains("not an image volume of this pod"), "{e}");
        let mut other = image_mount("/ckpt");
        other["source"] = serde_json::json!(volume_source().replace(SANDBOX, "other"));
        let e = refuse(serde_json::json!([other]), "/ckpt");
        assert!(e.contains("not an image volume of this pod"), "{e}");
    }

    /// CRI-O's annotations of a container whose image volume `id` is mounted from `dir` at
    /// `/ckpt` (what `SpecAddAnnotations` writes, trimmed).
    fn crio_ann(pairs: &[(&str, &str)], dir: &str, id: &str) -> HashMap<String, String> {
        let mut a: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.insert(
            "io.kubernetes.cri-o.ContainerType".into(),
            "container".into(),
        );
        a.insert("io.kubernetes.container.name".into(), "app".into());
        a.insert(
            CRIO_VOLUMES.into(),
            serde_json::json!([
                {"container_path": "/etc/hosts", "host_path": "/etc/hosts", "readonly": true},
                {"container_path": "/ckpt", "host_path": dir, "readonly": true, "image": {"image": id}},
            ])
            .to_string(),
        );
        a
    }

    fn crio_mount(lower: &str) -> serde_json::Value {
        serde_json::json!({
            "destination": "/ckpt", "type": "overlay", "source": "overlay",
            "options": [format!("lowerdir={lower}")]
        })
    }

    #[test]
    fn crio_image_volumes_are_found_by_their_overlay_and_crios_record() {
        let c = Config::default();
        let dir = "/var/lib/containers/storage/overlay/abc/merged";
        let lower = format!("{dir}:/var/run/crio/image-volumes");
        let s = spec(serde_json::json!([crio_mount(&lower)]));
        let want = ("gpusnap.io/restore-from-volume.app", "/ckpt");
        let r = pending_restore(Some(&s), &crio_ann(&[want], dir, &digest()), &c)
            .unwrap()
            .unwrap();
        let v = r.volume.unwrap();
        assert_eq!(v.mount, PathBuf::from(dir));
        assert_eq!(v.image_digest, digest());
        // The pause container sees the pod's annotations too.
        let mut sandbox = crio_ann(&[want], dir, &digest());
        sandbox.insert("io.kubernetes.cri-o.ContainerType".into(), "sandbox".into());
        assert!(pending_restore(Some(&s), &sandbox, &c).unwrap().is_none());

        let refuse = |mounts: serde_json::Value, ann: HashMap<String, String>| {
            pending_restore(Some(&spec(mounts)), &ann, &c).unwrap_err()
        };
        // A host path, an overlay with an upper layer or other lower directories, another
        // image directory than CRI-O recorded, no or a malformed image id: not CRI-O's volume.
        let host = serde_json::json!([{"destination": "/ckpt", "type": "bind", "source": dir, "options": ["rbind", "ro"]}]);
        let mut upper = crio_mount(&lower);
        upper["options"] =
            serde_json::json!([format!("lowerdir={lower}"), "upperdir=/x", "workdir=/y"]);
        for (mounts, ann) in [
            (host, crio_ann(&[want], dir, &digest())),
            (
                serde_json::json!([upper]),
                crio_ann(&[want], dir, &digest()),
            ),
            (
                serde_json::json!([crio_mount(&format!(
                    "{dir}:/etc:/var/run/crio/image-volumes"
                ))]),
                crio_ann(&[want], dir, &digest()),
            ),
            (
                serde_json::json!([crio_mount("/etc:/var/run/crio/image-volumes")]),
                crio_ann(&[want], dir, &digest()),
            ),
            (
                serde_json::json!([crio_mount(&format!(
                    "{dir}/../x:/var/run/crio/image-volumes"
                ))]),
                crio_ann(&[want], dir, &digest()),
            ),
            (
                serde_json::json!([crio_mount(&lower)]),
                crio_ann(&[want], dir, "../../etc"),
            ),
            (
                serde_json::json!([crio_mount(&lower)]),
                crio_ann(&[want], "/elsewhere", &digest()),
            ),
        ] {
            let e = refuse(mounts, ann);
            assert!(e.contains("not an image volume of this pod (CRI-O"), "{e}");
        }
        let mut none = crio_ann(&[want], dir, &digest());
        none.remove(CRIO_VOLUMES);
        let e = refuse(serde_json::json!([crio_mount(&lower)]), none);
        assert!(e.contains("io.kubernetes.cri-o.Volumes"), "{e}");
    }
}
