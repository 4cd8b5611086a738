#!/usr/bin/env bash
# scripts/bench-checkpoint.sh — checkpoint/restore timing, gpusnap vs containerd-shim-runc-v2,
# measured in the same run on the same private containerd, the same image and workload.
#
# Each round: run a container holding MEM_MB of anonymous memory plus a counter, checkpoint it
# with `ctr containers checkpoint --task` (what containerd users do: includes containerd storing
# the image in its content store), remove it, restore it with `ctr containers restore --live`,
# check the counter continued, clean up. Prints per-round times, medians and gpusnap/runc ratios.
#
# Usage: scripts/bench-checkpoint.sh [ROUNDS=5] [MEM_MB=128]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=${1:-5}
MEM_MB=${2:-128}
RIG=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
IMAGE=docker.io/gpusnap/busybox:test
[[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

cargo build -q --release -p gpusnap-shim 2>/dev/null
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export PATH="$TARGET/release:$RIG/bin:$PATH"

WORK=$(mktemp -d /tmp/gpusnap-bench.XXXXXX)
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
CPID=$!
trap 'kill $CPID 2>/dev/null; wait $CPID 2>/dev/null; umount -R "$WORK/root" 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do [[ -S $WORK/containerd.sock ]] && break; sleep 0.1; done
NS=bench-$$
ctr() { command ctr -a "$WORK/containerd.sock" -n "$NS" "$@"; }
ctr images import "$RIG/images/busybox.oci.tar" >/dev/null

now_ms() { date +%s%3N; }
EXEC_SEQ=0
# The container's counter, read through a fresh exec each time.
count() { EXEC_SEQ=$((EXEC_SEQ + 1)); ctr t exec --exec-id "c$EXEC_SEQ" "$1" cat /tmp/count 2>/dev/null; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# The workload: MEM_MB of random bytes kept in the shell's memory, and a counter file.
WORKLOAD="x=\$(head -c $((MEM_MB * 1024 * 1024 * 3 / 4)) /dev/urandom | base64); i=0; while true; do i=\$((i+1)); echo \$i > /tmp/count; sleep 0.05; done"

declare -A CK RS
for rt in io.containerd.runc.v2 io.containerd.gpusnap.v2; do CK[$rt]=""; RS[$rt]=""; done
printf '%-26s %5s %12s %12s\n' runtime round checkpoint_ms restore_ms
for round in $(seq "$ROUNDS"); do
    # Alternate the order so neither runtime always runs on a warmer cache.
    order="io.containerd.runc.v2 io.containerd.gpusnap.v2"
    (( round % 2 == 0 )) && order="io.containerd.gpusnap.v2 io.containerd.runc.v2"
    for rt in $order; do
        id="b-${rt##*.containerd.}-$round"; id=${id//./-}
        ref="localhost/bench/$id:ck"
        ctr run -d --runtime "$rt" $IMAGE "$id" sh -c "$WORKLOAD" >/dev/null
        for _ in $(seq 600); do [[ -n $(count "$id") ]] && break; sleep 0.1; done
        t0=$(now_ms); ctr containers checkpoint --task "$id" "$ref" >/dev/null; t1=$(now_ms)
        before=$(count "$id")
        ctr t kill -s SIGKILL "$id" >/dev/null; sleep 0.3; ctr t rm "$id" >/dev/null; ctr c rm "$id" >/dev/null
        t2=$(now_ms); ctr containers restore --live "$id" "$ref" >/dev/null; t3=$(now_ms)
        after=$(count "$id")
        (( after >= before - 40 && after <= before + 40 )) || { echo "counter did not continue ($before -> $after) with $rt" >&2; exit 1; }
        ctr t kill -s SIGKILL "$id" >/dev/null; sleep 0.3; ctr t rm "$id" >/dev/null; ctr c rm "$id" >/dev/null
        ctr images rm "$ref" >/dev/null
        CK[$rt]+="$((t1 - t0)) "; RS[$rt]+="$((t3 - t2)) "
        printf '%-26s %5d %12d %12d\n' "$rt" "$round" $((t1 - t0)) $((t3 - t2))
    done
done
echo
printf '%-26s %18s %16s\n' runtime median_checkpoint_ms median_restore_ms
for rt in io.containerd.runc.v2 io.containerd.gpusnap.v2; do
    printf '%-26s %18s %16s\n' "$rt" "$(tr ' ' '\n' <<<"${CK[$rt]}" | grep . | median)" "$(tr ' ' '\n' <<<"${RS[$rt]}" | grep . | median)"
done
ck_r=$(tr ' ' '\n' <<<"${CK[io.containerd.runc.v2]}" | grep . | median)
ck_g=$(tr ' ' '\n' <<<"${CK[io.containerd.gpusnap.v2]}" | grep . | median)
rs_r=$(tr ' ' '\n' <<<"${RS[io.containerd.runc.v2]}" | grep . | median)
rs_g=$(tr ' ' '\n' <<<"${RS[io.containerd.gpusnap.v2]}" | grep . | median)
echo
echo "ratio gpusnap/runc.v2: checkpoint $(awk -v a="$ck_g" -v b="$ck_r" 'BEGIN{printf "%.2f", a/b}')x, restore $(awk -v a="$rs_g" -v b="$rs_r" 'BEGIN{printf "%.2f", a/b}')x (target <= 1.10x), workload ${MEM_MB} MiB, ${ROUNDS} rounds"
