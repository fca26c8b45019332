"""`robotrl policy convert`: an actor-critic run of an earlier robotrl into the checkpoint this version saves.

Earlier versions wrote the actor of SAC, RLPD, WSRL, IQL, Cal-QL and the actor/learner as `actor.pt`, and PPO's
agent as `agent.pt`: pickled state dicts, which `policy eval`, `policy export` and the deploy node cannot read.
This reads one (with `weights_only=True`: tensors only, nothing else is unpickled) together with the run's
`config.json`, and writes `<run_dir>/policy`, the registered `gaussian` policy the learners now save. The actor's
layer sizes are read from the weights; the observation keys, the action mode and the cameras from the config; the
spec from the task (or, for an offline run, from its store).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from robotrl.core.files import read_json_object
from robotrl.core.spec import Spec
from robotrl.datasets import EpisodeStore
from robotrl.envs import make_task
from robotrl.policies.gaussian import GaussianConfig, GaussianPolicy, actor_policy

#: the files earlier versions wrote: the SAC family's actor, PPO's whole agent
OLD_FILES = ("actor.pt", "agent.pt")


@dataclass
class ConvertConfig:
    """Convert an actor-critic run of an earlier robotrl (actor.pt / agent.pt) into `<run_dir>/policy`."""

    run_dir: Path
    """the run directory holding actor.pt (SAC, RLPD, WSRL, IQL, Cal-QL, sac-distributed) or agent.pt (PPO), and
    the run's config.json"""


def run_convert(config: ConvertConfig) -> Path:
    run = Path(config.run_dir)
    found = [run / f for f in OLD_FILES if (run / f).exists()]
    if not found:
        raise FileNotFoundError(f"run_dir: expected {' or '.join(OLD_FILES)} in {run}, found neither")
    out = run / "policy"
    if out.exists():
        raise FileExistsError(f"run_dir: {out} exists already (the run was converted, or saved by this version)")
    recorded = read_json_object(run / "config.json", ValueError)
    weights = torch.load(found[0], weights_only=True, map_location="cpu")
    policy = convert(weights, recorded, spec_of_run(recorded), where=str(found[0]))
    policy.save(out)
    print(json.dumps({"policy": str(out), "from": str(found[0]), "config": policy.manifest()["config"]}))
    return out


def convert(weights: dict[str, torch.Tensor], recorded: dict[str, Any], spec: Spec, where: str) -> GaussianPolicy:
    """The registered policy of an old actor (`actor.pt`) or PPO agent (`agent.pt`) state dict."""
    obs_keys = tuple(recorded.get("obs_keys") or ("state",))
    if "log_std" in weights:  # PPO's agent: actor.*, critic.*, log_std, norm.*
        linear = sorted({k.split(".")[1] for k in weights if k.startswith("actor.") and k.endswith(".weight")}, key=int)
        hidden = tuple(int(weights[f"actor.{i}.weight"].shape[0]) for i in linear[:-1])
        normalize = bool(recorded.get("normalize_obs", True))
        gaussian = GaussianConfig(
            obs_keys=obs_keys, hidden=hidden, squash=False, activation="tanh", layer_norm=False, obs_norm=normalize
        )
        parts: dict[str, Any] = {"actor": {k[len("actor.") :]: v for k, v in weights.items() if k.startswith("actor.")}}
        if normalize:
            parts |= {"obs_mean": weights["norm.mean"], "obs_var": weights["norm.var"]}
    else:  # the SAC family's tanh-Gaussian actor: trunk.*, mean.*, log_std.*, scale, center
        linear = sorted({k.split(".")[1] for k in weights if k.startswith("trunk.") and k.endswith(".weight")}, key=int)
        hidden = tuple(
            int(weights[f"trunk.{i}.weight"].shape[0]) for i in linear if weights[f"trunk.{i}.weight"].dim() == 2
        )
        gaussian = GaussianConfig(
            obs_keys=obs_keys,
            hidden=hidden,
            encoder_dim=int(recorded.get("encoder_dim", 64)),
            encoder_widths=tuple(recorded.get("encoder_widths", (32, 64, 128))),
        )
        if any(spec.observations[k].is_image for k in obs_keys if k in spec.observations):
            raise ValueError(
                f"{where}: a pixel run's actor.pt holds no image encoder (it was saved with the critic's); rerun it "
                "with this version, which saves both in policy/"
            )
        parts = {"actor": weights}
    try:
        return actor_policy(spec, gaussian, parts)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def spec_of_run(recorded: dict[str, Any]) -> Spec:
    """The spec the run's actor acts in: an offline run's store's, else its task's with the run's options."""
    if recorded.get("store") and not recorded.get("task"):
        with EpisodeStore.open(Path(recorded["store"])) as store:
            return store.spec
    task = make_task(recorded["task"])
    names = {f.name for f in fields(task.config)}
    options = {k: recorded[k] for k in ("action_mode", "episode_steps", "image_size") if recorded.get(k) is not None}
    if "images" in names and any(k.startswith("image_") for k in recorded.get("obs_keys") or ()):
        options["images"] = True
    return make_task(recorded["task"], **{k: v for k, v in options.items() if k in names}).spec()
