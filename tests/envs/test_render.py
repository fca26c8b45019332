"""Offscreen rendering of image observations and videos, on the real GL stack (EGL, or the OSMesa fallback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robotrl.envs import make
from robotrl.envs.randomization import Randomization
from robotrl.envs.render import gl_backend
from robotrl.envs.video import read_mp4, record_expert_episode, write_mp4


def _env(n: int = 2, randomization: Randomization | None = None, **kw):
    return make("PickPlace", num_envs=n, seed=0, randomization=randomization, autoreset=False, num_threads=1, **kw)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_images_match_the_spec_and_show_the_scene() -> None:
    env = _env(2, image_size=48)
    obs, _ = env.reset(seed=1)
    for cam in ("front", "wrist"):
        spec = env.task_spec.observations[f"image_{cam}"]
        img = obs[f"image_{cam}"]
        assert img.shape == (2, *spec.shape) == (2, 48, 48, 3) and img.dtype == np.uint8
        assert env.single_observation_space[f"image_{cam}"].contains(img[0])
        assert img.std() > 10 and len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not blank, not flat
    assert _diff(obs["image_front"], obs["image_wrist"]) > 10  # two different viewpoints
    assert _diff(obs["image_front"][0], obs["image_front"][1]) > 0.5  # different cube layouts per env
    env.close()


def test_images_change_when_the_robot_moves() -> None:
    env = _env(1)
    obs, _ = env.reset(seed=2)
    before = {k: obs[k].copy() for k in ("image_front", "image_wrist")}
    action = np.array([[0.0, 1.0, 1.0, 1.0, 1.0]], np.float32)  # sideways, up, turn, close
    for _ in range(6):
        obs, *_ = env.step(action)
    assert _diff(before["image_wrist"], obs["image_wrist"]) > 5
    assert _diff(before["image_front"], obs["image_front"]) > 1
    env.close()


def test_camera_and_light_randomization_change_the_image_but_not_the_physics_model() -> None:
    base = _env(2)
    nominal_cam = base.task.model.cam_pos.copy()
    nominal_light = base.task.model.light_diffuse.copy()
    plain, _ = base.reset(seed=3)
    cam_env = _env(2, Randomization(camera_pos=0.05))
    moved, _ = cam_env.reset(seed=3)
    light_env = _env(2, Randomization(light=0.6))
    lit, _ = light_env.reset(seed=3)

    np.testing.assert_array_equal(plain["state"], moved["state"])  # same scene, only the view differs
    np.testing.assert_array_equal(plain["state"], lit["state"])
    assert _diff(plain["image_front"], moved["image_front"]) > 2
    assert _diff(plain["image_wrist"], moved["image_wrist"]) > 2
    brightness = [abs(lit["image_front"][i].mean() - plain["image_front"][i].mean()) for i in range(2)]
    assert max(brightness) > 3
    # rendering with jitter edits a private copy: the model the physics steps is untouched
    np.testing.assert_array_equal(base.task.model.cam_pos, nominal_cam)
    np.testing.assert_array_equal(cam_env.task.model.cam_pos, nominal_cam)
    np.testing.assert_array_equal(light_env.task.model.light_diffuse, nominal_light)
    # and the same seed renders the same image again
    again, _ = cam_env.reset(seed=3)
    np.testing.assert_array_equal(again["image_front"], moved["image_front"])
    for env in (base, cam_env, light_env):
        env.close()


def test_render_frame_sizes_cameras_and_reuse() -> None:
    env = _env(1, render_images=False)
    env.reset(seed=4)
    free = env.render_env(0, None, (120, 160))
    front = env.render_env(0, "front", (120, 160))
    assert free.shape == front.shape == (120, 160, 3) and free.dtype == np.uint8
    assert _diff(free, front) > 5
    np.testing.assert_array_equal(front, env.render_env(0, "front", (120, 160)))  # cached renderer, same frame
    big = env.render_env(0, "front", (720, 1280))  # larger than the model's offscreen buffer: grown, not an error
    assert big.shape == (720, 1280, 3) and big.std() > 10
    with pytest.raises(ValueError, match="camera 'nope'"):
        env.render_env(0, "nope", (32, 32))
    env.close()


def test_mp4_round_trip_keeps_frame_count_and_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = np.repeat(np.linspace(0, 255, 13).astype(np.uint8)[:, None, None, None], 3, axis=-1)
    frames = np.broadcast_to(frames, (13, 48, 64, 3)) + rng.integers(0, 8, (13, 48, 64, 3)).astype(np.uint8)
    path = write_mp4(tmp_path / "clip.mp4", frames, fps=10)
    back = read_mp4(path)
    assert back.shape == (13, 48, 64, 3)
    assert np.abs(back.mean(axis=(1, 2, 3)) - frames.mean(axis=(1, 2, 3))).max() < 6  # the content survived
    odd = write_mp4(tmp_path / "odd.mp4", frames[:4, :47, :63], fps=10)
    assert read_mp4(odd).shape == (4, 48, 64, 3)  # padded to even sizes for yuv420p
    with pytest.raises(ValueError):
        write_mp4(tmp_path / "none.mp4", [], fps=10)


def test_expert_episode_video(tmp_path: Path) -> None:
    video = record_expert_episode("PickPlace", tmp_path / "ep.mp4", seed=1, size=(96, 128), steps=12)
    assert video.frames == 13 and video.instruction is not None and "cube in the bin" in video.instruction
    back = read_mp4(video.path)
    assert back.shape == (13, 96, 128, 3)
    assert _diff(back[0], back[-1]) > 1  # the arm moved during the episode


@pytest.mark.parametrize("case", ["MUJOCO_GL=osmesa", "EGL unusable"])
def test_headless_backend_and_osmesa_fallback(case: str) -> None:
    assert gl_backend() in ("egl", "osmesa")
    code = (
        "import numpy as np; from robotrl.envs import make; from robotrl.envs.render import gl_backend;"
        "env = make('PickPlace', num_envs=1, seed=0, image_size=32); obs, _ = env.reset(seed=0);"
        "assert gl_backend() == 'osmesa', gl_backend(); assert obs['image_front'].std() > 10; print('ok')"
    )
    drop = ("PYOPENGL_PLATFORM", "ROBOTRL_GL_PROBED", "MUJOCO_GL", "DISPLAY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if case == "MUJOCO_GL=osmesa":
        env["MUJOCO_GL"] = "osmesa"
    else:  # no EGL vendor library: creating an EGL context fails, as on a machine without Mesa's EGL
        env["__EGL_VENDOR_LIBRARY_FILENAMES"] = "/nonexistent/egl_vendor.json"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
    assert "Traceback" not in out.stderr  # GL contexts are freed cleanly at exit


def test_images_drawn_by_worker_processes_are_the_ones_drawn_here() -> None:
    """The render pool splits the envs between this process and a worker (each with its own GL context): with
    camera and light randomization on, every image is the one this process alone draws."""
    dr = Randomization(camera_pos=0.02, light=0.3)
    alone, shared = _env(4, dr, render_workers=0), _env(4, dr, render_workers=1)
    a, _ = alone.reset(seed=3)
    b, _ = shared.reset(seed=3)
    assert shared._renderer.workers == 1 and alone._renderer.workers == 0
    for _ in range(2):
        action = np.tile(np.array([0.5, -0.5, 0.2, 0.0, 1.0], np.float32), (4, 1))
        a, *_ = alone.step(action)
        b, *_ = shared.step(action)
    for cam in ("front", "wrist"):
        np.testing.assert_array_equal(a[f"image_{cam}"], b[f"image_{cam}"])
        assert _diff(b[f"image_{cam}"][0], b[f"image_{cam}"][3]) > 1.0  # different envs: different images
    shared.close()


def test_a_render_workers_error_is_raised_here_and_close_ends_it() -> None:
    from robotrl.envs.render_pool import RenderPool

    env = _env(2, render_images=False)
    state = env.get_state()["physics"]
    pool = RenderPool(env.task.model, 32, workers=1)
    procs = [w._proc for w in pool._workers]
    ok = pool.render(state, None, ("front",), np.zeros((2, 1, 3)), np.ones(2))
    assert ok["front"].shape == (2, 32, 32, 3) and ok["front"].std() > 0
    with pytest.raises(ValueError, match="render: camera 'nowhere' is not in the model"):
        pool.render(state, None, ("nowhere",), np.zeros((2, 1, 3)), np.ones(2))
    short = (np.zeros((1, 1, 3)), np.tile([1.0, 0.0, 0.0, 0.0], (1, 1, 1)))  # mocap for env 0 only: env 1 fails
    with pytest.raises(IndexError):
        pool.render(state, short, ("front",), np.zeros((2, 1, 3)), np.ones(2))
    np.testing.assert_array_equal(
        pool.render(state, None, ("front",), np.zeros((2, 1, 3)), np.ones(2))["front"], ok["front"]
    )
    pool.close()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(ValueError, match="render workers: expected >= 0, got -1"):
        RenderPool(env.task.model, 32, workers=-1)
