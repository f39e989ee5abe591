"""Load a checkpoint: the one loader behind train, generate, eval, diagnose and the model card.

    model, processor = load_model("./llava-na-3b")                       # full precision, eval mode
    model, processor = load_model("org/name", quantization="4bit")       # the LLM in NF4, checked
    model, processor = load_model("./ckpt", quantization="4bit", for_training=True)   # QLoRA's base

Quantization (4-bit NF4 with double quantization, the QLoRA recipe, or LLM.int8) applies to the language model's
linear layers only. The vision tower, the projector with its norm and `lm_head` stay in floating point: every image
token passes through the first two, which are a small share of the model, and the norm's gain T / sqrt(D) (paper §5.1)
stays exact. The module tree is checked after loading, and a model that is not quantized as asked is never returned.
Training differs from inference in the 4-bit compute dtype (the run's dtype, fp32 by default, since the adapters'
gradients flow through the dequantized matmul), in placement (the Trainer places a full-precision model) and in mode
(left to the Trainer, no adapter merge). A name that is neither a local folder nor a Hub repo fails before anything is
downloaded (`check_source`). `TRUST_REMOTE_CODE_DEFAULT` (None) is transformers' own resolution, which loads this
package's model and stock LLaVA with the installed classes and runs no code from the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from .families.anatomy import LLAVA, anatomy_of, family_of

if TYPE_CHECKING:  # torch is imported by the functions that need it: `--help` and argument checks run without it
    import torch
    from torch import nn

logger = logging.getLogger(__name__)

TRUST_REMOTE_CODE_DEFAULT = None
DEVICE_DEFAULT = "auto"  # the flag's: the first GPU found, else the CPU (load_model's ``device=None`` is its own)
DTYPE_DEFAULT = "auto"  # as the checkpoint stores them: ``load_model``'s default (``parse_dtype`` reads it as None)

QUANTIZATION_MODES = ("4bit", "8bit")
QUANT_TYPES = ("nf4", "fp4")  # the 4-bit data types bitsandbytes has
# The LLaVA family's (stock LLaVA and this package's model): kept in floating point, by full module path, and the
# module every nn.Linear of which is quantized. Other families: ``anatomy.family_of(config)``.
KEEP_UNQUANTIZED = tuple(LLAVA.keep_unquantized())
QUANTIZED_ROOT = LLAVA.language_model
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")
BITSANDBYTES_INSTALL = "pip install 'llava-normaligned[quant]'  (or: pip install 'bitsandbytes>=0.45')"
DTYPE_NAMES = {  # accepted name -> torch dtype name
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float": "float32",
}

# The help texts of the loading options, said alike by every command's flags and train's fields.
TRUST_REMOTE_CODE_HELP = (
    "run the checkpoint's own Python code (a model whose classes are not installed; not needed for this package's "
    "models); review it first and pin --revision to a commit hash (default: neither flag, transformers' own "
    "resolution: installed classes, no checkpoint code)")
NO_TRUST_REMOTE_CODE_HELP = "refuse checkpoint code without asking"


def dtype_help(default: str | None = None) -> str:
    """The help of every ``--dtype`` that loads a model; ``default``: a command's own default, stated (``train``'s)."""
    stated = "auto (default: as the checkpoint stores them)" if default is None else \
        f"auto (as the checkpoint stores them), default: {default},"
    return f"dtype of the unquantized weights: {stated} or one of {', '.join(sorted(DTYPE_NAMES))}"



# ------------------------------------------------------------------------------------------- device and dtype


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """Parses a dtype: the one dtype parser of every command (`--dtype`) and of the Python API.

    Args:
        dtype (`torch.dtype`, `str` or `None`):
            `None` or `"auto"` (as stored), a `torch.dtype`, or one of the names in `DTYPE_NAMES` (`"float32"`,
            `"fp32"`, `"float"`, `"bfloat16"`, `"bf16"`, `"float16"`, `"fp16"`, `"half"`).

    Returns:
        `torch.dtype` or `None`: The dtype; `None` for `None` and `"auto"`.

    Raises:
        `ValueError`: For any other value.
    """
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype: unknown value {dtype!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}")
        import torch

        return getattr(torch, DTYPE_NAMES[dtype])
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    raise ValueError(f"dtype: unknown value {dtype!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}")


def _device_available(device: torch.device) -> bool:
    import torch

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
    """Picks the best available device.

    Returns:
        `torch.device`: The first available of `cuda:0`, `xpu:0` and `mps`, else `cpu`.
    """
    import torch

    for name in ("cuda", "xpu", "mps"):
        if _device_available(torch.device(name)):
            return torch.device(name, 0) if name != "mps" else torch.device(name)
    return torch.device("cpu")


def parse_device(device: str | torch.device) -> torch.device:
    """Parses a device name, without checking that this machine has the device.

    Args:
        device (`str` or `torch.device`):
            A device such as `"cpu"`, `"cuda"`, `"cuda:1"`, `"mps"` or `"xpu"` (`"auto"` is read by `resolve_device`).

    Returns:
        `torch.device`: The parsed device.

    Raises:
        `ValueError`: If torch cannot parse `device`, or its type is not one of `DEVICE_TYPES`.
    """
    import torch

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
    """Parses a device and checks that this machine has it.

    Args:
        device (`str`, `torch.device` or `None`):
            `None` or `"auto"` for the best available device (`best_device`), or a device (see `parse_device`).

    Returns:
        `torch.device`: The device; a CUDA device without an index gets the current CUDA device's index.

    Raises:
        `ValueError`: For a name that is not a device this package runs on.
        `RuntimeError`: For a device this machine does not have.
    """
    import torch

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
    """Imports bitsandbytes.

    Returns:
        `module`: The `bitsandbytes` module.

    Raises:
        `ImportError`: If bitsandbytes is not installed, or fails to import (e.g. a binary built for another CUDA); the
        message says how to install it.
    """
    from llava_normaligned.notices import quiet_known_notices

    quiet_known_notices()  # its optional-kernel notice at import (see there)
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
    """Checks that the installed bitsandbytes has a backend for `device`.

    bitsandbytes >= 0.46 lists its backends (`supported_torch_devices`); older releases are taken to run on CUDA only.

    Args:
        mode (`str`):
            `"4bit"` or `"8bit"`, named in the message.
        device (`torch.device`):
            The device the model is to be loaded onto.

    Raises:
        `RuntimeError`: If bitsandbytes does not support `device.type`.
        `ImportError`: If bitsandbytes cannot be imported (`require_bitsandbytes`).
    """
    bnb = require_bitsandbytes()
    # bitsandbytes >= 0.46 lists its backends; older releases ran on CUDA only.
    supported = set(getattr(bnb, "supported_torch_devices", {"cuda"}))
    if device.type not in supported:
        raise RuntimeError(
            f"{mode} quantization cannot run on device {str(device)!r}: bitsandbytes "
            f"{getattr(bnb, '__version__', '?')} supports {sorted(supported)}. Load in full precision (no "
            "--load-in-4bit/--load-in-8bit) or pick another device."
        )


def compute_dtype_for(device: torch.device, dtype: torch.dtype | None, training: bool = False) -> torch.dtype:
    """Picks the dtype the quantized matmuls compute in (see the module docstring for why training differs).

    Args:
        device (`torch.device`):
            The device the model runs on.
        dtype (`torch.dtype` or `None`):
            The requested dtype.
        training (`bool`, *optional*, defaults to `False`):
            Whether the model is loaded for training.

    Returns:
        `torch.dtype`: In training, `dtype`, or float32 when none is given. In inference, `dtype` when it is bfloat16 or
        float16, else bfloat16 (float16 on a CUDA GPU without bfloat16). On CPU, bitsandbytes 0.50 repacks 4-bit weights
        for its own kernel, and bfloat16 and float32 compute gave identical logits on the tiny model there, bfloat16
        being the faster (docs/inference.md).
    """
    import torch

    if training:
        return dtype or torch.float32
    if dtype in (torch.bfloat16, torch.float16):
        return dtype
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def quantization_config(
    mode: str, compute_dtype: torch.dtype | None = None, *, quant_type: str = "nf4", keep_unquantized=None
):
    """Builds the one `BitsAndBytesConfig` of a quantization mode.

    Args:
        mode (`str`):
            `"4bit"` (4-bit with double quantization) or `"8bit"` (LLM.int8).
        compute_dtype (`torch.dtype`, *optional*):
            The 4-bit compute dtype; `None` for bfloat16. Not used in 8-bit mode.
        quant_type (`str`, *optional*, defaults to `"nf4"`):
            The 4-bit data type: `"nf4"`, or `"fp4"` (training's `--bnb_4bit_quant_type`).
        keep_unquantized (`Iterable[str]`, *optional*):
            Module paths kept in floating point (`llm_int8_skip_modules`); `None` for the LLaVA family's
            `KEEP_UNQUANTIZED`.

    Returns:
        `transformers.BitsAndBytesConfig`: The config.

    Raises:
        `ValueError`: If `mode` is not `"4bit"` or `"8bit"`, or in 4-bit mode `quant_type` is not one of
            `QUANT_TYPES`.
    """
    import torch
    from transformers import BitsAndBytesConfig

    compute_dtype = compute_dtype or torch.bfloat16
    skip = list(KEEP_UNQUANTIZED if keep_unquantized is None else keep_unquantized)
    if mode == "4bit":
        if quant_type not in QUANT_TYPES:
            raise ValueError(f"quant_type: expected one of {QUANT_TYPES}, got {quant_type!r}")
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant_type,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
            llm_int8_skip_modules=skip,
        )
    if mode == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    raise ValueError(f"quantization: expected None or one of {QUANTIZATION_MODES}, got {mode!r}")


def stored_quantization(config) -> str | None:
    """Reads the bitsandbytes mode a checkpoint was saved in.

    Args:
        config (`PretrainedConfig`):
            The checkpoint's config; its `quantization_config` may be a dict or an object with `to_dict()`.

    Returns:
        `str` or `None`: `"4bit"` or `"8bit"`; `None` if the checkpoint is not quantized.

    Raises:
        `ValueError`: For another quantization method, which this loader does not verify.
    """
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
    """What `verify_quantization` found: which layers are quantized and what the kept modules hold.

    Args:
        mode (`str` or `None`):
            `"4bit"`, `"8bit"`, or `None` for full precision.
        device (`str`):
            The model's device.
        quantized_layers (`list[str]`):
            The full paths of the bitsandbytes linear layers in the language model.
        kept (`dict[str, str]`):
            Each module kept in floating point (full path) -> the dtype(s) of its parameters, joined with `/`.
        compute_dtype (`str`, *optional*):
            The quantized layers' compute dtype (`"float16 (int8 matmul)"` for 8-bit).
        footprint_bytes (`int`, *optional*, defaults to 0):
            The model's memory footprint (`get_memory_footprint()`).
    """

    mode: str | None
    device: str
    quantized_layers: list[str] = field(default_factory=list)  # full paths of the bnb Linear layers
    kept: dict[str, str] = field(default_factory=dict)  # kept path -> dtype(s) of its parameters
    compute_dtype: str | None = None
    footprint_bytes: int = 0

    def summary(self) -> str:
        """Describes the report in one line for the log.

        Returns:
            `str`: E.g. `"full precision on cpu; 12.3 MiB"`, or the mode, device, compute dtype, the number of quantized
            LLM linear layers, the kept modules with their dtypes and the footprint in MiB.
        """
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
    """Checks a loaded model's module tree against the quantization mode asked for.

    No bitsandbytes layer may sit under a module of the family's `keep_unquantized()` (the LLaVA family's for a model
    type in no family), and, when `mode` is set, every linear layer of the language model must be a bitsandbytes layer
    of that mode.

    Args:
        model (`torch.nn.Module`):
            The loaded model.
        mode (`str` or `None`):
            `"4bit"`, `"8bit"`, or `None` (only the kept modules are checked).

    Returns:
        `QuantizationReport`: What was found, with the model's memory footprint.

    Raises:
        `RuntimeError`: If a kept module is missing or holds a quantized layer, or if the language model is not
        quantized as `mode` (a plain `nn.Linear` left, a layer of the other kind, or none quantized).
        `ImportError`: If `mode` is set and bitsandbytes cannot be imported.
    """
    from torch import nn

    report = QuantizationReport(mode=mode, device=str(getattr(model, "device", "?")))
    family = family_of(getattr(model, "config", None)) or LLAVA  # a LLaVA-style model of a type not in the table
    quantized_root = family.language_model
    for path in family.keep_unquantized():
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
        llm = model.get_submodule(quantized_root)
        plain = [f"{quantized_root}.{n}" for n, m in llm.named_modules() if type(m) is nn.Linear]
        other = [
            f"{quantized_root}.{n}" for n, m in llm.named_modules() if _is_bnb_linear(m) and not isinstance(m, expected)
        ]
        report.quantized_layers = [f"{quantized_root}.{n}" for n, m in llm.named_modules() if isinstance(m, expected)]
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
    """Registers this package's model and the aligned stock models (`normaligned_<model_type>`, written by
    `align`) with the Auto classes in this process.

    Their checkpoints then load with transformers' default `trust_remote_code=None`: transformers prefers the installed
    classes and runs no code from the checkpoint.
    """
    import modeling_llava_normaligned

    modeling_llava_normaligned.register_aligned_auto_classes()


def is_commit_hash(revision: str | None) -> bool:
    """Tells whether a revision is a full commit id, the only revision that cannot move after it was reviewed
    (branches and tags can).

    Args:
        revision (`str` or `None`):
            A Hub revision.

    Returns:
        `bool`: `True` for 40 lowercase hexadecimal characters.
    """
    return bool(revision) and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def warn_unpinned_remote_code(model_name_or_path: str, revision: str | None, trust_remote_code: bool | None) -> None:
    """Warns when remote code is trusted for a Hub repo at a branch or tag.

    Whoever can push to the repo can change the code that runs here after it was reviewed. A local folder's code is on
    this machine and a commit hash cannot change, so neither is warned about. (transformers 5 prefers classes registered
    in this process, so this package's own model never runs remote code where it is installed; the warning is about what
    trusting permits.)

    Args:
        model_name_or_path (`str`):
            A local folder or a Hub repo id.
        revision (`str` or `None`):
            The Hub revision; `None` is `main`.
        trust_remote_code (`bool` or `None`):
            Only `True` is warned about.
    """
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


class SourceNotFound(FileNotFoundError):
    """A model name that is neither a local folder nor a Hub repo that can be reached: one line naming it."""


# "name" or "namespace/name": what a Hub repo id can look like; anything else can only be a local path.
REPO_ID_SHAPE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def looks_like_path(name: str) -> bool:
    """Tells whether a name can only be a local path, so that a missing folder is reported as such without
    asking the Hub.

    Args:
        name (`str`):
            A model name.

    Returns:
        `bool`: `True` for an absolute path, a name starting with `.` or `~`, one containing `..`, and any name that is
        not shaped like a Hub repo id (`REPO_ID_SHAPE`: more than one slash, a space, ...).
    """
    return os.path.isabs(name) or name.startswith((".", "~")) or ".." in name or not REPO_ID_SHAPE.match(name)


# The weight files transformers and PEFT load from a folder: model.safetensors, pytorch_model.bin, a variant
# (model.fp16.safetensors), a sharded checkpoint's index, an adapter's weights.
WEIGHT_FILE = re.compile(r"^(model|pytorch_model|adapter_model)(\.[\w-]+)?\.(safetensors|bin)(\.index\.json)?$")


def _check_model_folder(path: str, name: str, what: str) -> None:
    """A local model folder must hold a config (``config.json``, or a PEFT adapter's ``adapter_config.json``) and
    weights (``WEIGHT_FILE``); otherwise transformers fails later, with a traceback that names no flag."""
    files = set(os.listdir(path))
    if "config.json" not in files and "adapter_config.json" not in files:
        raise SourceNotFound(f"{what} {name!r}: the folder holds no config.json, so it is no model folder; give the "
                             "folder a model was saved to (save_pretrained, compose, train)")
    if not any(WEIGHT_FILE.match(file) for file in files):
        raise SourceNotFound(f"{what} {name!r}: the folder holds a config but no weights (model.safetensors, "
                             "pytorch_model.bin or a sharded index); give a complete model folder (a run that was "
                             "stopped leaves its last complete save in a checkpoint-N folder)")


def hub_offline() -> bool:
    """Tells whether nothing may be asked of the Hub.

    Returns:
        `bool`: `True` when `HF_HUB_OFFLINE` is set to `1`, `ON`, `YES` or `TRUE` (in any case).
    """
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


# DNS and a TCP connect to the Hub take well under a second where it is reachable; huggingface_hub itself retries an
# unreachable one with backoff for about 25 s per lookup before it gives up.
HUB_CONNECT_TIMEOUT = 3.0
_HUB_REACHED: set[tuple] = set()  # (host, port) reached once in this process: not asked again


def _connect(host: str, port: int, timeout: float) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:  # no DNS answer, refused, no route, timed out
        return str(error) or type(error).__name__


def hub_unreachable(timeout: float = HUB_CONNECT_TIMEOUT) -> str | None:
    """Tells why the Hub endpoint cannot be reached from here, so that a lookup that cannot happen is refused at
    once instead of after the Hub client's retries.

    The endpoint is `huggingface_hub.constants.ENDPOINT` (which honours `HF_ENDPOINT`), or the proxy the environment
    sets for it, as the Hub client would use. The probe is a DNS lookup and a TCP connect run in a daemon thread that is
    not waited for beyond `timeout` (a DNS lookup has no timeout of its own). A host and port reached once are not asked
    again in this process; one that failed is asked again next time.

    Args:
        timeout (`float`, *optional*, defaults to `HUB_CONNECT_TIMEOUT` (3.0)):
            Seconds to wait in all.

    Returns:
        `str` or `None`: The reason (the connection error, or that no answer came within `timeout`); `None` when the
        endpoint was reached, or when its URL or proxy cannot be parsed here (left to the Hub client).
    """
    from huggingface_hub import constants

    parts = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        proxies = urllib.request.getproxies()
        proxy = proxies.get(parts.scheme) or proxies.get("all")
        if proxy and host and not urllib.request.proxy_bypass(host):
            proxied = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
            host, port = proxied.hostname, proxied.port or (443 if proxied.scheme == "https" else 80)
    except ValueError:  # a port or proxy this cannot parse: the Hub client decides
        return None
    if not host:
        return None
    if (host, port) in _HUB_REACHED:
        return None
    answer: list[str | None] = []
    probe = threading.Thread(target=lambda: answer.append(_connect(host, port, timeout)), daemon=True)
    probe.start()
    probe.join(timeout)
    why = answer[0] if answer else f"no answer from {host} within {timeout:g} s"
    if why is None:
        _HUB_REACHED.add((host, port))
    return why


def _in_hub_cache(name: str, revision: str | None) -> bool:
    """The local Hub cache holds a config of ``name`` (a model's or an adapter's): transformers loads it from there
    when the Hub cannot be asked."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(name, f, revision=revision), str)
               for f in ("config.json", "adapter_config.json"))


