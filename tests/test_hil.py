"""Human-in-the-loop online RL (robotrl/flowrl/hil.py) on Reach with real MuJoCo envs, a real BC flow checkpoint and real
zarr stores: the scripted expert takes over by its stated criterion, every step lands in the store with the
intervention mask, the BC loss on the interventions moves the policy, a teleop device drives through the same
path, a killed run resumes exactly, and (slow) the intervention rate falls over training."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.datasets.store import validate
from robotrl.datasets.teleop import ScriptedDevice
from robotrl.envs import make
from robotrl.flowrl.hil import DemoBuffer, ExpertOperator, HilConfig, Recorder, runs, train
from robotrl.policies import load
from robotrl.training.loop import TRAIN_STATE

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bc_flow(reach_mlp_flow: Path) -> Path:
    """The chunk-MLP start (half-trained on Reach): the operator has much to correct, and its iterations are
    cheap."""
    return reach_mlp_flow


def small(policy: Path, run_dir: Path, **overrides: object) -> HilConfig:
    """CI-sized: 8 envs, one 60-step episode per env per iteration, chunks of 4 executed, a 5-step chain."""
    base = HilConfig(
        policy=policy,
        num_envs=8,
        rollout_steps=60,
        execute=4,
        sampler_steps=5,
        total_steps=960,
        eval_episodes=0,
        checkpoint_every=480,
        log_every=480,
        run_dir=run_dir,
        progress=False,
    )
    return replace(base, **overrides)


def test_interventions_are_recorded_and_the_bc_loss_learns_from_them(bc_flow: Path, tmp_path: Path) -> None:
    """Two iterations with the critic warming up all along and no value loss, so only the BC loss on the
    operator's stretches moves the policy: the expert takes over, the store holds every step with the mask, and the
    flow loss on the recorded interventions falls."""
    cfg = small(bc_flow, tmp_path / "run", critic_warmup=100, value_coef=0.0, bc_loss_coef=1.0, epochs=8)
    start = load(bc_flow)
    result = train(cfg)
    rates = result.intervention_rates
    assert len(rates) == 2 and all(0.05 < r < 1.0 for r in rates), rates

    # every step is on the store (two whole episodes per env), marked where the expert drove
    store = EpisodeStore.open(result.store)
    assert store.num_episodes == 16 and store.num_steps == 960 and validate(store, start.spec) == []
    mask = store.load(["intervention"])["intervention"]
    assert abs(mask.mean() - np.mean(rates)) < 1e-9
    sources = {meta["source"] for meta in store.episodes}
    assert "intervention" in sources and sources <= {"intervention", "policy"}
    assert all(
        meta["interventions"] == int(store.episode(i, ["intervention"]).data["intervention"].sum())
        for i, meta in enumerate(store.episodes)
    )
    # a takeover lasts takeover_steps (16) unless the episode ends first
    lengths = [b - a for i in range(16) for a, b in runs(store.episode(i, ["intervention"]).data["intervention"])]
    assert max(lengths) == 16 and all(1 <= n <= 16 for n in lengths)

    # the BC loss was applied: the policy moved, and fits the operator's stretches better than before
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["hil/intervention_rate"] for m in metrics] == rates
    assert all(m["loss/demo_bc"] > 0 for m in metrics)
    tuned = load(result.weights)
    assert tuned.name == "flow" and tuned.config.steps == 5
    buffer = DemoBuffer(("state",), (), SequenceConfig(2, 8))
    for i in range(store.num_episodes):
        data = store.episode(i).data
        buffer.add(data, data["intervention"])
    batch = buffer.sample(512, np.random.default_rng(1))

    def flow_loss(policy: torch.nn.Module) -> float:
        torch.manual_seed(0)
        with torch.no_grad():
            return float(policy.compute_loss(batch))

    before, after = flow_loss(start), flow_loss(tuned)
    assert after < 0.9 * before, (before, after)  # measured 0.31 -> 0.25
    moved = [name for name, x in tuned.state_dict().items() if not torch.equal(x, start.state_dict()[name])]
    assert any(name.startswith("net.") for name in moved), moved
    # the store is an ordinary dataset: BC's sampler reads it
    assert len(SequenceSampler.from_store(store, SequenceConfig(2, 8))) == 960


def test_operator_fraction_draws_that_share_of_each_batch_from_the_operators_stretches() -> None:
    """1,000 seeded demo steps (action 0) against one 16-step operator stretch (action 1): uniform windows hardly
    see the stretch; with operator_fraction 0.5 exactly half of every batch comes from it; with no stretch yet the
    share falls back to the seeded demos."""
    buffer = DemoBuffer(("state",), (), SequenceConfig(2, 8))
    seeded = {"state": np.zeros((1000, 3), np.float32), "action": np.zeros((1000, 2), np.float32)}
    buffer.add(seeded, np.ones(1000, bool), operator=False)
    rng = np.random.default_rng(0)
    assert buffer.sample(64, rng, 0.5)["action"].max() == 0.0 and buffer.operator_steps == 0
    stretch = np.zeros(40, bool)
    stretch[10:26] = True
    buffer.add({"state": np.ones((40, 3), np.float32), "action": np.ones((40, 2), np.float32)}, stretch)
    assert buffer.steps == 1016 and buffer.operator_steps == 16
    uniform = np.mean([buffer.sample(64, rng)["obs"]["state"][:, -1, 0].mean() for _ in range(20)])
    assert uniform < 0.05, uniform
    for _ in range(5):
        batch = buffer.sample(64, rng, 0.5)
        now = batch["obs"]["state"][:, -1, 0]  # the window's current step: 1 in the stretch
        assert now.sum() == 32 and (batch["action"][now == 1] == 1).all()
    with pytest.raises(ValueError, match=r"HilConfig.operator_fraction: expected a share in \[0, 1\], got 1.5"):
        HilConfig(operator_fraction=1.5)


def drive_with_operator(
    env: Any, cfg: HilConfig, store: EpisodeStore, driver: str, steps: int
) -> tuple[ExpertOperator, list[np.ndarray], float, int]:
    """A real 6-env Reach run of `steps` steps under the expert operator, the policy being the expert itself or
    one that stands still, deciding every 4 steps: (the operator, who was operated at each decision, the
    intervention rate, the take-overs)."""
    op = ExpertOperator(
        env.task.expert(noise=0.0, seed=0),
        np.ones(3, np.float32),
        cfg,
        Recorder(store, 6, DemoBuffer(("state",), (), SequenceConfig())),
        6,
    )
    op.start(env.reset(seed=0)[0])
    operated, first = np.zeros(6, bool), []
    for step in range(steps):
        policy = op.act() if driver == "expert" else np.zeros((6, 3), np.float32)
        if step % 4 == 0:
            operated = op.decide(np.arange(6), policy)
            first.append(operated.copy())
        action = np.where(operated[:, None], op.act(), policy).astype(np.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        op.observe(action, operated.copy(), obs, reward, terminated, truncated, info)
        operated &= op.wants()
    rate, takeovers = op.rate()
    return op, first, rate, takeovers


def test_the_criterion_takes_over_a_straying_policy_and_never_the_expert_itself(tmp_path: Path) -> None:
    """The expert operator's criterion on a real Reach vector env: proposals equal to its own actions never stray;
    a policy that proposes to stand still strays at every decision (the expert moves at full speed far from the
    target) and is taken over at its `stray_patience`-th decision, for `takeover_steps` steps, then handed back."""
    env = make("Reach", num_envs=6, seed=0)
    store = EpisodeStore.create(tmp_path / "s.zarr", env.task_spec)
    cfg = HilConfig(num_envs=6, stray_threshold=0.5, stray_patience=2, takeover_steps=6)
    for driver, expected in (("expert", 0), ("still", 6)):
        op, first, rate, takeovers = drive_with_operator(env, cfg, store, driver, 10)
        assert takeovers == expected
        if driver == "expert":
            assert rate == 0.0 and not np.any(first)
        else:  # decisions 0 and 1 stray, the expert takes over at decision 1 (step 4) for 6 steps and hands back
            assert not first[0].any() and first[1].all() and rate == 6 / 10, (first, rate)
            assert not op.wants().any()
    store.close()
    env.close()


def test_the_stall_criterion_takes_over_a_stuck_policy_and_leaves_a_progressing_one(tmp_path: Path) -> None:
    """criterion="stall" on a real Reach vector env: a policy that stands still makes no progress after its first
    step and is taken over at the first decision once `stall_steps` steps have passed without it, then handed back
    with the count restarted; the expert driving itself progresses (or has succeeded) and is never taken over."""
    env = make("Reach", num_envs=6, seed=0)
    store = EpisodeStore.create(tmp_path / "s.zarr", env.task_spec)
    cfg = HilConfig(num_envs=6, criterion="stall", stall_steps=8, stall_margin=0.01, takeover_steps=6)
    for driver, expected in (("expert", 0), ("still", 6)):
        op, first, rate, takeovers = drive_with_operator(env, cfg, store, driver, 20)
        assert takeovers == expected, (driver, takeovers)
        if driver == "expert":
            assert rate == 0.0 and not np.any(first)
        else:  # idle 7 before decision 2 (step 8), 11 before decision 3 (step 12): taken over for steps 12-17, then
            # handed back with the count restarted (no second take-over by step 19)
            assert not np.any(first[:3]) and first[3].all() and first[4].all() and rate == 6 / 20, (first, rate)
            assert not op.wants().any() and (op.idle <= 2).all(), op.idle  # (momentum may still progress)
    with pytest.raises(ValueError, match=r"HilConfig.criterion: expected 'stray' or 'stall', got 'bored'"):
        HilConfig(criterion="bored")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"HilConfig.stall_steps: expected >= 1, got 0"):
        HilConfig(stall_steps=0)
    store.close()
    env.close()


def test_a_teleop_device_drives_one_env_through_the_same_path(bc_flow: Path, tmp_path: Path) -> None:
    """A ScriptedDevice with a take-over range stands in for a person at a keyboard: steps 10-29 of every episode
    are the operator's, recorded with the mask and with the device's (expert's) actions."""
    device = ScriptedDevice(make("Reach", num_envs=1).task, noise=0.0, interventions=[(10, 30)])
    result = train(small(bc_flow, tmp_path / "run", num_envs=1, operator="scripted", total_steps=120), device=device)
    assert result.intervention_rates == [20 / 60, 20 / 60]
    store = EpisodeStore.open(result.store)
    assert store.num_episodes == 2 and {m["operator"] for m in store.episodes} == {"scripted"}
    for i in range(2):
        data = store.episode(i).data
        assert runs(data["intervention"]) == [(10, 30)]
        expert = make("Reach", num_envs=1).task.expert(noise=0.0)
        np.testing.assert_allclose(data["action"][10:30], expert.act({"state": data["state"][10:30]}), atol=1e-6)


def test_bad_configs_are_refused(bc_flow: Path, tmp_path: Path) -> None:
    for overrides, message in (
        ({"operator": "joystick"}, r"HilConfig.operator: expected one of \('expert', 'keyboard', .*got 'joystick'"),
        (
            {"operator": "keyboard", "num_envs": 4},
            r"HilConfig.num_envs: expected 1 when a teleop device drives \(operator='keyboard'\), got 4",
        ),
        (
            {"operator": "my_robot.experts:Scripted", "operator_noise": 0.5},
            r"HilConfig.operator_noise: applies to the task's scripted expert, not to the demonstrator "
            r"my_robot.experts:Scripted; expected 0, got 0.5",
        ),
        ({"stray_threshold": 0.0}, r"HilConfig.stray_threshold: expected > 0, got 0.0"),
        ({"stray_patience": 0}, r"HilConfig.stray_patience: expected >= 1, got 0"),
        ({"takeover_steps": 0}, r"HilConfig.takeover_steps: expected >= 1, got 0"),
        ({"bc_loss_coef": -1.0}, r"HilConfig.bc_loss_coef: expected >= 0, got -1.0"),
        ({"method": "latent"}, r"HilConfig.method: 'latent' freezes the flow network"),
        ({"method": "residual"}, r"HilConfig.method: 'residual' freezes the flow network"),
        ({"num_envs": 0}, r"HilConfig.num_envs: expected >= 1, got 0"),
        ({"device": "cuda:x"}, r"HilConfig.device: expected a torch device such as 'cpu' or 'cuda', got 'cuda:x'"),
    ):
        with pytest.raises(ValueError, match=message):
            small(bc_flow, tmp_path, **overrides)
    device = ScriptedDevice(make("Reach", num_envs=1).task)
    with pytest.raises(
        ValueError,
        match=r"HilConfig.num_envs: expected 1 when a teleop device drives \(scripted\), "
        r"got 8",
    ):
        train(small(bc_flow, tmp_path / "a"), device=device)
    # a store or demos of another task: refused naming the field, before a step is taken
    pusht = tmp_path / "pusht.zarr"
    EpisodeStore.create(pusht, make("PushT", num_envs=1, render_images=False).task_spec).close()
    with pytest.raises(SpecMismatchError, match=r"task: .*'Reach'.*'PushT'|task: .*'PushT'.*'Reach'"):
        train(small(bc_flow, tmp_path / "b", out=pusht))
    with pytest.raises(SpecMismatchError, match=r"HilConfig.demos"):
        train(small(bc_flow, tmp_path / "c", demos=pusht))
    once = small(bc_flow, tmp_path / "once", num_envs=2, rollout_steps=4, total_steps=8)
    train(once)
    with pytest.raises(FileExistsError, match=r"HilConfig.run_dir: .*once already holds a run"):
        train(once)
    with pytest.raises(
        ValueError, match=r"HilConfig.resume: .*once/config.json records other settings \(ema: run has 0.0, given 0.5\)"
    ):
        train(replace(once, resume=True, ema=0.5))
    with pytest.raises(ValueError, match=r"HilConfig.ema: the run in .*once was started without an average"):
        train(replace(once, resume=True, ema=0.5, resume_changes=("ema",)))  # allowed to differ, yet impossible


def test_killed_run_resumes_exactly(
    bc_flow: Path, tmp_path: Path, kill_after_first_train_state, assert_same_run
) -> None:
    """SIGKILLed after its first train state (episodes run across iterations, so unfinished ones are in it, and the
    expert drives with teleop noise, so its random state is too), `--resume` ends with the weights (the saved
    average's too) and the store of a run that was never stopped."""
    overrides = {
        "num_envs": 4,
        "rollout_steps": 20,
        "total_steps": 400,
        "checkpoint_every": 80,
        "log_every": 80,
        "critic_warmup": 1,
        "operator_noise": 0.5,
        "ema": 0.5,
    }
    code = (
        "import sys, torch; torch.set_num_threads(1); from pathlib import Path; from robotrl.flowrl.hil import HilConfig, "
        f"train; train(HilConfig(policy=Path({str(bc_flow)!r}), execute=4, sampler_steps=5, eval_episodes=0, "
        f"progress=False, run_dir=Path({str(tmp_path / 'killed')!r}), "
        + ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        + "))"
    )
    step = kill_after_first_train_state([sys.executable, "-c", code], tmp_path / "killed" / TRAIN_STATE)
    assert 1 <= step < 5, step
    cfg = small(bc_flow, tmp_path / "killed", **overrides)
    train(replace(cfg, resume=True))
    train(replace(cfg, run_dir=tmp_path / "straight"))
    assert_same_run(tmp_path / "straight", tmp_path / "killed")
    saved = [load(tmp_path / run / "policy").state_dict() for run in ("straight", "killed")]
    for name, x in saved[0].items():
        torch.testing.assert_close(x, saved[1][name], rtol=0, atol=0, msg=name)
    a, b = EpisodeStore.open(tmp_path / "straight" / "hil.zarr"), EpisodeStore.open(tmp_path / "killed" / "hil.zarr")
    assert a.num_episodes == b.num_episodes == 4  # 100 steps per env: one whole episode each
    for key in ("state", "action", "reward", "intervention"):
        np.testing.assert_array_equal(a.load([key])[key], b.load([key])[key], err_msg=key)


@pytest.mark.learning
def test_the_intervention_rate_falls_over_training(bc_flow: Path, tmp_path: Path, claim, learning_seed: int) -> None:
    """16 envs, 9,600 env steps (10 iterations): the share of env steps the expert drives falls as PPO and the BC
    loss on its interventions pull the policy towards acting as it does; asserted on the mean of the first three
    iterations against the last three (seeds 0-4: bench/RESULTS.md, "Learning tests")."""
    result = train(
        small(
            bc_flow,
            tmp_path / "run",
            num_envs=16,
            total_steps=9_600,
            checkpoint_every=4_800,
            log_every=960,
            seed=learning_seed,
        )
    )
    rates = result.intervention_rates
    assert len(rates) == 10
    first, last = float(np.mean(rates[:3])), float(np.mean(rates[-3:]))
    claim("intervention rate fall", first - last, lower=0.2, first=first, last=last)


@pytest.mark.slow
@pytest.mark.learning
def test_the_intervention_rate_keeps_falling_on_a_longer_budget(
    bc_flow: Path, tmp_path: Path, claim, learning_seed: int
) -> None:
    """19,200 env steps (20 iterations): the fall keeps going (bench/RESULTS.md, "Learning tests")."""
    result = train(
        small(
            bc_flow,
            tmp_path / "run",
            num_envs=16,
            total_steps=19_200,
            checkpoint_every=9_600,
            log_every=960,
            seed=learning_seed,
        )
    )
    rates = result.intervention_rates
    first, last = float(np.mean(rates[:3])), float(np.mean(rates[-3:]))
    claim("intervention rate fall at 19,200 steps", first - last, lower=0.4, first=first, last=last)
