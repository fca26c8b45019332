"""The policy interface and its checkpoint format, shared by every policy and every stage.

A checkpoint is a directory::

    model.safetensors   the weights (normalization statistics included as buffers); never a pickle
    manifest.json       {"format", "version", "policy" (registry name), "config", "spec", "stats",
                         "weights_sha256"}

`load` rebuilds the policy from the manifest alone, refuses weights whose hash differs from the manifest's,
and `check_spec` refuses an env or dataset whose spec differs, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from robotrl.core import files
from robotrl.core.files import MANIFEST, sha256
from robotrl.core.spec import STRING, Spec, SpecMismatchError

FORMAT = "robotrl-policy"
VERSION = 1
WEIGHTS = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names the file and the field."""


@dataclass
class PolicyConfig:
    """Options every policy has; each policy's config adds its own."""

    obs_horizon: int = 2
    """To: observation frames the policy conditions on (current one last)"""
    action_horizon: int = 16
    """H: actions predicted per call (the chunk)"""
    obs_keys: tuple[str, ...] | None = None
    """observations used (default: every numeric observation of the spec)"""
    state_mask_fields: tuple[str, ...] = ()
    """named fields of the vector observations the policy never sees (zeroed after normalization): e.g. the
    block pose in PushT's state for an image policy, or PickPlace's target cube for the VLA, which must then
    take it from the instruction"""

    def __post_init__(self) -> None:
        self.state_mask_fields = tuple(self.state_mask_fields)
        for name in ("obs_horizon", "action_horizon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name}: expected an integer >= 1, got {value!r}")
        if self.obs_keys is not None:
            self.obs_keys = tuple(self.obs_keys)


def config_from_dict(cls: type[PolicyConfig], d: Mapping[str, Any], where: str) -> PolicyConfig:
    """A config dataclass from its JSON form; unknown keys are an error (a manifest from another version)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise CheckpointError(
            f"{where}: config has unknown field(s) {unknown} for {cls.__name__}; expected some of {sorted(names)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) and "tuple" in str(hints.get(k)) else v for k, v in d.items()
    }
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------------------------------
class Normalizer(nn.Module):
    """Per-key affine maps to [-1, 1] from the dataset's min/max (diffusion policy's choice: bounded targets for
    the denoiser), kept as buffers so that they travel inside the weights. Images are only scaled to [0, 1]."""

    def __init__(
        self, shapes: Mapping[str, tuple[int, ...]], stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__()
        self.keys = list(shapes)
        for key, shape in shapes.items():
            lo = (
                np.full(shape, -1.0) if stats is None or key not in stats else np.asarray(stats[key]["min"], np.float64)
            )
            hi = np.full(shape, 1.0) if stats is None or key not in stats else np.asarray(stats[key]["max"], np.float64)
            span = hi - lo
            span = np.where(span < 1e-6, 2.0, span)  # a constant dimension maps to 0, not to inf
            self.register_buffer(f"{key}_scale", torch.as_tensor(2.0 / span, dtype=torch.float32).reshape(shape))
            self.register_buffer(
                f"{key}_offset", torch.as_tensor(-1.0 - lo * 2.0 / span, dtype=torch.float32).reshape(shape)
            )

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        return x * getattr(self, f"{key}_scale") + getattr(self, f"{key}_offset")

    def unnormalize(self, key: str, y: torch.Tensor) -> torch.Tensor:
        return (y - getattr(self, f"{key}_offset")) / getattr(self, f"{key}_scale")


def keep_masks(spec: Spec, vector_keys: Sequence[str], fields: Sequence[str]) -> dict[str, torch.Tensor]:
    """Per vector observation that has any of the named `fields`: 1 for each element kept, 0 for each hidden."""
    masks: dict[str, torch.Tensor] = {}
    found: set[str] = set()
    for k in vector_keys:
        slices = {name: sl for name, sl in spec.observations[k].field_slices().items() if name in fields}
        if slices:
            keep = np.ones(spec.observations[k].size, dtype=np.float32)
            for sl in slices.values():
                keep[sl] = 0.0
            masks[k] = torch.as_tensor(keep.reshape(spec.observations[k].shape))
            found.update(slices)
    unknown = [f for f in fields if f not in found]
    if unknown:
        have = [n for k in vector_keys for n, _ in spec.observations[k].fields]
        raise SpecMismatchError(
            f"state_mask_fields: {unknown} are not fields of the observations "
            f"{list(vector_keys)}; their fields are {have}"
        )
    return masks


# ---------------------------------------------------------------------------------------------------
# the interface
# ---------------------------------------------------------------------------------------------------
POLICIES: dict[str, type[Policy]] = {}
#: modules that define registered policies (imported by `register_all`)
POLICY_MODULES = ("flow", "diffusion", "consistency", "meanflow", "vla", "gaussian")


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under its `name`: `load`, `robotrl train bc policy:<name>`, distillation
    and the pipeline find it there. Its config class must be its own (a config names its policy: `policy_name`)."""
    for name, other in POLICIES.items():
        if other.config_cls is cls.config_cls and name != cls.name:
            raise TypeError(
                f"register: {cls.__name__}.config_cls {cls.config_cls.__name__} is already {name!r}'s; "
                "expected a config class of its own"
            )
    POLICIES[cls.name] = cls
    return cls


