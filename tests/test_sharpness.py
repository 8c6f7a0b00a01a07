"""Sharpness: Hessian-vector products, Hutchinson trace and power iteration against the exact
Hessian of a small float64 model (torch.func.hessian)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from noetherflow.sharpness import hessian, hessian_trace, hvp, sharpness, top_eigenvalue

DT = torch.float64
CE = nn.functional.cross_entropy


def problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).to(DT)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 3, generator=g, dtype=DT)
    y = torch.randint(0, 2, (20,), generator=g)
    return m, x, y


@pytest.mark.parametrize("method", ["fwd-rev", "rev-rev"])
def test_hvp_matches_exact_hessian(method: str) -> None:
    m, x, y = problem()
    H = hessian(m, CE, x, y)
    assert torch.allclose(H, H.T, atol=1e-12)
    v = torch.randn(H.shape[0], dtype=DT, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(hvp(m, CE, x, y, v, method=method), H @ v, rtol=0, atol=1e-12)


def test_keyword_inputs_give_the_same_numbers() -> None:
    """A dict batch (keyword inputs, e.g. split off a Lightning dict batch) as positional."""

    class Kw(nn.Module):
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return self.m(x)

    m, x, y = problem()
    kw = Kw(m)
    a = top_eigenvalue(m, CE, x, y, tol=1e-12, max_iter=500, seed=0)
    b = top_eigenvalue(kw, CE, {"x": x}, y, tol=1e-12, max_iter=500, seed=0)
    assert a.value == pytest.approx(b.value, rel=1e-12)
    t1 = hessian_trace(m, CE, x, y, n_samples=8, seed=1)
    t2 = hessian_trace(kw, CE, {"x": x}, y, n_samples=8, seed=1)
    assert t1.value == pytest.approx(t2.value, rel=1e-12)


def test_hutchinson_agrees_with_exact_trace() -> None:
    m, x, y = problem()
    H = hessian(m, CE, x, y)
    exact = float(torch.trace(H))
    est = hessian_trace(m, CE, x, y, n_samples=2000, seed=0, chunk_size=250)
    # Rademacher variance per sample is 2 Σ_{i≠j} H_ij²; the reported error must match it
    off = float(H.square().sum() - H.diagonal().square().sum())
    assert est.std_error == pytest.approx(math.sqrt(2 * off / 2000), rel=0.15)
    assert abs(est.value - exact) < 4 * est.std_error
    assert abs(est.value - exact) < 0.1 * abs(exact)


def test_hutchinson_is_seeded_and_chunking_invariant() -> None:
    m, x, y = problem()
    a = hessian_trace(m, CE, x, y, n_samples=12, seed=3, chunk_size=1)
    b = hessian_trace(m, CE, x, y, n_samples=12, seed=3, chunk_size=5)
    c = hessian_trace(m, CE, x, y, n_samples=12, seed=4)
    assert a.value == pytest.approx(b.value, rel=1e-12, abs=1e-14)
    assert a.value != c.value


def test_hutchinson_exact_for_diagonal_hessian() -> None:
    # a linear model with squared loss on orthogonal inputs has a diagonal Hessian: v ᵀHv = Tr H
    lin = nn.Linear(4, 1, bias=False).to(DT)
    x = torch.eye(4, dtype=DT) * torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=DT)[:, None]
    y = torch.zeros(4, 1, dtype=DT)
    est = hessian_trace(lin, nn.functional.mse_loss, x, y, n_samples=3)
    assert est.value == pytest.approx(2 * (1 + 4 + 9 + 16) / 4, rel=1e-12)
    assert est.std_error == pytest.approx(0.0, abs=1e-12)


def test_power_iteration_finds_largest_magnitude_eigenvalue() -> None:
    m, x, y = problem()
    ev = torch.linalg.eigvalsh(hessian(m, CE, x, y))
    top = ev[ev.abs().argmax()]
    est = top_eigenvalue(m, CE, x, y, tol=1e-12, max_iter=2000, seed=0)
    assert est.converged
    assert est.value == pytest.approx(float(top), rel=1e-6)
    H = hessian(m, CE, x, y)
    assert torch.allclose(H @ est.vector, est.value * est.vector, atol=1e-4)


def test_sharpness_leaves_model_and_buffers_untouched() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).to(DT)
    x = torch.randn(16, 3, dtype=DT)
    y = torch.randint(0, 2, (16,))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    res = sharpness(m, CE, x, y, n_samples=4, max_iter=5)
    assert math.isfinite(res.trace.value) and math.isfinite(res.top.value)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_errors_state_the_fix() -> None:
    m, x, y = problem()
    with pytest.raises(ValueError, match="flat vector of 32"):
        hvp(m, CE, x, y, torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="rev-rev"):
        hessian_trace(m, CE, x, y, method="bogus")
    with pytest.raises(ValueError, match="n_samples"):
        hessian_trace(m, CE, x, y, n_samples=0)
