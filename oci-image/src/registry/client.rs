//! A minimal OCI distribution-spec client over blocking HTTP (ureq, no TLS).
//!
//! Only what push and pull need: `HEAD` blob, monolithic upload (`POST` then `PUT ?digest=`),
//! manifest `PUT` / `GET`, blob `GET`. Error bodies (`{"errors":[{"code","message"}]}`) are
//! surfaced in [`ImageError::Registry`].

use std::io::Read;
use std::time::Duration;

use super::super::digest::Digest;
use super::super::error::ImageError;
use super::super::spec::{
    DOCKER_MEDIA_TYPE_MANIFEST, DOCKER_MEDIA_TYPE_MANIFEST_LIST, MAX_JSON_BYTES, MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
};
use super::reference::Reference;
use super::RegistryOptions;

pub(crate) struct Client {
    agent: ureq::Agent,
    base: String,
    repo: String,
}

/// A fetched manifest (or index) document.
pub(crate) struct FetchedManifest {
    pub bytes: Vec<u8>,
    pub content_type: Option<String>,
    /// `Docker-Content-Digest`, when the registry sent it.
    pub digest_header: Option<String>,
}

fn accept_manifests() -> String {
    [
        MEDIA_TYPE_INDEX,
        MEDIA_TYPE_MANIFEST,
        DOCKER_MEDIA_TYPE_MANIFEST_LIST,
        DOCKER_MEDIA_TYPE_MANIFEST,
    ]
    .join(", ")
}

impl Client {
    pub(crate) fn new(r: &Reference, opts: &RegistryOptions) -> Result<Client, ImageError> {
        if !r.plain_http {
            return Err(ImageError::TlsUnsupported {
                reference: r.to_string(),
            });
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            // Per socket operation, not per request: a multi-GB layer may take minutes overall.
            .timeout_read(opts.io_timeout)
            .timeout_write(opts.io_timeout)
            .user_agent(concat!("gpusnap/", env!("CARGO_PKG_VERSION")))
            // Proxies from the environment are wrong for a loopback/insecure registry.
            .try_proxy_from_env(false)
            .build();
        Ok(Client {
            agent,
            base: r.base_url(),
            repo: r.repository.clone(),
        })
    }

    fn url(&self, rest: &str) -> String {
        format!("{}/v2/{}/{rest}", self.base, self.repo)
    }

    /// `GET /v2/`: fails early, with a clear error, when the endpoint is not a registry or wants
    /// credentials.
    pub(crate) fn ping(&self) -> Result<(), ImageError> {
        let url = format!("{}/v2/", self.base);
        self.agent
            .get(&url)
            .call()
            .map(drop)
            .map_err(|e| map_err("GET", &url, e))
    }

    pub(crate) fn blob_exists(&self, digest: &Digest) -> Result<bool, ImageError> {
        let url = self.url(&format!("blobs/{digest}"));
        match self.agent.head(&url).call() {
            Ok(_) => Ok(true),
            Err(ureq::Error::Status(404, _)) => Ok(false),
            Err(e) => Err(map_err("HEAD", &url, e)),
        }
    }

    /// Monolithic upload: `POST` opens an upload session, one `PUT` sends all bytes and the
    /// digest the registry must verify before it accepts the blob.
    pub(crate) fn upload_blob(
        &self,
        digest: &Digest,
        size: u64,
        body: &mut dyn Read,
    ) -> Result<(), ImageError> {
        let url = self.url("blobs/uploads/");
        let resp = self
            .agent
            .post(&url)
            .set("Content-Length", "0")
            .call()
            .map_err(|e| map_err("POST", &url, e))?;
        let location = resp
            .header("Location")
            .ok_or_else(|| ImageError::Registry {
                method: "POST",
                url: url.clone(),
                status: resp.status(),
                code: None,
                message: "no Location header in the upload response".into(),
            })?;
        let mut put_url = self.absolute(location);
        put_url.push(if put_url.contains('?') { '&' } else { '?' });
        put_url.push_str("digest=");
        put_url.push_str(&digest.as_str().replace(':', "%3A"));
        self.agent
            .put(&put_url)
            .set("Content-Type", "application/octet-stream")
            .set("Content-Length", &size.to_string())
            .send(body)
            .map_err(|e| map_err("PUT", &put_url, e))?;
        Ok(())
    }

    /// Location headers may be absolute or server-relative.
    fn absolute(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            location.to_owned()
        } else if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            format!("{}/{location}", self.base)
        }
    }

    /// `PUT /manifests/<reference>`; returns the registry's `Docker-Content-Digest`.
    pub(crate) fn put_manifest(
        &self,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Option<String>, ImageError> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self
            .agent
            .put(&url)
            .set("Content-Type", media_type)
            .send_bytes(bytes)
            .map_err(|e| map_err("PUT", &url, e))?;
        Ok(resp.header("Docker-Content-Digest").map(str::to_owned))
    }

    pub(crate) fn get_manifest(&self, reference: &str) -> Result<FetchedManifest, ImageError> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self
            .agent
            .get(&url)
            .set("Accept", &accept_manifests())
            .call()
            .map_err(|e| map_err("GET", &url, e))?;
        let content_type = resp
            .header("Content-Type")
            .map(|c| c.split(';').next().unwrap_or(c).trim().to_owned());
        let digest_header = resp.header("Docker-Content-Digest").map(str::to_owned);
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| transport("GET", &url, e))?;
        if bytes.len() as u64 > MAX_JSON_BYTES {
            return Err(ImageError::malformed(
                "manifest",
                url,
                "larger than any real manifest",
            ));
        }
        Ok(FetchedManifest {
            bytes,
            content_type,
            digest_header,
        })
    }

    /// `GET /blobs/<digest>` as a stream (redirects to blob storage are followed).
    pub(crate) fn get_blob(&self, digest: &Digest) -> Result<Box<dyn Read + Send>, ImageError> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| map_err("GET", &url, e))?;
        Ok(resp.into_reader())
    }

    pub(crate) fn blob_url(&self, digest: &Digest) -> String {
        self.url(&format!("blobs/{digest}"))
    }
}

fn transport(method: &'static str, url: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Transport {
        method,
        url: url.to_owned(),
        reason: e.to_string(),
    }
}

fn map_err(method: &'static str, url: &str, e: ureq::Error) -> ImageError {
    match e {
        ureq::Error::Status(401, _) => ImageError::AuthRequired {
            method,
            url: url.to_owned(),
        },
        ureq::Error::Status(status, resp) => {
            let body = resp.into_string().unwrap_or_default();
            let (code, message) = parse_error_body(&body);
            ImageError::Registry {
                method,
                url: url.to_owned(),
                status,
                code,
                message,
            }
        }
        ureq::Error::Transport(t) => transport(method, url, t),
    }
}

/// First error of a distribution-spec error body, or the raw body (trimmed) when it is not one.
fn parse_error_body(body: &str) -> (Option<String>, String) {
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
}
