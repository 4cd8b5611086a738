//! Checkpoint and restore of ordinary (CPU) containers through the shim, driven with `ctr`
//! against a real containerd, once with containerd's `io.containerd.runc.v2` shim (the
//! reference) and once with our `io.containerd.gpusnap.v2` shim. Each scenario asserts
//! concrete outcomes (counter values, file bytes, pids, socket state, exit codes, error
//! text), so both runtimes must behave the same; gpusnap-only checks (the sealed manifest,
//! refusals before CRIU) are marked as such.
//!
//! How ctr 2.1 checkpoints and restores, and why some scenarios graft or rewrite blobs in the
//! content store, is explained in `gpusnap_testkit::checkpoint`.
//!
//! Counters: the workloads count up every 0.1 s (`sleep 0.1`, so at most 10 per second). A
//! value read just before a checkpoint (`before`) and just after it (`after`) bracket the
//! dumped value, so the first value seen after a restore must be at least `before` (a fresh
//! start would show 1) and at most `after` plus what 10/s allows since the restore began.
//!
//! Needs root and `scripts/setup-env.sh`; the gpusnap variants need
//! `cargo build -p gpusnap-shim`.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gpusnap_testkit::checkpoint::{
    cmdline, container_checkpoint, container_checkpoint_ok, container_restore,
    container_restore_live_ok, counter, criu_tar_blob, free_tcp_port, image_labels, image_refs,
    kill_and_remove, ns_pid, parse_tar, poll, proc_state, read_counter, read_in_task,
    rewrite_criu_tar, task_checkpoint, wait_counter, write_blob, CkRig,
};
use gpusnap_testkit::rig::BUSYBOX_IMAGE;
use gpusnap_testkit::{wait_until, OutputExt, Rig, RigOptions, RunOpts, Runtime, TaskState};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

use gpusnap_testkit::{scenario::check, scenario_tests};

scenario_tests! {
    counter_resumes_after_kill_and_restore => counter_resumes_runc_v2, counter_resumes_gpusnap;
    leave_running_vs_exit => leave_running_vs_exit_runc_v2, leave_running_vs_exit_gpusnap;
    files_and_open_fd_survive => files_and_open_fd_runc_v2, files_and_open_fd_gpusnap;
    listening_tcp_sockets_survive => listening_tcp_runc_v2, listening_tcp_gpusnap;
    process_tree_survives => process_tree_runc_v2, process_tree_gpusnap;
    tty_survives_live_restore => tty_runc_v2, tty_gpusnap;
    one_image_restored_twice => one_image_twice_runc_v2, one_image_twice_gpusnap;
    checkpoint_restore_checkpoint => c_r_c_runc_v2, c_r_c_gpusnap;
    stopped_task_checkpoint_refused => stopped_task_refused_runc_v2, stopped_task_refused_gpusnap;
    missing_criu_is_reported => missing_criu_runc_v2, missing_criu_gpusnap;
    open_file_left_out_of_the_checkpoint => open_file_left_out_runc_v2, open_file_left_out_gpusnap;
}

/// gpusnap only: the runc shim has no manifest and restores whatever CRIU accepts.
#[test]
fn damaged_images_refused_before_criu_gpusnap() {
    check(Runtime::Gpusnap, damaged_images_refused_before_criu);
}

/// gpusnap only: `criu.min_version` in gpusnap's config raises the CRIU floor.
#[test]
fn criu_min_version_config_enforced_gpusnap() {
    check(Runtime::Gpusnap, criu_min_version_config_enforced);
}

// ----- helpers ----------------------------------------------------------------------------

const COUNT: &str = "/tmp/count";
/// Overwrites /tmp/count in place with one fixed-width write per round (see
/// `gpusnap_testkit::bundle::COUNTER`): never empty, never a new size.
const COUNTER_SCRIPT: &str =
    "i=0; while :; do i=$((i+1)); printf '%010d\\n' $i 1<>/tmp/count; sleep 0.1; done";
const COUNTER: &[&str] = &["sh", "-c", COUNTER_SCRIPT];

fn fifo_dir(rig: &Rig) -> String {
    rig.dir().join("fifo").to_string_lossy().into_owned()
}

/// The first counter value after a restore lies in `[lo, hi + growth since restore_started]`,
/// and the counter keeps increasing.
fn check_resumed(rig: &Rig, id: &str, lo: u64, hi: u64, restore_started: Instant) -> Result<u64> {
    let v = poll(SECS_10, &format!("{COUNT} in restored {id}"), || {
        counter(rig, id, COUNT)
    })
    .with_context(|| diagnose(rig, id))?;
    let grown = (restore_started.elapsed().as_secs_f64() * 10.0).ceil() as u64;
    ensure!(
        v >= lo,
        "{id}: counter after restore is {v}, below the value {lo} seen before the checkpoint \
         (the process started afresh instead of resuming?)"
    );
    ensure!(
        v <= hi + grown + 3,
        "{id}: counter after restore is {v}, but at most {hi} was dumped and only {grown} more \
         ticks fit since the restore began"
    );
    wait_counter(rig, id, COUNT, v + 5, SECS_30).with_context(|| {
        format!(
            "{id}: counter stopped after the restore at {v}; {}",
            diagnose(rig, id)
        )
    })?;
    Ok(v)
}

/// Pauses `id` at a moment when none of its processes holds `path` open
/// ([`gpusnap_testkit::counter::pause_holding_no`]).
fn pause_holding_no(rig: &Rig, id: &str, path: &str) -> Result<()> {
    gpusnap_testkit::counter::pause_holding_no(path, &|| rig.pause(id), &|| rig.resume(id), &|| {
        Ok((rig.task_pid(id)?, rig.ps(id)?))
    })
    .with_context(|| format!("pausing {id}"))
}

/// Processes (pid, state, wait channel, argv) and freezer state of `id`, for failure messages.
fn diagnose(rig: &Rig, id: &str) -> String {
    let procs: Vec<String> = rig
        .ps(id)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let wchan = fs::read_to_string(format!("/proc/{p}/wchan")).unwrap_or_default();
            format!("{p}:{:?}:{wchan}:{}", proc_state(p), cmdline(p))
        })
        .collect();
    let freezer = rig
        .task_pid(id)
        .ok()
        .and_then(|p| fs::read_to_string(format!("/proc/{p}/cgroup")).ok())
        .and_then(|cg| {
            cg.lines()
                .find_map(|l| l.split_once(":freezer:").map(|(_, p)| p.to_string()))
        })
        .map(|p| {
            let st = fs::read_to_string(format!("/sys/fs/cgroup/freezer{p}/freezer.state"))
                .unwrap_or_default();
            format!("freezer {p} = {}", st.trim())
        })
        .unwrap_or_default();
    format!(
        "task {:?}; processes {procs:?}; {freezer}",
        rig.task(id).ok().flatten()
    )
}

fn proc_dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Whether `bytes` are a gpusnap manifest (`"kind": "gpusnap-checkpoint"`).
fn as_manifest(bytes: &[u8]) -> Option<serde_json::Value> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .filter(|v| v["kind"] == "gpusnap-checkpoint")
}

