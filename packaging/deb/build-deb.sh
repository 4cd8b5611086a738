#!/usr/bin/env bash
# packaging/deb/build-deb.sh — build gpusnap_<version>_<arch>.deb with dpkg-deb.
#
#   /usr/bin/gpusnap, /usr/bin/gpusnap-runc, /usr/bin/containerd-shim-gpusnap-v2
#   /etc/gpusnap/config.toml   every setting at its default (a conffile: upgrades keep edits)
#   postinst                   tells the operator to run `gpusnap install`
#
# Usage: build-deb.sh [--profile release|debug] [--out DIR] [--no-build]
#   --no-build uses binaries already in $CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROFILE=release
OUT=$ROOT/target-deb
BUILD=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --profile) PROFILE=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case $PROFILE in
    release) PROFILE_DIR=release; PROFILE_FLAG=--release ;;
    debug) PROFILE_DIR=debug; PROFILE_FLAG= ;;
    *) echo "build-deb.sh: --profile must be release or debug" >&2; exit 2 ;;
esac
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/$PROFILE_DIR
if [[ $BUILD == 1 ]]; then
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build $PROFILE_FLAG -p gpusnap-cli -p gpusnap-shim)
fi
for b in gpusnap gpusnap-runc containerd-shim-gpusnap-v2; do
    [[ -x $BIN/$b ]] || { echo "build-deb.sh: $BIN/$b missing (build it or drop --no-build)" >&2; exit 1; }
done

VERSION=$("$BIN/gpusnap" --version | awk '{print $2}')
ARCH=$(dpkg --print-architecture)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
PKG=$STAGE/gpusnap

install -d -m 0755 "$PKG/DEBIAN" "$PKG/usr/bin" "$PKG/etc/gpusnap" "$PKG/usr/share/doc/gpusnap"
for b in gpusnap gpusnap-runc containerd-shim-gpusnap-v2; do
    install -m 0755 "$BIN/$b" "$PKG/usr/bin/$b"
    # Debug info stays in the build tree; the package ships symbols only.
    if command -v strip >/dev/null 2>&1; then strip --strip-debug "$PKG/usr/bin/$b"; fi
done
# The defaults come from the binary itself, so the packaged file always matches the release.
"$BIN/gpusnap" config default >"$PKG/etc/gpusnap/config.toml"
chmod 0644 "$PKG/etc/gpusnap/config.toml"
"$BIN/gpusnap" --config "$PKG/etc/gpusnap/config.toml" config check >/dev/null
install -m 0644 "$ROOT/docs/install.md" "$PKG/usr/share/doc/gpusnap/install.md"
echo /etc/gpusnap/config.toml >"$PKG/DEBIAN/conffiles"

INSTALLED_KB=$(du -sk --exclude=DEBIAN "$PKG" | awk '{print $1}')
cat >"$PKG/DEBIAN/control" <<CONTROL
Package: gpusnap
Version: $VERSION
Architecture: $ARCH
Maintainer: gpusnap developers <gpusnap@example.com>
Installed-Size: $INSTALLED_KB
Depends: runc
Recommends: criu (>= 3.16)
Suggests: containerd (>= 2.0) | cri-o
Section: admin
Priority: optional
Homepage: https://example.com/gpusnap
Description: GPU-aware checkpoint/restore for containers
 containerd-shim-gpusnap-v2 (containerd runtime io.containerd.gpusnap.v2) and
 gpusnap-runc (a runc wrapper for CRI-O and Podman) checkpoint and restore
 containers, GPU state included, through CRIU and the CUDA checkpoint API.
 "gpusnap install" registers the runtime; "gpusnap doctor" checks the node.
CONTROL

cat >"$PKG/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = "configure" ]; then
    echo "gpusnap: run 'gpusnap install' to register the gpusnap runtime with containerd/CRI-O,"
    echo "gpusnap: then 'gpusnap doctor' to check this node."
fi
exit 0
POSTINST
cat >"$PKG/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = "remove" ] && [ -e /var/lib/gpusnap/install-state.json ]; then
    echo "gpusnap: the runtime is still registered; run 'gpusnap uninstall' (before removing the"
    echo "gpusnap: package) to restore the container runtime configuration."
fi
exit 0
PRERM
chmod 0755 "$PKG/DEBIAN/postinst" "$PKG/DEBIAN/prerm"

mkdir -p "$OUT"
DEB=$OUT/gpusnap_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group --build "$PKG" "$DEB" >/dev/null
echo "$DEB"
