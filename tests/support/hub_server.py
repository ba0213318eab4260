"""A tiny stand-in for the few Hugging Face Hub API calls surgery makes, on loopback.

For `surgery push` it answers create-repo, create-branch, validate-yaml (model card front matter),
preupload (every file "regular", so contents travel inline in the commit) and commit. For reading
model repositories (`FakeHub.add_model`) it answers repo info (commit sha and file list), the tree
listing snapshot_download asks for, and `resolve` URLs with HEAD and byte `Range` requests, served
from files on disk. It records every request and every byte range it sends, can drop a connection
part way through a body, and can change a file's content after a given number of requests, so
tests can check what reached the "Hub" and what the client fetched.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml


@dataclass
class ModelRepo:
    """A model repository served for reading: one commit, files on disk by name."""

    sha: str
    files: dict[str, Path]
    # Content changes scheduled by `FakeHub.change_file`: name -> (GETs left before, new path).
    changes: dict[str, tuple[int, Path]] = field(default_factory=dict)

    def etag(self, name: str) -> str:
        """An opaque ETag that changes whenever the content does (a new file on disk)."""
        path = self.files[name]
        stat = path.stat()
        return hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


class HubState:
    """What the fake Hub received and sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "branches": set}
        self.commits: list[dict] = []  # {"repo", "revision", "summary", "files": {path: bytes}}
        self.read_only: set[str] = set()
        self.validated: list[str] = []  # README contents sent to /api/validate-yaml
        self.models: dict[str, ModelRepo] = {}  # repositories served for reading
        # Dataset repositories, by "datasets/" + id (their resolve URLs' prefix); gated ones
        # answer file requests without a token 401 GatedRepo, as the Hub does.
        self.gated: set[str] = set()
        self.served: list[tuple[str, str, int, int]] = []  # (repo, file, start, stop) sent
        self.drops: dict[tuple[str, str], int] = {}  # (repo, file) -> bytes before a drop
        # Every request either host received: (host "hub" or "cdn", method, path, headers).
        self.received: list[tuple[str, str, str, dict[str, str]]] = []
        self.arrived: list[float] = []  # time.monotonic() of each entry of `received`
        self.throttled: dict[str, tuple[int, int]] = {}  # host -> (429s left, Retry-After)
        self.objects: dict[str, tuple[str, str, Path]] = {}  # CDN object -> (repo, file, path)
        self.expire_in: int | None = None  # CDN requests before every signed URL so far expires
        self.expired_upto = 0  # signed URLs numbered up to this one are expired
        self.signed = 0  # signed URLs given so far (each is numbered)
        # Requests held until others arrive (`FakeHub.gather`): [where, barrier, places left].
        self.gathers: list[list] = []
        self.gathered_apart = 0  # held requests whose others never came (sent one by one)
        self.lock = threading.Lock()

    def record(self, host: str, method: str, path: str, headers) -> None:
        """Note one request and the headers it carried."""
        with self.lock:
            self.received.append((host, method, path, {k.lower(): v for k, v in headers.items()}))
            self.arrived.append(time.monotonic())

    def hold_together(self, host: str, method: str, path: str, headers) -> None:
        """Wait, if a `FakeHub.gather` takes this request, until its others arrive too."""
        with self.lock:
            barrier = None
            for gather in self.gathers:
                where, candidate, left = gather
                if left and where(host, method, path, {k.lower(): v for k, v in headers.items()}):
                    gather[2], barrier = left - 1, candidate
                    break
        if barrier is not None:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                with self.lock:
                    self.gathered_apart += 1

    def throttle_now(self, host: str) -> int | None:
        """The Retry-After of a 429 owed to the next request to `host`, if any."""
        with self.lock:
            left, retry_after = self.throttled.get(host, (0, 0))
            if left == 0:
                return None
            self.throttled[host] = (left - 1, retry_after)
            return retry_after

    def bytes_served(self, repo: str, file: str | None = None) -> int:
        """Body bytes sent from `repo` (one `file` of it, or all), resolve URLs only."""
        return sum(
            stop - start
            for r, f, start, stop in self.served
            if r == repo and (file is None or f == file)
        )

    def ranges(self, repo: str, file: str) -> list[tuple[int, int]]:
        """The byte ranges sent from one file, merged where they touch or overlap."""
        merged: list[list[int]] = []
        for start, stop in sorted((s, e) for r, f, s, e in self.served if (r, f) == (repo, file)):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        return [(a, b) for a, b in merged]


