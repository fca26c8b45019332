"""Offscreen RGB rendering of env states (image observations and videos), headless via EGL or OSMesa.

`mujoco.Renderer` picks its GL backend once, from MUJOCO_GL as it was when `mujoco` was first imported.
Tasks import `mujoco` long before anything renders, so that choice would be made too early (GLFW, which
needs a display). This module therefore owns its GL context: it picks EGL when an EGL context can really be
created (probed once, in a child process, because PyOpenGL binds its platform on first import and cannot
switch back), OSMesa otherwise, and keeps one context, scene and MjData per renderer for all later frames.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import subprocess
import sys
import weakref
from collections import OrderedDict
from typing import Any

if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
    os.environ["MUJOCO_GL"] = "egl"  # headless default, for anyone who imports mujoco after us

import mujoco
import numpy as np

FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
_PROBE = "import mujoco.egl as e; c = e.GLContext(8, 8); c.make_current(); c.free()"
_backend: str | None = None
_live: weakref.WeakSet[_Offscreen] = weakref.WeakSet()
_exit_hook = False


def _egl_works() -> bool:
    env = dict(os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")
    try:
        result = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def gl_backend() -> str:
    """The GL backend this process renders with ('egl', 'osmesa' or 'glfw'), decided once.

    MUJOCO_GL=osmesa (or glfw/glx with a DISPLAY) is honoured; otherwise EGL if it can create a context,
    else OSMesa. The choice is written back to MUJOCO_GL so child processes inherit it without probing.
    """
    global _backend
    if _backend is not None:
        return _backend
    want = os.environ.get("MUJOCO_GL", "").strip().lower()
    if want == "osmesa":
        backend = "osmesa"
    elif want in ("glfw", "glx") and os.environ.get("DISPLAY"):
        backend = "glfw"
    elif os.environ.get("ROBOTRL_GL_PROBED") == "egl":
        backend = "egl"
    else:
        backend = "egl" if _egl_works() else "osmesa"
    platform = {"egl": "egl", "osmesa": "osmesa"}.get(backend)
    current = os.environ.get("PYOPENGL_PLATFORM")
    if platform is not None and current not in (None, platform) and "OpenGL" in sys.modules:
        raise RuntimeError(
            f"render: need PyOpenGL platform {platform!r} for MUJOCO_GL={backend}, but PyOpenGL is already "
            f"loaded with PYOPENGL_PLATFORM={current!r}; set MUJOCO_GL/PYOPENGL_PLATFORM before starting"
        )
    if platform is not None:
        os.environ["PYOPENGL_PLATFORM"] = platform
    os.environ["MUJOCO_GL"] = backend
    if backend == "egl":
        os.environ["ROBOTRL_GL_PROBED"] = "egl"
    _backend = backend
    return backend


def _gl_context(width: int, height: int) -> Any:
    backend = gl_backend()
    if backend == "egl":
        from mujoco.egl import GLContext
    elif backend == "osmesa":
        from mujoco.osmesa import GLContext
    else:
        from mujoco.glfw import GLContext
    global _exit_hook
    if not _exit_hook:  # registered after mujoco.egl's own hook, so it runs before the EGL display goes away
        atexit.register(_close_all)
        _exit_hook = True
    return GLContext(width, height)


class _Offscreen:
    """One GL context + MjrContext + MjvScene on a private copy of a model, rendering (h, w) RGB frames."""

    def __init__(self, model: mujoco.MjModel, height: int, width: int, shadows: bool = True) -> None:
        # a private copy: visual randomization edits its cameras and lights, never the physics model
        self.model = copy.copy(model)
        vis = self.model.vis.global_
        vis.offwidth, vis.offheight = max(vis.offwidth, width), max(vis.offheight, height)
        # the shadow map dominates the cost of software GL (a 4096^2 map with llvmpipe; bench/RESULTS.md,
        # "Measurements behind the code's design"); a map a few times the image size looks the same
        quality = self.model.vis.quality
        quality.shadowsize = int(min(quality.shadowsize, max(512, 4 * max(height, width))))
        self.height, self.width = height, width
        self.data = mujoco.MjData(self.model)
        self._ctx = _gl_context(vis.offwidth, vis.offheight)
        self._ctx.make_current()
        self._con = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_100.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._con)
        self.scene = mujoco.MjvScene(self.model, maxgeom=max(1000, 4 * self.model.ngeom))
        self.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = shadows
        self._option = mujoco.MjvOption()
        self._option.sitegroup[:] = 0  # sites are markers for code (the ee point), not things a camera sees
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._buf = np.empty((height, width, 3), np.uint8)
        self._cams: dict[str | None, mujoco.MjvCamera] = {}
        _live.add(self)

    def camera(self, name: str | None) -> mujoco.MjvCamera:
        cam = self._cams.get(name)
        if cam is None:
            cam = mujoco.MjvCamera()
            if name is None:
                mujoco.mjv_defaultFreeCamera(self.model, cam)
            else:
                cid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, name)
                if cid < 0:
                    raise ValueError(f"render: camera {name!r} is not in the model")
                cam.type, cam.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, cid
            self._cams[name] = cam
        return cam

    def set_state(self, state: np.ndarray, mocap: tuple[np.ndarray, np.ndarray] | None) -> None:
        pose_for_drawing(self.model, self.data, state, mocap)

    def render(self, camera: str | None, out: np.ndarray | None = None) -> np.ndarray:
        self._ctx.make_current()
        mujoco.mjv_updateScene(
            self.model, self.data, self._option, None, self.camera(camera), mujoco.mjtCatBit.mjCAT_ALL.value, self.scene
        )
        mujoco.mjr_render(self._rect, self.scene, self._con)
        mujoco.mjr_readPixels(self._buf, None, self._rect, self._con)
        if out is None:
            out = np.empty_like(self._buf)
        np.copyto(out, self._buf[::-1])  # OpenGL rows run bottom-up
        return out

    def close(self) -> None:
        if self._con is not None:
            self._ctx.make_current()
            self._con.free()
            self._con = None
            self._ctx.free()

    def __del__(self) -> None:
        try:  # noqa: SIM105  # not contextlib: at interpreter teardown this may run after that module is gone
            self.close()
        except Exception:  # noqa: BLE001  # interpreter shutdown: the GL library may already be gone
            pass


def pose_for_drawing(
    model: mujoco.MjModel, data: mujoco.MjData, state: np.ndarray, mocap: tuple[np.ndarray, np.ndarray] | None = None
) -> None:
    """Load a FULLPHYSICS state into `data` and compute only what drawing needs (poses, cameras, lights)."""
    mujoco.mj_setState(model, data, state, FULLPHYSICS)
    if mocap is not None and model.nmocap:
        data.mocap_pos[:] = mocap[0]
        data.mocap_quat[:] = mocap[1]
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    mujoco.mj_camlight(model, data)


def _close_all() -> None:
    # free GL contexts while PyOpenGL still works: at interpreter teardown OSMesa's own __del__ fails noisily
    for view in list(_live):
        with contextlib.suppress(Exception):  # a display already torn down: nothing left to free
            view.close()


class BatchRenderer:
    """Renders one image per (env, camera); camera jitter and light scale implement visual randomization.

    Per-env models differ only in physics parameters, so one private copy of the nominal model draws all envs.
    Shadows are off by default: with software GL they cost several times the rest of an observation image
    (bench/RESULTS.md, "Measurements behind the code's design").
    """

    def __init__(self, model: mujoco.MjModel, size: int, shadows: bool = False) -> None:
        self._view = _Offscreen(model, size, size, shadows)
        m = self._view.model
        self._cam_pos0 = m.cam_pos.copy()
        self._light0 = (m.light_diffuse.copy(), m.light_ambient.copy())
        head = m.vis.headlight
        self._head0 = (np.array(head.diffuse), np.array(head.ambient))
        self._cam_ids: dict[tuple[str, ...], np.ndarray] = {}

    @property
    def size(self) -> int:
        return self._view.height

    def _ids(self, cameras: tuple[str, ...]) -> np.ndarray:
        ids = self._cam_ids.get(cameras)
        if ids is None:
            ids = np.array([self._view.camera(c).fixedcamid for c in cameras], dtype=np.int64)
            self._cam_ids[cameras] = ids
        return ids

    def _set_light(self, scale: float) -> None:
        m = self._view.model
        m.light_diffuse[:] = np.clip(self._light0[0] * scale, 0.0, 1.0)
        m.light_ambient[:] = np.clip(self._light0[1] * scale, 0.0, 1.0)
        m.vis.headlight.diffuse = np.clip(self._head0[0] * scale, 0.0, 1.0)
        m.vis.headlight.ambient = np.clip(self._head0[1] * scale, 0.0, 1.0)

    def render(
        self,
        states: np.ndarray,
        mocap: tuple[np.ndarray, np.ndarray] | None,
        cameras: tuple[str, ...],
        camera_jitter: np.ndarray,
        light_scale: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Images (n, size, size, 3) uint8 per camera for n env states (FULLPHYSICS rows)."""
        n, s = len(states), self._view.height
        out = {cam: np.empty((n, s, s, 3), np.uint8) for cam in cameras}
        m, ids = self._view.model, self._ids(cameras)
        for i in range(n):
            m.cam_pos[ids] = self._cam_pos0[ids] + camera_jitter[i, : len(ids)]
            self._set_light(float(light_scale[i]))
            self._view.set_state(states[i], None if mocap is None else (mocap[0][i], mocap[1][i]))
            for cam in cameras:
                self._view.render(cam, out[cam][i])
        return out

    def close(self) -> None:
        self._view.close()


_FRAME_CACHE: OrderedDict[tuple[int, int, int], tuple[mujoco.MjModel, _Offscreen]] = OrderedDict()
_FRAME_CACHE_SIZE = 4


def render_frame(
    model: mujoco.MjModel,
    state: np.ndarray,
    mocap: tuple[np.ndarray, np.ndarray] | None,
    camera: str | None,
    size: tuple[int, int] = (480, 640),
) -> np.ndarray:
    """One RGB frame (h, w, 3) of a state, from a named camera or the default free camera.

    Renderers are cached per (model, size), so a video costs one GL context, not one per frame.
    """
    key = (id(model), int(size[0]), int(size[1]))
    entry = _FRAME_CACHE.get(key)
    if entry is None or entry[0] is not model:
        entry = (model, _Offscreen(model, int(size[0]), int(size[1])))
        _FRAME_CACHE[key] = entry  # holding `model` keeps its id from being reused by another model
        while len(_FRAME_CACHE) > _FRAME_CACHE_SIZE:
            _FRAME_CACHE.popitem(last=False)[1][1].close()
    _FRAME_CACHE.move_to_end(key)
    view = entry[1]
    view.set_state(state, mocap)
    return view.render(camera)
