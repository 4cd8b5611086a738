#!/usr/bin/env bash
# tests/gpu/make-bundle.sh — runs HERE (the Debian 12 dev box set up by scripts/setup-env.sh).
#
# Packs everything tests/gpu/run-h200.sh needs on the H200 device machine (Ubuntu 24.04, no
# network, no cargo) into .bundle/gpusnap-gpu.tar.xz, which the device tool carries with
# `carry: [".bundle"]`:
#
#   bin/containerd-shim-gpusnap-v2   gpusnap shim, release build, stripped
#   bin/gpusnap-runc                 gpusnap's runc wrapper (package gpusnap-runc), stripped
#   bin/gpusnap                      gpusnap CLI (package gpusnap-cli), stripped
#   bin/posix_bench                  cuda/examples/posix_bench.rs (release), when it builds
#   bin/crictl                       cri-tools v1.36 crictl (static), from $CRICTL_XZ
#   bin/cuda-checkpoint              NVIDIA's cuda-checkpoint, ONLY from $CUDA_CHECKPOINT_BIN
#                                    (never committed; the scenarios that need it are skipped
#                                    without it). CRIU's cuda plugin execs it from CRIU's PATH.
#   plugins/cuda/cuda_plugin.so      CRIU's own cuda plugin, built here from the CRIU source
#                                    tarball setup-env used ($RIG/src/criu_*.orig.tar.xz):
#                                    `make criu cuda_plugin` in a temporary tree (the plugin
#                                    links against criu's internals, so it must come from the
#                                    same source and build configuration as libexec/criu).
#                                    Cached in $CUDA_PLUGIN_CACHE by tarball + criu binary sha.
#   bin/containerd ctr containerd-shim-runc-v2   from $RIG/bin (containerd 2.1.x)
#   bin/runc                         /usr/sbin/runc (Debian 12, 1.1.x; dynamically linked to
#                                    libseccomp.so.2 — run-h200.sh registers lib/runc/ with
#                                    ldconfig when the device lacks it, because `runc init`
#                                    re-execs /proc/self/exe with an empty environment, so
#                                    LD_LIBRARY_PATH would not reach it)
#   bin/criu                         wrapper: LD_LIBRARY_PATH=lib/criu exec libexec/criu "$@"
#                                    (runc execs `criu` from its PATH; the shim's
#                                    criu.binary_dir points at bin/)
#   libexec/criu                     $RIG/bin/criu (CRIU 4.2.x built from Debian sid's source)
#   lib/criu/*.so*                   every non-glibc library criu needs (ldd), for Ubuntu 24.04
#   lib/runc/libseccomp.so.2
#   tools/{ip,ss,jq,skopeo}          this machine's tools (+ libexec/NAME, lib/NAME), used only
#                                    where the device lacks them: ip for CRIU's network
#                                    namespace dump/restore, jq and ss for the fleet and crypt
#                                    benchmarks, skopeo for the fleet benchmark's comparison
#   images/busybox.oci.tar           docker.io/gpusnap/busybox:test (CPU smoke)
#   images/pause.oci.tar             docker.io/gpusnap/pause:test (CRI sandbox image)
#   images/gpu-base.oci.tar          docker.io/gpusnap/gpu-base:test: the busybox rootfs plus
#                                    lib -> usr/lib and lib64 -> usr/lib64, so that binding the
#                                    host's /usr read-only over /usr gives the nvcc-built
#                                    workload its glibc/libstdc++ (see README.md)
#   VERSIONS                         what went in, with sha256s
#
# With BASELINE_BIN_DIR=DIR (DIR holds a release `containerd-shim-gpusnap-v2` and `gpusnap-runc`
# built from an earlier commit, BASELINE_COMMIT), also .bundle/gpusnap-baseline.tar.xz (+ .sha256):
#   gpusnap-baseline/bin/containerd-shim-gpusnap-v2, gpusnap-baseline/bin/gpusnap-runc  stripped
#   gpusnap-baseline/COMMIT          $BASELINE_COMMIT
#   gpusnap-baseline/VERSIONS        where they came from, with sha256s
# run-h200.sh's scenario `ab` swaps the shim between the bundle's and these (before/after
# timings in one call; the bundle is too large to carry twice). `--baseline-only` writes only
# that tarball: no cargo, no plugin, the bundle left as it is. Both tarballs and the working
# tree travel together under the device's 64 MiB limit; the script refuses a .bundle over 58 MiB.
#   e.g. git worktree add /tmp/base <commit>; (cd /tmp/base && cargo build --release -p gpusnap-shim
#        -p gpusnap-runc); BASELINE_BIN_DIR=/tmp/base/target/release BASELINE_COMMIT=<commit> \
#        tests/gpu/make-bundle.sh --baseline-only
#
# Usage: tests/gpu/make-bundle.sh [--no-build] [--no-runc-shim] [--no-cuda-plugin]
#                                 [--no-crictl] [--cuda-plugin-only] [--baseline-only]
#                                 [--xz-level N]
#   --no-build          do not run cargo; use the binaries already built (target dir from
#                       `cargo metadata`, or SHIM_BIN / RUNC_WRAPPER_BIN / CLI_BIN /
#                       POSIX_BENCH_BIN from the environment)
#   --no-runc-shim      leave containerd-shim-runc-v2 out (saves ~4 MB compressed; the
#                       plugin, runcv2 and bench2 scenarios need it)
#   --no-cuda-plugin    do not build/ship CRIU's cuda plugin
#   --no-crictl         leave crictl out (~7 MB; the k8s scenario needs it)
#   --cuda-plugin-only  build (or find in the cache) the cuda plugin, check it, and stop
#   --baseline-only     write .bundle/gpusnap-baseline.tar.xz from BASELINE_BIN_DIR and stop
# Environment: GPUSNAP_RIG_PREFIX (default /opt/gpusnap-rig), SHIM_BIN, RUNC_WRAPPER_BIN,
#   CLI_BIN, POSIX_BENCH_BIN, CUDA_CHECKPOINT_BIN (NVIDIA's cuda-checkpoint binary:
#   bin/x86_64_Linux/cuda-checkpoint of github.com/NVIDIA/cuda-checkpoint, never committed), CRICTL_XZ (default
#   ../shared/tools/cri-tools/crictl.xz), CRIU_SRC_TARBALL (default
#   $RIG/src/criu_<version>.orig.tar.xz), CUDA_PLUGIN_CACHE (default
#   /var/tmp/gpusnap-cuda-plugin-cache), CUDA_PLUGIN_SO (use this plugin as is),
#   BASELINE_BIN_DIR and BASELINE_COMMIT (the baseline tarball, above).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD

