//! Annotation keys, layer roles, and the checkpoint annotations derived from a CRI archive's
//! `config.dump` / `spec.dump` and the gpusnap manifest.
//!
//! Engines look for *different* keys: containerd 2.1–2.3 reads
//! `org.criu.checkpoint.container.name` on the image target, CRI-O reads
//! `io.kubernetes.cri-o.annotations.checkpoint.name` in the image annotations, Podman
//! `io.podman.annotations.checkpoint.name`. A combined image sets all three, on the image index
//! and on the image manifest, plus the informational `org.criu.checkpoint.*` keys
//! `checkpointctl build` writes (checkpointctl `lib/annotations.go`) where we can fill them.

use std::collections::BTreeMap;

use serde_json::Value;

use super::spec::goarch;
use gpusnap_checkpoint::manifest::Manifest;

/// Annotation keys.
pub mod keys {
    /// containerd's checkpoint-image marker (checkpointctl `CheckpointAnnotationName`).
    pub const CRIU_CONTAINER_NAME: &str = "org.criu.checkpoint.container.name";
    /// CRI-O's checkpoint-image marker (cri-o `internal/annotations/checkpoint.go`).
    pub const CRIO_CHECKPOINT_NAME: &str = "io.kubernetes.cri-o.annotations.checkpoint.name";
    /// Podman's checkpoint-image marker.
    pub const PODMAN_CHECKPOINT_NAME: &str = "io.podman.annotations.checkpoint.name";
    /// Podman restores a checkpoint image only with this key, and only when it equals the OCI
    /// runtime Podman runs (`podman --runtime NAME container restore IMAGE`).
    pub const PODMAN_CHECKPOINT_RUNTIME_NAME: &str =
        "io.podman.annotations.checkpoint.runtime.name";
    pub const CRIU_ENGINE_NAME: &str = "org.criu.checkpoint.engine.name";
    pub const CRIU_POD_NAME: &str = "org.criu.checkpoint.pod.name";
    pub const CRIU_POD_ID: &str = "org.criu.checkpoint.pod.id";
    pub const CRIU_POD_NAMESPACE: &str = "org.criu.checkpoint.pod.namespace";
    pub const CRIU_ROOTFS_IMAGE_NAME: &str = "org.criu.checkpoint.rootfsImageName";
    pub const CRIU_ROOTFS_IMAGE_USER_REQUESTED: &str =
        "org.criu.checkpoint.rootfsImageUserRequested";
    /// checkpointctl stores `config.dump`'s `rootfsImageRef` under this key.
    pub const CRIU_ROOTFS_IMAGE_ID: &str = "org.criu.checkpoint.rootfsImageID";
    pub const CRIU_RUNTIME_NAME: &str = "org.criu.checkpoint.runtime.name";
    pub const CRIU_RUNTIME_VERSION: &str = "org.criu.checkpoint.runtime.version";
    pub const CRIU_CRIU_VERSION: &str = "org.criu.checkpoint.criu.version";
    pub const CRIU_HOST_ARCH: &str = "org.criu.checkpoint.host.arch";
    pub const CRIU_HOST_KERNEL: &str = "org.criu.checkpoint.host.kernel";

    pub const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";
    pub const OCI_CREATED: &str = "org.opencontainers.image.created";
    pub const OCI_TITLE: &str = "org.opencontainers.image.title";
    /// Full image name for `ctr images import` (it prefers this over `ref.name`).
    pub const CONTAINERD_IMAGE_NAME: &str = "io.containerd.image.name";

