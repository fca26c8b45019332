"""Export to ONNX / TorchScript and the runtime that runs an export: the exported graph reproduces the torch
policy given the same noise, the runtime refuses damaged files, mismatched specs and bad observations, and
importing it pulls in no training code.

Tolerances (max abs difference of the action chunk in env units, same observations and noise as
`Policy.act` after `torch.manual_seed`): ONNX (onnxruntime) 1e-4 (1e-3 for DDIM, see
`DiffusionPolicy.export_tolerance`), TorchScript 1e-5.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robotrl import Spec, SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies import export as export_module, runtime
from robotrl.policies.base import Policy, sha256
from robotrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robotrl.policies.export import ExportConfig, ExportError, export, noise_shape, run_export
from robotrl.policies.flow import FlowConfig, FlowPolicy

TOLERANCE = {"onnx": 1e-4, "torchscript": 1e-5}


def trained(policy: Policy, store: EpisodeStore, steps: int = 10) -> Policy:
    """A few Adam steps on real windows, so the weights are not their initialization."""
    sampler = SequenceSampler.from_store(
        store, SequenceConfig(obs_horizon=policy.config.obs_horizon, action_horizon=policy.config.action_horizon)
    )
    rng = np.random.default_rng(0)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = policy.compute_loss(sampler.sample(32, rng))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return policy.eval()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pusht(pusht_demos: EpisodeStore) -> EpisodeStore:
    return pusht_demos


@pytest.fixture(scope="module")
def obs(pusht: EpisodeStore) -> dict[str, np.ndarray]:
    """Five real observation histories (B=5, To=2, 34)."""
    return SequenceSampler.from_store(pusht, SequenceConfig()).sample(5, np.random.default_rng(1))["obs"]


@pytest.fixture(scope="module")
def policies(pusht: EpisodeStore, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Policy, Path]]:
    """Flow (Euler, 10 steps; on the U-Net and on the MLP backbone) and diffusion (DDIM, 10 steps), trained a few
    steps and saved as checkpoints."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    torch.manual_seed(0)  # initial weights independent of which tests ran before in this process
    for name, policy in {
        "flow": FlowPolicy(pusht.spec, FlowConfig(channels=(32, 64), steps=10, solver="euler"), pusht.stats()),
        "flow-mlp": FlowPolicy(
            pusht.spec, FlowConfig(backbone="mlp", mlp_width=64, mlp_depth=2, steps=10), pusht.stats()
        ),
        "diffusion": DiffusionPolicy(
            pusht.spec, DiffusionConfig(channels=(32, 64), sampler="ddim", steps=10), pusht.stats()
        ),
    }.items():
        policy = trained(policy, pusht)
        out[name] = (policy, policy.save(root / name))
    return out


