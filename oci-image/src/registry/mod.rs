//! Pushing checkpoint images to, and pulling them from, an OCI distribution registry.
//!
//! Plain HTTP only, and only when asked for explicitly (`http://` in the reference or
//! [`RegistryOptions::plain_http`]): the intended registries are a node-local or
//! cluster-internal insecure registry. No authentication yet.
//!
//! Integrity: push lets the registry verify each blob (the digest travels with the upload) and
//! checks the local blob's digest as it streams; pull verifies every manifest and blob against
//! its digest before it lands in the layout, so a tampered registry copy is refused with
//! [`ImageError::DigestMismatch`].

mod client;
pub mod reference;

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::annotations::keys;
use super::digest::{io_to_image, Digest, VerifyingReader};
use super::error::ImageError;
use super::oci_layout::{
    prepare_empty_dir, single_entry_index, ImageSource, LayoutWriter, RemoveOnDrop,
};
use super::spec::{
    is_index_media_type, is_manifest_media_type, Descriptor, ImageIndex, ImageManifest,
    MAX_JSON_BYTES, MEDIA_TYPE_MANIFEST,
};
use client::Client;
pub use reference::Reference;

/// How to talk to the registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Use plain HTTP for references without a scheme.
    pub plain_http: bool,
    /// Which image of a multi-image layout to push (its `ref.name` / `io.containerd.image.name`).
    pub image_name: Option<String>,
    /// Idle timeout for each socket read or write.
    pub io_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: false,
            image_name: None,
            io_timeout: Duration::from_secs(120),
        }
    }
}

/// What [`push`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PushReport {
    pub reference: String,
    /// Digest of the document the tag now points at (the image index for gpusnap images).
    pub digest: Digest,
    pub media_type: String,
    pub uploaded: Vec<Digest>,
    /// Blobs the registry already had (`HEAD` answered 200).
    pub skipped: Vec<Digest>,
    pub bytes_uploaded: u64,
}

/// What [`pull`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PullReport {
    pub reference: String,
    pub layout_dir: PathBuf,
    pub digest: Digest,
    pub media_type: String,
    /// Blobs written (manifests, configs and layers), all verified.
    pub blobs: usize,
    pub bytes: u64,
}

/// Pushes the image in `image` (OCI layout directory or oci-archive) to `reference`.
pub fn push(
    image: &Path,
    reference: &str,
    opts: &RegistryOptions,
) -> Result<PushReport, ImageError> {
    let started = std::time::Instant::now();
    let r = Reference::parse(reference, opts.plain_http)?;
    let client = Client::new(&r, opts)?;
    let src = ImageSource::open(image)?;
    let resolved = src.resolve(opts.image_name.as_deref())?;
    let top = resolved.top.clone();
    if let Some(d) = &r.digest {
        if *d != top.digest {
            return Err(ImageError::invalid(
                "image reference",
                reference,
                format!("the image's digest is {}, not {d}", top.digest),
            ));
        }
    }
    client.ping()?;

    // Children first: a registry refuses a manifest whose blobs, or an index whose manifests,
    // it does not have.
    let children: Vec<Descriptor> = match &resolved.index {
        Some(index) => index.manifests.clone(),
        None => vec![top.clone()],
    };
    let mut report = PushReport {
        reference: r.to_string(),
        digest: top.digest.clone(),
        media_type: top.media_type.clone(),
        uploaded: Vec::new(),
        skipped: Vec::new(),
        bytes_uploaded: 0,
    };
    let mut manifests = Vec::new();
    for child in &children {
        if !is_manifest_media_type(&child.media_type) {
            return Err(ImageError::UnsupportedMediaType {
                what: "image index entry",
                media_type: child.media_type.clone(),
                location: src.location(),
            });
        }
        let (manifest, bytes) = src.json_blob::<ImageManifest>(child, "image manifest")?;
        for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if report.uploaded.contains(&blob.digest) || report.skipped.contains(&blob.digest) {
                continue;
            }
            if client.blob_exists(&blob.digest)? {
                tracing::debug!(digest = %blob.digest, "blob already in registry");
                report.skipped.push(blob.digest.clone());
                continue;
            }
            let mut body = src.blob(blob, "blob")?;
            client.upload_blob(&blob.digest, blob.size, &mut body)?;
            // Local corruption would also make the registry refuse the upload; checking here
            // names the local file rather than a registry error code.
            body.finish()?;
            report.bytes_uploaded += blob.size;
            report.uploaded.push(blob.digest.clone());
            tracing::debug!(digest = %blob.digest, size = blob.size, "blob uploaded");
        }
        manifests.push((child.clone(), bytes));
    }
    for (desc, bytes) in &manifests {
        if resolved.index.is_some() {
            put_checked(
                &client,
                desc.digest.as_str(),
                &desc.media_type,
                bytes,
                &desc.digest,
            )?;
        }
    }
    let top_bytes = match &resolved.index {
        Some(_) => src.json_blob::<ImageIndex>(&top, "image index")?.1,
        None => manifests
            .first()
            .map(|(_, b)| b.clone())
            .expect("one child when there is no index"),
    };
    put_checked(
        &client,
        &r.manifest_ref(),
        &top.media_type,
        &top_bytes,
        &top.digest,
    )?;
    tracing::info!(
        image = %src.location(),
        reference = %report.reference,
        digest = %report.digest,
        uploaded = report.uploaded.len(),
        skipped = report.skipped.len(),
        bytes_uploaded = report.bytes_uploaded,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image pushed"
    );
    Ok(report)
}

