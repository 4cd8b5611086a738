//! CRIU's configuration files, held to what gpusnap's model of a restore (and a dump) allows.
//!
//! CRIU reads options from files as well as from runc's request: its default files
//! (`/etc/criu/default.conf`, `~/.criu/default.conf`, `$CRIU_CONFIG_FILE`) and, for runc's RPC
//! requests, runc's own file (`/etc/criu/runc.conf`, or the file a container spec's
//! `org.criu.config` annotation names). runc's file is applied *over* every setting of the
//! request (CRIU 4.2.1 `criu/cr-service.c`, "Would overwrite RPC settings"), so one line there
//! can change CRIU's cgroup mode, run an action script as root, load plugins, map mounts or
//! move the images CRIU reads. gpusnap's model of what a restore applies (cgroups placed by
//! CRIU's soft mode under runc's cgroup roots, mounts and namespaces from runc's request, the
//! images gpusnap verified, CRIU's log where gpusnap reads it) holds only while none of that
//! happens. So every option of such a file is resolved as CRIU resolves it (getopt's long
//! options, unambiguous prefixes included) and checked against an allowlist: an option the
//! model does not know (a newer CRIU's included) is refused by name.
//!
//! A file named by an annotation was chosen by whoever wrote the spec (on `ctr containers
//! restore`, the checkpoint image): it must also be a regular file owned by root, not writable
//! by group or others, in directories that are the same, with no symlink on the way, so that
//! its content is the node's and cannot change between this check and CRIU's read.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// The most a CRIU config file may hold (they are a few lines).
pub const MAX_CONFIG_BYTES: u64 = 64 << 10;

/// Which of CRIU's config files a check is about: the rules differ only in `libdir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigRole {
    /// runc's file (`/etc/criu/runc.conf` or `org.criu.config`), applied over runc's request.
    Runc,
    /// One of CRIU's default files, read before the request is applied. Its `libdir` is
    /// outranked by the private plugin directory gpusnap hands every CRIU run (`plugins.rs`).
    Default,
}

/// What the model says about an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Changes nothing the model relies on.
    Allowed,
    /// Allowed with the value `soft` (or none, which CRIU reads as soft).
    SoftOnly,
    /// Allowed in CRIU's default files only (gpusnap's private `libdir` outranks it).
    DefaultFileOnly(Why),
    Refused(Why),
}

/// Why an option is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Cgroups,
    RunsCode,
    Plugins,
    MountsAndNamespaces,
    Labels,
    ImagesAndLog,
    NotARestore,
}

impl Why {
    fn text(self) -> &'static str {
        match self {
            Why::Cgroups => {
                "decides which cgroups the restored tasks enter and what is written there; \
                 gpusnap bounds cgroup.img for CRIU's soft mode under runc's cgroup roots only"
            }
            Why::RunsCode => "makes CRIU run a program of its choosing as root",
            Why::Plugins => {
                "loads CRIU plugins from a directory of its choosing, as root; put plugins in \
                 CRIU's plugin directory (or a libdir line of /etc/criu/default.conf), which \
                 gpusnap hands CRIU"
            }
            Why::MountsAndNamespaces => {
                "changes which mounts, namespaces, devices or files CRIU gives the restored \
                 tasks, which runc sets from the container's spec"
            }
            Why::Labels => "changes the LSM label or privileges CRIU restores with",
            Why::ImagesAndLog => {
                "changes which images CRIU reads or where it logs: gpusnap hands CRIU the \
                 images it verified and reads CRIU's log to clean up after a failure"
            }
            Why::NotARestore => "is no part of the runc restore or dump gpusnap models",
        }
    }
}

