//! `image::build`: a CRI checkpoint archive or checkpoint directory → a combined OCI checkpoint
//! image (layout directory and/or oci-archive). See the module docs of [the crate docs](crate) for the
//! layer design.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::annotations::{
    default_image_name, image_annotations, keys, CriMetadata, LayerRole, SourceLayout,
};
use super::chunked::{
    chunk_dir_path, read_chunked, write_packs, ChunkSummary, ChunkedSource, Chunking,
    DeferredPacks, PackOutput, Packs, CHUNK_DIR_META,
};
use super::digest::{hex, Digest};
use super::error::ImageError;
use super::layer::{EntryMeta, FinishedLayer, LayerWriter};
use super::oci_layout::{
    prepare_empty_dir, single_entry_index, write_oci_archive, LayoutWriter, RemoveOnDrop,
};
use super::source::{
    for_each_entry, Body, BuildSource, SourceEntry, CHECKPOINT_DIR, CONFIG_DUMP, ROOTFS_DIFF_TAR,
    SPEC_DUMP,
};
use super::spec::{
    goarch, Descriptor, History, ImageConfig, ImageManifest, Platform, RootFs, RuntimeConfig,
    MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX, MEDIA_TYPE_LAYER_TAR, MEDIA_TYPE_MANIFEST,
};
use super::LayerInfo;
use gpusnap_checkpoint::chunks::{chunkable_name, CHUNK_LIST_FILE};
use gpusnap_checkpoint::inventory::CHUNK_BYTES;
use gpusnap_checkpoint::layout::{classify, is_gpu_file, EntryKind, MANIFEST_FILE};
use gpusnap_checkpoint::manifest::{Manifest, MANIFEST_FORMAT_VERSION, MANIFEST_KIND};

/// Largest `spec.dump` / `config.dump` parsed for annotations (real ones are a few KiB).
const MAX_METADATA_JSON: u64 = 16 << 20;
/// Largest gpusnap manifest accepted (it lists every file; 64 MiB is ~500k files).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// What to build and where.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Write an OCI image layout here (created; must not exist or be an empty directory).
    pub layout_dir: Option<PathBuf>,
    /// Write an `oci-archive` tar here (replaced atomically if it exists).
    pub archive_path: Option<PathBuf>,
    /// Image name for `index.json` (`org.opencontainers.image.ref.name`, and
    /// `io.containerd.image.name` so `ctr images import` uses it). Default:
    /// `localhost/gpusnap-checkpoint/<container name>:latest`.
    pub image_name: Option<String>,
    /// Container name for the engines' checkpoint annotations. Default: from `spec.dump` /
    /// `config.dump` as checkpointctl reads them, else the gpusnap manifest's container id.
    pub container_name: Option<String>,
    /// Re-hash every checkpoint file against the sealed gpusnap manifest while building, and
    /// refuse to publish a checkpoint that does not match it. Default on.
    pub verify_checkpoint: bool,
    /// Extra annotations for the image index and manifest (applied last: they win).
    pub annotations: BTreeMap<String, String>,
    /// Chunked image (the default): CRIU page images and GPU state files as content-defined
    /// chunks in pack layers, assembled at every restore door. `None`: the classic layout, each
    /// GPU extent a layer of its own and the page images inside the CRIU-images layer.
    pub chunking: Option<Chunking>,
    /// Encrypt every layer for these recipients (ocicrypt format; see [`crate::crypt`]).
    pub encrypt_to: Option<std::sync::Arc<Vec<gpusnap_image_crypt::Recipient>>>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            layout_dir: None,
            archive_path: None,
            image_name: None,
            container_name: None,
            verify_checkpoint: true,
            annotations: BTreeMap::new(),
            chunking: Some(Chunking::default()),
            encrypt_to: None,
        }
    }
}

