//! `gpusnap checkpoint sign|verify`: the checkpoint's own signature
//! (`gpusnap-manifest.json.sig`, cosign `sign-blob` format, see
//! `gpusnap_checkpoint::signature`), on a checkpoint directory or a CRI/Podman checkpoint
//! archive.
//!
//! Both say what the signature covers: the CRIU images and GPU state through the manifest's
//! digests, and — when this gpusnap's seal recorded them in the manifest — the container's
//! spec and writable layer, which a node with `restore.signature_policy = require` needs
//! covered. A checkpoint sealed before they were recorded is signed all the same, with a
//! warning that such nodes refuse it (its writable layer cannot be described from an archive's
//! `rootfs-diff.tar` alone: that takes the image below it).
//!
//! An archive is rewritten whole: a new archive (same compression) is written to a temporary
//! file beside it, created exclusively in the archive's own directory, synced, and renamed over
//! the old one within that directory, so a failure or an interruption leaves the old archive as
//! it was. Its content is untrusted: the manifest is read capped, and an archive holding it
//! twice (which copy would a runtime unpack?) is refused.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, Subcommand};
use gpusnap_checkpoint::layout::{
    self, MANIFEST_FILE, MANIFEST_MAX_BYTES, SIGNATURE_FILE, SIGNATURE_MAX_BYTES,
};
use gpusnap_checkpoint::signature::{
    self as dirsig, DirSignature, KeyAccess, SigningKey, TrustedKey,
};
use rustix::fs::{Mode, OFlags};

use crate::inspect::{Compression, ARCHIVE_CHECKPOINT_DIR};

#[derive(Subcommand)]
pub enum CheckpointCommand {
    /// Sign a checkpoint's manifest (a checkpoint directory, or a CRI or Podman checkpoint
    /// archive, rewritten in place) so nodes with restore.signature_policy = "require" restore
    /// it. Writes gpusnap-manifest.json.sig, as `cosign sign-blob --key KEY` would.
    Sign(SignArgs),
    /// Check a checkpoint's signature with trusted public keys.
    Verify(VerifyArgs),
    /// Verify a checkpoint directory under restore.checkpoint_root that this node did not
    /// seal (manifest, every file's digest, the signature policy) and record it as this
    /// node's, so that the pod annotation gpusnap.io/restore-from restores it. Root only.
    Adopt(crate::adopt::AdoptArgs),
}

#[derive(Args)]
pub struct SignArgs {
    /// Checkpoint directory, a directory with the archive layout (checkpoint/ inside), or a
    /// checkpoint archive (tar, gzip or zstd).
    pub path: PathBuf,
    /// Private key: PKCS#8 PEM (ECDSA P-256), or cosign's encrypted cosign.key (password in
    /// $COSIGN_PASSWORD).
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
}

#[derive(Args)]
pub struct VerifyArgs {
    /// Checkpoint directory, a directory with the archive layout (checkpoint/ inside), or a
    /// checkpoint archive (tar, gzip or zstd).
    pub path: PathBuf,
    /// Trusted public key (PEM); repeatable. Default: restore.signature_keys of the config.
    #[arg(long, value_name = "PUB")]
    pub key: Vec<PathBuf>,
}

pub fn run(config: &Path, cmd: CheckpointCommand) -> Result<u8> {
    match cmd {
        CheckpointCommand::Sign(a) => sign(a),
        CheckpointCommand::Verify(a) => verify(config, a),
        CheckpointCommand::Adopt(a) => crate::adopt::adopt(config, a),
    }
}

/// What PATH is: a checkpoint directory (the one holding the manifest), or an archive.
enum Target {
    Dir(PathBuf),
    Archive(PathBuf),
}

