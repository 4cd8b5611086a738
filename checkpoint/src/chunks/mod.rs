//! Chunked checkpoint files: the chunk list format, content-defined splitting, and assembly.
//!
//! A chunked checkpoint image carries its large files (CRIU `pages-*.img`, GPU state
//! `gpusnap-gpu-*`) as content-defined chunks (FastCDC), each stored once as
//! `<checkpoint>/.gpusnap-chunks/<sha256 hex>`, plus a chunk list
//! `<checkpoint>/gpusnap-chunks.json` that says, for every chunked file, its size and its ordered
//! `(digest, length)` chunks, and (format 2) its modification time. Identical chunks — a zero region inside one checkpoint, the same
//! weights in two replicas — are therefore stored and moved once (see the oci-image crate docs
//! for how chunks are grouped into layers).
//!
//! [`assemble`] turns such a directory back into the flat checkpoint directory gpusnap always
//! restores (layout.rs): every door calls it before validation — `gpusnap image pull
//! --extract` on its staging tree, the restore transaction on the directory a runtime hands it
//! (containerd's or CRI-O's copy of a checkpoint image, Podman's import). A pull of a chunked
//! image does better: [`StreamAssembly`] writes each chunk into the files as its pack downloads,
//! with the same checks.
//!
//! # What is trusted
//!
//! Nothing in the chunk list or the chunk files. Each assembled file is checked against the
//! *sealed gpusnap manifest* (size and BLAKE3 of every 64 MiB piece) before it is renamed into
//! place, so a list in the wrong order, a chunk that hashes right but belongs elsewhere, or a
//! chunk served by a damaged store all end in a refusal that leaves no assembled file behind.
//! The list is capped ([`MAX_CHUNK_LIST_BYTES`], [`MAX_FILES`], [`MAX_CHUNKS`],
//! [`MAX_CHUNK_BYTES`]), names only files the manifest lists as CRIU images or GPU state, and
//! its lengths must add up to the manifest's sizes. Chunk files are opened beneath the chunk
//! directory (`beneath`: no symlink followed) and must be regular files with one link and the
//! listed length; each is SHA-256-checked against its name.

mod assemble;
mod in_place;
mod split;
mod stream;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::layout::{classify, EntryKind};
use crate::manifest::Manifest;

pub use assemble::{
    assemble, assemble_at, assemble_opened, is_chunked, Assembled, ChunkSource, DirSource,
    OpenError,
};
pub use in_place::{InPlaceFile, StreamError};
pub use split::{split, ChunkParams, ChunkParamsError};
pub use stream::StreamAssembly;

/// The directory of chunk files inside a checkpoint directory.
pub const CHUNK_DIR: &str = ".gpusnap-chunks";
/// The chunk list, directly in the checkpoint directory.
pub const CHUNK_LIST_FILE: &str = "gpusnap-chunks.json";
/// `kind` of a chunk list.
pub const CHUNK_LIST_KIND: &str = "gpusnap-chunks";
/// The chunk list format this gpusnap writes. Format 2 added each file's modification time
/// (`mtime`, required); format 1 lists, which have none, are still read (their files keep the
/// time of assembly). A gpusnap that reads only format 1 refuses a format 2 list by its
/// version, naming the release to use, rather than by an unknown field.
pub const CHUNK_LIST_FORMAT: u32 = 2;
/// The chunk list formats this gpusnap reads.
pub const CHUNK_LIST_FORMATS_READ: [u32; 2] = [1, CHUNK_LIST_FORMAT];
/// Latest modification time accepted in a chunk list, in seconds since the epoch
/// (9999-12-31T23:59:59Z): far past any real file, and well inside what a `timespec` holds.
pub const MAX_MTIME: u64 = 253_402_300_799;
/// Largest chunk list read (one entry is about 80 bytes: 64 MiB covers ~800k chunks).
pub const MAX_CHUNK_LIST_BYTES: u64 = 64 << 20;
/// Most chunked files in one list.
pub const MAX_FILES: usize = 4096;
/// Most chunks in one list, over all files (1 TiB at 1 MiB chunks).
pub const MAX_CHUNKS: usize = 1 << 20;
/// Longest chunk accepted (FastCDC's largest maximum).
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;

/// SHA-256 of one chunk; its file name is the lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkDigest(pub [u8; 32]);

