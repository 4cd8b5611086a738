# shellcheck shell=bash
# tests/gpu/scenario-ab.sh — sourced by tests/gpu/run-h200.sh after scenarios-more.sh (needs its
# containerd, helpers and variables, and cycle_ckr, WL and b2_emit of scenarios-more.sh). The
# scenario ab: before/after timings of the shim in one call, for a refactoring whose bar is
# "restore and checkpoint within noise of today's".
#
# - Sides: `new` = the bundle's containerd-shim-gpusnap-v2 and gpusnap-runc; `base` = those of
#   .bundle/gpusnap-baseline.tar.xz (tests/gpu/make-bundle.sh with BASELINE_BIN_DIR and
#   BASELINE_COMMIT, or --baseline-only; GPU_TEST_BASELINE names another file). A side is put in
#   place by renaming its binaries over <bundle>/bin/, the first directory of containerd's PATH:
#   containerd starts a new shim process for every new container, from the file found there at
#   that moment, and the sha256 of every measured container's shim process (/proc/PID/exe) is
#   checked against the side's binary.
# - First one throw-away warm-up per side (a whole cycle at --ab-warmup-mib), then --ab-reps
#   repetitions, the side that goes first alternating (new, base; base, new; ...). Each side of
#   each repetition: the verifying workload at --ab-mib in a new container through containerd and
#   the gpusnap shim, `ctr c checkpoint --task` (timed; the workload must keep running), kill,
#   `ctr c restore --live` (timed, and timed to the first verified workload step), continuity
#   and 0 mismatches checked: scenario b's cycle (cycle_ckr).
# - Results: ab.jsonl (one object per measured side), ab.txt (per side the seconds of each
#   repetition, medians, the ratio new/base of the medians and the median of the per-repetition
#   ratios; the shim's own phase timings from its log lines, medians per side).
#
# Options: --ab-mib N (default 4096), --ab-reps R (default 3), --ab-warmup-mib N (default 1024),
# --ab-prefault G (GiB of RAM touched once before, default auto: 2 x the size + 4),
# --ab-page-fill BYTES (AB_PAGE_FILL): both sides run the bundle's binaries, `new` with
# `restore.page_fill_min_bytes = BYTES` in the gpusnap config and `base` with it at 0 (the config
# is read at each container's create, so a side is put in place by rewriting it).
# Time: a repetition starts only when both its sides fit before --deadline, reckoning 20 s + 6 s
# per GiB a side. On the H200 (bench2, 2026-12-04) 8 GiB took ~32 s for `ctr c checkpoint --task`
# and ~11 s to restore, so 4 GiB is about 30 s a side with the start and stop: with ~40 s of
# setup and the 1 GiB warm-ups, 3 repetitions take about 4-4.5 min, 5 about 6 min. --cpu at
# 64 MiB, 2 repetitions: 2 min.

AB_MIB=${AB_MIB:-4096}
AB_REPS=${AB_REPS:-3}
AB_WARMUP=${AB_WARMUP:-1024}
AB_PREFAULT=${AB_PREFAULT:-auto}
AB_JSONL=$OUTDIR/ab.jsonl
AB_DIR=$WORK/ab
AB_BINS=(containerd-shim-gpusnap-v2 gpusnap-runc)
AB_PAGE_FILL=${AB_PAGE_FILL:-}

