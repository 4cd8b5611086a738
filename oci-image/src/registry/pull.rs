//! Pulling an image into a new OCI image layout.
//!
//! **In order.** (1) The top manifest or index is read by digest when the reference names
//! one, else by tag, capped at [`RegistryOptions::max_manifest_bytes`] and hashed; a pinned
//! digest, and the registry's `Docker-Content-Digest`, must match. For a tag, that digest is
//! what the registry says the tag means *now*: nothing pins the binding unless a signature
//! does. (2) The signature policy is applied to that digest ([`super::cosign`]); `require`
//! refuses here, before any blob is fetched. (3) Every child manifest (by digest), config and
//! layer is fetched with its size and digest checked while it streams, each capped. (4) Only
//! then is the layout, written in a staging directory beside the destination, renamed into
//! place; any failure or interruption ([`crate::interrupt`]) removes the staging directory.
//! [`crate::pull_extract()`] does the same checks in the same order, through
//! [`fetch_documents`], but unpacks each layer beneath its staging directory while the layer
//! downloads (see there).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use futures_util::{StreamExt, TryStreamExt};

use gpusnap_checkpoint::origin::SignatureCheck;
use oci_client::RegistryOperation;

use super::client::Session;
use super::reference::Reference;
use super::transfer::{self, NodeStore, Transfer};
use super::{block_on, blocking, check_destination, RegistryOptions};
use super::{channel, cosign};
use crate::annotations::keys;
use crate::digest::{io_to_image, Digest, VerifyingReader};
use crate::error::ImageError;
use crate::interrupt;
use crate::oci_layout::{single_entry_index, LayoutWriter, RemoveOnDrop};
use crate::spec::{is_index_media_type, is_manifest_media_type, Descriptor, MEDIA_TYPE_MANIFEST};
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
pub(crate) struct Documents {
    pub(crate) top_bytes: Vec<u8>,
    /// The top document as `index.json` describes it (with the container name an engine looks
    /// for, when the index has one).
    pub(crate) top: Descriptor,
    /// Each image manifest's digest and bytes (the top document itself when it is one).
    pub(crate) manifests: Vec<(Digest, Vec<u8>)>,
    pub(crate) parsed: Vec<oci_spec::image::ImageManifest>,
    pub(crate) signature: SignatureCheck,
    pub(crate) location: String,
}

pub(crate) async fn fetch_documents(
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
    pub(crate) fn report(&self, r: &Reference, dir: &Path, blobs: usize, bytes: u64) -> PullReport {
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
    pub(crate) fn counts(&self) -> (usize, u64) {
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
pub(crate) fn check_cap(
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
