"""Fig. 3 and Fig. 7: quick runs produce their metrics and claims, are deterministic for a
seed, and the closed forms they rely on agree with autodiff."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.experiments import METRICS_FILE, fig3, fig7, make_config
from noetherflow.experiments._base import notes_of
from noetherflow.sharpness import hessian
from noetherflow.theory.ziyin2024 import two_layer_hessian_trace


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny matmuls: one intra-op thread is much faster than two on a loaded machine (and
    it is what the harness uses)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --------------------------------------------------------------------------------------
# Fig. 3
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fig3_quick(reproduce: Callable[..., Path]) -> dict:
    out = reproduce("fig3")
    data = json.loads((out / "fig3" / METRICS_FILE).read_text(encoding="utf-8"))
    data["_out"] = str(out)
    return data


def test_fig3_quick_metrics_and_claims(fig3_quick: dict) -> None:
    data = fig3_quick
    assert data["status"] == "ok", data.get("error")
    cfg = fig3.Config.quick()
    s = data["series"]
    keys = [
        "phi_x",
        "sgd_norm_ratio",
        "theory_norm_ratio",
        "gdwd_norm_ratio",
        "sgd_sharpness",
        "theory_sharpness",
        "gdwd_sharpness",
    ]
    lengths = {k: len(s[k]) for k in keys}
    assert set(lengths.values()) == {len(cfg.phi_x)} and len(cfg.phi_x) >= 7
    assert min(s["phi_x"]) == pytest.approx(0.2) and max(s["phi_x"]) == pytest.approx(1.8)
    assert (s["d"], s["d_x"], s["d_y"]) == (cfg.hidden, cfg.dim, cfg.dim)
    for k in keys:
        assert np.all(np.isfinite(np.asarray(s[k], dtype=float))), k
    claims = {c["id"]: c for c in data["claims"]}
    assert set(claims) == {
        "sgd_norm_ratio_theory",
        "balanced_only_isotropic",
        "gd_wd_balanced",
        "sharpness_theory",
        "sgd_norm_ratio_theory_constant_lr",
        "gap_shrinks_with_lr_constant",
        "label_noise_sgd_sharper",
        "label_noise_sharpness_theory",
    }
    assert fig3.PAPER and notes_of(fig3) and fig3.PAPER_ORDER == 3.0
    rows = {r["quantity"]: r for r in fig3.setup(cfg)}
    assert rows["GD + WD γ"]["paper"] == "1e-4" and rows["η"]["paper"] == "0.1"
    # with anisotropic label noise SGD is sharper than the balanced solution at the ends
    lab = np.asarray(s["label_noise_sgd_sharpness"]) / np.asarray(
        s["label_noise_balanced_sharpness"]
    )
    assert lab[0] > 1.05 and lab[-1] > 1.05
    # robust at the quick size (measured margins: ≥ 2× below the thresholds over seeds)
    for cid in ("balanced_only_isotropic", "gd_wd_balanced", "sharpness_theory"):
        assert claims[cid]["holds"], claims[cid]
    for c in claims.values():
        assert "3 seeds" in c["note"], c
    assert claims["sgd_norm_ratio_theory"]["value"] < 0.1
    # SGD's ratio follows Thm 5.2: unbalanced at the ends, balanced at φ = 1
    ratio = np.asarray(s["sgd_norm_ratio"])
    assert ratio[0] > 1.4 and ratio[-1] > 1.4 and abs(ratio[len(ratio) // 2] - 1) < 0.05
    # SGD is flatter than the weight-decay solution away from φ = 1
    sr = np.asarray(s["sharpness_ratio"])
    assert sr[0] < 0.95 and sr[-1] < 0.95
    assert data["figures"] == ["fig3.png", "fig3_relaxation.png"]
    out = Path(data["_out"])
    assert (out / "fig3" / "fig3.png").read_bytes()[:4] == b"\x89PNG"


def test_fig3_theory_closed_forms() -> None:
    """The module docstring's formulas: ratio 1/√(φ(2−φ)), S_SGD = 4n Tr Σ_x^{1/2}."""
    cfg = dataclasses.replace(fig3.Config.quick(), gd_weight_decay=1e-9)
    n = cfg.dim
    for phi in (0.2, 0.7, 1.0, 1.6):
        th = fig3.theory(cfg, phi)
        assert th["sgd_ratio"] == pytest.approx(1.0 / np.sqrt(phi * (2.0 - phi)), rel=1e-9)
        tr_sqrt = n / 2 * (np.sqrt(phi) + np.sqrt(2.0 - phi))
        assert th["sgd_sharpness"] == pytest.approx(4.0 * n * tr_sqrt, rel=1e-9)
        assert th["gd_wd_ratio"] == pytest.approx(1.0, rel=1e-9)
        assert th["gd_wd_sharpness"] == pytest.approx(4.0 * n * n, rel=1e-6)
        # the ridge of weight decay 1e-4 moves the prediction by a small amount only
        assert th["sgd_wd_ratio"] == pytest.approx(th["sgd_ratio"], rel=0.03)


