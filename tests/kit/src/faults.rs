//! Fault injection: stopping a runtime at a named phase (the transaction's failpoints),
//! finding the runc and CRIU of a checkpoint or restore by what they run, killing them with
//! SIGKILL, a CRIU that stalls or crashes mid-restore, and the checks of what a fault may not
//! leave behind (runc state, a frozen cgroup, a rootfs mount, an unsealed image).
//!
//! The failpoints are compiled into the workspace's test builds (`gpusnap-tests` enables the
//! transaction's `failpoints` feature) and armed through a directory: a runtime started with
//! `GPUSNAP_FAILPOINTS=<dir>` stops at point `NAME` while `<dir>/arm-NAME` exists.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::wait::wait_some;

/// The environment variable naming the failpoint directory.
pub const FAILPOINTS_ENV: &str = "GPUSNAP_FAILPOINTS";

/// The failpoints of `gpusnap_transaction::failpoint`, by name.
pub mod point {
    pub const BEFORE_DUMP: &str = "checkpoint-before-dump";
    pub const BEFORE_SEAL: &str = "checkpoint-before-seal";
    pub const AFTER_SEAL: &str = "checkpoint-after-seal";
    pub const BEFORE_RESTORE: &str = "restore-before-criu";
    /// runc has returned, the container runs, the caller is not yet told (GPU: before the
    /// CUDA restore).
    pub const AFTER_CRIU: &str = "restore-after-criu";
    /// Mid-copy of an image volume's checkpoint onto the node (after a file was copied).
    pub const VOLUME_COPYING: &str = "restore-volume-copying";

    /// The end of restore phase `phase` (`volume-copy`, `validate`, `gpu-gate`,
    /// `criu-prepare`, `privilege-check`, `rootfs-diff`, `layer-check`, `open-files-check`),
    /// before its
    /// deadline check.
    pub fn after_phase(phase: &str) -> String {
        format!("restore-after-{phase}")
    }
}

/// A failpoint directory.
pub struct Failpoints {
    dir: tempfile::TempDir,
}

impl Failpoints {
    pub fn new() -> Result<Failpoints> {
        Ok(Failpoints {
            dir: tempfile::Builder::new().prefix("gpusnap-fp-").tempdir()?,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `(GPUSNAP_FAILPOINTS, dir)`, for a runtime's environment.
    pub fn env(&self) -> (String, String) {
        (FAILPOINTS_ENV.into(), self.dir().display().to_string())
    }

    /// Makes the next runtime that reaches `name` stop there.
    pub fn arm(&self, name: &str) -> Result<()> {
        let _ = fs::remove_file(self.dir().join(format!("reached-{name}")));
        fs::write(self.dir().join(format!("arm-{name}")), b"")?;
        Ok(())
    }

    /// Makes every runtime that reaches `name` wait `secs` seconds there and go on (until
    /// [`Failpoints::disarm`]).
    pub fn arm_sleep(&self, name: &str, secs: u64) -> Result<()> {
        fs::write(
            self.dir().join(format!("arm-{name}")),
            format!("sleep {secs}\n"),
        )?;
        Ok(())
    }

    pub fn disarm(&self, name: &str) {
        let _ = fs::remove_file(self.dir().join(format!("arm-{name}")));
    }

    /// Waits until a runtime stopped at `name`, disarms it and returns the stopped process's
    /// pid. Fails with how to build the failpoints in when none arrives.
    pub fn wait_reached(&self, name: &str, timeout: Duration) -> Result<u32> {
        let reached = self.dir().join(format!("reached-{name}"));
        let pid = wait_some(timeout, || {
            fs::read_to_string(&reached)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
        });
        let _ = fs::remove_file(self.dir().join(format!("arm-{name}")));
        pid.with_context(|| {
            format!(
                "no runtime stopped at failpoint {name} within {timeout:?}: are the binaries \
                 built with failpoints (`cargo build --workspace --all-targets`, or `cargo build \
                 -p gpusnap-shim -p gpusnap-runc --features gpusnap-transaction/failpoints`)?"
            )
        })
    }
}

/// A process as `/proc` shows it.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// Every process, read from `/proc`.
pub fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let ppid = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push(Proc {
            pid,
            ppid,
            comm,
            cmdline,
        });
    }
    out
}

/// The runc running `subcommand` (`checkpoint`, `restore`) for container `id`.
pub fn runc_of(subcommand: &str, id: &str) -> Option<Proc> {
    processes().into_iter().find(|p| {
        p.cmdline
            .first()
            .is_some_and(|a| a.ends_with("runc") || a.ends_with("/runc"))
            && p.cmdline.iter().any(|a| a == subcommand)
            && p.cmdline.last().is_some_and(|a| a == id)
    })
}

/// The CRIU below the runc running `subcommand` for `id`.
pub fn criu_of(subcommand: &str, id: &str) -> Option<Proc> {
    let runc = runc_of(subcommand, id)?;
    processes()
        .into_iter()
        .find(|p| p.ppid == runc.pid && p.comm == "criu")
}

/// The CRIU that holds `image_dir` open (runc hands CRIU the image directory as a descriptor).
pub fn criu_writing(image_dir: &Path) -> Option<Proc> {
    let target = fs::canonicalize(image_dir).ok()?;
    processes().into_iter().find(|p| {
        p.comm == "criu"
            && fs::read_dir(format!("/proc/{}/fd", p.pid))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| fs::read_link(fd.path()).is_ok_and(|l| l == target))
    })
}

