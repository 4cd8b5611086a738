#!/usr/bin/env bash
# packaging/test/test-image.sh IMAGE HELM — the installer image run under Podman as the chart's
# DaemonSet runs it, against a fake node, for each layout preset (containerd, k3s, rke2):
#
#   1. the chart is rendered for the preset (helm template) and its pod played by Podman
#      (pod.py: image, command, env, privileges, hostPID, every hostPath, ConfigMap and Secret
#      volume, the service account's token directory);
#   2. the node is this machine's in a private mount namespace whose node paths (containerd's
#      configuration and socket directories, /etc/gpusnap, /var/lib/gpusnap, the binary
#      directory, /etc/criu, /var/lib/kubelet) are fresh tmpfs with the layout's files; a real containerd
#      (the rig's 2.1) runs there under a supervisor loop, which renders k3s/RKE2 templates
#      into config.toml before each start as k3s does; restarting it is the layout's restart;
#   3. install → the readiness probe passes (doctor on the node, containerd answering with the
#      handler loaded) → the node labelled → SIGTERM (podman stop) → containerd's
#      configuration back to the byte, the handler gone from containerd, the label removed;
#   4. an upgrade (a second pod) finds the node's gpusnap config and keys kept, unchanged;
#   5. `helm uninstall`: the chart's pre-delete hook Job (its command, from the rendering) deletes
#      the DaemonSet in the foreground; the installer pod, on SIGTERM, sees it being deleted and
#      removes everything; the hook, once the DaemonSet is gone, clears the node's label: every
#      node path is as it was before the first install.
#
# What differs from a cluster: the API server is fake-apiserver.py (no API server runs here),
# reached over the host network; the node's mount namespace is the test's, not PID 1's
# (--host-mount-ns); the restart command is the supervisor's (no systemd here).
set -euo pipefail
IMAGE=$1
HELM=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PY:-python3}
RIG=${GPUSNAP_RIG_BIN:-/opt/gpusnap-rig/bin}
GPUSNAP=${GPUSNAP_CLI_BIN:-$ROOT/target/debug/gpusnap}

if [[ ${GPUSNAP_IMAGE_TEST_NS:-} != 1 ]]; then
    # The fake node's paths are mounts in a mount namespace of the test's own: nothing of this
    # machine's /etc, /usr/local/bin or /var/lib is touched.
    exec env GPUSNAP_IMAGE_TEST_NS=1 unshare --mount --propagation private "$0" "$@"
fi

fail() { echo "test-image.sh: FAIL: $*" >&2; exit 1; }
say() { printf '\n--> %s\n' "$*"; }
T=$(mktemp -d /tmp/gpusnap-image-test.XXXXXX)
SUPERVISOR=
API=
cleanup() {
    podman rm -f -t 0 gpusnap-installer-test gpusnap-uninstall-test >/dev/null 2>&1 || true
    touch "$T/stop-containerd"
    [[ -n $SUPERVISOR ]] && kill "$SUPERVISOR" 2>/dev/null || true
    [[ -f $T/containerd.pid ]] && kill "$(cat "$T/containerd.pid")" 2>/dev/null || true
    [[ -n $API ]] && kill "$API" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

# --- the fake API server and the service account the pod gets
"$PY" "$HERE/fake-apiserver.py" "$T/api.port" "$T/api.log" "$T/ds-deleting" &
API=$!
for _ in $(seq 100); do [[ -s $T/api.port ]] && break; sleep 0.1; done
[[ -s $T/api.port ]] || fail "fake API server did not start"
install -d "$T/pod/serviceaccount" "$T/secrets/test-keys"
printf test-token >"$T/pod/serviceaccount/token"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/ca.key" \
    -out "$T/pod/serviceaccount/ca.crt" -subj /CN=test-ca -days 2 2>/dev/null
printf gpusnap-system >"$T/pod/serviceaccount/namespace"
openssl ecparam -genkey -name prime256v1 2>/dev/null | openssl ec -pubout 2>/dev/null \
    >"$T/secrets/test-keys/release.pub"

# The layouts: containerd's config (file or template), its rendered config, socket, and root.
layout_vars() {
    case $1 in
        containerd)
            CONF_DIR=/etc/containerd; CONFIG=/etc/containerd/config.toml; TEMPLATE=
            SOCKET=/run/containerd/containerd.sock; STATE_ROOT=/var/lib/containerd
            BIN_DIR=/usr/local/bin; EXTRA_SET=() ;;
        k3s)
            CONF_DIR=/var/lib/rancher/k3s/agent/etc/containerd; CONFIG=$CONF_DIR/config.toml
            TEMPLATE=$CONF_DIR/config-v3.toml.tmpl
            SOCKET=/run/k3s/containerd/containerd.sock; STATE_ROOT=/var/lib/rancher/k3s/agent/containerd
            BIN_DIR=/usr/local/bin; EXTRA_SET=() ;;
        rke2)
            CONF_DIR=/var/lib/rancher/rke2/agent/etc/containerd; CONFIG=$CONF_DIR/config.toml
            TEMPLATE=$CONF_DIR/config-v3.toml.tmpl
            SOCKET=/run/k3s/containerd/containerd.sock; STATE_ROOT=/var/lib/rancher/rke2/agent/containerd
            # A node whose /usr is read-only: the binaries go elsewhere.
            BIN_DIR=/opt/gpusnap-node/bin; EXTRA_SET=(--set layout.binDir=$BIN_DIR) ;;
    esac
}

