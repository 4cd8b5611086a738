#!/usr/bin/env bash
# scripts/test.sh — build the whole workspace and run every test.
#
# The integration tests in tests/ (package gpusnap-tests) drive a real containerd:
# they need root and the environment from scripts/setup-env.sh. They locate the
# gpusnap shim next to the test binaries (<target-dir>/debug/containerd-shim-gpusnap-v2),
# which the build step below produces; set GPUSNAP_SHIM_BIN to test another binary.
#
# Extra arguments are passed to `cargo test` (e.g. a test-name filter: `scripts/test.sh runc_v2`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
if [[ -n ${CI:-} ]]; then
    export CARGO_TERM_COLOR=never CARGO_TERM_PROGRESS_WHEN=never
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "warning: not root; the containerd integration tests (gpusnap-tests) will fail" >&2
fi

T0=$SECONDS
step() { printf '\n==> %s  [t+%ds]\n' "$*" "$((SECONDS - T0))"; }

step "cargo build --workspace --all-targets"
cargo build --workspace --all-targets

step "packaging/check.sh (render and schema-check the Kubernetes manifests, build and inspect the .deb)"
bash packaging/check.sh

step "cargo test --workspace --no-fail-fast $*"
cargo test --workspace --no-fail-fast "$@"

# critest with the runc.v2 handler and with gpusnap, same seed: fails when a test passes with
# runc and not with gpusnap (tests/critest/allow-list.txt). About 3 minutes; skipped when a
# test filter was given, unless GPUSNAP_CRITEST=1.
if [[ $# -eq 0 || ${GPUSNAP_CRITEST:-0} == 1 ]]; then
    step "scripts/critest-parity.sh (critest: runc.v2 vs gpusnap)"
    bash scripts/critest-parity.sh
fi

step "done"
