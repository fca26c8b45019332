"""The safety filter between a policy and the wire: whatever the policy asks, what is published is finite, inside
the robot's joint limits, reachable at its velocity and acceleration limits, inside the end-effector workspace,
and never based on stale observations. Always on; pure numpy, so the same object runs in a ROS 2 node, a test,
or a simulation loop.

    safety = SafetyFilter(RobotConfig.load("franka_fr3"))
    safety.observe(q_measured, stamp=now)         # every joint-state message
    command = safety.step(policy_target, now)     # every control period: publish `command` unless it is None

`step` returns the joint positions to publish, or None when nothing may be published (e-stopped, no joint state
seen yet, or called again within half a period). A command that is NaN/inf or of the wrong size never reaches the
wire: a hold does. A command whose end effector would leave the workspace -- at it, or on the way
to rest from it at the acceleration limit -- is replaced by a hold; so is every command once the last observation
is older than `robot.max_obs_age` (the node holds within one control period of the data going stale). Position
limits clip, velocity and acceleration limits shorten the step towards the target. The limits are held at the
robot's nominal period whatever the timer's jitter: every command is one nominal period of motion from the last
(a controller interpolating at that rate moves no faster), so a late tick moves the arm less, never more. A hold
decelerates the commanded motion to rest within the acceleration limit and stays there; only the e-stop stops
harder: at the robot file's stated `estop_deceleration` to rest and then nothing, or, where it states none,
nothing more at once (the driver's own stop). `estop` latches until `reset`, which re-arms only with
a fresh observation and restarts from the measured position. Every intervention is counted (`counters`), for the
node's diagnostics.

A floating-base robot (a legged one, its robot file's `base`) is judged by its body too: a fall (the base tilted past
`base.max_tilt` or below `base.min_height`, `observe_base`) or a measured joint speed past its velocity limit
e-stops it, and its e-stop is the driver's damping mode (the node publishes it), not a frozen posture. Its joint
targets are PD set-points, as in training: clipped to the position limits, not shaped into a trajectory.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from robotrl.hardware.floating_base import BaseReading
from robotrl.hardware.robot import RobotConfig


class SafetyState(enum.StrEnum):
    WAITING = "waiting"
    """no joint state yet: nothing to hold to, nothing is published"""
    ARMED = "armed"
    HOLDING = "holding"
    """the last step held position (stale observations, or a command that could not be made safe)"""
    ESTOPPED = "estopped"


#: the counters `SafetyFilter.counters` keeps (all start at 0)
COUNTERS = (
    "published",
    "held_stale",
    "held_no_target",
    "rejected_nonfinite",
    "rejected_shape",
    "rejected_workspace",
    "clipped_position",
    "limited_velocity",
    "limited_acceleration",
    "rate_limited",
    "blocked_estop",
    "blocked_waiting",
    "estops",
    "resets",
    "falls",
    "overspeed",
)


class SafetyFilter:
    def __init__(self, robot: RobotConfig) -> None:
        self.robot = robot
        self.lower, self.upper = robot.lower(), robot.upper()
        self.v_max = np.asarray(robot.limits.velocity, dtype=np.float64)
        self.a_max = np.asarray(robot.limits.acceleration, dtype=np.float64)
        self.period = 1.0 / robot.control_hz
        self.fk = _tool_point(robot)
        self.counters: Counter[str] = Counter({k: 0 for k in COUNTERS})
        self.state = SafetyState.WAITING
        self.estop_reason = ""
        self.measured: np.ndarray | None = None
        self.obs_stamp = -np.inf
        self.last: np.ndarray | None = None  # last published command
        self.last_time = -np.inf
        self.velocity = np.zeros(robot.dof)  # of the published commands

    # --- inputs ------------------------------------------------------------------------------------
    def observe(self, q: np.ndarray, stamp: float, dq: np.ndarray | None = None) -> None:
        """The measured joint positions (robot's joint order) and when they were measured or received; a floating
        base's joint velocities `dq` too (one past its limit e-stops it: damping)."""
        q = np.asarray(q, dtype=np.float64)
        if q.shape != (self.robot.dof,) or not np.all(np.isfinite(q)):
            raise ValueError(f"SafetyFilter.observe: expected {self.robot.dof} finite joint positions, got {q!r}")
        self.measured, self.obs_stamp = q, float(stamp)
        if self.state is SafetyState.WAITING:
            self.state = SafetyState.ARMED
        if self.robot.base is not None and dq is not None and self.state is not SafetyState.ESTOPPED:
            over = np.flatnonzero(np.abs(dq) > self.v_max)
            if over.size:
                i = int(over[0])
                self.counters["overspeed"] += 1
                self.estop(f"joint speed: {self.robot.joint_names[i]} at {dq[i]:.1f} rad/s, limit {self.v_max[i]:g}")

    def observe_base(self, reading: BaseReading) -> None:
        """A floating base's IMU and odometry: a fall (tilt or height past the robot file's `base`) e-stops it."""
        base = self.robot.base
        assert base is not None, "observe_base: the robot has no floating base"
        if self.state is SafetyState.ESTOPPED:
            return
        tilt = float(np.arccos(np.clip(reading.up_z(), -1.0, 1.0)))
        height = float(reading.position[2])
        if tilt > base.max_tilt or height < base.min_height:
            self.counters["falls"] += 1
            why = f"tilt {tilt:.2f} rad > {base.max_tilt:g}" if tilt > base.max_tilt else f"height {height:.3f} m"
            self.estop(f"fall: {why}" + ("" if tilt > base.max_tilt else f" < {base.min_height:g}"))

    def stale(self, now: float) -> bool:
        return now - self.obs_stamp > self.robot.max_obs_age

    def estop(self, reason: str = "e-stop") -> None:
        if self.state is not SafetyState.ESTOPPED:
            self.counters["estops"] += 1
        self.state, self.estop_reason = SafetyState.ESTOPPED, reason

    def reset(self, now: float) -> tuple[bool, str]:
        """Re-arm after an e-stop: only with a fresh joint state, restarting from the measured position."""
        if self.measured is None or self.stale(now):
            return False, (
                f"not re-armed: no joint state in the last {self.robot.max_obs_age} s "
                f"(last {'never' if self.measured is None else f'{now - self.obs_stamp:.3f} s ago'})"
            )
        self.state, self.estop_reason = SafetyState.ARMED, ""
        self.restart()
        self.counters["resets"] += 1
        return True, "re-armed at the measured position"

    def restart(self) -> None:
        """Forget the last published command: the next one is limited from the measured position, at rest (the
        arm was moved by another controller since, e.g. a policy the operator takes over from)."""
        self.last, self.last_time, self.velocity = None, -np.inf, np.zeros(self.robot.dof)

    # --- the filter --------------------------------------------------------------------------------
    def step(self, target: Any, now: float) -> np.ndarray | None:
        """The command to publish at time `now` for the policy's joint `target` (None: the policy has none yet)."""
        if self.state is SafetyState.ESTOPPED:
            self.counters["blocked_estop"] += 1
            return self._estop_ramp(now)
        if self.measured is None:
            self.counters["blocked_waiting"] += 1
            return None
        if now - self.last_time < 0.5 * self.period:  # a second caller, or a timer running far too fast
            self.counters["rate_limited"] += 1
            return None
        if self.stale(now):
            return self._hold(now, "held_stale")
        if target is None:
            return self._hold(now, "held_no_target")
        try:
            q = np.asarray(target, dtype=np.float64)
        except (TypeError, ValueError):
            q = np.zeros(0)
        if q.shape != (self.robot.dof,) or not np.all(np.isfinite(q)):  # nothing of it reaches the wire: a hold
            return self._hold(now, "rejected_shape" if q.shape != (self.robot.dof,) else "rejected_nonfinite")
        clipped = np.clip(q, self.lower, self.upper)
        if not np.array_equal(clipped, q):
            self.counters["clipped_position"] += 1
        q, velocity, inside = self._next(clipped)
        if not inside:
            return self._hold(now, "rejected_workspace")
        return self._publish(q, now, velocity)

    def _next(self, clipped: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """The command one period after the last for a target within the joint limits, its velocity, and whether
        the end effector stays in the workspace at it and on its way to rest (always, without a workspace)."""
        q = clipped if self.robot.base is not None else self._limit_motion(clipped)
        ref = self.last if self.last is not None else self.measured
        velocity = (q - ref) / self.period
        inside = self.fk is None or all(self._in_workspace(p) for p in (q, *self._braking(q, velocity)))
        return q, velocity, inside

    @contextmanager
    def previewing(self) -> Iterator[Callable[[Any], tuple[np.ndarray, np.ndarray] | None]]:
        """A function that takes the next period's target and returns the (command, velocity) the filter would
        publish for it after the last one, as if nothing else happened -- the points a trajectory controller is
        sent ahead -- or None once a target would not pass (non-finite, misshaped, out of the workspace). The
        filter's state and counters are as before when the block ends."""
        saved = (self.last, self.last_time, self.velocity, self.counters.copy(), self.state)
        stopped = False

        def step(target: Any) -> tuple[np.ndarray, np.ndarray] | None:
            nonlocal stopped
            q = np.asarray(target, dtype=np.float64)
            if stopped or self.last is None or q.shape != (self.robot.dof,) or not np.all(np.isfinite(q)):
                stopped = True
                return None
            nxt, velocity, inside = self._next(np.clip(q, self.lower, self.upper))
            if not inside:
                stopped = True
                return None
            self.last, self.velocity = nxt, velocity
            return nxt.copy(), velocity.copy()

        try:
            yield step
        finally:
            self.last, self.last_time, self.velocity, self.counters, self.state = saved

    def _limit_motion(self, q: np.ndarray) -> np.ndarray:
        """Shorten the step from the last command so that its velocity and change of velocity are within limits,
        at the nominal period (whenever the tick comes: a jittering timer never raises the rate of motion).

        The speed towards the target, and towards the joint limit it moves to, is also capped at what can still
        brake to rest there at the acceleration limit (the discrete-time stopping speed): a target is reached
        without overshoot, and a joint limit is never hit at speed, whatever target comes next or when a hold
        brakes."""
        ref = self.last if self.last is not None else self.measured
        assert ref is not None
        dt = self.period
        err = q - ref
        a_dt = self.a_max * dt

        def brake(distance: np.ndarray) -> np.ndarray:
            """The fastest speed that braking by a_dt a period brings to rest within `distance`: with n periods
            of motion it covers dt (n v - a_dt n (n - 1) / 2), so n is the fewest periods whose full-speed sum
            reaches the distance; braking from it, the next period's speed is this function of what is left."""
            steps = np.maximum(distance, 0.0) / dt  # the distance in speed-periods
            n = np.maximum(np.ceil((np.sqrt(1.0 + 8.0 * steps / a_dt) - 1.0) / 2.0), 1.0)
            return (steps + a_dt * n * (n - 1.0) / 2.0) / n

        room = np.where(err >= 0, self.upper - ref, ref - self.lower)
        v = np.sign(err) * np.minimum(np.abs(err) / dt, np.minimum(brake(np.abs(err)), brake(room)))
        if np.any(np.abs(v) > self.v_max):
            self.counters["limited_velocity"] += 1
            v = np.clip(v, -self.v_max, self.v_max)
        v_acc = np.clip(v, self.velocity - a_dt, self.velocity + a_dt)
        if not np.array_equal(v_acc, v):
            self.counters["limited_acceleration"] += 1
        return np.clip(ref + np.clip(v_acc, -self.v_max, self.v_max) * dt, self.lower, self.upper)

    def _in_workspace(self, q: np.ndarray) -> bool:
        ws = self.robot.workspace
        assert ws is not None and self.fk is not None
        p = self.fk(q)
        return bool(np.all(p >= ws.lower) and np.all(p <= ws.upper))

    def _decelerated(self, velocity: np.ndarray, rate: np.ndarray | None = None) -> np.ndarray:
        """One period's velocity on the way to rest at the acceleration limit (or at `rate`)."""
        rate = self.a_max if rate is None else rate
        return np.sign(velocity) * np.maximum(np.abs(velocity) - rate * self.period, 0.0)

    def _braked(self, rate: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The command one period after the last on the way to rest at the acceleration limit (or `rate`), and
        its velocity."""
        assert self.last is not None
        velocity = self._decelerated(self.velocity, rate)
        return np.clip(self.last + velocity * self.period, self.lower, self.upper), velocity

    def _estop_ramp(self, now: float) -> np.ndarray | None:
        """While e-stopped: the commanded motion braked to rest at the robot file's e-stop deceleration, then
        nothing; nothing at all where the file states none (the driver's own stop)."""
        stop = self.robot.limits.estop_deceleration
        if stop is None or self.last is None or not np.any(self.velocity != 0.0):
            return None
        q, velocity = self._braked(np.asarray(stop, dtype=np.float64))
        self.velocity, self.last, self.last_time = velocity, q, now
        self.counters["published"] += 1
        return q.copy()

    def _braking(self, q: np.ndarray, velocity: np.ndarray) -> list[np.ndarray]:
        """Where a hold from command `q` moving at `velocity` passes on its way to rest: half-way and at rest (the
        workspace is checked there too, so that no hold has to stop harder than the acceleration limit). In closed
        form: after k periods of braking a joint has moved T (k |v| - a T k (k + 1) / 2) while it still moves."""
        speed, drop = np.abs(velocity), self.a_max * self.period
        moving = np.floor(np.divide(speed, drop, out=np.zeros_like(speed), where=np.isfinite(drop)))
        periods = int(moving.max(initial=0.0))
        if periods == 0:
            return []

        def after(k: int) -> np.ndarray:
            steps = np.minimum(k, moving)
            distance = self.period * (steps * speed - np.where(steps > 0, drop, 0.0) * steps * (steps + 1) / 2)
            return np.clip(q + np.sign(velocity) * distance, self.lower, self.upper)

        return [after((periods + 1) // 2), after(periods)]

    def _hold(self, now: float, why: str) -> np.ndarray:
        """Bring the commanded motion to rest within the acceleration limit (at once when nothing was published
        since the last restart: the arm is at rest at its joint state)."""
        self.counters[why] += 1
        if self.last is None:
            assert self.measured is not None
            out = self._publish(self.measured.copy(), now, np.zeros(self.robot.dof))
        else:
            q, velocity = self._braked()
            out = self._publish(q, now, velocity)
        self.state = SafetyState.HOLDING
        return out

    def _publish(self, q: np.ndarray, now: float, velocity: np.ndarray) -> np.ndarray:
        self.velocity = velocity
        self.last, self.last_time = q, now
        self.state = SafetyState.ARMED
        self.counters["published"] += 1
        return q.copy()

    def status(self) -> dict[str, Any]:
        """State, reason and counters: what the node publishes as diagnostics."""
        return {"state": self.state.value, "estop_reason": self.estop_reason, **dict(self.counters)}


def _tool_point(robot: RobotConfig) -> Any:
    """q (dof,) -> tool point (3,) in the base frame, or None when the robot has no workspace to check: the robot
    description's forward kinematics (MuJoCo's mj_kinematics) of the arm's joints; others, such as a gripper's
    fingers, move no link of the arm."""
    if robot.workspace is None:
        return None
    model, arm = robot.load_model(), robot.arm_indices()
    return lambda q: model.ee_position(np.asarray(q, dtype=np.float64)[arm])
