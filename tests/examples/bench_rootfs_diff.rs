//! What a large rootfs diff costs a restore through the real door: `gpusnap.io/restore-from` of
//! a CRI-archive-layout checkpoint (`NAME/checkpoint/`, `NAME/rootfs-diff.tar`, adopted by
//! root) under containerd's CRI and the gpusnap shim, as `tests/tests/rootfs_diff_scale.rs`
//! drives it. Run by `scripts/bench-rootfs-diff.sh`, which builds the shim and `gpusnap` in
//! release and points the test kit at them.
//!
//! One checkpoint of the counter, in three arms that differ only in the diff beside it:
//!
//! - `tiny`: 10 empty files (the baseline: everything a restore does but the diff);
//! - `big`: FILES empty files (default 200,000), 1,000 to a directory, restored with the
//!   node's `restore.max_rootfs_diff_entries` raised above them;
//! - `refused`: the same `big` checkpoint under the default `restore.max_rootfs_diff_entries`
//!   (100,000): timed from `CreateContainer` to the refusal, which must name the setting (what
//!   a node that keeps the default spends on such a diff);
//! - `floor`: no restore; the same FILES files created with `std::fs` in a fresh directory on
//!   the file system that holds containerd's snapshots (where the diff is applied): what
//!   creating those files costs there without gpusnap.
//!
//! A warm-up round (one of each, not counted) first; then REPS rounds, the order of the arms
//! rotating each round. A restore is timed from `CreateContainer` to the end of
//! `StartContainer` (the pod sandbox is made before and timed apart), and checked: the
//! container runs the checkpointed counter, which goes on counting, and the big diff's first
//! and last files are in its rootfs. The shim's `restore complete` line gives each phase.
//! Prints each round, the medians per arm and the ratios; nothing is asserted about speed.
//!
//! Usage: `bench_rootfs_diff [REPS=4] [FILES=200000]` (as root, with the rig of
//! `scripts/setup-env.sh`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gpusnap_testkit::counter::{check_continues, count_of, run_token, wait_count, Count, WARM};
use gpusnap_testkit::cri::{
    counter_container, gpusnap_handler, wait_for_state, CriNode, CriNodeOptions,
};
use gpusnap_testkit::rig::BUSYBOX_IMAGE;
use gpusnap_testkit::{describe, gpusnap, paths};
use k8s_cri::v1::ContainerState;

const PER_DIR: u64 = 1_000;
const TINY_FILES: u64 = 10;
/// The line that raises the node's entry cap for `big` (the `refused` arm takes it out).
fn raised(files: u64) -> String {
    format!("max_rootfs_diff_entries = {}\n", files + 10_000)
}

/// The shim's phase timings (`restore complete`), in the order a restore runs them.
const PHASES: [&str; 9] = [
    "validate_ms",
    "criu_prepare_ms",
    "privilege_check_ms",
    "rootfs_diff_ms",
    "layer_check_ms",
    "open_files_check_ms",
    "criu_restore_ms",
    "deadline_s",
    "total_ms",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Tiny,
    Big,
    Refused,
    Floor,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Tiny => "tiny",
            Arm::Big => "big",
            Arm::Refused => "refused",
            Arm::Floor => "floor",
        }
    }
}