/// Waits until a CRIU is dumping container `id` and has started writing images into
/// `image_dir` (mid-dump), and returns it.
pub fn wait_mid_dump(id: &str, image_dir: &Path, timeout: Duration) -> Result<Proc> {
    // A tight poll: a dump of a few hundred MiB lasts about a second.
    let until = std::time::Instant::now() + timeout;
    let found = loop {
        // CRIU has started writing images (any `*.img`): it is dumping.
        let dumping = fs::read_dir(image_dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".img"));
        if dumping {
            if let Some(criu) = criu_of("checkpoint", id).or_else(|| criu_writing(image_dir)) {
                break Some(criu);
            }
        }
        if std::time::Instant::now() >= until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    found.with_context(|| format!("no CRIU was seen dumping {id} into {}", image_dir.display()))
}

/// SIGKILL.
pub fn kill9(pid: u32) {
    // SAFETY: kill(2) with a pid; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

/// The container's freezer cgroup (cgroup v1) or unified cgroup (v2), from runc's state.
pub fn cgroup_of_runc_state(runc_root: &Path, id: &str) -> Option<PathBuf> {
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(runc_root.join(id).join("state.json")).ok()?).ok()?;
    let paths = state.get("cgroup_paths")?.as_object()?;
    paths
        .get("freezer")
        .or_else(|| paths.get(""))?
        .as_str()
        .map(PathBuf::from)
}

/// Whether the cgroup at `dir` is frozen (`None`: no such cgroup).
pub fn frozen(dir: &Path) -> Option<bool> {
    if let Ok(e) = fs::read_to_string(dir.join("cgroup.events")) {
        return e
            .lines()
            .find_map(|l| l.strip_prefix("frozen "))
            .map(|v| v.trim() == "1");
    }
    fs::read_to_string(dir.join("freezer.state"))
        .ok()
        .map(|s| s.trim() != "THAWED")
}

/// Pids in the cgroup at `dir` and below (empty when it does not exist).
pub fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(t) = fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    pids
}

/// Whether something is mounted at `path` (`/proc/self/mountinfo`).
pub fn mounted(path: &Path) -> bool {
    let target = path.display().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
}

/// Checks that `image_dir` holds nothing that looks like a checkpoint, sealed or not: no
/// CRIU image, no gpusnap manifest or GPU file (logs may stay). A missing directory passes.
pub fn assert_no_unsealed_images(image_dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(image_dir) else {
        return Ok(());
    };
    let left: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".img") || n.starts_with("gpusnap-") || n == "descriptors.json")
        .collect();
    if !left.is_empty() {
        bail!(
            "{} still holds checkpoint files: {left:?}",
            image_dir.display()
        );
    }
    Ok(())
}

