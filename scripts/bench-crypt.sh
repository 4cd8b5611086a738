#!/usr/bin/env bash
# Encryption benchmark (issue 22): what `--encrypt-recipient` costs a checkpoint image on build,
# push and pull+extract, measured beside the same image unencrypted in the same call; what
# deduplication remains; and the encrypted checkpoint restored.
#
#   scripts/bench-crypt.sh [TOTAL_MIB (default 8192)] [ROUNDS (default 3)]
#
# The workload is scripts/bench-fleet.sh's (scripts/lib/bench-replicas.sh): device memory of
# TOTAL_MIB, 5/8 weights the same in every replica, 5/16 zeros, 1/16 state new per checkpoint.
# Checkpoints, through the front door: `ctr tasks checkpoint --image-path` on containers run by
# the gpusnap shim — a1 of replica a (the one timed and restored) and, for the dedup figures,
# b1 of replica b (same weights, other state).
#
# Per round, for each side — plain, then encrypted (the order alternates between rounds):
#   build   `gpusnap image build a1 --layout L` (chunked, the default), encrypted: with
#           `--encrypt-recipient jwe:pub.pem` (an EC P-256 key made with openssl);
#   push    `gpusnap image push L REF` into a freshly started, empty docker-registry;
#   pull    `gpusnap image pull --extract DIR REF` onto an empty node (its own checkpoint root
#           and node store root), encrypted: with `--decryption-key priv.pem`.
# Every timed step starts after `sync` and ends with `sync -f`; one warm-up round (WARMUP=1,
# the default; not counted), then ROUNDS rounds; medians. The registry serves HTTPS with a CA
# of its own (as the CI interop test's registry; REG_TLS=0: plain HTTP), the CLI trusting it
# with --ca-file.
#
# The first round (the warm-up, when there is one) also checks and measures, outside the
# timed steps:
#   - every extracted checkpoint re-hashed against its sealed manifest (`gpusnap inspect`);
#   - dedup: b1's image pushed into the registry that holds a1's (bytes the CLI reports it
#     uploaded, and the registry storage's growth), b1 pulled onto the node that holds a1, and
#     a1 pulled again onto that node (bytes downloaded, node store growth), plain and
#     encrypted; which digests the node store holds (the registry's blobs, encrypted or not);
#     image size beside checkpoint size and the build's chunk counts (dedup within one image);
#   - restore: that round's encrypted image pulled with the key into the shim's checkpoint root
#     and restored from there by `gpusnap.io/restore-from` through ctr (a new container, the
#     original stopped): with the double, its device memory after the restore must equal the
#     checkpointed bytes and the double must report it restored and unlocked; on the H200
#     (crypt_gpu_restore from tests/gpu/scenario-crypt.sh) gpu_verify must go on verifying the
#     checkpointed run with 0 mismatches. The restored container is stopped again after.
# A counted round after the first is not started when the last one's duration says it would end
# past BENCH_DEADLINE (epoch seconds; the H200 scenario sets it from run-h200.sh's deadline).
#
# Environment (besides scripts/lib/bench-replicas.sh's: FLEET_DRIVER, BENCH_DIR, BIN_DIR,
# PREBUILT, RIG, REGISTRY_BIN, KEEP): WARMUP (default 1), DEDUP (default 1: replica b and the
# dedup figures; 0: a1 only), RESTORE (default 1: restore the decrypted checkpoint),
# REG_TLS (default 1).
# Disk: about 6 × TOTAL_MIB in BENCH_DIR at once (a1's checkpoint, b1's two layouts, one
# side's layout, registry, node store and one extracted checkpoint), plus one extracted
# checkpoint in the shim's checkpoint root during the restore.
set -euo pipefail

TOTAL_MIB=${1:-8192}
ROUNDS=${2:-3}
BENCH_NAME=crypt
REG_TLS=${REG_TLS:-1}
WARMUP=${WARMUP:-1}
DEDUP=${DEDUP:-1}
RESTORE=${RESTORE:-1}
# shellcheck source=scripts/lib/bench-replicas.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/bench-replicas.sh"
bench_setup

cleanup() { bench_cleanup ra rb; }
trap cleanup EXIT
bench_driver_start
registry_ca

