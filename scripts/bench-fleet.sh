#!/usr/bin/env bash
# Fleet benchmark (issue 21 item 6): checkpoints of the same model in several replicas, pushed to
# a registry and pulled onto a second node, with what moved and how long it took, beside
# `skopeo copy` of the same images.
#
#   scripts/bench-fleet.sh [TOTAL_MIB (default 8192)] [ROUNDS (default 3)]
#
# The workload's device memory is TOTAL_MIB split 5 : 2.5 : 0.5 (of 8):
#   weights   5/8    the same bytes in every replica (AES-128-CTR keystream of a fixed key),
#   KV cache  2.5/8  zeros,
#   state     0.5/8  random bytes, new for every checkpoint.
# Three checkpoints are taken through the front door — `ctr tasks checkpoint --image-path` on a
# container run by the gpusnap shim — : replica a (a1), replica b (b1), replica a again after
# its state changed (a2). Each is built into an OCI layout with `gpusnap image build` and pushed
# with `gpusnap image push` to Debian's docker-registry (and a1 once more straight from its
# checkpoint directory, `gpusnap image push CHECKPOINT-DIR REF`, with no layout); then pulled
# with `gpusnap image pull --extract` onto a second node (its own checkpoint root and, when the
# CLI has a node store, its own store root): a1 cold, then b1 and a2 onto the node that holds
# a1, and b1 cold onto a third, empty node. The same images go through `skopeo copy` (push from
# the layout; pull into one OCI layout per node, which reuses blobs it holds, then untar the
# layers).
#
# Bytes are measured, not assumed: the CLI's own --json reports (bytes moved where the CLI
# reports them, else every byte of the image), the registry storage's growth per push (`du`
# of its blob store), and the growth of each node's store/layout per pull. So the script shows
# whatever dedup the CLI does: none with whole-file layers (the baseline), chunk dedup with a
# chunked `gpusnap image build`, skipped blobs with a node store.
#
# Driver: FLEET_DRIVER=double (default): the CUDA driver double on a private containerd;
# FLEET_DRIVER=gpu: the H200 (tests/gpu/scenario-fleet.sh hands over run-h200.sh's containerd
# and workload). See scripts/lib/bench-replicas.sh, which this script shares with
# scripts/bench-crypt.sh.
#
# Method: every timed step starts after `sync` and ends with `sync -f`; one warm-up round of
# every step (not counted), then ROUNDS rounds alternating which side (gpusnap, skopeo) goes
# first; medians. Every push round goes to a freshly started, empty registry. Each pulled
# checkpoint of the warm-up is checked with `gpusnap inspect` (every file re-hashed against the
# sealed manifest). "plain write" is `cat` of as many bytes as the checkpoint holds (from the
# image's layers, in the page cache) into one file.
#
# Environment: BENCH_DIR (default /var/tmp/gpusnap-bench-fleet.PID), BIN_DIR (gpusnap and
# containerd-shim-gpusnap-v2; default target/release, built first unless PREBUILT=1),
# RIG (containerd, ctr, criu; default /opt/gpusnap-rig), REGISTRY_BIN (default
# /usr/bin/docker-registry), SKOPEO (default: skopeo on PATH; none: gpusnap only), KEEP=1 keeps BENCH_DIR,
# BUILD_ARGS (extra `gpusnap image build` arguments, e.g. --classic: whole-file layers),
# DRY_RUN=1 takes the checkpoints and prints the plan without pushing or pulling, SLOW_MBIT=N
# also pulls b1 cold and warm through a relay paced to N Mbit/s (scripts/lib/slowlink.py),
# SLOW_ROUNDS times (default ROUNDS).
# Disk: about 12 × TOTAL_MIB in BENCH_DIR.
set -euo pipefail

TOTAL_MIB=${1:-8192}
ROUNDS=${2:-3}
BENCH_NAME=fleet
# shellcheck source=scripts/lib/bench-replicas.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/bench-replicas.sh"
bench_setup
SKOPEO=${SKOPEO:-$(command -v skopeo || true)}
HAVE_SKOPEO=0
[[ -n $SKOPEO && -x $SKOPEO ]] && HAVE_SKOPEO=1

cleanup() { bench_cleanup ra rb; }
trap cleanup EXIT
bench_driver_start

