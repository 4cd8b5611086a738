//! Pushing an image, or a checkpoint built on the way, to a registry.
//!
//! Blobs the registry lacks (`HEAD`) are mounted from another repository of the same registry
//! when the node store ([`RegistryOptions::store`]) knows one that holds them, else uploaded,
//! each as one streamed upload straight from the layout's blob file (its digest checked as it
//! is read, the registry checking the digest on commit); then child manifests by digest, then
//! the top document under the tag, as the exact bytes whose digest we computed.

use std::path::Path;

use futures_util::{StreamExt, TryStreamExt};

use oci_client::RegistryOperation;

use super::client::{self, Session};
use super::cosign::{self, SignReport};
use super::reference::Reference;
use super::transfer::{self, Transfer};
use super::{block_on, RegistryOptions};
use crate::digest::{Digest, VerifyingReader};
use crate::error::ImageError;
use crate::oci_layout::ImageSource;
use crate::spec::{is_manifest_media_type, Descriptor, ImageIndex, ImageManifest};

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
    /// Blobs of the image, and of them those uploaded, mounted, or already there.
    pub transfer: Transfer,
    /// The signature pushed with [`RegistryOptions::sign_key`].
    pub signature: Option<SignReport>,
}

/// Pushes the image in `image` (OCI layout directory or oci-archive) to `reference`, and signs
/// it when [`RegistryOptions::sign_key`] is set.
pub fn push(
    image: &Path,
    reference: &str,
    opts: &RegistryOptions,
) -> Result<PushReport, ImageError> {
    let r = Reference::parse(reference, opts.plain_http)?;
    if image.is_dir() {
        // Nothing is uploaded from a layout holding a link or special file.
        crate::oci_layout::check_layout_tree(image)?;
    }
    let keypair = match &opts.sign_key {
        Some(k) => Some(cosign::load_private_key(k)?),
        None => None,
    };
    block_on(push_async(image, image, None, &r, opts, keypair.as_ref()))
}

/// Builds the checkpoint `source` (a gpusnap checkpoint directory, or a CRI checkpoint archive
/// or its tree) as [`crate::build`] would, and pushes it to `reference` without writing its
/// pack layers anywhere: each pack the registry lacks is read from the checkpoint's files
/// while it uploads. Only the small blobs (config, manifests, chunk list, the CRIU-images and
/// rootfs-diff layers) go into `scratch`, an empty directory the caller removes afterwards.
/// Encrypted and classic images are written into `scratch` whole, then pushed.
pub fn push_checkpoint(
    source: &Path,
    scratch: &Path,
    reference: &str,
    build: &crate::BuildOptions,
    opts: &RegistryOptions,
) -> Result<(crate::BuiltImage, PushReport), ImageError> {
    let r = Reference::parse(reference, opts.plain_http)?;
    let keypair = match &opts.sign_key {
        Some(k) => Some(cosign::load_private_key(k)?),
        None => None,
    };
    let build = crate::BuildOptions {
        layout_dir: Some(scratch.to_path_buf()),
        archive_path: None,
        image_name: Some(build.image_name.clone().unwrap_or_else(|| r.name())),
        ..build.clone()
    };
    let (mut built, deferred) = crate::build::build_with(source, &build, true)?;
    // The scratch layout is the caller's to remove, not an image to keep.
    built.layout_dir = None;
    let opts = RegistryOptions {
        image_name: Some(built.image_name.clone()),
        ..opts.clone()
    };
    let report = block_on(push_async(
        scratch,
        source,
        deferred.as_ref(),
        &r,
        &opts,
        keypair.as_ref(),
    ))?;
    if let Some(d) = &deferred {
        // Every pack was hashed again on its way out, so a change shows as a digest mismatch;
        // this names the file when it is one the registry already had.
        d.check_unchanged()?;
    }
    Ok((built, report))
}

