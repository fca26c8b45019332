"""A serial chain read from a compiled MuJoCo model: forward kinematics, the site's Jacobian and damped-least-squares
IK, batched and written once against an array namespace `xp` (numpy or jax.numpy).

Every number comes from the model (`body_pos`, `body_quat`, `jnt_axis`, `jnt_pos`, `jnt_range`, `qpos0`, `site_pos`,
`site_quat`) and every transform is one `mj_kinematics` composes, so the chain agrees with MuJoCo's own `mj_kinematics`
and `mj_jacSite` to float rounding for any arm (tests/envs/test_robots.py checks the task arm, a UR5, an SO-101 and
a Panda). It exists beside MuJoCo's functions because a task's controller runs inside the step of both backends:
batched in numpy on the CPU backend and traced by `jax.jit` on MJX, where a C call per env cannot go, and where
`mjx.kinematics` would compute every body of the scene rather than the arm's few.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np


@dataclass(frozen=True)
class IKConfig:
    """Damped-least-squares differential IK, applied once per control step."""

    damping: float = 0.05
    nullspace_gain: float = 0.2
    max_joint_step: float = 0.25  # rad per control step; bounds what one command can ask of the arm


def _quat_mat(quat: np.ndarray) -> np.ndarray:
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, np.asarray(quat, dtype=np.float64))
    return _snap(mat.reshape(3, 3))


def _snap(x: np.ndarray) -> np.ndarray:
    """Entries within float rounding of 0 or +-1 made exact (a quarter turn's cos(pi/2) is 6e-17), so that composing
    with them skips the multiplications."""
    x = np.where(np.abs(x) < 1e-12, 0.0, x)
    return np.where(np.abs(np.abs(x) - 1.0) < 1e-12, np.sign(x), x)


_NEXT, _PREV = np.array([1, 2, 0]), np.array([2, 0, 1])  # each axis' successor and predecessor: (x, y, z) -> y, z, x


def _cross(xp: Any, a: Any, b: Any) -> Any:
    """Cross product over the last axis (cheaper than np.cross for small batched arrays): a x b = a' * b'' - a'' * b',
    with ' and '' the components cycled once and twice."""
    return xp.take(a, _NEXT, axis=-1) * xp.take(b, _PREV, axis=-1) - xp.take(a, _PREV, axis=-1) * xp.take(
        b, _NEXT, axis=-1
    )


def joint_range(model: mujoco.MjModel, joint: int) -> tuple[float, float]:
    """A joint's position limits; an unlimited one (a URDF 'continuous' joint) turns a full turn either way."""
    if not model.jnt_limited[joint]:
        return -2 * np.pi, 2 * np.pi
    lo, hi = model.jnt_range[joint]
    return float(lo), float(hi)


def _homogeneous(rot: np.ndarray, pos: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rot, pos
    return out


def _joint_motion(hinge: bool, axis: np.ndarray, anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A joint's motion as a 4x4 transform linear in (1, s, c): A0 + s A1 + c A2, with s, c the sine and cosine of a
    hinge's angle (Rodrigues: R = I + K^2 + s K - c K^2, turning about `axis` through `anchor`), or s the slide's
    displacement along `axis` (c unused)."""
    zero = np.zeros((4, 4))
    if not hinge:
        a1 = zero.copy()
        a1[:3, 3] = axis
        return np.eye(4), a1, zero
    k = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    k2 = k @ k
    a0, a1, a2 = _homogeneous(np.eye(3) + k2, -k2 @ anchor), zero.copy(), zero.copy()
    a1[:3, :3], a1[:3, 3] = k, -k @ anchor
    a2[:3, :3], a2[:3, 3] = -k2, k2 @ anchor
    return a0, a1, a2


class Chain:
    """The bodies from the world to `site`, the hinge and slide joints on them (in that order: the columns of `q`)
    and the site's offset in its body. Every joint on the path is part of the chain; a free or ball joint on it is
    refused (an arm's base is welded or a mocap, not floating).

    Each joint's transform from the previous joint's frame, its bodies' fixed offsets folded in, is a 4x4 matrix
    linear in the sine and cosine of its angle (in its displacement for a slide): `forward` makes every joint's
    transform in one batched expression and multiplies them down the chain, a few array operations per joint."""

    def __init__(self, model: mujoco.MjModel, site: str) -> None:
        sid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site)
        if sid < 0:
            have = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SITE, i) for i in range(model.nsite)]
            raise ValueError(f"chain: site {site!r} is not in the model; it has {have}")
        path, body = [], int(model.site_bodyid[sid])
        while body != 0:
            path.append(body)
            body = int(model.body_parentid[body])
        names: list[str] = []
        jids: list[int] = []
        terms: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        axes, anchors, hinges, qpos0 = [], [], [], []
        fixed = np.eye(4)  # the fixed transforms since the last joint
        for b in reversed(path):
            fixed = fixed @ _homogeneous(_quat_mat(model.body_quat[b]), _snap(model.body_pos[b].copy()))
            for j in range(int(model.body_jntadr[b]), int(model.body_jntadr[b] + model.body_jntnum[b])):
                kind = int(model.jnt_type[j])
                name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)
                if kind not in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
                    raise ValueError(
                        f"chain: joint {name!r} on the path to {site!r} is free or ball; expected hinge or slide"
                    )
                hinge = kind == mujoco.mjtJoint.mjJNT_HINGE
                axis, anchor = _snap(model.jnt_axis[j].copy()), _snap(model.jnt_pos[j].copy())
                a0, a1, a2 = _joint_motion(hinge, axis, anchor)
                terms.append((_snap(fixed @ a0), _snap(fixed @ a1), _snap(fixed @ a2)))
                fixed = np.eye(4)
                axes.append(axis)  # in the joint's own frame, which its motion leaves in place
                anchors.append(anchor)
                hinges.append(hinge)
                qpos0.append(float(model.qpos0[int(model.jnt_qposadr[j])]))
                names.append(name)
                jids.append(j)
        if not names:
            raise ValueError(f"chain: no hinge or slide joint on the path to {site!r}")
        self.site = site
        self._terms = tuple(np.stack(t) for t in zip(*terms))  # A0, A1, A2 of every joint: (dof, 4, 4) each
        self._site = fixed @ _homogeneous(_quat_mat(model.site_quat[sid]), model.site_pos[sid].copy())
        self._axes, self._anchors = np.stack(axes)[:, :, None], np.stack(anchors)[:, :, None]  # (dof, 3, 1)
        self._hinge = np.array(hinges)
        self._slides = not self._hinge.all()
        self._qpos0 = np.array(qpos0)
        self.joint_names: tuple[str, ...] = tuple(names)
        self.joint_ids: tuple[int, ...] = tuple(jids)
        self.qpos_adr = np.array([int(model.jnt_qposadr[j]) for j in jids], dtype=np.int64)
        self.limits = np.array([joint_range(model, j) for j in jids], dtype=np.float64).reshape(-1, 2)

    @property
    def dof(self) -> int:
        return len(self.joint_names)

    def forward(self, xp: Any, q: Any) -> tuple[Any, Any, Any]:
        """The site's position (n, 3), rotation (n, 3, 3) and geometric Jacobian (n, 6, dof) (linear rows first) in
        the world frame, for joint positions `q` (n, dof)."""
        x = q - xp.asarray(self._qpos0)
        s, c = xp.sin(x), xp.cos(x)
        if self._slides:  # a slide's transform is linear in its displacement
            s = xp.where(xp.asarray(self._hinge), s, x)
        a0, a1, a2 = (xp.asarray(t) for t in self._terms)
        local = a0 + s[:, :, None, None] * a1 + c[:, :, None, None] * a2  # (n, dof, 4, 4)
        frames = [local[:, 0]]
        for j in range(1, self.dof):
            frames.append(frames[-1] @ local[:, j])
        world = xp.stack(frames, 1)  # each joint's frame in the world (n, dof, 4, 4)
        rot = world[:, :, :3, :3]
        axes = (rot @ xp.asarray(self._axes))[..., 0]  # (n, dof, 3)
        anchors = (rot @ xp.asarray(self._anchors))[..., 0] + world[:, :, :3, 3]
        site = frames[-1] @ xp.asarray(self._site)
        pos = site[:, :3, 3]
        linear = _cross(xp, axes, pos[:, None, :] - anchors)
        if self._slides:  # a slide joint moves the site along its axis and turns nothing
            hinge = xp.asarray(self._hinge)[None, :, None]
            linear = xp.where(hinge, linear, axes)
            axes = axes * hinge.astype(axes.dtype)
        return pos, site[:, :3, :3], xp.concatenate([xp.swapaxes(linear, 1, 2), xp.swapaxes(axes, 1, 2)], 1)

    def ik(
        self,
        xp: Any,
        q: Any,
        target_pos: Any,
        target_rot: Any | None,
        home: Any,
        cfg: IKConfig = IKConfig(),
        fk: tuple[Any, Any, Any] | None = None,
    ) -> Any:
        """Joint targets (n, dof) one damped-least-squares step from `q` towards the site at `target_pos` (n, 3) with
        the rotation `target_rot` (n, 3, 3), or one for all envs (3, 3) (None: position only), a redundant arm's null
        space pulled towards `home` (dof,), the step clipped to `cfg.max_joint_step` and the result to the joint
        limits. `fk` is `forward(xp, q)` if the caller has it."""
        pos, rot, jac = fk if fk is not None else self.forward(xp, q)
        err = target_pos - pos
        if target_rot is not None:
            # half the sum over the columns of rot x target_rot: the axial vector of M - M^T, M = rot target_rot^T
            m = rot @ xp.swapaxes(target_rot, -1, -2)
            err_rot = 0.5 * (m[:, _NEXT, _PREV] - m[:, _PREV, _NEXT])
            err = xp.concatenate([err, err_rot], axis=-1)
        else:
            jac = jac[:, :3]
        rows = jac.shape[1]
        jac_t = xp.swapaxes(jac, 1, 2)
        damped = jac @ jac_t + (cfg.damping**2) * xp.eye(rows)  # J J^T + λ²I
        if self.dof > rows:  # a redundant arm: the spare motion drifts towards `home`, both solved in one
            to_home = (xp.asarray(home) - q)[:, :, None]
            y = jac_t @ xp.linalg.solve(damped, xp.concatenate([err[:, :, None], jac @ to_home], -1))
            dq = y[:, :, 0] + cfg.nullspace_gain * (to_home[:, :, 0] - y[:, :, 1])
        else:
            dq = (jac_t @ xp.linalg.solve(damped, err[:, :, None]))[:, :, 0]
        dq = xp.clip(dq, -cfg.max_joint_step, cfg.max_joint_step)
        return xp.clip(q + dq, xp.asarray(self.limits[:, 0]), xp.asarray(self.limits[:, 1]))

    def from_unit(self, xp: Any, action: Any) -> Any:
        """Joint positions for an action in [-1, 1]^dof spanning each joint's full range (`joint_pos` action mode)."""
        lo, hi = xp.asarray(self.limits[:, 0]), xp.asarray(self.limits[:, 1])
        return lo + 0.5 * (action[:, : self.dof] + 1.0) * (hi - lo)
