//! Pushing checkpoint images to, pulling them from, and signing them in an OCI distribution
//! registry.
//!
//! The protocol is `oci-client`'s ([`client`] says what is added on top). HTTPS by default,
//! with the system roots plus any CA files given ([`RegistryOptions::ca_files`], PEM bundles
//! split into certificates); plain HTTP only when asked for (`http://` in the reference or
//! [`RegistryOptions::plain_http`]), meant for a loopback or node-local registry. Credentials
//! come from a docker `config.json` ([`Credentials`]); Basic and Bearer-token registries both
//! work.
//!
//! **Pull, in order.** (1) The top manifest or index is read by digest when the reference
//! names one, else by tag, capped at [`RegistryOptions::max_manifest_bytes`] and hashed; a
//! pinned digest, and the registry's `Docker-Content-Digest`, must match. For a tag, that digest
//! is what the registry says the tag means *now*: nothing pins the binding unless a signature
//! does. (2) The signature policy is applied to that digest ([`cosign`]); `require` refuses
//! here, before any blob is fetched. (3) Every child manifest (by digest), config and layer is
//! fetched with its size and digest checked while it streams, each capped. (4) Only then is the
//! layout, written in a staging directory beside the destination, renamed into place; any
//! failure or interruption ([`crate::interrupt`]) removes the staging directory.
//! [`pull_extract`] does the same checks in the same order but unpacks each layer beneath its
//! staging directory while the layer downloads (see there).
//!
//! **Push.** Blobs the registry lacks (`HEAD`) are mounted from another repository of the same
//! registry when the node store ([`RegistryOptions::store`]) knows one that holds them, else
//! uploaded, each as one streamed upload straight from the layout's blob file (its digest
//! checked as it is read, the registry checking the digest on commit); then child manifests by
//! digest, then the top document under the tag, as the exact bytes whose digest we computed.
//!
//! **The node store.** With [`RegistryOptions::store`], a pull takes every config and layer the
//! node already holds from the store and downloads only the others, into the store (see
//! [`transfer`]); [`PullReport::transfer`] and [`PushReport::transfer`] say what moved.
//!
//! **In parallel.** Up to [`RegistryOptions::parallel_blobs`] blobs move at once. The network
//! side of all of them runs on one thread; each blob's bytes are read or consumed (hashed,
//! written, unpacked) on a blocking thread of its own ([`channel`]), so hashing never holds
//! up the connections and several layers are written at once.

mod auth;
mod channel;
mod client;
pub mod cosign;
pub mod reference;
mod transfer;

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};

use gpusnap_checkpoint::origin::SignatureCheck;
use oci_client::RegistryOperation;

use super::annotations::keys;
use super::annotations::LayerRole;
use super::digest::Digest;
use super::digest::{io_to_image, VerifyingReader};
use super::error::ImageError;
use super::extract::{
    open_chunk_stream, unpack_layer, ExtractOptions, ExtractPlan, Extracted, OriginSeed,
    PlannedLayer, Staging,
};
use super::interrupt;
use super::oci_layout::{
    select_platform, single_entry_index, ImageSource, LayoutWriter, RemoveOnDrop,
};
use super::spec::{
    is_index_media_type, is_manifest_media_type, Descriptor, ImageConfig, ImageIndex,
    ImageManifest, MEDIA_TYPE_MANIFEST,
};
pub use auth::{default_docker_config, Credentials};
use client::Session;
pub use cosign::{sign, SignReport, SignatureOptions};
use gpusnap_checkpoint::chunks::StreamAssembly;
pub use reference::Reference;
pub use transfer::{NodeStore, Progress, ProgressSnapshot, Transfer};

/// Fewest blobs moved at once by default: enough to keep a loopback or LAN link and a local
/// disk busy while one blob's consumer waits on the other, few enough not to thrash one disk.
pub const DEFAULT_PARALLEL_BLOBS: usize = 4;

/// Default number of blobs moved at once on this machine: one per two cores, from
/// [`DEFAULT_PARALLEL_BLOBS`] up to 8. Each moving blob is hashed (and for an encrypted layer
/// decrypted and authenticated, three passes over its bytes) on a thread of its own, so a
/// many-core node keeps its link busy while it checks what arrives.
pub fn default_parallel_blobs() -> usize {
    std::thread::available_parallelism()
        .map_or(DEFAULT_PARALLEL_BLOBS, |n| n.get() / 2)
        .clamp(DEFAULT_PARALLEL_BLOBS, 8)
}
/// Default cap on a manifest, index, image config or signature manifest read from a registry.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Default cap on one blob: none of its own. A checkpoint of a node with 8 GPUs of 141 GB
/// carries 8 extents of about 141 GB and CRIU pages of host memory that can pass 1 TiB, so any
/// fixed number is either too small for such a node or no bound at all. What bounds a pull is
/// the destination: the blobs' declared sizes must fit in its free space before the first one
/// is fetched, and every byte written (a gzip layer's inflation included) is charged against
/// that free space. `--max-blob-bytes` sets a fixed cap in addition.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = u64::MAX;