_RESOLVE = re.compile(r"/((?:datasets/)?[^/]+/[^/]+)/resolve/([^/]+)/(.+)")
_API_MODEL = re.compile(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+))?")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_BLOCK = 2**20  # bytes per write when sending a file
_CDN_OBJECT = re.compile(r"/objects/([0-9a-f]{64})")


@dataclass
class Link:
    """How the fake Hub's network behaves: a round trip per request, one shared bandwidth cap,
    shard bytes from a second host by signed URLs that expire."""

    latency: float = 0.0  # seconds each request waits before its answer
    bandwidth: float | None = None  # bytes per second, shared by every body of both hosts
    cdn: bool = True  # redirect shard `resolve` requests to the CDN host
    url_ttl: float = 3600.0  # seconds a signed CDN URL is valid

    def __post_init__(self) -> None:
        self._free_at = 0.0  # when the shared link has sent everything reserved so far
        self._lock = threading.Lock()
        # (start, stop) in time.monotonic() of each stretch the link carried bytes, in order
        # and disjoint (each reservation starts when the one before ends, or later).
        self.busy: list[tuple[float, float]] = []

    def pace(self, nbytes: int) -> None:
        """Wait until the shared link has carried `nbytes` more bytes (its share of the cap)."""
        if not self.bandwidth:
            return
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + nbytes / self.bandwidth
            done = self._free_at
            self.busy.append((start, done))
        time.sleep(max(0.0, done - time.monotonic()))


_PLAIN = Link(cdn=False)
_PACE_BLOCK = 256 * 2**10  # bytes per paced write: concurrent bodies interleave on the link