/// gpusnap's manifest inside a `criu.tar` blob: `(member name, parsed)`. Found by content
/// (a `*manifest.json` of kind gpusnap-checkpoint), so the test follows the checkpoint layout
/// (`gpusnap-manifest.json` at the top; earlier `gpusnap/manifest.json`).
fn manifest_in_tar(tar: &[u8]) -> Result<(String, serde_json::Value)> {
    parse_tar(tar)?
        .into_iter()
        .filter(|e| e.name().ends_with("manifest.json"))
        .find_map(|e| as_manifest(&e.data).map(|m| (e.name(), m)))
        .with_context(|| format!("criu.tar has no gpusnap manifest: {:?}", tar_names(tar)))
}

/// gpusnap's manifest in a checkpoint directory (searched like [`manifest_in_tar`]).
fn manifest_in_dir(dir: &Path) -> Option<(PathBuf, serde_json::Value)> {
    for e in fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(found) = manifest_in_dir(&p) {
                return Some(found);
            }
        } else if p.to_string_lossy().ends_with("manifest.json") {
            if let Some(m) = fs::read(&p).ok().and_then(|b| as_manifest(&b)) {
                return Some((p, m));
            }
        }
    }
    None
}

/// Names of the members of a `criu.tar` blob.
fn tar_names(tar: &[u8]) -> Result<Vec<String>> {
    Ok(parse_tar(tar)?.into_iter().map(|e| e.name()).collect())
}

/// Every file of a gpusnap manifest exists under `dir` with the recorded size.
fn check_manifest_files(dir: &Path, m: &serde_json::Value) -> Result<()> {
    let files = m["images"]["files"]
        .as_array()
        .context("manifest has no images.files")?;
    ensure!(!files.is_empty(), "manifest lists no files");
    let mut names = Vec::new();
    for f in files {
        let path = f["path"].as_str().context("file without path")?;
        let size = f["size"].as_u64().context("file without size")?;
        let meta = fs::metadata(dir.join(path))
            .with_context(|| format!("manifest lists {path}, which is not in {}", dir.display()))?;
        ensure!(
            meta.len() == size,
            "{path}: {} bytes on disk, manifest says {size}",
            meta.len()
        );
        names.push(path.to_string());
    }
    for want in ["pstree.img", "inventory.img"] {
        ensure!(
            names.iter().any(|n| n == want),
            "manifest does not list {want}: {names:?}"
        );
    }
    ensure!(
        names.iter().any(|n| n.starts_with("pages-")),
        "manifest lists no pages-*.img: {names:?}"
    );
    Ok(())
}

/// A CRIU image set: pstree, inventory and at least one pages file.
fn check_criu_image_names(names: &[String], what: &str) -> Result<()> {
    for want in ["pstree.img", "inventory.img"] {
        ensure!(
            names.iter().any(|n| n == want),
            "{what} has no {want}: {names:?}"
        );
    }
    ensure!(
        names
            .iter()
            .any(|n| n.starts_with("pages-") && n.ends_with(".img")),
        "{what} has no pages-*.img: {names:?}"
    );
    Ok(())
}

/// No checkpoint image was created (only the busybox image is there).
fn assert_no_checkpoint_images(rig: &Rig) -> Result<()> {
    let refs = image_refs(rig)?;
    ensure!(
        refs == vec![BUSYBOX_IMAGE.to_string()],
        "a failed checkpoint left images behind: {refs:?}"
    );
    Ok(())
}

/// `GET /` over plain HTTP/1.0; returns the body of a 200 answer.
fn http_get(addr: SocketAddr) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .with_context(|| format!("malformed HTTP answer {resp:?}"))?;
    ensure!(
        head.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "HTTP answer is not 200: {head:?}"
    );
    Ok(body.to_string())
}

/// `ctr tasks exec` that must succeed; returns stdout.
fn exec_ok(rig: &Rig, id: &str, exec_id: &str, cmd: &[&str]) -> Result<String> {
    let out = rig.exec(id, exec_id, cmd)?;
    ensure!(
        out.status.success(),
        "exec {cmd:?} in {id} failed: {}",
        out.describe()
    );
    Ok(out.stdout_str())
}

/// Socket inode of a TCP socket in LISTEN state on `port`, from the netns of `pid`.
fn listening_inode(pid: u32, port: u16) -> Option<u64> {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().find_map(|f| {
        let s = fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok()?;
        s.lines().skip(1).find_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() > 9 && c[1].ends_with(&want) && c[3] == "0A")
                .then(|| c[9].parse().ok())
                .flatten()
        })
    })
}

/// Whether `pid` holds an fd on socket `inode`.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let want = PathBuf::from(format!("socket:[{inode}]"));
    fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| fs::read_link(e.path()).is_ok_and(|l| l == want))
}

/// `nsenter --target <pid> --net <cmd...>` on the host.
fn in_netns(pid: u32, cmd: &[&str]) -> Result<String> {
    let out = Command::new("nsenter")
        .arg("--target")
        .arg(pid.to_string())
        .arg("--net")
        .args(cmd)
        .output()
        .context("running nsenter (util-linux)")?;
    ensure!(
        out.status.success(),
        "nsenter --net {cmd:?} failed: {}",
        out.describe()
    );
    Ok(out.stdout_str())
}

/// `(pid inside, argv)` of the container's init and its direct children, from `ctr tasks ps`
/// (the counter's transient `sleep 0.1` processes are grandchildren and left out).
fn long_lived(rig: &Rig, id: &str) -> Result<BTreeSet<(u32, String)>> {
    let init = rig.task_pid(id)?;
    let mut set = BTreeSet::new();
    for p in rig.ps(id)? {
        let s = fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let ppid: Option<u32> = s
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok());
        if p == init || ppid == Some(init) {
            let nspid = ns_pid(p).with_context(|| format!("no NSpid for {p}"))?;
            set.insert((nspid, cmdline(p)));
        }
    }
    Ok(set)
}

/// `(pid, ppid)` of every process as seen from inside the container's /proc (through
/// `ctr tasks exec`), without the exec'd shell itself.
fn procs_inside(rig: &Rig, id: &str, exec_id: &str) -> Result<BTreeSet<(u32, u32)>> {
    let out = exec_ok(
        rig,
        id,
        exec_id,
        &[
            "sh",
            "-c",
            "for d in /proc/[0-9]*; do read -r p c s pp rest < $d/stat && echo \"$p $pp\"; done; echo self $$",
        ],
    )?;
    let mut me = 0;
    let mut v = BTreeSet::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["self", p] => me = p.parse()?,
            [p, pp] => {
                v.insert((p.parse()?, pp.parse()?));
            }
            _ => bail!("unexpected line {l:?} from /proc listing"),
        }
    }
    // Drop the listing shell and whatever it forked.
    Ok(v.into_iter()
        .filter(|(p, pp)| *p != me && *pp != me)
        .collect())
}

// ----- scenarios ---------------------------------------------------------------------------

