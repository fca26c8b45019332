"""The `robotrl` command line, driven as a user would: the installed console script in a subprocess, or
`robotrl.cli.main` in process where a test walks every command of the CLI's own table."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

from robotrl import cli

ROBOTRL = str(Path(sys.executable).parent / "robotrl")


def robotrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ROBOTRL, *args], capture_output=True, text=True, timeout=timeout)


def in_process(*args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `robotrl.cli.main(args)`."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return code, out.getvalue(), err.getvalue()


LEVELS = [(), *[(group,) for group in cli.COMMANDS], *[words for words, _ in cli.every_command()]]


@pytest.mark.parametrize("args", LEVELS, ids=lambda a: " ".join(a) or "robotrl")
def test_help_at_every_level(args, monkeypatch: pytest.MonkeyPatch):
    """`--help` at the top, of every group and of every command in the table; a command's common options fit a
    screen (40 lines of a 100-column terminal) above its advanced ones."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = in_process(*args, "--help")
    assert code == 0, err
    assert f"usage: {' '.join(('robotrl', *args))}" in out
    common = out.split("advanced options")[0]
    assert len(common.splitlines()) <= 40, common


def test_the_subprocess_entry_point_lists_the_groups():
    out = robotrl("--help")
    assert out.returncode == 0 and all(group in out.stdout for group in (*cli.COMMANDS, "run")), out.stderr


def test_missing_or_unknown_command_is_an_error():
    assert in_process()[0] == 2
    assert in_process("envs")[0] == 2
    code, _, err = in_process("envs", "lst")
    assert (
        code == 2
        and err
        == "robotrl envs: error: unknown command 'lst'; expected one of list, check, view, "
        "bench (did you mean 'list'?)\n"
    )
    code, _, err = in_process("trian", "bc")
    assert code == 2 and "did you mean 'train'?" in err


def test_advanced_options_keep_flat_flags():
    """`--lr` lives under "advanced options" in `--help` of `train sac`, and is parsed as the config's own field."""
    config = cli.parse("robotrl train sac", cli.COMMANDS["train"]["sac"], ["--task", "Reach", "--gamma", "0.9"])
    assert type(config).__name__ == "SacConfig" and config.gamma == 0.9 and config.task == "Reach"
    _, out, _ = in_process("train", "sac", "--help")
    assert "--gamma FLOAT" in out.split("advanced options")[1] and "--task STR" in out.split("advanced options")[0]


# ---------------------------------------------------------------------------------------------------
# every command refuses bad input in one line naming the field
# ---------------------------------------------------------------------------------------------------
INPUTS = ("store", "policy", "teacher", "input", "inputs")
"""fields that name a file a command reads (the first of them a command has is given a missing path)"""
OUTPUTS = ("run_dir", "out")
"""fields that name where a command writes (given a path under a regular file, where no directory can be made)"""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def bad_inputs(command: cli.Command, tmp: Path) -> list[tuple[list[str], str]]:
    """(arguments, the field the error must name) for each kind of bad input the command takes: a number that is
    not one, an unknown task, a missing input file, an output path no directory can be made at."""
    cls = command.config_class()
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in command.fixed]
    names = [f.name for f in fields]
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing, blocked = tmp / "missing.zarr", tmp / "a-file" / "run"
    (tmp / "a-file").write_text("")

    def given(*args: str) -> list[str]:  # the required fields filled in (with paths that do not exist)
        filled = [x for name in required if flag(name) not in args for x in (flag(name), str(tmp / f"{name}.x"))]
        return [*args, *filled]

    cases = []
    numbers = [n for n in names if hints[n] in (int, float, int | None, float | None)]
    if numbers:
        cases.append((given(flag(numbers[0]), "not-a-number"), numbers[0]))
    floats = [n for n in names if hints[n] in (float, float | None)]
    if floats:  # NaN parses as a float: refused by the value check, before anything is written
        cases.append((given(flag(floats[0]), "nan"), floats[0]))
    if "lr" in names:
        cases.append((given("--lr", "0"), "lr"))
    for name in ("task", "tasks"):
        if name in names:
            cases.append((given(flag(name), "NoSuchTask"), name))
    read = next((n for n in names if n in INPUTS), None)
    if read is not None:
        cases.append((given(flag(read), str(missing)), read))
    else:
        write = next((n for n in names if n in OUTPUTS), None)
        if write is not None:
            cases.append((given(flag(write), str(blocked)), write))
    return cases


