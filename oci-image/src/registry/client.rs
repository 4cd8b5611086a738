//! One session with one repository of an OCI distribution registry, on top of `oci-client`.
//!
//! `oci-client` does the protocol work: the `/v2/` challenge and token exchange (Basic or
//! Bearer), blob existence checks and manifest uploads of the exact bytes we hashed
//! (`push_manifest_raw`). Blob transfers are our own requests with the same credentials (see
//! [`Session::open_blob`] and [`Session::upload_blob`] for why). This module adds what a
//! checkpoint on a node needs on top:
//!
//! - **Caps.** Manifests and indexes are read by our own `GET` (same TLS roots, same token), a
//!   chunk at a time, and refused once they pass `max_manifest_bytes`: `oci-client`'s
//!   `pull_manifest_raw` buffers a body of any size before anyone can look at it. Blobs are
//!   refused when their descriptor is over the cap, when the registry announces a different
//!   length, and as soon as one byte more than the descriptor's size arrives.
//! - **A digest check while streaming, once.** Every byte is hashed as it is consumed (written
//!   to a scratch file, or unpacked), on the consumer's thread, and the result compared with
//!   the descriptor before anything is kept; a body that ends early never looks complete.
//!   Descriptors' foreign `urls` are never fetched. A redirect (to blob storage, or anywhere)
//!   is followed, and the bytes it serves are held to the same digest.
//! - **Errors that say what to do**, with the registry's own error code when it sent one.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::RegistryOperation;
use sha2::{Digest as _, Sha256};

use super::super::digest::{Digest, VerifyingReader};
use super::super::error::ImageError;
use super::super::interrupt;
use super::reference::Reference;
use super::RegistryOptions;

/// Accept header for manifest `GET`s: what a checkpoint image (and a cosign signature) can be.
pub(crate) const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Size of the pieces a blob upload is read, hashed and handed to the request body in.
const UPLOAD_CHUNK: usize = 4 << 20;

/// What a download hands its consumer at a time.
const PIECE_BYTES: usize = 1 << 20;

/// One piece of a blob on its way from the network to a consumer thread.
pub(crate) enum Piece {
    Data(bytes::Bytes),
    /// The body ended after exactly the descriptor's size.
    End,
}

pub(crate) struct Session {
    oci: oci_client::Client,
    http: reqwest::Client,
    /// `http://host:port` or `https://host:port`.
    base: String,
    reference: Reference,
    auth: RegistryAuth,
    /// Where credentials came from, for error messages.
    pub(crate) auth_hint: String,
    /// Token from the last [`Session::authenticate`] (Bearer registries).
    token: Option<String>,
    pub(crate) max_manifest_bytes: u64,
    /// Counts bytes as they cross the network, for a progress line.
    progress: Option<std::sync::Arc<super::transfer::Progress>>,
}

/// What a cross-repository mount request came back with.
pub(crate) enum Mount {
    /// The registry linked the blob into this repository: nothing to upload.
    Mounted,
    /// It did not (it lacks the blob there, or does not mount): an upload session it opened.
    Upload(String),
}

/// A fetched manifest (or index) document, at most `max_manifest_bytes`.
pub(crate) struct FetchedManifest {
    pub bytes: Vec<u8>,
    pub digest: Digest,
    pub content_type: Option<String>,
    pub url: String,
}

