//! runc's command line, parsed just enough to find the subcommand and the flags gpusnap needs.
//! The original arguments are always what runc receives, so anything not modelled here still
//! reaches runc unchanged.
//!
//! runc uses urfave/cli (Go's flag package): `-flag`, `--flag`, `--flag=value`, `--flag value`,
//! boolean flags take no separate value, and flag parsing stops at the first non-flag argument.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// runc's global flags that take a value (runc `main.go`).
const GLOBAL_VALUE_FLAGS: &[&str] = &["root", "log", "log-format", "criu", "rootless"];

/// `runc checkpoint` flags that take a value (runc `checkpoint.go`).
pub const CHECKPOINT_VALUE_FLAGS: &[&str] = &[
    "image-path",
    "work-path",
    "parent-path",
    "page-server",
    "status-fd",
    "manage-cgroups-mode",
    "empty-ns",
];

/// `runc restore` flags that take a value (runc `restore.go`).
pub const RESTORE_VALUE_FLAGS: &[&str] = &[
    "console-socket",
    "image-path",
    "work-path",
    "parent-path",
    "manage-cgroups-mode",
    "bundle",
    "b",
    "pid-file",
    "empty-ns",
    "lsm-profile",
    "lsm-mount-context",
];

/// `runc create` flags that take a value (runc `create.go`).
pub const CREATE_VALUE_FLAGS: &[&str] = &[
    "bundle",
    "b",
    "console-socket",
    "pidfd-socket",
    "pid-file",
    "preserve-fds",
];

/// One parsed `-name[=value]` or `-name value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    pub name: String,
    pub value: Option<String>,
}

/// Flags and positional arguments of one command level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub flags: Vec<Flag>,
    pub positionals: Vec<String>,
}

impl Parsed {
    /// A boolean flag: present without a value, or with a true value.
    pub fn is_set(&self, names: &[&str]) -> bool {
        self.flags
            .iter()
            .rev()
            .find(|f| names.contains(&f.name.as_str()))
            .is_some_and(|f| match f.value.as_deref() {
                None => true,
                Some(v) => matches!(v, "true" | "1" | "t" | "T" | "TRUE" | "True"),
            })
    }

    /// The last value of a value flag.
    pub fn value(&self, names: &[&str]) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|f| names.contains(&f.name.as_str()))
            .and_then(|f| f.value.as_deref())
    }

    /// Every value of a repeatable flag, in order.
    pub fn values(&self, name: &str) -> Vec<String> {
        self.flags
            .iter()
            .filter(|f| f.name == name)
            .filter_map(|f| f.value.clone())
            .collect()
    }
}

/// Parses flags until the first positional (`stop_at_positional`) or through all arguments.
/// Returns the parse and the index just after the last consumed argument.
fn parse_level(
    args: &[OsString],
    value_flags: &[&str],
    stop_at_positional: bool,
) -> (Parsed, usize) {
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].to_string_lossy();
        if arg == "--" {
            parsed.positionals.extend(
                args[i + 1..]
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned()),
            );
            return (parsed, args.len());
        }
        if arg.len() > 1 && arg.starts_with('-') {
            let body = arg.trim_start_matches('-');
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (body.to_owned(), None),
            };
            let value = if inline.is_none() && value_flags.contains(&name.as_str()) {
                i += 1;
                args.get(i).map(|a| a.to_string_lossy().into_owned())
            } else {
                inline
            };
            parsed.flags.push(Flag { name, value });
            i += 1;
            continue;
        }
        if stop_at_positional {
            return (parsed, i);
        }
        parsed.positionals.push(arg.into_owned());
        i += 1;
    }
    (parsed, i)
}

/// The whole invocation: global flags, then the subcommand and its arguments.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Every argument after argv[0], untouched.
    pub args: Vec<OsString>,
    pub global: Parsed,
    /// Index of the subcommand in `args`.
    pub command_at: Option<usize>,
}

impl Invocation {
    pub fn parse(args: Vec<OsString>) -> Invocation {
        let (global, next) = parse_level(&args, GLOBAL_VALUE_FLAGS, true);
        let command_at = (next < args.len()).then_some(next);
        Invocation {
            args,
            global,
            command_at,
        }
    }

    pub fn command(&self) -> Option<&OsStr> {
        self.command_at.map(|i| self.args[i].as_os_str())
    }

    /// The subcommand's own arguments.
    pub fn command_args(&self) -> &[OsString] {
        self.command_at.map_or(&[], |i| &self.args[i + 1..])
    }