/// The image [`build`] produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuiltImage {
    pub layout_dir: Option<PathBuf>,
    pub archive_path: Option<PathBuf>,
    pub image_name: String,
    pub container_name: String,
    pub source_layout: SourceLayout,
    /// Digest of the image index `index.json` points at (the image's target).
    pub index_digest: Digest,
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    /// Digest of `checkpoint/gpusnap-manifest.json`'s bytes.
    pub gpusnap_manifest_digest: Digest,
    /// Annotations of the image index and manifest.
    pub annotations: BTreeMap<String, String>,
    pub layers: Vec<LayerInfo>,
    /// Sum of all layer blob sizes.
    pub total_layer_bytes: u64,
    /// For a chunked image: chunks, distinct chunks, bytes before and after dedup, packs.
    pub chunks: Option<ChunkSummary>,
}

/// Builds a combined checkpoint image from `source`: a CRI checkpoint archive (tar file, or a
/// directory it was extracted to) or a gpusnap checkpoint directory.
pub fn build(source: &Path, opts: &BuildOptions) -> Result<BuiltImage, ImageError> {
    build_with(source, opts, false).map(|(b, _)| b)
}

/// [`build`], with a chunked image's packs hashed but not written when `defer_packs` (and
/// nothing is encrypted): the layout then lacks the pack blobs, which the returned
/// [`DeferredPacks`] produce from the source's files for a push.
pub(crate) fn build_with(
    source: &Path,
    opts: &BuildOptions,
    defer_packs: bool,
) -> Result<(BuiltImage, Option<DeferredPacks>), ImageError> {
    let defer_packs = defer_packs && opts.encrypt_to.is_none() && opts.archive_path.is_none();
    if opts.layout_dir.is_none() && opts.archive_path.is_none() {
        return Err(ImageError::NoOutput);
    }
    let started = std::time::Instant::now();
    if let Some(c) = &opts.chunking {
        c.check()?;
    }
    let src = BuildSource::detect(source)?;
    // What a restore refuses (hard links, symlinks, special files) is refused before any
    // output exists.
    super::source::check_tree(&src)?;
    // Without a requested layout, stage one beside the archive (same filesystem: renames).
    let (layout_root, keep_layout) = match (&opts.layout_dir, &opts.archive_path) {
        (Some(dir), _) => (dir.clone(), true),
        (None, Some(archive)) => {
            let name = archive
                .file_name()
                .map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
            (
                archive.with_file_name(format!(".{name}.layout-{}", std::process::id())),
                false,
            )
        }
        (None, None) => unreachable!("checked above"),
    };
    let created = prepare_empty_dir(&layout_root)?;
    let mut cleanup = RemoveOnDrop::new(&layout_root, created);
    let mut layout = LayoutWriter::create(&layout_root)?;

    let mut asm = Assembler::new(&src, opts.verify_checkpoint, opts.chunking);
    for_each_entry(&src, &mut |e| asm.add(&mut layout, e))?;
    let (mut built, index_size, deferred) = asm.finish(&mut layout, &src, opts, defer_packs)?;
    let index = single_entry_index(index_json_entry(&built, index_size), BTreeMap::new());
    layout.finish(&index)?;
    if let Some(recipients) = &opts.encrypt_to {
        // Before the archive is packed: no plain layer leaves this function.
        let new = crate::crypt::encrypt_layout(&layout_root, recipients)?;
        let renamed = |d: &mut crate::Digest| {
            if let Some(n) = new.get(d) {
                *d = n.digest.clone();
            }
        };
        renamed(&mut built.index_digest);
        renamed(&mut built.manifest_digest);
        for l in &mut built.layers {
            if let Some(n) = new.get(&l.descriptor.digest) {
                l.descriptor = n.clone();
            }
        }
    }

    if let Some(archive) = &opts.archive_path {
        write_oci_archive(&layout_root, archive)?;
        built.archive_path = Some(archive.clone());
    }
    if keep_layout {
        cleanup.disarm();
        built.layout_dir = Some(layout_root.clone());
    } else {
        // Drop removes the staging layout (created by us, so the whole directory).
        drop(cleanup);
    }
    tracing::info!(
        source = %source.display(),
        image = %built.image_name,
        index_digest = %built.index_digest,
        layers = built.layers.len(),
        chunked = built.chunks.is_some(),
        stored_bytes = built.chunks.as_ref().map_or(built.total_layer_bytes, |c| c.stored_bytes),
        gpu_extents = built.layers.iter().filter(|l| l.role == LayerRole::GpuExtent).count(),
        total_layer_bytes = built.total_layer_bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        deferred_packs = deferred.is_some(),
        "checkpoint image built"
    );
    Ok((built, deferred))
}

