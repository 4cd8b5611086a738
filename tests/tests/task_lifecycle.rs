//! Task lifecycle scenarios run against a real containerd, once with containerd's
//! `io.containerd.runc.v2` shim (the reference) and once with our
//! `io.containerd.gpusnap.v2` shim. Every scenario asserts concrete, observable
//! behaviour (exit codes, bytes, states, pids), so both runtimes must behave the same.
//!
//! Needs root and `scripts/setup-env.sh`. The gpusnap variants fail with a clear
//! message while `containerd-shim-gpusnap-v2` has not been built.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::{wait_for, wait_until, OutputExt, Rig, Runtime, TaskState};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

use gpusnap_testkit::scenario_tests;

scenario_tests! {
    exit_codes => exit_codes_runc_v2, exit_codes_gpusnap;
    stdout_stderr_capture => stdout_stderr_capture_runc_v2, stdout_stderr_capture_gpusnap;
    stdin_pipe => stdin_pipe_runc_v2, stdin_pipe_gpusnap;
    tty => tty_runc_v2, tty_gpusnap;
    exec => exec_runc_v2, exec_gpusnap;
    kill_signals => kill_signals_runc_v2, kill_signals_gpusnap;
    pause_resume => pause_resume_runc_v2, pause_resume_gpusnap;
    ps_pids => ps_pids_runc_v2, ps_pids_gpusnap;
    metrics => metrics_runc_v2, metrics_gpusnap;
    delete => delete_runc_v2, delete_gpusnap;
    containerd_restart => containerd_restart_runc_v2, containerd_restart_gpusnap;
    shim_sigkill_cleanup => shim_sigkill_cleanup_runc_v2, shim_sigkill_cleanup_gpusnap;
}

// ----- helpers ----------------------------------------------------------------------------

/// A long-running container command: loops until killed; exits 0 on SIGTERM.
const IDLE: &[&str] = &[
    "sh",
    "-c",
    "trap 'exit 0' TERM; while :; do sleep 0.1; done",
];

/// Read a file inside the container through /proc/<pid>/root (works while paused).
fn read_in_container(pid: u32, path: &str) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/root{path}")).ok()
}

/// Host state of a process: `None` if gone, else the State letter from /proc/<pid>/status.
fn proc_state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

fn proc_ppid(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn proc_comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Dead for our purposes: gone, or a zombie nobody reaped yet.
fn proc_dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// cgroup directories of container `id` (default cgroupsPath `/<ns>/<id>`) that exist
/// in any mounted hierarchy.
fn container_cgroups(rig: &Rig, id: &str) -> Vec<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v = Vec::new();
    for l in mountinfo.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let fstype = post.split(' ').next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        if let Some(mp) = pre.split(' ').nth(4) {
            let d = Path::new(mp).join(rig.namespace()).join(id);
            if d.is_dir() {
                v.push(d);
            }
        }
    }
    v
}

/// After a task is gone: no bundle, no mounts under it, no cgroup, no runc state.
fn assert_no_leftovers(rig: &Rig, id: &str) -> Result<()> {
    let bundle = rig.bundle_dir(id);
    ensure!(
        wait_until(SECS_10, || Rig::mounts_under(&bundle).is_empty()),
        "mounts left under {}: {:?}",
        bundle.display(),
        Rig::mounts_under(&bundle)
    );
    ensure!(
        wait_until(SECS_10, || !bundle.exists()),
        "bundle dir {} still exists",
        bundle.display()
    );
    ensure!(
        wait_until(SECS_10, || container_cgroups(rig, id).is_empty()),
        "cgroups of {id} still exist: {:?}",
        container_cgroups(rig, id)
    );
    let runc = rig.runc_list()?;
    ensure!(
        !runc.contains(&id.to_string()),
        "runc still knows {id}: {runc:?}"
    );
    ensure!(rig.shim_pid(id).is_none(), "shim for {id} still running");
    Ok(())
}

/// SIGKILL to task `id`, which stops; its delete reports exit code 137.
fn sigkill_and_delete_task(rig: &Rig, id: &str) -> Result<()> {
    rig.kill(id, "SIGKILL")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    let code = rig.delete_task(id)?;
    ensure!(
        code == 137,
        "delete of the SIGKILLed task {id}: exit code {code}, want 137"
    );
    Ok(())
}

/// Deterministic pseudo-random bytes covering every byte value.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|i| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            if i < 256 {
                i as u8
            } else {
                (x >> 24) as u8
            }
        })
        .collect()
}

