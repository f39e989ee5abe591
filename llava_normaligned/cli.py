"""``llava-normaligned``: one console script, one subcommand per task.

Each subcommand lives in its own module with a ``main(argv) -> int`` (and a ``make_*parser()`` for ``--help``);
modules are imported only when their subcommand runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import os
import sys
import warnings

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("llava_normaligned.demo.run", "main", "CPU demo: the paper's comparison on synthetic images"),
    "make-data": ("llava_normaligned.demo.synthetic", "main", "write the synthetic VQA dataset (LLaVA JSON)"),
    "train": ("llava_normaligned.trainer.train", "main", "train stage 1 or 2 with TRL's SFTTrainer"),
    "compose": ("llava_normaligned.compose", "compose_main", "build a model from a vision encoder and a causal LM"),
    "convert": ("llava_normaligned.compose", "convert_main", "turn a stock LLaVA checkpoint into a norm-aligned one"),
    "generate": ("llava_normaligned.inference", "main", "answer prompts about images (full precision, 4/8-bit)"),
    "diagnose": ("llava_normaligned.diagnostics", "main", "norm-gap diagnostics: the paper's probes, the blog's tests"),
    "eval": ("llava_normaligned.evaluation", "main", "score a model on the paper's benchmarks"),
    "card": ("llava_normaligned.hub_cards.card", "main", "render the model card of a checkpoint folder"),
    "push": ("llava_normaligned.hub_cards.push", "push_main", "check a folder is self-contained, then push it"),
    "pull": ("llava_normaligned.hub_cards.push", "pull_main", "download a checkpoint from the Hub"),
}


def fail(command: str, error, code: int = 2) -> int:
    """Report a command's error in one line on stderr, ``llava-normaligned COMMAND: error: MESSAGE`` (the message's
    first line: the way out belongs there), and return ``code`` (2: bad input, as argparse's own usage errors)."""
    message = str(error).strip() or type(error).__name__
    print(f"llava-normaligned {command}: error: {message.splitlines()[0]}", file=sys.stderr)
    return code


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


_BNB_KERNEL_NOTICE = _DropMessage("Failed to load CPU gemm_4bit_forward")


def quiet_known_notices(argv: list[str] | None = None) -> None:
    """Silence two notices the user did not cause, each by its exact source and message:

    * bitsandbytes (``bitsandbytes.backends.cpu.ops``, at import on a CPU with AVX512-BF16) tries to fetch an
      optional CPU kernel from the Hub's ``kernels`` package and, failing (not installed, or offline), logs "Failed to
      load CPU gemm_4bit_forward ... pip install kernels"; it then uses its own kernel, which is what this package
      tests with.
    * TRL's ``SFTConfig`` defaults ``gradient_checkpointing=True`` and transformers 5 warns that the name is
      deprecated (``activation_checkpointing``) for that default. Kept when ``argv`` (or a config file it names) sets
      the option itself: then the warning is about the user's own flag.
    """
    bnb_logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    if _BNB_KERNEL_NOTICE not in bnb_logger.filters:
        bnb_logger.addFilter(_BNB_KERNEL_NOTICE)
    if argv is not None and not _sets_gradient_checkpointing(argv):
        warnings.filterwarnings(
            "ignore", message=r"`gradient_checkpointing(_kwargs)?` is deprecated", category=FutureWarning
        )


def _sets_gradient_checkpointing(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        if "gradient_checkpointing" in arg:
            return True
        if arg == "--config" and i + 1 < len(argv) or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
            try:
                with open(path, encoding="utf-8") as handle:
                    if "gradient_checkpointing" in handle.read():
                        return True
            except OSError:
                pass
    return False


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: llava-normaligned <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, _, text) in COMMANDS.items()]
    lines += ["", "Run `llava-normaligned <command> --help` for a command's options."]
    return "\n".join(lines)


HELP_FLAGS = (["-h"], ["--help"])
# what a command's --help text depends on besides this package's own source
HELP_DEPENDS_ON = ("llava-normaligned", "trl", "transformers", "peft", "accelerate", "datasets")


def help_cache_dir() -> str:
    """Where ``COMMAND --help`` texts are kept: ``$LLAVA_NORMALIGNED_CACHE``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, under ``llava-normaligned/help``."""
    root = os.environ.get("LLAVA_NORMALIGNED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llava-normaligned")
    return os.path.join(root, "help")


def _help_key(name: str) -> str:
    """A digest of what ``name --help`` prints from: the installed versions of the packages whose options it lists
    and every source file of this package (an edited checkout is a new key)."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.blake2b(name.encode(), digest_size=12)
    for package in HELP_DEPENDS_ON:
        try:
            digest.update(f"{package}={version(package)};".encode())
        except PackageNotFoundError:
            digest.update(f"{package}=none;".encode())
    package_dir = os.path.dirname(os.path.abspath(__file__))
    roots = [package_dir] + [os.path.join(os.path.dirname(package_dir), d) for d in ("trainer", "hub_cards")]
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(f for f in files if f.endswith(".py") or f.endswith(".yaml")):
                path = os.path.join(folder, file)
                stat = os.stat(path)
                digest.update(f"{os.path.relpath(path, root)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def cached_help(name: str, run) -> int:
    """``name --help``: printed from the cache when this package, its sources and the packages it lists options
    of are as they were when it was last built; otherwise built by ``run(["--help"])`` (``train --help`` imports
    TRL and transformers' ``TrainingArguments``: seconds on an idle machine, a minute on a busy one) and kept."""
    path = os.path.join(help_cache_dir(), f"{name}-{_help_key(name)}.txt")
    try:
        with open(path, encoding="utf-8") as handle:
            sys.stdout.write(handle.read())
        return 0
    except OSError:
        pass
    captured = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(captured):
        try:
            code = int(run(["--help"]) or 0)
        except SystemExit as done:  # argparse's --help exits
            code = done.code if isinstance(done.code, int) else 0
    text = captured.getvalue()
    sys.stdout.write(text)
    if code == 0 and text:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}.partial"
            with open(partial, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(partial, path)  # never a half-written help text
        except OSError:
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(version("llava-normaligned"))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"llava-normaligned: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function, _ = COMMANDS[name]
    quiet_known_notices(rest)
    if rest in HELP_FLAGS:
        return cached_help(name, lambda args: getattr(importlib.import_module(module_name), function)(args))
    module = importlib.import_module(module_name)
    result = getattr(module, function)(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
