"""Fig. 2 and Fig. 8 (matrix factorisation and the Thm 5.2 noise equilibrium): the --quick
runs write their claims, series and figures; the closed-form Γ and the exact width reduction
are right; runs are deterministic for a seed. Claims that hold with a wide margin are
asserted; the others are only checked to be computed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from noetherflow.experiments import _two_layer, fig2, fig8
from noetherflow.experiments._base import notes_of
from noetherflow.theory.ziyin2024 import two_layer_noise_factors


@pytest.fixture(scope="module")
def quick_run(reproduce: Callable[..., Path]) -> Path:
    return reproduce("fig2", "fig8", jobs=2)


def test_fig2_quick(quick_run: Path, metrics: Callable[[Path, str], dict[str, Any]]) -> None:
    data = metrics(quick_run, "fig2")
    claims = {c["id"]: c for c in data["claims"]}
    old = {"sgd_balance_rel_err", "gd_order_of_magnitude", "delta_decays"}
    new = {
        "sgd_balance_bias_constant_lr",
        "delta_exponential_constant_lr",
        "library_flow_matches_theory",
    }
    assert set(claims) == old | new
    for c in claims.values():
        assert isinstance(c["value"], float) and math.isfinite(c["value"]), c
    # all three hold with margin (quick, seeds 0-3: rel. err 0.053-0.063 < 0.1,
    # GD/SGD 17-22 >= 10, Δ decay 98-156 >= 10)
    assert all(claims[i]["holds"] for i in old), claims
    # the library's flow is the theory's to round-off (measured 7e-15)
    assert claims["library_flow_matches_theory"]["value"] < 1e-10
    # the paper's protocol (constant η) is reported as measured, in its own claim
    bias = claims["sgd_balance_bias_constant_lr"]
    assert "constant" in bias["statement"] and "3 seeds" in bias["note"]
    # the instantaneous statistic stays, labelled, as a diagnostic in the note
    assert "Diagnostic (not the claim)" in bias["note"]
    # the balance of time averages is below the mean instantaneous imbalance (Jensen)
    res = data["results"]
    assert np.all(
        np.asarray(res["constant_balance_bias"]) < np.asarray(res["constant_time_avg_rel_err"])
    )
    assert fig2.PAPER and notes_of(fig2) and fig2.PAPER_ORDER == 2.0
    rows = fig2.setup(fig2.Config.quick())
    assert any(r["quantity"] == "quick mode" for r in rows)
    assert all(set(r) == {"quantity", "paper", "ours", "why"} for r in rows)
    s = data["series"]
    n_runs = len(fig2.Config.quick().noise_spreads)
    sgd, gd = np.asarray(s["sgd_rel_err"]), np.asarray(s["gd_rel_err"])
    assert sgd.shape[0] == gd.shape[0] == n_runs
    assert sgd.shape[1] == len(s["sgd_step"]) and gd.shape[1] == len(s["gd_step"])
    # robust: SGD ends much closer to the Thm 5.2 balance than GD, in every run
    assert np.all(sgd[:, -1] < 0.5 * gd[:, -1])
    assert np.asarray(s["delta_entries"]).shape[1] == fig2.Config.quick().n_tracked
    assert not data["results"]["sgd_diverged"]
    assert data["figures"] == ["fig2.png"]
    assert (quick_run / "fig2" / "fig2.png").read_bytes()[:4] == b"\x89PNG"


def test_fig8_quick(quick_run: Path, metrics: Callable[[Path, str], dict[str, Any]]) -> None:
    data = metrics(quick_run, "fig8")
    claims = {c["id"]: c for c in data["claims"]}
    assert set(claims) == {
        "all_converge",
        "all_converge_bias_constant_lr",
        "library_flow_matches_theory",
    }
    assert claims["library_flow_matches_theory"]["value"] < 1e-10
    for cid in ("all_converge", "all_converge_bias_constant_lr"):
        assert "over 3 seeds" in claims[cid]["note"], claims[cid]
    assert len(data["results"]["worst_final_rel_err_per_seed"]) == fig8.Config.quick().n_seeds
    assert math.isfinite(claims["all_converge_bias_constant_lr"]["value"])
    assert fig8.PAPER and notes_of(fig8) and fig8.PAPER_ORDER == 8.0
    assert any(r["quantity"] == "η" for r in fig8.setup(fig8.Config.quick()))
    value = claims["all_converge"]["value"]
    assert isinstance(value, float) and math.isfinite(value)
    # holds with margin (quick, seeds 0-2: worst setting 0.063-0.066 < 0.1)
    assert claims["all_converge"]["holds"], claims["all_converge"]
    cfg = fig8.Config.quick()
    runs = data["results"]["runs"]
    assert len(runs) == len(cfg.lrs) + len(cfg.dims) + len(cfg.batch_sizes)
    assert {r["panel"] for r in runs} == set(fig8.PANELS)
    assert not data["results"]["any_diverged"]
    for r in runs:
        rel = np.asarray(data["series"][f"{r['panel']}={r['value']:g}"]["rel_err"])
        # robust: every run moves far towards the equilibrium (from ~1)
        assert rel[-1] < 0.3 * rel[0], r
    assert data["figures"] == ["fig8.png"]
    assert (quick_run / "fig8" / "fig8.png").read_bytes()[:4] == b"\x89PNG"


def test_gammas_closed_form_match_samples() -> None:
    """Γ_W = E[‖r‖²xxᵀ], Γ_U = E[‖x‖²rrᵀ] in closed form vs a large sample."""
    g = torch.Generator().manual_seed(0)
    n, d, m = 4, 6, 400_000
    U = 0.5 * torch.randn(1, n, d, generator=g, dtype=torch.float64)
    W = 0.5 * torch.randn(1, d, n, generator=g, dtype=torch.float64)
    sx = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)
    se = torch.tensor([[0.3, 1.0, 2.0, 0.7]], dtype=torch.float64)
    gw, gu = _two_layer.gammas(U, W, sx, se)
    x = torch.randn(m, n, generator=g, dtype=torch.float64) * sx.sqrt()
    y = x + torch.randn(m, n, generator=g, dtype=torch.float64) * se[0].sqrt()
    r = x @ (U[0] @ W[0]).T - y
    sw, su = two_layer_noise_factors(x, r, time="discrete", batch_size=1)  # second moments
    assert torch.allclose(gw[0], sw, rtol=0, atol=0.03 * float(sw.abs().max()))
    assert torch.allclose(gu[0], su, rtol=0, atol=0.03 * float(su.abs().max()))


def test_width_reduction_is_exact() -> None:
    """Training the factors in the span of the init equals training the wide net."""
    n, hidden = 5, 60
    U0, W0 = _two_layer.xavier_init(n, hidden, n, scale=0.5, seed=1)
    basis, _ = torch.linalg.qr(torch.cat([U0.T, W0], dim=1))
    sx = torch.linspace(0.5, 1.5, n, dtype=torch.float64)
    se = torch.ones(1, n, dtype=torch.float64)

    def train(U: torch.Tensor, W: torch.Tensor) -> _two_layer.TrainResult:
        return _two_layer.train_two_layer(
            U[None], W[None], sx, se, lr=0.05, batch_size=8, steps=200, record_every=50, seed=3
        )

    wide = train(U0, W0)
    red = train(U0 @ basis, basis.T @ W0)
    np.testing.assert_allclose(red.rel_err, wide.rel_err, rtol=1e-9)
    np.testing.assert_allclose(red.loss, wide.loss, rtol=1e-9)
    torch.testing.assert_close(red.U @ red.W, wide.U @ wide.W, rtol=1e-9, atol=1e-12)


def test_fig2_deterministic(tmp_path: Path) -> None:
    cfg = dataclasses.replace(fig2.Config.quick(), steps=300, gd_steps=50, n_records=30)
    a, b, c = (fig2.run(cfg, s, tmp_path) for s in (5, 5, 6))
    for key in ("sgd_rel_err", "gd_rel_err", "delta_entries"):
        np.testing.assert_array_equal(a["series"][key], b["series"][key])
    assert not np.array_equal(a["series"]["sgd_rel_err"], c["series"]["sgd_rel_err"])
    ids = [cl.id for cl in fig2.claims(a, cfg)]
    for cid in ("sgd_balance_rel_err", "gd_order_of_magnitude", "delta_decays"):
        assert cid in ids
    np.testing.assert_array_equal(a["series"]["constant_rel_err"], b["series"]["constant_rel_err"])


def test_fig8_deterministic(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        fig8.Config.quick(),
        lrs=(0.04, 0.06),
        dims=(10,),
        batch_sizes=(50,),
        base_steps=200,
        n_records=20,
    )
    a, b, c = (fig8.run(cfg, s, tmp_path) for s in (5, 5, 6))
    assert a["series"].keys() == b["series"].keys()
    for key in a["series"]:
        np.testing.assert_array_equal(a["series"][key]["rel_err"], b["series"][key]["rel_err"])
    assert not np.array_equal(a["series"]["lr=0.04"]["rel_err"], c["series"]["lr=0.04"]["rel_err"])
    claim = {c.id: c for c in fig8.claims(a, cfg)}["all_converge"]
    assert math.isfinite(float(claim.value or math.nan))


def test_time_averaged_balance_is_the_mean_of_the_recorded_deltas() -> None:
    """train_two_layer's ⟨Δ⟩ and ⟨‖WΓ_WWᵀ‖⟩ against the records of two shorter GD runs
    (full batch: deterministic, so the run to k steps is the first half of the run to 2k)."""
    U0, W0 = _two_layer.xavier_init(4, 5, 4, scale=1.0, seed=3)
    U0, W0 = U0[None], W0[None]
    sx, se = torch.ones(4, dtype=torch.float64), torch.full((1, 4), 0.5, dtype=torch.float64)
    kw = {"lr": 0.01, "batch_size": 1, "seed": 0, "full_batch": True}
    full = _two_layer.train_two_layer(
        U0, W0, sx, se, steps=40, record_every=20, average_from=20, **kw
    )
    halves = [
        _two_layer.train_two_layer(U0, W0, sx, se, steps=k, record_every=k, **kw) for k in (20, 40)
    ]
    deltas = [_two_layer.balance(h.U, h.W, sx, se) for h in halves]
    want = (deltas[0][0] + deltas[1][0]) / 2
    wgw = sum(torch.linalg.matrix_norm(d[1]) for d in deltas) / 2
    assert full.delta_mean is not None and full.wgw_norm_mean is not None
    torch.testing.assert_close(torch.as_tensor(full.delta_mean), want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.as_tensor(full.wgw_norm_mean), wgw, rtol=1e-12, atol=0)
    assert (
        _two_layer.train_two_layer(U0, W0, sx, se, steps=4, record_every=2, **kw).delta_mean is None
    )
