//! A chunked file read where its chunks lie (an image volume's `.gpusnap-chunks/`), never
//! assembled: each 64 MiB piece of it checked against the sealed manifest as it is read.
//!
//! Assembly ([`super::assemble_at`]) writes a whole file before anything reads it. A restore
//! that needs only some of a pages file's bytes, and needs them in another process's memory
//! rather than in a file (the page fill), reads them from the chunks instead: one copy fewer
//! of gigabytes. The trust is the same: the chunk list only says where to look; what counts is
//! the BLAKE3 of every piece, which the sealed (and, under the signature policy, signed)
//! manifest gives. Chunk files are opened beneath their directory as [`DirSource`] opens them
//! (regular, one link, the listed length); their SHA-256 names are not rechecked, since the
//! piece digests cover every byte.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::{ChunkError, ChunkRef, ChunkSource, ChunkedFile, DirSource, OpenError};
use crate::manifest::Manifest;

/// The largest manifest piece read whole into memory ([`InPlaceFile::read_piece`]).
const MAX_PIECE_BYTES: u64 = 256 << 20;

/// One chunked file of a checkpoint, read from its chunks.
pub struct InPlaceFile {
    source: Arc<DirSource>,
    name: String,
    size: u64,
    chunks: Vec<ChunkRef>,
    /// The offset of each chunk in the file.
    starts: Vec<u64>,
    piece: u64,
    expected: Vec<String>,
}

impl std::fmt::Debug for InPlaceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPlaceFile")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

/// Why [`InPlaceFile::stream_piece`] stopped: the file's bytes, or what the caller did with
/// them.
#[derive(Debug)]
pub enum StreamError<E> {
    Chunk(ChunkError),
    Sink(E),
}

