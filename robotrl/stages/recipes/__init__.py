"""Recipes: every stage setting of `robotrl run` that the measurements chose, per task (and policy) and budget.

A recipe is a YAML file beside this module (`PushT.yaml`, `PickPlace.yaml`, `PickPlace-vla.yaml`, `Reach.yaml`,
`Quadruped.yaml`, and `outside.yaml` for an outside env): the task and the policy it trains, the settings its budgets
share and each budget's own. Its comments say which measurement chose a value (bench/RESULTS.md sections). A recipe
of a flow policy runs the imitation chain (`Settings`: demos -> bc -> offline -> online -> distill -> export); one of
the `gaussian` policy trains it from scratch by PPO (`PpoSettings`: ppo -> export), the way a legged robot learns to
walk. A budget is named by what it fits:

    smoke      every stage on a tiny budget (CI; the numbers mean nothing)
    quick      <= 20 minutes on a 2-core machine
    standard   <= 90 minutes on 2 cores
    gpu        one GPU, <= 15 minutes
    full       the long version

`Settings` (or `PpoSettings`) is one budget of one recipe resolved: the stages read nothing else. `robotrl run`
writes the settings it ran to `run_dir/config.yaml`, and `robotrl run --config <that file>` runs them again exactly.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

BUDGETS = ("smoke", "quick", "standard", "gpu", "full")
Budget = Literal["smoke", "quick", "standard", "gpu", "full"]
#: where the recipe files are
RECIPE_DIR = Path(__file__).parent
#: the recipe of an outside env (gym:<id>, module:callable): no measurement chose it; a middle-sized start
OUTSIDE = "outside"


class RecipeError(ValueError):
    """A recipe or a config file that does not hold valid settings: its message names the file and the field."""


@dataclass(frozen=True)
class Settings:
    """Every setting of the pipeline's stages (`robotrl run`), one budget of one recipe resolved."""

    # --- demos (robotrl data record)
    demo_episodes: int
    demo_noise: float | None
    """the scripted expert's noise (None: the task's demo_noise capped at 0.5)"""
    # --- bc (robotrl train bc)
    bc_steps: int
    bc_batch_size: int
    bc_lr: float
    bc_policy: dict[str, Any]
    """the BC policy's config fields (its registered config: `channels`, `backbone`, `obs_horizon`, ...)"""
    # --- offline (robotrl train offline)
    offline_extraction: Literal["ppo", "awr"]
    offline_iterations: int
    """0: the stage is skipped, BC's policy handed on"""
    offline_critic_steps: int
    offline_policy_updates: int
    """ppo extraction: OPE-gated updates per iteration"""
    offline_awr_steps: int
    """awr extraction: advantage-weighted flow-matching steps per iteration (one gated update)"""
    offline_rollout_episodes: int
    offline_gate_episodes: int
    """training-seed episodes of each policy on which the offline update must gain (beyond one standard error)"""
    # --- online (robotrl train hil, or train online without interventions)
    interventions: bool
    """the online stage with the simulated operator (train hil); False: plain online RL over the same chain"""
    online_total_steps: int
    """0: the stage is skipped, the offline stage's policy handed on"""
    online_num_envs: int
    online_rollout_steps: int
    online_minibatch_size: int | None
    """decisions per PPO minibatch (None: train online's own)"""
    online_lr: float
    online_bc_coef: float
    """the velocity anchor (train online|hil --bc-coef; 0 frees the update)"""
    online_criterion: Literal["stray", "stall"]
    """when the operator takes over (train hil --criterion)"""
    online_operator_fraction: float
    """share of the online stage's BC windows drawn from the operator's take-overs"""
    online_ema: float
    """decay per update of the weight average handed on (0: the last weights)"""
    online_eval_every: int
    """env steps between evaluations on training seeds, the best handed on (0: the last weights)"""
    online_gate_episodes: int
    """training-seed episodes of each online evaluation and of the stage's gate"""
    online_sampler_steps: int | None
    """Euler steps of the sampler the online stage is judged by (None: the policy's own)"""
    # --- distill (robotrl policy distill)
    distill_steps: int
    distill_batch_size: int
    distill_dagger_rounds: int
    distill_dagger_episodes: int
    distill_gate_episodes: int
    """training-seed episodes on which the student must match its start (the teacher's one-step sampler)"""
    # --- evaluation, and what every stage shares
    eval_episodes: int
    """held-out episodes each stage is evaluated on"""
    eval_envs: int
    execute: int
    """actions executed per predicted chunk (training rollouts and evaluation alike)"""
    episode_steps: int | None = None
    """at most this many steps an episode (None: the task's own length): the demos are recorded with it and every
    later stage runs the length its policy's spec carries"""
    success_tail: int | None = None
    """BC and distillation train on each episode up to this many steps after its first success (None: on every
    step; `train bc --success-tail`)"""
    deploy_execute: int | None = None
    """actions the one-step policy executes per chunk: the distill stage's DAgger rounds and gate, and the
    evaluation of the student and its export (None: `execute`). One call predicts its chunk, so it can replan
    more often than the teacher it was distilled from; its export records the value, which robotrl-deploy
    runs by default"""
    distill_solve_weight: float = 0.0
    """weight of the distill stage's direct term: the student's one call regressed onto the teacher's whole ODE
    solve (`policy distill --solve-weight`; 0: consistency distillation alone)"""

    def __post_init__(self) -> None:
        check_types(self, "Settings")
        positive = [
            "demo_episodes", "bc_steps", "bc_batch_size", "bc_lr", "online_num_envs",
            "online_rollout_steps", "online_lr", "online_gate_episodes", "distill_steps", "distill_batch_size",
            "eval_episodes", "eval_envs", "execute", "offline_rollout_episodes", "offline_gate_episodes",
            "distill_gate_episodes", "online_minibatch_size", "online_sampler_steps", "episode_steps", "deploy_execute",
        ]  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise RecipeError(f"Settings.{name}: expected > 0, got {value}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value < math.inf:
                raise RecipeError(f"Settings.{f.name}: expected a finite number >= 0, got {value}")
        if not self.online_ema < 1.0:
            raise RecipeError(f"Settings.online_ema: expected a decay in [0, 1), got {self.online_ema}")
        if not self.online_operator_fraction <= 1.0:
            raise RecipeError(
                f"Settings.online_operator_fraction: expected a share in [0, 1], got {self.online_operator_fraction}"
            )
        if not self.interventions and (self.online_criterion != "stray" or self.online_operator_fraction):
            raise RecipeError(
                "Settings.interventions: the operator's options (online_criterion="
                f"{self.online_criterion!r}, online_operator_fraction={self.online_operator_fraction}) "
                "expected the online stage with the operator, got interventions=False"
            )

    @property
    def one_step_execute(self) -> int:
        """Actions the one-step policy executes per chunk: `deploy_execute`, else `execute`."""
        return self.execute if self.deploy_execute is None else self.deploy_execute

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


@dataclass(frozen=True)
class PpoSettings:
    """Every setting of the PPO chain (`robotrl run` on a recipe of the `gaussian` policy): ppo -> export, one
    budget of one recipe resolved."""

    ppo_total_steps: int
    """environment steps of `robotrl train ppo`, all envs together"""
    ppo_num_envs: int
    ppo: dict[str, Any]
    """`robotrl train ppo`'s other options (PpoConfig's fields: rollout_steps, minibatches, epochs, hidden, lr,
    backend, ...; its defaults where left out)"""
    eval_episodes: int
    """held-out episodes each stage is evaluated on"""
    eval_envs: int

    def __post_init__(self) -> None:
        check_types(self, "Settings")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, dict) and not 0 < value < math.inf:
                raise RecipeError(f"Settings.{f.name}: expected > 0, got {value}")
        taken = sorted({"task", "num_envs", "total_steps", "run_dir", "seed", "eval_episodes"} & set(self.ppo))
        if taken:
            raise RecipeError(f"Settings.ppo: {taken} are the pipeline's own; expected none of them, got {self.ppo}")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


