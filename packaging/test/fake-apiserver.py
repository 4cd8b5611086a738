"""The few Kubernetes API calls the installer makes, answered on loopback and recorded, for
packaging/test/test-image.sh (no API server runs here).

  fake-apiserver.py PORT_FILE LOG_FILE DELETING_FLAG_FILE

Serves plain HTTP on 127.0.0.1 (a free port, written to PORT_FILE). PATCH /api/v1/nodes/NAME
(a merge patch) is appended to LOG_FILE as one JSON line {"node", "labels"} and answered with
the node; GET .../daemonsets/NAME answers a DaemonSet with metadata.deletionTimestamp set while
DELETING_FLAG_FILE exists, and 404 once DELETING_FLAG_FILE.gone exists (its pods are gone);
DELETE .../daemonsets/NAME creates DELETING_FLAG_FILE (a foreground deletion) and is logged;
GET .../pods lists the one installer pod, on node test-node. Requests without
`Authorization: Bearer test-token` get 401.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port_file, log_file, deleting = sys.argv[1:]


class Api(BaseHTTPRequestHandler):
    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self):
        if self.headers.get("Authorization") != "Bearer test-token":
            self.answer(401, {"kind": "Status", "code": 401})
            return False
        return True

    def do_PATCH(self):
        if not self.authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = self.path.rsplit("/", 1)[-1]
        with open(log_file, "a") as f:
            f.write(json.dumps({"node": name, "type": self.headers.get("Content-Type"),
                                "labels": body["metadata"]["labels"]}) + "\n")
        self.answer(200, {"kind": "Node", "metadata": {"name": name}})

    def do_DELETE(self):
        if not self.authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)) or b"{}") or "{}")
        with open(log_file, "a") as f:
            f.write(json.dumps({"delete": self.path, "propagationPolicy": body.get("propagationPolicy")}) + "\n")
        open(deleting, "w").close()
        self.answer(200, {"kind": "Status", "status": "Success"})

    def do_GET(self):
        if not self.authorised():
            return
        if "/daemonsets/" in self.path:
            if os.path.exists(deleting + ".gone"):
                return self.answer(404, {"kind": "Status", "code": 404})
            meta = {"name": self.path.rsplit("/", 1)[-1]}
            if os.path.exists(deleting):
                meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self.answer(200, {"kind": "DaemonSet", "metadata": meta, "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "gpusnap-installer"}}}})
        elif "/pods?" in self.path:
            self.answer(200, {"kind": "PodList", "items": [{"spec": {"nodeName": "test-node"}}]})
        else:
            self.answer(404, {"kind": "Status", "code": 404})

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