/// Scenario 1: `ctr c checkpoint --task` leaves the counter running; after SIGKILL + delete,
/// `ctr c restore --live` brings back the same process (pid 1, same argv) counting on from the
/// checkpointed value.
fn counter_resumes_after_kill_and_restore(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "counter";
    let image = "ck/counter:1";
    rig.run_detached(rt, id, COUNTER)?;
    let before = wait_counter(&rig, id, COUNT, 10, SECS_30)?;
    let pid = rig.task_pid(id)?;
    container_checkpoint_ok(&rig, id, image, true)?;
    let after = read_counter(&rig, id, COUNT)?;

    // Checkpointing left the original untouched: same process, RUNNING, still counting.
    let t = rig.task(id)?.context("task gone after checkpoint")?;
    ensure!(
        t.pid == pid && t.state == TaskState::Running,
        "after checkpoint: {t:?}, want pid {pid} RUNNING"
    );
    wait_counter(&rig, id, COUNT, after + 3, SECS_30)?;

    kill_and_remove(&rig, id)?;
    ensure!(proc_dead(pid), "original pid {pid} still alive");

    let started = Instant::now();
    container_restore_live_ok(&rig, id, image, true)?;
    let new_pid = rig.task_pid(id)?;
    ensure!(
        ns_pid(new_pid) == Some(1),
        "restored init is pid {:?} in its namespace, want 1",
        ns_pid(new_pid)
    );
    ensure!(
        cmdline(new_pid) == COUNTER.join(" "),
        "restored init runs {:?}",
        cmdline(new_pid)
    );
    check_resumed(&rig, id, before, after, started)?;
    Ok(())
}

/// Scenario 2: `ctr t checkpoint` leaves the task RUNNING (same pid, counting) and stores an
/// image; with `--image-path` the CRIU images land in that directory; with `--exit` the task
/// is STOPPED afterwards (exit 137) and its image restores to the value it had when stopped;
/// a task the user paused stays PAUSED through the checkpoint.
fn leave_running_vs_exit(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "lr";
    rig.run_detached(rt, id, COUNTER)?;
    wait_counter(&rig, id, COUNT, 10, SECS_30)?;
    let pid = rig.task_pid(id)?;
    let still_running = |what: &str| -> Result<()> {
        let t = rig
            .task(id)?
            .with_context(|| format!("task gone after {what}"))?;
        ensure!(
            t.pid == pid && t.state == TaskState::Running,
            "after {what}: {t:?}, want pid {pid} RUNNING"
        );
        let now = read_counter(&rig, id, COUNT)?;
        wait_counter(&rig, id, COUNT, now + 3, SECS_30).with_context(|| {
            format!(
                "counter stuck at {now} after {what}; {}",
                diagnose(&rig, id)
            )
        })?;
        Ok(())
    };

    // (a) Default: leave running; ctr prints the image it stored.
    let out = task_checkpoint(&rig, id, &[])?;
    ensure!(out.status.success(), "ctr t checkpoint: {}", out.describe());
    let name = out.stdout_str().trim().to_string();
    ensure!(
        name.starts_with(&format!("containerd.io/checkpoint/{id}:")),
        "ctr t checkpoint printed {name:?}"
    );
    ensure!(
        image_labels(&rig, &name)?.contains("containerd.io/checkpoint=true"),
        "{name} lacks the checkpoint label"
    );
    let tar = fs::read(criu_tar_blob(&rig, &name)?)?;
    check_criu_image_names(&tar_names(&tar)?, "leave-running criu.tar")?;
    if rt == Runtime::Gpusnap {
        let (_, m) = manifest_in_tar(&tar)?;
        ensure!(
            m["container_id"] == id,
            "manifest container_id {}",
            m["container_id"]
        );
        // The CRIU flags the dump ran with (ctr's client asks for none); no host details.
        ensure!(m["criu"].is_object(), "manifest criu flags {}", m["criu"]);
        ensure!(
            m.get("bundle").is_none() && m["processes"][0].get("host_pid").is_none(),
            "manifest records host paths or pids: {m}"
        );
    }
    still_running("ctr t checkpoint")?;

    // ctr names task checkpoint images containerd.io/checkpoint/<id>:<date to the second>;
    // remove this one so that a later `ctr t checkpoint` in the same second does not collide.
    rig.ctr_ok(&["images", "rm", &name])?;

    // (b) --image-path: the images go straight to the directory, the task keeps running.
    // (For runtimes other than runc.v2 the ctr 2.1 client still stores an image afterwards,
    // without CRIU data — its "image path given" shortcut only knows runc.v2 — so gpusnap gets
    // an extra containerd.io/checkpoint/<id>:<date> image here; removed below.)
    let dir = rig.dir().join("image-path");
    fs::create_dir(&dir)?;
    let dir_s = dir.to_string_lossy().into_owned();
    let out = task_checkpoint(&rig, id, &["--image-path", &dir_s])?;
    ensure!(
        out.status.success(),
        "ctr t checkpoint --image-path: {}",
        out.describe()
    );
    let names: Vec<String> = fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    check_criu_image_names(&names, &dir_s)?;
    let manifest = manifest_in_dir(&dir);
    if rt == Runtime::Gpusnap {
        let (_, m) = manifest.with_context(|| format!("no gpusnap manifest in {dir_s}"))?;
        check_manifest_files(&dir, &m)?;
        ensure!(m["criu"].is_object(), "manifest criu flags {}", m["criu"]);
    } else {
        ensure!(
            manifest.is_none(),
            "runc.v2 wrote a gpusnap manifest? {manifest:?}"
        );
    }
    still_running("ctr t checkpoint --image-path")?;
    for r in image_refs(&rig)? {
        if r.starts_with("containerd.io/checkpoint/") {
            rig.ctr_ok(&["images", "rm", &r])?;
        }
    }

    // (d) A task the user paused stays PAUSED through `ctr t checkpoint` (ctr neither pauses
    // nor resumes it then), and runs on once resumed.
    rig.pause(id)?;
    let frozen_at = read_counter(&rig, id, COUNT)?;
    let out = task_checkpoint(&rig, id, &[])?;
    ensure!(
        out.status.success(),
        "ctr t checkpoint of a paused task: {}",
        out.describe()
    );
    rig.ctr_ok(&["images", "rm", out.stdout_str().trim()])?;
    let t = rig.task(id)?.context("task gone")?;
    ensure!(
        t.pid == pid && t.state == TaskState::Paused,
        "after checkpointing a paused task: {t:?}, want pid {pid} PAUSED"
    );
    // The kernel's freezer holds the task: proof that nothing in it runs (no sampling).
    gpusnap_testkit::can_fail::ensure_frozen(pid, "after checkpointing a paused task")?;
    let still = read_counter(&rig, id, COUNT)?;
    ensure!(
        still == frozen_at,
        "paused task counted on: {frozen_at} -> {still}"
    );
    rig.resume(id)?;
    still_running("resume after checkpointing a paused task")?;

    // (c) --exit. ctr cannot restore a `ctr t checkpoint` image ("image name not found in
    // index"), so a `ctr c checkpoint --task` image of the same container, taken first, carries
    // the exit image's criu.tar into `ctr c restore` (see gpusnap_testkit::checkpoint). The
    // carrier's writable layer is older than the exit dump, so it is left out (no --rw) and
    // the dump is taken while no process holds /tmp/count open: the restored rootfs has none.
    let carrier = "ck/carrier:1";
    container_checkpoint_ok(&rig, id, carrier, false)?;
    let carrier_value = read_counter(&rig, id, COUNT)?;
    wait_counter(&rig, id, COUNT, carrier_value + 10, SECS_30)?;
    pause_holding_no(&rig, id, COUNT)?;
    let out = task_checkpoint(&rig, id, &["--exit"])?;
    ensure!(
        out.status.success(),
        "ctr t checkpoint --exit: {}",
        out.describe()
    );
    let exit_image = out.stdout_str().trim().to_string();
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    ensure!(
        wait_until(SECS_10, || proc_dead(pid)),
        "pid {pid} alive after --exit"
    );
    // The rootfs stays mounted until the task is deleted.
    let at_exit: u64 = fs::read_to_string(rig.bundle_dir(id).join("rootfs/tmp/count"))
        .context("reading the counter of the stopped task from its rootfs")?
        .trim()
        .parse()?;
    ensure!(
        at_exit >= carrier_value + 10,
        "counter {at_exit} at exit, {carrier_value} at the carrier checkpoint"
    );
    let exit_tar = fs::read(criu_tar_blob(&rig, &exit_image)?)?;
    check_criu_image_names(&tar_names(&exit_tar)?, "--exit criu.tar")?;
    if rt == Runtime::Gpusnap {
        let (_, m) = manifest_in_tar(&exit_tar)?;
        ensure!(m["criu"].is_object(), "manifest criu flags {}", m["criu"]);
    }
    let code = rig.delete_task(id)?;
    ensure!(
        code == 137,
        "task stopped by --exit exited {code}, want 137 (SIGKILL)"
    );
    let out = rig.delete_container(id)?;
    ensure!(out.status.success(), "delete container: {}", out.describe());

    write_blob(&criu_tar_blob(&rig, carrier)?, &exit_tar)?;
    let started = Instant::now();
    container_restore_live_ok(&rig, id, carrier, false)?;
    // Resumes from the value at exit, not from the carrier's earlier one.
    check_resumed(&rig, id, at_exit, at_exit, started)?;
    Ok(())
}