// ----- scenarios ---------------------------------------------------------------------------

/// `ctr run --rm` propagates the container's exit status: 0, 1, 42, 137 for a shell
/// whose child was SIGKILLed (`kill -9 $$` in sh) and 137 for an init killed with
/// SIGKILL from outside. PID 1 cannot SIGKILL itself (the kernel ignores signals from
/// inside its PID namespace that it has no handler for). A missing binary is a failed
/// start; `--rm` removes the containers.
fn exit_codes(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    for (id, script, want) in [
        ("exit-0", "exit 0", 0),
        ("exit-1", "exit 1", 1),
        ("exit-42", "echo bye; exit 42", 42),
        ("exit-137", "sh -c 'kill -9 $$'; exit $?", 137),
        ("pid1-self-kill", "kill -9 $$; echo survived; exit 7", 7),
    ] {
        let out = rig.run(rt, id, &["sh", "-c", script])?;
        ensure!(
            out.code() == Some(want),
            "{id}: expected exit {want}, got {}",
            out.describe()
        );
    }

    // Init SIGKILLed from outside: `ctr run` exits 137.
    let run = rig.spawn_run(rt, "killed", IDLE)?;
    rig.wait_task_state("killed", TaskState::Running, SECS_30)?;
    rig.kill("killed", "SIGKILL")?;
    let out = run.wait_timeout(SECS_30)?;
    ensure!(
        out.code() == Some(137),
        "init killed by SIGKILL: {}",
        out.describe()
    );

    let out = rig.run(rt, "no-such-binary", &["/no/such/binary"])?;
    ensure!(
        !out.status.success(),
        "starting a missing binary succeeded: {}",
        out.describe()
    );
    let err = out.stderr_str();
    ensure!(
        err.contains("no such file") || err.contains("not found"),
        "missing binary: unexpected error {err:?}"
    );
    let _ = rig.delete_container("no-such-binary");
    ensure!(
        rig.containers()?.is_empty(),
        "containers left after --rm: {:?}",
        rig.containers()?
    );
    ensure!(rig.tasks()?.is_empty(), "tasks left: {:?}", rig.tasks()?);
    Ok(())
}

/// stdout and stderr arrive separately and byte-exact, including binary bytes, missing
/// final newlines and large volumes written right before exit.
fn stdout_stderr_capture(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let out = rig.run(
        rt,
        "stdio",
        &[
            "sh",
            "-c",
            r"echo out-1; echo err-1 >&2; echo out-2; printf '\001\377' >&2; printf no-newline",
        ],
    )?;
    ensure!(out.code() == Some(0), "{}", out.describe());
    ensure!(
        out.stdout == b"out-1\nout-2\nno-newline",
        "stdout: {:?}",
        out.stdout_str()
    );
    ensure!(out.stderr == b"err-1\n\x01\xff", "stderr: {:?}", out.stderr);

    // Volume: 1 MiB on stderr, ~290 KB on stdout. The short sleep before exit lets the
    // pipes drain: containerd's runc shim waits at most 2 s for its output copies when the
    // task is deleted, and a loaded 2-core CI machine has been seen to lose the tail.
    let out = rig.run(
        rt,
        "stdio-big",
        &[
            "sh",
            "-c",
            "seq 1 50000; head -c 1048576 /dev/zero | tr '\\0' e >&2; sleep 0.5; exit 3",
        ],
    )?;
    ensure!(out.code() == Some(3), "exit: {}", out.status);
    let want: String = (1..=50000).map(|i| format!("{i}\n")).collect();
    ensure!(
        out.stdout == want.as_bytes(),
        "big stdout: got {} bytes, want {}",
        out.stdout.len(),
        want.len()
    );
    ensure!(
        out.stderr.len() == 1 << 20 && out.stderr.iter().all(|b| *b == b'e'),
        "big stderr: got {} bytes",
        out.stderr.len()
    );
    Ok(())
}

