//! OCI image layouts on disk: writing one (blobs, `index.json`, `oci-layout`), packing it into an
//! `oci-archive` tar, and reading images back from either form.
//!
//! An oci-archive is read in place: one pass over the tar headers records where each member's
//! bytes start, after which blobs are read with a seek. Multi-GB GPU layers are therefore never
//! unpacked to a temporary directory just to be inspected, pushed or extracted.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpusnap_checkpoint::beneath;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::annotations::keys;
use super::digest::{io_to_image, Digest, VerifyingReader};
use super::error::ImageError;
use super::spec::{
    goarch, is_index_media_type, is_manifest_media_type, Descriptor, ImageConfig, ImageIndex,
    ImageManifest, OciLayout, MAX_JSON_BYTES, MEDIA_TYPE_INDEX, OCI_LAYOUT_VERSION,
};

pub(crate) const OCI_LAYOUT_FILE: &str = "oci-layout";
pub(crate) const INDEX_FILE: &str = "index.json";
pub(crate) const BLOBS_DIR: &str = "blobs/sha256";
/// Scratch space inside a layout being written; removed before the layout is complete.
const TMP_DIR: &str = ".gpusnap-tmp";

/// Makes `path` an empty directory: creates it, or accepts an existing empty one. Returns whether
/// it was created (so a failed operation removes only what it made).
pub(crate) fn prepare_empty_dir(path: &Path) -> Result<bool, ImageError> {
    match fs::read_dir(path) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ImageError::DestinationExists {
                    path: path.to_path_buf(),
                });
            }
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).map_err(ImageError::io("creating", path))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotADirectory => Err(ImageError::DestinationExists {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(ImageError::io("reading", path)(e)),
    }
}

/// Removes a directory tree on drop unless disarmed: partial outputs never look complete.
pub(crate) struct RemoveOnDrop {
    path: Option<PathBuf>,
    /// Remove only the contents (the directory existed, empty, before we started).
    contents_only: bool,
}

impl RemoveOnDrop {
    pub(crate) fn new(path: &Path, created: bool) -> Self {
        RemoveOnDrop {
            path: Some(path.to_path_buf()),
            contents_only: !created,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.path = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let Some(path) = self.path.take() else { return };
        let result = if self.contents_only {
            // Through a descriptor: a symlink inside goes, never what it points at.
            beneath::open_root(&path).and_then(|fd| beneath::empty_dir(fd.as_fd(), &|_| false))
        } else {
            fs::remove_dir_all(&path)
        };
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "could not remove partial output");
        }
    }
}

/// Writes blobs into a new OCI image layout directory.
pub(crate) struct LayoutWriter {
    root: PathBuf,
    seq: u64,
}

impl LayoutWriter {
    /// Starts a layout in `root`, which must be an empty directory.
    pub(crate) fn create(root: &Path) -> Result<Self, ImageError> {
        let blobs = root.join(BLOBS_DIR);
        fs::create_dir_all(&blobs).map_err(ImageError::io("creating", &blobs))?;
        let tmp = root.join(TMP_DIR);
        fs::create_dir_all(&tmp).map_err(ImageError::io("creating", &tmp))?;
        let w = LayoutWriter {
            root: root.to_path_buf(),
            seq: 0,
        };
        w.write_file(
            OCI_LAYOUT_FILE,
            &serde_json::to_vec(&OciLayout {
                image_layout_version: OCI_LAYOUT_VERSION.to_owned(),
            })
            .expect("serialising a fixed struct"),
        )?;
        Ok(w)
    }

    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join(BLOBS_DIR).join(digest.hex())
    }

    /// A new scratch file for a blob whose digest is not known yet.
    pub(crate) fn tmp_file(&mut self) -> Result<(PathBuf, File), ImageError> {
        self.seq += 1;
        let path =
            self.root
                .join(TMP_DIR)
                .join(format!("blob-{}-{}", std::process::id(), self.seq));
        let f = File::create(&path).map_err(ImageError::io("creating", &path))?;
        Ok((path, f))
    }

    /// Moves a finished scratch file to its content address. A blob already present (two
    /// identical GPU extents) is the same content, so the duplicate is simply dropped.
    pub(crate) fn commit(&self, tmp: &Path, digest: &Digest) -> Result<(), ImageError> {
        let dst = self.blob_path(digest);
        if dst.exists() {
            fs::remove_file(tmp).map_err(ImageError::io("removing", tmp))?;
            return Ok(());
        }
        fs::rename(tmp, &dst).map_err(ImageError::io("renaming into place", &dst))
    }

    pub(crate) fn put_bytes(&self, bytes: &[u8]) -> Result<(Digest, u64), ImageError> {
        let digest = Digest::of(bytes);
        let dst = self.blob_path(&digest);
        if !dst.exists() {
            fs::write(&dst, bytes).map_err(ImageError::io("writing", &dst))?;
        }
        Ok((digest, bytes.len() as u64))
    }

    pub(crate) fn put_json<T: Serialize>(&self, value: &T) -> Result<(Digest, u64), ImageError> {
        self.put_bytes(&serde_json::to_vec(value).expect("serialising OCI JSON cannot fail"))
    }

    fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.root.join(name);
        fs::write(&path, bytes).map_err(ImageError::io("writing", &path))
    }

    /// Writes `index.json` and removes the scratch directory: the layout is complete.
    pub(crate) fn finish(self, index: &ImageIndex) -> Result<(), ImageError> {
        self.write_file(
            INDEX_FILE,
            &serde_json::to_vec(index).expect("serialising OCI JSON cannot fail"),
        )?;
        let tmp = self.root.join(TMP_DIR);
        fs::remove_dir_all(&tmp).map_err(ImageError::io("removing", &tmp))
    }
}

