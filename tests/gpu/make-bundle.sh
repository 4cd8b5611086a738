#!/usr/bin/env bash
# tests/gpu/make-bundle.sh — runs HERE (the Debian 12 dev box set up by scripts/setup-env.sh).
#
# Packs everything tests/gpu/run-h200.sh needs on the H200 device machine (Ubuntu 24.04, no
# network, no cargo) into .bundle/gpusnap-gpu.tar.xz, which the device tool carries with
# `carry: [".bundle"]`:
#
#   bin/containerd-shim-gpusnap-v2   gpusnap shim, release build, stripped
#   bin/gpusnap                      gpusnap CLI (shim/cli), when it builds / exists
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
#   tools/ip (+ libexec/ip, lib/ip)  iproute2's ip, used by CRIU to dump/restore a network
#                                    namespace's routes; only used if the device has no `ip`
#   images/busybox.oci.tar           docker.io/gpusnap/busybox:test (CPU smoke)
#   images/gpu-base.oci.tar          docker.io/gpusnap/gpu-base:test: the busybox rootfs plus
#                                    lib -> usr/lib and lib64 -> usr/lib64, so that binding the
#                                    host's /usr read-only over /usr gives the nvcc-built
#                                    workload its glibc/libstdc++ (see README.md)
#   VERSIONS                         what went in, with sha256s
#
# Usage: tests/gpu/make-bundle.sh [--no-build] [--no-runc-shim] [--xz-level N]
#   --no-build       do not run cargo; use the binaries already built (target dir from
#                    `cargo metadata`, or SHIM_BIN / CLI_BIN from the environment)
#   --no-runc-shim   leave containerd-shim-runc-v2 out (saves ~4 MB compressed)
# Environment: GPUSNAP_RIG_PREFIX (default /opt/gpusnap-rig), SHIM_BIN, CLI_BIN.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD

RIG=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
BUILD=1
RUNC_SHIM=1
XZ_LEVEL=9
while (($#)); do
    case $1 in
    --no-build) BUILD=0 ;;
    --no-runc-shim) RUNC_SHIM=0 ;;
    --xz-level) XZ_LEVEL=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; exit 0 ;;
    *) echo "make-bundle: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '[make-bundle] %s\n' "$*"; }
die() { printf '[make-bundle] ERROR: %s\n' "$*" >&2; exit 1; }

for t in jq xz strip sha256sum tar ldd; do command -v $t >/dev/null || die "$t not found"; done
[[ -x $RIG/bin/containerd && -x $RIG/bin/criu ]] || die "$RIG not set up: run scripts/setup-env.sh"
RUNC_SRC=$(command -v runc || true)
[[ -n $RUNC_SRC ]] || die "runc not found on PATH"

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

# ---------------------------------------------------------------------------------------------
# gpusnap binaries
# ---------------------------------------------------------------------------------------------
TARGET=${CARGO_TARGET_DIR:-}
if [[ -z $TARGET ]] && command -v cargo >/dev/null; then
    TARGET=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || true)
fi
TARGET=${TARGET:-$ROOT/target}
if ((BUILD)) && [[ -z ${SHIM_BIN:-} ]]; then
    log "cargo build --release -p gpusnap-shim"
    cargo build --release -p gpusnap-shim
fi
SHIM_BIN=${SHIM_BIN:-$TARGET/release/containerd-shim-gpusnap-v2}
[[ -x $SHIM_BIN ]] || die "no shim at $SHIM_BIN (build it, or set SHIM_BIN)"
if ((BUILD)) && [[ -z ${CLI_BIN:-} ]]; then
    log "cargo build --release -p gpusnap-cli --bin gpusnap (optional)"
    cargo build --release -p gpusnap-cli --bin gpusnap 2>&1 | tail -n 3 ||
        log "warning: the gpusnap CLI did not build; bundling without it"
fi
CLI_BIN=${CLI_BIN:-$TARGET/release/gpusnap}

# ---------------------------------------------------------------------------------------------
# Stage
# ---------------------------------------------------------------------------------------------
OUTDIR=$ROOT/.bundle
mkdir -p "$OUTDIR"
grep -qxF '/.bundle/' "$ROOT/.git/info/exclude" 2>/dev/null || grep -qxF '/.bundle' "$ROOT/.git/info/exclude" 2>/dev/null ||
    echo '/.bundle/' >>"$ROOT/.git/info/exclude"
STAGE=$(mktemp -d /tmp/gpusnap-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/gpusnap-gpu
mkdir -p "$B"/{bin,libexec,lib/criu,lib/runc,lib/ip,tools,images}

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
if [[ -x $CLI_BIN ]]; then
    strip -o "$B/bin/gpusnap" "$CLI_BIN"
    log "gpusnap CLI: $CLI_BIN"
else
    log "gpusnap CLI: not found at $CLI_BIN (optional; skipped)"
fi
for b in containerd ctr; do install -m 0755 "$RIG/bin/$b" "$B/bin/$b"; done
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

IP_SRC=$(command -v ip || true)
if [[ -n $IP_SRC ]]; then
    install -m 0755 "$IP_SRC" "$B/libexec/ip"
    copy_libs "$IP_SRC" "$B/lib/ip"
    cat >"$B/tools/ip" <<'EOF'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$d/lib/ip" exec "$d/libexec/ip" "$@"
EOF
    chmod 0755 "$B/tools/ip"
fi

# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------
install -m 0644 "$RIG/images/busybox.oci.tar" "$B/images/busybox.oci.tar"

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