/// Scenario 3: files written in the container's rootfs (by the process and by an exec) and
/// an fd the process writes through survive `--rw` checkpoint + restore: fd 3 still points
/// at /tmp/log and the log continues exactly where it stopped (1, 2, ... N, no gap, no dup).
fn files_and_open_fd_survive(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "files";
    let image = "ck/files:1";
    let script = "mkdir -p /data && echo 'written before the checkpoint' > /data/keep.txt && \
                  exec 3>/tmp/log && i=0 && while :; do i=$((i+1)); echo $i >&3; sleep 0.1; done";
    rig.run_detached(rt, id, &["sh", "-c", script])?;
    let log_lines = |rig: &Rig| -> Option<Vec<String>> {
        read_in_task(rig, id, "/tmp/log").map(|s| s.lines().map(str::to_string).collect())
    };
    poll(SECS_30, "10 log lines", || {
        log_lines(&rig).filter(|l| l.len() >= 10)
    })?;
    exec_ok(
        &rig,
        id,
        "write",
        &["sh", "-c", "echo from-exec > /data/exec.txt"],
    )?;
    container_checkpoint_ok(&rig, id, image, true)?;
    let n_after = log_lines(&rig).context("log unreadable")?.len();
    kill_and_remove(&rig, id)?;

    container_restore_live_ok(&rig, id, image, true)?;
    let pid = rig.task_pid(id)?;
    let fd3 = fs::read_link(format!("/proc/{pid}/fd/3")).context("restored init has no fd 3")?;
    ensure!(
        fd3 == Path::new("/tmp/log"),
        "restored fd 3 points at {}",
        fd3.display()
    );
    let lines = poll(SECS_30, "the restored process to append 10 lines", || {
        log_lines(&rig).filter(|l| l.len() >= n_after + 10)
    })?;
    for (i, l) in lines.iter().enumerate() {
        ensure!(
            *l == (i + 1).to_string(),
            "/tmp/log line {} is {l:?}, want {} (log continued at the wrong place; {} lines at \
             the checkpoint)",
            i + 1,
            i + 1,
            n_after
        );
    }
    for (path, want) in [
        ("/data/keep.txt", "written before the checkpoint\n"),
        ("/data/exec.txt", "from-exec\n"),
    ] {
        let got = read_in_task(&rig, id, path);
        ensure!(
            got.as_deref() == Some(want),
            "{path} after restore: {got:?}, want {want:?}"
        );
    }
    Ok(())
}

/// Scenario 4: a listening TCP socket (no established connections, so no `tcp-established`,
/// which ctr does not offer anyway: `ctr c checkpoint` has no such flag, `ctr t checkpoint`
/// only `--exit/--image-path/--work-path`) survives.
/// (a) `--net-host`: after kill + restore the port accepts connections from the host again.
/// (b) own netns: the restored httpd holds a LISTEN socket on :8080 in the restored netns and
///     answers an exec'd wget. (Both runtimes restore the netns with `lo` DOWN, although runc
///     had brought it up at create; the test brings it up with nsenter before connecting.)
fn listening_tcp_sockets_survive(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;

    // (a) host network
    let id = "web-host";
    let port = free_tcp_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let script = format!(
        "mkdir -p /www && echo hello-{id} > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www"
    );
    let opts = RunOpts {
        extra_args: vec!["--net-host".into()],
        ..RunOpts::default()
    };
    rig.run_detached_with(rt, id, &["sh", "-c", &script], &opts)?;
    let want = format!("hello-{id}\n");
    let body = poll(SECS_10, "httpd to answer on the host", || {
        http_get(addr).ok()
    })?;
    ensure!(body == want, "before checkpoint: body {body:?}");
    container_checkpoint_ok(&rig, id, "ck/web-host:1", true)?;
    ensure!(
        http_get(addr)? == want,
        "the original stopped serving after the checkpoint"
    );
    kill_and_remove(&rig, id)?;
    ensure!(
        wait_until(SECS_10, || TcpStream::connect_timeout(
            &addr,
            Duration::from_secs(1)
        )
        .is_err()),
        "port {port} still accepts connections after the container was killed"
    );
    container_restore_live_ok(&rig, id, "ck/web-host:1", true)?;
    let body = poll(SECS_10, "restored httpd to answer on the host", || {
        http_get(addr).ok()
    })?;
    ensure!(body == want, "after restore: body {body:?}");

    // (b) own network namespace
    let id = "web-ns";
    rig.run_detached(
        rt,
        id,
        &[
            "sh",
            "-c",
            "mkdir -p /www && echo hello-netns > /www/index.html && exec httpd -f -p 8080 -h /www",
        ],
    )?;
    let wget = ["wget", "-q", "-O-", "http://127.0.0.1:8080/"];
    let mut attempt = 0;
    let body = poll(SECS_10, "httpd to answer inside", || {
        attempt += 1;
        rig.exec(id, &format!("wget-0-{attempt}"), &wget)
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout_str())
    })?;
    ensure!(body == "hello-netns\n", "before checkpoint: body {body:?}");
    container_checkpoint_ok(&rig, id, "ck/web-ns:1", true)?;
    kill_and_remove(&rig, id)?;
    container_restore_live_ok(&rig, id, "ck/web-ns:1", true)?;
    let pid = rig.task_pid(id)?;
    let inode = listening_inode(pid, 8080)
        .context("no LISTEN socket on :8080 in the restored container's netns")?;
    ensure!(
        holds_socket(pid, inode),
        "restored httpd (pid {pid}) does not hold the listening socket {inode}"
    );
    let lo = in_netns(pid, &["ip", "-o", "link", "show", "lo"])?;
    let lo_was_up = lo.contains(",UP") || lo.contains("<UP");
    if !lo_was_up {
        in_netns(pid, &["ip", "link", "set", "lo", "up"])?;
    }
    eprintln!(
        "{rt}: loopback in the restored netns was {}",
        if lo_was_up { "UP" } else { "DOWN" }
    );
    let out = rig.exec(id, "wget-1", &wget)?;
    ensure!(
        out.status.success() && out.stdout_str() == "hello-netns\n",
        "restored httpd in its own netns did not answer: {}",
        out.describe()
    );
    Ok(())
}

