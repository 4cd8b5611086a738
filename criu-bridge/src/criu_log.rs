//! Extracting the useful part of CRIU's `dump.log` / `restore.log`.
//!
//! runc runs CRIU at log level 4, so a failed dump of a large process can leave a log of many
//! megabytes where the cause is one `Error (criu/...)` line well before the end. We stream the
//! file once and keep two bounded windows: the last error lines and the last lines overall.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Name of CRIU's dump log inside the work directory.
pub const DUMP_LOG: &str = "dump.log";
/// Name of CRIU's restore log inside the work directory.
pub const RESTORE_LOG: &str = "restore.log";

/// The interesting lines of a CRIU log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogTail {
    pub path: PathBuf,
    /// Up to `n` last lines that look like errors, oldest first.
    pub error_lines: Vec<String>,
    /// The last `n` lines of the file, oldest first.
    pub last_lines: Vec<String>,
}

/// What CRIU's restore log says last when a restore succeeded (`criu/cr-restore.c`:
/// `Restore finished successfully. Tasks resumed.`); runc logs at level 4, where it is printed.
const RESTORE_FINISHED: &str = "Restore finished successfully";

impl LogTail {
    pub fn is_empty(&self) -> bool {
        self.error_lines.is_empty() && self.last_lines.is_empty()
    }

    /// Whether these last lines of a restore log say the restore finished: CRIU got the
    /// tasks running, whatever runc did after.
    pub fn says_restore_finished(&self) -> bool {
        self.last_lines.iter().any(|l| l.contains(RESTORE_FINISHED))
    }
}

impl fmt::Display for LogTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.error_lines.is_empty() {
            writeln!(f, "last lines of {}:", self.path.display())?;
            for l in &self.last_lines {
                writeln!(f, "  {l}")?;
            }
        } else {
            writeln!(f, "errors in {}:", self.path.display())?;
            for l in &self.error_lines {
                writeln!(f, "  {l}")?;
            }
            // The last lines add context only when they are not the error lines again.
            let extra: Vec<&String> = self
                .last_lines
                .iter()
                .filter(|l| !self.error_lines.contains(l))
                .collect();
            if !extra.is_empty() {
                writeln!(f, "last lines:")?;
                for l in extra {
                    writeln!(f, "  {l}")?;
                }
            }
        }
        Ok(())
    }
}

/// True for CRIU error lines, e.g. `(00.012) Error (criu/cr-dump.c:1790): ...` or
/// `... err 2 ...`. Matching whole words keeps `stderr`, `interrupted` or `errno` style
/// substrings inside other words from counting.
fn is_error_line(line: &str) -> bool {
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| matches!(w, "Error" | "ERROR" | "error" | "err"))
}

/// Reads `path` and returns up to `n` error lines and the last `n` lines.
/// Invalid UTF-8 is replaced rather than failing: the log is for humans.
pub fn criu_log_tail(path: &Path, n: usize) -> io::Result<LogTail> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut errors = VecDeque::with_capacity(n);
    let mut last = VecDeque::with_capacity(n);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
        if n == 0 {
            continue;
        }
        if is_error_line(&line) {
            if errors.len() == n {
                errors.pop_front();
            }
            errors.push_back(line.clone());
        }
        if last.len() == n {
            last.pop_front();
        }
        last.push_back(line);
    }
    Ok(LogTail {
        path: path.to_path_buf(),
        error_lines: errors.into(),
        last_lines: last.into(),
    })
}

/// The directories a CRIU 4.2 restore makes in its work directory (its cwd), relative names
/// from `mkdtemp`: the cgroup yard (`criu/cgroup.c` `prepare_cgroup_sfd`: a tmpfs with every
/// cgroup hierarchy mounted below it, in the mount namespace CRIU runs in, the host's) and the
/// mount point of a cgroup hierarchy CRIU opens without `fsopen` (`open_cgroupfs`).
pub const WORK_DIR_YARDS: [&str; 2] = [".criu.cgyard.", ".criu.cgmounts."];