/// CRIU 4.2.1's long options (`criu/config.c`), every `BOOL_OPT` with its `no-` twin.
const OPTIONS: &[(&str, Rule)] = {
    use Rule::*;
    use Why::*;
    &[
        ("tree", Refused(NotARestore)),
        ("leave-stopped", Refused(NotARestore)),
        ("leave-running", Refused(NotARestore)),
        ("restore-detached", Refused(NotARestore)),
        ("no-restore-detached", Refused(NotARestore)),
        ("restore-sibling", Refused(NotARestore)),
        ("no-restore-sibling", Refused(NotARestore)),
        ("daemon", Refused(NotARestore)),
        ("no-daemon", Refused(NotARestore)),
        ("images-dir", Refused(ImagesAndLog)),
        ("work-dir", Refused(ImagesAndLog)),
        ("log-file", Refused(ImagesAndLog)),
        ("join-ns", Refused(MountsAndNamespaces)),
        ("root", Refused(MountsAndNamespaces)),
        ("ext-unix-sk", Allowed),
        ("help", Refused(NotARestore)),
        ("tcp-established", Allowed),
        ("no-tcp-established", Allowed),
        ("close", Refused(NotARestore)),
        ("log-pid", Allowed),
        ("no-log-pid", Allowed),
        ("version", Refused(NotARestore)),
        ("evasive-devices", Allowed),
        ("no-evasive-devices", Allowed),
        ("pidfile", Refused(ImagesAndLog)),
        ("veth-pair", Refused(MountsAndNamespaces)),
        ("action-script", Refused(RunsCode)),
        ("link-remap", Allowed),
        ("no-link-remap", Allowed),
        ("shell-job", Allowed),
        ("no-shell-job", Allowed),
        ("file-locks", Allowed),
        ("no-file-locks", Allowed),
        ("page-server", Refused(ImagesAndLog)),
        ("no-page-server", Allowed),
        ("address", Refused(ImagesAndLog)),
        ("port", Refused(ImagesAndLog)),
        ("prev-images-dir", Refused(ImagesAndLog)),
        ("ms", Refused(NotARestore)),
        ("track-mem", Allowed),
        ("no-track-mem", Allowed),
        ("auto-dedup", Refused(ImagesAndLog)),
        ("no-auto-dedup", Allowed),
        ("libdir", DefaultFileOnly(Plugins)),
        ("cpu-cap", Refused(NotARestore)),
        ("force-irmap", Allowed),
        ("no-force-irmap", Allowed),
        ("ext-mount-map", Refused(MountsAndNamespaces)),
        ("exec-cmd", Refused(RunsCode)),
        ("manage-cgroups", SoftOnly),
        ("cgroup-root", Refused(Cgroups)),
        ("inherit-fd", Refused(MountsAndNamespaces)),
        ("feature", Refused(NotARestore)),
        ("skip-mnt", Refused(MountsAndNamespaces)),
        ("enable-fs", Refused(MountsAndNamespaces)),
        ("enable-external-sharing", Refused(MountsAndNamespaces)),
        ("enable-external-masters", Refused(MountsAndNamespaces)),
        ("freeze-cgroup", Refused(Cgroups)),
        ("ghost-limit", Allowed),
        ("irmap-scan-path", Allowed),
        ("lsm-profile", Refused(Labels)),
        ("timeout", Allowed),
        ("external", Refused(MountsAndNamespaces)),
        ("empty-ns", Refused(MountsAndNamespaces)),
        ("lazy-pages", Refused(ImagesAndLog)),
        ("extra", Refused(NotARestore)),
        ("no-extra", Refused(NotARestore)),
        ("experimental", Refused(NotARestore)),
        ("no-experimental", Refused(NotARestore)),
        ("all", Refused(NotARestore)),
        ("cgroup-props", Refused(Cgroups)),
        ("cgroup-props-file", Refused(Cgroups)),
        ("cgroup-dump-controller", Refused(Cgroups)),
        ("skip-in-flight", Allowed),
        ("no-skip-in-flight", Allowed),
        ("deprecated", Refused(NotARestore)),
        ("no-deprecated", Refused(NotARestore)),
        ("display-stats", Allowed),
        ("no-display-stats", Allowed),
        ("weak-sysctls", Allowed),
        ("no-weak-sysctls", Allowed),
        ("status-fd", Refused(ImagesAndLog)),
        ("tcp-close", Allowed),
        ("no-tcp-close", Allowed),
        ("verbosity", Refused(ImagesAndLog)),
        ("ps-socket", Refused(ImagesAndLog)),
        ("stream", Refused(ImagesAndLog)),
        ("no-stream", Allowed),
        ("config", Refused(NotARestore)),
        ("no-default-config", Refused(NotARestore)),
        ("tls-cacert", Refused(ImagesAndLog)),
        ("tls-cacrl", Refused(ImagesAndLog)),
        ("tls-cert", Refused(ImagesAndLog)),
        ("tls-key", Refused(ImagesAndLog)),
        ("tls", Refused(ImagesAndLog)),
        ("no-tls", Allowed),
        ("tls-no-cn-verify", Refused(ImagesAndLog)),
        ("cgroup-yard", Refused(Cgroups)),
        ("pre-dump-mode", Allowed),
        ("file-validation", Allowed),
        ("skip-file-rwx-check", Allowed),
        ("no-skip-file-rwx-check", Allowed),
        ("lsm-mount-context", Refused(Labels)),
        ("network-lock", Allowed),
        ("mntns-compat-mode", Refused(MountsAndNamespaces)),
        ("no-mntns-compat-mode", Allowed),
        ("unprivileged", Refused(Labels)),
        ("no-unprivileged", Allowed),
        ("ghost-fiemap", Allowed),
        ("no-ghost-fiemap", Allowed),
        ("allow-uprobes", Refused(NotARestore)),
        ("no-allow-uprobes", Allowed),
    ]
};

