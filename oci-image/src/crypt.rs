//! The layer-transform seam for encrypted images (ocicrypt's format, see
//! `gpusnap_image_crypt`): [`encrypt_layout`] turns a built layout's layers into encrypted
//! ones for a set of recipients; [`Decryption`] opens them again on extract and pull.
//!
//! What stays in the clear: the image index and manifest (with gpusnap's annotations), the
//! image config (with the plain layers' diff_ids), and every blob's size.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use gpusnap_image_crypt::{
    encrypted_media_type, plain_media_type, EncryptingReader, LayerKey, PrivateKey, Recipient,
};

use super::digest::{Digest, HashingWriter};
use super::oci_layout::{BLOBS_DIR, INDEX_FILE};
use super::spec::{
    is_index_media_type, is_manifest_media_type, Descriptor, ImageIndex, ImageManifest,
};
use super::ImageError;

/// The node's decryption keys, shared by every layer of an extraction.
#[derive(Debug, Clone, Default)]
pub struct Decryption {
    pub keys: Arc<Vec<PrivateKey>>,
}

impl Decryption {
    /// Loads key files (root-owned, 0600; see `gpusnap_image_crypt::PrivateKey::load`).
    pub fn load(paths: &[std::path::PathBuf]) -> Result<Decryption, ImageError> {
        let keys =
            gpusnap_image_crypt::load_private_keys(paths).map_err(|source| ImageError::Crypt {
                location: "decryption keys".into(),
                reason: source,
            })?;
        Ok(Decryption {
            keys: Arc::new(keys),
        })
    }

    /// For an encrypted layer: its unwrapped key (refused, naming the recipients, when no key
    /// opens it). `None` for a plain layer.
    pub(crate) fn open(
        &self,
        desc: &Descriptor,
        location: &str,
    ) -> Result<Option<Arc<LayerKey>>, ImageError> {
        if plain_media_type(&desc.media_type).is_none() {
            return Ok(None);
        }
        LayerKey::unwrap(&desc.annotations, &self.keys)
            .map(|k| Some(Arc::new(k)))
            .map_err(|source| ImageError::Crypt {
                location: location.to_owned(),
                reason: source,
            })
    }
}

/// Parses `--encrypt-recipient` values into recipients.
pub fn recipients(specs: &[String]) -> Result<Arc<Vec<Recipient>>, ImageError> {
    gpusnap_image_crypt::recipients_from_specs(specs)
        .map(Arc::new)
        .map_err(|source| ImageError::Crypt {
            location: "--encrypt-recipient".into(),
            reason: source,
        })
}

struct Rewriter<'a> {
    root: &'a Path,
    recipients: &'a [Recipient],
    /// Plain blobs (layers, manifests, indexes) replaced: removed once all are rewritten.
    replaced: BTreeSet<Digest>,
    kept: BTreeSet<Digest>,
    seq: u64,
    /// Plain digest → new descriptor, for every rewritten blob.
    rewritten: BTreeMap<Digest, Descriptor>,
}

