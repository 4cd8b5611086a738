//! The few Kubernetes API calls the installer makes with its service account: label its node
//! `gpusnap.io/ready`, see whether its DaemonSet is being deleted (an uninstall, not an
//! upgrade), tell a pod what became of its checkpoint push (an Event), and, from the chart's
//! pre-delete hook, delete the DaemonSet and clear the label the nodes still carry. Plain JSON
//! over HTTPS with the pod's token and CA: a client crate with the whole API's types would be
//! most of the binary for six requests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

/// The node label the installer sets while gpusnap works on the node; the RuntimeClass
/// schedules onto it.
pub const READY_LABEL: &str = "gpusnap.io/ready";
/// Where a pod finds its service account's token and CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The component the agent's events name as their source.
pub const EVENT_COMPONENT: &str = "gpusnap-agent";

/// An event about a pod.
#[derive(Debug, Clone)]
pub struct PodEvent<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    /// The pod's `metadata.uid`: `kubectl describe pod` lists only events that carry it.
    pub pod_uid: Option<&'a str>,
    pub warning: bool,
    /// CamelCase, e.g. `CheckpointPushed`.
    pub reason: &'a str,
    pub message: &'a str,
    pub node: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes API: {0}")]
    NotInCluster(String),
    #[error("{method} {url}: {reason}")]
    Request {
        method: &'static str,
        url: String,
        reason: String,
    },
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
}

/// The API server as a pod sees it.
pub struct Kube {
    base: String,
    token: String,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl Kube {
    /// From `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account files in `sa_dir`
    /// (`GPUSNAP_KUBE_API` overrides the address, for a test's API server).
    pub fn in_cluster(sa_dir: &Path) -> Result<Kube, KubeError> {
        let base = match std::env::var("GPUSNAP_KUBE_API") {
            Ok(url) => url.trim_end_matches('/').to_owned(),
            Err(_) => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
                    KubeError::NotInCluster("KUBERNETES_SERVICE_HOST is not set".into())
                })?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or("443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                format!("https://{host}:{port}")
            }
        };
        let read = |name: &str| -> Result<Vec<u8>, KubeError> {
            let p: PathBuf = sa_dir.join(name);
            std::fs::read(&p).map_err(|e| KubeError::NotInCluster(format!("{}: {e}", p.display())))
        };
        let token = String::from_utf8_lossy(&read("token")?).trim().to_owned();
        let ca = reqwest::Certificate::from_pem(&read("ca.crt")?)
            .map_err(|e| KubeError::NotInCluster(format!("ca.crt: {e}")))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .no_proxy()
            .tls_certs_only([ca])
            .build()
            .map_err(|e| KubeError::NotInCluster(format!("HTTP client: {e}")))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| KubeError::NotInCluster(format!("tokio runtime: {e}")))?;
        Ok(Kube {
            base,
            token,
            http,
            rt,
        })
    }

    fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<(&str, Value)>,
    ) -> Result<Option<Value>, KubeError> {
        let url = format!("{}{path}", self.base);
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut req = self.http.request(m, &url).bearer_auth(&self.token);
        if let Some((content_type, body)) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body.to_string());
        }
        self.rt.block_on(async {
            let resp = req.send().await.map_err(|e| KubeError::Request {
                method,
                url: url.clone(),
                reason: chain(&e),
            })?;
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            match status {
                404 => Ok(None),
                200..=299 => Ok(Some(serde_json::from_str(&text).unwrap_or(Value::Null))),
                _ => Err(KubeError::Status {
                    method,
                    url,
                    status,
                    body: text.chars().take(300).collect(),
                }),
            }
        })
    }

    /// Sets (`Some`) or removes (`None`) `label` on node `node` (a JSON merge patch).
    pub fn label_node(
        &self,
        node: &str,
        label: &str,
        value: Option<&str>,
    ) -> Result<(), KubeError> {
        let patch = json!({ "metadata": { "labels": { label: value } } });
        self.call(
            "PATCH",
            &format!("/api/v1/nodes/{node}"),
            Some(("application/merge-patch+json", patch)),
        )
        .map(drop)
    }

    /// Records `event` on its pod (a core/v1 Event, which `kubectl describe pod` and `kubectl
    /// get events` show).
    pub fn post_event(&self, event: &PodEvent<'_>) -> Result<(), KubeError> {
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        // The API server keeps messages of up to 1 KiB whole.
        let message: String = event.message.chars().take(1000).collect();
        let mut involved = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": event.namespace,
            "name": event.pod,
        });
        if let Some(uid) = event.pod_uid {
            involved["uid"] = json!(uid);
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": format!("{}.", event.pod),
                "namespace": event.namespace,
            },
            "involvedObject": involved,
            "type": if event.warning { "Warning" } else { "Normal" },
            "reason": event.reason,
            "message": message,
            "source": {"component": EVENT_COMPONENT, "host": event.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        });
        self.call(
            "POST",
            &format!("/api/v1/namespaces/{}/events", event.namespace),
            Some(("application/json", body)),
        )
        .map(drop)
    }

    /// Whether DaemonSet `ns/name` is gone or being deleted.
    pub fn daemonset_deleting(&self, ns: &str, name: &str) -> Result<bool, KubeError> {
        let ds = self.call(
            "GET",
            &format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"),
            None,
        )?;
        Ok(ds.is_none_or(|d| !d["metadata"]["deletionTimestamp"].is_null()))
    }

    /// Deletes DaemonSet `ns/name` in the foreground (it stays, marked, until its pods are
    /// gone) and waits up to `timeout` for it to be gone.
    pub fn delete_daemonset_and_wait(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<bool, KubeError> {
        let path = format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}");
        self.call(
            "DELETE",
            &path,
            Some((
                "application/json",
                json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}),
            )),
        )?;
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.call("GET", &path, None)?.is_none() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        Ok(false)
    }

    /// The nodes the pods of DaemonSet `ns/name` run on (its pods by the DaemonSet's own
    /// selector).
    pub fn daemonset_pod_nodes(&self, ns: &str, name: &str) -> Result<Vec<String>, KubeError> {
        let Some(ds) = self.call(
            "GET",
            &format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"),
            None,
        )?
        else {
            return Ok(Vec::new());
        };
        let selector: Vec<String> = ds["spec"]["selector"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}%3D{}", v.as_str().unwrap_or_default()))
            .collect();
        let pods = self
            .call(
                "GET",
                &format!(
                    "/api/v1/namespaces/{ns}/pods?labelSelector={}",
                    selector.join(",")
                ),
                None,
            )?
            .unwrap_or(Value::Null);
        let mut nodes: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .collect();
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }
}

/// An error and its sources, `: `-separated (TLS and connection failures hide the cause there).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}
