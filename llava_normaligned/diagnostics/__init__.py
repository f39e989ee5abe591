"""Norm-discrepancy diagnostics (paper §4, Appendix C; the blog post's experiments).

    llava-normaligned diagnose MODEL [--baseline MODEL] [--images DIR] [--prompts FILE] --output-dir DIR

(``llava_normaligned.commands.diagnose``) or, from Python, ``diagnose(DiagnoseConfig(model=..., output_dir=...))``.
See docs/diagnostics.md.
"""

from .config import DEFAULT_ALPHAS, DiagnoseConfig, DiagnosticsError


def diagnose(config: DiagnoseConfig):
    """Run every probe and write the outputs; returns (document, written paths). Imports torch on first use."""
    from .runner import diagnose as run

    return run(config)


__all__ = ["DEFAULT_ALPHAS", "DiagnoseConfig", "DiagnosticsError", "diagnose"]
