"""Is a checkpoint folder fit to publish? Decide what to upload, then check that it stands on its own.

A folder is published only if someone who has torch and transformers, but not this package, can load it with
``trust_remote_code=True``. So, before anything is uploaded:

1. ``plan_upload``: pick the files a user needs (weights, config, remote code, processor, tokenizer, chat template,
   training and evaluation records) and leave out training state (``checkpoint-*``, optimizer states,
   ``training_args.bin``, ...). Pickled weights are refused: weights travel only as safetensors. A PEFT adapter
   folder is refused with the way to publish its merged model.
2. ``check_weights``: every safetensors file parses, and a sharded index names only shards that are uploaded.
3. ``check_remote_code``: the ``auto_map`` of every ``*config.json`` (model, tokenizer, processor) points at
   uploaded files and classes, never into another repo, and those files import nothing but torch, transformers,
   the standard library and each other.
4. ``find_secrets``: no Hub access token in any uploaded file (every byte of every file is scanned; of a
   safetensors file, its header, the only part that can hold text).
5. ``check_local_paths``: no record (``training_summary.json``, ``diagnostics/``, ``eval/``, the configs) names a
   path on this machine (``llava_normaligned.local_paths``): it would publish the machine's folder layout and the
   user's name.
6. ``check_loads``: exactly the files to upload, staged in a scratch folder, load in a fresh Python process in which
   this package cannot be imported (``run_without_package``) with ``AutoModelForImageTextToText`` and
   ``AutoProcessor`` (``trust_remote_code=True``), with no missing, unexpected or mismatched weights.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from llava_normaligned.local_paths import hide_local_paths, local_paths_in

# ------------------------------------------------------------------------------------------------ what is uploaded

# Files a user of the model needs, as patterns on the path relative to the folder (posix separators).
MODEL_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
# The processor's and tokenizer's files, under every name transformers' tokenizers save them as.
PROCESSOR_PATTERNS = (
    "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "*.tiktoken",
    "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja",
)
# Records the model card is rendered from: published with the weights so that readers can check the card's numbers.
RECORD_PATTERNS = (
    "training_summary.json", "norm_tracking.json", "card_notes.json",
    "diagnostics/*.json", "diagnostics/*.md", "diagnostics/*.png", "diagnostics/*.svg", "diagnostics/*.csv",
    "eval/*.json", "eval/*.md", "eval/*.png", "eval/*.svg", "eval/*.csv",
)
# What `train` (transformers' Trainer, TRL) leaves next to a model: needed to resume, not to use the model.
TRAINING_STATE_PATTERNS = (
    "checkpoint-*", "runs", "global_step*", "latest", "zero_to_fp32.py",
    "training_args.bin", "optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "rng_state*.pth",
    "trainer_state.json",
)
# Replaced by the rendered card, or Hub / cache bookkeeping.
REPLACED_OR_BOOKKEEPING = ("README.md", ".gitattributes", ".git", ".cache", ".huggingface")
# Unpickling runs arbitrary code: files with these suffixes are never published, whatever their name or case.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024

# Remote code may import these (and the standard library, and its sibling files): nothing else is sure to be there.
ALLOWED_IMPORT_ROOTS = frozenset({"torch", "transformers"})
# Packages hidden from the fresh process, so that only the folder's own files can serve the model.
HIDDEN_PACKAGES = ("modeling_llava_normaligned", "llava_normaligned")
REQUIRED_AUTO_CLASSES = ("AutoConfig", "AutoModelForImageTextToText")


class SelfCheckError(ValueError):
    """A folder is not fit to publish. The message names the file and says what to do."""


@dataclass
class UploadPlan:
    """What a push uploads from ``folder`` (relative posix paths), and what it leaves out (with the reason)."""

    folder: Path
    upload: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def skipped_summary(self) -> list[tuple[str, str]]:
        """``skipped`` with the files of a left-out folder (``checkpoint-500/...``) folded into one line."""
        folded: dict[str, tuple[int, str]] = {}
        for path, reason in self.skipped:
            key = f"{_top(path)}/" if "/" in path else path
            count, _ = folded.get(key, (0, reason))
            folded[key] = (count + 1, reason)
        return [(k if n == 1 and not k.endswith("/") else f"{k} ({n} files)", r) for k, (n, r) in folded.items()]

    def summary(self) -> str:
        lines = [f"{len(self.upload)} file(s) to upload from {self.folder}:"]
        lines += [f"  + {path}" for path in self.upload]
        if self.skipped:
            lines.append(f"{len(self.skipped)} left out:")
            lines += [f"  - {path}  ({reason})" for path, reason in self.skipped_summary()]
        return "\n".join(lines)


def _matches(path: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _top(path: str) -> str:
    return path.split("/", 1)[0]


def check_checkpoint_folder(folder: str | os.PathLike) -> None:
    """A usage check for ``card`` and ``push``: ``folder`` exists and holds a model (``require_model_folder``).
    Raises ``SelfCheckError`` naming the folder and what to give instead."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SelfCheckError(
            f"{folder}: not a folder ({folder.absolute()} does not exist); give a checkpoint folder written by "
            "compose, convert or train"
        )
    require_model_folder(folder)