/// How to talk to the registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Use plain HTTP for references without a scheme.
    pub plain_http: bool,
    /// Which image of a multi-image layout to push (its `ref.name` / `io.containerd.image.name`).
    pub image_name: Option<String>,
    /// Idle timeout for each socket read.
    pub io_timeout: Duration,
    /// PEM files (bundles allowed) of CAs trusted in addition to the system roots.
    pub ca_files: Vec<PathBuf>,
    pub credentials: Credentials,
    /// Cap on every manifest, index and image config read.
    pub max_manifest_bytes: u64,
    /// Cap on every blob, whatever its descriptor says.
    pub max_blob_bytes: u64,
    /// Signature policy and trusted keys for [`pull`].
    pub signatures: SignatureOptions,
    /// [`push`]: sign the pushed image with this private key ([`cosign::sign`]).
    pub sign_key: Option<PathBuf>,
    /// Blobs uploaded or downloaded (and consumed: hashed, written, unpacked) at once.
    pub parallel_blobs: usize,
    /// The node's blob store: a pull takes the blobs it holds from it and keeps the ones it
    /// fetches in it; a push learns from it where a blob can be mounted from ([`transfer`]).
    pub store: Option<NodeStore>,
    /// Counters updated as bytes move, for a progress line.
    pub progress: Option<std::sync::Arc<Progress>>,
    /// [`pull_extract`]: keys for encrypted layers.
    pub decryption: crate::crypt::Decryption,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: false,
            image_name: None,
            io_timeout: Duration::from_secs(120),
            ca_files: Vec::new(),
            credentials: Credentials::Auto,
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            signatures: SignatureOptions::default(),
            sign_key: None,
            parallel_blobs: default_parallel_blobs(),
            store: None,
            progress: None,
            decryption: Default::default(),
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
    /// Blobs of the image, and of them those uploaded, mounted, or already there.
    pub transfer: Transfer,
    /// The signature pushed with [`RegistryOptions::sign_key`].
    pub signature: Option<SignReport>,
}

/// What [`pull`] did, and what it verified.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PullReport {
    pub reference: String,
    pub layout_dir: PathBuf,
    /// Digest of the top document (index or manifest) everything else was checked against.
    pub digest: Digest,
    pub media_type: String,
    /// The reference named `digest` itself. When false, `digest` is what the registry said the
    /// tag pointed at during this pull; the tag→digest binding itself was not verified (unless
    /// `signature` is `Verified`).
    pub pinned: bool,
    /// The image manifests under the top document, each fetched by digest and checked.
    pub manifests: Vec<Digest>,
    /// Blobs written (manifests, configs and layers), each checked against its descriptor's
    /// digest and size.
    pub blobs: usize,
    pub bytes: u64,
    /// Configs and layers: how many were downloaded, and how many the node store already held.
    pub transfer: Transfer,
    pub signature: SignatureCheck,
}

impl PullReport {
    /// One sentence saying what was verified (and what was not).
    pub fn verification(&self) -> String {
        let binding = if self.pinned {
            format!("{} named by the reference", self.digest)
        } else {
            match &self.signature {
                SignatureCheck::Verified { .. } => format!(
                    "the tag resolved to {} at the registry; that digest is signed",
                    self.digest
                ),
                _ => format!(
                    "the tag resolved to {} at the registry (the tag→digest binding itself was \
                     not pinned)",
                    self.digest
                ),
            }
        };
        let children: Vec<&str> = self
            .manifests
            .iter()
            .filter(|d| **d != self.digest)
            .map(Digest::as_str)
            .collect();
        let tree = if children.is_empty() {
            String::new()
        } else {
            format!(" → image manifest {}", children.join(", "))
        };
        format!(
            "{binding}{tree}; {} blobs checked against that tree (every size and digest)",
            self.blobs
        )
    }
}

/// Runs `f` to completion on a private current-thread runtime (the registry code is async,
/// `oci-client`; the callers are not). An interruption ([`crate::interrupt::request`]) drops
/// `f` within a tenth of a second even while it waits on the network, and returns
/// [`ImageError::Interrupted`]; the caller's guards then remove what was written.
pub(crate) fn block_on<T>(f: impl Future<Output = Result<T, ImageError>>) -> Result<T, ImageError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(ImageError::invalid(
            "caller",
            "async context",
            "registry operations block; call them from a blocking thread (spawn_blocking)",
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ImageError::io(
            "starting",
            Path::new("the registry client runtime"),
        ))?;
    rt.block_on(async {
        let watch = async {
            while !interrupt::requested() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            r = f => r,
            () = watch => Err(ImageError::Interrupted),
        }
    })
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

/// How many times an extracting pull starts again after dropping damaged blobs of the node
/// store (each time at least one is gone for good, so an image of many damaged blobs needs
/// more than one round: the next pull goes on where this one stopped).
const MAX_HEALING_ATTEMPTS: usize = 4;

/// Refuses a destination that exists and is not an empty directory.
pub(crate) fn check_destination(dest: &Path) -> Result<(), ImageError> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("reading", dest)(e)),
        Ok(m) if m.is_dir() => {
            let mut entries = std::fs::read_dir(dest).map_err(ImageError::io("reading", dest))?;
            if entries.next().is_some() {
                Err(ImageError::DestinationExists {
                    path: dest.to_path_buf(),
                })
            } else {
                Ok(())
            }
        }
        Ok(_) => Err(ImageError::DestinationExists {
            path: dest.to_path_buf(),
        }),
    }
}