    /// The subcommand's flags and positionals.
    pub fn command_parsed(&self, value_flags: &[&str]) -> Parsed {
        parse_level(self.command_args(), value_flags, false).0
    }

    /// The global arguments as given (everything before the subcommand).
    pub fn global_args(&self) -> &[OsString] {
        &self.args[..self.command_at.unwrap_or(self.args.len())]
    }

    /// Global flags that select which containers runc sees, for the helper calls the wrapper
    /// makes itself (`state`, `ps`, `kill`). `--log` is left out so those calls do not
    /// interleave with the caller's log.
    pub fn selection_args(&self) -> Vec<OsString> {
        let mut out = Vec::new();
        if let Some(root) = self.global.value(&["root"]) {
            out.push("--root".into());
            out.push(root.into());
        }
        if self.global.is_set(&["systemd-cgroup"]) {
            out.push("--systemd-cgroup".into());
        }
        if let Some(r) = self.global.value(&["rootless"]) {
            out.push(format!("--rootless={r}").into());
        }
        out
    }

    pub fn criu_path(&self) -> Option<PathBuf> {
        self.global.value(&["criu"]).map(PathBuf::from)
    }

    pub fn log_file(&self) -> Option<PathBuf> {
        self.global.value(&["log"]).map(PathBuf::from)
    }

    pub fn log_json(&self) -> bool {
        self.global.value(&["log-format"]) == Some("json")
    }

    pub fn wants_help(&self, parsed: &Parsed) -> bool {
        parsed.is_set(&["help", "h"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(args: &[&str]) -> Invocation {
        Invocation::parse(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn global_flags_then_command() {
        let i = inv(&[
            "--root",
            "/run/r",
            "--log=/l.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "checkpoint",
            "--image-path",
            "/img",
            "ctr",
        ]);
        assert_eq!(i.command(), Some(OsStr::new("checkpoint")));
        assert_eq!(i.global.value(&["root"]), Some("/run/r"));
        assert_eq!(i.log_file(), Some(PathBuf::from("/l.json")));
        assert!(i.log_json());
        assert_eq!(
            i.selection_args(),
            ["--root", "/run/r", "--systemd-cgroup"].map(OsString::from)
        );
        let sub = i.command_parsed(CHECKPOINT_VALUE_FLAGS);
        assert_eq!(sub.value(&["image-path"]), Some("/img"));
        assert_eq!(sub.positionals, ["ctr"]);
        assert_eq!(i.global_args().len(), 6);
    }

    #[test]
    fn single_dash_and_bool_values() {
        let i = inv(&[
            "-root",
            "/r",
            "--debug",
            "restore",
            "-d",
            "--leave-running=false",
            "-b",
            "/bundle",
            "x",
        ]);
        assert!(i.global.is_set(&["debug"]));
        assert_eq!(i.global.value(&["root"]), Some("/r"));
        let sub = i.command_parsed(RESTORE_VALUE_FLAGS);
        assert!(sub.is_set(&["detach", "d"]));
        assert!(!sub.is_set(&["leave-running"]));
        assert_eq!(sub.value(&["bundle", "b"]), Some("/bundle"));
        assert_eq!(sub.positionals, ["x"]);
    }

    #[test]
    fn conmons_create() {
        // conmon: `RUNTIME [--root R] create --bundle B --pid-file P [--console-socket S] ID`.
        let i = inv(&[
            "--root=/run/r",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/b/pidfile",
            "--console-socket",
            "/s.sock",
            "--no-pivot",
            "ctr",
        ]);
        assert_eq!(i.command(), Some(OsStr::new("create")));
        let sub = i.command_parsed(CREATE_VALUE_FLAGS);
        assert_eq!(sub.value(&["bundle", "b"]), Some("/b"));
        assert_eq!(sub.value(&["pid-file"]), Some("/b/pidfile"));
        assert_eq!(sub.value(&["console-socket"]), Some("/s.sock"));
        assert!(sub.is_set(&["no-pivot"]));
        assert_eq!(sub.positionals, ["ctr"]);
        assert_eq!(i.global_args(), ["--root=/run/r"].map(OsString::from));
    }

    #[test]
    fn repeated_values_and_no_command() {
        let i = inv(&[
            "checkpoint",
            "--empty-ns",
            "network",
            "--empty-ns=ipc",
            "id",
        ]);
        assert_eq!(
            i.command_parsed(CHECKPOINT_VALUE_FLAGS).values("empty-ns"),
            ["network", "ipc"]
        );
        let v = inv(&["--version"]);
        assert_eq!(v.command(), None);
        assert!(v.global.is_set(&["version", "v"]));
        assert!(v.command_args().is_empty());
    }
}
