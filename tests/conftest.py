"""Suite-wide settings and fixtures."""

import gc
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import pytest
import torch
from filelock import FileLock

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.policies.timing import torch_threads
from robotrl.rl.ppo_mjx import CPU_XLA_FLAGS
from robotrl.training.loop import TRAIN_STATE, load_train_state

# Two pytest-xdist workers share two cores: each runs torch on one thread, and so do the commands its tests start
# (a second thread per worker only spins against the other worker's). Tests that set threads set them themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)

# MJX under XLA's CPU fusion pass runs orders of magnitude slower and compiles slower: the test process and the MJX
# training subprocesses it starts (which inherit the variable) get the flag. XLA reads it when the first backend
# starts, which no import does. Measured on dev-2c with a cold compilation cache: tests/envs/test_mjx.py +
# test_parity.py 354 s -> 179 s. Not on an accelerator, where fusion is what makes kernels fast.
# This process also compiles at LLVM's lowest optimization level: its MJX tests are compile-bound here and check
# values, not speed (a cold cache: tests/envs/test_parity.py's Reach case 48 s -> 39 s; bench/RESULTS.md, "The test
# suite's wall-clock"). The backend starts with it and the variable is put back: the MJX training runs that tests
# start have the users' flags, so they and the README's GPU how-to (which sets them) share one compiled program.
# The xdist controller imports this file too and its workers inherit its environment: the flag is added once, so that
# every process's XLA_FLAGS is the how-to's exact string (XLA's flags are part of the compilation cache's key).
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
if CPU_XLA_FLAGS not in _XLA_FLAGS.split():
    _XLA_FLAGS = f"{_XLA_FLAGS} {CPU_XLA_FLAGS}".strip()
_ON_CPU = not any(p in os.environ.get("JAX_PLATFORMS", "") for p in ("gpu", "cuda"))
if _ON_CPU:
    os.environ["XLA_FLAGS"] = f"{_XLA_FLAGS} --xla_backend_optimization_level=0"

# MJX tests are dominated by XLA compilation on a 2-core machine; a persistent cache outside the checkout
# makes every run after the first on the same machine much faster (a clean clone still compiles once).
_cache = Path(os.environ.get("ROBOTRL_JAX_CACHE", Path.home() / ".cache" / "robotrl" / "jax"))
_cache.mkdir(parents=True, exist_ok=True)
jax.config.update("jax_compilation_cache_dir", str(_cache))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
if _ON_CPU:
    jax.devices()  # the backend starts with this process's flags (above)
    os.environ["XLA_FLAGS"] = _XLA_FLAGS

# The CPU backend compiles each task's step code once per machine (seconds to tens of seconds a task: numba), then
# loads it from ~/.cache/robotrl/task-kernels. Across the suite's many task configurations a clean clone would spend
# minutes compiling, so the suite steps the numpy task code (the commands it starts inherit the variable), and
# tests/envs/test_compiled.py compiles every task and checks it against that code.
os.environ.setdefault("ROBOTRL_COMPILE_TASK", "0")

