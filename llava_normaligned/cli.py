"""``llava-normaligned``: one console script, one subcommand per task.

Each subcommand lives in its own module with a ``main(argv) -> int`` (and a ``make_*parser()`` for ``--help``);
modules are imported only when their subcommand runs, so ``--help`` stays fast. This module only parses the
subcommand and dispatches; what commands share (``fail``, the input checks, the notice filters, the progress-bar
switch, the help cache) lives in ``llava_normaligned.console``.
"""

from __future__ import annotations

import importlib
import sys

from .console import (
    INTERRUPTED,
    cached_help,
    end_hold,
    fail,
    hold_library_output,
    progress_bars_on_terminals_only,
    quiet_known_notices,
)

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("llava_normaligned.demo.run", "main", "CPU demo: the paper's comparison on synthetic images"),
    "make-data": ("llava_normaligned.demo.synthetic", "main", "write the synthetic VQA dataset (LLaVA JSON)"),
    "train": ("llava_normaligned.trainer.train", "main", "train stage 1 or 2 with TRL's SFTTrainer"),
    "dpo": ("llava_normaligned.trainer.preference", "dpo_main", "`trl dpo`, flag for flag, with the norm tracked"),
    "grpo": ("llava_normaligned.trainer.preference", "grpo_main", "`trl grpo`, flag for flag, with the norm tracked"),
    "kto": ("llava_normaligned.trainer.preference", "kto_main", "`trl kto`, flag for flag, with the norm tracked"),
    "rl-data": ("llava_normaligned.trainer.rl_data", "main", "LLaVA JSON as a DPO / GRPO / KTO dataset folder"),
    "compose": ("llava_normaligned.assembly.commands", "compose_main",
                "build a model from a vision encoder and a causal LM"),
    "align": ("llava_normaligned.assembly.commands", "align_main",
              "put the aligned norm into a saved VLM of another family"),
    "convert": ("llava_normaligned.assembly.commands", "convert_main",
                "turn a stock LLaVA checkpoint into a norm-aligned one"),
    "generate": ("llava_normaligned.serving.generate", "main", "answer prompts about images (full precision, 4/8-bit)"),
    "chat": ("llava_normaligned.chat.command", "main", "a local web page: answers streamed, the image's norms beside"),
    "diagnose": ("llava_normaligned.diagnostics", "main", "norm-gap diagnostics: the paper's probes, the blog's tests"),
    "eval": ("llava_normaligned.evaluation", "main", "score a model on the paper's benchmarks"),
    "card": ("llava_normaligned.hub_cards.card", "main", "render the model card of a checkpoint folder"),
    "push": ("llava_normaligned.hub_cards.push", "push_main", "check a folder is self-contained, then push it"),
    "pull": ("llava_normaligned.hub_cards.push", "pull_main", "download a checkpoint from the Hub"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: llava-normaligned <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, _, text) in COMMANDS.items()]
    lines += ["", "Run `llava-normaligned <command> --help` for a command's options."]
    return "\n".join(lines)


HELP_FLAGS = (["-h"], ["--help"])


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
    progress_bars_on_terminals_only()
    if rest in HELP_FLAGS:
        return cached_help(name, lambda args: getattr(importlib.import_module(module_name), function)(args))
    # what the libraries print while they are imported and the arguments read is shown once the command accepted its
    # arguments, and dropped when it answers bad input with its one line (console.hold_library_output)
    hold_library_output()
    try:
        module = importlib.import_module(module_name)
        result = getattr(module, function)(rest)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (train says itself what it kept)
        return fail(name, "interrupted (Ctrl-C)", code=INTERRUPTED)
    finally:
        end_hold(keep=True)  # a command that never said its arguments were accepted: shown at its end
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
