#!/usr/bin/env bash
# tests/gpu/run-h200.sh — gpusnap's GPU checkpoint/restore test, run ON the H200 device machine
# (Ubuntu 24.04, driver 580.x, nvcc, root, no network), from the repository root, with the
# bundle made by tests/gpu/make-bundle.sh carried in .bundle/. See tests/gpu/README.md.
#
# Usage: tests/gpu/run-h200.sh [options]
#   --mode smoke|full    smoke: environment only (tools, criu check, nvcc build, the GPU
#                        container through gpusnap with its log advancing, a CPU-only C/R
#                        through gpusnap, a small raw CUDA+CRIU cycle); no GPU checkpoint
#                        through the shim. full (default): scenarios + benchmark.
#   --mib N              workload size of the functional scenarios (default 1024)
#   --scenarios LIST     of run,a,b,c,p,x (default: these six; p = posix engine refused on this
#                        driver; "none" for the benchmark alone):
#                        a = checkpoint leaving it running, b = checkpoint, kill, restore,
#                        c = checkpoint the restored one, kill, restore again (C->R->C),
#                        x = `ctr t checkpoint --exit --image-path DIR` on it (the task must
#                        stop; the manifest is read from DIR; ctr cannot restore from a path)
#                        and, only when named (see tests/gpu/README.md):
#                        plugin = CRIU's cuda_plugin.so in /usr/lib/criu: gpusnap keeps it out;
#                          the reference runc.v2 + plugin + cuda-checkpoint does the same C/R
#                        runc = gpusnap-runc driving runc directly (Podman/CRI-O style), with
#                          and without the plugin installed
#                        runcv2 = containerd-shim-runc-v2 with BinaryName=gpusnap-runc
#                        k8s = containerd CRI + crictl: checkpoint --export, restore from the
#                          archive (CreateContainer image=/x.tar) and by gpusnap.io/restore-from
#                        bench2 = gpusnap vs reference benchmark (--bench2-* options)
#                        posixbench = cuda/examples/posix_bench on a tmpfs
#                        fleet = scripts/bench-fleet.sh with the real driver (tests/gpu/scenario-fleet.sh)
#                        crypt = scripts/bench-crypt.sh with the real driver, and the decrypted
#                          checkpoint restored (tests/gpu/scenario-crypt.sh)
#                        volume = a pod spec restores from a checkpoint image volume
#                          (gpusnap.io/restore-from-volume) vs containerd's CRI restore under
#                          runc.v2 + CRIU's cuda plugin, fresh node, alternating; bytes fetched
#                          beside another replica's chunks (tests/gpu/scenario-volume.sh)
#                        ab = before/after timings of the shim: the bundle's (new) against
#                          .bundle/gpusnap-baseline.tar.xz (base; make-bundle.sh with
#                          BASELINE_BIN_DIR + BASELINE_COMMIT, or --baseline-only), swapped
#                          on containerd's PATH between containers; a warm-up per side, then
#                          --ab-reps alternating repetitions of scenario b's cycle (ctr c
#                          checkpoint --task, kill, ctr c restore --live, first verified step);
#                          table in ab.txt, rows in ab.jsonl (tests/gpu/scenario-ab.sh)
#                        push = gpusnap.io/checkpoint-to: a GPU pod's crictl checkpoint --export
#                          into the directory `gpusnap agent run --checkpoint-dir` watches, the
#                          agent pushes it to the bundle's docker-registry (HTTPS, htpasswd),
#                          then an image-volume restore from the pushed image on a fresh node
#                          state (tests/gpu/scenario-push.sh; push.txt, push.jsonl)
#   --bench LIST         benchmark sizes in MiB, e.g. 8192,32768 (default: none)
#   --no-raw             benchmark gpusnap only (skip the by-hand driver API + criu baseline)
#   --raw-mib N          smoke mode's raw cycle size (default 256)
#   --interval-ms N      workload step interval (default 500)
#   --deadline S         start no new phase past S seconds (default 540; the tool's limit is 600)
#   --ckpt-tmp ram|disk  where containerd's temporary checkpoint dirs and the raw CRIU images go
#                        (default ram: a tmpfs; the 64 GiB disk cannot hold a 33 GB CRIU dump
#                        plus containerd's 33 GB copy of it in its content store)
#   --net-host           run containers in the host network namespace (default: their own)
#   --privileged         give the GPU container --privileged instead of --device flags
#   --cpu                rehearsal without a GPU (any Linux box with the bundle): the workload
#                        is built with g++, no devices, no CUDA calls in the raw path
#   --keep               leave containerd, work dir and checkpoints in place
#   --keep-plugin        leave CRIU's cuda_plugin.so in /usr/lib/criu at the end
#   --thp always|madvise|never  set the node's transparent-huge-page mode
#                        (/sys/kernel/mm/transparent_hugepage/enabled) for this call and put
#                        the old one back at the end; every call prints the mode it ran under.
#                        A measurement knob: CRIU restores private memory before it reapplies
#                        MADV_HUGEPAGE, so the mode decides the page size its reads fault in
#   --bench2-sizes LIST  bench2 workload sizes in MiB (default 8192)
#   --bench2-procs LIST  bench2 process counts; N processes share the size (default 1,4)
#   --bench2-reps N      repetitions per case, the side that goes first alternating (default 1)
#   --bench2-warmup-mib N  size of the throw-away warm-up checkpoint per side (default 256)
#   --bench2-prefault G  GiB of RAM to touch once (tmpfs write) before bench2: auto (default:
#                        2 x the largest size + 4, at most MemTotal - 16 GiB) or a number, 0 = off
#   --bench2-annot auto|on|off  bench2 (v): restore by gpusnap.io/restore-from through CRI
#                        (auto: for 1-process cases up to 8192 MiB)
#   --bench2-own auto|on|off  bench2 (vi): the node's own checkpoint (ctr t checkpoint
#                        --image-path into checkpoint_root, recorded by the shim at seal)
#                        restored by gpusnap.io/restore-from through CRI, no registry (auto: on)
#   --bench2-sides LIST  gpusnap,reference (default both)
#   --bench2-cases LIST  i,ii,iii (default all): i alone measures only the runtime-only
#                        checkpoint (ctr t checkpoint --image-path), so a large size fits
#                        several alternating repetitions into one call; iii needs ii
#   --posixbench-sizes LIST  posix_bench sizes in MiB (default 4096,32768)
#   --posixbench-dir DIR  where posix_bench writes (default: a tmpfs under the work dir; e.g.
#                        /var/tmp/gpusnap-posixbench for the VM's disk)
#   --posixbench-args "ARGS"  posix_bench slot/chunk arguments (default: 4096 MiB and less:
#                        --slots 1,4,8 --chunks-mib 16,64; larger: --slots 4,8 --chunks-mib 64)
#   --fleet-mib N        fleet: device memory per replica (default 8192)
#   --fleet-rounds N     fleet: counted rounds (default 1); --fleet-warmup 0|1 (default 0)
#   --fleet-dir DIR      fleet: where images, registry and node stores go (default: the tmpfs)
#   --fleet-slow-mbit N  fleet: also pull b1 cold and warm through a relay paced to N Mbit/s,
#                        --fleet-slow-rounds N times (default: --fleet-rounds)
#   --vol-mib N          volume: device memory per replica (default 8192); --vol-reps N: alternating
#                        repetitions per side (default 2); --vol-page-fill BYTES: a third side,
#                        `fill`: the same gpusnap restore with restore.page_fill_min_bytes = BYTES
#                        (page images read from the volume's chunks, large private memory written
#                        by the shim), alternating with the other two; --vol-warm off: no
#                        second replica (vb) and no warm pull
#   --ab-mib N           ab: workload size (default 4096); --ab-reps R: alternating repetitions
#                        (default 3); --ab-warmup-mib N: the throw-away cycle per side first
#                        (default 1024); --ab-prefault G: GiB of RAM touched once first (default
#                        auto: 2 x the size + 4). --ab-page-fill BYTES: instead of two builds,
#                        the bundle's shim with restore.page_fill_min_bytes = BYTES (new) against
#                        the same shim with it off (base); no baseline tarball needed.
#                        GPU_TEST_BASELINE: another baseline tarball
#   --push-mib N         push: device memory of the pod (default 8192)
#   --crypt-mib N        crypt: device memory of the checkpoint (default 8192)
#   --crypt-rounds N     crypt: counted rounds (default 2; past the deadline only 1);
#                        --crypt-warmup 0|1 (default 0); --crypt-dir DIR (default: the tmpfs)
# Environment: OUT (results folder; default /tmp/gpusnap-gpu-out), GPU_TEST_WORK (work dir, default
#   /var/tmp/gpusnap-gpu), GPU_TEST_BUNDLE (default .bundle/gpusnap-gpu.tar.xz), GPU_TEST_BASELINE
#   (ab's baseline; default gpusnap-baseline.tar.xz beside the bundle).
# Exit status: 0 when every verification passed, 1 otherwise, 2 on a setup failure.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T_START=$(date +%s%3N)