/// Whether `image_dir` holds a sealed checkpoint.
pub fn sealed(image_dir: &Path) -> bool {
    image_dir.join("gpusnap-manifest.json").is_file()
}

/// Which way a [`criu_wrapper`] breaks runc's CRIU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreFault {
    /// The real CRIU runs and is stopped (SIGSTOP) once it has forked the tree: a restore that
    /// never finishes.
    Stall,
    /// The real CRIU runs and is SIGKILLed once it has forked the tree: a crash mid-restore.
    Crash,
    /// Checkpoint, not restore: once CRIU has finished the dump (its `inventory.img` is
    /// written), runc is stopped (SIGSTOP) before it returns, for the test to kill it at seal.
    StopRuncAfterDump,
}

/// The file a [`criu_wrapper`] writes once it has broken a run: the pid of the process it
/// stopped (CRIU for [`RestoreFault::Stall`] and `Crash`, runc for `StopRuncAfterDump`).
pub const WRAPPER_HIT: &str = "hit";

/// Writes `<dir>/criu`: for runc's `restore` (or, for [`RestoreFault::StopRuncAfterDump`],
/// `checkpoint`) it runs the real CRIU (`real`) and breaks it as `fault` says; everything else
/// (runc's version queries before the tree exists, the other direction) runs the real CRIU
/// untouched. Put `dir` first on runc's PATH (gpusnap's `criu.binary_dir`). Returns `dir`.
pub fn criu_wrapper(dir: &Path, real: &Path, fault: RestoreFault) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let hit = dir.join(WRAPPER_HIT);
    let mark = |pid: &str| format!("echo {pid} > {h}.tmp; mv {h}.tmp {h}", h = hit.display());
    let (when, body) = match fault {
        RestoreFault::Stall | RestoreFault::Crash => {
            let action = if fault == RestoreFault::Stall {
                // The wrapper stays as long as the stopped CRIU does (the watch sees the
                // process runc started as CRIU, and a stalled CRIU does not exit).
                format!(
                    "kill -STOP $pid; {}; while kill -0 $pid 2>/dev/null; do sleep 0.1; done; exit 1",
                    mark("$pid")
                )
            } else {
                format!("kill -KILL $pid; {}; exit 1", mark("$pid"))
            };
            (
                "restore",
                format!(
                    "\"$real\" \"$@\" &\n\
                     pid=$!\n\
                     while kill -0 $pid 2>/dev/null; do\n\
                     \x20 if [ -n \"$(cat /proc/$pid/task/*/children 2>/dev/null)\" ]; then {action}; fi\n\
                     \x20 sleep 0.01\n\
                     done\n\
                     wait $pid\n"
                ),
            )
        }
        RestoreFault::StopRuncAfterDump => (
            "checkpoint",
            format!(
                "img=$(tr '\\0' '\\n' < /proc/$PPID/cmdline | sed -n '/^--image-path$/{{n;p;}}')\n\
                 \"$real\" \"$@\"\n\
                 rc=$?\n\
                 if [ $rc = 0 ] && [ -f \"$img/inventory.img\" ]; then kill -STOP $PPID; {}; fi\n\
                 exit $rc\n",
                mark("$PPID")
            ),
        ),
    };
    let script = format!(
        "#!/bin/sh\n\
         # gpusnap test double: breaks runc {when}'s CRIU.\n\
         real={real}\n\
         case \" $(tr '\\0' ' ' < /proc/$PPID/cmdline) \" in\n\
         *' {when} '*) ;;\n\
         *) exec \"$real\" \"$@\" ;;\n\
         esac\n\
         {body}",
        real = real.display()
    );
    let path = dir.join("criu");
    fs::write(&path, script)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    let _ = fs::remove_file(&hit);
    Ok(dir.to_path_buf())
}