/// The directories a CRIU 4.2 restore makes in `/tmp` of the host's file system (`mkdtemp`):
/// the mount namespace yard (`criu/mount.c` `create_mnt_roots`, made 0777, mounted only in
/// the restored mount namespace), the clean-path bind point (`mount_clean_path`) and the
/// legacy proc mount (`criu/cr-restore.c` `__legacy_mount_proc`).
pub const TMP_YARDS: [&str; 3] = [".criu.mntns.", "cr-tmpfs.", "crtools-proc."];

/// How much of a restore log is searched for yard names: CRIU names them in its first lines.
const YARD_SEARCH_BYTES: u64 = 32 << 20;

/// Whether `name` is one of CRIU's `mkdtemp` names with one of `prefixes`: the prefix and six
/// letters or digits.
pub fn is_yard_name(name: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
    })
}

/// The names in `/tmp` of the [`TMP_YARDS`] the restore whose log is `log` made, as the log
/// names them (`mnt: Will mount 54 @ /tmp/.criu.mntns.5BQNPP/mnt-0000000054 /sys/firmware`).
///
/// The log holds strings from the checkpoint's images too, so a name is taken only when it is
/// the one name of its kind in the log: a forged line naming another restore's yard makes two
/// names, and neither is taken. A missing log names none.
pub fn tmp_yards_named(log: &Path) -> Vec<String> {
    let Ok(file) = File::open(log) else {
        return Vec::new();
    };
    let mut reader = BufReader::new(io::Read::take(file, YARD_SEARCH_BYTES));
    let mut seen: Vec<(usize, Option<String>)> = Vec::new();
    let mut buf = Vec::new();
    while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
        let line = String::from_utf8_lossy(&buf);
        for (at, _) in line.match_indices("/tmp/") {
            let rest = &line[at + "/tmp/".len()..];
            let word: &str = rest
                .split(|c: char| c == '/' || c.is_whitespace())
                .next()
                .unwrap_or_default();
            let Some(kind) = TMP_YARDS.iter().position(|p| is_yard_name(word, &[p])) else {
                continue;
            };
            match seen.iter_mut().find(|(k, _)| *k == kind) {
                None => seen.push((kind, Some(word.to_string()))),
                Some((_, name)) if name.as_deref() != Some(word) => *name = None,
                Some(_) => {}
            }
        }
        buf.clear();
    }
    let mut names: Vec<String> = seen.into_iter().filter_map(|(_, n)| n).collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn log(content: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(content).unwrap();
        f
    }

    const SAMPLE: &str = "\
(00.000010) Version: 4.2.1 (gitid v4.2.1)
(00.000200) Running on host Linux 6.18
(00.001000) Error (criu/tty.c:2023): tty: Found dangling tty with sid 1 pgid 1 (pts) on peer fd 0.
(00.001010) Warn  (criu/cr-dump.c:1290): stderr redirected
(00.001020) interrupted state kept
(00.001100) Error (criu/cr-dump.c:1790): Dumping FAILED.
(00.001200) Unlock network
(00.001300) Unfreezing tasks into 1
";

    #[test]
    fn restore_finished() {
        let ok = log(b"(00.120000) Running post-resume scripts\n\
(00.120100) Restore finished successfully. Tasks resumed.\n\
(00.120200) Writing stats\n");
        assert!(criu_log_tail(ok.path(), 20)
            .unwrap()
            .says_restore_finished());
        let failed = log(b"(00.050000) Error (criu/cr-restore.c:2468): Restoring FAILED.\n");
        assert!(!criu_log_tail(failed.path(), 20)
            .unwrap()
            .says_restore_finished());
        assert!(!criu_log_tail(log(SAMPLE.as_bytes()).path(), 20)
            .unwrap()
            .says_restore_finished());
    }

    #[test]
    fn picks_error_lines_and_last_lines() {
        let f = log(SAMPLE.as_bytes());
        let tail = criu_log_tail(f.path(), 3).unwrap();
        assert_eq!(tail.error_lines.len(), 2);
        assert!(tail.error_lines[0].contains("dangling tty"));
        assert!(tail.error_lines[1].contains("Dumping FAILED"));
        assert_eq!(
            tail.last_lines,
            vec![
                "(00.001100) Error (criu/cr-dump.c:1790): Dumping FAILED.",
                "(00.001200) Unlock network",
                "(00.001300) Unfreezing tasks into 1",
            ]
        );
        let shown = tail.to_string();
        assert!(shown.contains("errors in"), "{shown}");
        assert!(shown.contains("Unfreezing"), "{shown}");
        // The repeated error line is listed once.
        assert_eq!(shown.matches("Dumping FAILED").count(), 1, "{shown}");
    }

    #[test]
    fn word_match_ignores_substrings() {
        assert!(!is_error_line("stderr redirected"));
        assert!(!is_error_line("interrupted"));
        assert!(is_error_line("pie: 1: err 2 on read"));
        assert!(is_error_line("Error (criu/x.c:1): bad"));
    }

    #[test]
    fn keeps_only_the_last_n_errors() {
        let content: String = (0..10).map(|i| format!("Error number {i}\n")).collect();
        let f = log(content.as_bytes());
        let tail = criu_log_tail(f.path(), 2).unwrap();
        assert_eq!(tail.error_lines, vec!["Error number 8", "Error number 9"]);
    }

    #[test]
    fn no_errors_shows_last_lines_and_invalid_utf8_is_tolerated() {
        let f = log(b"one\ntwo\nth\xffree\n");
        let tail = criu_log_tail(f.path(), 2).unwrap();
        assert!(tail.error_lines.is_empty());
        assert_eq!(
            tail.last_lines,
            vec!["two".to_string(), "th\u{fffd}ree".to_string()]
        );
        assert!(tail.to_string().starts_with("last lines of"));
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = criu_log_tail(Path::new("/nonexistent/dump.log"), 5).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn yard_names_are_taken_only_when_unambiguous() {
        let f = log(b"(00.05) cg: Opening .criu.cgyard.kc9X8S as cg yard\n\
            (00.07) mnt: \t\tWill mount 54 @ /tmp/.criu.mntns.5BQNPP/mnt-0000000054 /sys/firmware\n\
            (00.07) mnt: \t\tWill mount 53 @ /tmp/.criu.mntns.5BQNPP/mnt-0000000053 /proc/keys\n\
            (00.08) Mount procfs in /tmp/crtools-proc.Ab12Cd\n\
            (00.09) mnt: /tmp/.criu.mntns.toolong1 /tmp/other\n");
        assert_eq!(
            tmp_yards_named(f.path()),
            [".criu.mntns.5BQNPP", "crtools-proc.Ab12Cd"]
        );
        // A second mount yard name (an image's string forging a line): neither is taken.
        let f = log(
            b"Will mount 1 from /x\nWill mount 1 @ /tmp/.criu.mntns.VICTIM/mnt-1 /\n\
            Will mount 2 @ /tmp/.criu.mntns.5BQNPP/mnt-2 /\n",
        );
        assert!(tmp_yards_named(f.path()).is_empty());
        assert!(tmp_yards_named(Path::new("/nonexistent/restore.log")).is_empty());
        assert!(is_yard_name(".criu.cgyard.kc9X8S", &WORK_DIR_YARDS));
        assert!(!is_yard_name(".criu.cgyard.kc9X8", &WORK_DIR_YARDS));
        assert!(!is_yard_name(".criu.cgyard.kc9X/S", &WORK_DIR_YARDS));
        assert!(!is_yard_name("criu.cgyard.kc9X8S", &WORK_DIR_YARDS));
    }
}