/// One option line of a CRIU config file, as CRIU's getopt will read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLine {
    /// 1-based line number.
    pub line: usize,
    /// The option as written (without `--`).
    pub written: String,
    /// The long option getopt resolves it to; `None` when CRIU would not know it.
    pub option: Option<&'static str>,
    /// The value: attached with `=`, or the next word.
    pub value: Option<String>,
}

/// Why a CRIU config file may not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigRefusal {
    #[error("{file}, line {line}: `{written}` {why}")]
    Option {
        file: PathBuf,
        line: usize,
        written: String,
        why: String,
    },
    #[error("{file}: {problem}")]
    Untrusted { file: PathBuf, problem: String },
}

impl ConfigRefusal {
    /// The file it is about.
    pub fn file(&self) -> &Path {
        match self {
            ConfigRefusal::Option { file, .. } | ConfigRefusal::Untrusted { file, .. } => file,
        }
    }
}

/// Splits `text` into option lines as CRIU's `parse_statement` does: blank lines and lines
/// starting with `#` skipped, the first word the option (a leading `--` tolerated), the next
/// word (quoted or not) its value, `#` ending the line.
pub fn parse(text: &str) -> Vec<ConfigLine> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (first, rest) = match line.find([' ', '\t']) {
            Some(at) => (&line[..at], line[at + 1..].trim_start()),
            None => (line, ""),
        };
        let first = first.strip_prefix("--").unwrap_or(first);
        let (name, attached) = match first.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (first, None),
        };
        let next = if rest.starts_with('#') || rest.is_empty() {
            None
        } else if let Some(quoted) = rest.strip_prefix('"') {
            Some(quoted.split('"').next().unwrap_or_default().to_string())
        } else {
            rest.split_whitespace().next().map(str::to_string)
        };
        out.push(ConfigLine {
            line: i + 1,
            written: name.to_string(),
            option: resolve(name),
            value: attached.or(next),
        });
    }
    out
}

/// The long option getopt_long resolves `name` to: an exact name, else the one option it is a
/// prefix of; `None` for an unknown or ambiguous name (CRIU refuses both too).
fn resolve(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return None;
    }
    if let Some((n, ..)) = OPTIONS.iter().find(|(n, ..)| *n == name) {
        return Some(n);
    }
    let mut found = OPTIONS.iter().filter(|(n, ..)| n.starts_with(name));
    match (found.next(), found.next()) {
        (Some((n, ..)), None) => Some(n),
        _ => None,
    }
}

fn rule_of(option: &str) -> Option<Rule> {
    OPTIONS.iter().find(|(n, _)| *n == option).map(|(_, r)| *r)
}

/// Checks every option of `text` (the content of `file`) against the model; the first one it
/// does not allow is refused with its line.
pub fn check_text(file: &Path, text: &str, role: ConfigRole) -> Result<(), ConfigRefusal> {
    for l in parse(text) {
        let refuse = |why: String| ConfigRefusal::Option {
            file: file.to_path_buf(),
            line: l.line,
            written: l.written.clone(),
            why,
        };
        let Some(option) = l.option else {
            return Err(refuse(
                "is not an option gpusnap's model of CRIU 4.2 knows (or an ambiguous \
                 abbreviation); what the model does not know is refused"
                    .into(),
            ));
        };
        let Some(rule) = rule_of(option) else {
            return Err(refuse("is unknown".into()));
        };
        let shown = if option == l.written {
            String::new()
        } else {
            format!(" (CRIU reads it as `{option}`)")
        };
        match rule {
            Rule::Allowed => {}
            Rule::SoftOnly => {
                // An optional value is CRIU's only when attached with `=`; a value in the next
                // word is not, but a file that writes one means it: anything but `soft` counts.
                let value = l.value.as_deref().unwrap_or("soft");
                if value != "soft" {
                    return Err(refuse(format!(
                        "{shown}sets CRIU's cgroup mode to {value:?}: only soft keeps the \
                         restored tasks under the container's own cgroups, which gpusnap's \
                         bound of cgroup.img relies on"
                    )));
                }
            }
            Rule::DefaultFileOnly(_) if role == ConfigRole::Default => {}
            Rule::DefaultFileOnly(why) | Rule::Refused(why) => {
                return Err(refuse(format!("{shown}{}", why.text())));
            }
        }
    }
    Ok(())
}

