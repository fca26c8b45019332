"""The one-step students on real PushT windows: the consistency student keeps its boundary condition, starts as
its teacher's one-step sampler and moves towards the teacher's multi-step answer as it is distilled; MeanFlow
learns from the data alone, its JVP target is the finite-difference derivative, and it samples in one call;
both round-trip through checkpoints; `robotrl.stages.distill` runs end to end and resumes exactly.

Small nets (channels (32, 64), H = 8) and one torch thread: the suite shares two cores, where more threads
than cores make every step many times slower.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robotrl.core.spec import SpecMismatchError
from robotrl.datasets import EpisodeStore
from robotrl.datasets.record import record_expert
from robotrl.datasets.sampler import SequenceConfig, SequenceSampler
from robotrl.policies import load
from robotrl.policies.consistency import ConsistencyConfig, ConsistencyPolicy
from robotrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robotrl.policies.flow import FlowConfig, FlowPolicy
from robotrl.policies.generative import GenerativePolicy
from robotrl.policies.meanflow import MeanFlowConfig, MeanFlowPolicy
from robotrl.stages.distill import DistillConfig, distill, train
from robotrl.training.loop import EMA, TRAIN_STATE, load_train_state

H, CHANNELS = 8, (32, 64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def store(pusht_demos: EpisodeStore) -> EpisodeStore:
    return pusht_demos


@pytest.fixture(scope="module")
def sampler(store: EpisodeStore) -> SequenceSampler:
    return SequenceSampler.from_store(store, SequenceConfig(obs_horizon=2, action_horizon=H))


def fit(policy: GenerativePolicy, sampler: SequenceSampler, steps: int, lr: float = 1e-3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    policy.train()
    for _ in range(steps):
        loss = policy.compute_loss(sampler.sample(32, rng))
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()


@pytest.fixture(scope="module")
def teacher_dir(store: EpisodeStore, sampler: SequenceSampler, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flow policy after a few dozen steps: far from good, but a real, non-trivial velocity field."""
    torch.manual_seed(0)
    policy = FlowPolicy(store.spec, FlowConfig(action_horizon=H, channels=CHANNELS, steps=8), store.stats())
    fit(policy, sampler, 60)
    return policy.save(tmp_path_factory.mktemp("teacher") / "flow")


@pytest.fixture(scope="module")
def teacher(teacher_dir: Path) -> FlowPolicy:
    policy = load(teacher_dir)
    assert isinstance(policy, FlowPolicy)
    return policy.requires_grad_(False)


@pytest.fixture(scope="module")
def windows(sampler: SequenceSampler) -> dict[str, Any]:
    return sampler.sample(48, np.random.default_rng(123))


def fixed_noise(policy: GenerativePolicy, batch: int, seed: int = 7) -> torch.Tensor:
    return torch.randn(batch, policy.noise_rows, policy.action_dim, generator=torch.Generator().manual_seed(seed))


def at(policy: ConsistencyPolicy, i: int, batch: int) -> torch.Tensor:
    return torch.full((batch,), i, dtype=torch.long)


class CountCalls:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


# ---------------------------------------------------------------------------------------------------
# consistency student
# ---------------------------------------------------------------------------------------------------
def test_student_starts_as_the_teachers_one_step_sampler(teacher: FlowPolicy, windows: dict[str, Any]) -> None:
    student = ConsistencyPolicy.from_teacher(teacher).eval()
    assert student.config.teacher == "flow" and student.config.teacher_steps == teacher.config.steps
    obs = student.normalize_obs(windows["obs"])
    noise = fixed_noise(student, 48)
    with torch.no_grad():
        euler = noise + teacher.velocity(noise, 0.0, teacher.encoder(obs))
        assert torch.allclose(student.sample_from_noise(obs, noise), euler[:, :H], atol=1e-6)
        # the grid is the teacher's own sampler: solving along it is teacher.sample from the same noise
        torch.manual_seed(3)
        sampled = teacher.sample(obs)
        torch.manual_seed(3)
        solved = student.teacher_solve(teacher, teacher.noise(48, noise.device), obs)[:, :H]
    assert torch.allclose(sampled, solved, atol=1e-5)