def require_model_folder(folder: Path) -> Path:
    """``folder/config.json``, or a ``SelfCheckError`` that says what the folder is instead (a PEFT adapter: how to
    publish its merged model)."""
    config = folder / "config.json"
    if config.is_file():
        return config
    if (folder / "adapter_config.json").is_file():
        merged = folder / "merged"
        hint = (f"{merged} holds the merged model: push that folder" if (merged / "config.json").is_file() else
                "train with --use_peft --merge-adapter, which also writes the merged model to OUTPUT_DIR/merged, "
                "and push that folder (or merge with peft's merge_and_unload() and save_pretrained)")
        raise SelfCheckError(
            f"{folder}: a PEFT adapter (adapter_config.json, no config.json). An adapter repo loads only on top of "
            f"its base model, which here is a local checkpoint nobody else has; publish the merged model: {hint}"
        )
    raise SelfCheckError(f"{folder}: no config.json (expected a checkpoint folder written by save_pretrained)")


def plan_upload(folder: str | os.PathLike, include: tuple[str, ...] = ()) -> UploadPlan:
    """Sort the folder's files into uploaded and left out. ``include``: extra patterns to upload.

    Raises ``SelfCheckError`` for a folder that is not a model, and for a pickle file that would be published.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise SelfCheckError(f"{folder}: not a folder (expected a checkpoint folder written by save_pretrained)")
    plan = UploadPlan(folder)
    wanted = MODEL_PATTERNS + PROCESSOR_PATTERNS + RECORD_PATTERNS + tuple(include)
    code = remote_code_files(folder)
    for path in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()):
        top = _top(path)
        if _matches(top, REPLACED_OR_BOOKKEEPING):
            plan.skipped.append((path, "replaced by the rendered model card" if top == "README.md" else "bookkeeping"))
        elif _matches(top, TRAINING_STATE_PATTERNS):
            plan.skipped.append((path, "training state, not needed to use the model"))
        elif path.lower().endswith(PICKLE_SUFFIXES) and (_matches(path, wanted) or "/" not in path):
            raise SelfCheckError(
                f"{folder / path}: a pickle file. Unpickling runs arbitrary code, so weights are published only as "
                "safetensors: re-save the model with save_pretrained (safetensors is its default) and remove this file"
            )
        elif "/" not in path and path.endswith(".py"):
            if path in code:
                plan.upload.append(path)
            else:
                plan.skipped.append((path, "not remote code: neither in an auto_map nor imported by its files"))
        elif _matches(path, wanted):
            plan.upload.append(path)
        else:
            plan.skipped.append((path, "not needed to use the model (add it with --include)"))
    return plan


def _read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SelfCheckError(f"{path}: not valid JSON ({error})") from None
    return data if isinstance(data, dict) else {}


def auto_map_entries(folder: Path) -> list[tuple[str, str, str]]:
    """(config file, Auto class, ``module.Class`` reference) of every ``auto_map`` in the folder's top-level
    ``*config.json`` files, at any depth (a processor config nests its image processor's). A ``[slow, fast]``
    tokenizer pair gives one entry per class named."""
    entries = []

    def walk(node, name):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "auto_map" and isinstance(value, dict):
                    for auto_class, reference in value.items():
                        for ref in reference if isinstance(reference, (list, tuple)) else [reference]:
                            if isinstance(ref, str):
                                entries.append((name, auto_class, ref))
                else:
                    walk(value, name)
        elif isinstance(node, list):
            for value in node:
                walk(value, name)

    for path in sorted(folder.glob("*config.json")):
        walk(_read_config(path), path.name)
    return entries


def is_cross_repo(reference: str) -> bool:
    """``other/repo--module.Class``: transformers downloads and runs code from ANOTHER repo."""
    return "--" in reference


def remote_code_files(folder: Path) -> set[str]:
    """The files the auto_maps of the folder's configs name, and the sibling files they import, transitively."""
    require_model_folder(folder)
    pending = [f"{ref.rpartition('.')[0]}.py" for _, _, ref in auto_map_entries(folder) if not is_cross_repo(ref)]
    found = set()
    while pending:
        name = pending.pop()
        if name in found or not (folder / name).is_file():
            continue
        found.add(name)
        try:
            tree = ast.parse((folder / name).read_text(encoding="utf-8"))
        except SyntaxError:
            continue  # check_remote_code reports it
        pending += [f"{module.split('.')[0]}.py" for _, module, level in _imports(tree) if level == 1 and module]
    return found


# ------------------------------------------------------------------------------------------------------- weights


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes; ``__metadata__``), without the data."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SelfCheckError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", raw)
        if not 0 < length <= SAFETENSORS_MAX_HEADER:
            raise SelfCheckError(f"{path}: not a safetensors file (header length {length})")
        try:
            return json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SelfCheckError(f"{path}: not a safetensors file (its header is not JSON: {error})") from None


