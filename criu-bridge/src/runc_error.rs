//! What a failed runc command says, as far as gpusnap acts on it.
//!
//! runc reports every failure as text (its JSON `--log`, its stderr) and an exit status of 1,
//! so the only way to tell "no such container" from a real failure is the message. That
//! matching lives here once, for every door (the shim, the transaction's cleanup), so the
//! phrases runc versions use are listed and tested in one place.

/// What a runc failure message means to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuncErrorKind {
    /// runc has no container of that id: `container does not exist` (libcontainer's
    /// `ErrNotExist`; older runc: `container "<id>" does not exist`). A delete of it has
    /// nothing left to do.
    ContainerMissing,
    /// Something else runc was pointed at is missing, e.g. the process to run:
    /// `exec: "x": executable file not found in $PATH`.
    NotFound,
    /// Any other failure.
    Other,
}

impl RuncErrorKind {
    /// Whether what was asked for is missing (the container or a file it needs): the caller's
    /// request names something that is not there, rather than runc failing.
    pub fn is_not_found(self) -> bool {
        matches!(
            self,
            RuncErrorKind::ContainerMissing | RuncErrorKind::NotFound
        )
    }
}

/// Classifies the text of a runc failure: the `msg` of runc's last JSON log error, its stderr,
/// or a message that wraps either.
pub fn classify_runc_error(text: &str) -> RuncErrorKind {
    // "does not exist" and the rarer "not exist" (`container not exist` in some wrappers) are
    // both runc's word for a container id it has no state of.
    if text.contains("not exist") {
        RuncErrorKind::ContainerMissing
    } else if text.contains("not found") {
        RuncErrorKind::NotFound
    } else {
        RuncErrorKind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_missing() {
        for said in [
            // runc 1.1 / 1.2 `runc delete|state|kill` of an unknown id.
            "container does not exist",
            // runc 1.0's JSON log entry, as read back by runc_log_error.
            r#"container "ctr-1" does not exist"#,
            // The transaction's wrapped message of a failed delete.
            "runc delete failed (exit status: 1): container does not exist",
            "runc exited with exit status: 1: container does not exist",
            "container not exist",
        ] {
            assert_eq!(
                classify_runc_error(said),
                RuncErrorKind::ContainerMissing,
                "{said}"
            );
            assert!(classify_runc_error(said).is_not_found());
        }
    }

    #[test]
    fn something_else_missing() {
        for said in [
            // runc create/exec when the process's binary is missing.
            r#"runc create failed: unable to start container process: exec: "nosuch": executable file not found in $PATH"#,
            r#"exec failed: unable to start container process: exec: "/bin/x": stat /bin/x: not found"#,
        ] {
            assert_eq!(classify_runc_error(said), RuncErrorKind::NotFound, "{said}");
            assert!(classify_runc_error(said).is_not_found());
        }
    }

    #[test]
    fn other_failures() {
        for said in [
            "container not running",
            "cannot delete container ctr-1 that is not stopped: container is running",
            "container with given ID already exists",
            "criu failed: type RESTORE errno 0\nlog file: /run/restore.log",
            "runc checkpoint failed (exit status: 1): criu failed: type NOTIFY errno 0",
            "(00.012345) Error (criu/cr-restore.c:1507): 1234 killed by signal 9: Killed",
            "",
        ] {
            assert_eq!(classify_runc_error(said), RuncErrorKind::Other, "{said}");
            assert!(!classify_runc_error(said).is_not_found());
        }
    }
}
