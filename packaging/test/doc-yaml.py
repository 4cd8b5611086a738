"""Writes the YAML blocks of a doc out for packaging/check.sh to check, and fails on a block it
would not check: every ```yaml block is either Kubernetes manifests (each document with
apiVersion and kind; checked with kubernetes-validate) or, when the line before it is
`<!-- helm values -->`, values for the gpusnap chart (rendered with them, then checked).

  doc-yaml.py DOC OUTDIR

Prints one line per file written: `manifests PATH` or `values PATH`.
"""

import os
import re
import sys

import yaml

doc, out = sys.argv[1:]
text = open(doc).read()
os.makedirs(out, exist_ok=True)
# A block may be indented (inside a list item): its lines lose the fence's indentation.
found = re.findall(r"(?:^|\n)([^\n]*)\n( *)```yaml\n(.*?)\n\2```", text, re.S)
if not found:
    sys.exit(f"doc-yaml.py: no ```yaml block in {doc}")
if len(found) != text.count("```yaml"):
    sys.exit(f"doc-yaml.py: {doc} has {text.count('```yaml')} ```yaml fences, {len(found)} understood")
blocks = [(before, "\n".join(line[len(indent):] for line in body.split("\n")) + "\n")
          for before, indent, body in found]
for n, (before, block) in enumerate(blocks, 1):
    docs = [d for d in yaml.safe_load_all(block) if d is not None]
    if before.strip() == "<!-- helm values -->":
        kind = "values"
    elif docs and all(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in docs):
        kind = "manifests"
    else:
        sys.exit(f"doc-yaml.py: {doc}: yaml block {n} is neither Kubernetes manifests (apiVersion "
                 f"and kind in each document) nor marked <!-- helm values -->:\n{block}")
    path = os.path.join(out, f"{kind}-{n}.yaml")
    with open(path, "w") as f:
        f.write(block)
    print(kind, path)
