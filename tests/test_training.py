"""Shared training pieces: a NaN loss stops before touching the weights; EMA warm-up; the LR schedule; the train
state file (safetensors, no pickle) and what a resume refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open

from robotrl.training.loop import (
    EMA,
    PICKLED_TRAIN_STATE,
    TRAIN_STATE,
    RunOptions,
    TrainingDiverged,
    TrainStateError,
    cosine_lr,
    load_train_state,
    optimizer_step,
    save_train_state,
    start_run,
)
from robotrl.training.state_file import TREE


def test_nan_loss_stops_before_any_weight_changes() -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.full((2, 3), float("nan"))).sum()
    with pytest.raises(TrainingDiverged, match="bc step 7: loss is nan"):
        optimizer_step(loss, model, opt, sched, "bc step 7")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    value, norm = optimizer_step(model(torch.ones(2, 3)).sum(), model, opt, sched, "ok")
    assert norm > 0 and not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_ema_warms_up_and_schedule_ends_at_zero() -> None:
    model = torch.nn.Linear(2, 2)
    ema = EMA(model, decay=0.999)
    assert ema.decay() == 0.0  # the first update copies the weights
    ema.update(model)
    torch.testing.assert_close(ema.model.weight, model.weight)
    assert 0 < ema.decay() < 0.999
    assert cosine_lr(0, 100, 10) == pytest.approx(0.1) and cosine_lr(10, 100, 10) == pytest.approx(1.0)
    assert cosine_lr(100, 100, 10) == pytest.approx(0.0, abs=1e-12)


def _adam_after_a_step() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    model(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    return model, opt


def test_train_state_round_trips_bit_for_bit_without_unpickling(tmp_path: Path, monkeypatch) -> None:
    """Every kind of value a run saves comes back with its type, dtype and bits; an optimizer restored from it
    continues exactly as the original; reading it calls no unpickler (torch.load is made to fail)."""
    model, opt = _adam_after_a_step()
    rng = np.random.default_rng(7)
    rng.random(3)
    base = torch.arange(10, dtype=torch.float64)
    state: dict[str, Any] = {
        "step": 12,
        "agent": model.state_dict(),
        "opt": {"actor": opt.state_dict()},  # int-keyed state, a tuple of betas, None-valued options
        "rng": {"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state},  # 128-bit ints
        "env": {"physics": np.linspace(0.0, 1.0, 6).reshape(2, 3), "steps": np.array([3, 4], dtype=np.int64)},
        "views": [base, base[2:5], base.view(2, 5)[:, 1]],  # one storage, a non-contiguous column among them
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.int32),
        "plain": (float("nan"), float("inf"), -3, "seed-7", None, np.float32(0.5), np.int64(9)),
    }
    path = tmp_path / TRAIN_STATE
    save_train_state(path, **state)
    with safe_open(str(path), framework="pt") as f:
        assert TREE in (f.metadata() or {})
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the train state went through torch.load"))
    back = load_train_state(path)

    assert back.keys() == state.keys() and back["step"] == 12
    for key, value in model.state_dict().items():
        assert torch.equal(back["agent"][key], value) and back["agent"][key].dtype == value.dtype
    saved_opt = back["opt"]["actor"]
    assert sorted(saved_opt["state"]) == [0, 1, 2, 3] and saved_opt["param_groups"][0]["betas"] == (0.8, 0.95)
    assert isinstance(saved_opt["param_groups"][0]["betas"], tuple) and saved_opt["param_groups"][0]["foreach"] is None
    assert back["rng"]["numpy"] == rng.bit_generator.state and torch.equal(back["rng"]["torch"], torch.get_rng_state())
    assert isinstance(back["env"]["physics"], np.ndarray) and back["env"]["steps"].dtype == np.int64
    np.testing.assert_array_equal(back["env"]["physics"], state["env"]["physics"])
    for got, want in zip(back["views"], state["views"]):
        assert torch.equal(got, want)
    assert back["flags"].dtype == torch.bool and torch.equal(back["flags"], state["flags"])
    assert back["scalar"].shape == () and back["scalar"].item() == 2.5 and back["empty"].shape == (0, 4)
    nan, inf, *rest = back["plain"]
    assert isinstance(back["plain"], tuple) and np.isnan(nan) and inf == float("inf")
    assert rest == [-3, "seed-7", None, 0.5, 9]

    restored, restored_opt = _adam_after_a_step()  # the same start, then both continue from the saved state
    restored.load_state_dict(back["agent"])
    restored_opt.load_state_dict(saved_opt)
    x = torch.randn(5, 3)
    for net, optimizer in ((model, opt), (restored, restored_opt)):
        optimizer.zero_grad()
        net(x).square().sum().backward()
        optimizer.step()
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a, b)


def test_train_state_refuses_what_it_cannot_store_and_damaged_files(tmp_path: Path) -> None:
    path = tmp_path / TRAIN_STATE
    with pytest.raises(TypeError, match=r"train state \['extra'\]\[1\]: expected tensors, arrays, .*set"):
        save_train_state(path, step=1, extra=[0, {1, 2}])
    with pytest.raises(TypeError, match=r"train state \['names'\]: expected a numeric array, got dtype <U1"):
        save_train_state(path, step=1, names=np.array(["a", "b"]))
    assert not path.exists()  # nothing half-written
    save_train_state(path, step=3, w=torch.ones(1000))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TrainStateError, match=rf"{TRAIN_STATE}: not a whole train state \(.*\); the run cannot"):
        load_train_state(path)
    path.write_bytes(b"PK\x03\x04 an earlier version's zip")
    with pytest.raises(TrainStateError, match="not a whole train state"):
        load_train_state(path)


def test_resume_refuses_an_earlier_pickled_train_state_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    start_run(RunOptions(run_dir=run_dir), "bc", "Reach")
    (run_dir / PICKLED_TRAIN_STATE).write_bytes(b"an earlier robotrl's pickle")
    with pytest.raises(FileNotFoundError, match=rf"resume: .*{PICKLED_TRAIN_STATE} is an earlier robotrl's pickled"):
        start_run(RunOptions(run_dir=run_dir, resume=True), "bc", "Reach")
    assert (run_dir / PICKLED_TRAIN_STATE).read_bytes() == b"an earlier robotrl's pickle"  # left as it was
