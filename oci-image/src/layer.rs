//! Writing one uncompressed tar layer into a layout, hashing it as it is written.
//!
//! Layers are uncompressed on purpose: CRIU page images and GPU memory are mostly
//! incompressible, gzip on a few cores runs at a fraction of disk speed, and an uncompressed
//! layer's blob digest *is* its diff_id, so the data is hashed once.

use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::path::PathBuf;

use super::digest::{Digest, HashingWriter};
use super::error::ImageError;
use super::oci_layout::LayoutWriter;

/// Ownership, permissions and time of one entry, carried from the source unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryMeta {
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
}

type Sink = HashingWriter<BufWriter<File>>;

/// A tar layer being written to a scratch file of the layout.
pub(crate) struct LayerWriter {
    builder: tar::Builder<Sink>,
    tmp: PathBuf,
    entries: u64,
    content_bytes: u64,
}

/// A finished layer blob (already at its content address in the layout).
#[derive(Debug, Clone)]
pub(crate) struct FinishedLayer {
    pub digest: Digest,
    pub size: u64,
    pub entries: u64,
    pub content_bytes: u64,
}

impl LayerWriter {
    pub(crate) fn create(layout: &mut LayoutWriter) -> Result<Self, ImageError> {
        let (tmp, f) = layout.tmp_file()?;
        let mut builder =
            tar::Builder::new(HashingWriter::new(BufWriter::with_capacity(1 << 20, f)));
        // Never consult the host for owners/modes: every header is built from source metadata.
        builder.mode(tar::HeaderMode::Complete);
        Ok(LayerWriter {
            builder,
            tmp,
            entries: 0,
            content_bytes: 0,
        })
    }

    pub(crate) fn header(kind: tar::EntryType, meta: &EntryMeta) -> tar::Header {
        // GNU headers: long names and sizes above 8 GiB (GPU extents) are encoded the way Go's
        // archive/tar (containerd, CRI-O) reads them.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(meta.mode & 0o7777);
        h.set_uid(meta.uid);
        h.set_gid(meta.gid);
        h.set_mtime(meta.mtime);
        h.set_size(0);
        h
    }

    fn io_err(&self) -> impl FnOnce(io::Error) -> ImageError {
        ImageError::io("writing layer", &self.tmp)
    }

    pub(crate) fn append_dir(&mut self, path: &str, meta: &EntryMeta) -> Result<(), ImageError> {
        let mut h = Self::header(tar::EntryType::Directory, meta);
        let name = format!("{}/", path.trim_end_matches('/'));
        let err = self.io_err();
        self.builder
            .append_data(&mut h, name, io::empty())
            .map_err(err)?;
        self.entries += 1;
        Ok(())
    }

    pub(crate) fn append_symlink(
        &mut self,
        path: &str,
        target: &str,
        meta: &EntryMeta,
    ) -> Result<(), ImageError> {
        let mut h = Self::header(tar::EntryType::Symlink, meta);
        let err = self.io_err();
        self.builder
            .append_link(&mut h, path, target)
            .map_err(err)?;
        self.entries += 1;
        Ok(())
    }

    /// Appends a regular file of exactly `size` bytes read from `data`.
    pub(crate) fn append_file(
        &mut self,
        path: &str,
        size: u64,
        data: &mut dyn Read,
        meta: &EntryMeta,
    ) -> Result<(), ImageError> {
        let mut h = Self::header(tar::EntryType::Regular, meta);
        h.set_size(size);
        // Guard the header's promise: a source that yields fewer bytes would corrupt the tar.
        let mut counted = CountingReader {
            inner: data.take(size),
            n: 0,
        };
        let err = self.io_err();
        self.builder
            .append_data(&mut h, path, &mut counted)
            .map_err(err)?;
        if counted.n != size {
            return Err(ImageError::io("reading source for layer", &self.tmp)(
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{path}: {} of {size} bytes", counted.n),
                ),
            ));
        }
        self.entries += 1;
        self.content_bytes += size;
        Ok(())
    }

    /// Ends the tar, moves the blob to its digest and returns it.
    pub(crate) fn finish(self, layout: &LayoutWriter) -> Result<FinishedLayer, ImageError> {
        let LayerWriter {
            builder,
            tmp,
            entries,
            content_bytes,
        } = self;
        let sink = builder
            .into_inner()
            .map_err(ImageError::io("writing layer", &tmp))?;
        let (digest, size, buf) = sink.finish();
        let file = buf
            .into_inner()
            .map_err(|e| ImageError::io("writing layer", &tmp)(e.into_error()))?;
        drop(file);
        layout.commit(&tmp, &digest)?;
        Ok(FinishedLayer {
            digest,
            size,
            entries,
            content_bytes,
        })
    }
}

struct CountingReader<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}
