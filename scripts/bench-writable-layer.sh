#!/usr/bin/env bash
# scripts/bench-writable-layer.sh — what `require` covering the writable layer costs, through
# `ctr` and the gpusnap shim (release build), on a container that wrote FILES files of 10 KiB
# into its writable layer (10000 files: 100 MiB).
#
# Rounds alternate two arms on one private containerd:
#   off      restore.signature_policy = off, no signing key: nothing is signed or compared at
#            restore (the seal still records the container, as every seal does);
#   require  checkpoint.signing_key set and restore.signature_policy = require: the seal signs,
#            the restore compares the spec and the writable layer with the signed record.
# Each round: run the container (it writes its files, then counts), `ctr containers checkpoint
# --task --rw`, remove it, `ctr containers restore --rw --live`, check the counter continued.
# Prints per-round wall times, the seal's `container-record` phase (from the manifest in the
# image), and the medians per arm. Printed, not asserted.
#
# Usage: scripts/bench-writable-layer.sh [ROUNDS=5] [FILES=10000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=${1:-5}
FILES=${2:-10000}
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
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/node.key" 2>/dev/null
openssl pkey -in "$WORK/node.key" -pubout -out "$WORK/node.pub" 2>/dev/null
chmod 600 "$WORK/node.key"
CONFIG=$WORK/gpusnap.toml
arm() {
    case $1 in
    off) printf '[restore]\nsignature_policy = "off"\n' >"$CONFIG" ;;
    require) printf '[restore]\nsignature_policy = "require"\nsignature_keys = ["%s"]\n\n[checkpoint]\nsigning_key = "%s"\n' \
        "$WORK/node.pub" "$WORK/node.key" >"$CONFIG" ;;
    esac
}
arm off
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
GPUSNAP_CONFIG=$CONFIG XDG_RUNTIME_DIR=$WORK containerd --config "$WORK/config.toml" >"$WORK/containerd.log" 2>&1 &
CPID=$!
trap 'kill $CPID 2>/dev/null; wait $CPID 2>/dev/null; umount -R "$WORK/root" 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do [[ -S $WORK/containerd.sock ]] && break; sleep 0.1; done
NS=bench-$$
ctr() { command ctr -a "$WORK/containerd.sock" -n "$NS" "$@"; }
ctr images import "$RIG/images/busybox.oci.tar" >/dev/null

now_ms() { date +%s%3N; }
EXEC_SEQ=0
count() { EXEC_SEQ=$((EXEC_SEQ + 1)); ctr t exec --exec-id "c$EXEC_SEQ" "$1" cat /tmp/count 2>/dev/null; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# The seal's container-record phase, from the manifest in the image's criu.tar.
record_ms() {
    local index criu
    index=$(ctr images ls | awk -v r="$1" '$1 == r {print $3}')
    criu=$(ctr content get "$index" | python3 -c 'import json,sys
for m in json.load(sys.stdin)["manifests"]:
    if m["mediaType"].endswith("criu.checkpoint.criu.tar"): print(m["digest"])')
    ctr content get "$criu" | tar -xO gpusnap-manifest.json | python3 -c 'import json,sys
print(next((t["ms"] for t in json.load(sys.stdin)["timings"] if t["name"] == "container-record"), "-"))'
}

# Builtins only (echo, test, arithmetic): no fork per file.
WORKLOAD="s=0123456789; for k in 1 2 3 4 5 6 7 8 9 10; do s=\$s\$s; done; mkdir -p /data; i=0; \
while [ \$i -lt $FILES ]; do echo \"\$i\$s\" > /data/f\$i; i=\$((i+1)); done; \
i=0; while true; do i=\$((i+1)); echo \$i > /tmp/count; sleep 0.05; done"

declare -A CK RS RC
for a in off require; do CK[$a]=""; RS[$a]=""; RC[$a]=""; done
printf '%-8s %5s %14s %12s %18s\n' arm round checkpoint_ms restore_ms container_record_ms
for round in $(seq "$ROUNDS"); do
    order="off require"
    (( round % 2 == 0 )) && order="require off"
    for a in $order; do
        arm "$a"
        id="wl-$a-$round"
        ref="localhost/bench/$id:ck"
        ctr run -d --runtime io.containerd.gpusnap.v2 $IMAGE "$id" sh -c "$WORKLOAD" >/dev/null
        for _ in $(seq 1200); do [[ -n $(count "$id") ]] && break; sleep 0.1; done
        t0=$(now_ms); ctr containers checkpoint --task --rw "$id" "$ref" >/dev/null; t1=$(now_ms)
        before=$(count "$id")
        ctr t kill -s SIGKILL "$id" >/dev/null 2>&1; sleep 0.3; ctr t rm "$id" >/dev/null 2>&1; ctr c rm "$id" >/dev/null
        t2=$(now_ms); ctr containers restore --rw --live "$id" "$ref" >/dev/null; t3=$(now_ms)
        after=$(count "$id")
        (( after >= before - 40 && after <= before + 40 )) || { echo "counter did not continue ($before -> $after) in arm $a" >&2; exit 1; }
        rec=$(record_ms "$ref")
        ctr t kill -s SIGKILL "$id" >/dev/null 2>&1; sleep 0.3; ctr t rm "$id" >/dev/null 2>&1; ctr c rm "$id" >/dev/null
        ctr images rm "$ref" >/dev/null
        CK[$a]+="$((t1 - t0)) "; RS[$a]+="$((t3 - t2)) "; RC[$a]+="$rec "
        printf '%-8s %5d %14d %12d %18s\n' "$a" "$round" $((t1 - t0)) $((t3 - t2)) "$rec"
    done
done
echo
printf '%-8s %21s %18s %25s\n' arm median_checkpoint_ms median_restore_ms median_container_record_ms
for a in off require; do
    printf '%-8s %21s %18s %25s\n' "$a" \
        "$(tr ' ' '\n' <<<"${CK[$a]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${RS[$a]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${RC[$a]}" | grep . | median)"
done
echo "writable layer: $FILES files of 10 KiB in /data, plus the counter; $ROUNDS rounds per arm"