# --- the checkpoints --------------------------------------------------------------------------
say "workload: $TOTAL_MIB MiB of device memory = $W_MIB MiB weights + $Z_MIB MiB zeros + $S_MIB MiB state; driver $DRIVER"
mkdir -p "$WORK/ckpt"
replica_start ra
replica_start rb
timed checkpoint-a1 checkpoint ra a1
timed checkpoint-b1 checkpoint rb b1
replica_step ra
timed checkpoint-a2 checkpoint ra a2
replica_stop ra
replica_stop rb
for c in a1 b1 a2; do
    record "ckpt-$c" dir "$(dbytes "$WORK/ckpt/$c")"
done
[[ $DRIVER == double ]] && rm -rf "${FAKE:?}/vram"

# --- images -----------------------------------------------------------------------------------
say "gpusnap image build"
mkdir -p "$WORK/layouts"
for c in a1 b1 a2; do
    # shellcheck disable=SC2086 # BUILD_ARGS: e.g. --classic for whole-file layers
    timed "build-$c" "$GPUSNAP" image build ${BUILD_ARGS:-} "$WORK/ckpt/$c" --layout "$WORK/layouts/$c" \
        -t "localhost/fleet/model:$c" --json
    record_image "image-$c" "$WORK/layouts/$c"
    record "layout-$c" dir "$(dbytes "$WORK/layouts/$c")"
    # The layout holds the checkpoint now: disk is what limits TOTAL_MIB. a1 stays for the
    # push straight from the checkpoint directory.
    [[ $c == a1 || ${KEEP_CKPT:-0} == 1 || ${DRY_RUN:-0} == 1 ]] || rm -rf "${WORK:?}/ckpt/$c"
done
# Blobs the three images share (what a registry or a node needs to hold only once).
for c in a1 b1 a2; do layout_blobs "$WORK/layouts/$c"; done | sort -u >"$WORK/union"
record images-union bytes "$(awk '{s+=$2} END{print s+0}' "$WORK/union")"
if [[ ${DRY_RUN:-0} == 1 ]]; then
    say "DRY_RUN: checkpoints and images made; no push or pull"
    cat "$BYTES" "$RESULTS"
    exit 0
fi

# --- push ------------------------------------------------------------------------------------
push_gpusnap() { "$GPUSNAP" image push --plain-http --json "$WORK/layouts/$1" "127.0.0.1:$PORT/fleet/model:$1"; }
# Straight from the checkpoint directory: built and pushed in one command, the packs read
# from the checkpoint's files as they upload (no layout). Only a1 is kept for it.
push_direct() { "$GPUSNAP" image push --plain-http --json "$WORK/ckpt/$1" "127.0.0.1:$PORT/fleet/model:$1"; }
push_skopeo() {
    "$SKOPEO" --insecure-policy copy --all --preserve-digests --dest-tls-verify=false \
        "oci:$WORK/layouts/$1" "docker://127.0.0.1:$PORT/fleet/model:$1"
}
# The bytes a push report says went over the wire: the node-store CLI's transfer.moved_bytes,
# else bytes_uploaded.
push_reported() { jq -r '(.transfer.moved_bytes // .bytes_uploaded // "nan")' "$STEP_OUT"; }

push_all() { # SIDE PREFIX: a1, b1, a2 into a fresh registry
    local side=$1 prefix=$2 before c
    start_registry push
    for c in a1 b1 a2; do
        [[ $side == direct && $c != a1 ]] && continue
        before=$(dbytes "$REG_BLOBS")
        timed "${prefix}push-$side-$c" "push_$side" "$c"
        record "${prefix}push-$side-$c" registry-growth $(($(dbytes "$REG_BLOBS") - before))
        [[ $side == skopeo ]] || record "${prefix}push-$side-$c" reported "$(push_reported)"
    done
    stop_registry
}

SIDES=(gpusnap)
((HAVE_SKOPEO)) && SIDES+=(skopeo)
((HAVE_SKOPEO)) || echo "   no skopeo here: gpusnap only" >&2
WARMUP=${WARMUP:-1}
say "push a1, b1, a2, and a1 straight from its checkpoint directory ($( ((WARMUP)) && echo 'warm-up, then ')$ROUNDS rounds)"
if ((WARMUP)); then for s in "${SIDES[@]}" direct; do push_all "$s" warmup-; done; fi
for r in $(seq "$ROUNDS"); do
    for s in $(side_order "$r" direct "${SIDES[@]}"); do push_all "$s" ""; done
done
[[ ${KEEP_CKPT:-0} == 1 ]] || rm -rf "${WORK:?}/ckpt/a1"

