//! The parts of the OCI image-spec (v1.1) that `build`, the on-disk layout and `extract` read and
//! write.
//!
//! Documents from a registry are parsed with `oci-spec`'s image types (`registry`), and the
//! cosign signature manifest is built with them. These structs remain for the layout and build
//! code, where digests are this crate's sha256-only [`Digest`] (an `oci-spec` descriptor accepts
//! any algorithm) and the JSON gpusnap writes keeps the field order of the spec's examples, so
//! rebuilt images stay byte-identical.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::digest::Digest;

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Uncompressed layer: what gpusnap writes (see the module docs for why).
pub const MEDIA_TYPE_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Gzip layer: accepted on extract, e.g. after a registry mirror recompressed the image.
pub const MEDIA_TYPE_LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_MEDIA_TYPE_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MEDIA_TYPE_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
pub const DOCKER_MEDIA_TYPE_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// `oci-layout` file content.
pub const OCI_LAYOUT_VERSION: &str = "1.0.0";

/// Largest JSON document (index, manifest, config) accepted; real ones are a few KiB. Bounds
/// memory when a registry or archive is hostile.
pub const MAX_JSON_BYTES: u64 = 8 << 20;

pub fn is_index_media_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_INDEX || mt == DOCKER_MEDIA_TYPE_MANIFEST_LIST
}

pub fn is_manifest_media_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_MANIFEST || mt == DOCKER_MEDIA_TYPE_MANIFEST
}

/// How a layer blob is compressed, from its media type; `None` for media types that are not
/// filesystem layers we can apply.
pub fn layer_compression(mt: &str) -> Option<Compression> {
    match mt {
        MEDIA_TYPE_LAYER_TAR | "application/vnd.oci.image.layer.nondistributable.v1.tar" => {
            Some(Compression::None)
        }
        MEDIA_TYPE_LAYER_TAR_GZIP
        | DOCKER_MEDIA_TYPE_LAYER_GZIP
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip" => Some(Compression::Gzip),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: Digest, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_owned(),
            digest,
            size,
            annotations: BTreeMap::new(),
            platform: None,
        }
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// `index.json` of a layout, or an image index blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// The execution part of an image config. A checkpoint image is never run as-is (engines only
/// mount it), so only labels are filled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    #[serde(rename = "Labels", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub config: RuntimeConfig,
    pub rootfs: RootFs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
}

/// The `oci-layout` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciLayout {
    pub image_layout_version: String,
}

/// Go's `GOARCH` spelling of a Rust `target_arch` (what OCI platforms and containerd use).
pub fn goarch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_json_shape() {
        let mut d = Descriptor::new(MEDIA_TYPE_MANIFEST, Digest::of(b"x"), 1);
        d.platform = Some(Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        });
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["mediaType"], MEDIA_TYPE_MANIFEST);
        assert_eq!(v["platform"]["os"], "linux");
        assert!(v.get("annotations").is_none());
        assert!(v["platform"].get("variant").is_none());
    }

    #[test]
    fn config_json_shape_and_lenient_read() {
        let c = ImageConfig {
            created: None,
            architecture: "amd64".into(),
            os: "linux".into(),
            config: RuntimeConfig::default(),
            rootfs: RootFs {
                kind: "layers".into(),
                diff_ids: vec![Digest::of(b"")],
            },
            history: vec![],
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["rootfs"]["type"], "layers");
        assert_eq!(v["rootfs"]["diff_ids"][0], Digest::of(b"").as_str());
        // Unknown fields (e.g. Docker's "container_config") are ignored.
        let mut v2 = v.clone();
        v2["container_config"] = serde_json::json!({"Cmd": ["sh"]});
        let back: ImageConfig = serde_json::from_value(v2).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn goarch_spelling() {
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(goarch("aarch64"), "arm64");
        assert_eq!(goarch("mips"), "mips");
    }

    #[test]
    fn compression_by_media_type() {
        assert_eq!(
            layer_compression(MEDIA_TYPE_LAYER_TAR),
            Some(Compression::None)
        );
        assert_eq!(
            layer_compression(DOCKER_MEDIA_TYPE_LAYER_GZIP),
            Some(Compression::Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.gpusnap.gpu.extent.v1"),
            None
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            None
        );
    }
}
