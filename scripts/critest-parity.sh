#!/usr/bin/env bash
# scripts/critest-parity.sh — the CRI validation suite (critest, cri-tools v1.36) against the
# gpusnap shim, with containerd-shim-runc-v2 as the control.
#
# Starts a private containerd (own root, state, sockets, CNI config and registry hosts under a
# temporary directory) with CRI runtime handlers `runc` (io.containerd.runc.v2) and `gpusnap`
# (io.containerd.gpusnap.v2, the shim built in target/debug), a local docker-registry holding
# busybox-based stand-ins for critest's images (cri-mkimages.py, see
# ../shared/tools/cri-tools/README.md), then runs critest once per handler with the same
# --ginkgo.seed and compares the per-test results (ginkgo JSON reports).
#
# Fails when a test passes with runc and does not pass with gpusnap, unless
# tests/critest/allow-list.txt lists it (with the reason). Prints passed/failed/skipped per
# handler and every difference.
#
# Needs root and what scripts/setup-env.sh installs (containerd, critest, cri-mkimages.py,
# docker-registry, containernetworking-plugins, a C compiler for the static pause/nonewprivs
# stand-ins). Environment:
#   GPUSNAP_SHIM_BIN      the shim to test (default ${CARGO_TARGET_DIR:-<repo>/target}/debug/containerd-shim-gpusnap-v2)
#   CRITEST_SEED          ginkgo seed (default 20261203)
#   CRITEST_HANDLERS      handlers to run, in order (default "runc gpusnap")
#   CRITEST_FOCUS         optional --ginkgo.focus regexp (debugging; parity needs the full suite)
#   CRITEST_ARGS          more critest/ginkgo flags, e.g. --ginkgo.repeat=20 (debugging)
#   CRITEST_KEEP=1        keep the temporary directory (logs, reports)
#   CRITEST_MAX_CONTROL_FAILURES  most failures the runc run may have before the environment
#                         counts as broken (default 5; 2 fail offline for any runtime)
#   GPUSNAP_CRITEST_TIMEOUT  seconds one critest run (one handler) may take (default 420; a
#                         full run takes about 90 s here); past it critest is killed and the
#                         script fails naming the handler and the limit
#   CRITEST_COMPARE_ONLY=DIR  only compare the report-<handler>.json files a kept run left in DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)

RIG_PREFIX=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
RIG_BIN=$RIG_PREFIX/bin
SHIM=${GPUSNAP_SHIM_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/debug/containerd-shim-gpusnap-v2}
SEED=${CRITEST_SEED:-20261203}
CRITEST_TIMEOUT=${GPUSNAP_CRITEST_TIMEOUT:-420}
HANDLERS=${CRITEST_HANDLERS:-runc gpusnap}
ALLOW=$REPO/tests/critest/allow-list.txt
CNI_BIN=/usr/lib/cni
REGISTRY_BIN=/usr/bin/docker-registry

log() { printf '[critest-parity] %s\n' "$*"; }
die() { printf '[critest-parity] ERROR: %s\n' "$*" >&2; exit 2; }

