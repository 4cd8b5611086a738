//! The configuration types and their defaults.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::bytes::MIB;
use crate::destination::DestinationPattern;

/// gpusnap's configuration. Every table and field is optional in the file; missing ones take
/// the defaults below.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub storage: StorageConfig,
    pub cuda: CudaConfig,
    pub runc: RuncConfig,
    pub criu: CriuConfig,
    pub restore: RestoreConfig,
    pub checkpoint: CheckpointConfig,
    pub store: StoreConfig,
}

/// The node's content-addressed blob store, shared by every pull (gpusnap-node-store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Where blobs pulled onto this node are kept (root-owned, mode 0700).
    pub root: PathBuf,
    /// Garbage collection removes unreferenced blobs, least recently used first, until the
    /// store holds at most this much; accepts `107374182400` or `"100GiB"`. Referenced blobs
    /// (of images and checkpoints still on the node) are never removed.
    #[serde(deserialize_with = "crate::bytes::deserialize")]
    pub max_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            root: PathBuf::from("/var/lib/gpusnap/store"),
            max_bytes: 100 * crate::bytes::GIB,
        }
    }
}

/// What this node does to the checkpoints it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Private key (PKCS#8 PEM, ECDSA P-256 as cosign makes them; root-owned, mode 0600) the
    /// shim and gpusnap-runc sign every checkpoint's manifest with as soon as it is sealed
    /// (`gpusnap-manifest.json.sig`, what `cosign sign-blob` writes), and the node agent signs
    /// the images it pushes with (cosign). Unset: not signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_key: Option<PathBuf>,
    /// Where the node agent may push the CRI checkpoint archives of pods annotated
    /// `gpusnap.io/checkpoint-to: REGISTRY/REPOSITORY`: `[http://]REGISTRY/REPOSITORY`,
    /// `[http://]REGISTRY/PATH/*` or `[http://]REGISTRY/*`. Empty: nowhere (every such archive
    /// is refused, and says so).
    pub allowed_destinations: Vec<DestinationPattern>,
    /// The docker `config.json` the node agent takes registry credentials from when it pushes
    /// (the chart's registry Secret). Unset: `$DOCKER_CONFIG/config.json`, else anonymous.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry_config: Option<PathBuf>,
    /// PEM files of CAs the node agent trusts, besides the system roots, when it pushes.
    pub registry_ca_files: Vec<PathBuf>,
    /// How many times the node agent tries a push that failed for a reason that may pass (the
    /// registry unreachable or answering 5xx/429) before it reports the failure.
    pub push_attempts: u32,
    /// The node agent's wait before its second attempt; each further wait doubles, up to
    /// [`PUSH_RETRY_MAX`].
    pub push_retry_seconds: u64,
}

/// The longest wait between two attempts of one push.
pub const PUSH_RETRY_MAX: Duration = Duration::from_secs(600);

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            signing_key: None,
            allowed_destinations: Vec::new(),
            registry_config: None,
            registry_ca_files: Vec::new(),
            push_attempts: 5,
            push_retry_seconds: 10,
        }
    }
}

impl CheckpointConfig {
    /// The wait after failed attempt `attempt` (1-based): `push_retry_seconds` doubled for
    /// each earlier retry, at most [`PUSH_RETRY_MAX`].
    pub fn push_retry_after(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(20);
        Duration::from_secs(self.push_retry_seconds.saturating_mul(factor)).min(PUSH_RETRY_MAX)
    }
}

