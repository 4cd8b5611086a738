#!/usr/bin/env bash
# Image transport benchmark (issue 13 item 5): `gpusnap image push` and `gpusnap image pull
# --extract` of a multi-GiB checkpoint image against Debian's docker-registry on this machine,
# beside `skopeo copy` of the same OCI layout, in one run: warm-up first, then ROUNDS rounds
# alternating which side goes first. Prints a table of seconds, MB/s and ratios.
#
#   scripts/bench-transport.sh [SIZE_MIB (default 2048)] [ROUNDS (default 3)]
#
# Needs about 5 × SIZE_MIB of free disk in BENCH_DIR's file system (layout, registry storage,
# skopeo's layout and its untarred copy).
#
# Environment: BENCH_DIR (default /var/tmp/gpusnap-bench-transport.PID; the registry storage,
# the image, and every pull destination live there, so all on one disk), GPUSNAP (default
# target/release/gpusnap, built first unless GPUSNAP_PREBUILT=1), KEEP=1 keeps BENCH_DIR.
#
# Method. The checkpoint (oci-image/examples/bench-checkpoint.rs) is shaped like a real one:
# small CRIU images, 4 pages-*.img and 3 GPU extents, incompressible. It is built once into an
# OCI layout with `gpusnap image build`. Every timed step starts after a `sync` and ends with
# `sync -f` on the bench file system, so each time is "until the bytes are on disk" (the time
# before that sync is printed too). Each push goes to a freshly started registry with empty
# storage on a new port (nothing to skip, no cross-repository mount for skopeo's blob cache to
# find). skopeo runs with --all --preserve-digests (the same index, manifest and uncompressed
# layers; without it skopeo would gzip every layer) and, pulling into an OCI layout,
# --dest-oci-accept-uncompressed-layers. skopeo's pull is followed by untarring its layers
# (`tar -xf`, in manifest order) to compare with gpusnap's pull --extract. "plain write" is
# `cat` of the same layer bytes (from the page cache) into one file on the same disk.
set -euo pipefail

SIZE_MIB=${1:-2048}
ROUNDS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${BENCH_DIR:-/var/tmp/gpusnap-bench-transport.$$}
GPUSNAP=${GPUSNAP:-$ROOT/target/release/gpusnap}
REGISTRY_BIN=/usr/bin/docker-registry
REPO=bench/ckpt:v1

for tool in "$REGISTRY_BIN" skopeo jq tar; do
    command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/setup-env.sh" >&2; exit 1; }
done

echo "== building (release)" >&2
# One invocation for both, so the example shares the CLI's build (features unified alike).
if [[ -z "${GPUSNAP_PREBUILT:-}" ]]; then
    (cd "$ROOT" && cargo build --release -q -p gpusnap-cli -p gpusnap-oci-image \
        --bin gpusnap --example bench-checkpoint)
else
    (cd "$ROOT" && cargo build --release -q -p gpusnap-oci-image --example bench-checkpoint)
