# tests/gpu/scenario-volume.sh — sourced by tests/gpu/run-h200.sh (its containerd with CRI, its
# helpers and variables, and the k8s helpers of tests/gpu/scenarios-more.sh). The scenario
# volume: issue 30 on the GPU. A pod spec alone restores a GPU container from a checkpoint image
# in a registry, beside the reference path, driven through CRI as the kubelet drives it.
#
# - gpusnap: two replicas (pods va and vb, `gpu_verify --fleet`: 5/8 of the device memory the
#   same weights in both) under the gpusnap handler, checkpointed by `crictl checkpoint
#   --export` (the kubelet checkpoint API's CRI call), built as chunked images (`gpusnap image
#   build --layout`) and served by tests/gpu/ocireg.py (read-only: it counts the bytes a node
#   fetches). The node agent's push (`gpusnap.io/checkpoint-to`) of such an archive to a
#   registry that takes pushes (the bundle's docker-registry over HTTPS), and the restore from
#   the pushed image by this scenario's image-volume path, is the scenario push
#   (tests/gpu/scenario-push.sh); tests/tests/k8s_push.rs tests the same flow on the CPU.
# - reference: the same workload in a pod under containerd's runc.v2 handler with CRIU's
#   cuda_plugin.so installed (cuda-checkpoint on PATH), checkpointed by `crictl checkpoint
#   --export`; its archive becomes the checkpoint image containerd's own CRI restore takes
#   (`ocireg.py checkpoint-image`: the archive as the one layer, the index annotated as
#   checkpointctl/buildah do).
# - Each repetition, on a fresh node (the image removed from containerd with `crictl rmi`, the
#   registry's byte count says it was fetched whole), the sides alternating which goes first:
#   `crictl pull` (the kubelet pulls image volumes and container images before
#   CreateContainer), then runp + create + start: gpusnap with the image as an image volume at
#   /gpusnap/checkpoint and the pod annotation `gpusnap.io/restore-from-volume`, the reference
#   with the checkpoint image as the container's image. Reported: CreateContainer -> first
#   verified step, pull -> first verified step, and the shim's phases (the volume copy, the
#   checks: validate, privilege check, GPU gate; CRIU; CUDA).
# - Then, with va's image still on the node, vb's image is pulled and restored: the registry's
#   byte count is what a node holding another replica's chunks fetched.
# Every restore is checked for continuity and 0 mismatches. Results: volume.jsonl (one object
# per measured restore), volume.txt (the table with medians).
#
# - With VOL_PAGE_FILL (--vol-page-fill BYTES), a third side, fill: gpusnap's restore of the same
#   image with restore.page_fill_min_bytes = BYTES in the node's config (the page images of at
#   least that size read from the volume's chunks instead of copied, the large private memory
#   written by the shim while CRIU leaves the tasks stopped); gpusnap's side runs with it at 0
#   (off: every file copied, CRIU writes every page). Without VOL_PAGE_FILL, gpusnap's side runs
#   with the node's default (16 MiB since 2026-12-05).
#
# - VOL_WARM=off (--vol-warm off) leaves vb out (its checkpoint, build and the warm pull), for a
#   call that measures only the fresh-node restores.
# - va's CRIU images other than the page images (mm, core, pstree, page maps; a few KiB) are
#   kept in $OUTDIR/va-criu-images.tar.gz: what the page fill splits of them is read back with
#   `cargo run -p gpusnap-criu-images --example split_plan -- DIR` on the unpacked tarball.
#
# Options (environment): VOL_MIB (default 8192), VOL_REPS (default 2), VOL_PAGE_FILL, VOL_WARM.

VOL_MIB=${VOL_MIB:-8192}
VOL_REPS=${VOL_REPS:-2}
VOL_PAGE_FILL=${VOL_PAGE_FILL:-}
VOL_WARM=${VOL_WARM:-on}
VOL_MOUNT=/gpusnap/checkpoint
VOL_JSONL=$OUTDIR/volume.jsonl
VOL_COUNT=$WORK/logs/ocireg-count.txt

