"""Load norm-aligned (and stock) LLaVA checkpoints for inference, in full precision or quantized, and the
``generate`` command.

    llava-normaligned generate ./llava-na-3b --image cat.png --prompt "What is in the picture?" --load-in-4bit

Quantization goes through transformers' ``BitsAndBytesConfig``: 4-bit NF4 with double quantization, or LLM.int8.
Only the language model's linear layers are quantized. The vision tower, the projector with its norm and ``lm_head``
stay in floating point: the tower and projector are the path every image token takes and a small share of a model
whose LLM dominates; the norm's gain T/sqrt(D) (paper §5.1) stays exact with them; ``lm_head`` is what transformers
keeps by default. They are named by full module path: transformers matches a skip entry from the start of the path
or as a suffix, so the bare names ``vision_tower`` / ``multi_modal_projector`` match nothing in a LLaVA, and a
custom list replaces the default one (which is where ``lm_head`` would otherwise come from). After loading, the
module tree is checked; a model that is not quantized as asked is never returned.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

logger = logging.getLogger(__name__)

QUANTIZATION_MODES = ("4bit", "8bit")
# Kept in floating point, by full module path (transformers >= 4.52 LLaVA layout; stock LLaVA uses the same paths).
KEEP_UNQUANTIZED = ("model.vision_tower", "model.multi_modal_projector", "lm_head")
# Every nn.Linear under this path is quantized.
QUANTIZED_ROOT = "model.language_model"
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")
BITSANDBYTES_INSTALL = "pip install 'llava-normaligned[quant]'  (or: pip install 'bitsandbytes>=0.45')"
DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


# ------------------------------------------------------------------------------------------- device and dtype


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``None`` / ``"auto"`` -> None (as stored); a torch dtype or one of ``DTYPE_NAMES`` -> that dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype: unknown value {dtype!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]


def _device_available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "mps":
        return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if device.type == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def best_device() -> torch.device:
    """The first available of cuda, xpu, mps, cpu."""
    for name in ("cuda", "xpu", "mps"):
        if _device_available(torch.device(name)):
            return torch.device(name, 0) if name != "mps" else torch.device(name)
    return torch.device("cpu")


def parse_device(device: str | torch.device) -> torch.device:
    """Parse a device string; ValueError for one that is not a device type this package runs on."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device: unknown device {device!r}; expected 'auto', 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu'"
        ) from None
    if parsed.type not in DEVICE_TYPES:
        raise ValueError(f"device: {device!r} is not one of the device types {DEVICE_TYPES} (or 'auto')")
    return parsed


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Parse and check a device: ``"auto"`` picks the best available one. Raises ValueError for a string that is
    not a device this package runs on, RuntimeError for a device this machine does not have."""
    if device is None or device == "auto":
        return best_device()
    parsed = parse_device(device)
    if not _device_available(parsed):
        detail = ""
        if parsed.type == "cuda":
            detail = (
                f" (torch {torch.__version__}, built with CUDA {torch.version.cuda}, sees "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s))"
            )
        raise RuntimeError(f"device {str(device)!r} was requested but is not available on this machine{detail}")
    if parsed.type == "cuda" and parsed.index is None:
        parsed = torch.device("cuda", torch.cuda.current_device())
    return parsed


# ------------------------------------------------------------------------------------------------ bitsandbytes


def require_bitsandbytes():
    """Import bitsandbytes or raise an ImportError that says how to install it."""
    try:
        import bitsandbytes
    except ImportError as error:
        raise ImportError(
            f"4-bit and 8-bit loading need bitsandbytes, which is not installed: {BITSANDBYTES_INSTALL}"
        ) from error
    except Exception as error:  # a broken install (e.g. a binary built for another CUDA) fails at import
        raise ImportError(
            f"bitsandbytes is installed but failed to import ({error}); reinstall it: {BITSANDBYTES_INSTALL}"
        ) from error
    return bitsandbytes


def check_quantization_device(mode: str, device: torch.device) -> None:
    """Raise RuntimeError when the installed bitsandbytes has no backend for ``device``."""
    bnb = require_bitsandbytes()
    # bitsandbytes >= 0.46 lists its backends; older releases ran on CUDA only.
    supported = set(getattr(bnb, "supported_torch_devices", {"cuda"}))
    if device.type not in supported:
        raise RuntimeError(
            f"{mode} quantization cannot run on device {str(device)!r}: bitsandbytes "
            f"{getattr(bnb, '__version__', '?')} supports {sorted(supported)}. Load in full precision (no "
            "--load-in-4bit/--load-in-8bit) or pick another device."
        )


def compute_dtype_for(device: torch.device, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the quantized matmuls compute in: a requested 16-bit dtype, else bf16 (fp16 on a GPU without it).

    On CPU, bitsandbytes 0.50 repacks 4-bit weights for its own kernel; bf16 and fp32 compute gave identical logits
    on the tiny model there, bf16 being the faster (docs/inference.md)."""
    if dtype in (torch.bfloat16, torch.float16):
        return dtype
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def quantization_config(mode: str, compute_dtype: torch.dtype = torch.bfloat16):
    """The ``BitsAndBytesConfig`` of a mode: 4-bit NF4 + double quantization, or LLM.int8, both keeping the
    modules of ``KEEP_UNQUANTIZED`` in floating point."""
    from transformers import BitsAndBytesConfig

    if mode == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
            llm_int8_skip_modules=list(KEEP_UNQUANTIZED),
        )
    if mode == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=list(KEEP_UNQUANTIZED))
    raise ValueError(f"quantization: expected None or one of {QUANTIZATION_MODES}, got {mode!r}")


