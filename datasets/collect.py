"""Interactive data collection: an operator drives one simulated robot through a teleop device and keeps or
discards each episode; kept episodes are committed to a zarr episode store.

    robotrl data collect --task PushT --device keyboard --out data/pusht.zarr --view
    robotrl data collect --task PushT --device scripted --out data/pusht.zarr --episodes 50

Human devices run at the task's control rate (a person needs real time); the scripted operator runs as fast
as the simulation allows. Each step is recorded with the observation the action was chosen from and the
operator's take-over flag (`intervention`). An episode ends when the operator keeps or discards it, or
when the env ends it; then a human decides keep / discard (the robot waits), a scripted operator decides
at once. Ctrl-C drops only the episode in progress: everything kept before it is already committed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robotrl.core.spec import Spec, SpecMismatchError
from robotrl.datasets.store import EpisodeStore
from robotrl.datasets.teleop import (
    DEVICES,
    EpisodeStatus,
    TeleopCommand,
    TeleopDevice,
    TeleopError,
    action_axes,
    command_to_action,
    make_device,
)
from robotrl.envs.tasks import DEFAULT_TASK


@dataclass
class CollectConfig:
    """Teleoperate (or script) a task and record the episodes the operator keeps into an episode store."""

    task: str = DEFAULT_TASK
    """task name (`robotrl envs list`) or an outside env; a human device needs a task that declares its teleop
    axes, or `axes`"""
    device: str = "scripted"
    """teleop device: keyboard, gamepad, spacemouse or scripted (the task's expert)"""
    out: Path = Path("data/pusht.zarr")
    """store to create, or to append to when its spec matches the task's"""
    episodes: int = 10
    """episodes to keep"""
    noise: float | None = None
    """scripted device: expert noise (default: the task's demo_noise, a stand-in for a human)"""
    seed: int = 0
    """seed of the env's initial states and of the scripted expert (use a new one when appending)"""
    view: bool = False
    """show the robot live in a window (pygame; needs a display)"""
    episode_steps: int | None = None
    """override the task's episode length (part of the spec: must match an existing store)"""
    max_discarded: int = 100
    """stop after this many discarded episodes (a scripted operator that keeps failing cannot loop forever)"""
    discard_failures: bool = False
    """scripted device: discard episodes that never succeeded (otherwise every episode is kept)"""
    realtime: bool | None = None
    """pace steps at the task's control rate (default: for human devices and with --view; a headless scripted
    operator runs as fast as the simulation allows)"""
    robot: str = "sim"
    """robot name written into each episode's metadata"""
    axes: tuple[str, ...] = ()
    """an outside env (which has no teleop mapping of its own): the command axis behind each element of its action,
    from x y z roll pitch yaw gripper (e.g. `--axes x y`: the twist's x and y drive a 2-D action)"""


@dataclass
class CollectSummary:
    """What a collect session did; `run_collect` prints it as one JSON line."""

    task: str
    device: str
    path: str
    kept: int = 0
    discarded: int = 0
    aborted: int = 0  # an episode in progress when the operator quit or pressed Ctrl-C
    successes: int = 0
    steps: int = 0  # steps in the kept episodes
    interventions: int = 0  # take-over steps in the kept episodes
    episodes_in_store: int = 0
    kept_indices: list[int] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C
    quit: bool = False  # the operator quit
    late_steps: int = 0  # real-time steps that overran the control period
    seconds: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.successes / self.kept if self.kept else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "success_rate": self.success_rate}


class RateLimiter:
    """Sleeps so that calls to `wait` happen `hz` times a second. A step that overruns is counted in `late`
    and the schedule restarts from now, so a slow step never triggers a burst of catch-up steps."""

    def __init__(self, hz: float) -> None:
        if not (hz > 0 and math.isfinite(hz)):
            raise ValueError(f"hz: expected a positive rate, got {hz}")
        self.period = 1.0 / hz
        self.late = 0
        self._next = time.monotonic() + self.period

    def restart(self) -> None:
        """Start the schedule from now (after a pause that was not a control step, such as an env reset)."""
        self._next = time.monotonic() + self.period

    def wait(self) -> None:
        now = time.monotonic()
        if now > self._next + 0.5 * self.period:
            self.late += 1
            self._next = now + self.period
            return
        if self._next > now:
            time.sleep(self._next - now)
        self._next += self.period