def check_weights(plan: UploadPlan) -> None:
    """Weights are there, in safetensors, and an index names only shards that are uploaded."""
    shards = [p for p in plan.upload if p.endswith(".safetensors")]
    if not shards:
        raise SelfCheckError(f"{plan.folder}: no *.safetensors weights (save the model with save_pretrained)")
    for shard in shards:
        safetensors_header(plan.folder / shard)
    for index in (p for p in plan.upload if p.endswith(".safetensors.index.json")):
        weight_map = _read_config(plan.folder / index).get("weight_map", {})
        missing = sorted(set(weight_map.values()) - set(shards))
        if missing:
            raise SelfCheckError(f"{plan.folder / index}: names shard(s) {missing} that are not in the folder")


# --------------------------------------------------------------------------------------------------- remote code


def _imports(tree: ast.AST):
    """(line, module name, relative level) of every import statement, wherever it is in the file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, 0
        elif isinstance(node, ast.ImportFrom):
            if node.level and not node.module:  # from . import sibling
                for alias in node.names:
                    yield node.lineno, alias.name, node.level
            else:
                yield node.lineno, node.module, node.level


def check_remote_code(plan: UploadPlan) -> None:
    """Every ``auto_map`` points at uploaded files and classes, and those files import only what every user has."""
    auto_map = _read_config(plan.folder / "config.json").get("auto_map") or {}
    missing = [name for name in REQUIRED_AUTO_CLASSES if name not in auto_map]
    if missing:
        raise SelfCheckError(
            f"{plan.folder / 'config.json'}: auto_map lacks {missing}, so trust_remote_code cannot find the model "
            "(save the model with this package's save_pretrained, which writes auto_map)"
        )
    code_files = [p for p in plan.upload if "/" not in p and p.endswith(".py")]
    siblings = {p[:-3] for p in code_files}
    trees = {}
    for name in code_files:
        path = plan.folder / name
        try:
            trees[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as error:
            raise SelfCheckError(f"{path}: does not parse ({error.msg}, line {error.lineno})") from None
    for config_name, auto_class, reference in auto_map_entries(plan.folder):
        module, _, class_name = reference.rpartition(".")
        where = f"{plan.folder / config_name}: auto_map[{auto_class!r}] = {reference!r}"
        if is_cross_repo(reference):
            raise SelfCheckError(f"{where} points into another repo, whose code trust_remote_code would run")
        if module not in siblings:
            raise SelfCheckError(f"{where}, but {module}.py is not in the folder")
        body = trees[f"{module}.py"].body
        defined = {n.name for n in body if isinstance(n, ast.ClassDef)}
        # a module-level __getattr__ (PEP 562) makes classes on first use, as the aligned stock models' file does
        # (one class per family): the load check below is what shows the class is there
        makes_classes = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in body)
        if class_name not in defined and not makes_classes:
            raise SelfCheckError(f"{where}, but {module}.py defines no class {class_name}")
    for name, tree in trees.items():
        for line, module, level in _imports(tree):
            root = (module or "").split(".")[0]
            if level > 1 or (level == 1 and root not in siblings):
                raise SelfCheckError(
                    f"{plan.folder / name}, line {line}: relative import of {'.' * level}{module or ''}, which is "
                    "not a sibling file of the folder; remote code is flat, one folder"
                )
            if level == 0 and root not in ALLOWED_IMPORT_ROOTS and root not in sys.stdlib_module_names:
                raise SelfCheckError(
                    f"{plan.folder / name}, line {line}: imports {module!r}. Remote code may import only torch, "
                    "transformers, the standard library and its sibling files: a user who loads this model with "
                    f"trust_remote_code=True may not have {root!r}"
                )


# ------------------------------------------------------------------------------------------------------- secrets

# A Hugging Face user access token: "hf_" and 34 letters or digits.
TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{34}\b")
_TOKEN_BYTES = re.compile(TOKEN_PATTERN.pattern.encode())
_SCAN_CHUNK = 8 * 1024 * 1024
_SCAN_OVERLAP = 256  # longer than any token: a token split across two chunks is still seen whole


def known_tokens(token: str | None = None) -> list[str]:
    """Tokens that must never be published: the one given, ``HF_TOKEN``, and the one saved by ``hf auth login``."""
    from huggingface_hub import get_token

    found = [token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN"), get_token()]
    return sorted({t for t in found if t})


def scrub(text: str, tokens: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every known token and anything shaped like a Hub token replaced by ``hf_***``."""
    for token in tokens:
        text = text.replace(token, "hf_***")
    return TOKEN_PATTERN.sub("hf_***", text)