/// Certificates in PEM files, one entry per certificate: `reqwest` reads only the first
/// certificate of a PEM buffer, so a CA bundle is split here.
pub(crate) fn load_ca_files(paths: &[PathBuf]) -> Result<Vec<Certificate>, ImageError> {
    let mut out = Vec::new();
    for path in paths {
        let pem = std::fs::read_to_string(path).map_err(ImageError::io("reading", path))?;
        let before = out.len();
        for block in pem.split_inclusive("-----END CERTIFICATE-----") {
            if let Some(start) = block.find("-----BEGIN CERTIFICATE-----") {
                out.push(Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: block.as_bytes()[start..].to_vec(),
                });
            }
        }
        if out.len() == before {
            return Err(ImageError::invalid(
                "CA file",
                path.display().to_string(),
                "no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            ));
        }
        // Parse each one now, so a damaged bundle is named here rather than as a TLS failure.
        for c in &out[before..] {
            reqwest::Certificate::from_pem(&c.data).map_err(|e| {
                ImageError::invalid("CA file", path.display().to_string(), chain(&e))
            })?;
        }
    }
    Ok(out)
}

impl Session {
    pub(crate) fn new(
        reference: &Reference,
        opts: &RegistryOptions,
    ) -> Result<Session, ImageError> {
        let certs = load_ca_files(&opts.ca_files)?;
        let (auth, auth_hint) = super::auth::resolve(&opts.credentials, &reference.registry)?;
        let user_agent = concat!("gpusnap/", env!("CARGO_PKG_VERSION"));
        let config = ClientConfig {
            protocol: if reference.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: certs.clone(),
            // An index is never resolved by guessing a platform: we read indexes ourselves.
            platform_resolver: None,
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(opts.io_timeout),
            user_agent,
            ..Default::default()
        };
        // `try_from`, not `new`: `Client::new` falls back to a default config on error, which
        // would silently drop the CA and the protocol.
        let oci = oci_client::Client::try_from(config).map_err(|e| ImageError::Transport {
            method: "configuring",
            url: reference.base_url(),
            reason: chain(&e),
        })?;
        let mut http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(opts.io_timeout)
            .user_agent(user_agent)
            // Proxies from the environment are wrong for a node-local registry.
            .no_proxy();
        let roots: Vec<reqwest::Certificate> = certs
            .iter()
            .map(|c| reqwest::Certificate::from_pem(&c.data))
            .collect::<Result<_, _>>()
            .map_err(|e| ImageError::invalid("CA file", "", chain(&e)))?;
        http = http.tls_certs_merge(roots);
        let http = http.build().map_err(|e| ImageError::Transport {
            method: "configuring",
            url: reference.base_url(),
            reason: chain(&e),
        })?;
        Ok(Session {
            oci,
            http,
            base: reference.base_url(),
            reference: reference.clone(),
            auth,
            auth_hint,
            token: None,
            max_manifest_bytes: opts.max_manifest_bytes,
            progress: opts.progress.clone(),
        })
    }

    /// The oci-client reference for `tag_or_digest` in this session's repository.
    fn oci_ref(&self, tag_or_digest: &str) -> oci_client::Reference {
        let registry = self.reference.registry.clone();
        let repo = self.reference.repository.clone();
        if tag_or_digest.starts_with("sha256:") {
            oci_client::Reference::with_digest(registry, repo, tag_or_digest.to_owned())
        } else {
            oci_client::Reference::with_tag(registry, repo, tag_or_digest.to_owned())
        }
    }

    fn any_ref(&self) -> oci_client::Reference {
        self.oci_ref(&self.reference.manifest_ref())
    }

    pub(crate) fn url(&self, rest: &str) -> String {
        format!("{}/v2/{}/{rest}", self.base, self.reference.repository)
    }

    /// The `/v2/` challenge and, for a Bearer registry, a token for `op` on this repository.
    /// Fails early, naming the registry, when it is unreachable or refuses the credentials.
    pub(crate) async fn authenticate(&mut self, op: RegistryOperation) -> Result<(), ImageError> {
        let r = self.any_ref();
        match self.oci.auth(&r, &self.auth, op).await {
            Ok(token) => {
                self.token = token;
                Ok(())
            }
            Err(OciDistributionError::RequestError(e)) => Err(ImageError::Transport {
                method: "GET",
                url: format!("{}/v2/", self.base),
                reason: chain(&e),
            }),
            Err(e) => Err(ImageError::AuthFailed {
                registry: self.reference.registry.clone(),
                reason: chain(&e),
                hint: self.auth_hint.clone(),
            }),
        }
    }

    fn with_auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (&self.token, &self.auth) {
            (Some(t), _) => req.bearer_auth(t),
            (None, RegistryAuth::Basic(u, p)) => req.basic_auth(u, Some(p)),
            (None, RegistryAuth::Bearer(t)) => req.bearer_auth(t),
            (None, RegistryAuth::Anonymous) => req,
        }
    }

    /// `GET /manifests/<tag or digest>`, read in chunks and refused past the cap. The digest
    /// is computed over the bytes received; it must equal the registry's
    /// `Docker-Content-Digest` when one is sent and the reference's digest when it names one
    /// (the caller checks the latter against what it expects).
    pub(crate) async fn get_manifest(
        &self,
        tag_or_digest: &str,
        cap: u64,
    ) -> Result<FetchedManifest, ImageError> {
        let url = self.url(&format!("manifests/{tag_or_digest}"));
        let req = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, MANIFEST_MEDIA_TYPES.join(", "));
        let mut resp = self
            .with_auth(req)
            .send()
            .await
            .map_err(|e| transport("GET", &url, &e))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            return Err(self.status_error("GET", &url, status, resp).await);
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type =
            header("content-type").map(|c| c.split(';').next().unwrap_or(&c).trim().to_owned());
        let digest_header = header("docker-content-digest");
        if let Some(len) = resp.content_length() {
            if len > cap {
                return Err(ImageError::TooLarge {
                    what: "manifest".into(),
                    name: tag_or_digest.to_owned(),
                    size: len,
                    limit: cap,
                    location: url,
                    setting: "--max-manifest-bytes",
                });
            }
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport("GET", &url, &e))? {
            interrupt::check()?;
            if bytes.len() as u64 + chunk.len() as u64 > cap {
                return Err(ImageError::TooLarge {
                    what: "manifest".into(),
                    name: tag_or_digest.to_owned(),
                    size: bytes.len() as u64 + chunk.len() as u64,
                    limit: cap,
                    location: url,
                    setting: "--max-manifest-bytes",
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        let digest = Digest::of(&bytes);
        if let Some(h) = digest_header {
            // Only sha256 is ours to check; any other algorithm is not a statement we can verify.
            if h.starts_with("sha256:") && h != digest.as_str() {
                return Err(ImageError::DigestMismatch {
                    what: "manifest".into(),
                    expected: Digest::parse(&h)?,
                    actual: digest,
                    location: format!("{url} (Docker-Content-Digest)"),
                });
            }
        }
        Ok(FetchedManifest {
            bytes,
            digest,
            content_type,
            url,
        })
    }

    async fn status_error(
        &self,
        method: &'static str,
        url: &str,
        status: u16,
        resp: reqwest::Response,
    ) -> ImageError {
        if status == 401 {
            return ImageError::AuthRequired {
                method,
                url: url.to_owned(),
                hint: self.auth_hint.clone(),
            };
        }
        // Error bodies are short; read at most 64 KiB of one.
        let mut body = Vec::new();
        let mut resp = resp;
        while let Ok(Some(c)) = resp.chunk().await {
            body.extend_from_slice(&c);
            if body.len() > 64 << 10 {
                break;
            }
        }
        let (code, message) = parse_error_body(&String::from_utf8_lossy(&body));
        ImageError::Registry {
            method,
            url: url.to_owned(),
            status,
            code,
            message,
        }
    }

    pub(crate) async fn blob_exists(&self, digest: &Digest) -> Result<bool, ImageError> {
        let r = self.any_ref();
        self.oci
            .blob_exists(&r, digest.as_str())
            .await
            .map_err(|e| self.oci_error("HEAD", &self.url(&format!("blobs/{digest}")), e))
    }

    /// `GET /blobs/<digest>` with this session's credentials: the response, once the registry
    /// said yes and did not announce a length other than `size`. Our own request rather than
    /// `oci-client`'s `pull_blob_stream`, which hashes every byte on the network task although
    /// every caller here hashes it again (on the thread that consumes it): one pass, not two.
    /// Descriptors' foreign `urls` are never fetched; a redirect (to blob storage, or anywhere)
    /// is followed, credentials dropped when it leaves the registry, and the bytes it serves
    /// are held to the same digest by the caller.
    pub(crate) async fn open_blob(
        &self,
        digest: &Digest,
        size: u64,
        what: &str,
    ) -> Result<reqwest::Response, ImageError> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self
            .with_auth(self.http.get(&url))
            .send()
            .await
            .map_err(|e| transport("GET", &url, &e))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            return Err(self.status_error("GET", &url, status, resp).await);
        }
        if let Some(len) = resp.content_length() {
            if len != size {
                return Err(ImageError::SizeMismatch {
                    what: what.to_owned(),
                    digest: digest.clone(),
                    expected: size,
                    actual: len,
                    location: url,
                });
            }
        }
        Ok(resp)
    }

    /// Streams blob `digest` into `out`, refusing it past `size` bytes and unless it hashes to
    /// `digest`. `out` is scratch: on an error its content is meaningless.
    pub(crate) async fn fetch_blob(
        &self,
        digest: &Digest,
        size: u64,
        what: &str,
        out: &mut dyn Write,
    ) -> Result<(), ImageError> {
        let url = self.url(&format!("blobs/{digest}"));
        let mut resp = self.open_blob(digest, size, what).await?;
        let size_error = |actual| ImageError::SizeMismatch {
            what: what.to_owned(),
            digest: digest.clone(),
            expected: size,
            actual,
            location: url.clone(),
        };
        let mut hasher = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport("GET", &url, &e))? {
            interrupt::check()?;
            n += chunk.len() as u64;
            if n > size {
                return Err(size_error(n));
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .map_err(|e| ImageError::io("writing", Path::new(&url))(e))?;
        }
        if n != size {
            return Err(size_error(n));
        }
        let actual = Digest::from_hash(&hasher.finalize());
        if actual != *digest {
            return Err(ImageError::DigestMismatch {
                what: what.to_owned(),
                expected: digest.clone(),
                actual,
                location: url,
            });
        }
        Ok(())
    }

    /// Streams blob `digest` into `tx`, one piece per chunk received, refusing it past `size`
    /// bytes; [`Piece::End`] marks a complete body of exactly `size` bytes. The consumer
    /// checks the digest (on its own thread). When the consumer stops (its receiver gone) this
    /// returns `Ok`: the consumer's error says why.
    pub(crate) async fn send_blob(
        &self,
        digest: &Digest,
        size: u64,
        what: &str,
        tx: tokio::sync::mpsc::Sender<Piece>,
    ) -> Result<(), ImageError> {
        let url = self.url(&format!("blobs/{digest}"));
        let mut resp = self.open_blob(digest, size, what).await?;
        let size_error = |actual| ImageError::SizeMismatch {
            what: what.to_owned(),
            digest: digest.clone(),
            expected: size,
            actual,
            location: url.clone(),
        };
        let mut n = 0u64;
        // Chunks arrive a few KiB at a time; handing each to the consumer thread would wake it
        // (and this task) once per chunk. Gathered into pieces of PIECE_BYTES, the copy costs
        // less than the wake-ups it saves.
        let mut piece = bytes::BytesMut::with_capacity(PIECE_BYTES);
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport("GET", &url, &e))? {
            interrupt::check()?;
            n += chunk.len() as u64;
            if n > size {
                return Err(size_error(n));
            }
            if let Some(p) = &self.progress {
                p.moved(chunk.len() as u64);
            }
            piece.extend_from_slice(&chunk);
            if piece.len() >= PIECE_BYTES {
                let full =
                    std::mem::replace(&mut piece, bytes::BytesMut::with_capacity(PIECE_BYTES));
                if tx.send(Piece::Data(full.freeze())).await.is_err() {
                    return Ok(());
                }
            }
        }
        if n != size {
            return Err(size_error(n));
        }
        if !piece.is_empty() && tx.send(Piece::Data(piece.freeze())).await.is_err() {
            return Ok(());
        }
        let _ = tx.send(Piece::End).await;
        Ok(())
    }

    /// Reads blob `digest` (at most `cap` bytes, which must cover `size`) into memory.
    pub(crate) async fn fetch_small_blob(
        &self,
        digest: &Digest,
        size: u64,
        cap: u64,
        what: &str,
    ) -> Result<Vec<u8>, ImageError> {
        if size > cap {
            return Err(ImageError::TooLarge {
                what: what.to_owned(),
                name: digest.to_string(),
                size,
                limit: cap,
                location: self.url(&format!("blobs/{digest}")),
                setting: "--max-manifest-bytes",
            });
        }
        let mut out = Vec::with_capacity(size as usize);
        self.fetch_blob(digest, size, what, &mut out).await?;
        Ok(out)
    }

    /// Uploads a blob read from `body` (verified against `digest`/`size` as it is read, on a
    /// blocking thread) as one streamed upload, as docker and skopeo do: `POST` to open the
    /// session, one `PATCH` carrying the whole body as it is read, then `PUT ?digest=`, which
    /// the registry verifies too. One `PATCH` rather than `oci-client`'s 4 MiB chunks, each a
    /// request the registry answers (and records the hash state of) before the next is sent.
    /// `session`: an upload session already opened (by a mount request the registry answered
    /// with one), else a new one is opened.
    pub(crate) async fn upload_blob(
        &self,
        digest: &Digest,
        size: u64,
        body: VerifyingReader<Box<dyn Read + Send>>,
        session: Option<String>,
    ) -> Result<(), ImageError> {
        let start_url = self.url("blobs/uploads/");
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, io::Error>>(4);
        let local = start_url.clone();
        // Reading and hashing the file happen on a blocking thread, off the network task.
        let producer = tokio::task::spawn_blocking(move || produce(body, size, &local, &tx));

        let location = match session {
            Some(l) => l,
            None => {
                self.upload_location("POST", &start_url, || {
                    self.http
                        .post(&start_url)
                        .header(reqwest::header::CONTENT_LENGTH, "0")
                })
                .await?
            }
        };
        // Progress counts a piece when the connection takes it from the body, not when it is
        // read from the file: the pieces queued between the two are not sent yet.
        let progress = self.progress.clone();
        let body = reqwest::Body::wrap_stream(futures_util::stream::poll_fn(move |cx| {
            let next = rx.poll_recv(cx);
            if let (std::task::Poll::Ready(Some(Ok(piece))), Some(p)) = (&next, &progress) {
                p.moved(piece.len() as u64);
            }
            next
        }));
        let patched = self
            .upload_location("PATCH", &location, || {
                self.http
                    .patch(&location)
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .header(reqwest::header::CONTENT_LENGTH, size.to_string())
                    .body(body)
            })
            .await;
        let produced = producer
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        // A local read or verification error explains a failed PATCH; check it first.
        produced?;
        let location = patched?;
        let mut put = reqwest::Url::parse(&location).map_err(|e| ImageError::Transport {
            method: "PUT",
            url: location.clone(),
            reason: e.to_string(),
        })?;
        put.query_pairs_mut().append_pair("digest", digest.as_str());
        let put = put.to_string();
        let resp = self
            .with_auth(
                self.http
                    .put(&put)
                    .header(reqwest::header::CONTENT_LENGTH, "0"),
            )
            .send()
            .await
            .map_err(|e| transport("PUT", &put, &e))?;
        let status = resp.status().as_u16();
        if status != 201 {
            return Err(self.status_error("PUT", &put, status, resp).await);
        }
        Ok(())
    }

    /// `POST /blobs/uploads/?mount=<digest>&from=<repository>`: asks the registry to link a
    /// blob it holds in another repository into this one. 201 is a mount; 202 is an upload
    /// session instead (the registry lacks the blob there, or does not mount); a refusal
    /// (401/403/404: no pull access to `from`) is treated as "not mounted", so the caller
    /// uploads as it would have.
    pub(crate) async fn mount_blob(
        &self,
        digest: &Digest,
        from: &str,
    ) -> Result<Mount, ImageError> {
        let mut url = reqwest::Url::parse(&self.url("blobs/uploads/")).map_err(|e| {
            ImageError::Transport {
                method: "POST",
                url: self.url("blobs/uploads/"),
                reason: e.to_string(),
            }
        })?;
        url.query_pairs_mut()
            .append_pair("mount", digest.as_str())
            .append_pair("from", from);
        let shown = url.to_string();
        let resp = self
            .with_auth(
                self.http
                    .post(url)
                    .header(reqwest::header::CONTENT_LENGTH, "0"),
            )
            .send()
            .await
            .map_err(|e| transport("POST", &shown, &e))?;
        match resp.status().as_u16() {
            201 => Ok(Mount::Mounted),
            202 => {
                let location = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|l| resp.url().join(l).ok());
                match location {
                    Some(l) => Ok(Mount::Upload(l.to_string())),
                    None => Err(ImageError::Registry {
                        method: "POST",
                        url: shown,
                        status: 202,
                        code: None,
                        message: "no Location header in the upload response".into(),
                    }),
                }
            }
            401 | 403 | 404 => {
                tracing::debug!(digest = %digest, from, "registry refused the mount; uploading");
                self.upload_location("POST", &self.url("blobs/uploads/"), || {
                    self.http
                        .post(self.url("blobs/uploads/"))
                        .header(reqwest::header::CONTENT_LENGTH, "0")
                })
                .await
                .map(Mount::Upload)
            }
            status => Err(self.status_error("POST", &shown, status, resp).await),
        }
    }

    /// Sends one upload request and returns the absolute `Location` it answered with.
    async fn upload_location(
        &self,
        method: &'static str,
        url: &str,
        request: impl FnOnce() -> reqwest::RequestBuilder,
    ) -> Result<String, ImageError> {
        let resp = self
            .with_auth(request())
            .send()
            .await
            .map_err(|e| transport(method, url, &e))?;
        let status = resp.status().as_u16();
        if status != 202 {
            return Err(self.status_error(method, url, status, resp).await);
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ImageError::Registry {
                method,
                url: url.to_owned(),
                status,
                code: None,
                message: "no Location header in the upload response".into(),
            })?;
        // Relative locations are relative to the registry.
        resp.url()
            .join(location)
            .map(|u| u.to_string())
            .map_err(|e| ImageError::Transport {
                method,
                url: url.to_owned(),
                reason: format!("Location {location:?}: {e}"),
            })
    }

    /// `PUT /manifests/<tag or digest>` with exactly `bytes`; the registry must store it under
    /// the digest we computed.
    pub(crate) async fn put_manifest(
        &self,
        tag_or_digest: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Digest, ImageError> {
        let url = self.url(&format!("manifests/{tag_or_digest}"));
        let r = self.oci_ref(tag_or_digest);
        let content_type: reqwest::header::HeaderValue = media_type
            .parse()
            .map_err(|_| ImageError::invalid("media type", media_type, "not a header value"))?;
        self.oci
            .push_manifest_raw(&r, bytes.to_vec(), content_type)
            .await
            .map_err(|e| self.oci_error("PUT", &url, e))?;
        Ok(Digest::of(bytes))
    }

    fn oci_error(&self, method: &'static str, url: &str, e: OciDistributionError) -> ImageError {
        match e {
            OciDistributionError::UnauthorizedError { url } => ImageError::AuthRequired {
                method,
                url,
                hint: self.auth_hint.clone(),
            },
            OciDistributionError::AuthenticationFailure(reason) => ImageError::AuthFailed {
                registry: self.reference.registry.clone(),
                reason,
                hint: self.auth_hint.clone(),
            },
            OciDistributionError::RegistryError { envelope, url } => {
                let first = envelope.errors.first();
                ImageError::Registry {
                    method,
                    url,
                    status: 0,
                    code: first.map(|e| {
                        serde_json::to_value(&e.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_else(|| format!("{:?}", e.code))
                    }),
                    message: first.map(|e| e.message.clone()).unwrap_or_default(),
                }
            }
            OciDistributionError::ServerError { code, url, message } => {
                let (c, m) = parse_error_body(&message);
                if code == 401 {
                    return ImageError::AuthRequired {
                        method,
                        url,
                        hint: self.auth_hint.clone(),
                    };
                }
                ImageError::Registry {
                    method,
                    url,
                    status: code,
                    code: c,
                    message: m,
                }
            }
            OciDistributionError::RequestError(e) => {
                if e.status().map(|s| s.as_u16()) == Some(401) {
                    return ImageError::AuthRequired {
                        method,
                        url: url.to_owned(),
                        hint: self.auth_hint.clone(),
                    };
                }
                match e.status() {
                    Some(s) => ImageError::Registry {
                        method,
                        url: url.to_owned(),
                        status: s.as_u16(),
                        code: None,
                        message: String::new(),
                    },
                    None => transport(method, url, &e),
                }
            }
            other => ImageError::Transport {
                method,
                url: url.to_owned(),
                reason: chain(&other),
            },
        }
    }
}

/// Reads `body` in [`UPLOAD_CHUNK`] pieces into `tx` (the upload's request body), then checks
/// its digest before ending the body: a local file that does not match fails the request
/// instead of completing it. A local error is sent as the body's error (which aborts the
/// request) and returned whole.
fn produce(
    mut body: VerifyingReader<Box<dyn Read + Send>>,
    size: u64,
    location: &str,
    tx: &tokio::sync::mpsc::Sender<Result<bytes::Bytes, io::Error>>,
) -> Result<u64, ImageError> {
    let fail = |err: ImageError| {
        let _ = tx.blocking_send(Err(io::Error::other(err.to_string())));
        Err(err)
    };
    let mut sent = 0u64;
    loop {
        if interrupt::requested() {
            return fail(ImageError::Interrupted);
        }
        let want = UPLOAD_CHUNK.min((size - sent.min(size)) as usize + 1);
        let mut buf = bytes::BytesMut::zeroed(want.max(1));
        let mut filled = 0;
        while filled < buf.len() {
            match body.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(k) => filled += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return fail(super::super::digest::io_to_image(e, location)),
            }
        }
        if filled == 0 {
            break;
        }
        buf.truncate(filled);
        sent += filled as u64;
        if tx.blocking_send(Ok(buf.freeze())).is_err() {
            // The upload stopped; its error says why.
            return Ok(sent);
        }
    }
    // Local corruption would also make the registry refuse the upload; checking here names
    // the local file rather than a registry error code, and keeps the request from completing.
    if let Err(err) = body.finish() {
        return fail(err);
    }
    Ok(sent)
}