RIG=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
BUILD=1
RUNC_SHIM=1
CUDA_PLUGIN=1
CRICTL=1
PLUGIN_ONLY=0
BASELINE_ONLY=0
XZ_LEVEL=9
while (($#)); do
    case $1 in
    --no-build) BUILD=0 ;;
    --no-runc-shim) RUNC_SHIM=0 ;;
    --no-cuda-plugin) CUDA_PLUGIN=0 ;;
    --no-crictl) CRICTL=0 ;;
    --cuda-plugin-only) PLUGIN_ONLY=1 ;;
    --baseline-only) BASELINE_ONLY=1 ;;
    --xz-level) XZ_LEVEL=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; exit 0 ;;
    *) echo "make-bundle: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '[make-bundle] %s\n' "$*"; }
die() { printf '[make-bundle] ERROR: %s\n' "$*" >&2; exit 1; }

OUTDIR=$ROOT/.bundle
# bundle_dir: .bundle, made and kept out of git.
bundle_dir() {
    local ex
    mkdir -p "$OUTDIR"
    # In a worktree, .git is a file: ask git where the exclude file is.
    ex=$(git -C "$ROOT" rev-parse --path-format=absolute --git-path info/exclude 2>/dev/null || echo "$ROOT/.git/info/exclude")
    grep -qxE '/\.bundle/?' "$ex" 2>/dev/null || echo '/.bundle/' >>"$ex"
}
# check_carry_size: everything in .bundle travels with the working tree (64 MiB together).
check_carry_size() {
    local total
    total=$(find "$OUTDIR" -maxdepth 1 -type f -name '*.tar.xz' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    log ".bundle tarballs: $((total >> 20)) MiB together ($(cd "$OUTDIR" && ls *.tar.xz | tr '\n' ' '))"
    ((total < 58 * 1024 * 1024)) || die ".bundle holds $((total >> 20)) MiB: with the working tree, too close to the device tool's 64 MiB carry limit (leave the baseline out, or make the bundle with --no-crictl)"
}

# ---------------------------------------------------------------------------------------------
# The baseline's binaries (scenario ab): BASELINE_BIN_DIR, BASELINE_COMMIT
# ---------------------------------------------------------------------------------------------
if [[ -n ${BASELINE_BIN_DIR:-} ]] || ((BASELINE_ONLY)); then
    [[ -n ${BASELINE_BIN_DIR:-} ]] || die "--baseline-only needs BASELINE_BIN_DIR (a directory with the baseline's release containerd-shim-gpusnap-v2 and gpusnap-runc)"
    for b in containerd-shim-gpusnap-v2 gpusnap-runc; do
        [[ -x $BASELINE_BIN_DIR/$b ]] || die "BASELINE_BIN_DIR=$BASELINE_BIN_DIR has no executable $b"
    done
    [[ -n ${BASELINE_COMMIT:-} ]] || die "BASELINE_BIN_DIR is set but BASELINE_COMMIT is not: say which commit the baseline binaries were built from"
    for t in xz strip sha256sum tar; do command -v $t >/dev/null || die "$t not found"; done
fi
# write_baseline: .bundle/gpusnap-baseline.tar.xz (+ .sha256) from BASELINE_BIN_DIR.
write_baseline() {
    local stage bb b out=$OUTDIR/gpusnap-baseline.tar.xz size
    bundle_dir
    stage=$(mktemp -d /tmp/gpusnap-baseline.XXXXXX)
    bb=$stage/gpusnap-baseline
    mkdir -p "$bb/bin"
    for b in containerd-shim-gpusnap-v2 gpusnap-runc; do
        strip -o "$bb/bin/$b" "$BASELINE_BIN_DIR/$b" || { rm -rf "$stage"; die "strip $BASELINE_BIN_DIR/$b failed"; }
        chmod 0755 "$bb/bin/$b"
    done
    printf '%s\n' "$BASELINE_COMMIT" >"$bb/COMMIT"
    {
        echo "made: $(date -u +%FT%TZ) on $(hostname)"
        echo "commit: $BASELINE_COMMIT"
        for b in containerd-shim-gpusnap-v2 gpusnap-runc; do
            echo "$b: $BASELINE_BIN_DIR/$b (mtime $(date -u -r "$BASELINE_BIN_DIR/$b" +%FT%TZ)), stripped sha256 $(sha256sum "$bb/bin/$b" | cut -c1-16)"
        done
    } >"$bb/VERSIONS"
    log "baseline: compressing (xz -$XZ_LEVEL) $(du -sh "$bb" | cut -f1) of commit $BASELINE_COMMIT -> $out"
    tar -C "$stage" -cf - gpusnap-baseline | xz -T0 -"$XZ_LEVEL" >"$out.new"
    rm -rf "$stage"
    mv -f "$out.new" "$out"
    (cd "$OUTDIR" && sha256sum gpusnap-baseline.tar.xz >gpusnap-baseline.tar.xz.sha256)
    size=$(stat -c %s "$out")
    log "baseline: $out ($((size / 1024 / 1024)) MiB, $size bytes)"
}
if ((BASELINE_ONLY)); then
    write_baseline
    check_carry_size
    exit 0
fi

for t in jq xz strip sha256sum tar ldd; do command -v $t >/dev/null || die "$t not found"; done
[[ -x $RIG/bin/containerd && -x $RIG/bin/criu ]] || die "$RIG not set up: run scripts/setup-env.sh"
RUNC_SRC=$(command -v runc || true)
[[ -n $RUNC_SRC ]] || die "runc not found on PATH"

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

# ---------------------------------------------------------------------------------------------
# CRIU's cuda plugin, from the same source tarball and build configuration as $RIG/bin/criu
# ---------------------------------------------------------------------------------------------
# build_cuda_plugin: prints the path of a cuda_plugin.so that matches $RIG/bin/criu.
build_cuda_plugin() {
    if [[ -n ${CUDA_PLUGIN_SO:-} ]]; then
        [[ -f $CUDA_PLUGIN_SO ]] || die "CUDA_PLUGIN_SO=$CUDA_PLUGIN_SO does not exist"
        echo "$CUDA_PLUGIN_SO"
        return
    fi
    local tarball=${CRIU_SRC_TARBALL:-} cache key out tmp src t0
    if [[ -z $tarball ]]; then
        tarball=$(ls "$RIG"/src/criu_*.orig.tar.xz 2>/dev/null | sort -V | tail -n1)
    fi
    [[ -f $tarball ]] || die "CRIU source tarball not found (CRIU_SRC_TARBALL, or $RIG/src/criu_*.orig.tar.xz from setup-env.sh)"
    cache=${CUDA_PLUGIN_CACHE:-/var/tmp/gpusnap-cuda-plugin-cache}
    key=$(sha256sum "$tarball" | cut -c1-16)-$(sha256sum "$RIG/bin/criu" | cut -c1-16)
    out=$cache/$key/cuda_plugin.so
    if [[ -s $out ]]; then
        log "cuda plugin: cached $out" >&2
        echo "$out"
        return
    fi
    tmp=$(mktemp -d /tmp/gpusnap-criu-src.XXXXXX)
    log "cuda plugin: unpacking $(basename "$tarball") and building \`make criu cuda_plugin\` (log: $tmp/build.log)" >&2
    tar -C "$tmp" -xJf "$tarball" || die "unpacking $tarball failed"
    src=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n1)
    t0=$(date +%s)
    # The same make invocation as setup-env.sh (no PLUGINDIR: criu's built-in plugin directory
    # stays /usr/lib/criu/), plus the plugin target.
    if ! nice -n 10 make -C "$src" -j2 criu cuda_plugin >"$tmp/build.log" 2>&1; then
        tail -n 30 "$tmp/build.log" >&2
        die "building CRIU's cuda plugin failed (log: $tmp/build.log)"
    fi
    [[ -f $src/plugins/cuda/cuda_plugin.so ]] || die "make did not produce plugins/cuda/cuda_plugin.so"
    mkdir -p "$cache/$key"
    install -m 0644 "$src/plugins/cuda/cuda_plugin.so" "$out"
    {
        echo "tarball: $tarball ($(sha256sum "$tarball" | cut -d' ' -f1))"
        echo "criu it matches: $RIG/bin/criu ($(sha256sum "$RIG/bin/criu" | cut -d' ' -f1))"
        echo "built: $(date -u +%FT%TZ) in $(($(date +%s) - t0)) s: make -C <src> -j2 criu cuda_plugin"
        echo "built criu --version: $("$src/criu/criu" --version | tr '\n' ' ')"
    } >"$cache/$key/BUILD-INFO"
    rm -rf "$tmp"
    log "cuda plugin: built in $(($(date +%s) - t0)) s -> $out" >&2
    echo "$out"
}

