"""Online PPO fine-tuning of a flow policy (robotrl/flowrl/online.py) from a BC checkpoint trained on real Reach demos:
held-out success rises within a CI budget, every method's chain log-likelihood is recomputed exactly from the stored
chain, Flow-SDE keeps the ODE's marginals, a killed run resumes exactly, a NaN stops with the last good state, and
the fine-tuned checkpoint goes on to `distill` and `eval` unchanged."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robotrl.envs import make
from robotrl.flowrl.chain import (
    HEADS,
    METHODS,
    FlowAgent,
    Tally,
    Windows,
    flow_sde_step,
    load_flow_policy,
    ppo_loss,
    rollout,
)
from robotrl.flowrl.online import OnlineConfig, semi_mdp_gae, train
from robotrl.policies import load
from robotrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robotrl.policies.export import sample_from_noise
from robotrl.policies.vla import VLAConfig, VLAPolicy
from robotrl.training.evaluate import evaluate_policy
from robotrl.training.loop import TRAIN_STATE, BestCheckpoint, TrainingDiverged, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"
#: the CLI's subprocesses on one torch thread (two threads slow down many times over on a shared 2-core machine)
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def demos(flow_reach_demos: Path) -> Path:
    return flow_reach_demos


@pytest.fixture
def bc_flow(reach_mlp_flow: Path) -> Path:
    """The chunk-MLP start: what the tests below check holds for any flow network, and its iterations are cheap."""
    return reach_mlp_flow


def small(policy: Path, run_dir: Path, **overrides: object) -> OnlineConfig:
    """CI-sized: 16 envs, one 60-step episode per env per iteration, chunks of 4 executed, a 5-step chain; Flow-SDE
    unless `method` says otherwise."""
    base = OnlineConfig(
        policy=policy,
        method="flow_sde",
        num_envs=16,
        rollout_steps=60,
        execute=4,
        sampler_steps=5,
        total_steps=28_800,
        eval_episodes=0,
        checkpoint_every=960,
        log_every=960,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


#: the BC start each method's learning test fine-tunes (tests/conftest.py's `train_bc_flow`): the chunk MLP, whose RL
#: iterations cost a fraction of the U-Net's; residual keeps the U-Net start, on which it learns (its correction of
#: the MLP start's chunks does not lift it within the budget; bench/RESULTS.md, "Learning tests")
START = {**{method: "mlp" for method in METHODS}, "residual": "unet"}
#: env steps each method trains for in its default-suite learning test; the test asserts a gain of >= 10 points of
#: held-out success over its BC start on the same 100 episodes (about 2 standard errors of a paired difference at
#: the start's success: a method that does not learn stays under it). The budgets are set from the spread over
#: seeds 0-4 (bench/online_budgets.py; bench/RESULTS.md, "Learning tests") so that every seed clears the bar.
BUDGET = {
    "denoising_mdp": 43_200,
    "flow_sde": 24_000,
    "flow_noise": 24_000,
    "ode_noise": 28_800,
    "latent": 14_400,
    "residual": 43_200,
}
GAIN = 0.10


@pytest.mark.learning
@pytest.mark.parametrize("method", METHODS)
def test_each_method_raises_held_out_success(
    method: str, request: pytest.FixtureRequest, tmp_path: Path, claim, learning_seed: int
) -> None:
    """Every method of `robotrl train online` fine-tunes a half-trained Reach flow policy to a higher success on
    the same 100 held-out episodes within a CI budget. The checkpoint is what `robotrl policy eval` loads (the same success
    on the same seeds): the ODE policy with K = 5 Euler steps, or, for the methods that train a head of a frozen flow
    network, the BC checkpoint's flow network bit for bit with that head added."""
    fixture = {"mlp": "reach_mlp_flow", "unet": "reach_bc_flow"}[START[method]]
    bc_flow, before = request.getfixturevalue(fixture), request.getfixturevalue(f"{fixture}_success")
    steps = BUDGET[method]
    result = train(
        small(bc_flow, tmp_path / "run", method=method, total_steps=steps, eval_episodes=100, seed=learning_seed)
    )
    assert result.success_rate is not None
    claim(
        f"{method} gain over BC",
        result.success_rate - before,
        lower=GAIN,
        before=before,
        after=result.success_rate,
        env_steps=steps,
    )
    tuned, start = load(result.weights), load(bc_flow)
    assert tuned.name == "flow" and tuned.config.steps == 5 and tuned.config.solver == "euler"
    if method in HEADS:  # only the head moved
        assert getattr(tuned, HEADS[method]) is not None
        for name, x in start.state_dict().items():
            torch.testing.assert_close(tuned.state_dict()[name], x, rtol=0, atol=0, msg=name)
    if method in ("flow_sde", "latent"):  # the evaluated policy is the saved one (one re-evaluation is enough)
        assert evaluate_policy(tuned, 100, 25, execute=4).success_rate == result.success_rate
        assert any((result.run_dir / "tb").iterdir())


