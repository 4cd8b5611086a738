"""Prints the shell commands of docs/install.md's blocks marked `<!-- test: TAG -->`, one
command a line (backslash continuations joined, comments and blank lines dropped), so that a
test runs them as written.

  doc-blocks.py DOC TAG
"""

import re
import sys

doc, tag = sys.argv[1:]
text = open(doc).read()
blocks = re.findall(r"<!-- test: %s -->\n```sh\n(.*?)```" % re.escape(tag), text, re.S)
if not blocks:
    sys.exit(f"doc-blocks.py: no block marked `test: {tag}` in {doc}")
for block in blocks:
    for cmd in block.replace("\\\n", " ").splitlines():
        cmd = re.sub(r"\s+#.*$", "", cmd).strip()
        cmd = re.sub(r"\s+", " ", cmd)
        if cmd and not cmd.startswith("#"):
            print(cmd)