def _handler(state: HubState, link: Link, cdn_endpoint: str | None, host: str = "hub"):
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as the Hub: a client reuses its connection across range requests. Without
        # TCP_NODELAY, headers and body sent apart would wait on delayed ACKs (~40 ms a request).
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args):  # keep test output quiet
            pass

        def _body(self) -> bytes:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            return raw

        def _endpoint(self) -> str:
            host, port = self.server.server_address[:2]
            return f"http://{host}:{port}"

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _not_found(self, code: str, message: str) -> None:
            data = json.dumps({"error": message}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _model(self, repo_id: str, revision: str) -> ModelRepo | None:
            repo = state.models.get(repo_id)
            if repo_id in state.gated and not self.headers.get("Authorization"):
                data = b'{"error": "Access to this dataset is restricted"}'
                self.send_response(401)
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", "Access to this dataset is restricted")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return None
            if repo is None:
                self._not_found("RepoNotFound", "Repository not found")
                return None
            if revision not in ("main", repo.sha):
                self._not_found("RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo

        def _api(
            self, repo_type: str, repo_id: str, kind: str | None, revision: str | None
        ) -> None:
            if repo_type == "datasets":
                repo_id = f"datasets/{repo_id}"
            repo = self._model(repo_id, unquote(revision or "main"))
            if repo is None:
                return
            if kind != "tree":
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                name = repo_id.removeprefix("datasets/")
                return self._reply(200, {"id": name, "sha": repo.sha, "siblings": siblings})
            entries = [
                {"type": "file", "path": name, "size": path.stat().st_size, "oid": repo.etag(name)}
                for name, path in sorted(repo.files.items())
            ]
            data = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _resolve(self, repo_id: str, revision: str, name: str) -> None:
            repo = self._model(repo_id, unquote(revision))
            if repo is None:
                return
            name = unquote(name)
            if name not in repo.files:
                return self._not_found("EntryNotFound", f"{name} does not exist")
            if self.command == "GET" and host == "hub":
                with state.lock:  # a scheduled change happens between two requests
                    if name in repo.changes:
                        left, new_path = repo.changes[name]
                        if left == 0:
                            repo.files[name] = new_path
                            del repo.changes[name]
                        else:
                            repo.changes[name] = (left - 1, new_path)
            path = repo.files[name]
            if host == "hub" and cdn_endpoint is not None and name.endswith(".safetensors"):
                return self._redirect(repo_id, repo, name, path)
            self._send_range(repo_id, name, path, hub_headers=(repo.etag(name), repo.sha))

        def _redirect(self, repo_id: str, repo: ModelRepo, name: str, path: Path) -> None:
            """302 to a signed URL of the content on the CDN host, with the Hub's headers."""
            etag = repo.etag(name)
            with state.lock:
                state.objects[etag] = (repo_id, name, path)
                state.signed += 1
                number = state.signed
            expires = time.time() + link.url_ttl
            location = f"{cdn_endpoint}/objects/{etag}?Expires={expires:.3f}&Signature={number}"
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(path.stat().st_size))
            self.send_header("ETag", f'"pointer-{etag[:16]}"')  # the LFS pointer's, not the file's
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _cdn(self) -> None:
            """A signed URL: the bytes with only the CDN's own headers, 403 once expired."""
            url = urlsplit(self.path)
            match = _CDN_OBJECT.fullmatch(url.path)
            query = dict(part.split("=", 1) for part in url.query.split("&") if "=" in part)
            if match is None or match[1] not in state.objects:
                return self._reply(404, {"error": "NoSuchKey"})
            with state.lock:
                if state.expire_in is not None:
                    state.expire_in -= 1
                    if state.expire_in < 0:
                        state.expired_upto, state.expire_in = state.signed, None
                revoked = int(query.get("Signature", 0)) <= state.expired_upto
            if revoked or float(query.get("Expires", 0)) < time.time():
                return self._reply(403, {"error": "Request has expired"})
            repo_id, name, path = state.objects[match[1]]
            self._send_range(repo_id, name, path, hub_headers=None)

        def _send_range(self, repo_id: str, name: str, path: Path, hub_headers) -> None:
            """The asked byte range of `path` (the whole file without Range); `hub_headers`
            (ETag, commit) for an answer of the Hub itself, None for the CDN's."""
            size = path.stat().st_size
            start, stop, status = 0, size, 200
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            if match is not None:
                start = int(match[1])
                stop = min(size, int(match[2]) + 1) if match[2] else size
                if start >= size or start >= stop:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(stop - start))
            self.send_header("Accept-Ranges", "bytes")
            if hub_headers is not None:
                self.send_header("ETag", f'"{hub_headers[0]}"')
                self.send_header("X-Repo-Commit", hub_headers[1])
            else:  # the CDN's own ETag (of its storage), unrelated to the Hub's
                self.send_header("ETag", f'"{hashlib.md5(str(path).encode()).hexdigest()}"')
                self.send_header("Server", "fake-cdn")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
            self.end_headers()
            if self.command == "GET":
                self._send_file(repo_id, name, path, start, stop)

        def _send_file(self, repo_id: str, name: str, path: Path, start: int, stop: int) -> None:
            with state.lock:
                drop_after = state.drops.get((repo_id, name))
                if drop_after is not None and stop - start > drop_after:
                    del state.drops[repo_id, name]
                else:
                    drop_after = None  # a shorter body: the drop waits for a longer one
            end = stop if drop_after is None else start + drop_after
            with open(path, "rb") as handle:
                handle.seek(start)
                position = start
                block = _PACE_BLOCK if link.bandwidth else _BLOCK
                while position < end:
                    data = handle.read(min(block, end - position))
                    link.pace(len(data))
                    self.wfile.write(data)
                    with state.lock:
                        state.served.append((repo_id, name, position, position + len(data)))
                    position += len(data)
            if drop_after is not None and end < stop:
                # A dropped connection: part of the promised body, then nothing.
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        def _route_read(self) -> None:
            path = urlsplit(self.path).path
            state.requests.append((self.command, self.path))
            if self._delayed():
                return
            if host == "cdn":
                return self._cdn()
            api = _API_MODEL.fullmatch(path)
            if api is not None and self.command == "GET":
                return self._api(*api.groups())
            resolve = _RESOLVE.fullmatch(path)
            if resolve is not None:
                return self._resolve(*resolve.groups())
            self._reply(404, {"error": "not found"})

        def _delayed(self) -> bool:
            """Record the request, wait its round trip; True when it was answered 429."""
            state.record(host, self.command, self.path, self.headers)
            state.hold_together(host, self.command, self.path, self.headers)
            if link.latency:
                time.sleep(link.latency)
            retry_after = state.throttle_now(host)
            if retry_after is None:
                return False
            self.send_response(429)
            self.send_header("Retry-After", str(retry_after))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True

        def do_GET(self):
            self._route_read()

        def do_HEAD(self):
            self._route_read()

        def do_POST(self):
            state.requests.append(("POST", self.path))
            body = self._body()
            if self._delayed():
                return
            if self.path == "/api/repos/create":
                request = json.loads(body)
                repo = f"{request['organization']}/{request['name']}"
                private = request.get("private") or request.get("visibility") == "private"
                state.repos.setdefault(repo, {"private": bool(private), "branches": {"main"}})
                return self._reply(200, {"url": f"{self._endpoint()}/{repo}", "name": repo})
            if self.path == "/api/validate-yaml":
                # The Hub checks a README's front matter; so do we, strictly: it must parse.
                content = json.loads(body)["content"]
                state.validated.append(content)
                yaml.safe_load(content.split("---")[1])
                return self._reply(200, {"warnings": []})
            match = re.fullmatch(
                r"/api/models/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)", self.path
            )
            if match is None:
                return self._reply(404, {"error": f"no route {self.path}"})
            repo, action, revision = match.groups()
            if repo not in state.repos:
                return self._reply(404, {"error": "Repository not found"})
            if action == "branch":
                state.repos[repo]["branches"].add(revision)
                return self._reply(200, {})
            if action == "preupload":
                files = json.loads(body)["files"]
                modes = [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                    for f in files
                ]
                return self._reply(200, {"files": modes})
            if repo in state.read_only:
                return self._reply(
                    403, {"error": "You don't have the rights to write to this repo"}
                )
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            header = next(line["value"] for line in lines if line["key"] == "header")
            files = {
                line["value"]["path"]: base64.b64decode(line["value"]["content"])
                for line in lines
                if line["key"] == "file"
            }
            state.commits.append(
                {"repo": repo, "revision": revision, "summary": header["summary"], "files": files}
            )
            oid = f"{len(state.commits):040d}"
            url = f"{self._endpoint()}/{repo}/commit/{oid}"
            return self._reply(200, {"commitUrl": url, "commitOid": oid})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that exits with its keep-alive connections open is no server error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeHub:
    """A running fake Hub: `endpoint` to put in HF_ENDPOINT, `state` to inspect afterwards;
    with a `link`, as the real Hub over a real link (see the module's docstring)."""

    def __init__(self, link: Link | None = None) -> None:
        self.state = HubState()
        self.link = link or _PLAIN
        self.servers = []
        self.cdn_endpoint: str | None = None
        if self.link.cdn:
            # Another host name (all of 127/8 is loopback on Linux): a different origin, as a
            # CDN is, so clients treat it as another host.
            cdn = _Server(("127.0.0.2", 0), _handler(self.state, self.link, None, "cdn"))
            self.cdn_endpoint = f"http://127.0.0.2:{cdn.server_address[1]}"
            self.servers.append(cdn)
        handler = _handler(self.state, self.link, self.cdn_endpoint)
        self.server = _Server(("127.0.0.1", 0), handler)
        self.servers.append(self.server)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.threads = [
            threading.Thread(target=server.serve_forever, daemon=True) for server in self.servers
        ]

    def __enter__(self) -> FakeHub:
        for thread in self.threads:
            thread.start()
        return self

    def received(self, host: str) -> list[tuple[str, str, dict[str, str]]]:
        """(method, path, headers) of every request `host` ("hub" or "cdn") received."""
        return [(m, p, h) for got, m, p, h in self.state.received if got == host]

    def expire_urls(self, after: int) -> None:
        """After the next `after` CDN requests, expire every signed URL given so far."""
        self.state.expire_in = after

    def gather(self, count: int, where, timeout: float = 10.0) -> None:
        """Hold each of the next `count` requests for which `where(host, method, path,
        headers)` is true (headers by lower-case name) until all `count` have arrived: a
        client that sends them at once passes, one that waits for each answer before the next
        stalls `timeout` seconds, after which they go on and `state.gathered_apart` counts
        them."""
        self.state.gathers.append([where, threading.Barrier(count, timeout=timeout), count])

    def throttle(self, host: str, count: int, retry_after: int = 1) -> None:
        """Answer the next `count` requests to `host` ("hub" or "cdn") 429 with Retry-After."""
        self.state.throttled[host] = (count, retry_after)

    def add_model(self, repo_id: str, folder: Path, sha: str) -> None:
        """Serve every file of `folder` as model repository `repo_id` at commit `sha`."""
        files = {p.name: p for p in sorted(Path(folder).iterdir()) if p.is_file()}
        self.state.models[repo_id] = ModelRepo(sha=sha, files=files)

    def add_dataset(self, repo_id: str, folder: Path, sha: str, gated: bool = False) -> None:
        """Serve every file under `folder` (paths relative to it) as dataset `repo_id` at commit
        `sha`; a gated one refuses its files to a request without a token."""
        folder = Path(folder)
        files = {
            p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()
        }
        self.state.models[f"datasets/{repo_id}"] = ModelRepo(sha=sha, files=files)
        if gated:
            self.state.gated.add(f"datasets/{repo_id}")

    def drop_next(self, repo_id: str, name: str, after: int) -> None:
        """Close the connection of the next GET of `name` with a body longer than `after` bytes
        once `after` bytes of it are sent."""
        self.state.drops[repo_id, name] = after

    def change_file(self, repo_id: str, name: str, new_path: Path, after: int = 0) -> None:
        """Serve `new_path` as `name` from the GET after the next `after` GETs of it."""
        self.state.models[repo_id].changes[name] = (after, Path(new_path))

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


class SilentHub:
    """An endpoint that accepts connections and never answers (a hung proxy or server): the
    socket listens, the kernel completes each connection, nothing is ever read or sent."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __enter__(self) -> SilentHub:
        self.socket.listen(128)
        return self

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


ROOT = Path(__file__).parents[2]


@contextlib.contextmanager
def hub_in_process(endpoint: str, home: Path, token: str | None = None):
    """huggingface_hub in this process pointed at `endpoint`, its cache under `home`, online,
    with `token`: what HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE=0 and HF_TOKEN do for a new process
    (huggingface_hub reads them once, at import)."""
    from huggingface_hub import constants

    values = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_OFFLINE": False,
    }
    saved = {name: getattr(constants, name) for name in values}
    saved_token = os.environ.get("HF_TOKEN")
    for name, value in values.items():
        setattr(constants, name, value)
    if token is not None:
        os.environ["HF_TOKEN"] = token
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(constants, name, value)
        if saved_token is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = saved_token


def run_surgery(
    *args: object, env: dict, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run the `surgery` command from this checkout as its own process, with no HF_* variables of
    the caller's (the test's `env` names the endpoint, token and timeouts)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, "-m", "cli", *map(str, args)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
