//! `gpusnap checkpoint adopt PATH`: root vouches for a checkpoint directory this node did not
//! seal (copied in, unpacked from an archive, moved from another root), so that
//! `gpusnap.io/restore-from` restores it like one the node sealed.
//!
//! Before anything is recorded, the checkpoint is checked as a restore would check it: the
//! node's signature policy on its directory signature (`restore.signature_policy`; under
//! `require` the signed manifest must record the container's spec and writable layer), then the
//! manifest and every file's digest, the whole tree (no symlink, device or hard link). The
//! record (`gpusnap_checkpoint::node_origin`) holds the manifest's SHA-256 and, for the
//! archive layout, the rootfs diff's, so a checkpoint changed after its adoption is refused.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Args;
use gpusnap_checkpoint::beneath;
use gpusnap_checkpoint::layout::MANIFEST_FILE;
use gpusnap_checkpoint::node_origin::{self, How, NodeRecord, RecordedSignature};
use gpusnap_checkpoint::origin::FileDigest;
use gpusnap_checkpoint::rootfs_diff;
use gpusnap_checkpoint::signature::{self as dirsig, DirSignature, TrustedKey};
use gpusnap_config::{Config, SignaturePolicy};

use crate::inspect::ARCHIVE_CHECKPOINT_DIR;

const ROOTFS_DIFF: &str = "rootfs-diff.tar";

#[derive(Args)]
pub struct AdoptArgs {
    /// The checkpoint directory, directly under restore.checkpoint_root: a checkpoint
    /// directory, or the archive layout (checkpoint/ and rootfs-diff.tar).
    pub path: PathBuf,
}

pub fn adopt(config_path: &Path, a: AdoptArgs) -> Result<u8> {
    let uid = nix::unistd::geteuid();
    if !uid.is_root() {
        bail!(
            "`gpusnap checkpoint adopt` must run as root: it vouches for a checkpoint that pods \
             then restore as root (uid {} may not)",
            uid.as_raw()
        );
    }
    let config = Config::load(config_path)?;
    let root = &config.restore.checkpoint_root;
    let name = node_origin::name_in_root(root, &a.path)
        .with_context(|| format!("looking at {}", a.path.display()))?
        .with_context(|| {
            format!(
                "{} is not a checkpoint directory directly under restore.checkpoint_root ({}): \
                 move it there (`mv`; from another file system `cp -a --reflink=auto`, which \
                 shares the blocks where the file system can) under a name of letters, digits, \
                 '.', '_' and '-', then adopt it there",
                a.path.display(),
                root.display()
            )
        })?;
    let dir = root.join(&name);
    let root_fd =
        beneath::open_root(root).with_context(|| format!("opening {}", root.display()))?;
    let dir_fd = beneath::open_dir(root_fd.as_fd(), Path::new(&name)).with_context(|| {
        format!(
            "{} must be a plain directory (not a symlink)",
            dir.display()
        )
    })?;
    let archive = beneath::open_dir(dir_fd.as_fd(), Path::new(ARCHIVE_CHECKPOINT_DIR)).ok();
    let ck = match archive {
        Some(_) => dir.join(ARCHIVE_CHECKPOINT_DIR),
        None => dir.clone(),
    };
    let ck_fd = archive.as_ref().map_or(dir_fd.as_fd(), |fd| fd.as_fd());
    let manifest_sha256 = node_origin::manifest_sha256_at(ck_fd).with_context(|| {
        format!(
            "{} cannot be read: not a complete gpusnap checkpoint",
            ck.join(MANIFEST_FILE).display()
        )
    })?;

    let signature = signature_policy(&config, &ck)?;
    let manifest = gpusnap_checkpoint::validate_for_restore(&ck)
        .with_context(|| format!("{} is not restorable as it is", ck.display()))?;
    let rootfs_diff = match &archive {
        Some(_) => rootfs_diff_of(&config, dir_fd.as_fd(), &dir)?,
        None => None,
    };
    // The validation above read the manifest again: it must be the one recorded.
    ensure!(
        node_origin::manifest_sha256_at(ck_fd)? == manifest_sha256,
        "{} changed while it was being adopted; adopt it again once nothing writes to it",
        ck.display()
    );

    let mut record = NodeRecord::new(
        &name,
        manifest_sha256,
        How::Adopted { uid: uid.as_raw() },
        signature,
    );
    record.rootfs_diff = rootfs_diff;
    let at = node_origin::record(root, &record)?;
    println!(
        "Adopted    {}\nContainer  {}\nManifest   sha256:{}\nSignature  {}\nRecord     {}\n\
         Restore it with the pod annotation gpusnap.io/restore-from: {name}",
        dir.display(),
        manifest.container_id,
        record.manifest_sha256,
        shown(&record.signature),
        at.display()
    );
    Ok(0)
}

