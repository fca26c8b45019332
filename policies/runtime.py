"""Run an exported policy (`robotrl.policies.export`) with no training code: what a robot or a ROS 2 node loads.

Imports only numpy, the standard library and `robotrl.core.spec` here; onnxruntime (ONNX) or torch.jit (TorchScript)
when a policy of that format is loaded; and, for a language-conditioned policy (a VLA), the frozen sentence
encoder its manifest names (`robotrl.policies.language`: inference of a pretrained model, no training code),
loaded on the first instruction and cached per instruction string. `load` refuses a file whose hash differs
from the manifest's, and a manifest whose spec disagrees with the graph's inputs or outputs (or with the `spec`
the caller expects); `act` refuses observations that do not fit the spec, naming the key, what was expected
and what was found.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from robotrl.core.files import MANIFEST, read_manifest, sha256
from robotrl.core.spec import STRING, Spec, SpecMismatchError

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
#: actions executed per chunk where neither the caller nor the export's manifest (`export.execute`) says
DEFAULT_EXECUTE = 8


class ExportedPolicyError(ValueError):
    """An export directory that cannot be run as it is; the message names the file and the field."""


class RuntimePolicy:
    """An exported policy: `act(obs)` maps an observation history (B, To, ...) per key to action chunks
    (B, H, A) float32 in env units, within the spec's action bounds. The initial noise is drawn with numpy
    (`seed`) unless given."""

    def __init__(self, path: Path, manifest: dict[str, Any], spec: Spec, run: Any, seed: int | None = None) -> None:
        self.path, self.manifest, self.spec = path, manifest, spec
        export = manifest["export"]
        self.format: str = export["format"]
        self.deterministic: bool = bool(export.get("deterministic", True))
        inputs = export["inputs"]
        self.text_inputs = [i for i in inputs if i.get("role") == "text_embedding"]
        self.obs_inputs = [i for i in inputs if i["name"] != export["noise"]["input"] and i not in self.text_inputs]
        self.obs_keys = tuple(i["name"] for i in self.obs_inputs)
        self.obs_horizon = int(self.obs_inputs[0]["shape"][1]) if self.obs_inputs else 0
        self.noise_name: str = export["noise"]["input"]
        self.noise_shape = tuple(int(s) for s in export["noise"]["shape"][1:])
        self.action_horizon = int(export["outputs"][0]["shape"][1])
        #: the actions per chunk the policy was chosen at (its export's), else `DEFAULT_EXECUTE`
        self.execute: int = export.get("execute") or DEFAULT_EXECUTE
        self.input_order = [i["name"] for i in inputs]
        self.rng = np.random.default_rng(seed)
        self._run = run

    def __repr__(self) -> str:
        return (
            f"RuntimePolicy({self.manifest['policy']!r}, {self.format}, task={self.spec.task!r}, "
            f"obs={list(self.obs_keys)}, To={self.obs_horizon}, H={self.action_horizon}, path={str(self.path)!r})"
        )

    def check_spec(self, spec: Spec, that: str = "env") -> None:
        self.spec.check(spec, this=f"exported policy {self.path.name}", that=that)

    def act(self, obs: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """Action chunks (B, H, A) float32 for observations (B, To, ...) per key; `noise` (B, horizon, A)
        replaces the standard normal draw (to reproduce a torch run)."""
        feeds = self.check_obs(obs)
        batch = next(iter(feeds.values())).shape[0] if feeds else 1
        for inp in self.text_inputs:
            feeds[inp["name"]] = self.embed(inp, obs, batch)
        if noise is None:
            noise = self.rng.standard_normal((batch, *self.noise_shape), dtype=np.float32)
        else:
            noise = np.asarray(noise)
            if noise.shape != (batch, *self.noise_shape):
                raise SpecMismatchError(
                    f"act: noise: expected shape ({batch}, {', '.join(map(str, self.noise_shape))}), got {noise.shape}"
                )
            noise = noise.astype(np.float32, copy=False)
        feeds[self.noise_name] = np.ascontiguousarray(noise)
        action = self._run([feeds[n] for n in self.input_order])
        return np.asarray(action, dtype=np.float32)

    def warmup(self) -> float:
        """Load what the first `act` would load (the frozen language encoder) and run the graph once, on zero
        observations and zero noise (the noise stream is not drawn from); the seconds it took. A robot's first
        control step should not wait seconds for a model to load: the deploy node calls this at start-up."""
        began = time.perf_counter()
        obs: dict[str, Any] = {
            i["name"]: np.zeros((1, *i["shape"][1:]), dtype=np.uint8 if i["dtype"] == "uint8" else np.float32)
            for i in self.obs_inputs
        }
        obs.update({i["name"]: "warm up" for i in self.text_inputs})
        self.act(obs, noise=np.zeros((1, *self.noise_shape), dtype=np.float32))
        return time.perf_counter() - began

    def embed(self, inp: dict[str, Any], obs: Mapping[str, Any], batch: int) -> np.ndarray:
        """The graph's embedding input for a string observation: B strings (or one for all envs) through the
        manifest's frozen encoder, or embeddings (B, dim) computed elsewhere, passed as they are."""
        from robotrl.policies.language import check_instructions, language_encoder

        key, dim = inp["name"], int(inp["shape"][1])
        if key not in obs:
            raise SpecMismatchError(
                f"act: observation {key!r} missing: expected one instruction string per env "
                f"(B,) or its embedding (B, {dim})"
            )
        text = check_instructions(obs[key], batch, dim, key, "act")
        if isinstance(text, np.ndarray):
            return text
        encoder = language_encoder(inp["encoder"])
        if encoder.dim != dim:
            raise SpecMismatchError(
                f"act: observation {key!r}: the encoder {inp['encoder']} gives {encoder.dim}-dim "
                f"embeddings, the graph takes {dim}"
            )
        return encoder(text).numpy()

    def check_obs(self, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The graph's observation inputs from `obs`, or a `SpecMismatchError` naming the key."""
        if not isinstance(obs, Mapping):
            raise SpecMismatchError(f"act: expected a mapping of observation key -> array, got {type(obs).__name__}")
        feeds: dict[str, np.ndarray] = {}
        batch: tuple[str, int] | None = None
        for inp in self.obs_inputs:
            key = inp["name"]
            if key not in obs:
                raise SpecMismatchError(
                    f"act: observation {key!r} missing; expected keys {list(self.obs_keys)}, got {sorted(obs)}"
                )
            x = np.asarray(obs[key])
            want = tuple(inp["shape"][1:])
            if x.ndim != len(want) + 1 or x.shape[1:] != want:
                raise SpecMismatchError(
                    f"act: observation {key!r}: expected shape (B, {', '.join(map(str, want))}) "
                    f"(B envs, To={self.obs_horizon} frames), got {x.shape}"
                )
            if batch is None:
                batch = (key, x.shape[0])
            elif x.shape[0] != batch[1]:
                raise SpecMismatchError(
                    f"act: observation {key!r}: batch {x.shape[0]} differs from {batch[0]!r}'s {batch[1]}"
                )
            if inp["dtype"] == "uint8":
                if x.dtype != np.uint8:
                    raise SpecMismatchError(
                        f"act: observation {key!r}: expected an image of dtype uint8 (HWC, 0-255), got {x.dtype}"
                    )
            else:
                if x.dtype.kind not in "fiub":
                    raise SpecMismatchError(f"act: observation {key!r}: expected a numeric array, got dtype {x.dtype}")
                x = x.astype(np.float32, copy=False)
                bad = ~np.isfinite(x)
                if bad.any():
                    where = tuple(int(i) for i in np.argwhere(bad)[0])
                    raise SpecMismatchError(
                        f"act: observation {key!r}: expected finite values, got {int(bad.sum())} "
                        f"NaN/inf (first at index {where}: {x[where]})"
                    )
            feeds[key] = np.ascontiguousarray(x)
        return feeds


def read_export_manifest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    file = path / MANIFEST
    manifest = read_manifest(
        path,
        ExportedPolicyError,
        "an exported robotrl policy",
        ("policy", "spec", "weights_sha256", "export"),
        {"export": " (a training checkpoint? export it first: robotrl policy export --policy DIR)"},
    )
    export = manifest["export"]
    if export.get("format") not in FORMATS:
        raise ExportedPolicyError(
            f"{file}: export.format: expected one of {sorted(FORMATS)}, got {export.get('format')!r}"
        )
    for key in ("file", "inputs", "outputs", "noise"):
        if key not in export:
            raise ExportedPolicyError(f"{file}: field 'export.{key}' missing")
    return manifest


def check_manifest(manifest: dict[str, Any], spec: Spec, where: str) -> None:
    """The graph's declared inputs and outputs must be what the manifest's spec implies."""
    export = manifest["export"]
    noise = export["noise"]
    names = [i["name"] for i in export["inputs"]]
    if noise["input"] not in names:
        raise ExportedPolicyError(f"{where}: export.noise.input {noise['input']!r} is not among the inputs {names}")
    for inp in export["inputs"]:
        key = inp["name"]
        if key == noise["input"]:
            continue
        if inp.get("role") == "text_embedding":
            if key not in spec.observations or spec.observations[key].dtype != STRING:
                raise SpecMismatchError(
                    f"{where}: graph input {key!r} embeds a string observation, but the manifest's "
                    f"spec has no string observation {key!r}"
                )
            if len(inp["shape"]) != 2 or not isinstance(inp.get("encoder"), str):
                raise ExportedPolicyError(
                    f"{where}: text input {key!r}: expected shape [batch, dim] and an 'encoder' "
                    f"name, got shape {inp['shape']} and encoder {inp.get('encoder')!r}"
                )
            continue
        if key not in spec.observations:
            raise SpecMismatchError(
                f"{where}: graph input {key!r} is not an observation of the manifest's spec "
                f"(has {sorted(spec.observations)})"
            )
        obs = spec.observations[key]
        if list(inp["shape"][2:]) != list(obs.shape):
            takes = ", ".join(map(str, inp["shape"][2:]))
            raise SpecMismatchError(
                f"{where}: observation {key!r}: the graph takes (B, To, {takes}), the manifest's "
                f"spec has shape {tuple(obs.shape)}"
            )
        want = "uint8" if obs.is_image else "float32"
        if inp["dtype"] != want:
            raise SpecMismatchError(
                f"{where}: observation {key!r}: the graph takes {inp['dtype']}, the manifest's spec "
                f"(dtype {obs.dtype}) implies {want}"
            )
    action = export["outputs"][0]["shape"]
    if action[-1] != spec.action.size or noise["shape"][-1] != spec.action.size:
        raise SpecMismatchError(
            f"{where}: action: the graph outputs (B, H, {action[-1]}) from noise (B, ..., "
            f"{noise['shape'][-1]}), the manifest's spec has action shape {tuple(spec.action.shape)}"
        )
    execute = export.get("execute")  # absent from exports made before it was recorded
    if execute is not None and not (type(execute) is int and 1 <= execute <= action[1]):
        raise ExportedPolicyError(
            f"{where}: export.execute: expected null or 1..{action[1]} actions of the chunk, got {execute!r}"
        )


def load(
    path: str | Path, spec: Spec | None = None, seed: int | None = None, threads: int | None = None
) -> RuntimePolicy:
    """The exported policy in directory `path` (file verified against the manifest's hash). With `spec`, the
    policy's spec must equal it (e.g. the env's or the robot's). `threads`: intra-op threads of the backend."""
    path = Path(path)
    manifest = read_export_manifest(path)
    export = manifest["export"]
    file = path / export["file"]
    if not file.exists():
        raise ExportedPolicyError(f"{path}: {export['file']} missing")
    digest = sha256(file)
    if digest != manifest["weights_sha256"]:
        raise ExportedPolicyError(
            f"{file}: sha256 {digest[:12]}... does not match the manifest's "
            f"{manifest['weights_sha256'][:12]}... (a file from another export, or damaged)"
        )
    try:
        saved = Spec.from_dict(manifest["spec"])
    except (KeyError, TypeError, ValueError) as e:
        raise ExportedPolicyError(f"{path / MANIFEST}: spec: not a valid spec ({e})") from None
    check_manifest(manifest, saved, str(path / MANIFEST))
    if spec is not None:
        saved.check(spec, this=f"exported policy {path.name}", that="expected spec")
    run = _onnx(file, manifest, threads) if export["format"] == "onnx" else _torchscript(file, threads)
    return RuntimePolicy(path, manifest, saved, run, seed)


def _onnx(file: Path, manifest: dict[str, Any], threads: int | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 -- onnxruntime raises its own exception types
        raise ExportedPolicyError(f"{file}: onnxruntime cannot load it ({e})") from None
    declared = {i["name"]: i for i in manifest["export"]["inputs"]}
    graph = {i.name: i for i in session.get_inputs()}
    if sorted(graph) != sorted(declared):
        raise SpecMismatchError(f"{file}: graph inputs {sorted(graph)}, the manifest declares {sorted(declared)}")
    for name, inp in graph.items():
        want = declared[name]["shape"]
        if [d if isinstance(d, int) else "batch" for d in inp.shape][1:] != list(want[1:]):
            raise SpecMismatchError(f"{file}: input {name!r}: graph shape {inp.shape}, the manifest declares {want}")
        if inp.type != f"tensor({'float' if declared[name]['dtype'] == 'float32' else declared[name]['dtype']})":
            raise SpecMismatchError(
                f"{file}: input {name!r}: graph type {inp.type}, the manifest declares {declared[name]['dtype']}"
            )
    output = session.get_outputs()[0].name
    names = [i["name"] for i in manifest["export"]["inputs"]]

    def run(inputs: list[np.ndarray]) -> np.ndarray:
        return session.run([output], dict(zip(names, inputs)))[0]

    return run


def _torchscript(file: Path, threads: int | None) -> Any:
    import torch  # torch.jit only: no robotrl training code is imported

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        module = torch.jit.load(str(file), map_location="cpu")
    except RuntimeError as e:
        raise ExportedPolicyError(f"{file}: torch.jit cannot load it ({str(e).splitlines()[0]})") from None
    module.eval()

    def run(inputs: list[np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return module(*(torch.from_numpy(x) for x in inputs)).numpy()

    return run
