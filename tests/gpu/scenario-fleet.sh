# tests/gpu/scenario-fleet.sh — sourced by tests/gpu/run-h200.sh (needs its containerd, helpers
# and variables). The scenario fleet: scripts/bench-fleet.sh with the real driver (issue 21
# item 6). Two replicas of `gpu_verify --fleet` (5/8 weights the same in both, 5/16 zeros,
# 1/16 changing state) are checkpointed through this run's containerd and the gpusnap shim
# (a1, b1, then a2 after a's state moved on), built, pushed to the bundle's docker-registry and
# pulled onto a second node store, beside the bundle's skopeo; bench-fleet.sh prints the table.
#
# Disk: bench-fleet.sh needs about 10 × --fleet-mib without chunk dedup (the whole-file
# baseline: 3 layouts, a registry holding them, a node store) in --fleet-dir; the default is
# $WORK/ramtmp/fleet (the 110 GiB tmpfs of --ckpt-tmp ram), --fleet-dir /var/tmp/... puts it on
# the VM's disk.
# Time: one 8 GiB round (3 checkpoints, builds, pushes and pulls on both sides) takes minutes;
# the default is no warm-up and one round (--fleet-rounds, --fleet-warmup).


# bench_gpu_hooks: the shell definitions scripts/lib/bench-replicas.sh takes from
# FLEET_GPU_HOOKS with FLEET_DRIVER=gpu (this run's containerd, GPU container and workload), on
# stdout. Also used by tests/gpu/scenario-crypt.sh.
# The file is sourced inside a function there: `declare -g`, or the variables would be local.
bench_gpu_hooks() {
    {
        declare -p SOCK NS RT DEVICES NVLIB GPU_IMAGE INTERVAL CPU PRIVILEGED NET_HOST
        declare -p GPU_EXTRA 2>/dev/null || echo 'declare -a GPU_EXTRA=()'
    } | sed 's/^declare -/declare -g -/'
    printf 'H200_WORK=%q\n' "$WORK"
    declare -f now_ms gpu_run wl_count wl_wait wl_bad | sed 's/\$WORK\b/$H200_WORK/g'
    cat <<'EOF'
ctr() { command ctr -a "$SOCK" -n "$NS" "$@"; }
# fleet_gpu_start ID: gpu_verify --fleet holding TOTAL_MIB, verified twice before it counts as up.
fleet_gpu_start() {
    rm -f "$H200_WORK/gpu/log/$1.log"
    GPU_FLEET=1 gpu_run "$1" "$TOTAL_MIB" >/dev/null &&
        wl_wait "$H200_WORK/gpu/log/$1.log" 2 $((60 + TOTAL_MIB / 256))
}
# fleet_gpu_step ID: the workload verified and rewrote its state once more.
fleet_gpu_step() {
    local n
    n=$(wl_count "$H200_WORK/gpu/log/$1.log")
    wl_wait "$H200_WORK/gpu/log/$1.log" $((n + 1)) 60
}
EOF
}

if has fleet; then
    fmib=${FLEET_MIB:-8192}
    fdir=${FLEET_DIR:-$WORK/ramtmp/fleet}
    say "fleet: scripts/bench-fleet.sh, $fmib MiB of device memory, ${FLEET_ROUNDS:-1} round(s), in $fdir"
    missing=()
    [[ -x $B/bin/docker-registry ]] || missing+=(docker-registry)
    command -v jq >/dev/null || missing+=(jq)
    command -v openssl >/dev/null || missing+=(openssl)
    if ((${#missing[@]})); then
        fail "fleet: not run: ${missing[*]} missing (the bundle carries docker-registry; jq and openssl come from the host)"
    else
        [[ -x $B/tools/skopeo ]] || note "fleet: no skopeo in the bundle: gpusnap's side only"
        mkdir -p "$(dirname "$fdir")"
        hooks=$WORK/fleet-hooks.sh
        bench_gpu_hooks >"$hooks"
        SKOPEO_B=""
        [[ -x $B/tools/skopeo ]] && SKOPEO_B=$B/tools/skopeo
        flog=$OUTDIR/fleet.txt
        t0=$(now_ms)
        FLEET_DRIVER=gpu FLEET_GPU_HOOKS=$hooks BIN_DIR=$B/bin RIG=$B PREBUILT=1 \
            REGISTRY_BIN=$B/bin/docker-registry SKOPEO=$SKOPEO_B BENCH_DIR=$fdir \
            WARMUP=${FLEET_WARMUP:-0} SLOW_MBIT=${FLEET_SLOW_MBIT:-0} \
            SLOW_ROUNDS=${FLEET_SLOW_ROUNDS:-${FLEET_ROUNDS:-1}} \
            timeout $((DEADLINE - $(elapsed_s) + 5)) \
            bash "$REPO/scripts/bench-fleet.sh" "$fmib" "${FLEET_ROUNDS:-1}" 2>&1 | tee "$flog"
        rc=${PIPESTATUS[0]}
        row fleet "bench-fleet.sh $fmib MiB" "$(($(now_ms) - t0))" - "rc=$rc"
        for f in "$WORK"/gpu/log/ra.log "$WORK"/gpu/log/rb.log; do
            bad=$(wl_bad "$f")
            [[ -z $bad ]] || fail "fleet: the workload $(basename "$f" .log) reported: $bad"
        done
        if ((rc == 0)); then ok "fleet: table above, also $flog"; else fail "fleet: bench-fleet.sh rc $rc (see $flog)"; fi
        rm -rf "$fdir"
    fi
fi
