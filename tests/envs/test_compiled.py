"""The CPU backend's compiled step code (robotrl/envs/step.py, lowering.py, compiled.py): every task's controls,
observation, reward, termination, blow-ups and time limit equal to its numpy code's, at any number of envs; the
lowering's primitives against JAX's own evaluation; the kernel cache across processes; the backend stepping the
compiled code as it steps the numpy code; and the numpy code kept where a task's code cannot be compiled."""

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from robotrl.envs import make
from robotrl.envs.compiled import CompiledStep, StepArrays, compile_kernel, compile_task, differences
from robotrl.envs.lowering import Unsupported, lower
from robotrl.envs.step import NumpyStep
from robotrl.envs.tasks.reach import Reach

TASKS = ("Reach", "PushT", "Quadruped", "PickPlace")


def stepped(name: str, num_envs: int, steps: int = 12, **options):
    """An env of the numpy step code after `steps` random actions, and the arrays a step reads there (a random action
    batch)."""
    env = make(name, num_envs=num_envs, seed=0, compile_task=False, render_images=False, **options)
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    space = env.action_space
    for _ in range(steps):
        env.step(rng.uniform(space.low, space.high).astype(space.dtype))
    action = rng.uniform(space.low, space.high).astype(np.float64)
    return env, StepArrays(env.frame(), action, env._live().state, env._live().warning)


