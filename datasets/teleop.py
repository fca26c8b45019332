"""Teleoperation devices: one interface for a keyboard, a gamepad, a 3Dconnexion SpaceMouse and a scripted
stand-in, so that `robotrl.datasets.collect` records a human and CI's scripted operator the same way.

Every device turns what the operator does into a `TeleopCommand`: a normalized 6-DoF end-effector twist
(x, y, z, roll, pitch, yaw, each in [-1, 1], robot base frame: x forward, y left, z up), a gripper command
(-1 open .. +1 closed) and the operator's episode events (keep, discard, quit) plus the take-over state
(`intervention`). `command_to_action` maps a command onto a task's ee_delta action by the task's spec, so a
device knows nothing of tasks and a task nothing of devices.

The drivers import their libraries (pynput, pygame, pyspacemouse) only in `start()`; a missing library,
display or device is a `TeleopError` that says what is missing and how to fix it.

Default maps (see each driver's docstring for details):

=============  =====================  =====================  ===========================
 action        keyboard               gamepad (Xbox layout)  SpaceMouse
=============  =====================  =====================  ===========================
 x  +/-        W / S                  left stick up / down   push forward / pull back
 y  +/-        A / D                  left stick left/right  push left / right
 z  +/-        R / F                  right stick up / down  lift / press
 yaw +/-       Q / E                  right stick left/right twist counter-clockwise / cw
 roll, pitch   arrow keys             d-pad                  tilt
 gripper       Space (toggle)         right trigger (hold)   left button (toggle)
 keep          Enter                  A                      right button
 discard       Backspace              B                      -- (Ctrl-C drops the episode)
 take-over     I (toggle)             X (toggle)             --
 quit          Esc                    Back / Select          -- (Ctrl-C)
 slow motion   hold Shift (x0.25)     --                     --
=============  =====================  =====================  ===========================
"""

from __future__ import annotations

import abc
import difflib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from robotrl.core.spec import Spec, SpecMismatchError

if TYPE_CHECKING:
    from robotrl.envs.task import Task

#: the twist's axes, in order
TWIST_AXES: tuple[str, ...] = ("x", "y", "z", "roll", "pitch", "yaw")
INSTALL_HINT = "pip install 'robotrl[teleop]' (pynput, pygame, pyspacemouse)"


class TeleopError(RuntimeError):
    """A teleop device that cannot be used as asked; the message says what is missing and how to fix it."""


# ---------------------------------------------------------------------------------------------------
# the command and its mapping onto a task's action
# ---------------------------------------------------------------------------------------------------
@dataclass
class TeleopCommand:
    """What the operator asks for at one control step.

    `twist` and `gripper` are clipped to [-1, 1]. `keep` / `discard` / `quit` are events (true at most once per
    press); `intervention` is a state: true while the operator has taken over (toggled on the device). A
    scripted device sets `action`, a full task action that replaces the twist mapping.
    """

    twist: np.ndarray = field(default_factory=lambda: np.zeros(6))
    gripper: float = -1.0
    keep: bool = False
    discard: bool = False
    quit: bool = False
    intervention: bool = False
    action: np.ndarray | None = None

    def __post_init__(self) -> None:
        twist = np.asarray(self.twist, dtype=np.float64)
        if twist.shape != (6,):
            raise ValueError(f"TeleopCommand.twist: expected shape (6,) {TWIST_AXES}, got {twist.shape}")
        if not np.all(np.isfinite(twist)):
            raise ValueError(f"TeleopCommand.twist: expected finite values, got {twist.tolist()}")
        if not np.isfinite(self.gripper):
            raise ValueError(f"TeleopCommand.gripper: expected a finite value in [-1, 1], got {self.gripper}")
        self.twist = np.clip(twist, -1.0, 1.0)
        self.gripper = float(np.clip(self.gripper, -1.0, 1.0))
        if self.action is not None:
            self.action = np.asarray(self.action, dtype=np.float64)

    @property
    def events(self) -> list[str]:
        return [name for name in ("keep", "discard", "quit") if getattr(self, name)]