impl InPlaceFile {
    /// The chunk list's entry `listed` (untrusted) in `source`, bound to the sealed
    /// `manifest`: the file must be listed there with the same size and a digest per piece.
    pub fn new(
        source: Arc<DirSource>,
        listed: &ChunkedFile,
        manifest: &Manifest,
    ) -> Result<InPlaceFile, ChunkError> {
        let invalid = |reason: String| ChunkError::Manifest {
            dir: PathBuf::from(source.name()),
            reason,
        };
        let rec = manifest
            .images
            .get(&listed.path)
            .ok_or_else(|| invalid(format!("{} is not listed in it", listed.path)))?;
        let piece = manifest.images.chunk_bytes;
        if rec.size != listed.size {
            return Err(invalid(format!(
                "{} is {} bytes there, but {} in the chunk list",
                listed.path, rec.size, listed.size
            )));
        }
        if piece == 0 || piece > MAX_PIECE_BYTES {
            return Err(invalid(format!("its piece size {piece} is out of range")));
        }
        if rec.blake3_chunks.len() as u64 != rec.size.div_ceil(piece).max(1) {
            return Err(invalid(format!(
                "{} has {} digests for {} bytes",
                listed.path,
                rec.blake3_chunks.len(),
                rec.size
            )));
        }
        let mut starts = Vec::with_capacity(listed.chunks.len());
        let mut at = 0u64;
        for c in &listed.chunks {
            starts.push(at);
            at = at
                .checked_add(c.1)
                .ok_or_else(|| invalid(format!("the chunks of {} overflow", listed.path)))?;
        }
        if at != listed.size {
            return Err(invalid(format!(
                "the chunks of {} add up to {at} bytes, not {}",
                listed.path, listed.size
            )));
        }
        Ok(InPlaceFile {
            source,
            name: listed.path.clone(),
            size: listed.size,
            chunks: listed.chunks.clone(),
            starts,
            piece,
            expected: rec.blake3_chunks.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The manifest's piece size.
    pub fn piece_bytes(&self) -> u64 {
        self.piece
    }

    /// The piece holding byte `offset`.
    pub fn piece_of(&self, offset: u64) -> usize {
        (offset / self.piece) as usize
    }

    /// Bytes `start..end` of the file that piece `index` covers.
    pub fn piece_range(&self, index: usize) -> (u64, u64) {
        let start = (index as u64).saturating_mul(self.piece).min(self.size);
        (start, start.saturating_add(self.piece).min(self.size))
    }

    fn shown(&self) -> PathBuf {
        PathBuf::from(self.source.name()).join(&self.name)
    }

    fn open_chunk(&self, index: usize) -> Result<File, ChunkError> {
        let ChunkRef(digest, len) = self.chunks[index];
        self.source.open_file(&digest, len).map_err(|e| match e {
            OpenError::Missing => ChunkError::ChunkMissing {
                digest,
                file: self.name.clone(),
                source_name: self.source.name(),
            },
            OpenError::NotPlain(what) => ChunkError::ChunkNotPlain {
                digest,
                source_name: self.source.name(),
                what,
            },
            OpenError::Length(found) => ChunkError::ChunkDamaged {
                digest,
                file: self.name.clone(),
                source_name: self.source.name(),
                problem: format!("is {found} bytes, not {len}"),
            },
            OpenError::Io(source) => ChunkError::Io {
                path: self.shown(),
                source,
            },
        })
    }

    /// Reads piece `index` in blocks of at most `buf.len()` bytes, handing each to
    /// `sink(offset in the file, bytes)` as it is read, and checks the piece's digest once all
    /// of it was read. **What the sink was given is known good only when this returns `Ok`**:
    /// a caller that acts on the bytes before then must be able to undo it (the page fill
    /// writes into tasks that stay stopped until every piece passed, and are killed if one
    /// does not).
    pub fn stream_piece<E>(
        &self,
        index: usize,
        buf: &mut [u8],
        sink: &mut impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), StreamError<E>> {
        let (start, end) = self.piece_range(index);
        let Some(expected) = self.expected.get(index) else {
            return Err(StreamError::Chunk(ChunkError::Mismatch {
                file: self.shown(),
                offset: start,
                end,
            }));
        };
        let mut hasher = blake3::Hasher::new();
        // The chunk holding `start`: the last one starting at or before it.
        let mut ci = self
            .starts
            .partition_point(|&s| s <= start)
            .saturating_sub(1);
        let mut at = start;
        while at < end {
            let chunk = self.open_chunk(ci).map_err(StreamError::Chunk)?;
            let (c_start, c_len) = (self.starts[ci], self.chunks[ci].1);
            let c_end = (c_start + c_len).min(end);
            while at < c_end {
                let n = (c_end - at).min(buf.len() as u64) as usize;
                let block = &mut buf[..n];
                chunk.read_exact_at(block, at - c_start).map_err(|source| {
                    StreamError::Chunk(ChunkError::Io {
                        path: self.shown(),
                        source,
                    })
                })?;
                hasher.update(block);
                sink(at, block).map_err(StreamError::Sink)?;
                at += n as u64;
            }
            ci += 1;
        }
        if crate::inventory::hex(hasher.finalize().as_bytes()) != *expected {
            return Err(StreamError::Chunk(ChunkError::Mismatch {
                file: self.shown(),
                offset: start,
                end,
            }));
        }
        Ok(())
    }

    /// Piece `index` read whole into `out` and checked: nothing unverified is returned.
    pub fn read_piece(&self, index: usize, out: &mut Vec<u8>) -> Result<(), ChunkError> {
        let (start, end) = self.piece_range(index);
        out.clear();
        out.reserve((end - start) as usize);
        let mut buf = vec![0u8; STREAM_BLOCK.min((end - start).max(1) as usize)];
        self.stream_piece(index, &mut buf, &mut |_, b| {
            out.extend_from_slice(b);
            Ok::<(), std::convert::Infallible>(())
        })
        .map_err(|e| match e {
            StreamError::Chunk(e) => e,
            StreamError::Sink(never) => match never {},
        })
    }

    /// Writes the byte ranges `ranges` (offset, length; in any order, within the file) one
    /// after the other into `dst` from offset 0, the pieces they touch read on up to
    /// `threads` threads. Returns the bytes written. **`dst` holds only verified bytes once
    /// this returns `Ok`**: each piece is streamed into it and then checked, so a caller must
    /// discard `dst` on an error (the restore removes it before CRIU runs).
    pub fn write_ranges(
        &self,
        ranges: &[(u64, u64)],
        dst: &File,
        threads: usize,
    ) -> Result<u64, ChunkError> {
        let io = |source| ChunkError::Io {
            path: self.shown(),
            source,
        };
        // Each range cut at piece boundaries: (file offset, length, offset in `dst`), by piece.
        let mut by_piece: std::collections::BTreeMap<usize, Vec<Segment>> = Default::default();
        let mut written = 0u64;
        for &(offset, len) in ranges {
            let end = offset.checked_add(len).filter(|&e| e <= self.size);
            let Some(end) = end else {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("bytes {offset}+{len} are past its end ({})", self.size),
                )));
            };
            let mut at = offset;
            while at < end {
                let index = self.piece_of(at);
                let upto = end.min(self.piece_range(index).1);
                by_piece
                    .entry(index)
                    .or_default()
                    .push((at, upto - at, written));
                written += upto - at;
                at = upto;
            }
        }
        let pieces: Vec<(usize, Vec<Segment>)> = by_piece.into_iter().collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed: std::sync::Mutex<Option<ChunkError>> = std::sync::Mutex::new(None);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let threads = threads.clamp(1, pieces.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut buf = vec![0u8; STREAM_BLOCK];
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((index, segments)) = pieces.get(i) else {
                            break;
                        };
                        let mut sink = |at: u64, block: &[u8]| -> std::io::Result<()> {
                            let end = at + block.len() as u64;
                            for &(s_at, s_len, out) in segments {
                                let (lo, hi) = (s_at.max(at), (s_at + s_len).min(end));
                                if lo < hi {
                                    let part = &block[(lo - at) as usize..(hi - at) as usize];
                                    dst.write_all_at(part, out + (lo - s_at))?;
                                }
                            }
                            Ok(())
                        };
                        if let Err(e) = self.stream_piece(*index, &mut buf, &mut sink) {
                            stop.store(true, std::sync::atomic::Ordering::Relaxed);
                            let e = match e {
                                StreamError::Chunk(e) => e,
                                StreamError::Sink(e) => io(e),
                            };
                            failed
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        dst.set_len(written).map_err(io)?;
        Ok(written)
    }
}

/// How much of a piece one read moves.
const STREAM_BLOCK: usize = 4 << 20;

/// Part of a range within one piece: its offset in the file, its length, its offset in the
/// file written.
type Segment = (u64, u64, u64);

#[cfg(test)]
mod tests {
    use super::super::{noise, split, ChunkDigest, ChunkParams, CHUNK_DIR};
    use super::*;
    use crate::manifest::seal_checkpoint;
    use gpusnap_criu_bridge::CriuFlags;
    use std::fs;
    use std::os::fd::AsFd;

    /// Pieces of 64 KiB, so that a small file has several.
    const PIECE: u64 = 64 << 10;

    /// A sealed checkpoint whose `pages-1.img` is left as chunks, with its manifest re-hashed
    /// in [`PIECE`]s; the file's bytes.
    fn fixture() -> (
        tempfile::TempDir,
        Arc<DirSource>,
        ChunkedFile,
        Manifest,
        Vec<u8>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let mut pages = noise(150_000, 7);
        pages.extend(vec![0u8; 70_000]);
        pages.extend(noise(40_000, 9));
        fs::write(p.join("pages-1.img"), &pages).unwrap();
        let mut manifest = seal_checkpoint(p, Manifest::new("ctr1", CriuFlags::default())).unwrap();
        manifest.images.chunk_bytes = PIECE;
        for f in &mut manifest.images.files {
            if f.path == "pages-1.img" {
                f.blake3_chunks = pages
                    .chunks(PIECE as usize)
                    .map(|c| crate::inventory::hex(blake3::hash(c).as_bytes()))
                    .collect();
            }
        }
        fs::create_dir(p.join(CHUNK_DIR)).unwrap();
        let mut chunks = Vec::new();
        let params = ChunkParams {
            min: 1024,
            avg: 4096,
            max: 16384,
        };
        split(&mut pages.as_slice(), params, &mut |c| {
            let d = ChunkDigest::of(c);
            fs::write(p.join(CHUNK_DIR).join(d.hex()), c)?;
            chunks.push(ChunkRef(d, c.len() as u64));
            Ok(())
        })
        .unwrap();
        let listed = ChunkedFile {
            path: "pages-1.img".into(),
            size: pages.len() as u64,
            mtime: Some(1_700_000_000),
            chunks,
        };
        let root = crate::beneath::open_root(p).unwrap();
        let source = DirSource::open_in(root.as_fd(), p).unwrap().unwrap();
        (dir, Arc::new(source), listed, manifest, pages)
    }

    #[test]
    fn pieces_stream_and_read_as_the_file_is() {
        let (_d, source, listed, manifest, pages) = fixture();
        let f = InPlaceFile::new(source, &listed, &manifest).unwrap();
        let pieces = pages.len().div_ceil(PIECE as usize);
        let mut streamed = Vec::new();
        let mut buf = vec![0u8; 5000];
        for i in 0..pieces {
            f.stream_piece(i, &mut buf, &mut |at, b| {
                assert_eq!(at as usize, streamed.len());
                streamed.extend_from_slice(b);
                Ok::<(), ()>(())
            })
            .unwrap();
            let mut whole = Vec::new();
            f.read_piece(i, &mut whole).unwrap();
            let (start, end) = f.piece_range(i);
            assert_eq!(whole, pages[start as usize..end as usize]);
        }
        assert!(streamed == pages);
        // Ranges across pieces, out of order, written one after the other.
        let ranges = [(60_000u64, 20_000u64), (0, 10), (200_000, 60_000)];
        let out = tempfile::tempfile().unwrap();
        let n = f.write_ranges(&ranges, &out, 3).unwrap();
        let want: Vec<u8> = ranges
            .iter()
            .flat_map(|&(o, l)| pages[o as usize..(o + l) as usize].to_vec())
            .collect();
        let mut got = vec![0u8; n as usize];
        out.read_exact_at(&mut got, 0).unwrap();
        assert!(got == want);
        assert!(f
            .write_ranges(&[(pages.len() as u64 - 1, 2)], &out, 2)
            .is_err());
    }

    #[test]
    fn a_damaged_chunk_fails_its_piece_and_only_that_one() {
        let (d, source, listed, manifest, pages) = fixture();
        // A chunk of the first piece, rewritten with one byte changed (its length kept).
        let victim = listed.chunks[1];
        let path = d.path().join(CHUNK_DIR).join(victim.0.hex());
        let mut bytes = fs::read(&path).unwrap();
        bytes[7] ^= 0x40;
        fs::write(&path, bytes).unwrap();
        let f = InPlaceFile::new(source, &listed, &manifest).unwrap();
        let mut out = Vec::new();
        let e = f.read_piece(0, &mut out).unwrap_err();
        assert!(matches!(e, ChunkError::Mismatch { offset: 0, .. }), "{e}");
        assert!(e.to_string().contains("pages-1.img"), "{e}");
        let last = pages.len().div_ceil(PIECE as usize) - 1;
        f.read_piece(last, &mut out).unwrap();
        // Written out, the damaged piece fails the whole write; the intact one alone passes.
        let dst = tempfile::tempfile().unwrap();
        let e = f
            .write_ranges(&[(10, 100), (PIECE * last as u64, 10)], &dst, 2)
            .unwrap_err();
        assert!(matches!(e, ChunkError::Mismatch { offset: 0, .. }), "{e}");
        assert_eq!(
            f.write_ranges(&[(PIECE * last as u64, 10)], &dst, 2)
                .unwrap(),
            10
        );
        // A missing chunk is named.
        fs::remove_file(&path).unwrap();
        let e = f.read_piece(0, &mut out).unwrap_err();
        assert!(matches!(e, ChunkError::ChunkMissing { .. }), "{e}");
    }

    #[test]
    fn a_list_that_disagrees_with_the_manifest_is_refused() {
        let (_d, source, listed, manifest, _) = fixture();
        let mut longer = listed.clone();
        longer.size += 1;
        assert!(InPlaceFile::new(source.clone(), &longer, &manifest).is_err());
        let mut short = listed.clone();
        short.chunks.pop();
        assert!(InPlaceFile::new(source.clone(), &short, &manifest).is_err());
        let mut other = listed;
        other.path = "pages-2.img".into();
        assert!(InPlaceFile::new(source, &other, &manifest).is_err());
    }
}