# --- pull onto a second node --------------------------------------------------------------------
# Does this gpusnap keep pulled blobs in a node store ([store] root in its config)?
HAVE_STORE=0
"$GPUSNAP" store --help >/dev/null 2>&1 && HAVE_STORE=1
node_reset() { # NODE: an empty node (checkpoint root, store, skopeo layout)
    rm -rf "${WORK:?}/node-$1"
    mkdir -p "$WORK/node-$1/checkpoints" "$WORK/node-$1/skopeo"
    {
        printf '[restore]\ncheckpoint_root = "%s"\n' "$WORK/node-$1/checkpoints"
        if ((HAVE_STORE)); then printf '\n[store]\nroot = "%s"\n' "$WORK/node-$1/store"; fi
    } >"$WORK/node-$1/gpusnap.toml"
}
node_bytes() { # NODE SIDE: what the node holds for that side, besides the extracted checkpoints
    case $2 in
    gpusnap) if ((HAVE_STORE)); then dbytes "$WORK/node-$1/store"; else echo 0; fi ;;
    skopeo) dbytes "$WORK/node-$1/skopeo/layout" ;;
    esac
}
pull_gpusnap() { # NODE IMAGE (from the registry at PULL_PORT, default PORT)
    "$GPUSNAP" --config "$WORK/node-$1/gpusnap.toml" image pull --plain-http --json \
        --extract "$WORK/node-$1/checkpoints/$2" "127.0.0.1:${PULL_PORT:-$PORT}/fleet/model:$2"
}
pull_skopeo() { # NODE IMAGE: into the node's one layout (skopeo reuses blobs it holds), untarred
    "$SKOPEO" --insecure-policy copy --all --preserve-digests --src-tls-verify=false \
        --dest-oci-accept-uncompressed-layers \
        "docker://127.0.0.1:$PORT/fleet/model:$2" "oci:$WORK/node-$1/skopeo/layout:$2"
    mkdir -p "$WORK/node-$1/skopeo/x-$2"
    local f
    for f in $(layer_files "$WORK/layouts/$2"); do
        tar -xf "$WORK/node-$1/skopeo/layout/blobs/sha256/${f##*/}" -C "$WORK/node-$1/skopeo/x-$2"
    done
}
# Bytes a pull report says came over the network: the node-store CLI's transfer.moved_bytes,
# else every byte it wrote (the CLI without a store downloads every blob).
pull_reported() { jq -r '(.pull.transfer.moved_bytes // .pull.bytes // "nan")' "$STEP_OUT"; }

VERIFIED=0
pull_one() { # SIDE NODE IMAGE LABEL
    local side=$1 node=$2 img=$3 label=$4 before
    before=$(node_bytes "$node" "$side")
    timed "$label" "pull_$side" "$node" "$img"
    record "$label" node-growth $(($(node_bytes "$node" "$side") - before))
    if [[ $side == gpusnap ]]; then
        record "$label" reported "$(pull_reported)"
        # The first round's checkpoints are re-hashed against their sealed manifests.
        ((VERIFIED >= 4)) || { verify_extracted "$WORK/node-$node/checkpoints/$img"; VERIFIED=$((VERIFIED + 1)); }
        rm -rf "${WORK:?}/node-$node/checkpoints/$img" # what the node keeps is its store
    else
        rm -rf "${WORK:?}/node-$node/skopeo/x-$img" # what the node keeps is its layout
    fi
}
pull_all() { # SIDE PREFIX
    local s=$1 p=$2
    node_reset 2
    pull_one "$s" 2 a1 "${p}pull-$s-a1-cold"
    pull_one "$s" 2 b1 "${p}pull-$s-b1-warm"
    pull_one "$s" 2 a2 "${p}pull-$s-a2-warm"
    rm -rf "${WORK:?}/node-2"
    node_reset 3
    pull_one "$s" 3 b1 "${p}pull-$s-b1-cold"
    rm -rf "${WORK:?}/node-3"
}
plain_write() { # IMAGE: as many bytes as its checkpoint holds, from its layers (page cache),
    # into one file on the same disk (a chunked image's layers are smaller than the checkpoint)
    mapfile -t files < <(layer_files "$WORK/layouts/$1")
    head -c "$(one "ckpt-$1" dir)" < <(cat "${files[@]}" "${files[@]}" "${files[@]}") >"$WORK/plain"
}
plain_round() {
    timed "$1plain-write-a1" plain_write a1
    rm -f "$WORK/plain"
}