MODE=full MIB=1024 SCENARIOS=run,a,b,c,p,x BENCH="" RAW=1 RAW_MIB=256 INTERVAL=500 DEADLINE=540
CKPT_TMP=ram NET_HOST=0 PRIVILEGED=0 CPU=0 KEEP=0 KEEP_PLUGIN=0 THP=""
BENCH2_SIZES=8192 BENCH2_PROCS=1,4 BENCH2_REPS=1 BENCH2_WARMUP=256 BENCH2_PREFAULT=auto
BENCH2_ANNOT=auto BENCH2_OWN=auto BENCH2_SIDES=gpusnap,reference BENCH2_CASES=i,ii,iii POSIXBENCH_DIR="" POSIXBENCH_SIZES=4096,32768 POSIXBENCH_ARGS=""
while (($#)); do
    case $1 in
    --mode) MODE=$2; shift ;;
    --mib) MIB=$2; shift ;;
    --scenarios) SCENARIOS=$2; shift ;;
    --bench) BENCH=$2; shift ;;
    --no-raw) RAW=0 ;;
    --raw-mib) RAW_MIB=$2; shift ;;
    --interval-ms) INTERVAL=$2; shift ;;
    --deadline) DEADLINE=$2; shift ;;
    --ckpt-tmp) CKPT_TMP=$2; shift ;;
    --net-host) NET_HOST=1 ;;
    --privileged) PRIVILEGED=1 ;;
    --cpu) CPU=1 ;;
    --keep) KEEP=1 ;;
    --keep-plugin) KEEP_PLUGIN=1 ;;
    --thp) THP=$2; shift ;;
    --bench2-sizes) BENCH2_SIZES=$2; shift ;;
    --bench2-procs) BENCH2_PROCS=$2; shift ;;
    --bench2-reps) BENCH2_REPS=$2; shift ;;
    --bench2-warmup-mib) BENCH2_WARMUP=$2; shift ;;
    --bench2-prefault) BENCH2_PREFAULT=$2; shift ;;
    --bench2-annot) BENCH2_ANNOT=$2; shift ;;
    --bench2-own) BENCH2_OWN=$2; shift ;;
    --bench2-sides) BENCH2_SIDES=$2; shift ;;
    --bench2-cases) BENCH2_CASES=$2; shift ;;
    --posixbench-dir) POSIXBENCH_DIR=$2; shift ;;
    --posixbench-sizes) POSIXBENCH_SIZES=$2; shift ;;
    --posixbench-args) POSIXBENCH_ARGS=$2; shift ;;
    --fleet-mib) FLEET_MIB=$2; shift ;;
    --fleet-rounds) FLEET_ROUNDS=$2; shift ;;
    --fleet-warmup) FLEET_WARMUP=$2; shift ;;
    --fleet-slow-mbit) FLEET_SLOW_MBIT=$2; shift ;;
    --fleet-slow-rounds) FLEET_SLOW_ROUNDS=$2; shift ;;
    --fleet-dir) FLEET_DIR=$2; shift ;;
    --crypt-mib) CRYPT_MIB=$2; shift ;;
    --crypt-rounds) CRYPT_ROUNDS=$2; shift ;;
    --crypt-warmup) CRYPT_WARMUP=$2; shift ;;
    --crypt-dir) CRYPT_DIR=$2; shift ;;
    --vol-mib) VOL_MIB=$2; shift ;;
    --vol-reps) VOL_REPS=$2; shift ;;
    --vol-page-fill) VOL_PAGE_FILL=$2; shift ;;
    --vol-warm) VOL_WARM=$2; shift ;;
    --ab-mib) AB_MIB=$2; shift ;;
    --ab-reps) AB_REPS=$2; shift ;;
    --ab-warmup-mib) AB_WARMUP=$2; shift ;;
    --ab-prefault) AB_PREFAULT=$2; shift ;;
    --ab-page-fill) AB_PAGE_FILL=$2; shift ;;
    --push-mib) PUSH_MIB=$2; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//; /^set -uo/d'; exit 0 ;;
    *) echo "run-h200: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

OUTDIR=${OUT:-/tmp/gpusnap-gpu-out}
mkdir -p "$OUTDIR"
RUNLOG=$OUTDIR/gpu-run.log
: >"$RUNLOG"
exec > >(tee -a "$RUNLOG") 2>&1
TEE_PID=$!

WORK=${GPU_TEST_WORK:-/var/tmp/gpusnap-gpu}
BUNDLE_TAR=${GPU_TEST_BUNDLE:-$REPO/.bundle/gpusnap-gpu.tar.xz}
NS=gpusnap-gpu
GPU_IMAGE=docker.io/gpusnap/gpu-base:test
BB_IMAGE=docker.io/gpusnap/busybox:test
RT=io.containerd.gpusnap.v2

FAILS=()
GPU_EXTRA=()
NOTES=()
ROWS=()      # timing table rows: phase|op|wall_ms|shim_ms|detail
BENCH_ROWS=() # benchmark rows: size|what|gpusnap_ms|raw_ms

now_ms() { date +%s%3N; }
elapsed_s() { echo $((($(now_ms) - T_START) / 1000)); }
say() { printf '\n[%4ss] == %s\n' "$(elapsed_s)" "$*"; }
info() { printf '[%4ss] %s\n' "$(elapsed_s)" "$*"; }
ok() { printf '[%4ss] OK   %s\n' "$(elapsed_s)" "$*"; }
fail() { printf '[%4ss] FAIL %s\n' "$(elapsed_s)" "$*"; FAILS+=("$*"); }
note() { printf '[%4ss] NOTE %s\n' "$(elapsed_s)" "$*"; NOTES+=("$*"); }
row() { ROWS+=("$1|$2|$3|$4|$5"); }
setup_die() { printf '[%4ss] SETUP FAILED: %s\n' "$(elapsed_s)" "$*"; FAILS+=("setup: $*"); exit 2; }
time_left() { (($(elapsed_s) + ${1:-0} < DEADLINE)); }
has() { [[ ,$SCENARIOS, == *,$1,* ]]; }