def _first_hit(data: bytes, needles: list[bytes]) -> int | None:
    hits = [i for i in (data.find(n) for n in needles) if i >= 0]
    match = _TOKEN_BYTES.search(data)
    if match:
        hits.append(match.start())
    return min(hits) if hits else None


def _scan_file(path: Path, needles: list[bytes]) -> int | None:
    """Byte offset of the first token in the file, read in chunks (any size, text or binary), or None."""
    with open(path, "rb") as f:
        offset, tail = 0, b""  # offset: where `tail` starts in the file
        while chunk := f.read(_SCAN_CHUNK):
            data = tail + chunk
            hit = _first_hit(data, needles)
            if hit is not None:
                return offset + hit
            tail = data[-_SCAN_OVERLAP:]
            offset += len(data) - len(tail)
    return None


def _position(path: Path, offset: int) -> str:
    """"line N" in a text file, "byte N" in a binary one (NUL bytes in its first 8 KiB)."""
    with open(path, "rb") as f:
        head = f.read(offset)
    if b"\0" in head[:8192]:
        return f"byte {offset}"
    newlines = head.count(b"\n")
    return f"line {newlines + 1}"


def find_secrets(paths, tokens: list[str]) -> None:
    """Refuse to publish a file that holds a Hub token (the token itself is never printed).

    Every file is scanned whole, whatever its name or type; of a safetensors file, only the header (the tensor data
    holds numbers, and is not where a token is written)."""
    needles = [t.encode() for t in tokens]
    for full in map(Path, paths):
        if full.name.endswith(".safetensors"):
            header = json.dumps(safetensors_header(full)).encode()
            where = "its header" if _first_hit(header, needles) is not None else None
        else:
            hit = _scan_file(full, needles)
            where = _position(full, hit) if hit is not None else None
        if where is not None:
            raise SelfCheckError(
                f"{full}, {where}: holds what looks like a Hugging Face access token. Remove it (and revoke the "
                "token if it was ever shared) before publishing"
            )


