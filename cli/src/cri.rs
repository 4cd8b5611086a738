//! What containerd (or any CRI runtime) says over its socket: whether it answers, its release,
//! and the runtime handlers it has loaded. `gpusnap doctor` and the installer's readiness ask
//! this rather than looking at files: a config on disk says nothing about what the running
//! daemon loaded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{StatusRequest, VersionRequest};
use tonic::transport::{Endpoint, Uri};

/// containerd's socket on a stock node.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// What the runtime answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeFacts {
    /// `containerd`, `cri-o`.
    pub runtime_name: String,
    pub runtime_version: String,
    /// Handlers of its RuntimeClass support (CRI `Status.runtime_handlers`, containerd ≥ 2.0),
    /// else the names of the `containerd.runtimes` table its verbose status shows.
    pub handlers: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("no socket at {}", .0.display())]
    NoSocket(PathBuf),
    #[error("{} did not answer: {reason}", socket.display())]
    NoAnswer { socket: PathBuf, reason: String },
}

/// Asks the CRI runtime at `socket` for its version and status, each call bounded by `timeout`.
pub fn query(socket: &Path, timeout: Duration) -> Result<RuntimeFacts, CriError> {
    if !socket.exists() {
        return Err(CriError::NoSocket(socket.to_path_buf()));
    }
    let no_answer = |reason: String| CriError::NoAnswer {
        socket: socket.to_path_buf(),
        reason,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| no_answer(format!("tokio runtime: {e}")))?;
    let path = socket.to_path_buf();
    rt.block_on(async move {
        let ask = async {
            let channel = Endpoint::try_from("http://[::]:0")
                .map_err(|e| e.to_string())?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let mut client = RuntimeServiceClient::new(channel);
            let version = client
                .version(VersionRequest::default())
                .await
                .map_err(|s| format!("Version: {}", s.message()))?
                .into_inner();
            let status = client
                .status(StatusRequest { verbose: true })
                .await
                .map_err(|s| format!("Status: {}", s.message()))?
                .into_inner();
            let mut handlers: Vec<String> = status
                .runtime_handlers
                .iter()
                .map(|h| h.name.clone())
                .collect();
            if handlers.is_empty() {
                handlers = configured_runtimes(status.info.get("config").map(String::as_str));
            }
            Ok::<_, String>(RuntimeFacts {
                runtime_name: version.runtime_name,
                runtime_version: version.runtime_version,
                handlers,
            })
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(r) => r.map_err(no_answer),
            Err(_) => Err(no_answer(format!("no answer within {timeout:?}"))),
        }
    })
}

/// The runtime names of containerd's verbose CRI config (`containerd.runtimes`), for releases
/// that do not fill `runtime_handlers` (containerd 1.x).
fn configured_runtimes(config_json: Option<&str>) -> Vec<String> {
    let Some(v) = config_json.and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
    else {
        return Vec::new();
    };
    v.pointer("/containerd/runtimes")
        .and_then(serde_json::Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_from_verbose_config() {
        let c =
            r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{},"gpusnap":{}}}}"#;
        let mut got = configured_runtimes(Some(c));
        got.sort();
        assert_eq!(got, ["gpusnap", "runc"]);
        assert!(configured_runtimes(Some("not json")).is_empty());
        assert!(configured_runtimes(None).is_empty());
    }

    #[test]
    fn a_missing_socket_is_named() {
        let e = query(
            Path::new("/nonexistent/containerd.sock"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/containerd.sock"),
            "{e}"
        );
    }
}
