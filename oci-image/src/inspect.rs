//! `image::inspect`: what a checkpoint image holds, without unpacking its large layers.
//!
//! Reads index.json, the image index, manifest and config (each verified against its digest),
//! and the small gpusnap-manifest layer, whose content is checked against the
//! `io.gpusnap.manifest.digest` annotation. CRIU and GPU layers are described, not read.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::annotations::{keys, LayerRole, SourceLayout};
use super::digest::{io_to_image, Digest};
use super::error::ImageError;
use super::oci_layout::{entry_name, ImageSource};
use super::source::{normalize_member, CHECKPOINT_DIR};
use super::spec::{layer_compression, Compression, Descriptor};
use super::LayerInfo;
use gpusnap_checkpoint::layout::MANIFEST_FILE;
use gpusnap_checkpoint::manifest::Manifest;

const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// A description of one checkpoint image, for `gpusnap inspect`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageInfo {
    /// The layout directory or oci-archive read.
    pub location: String,
    /// Every image name in index.json.
    pub image_names: Vec<String>,
    /// Name of the image described (when it has one).
    pub image_name: Option<String>,
    /// The image index index.json points at, when the image has one (gpusnap images do).
    pub index_digest: Option<Digest>,
    pub index_annotations: BTreeMap<String, String>,
    pub manifest_digest: Digest,
    pub manifest_annotations: BTreeMap<String, String>,
    pub config_digest: Digest,
    pub architecture: String,
    pub os: String,
    pub created: Option<String>,
    /// The container name engines will see (containerd's key, else CRI-O's); `None` means
    /// neither engine treats this image as a checkpoint.
    pub checkpoint_name: Option<String>,
    pub source_layout: Option<SourceLayout>,
    pub layers: Vec<LayerInfo>,
    pub total_layer_bytes: u64,
    pub gpusnap_manifest_digest: Option<Digest>,
    /// The sealed gpusnap manifest, when the image carries one.
    pub gpusnap_manifest: Option<Manifest>,
}

/// Describes the only image of an OCI layout directory or oci-archive.
pub fn inspect(image: &Path) -> Result<ImageInfo, ImageError> {
    inspect_named(image, None)
}

/// Like [`inspect`], choosing the image by name when there are several.
pub fn inspect_named(image: &Path, name: Option<&str>) -> Result<ImageInfo, ImageError> {
    let src = ImageSource::open(image)?;
    let all = src.read_index()?;
    let r = src.resolve(name)?;
    let diff_ids = &r.config.rootfs.diff_ids;
    if diff_ids.len() != r.manifest.layers.len() {
        return Err(ImageError::malformed(
            "image config",
            src.location(),
            format!(
                "{} diff_ids for {} layers",
                diff_ids.len(),
                r.manifest.layers.len()
            ),
        ));
    }
    let layers: Vec<LayerInfo> = r
        .manifest
        .layers
        .iter()
        .zip(diff_ids)
        .map(|(d, diff)| LayerInfo {
            role: d
                .annotation(keys::GPUSNAP_LAYER_ROLE)
                .map_or(LayerRole::Unknown, LayerRole::parse),
            descriptor: d.clone(),
            diff_id: diff.clone(),
            gpu_extent: d
                .annotation(keys::GPUSNAP_GPU_EXTENT_PATH)
                .map(str::to_owned),
        })
        .collect();

    let ann = &r.manifest.annotations;
    let gpusnap_manifest_digest = ann
        .get(keys::GPUSNAP_MANIFEST_DIGEST)
        .map(|d| Digest::parse(d))
        .transpose()?;
    let gpusnap_manifest = match layers.iter().find(|l| l.role == LayerRole::GpusnapManifest) {
        Some(l) => Some(read_manifest_layer(
            &src,
            &l.descriptor,
            gpusnap_manifest_digest.as_ref(),
        )?),
        None => None,
    };
    let index_target = r.index.as_ref().map(|_| r.top.digest.clone());
    Ok(ImageInfo {
        location: src.location(),
        image_names: all
            .manifests
            .iter()
            .filter_map(|d| entry_name(d).map(str::to_owned))
            .collect(),
        image_name: entry_name(&r.top).map(str::to_owned),
        index_digest: index_target,
        index_annotations: r
            .index
            .as_ref()
            .map(|i| i.annotations.clone())
            .unwrap_or_default(),
        manifest_digest: r.manifest_desc.digest.clone(),
        manifest_annotations: ann.clone(),
        config_digest: r.manifest.config.digest.clone(),
        architecture: r.config.architecture.clone(),
        os: r.config.os.clone(),
        created: r.config.created.clone(),
        checkpoint_name: ann
            .get(keys::CRIU_CONTAINER_NAME)
            .or_else(|| ann.get(keys::CRIO_CHECKPOINT_NAME))
            .cloned(),
        source_layout: ann
            .get(keys::GPUSNAP_SOURCE_LAYOUT)
            .and_then(|s| SourceLayout::parse(s)),
        total_layer_bytes: layers.iter().map(|l| l.descriptor.size).sum(),
        layers,
        gpusnap_manifest_digest,
        gpusnap_manifest,
    })
}

/// Reads `checkpoint/gpusnap-manifest.json` out of the gpusnap-manifest layer, verifying the
/// layer blob and the file's digest.
fn read_manifest_layer(
    src: &ImageSource,
    desc: &Descriptor,
    want: Option<&Digest>,
) -> Result<Manifest, ImageError> {
    let location = format!("{} layer {}", src.location(), desc.digest);
    let compression =
        layer_compression(&desc.media_type).ok_or_else(|| ImageError::UnsupportedMediaType {
            what: "gpusnap manifest layer",
            media_type: desc.media_type.clone(),
            location: location.clone(),
        })?;
    let target = format!("{CHECKPOINT_DIR}/{MANIFEST_FILE}");
    let mut blob = src.blob(desc, "layer")?;
    let mut found = None;
    {
        let reader: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut blob),
            Compression::Gzip => Box::new(GzDecoder::new(&mut blob)),
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(|e| io_to_image(e, &location))? {
            let mut entry = entry.map_err(|e| io_to_image(e, &location))?;
            let raw = entry
                .path()
                .map_err(|e| io_to_image(e, &location))?
                .into_owned();
            if normalize_member(Path::new(&location), &raw)?.as_deref() == Some(target.as_str()) {
                let mut bytes = Vec::new();
                (&mut entry)
                    .take(MAX_MANIFEST_BYTES)
                    .read_to_end(&mut bytes)
                    .map_err(|e| io_to_image(e, &location))?;
                found = Some(bytes);
            }
        }
    }
    blob.finish()?;
    let Some(bytes) = found else {
        return Err(ImageError::ManifestMissing {
            source_path: location.into(),
        });
    };
    if let Some(want) = want {
        let got = Digest::of(&bytes);
        if &got != want {
            return Err(ImageError::DigestMismatch {
                what: "gpusnap manifest".into(),
                expected: want.clone(),
                actual: got,
                location,
            });
        }
    }
    serde_json::from_slice(&bytes).map_err(|e| ImageError::ManifestInvalid {
        source_path: location.into(),
        reason: e.to_string(),
    })
}
