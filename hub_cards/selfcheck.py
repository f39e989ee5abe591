"""Is a checkpoint folder fit to publish? Decide what to upload, then check it stands on its own.

A folder is published only if someone who has torch and transformers, but not this package, can load it with
``trust_remote_code=True``. So, before anything is uploaded:

1. ``plan_upload``: pick the files a user needs (weights, config, remote code, processor, tokenizer, chat template,
   training and evaluation records) and leave out training state (``checkpoint-*``, optimizer states,
   ``training_args.bin``, ...). Pickled weights are refused: weights travel only as safetensors.
2. ``check_weights``: every safetensors file parses, and a sharded index names only shards that are there.
3. ``check_remote_code``: ``config.json`` maps the Auto classes to files that are uploaded, and those files import
   nothing but torch, transformers, the standard library and each other.
4. ``find_secrets``: no Hub access token in any uploaded file.
5. ``check_loads``: a fresh Python process in which this package cannot be imported loads the folder with
   ``AutoModelForImageTextToText`` and ``AutoProcessor`` (``trust_remote_code=True``), with no missing, unexpected
   or mismatched weights.
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
from dataclasses import dataclass, field
from pathlib import Path

# ------------------------------------------------------------------------------------------------ what is uploaded

# Files a user of the model needs, as patterns on the path relative to the folder (posix separators).
MODEL_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
PROCESSOR_PATTERNS = (
    "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
    "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja",
)
# Records the model card is rendered from: published with the weights so that readers can check the card's numbers.
RECORD_PATTERNS = (
    "training_summary.json", "norm_tracking.json",
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
# Unpickling runs arbitrary code: files with these suffixes are never published, whatever their name.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024

# Remote code may import these (and the standard library, and its sibling files): nothing else is sure to be there.
ALLOWED_IMPORT_ROOTS = frozenset({"torch", "transformers"})
# Packages hidden from the load check's process, so that only the folder's own files can serve the model.
HIDDEN_PACKAGES = ("modeling_llava_normaligned", "llava_normaligned")
REQUIRED_AUTO_CLASSES = ("AutoConfig", "AutoModelForImageTextToText")

# A Hugging Face user access token: "hf_" and 34 letters or digits.
TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{34}\b")
TEXT_SUFFIXES = (".json", ".md", ".py", ".jinja", ".txt", ".csv", ".svg", ".model", ".yaml", ".yml")


class SelfCheckError(ValueError):
    """A folder is not fit to publish. The message names the file and says what to do."""


@dataclass
class UploadPlan:
    """What a push uploads from ``folder`` (relative posix paths) and what it leaves out, with the reason."""

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


def plan_upload(folder: str | os.PathLike, include: tuple[str, ...] = ()) -> UploadPlan:
    """Sort the folder's files into uploaded and left out. ``include``: extra patterns to upload.

    Raises ``SelfCheckError`` for a pickle file that would be published (weights must be safetensors).
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
                plan.skipped.append((path, "not remote code: neither in auto_map nor imported by its files"))
        elif _matches(path, wanted):
            plan.upload.append(path)
        else:
            plan.skipped.append((path, "not needed to use the model (add it with --include)"))
    return plan