    /// `sha256:` digest of `checkpoint/gpusnap-manifest.json`'s bytes.
    pub const GPUSNAP_MANIFEST_DIGEST: &str = "io.gpusnap.manifest.digest";
    pub const GPUSNAP_CONTAINER_ID: &str = "io.gpusnap.container.id";
    pub const GPUSNAP_VERSION: &str = "io.gpusnap.version";
    pub const GPUSNAP_GPU_ENGINE: &str = "io.gpusnap.gpu.engine";
    pub const GPUSNAP_GPU_EXTENTS: &str = "io.gpusnap.gpu.extents";
    /// `cri-archive` or `checkpoint-dir`: what [`crate::extract`] recreates.
    pub const GPUSNAP_SOURCE_LAYOUT: &str = "io.gpusnap.source.layout";
    /// On a compressed layer descriptor: the bytes of its tar once decompressed. Extraction
    /// refuses the layer as soon as it inflates past this (and past the free space).
    pub const GPUSNAP_LAYER_UNCOMPRESSED_SIZE: &str = "io.gpusnap.layer.uncompressed-size";
    /// On the manifest: the bytes of file content `rootfs-diff.tar` holds once decompressed.
    /// Extraction refuses the diff as soon as it inflates past this (and past the free space).
    pub const GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE: &str = "io.gpusnap.rootfs-diff.inflated-size";
    /// On each layer descriptor: which part of the checkpoint it carries.
    pub const GPUSNAP_LAYER_ROLE: &str = "io.gpusnap.layer.role";
    /// On GPU-extent layers: the extent's path relative to the checkpoint directory (as in the
    /// gpusnap manifest inventory), i.e. its file name `gpusnap-gpu-<name>`.
    pub const GPUSNAP_GPU_EXTENT_PATH: &str = "io.gpusnap.gpu.extent.path";
    /// On GPU-extent layers: size of the extent file itself.
    pub const GPUSNAP_GPU_EXTENT_SIZE: &str = "io.gpusnap.gpu.extent.size";
    /// On the image index and manifest of a chunked image: `true`.
    pub const GPUSNAP_CHUNKED: &str = "io.gpusnap.chunked";
    /// On chunk-pack layers: how many chunk files the pack holds.
    pub const GPUSNAP_CHUNK_COUNT: &str = "io.gpusnap.chunk.count";
}

/// What one layer of a gpusnap checkpoint image carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerRole {
    /// Archive-root files other than `rootfs-diff.tar`: `spec.dump`, `config.dump`, ...
    Metadata,
    /// `checkpoint/`: CRIU images, runc's `descriptors.json`, logs — minus GPU extents and the
    /// gpusnap manifest.
    CriuImages,
    /// `rootfs-diff.tar` (the container's rw layer, gzip despite the name).
    RootfsDiff,
    /// One GPU state file `checkpoint/gpusnap-gpu-<name>`.
    GpuExtent,
    /// `checkpoint/gpusnap-manifest.json`, last so it is applied last.
    GpusnapManifest,
    /// `checkpoint/gpusnap-chunks.json`: how the chunked files are assembled.
    ChunkList,
    /// Chunk files `checkpoint/.gpusnap-chunks/<sha256>`, each distinct chunk once.
    ChunkPack,
    /// A layer without (or with an unknown) role annotation: not built by gpusnap.
    Unknown,
}

impl LayerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerRole::Metadata => "metadata",
            LayerRole::CriuImages => "criu-images",
            LayerRole::RootfsDiff => "rootfs-diff",
            LayerRole::GpuExtent => "gpu-extent",
            LayerRole::GpusnapManifest => "gpusnap-manifest",
            LayerRole::ChunkList => "chunk-list",
            LayerRole::ChunkPack => "chunk-pack",
            LayerRole::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> LayerRole {
        match s {
            "metadata" => LayerRole::Metadata,
            "criu-images" => LayerRole::CriuImages,
            "rootfs-diff" => LayerRole::RootfsDiff,
            "gpu-extent" => LayerRole::GpuExtent,
            "gpusnap-manifest" => LayerRole::GpusnapManifest,
            "chunk-list" => LayerRole::ChunkList,
            "chunk-pack" => LayerRole::ChunkPack,
            _ => LayerRole::Unknown,
        }
    }
}

/// Which shape the image's files have, i.e. what extract recreates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceLayout {
    /// The tree of a CRI checkpoint archive: `checkpoint/`, `spec.dump`, `rootfs-diff.tar`, ...
    CriArchive,
    /// A bare checkpoint directory (CRIU images + `gpusnap-*` files), stored under `checkpoint/`.
    CheckpointDir,
}

impl SourceLayout {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceLayout::CriArchive => "cri-archive",
            SourceLayout::CheckpointDir => "checkpoint-dir",
        }
    }

    pub fn parse(s: &str) -> Option<SourceLayout> {
        match s {
            "cri-archive" => Some(SourceLayout::CriArchive),
            "checkpoint-dir" => Some(SourceLayout::CheckpointDir),
            _ => None,
        }
    }
}