@pytest.fixture(scope="module")
def exports(
    policies: dict[str, tuple[Policy, Path]], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], Path]:
    """Every (policy, format) exported once: ONNX from the checkpoint directory, TorchScript from the object."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name, (policy, ckpt) in policies.items():
        out[(name, "onnx")] = export(ckpt, root / f"{name}-onnx", "onnx")
        out[(name, "torchscript")] = export(policy, root / f"{name}-ts", "torchscript")
    return out


def tolerance(policy: Policy, fmt: str) -> float:
    """The test's bound: TorchScript runs torch's own kernels (1e-5); ONNX the policy's export tolerance (1e-4, or
    1e-3 for DDIM, whose first step amplifies rounding differences ~2000x: see DiffusionPolicy.export_tolerance)."""
    return TOLERANCE[fmt] if fmt == "torchscript" else max(TOLERANCE[fmt], getattr(policy, "export_tolerance", 0.0))


def seeded_act(policy: Policy, obs: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`policy.act(obs)` and the initial noise it drew (the same torch.randn call after the same seed)."""
    torch.manual_seed(seed)
    expected = policy.act(obs)
    torch.manual_seed(seed)
    batch = len(next(iter(obs.values())))
    noise = torch.randn(batch, *noise_shape(policy)).numpy()
    return expected, noise


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", ["flow", "flow-mlp", "diffusion"])
def test_export_reproduces_the_torch_policy(
    name: str, fmt: str, policies: dict, exports: dict, obs: dict[str, np.ndarray]
) -> None:
    policy, ckpt = policies[name]
    out = exports[(name, fmt)]
    rt = runtime.load(out, spec=policy.spec)
    assert rt.spec == policy.spec and rt.obs_keys == ("state",) and rt.deterministic
    for batch, seed in ((1, 0), (5, 1)):  # the batch axis is dynamic (traced at 2)
        sub = {k: v[:batch] for k, v in obs.items()}
        expected, noise = seeded_act(policy, sub, seed)
        got = rt.act(sub, noise=noise)
        assert got.dtype == np.float32 and got.shape == (batch, 16, 2)
        err = np.abs(got - expected).max()
        assert err <= tolerance(policy, fmt), (name, fmt, batch, err)
        assert np.abs(expected).max() > 1e-3  # not trivially zero
    # numpy noise: within the spec's bounds, different draws differ
    a, b = rt.act(obs), rt.act(obs)
    assert np.all(a >= -1) and np.all(a <= 1) and not np.allclose(a, b)

    manifest = json.loads((out / "manifest.json").read_text())
    source = json.loads((ckpt / "manifest.json").read_text())
    for key in ("policy", "config", "spec", "stats"):
        assert manifest[key] == source[key], key
    info = manifest["export"]
    file = out / ("policy.onnx" if fmt == "onnx" else "policy.pt")
    assert info["file"] == file.name and manifest["weights_sha256"] == sha256(file)
    assert info["format"] == fmt and info["opset"] == (17 if fmt == "onnx" else None) and info["steps"] == 10
    assert info["inputs"] == [
        {"name": "state", "shape": ["batch", 2, 34], "dtype": "float32", "role": "observation"},
        {"name": "noise", "shape": ["batch", 16, 2], "dtype": "float32", "role": "noise"},
    ]
    assert info["outputs"][0]["shape"] == ["batch", 16, 2] and info["noise"]["input"] == "noise"
    assert info["deterministic"] and info["verified_max_abs_error"] <= tolerance(policy, fmt)
    assert info["tolerance"] == (1e-3 if name == "diffusion" else 1e-4)
    if fmt == "onnx":  # exported from the checkpoint directory: provenance kept
        assert info["checkpoint_weights_sha256"] == source["weights_sha256"]