@pytest.mark.parametrize("kind", ["flow", "diffusion"])
def test_boundary_condition_holds_for_any_weights(kind: str, store: EpisodeStore, windows: dict[str, Any]) -> None:
    torch.manual_seed(1)
    cls, cfg = (FlowPolicy, FlowConfig) if kind == "flow" else (DiffusionPolicy, DiffusionConfig)
    tutor = cls(store.spec, cfg(action_horizon=H, channels=CHANNELS, steps=5), store.stats()).eval()
    student = ConsistencyPolicy.from_teacher(tutor).eval()
    assert student.config.teacher == kind and student.times.shape == (6,)
    with torch.no_grad():
        for p in student.parameters():  # whatever the weights
            p.add_(0.1 * torch.randn_like(p))
        obs = student.normalize_obs(windows["obs"])
        x = fixed_noise(student, 48)
        end = student.consistency(x, at(student, 5, 48), student.encoder(obs))
        assert torch.equal(end, x)
        inner = student.consistency(x, at(student, 2, 48), student.encoder(obs))
        assert not torch.allclose(inner, x)
    if kind == "diffusion":  # the DDIM grid reproduces the teacher's DDIM sampler
        with torch.no_grad():
            torch.manual_seed(3)
            sampled = tutor.sample(obs)
            torch.manual_seed(3)
            solved = student.teacher_solve(tutor, tutor.noise(48, x.device), obs)[:, :H]
        assert torch.allclose(sampled, solved, atol=1e-5)
        # and distillation from it runs: a finite loss with gradients
        loss = student.train().compute_distill_loss(windows, tutor, EMA(student, 0.95).model)
        loss.backward()
        assert torch.isfinite(loss) and all(
            torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None
        )


