"""Evaluation on the paper's benchmarks (Table 4)."""
