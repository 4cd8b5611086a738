"""docs/install.md's Helm commands (blocks marked `test: helm`), run where there is no cluster.

  doc-helm.py HELM KUBECTL DOC OUT_DIR

Each documented command is run as far as a machine without an API server can run it: `kubectl
create` with --dry-run=client; `kubectl label` on that object with --local; `helm install`
and `helm upgrade` as `helm template` with the same chart, release, namespace and values (the
upgrade's --reuse-values: the install's values), whose output must carry what the command
promises; `kubectl rollout status ds/X` and `kubectl get nodes -l L` check that the rendering
has that DaemonSet and schedules on that label; `helm uninstall` that the rendering has the
pre-delete hook that does the uninstall. Any other command fails the test: documenting one
means adding it here. What the installed release then does on a node is
packaging/test/test-image.sh's.
"""

import shlex
import subprocess
import sys

import yaml

helm, kubectl, doc, out = sys.argv[1:]
cmds = subprocess.run([sys.executable, __file__.replace("doc-helm.py", "doc-blocks.py"), doc, "helm"],
                      check=True, capture_output=True, text=True).stdout.splitlines()


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"doc-helm.py: {' '.join(argv)} failed:\n{r.stderr}")
    return r.stdout


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


namespace_yaml = None
installed = None  # (release, chart, args) of the documented install
rendered = None
for line in cmds:
    argv = shlex.split(line)
    print(f"$ {line}")
    if argv[:3] == ["kubectl", "create", "namespace"]:
        namespace_yaml = run([kubectl] + argv[1:] + ["--dry-run=client", "-o", "yaml"])
    elif argv[:3] == ["kubectl", "label", "namespace"]:
        label = argv[4]
        with open(f"{out}/namespace.yaml", "w") as f:
            f.write(namespace_yaml)
        ns = yaml.safe_load(run([kubectl, "label", "--local", "-f", f"{out}/namespace.yaml", label, "-o", "yaml"]))
        k, v = label.split("=", 1)
        assert ns["metadata"]["labels"][k] == v, ns
    elif argv[:2] == ["helm", "install"]:
        release, chart, args = argv[2], argv[3], argv[4:]
        installed = (release, chart, args)
        rendered = docs_of(run([helm, "template", release, chart] + args))
        with open(f"{out}/doc-install.yaml", "w") as f:
            yaml.safe_dump_all(rendered, f)
    elif argv[:2] == ["helm", "upgrade"]:
        release, chart, args = argv[2], argv[3], argv[4:]
        assert installed and installed[0] == release, "upgrade of a release the doc did not install"
        sets = [a for a in args if a != "--reuse-values"]
        upgraded = docs_of(run([helm, "template", release, chart] + installed[2] + sets))
        ds = next(d for d in upgraded if d["kind"] == "DaemonSet")
        for s in [sets[i + 1] for i, a in enumerate(sets) if a == "--set"]:
            if s.startswith("image.tag="):
                assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":" + s.split("=", 1)[1])
        before = next(d for d in rendered if d["kind"] == "ConfigMap")
        after = next(d for d in upgraded if d["kind"] == "ConfigMap")
        assert before["data"] == after["data"], "the documented upgrade changes the node config"
    elif argv[:2] == ["helm", "uninstall"]:
        hooks = [d for d in rendered if d["kind"] == "Job"
                 and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
        assert hooks, "helm uninstall: the chart has no pre-delete hook Job"
    elif argv[0] == "kubectl" and "rollout" in argv and "status" in argv:
        ns = argv[argv.index("-n") + 1]
        name = argv[-1].split("/", 1)[1]
        assert any(d["kind"] == "DaemonSet" and d["metadata"]["name"] == name
                   and d["metadata"]["namespace"] == ns for d in rendered), f"no DaemonSet {ns}/{name}"
    elif argv[:3] == ["kubectl", "get", "nodes"]:
        k, v = argv[argv.index("-l") + 1].split("=", 1)
        rc = next(d for d in rendered if d["kind"] == "RuntimeClass")
        assert rc["scheduling"]["nodeSelector"].get(k) == v, rc
    else:
        sys.exit(f"doc-helm.py: no client-side check for documented command: {line}")
print(f"doc-helm.py: {len(cmds)} documented Helm commands checked")
