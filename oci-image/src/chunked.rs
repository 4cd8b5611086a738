//! Chunked images: large checkpoint files split into content-defined chunks while the build
//! reads them, then written as pack layers of distinct chunks (see the crate docs).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use gpusnap_checkpoint::chunks::{
    split, ChunkDigest, ChunkList, ChunkParams, ChunkRef, ChunkedFile, CHUNK_DIR, MAX_MTIME,
};

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
        self.chunk
            .check()
            .map_err(|r| ImageError::invalid("chunk sizes", format!("{:?}", self.chunk), r))?;
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
/// another image. Returns indices into `distinct`.
fn plan_packs(distinct: &[(ChunkDigest, u64)], c: &Chunking) -> Vec<Vec<usize>> {
    let avg = u64::from(c.chunk.avg).max(1);
    let mut k = (c.pack_bytes / avg).max(1).next_power_of_two();
    loop {
        let cap = k.saturating_mul(avg).saturating_mul(4);
        let mut packs: Vec<Vec<usize>> = Vec::new();
        let mut cur = Vec::new();
        let mut bytes = 0u64;
        for (i, (d, len)) in distinct.iter().enumerate() {
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
        if packs.len() <= c.max_packs || k >= 1 << 40 {
            return packs;
        }
        // Doubling k keeps every boundary a subset of the previous ones: packs merge, they do
        // not shift.
        k *= 2;
    }
}

/// Reads `len` bytes at `base + off` of a file by position.
struct At<'a> {
    file: &'a File,
    pos: u64,
    left: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Pack layers with their chunk counts.
pub(crate) type Packs = Vec<(FinishedLayer, usize)>;

/// Writes the pack layers and returns them with the chunk list's bytes and the summary.
pub(crate) fn write_packs(
    layout: &mut LayoutWriter,
    mut files: Vec<ChunkedSource>,
    c: &Chunking,
) -> Result<(Packs, Vec<u8>, ChunkSummary), ImageError> {
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut seen = HashSet::new();
    // (digest, len) and where to read it: (file index, offset)
    let mut distinct: Vec<(ChunkDigest, u64)> = Vec::new();
    let mut at: Vec<(usize, u64)> = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        for &(d, len, off) in &f.chunks {
            if seen.insert(d) {
                distinct.push((d, len));
                at.push((fi, off));
            }
        }
    }
    let plan = plan_packs(&distinct, c);
    let mut packs = Vec::with_capacity(plan.len());
    for members in &plan {
        let mut w = LayerWriter::create(layout)?;
        for &i in members {
            let (d, len) = distinct[i];
            let (fi, off) = at[i];
            let f = &files[fi];
            let mut r = At {
                file: &f.reread.file,
                pos: f.reread.base + off,
                left: len,
            };
            w.append_file(
                &format!("{CHECKPOINT_DIR}/{CHUNK_DIR}/{}", d.hex()),
                len,
                &mut r,
                &CHUNK_META,
            )?;
        }
        packs.push((w.finish(layout)?, members.len()));
    }
    // The packs were read back by position: the files must not have changed since they were
    // split and verified.
    for f in &files {
        if stamp_of(&f.reread.file, &f.shown)? != f.stamp {
            return Err(ImageError::CheckpointMismatch {
                file: f.rel.clone(),
                reason: "changed while the image was built; build it again".into(),
            });
        }
    }
    let summary = ChunkSummary {
        files: files.len(),
        chunks: files.iter().map(|f| f.chunks.len()).sum(),
        distinct_chunks: distinct.len(),
        logical_bytes: files.iter().map(|f| f.size).sum(),
        stored_bytes: distinct.iter().map(|d| d.1).sum(),
        packs: packs.len(),
    };
    let list = ChunkList::new(
        files
            .into_iter()
            .map(|f| ChunkedFile {
                path: f.rel,
                size: f.size,
                // Assembly refuses a time past MAX_MTIME (year 9999); a source file that claims
                // one gets the latest accepted instead of an image no door would restore.
                mtime: Some(f.mtime.min(MAX_MTIME)),
                chunks: f.chunks.iter().map(|&(d, l, _)| ChunkRef(d, l)).collect(),
            })
            .collect(),
    );
    Ok((packs, list.to_bytes(), summary))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a = plan_packs(&chunks, &c);
        assert!(a.len() > 50 && a.len() < 250, "{} packs", a.len());
        // A different first chunk changes the first pack only.
        let mut other = chunks.clone();
        other[0] = (ChunkDigest::of(b"other"), 256);
        let b = plan_packs(&other, &c);
        assert_eq!(a[1..], b[1..]);
        // Capped: fewer, larger packs whose boundaries are a subset of the first ones.
        let few = plan_packs(&chunks, &Chunking { max_packs: 10, ..c });
        assert!(few.len() <= 10 && few.len() > 1, "{}", few.len());
        assert_eq!(few.concat(), (0..2000).collect::<Vec<_>>());
    }
}
