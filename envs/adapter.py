"""Outside gymnasium environments behind the robotrl vector-env API.

Learners and evaluators in robotrl are written against `RobotVectorEnv`: dict observations batched over envs,
same-step auto-reset with `info["final_obs"]`, `info["success"]`, a `task_spec`, numpy or torch output and
strict action checks. `GymVectorAdapter` gives any gymnasium env with a Box action space and a Box or Dict
observation space that same surface, so a baseline (Pendulum, gymnasium's MuJoCo suite, ...) runs through the
same code as a robotrl task. Envs are stepped one after another in this process: this is for compatibility,
not speed (the robotrl backends are the fast path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from robotrl.core.spec import STRING, ArraySpec, Spec
from robotrl.envs.vector import check_actions, check_num_envs, check_output, convert_obs, step_output

#: the observation key of an env whose observation space is a plain Box
STATE_KEY = "state"
#: info keys that outside envs use for task success (gymnasium-robotics and SB3 say "is_success")
SUCCESS_KEYS = ("success", "is_success")


def array_spec(space: gym.Space, where: str) -> ArraySpec:
    """The spec of one Box (or Text) space; anything else is an error naming `where`."""
    if isinstance(space, gym.spaces.Text):
        return ArraySpec((), STRING)
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"{where}: expected a gymnasium.spaces.Box, got {space}")
    return ArraySpec(space.shape, np.dtype(space.dtype).name, space.low, space.high)


def spec_from_env(env: gym.Env, name: str) -> Spec:
    """A robotrl `Spec` describing an outside env (action mode 'native': its own action space)."""
    obs_space = env.observation_space
    if isinstance(obs_space, gym.spaces.Dict):
        observations = {k: array_spec(s, f"observation_space[{k!r}]") for k, s in obs_space.spaces.items()}
    else:
        observations = {STATE_KEY: array_spec(obs_space, "observation_space")}
    action = array_spec(env.action_space, "action_space")
    if action.dtype == STRING:
        raise TypeError(f"action_space: expected a gymnasium.spaces.Box, got {env.action_space}")
    fps = env.metadata.get("render_fps") or 0.0
    steps = env.spec.max_episode_steps if env.spec is not None and env.spec.max_episode_steps else 0
    return Spec(
        task=name,
        observations=observations,
        action=action,
        action_mode="native",
        control_hz=float(fps),
        episode_steps=int(steps),
    )


class GymVectorAdapter(gym.vector.VectorEnv):
    """`num_envs` copies of a gymnasium env (an id for `gym.make`, or a factory) with the robotrl vector API."""

    # a mutable class attribute, as gymnasium.Env declares it
    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        num_envs: int = 1,
        seed: int | None = None,
        output: str = "numpy",
        autoreset: bool = True,
        **make_kwargs: Any,
    ) -> None:
        self.num_envs = check_num_envs(num_envs)
        check_output(output)
        if make_kwargs and not isinstance(env, str):
            raise ValueError(f"make_kwargs: only used with an env id, got a factory and {sorted(make_kwargs)}")
        factory = (lambda: gym.make(env, **make_kwargs)) if isinstance(env, str) else env
        self.envs = [factory() for _ in range(self.num_envs)]
        first = self.envs[0]
        name = (
            env
            if isinstance(env, str)
            else (first.spec.id if first.spec is not None else type(first.unwrapped).__name__)
        )
        self.task_spec = spec_from_env(first, name)
        self._dict_obs = isinstance(first.observation_space, gym.spaces.Dict)
        self.single_observation_space = (
            first.observation_space if self._dict_obs else gym.spaces.Dict({STATE_KEY: first.observation_space})
        )
        self.single_action_space = first.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.output, self.autoreset, self._seed = output, autoreset, seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        """Env i is seeded with `seed + i` (or the constructor's seed on the first reset)."""
        seed = seed if seed is not None else self._seed
        self._seed = None
        obs = [
            self._as_dict(e.reset(seed=None if seed is None else seed + i, options=options)[0])
            for i, e in enumerate(self.envs)
        ]
        return convert_obs(self._stack(obs), self.output), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        batch = check_actions(actions, self.task_spec.action, self.num_envs).astype(self.single_action_space.dtype)
        n = self.num_envs
        obs: list[dict[str, Any]] = []
        reward, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        reports_success = False
        final: list[dict[str, Any]] = []
        for i, env in enumerate(self.envs):
            o, r, term, trunc, info = env.step(batch[i])
            reward[i], terminated[i], truncated[i] = float(r), bool(term), bool(trunc)
            key = next((k for k in SUCCESS_KEYS if k in info), None)
            if key is not None:
                reports_success, success[i] = True, bool(info[key])
            final.append(self._as_dict(o))
            if self.autoreset and (term or trunc):
                o, _ = env.reset()
            obs.append(self._as_dict(o))
        out_info: dict[str, Any] = {"success": success} if reports_success else {}
        done = terminated | truncated
        if self.autoreset and done.any():
            out_info["final_obs"] = convert_obs(self._stack(final), self.output)
            out_info["_final_obs"] = done
        return step_output(self.output, self._stack(obs), reward, terminated, truncated, out_info)

    def close(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    def render(self) -> Any:
        return self.envs[0].render()

    # --- internals ----------------------------------------------------------------------------------
    def _as_dict(self, obs: Any) -> dict[str, Any]:
        return dict(obs) if self._dict_obs else {STATE_KEY: obs}

    @staticmethod
    def _stack(obs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            k: np.array([o[k] for o in obs], dtype=object)
            if isinstance(obs[0][k], str)
            else np.stack([np.asarray(o[k]) for o in obs])
            for k in obs[0]
        }
