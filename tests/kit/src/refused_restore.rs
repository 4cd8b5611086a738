//! A restore that must be refused before runc runs, through `gpusnap-runc` (the door CRI-O and
//! Podman call): the check the untrusted-tree and adversarial corpora share.

use std::path::Path;

use crate::BusyboxContainer;

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