/// The CRI metadata files read while building (both optional: a bare checkpoint directory has
/// neither).
#[derive(Debug, Default, Clone)]
pub(crate) struct CriMetadata {
    pub config_dump: Option<Value>,
    pub spec_dump: Option<Value>,
}

impl CriMetadata {
    fn config_str(&self, key: &str) -> Option<&str> {
        non_empty(self.config_dump.as_ref()?.get(key)?.as_str())
    }

    fn spec_annotation(&self, key: &str) -> Option<&str> {
        non_empty(
            self.spec_dump
                .as_ref()?
                .get("annotations")?
                .get(key)?
                .as_str(),
        )
    }

    /// `io.container.manager` of `spec.dump`: how checkpointctl tells engines apart.
    fn manager(&self) -> Option<&str> {
        self.spec_annotation("io.container.manager")
    }

    /// Engine name in checkpointctl's spelling; `None` without a `spec.dump`.
    pub fn engine(&self) -> Option<&'static str> {
        self.spec_dump.as_ref()?;
        Some(match self.manager() {
            Some("cri-o") => "CRI-O",
            Some("libpod") => "Podman",
            _ => "containerd",
        })
    }

    /// The container's name as its engine knows it.
    pub fn container_name(&self) -> Option<String> {
        let from_spec = match self.manager() {
            Some("cri-o") => self
                .spec_annotation("io.kubernetes.cri-o.Metadata")
                .and_then(|m| serde_json::from_str::<Value>(m).ok())
                .and_then(|m| m.get("name")?.as_str().map(str::to_owned)),
            Some("libpod") => None,
            _ => self
                .spec_annotation("io.kubernetes.cri.container-name")
                .map(str::to_owned),
        };
        from_spec
            .filter(|n| !n.is_empty())
            .or_else(|| self.config_str("name").map(str::to_owned))
    }

    fn pod(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        if self.manager() == Some("cri-o") {
            (
                self.spec_annotation("io.kubernetes.pod.name"),
                self.spec_annotation("io.kubernetes.cri-o.SandboxID"),
                self.spec_annotation("io.kubernetes.pod.namespace"),
            )
        } else {
            (
                self.spec_annotation("io.kubernetes.cri.sandbox-name"),
                self.spec_annotation("io.kubernetes.cri.sandbox-id"),
                self.spec_annotation("io.kubernetes.cri.sandbox-namespace"),
            )
        }
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The annotations of the image index and manifest.
pub(crate) fn image_annotations(
    cri: &CriMetadata,
    manifest: &Manifest,
    manifest_digest: &str,
    container_name: &str,
    layout: SourceLayout,
    gpu_extents: usize,
) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: Option<&str>| {
        if let Some(v) = non_empty(v) {
            a.insert(k.to_owned(), v.to_owned());
        }
    };
    put(keys::CRIU_CONTAINER_NAME, Some(container_name));
    put(keys::CRIO_CHECKPOINT_NAME, Some(container_name));
    put(keys::PODMAN_CHECKPOINT_NAME, Some(container_name));
    put(keys::CRIU_ENGINE_NAME, cri.engine());
    let (pod, pod_id, namespace) = cri.pod();
    put(keys::CRIU_POD_NAME, pod);
    put(keys::CRIU_POD_ID, pod_id);
    put(keys::CRIU_POD_NAMESPACE, namespace);
    put(
        keys::CRIU_ROOTFS_IMAGE_NAME,
        cri.config_str("rootfsImageName"),
    );
    put(
        keys::CRIU_ROOTFS_IMAGE_USER_REQUESTED,
        cri.config_str("rootfsImage"),
    );
    put(keys::CRIU_ROOTFS_IMAGE_ID, cri.config_str("rootfsImageRef"));
    put(keys::CRIU_RUNTIME_NAME, cri.config_str("runtime"));
    put(
        keys::PODMAN_CHECKPOINT_RUNTIME_NAME,
        cri.config_str("runtime"),
    );
    put(keys::CRIU_RUNTIME_VERSION, manifest.runc_version.as_deref());
    put(keys::CRIU_CRIU_VERSION, manifest.criu_version.as_deref());
    put(keys::CRIU_HOST_ARCH, Some(goarch(&manifest.host.arch)));
    put(keys::CRIU_HOST_KERNEL, Some(&manifest.host.kernel_release));
    put(keys::OCI_CREATED, Some(&manifest.created_at));
    put(keys::GPUSNAP_MANIFEST_DIGEST, Some(manifest_digest));
    put(keys::GPUSNAP_CONTAINER_ID, Some(&manifest.container_id));
    put(keys::GPUSNAP_VERSION, Some(&manifest.gpusnap_version));
    put(
        keys::GPUSNAP_GPU_ENGINE,
        manifest.gpu.as_ref().map(|g| g.engine.as_str()),
    );
    put(keys::GPUSNAP_SOURCE_LAYOUT, Some(layout.as_str()));
    let extents = gpu_extents.to_string();
    put(keys::GPUSNAP_GPU_EXTENTS, Some(&extents));
    a
}

