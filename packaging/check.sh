#!/usr/bin/env bash
# packaging/check.sh — CI check of everything under packaging/:
#   1. yamllint on the manifests;
#   2. render the kustomize base and the example overlay (kubectl kustomize);
#   3. schema-check the rendered manifests strictly (kubernetes-validate, from PyPI);
#   4. check the invariants the node side relies on (handler name, node selectors, no RBAC,
#      valid gpusnap configs);
#   5. build the .deb and inspect it (dpkg-deb -I / -c), then run the packaged binary.
# Installs what it needs (Debian kubernetes-client, a Python venv) on first use; idempotent.
#
# Environment: GPUSNAP_PACKAGING_OUT (output dir), GPUSNAP_TOOLS_DIR (tool cache),
# K8S_VERSION (schema version, default 1.32.0), DEB_PROFILE (debug|release, default debug),
# DEB_NO_BUILD=1 (package the binaries already built in $CARGO_TARGET_DIR), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${GPUSNAP_PACKAGING_OUT:-$(mktemp -d /tmp/gpusnap-packaging.XXXXXX)}
TOOLS=${GPUSNAP_TOOLS_DIR:-/var/cache/gpusnap-packaging-tools}
K8S_VERSION=${K8S_VERSION:-1.32.0}
DEB_PROFILE=${DEB_PROFILE:-debug}
mkdir -p "$OUT" "$TOOLS"

step() { printf '\n==> %s\n' "$*"; }
fail() { echo "packaging/check.sh: FAIL: $*" >&2; exit 1; }

step "tools"
if ! command -v kubectl >/dev/null 2>&1 || ! kubectl kustomize --help >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
fi
if [[ ! -x $TOOLS/venv/bin/kubernetes-validate || ! -x $TOOLS/venv/bin/yamllint ]]; then
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q "kubernetes-validate==1.37.0" "yamllint==1.38.0"
fi
KV=$TOOLS/venv/bin/kubernetes-validate
YAMLLINT=$TOOLS/venv/bin/yamllint
echo "kubectl: $(kubectl version --client 2>/dev/null | head -n1)"
echo "kubernetes-validate: $("$KV" --version)"

step "yamllint"
"$YAMLLINT" -d '{extends: default, rules: {line-length: {max: 110}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
    packaging/kubernetes packaging/overlays

step "kustomize render"
kubectl kustomize packaging/kubernetes >"$OUT/base.yaml"
kubectl kustomize packaging/overlays/example >"$OUT/example.yaml"
echo "rendered $(grep -c '^kind:' "$OUT/base.yaml") base objects, $(grep -c '^kind:' "$OUT/example.yaml") overlay objects"

step "schema check (Kubernetes $K8S_VERSION, strict)"
"$KV" --strict -k "$K8S_VERSION" "$OUT/base.yaml" "$OUT/example.yaml" packaging/kubernetes/runtimeclass.yaml

step "invariants"
python3 - "$OUT/base.yaml" "$OUT/example.yaml" <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}, \
        f"{path}: the installer needs no RBAC, found {kinds}"
    rc = next(d for d in docs if d["kind"] == "RuntimeClass")
    assert rc["handler"] == "gpusnap", rc
    assert "namespace" not in rc["metadata"], "RuntimeClass is cluster-scoped"
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == rc["scheduling"]["nodeSelector"], \
        "pods of the RuntimeClass must land only where the installer runs"
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["securityContext"]["privileged"] is True
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    for m in ["/etc/containerd", "/usr/local/bin", "/run/containerd", "/etc/gpusnap", "/var/lib/gpusnap"]:
        assert m in mounts, f"{path}: {m} not mounted"
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    cfg = next(v for k, v in cms.items() if k.startswith("gpusnap-config-"))
    open(path + ".config.toml", "w").write(cfg["data"]["config.toml"])
    env = next(v for k, v in cms.items() if k.startswith("gpusnap-installer-"))["data"]
    for key in ["GPUSNAP_RUNTIMES", "GPUSNAP_CONTAINERD_MODE", "GPUSNAP_CRIU_NETWORK_LOCK",
                "GPUSNAP_RESTART_RUNTIME", "GPUSNAP_RECHECK_SECONDS"]:
        assert key in env, f"{path}: installer setting {key} missing"
    print(f"{path}: ok")
PY

step "deb"
DEB=$(packaging/deb/build-deb.sh --profile "$DEB_PROFILE" --out "$OUT" ${DEB_NO_BUILD:+--no-build})
dpkg-deb -I "$DEB" | tee "$OUT/deb-info.txt"
dpkg-deb -c "$DEB" | tee "$OUT/deb-contents.txt"
for f in ./usr/bin/gpusnap ./usr/bin/gpusnap-runc ./usr/bin/containerd-shim-gpusnap-v2 ./etc/gpusnap/config.toml; do
    grep -q " $f\$" "$OUT/deb-contents.txt" || fail "$f missing from $DEB"
done
grep -q '^ *Package: gpusnap$' "$OUT/deb-info.txt" || fail "control has no Package: gpusnap"
dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles | grep -qx /etc/gpusnap/config.toml ||
    fail "/etc/gpusnap/config.toml is not a conffile"
dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./postinst | grep -q "gpusnap install" ||
    fail "postinst does not point at gpusnap install"
X=$OUT/deb-root
rm -rf "$X" && dpkg-deb -x "$DEB" "$X"
"$X/usr/bin/gpusnap" --version
"$X/usr/bin/gpusnap" --config "$X/etc/gpusnap/config.toml" config check
for rendered in "$OUT/base.yaml" "$OUT/example.yaml"; do
    "$X/usr/bin/gpusnap" --config "$rendered.config.toml" config check
done
"$X/usr/bin/gpusnap-runc" --version | grep -q '^gpusnap-runc: ' || fail "packaged gpusnap-runc --version"

step "ok: packaging checks passed ($OUT)"
