"""The flags commands share, each defined once: how a command line says which model to load (``add_load_flags``,
read back by ``loading.LoadOptions.from_args``), whether to run a checkpoint's code (``add_trust_remote_code_flags``),
a ``--dtype`` (``dtype_argument``) and the projector norm's options (``add_norm_flags``, read back by
``norm_variant.NormVariant.from_args``; ``norm_variant.variant_field`` is train's dataclass field for the same
options). Their help texts are the core's, beside the values they describe (``loading``, ``norm_variant``), so that
``train``'s dataclass fields say the same.
"""

from __future__ import annotations

import argparse

from llava_normaligned.loading import (
    DEVICE_DEFAULT,
    DTYPE_DEFAULT,
    DTYPE_NAMES,
    NO_TRUST_REMOTE_CODE_HELP,
    TRUST_REMOTE_CODE_DEFAULT,
    TRUST_REMOTE_CODE_HELP,
    dtype_help,
)
from llava_normaligned.norm_variant import DEFAULT, NORM_CHOICES, NORM_OPTION_HELP


def dtype_argument(name: str) -> str | None:
    """``parse_dtype`` as an argparse ``type`` (its message, as a usage error; no torch import while parsing, so the
    value stays the accepted name until ``parse_dtype`` is called on it)."""
    if name != "auto" and name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(
            f"dtype: unknown value {name!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}"
        )
    return None if name == "auto" else name


def add_trust_remote_code_flags(parser) -> None:
    """``--trust-remote-code`` (opt in) and ``--no-trust-remote-code`` (refuse without asking); neither: None,
    transformers' own resolution (installed classes first, which covers this package's model and stock LLaVA). The one
    definition of the pair: ``add_load_flags`` adds it, and ``compose``/``convert``, which load parts, not a model."""
    trust = parser.add_mutually_exclusive_group()
    trust.add_argument("--trust-remote-code", dest="trust_remote_code", action="store_const", const=True,
                       default=TRUST_REMOTE_CODE_DEFAULT, help=TRUST_REMOTE_CODE_HELP)
    trust.add_argument("--no-trust-remote-code", dest="trust_remote_code", action="store_const", const=False,
                       help=NO_TRUST_REMOTE_CODE_HELP)


def add_load_flags(parser, *, quantization: bool = True, attn_implementation: bool = True,
                   model: str = "MODEL", dtype_default: str | None = DTYPE_DEFAULT, dtype_said: str | None = None):
    """The one set of loading flags of every command that loads a model (``generate``, ``diagnose``, ``eval``), in a
    "loading" group, which is returned (a command adds its own loading flags to it); ``LoadOptions.from_args``
    reads them. ``--revision``, ``--device`` (default auto), ``--dtype`` (default auto: as stored),
    ``--trust-remote-code`` / ``--no-trust-remote-code`` (neither: transformers' own resolution), and unless turned
    off here ``--load-in-4bit`` / ``--load-in-8bit`` and ``--attn-implementation``. ``dtype_default``: a command's own
    ``--dtype`` default, and ``dtype_said`` how its help states it (``dtype_help``)."""
    group = parser.add_argument_group("loading")
    group.add_argument("--revision", default=None,
                       help=f"branch, tag or commit of {model} on the Hub (default: main)")
    group.add_argument("--device", default=DEVICE_DEFAULT,
                       help="auto (default: the first GPU found, else cpu), cpu, cuda, cuda:N, mps or xpu")
    group.add_argument("--dtype", default=dtype_default, help=dtype_help(dtype_said))
    add_trust_remote_code_flags(group)
    if quantization:
        quant = group.add_mutually_exclusive_group()
        quant.add_argument("--load-in-4bit", dest="quantization", action="store_const", const="4bit", default=None,
                           help="NF4 + double quantization of the LLM's linear layers (bitsandbytes; default: full "
                           "precision)")
        quant.add_argument("--load-in-8bit", dest="quantization", action="store_const", const="8bit",
                           help="LLM.int8 of the LLM's linear layers (bitsandbytes)")
    if attn_implementation:
        group.add_argument("--attn-implementation", default=None,
                           help="e.g. sdpa, eager, flash_attention_2 (default: transformers' choice)")
    return group


GROUP_TITLE = "projector norm (the paper's ablation, Tables 4-5)"


def add_norm_flags(parser: argparse.ArgumentParser):
    """``--projector-norm``, ``--norm-init``, ``--no-gradient-compensation`` and ``--gradient-compensation-min``, in
    their own group, each defaulting to the paper's method; read them back with ``NormVariant.from_args``."""
    group = parser.add_argument_group(GROUP_TITLE)
    for key in ("projector_norm", "norm_init"):
        group.add_argument("--" + key.replace("_", "-"), choices=NORM_CHOICES[key], default=getattr(DEFAULT, key),
                           help=f"{NORM_OPTION_HELP[key]} (default: {getattr(DEFAULT, key)})")
    group.add_argument("--no-gradient-compensation", dest="gradient_compensation", action="store_false",
                       help=f"turn {NORM_OPTION_HELP['gradient_compensation']} off")
    group.add_argument("--gradient-compensation-min", type=float, default=DEFAULT.gradient_compensation_min,
                       help=f"{NORM_OPTION_HELP['gradient_compensation_min']} "
                       f"(default: {DEFAULT.gradient_compensation_min:g})")
    return group


__all__ = ["add_load_flags", "add_norm_flags", "add_trust_remote_code_flags", "dtype_argument"]
