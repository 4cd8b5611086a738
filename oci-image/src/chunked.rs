//! Chunked images: large checkpoint files split into content-defined chunks while the build
//! reads them, then written as pack layers of distinct chunks (see the crate docs).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::chunks::{
    split, ChunkDigest, ChunkList, ChunkParams, ChunkRef, ChunkedFile, CHUNK_DIR, MAX_MTIME,
};

use super::digest::HashingWriter;
use super::error::ImageError;
use super::layer::{EntryMeta, FinishedLayer, LayerWriter};
use super::oci_layout::LayoutWriter;
use super::source::{Reread, CHECKPOINT_DIR};

/// How a chunked image is cut and packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Chunking {
    /// FastCDC sizes of the chunks.
    pub chunk: ChunkParams,
    /// The average bytes of new chunks in one pack layer; a pack closes after a chunk whose
    /// digest has its low `log2(pack_bytes / avg)` bits zero, or at four times this.
    pub pack_bytes: u64,
    /// Most pack layers: past it the pack size doubles (containerd's overlay snapshotter and
    /// the kernel bound lower layers; see the crate docs).
    pub max_packs: usize,
}

impl Default for Chunking {
    fn default() -> Self {
        Chunking {
            chunk: ChunkParams::DEFAULT,
            pack_bytes: 128 << 20,
            max_packs: 64,
        }
    }
}

impl Chunking {
    pub fn check(&self) -> Result<(), ImageError> {
        self.chunk.check().map_err(|r| {
            ImageError::invalid("chunk sizes", format!("{:?}", self.chunk), r.to_string())
        })?;
        if self.pack_bytes < u64::from(self.chunk.avg) || self.max_packs == 0 {
            return Err(ImageError::invalid(
                "pack size",
                self.pack_bytes.to_string(),
                "must be at least the average chunk size, with at least one pack",
            ));
        }
        Ok(())
    }
}

/// What the chunking of one image came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChunkSummary {
    pub files: usize,
    pub chunks: usize,
    pub distinct_chunks: usize,
    /// Bytes of the chunked files.
    pub logical_bytes: u64,
    /// Bytes of the distinct chunks (what the packs hold).
    pub stored_bytes: u64,
    pub packs: usize,
}

/// One file seen by the build, split into chunks, readable again for the packs.
pub(crate) struct ChunkedSource {
    rel: String,
    size: u64,
    /// The file's modification time from the source (what a classic image's tar entry carries).
    mtime: u64,
    /// (digest, length, offset in the file)
    chunks: Vec<(ChunkDigest, u64, u64)>,
    reread: Reread,
    /// Size and mtime of the file re-read, checked again when the packs are written.
    stamp: (u64, i64),
    shown: PathBuf,
}

/// Splits `data` (the file `rel`, `size` bytes) into chunks as it streams past. Without a way
/// to read it again (a compressed archive) its bytes are spooled into the layout's scratch
/// directory. `mtime` is the file's modification time in the source, kept in the chunk list.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_chunked(
    layout: &mut LayoutWriter,
    params: ChunkParams,
    rel: &str,
    size: u64,
    mtime: u64,
    data: &mut dyn Read,
    reread: Option<Reread>,
    shown: PathBuf,
) -> Result<ChunkedSource, ImageError> {
    let mut spool = match reread {
        Some(_) => None,
        None => Some(layout.tmp_file()?),
    };
    let mut chunks = Vec::new();
    let mut off = 0u64;
    {
        let mut sink = spool
            .as_mut()
            .map(|(_, f)| io::BufWriter::with_capacity(1 << 20, f));
        split(&mut data.take(size), params, &mut |c| {
            chunks.push((ChunkDigest::of(c), c.len() as u64, off));
            off += c.len() as u64;
            if let Some(w) = sink.as_mut() {
                w.write_all(c)?;
            }
            Ok(())
        })
        .map_err(ImageError::io("reading for chunks", &shown))?;
        if let Some(mut w) = sink {
            w.flush()
                .map_err(ImageError::io("spooling for chunks", &shown))?;
        }
    }
    if off != size {
        return Err(ImageError::io("reading for chunks", &shown)(
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{rel}: {off} of {size} bytes"),
            ),
        ));
    }
    let reread = match (reread, spool) {
        (Some(r), _) => r,
        (None, Some((path, _))) => Reread {
            file: File::open(&path).map_err(ImageError::io("opening", &path))?,
            base: 0,
        },
        (None, None) => unreachable!("a spool exists without a reread"),
    };
    let stamp = stamp_of(&reread.file, &shown)?;
    Ok(ChunkedSource {
        rel: rel.to_owned(),
        size,
        mtime,
        chunks,
        reread,
        stamp,
        shown,
    })
}