# vol_fetched: bytes the registry has served so far (every blob body, manifests included).
# (printf: awk's print turns a sum past 2^31 into 2.2e+09, which bash's arithmetic refuses.)
vol_fetched() { awk '{s += $2} END {printf "%.0f\n", s}' "$VOL_COUNT" 2>/dev/null || echo 0; }
vol_emit() { BENCH2_JSONL=$VOL_JSONL b2_emit "$@"; }
# vol_field TEXT NAME: NAME=<digits> out of TEXT.
vol_field() { grep -oE "\\b$2=[0-9]+" <<<"$1" | tail -n 1 | cut -d= -f2; }

# vol_up NAME RUNTIME: the fleet workload in a CRI pod under RUNTIME, verified up; sets KPOD KCTR.
vol_up() {
    local name=$1 runtime=$2
    rm -f "$WORK/gpu/log/$name.log"
    if ! K_RUNTIME=$runtime GPU_FLEET=1 k8s_start "$name" "$K8S_IMAGE" "$name" "$VOL_MIB" ||
        ! WL wait "$WORK/gpu/log/$name.log" 0 2 1 $((60 + VOL_MIB / 256)) >/dev/null; then
        fail "volume $name: the workload did not start in its pod ($runtime)"
        k8s_stop_pod "$KPOD"
        return 1
    fi
    ok "volume $name: $VOL_MIB MiB fleet workload up under $runtime"
}

# vol_checkpoint NAME [reference]: crictl checkpoint --export of NAME's container (KCTR); the pod
# (KPOD) is removed after. Sets VOL_M0_<NAME> (mark before the checkpoint) and VOL_MK_<NAME>
# (mark at the pod's removal). The reference's archive has no gpusnap manifest to look at.
vol_checkpoint() {
    local name=$1 log=$WORK/gpu/log/$1.log t0 archive=$WORK/ramtmp/$1.tar
    printf -v "VOL_M0_$name" %s "$(WL mark "$log")"
    if [[ ${2:-} == reference ]]; then
        t0=$(now_ms)
        if ! crictl checkpoint --export="$archive" "$KCTR" >"$WORK/logs/volume-$name-checkpoint.out" 2>&1; then
            fail "volume $name: crictl checkpoint (runc.v2 + CRIU's cuda plugin) failed: $(tail -n 3 "$WORK/logs/volume-$name-checkpoint.out" | tr '\n' ' ')"
            return 1
        fi
        ok "volume $name: crictl checkpoint --export (runc.v2 + CRIU's cuda plugin) in $(($(now_ms) - t0)) ms ($(stat -c %s "$archive") bytes)"
    else
        k8s_checkpoint "$KCTR" "$archive" "volume-$name" || return 1
    fi
    k8s_stop_pod "$KPOD"
    printf -v "VOL_MK_$name" %s "$(WL mark "$log")"
    gpu_wait_free
}

# vol_fill SIDE: restore.page_fill_min_bytes in the node's gpusnap config for SIDE (fill: on,
# else off); the shim reads the config for each container. [restore] is the config's last table.
vol_fill() {
    [[ -n $VOL_PAGE_FILL ]] || return 0
    sed -i '/^page_fill_min_bytes/d' "$CFG"
    # gpusnap: explicitly off (the node's default is on), so that the two sides differ by it.
    if [[ $1 == fill ]]; then echo "page_fill_min_bytes = \"$VOL_PAGE_FILL\""; else echo "page_fill_min_bytes = 0"; fi >>"$CFG"
    ((CPU == 0)) && cp "$CFG" /etc/gpusnap/config.toml
    return 0
}

# vol_fresh REF: the image gone from containerd (the node never had it).
vol_fresh() {
    crictl rmi "$1" >/dev/null 2>&1
    if crictl inspecti "$1" >/dev/null 2>&1; then
        fail "volume: $1 is still on the node after crictl rmi"
        return 1
    fi
}