/// Bytes piped into `ctr run` reach the container's stdin unchanged; EOF is delivered.
fn stdin_pipe(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let data = pattern(256 * 1024);
    let opts = gpusnap_testkit::RunOpts {
        stdin: Some(data.clone()),
        ..Default::default()
    };
    let out = rig.run_with(rt, "stdin-cat", &["cat"], &opts)?;
    ensure!(out.code() == Some(0), "{}", out.describe());
    ensure!(
        out.stdout.len() == data.len(),
        "cat echoed {} bytes, want {}",
        out.stdout.len(),
        data.len()
    );
    ensure!(out.stdout == data, "cat echoed different bytes");

    let opts = gpusnap_testkit::RunOpts {
        stdin: Some(b"first line\nsecond\n".to_vec()),
        ..Default::default()
    };
    let out = rig.run_with(
        rt,
        "stdin-read",
        &[
            "sh",
            "-c",
            "read a; read b; echo \"<$b|$a>\"; cat; echo eof",
        ],
        &opts,
    )?;
    ensure!(
        out.stdout_str() == "<second|first line>\neof\n",
        "{}",
        out.describe()
    );

    // No stdin at all (/dev/null): cat sees EOF immediately.
    let out = rig.run(rt, "stdin-none", &["sh", "-c", "cat; echo done"])?;
    ensure!(
        out.stdout_str() == "done\n" && out.code() == Some(0),
        "{}",
        out.describe()
    );
    Ok(())
}

/// `--tty`: the container's stdio is a terminal (/dev/pts/N) sized like ctr's; stdout
/// and stderr both go through it; without --tty nothing is a terminal.
fn tty(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let out = rig.run_tty(
        rt,
        "tty",
        &[
            "sh",
            "-c",
            "tty; test -t 0 && echo stdin-is-tty; test -t 1 && echo stdout-is-tty; echo on-stderr >&2; \
             i=0; until s=$(stty size 2>/dev/null); [ -n \"$s\" ] && [ \"$s\" != '0 0' ]; do \
               [ $i -ge 50 ] && break; sleep 0.1; i=$((i+1)); done; echo \"size=$s\"; exit 3",
        ],
    )?;
    let text = out.text();
    ensure!(
        out.status.code() == Some(3),
        "exit status {} output {text:?}",
        out.status
    );
    let tty_line = text.lines().find(|l| l.starts_with("/dev/")).unwrap_or("");
    ensure!(
        tty_line
            .strip_prefix("/dev/pts/")
            .is_some_and(|n| n.parse::<u32>().is_ok()),
        "`tty` did not print /dev/pts/N: {text:?}"
    );
    for want in ["stdin-is-tty", "stdout-is-tty", "on-stderr", "size=24 80"] {
        ensure!(
            text.lines().any(|l| l == want),
            "missing {want:?} in tty output {text:?}"
        );
    }

    let out = rig.run(
        rt,
        "no-tty",
        &[
            "sh",
            "-c",
            "test -t 0 || echo stdin-not-tty; test -t 1 || echo stdout-not-tty; tty",
        ],
    )?;
    ensure!(
        out.code() == Some(1),
        "`tty` without a terminal should exit 1: {}",
        out.describe()
    );
    ensure!(
        out.stdout_str() == "stdin-not-tty\nstdout-not-tty\nnot a tty\n",
        "{}",
        out.describe()
    );
    Ok(())
}