# The containerd configuration a node of this layout has before gpusnap (k3s: what k3s
# renders from its base template). Version 3, the CRI plugin on, all state private.
base_config() {
    cat <<CONF
# containerd configuration of a $1 node (packaging/test/test-image.sh)
version = 3
root = "$STATE_ROOT/root"
state = "$(dirname "$SOCKET")/state"

[grpc]
  address = "$SOCKET"

[ttrpc]
  address = "$SOCKET.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "$STATE_ROOT/opt"

[plugins.'io.containerd.cri.v1.runtime']
  # the operator's own setting, which must survive install and uninstall
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$STATE_ROOT/cni/bin"]
  conf_dir = "$STATE_ROOT/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  disable = true
CONF
}

# Every file under the node paths with its mode and SHA-256 (containerd's own state aside).
snapshot() {
    local d
    for d in "$CONF_DIR" /etc/gpusnap /var/lib/gpusnap "$BIN_DIR" /etc/criu; do
        [[ -d $d ]] || continue
        find "$d" -mindepth 1 \( -type f -o -type l -o -type d \) -printf '%p %M\n' | sort
        find "$d" -type f -exec sha256sum {} + | sort -k2
    done
}

wait_ready() {
    local what=$1 i
    mapfile -t probe <"$T/pod/probe.args"
    for i in $(seq 240); do
        if podman exec gpusnap-installer-test "${probe[@]}" >"$T/probe.out" 2>&1; then
            echo "ready after ~$((i / 2)) s ($what): $(cat "$T/probe.out")"
            return 0
        fi
        [[ $(podman inspect -f '{{.State.Running}}' gpusnap-installer-test) == true ]] ||
            { podman logs gpusnap-installer-test; fail "$what: the installer exited"; }
        sleep 0.5
    done
    podman logs gpusnap-installer-test
    fail "$what: not ready after 120 s ($(cat "$T/probe.out"))"
}

start_pod() {
    mapfile -t run <"$T/pod/run.args"
    mapfile -t cmd <"$T/pod/cmd.args"
    # The node's mount namespace is this test's, not PID 1's.
    cmd=("${cmd[@]/#--host-mount-ns=*/--host-mount-ns=/proc/$$/ns/mnt}")
    podman rm -f -t 0 gpusnap-installer-test >/dev/null 2>&1 || true
    podman run "${run[@]}" --network=host --env "GPUSNAP_KUBE_API=http://127.0.0.1:$(cat "$T/api.port")" \
        --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 "${cmd[@]}" >/dev/null
}

stop_pod() {
    # podman stop sends the image's stop signal, SIGTERM, and waits the grace period.
    podman stop -t "$(cat "$T/pod/grace")" gpusnap-installer-test >/dev/null
    local code
    code=$(podman inspect -f '{{.State.ExitCode}}' gpusnap-installer-test)
    podman logs gpusnap-installer-test >"$T/pod.log" 2>&1
    [[ $code == 0 ]] || { cat "$T/pod.log"; fail "the installer exited $code on SIGTERM"; }
}

handlers() {
    "$GPUSNAP" --config /dev/null doctor --json --containerd-socket "$SOCKET" 2>/dev/null |
        "$PY" -c 'import json,sys; c=[c for c in json.load(sys.stdin)["checks"] if c["name"]=="containerd"][0]; print(c["status"], c["summary"])'
}

last_label() {
    tail -n1 "$T/api.log" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["labels"]["gpusnap.io/ready"])'
}

