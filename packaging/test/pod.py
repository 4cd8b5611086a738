"""Plays a rendered installer DaemonSet's pod with Podman (packaging/test/test-image.sh).

  pod.py RENDERED.yaml WORKDIR SECRETS_DIR

Writes WORKDIR/run.args (`podman run` options, one a line), WORKDIR/cmd.args (the image and
the container's command line), WORKDIR/probe.args (the readiness probe's command) and
WORKDIR/grace (terminationGracePeriodSeconds), from the pod
template as the kubelet would run it: image, command and args, env (spec.nodeName as
NODE_NAME=test-node), privileged, hostPID, every hostPath volume at its mountPath (its
directory created, as DirectoryOrCreate does), ConfigMap volumes written out from the
rendering, Secret volumes from SECRETS_DIR/<secret name>/<key>, items and modes applied, and the
service account's token directory from WORKDIR/serviceaccount when the pod mounts it.
"""

import os
import sys

import yaml


def main(rendered, work, secrets):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = ds["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    args = ["--name", "gpusnap-installer-test", "--detach"]
    if pod.get("hostPID"):
        args.append("--pid=host")
    if ctr.get("securityContext", {}).get("privileged"):
        args.append("--privileged")
    for e in ctr.get("env", []):
        if "value" in e:
            args += ["--env", f"{e['name']}={e['value']}"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            args += ["--env", f"{e['name']}=test-node"]
        else:
            sys.exit(f"pod.py: env {e} is not played")
    for m in ctr["volumeMounts"]:
        v = vols[m["name"]]
        ro = ":ro" if m.get("readOnly") else ""
        if "hostPath" in v:
            os.makedirs(v["hostPath"]["path"], exist_ok=True)
            src = v["hostPath"]["path"]
        elif "configMap" in v:
            src = os.path.join(work, "configmaps", v["name"])
            os.makedirs(src, exist_ok=True)
            for k, text in cms[v["configMap"]["name"]]["data"].items():
                with open(os.path.join(src, k), "w") as f:
                    f.write(text)
        elif "secret" in v:
            s = v["secret"]
            src = os.path.join(work, "secrets", v["name"])
            os.makedirs(src, exist_ok=True)
            for item in s.get("items", []):
                data = open(os.path.join(secrets, s["secretName"], item["key"]), "rb").read()
                path = os.path.join(src, item["path"])
                with open(path, "wb") as f:
                    f.write(data)
                os.chmod(path, item.get("mode", s.get("defaultMode", 0o644)))
        else:
            sys.exit(f"pod.py: volume {v} is not played")
        args += ["--volume", f"{src}:{m['mountPath']}{ro}"]
    if pod.get("automountServiceAccountToken"):
        sa = os.path.join(work, "serviceaccount")
        args += ["--volume", f"{sa}:/var/run/secrets/kubernetes.io/serviceaccount:ro"]
    cmd = ctr.get("command", [])
    if cmd:
        args += ["--entrypoint", cmd[0]]
    with open(os.path.join(work, "run.args"), "w") as f:
        f.write("\n".join(args) + "\n")
    with open(os.path.join(work, "cmd.args"), "w") as f:
        f.write("\n".join([ctr["image"]] + cmd[1:] + ctr.get("args", [])) + "\n")
    with open(os.path.join(work, "probe.args"), "w") as f:
        f.write("\n".join(ctr["readinessProbe"]["exec"]["command"]) + "\n")
    with open(os.path.join(work, "grace"), "w") as f:
        f.write(str(pod["terminationGracePeriodSeconds"]) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
