"""The `robotrl` console script, driven as a user would: a subprocess of the installed entry point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROBOTRL = str(Path(sys.executable).parent / "robotrl")


def robotrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ROBOTRL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args",
    [(), ("envs",), ("train",), ("envs", "list"), ("envs", "check"), ("envs", "view"), ("envs", "bench"), ("train", "sb3"),
     ("data",), ("data", "info"), ("data", "validate"), ("data", "stats"), ("data", "merge"), ("data", "split"),
     ("data", "record"), ("data", "export"), ("data", "import"), ("collect",),
     ("train", "bc"), ("eval",), ("export",), ("distill",), ("run",), ("train", "online"),
     ("train", "offline"), ("train", "hil"), ("train", "classifier"), ("train", "dsrl")],
)
def test_help_at_every_level(args):
    out = robotrl(*args, "--help")
    assert out.returncode == 0, out.stderr
    assert f"usage: {' '.join(('robotrl',) + args)}" in out.stdout


def test_missing_or_unknown_command_is_an_error():
    assert robotrl().returncode != 0
    assert robotrl("envs").returncode != 0
    out = robotrl("envs", "lst")
    assert out.returncode != 0 and "lst" in out.stderr + out.stdout


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
    assert rec["cpu_steps_per_s"] > 0 and rec["ceiling_steps_per_s"] > 0 and 0 < rec["fraction_of_ceiling"]


def test_bench_async_baseline_runs():
    from robotrl.cli import load_bench

    bench = load_bench()
    assert bench.bench_async("Reach", 2, bench.BenchConfig(seconds=0.2)) > 0
