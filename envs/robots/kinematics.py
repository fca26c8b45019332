"""A serial chain read from a compiled MuJoCo model: forward kinematics, the site's Jacobian and damped-least-squares
IK, batched and written once against an array namespace `xp` (numpy or jax.numpy).

Every number comes from the model (`body_pos`, `body_quat`, `jnt_axis`, `jnt_pos`, `jnt_range`, `qpos0`, `site_pos`,
`site_quat`) and every step is the one `mj_kinematics` takes, so the chain agrees with MuJoCo's own `mj_kinematics`
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
class _Joint:
    index: int  # column of q
    hinge: bool  # else slide
    axis: np.ndarray  # (3,) in the frame before it (its body's frame, or the previous joint's)
    pos: np.ndarray  # (3,) anchor, in the same frame
    anchor: np.ndarray  # (3,) anchor in the frame after it (hinge: where the origin moves back from)
    qpos0: float
    rotation: list[list[tuple[float, float, float]]]
    """the rotation from the frame before it to the frame after it, by entry (i, j) as the coefficients (constant,
    of sin, of cos) of the joint's angle: its body's fixed rotation folded into the body's first hinge"""


@dataclass(frozen=True)
class _Body:
    pos: np.ndarray  # (3,) in the parent frame
    joints: tuple[_Joint, ...]
    rest: np.ndarray | None  # the body's fixed rotation when no hinge of it took it in


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


def _cross(xp: Any, a: Any, b: Any) -> Any:
    """Cross product over the last axis (cheaper than np.cross for small batched arrays)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return xp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def joint_range(model: mujoco.MjModel, joint: int) -> tuple[float, float]:
    """A joint's position limits; an unlimited one (a URDF 'continuous' joint) turns a full turn either way."""
    if not model.jnt_limited[joint]:
        return -2 * np.pi, 2 * np.pi
    lo, hi = model.jnt_range[joint]
    return float(lo), float(hi)


Columns = tuple[Any, Any, Any]
"""a batch of rotations as its three columns, each (n, 3): composing with a constant skips its zero entries, so a
link costs a few elementwise operations (this runs every control step, where stacked 3x3 matmuls cost 2-3x more)"""


def _times(xp: Any, cols: Columns, v: np.ndarray) -> Any:
    """R @ v for a constant vector v (3,): (n, 3)."""
    terms = [cols[i] * float(v[i]) for i in range(3) if v[i] != 0.0]
    return sum(terms[1:], terms[0]) if terms else xp.zeros_like(cols[0])


def _scaled(x: Any, k: float) -> Any:
    return x if k == 1.0 else -x if k == -1.0 else x * k


def _compose(xp: Any, cols: Columns, mat: Any) -> Columns:
    """The columns of R @ M, M given as mat[i][j]: a constant float or an (n, 1) array per entry."""
    out = []
    for j in range(3):
        terms = []
        for i in range(3):
            m = mat[i][j]
            if isinstance(m, float):
                if m == 0.0:
                    continue
                terms.append(_scaled(cols[i], m))
            else:
                terms.append(cols[i] * m)
        out.append(sum(terms[1:], terms[0]) if terms else xp.zeros_like(cols[0]))
    return out[0], out[1], out[2]


def _axis_rotation(axis: np.ndarray, pre: np.ndarray) -> list[list[tuple[float, float, float]]]:
    """`pre` times the rotation about the unit `axis` by an angle with sine s and cosine c, entry (i, j) as the
    coefficients (constant, of s, of c): pre (I + s K + (1 - c) K^2) (Rodrigues)."""
    k = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    k2 = k @ k
    const, sin, cos = (_snap(pre @ m) for m in (np.eye(3) + k2, k, -k2))
    return [[(float(const[i, j]), float(sin[i, j]), float(cos[i, j])) for j in range(3)] for i in range(3)]


def _entries(rows: list[list[tuple[float, float, float]]], s: Any, c: Any) -> list[list[Any]]:
    """The entries of `_axis_rotation` for the sines and cosines s, c (n, 1): floats where constant."""
    out: list[list[Any]] = []
    for row in rows:
        out.append([])
        for const, ks, kc in row:
            terms = [_scaled(x, k) for x, k in ((s, ks), (c, kc)) if k != 0.0]
            if not terms:
                out[-1].append(const)
                continue
            value = sum(terms[1:], terms[0])
            out[-1].append(value + const if const else value)
    return out