/// `ctr tasks exec`: exit codes, separate stdout/stderr, stdin, tty, same namespaces and
/// filesystem as the init process, exec id reuse, failure on a stopped task.
fn exec(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "exec";
    rig.run_detached(
        rt,
        id,
        &[
            "sh",
            "-c",
            "echo from-init > /tmp/marker; trap 'exit 0' TERM; while :; do sleep 0.1; done",
        ],
    )?;

    let out = wait_for(SECS_10, "exec to see /tmp/marker", || {
        let o = rig.exec(id, "e-cat", &["cat", "/tmp/marker"])?;
        Ok(o.status.success().then_some(o))
    })?;
    ensure!(out.stdout == b"from-init\n", "{}", out.describe());

    let out = rig.exec(
        id,
        "e1",
        &["sh", "-c", "echo from-exec; echo exec-err >&2; exit 5"],
    )?;
    ensure!(out.code() == Some(5), "{}", out.describe());
    ensure!(
        out.stdout == b"from-exec\n" && out.stderr == b"exec-err\n",
        "{}",
        out.describe()
    );

    // The exec id is free again once the previous exec finished.
    let out = rig.exec(id, "e1", &["sh", "-c", "kill -9 $$"])?;
    ensure!(
        out.code() == Some(137),
        "exec killing itself: {}",
        out.describe()
    );

    // Same PID namespace: PID 1 is the init shell.
    let out = rig.exec(id, "e-pid1", &["cat", "/proc/1/cmdline"])?;
    ensure!(
        out.stdout.starts_with(b"sh\0-c\0echo from-init"),
        "{}",
        out.describe()
    );

    let opts = gpusnap_testkit::ExecOpts {
        stdin: Some(b"to-exec-stdin\n".to_vec()),
        ..Default::default()
    };
    let out = rig.exec_with(id, "e-stdin", &["sh", "-c", "cat; echo end"], &opts)?;
    ensure!(out.stdout == b"to-exec-stdin\nend\n", "{}", out.describe());

    let out = rig.exec_tty(
        id,
        "e-tty",
        &["sh", "-c", "tty; test -t 0 && echo is-tty; exit 4"],
    )?;
    let text = out.text();
    ensure!(
        out.status.code() == Some(4),
        "exec --tty exit {} output {text:?}",
        out.status
    );
    ensure!(
        text.contains("/dev/pts/") && text.contains("is-tty"),
        "exec --tty output {text:?}"
    );

    let out = rig.exec(id, "e-missing", &["/no/such/binary"])?;
    ensure!(
        !out.status.success(),
        "exec of a missing binary succeeded: {}",
        out.describe()
    );

    // Task still running and unaffected; then stop it and exec must fail.
    ensure!(
        rig.task_state(id)? == Some(TaskState::Running),
        "task state after execs: {:?}",
        rig.task_state(id)?
    );
    rig.kill(id, "SIGTERM")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    let out = rig.exec(id, "e-late", &["true"])?;
    ensure!(
        !out.status.success(),
        "exec into a stopped task succeeded: {}",
        out.describe()
    );
    let code = rig.delete_task(id)?;
    ensure!(code == 0, "exit code reported by delete: {code}");
    Ok(())
}

/// Signals: a TERM trap runs and sets the exit code; USR1 trap keeps the task running;
/// TERM without a handler is ignored by PID 1; SIGKILL gives 137.
fn kill_signals(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;

    // Foreground `ctr run`: TERM trap.
    let run = rig.spawn_run(
        rt,
        "term",
        &[
            "sh",
            "-c",
            "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.1; done",
        ],
    )?;
    wait_for(SECS_30, "container `term` to print ready", || {
        Ok(run.stdout_so_far().starts_with(b"ready\n").then_some(()))
    })?;
    rig.kill("term", "SIGTERM")?;
    let out = run.wait_timeout(SECS_30)?;
    ensure!(out.code() == Some(42), "TERM trap exit: {}", out.describe());
    ensure!(out.stdout == b"ready\ngot-term\n", "{}", out.describe());

    // USR1 trap: handled twice, task keeps running; then SIGKILL.
    let id = "usr1";
    let t = rig.run_detached(
        rt,
        id,
        &[
            "sh",
            "-c",
            "trap 'echo usr1 >> /tmp/got' USR1; while :; do sleep 0.1; done",
        ],
    )?;
    for n in 1..=2 {
        rig.kill(id, "SIGUSR1")?;
        let want = "usr1\n".repeat(n);
        ensure!(
            wait_until(SECS_10, || read_in_container(t.pid, "/tmp/got").as_deref()
                == Some(want.as_str())),
            "USR1 #{n} not handled: /tmp/got = {:?}",
            read_in_container(t.pid, "/tmp/got")
        );
    }
    ensure!(
        rig.task_state(id)? == Some(TaskState::Running),
        "after USR1: {:?}",
        rig.task_state(id)?
    );
    sigkill_and_delete_task(&rig, id)?;

    // PID 1 without a TERM handler ignores SIGTERM (the kernel drops it), numeric signal works.
    let id = "noterm";
    let t = rig.run_detached(rt, id, &["sh", "-c", "while :; do sleep 0.1; done"])?;
    rig.kill(id, "SIGTERM")?;
    // `kill` returns once runc's kill(2) did: the kernel has then either dropped SIGTERM (a
    // namespace's init without a handler) or queued it. Proof that it was dropped, without
    // waiting: no TERM handler, and TERM pending neither for the thread nor the process.
    let status = fs::read_to_string(format!("/proc/{}/status", t.pid))?;
    let mask = |field: &str| -> Result<u64> {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .with_context(|| format!("{field} missing from /proc/{}/status", t.pid))?;
        Ok(u64::from_str_radix(hex.trim(), 16)?)
    };
    let term = 1u64 << (libc::SIGTERM - 1);
    for field in ["SigCgt:", "SigPnd:", "ShdPnd:"] {
        ensure!(
            mask(field)? & term == 0,
            "SIGTERM is in {field} of the init: not dropped by the kernel"
        );
    }
    ensure!(
        rig.task_state(id)? == Some(TaskState::Running),
        "PID 1 died of an unhandled SIGTERM"
    );
    ensure!(!proc_dead(t.pid), "init process gone");
    rig.kill(id, "9")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    ensure!(
        wait_until(SECS_10, || proc_dead(t.pid)),
        "init {} still alive after SIGKILL",
        t.pid
    );
    let code = rig.delete_task(id)?;
    ensure!(
        code == 137,
        "exit after `kill -s 9`: exit code {code}, want 137"
    );
    Ok(())
}