# check_cuda_plugin SO: CRIU (the rig's binary) loads it: a dump of a plain process with
# CRIU_LIBS_DIR holding only this plugin. Without /proc/driver/nvidia the plugin disables
# itself in init, which is fine: dlopen has resolved its references into criu by then.
check_cuda_plugin() {
    local so=$1 d pid rc
    d=$(mktemp -d /tmp/gpusnap-plugin-check.XXXXXX)
    mkdir -p "$d/plugins" "$d/img"
    cp "$so" "$d/plugins/cuda_plugin.so"
    setsid sleep 60 </dev/null >/dev/null 2>&1 &
    pid=$!
    rc=0
    CRIU_LIBS_DIR=$d/plugins "$RIG/bin/criu" dump -t "$pid" -D "$d/img" -o dump.log -v4 --leave-running >/dev/null 2>&1 || rc=$?
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if ((rc != 0)) || ! grep -qi 'cuda_plugin' "$d/img/dump.log"; then
        grep -iE 'plugin|error' "$d/img/dump.log" 2>/dev/null | tail -n 15 >&2
        rm -rf "$d"
        die "$RIG/bin/criu did not load $so (dump rc $rc)"
    fi
    log "cuda plugin: loads into $RIG/bin/criu: $(grep -i 'cuda_plugin' "$d/img/dump.log" | head -n 2 | sed 's/^.*) //' | tr '\n' ';')"
    rm -rf "$d"
}

