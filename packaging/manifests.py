"""Checks on rendered gpusnap manifests, for packaging/check.sh (kustomize and Helm output alike).

  manifests.py invariants FILE...
      What the node side relies on, in every rendering: the RuntimeClass handler `gpusnap`,
      scheduled onto gpusnap.io/ready=true (or, without the node label, the installer's
      nodes); RBAC no wider than the node label and the uninstall hook need; the installer as
      `gpusnap agent run` with its readiness probe; the host mounts its args name (the
      kubelet's checkpoint directory read-only); Secrets mounted read-only and root-only. Writes the rendered gpusnap config next to each FILE as
      FILE.config.toml.
  manifests.py compare DEFAULTS_TOML KUSTOMIZE HELM
      The installer DaemonSet of both renderings is the same where it matters: image, pull
      policy, scheduling, privileges, command and args, probe, resources, every mount with what
      it mounts, and the effective gpusnap config (both merged onto DEFAULTS_TOML,
      `gpusnap config default`).
"""

import json
import sys
import tomllib

import yaml

HOST_MOUNTS = ["/etc/gpusnap", "/var/lib/gpusnap"]
READY_LABEL = "gpusnap.io/ready"
# What each kind of role may do: the installer labels its node, reads its DaemonSet and posts
# events on pods about their checkpoint pushes; the pre-delete hook also deletes the DaemonSet
# and lists its pods.
INSTALLER_RULES = {("", "nodes"): {"get", "patch"}, ("apps", "daemonsets"): {"get"},
                   ("", "events"): {"create"}}
HOOK_RULES = {("", "nodes"): {"get", "patch"}, ("apps", "daemonsets"): {"get", "delete"},
              ("", "pods"): {"list"}}
BYTE_SETTINGS = {("storage", "transfer_chunk_bytes"), ("restore", "max_rootfs_diff_bytes"),
                 ("restore", "max_volume_bytes"), ("restore", "page_fill_min_bytes"),
                 ("store", "max_bytes")}
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "Ki": 1 << 10, "MiB": 1 << 20, "Mi": 1 << 20,
         "GiB": 1 << 30, "Gi": 1 << 30}


class Rendering:
    def __init__(self, path):
        self.path = path
        self.docs = [d for d in yaml.safe_load_all(open(path)) if d]
        self.ds = self.one("DaemonSet")
        self.pod = self.ds["spec"]["template"]["spec"]
        self.ctr = self.pod["containers"][0]
        self.volumes = {v["name"]: v for v in self.pod["volumes"]}

    def one(self, kind):
        found = [d for d in self.docs if d["kind"] == kind]
        assert len(found) == 1, f"{self.path}: expected one {kind}, found {len(found)}"
        return found[0]

    def configmap(self, name):
        return next(d for d in self.docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)

    def arg(self, name):
        """The value of `--name=VALUE` in the installer's args, else None."""
        for a in self.ctr["args"]:
            if a.startswith(f"--{name}="):
                return a.split("=", 1)[1]
        return None

    def volume_of(self, mount_path):
        m = next(m for m in self.ctr["volumeMounts"] if m["mountPath"] == mount_path)
        return self.volumes[m["name"]]

    def config_text(self):
        """The gpusnap config the installer installs: config.toml of the ConfigMap mounted at
        /etc/gpusnap-source (the script's --config-from)."""
        vol = self.volume_of("/etc/gpusnap-source")
        return self.configmap(vol["configMap"]["name"])["data"]["config.toml"]

    def mounts(self):
        """mountPath -> what is mounted there, by content rather than generated names."""
        out = {}
        for m in self.ctr["volumeMounts"]:
            v = self.volumes[m["name"]]
            if "hostPath" in v:
                what = ("hostPath", v["hostPath"]["path"], v["hostPath"].get("type"))
            elif "configMap" in v:
                what = ("configMap", tuple(sorted(self.configmap(v["configMap"]["name"])["data"])))
            elif "secret" in v:
                what = ("secret", v["secret"]["secretName"])
            else:
                what = ("other", tuple(sorted(v)))
            out[m["mountPath"]] = (what, bool(m.get("readOnly", False)))
        return out


