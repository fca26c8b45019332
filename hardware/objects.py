"""A task's objects as a perception or motion-capture system sees them: one pose per object body, in the world (the
arm's base) frame, as `geometry_msgs/PoseStamped` on a topic of its own (the robot file's `topics.objects`).

An object is a body of the task's model that moves on joints of its own (none of them the robot's): PushT's
`block` (two slides and a hinge: it stays on the table), PickPlace's `cube_<colour>` (a free joint). The deploy
node turns each pose back into the object's joint positions -- directly for a free joint, otherwise the joint
positions whose pose is nearest to it (a few Gauss-Newton steps on MuJoCo's own kinematics and Jacobian, so a
planar object's slight tilt in a real camera's estimate is projected out) -- and its joint velocities from two
successive poses over their stamps (`mj_differentiatePos`). With the arm's joint states and the goal, the task's own
`observe` then makes the policy's observation, as in training.

Torch-free and rclpy-free (`hardware/messages.py` converts the messages).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from robotrl.hardware.floating_base import FREE, base_joint

#: Gauss-Newton steps at most, and the step size (joint units) below which a pose's joint positions are final
ITERATIONS, TOLERANCE = 20, 1e-12


@dataclass(frozen=True)
class ObjectJoints:
    body: int
    qadr: np.ndarray
    """(k,) the object's entries of qpos"""
    dadr: np.ndarray
    """(m,) its entries of qvel"""
    free: bool


class TaskObjects:
    """The objects of `model`: bodies with joints, none of which is in `robot_joints` (joint ids)."""

    def __init__(self, model: mujoco.MjModel, robot_joints: Collection[int]) -> None:
        self.model, self.data = model, mujoco.MjData(model)
        self.joints: dict[str, ObjectJoints] = {}
        for body in range(1, model.nbody):
            first, count = int(model.body_jntadr[body]), int(model.body_jntnum[body])
            ids = range(first, first + count)
            if count == 0 or any(j in robot_joints for j in ids):
                continue
            qadr, dadr = _addresses(model, ids, qpos=True), _addresses(model, ids, qpos=False)
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body)
            free = count == 1 and int(model.jnt_type[first]) == FREE
            self.joints[name] = ObjectJoints(body, qadr, dadr, free)
        self._qpos0 = model.qpos0.copy()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.joints)

    def poses(self, qpos: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each object's world pose (position (3,), unit quaternion (4,) w first) at joint positions `qpos` (nq,)."""
        self.data.qpos[:] = qpos
        mujoco.mj_kinematics(self.model, self.data)
        return {k: (self.data.xpos[o.body].copy(), self.data.xquat[o.body].copy()) for k, o in self.joints.items()}

    def qpos_of(self, name: str, pos: np.ndarray, quat: np.ndarray, guess: np.ndarray | None = None) -> np.ndarray:
        """The object's joint positions (its qpos entries) whose pose is `pos`, `quat` (w first), or nearest to it
        (position in metres and rotation in radians weighed alike); Gauss-Newton from `guess` (its qpos entries)."""
        o = self.joints[name]
        if o.free:  # q and -q are one rotation: the sign the guess has (continuity), else w >= 0
            sign = np.sign(quat @ guess[3:]) if guess is not None else np.sign(quat[0])
            return np.concatenate([pos, (sign or 1.0) * quat / np.linalg.norm(quat)])
        m, d = self.model, self.data
        d.qpos[:] = self._qpos0
        if guess is not None:
            d.qpos[o.qadr] = guess
        jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        error, rotation, step = np.zeros(6), np.zeros(3), np.zeros(m.nv)
        for _ in range(ITERATIONS):
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)  # the Jacobian's joint axes
            error[:3] = pos - d.xpos[o.body]
            mujoco.mju_subQuat(rotation, quat, d.xquat[o.body])  # in the body's frame
            error[3:] = d.xmat[o.body].reshape(3, 3) @ rotation
            mujoco.mj_jacBody(m, d, jacp, jacr, o.body)
            jac = np.vstack([jacp[:, o.dadr], jacr[:, o.dadr]])
            step[:] = 0.0
            step[o.dadr] = np.linalg.lstsq(jac, error, rcond=None)[0]
            mujoco.mj_integratePos(m, d.qpos, step, 1.0)
            if np.abs(step).max() < TOLERANCE:
                break
        return d.qpos[o.qadr].copy()

    def qvel_of(self, name: str, before: np.ndarray, after: np.ndarray, dt: float) -> np.ndarray:
        """The object's joint velocities (its qvel entries) that take its joint positions `before` to `after` in
        `dt` seconds."""
        o = self.joints[name]
        q1, q2, qvel = self._qpos0.copy(), self._qpos0.copy(), np.zeros(self.model.nv)
        q1[o.qadr], q2[o.qadr] = before, after
        mujoco.mj_differentiatePos(self.model, qvel, dt, q1, q2)
        return qvel[o.dadr]


def task_objects(task: Any, model: mujoco.MjModel | None = None) -> TaskObjects:
    """A robotrl task's objects (in `model`, a perturbed copy of the task's, if given): its robot's joints are
    those it names, those its actuators drive, and a floating base's."""
    model = task.model if model is None else model
    robot = {model.joint(name).id for name in task.joint_names()}
    robot |= {int(model.actuator_trnid[a, 0]) for a in range(model.nu)}
    base = base_joint(model)
    return TaskObjects(model, robot if base is None else {*robot, base})


def check_named(objects: TaskObjects, named: Mapping[str, str], robot: str, task: str) -> None:
    """That a robot file's `topics.objects` names a topic for each of the task's objects; a ValueError naming the
    missing ones."""
    missing = [k for k in objects.names if k not in named]
    if missing:
        raise ValueError(
            f"robot {robot}: topics.objects: expected a PoseStamped topic for each of {task}'s objects "
            f"{list(objects.names)}, got none for {missing}"
        )


def _addresses(model: mujoco.MjModel, joints: range, qpos: bool) -> np.ndarray:
    """The entries of qpos (`qpos`) or of qvel that `joints` have: free 7/6 each, ball 4/3, slide and hinge 1."""
    wide = {FREE: (7, 6), int(mujoco.mjtJoint.mjJNT_BALL): (4, 3)}
    out: list[int] = []
    for j in joints:
        start = int(model.jnt_qposadr[j] if qpos else model.jnt_dofadr[j])
        out += range(start, start + wide.get(int(model.jnt_type[j]), (1, 1))[0 if qpos else 1])
    return np.array(out, dtype=np.int64)
