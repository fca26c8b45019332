"""Shared training pieces: a NaN loss stops before touching the weights; EMA warm-up; the LR schedule."""

from __future__ import annotations

import pytest
import torch

from robotrl.training.loop import EMA, TrainingDiverged, cosine_lr, optimizer_step


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