class LiveView:
    """A pygame window that shows env 0 and the session's state, for a human operator."""

    def __init__(self, title: str, size: tuple[int, int] = (360, 480)) -> None:
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise TeleopError(
                "view: a live window needs a display, but DISPLAY is not set; run with view=False "
                "(headless) or under a desktop session / `Xvfb :99 & export DISPLAY=:99`"
            )
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        # a software window surface: SDL's GL-accelerated one fights MuJoCo's EGL context in the same process
        os.environ.setdefault("SDL_FRAMEBUFFER_ACCELERATION", "0")
        try:
            import pygame
        except ImportError as e:
            raise TeleopError(f"view: pygame is not installed ({e}); pip install 'robotrl[teleop]'") from e
        self.pygame, self.size = pygame, size
        pygame.display.init()
        pygame.font.init()
        self.screen = pygame.display.set_mode((size[1], size[0]))
        pygame.display.set_caption(title)
        self.font = pygame.font.Font(None, 22)
        self.closed = False

    def show(self, frame: np.ndarray, lines: list[str]) -> None:
        pg = self.pygame
        joystick = (
            pg.JOYAXISMOTION,
            pg.JOYBALLMOTION,
            pg.JOYHATMOTION,
            pg.JOYBUTTONDOWN,
            pg.JOYBUTTONUP,
            pg.JOYDEVICEADDED,
            pg.JOYDEVICEREMOVED,
        )
        for event in pg.event.get(exclude=joystick):  # a gamepad device reads its own events
            if event.type == pg.QUIT:
                self.closed = True
        surface = pg.surfarray.make_surface(np.ascontiguousarray(np.asarray(frame).swapaxes(0, 1)))
        self.screen.blit(surface, (0, 0))
        for i, line in enumerate(lines):
            self.screen.blit(self.font.render(line, True, (255, 255, 0), (0, 0, 0)), (6, 6 + 20 * i))
        pg.display.flip()

    def close(self) -> None:
        self.pygame.display.quit()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check_config(config: CollectConfig, device_given: bool = False) -> None:
    """Reject bad options before anything is opened, naming the field, what was expected and what was given."""
    if not device_given and config.device not in DEVICES:
        make_device(config.device)  # raises the error that lists the choices
    if int(config.episodes) < 1:
        raise ValueError(f"episodes: expected >= 1, got {config.episodes}")
    if config.noise is not None and not config.noise >= 0:
        raise ValueError(f"noise: expected >= 0 or None (the task's demo_noise), got {config.noise}")
    if config.episode_steps is not None and int(config.episode_steps) < 1:
        raise ValueError(f"episode_steps: expected >= 1 or None (the task's default), got {config.episode_steps}")
    if int(config.max_discarded) < 0:
        raise ValueError(f"max_discarded: expected >= 0, got {config.max_discarded}")


def check_store(path: Path, spec: Spec, who: str = "collect", instead: str = "Collect into a new --out") -> None:
    """Fail early if `path` holds a store recorded with another spec: a `SpecMismatchError` naming the first
    field that differs and both values (read-only: no writer lock is taken, nothing is created). `who` and
    `instead` word the error for the recorder that asks."""
    path = Path(path)
    if not (path / "zarr.json").exists():
        return
    existing = EpisodeStore.open(path, mode="r")
    try:
        existing.check_spec(spec, that=f"task {spec.task} as configured")
    except SpecMismatchError as e:
        raise SpecMismatchError(
            f"{who}: cannot append to {path}: {e}. {instead}, or use the store's task options "
            f"(its episode_steps is {existing.spec.episode_steps})"
        ) from None


