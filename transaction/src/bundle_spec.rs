//! The runtime spec of a container's bundle (`<bundle>/config.json`): the one capped reader for
//! every rule that reads it — the shim's Create and checkpoint, the privilege bound, the
//! container record, the container's configuration, CRIU's config annotation, the cgroup path.
//! [`BundleSpec`] is the typed spec, read once per operation; [`read_bytes`] the capped bytes
//! under it.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Mount, Spec};

/// The largest `config.json` read. Real specs are a few KiB (a CRI spec with many mounts
/// and a seccomp profile stays under 100 KiB).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Why a bundle's spec could not be read; the callers name the path in their own words.
#[derive(Debug, thiserror::Error)]
pub enum SpecReadError {
    #[error("{0}")]
    Unreadable(#[source] io::Error),
    #[error("larger than {MAX_SPEC_BYTES} bytes")]
    TooLarge,
}

/// Why a bundle's spec could not be read as a runtime spec.
#[derive(Debug, thiserror::Error)]
pub enum BundleSpecError {
    #[error(transparent)]
    Read(#[from] SpecReadError),
    /// Read, but not an OCI runtime spec (the callers say what they read).
    #[error("{0}")]
    Invalid(#[source] serde_json::Error),
}

/// `<bundle>/config.json`.
pub fn path(bundle: &Path) -> PathBuf {
    bundle.join("config.json")
}

/// The bytes of `<bundle>/config.json`, at most [`MAX_SPEC_BYTES`] of them.
pub fn read_bytes(bundle: &Path) -> Result<Vec<u8>, SpecReadError> {
    let file = std::fs::File::open(path(bundle)).map_err(SpecReadError::Unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(SpecReadError::Unreadable)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(SpecReadError::TooLarge);
    }
    Ok(bytes)
}

/// The CRI annotation that says whether a container is a pod's sandbox or one of its
/// containers.
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The CRI annotation that names the pod's sandbox.
const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// A bundle's runtime spec, typed: read once per operation and asked what the doors need.
#[derive(Debug, Clone)]
pub struct BundleSpec {
    spec: Spec,
}

impl BundleSpec {
    /// Reads and parses `<bundle>/config.json` (capped, [`read_bytes`]).
    pub fn read(bundle: &Path) -> Result<Self, BundleSpecError> {
        Self::from_bytes(&read_bytes(bundle)?).map_err(BundleSpecError::Invalid)
    }

    /// Parses a spec already read (with [`read_bytes`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes).map(|spec| Self { spec })
    }

    /// The whole spec.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn into_spec(self) -> Spec {
        self.spec
    }

    /// The spec's annotations (CRI puts the pod's `pod_annotations` there); none when it has
    /// none.
    pub fn annotations(&self) -> HashMap<String, String> {
        self.spec.annotations().clone().unwrap_or_default()
    }

    /// One annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.spec
            .annotations()
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// The spec's mounts, in order (the last one at a destination is what the container sees).
    pub fn mounts(&self) -> &[Mount] {
        self.spec.mounts().as_deref().unwrap_or_default()
    }

    /// Whether the container gets a PID namespace of its own: a `pid` namespace entry without
    /// a path. Without one (the pod's, the host's, another container's) its processes can
    /// outlive its init, as containerd-shim-runc-v2 decides (`ShouldKillAllOnExit`).
    pub fn has_own_pid_namespace(&self) -> bool {
        let Some(namespaces) = self
            .spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
        else {
            return false;
        };
        namespaces.iter().any(|ns| {
            ns.typ() == LinuxNamespaceType::Pid
                && ns.path().as_ref().is_none_or(|p| p.as_os_str().is_empty())
        })
    }

    /// Whether the spec gives the container NVIDIA devices (`/dev/nvidia*`).
    pub fn has_nvidia_devices(&self) -> bool {
        self.spec
            .linux()
            .as_ref()
            .and_then(|l| l.devices().as_ref())
            .is_some_and(|devices| {
                devices
                    .iter()
                    .any(|d| d.path().to_string_lossy().starts_with("/dev/nvidia"))
            })
    }

