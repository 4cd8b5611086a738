//! SHA-256 content digests (`sha256:<64 hex>`) and the readers/writers that compute them while
//! data streams through, so no blob is ever read twice just to hash it.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use super::error::ImageError;

/// An OCI content digest. Only `sha256` is produced or accepted: it is what every registry and
/// engine supports, and accepting algorithms we cannot verify would defeat verification.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

const PREFIX: &str = "sha256:";

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Digest, ImageError> {
        let Some(hex) = s.strip_prefix(PREFIX) else {
            return Err(ImageError::UnsupportedDigest {
                value: s.to_owned(),
            });
        };
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(ImageError::invalid(
                "digest",
                s,
                "expected sha256: followed by 64 lowercase hex digits",
            ));
        }
        Ok(Digest(s.to_owned()))
    }

    /// Digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hash(&Sha256::digest(bytes))
    }

    pub(crate) fn from_hash(hash: &[u8]) -> Digest {
        Digest(format!("{PREFIX}{}", hex(hash)))
    }

    /// The 64 hex digits (the blob's file name in an OCI layout).
    pub fn hex(&self) -> &str {
        &self.0[PREFIX.len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl FromStr for Digest {
    type Err = ImageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

/// A writer that hashes and counts everything written through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The digest and size of what was written, and the inner writer.
    pub(crate) fn finish(self) -> (Digest, u64, W) {
        (
            Digest::from_hash(&self.hasher.finalize()),
            self.bytes,
            self.inner,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes and counts everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// Reads the rest of the stream (tar readers stop at the end-of-archive marker and may leave
    /// padding unread), then returns its digest and total size.
    pub(crate) fn drain_and_finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest::from_hash(&self.hasher.finalize()), self.bytes))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Reads one blob and refuses it unless it is exactly `size` bytes with digest `expected`.
///
/// Reading past `size` fails at once, so a hostile or broken server cannot stream without end;
/// [`VerifyingReader::finish`] drains the rest and checks the digest. Until `finish` returns
/// `Ok`, nothing read through this reader may be trusted (callers stage and discard).
pub(crate) struct VerifyingReader<R> {
    inner: HashingReader<io::Take<R>>,
    expected: Digest,
    size: u64,
    what: String,
    location: String,
}

impl<R: Read> VerifyingReader<R> {
    pub(crate) fn new(
        inner: R,
        expected: &Digest,
        size: u64,
        what: impl Into<String>,
        location: impl Into<String>,
    ) -> Self {
        VerifyingReader {
            // One byte more than allowed, so an over-long blob is noticed rather than cut.
            inner: HashingReader::new(inner.take(size.saturating_add(1))),
            expected: expected.clone(),
            size,
            what: what.into(),
            location: location.into(),
        }
    }

    fn size_error(&self, actual: u64) -> ImageError {
        ImageError::SizeMismatch {
            what: self.what.clone(),
            digest: self.expected.clone(),
            expected: self.size,
            actual,
            location: self.location.clone(),
        }
    }

    /// Drains the blob and checks its size and digest.
    pub(crate) fn finish(self) -> Result<(), ImageError> {
        self.finish_verified().map(drop)
    }

    /// [`Self::finish`], returning the proof: the digest this reader computed over every byte
    /// it passed on, which matched.
    pub(crate) fn finish_verified(self) -> Result<Verified, ImageError> {
        let VerifyingReader {
            inner,
            expected,
            size,
            what,
            location,
        } = self;
        let (actual, bytes) = inner
            .drain_and_finish()
            .map_err(|e| io_to_image(e, &location))?;
        if bytes != size {
            return Err(ImageError::SizeMismatch {
                what,
                digest: expected,
                expected: size,
                actual: bytes,
                location,
            });
        }
        if actual != expected {
            return Err(ImageError::DigestMismatch {
                what,
                expected,
                actual,
                location,
            });
        }
        Ok(Verified(actual))
    }
}

/// A blob's digest as a [`VerifyingReader`] computed it over every byte it passed on, and
/// found it to be the expected one. Only [`VerifyingReader::finish_verified`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified(Digest);

impl Verified {
    pub(crate) fn digest(&self) -> &Digest {
        &self.0
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.inner.bytes_read() > self.size {
            return Err(io::Error::other(self.size_error(self.inner.bytes_read())));
        }
        Ok(n)
    }
}

/// Recovers an [`ImageError`] that travelled through an `io::Error` (from a reader inside a tar
/// or gzip decoder); anything else becomes an I/O error on `location`.
pub(crate) fn io_to_image(e: io::Error, location: &str) -> ImageError {
    let as_io = |source: io::Error| ImageError::Io {
        action: "reading",
        path: location.into(),
        source,
    };
    if e.get_ref().is_none() {
        // A plain OS error: keep it whole (errno and all).
        return as_io(e);
    }
    let kind = e.kind();
    match e.into_inner().map(|inner| inner.downcast::<ImageError>()) {
        Some(Ok(image)) => *image,
        Some(Err(other)) => as_io(io::Error::new(kind, other)),
        None => as_io(io::Error::from(kind)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parse_and_of() {
        assert_eq!(Digest::of(b"").as_str(), EMPTY);
        assert_eq!(Digest::parse(EMPTY).unwrap().hex().len(), 64);
        assert!(matches!(
            Digest::parse("sha512:abcd"),
            Err(ImageError::UnsupportedDigest { .. })
        ));
        assert!(Digest::parse("sha256:ABC").is_err());
        assert!(Digest::parse(&EMPTY.to_uppercase().replace("SHA256", "sha256")).is_err());
        let json = serde_json::to_string(&Digest::of(b"")).unwrap();
        assert_eq!(json, format!("\"{EMPTY}\""));
        assert!(serde_json::from_str::<Digest>("\"sha256:00\"").is_err());
    }

    #[test]
    fn verifying_reader_accepts_exact_and_rejects_others() {
        let data = b"hello world";
        let d = Digest::of(data);
        let mut r = VerifyingReader::new(&data[..], &d, 11, "blob", "test");
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        r.finish().unwrap();
        assert_eq!(out, data);

        // Same size, different content.
        let r = VerifyingReader::new(&b"hello WORLD"[..], &d, 11, "blob", "test");
        let err = r.finish().unwrap_err();
        assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");

        // Longer than declared: fails while reading.
        let mut r = VerifyingReader::new(&b"hello world!"[..], &d, 11, "blob", "test");
        let e = io::copy(&mut r, &mut io::sink()).unwrap_err();
        assert!(matches!(
            io_to_image(e, "x"),
            ImageError::SizeMismatch { actual: 12, .. }
        ));

        // Shorter than declared.
        let r = VerifyingReader::new(&b"hello"[..], &d, 11, "blob", "test");
        assert!(matches!(
            r.finish(),
            Err(ImageError::SizeMismatch { actual: 5, .. })
        ));
    }
}
