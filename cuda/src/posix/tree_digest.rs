//! The BLAKE3 digest of an extent assembled from its slots in any order.
//!
//! BLAKE3 is a binary tree over 1 KiB chunks. A slot whose length is a power of two and whose
//! offset is a multiple of that length covers exactly one subtree, so each I/O thread can hash
//! its own slot right next to the read or write that touches it — while the bytes are still in
//! the CPU's cache, and without waiting for the slots before it — and the subtrees are joined
//! into the same root [`blake3::hash`] gives once all slots are in. The ordered alternative (one
//! thread hashing slots in file order) reads every byte from memory once more and holds slots
//! back until their predecessors arrive.
//!
//! Built on `blake3::hazmat`, checked against `blake3::hash` in the tests below.

use std::collections::BTreeMap;
use std::sync::Mutex;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// Collects the subtrees of one extent and joins them into its digest.
#[derive(Debug)]
pub struct TreeDigest {
    total: u64,
    piece: u64,
    /// offset → subtree chaining value (or, for a single-piece extent, the root hash).
    pieces: Mutex<BTreeMap<u64, Piece>>,
}

#[derive(Debug, Clone, Copy)]
enum Piece {
    Subtree(ChainingValue),
    Root([u8; 32]),
}

impl TreeDigest {
    /// For an extent of `total` bytes cut into pieces of `piece` bytes (the last may be
    /// shorter); `None` when `piece` is not a power of two of at least one BLAKE3 chunk, which
    /// the tree needs.
    pub fn new(total: u64, piece: u64) -> Option<TreeDigest> {
        if !piece.is_power_of_two() || piece < blake3::CHUNK_LEN as u64 {
            return None;
        }
        Some(TreeDigest {
            total,
            piece,
            pieces: Mutex::new(BTreeMap::new()),
        })
    }

    /// A hasher for the piece at `offset` (a multiple of the piece size); feed it the piece's
    /// bytes in order, then hand it to [`Self::add`].
    pub fn hasher(&self, offset: u64) -> blake3::Hasher {
        let mut h = blake3::Hasher::new();
        if self.total > self.piece {
            h.set_input_offset(offset);
        }
        h
    }

    /// Records the piece at `offset`, hashed by `hasher`.
    pub fn add(&self, offset: u64, hasher: &blake3::Hasher) {
        let piece = if self.total > self.piece {
            Piece::Subtree(hasher.finalize_non_root())
        } else {
            Piece::Root(*hasher.finalize().as_bytes())
        };
        self.pieces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(offset, piece);
    }

    /// The digest, lowercase hex; `None` when a piece is missing or misplaced.
    pub fn finish(&self) -> Option<String> {
        let pieces = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        if self.total == 0 {
            return Some(blake3::hash(b"").to_hex().to_string());
        }
        if self.total <= self.piece {
            return match pieces.get(&0) {
                Some(Piece::Root(h)) if pieces.len() == 1 => {
                    Some(blake3::Hash::from(*h).to_hex().to_string())
                }
                _ => None,
            };
        }
        if pieces.len() as u64 != self.total.div_ceil(self.piece) {
            return None;
        }
        let left = left_subtree_len(self.total);
        let l = self.subtree(&pieces, 0, left)?;
        let r = self.subtree(&pieces, left, self.total - left)?;
        Some(merge_subtrees_root(&l, &r, Mode::Hash).to_hex().to_string())
    }

    /// The chaining value of the subtree of `len` bytes at `start`.
    fn subtree(
        &self,
        pieces: &BTreeMap<u64, Piece>,
        start: u64,
        len: u64,
    ) -> Option<ChainingValue> {
        if len <= self.piece {
            // A subtree no larger than a piece is exactly one piece (pieces are aligned powers
            // of two, and only the last is shorter).
            return match pieces.get(&start) {
                Some(Piece::Subtree(cv)) => Some(*cv),
                _ => None,
            };
        }
        let left = left_subtree_len(len);
        let l = self.subtree(pieces, start, left)?;
        let r = self.subtree(pieces, start + left, len - left)?;
        Some(merge_subtrees_non_root(&l, &r, Mode::Hash))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
            .collect()
    }

    /// Every size around the piece boundaries, pieces added in reverse and fed in two parts,
    /// gives blake3::hash.
    #[test]
    fn equals_blake3_hash_for_any_length_and_order() {
        let piece = 4096u64;
        let sizes = [
            0,
            1,
            1023,
            1024,
            1025,
            4095,
            4096,
            4097,
            8191,
            8192,
            8193,
            12288,
            12289,
            16384,
            20480 + 7,
            65536,
            65536 * 3 + 1,
            1 << 20,
        ];
        for &size in &sizes {
            let bytes = data(size);
            let tree = TreeDigest::new(size as u64, piece).unwrap();
            let offsets: Vec<u64> = (0..size as u64).step_by(piece as usize).collect();
            for &off in offsets.iter().rev() {
                let end = (off + piece).min(size as u64) as usize;
                let part = &bytes[off as usize..end];
                let mut h = tree.hasher(off);
                let mid = part.len() / 2;
                h.update(&part[..mid]);
                h.update(&part[mid..]);
                tree.add(off, &h);
            }
            assert_eq!(
                tree.finish().unwrap(),
                blake3::hash(&bytes).to_hex().to_string(),
                "size {size}"
            );
        }
    }

    #[test]
    fn a_missing_piece_gives_no_digest() {
        let bytes = data(3 * 4096);
        let tree = TreeDigest::new(bytes.len() as u64, 4096).unwrap();
        for off in [0u64, 8192] {
            let mut h = tree.hasher(off);
            h.update(&bytes[off as usize..off as usize + 4096]);
            tree.add(off, &h);
        }
        assert_eq!(tree.finish(), None);
    }

    #[test]
    fn pieces_must_be_powers_of_two() {
        assert!(TreeDigest::new(1 << 20, 3 << 12).is_none());
        assert!(TreeDigest::new(1 << 20, 512).is_none());
        assert!(TreeDigest::new(1 << 20, 16 << 20).is_some());
    }
}
