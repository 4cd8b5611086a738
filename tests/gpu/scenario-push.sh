# shellcheck shell=bash
# tests/gpu/scenario-push.sh — sourced by tests/gpu/run-h200.sh after scenario-volume.sh (needs
# its containerd with CRI, its helpers and variables, the k8s helpers of scenarios-more.sh and
# vol_restore of scenario-volume.sh). The scenario push: issue 30's checkpoint half on the GPU,
# the flow tests/tests/k8s_push.rs runs on the CPU.
#
# - A registry that takes pushes: the bundle's docker-registry over HTTPS (a CA and a server
#   certificate for 127.0.0.1 made with the host's openssl, as scripts/lib/bench-replicas.sh
#   makes them) with htpasswd (Basic) authentication, its storage on the tmpfs.
# - The node agent as the installer DaemonSet runs it and as tests/kit/src/push_agent.rs starts
#   it: `gpusnap agent run --checkpoint-dir DIR` (DIR standing in for the kubelet's
#   /var/lib/kubelet/checkpoints, root-only), its node paths (config, CRIU config, state, bin,
#   ready file, status directory) in a scratch directory and every runtime registration skipped;
#   its config (`--config-from`): checkpoint.allowed_destinations = ["127.0.0.1:PORT/ckpt/*"],
#   checkpoint.registry_config (a docker config.json with the registry's password),
#   checkpoint.registry_ca_files (the CA), store.root. No API server: no events, no label. Its
#   install round's doctor fails (no binaries in its scratch bin directory: no --source-dir),
#   which logs "round failed" and gates nothing: the pushes start after the first round
#   whatever it found, as in tests/tests/k8s_push.rs.
# - A GPU pod under the gpusnap handler (`gpu_verify --fleet`, --push-mib of device memory) with
#   the pod annotation `gpusnap.io/checkpoint-to: 127.0.0.1:PORT/ckpt/gpu`; the kubelet's
#   checkpoint API's CRI call, `crictl checkpoint --export` into DIR under the name the kubelet
#   gives (`checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar`).
# - The agent pushes it: its status file says pushed, with the digest and the tags
#   `<container>-<UTC time>-<node>` and `latest`; the registry's API (with the CA and the
#   password) lists both tags and resolves both to that digest, and refuses a request without
#   the password. Reported: archive written (crictl returned) -> status pushed, and the agent's
#   own elapsed_ms and bytes_uploaded from its "checkpoint pushed" line (its 2 s settle time
#   after the archive's last write is in the first, not the second).
# - Restore on a fresh node state: the pod removed, the image never on this containerd (checked),
#   the registry's host and CA in containerd's certs.d (hosts.toml), then the volume scenario's
#   path (vol_restore): `crictl pull --creds` of the stable tag `latest`, a pod with it as an
#   image volume at /gpusnap/checkpoint and `gpusnap.io/restore-from-volume`; the restored
#   gpu_verify continues from the checkpointed step of the same run, 0 mismatches. Reported:
#   pull, CreateContainer -> first verified step, pull -> first verified step, the shim's phases.
# Results: push.jsonl (the push, then the restore), push.txt (the summary).
#
# Options: --push-mib N (default 8192). Time at 8 GiB: about 3-4 minutes with the setup (the
# fleet scenario's 8 GiB build took 17.5 s and its push 4 s on 2026-12-04; the volume
# scenario's pull + image-volume restore of 8 GiB about half a minute). 64 MiB with --cpu: 55 s.

PUSH_MIB=${PUSH_MIB:-8192}
PUSH_JSONL=$OUTDIR/push.jsonl
PUSH_DIR=$WORK/push
PUSH_USER=gpusnap
# A throwaway password for a registry on loopback that lives as long as this call; its bcrypt
# line is fixed so that the device needs no htpasswd (apache2-utils).
PUSH_PASSWORD=gpusnap-gpu-push-test
PUSH_HTPASSWD='gpusnap:$2y$05$6pfHeMk9d17bb3cPWROwauAcH5Ewrf6tnd43kot7Qgol3l5BtP0CK'
PUSH_NODE=gpu-node-a
PUSH_REG_PID="" PUSH_AGENT_PID=""

