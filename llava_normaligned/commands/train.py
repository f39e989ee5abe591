"""``llava-normaligned train``: one LLaVA-1.5 stage with TRL's ``SFTTrainer`` (``llava_normaligned.trainer.train``).

    llava-normaligned train --stage 1 --model ./llava-na-3b --data-path blip_laion_cc_sbu_558k.json \\
        --image-folder ./images --output-dir ./stage1 [--config recipe.yaml] [any SFTConfig flag]

The flags are ``trainer.arguments``' (TRL's ``SFTConfig`` and ``ModelConfig`` with this package's
``StageArguments``), read once into a ``TrainConfig``; ``prepare_run`` then ``run_stage`` do the run.
"""

from __future__ import annotations

import logging
import os
import sys

from llava_normaligned.console import (
    INTERRUPTED,
    TERMINATED,
    arguments_accepted,
    fail,
    keep_notices_of,
    removed_unless_kept,
)
from llava_normaligned.trainer.arguments import (
    build_train_config,
    check_train_inputs,
    earlier_run,
    make_parser,
    read_train_args,
    setup_environment,
)
from llava_normaligned.trainer.callbacks import SigtermCheckpoint, Terminated
from llava_normaligned.trainer.data import DataError
from llava_normaligned.trainer.masking import TemplateError
from llava_normaligned.trainer.train import merge_if_asked, prepare_run, refuse_jit_checkpoint, run_stage

from .stops import DiskFull, disk_full_message, stopped_message

logger = logging.getLogger(__name__)


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


__all__ = ["main", "make_parser"]
