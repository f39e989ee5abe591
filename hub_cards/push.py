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

import argparse
import dataclasses
import fnmatch
import hashlib
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError

from llava_normaligned.console import CommandParser, arguments_accepted

from .card import CardOptions, add_card_options, card_options, check_card, package_version, render_card
from .selfcheck import (
    PICKLE_SUFFIXES,
    RECORD_PATTERNS,
    LocalPathError,
    SelfCheckError,
    UploadPlan,
    auto_map_entries,
    check_checkpoint_folder,
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


# ------------------------------------------------------------------------------------------------------------- CLI


def make_push_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned push",
        description="Check that a checkpoint folder stands on its own, then upload it with its model card in one "
        "commit. Endpoint and token come from HF_ENDPOINT and HF_TOKEN (or `hf auth login`).",
    )
    parser.add_argument("folder", help="checkpoint folder (compose, convert or train output, or a checkpoint-N)")
    parser.add_argument("--repo-id", required=True, help="NAMESPACE/NAME; created if missing")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", default=None, metavar="BRANCH", help="branch to commit to (default main)")
    parser.add_argument("--commit-message", default=None,
                        help="the commit's message (default: \"Upload FOLDER with llava-normaligned VERSION\")")
    parser.add_argument("--token", default=None,
                        help="Hub token (default HF_TOKEN or the saved login; prefer those: a flag shows in `ps`)")
    parser.add_argument("--include", action="append", default=[], metavar="PATTERN",
                        help="also upload files matching PATTERN (repeatable; pickles are never uploaded)")
    parser.add_argument("--skip-load-check", action="store_true",
                        help="skip loading the folder in a fresh process (for models too large to load here)")
    parser.add_argument("--no-pin-card", action="store_true",
                        help="do not follow with the README commit that pins the card's snippets to the model commit")
    parser.add_argument("--dry-run", action="store_true", help="check and print what would be uploaded; upload nothing")
    add_card_options(parser)
    return parser


def push_main(argv: list[str] | None = None) -> int:
    from llava_normaligned.console import fail

    args = make_push_parser().parse_args(argv)
    options = card_options(args)
    try:
        check_checkpoint_folder(args.folder)
    except SelfCheckError as error:  # bad input: exit 2, as argparse's own usage errors
        return fail("push", error)
    arguments_accepted()
    try:
        if args.dry_run:
            plan = self_check(args.folder, include=tuple(args.include), tokens=known_tokens(args.token),
                              load=not args.skip_load_check)
            card = render_card(plan.folder, dataclasses.replace(options, repo_id=args.repo_id, branch=args.revision))
            check_card(card)
            check_text_paths("README.md (the rendered model card)", str(card))
            print(plan.summary())
            print("  + README.md (rendered model card)\ndry run: nothing uploaded")
            return 0
        result = push(
            args.folder, args.repo_id, private=args.private, revision=args.revision,
            commit_message=args.commit_message, token=args.token, options=options, include=tuple(args.include),
            check_load=not args.skip_load_check, pin_card=not args.no_pin_card,
        )
    except LocalPathError as error:  # the folder's records must be rewritten: bad input, as a missing folder
        return fail("push", scrub(str(error), known_tokens(args.token)))
    except (SelfCheckError, PushError, ValueError) as error:
        print(f"llava-normaligned push: {scrub(str(error), known_tokens(args.token))}", file=sys.stderr)
        return 1
    print(f"pushed {len(result.uploaded)} file(s) to {result.repo_id}@{result.branch}: commit {result.commit}")
    for path in result.deleted:
        print(f"  deleted stale {path}")
    for path, reason in UploadPlan(Path(args.folder), skipped=result.skipped).skipped_summary():
        print(f"  left out {path}: {reason}")
    if result.card_commit:
        print(f"model card pinned to {result.commit} (commit {result.card_commit})")
    print(f'load it with: from_pretrained("{result.repo_id}", revision="{result.commit}", trust_remote_code=True)')
    return 0


def make_pull_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned pull",
        description="Download a checkpoint from the Hub (pickle files excluded) and show the remote code it holds.",
    )
    parser.add_argument("repo_id", metavar="NS/NAME", help="the Hub model repo, NAMESPACE/NAME")
    parser.add_argument("--revision", default=None, help="branch, tag or commit hash (default main)")
    parser.add_argument("--local-dir", default=None, help="download here instead of the Hub cache")
    parser.add_argument("--token", default=None, help="Hub token (default HF_TOKEN or the saved login)")
    return parser


def pull_main(argv: list[str] | None = None) -> int:
    from llava_normaligned.console import fail

    args = make_pull_parser().parse_args(argv)
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return fail("pull", f"{args.repo_id}: HF_HUB_OFFLINE is set, so nothing can be downloaded; unset it to pull")
    arguments_accepted()
    try:
        result = pull(args.repo_id, args.revision, args.local_dir, token=args.token)
    except (PullError, ValueError) as error:
        print(f"llava-normaligned pull: {scrub(str(error), known_tokens(args.token))}", file=sys.stderr)
        return 1
    print(f"{args.repo_id} at commit {result.commit} -> {result.path}")
    for name in result.skipped_pickles:
        print(f"  not downloaded: {name} (pickle)")
    for name, digest, same in result.remote_code:
        note = (f"identical to llava-normaligned {package_version()}'s" if same
                else "NOT the installed package's: review it")
        print(f"  remote code {name} sha256 {digest} ({note})")
    for config_name, auto_class, reference in result.cross_repo_code:
        print(f"  WARNING {config_name}: auto_map[{auto_class!r}] = {reference!r} points into another repo: "
              "trust_remote_code would download and run that repo's code too; review it or do not trust remote code")
    print(f'load it with: from_pretrained("{result.path}", trust_remote_code=True)')
    return 0