/// Pulls `reference` into a new OCI image layout at `dest` (must not exist or be empty),
/// verifying every manifest and blob digest and applying the signature policy (see the module
/// docs for the order). On any failure, `dest` is left as it was and nothing else remains.
pub fn pull(
    reference: &str,
    dest: &Path,
    opts: &RegistryOptions,
) -> Result<PullReport, ImageError> {
    let r = Reference::parse(reference, opts.plain_http)?;
    check_destination(dest)?;
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(ImageError::io("creating", parent))?;
    }
    // Named for this process and locked while it is written: if the pull is killed, the next
    // pull or `gpusnap store gc` removes what it left (`crate::staging`).
    let held = crate::staging::create(dest, crate::staging::Kind::Pull)?;
    let staging = held.path().to_path_buf();
    let mut cleanup = RemoveOnDrop::new(&staging, true);
    let lease = match &opts.store {
        Some(ns) => Some(std::sync::Arc::new(ns.store.lease()?)),
        None => None,
    };
    let (report, stored) = block_on(pull_async(&r, &staging, opts, lease.as_ref()))?;
    interrupt::check()?;
    std::fs::rename(&staging, dest).map_err(ImageError::io("renaming into place", dest))?;
    cleanup.disarm();
    drop(held);
    if let (Some(ns), Some(lease)) = (&opts.store, lease) {
        transfer::record_and_collect(
            ns,
            lease,
            format!("{}@{} in {}", r.name(), report.digest, dest.display()),
            format!("{}/{}", r.registry, r.repository),
            dest,
            stored,
        )?;
    }
    Ok(PullReport {
        layout_dir: dest.to_path_buf(),
        ..report
    })
}

/// The documents of a pull, fetched and checked in the order the module docs give: the top
/// manifest or index (steps 1–2, the signature policy applied to it) and every child manifest
/// (step 3, by digest).
struct Documents {
    top_bytes: Vec<u8>,
    /// The top document as `index.json` describes it (with the container name an engine looks
    /// for, when the index has one).
    top: Descriptor,
    /// Each image manifest's digest and bytes (the top document itself when it is one).
    manifests: Vec<(Digest, Vec<u8>)>,
    parsed: Vec<oci_spec::image::ImageManifest>,
    signature: SignatureCheck,
    location: String,
}

async fn fetch_documents(
    session: &Session,
    r: &Reference,
    opts: &RegistryOptions,
) -> Result<Documents, ImageError> {
    let location = format!("{}/{}", r.base_url(), r.repository);

    // (1) The top document, by digest or tag.
    let fetched = session
        .get_manifest(&r.manifest_ref(), opts.max_manifest_bytes)
        .await?;
    if let Some(want) = &r.digest {
        if *want != fetched.digest {
            return Err(ImageError::DigestMismatch {
                what: "manifest".into(),
                expected: want.clone(),
                actual: fetched.digest,
                location: fetched.url,
            });
        }
    }
    let actual = fetched.digest.clone();
    let media_type = document_media_type(&fetched.bytes, fetched.content_type.as_deref())
        .ok_or_else(|| ImageError::malformed("manifest", &location, "no media type"))?;

    // (2) The signature policy, before any blob is fetched.
    let signature = cosign::check(session, r, &actual, &opts.signatures).await?;

    let mut top = Descriptor::new(&media_type, actual.clone(), fetched.bytes.len() as u64);

    // (3) Child manifests by digest.
    let mut manifests = Vec::new();
    let mut parsed = Vec::new();
    if is_index_media_type(&media_type) {
        let index = oci_spec::image::ImageIndex::from_reader(&fetched.bytes[..])
            .map_err(|e| ImageError::malformed("image index", &location, e))?;
        if let Some(name) = index
            .annotations()
            .as_ref()
            .and_then(|a| a.get(keys::CRIU_CONTAINER_NAME))
        {
            top.annotations
                .insert(keys::CRIU_CONTAINER_NAME.into(), name.clone());
        }
        for child in index.manifests() {
            let child_mt = child.media_type().to_string();
            if !is_manifest_media_type(&child_mt) {
                return Err(ImageError::UnsupportedMediaType {
                    what: "image index entry",
                    media_type: child_mt,
                    location: location.clone(),
                });
            }
            let digest = Digest::parse(child.digest().as_ref())?;
            let bytes = fetch_manifest_by_digest(session, &digest, child.size(), opts).await?;
            parsed.push(
                oci_spec::image::ImageManifest::from_reader(&bytes[..])
                    .map_err(|e| ImageError::malformed("image manifest", &location, e))?,
            );
            manifests.push((digest, bytes));
        }
    } else if is_manifest_media_type(&media_type) {
        parsed.push(
            oci_spec::image::ImageManifest::from_reader(&fetched.bytes[..])
                .map_err(|e| ImageError::malformed("image manifest", &location, e))?,
        );
        manifests.push((actual.clone(), fetched.bytes.clone()));
    } else {
        return Err(ImageError::UnsupportedMediaType {
            what: "manifest",
            media_type,
            location,
        });
    }
    let name = r.name();
    top.annotations
        .insert(keys::OCI_REF_NAME.into(), name.clone());
    top.annotations
        .insert(keys::CONTAINERD_IMAGE_NAME.into(), name);
    Ok(Documents {
        top_bytes: fetched.bytes,
        top,
        manifests,
        parsed,
        signature,
        location,
    })
}

impl Documents {
    fn report(&self, r: &Reference, dir: &Path, blobs: usize, bytes: u64) -> PullReport {
        PullReport {
            reference: r.to_string(),
            layout_dir: dir.to_path_buf(),
            digest: self.top.digest.clone(),
            media_type: self.top.media_type.clone(),
            pinned: r.digest.is_some(),
            manifests: self.manifests.iter().map(|(d, _)| d.clone()).collect(),
            blobs,
            bytes,
            transfer: Transfer::default(),
            signature: self.signature.clone(),
        }
    }

