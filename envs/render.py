"""Offscreen RGB rendering of env states (observations and videos), headless via EGL or OSMesa."""

from __future__ import annotations

import os
from typing import Any

if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
    os.environ["MUJOCO_GL"] = "egl"  # headless default; OSMesa also works (MUJOCO_GL=osmesa)
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import mujoco
import numpy as np

FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)


def _set_state(model: mujoco.MjModel, data: mujoco.MjData, state: np.ndarray, mocap: tuple[np.ndarray, np.ndarray] | None) -> None:
    mujoco.mj_setState(model, data, state, FULLPHYSICS)
    if mocap is not None and model.nmocap:
        data.mocap_pos[:] = mocap[0]
        data.mocap_quat[:] = mocap[1]
    mujoco.mj_forward(model, data)


class BatchRenderer:
    """Renders one image per (env, camera); camera jitter and light scale implement visual randomization."""

    def __init__(self, model: mujoco.MjModel, size: int) -> None:
        self.model = model
        self.renderer = mujoco.Renderer(model, size, size)
        self.data = mujoco.MjData(model)
        self._cam_pos0 = model.cam_pos.copy()
        self._light0 = model.light_diffuse.copy()

    def render(
        self,
        models: list[mujoco.MjModel],
        states: np.ndarray,
        mocap: tuple[np.ndarray, np.ndarray] | None,
        cameras: tuple[str, ...],
        camera_jitter: np.ndarray,
        light_scale: np.ndarray,
    ) -> dict[str, np.ndarray]:
        n, s = len(models), self.renderer.height
        out = {cam: np.empty((n, s, self.renderer.width, 3), np.uint8) for cam in cameras}
        m = self.model
        try:
            for i in range(n):
                _set_state(m, self.data, states[i], None if mocap is None else (mocap[0][i], mocap[1][i]))
                m.light_diffuse[:] = np.clip(self._light0 * light_scale[i], 0.0, 1.0)
                for c, cam in enumerate(cameras):
                    cid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, cam)
                    m.cam_pos[cid] = self._cam_pos0[cid] + camera_jitter[i, c]
                    self.renderer.update_scene(self.data, camera=cam)
                    out[cam][i] = self.renderer.render()
        finally:
            m.cam_pos[:] = self._cam_pos0
            m.light_diffuse[:] = self._light0
        return out

    def close(self) -> None:
        self.renderer.close()


def render_frame(
    model: mujoco.MjModel,
    state: np.ndarray,
    mocap: tuple[np.ndarray, np.ndarray] | None,
    camera: str | None,
    size: tuple[int, int] = (480, 640),
) -> np.ndarray:
    """One RGB frame of a state, from a named camera or the default free camera."""
    data = mujoco.MjData(model)
    _set_state(model, data, state, mocap)
    with mujoco.Renderer(model, size[0], size[1]) as renderer:
        renderer.update_scene(data, camera=camera if camera is not None else -1)
        return renderer.render()
