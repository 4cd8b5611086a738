//! One session with one repository of an OCI distribution registry, on top of `oci-client`.
//!
//! `oci-client` does the protocol work: the `/v2/` challenge and token exchange (Basic or
//! Bearer), blob existence checks, chunked blob uploads, manifest uploads of the exact bytes we
//! hashed (`push_manifest_raw`) and blob downloads as streams. This module adds what a
//! checkpoint on a node needs on top:
//!
//! - **Caps.** Manifests and indexes are read by our own `GET` (same TLS roots, same token), a
//!   chunk at a time, and refused once they pass `max_manifest_bytes`: `oci-client`'s
//!   `pull_manifest_raw` buffers a body of any size before anyone can look at it. Blobs are
//!   refused when their descriptor is over the cap, when the registry announces a different
//!   length, and as soon as one byte more than the descriptor's size arrives.
//! - **Our own digest check while streaming.** Every chunk is hashed as it is written to a
//!   scratch file; the result is compared with the descriptor whatever the library's own
//!   end-of-stream check says (and its stream is read with `try_next`, so an error ends it).
//!   Descriptors are passed with `urls: None`: foreign URLs are never fetched. A redirect (to
//!   blob storage, or anywhere) is followed, and the bytes it serves are held to the same
//!   digest.
//! - **Errors that say what to do**, with the registry's own error code when it sent one.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
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

/// Size of the pieces a blob upload is read and sent in (one `PATCH` each).
const UPLOAD_CHUNK: usize = 4 << 20;

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
        let r = self.any_ref();
        let no_urls = None;
        let layer = oci_client::client::LayerDescriptor {
            digest: digest.as_str(),
            urls: &no_urls,
        };
        let mut stream = self
            .oci
            .pull_blob_stream(&r, &layer)
            .await
            .map_err(|e| self.oci_error("GET", &url, e))?;
        let size_error = |actual| ImageError::SizeMismatch {
            what: what.to_owned(),
            digest: digest.clone(),
            expected: size,
            actual,
            location: url.clone(),
        };
        if let Some(len) = stream.content_length {
            if len != size {
                return Err(size_error(len));
            }
        }
        let mut hasher = Sha256::new();
        let mut n = 0u64;
        loop {
            interrupt::check()?;
            let chunk = match stream.stream.try_next().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                // The library's end-of-stream digest check, or a transport error. With every
                // byte in, our own hash says which.
                Err(e) => {
                    if n == size {
                        let actual = Digest::from_hash(&hasher.finalize());
                        if actual != *digest {
                            return Err(ImageError::DigestMismatch {
                                what: what.to_owned(),
                                expected: digest.clone(),
                                actual,
                                location: url,
                            });
                        }
                    }
                    return Err(ImageError::Transport {
                        method: "GET",
                        url,
                        reason: chain(&e),
                    });
                }
            };
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

    /// Uploads a blob read from `body` (verified against `digest`/`size` as it is read) with
    /// chunked `PATCH`es and a final `PUT ?digest=`, which the registry verifies too.
    pub(crate) async fn upload_blob(
        &self,
        digest: &Digest,
        size: u64,
        mut body: VerifyingReader<Box<dyn Read>>,
    ) -> Result<(), ImageError> {
        let url = self.url("blobs/uploads/");
        let r = self.any_ref();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, OciDistributionError>>(2);
        let local = url.clone();
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        // The file is read on this task while the upload runs on the same (current-thread)
        // runtime; a local read error is kept whole here and sent to the upload as a failure.
        let produce = async move {
            let mut sent = 0u64;
            loop {
                if interrupt::requested() {
                    let _ = tx
                        .send(Err(OciDistributionError::GenericError(Some(
                            "interrupted".into(),
                        ))))
                        .await;
                    return Err(ImageError::Interrupted);
                }
                let mut buf = vec![0u8; UPLOAD_CHUNK];
                let mut filled = 0;
                while filled < buf.len() {
                    match body.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(k) => filled += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let err = super::super::digest::io_to_image(e, &local);
                            let _ = tx
                                .send(Err(OciDistributionError::GenericError(Some(
                                    err.to_string(),
                                ))))
                                .await;
                            return Err(err);
                        }
                    }
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                sent += filled as u64;
                if tx.send(Ok(bytes::Bytes::from(buf))).await.is_err() {
                    // The upload stopped; its error says why.
                    return Ok(sent);
                }
            }
            // Local corruption would also make the registry refuse the upload; checking here
            // names the local file rather than a registry error code.
            if let Err(err) = body.finish() {
                let _ = tx
                    .send(Err(OciDistributionError::GenericError(Some(
                        err.to_string(),
                    ))))
                    .await;
                return Err(err);
            }
            Ok(sent)
        };
        let upload = self
            .oci
            .push_blob_stream(&r, stream, digest.as_str(), Some(size));
        let (uploaded, produced) = tokio::join!(upload, produce);
        produced?;
        uploaded.map_err(|e| self.oci_error("PUT", &url, e))?;
        Ok(())
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