/// Packs the layout at `layout` into an oci-archive tar at `out` (written beside it, then renamed
/// into place). `oci-layout` and `index.json` come first so streaming readers see them early.
/// The layout's files are opened beneath it as regular files, never through a symlink.
pub(crate) fn write_oci_archive(layout: &Path, out: &Path) -> Result<u64, ImageError> {
    let tmp = out.with_file_name(format!(
        ".{}.tmp-{}",
        out.file_name()
            .map_or_else(|| "archive".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let result = (|| {
        let root = beneath::open_root(layout).map_err(ImageError::io("opening", layout))?;
        let f = File::create(&tmp).map_err(ImageError::io("creating", &tmp))?;
        let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, f));
        let io = ImageError::io("writing", &tmp);
        let append = |b: &mut tar::Builder<BufWriter<File>>, name: &str| {
            let src = layout.join(name);
            let mut file = beneath::open_file(root.as_fd(), Path::new(name))
                .map_err(ImageError::io("opening", &src))?;
            let len = file
                .metadata()
                .map_err(ImageError::io("reading", &src))?
                .len();
            let mut h = archive_header(tar::EntryType::Regular, 0o644);
            h.set_size(len);
            b.append_data(&mut h, name, &mut file)
                .map_err(ImageError::io("writing", &tmp))
        };
        append(&mut b, OCI_LAYOUT_FILE)?;
        append(&mut b, INDEX_FILE)?;
        for dir in ["blobs/", "blobs/sha256/"] {
            let mut h = archive_header(tar::EntryType::Directory, 0o755);
            h.set_size(0);
            b.append_data(&mut h, dir, io::empty())
                .map_err(ImageError::io("writing", &tmp))?;
        }
        let blobs_dir = layout.join(BLOBS_DIR);
        let blobs = beneath::open_dir(root.as_fd(), Path::new(BLOBS_DIR))
            .and_then(|fd| beneath::names(fd.as_fd()))
            .map_err(ImageError::io("reading", &blobs_dir))?;
        for n in blobs {
            append(&mut b, &format!("{BLOBS_DIR}/{}", n.to_string_lossy()))?;
        }
        let mut w = b.into_inner().map_err(io)?;
        w.flush().map_err(ImageError::io("writing", &tmp))?;
        let f = w
            .into_inner()
            .map_err(|e| ImageError::io("writing", &tmp)(e.into_error()))?;
        f.sync_all().map_err(ImageError::io("syncing", &tmp))?;
        let len = f.metadata().map_err(ImageError::io("reading", &tmp))?.len();
        fs::rename(&tmp, out).map_err(ImageError::io("renaming into place", out))?;
        Ok(len)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn archive_header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    // Fixed mtime: the archive of a given layout is byte-identical every time.
    h.set_mtime(0);
    h
}

/// A member's reader and size.
type Member = (Box<dyn Read + Send>, u64);

/// An oci-archive's member name → (offset of its data, size).
type Members = HashMap<String, (u64, u64)>;

/// An image to read: a layout directory or an oci-archive tar.
pub(crate) enum ImageSource {
    /// Everything in the layout is opened beneath `fd` ([`beneath`]): `index.json`,
    /// `oci-layout` and `blobs/sha256/*` must be regular files, and no symlink in the layout is
    /// followed (a layout comes from a pull, an import or a build elsewhere).
    Layout { root: PathBuf, fd: OwnedFd },
    Archive {
        path: PathBuf,
        /// The archive, opened once; members are read at their offsets.
        file: File,
        /// Member name → (offset of its data, size).
        members: HashMap<String, (u64, u64)>,
    },
}

/// `size` bytes of `file` from `offset`, read with `pread` so that readers of several members
/// share one descriptor without sharing a file position.
struct MemberReader {
    file: File,
    offset: u64,
    left: u64,
}

impl Read for MemberReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.offset)?;
        self.offset += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The image an index.json entry leads to.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The index.json entry.
    pub top: Descriptor,
    /// Nested image index, when `top` is one.
    pub index: Option<ImageIndex>,
    pub manifest_desc: Descriptor,
    pub manifest: ImageManifest,
    pub config: ImageConfig,
}

impl ImageSource {
    pub(crate) fn open(path: &Path) -> Result<ImageSource, ImageError> {
        let meta = fs::metadata(path).map_err(ImageError::io("opening", path))?;
        let source = if meta.is_dir() {
            ImageSource::Layout {
                root: path.to_path_buf(),
                fd: beneath::open_root(path).map_err(ImageError::io("opening", path))?,
            }
        } else {
            let (file, members) = index_tar(path)?;
            ImageSource::Archive {
                path: path.to_path_buf(),
                file,
                members,
            }
        };
        let layout: OciLayout = match source.open_member(OCI_LAYOUT_FILE)? {
            Some((r, size)) => read_json(r, size, "oci-layout", &source.location())?,
            None => {
                return Err(ImageError::NotAnImage {
                    path: path.to_path_buf(),
                })
            }
        };
        if layout.image_layout_version != OCI_LAYOUT_VERSION {
            return Err(ImageError::malformed(
                "oci-layout",
                source.location(),
                format!("imageLayoutVersion {:?}", layout.image_layout_version),
            ));
        }
        Ok(source)
    }

    pub(crate) fn location(&self) -> String {
        match self {
            ImageSource::Layout { root, .. } => root.display().to_string(),
            ImageSource::Archive { path, .. } => format!("oci-archive {}", path.display()),
        }
    }

    fn open_member(&self, name: &str) -> Result<Option<Member>, ImageError> {
        match self {
            ImageSource::Layout { root, fd } => {
                let p = root.join(name);
                match beneath::open_file(fd.as_fd(), Path::new(name)) {
                    Ok(f) => {
                        let meta = f.metadata().map_err(ImageError::io("reading", &p))?;
                        if meta.nlink() > 1 {
                            return Err(linked_member(root, name, meta.nlink()));
                        }
                        let len = meta.len();
                        Ok(Some((
                            Box::new(io::BufReader::with_capacity(1 << 20, f)),
                            len,
                        )))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(refused_member(root, name, e)),
                }
            }
            ImageSource::Archive {
                path,
                file,
                members,
            } => {
                let Some(&(offset, size)) = members.get(name) else {
                    return Ok(None);
                };
                let file = file.try_clone().map_err(ImageError::io("opening", path))?;
                let member = MemberReader {
                    file,
                    offset,
                    left: size,
                };
                Ok(Some((
                    Box::new(io::BufReader::with_capacity(1 << 20, member)),
                    size,
                )))
            }
        }
    }

    /// A reader over blob `desc` that verifies size and digest ([`VerifyingReader::finish`]).
    pub(crate) fn blob(
        &self,
        desc: &Descriptor,
        what: &str,
    ) -> Result<VerifyingReader<Box<dyn Read + Send>>, ImageError> {
        let name = format!("{BLOBS_DIR}/{}", desc.digest.hex());
        let Some((r, _)) = self.open_member(&name)? else {
            return Err(ImageError::BlobMissing {
                digest: desc.digest.clone(),
                location: self.location(),
            });
        };
        Ok(VerifyingReader::new(
            r,
            &desc.digest,
            desc.size,
            what,
            format!("{} {name}", self.location()),
        ))
    }

    /// Reads, verifies and parses a small JSON blob; also returns its bytes.
    pub(crate) fn json_blob<T: DeserializeOwned>(
        &self,
        desc: &Descriptor,
        what: &'static str,
    ) -> Result<(T, Vec<u8>), ImageError> {
        if desc.size > MAX_JSON_BYTES {
            return Err(ImageError::malformed(
                what,
                self.location(),
                format!(
                    "{} is {} bytes, larger than any real one",
                    desc.digest, desc.size
                ),
            ));
        }
        let mut r = self.blob(desc, what)?;
        let mut bytes = Vec::with_capacity(desc.size as usize);
        r.read_to_end(&mut bytes)
            .map_err(|e| io_to_image(e, &self.location()))?;
        r.finish()?;
        let value = serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::malformed(what, format!("{} {}", self.location(), desc.digest), e)
        })?;
        Ok((value, bytes))
    }

    pub(crate) fn read_index(&self) -> Result<ImageIndex, ImageError> {
        let Some((r, size)) = self.open_member(INDEX_FILE)? else {
            return Err(ImageError::malformed(
                "image layout",
                self.location(),
                "index.json is missing",
            ));
        };
        read_json(r, size, "index.json", &self.location())
    }

    /// Follows index.json to one image: the entry named `name` (its `ref.name` or
    /// `io.containerd.image.name`), or the only entry.
    pub(crate) fn resolve(&self, name: Option<&str>) -> Result<Resolved, ImageError> {
        let index = self.read_index()?;
        let top = select_entry(&index.manifests, name, &self.location())?.clone();
        let (nested, manifest_desc) = if is_index_media_type(&top.media_type) {
            let (nested, _) = self.json_blob::<ImageIndex>(&top, "image index")?;
            let desc = select_platform(&nested.manifests, &self.location())?.clone();
            (Some(nested), desc)
        } else if is_manifest_media_type(&top.media_type) {
            (None, top.clone())
        } else {
            return Err(ImageError::UnsupportedMediaType {
                what: "index.json entry",
                media_type: top.media_type.clone(),
                location: self.location(),
            });
        };
        if !is_manifest_media_type(&manifest_desc.media_type) {
            return Err(ImageError::UnsupportedMediaType {
                what: "image index entry",
                media_type: manifest_desc.media_type.clone(),
                location: self.location(),
            });
        }
        let (manifest, _) = self.json_blob::<ImageManifest>(&manifest_desc, "image manifest")?;
        let (config, _) = self.json_blob::<ImageConfig>(&manifest.config, "image config")?;
        Ok(Resolved {
            top,
            index: nested,
            manifest_desc,
            manifest,
            config,
        })
    }
}