def test_fig3_deterministic(tmp_path: Path) -> None:
    small = dataclasses.replace(
        fig3.Config.quick(), phi_x=(0.4, 1.0), steps=60, gd_steps=60, n_records=10
    )
    a = fig3.run(small, 3, tmp_path)
    b = fig3.run(small, 3, tmp_path)
    c = fig3.run(small, 4, tmp_path)
    for k in ("sgd_norm_ratio", "sgdwd_norm_ratio", "gdwd_norm_ratio", "sgd_sharpness"):
        np.testing.assert_array_equal(a["series"][k], b["series"][k])
    assert not np.array_equal(a["series"]["sgd_norm_ratio"], c["series"]["sgd_norm_ratio"])
    assert len(fig3.claims(a, small)) == 8
    # one row per seed: different inits and minibatches
    per_seed = np.asarray(a["series"]["sgd_norm_ratio_seeds"])
    assert per_seed.shape == (small.n_seeds, 2) and small.n_seeds >= 3
    assert not np.allclose(per_seed[0], per_seed[1])
    np.testing.assert_allclose(a["series"]["sgd_norm_ratio"], per_seed.mean(0))
    np.testing.assert_array_equal(
        a["series"]["label_noise_sgd_sharpness"], b["series"]["label_noise_sgd_sharpness"]
    )


def test_fig3_label_noise_closed_form() -> None:
    """Σ_x = I, Σ_ε = diag(φ, 2 − φ): W = M, U = M⁻¹ with MᵀM = Σ_ε^{1/2}, so
    S_SGD/S_balanced = (Tr Σ_ε^{1/2} + Tr Σ_ε^{-1/2}) / (2n) ≥ 1 (by hand, not theory)."""
    cfg = fig3.Config.quick()
    for phi in (0.2, 0.6, 1.0, 1.5):
        th = fig3.label_noise_theory(cfg, phi)
        by_hand = (
            (np.sqrt(phi) + np.sqrt(2 - phi)) / 2 + (1 / np.sqrt(phi) + 1 / np.sqrt(2 - phi)) / 2
        ) / 2
        assert th["sgd_sharpness"] / th["balanced_sharpness"] == pytest.approx(by_hand, rel=1e-9)
        assert th["balanced_sharpness"] == pytest.approx(4.0 * cfg.dim**2, rel=1e-9)


def test_hessian_trace_closed_form_matches_autodiff() -> None:
    """Prop 5.3's closed form (used for the measured sharpness) against nf.hessian_trace."""
    torch.manual_seed(0)
    n, d, N = 4, 6, 500
    sx = torch.tensor(fig3.input_variances(0.5, n), dtype=torch.float64)
    x = torch.randn(N, n, dtype=torch.float64) * sx.sqrt()
    y = x + torch.randn(N, n, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(n, d, bias=False), nn.Linear(d, n, bias=False)).double()
    W, U = model[0].weight.detach(), model[1].weight.detach()

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out - target).pow(2).sum(dim=1).mean()  # ℓ = ‖UWx − y‖², paper eq. (12)

    sigma_hat = x.T @ x / N
    closed = two_layer_hessian_trace(U, W, sigma_hat, reduction="sum")
    exact = float(torch.trace(hessian(model, loss_fn, x, y)))
    assert closed == pytest.approx(exact, rel=1e-10)
    est = nf.hessian_trace(model, loss_fn, x, y, n_samples=200, seed=1, chunk_size=100)
    assert abs(est.value - closed) < 5.0 * est.std_error + 1e-9 * closed
    # width reduction: an orthonormal change of hidden basis leaves the trace unchanged
    q, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))
    assert two_layer_hessian_trace(U @ q, q.T @ W, sigma_hat) == pytest.approx(closed, rel=1e-12)