/// An error and its sources, `: `-separated (TLS failures hide the useful part in a source).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

fn transport(method: &'static str, url: &str, e: &dyn std::error::Error) -> ImageError {
    ImageError::Transport {
        method,
        url: url.to_owned(),
        reason: chain(e),
    }
}

/// First error of a distribution-spec error body, or the raw body (trimmed) when it is not one.
pub(crate) fn parse_error_body(body: &str) -> (Option<String>, String) {
    #[derive(serde::Deserialize)]
    struct Body {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: Option<String>,
        message: Option<String>,
        detail: Option<serde_json::Value>,
    }
    if let Ok(b) = serde_json::from_str::<Body>(body) {
        if let Some(e) = b.errors.into_iter().next() {
            let mut msg = e.message.unwrap_or_default();
            if let Some(d) = e.detail.filter(|d| !d.is_null()) {
                msg.push_str(&format!(" ({d})"));
            }
            return (e.code, msg);
        }
    }
    (None, body.trim().chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies() {
        let (c, m) = parse_error_body(
            r#"{"errors":[{"code":"DIGEST_INVALID","message":"provided digest did not match uploaded content","detail":null}]}"#,
        );
        assert_eq!(c.as_deref(), Some("DIGEST_INVALID"));
        assert_eq!(m, "provided digest did not match uploaded content");
        let (c, m) = parse_error_body("  404 page not found\n");
        assert_eq!(c, None);
        assert_eq!(m, "404 page not found");
    }

    #[test]
    fn ca_bundles_are_split_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate").unwrap();
        let err = load_ca_files(&[empty]).err().unwrap();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }
}