    /// Documents (top and manifests, without duplicates) and their total size.
    fn counts(&self) -> (usize, u64) {
        let mut n = (1, self.top_bytes.len() as u64);
        for (d, b) in &self.manifests {
            if *d != self.top.digest {
                n.0 += 1;
                n.1 += b.len() as u64;
            }
        }
        n
    }
}

/// Refuses a blob whose descriptor is over its cap, before any byte of any blob is fetched.
fn check_cap(
    digest: &Digest,
    size: u64,
    what: &str,
    cap: u64,
    location: &str,
) -> Result<(), ImageError> {
    if size > cap {
        return Err(ImageError::TooLarge {
            what: what.into(),
            name: digest.to_string(),
            size,
            limit: cap,
            location: location.to_owned(),
            setting: if what == "layer" {
                "--max-blob-bytes"
            } else {
                "--max-manifest-bytes"
            },
        });
    }
    Ok(())
}

async fn pull_async(
    r: &Reference,
    staging: &Path,
    opts: &RegistryOptions,
    lease: Option<&std::sync::Arc<gpusnap_node_store::Lease>>,
) -> Result<(PullReport, Vec<gpusnap_node_store::BlobId>), ImageError> {
    let started = std::time::Instant::now();
    let mut session = Session::new(r, opts)?;
    session.authenticate(RegistryOperation::Pull).await?;
    let mut layout = LayoutWriter::create(staging)?;
    let docs = fetch_documents(&session, r, opts).await?;
    layout.put_bytes(&docs.top_bytes)?;
    for (_, bytes) in &docs.manifests {
        layout.put_bytes(bytes)?;
    }
    let (mut blobs, mut bytes) = docs.counts();

    // (3, continued) Configs and layers, in parallel (bounded), each into a scratch file that
    // is renamed to its digest only once it matched.
    let mut wanted: Vec<(Digest, u64, &'static str)> = Vec::new();
    for m in &docs.parsed {
        let config = m.config();
        let all = std::iter::once((config, "image config", opts.max_manifest_bytes))
            .chain(m.layers().iter().map(|l| (l, "layer", opts.max_blob_bytes)));
        for (desc, what, cap) in all {
            let digest = Digest::parse(desc.digest().as_ref())?;
            if layout.blob_path(&digest).exists() || wanted.iter().any(|w| w.0 == digest) {
                continue;
            }
            check_cap(&digest, desc.size(), what, cap, &docs.location)?;
            wanted.push((digest, desc.size(), what));
        }
    }
    // Before the first blob: everything wanted fits where it goes.
    let needed = wanted.iter().map(|w| w.1).fold(0u64, u64::saturating_add);
    let free = gpusnap_checkpoint::beneath::open_root(staging)
        .and_then(|fd| gpusnap_checkpoint::beneath::available_bytes(fd.as_fd()))
        .map_err(ImageError::io("statvfs", staging))?;
    if needed > free {
        return Err(ImageError::NoSpace {
            what: format!("{} ({} blobs)", docs.location, wanted.len()),
            needed,
            free,
            dest: staging.to_path_buf(),
        });
    }
    let mut scratch = Vec::with_capacity(wanted.len());
    for _ in &wanted {
        scratch.push(layout.tmp_file()?);
    }
    let store = opts.store.as_ref().zip(lease);
    let (n, b) = transfer::missing(store.map(|s| s.0), wanted.iter().map(|w| (&w.0, w.1)));
    if let Some((ns, _)) = store {
        transfer::check_store_space(ns, n, b)?;
    }
    if let Some(p) = &opts.progress {
        p.expect(n as u64, b);
    }
    let session = &session;
    let fetched: Vec<(PathBuf, Digest, u64, bool)> =
        futures_util::stream::iter(wanted.iter().cloned().zip(scratch))
            .map(|((digest, size, what), (tmp, file))| async move {
                let location = session.url(&format!("blobs/{digest}"));
                let moved = match store {
                    Some((ns, lease)) => {
                        pull_blob_via_store(
                            session,
                            ns,
                            lease,
                            &digest,
                            size,
                            what,
                            (file, &tmp),
                            &location,
                        )
                        .await?
                    }
                    None => {
                        let d = digest.clone();
                        let path = tmp.clone();
                        channel::fetch_with(session, &digest, size, what, move |reader| {
                            let blob = VerifyingReader::new(reader, &d, size, what, location);
                            copy_verified(blob, file, &path)
                        })
                        .await?;
                        true
                    }
                };
                if let (Some(p), true) = (&opts.progress, moved) {
                    p.blob_done();
                }
                Ok::<_, ImageError>((tmp, digest, size, moved))
            })
            .buffer_unordered(opts.parallel_blobs.max(1))
            .try_collect()
            .await?;
    let mut transfer = Transfer::default();
    let mut stored = Vec::new();
    for (tmp, digest, size, moved) in &fetched {
        layout.commit(tmp, digest)?;
        transfer.count(*size, *moved);
        stored.push(transfer::blob_id(digest)?);
    }
    for (_, size, _) in &wanted {
        blobs += 1;
        bytes += size;
    }
    layout.finish(&single_entry_index(docs.top.clone(), BTreeMap::new()))?;
    tracing::info!(
        reference = %r,
        digest = %docs.top.digest,
        pinned = r.digest.is_some(),
        blobs,
        bytes,
        downloaded_blobs = transfer.moved_blobs,
        downloaded_bytes = transfer.moved_bytes,
        from_store = transfer.present_blobs,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image pulled"
    );
    let mut report = docs.report(r, staging, blobs, bytes);
    report.transfer = transfer;
    Ok((report, stored))
}

/// One blob of a pull into a layout, through the node store: taken from the store when it is
/// there, else downloaded into the store (which verifies it) first; then copied (reflinked
/// where the file system can) into the layout's scratch `file`, and what the copy holds hashed.
/// A stored blob that is not what its name says (damaged on disk) is dropped from the store
/// and downloaded again, once. Returns whether it was downloaded.
#[allow(clippy::too_many_arguments)]
async fn pull_blob_via_store(
    session: &Session,
    ns: &NodeStore,
    lease: &std::sync::Arc<gpusnap_node_store::Lease>,
    digest: &Digest,
    size: u64,
    what: &'static str,
    (file, scratch): (std::fs::File, &Path),
    location: &str,
) -> Result<bool, ImageError> {
    use gpusnap_node_store::{CopyOut, Health, Slot};
    let id = transfer::blob_id(digest)?;
    let file = std::sync::Arc::new(file);
    let from_store = format!("node store {}", ns.store.root().display());
    let mut healed = false;
    loop {
        // `begin` may wait for another pull writing the same blob: off the network thread.
        let slot = {
            let (store, lease, id) = (ns.store.clone(), lease.clone(), id.clone());
            blocking(move || Ok(store.begin(&lease, &id, size)?)).await?
        };
        let moved = match slot {
            Slot::Present(_, len) if len != size => {
                // Either the descriptor lies about the size, or the stored blob is damaged:
                // its digest tells which.
                let (store, id) = (ns.store.clone(), id.clone());
                match blocking(move || Ok(store.verify(&id)?)).await? {
                    Health::Sound(_) => {
                        return Err(ImageError::SizeMismatch {
                            what: what.to_owned(),
                            digest: digest.clone(),
                            expected: size,
                            actual: len,
                            location: from_store,
                        })
                    }
                    Health::Dropped { .. } | Health::Missing if !healed => {
                        healed = true;
                        continue;
                    }
                    Health::Dropped { actual } => {
                        return Err(ImageError::DigestMismatch {
                            what: what.to_owned(),
                            expected: digest.clone(),
                            actual: Digest::parse(actual.as_str())?,
                            location: from_store,
                        })
                    }
                    Health::Missing => return Err(disappeared(ns, digest)),
                }
            }
            Slot::Present(..) => false,
            Slot::Absent(mut writer) => {
                let loc = location.to_owned();
                channel::fetch_with(session, digest, size, what, move |reader| {
                    transfer::fill(reader, &mut writer, &loc)?;
                    writer
                        .commit()
                        .map(drop)
                        .map_err(|e| transfer::store_error(e, what, &loc))
                })
                .await?;
                true
            }
        };
        let (store, id2, dest) = (ns.store.clone(), id.clone(), file.clone());
        match blocking(move || Ok(store.copy_to(&id2, &dest)?)).await? {
            CopyOut::Copied(_) => return Ok(moved),
            // The lease keeps collection away; only someone removing files by hand gets here.
            CopyOut::Missing => return Err(disappeared(ns, digest)),
            CopyOut::Corrupt { .. } if !moved && !healed => {
                // Dropped from the store: downloaded again into it, and copied afresh.
                healed = true;
                let (dest, path) = (file.clone(), scratch.to_path_buf());
                blocking(move || {
                    use std::io::Seek;
                    dest.set_len(0)
                        .and_then(|()| (&*dest).seek(std::io::SeekFrom::Start(0)).map(drop))
                        .map_err(ImageError::io("truncating", &path))
                })
                .await?;
            }
            CopyOut::Corrupt { actual } => {
                return Err(ImageError::DigestMismatch {
                    what: what.to_owned(),
                    expected: digest.clone(),
                    actual: Digest::parse(actual.as_str())?,
                    location: from_store,
                })
            }
        }
    }
}

fn disappeared(ns: &NodeStore, digest: &Digest) -> ImageError {
    ImageError::invalid(
        "node store",
        ns.store.root().display().to_string(),
        format!("blob {digest} disappeared from it during the pull"),
    )
}

/// Copies a verifying reader into `file` with large writes, then checks size and digest.
fn copy_verified<R: Read>(
    mut blob: VerifyingReader<R>,
    mut file: std::fs::File,
    path: &Path,
) -> Result<(), ImageError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        interrupt::check()?;
        let mut filled = 0;
        while filled < buf.len() {
            match blob.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_to_image(e, &path.display().to_string())),
            }
        }
        if filled == 0 {
            break;
        }
        file.write_all(&buf[..filled])
            .map_err(ImageError::io("writing", path))?;
    }
    blob.finish()
}