/// Scenario 5: init + 3 sleepers + a counter subshell come back with the same pids inside the
/// container (as `ctr t ps` + NSpid and the container's own /proc show), all alive.
fn process_tree_survives(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "tree";
    let script = format!("sleep 1001 & sleep 1002 & sleep 1003 & ({COUNTER_SCRIPT}) & wait");
    rig.run_detached(rt, id, &["sh", "-c", &script])?;
    wait_counter(&rig, id, COUNT, 5, SECS_30)?;
    let before = long_lived(&rig, id)?;
    let argvs: Vec<&str> = before.iter().map(|(_, a)| a.as_str()).collect();
    ensure!(before.len() == 5, "want init + 4 children, got {before:?}");
    for s in ["sleep 1001", "sleep 1002", "sleep 1003"] {
        ensure!(argvs.contains(&s), "{s} missing from {before:?}");
    }
    ensure!(
        before.iter().any(|(p, _)| *p == 1),
        "no pid 1 in {before:?}"
    );
    let inside_before = procs_inside(&rig, id, "proc-0")?;
    let long_inside_before: BTreeSet<(u32, u32)> = inside_before
        .iter()
        .copied()
        .filter(|(p, pp)| *p == 1 || *pp == 1)
        .collect();
    ensure!(
        long_inside_before.len() == 5,
        "inside view {inside_before:?} vs ctr t ps {before:?}"
    );
    let image = "ck/tree:1";
    container_checkpoint_ok(&rig, id, image, true)?;
    kill_and_remove(&rig, id)?;
    container_restore_live_ok(&rig, id, image, true)?;

    let after = long_lived(&rig, id)?;
    ensure!(
        after == before,
        "process tree changed across checkpoint/restore:\n before {before:?}\n after  {after:?}"
    );
    for p in rig.ps(id)? {
        ensure!(
            !matches!(proc_state(p), Some('Z') | Some('X')),
            "restored pid {p} ({}) is dead",
            cmdline(p)
        );
    }
    let inside_after: BTreeSet<(u32, u32)> = procs_inside(&rig, id, "proc-1")?
        .into_iter()
        .filter(|(p, pp)| *p == 1 || *pp == 1)
        .collect();
    ensure!(
        inside_after == long_inside_before,
        "(pid, ppid) inside the container changed: before {long_inside_before:?}, after {inside_after:?}"
    );
    let now = read_counter(&rig, id, COUNT)?;
    wait_counter(&rig, id, COUNT, now + 5, SECS_30)?;
    Ok(())
}

/// Scenario 6: `ctr run --tty` (on a pty) checkpointed with `ctr c checkpoint --task`, killed,
/// and restored with `ctr c restore --live` (on a new pty): stdin/stdout are still a terminal
/// (`[ -t 0 ]` inside keeps the counter going, fds point at /dev/pts/*), and the output of
/// the resumed loop reaches the new ctr's terminal.
fn tty_survives_live_restore(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "tty";
    let image = "ck/tty:1";
    let script =
        "i=0; while :; do i=$((i+1)); if [ -t 0 ] && [ -t 1 ]; then printf '%010d\\n' $i 1<>/tmp/count; \
                  echo tick-$i; fi; sleep 0.1; done";
    let fifo = fifo_dir(&rig);
    let run_args: Vec<String> = [
        "run",
        "--tty",
        "--rm",
        "--runtime",
        rt.runtime_type(),
        "--fifo-dir",
        fifo.as_str(),
        BUSYBOX_IMAGE,
        id,
        "sh",
        "-c",
        script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let restore_args = ["containers", "restore", "--live", "--rw", id, image];
    let rig_ref: &Rig = &rig;
    std::thread::scope(|s| -> Result<()> {
        let run = s.spawn(|| rig_ref.ctr_pty(&run_args, Duration::from_secs(120)));
        rig.wait_task_state(id, TaskState::Running, SECS_30)?;
        let before = wait_counter(&rig, id, COUNT, 10, SECS_30)?;
        let pid = rig.task_pid(id)?;
        let fd0 = fs::read_link(format!("/proc/{pid}/fd/0"))?;
        ensure!(
            fd0.starts_with("/dev/pts/"),
            "original stdin is {}, not a pty",
            fd0.display()
        );
        container_checkpoint_ok(&rig, id, image, true)?;
        let after = read_counter(&rig, id, COUNT)?;
        rig.kill_all(id, "SIGKILL")?;
        let ran = run.join().expect("ctr run thread")?;
        ensure!(
            ran.status.code() == Some(137),
            "ctr run --tty after SIGKILL: {:?}, output {:?}",
            ran.status,
            ran.text()
        );
        ensure!(
            ran.text().contains("tick-"),
            "no output on the first tty: {:?}",
            ran.text()
        );
        rig.wait_task_gone(id, SECS_30)?;
        wait_until(SECS_10, || rig.containers().is_ok_and(|c| c.is_empty()));

        let started = Instant::now();
        let restore = s.spawn(|| rig_ref.ctr_pty(&restore_args, Duration::from_secs(120)));
        let waited = rig.wait_task_state(id, TaskState::Running, SECS_30);
        let resumed = waited.and_then(|_| check_resumed(&rig, id, before, after, started));
        let pid = rig.task_pid(id).unwrap_or(0);
        let fds: Vec<String> = (0..3)
            .map(|fd| {
                fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            })
            .collect();
        let _ = rig.kill_all(id, "SIGKILL");
        let restored = restore.join().expect("ctr restore thread")?;
        let first =
            resumed.with_context(|| format!("restore's terminal: {:?}", restored.text()))?;
        for (fd, p) in fds.iter().enumerate() {
            ensure!(
                p.starts_with("/dev/pts/"),
                "restored fd {fd} is {p:?}, not a pty"
            );
        }
        let text = restored.text();
        let ticks: Vec<u64> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("tick-"))
            .filter_map(|n| n.parse().ok())
            .collect();
        // Only the resumed loop writes to the new terminal: its ticks continue the
        // checkpointed count (a fresh start would print tick-1).
        ensure!(
            ticks.iter().any(|t| *t >= first) && ticks.iter().all(|t| *t > before),
            "restore's terminal should show ticks after {before} up to at least {first}: {text:?}"
        );
        ensure!(
            restored.status.code() == Some(137),
            "ctr c restore (tty) after SIGKILL: {:?}",
            restored.status
        );
        Ok(())
    })
}