# A DDS domain block of this test process's own: under pytest-xdist two workers run ROS tests side by side, and nodes
# of one worker would otherwise see the other's topics. In-process nodes (rclpy.init() reads the variable) and the
# node executables a test starts use the block's first domain; a test that needs a private one takes
# ROS_DOMAIN_ID + k, k < 10.
os.environ["ROS_DOMAIN_ID"] = str(20 + 10 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")))


#: the test files that take longest, longest first (bench/RESULTS.md, "The test suite's wall-clock"). pytest-xdist
#: hands whole files to its two workers in collection order (pyproject: --dist loadfile --no-loadscope-reorder), so
#: these start first and the many short files fill in behind them: the suite ends when its work does, not one long
#: file after it. A stale order costs wall-clock only.
LONGEST_FIRST = (
    "tests/test_ppo_mjx.py",  # first: the README's GPU how-to (tests/test_readme.py) then loads its MJX program
    "tests/envs/test_parity.py",
    "tests/test_online.py",
    "tests/test_readme.py",
    "tests/test_pipeline.py",
    "tests/test_calql.py",
    "tests/test_sac_images.py",
    "tests/test_sac.py",
    "tests/test_actor_learner.py",
    "tests/policies/test_bc.py",
    "tests/test_dsrl.py",
    "tests/test_iql.py",
    "tests/test_sb3.py",
    "tests/test_offline_flow.py",
    "tests/envs/test_mjx.py",
    "tests/policies/test_vla.py",
    "tests/test_lint.py",
    "tests/test_classifier.py",
    "tests/envs/test_outside.py",
    "tests/policies/test_export.py",
    "tests/hardware/test_ros_e2e.py",
    "tests/test_wheel.py",
    "tests/test_hil.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


@pytest.fixture(scope="module", autouse=True)
def _release_jax_caches() -> Iterator[None]:
    """Drop JAX's trace and executable caches after every test module. MJX programs leave ~10^5 live Python objects
    each in them (1.1M tracked objects after tests/envs), and every full garbage collection walks them all: the
    object-heavy torch code of later modules (ONNX export, tracing) ran 5-10x slower in the suite than alone
    (tests/envs + test_export.py measured 338 s -> 125 s on dev-2c). Compiled programs stay in the persistent cache."""
    yield
    jax.clear_caches()
    gc.collect()


def shared(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> object:
    """`build(path)` once per test run, in whichever pytest-xdist worker asks first; the other workers wait on a file
    lock and get its JSON result and files too (a session fixture would otherwise build once per worker). What it
    builds is read-only to the tests, as any session fixture's is."""
    root = factory.getbasetemp()
    root = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "shared"
    root.mkdir(exist_ok=True)
    done = root / f"{name}.json"
    with FileLock(root / f"{name}.lock"):
        if not done.exists():
            done.write_text(json.dumps(build(root / name)))
    return json.loads(done.read_text())


def shared_path(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    return Path(str(shared(factory, name, lambda path: str(build(path)))))


def record_reach(path: Path, **record: float) -> Path:
    """A new store at `path` of Reach episodes of the scripted expert (`record`: record_expert's options)."""
    record_expert(path, "Reach", progress=False, **record).close()  # type: ignore[arg-type]
    return path


def reach_expert(factory: pytest.TempPathFactory, name: str, **record: float) -> Path:
    """A shared store of Reach episodes of the scripted expert, recorded once per test run."""
    return shared_path(factory, name, lambda path: record_reach(path, **record))


@pytest.fixture(scope="session")
def pusht_demos(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    """Four real PushT episodes of the noisy scripted expert (40 steps each), recorded once per test process."""
    return record_expert(
        tmp_path_factory.mktemp("demos") / "pusht.zarr",
        "PushT",
        episodes=4,
        num_envs=4,
        episode_steps=40,
        progress=False,
    )


def _kill_after_first_train_state(args: list[str], state: Path, timeout: float = 120.0) -> int:
    """Start a training command, SIGKILL it as soon as it has written its first train state, and return the
    step that state holds (what a resume test continues from)."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return int(load_train_state(state)["step"])


@pytest.fixture
def kill_after_first_train_state():
    return _kill_after_first_train_state


@pytest.fixture(scope="session")
def reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 Reach episodes of the scripted expert at the task's demo noise (RLPD, WSRL, the actor/learner)."""
    return reach_expert(tmp_path_factory, "reach.zarr", episodes=20, num_envs=10)


@pytest.fixture(scope="session")
def offline_reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 Reach episodes of the expert at noise 0.3: enough coverage for the offline learners (IQL, Cal-QL)."""
    return reach_expert(tmp_path_factory, "reach_offline.zarr", episodes=40, num_envs=10, noise=0.3)


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (a second one only spins on a shared 2-core machine), restored after."""
    with torch_threads(1):
        yield


def train_bc_flow(store: Path, run_dir: Path, backbone: str = "unet") -> Path:
    """A half-trained flow policy (chunks of 8, 4 executed) from 40 Reach demos at noise 0.3, room to move either way
    (the flow RL stages start from it). `unet`: 400 BC steps of a (32, 64) U-Net; `mlp`: 100 BC steps of a 128 x 2
    chunk MLP, a weaker start whose RL iterations cost a fraction of the U-Net's (their success: bench/RESULTS.md,
    "Learning tests: thresholds against their spread over seeds")."""
    from robotrl.policies import FlowConfig
    from robotrl.stages.bc import BCConfig, train

    policy, steps = {
        "unet": (FlowConfig(channels=(32, 64), action_horizon=8), 400),
        "mlp": (FlowConfig(backbone="mlp", mlp_width=128, mlp_depth=2, action_horizon=8), 100),
    }[backbone]
    torch.set_num_threads(1)
    return train(
        BCConfig(
            store=store,
            policy=policy,
            steps=steps,
            batch_size=32,
            warmup=10,
            ema=0.99,
            execute=4,
            lr=3e-4,
            eval_episodes=0,
            checkpoint_every=steps,
            threads=1,
            run_dir=run_dir,
            progress=False,
        )
    ).checkpoint


@pytest.fixture(scope="session")
def flow_reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 Reach episodes of the scripted expert at noise 0.3, 8 envs (online RL and HIL start from their BC)."""
    return reach_expert(tmp_path_factory, "reach_flow.zarr", episodes=40, num_envs=8, noise=0.3)


@pytest.fixture(scope="session")
def reach_bc_flow(flow_reach_demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_path(tmp_path_factory, "bc_flow", lambda path: train_bc_flow(flow_reach_demos, path))


def start_success(policy: Path) -> float:
    """A flow start's held-out success as the RL stages start from it: its 5-step ODE, chunks of 4 executed, the same
    100 held-out episodes their learning tests evaluate on (bench/online_budgets.py measures it the same way)."""
    from robotrl.flowrl.chain import load_flow_policy
    from robotrl.training.evaluate import evaluate_policy

    with torch_threads(1):
        return evaluate_policy(load_flow_policy(policy, 5), 100, 25, execute=4).success_rate


def held_out_success(factory: pytest.TempPathFactory, name: str, policy: Path) -> float:
    """`start_success(policy)`, measured once per test run."""
    return float(shared(factory, name, lambda _: start_success(policy)))


@pytest.fixture(scope="session")
def reach_bc_flow_success(reach_bc_flow: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    return held_out_success(tmp_path_factory, "bc_flow_success", reach_bc_flow)


@pytest.fixture(scope="session")
def reach_mlp_flow(flow_reach_demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The half-trained start on the chunk MLP: the online chain methods' learning tests fine-tune it."""
    return shared_path(tmp_path_factory, "mlp_flow", lambda path: train_bc_flow(flow_reach_demos, path, "mlp"))


@pytest.fixture(scope="session")
def reach_mlp_flow_success(reach_mlp_flow: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    return held_out_success(tmp_path_factory, "mlp_flow_success", reach_mlp_flow)


@pytest.fixture(scope="session")
def offline_reach_bc_flow(offline_reach_demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same recipe on the offline learners' demos (the offline flow stage's slow test was measured on it)."""
    return shared_path(tmp_path_factory, "offline_bc_flow", lambda path: train_bc_flow(offline_reach_demos, path))


@pytest.fixture(scope="session")
def offline_reach_mlp_flow(offline_reach_demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chunk-MLP recipe on the offline learners' demos (the offline flow stage's default-suite tests)."""
    return shared_path(
        tmp_path_factory, "offline_mlp_flow", lambda path: train_bc_flow(offline_reach_demos, path, "mlp")
    )


def _agent(state: dict) -> dict:
    return state.get("agent", state)


def _assert_same_run(a: Path, b: Path, store_keys: tuple[str, ...] = ()) -> None:
    """Two run directories ended identically: every tensor of their agents (in their train states) bit for bit,
    and for `store_keys` the same steps on their replay stores."""
    import numpy as np
    import torch

    wa, wb = (_agent(load_train_state(run / TRAIN_STATE)) for run in (a, b))
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)
    if store_keys:
        s1, s2 = EpisodeStore.open(a / "replay.zarr"), EpisodeStore.open(b / "replay.zarr")
        assert s1.num_episodes == s2.num_episodes > 0
        for key in store_keys:
            np.testing.assert_array_equal(s1.load([key])[key], s2.load([key])[key])


@pytest.fixture
def assert_same_run():
    return _assert_same_run


#: the seed a learning test trains with: 0 in the suite; bench/learning_tests.py reruns the `learning` tests with
#: other seeds to measure the distributions their thresholds are set from
LEARNING_SEED = int(os.environ.get("ROBOTRL_LEARNING_SEED", "0"))


@pytest.fixture(scope="session")
def learning_seed() -> int:
    return LEARNING_SEED


@pytest.fixture
def claim(request: pytest.FixtureRequest):
    """Check a learning test's measured value against its bound: `claim("gain", after - before, lower=0.15,
    before=..., after=...)`. Every check is appended as a JSON line to $ROBOTRL_CLAIMS when it is set (with the test,
    the seed and the context given), pass or fail, before it is asserted, so that bench/learning_tests.py can collect
    the distributions over seeds."""
    import json
    import math

    def check(
        name: str, value: float, lower: float | None = None, upper: float | None = None, **context: object
    ) -> None:
        assert lower is not None or upper is not None, "a claim needs a bound"
        eps = 1e-9  # success rates are counts over episodes: 0.97 - 0.95 is 2 points, not 2.0000000000000018
        ok = (
            math.isfinite(value) and (lower is None or value >= lower - eps) and (upper is None or value <= upper + eps)
        )
        path = os.environ.get("ROBOTRL_CLAIMS")
        if path:
            row = {
                "test": request.node.nodeid,
                "claim": name,
                "seed": LEARNING_SEED,
                "value": value,
                "lower": lower,
                "upper": upper,
                "ok": ok,
                **context,
            }
            with open(path, "a") as f:
                f.write(json.dumps(row, default=float) + "\n")
        bounds = " and ".join(
            b
            for b in ((lower is not None and f">= {lower:g}") or "", (upper is not None and f"<= {upper:g}") or "")
            if b
        )
        assert ok, f"{name}: expected {bounds}, got {value:g} ({context})"

    return check
