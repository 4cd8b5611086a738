//! One attempt at publishing an archive: built and pushed under its unique tag exactly as
//! `gpusnap image push ARCHIVE REF` does ([`gpusnap_oci_image::push_checkpoint`]: verified
//! against the sealed manifest, packs streamed from the archive, the small layers staged in a
//! scratch directory of the agent's), signed with the node's key when one is configured, then
//! the same image under the stable tag. The archive itself is only read.

use std::path::Path;

use gpusnap_config::Config;
use gpusnap_oci_image::{self as image, BuildOptions, Credentials, ImageError, RegistryOptions};

use super::archive::Archive;
use super::target::Target;

/// A published image.
#[derive(Debug, Clone)]
pub struct Published {
    pub references: Vec<String>,
    pub digest: String,
    pub signed: bool,
    pub bytes_uploaded: u64,
}

/// Why an attempt failed, and whether another may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The registry could not be reached, or answered 5xx/429/408: tried again later.
    Unreachable,
    /// The registry refused the node's credentials: not tried again until they change.
    Auth,
    /// The registry refused the image, or the archive cannot be published (altered after it
    /// was sealed, not a gpusnap checkpoint, a key that does not load): not tried again.
    Refused,
    /// The agent is stopping: the next agent takes the archive up again.
    Interrupted,
}

impl Failure {
    pub fn retryable(self) -> bool {
        matches!(self, Failure::Unreachable)
    }

    /// What the failure is, in a few words, for the status and the event.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Unreachable => "registry unreachable",
            Failure::Auth => "registry authentication failed",
            Failure::Refused => "refused",
            Failure::Interrupted => "interrupted",
        }
    }
}

fn classify(e: &ImageError) -> Failure {
    match e {
        ImageError::Transport { .. } => Failure::Unreachable,
        ImageError::Registry { status, .. } if *status >= 500 || matches!(status, 408 | 429) => {
            Failure::Unreachable
        }
        ImageError::AuthRequired { .. } | ImageError::AuthFailed { .. } => Failure::Auth,
        ImageError::Registry { status: 401, .. } => Failure::Auth,
        ImageError::Interrupted => Failure::Interrupted,
        _ => Failure::Refused,
    }
}

/// How the agent reaches registries: the node's CA files and credentials (the config's
/// `checkpoint.registry_*`), the node store for cross-repository mounts.
fn registry_options(cfg: &Config, plain_http: bool) -> RegistryOptions {
    let c = &cfg.checkpoint;
    RegistryOptions {
        plain_http,
        ca_files: c.registry_ca_files.clone(),
        credentials: match &c.registry_config {
            Some(p) => Credentials::DockerConfig(p.clone()),
            None => Credentials::Auto,
        },
        store: match crate::store_cmd::node_store(cfg) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "pushing without the node store");
                None
            }
        },
        ..RegistryOptions::default()
    }
}

/// Publishes `archive` to `target` (one attempt), staging in a new directory under
/// `scratch_root` that is removed before this returns.
pub fn publish(
    archive: &Archive,
    target: &Target,
    cfg: &Config,
    scratch_root: &Path,
) -> Result<Published, (Failure, String)> {
    let shown = |e: &dyn std::fmt::Display| {
        // The build reads the archive through its descriptor; messages name the archive.
        e.to_string().replace(
            &archive.fd_path().display().to_string(),
            &archive.path.display().to_string(),
        )
    };
    let scratch = tempfile::Builder::new()
        .prefix("push-")
        .tempdir_in(scratch_root)
        .map_err(|e| {
            (
                Failure::Refused,
                format!(
                    "creating a scratch directory in {}: {e}",
                    scratch_root.display()
                ),
            )
        })?;
    let layout = scratch.path().join("layout");
    let build = BuildOptions {
        annotations: target.annotations.clone(),
        chunking: Some(image::Chunking::default()),
        verify_checkpoint: true,
        ..BuildOptions::default()
    };
    let mut opts = registry_options(cfg, target.plain_http);
    opts.sign_key = cfg.checkpoint.signing_key.clone();
    let first = target.reference(&target.tags[0]);
    let (built, report) =
        image::push_checkpoint(&archive.fd_path(), &layout, &first, &build, &opts)
            .map_err(|e| (classify(&e), shown(&e)))?;
    let mut published = Published {
        references: vec![report.reference.clone()],
        digest: report.digest.to_string(),
        signed: report.signature.is_some(),
        bytes_uploaded: report.bytes_uploaded,
    };
    // The other tags name the same index: its blobs are all there now (nothing is read from
    // the archive again), and its signature is by digest.
    let again = RegistryOptions {
        image_name: Some(built.image_name.clone()),
        sign_key: None,
        store: None,
        ..opts
    };
    for tag in &target.tags[1..] {
        let r = image::push(&layout, &target.reference(tag), &again)
            .map_err(|e| (classify(&e), shown(&e)))?;
        if r.digest != report.digest {
            return Err((
                Failure::Refused,
                format!(
                    "{} points at {}, not at the {} just pushed",
                    r.reference, r.digest, report.digest
                ),
            ));
        }
        published.references.push(r.reference);
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_passing_trouble_is_retried() {
        let registry = |status| ImageError::Registry {
            method: "PUT",
            url: "u".into(),
            status,
            code: None,
            message: String::new(),
        };
        assert_eq!(
            classify(&ImageError::Transport {
                method: "GET",
                url: "u".into(),
                reason: "connection refused".into()
            }),
            Failure::Unreachable
        );
        assert_eq!(classify(&registry(503)), Failure::Unreachable);
        assert_eq!(classify(&registry(429)), Failure::Unreachable);
        assert_eq!(classify(&registry(400)), Failure::Refused);
        assert_eq!(classify(&registry(401)), Failure::Auth);
        assert_eq!(
            classify(&ImageError::AuthFailed {
                registry: "r".into(),
                reason: "x".into(),
                hint: "h".into()
            }),
            Failure::Auth
        );
        assert_eq!(classify(&ImageError::Interrupted), Failure::Interrupted);
        assert!(Failure::Unreachable.retryable());
        assert!(!Failure::Auth.retryable() && !Failure::Refused.retryable());
    }
}
