"""The multi-process engines (``trainer/accelerate_configs/``) on a machine without GPUs: FSDP2 and DeepSpeed ZeRO.

On GPUs, ``accelerate launch --config_file fsdp.yaml`` (or ``deepspeed_zero{2,3}.yaml``) needs nothing from this
file. Without one, accelerate 1.x quietly falls back to DDP, for two reasons:

* ``use_cpu=True`` (which ``train`` sets when there is no GPU) makes accelerate's state ``MULTI_CPU``, and its
  ``AcceleratorState`` takes the FSDP plugin only for GPU-like device types, and the DeepSpeed one only when
  ``cpu`` is off. An FSDP2 config then trains as DDP over gloo with unsharded parameters.
* with ``use_cpu=False`` and no ``ddp_backend``, accelerate finds no backend for a CPU and runs each process alone.

torch's FSDP2 (``fully_shard``) runs on CPU tensors over gloo, and DeepSpeed has a CPU accelerator that talks gloo,
so both can run for real:

* DeepSpeed: ``cpu_engine_settings`` keeps ``use_cpu`` off and sets ``ddp_backend="gloo"`` (the DeepSpeed CPU
  accelerator initialises the process group itself). DeepSpeed's torch backend also JIT-compiles a shared-memory
  all-reduce op when it starts on the CPU (minutes with a C++ compiler, once per machine), which only its
  tensor-parallel layers call; ``skip_unused_shm_allreduce`` marks it unavailable for a run without tensor
  parallelism, and DeepSpeed's ZeRO collectives go through torch.distributed (gloo) as they would anyway.
* FSDP2: ``take_fsdp_on_cpu`` gives the state of a ``MULTI_CPU`` run the FSDP plugin that the launcher's
  ``FSDP_*`` variables describe, before the model is prepared, so accelerate's own FSDP2 path (``fully_shard`` per
  decoder / encoder layer, full state dict on save) shards it.
"""

from __future__ import annotations

import logging
import os

from llava_normaligned.compat import deepspeed_op_off, no_split_modules, record_distributed_type

logger = logging.getLogger(__name__)


CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with bf16 matmul instructions


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``); empty where that file is not there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` says."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16). Without either, torch emulates
    it: a bf16 backward's input gradient ran at 0.27 GFLOP/s on an AVX2-only CPU (float32: ~100)."""
    return any(flag in cpu_flags() for flag in CPU_BF16_FLAGS)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot (Linux ``/proc/stat``), or None."""
    try:
        with open("/proc/stat", encoding="utf-8") as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user time
    return total - idle, total


def busy_cores(window: float = 0.25) -> float | None:
    """How many cores other processes keep busy, sampled over ``window`` seconds; None where ``/proc/stat`` is not
    there."""
    import time

    before = _cpu_times()
    if before is None:
        return None
    time.sleep(window)
    after = _cpu_times()
    total = after[1] - before[1]
    if total <= 0:
        return None
    return (after[0] - before[0]) / total * (os.cpu_count() or 1)


def cpu_training_threads() -> tuple[int, str] | None:
    """The torch threads for training on this CPU, and why; None when ``OMP_NUM_THREADS`` already says.

    torch takes one thread per core, and its OpenMP threads wait for each other by spinning: when another process
    holds a core, a step waits on a thread that is not running (``benchmarks/bench_threads.py``: 3.5x slower with a
    busy process beside it, and 20-60x with OMP_WAIT_POLICY=ACTIVE, while one thread was as fast as alone). So: one
    thread per core that no other process is using (sampled for a quarter of a second), at least one."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = busy_cores()
    if busy is None:
        return None
    free = max(1, min(cores, int(cores - busy + 0.5)))
    if free == cores:
        return cores, f"{cores} threads: no other process is using these {cores} cores"
    return free, (f"{free} thread(s): other processes keep {busy:.1f} of the {cores} cores busy, and torch's threads "
                  "slow down many times when one of them has no core to run on")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def launched_engine() -> str | None:
    """``"deepspeed"``, ``"fsdp"`` or ``None``: what ``accelerate launch --config_file ...`` asked for."""
    if _env_flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if _env_flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    return None


CPU_DEEPSPEED_SETTINGS = {"use_cpu": False, "bf16": False, "fp16": False, "ddp_backend": "gloo"}


def cpu_engine_settings(namespace) -> dict | None:
    """On a machine without GPUs, what a DeepSpeed launch needs to run on the CPU (``use_cpu`` off,
    ``ddp_backend="gloo"``, float32), as SFTConfig fields to build the config with; None without a DeepSpeed launch.
    ``namespace`` (the parsed SFTConfig fields) is only read."""
    if launched_engine() != "deepspeed":
        return None
    if any(getattr(namespace, key) != value for key, value in CPU_DEEPSPEED_SETTINGS.items()
           if not (key == "ddp_backend" and getattr(namespace, key) is None)):
        logger.info("no GPU found: DeepSpeed on its CPU accelerator over gloo in float32 (use_cpu=False, "
                    "ddp_backend=gloo, bf16/fp16 off)")
    return dict(CPU_DEEPSPEED_SETTINGS)


def prepare_cpu_engine(namespace) -> bool:
    """The process-wide part of a DeepSpeed launch on the CPU (``skip_unused_shm_allreduce``), for the step that
    sets up the process (``arguments.setup_environment``), not the one that builds the settings. Returns whether
    the op was turned off."""
    if launched_engine() != "deepspeed":
        return False
    return skip_unused_shm_allreduce(namespace)


# DeepSpeed's name for its CPU shared-memory all-reduce op (``ShareMemCommBuilder``)
SHM_ALLREDUCE_OP = "deepspeed_shm_comm"


def _deepspeed_config(namespace) -> dict:
    """The DeepSpeed config this run was given as a JSON file or dict (``--deepspeed``, or accelerate's
    ``deepspeed_config_file``); ``{}`` when the launcher's ``deepspeed_config`` fields describe it, as in the
    shipped configs, or when the file cannot be read (DeepSpeed reports that itself)."""
    source = getattr(namespace, "deepspeed", None) or os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if isinstance(source, dict):
        return source
    if isinstance(source, str) and os.path.isfile(source):
        import json

        try:
            with open(source) as handle:
                loaded = json.load(handle)
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


def skip_unused_shm_allreduce(namespace) -> bool:
    """Keep DeepSpeed's CPU torch backend from compiling its shared-memory all-reduce op for a run that never calls
    it. Returns whether it was skipped.

    ``TorchBackend.__init__`` (``deepspeed.comm.torch``) builds the op when ``deepspeed.ops.__compatible_ops__``
    says it can (a C++ JIT compile: 2 to 5 minutes on a 2-core machine, cached per machine afterwards), and
    without it uses torch.distributed. Only ``inference_all_reduce`` calls the op, i.e. the AutoTP layers of a run
    with ``tensor_parallel.autotp_size`` > 1 in its DeepSpeed config: there it is kept. ZeRO's all-reduce, reduce-
    scatter and all-gather go through torch.distributed in either case, so a ZeRO run computes the same thing.
    Call in each process before DeepSpeed's process group starts (before the ``SFTConfig`` is made)."""
    tensor_parallel = _deepspeed_config(namespace).get("tensor_parallel") or {}
    size = tensor_parallel.get("autotp_size") if isinstance(tensor_parallel, dict) else None
    if size is not None and str(size) not in ("0", "1"):  # AutoTP asked for ("auto" or a size): keep the op
        return False
    try:
        import deepspeed.ops  # noqa: F401
    except ImportError:  # accelerate says what is missing when it starts DeepSpeed
        return False
    if deepspeed_op_off(SHM_ALLREDUCE_OP):  # probed once per process; DeepSpeed reads what compat sets
        logger.info("DeepSpeed on the CPU without tensor parallelism: its shared-memory all-reduce op (called only "
                    "by tensor-parallel layers) is not compiled; collectives go through gloo")
    return True


def take_fsdp_on_cpu(accelerator) -> bool:
    """Make a ``MULTI_CPU`` accelerator launched with an FSDP config use FSDP (see the module docstring).

    Called right after the Trainer creates its ``Accelerator`` and before anything is prepared. Returns whether
    it switched; a GPU run, or a run not launched with FSDP, is left as it is.
    """
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if launched_engine() != "fsdp" or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    if getattr(state, "fsdp_plugin", None) is not None:
        return False
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables (the config file)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    # Every later ``AcceleratorState()`` copies ``PartialState``'s fields over its own (accelerate does that in
    # ``AcceleratorState.__init__``), which put ``MULTI_CPU`` back after ``prepare``: ``accelerator.is_fsdp2`` was then
    # False, and ``load_fsdp_model`` returned on rank 1 without entering rank 0's ``broadcast_from_rank0`` (resume
    # hung). accelerate's own FSDP set-up records the type in ``PartialState`` too.
    record_distributed_type(DistributedType.FSDP)
    logger.info("FSDP%d on the CPU over gloo (%d processes): parameters are sharded", plugin.fsdp_version,
                state.num_processes)
    return True





def fit_fsdp_wrap_classes(plugin, model) -> list[str] | None:
    """Keep, of the FSDP config's ``fsdp_transformer_layer_cls_to_wrap``, the classes this model has.

    One config serves Llama, Qwen2, SigLIP and CLIP parts, but accelerate refuses a listed class the model lacks
    ("Could not find the transformer layer class Qwen2DecoderLayer in the model"). Without a list, accelerate falls
    back to ``_no_split_modules``, which for a LLaVA also names classes a vision-only tower lacks
    (``SiglipTextEmbeddings``), so the same filter applies. Returns the classes kept (``None``: not a
    transformer-based wrap policy); a list of which none is in the model is a ``ValueError``.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    policy = plugin.auto_wrap_policy
    if not (policy == transformer_auto_wrap_policy or str(policy).upper() == "TRANSFORMER_BASED_WRAP"):
        return None
    wanted = plugin.transformer_cls_names_to_wrap
    if wanted is None:
        wanted = no_split_modules(model)
    present = {type(module).__name__ for module in model.modules()}
    kept = [name for name in wanted if name in present]
    if not kept:
        raise ValueError(f"FSDP: none of the layer classes to wrap ({', '.join(wanted)}) is in the model; set "
                         f"fsdp_transformer_layer_cls_to_wrap to its decoder / encoder layer classes")
    dropped = [name for name in wanted if name not in present]
    if dropped:
        logger.info("FSDP: wrapping %s (not in this model: %s)", ", ".join(kept), ", ".join(dropped))
    plugin.transformer_cls_names_to_wrap = kept
    return kept


def optimizer_keeps_tensors(model, optimizer) -> bool:
    """Whether ``optimizer`` keeps per-parameter tensors (AdamW's moments; SGD without momentum keeps none), as torch's
    distributed checkpoint sees it (its state is initialised first, as loading does). Local: no collective.

    torch's full-state-dict optimizer load under FSDP2 (``set_optimizer_state_dict``, which accelerate's
    ``load_fsdp_optimizer`` calls) fails on every rank for an optimizer without such tensors ("Expected device to be
    set"): there is nothing to load then but the scheduler."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))["state"]
    return any(hasattr(value, "dim") and value.dim() > 0 for per_param in state.values() for value in per_param.values())


def remove_wrapper_sources(model, folder: str) -> list[str]:
    """Delete from ``folder`` the source files ``save_pretrained`` copied from an engine's wrapper class.

    FSDP2 swaps the model's class for a subclass defined in torch's ``_fully_shard`` module; the remote-code copy
    (``register_for_auto_class``) then copies that module and its relative imports (``_fsdp_*.py``) beside this
    package's modeling files. Returns the names removed."""
    import sys

    module = sys.modules.get(type(model).__module__)
    source = getattr(module, "__file__", None)
    if not source or type(model).__module__.startswith(("modeling_llava_normaligned", "transformers")):
        return []
    theirs = set(os.listdir(os.path.dirname(source)))
    removed = [name for name in os.listdir(folder) if name.endswith(".py") and name in theirs]
    for name in removed:
        os.remove(os.path.join(folder, name))
    return removed


def engine_summary(trainer) -> dict:
    """What ran the training: accelerate's distributed type, the process count, DeepSpeed's ZeRO stage, and how
    many parameter tensors are sharded (FSDP2: ``DTensor``; ZeRO-3: partitioned, ``ds_numel`` elements in all) with
    the elements this process holds against the model's total. Local: no collective."""
    accelerator = trainer.accelerator
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    model = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
    sharded = tensors = local = total = 0
    for param in model.parameters():
        tensors += 1
        if hasattr(param, "full_tensor"):  # FSDP2 DTensor
            sharded += 1
            local += param.to_local().numel()
            total += param.numel()
        elif hasattr(param, "ds_numel"):  # DeepSpeed ZeRO-3 partition
            sharded += 1
            local += param.ds_tensor.numel() if getattr(param, "ds_tensor", None) is not None else 0
            total += param.ds_numel
        else:
            local += param.numel()
            total += param.numel()
    return {
        "distributed_type": "FSDP" if getattr(accelerator.state, "fsdp_plugin", None) is not None
        else str(accelerator.distributed_type).split(".")[-1],
        "num_processes": accelerator.num_processes,
        "zero_stage": plugin.zero_stage if plugin is not None else None,
        "fsdp_version": getattr(getattr(accelerator.state, "fsdp_plugin", None), "fsdp_version", None),
        "sharded_parameter_tensors": sharded,
        "parameter_tensors": tensors,
        "parameter_elements_here": local,
        "parameter_elements": total,
    }
__all__ = ["CPU_DEEPSPEED_SETTINGS", "cpu_engine_settings", "prepare_cpu_engine", "engine_summary", "fit_fsdp_wrap_classes", "launched_engine",
           "optimizer_keeps_tensors", "remove_wrapper_sources", "skip_unused_shm_allreduce", "take_fsdp_on_cpu"]