@pytest.mark.parametrize("name", TASKS)
def test_each_task_compiles_to_its_numpy_results(name):
    env, example = stepped(name, 11)  # 11 envs: a block of 8, then one overlapping it
    task, frame = env.task, env.frame()
    numpy = NumpyStep(task, "dense")
    code = CompiledStep(task, "dense", example)
    assert differences(code, numpy, example) == []  # every output, both sides of each branch
    before = code.before(frame, example.action, example.warning)
    assert before.ctrl.shape == (11, task.model.nu) and before.ctrl.dtype == np.float64
    np.testing.assert_allclose(before.ctrl, task.control(np, frame, example.action), rtol=1e-9, atol=1e-12)
    # a NaN is caught, and clipped into bounds where the numpy code catches it: no NaN reaches the controls
    bad = example.action.copy()
    bad[4, 0] = np.nan
    for step in (numpy, code):
        flagged = step.before(frame, bad, example.warning)
        assert flagged.finite.tolist() == [i != 4 for i in range(11)] and np.isfinite(flagged.ctrl).all()
    # fewer envs than a block (padded), e.g. the envs an auto-reset starts and observes
    draws = np.random.default_rng(3).random((3, task.reset_dims))
    for got, want in zip(code.reset(draws), task.reset(np, draws), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for idx in (np.array([4]), np.array([0, 3, 9])):
        sub = env.frame(idx)
        got, want = code.observe(sub), task.observe(np, sub)
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    env.close()


def test_the_sparse_reward_compiles_to_its_numpy_results():
    env, example = stepped("PushT", 8)
    code = CompiledStep(env.task, "sparse", example)
    assert differences(code, NumpyStep(env.task, "sparse"), example) == []
    after = code.after(env.frame(), example.action, example.rows, example.warning, np.zeros(8, np.int64), env._steps)
    np.testing.assert_array_equal(after.reward, after.success.astype(np.float64))
    env.close()


def test_a_changed_result_is_caught():
    """The check that guards the backend against a wrong kernel sees a task whose results differ."""
    env, example = stepped("Reach", 8)
    code = CompiledStep(env.task, "dense", example)
    other = Reach(type(env.task.config)(success_radius=0.5))  # every env a success: another reward
    assert {"success", "reward"} & set(differences(code, NumpyStep(other, "dense"), example))
    env.close()


def primitives(x, y):
    """A function of (n, 3, 4) and (n, 4) rows that uses each family of primitives the lowering writes as loops."""
    a = jnp.sin(x) * 2.0 + jnp.cos(x[:, :1, :])  # elementwise with a size-1 broadcast
    b = a @ y[:, :, None]  # batched dot_general
    c = jnp.concatenate([b[..., 0], jnp.tanh(y[:, :2])], -1)
    d = jnp.stack([c, -c], 1).reshape(c.shape[0], 10)  # a reshape that moves data
    e = jnp.swapaxes(x, 1, 2)[:, ::2]  # transpose, strided slice
    f = jnp.take(y, jnp.array([3, 0, 2]), axis=-1) - y[:, 1:2]  # gather from constant indices
    g = jnp.where(y > 0, y**2, jnp.abs(y)).sum(-1)
    h = jnp.max(x, axis=(1, 2)) - jnp.min(x, axis=1).mean(-1)
    m = 2.0 * jnp.eye(3) + jnp.einsum("nij,nkj->nik", x, x)
    s = jnp.linalg.solve(m, y[:, :3, None])[..., 0] + jnp.linalg.solve(m, jnp.stack([y[:, 1:], y[:, :3]], -1))[..., 1]
    flags = (jnp.any(x > 0.5, axis=(1, 2)) & ~(g > 1.0)).astype(jnp.float32)
    return {"d": d, "e": e, "f": f, "g": g, "h": h, "s": s, "flags": flags, "positive": y[:, 0] > 0, "const": 0 * g + 1}


@pytest.mark.parametrize("rows", [3, 8, 13])
def test_the_lowering_agrees_with_jax(rows):
    rng = np.random.default_rng(rows)
    block = (rng.normal(size=(8, 3, 4)), rng.normal(size=(8, 4)))
    kernel = compile_kernel(lower(primitives, *block), block)
    x, y = rng.normal(size=(rows, 3, 4)), rng.normal(size=(rows, 4))
    got = kernel(x, y[:, ::1])
    with jax.enable_x64(True):
        want = jax.tree.map(np.asarray, primitives(jnp.asarray(x), jnp.asarray(y)))
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype, key
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
    # a strided view of the envs' arrays (as the backend's bound MuJoCo fields are) reads the same
    wide = np.zeros((rows, 8))
    wide[:, 2:6] = y
    np.testing.assert_allclose(kernel(x, wide[:, 2:6])["s"], want["s"], rtol=1e-9, atol=1e-12)


def test_what_the_lowering_does_not_cover_is_named():
    x = np.zeros((8, 4))
    with pytest.raises(Unsupported, match="sort"):
        lower(lambda a: jnp.sort(a, axis=-1), x)
    with pytest.raises(Unsupported, match="one row per argument row"):
        lower(lambda a: a.sum(), x)


def test_a_kernel_is_compiled_once_per_machine(tmp_path, monkeypatch):
    """The first process compiles and writes the cache; a second one loads the kernel from it."""
    monkeypatch.setenv("ROBOTRL_CACHE_DIR", str(tmp_path))
    script = (
        "import numpy as np, jax.numpy as jnp\n"
        "from robotrl.envs.compiled import compile_kernel\n"
        "from robotrl.envs.lowering import lower\n"
        "x = np.arange(16.0).reshape(8, 2)\n"
        "f = compile_kernel(lower(lambda a: jnp.cos(a) * 2, x), (x,))\n"
        "assert np.allclose(f(x), np.cos(x) * 2)\n"
        "import sys; k = [m for n, m in sys.modules.items() if n.startswith('kernel_')][0].kernel\n"
        "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True) for _ in "ab"]
    kernels = list((tmp_path / "task-kernels").glob("kernel_*.py"))
    assert len(kernels) == 1 and kernels[0].with_suffix(".npz").exists()
    assert [r.stdout.split() for r in runs] == [["0", "1"], ["1", "0"]]  # (cache hits, misses) of each process


@pytest.mark.parametrize("name", ["Quadruped", "PushT"])
def test_the_backend_steps_the_compiled_code_as_the_numpy_code(name):
    """Same seed and actions: the same observations, rewards, ends and auto-resets (Quadruped's falls reset envs)."""
    envs = [make(name, num_envs=10, seed=0, compile_task=c) for c in (False, True)]
    outs = [env.reset(seed=2)[0] for env in envs]
    np.testing.assert_allclose(outs[1]["state"], outs[0]["state"], rtol=1e-5, atol=1e-6)
    assert envs[0]._compiled is None and envs[1]._compiled is not None
    rng = np.random.default_rng(0)
    space = envs[0].action_space
    ends = 0
    for _ in range(60):
        action = rng.uniform(space.low, space.high).astype(space.dtype)
        (o0, r0, te0, tr0, i0), (o1, r1, te1, tr1, i1) = (env.step(action) for env in envs)
        np.testing.assert_allclose(o1["state"], o0["state"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(r1, r0, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(te1, te0)
        np.testing.assert_array_equal(tr1, tr0)
        np.testing.assert_array_equal(i1["success"], i0["success"])
        ends += int(te0.sum())
    assert name != "Quadruped" or ends > 0  # the auto-reset path ran
    for env in envs:
        env.close()


class SortedReach(Reach):
    """Reach with an observation the lowering does not cover (a sort)."""

    def observe(self, xp, frame):
        obs = super().observe(xp, frame)
        return {"state": xp.sort(obs["state"], axis=-1)}


def test_a_task_that_cannot_be_compiled_steps_its_numpy_code():
    env = make(SortedReach(), num_envs=4, seed=0, compile_task=True)
    with pytest.warns(UserWarning, match="SortedReach|Reach: task code not compiled.*sort"):
        obs, _ = env.reset(seed=0)
    assert env.compile_task is False and env._compiled is None
    np.testing.assert_array_equal(obs["state"], np.sort(obs["state"], axis=-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.step(np.zeros((4, *env.task_spec.action.shape), np.float32))  # no second attempt, no second warning
    env.close()


def test_the_switch(monkeypatch):
    monkeypatch.setenv("ROBOTRL_COMPILE_TASK", "0")
    assert make("Reach", num_envs=2).compile_task is False
    monkeypatch.setenv("ROBOTRL_COMPILE_TASK", "1")
    assert make("Reach", num_envs=2).compile_task is True
    assert make("Reach", num_envs=2, compile_task=False).compile_task is False
    with pytest.raises(ValueError, match="compile_task"):
        make("Reach", num_envs=2, backend="mjx", compile_task=True)


def test_compile_task_returns_none_for_code_it_cannot_lower():
    env, example = stepped("Reach", 8, steps=1)
    with pytest.warns(UserWarning, match="not compiled"):
        assert compile_task(SortedReach(), "dense", example) is None
    env.close()
