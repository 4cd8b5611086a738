# tests/gpu/scenarios-more.sh — sourced by tests/gpu/run-h200.sh after its helpers (not run on
# its own). The scenarios plugin, runc, runcv2, k8s, bench2 and posixbench; each runs only when
# named in --scenarios. See tests/gpu/README.md.
# shellcheck shell=bash

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
WL() { python3 "$REPO/tests/gpu/wl.py" "$@"; }
# wl_report < <(WL ...): the checker's OK/FAIL lines as this script's checks (process
# substitution, not a pipe, so that FAILS is updated in this shell).
wl_report() {
    local line
    while IFS= read -r line; do
        case $line in
        "OK "*) ok "${line#OK }" ;;
        "FAIL "*) fail "${line#FAIL }" ;;
        *) info "  $line" ;;
        esac
    done
}
# tctr SECONDS ARGS...: ctr with a time limit (timeout cannot run the ctr shell function).
tctr() { local s=$1; shift; timeout "$s" "$(type -P ctr)" -a "$SOCK" -n "$NS" "$@"; }
# runtime_options ID: the container's runc options (binary protobuf) as text.
runtime_options() {
    ctr c info "$1" 2>/dev/null | python3 -c 'import base64,json,sys; o=json.load(sys.stdin)["Runtime"].get("Options") or {}; print(o.get("type_url"), base64.b64decode(o.get("value", "")).decode("latin1").replace("\n", " "))' 2>/dev/null
}
task_state() { ctr t ls 2>/dev/null | awk -v i="$1" '$1 == i {print $3}'; }
# num_or_dash VALUE
nd() { [[ ${1:-} =~ ^[0-9]+$ ]] && echo "$1" || echo -; }

# ckpt_file REF NAME OUT: a file of the CRIU checkpoint tar of checkpoint image REF (content store).
ckpt_file() {
    local ref=$1 name=$2 out=$3 dig
    dig=$(ctr images ls | awk -v r="$ref" '$1 == r {print $3}')
    [[ -n $dig ]] || return 1
    python3 - "$WORK/containerd/root/io.containerd.content.v1.content/blobs" "$dig" "$name" "$out" <<'PY'
import json, os, sys, tarfile
blobs, dig, name, out = sys.argv[1:5]
path = lambda d: os.path.join(blobs, *d.split(":", 1))
index = json.load(open(path(dig)))
ck = [m for m in index.get("manifests", []) if "criu.checkpoint" in m.get("mediaType", "")]
if not ck:
    sys.exit(1)
with tarfile.open(path(ck[0]["digest"]), "r|*") as tf:
    for m in tf:
        if m.name.lstrip("./") == name:
            open(out, "wb").write(tf.extractfile(m).read())
            sys.exit(0)
sys.exit(1)
PY
}
# inventory_lists_cuda_plugin FILE: CRIU's inventory.img names cuda_plugin (the plugin adds
# itself there when it checkpointed a CUDA process).
inventory_lists_cuda_plugin() { grep -aq cuda_plugin "$1" 2>/dev/null; }

# shim_fields MESSAGE: the *_ms (and *bytes, cuda_processes) fields of the last shim log line
# with MESSAGE since log_mark, as "k=v ...".
shim_fields() {
    tail -n +"$((LOGMARK + 1))" "$WORK/containerd.log" | grep -F "$1" | grep 'total_ms' | tail -n 1 |
        grep -oE '\b([a-z_]+_ms|[a-z_]*bytes|cuda_processes)=[0-9]+' | tr '\n' ' ' | sed 's/ $//'
}
# manifest_phases FILE: the manifest's timings as JSON [[name, ms], ...].
manifest_phases() {
    python3 -c 'import json,sys; print(json.dumps([[p.get("name"), p.get("ms")] for p in json.load(open(sys.argv[1])).get("timings", [])]))' "$1" 2>/dev/null || echo null
}

# ---------------------------------------------------------------------------------------------
# CRIU's cuda plugin in CRIU's default plugin directory
# ---------------------------------------------------------------------------------------------
PLUGIN_SO=$B/plugins/cuda/cuda_plugin.so
CRIU_PLUGIN_DIR=/usr/lib/criu
PLUGIN_STATE=""
plugin_available() { [[ -f $PLUGIN_SO ]]; }
cc_available() { [[ -x $B/bin/cuda-checkpoint ]]; }
plugin_install() {
    [[ -n $PLUGIN_STATE ]] && return 0
    plugin_available || return 1
    if [[ -d $CRIU_PLUGIN_DIR ]]; then PLUGIN_STATE=dir-existed; else PLUGIN_STATE=made-dir; mkdir -p "$CRIU_PLUGIN_DIR"; fi
    if [[ -e $CRIU_PLUGIN_DIR/cuda_plugin.so ]]; then
        mv -f "$CRIU_PLUGIN_DIR/cuda_plugin.so" "$CRIU_PLUGIN_DIR/cuda_plugin.so.gpusnap-test-orig"
        note "a cuda_plugin.so was already in $CRIU_PLUGIN_DIR: set aside as cuda_plugin.so.gpusnap-test-orig, put back at the end"
    fi
    install -m 0644 "$PLUGIN_SO" "$CRIU_PLUGIN_DIR/cuda_plugin.so"
    info "CRIU's cuda plugin installed: $CRIU_PLUGIN_DIR/cuda_plugin.so (cuda-checkpoint on PATH: $(command -v cuda-checkpoint || echo MISSING))"
}
plugin_remove() {
    [[ -n $PLUGIN_STATE ]] || return 0
    rm -f "$CRIU_PLUGIN_DIR/cuda_plugin.so"
    [[ -e $CRIU_PLUGIN_DIR/cuda_plugin.so.gpusnap-test-orig ]] &&
        mv -f "$CRIU_PLUGIN_DIR/cuda_plugin.so.gpusnap-test-orig" "$CRIU_PLUGIN_DIR/cuda_plugin.so"
    [[ $PLUGIN_STATE == made-dir ]] && rmdir "$CRIU_PLUGIN_DIR" 2>/dev/null
    PLUGIN_STATE=""
    info "CRIU's cuda plugin removed from $CRIU_PLUGIN_DIR"
}
# plugin_ready WHAT: why WHAT cannot run with CRIU's plugin, or nothing.
plugin_missing() {
    if ! plugin_available; then
        echo "no plugins/cuda/cuda_plugin.so in the bundle (make-bundle.sh builds it unless --no-cuda-plugin)"
    elif ((CPU == 0)) && ! cc_available; then
        echo "cuda-checkpoint is not in the bundle (make-bundle.sh with CUDA_CHECKPOINT_BIN=<path>); CRIU's cuda plugin execs it from CRIU's PATH"
    elif [[ ! -x $B/bin/containerd-shim-runc-v2 ]]; then
        echo "containerd-shim-runc-v2 is not in the bundle (made with --no-runc-shim)"
    fi
}