# ---------------------------------------------------------------------------------------------
# Cleanup and the final report (always runs)
# ---------------------------------------------------------------------------------------------
CONTAINERD_PID=""
RAW_PIDS=()
THP_FILE=/sys/kernel/mm/transparent_hugepage/enabled
THP_OLD=""
finish() {
    local rc=$?
    trap - EXIT
    set +e
    declare -F extra_cleanup >/dev/null && extra_cleanup
    if [[ -n $THP_OLD ]]; then
        echo "$THP_OLD" >"$THP_FILE" && info "THP mode put back: $(cat "$THP_FILE")"
    fi
    if ((KEEP == 0)); then
        if [[ -n $CONTAINERD_PID ]]; then
            for id in $(ctr t ls -q 2>/dev/null); do ctr t kill -s SIGKILL "$id" >/dev/null 2>&1; done
            sleep 1
            for id in $(ctr t ls -q 2>/dev/null); do ctr t rm -f "$id" >/dev/null 2>&1; done
            for id in $(ctr c ls -q 2>/dev/null); do ctr c rm "$id" >/dev/null 2>&1; done
        fi
        for p in "${RAW_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    fi
    # Keep what explains a failure: workload logs, CRIU/runc logs, the containerd log.
    if [[ -d $WORK ]]; then
        (cd "$WORK" && find logs raw gpu/log cpu -maxdepth 2 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name count \) 2>/dev/null
            find containerd/state \( -name '*.log' -o -name 'log.json' \) -size -4M 2>/dev/null) |
            tar -C "$WORK" -czf "$OUTDIR/logs.tar.gz" -T - 2>/dev/null
        if [[ -f $WORK/containerd.log ]]; then
            tail -c 15000000 "$WORK/containerd.log" >"$OUTDIR/containerd.log"
        fi
    fi
    if ((KEEP == 0)); then
        if [[ -n $CONTAINERD_PID ]]; then
            kill "$CONTAINERD_PID" 2>/dev/null
            wait "$CONTAINERD_PID" 2>/dev/null
        fi
        grep -F " $WORK/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
        rm -rf "$WORK/containerd/root" "$WORK/raw" "$WORK/ramtmp" 2>/dev/null
    fi

    say "timing table (wall = the command's own wall time; shim = total_ms the shim logged)"
    {
        printf '%-13s %-50s %10s %10s  %s\n' phase operation wall_ms shim_ms detail
        local r
        for r in "${ROWS[@]}"; do
            IFS='|' read -r p o w s d <<<"$r"
            printf '%-13s %-50s %10s %10s  %s\n' "$p" "$o" "$w" "$s" "$d"
        done
    } | tee "$OUTDIR/timings.txt"
    if ((${#BENCH_ROWS[@]})); then
        say "benchmark: gpusnap through containerd vs the raw primitives by hand"
        {
            printf '%-8s %-44s %12s %12s %8s\n' size what gpusnap_ms raw_ms ratio
            for r in "${BENCH_ROWS[@]}"; do
                IFS='|' read -r sz what g rw <<<"$r"
                ratio=$(awk -v a="$g" -v b="$rw" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2fx", a / b; else print "-" }')
                printf '%-8s %-44s %12s %12s %8s\n' "$sz" "$what" "$g" "$rw" "$ratio"
            done
        } | tee -a "$OUTDIR/timings.txt"
    fi
    declare -F extra_report >/dev/null && extra_report
    if ((${#NOTES[@]})); then
        say "notes"
        printf '  - %s\n' "${NOTES[@]}"
    fi
    say "result"
    if ((${#FAILS[@]})); then
        printf '  FAILED (%d):\n' "${#FAILS[@]}"
        printf '    - %s\n' "${FAILS[@]}"
        ((rc == 0 || rc == 1)) && rc=1
    else
        echo "  ALL CHECKS PASSED (mode=$MODE, $(elapsed_s)s)"
        rc=0
    fi
    echo "  results in $OUTDIR: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null || sleep 0.3
    exit "$rc"
}
trap finish EXIT

# ---------------------------------------------------------------------------------------------
# 1. The machine
# ---------------------------------------------------------------------------------------------
say "machine (mode=$MODE cpu=$CPU)"
echo "kernel: $(uname -r); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); cores: $(nproc)"
free -g | sed -n 1,2p
# The current mode is the bracketed word: "always [madvise] never".
thp_mode() { sed -n 's/.*\[\(.*\)\].*/\1/p' "$THP_FILE" 2>/dev/null; }
if [[ -n $THP ]]; then
    [[ $THP =~ ^(always|madvise|never)$ ]] || setup_die "--thp takes always, madvise or never, not '$THP'"
    [[ -w $THP_FILE ]] || setup_die "--thp $THP: $THP_FILE is not writable here"
    THP_OLD=$(thp_mode)
    echo "$THP" >"$THP_FILE" || setup_die "--thp $THP: could not write $THP_FILE"
    note "THP mode set to $(thp_mode) for this call (was $THP_OLD); put back at the end"
fi
echo "THP: enabled $(thp_mode || echo n/a); defrag $(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null || echo n/a)"
df -h / /tmp /var/tmp 2>/dev/null | awk 'NR == 1 || !seen[$0]++'
echo "fs of /tmp: $(stat -f -c %T /tmp); /var/tmp: $(stat -f -c %T /var/tmp); cgroup: $(stat -f -c %T /sys/fs/cgroup)"
for t in ip iptables iptables-restore nft xz zstd python3 nvcc nvidia-smi ldconfig; do
    printf '  %-17s %s\n' "$t" "$(command -v $t || echo MISSING)"
done
NVLIB="" LIBCUDA=""
DEVICES=()
if ((CPU == 0)); then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,persistence_mode --format=csv 2>&1 | sed 's/^/  /'
    head -n 1 /proc/driver/nvidia/version 2>/dev/null | sed 's/^/  /'
    echo "  ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo n/a); nf_tables: $(grep -c nf_tables /proc/modules 2>/dev/null || echo '?') module lines"
    ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so' | sed 's/^/  ldconfig: /'
    for cand in /usr/local/nvidia/lib64/libcuda.so.1 /usr/local/nvidia/lib/libcuda.so.1 \
        $(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/ {print $NF}') \
        /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
        [[ -e $cand ]] && { LIBCUDA=$cand; break; }
    done
    if [[ -z $LIBCUDA ]]; then
        LIBCUDA=$(find /usr /opt -xdev -name libcuda.so.1 2>/dev/null | head -n1)
    fi
    [[ -n $LIBCUDA ]] || setup_die "libcuda.so.1 not found"
    NVLIB=$(dirname "$LIBCUDA")
    echo "libcuda: $LIBCUDA -> $(readlink -f "$LIBCUDA"); driver lib dir: $NVLIB (fs $(stat -f -c %T "$NVLIB"))"
    grep -E " $NVLIB | /usr/local/nvidia" /proc/self/mountinfo | awk '{print "  mount: " $5 " (" $6 ")"}' | sort -u
    for d in /dev/nvidia*; do
        [[ -c $d ]] && DEVICES+=("$d")
    done
    [[ -d /dev/nvidia-caps ]] && DEVICES+=(/dev/nvidia-caps)
    ls -l /dev/nvidia* 2>&1 | sed 's/^/  /'
    ((${#DEVICES[@]})) || setup_die "no /dev/nvidia* devices"
    command -v nvcc >/dev/null || setup_die "nvcc not found"
    nvcc --version | tail -n 2 | sed 's/^/  /'
fi

# ---------------------------------------------------------------------------------------------
# 2. Bundle
# ---------------------------------------------------------------------------------------------
say "bundle"
[[ -f $BUNDLE_TAR ]] || setup_die "no bundle at $BUNDLE_TAR (run tests/gpu/make-bundle.sh here first, carry .bundle)"
if [[ -f $BUNDLE_TAR.sha256 ]]; then
    (cd "$(dirname "$BUNDLE_TAR")" && sha256sum -c --status "$(basename "$BUNDLE_TAR").sha256") ||
        setup_die "bundle checksum mismatch"
fi
# Only the disposable parts of an earlier run go: never follow into mounts.
if [[ -d $WORK ]]; then
    grep -F " $WORK/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$WORK"
fi
mkdir -p "$WORK"/{bin,logs,raw,gpu/bin,gpu/log,cpu}
t0=$(now_ms)
if command -v xz >/dev/null; then
    tar -C "$WORK" -xJf "$BUNDLE_TAR" || setup_die "unpacking the bundle failed"
else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$BUNDLE_TAR" "$WORK" ||
        setup_die "unpacking the bundle (python, no xz here) failed"
fi
B=$WORK/gpusnap-gpu
info "unpacked in $(($(now_ms) - t0)) ms to $B"
sed -n 1,7p "$B/VERSIONS" | sed 's/^/  /'

# runc init re-execs /proc/self/exe with an empty environment: libseccomp must be found by
# ld.so's cache, not LD_LIBRARY_PATH.
# grep reads to the end: -q would stop early, and ldconfig's SIGPIPE fails the pipe (pipefail).
if ! ldconfig -p | grep 'libseccomp\.so\.2 .*x86-64' >/dev/null; then
    if ((CPU)); then setup_die "libseccomp.so.2 missing"; fi
    mkdir -p /usr/local/lib/gpusnap-runc
    cp "$B/lib/runc/libseccomp.so.2" /usr/local/lib/gpusnap-runc/
    echo /usr/local/lib/gpusnap-runc >/etc/ld.so.conf.d/zz-gpusnap-runc.conf
    ldconfig
    note "libseccomp.so.2 was missing: installed the bundle's into /usr/local/lib/gpusnap-runc"
fi
export PATH="$B/bin:$PATH:$B/tools"
hash -r
for t in containerd ctr runc criu containerd-shim-gpusnap-v2; do
    v=$("$t" --version 2>&1 | head -n 3 | tr '\n' ' ')
    [[ $t == containerd-shim-gpusnap-v2 ]] && v=$("$t" -v 2>&1 | tr '\n' ' ')
    printf '  %-28s %s\n' "$t" "$v"
done
for t in gpusnap gpusnap-runc crictl posix_bench cuda-checkpoint; do
    if [[ -x $B/bin/$t ]]; then
        case $t in
        gpusnap-runc) v=$(GPUSNAP_RUNC=$B/bin/runc "$B/bin/$t" --version 2>&1 | tail -n 1) ;;
        posix_bench) v="present" ;;
        cuda-checkpoint) v="$(sha256sum "$B/bin/$t" | cut -c1-16) (help text comes from the driver)" ;;
        *) v=$("$B/bin/$t" --version 2>&1 | head -n 1) ;;
        esac
        printf '  %-28s %s\n' "$t" "$v"
    else
        printf '  %-28s %s\n' "$t" "not in the bundle"
    fi
done
if [[ -f $B/plugins/cuda/cuda_plugin.so ]]; then
    printf '  %-28s %s\n' cuda_plugin.so "$(sha256sum "$B/plugins/cuda/cuda_plugin.so" | cut -c1-16); $(grep -h '^built:' "$B/plugins/cuda/BUILD-INFO" 2>/dev/null)"
else
    printf '  %-28s %s\n' cuda_plugin.so "not in the bundle"
fi
if ((CPU == 0)) && [[ -x $B/bin/cuda-checkpoint ]]; then
    cuda-checkpoint --help 2>&1 | head -n 12 | sed 's/^/  cuda-checkpoint --help: /'
fi
ls -la /usr/lib/criu 2>/dev/null | sed 's/^/  \/usr\/lib\/criu: /'
runc --version >/dev/null 2>&1 || setup_die "runc does not run here: $(runc --version 2>&1 | tail -n 2)"
criu --version >/dev/null 2>&1 || setup_die "criu does not run here: $(criu --version 2>&1 | tail -n 2)"
info "ip used by CRIU: $(command -v ip)"

say "criu check"
criu check 2>&1 | tail -n 5 | sed 's/^/  /'
if criu check >/dev/null 2>&1; then ok "criu check"; else fail "criu check"; fi
criu check --all 2>&1 | tail -n 8 | sed 's/^/  (--all) /'

# CRIU's network lock: runc passes /etc/criu/runc.conf to CRIU.
if ! command -v iptables-restore >/dev/null; then
    mkdir -p /etc/criu
    if ! grep -qs '^network-lock' /etc/criu/runc.conf; then
        echo "network-lock nftables" >>/etc/criu/runc.conf
        note "no iptables-restore here: wrote 'network-lock nftables' to /etc/criu/runc.conf"
    fi
fi
[[ -f /etc/criu/runc.conf ]] && info "/etc/criu/runc.conf: $(tr '\n' ';' </etc/criu/runc.conf)"

# gpusnap's configuration: the driver library and CRIU's directory.
CFG=$WORK/gpusnap-config.toml
{
    echo "# written by tests/gpu/run-h200.sh"
    if [[ -n $LIBCUDA ]]; then
        echo "[cuda]"
        echo "library = \"$LIBCUDA\""
    fi
    echo "[criu]"
    echo "binary_dir = \"$B/bin\""
    echo "[restore]"
    echo "checkpoint_root = \"$WORK/ramtmp/checkpoints\""
} >"$CFG"
export GPUSNAP_CONFIG=$CFG
if ((CPU == 0)); then
    mkdir -p /etc/gpusnap
    [[ -f /etc/gpusnap/config.toml && ! -f /etc/gpusnap/config.toml.orig ]] && cp /etc/gpusnap/config.toml /etc/gpusnap/config.toml.orig
    cp "$CFG" /etc/gpusnap/config.toml
fi
info "gpusnap config ($CFG, also /etc/gpusnap/config.toml on the device): $(grep -v '^#' "$CFG" | tr '\n' ' ')"

# ---------------------------------------------------------------------------------------------
# 3. Build the workload
# ---------------------------------------------------------------------------------------------
say "building the workload"
GV=$WORK/gpu/bin/gpu_verify
RAWC=$WORK/bin/raw_ckpt
t0=$(now_ms)
if ((CPU)); then
    g++ -O2 -x c++ -o "$GV" "$REPO/tests/gpu/workload/gpu_verify.cu" || setup_die "g++ gpu_verify failed"
else
    NVCC_FLAGS=(-O2 -arch=sm_90 -cudart static)
    info "nvcc ${NVCC_FLAGS[*]}"
    nvcc "${NVCC_FLAGS[@]}" -o "$GV" "$REPO/tests/gpu/workload/gpu_verify.cu" || setup_die "nvcc gpu_verify failed"
fi
cc -O2 -o "$RAWC" "$REPO/tests/gpu/workload/raw_ckpt.c" -ldl || setup_die "cc raw_ckpt failed"
info "built in $(($(now_ms) - t0)) ms; gpu_verify needs:"
ldd "$GV" | sed 's/^/  /'

# ---------------------------------------------------------------------------------------------
# 4. containerd
# ---------------------------------------------------------------------------------------------
say "containerd"
mkdir -p "$WORK/containerd" "$WORK/ramtmp"
if [[ $CKPT_TMP == ram ]]; then
    mount -t tmpfs -o size=110g,mode=0700 gpusnap-ckpt "$WORK/ramtmp" || setup_die "tmpfs mount failed"
fi
CTD_TMP=$WORK/ramtmp/tmp
RAW_IMG_ROOT=$WORK/ramtmp/raw
mkdir -p "$CTD_TMP" "$RAW_IMG_ROOT"
SOCK=$WORK/containerd/containerd.sock
SNAP=overlayfs
case $(stat -f -c %T "$WORK/containerd") in overlayfs | overlay) SNAP=native ;; esac
export CONTAINERD_SNAPSHOTTER=$SNAP
# CRI only when a scenario uses it (k8s, bench2's restore-from): it adds startup work.
CRI=0
if has k8s || has volume || has push || { has bench2 && [[ $BENCH2_ANNOT != off || $BENCH2_OWN != off ]]; }; then CRI=1; fi
REG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
{
    echo "version = 3"
    echo "root = \"$WORK/containerd/root\""
    echo "state = \"$WORK/containerd/state\""
    if ((CRI)); then
        echo 'disabled_plugins = ["io.containerd.nri.v1.nri"]'
    else
        echo 'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri"]'
    fi
    echo "[grpc]"
    echo "  address = \"$SOCK\""
    echo "[ttrpc]"
    echo "  address = \"$SOCK.ttrpc\""
    if ((CRI)); then
        mkdir -p "$WORK/containerd/cni/bin" "$WORK/containerd/cni/net.d" "$WORK/containerd/certs.d/127.0.0.1:$REG_PORT"
        printf 'server = "http://127.0.0.1:%s"\n\n[host."http://127.0.0.1:%s"]\n  capabilities = ["pull", "resolve"]\n' \
            "$REG_PORT" "$REG_PORT" >"$WORK/containerd/certs.d/127.0.0.1:$REG_PORT/hosts.toml"
        cat <<TOML
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap]
  runtime_type = "io.containerd.gpusnap.v2"
  pod_annotations = ["gpusnap.io/*"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap-runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap-runc.options]
  BinaryName = "$B/bin/gpusnap-runc"
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$WORK/containerd/cni/bin"]
  conf_dir = "$WORK/containerd/cni/net.d"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "docker.io/gpusnap/pause:test"
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "$WORK/containerd/certs.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML
    fi
} >"$WORK/containerd/config.toml"
# TMPDIR: containerd's temporary checkpoint directories (CRIU's images before containerd copies
# them into its content store, and the unpacked images before a restore).
TMPDIR=$CTD_TMP containerd --config "$WORK/containerd/config.toml" --log-level debug >"$WORK/containerd.log" 2>&1 &
CONTAINERD_PID=$!
ctr() { command ctr -a "$SOCK" -n "$NS" "$@"; }
for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
ctr version >/dev/null 2>&1 || { tail -n 30 "$WORK/containerd.log"; setup_die "containerd did not come up"; }
info "containerd up (pid $CONTAINERD_PID, snapshotter $SNAP, root $WORK/containerd/root, TMPDIR $CTD_TMP [$CKPT_TMP])"
ctr images import "$B/images/busybox.oci.tar" >/dev/null || setup_die "import busybox failed"
ctr images import "$B/images/gpu-base.oci.tar" >/dev/null || setup_die "import gpu-base failed"
if ((CRI)); then
    # CRI's sandbox image: imported under the pinned name, so CRI never pulls it.
    command ctr -a "$SOCK" -n k8s.io images import "$B/images/pause.oci.tar" >/dev/null || setup_die "import pause (k8s.io) failed"
    info "CRI enabled (namespace k8s.io, sandbox image docker.io/gpusnap/pause:test, registry hosts for 127.0.0.1:$REG_PORT)"
fi
ctr images ls -q | sed 's/^/  image: /'

# ---------------------------------------------------------------------------------------------
# Helpers: workload log, containers, manifests
# ---------------------------------------------------------------------------------------------
wl_count() { cat "$1" 2>/dev/null | awk '/^step=/ {n++} END {print n + 0}'; }
wl_field() { sed -n 's/.*\b'"$2"'=\([^ ]*\).*/\1/p' <<<"$1"; }
wl_last() { grep '^step=' "$1" 2>/dev/null | tail -n 1; }
wl_nth() { grep '^step=' "$1" 2>/dev/null | sed -n "$2p"; }
# wl_wait LOG COUNT TIMEOUT_S: until the log holds COUNT step lines.
wl_wait() {
    local end=$(($(now_ms) + $3 * 1000))
    while (($(wl_count "$1") < $2)); do
        (($(now_ms) > end)) && return 1
        grep -q '^ERROR' "$1" 2>/dev/null && return 1
        sleep 0.1
    done
}
# wl_bad LOG: lines reporting a mismatch or an error.
wl_bad() { grep -E '^(MISMATCH|ERROR)|mismatches=[1-9]|total=[1-9]' "$1" 2>/dev/null | head -n 5; }
# wl_gap LOG FROM_LINE TO_LINE: largest ts gap (ms) between consecutive step lines in the range.
wl_gap() {
    grep '^step=' "$1" | sed -n "$2,$3p" | sed 's/.* ts=\([0-9]*\).*/\1/' |
        awk 'NR > 1 { d = $1 - p; if (d > m) m = d } { p = $1 } END { print m + 0 }'
}
check_clean() { # check_clean LOG WHAT
    local bad
    bad=$(wl_bad "$1")
    if [[ -n $bad ]]; then fail "$2: the workload reported mismatches/errors: $bad"; return 1; fi
    ok "$2: $(wl_count "$1") steps logged, 0 mismatches (last: $(wl_last "$1" | cut -d' ' -f1-3))"
}

# gpu_run ID MIB: start the workload in a container through gpusnap.
gpu_run() {
    local id=$1 mib=$2 args=()
    if ((CPU == 0)); then
        if ((PRIVILEGED)); then
            args+=(--privileged)
        else
            local d
            for d in "${DEVICES[@]}"; do args+=(--device "$d"); done
        fi
        args+=(--mount "type=bind,src=$NVLIB,dst=/nvidia/lib64,options=bind:ro"
            --env LD_LIBRARY_PATH=/nvidia/lib64:/usr/lib/x86_64-linux-gnu)
    else
        args+=(--env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu)
    fi
    ((NET_HOST)) && args+=(--net-host)
    args+=(--mount "type=bind,src=/usr,dst=/usr,options=bind:ro"
        --mount "type=bind,src=$WORK/gpu,dst=/gpu,options=bind:rw")
    local procs=()
    [[ -n ${GPU_PROCS:-} ]] && procs=(--procs "$GPU_PROCS")
    ctr run -d --null-io --runtime "${GPU_RT:-$RT}" "${args[@]}" "${GPU_EXTRA[@]}" "$GPU_IMAGE" "$id" \
        /gpu/bin/gpu_verify "${procs[@]}" ${GPU_FLEET:+--fleet} "$mib" "/gpu/log/$id.log" "$INTERVAL"
}

# ctr_stop ID: kill the task, wait until it has exited, delete task and container.
ctr_stop() {
    local id=$1 st
    ctr t kill -s SIGKILL "$id" >/dev/null 2>&1
    for _ in $(seq 600); do
        st=$(ctr t ls 2>/dev/null | awk -v i="$id" '$1 == i {print $3}')
        [[ -z $st || $st == STOPPED ]] && break
        sleep 0.1
    done
    ctr t rm "$id" >/dev/null 2>&1 || ctr t rm -f "$id" >/dev/null 2>&1
    ctr c rm "$id" >/dev/null 2>&1
    ! ctr c ls -q | grep -qx "$id"
}

# gpu_wait_free: the GPU's memory back near idle (a restore needs the room).
gpu_wait_free() {
    ((CPU)) && return 0
    local used
    for _ in $(seq 300); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n1)
        [[ -n $used ]] && ((used < 2048)) && return 0
        sleep 0.2
    done
    note "GPU memory still ${used} MiB used after 60 s"
}

LOGMARK=0
log_mark() { LOGMARK=$(wc -l <"$WORK/containerd.log"); }
# shim_lines: the shim's lines logged since log_mark that carry timings or errors.
shim_lines() {
    tail -n +"$((LOGMARK + 1))" "$WORK/containerd.log" |
        grep -E 'checkpoint complete|checkpoint sealed|restore complete|_ms[=": ]|cuda|CUDA|level=(error|warn)|"level":"(ERROR|WARN)|ERROR|WARN' |
        grep -vE 'msg="(loading plugin|skip loading plugin)' | head -n 40
}
shim_total() { shim_lines | grep -E "$1 (complete|sealed)" | grep -oE 'total_ms[=": ]+[0-9]+' | grep -oE '[0-9]+$' | tail -n 1; }

# manifest_of REF FILE: gpusnap-manifest.json out of a checkpoint image in the content store.
manifest_of() {
    local ref=$1 out=$2 dig
    dig=$(ctr images ls | awk -v r="$ref" '$1 == r {print $3}')
    [[ -n $dig ]] || { echo "no image $ref" >&2; return 1; }
    python3 - "$WORK/containerd/root/io.containerd.content.v1.content/blobs" "$dig" "$out" <<'PY'
import json, os, sys, tarfile
blobs, dig, out = sys.argv[1:4]
path = lambda d: os.path.join(blobs, *d.split(":", 1))
index = json.load(open(path(dig)))
ck = [m for m in index.get("manifests", []) if "criu.checkpoint" in m.get("mediaType", "")]
if not ck:
    sys.exit("checkpoint image has no criu tar: %s" % [m.get("mediaType") for m in index.get("manifests", [])])
print("checkpoint tar: %s bytes (%s)" % (ck[0]["size"], ck[0]["digest"][:19]))
with tarfile.open(path(ck[0]["digest"]), "r|*") as tf:
    for m in tf:
        if m.name.lstrip("./") == "gpusnap-manifest.json":
            open(out, "wb").write(tf.extractfile(m).read())
            sys.exit(0)
sys.exit("gpusnap-manifest.json not found in the checkpoint tar")
PY
}

# manifest_summary FILE: one line of phase timings, and the GPU section's numbers.
manifest_summary() {
    python3 - "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t = " ".join("%s=%s" % (p.get("name"), p.get("ms")) for p in m.get("timings", []))
print("  manifest timings (ms): %s" % (t or "none"))
print("  images: %s bytes; criu %s; runc %s" % ((m.get("images") or {}).get("total_bytes"), m.get("criu_version"), m.get("runc_version")))
g = m.get("gpu")
if not g:
    print("  gpu section: ABSENT")
    sys.exit(0)
print("  gpu: engine=%s processes=%d" % (g.get("engine"), len(g.get("processes", []))))
def walk(o, pre=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from walk(v, pre + k + ".")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from walk(v, pre + str(i) + ".")
    else:
        yield pre[:-1], o
top = [(k, v) for k, v in walk({k: v for k, v in g.items() if k != "processes"})
       if isinstance(v, (int, float)) and not isinstance(v, bool)]
if top:
    print("    " + " ".join("%s=%s" % kv for kv in top))
for p in g.get("processes", []):
    nums = [(k, v) for k, v in walk(p) if isinstance(v, (int, float)) and not isinstance(v, bool)
            and (k.endswith("ms") or "bytes" in k or k.endswith("_s") or "pid" in k)]
    print("    pid %s: %s" % (p.get("host_pid"), " ".join("%s=%s" % kv for kv in nums)))
PY
}
MANIFESTS=$OUTDIR/manifests.jsonl
: >"$MANIFESTS"
save_manifest() { # save_manifest TAG FILE
    python3 -c 'import json,sys; m=json.load(open(sys.argv[2])); print(json.dumps({"tag": sys.argv[1], "manifest": m}))' "$1" "$2" >>"$MANIFESTS"
}

# checkpoint_op PHASE ID REF [EXPECT]: ctr c checkpoint --task, timed, manifest kept. EXPECT:
# gpu (default on a GPU machine: the manifest must have a gpu section), cpu (a gpusnap manifest,
# gpu section optional), none (another runtime: no gpusnap manifest). Sets CK_MS, CK_SHIM.
checkpoint_op() {
    local phase=$1 id=$2 ref=$3 expect=${4:-} t0 rc mf=$WORK/logs/manifest-$1.json
    [[ -n $expect ]] || { ((CPU)) && expect=cpu || expect=gpu; }
    CK_MFSUM=""
    log_mark
    t0=$(now_ms)
    ctr containers checkpoint --task "$id" "$ref"
    rc=$?
    CK_MS=$(($(now_ms) - t0))
    CK_SHIM=$(shim_total checkpoint)
    shim_lines | sed 's/^/  shim: /'
    if ((rc != 0)); then
        fail "$phase: ctr containers checkpoint --task $id failed (rc $rc, ${CK_MS} ms)"
        row "$phase" "checkpoint (ctr c checkpoint --task)" "$CK_MS" "${CK_SHIM:--}" FAILED
        return 1
    fi
    ok "$phase: checkpoint of $id in ${CK_MS} ms (shim total_ms ${CK_SHIM:-?})"
    local detail=""
    if [[ $expect == none ]]; then
        row "$phase" "checkpoint (ctr c checkpoint --task)" "$CK_MS" "${CK_SHIM:--}" "runtime without a gpusnap manifest"
        return 0
    fi
    if manifest_of "$ref" "$mf"; then
        save_manifest "$phase" "$mf"
        manifest_summary "$mf"
        detail=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(" ".join("%s=%s" % (p["name"], p["ms"]) for p in m.get("timings", [])) + ("" if m.get("gpu") else " [no gpu section]"))' "$mf")
        CK_MFSUM=$(python3 -c 'import json,sys; print(sum(p.get("ms", 0) for p in json.load(open(sys.argv[1])).get("timings", [])))' "$mf")
        if [[ $expect == gpu ]] && ! grep -q '"gpu"' "$mf"; then fail "$phase: the manifest has no gpu section: the shim did not checkpoint CUDA"; fi
    else
        fail "$phase: could not read gpusnap-manifest.json from $ref"
    fi
    row "$phase" "checkpoint (ctr c checkpoint --task)" "$CK_MS" "${CK_SHIM:--}" "$detail"
}

# restore_op PHASE ID REF: ctr c restore --live, timed. Sets RS_MS.
restore_op() {
    local phase=$1 id=$2 ref=$3 t0 rc
    log_mark
    t0=$(now_ms)
    ctr containers restore --live "$id" "$ref"
    rc=$?
    RS_MS=$(($(now_ms) - t0))
    local shim
    shim=$(shim_total restore)
    shim_lines | sed 's/^/  shim: /'
    local detail
    detail=$(shim_lines | grep 'restore complete' | grep -oE '[a-z_]+_ms[=": ]+[0-9]+' | tr -d '":' | tr '\n' ' ')
    row "$phase" "restore (ctr c restore --live)" "$RS_MS" "${shim:--}" "${detail:-$([[ $rc == 0 ]] || echo FAILED)}"
    if ((rc != 0)); then
        fail "$phase: ctr containers restore --live $id failed (rc $rc, ${RS_MS} ms)"
        return 1
    fi
    ok "$phase: restore of $id in ${RS_MS} ms (shim total_ms ${shim:-?})"
}

# continuity PHASE LOG BEFORE_STEP AT_KILL_STEP COUNT_AT_KILL RUN: the restored process
# continues the checkpointed one.
continuity() {
    local phase=$1 log=$2 s0=$3 s1=$4 n=$5 run=$6 t0 first r rrun
    t0=$(now_ms)
    if ! wl_wait "$log" $((n + 3)) 60; then
        fail "$phase: no steps from the restored workload within 60 s (log: $(tail -n 2 "$log" | tr '\n' ' '))"
        return 1
    fi
    first=$(wl_nth "$log" $((n + 1)))
    r=$(wl_field "$first" step)
    rrun=$(wl_field "$first" run)
    info "$phase: first line after restore: $first"
    row "$phase" "restore -> 3 more steps" "$(($(now_ms) - t0))" - "first restored step $r"
    if [[ $rrun != "$run" ]]; then
        fail "$phase: the restored workload has run id $rrun, not $run: it was restarted, not restored"
    elif ((r < s0 + 1 || r > s1 + 1)); then
        fail "$phase: first step after restore is $r; expected between $((s0 + 1)) (checkpoint started after step $s0) and $((s1 + 1))"
    else
        ok "$phase: restored workload continued at step $r (checkpoint began after step $s0; original reached $s1 before the kill), same run $run"
    fi
    if grep -q "^start run=" <(tail -n +"$((n + 1))" "$log"); then fail "$phase: the workload started afresh after restore"; fi
    check_clean "$log" "$phase"
}

# ---------------------------------------------------------------------------------------------
# 5. Smoke: the GPU container runs through gpusnap; CPU-only C/R; raw mini cycle
# ---------------------------------------------------------------------------------------------
# raw_cycle MIB TAG: _raw_cycle, then whatever it left behind goes (images, processes).
raw_cycle() {
    _raw_cycle "$@"
    local rc=$? p
    rm -rf "${RAW_IMG_ROOT:?}/$2"
    for p in "${RAW_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    gpu_wait_free
    return $rc
}
# ms_of ACTION FILE: the ms= of raw_ckpt's line for ACTION.
ms_of() { grep -o "action=$1 .*" "$2" 2>/dev/null | sed -n 's/.* ms=\([0-9.]*\).*/\1/p' | head -n 1; }
_raw_cycle() { # _raw_cycle MIB TAG: by-hand lock/checkpoint/criu dump/... on a host process
    local mib=$1 tag=$2 dir=$WORK/raw/$2 log=$WORK/logs/raw-$2.log pid t0 n s0 s1 run img
    # CRIU's images go where containerd's temporary checkpoint dirs go (--ckpt-tmp).
    img=$RAW_IMG_ROOT/$tag
    mkdir -p "$dir" "$img"
    : >"$log"
    : >"$dir/ckpt.txt"
    export GPUSNAP_LIBCUDA=$LIBCUDA
    # setsid without fork (a background job of this script is no group leader): the workload is
    # its own session, so CRIU needs no --shell-job, and this script can reap it after the kill.
    LD_LIBRARY_PATH=$NVLIB setsid "$GV" "$mib" "$log" "$INTERVAL" </dev/null >>"$dir/stdout.txt" 2>&1 &
    pid=$!
    RAW_PIDS+=("$pid")
    if ! wl_wait "$log" 3 $((60 + mib / 512)); then fail "raw $tag: workload did not start: $(tail -n 3 "$log" "$dir/stdout.txt" | tr '\n' ' ')"; return 1; fi
    info "raw $tag: workload pid $pid, $(head -n 1 "$log")"
    s0=$(wl_field "$(wl_last "$log")" step)
    run=$(wl_field "$(wl_last "$log")" run)
    # Checkpoint leaving it running: lock, checkpoint, criu dump --leave-running, restore, unlock.
    t0=$(now_ms)
    if ((CPU == 0)); then
        "$RAWC" lock,checkpoint "$pid" 10000 | tee "$dir/ckpt.txt" || { fail "raw $tag: lock/checkpoint failed"; return 1; }
    fi
    local d0 rc
    d0=$(now_ms)
    criu dump -t "$pid" -D "$img" -o dump.log -v2 --leave-running
    rc=$?
    local dump_ms=$(($(now_ms) - d0))
    cp "$img/dump.log" "$WORK/logs/raw-$tag-dump.log" 2>/dev/null
    if ((rc != 0)); then
        fail "raw $tag: criu dump failed (rc $rc)"
        tail -n 15 "$img/dump.log" | sed 's/^/  criu: /'
        ((CPU == 0)) && "$RAWC" resume "$pid"
        return 1
    fi
    if ((CPU == 0)); then
        "$RAWC" resume "$pid" | tee -a "$dir/ckpt.txt" || { fail "raw $tag: restore/unlock after dump failed"; return 1; }
    fi
    local ck_total=$(($(now_ms) - t0))
    local img_bytes
    img_bytes=$(du -sb "$img" | cut -f1)
    info "raw $tag: checkpoint (leave running) ${ck_total} ms: lock $(ms_of lock "$dir/ckpt.txt") + checkpoint $(ms_of checkpoint "$dir/ckpt.txt") + criu dump ${dump_ms} ($img_bytes bytes) + restore $(ms_of restore "$dir/ckpt.txt") + unlock $(ms_of unlock "$dir/ckpt.txt")"
    n=$(wl_count "$log")
    if wl_wait "$log" $((n + 2)) 30; then ok "raw $tag: workload kept running after the by-hand checkpoint"; else fail "raw $tag: workload stalled after the by-hand checkpoint"; fi
    # Kill, restore from the image.
    s1=$(wl_field "$(wl_last "$log")" step)
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    gpu_wait_free
    n=$(wl_count "$log")
    t0=$(now_ms)
    d0=$(now_ms)
    criu restore -D "$img" -o restore.log -v2 --restore-detached --pidfile "$dir/restored.pid"
    rc=$?
    local crest_ms=$(($(now_ms) - d0))
    cp "$img/restore.log" "$WORK/logs/raw-$tag-restore.log" 2>/dev/null
    if ((rc != 0)); then
        fail "raw $tag: criu restore failed (rc $rc)"
        tail -n 15 "$img/restore.log" | sed 's/^/  criu: /'
        return 1
    fi
    local rpid
    rpid=$(cat "$dir/restored.pid")
    RAW_PIDS+=("$rpid")
    : >"$dir/rest.txt"
    if ((CPU == 0)); then
        "$RAWC" resume "$rpid" | tee "$dir/rest.txt" || { fail "raw $tag: CUDA restore/unlock after criu restore failed"; return 1; }
    fi
    local rs_total=$(($(now_ms) - t0))
    info "raw $tag: restore ${rs_total} ms: criu restore ${crest_ms} + cuda restore $(ms_of restore "$dir/rest.txt") + unlock $(ms_of unlock "$dir/rest.txt") (pid $rpid)"
    continuity "raw-$tag" "$log" "$s0" "$s1" "$n" "$run"
    kill -9 "$rpid" 2>/dev/null
    RAW_CK_MS=$ck_total RAW_RS_MS=$rs_total RAW_DUMP_MS=$dump_ms RAW_CREST_MS=$crest_ms RAW_IMG=$img_bytes
    RAW_LOCK=$(ms_of lock "$dir/ckpt.txt") RAW_CKPT=$(ms_of checkpoint "$dir/ckpt.txt")
    RAW_GRES=$(ms_of restore "$dir/rest.txt") RAW_UNL=$(ms_of unlock "$dir/rest.txt")
    gpu_wait_free
    rm -rf "$img"
}

if [[ $MODE == smoke ]]; then
    say "smoke: GPU container through gpusnap (no checkpoint)"
    id=smoke-gpu
    log=$WORK/gpu/log/$id.log
    log_mark
    t0=$(now_ms)
    if gpu_run "$id" "$MIB"; then
        row smoke "ctr run -d (gpu, $MIB MiB)" $(($(now_ms) - t0)) - ""
        if wl_wait "$log" 4 90; then
            ok "GPU container $id: $(head -n 1 "$log")"
            check_clean "$log" "smoke GPU container"
            ctr t ls
            ctr t ps "$id" 2>&1 | sed 's/^/  /'
            ((CPU)) || nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 | sed 's/^/  /'
        else
            fail "GPU container $id: the log did not advance: $(tail -n 3 "$log" 2>&1 | tr '\n' ' ')"
            ctr t ls
            tail -n 30 "$WORK/containerd.log" | sed 's/^/  containerd: /'
        fi
    else
        fail "ctr run of the GPU container failed"
        tail -n 30 "$WORK/containerd.log" | sed 's/^/  containerd: /'
    fi
    shim_lines | tail -n 10 | sed 's/^/  shim: /'
    t0=$(now_ms)
    ctr_stop "$id" || fail "could not remove $id"
    row smoke "kill + rm (gpu)" $(($(now_ms) - t0)) - ""
    gpu_wait_free

    say "smoke: CPU-only container checkpoint/restore through gpusnap (runc + CRIU + network lock here)"
    id=smoke-cpu
    ctr run -d --null-io --runtime "$RT" $( ((NET_HOST)) && echo --net-host) \
        --mount "type=bind,src=$WORK/cpu,dst=/out,options=bind:rw" "$BB_IMAGE" "$id" \
        sh -c 'i=0; while true; do i=$((i+1)); echo $i > /out/count; sleep 0.1; done' ||
        fail "ctr run of the CPU container failed"
    sleep 1.5
    at=$(cat "$WORK/cpu/count" 2>/dev/null)
    if checkpoint_op smoke-cpu "$id" localhost/gpusnap-gpu/smoke-cpu:ck cpu; then
        ctr_stop "$id"
        sleep 0.3
        killed_at=$(cat "$WORK/cpu/count")
        if restore_op smoke-cpu "$id" localhost/gpusnap-gpu/smoke-cpu:ck; then
            sleep 1.5
            later=$(cat "$WORK/cpu/count")
            if ((later > at)); then ok "CPU container continued after restore ($at at checkpoint, $killed_at at kill, $later after restore)"; else fail "CPU container did not continue ($at -> $later)"; fi
        fi
        ctr_stop "$id"
        ctr images rm --sync localhost/gpusnap-gpu/smoke-cpu:ck >/dev/null 2>&1
    else
        ctr_stop "$id"
        for f in $(find "$WORK/containerd/state" "$CTD_TMP" -name '*.log' 2>/dev/null | head -n 5); do echo "-- $f"; tail -n 15 "$f"; done
    fi

    rawc() { ((CPU)) && return 0; "$RAWC" "$@"; }
    if true; then
        say "smoke: the GPU container's CRIU path without gpusnap: runc.v2 shim, CUDA locked/checkpointed by hand ($MIB MiB)"
        # What gpusnap automates, done by hand around containerd's stock runc shim: proves that
        # CRIU can dump and restore this container's mounts and devices once CUDA is checkpointed.
        id=smoke-rawctr
        log=$WORK/gpu/log/$id.log
        ref=localhost/gpusnap-gpu/$id:ck
        if GPU_RT=io.containerd.runc.v2 gpu_run "$id" "$MIB" && wl_wait "$log" 3 90; then
            run=$(wl_field "$(wl_last "$log")" run)
            s0=$(wl_field "$(wl_last "$log")" step)
            hpid=$(ctr t ls | awk -v i="$id" '$1 == i {print $2}')
            t0=$(now_ms)
            if rawc lock,checkpoint "$hpid" 10000; then
                checkpoint_op smoke-rawctr "$id" "$ref" none
                rawc resume "$hpid" || fail "smoke-rawctr: CUDA restore/unlock after the dump failed"
                row smoke-rawctr "by hand: lock+ckpt+ctr checkpoint+restore+unlock" $(($(now_ms) - t0)) - "host pid $hpid"
                n=$(wl_count "$log")
                wl_wait "$log" $((n + 2)) 30 && ok "smoke-rawctr: workload kept running" || fail "smoke-rawctr: workload stalled after the checkpoint"
                s1=$(wl_field "$(wl_last "$log")" step)
                ctr_stop "$id"
                n=$(wl_count "$log")
                s1=$(wl_field "$(wl_last "$log")" step)
                gpu_wait_free
                t0=$(now_ms)
                if restore_op smoke-rawctr "$id" "$ref"; then
                    hpid=$(ctr t ls | awk -v i="$id" '$1 == i {print $2}')
                    rawc state,resume "$hpid" || fail "smoke-rawctr: CUDA restore/unlock of the restored container failed"
                    row smoke-rawctr "by hand: ctr restore + cuda restore + unlock" $(($(now_ms) - t0)) - "host pid $hpid"
                    continuity smoke-rawctr "$log" "$s0" "$s1" "$n" "$run"
                fi
            else
                fail "smoke-rawctr: lock/checkpoint of the container's pid $hpid failed"
            fi
        else
            fail "smoke-rawctr: the GPU container did not start under runc.v2"
        fi
        ctr c ls -q | grep -qx "$id" && ctr_stop "$id"
        ctr images rm --sync "$ref" >/dev/null 2>&1
        gpu_wait_free
    fi

    say "smoke: raw CUDA checkpoint API + criu by hand on a host process ($RAW_MIB MiB)"
    raw_cycle "$RAW_MIB" smoke
    if [[ -n ${RAW_CK_MS:-} ]]; then
        row smoke-raw "checkpoint total (lock+ckpt+dump+restore+unlock)" "$RAW_CK_MS" - "lock=${RAW_LOCK:-} ckpt=${RAW_CKPT:-} dump=$RAW_DUMP_MS img=$RAW_IMG"
        row smoke-raw "restore total (criu restore+cuda restore+unlock)" "$RAW_RS_MS" - "criu=$RAW_CREST_MS gpu_restore=${RAW_GRES:-} unlock=${RAW_UNL:-}"
    fi
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# 6. Functional scenarios
# ---------------------------------------------------------------------------------------------
ID=gpu1
LOG=$WORK/gpu/log/$ID.log
RUN=""
if has run || has a || has b || has c; then
    say "run: $MIB MiB workload in a container through gpusnap"
    t0=$(now_ms)
    if ! gpu_run "$ID" "$MIB"; then
        tail -n 30 "$WORK/containerd.log" | sed 's/^/  containerd: /'
        setup_die "ctr run of the GPU container failed"
    fi
    row run "ctr run -d ($MIB MiB)" $(($(now_ms) - t0)) - ""
    wl_wait "$LOG" 3 90 || setup_die "the GPU workload did not start: $(tail -n 3 "$LOG" 2>&1 | tr '\n' ' ')"
    row run "start -> 3 steps" $(($(now_ms) - t0)) - "$(head -n 1 "$LOG" | cut -d' ' -f1-6)"
    RUN=$(wl_field "$(wl_last "$LOG")" run)
    check_clean "$LOG" run
fi

if has a && time_left 60; then
    say "a: checkpoint, leaving the container running"
    s0=$(wl_field "$(wl_last "$LOG")" step)
    n0=$(wl_count "$LOG")
    if checkpoint_op a "$ID" localhost/gpusnap-gpu/a:ck; then
        n1=$(wl_count "$LOG")
        if wl_wait "$LOG" $((n1 + 3)) 30; then
            ok "a: workload kept running after the checkpoint (step $(wl_field "$(wl_last "$LOG")" step))"
        else
            fail "a: workload stalled after the checkpoint: $(tail -n 2 "$LOG" | tr '\n' ' ')"
        fi
        [[ $(wl_field "$(wl_last "$LOG")" run) == "$RUN" ]] || fail "a: run id changed: the workload restarted"
        st=$(ctr t ls | awk -v i="$ID" '$1 == i {print $3}')
        [[ $st == RUNNING ]] && ok "a: task is $st" || fail "a: task is ${st:-gone}, expected RUNNING"
        gap=$(wl_gap "$LOG" "$n0" "$(wl_count "$LOG")")
        row a "workload stall (max step gap)" "$gap" - "interval ${INTERVAL} ms"
        check_clean "$LOG" a
    fi
    ctr images rm --sync localhost/gpusnap-gpu/a:ck >/dev/null 2>&1
fi

# checkpoint_kill_restore PHASE: checkpoint gpu1, kill it, restore it, verify.
checkpoint_kill_restore() {
    local phase=$1 ref=localhost/gpusnap-gpu/$1:ck s0 s1 n t0
    s0=$(wl_field "$(wl_last "$LOG")" step)
    checkpoint_op "$phase" "$ID" "$ref" || return 1
    s1=$(wl_field "$(wl_last "$LOG")" step)
    t0=$(now_ms)
    ctr_stop "$ID" || { fail "$phase: could not remove the original container"; return 1; }
    n=$(wl_count "$LOG")
    s1=$(wl_field "$(wl_last "$LOG")" step)
    row "$phase" "kill + rm original" $(($(now_ms) - t0)) - "at step $s1"
    t0=$(now_ms)
    gpu_wait_free
    row "$phase" "wait for GPU memory to be freed" $(($(now_ms) - t0)) - ""
    restore_op "$phase" "$ID" "$ref" || return 1
    continuity "$phase" "$LOG" "$s0" "$s1" "$n" "$RUN"
    ctr images rm --sync "$ref" >/dev/null 2>&1
}

if has b && time_left 90; then
    say "b: checkpoint, kill, restore"
    checkpoint_kill_restore b
fi
if has c && time_left 90; then
    say "c: checkpoint the restored container, kill, restore again (C->R->C)"
    if ctr t ls | awk -v i="$ID" '$1 == i {print $3}' | grep -qx RUNNING; then
        checkpoint_kill_restore c
        n=$(wl_count "$LOG")
        if wl_wait "$LOG" $((n + 4)) 30; then check_clean "$LOG" "c (after 4 more steps)"; else fail "c: the twice-restored workload stalled"; fi
    else
        fail "c: $ID is not running (b failed?); C->R->C skipped"
    fi
fi
if has p && ((CPU)); then
    note "p: skipped with --cpu (the refusal comes from the real driver's missing CUDA 13.4 API)"
elif has p && time_left 60; then
    say "p: storage engine posix on a driver without the CUDA 13.4 API is refused, workload untouched"
    PID_ID=gpu-posix
    PLOG=$WORK/gpu/log/$PID_ID.log
    pdir=$WORK/ramtmp/p-image
    GPU_EXTRA=(--annotation gpusnap.io/storage-engine=posix)
    gpu_run "$PID_ID" 512 >/dev/null
    GPU_EXTRA=()
    if wl_wait "$PLOG" 3 60; then
        n=$(wl_count "$PLOG")
        log_mark
        t0=$(now_ms)
        out=$(ctr tasks checkpoint --image-path "$pdir" "$PID_ID" 2>&1)
        rc=$?
        ms=$(($(now_ms) - t0))
        printf '%s\n' "$out" | sed 's/^/  ctr: /'
        if ((rc != 0)) && grep -q 'posix' <<<"$out" && grep -q '13.4' <<<"$out"; then
            ok "p: checkpoint refused in $ms ms, naming the engine and the 13.4 requirement"
        else
            fail "p: expected a refusal naming posix and CUDA 13.4 (rc $rc)"
        fi
        grep -q 'Nothing was locked' <<<"$out" && ok "p: the error says nothing was locked" || fail "p: the error does not say nothing was locked"
        [[ -f $pdir/gpusnap-manifest.json ]] && fail "p: a manifest was written" || ok "p: nothing that looks like a checkpoint in $pdir"
        st=$(ctr t ls | awk -v i="$PID_ID" '$1 == i {print $3}')
        [[ $st == RUNNING ]] && ok "p: task still RUNNING" || fail "p: task is $st"
        if wl_wait "$PLOG" $((n + 4)) 30; then ok "p: workload kept stepping (unlocked)"; else fail "p: workload stalled after the refusal"; fi
        check_clean "$PLOG" p
        row p "checkpoint with storage engine posix (refused)" "$ms" "-" "rc=$rc"
    else
        fail "p: the posix-annotated workload did not start"
    fi
    ctr_stop "$PID_ID"
    rm -rf "$pdir"
    for im in $(ctr images ls -q | grep '^containerd.io/checkpoint/'); do ctr images rm --sync "$im" >/dev/null 2>&1; done
    gpu_wait_free
fi
if has x && time_left 60; then
    say "x: checkpoint with exit to an image path (ctr t checkpoint --exit --image-path)"
    if ctr t ls | awk -v i="$ID" '$1 == i {print $3}' | grep -qx RUNNING; then
        xdir=$WORK/ramtmp/x-image
        s0=$(wl_field "$(wl_last "$LOG")" step)
        log_mark
        t0=$(now_ms)
        ctr tasks checkpoint --exit --image-path "$xdir" "$ID"
        rc=$?
        ms=$(($(now_ms) - t0))
        shim_lines | sed 's/^/  shim: /'
        detail=""
        if ((rc == 0)); then
            ok "x: ctr t checkpoint --exit --image-path in $ms ms"
            for _ in $(seq 100); do
                st=$(ctr t ls | awk -v i="$ID" '$1 == i {print $3}')
                [[ $st == RUNNING ]] || break
                sleep 0.1
            done
            [[ $st != RUNNING ]] && ok "x: task is ${st:-gone} after --exit" || fail "x: task still RUNNING after --exit"
            n=$(wl_count "$LOG")
            sleep $(((INTERVAL * 3 + 999) / 1000))
            (($(wl_count "$LOG") == n)) && ok "x: the workload stopped at step $(wl_field "$(wl_last "$LOG")" step)" ||
                fail "x: the workload kept logging after checkpoint --exit"
            if [[ -f $xdir/gpusnap-manifest.json ]]; then
                cp "$xdir/gpusnap-manifest.json" "$WORK/logs/manifest-x.json"
                save_manifest x "$xdir/gpusnap-manifest.json"
                manifest_summary "$xdir/gpusnap-manifest.json"
                detail=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(" ".join("%s=%s" % (p["name"], p["ms"]) for p in m.get("timings", [])) + ("" if m.get("gpu") else " [no gpu section]"))' "$xdir/gpusnap-manifest.json")
                ((CPU == 0)) && ! grep -q '"gpu"' "$xdir/gpusnap-manifest.json" && fail "x: the manifest has no gpu section"
                info "x: image dir holds $(du -sb "$xdir" | cut -f1) bytes"
            else
                fail "x: no gpusnap-manifest.json in $xdir ($(ls "$xdir" 2>&1 | head -n 5 | tr '\n' ' '))"
            fi
            check_clean "$LOG" x
        else
            fail "x: ctr t checkpoint --exit --image-path failed (rc $rc)"
            detail=FAILED
        fi
        xs=$(shim_total checkpoint)
        row x "checkpoint --exit --image-path (ctr t)" "$ms" "${xs:--}" "$detail"
        rm -rf "$xdir"
        # ctr also records an (empty) image for it
        for im in $(ctr images ls -q | grep '^containerd.io/checkpoint/'); do ctr images rm --sync "$im" >/dev/null 2>&1; done
    else
        fail "x: $ID is not running; skipped"
    fi
fi
if ctr c ls -q | grep -qx "$ID"; then ctr_stop "$ID"; fi
gpu_wait_free

# ---------------------------------------------------------------------------------------------
# 6b. plugin, runc, runcv2, k8s, bench2, posixbench (each only when named in --scenarios)
# ---------------------------------------------------------------------------------------------
# shellcheck source=tests/gpu/scenarios-more.sh
source "$REPO/tests/gpu/scenarios-more.sh"
# shellcheck source=tests/gpu/scenario-fleet.sh
source "$REPO/tests/gpu/scenario-fleet.sh"
# shellcheck source=tests/gpu/scenario-crypt.sh
source "$REPO/tests/gpu/scenario-crypt.sh"
# shellcheck source=tests/gpu/scenario-volume.sh
source "$REPO/tests/gpu/scenario-volume.sh"
# shellcheck source=tests/gpu/scenario-push.sh
source "$REPO/tests/gpu/scenario-push.sh"
# shellcheck source=tests/gpu/scenario-ab.sh
source "$REPO/tests/gpu/scenario-ab.sh"

# ---------------------------------------------------------------------------------------------
# 7. Benchmark
# ---------------------------------------------------------------------------------------------
for size in ${BENCH//,/ }; do
    est=$((20 + size * 8 / 1024))
    if ! time_left "$est"; then
        note "benchmark $size MiB skipped: about ${est}s needed, $((DEADLINE - $(elapsed_s)))s left before the deadline"
        continue
    fi
    say "benchmark $size MiB: gpusnap through containerd"
    id=bench-$size
    blog=$WORK/gpu/log/$id.log
    t0=$(now_ms)
    gpu_run "$id" "$size" || { fail "bench $size: ctr run failed"; continue; }
    if ! wl_wait "$blog" 3 $((60 + size / 256)); then fail "bench $size: the workload did not start"; ctr_stop "$id"; continue; fi
    info "bench $size: workload up in $(($(now_ms) - t0)) ms: $(head -n 1 "$blog" | cut -d' ' -f1-6)"
    brun=$(wl_field "$(wl_last "$blog")" run)
    s0=$(wl_field "$(wl_last "$blog")" step)
    G_CK="" G_RS="" G_CK_SHIM="" G_CK_MF=""
    if checkpoint_op "bench-$size" "$id" "localhost/gpusnap-gpu/$id:ck"; then
        G_CK=$CK_MS G_CK_SHIM=$CK_SHIM G_CK_MF=$CK_MFSUM
        s1=$(wl_field "$(wl_last "$blog")" step)
        ctr_stop "$id"
        n=$(wl_count "$blog")
        s1=$(wl_field "$(wl_last "$blog")" step)
        gpu_wait_free
        if restore_op "bench-$size" "$id" "localhost/gpusnap-gpu/$id:ck"; then
            G_RS=$RS_MS
            continuity "bench-$size" "$blog" "$s0" "$s1" "$n" "$brun"
        fi
    fi
    ctr_stop "$id"
    ctr images rm --sync "localhost/gpusnap-gpu/$id:ck" >/dev/null 2>&1
    gpu_wait_free
    RAW_CK_MS="" RAW_RS_MS="" RAW_LOCK="" RAW_CKPT="" RAW_DUMP_MS="" RAW_CREST_MS="" RAW_GRES="" RAW_UNL=""
    if ((RAW)) && time_left $((10 + size * 3 / 1024)); then
        say "benchmark $size MiB: raw driver API + criu by hand"
        raw_cycle "$size" "bench-$size"
    fi
    BENCH_ROWS+=("$size|checkpoint, leave running: ctr wall vs raw total|${G_CK:--}|${RAW_CK_MS:--}")
    BENCH_ROWS+=("$size|  shim total_ms (no containerd tar) vs raw|${G_CK_SHIM:--}|${RAW_CK_MS:--}")
    BENCH_ROWS+=("$size|  sum of manifest phases vs raw|${G_CK_MF:--}|${RAW_CK_MS:--}")
    BENCH_ROWS+=("$size|  raw: lock + checkpoint / criu dump|-|${RAW_LOCK:-}+${RAW_CKPT:-} / ${RAW_DUMP_MS:-}")
    BENCH_ROWS+=("$size|restore: ctr wall vs raw total|${G_RS:--}|${RAW_RS_MS:--}")
    BENCH_ROWS+=("$size|  raw: criu restore / cuda restore + unlock|-|${RAW_CREST_MS:-} / ${RAW_GRES:-}+${RAW_UNL:-}")
done
exit 0
