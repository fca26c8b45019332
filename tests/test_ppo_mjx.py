"""PPO with the rollout and the update on the accelerator (robotrl/rl/ppo_mjx.py), on CPU JAX: learns Reach on the
MJX backend, resumes exactly after a SIGKILL, stops on a NaN loss keeping the last good train state, agrees with
the torch PPO (GAE, loss, gradients, actions of the exported agent) and refuses bad configs.

The MJX runs go through the CLI in subprocesses started with `CPU_XLA_FLAGS` (XLA's CPU fusion makes MJX ~300x
slower; the suite's conftest.py sets it for the test process before JAX starts, and they inherit it) and this suite's
persistent compilation cache: every exactness run here has the same program-shaping config (`MJX_ARGS`, small
envs: compiling costs the same at any size), so the first one compiles and the others, resumed runs included, load
it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from robotrl.policies import load
from robotrl.rl import ppo_mjx
from robotrl.rl.ppo import PpoAgent, PpoConfig, gae, ppo_loss
from robotrl.training.evaluate import evaluate_policy, evaluate_state_actor
from robotrl.training.loop import TRAIN_STATE, load_train_state

ROBOTRL = Path(sys.executable).parent / "robotrl"
N, HORIZON = 32, 64  # the learning run: one iteration = 2,048 env steps
#: the exactness runs (resume, NaN): 128 env steps an iteration; compiling costs the same at any size
SMALL_N, SMALL_HORIZON = 8, 16
TASK_ARGS = ["train", "ppo", "--backend", "mjx", "--task", "Reach", "--no-progress"]
MJX_ARGS = [*TASK_ARGS, "--num-envs", str(SMALL_N), "--rollout-steps", str(SMALL_HORIZON)]


@pytest.fixture(scope="module")
def mjx_subprocesses() -> Iterator[None]:
    """Subprocesses started in this module get this suite's compilation cache (and the CPU flags, conftest.py)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JAX_COMPILATION_CACHE_DIR", str(jax.config.jax_compilation_cache_dir))
        env.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
        yield


def run_cli(*args: str, check: bool = True, sizes: list[str] = MJX_ARGS) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(ROBOTRL), *sizes, *args], capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"robotrl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def budget(iterations: int, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--total-steps",
        str(SMALL_N * SMALL_HORIZON * iterations),
        "--checkpoint-every",
        str(SMALL_N * SMALL_HORIZON),
        "--eval-episodes",
        "0",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