impl ChunkedSource {
    pub(crate) fn rel(&self) -> &str {
        &self.rel
    }
}

fn stamp_of(f: &File, shown: &std::path::Path) -> Result<(u64, i64), ImageError> {
    let m = f.metadata().map_err(ImageError::io("reading", shown))?;
    Ok((m.len(), m.mtime()))
}

/// Ownership and times of chunk entries: fixed, so the same chunks make the same pack bytes on
/// every node and in every image.
const CHUNK_META: EntryMeta = EntryMeta {
    mode: 0o600,
    uid: 0,
    gid: 0,
    mtime: 0,
};
/// The chunk directory's entry (in the CRIU-images layer, so packs never need a parent).
pub(crate) const CHUNK_DIR_META: EntryMeta = EntryMeta {
    mode: 0o700,
    uid: 0,
    gid: 0,
    mtime: 0,
};

pub(crate) fn chunk_dir_path() -> String {
    format!("{CHECKPOINT_DIR}/{CHUNK_DIR}")
}

/// The packs: distinct chunks in order of first appearance (files by name), cut where a
/// chunk's digest meets the boundary condition, so the same content yields the same packs in
/// another image. A pack also ends before a chunk marked in `breaks` (new content after a long
/// run of content already packed, such as a zero-filled buffer between two allocations),
/// unless those cuts alone would exceed the pack cap. Returns indices into `distinct`.
fn plan_packs(distinct: &[(ChunkDigest, u64)], breaks: &[bool], c: &Chunking) -> Vec<Vec<usize>> {
    let avg = u64::from(c.chunk.avg).max(1);
    for use_breaks in [true, false] {
        let mut k = (c.pack_bytes / avg).max(1).next_power_of_two();
        loop {
            let cap = k.saturating_mul(avg).saturating_mul(4);
            let mut packs: Vec<Vec<usize>> = Vec::new();
            let mut cur = Vec::new();
            let mut bytes = 0u64;
            for (i, (d, len)) in distinct.iter().enumerate() {
                if use_breaks && breaks.get(i).copied().unwrap_or(false) && !cur.is_empty() {
                    packs.push(std::mem::take(&mut cur));
                    bytes = 0;
                }
                cur.push(i);
                bytes += len;
                if d.prefix_u64() & (k - 1) == 0 || bytes >= cap {
                    packs.push(std::mem::take(&mut cur));
                    bytes = 0;
                }
            }
            if !cur.is_empty() {
                packs.push(cur);
            }
            if packs.len() <= c.max_packs {
                return packs;
            }
            if k >= 1 << 40 {
                break;
            }
            // Doubling k keeps every boundary a subset of the previous ones: packs merge, they
            // do not shift.
            k *= 2;
        }
    }
    // Unreachable in practice: at k = 2^40 without breaks there is one pack per 4 TiB.
    vec![(0..distinct.len()).collect()]
}

/// Bytes of chunks already packed, in a row, after which new content starts a pack of its own:
/// half the pack size. A run that long is a region of its own in the checkpoint (zeros of a
/// pre-allocated buffer, a second copy of weights), so what follows it is likely to change
/// independently of what precedes it.
fn break_run(c: &Chunking) -> u64 {
    (c.pack_bytes / 2).max(u64::from(c.chunk.max))
}

/// One chunk of a pack: its digest and length, and where to read it (file index, offset).
#[derive(Debug, Clone, Copy)]
struct PackMember {
    digest: ChunkDigest,
    len: u64,
    file: usize,
    off: u64,
}

/// A source file the packs read their chunks from, by position.
struct PackFile {
    reread: Reread,
    stamp: (u64, i64),
    shown: PathBuf,
    rel: String,
}

