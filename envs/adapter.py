"""Outside gymnasium environments behind the robotrl vector-env API.

Learners and evaluators in robotrl are written against `RobotVectorEnv`: dict observations batched over envs,
same-step auto-reset with `info["final_obs"]`, `info["success"]`, a `task_spec`, numpy or torch output and
strict action checks. `GymVectorAdapter` gives any gymnasium env with a Box action space and a Box or Dict
observation space that same surface, so an outside env (gymnasium's MuJoCo suite, a user's own robot env, ...)
runs through the same code as a robotrl task. `robotrl.envs.make("gym:<id>")` and `make("<module>:<callable>")`
build one (`robotrl.envs.outside`). Envs are stepped one after another in this process: this is for
compatibility, not speed (the robotrl backends are the fast path).

Seeds. Env i of a reset with seed s starts from `reset(seed=s + i)`. An env whose first observation does not
follow that seed is rebuilt for each seeded reset with Python's and NumPy's global generators seeded (and put
back afterwards): envs that draw from those become seed-exact too. An env that neither reset nor that makes
repeatable is named once in a warning, and its spec records `metadata["seeding"] = "none"`.

Success. An env that reports `info["success"]` or `info["is_success"]` (gymnasium-robotics, SB3) has its success
counted; one that reports neither (gymnasium's MuJoCo suite) has `metadata["success"] = False` in its spec, and
every stage reports its return in place of a success rate. The adapter still fills `info["success"]` (all False),
so the code that reads it runs unchanged.

State. An outside env's simulator state is not saved with a run's train state: a run on one refuses `--resume`
with one line (`set_state`).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from robotrl.core.spec import STRING, ArraySpec, Spec
from robotrl.envs.outside import GYM_PREFIX, OutsideEnv, is_outside, parse
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


def spec_from_env(env: gym.Env, name: str, episode_steps: int | None = None) -> Spec:
    """A robotrl `Spec` describing an outside env (action mode 'native': its own action space), named `name` (what
    `robotrl.envs.make` takes to build it again)."""
    obs_space = env.observation_space
    if isinstance(obs_space, gym.spaces.Dict):
        observations = {k: array_spec(s, f"observation_space[{k!r}]") for k, s in obs_space.spaces.items()}
    else:
        observations = {STATE_KEY: array_spec(obs_space, "observation_space")}
    action = array_spec(env.action_space, "action_space")
    if action.dtype == STRING:
        raise TypeError(f"action_space: expected a gymnasium.spaces.Box, got {env.action_space}")
    fps = env.metadata.get("render_fps") or 0.0
    steps = episode_steps or time_limit(env) or 0
    return Spec(
        task=name,
        observations=observations,
        action=action,
        action_mode="native",
        control_hz=float(fps),
        episode_steps=int(steps),
    )


def time_limit(env: gym.Env) -> int | None:
    """The episode cap of an env: its outermost `TimeLimit` wrapper's (a factory's own), else its registration's."""
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, gym.wrappers.TimeLimit):
            return int(layer._max_episode_steps)
        layer = layer.env
    return env.spec.max_episode_steps if env.spec is not None else None