/// One timed run of an arm.
struct Sample {
    /// RunPodSandbox (restores: the pod the container is restored into).
    pod_s: f64,
    /// CreateContainer + StartContainer: the restore; for `floor`, creating the files.
    restore_s: f64,
    /// The shim's `restore complete` fields ([`PHASES`]), absent for `floor`.
    phases: Vec<Option<u64>>,
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `key`'s number in a log line, as the shim's JSON (`"key":N`) or logfmt (`key=N`) has it.
fn field(line: &str, key: &str) -> Option<u64> {
    [format!("\"{key}\":"), format!("{key}=")]
        .iter()
        .find_map(|k| line.find(k.as_str()).map(|at| &line[at + k.len()..]))
        .and_then(|rest| {
            let digits: String = rest
                .trim_start_matches('"')
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
}

/// The phases of the shim's `restore complete` line for container `id`.
fn phases_of(log: &Path, id: &str) -> Vec<Option<u64>> {
    let text = fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("restore complete") && l.contains(id));
    PHASES
        .iter()
        .map(|k| line.and_then(|l| field(l, k)))
        .collect()
}

/// The file system type of `path` (`stat -f`), for the conditions printed.
fn fs_type(path: &Path) -> String {
    Command::new("stat")
        .args(["-f", "-c", "%T", s(path)])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

struct Bench<'a> {
    node: &'a CriNode,
    tok: String,
    checkpointed: Count,
    files: u64,
    /// Where `floor` creates its files: beside containerd's snapshots.
    floor_dir: PathBuf,
    round: usize,
}

impl Bench<'_> {
    fn run(&mut self, arm: Arm) -> Result<Sample> {
        self.round += 1;
        if arm == Arm::Floor {
            return self.floor();
        }
        if arm == Arm::Refused {
            return self.refused();
        }
        let name = format!("{}-{}", arm.name(), self.round);
        let t = Instant::now();
        let pod = self.node.run_pod(
            &name,
            &[("gpusnap.io/restore-from", arm.name())],
            gpusnap_handler(),
        )?;
        let pod_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let id = self
            .node
            .run_container(&pod, &counter_container(&self.tok))
            .with_context(|| format!("restore-from {}", arm.name()))?;
        let restore_s = t.elapsed().as_secs_f64();
        wait_for_state(
            self.node,
            &id,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )?;
        let pid = self.node.pid(&id)?;
        check_continues(&name, &self.checkpointed, || count_of(pid))?;
        if arm == Arm::Big {
            let last = self.files - 1;
            for f in [
                "data/d0/f0".to_owned(),
                format!("data/d{}/f{last}", last / PER_DIR),
            ] {
                ensure!(
                    fs::metadata(format!("/proc/{pid}/root/{f}")).is_ok_and(|m| m.is_file()),
                    "{f} is not in the restored rootfs of {name}"
                );
            }
        }
        let phases = phases_of(&self.node.rig.log_path(), &id);
        self.node.remove_pod(&pod.id)?;
        Ok(Sample {
            pod_s,
            restore_s,
            phases,
        })
    }

    /// `big` under the default entry cap: the node's config without the raised line for this
    /// pod (the shim reads it when the pod starts), put back after.
    fn refused(&mut self) -> Result<Sample> {
        let config = self.node.config_path();
        let text = fs::read_to_string(config)?;
        let line = raised(self.files);
        ensure!(text.contains(&line), "the node config lacks {line:?}");
        fs::write(config, text.replace(&line, ""))?;
        let name = format!("refused-{}", self.round);
        let sample = (|| -> Result<Sample> {
            let t = Instant::now();
            let pod = self.node.run_pod(
                &name,
                &[("gpusnap.io/restore-from", Arm::Big.name())],
                gpusnap_handler(),
            )?;
            let pod_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let err = match self
                .node
                .create_container(&pod, &counter_container(&self.tok))
            {
                Err(e) => e.to_string(),
                Ok(id) => match self.node.cri.start_container(&id) {
                    Err(e) => e.to_string(),
                    Ok(_) => anyhow::bail!("{name}: the diff restored under the default cap"),
                },
            };
            let restore_s = t.elapsed().as_secs_f64();
            ensure!(
                err.contains("restore.max_rootfs_diff_entries"),
                "{name}: the refusal does not name the setting: {err}"
            );
            self.node.remove_pod(&pod.id)?;
            Ok(Sample {
                pod_s,
                restore_s,
                phases: vec![None; PHASES.len()],
            })
        })();
        fs::write(config, text)?;
        sample
    }

    fn floor(&mut self) -> Result<Sample> {
        let dir = self.floor_dir.join(format!("round-{}", self.round));
        let t = Instant::now();
        for i in 0..self.files {
            let d = dir.join(format!("data/d{}", i / PER_DIR));
            if i % PER_DIR == 0 {
                fs::create_dir_all(&d)?;
            }
            fs::File::create(d.join(format!("f{i}")))?;
        }
        let restore_s = t.elapsed().as_secs_f64();
        fs::remove_dir_all(&dir)?;
        Ok(Sample {
            pod_s: 0.0,
            restore_s,
            phases: vec![None; PHASES.len()],
        })
    }
}

fn main() -> Result<()> {
    gpusnap_testkit::require_root();
    let mut args = std::env::args().skip(1);
    let reps: usize = args.next().map_or(Ok(4), |a| a.parse()).context("REPS")?;
    let files: u64 = args
        .next()
        .map_or(Ok(200_000), |a| a.parse())
        .context("FILES")?;
    ensure!(reps >= 1 && files >= 1, "REPS and FILES must be at least 1");
    let shim = paths::locate_gpusnap_shim()?;
    let cli = paths::locate_binary("gpusnap")?;
    println!("shim: {}\ngpusnap: {}", shim.display(), cli.display());

    let node = CriNode::start(CriNodeOptions {
        gpusnap_config: raised(files),
        ..Default::default()
    })?;
    node.import_image(&paths::busybox_archive(), BUSYBOX_IMAGE)?;
    let root = node.checkpoint_root();
    let tok = run_token();

    // One checkpoint of the counter (paused where it holds no file open, as the scale test).
    let pod = node.run_pod("origin", &[], gpusnap_handler())?;
    let id = node.run_container(&pod, &counter_container(&tok))?;
    wait_for_state(
        &node,
        &id,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )?;
    let pid = node.pid(&id)?;
    wait_count(&tok, "the counter", WARM, || count_of(pid))?;
    let taken = root.join("taken");
    fs::create_dir(&taken)?;
    let checkpointed = node.checkpoint_counter_to(&id, pid, &tok, &taken.join("checkpoint"))?;
    node.remove_pod(&pod.id)?;

    // The arms' checkpoints: the same images, each with its diff, adopted by root.
    let mut entries = Vec::new();
    for (arm, n) in [(Arm::Tiny, TINY_FILES), (Arm::Big, files)] {
        let dir = root.join(arm.name());
        fs::create_dir(&dir)?;
        let cp = Command::new("cp")
            .args([
                "-a",
                s(&taken.join("checkpoint")),
                s(&dir.join("checkpoint")),
            ])
            .output()?;
        ensure!(cp.status.success(), "{}", describe(&cp));
        let tar = dir.join("rootfs-diff.tar");
        let e = gpusnap_testkit::rootfs_diff::write_empty_files(&tar, n, PER_DIR)?;
        entries.push((arm, e, fs::metadata(&tar)?.len()));
        let out = gpusnap([
            "--config",
            s(node.config_path()),
            "checkpoint",
            "adopt",
            s(&dir),
        ]);
        ensure!(
            out.status.success(),
            "adopt {}: {}",
            dir.display(),
            describe(&out)
        );
    }
    let floor_dir = node.rig.root_dir().join("bench-floor");
    fs::create_dir_all(&floor_dir)?;

    println!(
        "conditions: {} CPUs, load average {}, containerd root {} ({}), checkpoints {} ({})",
        std::thread::available_parallelism().map_or(0, usize::from),
        fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        node.rig.root_dir().display(),
        fs_type(&node.rig.root_dir()),
        root.display(),
        fs_type(&root),
    );
    for (arm, e, bytes) in &entries {
        println!(
            "diff {}: {e} tar entries ({} files), {bytes} bytes of gzip",
            arm.name(),
            if *arm == Arm::Big { files } else { TINY_FILES }
        );
    }

    let mut bench = Bench {
        node: &node,
        tok,
        checkpointed,
        files,
        floor_dir,
        round: 0,
    };
    let arms = [Arm::Tiny, Arm::Big, Arm::Refused, Arm::Floor];
    println!("warm-up: one of each, not counted");
    for arm in arms {
        let w = bench.run(arm)?;
        println!("  {:<5} {:>7.2} s", arm.name(), w.restore_s);
    }

    let head = ["round", "arm", "pod_s", "restore_s"];
    println!(
        "\n{:>5} {:<5} {:>7} {:>9} {}",
        head[0],
        head[1],
        head[2],
        head[3],
        PHASES.join(" ")
    );
    let mut samples: Vec<(Arm, Sample)> = Vec::new();
    for round in 0..reps {
        // Each arm first once in every four rounds, so drift in the machine's load falls on
        // every arm alike.
        let mut order = arms;
        order.rotate_left(round % arms.len());
        for arm in order {
            let x = bench.run(arm)?;
            let phases: Vec<String> = x
                .phases
                .iter()
                .map(|p| p.map_or("-".into(), |v| v.to_string()))
                .collect();
            println!(
                "{:>5} {:<5} {:>7.2} {:>9.2} {}",
                round + 1,
                arm.name(),
                x.pod_s,
                x.restore_s,
                phases.join(" ")
            );
            samples.push((arm, x));
        }
    }

    let med = |arm: Arm, f: &dyn Fn(&Sample) -> Option<f64>| {
        median(
            samples
                .iter()
                .filter(|(a, _)| *a == arm)
                .filter_map(|(_, x)| f(x))
                .collect(),
        )
    };
    println!("\nmedians over {reps} rounds:");
    for arm in arms {
        let phases: Vec<String> = (0..PHASES.len())
            .map(|i| {
                let m = med(arm, &|x| x.phases[i].map(|v| v as f64));
                if m.is_nan() {
                    "-".into()
                } else {
                    format!("{m:.0}")
                }
            })
            .collect();
        println!(
            "  {:<5} pod {:>6.2} s  restore {:>6.2} s  {}",
            arm.name(),
            med(arm, &|x| Some(x.pod_s)),
            med(arm, &|x| Some(x.restore_s)),
            PHASES
                .iter()
                .zip(&phases)
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let (tiny, big, refused, floor) = (
        med(Arm::Tiny, &|x| Some(x.restore_s)),
        med(Arm::Big, &|x| Some(x.restore_s)),
        med(Arm::Refused, &|x| Some(x.restore_s)),
        med(Arm::Floor, &|x| Some(x.restore_s)),
    );
    println!(
        "big / tiny: {:.2}x ({:+.2} s for {files} files); big / floor: {:.2}x; the big \
         restore's median is {} the 10 s target",
        big / tiny,
        big - tiny,
        big / floor,
        if big <= 10.0 { "within" } else { "above" }
    );
    println!(
        "refused / tiny: {:.2}x; refused / big: {:.3}x; the refusal's median ({refused:.2} s) is \
         {} the 10 s target",
        refused / tiny,
        refused / big,
        if refused <= 10.0 { "within" } else { "above" }
    );
    Ok(())
}