/// Pulls `reference` and extracts its checkpoint into `dest` (must not exist or be empty) in
/// one pass: every layer is unpacked beneath a staging directory *while it downloads*, several
/// layers at once, and its digest checked over the same bytes (nothing is written twice, and
/// no layer is read back to be hashed). Only when every layer matched, the gpusnap manifest
/// agrees with the image and the file system has been synced, is the result renamed into
/// place; any failure or interruption removes the staging directory, leaving nothing.
///
/// Verifies what [`pull`] followed by [`crate::extract_with`] verifies, in the same order:
/// the top document (pinned digest, `Docker-Content-Digest`), the signature policy before any
/// blob, every manifest by digest, the config by digest, each layer's size and digest (and a
/// gzip layer's diff_id), the image's gpusnap manifest digest; and it refuses the same entries
/// ([`crate::extract`]'s rules, beneath the root). The image is not kept: use [`pull`] for a
/// layout.
///
/// A chunked image's chunk list and gpusnap manifest layers are fetched first; the packs then
/// go straight into the chunked files as they download ([`StreamAssembly`]: every chunk
/// checked against its name and the list, every 64 MiB piece against the sealed manifest as
/// soon as it is complete), so no chunk file is written and nothing is read twice from disk.
pub fn pull_extract(
    reference: &str,
    dest: &Path,
    opts: &RegistryOptions,
) -> Result<(PullReport, Extracted), ImageError> {
    let started = std::time::Instant::now();
    let r = Reference::parse(reference, opts.plain_http)?;
    let mut limits = ExtractOptions {
        max_layer_bytes: opts.max_blob_bytes,
        decryption: opts.decryption.clone(),
        directory_signature: None,
    };
    // Created (and, on failure, removed) outside the runtime: the runtime waits for every
    // unpacking thread before it is dropped, so nothing writes beneath the staging directory
    // while it is removed.
    let lease = match &opts.store {
        Some(ns) => Some(std::sync::Arc::new(ns.store.lease()?)),
        None => None,
    };
    // A layer the node store held but whose bytes were damaged there fails the pull after
    // part of it was unpacked; the store has dropped it by then, so the pull starts again in
    // a fresh staging directory and downloads it (the other blobs come from the store again).
    let mut attempts = 0;
    let (staging, mut report, plan, dir_times) = loop {
        let staging = Staging::create(dest)?;
        let dropped = std::sync::atomic::AtomicUsize::new(0);
        let pulled = block_on(pull_extract_async(
            &r,
            &staging,
            opts,
            &limits,
            lease.as_ref(),
            &dropped,
        ));
        match pulled {
            Ok((report, plan, dir_times)) => break (staging, report, plan, dir_times),
            Err(e)
                if dropped.load(std::sync::atomic::Ordering::SeqCst) > 0
                    && attempts < MAX_HEALING_ATTEMPTS
                    && !matches!(e, ImageError::Interrupted) =>
            {
                attempts += 1;
                tracing::warn!(
                    reference = %r,
                    error = %e,
                    attempt = attempts,
                    "pull: a blob of the node store was damaged and has been dropped; pulling again"
                );
                drop(staging);
                if let Some(p) = &opts.progress {
                    p.restart();
                }
            }
            Err(e) => return Err(e),
        }
    };
    interrupt::check()?;
    let seed = OriginSeed {
        source: report.reference.clone(),
        pinned: report.pinned,
        signature: report.signature.clone(),
    };
    limits.directory_signature = opts.signatures.directory_requirement(&report.signature);
    let extracted = staging.finish(&plan, dir_times, &seed, limits.directory_signature.as_ref())?;
    report.signature = extracted.signature.clone();
    if let (Some(ns), Some(lease)) = (&opts.store, lease) {
        let layers = plan
            .layers
            .iter()
            .map(|l| transfer::blob_id(&l.desc.digest))
            .collect::<Result<Vec<_>, _>>()?;
        transfer::record_and_collect(
            ns,
            lease,
            format!("{}@{} in {}", r.name(), report.digest, dest.display()),
            format!("{}/{}", r.registry, r.repository),
            dest,
            layers,
        )?;
    }
    tracing::info!(
        reference = %r,
        digest = %report.digest,
        dest = %dest.display(),
        layers = extracted.layers,
        layer_bytes = extracted.layer_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint image pulled and extracted"
    );
    Ok((report, extracted))
}