/// Scenario 7: one checkpoint image restored into two new containers (`ctr c restore` takes
/// any container id) while the original keeps running: both resume from the checkpointed
/// value, in their own pid namespaces and rootfs, and killing one leaves the other running.
fn one_image_restored_twice(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let image = "ck/twins:1";
    rig.run_detached(rt, "orig", COUNTER)?;
    let before = wait_counter(&rig, "orig", COUNT, 10, SECS_30)?;
    container_checkpoint_ok(&rig, "orig", image, true)?;
    let after = read_counter(&rig, "orig", COUNT)?;

    let started = Instant::now();
    for id in ["twin-a", "twin-b"] {
        container_restore_live_ok(&rig, id, image, true)?;
    }
    for id in ["twin-a", "twin-b"] {
        check_resumed(&rig, id, before, after, started)?;
    }
    let pids: Vec<u32> = ["orig", "twin-a", "twin-b"]
        .iter()
        .map(|id| rig.task_pid(id))
        .collect::<Result<_>>()?;
    let pidns: BTreeSet<PathBuf> = pids
        .iter()
        .map(|p| fs::read_link(format!("/proc/{p}/ns/pid")))
        .collect::<std::io::Result<_>>()?;
    ensure!(
        pidns.len() == 3,
        "pid namespaces shared: {pidns:?} for pids {pids:?}"
    );
    ensure!(
        pids[1..].iter().all(|p| ns_pid(*p) == Some(1)),
        "restored inits are not pid 1 in their namespaces"
    );

    exec_ok(
        &rig,
        "twin-a",
        "mark",
        &["sh", "-c", "echo only-a > /tmp/marker"],
    )?;
    ensure!(
        read_in_task(&rig, "twin-a", "/tmp/marker").as_deref() == Some("only-a\n"),
        "marker not written in twin-a"
    );
    ensure!(
        read_in_task(&rig, "twin-b", "/tmp/marker").is_none()
            && read_in_task(&rig, "orig", "/tmp/marker").is_none(),
        "twin-a's file is visible in another container"
    );

    // `ctr c restore` reuses the checkpointed spec, cgroupsPath included, so all three
    // containers share the cgroup /<ns>/orig (same on both runtimes): `ctr t kill --all` on
    // one of them would SIGKILL every process in it. Kill twin-a's init only; its pid
    // namespace goes with it.
    let cgroups: Vec<String> = pids
        .iter()
        .map(|p| memory_cgroup(*p))
        .collect::<Result<_>>()?;
    ensure!(
        cgroups
            .iter()
            .all(|c| *c == format!("/{}/orig", rig.namespace())),
        "cgroups of orig, twin-a, twin-b: {cgroups:?}"
    );
    rig.kill("twin-a", "SIGKILL")?;
    rig.wait_task_state("twin-a", TaskState::Stopped, SECS_30)?;
    ensure!(rig.delete_task("twin-a")? == 137, "twin-a's exit code");
    ensure!(
        wait_until(SECS_10, || proc_dead(pids[1])),
        "twin-a's init survived"
    );
    for id in ["twin-b", "orig"] {
        ensure!(
            rig.task_state(id)? == Some(TaskState::Running),
            "{id} not running after twin-a was killed"
        );
        let now = read_counter(&rig, id, COUNT)?;
        wait_counter(&rig, id, COUNT, now + 5, SECS_30)?;
    }
    Ok(())
}

/// Scenario 8: C → R → C → R. The restored container checkpoints again, and the second image
/// resumes from the second checkpoint's value (above anything in the first image).
fn checkpoint_restore_checkpoint(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "crc";
    rig.run_detached(rt, id, COUNTER)?;
    let b1 = wait_counter(&rig, id, COUNT, 10, SECS_30)?;
    container_checkpoint_ok(&rig, id, "ck/crc:1", true)?;
    let a1 = read_counter(&rig, id, COUNT)?;
    kill_and_remove(&rig, id)?;
    let started = Instant::now();
    container_restore_live_ok(&rig, id, "ck/crc:1", true)?;
    check_resumed(&rig, id, b1, a1, started)?;

    let b2 = wait_counter(&rig, id, COUNT, a1 + 15, SECS_30)?;
    container_checkpoint_ok(&rig, id, "ck/crc:2", true)?;
    let a2 = read_counter(&rig, id, COUNT)?;
    kill_and_remove(&rig, id)?;
    let started = Instant::now();
    container_restore_live_ok(&rig, id, "ck/crc:2", true)?;
    check_resumed(&rig, id, b2, a2, started)?;
    Ok(())
}

/// Scenario 8b: a process holds a file of its writable layer open, and `ctr c checkpoint`
/// without `--rw` leaves the layer out, so the restored rootfs lacks the file. runc.v2 fails
/// inside CRIU ("criu failed"); gpusnap refuses before runc runs, naming the file and `--rw`.
/// The same container checkpointed with `--rw` restores under both.
fn open_file_left_out_of_the_checkpoint(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "held";
    let script = "exec 3>/tmp/held; echo x >&3; while :; do sleep 0.1; done";
    rig.run_detached(rt, id, &["sh", "-c", script])?;
    poll(SECS_10, "/tmp/held in the container", || {
        read_in_task(&rig, id, "/tmp/held").filter(|s| s == "x\n")
    })?;
    container_checkpoint_ok(&rig, id, "ck/held:1", false)?;
    container_checkpoint_ok(&rig, id, "ck/held:rw", true)?;
    kill_and_remove(&rig, id)?;

    let out = container_restore(&rig, id, "ck/held:1", false, true)?;
    ensure!(
        !out.status.success(),
        "the restore without the writable layer succeeded: {}",
        out.describe()
    );
    let err = out.stderr_str();
    match rt {
        Runtime::RuncV2 => ensure!(err.contains("criu failed"), "{err:?}"),
        Runtime::Gpusnap => {
            for want in [
                format!("cannot restore {id}:"),
                "hold files open".into(),
                "/tmp/held (missing)".into(),
                "ctr containers checkpoint --task --rw".into(),
                "nothing was restored".into(),
            ] {
                ensure!(err.contains(&want), "error lacks {want:?}: {err:?}");
            }
            ensure!(
                !rig.runc_list()?.contains(&id.to_string()),
                "runc knows {id}, so runc restore ran"
            );
        }
    }
    ensure!(
        rig.task(id)?
            .is_none_or(|t| t.state != TaskState::Running && t.pid == 0),
        "a task runs after the failed restore: {:?}",
        rig.task(id)?
    );

    container_restore_live_ok(&rig, "held-rw", "ck/held:rw", true)?;
    let pid = rig.task_pid("held-rw")?;
    let fd3 = fs::read_link(format!("/proc/{pid}/fd/3"))?;
    ensure!(
        fd3.ends_with("tmp/held"),
        "fd 3 of the restored process is {}",
        fd3.display()
    );
    Ok(())
}