fn target(path: &Path) -> Result<Target> {
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_file() {
        return Ok(Target::Archive(path.to_path_buf()));
    }
    if !meta.is_dir() {
        bail!(
            "{} is neither a checkpoint directory nor a checkpoint archive (a symlink is not \
             followed)",
            path.display()
        );
    }
    let root = gpusnap_checkpoint::beneath::open_root(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let has_manifest =
        |rel: &Path| gpusnap_checkpoint::beneath::open_file(root.as_fd(), rel).is_ok();
    if has_manifest(Path::new(MANIFEST_FILE)) {
        Ok(Target::Dir(path.to_path_buf()))
    } else if has_manifest(&Path::new(ARCHIVE_CHECKPOINT_DIR).join(MANIFEST_FILE)) {
        Ok(Target::Dir(path.join(ARCHIVE_CHECKPOINT_DIR)))
    } else {
        bail!(
            "{} holds no {MANIFEST_FILE} (nor {ARCHIVE_CHECKPOINT_DIR}/{MANIFEST_FILE}): not a \
             gpusnap checkpoint — only checkpoints gpusnap sealed can be signed",
            path.display()
        )
    }
}

/// What a signature of these manifest bytes covers, in words, and whether that is everything a
/// node requiring signatures needs.
fn covers(manifest: &[u8]) -> (String, bool) {
    use gpusnap_checkpoint::writable_layer::WritableLayerRecord;
    let m: gpusnap_checkpoint::Manifest = match serde_json::from_slice(manifest) {
        Ok(m) => m,
        Err(e) => return (format!("unknown: the manifest cannot be read ({e})"), false),
    };
    let images = format!(
        "the CRIU images and GPU state ({} files)",
        m.images.files.len()
    );
    match m.covered_container() {
        Ok(r) => {
            let layer = match &r.writable_layer {
                WritableLayerRecord::Overlay {
                    entries,
                    content_bytes,
                    ..
                } => format!("{entries} entries, {content_bytes} bytes of content"),
                WritableLayerRecord::Unavailable { reason } => reason.clone(),
            };
            (
                format!("{images}, the container's spec and its writable layer ({layer})"),
                true,
            )
        }
        Err(why) => (format!("{images} only: {why}"), false),
    }
}

fn print_covers(manifest: &[u8]) {
    let (what, whole) = covers(manifest);
    println!("Covers     {what}");
    if !whole {
        eprintln!(
            "gpusnap: warning: nodes with restore.signature_policy = require refuse this \
             checkpoint: its signature does not cover everything that shapes the restored \
             container"
        );
    }
}

fn sign(a: SignArgs) -> Result<u8> {
    let key = SigningKey::load(&a.key, KeyAccess::Any)?;
    match target(&a.path)? {
        Target::Dir(dir) => {
            key.sign_dir(&dir)?;
            let root = gpusnap_checkpoint::beneath::open_root(&dir)
                .with_context(|| format!("opening {}", dir.display()))?;
            let manifest = dirsig::read_manifest_bytes(root.as_fd(), &dir)?;
            println!(
                "Signed     {}\nSignature  {}\nKey        {}",
                dir.join(MANIFEST_FILE).display(),
                dir.join(SIGNATURE_FILE).display(),
                a.key.display()
            );
            print_covers(&manifest);
        }
        Target::Archive(archive) => {
            let manifest = sign_archive(&archive, &key)?;
            println!(
                "Signed     {}!/{ARCHIVE_CHECKPOINT_DIR}/{MANIFEST_FILE}\nSignature  \
                 {}!/{ARCHIVE_CHECKPOINT_DIR}/{SIGNATURE_FILE}\nKey        {}",
                archive.display(),
                archive.display(),
                a.key.display()
            );
            print_covers(&manifest);
        }
    }
    Ok(0)
}

fn verify(config: &Path, a: VerifyArgs) -> Result<u8> {
    let paths = if a.key.is_empty() {
        gpusnap_config::Config::load(config)?.restore.signature_keys
    } else {
        a.key
    };
    if paths.is_empty() {
        bail!(
            "no trusted keys: pass --key PUB or set restore.signature_keys in {}",
            config.display()
        );
    }
    let keys = paths
        .iter()
        .map(|p| TrustedKey::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    let (shown, verdict, manifest) = match target(&a.path)? {
        Target::Dir(dir) => {
            let checked = dirsig::check_dir(&dir, &keys)?;
            (
                dir.display().to_string(),
                checked.signature,
                checked.manifest,
            )
        }
        Target::Archive(archive) => {
            let file = open_archive(&archive)?.1;
            let (_, found) = scan(&file, &archive)?;
            let verdict = match found.signature {
                None => DirSignature::Missing,
                Some(sig) => match keys.iter().find(|k| k.verifies(&sig, &found.manifest)) {
                    Some(k) => DirSignature::Verified {
                        key: k.path().to_path_buf(),
                    },
                    None => DirSignature::Invalid {
                        reason: "not a signature of this manifest by any trusted key".into(),
                    },
                },
            };
            (
                format!("{}!/{ARCHIVE_CHECKPOINT_DIR}", archive.display()),
                verdict,
                found.manifest,
            )
        }
    };
    match verdict {
        DirSignature::Verified { key } => {
            println!("Verified   {shown}\nKey        {}", key.display());
            print_covers(&manifest);
            Ok(0)
        }
        DirSignature::Missing => {
            eprintln!("gpusnap: {shown} is not signed ({SIGNATURE_FILE} is missing)");
            Ok(1)
        }
        DirSignature::Invalid { reason } => {
            eprintln!("gpusnap: {shown}: {reason}");
            Ok(1)
        }
    }
}

/// The archive opened without following a symlink, and its directory (where the new archive
/// is written and renamed).
fn open_archive(archive: &Path) -> Result<(OwnedFd, File, String)> {
    let name = archive
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{}: not a file name", archive.display()))?
        .to_owned();
    let parent = match archive.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = gpusnap_checkpoint::beneath::open_root(parent)
        .with_context(|| format!("opening {}", parent.display()))?;
    let file = gpusnap_checkpoint::beneath::open_file(dir.as_fd(), Path::new(&name))
        .with_context(|| format!("opening {} (a symlink is not followed)", archive.display()))?;
    Ok((dir, file, name))
}

/// What one pass over the archive found.
struct Found {
    manifest: Vec<u8>,
    signature: Option<Vec<u8>>,
}

fn manifest_entry() -> PathBuf {
    Path::new(ARCHIVE_CHECKPOINT_DIR).join(MANIFEST_FILE)
}

fn signature_entry() -> PathBuf {
    Path::new(ARCHIVE_CHECKPOINT_DIR).join(SIGNATURE_FILE)
}

fn normalise(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect()
}

/// The decompressed tar stream of `file`, from its start.
fn tar_stream(file: &File) -> io::Result<(Compression, Box<dyn Read + '_>)> {
    let mut f = file;
    f.rewind()?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic)?;
    f.rewind()?;
    let compression = Compression::sniff(&magic[..n]);
    let reader = BufReader::new(f);
    let stream: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(reader)?),
    };
    Ok((compression, stream))
}