for preset in containerd k3s rke2; do
    T0=$SECONDS
    say "layout $preset"
    layout_vars "$preset"
    rm -f "$T/stop-containerd" "$T/ds-deleting" "$T/ds-deleting.gone" "$T/api.log"
    for d in /etc/containerd /run/containerd /var/lib/containerd /var/lib/rancher /run/k3s \
        /etc/gpusnap /var/lib/gpusnap /usr/local/bin /opt/gpusnap-node /etc/criu /etc/crio \
        /var/lib/kubelet; do
        mkdir -p "$d"
        mount -t tmpfs -o mode=0755 "layout-$preset" "$d"
    done
    mkdir -p "$CONF_DIR" "$(dirname "$SOCKET")" "$BIN_DIR"
    base_config "$preset" >"$T/base.toml"
    if [[ -n $TEMPLATE ]]; then
        # What k3s rendered from its base template at its last start.
        cp "$T/base.toml" "$CONFIG"
        if [[ $preset == rke2 ]]; then
            # An operator's own template: base plus a runtime of their own.
            printf '{{ template "base" . }}\n\n[plugins.%s.containerd.runtimes.kata]\n  runtime_type = "io.containerd.kata.v2"\n' \
                "'io.containerd.cri.v1.runtime'" >"$TEMPLATE"
        fi
    else
        cp "$T/base.toml" "$CONFIG"
    fi

    # containerd under a supervisor: each start renders the template (k3s's {{ template "base" }}
    # is the base config) into config.toml; the restart command kills the running one.
    install -d "$T/bin"
    cat >"$T/bin/restart-containerd" <<RESTART
#!/bin/sh
old=\$(cat $T/containerd.pid)
kill \$old
i=0
while [ "\$(cat $T/containerd.pid)" = "\$old" ] || [ ! -S $SOCKET ]; do
    i=\$((i + 1)); [ \$i -lt 600 ] || exit 1; sleep 0.1