# vol_restore SIDE NAME REF REP ORDER: one measured restore of NAME's checkpoint (pull, runp,
# create, start, first verified step), verified, the pod removed afterwards. VOL_PULL_CREDS
# (USER:PASSWORD): crictl pull --creds (scenario push's registry).
vol_restore() {
    local side=$1 name=$2 ref=$3 rep=$4 order=$5 log=$WORK/gpu/log/$2.log
    local m0_var=VOL_M0_$name mk_var=VOL_MK_$name
    local m0=${!m0_var} mkill=${!mk_var} mk t0 t_pull f0 fetched first sh vol="" rc=0 pod=$name-$side-r$rep
    say "volume $side, rep $rep ($order in its rep): $name from $ref"
    f0=$(vol_fetched)
    t0=$(now_ms)
    if ! crictl pull ${VOL_PULL_CREDS:+--creds "$VOL_PULL_CREDS"} "$ref" >"$WORK/logs/$pod-pull.out" 2>&1; then
        fail "volume $pod: crictl pull $ref failed: $(tail -n 2 "$WORK/logs/$pod-pull.out" | tr '\n' ' ')"
        return 1
    fi
    t_pull=$(($(now_ms) - t0))
    fetched=$(($(vol_fetched) - f0))
    mk=$(WL mark "$log")
    log_mark
    vol_fill "$side"
    if [[ $side != reference ]]; then
        K_IMAGE_MOUNT="$VOL_MOUNT=$ref" k8s_start "$pod" "$K8S_IMAGE" "$name" "$VOL_MIB" \
            "gpusnap.io/restore-from-volume=$VOL_MOUNT" || rc=1
    else
        K_RUNTIME=runc k8s_start "$pod" "$ref" "$name" "$VOL_MIB" || rc=1
    fi
    if ((rc)); then
        shim_lines | tail -n 10 | sed 's/^/  containerd: /'
        k8s_stop_pod "$KPOD"
        return 1
    fi
    local create_t0=$K_CREATE_T0 create_ms=$K_CREATE_MS start_ms=$K_START_MS t_first="" t_pf="" fails=0
    if WL wait "$log" "$mk" 3 1 $((60 + VOL_MIB / 256)) >/dev/null; then
        first=$(WL firstts "$log" "$mk" 1)
        if [[ $first =~ ^[0-9]+$ ]]; then
            t_first=$((first - create_t0))
            t_pf=$((first - t0))
        fi
        wl_report < <(WL continuity "$log" "volume $pod" "$m0" "$mkill" 1 "$mk") || fails=1
    else
        fail "volume $pod: no steps after the restore: $(tail -n 2 "$log" | tr '\n' ' ')"
        fails=1
    fi
    sh=""
    [[ $side != reference ]] && sh=$(shim_fields 'restore complete')
    vol=$(tail -n +"$((LOGMARK + 1))" "$WORK/containerd.log" | grep -F 'checkpoint of the image volume ready' | tail -n 1)
    local copy_ms checks=""
    copy_ms=$(vol_field "$vol" elapsed_ms)
    if [[ -n $sh ]]; then
        local v1 v2 v3
        v1=$(vol_field "$sh" validate_ms) v2=$(vol_field "$sh" privilege_check_ms) v3=$(vol_field "$sh" gpu_gate_ms)
        checks=$((${v1:-0} + ${v2:-0} + ${v3:-0}))
    fi
    local fetched_text="$fetched bytes fetched"
    # Only tests/gpu/ocireg.py counts what it serves; another registry (scenario push's) does not.
    [[ -e $VOL_COUNT ]] || fetched_text="bytes fetched not counted by this registry"
    info "volume $pod: pull $t_pull ms ($fetched_text), create $create_ms + start $start_ms ms, CreateContainer -> first verified step $t_first ms, pull -> first step $t_pf ms${copy_ms:+; volume copy $copy_ms ms}${sh:+; shim: $sh}"
    vol_emit side="$side" name="$name" rep="$rep" order="$order" size_mib="$VOL_MIB" \
        pull_ms="$t_pull" fetched_bytes="$fetched" create_ms="$create_ms" start_ms="$start_ms" \
        create_first_step_ms="$t_first" pull_first_step_ms="$t_pf" volume_copy_ms="$copy_ms" \
        checks_ms="$checks" shim_total_ms="$(vol_field "$sh" total_ms)" \
        criu_restore_ms="$(vol_field "$sh" criu_restore_ms)" cuda_restore_ms="$(vol_field "$sh" cuda_restore_ms)" \
        validate_ms="$(vol_field "$sh" validate_ms)" privilege_check_ms="$(vol_field "$sh" privilege_check_ms)" \
        gpu_gate_ms="$(vol_field "$sh" gpu_gate_ms)" criu_prepare_ms="$(vol_field "$sh" criu_prepare_ms)" \
        page_fill_ms="$(vol_field "$sh" page_fill_ms)" page_fill_bytes="$(vol_field "$sh" page_fill_bytes)" \
        page_fill_zero_bytes="$(vol_field "$sh" page_fill_zero_bytes)" ok="$((1 - fails))" shim="$sh"
    k8s_stop_pod "$KPOD"
    gpu_wait_free
    vol_fill off
    if [[ $side != reference ]]; then
        # The pod's removal takes the node's copy of the volume's checkpoint with it.
        # The shim drops its hold when containerd deletes the container, which may finish after
        # crictl rmp returns: wait up to 15 s.
        local left i
        for i in $(seq 30); do
            left=$(find "$WORK/ramtmp/checkpoints/.gpusnap-volumes" -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)
            [[ -z $left ]] && break
            sleep 0.5
        done
        [[ -z $left ]] && ok "volume $pod: no copy left in .gpusnap-volumes after the pod's removal" ||
            fail "volume $pod: left in .gpusnap-volumes 15 s after the pod's removal: $left"
    fi
}

