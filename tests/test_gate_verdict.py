"""The gate's three-way verdict on the predicted second-moment ratio (vlaeval/audit/verdict.py),
attacked where it is most likely to break: a skewed population of anchors (log-normal gradient
second moments), few anchors, few and heavy-tailed gradient seeds (exponential and gamma(0.5) noise
on each seed's squared norm), and a threshold half and one standard deviation from the population's
true ratio on either side. A wrong verdict is PASS when the truth is above the threshold, or FAIL
when it is below; a 95% interval allows 2.5% a side. The point comparison the seed made (ratio <=
0.98 as if exact) is the negative control: it must be wrong far more often.

A rare heavy tail (2% of anchors with 25x the second moment) is where resampling cannot help: an
audit of 64 anchors that drew none of them cannot know they exist. Measured here: its wrong PASS rate
stays at zero (the error is the conservative one, FAIL for a proposal that would have paid), and the
interval holds again at 256 anchors. docs/audit.md says so."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest

from vlaeval.audit.statistics import information_to_baseline_ratio, proposal_distribution
from vlaeval.audit.verdict import break_even_ratio, ratio_verdict, tail_deviations, two_level_ratios
from vlaeval.choices import Verdict

PROPOSAL: Dict[str, Any] = dict(alpha=0.2, percentile_epsilon=0.05, proposal_power=1.0)
POPULATION = 20_000
REPETITIONS = 120
RESAMPLES = 300


def population(design: str, rng: np.random.Generator):
    """(each anchor's true mean squared gradient norm, its score): the score a noisy monotone
    function of the gradient RMS, as the residual is."""
    if design.startswith("lognormal"):  # "lognormal2": LN(0, 2), the review's heavy tail
        second_moment = rng.lognormal(0.0, 2.0 if design == "lognormal2" else 1.0, POPULATION)
    else:  # "rare": 2% of the anchors 25x heavier
        second_moment = np.where(rng.random(POPULATION) < 0.02, 25.0, 1.0) * rng.lognormal(0.0, 0.3, POPULATION)
    return second_moment, np.sqrt(second_moment) * rng.lognormal(0.0, 0.5, POPULATION)


def true_ratio(second_moment, score) -> float:
    return float(information_to_baseline_ratio(np.sqrt(second_moment), proposal_distribution(score, **PROPOSAL)))


def audits(design: str, anchors: int, seeds: int, shape: float):
    """REPETITIONS audits of `anchors` anchors drawn from one population, each anchor's gradient RMS
    from `seeds` seeds whose squared norms are its mean times gamma(shape) noise: per audit its
    ratio and the two-level bootstrap's replicates; and the population's true ratio."""
    rng = np.random.default_rng(7)
    second_moment, score = population(design, rng)
    out = []
    for repetition in range(REPETITIONS):
        index = rng.choice(POPULATION, anchors, replace=False)
        squares = second_moment[index][None] * rng.gamma(shape, 1.0 / shape, size=(seeds, anchors))
        rms = np.sqrt(squares.mean(axis=0))
        ratio = float(information_to_baseline_ratio(rms, proposal_distribution(score[index], **PROPOSAL)))
        replicates = two_level_ratios(
            score[index], rms, np.sqrt(squares), **PROPOSAL, resamples=RESAMPLES, seed=repetition
        )
        deviations = tail_deviations(score[index], rms, **PROPOSAL, resamples=RESAMPLES, seed=repetition)
        out.append((ratio, replicates, deviations))
    return out, true_ratio(second_moment, score)


def wrong_rates(results, truth: float, offset_sd: float, tail_model: bool = True):
    """(the verdict's wrong rate, the point comparison's) with the threshold `offset_sd` standard
    deviations of the audits' ratio from the truth (negative: the truth above the threshold);
    `tail_model=False`: the bootstrap's interval alone (the verdict before issue 50)."""
    ratios = np.array([r for r, _, _ in results])
    threshold = truth + offset_sd * ratios.std()
    verdicts = [
        ratio_verdict(
            r, b, threshold=threshold, level=0.95, anchors=1, gradient_seeds=1, deviations=d if tail_model else None
        ).verdict
        for r, b, d in results
    ]
    if offset_sd < 0:  # the truth is above the threshold: PASS is wrong
        return np.mean([v == Verdict.PASS.value for v in verdicts]), float(np.mean(ratios <= threshold))
    return np.mean([v == Verdict.FAIL.value for v in verdicts]), float(np.mean(ratios > threshold))


@pytest.mark.parametrize(
    "design, anchors, seeds, shape",
    [
        ("lognormal", 64, 32, 1.0),  # the default audit's anchors; exponential seed noise
        ("lognormal", 64, 8, 0.5),  # few seeds, heavier-tailed than exponential
        ("lognormal", 256, 16, 1.0),
        ("rare", 256, 16, 1.0),
    ],
)
def test_wrong_verdicts_are_rare_on_either_side_of_the_threshold_and_the_point_comparison_is_not(
    design, anchors, seeds, shape
):
    results, truth = audits(design, anchors, seeds, shape)
    for offset in (-1.0, -0.5, 0.5, 1.0):
        wrong, point = wrong_rates(results, truth, offset)
        # 2.5% a side at 95%; 120 audits: 8 or more wrong at 2.5% has probability ~0.01.
        assert wrong <= 8 / REPETITIONS, (design, anchors, seeds, offset, wrong)
        if abs(offset) == 0.5:  # the negative control: half a SD from the truth, the point comparison errs often
            assert point >= 0.15, (design, offset, point)


def test_a_heavy_log_normal_tail_is_modelled_where_the_bootstrap_cannot_see_it():
    """Issue 50, finding 6: LN(0, 2) second moments, 64 anchors x 64 seeds -- an audit usually misses the
    heaviest anchors and reads the ratio high, so the bootstrap's interval (the negative control)
    FAILed a proposal below the threshold far above 2.5% of the time (0.18-0.23 at half an SD). With
    the log-normal tail model's lower bound, wrong verdicts stay within 2.5% a side."""
    results, truth = audits("lognormal2", 64, 64, 1.0)
    for offset in (-1.0, -0.5, 0.5, 1.0):
        wrong, _ = wrong_rates(results, truth, offset)
        assert wrong <= 8 / REPETITIONS, (offset, wrong)
    assert wrong_rates(results, truth, 0.5, tail_model=False)[0] > 12 / REPETITIONS


def test_a_rare_heavy_tail_the_anchors_missed_gives_conservative_errors_only():
    """64 anchors from a population whose heavy 2% they often miss: FAIL for a proposal below the
    threshold happens (the documented limit: the tail is not log-normal, and neither the bootstrap nor
    the tail model sees anchors no audit drew), PASS for one above it does not."""
    results, truth = audits("rare", 64, 32, 1.0)
    wrong_pass = [wrong_rates(results, truth, offset)[0] for offset in (-1.0, -0.5)]
    wrong_fail = [wrong_rates(results, truth, offset)[0] for offset in (0.5, 1.0)]
    assert max(wrong_pass) <= 2 / REPETITIONS
    assert max(wrong_fail) > 8 / REPETITIONS  # the limit, measured: if this stops failing, update docs/audit.md


def test_the_verdict_its_anchors_needed_and_the_break_even_ratio():
    replicates = np.linspace(0.95, 0.99, 401)  # 95% interval [0.951, 0.989]
    undecided = ratio_verdict(0.97, replicates, threshold=0.98, level=0.95, anchors=64, gradient_seeds=8)
    assert undecided.verdict == "UNDECIDED"
    half = (undecided.high - undecided.low) / 2
    z, z80 = 1.959964, 0.841621  # 80% power at the same ratio and spread; the half-width shrinks as 1/sqrt(N)
    assert undecided.anchors_needed == int(np.ceil(64 * ((z + z80) * half / z / 0.01) ** 2))
    assert ratio_verdict(0.96, replicates, threshold=0.995, level=0.95, anchors=64, gradient_seeds=8).verdict == "PASS"
    assert ratio_verdict(0.96, replicates, threshold=0.90, level=0.95, anchors=64, gradient_seeds=8).verdict == "FAIL"
    assert break_even_ratio(1.0, 1.0) == 0.5 and break_even_ratio(0.0, 1.0) == 1.0
    costed = ratio_verdict(
        0.6,
        np.linspace(0.55, 0.65, 101),
        threshold=0.98,
        level=0.95,
        anchors=64,
        gradient_seeds=8,
        scoring_gflop=50.0,
        training_gflop=100.0,
    )  # r* = 1 / 1.5 = 0.667: the whole interval below it pays
    assert costed.break_even_ratio == pytest.approx(2 / 3) and costed.pays_for_its_scoring
    assert type(costed).from_json(costed.to_json()) == costed
    # The run it would pay in: at that many GFLOP of training, r* equals the interval's upper end.
    high = costed.high
    assert break_even_ratio(50.0, costed.training_gflop_to_pay) == pytest.approx(high)
    short = ratio_verdict(
        0.6, np.linspace(0.55, 0.65, 101), threshold=0.98, level=0.95, anchors=64, gradient_seeds=8,
        scoring_gflop=50.0, training_gflop=20.0,
    )  # fmt: skip
    assert not short.pays_for_its_scoring and short.training_gflop_to_pay == costed.training_gflop_to_pay
    from vlaeval.jobs.residual_audit import run_length_to_pay

    assert f"{costed.training_gflop_to_pay / 20.0:.2f}x the planned one's work" in run_length_to_pay(short)
    hopeless = ratio_verdict(
        1.0, np.linspace(0.95, 1.05, 101), threshold=0.98, level=0.95, anchors=64, gradient_seeds=8,
        scoring_gflop=50.0, training_gflop=20.0,
    )  # fmt: skip
    assert hopeless.training_gflop_to_pay is None and "any length" in run_length_to_pay(hopeless)


def test_the_two_level_bootstrap_is_wider_than_the_anchor_level_alone_when_seeds_are_noisy():
    rng = np.random.default_rng(3)
    second_moment, score = population("lognormal", rng)
    index = rng.choice(POPULATION, 64, replace=False)
    squares = second_moment[index][None] * rng.gamma(0.5, 2.0, size=(4, 64))
    rms = np.sqrt(squares.mean(axis=0))
    both = two_level_ratios(score[index], rms, np.sqrt(squares), **PROPOSAL, resamples=800, seed=0)
    anchors_only = two_level_ratios(score[index], rms, None, **PROPOSAL, resamples=800, seed=0)
    assert both.std() > anchors_only.std()
    again = two_level_ratios(score[index], rms, np.sqrt(squares), **PROPOSAL, resamples=800, seed=0)
    assert np.array_equal(both, again)  # seeded: the same replicates in any process


def test_a_re_audit_at_the_anchors_needed_decides_four_times_in_five():
    """Issue 50, finding 6: "anchors needed" was the size at which the interval merely touches the
    threshold -- a re-audit there decides about half the time. Now it is the 80%-power size at the
    audit's ratio and spread. Its premise made true (each 64-anchor audit's replicates re-centred on
    the population's ratio, the threshold 0.4 SD of an audit's ratio away on either side), a re-audit
    at the figure decides the right way 0.67 of the time (below 0.8: a 64-anchor audit's spread is
    itself an estimate, and too small a spread plans too few anchors); at the old figure (the negative
    control) 0.385."""
    rng = np.random.default_rng(50)
    second_moment, score = population("lognormal", rng)
    truth = true_ratio(second_moment, score)

    def audit(anchors: int, seed: int):
        index = rng.choice(POPULATION, anchors, replace=False)
        squares = second_moment[index][None] * rng.gamma(1.0, 1.0, size=(8, anchors))
        rms = np.sqrt(squares.mean(axis=0))
        ratio = float(information_to_baseline_ratio(rms, proposal_distribution(score[index], **PROPOSAL)))
        return ratio, two_level_ratios(score[index], rms, np.sqrt(squares), **PROPOSAL, resamples=200, seed=seed)

    decided = {"now": [], "before": []}
    for side in (-1.0, 1.0):
        threshold = truth + side * 0.025  # about 0.4 SD of a 64-anchor audit's ratio
        right = Verdict.PASS.value if side > 0 else Verdict.FAIL.value
        for seed in range(100):
            ratio, replicates = audit(64, seed)
            centred = replicates - ratio + truth
            first = ratio_verdict(truth, centred, threshold=threshold, level=0.95, anchors=64, gradient_seeds=8)
            assert first.verdict == Verdict.UNDECIDED.value and first.anchors_needed is not None
            before = int(np.ceil(first.anchors_needed / ((1.959964 + 0.841621) / 1.959964) ** 2))
            for key, anchors, stream in (("now", first.anchors_needed, 1000), ("before", before, 2000)):
                r, b = audit(anchors, stream + seed)
                verdict = ratio_verdict(r, b, threshold=threshold, level=0.95, anchors=anchors, gradient_seeds=8)
                decided[key].append(verdict.verdict == right)
    now, before = np.mean(decided["now"]), np.mean(decided["before"])
    assert now >= 0.6 and before <= 0.47 and now - before >= 0.2, (now, before)
