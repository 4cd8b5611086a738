//! A diff read entry by entry under its caps: the decompressed stream counted as it is read
//! (tar headers, extension records, padding and content alike), so that a small gzip file
//! that inflates without end is refused at the cap instead of inflated whole; the entries
//! counted; the extension records of one entry (GNU long names, PAX) bounded, since the tar
//! reader holds them in memory; and the deadline looked at on every read.

use std::cell::Cell;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use super::{DiffError, Limits, Phase};

/// Bytes of extension records (GNU long name and long link, PAX) one entry may carry. Names are
/// at most [`MAX_NAME_BYTES`](super::MAX_NAME_BYTES); PAX records carry extended attributes,
/// whose values Linux caps at 64 KiB each.
pub(super) const MAX_EXTENSION_BYTES: u64 = 1 << 20;

const BLOCK: u64 = 512;

/// Why the meter stopped the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Inflated,
    Extensions,
    Deadline,
}

/// What the stream read so far, and the bounds it is read under. Shared between the reader the
/// tar parser pulls from and the loop that hands out entries.
struct Meter {
    read: Cell<u64>,
    /// Bytes read when the current `next()` began, and how many it may read.
    mark: Cell<u64>,
    allowance: Cell<u64>,
    max_inflated: u64,
    deadline: Option<Instant>,
    stopped: Cell<Option<Stop>>,
}

impl Meter {
    fn charge(&self, n: usize) -> io::Result<()> {
        let read = self.read.get() + n as u64;
        self.read.set(read);
        let stop = if read > self.max_inflated {
            Some(Stop::Inflated)
        } else if read - self.mark.get() > self.allowance.get() {
            Some(Stop::Extensions)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Stop::Deadline)
        } else {
            None
        };
        match stop {
            None => Ok(()),
            Some(s) => {
                self.stopped.set(Some(s));
                Err(io::Error::other("the rootfs diff passed one of its bounds"))
            }
        }
    }
}

/// The decompressed stream, counted.
pub(super) struct Metered<R> {
    inner: R,
    meter: Rc<Meter>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.meter.charge(n)?;
        Ok(n)
    }
}

/// One entry as the loop hands it out.
pub(super) type Entry<'a, 'r> = tar::Entry<'a, Metered<Box<dyn Read + 'r>>>;

/// What a whole pass read.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pass {
    pub entries: u64,
    /// Bytes of file content the headers declare.
    pub content: u64,
    /// Bytes of the decompressed stream.
    pub inflated: u64,
}

/// `raw` (gzip told by its first two bytes, else a plain tar) read entry by entry, each given
/// to `visit`, under `limits`; `diff` names it in errors, `phase` says what the pass is for.
pub(super) fn each_entry<'r>(
    raw: impl Read + 'r,
    diff: &Path,
    limits: &Limits,
    phase: Phase,
    visit: &mut dyn FnMut(&mut Entry<'_, 'r>) -> Result<(), DiffError>,
) -> Result<Pass, DiffError> {
    let unreadable = |source| DiffError::Unreadable {
        diff: diff.to_path_buf(),
        source,
    };
    let mut buffered = BufReader::new(raw);
    let gzip = buffered
        .fill_buf()
        .map_err(unreadable)?
        .starts_with(&[0x1f, 0x8b]);
    let decompressed: Box<dyn Read + 'r> = if gzip {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let meter = Rc::new(Meter {
        read: Cell::new(0),
        mark: Cell::new(0),
        allowance: Cell::new(BLOCK + MAX_EXTENSION_BYTES + 4 * BLOCK),
        max_inflated: limits.max_inflated_bytes,
        deadline: limits.deadline,
        stopped: Cell::new(None),
    });
    let mut archive = tar::Archive::new(Metered {
        inner: decompressed,
        meter: Rc::clone(&meter),
    });
    let mut pass = Pass::default();
    // Why the stream stopped, when the meter stopped it: the tar reader may wrap the error.
    let stopped = |pass: &Pass, e: io::Error| match meter.stopped.get() {
        Some(Stop::Inflated) => DiffError::TooLarge {
            diff: diff.to_path_buf(),
            reason: format!(
                "it inflates to more than {} bytes (tar headers, padding and content; \
                 restore.max_rootfs_diff_bytes)",
                limits.max_inflated_bytes
            ),
        },
        Some(Stop::Extensions) => DiffError::Refused {
            diff: diff.to_path_buf(),
            entry: format!("after entry {}", pass.entries),
            reason: format!(
                "more than {MAX_EXTENSION_BYTES} bytes of long-name or PAX records for one entry"
            ),
        },
        Some(Stop::Deadline) => DiffError::Deadline {
            diff: diff.to_path_buf(),
            phase,
            entries: pass.entries,
        },
        None => unreadable(e),
    };
    let mut entries = archive.entries().map_err(|e| stopped(&pass, e))?;
    loop {
        let next = entries.next();
        let mut entry = match next {
            None => break,
            Some(Err(e)) => return Err(stopped(&pass, e)),
            Some(Ok(entry)) => entry,
        };
        pass.entries += 1;
        if pass.entries > limits.max_entries {
            return Err(DiffError::TooManyEntries {
                diff: diff.to_path_buf(),
                max: limits.max_entries,
            });
        }
        // The bytes the entry holds in the archive: a PAX `size` record overrides the header's.
        let size = entry.size();
        pass.content = pass.content.saturating_add(size);
        if pass.content > limits.max_bytes {
            return Err(DiffError::TooLarge {
                diff: diff.to_path_buf(),
                reason: format!("more than {} bytes of file content", limits.max_bytes),
            });
        }
        // Between the end of this entry's header and the end of the next one's: this entry's
        // content and padding (read or skipped), the next one's extension records, headers.
        meter.mark.set(meter.read.get());
        meter.allowance.set(
            size.div_ceil(BLOCK)
                .saturating_mul(BLOCK)
                .saturating_add(MAX_EXTENSION_BYTES + 4 * BLOCK),
        );
        if limits.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(DiffError::Deadline {
                diff: diff.to_path_buf(),
                phase,
                entries: pass.entries - 1,
            });
        }
        match visit(&mut entry) {
            Ok(()) => {}
            // A read of the content the meter stopped surfaces in the visitor's error.
            Err(e) if meter.stopped.get().is_some() => {
                return Err(stopped(&pass, io::Error::other(e.to_string())))
            }
            Err(e) => return Err(e),
        }
    }
    pass.inflated = meter.read.get();
    Ok(pass)
}
