# shellcheck shell=bash disable=SC2034 # (variables set here are read by the scripts that source it)
# scripts/lib/bench-replicas.sh — what scripts/bench-fleet.sh and scripts/bench-crypt.sh share:
# replicas of a CUDA workload whose device memory is TOTAL_MIB split 5 : 2.5 : 0.5 (of 8)
#   weights   5/8    the same bytes in every replica (AES-128-CTR keystream of a fixed key),
#   KV cache  2.5/8  zeros,
#   state     0.5/8  random bytes, new for every checkpoint,
# run by the gpusnap shim and checkpointed through the front door (`ctr tasks checkpoint
# --image-path`), timed steps, a docker-registry per round, and the report's arithmetic.
#
# Source it after setting TOTAL_MIB, BENCH_NAME (the default work dir's and containerd
# namespace's name) and, optionally, REG_TLS=1 (registries serve HTTPS with a CA of their own;
# REG_CLI_ARGS then carries --ca-file, else --plain-http). Then call bench_setup, and
# bench_driver_start once the cleanup trap is in place.
#
# Driver: FLEET_DRIVER=double (default) runs the CUDA driver double (cuda/fake-libcuda, loaded by
# the shim through its real libloading path, CUDA 13.4, posix engine: the device memory lands in
# the checkpoint as gpusnap-gpu-* extents) on a private containerd with the rig's busybox.
# FLEET_DRIVER=gpu is the H200: tests/gpu/run-h200.sh's containerd, GPU container and workload
# (tests/gpu/workload/gpu_verify.cu --fleet holds the same three regions in device memory, the
# driver-managed engine puts them into CRIU's page images), handed over as a file of shell
# definitions in FLEET_GPU_HOOKS (ctr, fleet_gpu_start, fleet_gpu_step; see
# tests/gpu/scenario-fleet.sh).
#
# Environment: BENCH_DIR (default /var/tmp/gpusnap-bench-$BENCH_NAME.PID), BIN_DIR (gpusnap
# and containerd-shim-gpusnap-v2; default target/release, built first unless PREBUILT=1), RIG
# (containerd, ctr, criu; default /opt/gpusnap-rig), REGISTRY_BIN (default
# /usr/bin/docker-registry), KEEP=1 keeps BENCH_DIR.

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# bench_setup: region sizes, tools, binaries, the work directory and the result files.
bench_setup() {
    ROOT=$BENCH_ROOT
    WORK=${BENCH_DIR:-/var/tmp/gpusnap-bench-$BENCH_NAME.$$}
    RIG=${RIG:-${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}}
    DRIVER=${FLEET_DRIVER:-double}
    BIN_DIR=${BIN_DIR:-$ROOT/target/release}
    [[ $(id -u) -eq 0 ]] || { echo "run as root" >&2; exit 1; }
    ((TOTAL_MIB % 16 == 0)) || { echo "TOTAL_MIB must be a multiple of 16 (5:2.5:0.5 in MiB)" >&2; exit 1; }
    # The three regions, in MiB.
    W_MIB=$((TOTAL_MIB * 5 / 8))
    Z_MIB=$((TOTAL_MIB * 5 / 16))
    S_MIB=$((TOTAL_MIB / 16))
    WEIGHTS_KEY=000102030405060708090a0b0c0d0e0f # the "model": the same in every replica

    REGISTRY_BIN=${REGISTRY_BIN:-/usr/bin/docker-registry}
    [[ -x $REGISTRY_BIN ]] || { echo "no docker-registry at $REGISTRY_BIN (REGISTRY_BIN)" >&2; exit 1; }
    local tool
    for tool in jq tar curl ss openssl; do
        command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
    done

    if [[ $DRIVER == double && -z ${PREBUILT:-} ]]; then
        echo "== building (release)" >&2
        if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
            export PATH="${HOME:-/root}/.cargo/bin:$PATH"
        fi
        (cd "$ROOT" && cargo build --release -q -p gpusnap-cli -p gpusnap-shim \
            --bin gpusnap --bin containerd-shim-gpusnap-v2)
    fi
    GPUSNAP=$BIN_DIR/gpusnap
    [[ -x $GPUSNAP && -x $BIN_DIR/containerd-shim-gpusnap-v2 ]] || {
        echo "no gpusnap / containerd-shim-gpusnap-v2 in $BIN_DIR" >&2
        exit 1
    }
    export PATH="$BIN_DIR:$RIG/bin:$PATH"

    mkdir -p "$WORK"
    WORK=$(cd "$WORK" && pwd)
    LOG=$WORK/bench.log
    RESULTS=$WORK/results.txt # label seconds_before_sync seconds_until_synced
    BYTES=$WORK/bytes.txt     # label kind bytes
    STEP_OUT=$WORK/step.out
    : >"$RESULTS"
    : >"$BYTES"
    CTRD_PID="" REG_PID="" REG_DIR=""
}
now() { date +%s.%N; }
say() { echo "== $*" >&2; }

