//! Reading CRIU image files as untrusted input.
//!
//! A CRIU image is a u32 head magic (`inventory.img` has none), the u32 magic of its type,
//! then entries: a u32 length in native byte order followed by that many bytes of one
//! protobuf message. Every file is opened beneath the checkpoint directory
//! (`gpusnap_checkpoint::beneath`: no symlink, nothing outside it, a regular file), and every
//! size is capped before it is read.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::beneath;

/// The head magic of ordinary CRIU images (`IMG_COMMON_MAGIC`).
pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;

/// The image types the check reads, with their CRIU type magics (`criu/include/magic.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Inventory,
    Pstree,
    Core,
    Ids,
    Creds,
    Seccomp,
    Mountpoints,
    Userns,
    Apparmor,
    Files,
    RemapFpath,
    Cgroup,
    MemfdInode,
    TtyInfo,
    GhostFile,
    Netdev,
    Mm,
    Pidns,
    Netns,
    Pagemap,
}

impl Kind {
    pub fn magic(self) -> u32 {
        match self {
            Kind::Inventory => 0x5831_3116,
            Kind::Pstree => 0x5027_3030,
            Kind::Core => 0x5505_3847,
            Kind::Ids => 0x5443_2030,
            Kind::Creds => 0x5402_3547,
            Kind::Seccomp => 0x6441_3049,
            Kind::Mountpoints => 0x5556_3928,
            Kind::Userns => 0x5547_4906,
            Kind::Apparmor => 0x5942_3047,
            Kind::Files => 0x5630_3138,
            Kind::RemapFpath => 0x5913_3954,
            Kind::Cgroup => 0x5938_3330,
            Kind::MemfdInode => 0x4845_3499,
            Kind::TtyInfo => 0x5945_3036,
            Kind::GhostFile => 0x5258_3605,
            Kind::Netdev => 0x5737_3951,
            Kind::Mm => 0x5749_2820,
            Kind::Pidns => 0x6115_7326,
            Kind::Netns => 0x5593_3752,
            Kind::Pagemap => 0x5608_4025,
        }
    }

    /// The kind with this type magic, among those the check reads.
    pub fn of_magic(magic: u32) -> Option<Kind> {
        use Kind::*;
        [
            Inventory,
            Pstree,
            Core,
            Ids,
            Creds,
            Seccomp,
            Mountpoints,
            Userns,
            Apparmor,
            Files,
            RemapFpath,
        ]
        .into_iter()
        .find(|k| k.magic() == magic)
    }

    /// Whether the file starts with [`IMG_COMMON_MAGIC`] (every image but the inventory).
    pub fn has_head(self) -> bool {
        self != Kind::Inventory
    }

    /// What the image holds, for messages.
    pub fn what(self) -> &'static str {
        match self {
            Kind::Inventory => "inventory",
            Kind::Pstree => "process tree",
            Kind::Core => "core (thread state)",
            Kind::Ids => "task namespace ids",
            Kind::Creds => "credentials",
            Kind::Seccomp => "seccomp filters",
            Kind::Mountpoints => "mount points",
            Kind::Userns => "user namespace maps",
            Kind::Apparmor => "AppArmor namespaces",
            Kind::Files => "open files",
            Kind::RemapFpath => "file remaps",
            Kind::Cgroup => "cgroups",
            Kind::MemfdInode => "memfd inodes",
            Kind::TtyInfo => "terminals",
            Kind::GhostFile => "ghost file",
            Kind::Netdev => "network devices",
            Kind::Mm => "memory layout",
            Kind::Pidns => "pid namespace",
            Kind::Netns => "network namespace",
            Kind::Pagemap => "page map",
        }
    }
}

/// How much of an image the reader accepts. CRIU's own images for these types are a few KiB;
/// the caps bound memory and time on hostile input, far above any real dump.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest image file read.
    pub max_file_bytes: u64,
    /// Largest single entry.
    pub max_entry_bytes: u32,
    /// Most entries in one file.
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 64 << 20,
            max_entry_bytes: 16 << 20,
            max_entries: 1 << 20,
        }
    }
}