/// Waits until the [`criu_wrapper`] in `dir` has broken a run, and returns the pid it wrote
/// (the marker is removed, for the next case).
pub fn wait_wrapper_hit(dir: &Path, timeout: Duration) -> Result<u32> {
    let hit = dir.join(WRAPPER_HIT);
    let pid = wait_some(timeout, || {
        fs::read_to_string(&hit)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    })
    .with_context(|| format!("the CRIU wrapper in {} never broke a run", dir.display()))?;
    let _ = fs::remove_file(&hit);
    Ok(pid)
}

/// Whether process `pid` still exists (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// The real CRIU the rig installs.
pub fn real_criu() -> PathBuf {
    crate::paths::rig_bin_dir().join("criu")
}

/// CRIU's action-script phases of a restore (CRIU 4.2 `criu/cr-restore.c`) at which a
/// [`CriuPhases`] wrapper holds CRIU.
pub mod criu_phase {
    /// CRIU has read the images and prepared its cgroup yard (mounted in its work directory,
    /// in the host's mount namespace); no task is forked yet.
    pub const PRE_RESTORE: &str = "pre-restore";
    /// The root task has made the restored namespaces and CRIU has mounted the restored
    /// mount tree under its mount-namespace yard (`/tmp/.criu.mntns.XXXXXX`).
    pub const POST_SETUP_NAMESPACES: &str = "post-setup-namespaces";
}

/// A CRIU that stops at a chosen phase of a restore: `<dir>/bin/criu` runs the real CRIU,
/// for runc's `restore` with an `action-script` added to its `CRIU_CONFIG_FILE` (after
/// gpusnap's checks, as an operator's site file would be); the script, when `<dir>/arm-PHASE`
/// exists, writes what the test needs to `<dir>/reached-PHASE` and holds CRIU there (it waits
/// for its script) until something is killed. The real CRIU is runc's child (exec), as in
/// production.
pub struct CriuPhases {
    dir: PathBuf,
}

/// A restore held at a CRIU phase: the processes and what CRIU had set up.
#[derive(Debug, Clone)]
pub struct HeldRestore {
    pub criu: u32,
    pub runc: u32,
    /// runc's parent: the shim or gpusnap-runc.
    pub front_end: u32,
    /// CRIU's work directory (its cwd).
    pub work_dir: PathBuf,
    /// CRIU's cgroup yard, as its log names it (in the work directory).
    pub cgroup_yard: Option<PathBuf>,
    /// CRIU's mount-namespace yard in /tmp, as its log names it.
    pub mount_yard: Option<PathBuf>,
}