fn put_checked(
    client: &Client,
    reference: &str,
    media_type: &str,
    bytes: &[u8],
    digest: &Digest,
) -> Result<(), ImageError> {
    if let Some(got) = client.put_manifest(reference, media_type, bytes)? {
        if got != digest.as_str() {
            return Err(ImageError::Registry {
                method: "PUT",
                url: reference.to_owned(),
                status: 201,
                code: None,
                message: format!("registry stored the manifest as {got}, expected {digest}"),
            });
        }
    }
    Ok(())
}

/// Pulls `reference` into a new OCI image layout at `dest` (must not exist or be empty),
/// verifying every manifest and blob digest. On any failure `dest` is left as it was.
pub fn pull(
    reference: &str,
    dest: &Path,
    opts: &RegistryOptions,
) -> Result<PullReport, ImageError> {
    let started = std::time::Instant::now();
    let r = Reference::parse(reference, opts.plain_http)?;
    let client = Client::new(&r, opts)?;
    let created = prepare_empty_dir(dest)?;
    let mut cleanup = RemoveOnDrop::new(dest, created);
    let mut layout = LayoutWriter::create(dest)?;
    let mut stats = (0usize, 0u64);

    let fetched = client.get_manifest(&r.manifest_ref())?;
    let location = format!("{}/{}", r.base_url(), r.repository);
    let actual = Digest::of(&fetched.bytes);
    let expected = match (&r.digest, &fetched.digest_header) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(h)) => Some(Digest::parse(h)?),
        (None, None) => None,
    };
    if let Some(expected) = expected {
        if expected != actual {
            return Err(ImageError::DigestMismatch {
                what: "manifest".into(),
                expected,
                actual,
                location: format!("{location} manifests/{}", r.manifest_ref()),
            });
        }
    }
    let media_type = document_media_type(&fetched.bytes, fetched.content_type.as_deref())
        .ok_or_else(|| ImageError::malformed("manifest", &location, "no media type"))?;
    layout.put_bytes(&fetched.bytes)?;
    stats.0 += 1;
    stats.1 += fetched.bytes.len() as u64;
    let mut top = Descriptor::new(&media_type, actual.clone(), fetched.bytes.len() as u64);

    let manifests: Vec<ImageManifest> = if is_index_media_type(&media_type) {
        let index: ImageIndex = serde_json::from_slice(&fetched.bytes)
            .map_err(|e| ImageError::malformed("image index", &location, e))?;
        if let Some(name) = index.annotations.get(keys::CRIU_CONTAINER_NAME) {
            top.annotations
                .insert(keys::CRIU_CONTAINER_NAME.into(), name.clone());
        }
        let mut out = Vec::new();
        for child in &index.manifests {
            if !is_manifest_media_type(&child.media_type) {
                return Err(ImageError::UnsupportedMediaType {
                    what: "image index entry",
                    media_type: child.media_type.clone(),
                    location: location.clone(),
                });
            }
            let bytes = fetch_manifest_by_digest(&client, child, &location)?;
            layout.put_bytes(&bytes)?;
            stats.0 += 1;
            stats.1 += bytes.len() as u64;
            out.push(
                serde_json::from_slice(&bytes)
                    .map_err(|e| ImageError::malformed("image manifest", &location, e))?,
            );
        }
        out
    } else if is_manifest_media_type(&media_type) {
        vec![serde_json::from_slice(&fetched.bytes)
            .map_err(|e| ImageError::malformed("image manifest", &location, e))?]
    } else {
        return Err(ImageError::UnsupportedMediaType {
            what: "manifest",
            media_type,
            location,
        });
    };

    for m in &manifests {
        for blob in std::iter::once(&m.config).chain(&m.layers) {
            if layout.blob_path(&blob.digest).exists() {
                continue;
            }
            fetch_blob(&client, &mut layout, blob)?;
            stats.0 += 1;
            stats.1 += blob.size;
        }
    }
    let name = r.name();
    top.annotations
        .insert(keys::OCI_REF_NAME.into(), name.clone());
    top.annotations
        .insert(keys::CONTAINERD_IMAGE_NAME.into(), name.clone());
    layout.finish(&single_entry_index(top.clone(), BTreeMap::new()))?;
    cleanup.disarm();
    tracing::info!(
        reference = %r,
        dest = %dest.display(),
        digest = %actual,
        blobs = stats.0,
        bytes = stats.1,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image pulled"
    );
    Ok(PullReport {
        reference: r.to_string(),
        layout_dir: dest.to_path_buf(),
        digest: actual,
        media_type: top.media_type,
        blobs: stats.0,
        bytes: stats.1,
    })
}