def test_latent_is_the_default_method() -> None:
    assert OnlineConfig.method == "latent"


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("method", ["denoising_mdp", "flow_sde", "flow_noise", "ode_noise"])
def test_the_chain_methods_gain_more_on_a_longer_budget(
    reach_bc_flow: Path, reach_bc_flow_success: float, tmp_path: Path, method: str, claim, learning_seed: int
) -> None:
    """86,400 env steps: the chain methods go well past their CI-budget gains (bench/RESULTS.md, "The three
    methods on Reach"); asserted >= +25 points, and the training episodes' success rises from the first iterations
    to the last."""
    result = train(
        small(reach_bc_flow, tmp_path / "run", method=method, total_steps=86_400, eval_episodes=100, seed=learning_seed)
    )
    assert result.success_rate is not None
    claim(
        f"{method} gain over BC at 86,400 steps",
        result.success_rate - reach_bc_flow_success,
        lower=0.25,
        before=reach_bc_flow_success,
        after=result.success_rate,
    )
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_success = [m["train/success_rate"] for m in metrics if "train/success_rate" in m]
    claim(
        f"{method} training success rise", float(np.mean(train_success[-3:]) - np.mean(train_success[:3])), lower=0.05
    )


def test_pg_snr_bench_compares_the_gradients_with_shuffled_advantages(bc_flow: Path) -> None:
    """bench/pg_snr.py on a CI budget: a row per method with the critic's fit, the groups' cosine against its
    shuffled-advantage baseline, and the gradient per chain transition: Flow-SDE's grows along the chain (its score
    is 1/std and the SDE's stds shrink towards the action), ode_noise has one stochastic transition."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import pg_snr

    rows = pg_snr.main(
        pg_snr.PGSNRConfig(
            policy=bc_flow,
            methods=("flow_sde", "ode_noise"),
            num_envs=8,
            rollout_steps=24,
            execute=4,
            warmup=1,
            parts=4,
        )
    )
    assert [r["method"] for r in rows] == ["flow_sde", "ode_noise"]
    for row in rows:
        assert row["task"] == "Reach" and row["decisions"] == 8 * 24 // 4
        assert (
            -1 <= row["cosine"] <= 1 and -1 <= row["cosine_shuffled"] <= 1 and math.isfinite(row["explained_variance"])
        )
    sde, ode = rows[0]["per_step"], rows[1]["per_step"]
    assert len(sde) == load(bc_flow).config.steps and len(ode) == 1
    assert sde[-1][0] > 3 * sde[0][0], sde
    with pytest.raises(SystemExit, match="--methods: expected some of"):
        pg_snr.main(pg_snr.PGSNRConfig(policy=bc_flow, methods=("ddpo",)))


def test_flow_noise_use_bench_compares_sampled_and_zero_noise(bc_flow: Path) -> None:
    """bench/flow_noise_use.py on a CI budget: the sampled, zero- and scaled-noise rows on the same episodes (scale 1
    repeats the sampled row exactly), no near-miss
    row for a task without coverage, and one x_0-signal row per start state with finite variances."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import flow_noise_use

    rows = flow_noise_use.main(
        flow_noise_use.NoiseUseConfig(
            policy=bc_flow,
            episodes=8,
            num_envs=8,
            execute=4,
            states=2,
            candidates=2,
            repeats=2,
            horizon=16,
            scales=(1.0,),
        )
    )
    assert [r["row"] for r in rows] == ["sampled", "zero", "scale", "x0_signal"]
    assert rows[0]["episodes"] == rows[1]["episodes"] == rows[2]["episodes"] == 8
    assert math.isclose(rows[1]["vs_sampled"], rows[1]["success"] - rows[0]["success"])
    assert rows[2]["success"] == rows[0]["success"]  # scale 1 draws the sampled row's noise: the same episodes
    states = rows[3]["states"]
    assert len(states) == 2 and all(math.isfinite(x["signal_var"]) and x["noise_var"] >= 0 for x in states)


