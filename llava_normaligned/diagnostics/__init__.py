"""Norm-discrepancy diagnostics (paper §4, Appendix C; the blog post's experiments)."""
