"""The ``llava-normaligned`` commands, one module each, named as the command (``make-data`` -> ``make_data.py``).

Each module has ``make_parser()`` and ``main(argv) -> int``: it parses and checks the arguments, calls the library
once, and turns what the library returns or raises into output and an exit code (0 done, 1 failed, 2 bad input, 130
Ctrl-C, 143 SIGTERM). The library below (the model, ``families``, the core, ``trainer``, ``diagnostics``,
``evaluation``, ``serving``, ``hub_cards``) never prints, parses arguments or exits. ``cli.py`` dispatches by name
and imports a command's module only when it runs.
"""

from __future__ import annotations

# name -> (module under llava_normaligned.commands, one line for the command list)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "CPU demo: the paper's comparison on synthetic images"),
    "make-data": ("make_data", "write the synthetic VQA dataset (LLaVA JSON)"),
    "train": ("train", "train stage 1 or 2 with TRL's SFTTrainer"),
    "dpo": ("dpo", "`trl dpo`, flag for flag, with the norm tracked"),
    "grpo": ("grpo", "`trl grpo`, flag for flag, with the norm tracked"),
    "kto": ("kto", "`trl kto`, flag for flag, with the norm tracked"),
    "rl-data": ("rl_data", "LLaVA JSON as a DPO / GRPO / KTO dataset folder"),
    "compose": ("compose", "build a model from a vision encoder and a causal LM"),
    "align": ("align", "put the aligned norm into a saved VLM of another family"),
    "convert": ("convert", "turn a stock LLaVA checkpoint into a norm-aligned one"),
    "tiny": ("tiny", "write a tiny random VLM of another family (nothing downloaded)"),
    "generate": ("generate", "answer prompts about images (full precision, 4/8-bit)"),
    "chat": ("chat", "a local web page: answers streamed, the image's norms beside"),
    "diagnose": ("diagnose", "norm-gap diagnostics: the paper's probes, the blog's tests"),
    "eval": ("eval", "score a model on the paper's benchmarks"),
    "card": ("card", "render the model card of a checkpoint folder"),
    "push": ("push", "check a folder is self-contained, then push it"),
    "pull": ("pull", "download a checkpoint from the Hub"),
}


def module_name(command: str) -> str:
    """The module of ``command`` (a key of ``COMMANDS``)."""
    return f"{__name__}.{COMMANDS[command][0]}"


__all__ = ["COMMANDS", "module_name"]
