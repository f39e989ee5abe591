"""Two-stage training of norm-aligned LLaVA models with TRL; DPO, GRPO and KTO through TRL's own trainers.

Public names, imported on first use (``import llava_normaligned.trainer`` alone loads neither torch nor TRL):
``NormTrackingCallback`` (any transformers / TRL trainer: ``callbacks=[NormTrackingCallback()]``), ``exact_answer``
(a GRPO reward function), ``prompt_rows``, ``preference_rows``, ``kto_rows`` (LLaVA JSON rows as TRL's datasets).
"""

import importlib

_PUBLIC = {
    "NormTrackingCallback": "callbacks",
    "exact_answer": "rewards",
    "prompt_rows": "rl_data",
    "preference_rows": "rl_data",
    "kto_rows": "rl_data",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NormTrackingCallback", "exact_answer", "kto_rows", "preference_rows", "prompt_rows"]
