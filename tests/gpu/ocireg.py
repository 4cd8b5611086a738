#!/usr/bin/env python3
"""ocireg.py: a read-only OCI distribution registry (plain HTTP, loopback) that serves OCI image
layouts, for the GPU test's CRI scenarios on a machine without a registry or network.

    ocireg.py serve CONFIG.json PORT [--host 127.0.0.1]
    ocireg.py add CONFIG.json REPO:TAG LAYOUT_DIR [IMAGE_NAME]
    ocireg.py checkpoint-image ARCHIVE LAYOUT_DIR CONTAINER_NAME

CONFIG.json maps "REPO:TAG" to an OCI image layout directory (what `gpusnap image build
--layout` writes, or an unpacked oci-archive such as the bundle's gpu-base.oci.tar), and
optionally the name of the image within a layout that holds several
({"REPO:TAG": {"layout": DIR, "name": NAME}}). The server re-reads it on every request, so
`add` publishes an image while the server runs. Blobs are looked up by digest in every listed
layout.

Endpoints (what containerd's resolver and gpusnap's registry client use):
  GET  /v2/                                    -> 200 {}
  HEAD/GET /v2/<repo>/manifests/<tag|digest>   -> the manifest or index, with Content-Type,
                                                   Docker-Content-Digest and Content-Length
  HEAD/GET /v2/<repo>/blobs/<digest>           -> the blob (sendfile)
Everything else (push included) -> 404/405 in the registry's JSON error format.
With OCIREG_COUNT=FILE, every blob body served appends "DIGEST BYTES" to FILE (what clients
fetched: the scenario volume's bytes-fetched figure).

`checkpoint-image` makes the checkpoint image other runtimes restore (the reference side of the
scenario volume): an OCI layout whose one layer is the CRI checkpoint archive itself (its
entries unpack at the root, as `buildah add IMAGE ARCHIVE /` does), behind an image index that
carries containerd's `org.criu.checkpoint.container.name` and CRI-O's
`io.kubernetes.cri-o.annotations.checkpoint.name` (containerd 2.1-2.3 reads the index's
annotation to take CreateContainer's image as a checkpoint). The archive is hard-linked into
the layout when it can be, else copied.
Python 3.8+, standard library only.
"""
import hashlib
import json
import os
import shutil
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def load(config):
    try:
        with open(config) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def entry(v):
    if isinstance(v, str):
        return v, None
    return v["layout"], v.get("name")


def blob_path(cfg, digest):
    if ":" not in digest or "/" in digest or ".." in digest:
        return None
    alg, hexd = digest.split(":", 1)
    for v in cfg.values():
        layout, _ = entry(v)
        p = os.path.join(layout, "blobs", alg, hexd)
        if os.path.isfile(p):
            return p
    return None


def media_type_of(path, fallback=None):
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(4 << 20))
        return doc.get("mediaType") or fallback
    except Exception:
        return fallback