def policy_class(config: PolicyConfig) -> type[Policy]:
    """The registered policy whose config class `config` is an instance of (exactly)."""
    register_all()
    for cls in POLICIES.values():
        if type(config) is cls.config_cls:
            return cls
    raise TypeError(
        f"policy: {type(config).__name__} is the config of no registered policy; expected one of "
        f"{sorted(c.config_cls.__name__ for c in POLICIES.values())}"
    )


def policy_config(name: str) -> PolicyConfig:
    """The default config of the registered policy `name`, refused naming the registered ones."""
    register_all()
    if name not in POLICIES:
        raise ValueError(f"policy: expected one of {sorted(POLICIES)}, got {name!r}")
    return POLICIES[name].config_cls()


def register_all() -> dict[str, type[Policy]]:
    import importlib

    for name in POLICY_MODULES:
        importlib.import_module(f"robotrl.policies.{name}")
    return POLICIES


class Policy(nn.Module):
    """Maps an observation history to an action chunk; trained from dataset windows, run by `act`.

    Subclasses set `name` and `config_cls`, build their networks in `__init__` and implement `loss` (on a
    normalized training batch) and `sample` (normalized observations -> normalized action chunk).
    """

    name: ClassVar[str] = "policy"
    config_cls: ClassVar[type[PolicyConfig]] = PolicyConfig
    #: learns from an episode store's windows (`robotrl train bc`); False: a student, learned from a teacher
    learns_from_data: ClassVar[bool] = True
    #: the registry name of the one-step student this policy is distilled into (`robotrl policy distill`), whose
    #: class builds it with `from_teacher`; None: the policy is no teacher
    student: ClassVar[str | None] = None

    def __init__(
        self, spec: Spec, config: PolicyConfig | None = None, stats: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        super().__init__()
        self.spec = spec
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise TypeError(f"{self.name}: expected a {self.config_cls.__name__}, got {type(self.config).__name__}")
        numeric = [k for k, v in spec.observations.items() if v.dtype != STRING]
        self.obs_keys = tuple(self.config.obs_keys) if self.config.obs_keys is not None else tuple(numeric)
        unknown = [k for k in self.obs_keys if k not in numeric]
        if unknown:
            raise SpecMismatchError(
                f"{self.name}.obs_keys: {unknown} not among the spec's numeric observations {numeric}"
            )
        self.image_keys = tuple(k for k in self.obs_keys if spec.observations[k].is_image)
        self.vector_keys = tuple(k for k in self.obs_keys if k not in self.image_keys)
        self.action_dim = spec.action.size
        self.stats = {k: {n: np.asarray(v).tolist() for n, v in s.items()} for k, s in (stats or {}).items()}
        shapes = {k: spec.observations[k].shape for k in self.vector_keys}
        shapes["action"] = spec.action.shape
        self.normalizer = Normalizer(shapes, stats)
        #: keep masks (1 seen, 0 hidden) of the vector observations with hidden fields; not saved (the config is)
        masks = keep_masks(spec, self.vector_keys, self.config.state_mask_fields)
        self.masked_keys = tuple(masks)
        for k, keep in masks.items():
            self.register_buffer(f"{k}_keep", keep, persistent=False)

    @property
    def text_inputs(self) -> dict[str, dict[str, Any]]:
        """String observations the policy reads, each -> {"encoder": model name, "dim": embedding size}: an
        exported graph takes their embeddings, which the runtime computes with that frozen encoder."""
        return {}

    @property
    def obs_horizon(self) -> int:
        return self.config.obs_horizon

    @property
    def action_horizon(self) -> int:
        return self.config.action_horizon

    # --- to implement ------------------------------------------------------------------------------
    def loss(self, obs: dict[str, torch.Tensor], action: torch.Tensor, action_is_pad: torch.Tensor) -> torch.Tensor:
        """Training loss on normalized observations (B, To, ...) and a normalized action chunk (B, H, A)."""
        raise NotImplementedError

    def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """A normalized action chunk (B, H, A) for normalized observations (B, To, ...)."""
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------------
    def normalize_obs(self, obs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        device = next(self.parameters()).device
        out = {}
        for k in self.obs_keys:
            x = torch.as_tensor(np.asarray(obs[k]) if not isinstance(obs[k], torch.Tensor) else obs[k], device=device)
            out[k] = x.float() / 255.0 if k in self.image_keys else self.normalizer.normalize(k, x.float())
        for k in self.masked_keys:
            out[k] = out[k] * getattr(self, f"{k}_keep")
        return out

    def compute_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The loss of a `SequenceSampler` batch (raw units; normalized here)."""
        device = next(self.parameters()).device
        obs = self.normalize_obs(batch["obs"])
        action = self.normalizer.normalize("action", torch.as_tensor(batch["action"], device=device).float())
        pad = torch.as_tensor(batch["action_is_pad"], device=device)
        return self.loss(obs, action, pad)

    @torch.no_grad()
    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        """Action chunks (B, H, A) in the env's units for an observation history (B, To, ...) per key."""
        for k in self.obs_keys:
            if k not in obs:
                raise SpecMismatchError(
                    f"{self.name}.act: observation {k!r} missing; expected keys {list(self.obs_keys)}"
                )
            want = (self.config.obs_horizon, *self.spec.observations[k].shape)
            got = tuple(np.shape(obs[k]))[1:]
            if got != want:
                raise SpecMismatchError(
                    f"{self.name}.act: observation {k!r}: expected shape (B, {', '.join(map(str, want))}), "
                    f"got {tuple(np.shape(obs[k]))}"
                )
        chunk = self.normalizer.unnormalize("action", self.sample(self.normalize_obs(obs)))
        low = torch.as_tensor(self.spec.action.low_array(), dtype=chunk.dtype, device=chunk.device)
        high = torch.as_tensor(self.spec.action.high_array(), dtype=chunk.dtype, device=chunk.device)
        return torch.clamp(chunk, low, high).cpu().numpy()

    def check_spec(self, spec: Spec, that: str = "env") -> None:
        self.spec.check(spec, this=f"policy {self.name}", that=that)

    # --- checkpoints -------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "policy": self.name,
            "config": asdict(self.config),
            "spec": self.spec.to_dict(),
            "stats": self.stats,
        }

    def save(self, path: str | Path) -> Path:
        """Write the checkpoint directory (weights first, the manifest with their hash last)."""
        return save_weights(path, self.state_dict(), self.manifest(), FORMAT)


def save_weights(
    path: str | Path, state: Mapping[str, torch.Tensor], manifest: Mapping[str, Any], file_format: str
) -> Path:
    """A checkpoint directory: `state` as model.safetensors first, then `manifest` with the weights' hash, each
    replaced atomically, so a directory whose manifest names a hash always holds those whole weights.

    The safetensors header carries one metadata key, `format`: safetensors writes its metadata in hash-map order,
    which differs from save to save when there are several keys, and identical weights must give identical files
    and hashes. Everything else about the checkpoint is in the manifest."""
    from safetensors.torch import save

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    files.write_atomically(path / WEIGHTS, save(tensors, metadata={"format": file_format}))
    manifest = {**manifest, "weights_sha256": sha256(path / WEIGHTS)}
    files.write_atomically(path / MANIFEST, json.dumps(manifest, indent=2))
    return path


def read_manifest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    manifest = files.read_manifest(path, CheckpointError, "a robotrl checkpoint", ())
    file = path / MANIFEST
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file}: format: expected {FORMAT!r}, got {manifest.get('format')!r}")
    if int(manifest.get("version", -1)) > VERSION:
        raise CheckpointError(f"{file}: version {manifest.get('version')} is newer than this robotrl ({VERSION})")
    for key in ("policy", "config", "spec", "weights_sha256"):
        if key not in manifest:
            raise CheckpointError(f"{file}: field {key!r} missing")
    return manifest