class GymVectorAdapter(gym.vector.VectorEnv):
    """`num_envs` copies of a gymnasium env with the robotrl vector API.

    `env` is an outside-env name (`gym:<id>`, `<module>:<callable>`, with `?key=value` arguments), a plain gymnasium
    id, or a zero-argument factory (then `name` is what its spec records; default: the factory's import path, or
    its gymnasium id). `env_kwargs` go to the env's constructor (an env's own `seed` keyword included); `episode_steps`
    caps its episodes (gymnasium's `max_episode_steps`)."""

    # a mutable class attribute, as gymnasium.Env declares it
    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012

    def __init__(
        self,
        env: str | OutsideEnv | Callable[[], gym.Env],
        num_envs: int = 1,
        seed: int | None = None,
        output: str = "numpy",
        autoreset: bool = True,
        *,
        name: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        episode_steps: int | None = None,
    ) -> None:
        self.num_envs = check_num_envs(num_envs)
        check_output(output)
        if episode_steps is not None and (isinstance(episode_steps, bool) or episode_steps < 1):
            raise ValueError(f"episode_steps: expected a positive integer or None, got {episode_steps!r}")
        self._factory, name = _factory(env, name, env_kwargs or {}, episode_steps)
        self.envs = [self._factory() for _ in range(self.num_envs)]
        first = self.envs[0]
        self._dict_obs = isinstance(first.observation_space, gym.spaces.Dict)
        self.single_observation_space = (
            first.observation_space if self._dict_obs else gym.spaces.Dict({STATE_KEY: first.observation_space})
        )
        self.single_action_space = first.action_space
        spec = spec_from_env(first, name, episode_steps)  # checks the spaces before anything steps the env
        self.seeding = self._probe_seeding()
        if self.seeding == "none":
            warnings.warn(
                f"{name}: its first observation does not follow reset(seed=...), even when rebuilt with the global "
                "generators seeded: its episodes are not reproducible",
                stacklevel=2,
            )
        self.reports_success = self._probe_success(spec.action)
        self.task_spec = dataclasses.replace(spec, metadata={"seeding": self.seeding, "success": self.reports_success})
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.output, self.autoreset, self._seed = output, autoreset, seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        """Env i is seeded with `seed + i` (or the constructor's seed on the first reset)."""
        seed = seed if seed is not None else self._seed
        self._seed = None
        obs = [self._as_dict(self._reset_one(i, seed, options)) for i in range(self.num_envs)]
        return convert_obs(self._stack(obs), self.output), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        batch = check_actions(actions, self.task_spec.action, self.num_envs).astype(self.single_action_space.dtype)
        n = self.num_envs
        obs: list[dict[str, Any]] = []
        reward, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        final: list[dict[str, Any]] = []
        for i, env in enumerate(self.envs):
            o, r, term, trunc, info = env.step(batch[i])
            reward[i], terminated[i], truncated[i] = float(r), bool(term), bool(trunc)
            success[i] = bool(next((info[k] for k in SUCCESS_KEYS if k in info), False))
            final.append(self._as_dict(o))
            if self.autoreset and (term or trunc):
                o, _ = env.reset()
            obs.append(self._as_dict(o))
        out_info: dict[str, Any] = {"success": success}
        done = terminated | truncated
        if self.autoreset and done.any():
            out_info["final_obs"] = convert_obs(self._stack(final), self.output)
            out_info["_final_obs"] = done
        return step_output(self.output, self._stack(obs), reward, terminated, truncated, out_info)

    def get_state(self) -> dict[str, np.ndarray]:
        """Nothing: an outside env's simulator state is its own (a train state records none; resume refuses)."""
        return {}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        raise ValueError(
            f"resume: {self.task_spec.task} cannot restore its simulator state, so this run cannot continue exactly; "
            "start a new run (--init from its weights where the command takes one)"
        )

    def get_rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.set_state({})

    def close(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    def render(self) -> Any:
        return self.envs[0].render()

    # --- internals ----------------------------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> Any:
        if seed is None or self.seeding == "reset":
            return self.envs[i].reset(seed=None if seed is None else seed + i, options=options)[0]
        self.envs[i].close()
        with global_generators(seed + i):
            self.envs[i] = self._factory()
            return self.envs[i].reset(seed=seed + i, options=options)[0]

    def _probe_seeding(self) -> str:
        """'reset' when reset(seed) fixes the first observation; 'fresh' when a rebuilt env with the global
        generators seeded does; 'none' otherwise."""
        env = self.envs[0]
        first = [self._as_dict(env.reset(seed=12_345)[0]) for _ in range(2)]
        if _same(*first):
            return "reset"
        fresh = []
        for _ in range(2):
            with global_generators(12_345):
                probe = self._factory()
                fresh.append(self._as_dict(probe.reset(seed=12_345)[0]))
            probe.close()
        return "fresh" if _same(*fresh) else "none"

    def _probe_success(self, action: ArraySpec) -> bool:
        """Whether the env reports success: in its reset info, or its info after one step at the action bounds'
        middle (on env 0; the adapter's own reset starts every episode afresh)."""
        env = self.envs[0]
        _, info = env.reset(seed=0)
        if any(k in info for k in SUCCESS_KEYS):
            return True
        info = env.step(action.middle().astype(np.dtype(action.dtype)))[4]
        return any(k in info for k in SUCCESS_KEYS)

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


def make_outside(
    task: str,
    num_envs: int = 1,
    backend: str = "cpu",
    randomization: Any = None,
    seed: int | None = None,
    **options: Any,
) -> GymVectorAdapter:
    """`robotrl.envs.make` for an outside env, its options checked by `outside_options`."""
    options = outside_options(task, backend, randomization, **options)
    return GymVectorAdapter(
        parse(task),
        num_envs,
        seed,
        output=options.get("output", "numpy"),
        autoreset=options.get("autoreset", True),
        episode_steps=options.get("episode_steps") or None,
    )


def outside_options(task: str, backend: str = "cpu", randomization: Any = None, **options: Any) -> dict[str, Any]:
    """The options robotrl's stages pass that have a meaning for an outside env (`output`, `autoreset`,
    `episode_steps`, `action_mode` 'native', dense reward, no rendering), returned; any other is a one-line error
    naming it. Nothing is built."""
    if backend != "cpu":
        raise ValueError(f"backend: an outside env ({task}) runs on 'cpu' only, got {backend!r}")
    if randomization is not None:
        raise ValueError(
            f"randomization: {task} has no robotrl domain randomization; expected None, got {randomization!r}"
        )
    expected = {"action_mode": (None, "native"), "reward_type": (None, "dense"), "render_images": (None, False)}
    for key, allowed in expected.items():
        if options.get(key) not in allowed:
            raise ValueError(f"{key}: {task} is an outside env; expected {allowed[-1]!r}, got {options[key]!r}")
    options.pop("num_threads", None)
    unknown = set(options) - {"output", "autoreset", "episode_steps"} - set(expected)
    if unknown:
        raise ValueError(
            f"{task}: option(s) {sorted(unknown)} are robotrl task options; an outside env takes its own keyword "
            f"arguments in its name ('{task}?key=value')"
        )
    return options


@contextmanager
def global_generators(seed: int) -> Iterator[None]:
    """Python's and NumPy's global generators seeded for the block, and put back as they were after it."""
    py, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)


