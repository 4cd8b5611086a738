#!/usr/bin/env bash
# scripts/bench-rootfs-diff.sh — a restore with a large rootfs diff through the real door:
# `gpusnap.io/restore-from` under containerd's CRI and the gpusnap shim (release build), one
# checkpoint with a FILES-file diff (`big`, the node's restore.max_rootfs_diff_entries raised
# for it) against the same checkpoint with a 10-file diff (`tiny`), against the big one refused
# under the default entry cap (`refused`), and against creating the same files with std::fs on
# the snapshotter's file system (`floor`). Warm-up first, then REPS rounds with the order of the arms rotating; prints each
# round, the shim's phase timings, the medians and the ratios (tests/examples/bench_rootfs_diff.rs
# says what each figure is). Printed, not asserted.
#
# Usage: scripts/bench-rootfs-diff.sh [REPS=4] [FILES=200000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

# The shim and gpusnap in release; the driver too (its arm `floor` creates files itself, and
# it shares the release build's dependencies).
cargo build -q --release -p gpusnap-shim -p gpusnap-cli
cargo build -q --release -p gpusnap-tests --example bench_rootfs_diff
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export GPUSNAP_SHIM_BIN=$TARGET/release/containerd-shim-gpusnap-v2
export GPUSNAP_CLI_BIN=$TARGET/release/gpusnap
exec "$TARGET/release/examples/bench_rootfs_diff" "$@"
