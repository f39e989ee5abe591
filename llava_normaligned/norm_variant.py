"""The projector norm's four options, parsed once: which norm (``projector_norm``), its initial gain (``norm_init``),
and Global Weight Compensation (``gradient_compensation``, ``gradient_compensation_min``); the paper's ablation
(Tables 4-5).

``NormVariant`` holds the four, validated, as ``LlavaNormAlignedConfig`` spells them (``projector_norm`` None for the
"w/o Norm" row; the command line's ``"none"`` is read as None). It is built from a command's flags
(``NormVariant.from_args``), from a config (``from_config``) or from a mapping (``from_dict``), and gives the config's
keyword arguments (``config_kwargs``: all four, as the config stores them) and what describes it (``in_force``,
``describe``, ``report``: without a norm, only that; its init and GWC are then inert). The flags are
``llava_normaligned.flags``': ``add_norm_flags`` for ``compose``, ``convert`` and ``align`` (argparse),
``variant_field`` for ``train``'s fields (each unset unless given: a stage starts from the model as it is). Standard
library only, so ``--help`` imports neither torch nor transformers.

The model file (pushed to the Hub, torch and transformers only) checks the same values in its config and builds the
norm from them (``LlavaNormAlignedProjector.reset_norm``); ``tests/test_norm_variant.py`` holds the two to the
same choices and defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

NORM_FIELDS = ("projector_norm", "norm_init", "gradient_compensation", "gradient_compensation_min")
PROJECTOR_NORMS = ("layernorm", None)  # as the config spells them; on the command line None is "none"
NORM_INITS = ("target", "default")
NO_NORM = "none"  # the command line's spelling of projector_norm None


@dataclass(frozen=True)
class NormVariant:
    """The projector norm's options, validated (a ``ValueError`` names the option). Defaults: the paper's method
    (LayerNorm, gain T/sqrt(D), GWC clamped at 1e-3), as ``LlavaNormAlignedConfig``'s."""

    projector_norm: str | None = "layernorm"
    norm_init: str = "target"
    gradient_compensation: bool = True
    gradient_compensation_min: float = 1e-3

    def __post_init__(self):
        if self.projector_norm == NO_NORM:
            object.__setattr__(self, "projector_norm", None)
        if self.projector_norm not in PROJECTOR_NORMS:
            raise ValueError(f"projector_norm must be 'layernorm' or '{NO_NORM}' (None), got {self.projector_norm!r}")
        if self.norm_init not in NORM_INITS:
            raise ValueError(f"norm_init must be one of {', '.join(map(repr, NORM_INITS))}, got {self.norm_init!r}")
        if not isinstance(self.gradient_compensation, bool):
            raise ValueError(  # noqa: TRY004 (a bad option value: every command reports a ValueError as bad input)
                f"gradient_compensation must be True or False, got {self.gradient_compensation!r}")
        low = self.gradient_compensation_min
        if isinstance(low, bool) or not isinstance(low, (int, float)) or not (low > 0 and math.isfinite(low)):
            raise ValueError(f"gradient_compensation_min must be a positive finite number, got {low!r}")
        object.__setattr__(self, "gradient_compensation_min", float(low))

    @classmethod
    def from_dict(cls, values: Mapping, base: NormVariant | None = None) -> NormVariant:
        """``base`` (default: the defaults) with the options ``values`` gives; any other key is an error."""
        unknown = sorted(set(values) - set(NORM_FIELDS))
        if unknown:
            raise ValueError(f"not a projector-norm option: {', '.join(unknown)} "
                             f"(the options: {', '.join(NORM_FIELDS)})")
        return dataclasses.replace(base or cls(), **values)

    @classmethod
    def from_config(cls, config) -> NormVariant:
        """The options of a ``LlavaNormAlignedConfig``, of a stock VLM's config ``align`` wrote (its norm is always
        a LayerNorm: ``norm_connector`` names where), or of either's ``config.json`` (a dict)."""
        read = config.get if isinstance(config, Mapping) else lambda key: getattr(config, key, None)
        if read("projector_norm") is None and read("norm_init") is None:  # no norm field at all: not this model's
            kind = read("model_type") or type(config).__name__
            raise ValueError(f"a {kind} config has no projector-norm options: not a norm-aligned LLaVA")
        values = {key: read(key) for key in NORM_FIELDS if key == "projector_norm" or read(key) is not None}
        if read("norm_connector") is not None:  # an aligned stock VLM
            values["projector_norm"] = "layernorm"
        # projector_norm None is the "w/o Norm" row; another option missing (an older config.json): the default
        return cls(**values)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NormVariant:
        """The options of a parser ``add_norm_flags`` built (``compose``, ``convert``)."""
        return cls(**{key: getattr(args, key) for key in NORM_FIELDS})

    @classmethod
    def given(cls, values) -> dict:
        """The options ``values`` (an object or a mapping holding the four, None where not given: ``train``'s fields)
        sets, parsed and validated, as the config spells them (``{"projector_norm": None}`` for ``"none"``)."""
        read = values.get if isinstance(values, Mapping) else lambda key: getattr(values, key, None)
        given = {key: read(key) for key in NORM_FIELDS if read(key) is not None}
        parsed = cls.from_dict(given)
        return {key: getattr(parsed, key) for key in given}

    def config_kwargs(self) -> dict:
        """The four as ``LlavaNormAlignedConfig``'s keyword arguments."""
        return {key: getattr(self, key) for key in NORM_FIELDS}

    def changes_from(self, other: NormVariant) -> dict:
        """The options whose value here differs from ``other``'s (this variant's values)."""
        return {key: getattr(self, key) for key in NORM_FIELDS if getattr(self, key) != getattr(other, key)}

    def in_force(self) -> dict:
        """The options that shape the model, as the config spells them: all four with a norm; without one
        (``projector_norm`` None) only that one. The init and GWC configure a norm the model does not have: its
        config still stores them (every field must have a valid value), inert, as what a norm turned on later starts
        from (a stage-1 variant). What describes a variant (``describe``, ``report``) says only these."""
        if self.projector_norm is None:
            return {"projector_norm": None}
        return self.config_kwargs()

    def describe(self) -> str:
        """One phrase for logs and errors: ``none (w/o Norm)`` or ``layernorm, target init, with GWC``."""
        if self.projector_norm is None:
            return f"{NO_NORM} (w/o Norm)"
        gwc = f"with GWC (clamp {self.gradient_compensation_min:g})" if self.gradient_compensation else "without GWC"
        return f"{self.projector_norm}, {self.norm_init} init, {gwc}"

    def report(self) -> str:
        """The options in force as ``key=value`` words, for the line a command prints about the model it wrote:
        ``projector_norm=none (w/o Norm)``, or ``projector_norm=layernorm norm_init=target GWC=True (clamp 0.001)``
        (``GWC=False`` without it). Nothing of an init or GWC for a model without a norm (``in_force``)."""
        if self.projector_norm is None:
            return f"projector_norm={NO_NORM} (w/o Norm)"
        gwc = f"True (clamp {self.gradient_compensation_min:g})" if self.gradient_compensation else "False"
        return f"projector_norm={self.projector_norm} norm_init={self.norm_init} GWC={gwc}"


DEFAULT = NormVariant()  # the paper's method; the flags' defaults (llava_normaligned.flags.add_norm_flags)


__all__ = ["DEFAULT", "NORM_FIELDS", "NormVariant"]
