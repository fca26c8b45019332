"""MP4 videos of env frames and of scripted-expert episodes (the backend of `robotrl envs view`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def write_mp4(path: str | Path, frames: Iterable[np.ndarray] | np.ndarray, fps: float = 20.0, quality: int = 7) -> Path:
    """Write RGB uint8 frames (t, h, w, 3) to an H.264 mp4 (via imageio-ffmpeg) and return the path.

    Odd frame sizes are padded by one edge row/column: yuv420p, which every player decodes, needs even sizes.
    """
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with imageio.get_writer(
        str(path),
        format="FFMPEG",
        mode="I",
        fps=fps,
        codec="libx264",
        quality=quality,
        pixelformat="yuv420p",
        macro_block_size=1,
    ) as writer:
        shape: tuple[int, ...] | None = None
        for frame in frames:
            frame = np.asarray(frame)
            if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
                raise ValueError(f"write_mp4: expected RGB uint8 frames (h, w, 3), got {frame.dtype} {frame.shape}")
            if shape is None:
                shape = frame.shape
            elif frame.shape != shape:
                raise ValueError(f"write_mp4: frame {count} has shape {frame.shape}, the first had {shape}")
            pad = ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0))
            # imageio.v2's stubs type get_writer / get_reader as their common base class
            writer.append_data(np.pad(frame, pad, mode="edge") if any(p[1] for p in pad) else frame)  # type: ignore[attr-defined]
            count += 1
    if count == 0:
        path.unlink(missing_ok=True)
        raise ValueError("write_mp4: no frames to write")
    return path


def read_mp4(path: str | Path) -> np.ndarray:
    """All frames of a video as (t, h, w, 3) uint8 (for tests and quick looks)."""
    import imageio.v2 as imageio

    with imageio.get_reader(str(path), format="FFMPEG") as reader:
        return np.stack([np.asarray(f) for f in reader])  # type: ignore[attr-defined]  # as in write_mp4


@dataclass
class EpisodeVideo:
    path: Path
    frames: int
    success: bool
    instruction: str | None


def record_expert_episode(
    task: Any,
    path: str | Path,
    seed: int = 0,
    noise: float = 0.0,
    camera: str | None = None,
    size: tuple[int, int] = (480, 640),
    steps: int | None = None,
    fps: float | None = None,
) -> EpisodeVideo:
    """Run one episode of a task's scripted expert on the CPU backend and write it to `path` as mp4.

    `task` is a task name or a `Task`; `camera` defaults to the task's first camera (else the free camera).
    Frames are rendered at `size` for viewing; image observations are not rendered (not needed, and slower).
    """
    from robotrl.envs import make

    Path(path).parent.mkdir(parents=True, exist_ok=True)  # a path that cannot be written fails before the episode
    env = make(task, num_envs=1, seed=seed, autoreset=False, render_images=False, num_threads=1)
    try:
        t = env.task
        cam = camera if camera is not None else (t.cameras[0] if t.cameras else None)
        expert = t.expert(noise=noise, seed=seed)
        expert.reset(1)
        obs, _ = env.reset(seed=seed)
        instruction = obs.get("instruction")
        frames = [env.render_env(0, cam, size)]
        success = False
        for _ in range(steps if steps is not None else t.config.episode_steps):
            obs, _, terminated, truncated, info = env.step(expert.act(obs))
            success = success or bool(info["success"][0])
            frames.append(env.render_env(0, cam, size))
            if terminated[0] or truncated[0]:
                break
        out = write_mp4(path, frames, fps=fps if fps is not None else t.control_hz)
        return EpisodeVideo(out, len(frames), success, None if instruction is None else str(instruction[0]))
    finally:
        env.close()