/// The bytes of one pack layer, produced from the source files on demand: the tar stream a
/// [`LayerWriter`] would write for the same chunks (GNU headers with [`CHUNK_META`], each body
/// padded to 512 bytes, two zero blocks at the end). Identical bytes whether written to a
/// layout or streamed to a registry, so both make the same blob.
struct PackStream {
    files: std::sync::Arc<Vec<PackFile>>,
    members: std::sync::Arc<Vec<PackMember>>,
    /// Next member to start.
    next: usize,
    /// Bytes staged for the reader (a header, padding or the trailer) and how far it got.
    staged: Vec<u8>,
    staged_at: usize,
    /// The member whose body is being read: (file, position, bytes left, padding after).
    body: Option<(usize, u64, u64, usize)>,
    trailer_done: bool,
}

const BLOCK: usize = 512;

impl PackStream {
    fn new(files: std::sync::Arc<Vec<PackFile>>, members: std::sync::Arc<Vec<PackMember>>) -> Self {
        PackStream {
            files,
            members,
            next: 0,
            staged: Vec::new(),
            staged_at: 0,
            body: None,
            trailer_done: false,
        }
    }

    fn header(m: &PackMember) -> io::Result<tar::Header> {
        let mut h = LayerWriter::header(tar::EntryType::Regular, &CHUNK_META);
        h.set_size(m.len);
        // Short names only ("checkpoint/chunks/<64 hex>"): no GNU long-name entry, so the
        // header alone is what tar::Builder writes for it.
        h.set_path(format!("{CHECKPOINT_DIR}/{CHUNK_DIR}/{}", m.digest.hex()))?;
        h.set_cksum();
        Ok(h)
    }

    /// Stages what comes next; false at the end of the stream.
    fn advance(&mut self) -> io::Result<bool> {
        if let Some(m) = self.members.get(self.next).copied() {
            self.next += 1;
            self.staged = Self::header(&m)?.as_bytes().to_vec();
            self.staged_at = 0;
            let f = &self.files[m.file];
            let pad = (BLOCK - (m.len % BLOCK as u64) as usize) % BLOCK;
            self.body = Some((m.file, f.reread.base + m.off, m.len, pad));
            return Ok(true);
        }
        if !self.trailer_done {
            self.trailer_done = true;
            self.staged = vec![0; 2 * BLOCK];
            self.staged_at = 0;
            return Ok(true);
        }
        Ok(false)
    }
}

impl Read for PackStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.staged_at < self.staged.len() {
                let n = buf.len().min(self.staged.len() - self.staged_at);
                buf[..n].copy_from_slice(&self.staged[self.staged_at..self.staged_at + n]);
                self.staged_at += n;
                return Ok(n);
            }
            if let Some((file, pos, left, pad)) = self.body {
                if left > 0 {
                    let want = (buf.len() as u64).min(left) as usize;
                    let n = self.files[file]
                        .reread
                        .file
                        .read_at(&mut buf[..want], pos)?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{}: shorter than when it was split", self.files[file].rel),
                        ));
                    }
                    self.body = Some((file, pos + n as u64, left - n as u64, pad));
                    return Ok(n);
                }
                self.body = None;
                self.staged = vec![0; pad];
                self.staged_at = 0;
                continue;
            }
            if buf.is_empty() || !self.advance()? {
                return Ok(0);
            }
        }
    }
}

/// Pack layers with their chunk counts.
pub(crate) type Packs = Vec<(FinishedLayer, usize)>;

/// Packs whose bytes were hashed but not written: a push streams them from the checkpoint's
/// files (see [`crate::registry::push_checkpoint`]). The files stay open, so the bytes are the
/// ones that were split; any change shows as a digest mismatch when they are read again.
pub struct DeferredPacks {
    files: std::sync::Arc<Vec<PackFile>>,
    packs: std::collections::HashMap<crate::Digest, std::sync::Arc<Vec<PackMember>>>,
}

impl std::fmt::Debug for DeferredPacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredPacks")
            .field("files", &self.files.len())
            .field("packs", &self.packs.len())
            .finish()
    }
}