def test_image_policy_takes_uint8_images(tmp_path: Path) -> None:
    store = record_expert(
        tmp_path / "img.zarr",
        "PushT",
        episodes=2,
        num_envs=2,
        episode_steps=20,
        progress=False,
        images=True,
        image_size=32,
    )
    hidden = ("block_pose", "block_vel", "pose_error", "tool_in_block", "coverage")  # the image must tell these
    policy = FlowPolicy(
        store.spec, FlowConfig(channels=(32, 64), steps=3, action_horizon=8, state_mask_fields=hidden), store.stats()
    ).eval()
    out = export(policy, tmp_path / "onnx")
    rt = runtime.load(out)
    assert [(i["name"], i["dtype"]) for i in rt.manifest["export"]["inputs"]] == [
        ("state", "float32"),
        ("image_top", "uint8"),
        ("noise", "float32"),
    ]
    obs = SequenceSampler.from_store(store, SequenceConfig(action_horizon=8)).sample(3, np.random.default_rng(0))["obs"]
    assert obs["image_top"].dtype == np.uint8 and obs["image_top"].shape == (3, 2, 32, 32, 3)
    expected, noise = seeded_act(policy, obs, 0)
    assert np.abs(rt.act(obs, noise=noise) - expected).max() <= TOLERANCE["onnx"]
    # the hidden state fields reach neither the torch policy nor the exported graph
    state = obs["state"].copy()
    for name, sl in store.spec.observations["state"].field_slices().items():
        if name in hidden:
            state[..., sl] = np.random.default_rng(2).uniform(-5, 5, state[..., sl].shape)
    assert not np.array_equal(state, obs["state"])
    np.testing.assert_array_equal(seeded_act(policy, {**obs, "state": state}, 0)[0], expected)
    np.testing.assert_array_equal(rt.act({**obs, "state": state}, noise=noise), rt.act(obs, noise=noise))
    state[..., store.spec.observations["state"].field_slices()["tool_pos"]] += 0.05  # a seen field matters
    assert not np.array_equal(rt.act({**obs, "state": state}, noise=noise), rt.act(obs, noise=noise))
    with pytest.raises(SpecMismatchError, match="'image_top': expected an image of dtype uint8"):
        rt.act({**obs, "image_top": obs["image_top"].astype(np.float32)})


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_runtime_refuses_a_tampered_file(fmt: str, exports: dict, tmp_path: Path) -> None:
    out = shutil.copytree(exports[("flow", fmt)], tmp_path / "copy")
    file = out / json.loads((out / "manifest.json").read_text())["export"]["file"]
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(runtime.ExportedPolicyError, match=r"sha256 .* does not match the manifest"):
        runtime.load(out)
    # another export's file under this manifest: refused the same way
    shutil.copy(exports[("diffusion", fmt)] / file.name, file)
    with pytest.raises(runtime.ExportedPolicyError, match="does not match the manifest"):
        runtime.load(out)


def test_runtime_refuses_a_mismatched_spec(exports: dict, policies: dict, tmp_path: Path) -> None:
    out = shutil.copytree(exports[("flow", "onnx")], tmp_path / "copy")
    manifest = json.loads((out / "manifest.json").read_text())
    # the manifest's spec says 35 state dims, the graph takes 34
    edited = json.loads(json.dumps(manifest))
    edited["spec"]["observations"]["state"]["shape"] = [35]
    edited["spec"]["observations"]["state"].pop("fields")
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(SpecMismatchError, match=r"observation 'state'.*\(B, To, 34\).*\(35,\)"):
        runtime.load(out)
    # a spec with another action size than the graph's output
    edited = json.loads(json.dumps(manifest))
    edited["spec"]["action"]["shape"] = [3]
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(SpecMismatchError, match="action"):
        runtime.load(out)
    # inputs declared differently from the graph's
    edited = json.loads(json.dumps(manifest))
    edited["export"]["inputs"][1]["shape"] = ["batch", 8, 2]
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(SpecMismatchError, match="'noise'"):
        runtime.load(out)
    # a correct export, but not for the env the caller has
    (out / "manifest.json").write_text(json.dumps(manifest))
    other = Spec.from_dict({**manifest["spec"], "control_hz": 10.0})
    with pytest.raises(SpecMismatchError, match="control_hz.*20.0.*10.0"):
        runtime.load(out, spec=other)
    runtime.load(out, spec=policies["flow"][0].spec)
    # a training checkpoint is not an export
    with pytest.raises(runtime.ExportedPolicyError, match="'export' missing"):
        runtime.load(policies["flow"][1])


def test_runtime_checks_observations(exports: dict, obs: dict[str, np.ndarray]) -> None:
    rt = runtime.load(exports[("flow", "onnx")])
    with pytest.raises(SpecMismatchError, match=r"observation 'state' missing; expected keys \['state'\]"):
        rt.act({"pos": obs["state"]})
    with pytest.raises(SpecMismatchError, match=r"'state': expected shape \(B, 2, 34\).*got \(5, 34\)"):
        rt.act({"state": obs["state"][:, -1]})
    with pytest.raises(SpecMismatchError, match=r"'state': expected shape \(B, 2, 34\).*got \(5, 3, 34\)"):
        rt.act({"state": np.concatenate([obs["state"], obs["state"][:, :1]], axis=1)})
    bad = obs["state"].copy()
    bad[2, 1, 7] = np.nan
    with pytest.raises(
        SpecMismatchError, match=r"'state': expected finite values, got 1 NaN/inf \(first at index \(2, 1, 7\)"
    ):
        rt.act({"state": bad})
    with pytest.raises(SpecMismatchError, match=r"noise: expected shape \(5, 16, 2\), got \(5, 8, 2\)"):
        rt.act(obs, noise=np.zeros((5, 8, 2), np.float32))
    assert rt.act({"state": obs["state"].astype(np.float64)}).dtype == np.float32  # numeric dtypes are cast


