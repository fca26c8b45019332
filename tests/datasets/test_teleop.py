"""Teleop devices with their real libraries: the keyboard through pynput on an Xvfb display (keys injected
with XTest), the gamepad through an SDL virtual joystick, the SpaceMouse mapping on pyspacemouse's own
state type, the scripted operator, and the command -> action mapping of every task."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets.teleop import (
    DEVICES,
    EpisodeStatus,
    GamepadDevice,
    GamepadLayout,
    KeyboardDevice,
    ScriptedDevice,
    SpaceMouseDevice,
    TeleopCommand,
    TeleopError,
    action_axes,
    apply_deadzone,
    command_to_action,
    make_device,
)
from robotrl.envs import make_task


def wait_for(predicate: Callable[[], Any], timeout: float = 3.0) -> Any:
    """Poll until `predicate()` is truthy (X events and SDL events arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------------
# command -> action
# ---------------------------------------------------------------------------------------------------
TWIST = np.array([0.1, -0.2, 0.3, 0.4, 0.5, -0.6])


@pytest.mark.parametrize(
    "task, expected",
    [
        ("Reach", [0.1, -0.2, 0.3]),
        ("PushT", [0.1, -0.2]),
        ("PickPlace", [0.1, -0.2, 0.3, -0.6, 0.7]),
    ],
)
def test_command_maps_onto_each_tasks_ee_delta_action(task: str, expected: list[float]) -> None:
    spec = make_task(task).spec()
    action = command_to_action(TeleopCommand(twist=TWIST, gripper=0.7), spec)
    assert action.dtype == np.float32 and action.shape == spec.action.shape
    np.testing.assert_allclose(action, expected, atol=1e-6)
    assert len(action_axes(spec)) == spec.action.shape[0]


def test_the_axes_are_the_tasks_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task declares its teleop axes on its class (datasets/ names no task): changing them there changes the
    mapping, and a task that declares none (or a foreign dataset's task) is refused naming the drivable ones."""
    from robotrl.envs.tasks import task_class

    spec = make_task("PushT").spec()
    monkeypatch.setattr(task_class("PushT"), "teleop_axes", ("y", "x"))
    np.testing.assert_allclose(command_to_action(TeleopCommand(twist=TWIST), spec), TWIST[[1, 0]], atol=1e-6)
    monkeypatch.setattr(task_class("PushT"), "teleop_axes", None)
    with pytest.raises(TeleopError, match=r"no teleop mapping for 'PushT'.*expected one of \['PickPlace', 'Reach'\]"):
        action_axes(spec)


def test_command_is_clipped_to_the_action_bounds() -> None:
    spec = make_task("PickPlace").spec()
    cmd = TeleopCommand(twist=[3.0, -3.0, 0, 0, 0, 1.5], gripper=9.0)
    np.testing.assert_array_equal(cmd.twist, [1, -1, 0, 0, 0, 1])
    np.testing.assert_array_equal(command_to_action(cmd, spec), [1, -1, 0, 1, 1])
    passthrough = TeleopCommand(action=[2.0, -0.5, 0.0, -7.0, 0.3])
    np.testing.assert_allclose(command_to_action(passthrough, spec), [1, -0.5, 0, -1, 0.3], atol=1e-6)


def test_mapping_errors_name_what_is_wrong() -> None:
    with pytest.raises(TeleopError, match="action_mode: expected 'ee_delta'.*'joint_pos'"):
        action_axes(make_task("Quadruped").spec())
    with pytest.raises(TeleopError, match="ee_delta"):
        command_to_action(TeleopCommand(), make_task("Reach", action_mode="joint_pos").spec())
    with pytest.raises(SpecMismatchError, match=r"expected shape \(2,\).*got \(3,\)"):
        command_to_action(TeleopCommand(action=np.zeros(3)), make_task("PushT").spec())
    with pytest.raises(ValueError, match=r"twist: expected shape \(6,\)"):
        TeleopCommand(twist=np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        TeleopCommand(twist=[np.nan, 0, 0, 0, 0, 0])


def test_deadzone_is_continuous_and_keeps_full_scale() -> None:
    assert apply_deadzone(0.05, 0.1) == 0.0
    assert apply_deadzone(-0.1, 0.1) == 0.0
    assert apply_deadzone(1.0, 0.1) == pytest.approx(1.0)
    assert apply_deadzone(-1.2, 0.1) == pytest.approx(-1.0)
    assert apply_deadzone(0.55, 0.1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"deadzone: expected a value in \[0, 1\), got 1.0"):
        GamepadDevice(deadzone=1.0)


def test_unknown_device_lists_the_choices() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown device 'keybaord'; expected one of .*'gamepad'.*'keyboard'.*"
        r"'scripted'.*'spacemouse'.*Did you mean 'keyboard'",
    ):
        make_device("keybaord")
    with pytest.raises(ValueError, match="expected the task"):
        make_device("scripted")
    assert set(DEVICES) == {"keyboard", "gamepad", "spacemouse", "scripted"}
    assert isinstance(make_device("scripted", "PushT"), ScriptedDevice)


# ---------------------------------------------------------------------------------------------------
# scripted operator
# ---------------------------------------------------------------------------------------------------
def test_scripted_device_acts_with_the_expert_and_decides_like_an_operator() -> None:
    task = make_task("PushT")
    device = make_device("scripted", task, interventions=[(1, 3)], discard_failures=True)
    assert device.noise == task.demo_noise and not device.human
    obs = {"state": np.zeros(task.spec().observations["state"].shape, np.float32)}
    with pytest.raises(TeleopError, match="not started"):
        device.read(obs)
    with device:
        flags = []
        for step in range(4):
            cmd = device.read(obs, EpisodeStatus(step=step))
            assert cmd.action is not None and cmd.action.shape == (2,) and not cmd.events
            flags.append(cmd.intervention)
        assert flags == [False, True, True, False]
        assert device.read(obs, EpisodeStatus(success=True, any_success=True)).keep
        failed = device.read(obs, EpisodeStatus(done=True, any_success=False))
        assert failed.discard and not failed.keep
        device.reset_episode()
        assert not device.read(obs, EpisodeStatus()).intervention  # step 0 of the next episode
    keeper = ScriptedDevice(task, noise=0.0)
    with keeper:
        assert keeper.read(obs, EpisodeStatus(done=True)).keep
    with pytest.raises(ValueError, match=r"interventions: expected \[start, stop\)"):
        ScriptedDevice(task, interventions=[(3, 3)])


# ---------------------------------------------------------------------------------------------------
# keyboard: pynput on a real (virtual) X server, keys injected through XTest
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def xdisplay() -> Iterator[str]:
    """A private Xvfb server on a free display (Xvfb picks it: -displayfd), set as DISPLAY for the module.
    -noreset: by default an X server resets when its last client leaves, refusing connections meanwhile."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("Xvfb is not installed (Debian: apt install xvfb); the keyboard driver needs an X server")
    read_fd, write_fd = os.pipe()
    args = ["-displayfd", str(write_fd), "-screen", "0", "640x480x24", "-nolisten", "tcp", "-noreset"]
    proc = subprocess.Popen([xvfb, *args], pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 15.0)
        number = os.read(read_fd, 64).decode().strip() if ready else ""
        if not number.isdigit():
            pytest.fail(f"Xvfb did not report a display number within 15 s (got {number!r})")
        old = os.environ.get("DISPLAY")
        os.environ["DISPLAY"] = f":{number}"
        yield f":{number}"
        if old is None:
            os.environ.pop("DISPLAY", None)
        else:
            os.environ["DISPLAY"] = old
    finally:
        os.close(read_fd)
        proc.terminate()
        proc.wait(timeout=10)


def test_keyboard_without_a_display_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    with pytest.raises(TeleopError, match="needs an X display.*DISPLAY is not set.*Xvfb"):
        KeyboardDevice().start()
    with pytest.raises(TeleopError, match="not started"):
        KeyboardDevice().read({})


class XTestKeys:
    """Presses keys through the XTest extension (pynput's Controller with virtual key codes), so the X server
    sees them as a keyboard's, and the device's listener gets them the way it gets a physical keyboard's."""

    def __init__(self) -> None:
        from pynput.keyboard import Controller, KeyCode

        self.controller, self.keycode = Controller(), KeyCode

    def key(self, key: Any) -> Any:
        return self.keycode.from_vk(ord(key)) if isinstance(key, str) else key  # X keysym of a latin letter

    def press(self, key: Any) -> None:
        self.controller.press(self.key(key))

    def release(self, key: Any) -> None:
        self.controller.release(self.key(key))

    def handshake(self, device: KeyboardDevice, timeout: float = 5.0) -> None:
        """Tap W until the device reports it: its listener is recording, and no later key is lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.press("w")
            seen = wait_for(lambda: device.read({}).twist[0] == 1.0, timeout=0.2)
            self.release("w")
            if seen:
                assert wait_for(lambda: not device.read({}).twist.any())
                return
        pytest.fail(f"the keyboard listener saw no key within {timeout} s")


def test_keyboard_keys_become_twist_gripper_and_events(xdisplay: str) -> None:
    from pynput.keyboard import Key

    keys = XTestKeys()

    def tap(key: Any) -> None:
        keys.press(key)
        keys.release(key)

    with KeyboardDevice() as device:
        keys.handshake(device)
        twist = lambda: device.read({}).twist  # noqa: E731
        keys.press("w")
        keys.press("a")
        assert wait_for(lambda: np.array_equal(twist(), [1, 1, 0, 0, 0, 0])), twist()
        keys.press("s")  # opposite keys cancel
        assert wait_for(lambda: np.array_equal(twist(), [0, 1, 0, 0, 0, 0])), twist()
        for k in ("w", "a", "s"):
            keys.release(k)
        keys.press("r")
        keys.press("q")
        keys.press(Key.up)
        assert wait_for(lambda: np.array_equal(twist(), [0, 0, 1, 0, 1, 1])), twist()
        keys.press(Key.shift)  # precision mode
        assert wait_for(lambda: np.allclose(twist(), [0, 0, 0.25, 0, 0.25, 0.25])), twist()
        for k in (Key.shift, "r", "q", Key.up):
            keys.release(k)
        keys.press("f")
        keys.press("e")
        keys.press(Key.left)
        keys.press("d")
        assert wait_for(lambda: np.array_equal(twist(), [0, -1, -1, -1, 0, -1])), twist()
        for k in ("f", "e", Key.left, "d"):
            keys.release(k)
        assert wait_for(lambda: not twist().any()), twist()

        assert device.read({}).gripper == -1.0
        tap(Key.space)
        assert wait_for(lambda: device.read({}).gripper == 1.0)
        tap(Key.space)
        assert wait_for(lambda: device.read({}).gripper == -1.0)
        tap("i")
        assert wait_for(lambda: device.read({}).intervention)
        assert device.read({}).intervention  # a state, not an event

        for key, event in ((Key.enter, "keep"), (Key.backspace, "discard"), (Key.esc, "quit")):
            tap(key)
            seen = wait_for(lambda: device.read({}).events)
            assert seen == [event]
            assert device.read({}).events == []  # one press, one event

        device.reset_episode()
        cmd = device.read({})
        assert not cmd.intervention and cmd.gripper == -1.0


def test_keyboard_drives_a_collect_session(xdisplay: str, tmp_path: Path) -> None:
    """The operator holds W, keeps the episode with Enter, then quits with Esc; the store gets one teleop
    episode whose actions push +x."""
    from pynput.keyboard import Key

    from robotrl.datasets.collect import CollectConfig, collect
    from robotrl.datasets.store import EpisodeStore

    out = tmp_path / "reach.zarr"
    keys = XTestKeys()

    def operator() -> None:
        wait_for(lambda: (out / "zarr.json").exists(), timeout=20)
        time.sleep(0.2)
        keys.press("w")
        time.sleep(0.5)
        keys.release("w")
        keys.press(Key.enter)
        keys.release(Key.enter)
        time.sleep(0.3)
        keys.press(Key.esc)
        keys.release(Key.esc)

    device = KeyboardDevice()
    device.start()  # listening before the operator types (collect's `with` keeps it and closes it)
    keys.handshake(device)
    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    summary = collect(
        CollectConfig(task="Reach", device="keyboard", out=out, episodes=3, episode_steps=400), device=device
    )
    thread.join(timeout=10)
    assert summary.kept == 1 and summary.quit and not summary.interrupted
    store = EpisodeStore.open(out)
    assert store.num_episodes == 1
    meta = store.episodes[0]
    assert meta["source"] == "teleop" and meta["device"] == "keyboard" and meta["end_reason"] == "operator"
    action = store.episode(0).data["action"]
    assert 5 <= len(action) < 400
    assert (action[:, 0] == 1.0).sum() >= 3 and not action[:, 1:].any()
    # paced in real time at the task's 20 Hz: the episode's wall-clock span matches its length
    dt = np.diff(store.episode(0).data["timestamp"])
    assert 0.03 < float(np.median(dt)) < 0.08


def test_collect_live_view_shows_frames_on_the_display(
    xdisplay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from robotrl.datasets.collect import CollectConfig, LiveView, collect

    shown: list[tuple[tuple[int, ...], list[str]]] = []
    original = LiveView.show

    def record(self: LiveView, frame: np.ndarray, lines: list[str]) -> None:
        shown.append((np.asarray(frame).shape, lines))
        original(self, frame, lines)
        assert self.pygame.display.get_surface().get_size() == (self.size[1], self.size[0])

    monkeypatch.setattr(LiveView, "show", record)
    summary = collect(CollectConfig(task="Reach", out=tmp_path / "r.zarr", episodes=1, episode_steps=10, view=True))
    assert summary.kept == 1 and len(shown) >= 2
    assert shown[0][0] == (360, 480, 3) and shown[0][1][0].startswith("episode 0  step 0")

    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(TeleopError, match="view: a live window needs a display.*view=False"):
        collect(CollectConfig(task="Reach", out=tmp_path / "r2.zarr", episodes=1, episode_steps=10, view=True))


# ---------------------------------------------------------------------------------------------------
# gamepad: pygame events from an SDL virtual joystick (SDL_JoystickAttachVirtual, SDL >= 2.0.14)
# ---------------------------------------------------------------------------------------------------
def _sdl_library() -> ctypes.CDLL | None:
    """The SDL2 library pygame itself is linked against (its wheel bundles one; else the system's)."""
    import pygame

    root = Path(pygame.__file__).parent
    bundled = sorted(glob.glob(str(root.parent / "pygame.libs" / "libSDL2-2*.so*")))
    name = bundled[0] if bundled else ctypes.util.find_library("SDL2")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    return lib if hasattr(lib, "SDL_JoystickAttachVirtual") else None


class VirtualPad:
    """An SDL virtual joystick: SDL emits real joystick events when its axes, buttons and hat are set."""

    def __init__(self, sdl: ctypes.CDLL, controller: bool, axes: int = 6, buttons: int = 11, hats: int = 1) -> None:
        import pygame

        self.sdl, self.pygame = sdl, pygame
        sdl.SDL_JoystickFromInstanceID.restype = ctypes.c_void_p
        sdl.SDL_JoystickSetVirtualAxis.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int16]
        sdl.SDL_JoystickSetVirtualButton.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint8]
        sdl.SDL_JoystickSetVirtualHat.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint8]
        self.index = sdl.SDL_JoystickAttachVirtual(1 if controller else 0, axes, buttons, hats)
        assert self.index >= 0, "SDL_JoystickAttachVirtual failed"
        pygame.event.pump()
        self.joystick = pygame.joystick.Joystick(self.index)
        self.ptr = sdl.SDL_JoystickFromInstanceID(self.joystick.get_instance_id())

    def axis(self, i: int, value: float) -> None:
        self.sdl.SDL_JoystickSetVirtualAxis(self.ptr, i, int(np.clip(round(value * 32767), -32768, 32767)))

    def button(self, i: int, down: bool) -> None:
        self.sdl.SDL_JoystickSetVirtualButton(self.ptr, i, int(down))

    def tap(self, i: int) -> None:
        """Press and release; SDL samples a virtual pad when events are pumped, so pump in between."""
        self.button(i, True)
        self.pygame.event.pump()
        self.button(i, False)
        self.pygame.event.pump()

    def hat(self, value: int) -> None:  # SDL_HAT_UP = 1, RIGHT = 2, DOWN = 4, LEFT = 8
        self.sdl.SDL_JoystickSetVirtualHat(self.ptr, 0, value)

    def close(self) -> None:
        self.sdl.SDL_JoystickDetachVirtual(self.index)


@pytest.fixture
def sdl(monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    import pygame

    lib = _sdl_library()
    if lib is None:
        pytest.skip("pygame's SDL has no virtual joystick API (SDL_JoystickAttachVirtual, SDL >= 2.0.14)")
    pygame.display.init()
    pygame.joystick.init()
    yield lib
    pygame.quit()


def test_gamepad_maps_sticks_trigger_hat_and_buttons_through_sdl(sdl: ctypes.CDLL) -> None:
    pad = VirtualPad(sdl, controller=True)  # SDL knows it as a game controller: layout from SDL's mapping
    try:
        with GamepadDevice(index=pad.index, deadzone=0.1) as device:
            lay = device.layout
            assert (lay.leftx, lay.lefty, lay.rightx, lay.righty, lay.righttrigger) == (0, 1, 2, 3, 5)
            assert (lay.a, lay.b, lay.x, lay.back) == (0, 1, 2, 4)
            assert device.read({}).gripper == -1.0  # trigger released: open
            pad.axis(lay.lefty, -1.0)  # stick up: forward
            pad.axis(lay.leftx, 0.55)  # half right: -y
            pad.axis(lay.righty, 0.05)  # inside the deadzone
            pad.axis(lay.rightx, -1.0)  # left: counter-clockwise yaw
            pad.axis(lay.righttrigger, 1.0)
            pad.hat(1)  # d-pad up: +pitch
            expected = [1.0, -0.5, 0.0, 0.0, 1.0, 1.0]
            assert wait_for(lambda: np.allclose(device.read({}).twist, expected, atol=1e-3)), device.read({}).twist
            assert device.read({}).gripper == pytest.approx(1.0)
            for i in range(6):
                pad.axis(i, 0.0)
            pad.hat(0)
            assert wait_for(lambda: not device.read({}).twist.any())

            pad.tap(lay.x)
            assert wait_for(lambda: device.read({}).intervention)
            for button, event in ((lay.a, "keep"), (lay.b, "discard"), (lay.back, "quit")):
                pad.tap(button)
                assert wait_for(lambda: device.read({}).events) == [event]
                assert device.read({}).events == []
            device.reset_episode()
            assert not device.read({}).intervention
    finally:
        pad.close()


def test_gamepad_reads_posted_joystick_events_of_its_own_pad_only(sdl: ctypes.CDLL) -> None:
    import pygame

    pad = VirtualPad(sdl, controller=False)  # an unknown pad: the Xbox-on-Linux default layout
    try:
        with GamepadDevice(index=pad.index, layout="auto") as device:
            assert device.layout == GamepadLayout()
            pygame.event.pump()
            pygame.event.clear()
            me, other = device.instance_id, device.instance_id + 1000
            post = lambda kind, **kw: pygame.event.post(pygame.event.Event(kind, **kw))  # noqa: E731
            post(pygame.JOYAXISMOTION, instance_id=me, joy=pad.index, axis=GamepadLayout.righty, value=-1.0)
            post(pygame.JOYAXISMOTION, instance_id=other, joy=9, axis=GamepadLayout.lefty, value=-1.0)
            post(pygame.JOYBUTTONDOWN, instance_id=me, joy=pad.index, button=GamepadLayout.a)
            post(pygame.JOYBUTTONDOWN, instance_id=other, joy=9, button=GamepadLayout.back)
            cmd = device.read({})
            np.testing.assert_allclose(cmd.twist, [0, 0, 1, 0, 0, 0])
            assert cmd.events == ["keep"]
    finally:
        pad.close()


def test_gamepad_missing_says_what_to_check(sdl: ctypes.CDLL) -> None:
    import pygame

    count = pygame.joystick.get_count()
    with pytest.raises(
        TeleopError, match=rf"joystick index {count}: expected < .* which is {count}.*Plug the gamepad in"
    ):
        GamepadDevice(index=count).start()


# ---------------------------------------------------------------------------------------------------
# SpaceMouse: the mapping on pyspacemouse's own state type
# ---------------------------------------------------------------------------------------------------
def test_spacemouse_state_maps_to_twist_and_button_events() -> None:
    from pyspacemouse import ButtonState, SpaceMouseState

    device = SpaceMouseDevice(deadzone=0.05)
    state = SpaceMouseState(
        t=0.0, x=0.525, y=-0.02, z=1.4, roll=-0.525, pitch=0.0, yaw=0.05, buttons=ButtonState([0, 0])
    )
    cmd = device.command_from_state(state)
    np.testing.assert_allclose(cmd.twist, [0.5, 0.0, 1.0, -0.5, 0.0, 0.0], atol=1e-9)
    assert cmd.gripper == -1.0 and cmd.events == []

    press = lambda b0, b1: device.command_from_state(SpaceMouseState(buttons=ButtonState([b0, b1])))  # noqa: E731
    assert press(1, 0).gripper == 1.0  # left button toggles the gripper closed
    assert press(1, 0).gripper == 1.0  # held: no second toggle
    assert press(0, 0).gripper == 1.0
    assert press(1, 0).gripper == -1.0  # pressed again: open
    assert press(0, 1).events == ["keep"]
    assert press(0, 1).events == []  # held: one event per press

    mapped = SpaceMouseDevice(buttons={0: "discard", 1: "intervention"}, gain=2.0)
    assert mapped.command_from_state(SpaceMouseState(buttons=ButtonState([1, 0]))).events == ["discard"]
    assert mapped.command_from_state(SpaceMouseState(buttons=ButtonState([1, 1]))).intervention
    np.testing.assert_allclose(mapped.command_from_state(SpaceMouseState(x=0.3)).twist[0], (0.3 - 0.05) / 0.95 * 2.0)
    with pytest.raises(ValueError, match="buttons: expected events from"):
        SpaceMouseDevice(buttons={0: "jump"})


class QueuedHID:
    """HID reports waiting to be read, as hidapi hands them to pyspacemouse (non-blocking: b"" when none)."""

    def __init__(self, reports: list[bytes]) -> None:
        self.reports = list(reports)

    def read(self, size: int) -> bytes:
        return self.reports.pop(0) if self.reports else b""

    def close(self) -> None:
        self.reports = []


def test_spacemouse_read_decodes_and_drains_every_pending_hid_report() -> None:
    """pyspacemouse decodes real SpaceNavigator reports (ROS axes); one read takes all that are queued, so a
    click that came and went between two control steps still toggles the gripper."""
    import pyspacemouse

    info = pyspacemouse.apply_axis_convention(
        pyspacemouse.get_device_specs()["SpaceNavigator"], pyspacemouse.AxisConvention.ROS
    )
    int16 = lambda v: int(v).to_bytes(2, "little", signed=True)  # noqa: E731
    translation = bytes([1]) + int16(175) + int16(-350) + int16(0)  # HID x right half, y away full
    reports = [translation, bytes([3, 0b01]), bytes([3, 0b00])]  # left button down, up
    hid = QueuedHID(reports)
    mouse = pyspacemouse.SpaceMouseDevice(info=info, device=hid)
    with SpaceMouseDevice(deadzone=0.05, mouse=mouse) as device:
        cmd = device.read({})
        np.testing.assert_allclose(cmd.twist, [1.0, -0.45 / 0.95, 0, 0, 0, 0], atol=1e-9)  # forward, right
        assert cmd.gripper == 1.0
        assert device.read({}).gripper == 1.0  # no new reports: nothing changes
        hid.reports.append(bytes([3, 0b10]))  # right button: keep
        assert device.read({}).events == ["keep"]


def test_spacemouse_missing_says_what_to_check() -> None:
    import pyspacemouse

    try:
        connected = pyspacemouse.get_connected_devices()
    except RuntimeError:
        connected = []
    if connected:
        pytest.skip(f"a SpaceMouse is connected ({connected}); the missing-device error cannot be shown")
    with pytest.raises(TeleopError, match="no SpaceMouse could be opened.*hidraw"):
        SpaceMouseDevice().start()