# ab_setup: the baseline unpacked into $AB_DIR/base, the bundle's binaries kept in $AB_DIR/new.
ab_setup() {
    local tarball=${GPU_TEST_BASELINE:-$(dirname "$BUNDLE_TAR")/gpusnap-baseline.tar.xz} b side
    if [[ -n $AB_PAGE_FILL ]]; then
        rm -rf "$AB_DIR"
        for side in new base; do
            mkdir -p "$AB_DIR/$side/bin"
            for b in "${AB_BINS[@]}"; do cp -p "$B/bin/$b" "$AB_DIR/$side/bin/$b"; done
        done
        AB_NEW="page fill $AB_PAGE_FILL"
        AB_COMMIT="page fill off"
        info "ab: both sides run the bundle's shim; new: restore.page_fill_min_bytes = $AB_PAGE_FILL, base: off"
        return 0
    fi
    if [[ ! -f $tarball ]]; then
        fail "ab: no baseline at $tarball (tests/gpu/make-bundle.sh with BASELINE_BIN_DIR=DIR BASELINE_COMMIT=SHA, or --baseline-only; carry .bundle)"
        return 1
    fi
    if [[ -f $tarball.sha256 ]] && ! (cd "$(dirname "$tarball")" && sha256sum -c --status "$(basename "$tarball").sha256"); then
        fail "ab: baseline checksum mismatch ($tarball)"
        return 1
    fi
    rm -rf "$AB_DIR"
    mkdir -p "$AB_DIR/new/bin"
    if ! tar -C "$AB_DIR" -xJf "$tarball" || [[ ! -d $AB_DIR/gpusnap-baseline ]]; then
        fail "ab: unpacking $tarball failed"
        return 1
    fi
    mv "$AB_DIR/gpusnap-baseline" "$AB_DIR/base"
    for b in "${AB_BINS[@]}"; do
        [[ -x $AB_DIR/base/bin/$b ]] || { fail "ab: the baseline has no bin/$b"; return 1; }
        cp -p "$B/bin/$b" "$AB_DIR/new/bin/$b"
    done
    AB_COMMIT=$(head -n 1 "$AB_DIR/base/COMMIT" 2>/dev/null)
    AB_NEW=$(sed -n 's/^git: //p' "$B/VERSIONS" | head -n 1)
    for side in new base; do
        info "ab: $side shim: $("$AB_DIR/$side/bin/containerd-shim-gpusnap-v2" -v 2>&1 | tr '\n' ' ')sha256 $(sha256sum "$AB_DIR/$side/bin/containerd-shim-gpusnap-v2" | cut -c1-16)"
    done
    info "ab: new = the bundle (git ${AB_NEW:-?}), base = commit ${AB_COMMIT:-?}"
    if cmp -s "$AB_DIR/new/bin/containerd-shim-gpusnap-v2" "$AB_DIR/base/bin/containerd-shim-gpusnap-v2"; then
        note "ab: the baseline's shim is the bundle's (same bytes): both sides measure one binary"
    fi
}

# ab_install SIDE: SIDE's binaries renamed over the bundle's bin/ (a running shim keeps its own);
# with --ab-page-fill, SIDE's restore.page_fill_min_bytes written into the gpusnap config
# ([restore] is its last table).
ab_install() {
    local b
    if [[ -n $AB_PAGE_FILL ]]; then
        sed -i '/^page_fill_min_bytes/d' "$CFG"
        # base: explicitly off (the node's default is on).
        if [[ $1 == new ]]; then echo "page_fill_min_bytes = \"$AB_PAGE_FILL\""; else echo "page_fill_min_bytes = 0"; fi >>"$CFG"
        ((CPU == 0)) && cp "$CFG" /etc/gpusnap/config.toml
        AB_SIDE=$1
        return 0
    fi
    for b in "${AB_BINS[@]}"; do
        install -m 0755 "$AB_DIR/$1/bin/$b" "$B/bin/.ab-$b" && mv -f "$B/bin/.ab-$b" "$B/bin/$b" ||
            { fail "ab: installing $1's $b failed"; return 1; }
    done
    AB_SIDE=$1
}

# ab_shim_is SIDE ID PHASE: the shim process of container ID runs SIDE's binary.
ab_shim_is() {
    local pid ppid exe want got
    pid=$(ctr t ls 2>/dev/null | awk -v i="$2" '$1 == i {print $2}')
    ppid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)
    exe=$(readlink "/proc/$ppid/exe" 2>/dev/null)
    if [[ $exe != *containerd-shim-gpusnap-v2* ]]; then
        note "$3: the parent of task pid ${pid:-?} is ${exe:-unknown}, not a gpusnap shim: which side ran is unchecked"
        return 0
    fi
    want=$(sha256sum "$AB_DIR/$1/bin/containerd-shim-gpusnap-v2" | cut -d' ' -f1)
    got=$(sha256sum "/proc/$ppid/exe" 2>/dev/null | cut -d' ' -f1)
    if [[ $got == "$want" ]]; then
        info "$3: shim pid $ppid runs the $1 binary"
    else
        fail "$3: shim pid $ppid runs ${got:0:16}, not the $1 binary (${want:0:16})"
        return 1
    fi
}