def remote_code_files(folder: Path) -> set[str]:
    """The files ``config.json``'s auto_map names, and the sibling files they import, transitively."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SelfCheckError(f"{folder}: no config.json (expected a folder written by save_pretrained)")
    try:
        auto_map = json.loads(config_path.read_text()).get("auto_map") or {}
    except json.JSONDecodeError as error:
        raise SelfCheckError(f"{config_path}: not valid JSON ({error})") from None
    references = [r[-1] if isinstance(r, list) else r for r in auto_map.values()]
    pending = [f"{r.rpartition('.')[0]}.py" for r in references if isinstance(r, str) and "--" not in r]
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
        weight_map = json.loads((plan.folder / index).read_text()).get("weight_map", {})
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
    """``auto_map`` points at uploaded files and classes, and those files import only what every user has."""
    config = json.loads((plan.folder / "config.json").read_text())
    auto_map = config.get("auto_map") or {}
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
    for auto_class, reference in auto_map.items():
        reference = reference[-1] if isinstance(reference, list) else reference  # [slow, fast] tokenizer pairs
        if reference is None:
            continue
        module, _, class_name = reference.rpartition(".")
        if "--" in module:
            raise SelfCheckError(f"config.json: auto_map[{auto_class!r}] = {reference!r} points into another repo")
        if module not in siblings:
            raise SelfCheckError(
                f"config.json: auto_map[{auto_class!r}] = {reference!r}, but {module}.py is not in {plan.folder}"
            )
        defined = {n.name for n in trees[f"{module}.py"].body if isinstance(n, ast.ClassDef)}
        if class_name not in defined:
            raise SelfCheckError(f"{plan.folder / (module + '.py')}: defines no class {class_name} (auto_map)")
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


def find_secrets(paths, tokens: list[str]) -> None:
    """Refuse to publish a file that holds a Hub token (the token itself is never printed)."""
    needles = [t.encode() for t in tokens]
    for full in map(Path, paths):
        if full.name.endswith(".safetensors"):
            data = json.dumps(safetensors_header(full)).encode()  # only the header can hold text
        elif full.name.endswith(TEXT_SUFFIXES):
            data = full.read_bytes()
        else:
            continue
        for lineno, line in enumerate(data.splitlines(), start=1):
            if any(n in line for n in needles) or TOKEN_PATTERN.search(line.decode("utf-8", "replace")):
                raise SelfCheckError(
                    f"{full}, line {lineno}: holds what looks like a Hugging Face access token. Remove it (and "
                    "revoke the token if it was ever shared) before publishing"
                )


# ---------------------------------------------------------------------------------------------------- load check

# Run with `python -I` from an empty folder: no PYTHONPATH, no user site, no current directory on sys.path; and the
# finder below hides this package even when it is installed in site-packages (editable or not).
LOAD_CHECK_SCRIPT = r"""
import importlib.abc, importlib.util, json, sys

HIDDEN = set(sys.argv[2].split(","))


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the self-check)", name=name)
        return None


sys.meta_path.insert(0, _Hidden())
for name in HIDDEN:
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"self-check: {name} is still importable")

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


def check_loads(folder: str | os.PathLike, timeout: float | None = None) -> LoadReport:
    """Load ``folder`` in a fresh process that has torch and transformers but not this package, offline."""
    folder = Path(folder).resolve()
    with tempfile.TemporaryDirectory(prefix="llava-na-selfcheck-") as scratch:
        # Its own HF_HOME: nothing from the user's caches (stale remote code modules) serves the check, nothing of
        # the check stays behind; no token: the check reads a local folder and needs none.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE", "PYTHON"))}
        env.update(HF_HOME=scratch, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error",
                   TOKENIZERS_PARALLELISM="false")
        command = [sys.executable, "-I", "-c", LOAD_CHECK_SCRIPT, str(folder), ",".join(HIDDEN_PACKAGES)]
        try:
            done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SelfCheckError(f"{folder}: loading it in a fresh process took over {timeout} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("SELFCHECK ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SelfCheckError(
            f"{folder}: does not load with trust_remote_code=True in a fresh process without llava-normaligned "
            f"(exit code {done.returncode}):\n{scrub(tail)}"
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
    """Every check above, cheapest first. Returns the upload plan; raises ``SelfCheckError`` naming the problem."""
    plan = plan_upload(folder, include)
    check_weights(plan)
    check_remote_code(plan)
    find_secrets([plan.folder / p for p in plan.upload], known_tokens() if tokens is None else tokens)
    if load:
        check_loads(plan.folder, timeout=load_timeout)
    return plan