CUDA_PLUGIN_PATH=""
if ((CUDA_PLUGIN || PLUGIN_ONLY)); then
    CUDA_PLUGIN_PATH=$(build_cuda_plugin) || exit 1
    check_cuda_plugin "$CUDA_PLUGIN_PATH"
fi
((PLUGIN_ONLY)) && exit 0

# ---------------------------------------------------------------------------------------------
# gpusnap binaries
# ---------------------------------------------------------------------------------------------
TARGET=${CARGO_TARGET_DIR:-}
if [[ -z $TARGET ]] && command -v cargo >/dev/null; then
    TARGET=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || true)
fi
TARGET=${TARGET:-$ROOT/target}
if ((BUILD)); then
    log "cargo build --release -p gpusnap-shim -p gpusnap-runc -p gpusnap-cli"
    nice -n 10 cargo build --release -p gpusnap-shim -p gpusnap-runc -p gpusnap-cli ||
        die "cargo build failed"
    log "cargo build --release -p gpusnap-cuda --example posix_bench (optional)"
    nice -n 10 cargo build --release -p gpusnap-cuda --example posix_bench 2>&1 | tail -n 3
    ((PIPESTATUS[0] == 0)) || log "warning: posix_bench did not build; bundling without it"
fi
SHIM_BIN=${SHIM_BIN:-$TARGET/release/containerd-shim-gpusnap-v2}
RUNC_WRAPPER_BIN=${RUNC_WRAPPER_BIN:-$TARGET/release/gpusnap-runc}
CLI_BIN=${CLI_BIN:-$TARGET/release/gpusnap}
POSIX_BENCH_BIN=${POSIX_BENCH_BIN:-$TARGET/release/examples/posix_bench}
[[ -x $SHIM_BIN ]] || die "no shim at $SHIM_BIN (build it, or set SHIM_BIN)"
[[ -x $RUNC_WRAPPER_BIN ]] || die "no gpusnap-runc at $RUNC_WRAPPER_BIN (build it, or set RUNC_WRAPPER_BIN)"
[[ -x $CLI_BIN ]] || die "no gpusnap CLI at $CLI_BIN (build it, or set CLI_BIN)"
for b in "$SHIM_BIN" "$RUNC_WRAPPER_BIN" "$CLI_BIN"; do
    # A binary older than the newest source file means a stale build (--no-build).
    newer=$(find "$ROOT"/{shim,runc-wrapper,cli,transaction,checkpoint,criu-bridge,cuda/src,config,oci-image} \
        -name '*.rs' -newer "$b" -print -quit 2>/dev/null || true)
    [[ -z $newer ]] || log "warning: $b is older than $newer"
