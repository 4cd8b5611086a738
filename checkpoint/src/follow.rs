//! Hashing CRIU's page images while CRIU is still writing them.
//!
//! Hashing the whole checkpoint after the dump puts a few hundred milliseconds per 10 GB on the
//! checkpoint's critical path whenever nothing else runs after the dump — a caller-frozen
//! container (containerd's client pauses the task around every checkpoint) waits for the seal.
//! Almost all of those bytes are CRIU's `pages-<id>.img`, which CRIU writes front to back
//! (splicing its page pipes at the file position) and never revisits, so a chunk of
//! [`CHUNK_BYTES`] lying wholly below a page image's current size is final. An
//! [`ImageFollower`] hashes such chunks on one thread during the dump; once CRIU has exited,
//! [`ImageFollower::finish`] takes the inventory exactly as [`ImageInventory::scan`] does and
//! hashes only what the follower has not: the last, partial chunk of each page image and every
//! other file, on all cores.
//!
//! Only page images are followed: gpusnap's own extent files are written at scattered offsets by
//! several transfer slots, and small images are written in one go anyway. A page image that was
//! replaced (another inode) or is shorter than what was hashed is hashed again from the start,
//! and a stale digest could only ever make a later verification refuse the image, never accept
//! different bytes.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::inventory::{
    hash_file_range, ImageInventory, InventoryError, Known, KnownFile, VerifyFailure, CHUNK_BYTES,
};

/// How often the directory is looked at for new page images and new complete chunks.
const POLL: Duration = Duration::from_millis(20);

/// Read buffer of the following thread.
const READ_BUF: usize = 1 << 20;

/// Hashes the complete chunks of a checkpoint's page images while they are written.
pub struct ImageFollower {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    hashed: Arc<AtomicU64>,
    thread: Option<JoinHandle<Known>>,
}

/// What [`ImageFollower::finish`] found.
#[derive(Debug)]
pub struct FollowedInventory {
    pub inventory: ImageInventory,
    /// Bytes hashed while they were written and still valid at the end.
    pub hashed_while_written: u64,
}

/// A page image being followed: the open file and the digests of its complete chunks so far.
struct Followed {
    file: File,
    known: KnownFile,
}

impl ImageFollower {
    /// Starts following `dir` (which must exist; a failure to read it only means nothing is
    /// hashed early).
    pub fn start(dir: &Path) -> ImageFollower {
        let stop = Arc::new(AtomicBool::new(false));
        let hashed = Arc::new(AtomicU64::new(0));
        let thread = {
            let dir = dir.to_path_buf();
            let (stop, hashed) = (stop.clone(), hashed.clone());
            thread::Builder::new()
                .name("gpusnap-follow".into())
                .spawn(move || follow(&dir, &stop, &hashed))
                .ok()
        };
        ImageFollower {
            dir: dir.to_path_buf(),
            stop,
            hashed,
            thread,
        }
    }

    /// The inventory of the directory, once whatever writes into it has finished: what the
    /// follower hashed is reused where it still holds, the rest is hashed now.
    pub fn finish(mut self) -> Result<FollowedInventory, InventoryError> {
        let known = self.stop_thread();
        let (inventory, reused) = ImageInventory::scan_known(&self.dir, &known)?;
        Ok(FollowedInventory {
            inventory,
            hashed_while_written: reused,
        })
    }

    /// Bytes hashed so far (some may turn out stale at the end).
    pub fn hashed_bytes(&self) -> u64 {
        self.hashed.load(Ordering::Relaxed)
    }

    fn stop_thread(&mut self) -> Known {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ImageFollower {
    /// An abandoned checkpoint: stop hashing before its files are scrubbed.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
        }
    }
}