/// The entry named `name`, or the only one.
pub(crate) fn select_entry<'a>(
    entries: &'a [Descriptor],
    name: Option<&str>,
    location: &str,
) -> Result<&'a Descriptor, ImageError> {
    let names = || {
        entries
            .iter()
            .map(|d| entry_name(d).unwrap_or(d.digest.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(n) => entries
            .iter()
            .find(|d| {
                d.annotation(keys::OCI_REF_NAME) == Some(n)
                    || d.annotation(keys::CONTAINERD_IMAGE_NAME) == Some(n)
            })
            .ok_or_else(|| ImageError::ImageNotFound {
                location: location.to_owned(),
                name: n.to_owned(),
                names: names(),
            }),
        None => match entries {
            [one] => Ok(one),
            _ => Err(ImageError::AmbiguousImage {
                location: location.to_owned(),
                count: entries.len(),
                names: names(),
            }),
        },
    }
}

/// The name an index.json entry gives its image.
pub(crate) fn entry_name(d: &Descriptor) -> Option<&str> {
    d.annotation(keys::CONTAINERD_IMAGE_NAME)
        .or_else(|| d.annotation(keys::OCI_REF_NAME))
}

/// The manifest of an image index for this host's platform, or its only manifest.
pub(crate) fn select_platform<'a>(
    entries: &'a [Descriptor],
    location: &str,
) -> Result<&'a Descriptor, ImageError> {
    let arch = goarch(gpusnap_criu_bridge::versions::host_arch());
    if let Some(d) = entries.iter().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == arch)
    }) {
        return Ok(d);
    }
    match entries {
        [one] => Ok(one),
        _ => Err(ImageError::AmbiguousImage {
            location: location.to_owned(),
            count: entries.len(),
            names: format!("no manifest for linux/{arch}"),
        }),
    }
}

