//! Restore from a checkpoint image the pod mounts as an image volume (Kubernetes
//! `volumes[].image`, KEP-4639): a pod spec alone restores on whatever node it lands on.
//!
//! The pod carries `gpusnap.io/restore-from-volume: MOUNT_PATH` (or
//! `gpusnap.io/restore-from-volume.CONTAINER: MOUNT_PATH`), the `mountPath` at which the
//! container mounts the volume. The kubelet passes neither volume names nor image references
//! to the runtime, only mounts, so the path is what identifies the volume. containerd (2.1+)
//! mounts the pulled image read-only at `…/io.containerd.grpc.v1.cri/image-volumes/<sandbox
//! id>/<image digest>` and gives the container a read-only bind of it there; that mount,
//! and nothing else, is accepted: a pod cannot point the shim at another directory of the
//! host. What the volume holds is hostile, and goes through the transaction's volume door
//! (`gpusnap_transaction::volume`).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use gpusnap_config::{Config, RESTORE_FROM_VOLUME_ANNOTATION};
use gpusnap_transaction::volume::{VolumeSource, CACHE_DIR};

use crate::state::PendingRestore;

const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// The annotation (key, value) asking this container to restore from a volume, if any: the
/// container's own wins over the pod's.
pub fn requested(annotations: &HashMap<String, String>) -> Option<(String, &str)> {
    if annotations.get(CONTAINER_TYPE).map(String::as_str) == Some("sandbox") {
        return None;
    }
    let per_container = annotations
        .get(CONTAINER_NAME)
        .map(|n| format!("{RESTORE_FROM_VOLUME_ANNOTATION}.{n}"));
    per_container
        .and_then(|k| annotations.get(&k).map(|v| (k, v.as_str())))
        .or_else(|| {
            annotations
                .get(RESTORE_FROM_VOLUME_ANNOTATION)
                .map(|v| (RESTORE_FROM_VOLUME_ANNOTATION.to_string(), v.as_str()))
        })
}

/// The restore a container's annotations ask for from an image volume, if any, checked
/// against the container's spec (its mounts) at Create.
pub fn pending_restore(
    spec: Option<&serde_json::Value>,
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<PendingRestore>, String> {
    let Some((key, value)) = requested(annotations) else {
        return Ok(None);
    };
    let wanted = clean_absolute(value).ok_or_else(|| {
        format!(
            "annotation {key}: {value:?} is not an absolute path without '..' or control \
             characters; it names the mountPath at which the container mounts the checkpoint \
             image volume"
        )
    })?;
    let mounts = spec
        .and_then(|s| s.get("mounts"))
        .and_then(|m| m.as_array())
        .cloned()
        .unwrap_or_default();
    let mount = mounts
        .iter()
        .rev() // the last mount at a path is the one the container sees
        .find(|m| {
            m.get("destination")
                .and_then(|d| d.as_str())
                .and_then(clean_absolute)
                .is_some_and(|d| d == wanted)
        })
        .ok_or_else(|| {
            format!(
                "annotation {key} asks to restore from the image volume at {value}, but the \
                 container mounts nothing there; mount the checkpoint image as a volume \
                 (`volumes[].image.reference`, `readOnly: true`) at volumeMounts[].mountPath \
                 {value}"
            )
        })?;
    let options: Vec<&str> = mount
        .get("options")
        .and_then(|o| o.as_array())
        .map(|o| o.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let bind = mount.get("type").and_then(|t| t.as_str()) == Some("bind")
        || options.iter().any(|o| *o == "bind" || *o == "rbind");
    if !bind || !options.contains(&"ro") {
        return Err(format!(
            "annotation {key}: the mount at {value} is not a read-only image volume (options \
             {options:?}); mount the checkpoint image as `volumes[].image` with `readOnly: true`"
        ));
    }
    let source = mount
        .get("source")
        .and_then(|s| s.as_str())
        .map(PathBuf::from)
        .unwrap_or_default();
    let sandbox = annotations
        .get(SANDBOX_ID)
        .map(String::as_str)
        .unwrap_or("");
    let digest = VolumeSource::digest_of_mount(&source, sandbox).ok_or_else(|| {
        format!(
            "annotation {key}: the mount at {value} is not an image volume of this pod \
             (containerd mounts those from …/image-volumes/{sandbox}/<image digest>; this one \
             comes from {}); mount the checkpoint image as `volumes[].image`, on containerd 2.1 \
             or later with the ImageVolume feature",
            source.display()
        )
    })?;
    Ok(Some(PendingRestore {
        image: source.clone(),
        parent: None,
        rootfs_diff: None,
        signature_evidence: Default::default(),
        volume: Some(Box::new(VolumeSource {
            mount: source,
            image_digest: digest,
            destination: PathBuf::from(
                mount
                    .get("destination")
                    .and_then(|d| d.as_str())
                    .unwrap_or_default(),
            ),
            shown: value.to_string(),
            cache: config.restore.checkpoint_root.join(CACHE_DIR),
        })),
    }))
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
}
