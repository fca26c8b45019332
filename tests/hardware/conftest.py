"""An exported one-step-ish PushT policy (a small flow policy, trained a few steps on real demonstrations), and
a ROS 2 context for in-process node tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rclpy
import torch

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies.export import export
from robotrl.policies.flow import FlowConfig, FlowPolicy
from robotrl.policies.timing import torch_threads

#: what an image policy must see in the camera rather than read from PushT's state
HIDDEN = ("block_pose", "block_vel", "pose_error", "tool_in_block", "coverage")


def small_flow(store: EpisodeStore, steps: int = 5, **options: object) -> FlowPolicy:
    torch.manual_seed(0)
    policy = FlowPolicy(
        store.spec,
        FlowConfig(channels=(16, 32), steps=2, action_horizon=8, **options),  # type: ignore[arg-type]
        store.stats(),
    )
    sampler = SequenceSampler.from_store(store, SequenceConfig(action_horizon=8, obs_keys=policy.obs_keys))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        loss = policy.compute_loss(sampler.sample(16, rng))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return policy.eval()


@pytest.fixture(scope="session")
def pusht_export(pusht_demos: EpisodeStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with torch_threads(1):
        return export(small_flow(pusht_demos), tmp_path_factory.mktemp("export") / "flow", "onnx")


@pytest.fixture(scope="session")
def pusht_image_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small image policy (32 px overhead camera + the arm's state) trained a few steps on real demos."""
    root = tmp_path_factory.mktemp("image")
    store = record_expert(
        root / "img.zarr", "PushT", episodes=2, num_envs=2, episode_steps=30, progress=False, images=True, image_size=32
    )
    with torch_threads(1):
        policy = small_flow(store, obs_keys=("image_top", "state"), state_mask_fields=HIDDEN)
        return export(policy, root / "flow", "onnx")


#: Quadruped with episodes short enough for the ROS 2 tests
QUADRUPED_OPTIONS = {"episode_steps": 60}


@pytest.fixture(scope="session")
def quadruped_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """An untrained Gaussian actor of the Quadruped (PPO's kind: a linear mean over normalized observations), its
    output halved, exported; and the task options. On the ROS tests' seeds it falls in some episodes and tracks its
    command on a few steps of others, so that an episode over ROS 2 that differs from the in-process one shows."""
    from robotrl.envs import make
    from robotrl.policies.gaussian import GaussianConfig, GaussianPolicy

    env = make("Quadruped", num_envs=1, **QUADRUPED_OPTIONS)
    torch.manual_seed(0)
    config = GaussianConfig(hidden=(32, 32), squash=False, activation="tanh", layer_norm=False, obs_norm=True)
    policy = GaussianPolicy(env.task_spec, config)
    env.close()
    last = [m for m in policy.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(0.5), last.bias.mul_(0.5)
    with torch_threads(1):
        return export(policy, tmp_path_factory.mktemp("quadruped") / "ppo", "onnx"), QUADRUPED_OPTIONS


#: Reach on example-robot-data's UR5 (its scene composed from the URDF), episodes short for the ROS 2 tests
UR5_OPTIONS = {"robot": "example-robot-data:ur5", "robot_base": [0.2, 0.0, 0.0], "episode_steps": 30}


@pytest.fixture(scope="session")
def ur5_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A small flow policy trained a few steps on the UR5 expert's Reach demos, exported; and the task options."""
    root = tmp_path_factory.mktemp("ur5")
    store = record_expert(root / "ur5.zarr", "Reach", episodes=4, num_envs=4, progress=False, **UR5_OPTIONS)
    with torch_threads(1):
        return export(small_flow(store, steps=20), root / "flow", "onnx"), UR5_OPTIONS


@pytest.fixture
def point_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A user's outside env (tests/envs/outside_envs.py, importable by name here and in the nodes started from
    here): a small chunk-MLP flow policy trained on its demonstrator's episodes, exported; and the env's name."""
    envs = Path(__file__).resolve().parents[1] / "envs"
    monkeypatch.syspath_prepend(str(envs))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(envs), os.environ.get("PYTHONPATH")])))
    task = "outside_envs:make_point?radius=0.1"
    store = record_expert(
        tmp_path / "point.zarr", task, episodes=8, num_envs=4, demonstrator="outside_envs:Demonstrator", progress=False
    )
    with torch_threads(1):
        return export(small_flow(store, steps=300, backbone="mlp"), tmp_path / "flow", "onnx"), task


@pytest.fixture(scope="session")
def nan_export(pusht_demos: EpisodeStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A policy whose every output is NaN (its weights are): what a diverged training run exports."""
    policy = small_flow(pusht_demos, steps=0)
    with torch.no_grad():
        for p in policy.net.parameters():
            p.fill_(float("nan"))
    return export(policy, tmp_path_factory.mktemp("export") / "nan", "onnx", verify=False)


@pytest.fixture(scope="session")
def pickplace_vla_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small VLA (PickPlace state + instruction; it commands the arm and the gripper) trained a few steps on
    real demonstrations of two different instructions, exported."""
    from robotrl.policies.vla import VLAConfig, VLAPolicy

    root = tmp_path_factory.mktemp("vla")
    store = record_expert(
        root / "pp.zarr",
        "PickPlace",
        episodes=2,
        num_envs=2,
        noise=0.0,
        episode_steps=30,
        progress=False,
        render_images=False,
    )
    with torch_threads(1):
        torch.manual_seed(0)
        config = VLAConfig(width=32, depth=1, heads=2, obs_horizon=1, action_horizon=8, steps=2)
        policy = VLAPolicy(store.spec, config, store.stats())
        sampler = SequenceSampler.from_store(store, SequenceConfig(1, 8, policy.obs_keys))
        opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)
        for _ in range(5):
            loss = policy.compute_loss(sampler.sample(16, rng))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return export(policy.eval(), root / "vla", "onnx")


@pytest.fixture
def ros() -> Iterator[None]:
    rclpy.init()
    try:
        yield
    finally:
        rclpy.shutdown()