/// The `mediaType` field of a manifest document, else the response's Content-Type.
fn document_media_type(bytes: &[u8], content_type: Option<&str>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        config: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(bytes).ok()?;
    probe
        .media_type
        .or_else(|| content_type.map(str::to_owned))
        // OCI allows a manifest without mediaType; one with a config is a manifest.
        .or_else(|| probe.config.map(|_| MEDIA_TYPE_MANIFEST.to_owned()))
}

fn fetch_manifest_by_digest(
    client: &Client,
    desc: &Descriptor,
    location: &str,
) -> Result<Vec<u8>, ImageError> {
    if desc.size > MAX_JSON_BYTES {
        return Err(ImageError::malformed(
            "image index",
            location,
            format!("manifest {} claims {} bytes", desc.digest, desc.size),
        ));
    }
    let fetched = client.get_manifest(desc.digest.as_str())?;
    let actual = Digest::of(&fetched.bytes);
    let where_ = format!("{location} manifests/{}", desc.digest);
    if fetched.bytes.len() as u64 != desc.size {
        return Err(ImageError::SizeMismatch {
            what: "manifest".into(),
            digest: desc.digest.clone(),
            expected: desc.size,
            actual: fetched.bytes.len() as u64,
            location: where_,
        });
    }
    if actual != desc.digest {
        return Err(ImageError::DigestMismatch {
            what: "manifest".into(),
            expected: desc.digest.clone(),
            actual,
            location: where_,
        });
    }
    Ok(fetched.bytes)
}

/// Streams one blob to a scratch file, verifying size and digest, then commits it.
fn fetch_blob(
    client: &Client,
    layout: &mut LayoutWriter,
    desc: &Descriptor,
) -> Result<(), ImageError> {
    let url = client.blob_url(&desc.digest);
    let body = client.get_blob(&desc.digest)?;
    let mut reader = VerifyingReader::new(body, &desc.digest, desc.size, "blob", url.clone());
    let (tmp, file) = layout.tmp_file()?;
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        io::copy(&mut reader, &mut w).map_err(|e| io_to_image(e, &url))?;
        w.flush().map_err(ImageError::io("writing", &tmp))?;
        drop(w);
        reader.finish()?;
        layout.commit(&tmp, &desc.digest)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
