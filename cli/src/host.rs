//! Facts about the node that install and doctor decide on: cgroup layout, the kernel's
//! transparent-huge-page mode and the versions of the container engines.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};

/// How cgroups are mounted at `/sys/fs/cgroup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupLayout {
    /// cgroup2 at `/sys/fs/cgroup`.
    Unified,
    /// v1 controllers plus a cgroup2 mount at `/sys/fs/cgroup/unified` (systemd's hybrid mode).
    Hybrid,
    /// v1 controllers only.
    Legacy,
    Unknown,
}

impl fmt::Display for CgroupLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupLayout::Unified => "cgroup v2 (unified)",
            CgroupLayout::Hybrid => {
                "cgroup v1 (hybrid: v1 controllers, v2 at /sys/fs/cgroup/unified)"
            }
            CgroupLayout::Legacy => "cgroup v1 (legacy)",
            CgroupLayout::Unknown => "unknown (nothing mounted at /sys/fs/cgroup)",
        })
    }
}

/// Reads the layout from `/proc/self/mountinfo`, the same source runc uses.
pub fn cgroup_layout() -> CgroupLayout {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| cgroup_layout_from_mountinfo(&m))
        .unwrap_or(CgroupLayout::Unknown)
}

/// Parses mountinfo lines: `... <mount point> ... - <fstype> <source> <options>`.
pub fn cgroup_layout_from_mountinfo(mountinfo: &str) -> CgroupLayout {
    let mut root_fs = None;
    let mut unified_v2 = false;
    let mut any_v1 = false;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(mount_point) = fields.get(4) else {
            continue;
        };
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let Some(fstype) = fields.get(sep + 1) else {
            continue;
        };
        match (*mount_point, *fstype) {
            ("/sys/fs/cgroup", fs) => root_fs = Some(fs.to_owned()),
            ("/sys/fs/cgroup/unified", "cgroup2") => unified_v2 = true,
            (mp, "cgroup") if mp.starts_with("/sys/fs/cgroup/") => any_v1 = true,
            _ => {}
        }
    }
    match root_fs.as_deref() {
        Some("cgroup2") => CgroupLayout::Unified,
        Some(_) if unified_v2 => CgroupLayout::Hybrid,
        Some(_) if any_v1 => CgroupLayout::Legacy,
        _ => CgroupLayout::Unknown,
    }
}

/// Where the kernel exposes its transparent-huge-page mode for anonymous memory.
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The kernel's transparent-huge-page mode for anonymous memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThpMode {
    /// Every suitable anonymous mapping gets huge pages when it is faulted.
    Always,
    /// Only mappings that asked with `madvise(MADV_HUGEPAGE)`.
    Madvise,
    Never,
}

impl fmt::Display for ThpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThpMode::Always => "always",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
        })
    }
}

/// Reads [`THP_ENABLED`]; `None` when the kernel has no transparent huge pages or the file
/// cannot be read or parsed.
pub fn thp_mode() -> Option<ThpMode> {
    std::fs::read_to_string(THP_ENABLED)
        .ok()
        .and_then(|s| thp_mode_from(&s))
}

/// The kernel lists every mode and brackets the one in force: `always [madvise] never`.
pub fn thp_mode_from(text: &str) -> Option<ThpMode> {
    let start = text.find('[')? + 1;
    let len = text[start..].find(']')?;
    match &text[start..start + len] {
        "always" => Some(ThpMode::Always),
        "madvise" => Some(ThpMode::Madvise),
        "never" => Some(ThpMode::Never),
        _ => None,
    }
}

/// A `MAJOR.MINOR.PATCH` release number of containerd or CRI-O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Release {
    /// Parses `v2.1.9+unknown`, `1.7.27`, `2.0.0-rc.1`: the numeric prefix of each component.
    pub fn parse(s: &str) -> Option<Release> {
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.split(['.', '-', '+']);
        let num = |p: Option<&str>| -> Option<u32> {
            let digits: String = p?.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let major = num(parts.next())?;
        let minor = num(parts.next())?;
        let patch = num(parts.next()).unwrap_or(0);
        Some(Release {
            major,
            minor,
            patch,
        })
    }
}

