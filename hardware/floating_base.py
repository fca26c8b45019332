"""A floating-base robot (a legged one) as ROS 2 sees it: an IMU (`sensor_msgs/Imu`: orientation, angular velocity),
a state estimator's odometry (`nav_msgs/Odometry`: base position, linear velocity in the base frame) and a velocity
command (`geometry_msgs/Twist` on /cmd_vel), besides its joint states.

A task's model reads these through MuJoCo sensors at its base (Quadruped: `framequat`, `velocimeter`, `gyro` at the
trunk's IMU site). `BaseSensors` maps each sensor to the message field of its kind, both ways: the sim robot
publishes its sensors' values on the messages, and the deploy node writes the messages' values back into the
sensors of a `Frame`, so that the task's own `observe` -- the function the policy was trained on -- makes the
policy's observation on the robot too. The values cross the wire as float64, so an observation over ROS 2 is the
in-process one to the bit.

Torch-free and rclpy-free (`hardware/messages.py` converts the messages).
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

#: MuJoCo sensor type -> the base reading it is (what `BaseReading` holds)
SENSOR_FIELDS = {
    int(mujoco.mjtSensor.mjSENS_FRAMEQUAT): "orientation",
    int(mujoco.mjtSensor.mjSENS_GYRO): "angular_velocity",
    int(mujoco.mjtSensor.mjSENS_VELOCIMETER): "linear_velocity",
    int(mujoco.mjtSensor.mjSENS_ACCELEROMETER): "linear_acceleration",
}
FREE = int(mujoco.mjtJoint.mjJNT_FREE)


@dataclass
class BaseReading:
    """What a floating base's sensors say, in its own frame where a velocity is concerned."""

    position: np.ndarray
    """(3,) m, world (odometry's pose)"""
    orientation: np.ndarray
    """(4,) unit quaternion (w, x, y, z), base to world (the IMU's; ROS orders it x, y, z, w)"""
    linear_velocity: np.ndarray
    """(3,) m/s, base frame (odometry's twist, in its child frame)"""
    angular_velocity: np.ndarray
    """(3,) rad/s, base frame (the IMU's gyro)"""
    linear_acceleration: np.ndarray
    """(3,) m/s^2, base frame, gravity included (the IMU's accelerometer)"""

    def up_z(self) -> float:
        """The world z of the base's up axis: 1 level, 0 on its side, -1 upside down."""
        _, x, y, _ = self.orientation
        return float(1.0 - 2.0 * (x * x + y * y))


def base_joint(model: mujoco.MjModel) -> int | None:
    """The free joint the actuated joints hang from (a legged robot's base), or None (a fixed base: an arm; free
    objects such as PickPlace's cubes carry no actuated joint)."""
    body = int(model.jnt_bodyid[int(model.actuator_trnid[0, 0])]) if model.nu else 0
    while body > 0:
        for j in range(int(model.body_jntadr[body]), int(model.body_jntadr[body]) + int(model.body_jntnum[body])):
            if int(model.jnt_type[j]) == FREE:
                return j
        body = int(model.body_parentid[body])
    return None


class BaseSensors:
    """The floating base of a task's model: where its free joint and its IMU/odometry sensors are."""

    def __init__(self, model: mujoco.MjModel, where: str) -> None:
        free = base_joint(model)
        if free is None:
            raise ValueError(f"{where}: expected a robot on a floating base (a free joint), got a fixed one")
        self.qadr, self.dadr = int(model.jnt_qposadr[free]), int(model.jnt_dofadr[free])
        self.slices: dict[str, slice] = {}
        for i in range(model.nsensor):
            kind = SENSOR_FIELDS.get(int(model.sensor_type[i]))
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SENSOR, i) or f"#{i}"
            if kind is None:
                raise ValueError(
                    f"{where}: sensor {name!r} ({mujoco.mjtSensor(model.sensor_type[i]).name}) is none of a robot's "
                    f"IMU and odometry readings (framequat, gyro, velocimeter, accelerometer)"
                )
            if kind in self.slices:
                raise ValueError(f"{where}: two sensors give the base's {kind}; expected one of each kind")
            adr = int(model.sensor_adr[i])
            self.slices[kind] = slice(adr, adr + int(model.sensor_dim[i]))
        self.nsensordata = int(model.nsensordata)

    def read(self, qpos: np.ndarray, sensordata: np.ndarray) -> BaseReading:
        """The base's reading in a simulated state: its sensors' values, the free joint's position."""
        values = {k: np.array(sensordata[s], dtype=np.float64) for k, s in self.slices.items()}
        quat = values.get("orientation", np.array(qpos[self.qadr + 3 : self.qadr + 7], dtype=np.float64))
        zero = np.zeros(3)
        return BaseReading(
            np.array(qpos[self.qadr : self.qadr + 3], dtype=np.float64),
            quat,
            values.get("linear_velocity", zero),
            values.get("angular_velocity", zero),
            values.get("linear_acceleration", zero),
        )

    def write(self, reading: BaseReading, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """The sensor data a reading stands for (and the free joint's position, orientation and velocity written
        into `qpos`, `qvel`): what the task's `observe` reads."""
        sensordata = np.zeros(self.nsensordata)
        for kind, s in self.slices.items():
            sensordata[s] = getattr(reading, kind)
        qpos[self.qadr : self.qadr + 3] = reading.position
        qpos[self.qadr + 3 : self.qadr + 7] = reading.orientation
        qvel[self.dadr : self.dadr + 3] = quat_rotate(reading.orientation, reading.linear_velocity)  # world frame
        qvel[self.dadr + 3 : self.dadr + 6] = reading.angular_velocity  # MuJoCo's free joint: body frame
        return sensordata


def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v (3,) rotated by the unit quaternion q (w, x, y, z)."""
    out = np.zeros(3)
    mujoco.mju_rotVecQuat(out, np.asarray(v, dtype=np.float64), np.asarray(q, dtype=np.float64))
    return out
