//! Writing CRIU images: what an attacker with write access to a checkpoint does, for tests.
//!
//! [`image`] frames entries as CRIU does. [`edit_core`] and [`edit_creds`] change the fields
//! of a real `core-<tid>.img` that the check reads and keep every other byte of the entry (the
//! registers, signal state, ... that [`crate::proto`] does not declare), so an edited image is
//! one CRIU would restore as edited.

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
use prost::Message;

use crate::image::{split_entries, ImageError, Kind, Limits, IMG_COMMON_MAGIC};

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

fn malformed(what: &str) -> ForgeError {
    ForgeError::Malformed(what.into())
}
use crate::proto::{CoreEntry, CredsEntry, ThreadCoreEntry};

/// An image file of `kind` holding `entries` (each one encoded message).
pub fn image<B: AsRef<[u8]>>(kind: Kind, entries: &[B]) -> Vec<u8> {
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

/// An image file of `kind` holding `messages`.
pub fn image_of<M: Message>(kind: Kind, messages: &[M]) -> Vec<u8> {
    let encoded: Vec<Vec<u8>> = messages.iter().map(Message::encode_to_vec).collect();
    image(kind, &encoded)
}

/// A capability set as CRIU stores it: 32-bit words, low word first.
pub fn cap_words(mask: u64) -> Vec<u32> {
    vec![mask as u32, (mask >> 32) as u32]
}

/// The raw fields of `message` whose tag is not in `drop`, followed by `append` (already
/// encoded fields). Protobuf readers, CRIU's included, accept fields in any order.
pub fn splice(message: &[u8], drop: &[u32], append: &[u8]) -> Result<Vec<u8>, ForgeError> {
    let mut out = Vec::with_capacity(message.len() + append.len());
    let mut buf = message;
    while buf.has_remaining() {
        let start = message.len() - buf.remaining();
        let (tag, wire) = decode_key(&mut buf)?;
        skip_value(&mut buf, wire)?;
        let end = message.len() - buf.remaining();
        if !drop.contains(&tag) {
            out.extend_from_slice(&message[start..end]);
        }
    }
    out.extend_from_slice(append);
    Ok(out)
}

/// The value bytes of the last length-delimited field `tag` of `message`.
pub fn field_bytes(message: &[u8], tag: u32) -> Result<Option<&[u8]>, ForgeError> {
    let mut found = None;
    let mut buf = message;
    while buf.has_remaining() {
        let (t, wire) = decode_key(&mut buf)?;
        if t == tag && wire == WireType::LengthDelimited {
            let len = decode_varint(&mut buf)? as usize;
            if len > buf.remaining() {
                return Err(malformed("field runs past the message"));
            }
            let start = message.len() - buf.remaining();
            found = Some(&message[start..start + len]);
            buf.advance(len);
        } else {
            skip_value(&mut buf, wire)?;
        }
    }
    Ok(found)
}

fn skip_value(buf: &mut &[u8], wire: WireType) -> Result<(), ForgeError> {
    let n = match wire {
        WireType::Varint => {
            decode_varint(buf)?;
            0
        }
        WireType::SixtyFourBit => 8,
        WireType::ThirtyTwoBit => 4,
        WireType::LengthDelimited => decode_varint(buf)? as usize,
        WireType::StartGroup | WireType::EndGroup => {
            return Err(malformed("groups are not used by CRIU"))
        }
    };
    if n > buf.remaining() {
        return Err(malformed("field runs past the message"));
    }
    buf.advance(n);
    Ok(())
}

fn length_delimited(tag: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(tag, WireType::LengthDelimited, &mut out);
    encode_varint(value.len() as u64, &mut out);
    out.extend_from_slice(value);
    out
}

/// `core_img` (a whole `core-<tid>.img`) with its thread's creds, seccomp mode and filter
/// index changed by `edit`; every other field is kept byte for byte.
pub fn edit_core(
    core_img: &[u8],
    edit: impl FnOnce(&mut ThreadCoreEntry),
) -> Result<Vec<u8>, ForgeError> {
    let entries = split_entries("core image", core_img, Kind::Core, &Limits::default())?;
    let [entry] = entries[..] else {
        return Err(ImageError::NotOne {
            name: "core image".into(),
            found: entries.len(),
        }
        .into());
    };
    let core = CoreEntry::decode(entry)?;
    let mut thread = core.thread_core.unwrap_or_default();
    edit(&mut thread);
    let old_thread = field_bytes(entry, 5)?.unwrap_or(&[]);
    let new_thread = splice(old_thread, &[10, 11, 12], &thread.encode_to_vec())?;
    let new_entry = splice(entry, &[5], &length_delimited(5, &new_thread))?;
    Ok(image(Kind::Core, &[new_entry]))
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