# --- a private containerd and the CUDA processes ----------------------------------------------
# bench_cleanup [REPLICA...]: for the EXIT trap: registry, replicas (H200), containerd, WORK.
bench_cleanup() {
    set +e
    stop_registry
    local id
    if [[ $DRIVER == gpu ]]; then for id in "$@"; do replica_stop "$id"; done; fi
    if [[ -n $CTRD_PID ]]; then
        for id in $(command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" t ls -q 2>/dev/null); do
            command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" t kill -s SIGKILL "$id" >/dev/null 2>&1
        done
        sleep 0.5
        for id in $(command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" c ls -q 2>/dev/null); do
            command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" t rm -f "$id" >/dev/null 2>&1
            command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" c rm "$id" >/dev/null 2>&1
        done
        kill "$CTRD_PID" 2>/dev/null
        wait "$CTRD_PID" 2>/dev/null
        umount -R "$WORK/containerd/root" 2>/dev/null
    fi
    if [[ "${KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
}

start_containerd() {
    mkdir -p "$WORK/containerd"
    cat >"$WORK/containerd/config.toml" <<TOML
version = 3
root = "$WORK/containerd/root"
state = "$WORK/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$WORK/containerd.sock"
[ttrpc]
  address = "$WORK/containerd.sock.ttrpc"
TOML
    containerd --config "$WORK/containerd/config.toml" >"$WORK/containerd/log" 2>&1 &
    CTRD_PID=$!
    for _ in $(seq 100); do [[ -S $WORK/containerd.sock ]] && return; sleep 0.1; done
    echo "containerd did not start:" >&2
    tail "$WORK/containerd/log" >&2
    exit 1
}

# fill_regions FILE STATE_SEED_HEX: writes the device memory image (weights, zeros, state).
fill_regions() {
    local f=$1 state_key=$2
    {
        keystream "$WEIGHTS_KEY" $((W_MIB << 20))
        head -c $((Z_MIB << 20)) /dev/zero
        state_bytes "$state_key"
    } >"$f"
}
state_bytes() { keystream "$1" $((S_MIB << 20)); }
# keystream KEY BYTES: AES-128-CTR of zeros (openssl ends on SIGPIPE: not a pipeline's status).
keystream() {
    head -c "$2" < <(openssl enc -aes-128-ctr -nosalt -K "$1" \
        -iv 00000000000000000000000000000000 -in /dev/zero 2>/dev/null)
}
rand_key() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

# bench_driver_start: the double's library, config and containerd, or the H200's hooks.
# SHIM_RESTORE_ROOT (double): the shim's restore.checkpoint_root (gpusnap.io/restore-from).
bench_driver_start() {
    if [[ $DRIVER == double ]]; then
        FAKE=$WORK/fake
        mkdir -p "$FAKE/procs" "$FAKE/vram"
        # The double, built from its source exactly as its crate's build script does.
        cc -O1 -shared -fPIC -fvisibility=hidden -Wl,-soname,libcuda.so.1 -o "$FAKE/libcuda.so.1" \
            "$ROOT/cuda/fake-libcuda/src/fake_libcuda.c" -lpthread -ldl
        echo 13040 >"$FAKE/driver_version" # CUDA 13.4: CustomStorage, the posix engine
        echo 3 >"$FAKE/unknown_pid_code"
        SHIM_CONFIG=$WORK/shim.toml
        SHIM_RESTORE_ROOT=$WORK/shim-checkpoints
        cat >"$SHIM_CONFIG" <<EOF
[cuda]
library = "$FAKE/libcuda.so.1"
lock_timeout_ms = 10000

[storage]
engine = "posix"

[restore]
checkpoint_root = "$SHIM_RESTORE_ROOT"
EOF
        ctr() { command ctr -a "$WORK/containerd.sock" -n "$BENCH_NAME" "$@"; }
        start_containerd
        ctr images import "$RIG/images/busybox.oci.tar" >/dev/null
        IMAGE=docker.io/gpusnap/busybox:test
    else
        # The H200: tests/gpu/run-h200.sh's containerd, GPU container and workload, handed over
        # as a file of shell definitions (ctr, fleet_gpu_start, fleet_gpu_step, ...).
        # shellcheck disable=SC1090
        source "${FLEET_GPU_HOOKS:?FLEET_DRIVER=gpu needs FLEET_GPU_HOOKS (tests/gpu/run-h200.sh)}"
    fi
}

# replica_start NAME: a container whose init is a CUDA process holding the three regions.
replica_start() {
    local id=$1
    case $DRIVER in
    double)
        echo running >"$FAKE/procs/id-$id-1"
        mkdir -p "$FAKE/vram/id-$id-1"
        fill_regions "$FAKE/vram/id-$id-1/0" "$(rand_key)"
        # shellcheck disable=SC2016 # the container's shell expands it
        ctr run -d --null-io --runtime io.containerd.gpusnap.v2 \
            --runtime-config-path "$SHIM_CONFIG" --env "GPUSNAP_FAKE_CUDA_ID=$id" \
            "$IMAGE" "$id" sh -c 'i=0; while :; do i=$((i+1)); echo $i >/tmp/count; sleep 0.2; done' \
            >/dev/null
        ;;
    gpu) fleet_gpu_start "$id" ;; # from the hooks
    esac
}
# replica_step NAME: the replica's state moves on (its weights and KV cache stay).
replica_step() {
    case $DRIVER in
    double)
        state_bytes "$(rand_key)" | dd of="$FAKE/vram/id-$1-1/0" bs=1M seek=$((W_MIB + Z_MIB)) \
            conv=notrunc status=none
        ;;
    gpu) fleet_gpu_step "$1" ;;
    esac
}
replica_stop() {
    ctr t kill -s SIGKILL "$1" >/dev/null 2>&1 || true
    for _ in $(seq 100); do
        [[ $(ctr t ls 2>/dev/null | awk -v id="$1" '$1==id{print $3}') == STOPPED ]] && break
        sleep 0.1
    done
    ctr t rm -f "$1" >/dev/null 2>&1 || true
    ctr c rm "$1" >/dev/null 2>&1 || true
    [[ $DRIVER == double ]] && rm -rf "$FAKE/vram/id-$1-1" "$FAKE/procs/id-$1-1"
    return 0
}
checkpoint() { ctr tasks checkpoint --image-path "$WORK/ckpt/$2" "$1"; } # REPLICA NAME