# push_cleanup: the agent (SIGTERM, as the kubelet stops it) and the registry, by their pids.
push_cleanup() {
    if [[ -n $PUSH_AGENT_PID ]]; then
        kill -TERM "$PUSH_AGENT_PID" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$PUSH_AGENT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$PUSH_AGENT_PID" 2>/dev/null && kill -KILL "$PUSH_AGENT_PID" 2>/dev/null
        wait "$PUSH_AGENT_PID" 2>/dev/null
        PUSH_AGENT_PID=""
    fi
    if [[ -n $PUSH_REG_PID ]]; then
        kill "$PUSH_REG_PID" 2>/dev/null
        wait "$PUSH_REG_PID" 2>/dev/null
        PUSH_REG_PID=""
    fi
}

# push_registry: docker-registry over HTTPS with htpasswd on a free port; sets PUSH_HOST.
push_registry() {
    local d=$PUSH_DIR/tls port
    mkdir -p "$d" "$WORK/ramtmp/push-registry"
    if ! (
        cd "$d" &&
            openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
                -out ca.crt -days 2 -subj "/CN=gpusnap GPU test CA" \
                -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
                -out server.csr -subj /CN=127.0.0.1 &&
            printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'basicConstraints=CA:FALSE' \
                'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >server.ext &&
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                -out server.crt -days 2 -extfile server.ext
    ) >"$WORK/logs/push-tls.log" 2>&1; then
        fail "push: making the registry's certificate failed: $(tail -n 3 "$WORK/logs/push-tls.log" | tr '\n' ' ')"
        return 1
    fi
    printf '%s\n' "$PUSH_HTPASSWD" >"$PUSH_DIR/htpasswd"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    PUSH_HOST=127.0.0.1:$port
    cat >"$PUSH_DIR/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $WORK/ramtmp/push-registry
  delete:
    enabled: true
http:
  addr: $PUSH_HOST
  tls:
    certificate: $d/server.crt
    key: $d/server.key
auth:
  htpasswd:
    realm: gpusnap-gpu-test
    path: $PUSH_DIR/htpasswd
EOF
    "$B/bin/docker-registry" serve "$PUSH_DIR/registry.yml" >"$WORK/logs/push-registry.log" 2>&1 &
    PUSH_REG_PID=$!
    # Up when /v2/ answers (401 without the password is an answer).
    if ! python3 - "$PUSH_HOST" "$d/ca.crt" <<'PY'; then
import ssl, sys, time, urllib.error, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
for _ in range(150):
    try:
        urllib.request.urlopen("https://%s/v2/" % sys.argv[1], timeout=1, context=ctx)
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY
        fail "push: the registry did not come up: $(tail -n 3 "$WORK/logs/push-registry.log" | tr '\n' ' ')"
        return 1
    fi
    python3 - "$PUSH_DIR/docker/config.json" "$PUSH_HOST" "$PUSH_USER:$PUSH_PASSWORD" <<'PY'
import base64, json, os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
json.dump({"auths": {sys.argv[2]: {"auth": base64.b64encode(sys.argv[3].encode()).decode()}}}, open(sys.argv[1], "w"))
os.chmod(sys.argv[1], 0o600)
PY
    # containerd pulls from it (CRI, for the image volume): its host and CA in certs.d.
    mkdir -p "$WORK/containerd/certs.d/$PUSH_HOST"
    printf 'server = "https://%s"\n\n[host."https://%s"]\n  capabilities = ["pull", "resolve"]\n  ca = "%s"\n' \
        "$PUSH_HOST" "$PUSH_HOST" "$d/ca.crt" >"$WORK/containerd/certs.d/$PUSH_HOST/hosts.toml"
    info "push: registry https://$PUSH_HOST ($("$B/bin/docker-registry" --version 2>/dev/null | head -n 1)), htpasswd user $PUSH_USER, storage on the tmpfs; CA in containerd's certs.d"
}

