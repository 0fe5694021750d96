"""Flow conventions are configuration: one network written in two conventions gets the same
scores, losses and actions; each time distribution's sampler and quantile agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from torch import nn

from helpers.configs import compose_config
from helpers.data import fake_anchors
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.flow import FlowConvention, flow_matching_losses, sample_actions
from vlaeval.policy.tiny_vla import TinyVLA
from vlaeval.residual.estimators import score_anchors

VOCAB = ["open", "close", "drawer"]


class NoiseAtZero(nn.Module):
    """The same network, written for flow=noise_at_zero: t' = 1 - t, velocity a - eps = -(eps - a)."""

    def __init__(self, inner: TinyVLA) -> None:
        super().__init__()
        self.inner, self.horizon, self.action_dim = inner, inner.horizon, inner.action_dim

    def tokenize(self, instructions):
        return self.inner.tokenize(instructions)

    def encode(self, batch):
        return self.inner.encode(batch)

    def velocity(self, conditioning, noisy_actions, t):
        return -self.inner.velocity(conditioning, noisy_actions, 1.0 - t)

    def trainable_parameters(self, which):
        return self.inner.trainable_parameters(which)


@pytest.fixture(scope="module")
def setting():
    torch.manual_seed(0)
    anchors = fake_anchors()
    net = TinyVLA(VOCAB, 6, 3, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2).eval()
    pi0 = compose_config([]).flow
    zero = compose_config(["flow=noise_at_zero"]).flow
    return anchors, net, pi0, zero


@pytest.mark.parametrize("kind", ["iid", "midpoint_antithetic", "stratified", "sobol"])
def test_one_network_in_two_conventions_gets_the_same_scores(setting, kind):
    anchors, net, pi0, zero = setting
    index = np.arange(len(anchors))
    kwargs = dict(kind=kind, seeds=[1, 2], samples_per_estimator=8, anchor_batch_size=7)
    instructions = anchors.demonstrations.instructions

    def scores(model, flow):
        return score_anchors(bind_policy(model, instructions, flow), anchors, index, **kwargs).estimator_residuals

    a, b = scores(net, pi0), scores(NoiseAtZero(net), zero)
    np.testing.assert_allclose(a, b, rtol=2e-5)
    # Negative control: the rewritten network scored under the wrong convention is another score.
    wrong = scores(NoiseAtZero(net), pi0)
    assert np.max(np.abs(wrong - a) / a) > 0.1


def test_one_network_in_two_conventions_has_the_same_loss_and_samples_the_same_actions(setting):
    anchors, net, pi0, zero = setting
    batch = bind_policy(net, anchors.demonstrations.instructions, pi0).anchor_batch(anchors, np.arange(6))
    t, noise = torch.rand(6), torch.randn(6, 4, 3)
    torch.testing.assert_close(
        flow_matching_losses(net, batch, t, noise, pi0),
        flow_matching_losses(NoiseAtZero(net), batch, 1.0 - t, noise, zero),
        rtol=1e-5,
        atol=1e-6,
    )
    conditioning = net.encode(batch)
    x = sample_actions(net, conditioning, 5, torch.Generator().manual_seed(3), pi0)
    y = sample_actions(NoiseAtZero(net), conditioning, 5, torch.Generator().manual_seed(3), zero)
    torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["flow=noise_at_zero"],
        ["flow=logit_normal"],
        ["flow.time_distribution=uniform"],
        ["flow.beta_a=2", "flow.beta_b=3"],
    ],
)
def test_each_time_distribution_samples_what_its_quantile_says(overrides):
    convention = FlowConvention.of(compose_config(overrides).flow)
    convention.validate()
    drawn = convention.sample_time(np.random.default_rng(0), 20_000)
    grid = np.sort(convention.time_quantile((np.arange(20_000) + 0.5) / 20_000))
    assert kstest(drawn, lambda x: np.searchsorted(grid, x) / grid.size).pvalue > 0.001
    assert drawn.min() >= 0.0 and drawn.max() <= 1.0
    # time_level inverts time_quantile, so a recorded flow time gives back its quantile level, and the
    # levels of training draws are uniform (both ends, both noise conventions)
    u = np.array([1e-4, 0.01, 0.3, 0.5, 0.77, 0.99, 1 - 1e-4])
    assert np.allclose(convention.time_level(convention.time_quantile(u)), u, atol=1e-9)
    assert kstest(convention.time_level(drawn), "uniform").pvalue > 0.001
