//! `flock(2)` locks: held by open file descriptions, so a crashed process's locks go with it and
//! never need cleaning up.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{flock, FlockOperation};

/// Blocks until `file` is locked (`exclusive` or shared), retrying after signals.
pub(crate) fn lock(file: &File, exclusive: bool) -> io::Result<()> {
    let op = if exclusive {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::LockShared
    };
    loop {
        match flock(file.as_fd(), op) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.map_err(Into::into),
        }
    }
}

/// Locks `file` exclusively if nobody else holds it; `Ok(false)` when someone does.
pub(crate) fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
