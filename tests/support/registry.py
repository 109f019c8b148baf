"""A container registry for the tests, on 127.0.0.1 with no network: the Docker Registry HTTP API v2, read-only, in
plain HTTP, serving images saved from a podman storage root as OCI layouts (`podman save --format oci-dir`). A
`podman pull 127.0.0.1:PORT/NAME:TAG` from it is a real pull (the manifest, then the blobs, by digest), and an
unknown tag is the registry's own `manifest unknown`. podman speaks plain HTTP to it through `registries_conf()`
(CONTAINERS_REGISTRIES_CONF; `insecure = true` for this address alone).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from devtools import podman as pm

MANIFEST_UNKNOWN = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}


class Registry:
    """A registry serving what `add` put in `folder` (blobs by digest, tags to manifests); `close` stops it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "blobs").mkdir(parents=True, exist_ok=True)
        self.tags: dict[tuple[str, str], tuple[str, str]] = {}
        """(repository, tag) -> (the manifest's digest, its media type)."""
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                registry.answer(self, body=False)

            def do_GET(self) -> None:
                registry.answer(self, body=True)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="registry")
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def add(self, image: str, env: Mapping[str, str], repository: str, tag: str) -> str:
        """Serve `image` of the storage root `env` names as `ADDRESS/repository:tag`; that reference."""
        layout = self.folder / "layout"
        shutil.rmtree(layout, ignore_errors=True)
        pm.podman(env, "save", "--format", "oci-dir", "-o", str(layout), image)
        manifest = json.loads((layout / "index.json").read_text())["manifests"][0]
        for blob in (layout / "blobs" / "sha256").iterdir():
            shutil.copyfile(blob, self.folder / "blobs" / blob.name)
        self.tags[(repository, tag)] = (manifest["digest"], manifest["mediaType"])
        shutil.rmtree(layout)
        return f"{self.address}/{repository}:{tag}"

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        path = request.path.split("?")[0].rstrip("/")
        if path == "/v2":
            return _send(request, 200, b"{}", "application/json", body)
        repository, _, rest = path.removeprefix("/v2/").rpartition("/")
        repository, kind = repository.rpartition("/")[0], repository.rpartition("/")[2]
        if kind == "manifests" and (repository, rest) in self.tags:
            digest, media = self.tags[(repository, rest)]
        elif kind in ("manifests", "blobs") and rest.startswith("sha256:"):
            digest, media = rest, "application/octet-stream"
            media = next((m for d, m in self.tags.values() if d == digest), media)
        else:
            return _send(request, 404, json.dumps(MANIFEST_UNKNOWN).encode(), "application/json", body)
        blob = self.folder / "blobs" / digest.removeprefix("sha256:")
        if not blob.is_file():
            return _send(request, 404, json.dumps(MANIFEST_UNKNOWN).encode(), "application/json", body)
        return _send(request, 200, blob.read_bytes(), media, body, digest)

    def registries_conf(self, path: Path) -> Path:
        """A registries.conf that lets podman pull from this registry over plain HTTP, and searches nowhere for an
        unqualified name (a test never reaches docker.io)."""
        path.write_text(f'unqualified-search-registries = []\n\n[[registry]]\nlocation = "{self.address}"\n'
                        "insecure = true\n")
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _send(request: BaseHTTPRequestHandler, code: int, data: bytes, media: str, body: bool, digest: str = "") -> None:
    request.send_response(code)
    request.send_header("Content-Type", media)
    request.send_header("Content-Length", str(len(data)))
    request.send_header("Docker-Distribution-API-Version", "registry/2.0")
    if digest:
        request.send_header("Docker-Content-Digest", digest)
    request.end_headers()
    if body:
        request.wfile.write(data)