def test_runtime_imports_no_training_code(exports: dict, obs: dict[str, np.ndarray], tmp_path: Path) -> None:
    np.save(tmp_path / "state.npy", obs["state"])
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from robotrl.policies import runtime
        training = ["robotrl.policies.base", "robotrl.policies.flow", "robotrl.policies.diffusion",
                    "robotrl.policies.generative", "robotrl.policies.nets", "robotrl.policies.export",
                    "robotrl.training", "robotrl.stages.bc", "robotrl.datasets", "robotrl.envs"]
        state = np.load({str(tmp_path / "state.npy")!r})
        chunk = runtime.load({str(exports[("flow", "onnx")])!r}, threads=1).act({{"state": state}})
        assert chunk.shape == (5, 16, 2), chunk.shape
        loaded = [m for m in training + ["torch"] if m in sys.modules]
        assert not loaded, f"onnx runtime imported {{loaded}}"
        chunk = runtime.load({str(exports[("flow", "torchscript")])!r}, threads=1).act({{"state": state}})
        assert chunk.shape == (5, 16, 2), chunk.shape
        loaded = [m for m in training if m in sys.modules]
        assert not loaded, f"torchscript runtime imported {{loaded}}"
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_noise_prior_and_residual_are_inside_the_exported_graph(
    policies: dict, obs: dict[str, np.ndarray], tmp_path: Path, add_moved_heads
) -> None:
    """A policy steered by a learned noise prior and corrected by a chunk residual (online RL's `latent` and
    `residual` methods) exports with both in the graph: the runtime feeds standard-normal noise, the graph moves it
    to the prior's x_0 and draws the correction from the rows after it, and the chunk is the torch policy's for
    the same noise (and not the unsteered policy's)."""
    policy, ckpt = policies["flow"]
    from robotrl.policies import load

    steered = add_moved_heads(load(ckpt))
    for fmt in ("onnx", "torchscript"):
        rt = runtime.load(export(steered.save(tmp_path / "steered"), tmp_path / fmt, fmt))
        config = rt.manifest["config"]
        assert rt.deterministic and config["noise_prior"] == config["action_residual"] == [16]
        assert rt.noise_shape == (2 * steered.horizon, steered.action_dim)  # x_0's rows, then the correction's
        expected, noise = seeded_act(steered, obs, 0)
        assert np.abs(rt.act(obs, noise=noise) - expected).max() <= tolerance(steered, fmt), fmt
        assert np.abs(rt.act(obs, noise=noise) - seeded_act(policy, obs, 0)[0]).max() > 1e-2


def test_stochastic_sampler_exports_marked_non_deterministic(pusht: EpisodeStore, obs: dict, tmp_path: Path) -> None:
    policy = DiffusionPolicy(
        pusht.spec, DiffusionConfig(channels=(32, 64), sampler="ddpm", train_steps=8, steps=8), pusht.stats()
    ).eval()
    rt = runtime.load(export(policy, tmp_path / "ddpm"))
    assert not rt.deterministic and rt.manifest["export"]["verified_max_abs_error"] is None
    noise = np.random.default_rng(0).standard_normal((5, 16, 2), dtype=np.float32)
    a, b = rt.act(obs, noise=noise), rt.act(obs, noise=noise)
    assert a.shape == (5, 16, 2) and np.all(np.abs(a) <= 1) and not np.allclose(a, b)  # DDPM's per-step noise