impl Rewriter<'_> {
    fn blob(&self, d: &Digest) -> std::path::PathBuf {
        self.root.join(BLOBS_DIR).join(d.hex())
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, d: &Descriptor) -> Result<T, ImageError> {
        let path = self.blob(&d.digest);
        let bytes = fs::read(&path).map_err(ImageError::io("reading", &path))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::malformed("layout document", path.display().to_string(), e))
    }

    fn put_json<T: serde::Serialize>(
        &mut self,
        v: &T,
        like: &Descriptor,
    ) -> Result<Descriptor, ImageError> {
        let bytes = serde_json::to_vec(v).expect("serialising OCI JSON cannot fail");
        let digest = Digest::of(&bytes);
        let path = self.blob(&digest);
        fs::write(&path, &bytes).map_err(ImageError::io("writing", &path))?;
        self.kept.insert(digest.clone());
        if like.digest != digest {
            self.replaced.insert(like.digest.clone());
        }
        let new = Descriptor {
            digest,
            size: bytes.len() as u64,
            ..like.clone()
        };
        self.rewritten.insert(like.digest.clone(), new.clone());
        Ok(new)
    }

    fn node(&mut self, desc: &Descriptor) -> Result<Descriptor, ImageError> {
        if is_index_media_type(&desc.media_type) {
            let mut index: ImageIndex = self.read_json(desc)?;
            index.manifests = index
                .manifests
                .iter()
                .map(|d| self.node(d))
                .collect::<Result<_, _>>()?;
            self.put_json(&index, desc)
        } else if is_manifest_media_type(&desc.media_type) {
            let mut manifest: ImageManifest = self.read_json(desc)?;
            self.kept.insert(manifest.config.digest.clone());
            self.encrypt_all(&manifest.layers)?;
            manifest.layers = manifest
                .layers
                .iter()
                .map(|l| self.layer(l))
                .collect::<Result<_, _>>()?;
            self.put_json(&manifest, desc)
        } else {
            Err(ImageError::UnsupportedMediaType {
                what: "layout entry",
                media_type: desc.media_type.clone(),
                location: self.root.display().to_string(),
            })
        }
    }

    /// Encrypts the distinct layers of `layers` not yet rewritten, several at once
    /// ([`crate::parallel::run_each`]); [`Rewriter::layer`] then finds them done.
    fn encrypt_all(&mut self, layers: &[Descriptor]) -> Result<(), ImageError> {
        let mut todo: Vec<&Descriptor> = Vec::new();
        for l in layers {
            if plain_media_type(&l.media_type).is_none()
                && !self.rewritten.contains_key(&l.digest)
                && !todo.iter().any(|t| t.digest == l.digest)
            {
                todo.push(l);
            }
        }
        let base = self.seq;
        self.seq += todo.len() as u64;
        let (root, recipients) = (self.root, self.recipients);
        let results = crate::parallel::run_each(&todo, |i, d| {
            encrypt_one(root, recipients, d, base + i as u64 + 1)
        });
        let mut first_err = None;
        for (d, r) in todo.iter().zip(results) {
            match r {
                Some(Ok(new)) => {
                    self.replaced.insert(d.digest.clone());
                    self.kept.insert(new.digest.clone());
                    self.rewritten.insert(d.digest.clone(), new);
                }
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                // Never started: only after another layer failed, whose error is kept.
                None => {}
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn layer(&mut self, desc: &Descriptor) -> Result<Descriptor, ImageError> {
        if plain_media_type(&desc.media_type).is_some() {
            self.kept.insert(desc.digest.clone());
            return Ok(desc.clone());
        }
        if let Some(prev) = self.rewritten.get(&desc.digest) {
            // The same plain blob twice in one image (identical GPU extents): one ciphertext
            // under one key. The config's diff_ids already show the two are equal.
            let mut annotations = desc.annotations.clone();
            annotations.extend(
                prev.annotations
                    .iter()
                    .filter(|(k, _)| k.starts_with(gpusnap_image_crypt::format::ANNOTATION_PREFIX))
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            return Ok(Descriptor {
                annotations,
                ..prev.clone()
            });
        }
        self.seq += 1;
        let new = encrypt_one(self.root, self.recipients, desc, self.seq)?;
        self.replaced.insert(desc.digest.clone());
        self.kept.insert(new.digest.clone());
        self.rewritten.insert(desc.digest.clone(), new.clone());
        Ok(new)
    }
}

/// Encrypts the layer blob `desc` of the layout at `root` into a new blob (its scratch file
/// named with `seq`) and returns the encrypted layer's descriptor. The plain blob stays.
fn encrypt_one(
    root: &Path,
    recipients: &[Recipient],
    desc: &Descriptor,
    seq: u64,
) -> Result<Descriptor, ImageError> {
    let src = root.join(BLOBS_DIR).join(desc.digest.hex());
    let location = format!("{} layer {}", root.display(), desc.digest);
    let crypt = |source| ImageError::Crypt {
        location: location.clone(),
        reason: source,
    };
    let file = File::open(&src).map_err(ImageError::io("opening", &src))?;
    // The blob was just written under its digest: not hashed again.
    let mut reader = EncryptingReader::with_plain_digest(
        BufReader::with_capacity(1 << 20, file),
        desc.digest.as_str(),
    )
    .map_err(crypt)?;
    let tmp = root
        .join(BLOBS_DIR)
        .join(format!(".encrypting-{}-{}", std::process::id(), seq));
    let out = File::create(&tmp).map_err(ImageError::io("creating", &tmp))?;
    let mut w = HashingWriter::new(std::io::BufWriter::with_capacity(1 << 20, out));
    let copied = (|| -> std::io::Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            std::io::Write::write_all(&mut w, &buf[..n])?;
        }
    })();
    let finished = copied.and_then(|()| {
        let (digest, size, inner) = w.finish();
        let file = inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((digest, size))
    });
    let (digest, size) = match finished {
        Ok(v) => v,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(ImageError::io("encrypting", &src)(e));
        }
    };
    let enc = match reader.finish(recipients) {
        Ok(enc) => enc,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(crypt(e));
        }
    };
    if enc.plain_size != desc.size {
        let _ = fs::remove_file(&tmp);
        return Err(ImageError::SizeMismatch {
            what: "layer (while encrypting)".into(),
            digest: desc.digest.clone(),
            expected: desc.size,
            actual: enc.plain_size,
            location,
        });
    }
    let dst = root.join(BLOBS_DIR).join(digest.hex());
    fs::rename(&tmp, &dst).map_err(ImageError::io("renaming into place", &dst))?;
    let mut annotations = desc.annotations.clone();
    annotations.extend(enc.annotations);
    let new = Descriptor {
        media_type: encrypted_media_type(&desc.media_type),
        digest,
        size,
        annotations,
        platform: desc.platform.clone(),
    };
    Ok(new)
}

