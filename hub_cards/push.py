"""Publish a checkpoint folder to the Hub, and fetch one back.

    llava-normaligned push ./llava-na-3b --repo-id me/llava-na-3b [--private] [--revision BRANCH]
    llava-normaligned pull me/llava-na-3b [--revision REV] [--local-dir DIR]

``push`` checks the folder first (``selfcheck``: safetensors only, remote code that imports only torch and
transformers, no token in any file, no path on this machine in any record, the files to upload load in a fresh
process without this package), renders the model card, and uploads everything in ONE commit: a push that fails
midway leaves the repo as it was, and a repo or branch that the push created for that commit is deleted again. A
second, README-only commit then pins the card's usage snippets to the first commit's hash. Both talk to the Hub
through ``huggingface_hub``, which takes the endpoint from ``HF_ENDPOINT`` and the token from ``HF_TOKEN`` (or
``hf auth login``).

``pull`` downloads one commit, never a pickle file (whatever the case of its suffix), and lists the remote code it
holds: the sha256 of every Python file, and every ``auto_map`` entry that points into another repo.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError

from .card import CardOptions, check_card, package_version, render_card
from .selfcheck import (
    PICKLE_SUFFIXES,
    RECORD_PATTERNS,
    SelfCheckError,
    UploadPlan,
    auto_map_entries,
    check_local_paths,
    check_text_paths,
    find_secrets,
    is_cross_repo,
    known_tokens,
    scrub,
    self_check,
)

logger = logging.getLogger(__name__)

# Files in the repo that a push replaces wholesale: weights left over from an earlier push (say, shards of a
# different count) are deleted in the same commit, so the repo never mixes two checkpoints.
MANAGED_PATTERNS = ("*.safetensors", "*.safetensors.index.json")


def _any_case(suffix: str) -> str:
    """A glob matching ``suffix`` in any case (``.bin`` -> ``*.[bB][iI][nN]``): the Hub client's filters are
    case-sensitive, and ``MODEL.BIN`` unpickles like ``model.bin``."""
    return "*" + "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in suffix)


PICKLE_PATTERNS = [_any_case(suffix) for suffix in PICKLE_SUFFIXES]


class HubTransferError(RuntimeError):
    """The Hub refused or failed an operation. The message never holds a token."""


class PushError(HubTransferError):
    pass


class PullError(HubTransferError):
    pass


@dataclass
class PushResult:
    repo_id: str
    commit: str  # the commit holding the model
    card_commit: str | None  # the README-only commit pinning the card's snippets to ``commit`` (None if not made)
    branch: str
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _check_repo_id(repo_id: str) -> None:
    parts = repo_id.split("/") if isinstance(repo_id, str) else []
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"repo id {repo_id!r}: expected NAMESPACE/NAME (your user name or an organisation)")


def _check_branch(revision: str | None) -> None:
    if revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision):
        raise ValueError(f"--revision {revision}: a push goes to a branch; a commit hash cannot be pushed to")


# ------------------------------------------------------------------------------------------- what goes in a commit


def _external_records(directory: str | None, prefix: str, folder: Path) -> dict[str, Path]:
    """Files of a ``--diagnostics`` / ``--eval`` folder outside the checkpoint, published under ``prefix/``."""
    if directory is None or Path(directory).resolve() == (folder / prefix).resolve():
        return {}
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--{'eval' if prefix == 'eval' else 'diagnostics'} {directory}: not a folder")
    records = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        in_repo = f"{prefix}/{path.name}"
        if any(fnmatch.fnmatchcase(in_repo, pattern) for pattern in RECORD_PATTERNS):
            records[in_repo] = path
    return records


def upload_files(plan: UploadPlan, options: CardOptions) -> dict[str, Path]:
    """Path in repo -> local file, for everything a push uploads except the card."""
    files = {path: plan.folder / path for path in plan.upload}
    for prefix, directory in (("diagnostics", options.diagnostics_dir), ("eval", options.eval_dir)):
        external = _external_records(directory, prefix, plan.folder)
        if external:  # the records the card is rendered from replace the folder's own
            files = {p: f for p, f in files.items() if not p.startswith(prefix + "/")}
            files.update(external)
    return files


def _stale(existing: list[str], uploading: set[str]) -> list[str]:
    return sorted(
        path for path in existing
        if path not in uploading and any(fnmatch.fnmatchcase(path, p) for p in MANAGED_PATTERNS)
    )


# ------------------------------------------------------------------------------------------------------------ push


def push(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    options: CardOptions | None = None,
    include: tuple[str, ...] = (),
    check_load: bool = True,
    pin_card: bool = True,
) -> PushResult:
    """Check ``folder``, then upload it with its model card to ``repo_id`` (created if missing) in one commit.

    ``revision``: the branch to commit to (created from main if missing; default main). ``token`` / ``endpoint``:
    default ``HF_TOKEN`` (or the saved login) / ``HF_ENDPOINT``. ``include``: extra file patterns to upload.
    ``check_load=False`` skips the fresh-process load (the static checks always run). ``pin_card``: follow with a
    README-only commit whose usage snippets pin the model commit's hash. Raises ``SelfCheckError`` (the folder;
    ``LocalPathError`` when a file to upload, or the card, names a path on this machine) or ``PushError`` (the Hub),
    both without tokens. A repo or branch created by this call is deleted again when the
    commit fails, so that a failed push leaves nothing behind.
    """
    _check_repo_id(repo_id)
    _check_branch(revision)
    options = options or CardOptions()
    tokens = known_tokens(token)
    plan = self_check(folder, include=include, tokens=tokens, load=check_load)
    files = upload_files(plan, options)
    external = {p: f for p, f in files.items() if p not in plan.upload}  # --diagnostics / --eval files
    find_secrets(list(external.values()), tokens)
    check_local_paths(external)
    branch = revision or "main"
    card_options_ = dataclasses.replace(options, repo_id=repo_id, revision=None, branch=branch)
    card = render_card(plan.folder, card_options_)
    check_card(card)
    check_text_paths("README.md (the rendered model card)", str(card))
    if scrub(str(card), tokens) != str(card):  # every source file was scanned; the card is checked all the same
        raise SelfCheckError("the rendered model card holds what looks like a Hugging Face access token")
    message = commit_message or f"Upload {plan.folder.resolve().name} with llava-normaligned {package_version()}"
    api = HfApi(endpoint=endpoint, token=token)
    created = _Created()
    try:
        head = _prepare_repo(api, repo_id, private, branch, created)
        existing = api.list_repo_files(repo_id, revision=head)
        deleted = _stale(existing, set(files))
        operations = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in sorted(files.items())]
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card).encode()))
        operations += [CommitOperationDelete(path_in_repo=p) for p in deleted]
        # One commit: the Hub applies all of it or none of it. parent_commit: refuse if someone pushed meanwhile.
        commit = api.create_commit(repo_id, operations, commit_message=message, revision=branch, parent_commit=head)
    except Exception as error:  # HTTP errors, refused metadata, network: scrubbed, and the chain dropped
        reason = scrub(_describe(error), tokens)
        undone = scrub(_undo(api, repo_id, branch, created), tokens)
        raise PushError(f"push to {repo_id} failed, nothing was committed{undone}: {reason}") from None
    card_commit = _pin_card(api, plan.folder, repo_id, branch, commit.oid, card_options_, tokens) if pin_card else None
    return PushResult(repo_id, commit.oid, card_commit, branch, sorted(files) + ["README.md"], deleted, plan.skipped)


@dataclass
class _Created:
    """What ``_prepare_repo`` created, so that a failed push can delete it again."""

    repo: bool = False
    branch: bool = False


def _status(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _prepare_repo(api: HfApi, repo_id: str, private: bool, branch: str, created: _Created) -> str:
    """Create the repo (and branch) if missing, noting in ``created`` what this call created; return the branch's
    head commit. Creation is asked with ``exist_ok=False``: a 409 answer, not a prior look-up, says the repo (or
    branch) was there before, so that a repo someone else creates meanwhile is never taken for ours."""
    try:
        api.create_repo(repo_id, private=private, exist_ok=False)
        created.repo = True
    except HfHubHTTPError as error:
        # 409: it exists. 401/402/403: no right to create repos here, which is fine if it exists (as the Hub client
        # itself decides with exist_ok=True); the commit then says whether we may write to it.
        exists = _status(error) == 409 or (_status(error) in (401, 402, 403) and api.repo_exists(repo_id))
        if not exists:
            raise
    info = api.repo_info(repo_id)
    if private and not info.private:
        logger.warning("%s already exists and is public: --private does not change an existing repo", repo_id)
    if branch != "main":
        try:
            api.create_branch(repo_id, branch=branch, exist_ok=False)
            created.branch = True
        except HfHubHTTPError as error:
            if _status(error) != 409:
                raise
        info = api.repo_info(repo_id, revision=branch)
    return info.sha


def _undo(api: HfApi, repo_id: str, branch: str, created: _Created) -> str:
    """Delete what a failed push created; the words to add to its error message."""
    try:
        if created.repo:
            api.delete_repo(repo_id)
            return " (the repo it had created was deleted again)"
        if created.branch:
            api.delete_branch(repo_id, branch=branch)
            return f" (the branch {branch!r} it had created was deleted again)"
    except Exception as error:  # noqa: BLE001  (reported with the push's own error)
        what = f"repo {repo_id}" if created.repo else f"branch {branch!r}"
        return f"; the {what} it created could not be deleted, delete it by hand ({_describe(error)})"
    return ""


def _pin_card(api, folder, repo_id, branch, commit, options, tokens) -> str | None:
    """A README-only commit whose snippets pin ``commit``. The model is already published: a failure only warns."""
    card = render_card(folder, dataclasses.replace(options, revision=commit))
    try:
        info = api.create_commit(
            repo_id, [CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card).encode())],
            commit_message=f"Model card: pin the usage snippets to {commit[:12]}", revision=branch,
            parent_commit=commit,
        )
    except Exception as error:
        logger.warning("the model is at commit %s, but pinning its card failed: %s", commit,
                       scrub(_describe(error), tokens))
        return None
    return info.oid


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


# ------------------------------------------------------------------------------------------------------------ pull


@dataclass
class PullResult:
    path: str
    commit: str
    skipped_pickles: list[str]
    remote_code: list[tuple[str, str, bool]]  # (file, sha256, identical to the installed package's file)
    cross_repo_code: list[tuple[str, str, str]] = field(default_factory=list)  # (config file, Auto class, reference)


def pull(
    repo_id: str,
    revision: str | None = None,
    local_dir: str | os.PathLike | None = None,
    *,
    token: str | None = None,
    endpoint: str | None = None,
) -> PullResult:
    """Download ``repo_id`` at ``revision`` (branch, tag or commit; default main), pickle files excluded.

    The revision is resolved to a commit hash first, so every file comes from that one commit. Returns the local
    path (``local_dir`` or the Hub cache), the commit, the pickles left on the Hub, and the remote code to review:
    every Python file in the download (sha256, and whether it is the installed package's), and every ``auto_map``
    entry of its configs that points into another repo (code that ``trust_remote_code`` would fetch from there).
    """
    _check_repo_id(repo_id)
    tokens = known_tokens(token)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        commit = api.repo_info(repo_id, revision=revision).sha
        pickles = [f for f in api.list_repo_files(repo_id, revision=commit) if f.lower().endswith(PICKLE_SUFFIXES)]
        path = snapshot_download(repo_id, revision=commit, local_dir=local_dir, token=token, endpoint=endpoint,
                                 ignore_patterns=PICKLE_PATTERNS)
    except Exception as error:
        raise PullError(f"pull of {repo_id} failed: {scrub(_describe(error), tokens)}") from None
    folder = Path(path)
    cross_repo = [entry for entry in auto_map_entries(folder) if is_cross_repo(entry[2])]
    return PullResult(path, commit, pickles, _remote_code(folder), cross_repo)


def _remote_code(folder: Path) -> list[tuple[str, str, bool]]:
    """(path, sha256, identical to the installed package's file) of every Python file anywhere in ``folder``."""
    import modeling_llava_normaligned

    shipped_dir = Path(modeling_llava_normaligned.__file__).parent
    rows = []
    for path in sorted(p for p in folder.rglob("*.py") if ".cache" not in p.relative_to(folder).parts):
        name = path.relative_to(folder).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shipped = shipped_dir / name
        same = shipped.is_file() and hashlib.sha256(shipped.read_bytes()).hexdigest() == digest
        rows.append((name, digest, same))
    return rows