def check_source(name: str, what: str = "model", *, revision: str | None = None, weights: bool = True) -> None:
    """Refuses, before anything is downloaded, a model name that cannot be loaded.

    This is where a name that is no local folder becomes a Hub id: every command checks its model names here first. A
    Hub id with the Hub reachable is left to the Hub (`load_config` words its answer).

    Args:
        name (`str`):
            A local folder or a Hub repo id.
        what (`str`, *optional*, defaults to `"model"`):
            What the name is, for the message (e.g. `"vision model"`).
        revision (`str`, *optional*):
            The Hub revision, for the cache lookup.
        weights (`bool`, *optional*, defaults to `True`):
            Whether a local folder must also hold weights (`WEIGHT_FILE`); it must always hold `config.json` or
            `adapter_config.json`.

    Raises:
        `SourceNotFound`: In one line naming the input and the way out: for an empty or non-string name, a file, a
        path-like name that is no folder, a folder without a config or (with `weights`) without weights, or a Hub id
        the local cache does not hold while `HF_HUB_OFFLINE` is set or the Hub cannot be reached (`hub_unreachable`).
    """
    if not isinstance(name, str) or not name:
        raise SourceNotFound(f"{what}: no model given; give a folder or a Hub repo id (namespace/name)")
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if weights:
            _check_model_folder(path, name, what)
        return
    if os.path.exists(path):
        raise SourceNotFound(f"{what} {name!r} is a file, not a model folder; give the folder that holds config.json")
    if looks_like_path(name):
        raise SourceNotFound(
            f"{what} {name!r}: no such folder ({os.path.abspath(path)}); give an existing folder or a Hub repo id "
            "(namespace/name)"
        )
    if hub_offline():
        if not _in_hub_cache(name, revision):
            raise SourceNotFound(
                f"{what} {name!r}: no such folder here, and HF_HUB_OFFLINE is set while the Hub cache holds no copy "
                "of it; give an existing folder, or unset HF_HUB_OFFLINE to download it"
            )
        return
    unreachable = hub_unreachable()  # None where the Hub can be asked: the lookup then goes ahead as before
    if unreachable is not None and not _in_hub_cache(name, revision):
        from huggingface_hub import constants

        raise SourceNotFound(
            f"{what} {name!r}: there is no local folder of that name ({os.path.abspath(path)}), and it could not be "
            f"looked up as a Hub repo id: the Hub ({constants.ENDPOINT}) cannot be reached from here ({unreachable}); "
            f"give an existing folder (a local path written as ./{name} is never looked up on the Hub), or connect "
            "to the Hub"
        )