# --- keys -------------------------------------------------------------------------------------
KEYS=$WORK/keys
mkdir -p "$KEYS"
chmod 0700 "$KEYS"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$KEYS/priv.pem" 2>>"$LOG"
chmod 0600 "$KEYS/priv.pem"
openssl pkey -in "$KEYS/priv.pem" -pubout -out "$KEYS/pub.pem" 2>>"$LOG"
RECIPIENT=jwe:$KEYS/pub.pem

# --- the checkpoints --------------------------------------------------------------------------
say "workload: $TOTAL_MIB MiB of device memory = $W_MIB MiB weights + $Z_MIB MiB zeros + $S_MIB MiB state; driver $DRIVER"
mkdir -p "$WORK/ckpt" "$WORK/layouts"
REPLICAS=(ra)
((DEDUP)) && REPLICAS+=(rb)
for r in "${REPLICAS[@]}"; do replica_start "$r"; done
timed checkpoint-a1 checkpoint ra a1
if [[ $DRIVER == double ]]; then
    # The double's device memory as the checkpoint holds it (it does not change by itself).
    A1_VRAM_SHA=$(sha256sum <"$FAKE/vram/id-ra-1/0" | cut -d' ' -f1)
fi
((DEDUP)) && timed checkpoint-b1 checkpoint rb b1
for r in "${REPLICAS[@]}"; do replica_stop "$r"; done
record ckpt-a1 dir "$(dbytes "$WORK/ckpt/a1")"

# build SIDE CKPT LAYOUT: gpusnap image build, encrypted for the enc side.
build() {
    local enc=()
    [[ $1 == enc ]] && enc=(--encrypt-recipient "$RECIPIENT")
    "$GPUSNAP" image build "${enc[@]}" "$WORK/ckpt/$2" --layout "$3" -t "localhost/crypt/model:$2" --json
}
build_chunks() { # LABEL: the build report's chunk summary into BYTES
    local k
    for k in chunks distinct_chunks logical_bytes stored_bytes packs; do
        record "$1" "$k" "$(jq -r ".chunks.$k // \"nan\"" "$STEP_OUT")"
    done
}
if ((DEDUP)); then
    say "b1: built plain and encrypted once (the dedup figures)"
    for side in plain enc; do
        timed "build-b1-$side" build "$side" b1 "$WORK/layouts/b1-$side"
        record_image "image-b1-$side" "$WORK/layouts/b1-$side"
    done
    rm -rf "${WORK:?}/ckpt/b1"
fi

# --- one side of a round ----------------------------------------------------------------------
# node_reset NODE: an empty node: its checkpoint root and node store.
node_reset() {
    rm -rf "${WORK:?}/node-$1"
    mkdir -p "$WORK/node-$1/checkpoints"
    printf '[restore]\ncheckpoint_root = "%s"\n\n[store]\nroot = "%s"\n' \
        "$WORK/node-$1/checkpoints" "$WORK/node-$1/store" >"$WORK/node-$1/gpusnap.toml"
}
push() { # SIDE NODE LAYOUT TAG
    "$GPUSNAP" --config "$WORK/node-$2/gpusnap.toml" image push "${REG_CLI_ARGS[@]}" --json \
        "$3" "$REG_HOST/crypt/model:$4"
}
pull() { # SIDE NODE TAG DEST
    local key=()
    [[ $1 == enc ]] && key=(--decryption-key "$KEYS/priv.pem")
    "$GPUSNAP" --config "$WORK/node-$2/gpusnap.toml" image pull "${REG_CLI_ARGS[@]}" --json \
        "${key[@]}" --extract "$4" "$REG_HOST/crypt/model:$3"
}
pushed() { jq -r '.transfer.moved_bytes // "nan"' "$STEP_OUT"; }
pulled() { jq -r '.pull.transfer.moved_bytes // "nan"' "$STEP_OUT"; }
store_bytes() { dbytes "$WORK/node-$1/store"; }
# store_holds NODE LAYOUT: how many of LAYOUT's layers the node's store holds (by digest).
store_holds() {
    local held
    held=$("$GPUSNAP" --config "$WORK/node-$1/gpusnap.toml" store ls --json | jq -r '.[].id' | sed 's/.*://')
    layer_files "$2" | sed 's|.*/||' | grep -cxF -f <(printf '%s\n' "$held") || true
}