impl DeferredPacks {
    /// The pack blob `digest`, generated again from the checkpoint's files.
    pub(crate) fn reader(&self, digest: &crate::Digest) -> Option<Box<dyn Read + Send>> {
        let members = self.packs.get(digest)?;
        Some(Box::new(PackStream::new(
            self.files.clone(),
            members.clone(),
        )))
    }

    /// Fails when a source file changed since it was split.
    pub(crate) fn check_unchanged(&self) -> Result<(), ImageError> {
        check_stamps(&self.files)
    }
}

fn check_stamps(files: &[PackFile]) -> Result<(), ImageError> {
    for f in files {
        if stamp_of(&f.reread.file, &f.shown)? != f.stamp {
            return Err(ImageError::CheckpointMismatch {
                file: f.rel.clone(),
                reason: "changed while the image was built; build it again".into(),
            });
        }
    }
    Ok(())
}

/// Where pack bytes go: into scratch files of the layout, or only through the hash.
pub(crate) enum PackOutput<'a> {
    Layout(&'a mut LayoutWriter),
    /// Hash only; the packs are returned as [`DeferredPacks`].
    Deferred,
}

/// Hashes (and writes, into the layout) every pack, several at once
/// ([`crate::parallel::run_each`]).
fn produce_packs(
    files: &std::sync::Arc<Vec<PackFile>>,
    plan: &[std::sync::Arc<Vec<PackMember>>],
    sinks: Vec<Option<(PathBuf, File)>>,
) -> Result<Vec<(crate::Digest, u64)>, ImageError> {
    let slots: Vec<std::sync::Mutex<Option<(PathBuf, File)>>> =
        sinks.into_iter().map(std::sync::Mutex::new).collect();
    let results = crate::parallel::run_each(plan, |i, members| {
        let sink = slots[i].lock().map(|mut g| g.take()).unwrap_or(None);
        hash_pack(files, members, sink)
    });
    let mut out = Vec::with_capacity(plan.len());
    for r in results {
        match r {
            Some(r) => out.push(r?),
            None => {
                return Err(ImageError::io("writing pack layers", Path::new("(packs)"))(
                    io::Error::other("a pack was not produced (an earlier one failed)"),
                ))
            }
        }
    }
    Ok(out)
}

fn hash_pack(
    files: &std::sync::Arc<Vec<PackFile>>,
    members: &std::sync::Arc<Vec<PackMember>>,
    sink: Option<(PathBuf, File)>,
) -> Result<(crate::Digest, u64), ImageError> {
    let mut stream = PackStream::new(files.clone(), members.clone());
    let shown = sink
        .as_ref()
        .map_or_else(|| PathBuf::from("(pack)"), |(p, _)| p.clone());
    let err = |e| ImageError::io("writing pack layer", &shown)(e);
    match sink {
        Some((_, f)) => {
            let mut w = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, f));
            io::copy(&mut stream, &mut w).map_err(err)?;
            let (digest, size, buf) = w.finish();
            buf.into_inner().map_err(|e| err(e.into_error()))?;
            Ok((digest, size))
        }
        None => {
            let mut w = HashingWriter::new(io::sink());
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = stream.read(&mut buf).map_err(err)?;
                if n == 0 {
                    break;
                }
                w.write_all(&buf[..n]).map_err(err)?;
            }
            let (digest, size, _) = w.finish();
            Ok((digest, size))
        }
    }
}