def _not_found(model_name_or_path: str, error: OSError, what: str = "model") -> OSError:
    """A Hub lookup of a name that is no local folder failed: often a mistyped relative folder, so say both."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SourceNotFound(
        f"{what} {model_name_or_path!r}: there is no local folder of that name ({os.path.abspath(model_name_or_path)})"
        f" and it could not be loaded as a Hub repo ({first}); check the name, or log in (`hf auth login`) for a "
        "gated or private repo"
    )


def load_config(model_name_or_path: str, *, revision: str | None = None, trust_remote_code: bool | None = None):
    """Loads a checkpoint's config, with the same errors as `load_model`.

    Registers this package's model classes first (`register_local_model`) and warns about unpinned remote code
    (`warn_unpinned_remote_code`).

    Args:
        model_name_or_path (`str`):
            A local folder or a Hub repo id.
        revision (`str`, *optional*):
            The Hub revision.
        trust_remote_code (`bool`, *optional*):
            Passed to `AutoConfig.from_pretrained`; `None` is transformers' own resolution.

    Returns:
        `PretrainedConfig`: The config.

    Raises:
        `SourceNotFound`: A `FileNotFoundError`, for a name that `check_source` refuses, or one that is no local folder
        and could not be loaded as a Hub repo (the message names both).
        `OSError`: As transformers raises it, for a local folder it cannot read.
        `ValueError`: For a checkpoint that needs remote code which was not trusted (the message says how to opt in),
        and transformers' other `ValueError`s.
    """
    from transformers import AutoConfig

    check_source(model_name_or_path, revision=revision, weights=False)
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
    """Reads the `adapter_config.json` of a PEFT adapter folder or repo (what `train --use_peft` writes).

    Args:
        model_name_or_path (`str`):
            A local folder or a Hub repo id.
        revision (`str` or `None`):
            The Hub revision.

    Returns:
        `dict` or `None`: The adapter's config; `None` when there is no adapter, or the folder also holds a full
        `config.json` (it is a model, not an adapter).

    Raises:
        `ValueError`: If the adapter has no `base_model_name_or_path`.
        `SourceNotFound`: If a name that is no local folder could not be looked up as a Hub repo.
        `OSError`: As transformers raises it, for a local folder.
    """
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


def _load_adapter(options: LoadOptions, adapter: dict):
    """Load the adapter's base (quantized or not, checked) with the adapter's ``options``, then the adapter on it. In
    full precision the adapter is merged (plain model, full speed); on a 4/8-bit base it stays unmerged (QLoRA
    inference)."""
    from transformers import AutoProcessor

    try:
        from peft import PeftModel
    except ImportError as error:
        raise ImportError(
            f"{options.source!r} is a PEFT adapter; loading it needs peft: pip install 'llava-normaligned[peft]'"
        ) from error

    base = replace(options, source=adapter["base_model_name_or_path"], revision=adapter.get("revision"))
    model, base_processor, report = base.load(return_report=True)
    model = PeftModel.from_pretrained(model, options.source, revision=options.revision)
    if report.mode is None and not options.for_training:
        model = model.merge_and_unload()
    try:
        processor = AutoProcessor.from_pretrained(
            options.source, revision=options.revision, trust_remote_code=options.trust_remote_code
        )
    except (OSError, ValueError):  # an adapter saved without its processor: the base's is the same
        processor = base_processor
    logger.info("applied adapter %s to %s%s", options.source, base.source, "" if report.mode is None else " (unmerged)")
    return (model if options.for_training else model.eval()), processor, report


def _checked_load(model_name_or_path: str, model, info: dict, mode: str | None) -> QuantizationReport:
    """What a load must pass: no weight the model needs missing, parts this package can find, the quantization asked
    for. Returns the ``QuantizationReport``."""
    import torch

    _refuse_missing_weights(model_name_or_path, model, info)
    anatomy_of(model, model_name_or_path)  # a model this package cannot find its parts in is refused here
    report = verify_quantization(model, mode)
    if mode == "8bit" and model.dtype != torch.float16:
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_INT8_NOTICE_FILTER)
    logger.info("loaded %s: %s", model_name_or_path, report.summary())
    return report


def _load_kwargs(model_name_or_path: str, config, quantization, quant_type, device, dtype, for_training: bool,
                 attn_implementation) -> tuple[str | None, dict]:
    """The quantization mode a load runs in (the one asked for, else the one the checkpoint was saved in; never a
    different one) and ``from_pretrained``'s placement, dtype, quantization and attention keywords for it."""
    stored = stored_quantization(config)
    if stored is not None and quantization is not None and stored != quantization:
        raise ValueError(
            f"{model_name_or_path!r} is saved in {stored}; it cannot be loaded as {quantization}. Drop the "
            "quantization flag to load it as saved."
        )
    mode = quantization or stored
    kwargs, compute_dtype = _placement(mode, device, dtype, for_training)
    if mode is not None and stored is None:
        family = family_of(config) or LLAVA
        kwargs["quantization_config"] = quantization_config(
            mode, compute_dtype, quant_type=quant_type, keep_unquantized=family.keep_unquantized()
        )
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return mode, kwargs


