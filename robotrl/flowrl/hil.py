"""Human-in-the-loop online RL of a flow policy (HIL-SERL's interventions on robotrl/flowrl/online.py's PPO).

    robotrl train hil --policy runs/bc-flow/policy --num-envs 32 --total-steps 300000            # simulated operator
    robotrl train hil --policy runs/bc-flow/policy --operator keyboard --num-envs 1 --out data/hil.zarr
    result = robotrl.flowrl.hil.train(HilConfig(policy=Path("runs/bc-flow/policy")))         # the same dataclass

The policy acts as in `robotrl train online` (decisions are action chunks drawn by the stochastic denoising chain),
and an operator watches and may take over any env:

- `--operator expert` (default; tests and benches): the task's scripted expert (teleop noise `--operator-noise`)
  stands in for the human. Its criterion: when a new chunk starts, the RMS distance between the chunk's first
  action and the expert's own action for the same observation, in normalized action units (the policy's
  normalizer), is compared with `--stray-threshold`; after `--stray-patience` consecutive decisions over it the
  expert takes the env over for `--takeover-steps` env steps, acting step by step, then hands back. A new episode
  starts with the policy in control. As the policy learns to act like the expert, it strays less: the
  intervention rate (the fraction of env steps under the operator's control) falls.
- `--operator module:callable` (an outside env's, which has no scripted expert): the user's demonstrator, as
  `robotrl data record --demonstrator` takes it, in the expert's place and by the same criterion.
- `--operator keyboard|gamepad|spacemouse|scripted`: a teleop device of robotrl.datasets.teleop driving one env
  (`--num-envs 1`), paced at the control rate when a person drives. The operator drives while the device's
  take-over toggle is on (keyboard I, gamepad X, a ScriptedDevice's `interventions` step ranges), its commands
  mapped onto the task's action by `command_to_action`; Esc / Ctrl-C stops the run (`--resume` continues it).

Learning. The operator's steps go to both buffers, as HIL-SERL has it, adapted to an on-policy flow learner: in
the online buffer (the rollout) they are decisions of their own whose rewards count in the returns and advantages
(GAE runs over every decision) and which train the value, but they are kept out of PPO's ratio (their actions were
not drawn from the chain); and in the demo buffer, each contiguous stretch of operator steps is a demonstration
whose windows (observation history, action chunk) train the policy by its own flow-matching BC loss, weighted by
`--bc-loss-coef`, in every PPO minibatch (with `--demos`, a store's episodes seed that buffer).

Recording. Every env step, the policy's and the operator's, goes to the episode store `--out` (default
`run_dir/hil.zarr`, created with the env's spec; an existing store with the same spec is appended to) as it
happens: one episode per env episode, committed when it ends (a killed run loses at most the unfinished ones),
with the `intervention` mask set on the operator's steps, as teleop recording marks them, and source
'intervention' for episodes in which the operator drove (else 'policy'). The store is an ordinary dataset
(`robotrl train bc --store`). The result is an ordinary flow checkpoint (`run_dir/policy`); the intervention rate of
every iteration is logged to metrics.jsonl, and the result reports the first and the last. A killed run resumes
exactly with the simulated operator (`--resume`: the store is cut back to the last train state's episodes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm import tqdm

from robotrl.core.spec import STRING
from robotrl.datasets import EpisodeStore
from robotrl.datasets.collect import RateLimiter
from robotrl.datasets.record import load_demonstrator
from robotrl.datasets.sampler import MixedSampler, SequenceConfig, SequenceSampler
from robotrl.datasets.teleop import DEVICES, TeleopDevice, action_axes, command_to_action, make_device
from robotrl.envs.task import Expert, TeleopNoise
from robotrl.flowrl.chain import HEADS, finish_policy_run
from robotrl.flowrl.online import OnlineConfig, collect, ppo_update, start_online
from robotrl.training.loop import BestCheckpoint, RLResult, RunLog, TrainClock, load_run_state, save_run_state

OPERATORS = ("expert", *DEVICES)


@dataclass
class HilConfig(OnlineConfig):
    """Online RL of a flow policy with an operator who takes over when it strays (HIL-SERL); every step recorded."""

    method: Literal["denoising_mdp", "flow_sde", "flow_noise", "ode_noise"] = "flow_sde"
    """how the chain is made stochastic (robotrl/flowrl/online.py): a chain method, since the operator's interventions
    train the flow network"""
    lr: float = 3e-4
    """the flow policy's learning rate, for PPO and the BC loss together (online's 3e-5 is for PPO alone: with it
    the intervention rate on Reach fell far less than with 3e-4; bench/RESULTS.md, "Measurements behind the code's
    design")"""
    operator: str = "expert"
    """who may take over: 'expert' (the task's scripted expert, by the stray criterion), a demonstrator
    `module:callable` (an outside env's, in the expert's place) or a teleop device (keyboard, gamepad, spacemouse,
    scripted: its take-over toggle decides; one env)"""
    operator_noise: float = 0.0
    """the expert's (and the scripted device's) teleop noise when it drives"""
    criterion: Literal["stray", "stall"] = "stray"
    """expert: when it takes over. stray: the policy's actions leave the expert's (on PushT, where the expert pushes
    one way and the policy may push another, it drives a large share of the steps; bench/RESULTS.md, "The operator
    from a strong BC policy"); stall: the episode's reward has not risen for `stall_steps` steps, as a person steps
    in when a robot is stuck rather than when it acts otherwise"""
    stray_threshold: float = 0.5
    """expert, stray: RMS distance between a new chunk's first action and the expert's, normalized action units,
    above which the decision strays"""
    stray_patience: int = 2
    """expert, stray: consecutive straying decisions of an env before the expert takes it over"""
    stall_steps: int = 100
    """expert, stall: env steps without progress after which the expert takes over"""
    stall_margin: float = 0.01
    """expert, stall: how far a step's reward must rise above its level at the last progress to count as progress"""
    takeover_steps: int = 16
    """expert: env steps it drives once it has taken over (fewer if the episode ends)"""
    bc_loss_coef: float = 1.0
    """weight of the flow-matching BC loss on the demo buffer (the operator's interventions) in every minibatch"""
    bc_batch_size: int = 64
    """demo windows per minibatch"""
    operator_fraction: float = 0.0
    """share of each BC minibatch drawn from the operator's stretches once there are any, the rest from the seeded
    demos (`demos`), as HIL-SERL and RLPD sample their buffers in fixed shares; 0: every window alike (on PushT the
    seeded demos far outnumber the stall criterion's stretches; bench/RESULTS.md, "Measurements behind the code's
    design")"""
    out: Path | None = None
    """the episode store every step is recorded to (default: run_dir/hil.zarr); created with the env's spec, or
    appended to when its spec matches"""
    demos: Path | None = None
    """a store whose episodes seed the demo buffer (e.g. the BC demonstrations); default: interventions only"""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.operator not in OPERATORS and not self.demonstrator:
            raise ValueError(
                f"{name}.operator: expected one of {OPERATORS} or a demonstrator module:callable, got {self.operator!r}"
            )
        if self.demonstrator and self.operator_noise > 0:
            raise ValueError(
                f"{name}.operator_noise: applies to the task's scripted expert, not to the demonstrator "
                f"{self.operator}; expected 0, got {self.operator_noise}"
            )
        if self.method in HEADS:
            raise ValueError(
                f"{name}.method: {self.method!r} freezes the flow network, which the operator's "
                "interventions train by BC here; expected one of the chain methods (flow_sde, "
                "flow_noise, denoising_mdp, ode_noise)"
            )
        if self.operator in DEVICES and self.num_envs != 1:
            raise ValueError(
                f"{name}.num_envs: expected 1 when a teleop device drives (operator="
                f"{self.operator!r}), got {self.num_envs}"
            )
        if self.criterion not in ("stray", "stall"):
            raise ValueError(f"{name}.criterion: expected 'stray' or 'stall', got {self.criterion!r}")
        for f in ("stray_patience", "takeover_steps", "bc_batch_size", "stall_steps"):
            if getattr(self, f) < 1:
                raise ValueError(f"{name}.{f}: expected >= 1, got {getattr(self, f)}")
        if not self.stray_threshold > 0:
            raise ValueError(f"{name}.stray_threshold: expected > 0, got {self.stray_threshold}")
        for f in ("operator_noise", "bc_loss_coef", "stall_margin"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{name}.{f}: expected >= 0, got {getattr(self, f)}")
        if not 0.0 <= self.operator_fraction <= 1.0:
            raise ValueError(f"{name}.operator_fraction: expected a share in [0, 1], got {self.operator_fraction}")
        self.out = None if self.out is None else Path(self.out)
        self.demos = None if self.demos is None else Path(self.demos)

    @property
    def demonstrator(self) -> bool:
        """Whether `operator` names a demonstrator (module:callable) rather than the expert or a device."""
        return ":" in self.operator


@dataclass
class HilResult(RLResult):
    """An online run's result, plus the store it recorded and the intervention rate of every iteration."""

    store: Path | None = None
    intervention_rates: list[float] = field(default_factory=list)

    @property
    def first_intervention_rate(self) -> float:
        return self.intervention_rates[0] if self.intervention_rates else 0.0

    @property
    def last_intervention_rate(self) -> float:
        return self.intervention_rates[-1] if self.intervention_rates else 0.0

    def summary(self, name: str, episodes: int, unit: str = "env steps") -> str:
        return (
            f"{super().summary(name, episodes, unit)}; intervention rate {self.first_intervention_rate:.1%} -> "
            f"{self.last_intervention_rate:.1%}; every step recorded to {self.store}"
        )


# ---------------------------------------------------------------------------------------------------
# the demo buffer and the recording
# ---------------------------------------------------------------------------------------------------
def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of every run of consecutive true values."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.nonzero(edges == 1)[0].tolist(), np.nonzero(edges == -1)[0].tolist()))


class DemoBuffer:
    """HIL-SERL's demo buffer for a flow policy: every stretch the operator drove (consecutive intervention steps)
    is a demonstration episode of its own, so its windows' action chunks hold operator actions only (padded at the
    hand-back, as at an episode's end); `add` with every step selected and `operator=False` takes a whole seeded
    episode (`--demos`)."""

    def __init__(self, obs_keys: tuple[str, ...], text_keys: tuple[str, ...], window: SequenceConfig) -> None:
        self.keys, self.text_keys, self.window = (*obs_keys, "action"), text_keys, window
        self.parts: list[dict[str, np.ndarray]] = []
        self.operated: list[bool] = []
        self.text: dict[str, list[str]] = {k: [] for k in text_keys}
        self.samplers: dict[float, SequenceSampler | MixedSampler] = {}

    @property
    def steps(self) -> int:
        return sum(len(p["action"]) for p in self.parts)

    @property
    def operator_steps(self) -> int:
        return sum(len(p["action"]) for p, op in zip(self.parts, self.operated) if op)

    def add(
        self, data: dict[str, np.ndarray], select: np.ndarray, instruction: str | None = None, operator: bool = True
    ) -> None:
        for a, b in runs(select):
            self.parts.append({k: np.asarray(data[k][a:b]) for k in self.keys})
            self.operated.append(operator)
            for k in self.text_keys:
                self.text[k].append(instruction or "")
            self.samplers = {}

    def sampler(self, which: list[int]) -> SequenceSampler:
        data = {k: np.concatenate([self.parts[i][k] for i in which]) for k in self.keys}
        ends = np.cumsum([len(self.parts[i]["action"]) for i in which])
        return SequenceSampler(
            data, ends, self.keys[:-1], self.window, text={k: [v[i] for i in which] for k, v in self.text.items()}
        )

    def sample(self, batch: int, rng: np.random.Generator, operator_fraction: float = 0.0) -> dict[str, Any]:
        """Windows of every part alike, or `operator_fraction` of them from the operator's stretches (the rest from
        the seeded demos) when there are both."""
        if operator_fraction not in self.samplers:  # rebuilt when stretches were added (once per iteration at most)
            mine = [i for i, op in enumerate(self.operated) if op]
            seeded = [i for i, op in enumerate(self.operated) if not op]
            self.samplers[operator_fraction] = (
                MixedSampler([self.sampler(seeded), self.sampler(mine)], [1.0 - operator_fraction, operator_fraction])
                if operator_fraction > 0 and mine and seeded
                else self.sampler(list(range(len(self.parts))))
            )
        return self.samplers[operator_fraction].sample(batch, rng)


class Recorder:
    """Every env step to the store as it happens, one episode per env episode, committed when it ends, with the
    operator's steps marked `intervention`; an episode's operator stretches also go to the demo buffer."""

    def __init__(self, store: EpisodeStore, num_envs: int, demos: DemoBuffer, **meta: Any) -> None:
        self.store, self.demos = store, demos
        self.writers = [store.writer(source="policy", env=i, **meta) for i in range(num_envs)]

    def add(
        self,
        obs: dict[str, Any],
        action: np.ndarray,
        operated: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        success: np.ndarray,
        now: float | None = None,
    ) -> None:
        now = time.time() if now is None else now
        for i, w in enumerate(self.writers):
            w.add(
                {k: v[i] for k, v in obs.items()},
                action[i],
                float(reward[i]),
                bool(terminated[i]),
                bool(truncated[i]),
                bool(success[i]),
                bool(operated[i]),
                now,
            )
            if terminated[i] or truncated[i]:
                data, instruction = w.unfinished(), w._instruction
                w.finalize(source="intervention" if data["intervention"].any() else "policy")
                self.demos.add(data, data["intervention"], instruction)

    def state(self) -> dict[str, Any]:
        """The store's committed episodes and each env's unfinished one (tensors and strings: no pickle)."""
        return {
            "episodes": self.store.num_episodes,
            "unfinished": [
                {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in w.unfinished().items()} for w in self.writers
            ],
            "instructions": [w._instruction or "" for w in self.writers],
        }

    def load(self, state: dict[str, Any]) -> None:
        """Back to `state()`: episodes committed after it are dropped (the resumed run records them again) and the
        unfinished steps go back into their writers."""
        self.store.truncate(int(state["episodes"]))
        text = [k for k, v in self.store.spec.observations.items() if v.dtype == STRING]
        for w, tail, instruction in zip(self.writers, state["unfinished"], state["instructions"]):
            w.discard()
            tail = {k: v.numpy() for k, v in tail.items()}
            for s in range(len(tail["action"])):
                obs = {
                    **{k: tail[k][s] for k in self.store.arrays_spec if k in self.store.spec.observations},
                    **{k: instruction for k in text},
                }
                w.add(
                    obs,
                    tail["action"][s],
                    float(tail["reward"][s]),
                    bool(tail["terminated"][s]),
                    bool(tail["truncated"][s]),
                    bool(tail["success"][s]),
                    bool(tail["intervention"][s]),
                    float(tail["timestamp"][s]),
                )


def demos_from_store(buffer: DemoBuffer, store: EpisodeStore, everything: bool) -> None:
    """A store's operator stretches (or, `everything`, its whole episodes) into the demo buffer."""
    keys = [*buffer.keys, "intervention"]
    for i, meta in enumerate(store.episodes):
        if everything or meta.get("interventions", 0):
            data = store.episode(i, keys).data
            buffer.add(
                data,
                np.ones(len(data["action"]), bool) if everything else data["intervention"],
                meta.get("instruction"),
                operator=not everything,
            )


# ---------------------------------------------------------------------------------------------------
# operators (robotrl.flowrl.chain.Operator)
# ---------------------------------------------------------------------------------------------------
def copy_obs(obs: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in obs.items()}


def numpy_state(obj: Any) -> dict[str, Any]:
    """A scripted expert's mutable state, without pickling it: its arrays and generators, and its teleop noise's."""
    return {
        "arrays": {k: torch.from_numpy(v.copy()) for k, v in vars(obj).items() if isinstance(v, np.ndarray)},
        "rngs": {k: v.bit_generator.state for k, v in vars(obj).items() if isinstance(v, np.random.Generator)},
        "parts": {k: numpy_state(v) for k, v in vars(obj).items() if isinstance(v, TeleopNoise)},
    }


def load_numpy_state(obj: Any, state: dict[str, Any]) -> None:
    for k, v in state["arrays"].items():
        setattr(obj, k, v.numpy().copy())
    for k, v in state["rngs"].items():
        getattr(obj, k).bit_generator.state = v
    for k, v in state["parts"].items():
        load_numpy_state(getattr(obj, k), v)


class Watch:
    """What every operator does after a step: record it, count who drove, and keep the current observations."""

    def __init__(self, recorder: Recorder, num_envs: int) -> None:
        self.recorder, self.n = recorder, num_envs
        self.obs: dict[str, np.ndarray] = {}
        self.operated_steps = self.steps = self.takeovers = 0

    def start(self, obs: dict[str, Any]) -> None:
        self.obs = copy_obs(obs)
        self.see(np.ones(self.n, bool))

    def observe(
        self,
        action: np.ndarray,
        operated: np.ndarray,
        next_obs: dict[str, Any],
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
    ) -> None:
        self.recorder.add(self.obs, action, operated, reward, terminated, truncated, info["success"])
        self.operated_steps, self.steps = self.operated_steps + int(operated.sum()), self.steps + self.n
        self.handled(operated)
        self.obs = copy_obs(next_obs)
        self.see(terminated | truncated)

    def rate(self) -> tuple[float, int]:
        """(fraction of env steps the operator drove, take-overs) since the last call."""
        out = (self.operated_steps / max(self.steps, 1), self.takeovers)
        self.operated_steps = self.steps = self.takeovers = 0
        return out

    def handled(self, operated: np.ndarray) -> None:
        """The operator drove `operated` for one step."""

    def see(self, new_episode: np.ndarray) -> None:
        """The current observations `self.obs` are new; envs `new_episode` started an episode with them."""

    def state(self) -> dict[str, Any]:
        return {
            "obs": {k: [str(x) for x in v] if v.dtype == object else torch.from_numpy(v) for k, v in self.obs.items()}
        }

    def load(self, state: dict[str, Any]) -> None:
        self.obs = {
            k: np.asarray(v, dtype=object) if isinstance(v, list) else v.numpy().copy() for k, v in state["obs"].items()
        }


class ExpertOperator(Watch):
    """The simulated human: the task's scripted expert, watching every env at every step (its state follows the
    robot), takes an env over by `config.criterion` and drives it for `takeover_steps` steps. stray: after
    `stray_patience` consecutive decisions whose first action strays from its own by more than `stray_threshold`
    (RMS, normalized action units); stall: once `stall_steps` steps of the policy's have passed without the reward
    rising by `stall_margin` above its level at the last progress (a take-over restarts the count; an episode that
    has succeeded is left alone)."""

    def __init__(
        self, expert: Expert, action_scale: np.ndarray, config: HilConfig, recorder: Recorder, num_envs: int
    ) -> None:
        super().__init__(recorder, num_envs)
        self.expert, self.scale, self.config = expert, action_scale, config
        getattr(self.expert, "reset", lambda n: None)(num_envs)  # a demonstrator's reset and reset_env are optional
        self.reset_env = getattr(self.expert, "reset_env", lambda i: None)
        self.strikes, self.remaining = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)
        self.action = np.zeros((num_envs, len(action_scale)), np.float32)
        self.best, self.idle = np.full(num_envs, -np.inf, np.float32), np.zeros(num_envs, np.int64)
        self.succeeded = np.zeros(num_envs, bool)

    def stray(self, proposal: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The criterion's distance of each proposed first action from the expert's, normalized action units."""
        return np.sqrt((((proposal - self.action[idx]) * self.scale) ** 2).mean(-1))

    def wants(self) -> np.ndarray:
        return self.remaining > 0

    def decide(self, idx: np.ndarray, proposal: np.ndarray) -> np.ndarray:
        free = self.remaining[idx] == 0
        if self.config.criterion == "stall":
            take = idx[free & (self.idle[idx] >= self.config.stall_steps)]
        else:
            self.strikes[idx] = np.where(
                free & (self.stray(proposal, idx) > self.config.stray_threshold), self.strikes[idx] + 1, 0
            )
            take = idx[free & (self.strikes[idx] >= self.config.stray_patience)]
        self.remaining[take], self.strikes[take], self.idle[take] = self.config.takeover_steps, 0, 0
        self.takeovers += len(take)
        return self.remaining[idx] > 0

    def act(self) -> np.ndarray:
        return self.action

    def observe(
        self,
        action: np.ndarray,
        operated: np.ndarray,
        next_obs: dict[str, Any],
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
    ) -> None:
        progress = reward > self.best + self.config.stall_margin  # risen by the margin since the last progress
        self.best = np.where(progress, reward, self.best).astype(np.float32)
        self.succeeded |= np.asarray(info["success"], bool)  # nobody steps in once the task is done
        self.idle = np.where(progress | operated | self.succeeded, 0, self.idle + 1)
        super().observe(action, operated, next_obs, reward, terminated, truncated, info)

    def handled(self, operated: np.ndarray) -> None:
        self.remaining[operated] -= 1

    def see(self, new_episode: np.ndarray) -> None:
        for i in np.nonzero(new_episode)[0]:
            self.reset_env(int(i))
        self.strikes[new_episode], self.remaining[new_episode] = 0, 0
        self.best[new_episode], self.idle[new_episode], self.succeeded[new_episode] = -np.inf, 0, False
        self.action = np.asarray(self.expert.act(self.obs), np.float32)

    def state(self) -> dict[str, Any]:
        return {
            **super().state(),
            "expert": numpy_state(self.expert),
            "strikes": torch.from_numpy(self.strikes),
            "remaining": torch.from_numpy(self.remaining),
            "action": torch.from_numpy(self.action),
            "best": torch.from_numpy(self.best),
            "idle": torch.from_numpy(self.idle),
            "succeeded": torch.from_numpy(self.succeeded),
        }

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        load_numpy_state(self.expert, state["expert"])
        self.strikes, self.remaining = state["strikes"].numpy().copy(), state["remaining"].numpy().copy()
        self.action = state["action"].numpy().copy()
        if "best" in state:  # a run saved before the stall criterion existed tracked no progress
            self.best, self.idle = state["best"].numpy().copy(), state["idle"].numpy().copy()
            self.succeeded = state["succeeded"].numpy().copy()


class DeviceOperator(Watch):
    """A teleop device driving the one env while its take-over toggle is on, paced at the control rate when a
    person operates it (the device is read once per step, as `robotrl data collect` reads it)."""

    def __init__(self, device: TeleopDevice, config: HilConfig, recorder: Recorder, spec: Any) -> None:
        super().__init__(recorder, 1)
        self.device, self.spec = device, spec
        self.limiter = RateLimiter(spec.control_hz) if device.human else None
        self.command: Any = None
        self.was_operated: bool

    def wants(self) -> np.ndarray:
        return np.array([self.command.intervention])

    def decide(self, idx: np.ndarray, proposal: np.ndarray) -> np.ndarray:
        return self.wants()[idx]

    def act(self) -> np.ndarray:
        return command_to_action(self.command, self.spec)[None]

    def handled(self, operated: np.ndarray) -> None:
        self.takeovers += int(operated[0] and not self.was_operated)
        self.was_operated = bool(operated[0])

    def see(self, new_episode: np.ndarray) -> None:
        if new_episode[0]:
            self.device.reset_episode()
            self.was_operated = False
        if self.limiter is not None:
            self.limiter.wait()
        self.command = self.device.read({k: v[0] for k, v in self.obs.items()})
        if self.command.quit:
            raise KeyboardInterrupt(
                f"the operator quit ({self.device.name}); --resume continues from the last train state"
            )


def simulated_operator(config: HilConfig, env: Any) -> Any:
    """The operator who stands in for a human: the demonstrator `config.operator` names, or the task's scripted
    expert (an outside env has none: it needs a demonstrator)."""
    if config.demonstrator:
        return load_demonstrator(config.operator)
    if not hasattr(env, "task"):
        raise ValueError(
            f"HilConfig.operator: {env.task_spec.task} has no scripted expert; give a demonstrator as --operator "
            "module:callable, or a teleop device"
        )
    return env.task.expert(noise=config.operator_noise, seed=config.seed)


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------
def train(config: HilConfig, device: TeleopDevice | None = None) -> HilResult:
    """The run; `device` replaces the teleop device `config.operator` names (tests, custom drivers: a
    ScriptedDevice with `interventions`), as in `robotrl.datasets.collect.collect`."""
    run = start_online(config, "hil")
    policy, agent, env, windows, tally, rng = run.policy, run.agent, run.env, run.windows, run.tally, run.rng
    run_dir, state_path, optimizer, iterations = run.run_dir, run.state_path, run.optimizer, run.iterations
    n, horizon, execute = config.num_envs, config.rollout_steps, min(config.execute, policy.action_horizon)
    text = tuple(k for k, v in policy.spec.observations.items() if v.dtype == STRING)

    # the store every step goes to, the demo buffer, and the operator
    if device is not None and n != 1:
        env.close()
        raise ValueError(f"HilConfig.num_envs: expected 1 when a teleop device drives ({device.name}), got {n}")
    store_path = config.out or run_dir / "hil.zarr"
    store = EpisodeStore.create(store_path, env.task_spec, exist_ok=True)
    try:
        demos = DemoBuffer(tuple(policy.obs_keys), text, SequenceConfig(policy.obs_horizon, policy.action_horizon))
        if config.demos is not None:
            with EpisodeStore.open(config.demos) as seed_store:
                seed_store.check_spec(env.task_spec, that=f"HilConfig.demos ({config.demos}) vs the env")
                demos_from_store(demos, seed_store, everything=True)
        recorder = Recorder(store, n, demos, operator=device.name if device is not None else config.operator)
        operator: ExpertOperator | DeviceOperator
        if (config.operator == "expert" or config.demonstrator) and device is None:
            scale = policy.normalizer.get_buffer("action_scale").detach().cpu().numpy().reshape(-1)
            operator = ExpertOperator(simulated_operator(config, env), scale, config, recorder, n)
        else:
            if device is None:
                scripted = {"noise": config.operator_noise, "seed": config.seed}
                device = make_device(config.operator, env.task, **(scripted if config.operator == "scripted" else {}))
            if device.human:
                action_axes(env.task_spec)  # a task a twist cannot drive fails before the device opens
            device.start()
            operator = DeviceOperator(device, config, recorder, env.task_spec)
        start, rates = 0, []
        if config.resume:
            state = load_run_state(state_path, agent, {"adam": optimizer}, rng, env)
            windows.load(state["windows"])
            tally.load(state["tally"])
            recorder.load(state["recorder"])
            operator.load(state["operator"])
            run.load_ema(state)
            if isinstance(operator, DeviceOperator):  # a person is not replayable: ask the device afresh
                operator.see(np.ones(1, bool))
            start, rates = int(state["step"]), list(state["rates"])
        else:
            obs = env.reset(seed=config.seed)[0]
            windows.start(obs)
            operator.start(obs)
        demos_from_store(demos, store, everything=False)  # the interventions recorded so far (in this store)

        def evaluate() -> Any:
            return run.evaluate(config, execute)

        def demo_bc() -> tuple[torch.Tensor, dict[str, float]]:
            """The flow-matching BC loss on the demo buffer's windows."""
            loss = policy.compute_loss(demos.sample(config.bc_batch_size, rng, config.operator_fraction))
            return config.bc_loss_coef * loss, {"loss/demo_bc": loss.item()}

        log = RunLog(run_dir)
        best = BestCheckpoint(run_dir, run.kept.save)
        bar = tqdm(
            total=iterations * n * horizon,
            initial=start * n * horizon,
            desc=f"hil {config.operator}",
            unit="step",
            disable=not config.progress,
            dynamic_ncols=True,
        )
        clock = TrainClock()
        try:
            for it in range(start, iterations):
                data = collect(agent, env, windows, horizon, execute, config, tally, operator)
                use_demos = config.bc_loss_coef > 0 and bool(demos.parts)
                sums = ppo_update(
                    agent,
                    data,
                    config,
                    it >= config.critic_warmup,
                    run.reference,
                    optimizer,
                    run.constant,
                    rng,
                    f"hil iteration {it} (last train state: {state_path})",
                    demo_bc if use_demos else None,
                )
                run.average()
                rate, takeovers = operator.rate()
                rates.append(rate)

                # log, evaluate, checkpoint
                now, before = (it + 1) * n * horizon, it * n * horizon
                bar.update(n * horizon)
                recent = tally.success[-100:]
                row = {
                    "hil/intervention_rate": rate,
                    "hil/takeovers": takeovers,
                    "hil/demo_steps": demos.steps,
                    "hil/operator_steps": demos.operator_steps,
                    "hil/operated_decisions": float(data["operated"].float().mean()),
                }
                if now // config.log_every != before // config.log_every or it + 1 == iterations:
                    trained_s = clock.trained()
                    row.update(
                        {
                            **{k: float(np.mean(x)) for k, x in sums.items()},
                            "time/train_seconds": trained_s,
                            "time/steps_per_second": now / max(trained_s, 1e-9),
                            "rollout/decisions": len(data["adv"]),
                            **(
                                {
                                    "train/success_rate": float(np.mean(recent)),
                                    "train/return": float(np.mean(tally.returns[-100:])),
                                }
                                if recent
                                else {}
                            ),
                        }
                    )
                log.log(now, **row)
                bar.set_postfix(success=f"{np.mean(recent):.2f}" if recent else "-", intervention=f"{rate:.2f}")
                clock.evaluate_every(config, log, evaluate, now, before, last=it + 1 == iterations, best=best)
                if now // config.checkpoint_every != before // config.checkpoint_every or it + 1 == iterations:
                    save_run_state(
                        state_path,
                        it + 1,
                        agent,
                        {"adam": optimizer},
                        rng,
                        env,
                        tally=tally.state(),
                        windows=windows.state(),
                        recorder=recorder.state(),
                        operator=operator.state(),
                        rates=rates,
                        **run.ema_state(),
                    )
                    run.kept.save(run_dir / "policy")
        finally:
            bar.close()
    finally:
        if device is not None:
            device.close()
        store.close()
        env.close()
    result = finish_policy_run(config, log, evaluate, run.kept, clock, run_dir, iterations, start, n * horizon, best)
    return HilResult(**vars(result), store=Path(store_path), intervention_rates=rates).save()


def run_train_hil(config: HilConfig) -> HilResult:
    result = train(config)
    print(result.summary(f"hil {config.method} ({config.operator})", config.eval_episodes, "env steps"))
    return result