type DirTimes = Vec<(String, u64)>;

async fn pull_extract_async(
    r: &Reference,
    staging: &Staging,
    opts: &RegistryOptions,
    limits: &ExtractOptions,
    lease: Option<&std::sync::Arc<gpusnap_node_store::Lease>>,
    dropped: &std::sync::atomic::AtomicUsize,
) -> Result<(PullReport, ExtractPlan, DirTimes), ImageError> {
    let mut session = Session::new(r, opts)?;
    session.authenticate(RegistryOperation::Pull).await?;
    let docs = fetch_documents(&session, r, opts).await?;
    let location = docs.location.clone();
    let malformed = |what, e: serde_json::Error| ImageError::malformed(what, &location, e);

    // The image manifest an extraction of the pulled layout would choose.
    let manifest_digest = if is_index_media_type(&docs.top.media_type) {
        let index: ImageIndex =
            serde_json::from_slice(&docs.top_bytes).map_err(|e| malformed("image index", e))?;
        let desc = select_platform(&index.manifests, &location)?;
        if !is_manifest_media_type(&desc.media_type) {
            return Err(ImageError::UnsupportedMediaType {
                what: "image index entry",
                media_type: desc.media_type.clone(),
                location,
            });
        }
        desc.digest.clone()
    } else {
        docs.top.digest.clone()
    };
    let manifest_bytes = docs
        .manifests
        .iter()
        .find(|(d, _)| *d == manifest_digest)
        .map(|(_, b)| b)
        .ok_or_else(|| {
            ImageError::malformed("image index", &location, "the chosen manifest is not in it")
        })?;
    let manifest: ImageManifest =
        serde_json::from_slice(manifest_bytes).map_err(|e| malformed("image manifest", e))?;
    check_cap(
        &manifest.config.digest,
        manifest.config.size,
        "image config",
        opts.max_manifest_bytes,
        &location,
    )?;
    let config_bytes = session
        .fetch_small_blob(
            &manifest.config.digest,
            manifest.config.size,
            opts.max_manifest_bytes,
            "image config",
        )
        .await?;
    let config: ImageConfig =
        serde_json::from_slice(&config_bytes).map_err(|e| malformed("image config", e))?;
    let plan = ExtractPlan::new(
        &manifest,
        &config,
        manifest_digest,
        Some(r.name()),
        &location,
        limits,
    )?;
    // Before any layer is fetched: the image fits where it goes.
    plan.check_space(staging)?;

    // Every layer downloads straight into its unpacker, `parallel_blobs` at a time; with a
    // node store, a layer the store holds is unpacked from it (and verified again as it is
    // read), and one it lacks is written into it in the same pass as it is unpacked.
    let store = opts.store.as_ref().zip(lease);
    let (n, b) = transfer::missing(
        store.map(|s| s.0),
        plan.layers.iter().map(|l| (&l.desc.digest, l.desc.size)),
    );
    if let Some((ns, _)) = store {
        transfer::check_store_space(ns, n, b)?;
    }
    if let Some(p) = &opts.progress {
        p.expect(n as u64, b);
    }
    // A chunked image: its chunk list and gpusnap manifest first (two small layers), so that
    // the packs, as they stream in, are checked and written straight into the files they
    // assemble, with no chunk file on disk and no second pass ([`StreamAssembly`]). The roles
    // only choose the order: whatever a layer really holds is unpacked under the same rules.
    let first_roles = [LayerRole::ChunkList, LayerRole::GpusnapManifest];
    let (first, rest): (Vec<PlannedLayer>, Vec<PlannedLayer>) =
        if plan.layers.iter().any(|l| l.role() == LayerRole::ChunkList) {
            plan.layers
                .iter()
                .cloned()
                .partition(|l| first_roles.contains(&l.role()))
        } else {
            (Vec::new(), plan.layers.clone())
        };
    let layers = LayerFetch {
        session: &session,
        store,
        staging,
        limits,
        opts,
        dropped,
    };
    let chunked = !first.is_empty();
    let mut fetched = layers.fetch_all(first, None).await?;
    // Nothing downloads meanwhile: this runs on the runtime's thread.
    let assembly = match chunked {
        true => open_chunk_stream(&plan, staging)?.map(std::sync::Arc::new),
        false => None,
    };
    fetched.extend(layers.fetch_all(rest, assembly.clone()).await?);
    if let Some(assembly) = assembly {
        // Every pack is in; the unpackers have let go of the assembly.
        let Some(assembly) = std::sync::Arc::into_inner(assembly) else {
            return Err(ImageError::invalid(
                "chunk assembly",
                staging.dest().display().to_string(),
                "still in use after the last layer",
            ));
        };
        let done = assembly.finish()?;
        tracing::debug!(
            files = done.files,
            bytes = done.bytes,
            chunks = done.chunks,
            distinct_chunks = done.distinct_chunks,
            "chunked files assembled while downloading"
        );
    }
    let times = fetched;
    let (mut blobs, mut bytes) = docs.counts();
    blobs += 1 + plan.layers.len();
    bytes += config_bytes.len() as u64 + plan.layers.iter().map(|l| l.desc.size).sum::<u64>();
    let mut report = docs.report(r, staging.dest(), blobs, bytes);
    // The config is always fetched (it is small, and read before any layer).
    report.transfer.count(config_bytes.len() as u64, true);
    for (_, size, moved) in &times {
        report.transfer.count(*size, *moved);
    }
    let times: Vec<DirTimes> = times.into_iter().map(|(t, ..)| t).collect();
    Ok((report, plan, times.into_iter().flatten().collect()))
}

