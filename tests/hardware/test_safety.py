"""The safety filter: whatever a policy asks (NaN, wrong sizes, jumps, targets outside the limits or the
workspace) and whatever the timing (stale joint states, e-stop, a timer running too fast), what it publishes
is finite, inside the joint limits, within the velocity and acceleration limits, and inside the workspace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from robotrl.envs.tasks.push_t import START_QPOS
from robotrl.hardware.robot import RobotConfig
from robotrl.hardware.safety import SafetyFilter, SafetyState

ROBOT = RobotConfig.load("sim_panda")
DT = 1.0 / ROBOT.control_hz
V, A = np.asarray(ROBOT.limits.velocity), np.asarray(ROBOT.limits.acceleration)
HOME = np.asarray(START_QPOS, dtype=np.float64)


def armed(t: float = 0.0) -> SafetyFilter:
    f = SafetyFilter(ROBOT)
    f.observe(HOME, t)
    return f


def run(f: SafetyFilter, targets: list, t0: float = 0.0) -> list[np.ndarray | None]:
    """One step per control period, with a fresh joint state (the commanded one) before each."""
    out = []
    for k, target in enumerate(targets):
        t = t0 + (k + 1) * DT
        f.observe(f.last if f.last is not None else HOME, t)
        out.append(f.step(target, t))
    return out


def test_nothing_is_published_before_a_joint_state() -> None:
    f = SafetyFilter(ROBOT)
    assert f.state is SafetyState.WAITING and f.step(HOME, 0.0) is None
    assert f.counters["blocked_waiting"] == 1


def test_home_is_inside_the_workspace_and_passes() -> None:
    f = armed()
    np.testing.assert_array_equal(f.step(HOME, DT), HOME)
    assert f.counters["published"] == 1 and f.state is SafetyState.ARMED


@pytest.mark.parametrize(
    "bad, counter",
    [
        (np.full(7, np.nan), "rejected_nonfinite"),
        (np.r_[HOME[:6], np.inf], "rejected_nonfinite"),
        (np.zeros(6), "rejected_shape"),
        ("joint1", "rejected_shape"),
        (None, "held_no_target"),
    ],
)
def test_bad_commands_never_reach_the_wire(bad: object, counter: str) -> None:
    """NaN/inf, wrong sizes and no target at all hold (the arm at rest after one step from rest stays put)."""
    f = armed()
    first = f.step(HOME + 0.01, DT)
    f.observe(first, 2 * DT)
    np.testing.assert_array_equal(f.step(bad, 2 * DT), first)
    assert f.counters[counter] == 1 and f.state is SafetyState.HOLDING
    np.testing.assert_array_equal(f.step(HOME + 0.01, 3 * DT), first)  # a good command moves on from there


def test_a_far_target_is_approached_within_velocity_and_acceleration_limits() -> None:
    f = armed()
    target = HOME + np.array([0.3, 0.0, 0.0, 0.0, 0.5, 0.0, 2.0])  # inside the workspace all the way
    path = np.array([HOME] + run(f, [target] * 200))
    assert f.counters["rejected_workspace"] == 0
    v = np.diff(path, axis=0) / DT
    assert np.all(np.abs(v) <= V + 1e-9)
    assert np.all(np.abs(np.diff(np.vstack([np.zeros(7), v]), axis=0)) <= A * DT + 1e-9)
    assert f.counters["limited_acceleration"] > 0 and f.counters["limited_velocity"] > 0
    np.testing.assert_allclose(path[-1], target, atol=1e-9)  # it gets there


def test_position_limits_clip() -> None:
    f = armed()
    beyond = HOME.copy()
    beyond[6] = ROBOT.upper()[6] + 1.0  # joint7 (the wrist: the tool point stays put) above its upper limit
    path = run(f, [beyond] * 100)
    assert all(q is not None and q[6] <= ROBOT.upper()[6] for q in path)
    assert path[-1][6] == pytest.approx(ROBOT.upper()[6], abs=1e-12)
    assert f.counters["clipped_position"] == 100


def test_outside_the_workspace_is_held() -> None:
    f = armed()
    away = HOME.copy()
    away[1] += 0.8  # shoulder forward: the tool point goes below the table
    assert not f._in_workspace(np.clip(away, ROBOT.lower(), ROBOT.upper()))
    out = run(f, [away] * 100)
    assert f.counters["rejected_workspace"] > 0
    for q in out:
        assert q is not None and f._in_workspace(q)


def test_stale_joint_states_hold_within_one_period() -> None:
    f = armed()
    moving = run(f, [HOME + 0.2] * 5)[-1]
    t_last_obs = 5 * DT
    # the joint states stop; the next period after max_obs_age has passed publishes the hold
    t = t_last_obs
    while t - t_last_obs <= ROBOT.max_obs_age:
        t += DT
        out = f.step(HOME + 0.4, t)
    assert t - t_last_obs <= ROBOT.max_obs_age + DT
    assert f.state is SafetyState.HOLDING and f.counters["held_stale"] == 1
    held = out
    np.testing.assert_array_equal(f.step(HOME + 0.4, t + DT), held)  # and it stays put
    assert np.all(np.abs(held - moving) <= V * (t - t_last_obs) + 1e-9)  # moved at most until it went stale


def accelerations_ok(path: np.ndarray) -> bool:
    """Every pair of commands within the velocity limits, every three within the acceleration limits, at the nominal
    period; from rest."""
    v = np.diff(path, axis=0) / DT
    return bool(
        np.all(np.abs(v) <= V + 1e-9) and np.all(np.abs(np.diff(np.vstack([np.zeros(7), v]), axis=0)) <= A * DT + 1e-9)
    )


def test_limits_hold_at_the_nominal_rate_whatever_the_jitter_and_a_hold_decelerates() -> None:
    """+-30% timer jitter, far targets jumping every 40 periods, joint states gone for 50 periods while the arm moves
    (a hold), NaN targets for 10 (a hold) and targets outside the workspace: every command pair is within the
    velocity and acceleration limits at the nominal period, holds included: each comes to rest, never stops at once."""
    rng = np.random.default_rng(0)
    f = armed()
    out, t, target, first_hold = [HOME], 0.0, HOME, -1
    outside = HOME.copy()
    outside[1] += 0.8  # the tool point below the table
    for k in range(400):
        t += DT * rng.uniform(0.7, 1.3)
        if not 163 <= k < 213:
            f.observe(f.last if f.last is not None else HOME, t)
        if k % 40 == 0:
            target = HOME + rng.uniform(-0.3, 0.3, 7)
        asked = np.full(7, np.nan) if 250 <= k < 260 else outside if 300 <= k < 320 else target
        held = f.counters["held_stale"]
        q = f.step(asked, t)
        assert q is not None
        out.append(q)
        if f.counters["held_stale"] == held + 1 == 1:
            first_hold = k
    path = np.array(out)
    assert accelerations_ok(path)
    assert f.counters["held_stale"] > 0 and f.counters["rejected_nonfinite"] == 10
    assert f.counters["rejected_workspace"] > 0 and f.counters["limited_acceleration"] > 0
    moving = np.abs(np.diff(path, axis=0)).max(axis=1)
    # it was moving when the data went stale, braked over more than one period, and came to rest
    assert moving[first_hold - 1] > 1e-3 and moving[first_hold] > 0 and moving[211] == 0


def test_estop_latches_until_a_reset_with_fresh_data() -> None:
    f = armed()
    run(f, [HOME + 0.05] * 3)
    f.estop("operator")
    assert f.step(HOME, 4 * DT) is None and f.step(HOME, 5 * DT) is None
    assert f.counters["blocked_estop"] == 2 and f.status()["state"] == "estopped"
    ok, why = f.reset(10.0)  # the last joint state is seconds old
    assert not ok and "not re-armed" in why and f.step(HOME, 10.0) is None
    measured = HOME + 0.03
    f.observe(measured, 10.0)
    ok, _ = f.reset(10.0)
    assert ok and f.state is SafetyState.ARMED
    # restarts from where the robot is, at rest: the first step is bounded by the acceleration limit
    first = f.step(HOME + 0.5, 10.0 + DT)
    assert first is not None and np.all(np.abs(first - measured) <= A * DT * DT + 1e-12)


def test_a_timer_running_too_fast_is_rate_limited() -> None:
    f = armed()
    assert f.step(HOME, DT) is not None
    assert f.step(HOME, DT + 0.1 * DT) is None and f.counters["rate_limited"] == 1


targets = st.one_of(
    st.none(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=7, max_size=7).map(np.array),
    st.lists(st.floats(-4, 4), min_size=7, max_size=7).map(lambda x: HOME + np.array(x)),
    st.lists(st.floats(-1, 1), min_size=0, max_size=9).map(np.array),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(targets, st.floats(0.2, 3.0), st.booleans()), min_size=1, max_size=30))
def test_whatever_comes_in_what_goes_out_is_safe(steps: list) -> None:
    """Random targets, timer jitter (0.2..3 periods) and dropped joint states: every published command is finite,
    inside the limits and the workspace, within the velocity and acceleration limits from the previous ones."""
    f = armed()
    t, prev, v_prev = 0.0, HOME, np.zeros(7)
    for target, gap, fresh in steps:
        t += gap * DT
        if fresh:
            f.observe(f.last if f.last is not None else HOME, t)
        out = f.step(target, t)
        if out is None:
            continue
        assert out.shape == (7,) and np.all(np.isfinite(out))
        assert np.all(out >= ROBOT.lower()) and np.all(out <= ROBOT.upper())
        assert np.all(np.abs(out - prev) <= V * DT + 1e-9)
        assert np.all(np.abs((out - prev) / DT - v_prev) <= A * DT + 1e-9)  # at the nominal period, holds too
        assert f._in_workspace(out)
        prev, v_prev = out, (out - prev) / DT


def test_an_estop_brakes_at_the_stated_estop_deceleration_then_publishes_nothing() -> None:
    """Where the robot file states an e-stop deceleration, the e-stop brakes the commanded motion to rest at it --
    harder than a hold may -- and then publishes nothing; a stated rate below the acceleration limit is refused."""
    import dataclasses

    stop = 4.0 * A
    robot = dataclasses.replace(ROBOT, limits=dataclasses.replace(ROBOT.limits, estop_deceleration=tuple(stop)))
    f = SafetyFilter(robot)
    f.observe(HOME, 0.0)
    path = [HOME] + run(f, [HOME + np.array([0.3, 0.0, 0.0, 0.0, 0.5, 0.0, 2.0])] * 12)
    f.estop("operator")
    t, ramp = 12 * DT, []
    while (q := f.step(HOME, t := t + DT)) is not None:
        ramp.append(q)
    assert 1 <= len(ramp) < 10 and f.step(HOME, t + DT) is None
    v = np.diff(np.array([path[-2], path[-1], *ramp]), axis=0) / DT
    dv = np.abs(np.diff(v, axis=0))
    assert np.all(dv <= stop * DT + 1e-9) and np.any(dv > A * DT + 1e-9)  # harder than a hold, within the stated
    np.testing.assert_allclose(v[-1], 0.0, atol=1e-12)  # at rest
    data = {"name": "r", "joint_names": ["a"], "limits": {"lower": [-1.0], "upper": [1.0], "velocity": [1.0],
            "acceleration": [5.0], "estop_deceleration": [2.0]}}  # fmt: skip
    with pytest.raises(ValueError, match=r"limits.estop_deceleration: expected at least the acceleration limits"):
        RobotConfig.from_dict(data)