def load_model(
    model_name_or_path: str,
    *,
    revision: str | None = None,
    quantization: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = DTYPE_DEFAULT,
    trust_remote_code: bool | None = TRUST_REMOTE_CODE_DEFAULT,
    attn_implementation: str | None = None,
    return_report: bool = False,
    for_training: bool = False,
    quant_type: str = "nf4",
):
    """Loads a model and its processor from a local folder or a Hub repo, checked.

    A checkpoint that lacks weights the model needs is refused, since they would be randomly initialised; only a
    norm-aligned checkpoint's projector norm may be missing (initialised to T / sqrt(D), with a warning). The model
    classes themselves load such a checkpoint as transformers does (initialised, reported): the refusal is here. A PEFT
    adapter folder or repo loads its base (`base_model_name_or_path`) with the same options, then the adapter, which is
    merged into a full-precision base unless `for_training` and left unmerged on a 4/8-bit base. Never falls back to
    full precision.

    Args:
        model_name_or_path (`str`):
            A local folder, a Hub repo id, or a PEFT adapter folder or repo.
        revision (`str`, *optional*):
            The Hub revision.
        quantization (`str`, *optional*):
            `None` (full precision), `"4bit"` (NF4 or `quant_type`, double quantization) or `"8bit"` (LLM.int8). The
            vision tower, the projector and `lm_head` stay in floating point, and the result is checked
            (`verify_quantization`). A checkpoint saved quantized loads in its own mode.
        device (`str` or `torch.device`, *optional*):
            `None`: transformers' default (the CPU) in full precision, the best available device when quantized (in
            training, this process's GPU, `LOCAL_RANK`, or the CPU). `"auto"`: the best available device. In full
            precision with `for_training`, the model is not placed (the Trainer does it).
        dtype (`torch.dtype` or `str`, *optional*, defaults to `DTYPE_DEFAULT` (`"auto"`)):
            The dtype of the unquantized weights (see `parse_dtype`). `"auto"` or `None`: as stored in full precision;
            when quantized, float32 on the CPU, elsewhere the compute dtype (`compute_dtype_for`: bfloat16, or float16
            on a GPU without bfloat16; float32 in training).
        trust_remote_code (`bool`, *optional*, defaults to `TRUST_REMOTE_CODE_DEFAULT` (`None`)):
            `None` is transformers' own resolution: this package's model and stock LLaVA load with the installed classes
            and run no code from the checkpoint. A checkpoint whose classes are not installed needs `True` (a warning
            asks to pin a commit hash for a Hub repo).
        attn_implementation (`str`, *optional*):
            Passed to `from_pretrained` when given; `None` leaves the choice to transformers.
        return_report (`bool`, *optional*, defaults to `False`):
            Whether to also return the `QuantizationReport`.
        for_training (`bool`, *optional*, defaults to `False`):
            Load for training: the model is not put in eval mode, and placement and compute dtype follow training's
            rules (see the module docstring).
        quant_type (`str`, *optional*, defaults to `"nf4"`):
            The 4-bit data type, `"nf4"` or `"fp4"`.

    Returns:
        `tuple`: `(model, processor)`, or `(model, processor, report)` with `return_report`. The model is in eval mode
        unless `for_training`; the processor is the family's (`families.processors.load_processor`: `AutoProcessor`, or
        a builder that needs no torchvision).

    Raises:
        `SourceNotFound`: A `FileNotFoundError`, for a name that is no folder and no reachable repo.
        `ValueError`: For an unknown `quantization`, `quant_type` or `dtype`, a checkpoint saved in another
        quantization mode or method, a checkpoint that lacks weights, or a model whose parts this package cannot
        find.
        `ImportError`: Without bitsandbytes (quantized) or peft (an adapter).
        `RuntimeError`: For a device this machine does not have or on which bitsandbytes cannot run the mode, or a model
        that is not quantized as asked.
    """
    if quantization is not None and quantization not in QUANTIZATION_MODES:
        raise ValueError(f"quantization: expected None or one of {QUANTIZATION_MODES}, got {quantization!r}")
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type: expected one of {QUANT_TYPES}, got {quant_type!r}")
    check_source(model_name_or_path, revision=revision)  # before the imports: a typo fails at once
    from transformers import AutoModelForImageTextToText

    from .families.processors import load_processor  # AutoProcessor, or the family's own builder

    dtype = parse_dtype(dtype)
    if quantization is not None:
        require_bitsandbytes()  # before any download
    register_local_model()
    adapter = find_adapter(model_name_or_path, revision)
    if adapter is not None:  # its base, loaded with the same options, then the adapter on it
        model, processor, report = _load_adapter(LoadOptions(
            model_name_or_path, revision=revision, quantization=quantization, quant_type=quant_type, device=device,
            dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
            for_training=for_training), adapter)
        return (model, processor, report) if return_report else (model, processor)

    hub_kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    config = load_config(model_name_or_path, **hub_kwargs)
    mode, kwargs = _load_kwargs(model_name_or_path, config, quantization, quant_type, device, dtype, for_training,
                                attn_implementation)
    model, info = AutoModelForImageTextToText.from_pretrained(
        model_name_or_path, config=config, output_loading_info=True, **hub_kwargs, **kwargs
    )
    report = _checked_load(model_name_or_path, model, info, mode)
    processor = load_processor(model_name_or_path, config, **hub_kwargs)
    if not for_training:
        model.eval()
    return (model, processor, report) if return_report else (model, processor)


