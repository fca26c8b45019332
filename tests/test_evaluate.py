"""`robotrl policy eval`: its threads, the actions per chunk it executes, and a policy against a baseline on the same
episodes."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import robotrl.training.evaluate as evaluate
from robotrl.policies import load, runtime
from robotrl.policies.export import export
from robotrl.policies.timing import torch_threads
from robotrl.training.evaluate import EvalConfig, evaluate_policy, paired_difference, run_eval, success_gain


def test_eval_runs_on_its_threads_and_restores_the_callers(reach_bc_flow: Path, monkeypatch) -> None:
    seen: list[int] = []
    real = evaluate.evaluate_policy

    def evaluate_policy(*args, **kwargs):  # the real evaluation, its thread count noted as it starts
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_policy", evaluate_policy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = run_eval(EvalConfig(policy=reach_bc_flow, eval_episodes=4, eval_envs=4, execute=4))
        assert seen == [1] and torch.get_num_threads() == 2
        assert result["episodes"] == 4
        with torch_threads(1):  # the same episodes evaluated directly: the command reports them as they are
            assert result["success_rate"] == real(load(reach_bc_flow), 4, 4, execute=4).success_rate
        run_eval(EvalConfig(policy=reach_bc_flow, eval_episodes=2, eval_envs=2, execute=4, threads=2))
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_eval_of_an_export_executes_what_it_recorded(reach_bc_flow: Path, tmp_path: Path) -> None:
    """An export that records the actions per chunk its policy was chosen at is evaluated so unless told otherwise;
    a torch checkpoint, which records none, at 8."""
    out = export(reach_bc_flow, tmp_path / "export", execute=2)
    result = run_eval(EvalConfig(policy=out, eval_episodes=4, eval_envs=4))
    assert result["execute"] == 2
    assert result["success_rate"] == evaluate_policy(runtime.load(out, threads=1), 4, 4, execute=2).success_rate
    assert run_eval(EvalConfig(policy=out, eval_episodes=2, eval_envs=2, execute=3))["execute"] == 3
    assert run_eval(EvalConfig(policy=reach_bc_flow, eval_episodes=2, eval_envs=2))["execute"] == 8


@pytest.mark.parametrize("field", ["eval_episodes", "eval_envs", "execute", "threads"])
def test_bad_eval_config_names_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=rf"EvalConfig.{field}: expected >= 1, got 0"):
        EvalConfig(policy=Path("p"), **{field: 0})


def test_success_gain_keeps_only_gains_outside_the_gates_noise() -> None:
    """The offline stage's success gate: PushT's AWR update that won 10/10 against BC's 9/10 scored 1.4 points under
    BC over 1,000 held-out seeds; one standard error is wider than that one episode, 30 points over 40 episodes is
    not, and at z = 0 the bound is the measured gain's sign."""
    gain, lower = success_gain(1.0, 0.9, 10, z=1.0)
    assert gain == pytest.approx(1 / 12) and lower < 0
    assert success_gain(0.8, 0.5, 40, z=1.0)[1] > 0
    assert success_gain(0.96, 0.95, 100, z=0.0)[1] > 0 and success_gain(0.95, 0.95, 100, z=0.0)[1] == 0
    assert success_gain(1.0, 1.0, 10, z=1.0)[1] < 0  # a tie at the ceiling is no gain


def test_two_policies_meet_the_same_episodes_index_for_index() -> None:
    """run_episodes' waves: episode k starts from the same state whatever the policy, even when one policy's robot
    falls early and the other's never does (an auto-reset stream shifted every later start after the first fall),
    so two evaluations on the same seed pair episode by episode; the last wave counts its first envs."""
    from robotrl.envs import make
    from robotrl.envs.rollouts import run_episodes

    def starts(act):  # the state each counted episode starts from, in the evaluation's order
        env = make("Quadruped", num_envs=3, seed=0, episode_steps=60)
        seen: list[np.ndarray] = []
        fresh = [False]

        def policy(obs):
            if fresh[0]:
                seen.append(np.asarray(obs["state"]).copy())
                fresh[0] = False
            return act(obs)

        stats = run_episodes(env, policy, 7, seed=5, on_episode_start=lambda i: fresh.__setitem__(0, True))
        env.close()
        return np.concatenate(seen)[:7], stats

    rng = np.random.default_rng(0)
    stand, stood = starts(lambda obs: np.zeros((3, 12), np.float32))
    flail, fell = starts(lambda obs: np.where(rng.random((3, 12)) < 0.5, -1.0, 1.0).astype(np.float32))
    assert not stood.terminated.any() and fell.terminated.all() and len(set(fell.lengths.tolist())) > 1
    assert np.array_equal(stand, flail)
    assert len(stood.success) == len(fell.success) == 7


def test_eval_against_a_baseline_pairs_their_episodes(reach_bc_flow: Path, tmp_path: Path) -> None:
    """`--baseline`: both policies meet the same episodes, each at its own actions per chunk, and the gain is the
    mean of their per-episode differences with its standard error, as two separate evaluations give it."""
    out = export(reach_bc_flow, tmp_path / "export", execute=2)
    result = run_eval(EvalConfig(policy=reach_bc_flow, baseline=out, eval_episodes=6, eval_envs=3))
    with torch_threads(1):
        mine = evaluate_policy(load(reach_bc_flow), 6, 3, execute=8)
    theirs = evaluate_policy(runtime.load(out, threads=1), 6, 3, execute=2)
    assert result["execute"] == 8 and result["baseline"]["execute"] == 2
    assert result["success_rate"] == mine.success_rate and result["baseline"]["success_rate"] == theirs.success_rate
    paired = result["paired_gain"]
    assert paired["of"] == "success_rate"
    assert (paired["gain"], paired["se"]) == paired_difference(mine.success, theirs.success)
    assert paired["gain"] == pytest.approx(mine.success_rate - theirs.success_rate)
    same = run_eval(EvalConfig(policy=out, baseline=out, eval_episodes=3, eval_envs=3))["paired_gain"]
    assert (same["gain"], same["se"]) == (0.0, 0.0)  # a policy against itself: the same noise, the same episodes
    # the sampler's step count is the evaluated policy's: an export (no sampler to set) is a baseline as saved
    fewer = run_eval(EvalConfig(policy=reach_bc_flow, baseline=out, sampler_steps=1, eval_episodes=3, eval_envs=3))
    assert (
        fewer["baseline"]["success_rate"] == evaluate_policy(runtime.load(out, threads=1), 3, 3, execute=2).success_rate
    )


def test_paired_difference_cancels_what_both_share() -> None:
    """One episode won of four: a quarter, with the error of one difference in four; the same rate won on other
    episodes is no gain, with a wide error; a single episode has no error."""
    assert paired_difference([1, 1, 1, 0], [1, 1, 0, 0]) == (0.25, 0.25)
    gain, se = paired_difference([0, 0, 1, 1], [1, 1, 0, 0])
    assert gain == 0.0 and se == pytest.approx(2 / np.sqrt(3) / 2)
    assert np.isnan(paired_difference([1], [0])[1])


def test_a_baseline_of_another_task_is_named(reach_bc_flow: Path, tmp_path: Path) -> None:
    other = export(reach_bc_flow, tmp_path / "other", execute=2)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["spec"]["task"] = "PushT"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"^EvalConfig.baseline: expected a policy of Reach, got one of PushT"):
        run_eval(EvalConfig(policy=reach_bc_flow, baseline=other, eval_episodes=2, eval_envs=2))
