"""A local stand-in for the Hugging Face Hub, in the Hub's URL layout, for download tests (no internet).

Serves `GET /api/models/{repo}[/revision/{rev}]` (the file list with sizes, blob ids and LFS sha256)
and `HEAD`/`GET /{repo}/resolve/{rev}/{file}` (commit, etag and size headers; LFS files redirect to a
`/cdn/` URL, as the Hub sends them to its CDN; Range requests answer 206). Faults on demand: a
connection cut after N bytes of a file (once), a slow transfer, a file whose bytes differ from its
declared hash. `log` records every request (method, path, Range header).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Repo:
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)  # the rest are small files, hashed as git blobs
    sha: str = "0123456789abcdef0123456789abcdef01234567"

    @classmethod
    def from_folder(cls, folder: Path, lfs_suffixes: tuple[str, ...] = (".safetensors", ".gguf")) -> "Repo":
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return cls(files, {n for n in files if n.endswith(lfs_suffixes)})


class HubServer:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.log: list[tuple[str, str, str | None]] = []
        self.cut_after: dict[str, int] = {}  # file → bytes sent before the connection is cut (once)
        self.chunk_delay = 0.0  # seconds per 16 KiB sent
        self.corrupt: set[str] = set()  # files served with their last byte changed
        handler = type("Handler", (_Handler,), {"hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def ranges(self, file: str) -> list[str | None]:
        return [r for m, p, r in self.log if m == "GET" and p.endswith("/" + file)]


def _sibling(name: str, data: bytes, lfs: bool) -> dict:
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    out = {"rfilename": name, "size": len(data), "blobId": blob}
    if lfs:
        out["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
    return out


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj: dict, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self._send(code, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body)

    def _not_found(self, why: str) -> None:
        self._json({"error": why}, 404)

    def do_HEAD(self) -> None:
        self._file()

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.hub.log.append((self.command, path, self.headers.get("Range")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            repo = self.hub.repos.get(m[1])
            if repo is None:
                self.send_response(404)
                body = b'{"error": "Repository not found"}'
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self._json({"_id": "x", "id": m[1], "modelId": m[1], "sha": repo.sha, "private": False, "gated": False,
                        "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                        "siblings": [_sibling(n, d, n in repo.lfs) for n, d in repo.files.items()]})
            return
        self._file()

    def _file(self) -> None:
        path = self.path.split("?")[0]
        if self.command == "HEAD":
            self.hub.log.append(("HEAD", path, None))
        m = re.fullmatch(r"/(cdn/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m or m[2] not in self.hub.repos or m[4] not in self.hub.repos[m[2]].files:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        repo, name = self.hub.repos[m[2]], m[4]
        data = repo.files[name]
        lfs = name in repo.lfs
        etag = hashlib.sha256(data).hexdigest() if lfs else hashlib.sha1(data).hexdigest()
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if lfs and not m[1]:  # the Hub sends LFS files to its CDN
            headers.update({"Location": f"{self.hub.url}/cdn{path}", "X-Linked-Etag": f'"{etag}"',
                            "X-Linked-Size": str(len(data)), "Content-Length": "0"})
            self._send(302, headers)
            return
        if name in self.hub.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        start = 0
        rng = self.headers.get("Range")
        if rng and (r := re.fullmatch(r"bytes=(\d+)-", rng)):
            start = int(r[1])
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self.send_response(206 if start else 200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = self.hub.cut_after.pop(name, None)
        sent = 0
        for i in range(0, len(body), 16384):
            piece = body[i:i + 16384]
            if cut is not None and sent + len(piece) > cut:
                self.wfile.write(piece[:cut - sent])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # the promised length never arrives
                return
            self.wfile.write(piece)
            sent += len(piece)
            if self.hub.chunk_delay:
                time.sleep(self.hub.chunk_delay)