def stored_quantization(config) -> str | None:
    """The bitsandbytes mode a checkpoint was saved in ("4bit"/"8bit"), None if it is not quantized. Raises for
    another quantization method, which this loader does not verify."""
    stored = getattr(config, "quantization_config", None)
    if stored is None:
        return None
    stored = stored if isinstance(stored, dict) else stored.to_dict()
    if stored.get("load_in_4bit"):
        return "4bit"
    if stored.get("load_in_8bit"):
        return "8bit"
    raise ValueError(
        f"checkpoint is quantized with {stored.get('quant_method', 'an unknown method')!r}; this loader serves "
        "full-precision checkpoints (quantized at load time) and bitsandbytes 4/8-bit ones"
    )


class _DropInt8CastNotice(logging.Filter):
    """bitsandbytes logs "inputs will be cast ... to float16" on EVERY int8 matmul whose input is not fp16 (each layer,
    each token); the cast is by design of LLM.int8, so the line says nothing after the first time."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will be cast from" not in record.getMessage()


_INT8_NOTICE_FILTER = _DropInt8CastNotice()


# --------------------------------------------------------------------------------------------------- the check


@dataclass
class QuantizationReport:
    """What ``verify_quantization`` found: which layers are quantized and what the kept modules hold."""

    mode: str | None
    device: str
    quantized_layers: list[str] = field(default_factory=list)  # full paths of the bnb Linear layers
    kept: dict[str, str] = field(default_factory=dict)  # kept path -> dtype(s) of its parameters
    compute_dtype: str | None = None
    footprint_bytes: int = 0

    def summary(self) -> str:
        kept = ", ".join(f"{path} ({dtype})" for path, dtype in self.kept.items())
        if self.mode is None:
            return f"full precision on {self.device}; {self.footprint_bytes / 2**20:.1f} MiB"
        return (
            f"{self.mode} on {self.device} (compute {self.compute_dtype}): {len(self.quantized_layers)} LLM linear "
            f"layers quantized; kept unquantized: {kept}; {self.footprint_bytes / 2**20:.1f} MiB"
        )


def _bnb_linear_class(mode: str):
    bnb = require_bitsandbytes()
    return bnb.nn.Linear4bit if mode == "4bit" else bnb.nn.Linear8bitLt


def _is_bnb_linear(module: nn.Module) -> bool:
    return type(module).__module__.startswith("bitsandbytes")


def verify_quantization(model: nn.Module, mode: str | None) -> QuantizationReport:
    """Walk the module tree: no bitsandbytes layer under ``KEEP_UNQUANTIZED``, and (when ``mode`` is set) every
    linear layer of the language model quantized in that mode. Raises RuntimeError otherwise."""
    report = QuantizationReport(mode=mode, device=str(getattr(model, "device", "?")))
    for path in KEEP_UNQUANTIZED:
        try:
            kept = model.get_submodule(path)
        except AttributeError:
            raise RuntimeError(
                f"{type(model).__name__} has no module {path!r}: not a LLaVA-style model, so which modules must stay "
                "unquantized is unknown"
            ) from None
        wrong = [f"{path}.{name}" if name else path for name, sub in kept.named_modules() if _is_bnb_linear(sub)]
        if wrong:
            raise RuntimeError(
                f"{len(wrong)} layer(s) under {path!r} are quantized but must stay in floating point: {wrong[:5]}"
            )
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in kept.parameters()})
        report.kept[path] = "/".join(dtypes)
    if mode is not None:
        expected = _bnb_linear_class(mode)
        llm = model.get_submodule(QUANTIZED_ROOT)
        plain = [f"{QUANTIZED_ROOT}.{n}" for n, m in llm.named_modules() if type(m) is nn.Linear]
        other = [
            f"{QUANTIZED_ROOT}.{n}" for n, m in llm.named_modules() if _is_bnb_linear(m) and not isinstance(m, expected)
        ]
        report.quantized_layers = [f"{QUANTIZED_ROOT}.{n}" for n, m in llm.named_modules() if isinstance(m, expected)]
        if plain or other or not report.quantized_layers:
            raise RuntimeError(
                f"the language model is not quantized as {mode}: {len(report.quantized_layers)} {expected.__name__} "
                f"layers, {len(plain)} plain nn.Linear left (e.g. {plain[:3]}), {len(other)} of another kind"
            )
        compute = getattr(model.get_submodule(report.quantized_layers[0]), "compute_dtype", None)
        report.compute_dtype = str(compute).removeprefix("torch.") if compute is not None else "float16 (int8 matmul)"
    report.footprint_bytes = int(model.get_memory_footprint())
    return report


# -------------------------------------------------------------------------------------------------- the loader


def register_local_model() -> None:
    """Make this package's model known to the Auto classes in this process (importing ``modeling_llava_normaligned``
    registers it), so that its checkpoints load with transformers' default ``trust_remote_code=None``: transformers
    then prefers the installed classes and runs no code from the checkpoint."""
    import modeling_llava_normaligned  # noqa: F401


def is_commit_hash(revision: str | None) -> bool:
    """A full 40-hex commit id: the only revision that cannot move after it was reviewed (branches and tags can)."""
    return bool(revision) and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def warn_unpinned_remote_code(model_name_or_path: str, revision: str | None, trust_remote_code: bool | None) -> None:
    """Warn when remote code is trusted for a Hub repo at a branch or tag: whoever can push to it can change the code
    that runs here after it was reviewed. A local folder's code is on this machine; a commit hash cannot change.
    (transformers 5 prefers classes registered in this process, so this package's own model never runs remote code
    where it is installed; the warning is about what trusting permits.)"""
    if trust_remote_code is not True or os.path.isdir(os.path.expanduser(model_name_or_path)):
        return
    if is_commit_hash(revision):
        return
    logger.warning(
        "trusting remote code of the Hub repo %r at revision %r, which can move: the repo's code, as it is when "
        "downloaded, may run in this process (transformers prefers classes installed here, such as this package's "
        "model, when the checkpoint has them). Review the code and pin a commit hash (revision=<40-hex sha>, "
        "--revision).",
        model_name_or_path,
        revision or "main",
    )


def _not_found(model_name_or_path: str, error: OSError) -> OSError:
    """A Hub lookup of a name that is no local folder failed: often a mistyped relative folder, so say both."""
    return OSError(
        f"{model_name_or_path!r}: there is no local folder of that name ({os.path.abspath(model_name_or_path)}) "
        f"and it could not be loaded as a Hub repo: {error}"
    )


def load_config(model_name_or_path: str, *, revision: str | None = None, trust_remote_code: bool | None = None):
    """The checkpoint's config, with the errors of ``load_model``: a missing folder given as a path is
    ``FileNotFoundError``; a name that is neither a local folder nor a Hub repo says both; a checkpoint that needs
    remote code which was not trusted says how to opt in."""
    if _looks_like_path(model_name_or_path) and not os.path.isdir(os.path.expanduser(model_name_or_path)):
        raise FileNotFoundError(f"model folder not found: {model_name_or_path}")
    register_local_model()
    warn_unpinned_remote_code(model_name_or_path, revision, trust_remote_code)
    try:
        return AutoConfig.from_pretrained(model_name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as error:
        if os.path.isdir(model_name_or_path):
            raise
        raise _not_found(model_name_or_path, error) from error
    except ValueError as error:
        if trust_remote_code is None and "trust_remote_code" in str(error):
            raise ValueError(
                f"{error}\nOpt in only after reviewing the code: trust_remote_code=True (CLI: --trust-remote-code), "
                "with a commit hash as the revision."
            ) from error
        raise


def find_adapter(model_name_or_path: str, revision: str | None) -> dict | None:
    """The ``adapter_config.json`` of a PEFT adapter folder or repo (what ``train --use_peft`` writes), else None.
    A folder that also holds a full ``config.json`` is a model, not an adapter."""
    from transformers.utils import find_adapter_config_file

    if os.path.isdir(model_name_or_path) and os.path.isfile(os.path.join(model_name_or_path, "config.json")):
        return None
    try:
        path = find_adapter_config_file(model_name_or_path, revision=revision)
    except OSError as error:
        if os.path.isdir(model_name_or_path):
            raise
        raise _not_found(model_name_or_path, error) from error
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        adapter = json.load(handle)
    if not adapter.get("base_model_name_or_path"):
        raise ValueError(
            f"{model_name_or_path!r} is a PEFT adapter without base_model_name_or_path: cannot find its base"
        )
    return adapter


def _load_adapter(model_name_or_path: str, adapter: dict, revision: str | None, quantization: str | None, **kwargs):
    """Load the adapter's base (quantized or not, checked), then the adapter on it. In full precision the adapter is
    merged (plain model, full speed); on a 4/8-bit base it stays unmerged (QLoRA inference)."""
    try:
        from peft import PeftModel
    except ImportError as error:
        raise ImportError(
            f"{model_name_or_path!r} is a PEFT adapter; loading it needs peft: pip install 'llava-normaligned[peft]'"
        ) from error

    base = adapter["base_model_name_or_path"]
    model, base_processor, report = load_model(
        base, revision=adapter.get("revision"), quantization=quantization, return_report=True, **kwargs
    )
    model = PeftModel.from_pretrained(model, model_name_or_path, revision=revision)
    if report.mode is None:
        model = model.merge_and_unload()
    try:
        processor = AutoProcessor.from_pretrained(
            model_name_or_path, revision=revision, trust_remote_code=kwargs.get("trust_remote_code")
        )
    except (OSError, ValueError):  # an adapter saved without its processor: the base's is the same
        processor = base_processor
    logger.info("applied adapter %s to %s%s", model_name_or_path, base, "" if report.mode is None else " (unmerged)")
    return model.eval(), processor, report


def load_model(
    model_name_or_path: str,
    *,
    revision: str | None = None,
    quantization: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool | None = None,
    attn_implementation: str | None = None,
    return_report: bool = False,
):
    """Return ``(model, processor)`` in eval mode for a local folder or a Hub repo (and ``revision``).

    ``quantization``: None (full precision), ``"4bit"`` (NF4, double quantization) or ``"8bit"`` (LLM.int8); the
    vision tower, the projector and ``lm_head`` stay in floating point and the result is checked
    (``verify_quantization``). A checkpoint saved quantized loads in its own mode.
    ``device``: None keeps transformers' default (CPU) in full precision and picks the best available device when
    quantized; ``"auto"`` picks it in both cases. ``dtype``: of the unquantized weights; default as stored in full
    precision, bf16 (fp16 on a GPU without bf16) for the quantized path on an accelerator, fp32 on CPU.
    ``return_report=True`` adds a third element, the ``QuantizationReport``. A PEFT adapter folder or repo loads its
    base (``base_model_name_or_path``) this way and applies the adapter (merged in full precision).
    ``trust_remote_code``: None (default) is transformers' own resolution: this package's model and stock LLaVA load
    with the installed classes and run no code from the checkpoint; a checkpoint whose classes are not installed
    needs ``True`` (a warning asks to pin a commit hash for a Hub repo).
    Raises ImportError without bitsandbytes, RuntimeError when the device cannot run the mode. Never falls back to
    full precision.
    """
    if quantization is not None and quantization not in QUANTIZATION_MODES:
        raise ValueError(f"quantization: expected None or one of {QUANTIZATION_MODES}, got {quantization!r}")
    if _looks_like_path(model_name_or_path) and not os.path.isdir(os.path.expanduser(model_name_or_path)):
        raise FileNotFoundError(f"model folder not found: {model_name_or_path}")
    dtype = parse_dtype(dtype)
    if quantization is not None:
        require_bitsandbytes()  # before any download
    register_local_model()
    adapter = find_adapter(model_name_or_path, revision)
    if adapter is not None:
        model, processor, report = _load_adapter(
            model_name_or_path,
            adapter,
            revision,
            quantization,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
        )
        return (model, processor, report) if return_report else (model, processor)

    hub_kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    config = load_config(model_name_or_path, **hub_kwargs)
    stored = stored_quantization(config)
    if stored is not None and quantization is not None and stored != quantization:
        raise ValueError(
            f"{model_name_or_path!r} is saved in {stored}; it cannot be loaded as {quantization}. Drop the "
            "quantization flag to load it as saved."
        )
    mode = quantization or stored
    kwargs, compute_dtype = _placement(mode, device, dtype)
    if mode is not None and stored is None:
        kwargs["quantization_config"] = quantization_config(mode, compute_dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, config=config, **hub_kwargs, **kwargs)
    report = verify_quantization(model, mode)
    if mode == "8bit" and model.dtype != torch.float16:
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_INT8_NOTICE_FILTER)
    logger.info("loaded %s: %s", model_name_or_path, report.summary())
    processor = AutoProcessor.from_pretrained(model_name_or_path, **hub_kwargs)
    if return_report:
        return model.eval(), processor, report
    return model.eval(), processor


def _looks_like_path(name: str) -> bool:
    """A name no Hub repo id can be (absolute, ./, ../, ~): a missing folder is then reported as such."""
    return os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\", "..\\"))


def _placement(mode: str | None, device, dtype: torch.dtype | None) -> tuple[dict, torch.dtype | None]:
    """``from_pretrained`` arguments for device and dtype, and the compute dtype of a quantized mode.

    Full precision: dtype as stored unless given; an accelerator gets a ``device_map`` so that weights go straight to
    it, not through host memory. Quantized: bitsandbytes quantizes while loading onto the device, so a device is
    always resolved (checked against the installed bitsandbytes) and the unquantized parts get a definite dtype."""
    kwargs: dict = {}
    if mode is None:
        if dtype is not None:
            kwargs["dtype"] = dtype
        if device is not None:
            kwargs["device_map"] = {"": str(resolve_device(device))}
        return kwargs, None
    target = resolve_device("auto" if device is None else device)
    check_quantization_device(mode, target)
    compute = compute_dtype_for(target, dtype)
    kwargs["dtype"] = dtype or (torch.float32 if target.type == "cpu" else compute)
    kwargs["device_map"] = {"": str(target)}
    return kwargs, compute


# ----------------------------------------------------------------------------------------------------------- CLI


def add_trust_remote_code_flags(parser) -> None:
    """``--trust-remote-code`` (opt in) and ``--no-trust-remote-code`` (refuse without asking); neither: None,
    transformers' own resolution (installed classes first, which covers this package's model and stock LLaVA)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--trust-remote-code",
        dest="trust_remote_code",
        action="store_const",
        const=True,
        default=None,
        help="run the checkpoint's own Python code (a model whose classes are not installed); review it first and "
        "pin --revision to a commit hash. Not needed for this package's models.",
    )
    group.add_argument(
        "--no-trust-remote-code",
        dest="trust_remote_code",
        action="store_const",
        const=False,
        help="refuse checkpoint code without asking",
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llava-normaligned generate",
        description="Answer a prompt about images (streamed), or a JSONL file of prompts in batches, with a local "
        "folder or Hub repo, in full precision or 4/8-bit (bitsandbytes).",
    )
    parser.add_argument("model", help="folder or Hub repo id of a norm-aligned (or stock) LLaVA checkpoint")
    parser.add_argument(
        "--image",
        dest="images",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATH",
        help="image file(s) for --prompt, in order (repeat the flag or list several)",
    )
    parser.add_argument("--prompt", help="the question; its images go before it in one user turn")
    parser.add_argument(
        "--prompts-file",
        metavar="JSONL",
        help='batch mode: one {"prompt": ..., "images": [paths]} per line; relative image paths are '
        "taken from the file's folder",
    )
    parser.add_argument("--output", metavar="JSONL", help="batch mode: where to write the rows with an 'answer' added")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="batch mode: replace an existing --output and discard the answers of an interrupted run (by default a "
        "rerun resumes from OUTPUT.partial)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="batch mode: prompts per forward (default 8)")
    quant = parser.add_mutually_exclusive_group()
    quant.add_argument(
        "--load-in-4bit",
        action="store_const",
        const="4bit",
        dest="quantization",
        help="NF4 + double quantization of the LLM's linear layers",
    )
    quant.add_argument(
        "--load-in-8bit",
        action="store_const",
        const="8bit",
        dest="quantization",
        help="LLM.int8 of the LLM's linear layers",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps, xpu")
    parser.add_argument("--dtype", default="auto", help=f"unquantized weights: auto or one of {sorted(DTYPE_NAMES)}")
    parser.add_argument("--revision", default=None, help="branch, tag or commit of a Hub repo")
    add_trust_remote_code_flags(parser)
    parser.add_argument("--attn-implementation", default=None, help="e.g. sdpa, eager, flash_attention_2")
    parser.add_argument("--quiet", action="store_true", help="do not print what was loaded to stderr")
    return parser


@dataclass
class PromptRow:
    """One prompt of the batch mode with its image paths (resolved) and the input row, which is written back."""

    prompt: str
    images: list[str]
    row: dict


def read_prompts_file(path: str) -> list[PromptRow]:
    """Read and check every row (prompt text, image files present and readable) before anything is loaded."""
    from .generation import check_image_path

    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f'{where}: expected an object with a "prompt" string')
            images = row.get("images", [])
            images = [images] if isinstance(images, str) else images
            if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
                raise ValueError(f'{where}: "images" must be a list of paths')
            images = [i if os.path.isabs(i) else os.path.join(base, i) for i in images]
            for image in images:
                try:
                    check_image_path(image)
                except (FileNotFoundError, ValueError) as error:
                    raise ValueError(f"{where}: {error}") from None
            rows.append(PromptRow(row["prompt"], images, row))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _check_arguments(parser: argparse.ArgumentParser, args) -> Resume | None:
    """Usage errors (exit 2) before any loading: missing or unreadable inputs, conflicting modes, bad numbers, an
    output that exists or a partial one that does not belong to this run. Batch mode: the rows and the answers so far."""
    from .generation import check_image_path

    if (args.prompt is None) == (args.prompts_file is None):
        parser.error("give either --prompt (one answer, streamed) or --prompts-file (batch mode)")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        parser.error("--max-new-tokens and --batch-size must be >= 1")
    try:
        parse_dtype(args.dtype)
        if args.device != "auto":
            parse_device(args.device)
    except ValueError as error:
        parser.error(str(error))
    if args.prompts_file is None:
        if args.output or args.overwrite:
            parser.error("--output and --overwrite are for batch mode (--prompts-file)")
        for image in args.images:
            try:
                check_image_path(image)
            except (FileNotFoundError, ValueError) as error:
                parser.error(str(error))
        return None
    if args.images:
        parser.error("--image goes with --prompt; in batch mode each row names its images")
    if not args.output:
        parser.error("--prompts-file needs --output")
    if os.path.exists(args.output) and not args.overwrite:
        parser.error(f"--output {args.output} exists; pass --overwrite to replace it")
    try:
        rows = read_prompts_file(args.prompts_file)
        return Resume.start(args, rows)
    except (OSError, ValueError) as error:
        parser.error(str(error))