@pytest.fixture(scope="module")
def straight(mjx_subprocesses: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of three iterations never stopped: what the resumed run must equal, and a good train state to blow up."""
    run_dir = tmp_path_factory.mktemp("mjx") / "straight"
    run_cli(*budget(3, run_dir))
    return run_dir


# slow on CPU JAX (the gpu lane's tests/test_gpu.py learns it on a GPU); the default suite checks its GAE, loss,
# gradients and actions equal the torch PPO's, which learns Reach in tests/test_ppo.py
@pytest.mark.slow
@pytest.mark.learning
def test_ppo_mjx_learns_reach(tmp_path: Path, mjx_subprocesses: None, claim, learning_seed: int) -> None:
    """40,960 env steps (20 iterations): from the untrained agent to a high success on 40 held-out episodes (seeds
    0-4: bench/RESULTS.md, "Learning tests"), evaluated on the CPU backend; the saved policy, loaded as any
    registered policy, succeeds on the very episodes the run's own evaluation did."""
    cfg = PpoConfig(task="Reach", num_envs=N, rollout_steps=HORIZON)
    torch.manual_seed(learning_seed)
    start = evaluate_state_actor(PpoAgent(23, 3, cfg).act, "Reach", ("state",), 40, 25).success_rate
    run_cli(
        "--num-envs",
        str(N),
        "--rollout-steps",
        str(HORIZON),
        "--total-steps",
        "40960",
        "--eval-episodes",
        "40",
        "--run-dir",
        str(tmp_path / "run"),
        "--seed",
        str(learning_seed),
        sizes=TASK_ARGS,
    )
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    success = evaluate_policy(load(result["weights"]), 40, 25).success_rate
    assert success == result["success_rate"]  # the run's own evaluation ran the same actor
    claim("MJX PPO success", success, lower=0.8, start=start)
    claim("MJX PPO gain", success - start, lower=0.6)


def test_killed_run_resumes_exactly(tmp_path: Path, straight: Path, kill_after_first_train_state) -> None:
    killed = tmp_path / "killed"
    step = kill_after_first_train_state(
        [str(ROBOTRL), *MJX_ARGS, *budget(3, killed)], killed / TRAIN_STATE, timeout=600
    )
    assert 1 <= step < 3, step
    cache = Path(jax.config.jax_compilation_cache_dir)
    programs = set(cache.glob("jit_iteration-*"))
    run_cli(*budget(3, killed, "--resume"))
    # the restored state has the fresh state's types and placement: resuming loads the compiled program
    assert set(cache.glob("jit_iteration-*")) == programs, "the resumed run compiled its iteration again"
    a, b = (load(run / "policy").state_dict() for run in (straight, killed))
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    sa = load_train_state(straight / TRAIN_STATE)["state"]
    sb = load_train_state(killed / TRAIN_STATE)["state"]
    for name in sa:  # Adam moments, normalizer, env physics mid-episode, PRNG keys
        assert torch.equal(sa[name], sb[name]), name


def test_nan_loss_stops_and_keeps_the_last_good_train_state(tmp_path: Path, straight: Path) -> None:
    run_dir = shutil.copytree(straight, tmp_path / "nan")  # the straight run goes on serving the resume test
    before = load_train_state(run_dir / TRAIN_STATE)
    # one iteration more at a learning rate that blows the weights up: both changes named
    proc = run_cli(
        *budget(4, run_dir, "--resume", "--resume-changes", "lr", "total_steps", "--lr", "1e30"), check=False
    )
    assert proc.returncode != 0
    assert "TrainingDiverged: ppo (mjx) iteration 3: loss or weights are not finite" in proc.stderr, proc.stderr[-2000:]
    after = load_train_state(run_dir / TRAIN_STATE)
    assert after["step"] == before["step"] == 3
    for name, v in after["state"].items():
        assert torch.equal(v, before["state"][name]), name
        assert not v.is_floating_point() or torch.isfinite(v).all(), name


def test_gae_agrees_with_the_torch_ppo() -> None:
    rng = np.random.default_rng(0)
    t, n = 12, 5
    reward, value = rng.normal(size=(t, n)).astype(np.float32), rng.normal(size=(t, n)).astype(np.float32)
    done = (rng.random((t, n)) < 0.2).astype(np.float32)
    last = rng.normal(size=n).astype(np.float32)
    ours = ppo_mjx.gae(*(jnp.asarray(x) for x in (reward, value, done, last)), 0.97, 0.9)
    oracle = gae(*(torch.from_numpy(x) for x in (reward, value, done, last)), gamma=0.97, lam=0.9)
    np.testing.assert_allclose(np.asarray(ours), oracle.numpy(), rtol=1e-5, atol=1e-5)


def random_agent(config: PpoConfig, obs_dim: int = 23, action_dim: int = 3) -> PpoAgent:
    """A PpoAgent with every weight and the normalizer moved away from their initial values."""
    torch.manual_seed(1)
    agent = PpoAgent(obs_dim, action_dim, config)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
        agent.norm.update(3.0 + 2.0 * torch.randn(64, obs_dim))
    return agent


def test_jax_policy_and_loss_agree_with_the_torch_agent() -> None:
    cfg = PpoConfig(hidden=(64, 32), value_clip=0.2, entropy_coef=0.01)
    agent = random_agent(cfg)
    params, norm = ppo_mjx.agent_to_jax(agent.state_dict())
    back = ppo_mjx.agent_from_jax(params, norm)  # the PpoAgent's state dict, both ways
    assert set(back) == set(agent.state_dict())
    for name, v in agent.state_dict().items():  # weights exactly; the float64 normalizer through float32
        torch.testing.assert_close(back[name], v, rtol=1e-6 if name.startswith("norm.") else 0, atol=0, msg=name)
    obs = np.random.default_rng(0).normal(3.0, 4.0, (50, 23)).astype(np.float32)

    np.testing.assert_allclose(
        np.asarray(ppo_mjx.act(params, norm, jnp.asarray(obs), True)), agent.act(obs), rtol=1e-5, atol=1e-5
    )
    x = ppo_mjx.features(norm, jnp.asarray(obs), True)
    torch_value = agent.value(torch.from_numpy(obs)).detach().numpy()
    np.testing.assert_allclose(np.asarray(ppo_mjx.value(params, x)), torch_value, rtol=1e-5, atol=1e-5)

    # the minibatch loss and its gradient, on the same batch
    g = torch.Generator().manual_seed(2)
    batch = {
        "obs": torch.from_numpy(obs),
        "action": torch.randn(50, 3, generator=g),
        "logp": torch.randn(50, generator=g) - 3,
        "value": torch.randn(50, generator=g),
        "adv": torch.randn(50, generator=g),
        "ret": torch.randn(50, generator=g),
    }
    loss, stats = ppo_loss(agent, batch, cfg)
    loss.backward()
    (jloss, jstats), grads = jax.value_and_grad(ppo_mjx.ppo_loss, has_aux=True)(
        params, norm, {k: jnp.asarray(v.numpy()) for k, v in batch.items()}, cfg
    )
    assert float(jloss) == pytest.approx(loss.item(), rel=1e-5)
    for k, v in stats.items():
        assert float(jstats[k]) == pytest.approx(v, rel=1e-4, abs=1e-6), k
    pairs = (
        (grads["actor"][0][0].T, agent.actor[0].weight),
        (grads["critic"][-1][1], agent.critic[-1].bias),
        (grads["log_std"], agent.log_std),
    )
    for ours, theirs in pairs:
        np.testing.assert_allclose(np.asarray(ours), theirs.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_normalizer_agrees_with_running_norm() -> None:
    agent = random_agent(PpoConfig())
    _, norm = ppo_mjx.agent_to_jax(agent.state_dict())
    x = np.random.default_rng(3).normal(-1.0, 0.5, (40, 23)).astype(np.float32)
    agent.norm.update(torch.from_numpy(x))
    ours = ppo_mjx.update_norm(norm, jnp.asarray(x))
    for k in ("mean", "var", "count"):
        np.testing.assert_allclose(np.asarray(getattr(ours, k)), getattr(agent.norm, k).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:ppo \\(mjx\\) on the CPU")
def test_bad_configs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"PpoConfig.backend: expected 'cpu' or 'mjx', got 'gpu'"):
        PpoConfig(backend="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PpoConfig.obs_keys: \['nope'\] are not numeric state observations of Reach"):
        ppo_mjx.train(
            PpoConfig(task="Reach", backend="mjx", obs_keys=("nope",), run_dir=tmp_path / "keys", progress=False)
        )
    with pytest.raises(FileNotFoundError, match="train_state.safetensors does not exist"):
        ppo_mjx.train(PpoConfig(task="Reach", backend="mjx", resume=True, run_dir=tmp_path / "none", progress=False))
    template = {"params['log_std']": torch.zeros(4)}
    state = ppo_mjx.TrainState(
        {"log_std": jnp.zeros(3)},
        (),
        ppo_mjx.Norm(*jnp.zeros((3, 1))),
        (),
        jnp.zeros(1),
        jnp.zeros(2, jnp.uint32),
        jnp.zeros(1),
        jnp.zeros(1, bool),
    )
    with pytest.raises(ValueError, match=r"train state: \.params\['log_std'\] missing"):
        ppo_mjx.state_from_tensors(state, template)
    saved = ppo_mjx.state_tensors(state)
    saved[".params['log_std']"] = torch.zeros(4)
    with pytest.raises(ValueError, match=r"train state: \.params\['log_std'\] expected \(3,\) float32, got \(4,\)"):
        ppo_mjx.state_from_tensors(state, saved)


def test_a_brax_env_plugs_in_and_learns() -> None:
    """Brax's `fast` env (reward = position; a positive action accelerates) through `BraxEnv`: same-step reset
    to the first state keeping the final observation, time limits as truncation, and the generic learner lifts the
    deterministic return well above the untrained agent's."""
    envs = pytest.importorskip("brax.envs")
    env = ppo_mjx.BraxEnv(envs.get_environment("fast"), num_envs=4, episode_length=3)
    state, obs = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    for _ in range(3):
        state, out = step(state, jnp.ones((4, 1)))
    assert bool(out.truncated.all()) and not bool(out.terminated.any())
    assert float(out.final_obs[0, 1]) > 0 and np.all(np.asarray(out.obs) == np.asarray(obs))  # back at the start
    state, out = step(state, jnp.ones((4, 1)))
    assert not bool(out.truncated.any())  # the step counter restarted with the episode

    cfg = PpoConfig(num_envs=16, rollout_steps=10, minibatches=4, hidden=(16, 16), lr=3e-3, anneal_lr=False)
    env = ppo_mjx.BraxEnv(envs.get_environment("fast"), num_envs=16, episode_length=10)
    torch.manual_seed(0)
    s = jax.jit(lambda k, a: ppo_mjx.init_state(env, cfg, k, a))(jax.random.PRNGKey(0), ppo_mjx.init_agent(2, 1, cfg))
    evaluate = jax.jit(ppo_mjx.make_evaluator(env, cfg.normalize_obs, 10))
    before = float(evaluate(s.params, s.norm, jax.random.PRNGKey(1))["return"])
    iteration = jax.jit(ppo_mjx.make_iteration(env, cfg))
    for _ in range(15):
        s, metrics = iteration(s, jnp.float32(cfg.lr))
        assert bool(metrics["finite"])
    after = float(evaluate(s.params, s.norm, jax.random.PRNGKey(1))["return"])
    best = sum(0.02 * 0.02 * k * (k + 1) / 2 for k in range(1, 11))  # always accelerating: 0.088
    assert after >= 0.9 * best and after >= before + 0.5 * best, (before, after, best)
