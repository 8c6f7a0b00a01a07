"""The monitor under the recipes real runs use (issue #31), against float64 references.

Gradient accumulation, an L2 penalty or a summed loss, lr = 0 and 1-sample steps, bf16
autocast, dropout with the batch estimators. Each failed before: accumulation recorded the
last micro-batch only (97% off), a penalty or a summed loss gave silently wrong flows, lr = 0
or one sample raised and stopped training, bf16 raised a dtype error, the reference
estimator consumed the global RNG.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf

DT = torch.float64


def problem(
    n: int = 24, seed: int = 0
) -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))
    m = m.to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[4])])
    g = torch.Generator().manual_seed(seed + 1)
    return (
        m,
        syms,
        torch.randn(n, 5, generator=g, dtype=DT),
        torch.randn(n, 3, generator=g, dtype=DT),
    )


def record(
    mon: nf.NoetherMonitor, m: nn.Module, parts: list[tuple[torch.Tensor, torch.Tensor, float]]
) -> dict:
    """One step of k track blocks, block j backpropagating weight_j · mse(x_j)."""
    m.zero_grad(set_to_none=True)
    total = 0.0
    for xj, yj, wj in parts:
        with mon.track():
            loss = wj * F.mse_loss(m(xj), yj)
            loss.backward()
        total += float(loss.detach())
    row = mon.step(total)
    assert row is not None
    return row


def keys(row: dict, kind: str) -> list[str]:
    return [k for k in row if k.startswith(kind + "/")]


@pytest.mark.parametrize("sizes", [(8, 8, 8), (10, 8, 6), (23, 1)])
def test_accumulated_micro_batches_record_the_full_batch(sizes: tuple[int, ...]) -> None:
    """k blocks (loss_j · n_j/B, the batch mean) = one batch of the same data, to 1e-8."""
    m, syms, x, y = problem()
    dist = nf.DistanceOptions(every=1, mode="solve")
    kw = dict(every=1, lr=0.1, batch_size=24, weight_decay=1e-3, distance=dist)
    one = nf.NoetherMonitor(m, syms, **kw)
    full = record(one, m, [(x, y, 1.0)])
    acc = nf.NoetherMonitor(m, syms, **kw)
    cuts = np.cumsum((0, *sizes))
    parts = [(x[a:b], y[a:b], (b - a) / 24) for a, b in itertools.pairwise(cuts)]
    got = record(acc, m, parts)
    ref = nf.noether_flow(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference"),
        lr=0.1,
        batch_size=24,
        weight_decay=1e-3,
    )
    for name, key in one.keys.items():
        np.testing.assert_allclose(got[f"flow/{key}"], ref[name].numpy(), rtol=1e-8, atol=0)
        np.testing.assert_allclose(got[f"flow/{key}"], full[f"flow/{key}"], rtol=1e-8, atol=0)
        np.testing.assert_allclose(
            got[f"distance/{key}"], full[f"distance/{key}"], rtol=1e-7, atol=1e-12
        )
    assert got["undefined"] == 0


def test_the_documented_loss_over_k_pattern_is_exact() -> None:
    """Equal micro-batches, each backpropagating loss/k: the flows of the batch."""
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=24, distance=False)
    got = record(mon, m, [(x[i : i + 8], y[i : i + 8], 1 / 3) for i in (0, 8, 16)])
    ref = nf.noether_flow(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference"),
        lr=0.1,
        batch_size=24,
    )
    for name, key in mon.keys.items():
        np.testing.assert_allclose(got[f"flow/{key}"], ref[name].numpy(), rtol=1e-8, atol=0)


def test_an_l2_penalty_in_the_loss_is_weight_decay() -> None:
    """γ‖θ‖² in the loss: with weight_decay=γ declared, or found and added to the optimizer's."""
    m, syms, x, y = problem()
    gamma = 3e-3
    ref = nf.noether_flow(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference"),
        lr=0.1,
        batch_size=24,
        weight_decay=gamma,
    )
    params = syms.params()

    def step(mon: nf.NoetherMonitor) -> dict:
        m.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y) + gamma * sum(p.square().sum() for p in params)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        return row

    declared = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=24, weight_decay=gamma, distance=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = step(declared)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    found = nf.NoetherMonitor(m, syms, every=1, optimizer=opt, batch_size=24, distance=False)
    with pytest.warns(UserWarning, match="L2 penalty"):
        row2 = step(found)
    assert row2["weight_decay"] == pytest.approx(gamma, rel=1e-9)
    for name, key in declared.keys.items():
        np.testing.assert_allclose(row[f"flow/{key}"], ref[name].numpy(), rtol=1e-8)
        np.testing.assert_allclose(row2[f"flow/{key}"], ref[name].numpy(), rtol=1e-8)
    wrong = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=24, weight_decay=10 * gamma, distance=False
    )
    with pytest.raises(nf.StatisticsError, match="L2 penalty"):
        step(wrong)