/// An archive member's bytes, up to `cap` ([`layout::read_capped_from`]).
fn read_capped<R: Read>(entry: &mut tar::Entry<'_, R>, cap: u64, what: &str) -> Result<Vec<u8>> {
    let size = entry.size();
    layout::read_capped_from(entry, what, size, cap)
        .with_context(|| format!("{what}: not what gpusnap writes"))
}

/// One pass: the manifest (exactly once) and the signature, if any.
fn scan(file: &File, archive: &Path) -> Result<(Compression, Found)> {
    let (compression, stream) =
        tar_stream(file).with_context(|| format!("reading {}", archive.display()))?;
    let mut tar = tar::Archive::new(stream);
    let (mut manifest, mut signature) = (None, None);
    for entry in tar.entries()? {
        let mut entry = entry.with_context(|| format!("reading {}", archive.display()))?;
        let path = normalise(&entry.path()?);
        let slot = if path == manifest_entry() {
            &mut manifest
        } else if path == signature_entry() {
            &mut signature
        } else {
            continue;
        };
        if slot.is_some() {
            bail!(
                "{} holds {} twice: a runtime would unpack either; refusing to sign it",
                archive.display(),
                path.display()
            );
        }
        if !entry.header().entry_type().is_file() {
            bail!(
                "{}: {} is not a regular file",
                archive.display(),
                path.display()
            );
        }
        let cap = if path == manifest_entry() {
            MANIFEST_MAX_BYTES
        } else {
            SIGNATURE_MAX_BYTES
        };
        *slot = Some(read_capped(&mut entry, cap, &path.display().to_string())?);
    }
    let manifest = manifest.ok_or_else(|| {
        anyhow!(
            "{} holds no {}: not a gpusnap checkpoint archive (only checkpoints gpusnap sealed \
             can be signed)",
            archive.display(),
            manifest_entry().display()
        )
    })?;
    Ok((
        compression,
        Found {
            manifest,
            signature,
        },
    ))
}

