//! The allowlist over a checkpoint directory: every file is gpusnap's own, one the runtime
//! writes there, or an image type of [`crate::catalog`]; every entry of every allowed image is
//! walked against CRIU 4.2.1's descriptors and the rule table ([`crate::schema`]). What the
//! model does not know is refused with its name.

use std::path::Path;

use gpusnap_checkpoint::layout::{classify, EntryKind};

use crate::catalog::{self, Framing, ImageType, Verdict};
use crate::finding::Finding;
use crate::image::{ImageDir, ImageError, Limits, IMG_COMMON_MAGIC};
use crate::schema;

/// The files of the directory as the model sees them.
#[derive(Debug, Default)]
pub struct Listing {
    /// Allowed images by name, with their type and the number in their name.
    pub images: Vec<(String, &'static ImageType, u64)>,
}

impl Listing {
    /// The allowed images of type `id` (CRIU's `CR_FD_*` name without the prefix).
    pub fn of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        self.images
            .iter()
            .filter(move |(_, t, _)| t.id == id)
            .map(|(n, _, k)| (n.as_str(), *k))
    }
}

/// What the runtime or CRIU writes into the directory besides images (the `parent` link of an
/// incremental dump is checked by `gpusnap_checkpoint::validate`: a sibling directory).
fn not_an_image(name: &str) -> bool {
    name == gpusnap_checkpoint::layout::ORIGIN_FILE
        || name == "parent"
        || matches!(
            classify(Path::new(name)),
            EntryKind::Manifest | EntryKind::GpusnapData | EntryKind::CriuMetadata | EntryKind::Log
        )
}

/// Walks every file of `dir`; findings for what the model refuses.
pub fn walk_dir(dir: &mut ImageDir, findings: &mut Vec<Finding>) -> Result<Listing, ImageError> {
    let mut names = dir.names().map_err(|source| ImageError::Read {
        name: dir.path().display().to_string(),
        source,
    })?;
    // As CRIU does: the inventory and the process tree first.
    names.sort_by_key(|n| (n != "inventory.img", n != "pstree.img", n.clone()));
    let mut listing = Listing::default();
    let mut refuse = |file: &str, field: &str, detail: String| {
        findings.push(Finding {
            task: None,
            file: file.into(),
            field: field.into(),
            detail,
        })
    };
    for name in names {
        if not_an_image(&name) {
            continue;
        }
        let Some((typ, n)) = catalog::by_name(&name) else {
            refuse(
                &name,
                "file",
                "is neither gpusnap's nor the runtime's nor an image type of CRIU 4.2.1: not \
                 modeled, refused"
                    .into(),
            );
            continue;
        };
        if let Verdict::Refused(why) = typ.verdict {
            refuse(&name, "image type", format!("{} is refused: {why}", typ.id));
            continue;
        }
        if typ.framing != Framing::Raw {
            let bytes = dir.walk_bytes(&name, typ.id)?;
            for v in walk_image(&name, typ, &bytes, &dir.limits())? {
                refuse(&name, &v.at_field(), v.why);
            }
        }
        listing.images.push((name, typ, n));
    }
    Ok(listing)
}

impl schema::Violation {
    fn at_field(&self) -> String {
        format!("{}.{}", self.at, self.field)
    }
}

/// The violations of one image file's entries (framing errors are [`ImageError`]s).
pub fn walk_image(
    name: &str,
    typ: &ImageType,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Vec<schema::Violation>, ImageError> {
    let what = crate::image::Kind::of_magic(typ.magic).map_or(typ.id, |k| k.what());
    let u32_at = |at: usize| -> Option<u32> {
        bytes
            .get(at..at.checked_add(4)?)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let short = || ImageError::TooShort {
        name: name.into(),
        size: bytes.len(),
    };
    let mut at = 0;
    if typ.id != "INVENTORY" {
        let head = u32_at(0).ok_or_else(short)?;
        if head != IMG_COMMON_MAGIC {
            return Err(ImageError::BadHeadMagic {
                name: name.into(),
                found: head,
                expected: IMG_COMMON_MAGIC,
            });
        }
        at = 4;
    }
    let magic = u32_at(at).ok_or_else(short)?;
    if magic != typ.magic {
        return Err(ImageError::WrongType {
            name: name.into(),
            what,
            found: magic,
            expected: typ.magic,
        });
    }
    at += 4;
    let root = schema::message(typ.root.expect("entry images have a root message"));
    let mut out = Vec::new();
    let mut index = 0usize;
    // The raw bytes that follow an entry, by the framing.
    let data_len = |m: &prost_reflect::DynamicMessage, field: &str| -> u64 {
        match m.get_field_by_name(field).as_deref() {
            Some(prost_reflect::Value::U32(v)) => u64::from(*v),
            Some(prost_reflect::Value::U64(v)) => *v,
            _ => 0,
        }
    };
    let mut ghost_chunks = false;
    while at < bytes.len() {
        let truncated = || ImageError::Truncated {
            name: name.into(),
            index,
        };
        if typ.framing == Framing::GhostFile && index > 0 && !ghost_chunks {
            // The rest is the file's content.
            break;
        }
        if index >= limits.max_entries {
            return Err(ImageError::TooManyEntries {
                name: name.into(),
                limit: limits.max_entries,
            });
        }
        let len = u32_at(at).ok_or_else(truncated)?;
        if len > limits.max_entry_bytes {
            return Err(ImageError::EntryTooLarge {
                name: name.into(),
                index,
                len,
                limit: limits.max_entry_bytes,
            });
        }
        let len = len as usize;
        let entry = bytes
            .get(at + 4..(at + 4).checked_add(len).ok_or_else(truncated)?)
            .ok_or_else(truncated)?;
        at += 4 + len;
        let desc = match (typ.framing, index) {
            (Framing::Pagemap, 0) => schema::message("pagemap_head"),
            (Framing::GhostFile, i) if i > 0 => schema::message("ghost_chunk_entry"),
            _ => root.clone(),
        };
        let (message, violations) =
            schema::walk(&desc, entry).map_err(|source| ImageError::Decode {
                name: name.into(),
                index,
                what,
                source,
            })?;
        out.extend(violations.into_iter().map(|mut v| {
            v.at = format!("entry {index}: {}", v.at);
            v
        }));
        let skip = match typ.framing {
            Framing::EntriesWithData(field) => data_len(&message, field),
            Framing::TcpStream => data_len(&message, "inq_len") + data_len(&message, "outq_len"),
            Framing::IpcShm => {
                let in_pagemaps = matches!(
                    message.get_field_by_name("in_pagemaps").as_deref(),
                    Some(prost_reflect::Value::Bool(true))
                );
                if in_pagemaps {
                    0
                } else {
                    data_len(&message, "size").div_ceil(4) * 4
                }
            }
            Framing::GhostFile if index == 0 => {
                ghost_chunks = matches!(
                    message.get_field_by_name("chunks").as_deref(),
                    Some(prost_reflect::Value::Bool(true))
                );
                0
            }
            Framing::GhostFile => data_len(&message, "len"),
            _ => 0,
        };
        let skip = usize::try_from(skip).map_err(|_| truncated())?;
        at = at
            .checked_add(skip)
            .filter(|e| *e <= bytes.len())
            .ok_or_else(truncated)?;
        index += 1;
    }
    Ok(out)
}
