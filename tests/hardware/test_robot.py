"""Robot files: the bundled ones load and agree with the task suite's arm, their joints and limits read from the
description they name; broken files are refused naming the field, the expected and the actual value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from robotrl.envs import make_task
from robotrl.hardware.robot import ROBOTS_DIR, RobotConfig, RobotConfigError


def test_bundled_robots_load() -> None:
    names = sorted(p.stem for p in ROBOTS_DIR.glob("*.yaml"))
    assert {"sim_panda", "franka_fr3"} <= set(names)
    for name in names:
        robot = RobotConfig.load(name)
        assert robot.dof == len(robot.limits.velocity) >= 7
        assert all(t.startswith("/") for t in (robot.topics.joint_states, robot.topics.command))


ARM = make_task("PushT").arm  # the task suite's arm, as its tasks read it from their compiled scenes


def test_sim_panda_is_the_task_suites_arm() -> None:
    """sim_panda names PushT's scene as its description and gives no joints or position limits: they are read from
    it; its workspace is checked at the scene's `ee` site, PushT's tip."""
    robot = RobotConfig.load("sim_panda")
    assert robot.model == "task:PushT" and robot.joint_names == ARM.joint_names
    np.testing.assert_allclose(np.stack([robot.lower(), robot.upper()], -1), ARM.limits)
    q = np.array([0.0, 0.2, 0.0, -2.2, 0.0, 2.4, 0.8])
    np.testing.assert_allclose(robot.load_model().ee_position(q), ARM.forward(np, q[None])[0][0], atol=1e-12)


def test_franka_fr3_is_checked_with_the_panda_urdf_under_its_own_joint_names() -> None:
    """franka_fr3 names example-robot-data's Panda URDF (the FR3's chain is the Panda's) with model_joints mapping
    the driver's fr3_joint* names to it: its tool point, 12 cm below panda_link8, is the task arm's PushT tip (the
    task arm has the Panda's link frames), while its own FR3 limits stay as written."""
    robot = RobotConfig.load("franka_fr3")
    model = robot.load_model()
    assert model.joint_names == tuple(f"panda_joint{i}" for i in range(1, 8))
    q = np.array([0.3, 0.1, -0.2, -2.0, 0.1, 2.2, 0.5])
    np.testing.assert_allclose(model.ee_position(q), ARM.forward(np, q[None])[0][0], atol=1e-9)
    assert robot.lower()[5] == 0.5445  # the FR3's, not the Panda URDF's


def test_sim_panda_hand_is_pick_places_arm_and_gripper() -> None:
    """The arm's joints then PickPlace's fingers, in the task's order; the safety filter's workspace check reads
    the arm's joints only (the fingers move no link), and a finger target past its limits is clipped."""
    from robotrl.envs import make_task
    from robotrl.envs.tasks.pick_place import FINGER_CLOSED, FINGER_OPEN
    from robotrl.hardware.safety import SafetyFilter

    robot = RobotConfig.load("sim_panda_hand")
    assert robot.joint_names == make_task("PickPlace").joint_names()
    np.testing.assert_allclose(np.stack([robot.lower(), robot.upper()], -1)[:7], ARM.limits)
    assert (robot.lower()[7:] == FINGER_CLOSED).all() and (robot.upper()[7:] == FINGER_OPEN).all()
    safety = SafetyFilter(robot)
    home = np.array([0.0, 0.3, 0.0, -2.0, 0.0, 2.3, 0.8, 0.04, 0.04])
    safety.observe(home, 0.0)
    out = safety.step(home + np.r_[np.zeros(7), -0.001, 0.5], 0.05)  # fingers: a small close, a wild open
    assert out is not None and out[8] == FINGER_OPEN and out[7] < FINGER_OPEN
    assert safety.counters["clipped_position"] == 1 and safety.counters["rejected_workspace"] == 0
    data = yaml.safe_load((ROBOTS_DIR / "sim_panda_hand.yaml").read_text())
    for key in ("joint_names", *("lower", "upper", "velocity", "acceleration")):
        target = data if key == "joint_names" else data["limits"]
        target[key] = target[key][:6]
    with pytest.raises(
        RobotConfigError, match=r"joint_names: expected every joint of the model's arm .* missing \['joint7'\]"
    ):
        RobotConfig.from_dict(data, "six.yaml")


def test_franka_fr3_talks_to_franka_ros2() -> None:
    robot = RobotConfig.load(ROBOTS_DIR / "franka_fr3.yaml")
    assert robot.command_type == "joint_trajectory"
    assert robot.topics.command == "/fr3_arm_controller/joint_trajectory"
    assert robot.joint_names[0] == "fr3_joint1"


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: [d.pop("joint_names"), d.pop("model")], "missing field 'joint_names' \\(or a model"),
        (lambda d: d.update(kinematics="panda"), "kinematics: not a field; the workspace check reads the robot's"),
        (lambda d: d.update(model="nope.urdf"), r"model: robot '.*nope.urdf': no such file"),
        (lambda d: d.update(model="example-robot-data:ur5"), r"joint_names: expected every joint of the model's arm"),
        (lambda d: d.update(joint_names=[f"j{i}" for i in range(7)]), r"missing \['joint1', "),
        (lambda d: d.update(joint_name=[]), r"unknown field\(s\) \['joint_name'\]"),
        (lambda d: d["limits"].update(velocity=[1.0] * 6), r"limits.velocity: expected a list of 7 numbers"),
        (lambda d: d["limits"].update(acceleration=[1.0] * 6 + [0.0]), "limits.acceleration: expected positive"),
        (lambda d: d["limits"]["lower"].__setitem__(3, 5.0), "expected lower < upper .* for 'joint4'"),
        (lambda d: d["limits"]["upper"].__setitem__(0, float("nan")), r"limits.upper\[0\]: expected a finite number"),
        (lambda d: d.update(command_type="twist"), "command_type: expected one of"),
        (lambda d: d["topics"].update(command="joint_command"), "topics.command: expected an absolute topic name"),
        (lambda d: d["topics"]["images"].update(image_top=3), "topics.images.image_top: expected an absolute topic"),
        (lambda d: d.update(control_hz=0), "control_hz: expected a positive number, got 0"),
        (lambda d: d["workspace"].update(upper=[0.1, 0.5, 0.7]), "workspace: expected lower < upper on every axis"),
        (lambda d: d.pop("model"), "workspace: needs a model"),
        (lambda d: d.update(joint_names=["a"] * 7), "expected distinct names"),
    ],
)
def test_broken_files_are_refused(tmp_path: Path, edit: Any, match: str) -> None:
    data = yaml.safe_load((ROBOTS_DIR / "sim_panda.yaml").read_text())
    data["joint_names"] = list(ARM.joint_names)  # written out, as a file for a driver of other names would
    data["limits"].update(lower=ARM.limits[:, 0].tolist(), upper=ARM.limits[:, 1].tolist())
    edit(data)
    with pytest.raises(RobotConfigError, match=match) as err:
        RobotConfig.load(write(tmp_path, data))
    assert str(tmp_path) in str(err.value)  # names the file