# ab_cycle SIDE REP POSITION MIB: one side of one repetition (REP 0: the warm-up, not recorded).
ab_cycle() {
    local side=$1 rep=$2 pos=$3 mib=$4 id phase log t0 ok=1 fsh ck_sh="" rs_sh="" mf=null
    id=ab-$side-r$rep
    phase=ab-$side-r$rep
    log=$WORK/gpu/log/$id.log
    say "ab: $side, rep $rep (position $pos), $mib MiB$( ((rep == 0)) && echo ', warm-up: not measured')"
    ab_install "$side" || return 1
    rm -f "$log"
    t0=$(now_ms)
    if ! gpu_run "$id" "$mib" || ! WL wait "$log" 0 3 1 $((60 + mib / 256)) >/dev/null; then
        fail "$phase: the workload did not start: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
        ctr_stop "$id"
        return 1
    fi
    info "$phase: workload up in $(($(now_ms) - t0)) ms"
    ab_shim_is "$side" "$id" "$phase (checkpointed container)" || ok=0
    CK_MS="" RS_MS="" CYCLE_FIRST_MS="" CYCLE_CK_SHIM=""
    CYCLE_MIB=$mib cycle_ckr "$phase" "$id" "$log" || ok=0
    ck_sh=$CYCLE_CK_SHIM
    rs_sh=$(shim_fields 'restore complete')
    if [[ -n $RS_MS ]]; then
        ab_shim_is "$side" "$id" "$phase (restored container)" || ok=0
        check_clean "$log" "$phase" || ok=0
    fi
    [[ -f $WORK/logs/manifest-$phase.json ]] && mf=$(manifest_phases "$WORK/logs/manifest-$phase.json")
    ctr_stop "$id"
    ctr images rm --sync "localhost/gpusnap-gpu/$phase:ck" >/dev/null 2>&1
    gpu_wait_free
    [[ -n $CK_MS && -n $RS_MS && -n $CYCLE_FIRST_MS ]] || ok=0
    ((rep == 0)) && { info "$phase: warm-up: checkpoint ${CK_MS:-?} ms, restore ${RS_MS:-?} ms, first step after ${CYCLE_FIRST_MS:-?} ms"; return 0; }
    BENCH2_JSONL=$AB_JSONL b2_emit side="$side" rep="$rep" position="$pos" size_mib="$mib" \
        commit="$([[ -z $AB_PAGE_FILL ]] && echo 'git ')$([[ $side == base ]] && echo "$AB_COMMIT" || echo "$AB_NEW")" \
        ck_ms="$CK_MS" ck_shim_total_ms="$(ab_field "$ck_sh" total_ms)" ck_manifest="$mf" \
        restore_ms="$RS_MS" restore_first_step_ms="$CYCLE_FIRST_MS" \
        restore_shim_total_ms="$(ab_field "$rs_sh" total_ms)" \
        shim_checkpoint="$ck_sh" shim_restore="$rs_sh" ok="$ok"
    info "$phase: checkpoint $CK_MS ms (shim: $ck_sh), restore $RS_MS ms, first verified step $CYCLE_FIRST_MS ms after the restore began (shim: $rs_sh)"
}
# ab_field TEXT NAME: NAME=<digits> out of "k=v ..." TEXT.
ab_field() { grep -oE "\\b$2=[0-9]+" <<<"$1" | tail -n 1 | cut -d= -f2; }