/// Scenario 9: checkpointing a STOPPED task fails with a clear error, stores no image and
/// leaves the task (and its exit code) as it was. ctr pauses the task before it asks for the
/// checkpoint, so the refusal comes from Pause: runc.v2 says "cannot pause a stopped
/// container", gpusnap "container … cannot be paused: it is Stopped".
fn stopped_task_checkpoint_refused(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let id = "stopped";
    let fifo = fifo_dir(&rig);
    rig.ctr_ok(&[
        "run",
        "--detach",
        "--null-io",
        "--runtime",
        rt.runtime_type(),
        "--fifo-dir",
        fifo.as_str(),
        BUSYBOX_IMAGE,
        id,
        "sh",
        "-c",
        "exit 3",
    ])?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_30)?;

    let t = task_checkpoint(&rig, id, &[])?;
    let c = container_checkpoint(&rig, id, "ck/stopped:1", false)?;
    for (what, out) in [("ctr t checkpoint", &t), ("ctr c checkpoint --task", &c)] {
        ensure!(
            !out.status.success(),
            "{what} of a stopped task succeeded: {}",
            out.describe()
        );
        let err = out.stderr_str();
        let lower = err.to_lowercase();
        ensure!(
            lower.contains("stopped") && lower.contains("pause"),
            "{what}: error does not say the task is stopped: {err:?}"
        );
        match rt {
            Runtime::Gpusnap => ensure!(
                err.contains(&format!("container {id} cannot be paused: it is stopped")),
                "{what}: {err:?}"
            ),
            Runtime::RuncV2 => ensure!(
                err.contains("cannot pause a stopped container"),
                "{what}: {err:?}"
            ),
        }
    }
    assert_no_checkpoint_images(&rig)?;
    ensure!(
        rig.task_state(id)? == Some(TaskState::Stopped),
        "task state changed: {:?}",
        rig.task_state(id)?
    );
    let code = rig.delete_task(id)?;
    ensure!(
        code == 3,
        "exit code after refused checkpoints: {code}, want 3"
    );
    Ok(())
}

/// Scenario 10 (gpusnap only): a `criu.tar` whose pages image has flipped bytes, whose pages
/// image is truncated, or whose manifest is gone, is refused by `ctr c restore --live` with
/// the reason, before CRIU runs: no criu-restore work dir, no restore.log, runc never created
/// the container, the task stays CREATED with no pid and can be deleted. The untouched bytes
/// then restore fine (so the refusals came from the damage, not from the blob rewriting).
fn damaged_images_refused_before_criu(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    rig.run_detached(rt, "src", COUNTER)?;
    let before = wait_counter(&rig, "src", COUNT, 10, SECS_30)?;
    let image = "ck/src:1";
    container_checkpoint_ok(&rig, "src", image, true)?;
    let blob = criu_tar_blob(&rig, image)?;
    let pristine = fs::read(&blob)?;
    let (manifest_name, m) = manifest_in_tar(&pristine)?;
    // The biggest pages image: the one with the process's memory.
    let pages = parse_tar(&pristine)?
        .into_iter()
        .filter(|e| e.name().starts_with("pages-") && e.name().ends_with(".img"))
        .max_by_key(|e| e.data.len())
        .context("no pages-*.img in the checkpoint")?;
    let pages_name = pages.name();
    ensure!(
        pages.data.len() >= 8192,
        "{pages_name} is only {} bytes",
        pages.data.len()
    );
    ensure!(
        m["images"]["files"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["path"] == pages_name.as_str())),
        "manifest does not list {pages_name}"
    );

    type Edit = Box<dyn Fn(&mut Vec<gpusnap_testkit::checkpoint::TarEntry>) -> Result<()>>;
    let name = pages_name.clone();
    let flip: Edit = Box::new(move |es| {
        let e = es
            .iter_mut()
            .find(|e| e.name() == name)
            .context("pages gone")?;
        let mut d = e.data.clone();
        let mid = d.len() / 2;
        for b in &mut d[mid..mid + 16] {
            *b ^= 0x5a;
        }
        e.set_data(d);
        Ok(())
    });
    let name = pages_name.clone();
    let truncate: Edit = Box::new(move |es| {
        let e = es
            .iter_mut()
            .find(|e| e.name() == name)
            .context("pages gone")?;
        let half = e.data.len() / 2;
        let d = e.data[..half].to_vec();
        e.set_data(d);
        Ok(())
    });
    let name = manifest_name.clone();
    let drop_manifest: Edit = Box::new(move |es| {
        let n = es.len();
        es.retain(|e| e.name() != name);
        ensure!(es.len() == n - 1, "no manifest to remove");
        Ok(())
    });
    let half = pages.data.len() / 2;
    let full = pages.data.len();
    let cases: Vec<(&str, Edit, Vec<String>)> = vec![
        (
            "bad-digest",
            flip,
            vec![
                format!("{pages_name} is corrupted"),
                "digest".into(),
                "differs from the manifest".into(),
            ],
        ),
        (
            "truncated",
            truncate,
            vec![
                format!("{pages_name} is {half} bytes but the manifest says {full}"),
                "truncated".into(),
            ],
        ),
        (
            "no-manifest",
            drop_manifest,
            vec![
                "not a complete gpusnap checkpoint".into(),
                format!("{manifest_name} is missing"),
            ],
        ),
    ];

    for (id, edit, want) in cases {
        rewrite_criu_tar(&blob, |es| edit(es))?;
        let out = container_restore(&rig, id, image, true, true)?;
        let err = out.stderr_str();
        ensure!(
            !out.status.success(),
            "{id}: restore succeeded: {}",
            out.describe()
        );
        ensure!(
            err.contains(&format!("cannot restore {id}:")),
            "{id}: error does not name the refused restore: {err:?}"
        );
        for w in &want {
            ensure!(err.contains(w.as_str()), "{id}: error lacks {w:?}: {err:?}");
        }
        // Refused before CRIU: nothing of a restore happened.
        let t = rig
            .task(id)?
            .with_context(|| format!("{id}: no task after the refusal"))?;
        ensure!(
            t.state == TaskState::Created && t.pid == 0,
            "{id}: task after refusal {t:?}, want CREATED with pid 0"
        );
        let bundle = rig.bundle_dir(id);
        ensure!(
            !bundle.join("criu-restore").exists(),
            "{id}: {} exists: CRIU was set up",
            bundle.join("criu-restore").display()
        );
        for root in [bundle.as_path(), rig.runtime_dir()] {
            if let Some(log) = find_file(root, "restore.log") {
                bail!("{id}: CRIU ran: {} exists", log.display());
            }
        }
        ensure!(
            !rig.runc_list()?.contains(&id.to_string()),
            "{id}: runc knows the container, so runc restore ran"
        );
        let out = rig.try_delete_task(id)?;
        ensure!(
            out.status.success(),
            "{id}: deleting the refused task: {}",
            out.describe()
        );
        let out = rig.delete_container(id)?;
        ensure!(
            out.status.success(),
            "{id}: deleting the container: {}",
            out.describe()
        );
        write_blob(&blob, &pristine)?;
    }

    // Control: the same image, undamaged, restores.
    let started = Instant::now();
    container_restore_live_ok(&rig, "intact", image, true)?;
    let hi = read_counter(&rig, "src", COUNT)?;
    check_resumed(&rig, "intact", before, hi, started)?;
    Ok(())
}