# compare DIR: the per-test results of report-<handler>.json in DIR, handler against handler;
# exit 1 when a test passes with the first handler and not with the second, unless allowed.
compare() {
python3 - "$ALLOW" "$1" $HANDLERS <<'EOF'
import json, os, sys

allow_file, tmp, handlers = sys.argv[1], sys.argv[2], sys.argv[3:]

def results(h):
    """{test name: (state, failure message)} of one ginkgo JSON report."""
    out = {}
    for suite in json.load(open(f"{tmp}/report-{h}.json")):
        for s in suite.get("SpecReports") or []:
            if s.get("LeafNodeType") != "It":
                continue  # suite set-up/tear-down nodes
            name = " ".join([t for t in s.get("ContainerHierarchyTexts") or []] + [s["LeafNodeText"]])
            msg = ((s.get("Failure") or {}).get("Message") or "").strip().splitlines()
            out[name] = (s["State"], msg[0][:160] if msg else "")
    return out

allowed = {}
for line in open(allow_file):
    line = line.split("#", 1)[0].strip()
    if line:
        allowed[line] = True

res = {h: results(h) for h in handlers}
print()
print(f"{'handler':<10} {'passed':>7} {'failed':>7} {'skipped':>8} {'other':>6} {'total':>6}")
for h in handlers:
    st = [s for s, _ in res[h].values()]
    p, f, sk = st.count("passed"), st.count("failed"), st.count("skipped")
    print(f"{h:<10} {p:>7} {f:>7} {sk:>8} {len(st) - p - f - sk:>6} {len(st):>6}")

if len(handlers) < 2:
    sys.exit(0)
ref, test = handlers[0], handlers[1]
names = sorted(set(res[ref]) | set(res[test]))
diffs = [(n, res[ref].get(n, ("absent", "")), res[test].get(n, ("absent", ""))) for n in names
         if res[ref].get(n, ("absent",))[0] != res[test].get(n, ("absent",))[0]]
print()
if diffs:
    print(f"differences ({ref} -> {test}):")
for n, (a, _), (b, msg) in diffs:
    mark = ""
    if a == "passed" and b != "passed":
        mark = "  [allowed]" if n in allowed else "  [REGRESSION]"
    print(f"  {a:>8} -> {b:<8} {n}{mark}")
    if msg:
        print(f"           {msg}")
failed_both = sorted(n for n in names if res[ref].get(n, ("",))[0] == "failed"
                     and res[test].get(n, ("",))[0] == "failed")
if failed_both:
    print(f"\nfailed with both:")
    for n in failed_both:
        print(f"  {n}")
stale = sorted(n for n in allowed if n not in res[test])
if stale:
    print("\nallow-list entries critest did not run (stale?):")
    for n in stale:
        print(f"  {n}")
regressions = [n for n, (a, _), (b, _) in diffs if a == "passed" and b != "passed" and n not in allowed]
print()
# A broken environment fails the control run too, and then "no difference" would mean nothing.
control_failed = [n for n, (s, _) in res[ref].items() if s == "failed"]
max_control = int(os.environ.get("CRITEST_MAX_CONTROL_FAILURES", "5"))
if len(control_failed) > max_control or not any(s == "passed" for s, _ in res[ref].values()):
    print(f"FAIL: the control run ({ref}) failed {len(control_failed)} tests (more than "
          f"{max_control}): the environment is broken, see critest-{ref}.log")
    sys.exit(1)
if regressions:
    print(f"FAIL: {len(regressions)} test(s) pass with {ref} and not with {test} (not in {allow_file})")
    sys.exit(1)
print(f"OK: no test passes with {ref} and not with {test} (allow-list: {len(allowed)} entries)")
EOF
}

if [[ -n ${CRITEST_COMPARE_ONLY:-} ]]; then
    compare "$CRITEST_COMPARE_ONLY"
    exit
fi

[[ $(id -u) -eq 0 ]] || die "needs root (containerd, runc, CNI)"
for f in "$RIG_BIN/containerd" "$RIG_BIN/critest" "$RIG_BIN/crictl" "$RIG_BIN/cri-mkimages.py" \
    "$RIG_PREFIX/images/busybox.oci.tar" "$RIG_PREFIX/images/pause.oci.tar" "$REGISTRY_BIN" \
    "$CNI_BIN/bridge" "$CNI_BIN/portmap" "$CNI_BIN/loopback"; do
    [[ -e $f ]] || die "$f missing: run scripts/setup-env.sh"
done
[[ -x $SHIM ]] || die "$SHIM missing: cargo build -p gpusnap-shim (or set GPUSNAP_SHIM_BIN)"
command -v cc >/dev/null || die "no C compiler (cc) for the static pause and nonewprivs stand-ins"
command -v python3 >/dev/null || die "python3 missing"

# Short path: containerd's socket path must fit in sun_path.
TMP=$(mktemp -d /tmp/gsct-XXXXXX)
CONTAINERD_PID=
REGISTRY_PID=
BRIDGE=gsct$((RANDOM % 100000))
SUBNET_OCTET=$((RANDOM % 250 + 1))
SUBNET=10.231.$SUBNET_OCTET.0/24

printf 'runtime-endpoint: unix://%s/c.sock\nimage-endpoint: unix://%s/c.sock\ntimeout: 30\n' \
    "$TMP" "$TMP" >"$TMP/crictl.yaml"