/// The node's `restore.signature_policy` on the directory signature, as a restore decides it.
fn signature_policy(config: &Config, ck: &Path) -> Result<RecordedSignature> {
    let policy = config.restore.signature_policy;
    if policy == SignaturePolicy::Off {
        return Ok(RecordedSignature::NotChecked);
    }
    let keys = config
        .restore
        .signature_keys
        .iter()
        .map(|p| TrustedKey::load(p))
        .collect::<Result<Vec<_>, _>>()
        .context("restore.signature_keys")?;
    ensure!(
        !keys.is_empty(),
        "restore.signature_policy = {policy} needs restore.signature_keys"
    );
    let checked = dirsig::check_dir(ck, &keys)?;
    let reason = match checked.signature {
        DirSignature::Verified { key } => {
            // As a restore decides it: the signature must cover everything that shapes the
            // restored container (the spec and writable layer the seal recorded).
            let covered = serde_json::from_slice::<gpusnap_checkpoint::Manifest>(&checked.manifest)
                .map_err(|e| format!("its manifest cannot be read ({e})"))
                .and_then(|m| m.covered_container().map(|_| ()).map_err(|e| e.to_string()));
            match covered {
                Ok(()) => {}
                Err(why) if policy == SignaturePolicy::Require => bail!(
                    "not adopted: {} is signed by {}, but this node requires the signature to \
                     cover everything that shapes the restored container \
                     (restore.signature_policy = require), and {why}",
                    ck.display(),
                    key.display()
                ),
                Err(why) => eprintln!(
                    "warning: the checkpoint's signature covers only its CRIU images: {why}"
                ),
            }
            return Ok(RecordedSignature::Verified {
                key: key.display().to_string(),
            });
        }
        DirSignature::Missing => format!(
            "{} is missing (the checkpoint was not signed)",
            ck.join(gpusnap_checkpoint::layout::SIGNATURE_FILE)
                .display()
        ),
        DirSignature::Invalid { reason } => reason,
    };
    if policy == SignaturePolicy::Require {
        bail!(
            "not adopted: this node requires a signature by a trusted key \
             (restore.signature_policy = require), and {reason}; sign it with \
             `gpusnap checkpoint sign {} --key KEY`",
            ck.display()
        );
    }
    eprintln!("warning: adopting a checkpoint without a verified signature: {reason}");
    Ok(RecordedSignature::Missing { reason })
}

/// The archive layout's rootfs diff, when it has one: its SHA-256 and the content it holds
/// (counted now, as a pull counts it), which the restore holds it to.
fn rootfs_diff_of(
    config: &Config,
    dir: std::os::fd::BorrowedFd<'_>,
    shown: &Path,
) -> Result<Option<FileDigest>> {
    let path = shown.join(ROOTFS_DIFF);
    let open = || beneath::open_file(dir, Path::new(ROOTFS_DIFF));
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{} cannot be used", path.display())),
        Ok(_) => {}
    }
    let size = open()?.metadata()?.len();
    let sha256 = rootfs_diff::sha256_of(open()?)?;
    let content = rootfs_diff::content_bytes(open()?, &path, config.restore.max_rootfs_diff_bytes)?;
    Ok(Some(FileDigest {
        size,
        sha256,
        content_bytes: Some(content),
    }))
}

fn shown(s: &RecordedSignature) -> String {
    match s {
        RecordedSignature::Verified { key } => format!("verified with {key}"),
        RecordedSignature::Signed { key } => format!("signed with {key}"),
        RecordedSignature::NotChecked => "not checked (restore.signature_policy = off)".into(),
        RecordedSignature::Missing { reason } => format!("none verified: {reason}"),
    }
}