/// Pause freezes the container (state PAUSED, counter stops), resume thaws it (RUNNING,
/// counter continues), and a paused task can still be killed after resume.
fn pause_resume(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "pause";
    let t = rig.run_detached(
        rt,
        id,
        &["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done"],
    )?;
    let counter = || -> Option<u64> { read_in_container(t.pid, "/tmp/c")?.trim().parse().ok() };
    ensure!(
        wait_until(SECS_10, || counter().is_some_and(|c| c >= 3)),
        "counter not running: {:?}",
        counter()
    );

    rig.pause(id)?;
    rig.wait_task_state(id, TaskState::Paused, SECS_10)?;
    let frozen = counter().context("counter unreadable while paused")?;
    // The kernel's freezer holds the cgroup: proof that nothing in it runs (no sampling).
    gpusnap_testkit::can_fail::ensure_frozen(t.pid, "paused task")?;
    let still = counter().context("counter unreadable while paused")?;
    ensure!(
        still == frozen,
        "counter moved while paused: {frozen} -> {still}"
    );
    ensure!(
        rig.ps(id)?.contains(&t.pid),
        "ps of a paused task lacks init pid"
    );

    rig.resume(id)?;
    rig.wait_task_state(id, TaskState::Running, SECS_10)?;
    ensure!(
        wait_until(SECS_10, || counter().is_some_and(|c| c >= frozen + 3)),
        "counter did not resume: frozen at {frozen}, now {:?}",
        counter()
    );

    // Pause twice / resume twice round trip once more, then kill.
    rig.pause(id)?;
    rig.wait_task_state(id, TaskState::Paused, SECS_10)?;
    rig.resume(id)?;
    rig.wait_task_state(id, TaskState::Running, SECS_10)?;
    sigkill_and_delete_task(&rig, id)?;
    Ok(())
}

/// `ctr tasks ps`: host pids of init, its children and exec'd processes.
fn ps_pids(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "ps";
    let t = rig.run_detached(rt, id, &["sh", "-c", "sleep 1000 & sleep 1001 & wait"])?;
    let pids = wait_for(SECS_10, "3 processes in ps", || {
        let p = rig.ps(id)?;
        Ok((p.len() == 3).then_some(p))
    })?;
    ensure!(
        pids.contains(&t.pid),
        "ps {pids:?} lacks init pid {}",
        t.pid
    );
    ensure!(proc_comm(t.pid) == "sh", "init comm {:?}", proc_comm(t.pid));
    for p in pids.iter().filter(|p| **p != t.pid) {
        ensure!(proc_comm(*p) == "sleep", "pid {p} comm {:?}", proc_comm(*p));
        ensure!(
            proc_ppid(*p) == Some(t.pid),
            "pid {p} ppid {:?} != init {}",
            proc_ppid(*p),
            t.pid
        );
    }

    let opts = gpusnap_testkit::ExecOpts {
        detach: true,
        ..Default::default()
    };
    let out = rig.exec_with(id, "bg", &["sleep", "1002"], &opts)?;
    ensure!(out.status.success(), "exec --detach: {}", out.describe());
    let pids4 = wait_for(SECS_10, "4 processes in ps", || {
        let p = rig.ps(id)?;
        Ok((p.len() == 4).then_some(p))
    })?;
    let exec_pid = *pids4
        .iter()
        .find(|p| !pids.contains(p))
        .context("no new pid")?;
    let cmdline = fs::read(format!("/proc/{exec_pid}/cmdline"))?;
    ensure!(
        cmdline == b"sleep\x001002\x00",
        "exec'd process cmdline {:?}",
        String::from_utf8_lossy(&cmdline)
    );

    rig.kill_all(id, "SIGKILL")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    for p in &pids4 {
        ensure!(
            wait_until(SECS_10, || proc_dead(*p)),
            "pid {p} survived kill --all"
        );
    }
    let code = rig.delete_task(id)?;
    ensure!(code == 137, ": exit code {code}, want 137");
    Ok(())
}