CRICTL=("$RIG_BIN/crictl" --config "$TMP/crictl.yaml")

cleanup() {
    local rc=$?
    set +e
    if [[ -n $CONTAINERD_PID ]] && kill -0 "$CONTAINERD_PID" 2>/dev/null; then
        # Pods critest left behind (a hung teardown), removed through CRI first.
        for p in $("${CRICTL[@]}" pods -q 2>/dev/null); do
            "${CRICTL[@]}" stopp "$p" >/dev/null 2>&1
            "${CRICTL[@]}" rmp -f "$p" >/dev/null 2>&1
        done
        kill -TERM "$CONTAINERD_PID"
        for _ in $(seq 100); do kill -0 "$CONTAINERD_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$CONTAINERD_PID" 2>/dev/null
    fi
    # Shims this containerd started (they carry its socket path), by pid.
    local pid
    for pid in $(pgrep -f -- "-address $TMP/c.sock" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null
    done
    # runc containers whose bundle lies under our state dir (the runc root is shared with other
    # containerds in CRI's k8s.io namespace).
    if command -v runc >/dev/null; then
        runc --root /run/containerd/runc/k8s.io list -f json 2>/dev/null |
            python3 -c 'import json,sys
for c in json.load(sys.stdin) or []:
    if c["bundle"].startswith(sys.argv[1]): print(c["id"])' "$TMP/" 2>/dev/null |
            while read -r id; do
                runc --root /run/containerd/runc/k8s.io delete --force "$id" >/dev/null 2>&1
            done
    fi
    [[ -n $REGISTRY_PID ]] && kill -TERM "$REGISTRY_PID" 2>/dev/null
    # Mounts under our directory, innermost first.
    findmnt -rn -o TARGET | grep -F "$TMP/" | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null
    done
    ip link del "$BRIDGE" >/dev/null 2>&1
    if [[ ${CRITEST_KEEP:-0} == 1 || $rc -ne 0 ]]; then
        log "kept $TMP (containerd.log, critest-*.log, report-*.json)"
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

T0=$SECONDS
mkdir -p "$TMP"/{bin,root,state,opt,net.d,certs.d,registry,src,gpusnap-checkpoints}

# --- static C stand-ins: Kubernetes-like pause and the nonewprivs test binary ---------------
cat >"$TMP/src/pause.c" <<'EOF'
/* A pause like Kubernetes': sleeps in pause(), reaps children (the pod's pid namespace
   init), exits 0 on SIGINT/SIGTERM. Written for gpusnap's critest run. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction q = {0}, r = {0};
    q.sa_handler = quit;
    sigaction(SIGINT, &q, NULL);
    sigaction(SIGTERM, &q, NULL);
    r.sa_handler = reap;
    r.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &r, NULL);
    for (;;) pause();
}
EOF
cat >"$TMP/src/nnp.c" <<'EOF'
/* Prints the effective uid, installed setuid root: what critest's no_new_privs tests read. */
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", (int)geteuid()); return 0; }
EOF
cc -static -O2 -o "$TMP/src/pause" "$TMP/src/pause.c"
cc -static -O2 -o "$TMP/src/nnp" "$TMP/src/nnp.c"

# --- local registry with critest's images (stand-ins) ---------------------------------------
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REG=127.0.0.1:$PORT
cat >"$TMP/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $TMP/registry/storage
  delete:
    enabled: true
http:
  addr: $REG
EOF
"$REGISTRY_BIN" serve "$TMP/registry/config.yml" >"$TMP/registry/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || die "registry not listening on $REG"
NNP_BIN=$TMP/src/nnp PAUSE_BIN=$TMP/src/pause \
    python3 "$RIG_BIN/cri-mkimages.py" "$RIG_PREFIX/images" "$REG" >"$TMP/mkimages.log" 2>&1 ||
    { cat "$TMP/mkimages.log" >&2; die "cri-mkimages.py failed"; }

# containerd's CRI sends critest's registries to the local one (plain HTTP).
for host in registry.k8s.io k8s.gcr.io gcr.io docker.io; do
    mkdir -p "$TMP/certs.d/$host"
    cat >"$TMP/certs.d/$host/hosts.toml" <<EOF
server = "https://$host"

[host."http://$REG"]
  capabilities = ["pull", "resolve"]
EOF
done

# --- CNI: a private bridge on a private subnet, with port mapping ---------------------------
cat >"$TMP/net.d/10-critest.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gsct-$SUBNET_OCTET",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$SUBNET"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$TMP/cni-ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF

# --- containerd -----------------------------------------------------------------------------
ln -s "$SHIM" "$TMP/bin/containerd-shim-gpusnap-v2"
printf '[restore]\ncheckpoint_root = "%s"\n' "$TMP/gpusnap-checkpoints" >"$TMP/gpusnap.toml"
cat >"$TMP/config.toml" <<EOF
# generated by scripts/critest-parity.sh
version = 3
root = "$TMP/root"
state = "$TMP/state"

[grpc]
  address = "$TMP/c.sock"

[ttrpc]
  address = "$TMP/c.sock.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "$TMP/opt"

# No CAP_SYS_RESOURCE on CI machines: pause's oom_score_adj -998 would fail every pod.
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap]
  runtime_type = "io.containerd.gpusnap.v2"
  pod_annotations = ["gpusnap.io/*"]

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpusnap.options]
  ConfigPath = "$TMP/gpusnap.toml"

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$CNI_BIN"]
  conf_dir = "$TMP/net.d"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.k8s.io/pause:3.10"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "$TMP/certs.d"