def collect(config: CollectConfig, device: TeleopDevice | None = None) -> CollectSummary:
    """Run a collect session; returns its summary. `device` replaces the one `config.device` names (tests,
    custom drivers); the session then labels episodes by the device's `human` flag and `name`."""
    from robotrl.envs import make

    check_config(config, device_given=device is not None)
    options: dict[str, Any] = {} if config.episode_steps is None else {"episode_steps": int(config.episode_steps)}
    env = make(config.task, num_envs=1, seed=config.seed, autoreset=False, num_threads=1, **options)
    store: EpisodeStore | None = None
    view: LiveView | None = None
    try:
        task, spec = getattr(env, "task", None), env.task_spec
        if device is None and config.device == "scripted" and task is None:
            raise ValueError(
                f"device: scripted runs a task's scripted expert; {spec.task} is an outside env without one "
                "(record its demonstrator with `robotrl data record --demonstrator`), or drive it with a device"
            )
        if device is None:
            extra: dict[str, Any] = {}
            if config.device == "scripted":
                extra = {"noise": config.noise, "seed": config.seed, "discard_failures": config.discard_failures}
            device = make_device(config.device, task, **extra)
        if device.human:
            action_axes(spec, config.axes)  # a task a twist cannot drive fails here, before the store or device opens
        check_store(config.out, spec)
        realtime = (device.human or config.view) if config.realtime is None else config.realtime
        meta: dict[str, Any] = {"device": device.name, "seed": config.seed}
        if hasattr(device, "noise"):
            meta["noise"] = float(device.noise)
        with device:  # the device first: a missing device leaves no empty store behind
            store = EpisodeStore.create(config.out, spec, exist_ok=True)
            summary = CollectSummary(
                task=spec.task, device=device.name, path=str(config.out), episodes_in_store=store.num_episodes
            )
            writer = store.writer(source="teleop" if device.human else "scripted", robot=config.robot, **meta)
            if config.view:
                view = LiveView(f"robotrl data collect {spec.task} ({device.name})")
            if device.help and device.human:
                _log(f"collect {spec.task} with {device.name}: {device.help}")
            _session(config, env, spec, device, writer, summary, view, realtime)
        summary.episodes_in_store = store.num_episodes
        return summary
    finally:
        if view is not None:
            view.close()
        if store is not None:
            store.close()
        env.close()


def _session(
    config: CollectConfig,
    env: Any,
    spec: Spec,
    device: TeleopDevice,
    writer: Any,
    summary: CollectSummary,
    view: LiveView | None,
    realtime: bool,
) -> None:
    """The episode loop: reset, step with the device's commands, keep or discard, until enough are kept."""
    start = time.monotonic()
    limiter = RateLimiter(spec.control_hz) if realtime else None
    progress = None
    if not device.human:
        from tqdm import tqdm

        progress = tqdm(total=config.episodes, desc=f"collect {spec.task}", unit="ep", leave=False)
    obs_batch, _ = env.reset(seed=config.seed)
    episode = 0
    try:
        while summary.kept < config.episodes and summary.discarded < config.max_discarded:
            device.reset_episode()
            status = EpisodeStatus(episode=episode)
            verdict, reason = _episode(
                env, spec, device, writer, status, obs_batch, view, limiter, summary, config.axes
            )
            if verdict == "keep":
                success = bool(status.any_success)
                steps = len(writer)
                index = writer.finalize(success=success, end_reason=reason)
                interventions = int(writer.store.episodes[index].get("interventions", 0))
                summary.kept += 1
                summary.kept_indices.append(index)
                summary.successes += int(success)
                summary.steps += steps
                summary.interventions += interventions
                if progress is not None:
                    progress.update(1)
                if device.human:
                    _log(
                        f"episode {episode}: kept as #{index} ({steps} steps, {'success' if success else 'no success'})"
                    )
            elif verdict == "discard":
                writer.discard()
                summary.discarded += 1
                if device.human:
                    _log(f"episode {episode}: discarded ({reason})")
            elif verdict == "restart":
                writer.discard()
            else:  # quit
                if len(writer):
                    summary.aborted += 1
                writer.discard()
                summary.quit = True
                break
            episode += 1
            obs_batch, _ = env.reset()
    except KeyboardInterrupt:
        if len(writer):
            summary.aborted += 1
        writer.discard()
        summary.interrupted = True
        _log(f"collect: interrupted; the episode in progress was dropped, {summary.kept} kept episode(s) are saved")
    finally:
        if progress is not None:
            progress.close()
        summary.late_steps = limiter.late if limiter is not None else 0
        summary.seconds = round(time.monotonic() - start, 3)
    if summary.discarded >= config.max_discarded and summary.kept < config.episodes:
        _log(
            f"collect: stopped after {summary.discarded} discarded episodes (max_discarded={config.max_discarded}) "
            f"with {summary.kept} of {config.episodes} kept"
        )


