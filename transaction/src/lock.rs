//! One transaction per checkpoint directory at a time, across processes.
//!
//! A checkpoint takes an exclusive `flock` on the directory it writes, a restore a shared one on
//! the directory it reads: a second checkpoint into the same directory (from this shim, another
//! shim, or gpusnap-runc) is refused instead of scrubbing the first one's images mid-dump, and
//! a checkpoint cannot scrub a directory a restore is reading.

use std::fs::File;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// Held until dropped.
#[derive(Debug)]
pub struct DirLock {
    _lock: Flock<File>,
}

impl DirLock {
    /// An exclusive lock on `dir` (which must exist), or a Busy refusal.
    pub fn exclusive(dir: &Path) -> Result<DirLock> {
        Self::take(dir, FlockArg::LockExclusiveNonblock, "write")
    }

    /// An exclusive lock on `dir` (which must exist), waiting while another holder has it:
    /// for a step that must come after a running one rather than be refused
    /// (gpusnap-runc's `resume` of a container being checkpointed).
    pub fn exclusive_waiting(dir: &Path) -> Result<DirLock> {
        Self::take(dir, FlockArg::LockExclusive, "write")
    }

    /// A shared lock on `dir` (which must exist), or a Busy refusal.
    pub fn shared(dir: &Path) -> Result<DirLock> {
        Self::take(dir, FlockArg::LockSharedNonblock, "read")
    }

    fn take(dir: &Path, arg: FlockArg, verb: &str) -> Result<DirLock> {
        let file = File::open(dir)
            .map_err(|e| Error::precondition(format!("cannot open {}: {e}", dir.display())))?;
        match Flock::lock(file, arg) {
            Ok(lock) => Ok(DirLock { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(Error::busy(format!(
                "another checkpoint or restore is using {}; nothing was done — wait for it to \
                 finish, or {verb} another directory",
                dir.display()
            ))),
            Err((_, e)) => Err(Error::precondition(format!(
                "cannot lock {}: {e}",
                dir.display()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Refusal;

    /// A waiting writer gets the lock once the holder lets go, not before.
    #[test]
    fn a_waiting_writer_comes_after_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let first = DirLock::exclusive(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let second = DirLock::exclusive_waiting(&path).unwrap();
            tx.send(()).unwrap();
            drop(second);
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the waiting writer did not wait"
        );
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the waiting writer got the lock once the holder let go");
        waiter.join().unwrap();
    }

    #[test]
    fn second_writer_and_readers_of_a_written_dir_are_busy() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::exclusive(dir.path()).unwrap();
        for e in [
            DirLock::exclusive(dir.path()).unwrap_err(),
            DirLock::shared(dir.path()).unwrap_err(),
        ] {
            assert!(
                matches!(
                    e,
                    Error::Refused {
                        reason: Refusal::Busy,
                        ..
                    }
                ),
                "{e}"
            );
        }
        drop(first);
        let r1 = DirLock::shared(dir.path()).unwrap();
        let _r2 = DirLock::shared(dir.path()).unwrap();
        assert!(DirLock::exclusive(dir.path()).is_err());
        drop(r1);
    }
}