# A random streaming port: other containerds on this machine may hold 10010.
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  socket_path = "$TMP/nri.sock"
  plugin_path = "$TMP/nri/plugins"
  plugin_config_path = "$TMP/nri/conf.d"
EOF
PATH="$TMP/bin:$RIG_BIN:$PATH" "$RIG_BIN/containerd" --config "$TMP/config.toml" \
    >"$TMP/containerd.log" 2>&1 </dev/null &
CONTAINERD_PID=$!
for _ in $(seq 300); do
    [[ -S $TMP/c.sock ]] && "${CRICTL[@]}" version >/dev/null 2>&1 && break
    kill -0 "$CONTAINERD_PID" 2>/dev/null || { tail -30 "$TMP/containerd.log" >&2; die "containerd exited"; }
    sleep 0.1
done
"${CRICTL[@]}" version >/dev/null ||
    die "containerd's CRI does not answer on $TMP/c.sock"
log "containerd $("$RIG_BIN/containerd" --version | awk '{print $3}'), registry $REG, bridge $BRIDGE ($SUBNET), seed $SEED  [t+$((SECONDS - T0))s]"

# --- critest, once per handler --------------------------------------------------------------
for h in $HANDLERS; do
    t=$SECONDS
    args=(--runtime-endpoint "unix://$TMP/c.sock" --image-endpoint "unix://$TMP/c.sock"
        --runtime-handler "$h" --runtime-service-timeout=60s
        --ginkgo.seed="$SEED" --ginkgo.no-color --ginkgo.json-report="$TMP/report-$h.json")
    [[ -n ${CRITEST_FOCUS:-} ]] && args+=(--ginkgo.focus="$CRITEST_FOCUS")
    # shellcheck disable=SC2206 # word splitting wanted: extra flags
    [[ -n ${CRITEST_ARGS:-} ]] && args+=($CRITEST_ARGS)
    log "critest --runtime-handler $h ..."
    # critest exits non-zero when a test fails; the comparison below decides. A hung critest
    # (timeout's 124, or 137 after --kill-after) fails the run here, with its log's tail.
    rc=0
    timeout --kill-after=30 "$CRITEST_TIMEOUT" "$RIG_BIN/critest" "${args[@]}" \
        >"$TMP/critest-$h.log" 2>&1 || rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        tail -40 "$TMP/critest-$h.log" >&2
        die "TIMEOUT: critest --runtime-handler $h ran past ${CRITEST_TIMEOUT}s (GPUSNAP_CRITEST_TIMEOUT) and was killed; the test it was running is the last one in critest-$h.log"
    fi
    [[ -s $TMP/report-$h.json ]] || { tail -40 "$TMP/critest-$h.log" >&2; die "critest ($h) wrote no report"; }
    log "critest --runtime-handler $h: $((SECONDS - t))s"
done

compare "$TMP"
log "done  [t+$((SECONDS - T0))s]"