/// What to do with runc's CRIU config file of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuncConfig {
    /// The annotation is set and empty: runc passes no file.
    Disabled,
    /// No file at the path runc passes: CRIU ignores a missing file.
    Absent(PathBuf),
    /// The file runc passes, checked.
    Checked(PathBuf),
}

impl fmt::Display for RuncConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuncConfig::Disabled => f.write_str("none (org.criu.config is empty)"),
            RuncConfig::Absent(p) => write!(f, "{} (absent)", p.display()),
            RuncConfig::Checked(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Checks runc's CRIU config file for a container whose spec's `org.criu.config` annotation
/// is `annotation` (runc 1.1 `handleCriuConfigurationFile`: an empty value means none, a
/// missing annotation means `default_file`). A file the annotation names must be trusted
/// ([`read_trusted`]); either must set nothing the model forbids.
pub fn check_runc_config(
    annotation: Option<&str>,
    default_file: &Path,
) -> Result<RuncConfig, ConfigRefusal> {
    let (file, named) = match annotation {
        Some("") => return Ok(RuncConfig::Disabled),
        Some(f) => (PathBuf::from(f), true),
        None => (default_file.to_path_buf(), false),
    };
    let text = read_trusted(&file).map_err(|problem| ConfigRefusal::Untrusted {
        file: file.clone(),
        problem: if named {
            format!(
                "{problem}; the container spec's org.criu.config annotation names it, and CRIU \
                 applies it over every setting runc passes: name a file owned by root and \
                 writable by nobody else, in directories that are the same, or remove the \
                 annotation"
            )
        } else {
            format!("{problem}; runc hands it to CRIU for every dump and restore")
        },
    })?;
    match text {
        None => Ok(RuncConfig::Absent(file)),
        Some(text) => {
            check_text(&file, &text, ConfigRole::Runc)?;
            Ok(RuncConfig::Checked(file))
        }
    }
}

/// Checks CRIU's default config files (read by every CRIU run, before runc's request): each
/// that exists must set nothing the model forbids.
pub fn check_default_configs(files: &[PathBuf]) -> Result<(), ConfigRefusal> {
    for file in files {
        match read_capped(file) {
            Ok(Some(text)) => check_text(file, &text, ConfigRole::Default)?,
            Ok(None) => {}
            Err(problem) => {
                return Err(ConfigRefusal::Untrusted {
                    file: file.clone(),
                    problem,
                })
            }
        }
    }
    Ok(())
}

/// The text of `file` when every directory on its absolute path and the file itself are owned
/// by root and not writable by group or others, nothing on the way is a symlink, and the file
/// is regular and at most [`MAX_CONFIG_BYTES`]; `None` when the file does not exist (CRIU then
/// reads nothing) in a directory that passes. Only root can then change what CRIU will read.
pub fn read_trusted(file: &Path) -> Result<Option<String>, String> {
    if !file.is_absolute() {
        return Err("is not an absolute path".into());
    }
    let mut at = PathBuf::from("/");
    let parts: Vec<Component<'_>> = file.components().collect();
    for (i, c) in parts.iter().enumerate() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => at.push(n),
            _ => {
                return Err(format!(
                    "has a `{}` component",
                    c.as_os_str().to_string_lossy()
                ))
            }
        }
        let last = i + 1 == parts.len();
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if last && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot stat {}: {e}", at.display())),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(format!("{} is a symlink", at.display()));
        }
        if last && !kind.is_file() {
            return Err("is not a regular file".into());
        }
        if !last && !kind.is_dir() {
            return Err(format!("{} is not a directory", at.display()));
        }
        if meta.uid() != 0 {
            return Err(format!(
                "{} is owned by uid {}, not root",
                at.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is writable by {} (mode {:o})",
                at.display(),
                if meta.mode() & 0o002 != 0 {
                    "others"
                } else {
                    "its group"
                },
                meta.mode() & 0o7777
            ));
        }
    }
    read_capped(file)
}