/// Why an image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot open {name} beneath the checkpoint directory: {source}")]
    Open {
        name: String,
        source: std::io::Error,
    },
    #[error("cannot read {name}: {source}")]
    Read {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} is {size} bytes, more than the {limit} a CRIU {what} image may have here")]
    FileTooLarge {
        name: String,
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{name} is too short to be a CRIU image ({size} bytes)")]
    TooShort { name: String, size: usize },
    #[error(
        "{name} does not start with CRIU's image magic (found {found:#010x}, expected \
         {expected:#010x})"
    )]
    BadHeadMagic {
        name: String,
        found: u32,
        expected: u32,
    },
    #[error(
        "{name} is not a CRIU {what} image (type magic {found:#010x}, expected {expected:#010x})"
    )]
    WrongType {
        name: String,
        what: &'static str,
        found: u32,
        expected: u32,
    },
    #[error("{name}: entry {index} is truncated (the file ends inside it)")]
    Truncated { name: String, index: usize },
    #[error("{name}: entry {index} is {len} bytes, more than the {limit} allowed")]
    EntryTooLarge {
        name: String,
        index: usize,
        len: u32,
        limit: u32,
    },
    #[error("{name} has more than {limit} entries")]
    TooManyEntries { name: String, limit: usize },
    #[error("{name}: entry {index} is not a valid {what} entry: {source}")]
    Decode {
        name: String,
        index: usize,
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("{name} holds {found} entries where CRIU reads exactly one")]
    NotOne { name: String, found: usize },
}

/// The entries of one image file held in memory, checked for magics and framing.
pub fn split_entries<'a>(
    name: &str,
    bytes: &'a [u8],
    kind: Kind,
    limits: &Limits,
) -> Result<Vec<&'a [u8]>, ImageError> {
    let u32_at = |at: usize| -> Option<u32> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let mut at = 0;
    if kind.has_head() {
        let found = u32_at(0).ok_or_else(|| ImageError::TooShort {
            name: name.into(),
            size: bytes.len(),
        })?;
        if found != IMG_COMMON_MAGIC {
            return Err(ImageError::BadHeadMagic {
                name: name.into(),
                found,
                expected: IMG_COMMON_MAGIC,
            });
        }
        at = 4;
    }
    let found = u32_at(at).ok_or_else(|| ImageError::TooShort {
        name: name.into(),
        size: bytes.len(),
    })?;
    if found != kind.magic() {
        return Err(ImageError::WrongType {
            name: name.into(),
            what: kind.what(),
            found,
            expected: kind.magic(),
        });
    }
    at += 4;
    let mut entries = Vec::new();
    while at < bytes.len() {
        let index = entries.len();
        if index >= limits.max_entries {
            return Err(ImageError::TooManyEntries {
                name: name.into(),
                limit: limits.max_entries,
            });
        }
        let len = u32_at(at).ok_or_else(|| ImageError::Truncated {
            name: name.into(),
            index,
        })?;
        if len > limits.max_entry_bytes {
            return Err(ImageError::EntryTooLarge {
                name: name.into(),
                index,
                len,
                limit: limits.max_entry_bytes,
            });
        }
        let start = at + 4;
        let end = start + len as usize;
        let entry = bytes.get(start..end).ok_or_else(|| ImageError::Truncated {
            name: name.into(),
            index,
        })?;
        entries.push(entry);
        at = end;
    }
    Ok(entries)
}

