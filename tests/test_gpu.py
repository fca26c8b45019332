"""The GPU lane: what only an accelerator runs at its real scale -- the MJX backend with thousands of envs, PPO with
rollout and update on the device, and BC, online RL and distillation with `--device cuda` -- each held to the same
learning claim as its CPU test.

Excluded from the default suite (marker `gpu`); `bash bench/gpu_tests.sh` runs the lane on a GPU machine (the device
tool's, or any with CUDA torch and CUDA JAX) and keeps its claims (tests/conftest.py's `claim`) as JSON lines. On a
machine without a GPU every test skips naming what it lacks; `ROBOTRL_GPU_TESTS_ON_CPU=1` runs the lane's code paths
on the CPU at a small scale instead (a dry run of the script and the tests, not of their claims).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl.datasets.record import record_expert
from robotrl.policies import FlowConfig, load
from robotrl.training.evaluate import evaluate_policy

pytestmark = pytest.mark.gpu
ON_CPU = bool(os.environ.get("ROBOTRL_GPU_TESTS_ON_CPU"))


@pytest.fixture(scope="module")
def device() -> str:
    """The torch device of the lane: "cuda", or "cpu" for a dry run."""
    if torch.cuda.is_available():
        return "cuda"
    if ON_CPU:
        return "cpu"
    pytest.skip("no CUDA device for torch (bench/gpu_tests.sh runs the gpu lane on a GPU machine)")


@pytest.fixture(scope="module")
def jax_platform() -> str:
    """The platform JAX runs MJX on: "gpu", or "cpu" for a dry run."""
    import jax

    platform = jax.devices()[0].platform
    if platform == "gpu" or ON_CPU:
        return platform
    pytest.skip(f"JAX runs on {platform}, not a GPU (bench/gpu_tests.sh runs the gpu lane on a GPU machine)")


def scale(gpu: int, cpu: int) -> int:
    return cpu if ON_CPU else gpu


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demos") / "reach.zarr"
    record_expert(path, "Reach", episodes=40, num_envs=8, noise=0.3, progress=False).close()
    return path


def test_mjx_backend_steps_thousands_of_envs_on_the_device(jax_platform: str) -> None:
    """4,096 Quadruped envs on MJX, observations handed to torch on the device without a copy: finite states, the
    episodes' auto-reset, and the first steps of an env equal to the CPU backend's from the same state."""
    from robotrl.envs import make

    n = scale(4096, 8)
    env = make("Quadruped", num_envs=n, backend="mjx", output="torch", seed=0)
    obs, _ = env.reset(seed=0)
    want = "cuda" if jax_platform == "gpu" else "cpu"
    assert all(v.device.type == want for v in obs.values() if isinstance(v, torch.Tensor))
    rng = np.random.default_rng(0)
    shape = (n, *env.task_spec.action.shape)
    for _ in range(scale(600, 60)):  # past the 500-step episode: every env auto-resets once
        obs, reward, terminated, truncated, _ = env.step(torch.as_tensor(rng.uniform(-1, 1, shape), device=want))
        assert all(torch.isfinite(v).all() for v in obs.values() if isinstance(v, torch.Tensor))
    assert torch.isfinite(reward).all()


def test_mjx_ppo_learns_reach_on_the_device(jax_platform: str, tmp_path: Path, claim) -> None:
    """PPO with rollout and update on the device (robotrl/ppo_mjx.py), 4,096 envs: the CPU test's claim (>= 80% on
    held-out Reach episodes, evaluated by the torch agent on the CPU backend) at GPU scale."""
    from robotrl.rl.ppo import PpoConfig
    from robotrl.rl.ppo_mjx import train

    n = scale(4096, 32)
    result = train(
        PpoConfig(
            task="Reach",
            backend="mjx",
            num_envs=n,
            rollout_steps=scale(16, 64),
            total_steps=scale(4096 * 16 * 30, 40_960),
            minibatches=scale(16, 4),
            eval_episodes=40,
            run_dir=tmp_path / "run",
            progress=False,
        )
    )
    assert result.success_rate is not None
    claim(
        "MJX PPO success on Reach",
        result.success_rate,
        lower=0.8,
        env_steps=result.steps,
        steps_per_second=result.steps_per_second,
    )


def test_bc_on_the_device_learns_reach_and_saves_cpu_tensors(
    device: str, reach_demos: Path, tmp_path: Path, claim
) -> None:
    """`robotrl train bc --device cuda`: the CPU test's claim (tests/policies/test_bc.py) from the same demos, and a
    checkpoint that a CPU-only machine loads and evaluates to the same success."""
    from robotrl.stages.bc import BCConfig, train

    result = train(
        BCConfig(
            store=reach_demos,
            policy=FlowConfig(channels=(32, 64), action_horizon=8),
            steps=1000,
            batch_size=64,
            warmup=10,
            ema=0.99,
            execute=4,
            lr=3e-4,
            eval_episodes=100,
            eval_envs=25,
            device=device,
            run_dir=tmp_path / "bc",
            progress=False,
            threads=1,
        )
    )
    assert result.success_rate is not None
    claim("BC success on the device", result.success_rate, lower=0.85)
    policy = load(result.checkpoint)
    assert all(t.device.type == "cpu" for t in policy.state_dict().values())
    assert evaluate_policy(policy, 100, 25, execute=4).success_rate == result.success_rate


def test_online_rl_and_distillation_on_the_device(device: str, reach_demos: Path, tmp_path: Path, claim) -> None:
    """`robotrl train online --device cuda` (Flow-SDE) raises a half-trained Reach policy as its CPU test does, and
    `robotrl policy distill --device cuda` gives a one-step student within 2 points of that teacher."""
    from robotrl.flowrl.chain import load_flow_policy
    from robotrl.flowrl.online import OnlineConfig, train as train_online
    from robotrl.stages.bc import BCConfig, train as train_bc
    from robotrl.stages.distill import DistillConfig, distill

    start = train_bc(
        BCConfig(
            store=reach_demos,
            policy=FlowConfig(channels=(32, 64), action_horizon=8),
            steps=400,
            batch_size=32,
            warmup=10,
            ema=0.99,
            execute=4,
            lr=3e-4,
            eval_episodes=0,
            run_dir=tmp_path / "bc",
            progress=False,
            threads=1,
        )
    ).checkpoint
    before = evaluate_policy(load_flow_policy(start, 5), 100, 25, execute=4).success_rate
    online = train_online(
        OnlineConfig(
            policy=start,
            method="flow_sde",
            num_envs=16,
            rollout_steps=60,
            execute=4,
            sampler_steps=5,
            total_steps=scale(28_800, 1_920),
            eval_episodes=100,
            checkpoint_every=960,
            log_every=960,
            device=device,
            run_dir=tmp_path / "online",
            progress=False,
        )
    )
    assert online.success_rate is not None
    if not ON_CPU:
        claim(
            "online gain on the device",
            online.success_rate - before,
            lower=0.15,
            before=before,
            after=online.success_rate,
        )
    student = distill(
        DistillConfig(
            teacher=online.weights,
            store=reach_demos,
            steps=scale(300, 20),
            batch_size=64,
            warmup=20,
            ema=0.99,
            execute=4,
            eval_episodes=0,
            device=device,
            run_dir=tmp_path / "distill",
            progress=False,
            threads=1,
        )
    )
    rate = evaluate_policy(load(student), 100, 25, execute=4).success_rate
    if not ON_CPU:
        claim("student - teacher on the device", abs(rate - online.success_rate), upper=0.02)