/// Pushes the image in the layout or archive `image`. `deferred`: pack blobs missing from the
/// layout, produced from a checkpoint's files. `held_by`: what the node store records as the
/// pushed blobs' holder.
async fn push_async(
    image: &Path,
    held_by: &Path,
    deferred: Option<&crate::chunked::DeferredPacks>,
    r: &Reference,
    opts: &RegistryOptions,
    keypair: Option<&sigstore::crypto::signing_key::SigStoreKeyPair>,
) -> Result<PushReport, ImageError> {
    let started = std::time::Instant::now();
    let src = ImageSource::open(image)?;
    let resolved = src.resolve(opts.image_name.as_deref())?;
    let top = resolved.top.clone();
    if let Some(d) = &r.digest {
        if *d != top.digest {
            return Err(ImageError::invalid(
                "image reference",
                r.to_string(),
                format!("the image's digest is {}, not {d}", top.digest),
            ));
        }
    }
    let mut session = Session::new(r, opts)?;
    session.authenticate(RegistryOperation::Push).await?;

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
        transfer: Transfer::default(),
        signature: None,
    };
    let mut manifests = Vec::new();
    let mut blobs: Vec<Descriptor> = Vec::new();
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
            if !blobs.iter().any(|b| b.digest == blob.digest) {
                blobs.push(blob.clone());
            }
        }
        manifests.push((child.clone(), bytes));
    }
    // Blobs in parallel (bounded): each file is read and hashed on a blocking thread while
    // the others' requests proceed on this one. First what the registry lacks (HEAD), so the
    // progress line knows what will move.
    let missing: Vec<bool> = futures_util::stream::iter(blobs.iter())
        .map(|blob| {
            let session = &session;
            async move { Ok::<_, ImageError>(!session.blob_exists(&blob.digest).await?) }
        })
        .buffered(opts.parallel_blobs.max(1) * 4)
        .try_collect()
        .await?;
    if let Some(p) = &opts.progress {
        let (n, bytes) = blobs
            .iter()
            .zip(&missing)
            .filter(|(_, m)| **m)
            .fold((0, 0), |(n, b), (blob, _)| (n + 1, b + blob.size));
        p.expect(n, bytes);
    }
    // Repositories of this registry the node store says hold a blob: mount sources.
    let mount_sources = |d: &Digest| -> Vec<String> {
        let Some(ns) = &opts.store else {
            return Vec::new();
        };
        let own = format!("{}/{}", r.registry, r.repository);
        transfer::blob_id(d)
            .ok()
            .and_then(|id| ns.store.sources_of(&id, &r.registry).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|s| *s != own)
            .filter_map(|s| s.split_once('/').map(|(_, repo)| repo.to_owned()))
            .collect()
    };
    let outcomes: Vec<(Digest, BlobOutcome)> =
        futures_util::stream::iter(blobs.iter().zip(&missing))
            .map(|(blob, missing)| {
                let session = &session;
                let src = &src;
                let sources = if *missing {
                    mount_sources(&blob.digest)
                } else {
                    Vec::new()
                };
                async move {
                    if !*missing {
                        tracing::debug!(digest = %blob.digest, "blob already in registry");
                        return Ok((blob.digest.clone(), BlobOutcome::Present));
                    }
                    // One mount attempt (from the first repository the store names): a registry
                    // that does not mount from it answers with an upload session, used below.
                    let mut upload_session = None;
                    if let Some(from) = sources.first() {
                        match session.mount_blob(&blob.digest, from).await? {
                            client::Mount::Mounted => {
                                tracing::debug!(digest = %blob.digest, from, "blob mounted");
                                if let Some(p) = &opts.progress {
                                    p.moved(blob.size);
                                    p.blob_done();
                                }
                                return Ok((blob.digest.clone(), BlobOutcome::Mounted));
                            }
                            client::Mount::Upload(l) => upload_session = Some(l),
                        }
                    }
                    let body = match deferred.and_then(|d| d.reader(&blob.digest)) {
                        Some(r) => VerifyingReader::new(
                            r,
                            &blob.digest,
                            blob.size,
                            "pack layer",
                            format!("checkpoint {}", held_by.display()),
                        ),
                        None => src.blob(blob, "blob")?,
                    };
                    session
                        .upload_blob(&blob.digest, blob.size, body, upload_session)
                        .await?;
                    if let Some(p) = &opts.progress {
                        p.blob_done();
                    }
                    tracing::debug!(digest = %blob.digest, size = blob.size, "blob uploaded");
                    Ok::<_, ImageError>((blob.digest.clone(), BlobOutcome::Uploaded))
                }
            })
            .buffer_unordered(opts.parallel_blobs.max(1))
            .try_collect()
            .await?;
    for blob in &blobs {
        let outcome = outcomes
            .iter()
            .find(|(d, _)| *d == blob.digest)
            .map_or(BlobOutcome::Present, |(_, o)| *o);
        match outcome {
            BlobOutcome::Uploaded => {
                report.bytes_uploaded += blob.size;
                report.uploaded.push(blob.digest.clone());
                report.transfer.count(blob.size, true);
            }
            BlobOutcome::Mounted => {
                report.skipped.push(blob.digest.clone());
                report.transfer.count(blob.size, false);
                report.transfer.present_blobs -= 1;
                report.transfer.mounted_blobs += 1;
            }
            BlobOutcome::Present => {
                report.skipped.push(blob.digest.clone());
                report.transfer.count(blob.size, false);
            }
        }
    }
    if resolved.index.is_some() {
        for (desc, bytes) in &manifests {
            session
                .put_manifest(desc.digest.as_str(), &desc.media_type, bytes)
                .await?;
        }
    }
    let top_bytes = match &resolved.index {
        Some(_) => src.json_blob::<ImageIndex>(&top, "image index")?.1,
        None => manifests
            .first()
            .map(|(_, b)| b.clone())
            .expect("one child when there is no index"),
    };
    let stored = session
        .put_manifest(&r.manifest_ref(), &top.media_type, &top_bytes)
        .await?;
    if stored != top.digest {
        return Err(ImageError::DigestMismatch {
            what: "pushed top manifest".into(),
            expected: top.digest.clone(),
            actual: stored,
            location: src.location(),
        });
    }
    if let (Some(kp), Some(key)) = (keypair, &opts.sign_key) {
        report.signature = Some(cosign::sign_digest(&session, r, &top.digest, kp, key).await?);
    }
    if let Some(ns) = &opts.store {
        // Where these blobs now are, so a push of them to another repository of this registry
        // mounts them. Best effort: the push itself succeeded.
        let recorded = (|| -> Result<(), ImageError> {
            let ids = blobs
                .iter()
                .map(|b| transfer::blob_id(&b.digest))
                .collect::<Result<Vec<_>, _>>()?;
            let lease = ns.store.lease()?;
            let holder =
                gpusnap_node_store::Holder::of(held_by).map_err(ImageError::io("stat", held_by))?;
            ns.store.record(
                &lease,
                &gpusnap_node_store::RefRecord {
                    name: format!(
                        "push {}@{} from {}",
                        r.name(),
                        top.digest,
                        held_by.display()
                    ),
                    source: Some(format!("{}/{}", r.registry, r.repository)),
                    holder: Some(holder),
                    blobs: ids,
                },
            )?;
            Ok(())
        })();
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "store: could not record the pushed blobs' repository");
        }
    }
    tracing::info!(
        image = %src.location(),
        reference = %report.reference,
        digest = %report.digest,
        uploaded = report.uploaded.len(),
        skipped = report.skipped.len(),
        bytes_uploaded = report.bytes_uploaded,
        signed = report.signature.is_some(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image pushed"
    );
    Ok(report)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlobOutcome {
    Uploaded,
    Mounted,
    Present,
}