# push_agent WATCHED: `gpusnap agent run` as tests/kit/src/push_agent.rs runs it; sets
# PUSH_AGENT_PID, PUSH_AG (its directory), PUSH_AGENT_LOG.
push_agent() {
    local watched=$1
    PUSH_AG=$PUSH_DIR/agent
    PUSH_AGENT_LOG=$WORK/logs/push-agent.log
    mkdir -p "$PUSH_AG"
    cat >"$PUSH_AG/config-source.toml" <<EOF
[checkpoint]
allowed_destinations = ["$PUSH_HOST/ckpt/*"]
registry_config = "$PUSH_DIR/docker/config.json"
registry_ca_files = ["$PUSH_DIR/tls/ca.crt"]

[store]
root = "$WORK/ramtmp/push-agent-store"
EOF
    GPUSNAP_LOG=warn,gpusnap_cli::checkpoint_push=debug gpusnap --config "$PUSH_AG/etc/config.toml" agent run \
        --config-from="$PUSH_AG/config-source.toml" --skip-containerd --skip-crio --skip-podman \
        --criu-config="$PUSH_AG/etc/criu/runc.conf" --state-file="$PUSH_AG/state/install.json" \
        --bin-dir="$PUSH_AG/bin" --ready-file="$PUSH_AG/run/ready" --node-name="$PUSH_NODE" \
        --checkpoint-dir="$watched" --push-status-dir="$PUSH_AG/status" --recheck-seconds=3600 \
        --service-account-dir="$PUSH_AG/no-sa" </dev/null >"$PUSH_AGENT_LOG" 2>&1 &
    PUSH_AGENT_PID=$!
    for _ in $(seq 600); do
        grep -q 'watching for checkpoint archives' "$PUSH_AGENT_LOG" && break
        kill -0 "$PUSH_AGENT_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q 'watching for checkpoint archives' "$PUSH_AGENT_LOG"; then
        fail "push: the agent did not start watching $watched: $(tail -n 5 "$PUSH_AGENT_LOG" | tr '\n' ' ')"
        return 1
    fi
    ok "push: gpusnap agent run (pid $PUSH_AGENT_PID) watches $watched"
}

# push_state NAME: the state of archive NAME's status record (empty while there is none).
push_state() {
    python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get("state", ""))
except Exception: print("")' "$PUSH_AG/status/$1.json"
}

# push_check_registry RECORD REPO: the registry lists both tags of the record and resolves them to
# its digest; without the password it refuses. Prints one line per check (OK/FAIL).
push_check_registry() {
    python3 - "$1" "$2" "$PUSH_HOST" "$PUSH_DIR/tls/ca.crt" "$PUSH_USER:$PUSH_PASSWORD" "$PUSH_NODE" <<'PY'
import base64, json, re, ssl, sys, urllib.error, urllib.request
rec = json.load(open(sys.argv[1]))
repo_ref, host, ca, cred, node = sys.argv[2:7]
repo = repo_ref.split("/", 1)[1]
ctx = ssl.create_default_context(cafile=ca)
auth = "Basic " + base64.b64encode(cred.encode()).decode()
ACCEPT = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json"])
def get(path, method="GET", with_auth=True):
    req = urllib.request.Request("https://%s%s" % (host, path), method=method,
                                 headers={"Accept": ACCEPT, **({"Authorization": auth} if with_auth else {})})
    return urllib.request.urlopen(req, timeout=30, context=ctx)
bad = 0
def check(cond, text):
    global bad
    print(("OK " if cond else "FAIL ") + text)
    bad += 0 if cond else 1
refs = rec.get("references") or []
digest = rec.get("digest") or ""
check(rec.get("state") == "pushed", "push: the agent's status record says pushed (%s)" % rec.get("state"))
check(len(refs) == 2 and refs[1] == repo_ref + ":latest", "push: two tags, the second %s:latest: %s" % (repo_ref, refs))
unique = refs[0].split(":")[-1] if refs else ""
check(re.fullmatch(r"gpu-\d{8}T\d{6}Z-" + re.escape(node), unique) is not None,
      "push: the unique tag is <container>-<YYYYMMDDTHHMMSSZ>-<node>: %s" % unique)
try:
    tags = json.load(get("/v2/%s/tags/list" % repo)).get("tags") or []
except Exception as e:
    tags = []
    print("registry: tags/list: %s" % e)
check("latest" in tags and unique in tags, "push: the registry lists %s: %s" % (repo, sorted(tags)))
for t in ("latest", unique):
    try:
        d = get("/v2/%s/manifests/%s" % (repo, t), method="HEAD").headers.get("Docker-Content-Digest")
    except Exception as e:
        d = "error: %s" % e
    check(d == digest, "push: %s:%s resolves to the record's digest %s (%s)" % (repo, t, digest[:19], (d or "")[:19]))
try:
    get("/v2/%s/tags/list" % repo, with_auth=False)
    check(False, "push: the registry answered without the password")
except urllib.error.HTTPError as e:
    check(e.code == 401, "push: without the password the registry refuses (%d)" % e.code)
sys.exit(1 if bad else 0)
PY
}