fn read_json<T: DeserializeOwned>(
    r: Box<dyn Read + Send>,
    size: u64,
    what: &'static str,
    location: &str,
) -> Result<T, ImageError> {
    if size > MAX_JSON_BYTES {
        return Err(ImageError::malformed(
            what,
            location,
            format!("{size} bytes"),
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    r.take(MAX_JSON_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| io_to_image(e, location))?;
    serde_json::from_slice(&bytes).map_err(|e| ImageError::malformed(what, location, e))
}

/// A file of a layout with more than one name: another name may be a host file's, which a push
/// would upload (or an extraction read).
fn linked_member(root: &Path, name: &str, links: u64) -> ImageError {
    ImageError::malformed(
        "image layout",
        root.display().to_string(),
        format!(
            "{name} is {}; a layout's files are read only as regular files with one name — \
             copy the layout (`cp -r`) or pull it again",
            gpusnap_checkpoint::validate::hard_linked(links)
        ),
    )
}

/// Refuses, before anything of it is read or uploaded, a layout directory holding anything but
/// directories and regular files with one link (what a checkpoint tree may hold, the same walk:
/// [`gpusnap_checkpoint::validate::entry_refusal`]).
pub(crate) fn check_layout_tree(root: &Path) -> Result<(), ImageError> {
    let fd = beneath::open_root(root).map_err(ImageError::io("opening", root))?;
    let mut refused = None;
    let walked = beneath::walk(
        fd.as_fd(),
        &mut |parent, rel: &Path, st: &rustix::fs::Stat| {
            match gpusnap_checkpoint::validate::entry_refusal(parent, rel, st, None) {
                None => Ok(()),
                Some(what) => {
                    refused = Some(ImageError::malformed(
                        "image layout",
                        root.display().to_string(),
                        format!(
                            "{} is {what}; a layout may hold only directories and regular files \
                         with one name — copy the layout (`cp -r`) or pull it again",
                            rel.display()
                        ),
                    ));
                    Err(io::Error::other("refused"))
                }
            }
        },
    );
    match (walked, refused) {
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(ImageError::io("reading", root)(e)),
        (Ok(()), None) => Ok(()),
    }
}

/// Why a file of a layout could not be opened beneath it: a symlink on the way (`ELOOP`), or
/// something other than a regular file, is named as such.
fn refused_member(root: &Path, name: &str, e: io::Error) -> ImageError {
    let p = root.join(name);
    if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
        return ImageError::malformed(
            "image layout",
            root.display().to_string(),
            format!(
                "{name} is a symlink or lies below one; a layout's files are read only as \
                 regular files inside it, never through a symlink — pull or build the image \
                 again"
            ),
        );
    }
    ImageError::io("opening", &p)(e)
}

/// One pass over an oci-archive's headers: where each regular member's data lies. Returns the
/// archive opened once, which every member is then read from.
fn index_tar(path: &Path) -> Result<(File, Members), ImageError> {
    let f = File::open(path).map_err(ImageError::io("opening", path))?;
    let kept = f.try_clone().map_err(ImageError::io("opening", path))?;
    let mut archive = tar::Archive::new(f);
    let mut members = HashMap::new();
    let not_image = |_| ImageError::NotAnImage {
        path: path.to_path_buf(),
    };
    // entries_with_seek skips member data with a seek instead of reading through it.
    for entry in archive.entries_with_seek().map_err(not_image)? {
        let entry = entry.map_err(not_image)?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let name = entry
            .path()
            .map_err(not_image)?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_owned();
        members.insert(name, (entry.raw_file_position(), entry.size()));
    }
    Ok((kept, members))
}

/// A top-level index.json (or nested index) pointing at one manifest.
pub(crate) fn single_entry_index(
    entry: Descriptor,
    annotations: std::collections::BTreeMap<String, String>,
) -> ImageIndex {
    ImageIndex {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_INDEX.to_owned()),
        manifests: vec![entry],
        annotations,
    }
}
