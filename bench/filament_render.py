"""MuJoCo's Filament renderer drawing a task's cameras batched, in software, against the classic renderer the backend
uses, JSON lines (issue 45: batched rendering where MuJoCo offers it).

MuJoCo 4's Filament renderer (`mujoco.mjrf`) draws many views in one call: here every env's scene (a `ModelScene` of
the task's model at that env's state) seen from every camera, each view a tile of one render target, read back once
(the renderer accepts one read per call). On a machine without a GPU it runs on Vulkan's software driver (Mesa's
lavapipe: the Debian packages libvulkan1 and mesa-vulkan-drivers, which robotrl does not install). The baseline in the
same run: the backend's own renderer (robotrl/envs/render.py: one classic MuJoCo renderer on EGL or OSMesa, shadows off)
drawing the same states and cameras. Both on this process alone, frames/s the best of `--repeats`:
  classic_frames_per_s   the backend's renderer, one view after another (classic_gl: its GL backend)
  filament_frames_per_s  all views in one `mjrf.Context.render` call, its scenes updated from the states first
  filament_ms_per_view   the batched call's time over its views
  ratio                  filament / classic
A line with `error` instead of the Filament figures says why its context cannot be made here (e.g. no Vulkan driver).

    .venv/bin/python bench/filament_render.py --num-envs 8 32
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tyro

from robotrl.envs.render import BatchRenderer, gl_backend, pose_for_drawing


@dataclass
class FilamentConfig:
    task: str = "PickPlace"
    num_envs: tuple[int, ...] = (8, 32)
    steps: int = 20
    """random-action steps before the states are drawn"""
    repeats: int = 3
    seed: int = 0


def env_states(task: str, n: int, config: FilamentConfig) -> tuple[Any, list[str], int, np.ndarray]:
    """(model, cameras, image size, FULLPHYSICS states (n, nstate)) of `n` envs after `config.steps` random steps."""
    from robotrl.envs import make
    from robotrl.envs.benchmark import random_actions

    env = make(task, num_envs=n, seed=config.seed, render_images=False)
    env.reset(seed=config.seed)
    for a in random_actions(env.action_space, config.steps, config.seed):
        env.step(a)
    out = env.task.model, list(env.task.cameras), env.task.config.image_size, env.get_state()["physics"]
    env.close()
    return out


def classic(model: Any, cameras: list[str], size: int, states: np.ndarray) -> float:
    """Seconds for the backend's renderer (`BatchRenderer`: one classic MuJoCo renderer, shadows off) to draw every
    view."""
    renderer = BatchRenderer(model, size)
    n = len(states)
    args = (states, None, tuple(cameras), np.zeros((n, len(cameras), 3)), np.ones(n))
    try:
        renderer.render(*args)  # the first frames upload the scene's meshes and textures
        start = time.perf_counter()
        renderer.render(*args)
        return time.perf_counter() - start
    finally:
        renderer.close()


class Batched:
    """Every env's scene from every camera as tiles of one Filament render target, drawn by one call."""

    def __init__(self, model: Any, cameras: list[str], size: int, datas: list[Any]) -> None:
        import mujoco
        import mujoco.studio.window  # registers the Filament materials' resource providers
        from mujoco import mjrf
        from mujoco.rendering.filament.model_scene import ModelScene

        config = mjrf.ContextConfig()
        config.software_rendering = True
        self.context = mjrf.Context(config)
        self.datas = datas
        self.scenes = [ModelScene(self.context, model) for _ in datas]
        views = len(datas) * len(cameras)
        cols = min(views, 8)
        rows = -(-views // cols)
        self.target = self.context.create_render_target(
            mjrf.RenderTargetConfig(color_format=mjrf.PixelFormat.PIXEL_FORMAT_RGB8)
        )
        self.target.resize(size * cols, size * rows)
        self.image = np.zeros((size * rows, size * cols, 3), np.uint8)
        self.read = mjrf.ReadRequest(target=self.target)
        self.read.set_buffer(self.image)
        option, scene = mujoco.MjvOption(), mujoco.MjvScene(model, 1000)
        self.requests = []
        for i, data in enumerate(datas):
            self.scenes[i].update(data)
            for c, name in enumerate(cameras):
                camera = mujoco.MjvCamera()
                camera.type, camera.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, model.camera(name).id
                mujoco.mjv_updateScene(model, data, option, None, camera, mujoco.mjtCatBit.mjCAT_ALL, scene)
                gl = scene.camera[0]
                request = mjrf.RenderRequest()
                request.scene, request.target = self.scenes[i].scene, self.target
                request.camera = mjrf.Camera(
                    pos=gl.pos,
                    forward=gl.forward,
                    up=gl.up,
                    frustum_bottom=gl.frustum_bottom,
                    frustum_top=gl.frustum_top,
                    frustum_near=gl.frustum_near,
                    frustum_far=gl.frustum_far,
                )
                tile = i * len(cameras) + c
                request.viewport.left, request.viewport.bottom = size * (tile % cols), size * (tile // cols)
                request.viewport.width = request.viewport.height = size
                request.post_processing = request.reflections = request.shadows = False
                request.skybox = request.haze = False
                self.requests.append(request)

    def draw(self) -> float:
        """Seconds to update every scene from its state and draw and read back every view."""
        start = time.perf_counter()
        for scene, data in zip(self.scenes, self.datas, strict=True):
            scene.update(data)
        self.context.wait_for_frame(self.context.render(self.requests, [self.read]))
        return time.perf_counter() - start


_PROBE = (
    "import mujoco.studio.window; from mujoco import mjrf; c = mjrf.ContextConfig(); c.software_rendering = True; "
    "mjrf.Context(c)"
)


def filament_error() -> str | None:
    """Why a software Filament context cannot be made here (its driver aborts the process that tries: probed in a
    child), or None."""
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return " / ".join(lines[-2:]) or f"exit code {result.returncode}"


def measure(n: int, config: FilamentConfig, error: str | None) -> dict[str, Any]:
    import mujoco

    model, cameras, size, states = env_states(config.task, n, config)
    datas = [mujoco.MjData(model) for _ in range(n)]
    for data, state in zip(datas, states, strict=True):
        pose_for_drawing(model, data, state)
    line: dict[str, Any] = {"bench": "filament_render", "task": config.task, "num_envs": n, "size": size}
    line["classic_gl"] = gl_backend()
    views = n * len(cameras)
    best_classic = min(classic(model, cameras, size, states) for _ in range(config.repeats))
    line["classic_frames_per_s"] = round(views / best_classic, 1)
    if error is not None:
        return {**line, "error": error}
    batched = Batched(model, cameras, size, datas)
    batched.draw()
    best = min(batched.draw() for _ in range(config.repeats))
    return {
        **line,
        "filament_frames_per_s": round(views / best, 1),
        "filament_ms_per_view": round(1e3 * best / views, 2),
        "ratio": round(best_classic / best, 3),
    }


def main(config: FilamentConfig) -> None:
    error = filament_error()
    for n in config.num_envs:
        print(json.dumps(measure(n, config, error)), flush=True)


if __name__ == "__main__":
    main(tyro.cli(FilamentConfig))