# ------------------------------------------------------------------------------------------------- batch mode


def batch_settings(args) -> dict:
    """What decides the answers of a batch run; a partial output is resumed only under the same settings."""
    keys = (
        "model",
        "revision",
        "quantization",
        "dtype",
        "device",
        "attn_implementation",
        "max_new_tokens",
        "temperature",
        "system",
    )
    return {key: getattr(args, key) for key in keys}


@dataclass
class Resume:
    """The rows of a batch run and the answers already in ``<output>.partial`` from an earlier, interrupted run.

    ``<output>.partial`` holds one answered row per line, in input order; ``<output>.partial.settings.json`` the
    settings it was started with. A rerun with the same prompts and settings keeps the complete lines (a line cut by
    a crash is dropped) and answers the rest; other prompts or settings are refused unless ``--overwrite``."""

    rows: list[PromptRow]
    done: int = 0  # rows answered in the partial file
    keep_bytes: int = 0  # the partial file's length up to the last complete line

    @staticmethod
    def paths(output: str) -> tuple[str, str]:
        return output + ".partial", output + ".partial.settings.json"

    @classmethod
    def start(cls, args, rows: list[PromptRow]) -> Resume:
        partial, settings_path = cls.paths(args.output)
        if args.overwrite or not os.path.exists(partial):
            return cls(rows)
        settings = batch_settings(args)
        try:
            with open(settings_path, encoding="utf-8") as handle:
                before = json.load(handle)
        except (OSError, json.JSONDecodeError):
            raise ValueError(
                f"{partial} exists but its settings file {settings_path} is missing or unreadable: cannot tell whether "
                "it was made with these settings; pass --overwrite to start over"
            ) from None
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {old!r} then, {new!r} now" for k, (old, new) in changed.items())
            raise ValueError(
                f"{partial} was started with other settings ({detail}); rerun with the same ones to resume, or pass "
                "--overwrite to start over"
            )
        resume = cls(rows)
        with open(partial, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.endswith(b"\n"):
                    break  # cut by a crash while writing: answered again
                if number > len(rows):
                    raise ValueError(
                        f"{partial} holds more answers than {args.prompts_file} has prompts; "
                        "pass --overwrite to start over"
                    )
                resume._check_line(partial, number, line)
                resume.done, resume.keep_bytes = number, resume.keep_bytes + len(line)
        return resume

    def _check_line(self, partial: str, number: int, line: bytes) -> None:
        try:
            answered = json.loads(line)
        except json.JSONDecodeError:
            answered = None
        expected = self.rows[number - 1].row
        if (
            not isinstance(answered, dict)
            or not isinstance(answered.get("answer"), str)
            or {k: v for k, v in answered.items() if k != "answer"}
            != {k: v for k, v in expected.items() if k != "answer"}
        ):
            raise ValueError(
                f"{partial}:{number} is not the answer to row {number} of the prompts file (another prompts file?); "
                "pass --overwrite to start over"
            )


def _run_batch(model, processor, resume: Resume, args) -> None:
    """Answer the rows not yet answered, batch by batch, appending to ``<output>.partial``, renamed to ``<output>`` at
    the end: a crash leaves the answers so far, which a rerun keeps, and never a file that looks complete."""
    from .generation import generate_batch

    partial, settings_path = Resume.paths(args.output)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    rows = resume.rows
    if resume.done == 0:
        with open(settings_path, "w", encoding="utf-8") as handle:
            json.dump(batch_settings(args), handle, indent=2)
        open(partial, "wb").close()
    else:
        os.truncate(partial, resume.keep_bytes)  # drop a line cut by a crash
        if not args.quiet:
            print(f"resuming: {resume.done}/{len(rows)} answers already in {partial}", file=sys.stderr)
    with open(partial, "a", encoding="utf-8") as out:
        for start in range(resume.done, len(rows), args.batch_size):
            chunk = rows[start : start + args.batch_size]
            answers = generate_batch(
                model,
                processor,
                [r.prompt for r in chunk],
                [r.images for r in chunk],
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                temperature=args.temperature,
                system=args.system,
            )
            out.writelines(
                json.dumps({**row.row, "answer": answer}, ensure_ascii=False) + "\n"
                for row, answer in zip(chunk, answers)
            )
            out.flush()
            if not args.quiet:
                print(f"answered {min(start + args.batch_size, len(rows))}/{len(rows)}", file=sys.stderr)
    os.replace(partial, args.output)
    os.remove(settings_path)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    resume = _check_arguments(parser, args)
    try:
        model, processor, report = load_model(
            args.model,
            revision=args.revision,
            quantization=args.quantization,
            device=args.device,
            dtype=args.dtype,
            trust_remote_code=args.trust_remote_code,
            attn_implementation=args.attn_implementation,
            return_report=True,
        )
    except (ImportError, RuntimeError, ValueError, OSError) as error:
        print(f"llava-normaligned generate: error: {error}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{args.model}: {report.summary()}", file=sys.stderr)
    if resume is not None:
        _run_batch(model, processor, resume, args)
        if not args.quiet:
            print(f"wrote {len(resume.rows)} answers to {args.output}", file=sys.stderr)
        return 0
    from .generation import stream_answer

    stream_answer(
        model,
        processor,
        args.prompt,
        args.images,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        system=args.system,
    )
    return 0
