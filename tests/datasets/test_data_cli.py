"""`robotrl data ...` through the installed console script, as a user runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import DataRecord
from test_cli import robotrl


def ok(*args: str) -> str:
    out = robotrl(*args)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_record_info_validate_merge_split_stats(tmp_path: Path) -> None:
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    ok(
        "data",
        "record",
        "--task",
        "PushT",
        "--out",
        str(a),
        "--episodes",
        "3",
        "--num-envs",
        "3",
        "--episode-steps",
        "25",
    )
    ok(
        "data",
        "record",
        "--task",
        "PushT",
        "--out",
        str(b),
        "--episodes",
        "2",
        "--num-envs",
        "2",
        "--episode-steps",
        "25",
        "--seed",
        "1",
    )
    info = json.loads(ok("data", "info", "--store", str(a), "--json"))
    assert info["episodes"] == 3 and info["steps"] == 75 and info["sources"] == {"scripted": 3}
    assert "ok" in ok("data", "validate", "--store", str(a))

    ok("data", "merge", "--inputs", str(a), str(b), "--out", str(tmp_path / "m.zarr"))
    merged = EpisodeStore.open(tmp_path / "m.zarr")
    assert merged.num_episodes == 5
    np.testing.assert_array_equal(merged.episode(3).data["action"], EpisodeStore.open(b).episode(0).data["action"])
    assert merged.episodes[3]["origin"] == {"store": "b.zarr", "episode": 0}

    ok("data", "split", "--store", str(tmp_path / "m.zarr"), "--fraction", "0.6", "--seed", "0")
    train, val = EpisodeStore.open(tmp_path / "m_train.zarr"), EpisodeStore.open(tmp_path / "m_val.zarr")
    assert (train.num_episodes, val.num_episodes) == (3, 2)
    origins = {(e["origin"]["store"], e["origin"]["episode"]) for s in (train, val) for e in s.episodes}
    assert len(origins) == 5  # every episode went to exactly one side

    stats = json.loads(ok("data", "stats", "--store", str(a), "--json"))
    actions = EpisodeStore.open(a).load(["action"])["action"]
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), atol=1e-6)


def test_validate_and_merge_report_problems(tmp_path: Path) -> None:
    a, r = tmp_path / "a.zarr", tmp_path / "r.zarr"
    ok(
        "data",
        "record",
        "--task",
        "PushT",
        "--out",
        str(a),
        "--episodes",
        "2",
        "--num-envs",
        "2",
        "--episode-steps",
        "20",
    )
    ok(
        "data",
        "record",
        "--task",
        "Reach",
        "--out",
        str(r),
        "--episodes",
        "1",
        "--num-envs",
        "1",
        "--episode-steps",
        "20",
    )
    out = robotrl("data", "merge", "--inputs", str(a), str(r), "--out", str(tmp_path / "m.zarr"))
    assert out.returncode != 0 and "spec.task" in out.stderr and "'Reach'" in out.stderr and "'PushT'" in out.stderr
    assert not (tmp_path / "m.zarr").exists()
    out = robotrl("data", "validate", "--store", str(a), "--task", "Reach")
    assert out.returncode != 0 and "spec.task: store a.zarr has 'PushT', policy/task spec has 'Reach'" in out.stdout
    chunk = a / "data" / "action" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-3])  # truncated
    out = robotrl("data", "validate", "--store", str(a))
    assert out.returncode != 0 and "data/action chunk 0 (rows 0-39, episode(s) [0, 1])" in out.stdout


def test_export_import_round_trips_through_both_formats(tmp_path: Path) -> None:
    src = tmp_path / "pp.zarr"
    ok(
        "data",
        "record",
        "--task",
        "PickPlace",
        "--out",
        str(src),
        "--episodes",
        "2",
        "--num-envs",
        "2",
        "--episode-steps",
        "15",
    )
    ok("data", "export", "--store", str(src), "--out", str(tmp_path / "lr"), "--format", "lerobot")
    ok("data", "import", "--input", str(tmp_path / "lr"), "--out", str(tmp_path / "from_lr.zarr"))
    ok("data", "export", "--store", str(src), "--out", str(tmp_path / "pp.mcap"), "--format", "mcap")
    ok(
        "data",
        "import",
        "--input",
        str(tmp_path / "pp.mcap"),
        "--out",
        str(tmp_path / "from_mcap.zarr"),
        "--format",
        "mcap",
    )
    a = EpisodeStore.open(src)
    for back in (EpisodeStore.open(tmp_path / "from_lr.zarr"), EpisodeStore.open(tmp_path / "from_mcap.zarr")):
        assert back.spec == a.spec and back.episode_ends.tolist() == a.episode_ends.tolist()
        for i in range(a.num_episodes):
            for key in ("state", "image_front", "image_wrist", "action", "reward"):
                np.testing.assert_array_equal(
                    back.episode(i).data[key], a.episode(i).data[key], err_msg=f"{back.path} {key}"
                )
            assert back.episodes[i]["instruction"] == a.episodes[i]["instruction"]
    out = robotrl(
        "data",
        "import",
        "--input",
        str(tmp_path / "pp.mcap"),
        "--out",
        str(tmp_path / "x.zarr"),
        "--format",
        "mcap",
        "--task",
        "PushT",
    )
    assert out.returncode == 2 and "spec.task: recording pp.mcap has 'PickPlace', task PushT has 'PushT'" in out.stderr
    assert "Traceback" not in out.stderr


def test_record_in_domain_randomization_keeps_the_spec(tmp_path: Path) -> None:
    """Demonstrations for a policy meant to cross the sim-to-real gap: same spec as nominal ones (a policy trained
    on either runs on the same robots), different dynamics."""
    nominal, randomized = tmp_path / "n.zarr", tmp_path / "r.zarr"
    common = ("--task", "PushT", "--episodes", "2", "--num-envs", "2", "--episode-steps", "25")
    ok("data", "record", *common, "--out", str(nominal))
    ok("data", "record", *common, "--out", str(randomized), "--randomization", "task")
    a, b = EpisodeStore.open(nominal), EpisodeStore.open(randomized)
    a.check_spec(b.spec)
    assert not np.array_equal(a.load(["state"])["state"], b.load(["state"])["state"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("episodes", 0, "DataRecord.episodes: expected >= 1, got 0"),
        ("episodes", -5, "DataRecord.episodes: expected >= 1, got -5"),
        ("num_envs", 0, "DataRecord.num_envs: expected >= 1, got 0"),
        ("episode_steps", 0, "DataRecord.episode_steps: expected >= 1, got 0"),
        ("noise", -1.0, "DataRecord.noise: expected >= 0, got -1.0"),
        ("noise", float("nan"), "DataRecord.noise: expected >= 0, got nan"),
    ],
)
def test_record_refuses_bad_numbers_before_it_creates_a_store(
    option: str, value: float, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DataRecord(task="Reach", out=tmp_path / "r.zarr", **{option: value})  # type: ignore[arg-type]
    if option == "episodes" and value == 0:  # and through the CLI: one line, nothing written
        out = robotrl("data", "record", "--task", "Reach", "--out", str(tmp_path / "r.zarr"), "--episodes", "0")
        assert out.returncode != 0 and out.stderr.strip().splitlines()[-1].endswith(message)
        assert "Traceback" not in out.stderr and not (tmp_path / "r.zarr").exists()
