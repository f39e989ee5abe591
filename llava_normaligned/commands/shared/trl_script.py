"""What ``dpo``, ``grpo`` and ``kto`` share: the parser of TRL's script (its dataclasses, ``--config``, one-line usage
errors) and the run around ``trainer.preference`` (parse and check, train with the norm tracked, one line and an exit
code for bad input, Ctrl-C and SIGTERM). Each command is a file beside this one.
"""

from __future__ import annotations

import logging
import os
import sys

from llava_normaligned.checks import BadInput
from llava_normaligned.loading import register_local_model
from llava_normaligned.notices import keep_notices_of
from llava_normaligned.trainer.arguments import earlier_run, resolve_config, setup_environment
from llava_normaligned.trainer.callbacks import NormTrackingCallback, SigtermCheckpoint, Terminated
from llava_normaligned.trainer.preference import (
    TRAINERS,
    build_script_args,
    build_trainer,
    check_script_inputs,
    load_script_dataset,
    reward_functions,
    train_and_save,
    trl_script,
)

from . import INTERRUPTED, TERMINATED, CommandParser, arguments_accepted, fail, removed_unless_kept
from .stops import DiskFull, disk_full_message, stopped_message
from .trl_parsers import HelpFormatter, describe_negations, read_request


def script_parser(kind: str):
    """The parser of ``llava-normaligned KIND``: TRL's script's dataclasses, ``--config``, one-line usage errors."""
    from trl import TrlParser

    class ScriptParser(CommandParser, TrlParser):
        """Every command's parser and TRL's at once: TRL's script's dataclasses' fields as flags."""

    types = trl_script(kind).make_parser().dataclass_types
    parser = ScriptParser(
        types, resolve_config=resolve_config, config_environment=True, formatter_class=HelpFormatter,
        prog=f"llava-normaligned {kind}",
        description=f"TRL's `trl {kind}` script, flag for flag (--config RECIPE.yaml too), with the norm tracked "
        "(norm/* in the logs, norm_tracking.json), this package's model classes installed, SIGTERM checkpoints"
        + (" and --reward_funcs exact_answer." if kind == "grpo" else "."),
    )
    describe_negations(parser)
    return parser


def read_script_args(kind: str, argv: list[str]):
    """Parse, as ``train``'s ``read_train_args`` does: argv and its ``--config`` recipes (files, or the names of
    recipes shipped in ``trainer/recipes/``) -> a ``TrainRequest`` (an argparse namespace of every field, the recipes'
    ``env:`` keys, whether ``--bf16`` was on the command line). An unknown flag is a usage error (one line)."""
    return read_request(list(argv), script_parser(kind))


def run_script(kind: str, argv: list[str] | None = None) -> int:
    """``llava-normaligned KIND``: parse and check (bad input: one line, exit code 2), then TRL's script with the
    norm tracked (module docstring). Returns the exit code."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        request = read_script_args(kind, argv)  # parse
        keep_notices_of(request.recipe_keys)  # the recipes' own settings' notices are the user's
        setup_environment(request.environment, request.namespace)  # the recipes' env: keys; before the devices
        script_args, training_args, model_args, dataset_args = build_script_args(kind, request)
        check_script_inputs(kind, script_args, training_args, model_args, dataset_args)
        rewards = reward_functions(script_args.reward_funcs) if kind == "grpo" else None
        if kind == "grpo" and script_args.reward_model_name_or_path:
            rewards.insert(0, script_args.reward_model_name_or_path)
        dataset = load_script_dataset(script_args, dataset_args, TRAINERS[kind][1],
                                      evaluates=training_args.eval_strategy != "no")  # its columns are input too
    except (BadInput, ValueError, FileNotFoundError) as err:
        return fail(kind, err)
    arguments_accepted()
    register_local_model()

    norm, sigterm = NormTrackingCallback(), SigtermCheckpoint()
    sigterm.hold_back(norm)
    main_process = int(os.environ.get("RANK", "0")) == 0
    trainer = None
    try:
        with removed_unless_kept(training_args.output_dir,
                                 keep=lambda folder: not main_process or bool(earlier_run(folder))) as output, \
                sigterm.handling(), DiskFull.caught(training_args.output_dir, main_process):
            trainer = build_trainer(kind, script_args, training_args, model_args, dataset, rewards, [norm, sigterm])
            train_and_save(kind, trainer, script_args, sigterm)
    except KeyboardInterrupt:
        return fail(kind, stopped_message(output, "interrupted (Ctrl-C)"), code=INTERRUPTED)
    except Terminated as stopped:
        return fail(kind, stopped_message(output, "terminated (SIGTERM)", stopped.checkpoint), code=TERMINATED)
    except DiskFull as full:
        return fail(kind, disk_full_message(output, full), code=1)
    if trainer.is_world_process_zero():
        history = [e for e in trainer.state.log_history if "norm/vision_text_ratio" in e]
        ratio = history[-1]["norm/vision_text_ratio"] if history else float("nan")
        loss = next((e["train_loss"] for e in reversed(trainer.state.log_history) if "train_loss" in e), float("nan"))
        print(f"{kind} done: {training_args.output_dir} (train_loss {loss:.4f}, vision/text norm ratio at the end "
              f"{ratio:.3g})")
    return 0


__all__ = ["read_script_args", "run_script", "script_parser"]
