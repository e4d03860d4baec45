"""A Hugging Face Hub mirror on loopback, serving the endpoints huggingface_hub calls, the way
huggingface.co answers them (read from huggingface_hub 2.4's hf_api.py and file_download.py):

- GET  /api/models?search=&filter=&sort=&limit=      -> JSON list of {"id", "downloads", "likes"}
- GET  /api/models/<repo>/revision/<rev>?blobs=True   -> {"id", "sha", "siblings": [{"rfilename",
       "size", "lfs": {"sha256", "size", "pointerSize"}}]}
- HEAD /<repo>/resolve/<rev>/<file>                   -> X-Repo-Commit, ETag / X-Linked-Etag
       (the sha256 for LFS files), X-Linked-Size, Content-Length, Accept-Ranges
- GET  /<repo>/resolve/<rev>/<file> [Range: bytes=N-] -> 200 or 206 with Content-Range

Knobs for the failure cases: `drop_after` (send that many body bytes of the next full GET, then
close the connection), `corrupt` (serve the content with one byte flipped, headers unchanged).
Every request is recorded (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class MirrorState:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> file -> content
    downloads: dict[str, int] = field(default_factory=dict)
    drop_after: int | None = None  # applies once
    corrupt: bool = False
    # As huggingface.co does for LFS files: /resolve answers 302 to a CDN URL (absolute) and puts
    # the file's sha256 and size in X-Linked-Etag / X-Linked-Size; the CDN serves the bytes.
    redirect_to_cdn: bool = False
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    body_bytes_sent: int = 0


class _Handler(BaseHTTPRequestHandler):
    state: MirrorState  # set on the subclass made per server

    def log_message(self, *args):  # keep test output clean
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _json(self, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self, kind: str) -> None:
        body = json.dumps({"error": f"{kind} not found"}).encode()
        self.send_response(404)
        self.send_header(
            "X-Error-Code", "RepoNotFound" if kind == "repository" else "EntryNotFound"
        )
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        state = self.state
        url = urlparse(self.path)
        path = unquote(url.path)
        state.requests.append((self.command, path, self.headers.get("Range")))
        if path == "/api/models":
            query = parse_qs(url.query)
            words = (query.get("search") or [""])[0].lower()
            hits = [
                {
                    "id": repo,
                    "downloads": state.downloads.get(repo, 0),
                    "likes": 1,
                    "tags": ["gguf"],
                }
                for repo in state.repos
                if words in repo.lower()
            ]
            return self._json(sorted(hits, key=lambda h: -h["downloads"]))
        match = re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path)
        if match:
            repo = match.group(1)
            if repo not in state.repos:
                return self._not_found("repository")
            siblings = [
                {
                    "rfilename": name,
                    "size": len(data),
                    "lfs": {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    },
                }
                for name, data in state.repos[repo].items()
            ]
            siblings.append({"rfilename": "README.md", "size": 5})
            return self._json({"id": repo, "sha": COMMIT, "siblings": siblings})
        cdn = re.fullmatch(r"/cdn/(.+)/([^/]+)", path)
        match = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
        if cdn:
            repo, name = cdn.groups()
        elif match:
            repo, _rev, name = match.groups()
        else:
            return self._not_found("repository")
        if repo not in state.repos:
            return self._not_found("repository")
        if name not in state.repos[repo]:
            return self._not_found("entry")
        data = state.repos[repo][name]
        sha = hashlib.sha256(data).hexdigest()
        if match and state.redirect_to_cdn:
            host = self.headers.get("Host")
            self.send_response(302)
            self.send_header("Location", f"http://{host}/cdn/{repo}/{name}")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("ETag", '"pointer-file-etag"')  # the LFS pointer's, not the file's
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if state.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        ranged = self.headers.get("Range")
        if ranged and not head:
            start = int(re.fullmatch(r"bytes=(\d+)-", ranged).group(1))
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if state.drop_after is not None and not start:
            cut, state.drop_after = state.drop_after, None
            # Counted before the write: once written, the client may read it all and look at
            # the counter before this thread runs again (seen on a loaded machine).
            state.body_bytes_sent += cut
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        state.body_bytes_sent += len(body)
        self.wfile.write(body)


class HubMirror:
    """Context manager: `with HubMirror() as hub: hub.url ...` on 127.0.0.1, a free port."""

    def __init__(self) -> None:
        self.state = MirrorState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> HubMirror:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