# ab_table: ab.txt from ab.jsonl.
ab_table() {
    python3 - "$AB_JSONL" "$OUTDIR/ab.txt" "${AB_NEW:-?}" "${AB_COMMIT:-?}" "$AB_PAGE_FILL" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
new_c, base_c = sys.argv[3], sys.argv[4]
out = []
reps = sorted({r["rep"] for r in rows})
size = rows[0]["size_mib"] if rows else "?"
if sys.argv[5]:
    head = "ab: new (the bundle's shim, %s) vs base (the same shim, %s)" % (new_c, base_c)
else:
    head = "ab: new (bundle, git %s) vs base (commit %s)" % (new_c, base_c)
out.append("%s, %s MiB, %d repetition(s), the side going first alternating" % (head, size, len(reps)))
def val(side, rep, key):
    for r in rows:
        if r["side"] == side and r["rep"] == rep and r.get("ok") == 1:
            return r.get(key)
    return None
def fmt(v):
    return "%.3f" % (v / 1000.0) if isinstance(v, (int, float)) else "-"
order = ["rep%d: %s" % (k, ", ".join(r["side"] for r in sorted((r for r in rows if r["rep"] == k),
                                                                   key=lambda r: r["position"]))) for k in reps]
out.append("order (first side first): " + "; ".join(order))
head = "%-44s" % "seconds" + "".join("%9s" % ("rep%d" % k) for k in reps) + "%9s" % "median"
out.append(head)
ratios = []
for key, label in (("ck_ms", "checkpoint (ctr c checkpoint --task)"),
                   ("ck_shim_total_ms", "  shim's checkpoint total"),
                   ("restore_ms", "restore (ctr c restore --live)"),
                   ("restore_first_step_ms", "restore -> first verified step"),
                   ("restore_shim_total_ms", "  shim's restore total")):
    med = {}
    for side in ("new", "base"):
        vs = [val(side, k, key) for k in reps]
        got = [v for v in vs if isinstance(v, (int, float))]
        med[side] = statistics.median(got) if got else None
        out.append("%-44s" % ("%-4s %s" % (side, label)) + "".join("%9s" % fmt(v) for v in vs)
                   + "%9s" % fmt(med[side]))
    pair = [val("new", k, key) / val("base", k, key) for k in reps
            if isinstance(val("new", k, key), (int, float)) and val("base", k, key)]
    r = (med["new"] / med["base"]) if med["new"] is not None and med["base"] else None
    ratios.append((label.strip(), r, statistics.median(pair) if pair else None, pair))
out.append("")
out.append("%-44s %12s %16s  %s" % ("ratio new/base", "of medians", "median of reps", "per repetition"))
for label, r, pm, pair in ratios:
    out.append("%-44s %12s %16s  %s" % (label, "%.3f" % r if r else "-", "%.3f" % pm if pm else "-",
                                        " ".join("%.3f" % p for p in pair)))
# The shim's phases: every k_ms field of its "checkpoint sealed" / "restore complete" lines.
def phases(side, key):
    acc = {}
    for r in rows:
        if r["side"] != side or r.get("ok") != 1:
            continue
        for k, v in re.findall(r"\b([a-z_]+_ms)=(\d+)", r.get(key) or ""):
            acc.setdefault(k, []).append(int(v))
    return {k: statistics.median(v) for k, v in acc.items()}
for key, label in (("shim_checkpoint", "checkpoint"), ("shim_restore", "restore")):
    n, b = phases("new", key), phases("base", key)
    names = sorted(set(n) | set(b), key=lambda k: (k == "total_ms", k))
    if not names:
        continue
    out.append("")
    out.append("%-46s %10s %10s %8s" % ("shim %s phases, median ms" % label, "new", "base", "ratio"))
    for k in names:
        nv, bv = n.get(k), b.get(k)
        out.append("  %-44s %10s %10s %8s" % (k, nv if nv is not None else "-", bv if bv is not None else "-",
                                              "%.2f" % (nv / bv) if nv is not None and bv else "-"))
bad = [r for r in rows if r.get("ok") != 1]
out.append("")
out.append("measured sides verified: %d of %d (shim binary, continuity, 0 mismatches)" % (len(rows) - len(bad), len(rows)))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

if has ab; then
    say "ab: new vs base shim, $AB_MIB MiB, $AB_REPS rep(s), warm-up $AB_WARMUP MiB per side"
    : >"$AB_JSONL"
    if ab_setup; then
        pf=$AB_PREFAULT
        if [[ $pf == auto ]]; then
            memg=$(($(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1048576))
            pf=$((2 * AB_MIB / 1024 + 4))
            ((pf > memg - 16)) && pf=$((memg - 16))
            ((CPU)) && pf=1
            ((pf < 0)) && pf=0
        fi
        if ((pf > 0)) && time_left 60; then
            t0=$(now_ms)
            dd if=/dev/zero of="$WORK/ramtmp/prefault" bs=64M count=$((pf * 16)) status=none
            rm -f "$WORK/ramtmp/prefault"
            info "ab: touched $pf GiB of RAM through the tmpfs in $(($(now_ms) - t0)) ms"
        fi
        for side in new base; do
            if time_left $((20 + AB_WARMUP * 6 / 1024 + 2 * (20 + AB_MIB * 6 / 1024))); then
                ab_cycle "$side" 0 warm-up "$AB_WARMUP"
            else
                note "ab: warm-up of $side skipped: past the deadline"
            fi
        done
        est=$((20 + AB_MIB * 6 / 1024))
        for ((rep = 1; rep <= AB_REPS; rep++)); do
            order=(new base)
            ((rep % 2 == 0)) && order=(base new)
            # Both sides of a repetition or neither: a lone side would unbalance the medians.
            if ! time_left $((2 * est)); then
                note "ab: rep $rep and later skipped: about $((2 * est)) s needed, $((DEADLINE - $(elapsed_s))) s left"
                break
            fi
            pos=1
            for side in "${order[@]}"; do
                ab_cycle "$side" "$rep" "$pos" "$AB_MIB"
                pos=2
            done
        done
        ab_install new
        say "ab: table"
        [[ -s $AB_JSONL ]] && ab_table
    fi
fi