#: a recipe's settings class, by the policy it trains (the imitation chain's for every other)
SETTINGS_OF: dict[str, type[Settings] | type[PpoSettings]] = {"gaussian": PpoSettings}
AnySettings = Settings | PpoSettings


def settings_class(policy: str) -> type[Settings] | type[PpoSettings]:
    return SETTINGS_OF.get(policy, Settings)


def to_dict(settings: AnySettings) -> dict[str, Any]:
    return {f.name: plain(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


@dataclass(frozen=True)
class Recipe:
    """A recipe file: the task and policy it trains, and its settings per budget."""

    task: str
    policy: str
    budgets: dict[str, AnySettings]
    path: Path

    def settings(self, budget: str) -> AnySettings:
        if budget not in self.budgets:
            raise RecipeError(f"{self.path.name}: budget: expected one of {list(self.budgets)}, got {budget!r}")
        return self.budgets[budget]


def recipe_path(task: str, policy: str | None) -> Path:
    """The recipe file of a task (its default policy's, or `policy`'s where the task has several)."""
    from robotrl.envs.outside import is_outside

    base = OUTSIDE if is_outside(task) else task.split("?", 1)[0]
    if policy is not None and (RECIPE_DIR / f"{base}-{policy}.yaml").exists():
        return RECIPE_DIR / f"{base}-{policy}.yaml"
    return RECIPE_DIR / f"{base}.yaml"


def recipe_for(task: str, policy: str | None = None) -> Recipe:
    """The recipe a run of `task` takes: the task's own (its `-<policy>` variant where one exists), else a file
    naming what is there."""
    path = recipe_path(task, policy)
    if not path.exists():
        known = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
        raise RecipeError(f"PipelineConfig.task: expected a task with a recipe, one of {known}, got {task!r}")
    return load_recipe(path)


def load_recipe(path: Path) -> Recipe:
    """A recipe file read and every budget's settings checked: one line naming the file and field on error."""
    data = read_yaml(path)
    unknown = sorted(set(data) - {"task", "policy", "settings", "budgets"})
    if unknown:
        raise RecipeError(f"{path.name}: unknown key(s) {unknown}; expected task, policy, settings, budgets")
    for key in ("task", "policy"):
        if not isinstance(data.get(key), str):
            raise RecipeError(f"{path.name}: {key}: expected a name, got {data.get(key)!r}")
    shared, budgets = data.get("settings") or {}, data.get("budgets") or {}
    if not isinstance(shared, dict) or not isinstance(budgets, dict):
        raise RecipeError(f"{path.name}: settings and budgets: expected mappings")
    missing = [b for b in BUDGETS if b not in budgets]
    if missing or set(budgets) - set(BUDGETS):
        raise RecipeError(f"{path.name}: budgets: expected {list(BUDGETS)}, got {list(budgets)}")
    resolved = {}
    for budget in BUDGETS:
        own = budgets[budget] or {}
        if not isinstance(own, dict):
            raise RecipeError(f"{path.name}: budgets.{budget}: expected a mapping, got {own!r}")
        resolved[budget] = settings_from(
            {**shared, **own}, f"{path.name}: budgets.{budget}", settings_class(data["policy"])
        )
    return Recipe(data["task"], data["policy"], resolved, path)


def settings_from(
    values: dict[str, Any], where: str, kind: type[Settings] | type[PpoSettings] = Settings
) -> AnySettings:
    """Settings from a mapping (a recipe's budget, a config file's `settings`): every field given, none unknown."""
    names = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise RecipeError(f"{where}: unknown setting(s) {unknown}; expected some of {names}")
    required = [f.name for f in dataclasses.fields(kind) if f.default is dataclasses.MISSING]
    missing = [n for n in required if n not in values]
    if missing:
        raise RecipeError(f"{where}: missing setting(s) {missing}")
    try:
        return kind(**values)
    except RecipeError as e:
        raise RecipeError(f"{where}: {str(e).removeprefix('Settings.')}") from None


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise RecipeError(f"{path}: cannot be read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data


def check_types(config: Any, where: str) -> None:
    """Each field of a dataclass holds its annotated type (int, float, bool, str, a Literal, a dict, or None where
    it is optional); an int where a float is annotated becomes the float. One line names the field."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for name, value in conformed(values, typing.get_type_hints(type(config)), where).items():
        object.__setattr__(config, name, value)


def conformed(values: dict[str, Any], hints: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` checked against the type `hints` of their names (`check_types`' rules), an int where a float is
    annotated made the float; one line names the first field that does not conform."""
    out = {}
    for name, value in values.items():
        ok, out[name] = conforms(value, hints[name])
        if not ok:
            raise RecipeError(f"{where}.{name}: expected {type_name(hints[name])}, got {value!r}")
    return out


def conforms(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, converted = conforms(value, arg)
            if ok:
                return True, converted
        return False, value
    if hint is type(None):
        return value is None, value
    if origin is Literal:
        return value in args, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if hint is str:
        return isinstance(value, str), value
    if origin is dict:
        return isinstance(value, dict), value
    return True, value


def type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint is type(None):
        return "none"
    return getattr(hint, "__name__", str(hint))


def plain(value: Any) -> Any:
    """A value as YAML writes it plainly (tuples as lists)."""
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