def test_a_penalty_on_some_parameters_only_is_refused() -> None:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=24, distance=False)
    with pytest.raises(nf.StatisticsError, match="different γ"), mon.track():
        loss = F.mse_loss(m(x), y) + 1e-2 * m[0].weight.square().sum()
        loss.backward()


@pytest.mark.parametrize("how", ["reduction", "sum"])
def test_a_summed_loss_under_mean_is_refused(how: str) -> None:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=24, distance=False)
    with mon.track():
        out = m(x)
        loss = (
            F.mse_loss(out, y, reduction="sum") if how == "reduction" else (out - y).square().sum()
        )
        loss.backward()
    with pytest.raises(nf.StatisticsError, match="sums over the batch"):
        mon.step(loss)
    summed = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=24, distance=False, reduction="sum"
    )
    m.zero_grad(set_to_none=True)
    with summed.track():
        loss = F.mse_loss(m(x), y, reduction="sum")
        loss.backward()
    row = summed.step(loss)
    ref = nf.noether_flow(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference"),
        lr=0.1,
        batch_size=24,
    )
    assert row is not None
    for name, key in summed.keys.items():
        # sum convention: per-sample gradients ∇ℓ_i of the per-sample mse over 3 outputs
        np.testing.assert_allclose(row[f"flow/{key}"], 9 * ref[name].numpy(), rtol=1e-8)


def test_lr_zero_and_one_sample_steps_are_recorded_undefined_with_one_warning() -> None:
    """A linear warmup from 0 (HF's default) and a last batch of one sample: never an error."""
    m, syms, x, y = problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2))
    assert opt.param_groups[0]["lr"] == 0.0
    mon = nf.NoetherMonitor(
        m, syms, every=1, optimizer=opt, batch_size=24, distance=nf.DistanceOptions(every=1)
    )
    rows = []
    with pytest.warns(RuntimeWarning) as caught:
        for i in range(5):
            xb, yb = (x[:1], y[:1]) if i == 4 else (x, y)
            with mon.track():
                loss = F.mse_loss(m(xb), yb)
                loss.backward()
            rows.append(mon.step(loss))
            opt.step()
            opt.zero_grad()
            sched.step()
        with mon.track():  # a second lr = 0 / one-sample record: no second warning
            F.mse_loss(m(x[:1]), y[:1]).backward()
        mon.step()
    msgs = [str(w.message) for w in caught if "undefined" in str(w.message)]
    assert len(msgs) == 2 and "lr is 0" in msgs[0] and "fewer than 2" in msgs[1], msgs
    h = mon.history
    assert h["undefined"].tolist() == [1, 0, 0, 0, 2, 2]
    for key in mon.keys.values():
        assert np.isnan(h[f"flow/{key}"][[0, 4, 5]]).all()
        assert np.isfinite(h[f"flow/{key}"][1:4]).all()
        assert (
            np.isnan(h[f"distance/{key}"][0]).all() and np.isfinite(h[f"distance/{key}"][1:4]).all()
        )
        assert np.isfinite(h[f"charge/{key}"]).all()


