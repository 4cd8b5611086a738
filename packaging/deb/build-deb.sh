#!/usr/bin/env bash
# packaging/deb/build-deb.sh — build gpusnap_<version>_<arch>.deb with dpkg-deb.
#
#   /usr/bin/gpusnap, /usr/bin/gpusnap-runc, /usr/bin/containerd-shim-gpusnap-v2 (stripped)
#   /etc/gpusnap/config.toml   every setting at its default (a conffile: upgrades keep edits)
#   /usr/share/man/man1/       a page per binary and per gpusnap subcommand (from clap)
#   bash, zsh and fish completions (from clap)
#   /usr/share/doc/gpusnap/    copyright (machine-readable), changelog.gz, install.md
#   postinst / prerm / postrm  point at `gpusnap install` / `gpusnap uninstall`
# Depends: what dpkg-shlibdeps derives from the binaries, and runc. `lintian` reports no error
# on the result (packaging/deb/test-deb.sh).
#
# Usage: build-deb.sh [--profile release|debug] [--out DIR] [--no-build]
#   --no-build uses binaries already in $CARGO_TARGET_DIR (default <repo>/target).
# Environment: DEB_MAINTAINER ("Name <address>", the package's Maintainer field); defaults of
# the options: DEB_PROFILE, DEB_OUT, DEB_NO_BUILD=1; DEB_VERSION (default: gpusnap --version).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROFILE=${DEB_PROFILE:-release}
OUT=${DEB_OUT:-$ROOT/target-deb}
BUILD=1
[[ ${DEB_NO_BUILD:-0} != 1 ]] || BUILD=0
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
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build $PROFILE_FLAG -p gpusnap-cli -p gpusnap-runc -p gpusnap-shim)
fi
for b in gpusnap gpusnap-runc containerd-shim-gpusnap-v2; do
    [[ -x $BIN/$b ]] || { echo "build-deb.sh: $BIN/$b missing (build it or drop --no-build)" >&2; exit 1; }
done

VERSION=${DEB_VERSION:-$("$BIN/gpusnap" --version | awk '{print $2}')}
ARCH=$(dpkg --print-architecture)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
PKG=$STAGE/gpusnap

MAINTAINER=${DEB_MAINTAINER:-gpusnap maintainers <maintainers@gpusnap.dev>}
umask 022
install -d -m 0755 "$PKG/DEBIAN" "$PKG/usr/bin" "$PKG/etc/gpusnap" "$PKG/usr/share/doc/gpusnap"
for b in gpusnap gpusnap-runc containerd-shim-gpusnap-v2; do
    install -m 0755 "$BIN/$b" "$PKG/usr/bin/$b"
    # As dh_strip does: debug info and symbols stay in the build tree.
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$PKG/usr/bin/$b"
done
# Man pages and completions, generated from each binary's clap command.
bash "$ROOT/packaging/gen-docs.sh" "$PKG/usr/bin" "$PKG/usr/share"
# The defaults come from the binary itself, so the packaged file always matches the release.
"$BIN/gpusnap" config default >"$PKG/etc/gpusnap/config.toml"
chmod 0644 "$PKG/etc/gpusnap/config.toml"
"$BIN/gpusnap" --config "$PKG/etc/gpusnap/config.toml" config check >/dev/null
install -m 0644 "$ROOT/docs/install.md" "$PKG/usr/share/doc/gpusnap/install.md"
install -m 0644 "$ROOT/packaging/deb/copyright" "$PKG/usr/share/doc/gpusnap/copyright"
# A native package's changelog (Debian format), dated by the last commit for reproducibility.
DATE=$(git -C "$ROOT" log -1 --format=%cD 2>/dev/null || date -R)
printf 'gpusnap (%s) unstable; urgency=medium\n\n  * Release %s: see docs/install.md.\n\n -- %s  %s\n' \
    "$VERSION" "$VERSION" "$MAINTAINER" "$DATE" | gzip -9n >"$PKG/usr/share/doc/gpusnap/changelog.gz"
chmod 0644 "$PKG/usr/share/doc/gpusnap/changelog.gz"
echo /etc/gpusnap/config.toml >"$PKG/DEBIAN/conffiles"

# Depends from the binaries' shared libraries, as dh_shlibdeps does (dpkg-shlibdeps reads a
# debian/control naming the package).
mkdir -p "$STAGE/src/debian"
printf 'Source: gpusnap\n\nPackage: gpusnap\nArchitecture: any\n' >"$STAGE/src/debian/control"
SHLIBS=$(cd "$STAGE/src" && dpkg-shlibdeps -O "$PKG/usr/bin/gpusnap" "$PKG/usr/bin/gpusnap-runc" \
    "$PKG/usr/bin/containerd-shim-gpusnap-v2" | sed -n 's/^shlibs:Depends=//p')
[[ -n $SHLIBS ]] || { echo "build-deb.sh: dpkg-shlibdeps derived no dependencies" >&2; exit 1; }

INSTALLED_KB=$(du -sk --exclude=DEBIAN "$PKG" | awk '{print $1}')
cat >"$PKG/DEBIAN/control" <<CONTROL
Package: gpusnap
Version: $VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $INSTALLED_KB
Depends: $SHLIBS, runc
Recommends: criu (>= 4.1)
Suggests: containerd (>= 2.0) | cri-o
Section: admin
Priority: optional
Description: GPU-aware checkpoint/restore for containers
 containerd-shim-gpusnap-v2 (containerd runtime io.containerd.gpusnap.v2) and
 gpusnap-runc (a runc wrapper for CRI-O and Podman) checkpoint and restore
 containers, GPU state included, through CRIU and the CUDA checkpoint API.
 "gpusnap install" registers the runtime; "gpusnap doctor" checks the node.
 .
 GPU checkpoints need CRIU 4.1 or newer: Debian 12 ships 3.17, which is
 enough for CPU containers on older kernels only; install a newer CRIU and
 set criu.binary_dir in /etc/gpusnap/config.toml.
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
cat >"$PKG/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
# What `gpusnap install` changed is recorded in /var/lib/gpusnap/install-state.json: purging
# keeps it while it names files to restore (`gpusnap uninstall` needs it; reinstall the
# package to run it), and removes the directory when nothing is left in it.
if [ "$1" = "purge" ]; then
    if [ -e /var/lib/gpusnap/install-state.json ]; then
        echo "gpusnap: /var/lib/gpusnap/install-state.json kept: the runtime registration it records is still in place"
    else
        rmdir /var/lib/gpusnap 2>/dev/null || true
    fi
fi
exit 0
POSTRM
chmod 0755 "$PKG/DEBIAN/postinst" "$PKG/DEBIAN/prerm" "$PKG/DEBIAN/postrm"
(cd "$PKG" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$PKG/DEBIAN/md5sums" "$PKG/DEBIAN/control" "$PKG/DEBIAN/conffiles"

mkdir -p "$OUT"
DEB=$OUT/gpusnap_${VERSION}_${ARCH}.deb
# xz as Debian's archive uses it for a release; a debug package (CI's) compresses fast.
if [[ $PROFILE == release ]]; then COMPRESS=(-Zxz); else COMPRESS=(-Zgzip -z1); fi
dpkg-deb --root-owner-group "${COMPRESS[@]}" --build "$PKG" "$DEB" >/dev/null
echo "$DEB"