def _refuse_missing_weights(source: str, model, info: dict) -> None:
    """A checkpoint that lacks weights the model needs would run with random ones: refuse it, whatever its class.

    The model classes follow transformers' conventions (a missing weight is initialised and reported, not an
    error), so this is where every command draws the line. One exception: a norm-aligned checkpoint without its
    projector norm (a stock LLaVA's weights in this model's layout), whose norm the class initialises to T/sqrt(D)
    and says so."""
    from modeling_llava_normaligned import LlavaNormAlignedConfig

    norm_path = (family_of(model.config) or LLAVA).projector_norm_path
    norm_aligned = model.config.model_type == LlavaNormAlignedConfig.model_type and norm_path is not None
    missing = sorted(
        k for k in (info.get("missing_keys") or []) if not (norm_aligned and k.startswith(norm_path + "."))
    )
    if missing:
        shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
        way_out = "re-save or re-download it whole" + (
            f" (a stock LLaVA checkpoint converts with `llava-normaligned convert --from-llava {source} "
            "--output-dir OUT`)" if norm_aligned else ""
        )
        raise ValueError(
            f"{source}: the checkpoint lacks weights the model needs ({shown}); they would be randomly "
            f"initialised, so it is refused: {way_out}"
        )


def _placement(
    mode: str | None, device, dtype: torch.dtype | None, for_training: bool = False
) -> tuple[dict, torch.dtype | None]:
    """``from_pretrained`` arguments for device and dtype, and the compute dtype of a quantized mode.

    Full precision: dtype as stored unless given; an accelerator gets a ``device_map`` so that weights go straight to
    it, not through host memory; in training nothing is placed (the Trainer does it). Quantized: bitsandbytes
    quantizes while loading onto the device, so a device is always resolved (checked against the installed
    bitsandbytes; in training this process's GPU, ``LOCAL_RANK``) and the unquantized parts get a definite dtype."""
    import torch

    kwargs: dict = {}
    if mode is None:
        if dtype is not None:
            kwargs["dtype"] = dtype
        if device is not None and not for_training:
            kwargs["device_map"] = {"": str(resolve_device(device))}
        return kwargs, None
    if for_training and device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    target = resolve_device("auto" if device is None else device)
    check_quantization_device(mode, target)
    compute = compute_dtype_for(target, dtype, training=for_training)
    kwargs["dtype"] = dtype or (torch.float32 if target.type == "cpu" else compute)
    kwargs["device_map"] = {"": str(target)}
    return kwargs, compute