# --------------------------------------------------------------------------------------------------- local paths

# Files read as records (what this package, transformers, TRL or a user wrote about the model) and scanned for local
# paths: text files other than the vocabulary files (their strings are tokens), the chat template (the model's own
# text), code, images and weights; of a safetensors file, the metadata in its header.
PATH_SCANNED = ("*.json", "*.jsonl", "*.md", "*.csv", "*.tsv", "*.yaml", "*.yml", "*.txt", "*.log", "*.safetensors")
VOCABULARY_FILES = (
    "tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json", "special_tokens_map.json",
)


class LocalPathError(SelfCheckError):
    """A file to publish names a path on this machine (``llava_normaligned.local_paths``)."""


def _strings(node):
    """Every string of a parsed JSON document, keys included."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _texts(path: Path):
    """What a file says, as the reader of the published file reads it: a JSON file's strings decoded (so that an
    escape such as ``"A:\\nB"`` is not taken for a Windows path), any other text as it is."""
    if path.name.endswith(".safetensors"):
        yield from _strings(safetensors_header(path).get("__metadata__") or {})
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines() if path.name.endswith(".jsonl") else [text]
    for line in lines:
        try:
            yield from _strings(json.loads(line)) if path.name.endswith((".json", ".jsonl")) else [line]
        except json.JSONDecodeError:
            yield line


def first_local_path(path: Path) -> str | None:
    """The first local path a file to publish names, or None."""
    for text in _texts(path):
        found = local_paths_in(text)
        if found:
            return found[0]
    return None


def check_local_paths(files: dict[str, Path]) -> None:
    """Refuse to publish a record (path in repo -> local file) that names a path on this machine."""
    for in_repo, full in sorted(files.items()):
        name = in_repo.rpartition("/")[2]
        if not _matches(name, PATH_SCANNED) or name in VOCABULARY_FILES:
            continue
        found = first_local_path(full)
        if found is not None:
            raise LocalPathError(local_path_message(str(full), found))


def check_text_paths(where: str, text: str) -> None:
    """Refuse to publish ``text`` (the rendered model card, named ``where``) if it names a path on this machine."""
    found = local_paths_in(text)
    if found:
        raise LocalPathError(local_path_message(where, found[0]))


def local_path_message(where: str, found: str) -> str:
    return (f"{where} names the local path {found!r}: what is published names a file or folder by its own name "
            f"({hide_local_paths(found)!r}); rewrite or remove it, then push again")


# ------------------------------------------------------------------------------------------------- a fresh Python

_HIDING_PRELUDE = """\
import importlib.abc as _abc, sys as _sys

_HIDDEN = {hidden!r}


class _HidePackages(_abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden: a machine without it)", name=name)
        return None


_sys.meta_path.insert(0, _HidePackages())
for _name in _HIDDEN:
    try:
        __import__(_name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"isolation failed: {{_name}} is still importable")
