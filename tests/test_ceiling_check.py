"""bench/ceiling_check.py: the replay it sets against the bench's ceiling runs the backend's own steps."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import mujoco
import mujoco.rollout
import numpy as np


def _ceiling_check() -> ModuleType:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import ceiling_check

    return ceiling_check


def test_pieces_cover_every_step_once_and_stop_at_resets() -> None:
    ceiling_check = _ceiling_check()
    reset = np.random.default_rng(0).random((50, 6)) < 0.1
    groups = ceiling_check.pieces(reset, 8)
    covered = np.zeros(reset.shape, int)
    for length, where in groups.items():
        assert length in (1, 2, 4, 8)
        for env, first in where:
            covered[first : first + length, env] += 1
            assert not reset[first : first + length - 1, env].any(), "a piece runs on past a reset"
    assert (covered == 1).all()


def test_exact_replay_reproduces_the_backends_trajectory() -> None:
    """Each piece of the exact replay, from its recorded state and warm start with the recorded controls, ends in the
    state the backend stepped to (where that env did not reset there): the replay is the backend's physics, auto-resets
    included, and the continued one is not."""
    ceiling_check = _ceiling_check()
    model, chunk = ceiling_check.recorded_chunk("Quadruped", 4, 40, seed=0)
    assert chunk.reset.any()  # the check covers auto-resets
    pool, datas = mujoco.rollout.Rollout(nthread=0), [mujoco.MjData(model)]
    groups = ceiling_check.pieces(chunk.reset, 4)
    calls = ceiling_check.replay_calls(model, chunk, groups)
    ceiling_check.replay(pool, datas, model, calls)
    checked = 0
    for (length, where), call in zip(groups.items(), calls, strict=True):
        for roll, (env, first) in enumerate(where):
            last = first + length - 1
            if last + 1 < len(chunk.reset) and not chunk.reset[last, env]:
                np.testing.assert_allclose(call.outputs["state"][roll, -1], chunk.states[last + 1, env], atol=1e-9)
                checked += 1
    assert checked > 10
    continued = ceiling_check.replay_calls(model, chunk, {40: [(env, 0) for env in range(4)]})
    ceiling_check.replay(pool, datas, model, continued)
    env = int(np.nonzero(chunk.reset.any(axis=0))[0][0])
    after = int(np.nonzero(chunk.reset[:, env])[0][0]) + 1  # the step after its first reset
    state = continued[0].outputs["state"][env, after * chunk.substeps - 1]
    assert not np.allclose(state, chunk.states[after, env], atol=1e-3)