# ----------------------------------------------------------------------------------------------------------- CLI


def _check_dtype_name(dtype) -> None:
    """``parse_dtype``'s check, without importing torch for a name (a torch dtype is checked when it is parsed)."""
    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype: unknown value {dtype!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}")
    if dtype is not None and not isinstance(dtype, str):
        parse_dtype(dtype)


@dataclass(frozen=True)
class LoadOptions:
    """What loading one model takes: the keywords of `load_model`, built once and then only read.

    A command builds it from its flags (`from_args`), `train` from its fields; `load()` loads it. The values are checked
    when the options are built (a `ValueError` naming the option); whether this machine has the device is checked when
    loading.

    Args:
        source (`str`):
            A local folder or a Hub repo id.
        revision (`str`, *optional*):
            A Hub branch, tag or commit.
        quantization (`str`, *optional*):
            `None`, `"4bit"` or `"8bit"`.
        quant_type (`str`, *optional*, defaults to `"nf4"`):
            `"nf4"` or `"fp4"`.
        device (`str`, *optional*):
            `None` (`load_model`'s: the CPU in full precision, the best device when quantized), `"auto"` (the best
            device) or a device.
        dtype (`str`, *optional*, defaults to `DTYPE_DEFAULT` (`"auto"`)):
            The dtype of the unquantized weights: `"auto"` (as stored) or one of `DTYPE_NAMES`.
        trust_remote_code (`bool`, *optional*, defaults to `TRUST_REMOTE_CODE_DEFAULT` (`None`)):
            `None` (transformers' own resolution), `True` (opt in) or `False` (refuse).
        attn_implementation (`str`, *optional*):
            `None` (transformers' choice) or a name.
        for_training (`bool`, *optional*, defaults to `False`):
            Load for training (see the module docstring).
    """

    source: str
    revision: str | None = None
    quantization: str | None = None
    quant_type: str = "nf4"
    device: str | None = None
    dtype: str | None = DTYPE_DEFAULT
    trust_remote_code: bool | None = TRUST_REMOTE_CODE_DEFAULT
    attn_implementation: str | None = None
    for_training: bool = False

    def __post_init__(self):
        if self.quantization is not None and self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization: expected None or one of {QUANTIZATION_MODES}, got {self.quantization!r}")
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(f"quant_type: expected one of {QUANT_TYPES}, got {self.quant_type!r}")
        if self.trust_remote_code not in (None, True, False):
            raise ValueError(f"trust_remote_code: expected None, True or False, got {self.trust_remote_code!r}")
        _check_dtype_name(self.dtype)
        if isinstance(self.device, str) and self.device != "auto":
            parse_device(self.device)  # the name only: whether this machine has it is known when loading

    @classmethod
    def from_args(cls, args: argparse.Namespace, source: str | None = None, **overrides) -> LoadOptions:
        """Builds the options from the loading options of `commands/shared/flags.py`.

        A flag the command does not have keeps its default.

        Args:
            args (`argparse.Namespace`):
                The parsed flags; read for `revision`, `quantization`, `device`, `dtype`, `trust_remote_code` and
                `attn_implementation` where present, and for `model` when `source` is not given.
            source (`str`, *optional*):
                The model to load; defaults to `args.model`.
            **overrides:
                Fields to set regardless of the flags.

        Returns:
            `LoadOptions`: The options.

        Raises:
            `checks.BadInput`: For a bad value, naming the flag (`--dtype: ...`).
        """
        from llava_normaligned.checks import BadInput

        given = {name: getattr(args, name) for name in ("revision", "quantization", "device", "dtype",
                                                          "trust_remote_code", "attn_implementation")
                 if hasattr(args, name)}
        try:
            return cls(source=args.model if source is None else source, **{**given, **overrides})
        except ValueError as error:  # "dtype: ...", "device: ...": the flag's name first
            raise BadInput(f"--{error}") from None

    def load_kwargs(self) -> dict:
        """Returns `load_model`'s keyword arguments.

        Returns:
            `dict`: Every field but `source`, by name.
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}

    def load(self, *, return_report: bool = False):
        """Loads the model: `load_model(self.source, ...)`.

        Args:
            return_report (`bool`, *optional*, defaults to `False`):
                Whether to also return the `QuantizationReport`.

        Returns:
            `tuple`: `(model, processor)`, or `(model, processor, report)` with `return_report`.
        """
        return load_model(self.source, return_report=return_report, **self.load_kwargs())


__all__ = [
    "DEVICE_DEFAULT",
    "DTYPE_DEFAULT",
    "DTYPE_NAMES",
    "KEEP_UNQUANTIZED",
    "NO_TRUST_REMOTE_CODE_HELP",
    "QUANTIZATION_MODES",
    "QUANTIZED_ROOT",
    "QUANT_TYPES",
    "TRUST_REMOTE_CODE_DEFAULT",
    "TRUST_REMOTE_CODE_HELP",
    "LoadOptions",
    "QuantizationReport",
    "SourceNotFound",
    "check_source",
    "compute_dtype_for",
    "dtype_help",
    "hub_unreachable",
    "load_config",
    "load_model",
    "looks_like_path",
    "parse_device",
    "parse_dtype",
    "quantization_config",
    "resolve_device",
    "verify_quantization",
]
