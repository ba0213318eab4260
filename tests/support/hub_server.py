"""A tiny stand-in for the few Hugging Face Hub API calls `surgery push` makes, on loopback.

It answers create-repo, create-branch, validate-yaml (model card front matter), preupload (every
file "regular", so contents travel inline in the commit) and commit, and records every request so
tests can check what reached the "Hub".
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


class HubState:
    """What the fake Hub received."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "branches": set}
        self.commits: list[dict] = []  # {"repo", "revision", "summary", "files": {path: bytes}}
        self.read_only: set[str] = set()
        self.validated: list[str] = []  # README contents sent to /api/validate-yaml


def _handler(state: HubState):
    class Handler(BaseHTTPRequestHandler):
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
            self.wfile.write(data)

        def do_GET(self):
            state.requests.append(("GET", self.path))
            self._reply(404, {"error": "not found"})

        def do_POST(self):
            state.requests.append(("POST", self.path))
            body = self._body()
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


class FakeHub:
    """A running fake Hub: `endpoint` to put in HF_ENDPOINT, `state` to inspect afterwards."""

    def __init__(self) -> None:
        self.state = HubState()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
