"""The demo's multi-seed arithmetic (``llava_normaligned.demo.stats``) against hand computations, and its t quantile
(scipy's) against the values the package's own implementation (bisection on the regularised incomplete beta
function) gave before scipy replaced it."""

from __future__ import annotations

import math

import pytest

from llava_normaligned.demo.stats import mean_interval, paired_difference, t_quantile


@pytest.mark.parametrize("df, table", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)])
def test_t_quantile_matches_the_printed_table(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-table, abs=1e-4)


# (df, p, t_quantile) as the package's former bisection computed them, to 1e-12 relative
FORMER = [
    (1, 0.975, 12.706204736172367), (2, 0.975, 4.302652729749752), (3, 0.975, 3.1824463052844294),
    (4, 0.975, 2.776445105198036), (9, 0.975, 2.2621571627978483), (30, 0.975, 2.042272456300452),
    (2, 0.995, 9.924843200915348), (4, 0.9, 1.533206274058557), (7, 0.6, 0.2631668613516922),
]


@pytest.mark.parametrize("df, p, former", FORMER)
def test_t_quantile_equals_the_former_implementation(df, p, former):
    assert abs(t_quantile(p, df) - former) < 1e-10
    assert abs(t_quantile(1.0 - p, df) + former) < 1e-10


def test_intervals_equal_the_former_implementation():
    assert abs(mean_interval([0.8, 0.9, 1.0]).half_width - 0.24841377117504973) < 1e-10
    assert abs(mean_interval([0.61, 0.64, 0.58, 0.7, 0.66]).half_width - 0.05717050381974545) < 1e-10
    assert abs(mean_interval([0.3, 0.5]).half_width - 1.2706204736172368) < 1e-10
    assert abs(mean_interval([0.8, 0.9, 1.0], level=0.99).half_width - 0.5730110893713302) < 1e-10


def test_t_quantile_refuses_what_has_no_quantile():
    for p in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="p must be in"):
            t_quantile(p, 3)
    with pytest.raises(ValueError, match="df must be positive"):
        t_quantile(0.9, 0)


def test_mean_interval_by_hand():
    # 0.80, 0.90, 1.00: mean 0.9, s = 0.1, s / sqrt(3) = 0.0577350, t_{0.975, 2} = 4.302653
    interval = mean_interval([0.80, 0.90, 1.00])
    assert interval.mean == pytest.approx(0.9)
    assert interval.half_width == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    assert interval.low == pytest.approx(0.9 - interval.half_width) and interval.n == 3
    assert interval.text() == "0.900 ± 0.248"
    one = mean_interval([0.7])
    assert one.half_width is None and one.text() == "0.700" and not one.excludes_zero()


def test_paired_difference_by_hand():
    # differences 0.05, 0.00, 0.10: mean 0.05, s = 0.05, half width 4.302653 * 0.05 / sqrt(3) = 0.124207
    diff = paired_difference([0.90, 0.80, 0.70], [0.85, 0.80, 0.60])
    assert diff.mean == pytest.approx(0.05)
    assert diff.half_width == pytest.approx(0.124207, abs=1e-6)
    assert not diff.excludes_zero()  # -0.074 .. 0.174
    clear = paired_difference([0.9, 0.91, 0.92], [0.8, 0.8, 0.8])  # 0.10, 0.11, 0.12: s = 0.01
    assert clear.excludes_zero() and clear.text(signed=True) == "+0.110 ± 0.025"
    with pytest.raises(ValueError, match="as many values"):
        paired_difference([1, 2], [1])