/// Writes (or, [`PackOutput::Deferred`], only hashes) the pack layers and returns them with
/// the chunk list's bytes and the summary.
pub(crate) fn write_packs(
    out: PackOutput<'_>,
    mut files: Vec<ChunkedSource>,
    c: &Chunking,
) -> Result<(Packs, Vec<u8>, ChunkSummary, Option<DeferredPacks>), ImageError> {
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut seen = HashSet::new();
    let mut distinct: Vec<(ChunkDigest, u64)> = Vec::new();
    let mut at: Vec<(usize, u64)> = Vec::new();
    let mut breaks: Vec<bool> = Vec::new();
    let run_needed = break_run(c);
    let mut run = 0u64;
    for (fi, f) in files.iter().enumerate() {
        for &(d, len, off) in &f.chunks {
            if seen.insert(d) {
                distinct.push((d, len));
                at.push((fi, off));
                breaks.push(run >= run_needed);
                run = 0;
            } else {
                run += len;
            }
        }
    }
    let plan: Vec<std::sync::Arc<Vec<PackMember>>> = plan_packs(&distinct, &breaks, c)
        .into_iter()
        .map(|members| {
            std::sync::Arc::new(
                members
                    .into_iter()
                    .map(|i| PackMember {
                        digest: distinct[i].0,
                        len: distinct[i].1,
                        file: at[i].0,
                        off: at[i].1,
                    })
                    .collect(),
            )
        })
        .collect();
    let summary = ChunkSummary {
        files: files.len(),
        chunks: files.iter().map(|f| f.chunks.len()).sum(),
        distinct_chunks: distinct.len(),
        logical_bytes: files.iter().map(|f| f.size).sum(),
        stored_bytes: distinct.iter().map(|d| d.1).sum(),
        packs: plan.len(),
    };
    let list = ChunkList::new(
        files
            .iter()
            .map(|f| ChunkedFile {
                path: f.rel.clone(),
                size: f.size,
                // Assembly refuses a time past MAX_MTIME (year 9999); a source file that claims
                // one gets the latest accepted instead of an image no door would restore.
                mtime: Some(f.mtime.min(MAX_MTIME)),
                chunks: f.chunks.iter().map(|&(d, l, _)| ChunkRef(d, l)).collect(),
            })
            .collect(),
    );
    let pack_files: std::sync::Arc<Vec<PackFile>> = std::sync::Arc::new(
        files
            .into_iter()
            .map(|f| PackFile {
                reread: f.reread,
                stamp: f.stamp,
                shown: f.shown,
                rel: f.rel,
            })
            .collect(),
    );
    let (layout, sinks) = match out {
        PackOutput::Layout(layout) => {
            let mut sinks = Vec::with_capacity(plan.len());
            for _ in &plan {
                sinks.push(Some(layout.tmp_file()?));
            }
            (Some(layout), sinks)
        }
        PackOutput::Deferred => (None, plan.iter().map(|_| None).collect()),
    };
    let tmps: Vec<Option<PathBuf>> = sinks
        .iter()
        .map(|s| s.as_ref().map(|(p, _)| p.clone()))
        .collect();
    let hashed = produce_packs(&pack_files, &plan, sinks)?;
    // The packs were read back by position: the files must not have changed since they were
    // split and verified.
    check_stamps(&pack_files)?;
    let mut packs = Vec::with_capacity(plan.len());
    for ((digest, size), (members, tmp)) in hashed.iter().zip(plan.iter().zip(&tmps)) {
        if let (Some(layout), Some(tmp)) = (layout.as_deref(), tmp) {
            layout.commit(tmp, digest)?;
        }
        packs.push((
            FinishedLayer {
                digest: digest.clone(),
                size: *size,
                entries: members.len() as u64,
                content_bytes: members.iter().map(|m| m.len).sum(),
            },
            members.len(),
        ));
    }
    let deferred = layout.is_none().then(|| DeferredPacks {
        files: pack_files.clone(),
        packs: hashed
            .iter()
            .zip(&plan)
            .map(|((d, _), m)| (d.clone(), m.clone()))
            .collect(),
    });
    Ok((packs, list.to_bytes(), summary, deferred))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push from a checkpoint directory streams packs that were never written: their bytes
    /// must be exactly what `image build` writes, or the two would make different images.
    #[test]
    fn pack_stream_is_what_the_layer_writer_writes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("pages-1.img");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        let cuts = [
            (0usize, 1000usize),
            (1000, 512),
            (1512, 70_001),
            (71_513, 4096),
            (90_000, 1),
        ];
        let mut members = Vec::new();
        let root = dir.path().join("layout");
        let mut layout = LayoutWriter::create(&root).unwrap();
        let mut w = LayerWriter::create(&mut layout).unwrap();
        for &(off, len) in &cuts {
            let digest = ChunkDigest::of(&data[off..off + len]);
            members.push(PackMember {
                digest,
                len: len as u64,
                file: 0,
                off: off as u64,
            });
            w.append_file(
                &format!("{CHECKPOINT_DIR}/{CHUNK_DIR}/{}", digest.hex()),
                len as u64,
                &mut &data[off..off + len],
                &CHUNK_META,
            )
            .unwrap();
        }
        let written = w.finish(&layout).unwrap();
        let expected = std::fs::read(layout.blob_path(&written.digest)).unwrap();

        let file = File::open(&src).unwrap();
        let stamp = stamp_of(&file, &src).unwrap();
        let files = std::sync::Arc::new(vec![PackFile {
            reread: Reread { file, base: 0 },
            stamp,
            shown: src.clone(),
            rel: "pages-1.img".into(),
        }]);
        let members = std::sync::Arc::new(members);
        // Whole reads, and reads of a few bytes that end inside headers, bodies and padding.
        for step in [1 << 20, 7, 512, 1] {
            let mut got = Vec::new();
            let mut s = PackStream::new(files.clone(), members.clone());
            let mut buf = vec![0u8; step];
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got.len(), expected.len(), "read {step} at a time");
            assert!(got == expected, "read {step} at a time: bytes differ");
        }
        let (digest, size) = hash_pack(&files, &members, None).unwrap();
        assert_eq!((digest, size), (written.digest, written.size));
    }

    #[test]
    fn packs_are_content_defined_and_capped() {
        let c = Chunking {
            chunk: ChunkParams {
                min: 64,
                avg: 256,
                max: 1024,
            },
            pack_bytes: 256 * 16,
            max_packs: 1000,
        };
        let chunks: Vec<(ChunkDigest, u64)> = (0..2000u32)
            .map(|i| (ChunkDigest::of(&i.to_le_bytes()), 256))
            .collect();
        let none = vec![false; chunks.len()];
        let a = plan_packs(&chunks, &none, &c);
        assert!(a.len() > 50 && a.len() < 250, "{} packs", a.len());
        // A different first chunk changes the first pack only.
        let mut other = chunks.clone();
        other[0] = (ChunkDigest::of(b"other"), 256);
        let b = plan_packs(&other, &none, &c);
        assert_eq!(a[1..], b[1..]);
        // Capped: fewer, larger packs whose boundaries are a subset of the first ones.
        let few = plan_packs(&chunks, &none, &Chunking { max_packs: 10, ..c });
        assert!(few.len() <= 10 && few.len() > 1, "{}", few.len());
        assert_eq!(few.concat(), (0..2000).collect::<Vec<_>>());
    }

    /// New content after a long run of repeats (the zeros between weights and state) starts
    /// its own pack: the packs before it stay those of an image where that content differs.
    #[test]
    fn new_content_after_a_long_repeat_run_starts_a_pack() {
        let c = Chunking {
            chunk: ChunkParams {
                min: 64,
                avg: 256,
                max: 1024,
            },
            pack_bytes: 256 * 64,
            max_packs: 1000,
        };
        let mk = |salt: u32| -> Vec<(ChunkDigest, u64)> {
            (0..2000u32)
                .map(|i| {
                    let v = if i >= 1000 { i + salt } else { i };
                    (ChunkDigest::of(&v.to_le_bytes()), 256)
                })
                .collect()
        };
        let (a, b) = (mk(0), mk(1 << 20));
        let mut breaks = vec![false; 2000];
        breaks[1000] = true;
        let pa = plan_packs(&a, &breaks, &c);
        let pb = plan_packs(&b, &breaks, &c);
        let before = |p: &[Vec<usize>]| -> Vec<Vec<usize>> {
            p.iter().filter(|m| m[0] < 1000).cloned().collect()
        };
        assert!(
            pa.iter().any(|m| m[0] == 1000),
            "no pack starts at the break"
        );
        assert_eq!(before(&pa), before(&pb));
        for m in before(&pa) {
            let digests = |d: &[(ChunkDigest, u64)]| m.iter().map(|&i| d[i].0).collect::<Vec<_>>();
            assert_eq!(digests(&a), digests(&b), "a pack before the break changed");
        }
        // Breaks that alone exceed the cap are dropped rather than breaking the cap.
        let all = vec![true; 2000];
        let capped = plan_packs(&a, &all, &Chunking { max_packs: 10, ..c });
        assert!(capped.len() <= 10, "{}", capped.len());
        assert_eq!(capped.concat(), (0..2000).collect::<Vec<_>>());
    }
}