/// The text of the regular file `file` (not followed if a symlink), at most
/// [`MAX_CONFIG_BYTES`]; `None` when it does not exist.
fn read_capped(file: &Path) -> Result<Option<String>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let meta = f.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    let mut text = String::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("holds more than {MAX_CONFIG_BYTES} bytes"));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), ConfigRefusal> {
        check_text(Path::new("/etc/criu/runc.conf"), text, ConfigRole::Runc)
    }

    #[test]
    fn harmless_options_pass_and_the_model_breakers_are_named() {
        check("# site\ntcp-established\n--network-lock nftables\nmanage-cgroups\nmanage-cgroups=soft\n\n  file-locks # why\n").unwrap();
        for (text, named) in [
            ("manage-cgroups=full\n", "cgroup mode to \"full\""),
            ("manage-cgroups strict\n", "\"strict\""),
            ("manage-cgroups ignore\n", "\"ignore\""),
            ("action-script /x\n", "run a program"),
            ("libdir /opt/p\n", "plugins"),
            ("ext-mount-map /a:/b\n", "mounts"),
            ("cgroup-root /\n", "cgroups"),
            ("cgroup-yard /y\n", "cgroups"),
            ("work-dir /w\n", "log"),
            ("lsm-profile apparmor:x\n", "LSM"),
            ("some-future-option\n", "does not know"),
        ] {
            let e = check(text).unwrap_err().to_string();
            assert!(e.contains(named), "{text:?}: {e}");
            assert!(e.contains("line 1"), "{e}");
        }
    }

    #[test]
    fn abbreviations_resolve_as_getopt_does() {
        // getopt_long takes an unambiguous prefix: `action` is action-script.
        let e = check("tcp-established\naction /bin/x\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("action-script"), "{e}");
        // `manage` is manage-cgroups; `t` is ambiguous and refused as unknown.
        assert!(check("manage=full\n").is_err());
        assert!(check("manage\n").is_ok());
        assert!(check("t\n").unwrap_err().to_string().contains("ambiguous"));
        assert_eq!(
            parse("--tcp-established")[0].option,
            Some("tcp-established")
        );
        assert_eq!(parse("tcp-est")[0].option, Some("tcp-established"));
        let quoted = parse("action-script \"/a b\"  # c");
        assert_eq!(quoted[0].value.as_deref(), Some("/a b"));
    }

    #[test]
    fn libdir_is_left_to_default_files() {
        let f = Path::new("/etc/criu/default.conf");
        check_text(f, "libdir /usr/lib/criu\n", ConfigRole::Default).unwrap();
        assert!(check_text(f, "action-script /x\n", ConfigRole::Default).is_err());
    }

    #[test]
    fn an_annotation_file_must_be_roots_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.conf");
        std::fs::write(&file, "tcp-established\n").unwrap();
        let annotation = file.to_str().unwrap();
        // tempdir's parents are /tmp (world-writable, sticky): refused.
        let e = check_runc_config(Some(annotation), Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("writable by others") && e.contains("org.criu.config"),
            "{e}"
        );
        assert!(read_trusted(Path::new("relative.conf")).is_err());
        assert!(read_trusted(Path::new("/a/../b")).is_err());
        assert_eq!(
            check_runc_config(Some(""), Path::new("/x")).unwrap(),
            RuncConfig::Disabled
        );
        // A missing node file is no file; a missing file in a trusted directory too.
        assert_eq!(
            check_runc_config(None, Path::new("/nonexistent-gpusnap.conf")).unwrap(),
            RuncConfig::Absent(PathBuf::from("/nonexistent-gpusnap.conf"))
        );
    }

    #[test]
    fn a_trusted_file_is_read_and_checked() {
        // The test runs as root in CI; elsewhere a file it writes is not root's.
        // SAFETY: geteuid(2) has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::Builder::new()
            .prefix("gpusnap-criu-conf")
            .tempdir_in("/run")
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let file = dir.path().join("c.conf");
        std::fs::write(&file, "tcp-established\n").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let a = file.to_str().unwrap();
        assert_eq!(
            check_runc_config(Some(a), Path::new("/x")).unwrap(),
            RuncConfig::Checked(file.clone())
        );
        std::fs::write(&file, "manage-cgroups full\n").unwrap();
        assert!(check_runc_config(Some(a), Path::new("/x")).is_err());
        std::fs::write(&file, "tcp-established\n").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o664))
            .unwrap();
        let e = check_runc_config(Some(a), Path::new("/x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("writable by its group"), "{e}");
    }
}