/// The index.json entry: the image index, named for importers.
fn index_json_entry(built: &BuiltImage, size: u64) -> Descriptor {
    let mut d = Descriptor::new(MEDIA_TYPE_INDEX, built.index_digest.clone(), size);
    d.annotations
        .insert(keys::OCI_REF_NAME.into(), built.image_name.clone());
    d.annotations
        .insert(keys::CONTAINERD_IMAGE_NAME.into(), built.image_name.clone());
    d.annotations.insert(
        keys::CRIU_CONTAINER_NAME.into(),
        built.container_name.clone(),
    );
    d
}

/// Per-chunk BLAKE3 of a file as it streams past, in the inventory's format.
pub(crate) struct ChunkHasher {
    chunk: u64,
    in_chunk: u64,
    hasher: blake3::Hasher,
    pub(crate) chunks: Vec<String>,
    pub(crate) size: u64,
}

impl ChunkHasher {
    pub(crate) fn new(chunk: u64) -> Self {
        ChunkHasher {
            chunk,
            in_chunk: 0,
            hasher: blake3::Hasher::new(),
            chunks: Vec::new(),
            size: 0,
        }
    }

    pub(crate) fn update(&mut self, mut buf: &[u8]) {
        self.size += buf.len() as u64;
        while !buf.is_empty() {
            let take = ((self.chunk - self.in_chunk) as usize).min(buf.len());
            self.hasher.update(&buf[..take]);
            self.in_chunk += take as u64;
            buf = &buf[take..];
            if self.in_chunk == self.chunk {
                self.chunks.push(hex(self.hasher.finalize().as_bytes()));
                self.hasher.reset();
                self.in_chunk = 0;
            }
        }
    }

    /// Chunk digests: one per started chunk, and one (of nothing) for an empty file.
    pub(crate) fn finish(mut self) -> (u64, Vec<String>) {
        if self.in_chunk > 0 || self.chunks.is_empty() {
            self.chunks.push(hex(self.hasher.finalize().as_bytes()));
        }
        (self.size, self.chunks)
    }
}

struct TeeHash<'a> {
    inner: &'a mut dyn Read,
    hasher: Option<&'a mut ChunkHasher>,
}

impl Read for TeeHash<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = self.hasher.as_deref_mut() {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// A finished layer, its role, (for GPU extents) the extent's path and size, and (for
/// packs) its chunk count.
type PendingLayer = (
    LayerRole,
    FinishedLayer,
    Option<(String, u64)>,
    Option<usize>,
);

struct GpuExtent {
    rel: String,
    size: u64,
    layer: FinishedLayer,
}

/// Routes source entries to layers.
struct Assembler {
    source_path: PathBuf,
    verify: bool,
    metadata: Option<LayerWriter>,
    criu: Option<LayerWriter>,
    rootfs: Option<LayerWriter>,
    gpu: Vec<GpuExtent>,
    manifest_entry: Option<(EntryMeta, Vec<u8>)>,
    cri: CriMetadata,
    /// checkpoint-relative path → (size, chunk digests), for files the inventory covers.
    observed: BTreeMap<String, (u64, Vec<String>)>,
    layout_kind: SourceLayout,
    chunking: Option<Chunking>,
    chunked: Vec<ChunkedSource>,
}

fn lazily<'a>(
    slot: &'a mut Option<LayerWriter>,
    layout: &mut LayoutWriter,
) -> Result<&'a mut LayerWriter, ImageError> {
    if slot.is_none() {
        *slot = Some(LayerWriter::create(layout)?);
    }
    Ok(slot.as_mut().expect("just set"))
}