@pytest.mark.parametrize(
    "channels, lr, prior",
    [(None, 1e-4, False), ((16, 32), 1e-3, False), ((16, 32), 1e-3, True)],
    ids=["teachers-net", "narrow", "narrow-steered-corrected"],
)
def test_distillation_moves_the_one_step_output_to_the_teachers(
    teacher: FlowPolicy,
    teacher_dir: Path,
    sampler: SequenceSampler,
    windows: dict[str, Any],
    channels: tuple[int, ...] | None,
    lr: float,
    prior: bool,
    add_moved_heads,
) -> None:
    """The student that starts as the teacher, and a narrower one whose U-Net starts fresh (the faster student
    for deployment), both close most of the gap to the teacher's multi-step chunk. A teacher with a noise prior and
    a chunk residual (as online RL leaves it) hands the student both, which distillation leaves as they are: the
    gap is to the steered, corrected chunks."""
    torch.manual_seed(0)
    if prior:  # the teacher as online RL's `latent` method leaves it
        teacher = add_moved_heads(load(teacher_dir)).requires_grad_(False)
    student = ConsistencyPolicy.from_teacher(teacher, channels=channels)
    student.check_teacher(teacher)
    if channels is not None:
        assert student.config.channels == channels
        assert sum(p.numel() for p in student.net.parameters()) < 0.5 * sum(p.numel() for p in teacher.net.parameters())
    target = EMA(student, 0.95)
    obs = student.normalize_obs(windows["obs"])
    noise = fixed_noise(student, 48)
    reference = student.teacher_chunk(teacher, noise, obs)

    def gap() -> float:
        with torch.no_grad():
            return float(((student.eval().sample_from_noise(obs, noise) - reference) ** 2).mean())

    def fixed_batch_loss() -> float:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(0)
            return float(student.eval().compute_distill_loss(windows, teacher, target.model))

    gap0, loss0 = gap(), fixed_batch_loss()
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW(student.parameters(), lr=lr)
    for _ in range(80):
        loss = student.train().compute_distill_loss(sampler.sample(32, rng), teacher, target.model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        target.update(student)
    gap1, loss1 = gap(), fixed_batch_loss()
    assert loss1 < 0.5 * loss0, (loss0, loss1)
    assert gap1 < 0.5 * gap0, (gap0, gap1)
    if prior:
        for head in ("prior", "residual"):
            for name, x in getattr(teacher, head).state_dict().items():
                torch.testing.assert_close(getattr(student, head).state_dict()[name], x, rtol=0, atol=0)
    # still one network call from pure noise, and act() stays within the action bounds
    calls = CountCalls(student.net)
    chunk = student.act(windows["obs"])
    assert calls.calls == 1 and chunk.shape == (48, H, 2)
    assert (chunk >= student.spec.action.low_array()).all() and (chunk <= student.spec.action.high_array()).all()


def test_solve_weight_trains_the_deployed_call_towards_the_teachers_whole_solve(
    teacher: FlowPolicy, sampler: SequenceSampler, windows: dict[str, Any]
) -> None:
    """The direct term is the one call from pure noise against the teacher's N-step solve from that noise, added
    with its weight; the same steps on the same batches with it leave the deployed student nearer its teacher
    than consistency distillation alone does."""
    start = ConsistencyPolicy.from_teacher(teacher).eval()
    obs = start.normalize_obs(windows["obs"])
    noise = fixed_noise(teacher, 48)
    reference = start.teacher_chunk(teacher, noise, obs)

    def gap(student: ConsistencyPolicy) -> float:
        with torch.no_grad():
            return float(((student.eval().sample_from_noise(obs, noise) - reference) ** 2).mean())

    def distilled(solve_weight: float) -> tuple[float, float]:
        torch.manual_seed(0)
        student = ConsistencyPolicy.from_teacher(teacher)
        target = EMA(student, 0.95)

        def fixed_batch_loss(weight: float) -> float:
            with torch.random.fork_rng(), torch.no_grad():
                torch.manual_seed(0)
                return float(student.eval().compute_distill_loss(windows, teacher, target.model, weight))

        extra = fixed_batch_loss(2.0) - fixed_batch_loss(0.0)
        rng = np.random.default_rng(0)
        opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
        for _ in range(60):
            loss = student.train().compute_distill_loss(sampler.sample(32, rng), teacher, target.model, solve_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            target.update(student)
        return extra, gap(student)

    gap0 = gap(start)
    extra, plain = distilled(0.0)
    _, direct = distilled(1.0)
    # at the start the student is the one-step Euler sampler: twice its squared distance to the solve, within the
    # batch's spread of the fixed windows' gap
    assert 0.5 * 2 * gap0 < extra < 2 * 2 * gap0, (extra, gap0)
    assert direct < plain < gap0, (gap0, plain, direct)
    assert direct < 0.8 * plain, (plain, direct)


def test_student_loss_needs_a_teacher(teacher: FlowPolicy, windows: dict[str, Any], store: EpisodeStore) -> None:
    student = ConsistencyPolicy.from_teacher(teacher)
    with pytest.raises(RuntimeError, match="distill_loss"):
        student.compute_loss(windows)
    with pytest.raises(TypeError, match="'flow' teacher, got 'diffusion'"):
        student.check_teacher(DiffusionPolicy(store.spec, DiffusionConfig(action_horizon=H, channels=CHANNELS)))
    with pytest.raises(SpecMismatchError, match="channels"):
        student.check_teacher(FlowPolicy(store.spec, FlowConfig(action_horizon=H, channels=(32, 64, 64))))
    with pytest.raises(ValueError, match="expected 2 U-Net levels"):
        ConsistencyPolicy.from_teacher(teacher, channels=(16, 32, 64))
    with pytest.raises(ValueError, match="teacher_steps"):
        ConsistencyConfig(teacher="diffusion", train_steps=10, teacher_steps=20)


# ---------------------------------------------------------------------------------------------------
# MeanFlow
# ---------------------------------------------------------------------------------------------------
def test_meanflow_jvp_is_the_total_time_derivative(store: EpisodeStore, windows: dict[str, Any]) -> None:
    torch.manual_seed(0)
    policy = MeanFlowPolicy(store.spec, MeanFlowConfig(action_horizon=H, channels=CHANNELS), store.stats()).eval()
    obs = policy.normalize_obs(windows["obs"])
    with torch.no_grad():
        cond = policy.encoder(obs)
        z, v = fixed_noise(policy, 48, 1), fixed_noise(policy, 48, 2)
        t = torch.rand(48) * 0.8 + 0.1
        r = t * torch.rand(48)
        u, dudt = policy.average_velocity(z, r, t, v, cond)
        h = 1e-3  # central difference along (z + h v, r, t + h)
        fd = (policy.net(z + h * v, r, t + h, cond) - policy.net(z - h * v, r, t - h, cond)) / (2 * h)
    assert torch.allclose(u, policy.net(z, r, t, cond), atol=1e-6)
    assert float((dudt - fd).norm() / fd.norm()) < 1e-2


def test_meanflow_trains_from_data_and_samples_in_one_call(
    store: EpisodeStore, sampler: SequenceSampler, windows: dict[str, Any]
) -> None:
    torch.manual_seed(0)
    policy = MeanFlowPolicy(store.spec, MeanFlowConfig(action_horizon=H, channels=CHANNELS), store.stats())

    def fixed_batch_loss() -> float:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(0)
            return float(policy.compute_loss(windows))

    loss0 = fixed_batch_loss()
    fit(policy, sampler, 60)
    loss1 = fixed_batch_loss()
    assert loss1 < 0.85 * loss0, (loss0, loss1)

    calls = CountCalls(policy.net)
    chunk = policy.act(windows["obs"])
    assert calls.calls == 1 and chunk.shape == (48, H, 2) and np.isfinite(chunk).all()
    assert (chunk >= policy.spec.action.low_array()).all() and (chunk <= policy.spec.action.high_array()).all()
    with torch.no_grad():
        raw = policy.sample(policy.normalize_obs(windows["obs"]))
    assert raw.shape == (48, H, 2) and torch.isfinite(raw).all() and float(raw.abs().max()) < 10
    policy.config.steps = 3
    policy.act(windows["obs"])
    assert calls.calls == 1 + 1 + 3  # act, sample, then act in 3 steps


# ---------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["consistency", "meanflow"])
def test_checkpoint_round_trip(
    kind: str, teacher: FlowPolicy, store: EpisodeStore, windows: dict[str, Any], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    if kind == "consistency":
        policy: GenerativePolicy = ConsistencyPolicy.from_teacher(teacher, teacher_steps=4, teacher_solver="heun")
    else:
        policy = MeanFlowPolicy(store.spec, MeanFlowConfig(action_horizon=H, channels=CHANNELS, steps=2), store.stats())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    policy.eval().save(tmp_path / kind)
    # identical weights, identical files: every save (safetensors' metadata order varied from save to save)
    for again in range(6):
        policy.save(tmp_path / f"again{again}")
        for name in ("model.safetensors", "manifest.json"):
            assert (tmp_path / f"again{again}" / name).read_bytes() == (tmp_path / kind / name).read_bytes()
    loaded = load(tmp_path / kind, spec=store.spec)
    assert type(loaded) is type(policy) and loaded.config == policy.config
    manifest = json.loads((tmp_path / kind / "manifest.json").read_text())
    assert manifest["policy"] == kind
    if kind == "consistency":
        assert manifest["config"]["teacher"] == "flow" and manifest["config"]["teacher_solver"] == "heun"
    obs = policy.normalize_obs(windows["obs"])
    noise = fixed_noise(policy, 48)
    with torch.no_grad():
        assert torch.equal(policy.sample_from_noise(obs, noise), loaded.sample_from_noise(obs, noise))
    torch.manual_seed(5)
    a = policy.act(windows["obs"])
    torch.manual_seed(5)
    assert np.array_equal(a, loaded.act(windows["obs"]))


# ---------------------------------------------------------------------------------------------------
# robotrl.stages.distill
# ---------------------------------------------------------------------------------------------------
def small(teacher_dir: Path, store: EpisodeStore, run_dir: Path, **overrides: Any) -> DistillConfig:
    base = DistillConfig(
        teacher=teacher_dir,
        store=store.path,
        steps=12,
        batch_size=16,
        warmup=2,
        lr=3e-4,
        ema=0.9,
        gap_batch=16,
        eval_episodes=0,
        checkpoint_every=4,
        log_every=2,
        run_dir=run_dir,
        threads=1,
        progress=False,
    )
    return replace(base, **overrides)


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_distill_end_to_end_and_exact_resume(teacher_dir: Path, store: EpisodeStore, tmp_path: Path) -> None:
    whole = train(small(teacher_dir, store, tmp_path / "whole"))
    assert whole.finished and whole.steps == 12 and whole.checkpoint == tmp_path / "whole" / "policy"
    student = load(whole.checkpoint, spec=store.spec)
    assert isinstance(student, ConsistencyPolicy) and student.config.teacher == "flow"
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["distill/teacher_gap"] for r in rows if "distill/teacher_gap" in r]
    assert rows[0]["step"] == 0 and len(gaps) == 7 and gaps[-1] < gaps[0]
    assert any((tmp_path / "whole" / "tb").iterdir())

    # the same run stopped half-way, then resumed in a second call: identical weights, EMA and target
    half = train(small(teacher_dir, store, tmp_path / "split", stop_after=6))
    assert not half.finished and half.steps == 6 and not (tmp_path / "split" / "policy").exists()
    rest = distill(small(teacher_dir, store, tmp_path / "split", resume=True))
    assert rest == tmp_path / "split" / "policy"
    a, b = weights(whole.checkpoint), weights(rest)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = load_train_state(tmp_path / "whole" / TRAIN_STATE)
    sb = load_train_state(tmp_path / "split" / TRAIN_STATE)
    for part in ("policy", "target"):
        assert all(torch.equal(sa[part][k], sb[part][k]) for k in sa[part])
    split_rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in split_rows] == [r["step"] for r in rows]
    assert [r.get("distill/loss") for r in split_rows] == [r.get("distill/loss") for r in rows]

    # resuming with settings that change the result is refused, naming the field
    with pytest.raises(ValueError, match="lr: run has 0.0003, given 0.001"):
        distill(small(teacher_dir, store, tmp_path / "split", resume=True, lr=1e-3))


def test_dagger_rounds_train_on_the_teachers_labels_of_the_students_own_windows(
    teacher_dir: Path, store: EpisodeStore, sampler: SequenceSampler, tmp_path: Path
) -> None:
    """Two DAgger rounds (steps 4 and 8 of 12): the student drives PushT, every window it acts on is stored with
    the teacher's chunk for it (the very chunk the teacher gives there from the round's seeded noise), later
    batches mix them in, and a run stopped between the rounds resumes to identical weights and labels."""
    from robotrl.training.evaluate import ROLLOUT_SEED

    dagger = {"dagger_rounds": 2, "dagger_episodes": 2, "eval_envs": 2, "execute": 4}
    whole = train(small(teacher_dir, store, tmp_path / "whole", **dagger))
    saved = np.load(tmp_path / "whole" / "dagger.npz", allow_pickle=False)
    assert whole.dagger_pairs == len(saved["round"]) > 0 and set(saved["round"]) == {4, 8}
    assert saved["action"].shape[1:] == (H, store.spec.action.shape[0])
    # each round's env steps: its two envs stepped together, at least one decision of `execute` steps each
    assert saved["env_steps"][:, 0].tolist() == [4, 8] and (saved["env_steps"][:, 1] % 2 == 0).all()
    assert whole.dagger_env_steps == saved["env_steps"][:, 1].sum() >= 2 * 2 * 4
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rows if "dagger/student_success" in r]
    assert [r["step"] for r in rounds] == [4, 8] and rounds[0]["dagger/pairs"] < rounds[1]["dagger/pairs"]

    # the first pair of windows (the first decision of both envs) relabelled by the teacher from the same noise
    teacher = load(teacher_dir).eval()
    first = {k[len("obs.") :]: saved[k][:2] for k in saved.files if k.startswith("obs.")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ROLLOUT_SEED + 4)
        assert np.allclose(teacher.act(first), saved["action"][:2], atol=1e-5)
    # the windows are the student's own, from fresh training seeds: not windows of the demos
    demo_states = np.asarray(sampler.data["state"])
    assert not any(np.isclose(demo_states, w[-1]).all(axis=1).any() for w in first["state"])

    # without the rounds the same run trains on other batches: the labels are used
    plain = train(small(teacher_dir, store, tmp_path / "plain", execute=4))
    a, b = weights(whole.checkpoint), weights(plain.checkpoint)
    assert plain.dagger_pairs == 0 and not all(torch.equal(a[k], b[k]) for k in a)

    half = train(small(teacher_dir, store, tmp_path / "split", stop_after=6, **dagger))
    assert not half.finished and half.dagger_pairs == int((saved["round"] == 4).sum())
    rest = distill(small(teacher_dir, store, tmp_path / "split", resume=True, **dagger))
    c = weights(rest)
    assert all(torch.equal(a[k], c[k]) for k in a)
    again = np.load(tmp_path / "split" / "dagger.npz", allow_pickle=False)
    assert all(np.array_equal(again[k], saved[k]) for k in ("action", "round", "env_steps"))

    with pytest.raises(ValueError, match="dagger_fraction: expected a share in \\(0, 1\\), got 1.0"):
        small(teacher_dir, store, tmp_path / "bad", dagger_fraction=1.0)