def _factory(
    env: str | OutsideEnv | Callable[[], gym.Env],
    name: str | None,
    env_kwargs: dict[str, Any],
    episode_steps: int | None,
) -> tuple[Callable[[], gym.Env], str]:
    """The zero-argument factory of one env and the name its spec records."""
    if isinstance(env, str):
        env = parse(env if is_outside(env) else GYM_PREFIX + env)
    if isinstance(env, OutsideEnv):
        ref = OutsideEnv(env.target, {**env.kwargs, **env_kwargs})
        if episode_steps is None:
            return ref.factory(), name or ref.name
        if ref.is_gym:
            return ref.factory(max_episode_steps=episode_steps), name or ref.name
        make = ref.factory()
        return (lambda: gym.wrappers.TimeLimit(make(), episode_steps)), name or ref.name
    if env_kwargs:
        raise ValueError(f"env_kwargs: only used with an env name, got a factory and {sorted(env_kwargs)}")
    factory = env
    if episode_steps is not None:
        factory = lambda: gym.wrappers.TimeLimit(env(), episode_steps)  # noqa: E731
    return factory, name or _factory_name(env)


def _factory_name(factory: Callable[[], gym.Env]) -> str:
    qualname = getattr(factory, "__qualname__", "")
    module = inspect.getmodule(factory)
    if module is not None and qualname and "<" not in qualname:
        return f"{module.__name__}:{qualname}"
    probe = factory()
    env_id = probe.spec.id if probe.spec is not None else None
    probe.close()
    return GYM_PREFIX + env_id if env_id else type(probe.unwrapped).__name__


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