/// `ctr tasks metrics`: cgroup metrics with memory, pids and cpu present and non-zero
/// (cgroup v1 `io.containerd.cgroups.v1.Metrics` or v2 `io.containerd.cgroups.v2.Metrics`).
fn metrics(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "metrics";
    rig.run_detached(
        rt,
        id,
        &["sh", "-c", "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 1000 & trap 'exit 0' TERM; while :; do sleep 0.1; done"],
    )?;
    let m = wait_for(SECS_10, "metrics with pids.current >= 2", || {
        let m = rig.metrics(id)?;
        Ok((m
            .pointer("/pids/current")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            >= 2)
            .then_some(m))
    })?;
    let num = |ptrs: &[&str]| {
        ptrs.iter()
            .find_map(|p| m.pointer(p).and_then(|v| v.as_u64()))
    };
    // v1: memory.usage.usage, cpu.usage.total; v2: memory.usage, cpu.usage_usec.
    let mem = num(&["/memory/usage/usage", "/memory/usage"]);
    let cpu = num(&["/cpu/usage/total", "/cpu/usage_usec"]);
    let pids = num(&["/pids/current"]);
    ensure!(
        mem.is_some_and(|v| v > 0),
        "memory usage missing/zero in {m}"
    );
    ensure!(cpu.is_some_and(|v| v > 0), "cpu usage missing/zero in {m}");
    ensure!(
        pids.is_some_and(|v| v >= 2),
        "pids.current missing/too small in {m}"
    );

    // The table format works too.
    let table = rig.ctr_ok(&["tasks", "metrics", id])?;
    ensure!(table.contains("pids.current"), "table metrics: {table:?}");

    rig.kill(id, "SIGTERM")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    let code = rig.delete_task(id)?;
    ensure!(code == 0, ": exit code {code}, want 0");
    // No metrics for a deleted task.
    ensure!(
        !rig.ctr(&["tasks", "metrics", id])?.status.success(),
        "metrics of a deleted task succeeded"
    );
    Ok(())
}

/// Deleting: refused for a running task and for a container with a task; allowed after
/// the task stopped (reports its exit code) and leaves nothing behind; `--force` kills.
fn delete(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "del";
    let t = rig.run_detached(rt, id, IDLE)?;
    ensure!(
        !rig.try_delete_task(id)?.status.success(),
        "deleting a running task succeeded"
    );
    ensure!(
        !rig.delete_container(id)?.status.success(),
        "deleting a container with a live task succeeded"
    );
    ensure!(
        rig.task_state(id)? == Some(TaskState::Running),
        "state after refused deletes: {:?}",
        rig.task_state(id)?
    );

    sigkill_and_delete_task(&rig, id)?;
    ensure!(rig.task(id)?.is_none(), "task still listed after delete");
    ensure!(proc_dead(t.pid), "init still alive");
    let out = rig.delete_container(id)?;
    ensure!(out.status.success(), "container delete: {}", out.describe());
    ensure!(
        rig.containers()?.is_empty(),
        "containers left: {:?}",
        rig.containers()?
    );
    assert_no_leftovers(&rig, id)?;

    // Second delete of the same task/container fails cleanly.
    ensure!(
        !rig.try_delete_task(id)?.status.success(),
        "deleting a deleted task succeeded"
    );

    // --force on a running task.
    let id = "del-force";
    let t = rig.run_detached(rt, id, IDLE)?;
    let code = rig.force_delete_task(id)?;
    ensure!(
        code == 137,
        "force delete reported exit code {code}, want 137"
    );
    ensure!(rig.task(id)?.is_none(), "task listed after force delete");
    ensure!(
        wait_until(SECS_10, || proc_dead(t.pid)),
        "init survived force delete"
    );
    ensure!(
        rig.delete_container(id)?.status.success(),
        "container delete after force delete failed"
    );
    assert_no_leftovers(&rig, id)?;
    Ok(())
}