@pytest.mark.parametrize(
    "words, command", list(cli.every_command()), ids=[" ".join(words) for words, _ in cli.every_command()]
)
def test_every_command_refuses_bad_input_in_one_line(words, command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every command of the CLI's table, given each kind of bad input it takes (a number that is not one, NaN, a
    learning rate of 0, an unknown task, a missing file it reads, a path it cannot write to), exits with status 2 and one line on stderr that
    names the field; no traceback."""
    monkeypatch.chdir(tmp_path)  # anything a command starts to write lands here
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the test process keeps its own threads
    cases = bad_inputs(command, tmp_path)
    fields = [f.name for f in dataclasses.fields(command.config_class())]
    assert cases or all(typing.get_type_hints(command.config_class())[n] is bool for n in fields), (
        f"robotrl {' '.join(words)}: no bad input to try; add its fields' kinds to bad_inputs"
    )
    for args, field in cases:
        code, _, err = in_process(*words, *args)
        lines = err.strip().splitlines()
        shown = f"robotrl {' '.join(words)} {' '.join(args)} -> {code}: {err[-2000:]}"
        assert code == 2 and len(lines) == 1, shown
        assert lines[0].startswith(f"robotrl {' '.join(words)}: error: "), shown
        assert field in lines[0] or flag(field) in lines[0], shown
        assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------------
# the commands themselves
# ---------------------------------------------------------------------------------------------------
def test_envs_list():
    out = robotrl("envs", "list")
    assert out.returncode == 0, out.stderr
    assert "Reach       obs: state (23,); action: ee_delta (3,)" in out.stdout
    specs = [json.loads(line) for line in robotrl("envs", "list", "--json").stdout.splitlines()]
    reach = next(s for s in specs if s["task"] == "Reach")
    assert reach["action"]["shape"] == [3] and reach["episode_steps"] == 60


def test_envs_check():
    out = robotrl("envs", "check", "--task", "Reach")
    assert out.returncode == 0, out.stderr
    assert "robotrl/Reach-v0: check_env passed" in out.stdout


def test_envs_view_writes_an_expert_mp4(tmp_path):
    path = tmp_path / "reach.mp4"
    out = robotrl("envs", "view", "--task", "Reach", "--out", str(path), "--width", "160", "--height", "120")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["success"] is True and report["frames"] > 1
    from robotrl.envs.video import read_mp4

    frames = read_mp4(path)
    assert frames.shape[1:] == (120, 160, 3) and len(frames) == report["frames"]


def test_envs_bench_prints_json_lines():
    out = robotrl("envs", "bench", "--tasks", "Reach", "--num-envs", "2", "--seconds", "0.2", "--skip-async")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["task"] == "Reach" and rec["num_envs"] == 2
    assert rec["cpu_steps_per_s"] > 0 and rec["ceiling_steps_per_s"] > 0 and rec["fraction_of_ceiling"] > 0
    low, high = rec["fraction_range"]  # the chunks' fractions: their median between their lowest and highest
    assert 0 < low <= rec["fraction_of_ceiling"] <= high
    split = rec["ms_per_step"]  # where a step's time goes, part by part (the twin's, its step code unfused)
    assert set(split) == {"physics", "task", "bookkeeping"} and min(split.values()) > 0
    stepped = rec["ms_per_step_fused"]  # the backend's own parts, as timed: they add up to its step
    assert sum(stepped.values()) == pytest.approx(1e3 * 2 / rec["cpu_steps_per_s"], rel=0.1)
    # the task code left out, the step is shorter: the fraction without it is above the fraction with it
    assert rec["fraction_without_task"] > rec["fraction_of_ceiling"]


def test_the_image_bench_sets_frames_against_one_renderer_per_core():
    from robotrl.envs import benchmark

    rec = benchmark.bench_images("PickPlace", 2, benchmark.BenchConfig(seconds=0.3), steps_no_images=1.0)
    assert rec is not None and rec["frames_per_s"] > 0 and rec["steps_per_s_images"] > 0
    assert rec["ceiling_frames_per_s"] and min(rec["ceiling_frames_per_s"].values()) > 0
    assert rec["fraction_of_ceiling"] == pytest.approx(
        rec["frames_per_s"] / max(rec["ceiling_frames_per_s"].values()), abs=1e-3
    )
    assert rec["ms_per_step"]["render"] > rec["ms_per_step"]["physics"]  # drawing is the step's cost
    assert benchmark.bench_images("Reach", 2, benchmark.BenchConfig(seconds=0.1), 1.0) is None  # no cameras


def test_bench_async_baseline_runs():
    from robotrl.envs import benchmark

    assert benchmark.bench_async("Reach", 2, benchmark.BenchConfig(seconds=0.2)) > 0


# ---------------------------------------------------------------------------------------------------
# a policy added in a test alone trains through `train bc` with its own options
# ---------------------------------------------------------------------------------------------------
from robotrl.policies.base import Policy, PolicyConfig  # noqa: E402


@dataclasses.dataclass
class ChunkMlpConfig(PolicyConfig):
    width: int = 32
    """hidden width of the MLP"""


class ChunkMlpPolicy(Policy):
    """The smallest policy: an MLP from the observation window's vectors to the whole action chunk."""

    name = "chunk_mlp"
    config_cls = ChunkMlpConfig
    config: ChunkMlpConfig

    def __init__(self, spec, config=None, stats=None) -> None:
        super().__init__(spec, config, stats)
        inputs = self.config.obs_horizon * sum(spec.observations[k].size for k in self.vector_keys)
        self.net = nn.Sequential(
            nn.Linear(inputs, self.config.width),
            nn.ReLU(),
            nn.Linear(self.config.width, self.config.action_horizon * self.action_dim),
        )

    def chunk(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([obs[k].flatten(1) for k in self.vector_keys], dim=1)
        return self.net(x).view(-1, self.config.action_horizon, self.action_dim)

    def loss(self, obs, action, action_is_pad):
        error = (self.chunk(obs) - action[:, : self.config.action_horizon]).square().mean(-1)
        return error[~action_is_pad[:, : self.config.action_horizon]].mean()

    def sample(self, obs):
        return self.chunk(obs)


def test_a_policy_registered_in_a_test_trains_through_train_bc_and_loads(tmp_path: Path):
    """A policy defined and registered here (nothing in robotrl names it) is a `train bc` subcommand with its own
    config's fields as options; the run's checkpoint loads back as that policy with those options."""
    from robotrl.datasets.record import record_expert
    from robotrl.policies import load
    from robotrl.policies.base import POLICIES, register, register_all

    register_all()
    register(ChunkMlpPolicy)
    try:
        record_expert(tmp_path / "demos.zarr", "Reach", episodes=4, num_envs=4, noise=0.3, progress=False).close()
        code, out, _ = in_process("train", "bc", "--help")
        assert code == 0 and "policy:chunk-mlp" in out  # flags and subcommands are kebab-case
        code, out, err = in_process(
            "train",
            "bc",
            "--store",
            str(tmp_path / "demos.zarr"),
            "--steps",
            "20",
            "--batch-size",
            "16",
            "--warmup",
            "2",
            "--eval-episodes",
            "2",
            "--eval-envs",
            "2",
            "--execute",
            "4",
            "--threads",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
            "policy:chunk-mlp",
            "--policy.width",
            "8",
            "--policy.action-horizon",
            "4",
        )
        assert code == 0, err
        assert "bc chunk_mlp: success" in out
        policy = load(tmp_path / "run" / "policy")
        assert isinstance(policy, ChunkMlpPolicy) and policy.config.width == 8 and policy.config.action_horizon == 4
        assert json.loads((tmp_path / "run" / "config.json").read_text())["policy"]["width"] == 8
    finally:
        POLICIES.pop(ChunkMlpPolicy.name, None)