impl ChunkDigest {
    pub fn of(bytes: &[u8]) -> ChunkDigest {
        use sha2::Digest;
        ChunkDigest(sha2::Sha256::digest(bytes).into())
    }

    /// Exactly 64 lowercase hex digits.
    pub fn parse(hex: &str) -> Option<ChunkDigest> {
        let b = hex.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let nib = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
        }
        Some(ChunkDigest(out))
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 bytes as a number (pack boundaries are chosen from it).
    pub fn prefix_u64(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }
}

impl fmt::Display for ChunkDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for ChunkDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl Serialize for ChunkDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for ChunkDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ChunkDigest::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("{s:?} is not 64 lowercase hex digits"))
        })
    }
}

/// One chunk of a file: its digest and length, serialized as `["<hex>", <length>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef(pub ChunkDigest, pub u64);

/// One chunked file of the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkedFile {
    /// A plain name directly in the checkpoint directory, as in the manifest's inventory.
    pub path: String,
    pub size: u64,
    /// Modification time in whole seconds since the epoch, as the build read it: the precision
    /// of the classic layout, whose tar headers (GNU, no PAX times) carry whole seconds and
    /// whose extraction sets them with nanoseconds 0. Assembly sets it on the assembled file.
    /// Required from format 2 on, absent in format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime: Option<u64>,
    /// In file order; a digest may repeat (a zero region).
    pub chunks: Vec<ChunkRef>,
}

/// `gpusnap-chunks.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkList {
    pub kind: String,
    pub format_version: u32,
    /// Sorted by path.
    pub files: Vec<ChunkedFile>,
}

impl ChunkList {
    pub fn new(mut files: Vec<ChunkedFile>) -> ChunkList {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        ChunkList {
            kind: CHUNK_LIST_KIND.into(),
            format_version: CHUNK_LIST_FORMAT,
            files,
        }
    }

