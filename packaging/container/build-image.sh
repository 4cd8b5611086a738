#!/usr/bin/env bash
# packaging/container/build-image.sh — build the installer image with Podman, offline: FROM
# scratch with the three binaries, the shared libraries they link (from this machine, as ldd
# resolves them), their man pages and shell completions. No registry is contacted.
#
# Usage: build-image.sh [--tag IMAGE] [--bin-dir DIR] [--out-archive FILE]
#   --bin-dir DIR   take the binaries from DIR (e.g. target/debug) instead of building them
#                   (cargo build --release -p gpusnap-cli -p gpusnap-runc -p gpusnap-shim)
#                   ($GPUSNAP_IMAGE_BIN_DIR is its default)
#   --out-archive   also save the image as an OCI archive (for `podman load`, `ctr import`)
# The binaries are stripped in the image; the node gets these copies.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TAG=localhost/gpusnap/installer:latest
BIN=${GPUSNAP_IMAGE_BIN_DIR:-}
ARCHIVE=
while [[ $# -gt 0 ]]; do
    case $1 in
        --tag) TAG=$2; shift 2 ;;
        --bin-dir) BIN=$2; shift 2 ;;
        --out-archive) ARCHIVE=$2; shift 2 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
BINARIES=(gpusnap gpusnap-runc containerd-shim-gpusnap-v2)
if [[ -z $BIN ]]; then
    if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
        export PATH="${HOME:-/root}/.cargo/bin:$PATH"
    fi
    (cd "$ROOT" && cargo build --release -p gpusnap-cli -p gpusnap-runc -p gpusnap-shim)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
fi
for b in "${BINARIES[@]}"; do
    [[ -x $BIN/$b ]] || { echo "build-image.sh: $BIN/$b missing" >&2; exit 1; }
done
command -v podman >/dev/null || { echo "build-image.sh: needs podman (apt install podman)" >&2; exit 1; }

CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
R=$CTX/rootfs
install -d "$R/opt/gpusnap/bin" "$R/run/gpusnap-agent" "$R/tmp"
chmod 1777 "$R/tmp"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$BIN/$b" "$R/opt/gpusnap/bin/$b"
    strip --strip-unneeded "$R/opt/gpusnap/bin/$b"
    # Every shared library ldd resolves, at the same path (the dynamic loader included).
    ldd "$BIN/$b" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | while read -r lib; do
        [[ -e $R$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$R$lib"
    done
done
# Man pages and completions, generated from each binary's clap command.
bash "$ROOT/packaging/gen-docs.sh" "$R/opt/gpusnap/bin" "$R/usr/share"
cp "$ROOT/packaging/container/Containerfile" "$CTX/Containerfile"
podman build --pull=never --network=none --tag "$TAG" \
    --label org.opencontainers.image.version="$("$BIN/gpusnap" --version | awk '{print $2}')" \
    "$CTX" >&2
if [[ -n $ARCHIVE ]]; then
    rm -f "$ARCHIVE"
    podman save --format oci-archive -o "$ARCHIVE" "$TAG" >&2
fi
echo "$TAG"
