#!/usr/bin/env bash
# scripts/test.sh — build the whole workspace and run every test.
#
# The integration tests in tests/ (package gpusnap-tests) drive a real containerd:
# they need root and the environment from scripts/setup-env.sh. They locate the
# gpusnap shim next to the test binaries (<target-dir>/debug/containerd-shim-gpusnap-v2),
# which the build step below produces; set GPUSNAP_SHIM_BIN to test another binary.
#
# Extra arguments are passed to `cargo test` (e.g. a test-name filter: `scripts/test.sh runc_v2`).
#
# Time limits (seconds; a run past one fails with a TIMEOUT line naming it):
#   GPUSNAP_TEST_BINARY_TIMEOUT  one test binary (default 900; scripts/test-timeout.sh)
#   GPUSNAP_TEST_TIMEOUT         the whole `cargo test` run (default 1800)
#   GPUSNAP_CRITEST_TIMEOUT      one critest run, per handler (default 420; critest-parity.sh)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
if [[ -n ${CI:-} ]]; then
    # A one-shot build gains nothing from incremental state, which would add a gigabyte.
    export CARGO_TERM_COLOR=never CARGO_TERM_PROGRESS_WHEN=never CARGO_INCREMENTAL=0
fi
# The build takes about 3 GB and the tests' containers, checkpoints and registries a few more;
# a disk that fills mid-run fails far from its cause, so say how much there is up front.
free_gib() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
TARGET_DIR=${CARGO_TARGET_DIR:-target}
mkdir -p "$TARGET_DIR"
for d in "$TARGET_DIR" "${TMPDIR:-/tmp}"; do
    free=$(free_gib "$d")
    printf '==> free space: %s GiB on %s\n' "$free" "$d"
    if ((${free:-0} < ${GPUSNAP_TEST_MIN_FREE_GIB:-8})); then
        echo "warning: less than ${GPUSNAP_TEST_MIN_FREE_GIB:-8} GiB free on $d: the build and tests may fail with ENOSPC; free some space or set CARGO_TARGET_DIR/TMPDIR elsewhere" >&2
    fi
done
T0=$SECONDS
step() { printf '\n==> %s  [t+%ds]\n' "$*" "$((SECONDS - T0))"; }
# The total, also when a step fails.
trap 'rc=$?; ((rc == 0)) || df -h "$TARGET_DIR" "${TMPDIR:-/tmp}"; printf "\n==> scripts/test.sh: %s after %dm%02ds (exit %d)\n" "$([[ $rc -eq 0 ]] && echo passed || echo FAILED)" "$(((SECONDS - T0) / 60))" "$(((SECONDS - T0) % 60))" "$rc"' EXIT

step "cargo build --workspace --all-targets"
cargo build --workspace --all-targets

step "packaging/check.sh (render and schema-check the Kubernetes manifests, build and inspect the .deb)"
# Package the binaries the workspace build just made: a package-scoped `cargo build -p` here
# would relink target/debug's binaries with that package set's features, without the
# failpoints the fault tests (tests/tests/faults.rs) stop the shim and gpusnap-runc at.
DEB_NO_BUILD=1 bash packaging/check.sh

step "installer image: build (docs/install.md's command, offline) and run it under Podman (packaging/test/test-image.sh)"
# About a minute: the image is FROM scratch with target/debug's binaries; the Podman test plays
# the chart's DaemonSet on fake containerd, k3s and RKE2 nodes (install, ready, SIGTERM back to
# the byte, upgrade, uninstall).
TOOLS=${GPUSNAP_TOOLS_DIR:-/var/cache/gpusnap-packaging-tools}
IMAGE=$(python3 packaging/test/doc-blocks.py docs/install.md image | sed -n 's/.*--tag \([^ ]*\).*/\1/p')
python3 packaging/test/doc-blocks.py docs/install.md image |
    GPUSNAP_IMAGE_BIN_DIR=$TARGET_DIR/debug bash -euo pipefail
PY=$TOOLS/venv/bin/python GPUSNAP_CLI_BIN=$TARGET_DIR/debug/gpusnap \
    bash packaging/test/test-image.sh "$IMAGE" "$TOOLS/helm-v4.2.3/helm"

step "deb: lintian, then docs/install.md's .deb commands as written (packaging/deb/test-deb.sh)"
# About a minute (lintian half of it): install, man page, gpusnap install, doctor, upgrade,
# uninstall, remove, purge.
DEB_PROFILE=debug DEB_NO_BUILD=1 bash packaging/deb/test-deb.sh

step "cargo test --workspace --no-fail-fast $*"
# Every test binary runs under scripts/test-timeout.sh (cargo's target runner): at most
# GPUSNAP_TEST_BINARY_TIMEOUT each, and none past GPUSNAP_TEST_TIMEOUT from here.
HOST_TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
RUNNER_VAR=CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$HOST_TRIPLE")_RUNNER
export "$RUNNER_VAR=$PWD/scripts/test-timeout.sh"
export GPUSNAP_TEST_DEADLINE=$(($(date +%s) + ${GPUSNAP_TEST_TIMEOUT:-1800}))
cargo test --workspace --no-fail-fast "$@"
unset "$RUNNER_VAR" GPUSNAP_TEST_DEADLINE

# critest with the runc.v2 handler and with gpusnap, same seed: fails when a test passes with
# runc and not with gpusnap (tests/critest/allow-list.txt). About 3 minutes; skipped when a
# test filter was given, unless GPUSNAP_CRITEST=1.
if [[ $# -eq 0 || ${GPUSNAP_CRITEST:-0} == 1 ]]; then
    step "scripts/critest-parity.sh (critest: runc.v2 vs gpusnap)"
    bash scripts/critest-parity.sh
fi

step "done"