    /// Compact JSON: the same list is the same bytes (and so the same layer digest).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a chunk list serializes")
    }

    /// Parses untrusted bytes (at most [`MAX_CHUNK_LIST_BYTES`]) and checks the list on its
    /// own: kind, format, caps, names, lengths adding up to sizes.
    pub fn parse(bytes: &[u8]) -> Result<ChunkList, ChunkListError> {
        if bytes.len() as u64 > MAX_CHUNK_LIST_BYTES {
            return Err(ChunkListError::TooLarge { len: bytes.len() });
        }
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(ChunkListError::Json)?;
        let kind = value.get("kind").and_then(|k| k.as_str());
        if kind != Some(CHUNK_LIST_KIND) {
            return Err(ChunkListError::Kind {
                kind: kind.unwrap_or("<none>").to_owned(),
            });
        }
        let version = value.get("format_version").and_then(|v| v.as_u64());
        if !version.is_some_and(|v| CHUNK_LIST_FORMATS_READ.iter().any(|f| u64::from(*f) == v)) {
            return Err(ChunkListError::Format { version });
        }
        let list: ChunkList = serde_json::from_value(value).map_err(ChunkListError::Shape)?;
        list.check()?;
        Ok(list)
    }

    fn check(&self) -> Result<(), ChunkListError> {
        use ChunkListError as E;
        if self.files.len() > MAX_FILES {
            return Err(E::TooManyFiles {
                count: self.files.len(),
            });
        }
        let mut total = 0usize;
        let mut seen = BTreeSet::new();
        for f in &self.files {
            let path = || f.path.clone();
            if !chunkable_name(&f.path) {
                return Err(E::NotChunkable { path: path() });
            }
            if !seen.insert(f.path.as_str()) {
                return Err(E::Twice { path: path() });
            }
            match (self.format_version, f.mtime) {
                (1, None) => {}
                (1, Some(_)) => return Err(E::MtimeInFormat1 { path: path() }),
                (_, None) => return Err(E::NoMtime { path: path() }),
                (_, Some(mtime)) if mtime > MAX_MTIME => {
                    return Err(E::MtimeTooLate {
                        path: path(),
                        mtime,
                    })
                }
                (_, Some(_)) => {}
            }
            total = total.saturating_add(f.chunks.len());
            if total > MAX_CHUNKS {
                return Err(E::TooManyChunks);
            }
            let mut sum = 0u64;
            for ChunkRef(d, len) in &f.chunks {
                if *len == 0 || *len > MAX_CHUNK_BYTES {
                    return Err(E::ChunkLength {
                        path: path(),
                        digest: *d,
                        len: *len,
                    });
                }
                sum = sum
                    .checked_add(*len)
                    .ok_or_else(|| E::Overflow { path: path() })?;
            }
            if sum != f.size {
                return Err(E::Sum {
                    path: path(),
                    sum,
                    size: f.size,
                });
            }
        }
        Ok(())
    }

    /// Every listed file is in the sealed manifest with the same size.
    pub fn check_against(&self, manifest: &Manifest) -> Result<(), ChunkListError> {
        for f in &self.files {
            match manifest.images.get(&f.path) {
                None => {
                    return Err(ChunkListError::NotInManifest {
                        path: f.path.clone(),
                    })
                }
                Some(rec) if rec.size != f.size => {
                    return Err(ChunkListError::SizeMismatch {
                        path: f.path.clone(),
                        listed: f.size,
                        sealed: rec.size,
                    })
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Distinct digests with their lengths.
    pub fn distinct(&self) -> std::collections::BTreeMap<ChunkDigest, u64> {
        self.files
            .iter()
            .flat_map(|f| f.chunks.iter().map(|c| (c.0, c.1)))
            .collect()
    }
}

/// Why a chunk list is refused, on its own ([`ChunkList::parse`]) or against the sealed
/// manifest ([`ChunkList::check_against`]).
#[derive(Debug, thiserror::Error)]
pub enum ChunkListError {
    #[error("{len} bytes, more than the {cap}-byte limit", cap = MAX_CHUNK_LIST_BYTES)]
    TooLarge { len: usize },
    #[error("invalid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("kind is {kind:?}, not {want:?}", want = CHUNK_LIST_KIND)]
    Kind { kind: String },
    #[error(
        "format_version {version:?} is not one of {formats:?}: use the gpusnap release that \
         built the image, or rebuild it with this one",
        formats = CHUNK_LIST_FORMATS_READ
    )]
    Format { version: Option<u64> },
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
    #[error("{count} files, more than the {max} allowed", max = MAX_FILES)]
    TooManyFiles { count: usize },
    #[error(
        "{path:?} is not a CRIU page image or GPU state file directly in the checkpoint \
         directory"
    )]
    NotChunkable { path: String },
    #[error("{path:?} is listed twice")]
    Twice { path: String },
    #[error("{path}: an mtime in a format 1 list, which has none")]
    MtimeInFormat1 { path: String },
    #[error("{path}: no mtime")]
    NoMtime { path: String },
    #[error("{path}: mtime {mtime} is past the latest accepted, {max}", max = MAX_MTIME)]
    MtimeTooLate { path: String, mtime: u64 },
    #[error("more than {max} chunks", max = MAX_CHUNKS)]
    TooManyChunks,
    #[error(
        "{path}: chunk {digest} is {len} bytes; chunks are 1 to {max}",
        max = MAX_CHUNK_BYTES
    )]
    ChunkLength {
        path: String,
        digest: ChunkDigest,
        len: u64,
    },
    #[error("{path}: chunk lengths overflow")]
    Overflow { path: String },
    #[error("{path}: chunks add up to {sum} bytes, the file is {size}")]
    Sum { path: String, sum: u64, size: u64 },
    #[error("{path} is not in the gpusnap manifest")]
    NotInManifest { path: String },
    #[error("{path} is {listed} bytes in the chunk list but {sealed} in the gpusnap manifest")]
    SizeMismatch {
        path: String,
        listed: u64,
        sealed: u64,
    },
}

/// Whether a file of the checkpoint directory is carried as chunks: CRIU page images
/// (`pages-*.img`, `amdgpu-pages-*.img`) and GPU state files (`gpusnap-gpu-*`) — the files that
/// hold a process's memory and so nearly all of a checkpoint's bytes.
pub fn chunkable_name(rel: &str) -> bool {
    let p = std::path::Path::new(rel);
    if rel.contains('/') || rel.starts_with('.') {
        return false;
    }
    match classify(p) {
        EntryKind::CriuImage => rel.contains("pages-") && rel.ends_with(".img"),
        EntryKind::GpusnapData => crate::layout::is_gpu_file(p),
        _ => false,
    }
}