/// Whether `name` is one of CRIU's page images (`pages-<id>.img`).
fn is_page_image(name: &str) -> bool {
    name.strip_prefix("pages-")
        .and_then(|rest| rest.strip_suffix(".img"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

fn follow(dir: &Path, stop: &AtomicBool, hashed: &AtomicU64) -> Known {
    let mut followed: HashMap<String, Followed> = HashMap::new();
    let mut buf = vec![0u8; READ_BUF];
    // Page images are opened beneath the directory opened here, never through a symlink; a
    // directory that cannot be opened only means nothing is hashed early.
    let root = crate::beneath::open_root(dir).ok();
    while !stop.load(Ordering::Acquire) {
        if let Some(root) = &root {
            pass(root.as_fd(), &mut followed, &mut buf, stop, hashed);
        }
        thread::sleep(POLL);
    }
    tracing::debug!(
        dir = %dir.display(),
        files = followed.len(),
        hashed_bytes = hashed.load(Ordering::Relaxed),
        "page images hashed while written"
    );
    Known {
        files: followed
            .into_iter()
            .map(|(name, f)| (name, f.known))
            .collect(),
    }
}

/// One look at the directory: opens new page images and hashes every chunk now complete.
fn pass(
    dir: BorrowedFd<'_>,
    followed: &mut HashMap<String, Followed>,
    buf: &mut [u8],
    stop: &AtomicBool,
    hashed: &AtomicU64,
) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(names) = crate::beneath::names(dir) {
        for name in names {
            let Ok(name) = name.into_string() else {
                continue;
            };
            if !is_page_image(&name) || followed.contains_key(&name) {
                continue;
            }
            // Opened once, beneath the directory (a regular file, no symlink): every chunk
            // hashed is read from this inode, which finish compares.
            let Ok(file) = crate::beneath::open_file(dir, Path::new(&name)) else {
                continue;
            };
            let Ok(meta) = file.metadata() else { continue };
            let known = KnownFile {
                dev: meta.dev(),
                ino: meta.ino(),
                chunks: Vec::new(),
            };
            followed.insert(name, Followed { file, known });
        }
    }
    for (name, f) in followed.iter_mut() {
        let Ok(size) = f.file.metadata().map(|m| m.len()) else {
            continue;
        };
        while !stop.load(Ordering::Acquire) {
            let offset = f.known.chunks.len() as u64 * CHUNK_BYTES;
            if offset + CHUNK_BYTES > size {
                break;
            }
            match hash_file_range(&f.file, Path::new(name), offset, CHUNK_BYTES, buf) {
                Ok(digest) => {
                    f.known.chunks.push(digest);
                    hashed.fetch_add(CHUNK_BYTES, Ordering::Relaxed);
                }
                // Left for finish, which hashes whatever is not known from the start.
                Err(VerifyFailure::Io { .. } | VerifyFailure::ShortRead { .. }) => break,
                Err(VerifyFailure::Digest { .. }) => unreachable!("no expected digest given"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;

    /// `len` bytes in which every 64 KiB block differs (a repeated block, its index stamped in).
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        const BLOCK: usize = 64 << 10;
        let block: Vec<u8> = (0..BLOCK)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect();
        let mut out = Vec::with_capacity(len);
        let mut index = 0u64;
        while out.len() < len {
            let start = out.len();
            out.extend_from_slice(&block[..BLOCK.min(len - start)]);
            let stamp = index.to_le_bytes();
            let n = stamp.len().min(out.len() - start);
            out[start..start + n].copy_from_slice(&stamp[..n]);
            index += 1;
        }
        out
    }

    #[test]
    fn page_image_names() {
        assert!(is_page_image("pages-1.img"));
        assert!(is_page_image("pages-123.img"));
        assert!(!is_page_image("pages-.img"));
        assert!(!is_page_image("pages-1a.img"));
        assert!(!is_page_image("pagemap-1.img"));
        assert!(!is_page_image("gpusnap-gpu-x.bin"));
    }

    /// Files written while followed — a page image growing in pieces, one written at once,
    /// one replaced by another inode, one truncated and rewritten shorter — end in the same
    /// inventory a scan after the fact gives.
    #[test]
    fn followed_inventory_equals_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let chunk = CHUNK_BYTES as usize;
        let follower = ImageFollower::start(p);

        let growing = pattern(2 * chunk + 12_345, 1);
        let mut f = File::create(p.join("pages-1.img")).unwrap();
        for piece in growing.chunks(chunk / 3) {
            f.write_all(piece).unwrap();
            thread::sleep(POLL / 2);
        }
        drop(f);
        fs::write(p.join("pages-2.img"), pattern(chunk + 1, 2)).unwrap();
        fs::write(p.join("pages-3.img"), pattern(chunk, 3)).unwrap();
        fs::write(p.join("pages-4.img"), pattern(chunk + 7, 4)).unwrap();
        fs::write(p.join("inventory.img"), b"small").unwrap();
        // Let the follower hash every complete chunk there (2 + 1 + 1 + 1), then change two
        // files under it.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while follower.hashed_bytes() < 5 * CHUNK_BYTES {
            assert!(
                std::time::Instant::now() < deadline,
                "the follower hashed nothing"
            );
            thread::sleep(POLL);
        }
        let replacement = p.join("pages-3.img.new");
        fs::write(&replacement, pattern(chunk, 33)).unwrap();
        fs::rename(&replacement, p.join("pages-3.img")).unwrap();
        fs::write(p.join("pages-4.img"), pattern(100, 44)).unwrap();

        let followed = follower.finish().unwrap();
        let scanned = ImageInventory::scan(p).unwrap();
        assert_eq!(followed.inventory, scanned);
        assert_eq!(scanned.files.len(), 5);
        // Reused: pages-1's two chunks and pages-2's one; pages-3 (replaced) and pages-4
        // (shorter now) were hashed again.
        assert_eq!(followed.hashed_while_written, 3 * CHUNK_BYTES);
    }

    #[test]
    fn an_abandoned_follower_stops() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("pages-1.img"), pattern(100, 0)).unwrap();
        let follower = ImageFollower::start(dir.path());
        thread::sleep(POLL * 2);
        drop(follower);
    }
}