start_registry pull
for c in a1 b1 a2; do push_gpusnap "$c" >/dev/null; done
say "pull onto a second node: a1 cold, b1 and a2 onto it, b1 cold onto a third ($( ((WARMUP)) && echo 'warm-up, then ')$ROUNDS rounds)"
if ((WARMUP)); then
    for s in "${SIDES[@]}"; do pull_all "$s" warmup-; done
    plain_round warmup-
fi
for r in $(seq "$ROUNDS"); do
    for s in $(side_order "$r" "${SIDES[@]}"); do pull_all "$s" ""; done
    plain_round ""
done

# --- over a slower link (SLOW_MBIT) -------------------------------------------------------------
# On loopback a pull is bound by writing and checking the checkpoint, which a warm pull does as
# much as a cold one. Through scripts/lib/slowlink.py (the registry behind a relay paced to
# SLOW_MBIT Mbit/s each way), b1 is pulled cold onto an empty node and warm onto a node whose
# store holds a1 (pulled there over loopback first, not timed); order alternating per round.
SLOW=0
if [[ ${SLOW_MBIT:-0} != 0 ]] && command -v python3 >/dev/null; then
    SLOW=1
    SLOW_PORT=$(free_port)
    python3 "$ROOT/scripts/lib/slowlink.py" "$SLOW_PORT" "127.0.0.1:$PORT" "$SLOW_MBIT" >"$WORK/slowlink.out" 2>&1 &
    SLOW_PID=$!
    for _ in $(seq 50); do grep -q ready "$WORK/slowlink.out" 2>/dev/null && break; sleep 0.1; done
    slow_warm() {
        node_reset 4
        pull_gpusnap 4 a1 >/dev/null
        rm -rf "${WORK:?}/node-4/checkpoints/a1"
        PULL_PORT=$SLOW_PORT pull_one gpusnap 4 b1 "$1slow-pull-b1-warm"
        rm -rf "${WORK:?}/node-4"
    }
    slow_cold() {
        node_reset 5
        PULL_PORT=$SLOW_PORT pull_one gpusnap 5 b1 "$1slow-pull-b1-cold"
        rm -rf "${WORK:?}/node-5"
    }
    say "pull b1 over a $SLOW_MBIT Mbit/s link: cold, and onto a node holding a1 (${SLOW_ROUNDS:-$ROUNDS} rounds)"
    for r in $(seq "${SLOW_ROUNDS:-$ROUNDS}"); do
        for s in $(side_order "$r" warm cold); do "slow_$s" ""; done
    done
    kill "$SLOW_PID" 2>/dev/null || true
    wait "$SLOW_PID" 2>/dev/null || true
elif [[ ${SLOW_MBIT:-0} != 0 ]]; then
    echo "   SLOW_MBIT: no python3 here, the slow-link pulls are skipped" >&2
fi
stop_registry

# --- report ----------------------------------------------------------------------------------
frac8() { awk -v a="$1" -v t="$TOTAL_MIB" 'BEGIN{if(a=="nan"||a==""){print "—"} else printf "%.2f/8", a/(t*1048576)*8}'; }

echo
echo "Fleet benchmark: $TOTAL_MIB MiB of device memory ($W_MIB MiB weights + $Z_MIB MiB zeros + $S_MIB MiB state), driver $DRIVER, registry $("$REGISTRY_BIN" --version 2>/dev/null | head -1); gpusnap node store: $( ((HAVE_STORE)) && echo yes || echo no); median of $ROUNDS rounds, seconds until synced"
echo
echo "| image | checkpoint dir | image (blobs) | checkpoint time |"
echo "|---|---:|---:|---:|"
for c in a1 b1 a2; do
    printf '| %s | %s | %s (%s) | %s s |\n' "$c" "$(mib "$(one "ckpt-$c" dir)")" \
        "$(mib "$(one "image-$c" bytes)")" "$(one "image-$c" blobs)" "$(t_med "checkpoint-$c")"
done
printf '| all three, distinct blobs | | %s | |\n' "$(mib "$(one images-union bytes)")"
echo
echo "Push, each round into an empty registry in the order a1, b1, a2:"
echo
echo "| push | gpusnap: reported uploaded | gpusnap: registry growth | gpusnap time | skopeo: registry growth | skopeo time | gpusnap / skopeo time |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for c in a1 b1 a2; do
    printf '| %s | %s | %s | %s s | %s | %s s | %s |\n' "$c" \
        "$(mib "$(b_med "push-gpusnap-$c" reported)")" "$(mib "$(b_med "push-gpusnap-$c" registry-growth)")" \
        "$(t_med "push-gpusnap-$c")" "$(mib "$(b_med "push-skopeo-$c" registry-growth)")" \
        "$(t_med "push-skopeo-$c")" "$(ratio "$(t_med "push-gpusnap-$c")" "$(t_med "push-skopeo-$c")")"