# vol_table: volume.txt from volume.jsonl (medians per side, the ratio, the bytes fetched).
vol_table() {
    python3 - "$VOL_JSONL" "$OUTDIR/volume.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = []
def med(side, key, name=None):
    v = [r[key] for r in rows if r.get("side") == side and r.get(key) is not None
         and (name is None or r.get("name") == name) and r.get("rep", 0) > 0]
    return (statistics.median(v), len(v)) if v else (None, 0)
out.append("volume: restore on a fresh node, medians of alternating repetitions (n = repetitions)")
sides = [s for s in ("gpusnap", "fill") if any(r.get("side") == s for r in rows)]
out.append("%-34s %14s %14s %8s" % ("", "gpusnap", "reference", "ratio"))
for side in sides:
    if side != "gpusnap":
        out.append("side %s (restore.page_fill_min_bytes on):" % side)
    for key, label in (("create_first_step_ms", "CreateContainer -> first step ms"),
                       ("pull_first_step_ms", "pull -> first step ms"),
                       ("pull_ms", "crictl pull ms"),
                       ("fetched_bytes", "bytes fetched")):
        g, ng = med(side, key)
        r, nr = med("reference", key)
        ratio = "%.2f" % (g / r) if g is not None and r else "-"
        out.append("%-34s %14s %14s %8s" % (label, "%s (n=%d)" % (g, ng) if g is not None else "-",
                                            "%s (n=%d)" % (r, nr) if r is not None else "-", ratio))
    for key in ("volume_copy_ms", "checks_ms", "validate_ms", "privilege_check_ms", "gpu_gate_ms",
                "criu_prepare_ms", "criu_restore_ms", "page_fill_ms", "page_fill_bytes",
                "page_fill_zero_bytes", "cuda_restore_ms", "shim_total_ms"):
        g, ng = med(side, key)
        out.append("  %s %-24s %s (n=%d)" % (side, key, g, ng))
if "fill" in sides:
    # Per repetition, fill against gpusnap in the same repetition: the setting's own effect.
    pairs = []
    for rep in sorted({r["rep"] for r in rows if r.get("rep", 0) > 0}):
        f = [r["create_first_step_ms"] for r in rows if r.get("rep") == rep and r.get("side") == "fill" and r.get("create_first_step_ms")]
        g = [r["create_first_step_ms"] for r in rows if r.get("rep") == rep and r.get("side") == "gpusnap" and r.get("create_first_step_ms")]
        if f and g:
            pairs.append(f[0] / g[0])
    if pairs:
        out.append("fill / gpusnap, CreateContainer -> first step, per repetition: %s; median %.3f"
                   % (", ".join("%.3f" % p for p in pairs), statistics.median(pairs)))
warm = [r for r in rows if r.get("rep") == 0]
for r in warm:
    out.append("with another replica's chunks on the node: %s fetched %s bytes of %s MiB device memory "
               "(%.4f; target <= %.4f)" % (r["name"], r["fetched_bytes"], r["size_mib"],
                                           r["fetched_bytes"] / (r["size_mib"] << 20), 0.6 / 8))
bad = [r for r in rows if r.get("ok") != 1]
out.append("restores verified: %d of %d (continuity, 0 mismatches)" % (len(rows) - len(bad), len(rows)))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

if has volume; then
    say "volume: issue 30 on the GPU: $VOL_MIB MiB, image volume + gpusnap.io/restore-from-volume vs containerd's CRI restore under runc.v2 + CRIU's cuda plugin, $VOL_REPS rep(s)"
    : >"$VOL_JSONL"
    : >"$VOL_COUNT"
    why=$(plugin_missing)
    sides=(gpusnap)
    [[ -n $VOL_PAGE_FILL ]] && sides+=(fill)
    if [[ -n $why ]]; then note "volume: reference side skipped: $why"; else sides+=(reference); plugin_install; fi
    if k8s_setup; then
        R=127.0.0.1:$REG_PORT/gpusnap
        # 1. the checkpoints: two gpusnap replicas at once, then the reference.
        up=1
        replicas=(va)
        [[ $VOL_WARM == off ]] || replicas+=(vb)
        vol_up va gpusnap && POD_VA=$KPOD CTR_VA=$KCTR || up=0
        if ((up)) && [[ $VOL_WARM != off ]]; then
            vol_up vb gpusnap && POD_VB=$KPOD CTR_VB=$KCTR || up=0
        fi
        if ((up)); then
            KPOD=$POD_VA KCTR=$CTR_VA vol_checkpoint va || up=0
            if [[ $VOL_WARM != off ]]; then KPOD=$POD_VB KCTR=$CTR_VB vol_checkpoint vb || up=0; fi
        fi
        k8s_stop_pod "$POD_VA"
        [[ $VOL_WARM == off ]] || k8s_stop_pod "$POD_VB"
        if ((up)); then
            # One file: the device tool brings back only a few files per call.
            rm -rf "$WORK/va-criu-images" && mkdir -p "$WORK/va-criu-images"
            tar -xf "$WORK/ramtmp/va.tar" -C "$WORK/va-criu-images" --wildcards --no-anchored \
                'mm-*.img' 'core-*.img' 'pstree.img' 'pagemap-*.img' 'inventory.img' 2>/dev/null
            tar -czf "$OUTDIR/va-criu-images.tar.gz" -C "$WORK/va-criu-images" .
            info "volume: va's CRIU images without pages kept: $(find "$WORK/va-criu-images" -type f | wc -l) files in va-criu-images.tar.gz"
        fi
        for n in "${replicas[@]}"; do
            ((up)) || break
            t0=$(now_ms)
            if gpusnap --config "$CFG" image build "$WORK/ramtmp/$n.tar" --layout "$WORK/ramtmp/img-$n" \
                --tag "$R/vol-$n:1" >"$WORK/logs/volume-build-$n.out" 2>&1; then
                python3 "$REPO/tests/gpu/ocireg.py" add "$WORK/ocireg/config.json" "gpusnap/vol-$n:1" "$WORK/ramtmp/img-$n"
                info "volume: $n built (chunked, verified) in $(($(now_ms) - t0)) ms: $(du -sb "$WORK/ramtmp/img-$n" | cut -f1) bytes"
                rm -f "$WORK/ramtmp/$n.tar"
            else
                fail "volume: gpusnap image build $n failed: $(tail -n 3 "$WORK/logs/volume-build-$n.out" | tr '\n' ' ')"
                up=0
            fi
        done
        if ((up)) && [[ " ${sides[*]} " == *" reference "* ]]; then
            if vol_up vr runc && vol_checkpoint vr reference; then
                t0=$(now_ms)
                if python3 "$REPO/tests/gpu/ocireg.py" checkpoint-image "$WORK/ramtmp/vr.tar" "$WORK/ramtmp/img-vr" gpu >"$WORK/logs/volume-ref-image.out" 2>&1; then
                    python3 "$REPO/tests/gpu/ocireg.py" add "$WORK/ocireg/config.json" "gpusnap/vol-vr:1" "$WORK/ramtmp/img-vr"
                    info "volume: reference checkpoint image made in $(($(now_ms) - t0)) ms ($(cat "$WORK/logs/volume-ref-image.out"))"
                else
                    fail "volume: the reference checkpoint image: $(tail -n 3 "$WORK/logs/volume-ref-image.out" | tr '\n' ' ')"
                    mapfile -t sides < <(printf '%s\n' "${sides[@]}" | grep -vx reference)
                fi
            else
                k8s_stop_pod "$KPOD"
                mapfile -t sides < <(printf '%s\n' "${sides[@]}" | grep -vx reference)
            fi
        fi
        # 2. alternating repetitions on a fresh node.
        if ((up)); then
            for rep in $(seq 1 "$VOL_REPS"); do
                order=("${sides[@]}")
                ((rep % 2 == 0)) && order=($(printf '%s\n' "${sides[@]}" | tac))
                pos=first
                for side in "${order[@]}"; do
                    if ! time_left $((60 + VOL_MIB / 128)); then
                        note "volume: rep $rep $side skipped: past the deadline"
                        continue
                    fi
                    if [[ $side == reference ]]; then n=vr; else n=va; fi
                    vol_fresh "$R/vol-$n:1" && vol_restore "$side" "$n" "$R/vol-$n:1" "$rep" "$pos"
                    crictl rmi "$R/vol-$n:1" >/dev/null 2>&1
                    pos=last
                done
            done
            # 3. a node holding another replica's chunks: va's image on the node, vb pulled.
            if [[ $VOL_WARM == off ]]; then
                note "volume: the warm pull (vb beside va's chunks) left out (--vol-warm off)"
            elif time_left $((60 + VOL_MIB / 128)); then
                crictl pull "$R/vol-va:1" >/dev/null 2>&1
                vol_fresh "$R/vol-vb:1" && vol_restore gpusnap vb "$R/vol-vb:1" 0 warm
                crictl rmi "$R/vol-va:1" "$R/vol-vb:1" >/dev/null 2>&1
            else
                note "volume: the warm pull (vb beside va's chunks) skipped: past the deadline"
            fi
        fi
        vol_table
        rm -rf "$WORK/ramtmp/img-va" "$WORK/ramtmp/img-vb" "$WORK/ramtmp/img-vr" "$WORK/ramtmp"/v?.tar
    fi
fi
# An expansion error aborts the whole block above without a failed check: no table is one.
if has volume && [[ ! -s $OUTDIR/volume.txt ]]; then
    fail "volume: the scenario ended without its table ($OUTDIR/volume.txt)"
fi
