"""What ``llava-normaligned dpo | grpo | kto`` run: TRL's own ``trl dpo``, ``trl grpo`` and ``trl kto`` scripts, flag
for flag, with the norm tracked. The commands are ``llava_normaligned.commands.{dpo,grpo,kto}``; their shared parser
and run (the one-line errors, the exit codes, the clean-up) are ``commands.shared.trl_script``'s; this module holds what they
build and run.

Each command parses its arguments with the dataclasses of TRL's script (``trl/scripts/{dpo,grpo,kto}.py``:
``ScriptArguments`` or ``GRPOScriptArguments``, the trainer's config, ``ModelConfig``, ``DatasetMixtureConfig``) and
``--config`` YAML as TRL does, so a ``trl dpo ...`` command line runs unchanged as ``llava-normaligned dpo ...``, and
a recipe in ``trainer/recipes/`` serves both. It then does what the script does (load the dataset, build the trainer
from ``--model_name_or_path``, train, save, push) and adds:

* ``NormTrackingCallback``: ``norm/*`` in the logs that ``--report_to`` gets, and ``norm_tracking.json`` in the
  output folder;
* the installed model classes (``loading.register_local_model``): this package's checkpoints and the folders
  ``align`` wrote load with TRL's ``--trust_remote_code False`` too, running no code from the checkpoint (TRL's own
  script needs ``--trust_remote_code True`` for them, also for DPO's reference model);
* ``--reward_funcs exact_answer`` (``rewards.REWARD_FUNCS``) besides TRL's names and dotted paths;
* no GPU: training on the CPU in float32 (``--bf16 True`` on the command line keeps bf16 autocast on a CPU with bf16
  matmul instructions), as ``train`` does;
* SIGTERM: a checkpoint at the end of the optimizer step, one line and exit code 143 (``callbacks.SigtermCheckpoint``);
  Ctrl-C: one line and exit code 130; a failed run leaves no half-written output folder it created;
* bad input (a missing model or dataset, an unknown flag or reward, a dataset without the trainer's columns) is one
  line and exit code 2, before a model is loaded.

Why commands of their own and not stages of ``train``: ``train``'s stages are the paper's SFT stages with their own
data pipeline (LLaVA JSON, answer masks, freezing per stage); these follow TRL's scripts and TRL's dataset formats
(``llava-normaligned rl-data`` writes those from LLaVA JSON; ``rl_data``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys

from llava_normaligned.checks import BadInput, check_output_folder
from llava_normaligned.loading import check_source, looks_like_path

logger = logging.getLogger(__name__)

# command -> (TRL trainer class, the columns its dataset needs)
TRAINERS = {
    "dpo": ("DPOTrainer", ("prompt", "chosen", "rejected")),
    "grpo": ("GRPOTrainer", ("prompt",)),
    "kto": ("KTOTrainer", ("prompt", "completion", "label")),
}


def trl_script(kind: str):
    """TRL's script module of ``kind`` (``trl.scripts.dpo``, ...)."""
    return importlib.import_module(f"trl.scripts.{kind}")


# ------------------------------------------------------------------------------------------------ arguments


def build_script_args(kind: str, request):
    """(script_args, training_args, model_args, dataset_args): TRL's script's dataclasses, built once from the
    request with what the machine decides (``arguments.hardware_settings``: no GPU, the CPU in float32) and the
    trainer's ``model_init_kwargs`` as TRL's script sets them from ``ModelConfig``."""
    from .arguments import hardware_settings

    namespace = request.namespace
    given = namespace.model_init_kwargs
    given = json.loads(given) if isinstance(given, str) else dict(given or {})
    init = {"revision": namespace.model_revision, "trust_remote_code": namespace.trust_remote_code,
            "attn_implementation": namespace.attn_implementation, "dtype": namespace.dtype, **given}
    values = {**vars(namespace), **hardware_settings(namespace, bf16_asked=request.bf16_asked),
              "model_init_kwargs": init}
    built = []
    for dataclass_type in trl_script(kind).make_parser().dataclass_types:
        names = {f.name for f in dataclasses.fields(dataclass_type) if f.init}
        built.append(dataclass_type(**{k: v for k, v in values.items() if k in names}))
    return tuple(built)