@dataclass
class EpisodeStatus:
    """What the collect loop tells a device about the episode, so a scripted operator can decide keep/discard
    the way a human watching the robot would."""

    episode: int = 0
    step: int = 0
    done: bool = False  # the env ended the episode (terminated or time limit)
    success: bool = False  # the last step succeeded
    any_success: bool = False  # some step of this episode succeeded


def teleop_axes(task: str) -> tuple[str, ...] | None:
    """The command axis behind each element of `task`'s ee_delta action, as its Task class declares them (None
    for a task it does not declare them for, or a task of no registered class: e.g. a foreign dataset's)."""
    from robotrl.envs.tasks import TASKS, task_class

    return task_class(task).teleop_axes if task in TASKS else None


def action_axes(spec: Spec, axes: Sequence[str] = ()) -> tuple[str, ...]:
    """The command axis behind each element of `spec`'s action; a clear error for tasks a twist cannot drive.
    `axes` names them for an env that declares none of its own (an outside env's native action: `--axes x y`)."""
    if axes:
        names = (*TWIST_AXES, "gripper")
        if any(a not in names for a in axes):
            raise TeleopError(f"axes: expected names from {names}, got {list(axes)}")
        if spec.action.shape != (len(axes),):
            raise SpecMismatchError(
                f"axes: {spec.task}'s action has shape {spec.action.shape}; got {len(axes)} axes {list(axes)}"
            )
        return tuple(axes)
    if spec.action_mode == "native":
        raise TeleopError(
            f"axes: {spec.task} has no teleop mapping of its own; expected the command axis behind each of its "
            f"{spec.action.shape} action elements (e.g. --axes x y), got none"
        )
    if spec.action_mode != "ee_delta":
        raise TeleopError(
            f"{spec.task}: action_mode: expected 'ee_delta' for a teleop device, got {spec.action_mode!r}; "
            "a twist cannot drive joint targets (use device='scripted', or the task's ee_delta mode)"
        )
    found = teleop_axes(spec.task)
    if found is None:
        from robotrl.envs.tasks import TASKS

        drivable = [name for name in sorted(TASKS) if teleop_axes(name) is not None]
        raise TeleopError(
            f"task: no teleop mapping for {spec.task!r} (its Task class sets no teleop_axes); expected "
            f"one of {drivable}"
        )
    if spec.action.shape != (len(found),):
        raise SpecMismatchError(
            f"{spec.task}: action shape: the teleop mapping {found} expects ({len(found)},), "
            f"the spec has {spec.action.shape}"
        )
    return found


def command_to_action(command: TeleopCommand, spec: Spec, axes: Sequence[str] = ()) -> np.ndarray:
    """The task action (float32, clipped to the spec's bounds) for `command`.

    A command with `action` set (a scripted device) is passed through; otherwise each action element takes
    the command axis `action_axes(spec, axes)` names for it.
    """
    if command.action is not None:
        action = np.asarray(command.action, dtype=np.float64)
        if action.shape != spec.action.shape:
            raise SpecMismatchError(
                f"TeleopCommand.action: expected shape {spec.action.shape} ({spec.task}), got {action.shape}"
            )
    else:
        values = dict(zip(TWIST_AXES, command.twist))
        values["gripper"] = command.gripper
        action = np.array([values[a] for a in action_axes(spec, axes)], dtype=np.float64)
    return np.clip(action, spec.action.low_array(), spec.action.high_array()).astype(np.float32)


def apply_deadzone(value: float, deadzone: float) -> float:
    """Zero inside +-deadzone and rescaled outside, so the output still spans [-1, 1] without a jump."""
    v = float(np.clip(value, -1.0, 1.0))
    if abs(v) <= deadzone:
        return 0.0
    return float(np.sign(v) * (abs(v) - deadzone) / (1.0 - deadzone))