# ---------------------------------------------------------------------------------------------
# One checkpoint/kill/restore cycle through ctr, process-aware
# ---------------------------------------------------------------------------------------------
# cycle_ckr PHASE ID LOG EXPECT: ctr c checkpoint --task (the workload must keep running),
# kill + rm, ctr c restore --live, continuity of every process (GPU_PROCS, default 1).
# Leaves the restored container running; CK_MS/RS_MS from the ops; CYCLE_REF is the image;
# CYCLE_CK_SHIM: the shim's checkpoint fields (shim_fields); CYCLE_FIRST_MS: restore start ->
# first verified step of every process.
cycle_ckr() {
    local phase=$1 id=$2 log=$3 expect=${4:-} procs=${GPU_PROCS:-1} m0 m1 mk
    CYCLE_REF=localhost/gpusnap-gpu/$phase:ck
    CYCLE_CK_SHIM="" CYCLE_FIRST_MS=""
    m0=$(WL mark "$log")
    checkpoint_op "$phase" "$id" "$CYCLE_REF" "$expect" || return 1
    CYCLE_CK_SHIM=$(shim_fields 'checkpoint sealed')
    m1=$(WL mark "$log")
    if WL wait "$log" "$m1" 2 "$procs" 30 >/dev/null; then
        wl_report < <(WL alive "$log" "$phase: after the checkpoint" "$m0" "$procs")
    else
        fail "$phase: the workload stalled after the checkpoint: $(tail -n 2 "$log" | tr '\n' ' ')"
    fi
    row "$phase" "workload stall around the checkpoint" "$(WL gap "$log" "$m0" "$(WL mark "$log")" "$procs")" - "max step gap, $procs process(es)"
    local t0
    t0=$(now_ms)
    ctr_stop "$id" || { fail "$phase: could not remove $id"; return 1; }
    mk=$(WL mark "$log")
    row "$phase" "kill + rm" $(($(now_ms) - t0)) - ""
    gpu_wait_free
    t0=$(now_ms)
    restore_op "$phase" "$id" "$CYCLE_REF" || return 1
    if WL wait "$log" "$mk" 3 "$procs" $((60 + ${CYCLE_MIB:-0} / 256)); then
        local first
        first=$(WL firstts "$log" "$mk" "$procs")
        if [[ $first =~ ^[0-9]+$ ]]; then
            CYCLE_FIRST_MS=$((first - t0))
            row "$phase" "restore start -> first verified step" "$CYCLE_FIRST_MS" - "all $procs process(es)"
        fi
        wl_report < <(WL continuity "$log" "$phase" "$m0" "$mk" "$procs")
    else
        fail "$phase: no steps from the restored workload: $(tail -n 2 "$log" | tr '\n' ' ')"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# Hooks for run-h200.sh's finish()
# ---------------------------------------------------------------------------------------------
extra_cleanup() {
    # scenario push's agent and registry (scenario-push.sh), by their pids
    declare -F push_cleanup >/dev/null && push_cleanup
    if ((KEEP == 0)); then
        if ((${CRI:-0})) && [[ -n $CONTAINERD_PID && -f $WORK/crictl.yaml ]]; then
            crictl rmp -a -f >/dev/null 2>&1
        fi
        if [[ -d $RUNC_ROOT ]]; then
            for id in $(runc --root "$RUNC_ROOT" list -q 2>/dev/null); do
                runc --root "$RUNC_ROOT" kill "$id" KILL >/dev/null 2>&1
                runc --root "$RUNC_ROOT" delete --force "$id" >/dev/null 2>&1
            done
        fi
        [[ -n ${REG_PID:-} ]] && kill "$REG_PID" 2>/dev/null
    fi
    ((KEEP_PLUGIN)) || plugin_remove
}
extra_report() {
    if [[ -s $BENCH2_JSONL ]]; then
        say "bench2: gpusnap / reference"
        WL bench2-table "$BENCH2_JSONL" "$OUTDIR/bench2.txt"
    fi
}

# ---------------------------------------------------------------------------------------------
# plugin: CRIU's cuda plugin installed; gpusnap keeps it out; the reference path uses it
# ---------------------------------------------------------------------------------------------
if has plugin; then
    say "plugin: CRIU's cuda_plugin.so in $CRIU_PLUGIN_DIR; gpusnap shim (keeps it out) and the reference runc.v2 + plugin + cuda-checkpoint ($MIB MiB)"
    why=$(plugin_missing)
    if [[ -n $why ]]; then
        note "plugin: skipped: $why"
    elif ! time_left 90; then
        note "plugin: skipped: past the deadline"
    else
        plugin_install
        for side in gpusnap reference; do
            time_left 60 || { note "plugin-$side: skipped: past the deadline"; continue; }
            id=plugin-$side
            log=$WORK/gpu/log/$id.log
            rt=$RT expect=""
            [[ $side == reference ]] && rt=io.containerd.runc.v2 expect=none
            say "plugin-$side: $rt, ctr c checkpoint --task, kill, ctr c restore --live"
            if ! GPU_RT=$rt gpu_run "$id" "$MIB" || ! wl_wait "$log" 3 90; then
                fail "plugin-$side: the workload did not start under $rt: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
                ctr_stop "$id"
                continue
            fi
            lm=$(wc -l <"$WORK/containerd.log")
            CYCLE_MIB=$MIB cycle_ckr "plugin-$side" "$id" "$log" "$expect"
            inv=$WORK/logs/inventory-plugin-$side.img
            if ckpt_file "$CYCLE_REF" inventory.img "$inv"; then
                if inventory_lists_cuda_plugin "$inv"; then
                    if [[ $side == gpusnap ]]; then fail "plugin-gpusnap: CRIU's inventory lists cuda_plugin: the plugin acted inside gpusnap's dump"; else ok "plugin-reference: CRIU's inventory lists cuda_plugin (the plugin checkpointed the CUDA process)"; fi
                else
                    if [[ $side == gpusnap ]]; then ok "plugin-gpusnap: CRIU's inventory does not list cuda_plugin"
                    elif ((CPU)); then info "plugin-reference: inventory without cuda_plugin (expected without a GPU: the plugin disables itself)"
                    else fail "plugin-reference: CRIU's inventory does not list cuda_plugin: the plugin did not act"; fi
                fi
            else
                info "plugin-$side: no inventory.img read from $CYCLE_REF"
            fi
            if [[ $side == gpusnap ]]; then
                excl=$(tail -n +"$((lm + 1))" "$WORK/containerd.log" | grep -F 'CRIU runs without its own GPU plugins' | tail -n 1)
                if grep -q 'excluded=cuda_plugin.so' <<<"$excl"; then
                    ok "plugin-gpusnap: the shim ran CRIU without cuda_plugin.so ($(grep -oE 'source=[^ ]+|kept=[0-9]+' <<<"$excl" | tr '\n' ' '))"
                else
                    fail "plugin-gpusnap: no 'CRIU runs without its own GPU plugins ... excluded=cuda_plugin.so' line in containerd's log"
                fi
            fi
            ctr_stop "$id"
            ctr images rm --sync "$CYCLE_REF" >/dev/null 2>&1
            gpu_wait_free
        done
        ((KEEP_PLUGIN)) || plugin_remove
    fi
fi

# ---------------------------------------------------------------------------------------------
# runc: gpusnap-runc driving runc directly, as Podman and CRI-O call it
# ---------------------------------------------------------------------------------------------
RUNC_ROOT=$WORK/runc-root
# make_oci_bundle DIR ID MIB: rootfs from the gpu-base image, config.json from `runc spec`.
make_oci_bundle() {
    local dir=$1 id=$2 mib=$3 x=$WORK/oci-unpacked d devs=()
    rm -rf "$dir"
    mkdir -p "$dir/rootfs"
    if [[ ! -d $x ]]; then
        mkdir -p "$x"
        tar -C "$x" -xf "$B/images/gpu-base.oci.tar" || return 1
    fi
    for d in $(python3 -c 'import json,sys; x=sys.argv[1]; i=json.load(open(x+"/index.json")); m=json.load(open(x+"/blobs/sha256/"+i["manifests"][0]["digest"].split(":")[1])); print(" ".join(l["digest"].split(":")[1] for l in m["layers"]))' "$x"); do
        tar -C "$dir/rootfs" -xf "$x/blobs/sha256/$d" || return 1
    done
    runc spec --bundle "$dir" || return 1
    if ((CPU == 0)); then
        for d in "${DEVICES[@]}"; do
            if [[ -d $d ]]; then devs+=($(find "$d" -type c)); else devs+=("$d"); fi
        done
    fi
    python3 - "$dir/config.json" "$mib" "/gpu/log/$id.log" "$INTERVAL" "${GPU_PROCS:-}" "$WORK/gpu" "$NVLIB" "$CPU" "$NET_HOST" "${devs[@]}" <<'PY'
import json, os, sys
cfg, mib, logp, interval, procs, gpudir, nvlib, cpu, nethost = sys.argv[1:10]
devs = sys.argv[10:]
spec = json.load(open(cfg))
p = spec["process"]
p["terminal"] = False
p["args"] = ["/gpu/bin/gpu_verify"] + (["--procs", procs] if procs else []) + [mib, logp, interval]
ld = "/usr/lib/x86_64-linux-gnu" if cpu == "1" else "/nvidia/lib64:/usr/lib/x86_64-linux-gnu"
p["env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH=" + ld]
spec["root"] = {"path": "rootfs", "readonly": False}
m = spec["mounts"]
# non-recursive binds, as the ctr scenarios use (no nested mounts for CRIU)
m.append({"destination": "/usr", "type": "bind", "source": "/usr", "options": ["bind", "ro"]})
if cpu != "1":
    m.append({"destination": "/nvidia/lib64", "type": "bind", "source": nvlib, "options": ["bind", "ro"]})
m.append({"destination": "/gpu", "type": "bind", "source": gpudir, "options": ["bind", "rw"]})
lin = spec["linux"]
for d in devs:
    st = os.stat(d)
    mj, mn = os.major(st.st_rdev), os.minor(st.st_rdev)
    lin.setdefault("devices", []).append({"path": d, "type": "c", "major": mj, "minor": mn,
                                          "fileMode": 0o666, "uid": 0, "gid": 0})
    lin.setdefault("resources", {}).setdefault("devices", []).append(
        {"allow": True, "type": "c", "major": mj, "minor": mn, "access": "rwm"})
if nethost == "1":
    lin["namespaces"] = [n for n in lin["namespaces"] if n["type"] != "network"]
json.dump(spec, open(cfg, "w"), indent=1)
PY
}
gsr() { GPUSNAP_LOG=info gpusnap-runc --root "$RUNC_ROOT" "$@"; }
runc_status() { runc --root "$RUNC_ROOT" state "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null; }

# gsr_cycle PHASE ID BUNDLE LOG: gpusnap-runc checkpoint (stops the container), restore -d.
gsr_cycle() {
    local phase=$1 id=$2 bundle=$3 log=$4 dir=$WORK/ramtmp/$1-image t0 rc ms m0 mk first
    rm -rf "$dir" "$WORK/$phase-work" "$WORK/$phase-rwork"
    mkdir -p "$WORK/$phase-rwork"
    m0=$(WL mark "$log")
    t0=$(now_ms)
    gsr checkpoint --image-path "$dir" --work-path "$WORK/$phase-work" "$id" </dev/null >"$WORK/logs/$phase-checkpoint.out" 2>"$WORK/logs/$phase-checkpoint.err"
    rc=$?
    ms=$(($(now_ms) - t0))
    grep -E 'sealed|GPU plugins|CUDA|ERROR|WARN|error' "$WORK/logs/$phase-checkpoint.err" | tail -n 8 | sed 's/^/  gpusnap-runc: /'
    if ((rc != 0)); then
        fail "$phase: gpusnap-runc checkpoint failed (rc $rc, $ms ms): $(tail -n 3 "$WORK/logs/$phase-checkpoint.err" | tr '\n' ' ')"
        row "$phase" "gpusnap-runc checkpoint (stops it)" "$ms" - FAILED
        return 1
    fi
    ok "$phase: gpusnap-runc checkpoint in $ms ms"
    local fields
    fields=$(grep 'checkpoint sealed' "$WORK/logs/$phase-checkpoint.err" | grep total_ms | tail -n 1 | grep -oE '\b[a-z_]+_ms=[0-9]+' | tr '\n' ' ')
    row "$phase" "gpusnap-runc checkpoint (stops it)" "$ms" "$(grep -oE 'total_ms=[0-9]+' <<<"$fields" | cut -d= -f2)" "$fields"
    [[ -z $(runc_status "$id") ]] && ok "$phase: the container is gone after the checkpoint, as with runc" || fail "$phase: container still $(runc_status "$id") after checkpoint"
    sleep $(((INTERVAL * 3 + 999) / 1000))
    mk=$(WL mark "$log")
    sleep $(((INTERVAL * 2 + 999) / 1000))
    (($(WL mark "$log") == mk)) && ok "$phase: the workload stopped" || fail "$phase: the workload kept logging after the checkpoint"
    if [[ -f $dir/gpusnap-manifest.json ]]; then
        save_manifest "$phase" "$dir/gpusnap-manifest.json"
        manifest_summary "$dir/gpusnap-manifest.json"
        ((CPU == 0)) && ! grep -q '"gpu"' "$dir/gpusnap-manifest.json" && fail "$phase: the manifest has no gpu section"
    else
        fail "$phase: no gpusnap-manifest.json in $dir"
    fi
    if [[ -n ${PLUGIN_STATE:-} ]]; then
        grep -q 'excluded=cuda_plugin.so' "$WORK/logs/$phase-checkpoint.err" &&
            ok "$phase: gpusnap-runc ran CRIU without cuda_plugin.so" ||
            fail "$phase: gpusnap-runc did not report leaving cuda_plugin.so out"
        inventory_lists_cuda_plugin "$dir/inventory.img" && fail "$phase: CRIU's inventory lists cuda_plugin"
    fi
    gpu_wait_free
    t0=$(now_ms)
    gsr restore -d --image-path "$dir" --work-path "$WORK/$phase-rwork" --bundle "$bundle" "$id" </dev/null >/dev/null 2>"$WORK/logs/$phase-restore.err"
    rc=$?
    ms=$(($(now_ms) - t0))
    grep -E 'restore complete|CUDA|ERROR|WARN|error' "$WORK/logs/$phase-restore.err" | tail -n 6 | sed 's/^/  gpusnap-runc: /'
    fields=$(grep 'restore complete' "$WORK/logs/$phase-restore.err" | tail -n 1 | grep -oE '\b[a-z_]+_ms=[0-9]+' | tr '\n' ' ')
    row "$phase" "gpusnap-runc restore -d" "$ms" "$(grep -oE 'total_ms=[0-9]+' <<<"$fields" | cut -d= -f2)" "${fields:-$( ((rc)) && echo FAILED)}"
    if ((rc != 0)); then
        fail "$phase: gpusnap-runc restore failed (rc $rc): $(tail -n 3 "$WORK/logs/$phase-restore.err" | tr '\n' ' ')"
        tail -n 15 "$WORK/$phase-rwork/restore.log" 2>/dev/null | sed 's/^/  criu: /'
        return 1
    fi
    ok "$phase: gpusnap-runc restore -d in $ms ms; runc says $(runc_status "$id")"
    if WL wait "$log" "$mk" 3 "${GPU_PROCS:-1}" 60; then
        first=$(WL firstts "$log" "$mk" "${GPU_PROCS:-1}")
        [[ $first =~ ^[0-9]+$ ]] && row "$phase" "restore start -> first verified step" $((first - t0)) - ""
        wl_report < <(WL continuity "$log" "$phase" "$m0" "$mk" "${GPU_PROCS:-1}")
    else
        fail "$phase: no steps after the restore: $(tail -n 2 "$log" | tr '\n' ' ')"
    fi
    rm -rf "$dir"
}

if has runc; then
    say "runc: gpusnap-runc driving runc directly (run -d, checkpoint, restore -d), $MIB MiB"
    if ! time_left 90; then
        note "runc: skipped: past the deadline"
    elif [[ ! -x $B/bin/gpusnap-runc ]]; then
        fail "runc: gpusnap-runc is not in the bundle"
    else
        id=gsr1
        log=$WORK/gpu/log/$id.log
        bundle=$WORK/runc-bundles/$id
        mkdir -p "$RUNC_ROOT"
        if ! make_oci_bundle "$bundle" "$id" "$MIB"; then
            fail "runc: could not make the OCI bundle"
        else
            t0=$(now_ms)
            gsr --log "$WORK/logs/runc-$id.log" run -d --bundle "$bundle" "$id" </dev/null >/dev/null 2>&1
            rc=$?
            if ((rc != 0)) || ! wl_wait "$log" 3 90; then
                fail "runc: gpusnap-runc run -d failed (rc $rc): $(tail -n 3 "$WORK/logs/runc-$id.log" 2>/dev/null | tr '\n' ' ') $(tail -n 2 "$log" 2>/dev/null | tr '\n' ' ')"
            else
                row runc "gpusnap-runc run -d -> 3 steps" $(($(now_ms) - t0)) - "runc root $RUNC_ROOT"
                ok "runc: container $id runs ($(runc_status "$id")): $(head -n 1 "$log" | cut -d' ' -f1-4)"
                if gsr_cycle runc-1 "$id" "$bundle" "$log"; then
                    why=$(plugin_missing)
                    if [[ -n $why ]]; then
                        note "runc-2 (with CRIU's cuda plugin installed): skipped: $why"
                    elif time_left 60; then
                        say "runc-2: the same on the restored container, with CRIU's cuda plugin in $CRIU_PLUGIN_DIR"
                        plugin_install
                        gsr_cycle runc-2-plugin "$id" "$bundle" "$log"
                        ((KEEP_PLUGIN)) || plugin_remove
                    fi
                fi
                n=$(WL mark "$log")
                WL wait "$log" "$n" 2 1 20 >/dev/null && check_clean "$log" "runc (end)"
            fi
        fi
        runc --root "$RUNC_ROOT" kill "$id" KILL >/dev/null 2>&1
        sleep 0.5
        runc --root "$RUNC_ROOT" delete --force "$id" >/dev/null 2>&1
        gpu_wait_free
    fi
fi

# ---------------------------------------------------------------------------------------------
# runcv2: containerd-shim-runc-v2 with BinaryName = gpusnap-runc
# ---------------------------------------------------------------------------------------------
if has runcv2; then
    say "runcv2: containerd-shim-runc-v2 with runc BinaryName=$B/bin/gpusnap-runc (ctr run --runc-binary), $MIB MiB"
    if [[ ! -x $B/bin/containerd-shim-runc-v2 ]]; then
        note "runcv2: skipped: containerd-shim-runc-v2 is not in the bundle"
    elif ! time_left 90; then
        note "runcv2: skipped: past the deadline"
    else
        id=rv2
        log=$WORK/gpu/log/$id.log
        GPU_EXTRA=(--runc-binary "$B/bin/gpusnap-runc")
        GPU_RT=io.containerd.runc.v2 gpu_run "$id" "$MIB"
        rc=$?
        GPU_EXTRA=()
        if ((rc != 0)) || ! wl_wait "$log" 3 90; then
            fail "runcv2: the workload did not start: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
        else
            info "runcv2: runtime options of $id: $(runtime_options "$id")"
            # 1. ctr t checkpoint --image-path: containerd pauses the task first; gpusnap-runc
            # thaws it for the driver, and `gpusnap-runc resume` finishes the CUDA resume.
            dir=$WORK/ramtmp/rv2-image
            m0=$(WL mark "$log")
            log_mark
            "$(type -P ctr)" -a "$SOCK" -n "$NS" events >"$WORK/logs/rv2-events.txt" 2>&1 &
            ev_pid=$!
            sleep 0.3
            t0=$(now_ms)
            tctr 180 tasks checkpoint --image-path "$dir" "$id"
            rc=$?
            ms=$(($(now_ms) - t0))
            sleep 0.5
            kill "$ev_pid" 2>/dev/null
            wait "$ev_pid" 2>/dev/null
            evs=$(grep -oE '/tasks/(paused|resumed|checkpointed)' "$WORK/logs/rv2-events.txt" | tr '\n' ' ')
            info "runcv2-t: containerd events during the checkpoint: ${evs:-none}"
            [[ $evs == *paused*resumed* ]] && ok "runcv2-t: containerd paused the task before the checkpoint and resumed it after" ||
                info "runcv2-t: no paused/resumed event pair seen"
            if ((rc == 124)); then
                fail "runcv2-t: ctr t checkpoint --image-path HUNG (killed after 180 s)"
            elif ((rc != 0)); then
                fail "runcv2-t: ctr t checkpoint --image-path failed (rc $rc, $ms ms)"
                tail -n 20 "$WORK/containerd.log" | sed 's/^/  containerd: /'
            else
                ok "runcv2-t: ctr t checkpoint --image-path (containerd froze the task first) returned in $ms ms"
                ((ms > 60000)) && fail "runcv2-t: the checkpoint took $ms ms (more than a minute: a lock that waited on the frozen task?)"
                detail=""
                if [[ -f $dir/gpusnap-manifest.json ]]; then
                    save_manifest runcv2-t "$dir/gpusnap-manifest.json"
                    manifest_summary "$dir/gpusnap-manifest.json"
                    detail=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(" ".join("%s=%s" % (p["name"], p["ms"]) for p in m.get("timings", [])))' "$dir/gpusnap-manifest.json")
                    ((CPU == 0)) && ! grep -q '"gpu"' "$dir/gpusnap-manifest.json" && fail "runcv2-t: the manifest has no gpu section"
                else
                    fail "runcv2-t: no gpusnap-manifest.json in $dir"
                fi
                row runcv2-t "ctr t checkpoint --image-path (leave running)" "$ms" - "$detail"
                st=$(task_state "$id")
                [[ $st == RUNNING ]] && ok "runcv2-t: task RUNNING after the checkpoint" || fail "runcv2-t: task is ${st:-gone}"
                m1=$(WL mark "$log")
                if WL wait "$log" "$m1" 3 1 30 >/dev/null; then
                    wl_report < <(WL alive "$log" "runcv2-t" "$m0" 1)
                else
                    fail "runcv2-t: the workload stalled after the checkpoint (CUDA not resumed?): $(tail -n 2 "$log" | tr '\n' ' ')"
                fi
                row runcv2-t "workload stall around the checkpoint" "$(WL gap "$log" "$m0" "$(WL mark "$log")" 1)" - ""
                check_clean "$log" runcv2-t
            fi
            rm -rf "$dir"
            # 2. ctr c checkpoint --task, kill, ctr c restore --live (restores through
            # gpusnap-runc restore: the runtime options travel in the checkpoint image).
            if time_left 60 && [[ $(task_state "$id") == RUNNING ]]; then
                CYCLE_MIB=$MIB cycle_ckr runcv2-c "$id" "$log" ""
                runtime_options "$id" | grep -q gpusnap-runc &&
                    ok "runcv2-c: the restored container still runs with BinaryName gpusnap-runc" ||
                    fail "runcv2-c: the restored container lost BinaryName gpusnap-runc"
                ctr images rm --sync "$CYCLE_REF" >/dev/null 2>&1
            fi
        fi
        ctr_stop "$id"
        gpu_wait_free
    fi
fi

# ---------------------------------------------------------------------------------------------
# k8s: containerd's CRI with the gpusnap runtime handler, driven by crictl
# ---------------------------------------------------------------------------------------------
K8S_READY=0 REG_PID="" K8S_IMAGE=""
crictl() { command crictl --config "$WORK/crictl.yaml" "$@"; }
k8s_setup() {
    ((K8S_READY)) && return 0
    ((CRI)) || { fail "k8s: CRI is not enabled in this containerd"; return 1; }
    command -v crictl >/dev/null || { fail "k8s: crictl is not in the bundle"; return 1; }
    cat >"$WORK/crictl.yaml" <<EOF
runtime-endpoint: unix://$SOCK
image-endpoint: unix://$SOCK
timeout: 300
debug: false
pull-image-on-create: false
EOF
    crictl version 2>&1 | sed 's/^/  crictl: /'
    mkdir -p "$WORK/ocireg/gpu-base" "$WORK/k8s"
    tar -C "$WORK/ocireg/gpu-base" -xf "$B/images/gpu-base.oci.tar"
    python3 "$REPO/tests/gpu/ocireg.py" add "$WORK/ocireg/config.json" gpusnap/gpu-base:test "$WORK/ocireg/gpu-base"
    # OCIREG_COUNT: every blob body served is counted (the scenario volume's bytes fetched).
    OCIREG_COUNT=$WORK/logs/ocireg-count.txt python3 "$REPO/tests/gpu/ocireg.py" serve "$WORK/ocireg/config.json" "$REG_PORT" >"$WORK/logs/ocireg.log" 2>&1 &
    REG_PID=$!
    python3 - "$REG_PORT" <<'PY' || { fail "k8s: the local registry did not come up: $(tail -n 3 "$WORK/logs/ocireg.log")"; return 1; }
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=1).read()
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY
    K8S_IMAGE=127.0.0.1:$REG_PORT/gpusnap/gpu-base:test
    # The base image comes from a registry (CRI's restore from an archive pulls it again by
    # digest: config.dump's rootfsImageRef).
    if ! crictl pull "$K8S_IMAGE"; then
        fail "k8s: crictl pull $K8S_IMAGE failed"
        return 1
    fi
    crictl images 2>&1 | sed 's/^/  /'
    grep -E ' /usr' /proc/self/mountinfo | awk '{print "  host mount under /usr: " $5 " (" $9 ")"}' | head -n 5
    K8S_READY=1
}
# k8s_pod_json NAME FILE [KEY=VALUE annotation...]
k8s_pod_json() {
    local name=$1 file=$2
    shift 2
    mkdir -p "$WORK/k8s/pods/$name"
    python3 - "$name" "$WORK/k8s/pods/$name" "$file" "$@" <<'PY'
import json, sys
name, logdir, out = sys.argv[1:4]
ann = dict(a.split("=", 1) for a in sys.argv[4:])
json.dump({
    "metadata": {"name": name, "uid": "uid-" + name, "namespace": "default", "attempt": 0},
    "log_directory": logdir,
    "annotations": ann,
    "labels": {"app": name},
    "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}}},
}, open(out, "w"), indent=1)
PY
}
# k8s_ctr_json FILE IMAGE LOGNAME MIB: the GPU workload as a CRI container config.
k8s_ctr_json() {
    local file=$1 image=$2 logname=$3 mib=$4 devs=() d
    if ((CPU == 0)); then
        for d in "${DEVICES[@]}"; do
            if [[ -d $d ]]; then devs+=($(find "$d" -type c)); else devs+=("$d"); fi
        done
    fi
    python3 - "$file" "$image" "/gpu/log/$logname.log" "$mib" "$INTERVAL" "${GPU_PROCS:-}" "$WORK/gpu" "$NVLIB" "$CPU" "${GPU_FLEET:-}" "${K_IMAGE_MOUNT:-}" "${devs[@]}" <<'PY'
import json, sys
out, image, logp, mib, interval, procs, gpudir, nvlib, cpu, fleet, image_mount = sys.argv[1:12]
devs = sys.argv[12:]
import os
# CRI binds are recursive (rbind): only host directories without mounts below them, so
# /usr/lib/x86_64-linux-gnu and /usr/lib64 instead of /usr (the driver's squashfs sits under
# /usr/local on the device).
mounts = [{"container_path": "/gpu", "host_path": gpudir, "readonly": False},
          {"container_path": "/usr/lib/x86_64-linux-gnu", "host_path": "/usr/lib/x86_64-linux-gnu", "readonly": True},
]
# the ELF interpreter: /lib64 -> usr/lib64 in the image, /usr/lib64/ld-linux-x86-64.so.2 on the host
for d in ("/usr/lib64",):
    if os.path.isdir(d):
        mounts.append({"container_path": d, "host_path": d, "readonly": True})
ld = "/usr/lib/x86_64-linux-gnu"
if cpu != "1":
    mounts.append({"container_path": "/nvidia/lib64", "host_path": nvlib, "readonly": True})
    ld = "/nvidia/lib64:" + ld
# K_IMAGE_MOUNT=PATH=REF: an image volume (KEP-4639) as the kubelet passes it to CRI.
if image_mount:
    path, ref = image_mount.split("=", 1)
    mounts.append({"container_path": path, "image": {"image": ref}, "readonly": True})
json.dump({
    "metadata": {"name": "gpu"},
    "image": {"image": image, "user_specified_image": image},
    "command": ["/gpu/bin/gpu_verify"],
    "args": (["--procs", procs] if procs else []) + (["--fleet"] if fleet else []) + [mib, logp, interval],
    "envs": [{"key": "LD_LIBRARY_PATH", "value": ld}],
    "mounts": mounts,
    "devices": [{"container_path": d, "host_path": d, "permissions": "rwm"} for d in devs],
    "log_path": "gpu.log",
    "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}}},
}, open(out, "w"), indent=1)
PY
}
# k8s_start NAME IMAGE LOGNAME MIB [ANNOTATIONS...]: pod + container; sets KPOD, KCTR,
# K_CREATE_MS, K_START_MS, K_CREATE_T0. Returns 1 on failure (reported). Environment:
# K_RUNTIME (the pod's runtime handler, default gpusnap), GPU_PROCS, GPU_FLEET (gpu_verify
# --fleet), K_IMAGE_MOUNT=PATH=REF (an image volume).
k8s_start() {
    local name=$1 image=$2 logname=$3 mib=$4 t0 out
    shift 4
    KPOD="" KCTR="" K_CREATE_MS="" K_START_MS="" K_START_T0="" K_CREATE_T0=""
    k8s_pod_json "$name" "$WORK/k8s/$name-pod.json" "$@"
    k8s_ctr_json "$WORK/k8s/$name-ctr.json" "$image" "$logname" "$mib"
    KPOD=$(crictl runp --runtime "${K_RUNTIME:-gpusnap}" "$WORK/k8s/$name-pod.json" 2>"$WORK/logs/k8s-$name-runp.err") ||
        { fail "k8s $name: crictl runp failed: $(tail -n 2 "$WORK/logs/k8s-$name-runp.err" | tr '\n' ' ')"; return 1; }
    t0=$(now_ms)
    K_CREATE_T0=$t0
    out=$(crictl create --no-pull "$KPOD" "$WORK/k8s/$name-ctr.json" "$WORK/k8s/$name-pod.json" 2>&1)
    if (($?)); then fail "k8s $name: crictl create failed: $out"; return 1; fi
    KCTR=$(tail -n 1 <<<"$out")
    K_CREATE_MS=$(($(now_ms) - t0))
    t0=$(now_ms)
    K_START_T0=$t0
    out=$(crictl start "$KCTR" 2>&1)
    if (($?)); then fail "k8s $name: crictl start failed: $out"; return 1; fi
    K_START_MS=$(($(now_ms) - t0))
    info "k8s $name: pod ${KPOD:0:12}, container ${KCTR:0:12} (create $K_CREATE_MS ms, start $K_START_MS ms)"
}
k8s_stop_pod() {
    [[ -n ${1:-} ]] || return 0
    crictl stopp "$1" >/dev/null 2>&1
    crictl rmp -f "$1" >/dev/null 2>&1
}
# k8s_checkpoint CTR ARCHIVE PHASE: crictl checkpoint --export; sets KCK_MS.
k8s_checkpoint() {
    local ctr_id=$1 archive=$2 phase=$3 t0 rc
    rm -f "$archive"
    log_mark
    t0=$(now_ms)
    crictl checkpoint --export="$archive" "$ctr_id" >"$WORK/logs/$phase-checkpoint.out" 2>&1
    rc=$?
    KCK_MS=$(($(now_ms) - t0))
    if ((rc != 0)); then
        fail "$phase: crictl checkpoint failed (rc $rc): $(tail -n 3 "$WORK/logs/$phase-checkpoint.out" | tr '\n' ' ')"
        shim_lines | tail -n 10 | sed 's/^/  shim: /'
        return 1
    fi
    ok "$phase: crictl checkpoint --export in $KCK_MS ms ($(stat -c %s "$archive") bytes; shim: $(shim_fields 'checkpoint sealed'))"
    local mf=$WORK/logs/manifest-$phase.json
    if tar -xOf "$archive" checkpoint/gpusnap-manifest.json >"$mf" 2>/dev/null; then
        save_manifest "$phase" "$mf"
        manifest_summary "$mf"
        ((CPU == 0)) && ! grep -q '"gpu"' "$mf" && fail "$phase: the manifest has no gpu section"
    else
        fail "$phase: no checkpoint/gpusnap-manifest.json in the archive"
    fi
    row "$phase" "crictl checkpoint --export" "$KCK_MS" "$(shim_fields 'checkpoint sealed' | grep -oE 'total_ms=[0-9]+' | cut -d= -f2)" "$(shim_fields 'checkpoint sealed')"
}
# k8s_restore_from PHASE ARCHIVE NAME LOGNAME MIB: gpusnap image build (layout) -> local registry
# -> gpusnap image pull --extract NAME -> pod with gpusnap.io/restore-from: NAME. Sets KPOD,
# KCTR, KA_BUILD_MS, KA_PULL_MS, KA_T0 (ms when the pod's container create began).
k8s_restore_from() {
    local phase=$1 archive=$2 name=$3 logname=$4 mib=$5 layout=$WORK/ramtmp/img-$3 t0 rc
    rm -rf "$layout" "$WORK/ramtmp/checkpoints/$name"
    KA_BUILD_MS="" KA_PULL_MS="" KA_T0=""
    t0=$(now_ms)
    gpusnap --config "$CFG" image build "$archive" --layout "$layout" --tag "127.0.0.1:$REG_PORT/gpusnap/ck-$name:1" >"$WORK/logs/$phase-build.out" 2>&1
    rc=$?
    KA_BUILD_MS=$(($(now_ms) - t0))
    sed 's/^/  build: /' "$WORK/logs/$phase-build.out" | head -n 12
    ((rc == 0)) || { fail "$phase: gpusnap image build failed (rc $rc)"; return 1; }
    row "$phase" "gpusnap image build (layout, verified)" "$KA_BUILD_MS" - ""
    python3 "$REPO/tests/gpu/ocireg.py" add "$WORK/ocireg/config.json" "gpusnap/ck-$name:1" "$layout"
    t0=$(now_ms)
    gpusnap --config "$CFG" image pull "http://127.0.0.1:$REG_PORT/gpusnap/ck-$name:1" --extract "$name" >"$WORK/logs/$phase-pull.out" 2>&1
    rc=$?
    KA_PULL_MS=$(($(now_ms) - t0))
    sed 's/^/  pull: /' "$WORK/logs/$phase-pull.out" | head -n 12
    ((rc == 0)) || { fail "$phase: gpusnap image pull --extract failed (rc $rc)"; return 1; }
    row "$phase" "gpusnap image pull --extract (local registry)" "$KA_PULL_MS" - "$WORK/ramtmp/checkpoints/$name"
    [[ -f $WORK/ramtmp/checkpoints/$name/gpusnap-origin.json ]] && ok "$phase: extracted with its gpusnap-origin.json" ||
        fail "$phase: no gpusnap-origin.json in $WORK/ramtmp/checkpoints/$name"
    rm -rf "$layout"
    log_mark
    KA_T0=$(now_ms)
    k8s_start "$phase" "$K8S_IMAGE" "$logname" "$mib" "gpusnap.io/restore-from=$name" || return 1
    row "$phase" "pod restore-from: crictl runp + create + start" $(($(now_ms) - KA_T0)) "$(shim_fields 'restore complete' | grep -oE 'total_ms=[0-9]+' | cut -d= -f2)" "$(shim_fields 'restore complete')"
}

if has k8s; then
    say "k8s: containerd CRI + crictl, runtime handler gpusnap, host-network pods ($MIB MiB)"
    if ! time_left 150; then
        note "k8s: skipped: past the deadline"
    elif k8s_setup; then
        klog=k8s-a
        log=$WORK/gpu/log/$klog.log
        archive=$WORK/ramtmp/k8s-a.tar
        if k8s_start k8s-a "$K8S_IMAGE" "$klog" "$MIB" && wl_wait "$log" 3 90; then
            POD_A=$KPOD CTR_A=$KCTR
            ok "k8s: GPU container runs in pod k8s-a: $(head -n 1 "$log" | cut -d' ' -f1-4)"
            m0=$(WL mark "$log")
            if k8s_checkpoint "$CTR_A" "$archive" k8s-ck; then
                m1=$(WL mark "$log")
                WL wait "$log" "$m1" 2 1 30 >/dev/null && wl_report < <(WL alive "$log" "k8s-ck: after crictl checkpoint" "$m0" 1) ||
                    fail "k8s-ck: the workload stalled after the checkpoint"
                k8s_stop_pod "$POD_A"
                mk=$(WL mark "$log")
                mk_a=$mk
                gpu_wait_free
                # (a) containerd 2.1's own CRI restore: CreateContainer with the archive as image.
                if time_left 60; then
                    say "k8s-a: restore from the archive: crictl create with image=$archive"
                    log_mark
                    t0=$(now_ms)
                    if k8s_start k8s-a-restored "$archive" "$klog" "$MIB"; then
                        t_ret=$(now_ms)
                        row k8s-a "CRI restore: crictl runp + create (image=archive) + start" $(($(now_ms) - t0)) "$(shim_fields 'restore complete' | grep -oE 'total_ms=[0-9]+' | cut -d= -f2)" "create=$K_CREATE_MS start=$K_START_MS $(shim_fields 'restore complete')"
                        crictl inspect "$KCTR" 2>/dev/null | python3 -c 'import json,sys; a=json.load(sys.stdin)["status"].get("annotations",{}); print("  restored=%s checkpointImage=%s" % (a.get("restored"), a.get("checkpointImage")))'
                        if WL wait "$log" "$mk" 3 1 60; then
                            first=$(WL firstts "$log" "$mk" 1)
                            [[ $first =~ ^[0-9]+$ ]] && row k8s-a "runp start -> first verified step" $((first - t0)) - "create+start returned after $((t_ret - t0)) ms"
                            wl_report < <(WL continuity "$log" k8s-a "$m0" "$mk" 1)
                        else
                            fail "k8s-a: no steps from the restored container: $(tail -n 2 "$log" | tr '\n' ' ')"
                        fi
                    else
                        shim_lines | tail -n 10 | sed 's/^/  containerd: /'
                    fi
                    k8s_stop_pod "$KPOD"
                    mk=$(WL mark "$log")
                    gpu_wait_free
                fi
                # (b) gpusnap image build + pull --extract + pod annotation gpusnap.io/restore-from.
                if time_left 60; then
                    say "k8s-b: gpusnap image build -> local registry -> gpusnap image pull --extract -> pod gpusnap.io/restore-from"
                    if k8s_restore_from k8s-b "$archive" k8s-ck1 "$klog" "$MIB"; then
                        if WL wait "$log" "$mk" 3 1 60; then
                            first=$(WL firstts "$log" "$mk" 1)
                            [[ $first =~ ^[0-9]+$ ]] && row k8s-b "runp start -> first verified step" $((first - KA_T0)) - ""
                            wl_report < <(WL continuity "$log" k8s-b "$m0" "$mk_a" 1 "$mk")
                        else
                            fail "k8s-b: no steps from the restored container: $(tail -n 2 "$log" | tr '\n' ' ')"
                        fi
                    fi
                    k8s_stop_pod "$KPOD"
                    gpu_wait_free
                fi
            fi
            k8s_stop_pod "$POD_A"
        else
            fail "k8s: the GPU container did not start in pod k8s-a: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
            tail -n 20 "$WORK/containerd.log" | sed 's/^/  containerd: /'
            k8s_stop_pod "$KPOD"
        fi
        rm -f "$archive"
        rm -rf "$WORK/ramtmp/checkpoints/k8s-ck1"
        gpu_wait_free
    fi
fi

# ---------------------------------------------------------------------------------------------
# bench2: gpusnap vs the reference (runc.v2 + CRIU cuda_plugin + cuda-checkpoint), one run
# ---------------------------------------------------------------------------------------------
BENCH2_JSONL=$OUTDIR/bench2.jsonl
# b2_emit KEY=VALUE...: one JSON line (numbers, JSON values, - or empty = null, else strings).
b2_emit() {
    python3 - "$@" >>"$BENCH2_JSONL" <<'PY'
import json, sys
o = {}
for a in sys.argv[1:]:
    k, v = a.split("=", 1)
    if v in ("", "-"):
        o[k] = None
    elif v[:1] in "[{" or v == "null":
        try:
            o[k] = json.loads(v)
        except ValueError:
            o[k] = v
    else:
        try:
            o[k] = int(v)
        except ValueError:
            try:
                o[k] = float(v)
            except ValueError:
                o[k] = v
print(json.dumps(o))
PY
}
# seconds for one side of one case (the runtime-only checkpoint alone: about a third)
b2_est() { if b2_case ii; then echo $((15 + $1 * 6 / 1024)); else echo $((15 + $1 * 2 / 1024)); fi; }
b2_case() { [[ ,$BENCH2_CASES, == *,$1,* ]]; }

# bench2_side SIDE SIZE PROCS REP POSITION: one measured side of one case.
bench2_side() {
    local side=$1 size=$2 procs=$3 rep=$4 pos=$5 id log rt dir ref t0 rc m0 m1 mk first
    local ck_i="" ck_ii="" rs="" fs="" st_i="" st_ii="" mf_i=null mf_ii=null sh_i="" sh_ii="" sh_rs=""
    local fails=()
    id=b2-$side-$size-$procs-$rep
    log=$WORK/gpu/log/$id.log
    dir=$WORK/ramtmp/$id-image
    ref=localhost/gpusnap-gpu/$id:ck
    rt=$RT
    [[ $side == reference ]] && rt=io.containerd.runc.v2
    say "bench2 $size MiB x $procs proc, rep $rep, $side (position $pos)"
    t0=$(now_ms)
    if ! GPU_PROCS=$procs GPU_RT=$rt gpu_run "$id" "$size" || ! WL wait "$log" 0 3 "$procs" $((60 + size / 256)) >/dev/null; then
        fail "bench2 $id: the workload did not start: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
        ctr_stop "$id"
        b2_emit size_mib="$size" procs="$procs" rep="$rep" side="$side" position="$pos" failures='["workload did not start"]'
        return 1
    fi
    info "bench2 $id: up in $(($(now_ms) - t0)) ms"
    # (i) ctr t checkpoint --image-path, leave running (only when named in --bench2-cases)
    if b2_case i; then
        m0=$(WL mark "$log")
        log_mark
        t0=$(now_ms)
        tctr 600 tasks checkpoint --image-path "$dir" "$id" >/dev/null
        rc=$?
        if ((rc == 0)); then
            ck_i=$(($(now_ms) - t0))
            sh_i=$(shim_fields 'checkpoint sealed')
            [[ -f $dir/gpusnap-manifest.json ]] && mf_i=$(manifest_phases "$dir/gpusnap-manifest.json")
            info "bench2 $id (i): $ck_i ms, image $(du -sb "$dir" 2>/dev/null | cut -f1) bytes ${sh_i:+(shim: $sh_i)}"
        else
            fails+=("(i) ctr t checkpoint --image-path rc $rc")
            fail "bench2 $id (i): ctr t checkpoint --image-path failed (rc $rc)"
        fi
        rm -rf "$dir"
        for im in $(ctr images ls -q | grep '^containerd.io/checkpoint/'); do ctr images rm --sync "$im" >/dev/null 2>&1; done
        m1=$(WL mark "$log")
        if WL wait "$log" "$m1" 3 "$procs" 60 >/dev/null; then
            wl_report < <(WL alive "$log" "bench2 $id (i)" "$m0" "$procs")
            st_i=$(WL gap "$log" "$m0" "$(WL mark "$log")" "$procs")
        else
            fails+=("(i) workload stalled")
            fail "bench2 $id (i): the workload stalled after the checkpoint"
        fi
    fi
    # (ii) ctr c checkpoint --task
    if b2_case ii; then
        m0=$(WL mark "$log")
        log_mark
        t0=$(now_ms)
        tctr 600 containers checkpoint --task "$id" "$ref"
        rc=$?
        if ((rc == 0)); then
            ck_ii=$(($(now_ms) - t0))
            sh_ii=$(shim_fields 'checkpoint sealed')
            if [[ $side == gpusnap ]] && manifest_of "$ref" "$WORK/logs/manifest-$id.json" >/dev/null; then
                mf_ii=$(manifest_phases "$WORK/logs/manifest-$id.json")
                save_manifest "bench2-$id" "$WORK/logs/manifest-$id.json"
            fi
            info "bench2 $id (ii): $ck_ii ms ${sh_ii:+(shim: $sh_ii)}"
        else
            fails+=("(ii) ctr c checkpoint --task rc $rc")
            fail "bench2 $id (ii): ctr c checkpoint --task failed (rc $rc)"
        fi
        m1=$(WL mark "$log")
        if WL wait "$log" "$m1" 3 "$procs" 60 >/dev/null; then
            st_ii=$(WL gap "$log" "$m0" "$(WL mark "$log")" "$procs")
        else
            fails+=("(ii) workload stalled")
            fail "bench2 $id (ii): the workload stalled after the checkpoint"
        fi
    fi
    # (iii) kill, ctr c restore --live, first verified step
    if [[ -n $ck_ii ]] && b2_case iii; then
        ctr_stop "$id"
        mk=$(WL mark "$log")
        gpu_wait_free
        log_mark
        t0=$(now_ms)
        tctr 600 containers restore --live "$id" "$ref"
        rc=$?
        if ((rc == 0)); then
            rs=$(($(now_ms) - t0))
            sh_rs=$(shim_fields 'restore complete')
            if WL wait "$log" "$mk" 3 "$procs" $((60 + size / 256)) >/dev/null; then
                first=$(WL firstts "$log" "$mk" "$procs")
                [[ $first =~ ^[0-9]+$ ]] && fs=$((first - t0))
                wl_report < <(WL continuity "$log" "bench2 $id" "$m0" "$mk" "$procs")
            else
                fails+=("(iii) no steps after restore")
                fail "bench2 $id (iii): no steps after the restore: $(tail -n 2 "$log" | tr '\n' ' ')"
            fi
            info "bench2 $id (iii): restore $rs ms, first verified step after $fs ms ${sh_rs:+(shim: $sh_rs)}"
        else
            fails+=("(iii) ctr c restore --live rc $rc")
            fail "bench2 $id (iii): ctr c restore --live failed (rc $rc)"
        fi
    fi
    ctr_stop "$id"
    ctr images rm --sync "$ref" >/dev/null 2>&1
    gpu_wait_free
    local fj
    fj=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${fails[@]}")
    b2_emit size_mib="$size" procs="$procs" rep="$rep" side="$side" position="$pos" \
        ck_image_path_ms="$ck_i" stall_i_ms="$st_i" ck_task_ms="$ck_ii" stall_ii_ms="$st_ii" \
        restore_ms="$rs" first_step_ms="$fs" manifest_i="$mf_i" manifest_ii="$mf_ii" \
        shim_ck_i="$sh_i" shim_ck_ii="$sh_ii" shim_restore="$sh_rs" failures="$fj"
}

# b2_pod_up CASE NAME SIZE PROCS: the bench2 workload in a CRI pod, verified up (sets KPOD,
# KCTR); on failure says so, removes the pod and returns 1.
b2_pod_up() {
    local case=$1 name=$2 size=$3 procs=$4
    k8s_setup || return 1
    if ! GPU_PROCS=$procs k8s_start "$name" "$K8S_IMAGE" "$name" "$size" ||
        ! WL wait "$WORK/gpu/log/$name.log" 0 3 "$procs" $((60 + size / 256)) >/dev/null; then
        fail "bench2 ($case) $name: the workload did not start in its pod"
        k8s_stop_pod "$KPOD"
        return 1
    fi
}

# bench2_annot SIZE PROCS: (v) gpusnap only: CRI pod, crictl checkpoint --export, image build,
# pull --extract, pod with gpusnap.io/restore-from: NAME, first verified step.
bench2_annot() {
    local size=$1 procs=$2 name=b2-annot-$1-$2 log archive=$WORK/ramtmp/b2-annot.tar m0 mk first t_first=""
    log=$WORK/gpu/log/$name.log
    say "bench2 $size MiB x $procs proc (v): gpusnap, restore by gpusnap.io/restore-from through CRI"
    b2_pod_up v "$name" "$size" "$procs" || return 1
    local pod=$KPOD
    m0=$(WL mark "$log")
    if GPU_PROCS=$procs k8s_checkpoint "$KCTR" "$archive" "b2v-$size-$procs"; then
        local ck=$KCK_MS
        k8s_stop_pod "$pod"
        mk=$(WL mark "$log")
        gpu_wait_free
        if GPU_PROCS=$procs k8s_restore_from "b2v-$size-$procs" "$archive" "$name" "$name" "$size"; then
            if WL wait "$log" "$mk" 3 "$procs" $((60 + size / 256)) >/dev/null; then
                first=$(WL firstts "$log" "$mk" "$procs")
                [[ $first =~ ^[0-9]+$ ]] && t_first=$((first - KA_T0))
                wl_report < <(WL continuity "$log" "bench2 (v) $name" "$m0" "$mk" "$procs")
            else
                fail "bench2 (v) $name: no steps after the restore"
            fi
            b2_emit size_mib="$size" procs="$procs" rep=0 side=gpusnap position=0 \
                annot_restore_first_step_ms="$t_first" \
                annot_detail="crictl checkpoint ${ck} ms, image build ${KA_BUILD_MS} ms, pull --extract ${KA_PULL_MS} ms, create ${K_CREATE_MS} + start ${K_START_MS} ms; $(shim_fields 'restore complete')"
        fi
        k8s_stop_pod "$KPOD"
    fi
    k8s_stop_pod "$pod"
    rm -f "$archive"
    rm -rf "$WORK/ramtmp/checkpoints/$name"
    gpu_wait_free
}

# bench2_own SIZE PROCS: (vi) gpusnap only, no registry: the node's own checkpoint. A CRI pod,
# `ctr -n k8s.io tasks checkpoint --image-path <checkpoint_root>/NAME` of its container (the shim
# seals it and records it as this node's, issue 21 item 4), the pod stopped, a new pod with
# gpusnap.io/restore-from: NAME; the first verified step, from runp and from `crictl start`,
# beside the shim's phase sum for that restore (validate + privilege check + GPU gate + rootfs
# diff + CRIU + CUDA, from its "restore complete" line).
bench2_own() {
    local size=$1 procs=$2 rep=$3 order=$4 name=b2-own-$1-$2-r$3 log m0 mk first t_first="" t_start="" ck="" rc t0 sh=""
    local dir=$WORK/ramtmp/checkpoints/$name
    log=$WORK/gpu/log/$name.log
    say "bench2 $size MiB x $procs proc (vi), rep $rep ($order in its rep): gpusnap, the node's own checkpoint restored by gpusnap.io/restore-from through CRI"
    b2_pod_up vi "$name" "$size" "$procs" || return 1
    local pod=$KPOD
    m0=$(WL mark "$log")
    rm -rf "$dir"
    log_mark
    t0=$(now_ms)
    timeout 600 "$(type -P ctr)" -a "$SOCK" -n k8s.io tasks checkpoint --image-path "$dir" "$KCTR" >"$WORK/logs/$name-ck.out" 2>&1
    rc=$?
    if ((rc != 0)); then
        fail "bench2 (vi) $name: ctr -n k8s.io t checkpoint --image-path failed (rc $rc): $(tail -n 3 "$WORK/logs/$name-ck.out" | tr '\n' ' ')"
        k8s_stop_pod "$pod"
        rm -rf "$dir"
        return 1
    fi
    ck=$(($(now_ms) - t0))
    info "bench2 (vi) $name: checkpoint into checkpoint_root in $ck ms ($(shim_fields 'checkpoint sealed'))"
    # The record is <checkpoint_root>/.gpusnap-node/<sha256 of NAME>.json (checkpoint/src/node_origin.rs).
    local rec
    rec=$WORK/ramtmp/checkpoints/.gpusnap-node/$(printf %s "$name" | sha256sum | cut -d' ' -f1).json
    [[ -f $rec ]] && ok "bench2 (vi) $name: the shim recorded the checkpoint as this node's ($(stat -c '%U %a' "$rec"))" ||
        fail "bench2 (vi) $name: no node record $rec after the checkpoint"
    k8s_stop_pod "$pod"
    mk=$(WL mark "$log")
    gpu_wait_free
    log_mark
    t0=$(now_ms)
    if GPU_PROCS=$procs k8s_start "$name-restored" "$K8S_IMAGE" "$name" "$size" "gpusnap.io/restore-from=$name"; then
        sh=$(shim_fields 'restore complete')
        if WL wait "$log" "$mk" 3 "$procs" $((60 + size / 256)) >/dev/null; then
            first=$(WL firstts "$log" "$mk" "$procs")
            if [[ $first =~ ^[0-9]+$ ]]; then
                t_first=$((first - t0))
                [[ $K_START_T0 =~ ^[0-9]+$ ]] && t_start=$((first - K_START_T0))
            fi
            wl_report < <(WL continuity "$log" "bench2 (vi) $name" "$m0" "$mk" "$procs")
        else
            fail "bench2 (vi) $name: no steps after the restore"
        fi
        k8s_stop_pod "$KPOD"
    else
        shim_lines | tail -n 10 | sed 's/^/  containerd: /'
    fi
    local psum="" v
    for v in $(grep -oE '\b(validate|privilege_check|gpu_gate|rootfs_diff|criu_restore|cuda_restore)_ms=[0-9]+' <<<"$sh" | cut -d= -f2); do
        psum=$((${psum:-0} + v))
    done
    b2_emit size_mib="$size" procs="$procs" rep="$rep" side=gpusnap position=0 own_order="$order" \
        own_first_step_ms="$t_first" own_start_first_step_ms="$t_start" own_phase_sum_ms="$psum" \
        own_detail="ctr t checkpoint --image-path ${ck} ms, create ${K_CREATE_MS} + start ${K_START_MS} ms; $sh"
    rm -rf "$dir"
    gpu_wait_free
}

if has bench2; then
    say "bench2: gpusnap vs reference, sizes $BENCH2_SIZES MiB, processes $BENCH2_PROCS, $BENCH2_REPS rep(s), sides $BENCH2_SIDES, cases $BENCH2_CASES"
    : >"$BENCH2_JSONL"
    sides=()
    [[ ,$BENCH2_SIDES, == *,gpusnap,* ]] && sides+=(gpusnap)
    if [[ ,$BENCH2_SIDES, == *,reference,* ]]; then
        why=$(plugin_missing)
        if [[ -n $why ]]; then note "bench2: reference side skipped: $why"; else sides+=(reference); fi
    fi
    # (vi) runs in every repetition beside the sides, first in one and last in the next, so
    # that its ratio to the reference's (iii) is a median of alternating pairs. It needs only
    # the gpusnap shim: `--bench2-sides reference --bench2-own on` measures (vi) against the
    # reference without gpusnap's own (i)-(iii).
    own=0
    if [[ $BENCH2_OWN == on ]] || [[ $BENCH2_OWN == auto && " ${sides[*]} " == *" gpusnap "* ]]; then own=1; fi
    warm=("${sides[@]}")
    ((own)) && [[ " ${sides[*]} " != *" gpusnap "* ]] && warm+=(gpusnap)
    if ((${#sides[@]} || own)); then
        [[ " ${sides[*]} " == *" reference "* ]] && plugin_install
        # Touch RAM once: the VM's memory is slow the first time it is used.
        max=0
        for s in ${BENCH2_SIZES//,/ }; do ((s > max)) && max=$s; done
        pf=$BENCH2_PREFAULT
        if [[ $pf == auto ]]; then
            memg=$(($(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1048576))
            pf=$((2 * max / 1024 + 4))
            ((pf > memg - 16)) && pf=$((memg - 16))
            ((CPU)) && pf=1
            ((pf < 0)) && pf=0
        fi
        if ((pf > 0)) && time_left 60; then
            t0=$(now_ms)
            dd if=/dev/zero of="$WORK/ramtmp/prefault" bs=64M count=$((pf * 16)) status=none
            rm -f "$WORK/ramtmp/prefault"
            info "bench2: touched $pf GiB of RAM through the tmpfs in $(($(now_ms) - t0)) ms"
        fi
        # Warm-up: one small throw-away checkpoint per side.
        for side in "${warm[@]}"; do
            time_left 60 || break
            id=b2-warm-$side
            rt=$RT
            [[ $side == reference ]] && rt=io.containerd.runc.v2
            if GPU_RT=$rt gpu_run "$id" "$BENCH2_WARMUP" && wl_wait "$WORK/gpu/log/$id.log" 2 60; then
                t0=$(now_ms)
                ctr tasks checkpoint --image-path "$WORK/ramtmp/$id" "$id" >/dev/null 2>&1 &&
                    info "bench2 warm-up $side: $BENCH2_WARMUP MiB checkpoint in $(($(now_ms) - t0)) ms (not measured)" ||
                    note "bench2 warm-up $side: the checkpoint failed"
            else
                note "bench2 warm-up $side: the workload did not start"
            fi
            ctr_stop "$id"
            rm -rf "${WORK:?}/ramtmp/$id"
            for im in $(ctr images ls -q | grep '^containerd.io/checkpoint/'); do ctr images rm --sync "$im" >/dev/null 2>&1; done
            gpu_wait_free
        done
        k=0
        for size in ${BENCH2_SIZES//,/ }; do
            for procs in ${BENCH2_PROCS//,/ }; do
                for ((rep = 1; rep <= BENCH2_REPS; rep++)); do
                    order=("${sides[@]}")
                    if ((${#sides[@]} == 2 && k % 2 == 1)); then order=("${sides[1]}" "${sides[0]}"); fi
                    if ((own)); then
                        if ((k % 2 == 1)); then order=(own "${order[@]}"); else order+=(own); fi
                    fi
                    k=$((k + 1))
                    pos=1
                    for side in "${order[@]}"; do
                        if [[ $side == own ]]; then
                            est=$((30 + size * 6 / 1024))
                            if time_left "$est"; then
                                bench2_own "$size" "$procs" "$rep" "$([[ ${order[0]} == own ]] && echo first || echo last)"
                            else
                                note "bench2 (vi) $size MiB x $procs, rep $rep: skipped: about ${est}s needed"
                            fi
                            continue
                        fi
                        est=$(b2_est "$size")
                        if time_left "$est"; then
                            bench2_side "$side" "$size" "$procs" "$rep" "$pos"
                        else
                            note "bench2 $size MiB x $procs, rep $rep, $side: skipped: about ${est}s needed, $((DEADLINE - $(elapsed_s)))s left"
                        fi
                        pos=$((pos + 1))
                    done
                done
                annot=0
                case $BENCH2_ANNOT in
                on) annot=1 ;;
                auto) ((procs == 1 && size <= 8192)) && annot=1 ;;
                esac
                if ((annot)) && [[ " ${sides[*]} " == *" gpusnap "* ]]; then
                    est=$((30 + size * 10 / 1024))
                    if time_left "$est"; then bench2_annot "$size" "$procs"; else note "bench2 (v) $size MiB x $procs: skipped: about ${est}s needed"; fi
                fi
            done
        done
        ((KEEP_PLUGIN)) || plugin_remove
    fi
fi

# ---------------------------------------------------------------------------------------------
# posixbench: cuda/examples/posix_bench on a tmpfs (or --posixbench-dir)
# ---------------------------------------------------------------------------------------------
if has posixbench; then
    pdir=${POSIXBENCH_DIR:-$WORK/ramtmp/posixbench}
    say "posixbench: posix_bench (posix engine slot pipeline) in $pdir ($(stat -f -c %T "$(dirname "$pdir")" 2>/dev/null)), sizes $POSIXBENCH_SIZES MiB"
    if [[ ! -x $B/bin/posix_bench ]]; then
        note "posixbench: skipped: posix_bench is not in the bundle (it did not build)"
    else
        for size in ${POSIXBENCH_SIZES//,/ }; do
            est=$((20 + size * 5 / 1024))
            if ! time_left "$est"; then
                note "posixbench $size MiB: skipped: about ${est}s needed"
                continue
            fi
            mkdir -p "$pdir"
            if [[ -n $POSIXBENCH_ARGS ]]; then
                read -r -a pargs <<<"$POSIXBENCH_ARGS"
            elif ((size <= 4096)); then
                pargs=(--slots 1,4,8 --chunks-mib 16,64)
            else
                pargs=(--slots 4,8 --chunks-mib 64)
            fi
            if ((CPU)); then
                run_size=$((size > 256 ? 256 : size))
                pargs+=(--fake)
            else
                run_size=$size
                pargs+=(--library "$LIBCUDA")
            fi
            t0=$(now_ms)
            timeout $((DEADLINE - $(elapsed_s) + 5)) posix_bench --dir "$pdir" --size-mib "$run_size" "${pargs[@]}" 2>&1 | tee "$OUTDIR/posixbench-$size.txt"
            rc=${PIPESTATUS[0]}
            ms=$(($(now_ms) - t0))
            row posixbench "posix_bench $run_size MiB ${pargs[*]}" "$ms" - "rc=$rc"
            if ((rc == 0)); then ok "posixbench $run_size MiB in $ms ms (table above, also $OUTDIR/posixbench-$size.txt)"; else fail "posixbench $run_size MiB: rc $rc"; fi
            rm -rf "$pdir"
        done
    fi
fi