done
echo
echo "Pull onto a second node (gpusnap: pull --extract, verified, assembled; skopeo: copy into the node's layout + untar):"
echo
echo "| pull | gpusnap: reported downloaded | gpusnap: node store growth | gpusnap time | skopeo: layout growth | skopeo time | gpusnap / skopeo time |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for p in a1-cold b1-warm a2-warm b1-cold; do
    printf '| %s | %s | %s | %s s | %s | %s s | %s |\n' "$p" \
        "$(mib "$(b_med "pull-gpusnap-$p" reported)")" "$( ((HAVE_STORE)) && mib "$(b_med "pull-gpusnap-$p" node-growth)" || echo 'no store')" \
        "$(t_med "pull-gpusnap-$p")" "$(mib "$(b_med "pull-skopeo-$p" node-growth)")" \
        "$(t_med "pull-skopeo-$p")" "$(ratio "$(t_med "pull-gpusnap-$p")" "$(t_med "pull-skopeo-$p")")"
done
printf '| plain write of a1'"'"'s checkpoint size | | | %s s | | | |\n' "$(t_med plain-write-a1)"
echo
up1=$(b_med push-gpusnap-a1 reported)
up2=$(b_med push-gpusnap-b1 reported)
dn_w=$(b_med pull-gpusnap-b1-warm reported)
echo "Issue 21's targets (scaled to $TOTAL_MIB MiB: x/8 is the fraction of the device memory):"
echo "- first push (a1) uploaded $(mib "$up1") = $(frac8 "$up1") (target ≤ 5.6/8)"
echo "- second replica's push (b1) uploaded $(mib "$up2") = $(frac8 "$up2") (target ≤ 0.6/8); replica a's second checkpoint (a2): $(frac8 "$(b_med push-gpusnap-a2 reported)")"
echo "- b1 pulled onto the node holding a1: $(mib "$dn_w") = $(frac8 "$dn_w") (target ≤ 0.6/8), $(t_med pull-gpusnap-b1-warm) s = $(ratio "$(t_med pull-gpusnap-b1-warm)" "$(t_med pull-gpusnap-b1-cold)") of b1's cold pull ($(t_med pull-gpusnap-b1-cold) s; target ≤ 0.25×)"
if ((SLOW)); then
    echo "- over a $SLOW_MBIT Mbit/s link: b1 onto the node holding a1 fetched $(mib "$(b_med slow-pull-b1-warm reported)") in $(t_med slow-pull-b1-warm) s = $(ratio "$(t_med slow-pull-b1-warm)" "$(t_med slow-pull-b1-cold)") of its cold pull over the same link ($(t_med slow-pull-b1-cold) s; target ≤ 0.25×)"
fi
echo "- push straight from the checkpoint directory (a1: \`gpusnap image push CHECKPOINT-DIR\`, $(t_med push-direct-a1) s, uploaded $(mib "$(b_med push-direct-a1 reported)")) / skopeo copy of its image: $(ratio "$(t_med push-direct-a1)" "$(t_med push-skopeo-a1)") (target ≤ 1.1×)"
echo "- push of the built layout / skopeo copy (a1): $(ratio "$(t_med push-gpusnap-a1)" "$(t_med push-skopeo-a1)"); image build + push of the layout: $(ratio "$(awk -v a="$(t_med build-a1)" -v b="$(t_med push-gpusnap-a1)" 'BEGIN{print a+b}')" "$(t_med push-skopeo-a1)")"
echo "- pull + verify + assemble (a1 cold) / plain write of the same bytes: $(ratio "$(t_med pull-gpusnap-a1-cold)" "$(t_med plain-write-a1)") (target ≤ 1.3×)"
echo
echo "versions: $("$GPUSNAP" --version 2>/dev/null || echo gpusnap ?) from $BIN_DIR (script at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')); $( ((HAVE_SKOPEO)) && "$SKOPEO" --version)"
echo
echo "raw times (label, seconds before sync, seconds until synced):"
sed 's/^/  /' "$RESULTS"
echo "raw bytes (label, kind, bytes):"
sed 's/^/  /' "$BYTES"