/// Why a chunked checkpoint is not assembled. Nothing assembled is left behind.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error(
        "the chunk list {} is not valid: {reason} — the image was altered or not made by \
         gpusnap; pull or import it again from its source",
        list.display()
    )]
    ListInvalid { list: PathBuf, reason: String },
    #[error(
        "{} holds chunk files but no chunk list {CHUNK_LIST_FILE}: the image was altered — pull \
         or import it again from its source",
        dir.display()
    )]
    DirWithoutList { dir: PathBuf },
    #[error(
        "chunk {digest} of {file} is missing from {source_name}: the image is incomplete — pull \
         or import it again from its source"
    )]
    ChunkMissing {
        digest: ChunkDigest,
        file: String,
        source_name: String,
    },
    #[error(
        "chunk {digest} in {source_name} is {what}: chunk files must be regular files with one \
         link — the image was altered; pull or import it again from its source"
    )]
    ChunkNotPlain {
        digest: ChunkDigest,
        source_name: String,
        what: String,
    },
    #[error(
        "chunk {digest} of {file} in {source_name} {problem} — the image or store is damaged; \
         pull or import it again from its source"
    )]
    ChunkDamaged {
        digest: ChunkDigest,
        file: String,
        source_name: String,
        problem: String,
    },
    #[error(
        "{} assembled from its chunks is corrupted: the digest of bytes {offset}..{end} \
         differs from the sealed gpusnap manifest (the file was damaged before the image was \
         built, or the chunk list was altered: chunks out of order or from another file) — do \
         not restore this image; pull or import it again from a trusted source",
        file.display()
    )]
    Mismatch {
        file: PathBuf,
        offset: u64,
        end: u64,
    },
    #[error(
        "{} is in the chunk list and also present whole: the image mixes two layouts — pull or \
         import it again from its source",
        file.display()
    )]
    AlsoWhole { file: PathBuf },
    #[error(
        "assembling {} needs {needed} bytes but {free} are free: free space there, or extract \
         elsewhere",
        dir.display()
    )]
    NoSpace {
        dir: PathBuf,
        needed: u64,
        free: u64,
    },
    #[error("the gpusnap manifest of {}: {reason}", dir.display())]
    Manifest { dir: PathBuf, reason: String },
    #[error("assembling chunked files in {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "chunk {digest} from {source_name} is not in the chunk list: the image was altered — \
         pull or import it again from its source"
    )]
    ChunkUnlisted {
        digest: ChunkDigest,
        source_name: String,
    },
    #[error(
        "chunk {digest} arrived twice from {source_name}: the image was altered — pull or \
         import it again from its source"
    )]
    ChunkTwice {
        digest: ChunkDigest,
        source_name: String,
    },
}