impl CriuPhases {
    /// Writes the wrapper and its script into `dir`, for the real CRIU `real`.
    pub fn install(dir: &Path, real: &Path) -> Result<CriuPhases> {
        let bin = dir.join("bin");
        fs::create_dir_all(&bin)?;
        let script = dir.join("phase.sh");
        fs::write(
            &script,
            format!(
                r#"#!/bin/sh
# gpusnap test double: holds a CRIU restore at an armed action-script phase.
d={dir}
[ -e "$d/arm-$CRTOOLS_SCRIPT_ACTION" ] || exit 0
rm -f "$d/arm-$CRTOOLS_SCRIPT_ACTION"
criu=$PPID
read -r _ _ _ runc _ < /proc/$criu/stat
read -r _ _ _ front _ < /proc/$runc/stat
work=$(readlink /proc/$criu/cwd)
cg=$(sed -n 's/.*Opening \(\.criu\.cgyard\.[A-Za-z0-9]*\) as cg yard.*/\1/p' "$work/restore.log" | head -n 1)
mnt=$(grep -o '/tmp/\.criu\.mntns\.[A-Za-z0-9]*' "$work/restore.log" | head -n 1)
printf 'criu=%s\nrunc=%s\nfront=%s\nwork=%s\ncgyard=%s\nmntns=%s\n' "$criu" "$runc" "$front" "$work" "$cg" "$mnt" > "$d/.reached.$$"
mv "$d/.reached.$$" "$d/reached-$CRTOOLS_SCRIPT_ACTION"
exec sleep 100000
"#,
                dir = dir.display()
            ),
        )?;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
        let wrapper = bin.join("criu");
        fs::write(
            &wrapper,
            format!(
                r#"#!/bin/sh
# gpusnap test double: runc's restores run the real CRIU with an action script.
real={real}
case " $(tr '\0' ' ' < /proc/$PPID/cmdline) " in
*' restore '*) ;;
*) exec "$real" "$@" ;;
esac
conf={dir}/criu-$$.conf
{{ [ -n "$CRIU_CONFIG_FILE" ] && cat "$CRIU_CONFIG_FILE"; echo; echo "action-script {script}"; }} > "$conf"
CRIU_CONFIG_FILE=$conf exec "$real" "$@"
"#,
                real = real.display(),
                dir = dir.display(),
                script = script.display()
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(CriuPhases {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory to put first on runc's PATH (gpusnap's `criu.binary_dir`).
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }

    /// Holds the next restore that reaches `phase` ([`criu_phase`]).
    pub fn arm(&self, phase: &str) -> Result<()> {
        let _ = fs::remove_file(self.dir.join(format!("reached-{phase}")));
        fs::write(self.dir.join(format!("arm-{phase}")), b"")?;
        Ok(())
    }

    pub fn disarm(&self, phase: &str) {
        let _ = fs::remove_file(self.dir.join(format!("arm-{phase}")));
    }

    /// Waits until a restore is held at `phase`, and says what it holds.
    pub fn wait_reached(&self, phase: &str, timeout: Duration) -> Result<HeldRestore> {
        let reached = self.dir.join(format!("reached-{phase}"));
        let text = wait_some(timeout, || fs::read_to_string(&reached).ok())
            .with_context(|| format!("no CRIU restore reached {phase} within {timeout:?}"))?;
        let _ = fs::remove_file(&reached);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_default()
                .to_string()
        };
        let pid = |k: &str| {
            field(k)
                .parse::<u32>()
                .with_context(|| format!("{k} in {}: {text}", reached.display()))
        };
        let work_dir = PathBuf::from(field("work"));
        let cg = field("cgyard");
        let mnt = field("mntns");
        Ok(HeldRestore {
            criu: pid("criu")?,
            runc: pid("runc")?,
            front_end: pid("front")?,
            cgroup_yard: (!cg.is_empty()).then(|| work_dir.join(cg)),
            mount_yard: (!mnt.is_empty()).then(|| PathBuf::from(mnt)),
            work_dir,
        })
    }
}

/// CRIU's directory names in `/tmp` of a restore (CRIU 4.2: the mount-namespace yard, the
/// clean-path bind point, the legacy proc mount).
pub const CRIU_TMP_PREFIXES: [&str; 3] = [".criu.mntns.", "cr-tmpfs.", "crtools-proc."];

/// The CRIU directories now in `/tmp`.
pub fn criu_tmp_dirs() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir("/tmp")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| CRIU_TMP_PREFIXES.iter().any(|p| n.starts_with(p)))
        .collect();
    names.sort();
    names
}

/// Mount points in this (the host's) mount namespace.
pub fn mount_points() -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .collect()
}

/// Mount points at or below `dir`.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    mount_points()
        .into_iter()
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// Mount points at or below `dir`, or that CRIU named (`.criu.` in the path).
pub fn criu_or_own_mounts(dir: &Path) -> Vec<PathBuf> {
    mount_points()
        .into_iter()
        .filter(|m| m.starts_with(dir) || m.to_string_lossy().contains("/.criu."))
        .collect()
}

/// The live processes whose command line holds `token` (a workload's run token).
pub fn processes_with(token: &str) -> Vec<Proc> {
    processes()
        .into_iter()
        .filter(|p| p.cmdline.iter().any(|a| a.contains(token)))
        .collect()
}