/// Encrypts every layer of the OCI layout at `root` (the gpusnap manifest's included) for
/// `recipients`, each with its own random key, and rewrites the manifests, indexes and
/// `index.json` to point at the ciphertext. The plain layer blobs are removed. Returns, for
/// every blob rewritten (layers, manifests, indexes), its plain digest and new descriptor.
pub fn encrypt_layout(
    root: &Path,
    recipients: &[Recipient],
) -> Result<BTreeMap<Digest, Descriptor>, ImageError> {
    let index_path = root.join(INDEX_FILE);
    let bytes = fs::read(&index_path).map_err(ImageError::io("reading", &index_path))?;
    let mut top: ImageIndex = serde_json::from_slice(&bytes)
        .map_err(|e| ImageError::malformed("index.json", index_path.display().to_string(), e))?;
    let mut w = Rewriter {
        root,
        recipients,
        replaced: BTreeSet::new(),
        kept: BTreeSet::new(),
        seq: 0,
        rewritten: BTreeMap::new(),
    };
    top.manifests = top
        .manifests
        .iter()
        .map(|d| w.node(d))
        .collect::<Result<_, _>>()?;
    let tmp = root.join(".index.json.encrypting");
    fs::write(
        &tmp,
        serde_json::to_vec(&top).expect("serialising OCI JSON cannot fail"),
    )
    .map_err(ImageError::io("writing", &tmp))?;
    fs::rename(&tmp, &index_path).map_err(ImageError::io("renaming into place", &index_path))?;
    for d in w.replaced.difference(&w.kept) {
        let p = w.blob(d);
        fs::remove_file(&p).map_err(ImageError::io("removing plain blob", &p))?;
    }
    Ok(w.rewritten)
}

/// Encrypts a copy of the OCI layout at `layout` into `dest` (created; must not exist) for
/// `recipients`, leaving `layout` as it was: blobs are copied (`copy_file_range`: reflinked
/// where the file system shares extents), then [`encrypt_layout`] replaces the layers there.
/// The layout is refused first if it holds anything but directories and regular files with one
/// name, as a push of it would be.
pub fn encrypt_copy(
    layout: &Path,
    dest: &Path,
    recipients: &[Recipient],
) -> Result<BTreeMap<Digest, Descriptor>, ImageError> {
    if !layout.join(super::oci_layout::OCI_LAYOUT_FILE).is_file() {
        return Err(ImageError::NotAnImage {
            path: layout.to_owned(),
        });
    }
    super::oci_layout::check_layout_tree(layout)?;
    let blobs = dest.join(BLOBS_DIR);
    fs::create_dir(dest).map_err(ImageError::io("creating", dest))?;
    let result = (|| {
        fs::create_dir_all(&blobs).map_err(ImageError::io("creating", &blobs))?;
        for name in [super::oci_layout::OCI_LAYOUT_FILE, INDEX_FILE] {
            let (from, to) = (layout.join(name), dest.join(name));
            fs::copy(&from, &to).map_err(ImageError::io("copying", &from))?;
        }
        let src_blobs = layout.join(BLOBS_DIR);
        for entry in fs::read_dir(&src_blobs).map_err(ImageError::io("reading", &src_blobs))? {
            let entry = entry.map_err(ImageError::io("reading", &src_blobs))?;
            if !entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                continue;
            }
            let (from, to) = (entry.path(), blobs.join(entry.file_name()));
            // A copy (reflinked where the file system can), not a hard link: a push refuses
            // layout files with more than one name.
            fs::copy(&from, &to).map_err(ImageError::io("copying", &from))?;
        }
        encrypt_layout(dest, recipients)
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(dest);
    }
    result
}

/// Reads `inner` through the layer's decryption when it has a key.
pub(crate) fn decrypting<'a, R: Read + 'a>(
    key: Option<&LayerKey>,
    inner: R,
    location: &str,
) -> Result<Box<dyn FinishRead + 'a>, ImageError> {
    match key {
        None => Ok(Box::new(Plain(inner))),
        Some(k) => Ok(Box::new(k.reader(inner).map_err(|source| {
            ImageError::Crypt {
                location: location.to_owned(),
                reason: source,
            }
        })?)),
    }
}

/// A layer stream that can be checked once its consumer stopped reading.
pub(crate) trait FinishRead: Read {
    /// Reads to the end and verifies (the HMAC, for an encrypted layer); returns the plain
    /// stream's digest for an encrypted layer.
    fn finish_read(&mut self, location: &str) -> Result<Option<Digest>, ImageError>;
}

struct Plain<R>(R);

impl<R: Read> Read for Plain<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Read> FinishRead for Plain<R> {
    fn finish_read(&mut self, _: &str) -> Result<Option<Digest>, ImageError> {
        Ok(None)
    }
}

impl<R: Read> FinishRead for gpusnap_image_crypt::DecryptingReader<R> {
    fn finish_read(&mut self, location: &str) -> Result<Option<Digest>, ImageError> {
        let digest = self.finish().map_err(|source| ImageError::Crypt {
            location: location.to_owned(),
            reason: source,
        })?;
        Digest::parse(&digest).map(Some)
    }
}
