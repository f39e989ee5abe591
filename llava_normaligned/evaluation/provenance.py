"""What results.json says about a run: published without local paths, and checked by content on ``--resume``.

results.json (and the results.md beside it) is published with the model, so it names no local folder: a model
given as a folder is recorded by the folder's own name (a Hub id as it is), ``--data-dir`` / ``--baseline`` by
theirs (``llava_normaligned.local_paths``). What ``--resume`` must be sure of, that the earlier samples came from
the same model, data and settings, is compared by content rather than by path:

- the model: a SHA-256 over the files at the top of its folder (weights, configs, tokenizer, chat template, code;
  not its card or training records), or for a Hub id the commit its revision resolved to for the load;
- the data: a SHA-256 over every row of each task's split (images by the digest of their bytes);
- the settings that change an answer (everything but the ones in ``NOT_COMPARED``).

A copy of the same model or data under another path resumes; a retrained model in the same folder does not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

from ..local_paths import public_name

logger = logging.getLogger(__name__)

# Settings a resumed run may change: where things are read from and written to (their content is compared instead),
# what the table is compared with, what the run does with errors, and the batch size (a user resumes after an
# out-of-memory crash with a smaller one; with left padding and position ids a request's answer does not depend on
# its batch neighbours beyond float rounding: tests/test_eval_loglik.py checks it for log-likelihoods).
NOT_COMPARED = frozenset({
    "data_dir", "baseline", "save_data", "output_dir", "label", "overwrite", "resume",
    "batch_size", "allow_errors", "max_error_rate",
})
# The command-line flags of settings not named after one.
_FLAGS = {"quantization": "--load-in-4bit / --load-in-8bit"}
# Settings holding a local path: published as the path's base name.
PATH_SETTINGS = ("data_dir", "baseline", "save_data")
# Files next to a model that do not change its answers (training records, this folder's own card).
_NOT_MODEL_FILES = frozenset({
    "README.md", "training_summary.json", "norm_tracking.json", "trainer_state.json", "all_results.json",
    "train_results.json", "eval_results.json",
})


# ---- what is published (the rule itself: llava_normaligned.local_paths) ----
def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (``llava-normaligned``, ``lmms-eval``), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def is_local(model: str) -> bool:
    return os.path.isdir(os.path.expanduser(model))


def public_settings(settings: dict) -> dict:
    return {k: public_name(v) if k in PATH_SETTINGS else v for k, v in settings.items()}


# ---- the model's content ----
def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def model_files_digest(folder: str) -> str:
    """SHA-256 over (name, SHA-256) of every file at the top of ``folder`` but dotfiles and training records.
    Sub-folders (checkpoint-*, eval/, runs/) are outside the model. Reads every weight file once: seconds per GB."""
    folder = os.path.expanduser(folder)
    digest = hashlib.sha256()
    started = time.perf_counter()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(".") or name in _NOT_MODEL_FILES or not os.path.isfile(path):
            continue
        digest.update(f"{name}\0{_file_sha256(path)}\n".encode())
    logger.info("model files digest of %s in %.1f s", public_name(folder), time.perf_counter() - started)
    return digest.hexdigest()


def loaded_hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit of a Hub model that was just loaded: transformers resolved ``revision`` once for the load and
    recorded the mapping in the local cache, which is read here without asking the Hub again. None when it is not
    there (then only the model id and revision are compared)."""
    try:
        from huggingface_hub import HfApi

        resolved = HfApi().resolve_revision(repo_id, revision=revision, local_files_only=True)
        return getattr(resolved, "resolved", None)
    except Exception as exc:  # no cache entry, or a name the cache cannot hold: nothing to record
        logger.debug("no cached commit for %s@%s: %s", repo_id, revision, exc)
        return None


def model_fingerprint(model: str) -> dict:
    """A local folder's files digest, known before the load; a Hub model's commit, known after it
    (:func:`loaded_hub_commit`)."""
    return {"files_sha256": model_files_digest(model)} if is_local(model) else {"commit": None}


# ---- the data's content ----
def _file_content(path: str) -> str:
    return _file_sha256(path) if os.path.isfile(path) else f"missing:{os.path.basename(path)}"


def _json_default(value):
    """Row values JSON cannot hold: bytes (an image's) by their digest, a LazyImage (synthetic) by its file's."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return hashlib.sha256(bytes(value)).hexdigest()
    if isinstance(getattr(value, "path", None), str):
        return _file_content(value.path)
    return repr(value)


def _by_content(value):
    """An undecoded image stored by path only ({"bytes": None, "path": "/abs/x.png"}): its file's digest, not
    the path."""
    if isinstance(value, dict) and set(value) == {"bytes", "path"} and not value["bytes"] and value["path"]:
        return {"bytes": None, "file": _file_content(value["path"])}
    return value


def split_digest(rows) -> str:
    """SHA-256 over the rows of a split (a datasets.Dataset read with undecoded images, or a list of dicts)."""
    digest = hashlib.sha256()
    if isinstance(rows, list):
        batches = ({"rows": rows[i : i + 1000]} for i in range(0, len(rows), 1000))
    else:  # column batches: {column: [value per row]}
        batches = ({k: [_by_content(v) for v in values] for k, values in b.items()} for b in rows.iter(batch_size=1000))
    for batch in batches:
        digest.update(json.dumps(batch, sort_keys=True, default=_json_default, ensure_ascii=False).encode())
    return digest.hexdigest()


# ---- --resume ----
def resume_mismatches(earlier: dict, current: dict) -> list[str]:
    """What differs between an earlier run's results.json and this run's header, as ``name: earlier -> now``
    lines; empty when the earlier samples may be kept."""
    problems = []
    was, now = earlier.get("model_fingerprint") or {}, current["model_fingerprint"]
    if was.get("files_sha256") and now.get("files_sha256"):  # two folders: their content decides, not their names
        if was["files_sha256"] != now["files_sha256"]:
            problems.append(f"model: the files of {current['model']!r} differ from those of the earlier run's "
                            f"{earlier.get('model')!r} (SHA-256 {was['files_sha256'][:12]}... -> "
                            f"{now['files_sha256'][:12]}...)")
    else:
        for key, what in (("model", "model"), ("revision", "--revision")):
            if earlier.get(key) != current.get(key):
                problems.append(f"{what}: {earlier.get(key)!r} -> {current.get(key)!r}")
        if was.get("commit") and now.get("commit") and was["commit"] != now["commit"]:  # compared once both known
            problems.append(f"Hub commit of {current['model']!r}@{current.get('revision') or 'main'}: "
                            f"{was['commit']} -> {now['commit']} (the revision moved; pass --revision {was['commit']})")
    before = {k: v for k, v in (earlier.get("settings") or {}).items() if k not in NOT_COMPARED}
    now = {k: v for k, v in current["settings"].items() if k not in NOT_COMPARED}
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            flag = _FLAGS.get(key, f"--{key.replace('_', '-')}")
            problems.append(f"{flag}: {before.get(key)!r} -> {now.get(key)!r}")
    earlier_data = earlier.get("datasets") or {}
    for task, record in current["datasets"].items():
        was = (earlier_data.get(task) or {}).get("sha256")
        if was != record["sha256"]:
            problems.append(f"data of {task}: {'another split' if was else 'not recorded'} (rows' content differs)")
    return problems