def test_bf16_autocast_statistics_in_float32() -> None:
    """torch.autocast(bfloat16): no dtype error; flows within bf16 round-off of float32's."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    syms = nf.find_symmetries(m, torch.randn(8, 16))
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    ref = nf.noether_flow(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference"),
        lr=0.1,
        batch_size=64,
    )
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=64, distance=nf.DistanceOptions(every=1)
    )
    with mon.track(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.mse_loss(m(x).float(), y)
        loss.backward()
    row = mon.step(loss)
    assert row is not None and row["undefined"] == 0
    for name, key in mon.keys.items():
        got, want = row[f"flow/{key}"], ref[name].numpy()
        assert np.isfinite(got).all()
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


@pytest.mark.parametrize("estimator", ["reference", "microbatch"])
def test_batch_estimators_leave_the_training_rng_alone(estimator: str) -> None:
    """With dropout, a monitored run's losses are bit-identical to an unmonitored run's."""

    def run(monitored: bool) -> list[float]:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
        syms = nf.SymmetrySet([nf.Rescaling(m[0], m[3])])
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        x, y = torch.randn(16, 5), torch.randn(16, 3)
        mon = (
            nf.NoetherMonitor(
                m,
                syms,
                every=1,
                optimizer=opt,
                batch_size=16,
                estimator=estimator,
                loss_fn=F.mse_loss,
                micro_batch_size=4,
                distance=False,
            )
            if monitored
            else None
        )
        losses = []
        for _ in range(4):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            if mon is not None:
                mon.step(loss, inputs=x, targets=y)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    assert run(True) == run(False)


def _ce(kind: str, w: torch.Tensor) -> object:
    opts = {
        "ignore": {"ignore_index": -100},
        "weight": {"ignore_index": -100, "weight": w},
        "smooth": {"ignore_index": -100, "label_smoothing": 0.1},
    }[kind]

    def loss_fn(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1), **opts)

    return loss_fn


@pytest.mark.parametrize("kind", ["ignore", "weight", "smooth"])
def test_token_cross_entropy_hooks_equal_the_reference(kind: str) -> None:
    """Padded tokens (-100), class weights, label smoothing: per-sample gradients whose mean
    is the batch gradient; hooks = torch.func reference (float64), and so the monitor."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    m = m.to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[4])])
    x = torch.randn(6, 3, 5, dtype=DT)
    y = torch.randint(0, 4, (6, 3))
    y[0, 1:] = -100  # padding: sequences with 1, 2 or 3 real tokens
    y[2, 0] = -100
    loss_fn = _ce(kind, torch.rand(4, dtype=DT) + 0.5)
    ref = nf.collect_stats(m, syms, loss_fn, x, y, estimator="reference")
    hooks = nf.collect_stats(m, syms, loss_fn, x, y, estimator="hooks")
    m.zero_grad()
    loss_fn(m(x), y).backward()
    for p in syms.params():
        torch.testing.assert_close(ref.mean[p], p.grad, rtol=1e-10, atol=1e-14)
    kw = dict(lr=0.1, batch_size=6, weight_decay=1e-3)
    f_ref = nf.noether_flow(syms, ref, **kw)
    f_hooks = nf.noether_flow(syms, hooks, **kw)
    mon = nf.NoetherMonitor(m, syms, every=1, distance=False, **kw)
    m.zero_grad(set_to_none=True)
    with mon.track():
        loss = loss_fn(m(x), y)
        loss.backward()
    row = mon.step(loss)
    assert row is not None
    for name, key in mon.keys.items():
        torch.testing.assert_close(f_hooks[name], f_ref[name], rtol=1e-10, atol=0)
        np.testing.assert_allclose(row[f"flow/{key}"], f_ref[name].numpy(), rtol=1e-10)


def test_fp16_grad_scaler_is_divided_out() -> None:
    """fp16 autocast with a GradScaler: every gradient is ×scale; with grad_scaler= the flows
    equal those of the unscaled loss (the scale is a power of 2: exact up to fp16 overflow)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)

    def flows(scale: bool, given: bool) -> np.ndarray:
        mon = nf.NoetherMonitor(
            m,
            syms,
            every=1,
            lr=0.1,
            batch_size=32,
            distance=False,
            grad_scaler=scaler if given else None,
        )
        m.zero_grad(set_to_none=True)
        with mon.track(), torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(m(x).float(), y)
            (scaler.scale(loss) if scale else loss).backward()
        row = mon.step(loss)
        assert row is not None and row["undefined"] == 0
        return np.asarray(row["flow/rescaling0"])

    plain = flows(scale=False, given=False)
    np.testing.assert_allclose(flows(scale=True, given=True), plain, rtol=1e-5)
    unscaled = flows(scale=True, given=False)  # what the monitor recorded before: ×scale²
    np.testing.assert_allclose(unscaled, plain * 2.0**20, rtol=1e-3)