def check_rules(path, doc, allowed):
    for rule in doc["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                extra = set(rule["verbs"]) - allowed.get((group, res), set())
                assert not extra, f"{path}: {doc['kind']} {doc['metadata']['name']} may {extra} {res}"


def invariants(paths):
    for path in paths:
        r = Rendering(path)
        rc = r.one("RuntimeClass")
        assert rc["handler"] == "gpusnap", rc
        assert rc["metadata"]["name"] == "gpusnap", "pods ask for runtimeClassName: gpusnap"
        assert "namespace" not in rc["metadata"], "RuntimeClass is cluster-scoped"
        labelled = bool(r.pod.get("serviceAccountName"))
        assert r.pod["automountServiceAccountToken"] is labelled, \
            f"{path}: a token only for the node label"
        rc_sel = rc["scheduling"]["nodeSelector"]
        if labelled:
            assert rc_sel.get(READY_LABEL) == "true", \
                f"{path}: pods of the RuntimeClass must land only on nodes the installer found ready"
        else:
            assert rc_sel == r.pod["nodeSelector"], \
                f"{path}: pods of the RuntimeClass must land only where the installer runs"
        for d in r.docs:
            hook = d["metadata"].get("annotations", {}).get("helm.sh/hook")
            if d["kind"] in ("ClusterRole", "Role"):
                check_rules(path, d, HOOK_RULES if hook == "pre-delete" else INSTALLER_RULES)
            if d["kind"] == "Role":
                for rule in d["rules"]:
                    if rule["resources"] == ["daemonsets"]:
                        assert rule.get("resourceNames"), f"{path}: {d['metadata']['name']} not bound to its DaemonSet"
            if d["kind"] == "Job":
                assert hook == "pre-delete", f"{path}: a Job outside the uninstall hook"
        assert r.pod["hostPID"] is True, "the agent enters the node's mount namespace (/proc/1)"
        assert r.ctr["securityContext"]["privileged"] is True
        assert r.ctr["args"][:2] == ["agent", "run"], r.ctr["args"]
        probe = r.ctr["readinessProbe"]["exec"]["command"]
        assert probe[1:3] == ["agent", "probe"], probe
        assert r.arg("host-mount-ns") == "/proc/1/ns/mnt"
        mounts = r.mounts()
        bin_dir = r.arg("bin-dir")
        assert bin_dir and bin_dir != "/opt/gpusnap/bin", f"{path}: --bin-dir {bin_dir}"
        host = HOST_MOUNTS + [bin_dir]
        if r.arg("containerd-config"):
            host.append(r.arg("containerd-config").rsplit("/", 1)[0])
            sock_dir = r.arg("containerd-socket").rsplit("/", 1)[0]
            assert mounts[sock_dir][1], f"{path}: {sock_dir} must be read-only"
            assert f"--containerd-socket={r.arg('containerd-socket')}" in probe, probe
        for m in host:
            assert m in mounts and mounts[m][0][0] == "hostPath" and mounts[m][0][1] == m, \
                f"{path}: {m} not mounted from the host at the same path"
        ckpt = r.arg("checkpoint-dir")
        if ckpt:
            assert ckpt in mounts and mounts[ckpt][0][:2] == ("hostPath", ckpt), \
                f"{path}: --checkpoint-dir {ckpt} not mounted from the host at the same path"
            assert mounts[ckpt][1], f"{path}: the kubelet's checkpoints must be mounted read-only"
            assert any(("", "events") == (g, res) and "create" in rule["verbs"]
                       for d in r.docs if d["kind"] == "ClusterRole"
                       for rule in d["rules"] for g in rule["apiGroups"] for res in rule["resources"]) \
                or not labelled, f"{path}: checkpoint pushes with a token need events create"
        for mount_path, ((kind, *_), read_only) in mounts.items():
            if kind == "secret":
                vol = r.volume_of(mount_path)["secret"]
                modes = [vol.get("defaultMode", 0o644)] + [i.get("mode", vol.get("defaultMode", 0o644))
                                                          for i in vol.get("items", [])]
                assert read_only, f"{path}: Secret at {mount_path} must be mounted readOnly"
                assert all(m & 0o077 == 0 for m in modes), \
                    f"{path}: Secret at {mount_path} must be root-only (0400/0600), modes {[oct(m) for m in modes]}"
        for ns in (d for d in r.docs if d["kind"] == "Namespace"):
            assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged", \
                f"{path}: the installer's namespace must admit privileged pods"
        with open(path + ".config.toml", "w") as f:
            f.write(r.config_text())
        print(f"{path}: ok")


def size(v):
    if isinstance(v, int):
        return v
    t = v.strip()
    digits = len(t) - len(t.lstrip("0123456789"))
    return int(t[:digits]) * UNITS[t[digits:].strip()]


def effective_config(text, defaults):
    cfg = {table: dict(values) for table, values in defaults.items()}
    for table, values in tomllib.loads(text).items():
        cfg.setdefault(table, {}).update(values)
    for table, key in BYTE_SETTINGS:
        if key in cfg.get(table, {}):
            cfg[table][key] = size(cfg[table][key])
    return cfg


def essentials(r, defaults):
    pod, ctr = r.pod, r.ctr
    return {
        "updateStrategy": r.ds["spec"].get("updateStrategy"),
        "nodeSelector": pod.get("nodeSelector"),
        "affinity": pod.get("affinity"),
        "tolerations": sorted(pod.get("tolerations", []), key=lambda t: sorted(t.items())),
        "hostPID": pod.get("hostPID"),
        "serviceAccountName": pod.get("serviceAccountName"),
        "automountServiceAccountToken": pod.get("automountServiceAccountToken"),
        "priorityClassName": pod.get("priorityClassName"),
        "terminationGracePeriodSeconds": pod.get("terminationGracePeriodSeconds"),
        "imagePullSecrets": pod.get("imagePullSecrets"),
        "containers": len(pod["containers"]),
        "image": ctr["image"],
        "imagePullPolicy": ctr.get("imagePullPolicy"),
        "securityContext": ctr.get("securityContext"),
        "command": ctr.get("command"),
        "args": ctr.get("args"),
        "env": ctr.get("env"),
        "readinessProbe": ctr.get("readinessProbe"),
        "resources": ctr.get("resources"),
        "mounts": r.mounts(),
        "gpusnap config": effective_config(r.config_text(), defaults),
        "RuntimeClass": {k: r.one("RuntimeClass").get(k) for k in ("handler", "scheduling", "overhead")},
        "RBAC": sorted((d["kind"], d["metadata"]["name"], json.dumps(d.get("rules"), sort_keys=True))
                       for d in r.docs if d["kind"] in ("ClusterRole", "Role")
                       and "helm.sh/hook" not in d["metadata"].get("annotations", {})),
    }


def compare(defaults_path, kustomize_path, helm_path):
    defaults = tomllib.loads(open(defaults_path).read())
    k = essentials(Rendering(kustomize_path), defaults)
    h = essentials(Rendering(helm_path), defaults)
    diffs = [f"  {field}:\n    kustomize: {k[field]!r}\n    helm:      {h[field]!r}"
             for field in k if k[field] != h[field]]
    if diffs:
        sys.exit(f"{kustomize_path} and {helm_path} install differently:\n" + "\n".join(diffs))
    print(f"{kustomize_path} = {helm_path}: {len(k)} DaemonSet/RuntimeClass essentials equal")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"invariants": lambda: invariants(args), "compare": lambda: compare(*args)}[cmd]()