done
CRICTL_XZ=${CRICTL_XZ:-$(cd "$ROOT/.." && pwd)/shared/tools/cri-tools/crictl.xz}
if ((CRICTL)) && [[ ! -f $CRICTL_XZ ]]; then
    die "crictl not found at $CRICTL_XZ (set CRICTL_XZ, or --no-crictl)"
fi
if [[ -n ${CUDA_CHECKPOINT_BIN:-} ]]; then
    [[ -f $CUDA_CHECKPOINT_BIN ]] || die "CUDA_CHECKPOINT_BIN=$CUDA_CHECKPOINT_BIN does not exist"
    head -c 4 "$CUDA_CHECKPOINT_BIN" | grep -q ELF || die "CUDA_CHECKPOINT_BIN=$CUDA_CHECKPOINT_BIN is not an ELF binary"
fi

# ---------------------------------------------------------------------------------------------
# Stage
# ---------------------------------------------------------------------------------------------
bundle_dir
STAGE=$(mktemp -d /tmp/gpusnap-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/gpusnap-gpu
mkdir -p "$B"/{bin,libexec,lib/criu,lib/runc,lib/ip,tools,images,plugins/cuda}

# carry_tool NAME: this machine's NAME as tools/NAME, a wrapper running libexec/NAME with its
# libraries from lib/NAME (nothing when this machine lacks it).
carry_tool() {
    local src
    src=$(command -v "$1" || true)
    [[ -n $src ]] || { log "host tool $1: not here, not carried"; return 0; }
    mkdir -p "$B/lib/$1"
    install -m 0755 "$src" "$B/libexec/$1"
    copy_libs "$src" "$B/lib/$1"
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib/%s" exec "$d/libexec/%s" "$@"\n' "$1" "$1" >"$B/tools/$1"
    chmod 0755 "$B/tools/$1"
}
# copy_libs BINARY DEST: every resolved shared library of BINARY except glibc's own.
copy_libs() {
    local bin=$1 dest=$2 lib base
    while read -r lib; do
        base=$(basename "$lib")
        case $base in
        libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*.so.* | libresolv.so.*) continue ;;
        esac
        cp -L "$lib" "$dest/$base"
    done < <(ldd "$bin" | awk '/=> \// {print $3}')
    if ldd "$bin" | grep -q 'not found'; then die "$bin has unresolved libraries here: $(ldd "$bin" | grep 'not found')"; fi
}