/// containerd restarts (SIGTERM, start again on the same dirs) while the shim runs: the
/// task is still RUNNING with the same pid and shim, exec/kill/delete still work.
fn containerd_restart(rt: Runtime) -> Result<()> {
    let mut rig = Rig::start_for(rt)?;
    let id = "restart";
    let t = rig.run_detached(
        rt,
        id,
        &[
            "sh",
            "-c",
            "trap 'exit 3' TERM; while :; do sleep 0.1; done",
        ],
    )?;
    let shim = rig
        .shim_pid(id)
        .context("no shim process found for the task")?;
    let old_containerd = rig.containerd_pid();

    rig.restart_containerd()?;
    ensure!(
        rig.containerd_pid() != old_containerd,
        "containerd pid unchanged"
    );
    ensure!(!proc_dead(shim), "shim {shim} died with containerd");
    let after = rig
        .task(id)?
        .context("task lost across the containerd restart")?;
    ensure!(
        after.state == TaskState::Running && after.pid == t.pid,
        "after restart: {after:?}, before: {t:?}"
    );
    ensure!(
        rig.shim_pid(id) == Some(shim),
        "shim changed: {:?} vs {shim}",
        rig.shim_pid(id)
    );
    ensure!(rig.ps(id)?.contains(&t.pid), "ps after restart lacks init");

    let out = rig.exec(
        id,
        "after-restart",
        &["sh", "-c", "echo still-here; exit 6"],
    )?;
    ensure!(
        out.code() == Some(6) && out.stdout == b"still-here\n",
        "exec after restart: {}",
        out.describe()
    );

    rig.kill(id, "SIGTERM")?;
    rig.wait_task_state(id, TaskState::Stopped, SECS_10)?;
    let code = rig.delete_task(id)?;
    ensure!(
        code == 3,
        "exit code after restart: exit code {code}, want 3"
    );
    ensure!(
        wait_until(SECS_10, || proc_dead(shim)),
        "shim {shim} still running after delete"
    );
    ensure!(
        rig.delete_container(id)?.status.success(),
        "container delete failed"
    );
    assert_no_leftovers(&rig, id)?;
    Ok(())
}

/// The shim is SIGKILLed under a running task: containerd notices, runs the shim's
/// `delete` to clean up (runc state, mounts, container processes), publishes the exit,
/// and the container can be deleted.
fn shim_sigkill_cleanup(rt: Runtime) -> Result<()> {
    let rig = Rig::start_for(rt)?;
    let id = "shimkill";
    let t = rig.run_detached(rt, id, IDLE)?;
    let shim = rig
        .shim_pid(id)
        .context("no shim process found for the task")?;
    let mut events = rig.ctr_spawn(&["events"], None)?;
    std::thread::sleep(Duration::from_millis(300)); // let the subscription establish

    // SAFETY: kill(2) on the shim pid we just looked up.
    unsafe {
        libc::kill(shim as libc::pid_t, libc::SIGKILL);
    }
    ensure!(
        wait_until(SECS_10, || proc_dead(shim)),
        "shim {shim} survived SIGKILL"
    );
    rig.wait_task_gone(id, SECS_30).with_context(|| {
        format!(
            "containerd kept the task of a dead shim; log:\n{}",
            rig.log_tail(20)
        )
    })?;
    ensure!(
        wait_until(SECS_10, || proc_dead(t.pid)),
        "container init {} survived its shim's death",
        t.pid
    );

    let got_exit = wait_until(SECS_10, || {
        let s = String::from_utf8_lossy(&events.stdout_so_far()).into_owned();
        s.lines()
            .any(|l| l.contains("/tasks/exit") && l.contains(&format!("\"container_id\":\"{id}\"")))
    });
    let ev = String::from_utf8_lossy(&events.stdout_so_far()).into_owned();
    events.signal(libc::SIGKILL);
    let _ = events.try_status();
    ensure!(got_exit, "no /tasks/exit event for {id}; events: {ev:?}");

    let out = rig.delete_container(id)?;
    ensure!(
        out.status.success(),
        "container delete after shim death: {}",
        out.describe()
    );
    ensure!(
        rig.containers()?.is_empty(),
        "containers left: {:?}",
        rig.containers()?
    );
    assert_no_leftovers(&rig, id)?;

    // The rig still works: a new container with the same id runs.
    let out = rig.run(rt, id, &["sh", "-c", "echo again"])?;
    ensure!(
        out.code() == Some(0) && out.stdout == b"again\n",
        "re-run after cleanup: {}",
        out.describe()
    );
    Ok(())
}