def test_unknown_names_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(RobotConfigError, match=r"expected a bundled robot \[.*'sim_panda'"):
        RobotConfig.load("ur5")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(RobotConfigError, match="not valid YAML"):
        RobotConfig.load(bad)
    with pytest.raises(RobotConfigError, match="no such robot file"):
        RobotConfig.load(tmp_path / "missing.yaml")


def test_robot_init_writes_a_robot_file_from_a_description(tmp_path: Path) -> None:
    """`robotrl robot init`: a UR5's file from its URDF (velocity limits from its <limit velocity>), a task arm's from
    its MJCF scene (velocity placeholders); both load as robot files with the description's joints and limits; an
    existing file is not replaced unless asked."""
    from robotrl.cli import main
    from robotrl.hardware.robot_file import DEFAULT_VELOCITY

    main(["robot", "init", "--model", "example-robot-data:ur5", "--out", str(tmp_path / "ur5.yaml")])
    ur5 = RobotConfig.load(tmp_path / "ur5.yaml")
    assert ur5.name == "ur5" and ur5.model == "example-robot-data:ur5" and ur5.ee == "tool0"
    assert ur5.joint_names[0] == "shoulder_pan_joint" and ur5.limits.velocity == (3.15, 3.15, 3.15, 3.2, 3.2, 3.2)
    np.testing.assert_allclose(ur5.upper()[0], 2 * np.pi)
    main(["robot", "init", "--model", "task:Reach", "--out", str(tmp_path / "arm.yaml")])
    arm = RobotConfig.load(tmp_path / "arm.yaml")
    assert arm.joint_names == ARM.joint_names and set(arm.limits.velocity) == {DEFAULT_VELOCITY}
    before = (tmp_path / "arm.yaml").read_text()
    with pytest.raises(SystemExit):
        main(["robot", "init", "--model", "example-robot-data:ur5", "--out", str(tmp_path / "arm.yaml")])
    assert (tmp_path / "arm.yaml").read_text() == before
    main(["robot", "init", "--model", "example-robot-data:ur5", "--out", str(tmp_path / "arm.yaml"), "--overwrite"])
    assert RobotConfig.load(tmp_path / "arm.yaml").dof == 6