/// Restores a pod asks for by annotation (`gpusnap.io/restore-from`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestoreConfig {
    /// Where node-local checkpoints live, one directory per name (as `gpusnap image pull
    /// --extract` lays them out). A pod annotation can only name a checkpoint under it, never
    /// an arbitrary host path.
    pub checkpoint_root: PathBuf,
    /// CRIU permissions this node grants every restore, by runc's flag names
    /// (`tcp-established`, `ext-unix-sk`, `shell-job`, `file-locks`). None by default, as
    /// containerd-shim-runc-v2 passes none; never taken from the image, which could otherwise
    /// widen what CRIU restores.
    pub criu_flags: Vec<String>,
    /// Whether a checkpoint must carry a signature by one of `signature_keys` before gpusnap
    /// pulls it onto the node or restores it, through any front door: its directory signature
    /// (`gpusnap-manifest.json.sig`), or a cosign image signature verified when it was pulled.
    pub signature_policy: SignaturePolicy,
    /// Public keys (PEM files, ECDSA P-256 as cosign makes them) trusted for signatures.
    pub signature_keys: Vec<PathBuf>,
    /// Private keys (PEM files, root-owned, mode 0600) that open encrypted checkpoint images
    /// (ocicrypt's JWE format) on pull and extract; an encrypted image none opens is refused.
    pub decryption_keys: Vec<PathBuf>,
    /// The largest a rootfs diff may be once decompressed (tar headers, padding and file
    /// content), refused on restore as soon as it inflates past it, before anything is
    /// written; it bounds the file content the diff writes too. Accepts `68719476736` or
    /// `"64GiB"`.
    #[serde(deserialize_with = "crate::bytes::deserialize")]
    pub max_rootfs_diff_bytes: u64,
    /// The most entries (files, directories, links, whiteouts) a rootfs diff may hold; a diff
    /// with more is refused on restore before anything is written. Applying costs about one
    /// file creation per entry, so this bounds the diff's share of the restore's time as
    /// `max_rootfs_diff_bytes` bounds its bytes.
    pub max_rootfs_diff_entries: u64,
    /// The most the node's copies of image-volume checkpoints
    /// (`<checkpoint_root>/.gpusnap-volumes`, one per image that pods on the node restore from)
    /// may hold together. A restore whose copy would take them past it is refused before
    /// anything is copied, saying the node store is full; accepts `274877906944` or `"256GiB"`.
    #[serde(deserialize_with = "crate::bytes::deserialize")]
    pub max_volume_bytes: u64,
    /// How long CRIU may take to restore a checkpoint before it, runc and everything it
    /// restored are killed; 0 derives it from the image size ([`RestoreConfig::deadline`]).
    pub deadline_seconds: u64,
    /// Private anonymous memory areas of at least this size (the device memory the
    /// driver-managed engine stages in a process is one) are written into the restored
    /// processes by gpusnap from every core, while CRIU leaves them stopped, instead of by
    /// CRIU page by page; with an image volume, page images of at least this size are read
    /// from the volume's chunks instead of copied. 16 MiB by default (measured on an H100: an
    /// 8 GiB restore from an image volume at 0.27× containerd's own, against 0.81× with it
    /// off); 0 leaves every page to CRIU. Accepts `16777216` or `"16MiB"`. It applies where gpusnap builds runc's command: the shim's restores and
    /// gpusnap-runc's restores at create; `gpusnap-runc restore` runs the caller's own arguments.
    #[serde(deserialize_with = "crate::bytes::deserialize")]
    pub page_fill_min_bytes: u64,
}

/// `restore.page_fill_min_bytes` unless the node sets it: large enough that small processes
/// are restored by CRIU alone, small enough for the staged device memory of any CUDA process
/// and for allocator arenas.
pub const DEFAULT_PAGE_FILL_MIN_BYTES: u64 = 16 * MIB;

/// The derived restore deadline's floor: CRIU's and runc's fixed work (namespaces, mounts,
/// cgroups) on a loaded node, with a wide margin over the quarter second it takes on an idle one.
pub const RESTORE_DEADLINE_FLOOR: Duration = Duration::from_secs(120);
/// The derived restore deadline's rate: CRIU reads page images at hundreds of MB/s to GB/s from
/// local storage; 32 MiB/s still holds on a slow network disk or a throttled node.
pub const RESTORE_DEADLINE_BYTES_PER_SECOND: u64 = 32 * MIB;
/// The longest restore deadline (configured or derived).
pub const RESTORE_DEADLINE_MAX: Duration = Duration::from_secs(86_400);

