"""The projector norm's four options, parsed once: which norm (`projector_norm`), its initial gain (`norm_init`), and
Global Weight Compensation (`gradient_compensation`, `gradient_compensation_min`); the paper's ablation (Tables 4-5).

`NormVariant` holds the four, validated, as `LlavaNormAlignedConfig` spells them (`projector_norm` None for the
"w/o Norm" row; the command line's `"none"` is read as None). It is built from a command's flags, a config or a
mapping, and gives the config's keyword arguments and the text that describes it. Standard library only, so `--help`
imports neither torch nor transformers. The model file checks the same values in its config
(`LlavaNormAlignedProjector.reset_norm`); `tests/test_norm_variant.py` holds the two to the same choices and defaults.
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
    """The projector norm's options, validated (a `ValueError` names the option). The defaults are the paper's method,
    as `LlavaNormAlignedConfig`'s.

    Args:
        projector_norm (`str` or `None`, *optional*, defaults to `"layernorm"`):
            `"layernorm"`, or `None` (also given as `"none"`) for the "w/o Norm" row.
        norm_init (`str`, *optional*, defaults to `"target"`):
            `"target"` (gain T / sqrt(D)) or `"default"` (gain 1).
        gradient_compensation (`bool`, *optional*, defaults to `True`):
            Whether GWC is on.
        gradient_compensation_min (`float`, *optional*, defaults to 1e-3):
            The GWC clamp, a positive finite number (stored as a float).
    """

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
        """Builds a variant from `base` and the options a mapping gives.

        Args:
            values (`Mapping`):
                Option name -> value; only the four option names are allowed.
            base (`NormVariant`, *optional*):
                The variant to start from; defaults to the defaults.

        Returns:
            `NormVariant`: `base` with the given options replaced.

        Raises:
            `ValueError`: For a key that is not an option, or an invalid value.
        """
        unknown = sorted(set(values) - set(NORM_FIELDS))
        if unknown:
            raise ValueError(f"not a projector-norm option: {', '.join(unknown)} "
                             f"(the options: {', '.join(NORM_FIELDS)})")
        return dataclasses.replace(base or cls(), **values)

    @classmethod
    def from_config(cls, config) -> NormVariant:
        """Reads the options of a norm-aligned model's config.

        Options the config lacks (an older `config.json`) take their defaults; `projector_norm` None is the "w/o Norm"
        row.

        Args:
            config (`LlavaNormAlignedConfig`, an aligned stock VLM's config, or either's `config.json` as a `Mapping`):
                The config. An aligned stock VLM's config (it has `norm_connector`) always gets
                `projector_norm="layernorm"`.

        Returns:
            `NormVariant`: The options.

        Raises:
            `ValueError`: If the config has neither `projector_norm` nor `norm_init` (it is not a norm-aligned model's),
            or holds an invalid value.
        """
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
        """Reads the norm options of a command's parsed options (`commands/shared/flags.NormOptions`: `compose`,
        `convert`, `align`).

        Args:
            args (`argparse.Namespace`):
                The parsed flags; all four options are read.

        Returns:
            `NormVariant`: The options.

        Raises:
            `ValueError`: For an invalid value.
        """
        return cls(**{key: getattr(args, key) for key in NORM_FIELDS})

    @classmethod
    def given(cls, values) -> dict:
        """Parses the options that are set, as `train`'s fields hold them (each `None` unless given).

        Args:
            values (`object` or `Mapping`):
                Holds the four options, `None` where not given.

        Returns:
            `dict`: The options that are not `None`, parsed and validated, as the config spells them
            (`{"projector_norm": None}` for `"none"`).

        Raises:
            `ValueError`: For an invalid value.
        """
        read = values.get if isinstance(values, Mapping) else lambda key: getattr(values, key, None)
        given = {key: read(key) for key in NORM_FIELDS if read(key) is not None}
        parsed = cls.from_dict(given)
        return {key: getattr(parsed, key) for key in given}

    def config_kwargs(self) -> dict:
        """Returns the four options as `LlavaNormAlignedConfig`'s keyword arguments.

        Returns:
            `dict`: `projector_norm`, `norm_init`, `gradient_compensation` and `gradient_compensation_min`.
        """
        return {key: getattr(self, key) for key in NORM_FIELDS}

    def changes_from(self, other: NormVariant) -> dict:
        """Lists the options whose value differs from another variant's.

        Args:
            other (`NormVariant`):
                The variant to compare with.

        Returns:
            `dict`: The differing options, with this variant's values.
        """
        return {key: getattr(self, key) for key in NORM_FIELDS if getattr(self, key) != getattr(other, key)}

    def in_force(self) -> dict:
        """Returns the options that shape the model, as the config spells them.

        Without a norm (`projector_norm` None) the init and GWC configure nothing: the config still stores them (every
        field must hold a valid value) as what a norm turned on later starts from, but what describes a variant
        (`describe`, `report`) leaves them out.

        Returns:
            `dict`: All four options with a norm; only `{"projector_norm": None}` without one.
        """
        if self.projector_norm is None:
            return {"projector_norm": None}
        return self.config_kwargs()

    def describe(self) -> str:
        """Describes the variant in one phrase, for logs and errors.

        Returns:
            `str`: E.g. `"none (w/o Norm)"`, `"layernorm, target init, with GWC (clamp 0.001)"` or
            `"layernorm, default init, without GWC"`.
        """
        if self.projector_norm is None:
            return f"{NO_NORM} (w/o Norm)"
        gwc = f"with GWC (clamp {self.gradient_compensation_min:g})" if self.gradient_compensation else "without GWC"
        return f"{self.projector_norm}, {self.norm_init} init, {gwc}"

    def report(self) -> str:
        """Describes the options in force as `key=value` words, for the line a command prints about the model it wrote.

        Returns:
            `str`: `"projector_norm=none (w/o Norm)"`, or e.g. `"projector_norm=layernorm norm_init=target GWC=True
            (clamp 0.001)"` (`GWC=False` without GWC).
        """
        if self.projector_norm is None:
            return f"projector_norm={NO_NORM} (w/o Norm)"
        gwc = f"True (clamp {self.gradient_compensation_min:g})" if self.gradient_compensation else "False"
        return f"projector_norm={self.projector_norm} norm_init={self.norm_init} GWC={gwc}"


DEFAULT = NormVariant()  # the paper's method; the flags' defaults (commands/shared/flags.NormOptions)

# What each option does, as every command's --help and train's fields say it.
NORM_OPTION_HELP = {
    "projector_norm": "'layernorm', or 'none' for exactly stock LLaVA (paper: w/o Norm)",
    "norm_init": "'target': gain T/sqrt(D) (paper §5.1); 'default': gain 1 (paper Table 5)",
    "gradient_compensation": "Global Weight Compensation (GWC, paper §5.1)",
    "gradient_compensation_min": "the GWC clamp: gradients are scaled by 1 / clamp(mean |gain|, this)",
}
NORM_CHOICES = {"projector_norm": ["layernorm", NO_NORM], "norm_init": list(NORM_INITS)}


def variant_field(key: str):
    """``train``'s field for option ``key``: unset (None) unless given, and then applied before stage 1
    (``StageArguments.variant``)."""
    metadata = {"help": f"stage 1 variant: {NORM_OPTION_HELP[key]}"
                + (" on/off" if key == "gradient_compensation" else "") + "; default: as the model is"}
    if key in NORM_CHOICES:
        metadata["choices"] = NORM_CHOICES[key]
    return dataclasses.field(default=None, metadata=metadata)


__all__ = ["DEFAULT", "NORM_CHOICES", "NORM_FIELDS", "NORM_OPTION_HELP", "NormVariant", "variant_field"]