/// An image file of `kind` holding `entries` (each one encoded message), framed as CRIU
/// frames them: the head magic (but for the inventory), the type magic, then each entry
/// behind its u32 length.
pub fn frame<B: AsRef<[u8]>>(kind: Kind, entries: &[B]) -> Vec<u8> {
    let mut out = Vec::new();
    if kind.has_head() {
        out.extend_from_slice(&IMG_COMMON_MAGIC.to_ne_bytes());
    }
    out.extend_from_slice(&kind.magic().to_ne_bytes());
    for e in entries {
        let e = e.as_ref();
        out.extend_from_slice(&(e.len() as u32).to_ne_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// Decodes every entry of an image as `M`.
pub fn decode_entries<M: prost::Message + Default>(
    name: &str,
    bytes: &[u8],
    kind: Kind,
    limits: &Limits,
) -> Result<Vec<M>, ImageError> {
    split_entries(name, bytes, kind, limits)?
        .into_iter()
        .enumerate()
        .map(|(index, e)| {
            M::decode(e).map_err(|source| ImageError::Decode {
                name: name.into(),
                index,
                what: kind.what(),
                source,
            })
        })
        .collect()
}

/// A checkpoint directory whose image files are read beneath it.
pub struct ImageDir {
    root: OwnedFd,
    path: PathBuf,
    limits: Limits,
    files_read: usize,
    /// Each file is read once: the schema walk reads every image, the checks read them again
    /// from here (and see the bytes the walk saw).
    cache: std::collections::HashMap<String, Vec<u8>>,
    counted: std::collections::HashSet<String>,
}

impl ImageDir {
    /// Opens the directory the caller trusts (the checkpoint directory itself).
    pub fn open(path: &Path, limits: Limits) -> std::io::Result<ImageDir> {
        Ok(ImageDir {
            root: beneath::open_root(path)?,
            path: path.to_path_buf(),
            limits,
            files_read: 0,
            cache: Default::default(),
            counted: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// `name` opened beneath the directory, for a reader that streams it.
    pub fn open_file(&self, name: &str) -> std::io::Result<std::fs::File> {
        beneath::open_file(self.root.as_fd(), Path::new(name))
    }

    /// How many image files were read so far.
    pub fn files_read(&self) -> usize {
        self.files_read
    }

    /// The plain names in the directory (not followed, not opened).
    pub fn names(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            if let Ok(name) = entry?.file_name().into_string() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The bytes of `name`, `None` when it does not exist.
    pub fn read_bytes(
        &mut self,
        name: &str,
        what: &'static str,
    ) -> Result<Option<Vec<u8>>, ImageError> {
        if let Some(bytes) = self.cache.get(name) {
            if self.counted.insert(name.to_owned()) {
                self.files_read += 1;
            }
            return Ok(Some(bytes.clone()));
        }
        let file = match beneath::open_file(self.root.as_fd(), Path::new(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ImageError::Open {
                    name: name.into(),
                    source,
                })
            }
        };
        let read_err = |source| ImageError::Read {
            name: name.into(),
            source,
        };
        let size = file.metadata().map_err(read_err)?.len();
        let limit = self.limits.max_file_bytes;
        if size > limit {
            return Err(ImageError::FileTooLarge {
                name: name.into(),
                what,
                size,
                limit,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // The size may change under us: never read past the cap.
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        if bytes.len() as u64 > limit {
            return Err(ImageError::FileTooLarge {
                name: name.into(),
                what,
                size: bytes.len() as u64,
                limit,
            });
        }
        self.files_read += 1;
        self.counted.insert(name.to_owned());
        self.cache.insert(name.to_owned(), bytes.clone());
        Ok(Some(bytes))
    }

    /// [`Self::read_bytes`] for the schema walk, which reads every image: not counted in
    /// [`Self::files_read`] (the images the checks read).
    pub fn walk_bytes(&mut self, name: &str, what: &'static str) -> Result<Vec<u8>, ImageError> {
        let counted = self.counted.contains(name);
        let bytes = self.read_bytes(name, what)?.unwrap_or_default();
        if !counted && self.counted.remove(name) {
            self.files_read -= 1;
        }
        Ok(bytes)
    }

    /// Every entry of `name` decoded as `M`; `None` when the file does not exist.
    pub fn read<M: prost::Message + Default>(
        &mut self,
        name: &str,
        kind: Kind,
    ) -> Result<Option<Vec<M>>, ImageError> {
        let limits = self.limits;
        match self.read_bytes(name, kind.what())? {
            None => Ok(None),
            Some(bytes) => decode_entries(name, &bytes, kind, &limits).map(Some),
        }
    }

    /// The one entry of a single-entry image (`core`, `inventory`, `ids`, `creds`); `None`
    /// when the file does not exist.
    pub fn read_one<M: prost::Message + Default>(
        &mut self,
        name: &str,
        kind: Kind,
    ) -> Result<Option<M>, ImageError> {
        match self.read::<M>(name, kind)? {
            None => Ok(None),
            Some(mut v) if v.len() == 1 => Ok(v.pop()),
            Some(v) => Err(ImageError::NotOne {
                name: name.into(),
                found: v.len(),
            }),
        }
    }
}
