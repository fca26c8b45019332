"""CPU backend: N simulations of one model in MuJoCo's batch (its C API, robotrl/envs/native_batch.py), stepped on
native threads (the GIL is released).

One control step is one batch call over all envs for `n_substeps` physics steps, so Python runs once per control step
for the whole batch. Around it the step's code (robotrl/envs/step.py: the task's control, observation, reward and
termination with the step's own bookkeeping, written once against an array namespace) is one native call on each
side, compiled by numba on first use (robotrl/envs/compiled.py; `compile_task=False` or ROBOTRL_COMPILE_TASK=0 runs
it as vectorized numpy, as the first reset always does). Compiled, it runs inside the physics call itself by default:
one call on the batch's threads steps each env's code and physics together and starts, in the same call, the next
episode of an env whose episode the step ended (robotrl/envs/fused.py; `fuse_step=False` or ROBOTRL_FUSE_STEP=0
keeps them on the calling thread). So that it can, each env's next episode is drawn when its episode starts (one
generator for the batch, `get_state()["next_draws"]`): the episodes of a seed are the same on every path. Each
simulation keeps its whole integration state between control steps, the solver's warm start included, as one MjData
stepped by a robot's control loop does (hardware/sim_robot.py): nothing is copied in or out of the simulations but
the bound fields.
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from robotrl.envs import compiled
from robotrl.envs.native_batch import NativeBatch
from robotrl.envs.randomization import (
    RANDOMIZATION_DIMS,
    Randomization,
    delay_actions,
    nominal_fields,
    sample_latency,
    sample_model_fields,
)
from robotrl.envs.step import After, NumpyStep
from robotrl.envs.task import Frame, Task
from robotrl.envs.vector import (
    RobotVectorEnv,
    action_array,
    check_actions,
    convert_obs,
    nonfinite_actions,
    step_output,
)

if TYPE_CHECKING:
    from robotrl.envs.fused import FusedStep

FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
INTEGRATION = int(mujoco.mjtState.mjSTATE_INTEGRATION)
#: the environment variable that keeps the step's compiled code on the calling thread ("0") for a process
FUSE_SWITCH = "ROBOTRL_FUSE_STEP"


class CpuVectorEnv(RobotVectorEnv):
    """The threaded CPU backend; `num_threads` defaults to the machine's cores (at most `num_envs`); `compile_task`
    (None: on unless ROBOTRL_COMPILE_TASK=0) steps the task code compiled and `fuse_step` (None: on unless
    ROBOTRL_FUSE_STEP=0) runs it inside the physics call, see the module docstring."""

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
        render_workers: int | None = None,
        compile_task: bool | None = None,
        fuse_step: bool | None = None,
    ) -> None:
        super().__init__(task, num_envs, randomization, seed, output, autoreset, render_images, reward_type)
        m = task.model
        n = self.num_envs
        threads = num_threads if num_threads is not None else min(os.cpu_count() or 1, n)
        if threads < 0:
            raise ValueError(f"num_threads: expected >= 0, got {threads}")
        self._batch: NativeBatch | None = NativeBatch(m, n, max(threads, 1))  # 1: the calling thread only
        self._models = [copy.copy(m) for _ in range(n)] if self.randomization.changes_model else [m] * n
        if self.randomization.changes_model:
            self._batch.set_models(self._models)
        self._nominal = nominal_fields(m)
        # live views of the simulations' state rows (written before a call, read after) and their sensors
        self._qpos, self._qvel = self._batch.bind("qpos"), self._batch.bind("qvel")
        self._ctrl, self._warmstart = self._batch.bind("ctrl"), self._batch.bind("qacc_warmstart")
        self._sensordata = self._batch.bind("sensordata")  # refreshed by every call on a simulation
        #: the state row `Batch.reset` leaves (the model's defaults: at rest, time 0, cold solver), one for every
        #: simulation of the one model: a reset writes it, a copy, where `Batch.reset` would cost a call on the thread
        #: pool. None with per-env models, whose defaults follow their randomized fields
        self._reset_row: np.ndarray | None = None
        if not self.randomization.changes_model:
            self._batch.reset([0], stage=mujoco.mjtStage.mjSTAGE_NONE)
            self._reset_row = self._batch.state[0].copy()
        self._physics_cols = physics_columns(m)
        self._sens = np.zeros((n, m.nsensordata))
        self._goal = np.zeros((n, task.goal_dim))
        self._mocap: tuple[np.ndarray, np.ndarray] | None = None
        self._steps = np.zeros(n, dtype=np.int64)
        self._latency = np.zeros(n, dtype=np.int32)
        self._history = np.zeros((n, self.randomization.max_latency + 1, *self.task_spec.action.shape))
        self._rng = np.random.default_rng(seed)
        self._render_images = render_images and bool(task.cameras)
        self._instructions = task.has_instructions
        self._renderer: Any = None
        #: processes beside this one that draw image observations (robotrl/envs/render_pool.py); None: one per
        #: spare core, when there are envs enough to share
        self._render_workers = render_workers
        self._camera_jitter = np.zeros((n, max(len(task.cameras), 1), 3))
        self._light_scale = np.ones(n)
        parts = ((task.reset_dims,), (RANDOMIZATION_DIMS,), self._camera_jitter.shape[1:], ())
        #: the uniform draws each env's next episode starts from, by part (its start state, randomization, camera
        #: jitter, light): drawn when the episode before it starts, so that an episode that ends inside the physics
        #: call can start its next one there (robotrl/envs/fused.py)
        self._next = tuple(np.zeros((n, *shape)) for shape in parts)
        self._draw_sizes = [math.prod(shape) for shape in parts]  # draws a part takes per env
        self._draw_next(np.arange(n))  # (the first episodes')
        #: set to a dict to add up, per part of `step` ("physics", "task", "render", "bookkeeping"), the seconds it
        #: took: where a step's time goes (bench/envs.py prints it); None (the default) times nothing
        self.step_seconds: dict[str, float] | None = None
        #: the step's code compiled (robotrl/envs/compiled.py), built at the first use after a reset and checked there
        #: against the same code as numpy (`_numpy`), which runs where this is None (off, or not compilable)
        self.compile_task = compiled.enabled_by_default() if compile_task is None else compile_task
        self._compiled: compiled.CompiledStep | None = None
        #: the step's code run beside each env's physics on the batch's threads (robotrl/envs/fused.py), where it is
        #: compiled; None: on unless ROBOTRL_FUSE_STEP=0
        self.fuse_step = os.environ.get(FUSE_SWITCH, "1") != "0" if fuse_step is None else fuse_step
        self._fused: FusedStep | None = None
        self._numpy = NumpyStep(task, self.reward_type)

    # --- gymnasium API -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        every = np.arange(self.num_envs)
        if seed is not None:  # the seed's first episodes; without one, each env's next
            self._rng = np.random.default_rng(seed)
            self._draw_next(every)
        numeric = self._reset_envs(every)
        return convert_obs(self._observe(numeric=numeric), self.output), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        clock = _Clock(self.step_seconds)
        action = action_array(actions, self.task_spec.action, self.num_envs)
        if self.randomization.max_latency > 0:
            checked = check_actions(action, self.task_spec.action, self.num_envs)
            action, self._history = delay_actions(np, self._history, checked, self._latency)
        clock.lap("bookkeeping")
        after = self._advance(action, clock)
        self._steps[:] = after.steps
        done = after.terminated | after.truncated
        idx = np.nonzero(done)[0] if self.autoreset else np.zeros(0, np.intp)
        started = None
        if len(idx) and self._fused is not None and self._fused.resets_in_step:  # their episodes started in the call
            started = self._fused.started(idx)
        obs = self._observe(clock=clock, numeric=after.numeric)
        info: dict[str, Any] = {"success": after.success, "diverged": after.diverged}
        if len(idx):
            info["final_obs"] = convert_obs({k: _copy(v) for k, v in obs.items()}, self.output)
            info["_final_obs"] = done
            fresh = self._reset_envs(idx, started)
            obs = self._merge(obs, self._observe(idx, clock=clock, numeric=fresh), idx)
        out = step_output(self.output, obs, after.reward, after.terminated, after.truncated, info)
        clock.lap("bookkeeping")
        return out

    def _advance(self, action: np.ndarray, clock: _Clock) -> After:
        """One control step of every env's physics with the step's code around it: fused into one call on the pool
        (robotrl/envs/fused.py) where it can be, else the code's two calls on this thread around `step`."""
        code, batch = self._code(), self._live()
        fused = self._fused_step()
        if fused is not None:
            if not np.isfinite(action).all():  # before any physics: nothing steps on a refused action
                raise nonfinite_actions(action)
            after = fused.run(action)  # (the sensors written to their rows in the call)
            clock.lap("physics")  # the step's code runs inside the same call
            return after
        before = code.before(self.frame(), action, batch.warning)
        if not before.finite.all():
            raise nonfinite_actions(action)
        self._ctrl[:] = before.ctrl
        clock.lap("task")
        batch.step(nstep=self.task.n_substeps)
        self._sens[:] = self._sensordata  # as after mj_step: computed at the last substep's start
        clock.lap("physics")
        # MuJoCo resets a simulation that blows up and warns: the episode ends there, as it would on a NaN
        after = code.after(self.frame(), before.action, batch.state, batch.warning, before.blowups, self._steps)
        clock.lap("task")
        return after

    def _fused_step(self) -> FusedStep | None:
        """The fused step, built on first use where the step's code is compiled and `fuse_step` is on."""
        if self._fused is None and self.fuse_step and self._compiled is not None:
            arrays = {"sensordata": self._sens, "goal": self._goal, "steps": self._steps, "draws": self._next[0]}
            try:
                from robotrl.envs.fused import FusedStep  # numba's compiler and MuJoCo's symbols: loaded on first use

                self._fused = FusedStep(self.task, self.reward_type, self._compiled.bounds, self._live(), arrays)
                # an episode that ends starts its next in the same call, where nothing of the reset needs this thread
                # between (per-env models set, the final observation's images and instructions drawn from its state)
                self._fused.resets_in_step = (
                    self._fused.resets
                    and self.autoreset
                    and not self.randomization.changes_model
                    and not self._render_images
                    and not self._instructions
                )
            except Exception as err:  # noqa: BLE001  # any failure to build it leaves the step's code on this thread
                reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
                warnings.warn(
                    f"{self.task.name}: step not fused ({type(err).__name__}: {reason}); its compiled code runs on "
                    "the calling thread",
                    stacklevel=3,
                )
                self.fuse_step = False
        return self._fused if self.fuse_step else None

    def close(self, **kwargs: Any) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._batch = self._fused = None  # its threads end with it

    def render(self) -> np.ndarray:  # type: ignore[override]  # every env's frame in one array (B, H, W, 3)
        """RGB frame of env 0 from the task's first camera (or a free camera), for videos."""
        return self.render_env(0)

    # --- state access (also used by tests, experts and the recorder) --------------------------------
    def frame(self, idx: np.ndarray | None = None) -> Frame:
        sl = slice(None) if idx is None else idx
        return Frame(self._qpos[sl], self._qvel[sl], self._sens[sl], self._goal[sl])

    def get_state(self) -> dict[str, np.ndarray]:
        """Physics state (FULLPHYSICS layout, as the MJX backend's), the solver's warm start, sensors, goals, step
        counters and the draws the next episodes start from: with `get_rng_state`, enough to restore exactly."""
        return {
            "physics": self._physics(),
            "warmstart": self._warmstart.copy(),
            "sensordata": self._sens.copy(),
            "goal": self._goal.copy(),
            "steps": self._steps.copy(),
            "next_draws": np.concatenate([part.reshape(self.num_envs, -1) for part in self._next], axis=1),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from `get_state` of this backend or the MJX one (whose state has no warm start: it starts cold; nor
        next draws: the next episodes keep this env's)."""
        n = self.num_envs
        physics, warmstart = np.zeros((n, len(self._physics_cols))), np.zeros_like(self._warmstart)
        checked = [("physics", physics), ("sensordata", self._sens), ("goal", self._goal), ("steps", self._steps)]
        if "warmstart" in state:
            checked.append(("warmstart", warmstart))
        draws = np.zeros((n, sum(self._draw_sizes)))
        if "next_draws" in state:
            checked.append(("next_draws", draws))
        for key, dst in checked:
            if np.shape(state[key]) != dst.shape:
                raise ValueError(f"set_state[{key!r}]: expected shape {dst.shape}, got {np.shape(state[key])}")
        for key, dst in checked:
            dst[:] = np.asarray(state[key])
        self._live().state[:, self._physics_cols] = physics
        self._warmstart[:] = warmstart
        if "next_draws" in state:
            at = 0
            for part, size in zip(self._next, self._draw_sizes, strict=True):  # (in place: the fused step reads one)
                part[:] = draws[:, at : at + size].reshape(part.shape)
                at += size
        self._mocap = self.task.mocap(np, self._goal)

    def get_rng_state(self) -> dict[str, Any]:
        """The state of the stream that draws reset states: with `get_state`, what an RL run's checkpoint needs
        to continue exactly mid-episode (without domain randomization, whose per-env draws it does not hold)."""
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state

    # --- internals ----------------------------------------------------------------------------------
    def _reset_envs(
        self, idx: np.ndarray, started: dict[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray] | None:
        """Start new episodes in envs `idx` from their held draws, and draw their next; return their numeric
        observations where the reset computed them (fused), else None. `started`: the observations of episodes the
        physics call started already (`FusedStep.resets_in_step`), whose simulations, goals and sensors are set."""
        task, rz = self.task, self.randomization
        draws, u, jitter, light = self._next  # (each env's row of each: the draws its episode starts from)
        batch = self._live()
        if rz.changes_model:
            fields = sample_model_fields(np, rz, self._nominal, u[idx])
            for j, i in enumerate(idx):
                for name, values in fields.items():
                    getattr(self._models[i], name)[:] = values[j]
            batch.set_models(self._models)
        if rz.max_latency > 0:  # (u is drawn either way: the stream of reset states stays one)
            self._latency[idx] = sample_latency(np, rz, u[idx, 4])
            self._history[idx] = 0.0
        if rz.camera_pos > 0:  # (off, the jitter stays zero and the scale one)
            self._camera_jitter[idx] = rz.camera_pos * (2.0 * jitter[idx] - 1.0)
        if rz.light > 0:
            self._light_scale[idx] = 1.0 + rz.light * (2.0 * light[idx] - 1.0)
        fused = self._fused_step()  # (None at the first reset: nothing is compiled yet)
        numeric = started
        if started is None and fused is not None and fused.resets:  # one pool call: defaults, start, sensors, obs
            numeric = fused.reset(idx)  # (from the draws' rows)
        elif started is None:
            self._start(idx, draws[idx])
        self._draw_next(idx)
        self._steps[idx] = 0
        if self._mocap is None or len(idx) == self.num_envs:
            self._mocap = task.mocap(np, self._goal)
        else:  # only the reset envs' goals moved
            self._mocap[0][idx], self._mocap[1][idx] = task.mocap(np, self._goal[idx])  # type: ignore[misc]
        return numeric

    def _start(self, idx: np.ndarray, draws: np.ndarray) -> None:
        """The reset on this thread: the simulations at the model's defaults, the task's start state from `draws`
        (the step's compiled code, else numpy), its sensors and goals."""
        start = (self._compiled if self._compiled is not None else self._numpy).reset(draws)
        batch = self._live()
        if self._reset_row is None:
            batch.reset(idx, stage=mujoco.mjtStage.mjSTAGE_NONE)  # the model's defaults: at rest, time 0, cold solver
        else:
            batch.state[idx] = self._reset_row  # the same row, written without a call (tests/envs/test_cpu.py)
        self._qpos[idx] = start.qpos
        self._qvel[idx] = start.qvel
        batch.forward(idx)  # the sensors of the initial state
        self._sens[idx] = self._sensordata[idx]
        self._goal[idx] = start.goal

    def _draw_next(self, idx: np.ndarray) -> None:
        """Draw the next episodes' uniform draws of envs `idx`: one call to the generator, whose stream is the same as
        one call per part in turn; every part is drawn whether its randomization is on or not, so that the reset
        states of a seed do not depend on it."""
        k = len(idx)
        flat = self._rng.random(k * sum(self._draw_sizes))
        at = 0
        for part, size in zip(self._next, self._draw_sizes, strict=True):
            part[idx] = flat[at : at + k * size].reshape(k, *part.shape[1:])
            at += k * size

    def _observe(
        self, idx: np.ndarray | None = None, clock: _Clock | None = None, numeric: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The envs' observations (all, or `idx`): the task's `numeric` ones where the step computed them already,
        noise, images and instructions added."""
        clock = clock if clock is not None else _Clock(None)
        if numeric is None:
            clock.lap("bookkeeping")
            numeric = self._code().observe(self.frame(idx))
            clock.lap("task")
        obs = dict(numeric)
        if self.randomization.obs_noise > 0:
            for key, value in obs.items():
                if value.dtype.kind == "f":
                    obs[key] = (value + self.randomization.obs_noise * self._rng.standard_normal(value.shape)).astype(
                        value.dtype
                    )
        if not (self._render_images or self._instructions):
            return obs
        ids = np.arange(self.num_envs) if idx is None else idx
        if self._render_images:
            clock.lap("bookkeeping")
            images = self._render(ids)
            for cam in self.task.cameras:
                obs[f"image_{cam}"] = images[cam]
            clock.lap("render")
        if self._instructions:
            obs["instruction"] = np.array(self.task.instruction(self._goal[ids]), dtype=object)
        return obs

    def _code(self) -> NumpyStep | compiled.CompiledStep:
        """The step's code: compiled on first use (after the first reset: it is checked on a real state), else numpy."""
        if self.compile_task and self._compiled is None:
            batch = self._live()
            action = np.zeros((self.num_envs, *self.task_spec.action.shape))
            example = compiled.StepArrays(self.frame(), action, batch.state, batch.warning)
            self._compiled = compiled.compile_task(self.task, self.reward_type, example)
            self.compile_task = self._compiled is not None  # not compilable: the numpy code, without asking again
        return self._compiled if self._compiled is not None else self._numpy

    def _merge(self, obs: dict[str, Any], fresh: dict[str, Any], idx: np.ndarray) -> dict[str, Any]:
        for key, value in fresh.items():
            obs[key][idx] = value
        return obs

    @property
    def render_workers(self) -> int:
        """The processes beside this one that draw the image observations."""
        from robotrl.envs.render_pool import default_workers

        return default_workers(self.num_envs) if self._render_workers is None else self._render_workers

    def _renderer_for(self) -> Any:
        if self._renderer is None:
            from robotrl.envs.render_pool import RenderPool

            self._renderer = RenderPool(self.task.model, self.task.config.image_size, self.render_workers)
        return self._renderer

    def _render(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return self._renderer_for().render(
            states=self._physics(ids),
            mocap=None if self._mocap is None else (self._mocap[0][ids], self._mocap[1][ids]),
            cameras=self.task.cameras,
            camera_jitter=self._camera_jitter[ids],
            light_scale=self._light_scale[ids],
        )

    def render_env(self, i: int, camera: str | None = None, size: tuple[int, int] = (480, 640)) -> np.ndarray:
        from robotrl.envs.render import render_frame

        mocap = None if self._mocap is None else (self._mocap[0][i], self._mocap[1][i])
        # geometry and looks are the same in every randomized copy: one cached renderer for all envs
        return render_frame(self.task.model, self._live().state[i, self._physics_cols], mocap, camera, size)

    def _physics(self, idx: np.ndarray | None = None) -> np.ndarray:
        """The simulations' states (n, nstate) in the FULLPHYSICS layout."""
        rows = self._live().state
        return rows[:, self._physics_cols] if idx is None else rows[np.ix_(idx, self._physics_cols)]

    def _live(self) -> NativeBatch:
        if self._batch is None:
            raise RuntimeError("CpuVectorEnv: the env is closed")
        return self._batch


def physics_columns(model: mujoco.MjModel) -> np.ndarray:
    """Where each entry of a FULLPHYSICS state sits in a `Batch`'s (mjSTATE_INTEGRATION) state row: the row of
    entry numbers, set and read back through MuJoCo's own state functions."""
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, np.arange(mujoco.mj_stateSize(model, INTEGRATION), dtype=np.float64), INTEGRATION)
    out = np.zeros(mujoco.mj_stateSize(model, FULLPHYSICS))
    mujoco.mj_getState(model, data, out, FULLPHYSICS)
    return out.astype(np.int64)


class _Clock:
    """Adds the seconds since its last lap to a part of `seconds` (nothing when `seconds` is None)."""

    def __init__(self, seconds: dict[str, float] | None) -> None:
        self.seconds = seconds
        self.last = time.perf_counter() if seconds is not None else 0.0

    def lap(self, part: str) -> None:
        if self.seconds is not None:
            now = time.perf_counter()
            self.seconds[part] = self.seconds.get(part, 0.0) + now - self.last
            self.last = now


def _copy(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value