# --------------------------------------------------------------------------------------
# Fig. 7
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fig7_quick(reproduce: Callable[..., Path]) -> dict:
    out = reproduce("fig7", strict=True)
    return json.loads((out / "fig7" / METRICS_FILE).read_text(encoding="utf-8"))


def test_fig7_quick_claims_hold(fig7_quick: dict) -> None:
    data = fig7_quick
    assert data["status"] == "ok", data.get("error")
    claims = {c["id"]: c for c in data["claims"]}
    assert set(claims) == {"sgd_total_norm_monotone", "gd_norm_flat", "netB_each_layer_monotone"}
    assert all(c["holds"] for c in claims.values()), claims
    stats = data["results"]["stats"]
    for key, st in stats.items():
        # the exact identity ‖θ'‖² = ‖θ‖² + η²‖g‖² holds to round-off for GD and SGD alike
        assert st["identity_max_rel_residual"] < 1e-12, key
        assert st["total_decreasing_steps"] == 0, key
        assert not st["divergence"]["diverged"], key
    assert stats["netA_sgd"]["total_growth"] > 0.02 and stats["netB_sgd"]["total_growth"] > 0.02
    # Net-A has no layer-wise symmetry: its layer norms are not monotone under SGD
    assert stats["netA_sgd"]["u_decreasing_steps"] > 0
    assert stats["netA_sgd"]["w_decreasing_steps"] > 0
    assert "netA_sgd_layers" in data["results"]
    s = data["series"]
    assert len(s["netA_sgd_norm"]) == len(s["step"])
    assert data["figures"] == ["fig7.png"]


def test_fig7_nets_are_scale_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, 5, generator=g, dtype=torch.float64)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    for net in ("A", "B"):
        f = fig7.forward(net, u, w, x)
        torch.testing.assert_close(fig7.forward(net, 3.0 * u, 3.0 * w, x), f)
    # Net-B: each layer alone; Net-A: not
    fb = fig7.forward("B", u, w, x)
    torch.testing.assert_close(fig7.forward("B", 2.0 * u, w, x), fb)
    torch.testing.assert_close(fig7.forward("B", u, 0.5 * w, x), fb)
    fa = fig7.forward("A", u, w, x)
    assert not torch.allclose(fig7.forward("A", 2.0 * u, w, x), fa)


def test_fig7_deterministic(tmp_path: Path) -> None:
    cfg = dataclasses.replace(make_config(fig7, quick=True), n_steps=50, n_records=10)
    a = fig7.run(cfg, 3, tmp_path)
    b = fig7.run(cfg, 3, tmp_path)
    c = fig7.run(cfg, 4, tmp_path)
    np.testing.assert_array_equal(a["series"]["netA_sgd_norm"], b["series"]["netA_sgd_norm"])
    np.testing.assert_array_equal(a["series"]["netB_gd_norm"], b["series"]["netB_gd_norm"])
    assert not np.array_equal(a["series"]["netA_sgd_norm"], c["series"]["netA_sgd_norm"])
    assert len(fig7.claims(a, cfg)) == 3
    assert fig7.setup(cfg)


def test_fig7_module_is_the_functional_net_and_trains_through_the_library() -> None:
    """ScaleInvariantNet is forward(); its symmetries hold; run_sgd keeps every charge's
    exact step identity (nf.exact_step_charges) to round-off, float64."""
    g = torch.Generator().manual_seed(1)
    u = torch.randn(1, 4, generator=g, dtype=torch.float64)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    x = torch.randn(9, 3, generator=g, dtype=torch.float64)
    for net in ("A", "B"):
        model = fig7.ScaleInvariantNet(net, u, w)
        torch.testing.assert_close(model(x), fig7.forward(net, u, w, x), rtol=0, atol=0)
        syms = model.symmetries()
        assert set(syms.names) == ({"total"} if net == "A" else {"total", "u", "w"})
        assert all(r.verified for r in syms.verify(model, x)), net
        cfg = dataclasses.replace(make_config(fig7, quick=True), n_steps=30, n_records=10)
        for method in ("sgd", "gd"):
            out = fig7._train_one(cfg, 2, net, method)
            assert len(out["u2"]) == 31 and out["identity_residual"] < 1e-12, (net, method)
            total = out["u2"] + out["w2"]
            assert np.all(np.diff(total) > 0), (net, method)
