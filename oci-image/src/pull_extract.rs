//! Pulling a checkpoint image and extracting it in one pass.
//!
//! Above both [`crate::registry`] (the documents and blobs, checked as [`crate::pull`] checks
//! them) and [`crate::extract`] (the plan and the unpacking of each layer): neither imports
//! this module, so the two stay independent of each other's operations.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

use futures_util::{StreamExt, TryStreamExt};

use oci_client::RegistryOperation;

use gpusnap_checkpoint::chunks::StreamAssembly;

use crate::annotations::LayerRole;
use crate::digest::{Digest, VerifyingReader};
use crate::error::ImageError;
use crate::extract::{
    open_chunk_stream, unpack_layer, ExtractOptions, ExtractPlan, Extracted, OriginSeed,
    PlannedLayer, Staging,
};
use crate::interrupt;
use crate::oci_layout::select_platform;
use crate::registry::client::Session;
use crate::registry::transfer::{self, NodeStore};
use crate::registry::{
    block_on, blocking, channel, check_cap, fetch_documents, PullReport, Reference, RegistryOptions,
};
use crate::spec::{
    is_index_media_type, is_manifest_media_type, ImageConfig, ImageIndex, ImageManifest,
};

/// How many times an extracting pull starts again after dropping damaged blobs of the node
/// store (each time at least one is gone for good, so an image of many damaged blobs needs
/// more than one round: the next pull goes on where this one stopped).
const MAX_HEALING_ATTEMPTS: usize = 4;

/// Pulls `reference` and extracts its checkpoint into `dest` (must not exist or be empty) in
/// one pass: every layer is unpacked beneath a staging directory *while it downloads*, several
/// layers at once, and its digest checked over the same bytes (nothing is written twice, and
/// no layer is read back to be hashed). Only when every layer matched, the gpusnap manifest
/// agrees with the image and the file system has been synced, is the result renamed into
/// place; any failure or interruption removes the staging directory, leaving nothing.
///
/// Verifies what [`crate::pull()`] followed by [`crate::extract_with`] verifies, in the same
/// order: the top document (pinned digest, `Docker-Content-Digest`), the signature policy
/// before any blob, every manifest by digest, the config by digest, each layer's size and
/// digest (and a gzip layer's diff_id), the image's gpusnap manifest digest; and it refuses the
/// same entries ([`crate::extract`]'s rules, beneath the root). The image is not kept: use
/// [`crate::pull()`] for a layout.
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