fn append(w: &mut LayerWriter, e: SourceEntry<'_>) -> Result<(), ImageError> {
    match e.body {
        Body::Dir => w.append_dir(&e.path, &e.meta),
        Body::Symlink(t) => w.append_symlink(&e.path, &t, &e.meta),
        Body::File { size, data, .. } => w.append_file(&e.path, size, data, &e.meta),
    }
}

fn read_small(
    data: &mut dyn Read,
    size: u64,
    limit: u64,
    path: &str,
    src: &Path,
) -> Result<Vec<u8>, ImageError> {
    if size > limit {
        return Err(ImageError::UnsupportedEntry {
            source_path: src.to_path_buf(),
            entry: path.to_owned(),
            reason: format!("{size} bytes is larger than the {limit}-byte limit for this file"),
        });
    }
    let mut buf = Vec::with_capacity(size as usize);
    data.take(size)
        .read_to_end(&mut buf)
        .map_err(ImageError::io("reading", src))?;
    if buf.len() as u64 != size {
        return Err(ImageError::io("reading", src)(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{path}: {} of {size} bytes", buf.len()),
        )));
    }
    Ok(buf)
}

impl Assembler {
    fn new(src: &BuildSource, verify: bool, chunking: Option<Chunking>) -> Self {
        Assembler {
            source_path: src.path().to_path_buf(),
            verify,
            metadata: None,
            criu: None,
            rootfs: None,
            gpu: Vec::new(),
            manifest_entry: None,
            cri: CriMetadata::default(),
            observed: BTreeMap::new(),
            layout_kind: match src {
                BuildSource::CheckpointDir(_) => SourceLayout::CheckpointDir,
                _ => SourceLayout::CriArchive,
            },
            chunking,
            chunked: Vec::new(),
        }
    }

    fn add(&mut self, layout: &mut LayoutWriter, e: SourceEntry<'_>) -> Result<(), ImageError> {
        let rel = if e.path == CHECKPOINT_DIR {
            Some("")
        } else {
            e.path
                .strip_prefix(CHECKPOINT_DIR)
                .and_then(|r| r.strip_prefix('/'))
        };
        match rel {
            Some(rel) => self.add_checkpoint_entry(layout, rel.to_owned(), e),
            None if e.path == ROOTFS_DIFF_TAR && matches!(e.body, Body::File { .. }) => {
                append(lazily(&mut self.rootfs, layout)?, e)
            }
            None => self.add_metadata_entry(layout, e),
        }
    }

    fn add_metadata_entry(
        &mut self,
        layout: &mut LayoutWriter,
        e: SourceEntry<'_>,
    ) -> Result<(), ImageError> {
        let is_json = e.path == CONFIG_DUMP || e.path == SPEC_DUMP;
        match e.body {
            Body::File { size, data, .. } if is_json && size <= MAX_METADATA_JSON => {
                let bytes = read_small(data, size, MAX_METADATA_JSON, &e.path, &self.source_path)?;
                match serde_json::from_slice(&bytes) {
                    Ok(v) if e.path == CONFIG_DUMP => self.cri.config_dump = Some(v),
                    Ok(v) => self.cri.spec_dump = Some(v),
                    Err(err) => tracing::warn!(
                        file = %e.path, error = %err,
                        "unparsable CRI metadata file; its annotations are left out"
                    ),
                }
                lazily(&mut self.metadata, layout)?.append_file(
                    &e.path,
                    size,
                    &mut bytes.as_slice(),
                    &e.meta,
                )
            }
            body => append(
                lazily(&mut self.metadata, layout)?,
                SourceEntry {
                    path: e.path,
                    meta: e.meta,
                    body,
                },
            ),
        }
    }

