"""The filters of library notices no user asked for (``KNOWN_NOTICES``): installed before a command runs, and by the
library where it imports a library that says one (bitsandbytes)."""

from __future__ import annotations

import logging
import os
import warnings


class _DropMessage(logging.Filter):
    """Drop the records whose message starts with ``start``; keep every other."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


# (logger, start of the message) of each library notice that no command's user asked for, dropped by
# ``quiet_known_notices``. A filter on the exact logger and message: every other record of that logger still shows.
KNOWN_NOTICES = (
    # bitsandbytes, at import on a CPU with AVX512-BF16: it tries the Hub's optional ``kernels`` package for a CPU
    # 4-bit kernel and, failing (not installed, or offline), says "... pip install kernels"; it then uses its own
    # kernel, which is what this package tests with.
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
    # kernels (0.19 and later, which transformers 5.25 requires), in the same attempt with HF_HUB_OFFLINE set: it
    # cannot check the Hub kernel's publisher offline and says so; the kernel is then not found, and bitsandbytes
    # uses its own
    ("kernels._internals.hf_hub", "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'"),
    # transformers, when compose adds the image token to the LM's vocabulary: compose asks for this initialisation
    # itself (``resize_token_embeddings(..., mean_resizing=True)``) and the notice says how to turn it off. Image
    # features replace the image token's input row, T leaves that row out, and this package's decoding never emits it
    # (``generation.placeholder_token_ids``).
    ("transformers.modeling_utils", "The new embeddings will be initialized from a multivariate normal"),
    ("transformers.modeling_utils", "The new lm_head weights will be initialized from a multivariate normal"),
)
# DeepSpeed, when anything imports it (accelerate does, on every ``save_pretrained``, once it is installed): with no
# GPU found it logs "Setting accelerator to CPU ..." to stdout. Kept when the command trains with DeepSpeed (the
# notice is then about the user's own engine): ``accelerate launch`` with a DeepSpeed config, ``deepspeed`` named
# in the arguments, or set by a recipe (``keep_notices_of``, called by the command that reads its ``--config`` files).
DEEPSPEED_CPU_NOTICE = ("DeepSpeed", "Setting accelerator to CPU")
_FILTERS: dict[tuple[str, str], _DropMessage] = {}


def _drop(logger_name: str, start: str) -> None:
    found = _FILTERS.setdefault((logger_name, start), _DropMessage(start))
    logger = logging.getLogger(logger_name)  # the library's own logger, made now if it is not imported yet
    if found not in logger.filters:
        logger.addFilter(found)


def quiet_known_notices(argv: list[str] | None = None) -> None:
    """Silence the notices a command's user did not cause, each by its exact source and message (``KNOWN_NOTICES``,
    ``DEEPSPEED_CPU_NOTICE``), in this process; the demo's worker processes call it too (a spawned process starts
    without them). With ``argv`` (a command's arguments):

    * DeepSpeed's "Setting accelerator to CPU" is kept when ``argv`` or the environment trains with DeepSpeed;
    * TRL's ``SFTConfig`` defaults ``gradient_checkpointing=True`` and transformers 5 warns that the name is
      deprecated (``activation_checkpointing``) for that default. Kept when ``argv`` sets the option itself: then the
      warning is about the user's own flag.

    What ``--config`` files set is not read here: the command that reads them says it (``keep_notices_of``).
    """
    for logger_name, start in KNOWN_NOTICES:
        _drop(logger_name, start)
    uses_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes") or (
        argv is not None and _named_in(argv, "deepspeed"))
    if not uses_deepspeed:
        _drop(*DEEPSPEED_CPU_NOTICE)
    if argv is not None and not _named_in(argv, "gradient_checkpointing"):
        warnings.filterwarnings("ignore", message=GRADIENT_CHECKPOINTING_WARNING, category=FutureWarning)


GRADIENT_CHECKPOINTING_WARNING = r"`gradient_checkpointing(_kwargs)?` is deprecated"


def _named_in(argv: list[str], word: str) -> bool:
    """Whether an argument of the command line names ``word`` (a flag or its value)."""
    return any(word in arg for arg in argv)


def keep_notices_of(settings) -> None:
    """The settings a command's ``--config`` files gave (their keys), said by the command that reads them: the
    notices about those settings are the user's own, and show again (DeepSpeed's CPU notice for ``deepspeed``, the
    deprecation of ``gradient_checkpointing``)."""
    settings = set(settings)
    if "deepspeed" in settings:
        found = _FILTERS.get(DEEPSPEED_CPU_NOTICE)
        if found is not None:
            logging.getLogger(DEEPSPEED_CPU_NOTICE[0]).removeFilter(found)
    if settings & {"gradient_checkpointing", "gradient_checkpointing_kwargs"}:
        # a filter put first wins over the one quiet_known_notices added
        warnings.filterwarnings("default", message=GRADIENT_CHECKPOINTING_WARNING, category=FutureWarning)


__all__ = ["DEEPSPEED_CPU_NOTICE", "GRADIENT_CHECKPOINTING_WARNING", "KNOWN_NOTICES", "keep_notices_of",
           "quiet_known_notices"]