def load(path: str | Path, spec: Spec | None = None, device: str = "cpu") -> Policy:
    """The policy saved at `path` (weights verified against the manifest's hash; nothing is unpickled).
    With `spec`, the policy's spec must equal it."""
    register_all()
    path = Path(path)
    old = (
        path
        if path.suffix == ".pt"
        else next((path / f for f in ("actor.pt", "agent.pt") if (path / f).exists()), None)
    )
    if old is not None and not (path / MANIFEST).exists():
        run = old.parent
        raise CheckpointError(
            f"{old}: the pickled actor of an earlier robotrl's actor-critic run; this version saves and loads "
            f"{run / 'policy'}: convert it with `robotrl policy convert --run-dir {run}`"
        )
    manifest = read_manifest(path)
    cls = POLICIES.get(manifest["policy"])
    if cls is None:
        raise CheckpointError(
            f"{path / MANIFEST}: policy: expected one of {sorted(POLICIES)}, got {manifest['policy']!r}"
        )
    try:
        saved_spec = Spec.from_dict(manifest["spec"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / MANIFEST}: spec: not a valid spec ({e})") from None
    if spec is not None:
        saved_spec.check(spec, this=f"checkpoint {path.name}", that="expected spec")
    config = config_from_dict(cls.config_cls, manifest["config"], str(path / MANIFEST))
    stats = {k: {n: np.asarray(v) for n, v in s.items()} for k, s in manifest.get("stats", {}).items()}
    policy = cls(saved_spec, config, stats or None)
    state = load_weights(path, manifest, device)
    weights = path / WEIGHTS
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise CheckpointError(
            f"{weights}: weights do not fit {cls.__name__} with the manifest's config: "
            f"{str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e}"
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: weights do not fit {cls.__name__} with the manifest's config: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}"
        )
    return policy.to(device).eval()


def load_weights(path: str | Path, manifest: Mapping[str, Any], device: str = "cpu") -> dict[str, torch.Tensor]:
    """model.safetensors of the checkpoint at `path`, verified against the manifest's hash (nothing unpickled)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = Path(path) / WEIGHTS
    if not weights.exists():
        raise CheckpointError(f"{path}: {WEIGHTS} missing")
    digest = sha256(weights)
    if digest != manifest["weights_sha256"]:
        raise CheckpointError(
            f"{weights}: sha256 {digest[:12]}... does not match the manifest's "
            f"{manifest['weights_sha256'][:12]}... (weights from another checkpoint, or damaged)"
        )
    try:
        return load_file(str(weights), device=device)
    except SafetensorError as e:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from e