@pytest.mark.parametrize("name", ["consistency", "meanflow"])
def test_one_step_students_export(name: str, pusht: EpisodeStore, obs: dict, tmp_path: Path) -> None:
    """Students define sample_from_noise; their exports reproduce them like the teachers'."""
    pytest.importorskip(f"robotrl.policies.{name}")
    from robotrl.policies.base import POLICIES

    cls = POLICIES[name]
    policy = cls(pusht.spec, cls.config_cls(channels=(32, 64)), pusht.stats()).eval()
    for fmt in ("onnx", "torchscript"):
        rt = runtime.load(export(policy, tmp_path / fmt, fmt))
        assert rt.deterministic
        expected, noise = seeded_act(policy, obs, 0)
        assert np.abs(rt.act(obs, noise=noise) - expected).max() <= tolerance(policy, fmt), (name, fmt)


def test_policy_reading_an_undeclared_string_is_refused_clearly(tmp_path: Path) -> None:
    """A string observation becomes a graph input only as the embedding a policy declares in `text_inputs` (the
    VLA's export is tested in test_vla.py); reading one without declaring it is an ExportError naming the key."""
    from robotrl.envs import make_task

    class ReadsText(FlowPolicy):
        name = "reads_text"

        def normalize_obs(self, obs: Any) -> dict[str, torch.Tensor]:
            assert obs["instruction"] is not None
            return super().normalize_obs(obs)

    policy = ReadsText(make_task("PickPlace").spec(), FlowConfig(channels=(32, 64), obs_keys=("state",)))
    with pytest.raises(ExportError, match="string observation 'instruction'.*text_inputs"):
        export(policy, tmp_path / "out")


def test_policy_that_cannot_take_noise_is_refused(pusht: EpisodeStore, tmp_path: Path) -> None:
    class Twice(FlowPolicy):  # draws its noise twice: export cannot know which draw to feed
        name = "twice"

        def sample(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
            cond = self.encoder(obs)
            x = self.noise(cond.shape[0], cond.device) + self.noise(cond.shape[0], cond.device)
            return self.integrate(x, cond, 1)[:, : self.config.action_horizon]

    policy = Twice(pusht.spec, FlowConfig(channels=(32, 64)), pusht.stats())
    with pytest.raises(ExportError, match="twice.*2 times.*sample_from_noise"):
        export(policy, tmp_path / "out")


def test_run_export_config(
    policies: dict, obs: dict[str, np.ndarray], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy, ckpt = policies["flow"]
    out = run_export(ExportConfig(policy=ckpt, format="onnx", sampler_steps=2))
    assert out == ckpt.with_name(f"{ckpt.name}-onnx")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["steps"] == 2 and line["format"] == "onnx" and line["deterministic"]
    rt = runtime.load(out)
    assert rt.manifest["config"]["steps"] == 2
    policy.config.steps = 2
    try:
        expected, noise = seeded_act(policy, obs, 0)
    finally:
        policy.config.steps = 10
    assert np.abs(rt.act(obs, noise=noise) - expected).max() <= TOLERANCE["onnx"]
    with pytest.raises(ExportError, match="format"):
        export(ckpt, out, "tflite")  # type: ignore[arg-type]

    # an earlier export is replaced only when asked; a directory that is not an export, or a file, never
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match=r"ExportConfig.out: expected a new or empty directory, got .*\(--overwrite"):
        run_export(ExportConfig(policy=ckpt, format="onnx", sampler_steps=3))
    assert (out / "manifest.json").read_bytes() == before
    run_export(ExportConfig(policy=ckpt, format="onnx", sampler_steps=3, overwrite=True))
    assert runtime.load(out).manifest["config"]["steps"] == 3
    # an overwrite that fails half-way (a full disk after part of the graph's file) keeps the earlier export whole,
    # leaves nothing aside, and names the file under `out`, not the hidden directory it was built in
    kept = {f.name: f.read_bytes() for f in out.iterdir()}

    def full_disk(model, inputs, names, file, *args):
        file.write_bytes(b"half a graph")
        raise OSError(28, "No space left on device", str(file))

    monkeypatch.setattr(export_module, "_write", full_disk)
    with pytest.raises(OSError, match="No space left on device") as failed:
        run_export(ExportConfig(policy=ckpt, format="onnx", sampler_steps=4, overwrite=True))
    assert failed.value.filename == str(out / "policy.onnx")
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in out.iterdir()} == kept
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []
    mine = out.with_name("mine")
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(
        ValueError, match=r"ExportConfig.out: --overwrite replaces an earlier export; .*mine is not one"
    ):
        run_export(ExportConfig(policy=ckpt, out=mine, overwrite=True))
    assert (mine / "notes.txt").read_text() == "keep"
    with pytest.raises(ValueError, match=r"ExportConfig.out: expected a directory, got the file .*notes.txt"):
        run_export(ExportConfig(policy=ckpt, out=mine / "notes.txt"))


