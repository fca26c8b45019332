"""MJX backend: the same tasks and semantics as the CPU backend, stepped by MuJoCo MJX under jit + vmap.

Two layers:

* a pure functional core (`init`, `step_fn`) over an `MjxState` pytree, jit-able and scan-able, with
  same-step auto-reset inside, so a training loop can keep rollouts (and updates) on the accelerator;
* `MjxVectorEnv`, the gymnasium `VectorEnv` around that core, with the CPU backend's API: action checks,
  `info["final_obs"]`/`info["_final_obs"]`, `info["success"]`, truncation at `episode_steps`, termination
  from `task.terminated` or a non-finite state, dense or sparse reward, domain randomization.

Observations come from the task's `xp` functions with `xp=jax.numpy`. One control step is
`task.n_substeps` `mjx.step` calls with the control from `task.control` held, exactly as the CPU backend's
`rollout` does, so sensordata after a step is that of the last substep and at reset that of `mjx.forward`.

MJX renders no images: image observation keys (`image_<camera>`) are absent from the observations and the
observation space of this backend; only state keys (and the host-side `instruction`) are returned.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import mjx

from robotrl.envs.randomization import (
    RANDOMIZATION_DIMS,
    Randomization,
    delay_actions,
    nominal_fields,
    sample_latency,
    sample_model_fields,
)
from robotrl.envs.task import Frame, Task
from robotrl.envs.vector import RobotVectorEnv, check_actions

FULLPHYSICS = mujoco.mjtState.mjSTATE_FULLPHYSICS


class MjxState(NamedTuple):
    """Everything one batch of envs needs to continue: a pytree of (num_envs, ...) arrays plus one PRNG key."""

    data: mjx.Data  # batched physics state
    goal: jax.Array  # (n, goal_dim) task variables drawn at reset
    steps: jax.Array  # (n,) control steps since the episode's reset
    latency: jax.Array  # (n,) action delay in control steps
    history: jax.Array  # (n, max_latency + 1, action_dim) most recent action first
    fields: dict[str, jax.Array]  # randomized model fields (n, ...); empty without model randomization
    obs: dict[str, jax.Array]  # observations of the current state (after any auto-reset)
    key: jax.Array  # PRNG key for resets and observation noise


_JITS: dict[tuple, dict[str, Any]] = {}


def _compiled(env: MjxVectorEnv) -> dict[str, Any]:
    """Jitted core functions, shared by envs of identical configuration.

    Compiling MJX programs takes tens of seconds on a CPU; a second env with the same task config, size,
    randomization and flags (e.g. the same env with another `output`) reuses the first one's programs,
    which compute exactly the same thing. The cache keeps that first env alive.
    """
    key = (
        type(env.task),
        repr(env.task.config),
        env.num_envs,
        repr(env.randomization),
        env.autoreset,
        env.reward_type,
        str(np.dtype(env.dtype)),
        jax.default_backend(),
    )
    if key not in _JITS:
        _JITS[key] = {"core": jax.jit(env._core), "step": jax.jit(env.step_fn), "init": jax.jit(env.init)}
    return _JITS[key]


class MjxVectorEnv(RobotVectorEnv):
    """A batch of one task's envs on MJX (GPU when JAX has one).

    `output` picks the array type returned by `reset`/`step`: "numpy" (host copies), "torch" (tensors that
    share the JAX buffers through DLPack, no host copy; treat them as read-only) or "jax". `num_threads` and
    `render_workers` are accepted for signature compatibility with the CPU backend and ignored; images are never
    rendered.
    """

    outputs = ("numpy", "torch", "jax")

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
        render_images: bool = False,
        render_workers: int | None = None,
    ) -> None:
        if render_images and task.cameras:
            raise ValueError("render_images: the MJX backend renders no images; use the CPU backend for image keys")
        super().__init__(task, num_envs, randomization, seed, output, autoreset, False, reward_type)

        m = task.model
        self.dtype = jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
        self.model: mjx.Model = mjx.put_model(m, impl="jax")
        self._template = mjx.make_data(self.model, impl="jax")  # one env; broadcast inside jit
        self._nominal = nominal_fields(m)
        self._model_axes: Any = None
        if self.randomization.changes_model:
            axes = jax.tree_util.tree_map(lambda _: None, self.model)
            self._model_axes = axes.tree_replace({k: 0 for k in self._nominal})
        spec = self.task_spec.action
        self._act_low = np.asarray(spec.low_array())
        self._act_high = np.asarray(spec.high_array())
        self._has_instruction = "instruction" in self.task_spec.observations

        self._jits = _compiled(self)
        self._device = jax.devices()[0]
        self._key = jax.random.PRNGKey(
            seed if seed is not None else int(cast(int, np.random.SeedSequence().entropy) % (2**31))
        )
        self._state: MjxState | None = None

    # --- the pure functional core ---------------------------------------------------------------------
    def init(self, key: jax.Array) -> MjxState:
        """A freshly reset batch (all envs) from `key`; jit-able."""
        key, sub = jax.random.split(key)
        return self._fresh(sub)._replace(key=key)

    def step_fn(
        self, state: MjxState, action: jax.Array
    ) -> tuple[MjxState, dict[str, jax.Array], jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        """One control step of every env, with same-step auto-reset; jit-able and scan-able.

        `action` is clipped to the bounds (no NaN check here: that needs the host; `step` does it).
        Returns (state, obs, reward, terminated, truncated, info); info always has "success", "diverged",
        and with auto-reset "final_obs" (observations before the reset) and "_final_obs" (which envs reset).
        """
        return self._core(state, action, None)

    def _core(
        self, state: MjxState, action: jax.Array, force_reset: jax.Array | None
    ) -> tuple[MjxState, dict[str, jax.Array], jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        # `force_reset` (n,) also resets those envs: the gym `reset` reuses this one compiled function
        # instead of compiling a second program with its own mjx.forward (compile time dominates on CPU).
        task = self.task
        action = jnp.clip(action.astype(self.dtype), self._act_low, self._act_high)
        history = state.history
        if self.randomization.max_latency > 0:
            action, history = delay_actions(jnp, history, action, state.latency)
        d = state.data
        ctrl = task.control(jnp, Frame(d.qpos, d.qvel, d.sensordata, state.goal), action)
        d = self._physics(state.fields, d.replace(ctrl=ctrl.astype(d.ctrl.dtype)))
        frame = Frame(d.qpos, d.qvel, d.sensordata, state.goal)
        dense, success = task.reward(jnp, frame, action)
        finite = jnp.isfinite(d.qpos).all(1) & jnp.isfinite(d.qvel).all(1) & jnp.isfinite(d.time)
        if d.act.shape[-1]:
            finite &= jnp.isfinite(d.act).all(1)
        diverged = ~finite
        terminated = jnp.asarray(task.terminated(jnp, frame)) | diverged
        steps = state.steps + 1
        truncated = (steps >= task.config.episode_steps) & ~terminated
        if self.reward_type == "sparse":
            reward = success.astype(self.dtype)
        else:
            reward = jnp.where(diverged, 0.0, dense).astype(self.dtype)
        key, k_noise, k_reset = jax.random.split(state.key, 3)
        obs = self._observe(frame, k_noise)
        new = MjxState(d, state.goal, steps, state.latency, history, state.fields, obs, key)
        info: dict[str, Any] = {"success": success, "diverged": diverged}
        done = None
        if self.autoreset:
            done = terminated | truncated
            info["final_obs"] = obs
            info["_final_obs"] = done
        if force_reset is not None:
            done = force_reset if done is None else done | force_reset
        if done is not None:
            mask = done
            new = jax.lax.cond(mask.any(), lambda s: self._reset_where(s, mask, k_reset), lambda s: s, new)
        return new, new.obs, reward, terminated, truncated, info

    def run_jit(self, name: str, *args: Any) -> Any:
        """Call a compiled core function ("core", "step" or "init") with every argument committed to the device.

        XLA programs are cached per argument placement too: a hand-built (uncommitted) array where the
        last call had a jit output (committed) would compile the whole MJX step again.
        """
        return self._jits[name](*jax.device_put(args, self._device))

    # --- gymnasium API --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        if seed is not None:
            self._key = jax.random.PRNGKey(seed)
        self._key, sub = jax.random.split(self._key)
        if self.autoreset:  # one compiled program for reset and step (see `_core`)
            base = (self._state if self._state is not None else self._nominal_state())._replace(key=sub)
            zero = jnp.zeros((self.num_envs, *self.task_spec.action.shape), self.dtype)
            self._state = self.run_jit("core", base, zero, jnp.ones(self.num_envs, bool))[0]
        else:
            self._state = self.run_jit("init", sub)
        return self._output_obs(self._state.obs, self._state.goal), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("step: call reset() first")
        action = check_actions(actions, self.task_spec.action, self.num_envs)
        goal_before = self._state.goal
        act = jnp.asarray(action, self.dtype)
        if self.autoreset:
            out = self.run_jit("core", self._state, act, jnp.zeros(self.num_envs, bool))
        else:
            out = self.run_jit("step", self._state, act)
        self._state, obs, reward, terminated, truncated, raw = out
        info: dict[str, Any] = {"success": self._out(raw["success"]), "diverged": self._out(raw["diverged"])}
        if self.autoreset:
            done = raw["_final_obs"]
            if bool(np.asarray(done).any()):
                info["final_obs"] = self._output_obs(raw["final_obs"], goal_before)
                info["_final_obs"] = self._out(done)
        return (
            self._output_obs(obs, self._state.goal),
            self._out(reward),
            self._out(terminated),
            self._out(truncated),
            info,
        )

    def close(self, **kwargs: Any) -> None:
        self._state = None

    def render(self) -> np.ndarray:  # type: ignore[override]  # every env's frame in one array (B, H, W, 3)
        raise NotImplementedError(
            "MjxVectorEnv renders no images; render with the CPU backend (same state via get_state)"
        )

    # --- state access (tests, parity with the CPU backend) -----------------------------------------------
    @property
    def state(self) -> MjxState:
        if self._state is None:
            raise RuntimeError("state: call reset() or set_state() first")
        return self._state

    def frame(self) -> Frame:
        d = self.state.data
        return Frame(*(np.asarray(x) for x in (d.qpos, d.qvel, d.sensordata, self.state.goal)))

    def get_state(self) -> dict[str, np.ndarray]:
        """The CPU backend's layout: FULLPHYSICS physics state, sensordata, goal and step counters."""
        m, s = self.task.model, self.state
        scratch = mujoco.MjData(m)
        host = jax.device_get(s.data)
        physics = np.zeros((self.num_envs, mujoco.mj_stateSize(m, FULLPHYSICS)))
        for i in range(self.num_envs):
            scratch.time = float(host.time[i])
            for name in ("qpos", "qvel", "act", "mocap_pos", "mocap_quat"):
                getattr(scratch, name)[:] = np.asarray(getattr(host, name)[i]).reshape(getattr(scratch, name).shape)
            mujoco.mj_getState(m, scratch, physics[i], FULLPHYSICS)
        return {
            "physics": physics,
            "sensordata": np.asarray(host.sensordata, np.float64).copy(),
            "goal": np.asarray(s.goal, np.float64).copy(),
            "steps": np.asarray(s.steps).astype(np.int64),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from a state in the CPU backend's layout (e.g. `CpuVectorEnv.get_state()`).

        Randomized model fields and latencies are kept from the last reset (nominal ones before any reset).
        """
        m, n = self.task.model, self.num_envs
        expected = {
            "physics": (n, mujoco.mj_stateSize(m, FULLPHYSICS)),
            "sensordata": (n, m.nsensordata),
            "goal": (n, self.task.goal_dim),
            "steps": (n,),
        }
        for key, shape in expected.items():
            got = np.shape(state[key])
            if got != shape:
                raise ValueError(f"set_state[{key!r}]: expected shape {shape}, got {got}")
        scratch = mujoco.MjData(m)
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("time", "qpos", "qvel", "act", "mocap_pos", "mocap_quat")}
        for i in range(n):
            mujoco.mj_setState(m, scratch, np.asarray(state["physics"][i], np.float64), FULLPHYSICS)
            for name in cols:
                cols[name].append(np.array(getattr(scratch, name), np.float64))
        f = self.dtype
        data = self._batched_template().replace(
            **{k: jnp.asarray(np.stack(v), f) for k, v in cols.items()},
            sensordata=jnp.asarray(state["sensordata"], f),
        )
        base = self._state if self._state is not None else self._nominal_state()
        goal = jnp.asarray(state["goal"], f)
        mocap = self.task.mocap(jnp, goal)  # not part of FULLPHYSICS: shown where `reset` puts it
        if mocap is not None:
            data = data.replace(mocap_pos=jnp.asarray(mocap[0], f), mocap_quat=jnp.asarray(mocap[1], f))
        steps = jnp.asarray(state["steps"], jnp.int32)
        frame = Frame(data.qpos, data.qvel, data.sensordata, goal)
        obs = dict(self.task.observe(jnp, frame))
        self._state = base._replace(data=data, goal=goal, steps=steps, obs=obs, history=jnp.zeros_like(base.history))

    # --- internals ------------------------------------------------------------------------------------
    def _nominal_state(self) -> MjxState:
        n = self.num_envs
        fields = {}
        if self.randomization.changes_model:
            fields = {k: jnp.broadcast_to(jnp.asarray(v, self.dtype), (n, *v.shape)) for k, v in self._nominal.items()}
        return MjxState(
            data=self._batched_template(),
            goal=jnp.zeros((n, self.task.goal_dim), self.dtype),
            steps=jnp.zeros(n, jnp.int32),
            latency=jnp.zeros(n, jnp.int32),
            history=jnp.zeros((n, self.randomization.max_latency + 1, *self.task_spec.action.shape), self.dtype),
            fields=fields,
            obs=self._zero_obs(),
            key=self._key,
        )

    def _zero_obs(self) -> dict[str, jax.Array]:
        """Zero observations of the right structure, so a hand-built state hits the compiled program."""
        n, m, f = self.num_envs, self.task.model, self.dtype
        frame = Frame(
            jnp.zeros((n, m.nq), f),
            jnp.zeros((n, m.nv), f),
            jnp.zeros((n, m.nsensordata), f),
            jnp.zeros((n, self.task.goal_dim), f),
        )
        shapes = jax.eval_shape(lambda fr: self.task.observe(jnp, fr), frame)
        return {k: jnp.zeros(v.shape, v.dtype) for k, v in shapes.items()}

    def _batched_template(self) -> mjx.Data:
        n = self.num_envs
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), self._template)

    def _physics(self, fields: dict[str, jax.Array], data: mjx.Data) -> mjx.Data:
        """`n_substeps` mjx.step calls per env, each env with its own model fields when randomized."""
        if fields:
            model = self.model.tree_replace(fields)
            step = jax.vmap(mjx.step, in_axes=(self._model_axes, 0))
        else:
            model = self.model
            step = jax.vmap(mjx.step, in_axes=(None, 0))

        def body(d: mjx.Data, _: None) -> tuple[mjx.Data, None]:
            return step(model, d), None

        data, _ = jax.lax.scan(body, data, None, length=self.task.n_substeps)
        return data

    def _forward(self, fields: dict[str, jax.Array], data: mjx.Data) -> mjx.Data:
        if fields:
            return jax.vmap(mjx.forward, in_axes=(self._model_axes, 0))(self.model.tree_replace(fields), data)
        return jax.vmap(mjx.forward, in_axes=(None, 0))(self.model, data)

    def _observe(self, frame: Frame, key: jax.Array) -> dict[str, jax.Array]:
        obs = dict(self.task.observe(jnp, frame))
        noise = self.randomization.obs_noise
        if noise > 0:
            for i, (k, v) in enumerate(sorted(obs.items())):
                if jnp.issubdtype(v.dtype, jnp.floating):
                    draw = jax.random.normal(jax.random.fold_in(key, i), v.shape, self.dtype)
                    obs[k] = (v + noise * draw).astype(v.dtype)
        return obs

    def _fresh(self, key: jax.Array) -> MjxState:
        """A reset of every env (the CPU backend's `_reset_envs` for all indices)."""
        task, n, f = self.task, self.num_envs, self.dtype
        k_task, k_rand, k_noise = jax.random.split(key, 3)
        start = task.reset(jnp, jax.random.uniform(k_task, (n, task.reset_dims), f))
        u = jax.random.uniform(k_rand, (n, RANDOMIZATION_DIMS), f)
        fields: dict[str, jax.Array] = {}
        if self.randomization.changes_model:
            fields = {k: v.astype(f) for k, v in sample_model_fields(jnp, self.randomization, self._nominal, u).items()}
        latency = sample_latency(jnp, self.randomization, u[:, 4])
        goal = jnp.asarray(start.goal, f)
        data = self._batched_template().replace(qpos=jnp.asarray(start.qpos, f), qvel=jnp.asarray(start.qvel, f))
        mocap = task.mocap(jnp, goal)
        if mocap is not None:
            data = data.replace(mocap_pos=jnp.asarray(mocap[0], f), mocap_quat=jnp.asarray(mocap[1], f))
        data = self._forward(fields, data)  # sensors of the initial state
        frame = Frame(data.qpos, data.qvel, data.sensordata, goal)
        return MjxState(
            data=data,
            goal=goal,
            steps=jnp.zeros(n, jnp.int32),
            latency=latency,
            history=jnp.zeros((n, self.randomization.max_latency + 1, *self.task_spec.action.shape), f),
            fields=fields,
            obs=self._observe(frame, k_noise),
            key=key,
        )

    def _reset_where(self, state: MjxState, mask: jax.Array, key: jax.Array) -> MjxState:
        fresh = self._fresh(key)

        def pick(new: jax.Array, old: jax.Array) -> jax.Array:
            m = mask.reshape(mask.shape + (1,) * (jnp.ndim(old) - 1))
            return jnp.where(m, new, old)

        merged = jax.tree_util.tree_map(pick, tuple(fresh)[:-1], tuple(state)[:-1])
        return MjxState(*merged, key=state.key)  # type: ignore[misc]  # merged: every field but the key

    def _out(self, x: jax.Array) -> Any:
        if self.output == "jax":
            return x
        if self.output == "torch":
            import torch

            return torch.from_dlpack(x)
        return np.array(x)  # a writable host copy, like the CPU backend's arrays

    def _output_obs(self, obs: dict[str, jax.Array], goal: jax.Array) -> dict[str, Any]:
        out = {k: self._out(v) for k, v in obs.items()}
        if self._has_instruction:
            out["instruction"] = np.array(self.task.instruction(np.asarray(goal)), dtype=object)
        return out