FIRST=1
side_round() { # SIDE PREFIX
    local side=$1 p=$2 before lay=$WORK/layouts/a1-$1 x
    rm -rf "$lay"
    timed "${p}build-$side" build "$side" a1 "$lay"
    if ((FIRST)); then
        record_image "image-a1-$side" "$lay"
        record "image-a1-$side" layers "$(layer_files "$lay" | wc -l)"
        build_chunks "image-a1-$side"
    fi
    start_registry "$side"
    node_reset push
    timed "${p}push-$side" push "$side" push "$lay" a1
    record "${p}push-$side" uploaded "$(pushed)"
    node_reset pull
    x=$WORK/node-pull/checkpoints/a1
    timed "${p}pull-$side" pull "$side" pull a1 "$x"
    record "${p}pull-$side" downloaded "$(pulled)"
    if ((FIRST)); then
        verify_extracted "$x"
        echo "   a1 ($side): pulled, decrypted and assembled checkpoint verified (gpusnap inspect)" >&2
        rm -rf "$x" # what the node keeps is its store (and memory, on the H200's tmpfs)
        record "pull-a1-$side" store-holds-layers "$(store_holds pull "$lay")"
        if ((DEDUP)); then
            before=$(dbytes "$REG_BLOBS")
            timed "dedup-push-b1-$side" push "$side" push "$WORK/layouts/b1-$side" b1
            record "dedup-push-b1-$side" uploaded "$(pushed)"
            record "dedup-push-b1-$side" registry-growth $(($(dbytes "$REG_BLOBS") - before))
            before=$(store_bytes pull)
            timed "dedup-pull-b1-$side" pull "$side" pull b1 "$WORK/node-pull/checkpoints/b1"
            record "dedup-pull-b1-$side" downloaded "$(pulled)"
            record "dedup-pull-b1-$side" store-growth $(($(store_bytes pull) - before))
            verify_extracted "$WORK/node-pull/checkpoints/b1"
            rm -rf "$WORK/node-pull/checkpoints/b1"
            before=$(store_bytes pull)
            timed "dedup-pull-a1again-$side" pull "$side" pull a1 "$WORK/node-pull/checkpoints/a1-again"
            record "dedup-pull-a1again-$side" downloaded "$(pulled)"
            record "dedup-pull-a1again-$side" store-growth $(($(store_bytes pull) - before))
            rm -rf "$WORK/node-pull/checkpoints/a1-again"
        fi
    fi
    # The first encrypted image is the one restored: pushed already, pulled with the key there.
    if ((FIRST && RESTORE)) && [[ $side == enc ]]; then restore_a1; fi
    stop_registry
    rm -rf "${WORK:?}/node-push" "${WORK:?}/node-pull" "$lay"
}

