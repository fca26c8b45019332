"""gymnasium integration: registration, the single-env wrapper and gymnasium's own env checker on every task."""

import importlib
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import robotrl.envs
from robotrl.envs import list_tasks, make
from robotrl.envs.gym_env import RobotEnv
from robotrl.envs.registration import env_id
from robotrl.envs.tasks import TASKS


def require_task(name: str) -> None:
    """Skip (with a visible reason) a task whose module another engineer has not landed yet."""
    module = TASKS[name].split(":")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name == module:
            pytest.skip(f"{module} does not exist yet")
        raise


def check_env_quietly(env, **kwargs):
    """gymnasium's checker; its note on unbounded state boxes is expected (joint velocities have no bounds)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Box observation space (minimum|maximum) value.*")
        check_env(env.unwrapped, **kwargs)


@pytest.mark.parametrize("task", list_tasks())
def test_gymnasium_env_checker_passes(task):
    require_task(task)
    env = gym.make(env_id(task), render_mode="rgb_array", width=96, height=64)
    check_env_quietly(env)
    env.reset(seed=0)
    assert env.render().shape == (64, 96, 3)
    env.close()


def test_every_task_is_registered_on_import():
    assert {env_id(t) for t in list_tasks()} <= set(gym.registry)
    assert env_id("Reach") == "robotrl/Reach-v0"


@pytest.mark.parametrize("name", ["robotrl/Reach-v0", "robotrl.envs:robotrl/Reach-v0"])
def test_gym_make_in_a_fresh_interpreter(name):
    prelude = "import robotrl.envs; " if ":" not in name else ""
    code = f"{prelude}import gymnasium as gym; e = gym.make({name!r}); o, _ = e.reset(seed=0); print(o['state'].shape)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(23,)"


def test_single_env_follows_the_vector_backend_exactly():
    single = gym.make("robotrl/Reach-v0", episode_steps=5)
    vec = make("Reach", num_envs=1, autoreset=False, episode_steps=5)
    o1, _ = single.reset(seed=3)
    o2, _ = vec.reset(seed=3)
    np.testing.assert_array_equal(o1["state"], o2["state"][0])
    rng = np.random.default_rng(0)
    for t in range(5):
        a = rng.uniform(-1, 1, 3).astype(np.float32)
        o1, r1, term1, trunc1, info = single.step(a)
        o2, r2, term2, trunc2, _ = vec.step(a[None])
        np.testing.assert_array_equal(o1["state"], o2["state"][0])
        assert r1 == r2[0] and isinstance(r1, float) and isinstance(info["success"], bool)
        assert trunc1 == (t == 4) == trunc2[0] and not term1
    single.close()
    vec.close()


def test_options_reach_the_task_and_backend():
    env = gym.make("robotrl/Reach-v0", action_mode="joint_pos", reward_type="sparse")
    assert env.action_space.shape == (7,)
    env.reset(seed=0)
    _, reward, *_ = env.step(np.zeros(7, np.float32))
    assert reward in (0.0, 1.0)


def test_errors_name_the_field():
    env = RobotEnv("Reach")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action: expected shape \(3,\), got \(2,\)"):
        env.step(np.zeros(2))
    with pytest.raises(ValueError, match="num_envs"):
        RobotEnv("Reach", num_envs=4)
    with pytest.raises(ValueError, match="render_mode"):
        RobotEnv("Reach", render_mode="human")
    with pytest.raises(ValueError, match="unknown task 'Reech'.*Did you mean 'Reach'"):
        RobotEnv("Reech")


def test_make_vec_uses_the_batched_backend():
    env = gym.make_vec("robotrl/Reach-v0", num_envs=3, vectorization_mode="vector_entry_point")
    assert isinstance(env, robotrl.envs.cpu.CpuVectorEnv) and env.num_envs == 3
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (3, 23)
    env.close()


def test_without_images_the_space_has_no_image_keys():
    require_task("PickPlace")
    env = gym.make("robotrl/PickPlace-v0", render_images=False)
    assert not [k for k in env.observation_space.spaces if k.startswith("image_")]
    check_env_quietly(env, skip_render_check=True)