/// `containerd --version` prints `containerd <module path> <version> <commit>`, e.g.
/// `containerd github.com/containerd/containerd/v2 2.1.9+unknown` or
/// `containerd containerd.io 1.7.27 05044ec0a9a7`.
pub fn parse_containerd_version(output: &str) -> Option<Release> {
    let line = output.lines().find(|l| l.starts_with("containerd"))?;
    line.split_whitespace().skip(1).find_map(Release::parse)
}

/// `crio --version` prints `crio version 1.36.2` (older) or a table with `Version:  1.36.2`.
pub fn parse_crio_version(output: &str) -> Option<Release> {
    output.lines().find_map(|l| {
        let l = l.trim();
        l.strip_prefix("crio version")
            .or_else(|| l.strip_prefix("Version:"))
            .and_then(Release::parse)
    })
}

/// Runs `<binary> --version` and returns stdout, `None` when it cannot run or fails.
pub fn version_output(binary: &Path) -> Option<String> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The containerd release `binary` reports.
pub fn containerd_release(binary: &Path) -> Option<Release> {
    version_output(binary).and_then(|o| parse_containerd_version(&o))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 26 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:14 - cgroup cgroup rw,memory
";
    const UNIFIED: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";
    const LEGACY: &str = "\
35 26 0:30 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
37 35 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";

    #[test]
    fn cgroup_layouts() {
        assert_eq!(cgroup_layout_from_mountinfo(UNIFIED), CgroupLayout::Unified);
        assert_eq!(cgroup_layout_from_mountinfo(HYBRID), CgroupLayout::Hybrid);
        assert_eq!(cgroup_layout_from_mountinfo(LEGACY), CgroupLayout::Legacy);
        assert_eq!(cgroup_layout_from_mountinfo(""), CgroupLayout::Unknown);
    }

    #[test]
    fn thp_modes() {
        assert_eq!(
            thp_mode_from("always [madvise] never\n"),
            Some(ThpMode::Madvise)
        );
        assert_eq!(
            thp_mode_from("[always] madvise never\n"),
            Some(ThpMode::Always)
        );
        assert_eq!(
            thp_mode_from("always madvise [never]\n"),
            Some(ThpMode::Never)
        );
        assert_eq!(thp_mode_from("always madvise never\n"), None);
        assert_eq!(thp_mode_from("[inherit] always\n"), None);
        assert_eq!(thp_mode_from("always [madvise"), None);
    }

    #[test]
    fn containerd_versions() {
        assert_eq!(
            parse_containerd_version(
                "containerd github.com/containerd/containerd/v2 2.1.9+unknown \n"
            ),
            Some(Release {
                major: 2,
                minor: 1,
                patch: 9
            })
        );
        assert_eq!(
            parse_containerd_version(
                "containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n"
            ),
            Some(Release {
                major: 1,
                minor: 7,
                patch: 27
            })
        );
        assert_eq!(
            parse_containerd_version(
                "containerd github.com/containerd/containerd v1.6.20 2806fc1\n"
            ),
            Some(Release {
                major: 1,
                minor: 6,
                patch: 20
            })
        );
        assert_eq!(parse_containerd_version("nonsense"), None);
    }

    #[test]
    fn crio_versions() {
        assert_eq!(
            parse_crio_version("crio version 1.25.1\n").map(|r| r.to_string()),
            Some("1.25.1".into())
        );
        assert_eq!(
            parse_crio_version("INFO ...\nVersion:        1.36.2\nGitCommit: x\n").map(|r| r.minor),
            Some(36)
        );
    }

    #[test]
    fn release_order() {
        assert!(Release::parse("2.0.0").unwrap() > Release::parse("1.7.30").unwrap());
        assert!(Release::parse("v2.1").unwrap() < Release::parse("2.1.1").unwrap());
    }
}