# --- restore of the decrypted checkpoint --------------------------------------------------------
RESTORED=""
restore_a1() {
    local root name=crypt-a1 cfg=$WORK/node-restore.toml
    if [[ $DRIVER == double ]]; then root=$SHIM_RESTORE_ROOT; else root=${CRYPT_RESTORE_ROOT:?the H200 hooks name the shim\'s checkpoint root}; fi
    rm -rf "${root:?}/$name"
    printf '[restore]\ncheckpoint_root = "%s"\n\n[store]\nroot = "%s"\n' "$root" "$WORK/node-restore-store" >"$cfg"
    say "restore: the encrypted image pulled with the key into $root/$name, restored by gpusnap.io/restore-from through ctr"
    timed restore-pull-enc "$GPUSNAP" --config "$cfg" image pull "${REG_CLI_ARGS[@]}" --json \
        --decryption-key "$KEYS/priv.pem" --extract "$name" "$REG_HOST/crypt/model:a1"
    [[ $(jq -r '.restore_from // ""' "$STEP_OUT") == "$name" ]] ||
        { echo "pull --extract $name did not land under $root" >&2; exit 1; }
    rm -rf "$WORK/node-restore-store"
    case $DRIVER in
    double)
        # The image holds the process as it was during the dump: checkpointed, its device
        # memory released (the double keeps only its size).
        mkdir -p "$FAKE/vram/id-ra-1"
        echo checkpointed >"$FAKE/procs/id-ra-1"
        echo $((TOTAL_MIB << 20)) >"$FAKE/vram/id-ra-1/0.size"
        timed restore-run ctr run -d --null-io --runtime io.containerd.gpusnap.v2 \
            --runtime-config-path "$SHIM_CONFIG" --annotation "gpusnap.io/restore-from=$name" \
            "$IMAGE" ra-restored sh -c 'exit 7'
        local st vram_sha state
        st=$(ctr t ls | awk '$1=="ra-restored"{print $3}')
        vram_sha=$(sha256sum <"$FAKE/vram/id-ra-1/0" | cut -d' ' -f1)
        state=$(cat "$FAKE/procs/id-ra-1")
        [[ $st == RUNNING ]] || { echo "restored task is ${st:-gone}, not RUNNING" >&2; exit 1; }
        [[ $vram_sha == "$A1_VRAM_SHA" ]] ||
            { echo "restored device memory differs from the checkpointed one ($vram_sha, checkpointed $A1_VRAM_SHA)" >&2; exit 1; }
        [[ -z $state || $state == running ]] || { echo "the double says the restored process is $state" >&2; exit 1; }
        RESTORED="task RUNNING, the double's device memory after the restore = the checkpointed bytes (sha256 ${A1_VRAM_SHA:0:16}…), process restored and unlocked"
        replica_stop ra-restored
        ;;
    gpu)
        local t0 first
        t0=$(now)
        first=$(crypt_gpu_restore ra "$name") || { echo "restore of $name: the workload did not come back verifying: $first" >&2; exit 1; }
        RESTORED="gpu_verify restored in a new container and verifying again: $first ($(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s to 3 verified steps)"
        replica_stop ra
        ;;
    esac
    echo "   restored: $RESTORED" >&2
    rm -rf "${root:?}/$name"
}

# --- rounds -----------------------------------------------------------------------------------
say "build, push, pull --extract: plain and encrypted ($( ((WARMUP)) && echo 'warm-up, then ')$ROUNDS rounds; registry $REG_SCHEME)"
if ((WARMUP)); then
    for side in plain enc; do side_round "$side" warmup-; done
    FIRST=0
fi
COUNTED=0
for r in $(seq "$ROUNDS"); do
    t_round=$(date +%s)
    # BENCH_DEADLINE (epoch seconds): no round that would end past it starts after the first.
    if ((COUNTED)) && [[ -n ${BENCH_DEADLINE:-} ]] && (($(date +%s) + ROUND_S > BENCH_DEADLINE)); then
        say "round $r of $ROUNDS not started: the last took ${ROUND_S}s and BENCH_DEADLINE is $((BENCH_DEADLINE - $(date +%s)))s away"
        break
    fi
    for side in $(side_order "$r" plain enc); do side_round "$side" ""; done
    FIRST=0
    COUNTED=$r
    ROUND_S=$(($(date +%s) - t_round))
done
rm -rf "${WORK:?}/layouts" "${WORK:?}/ckpt"

# --- report -----------------------------------------------------------------------------------
pct() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="nan"||b=="nan"||b==0){print "—"} else printf "%+.1f %%", (a/b-1)*100}'; }
sum2() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="nan"||b=="nan"){print "nan"} else printf "%.3f", a+b}'; }
row() { # LABEL PLAIN ENC
    printf '| %s | %s s | %s s | %s | %s |\n' "$1" "$2" "$3" "$(ratio "$3" "$2")" "$(pct "$3" "$2")"
}
echo
echo "Encryption benchmark: $TOTAL_MIB MiB of device memory ($W_MIB MiB weights + $Z_MIB MiB zeros + $S_MIB MiB state), driver $DRIVER, registry $("$REGISTRY_BIN" --version 2>/dev/null | head -1) over $REG_SCHEME; median of $COUNTED rounds (of $ROUNDS asked) after $WARMUP warm-up, seconds until synced"
echo
echo "| step (a1) | plain | encrypted | enc / plain | encryption adds |"
echo "|---|---:|---:|---:|---:|"
row "image build (encrypted: + encryption)" "$(t_med build-plain)" "$(t_med build-enc)"
row "image push" "$(t_med push-plain)" "$(t_med push-enc)"
row "image pull --extract (verify, decrypt, assemble)" "$(t_med pull-plain)" "$(t_med pull-enc)"
row "push + pull --extract" "$(sum2 "$(t_med push-plain)" "$(t_med pull-plain)")" "$(sum2 "$(t_med push-enc)" "$(t_med pull-enc)")"
echo
echo "Issue 22's target, encryption adds ≤ 10 %: push $(pct "$(t_med push-enc)" "$(t_med push-plain)"), pull+extract $(pct "$(t_med pull-enc)" "$(t_med pull-plain)") (build, where the encryption happens: $(pct "$(t_med build-enc)" "$(t_med build-plain)"))"
echo "bytes moved (median): push plain $(mib "$(b_med push-plain uploaded)"), encrypted $(mib "$(b_med push-enc uploaded)"); pull plain $(mib "$(b_med pull-plain downloaded)"), encrypted $(mib "$(b_med pull-enc downloaded)")"
echo
echo "Deduplication (first round):"
echo
echo "| | plain | encrypted |"
echo "|---|---:|---:|"
printf '| a1: checkpoint directory | %s | |\n' "$(mib "$(one ckpt-a1 dir)")"
printf '| a1: image (distinct blobs) | %s (%s) | %s (%s) |\n' "$(mib "$(one image-a1-plain bytes)")" "$(one image-a1-plain blobs)" \
    "$(mib "$(one image-a1-enc bytes)")" "$(one image-a1-enc blobs)"
