"""Outside envs wherever a task name goes: `gym:<id>` and `<module>:<callable>` names, their specs, seeding,
success, and the stages that run on them (record, validate, SAC, PPO, SB3, evaluation, resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.envs import is_task, make, make_task, spec_of
from robotrl.envs.outside import check_name, parse
from robotrl.envs.rollouts import run_episodes

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def outside_envs_importable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # `outside_envs:...` names a module of this folder, as a user's own
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings (gymnasium's HalfCheetah has some) to ./MUJOCO_LOG.TXT


def test_names_are_canonical_and_carry_keyword_arguments():
    env = parse("gym:HalfCheetah-v5?reset_noise_scale=0.2&ctrl_cost_weight=0.05")
    assert env.target == "gym:HalfCheetah-v5" and env.kwargs == {"reset_noise_scale": 0.2, "ctrl_cost_weight": 0.05}
    assert env.name == "gym:HalfCheetah-v5?ctrl_cost_weight=0.05&reset_noise_scale=0.2"  # keys sorted
    assert parse(env.name) == env
    assert parse("m:f?mode=fast&flag=true&sizes=[1,2]").kwargs == {"mode": "fast", "flag": True, "sizes": [1, 2]}
    assert parse(parse("m:f?label=a%20b&n=3").name).kwargs == {"label": "a b", "n": 3}
    assert not is_task("gym:Pendulum-v1") and is_task("Reach")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gym:Nope-v9", r"task: 'Nope-v9' is not a registered gymnasium id"),
        ("no_such_module:make", r"task: cannot import module 'no_such_module'"),
        ("outside_envs:missing", r"task: module 'outside_envs' has no attribute 'missing'"),
        ("outside_envs:PointGoal.radius", r"has no attribute"),
        ("m:f?novalue", r"expected keyword arguments as key=value after '\?', got 'novalue'"),
        (":f", r"expected 'gym:<id>' or '<module>:<callable>'"),
    ],
)
def test_bad_names_are_one_line_errors(name: str, message: str):
    with pytest.raises(ValueError, match=message) as err:
        check_name(name)
    assert "\n" not in str(err.value)


def test_gym_id_spec_is_named_after_it_and_its_keyword_arguments_reach_the_env():
    env = make("gym:HalfCheetah-v5?ctrl_cost_weight=0.2", num_envs=2, seed=0)
    spec = env.task_spec
    assert spec.task == "gym:HalfCheetah-v5?ctrl_cost_weight=0.2" and spec.action_mode == "native"
    assert spec.episode_steps == 1000 and spec.control_hz == 20.0 and spec.observations["state"].shape == (17,)
    assert spec.metadata == {"seeding": "reset", "success": False}
    assert env.envs[0].unwrapped._ctrl_cost_weight == 0.2
    assert spec_of(spec.task) == spec  # rebuilt from the name alone: the same spec
    with pytest.raises(ValueError, match="outside env, not a robotrl task"):
        make_task(spec.task)


def test_the_env_keeps_its_own_seed_keyword():
    env = make("outside_envs:make_own_seed?seed=7", num_envs=2, seed=3)
    _, info = env.envs[1].reset(seed=0)
    assert info["layout"] == 7  # the env's keyword, not the adapter's seed


def test_same_env_same_spec_whether_recorded_or_adapted(tmp_path: Path):
    name = "outside_envs:make_point?radius=0.1"
    store = record_expert(
        tmp_path / "point.zarr", name, episodes=6, num_envs=3, demonstrator="outside_envs:Demonstrator", progress=False
    )
    assert store.spec == make(name).task_spec == spec_of(name)
    assert store.spec.metadata == {"seeding": "reset", "success": True}
    assert store.num_episodes == 6 and all(e["success"] for e in store.episodes)
    assert {e["demonstrator"] for e in store.episodes} == {"outside_envs:Demonstrator"}


def test_recording_an_outside_env_needs_a_demonstrator(tmp_path: Path):
    with pytest.raises(ValueError, match=r"demonstrator: gym:Pendulum-v1 has no scripted expert"):
        record_expert(tmp_path / "p.zarr", "gym:Pendulum-v1", episodes=2)
    with pytest.raises(ValueError, match=r"demonstrator: expected outside_envs:not_an_env to return an object"):
        record_expert(tmp_path / "p.zarr", "gym:Pendulum-v1", episodes=2, demonstrator="outside_envs:not_an_env")
    assert not (tmp_path / "p.zarr").exists()


def test_envs_that_ignore_the_reset_seed_are_rebuilt_under_seeded_global_generators():
    env = make("outside_envs:make_global_random", num_envs=2)
    assert env.task_spec.metadata["seeding"] == "fresh"
    state = np.random.get_state()[1].copy()
    a, _ = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    c, _ = env.reset(seed=12)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert not np.allclose(a["state"], c["state"])
    assert not np.allclose(a["state"][0], a["state"][1])  # env i: seed + i
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # the caller's global stream is put back


def test_an_env_nothing_makes_repeat_is_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"outside_envs:make_unseeded: its first observation does not follow"):
        env = make("outside_envs:make_unseeded")
    assert env.task_spec.metadata["seeding"] == "none"


def test_an_env_without_success_is_judged_by_its_return():
    env = make("gym:Pendulum-v1", num_envs=2, seed=0)
    stats = run_episodes(env, lambda obs: np.zeros((2, 1), np.float32), 2, seed=0)
    assert not stats.reports_success and np.isnan(stats.success_rate)
    assert stats.score == stats.mean_return < -100  # Pendulum's return: large and negative
    assert set(stats.metrics()) == {"eval/mean_return"}
    point = make("outside_envs:make_point", num_envs=2, seed=0)
    demo = run_episodes(point, __import__("outside_envs").Demonstrator().act, 4, seed=0)
    assert demo.reports_success and demo.success_rate == 1.0 and demo.score == 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "mjx"}, r"backend: an outside env \(gym:Pendulum-v1\) runs on 'cpu' only, got 'mjx'"),
        ({"randomization": "task"}, r"randomization: gym:Pendulum-v1 has no robotrl domain randomization"),
        ({"action_mode": "ee_delta"}, r"action_mode: gym:Pendulum-v1 is an outside env; expected 'native'"),
        ({"reward_type": "sparse"}, r"reward_type: gym:Pendulum-v1 is an outside env; expected 'dense'"),
        ({"images": True}, r"option\(s\) \['images'\] are robotrl task options.*'gym:Pendulum-v1\?key=value'"),
    ],
)
def test_options_without_a_meaning_for_an_outside_env_are_refused(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        make("gym:Pendulum-v1", **options)


def test_episode_steps_caps_an_outside_env():
    for name in ("gym:Pendulum-v1", "outside_envs:make_point"):
        env = make(name, num_envs=1, seed=0, episode_steps=4)
        assert env.task_spec.episode_steps == 4
        env.reset(seed=0)
        truncated = [bool(env.step(np.zeros((1, *env.task_spec.action.shape), np.float32))[3][0]) for _ in range(4)]
        assert truncated == [False, False, False, True]


def robotrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    exe = Path(sys.executable).parent / "robotrl"
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_cli_trains_sac_ppo_and_sb3_on_a_gymnasium_id_and_refuses_to_resume_it(tmp_path: Path):
    common = ("--task", "gym:Pendulum-v1", "--eval-episodes", "2", "--no-progress")
    sac = robotrl("train", "sac", *common, "--total-steps", "300", "--num-envs", "2", "--run-dir", "sac", cwd=tmp_path)
    assert sac.returncode == 0, sac.stderr
    assert "mean return" in sac.stdout and "no success reported" in sac.stdout
    result = json.loads((tmp_path / "sac" / "result.json").read_text())
    assert result["success_rate"] is None and result["mean_return"] < 0
    rows = [json.loads(line) for line in (tmp_path / "sac" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/mean_return" in rows[-1] and not any("success_rate" in k for row in rows for k in row)

    resumed = robotrl("train", "sac", *common, "--total-steps", "600", "--run-dir", "sac", "--resume", cwd=tmp_path)
    assert resumed.returncode == 2 and "SacConfig.resume: " in resumed.stderr  # without the run's --num-envs 2
    assert "(num_envs: run has 2, given 1)" in resumed.stderr
    resumed = robotrl(
        "train", "sac", *common, "--total-steps", "600", "--num-envs", "2", "--run-dir", "sac", "--resume", cwd=tmp_path
    )
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1
    assert "resume: gym:Pendulum-v1 cannot restore its simulator state" in resumed.stderr

    ppo = robotrl(
        "train", "ppo", *common, "--total-steps", "256", "--num-envs", "2", "--rollout-steps", "64", "--run-dir", "ppo",
        cwd=tmp_path,
    )  # fmt: skip
    assert ppo.returncode == 0, ppo.stderr
    assert json.loads((tmp_path / "ppo" / "result.json").read_text())["mean_return"] < 0

    sb3 = robotrl(
        "train", "sb3-sac", *common, "--total-steps", "200", "--learning-starts", "100", "--run-dir", "sb3",
        cwd=tmp_path,
    )  # fmt: skip
    assert sb3.returncode == 0, sb3.stderr
    assert json.loads((tmp_path / "sb3" / "result.json").read_text())["success_rate"] is None


def test_cli_records_validates_and_evaluates_a_users_env(tmp_path: Path):
    name = "outside_envs:make_point?radius=0.1"
    record = robotrl(
        "data", "record", "--task", name, "--demonstrator", "outside_envs:Demonstrator", "--out", "p.zarr",
        "--episodes", "4", "--num-envs", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert record.returncode == 0, record.stderr
    assert json.loads(record.stdout.splitlines()[-1])["success_rate"] == 1.0
    ok = robotrl("data", "validate", "--store", "p.zarr", "--task", name, cwd=tmp_path)
    assert ok.returncode == 0 and "p.zarr: ok" in ok.stdout, ok.stderr
    other = robotrl("data", "validate", "--store", "p.zarr", "--task", "outside_envs:make_point", cwd=tmp_path)
    assert other.returncode != 0 and "spec.task" in other.stdout + other.stderr
    bad = robotrl("data", "record", "--task", "gym:Pendulum-v1", "--out", "q.zarr", cwd=tmp_path)
    assert bad.returncode == 2 and "demonstrator: gym:Pendulum-v1 has no scripted expert" in bad.stderr

    sac = robotrl(
        "train", "sac", "--task", name, "--total-steps", "200", "--num-envs", "2", "--eval-episodes", "4",
        "--no-progress", "--run-dir", "sac",
        cwd=tmp_path,
    )  # fmt: skip
    assert sac.returncode == 0, sac.stderr
    assert json.loads((tmp_path / "sac" / "result.json").read_text())["success_rate"] is not None


def test_envs_check_runs_gymnasiums_checker_on_an_outside_env_and_shows_robotrls_spec(tmp_path: Path):
    out = robotrl("envs", "check", "--task", "outside_envs:make_point?radius=0.1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "outside_envs:make_point?radius=0.1: check_env passed" in out.stdout
    assert "robotrl spec: state (4,) -> action (2,), 10 Hz, 30 steps; success reported: yes" in out.stdout
    pendulum = robotrl("envs", "check", "--task", "gym:Pendulum-v1", cwd=tmp_path)
    assert pendulum.returncode == 0 and "success reported: no (judged by return); seeding: reset" in pendulum.stdout


def test_flow_stages_run_on_a_users_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """BC, offline RL, DSRL and HIL of a flow policy on a user's env from the CLI; HIL's operator is the user's
    demonstrator (the env has no scripted expert: `--operator expert` is refused in one line)."""
    from robotrl.cli import main

    name = "outside_envs:make_point?radius=0.1"
    record_expert("p.zarr", name, episodes=8, num_envs=4, demonstrator="outside_envs:Demonstrator", progress=False)
    tiny = ("--eval-episodes", "2", "--eval-envs", "2", "--threads", "1", "--no-progress")
    main(["train", "bc", "policy:flow", "--store", "p.zarr", "--steps", "30", "--batch-size", "16",
          "--policy.channels", "16", "32", "--run-dir", "bc", *tiny])  # fmt: skip
    main(["train", "offline", "--policy", "bc/policy", "--store", "p.zarr", "--iterations", "1", "--critic-steps",
          "20", "--policy-updates", "1", "--windows", "8", "--rollout-episodes", "2", "--rollout-envs", "2",
          "--run-dir", "offline", *tiny])  # fmt: skip
    main(["train", "dsrl", "--policy", "bc/policy", "--total-steps", "128", "--run-dir", "dsrl", *tiny])
    with pytest.raises(SystemExit) as refused:
        main(["train", "hil", "--policy", "bc/policy", "--total-steps", "120", "--run-dir", "hil-expert", *tiny])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert f"HilConfig.operator: {name} has no scripted expert; give a demonstrator as --operator" in err
    main(["train", "hil", "--policy", "bc/policy", "--operator", "outside_envs:Demonstrator", "--num-envs", "4",
          "--total-steps", "240", "--run-dir", "hil", *tiny])  # fmt: skip
    for run in ("bc", "offline", "dsrl", "hil"):
        result = json.loads((tmp_path / run / "result.json").read_text())
        assert result["success_rate"] is not None and np.isfinite(result["mean_return"]), run
    hil = json.loads((tmp_path / "hil" / "result.json").read_text())
    with EpisodeStore.open(tmp_path / "hil" / "hil.zarr") as store:  # the demonstrator's take-overs are recorded
        interventions = [store.episode(i).data["intervention"].sum() for i in range(store.num_episodes)]
    assert store.num_episodes == hil["steps"] // 30 and sum(interventions) > 0 and hil["intervention_rates"][0] > 0


def test_a_teleop_device_drives_a_users_env_through_the_axes_it_is_given(tmp_path: Path):
    """`data collect --task <outside env> --device <device> --axes x y`: the device's twist drives the env's native
    action by the named axes, and its kept episodes are recorded as teleop; without axes, or with the scripted
    device (an outside env has no scripted expert), the session is refused before a store is opened."""
    from robotrl.datasets.collect import CollectConfig, collect
    from robotrl.datasets.teleop import EpisodeStatus, TeleopCommand, TeleopDevice, TeleopError

    class Hand(TeleopDevice):  # a person steering the point to its goal with a 6-axis twist
        name = "hand"

        def read(self, obs: dict, status: EpisodeStatus | None = None) -> TeleopCommand:
            if status is not None and status.done:
                return TeleopCommand(keep=True)
            s = np.asarray(obs["state"])
            return TeleopCommand(twist=np.r_[np.clip(5 * (s[2:] - s[:2]), -1, 1), 0, 0, 0, 0])

    name = "outside_envs:make_point?radius=0.1"
    config = CollectConfig(task=name, out=tmp_path / "hand.zarr", episodes=3, axes=("x", "y"), realtime=False)
    summary = collect(config, device=Hand())
    assert summary.kept == 3 and summary.successes == 3
    with EpisodeStore.open(tmp_path / "hand.zarr") as store:
        assert {e["source"] for e in store.episodes} == {"teleop"} and store.spec.task == name
        np.testing.assert_array_equal(np.abs(store.episode(0).data["action"]).max(), 1.0)  # the twist's own scale
    with pytest.raises(TeleopError, match=r"axes: outside_envs:make_point\?radius=0.1 has no teleop mapping"):
        collect(replace(config, axes=(), out=tmp_path / "a.zarr"), device=Hand())
    with pytest.raises(TeleopError, match=r"axes: expected names from \('x', .*got \['x', 'forward'\]"):
        collect(replace(config, axes=("x", "forward"), out=tmp_path / "a.zarr"), device=Hand())
    with pytest.raises(ValueError, match=r"device: scripted runs a task's scripted expert; outside_envs:make_point"):
        collect(replace(config, device="scripted", out=tmp_path / "a.zarr"))
    assert not (tmp_path / "a.zarr").exists()