def test_the_export_records_the_actions_per_chunk_to_execute(
    policies: dict, exports: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`execute`, the actions per chunk a policy was chosen at, travels in its export's manifest: the runtime (and
    through it robotrl-deploy and `robotrl policy eval`) takes it as the default; an export without one runs 8; a
    value outside the chunk is refused by name, at export (nothing written) and in a manifest."""
    _, ckpt = policies["flow"]
    assert runtime.load(exports[("flow", "onnx")]).execute == runtime.DEFAULT_EXECUTE == 8
    out = run_export(ExportConfig(policy=ckpt, out=tmp_path / "ex2", execute=2))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["execute"] == 2
    horizon = runtime.load(out).action_horizon
    assert runtime.load(out).execute == 2 and horizon == 16
    with pytest.raises(ExportError, match=r"export execute: expected 1..16 actions of the policy's chunk, got 17"):
        export(ckpt, tmp_path / "bad", execute=17)
    assert not (tmp_path / "bad").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["export"]["execute"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        runtime.ExportedPolicyError, match=r"export.execute: expected null or 1..16 actions of the chunk, got 0"
    ):
        runtime.load(out)


def test_the_mlp_backbone_is_a_residual_mlp_and_its_misuses_are_refused(pusht: EpisodeStore) -> None:
    """backbone 'mlp': the chunk network is the residual MLP, unpadded (the chunk is the action horizon); unknown
    backbones, MeanFlow on an MLP and a narrower U-Net student of an MLP teacher are refused in one line."""
    from robotrl.policies.consistency import ConsistencyPolicy
    from robotrl.policies.meanflow import MeanFlowConfig
    from robotrl.policies.nets import ChunkMLP

    policy = FlowPolicy(pusht.spec, FlowConfig(backbone="mlp", mlp_width=32, mlp_depth=1), pusht.stats())
    assert isinstance(policy.net, ChunkMLP) and policy.horizon == policy.config.action_horizon
    assert len(policy.net.blocks) == 1 and policy.net.inp.out_features == 32
    with pytest.raises(ValueError, match=r"FlowConfig.backbone: expected one of \['unet', 'mlp'\], got 'rnn'"):
        FlowConfig(backbone="rnn")
    with pytest.raises(ValueError, match=r"FlowConfig.mlp_depth: expected >= 1, got 0"):
        FlowConfig(backbone="mlp", mlp_depth=0)
    with pytest.raises(ValueError, match=r"MeanFlowConfig.backbone: expected 'unet'"):
        MeanFlowConfig(backbone="mlp")
    with pytest.raises(ValueError, match=r"channels narrows a U-Net student; this teacher's backbone is 'mlp'"):
        ConsistencyPolicy.from_teacher(policy, channels=(16, 32))
    student = ConsistencyPolicy.from_teacher(policy)  # the teacher's MLP, weights and all
    assert isinstance(student.net, ChunkMLP)
    for name, x in policy.net.state_dict().items():
        torch.testing.assert_close(student.net.state_dict()[name], x, rtol=0, atol=0)