del _abc
"""


def run_without_package(
    code: str,
    args: list[str] | tuple[str, ...] = (),
    *,
    cwd: str | os.PathLike,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    hidden: tuple[str, ...] = HIDDEN_PACKAGES,
) -> subprocess.CompletedProcess:
    """Run Python ``code`` (dedented) in a fresh interpreter on which this package cannot be imported.

    The interpreter is this one (so torch and transformers are there), started with ``-I``: no ``PYTHON*``
    variables, no user site, neither the current folder nor the script's on ``sys.path``; a meta-path finder placed
    first refuses the ``hidden`` packages even when installed in site-packages (editable or not), and the process
    exits if one still imports. ``sys.argv`` is ``["-c", *args]``; ``env`` is the whole environment (default: this
    process's). Returns the ``CompletedProcess`` (text output captured); it does not raise on a non-zero exit.
    """
    command = [sys.executable, "-I", "-c", _HIDING_PRELUDE.format(hidden=tuple(hidden)) + textwrap.dedent(code),
               *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=dict(os.environ) if env is None else env, capture_output=True,
                          text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------------- load check

LOAD_CHECK_SCRIPT = """
import json, sys
from transformers import AutoModelForImageTextToText, AutoProcessor

folder = sys.argv[1]
model, info = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
report = {
    "model_class": type(model).__name__,
    "model_module": type(model).__module__,
    "processor_class": type(processor).__name__,
    "missing_keys": sorted(map(str, info.get("missing_keys", ()))),
    "unexpected_keys": sorted(map(str, info.get("unexpected_keys", ()))),
    "mismatched_keys": sorted(map(str, info.get("mismatched_keys", ()))),
    "error_msgs": [str(m) for m in info.get("error_msgs", ())],
}
print("SELFCHECK " + json.dumps(report))
"""


@dataclass
class LoadReport:
    model_class: str
    model_module: str
    processor_class: str


def stage_files(folder: Path, files, destination: Path) -> None:
    """Put exactly ``files`` (relative paths) of ``folder`` into ``destination``: hard links (no copy of the
    weights), or symbolic links across file systems."""
    for name in files:
        source, target = (folder / name).resolve(), destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            os.symlink(source, target)


def check_loads(folder: str | os.PathLike, files: list[str] | None = None, timeout: float | None = None) -> LoadReport:
    """Load ``files`` of ``folder`` (default: all of them; ``self_check`` passes the upload plan) in a fresh process
    that has torch and transformers but not this package, offline, as a user who downloads the repo would.

    The files are staged in a scratch folder first: a file the repo would lack (remote code, a tokenizer file left
    out of the upload) fails here, not on the user's machine."""
    folder = Path(folder).resolve()
    if files is None:
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    with tempfile.TemporaryDirectory(prefix="llava-na-selfcheck-") as scratch:
        staged = Path(scratch) / folder.name
        stage_files(folder, files, staged)
        # Its own HF_HOME: nothing from the user's caches (stale remote code modules) serves the check, nothing of
        # the check stays behind; no token: the check reads a local folder and needs none.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "PYTHON"))}
        env.update(HF_HOME=os.path.join(scratch, "hf_home"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
                   TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
        try:
            done = run_without_package(LOAD_CHECK_SCRIPT, [str(staged)], cwd=scratch, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SelfCheckError(f"{folder}: loading it in a fresh process took over {timeout} s") from None
        output = (done.stderr or done.stdout).replace(str(staged), str(folder))  # the user's folder, not ours
    lines = [line for line in done.stdout.splitlines() if line.startswith("SELFCHECK ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise SelfCheckError(
            f"{folder}: the files to upload do not load with trust_remote_code=True in a fresh process without "
            f"llava-normaligned (exit code {done.returncode}); a file the model needs may be left out of the upload "
            f"(see --dry-run, add it with --include):\n{scrub(tail)}"
        )
    report = json.loads(lines[-1][len("SELFCHECK "):])
    problems = {k: report[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") if report[k]}
    if problems:
        shown = "; ".join(f"{k}: {v[:8]}{' ...' if len(v) > 8 else ''}" for k, v in problems.items())
        raise SelfCheckError(
            f"{folder}: loads, but its weights do not match the model its config builds ({shown}); missing weights "
            "would be randomly re-initialised on every user's machine"
        )
    if not report["model_module"].startswith("transformers_modules."):
        raise SelfCheckError(f"{folder}: the model class came from {report['model_module']}, not from the folder")
    return LoadReport(report["model_class"], report["model_module"], report["processor_class"])


# --------------------------------------------------------------------------------------------------- all of it


def self_check(
    folder: str | os.PathLike,
    *,
    include: tuple[str, ...] = (),
    tokens: list[str] | None = None,
    load: bool = True,
    load_timeout: float | None = None,
) -> UploadPlan:
    """Every check above, cheapest first. Returns the upload plan; raises ``SelfCheckError`` naming the problem
    (``LocalPathError`` for a local path)."""
    plan = plan_upload(folder, include)
    check_weights(plan)
    check_remote_code(plan)
    find_secrets([plan.folder / p for p in plan.upload], known_tokens() if tokens is None else tokens)
    check_local_paths({p: plan.folder / p for p in plan.upload})
    if load:
        check_loads(plan.folder, plan.upload, timeout=load_timeout)
    return plan