def test_gate_keeps_the_start_when_distillation_made_the_student_worse(
    reach_bc_flow: Path, flow_reach_demos: Path, tmp_path: Path
) -> None:
    """A distillation wrecked by a far too high learning rate is caught: on the gate's training-seed episodes the
    student loses to its start (the half-trained Reach teacher's one-step Euler sampler), so the start is saved; a
    gentle run is judged by the same rule."""
    from robotrl.policies.consistency import student_for

    gated = {"execute": 4, "eval_envs": 20, "gate_episodes": 20}
    demos = EpisodeStore.open(flow_reach_demos)
    wrecked = train(small(reach_bc_flow, demos, tmp_path / "wrecked", lr=0.5, warmup=1, ema=0.0, **gated))
    assert wrecked.gate is not None and wrecked.gate["start_success"] >= 0.2
    assert wrecked.gate["student_success"] < wrecked.gate["start_success"] and wrecked.gate["kept"] == "start"
    start = student_for(load(reach_bc_flow), None).state_dict()
    kept = weights(wrecked.checkpoint)
    assert kept.keys() == start.keys() and all(torch.equal(kept[k], start[k]) for k in kept)
    rows = [json.loads(line) for line in (tmp_path / "wrecked" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("gate/start_success") == wrecked.gate["start_success"] for r in rows)

    gentle = train(small(reach_bc_flow, demos, tmp_path / "gentle", **gated))
    assert gentle.gate is not None
    keep = "student" if gentle.gate["student_success"] >= gentle.gate["start_success"] else "start"
    assert gentle.gate["kept"] == keep


def test_distill_refuses_a_mismatched_store_or_teacher(teacher_dir: Path, store: EpisodeStore, tmp_path: Path) -> None:
    reach = record_expert(tmp_path / "reach.zarr", "Reach", episodes=1, num_envs=1, episode_steps=10, progress=False)
    with pytest.raises(SpecMismatchError, match="teacher"):
        distill(small(teacher_dir, reach, tmp_path / "run"))
    student = ConsistencyPolicy.from_teacher(load(teacher_dir)).save(tmp_path / "student")
    with pytest.raises(ValueError, match="'consistency' policy, which names no student; expected a checkpoint of one"):
        distill(small(student, store, tmp_path / "run2"))
    with pytest.raises(FileNotFoundError, match=TRAIN_STATE):
        distill(small(teacher_dir, store, tmp_path / "run3", resume=True))
    # a device this machine lacks fails at construction, before the teacher is loaded, naming the field
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ValueError, match=r"DistillConfig.device: expected a (device this machine has|GPU index below)"):
        small(teacher_dir, store, tmp_path / "run4", device=missing)