done
RESTART
    chmod +x "$T/bin/restart-containerd"
    (
        while [[ ! -e $T/stop-containerd ]]; do
            if [[ -n $TEMPLATE && -f $TEMPLATE ]]; then
                "$PY" -c 'import sys; t=open(sys.argv[1]).read(); b=open(sys.argv[2]).read(); open(sys.argv[3],"w").write(t.replace("{{ template \"base\" . }}\n", b))' \
                    "$TEMPLATE" "$T/base.toml" "$CONFIG"
            elif [[ -n $TEMPLATE ]]; then
                cp "$T/base.toml" "$CONFIG"
            fi
            rm -f "$SOCKET"
            "$RIG/containerd" --config "$CONFIG" >>"$T/containerd-$preset.log" 2>&1 &
            echo $! >"$T/containerd.pid"
            wait $! || true
        done
    ) &
    SUPERVISOR=$!
    for _ in $(seq 300); do [[ -S $SOCKET ]] && break; sleep 0.1; done
    [[ -S $SOCKET ]] || fail "containerd did not start: $(tail -5 "$T/containerd-$preset.log")"
    # The node before gpusnap: k3s and RKE2 have rendered config.toml from their template.
    snapshot >"$T/before.txt"
    cp "$CONFIG" "$T/config-before.toml"
    [[ $(handlers) == fail*"without the \`gpusnap\` runtime handler"* ]] || fail "before install: $(handlers)"

    "$HELM" template gpusnap "$ROOT/packaging/helm/gpusnap" --namespace gpusnap-system \
        --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
        --set layout.preset="$preset" --set layout.restartCommand="$T/bin/restart-containerd" \
        --set config.criu.binary_dir="$RIG" --set installer.recheckSeconds=30 \
        --set signatureKeys.secretName=test-keys --set 'signatureKeys.keys={release.pub}' \
        "${EXTRA_SET[@]}" >"$T/rendered-$preset.yaml"
    rm -rf "$T/pod/configmaps" "$T/pod/secrets"
    "$PY" "$HERE/pod.py" "$T/rendered-$preset.yaml" "$T/pod" "$T/secrets"

    # 1. install -> ready -> SIGTERM -> containerd's config back to the byte
    start_pod
    wait_ready "$preset, first pod"
    [[ $(handlers) == ok* ]] || fail "containerd after install: $(handlers)"
    [[ $(last_label) == true ]] || fail "node not labelled: $(cat "$T/api.log")"
    [[ -x $BIN_DIR/containerd-shim-gpusnap-v2 && -f /etc/gpusnap/keys/release.pub ]] ||
        fail "binaries or keys not on the node"
    snapshot >"$T/installed.txt"
    stop_pod
    grep -q "runtime registration reverted" "$T/pod.log" || { cat "$T/pod.log"; fail "no revert on SIGTERM"; }
    [[ $(last_label) == None ]] || fail "label not removed on SIGTERM: $(cat "$T/api.log")"
    [[ $(handlers) == fail*"without the \`gpusnap\` runtime handler"* ]] || fail "after SIGTERM: $(handlers)"
    cmp "$T/config-before.toml" "$CONFIG" || fail "$CONFIG differs from before the install"
    if [[ $preset == containerd ]]; then
        [[ ! -e /etc/containerd/conf.d ]] || fail "drop-in directory left: $(ls -la /etc/containerd/conf.d)"
    fi
    [[ -f /etc/gpusnap/config.toml && -f /etc/gpusnap/keys/release.pub && -x $BIN_DIR/gpusnap ]] ||
        fail "SIGTERM of an upgrade removed the node's config, keys or binaries"
    snapshot >"$T/after-sigterm.txt"
    grep -F "$CONF_DIR" "$T/before.txt" >"$T/a" || true
    grep -F "$CONF_DIR" "$T/after-sigterm.txt" >"$T/b" || true
    diff -u "$T/a" "$T/b" || fail "containerd's configuration is not as before"
    echo "SIGTERM: containerd's configuration back to the byte; config, keys and binaries kept"

    # 2. an upgrade: the next pod keeps the node's gpusnap config and keys as they were
    sums() { sha256sum /etc/gpusnap/config.toml /etc/gpusnap/keys/release.pub; }
    sums >"$T/kept.txt"
    start_pod
    wait_ready "$preset, upgrade"
    sums | diff -u "$T/kept.txt" - || fail "the upgrade changed the node's config or keys"
    grep -F "$CONF_DIR" "$T/installed.txt" >"$T/a" || true
    snapshot | grep -F "$CONF_DIR" >"$T/b" || true
    diff -u "$T/a" "$T/b" || fail "the upgrade installed differently"

    # 3. uninstall: the pre-delete hook deletes the DaemonSet; the kubelet stops the pod
    #    (here: podman stop once the hook's DELETE arrived); the DaemonSet goes once its pod
    #    has; the hook then clears the label.
    mapfile -t hook < <("$PY" -c 'import sys, yaml
job = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Job")
c = job["spec"]["template"]["spec"]["containers"][0]
print("\n".join([c["command"][0], c["image"]] + c["args"]))' "$T/rendered-$preset.yaml")
    podman rm -f -t 0 gpusnap-uninstall-test >/dev/null 2>&1 || true
    podman run -d --name gpusnap-uninstall-test --network=host --user 65534 \
        --env "GPUSNAP_KUBE_API=http://127.0.0.1:$(cat "$T/api.port")" \
        --volume "$T/pod/serviceaccount:/var/run/secrets/kubernetes.io/serviceaccount:ro" \
        --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
        --entrypoint "${hook[0]}" "${hook[@]:1}" >/dev/null
    for _ in $(seq 200); do [[ -e $T/ds-deleting ]] && break; sleep 0.1; done
    [[ -e $T/ds-deleting ]] || { podman logs gpusnap-uninstall-test; fail "the hook did not delete the DaemonSet"; }
    grep -q '"propagationPolicy": "Foreground"' "$T/api.log" || fail "not a foreground deletion: $(cat "$T/api.log")"
    stop_pod
    touch "$T/ds-deleting.gone"
    [[ $(podman wait gpusnap-uninstall-test) == 0 ]] || { podman logs gpusnap-uninstall-test; fail "the hook failed"; }
    podman logs gpusnap-uninstall-test | sed 's/^/    hook: /'
    podman rm -f gpusnap-uninstall-test >/dev/null
    [[ $(last_label) == None ]] || fail "label left after the hook: $(tail -n2 "$T/api.log")"
    grep -q "uninstalled: the node is as before" "$T/pod.log" || { cat "$T/pod.log"; fail "no uninstall"; }
    [[ $preset != containerd ]] || sed 's/^/    pod: /' "$T/pod.log"
    snapshot >"$T/after-uninstall.txt"
    diff -u "$T/before.txt" "$T/after-uninstall.txt" || fail "the node is not as before the install"
    [[ $(handlers) == fail*"without the \`gpusnap\` runtime handler"* ]] || fail "after uninstall: $(handlers)"
    echo "uninstall: every node path as before the install"

    touch "$T/stop-containerd"
    kill "$(cat "$T/containerd.pid")" 2>/dev/null || true
    wait "$SUPERVISOR" 2>/dev/null || true
    SUPERVISOR=
    for d in /etc/containerd /run/containerd /var/lib/containerd /var/lib/rancher /run/k3s \
        /etc/gpusnap /var/lib/gpusnap /usr/local/bin /opt/gpusnap-node /etc/criu /etc/crio \
        /var/lib/kubelet; do
        umount "$d"
    done
    echo "layout $preset: passed in $((SECONDS - T0)) s"
done
say "ok: the installer image installs, reports ready, reverts on SIGTERM, upgrades and uninstalls on containerd, k3s and RKE2 layouts"