printf '| a1: chunks, distinct, packs | %s, %s, %s | %s, %s, %s |\n' \
    "$(one image-a1-plain chunks)" "$(one image-a1-plain distinct_chunks)" "$(one image-a1-plain packs)" \
    "$(one image-a1-enc chunks)" "$(one image-a1-enc distinct_chunks)" "$(one image-a1-enc packs)"
printf '| a1: chunk bytes stored / chunked | %s / %s | %s / %s |\n' \
    "$(mib "$(one image-a1-plain stored_bytes)")" "$(mib "$(one image-a1-plain logical_bytes)")" \
    "$(mib "$(one image-a1-enc stored_bytes)")" "$(mib "$(one image-a1-enc logical_bytes)")"
if ((DEDUP)); then
    printf '| b1 (other replica, same weights): image | %s | %s |\n' "$(mib "$(one image-b1-plain bytes)")" "$(mib "$(one image-b1-enc bytes)")"
    printf '| b1 pushed after a1 (same registry): uploaded (registry growth) | %s (%s) | %s (%s) |\n' \
        "$(mib "$(one dedup-push-b1-plain uploaded)")" "$(mib "$(one dedup-push-b1-plain registry-growth)")" \
        "$(mib "$(one dedup-push-b1-enc uploaded)")" "$(mib "$(one dedup-push-b1-enc registry-growth)")"
    printf '| b1 pulled onto the node holding a1: downloaded (store growth) | %s (%s) | %s (%s) |\n' \
        "$(mib "$(one dedup-pull-b1-plain downloaded)")" "$(mib "$(one dedup-pull-b1-plain store-growth)")" \
        "$(mib "$(one dedup-pull-b1-enc downloaded)")" "$(mib "$(one dedup-pull-b1-enc store-growth)")"
    printf '| a1 pulled again onto that node: downloaded (store growth) | %s (%s) | %s (%s) |\n' \
        "$(mib "$(one dedup-pull-a1again-plain downloaded)")" "$(mib "$(one dedup-pull-a1again-plain store-growth)")" \
        "$(mib "$(one dedup-pull-a1again-enc downloaded)")" "$(mib "$(one dedup-pull-a1again-enc store-growth)")"
fi
printf '| node store after the a1 pull holds, of the image'"'"'s layers (by registry digest) | %s of %s | %s of %s |\n' \
    "$(one pull-a1-plain store-holds-layers)" "$(one image-a1-plain layers)" \
    "$(one pull-a1-enc store-holds-layers)" "$(one image-a1-enc layers)"
echo
if ((RESTORE)); then echo "Restore of the decrypted checkpoint (gpusnap.io/restore-from through ctr): ${RESTORED:-not reached}"; fi
echo
echo "versions: $("$GPUSNAP" --version 2>/dev/null || echo gpusnap ?) from $BIN_DIR (script at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')); $(openssl version)"
echo
echo "raw times (label, seconds before sync, seconds until synced):"
sed 's/^/  /' "$RESULTS"
echo "raw bytes (label, kind, bytes):"
sed 's/^/  /' "$BYTES"