    fn add_checkpoint_entry(
        &mut self,
        layout: &mut LayoutWriter,
        rel: String,
        e: SourceEntry<'_>,
    ) -> Result<(), ImageError> {
        let Body::File { size, data, reread } = e.body else {
            // Directories (checkpoint/ itself; gpusnap writes none below it) and symlinks
            // (pre-dump's `parent`) go with the CRIU images, so extent layers never need parents
            // of their own.
            return append(lazily(&mut self.criu, layout)?, e);
        };
        if rel == MANIFEST_FILE {
            if self.manifest_entry.is_some() {
                return Err(ImageError::UnsupportedEntry {
                    source_path: self.source_path.clone(),
                    entry: e.path,
                    reason: "appears twice".into(),
                });
            }
            let bytes = read_small(data, size, MAX_MANIFEST_BYTES, &e.path, &self.source_path)?;
            self.manifest_entry = Some((e.meta, bytes));
            return Ok(());
        }
        let kind = classify(Path::new(&rel));
        // Logs and the manifest's temporary file are outside the inventory (inventory.rs).
        let inventoried = self.verify && !matches!(kind, EntryKind::Log | EntryKind::Manifest);
        let mut hasher = inventoried.then(|| ChunkHasher::new(CHUNK_BYTES));
        let mut tee = TeeHash {
            inner: data,
            hasher: hasher.as_mut(),
        };
        if let Some(c) = self.chunking.filter(|_| chunkable_name(&rel)) {
            let shown = self.source_path.join(&e.path);
            let mtime = e.meta.mtime;
            let f = read_chunked(layout, c.chunk, &rel, size, mtime, &mut tee, reread, shown)?;
            self.chunked.push(f);
        } else if is_gpu_file(Path::new(&rel)) {
            let mut w = LayerWriter::create(layout)?;
            w.append_file(&e.path, size, &mut tee, &e.meta)?;
            let layer = w.finish(layout)?;
            tracing::debug!(extent = %rel, size, digest = %layer.digest, "GPU extent layer written");
            self.gpu.push(GpuExtent {
                rel: rel.clone(),
                size,
                layer,
            });
        } else {
            lazily(&mut self.criu, layout)?.append_file(&e.path, size, &mut tee, &e.meta)?;
        }
        if let Some(h) = hasher {
            self.observed.insert(rel, h.finish());
        }
        Ok(())
    }