def _episode(
    env: Any,
    spec: Spec,
    device: TeleopDevice,
    writer: Any,
    status: EpisodeStatus,
    obs_batch: Mapping[str, Any],
    view: LiveView | None,
    limiter: RateLimiter | None,
    summary: CollectSummary,
    axes: Sequence[str] = (),
) -> tuple[str, str]:
    """Run one episode into `writer`; returns (verdict, reason): keep, discard, restart (discarded before
    the first step) or quit. `status` is updated in place; `axes` map the device's twist onto the action."""
    obs = {k: v[0] for k, v in obs_batch.items()}
    prompted = False
    if limiter is not None:
        limiter.restart()
    while True:
        command = device.read(obs, status)
        if view is not None:
            view.show(env.render_env(0, None, view.size), _status_lines(status, summary, command, device))
            if view.closed:
                return "quit", "window closed"
        if command.quit:
            return "quit", "operator"
        if command.discard:
            return ("discard", "operator") if len(writer) else ("restart", "operator")
        if command.keep and len(writer):
            return "keep", "end" if status.done else ("success" if status.success else "operator")
        if status.done:  # the env ended the episode: hold still until the operator decides
            if device.human and not prompted:
                _log(
                    f"episode {status.episode} ended ({'success' if status.any_success else 'no success'}): "
                    "keep or discard it"
                )
                prompted = True
        else:
            action = command_to_action(command, spec, axes)
            next_obs, reward, terminated, truncated, info = env.step(action[None])
            success = bool(np.asarray(info.get("success", [False]))[0])
            writer.add(
                obs,
                action,
                float(reward[0]),
                bool(terminated[0]),
                bool(truncated[0]),
                success,
                bool(command.intervention),
            )
            status.step += 1
            status.success = success
            status.any_success = status.any_success or success
            status.done = bool(terminated[0] or truncated[0])
            obs = {k: v[0] for k, v in next_obs.items()}
        if limiter is not None:
            limiter.wait()


def _status_lines(
    status: EpisodeStatus, summary: CollectSummary, command: TeleopCommand, device: TeleopDevice
) -> list[str]:
    lines = [f"episode {status.episode}  step {status.step}  kept {summary.kept}  discarded {summary.discarded}"]
    flags = [
        name
        for name, on in (
            ("SUCCESS", status.any_success),
            ("TAKE-OVER", command.intervention),
            ("ENDED: keep or discard?", status.done),
        )
        if on
    ]
    if flags:
        lines.append("  ".join(flags))
    if device.help:
        lines.append(device.help[:70])
    return lines


def run_collect(config: CollectConfig) -> CollectSummary:
    """The `robotrl data collect` command: run the session and print its summary as one JSON line."""
    summary = collect(config)
    print(json.dumps(summary.to_dict()))
    return summary