/// `localhost/gpusnap-checkpoint/<name>:latest`, with `name` reduced to what a repository path
/// component allows.
pub(crate) fn default_image_name(container_name: &str) -> String {
    let mut repo: String = container_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    // A component must start and end with an alphanumeric.
    repo = repo
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned();
    if repo.is_empty() {
        repo = "checkpoint".to_owned();
    }
    format!("localhost/gpusnap-checkpoint/{repo}:latest")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containerd_metadata() {
        let cri = CriMetadata {
            config_dump: Some(json!({"id": "abc", "name": "ctr-name-from-config",
                "rootfsImage": "docker.io/library/busybox:latest",
                "rootfsImageRef": "sha256:1111", "rootfsImageName": "docker.io/library/busybox:latest",
                "runtime": "io.containerd.gpusnap.v2"})),
            spec_dump: Some(json!({"annotations": {
                "io.kubernetes.cri.container-name": "trainer",
                "io.kubernetes.cri.sandbox-name": "train-pod",
                "io.kubernetes.cri.sandbox-namespace": "ml",
                "io.kubernetes.cri.sandbox-id": "sb1"}})),
        };
        assert_eq!(cri.engine(), Some("containerd"));
        assert_eq!(cri.container_name().as_deref(), Some("trainer"));
        assert_eq!(cri.pod(), (Some("train-pod"), Some("sb1"), Some("ml")));
    }

    #[test]
    fn crio_and_fallbacks() {
        let cri = CriMetadata {
            config_dump: Some(json!({"name": "k8s_x"})),
            spec_dump: Some(json!({"annotations": {
                "io.container.manager": "cri-o",
                "io.kubernetes.cri-o.Metadata": "{\"name\":\"counter\"}",
                "io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "default"}})),
        };
        assert_eq!(cri.engine(), Some("CRI-O"));
        assert_eq!(cri.container_name().as_deref(), Some("counter"));
        let none = CriMetadata::default();
        assert_eq!(none.engine(), None);
        assert_eq!(none.container_name(), None);
        let only_config = CriMetadata {
            config_dump: Some(json!({"name": "from-config"})),
            spec_dump: Some(json!({"annotations": {}})),
        };
        assert_eq!(only_config.container_name().as_deref(), Some("from-config"));
    }

    #[test]
    fn image_names() {
        assert_eq!(
            default_image_name("Trainer_1"),
            "localhost/gpusnap-checkpoint/trainer_1:latest"
        );
        assert_eq!(
            default_image_name("a/b c"),
            "localhost/gpusnap-checkpoint/a-b-c:latest"
        );
        assert_eq!(
            default_image_name("--"),
            "localhost/gpusnap-checkpoint/checkpoint:latest"
        );
    }

    #[test]
    fn roles_round_trip() {
        for r in [
            LayerRole::Metadata,
            LayerRole::CriuImages,
            LayerRole::RootfsDiff,
            LayerRole::GpuExtent,
            LayerRole::GpusnapManifest,
            LayerRole::ChunkList,
            LayerRole::ChunkPack,
        ] {
            assert_eq!(LayerRole::parse(r.as_str()), r);
        }
        assert_eq!(LayerRole::parse("x"), LayerRole::Unknown);
    }
}
