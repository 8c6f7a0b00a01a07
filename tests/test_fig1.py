"""Fig. 1: the claims hold under --quick, the figure and metrics are written, and the
experiment is deterministic for a seed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from noetherflow.experiments import METRICS_FILE, fig1, make_config
from noetherflow.experiments._base import notes_of


@pytest.fixture(scope="module")
def quick_run(reproduce: Callable[..., Path]) -> Path:
    return reproduce("fig1", strict=True)


def test_fig1_claims_hold_quick(quick_run: Path) -> None:
    data = json.loads((quick_run / "fig1" / METRICS_FILE).read_text(encoding="utf-8"))
    assert data["status"] == "ok", data["error"]
    claims = {c["id"]: c for c in data["claims"]}
    assert set(claims) == {
        "sgd_norm_monotone",
        "identity_exact",
        "library_charge_identity",
        "gf_norm_conserved",
    }
    assert all(c["holds"] for c in claims.values()), claims
    assert claims["sgd_norm_monotone"]["value"] == 0
    assert claims["identity_exact"]["value"] < 1e-10
    assert claims["library_charge_identity"]["value"] < 1e-10
    # the report contract of issue #17 (the paper's statement, every deviation, the history)
    assert fig1.PAPER and notes_of(fig1) and fig1.PAPER_ORDER == 1.0
    rows = fig1.setup(fig1.Config.quick())
    assert all(set(r) == {"quantity", "paper", "ours", "why"} for r in rows)
    assert any(r["quantity"] == "quick mode" for r in rows)
    assert claims["gf_norm_conserved"]["value"] < 1e-3
    assert data["config"]["n_steps"] == fig1.Config.quick().n_steps
    # SGD actually moved outward, GF stayed on its circle
    sgd_norm = np.asarray(data["series"]["sgd_norm"])
    assert sgd_norm[-1] > 1.05 * sgd_norm[0]
    assert np.all(np.diff(sgd_norm) >= 0)
    assert not data["results"]["sgd_divergence"]["diverged"]
    # discrete-time GD also never moves inward (Remark 4.4)
    assert data["results"]["gd_decreasing_steps"] == 0
    assert data["figures"] == ["fig1.png"]
    assert (quick_run / "fig1" / "fig1.png").read_bytes()[:4] == b"\x89PNG"
    md = (quick_run / "report.md").read_text(encoding="utf-8")
    for cid in claims:
        assert cid in md


def test_fig1_library_identity_can_fail(tmp_path: Path) -> None:
    """The library identity is a real check: a wrong η in the prediction breaks it."""
    import dataclasses

    cfg = dataclasses.replace(make_config(fig1, quick=True), n_steps=20)
    x, y, _ = fig1._data(cfg, 0)
    out = fig1._train(cfg, x, y, 1, method="sgd")
    good = np.abs(out["charge"][1:] - out["predicted_charge"]) / out["charge"][:-1]
    assert good.max() < 1e-12
    wrong = out["charge"][:-1] + 1.1 * cfg.lr**2 * out["grad_sq"]
    assert (np.abs(out["charge"][1:] - wrong) / out["charge"][:-1]).max() > 1e-6


def test_fig1_deterministic(tmp_path: Path) -> None:
    cfg = make_config(fig1, quick=True)
    a = fig1.run(cfg, 3, tmp_path)
    b = fig1.run(cfg, 3, tmp_path)
    c = fig1.run(cfg, 4, tmp_path)
    np.testing.assert_array_equal(a["series"]["sgd_theta"], b["series"]["sgd_theta"])
    assert not np.array_equal(a["series"]["sgd_theta"], c["series"]["sgd_theta"])
    assert all(cl.holds for cl in fig1.claims(c, cfg))