fi
GEN=$ROOT/target/release/examples/bench-checkpoint

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG=$WORK/bench.log
RESULTS=$WORK/results.txt
: >"$RESULTS"
REG_PID=""
cleanup() {
    stop_registry
    if [[ "${KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        if ! ss -Hltn "sport = :$p" | grep -q .; then echo "$p"; return; fi
    done
}

# start_registry NAME: a private docker-registry, storage under $WORK/reg-NAME; sets PORT.
start_registry() {
    local dir=$WORK/reg-$1
    rm -rf "$dir"
    mkdir -p "$dir/storage"
    PORT=$(free_port)
    cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/storage
http:
  addr: 127.0.0.1:$PORT
EOF
    "$REGISTRY_BIN" serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 &
    REG_PID=$!
    REG_DIR=$dir
    for _ in $(seq 100); do
        if curl -fsS "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    echo "registry did not start:" >&2
    cat "$dir/registry.log" >&2
    exit 1
}

stop_registry() {
    if [[ -n "$REG_PID" ]]; then
        kill "$REG_PID" 2>/dev/null || true
        wait "$REG_PID" 2>/dev/null || true
        REG_PID=""
        rm -rf "$REG_DIR"
    fi
}

now() { date +%s.%N; }

# timed LABEL CMD...: runs CMD after a sync, then syncs; appends "LABEL cmd_s total_s".
timed() {
    local label=$1
    shift
    sync
    local t0 t1 t2
    t0=$(now)
    if ! "$@" >>"$LOG" 2>&1; then
        echo "FAILED: $label: $*" >&2
        tail -20 "$LOG" >&2
        exit 1
    fi
    t1=$(now)
    sync -f "$WORK"
    t2=$(now)
    echo "$label $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') $(awk -v a="$t0" -v b="$t2" 'BEGIN{printf "%.3f", b-a}')" >>"$RESULTS"
    echo "   $label: $(tail -1 "$RESULTS" | cut -d' ' -f2-3) s" >&2
}

echo "== checkpoint of $SIZE_MIB MiB in $WORK" >&2
"$GEN" "$WORK/ckpt" "$SIZE_MIB" >>"$LOG"
"$GPUSNAP" image build "$WORK/ckpt" --layout "$WORK/layout" -t "localhost/$REPO" >>"$LOG"
rm -rf "$WORK/ckpt" # the layout has it all; disk space is what limits SIZE_MIB
LAYOUT=$WORK/layout
top=$(jq -r '.manifests[0].digest' "$LAYOUT/index.json" | cut -d: -f2)
manifest=$(jq -r '.manifests[0].digest' "$LAYOUT/blobs/sha256/$top" | cut -d: -f2)
mapfile -t LAYERS < <(jq -r '.layers[].digest' "$LAYOUT/blobs/sha256/$manifest" | cut -d: -f2)
BYTES=$(jq '[.layers[].size] | add' "$LAYOUT/blobs/sha256/$manifest")
echo "   ${#LAYERS[@]} layers, $BYTES bytes" >&2

# --- push ---------------------------------------------------------------------------------
push_gpusnap() {
    "$GPUSNAP" image push --plain-http "$LAYOUT" "127.0.0.1:$PORT/$REPO"
}
push_skopeo() {
    skopeo copy --all --preserve-digests --dest-tls-verify=false \
        "oci:$LAYOUT" "docker://127.0.0.1:$PORT/$REPO"
}
push_one() { # LABEL FN
    start_registry push
    timed "$1" "$2"
    stop_registry
}

echo "== push (warm-up, then $ROUNDS rounds)" >&2
push_one warmup-push-gpusnap push_gpusnap
push_one warmup-push-skopeo push_skopeo
for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then
        push_one push-gpusnap push_gpusnap
        push_one push-skopeo push_skopeo
    else
        push_one push-skopeo push_skopeo
        push_one push-gpusnap push_gpusnap
    fi
done

# --- pull ---------------------------------------------------------------------------------
start_registry pull
"$GPUSNAP" image push --plain-http "$LAYOUT" "127.0.0.1:$PORT/$REPO" >>"$LOG"
OUT=$WORK/out
mkdir -p "$OUT"
pull_gpusnap() {
    "$GPUSNAP" --config "$WORK/gpusnap.toml" image pull --plain-http \
        --extract "$OUT/gpusnap" "127.0.0.1:$PORT/$REPO"
}
pull_skopeo() {
    skopeo copy --all --preserve-digests --src-tls-verify=false \
        --dest-oci-accept-uncompressed-layers \
        "docker://127.0.0.1:$PORT/$REPO" "oci:$OUT/skopeo:v1"
}
untar_skopeo() {
    mkdir -p "$OUT/skopeo-x"
    for l in "${LAYERS[@]}"; do
        tar -xf "$OUT/skopeo/blobs/sha256/$l" -C "$OUT/skopeo-x"
    done
}
plain_write() {
    for l in "${LAYERS[@]}"; do cat "$LAYOUT/blobs/sha256/$l"; done >"$OUT/plain"
}
pull_side() { # gpusnap|skopeo|plain [prefix]
    rm -rf "${OUT:?}"/*
    sync
    case $1 in
    gpusnap) timed "${2:-}pull-gpusnap" pull_gpusnap ;;
    skopeo)
        timed "${2:-}pull-skopeo" pull_skopeo
        timed "${2:-}untar-skopeo" untar_skopeo
        ;;
    plain) timed "${2:-}plain-write" plain_write ;;
    esac
}

echo "== pull (warm-up, then $ROUNDS rounds)" >&2
pull_side gpusnap warmup-
# The extracted checkpoint is complete: every file re-hashed against the sealed manifest.
status=$("$GPUSNAP" inspect "$OUT/gpusnap" --json | jq -r .validation.status)
[[ $status == complete ]] || { echo "extracted checkpoint: validation $status" >&2; exit 1; }
pull_side skopeo warmup-
pull_side plain warmup-
for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then
        pull_side gpusnap
        pull_side skopeo
    else
        pull_side skopeo
        pull_side gpusnap
    fi
    pull_side plain
done
stop_registry

# --- table --------------------------------------------------------------------------------
median() { # LABEL FIELD(2=cmd,3=with sync)
    awk -v l="$1" -v f="$2" '$1==l{print $f}' "$RESULTS" | sort -n |
        awk '{v[NR]=$1} END{if(NR==0){print "nan"} else if(NR%2){print v[(NR+1)/2]} else {printf "%.3f", (v[NR/2]+v[NR/2+1])/2}}'
}
span() {
    awk -v l="$1" '$1==l{print $3}' "$RESULTS" | sort -n | awk '{v[NR]=$1} END{printf "%s–%s", v[1], v[NR]}'
}
sum_median() { # two labels, with sync: median of per-round sums
    paste <(awk -v l="$1" '$1==l{print $3}' "$RESULTS") <(awk -v l="$2" '$1==l{print $3}' "$RESULTS") |
        awk '{print $1+$2}' | sort -n |
        awk '{v[NR]=$1} END{if(NR%2){printf "%.3f", v[(NR+1)/2]} else {printf "%.3f", (v[NR/2]+v[NR/2+1])/2}}'
}
mbs() { awk -v b="$BYTES" -v s="$1" 'BEGIN{printf "%.0f", b/1e6/s}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f×", a/b}'; }

pg=$(median push-gpusnap 3)
ps=$(median push-skopeo 3)
lg=$(median pull-gpusnap 3)
ls_=$(median pull-skopeo 3)
ut=$(median untar-skopeo 3)
sx=$(sum_median pull-skopeo untar-skopeo)
pw=$(median plain-write 3)

echo
echo "Transport, $(numfmt --to=iec "$BYTES") in ${#LAYERS[@]} layers, median of $ROUNDS rounds (seconds until synced; range; seconds before the final sync)"
echo
echo "| step | gpusnap | skopeo | gpusnap / skopeo (time) |"
echo "|---|---:|---:|---:|"
printf '| push | %s s (%s; %s), %s MB/s | %s s (%s; %s), %s MB/s | %s |\n' \
    "$pg" "$(span push-gpusnap)" "$(median push-gpusnap 2)" "$(mbs "$pg")" \
    "$ps" "$(span push-skopeo)" "$(median push-skopeo 2)" "$(mbs "$ps")" "$(ratio "$pg" "$ps")"
printf '| pull into a layout | — | %s s (%s; %s), %s MB/s | — |\n' \
    "$ls_" "$(span pull-skopeo)" "$(median pull-skopeo 2)" "$(mbs "$ls_")"
printf '| untar the layers | — | %s s (%s) | — |\n' "$ut" "$(span untar-skopeo)"
printf '| pull + extract | %s s (%s; %s), %s MB/s | %s s (copy + untar), %s MB/s | %s |\n' \
    "$lg" "$(span pull-gpusnap)" "$(median pull-gpusnap 2)" "$(mbs "$lg")" \
    "$sx" "$(mbs "$sx")" "$(ratio "$lg" "$sx")"
printf '| plain write of the same bytes | %s s (%s; %s), %s MB/s | | |\n' \
    "$pw" "$(span plain-write)" "$(median plain-write 2)" "$(mbs "$pw")"
echo
echo "gpusnap pull+extract / plain write: $(ratio "$lg" "$pw") (target ≤ 1.2×); skopeo copy+untar / plain write: $(ratio "$sx" "$pw")"
echo "push throughput gpusnap / skopeo: $(ratio "$ps" "$pg") (target ≥ 1×); pull+extract throughput gpusnap / skopeo: $(ratio "$sx" "$lg")"
echo
echo "raw (label, seconds before sync, seconds until synced):"
sed 's/^/  /' "$RESULTS"