def start_chains(
    bc_flow: Path, method: str, num_envs: int = 256, **overrides: Any
) -> tuple[OnlineConfig, Any, FlowAgent, Windows, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """An agent of `method` on the Reach BC policy (a 5-step chain), fresh Reach windows, and the chains it draws
    for them."""
    torch.manual_seed(0)
    config = OnlineConfig(policy=bc_flow, method=method, sampler_steps=5, **overrides)  # type: ignore[arg-type]
    policy = load_flow_policy(bc_flow, 5)
    agent = FlowAgent(policy, config, 5)
    env = make("Reach", num_envs=num_envs, seed=3)
    windows = Windows(("state",), policy.obs_horizon)
    windows.start(env.reset(seed=3)[0])
    obs = policy.normalize_obs(windows.frames)
    chain, logp = agent.sample_chain(obs)
    return config, policy, agent, windows, obs, chain, logp


@pytest.mark.parametrize("method", ["denoising_mdp", "flow_sde", "flow_noise", "ode_noise"])
def test_chain_log_likelihood_is_recomputed_from_the_stored_chain(bc_flow: Path, method: str) -> None:
    """ode_noise's chain is the policy's deterministic ODE and one stochastic step: one density per decision."""
    config, policy, agent, _, obs, chain, logp = start_chains(bc_flow, method, 64, noise_std_end=0.05)
    stochastic = [4] if method == "ode_noise" else list(range(5))
    assert chain.shape == (64, 6, policy.horizon, 3) and logp.shape == (64, len(stochastic))
    again, _ = agent.chain_log_prob(obs, chain)
    torch.testing.assert_close(again, logp, rtol=1e-5, atol=1e-3)
    # the density is the one sampled from: every transition's standardized residual is N(0, 1) noise
    with torch.no_grad():
        cond, features = policy.encoder(obs), agent.features(obs)
        z = []
        for k in range(5):
            ks = torch.full((64,), k)
            mean, std = agent.transition(chain[:, k], policy.velocity(chain[:, k], ks / 5, cond), ks, features)
            if k in stochastic:
                z.append((chain[:, k + 1] - mean) / std)
            else:  # ode_noise's deterministic Euler steps
                torch.testing.assert_close(chain[:, k + 1], mean)
        z = torch.cat(z)
    # within 4 standard errors of N(0, 1)'s mean and std for z.numel() draws (ode_noise has a fifth of the others')
    assert abs(float(z.mean())) < 4 / z.numel() ** 0.5 and abs(float(z.std()) - 1) < 4 / (2 * z.numel()) ** 0.5, (
        z.mean(),
        z.std(),
    )
    # PPO's first ratio is 1, and a positive advantage pulls on the policy (and Flow-Noise's noise net)
    adv = torch.linspace(-1.0, 1.0, 64)
    batch = {"obs": obs, "chain": chain, "logp": logp, "value": torch.zeros(64), "adv": adv, "ret": torch.zeros(64)}
    loss, stats = ppo_loss(agent, batch, config, actor=True, reference=None)
    assert abs(stats["approx_kl"]) < 1e-6 and stats["clip_frac"] == 0.0
    loss.backward()
    grads = {name: p.grad for name, p in agent.named_parameters() if p.grad is not None}
    assert any(name.startswith("policy.net.") and g.abs().sum() > 0 for name, g in grads.items())
    noise_grads = [g for name, g in grads.items() if name.startswith("noise_net.")]
    if method == "flow_noise":
        assert noise_grads and all(g.abs().sum() > 0 for g in noise_grads)
    else:
        assert agent.noise_net is None and not noise_grads
    # the velocity regularizer: zero against the starting policy itself, positive once the policy has moved
    reference = load_flow_policy(bc_flow, 5).requires_grad_(False)
    assert agent.chain_log_prob(obs, chain, reference)[1].item() == 0.0
    torch.optim.SGD(agent.policy.parameters(), lr=0.1).step()
    assert agent.chain_log_prob(obs, chain, reference)[1].item() > 0.0


def assert_ppo_moves_only(
    agent: FlowAgent,
    config: OnlineConfig,
    obs: dict[str, torch.Tensor],
    chain: torch.Tensor,
    logp: torch.Tensor,
    heads: tuple[str, ...],
) -> None:
    """The stored density is the one PPO recomputes (first ratio 1), and the policy gradient reaches `heads`
    only (and the value network), never the flow network."""
    torch.testing.assert_close(agent.chain_log_prob(obs, chain)[0], logp)
    assert {n for n, p in agent.named_parameters() if p.requires_grad} == {
        n for n in dict(agent.named_parameters()) if n.startswith((*heads, "value_net."))
    }
    batch = {
        "obs": obs,
        "chain": chain,
        "logp": logp,
        "value": torch.zeros(len(logp)),
        "adv": torch.linspace(-1.0, 1.0, len(logp)),
        "ret": torch.zeros(len(logp)),
    }
    loss, stats = ppo_loss(agent, batch, config, actor=True, reference=None)
    assert abs(stats["approx_kl"]) < 1e-6 and stats["clip_frac"] == 0.0
    loss.backward()
    grads = {n for n, p in agent.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(n.startswith((*heads, "value_net.")) for n in grads), grads
    assert all(any(n.startswith(h) for n in grads) for h in heads), grads


def test_latent_starts_as_the_bc_policy_and_trains_only_its_noise_prior(bc_flow: Path, tmp_path: Path) -> None:
    """--method latent: the agent gives the policy a noise prior that starts as N(0, I), so the chunks it draws are
    the BC policy's own ODE from x_0; only the prior trains. The checkpoint rebuilds the prior."""
    config, policy, agent, windows, obs, chain, logp = start_chains(bc_flow, "latent")
    assert policy.prior is not None and policy.config.noise_prior == config.noise_hidden
    assert chain.shape == (256, 2, policy.horizon, 3) and logp.shape == (256, 1)
    x0 = chain[:, 0]
    assert abs(float(x0.mean())) < 0.05 and abs(float(x0.std()) - 1) < 0.05  # the standard normal
    bc = load_flow_policy(bc_flow, 5)
    with torch.no_grad():
        torch.testing.assert_close(chain[:, 1], bc.integrate(x0, bc.encoder(obs), 5))
    assert_ppo_moves_only(agent, config, obs, chain, logp, ("policy.prior.",))
    # a moved prior is what the saved checkpoint samples from, on load and in the ODE it feeds
    with torch.no_grad():
        policy.prior.net[-1].bias.normal_()
        policy.prior.log_std.fill_(-1.0)
    loaded = load(policy.save(tmp_path / "steered"))
    assert loaded.prior is not None and loaded.config.noise_prior == config.noise_hidden
    torch.manual_seed(1)
    a = policy.act(windows.frames)
    torch.manual_seed(1)
    torch.testing.assert_close(torch.from_numpy(loaded.act(windows.frames)), torch.from_numpy(a))
    torch.manual_seed(1)
    assert not np.allclose(bc.act(windows.frames), a, atol=1e-3)


def test_residual_starts_as_the_bc_policy_and_trains_only_its_correction(bc_flow: Path, tmp_path: Path) -> None:
    """--method residual: the chain is (x_0, the BC policy's ODE chunk from it, that chunk plus the Gaussian
    correction: mean zero at first, std noise_std); only the correction trains. The saved policy draws the
    correction as the rollouts did, from the rows of its noise after x_0's."""
    config, policy, agent, windows, obs, chain, logp = start_chains(bc_flow, "residual")
    assert policy.residual is not None and policy.config.action_residual == config.noise_hidden
    assert chain.shape == (256, 3, policy.horizon, 3) and logp.shape == (256, 1)
    bc = load_flow_policy(bc_flow, 5)
    with torch.no_grad():
        torch.testing.assert_close(chain[:, 1], bc.integrate(chain[:, 0], bc.encoder(obs), 5))
    z = (chain[:, 2] - chain[:, 1]) / config.initial_std()  # the exploration noise around an uncorrected chunk
    assert abs(float(z.mean())) < 0.05 and abs(float(z.std()) - 1) < 0.05
    assert_ppo_moves_only(agent, config, obs, chain, logp, ("policy.residual.",))
    with torch.no_grad():
        policy.residual.net[-1].bias.uniform_(-3.0, 3.0)
        policy.residual.log_std.fill_(-1.0)
    loaded = load(policy.save(tmp_path / "corrected"))
    assert loaded.residual is not None and loaded.config.action_residual == config.noise_hidden
    assert loaded.noise_rows == 2 * loaded.horizon
    eps = loaded.noise(256, torch.device("cpu"))
    with torch.no_grad():
        corrected = sample_from_noise(loaded, obs, eps)
        base = bc.integrate(eps[:, : bc.horizon], bc.encoder(obs), 5)[:, :8]
        mean, std = policy.residual(policy.vector_features(obs))
        torch.testing.assert_close(corrected, base + mean[:, :8] + std[:, :8] * eps[:, bc.horizon : bc.horizon + 8])
    assert (corrected - base).abs().max() > 0.1
    # online RL's other methods would not draw the correction the saved policy samples: refused
    with pytest.raises(
        ValueError,
        match=r"OnlineConfig.method: 'flow_sde' would ignore the residual this policy "
        r"was given by online RL; continue it with --method residual",
    ):
        FlowAgent(loaded, replace(config, method="flow_sde"), 5)


def test_advantage_floor_keeps_below_average_decisions_out_of_the_policy_update(bc_flow: Path) -> None:
    """--advantage-floor 0: what a minibatch's below-average decisions drew does not move the policy (other chains
    for them, the same gradient); without the floor it does."""
    torch.manual_seed(0)
    policy = load_flow_policy(bc_flow, 5)
    obs = {"state": torch.randn(32, policy.obs_horizon, policy.spec.observations["state"].size)}
    adv = torch.linspace(-1.0, 1.0, 32)  # the first 16 are below the minibatch's mean

    def policy_grad(floor: float | None, chain: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        config = OnlineConfig(policy=bc_flow, method="flow_sde", sampler_steps=5, advantage_floor=floor)
        agent.zero_grad()
        batch = {"obs": obs, "chain": chain, "logp": logp, "value": torch.zeros(32), "adv": adv, "ret": torch.zeros(32)}
        ppo_loss(agent, batch, config, actor=True, reference=None)[0].backward()
        return torch.cat([p.grad.flatten() for p in agent.policy.parameters() if p.grad is not None])

    agent = FlowAgent(policy, OnlineConfig(policy=bc_flow, method="flow_sde", sampler_steps=5), 5)
    (chain, logp), (other, other_logp) = agent.sample_chain(obs), agent.sample_chain(obs)
    below = torch.arange(32) < 16
    mixed = torch.where(below[:, None, None, None], other, chain)
    mixed_logp = torch.where(below[:, None], other_logp, logp)
    floored = policy_grad(0.0, chain, logp)
    assert floored.abs().sum() > 0
    torch.testing.assert_close(policy_grad(0.0, mixed, mixed_logp), floored)
    assert not torch.allclose(policy_grad(None, mixed, mixed_logp), policy_grad(None, chain, logp))
    with pytest.raises(ValueError, match=r"OnlineConfig.advantage_floor: expected a finite number or None, got nan"):
        OnlineConfig(policy=bc_flow, advantage_floor=float("nan"))


def test_executed_likelihood_scores_only_the_actions_the_env_runs(bc_flow: Path) -> None:
    """--likelihood executed: the chain's log-density ignores the chunk steps past `execute` (they never act), and
    the rollout's stored density is the one PPO recomputes."""
    torch.manual_seed(0)
    config = OnlineConfig(policy=bc_flow, method="flow_sde", sampler_steps=5, execute=2, likelihood="executed")
    policy = load_flow_policy(bc_flow, 5)
    agent, full = FlowAgent(policy, config, 5), FlowAgent(policy, replace(config, likelihood="chunk"), 5)
    assert agent.scored == 2 and full.scored == policy.horizon > 2
    env = make("Reach", num_envs=8, seed=3)
    windows = Windows(("state",), policy.obs_horizon)
    windows.start(env.reset(seed=3)[0])
    obs = policy.normalize_obs(windows.frames)
    chain, logp = agent.sample_chain(obs)
    with torch.no_grad():
        torch.testing.assert_close(agent.chain_log_prob(obs, chain)[0], logp, rtol=1e-5, atol=1e-3)
        # the drawn chunk's unexecuted steps (earlier chain states feed the velocity of every step, so only the
        # last transition's sample can move without moving the others' means)
        moved = chain.clone()
        moved[:, -1, 2:] += 0.5
        torch.testing.assert_close(agent.chain_log_prob(obs, moved)[0], logp, rtol=1e-5, atol=1e-3)
        assert (full.chain_log_prob(obs, moved)[0] - full.chain_log_prob(obs, chain)[0])[:, -1].abs().min() > 1.0
        moved[:, -1, :2] += 0.5  # and its executed ones
        assert (agent.chain_log_prob(obs, moved)[0] - logp)[:, -1].abs().min() > 1.0
    with pytest.raises(ValueError, match=r"OnlineConfig.likelihood: expected 'chunk' or 'executed', got 'all'"):
        OnlineConfig(policy=bc_flow, likelihood="all")  # type: ignore[arg-type]


def test_dense_scale_scales_only_the_rewards_below_success(reach_bc_flow: Path) -> None:
    """--dense-scale: the same rollout (same chains, same envs) earns a decision exactly `scale` of its dense reward
    where no step of it succeeded, more where one did (success stays 1); the tally keeps the env's reward. (The U-Net
    start: it reaches targets within these 48 steps, the MLP start not.)"""
    config = OnlineConfig(policy=reach_bc_flow, method="flow_sde", sampler_steps=5, execute=4)
    policy = load_flow_policy(reach_bc_flow, 5)
    agent = FlowAgent(policy, config, 5)

    def run(scale: float) -> tuple[np.ndarray, Tally]:
        torch.manual_seed(0)
        env, windows, tally = make("Reach", num_envs=8, seed=3), Windows(("state",), policy.obs_horizon), Tally(8)
        windows.start(env.reset(seed=3)[0])
        data = rollout(agent, env, windows, 48, 4, 0.95, tally, dense_scale=scale)
        return data["reward"], tally

    (full, tally_full), (scaled, tally_scaled) = run(1.0), run(0.25)
    ratio = scaled / full
    assert np.all((ratio > 0.25 - 1e-9) & (ratio < 1 + 1e-9))
    assert np.isclose(ratio, 0.25).any() and (ratio > 0.3).any()  # decisions without and with a success
    np.testing.assert_array_equal(tally_full.ret, tally_scaled.ret)


def gaussian_velocity(mean: float, std: float):
    """The exact rectified-flow velocity E[x1 - x0 | x_t = x] when x1 ~ N(mean, std^2) per element."""

    def v(x: torch.Tensor, t: float) -> torch.Tensor:
        var = (1 - t) ** 2 + t * t * std * std
        return mean + (t * std * std - (1 - t)) * (x - t * mean) / var

    return v


@pytest.mark.parametrize("a", [0.5, 1.0])
def test_flow_sde_keeps_the_odes_marginals(a: float) -> None:
    """With the exact velocity of Gaussian data, 200 Euler-Maruyama steps of the SDE match the ODE's and the exact
    marginal N(t m, (1 - t)^2 + t^2 s^2) in mean and std within 0.01 at t = 0.5 and t = 1; the same noise added
    without the score correction (the denoising MDP's chain) does not."""
    m, s, steps = 0.7, 0.3, 200
    v = gaussian_velocity(m, s)
    torch.manual_seed(0)
    ode = sde = plain = torch.randn(20_000, 4, 3)
    dt = 1.0 / steps
    for k in range(steps):
        t = k / steps
        ode = ode + v(ode, t) * dt
        mean, std = flow_sde_step(sde, v(sde, t), torch.full((len(sde),), t), dt, a)
        sde = mean + std * torch.randn_like(sde)
        _, std = flow_sde_step(plain, v(plain, t), torch.full((len(plain),), t), dt, a)
        plain = plain + v(plain, t) * dt + std * torch.randn_like(plain)
        if k + 1 in (steps // 2, steps):
            t = (k + 1) / steps
            exact_mean, exact_std = t * m, math.sqrt((1 - t) ** 2 + t * t * s * s)
            for x in (ode, sde):
                assert abs(float(x.mean()) - exact_mean) < 0.01 and abs(float(x.std()) - exact_std) < 0.01, (t, x.std())
            assert abs(float(sde.std()) - float(ode.std())) < 0.01
            assert float(plain.std()) > exact_std + 0.05


def test_semi_mdp_gae_discounts_by_each_decisions_length() -> None:
    """Two envs interleaved: env 0 takes a 2-step then a 3-step decision (its episode ends), env 1 one 4-step
    decision cut by the rollout's end (bootstrapped from last_value)."""
    g, lam = 0.9, 0.5
    reward = np.array([1.0, 2.0, 3.0])
    discount = np.array([g**2, g**4, g**3])
    done = np.array([0.0, 0.0, 1.0])
    value = np.array([0.5, 0.25, 0.75])
    env = np.array([0, 1, 0])
    adv = semi_mdp_gae(reward, discount, done, value, env, np.array([10.0, 20.0]), lam)
    last0 = 3.0 - 0.75
    first = 1.0 + g**2 * 0.75 - 0.5 + g**2 * lam * last0
    np.testing.assert_allclose(adv, [first, 2.0 + g**4 * 20.0 - 0.25, last0])


def test_killed_run_resumes_exactly(
    bc_flow: Path, tmp_path: Path, kill_after_first_train_state, assert_same_run
) -> None:
    """`robotrl train online` is SIGKILLed after its first train state; `--resume` must end with the very weights
    (policy, value and noise nets, Adam, the saved weights' average) of a run that was never stopped."""
    cfg = small(
        bc_flow,
        tmp_path / "killed",
        method="flow_noise",
        num_envs=4,
        rollout_steps=20,
        total_steps=4 * 20 * 5,
        checkpoint_every=80,
        log_every=80,
        critic_warmup=1,
        ema=0.9,
    )
    args = [
        str(ROBOTRL),
        "train",
        "online",
        "--policy",
        str(bc_flow),
        "--method",
        "flow_noise",
        "--num-envs",
        "4",
        "--ema",
        "0.9",
        "--rollout-steps",
        "20",
        "--execute",
        "4",
        "--sampler-steps",
        "5",
        "--total-steps",
        "400",
        "--checkpoint-every",
        "80",
        "--log-every",
        "80",
        "--critic-warmup",
        "1",
        "--eval-episodes",
        "0",
        "--run-dir",
        str(cfg.run_dir),
        "--no-progress",
    ]
    step = kill_after_first_train_state(args, tmp_path / "killed" / TRAIN_STATE)
    assert 1 <= step < 5, step
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")
    a, b = load(tmp_path / "straight" / "policy"), load(tmp_path / "killed" / "policy")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_run_keeps_its_best_evaluated_checkpoint(bc_flow: Path, tmp_path: Path) -> None:
    """Every evaluation offers the weights: best_policy holds those of the highest one (its success reproduces on
    the same seeds), a worse offer leaves them, and a resumed run's keeper compares against the record on disk."""
    result = train(
        small(
            bc_flow, tmp_path / "run", method=OnlineConfig.method, total_steps=5_760, eval_every=1_920, eval_episodes=50
        )
    )
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(m["step"], m["eval/success_rate"]) for m in metrics if "eval/success_rate" in m]
    assert [s for s, _ in evals] == [1_920, 3_840, 5_760], evals
    top = max(rate for _, rate in evals)
    first_top = next(step for step, rate in evals if rate == top)
    assert result.best == {"step": first_top, "success_rate": top} and result.best_weights is not None
    assert evaluate_policy(load(result.best_weights), 50, 25, execute=4).success_rate == top
    assert json.loads((result.run_dir / "result.json").read_text())["best"]["success_rate"] == top

    keeper = BestCheckpoint(result.run_dir, lambda path: pytest.fail(f"a worse offer overwrote {path}"))
    assert not keeper.offer(9_999, top) and keeper.best() == result.best  # a tie keeps the earlier
    saved: list[Path] = []
    assert BestCheckpoint(result.run_dir, saved.append).offer(9_999, top + 0.01) and saved == [result.best_weights]
    assert BestCheckpoint(result.run_dir, saved.append).best() == {"step": 9_999, "success_rate": top + 0.01}


def test_ema_saves_and_evaluates_an_average_of_the_weights_from_the_start(bc_flow: Path, tmp_path: Path) -> None:
    """With `ema` the saved policy is the average (started at the BC weights, full decay from the first update): it
    is neither the live weights nor the start's, it lies nearer the start than the live weights do, and the run's
    evaluation scores it, not the live policy."""
    start = load(bc_flow)
    result = train(
        small(
            bc_flow,
            tmp_path / "run",
            num_envs=4,
            rollout_steps=20,
            total_steps=4 * 20 * 4,
            critic_warmup=1,
            lr=1e-3,
            ema=0.9,
            eval_episodes=10,
            eval_envs=10,
        )
    )
    state = load_train_state(result.run_dir / TRAIN_STATE)
    saved, live = load(result.run_dir / "policy").state_dict(), state["agent"]
    assert state["ema_step"] == 4  # one average per update (the critic's warm-up update included)
    moved_live = moved_saved = 0.0
    for name, x0 in start.state_dict().items():
        if not x0.is_floating_point():
            continue
        torch.testing.assert_close(saved[name], state["ema"][name], rtol=0, atol=0, msg=name)
        moved_live += float((live[f"policy.{name}"] - x0).square().sum())
        moved_saved += float((saved[name] - x0).square().sum())
    assert 0 < moved_saved < 0.5 * moved_live, (moved_saved, moved_live)
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    final = [m["eval/success_rate"] for m in metrics if "eval/success_rate" in m][-1]
    assert evaluate_policy(load(result.run_dir / "policy"), 10, 10, execute=4).success_rate == final


def test_nan_loss_stops_and_keeps_the_last_good_train_state(bc_flow: Path, tmp_path: Path) -> None:
    cfg = small(
        bc_flow,
        tmp_path / "nan",
        num_envs=4,
        rollout_steps=20,
        total_steps=4 * 20 * 30,
        critic_warmup=1,
        lr=1e6,
        checkpoint_every=1,
    )  # an absurd learning rate blows the weights up
    message = r"online iteration (\d+) \(last train state: .*train_state.safetensors\): loss is (nan|inf)"
    with pytest.raises(TrainingDiverged, match=message) as error:
        train(cfg)
    failed = int(re.search(message, str(error.value)).group(1))  # type: ignore[union-attr]
    state = load_train_state(tmp_path / "nan" / TRAIN_STATE)
    assert state["step"] == failed  # the state after the last iteration that went through
    assert all(torch.isfinite(v).all() for v in state["agent"].values())


def test_fine_tuned_checkpoint_distills_and_evaluates_through_the_cli(
    bc_flow: Path, demos: Path, tmp_path: Path
) -> None:
    result = train(
        small(
            bc_flow,
            tmp_path / "run",
            method="denoising_mdp",
            num_envs=4,
            rollout_steps=20,
            total_steps=80,
            critic_warmup=0,
        )
    )
    out = subprocess.run(
        [
            str(ROBOTRL),
            "policy",
            "distill",
            "--teacher",
            str(result.weights),
            "--store",
            str(demos),
            "--steps",
            "5",
            "--batch-size",
            "16",
            "--eval-episodes",
            "2",
            "--eval-envs",
            "2",
            "--execute",
            "4",
            "--gap-batch",
            "8",
            "--threads",
            "1",
            "--run-dir",
            str(tmp_path / "student"),
            "--no-progress",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
    )
    assert out.returncode == 0, out.stderr
    student = load(tmp_path / "student" / "policy")
    assert student.name == "consistency"
    out = subprocess.run(
        [
            str(ROBOTRL),
            "policy",
            "eval",
            "--policy",
            str(result.weights),
            "--eval-episodes",
            "4",
            "--eval-envs",
            "4",
            "--execute",
            "4",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["episodes"] == 4


def test_the_vla_plugs_into_the_same_loop(tmp_path: Path) -> None:
    """A (small, untrained) VLA on PickPlace: its instruction travels with the observation windows, the chain runs
    through its action expert, and the run ends with a VLA checkpoint whose action expert moved."""
    spec = make("PickPlace", num_envs=1, render_images=False).task_spec
    start = VLAPolicy(spec, VLAConfig(obs_keys=("state",), width=32, depth=1, heads=2, action_horizon=4, steps=2))
    start.save(tmp_path / "vla")
    cfg = OnlineConfig(
        policy=tmp_path / "vla",
        method="flow_noise",
        num_envs=2,
        rollout_steps=8,
        execute=4,
        total_steps=32,
        critic_warmup=0,
        eval_episodes=0,
        checkpoint_every=16,
        run_dir=tmp_path / "run",
        progress=False,
    )
    tuned = load(train(cfg).weights)
    assert tuned.name == "vla" and tuned.config.steps == 2
    moved = [name for name, x in tuned.state_dict().items() if not torch.equal(x, start.state_dict()[name])]
    assert any(name.startswith("net.") for name in moved), moved
    state = load_train_state(tmp_path / "run" / TRAIN_STATE)
    instructions = state["windows"]["instruction"]
    assert len(instructions) == 2 and all(isinstance(t, str) and t for t in instructions), instructions
    for method, head in (("latent", "prior"), ("residual", "residual")):
        with pytest.raises(
            ValueError,
            match=rf"OnlineConfig.method: '{method}' trains a {head} of a U-Net flow "
            r"policy; a 'vla' policy has none",
        ):
            FlowAgent(tuned, replace(cfg, method=method), 2)


def test_run_can_pick_its_best_by_another_sampler_than_it_trains(bc_flow: Path, tmp_path: Path) -> None:
    """eval_sampler_steps 1: the kept checkpoint's recorded success is its one-step sampler's (it reproduces with
    one Euler step on the same seeds), and the saved weights still sample with the run's own chain."""
    result = train(
        small(bc_flow, tmp_path / "run", total_steps=1_920, eval_every=960, eval_episodes=50, eval_sampler_steps=1)
    )
    assert result.best is not None and result.best_weights is not None
    kept = load(result.best_weights)
    assert kept.config.steps == 5 and load(result.weights).config.steps == 5
    own = evaluate_policy(kept, 50, 25, execute=4).success_rate
    kept.config.steps = 1
    assert evaluate_policy(kept, 50, 25, execute=4).success_rate == result.best["success_rate"] != own


def test_bad_configs_and_checkpoints_are_refused(bc_flow: Path, tmp_path: Path) -> None:
    for overrides, message in (
        (
            {"method": "ddpo"},
            r"OnlineConfig.method: expected one of \('denoising_mdp', 'flow_sde', 'flow_noise', 'ode_noise', "
            r"'latent', 'residual'\), got 'ddpo'",
        ),
        ({"prior_bound": 0.0}, r"OnlineConfig.prior_bound: expected > 0, got 0.0"),
        ({"residual_bound": -1.0}, r"OnlineConfig.residual_bound: expected > 0, got -1.0"),
        ({"ratio": "token"}, r"OnlineConfig.ratio: expected 'chain' or 'step', got 'token'"),
        ({"num_envs": 0}, r"OnlineConfig.num_envs: expected >= 1, got 0"),
        ({"sampler_steps": 0}, r"OnlineConfig.sampler_steps: expected >= 1, got 0"),
        ({"clip": 0.0}, r"OnlineConfig.clip: expected > 0, got 0.0"),
        ({"noise_min": 0.6}, r"OnlineConfig.noise_min / noise_max: expected 0 < noise_min < noise_max, got 0.6, 0.5"),
        (
            {"method": "flow_noise", "noise_std": 0.6},
            (
                r"OnlineConfig.noise_std: expected the initial std inside \(noise_min, noise_max\) = \(0.02, 0.5\) "
                r"for flow_noise, got 0.6"
            ),
        ),
        ({"gamma": 0.0}, r"OnlineConfig.gamma / gae_lambda: expected \(0, 1\] and \[0, 1\], got 0.0, 0.9"),
        ({"critic_warmup": -1}, r"OnlineConfig.critic_warmup: expected >= 0, got -1"),
        ({"dense_scale": 0.0}, r"OnlineConfig.dense_scale: expected \(0, 1\], got 0.0"),
        ({"ema": 1.0}, r"OnlineConfig.ema: expected a decay in \[0, 1\), got 1.0"),
        (
            {"eval_sampler_steps": 0},
            r"OnlineConfig.eval_sampler_steps: expected >= 1 \(or None: the policy's own\), "
            r"got 0",
        ),
        ({"device": "gpu"}, r"OnlineConfig.device: expected a torch device such as 'cpu' or 'cuda', got 'gpu'"),
        (
            {"device": f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"},
            r"OnlineConfig.device: expected a (device this machine has|GPU index below)",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            small(bc_flow, tmp_path, **overrides)
    with pytest.raises(ValueError, match=r"OnlineConfig.resume: needs run_dir"):
        OnlineConfig(policy=bc_flow, resume=True)
    once = small(bc_flow, tmp_path / "once", num_envs=2, rollout_steps=4, total_steps=8)
    train(once)
    with pytest.raises(
        FileExistsError, match=r"OnlineConfig.run_dir: .*once already holds a run \(train_state.safetensors\)"
    ):
        train(once)
    # a checkpoint of another policy type, and a directory that is no checkpoint at all
    flow = load(bc_flow)
    diffusion = DiffusionPolicy(flow.spec, DiffusionConfig(channels=(32, 64), action_horizon=8), flow.stats)
    diffusion.save(tmp_path / "diffusion")
    with pytest.raises(
        ValueError,
        match=r"OnlineConfig.policy: expected a flow policy checkpoint \(robotrl train bc "
        r"policy:flow\), got a 'diffusion' policy at .*diffusion",
    ):
        train(small(tmp_path / "diffusion", tmp_path / "run"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        train(small(tmp_path / "empty", tmp_path / "run2"))
    out = subprocess.run(
        [
            str(ROBOTRL),
            "train",
            "online",
            "--policy",
            str(tmp_path / "diffusion"),
            "--run-dir",
            str(tmp_path / "run3"),
            "--no-progress",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=ONE_THREAD,
    )
    assert out.returncode == 2 and "got a 'diffusion' policy" in out.stderr, out.stderr


def test_best_checkpoint_of_an_env_without_success_is_kept_by_return(tmp_path: Path) -> None:
    """In an env that reports no success the kept weights are chosen by the mean return and recorded under that
    name, never as a success rate; the run's summary says so."""
    from robotrl.envs.rollouts import EpisodeStats
    from robotrl.training.loop import RLResult

    saved: list[Path] = []
    keeper = BestCheckpoint(tmp_path, saved.append)
    no_success = EpisodeStats(
        np.array([False, False]), np.array([-3.0, -5.0]), np.array([60, 60]), reports_success=False
    )
    assert no_success.by == "mean_return" and no_success.score == -4.0
    assert keeper.offer(100, no_success.score, no_success.by) and keeper.best() == {"step": 100, "mean_return": -4.0}
    assert not keeper.offer(200, -4.5, "mean_return") and keeper.offer(300, -1.0, "mean_return")
    assert keeper.best() == {"step": 300, "mean_return": -1.0} and len(saved) == 2
    result = RLResult(tmp_path / "w", 400, 1.0, None, None, tmp_path, best_weights=keeper.path, best=keeper.best())
    assert "best evaluated mean return -1.00 at 300" in result.summary("sac", 10)
