"""The MJX backend: gymnasium semantics, determinism, randomization, latency, DLPack output and input errors.

Compiling an MJX step takes tens of seconds on a CPU, so every test here uses envs of one configuration
(Reach, 4 envs, 5-step episodes, model randomization, latency and observation noise): envs of the same
configuration share their compiled programs, whatever their `output`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from robotrl.envs import Randomization, make_task
from robotrl.envs.mjx import MjxVectorEnv

N = 4
EPISODE = 5
RAND = Randomization(
    mass=(0.5, 1.5), damping=(0.5, 2.0), actuator_gain=(0.7, 1.3), latency_steps=(0, 2), obs_noise=0.01
)


def make_env(output: str = "numpy") -> MjxVectorEnv:
    return MjxVectorEnv(make_task("Reach", episode_steps=EPISODE), N, RAND, seed=0, output=output)


@pytest.fixture(scope="module")
def env() -> MjxVectorEnv:
    return make_env()


def uniform_state(env: MjxVectorEnv, latency: list[int] | None = None) -> None:
    """Every env in env 0's physics state with env 0's model fields (and the given latencies)."""
    s = env.get_state()
    env.set_state({k: np.repeat(v[:1], N, axis=0) for k, v in s.items()})
    st = env.state
    fields = {k: jnp.broadcast_to(v[:1], v.shape) for k, v in st.fields.items()}
    lat = jnp.asarray(latency if latency is not None else [0] * N, jnp.int32)
    env._state = st._replace(fields=fields, latency=lat)


def test_reset_matches_spaces_and_is_deterministic_per_seed(env: MjxVectorEnv) -> None:
    a, info = env.reset(seed=7)
    assert set(a) == {"state"} and a["state"].shape == (N, 23) and a["state"].dtype == np.float32
    assert env.observation_space.contains(a) and info == {}
    b, _ = env.reset(seed=7)
    c, _ = env.reset(seed=8)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert not np.allclose(a["state"], c["state"])
    assert len({tuple(r) for r in a["state"][:, 17:20].round(4)}) == N  # each env its own target
    np.testing.assert_array_equal(np.asarray(env.state.steps), 0)


def test_truncation_and_same_step_autoreset(env: MjxVectorEnv) -> None:
    env.reset(seed=0)
    zero = np.zeros((N, 3), np.float32)
    for _ in range(EPISODE - 1):
        obs, reward, term, trunc, info = env.step(zero)
        assert not trunc.any() and not term.any() and "final_obs" not in info
        assert reward.shape == (N,) and info["success"].shape == (N,) and info["success"].dtype == bool
    goal_before = env.frame().goal.copy()
    obs, reward, term, trunc, info = env.step(zero)
    assert trunc.all() and not term.any()
    assert info["_final_obs"].all()
    # the final observation belongs to the old episode, the returned one to the new one
    np.testing.assert_allclose(info["final_obs"]["state"][:, 17:20], goal_before, atol=0.1)
    assert not np.allclose(obs["state"][:, 17:20], goal_before, atol=1e-3)
    np.testing.assert_array_equal(np.asarray(env.state.steps), 0)
    _, _, _, trunc, info = env.step(zero)
    assert not trunc.any() and "final_obs" not in info


def test_divergence_terminates_with_zero_reward_and_resets(env: MjxVectorEnv) -> None:
    env.reset(seed=0)
    s = env.get_state()
    nq = env.task.model.nq
    s["physics"][1, 1 + nq : 1 + 2 * nq] = 1e300  # env 1 flies apart
    env.set_state(s)
    obs, reward, term, trunc, info = env.step(np.zeros((N, 3), np.float32))
    assert term[1] and info["diverged"][1] and reward[1] == 0.0 and info["_final_obs"][1]
    assert not term[[0, 2, 3]].any() and np.isfinite(obs["state"]).all()


def test_randomization_changes_per_env_dynamics(env: MjxVectorEnv) -> None:
    env.reset(seed=1)
    mass = np.asarray(env.state.fields["body_mass"])
    assert len({round(float(m), 6) for m in mass[:, 1]}) == N  # a mass scale per env
    act = np.full((N, 3), 0.8, np.float32)

    def spread_after_steps(same_model: bool) -> float:
        env.reset(seed=1)
        fields = env.state.fields
        uniform_state(env)
        if not same_model:
            env._state = env.state._replace(fields=fields)
        for _ in range(3):
            env.step(act)
        q = np.asarray(env.state.data.qpos)
        return float(np.abs(q - q[:1]).max())

    assert spread_after_steps(same_model=True) < 1e-6
    assert spread_after_steps(same_model=False) > 1e-3


def test_latency_delays_actions(env: MjxVectorEnv) -> None:
    env.reset(seed=2)
    uniform_state(env, latency=[0, 2, 0, 2])
    a = np.array([0.9, -0.6, 0.5], np.float32)
    zero = np.zeros(3, np.float32)
    # envs 0 and 2 (no delay) get 0, 0, a; envs 1 and 3 (2 steps late) get a, -a, -a and so apply 0, 0, a
    plan = [(zero, a), (zero, -a), (a, -a)]
    for now, late in plan:
        env.step(np.stack([now, late, now, late]))
    q = np.asarray(env.state.data.qpos)
    np.testing.assert_allclose(q[1], q[0], atol=1e-5)
    # without the delay, env 1 would have moved differently
    env.reset(seed=2)
    uniform_state(env, latency=[0, 0, 0, 0])
    for now, late in plan:
        env.step(np.stack([now, late, now, late]))
    q2 = np.asarray(env.state.data.qpos)
    assert np.abs(q2[1] - q2[0]).max() > 1e-3


def test_torch_output_shares_memory_through_dlpack() -> None:
    env = make_env("torch")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["state"], torch.Tensor) and obs["state"].shape == (N, 23)
    obs, reward, term, trunc, info = env.step(torch.zeros(N, 3))
    assert all(isinstance(x, torch.Tensor) for x in (obs["state"], reward, term, trunc, info["success"]))
    assert term.dtype == torch.bool
    x = env.state.obs["state"]
    t = env._out(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer()  # zero-copy: the tensor views the JAX buffer
    np.testing.assert_array_equal(t.cpu().numpy(), np.asarray(x))


def test_jax_output_and_functional_core() -> None:
    env = make_env("jax")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["state"], jax.Array)
    state = env.state
    no_reset = jnp.zeros(N, bool)  # the compiled step, shared with the other envs of this configuration
    s1, o1, r1, *_ = env.run_jit("core", state, jnp.zeros((N, 3)), no_reset)
    s2, o2, r2, *_ = env.run_jit("core", state, jnp.zeros((N, 3)), no_reset)
    np.testing.assert_array_equal(np.asarray(o1["state"]), np.asarray(o2["state"]))  # pure: same in, same out
    assert int(s1.steps[0]) == 1 and int(state.steps[0]) == 0


def test_bad_inputs_are_errors(env: MjxVectorEnv) -> None:
    with pytest.raises(RuntimeError, match="reset"):
        make_env().step(np.zeros((N, 3), np.float32))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((N, 4), np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((N - 1, 3), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        env.step(np.full((N, 3), "a"))
    bad = np.zeros((N, 3), np.float32)
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"\[2\]"):
        env.step(bad)
    with pytest.raises(ValueError, match="output"):
        MjxVectorEnv(make_task("Reach"), 2, output="cupy")
    with pytest.raises(ValueError, match="reward_type"):
        MjxVectorEnv(make_task("Reach"), 2, reward_type="shaped")
