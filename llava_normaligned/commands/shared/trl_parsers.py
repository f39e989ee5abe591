"""What the commands that parse TRL's dataclasses share (``train``, and ``dpo``/``grpo``/``kto``): the help formatter,
the ``--no_X`` twins' help, and the ``TrainRequest`` their parse gives (``read_request``).

Their parser is every command's ``CommandParser`` and TRL's ``TrlParser`` (transformers' ``HfArgumentParser``) at
once: every field of the dataclasses is a flag (``--per_device_train_batch_size 4`` or
``--per-device-train-batch-size 4``); YAML recipes set defaults (``--config recipe.yaml``; several merge in order,
later ones win; a value may name a recipe shipped in ``trainer/recipes/``; a recipe's ``env:`` keys are set by
``trainer.arguments.setup_environment``), and command-line flags override them.
"""

from __future__ import annotations

import re

from llava_normaligned.compat import DefaultsHelpFormatter, is_store_false, parser_actions
from llava_normaligned.trainer.arguments import TrainRequest

from .parsers import CommandParser


class HelpFormatter(DefaultsHelpFormatter):
    """transformers' formatter (``HfArgumentParser`` ends each option's help with "(default: X)"), except where the
    help already states its default in words ("(default: the LLM's)", "default: as the model is", "(required)"),
    and for the ``--no_X`` twin of a boolean flag, whose own default is never used (--X's is)."""

    STATED = re.compile(r"\((?:default\b|required\))|\bdefault:")

    def help_states_default(self, action) -> bool:
        return bool(self.STATED.search(action.help or "")) or _negates(action)


def _negates(action) -> bool:
    return is_store_false(action) and any(o.startswith("--no") for o in action.option_strings)


def describe_negations(parser) -> None:
    """``HfArgumentParser`` gives a boolean flag's ``--no_X`` twin the help of ``--X`` word for word, so --help read
    as two flags doing the same thing: say what the twin does instead."""
    for action in parser_actions(parser):
        if _negates(action):
            action.help = f"turn --{action.dest} off (the same as --{action.dest} False)"


def read_request(argv: list[str], parser: CommandParser) -> TrainRequest:
    """argv parsed by ``parser`` (a ``CommandParser`` that is a ``TrlParser`` too, reading ``--config`` files or
    shipped recipes with their ``env:`` keys) -> a ``TrainRequest``: what the command line and the recipes say, before
    anything is derived. Nothing left over: an argument no field takes is a usage error."""
    namespace, remaining = parser.parse_known_args(argv)
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return TrainRequest(namespace, parser.config_files, dict(parser.config_env),
                        bf16_asked=any(arg == "--bf16" or arg.startswith("--bf16=") for arg in argv),
                        recipe_keys=parser.config_keys)


__all__ = ["HelpFormatter", "describe_negations", "read_request"]