/// What an extracting pull needs to fetch and unpack its layers.
struct LayerFetch<'a> {
    session: &'a Session,
    store: Option<(&'a NodeStore, &'a std::sync::Arc<gpusnap_node_store::Lease>)>,
    staging: &'a Staging,
    limits: &'a ExtractOptions,
    opts: &'a RegistryOptions,
    /// Stored blobs found damaged (and dropped from the store) while they were unpacked.
    dropped: &'a std::sync::atomic::AtomicUsize,
}

/// One layer unpacked: the directory times it recorded, its size, whether it was downloaded.
type Fetched = (DirTimes, u64, bool);

impl LayerFetch<'_> {
    /// `layers` unpacked beneath the staging directory, `parallel_blobs` at a time; chunk
    /// files into `chunks` when given.
    async fn fetch_all(
        &self,
        layers: Vec<PlannedLayer>,
        chunks: Option<std::sync::Arc<StreamAssembly>>,
    ) -> Result<Vec<Fetched>, ImageError> {
        futures_util::stream::iter(layers)
            .map(|layer| self.fetch_one(layer, chunks.clone()))
            .buffer_unordered(self.opts.parallel_blobs.max(1))
            .try_collect()
            .await
    }

    /// One layer, read from the node store when it holds the layer (verified again as it is
    /// read), else downloaded — and with a store, written into it in the same pass, its bytes
    /// hashed once: the store takes the digest the verifying reader computed over them.
    async fn fetch_one(
        &self,
        layer: PlannedLayer,
        chunks: Option<std::sync::Arc<StreamAssembly>>,
    ) -> Result<Fetched, ImageError> {
        let (digest, size) = (layer.desc.digest.clone(), layer.desc.size);
        let location = layer.location.clone();
        let slot = match self.store {
            Some((ns, lease)) => {
                let (st, lease) = (ns.store.clone(), lease.clone());
                let id = transfer::blob_id(&digest)?;
                Some(blocking(move || Ok(st.begin(&lease, &id, size)?)).await?)
            }
            None => None,
        };
        let (root, budget) = (self.staging.shared_root(), self.staging.shared_budget());
        let limits = self.limits.clone();
        let unpack = move |blob: VerifyingReader<Box<dyn Read + Send>>| {
            let mut times = Vec::new();
            let verified = unpack_layer(
                blob,
                &layer,
                root.as_fd(),
                &limits,
                &budget,
                &mut times,
                chunks.as_deref(),
            )?;
            Ok::<_, ImageError>((times, verified))
        };
        let (times, moved) = match slot {
            Some(gpusnap_node_store::Slot::Present(file, _)) => {
                let from = format!(
                    "node store {}",
                    self.store
                        .map(|(ns, _)| ns.store.root().display().to_string())
                        .unwrap_or_default()
                );
                let blob = VerifyingReader::new(
                    Box::new(file) as Box<dyn Read + Send>,
                    &digest,
                    size,
                    "layer",
                    from,
                );
                match blocking(move || unpack(blob)).await {
                    Ok((times, _)) => (times, false),
                    Err(e) => {
                        self.drop_if_damaged(&digest, &e).await;
                        return Err(e);
                    }
                }
            }
            slot => {
                let tee = match slot {
                    Some(gpusnap_node_store::Slot::Absent(w)) => Some(w.prehashed()),
                    _ => None,
                };
                let d = digest.clone();
                let times = channel::fetch_with(self.session, &digest, size, "layer", move |r| {
                    let writer = std::sync::Arc::new(std::sync::Mutex::new(tee));
                    let tee = transfer::Tee {
                        inner: r,
                        writer: writer.clone(),
                    };
                    let blob = VerifyingReader::new(
                        Box::new(tee) as Box<dyn Read + Send>,
                        &d,
                        size,
                        "layer",
                        location.clone(),
                    );
                    let (times, verified) = unpack(blob)?;
                    let stored = writer.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(w) = stored {
                        w.commit(&transfer::blob_id(verified.digest())?)
                            .map_err(|e| transfer::store_error(e, "layer", &location))?;
                    }
                    Ok(times)
                })
                .await?;
                (times, true)
            }
        };
        if let (Some(p), true) = (&self.opts.progress, moved) {
            p.blob_done();
        }
        Ok((times, size, moved))
    }
}