def _check_deadzone(deadzone: float) -> float:
    if not 0.0 <= deadzone < 1.0:
        raise ValueError(f"deadzone: expected a value in [0, 1), got {deadzone}")
    return float(deadzone)


# ---------------------------------------------------------------------------------------------------
# the interface
# ---------------------------------------------------------------------------------------------------
class TeleopDevice(abc.ABC):
    """An input device the collect loop polls once per control step.

    Use as a context manager (`start` / `close`). `reset_episode` is called when a new episode starts (the
    gripper opens, the take-over state clears, as the robot's reset does).
    """

    name: ClassVar[str] = "device"
    #: a person operates it: the collect loop paces it in real time and labels episodes source='teleop'
    human: ClassVar[bool] = True
    #: one line for the operator: the controls
    help: ClassVar[str] = ""

    def start(self) -> None:
        """Open the device (imports the driver library); raises `TeleopError` when it is not available."""

    def close(self) -> None:
        """Release the device; safe to call twice."""

    def reset_episode(self) -> None:
        """A new episode starts."""

    @abc.abstractmethod
    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        """The operator's command now, given the current (single-env) observation and episode status."""

    def __enter__(self) -> TeleopDevice:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Latch:
    """The toggles and pending events a human device accumulates between reads (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gripper_closed = False
        self.intervention = False
        self.pending: set[str] = set()

    def fire(self, event: str) -> None:
        with self.lock:
            if event == "gripper":
                self.gripper_closed = not self.gripper_closed
            elif event == "intervention":
                self.intervention = not self.intervention
            else:
                self.pending.add(event)

    def reset(self) -> None:
        with self.lock:
            self.gripper_closed = False
            self.intervention = False
            self.pending.clear()

    def command(self, twist: np.ndarray, gripper: float | None = None) -> TeleopCommand:
        with self.lock:
            events, self.pending = self.pending, set()
            grip = (1.0 if self.gripper_closed else -1.0) if gripper is None else gripper
            return TeleopCommand(
                twist=twist,
                gripper=grip,
                keep="keep" in events,
                discard="discard" in events,
                quit="quit" in events,
                intervention=self.intervention,
            )


# ---------------------------------------------------------------------------------------------------
# keyboard (pynput)
# ---------------------------------------------------------------------------------------------------
#: key -> (twist axis index, sign)
KEYBOARD_MOTION: dict[str, tuple[int, float]] = {
    "w": (0, 1.0),
    "s": (0, -1.0),
    "a": (1, 1.0),
    "d": (1, -1.0),
    "r": (2, 1.0),
    "f": (2, -1.0),
    "right": (3, 1.0),
    "left": (3, -1.0),
    "up": (4, 1.0),
    "down": (4, -1.0),
    "q": (5, 1.0),
    "e": (5, -1.0),
}
#: key -> operator event ("gripper" and "intervention" toggle)
KEYBOARD_EVENTS: dict[str, str] = {
    "space": "gripper",
    "enter": "keep",
    "backspace": "discard",
    "i": "intervention",
    "esc": "quit",
}


def _x_display_error(what: str) -> TeleopError | None:
    if os.environ.get("DISPLAY"):
        return None
    return TeleopError(
        f"{what} needs an X display, but DISPLAY is not set. Run it in an X desktop session, or headless under a "
        "virtual display: `Xvfb :99 & export DISPLAY=:99` (on Wayland pynput sees only keys typed into X windows)"
    )


class KeyboardDevice(TeleopDevice):
    """The keyboard through pynput's global X listener (the window that has focus does not matter).

    Holding a motion key commands full speed on its axis (opposite keys cancel); holding Shift scales motion
    by `slow`. Space toggles the gripper, I toggles take-over; Enter / Backspace / Esc are keep / discard /
    quit. Keys auto-repeat; only the first press of a held key counts.

    Only keys the X server received from an input device count (a keyboard, or XTest as `xdotool` uses it).
    Synthetic events (XSendEvent, and pynput's in-process echo of its own Controller) are ignored, as xterm
    ignores them by default: a program that fakes one key must not toggle the gripper twice.
    """

    name = "keyboard"
    help = (
        "W/S x  A/D y  R/F z  Q/E yaw  arrows roll/pitch  Shift slow  Space gripper  I take-over  "
        "Enter keep  Backspace discard  Esc quit"
    )

    def __init__(self, slow: float = 0.25) -> None:
        if not 0.0 < slow <= 1.0:
            raise ValueError(f"slow: expected a scale in (0, 1], got {slow}")
        self.slow = float(slow)
        self._held: set[str] = set()
        self._latch = _Latch()
        self._listener: Any = None
        self._keyboard: Any = None

    def start(self) -> None:
        if self._listener is not None:
            return
        error = _x_display_error("KeyboardDevice")
        if error is not None:
            raise error
        try:
            from pynput import keyboard
        except ImportError as e:  # pynput raises ImportError when its X backend cannot connect either
            raise TeleopError(
                f"KeyboardDevice: pynput could not start ({e}). Install it with {INSTALL_HINT}; check that "
                f"DISPLAY={os.environ.get('DISPLAY')!r} is an X server you may connect to (xauth)"
            ) from e
        self._keyboard = keyboard
        self._held.clear()
        self._latch.reset()
        self._listener = keyboard.Listener(on_press=self._on_press, on_release=self._on_release)
        self._listener.start()
        self._listener.wait()
        time.sleep(0.1)  # pynput reports ready just before it enables X recording; keys in that gap are lost

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.stop()
        context = getattr(listener, "_context", None)
        deadline = time.monotonic() + 3.0
        while True:
            listener.join(timeout=0.1)
            if not listener.is_alive() or context is None or time.monotonic() > deadline:
                break
            # pynput's stop sends "disable recording" on the recording connection itself, where it can wait
            # unsent until the next key event; sending it on a connection of our own stops the listener now
            try:
                import Xlib.display

                display = Xlib.display.Display()
                display.record_disable_context(context)
                display.sync()
                display.close()
            except Exception:  # noqa: BLE001 -- best effort; the listener then stops at the next key event
                pass

    def reset_episode(self) -> None:
        self._latch.reset()

    def key_name(self, key: Any) -> str | None:
        """pynput's key object -> the map's name: a lower-case character or a special key's name."""
        if key is None:
            return None
        if isinstance(key, self._keyboard.Key):
            return "shift" if key.name.startswith("shift") else key.name
        char = getattr(key, "char", None)
        return char.lower() if char else None

    def _on_press(self, key: Any, injected: bool = False) -> None:
        name = self.key_name(key)
        if name is None or injected:
            return
        with self._latch.lock:
            repeat = name in self._held
            self._held.add(name)
        if not repeat and name in KEYBOARD_EVENTS:
            self._latch.fire(KEYBOARD_EVENTS[name])

    def _on_release(self, key: Any, injected: bool = False) -> None:
        if injected:
            return
        name = self.key_name(key)
        with self._latch.lock:
            self._held.discard(name)

    def twist(self) -> np.ndarray:
        """The twist the held keys command now."""
        with self._latch.lock:
            held = set(self._held)
        twist = np.zeros(6)
        for name in held:
            if name in KEYBOARD_MOTION:
                axis, sign = KEYBOARD_MOTION[name]
                twist[axis] += sign
        return np.clip(twist, -1.0, 1.0) * (self.slow if "shift" in held else 1.0)

    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        if self._listener is None:
            raise TeleopError(
                "KeyboardDevice.read: the device is not started; call start() or use it in a `with` block"
            )
        if not self._listener.is_alive():
            raise TeleopError("KeyboardDevice: the pynput listener stopped (the X connection was lost)")
        return self._latch.command(self.twist())


# ---------------------------------------------------------------------------------------------------
# gamepad (pygame / SDL joystick)
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GamepadLayout:
    """Raw SDL joystick indices of the controls a `GamepadDevice` reads.

    The default is an Xbox-style pad as Linux reports it (xpad / evdev). Pads that SDL knows as game
    controllers get their layout from SDL's controller mapping instead (`layout='auto'`).
    """

    leftx: int = 0
    lefty: int = 1
    lefttrigger: int = 2
    rightx: int = 3
    righty: int = 4
    righttrigger: int = 5
    a: int = 0
    b: int = 1
    x: int = 2
    y: int = 3
    leftshoulder: int = 4
    rightshoulder: int = 5
    back: int = 6
    start: int = 7
    hat: int = 0

    @classmethod
    def from_sdl_mapping(cls, mapping: Mapping[str, str], fallback: GamepadLayout | None = None) -> GamepadLayout:
        """A layout from an SDL controller mapping ({'a': 'b0', 'leftx': 'a0', ...}); entries that are not a
        plain axis ('aN') or button ('bN') keep the fallback's index."""
        base = fallback or cls()
        kwargs: dict[str, int] = {}
        for name in cls.__dataclass_fields__:
            spec = str(mapping.get(name, ""))
            if len(spec) > 1 and spec[0] in "ab" and spec[1:].isdigit():
                kwargs[name] = int(spec[1:])
        return cls(**{**{k: getattr(base, k) for k in cls.__dataclass_fields__}, **kwargs})


#: gamepad button (layout name) -> operator event
GAMEPAD_EVENTS: dict[str, str] = {"a": "keep", "b": "discard", "x": "intervention", "back": "quit"}


class GamepadDevice(TeleopDevice):
    """A gamepad through pygame's SDL joystick events.

    Left stick: x (up = forward) and y (left = left); right stick: z (up = up) and yaw (left = counter-
    clockwise); d-pad: roll / pitch; right trigger: gripper (released = open, fully pressed = closed). A / B /
    X / Back: keep / discard / take-over toggle / quit. Sticks have a `deadzone` (rescaled, no jump).
    `layout='auto'` uses SDL's controller mapping when SDL knows the pad, else the Xbox-on-Linux default.
    """

    name = "gamepad"
    help = "left stick x/y  right stick z/yaw  d-pad roll/pitch  RT gripper  A keep  B discard  X take-over  Back quit"

    def __init__(self, index: int = 0, deadzone: float = 0.1, layout: GamepadLayout | str = "auto") -> None:
        if index < 0:
            raise ValueError(f"index: expected a joystick index >= 0, got {index}")
        if not isinstance(layout, GamepadLayout) and layout not in ("auto", "xbox"):
            raise ValueError(f"layout: expected a GamepadLayout, 'auto' or 'xbox', got {layout!r}")
        self.index = index
        self.deadzone = _check_deadzone(deadzone)
        self.layout_option = layout
        self.layout = layout if isinstance(layout, GamepadLayout) else GamepadLayout()
        self._latch = _Latch()
        self._axes: dict[int, float] = {}
        self._hat = (0, 0)
        self._pygame: Any = None
        self._joystick: Any = None
        self._types: list[int] = []

    def start(self) -> None:
        if self._joystick is not None:
            return
        # joystick events must arrive without a focused window, and a gamepad needs no window at all
        os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        try:
            import pygame
        except ImportError as e:
            raise TeleopError(f"GamepadDevice: pygame is not installed ({e}); install it with {INSTALL_HINT}") from e
        self._pygame = pygame
        try:
            if not pygame.display.get_init():
                pygame.display.init()  # pygame's event queue lives in the video subsystem
            pygame.joystick.init()
        except pygame.error as e:
            raise TeleopError(
                f"GamepadDevice: SDL could not start ({e}); without a display set SDL_VIDEODRIVER=dummy"
            ) from e
        count = pygame.joystick.get_count()
        if self.index >= count:
            raise TeleopError(
                f"GamepadDevice: joystick index {self.index}: expected < the number of joysticks SDL sees, which is "
                f"{count}. Plug the gamepad in (USB or paired Bluetooth) and check that your user may read "
                "/dev/input/event* (e.g. the 'input' group or a udev rule)"
            )
        if self.layout_option == "auto":
            self.layout = self._sdl_layout(pygame) or GamepadLayout()
        self._joystick = pygame.joystick.Joystick(self.index)
        self._joystick.init()
        # every joystick event type, handled or not, so none piles up in SDL's (bounded) event queue
        self._types = [
            pygame.JOYAXISMOTION,
            pygame.JOYBALLMOTION,
            pygame.JOYHATMOTION,
            pygame.JOYBUTTONDOWN,
            pygame.JOYBUTTONUP,
            pygame.JOYDEVICEADDED,
            pygame.JOYDEVICEREMOVED,
        ]
        self._axes = {i: float(self._joystick.get_axis(i)) for i in range(self._joystick.get_numaxes())}
        has_hat = self._joystick.get_numhats() > self.layout.hat
        self._hat = tuple(self._joystick.get_hat(self.layout.hat)) if has_hat else (0, 0)
        self._latch.reset()

    def _sdl_layout(self, pygame: Any) -> GamepadLayout | None:
        try:
            from pygame._sdl2 import controller
        except ImportError:
            return None
        try:
            if not controller.get_init():
                controller.init()
            controller.set_eventstate(False)  # only joystick events are read; keep the queue free of duplicates
            if not controller.is_controller(self.index):
                return None
            return GamepadLayout.from_sdl_mapping(controller.Controller(self.index).get_mapping())
        except pygame.error:
            return None

    def close(self) -> None:
        if self._joystick is not None:
            self._joystick.quit()
            self._joystick = None

    def reset_episode(self) -> None:
        self._latch.reset()

    @property
    def instance_id(self) -> int:
        return int(self._joystick.get_instance_id())

    def handle_event(self, event: Any) -> None:
        """Fold one pygame joystick event of this pad into the device state."""
        pygame = self._pygame
        if getattr(event, "instance_id", None) != self.instance_id:
            return
        if event.type == pygame.JOYAXISMOTION:
            self._axes[int(event.axis)] = float(event.value)
        elif event.type == pygame.JOYHATMOTION and int(event.hat) == self.layout.hat:
            self._hat = tuple(event.value)
        elif event.type == pygame.JOYBUTTONDOWN:
            for name, action in GAMEPAD_EVENTS.items():
                if int(event.button) == getattr(self.layout, name):
                    self._latch.fire(action)
        elif event.type == pygame.JOYDEVICEREMOVED:
            raise TeleopError(f"GamepadDevice: joystick {self.index} was disconnected")

    def twist(self) -> tuple[np.ndarray, float]:
        """(twist, gripper) from the current stick, d-pad and trigger values."""
        lay, dz = self.layout, self.deadzone
        axis = lambda i: self._axes.get(i, 0.0)  # noqa: E731
        twist = np.array(
            [
                -apply_deadzone(axis(lay.lefty), dz),
                -apply_deadzone(axis(lay.leftx), dz),
                -apply_deadzone(axis(lay.righty), dz),
                float(self._hat[0]),
                float(self._hat[1]),
                -apply_deadzone(axis(lay.rightx), dz),
            ]
        )
        return twist, float(np.clip(axis(lay.righttrigger) if lay.righttrigger in self._axes else -1.0, -1.0, 1.0))

    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        if self._joystick is None:
            raise TeleopError("GamepadDevice.read: the device is not started; call start() or use it in a `with` block")
        for event in self._pygame.event.get(self._types):
            self.handle_event(event)
        twist, gripper = self.twist()
        return self._latch.command(twist, gripper)


# ---------------------------------------------------------------------------------------------------
# SpaceMouse (pyspacemouse / hidapi)
# ---------------------------------------------------------------------------------------------------
#: SpaceMouse button index -> operator event (two-button models: left toggles the gripper, right keeps)
SPACEMOUSE_BUTTONS: dict[int, str] = {0: "gripper", 1: "keep"}


class SpaceMouseDevice(TeleopDevice):
    """A 3Dconnexion SpaceMouse through pyspacemouse (hidapi), read in its ROS axis convention (x forward,
    y left, z up; roll, pitch, yaw about them), so its six axes are the twist as they are.

    Axes get a `deadzone` and are scaled by `gain` (the puck rarely reaches full scale); `buttons` maps
    button indices to events (default: left toggles the gripper, right keeps the episode; discard with Ctrl-C
    or map more buttons on bigger models). `mouse` is an already opened pyspacemouse device (one of several:
    `pyspacemouse.open_by_path(..., axis_convention=AxisConvention.ROS)`); by default the first one found.
    """

    name = "spacemouse"
    help = "puck: 6-DoF motion  left button gripper  right button keep  Ctrl-C discard and stop"

    def __init__(
        self,
        deadzone: float = 0.05,
        gain: float = 1.0,
        buttons: Mapping[int, str] | None = None,
        device: str | None = None,
        mouse: Any = None,
    ) -> None:
        self.deadzone = _check_deadzone(deadzone)
        if gain <= 0:
            raise ValueError(f"gain: expected > 0, got {gain}")
        self.gain = float(gain)
        self.buttons = dict(SPACEMOUSE_BUTTONS if buttons is None else buttons)
        allowed = ("gripper", "keep", "discard", "intervention", "quit")
        bad = {k: v for k, v in self.buttons.items() if v not in allowed}
        if bad:
            raise ValueError(f"buttons: expected events from {allowed}, got {bad}")
        self.device_name = device
        self._latch = _Latch()
        self._previous: list[int] = []
        self._last_t = float("nan")
        self._mouse: Any = mouse

    def start(self) -> None:
        if self._mouse is not None:
            self._latch.reset()
            return
        try:
            import pyspacemouse
        except ImportError as e:
            raise TeleopError(
                f"SpaceMouseDevice: pyspacemouse is not installed ({e}); install it with {INSTALL_HINT} "
                "and the hidapi library (Debian: apt install libhidapi-hidraw0)"
            ) from e
        try:
            self._mouse = pyspacemouse.open(device=self.device_name, axis_convention=pyspacemouse.AxisConvention.ROS)
        except (RuntimeError, ValueError, OSError, AttributeError) as e:
            raise TeleopError(
                f"SpaceMouseDevice: no SpaceMouse could be opened ({e}). Plug it in, and give your user access "
                'to its /dev/hidraw* node (a udev rule: SUBSYSTEM=="hidraw", ATTRS{idVendor}=="256f", '
                'MODE="0666"; older models use vendor 046d)'
            ) from e
        self._previous = []
        self._last_t = float("nan")
        self._latch.reset()

    def close(self) -> None:
        if self._mouse is not None:
            self._mouse.close()
            self._mouse = None

    def reset_episode(self) -> None:
        self._latch.reset()

    def _fold_buttons(self, state: Any) -> None:
        buttons = [int(b) for b in state.buttons]
        for i, pressed in enumerate(buttons):
            was = self._previous[i] if i < len(self._previous) else 0
            if pressed and not was and i in self.buttons:
                self._latch.fire(self.buttons[i])
        self._previous = buttons

    def _command(self, state: Any) -> TeleopCommand:
        raw = [float(getattr(state, axis)) for axis in TWIST_AXES]
        return self._latch.command(np.array([apply_deadzone(v, self.deadzone) for v in raw]) * self.gain)

    def command_from_state(self, state: Any) -> TeleopCommand:
        """The command for one pyspacemouse `SpaceMouseState`: axes -> twist, newly pressed buttons -> events."""
        self._fold_buttons(state)
        return self._command(state)

    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        """Drain every HID report that arrived since the last call (the puck reports faster than the control
        rate; reading one per step would fall ever further behind), folding each report's button presses."""
        if self._mouse is None:
            raise TeleopError(
                "SpaceMouseDevice.read: the device is not started; call start() or use it in a `with` block"
            )
        state = self._mouse.read()
        for _ in range(256):
            if state.t == self._last_t:  # pyspacemouse stamps each report it processes
                break
            self._last_t = state.t
            self._fold_buttons(state)
            state = self._mouse.read()
        return self._command(state)


# ---------------------------------------------------------------------------------------------------
# scripted operator (the task's expert): tests, CI, and demonstrations without a person
# ---------------------------------------------------------------------------------------------------
class ScriptedDevice(TeleopDevice):
    """The task's scripted expert acting as the operator, with its teleop `noise` (default: the task's
    `demo_noise`, the level at which it stands in for a human).

    It decides like an operator watching the robot: it keeps the episode when the env reports success
    (`keep_on_success`) or the episode ends, and with `discard_failures` discards episodes that never
    succeeded. `interventions` are [start, stop) step ranges of each episode during which it reports having
    taken over, so the intervention path is exercised without a person.
    """

    name = "scripted"
    human = False
    help = "scripted expert (no controls)"

    def __init__(
        self,
        task: Task,
        noise: float | None = None,
        seed: int | None = 0,
        keep_on_success: bool = True,
        discard_failures: bool = False,
        interventions: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.task = task
        self.noise = float(task.demo_noise if noise is None else noise)
        if self.noise < 0:
            raise ValueError(f"noise: expected >= 0, got {self.noise}")
        self.seed = seed
        self.keep_on_success = keep_on_success
        self.discard_failures = discard_failures
        self.interventions = [(int(a), int(b)) for a, b in interventions]
        bad = [(a, b) for a, b in self.interventions if not 0 <= a < b]
        if bad:
            raise ValueError(f"interventions: expected [start, stop) step ranges with 0 <= start < stop, got {bad}")
        self.expert: Any = None
        self._step = 0

    def start(self) -> None:
        if self.expert is None:
            self.expert = self.task.expert(noise=self.noise, seed=self.seed)
            self.expert.reset(1)

    def reset_episode(self) -> None:
        if self.expert is not None:
            self.expert.reset_env(0)
        self._step = 0

    def read(self, obs: Mapping[str, Any], status: EpisodeStatus | None = None) -> TeleopCommand:
        if self.expert is None:
            raise TeleopError(
                "ScriptedDevice.read: the device is not started; call start() or use it in a `with` block"
            )
        if status is not None and (status.done or (self.keep_on_success and status.success)):
            drop = self.discard_failures and not status.any_success
            return TeleopCommand(keep=not drop, discard=drop)
        batch = {k: np.asarray(v)[None] for k, v in obs.items()}
        action = np.asarray(self.expert.act(batch))[0]
        step, self._step = self._step, self._step + 1
        taken_over = any(a <= step < b for a, b in self.interventions)
        return TeleopCommand(action=action, intervention=taken_over)


# ---------------------------------------------------------------------------------------------------
# factory
# ---------------------------------------------------------------------------------------------------
DEVICES: dict[str, type[TeleopDevice]] = {
    "keyboard": KeyboardDevice,
    "gamepad": GamepadDevice,
    "spacemouse": SpaceMouseDevice,
    "scripted": ScriptedDevice,
}


def make_device(name: str, task: Task | str | None = None, **options: Any) -> TeleopDevice:
    """A teleop device by name ('keyboard', 'gamepad', 'spacemouse', 'scripted'); `options` go to its
    constructor. 'scripted' needs the `task` (a `Task` or a task name) whose expert it runs."""
    if name not in DEVICES:
        close = difflib.get_close_matches(name, list(DEVICES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"device: unknown device {name!r}; expected one of {sorted(DEVICES)}.{hint}")
    cls = DEVICES[name]
    if cls is ScriptedDevice:
        if task is None:
            raise ValueError("make_device('scripted'): expected the task whose expert operates, got task=None")
        if isinstance(task, str):
            from robotrl.envs import make_task

            task = make_task(task)
        return ScriptedDevice(task, **options)
    return cls(**options)