    /// Whether the container's process gets a terminal (`process.terminal`).
    pub fn terminal(&self) -> bool {
        self.spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false)
    }

    /// Whether CRI made this container as one of a pod's containers (not its sandbox).
    pub fn is_cri_container(&self) -> bool {
        self.annotation(CRI_CONTAINER_TYPE) == Some("container")
    }

    /// The pod sandbox CRI put this container in, when it did.
    pub fn cri_sandbox_id(&self) -> Option<&str> {
        self.annotation(CRI_SANDBOX_ID).filter(|s| !s.is_empty())
    }
}

/// One of the spec's `mounts`, as the runtime wrote it (fields it left out are empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecMount {
    pub destination: String,
    pub source: String,
    /// The mount's `type`.
    pub kind: String,
    pub options: Vec<String>,
}

impl SpecMount {
    /// The `mounts` of a container's typed runtime spec, in order (fields it left out are
    /// empty, and match nothing).
    pub fn of(spec: &BundleSpec) -> Vec<SpecMount> {
        spec.mounts().iter().map(SpecMount::from).collect()
    }
}

impl From<&Mount> for SpecMount {
    fn from(m: &Mount) -> SpecMount {
        SpecMount {
            destination: m.destination().to_string_lossy().into_owned(),
            source: m
                .source()
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind: m.typ().clone().unwrap_or_default(),
            options: m.options().clone().unwrap_or_default(),
        }
    }
}

/// The annotations of a spec's bytes, read leniently: only the `annotations` object, whatever
/// the rest holds. For a spec [`BundleSpec`] cannot type but runc may still run (a capability
/// name newer than oci-spec's list): the annotations choose the pod's settings and its restore,
/// and must not be lost with the rest. `None` when the bytes are not JSON or the member is not
/// a map of strings.
pub fn annotations_of(bytes: &[u8]) -> Option<HashMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct AnnotationsOnly {
        #[serde(default)]
        annotations: HashMap<String, String>,
    }
    serde_json::from_slice::<AnnotationsOnly>(bytes)
        .ok()
        .map(|a| a.annotations)
}

/// A bundle's spec as a door reads it at create: typed when oci-spec's types take it, and its
/// annotations either way.
#[derive(Debug, Clone, Default)]
pub struct SpecAtCreate {
    /// `None`: the types refuse it (a capability newer than oci-spec's list, which runc may
    /// still run), or it cannot be read at all (runc then refuses it itself).
    pub typed: Option<BundleSpec>,
    /// The spec's annotations: they choose the pod's settings and its restore, and are kept
    /// even when the rest cannot be typed, so that nothing they ask for is dropped silently.
    pub annotations: HashMap<String, String>,
}