/// Test bytes that do not compress or repeat (xorshift from `seed`).
#[cfg(test)]
pub(crate) fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(files: Vec<ChunkedFile>) -> Vec<u8> {
        ChunkList::new(files).to_bytes()
    }

    fn one(path: &str, chunks: &[(&[u8], u64)]) -> ChunkedFile {
        ChunkedFile {
            path: path.into(),
            size: chunks.iter().map(|c| c.1).sum(),
            mtime: Some(1_772_359_200),
            chunks: chunks
                .iter()
                .map(|(b, n)| ChunkRef(ChunkDigest::of(b), *n))
                .collect(),
        }
    }

    #[test]
    fn digests_round_trip_and_refuse_odd_hex() {
        let d = ChunkDigest::of(b"abc");
        assert_eq!(ChunkDigest::parse(&d.hex()), Some(d));
        assert_eq!(
            d.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(ChunkDigest::parse(&d.hex().to_uppercase()).is_none());
        assert!(ChunkDigest::parse(&d.hex()[1..]).is_none());
        assert!(ChunkDigest::parse(&format!("../{}", &d.hex()[3..])).is_none());
    }

    #[test]
    fn lists_round_trip() {
        let bytes = list(vec![one("pages-1.img", &[(b"a", 3), (b"a", 3), (b"b", 4)])]);
        let l = ChunkList::parse(&bytes).unwrap();
        assert_eq!(l.files[0].size, 10);
        assert_eq!(l.distinct().len(), 2);
        assert_eq!(l.to_bytes(), bytes, "deterministic bytes");
    }

    #[test]
    fn hostile_lists_are_refused() {
        let refused = |bytes: Vec<u8>, want: &str| {
            let e = ChunkList::parse(&bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want:?})");
        };
        refused(
            list(vec![one("../pages-1.img", &[(b"a", 1)])]),
            "not a CRIU page image",
        );
        refused(list(vec![one("core-1.img", &[(b"a", 1)])]), "not a CRIU");
        refused(
            list(vec![one("gpusnap-manifest.json", &[(b"a", 1)])]),
            "not a CRIU",
        );
        refused(
            list(vec![one(".gpusnap-chunks/x", &[(b"a", 1)])]),
            "not a CRIU",
        );
        refused(
            list(vec![
                one("pages-1.img", &[(b"a", 1)]),
                one("pages-1.img", &[(b"a", 1)]),
            ]),
            "listed twice",
        );
        refused(list(vec![one("pages-1.img", &[(b"a", 0)])]), "0 bytes");
        refused(
            list(vec![one("pages-1.img", &[(b"a", MAX_CHUNK_BYTES + 1)])]),
            "chunks are 1 to",
        );
        let mut f = one("pages-1.img", &[(b"a", 5)]);
        f.size = 6;
        refused(list(vec![f]), "add up to 5");
        let mut f = one("pages-1.img", &[]);
        f.chunks = vec![ChunkRef(ChunkDigest::of(b"a"), 1); MAX_CHUNKS + 1];
        f.size = MAX_CHUNKS as u64 + 1;
        refused(list(vec![f]), "more than");
        refused(
            br#"{"kind":"other","format_version":1,"files":[]}"#.to_vec(),
            "kind",
        );
        refused(
            br#"{"kind":"gpusnap-chunks","format_version":9,"files":[]}"#.to_vec(),
            "format_version",
        );
        refused(
            br#"{"kind":"gpusnap-chunks","format_version":1,"files":[{"path":"pages-1.img","size":1,"chunks":[["../../etc/passwd",1]]}]}"#.to_vec(),
            "hex",
        );
        refused(vec![b' '; MAX_CHUNK_LIST_BYTES as usize + 1], "limit");
        let mut f = one("pages-1.img", &[(b"a", 1)]);
        f.mtime = None;
        refused(list(vec![f]), "no mtime");
        let mut f = one("pages-1.img", &[(b"a", 1)]);
        f.mtime = Some(MAX_MTIME + 1);
        refused(list(vec![f]), "past the latest accepted");
        let a = ChunkDigest::of(b"a");
        refused(
            format!(r#"{{"kind":"gpusnap-chunks","format_version":2,"files":[{{"path":"pages-1.img","size":1,"mtime":-1,"chunks":[["{a}",1]]}}]}}"#).into_bytes(),
            "invalid value",
        );
        refused(
            format!(r#"{{"kind":"gpusnap-chunks","format_version":1,"files":[{{"path":"pages-1.img","size":1,"mtime":5,"chunks":[["{a}",1]]}}]}}"#).into_bytes(),
            "format 1",
        );
    }

    #[test]
    fn format_1_lists_without_times_are_still_read() {
        let a = ChunkDigest::of(b"a");
        let l = ChunkList::parse(
            format!(r#"{{"kind":"gpusnap-chunks","format_version":1,"files":[{{"path":"pages-1.img","size":1,"chunks":[["{a}",1]]}}]}}"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(l.files[0].mtime, None);
        // What this gpusnap writes: format 2, every file with its time.
        let bytes = list(vec![one("pages-1.img", &[(b"a", 1)])]);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["format_version"], 2);
        assert_eq!(v["files"][0]["mtime"], 1_772_359_200u64);
    }

    #[test]
    fn chunkable_names() {
        for ok in [
            "pages-1.img",
            "amdgpu-pages-2.img",
            "gpusnap-gpu-device-0000.bin",
        ] {
            assert!(chunkable_name(ok), "{ok}");
        }
        for no in [
            "core-1.img",
            "gpusnap-manifest.json",
            "gpusnap-chunks.json",
            "x/pages-1.img",
            ".pages-1.img",
            "descriptors.json",
        ] {
            assert!(!chunkable_name(no), "{no}");
        }
    }
}
