"""The options commands share, each defined once as a field of a config dataclass (``parsers.option``): how a
command line says which model to load (the ``*_option`` factories of the "loading" group, read back by
``loading.LoadOptions.from_args``), whether to run a checkpoint's code (``trust_remote_code_option``), a ``--dtype``
(``dtype_argument``) and the projector norm's options (``NormOptions``, read back by
``norm_variant.NormVariant.from_args``; ``norm_variant.variant_field`` is train's dataclass field for the same
options). Their help texts are the core's, beside the values they describe (``loading``, ``norm_variant``), so that
``train``'s dataclass fields say the same.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

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

from .parsers import option

LOADING = "loading"  # the --help section of the loading options
NORM_GROUP = "projector norm (the paper's ablation, Tables 4-5)"


def dtype_argument(name: str) -> str | None:
    """``parse_dtype`` as an argparse ``type`` (its message, as a usage error; no torch import while parsing, so the
    value stays the accepted name until ``parse_dtype`` is called on it)."""
    if name != "auto" and name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(
            f"dtype: unknown value {name!r}; expected 'auto' or one of {sorted(DTYPE_NAMES)}"
        )
    return None if name == "auto" else name


def trust_remote_code_option(group: str | None = None):
    """``--trust-remote-code`` (opt in) and ``--no-trust-remote-code`` (refuse without asking); neither: None,
    transformers' own resolution (installed classes first, which covers this package's model and stock LLaVA). The one
    definition of the pair: every command that loads a model or its parts has it."""
    return option("--trust-remote-code", default=TRUST_REMOTE_CODE_DEFAULT, group=group, one_of="trust_remote_code",
                  action="store_const", const=True, help=TRUST_REMOTE_CODE_HELP,
                  also=((("--no-trust-remote-code",),
                         {"action": "store_const", "const": False, "help": NO_TRUST_REMOTE_CODE_HELP}),))


def revision_option(model: str = "MODEL"):
    """``--revision`` of ``model`` (how the command's help names it), in the loading section."""
    return option("--revision", default=None, group=LOADING,
                  help=f"branch, tag or commit of {model} on the Hub (default: main)")


def device_option():
    """``--device``: auto (the first GPU found, else the CPU) or a device name."""
    return option("--device", default=DEVICE_DEFAULT, group=LOADING,
                  help="auto (default: the first GPU found, else cpu), cpu, cuda, cuda:N, mps or xpu")


def dtype_option(default: str | None = DTYPE_DEFAULT, said: str | None = None):
    """``--dtype`` of a command that loads a model: ``default`` its default, ``said`` how its help states it
    (``loading.dtype_help``)."""
    return option("--dtype", default=default, group=LOADING, help=dtype_help(said))


def quantization_option():
    """``--load-in-4bit`` / ``--load-in-8bit``: one ``quantization`` field, ``4bit``, ``8bit`` or None."""
    return option("--load-in-4bit", default=None, group=LOADING, one_of="quantization", action="store_const",
                  const="4bit",
                  help="NF4 + double quantization of the LLM's linear layers (bitsandbytes; default: full precision)",
                  also=((("--load-in-8bit",), {"action": "store_const", "const": "8bit",
                                              "help": "LLM.int8 of the LLM's linear layers (bitsandbytes)"}),))


def attn_implementation_option():
    """``--attn-implementation``: transformers' attention choice by default."""
    return option("--attn-implementation", default=None, group=LOADING,
                  help="e.g. sdpa, eager, flash_attention_2 (default: transformers' choice)")


@dataclass(frozen=True, kw_only=True)
class LoadingOptions:
    """The whole loading group, for a command that loads one model as every command does (``generate``, ``chat``);
    a command with another ``--dtype`` default redefines that field (it keeps its place)."""

    revision: str | None = revision_option()
    device: str = device_option()
    dtype: str | None = dtype_option()
    trust_remote_code: bool | None = trust_remote_code_option(LOADING)
    quantization: str | None = quantization_option()
    attn_implementation: str | None = attn_implementation_option()


@dataclass(frozen=True, kw_only=True)
class NormOptions:
    """``--projector-norm``, ``--norm-init``, ``--no-gradient-compensation`` and ``--gradient-compensation-min``,
    each defaulting to the paper's method (``compose``, ``convert``, ``align``)."""

    projector_norm: str = option(
        "--projector-norm", default=DEFAULT.projector_norm, group=NORM_GROUP, choices=NORM_CHOICES["projector_norm"],
        help=f"{NORM_OPTION_HELP['projector_norm']} (default: {DEFAULT.projector_norm})")
    norm_init: str = option(
        "--norm-init", default=DEFAULT.norm_init, group=NORM_GROUP, choices=NORM_CHOICES["norm_init"],
        help=f"{NORM_OPTION_HELP['norm_init']} (default: {DEFAULT.norm_init})")
    gradient_compensation: bool = option(
        "--no-gradient-compensation", default=True, group=NORM_GROUP, action="store_false",
        help=f"turn {NORM_OPTION_HELP['gradient_compensation']} off")
    gradient_compensation_min: float = option(
        "--gradient-compensation-min", default=DEFAULT.gradient_compensation_min, group=NORM_GROUP, type=float,
        help=f"{NORM_OPTION_HELP['gradient_compensation_min']} (default: {DEFAULT.gradient_compensation_min:g})")


__all__ = ["LOADING", "NORM_GROUP", "LoadingOptions", "NormOptions", "attn_implementation_option", "device_option",
           "dtype_argument", "dtype_option", "quantization_option", "revision_option", "trust_remote_code_option"]
