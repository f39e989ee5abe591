"""Settings of a diagnostics run, in one dataclass (written into ``diagnostics.json`` as ``settings``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llava_normaligned.checks import POSITIVE_COUNT, check_numbers

# The blog's sweep of the projector-output scale (its Experiment 1).
DEFAULT_ALPHAS = (0.01, 0.03, 0.05, 0.07, 0.1, 0.3, 1.0, 3.0)


class DiagnosticsError(ValueError):
    """Bad input to the diagnostics (a model it cannot probe, an empty image folder, a prompt too long...)."""


# the counts of a run (``--max-samples``, ...), checked by the command line before anything runs and by the config
NUMBERS = {"max_samples": POSITIVE_COUNT, "max_new_tokens": POSITIVE_COUNT, "top_k": POSITIVE_COUNT,
           "batch_size": POSITIVE_COUNT}


@dataclass
class DiagnoseConfig:
    """What to probe and how.

    Inputs:
        model: Hub id or folder of the model to diagnose (a norm-aligned or a stock LLaVA-family checkpoint).
        baseline: an optional second model run on the same inputs and drawn on the same figures.
        images: a folder of image files (default: the package's synthetic scenes).
        prompts: a text file, one prompt per line (default: the package's prompts).
        max_samples: how many (image, prompt) pairs to run (see ``inputs.pair_samples`` for the order).

    Measurement:
        alphas: the scales of the projector output swept in the blog's Experiment 1; 1.0 is always added, since it
            is the reference every other scale is compared to.
        max_new_tokens: greedy tokens generated per sample; the sweep scores every one of these positions.
        top_k: how many of the largest text-embedding rows to list (paper Tables 7-8).
        batch_size: samples per forward pass.

    Loading:
        device, dtype, revision, baseline_revision, trust_remote_code: passed to ``load_model``. ``device="auto"``
            (default) is the first GPU found, else the CPU, as for ``generate`` and ``eval``; ``trust_remote_code=None``
            (default) is transformers' own resolution, which loads this package's models and stock LLaVA with the
            installed classes; ``True`` runs a checkpoint's own code.
    """

    model: str
    output_dir: str
    baseline: str | None = None
    images: str | None = None
    prompts: str | None = None
    max_samples: int = 12
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    max_new_tokens: int = 8
    top_k: int = 10
    batch_size: int = 4
    device: str | None = "auto"
    dtype: str | None = None
    revision: str | None = None
    baseline_revision: str | None = None
    trust_remote_code: bool | None = None
    plots: bool = True
    progress: bool = True

    def __post_init__(self):
        check_numbers(self, NUMBERS, error=DiagnosticsError)
        alphas = tuple(float(a) for a in self.alphas)
        bad = [a for a in alphas if not a > 0 or a == float("inf")]
        if bad:
            raise DiagnosticsError(f"--alphas must be positive finite numbers, got {bad}")
        self.alphas = tuple(sorted(set(alphas) | {1.0}))

    def to_dict(self) -> dict:
        return asdict(self)