def test_the_detectable_difference_is_the_paired_t_test_s_80_percent_power_point():
    """(t_{0.975, n-1} + t_{0.8, n-1}) * s / sqrt(n), by hand for three seeds (4.3027 + 1.0607); and a simulated
    paired t-test detects that true difference about 80% of the time (power by simulation, not by formula)."""
    from llava_normaligned.demo.stats import detectable_difference

    diffs = [0.10, -0.02, 0.04]
    s = math.sqrt(sum((d - 0.04) ** 2 for d in diffs) / 2)
    assert detectable_difference(diffs) == pytest.approx((4.302653 + 1.060660) * s / math.sqrt(3), rel=1e-5)
    assert detectable_difference([0.1]) is None

    import random

    rng = random.Random(0)
    n, sd = 8, 0.05
    delta = detectable_difference(_unit_spread(n, sd))
    hits = 0
    trials = 4000
    for _ in range(trials):
        sample = [delta + rng.gauss(0.0, sd) for _ in range(n)]
        if paired_difference(sample, [0.0] * n).excludes_zero():
            hits += 1
    # the noncentral-t power at this delta is 0.78-0.80 (the formula is the usual normal-shift approximation)
    assert 0.74 < hits / trials < 0.84


def _unit_spread(n: int, sd: float) -> list[float]:
    """n values with mean 0 and sample standard deviation exactly ``sd``."""
    raw = [i - (n - 1) / 2 for i in range(n)]
    scale = sd / math.sqrt(sum(v * v for v in raw) / (n - 1))
    return [v * scale for v in raw]


def test_paired_differences_carry_their_detectable_difference_and_records_without_it_recover_it():
    """The issue's own figures: 3 seeds, paired half-widths 0.128, 0.047 and 0.176 detect about 16, 6 and 22 points."""
    from llava_normaligned.demo.results_text import detectable
    from llava_normaligned.demo.stats import detectable_from_interval

    paired = paired_difference([0.62, 0.55, 0.60], [0.58, 0.57, 0.52])
    record = paired.to_dict()
    assert record["detectable_difference"] == pytest.approx(
        detectable_from_interval(paired.half_width, paired.n), rel=1e-9)
    legacy = {k: v for k, v in record.items() if k != "detectable_difference"}
    assert detectable(legacy) == pytest.approx(record["detectable_difference"], rel=1e-9)
    found = [detectable_from_interval(h, 3) for h in (0.128, 0.047, 0.176)]
    assert [round(100 * f) for f in found] == [16, 6, 22]
    assert "detectable_difference" not in mean_interval([0.5, 0.6]).to_dict()


def test_seeds_for_inverts_the_detectable_difference():
    from llava_normaligned.demo.stats import detectable_difference, seeds_for

    sd = 0.03
    n = seeds_for(sd, 0.03)
    assert detectable_difference(_unit_spread(n, sd)) <= 0.03 < detectable_difference(_unit_spread(n - 1, sd))
    assert seeds_for(1.0, 1e-4, most=50) is None
    with pytest.raises(ValueError, match="difference"):
        seeds_for(sd, 0.0)


@pytest.mark.parametrize("low, high, verdict", [(0.037, 0.101, "These runs show alignment changing the accuracy"),
                                                 (-0.01, 0.05, "These runs do not show alignment changing")])
def test_the_depth_sentence_reads_the_interval_it_prints(low, high, verdict):
    """The sentence under the per-layer tables concludes from the same paired interval it quotes, also for a row
    without an entry among the contrasts (target init + GWC against w/o Norm is only a row's paired difference)."""
    from llava_normaligned.demo.results_text import depth_text

    paired = {"mean": (low + high) / 2, "half_width": (high - low) / 2, "low": low, "high": high}
    rows = [{"key": "no_norm", "name": "w/o Norm", "layers": {"layers": [0, 1, 2]}, "paired_to_baseline": None},
            {"key": "norm_target_init_gwc", "name": "w/ Norm, target init (w/ GWC)", "layers": {"layers": [0, 1, 2]},
             "paired_to_baseline": {"real": {"avg": paired}}}]
    text = depth_text({"rows": rows, "contrasts": []})
    assert text.startswith("At this depth (2 LLM layers)") and verdict in text
    assert ("(separated from zero)" in text) == (low > 0)