    fn parse_manifest(&self, bytes: &[u8]) -> Result<Manifest, ImageError> {
        let invalid = |reason: String| ImageError::ManifestInvalid {
            source_path: self.source_path.clone(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
        let kind = value.get("kind").and_then(|k| k.as_str());
        if kind != Some(MANIFEST_KIND) {
            return Err(invalid(format!(
                "kind is {:?}, not {MANIFEST_KIND:?}: not made by gpusnap",
                kind.unwrap_or("<none>")
            )));
        }
        let version = value.get("format_version").and_then(|v| v.as_u64());
        if version != Some(u64::from(MANIFEST_FORMAT_VERSION)) {
            return Err(invalid(format!(
                "format_version {version:?} is not {MANIFEST_FORMAT_VERSION}: build the image with \
                 the gpusnap release that took the checkpoint"
            )));
        }
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
    }

    /// Checks what streamed past against the sealed inventory (same rules as
    /// `validate_for_restore`: listed files must match exactly; unlisted CRIU images or GPU
    /// files would change what is restored).
    fn verify_inventory(&self, manifest: &Manifest) -> Result<(), ImageError> {
        let inv = &manifest.images;
        if inv.chunk_bytes != CHUNK_BYTES {
            return Err(ImageError::ManifestInvalid {
                source_path: self.source_path.clone(),
                reason: format!(
                    "images.chunk_bytes is {}, this gpusnap verifies {CHUNK_BYTES}-byte chunks",
                    inv.chunk_bytes
                ),
            });
        }
        let mismatch = |file: &str, reason: String| ImageError::CheckpointMismatch {
            file: file.to_owned(),
            reason,
        };
        for rec in &inv.files {
            let Some((size, chunks)) = self.observed.get(&rec.path) else {
                return Err(mismatch(
                    &rec.path,
                    "listed in the manifest but missing".into(),
                ));
            };
            if *size != rec.size {
                return Err(mismatch(
                    &rec.path,
                    format!("{size} bytes, manifest says {}", rec.size),
                ));
            }
            if let Some(i) = chunks
                .iter()
                .zip(&rec.blake3_chunks)
                .position(|(a, b)| a != b)
                .or_else(|| (chunks.len() != rec.blake3_chunks.len()).then_some(0))
            {
                let start = i as u64 * CHUNK_BYTES;
                return Err(mismatch(
                    &rec.path,
                    format!(
                        "BLAKE3 of bytes {start}..{} differs",
                        (start + CHUNK_BYTES).min(rec.size)
                    ),
                ));
            }
        }
        for path in self.observed.keys() {
            if inv.get(path).is_some() {
                continue;
            }
            match classify(Path::new(path)) {
                EntryKind::CriuImage | EntryKind::GpusnapData => {
                    return Err(mismatch(
                        path,
                        "not listed in the manifest (files of two checkpoints mixed)".into(),
                    ))
                }
                _ => tracing::warn!(file = %path, "file not in the gpusnap inventory; kept as-is"),
            }
        }
        Ok(())
    }

    fn finish(
        self,
        layout: &mut LayoutWriter,
        src: &BuildSource,
        opts: &BuildOptions,
        defer_packs: bool,
    ) -> Result<(BuiltImage, u64, Option<DeferredPacks>), ImageError> {
        let Some((manifest_meta, manifest_bytes)) = self.manifest_entry.clone() else {
            return Err(ImageError::ManifestMissing {
                source_path: src.path().to_path_buf(),
            });
        };
        let manifest = self.parse_manifest(&manifest_bytes)?;
        if self.verify {
            self.verify_inventory(&manifest)?;
        }
        let gpusnap_manifest_digest = Digest::of(&manifest_bytes);
        let container_name = opts
            .container_name
            .clone()
            .or_else(|| self.cri.container_name())
            .unwrap_or_else(|| manifest.container_id.clone());
        let image_name = match &opts.image_name {
            Some(n) => {
                validate_image_name(n)?;
                n.clone()
            }
            None => default_image_name(&container_name),
        };

        let Assembler {
            metadata,
            mut criu,
            rootfs,
            gpu,
            cri,
            layout_kind,
            chunking,
            chunked,
            ..
        } = self;
        let gpu_files = gpu.len()
            + chunked
                .iter()
                .filter(|f| is_gpu_file(Path::new(f.rel())))
                .count();
        // Chunked: the packs, and the chunk list in a small layer of its own (what a pull
        // reads first to know what to assemble).
        let mut chunk_layers: Option<(Packs, FinishedLayer, ChunkSummary)> = None;
        let mut deferred = None;
        if let Some(c) = chunking {
            // The chunk directory's entry, with the other directories: packs need no parents.
            lazily(&mut criu, layout)?.append_dir(&chunk_dir_path(), &CHUNK_DIR_META)?;
            let out = if defer_packs {
                PackOutput::Deferred
            } else {
                PackOutput::Layout(layout)
            };
            let (packs, list, summary, d) = write_packs(out, chunked, &c)?;
            deferred = d;
            let mut lw = LayerWriter::create(layout)?;
            lw.append_file(
                &format!("{CHECKPOINT_DIR}/{CHUNK_LIST_FILE}"),
                list.len() as u64,
                &mut list.as_slice(),
                &manifest_meta,
            )?;
            chunk_layers = Some((packs, lw.finish(layout)?, summary));
        }
        let mut layers: Vec<PendingLayer> = Vec::new();
        let mut rootfs_inflated = None;
        let (packs, list_layer, summary) = match chunk_layers {
            Some((p, l, s)) => (p, Some(l), Some(s)),
            None => (Vec::new(), None, None),
        };
        for (role, w) in [
            (LayerRole::Metadata, metadata),
            (LayerRole::CriuImages, criu),
        ] {
            if let Some(w) = w {
                let l = w.finish(layout)?;
                layers.push((role, l, None, None));
            }
        }
        if let Some(l) = list_layer {
            layers.push((LayerRole::ChunkList, l, None, None));
        }
        for (role, w) in [(LayerRole::RootfsDiff, rootfs)] {
            if let Some(w) = w {
                let l = w.finish(layout)?;
                tracing::debug!(
                    role = role.as_str(),
                    digest = %l.digest,
                    size = l.size,
                    entries = l.entries,
                    content_bytes = l.content_bytes,
                    "layer written"
                );
                if role == LayerRole::RootfsDiff {
                    rootfs_inflated =
                        Some(super::inflated::of_layer(&layout.blob_path(&l.digest))?);
                }
                layers.push((role, l, None, None));
            }
        }
        for (l, n) in packs {
            layers.push((LayerRole::ChunkPack, l, None, Some(n)));
        }
        let extents = gpu_files;
        for g in gpu {
            layers.push((LayerRole::GpuExtent, g.layer, Some((g.rel, g.size)), None));
        }
        let mut mw = LayerWriter::create(layout)?;
        mw.append_file(
            &format!("{CHECKPOINT_DIR}/{MANIFEST_FILE}"),
            manifest_bytes.len() as u64,
            &mut manifest_bytes.as_slice(),
            &manifest_meta,
        )?;
        layers.push((LayerRole::GpusnapManifest, mw.finish(layout)?, None, None));

        let mut annotations = image_annotations(
            &cri,
            &manifest,
            gpusnap_manifest_digest.as_str(),
            &container_name,
            layout_kind,
            extents,
        );
        if let Some(n) = rootfs_inflated {
            annotations.insert(
                keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE.into(),
                n.to_string(),
            );
        }
        if summary.is_some() {
            annotations.insert(keys::GPUSNAP_CHUNKED.into(), "true".into());
        }
        annotations.extend(opts.annotations.clone());

        let mut pack_no = 0usize;
        let infos: Vec<LayerInfo> = layers
            .into_iter()
            .map(|(role, l, extent, chunk_count)| {
                let mut d = Descriptor::new(MEDIA_TYPE_LAYER_TAR, l.digest.clone(), l.size);
                d.annotations
                    .insert(keys::GPUSNAP_LAYER_ROLE.into(), role.as_str().into());
                let title = match (&extent, role) {
                    (Some((rel, _)), _) => rel.rsplit('/').next().unwrap_or(rel).to_owned(),
                    (None, LayerRole::ChunkPack) => {
                        pack_no += 1;
                        format!("chunk-pack-{pack_no}")
                    }
                    (None, r) => r.as_str().to_owned(),
                };
                if let Some(n) = chunk_count {
                    d.annotations
                        .insert(keys::GPUSNAP_CHUNK_COUNT.into(), n.to_string());
                }
                d.annotations.insert(keys::OCI_TITLE.into(), title);
                if let Some((rel, size)) = &extent {
                    d.annotations
                        .insert(keys::GPUSNAP_GPU_EXTENT_PATH.into(), rel.clone());
                    d.annotations
                        .insert(keys::GPUSNAP_GPU_EXTENT_SIZE.into(), size.to_string());
                }
                if role == LayerRole::GpusnapManifest {
                    d.annotations.insert(
                        keys::GPUSNAP_MANIFEST_DIGEST.into(),
                        gpusnap_manifest_digest.to_string(),
                    );
                }
                LayerInfo {
                    role,
                    diff_id: l.digest.clone(),
                    gpu_extent: extent.map(|(rel, _)| rel),
                    descriptor: d,
                }
            })
            .collect();

        let arch = goarch(&manifest.host.arch).to_owned();
        let config = ImageConfig {
            created: Some(manifest.created_at.clone()),
            architecture: arch.clone(),
            os: "linux".into(),
            config: RuntimeConfig::default(),
            rootfs: RootFs {
                kind: "layers".into(),
                diff_ids: infos.iter().map(|l| l.diff_id.clone()).collect(),
            },
            history: infos
                .iter()
                .map(|l| History {
                    created: Some(manifest.created_at.clone()),
                    created_by: Some(format!(
                        "gpusnap image build: {}{}",
                        l.role.as_str(),
                        l.gpu_extent
                            .as_deref()
                            .map(|p| format!(" {p}"))
                            .unwrap_or_default()
                    )),
                    comment: None,
                })
                .collect(),
        };
        let (config_digest, config_size) = layout.put_json(&config)?;
        let image_manifest = ImageManifest {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_MANIFEST.into()),
            config: Descriptor::new(MEDIA_TYPE_CONFIG, config_digest.clone(), config_size),
            layers: infos.iter().map(|l| l.descriptor.clone()).collect(),
            annotations: annotations.clone(),
        };
        let (manifest_digest, manifest_size) = layout.put_json(&image_manifest)?;
        let mut manifest_desc =
            Descriptor::new(MEDIA_TYPE_MANIFEST, manifest_digest.clone(), manifest_size);
        manifest_desc.platform = Some(Platform {
            architecture: arch,
            os: "linux".into(),
            variant: None,
        });
        // An image index on top, annotated like the manifest: containerd checks the image
        // *target* for its key, and `checkpointctl build` annotates an index the same way.
        let index = single_entry_index(manifest_desc, annotations.clone());
        let (index_digest, index_size) = layout.put_json(&index)?;
        let total_layer_bytes = infos.iter().map(|l| l.descriptor.size).sum();
        let built = BuiltImage {
            layout_dir: None,
            archive_path: None,
            image_name,
            container_name,
            source_layout: layout_kind,
            index_digest,
            manifest_digest,
            config_digest,
            gpusnap_manifest_digest,
            annotations,
            layers: infos,
            total_layer_bytes,
            chunks: summary,
        };
        Ok((built, index_size, deferred))
    }
}

/// Light check of an image name: what `ctr` and registries accept as `name[:tag]`.
pub(crate) fn validate_image_name(name: &str) -> Result<(), ImageError> {
    let bad = |reason: &str| Err(ImageError::invalid("image name", name, reason));
    if name.is_empty() || name.len() > 255 {
        return bad("must be 1 to 255 characters");
    }
    if name.contains("://") {
        return bad("give a name such as registry.example/repo:tag, without a scheme");
    }
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (name, None),
    };
    if let Some(t) = tag {
        if t.is_empty()
            || t.len() > 128
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            return bad("the tag may use letters, digits, '_', '.' and '-' (at most 128)");
        }
    }
    let parts: Vec<&str> = repo.split('/').collect();
    // With more than one component the first may be a registry host (case and port allowed).
    let path = match parts.as_slice() {
        [host, rest @ ..] if !rest.is_empty() => {
            if host.is_empty()
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
            {
                return bad("the registry host must be host[:port]");
            }
            rest
        }
        all => all,
    };
    for p in path {
        if p.is_empty()
            || !p.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
            })
        {
            return bad(
                "repository path components use lowercase letters, digits, '.', '_' and '-'",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_hasher_matches_inventory_rules() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = ChunkHasher::new(4096);
        // Odd-sized pieces cross chunk boundaries.
        for piece in data.chunks(1000) {
            h.update(piece);
        }
        let (size, chunks) = h.finish();
        assert_eq!(size, 10_000);
        let want: Vec<String> = data
            .chunks(4096)
            .map(|c| hex(blake3::hash(c).as_bytes()))
            .collect();
        assert_eq!(chunks, want);
        // Exactly one chunk: no trailing empty digest.
        let mut h = ChunkHasher::new(4);
        h.update(b"abcd");
        assert_eq!(h.finish().1.len(), 1);
        // Empty file: the digest of nothing.
        let (_, c) = ChunkHasher::new(4).finish();
        assert_eq!(c, vec![hex(blake3::hash(b"").as_bytes())]);
    }

    #[test]
    fn image_names() {
        for ok in [
            "localhost/gpusnap-checkpoint/x:latest",
            "127.0.0.1:5000/a/b:v1.2",
            "registry.example/ns/img",
        ] {
            validate_image_name(ok).unwrap();
        }
        for bad in [
            "",
            "http://x/y",
            "localhost/UPPER:1",
            "localhost/a:b c",
            "a//b",
        ] {
            assert!(validate_image_name(bad).is_err(), "{bad}");
        }
    }
}