class Chain:
    """The bodies from the world to `site`, the hinge and slide joints on them (in that order: the columns of `q`)
    and the site's offset in its body. Every joint on the path is part of the chain; a free or ball joint on it is
    refused (an arm's base is welded or a mocap, not floating)."""

    def __init__(self, model: mujoco.MjModel, site: str) -> None:
        sid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site)
        if sid < 0:
            have = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SITE, i) for i in range(model.nsite)]
            raise ValueError(f"chain: site {site!r} is not in the model; it has {have}")
        path, body = [], int(model.site_bodyid[sid])
        while body != 0:
            path.append(body)
            body = int(model.body_parentid[body])
        bodies: list[_Body] = []
        names: list[str] = []
        jids: list[int] = []
        for b in reversed(path):
            joints, pre = [], _quat_mat(model.body_quat[b])  # the body's fixed rotation, until a hinge takes it in
            for j in range(int(model.body_jntadr[b]), int(model.body_jntadr[b] + model.body_jntnum[b])):
                kind = int(model.jnt_type[j])
                name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)
                if kind not in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
                    raise ValueError(
                        f"chain: joint {name!r} on the path to {site!r} is free or ball; expected hinge or slide"
                    )
                hinge = kind == mujoco.mjtJoint.mjJNT_HINGE
                axis, pos = _snap(model.jnt_axis[j].copy()), _snap(model.jnt_pos[j].copy())
                adr = int(model.jnt_qposadr[j])
                joints.append(
                    _Joint(
                        len(names),
                        hinge,
                        _snap(pre @ axis),
                        _snap(pre @ pos),
                        pos,
                        float(model.qpos0[adr]),
                        _axis_rotation(axis, pre),
                    )
                )
                if hinge:
                    pre = np.eye(3)
                names.append(name)
                jids.append(j)
            rest = None if np.array_equal(pre, np.eye(3)) else pre
            bodies.append(_Body(_snap(model.body_pos[b].copy()), tuple(joints), rest))
        self.bodies: tuple[_Body, ...] = tuple(bodies)
        self.site, self.site_pos, self.site_rot = site, model.site_pos[sid].copy(), _quat_mat(model.site_quat[sid])
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
        n = q.shape[0]
        pos = xp.zeros((n, 3))
        eye = np.eye(3)
        cols: Columns = (xp.zeros((n, 3)) + eye[0], xp.zeros((n, 3)) + eye[1], xp.zeros((n, 3)) + eye[2])
        axes, anchors, hinges = [], [], []
        for body in self.bodies:
            pos = pos + _times(xp, cols, body.pos)
            for joint in body.joints:
                x = q[:, joint.index : joint.index + 1] - joint.qpos0  # (n, 1)
                axis = _times(xp, cols, joint.axis)
                if joint.hinge:
                    off = bool(joint.pos.any())  # an anchor away from the body's origin moves the origin
                    anchor = pos + _times(xp, cols, joint.pos) if off else pos
                    cols = _compose(xp, cols, _entries(joint.rotation, xp.sin(x), xp.cos(x)))
                    pos = anchor - _times(xp, cols, joint.anchor) if off else pos
                else:
                    anchor = pos
                    pos = pos + axis * x
                axes.append(axis)
                anchors.append(anchor)
                hinges.append(joint.hinge)
            if body.rest is not None:
                cols = _compose(xp, cols, body.rest.tolist())
        site = pos + _times(xp, cols, self.site_pos)
        cols = _compose(xp, cols, self.site_rot.tolist())
        site_rot = xp.stack(cols, -1)
        axes_, anchors_ = xp.stack(axes, 1), xp.stack(anchors, 1)  # (n, dof, 3)
        hinge = np.array(hinges)
        linear = _cross(xp, axes_, site[:, None, :] - anchors_)
        if not hinge.all():  # a slide joint moves the site along its axis and turns nothing
            linear = xp.where(xp.asarray(hinge)[None, :, None], linear, axes_)
            axes_ = axes_ * xp.asarray(hinge, dtype=axes_.dtype)[None, :, None]
        return site, site_rot, xp.concatenate([xp.swapaxes(linear, 1, 2), xp.swapaxes(axes_, 1, 2)], 1)

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
        the rotation `target_rot` (n, 3, 3) (None: position only), a redundant arm's null space pulled towards
        `home` (dof,), the step clipped to `cfg.max_joint_step` and the result to the joint limits. `fk` is
        `forward(xp, q)` if the caller has it."""
        pos, rot, jac = fk if fk is not None else self.forward(xp, q)
        err = target_pos - pos
        if target_rot is not None:
            err_rot = 0.5 * _cross(xp, xp.swapaxes(rot, 1, 2), xp.swapaxes(target_rot, 1, 2)).sum(axis=1)
            err = xp.concatenate([err, err_rot], axis=-1)
        else:
            jac = jac[:, :3]
        rows = jac.shape[1]
        jac_t = xp.swapaxes(jac, 1, 2)
        jt_inv = jac_t @ xp.linalg.inv(jac @ jac_t + (cfg.damping**2) * xp.eye(rows))  # J^T (J J^T + λ²I)^-1
        dq = (jt_inv @ err[:, :, None])[:, :, 0]
        if self.dof > rows:  # a redundant arm: the spare motion drifts towards `home`
            to_home = (xp.asarray(home) - q)[:, :, None]
            dq = dq + cfg.nullspace_gain * (to_home - jt_inv @ (jac @ to_home))[:, :, 0]
        dq = xp.clip(dq, -cfg.max_joint_step, cfg.max_joint_step)
        return xp.clip(q + dq, xp.asarray(self.limits[:, 0]), xp.asarray(self.limits[:, 1]))

    def from_unit(self, xp: Any, action: Any) -> Any:
        """Joint positions for an action in [-1, 1]^dof spanning each joint's full range (`joint_pos` action mode)."""
        lo, hi = xp.asarray(self.limits[:, 0]), xp.asarray(self.limits[:, 1])
        return lo + 0.5 * (action[:, : self.dof] + 1.0) * (hi - lo)
