"""Evaluation on the paper's benchmarks (Table 4).

:func:`evaluate` (the run, ``runner.py``) takes an :class:`EvalConfig`; ``llava-normaligned eval MODEL --tasks
... --output-dir DIR`` (``llava_normaligned.commands.eval``) builds one and calls it. ``--engine lmms-eval`` runs lmms-eval instead
(``lmms_engine.py``) on this package's lmms-eval model (``lmms_plugin.py``, registered by entry point).
Task ids, Hub datasets and schemas live in :mod:`.tasks`; the Table 4 Markdown in :mod:`.results_files`
(:func:`render_markdown`, :func:`table_markdown`, for model cards). The rules have one home each, used by both
engines: :mod:`.prompts`, :mod:`.extraction`, :mod:`.scoring` (log-likelihoods: :mod:`.loglik`); see
docs/evaluation.md, "Two engines, one set of rules".
"""

from .results_files import render_markdown, table_markdown
from .runner import EvalConfig, evaluate

__all__ = ["EvalConfig", "evaluate", "render_markdown", "table_markdown"]