def resolve_tag(cfg, repo, tag):
    """(descriptor) of REPO:TAG from its layout's index.json."""
    v = cfg.get("%s:%s" % (repo, tag))
    if v is None:
        return None
    layout, name = entry(v)
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    ms = index.get("manifests", [])
    if name:
        for m in ms:
            ann = m.get("annotations") or {}
            if name in (ann.get("org.opencontainers.image.ref.name"), ann.get("io.containerd.image.name")):
                return m
        return None
    if len(ms) == 1:
        return ms[0]
    # Several: the one whose ref name ends in the tag, else the first.
    for m in ms:
        ann = m.get("annotations") or {}
        if (ann.get("org.opencontainers.image.ref.name") or "").endswith(":" + tag):
            return m
    return ms[0] if ms else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpusnap-ocireg/1"

    def log_message(self, fmt, *args):
        if os.environ.get("OCIREG_LOG"):
            sys.stderr.write("ocireg: %s %s\n" % (self.address_string(), fmt % args))

    def error(self, code, err, msg):
        body = json.dumps({"errors": [{"code": err, "message": msg}]}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_file(self, path, ctype, digest):
        size = os.path.getsize(path)
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(size))
        self.send_header("Docker-Content-Digest", digest)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()
        if self.command == "HEAD":
            return
        self.wfile.flush()
        with open(path, "rb") as f:
            off = 0
            while off < size:
                n = os.sendfile(self.connection.fileno(), f.fileno(), off, min(size - off, 1 << 30))
                if n <= 0:
                    break
                off += n
        count = os.environ.get("OCIREG_COUNT")
        if count:
            with open(count, "a") as c:
                c.write("%s %d\n" % (digest, off))

    def route(self):
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        if not path.startswith("/v2/"):
            return self.error(404, "NOT_FOUND", "not a registry path")
        rest = path[4:]
        cfg = load(self.server.config)
        for kind in ("/manifests/", "/blobs/"):
            if kind in rest:
                repo, ref = rest.rsplit(kind, 1)
                break
        else:
            return self.error(404, "NOT_FOUND", "unknown endpoint")
        if kind == "/blobs/":
            p = blob_path(cfg, ref)
            if not p:
                return self.error(404, "BLOB_UNKNOWN", "blob %s unknown" % ref)
            return self.send_file(p, "application/octet-stream", ref)
        if ref.startswith("sha256:"):
            p = blob_path(cfg, ref)
            if not p:
                return self.error(404, "MANIFEST_UNKNOWN", "manifest %s unknown" % ref)
            return self.send_file(p, media_type_of(p, "application/vnd.oci.image.manifest.v1+json"), ref)
        desc = resolve_tag(cfg, repo, ref)
        if not desc:
            return self.error(404, "MANIFEST_UNKNOWN", "%s:%s unknown" % (repo, ref))
        p = blob_path(cfg, desc["digest"])
        if not p:
            return self.error(404, "MANIFEST_UNKNOWN", "manifest blob %s missing" % desc["digest"])
        return self.send_file(p, desc.get("mediaType") or media_type_of(p), desc["digest"])

    def do_GET(self):
        try:
            self.route()
        except BrokenPipeError:
            pass

    do_HEAD = do_GET

    def refuse(self):
        self.error(405, "UNSUPPORTED", "this registry is read-only")

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse


def put_blob(layout, data):
    """Writes DATA (bytes) as a blob; returns its descriptor fields (digest, size)."""
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", d[7:]), "wb") as f:
        f.write(data)
    return d, len(data)


def checkpoint_image(archive, layout, name):
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        while True:
            b = f.read(16 << 20)
            if not b:
                break
            h.update(b)
    layer = "sha256:" + h.hexdigest()
    size = os.path.getsize(archive)
    dst = os.path.join(layout, "blobs", "sha256", layer[7:])
    if not os.path.exists(dst):
        try:
            os.link(archive, dst)
        except OSError:
            shutil.copyfile(archive, dst)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config = json.dumps({"created": created, "architecture": "amd64", "os": "linux",
                         "config": {}, "rootfs": {"type": "layers", "diff_ids": [layer]}}).encode()
    cd, cs = put_blob(layout, config)
    ann = {"org.criu.checkpoint.container.name": name,
           "io.kubernetes.cri-o.annotations.checkpoint.name": name}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": size}],
        "annotations": ann}).encode()
    md, ms = put_blob(layout, manifest)
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
                       "size": ms, "platform": {"architecture": "amd64", "os": "linux"}}],
        "annotations": ann}).encode()
    xd, xs = put_blob(layout, index)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
                                  "digest": xd, "size": xs}]}, f)
    print("%s %d" % (xd, size))


def main(argv):
    if len(argv) >= 3 and argv[1] == "serve":
        host = "127.0.0.1"
        if "--host" in argv:
            host = argv[argv.index("--host") + 1]
        srv = ThreadingHTTPServer((host, int(argv[3])), Handler)
        srv.daemon_threads = True
        srv.config = argv[2]
        sys.stderr.write("ocireg: serving %s on %s:%s\n" % (argv[2], host, argv[3]))
        sys.stderr.flush()
        srv.serve_forever()
    elif len(argv) in (5, 6) and argv[1] == "add":
        config, ref, layout = argv[2], argv[3], os.path.abspath(argv[4])
        if not os.path.isfile(os.path.join(layout, "index.json")):
            sys.exit("ocireg: %s is not an OCI layout (no index.json)" % layout)
        cfg = load(config)
        cfg[ref] = {"layout": layout, "name": argv[5]} if len(argv) == 6 else layout
        tmp = config + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cfg, f, indent=1)
        os.replace(tmp, config)
    elif len(argv) == 5 and argv[1] == "checkpoint-image":
        checkpoint_image(argv[2], os.path.abspath(argv[3]), argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
