"""Export of a trained policy to one self-contained file (ONNX or TorchScript) that a robot runs without any
robotrl training code (see `robotrl.policies.runtime`).

An export directory holds::

    policy.onnx | policy.pt   the graph: RAW observations (B, To, ...) per numeric obs key (images uint8 HWC),
                              the frozen embedding (B, dim) of each string observation the policy reads (a VLA's
                              instruction: the runtime encodes the text outside the graph, with the encoder the
                              manifest names) and the initial noise (B, horizon, A) in; the action chunk
                              (B, H, A) in env units, clipped to the spec's bounds, out. Normalization, the sampling
                              loop (unrolled: the number of steps is fixed at export) and unnormalization are all
                              inside.
    manifest.json             the checkpoint's manifest (policy, config, spec, stats), "weights_sha256" now the
                              hash of the exported file, plus "export": format, inputs, outputs, noise, opset, ...

The noise is an input, not drawn in the graph, so that torch and the exported graph can be compared given the
same noise, and so that the runtime draws it with numpy. Any `Policy` whose sampling is deterministic given
its initial noise exports as it is: either it defines ``sample_from_noise(obs, noise)`` (normalized obs,
noise (B, horizon, A) -> normalized chunk), or its ``sample`` draws its noise exactly once through
``self.noise(batch, device)`` (as every `GenerativePolicy` does), which the export hands the input instead.
A sampler that draws more randomness inside its loop (DDPM) still exports; its graph then draws that part
itself and the manifest says ``"deterministic": false``.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import nn

from robotrl.core.files import made_aside
from robotrl.core.spec import STRING
from robotrl.policies.base import MANIFEST, Policy, read_manifest, sha256
from robotrl.policies.timing import torch_threads

FILES = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
OPSET = 17
NOISE = "noise"
ACTION = "action"
BATCH = "batch"
#: max |torch - exported| in env units that `export(verify=True)` accepts (float32 over an unrolled loop)
TOLERANCE = 1e-4
#: ops whose presence makes an exported graph non-deterministic given its inputs
_RANDOM_ONNX = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")
_RANDOM_TORCH = ("aten::randn", "aten::rand", "aten::normal", "aten::bernoulli", "aten::multinomial", "aten::randint")


class ExportError(ValueError):
    """A policy that cannot be exported as it is, or an export that does not reproduce the policy."""


# ---------------------------------------------------------------------------------------------------
# the exported computation
# ---------------------------------------------------------------------------------------------------
def noise_shape(policy: Policy) -> tuple[int, int]:
    """(rows, A) of the noise input: the network's (possibly padded) chunk length, not the executed H (twice that
    for a generative policy with a chunk residual: `GenerativePolicy.noise_rows`)."""
    rows = getattr(policy, "noise_rows", getattr(policy, "horizon", policy.config.action_horizon))
    return int(rows), int(policy.action_dim)


def sample_from_noise(policy: Policy, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
    """The policy's normalized action chunk for normalized `obs`, starting from the given initial `noise`.

    Uses the policy's own ``sample_from_noise`` where it has one; otherwise runs its ``sample`` with
    ``policy.noise`` answering `noise` (shadowed on the instance for this one call)."""
    hook = getattr(policy, "sample_from_noise", None)
    if callable(hook):
        return hook(obs, noise)
    if not callable(getattr(policy, "noise", None)):
        raise ExportError(
            f"{policy.name}: cannot feed the initial noise to {type(policy).__name__}.sample: it has "
            f"neither sample_from_noise(obs, noise) nor a noise(batch, device) method to stand in for"
        )
    calls: list[Any] = []

    def given(batch: Any, device: Any) -> torch.Tensor:
        calls.append(batch)
        return noise

    policy.noise = given  # type: ignore[assignment]  # an instance attribute shadows the method
    try:
        chunk = policy.sample(obs)
    finally:
        del policy.noise
    if len(calls) != 1:
        raise ExportError(
            f"{policy.name}: {type(policy).__name__}.sample drew its noise through self.noise "
            f"{len(calls)} times (expected once); define sample_from_noise(obs, noise) for export"
        )
    return chunk


class ExportedPolicy(nn.Module):
    """What the exported file computes: raw observations per key, then the noise -> the clipped action chunk
    in env units. `Policy.act` with the same noise gives the same chunk (the parity the tests check)."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        self.keys = (*policy.obs_keys, *policy.text_inputs)
        self.low: torch.Tensor
        self.high: torch.Tensor
        self.register_buffer("low", torch.as_tensor(policy.spec.action.low_array(), dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(policy.spec.action.high_array(), dtype=torch.float32))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *obs, noise = inputs
        normalized = self.policy.normalize_obs(_GraphInputs(zip(self.keys, obs), self.policy))
        chunk = self.policy.normalizer.unnormalize("action", sample_from_noise(self.policy, normalized, noise))
        return torch.minimum(torch.maximum(chunk, self.low), self.high)


class _GraphInputs(dict):
    """The graph's observation inputs: a policy that asks for an observation the graph cannot take (a string,
    e.g. a VLA's language instruction) gets an `ExportError` saying so, not a confusing missing-key error."""

    def __init__(self, items: Any, policy: Policy) -> None:
        super().__init__(items)
        self.policy = policy

    def _refuse(self, key: Any) -> None:
        spec = self.policy.spec.observations.get(key)
        if spec is not None and spec.dtype == STRING:
            raise ExportError(
                f"{self.policy.name}: reads the string observation {key!r}, which cannot be a graph input; "
                f"a policy declares the strings it reads in `text_inputs` (their embeddings become "
                f"graph inputs)"
            )

    def __missing__(self, key: Any) -> Any:
        self._refuse(key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if not dict.__contains__(self, key):
            self._refuse(key)
            return False
        return True


def input_specs(policy: Policy) -> list[dict[str, Any]]:
    """Name, shape (batch axis named) and dtype of each graph input: observations in `obs_keys` order, the
    embeddings of the policy's `text_inputs`, then the noise. Images stay uint8 HWC; the rest is float32."""
    horizon = policy.config.obs_horizon
    out = []
    for k in policy.obs_keys:
        if k in (NOISE, ACTION):
            raise ExportError(f"{policy.name}: observation key {k!r} collides with the graph's {k!r} tensor")
        image = k in policy.image_keys
        out.append(
            {
                "name": k,
                "shape": [BATCH, horizon, *policy.spec.observations[k].shape],
                "dtype": "uint8" if image else "float32",
                "role": "observation",
            }
        )
    for k, text in policy.text_inputs.items():
        out.append(
            {
                "name": k,
                "shape": [BATCH, int(text["dim"])],
                "dtype": "float32",
                "role": "text_embedding",
                "encoder": text["encoder"],
            }
        )
    out.append({"name": NOISE, "shape": [BATCH, *noise_shape(policy)], "dtype": "float32", "role": "noise"})
    return out


def example_inputs(policy: Policy, batch: int, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of the graph's shapes: vectors spread over the dataset's range, random images, N(0, 1)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for s in input_specs(policy):
        shape = (batch, *s["shape"][1:])
        if s["dtype"] == "uint8":
            out.append(rng.integers(0, 256, shape, dtype=np.uint8))
        elif s["role"] == "noise":
            out.append(rng.standard_normal(shape, dtype=np.float32))
        elif s["role"] == "text_embedding":  # sentence embeddings are unit vectors
            x = rng.standard_normal(shape, dtype=np.float32)
            out.append(x / np.linalg.norm(x, axis=-1, keepdims=True))
        else:
            stats = policy.stats.get(s["name"], {})
            lo = np.asarray(stats.get("min", -1.0), np.float32)
            hi = np.asarray(stats.get("max", 1.0), np.float32)
            out.append((lo + (hi - lo) * rng.random(shape, dtype=np.float32)).astype(np.float32))
    return out


# ---------------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------------
def export(
    policy: Policy | str | Path,
    out_dir: str | Path,
    format: Literal["onnx", "torchscript"] = "onnx",
    steps: int | None = None,
    opset: int = OPSET,
    verify: bool = True,
    tolerance: float | None = None,
    execute: int | None = None,
) -> Path:
    """Write `out_dir`/policy.onnx (or policy.pt) and manifest.json for a policy or a checkpoint directory;
    returns `out_dir`. `steps` overrides the policy's inference steps (flow, DDIM) for the export only.
    `execute` records the actions per chunk the policy was chosen at (`export.execute`: what the runtime's
    users run it at unless told otherwise; None: not recorded).

    The graph is traced at batch 2 with a dynamic batch axis. With `verify`, it is run on other inputs at
    another batch size and compared with the eager policy on the same noise; a max abs difference above
    `tolerance` (env units; default: the policy class's `export_tolerance`, else `TOLERANCE`) is an `ExportError`
    (it would mean the trace baked in something input-dependent).

    The export is built beside `out_dir` and moved into place whole: a kill leaves `out_dir` as it was, and an
    earlier export there is replaced only once the new one is complete.
    """
    if format not in FILES:
        raise ExportError(f"export format: expected one of {sorted(FILES)}, got {format!r}")
    if isinstance(policy, (str, Path)):
        from robotrl.policies.base import load

        source = read_manifest(policy)
        policy = load(policy)
    elif isinstance(policy, Policy):
        source = policy.manifest()
    else:
        raise ExportError(f"export: expected a Policy or a checkpoint directory, got {type(policy).__name__}")
    policy = copy.deepcopy(policy).to("cpu").eval()
    if steps is not None:
        if not hasattr(policy.config, "steps"):
            raise ExportError(f"export steps: {policy.name} has no inference steps to set")
        policy.config = replace(cast(Any, policy.config), steps=steps)  # validated by the config's __post_init__
        source = {**source, "config": asdict(policy.config)}
    if tolerance is None:
        tolerance = float(getattr(policy, "export_tolerance", TOLERANCE))
    horizon = int(policy.config.action_horizon)
    if execute is not None and not 1 <= execute <= horizon:
        raise ExportError(f"export execute: expected 1..{horizon} actions of the policy's chunk, got {execute}")
    model = ExportedPolicy(policy).eval()
    specs = input_specs(model.policy)
    inputs = tuple(torch.from_numpy(x) for x in example_inputs(model.policy, batch=2))

    with made_aside(Path(out_dir), "an export", replace=True) as aside:
        aside.mkdir(parents=True)
        _write_export(model, source, aside, inputs, specs, format, opset, verify, tolerance, execute)
    return Path(out_dir)


def _write_export(
    model: ExportedPolicy,
    source: dict[str, Any],
    out_dir: Path,
    inputs: tuple[torch.Tensor, ...],
    specs: list[dict[str, Any]],
    format: Literal["onnx", "torchscript"],
    opset: int,
    verify: bool,
    tolerance: float,
    execute: int | None,
) -> None:
    file = out_dir / FILES[format]
    names = [s["name"] for s in specs]
    start = time.perf_counter()
    with torch_threads(1):  # tracing is per-op overhead on tiny tensors: 1 thread is faster (and no OMP spin)
        deterministic, error = _write(model, inputs, names, file, format, opset, verify, tolerance)
    seconds = time.perf_counter() - start

    cfg = model.policy.config
    manifest = {
        **source,
        "weights_sha256": sha256(file),
        "export": {
            "format": format,
            "file": file.name,
            "opset": opset if format == "onnx" else None,
            "exporter": (
                f"torch.onnx.export (TorchScript-based, opset {opset})" if format == "onnx" else "torch.jit.trace"
            )
            + f", torch {torch.__version__}",
            "inputs": specs,
            "outputs": [
                {
                    "name": ACTION,
                    "shape": [BATCH, cfg.action_horizon, model.policy.action_dim],
                    "dtype": "float32",
                    "units": "env",
                    "clipped_to_spec_bounds": True,
                }
            ],
            "noise": {
                "input": NOISE,
                "shape": [BATCH, *noise_shape(model.policy)],
                "dtype": "float32",
                "distribution": "standard_normal",
            },
            "deterministic": deterministic,
            "steps": getattr(cfg, "steps", None),
            "execute": execute,
            "checkpoint_weights_sha256": source.get("weights_sha256"),
            "verified_max_abs_error": error,
            "tolerance": tolerance if error is not None else None,
            "export_seconds": round(seconds, 2),
        },
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _write(
    model: ExportedPolicy,
    inputs: tuple[torch.Tensor, ...],
    names: list[str],
    tmp: Path,
    format: str,
    opset: int,
    verify: bool,
    tolerance: float,
) -> tuple[bool, float | None]:
    """Trace `model` into `tmp`; returns (deterministic, verified max abs error or None)."""
    with torch.no_grad(), warnings.catch_warnings():
        # TracerWarnings flag Python values that become constants; `verify` checks the trace on other inputs
        warnings.simplefilter("ignore")
        if format == "onnx":
            torch.onnx.export(
                model,
                inputs,
                str(tmp),
                dynamo=False,
                opset_version=opset,
                input_names=names,
                output_names=[ACTION],
                dynamic_axes={n: {0: BATCH} for n in [*names, ACTION]},
                do_constant_folding=True,
            )
            deterministic = _onnx_is_deterministic(tmp)
        else:
            traced = torch.jit.trace(model, inputs, check_trace=False)
            deterministic = not any(op in str(traced.inlined_graph) for op in _RANDOM_TORCH)
            torch.jit.save(traced, str(tmp))
    error = _verify(model, tmp, format, tolerance) if verify and deterministic else None
    if verify and not deterministic:
        _run_file(tmp, format, example_inputs(model.policy, batch=3, seed=1))  # at least it runs
    return deterministic, error


def _onnx_is_deterministic(path: Path) -> bool:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return not any(node.op_type in _RANDOM_ONNX for node in model.graph.node)


def _run_file(path: Path, format: str, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Run an exported file as the runtime would (onnxruntime, or torch.jit.load)."""
    if format == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
        return session.run([ACTION], feeds)[0]
    module = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        return module(*(torch.from_numpy(x) for x in inputs)).numpy()


def _verify(model: ExportedPolicy, path: Path, format: str, tolerance: float) -> float:
    inputs = example_inputs(model.policy, batch=3, seed=1)  # another batch size and other values than the trace
    with torch.no_grad():
        expected = model(*(torch.from_numpy(x) for x in inputs)).numpy()
    got = _run_file(path, format, inputs)
    if got.shape != expected.shape:
        raise ExportError(
            f"{path.name}: output shape {got.shape} at batch 3, expected {expected.shape} (the batch "
            f"axis did not stay dynamic)"
        )
    error = float(np.abs(got - expected).max())
    if not error <= tolerance:
        raise ExportError(
            f"{path.name}: differs from the torch policy by {error:.3g} (max abs, env units) on the "
            f"same inputs and noise; tolerance {tolerance:.3g}. Something input-dependent was traced "
            f"as a constant (a Python branch on a tensor value or shape)"
        )
    return error


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------
@dataclass
class ExportConfig:
    """Export a checkpoint to ONNX or TorchScript for `robotrl.policies.runtime` (robots, ROS 2 deploy)."""

    policy: Path
    """checkpoint directory (model.safetensors + manifest.json)"""
    format: Literal["onnx", "torchscript"] = "onnx"
    out: Path | None = None
    """export directory (default: next to the checkpoint, '<checkpoint>-<format>')"""
    sampler_steps: int | None = None
    """override the policy's sampler steps (flow, DDIM) before exporting; the graph unrolls them"""
    execute: int | None = None
    """actions per chunk to run the policy at, recorded in the manifest: robotrl-deploy and `robotrl policy eval`
    execute that many unless told otherwise (None: not recorded; they execute 8)"""
    overwrite: bool = False
    """replace an earlier export in `out` (without it a non-empty `out` is refused; a directory that is not an
    export is never replaced)"""


def is_export(path: Path) -> bool:
    """Whether `path` holds an export: a manifest with an "export" entry."""
    try:
        return "export" in json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False


def run_export(config: ExportConfig) -> Path:
    """`robotrl policy export`: export, then print one JSON line (file, hash, parity)."""
    out = config.out
    if out is None:
        policy = config.policy.resolve()
        out = policy.with_name(f"{policy.name}-{config.format}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"ExportConfig.out: expected a directory, got the file {out}")
    if out.is_dir() and any(out.iterdir()):
        if not config.overwrite:
            raise ValueError(
                f"ExportConfig.out: expected a new or empty directory, got {out} with files in it "
                "(--overwrite replaces an earlier export)"
            )
        if not is_export(out):
            raise ValueError(f"ExportConfig.out: --overwrite replaces an earlier export; {out} is not one, kept")
    out = export(config.policy, out, config.format, steps=config.sampler_steps, execute=config.execute)
    manifest = json.loads((out / MANIFEST).read_text())
    info = manifest["export"]
    print(
        json.dumps(
            {
                "path": str(out / info["file"]),
                "format": config.format,
                "policy": manifest["policy"],
                "steps": info["steps"],
                "execute": info["execute"],
                "deterministic": info["deterministic"],
                "verified_max_abs_error": info["verified_max_abs_error"],
                "sha256": manifest["weights_sha256"],
            }
        )
    )
    return out
