#!/usr/bin/env bash
# scripts/demo.sh — gpusnap's main job, end to end, on a private containerd it starts itself:
#   1. build containerd-shim-gpusnap-v2 and start containerd with the gpusnap runtime registered
#   2. run a counter container through gpusnap (runtime io.containerd.gpusnap.v2)
#   3. checkpoint it with `ctr containers checkpoint --task --rw`, kill and remove it
#   4. restore it with `ctr containers restore --live --rw` and show the counter carrying on
# Needs root (a user with sudo rights: it re-runs itself through sudo) and the environment from
# scripts/setup-env.sh. Leaves nothing running.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RIG=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
WORK=$(mktemp -d /tmp/gpusnap-demo.XXXXXX)
NS=gpusnap-demo
CTR_ID=counter
IMAGE=docker.io/gpusnap/busybox:test
CKPT=localhost/gpusnap-demo/counter:checkpoint

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
[[ $(id -u) -eq 0 ]] || { echo "demo: run as root (containers need it)" >&2; exit 1; }
[[ -x $RIG/bin/containerd && -x $RIG/bin/criu ]] || { echo "demo: run scripts/setup-env.sh first" >&2; exit 1; }

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building containerd-shim-gpusnap-v2"
cargo build -q -p gpusnap-shim
SHIM_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug
export PATH="$SHIM_DIR:$RIG/bin:$PATH"

cat >"$WORK/config.toml" <<TOML
version = 3
root = "$WORK/root"
state = "$WORK/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$WORK/containerd.sock"
[ttrpc]
  address = "$WORK/containerd.sock.ttrpc"
TOML

containerd --config "$WORK/config.toml" >"$WORK/containerd.log" 2>&1 &
CONTAINERD_PID=$!
cleanup() {
    ctr -a "$WORK/containerd.sock" -n $NS tasks kill -s SIGKILL $CTR_ID >/dev/null 2>&1 || true
    sleep 0.3
    ctr -a "$WORK/containerd.sock" -n $NS tasks rm -f $CTR_ID >/dev/null 2>&1 || true
    ctr -a "$WORK/containerd.sock" -n $NS containers rm $CTR_ID >/dev/null 2>&1 || true
    kill $CONTAINERD_PID 2>/dev/null || true
    wait $CONTAINERD_PID 2>/dev/null || true
    umount -R "$WORK/root" 2>/dev/null || true
    rm -rf "$WORK" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 50); do [[ -S $WORK/containerd.sock ]] && break; sleep 0.1; done
ctr() { command ctr -a "$WORK/containerd.sock" -n $NS "$@"; }

say "containerd $(containerd --version | awk '{print $3}') started privately in $WORK; gpusnap: $(containerd-shim-gpusnap-v2 -v | sed -n 2p | xargs)"
ctr images import "$RIG/images/busybox.oci.tar" >/dev/null

say "running a counter container through gpusnap"
ctr run -d --runtime io.containerd.gpusnap.v2 $IMAGE $CTR_ID \
    sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done'
sleep 1.5
ctr tasks ls
echo "counter now: $(ctr tasks exec --exec-id peek1 $CTR_ID cat /tmp/count)"

# --rw: the counter writes into its rootfs, so its writable layer goes with the checkpoint. A
# dump that catches the shell inside its write records /tmp/count as open, and CRIU can only
# reopen it where the restored rootfs has it.
say "checkpointing (ctr containers checkpoint --task --rw)"
t0=$(date +%s%N)
ctr containers checkpoint --task --rw $CTR_ID $CKPT
t1=$(date +%s%N)
AT=$(ctr tasks exec --exec-id peek2 $CTR_ID cat /tmp/count)
echo "checkpoint image $CKPT written in $(( (t1 - t0) / 1000000 )) ms; counter was about $AT"

say "killing and removing the original container"
ctr tasks kill -s SIGKILL $CTR_ID
sleep 0.5
ctr tasks rm $CTR_ID
ctr containers rm $CTR_ID
ctr tasks ls

say "restoring (ctr containers restore --live --rw)"
t0=$(date +%s%N)
ctr containers restore --live --rw $CTR_ID $CKPT
t1=$(date +%s%N)
FIRST=$(ctr tasks exec --exec-id peek3 $CTR_ID cat /tmp/count)
echo "restored in $(( (t1 - t0) / 1000000 )) ms; counter right after restore: $FIRST"
sleep 1
LATER=$(ctr tasks exec --exec-id peek4 $CTR_ID cat /tmp/count)
ctr tasks ls
echo "counter one second later: $LATER"
if (( FIRST >= AT && FIRST < AT + 20 && LATER > FIRST )); then
    say "OK: the restored container continued from its checkpointed count ($AT -> $FIRST -> $LATER)"
else
    say "FAILED: counter did not continue (checkpoint $AT, restored $FIRST, later $LATER)"
    exit 1
fi
