"""eq15: the autograd Hessian trace against Prop. 5.3's corrected closed form (the theory
module, itself tested against torch's Hessian), the variance schemes, and a quick run's claims:
the corrected forms hold, the printed ones fail by the derived factors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from noetherflow.experiments import eq15
from noetherflow.experiments._base import notes_of
from noetherflow.theory.ziyin2024 import two_layer_hessian_trace

DT = torch.float64


def test_hessian_traces_match_the_closed_form() -> None:
    g = torch.Generator().manual_seed(0)
    U = torch.randn(5, 3, 4, generator=g, dtype=DT)
    W = torch.randn(5, 4, 6, generator=g, dtype=DT)
    a = torch.randn(6, 6, generator=g, dtype=DT)
    sx = a @ a.T + torch.eye(6, dtype=DT)  # a full, not diagonal, Σ_x
    got = eq15.hessian_traces(U, W, sx)
    want = torch.tensor([two_layer_hessian_trace(U[i], W[i], sx) for i in range(5)], dtype=DT)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert eq15.hessian_trace(U[0], W[0], sx) == pytest.approx(float(want[0]), rel=1e-12)


def test_variance_schemes() -> None:
    assert eq15.variances("kaiming_paper", d_x=4, d=2, d_y=3) == (1.0, 0.25)
    assert eq15.variances("kaiming_fan_in", d_x=4, d=2, d_y=3) == (0.5, 0.25)
    assert eq15.variances("xavier_paper", d_x=4, d=2, d_y=3) == (0.2, 1 / 6)
    with pytest.raises(ValueError, match="scheme='he'; expected"):
        eq15.variances("he", d_x=4, d=2, d_y=3)


def test_quick_claims(tmp_path: Path) -> None:
    cfg = dataclasses.replace(eq15.Config.quick(), n_inits=600)
    res = eq15.run(cfg, 0, tmp_path)
    claims: dict[str, Any] = {c.id: c for c in eq15.claims(res, cfg)}
    assert claims["s_init_corrected"].holds and claims["fan_in_kaiming_no_flattening"].holds
    assert claims["kaiming_flattens_at_equal_widths"].holds
    # the printed forms fail, by the factors the derivations give
    printed = claims["s_init_printed_eq15"]
    assert not printed.holds and printed.kind.value == "printed"
    assert printed.value == pytest.approx(1 - cfg.d_y / cfg.d_x, abs=0.02)
    remark = claims["kaiming_remark_as_printed"]
    assert not remark.holds and remark.value == pytest.approx((cfg.remark_dim + 1) / 2 - 1, abs=0.1)
    assert res["remark"]["S_end"] == pytest.approx(res["remark"]["S_end_formula"], rel=1e-12)
    assert all(c.why for c in claims.values())
    assert eq15.PAPER and notes_of(eq15) and eq15.setup(cfg)
