"""The collect loop with the scripted operator: what it writes to the store (success labels, sources,
intervention flags), keep / discard, appending, spec mismatches, Ctrl-C, pacing and bad options."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets.collect import CollectConfig, RateLimiter, collect, run_collect
from robotrl.datasets.store import EpisodeStore, validate
from robotrl.datasets.teleop import EpisodeStatus, ScriptedDevice, TeleopCommand, TeleopError
from robotrl.envs import make_task


def test_scripted_pusht_writes_a_valid_store_with_success_labels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "pusht.zarr"
    summary = run_collect(CollectConfig(task="PushT", device="scripted", out=out, episodes=3, episode_steps=40))
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["kept"] == 3 and line["discarded"] == 0 and line["path"] == str(out)
    assert line["success_rate"] == summary.success_rate and "episodes_in_store" in line

    store = EpisodeStore.open(out)
    assert validate(store, make_task("PushT", episode_steps=40).spec()) == []
    assert store.num_episodes == 3 and summary.kept_indices == [0, 1, 2]
    for episode in store:
        meta = episode.meta
        assert meta["source"] == "scripted" and meta["device"] == "scripted" and meta["robot"] == "sim"
        assert meta["noise"] == make_task("PushT").demo_noise
        assert meta["success"] == bool(episode.data["success"].any())  # the label agrees with the steps
        assert len(episode) == 40 and meta["end_reason"] == "end"
        assert not episode.data["intervention"].any()
        assert np.all(np.abs(episode.data["action"]) <= 1.0)
        assert np.all(np.diff(episode.data["timestamp"]) >= 0)
    assert summary.steps == 120 and summary.late_steps == 0


def test_scripted_operator_keeps_on_success(tmp_path: Path) -> None:
    """Reach succeeds within a few steps: the scripted operator keeps the episode there, labelled success."""
    summary = collect(CollectConfig(task="Reach", out=tmp_path / "reach.zarr", episodes=2, episode_steps=60))
    assert summary.kept == 2 and summary.successes == 2 and summary.success_rate == 1.0
    store = EpisodeStore.open(tmp_path / "reach.zarr")
    for episode in store:
        assert episode.meta["success"] and episode.meta["end_reason"] == "success"
        assert len(episode) < 60 and episode.data["success"][-1]


def test_intervention_flags_are_recorded_per_step(tmp_path: Path) -> None:
    device = ScriptedDevice(make_task("PushT", episode_steps=10), interventions=[(2, 5), (8, 20)])
    summary = collect(
        CollectConfig(task="PushT", out=tmp_path / "hil.zarr", episodes=2, episode_steps=10), device=device
    )
    store = EpisodeStore.open(tmp_path / "hil.zarr")
    expected = np.zeros(10, bool)
    expected[[2, 3, 4, 8, 9]] = True
    for episode in store:
        np.testing.assert_array_equal(episode.data["intervention"], expected)
        assert episode.meta["interventions"] == 5
    assert summary.interventions == 10


def test_discarded_episodes_leave_nothing_in_the_store(tmp_path: Path) -> None:
    """PushT cannot succeed in 5 steps: with discard_failures every episode is dropped, and max_discarded
    ends the session; a later session appends to the same (still empty) store."""
    out = tmp_path / "pusht.zarr"
    summary = collect(
        CollectConfig(task="PushT", out=out, episodes=2, episode_steps=5, discard_failures=True, max_discarded=3)
    )
    assert (summary.kept, summary.discarded, summary.steps) == (0, 3, 0)
    store = EpisodeStore.open(out)
    assert store.num_episodes == 0 and store.num_steps == 0
    assert all(store.array(k).shape[0] == 0 for k in store.arrays_spec)
    assert validate(store) == []

    kept = collect(CollectConfig(task="PushT", out=out, episodes=2, episode_steps=5))
    assert kept.kept == 2 and kept.episodes_in_store == 2
    assert EpisodeStore.open(out).num_steps == 10


def test_appending_and_spec_mismatch(tmp_path: Path) -> None:
    out = tmp_path / "pusht.zarr"
    collect(CollectConfig(task="PushT", out=out, episodes=1, episode_steps=8))
    second = collect(CollectConfig(task="PushT", out=out, episodes=2, episode_steps=8, seed=1))
    assert second.kept_indices == [1, 2] and second.episodes_in_store == 3

    with pytest.raises(SpecMismatchError, match=r"cannot append to .*pusht.zarr: spec.episode_steps: .* 8.* 9"):
        collect(CollectConfig(task="PushT", out=out, episodes=1, episode_steps=9))
    with pytest.raises(SpecMismatchError, match="cannot append to .*spec.task.*'PushT'.*'Reach'"):
        collect(CollectConfig(task="Reach", out=out, episodes=1, episode_steps=8))
    # the refused sessions took no lock and wrote nothing: the store is as it was, and appendable
    third = collect(CollectConfig(task="PushT", out=out, episodes=1, episode_steps=8, seed=2))
    assert third.kept_indices == [3]
    assert validate(EpisodeStore.open(out)) == []


class InterruptingOperator(ScriptedDevice):
    """The scripted operator whose user presses Ctrl-C (a real SIGINT) in the middle of episode 1."""

    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        if status is not None and status.episode == 1 and status.step == 3:
            signal.raise_signal(signal.SIGINT)
        return super().read(obs, status)


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler for the test: a process started in the background (`cmd &`) inherits SIGINT
    ignored, and Python then installs none."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_drops_only_the_episode_in_progress(tmp_path: Path) -> None:
    out = tmp_path / "pusht.zarr"
    device = InterruptingOperator(make_task("PushT", episode_steps=6))
    summary = collect(CollectConfig(task="PushT", out=out, episodes=3, episode_steps=6), device=device)
    assert summary.interrupted and summary.kept == 1 and summary.aborted == 1 and summary.discarded == 0
    assert device.expert is not None  # closed, not lost
    with EpisodeStore.open(out, mode="a") as store:  # the writer lock was released
        assert store.num_episodes == 1 and store.num_steps == 6


def test_bad_options_name_the_field(tmp_path: Path) -> None:
    out = tmp_path / "x.zarr"
    with pytest.raises(
        ValueError,
        match=r"unknown device 'joystick'; expected one of \['gamepad', 'keyboard', "
        r"'scripted', 'spacemouse'\]",
    ):
        collect(CollectConfig(device="joystick", out=out))
    with pytest.raises(ValueError, match="episodes: expected >= 1, got 0"):
        collect(CollectConfig(episodes=0, out=out))
    with pytest.raises(ValueError, match="noise: expected >= 0"):
        collect(CollectConfig(noise=-1.0, out=out))
    with pytest.raises(ValueError, match="unknown task 'PushX'.*Did you mean 'PushT'"):
        collect(CollectConfig(task="PushX", out=out))
    # a twist cannot drive the quadruped's joints: refused before any device or store is opened
    with pytest.raises(TeleopError, match="Quadruped: action_mode: expected 'ee_delta'"):
        collect(CollectConfig(task="Quadruped", device="keyboard", out=out))
    assert not out.exists()


def test_quadruped_can_be_scripted(tmp_path: Path) -> None:
    """The scripted operator's actions pass through unmapped, so joint-space tasks record too."""
    summary = collect(CollectConfig(task="Quadruped", out=tmp_path / "q.zarr", episodes=1, episode_steps=5))
    assert summary.kept == 1
    assert EpisodeStore.open(tmp_path / "q.zarr").episode(0).data["action"].shape == (5, 12)


def test_rate_limiter_paces_and_counts_overruns() -> None:
    # 20 Hz: a wait counts as late 25 ms past its time, more than a sleep overshoots on a loaded 2-core machine
    limiter = RateLimiter(20.0)
    start = time.monotonic()
    for _ in range(10):
        limiter.wait()
    assert 0.45 <= time.monotonic() - start < 1.0 and limiter.late == 0
    time.sleep(0.15)  # a step that overran: no burst of catch-up steps afterwards
    limiter.wait()
    assert limiter.late == 1
    start = time.monotonic()
    limiter.wait()
    assert time.monotonic() - start >= 0.04
    with pytest.raises(ValueError, match="hz: expected a positive rate"):
        RateLimiter(0.0)


def test_realtime_scripted_session_runs_at_the_control_rate(tmp_path: Path) -> None:
    summary = collect(CollectConfig(task="PushT", out=tmp_path / "p.zarr", episodes=1, episode_steps=8, realtime=True))
    dt = np.diff(EpisodeStore.open(tmp_path / "p.zarr").episode(0).data["timestamp"])
    assert np.median(dt) == pytest.approx(1 / 20, abs=0.015)  # PushT runs at 20 Hz
    assert summary.seconds >= 7 / 20
