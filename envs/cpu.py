"""CPU backend: N MuJoCo instances stepped by `mujoco.rollout` in native threads (the GIL is released).

One control step is one `rollout` call over all envs for `n_substeps` physics steps, so Python runs once
per control step for the whole batch (reset, control, observation and reward are vectorized numpy).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import mujoco
import mujoco.rollout
import numpy as np

from robotrl.envs.randomization import (
    RANDOMIZATION_DIMS,
    Randomization,
    delay_actions,
    nominal_fields,
    sample_latency,
    sample_model_fields,
)
from robotrl.envs.task import Frame, Task
from robotrl.envs.vector import RobotVectorEnv, check_actions, convert_obs, step_output

FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
CTRL = int(mujoco.mjtState.mjSTATE_CTRL)


class CpuVectorEnv(RobotVectorEnv):
    """The threaded CPU backend; `num_threads` defaults to the machine's cores (at most `num_envs`)."""

    def __init__(
        self,
        task: Task,
        num_envs: int,
        randomization: Randomization | None = None,
        seed: int | None = None,
        output: str = "numpy",
        autoreset: bool = True,
        reward_type: str = "dense",
        num_threads: int | None = None,
        render_images: bool = True,
    ) -> None:
        super().__init__(task, num_envs, randomization, seed, output, autoreset, render_images, reward_type)
        m = task.model
        n = self.num_envs
        # below a few envs per core the pool's hand-off costs more than it saves: step in the calling thread
        cores = os.cpu_count() or 1
        threads = num_threads if num_threads is not None else (min(cores, n) if n >= 4 * cores else 1)
        if threads < 0:
            raise ValueError(f"num_threads: expected >= 0, got {threads}")
        self._pool = mujoco.rollout.Rollout(nthread=threads if threads > 1 else 0)
        self._datas = [mujoco.MjData(m) for _ in range(max(threads, 1))]
        self._scratch = mujoco.MjData(m)
        self._models = [copy.copy(m) for _ in range(n)] if self.randomization.changes_model else [m] * n
        self._nominal = nominal_fields(m)
        nstate = mujoco.mj_stateSize(m, FULLPHYSICS)
        nsub = task.n_substeps
        self._qpos = slice(1, 1 + m.nq)  # FULLPHYSICS starts with time, then qpos, then qvel
        self._qvel = slice(1 + m.nq, 1 + m.nq + m.nv)
        self._state = np.zeros((n, nstate))
        self._sens = np.zeros((n, m.nsensordata))
        self._out_state = np.zeros((n, nsub, nstate))
        self._out_sens = np.zeros((n, nsub, m.nsensordata))
        self._ctrl = np.zeros((n, nsub, m.nu))
        self._goal = np.zeros((n, task.goal_dim))
        self._mocap: tuple[np.ndarray, np.ndarray] | None = None
        self._steps = np.zeros(n, dtype=np.int64)
        self._latency = np.zeros(n, dtype=np.int32)
        self._history = np.zeros((n, self.randomization.max_latency + 1, *self.task_spec.action.shape))
        self._rng = np.random.default_rng(seed)
        self._render_images = render_images and bool(task.cameras)
        self._renderer: Any = None
        self._camera_jitter = np.zeros((n, max(len(task.cameras), 1), 3))
        self._light_scale = np.ones(n)

    # --- gymnasium API -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._reset_envs(np.arange(self.num_envs))
        return convert_obs(self._observe(), self.output), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        action = check_actions(actions, self.task_spec.action, self.num_envs)
        if self.randomization.max_latency > 0:
            action, self._history = delay_actions(np, self._history, action, self._latency)
        self._ctrl[:] = self.task.control(np, self.frame(), action)[:, None, :]
        self._pool.rollout(
            self._models,
            self._datas,
            self._state,
            self._ctrl,
            control_spec=CTRL,
            skip_checks=True,
            nstep=self.task.n_substeps,
            state=self._out_state,
            sensordata=self._out_sens,
        )
        self._state[:] = self._out_state[:, -1]
        self._sens[:] = self._out_sens[:, -1]
        frame = self.frame()
        dense, success = self.task.reward(np, frame, action)
        diverged = ~np.isfinite(self._state).all(axis=1)
        terminated = np.asarray(self.task.terminated(np, frame)) | diverged
        self._steps += 1
        truncated = (self._steps >= self.task.config.episode_steps) & ~terminated
        reward = success.astype(np.float64) if self.reward_type == "sparse" else np.where(diverged, 0.0, dense)
        obs = self._observe()
        info: dict[str, Any] = {"success": success.copy(), "diverged": diverged}
        done = terminated | truncated
        if self.autoreset and done.any():
            info["final_obs"] = convert_obs({k: _copy(v) for k, v in obs.items()}, self.output)
            info["_final_obs"] = done.copy()
            idx = np.nonzero(done)[0]
            self._reset_envs(idx)
            obs = self._merge(obs, self._observe(idx), idx)
        return step_output(self.output, obs, reward, terminated, truncated, info)

    def close(self, **kwargs: Any) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def render(self) -> np.ndarray:  # type: ignore[override]  # every env's frame in one array (B, H, W, 3)
        """RGB frame of env 0 from the task's first camera (or a free camera), for videos."""
        return self.render_env(0)

    # --- state access (also used by tests, experts and the recorder) --------------------------------
    def frame(self, idx: np.ndarray | None = None) -> Frame:
        sl = slice(None) if idx is None else idx
        return Frame(self._state[sl, self._qpos], self._state[sl, self._qvel], self._sens[sl], self._goal[sl])

    def get_state(self) -> dict[str, np.ndarray]:
        """Physics state (FULLPHYSICS layout), sensors, goals and step counters: enough to restore exactly."""
        return {
            "physics": self._state.copy(),
            "sensordata": self._sens.copy(),
            "goal": self._goal.copy(),
            "steps": self._steps.copy(),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for key, dst in (
            ("physics", self._state),
            ("sensordata", self._sens),
            ("goal", self._goal),
            ("steps", self._steps),
        ):
            src = np.asarray(state[key])
            if src.shape != dst.shape:
                raise ValueError(f"set_state[{key!r}]: expected shape {dst.shape}, got {src.shape}")
            dst[:] = src
        self._mocap = self.task.mocap(np, self._goal)

    def get_rng_state(self) -> dict[str, Any]:
        """The state of the stream that draws reset states: with `get_state`, what an RL run's checkpoint needs
        to continue exactly mid-episode (without domain randomization, whose per-env draws it does not hold)."""
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state

    # --- internals ----------------------------------------------------------------------------------
    def _reset_envs(self, idx: np.ndarray) -> None:
        task, k = self.task, len(idx)
        start = task.reset(np, self._rng.random((k, task.reset_dims)))
        u = self._rng.random((k, RANDOMIZATION_DIMS))
        if self.randomization.changes_model:
            fields = sample_model_fields(np, self.randomization, self._nominal, u)
            for j, i in enumerate(idx):
                for name, values in fields.items():
                    getattr(self._models[i], name)[:] = values[j]
        self._latency[idx] = sample_latency(np, self.randomization, u[:, 4])
        self._history[idx] = 0.0
        self._camera_jitter[idx] = self.randomization.camera_pos * (
            2.0 * self._rng.random((k, *self._camera_jitter.shape[1:])) - 1.0
        )
        self._light_scale[idx] = 1.0 + self.randomization.light * (2.0 * self._rng.random(k) - 1.0)
        self._state[idx] = 0.0
        self._state[np.ix_(idx, np.arange(self._qpos.start, self._qpos.stop))] = start.qpos
        self._state[np.ix_(idx, np.arange(self._qvel.start, self._qvel.stop))] = start.qvel
        self._goal[idx] = start.goal
        self._steps[idx] = 0
        self._mocap = task.mocap(np, self._goal)
        for i in idx:  # sensors of the initial state (one mj_forward per reset env)
            mujoco.mj_setState(self._models[i], self._scratch, self._state[i], FULLPHYSICS)
            mujoco.mj_forward(self._models[i], self._scratch)
            self._sens[i] = self._scratch.sensordata

    def _observe(self, idx: np.ndarray | None = None) -> dict[str, Any]:
        obs = dict(self.task.observe(np, self.frame(idx)))
        if self.randomization.obs_noise > 0:
            for key, value in obs.items():
                if value.dtype.kind == "f":
                    obs[key] = (value + self.randomization.obs_noise * self._rng.standard_normal(value.shape)).astype(
                        value.dtype
                    )
        ids = np.arange(self.num_envs) if idx is None else idx
        if self._render_images:
            images = self._render(ids)
            for cam in self.task.cameras:
                obs[f"image_{cam}"] = images[cam]
        instructions = self.task.instruction(self._goal[ids])
        if instructions is not None:
            obs["instruction"] = np.array(instructions, dtype=object)
        return obs

    def _merge(self, obs: dict[str, Any], fresh: dict[str, Any], idx: np.ndarray) -> dict[str, Any]:
        for key, value in fresh.items():
            obs[key][idx] = value
        return obs

    def _renderer_for(self) -> Any:
        if self._renderer is None:
            from robotrl.envs.render import BatchRenderer

            self._renderer = BatchRenderer(self.task.model, self.task.config.image_size)
        return self._renderer

    def _render(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return self._renderer_for().render(
            states=self._state[ids],
            mocap=None if self._mocap is None else (self._mocap[0][ids], self._mocap[1][ids]),
            cameras=self.task.cameras,
            camera_jitter=self._camera_jitter[ids],
            light_scale=self._light_scale[ids],
        )

    def render_env(self, i: int, camera: str | None = None, size: tuple[int, int] = (480, 640)) -> np.ndarray:
        from robotrl.envs.render import render_frame

        mocap = None if self._mocap is None else (self._mocap[0][i], self._mocap[1][i])
        # geometry and looks are the same in every randomized copy: one cached renderer for all envs
        return render_frame(self.task.model, self._state[i], mocap, camera, size)


def _copy(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value