# --- timing and bytes -------------------------------------------------------------------------
# timed LABEL CMD...: runs CMD after a sync (its stdout to $STEP_OUT), then syncs; appends
# "LABEL cmd_s total_s" to RESULTS.
timed() {
    local label=$1
    shift
    sync
    local t0 t1 t2
    t0=$(now)
    if ! "$@" >"$STEP_OUT" 2>>"$LOG"; then
        echo "FAILED: $label: $*" >&2
        tail -20 "$LOG" "$STEP_OUT" >&2
        exit 1
    fi
    t1=$(now)
    sync -f "$WORK"
    t2=$(now)
    echo "$label $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') $(awk -v a="$t0" -v b="$t2" 'BEGIN{printf "%.3f", b-a}')" >>"$RESULTS"
    echo "   $label: $(tail -1 "$RESULTS" | cut -d' ' -f2-3) s" >&2
}
record() { echo "$1 $2 $3" >>"$BYTES"; } # LABEL KIND BYTES
one() { awk -v l="$1" -v k="$2" '$1==l && $2==k{print $3; exit}' "$BYTES"; }
dbytes() { du -sb "$1" 2>/dev/null | cut -f1 || echo 0; }

# --- OCI layouts ------------------------------------------------------------------------------
# layout_blobs LAYOUT: "digest size" of every distinct blob under the layout's top document
# (configs and layers of every manifest), one a line.
layout_blobs() {
    local l=$1 top
    top=$(jq -r '.manifests[0].digest' "$l/index.json" | cut -d: -f2)
    local manifests=("$top")
    if jq -e '.manifests' "$l/blobs/sha256/$top" >/dev/null 2>&1; then
        mapfile -t manifests < <(jq -r '.manifests[].digest' "$l/blobs/sha256/$top" | cut -d: -f2)
    fi
    for m in "${manifests[@]}"; do
        jq -r '(.config | "\(.digest) \(.size)"), (.layers[] | "\(.digest) \(.size)")' \
            "$l/blobs/sha256/$m"
    done | sort -u
}
layer_files() { # LAYOUT: layer blob paths in manifest order
    local l=$1 top m
    top=$(jq -r '.manifests[0].digest' "$l/index.json" | cut -d: -f2)
    if jq -e '.manifests' "$l/blobs/sha256/$top" >/dev/null 2>&1; then
        m=$(jq -r '.manifests[0].digest' "$l/blobs/sha256/$top" | cut -d: -f2)
    else
        m=$top
    fi
    jq -r '.layers[].digest' "$l/blobs/sha256/$m" | cut -d: -f2 | sed "s|^|$l/blobs/sha256/|"
}
# record_image LABEL LAYOUT: its distinct blobs' count and bytes into BYTES; prints them.
record_image() {
    local blobs sum=0 b
    mapfile -t blobs < <(layout_blobs "$2")
    for b in "${blobs[@]}"; do sum=$((sum + ${b#* })); done
    record "$1" bytes "$sum"
    record "$1" blobs "${#blobs[@]}"
    echo "   $1: ${#blobs[@]} blobs, $sum bytes" >&2
}
# verify_extracted DIR: every file of a pulled checkpoint re-hashed against its sealed manifest.
verify_extracted() {
    local status
    status=$("$GPUSNAP" inspect "$1" --json | jq -r .validation.status)
    [[ $status == complete ]] || { echo "pulled checkpoint $1: validation $status" >&2; exit 1; }
}

# --- registry ---------------------------------------------------------------------------------
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        if ! ss -Hltn "sport = :$p" | grep -q .; then echo "$p"; return; fi
    done
}
# registry_ca: with REG_TLS=1, a CA and a server certificate for 127.0.0.1 (once, in
# $WORK/tls), as tests/kit/src/registry.rs makes them; sets REG_CLI_ARGS, REG_SCHEME.
registry_ca() {
    if [[ ${REG_TLS:-0} != 1 ]]; then
        REG_CLI_ARGS=(--plain-http) REG_SCHEME=http
        return
    fi
    local d=$WORK/tls
    REG_CLI_ARGS=(--ca-file "$d/ca.crt") REG_SCHEME=https
    [[ -f $d/server.crt ]] && return
    mkdir -p "$d"
    (
        cd "$d" &&
            openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
                -out ca.crt -days 2 -subj "/CN=gpusnap bench CA" \
                -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
                -out server.csr -subj /CN=127.0.0.1 &&
            printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'basicConstraints=CA:FALSE' \
                'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >server.ext &&
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                -out server.crt -days 2 -extfile server.ext
    ) >>"$LOG" 2>&1 || { echo "making the registry's TLS certificate failed (see $LOG)" >&2; exit 1; }
}
stop_registry() {
    if [[ -n $REG_PID ]]; then
        kill "$REG_PID" 2>/dev/null || true
        wait "$REG_PID" 2>/dev/null || true
        REG_PID=""
        rm -rf "$REG_DIR"
    fi
}
start_registry() { # NAME: storage under $WORK/reg-NAME; sets PORT, REG_DIR, REG_BLOBS, REG_HOST
    registry_ca
    REG_DIR=$WORK/reg-$1
    rm -rf "$REG_DIR"
    mkdir -p "$REG_DIR/storage"
    PORT=$(free_port)
    REG_HOST=127.0.0.1:$PORT
    {
        cat <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REG_DIR/storage
http:
  addr: $REG_HOST
EOF
        if [[ $REG_SCHEME == https ]]; then
            printf '  tls:\n    certificate: %s\n    key: %s\n' "$WORK/tls/server.crt" "$WORK/tls/server.key"
        fi
    } >"$REG_DIR/config.yml"
    "$REGISTRY_BIN" serve "$REG_DIR/config.yml" >>"$REG_DIR/registry.log" 2>&1 &
    REG_PID=$!
    REG_BLOBS=$REG_DIR/storage
    local curl_ca=()
    [[ $REG_SCHEME == https ]] && curl_ca=(--cacert "$WORK/tls/ca.crt")
    for _ in $(seq 100); do
        if curl -fsS "${curl_ca[@]}" "$REG_SCHEME://$REG_HOST/v2/" >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    echo "registry did not start:" >&2
    cat "$REG_DIR/registry.log" >&2
    exit 1
}

# --- report -----------------------------------------------------------------------------------
median_of() { sort -n | awk '{v[NR]=$1} END{if(NR==0){print "nan"} else if(NR%2){print v[(NR+1)/2]} else {printf "%.3f", (v[NR/2]+v[NR/2+1])/2}}'; }
t_med() { awk -v l="$1" '$1==l{print $3}' "$RESULTS" | median_of; }                  # seconds until synced
b_med() { awk -v l="$1" -v k="$2" '$1==l && $2==k{print $3}' "$BYTES" | median_of; } # bytes
mib() { awk -v b="$1" 'BEGIN{if(b=="nan"||b==""){print "—"} else printf "%.1f MiB", b/1048576}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="nan"||b=="nan"||b==0||a==""||b==""){print "—"} else printf "%.2f×", a/b}'; }
# side_order ROUND SIDE...: the sides in order for odd rounds, reversed for even ones.
side_order() {
    local r=$1
    shift
    local s=("$@") i
    if ((r % 2)); then echo "${s[@]}"; else for ((i = ${#s[@]} - 1; i >= 0; i--)); do printf '%s ' "${s[i]}"; done; echo; fi
}