impl RestoreConfig {
    /// The restore deadline for a checkpoint of `image_bytes`: `deadline_seconds` when set,
    /// else [`RESTORE_DEADLINE_FLOOR`] plus the images read at
    /// [`RESTORE_DEADLINE_BYTES_PER_SECOND`], at most [`RESTORE_DEADLINE_MAX`].
    pub fn deadline(&self, image_bytes: u64) -> Duration {
        if self.deadline_seconds > 0 {
            return Duration::from_secs(self.deadline_seconds).min(RESTORE_DEADLINE_MAX);
        }
        let reading = Duration::from_secs(image_bytes / RESTORE_DEADLINE_BYTES_PER_SECOND);
        (RESTORE_DEADLINE_FLOOR + reading).min(RESTORE_DEADLINE_MAX)
    }
}

impl Default for RestoreConfig {
    fn default() -> Self {
        RestoreConfig {
            checkpoint_root: PathBuf::from("/var/lib/gpusnap/checkpoints"),
            criu_flags: Vec::new(),
            signature_policy: SignaturePolicy::Off,
            signature_keys: Vec::new(),
            decryption_keys: Vec::new(),
            max_rootfs_diff_bytes: 64 << 30,
            max_rootfs_diff_entries: 100_000,
            max_volume_bytes: 256 << 30,
            deadline_seconds: 0,
            page_fill_min_bytes: DEFAULT_PAGE_FILL_MIN_BYTES,
        }
    }
}

/// What a missing or invalid checkpoint-image signature means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignaturePolicy {
    /// Signatures are not checked.
    #[default]
    Off,
    /// Checked; a missing or invalid one is logged and recorded, and the image still used.
    Warn,
    /// Checked; an image without a valid signature is refused.
    Require,
}

impl SignaturePolicy {
    pub const NAMES: [&'static str; 3] = ["off", "warn", "require"];

    pub fn as_str(self) -> &'static str {
        match self {
            SignaturePolicy::Off => "off",
            SignaturePolicy::Warn => "warn",
            SignaturePolicy::Require => "require",
        }
    }
}

/// Why a setting's text is not a value of its type; the message says what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("one of {}", SignaturePolicy::NAMES.join(", "))]
    SignaturePolicy,
    #[error(
        "an engine name of lowercase letters, digits and '-', such as driver-managed or posix"
    )]
    EngineName,
    #[error("{0:?} is not a version (expected MAJOR.MINOR or MAJOR.MINOR.PATCH)")]
    Version(String),
}

impl FromStr for SignaturePolicy {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s {
            "off" => Ok(SignaturePolicy::Off),
            "warn" => Ok(SignaturePolicy::Warn),
            "require" => Ok(SignaturePolicy::Require),
            _ => Err(ValueError::SignaturePolicy),
        }
    }
}

impl fmt::Display for SignaturePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The storage engine that moves device memory (`driver-managed`, `posix`, ...), by name.
///
/// Which engines exist is the cuda crate's registry (`gpusnap_cuda::engines::ENGINES`); this
/// type only checks the spelling, and whoever builds the engine refuses a name it does not know
/// (the shim at container create, `gpusnap config check`, a checkpoint before anything is
/// locked).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StorageEngine(String);

impl StorageEngine {
    /// The default: the driver copies device memory into host memory and CRIU dumps it with
    /// the process.
    pub const DRIVER_MANAGED: &'static str = "driver-managed";

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for StorageEngine {
    fn default() -> Self {
        StorageEngine(Self::DRIVER_MANAGED.to_string())
    }
}

impl fmt::Display for StorageEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for StorageEngine {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(StorageEngine(s.to_string()))
        } else {
            Err(ValueError::EngineName)
        }
    }
}

impl TryFrom<String> for StorageEngine {
    type Error = ValueError;
    fn try_from(s: String) -> Result<Self, ValueError> {
        s.parse()
    }
}

impl From<StorageEngine> for String {
    fn from(e: StorageEngine) -> String {
        e.0
    }
}

