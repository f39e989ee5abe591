"""Tolerances for floating-point results that reach one value by two different computations.

Two computations of the same quantity (another kernel set: AVX-512, AVX2 or the scalar default; a fused and an
unfused op; another blocking of a matmul; a batched and an unbatched pass) differ by rounding, and that rounding is
proportional to the size of the numbers that were summed, not to the size of each result element: an element that
comes out near zero by cancellation still carries the rounding of the large terms it came from. A fixed absolute
tolerance is therefore too tight for tensors of large magnitude and vacuous for tiny ones. Here the absolute
tolerance is a multiple of the largest |expected| (a norm-wise, infinity-norm relative error), with the multiple
written as so many units of the dtype's rounding (``eps``) and derived at each call site from the computation.
"""

from __future__ import annotations

import math

import torch

F32_EPS = torch.finfo(torch.float32).eps  # 1.19e-07
F64_EPS = torch.finfo(torch.float64).eps  # 2.22e-16


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, what: str,
                        scale: float | None = None) -> None:
    """Every |actual - expected| <= rtol * max|expected| (or ``rtol * scale``).

    ``rtol`` is relative to the largest element of ``expected``, not to each element: the rounding of a computation
    is set by the magnitude of what it summed. ``scale``: a larger magnitude the rounding comes from, where the
    tensor itself is small by cancellation (a gradient that is zero in exact arithmetic, computed from large terms).
    Same shape and dtype required; a NaN or inf anywhere fails. The error names ``what``, the worst element (index,
    both values, the difference) and the tolerance.
    """
    assert isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor), what
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    if expected.numel() == 0:
        return
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    assert torch.isfinite(e).all(), f"{what}: the expected tensor has NaN or inf values"
    scale = float(e.abs().max()) if scale is None else scale
    tolerance = rtol * scale
    diff = torch.where(torch.isfinite(a), (a - e).abs(), torch.full_like(a, math.inf))
    worst = int(diff.flatten().argmax())
    if float(diff.flatten()[worst]) <= tolerance:
        return
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), tuple(e.shape)))
    bad = int((diff > tolerance).sum())
    raise AssertionError(
        f"{what}: {bad} of {e.numel()} elements differ by more than {tolerance:.3g} "
        f"(rtol {rtol:.3g} x max|expected| {scale:.3g}); worst at {index}: actual {float(a.flatten()[worst]):.9g}, "
        f"expected {float(e.flatten()[worst]):.9g}, |difference| {float(diff.flatten()[worst]):.3g}"
    )


def kl_resolution(vocab_size: int, dtype: torch.dtype = torch.float32) -> float:
    """The smallest difference between two KL(P || Q) values, computed from ``dtype`` log-probabilities over a
    vocabulary of ``vocab_size``, that is more than rounding.

    A log-probability log p_i = z_i - logsumexp(z) is rounded to about eps * |log p_i|. KL = sum_i p_i (log p_i -
    log q_i) weights those errors by p_i, so one KL carries about eps * (H(P) + H(P, Q)) <= 2 eps ln V (the entropy
    and the cross-entropy of two nearby distributions are at most ln V, up to the KL itself); the difference of two
    independently rounded KLs carries twice that. Near-equal KLs of a few 1e-5 (a small perturbation of a tiny
    model) are only comparable to this absolute resolution, not to a relative tolerance.
    """
    return 4 * torch.finfo(dtype).eps * math.log(vocab_size)
