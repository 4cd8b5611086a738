//! A restore that must be refused before runc runs, the check the untrusted-tree, adversarial
//! and privilege tests share: through `gpusnap-runc` (the door CRI-O and Podman call), and
//! through `ctr containers restore` of a real checkpoint image whose `criu.tar` is altered.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::checkpoint::{container_restore, criu_tar_blob, write_blob};
use crate::privilege::tar_flat_dir;
use crate::{BusyboxContainer, OutputExt, Rig};

/// Runs `gpusnap-runc restore -d --image-path CK --bundle <ctr's bundle> <ctr's id>` and checks
/// it was refused before runc ran: exit 1, exactly one `gpusnap-runc:` line on stderr, naming
/// `cannot restore <id>` and containing `says`; runc knows no such container; CRIU wrote no
/// `restore.log` into the checkpoint. `Err` says what happened instead.
pub fn gpusnap_runc_refuses(
    ctr: &BusyboxContainer,
    ck: &Path,
    says: &str,
    out_dir: &Path,
) -> Result<(), String> {
    let (code, _out, err) = ctr.wrapper(
        &[
            "restore",
            "-d",
            "--image-path",
            ck.to_str().expect("UTF-8 checkpoint path"),
            "--bundle",
            ctr.bundle.to_str().expect("UTF-8 bundle path"),
            &ctr.id,
        ],
        &[],
        out_dir,
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gpusnap-runc:"))
        .collect();
    let refused = code == 1
        && lines.len() == 1
        && lines[0].contains(says)
        && lines[0].contains(&format!("cannot restore {}", ctr.id))
        && ctr.status().is_none()
        && !ck.join("restore.log").exists();
    if refused {
        Ok(())
    } else {
        Err(format!(
            "exit {code}, runc state {:?}, stderr {err:?}",
            ctr.status()
        ))
    }
}

/// A `gpusnap-runc` refusal as CRI-O and Podman see it: exit code 1 and exactly one
/// `gpusnap-runc:` line on stderr, which names `says`.
pub fn one_refusal_line(code: i32, err: &str, says: &str) -> Result<()> {
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gpusnap-runc:"))
        .collect();
    anyhow::ensure!(
        code == 1 && lines.len() == 1 && lines[0].contains(says),
        "want exit 1 and one `gpusnap-runc:` line naming {says:?}; got exit {code}, stderr {err:?}"
    );
    Ok(())
}

/// The `criu.tar` of a `ctr containers checkpoint` image in the rig's content store, to be
/// altered for one restore at a time and put back afterwards.
pub struct CriuTar<'a> {
    rig: &'a Rig,
    image: String,
    blob: PathBuf,
    pristine: Vec<u8>,
}

/// What a `ctr containers restore --live` of an altered checkpoint did.
pub struct CtrRestore {
    pub succeeded: bool,
    /// A task of the restored container has a pid.
    pub running: bool,
    pub stderr: String,
}

impl CtrRestore {
    /// `Ok` if the restore failed, left nothing running and its error contains `says`;
    /// otherwise what happened instead.
    pub fn refused_saying(&self, says: &str) -> Result<(), String> {
        if self.succeeded || self.running || !self.stderr.contains(says) {
            Err(format!(
                "success={} running={} stderr={:?}",
                self.succeeded, self.running, self.stderr
            ))
        } else {
            Ok(())
        }
    }
}

impl<'a> CriuTar<'a> {
    /// `image`'s `criu.tar` as it is now.
    pub fn of(rig: &'a Rig, image: &str) -> Result<CriuTar<'a>> {
        let blob = criu_tar_blob(rig, image)?;
        let pristine = fs::read(&blob)?;
        Ok(CriuTar {
            rig,
            image: image.to_string(),
            blob,
            pristine,
        })
    }

    /// The pristine `criu.tar` unpacked, changed by `alter` and written back as a flat tar;
    /// then `ctr containers restore --live` of the image as container `id`, which is deleted
    /// again afterwards. The altered tar stays until the next call or [`CriuTar::put_back`].
    pub fn restore_altered(
        &self,
        id: &str,
        alter: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<CtrRestore> {
        let dir = tempfile::tempdir()?;
        tar::Archive::new(&self.pristine[..]).unpack(dir.path())?;
        alter(dir.path())?;
        write_blob(&self.blob, &tar_flat_dir(dir.path())?)?;
        let out = container_restore(self.rig, id, &self.image, false, true)?;
        let restore = CtrRestore {
            succeeded: out.status.success(),
            running: self.rig.task(id)?.is_some_and(|t| t.pid != 0),
            stderr: out.stderr_str().to_string(),
        };
        let _ = self.rig.ctr(&["tasks", "delete", "--force", id]);
        let _ = self.rig.ctr(&["containers", "delete", id]);
        Ok(restore)
    }

    /// The pristine `criu.tar`.
    pub fn pristine(&self) -> &[u8] {
        &self.pristine
    }

    /// Writes the pristine `criu.tar` back.
    pub fn put_back(&self) -> Result<()> {
        write_blob(&self.blob, &self.pristine)
    }
}