# push_table: push.txt from push.jsonl.
push_table() {
    python3 - "$PUSH_JSONL" "$OUTDIR/push.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
p = next((r for r in rows if r.get("what") == "push"), {})
rs = [r for r in rows if r.get("side") == "gpusnap"]
out = ["push: gpusnap.io/checkpoint-to on the GPU, %s MiB (node agent -> docker-registry over HTTPS, "
       "then an image-volume restore from the pushed image on a fresh node state)" % p.get("size_mib")]
def n(v):
    return "-" if v is None else v
def s(v):
    return "%.3f s" % (v / 1000.0) if isinstance(v, (int, float)) else "-"
out.append("  crictl checkpoint --export (archive in the watched directory)  %s (%s bytes)" % (s(p.get("checkpoint_ms")), p.get("archive_bytes")))
out.append("  archive written -> image in the registry (status pushed)        %s" % s(p.get("push_ms")))
out.append("    the agent's own build + push (its elapsed_ms; after 2 s settle) %s, %s bytes uploaded" % (s(p.get("agent_elapsed_ms")), p.get("bytes_uploaded")))
out.append("    registry storage after the push                              %s bytes" % p.get("registry_bytes"))
for r in rs:
    out.append("  restore from %s:" % r.get("ref", "the pushed image"))
    out.append("    crictl pull (containerd, HTTPS + password)                   %s" % s(r.get("pull_ms")))
    out.append("    CreateContainer -> first verified step                       %s" % s(r.get("create_first_step_ms")))
    out.append("    pull -> first verified step                                  %s" % s(r.get("pull_first_step_ms")))
    out.append("    shim: volume copy %s ms, checks %s ms, criu %s ms, cuda %s ms, total %s ms" % (
        n(r.get("volume_copy_ms")), n(r.get("checks_ms")), n(r.get("criu_restore_ms")), n(r.get("cuda_restore_ms")), n(r.get("shim_total_ms"))))
    out.append("    verified (continuity, 0 mismatches): %s" % ("yes" if r.get("ok") == 1 else "NO"))
if not rs:
    out.append("  restore: not run")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

if has push; then
    say "push: gpusnap.io/checkpoint-to on the GPU: $PUSH_MIB MiB pod, node agent push over HTTPS, image-volume restore from the pushed image"
    : >"$PUSH_JSONL"
    missing=()
    [[ -x $B/bin/docker-registry ]] || missing+=("docker-registry (bundle)")
    command -v openssl >/dev/null || missing+=(openssl)
    if ((${#missing[@]})); then
        fail "push: not run: ${missing[*]} missing"
    elif ! time_left $((90 + PUSH_MIB * 20 / 1024)); then
        note "push: skipped: past the deadline"
    elif k8s_setup && push_registry; then
        watched=$WORK/ramtmp/kubelet/checkpoints
        mkdir -p "$watched" && chmod 0700 "$WORK/ramtmp/kubelet" "$watched"
        repo=$PUSH_HOST/ckpt/gpu
        if push_agent "$watched"; then
            name=pa
            log=$WORK/gpu/log/$name.log
            rm -f "$log"
            if K_RUNTIME=gpusnap GPU_FLEET=1 k8s_start "$name" "$K8S_IMAGE" "$name" "$PUSH_MIB" "gpusnap.io/checkpoint-to=$repo" &&
                WL wait "$log" 0 2 1 $((60 + PUSH_MIB / 256)) >/dev/null; then
                ok "push: $PUSH_MIB MiB fleet workload up in pod $name, annotated gpusnap.io/checkpoint-to: $repo"
                pod=$KPOD
                # The kubelet's name: checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar
                archive_name=checkpoint-${name}_default-gpu-$(date -u +%Y-%m-%dT%H:%M:%SZ).tar
                archive=$watched/$archive_name
                VOL_M0_pa=$(WL mark "$log")
                if k8s_checkpoint "$KCTR" "$archive" push-ck; then
                    t_written=$(now_ms)
                    ck_ms=$KCK_MS
                    abytes=$(stat -c %s "$archive")
                    k8s_stop_pod "$pod"
                    VOL_MK_pa=$(WL mark "$log")
                    gpu_wait_free
                    # The push: until the status record is final (the agent retries a registry
                    # that does not answer, up to push_attempts).
                    st="" t_pushed=""
                    limit=$((120 + PUSH_MIB * 30 / 1024))
                    end=$(($(now_ms) + limit * 1000))
                    while (($(now_ms) < end)); do
                        st=$(push_state "$archive_name")
                        [[ $st =~ ^(pushed|refused|failed|not-requested)$ ]] && break
                        kill -0 "$PUSH_AGENT_PID" 2>/dev/null || break
                        sleep 0.1
                    done
                    [[ $st == pushed ]] && t_pushed=$(now_ms)
                    rec=$PUSH_AG/status/$archive_name.json
                    { cat "$rec" 2>/dev/null; echo; } | sed '/^$/d; s/^/  status: /' | head -n 30
                    grep -E 'pushing checkpoint|checkpoint pushed|refused|failed|error|ERROR|WARN' "$PUSH_AGENT_LOG" | tail -n 8 | sed 's/^/  agent: /'
                    pushed_line=$(grep 'checkpoint pushed' "$PUSH_AGENT_LOG" | tail -n 1)
                    a_elapsed=$(grep -oE 'elapsed_ms[=": ]+[0-9]+' <<<"$pushed_line" | grep -oE '[0-9]+$')
                    a_bytes=$(grep -oE 'bytes_uploaded[=": ]+[0-9]+' <<<"$pushed_line" | grep -oE '[0-9]+$')
                    reg_bytes=$(du -sb "$WORK/ramtmp/push-registry" | cut -f1)
                    push_ms=""
                    if [[ $st == pushed ]]; then
                        push_ms=$((t_pushed - t_written))
                        ok "push: archive written -> pushed in $push_ms ms (the agent's elapsed_ms ${a_elapsed:-?}, ${a_bytes:-?} bytes uploaded; registry holds $reg_bytes bytes)"
                        wl_report < <(push_check_registry "$rec" "$repo")
                    else
                        fail "push: the agent did not push $archive_name within $limit s: state '${st:-none}' (agent log: $PUSH_AGENT_LOG)"
                    fi
                    row push "archive written -> image in registry" "${push_ms:--}" "${a_elapsed:--}" "agent elapsed_ms; ${a_bytes:-?} bytes uploaded"
                    BENCH2_JSONL=$PUSH_JSONL b2_emit what=push size_mib="$PUSH_MIB" archive="$archive_name" \
                        archive_bytes="$abytes" checkpoint_ms="$ck_ms" push_ms="$push_ms" \
                        agent_elapsed_ms="$a_elapsed" bytes_uploaded="$a_bytes" registry_bytes="$reg_bytes" \
                        state="$st" record="$(cat "$rec" 2>/dev/null || echo null)"
                    # The agent is done: stopped as the kubelet stops it (SIGTERM), so that it
                    # takes no CPU from the restore.
                    if [[ -n $PUSH_AGENT_PID ]]; then
                        kill -TERM "$PUSH_AGENT_PID" 2>/dev/null
                        for _ in $(seq 100); do kill -0 "$PUSH_AGENT_PID" 2>/dev/null || break; sleep 0.1; done
                        if kill -0 "$PUSH_AGENT_PID" 2>/dev/null; then
                            fail "push: the agent did not exit within 10 s of SIGTERM"
                            kill -KILL "$PUSH_AGENT_PID" 2>/dev/null
                        fi
                        wait "$PUSH_AGENT_PID" 2>/dev/null
                        arc=$?
                        ((arc == 0)) && ok "push: the agent exited 0 on SIGTERM" || fail "push: the agent exited $arc on SIGTERM"
                        PUSH_AGENT_PID=""
                    fi
                    # The agent only read the archive; with the agent gone it goes, and the
                    # agent's store with it (RAM on the tmpfs for the restore).
                    rm -rf "$archive" "$WORK/ramtmp/push-agent-store"
                    # Restore from the pushed image on a fresh node state, by the image-volume path.
                    if [[ $st == pushed ]] && time_left $((60 + PUSH_MIB / 64)); then
                        ref=$repo:latest
                        rm -rf "$WORK/ramtmp/checkpoints/.gpusnap-volumes"/* 2>/dev/null
                        if vol_fresh "$ref"; then
                            VOL_MIB=$PUSH_MIB VOL_JSONL=$PUSH_JSONL VOL_PULL_CREDS=$PUSH_USER:$PUSH_PASSWORD \
                                vol_restore gpusnap "$name" "$ref" 1 first
                            check_clean "$log" "push: the restored workload"
                            crictl rmi "$ref" >/dev/null 2>&1
                        fi
                    elif [[ $st == pushed ]]; then
                        note "push: the restore from the pushed image skipped: past the deadline"
                    fi
                else
                    k8s_stop_pod "$pod"
                fi
            else
                fail "push: the workload did not start in pod $name: $(tail -n 2 "$log" 2>&1 | tr '\n' ' ')"
                k8s_stop_pod "$KPOD"
            fi
        fi
        [[ -s $PUSH_JSONL ]] && push_table
        push_cleanup
        rm -rf "$WORK/ramtmp/push-registry" "$WORK/ramtmp/push-agent-store" "$WORK/ramtmp/kubelet"
        gpu_wait_free
    fi
fi