impl SpecAtCreate {
    /// Reads `<bundle>/config.json` once (capped). What cannot be read, or is not JSON with a
    /// map of string annotations, has none: runc reports such a spec in its own words.
    pub fn read(bundle: &Path) -> Self {
        let bytes = match read_bytes(bundle) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(bundle = %bundle.display(), error = %e, "the bundle's config.json is not readable");
                return Self::default();
            }
        };
        match BundleSpec::from_bytes(&bytes) {
            Ok(spec) => SpecAtCreate {
                annotations: spec.annotations(),
                typed: Some(spec),
            },
            Err(e) => {
                tracing::warn!(bundle = %bundle.display(), error = %e, "the bundle's config.json is not an OCI runtime spec gpusnap can type; only its annotations are read");
                SpecAtCreate {
                    typed: None,
                    annotations: annotations_of(&bytes).unwrap_or_default(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_read_whole_up_to_the_cap_and_refused_past_it() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_bytes(d.path()),
            Err(SpecReadError::Unreadable(_))
        ));
        std::fs::write(path(d.path()), b"{\"ociVersion\":\"1.0.2\"}").unwrap();
        assert_eq!(read_bytes(d.path()).unwrap(), b"{\"ociVersion\":\"1.0.2\"}");
        let f = std::fs::File::create(path(d.path())).unwrap();
        f.set_len(MAX_SPEC_BYTES + 1).unwrap();
        assert!(matches!(read_bytes(d.path()), Err(SpecReadError::TooLarge)));
    }

    fn spec(json: serde_json::Value) -> BundleSpec {
        BundleSpec::from_bytes(&serde_json::to_vec(&json).unwrap()).unwrap()
    }

    #[test]
    fn kill_all_on_exit_unless_the_container_has_its_own_pid_namespace() {
        let own = spec(
            serde_json::json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}}),
        );
        assert!(own.has_own_pid_namespace());
        let joined = spec(
            serde_json::json!({"linux": {"namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}]}}),
        );
        assert!(!joined.has_own_pid_namespace());
        let host = spec(serde_json::json!({"linux": {"namespaces": [{"type": "mount"}]}}));
        assert!(!host.has_own_pid_namespace());
        assert!(!spec(serde_json::json!({})).has_own_pid_namespace());
    }

    #[test]
    fn a_partial_spec_is_read_and_asked() {
        let s = spec(serde_json::json!({
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-id": "s1",
            },
            "mounts": [{"destination": "/etc/hosts", "source": "/x/sandboxes/s1/hosts"}],
            "linux": {
                "cgroupsPath": "kubepods-besteffort.slice:cri-containerd:c1",
                "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
            },
        }));
        assert!(s.is_cri_container());
        assert_eq!(s.cri_sandbox_id(), Some("s1"));
        assert_eq!(s.annotations().len(), 2);
        assert_eq!(s.mounts().len(), 1);
        assert!(s.has_nvidia_devices());
        let none = spec(serde_json::json!({"ociVersion": "1.1.0"}));
        assert!(none.annotations().is_empty() && none.mounts().is_empty());
        assert!(!none.has_nvidia_devices() && !none.is_cri_container());
        assert!(BundleSpec::from_bytes(b"not json").is_err());
        let d = tempfile::tempdir().unwrap();
        std::fs::write(path(d.path()), b"{\"mounts\": 1}").unwrap();
        assert!(matches!(
            BundleSpec::read(d.path()),
            Err(BundleSpecError::Invalid(_))
        ));
    }

    #[test]
    fn a_spec_the_types_refuse_still_gives_its_annotations() {
        let bytes = serde_json::to_vec(&serde_json::json!({
            "annotations": {"gpusnap.io/restore-from": "ck"},
            "process": {"capabilities": {"bounding": ["CAP_NOT_YET_KNOWN"]}},
        }))
        .unwrap();
        assert!(BundleSpec::from_bytes(&bytes).is_err());
        let a = annotations_of(&bytes).unwrap();
        assert_eq!(
            a.get("gpusnap.io/restore-from").map(String::as_str),
            Some("ck")
        );
        assert!(annotations_of(b"{\"annotations\": 1}").is_none());
        assert!(annotations_of(b"{}").is_some_and(|a| a.is_empty()));
    }

    /// What `runc spec` writes, as containerd and Podman build on it: accepted whole.
    #[test]
    fn a_runc_default_spec_is_accepted() {
        let s = BundleSpec::from_bytes(RUNC_SPEC.as_bytes()).unwrap();
        assert!(s.has_own_pid_namespace());
        assert!(!s.has_nvidia_devices());
    }

    const RUNC_SPEC: &str = r#"{
        "ociVersion": "1.2.0",
        "process": {
            "terminal": true, "user": {"uid": 0, "gid": 0}, "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "runc",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
        ],
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                           {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}],
            "maskedPaths": ["/proc/acpi", "/proc/kcore"],
            "readonlyPaths": ["/proc/bus", "/proc/sys"]
        }
    }"#;
}