log "shim: $SHIM_BIN ($(stat -c %s "$SHIM_BIN") bytes) -> stripped"
strip -o "$B/bin/containerd-shim-gpusnap-v2" "$SHIM_BIN"
strip -o "$B/bin/gpusnap-runc" "$RUNC_WRAPPER_BIN"
strip -o "$B/bin/gpusnap" "$CLI_BIN"
log "gpusnap-runc: $RUNC_WRAPPER_BIN; gpusnap CLI: $CLI_BIN"
if [[ -x $POSIX_BENCH_BIN ]]; then
    strip -o "$B/bin/posix_bench" "$POSIX_BENCH_BIN"
    log "posix_bench: $POSIX_BENCH_BIN"
else
    log "posix_bench: not found at $POSIX_BENCH_BIN (optional; the posixbench scenario will say so)"
fi
if ((CRICTL)); then
    xz -dc "$CRICTL_XZ" >"$B/bin/crictl" && chmod 0755 "$B/bin/crictl"
    log "crictl: $("$B/bin/crictl" --version 2>/dev/null)"
fi
if [[ -n ${CUDA_CHECKPOINT_BIN:-} ]]; then
    install -m 0755 "$CUDA_CHECKPOINT_BIN" "$B/bin/cuda-checkpoint"
    log "cuda-checkpoint: $CUDA_CHECKPOINT_BIN ($(sha256sum "$CUDA_CHECKPOINT_BIN" | cut -c1-16)) (not redistributed beyond this test bundle)"
else
    log "cuda-checkpoint: not given (CUDA_CHECKPOINT_BIN unset); the plugin scenarios and bench2's reference side will be skipped"
