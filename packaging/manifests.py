"""Checks on rendered gpusnap manifests, for packaging/check.sh (kustomize and Helm output alike).

  manifests.py invariants FILE...
      What the node side relies on, in every rendering: the RuntimeClass handler `gpusnap`,
      its scheduling equal to the installer's nodeSelector, no RBAC, no service-account token,
      the host mounts, the installer settings, Secrets mounted read-only and root-only. Writes
      the rendered gpusnap config next to each FILE as FILE.config.toml.
  manifests.py compare DEFAULTS_TOML KUSTOMIZE HELM
      The installer DaemonSet of both renderings is the same where it matters: image, pull
      policy, scheduling, privileges, script, resources, every mount with what it mounts, the
      installer settings, and the effective gpusnap config (both merged onto DEFAULTS_TOML,
      `gpusnap config default`).
"""

import sys
import tomllib

import yaml

RBAC = {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
HOST_MOUNTS = ["/etc/containerd", "/usr/local/bin", "/run/containerd", "/etc/gpusnap", "/var/lib/gpusnap"]
INSTALLER_KEYS = ["GPUSNAP_RUNTIMES", "GPUSNAP_CONTAINERD_MODE", "GPUSNAP_CRIU_NETWORK_LOCK",
                  "GPUSNAP_RESTART_RUNTIME", "GPUSNAP_RECHECK_SECONDS"]
BYTE_SETTINGS = {("storage", "transfer_chunk_bytes"), ("restore", "max_rootfs_diff_bytes"),
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

    def installer_env(self):
        (ref,) = self.ctr["envFrom"]
        return self.configmap(ref["configMapRef"]["name"])["data"]

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


def invariants(paths):
    for path in paths:
        r = Rendering(path)
        kinds = {d["kind"] for d in r.docs}
        assert not kinds & RBAC, f"{path}: the installer needs no RBAC, found {kinds & RBAC}"
        rc = r.one("RuntimeClass")
        assert rc["handler"] == "gpusnap", rc
        assert rc["metadata"]["name"] == "gpusnap", "pods ask for runtimeClassName: gpusnap"
        assert "namespace" not in rc["metadata"], "RuntimeClass is cluster-scoped"
        assert r.pod["nodeSelector"] == rc["scheduling"]["nodeSelector"], \
            f"{path}: pods of the RuntimeClass must land only where the installer runs"
        assert r.pod["automountServiceAccountToken"] is False
        assert r.pod["hostPID"] is True, "nsenter --target 1 needs the host's PID namespace"
        assert r.ctr["securityContext"]["privileged"] is True
        mounts = r.mounts()
        for m in HOST_MOUNTS:
            assert m in mounts and mounts[m][0][0] == "hostPath", f"{path}: {m} not mounted from the host"
        assert mounts["/run/containerd"][1], f"{path}: /run/containerd must be read-only"
        for mount_path, ((kind, *_), read_only) in mounts.items():
            if kind == "secret":
                vol = r.volume_of(mount_path)["secret"]
                modes = [vol.get("defaultMode", 0o644)] + [i.get("mode", vol.get("defaultMode", 0o644))
                                                          for i in vol.get("items", [])]
                assert read_only, f"{path}: Secret at {mount_path} must be mounted readOnly"
                assert all(m & 0o077 == 0 for m in modes), \
                    f"{path}: Secret at {mount_path} must be root-only (0400/0600), modes {[oct(m) for m in modes]}"
        env = r.installer_env()
        for key in INSTALLER_KEYS:
            assert key in env, f"{path}: installer setting {key} missing"
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
        "tolerations": sorted(pod.get("tolerations", []), key=lambda t: sorted(t.items())),
        "hostPID": pod.get("hostPID"),
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
        "resources": ctr.get("resources"),
        "installer settings": r.installer_env(),
        "mounts": r.mounts(),
        "gpusnap config": effective_config(r.config_text(), defaults),
        "RuntimeClass": {k: r.one("RuntimeClass").get(k) for k in ("handler", "scheduling", "overhead")},
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