def reward_functions(names: list[str] | None) -> list:
    """``--reward_funcs``: this package's names (``rewards.REWARD_FUNCS``), TRL's (``trl.rewards``) and dotted paths
    (a module found from the working directory, as TRL's script allows), resolved before anything is loaded."""
    from trl import rewards as trl_rewards

    from .rewards import REWARD_FUNCS

    trl_names = {
        "accuracy_reward": trl_rewards.accuracy_reward,
        "reasoning_accuracy_reward": trl_rewards.reasoning_accuracy_reward,
        "think_format_reward": trl_rewards.think_format_reward,
        "get_soft_overlong_punishment": trl_rewards.get_soft_overlong_punishment(max_completion_len=1280,
                                                                                 soft_punish_cache=256),
    }
    known = {**trl_names, **REWARD_FUNCS}
    found = []
    for name in names or []:
        if name in known:
            found.append(known[name])
            continue
        if "." not in name:
            raise BadInput(f"--reward_funcs {name}: unknown reward; give one of {', '.join(sorted(known))} or a "
                           "dotted path (module.function)")
        module_name, function = name.rsplit(".", 1)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise BadInput(f"--reward_funcs {name}: cannot import {module_name} ({err})") from None
        if not callable(getattr(module, function, None)):
            raise BadInput(f"--reward_funcs {name}: {module_name} has no function {function}")
        found.append(getattr(module, function))
    return found


def check_script_inputs(kind: str, script_args, training_args, model_args, dataset_args) -> None:
    """What must hold before anything is loaded: a model, a dataset, a writable output folder, a reward (GRPO)."""
    if not model_args.model_name_or_path:
        raise BadInput("--model_name_or_path is required (a model folder or a Hub id)")
    check_source(model_args.model_name_or_path, revision=model_args.model_revision)
    if not script_args.dataset_name and not dataset_args.datasets:
        raise BadInput("--dataset_name is required (a dataset folder, file or Hub id; `llava-normaligned rl-data` "
                       "writes one from LLaVA JSON), or --datasets in a --config")
    name = script_args.dataset_name
    if name and looks_like_path(name) and not os.path.exists(os.path.expanduser(name)):
        raise BadInput(f"--dataset_name {name}: no such folder or file")
    check_output_folder("--output_dir", training_args.output_dir)
    if kind == "grpo" and not (script_args.reward_funcs or script_args.reward_model_name_or_path):
        raise BadInput("--reward_funcs is required (e.g. exact_answer), or --reward_model_name_or_path")


def load_script_dataset(script_args, dataset_args, needs: tuple[str, ...], evaluates: bool = False):
    """The dataset as TRL's script loads it (``--datasets`` mixture, else ``load_dataset(--dataset_name)``), its
    training split checked for the trainer's columns, and its test split there when the run ``evaluates``."""
    from datasets import load_dataset
    from trl import get_dataset

    name = script_args.dataset_name
    what = f"--dataset_name {name}" if not dataset_args.datasets else "--datasets"
    try:
        if dataset_args.datasets:
            dataset = get_dataset(dataset_args)
        else:
            dataset = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise BadInput(f"{what}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    split = script_args.dataset_train_split
    if split not in dataset:
        raise BadInput(f"{what}: no {split!r} split (it has {', '.join(dataset)}); --dataset_train_split names it")
    test = script_args.dataset_test_split
    if evaluates and test not in dataset:
        raise BadInput(f"{what}: no {test!r} split to evaluate on (it has {', '.join(dataset)}); "
                       "--dataset_test_split names it, or --eval_strategy no")
    columns = dataset[split].column_names or []
    missing = [c for c in needs if c not in columns]
    if missing:
        raise BadInput(f"{what}: the {split} split has no column {', '.join(missing)} (it has {', '.join(columns)}); "
                       "`llava-normaligned rl-data` writes such a dataset from LLaVA JSON")
    return dataset


# ----------------------------------------------------------------------------------------------------- running


def build_trainer(kind: str, script_args, training_args, model_args, dataset, reward_funcs, callbacks):
    """TRL's trainer as TRL's script builds it, with ``callbacks``."""
    import trl

    extra = {"reward_funcs": reward_funcs} if kind == "grpo" else {}
    return getattr(trl, TRAINERS[kind][0])(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=trl.get_quantization_config(model_args),
        peft_config=trl.get_peft_config(model_args),
        callbacks=callbacks,
        **extra,
    )


def train_and_save(kind, trainer, script_args, sigterm):
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from .callbacks import Terminated

    args = trainer.args
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    if sigterm.stopped_at is not None:
        trainer.accelerator.wait_for_everyone()
        raise Terminated(os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{sigterm.stopped_at}"))
    trainer.save_model(args.output_dir)
    if args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    trainer.end()  # the trackers finish, the process group goes (transformers >= 5.18)


__all__ = [
    "TRAINERS",
    "build_script_args",
    "build_trainer",
    "check_script_inputs",
    "load_script_dataset",
    "reward_functions",
    "train_and_save",
    "trl_script",
]