fi
if [[ -n $CUDA_PLUGIN_PATH ]]; then
    install -m 0644 "$CUDA_PLUGIN_PATH" "$B/plugins/cuda/cuda_plugin.so"
    [[ -f $(dirname "$CUDA_PLUGIN_PATH")/BUILD-INFO ]] && cp "$(dirname "$CUDA_PLUGIN_PATH")/BUILD-INFO" "$B/plugins/cuda/BUILD-INFO"
fi
for b in containerd ctr; do install -m 0755 "$RIG/bin/$b" "$B/bin/$b"; done
# The fleet scenario's registry and skopeo (Debian's; optional: the scenario says what is missing).
[[ -x /usr/bin/docker-registry ]] && install -m 0755 /usr/bin/docker-registry "$B/bin/docker-registry"
# Host tools the scenarios use, carried as fallbacks (run-h200.sh puts tools/ LAST on PATH, so
# the device's own win): skopeo (fleet), jq and ss (fleet, crypt), ip (CRIU's network dump).
for t in skopeo jq ss ip; do carry_tool "$t"; done
((RUNC_SHIM)) && install -m 0755 "$RIG/bin/containerd-shim-runc-v2" "$B/bin/"

install -m 0755 "$RUNC_SRC" "$B/bin/runc"
copy_libs "$RUNC_SRC" "$B/lib/runc"

install -m 0755 "$RIG/bin/criu" "$B/libexec/criu"
copy_libs "$RIG/bin/criu" "$B/lib/criu"
cat >"$B/bin/criu" <<'EOF'
#!/bin/sh
# gpusnap GPU test bundle: CRIU built on Debian 12, with its libraries from the bundle.
# runc execs `criu` from its PATH (criu swrk <fd>); exec keeps every descriptor.
d=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$d/lib/criu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/libexec/criu" "$@"
EOF
chmod 0755 "$B/bin/criu"


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------
install -m 0644 "$RIG/images/busybox.oci.tar" "$B/images/busybox.oci.tar"
install -m 0644 "$RIG/images/pause.oci.tar" "$B/images/pause.oci.tar"

# gpu-base: busybox's layer + lib/lib64 symlinks into usr, as a second layer.
blob() { # blob FILE LAYOUT -> "sha256:<hex> <size>"
    local f=$1 layout=$2 hex size
    hex=$(sha256sum "$f" | awk '{print $1}')
    size=$(stat -c %s "$f")
    mkdir -p "$layout/blobs/sha256"
    cp "$f" "$layout/blobs/sha256/$hex"
    echo "sha256:$hex $size"
}
W=$STAGE/img
mkdir -p "$W/src" "$W/layout" "$W/l2/usr/lib64" "$W/l2/usr/lib" "$W/l2/gpu" "$W/l2/nvidia"
tar -C "$W/src" -xf "$RIG/images/busybox.oci.tar"
src_manifest=$(jq -r '.manifests[0].digest' "$W/src/index.json" | sed 's/sha256://')
src_config=$(jq -r '.config.digest' "$W/src/blobs/sha256/$src_manifest" | sed 's/sha256://')
src_layer=$(jq -r '.layers[0].digest' "$W/src/blobs/sha256/$src_manifest" | sed 's/sha256://')
[[ $(jq -r '.layers | length' "$W/src/blobs/sha256/$src_manifest") == 1 ]] || die "busybox image: expected one layer"
ln -s usr/lib "$W/l2/lib"
ln -s usr/lib64 "$W/l2/lib64"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$W/l2" -cf "$W/layer2.tar" lib lib64 usr gpu nvidia
read -r l1dig l1size < <(blob "$W/src/blobs/sha256/$src_layer" "$W/layout")
read -r l2dig l2size < <(blob "$W/layer2.tar" "$W/layout")
jq --arg l2 "$l2dig" '
    .rootfs.diff_ids += [$l2]
  | .config.Env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
  | .history += [{created: "1970-01-01T00:00:00Z", created_by: "gpusnap tests/gpu/make-bundle.sh: lib, lib64 -> usr"}]