/// Signs the manifest inside `archive` and rewrites it with the signature beside the manifest.
/// Signs the manifest inside `archive`, rewriting it; returns the manifest's bytes.
pub fn sign_archive(archive: &Path, key: &SigningKey) -> Result<Vec<u8>> {
    let (dir, file, name) = open_archive(archive)?;
    let (compression, found) = scan(&file, archive)?;
    let signature = key.sign(&found.manifest)?;
    let tmp_name = format!(".{name}.gpusnap-sign.{}", std::process::id());
    let tmp = archive.with_file_name(&tmp_name);
    let out = rustix::fs::openat(
        dir.as_fd(),
        tmp_name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(io::Error::from)
    .with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> Result<()> {
        let out = File::from(out);
        let mode = file.metadata()?.permissions();
        rewrite(
            &file,
            archive,
            &out,
            compression,
            &found.manifest,
            &signature,
        )?;
        out.set_permissions(mode)?;
        out.sync_all()?;
        rustix::fs::renameat(dir.as_fd(), tmp_name.as_str(), dir.as_fd(), name.as_str())
            .map_err(io::Error::from)
            .with_context(|| format!("renaming {} to {}", tmp.display(), archive.display()))?;
        rustix::fs::fsync(dir.as_fd()).map_err(io::Error::from)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir.as_fd(), tmp_name.as_str(), rustix::fs::AtFlags::empty());
    }
    written.map(|()| found.manifest)
}

/// Copies every entry of `file` into `out` (same compression) except an old signature, then
/// appends the new one. The manifest copied must be the one that was signed.
fn rewrite(
    file: &File,
    archive: &Path,
    out: &File,
    compression: Compression,
    signed: &[u8],
    signature: &str,
) -> Result<()> {
    let sink = BufWriter::new(out);
    match compression {
        Compression::None => {
            let mut b = tar::Builder::new(sink);
            copy_entries(&mut b, file, archive, signed, signature)?;
            b.into_inner()?.flush()?;
        }
        Compression::Gzip => {
            let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
                sink,
                flate2::Compression::default(),
            ));
            copy_entries(&mut b, file, archive, signed, signature)?;
            b.into_inner()?.finish()?.flush()?;
        }
        Compression::Zstd => {
            let mut b = tar::Builder::new(zstd::stream::write::Encoder::new(sink, 3)?);
            copy_entries(&mut b, file, archive, signed, signature)?;
            b.into_inner()?.finish()?.flush()?;
        }
    }
    Ok(())
}

