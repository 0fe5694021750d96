"""Where the gradient's noise is (vlaeval/audit/decomposition.py): planted designs whose parts are
known -- additive, anchor-only, flow-time-only, a multiplicative interaction, draws in time order,
unequal cells -- recovered within their sampling error; the oracle ratios against their closed
forms; shuffling flow time away from the draws (the negative control) erases its share."""

from __future__ import annotations

import numpy as np
import pytest

from vlaeval.audit.decomposition import noise_decomposition


def design(anchor_sd=0.0, time_amplitude=0.0, interaction=0.0, noise_sd=0.0, draws=400, anchors=60, seed=0):
    """s = 10 + anchor effect + time effect (a ramp in u) + interaction + noise, with u uniform."""
    rng = np.random.default_rng(seed)
    u = rng.random((draws, anchors))
    a = anchor_sd * rng.standard_normal(anchors)
    b = time_amplitude * (u - 0.5) * np.sqrt(12)  # SD time_amplitude under uniform u
    signs = np.where(np.arange(anchors) % 2 == 0, 1.0, -1.0)  # balanced: no flow-time main effect
    c = interaction * signs[None, :] * (u - 0.5) * np.sqrt(12)
    s = 10.0 + a[None, :] + b + c + noise_sd * rng.standard_normal((draws, anchors))
    return s, u


def test_an_additive_design_is_split_in_proportion_to_its_planted_variances():
    """anchor SD 1, flow-time SD 2 (a ramp: 10 bins keep ~99% of its variance), noise SD 1: shares 1/6,
    4/6, 0, 1/6 (the binned ramp's lost 1% moves to the rest)."""
    s, u = design(anchor_sd=1.0, time_amplitude=2.0, noise_sd=1.0)
    shares = noise_decomposition(s, u).variance_shares
    anchor_var = np.var(s.mean(axis=0) - s.mean())  # the realised anchor effects, not their expectation
    assert abs(sum(shares.values()) - 1.0) < 1e-12
    assert shares["flow_time"] == pytest.approx(4 * 0.99 / (anchor_var + 4 + 1), abs=0.02)
    assert shares["anchor"] == pytest.approx(anchor_var / (anchor_var + 4 + 1), abs=0.02)
    assert abs(shares["interaction"]) < 0.02


@pytest.mark.parametrize("ordered", [False, True])
def test_each_axis_alone_and_the_interaction_are_found_even_with_draws_in_time_order(ordered):
    for kwargs, main in (
        ({"anchor_sd": 2.0, "noise_sd": 0.5}, "anchor"),
        ({"time_amplitude": 2.0, "noise_sd": 0.5}, "flow_time"),
        ({"interaction": 2.0, "noise_sd": 0.5}, "interaction"),
    ):
        s, u = design(**kwargs)
        if ordered:  # draws sorted by flow time within each anchor: the layout must not matter
            order = np.argsort(u, axis=0)
            s, u = np.take_along_axis(s, order, 0), np.take_along_axis(u, order, 0)
        shares = noise_decomposition(s, u).variance_shares
        assert shares[main] > 0.85, (main, shares)
        others = [k for k in ("anchor", "flow_time", "interaction") if k != main]
        assert all(abs(shares[k]) < 0.03 for k in others), (main, shares)


def test_shuffling_flow_time_away_from_the_draws_erases_its_share():
    """The negative control: the same values with u permuted across draws keep their anchor share
    and lose the flow-time share entirely."""
    s, u = design(anchor_sd=1.0, time_amplitude=2.0, noise_sd=1.0)
    shuffled = np.random.default_rng(5).permuted(u, axis=0)
    real, control = noise_decomposition(s, u), noise_decomposition(s, shuffled)
    assert real.variance_shares["flow_time"] > 0.5
    assert control.variance_shares["flow_time"] < 0.01
    assert control.oracle_ratios["flow_time"] > 0.999 > real.oracle_ratios["flow_time"]


def test_oracle_ratios_match_their_closed_forms_on_exact_cell_means():
    """Noise-free, each cell's value constant: s = a_i * g_k with every (anchor, bin) cell filled. The
    best proposal over anchors reaches (mean sqrt a)^2 / mean a (times the same in g for flow
    time); over both, the product: the two axes are independent here. Second-moment shares follow g."""
    bins, anchors = 5, 4
    a = np.array([1.0, 4.0, 9.0, 16.0])
    g = np.array([1.0, 1.0, 4.0, 0.25, 2.0])
    u = np.repeat((np.arange(bins) + 0.5) / bins, 3)[:, None] * np.ones((1, anchors))
    s = a[None, :] * g[np.minimum((u * bins).astype(int), bins - 1)]
    d = noise_decomposition(s, u, bins=bins)

    def closed(x):
        return np.mean(np.sqrt(x)) ** 2 / np.mean(x)

    assert d.oracle_ratios["anchor"] == pytest.approx(closed(a), rel=1e-12)
    assert d.oracle_ratios["flow_time"] == pytest.approx(closed(g), rel=1e-12)
    assert d.oracle_ratios["anchor_and_flow_time"] == pytest.approx(closed(a) * closed(g), rel=1e-12)
    assert np.allclose(d.second_moment_by_time_bin, g / g.sum())
    assert d.variance_shares["rest"] == pytest.approx(0.0, abs=1e-12)


def test_an_empty_cell_leaves_the_joint_oracle_out_and_bad_input_is_refused():
    s, u = design(anchor_sd=1.0, draws=3, anchors=5)
    d = noise_decomposition(s, u, bins=10)  # 3 draws cannot fill 10 bins per anchor
    assert d.oracle_ratios["anchor_and_flow_time"] is None and d.draws_per_cell == 0.3
    with pytest.raises(ValueError, match="must both be"):
        noise_decomposition(s, u[:, :4])
    with pytest.raises(ValueError, match="finite"):
        noise_decomposition(-s, u)
    with pytest.raises(ValueError, match="u must lie in"):
        noise_decomposition(s, u + 1.0)