' "$W/src/blobs/sha256/$src_config" >"$W/config.json"
read -r cdig csize < <(blob "$W/config.json" "$W/layout")
jq -n --arg cdig "$cdig" --argjson csize "$csize" --arg l1 "$l1dig" --argjson l1s "$l1size" \
    --arg l2 "$l2dig" --argjson l2s "$l2size" '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cdig, size: $csize},
    layers: [
      {mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l1, size: $l1s},
      {mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l2, size: $l2s}
    ]}' >"$W/manifest.json"
read -r mdig msize < <(blob "$W/manifest.json" "$W/layout")
jq -n --arg mdig "$mdig" --argjson msize "$msize" --arg ref docker.io/gpusnap/gpu-base:test '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [{
      mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $mdig, size: $msize,
      platform: {architecture: "amd64", os: "linux"},
      annotations: {"org.opencontainers.image.ref.name": $ref, "io.containerd.image.name": $ref}
    }]}' >"$W/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$W/layout/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$W/layout" -cf "$B/images/gpu-base.oci.tar" oci-layout index.json blobs

# ---------------------------------------------------------------------------------------------
# VERSIONS, pack
# ---------------------------------------------------------------------------------------------
{
    echo "made: $(date -u +%FT%TZ) on $(hostname) ($(. /etc/os-release; echo "$PRETTY_NAME"))"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty working tree)')"
    echo "shim source: $SHIM_BIN (mtime $(date -u -r "$SHIM_BIN" +%FT%TZ))"
    echo "gpusnap-runc: $RUNC_WRAPPER_BIN (mtime $(date -u -r "$RUNC_WRAPPER_BIN" +%FT%TZ)); cli: $CLI_BIN"
    echo "cuda plugin: ${CUDA_PLUGIN_PATH:-none}; cuda-checkpoint: ${CUDA_CHECKPOINT_BIN:-none}; crictl: $( ((CRICTL)) && echo "$CRICTL_XZ" || echo none)"
    echo "containerd: $("$RIG/bin/containerd" --version)"
    echo "runc: $("$RUNC_SRC" --version | head -n1)"
    echo "criu: $("$RIG/bin/criu" --version | head -n1)"
    echo "ip: ${IP_SRC:-none}"
    echo
    (cd "$B" && find . -type f -o -type l | sort | while read -r f; do
        if [[ -f $f && ! -L $f ]]; then printf '%s  %s\n' "$(sha256sum "$f" | cut -c1-16)" "$f"; else printf '%-16s  %s -> %s\n' link "$f" "$(readlink "$f")"; fi
    done)
} >"$B/VERSIONS"

OUT=$OUTDIR/gpusnap-gpu.tar.xz
log "compressing (xz -$XZ_LEVEL) $(du -sh "$B" | cut -f1) -> $OUT"
tar -C "$STAGE" -cf - gpusnap-gpu | xz -T0 -"$XZ_LEVEL" >"$OUT.new"
mv -f "$OUT.new" "$OUT"
(cd "$OUTDIR" && sha256sum gpusnap-gpu.tar.xz >gpusnap-gpu.tar.xz.sha256)
size=$(stat -c %s "$OUT")
log "bundle: $OUT ($((size / 1024 / 1024)) MiB, $size bytes)"
((size < 56 * 1024 * 1024)) || die "bundle is $((size >> 20)) MiB: too close to the device tool's 64 MiB carry limit"
if [[ -n ${BASELINE_BIN_DIR:-} ]]; then
    write_baseline
elif [[ -f $OUTDIR/gpusnap-baseline.tar.xz ]]; then
    log "baseline: kept the existing $OUTDIR/gpusnap-baseline.tar.xz (commit $(tar -xJOf "$OUTDIR/gpusnap-baseline.tar.xz" gpusnap-baseline/COMMIT 2>/dev/null || echo '?')); delete it to carry less"
fi
check_carry_size
