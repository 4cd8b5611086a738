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

impl LogTail {
    pub fn is_empty(&self) -> bool {
        self.error_lines.is_empty() && self.last_lines.is_empty()
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
}