fn copy_entries<W: Write>(
    builder: &mut tar::Builder<W>,
    file: &File,
    archive: &Path,
    signed: &[u8],
    signature: &str,
) -> Result<()> {
    builder.mode(tar::HeaderMode::Complete);
    let (_, stream) = tar_stream(file)?;
    let mut tar = tar::Archive::new(stream);
    for entry in tar.entries()? {
        let mut entry = entry.with_context(|| format!("reading {}", archive.display()))?;
        let path = entry.path()?.into_owned();
        let normal = normalise(&path);
        if normal == signature_entry() {
            continue;
        }
        let mut header = entry.header().clone();
        if normal == manifest_entry() {
            let bytes = read_capped(&mut entry, MANIFEST_MAX_BYTES, "the manifest")?;
            if bytes != signed {
                bail!(
                    "{} changed while it was being signed; sign it again",
                    archive.display()
                );
            }
            builder.append_data(&mut header, &path, &bytes[..])?;
            continue;
        }
        match header.entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| anyhow!("{}: link without a target", path.display()))?
                    .into_owned();
                builder.append_link(&mut header, &path, target)?;
            }
            _ => builder.append_data(&mut header, &path, &mut entry)?,
        }
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o600);
    header.set_size(signature.len() as u64);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    builder.append_data(&mut header, signature_entry(), signature.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keypair(d: &Path) -> (PathBuf, PathBuf) {
        let (k, p) = (d.join("k.key"), d.join("k.pub"));
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            k.to_str().unwrap(),
        ]);
        run(&[
            "pkey",
            "-in",
            k.to_str().unwrap(),
            "-pubout",
            "-out",
            p.to_str().unwrap(),
        ]);
        (k, p)
    }

    fn archive(path: &Path, entries: &[(&str, &[u8])], compression: Compression) {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            b.append_data(&mut h, name, *data).unwrap();
        }
        let raw = b.into_inner().unwrap();
        let bytes = match compression {
            Compression::None => raw,
            Compression::Zstd => zstd::encode_all(&raw[..], 3).unwrap(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&raw).unwrap();
                e.finish().unwrap()
            }
        };
        std::fs::write(path, bytes).unwrap();
    }

    fn entries(path: &Path) -> Vec<(String, Vec<u8>)> {
        let file = File::open(path).unwrap();
        let (_, stream) = tar_stream(&file).unwrap();
        let mut tar = tar::Archive::new(stream);
        tar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let p = e.path().unwrap().display().to_string();
                let mut d = Vec::new();
                e.read_to_end(&mut d).unwrap();
                (p, d)
            })
            .collect()
    }

    #[test]
    fn archives_are_signed_in_place_in_their_compression() {
        let t = tempfile::tempdir().unwrap();
        let (k, p) = keypair(t.path());
        let key = SigningKey::load(&k, KeyAccess::Any).unwrap();
        let trusted = TrustedKey::load(&p).unwrap();
        for c in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let a = t.path().join("ck.tar");
            archive(
                &a,
                &[
                    ("config.dump", b"{}"),
                    ("checkpoint/pages-1.img", b"pages"),
                    ("checkpoint/gpusnap-manifest.json", b"{\"m\":1}"),
                    ("checkpoint/gpusnap-manifest.json.sig", b"stale"),
                    ("rootfs-diff.tar", b"diff"),
                ],
                c,
            );
            sign_archive(&a, &key).unwrap();
            let mut magic = [0u8; 4];
            File::open(&a).unwrap().read_exact(&mut magic).unwrap();
            assert_eq!(Compression::sniff(&magic), c, "same compression");
            let got = entries(&a);
            let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(
                names,
                [
                    "config.dump",
                    "checkpoint/pages-1.img",
                    "checkpoint/gpusnap-manifest.json",
                    "rootfs-diff.tar",
                    "checkpoint/gpusnap-manifest.json.sig"
                ],
                "the stale signature replaced, everything else kept in order"
            );
            assert_eq!(got[1].1, b"pages");
            assert!(trusted.verifies(&got[4].1, b"{\"m\":1}"));
            let leftovers: Vec<_> = std::fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n.to_string_lossy().contains("gpusnap-sign"))
                .collect();
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }

    #[test]
    fn hostile_archives_are_refused_and_left_as_they_were() {
        let t = tempfile::tempdir().unwrap();
        let (k, _) = keypair(t.path());
        let key = SigningKey::load(&k, KeyAccess::Any).unwrap();
        let a = t.path().join("twice.tar");
        archive(
            &a,
            &[
                ("checkpoint/gpusnap-manifest.json", b"{}"),
                ("./checkpoint/gpusnap-manifest.json", b"{\"other\":1}"),
            ],
            Compression::None,
        );
        let before = std::fs::read(&a).unwrap();
        let err = sign_archive(&a, &key).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
        assert_eq!(std::fs::read(&a).unwrap(), before);
        let none = t.path().join("none.tar");
        archive(
            &none,
            &[("checkpoint/pages-1.img", b"x")],
            Compression::None,
        );
        let err = sign_archive(&none, &key).unwrap_err().to_string();
        assert!(err.contains("not a gpusnap checkpoint archive"), "{err}");
        let link = t.path().join("link.tar");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(
            sign_archive(&link, &key).is_err(),
            "a symlink is not followed"
        );
    }
}