/// The memory-controller cgroup path of a process (cgroup v1; the unified path on v2).
fn memory_cgroup(pid: u32) -> Result<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let entry = |want: &dyn Fn(&str) -> bool| {
        s.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            want(ctrl).then(|| path.to_string())
        })
    };
    entry(&|c| c.split(',').any(|c| c == "memory"))
        .or_else(|| entry(&|c| c.is_empty()))
        .with_context(|| format!("no memory cgroup for {pid} in {s:?}"))
}

fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    let rd = fs::read_dir(root).ok()?;
    for e in rd.flatten() {
        let ft = e.file_type().ok()?;
        if ft.is_dir() {
            // Do not descend into the container rootfs mount.
            if e.file_name() == "rootfs" {
                continue;
            }
            if let Some(p) = find_file(&e.path(), name) {
                return Some(p);
            }
        } else if e.file_name() == name {
            return Some(e.path());
        }
    }
    None
}

/// Scenario 11: containerd (and so both shims and runc) without `criu` on PATH: both ways of
/// checkpointing fail, the error says CRIU is missing (gpusnap also how to install it), no
/// image is stored, and the container keeps running unpaused with the same pid.
fn missing_criu_is_reported(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_with(RigOptions {
        require_gpusnap: rt == Runtime::Gpusnap,
        criu_on_path: false,
        ..RigOptions::default()
    })?;
    let path = rig.path_env().to_string_lossy().into_owned();
    ensure!(
        std::env::split_paths(&path).all(|d| !d.join("criu").exists()),
        "rig PATH {path} still has a criu"
    );
    let id = "nocriu";
    rig.run_detached(rt, id, COUNTER)?;
    wait_counter(&rig, id, COUNT, 5, SECS_30)?;
    let pid = rig.task_pid(id)?;

    let t = task_checkpoint(&rig, id, &[])?;
    let c = container_checkpoint(&rig, id, "ck/nocriu:1", false)?;
    for (what, out) in [("ctr t checkpoint", &t), ("ctr c checkpoint --task", &c)] {
        ensure!(
            !out.status.success(),
            "{what} without criu succeeded: {}",
            out.describe()
        );
        let err = out.stderr_str();
        match rt {
            Runtime::Gpusnap => {
                for w in [
                    "criu not found on PATH",
                    "install it with scripts/setup-env.sh",
                    "criu.binary_dir",
                ] {
                    ensure!(err.contains(w), "{what}: error lacks {w:?}: {err:?}");
                }
            }
            Runtime::RuncV2 => ensure!(
                err.contains("\"criu\": executable file not found"),
                "{what}: {err:?}"
            ),
        }
        let t = rig.task(id)?.context("task gone")?;
        ensure!(
            t.pid == pid && t.state == TaskState::Running,
            "{what}: container after the failure: {t:?}, want pid {pid} RUNNING"
        );
        let now = read_counter(&rig, id, COUNT)?;
        wait_counter(&rig, id, COUNT, now + 3, SECS_30)
            .with_context(|| format!("{what}: counter stuck at {now}; {}", diagnose(&rig, id)))?;
    }
    assert_no_checkpoint_images(&rig)?;
    Ok(())
}

/// gpusnap's config (here a file handed to the shim per container as the runtime options'
/// ConfigPath, `ctr run --runtime-config-path`) says `criu.min_version = "99.0"`: the
/// installed CRIU 4.x is too old, so the checkpoint is refused before CRIU runs, naming both
/// versions, and the container keeps running. (The gpusnap-runc wrapper applies the same
/// setting: shim/cli/src/runc_wrapper/checkpoint.rs `criu_min`.)
fn criu_min_version_config_enforced(rt: Runtime) -> Result<()> {
    let rig = CkRig::start_for(rt)?;
    let cfg = rig.dir().join("gpusnap-config.toml");
    fs::write(&cfg, "[criu]\nmin_version = \"99.0\"\n")?;
    let opts = RunOpts {
        extra_args: vec![
            "--runtime-config-path".into(),
            cfg.to_string_lossy().into_owned(),
        ],
        ..RunOpts::default()
    };
    // The file does reach the shim: a value below gpusnap's floor fails Create, naming it.
    let bad = rig.dir().join("gpusnap-config-bad.toml");
    fs::write(&bad, "[criu]\nmin_version = \"1.0\"\n")?;
    let fifo = fifo_dir(&rig);
    let bad_s = bad.to_string_lossy().into_owned();
    let out = rig.ctr(&[
        "run",
        "--detach",
        "--null-io",
        "--runtime",
        rt.runtime_type(),
        "--fifo-dir",
        fifo.as_str(),
        "--runtime-config-path",
        bad_s.as_str(),
        BUSYBOX_IMAGE,
        "bad-floor",
        "true",
    ])?;
    ensure!(
        !out.status.success() && out.stderr_str().contains("criu.min_version"),
        "a config with criu.min_version = 1.0 was not refused: {}",
        out.describe()
    );

    let id = "floor";
    rig.run_detached_with(rt, id, COUNTER, &opts)?;
    wait_counter(&rig, id, COUNT, 5, SECS_30)?;
    let pid = rig.task_pid(id)?;
    let out = task_checkpoint(&rig, id, &[])?;
    let err = out.stderr_str();
    ensure!(
        !out.status.success(),
        "checkpoint succeeded although criu.min_version = 99.0: {}",
        out.describe()
    );
    for w in ["needs CRIU >= 99.0", "is CRIU 4."] {
        ensure!(err.contains(w), "error lacks {w:?}: {err:?}");
    }
    let t = rig.task(id)?.context("task gone")?;
    ensure!(
        t.pid == pid && t.state == TaskState::Running,
        "after the refusal: {t:?}, want pid {pid} RUNNING"
    );
    let now = read_counter(&rig, id, COUNT)?;
    wait_counter(&rig, id, COUNT, now + 3, SECS_30)?;
    assert_no_checkpoint_images(&rig)?;
    Ok(())
}
