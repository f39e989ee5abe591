"""A small Hub-compatible HTTP server for tests: the real ``huggingface_hub`` client pushes to it and pulls from it.

Standard library only (plus PyYAML, a package dependency, to parse card metadata). It speaks the part of the Hub
API that ``create_repo``, ``delete_repo``, ``create_commit`` (preupload, LFS batch + basic PUT + verify, NDJSON
commit), ``create_branch``, ``delete_branch``, ``repo_info``, ``list_repo_tree``, ``list_repo_refs``,
``list_repo_commits``, ``hf_hub_download`` / ``snapshot_download`` and ``ModelCard.validate`` call, with:

- model repos ``namespace/name`` holding commits (a commit is a full file tree + parent), branches and revisions;
  a commit is applied all at once or not at all, as on the Hub;
- users identified by bearer tokens; private repos answer anonymous and foreign reads with 401 ``RepoNotFound``;
- LFS uploads to signed URLs, as the Hub's go to pre-signed storage URLs: the client sends no token with the PUT,
  so the URL handed out by the (authenticated) batch call is what authorises it;
- one-shot failure injection (``fail_next``) to test what a client does when the server fails midway.

Metadata validation (``validate_card_metadata``) applies a few rules written here after the Hub's documentation (a
subset of its license and pipeline-tag lists, id shapes, the four base-model relations). A card this server accepts
passed THESE rules, not the Hub's own validator, which only the real Hub runs.

Start it with ``with HubServer(tmp_dir, tokens={...}) as hub:`` and point clients at ``hub.url``
(``HF_ENDPOINT=hub.url`` and ``HF_HUB_DISABLE_XET=1`` for subprocesses).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"
# Files the Hub stores in LFS whatever their size (a subset of its default .gitattributes), and the size above which
# anything goes to LFS.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack", ".model", ".png", ".jpg")
LFS_MIN_SIZE = 10 * 1024 * 1024
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BRANCH_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)*$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")

# What the Hub's metadata validation accepts for a few fields (a subset of its lists).
PIPELINE_TAGS = {
    "image-text-to-text", "text-generation", "image-to-text", "visual-question-answering", "feature-extraction",
    "text-classification", "image-classification", "zero-shot-image-classification", "any-to-any",
}
LICENSES = {
    "apache-2.0", "mit", "bsd-3-clause", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "openrail", "gemma",
    "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "other", "unknown",
}
BASE_MODEL_RELATIONS = {"adapter", "merge", "quantized", "finetune"}


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a blob, which the Hub reports as a file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubError(Exception):
    """An HTTP error answer: status, message, and the ``X-Error-Code`` the client turns into an exception class."""

    def __init__(self, status: int, message: str, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    date: str
    files: dict[str, dict]  # path -> {"sha256", "size", "lfs", "oid"}


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------- metadata rules


def validate_card_metadata(content: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a README's YAML front matter, by rules written after the Hub's documentation for the
    fields this package sets (a subset of the Hub's lists: not a stand-in for its validator)."""
    if not content.startswith("---"):
        return [], ["empty or missing yaml metadata in repo card"]
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, flags=re.DOTALL)
    if match is None:
        return ["Error parsing YAML metadata: the front matter is not closed by '---'"], []
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [f"Error parsing YAML metadata: {error}"], []
    if meta is None:
        return [], ["empty or missing yaml metadata in repo card"]
    if not isinstance(meta, dict):
        return ["YAML metadata must be a mapping"], []
    errors, warnings = [], []

    def strings(key):
        value = meta.get(key)
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            errors.append(f'"{key}" must be a string or an array of strings')
            return []
        return values

    if "pipeline_tag" in meta and meta["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f'"pipeline_tag" must be a valid pipeline tag, got {meta["pipeline_tag"]!r}')
    if "library_name" in meta and not isinstance(meta["library_name"], str):
        errors.append('"library_name" must be a string')
    if "license" in meta:
        for value in strings("license"):
            if value not in LICENSES:
                errors.append(f'"license" must be a valid license identifier, got {value!r}')
    else:
        warnings.append("license is not specified")
    for key in ("tags", "datasets", "language", "metrics"):
        if key in meta:
            strings(key)
    if "base_model" in meta:
        for value in strings("base_model"):
            if not REPO_ID.match(value):
                errors.append(f'"base_model" must be a model id (namespace/name), got {value!r}')
    if "base_model_relation" in meta and meta["base_model_relation"] not in BASE_MODEL_RELATIONS:
        errors.append(f'"base_model_relation" must be one of {sorted(BASE_MODEL_RELATIONS)}')
    if "model-index" in meta:
        index = meta["model-index"]
        if not isinstance(index, list) or not all(isinstance(e, dict) and "name" in e for e in index):
            errors.append('"model-index" must be an array of objects with a "name"')
    return errors, warnings


# ------------------------------------------------------------------------------------------------------- the store


class HubStore:
    """Repos, commits and content-addressed blobs under ``root``. Every change happens under one lock."""

    def __init__(self, root: Path, tokens: dict[str, str], orgs: dict[str, set[str]] | None = None):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.tokens = dict(tokens)  # token -> user name
        self.orgs = {name: set(members) for name, members in (orgs or {}).items()}
        self.repos: dict[str, Repo] = {}
        self.lock = threading.RLock()
        self._clock = 0

    # -- users
    def user(self, token: str | None) -> str | None:
        if token is None:
            return None
        if token not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def namespaces(self, user: str) -> set[str]:
        return {user} | {org for org, members in self.orgs.items() if user in members}

    def readable(self, repo_id: str, user: str | None) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and (user is None or repo_id.split("/")[0] not in self.namespaces(user))):
            # The Hub answers a private repo and a missing one alike, so that names do not leak.
            raise HubError(401 if user is None else 404, "Repository not found", "RepoNotFound")
        return repo

    def writable(self, repo_id: str, user: str | None) -> Repo:
        if user is None:
            raise HubError(401, "You must be authenticated to write", "RepoNotFound")
        repo = self.readable(repo_id, user)
        if repo_id.split("/")[0] not in self.namespaces(user):
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    # -- blobs
    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def put_blob(self, content: bytes) -> str:
        sha256 = hashlib.sha256(content).hexdigest()
        path = self.blob_path(sha256)
        if not path.exists():
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(content)
            os.replace(tmp, path)
        return sha256

    def file_entry(self, content: bytes, lfs: bool) -> dict:
        return {"sha256": self.put_blob(content), "size": len(content), "lfs": lfs, "oid": git_blob_sha1(content)}

    # -- repos and commits
    def create_repo(self, repo_id: str, private: bool, user: str) -> Repo:
        with self.lock:
            if repo_id in self.repos:
                raise HubError(409, "You already created this model repo", extra={"url": repo_id})
            repo = Repo(repo_id, private)
            self.repos[repo_id] = repo
            self._commit(repo, "main", None, "initial commit", "", user,
                         {".gitattributes": self.file_entry(GITATTRIBUTES, lfs=False)})
            return repo

    def delete_repo(self, repo_id: str, user: str | None) -> None:
        with self.lock:
            self.writable(repo_id, user)
            del self.repos[repo_id]
            path = self.root / "repos" / f"{repo_id}.json"
            if path.exists():
                path.unlink()

    def resolve(self, repo: Repo, revision: str) -> Commit:
        if revision in repo.branches:
            return repo.commits[repo.branches[revision]]
        if revision in repo.tags:
            return repo.commits[repo.tags[revision]]
        if COMMIT_SHA.match(revision) and revision in repo.commits:
            return repo.commits[revision]
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def _commit(self, repo, branch, parent, title, message, user, files) -> Commit:
        self._clock += 1
        date = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        tree = json.dumps({k: v["oid"] for k, v in sorted(files.items())}).encode()
        oid = hashlib.sha1(b"%s\0%s\0%s\0%d" % (str(parent).encode(), tree, title.encode(), self._clock)).hexdigest()
        commit = Commit(oid, parent, title, message, user, date, files)
        repo.commits[oid] = commit
        repo.branches[branch] = oid
        self._persist(repo)
        return commit

    def apply_commit(self, repo: Repo, branch: str, user: str, lines: list[dict]) -> Commit:
        """All of a commit's operations, or none of them (the Hub's guarantee)."""
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first line of a commit payload must be its header")
        header = lines[0]["value"]
        with self.lock:
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = repo.commits[repo.branches[branch]]
            expected = header.get("parentCommit")
            if expected is not None and expected != head.oid:
                raise HubError(412, f"A commit has happened since {expected}: parent commit is not the branch head")
            files = dict(head.files)
            for line in lines[1:]:
                self._apply_operation(files, line)
            readme = files.get("README.md")
            if readme is not None and readme is not head.files.get("README.md"):
                errors, _ = validate_card_metadata(self.blob_path(readme["sha256"]).read_text(encoding="utf-8"))
                if errors:
                    raise HubError(400, "Invalid metadata in README.md: " + "; ".join(errors))
            return self._commit(repo, branch, head.oid, header.get("summary", ""), header.get("description", ""),
                                user, files)

    def _apply_operation(self, files: dict, line: dict) -> None:
        key, value = line.get("key"), line.get("value", {})
        path = value.get("path", "")
        if key == "file":
            content = base64.b64decode(value["content"]) if value.get("encoding") == "base64" else value["content"]
            files[path] = self.file_entry(content if isinstance(content, bytes) else content.encode(), lfs=False)
        elif key == "lfsFile":
            blob = self.blob_path(value["oid"])
            if not blob.exists():
                raise HubError(422, f"LFS object {value['oid']} for {path} was never uploaded")
            content = blob.read_bytes()
            files[path] = {"sha256": value["oid"], "size": len(content), "lfs": True, "oid": git_blob_sha1(content)}
        elif key == "deletedFile":
            if path not in files:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            del files[path]
        elif key == "deletedFolder":
            prefix = path.rstrip("/") + "/"
            for name in [n for n in files if n.startswith(prefix)]:
                del files[name]
        else:
            raise HubError(400, f"unknown commit operation {key!r}")

    def _persist(self, repo: Repo) -> None:
        """Mirror a repo's refs and commits to disk (for inspection; the in-memory state is the source of truth)."""
        path = self.root / "repos" / f"{repo.repo_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"private": repo.private, "branches": repo.branches, "tags": repo.tags,
                 "commits": {oid: c.__dict__ for oid, c in repo.commits.items()}}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------- HTTP layer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # -- plumbing
    def log_message(self, format, *args):  # the request log lives in HubServer.requests
        pass

    def _body(self) -> bytes:
        """The whole request body, plain or chunked: read even when the request is then refused."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", content_type="application/json", headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload, headers: dict | None = None):
        self._send(status, json.dumps(payload).encode(), headers=headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else None

    def _dispatch(self):
        hub = self.server.hub
        body = self._body()
        url = urlsplit(self.path)
        segments = url.path.split("/")[1:]  # still quoted: a revision may hold an encoded "/"
        status = 500
        try:
            user = hub.store.user(self._token())
            failure = hub.take_failure(self.command, url.path)
            if failure is not None:
                raise HubError(failure, f"injected failure for {self.command} {url.path}")
            status = self._route(segments, parse_qs(url.query), body, user) or 200
        except HubError as error:
            status = error.status
            headers = {"X-Error-Message": error.message}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._json(status, {"error": error.message, **error.extra}, headers=headers)
        except Exception as error:  # a bug in this server: answer 500 and keep serving
            self._json(500, {"error": f"{type(error).__name__}: {error}"})
        hub.requests.append((self.command, url.path, status))

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _dispatch

    # -- routes
    def _route(self, seg: list[str], query: dict, body: bytes, user: str | None) -> int | None:
        store, method = self.server.hub.store, self.command
        if seg[:2] == ["api", "whoami-v2"]:
            if user is None:
                raise HubError(401, "Invalid username or password.")
            orgs = [{"name": org} for org in sorted(store.namespaces(user) - {user})]
            return self._json(200, {"type": "user", "name": user, "orgs": orgs,
                                    "auth": {"accessToken": {"displayName": "tests", "role": "write"}}})
        if seg[:3] == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(json.loads(body or b"{}"), user)
        if seg[:3] == ["api", "repos", "delete"] and method == "DELETE":
            payload = json.loads(body or b"{}")
            store.delete_repo(f"{payload.get('organization') or user}/{payload['name']}", user)
            return self._json(200, {})
        if seg[:2] == ["api", "validate-yaml"] and method == "POST":
            errors, warnings = validate_card_metadata(json.loads(body)["content"])
            payload = {"errors": [{"message": m} for m in errors], "warnings": [{"message": m} for m in warnings]}
            return self._json(400 if errors else 200, payload)
        if seg[:2] == ["api", "models"] and len(seg) >= 4:
            return self._repo_api("/".join(seg[2:4]), seg[4:], query, body, user)
        if seg[0] == "_lfs" and len(seg) == 4 and method == "PUT":
            return self._lfs_put(f"{seg[1]}/{seg[2]}", seg[3], body, query)
        if seg[0] == "_lfs_verify" and len(seg) == 3:
            info = json.loads(body)
            blob = store.blob_path(info["oid"])
            if not blob.exists() or blob.stat().st_size != info["size"]:
                raise HubError(404, f"LFS object {info['oid']} not found")
            return self._json(200, {"success": True})
        if len(seg) >= 3 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(f"{seg[0]}/{seg[1][:-4]}", json.loads(body), user)
        if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(f"{seg[0]}/{seg[1]}", unquote(seg[3]), unquote("/".join(seg[4:])), user)
        raise HubError(404, f"no route for {method} {self.path}")

    def _create_repo(self, payload: dict, user: str | None):
        if user is None:
            raise HubError(401, "You must be authenticated to create a repo")
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        url = f"{self.server.hub.url}/{repo_id}"
        if not REPO_ID.match(repo_id):
            raise HubError(400, f"invalid repo name {repo_id!r}")
        if namespace not in self.server.hub.store.namespaces(user):
            raise HubError(403, f"You don't have the rights to create a model under the namespace {namespace!r}")
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        try:
            self.server.hub.store.create_repo(repo_id, private, user)
        except HubError as error:
            error.extra = {"url": url}  # the client reads the url even from a 409
            raise
        return self._json(200, {"url": url, "name": repo_id})

    def _repo_api(self, repo_id: str, rest: list[str], query: dict, body: bytes, user: str | None):
        store, method, base = self.server.hub.store, self.command, self.server.hub.url
        action = rest[0] if rest else None
        if method == "GET" and action in (None, "revision"):
            repo = store.readable(repo_id, user)
            commit = store.resolve(repo, unquote(rest[1]) if action == "revision" else "main")
            return self._json(200, {
                "id": repo_id, "author": repo_id.split("/")[0], "sha": commit.oid, "private": repo.private,
                "lastModified": commit.date, "siblings": [{"rfilename": p} for p in sorted(commit.files)],
                "library_name": "transformers",
            })
        if method == "GET" and action == "tree":
            repo = store.readable(repo_id, user)
            commit = store.resolve(repo, unquote(rest[1]))
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            return self._json(200, _tree(commit, unquote("/".join(rest[2:])), recursive))
        if method == "GET" and action == "refs":
            repo = store.readable(repo_id, user)

            def refs(kind, names):
                return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": o} for n, o in sorted(names.items())]

            return self._json(200, {"branches": refs("heads", repo.branches), "tags": refs("tags", repo.tags),
                                    "converts": [], "pullRequests": []})
        if method == "GET" and action == "commits":
            repo = store.readable(repo_id, user)
            commit, history = store.resolve(repo, unquote(rest[1])), []
            while commit is not None:
                history.append({"id": commit.oid, "title": commit.title, "message": commit.message,
                                "date": commit.date, "authors": [{"user": commit.author}]})
                commit = repo.commits.get(commit.parent) if commit.parent else None
            return self._json(200, history)
        if method == "POST" and action == "preupload":
            repo = store.writable(repo_id, user)
            head = store.resolve(repo, unquote(rest[1]))
            return self._json(200, {"files": [_upload_mode(f, head.files.get(f["path"])) for f in
                                              json.loads(body)["files"]]})
        if method == "POST" and action == "commit":
            repo = store.writable(repo_id, user)
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            commit = store.apply_commit(repo, unquote(rest[1]), user, lines)
            return self._json(200, {"success": True, "commitOid": commit.oid,
                                    "commitUrl": f"{base}/{repo_id}/commit/{commit.oid}"})
        if method == "DELETE" and action == "branch":
            repo = store.writable(repo_id, user)
            branch = unquote("/".join(rest[1:]))
            with store.lock:
                if branch == "main" or branch not in repo.branches:
                    raise HubError(400 if branch == "main" else 404, f"cannot delete branch {branch!r}")
                del repo.branches[branch]
                store._persist(repo)
            return self._json(200, {})
        if method == "POST" and action == "branch":
            repo = store.writable(repo_id, user)
            branch = unquote("/".join(rest[1:]))
            if not BRANCH_NAME.match(branch):
                raise HubError(400, f"invalid branch name {branch!r}")
            start = json.loads(body or b"{}").get("startingPoint") or "main"
            with store.lock:
                if branch in repo.branches:
                    raise HubError(409, f"Reference already exists: {branch}")
                repo.branches[branch] = store.resolve(repo, start).oid
                store._persist(repo)
            return self._json(200, {})
        if method == "POST" and action == "tag":
            repo = store.writable(repo_id, user)
            tag = json.loads(body)["tag"]
            with store.lock:
                if tag in repo.tags:
                    raise HubError(409, f"Tag already exists: {tag}")
                repo.tags[tag] = store.resolve(repo, unquote(rest[1])).oid
                store._persist(repo)
            return self._json(200, {})
        raise HubError(404, f"no route for {method} {self.path}")

    def _lfs_batch(self, repo_id: str, payload: dict, user: str | None):
        store, base = self.server.hub.store, self.server.hub.url
        store.writable(repo_id, user)
        objects = []
        for obj in payload.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not store.blob_path(obj["oid"]).exists():  # already stored: the client skips the upload
                signature = self.server.hub.lfs_signature(repo_id, obj["oid"])
                entry["actions"] = {
                    "upload": {"href": f"{base}/_lfs/{repo_id}/{obj['oid']}?signature={signature}", "header": {}},
                    "verify": {"href": f"{base}/_lfs_verify/{repo_id}"},
                }
            objects.append(entry)
        return self._send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(),
                          content_type="application/vnd.git-lfs+json")

    def _lfs_put(self, repo_id: str, oid: str, body: bytes, query: dict):
        # The URL's signature, handed out by the authenticated batch call, authorises the PUT (which carries no
        # token). Uploads are unreferenced blobs until a commit names them: a failed push leaves no trace in a repo.
        signature = query.get("signature", [""])[0]
        if not hmac.compare_digest(signature, self.server.hub.lfs_signature(repo_id, oid)):
            raise HubError(403, "LFS upload URL not signed for this object")
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"uploaded content does not match LFS object {oid}")
        self.server.hub.store.put_blob(body)
        return self._send(200)

    def _resolve(self, repo_id: str, revision: str, path: str, user: str | None):
        store = self.server.hub.store
        repo = store.readable(repo_id, user)
        commit = store.resolve(repo, revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if entry["lfs"]:
            headers.update({"X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": str(entry["size"])})
        content = store.blob_path(entry["sha256"]).read_bytes()
        return self._send(200, content, content_type="application/octet-stream", headers=headers)


def _upload_mode(file: dict, existing: dict | None) -> dict:
    sample = base64.b64decode(file.get("sample", ""))
    lfs = file["path"].endswith(LFS_SUFFIXES) or file["size"] >= LFS_MIN_SIZE or b"\0" in sample
    oid = None
    if existing is not None:  # lets the client drop unchanged files from the commit
        oid = existing["sha256"] if existing["lfs"] else existing["oid"]
    return {"path": file["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}


def _tree(commit: Commit, path: str, recursive: bool) -> list[dict]:
    prefix = f"{path.strip('/')}/" if path.strip("/") else ""
    if prefix and not any(name.startswith(prefix) for name in commit.files):
        raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
    entries, folders = [], set()
    for name, info in sorted(commit.files.items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            folder = prefix + "/".join(parts[:depth])
            if (recursive or depth == 1) and folder not in folders:
                folders.add(folder)
                entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                "path": folder})
        if len(parts) > 1 and not recursive:
            continue
        entry = {"type": "file", "oid": info["oid"], "size": info["size"], "path": name}
        if info["lfs"]:
            entry["lfs"] = {"oid": info["sha256"], "size": info["size"], "pointerSize": 134}
        entries.append(entry)
    return entries


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubServer


class HubServer:
    """The server, on 127.0.0.1 and a free port, serving from a background thread. A context manager."""

    def __init__(self, root: str | os.PathLike, tokens: dict[str, str], orgs: dict[str, set[str]] | None = None):
        self.store = HubStore(Path(root), tokens, orgs)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status), no headers: tokens never logged
        self._failures: list[list] = []  # [method, path pattern, status, matching requests still let through]
        self._failures_lock = threading.Lock()
        self._lfs_key = os.urandom(32)
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.hub = self
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def fail_next(self, method: str, path_regex: str, status: int = 403, after: int = 0) -> None:
        """Answer a request matching (method, path) with ``status`` (not a status the client retries): the next one,
        or the one after ``after`` matching requests were let through."""
        with self._failures_lock:
            self._failures.append([method, re.compile(path_regex), status, after])

    def take_failure(self, method: str, path: str) -> int | None:
        with self._failures_lock:
            for i, failure in enumerate(self._failures):
                want_method, pattern, status, after = failure
                if want_method == method and pattern.search(path):
                    if after:
                        failure[3] -= 1
                        return None
                    del self._failures[i]
                    return status
        return None

    def lfs_signature(self, repo_id: str, oid: str) -> str:
        return hmac.new(self._lfs_key, f"{repo_id}/{oid}".encode(), hashlib.sha256).hexdigest()

    def head(self, repo_id: str, branch: str = "main") -> Commit:
        """The commit a branch points to (for assertions)."""
        repo = self.store.repos[repo_id]
        return repo.commits[repo.branches[branch]]

    def file_bytes(self, repo_id: str, path: str, revision: str = "main") -> bytes:
        repo = self.store.repos[repo_id]
        entry = self.store.resolve(repo, revision).files[path]
        return self.store.blob_path(entry["sha256"]).read_bytes()
