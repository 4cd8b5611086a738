//! Writing CRIU images: what an attacker with write access to a checkpoint does, for tests.
//!
//! [`image`] frames entries as CRIU does. [`edit_entries`], [`edit_core`] and [`edit_creds`]
//! decode a real image's entries into the types generated from CRIU's own `.proto` files,
//! change them and encode them again (every field CRIU wrote is declared there, so none is
//! lost): an edited image is one CRIU would restore as edited.

use prost::Message;

use crate::image::{split_entries, ImageError, Kind, Limits};

/// Why an image could not be edited.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("malformed protobuf message: {0}")]
    Malformed(String),
}

impl From<prost::DecodeError> for ForgeError {
    fn from(e: prost::DecodeError) -> Self {
        ForgeError::Malformed(e.to_string())
    }
}

use crate::proto::{CoreEntry, CredsEntry, ThreadCoreEntry};

/// An image file of `kind` holding `entries` (each one encoded message).
pub fn image<B: AsRef<[u8]>>(kind: Kind, entries: &[B]) -> Vec<u8> {
    crate::image::frame(kind, entries)
}

/// An image file of `kind` holding `messages`.
pub fn image_of<M: Message>(kind: Kind, messages: &[M]) -> Vec<u8> {
    let encoded: Vec<Vec<u8>> = messages.iter().map(Message::encode_to_vec).collect();
    image(kind, &encoded)
}

/// A capability set as CRIU stores it: 32-bit words, low word first.
pub fn cap_words(mask: u64) -> Vec<u32> {
    vec![mask as u32, (mask >> 32) as u32]
}

/// `core_img` (a whole `core-<tid>.img`) with its thread's state changed by `edit`. The entry
/// is decoded into the types generated from CRIU's own `.proto` files and encoded again, so
/// every field CRIU wrote (registers, signal state, ...) is kept.
pub fn edit_core(
    core_img: &[u8],
    edit: impl FnOnce(&mut ThreadCoreEntry),
) -> Result<Vec<u8>, ForgeError> {
    edit_entry(core_img, Kind::Core, |core: &mut CoreEntry| {
        edit(core.thread_core.get_or_insert_with(Default::default))
    })
}

/// `img` (a whole single-entry image of `kind`) with its entry, decoded as `M`, changed by
/// `edit` and encoded again.
pub fn edit_entry<M: Message + Default>(
    img: &[u8],
    kind: Kind,
    edit: impl FnOnce(&mut M),
) -> Result<Vec<u8>, ForgeError> {
    edit_entries(img, kind, |entries: &mut Vec<M>| match &mut entries[..] {
        [one] => {
            edit(one);
            Ok(())
        }
        other => Err(ImageError::NotOne {
            name: kind.what().into(),
            found: other.len(),
        }
        .into()),
    })
}

/// `img` (a whole image of `kind`) with its entries, decoded as `M`, changed by `edit` (which
/// may add or remove some) and encoded again.
pub fn edit_entries<M: Message + Default>(
    img: &[u8],
    kind: Kind,
    edit: impl FnOnce(&mut Vec<M>) -> Result<(), ForgeError>,
) -> Result<Vec<u8>, ForgeError> {
    let mut entries = split_entries(kind.what(), img, kind, &Limits::default())?
        .into_iter()
        .map(M::decode)
        .collect::<Result<Vec<M>, _>>()?;
    edit(&mut entries)?;
    Ok(image_of(kind, &entries))
}

/// [`edit_core`] of the thread's credentials (created empty when the core has none).
pub fn edit_creds(
    core_img: &[u8],
    edit: impl FnOnce(&mut CredsEntry),
) -> Result<Vec<u8>, ForgeError> {
    edit_core(core_img, |t| {
        edit(t.creds.get_or_insert_with(Default::default))
    })
}

/// The credentials of a container process as runc leaves them: `uid`/`gid` everywhere,
/// `caps` in the permitted, effective and bounding sets, no_new_privs set.
pub fn creds(uid: u32, gid: u32, caps: u64) -> CredsEntry {
    CredsEntry {
        uid,
        gid,
        euid: uid,
        egid: gid,
        suid: uid,
        sgid: gid,
        fsuid: uid,
        fsgid: gid,
        cap_inh: cap_words(0),
        cap_prm: cap_words(caps),
        cap_eff: cap_words(caps),
        cap_bnd: cap_words(caps),
        secbits: 0,
        groups: vec![],
        lsm_profile: None,
        lsm_sockcreate: None,
        apparmor_data: None,
        no_new_privs: Some(1),
        cap_amb: cap_words(0),
    }
}

/// Classic BPF instructions (`code`, `jt`, `jf`, `k`) as `seccomp.img` holds a filter
/// (`struct sock_filter` array, native endianness).
pub fn bpf(insns: &[(u16, u8, u8, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(insns.len() * 8);
    for (code, jt, jf, k) in insns {
        out.extend(code.to_ne_bytes());
        out.extend([*jt, *jf]);
        out.extend(k.to_ne_bytes());
    }
    out
}

/// `SECCOMP_RET_ALLOW` for every call: the filter a forger would put in place of the spec's.
pub fn allow_all_filter() -> Vec<u8> {
    bpf(&[(0x06, 0, 0, 0x7fff_0000)])
}
