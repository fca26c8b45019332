"""The tanh-Gaussian actor: bounded actions, exact squashed log-likelihood, reparameterized gradients."""

from __future__ import annotations

import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from robotrl.policies.gaussian import TanhGaussianActor


def test_log_prob_matches_torch_transformed_distribution() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(
        5, 3, hidden=(32, 32), low=torch.tensor([-1.0, 0.0, -2.0]), high=torch.tensor([1.0, 2.0, 0.0])
    )
    obs = torch.randn(64, 5)
    action, log_prob = actor(obs)
    mean, std = actor.distribution(obs)
    ref = TransformedDistribution(Normal(mean, std), [TanhTransform(), AffineTransform(actor.center, actor.scale)])
    torch.testing.assert_close(log_prob, ref.log_prob(action).sum(-1), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(actor.log_prob(obs, action), log_prob, rtol=1e-3, atol=1e-3)
    assert torch.all(action >= torch.tensor([-1.0, 0.0, -2.0])) and torch.all(action <= torch.tensor([1.0, 2.0, 0.0]))


def test_gradients_flow_through_samples_and_deterministic_is_the_mean() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(4, 2, hidden=(16,))
    obs = torch.randn(8, 4)
    action, log_prob = actor(obs)
    (action.sum() - log_prob.mean()).backward()
    assert actor.mean.weight.grad is not None and actor.log_std.weight.grad.abs().sum() > 0
    det, _ = actor(obs, deterministic=True)
    torch.testing.assert_close(det, torch.tanh(actor.distribution(obs)[0]))
    _, std = actor.distribution(obs * 1e3)  # extreme inputs: std stays within the clamp
    assert torch.all(std >= torch.exp(torch.tensor(-5.0)) - 1e-6) and torch.all(
        std <= torch.exp(torch.tensor(2.0)) + 1e-5
    )
