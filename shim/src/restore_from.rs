//! Restore requested by a pod annotation, for clusters whose containerd cannot restore
//! through CRI (2.2/2.3 disable it by default, 2.4 removed it).
//!
//! The pod carries `gpusnap.io/restore-from: NAME` (or `gpusnap.io/restore-from.CONTAINER:
//! NAME` when the pod has several containers), passed through the runtime handler's
//! `pod_annotations`. NAME is a checkpoint made available on the node under
//! `restore.checkpoint_root` (`gpusnap image pull REF --extract <root>/NAME` puts it there,
//! digests verified). The shim then restores that checkpoint in Start instead of starting the
//! container fresh. A name, not a path: a pod must not be able to point the shim, which runs
//! as root, at arbitrary host files.

use std::{collections::HashMap, path::Path};

use gpusnap_config::{Config, RESTORE_FROM_ANNOTATION};

use crate::state::PendingRestore;

const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// The restore a container's annotations ask for, if any.
pub fn pending_restore(
    annotations: &HashMap<String, String>,
    config: &Config,
) -> Result<Option<PendingRestore>, String> {
    // The pod's sandbox (pause) container sees the same annotations; it is never restored.
    if annotations.get(CONTAINER_TYPE).map(String::as_str) == Some("sandbox") {
        return Ok(None);
    }
    let per_container = annotations
        .get(CONTAINER_NAME)
        .map(|n| format!("{RESTORE_FROM_ANNOTATION}.{n}"));
    let (key, name) = match per_container
        .as_ref()
        .and_then(|k| annotations.get(k).map(|v| (k.clone(), v)))
        .or_else(|| {
            annotations
                .get(RESTORE_FROM_ANNOTATION)
                .map(|v| (RESTORE_FROM_ANNOTATION.to_string(), v))
        }) {
        Some(found) => found,
        None => return Ok(None),
    };
    let valid = !name.is_empty()
        && name != "."
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(format!(
            "annotation {key}: {name:?} is not a checkpoint name (letters, digits, '.', '_', '-'); \
             it names a directory under {}",
            config.restore.checkpoint_root.display()
        ));
    }
    let dir = config.restore.checkpoint_root.join(name);
    if !dir.is_dir() {
        return Err(format!(
            "annotation {key} asks to restore checkpoint {name:?}, but {} does not exist on this \
             node; pull it first: `gpusnap image pull <image> --extract {}`",
            dir.display(),
            dir.display()
        ));
    }
    Ok(Some(resolve(&dir)))
}

/// A CRI checkpoint archive's layout (`checkpoint/` + `rootfs-diff.tar`) or a plain checkpoint
/// directory.
fn resolve(dir: &Path) -> PendingRestore {
    let images = dir.join("checkpoint");
    if images.is_dir() {
        let diff = dir.join("rootfs-diff.tar");
        return PendingRestore {
            image: images,
            parent: None,
            rootfs_diff: diff.is_file().then_some(diff),
        };
    }
    PendingRestore {
        image: dir.to_path_buf(),
        parent: None,
        rootfs_diff: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(root: &Path) -> Config {
        let mut c = Config::default();
        c.restore.checkpoint_root = root.to_path_buf();
        c
    }

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_annotation_means_a_fresh_start() {
        let root = tempfile::tempdir().unwrap();
        assert!(pending_restore(&ann(&[]), &config(root.path()))
            .unwrap()
            .is_none());
    }

    #[test]
    fn archive_layout_and_per_container_names() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("ck1/checkpoint")).unwrap();
        std::fs::write(root.path().join("ck1/rootfs-diff.tar"), b"").unwrap();
        std::fs::create_dir_all(root.path().join("plain")).unwrap();
        let c = config(root.path());
        let r = pending_restore(
            &ann(&[
                ("gpusnap.io/restore-from", "plain"),
                ("gpusnap.io/restore-from.app", "ck1"),
                (CONTAINER_NAME, "app"),
            ]),
            &c,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            r.image,
            root.path().join("ck1/checkpoint"),
            "per-container name wins"
        );
        assert_eq!(r.rootfs_diff, Some(root.path().join("ck1/rootfs-diff.tar")));
        let r = pending_restore(
            &ann(&[
                ("gpusnap.io/restore-from", "plain"),
                (CONTAINER_NAME, "web"),
            ]),
            &c,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.image, root.path().join("plain"));
        assert_eq!(r.rootfs_diff, None);
        let sandbox = ann(&[
            ("gpusnap.io/restore-from", "plain"),
            (CONTAINER_TYPE, "sandbox"),
        ]);
        assert!(
            pending_restore(&sandbox, &c).unwrap().is_none(),
            "the pause container starts fresh"
        );
    }

    #[test]
    fn paths_and_missing_checkpoints_are_refused_clearly() {
        let root = tempfile::tempdir().unwrap();
        let c = config(root.path());
        for bad in ["../etc", "/etc/passwd", "a/b", ""] {
            let err = pending_restore(&ann(&[("gpusnap.io/restore-from", bad)]), &c).unwrap_err();
            assert!(err.contains("is not a checkpoint name"), "{bad}: {err}");
        }
        let err = pending_restore(&ann(&[("gpusnap.io/restore-from", "absent")]), &c).unwrap_err();
        assert!(
            err.contains("does not exist on this node") && err.contains("gpusnap image pull"),
            "{err}"
        );
    }
}
