//! `image::inspect`: what a checkpoint image holds, without unpacking its large layers.
//!
//! Reads index.json, the image index, manifest and config (each verified against its digest),
//! and the small gpusnap-manifest layer, whose content is checked against the
//! `io.gpusnap.manifest.digest` annotation. CRIU and GPU layers are described, not read.
//!
//! An encrypted image (ocicrypt's format) is described from what stays in the clear: sizes,
//! annotations, the recipients its layers' keys are wrapped for. The gpusnap manifest is read
//! only when one of the given keys opens its layer, and then only after the layer's HMAC
//! matched; without such a key it is reported sealed, with the recipients that would open it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::annotations::{keys, LayerRole, SourceLayout};
use super::crypt::{decrypting, Decryption};
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
    /// The sealed gpusnap manifest, when the image carries one (and, encrypted, a key opened it).
    pub gpusnap_manifest: Option<Manifest>,
    /// For an image with encrypted layers: what is known of them without opening them.
    pub encryption: Option<EncryptionInfo>,
}

/// What `inspect` says of an image whose layers are encrypted (ocicrypt's format).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EncryptionInfo {
    /// How many layers are encrypted (gpusnap encrypts all of them).
    pub encrypted_layers: usize,
    /// The recipients the layers' keys are wrapped for, once each: `ALG key KID`.
    pub recipients: Vec<String>,
    /// Whether the gpusnap manifest's layer was opened.
    pub manifest_layer: ManifestLayer,
}

/// The gpusnap manifest's layer of an encrypted image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum ManifestLayer {
    /// A given key opened it, its HMAC and the manifest's digest matched.
    Opened,
    /// No given key opens it (`reason` names the recipients and the keys tried).
    Sealed { reason: String },
}

/// Describes the only image of an OCI layout directory or oci-archive.
pub fn inspect(image: &Path) -> Result<ImageInfo, ImageError> {
    inspect_named(image, None)
}

/// Like [`inspect`], choosing the image by name when there are several.
pub fn inspect_named(image: &Path, name: Option<&str>) -> Result<ImageInfo, ImageError> {
    inspect_with(image, name, &Decryption::default())
}

/// Like [`inspect_named`], opening an encrypted image's gpusnap-manifest layer with
/// `decryption`'s keys when one of them can.
pub fn inspect_with(
    image: &Path,
    name: Option<&str>,
    decryption: &Decryption,
) -> Result<ImageInfo, ImageError> {
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
    let mut encryption = encryption_of(&layers, &src.location())?;
    let gpusnap_manifest = match layers.iter().find(|l| l.role == LayerRole::GpusnapManifest) {
        Some(l) => {
            let location = format!("{} layer {}", src.location(), l.descriptor.digest);
            match decryption.open(&l.descriptor, &location) {
                Ok(key) => Some(read_manifest_layer(
                    &src,
                    &l.descriptor,
                    key.as_deref(),
                    gpusnap_manifest_digest.as_ref(),
                )?),
                Err(ImageError::Crypt {
                    reason: gpusnap_image_crypt::CryptError::NoKey(why),
                    ..
                }) => {
                    if let Some(e) = encryption.as_mut() {
                        e.manifest_layer = ManifestLayer::Sealed { reason: why };
                    }
                    None
                }
                Err(e) => return Err(e),
            }
        }
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
        encryption,
    })
}

/// `None` for an image without encrypted layers.
fn encryption_of(
    layers: &[LayerInfo],
    location: &str,
) -> Result<Option<EncryptionInfo>, ImageError> {
    let mut recipients: Vec<String> = Vec::new();
    let mut encrypted_layers = 0;
    for l in layers {
        if gpusnap_image_crypt::plain_media_type(&l.descriptor.media_type).is_none() {
            continue;
        }
        encrypted_layers += 1;
        let named =
            gpusnap_image_crypt::layer_recipients(&l.descriptor.annotations).map_err(|reason| {
                ImageError::Crypt {
                    location: format!("{location} layer {}", l.descriptor.digest),
                    reason,
                }
            })?;
        for r in named.iter().map(ToString::to_string) {
            if !recipients.contains(&r) {
                recipients.push(r);
            }
        }
    }
    Ok((encrypted_layers > 0).then_some(EncryptionInfo {
        encrypted_layers,
        recipients,
        manifest_layer: ManifestLayer::Opened,
    }))
}

/// Reads `checkpoint/gpusnap-manifest.json` out of the gpusnap-manifest layer (decrypted with
/// `key` when it is encrypted), verifying the layer blob, its HMAC, and the file's digest.
fn read_manifest_layer(
    src: &ImageSource,
    desc: &Descriptor,
    key: Option<&gpusnap_image_crypt::LayerKey>,
    want: Option<&Digest>,
) -> Result<Manifest, ImageError> {
    let location = format!("{} layer {}", src.location(), desc.digest);
    let media_type =
        gpusnap_image_crypt::plain_media_type(&desc.media_type).unwrap_or(&desc.media_type);
    let compression =
        layer_compression(media_type).ok_or_else(|| ImageError::UnsupportedMediaType {
            what: "gpusnap manifest layer",
            media_type: desc.media_type.clone(),
            location: location.clone(),
        })?;
    let target = format!("{CHECKPOINT_DIR}/{MANIFEST_FILE}");
    let mut blob = src.blob(desc, "layer")?;
    let found = {
        let mut plain = decrypting(key, &mut blob, &location)?;
        let read = (|| -> Result<Option<Vec<u8>>, ImageError> {
            let reader: Box<dyn Read + '_> = match compression {
                Compression::None => Box::new(&mut plain),
                Compression::Gzip => Box::new(GzDecoder::new(&mut plain)),
            };
            let mut found = None;
            let mut archive = tar::Archive::new(reader);
            for entry in archive.entries().map_err(|e| io_to_image(e, &location))? {
                let mut entry = entry.map_err(|e| io_to_image(e, &location))?;
                let raw = entry
                    .path()
                    .map_err(|e| io_to_image(e, &location))?
                    .into_owned();
                if normalize_member(Path::new(&location), &raw)?.as_deref() == Some(target.as_str())
                {
                    let mut bytes = Vec::new();
                    (&mut entry)
                        .take(MAX_MANIFEST_BYTES)
                        .read_to_end(&mut bytes)
                        .map_err(|e| io_to_image(e, &location))?;
                    found = Some(bytes);
                }
            }
            Ok(found)
        })();
        // Nothing read from an encrypted layer counts until its HMAC matched; a tar reader
        // that refused garbage first is reported as the tampering it is.
        plain.finish_read(&location)?;
        read?
    };
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
