"""What the commands that parse TRL's dataclasses share (``train``, and ``dpo``/``grpo``/``kto``): the help formatter,
the ``--no_X`` twins' help, and the one reader of their ``--config`` recipes (``read_request``).

TRL's ``TrlParser`` (transformers' ``HfArgumentParser``) reads every field of the dataclasses, so every ``SFTConfig``
flag works (``--per_device_train_batch_size 4`` or ``--per-device-train-batch-size 4``); YAML recipes set defaults
(``--config recipe.yaml``; several ``--config`` files merge in order, later ones win; a value may name a recipe
shipped in ``trainer/recipes/``), and command-line flags override them.
"""

from __future__ import annotations

import re

from llava_normaligned.checks import BadInput
from llava_normaligned.compat import DefaultsHelpFormatter, is_store_false, parser_actions
from llava_normaligned.trainer.arguments import TrainRequest, resolve_config

from .config_files import pop_config_flags, read_config_files


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


def read_request(argv: list[str], parser, fields: str) -> TrainRequest:
    """argv and the ``--config`` recipes it names (files, or the names of shipped recipes), parsed by ``parser`` (a
    ``TrlParser``) -> a ``TrainRequest``: the one reader of ``--config`` files for ``train`` and the commands that
    mirror TRL's scripts. ``fields``: what a recipe's keys must be, for the error naming one that is not."""
    try:
        argv, config_files = pop_config_flags(argv)
    except ValueError as error:  # a usage error, as every command's parser reports one
        parser.error(str(error))
    environment, values = {}, {}
    if config_files:
        values, environment = read_config_files(config_files, resolve=resolve_config, environment=True)
        unused = parser.set_defaults_with_config(**values)
        if unused:
            raise BadInput(f"--config: unknown arguments {unused} (not {fields})")
    namespace, remaining = parser.parse_known_args(argv)
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return TrainRequest(namespace, tuple(config_files), environment,
                        bf16_asked=any(arg == "--bf16" or arg.startswith("--bf16=") for arg in argv),
                        recipe_keys=tuple(sorted(values)))


__all__ = ["HelpFormatter", "describe_negations", "read_request"]