impl LayerFetch<'_> {
    /// After a layer read from the node store failed: whether the stored blob is damaged
    /// (its digest, hashed again) — dropped then, and counted so the pull starts again. A
    /// failure of anything else (a refused entry, the disk) leaves a sound blob where it is.
    async fn drop_if_damaged(&self, digest: &Digest, failure: &ImageError) {
        let Some((ns, _)) = self.store else { return };
        if matches!(failure, ImageError::Interrupted) {
            return;
        }
        let Ok(id) = transfer::blob_id(digest) else {
            return;
        };
        let store = ns.store.clone();
        match blocking(move || Ok(store.verify(&id)?)).await {
            Ok(gpusnap_node_store::Health::Dropped { .. }) => {
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(blob = %digest, error = %e, "store: could not verify a blob"),
        }
    }
}

/// `f` on a blocking thread (store locks, file reads), its panic passed on.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

async fn fetch_manifest_by_digest(
    session: &Session,
    digest: &Digest,
    size: u64,
    opts: &RegistryOptions,
) -> Result<Vec<u8>, ImageError> {
    let url = session.url(&format!("manifests/{digest}"));
    if size > opts.max_manifest_bytes {
        return Err(ImageError::TooLarge {
            what: "image manifest".into(),
            name: digest.to_string(),
            size,
            limit: opts.max_manifest_bytes,
            location: url,
            setting: "--max-manifest-bytes",
        });
    }
    // One byte over the descriptor's size is enough to tell a longer document.
    let fetched = session
        .get_manifest(digest.as_str(), size + 1)
        .await
        .map_err(|e| match e {
            ImageError::TooLarge { size: got, .. } => ImageError::SizeMismatch {
                what: "manifest".into(),
                digest: digest.clone(),
                expected: size,
                actual: got,
                location: url.clone(),
            },
            other => other,
        })?;
    if fetched.bytes.len() as u64 != size {
        return Err(ImageError::SizeMismatch {
            what: "manifest".into(),
            digest: digest.clone(),
            expected: size,
            actual: fetched.bytes.len() as u64,
            location: url,
        });
    }
    if fetched.digest != *digest {
        return Err(ImageError::DigestMismatch {
            what: "manifest".into(),
            expected: digest.clone(),
            actual: fetched.digest,
            location: url,
        });
    }
    Ok(fetched.bytes)
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
