# shellcheck shell=bash
# tests/gpu/scenario-crypt.sh — sourced by tests/gpu/run-h200.sh after scenario-fleet.sh (needs
# its containerd, helpers, variables and bench_gpu_hooks). The scenario crypt (issue 22):
# scripts/bench-crypt.sh with the real driver. A `gpu_verify --fleet` replica of --crypt-mib
# (default 8192) is checkpointed through this run's containerd and the gpusnap shim (`ctr tasks
# checkpoint --image-path`), with a second replica for the dedup figures; the checkpoint is
# built, pushed to the bundle's docker-registry (HTTPS, a CA made with the host's openssl) and
# pulled with --extract onto an empty node, plain and encrypted for an EC P-256 key
# (`--encrypt-recipient jwe:pub.pem`, `--decryption-key priv.pem`); bench-crypt.sh prints build,
# push and pull+extract times side by side and the dedup table. The first encrypted image is
# also pulled into this run's restore.checkpoint_root and restored by `gpusnap.io/restore-from`
# through ctr (crypt_gpu_restore below): the restored gpu_verify must log 3 more verified steps
# of the same run, and its log must hold no mismatch at the end.
#
# Disk: about 6 × --crypt-mib at once in --crypt-dir, default $WORK/ramtmp/crypt (the 110 GiB
# tmpfs of --ckpt-tmp ram), plus the restored checkpoint under $WORK/ramtmp/checkpoints.
# Time at 8 GiB: two replicas started and checkpointed, b1 built twice, then per round two
# builds, pushes and pulls (the first also verifies and measures dedup and restores): about
# 5-7 minutes with --crypt-rounds 2 (the default) and --crypt-warmup 0 (the default); a second
# round that would end past the deadline is not started (BENCH_DEADLINE), so one round is the
# floor. Run it alone: `--scenarios crypt --deadline 590`.

if has crypt; then
    cmib=${CRYPT_MIB:-8192}
    cdir=${CRYPT_DIR:-$WORK/ramtmp/crypt}
    say "crypt: scripts/bench-crypt.sh, $cmib MiB of device memory, ${CRYPT_ROUNDS:-2} round(s), in $cdir"
    missing=()
    [[ -x $B/bin/docker-registry ]] || missing+=(docker-registry)
    for t in jq openssl curl ss; do command -v $t >/dev/null || missing+=("$t"); done
    croot=$(sed -n 's/^checkpoint_root = "\(.*\)"$/\1/p' "$CFG")
    if ((${#missing[@]})); then
        fail "crypt: not run: ${missing[*]} missing (the bundle carries docker-registry; jq, openssl, curl and ss come from the host)"
    elif [[ -z $croot ]]; then
        fail "crypt: not run: no restore.checkpoint_root in $CFG"
    else
        mkdir -p "$(dirname "$cdir")"
        hooks=$WORK/crypt-hooks.sh
        {
            bench_gpu_hooks
            printf 'CRYPT_RESTORE_ROOT=%q\n' "$croot"
            cat <<'EOF'
# crypt_gpu_restore ID NAME: checkpoint NAME (under CRYPT_RESTORE_ROOT, the shim's
# restore.checkpoint_root) restored into a new container ID by gpusnap.io/restore-from; the
# restored gpu_verify must log 3 more verified steps of the same run (not a fresh start) and
# no mismatch. Prints the first step after the restore, or why it failed.
crypt_gpu_restore() {
    local log=$H200_WORK/gpu/log/$1.log n starts run first bad rc saved=("${GPU_EXTRA[@]}")
    n=$(wl_count "$log")
    starts=$(grep -c '^start ' "$log")
    run=$(grep '^step=' "$log" | tail -n 1 | sed -n 's/.* run=\([^ ]*\).*/\1/p')
    GPU_EXTRA=(--annotation "gpusnap.io/restore-from=$2")
    gpu_run "$1" "$TOTAL_MIB" >/dev/null
    rc=$?
    GPU_EXTRA=("${saved[@]}")
    ((rc == 0)) || { echo "ctr run --annotation gpusnap.io/restore-from=$2 failed (rc $rc)"; return 1; }
    if ! wl_wait "$log" $((n + 3)) $((60 + TOTAL_MIB / 256)); then
        echo "no 3 verified steps after the restore: $(tail -n 2 "$log" | tr '\n' ' ')"
        return 1
    fi
    first=$(grep '^step=' "$log" | sed -n "$((n + 1))p")
    bad=$(wl_bad "$log")
    if [[ -n $bad ]]; then echo "the workload reported: $bad"; return 1; fi
    if (($(grep -c '^start ' "$log") != starts)); then echo "the workload started afresh (a new start line): not restored"; return 1; fi
    if [[ $first != *" run=$run "* ]]; then echo "first step after the restore is of another run (expected run=$run): $first"; return 1; fi
    echo "$(cut -d' ' -f1-3 <<<"$first") run=$run (checkpointed run), 0 mismatches"
}
EOF
        } >"$hooks"
        clog=$OUTDIR/crypt.txt
        t0=$(now_ms)
        # No round that would end past the run's deadline starts after the first.
        FLEET_DRIVER=gpu FLEET_GPU_HOOKS=$hooks BIN_DIR=$B/bin RIG=$B PREBUILT=1 \
            REGISTRY_BIN=$B/bin/docker-registry BENCH_DIR=$cdir \
            WARMUP=${CRYPT_WARMUP:-0} BENCH_DEADLINE=$((T_START / 1000 + DEADLINE)) \
            timeout $((DEADLINE - $(elapsed_s) + 5)) \
            bash "$REPO/scripts/bench-crypt.sh" "$cmib" "${CRYPT_ROUNDS:-2}" 2>&1 | tee "$clog"
        rc=${PIPESTATUS[0]}
        row crypt "bench-crypt.sh $cmib MiB" "$(($(now_ms) - t0))" - "rc=$rc"
        for f in "$WORK"/gpu/log/ra.log "$WORK"/gpu/log/rb.log; do
            bad=$(wl_bad "$f")
            [[ -z $bad ]] || fail "crypt: the workload $(basename "$f" .log) reported: $bad"
        done
        if ((rc == 0)) && grep -q '^Restore of the decrypted checkpoint .*: gpu_verify restored' "$clog"; then
            ok "crypt: $cmib MiB checkpoint encrypted, pushed, pulled, decrypted and restored; the restored workload verified with 0 mismatches ($(grep -o 'step=[0-9]* mismatches=0' "$clog" | head -n 1))"
            ok "crypt: table above, also $clog"
        else
            fail "crypt: bench-crypt.sh rc $rc, or no restore line (see $clog)"
        fi
        rm -rf "$cdir" "${croot:?}/crypt-a1"
    fi
fi