impl PartialEq<&str> for StorageEngine {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub engine: StorageEngine,
    /// Pinned host buffers per GPU used by the posix engine.
    pub transfer_buffer_count: u32,
    /// Size of each transfer buffer; accepts `67108864` or `"64MiB"`.
    #[serde(deserialize_with = "crate::bytes::deserialize")]
    pub transfer_chunk_bytes: u64,
    // No `directory`: the posix engine's extents are always `gpusnap-gpu-*` files in the
    // checkpoint directory, so that ctr images and CRI archives carry them.
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            engine: StorageEngine::default(),
            // Eight slots of 16 MiB: seven I/O threads in flight per GPU with 128 MiB pinned.
            // On the H200 (4 GiB, tmpfs) this read 13.85 GB/s against 8.33 for four of 64 MiB
            // (three I/O threads, 256 MiB pinned), wrote as fast (2.30 / 2.32 GB/s), and
            // pinned in 56 ms instead of 106 (docs/measurements/h200-2026-12-03c/, call 4).
            transfer_buffer_count: 8,
            transfer_chunk_bytes: 16 * MIB,
        }
    }
}

impl StorageConfig {
    /// Pinned host memory the posix engine allocates per GPU.
    pub fn pinned_bytes_per_gpu(&self) -> u64 {
        u64::from(self.transfer_buffer_count).saturating_mul(self.transfer_chunk_bytes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaConfig {
    /// Upper bound for one driver lock/checkpoint/restore call.
    pub max_operation_seconds: u64,
    /// How long to wait for in-flight CUDA work before locking; 0 waits forever.
    pub lock_timeout_ms: u64,
    /// Total time a restore (CRIU plus GPU) may take.
    pub restore_budget_seconds: u64,
    /// The CUDA driver library to dlopen: a bare soname or an absolute path.
    pub library: String,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            max_operation_seconds: 3600,
            lock_timeout_ms: 10_000,
            restore_budget_seconds: 7200,
            library: "libcuda.so.1".to_owned(),
        }
    }
}

impl CudaConfig {
    pub fn max_operation(&self) -> Duration {
        Duration::from_secs(self.max_operation_seconds)
    }

    /// `None` means wait forever.
    pub fn lock_timeout(&self) -> Option<Duration> {
        (self.lock_timeout_ms != 0).then(|| Duration::from_millis(self.lock_timeout_ms))
    }

    pub fn restore_budget(&self) -> Duration {
        Duration::from_secs(self.restore_budget_seconds)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuncConfig {
    /// runc (or a runc-compatible wrapper such as nvidia-container-runtime): a bare name looked
    /// up on PATH, or an absolute path.
    pub binary: PathBuf,
    /// runc's `--root`; the namespace is appended by the shim, as the Go runc shim does.
    pub root: PathBuf,
    pub systemd_cgroup: bool,
}

impl Default for RuncConfig {
    fn default() -> Self {
        RuncConfig {
            binary: PathBuf::from("runc"),
            root: PathBuf::from("/run/containerd/runc"),
            systemd_cgroup: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriuConfig {
    /// Directory holding `criu`; prepended to runc's PATH (runc runs `criu` from its PATH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary_dir: Option<PathBuf>,
    /// Raises the minimum CRIU version gpusnap accepts. Unset: 3.16 for CPU-only containers,
    /// 4.1 for GPU containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<MinVersion>,
}

/// A `MAJOR.MINOR[.PATCH]` version, kept here as plain numbers so this crate does not depend on
/// the CRIU bridge; the shim converts with `CriuVersion::new(v.major, v.minor, v.patch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MinVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl MinVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        MinVersion {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for MinVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for MinVersion {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let err = || ValueError::Version(s.to_owned());
        let parts: Vec<&str> = s.trim().split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(err());
        }
        let num = |p: &str| p.parse::<u32>().map_err(|_| err());
        Ok(MinVersion {
            major: num(parts[0])?,
            minor: num(parts[1])?,
            patch: parts.get(2).map_or(Ok(0), |p| num(p))?,
        })
    }
}

impl Serialize for MinVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MinVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
