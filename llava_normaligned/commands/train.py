"""``llava-normaligned train``: one LLaVA-1.5 stage with TRL's ``SFTTrainer`` (``llava_normaligned.trainer.train``).

    llava-normaligned train --stage 1 --model ./llava-na-3b --data-path blip_laion_cc_sbu_558k.json \\
        --image-folder ./images --output-dir ./stage1 [--config recipe.yaml] [any SFTConfig flag]

The flags are the fields of three dataclasses: this package's ``trainer.arguments.StageArguments``, TRL's
``SFTConfig`` and ``ModelConfig``, parsed by TRL's ``TrlParser`` (``make_parser``), so every ``SFTConfig`` flag and
``--config`` recipe works as in ``trl sft``. They are read once into a ``TrainConfig`` (``parse_train_args``: parse,
set the recipes' environment, validate and derive); ``prepare_run`` then ``run_stage`` do the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys

from trl import TrlParser

from llava_normaligned.compat import move_to_group, parser_actions
from llava_normaligned.loading import (
    DTYPE_NAMES,
    NO_TRUST_REMOTE_CODE_HELP,
    TRUST_REMOTE_CODE_DEFAULT,
    TRUST_REMOTE_CODE_HELP,
    dtype_help,
)
from llava_normaligned.notices import keep_notices_of
from llava_normaligned.trainer.arguments import (
    DATACLASSES,
    StageArguments,
    TrainConfig,
    TrainRequest,
    build_train_config,
    check_train_inputs,
    earlier_run,
    resolve_config,
    setup_environment,
)
from llava_normaligned.trainer.callbacks import SigtermCheckpoint, Terminated
from llava_normaligned.trainer.data import DataError
from llava_normaligned.trainer.masking import TemplateError
from llava_normaligned.trainer.sampling import GROUPED_STRATEGIES
from llava_normaligned.trainer.train import merge_if_asked, prepare_run, refuse_jit_checkpoint, run_stage

from .shared import INTERRUPTED, TERMINATED, CommandParser, arguments_accepted, fail, removed_unless_kept
from .shared.stops import DiskFull, disk_full_message, stopped_message
from .shared.trl_parsers import HelpFormatter, describe_negations, read_request

logger = logging.getLogger(__name__)


class TrainParser(CommandParser, TrlParser):
    """Every command's parser and TRL's at once: every StageArguments, SFTConfig and ModelConfig field a flag, one-line
    usage errors, ``--config`` files or shipped recipes with their ``env:`` keys."""


def make_parser() -> TrlParser:
    parser = TrainParser(
        DATACLASSES,
        resolve_config=resolve_config,
        config_environment=True,
        formatter_class=HelpFormatter,
        prog="llava-normaligned train",
        usage="llava-normaligned train --stage {1,2} (--model DIR | --vision-model ID --text-model ID) "
        "(--data-path JSON --image-folder DIR | --dataset-name ID) --output-dir DIR [--config RECIPE] [options]",
        description="Train LLaVA-1.5 stage 1 or 2 of a norm-aligned (or stock) LLaVA with TRL's SFTTrainer. Every "
        "SFTConfig and ModelConfig flag is accepted; --config RECIPE.yaml (repeatable) sets defaults.",
    )
    _group_own_flags_first(parser)
    _add_sampling_strategies(parser)
    _load_flags_as_everywhere(parser)
    describe_negations(parser)
    return parser


TRAIN_DTYPE_DEFAULT = "float32"  # TRL's: fp32 master weights; --bf16/--fp16 autocast gives the speed


def _load_flags_as_everywhere(parser) -> None:
    """``--trust_remote_code`` and ``--dtype`` (TRL's fields) with the meaning they have in every command
    (``shared/flags.py``): trust unset is transformers' own resolution (None), False refuses
    (also ``--no-trust-remote-code``), True opts in; ``--dtype`` takes the same names, ``auto`` as stored. Its default
    stays TRL's float32: the optimizer keeps fp32 master weights, whatever the checkpoint stores."""
    parser.set_defaults(trust_remote_code=TRUST_REMOTE_CODE_DEFAULT)
    actions = {action.dest: action for action in parser_actions(parser)}
    actions["trust_remote_code"].help = TRUST_REMOTE_CODE_HELP
    dtype = actions["dtype"]
    dtype.choices = ["auto", *DTYPE_NAMES]
    dtype.help = dtype_help(f"{TRAIN_DTYPE_DEFAULT} (fp32 master weights; --bf16/--fp16 autocast)")
    parser.add_argument("--no_trust_remote_code", "--no-trust-remote-code", dest="trust_remote_code",
                        action="store_const", const=False, default=argparse.SUPPRESS, help=NO_TRUST_REMOTE_CODE_HELP)


def _add_sampling_strategies(parser) -> None:
    """``--train_sampling_strategy`` takes this package's length groupings too (``sampling.GROUPED_STRATEGIES``,
    ``group_by_length`` included, which transformers also names)."""
    action = next(a for a in parser_actions(parser) if a.dest == "train_sampling_strategy")
    action.choices = list(dict.fromkeys([*action.choices, *GROUPED_STRATEGIES]))
    action.help = ("order of the training rows: 'random' (default), 'sequential', 'group_by_length' (rows of similar "
                   "length share a batch) or 'group_by_modality_length' (LLaVA-1.5's stage 2: image and text-only rows "
                   "in separate steps, similar lengths within a batch); the two groupings use the prepared token "
                   "counts and are exact on resume. Also: transformers' 'batch_rebalance'")


def _group_own_flags_first(parser) -> None:
    """``--help`` lists this package's flags (``StageArguments``) first, in their own group, then TRL's and
    transformers' (HfArgumentParser puts every dataclass's flags in one "options" group)."""
    own = {f.name for f in dataclasses.fields(StageArguments)}
    group = parser.add_argument_group("llava-normaligned: model, data, stage and variant")
    options = move_to_group(parser, group, own)  # HfArgumentParser's one "options" group, which they came from
    options.title = "TRL SFTConfig and ModelConfig (transformers TrainingArguments)"


def read_train_args(argv: list[str] | None = None) -> TrainRequest:
    """Parse: argv (and the ``--config`` recipes it names) -> a ``TrainRequest``. Nothing is checked, derived or
    set here but what argparse itself refuses."""
    return read_request(list(sys.argv[1:] if argv is None else argv), make_parser())


def parse_train_args(argv: list[str] | None = None) -> TrainConfig:
    """argv -> the run's ``TrainConfig``: ``read_train_args``, ``setup_environment`` (the recipes' ``env:`` keys),
    ``build_train_config``; the three steps ``train`` takes, in its order."""
    request = read_train_args(argv)
    setup_environment(request.environment)
    return build_train_config(request)


def main(argv: list[str] | None = None) -> int:
    """``llava-normaligned train``: parse and check every argument, load, prepare (errors up to here are bad input:
    one line, exit code 2), then train one stage and save (errors there are raised with their traceback). When the
    run fails or is stopped (Ctrl-C: one line, exit code 130; SIGTERM before training's loop: one line, exit code
    143) before it saved anything, the output folder is removed if this run created it. SIGTERM once training runs:
    a checkpoint at the end of the optimizer step, no final model, one line naming the checkpoint to resume from,
    exit code 143 (``callbacks.SigtermCheckpoint``). A full disk: the incomplete checkpoint removed, one line naming
    the last complete one and the ``--resume_from_checkpoint`` to use, exit code 1. Returns the exit code."""
    # INFO until the arguments say otherwise: the environment set-up and what is derived (CPU float32, the global
    # batch) are shown
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    bad_input = (DataError, TemplateError, FileNotFoundError, ValueError)
    try:
        request = read_train_args(argv)  # parse
        keep_notices_of(request.recipe_keys)  # the recipes' own settings' notices are the user's
        setup_environment(request.environment, request.namespace)  # the recipes' env: keys; DeepSpeed on CPUs
        config = build_train_config(request)  # validate, derive: once; only read from here on
        refuse_jit_checkpoint(config.sft_args)
        check_train_inputs(config.stage_args, config.sft_args, config.model_args)
    except bad_input as err:
        return fail("train", err)
    arguments_accepted()  # what the libraries said meanwhile is shown from here on
    stage_args, sft_args = config.stage_args, config.sft_args
    # one process removes what a failed or stopped run left (a folder it created, holding no checkpoint)
    main_process = int(os.environ.get("RANK", "0")) == 0
    prepared = None
    # SIGTERM (a scheduler's preemption): before training's loop as Ctrl-C, in it a checkpoint at the step's end; the
    # previous handler is back once training and its saving are over
    sigterm = SigtermCheckpoint()
    try:
        with removed_unless_kept(sft_args.output_dir,
                                 keep=lambda folder: not main_process or bool(earlier_run(folder))) as output, \
                sigterm.handling(), DiskFull.caught(sft_args.output_dir, main_process):
            prepared, processor = prepare_run(config, argv=sys.argv[1:] if argv is None else argv, callbacks=[sigterm])
            result = run_stage(prepared)
            merge_if_asked(result, config, processor)
    except bad_input as err:
        if prepared is not None:  # an error while training is no bad input: raised with its traceback
            raise
        logger.debug("train failed", exc_info=True)
        if isinstance(err, DataError):
            err = err.as_flags()  # names --on-bad-row / --on-bad-image, not the keywords
        return fail("train", err, details=True)  # a data or template error lists the rows at fault
    except KeyboardInterrupt:
        return fail("train", stopped_message(output, "interrupted (Ctrl-C)"), code=INTERRUPTED)
    except Terminated as stopped:
        return fail("train", stopped_message(output, "terminated (SIGTERM)", stopped.checkpoint), code=TERMINATED)
    except DiskFull as full:
        return fail("train", disk_full_message(output, full), code=1)
    if sigterm.requested:  # after the last step's end: the run finished and saved as usual
        logger.warning("SIGTERM arrived after the last optimizer step: the run finished and saved its final model")
    if result.trainer.is_world_process_zero():
        end = result.norm_tracking[-1] if result.norm_tracking else {}
        print(f"stage {stage_args.stage} done: {result.output_dir} (train_loss "
              f"{result.metrics.get('train_loss', float('nan')):.4f}, vision/text norm ratio at the end "
              f"{end.get('vision_text_ratio', float('nan')):.3g})")
    return 0


__all__ = ["TRAIN_DTYPE_DEFAULT", "main", "make_parser", "parse_train_args", "read_train_args"]
