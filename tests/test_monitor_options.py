"""``NoetherMonitor(distance=DistanceOptions(...), logging=LogOptions(...))`` (issue #27).

The option objects give the rows of the old loose keywords; a loose keyword beside its
option object, or an unknown one, is a TypeError naming the field.
"""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf


def _problem() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    return m, syms, torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 2).double()


def _rows(**kw: object) -> list[dict[str, np.ndarray]]:
    m, syms, x, y = _problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=1e-3)
    mon = nf.NoetherMonitor(m, syms, every=1, optimizer=opt, batch_size=16, **kw)
    rows = []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        rows.append(row)
        opt.step()
    mon.close()
    return rows


def test_the_signature_is_short() -> None:
    params = inspect.signature(nf.NoetherMonitor.__init__).parameters
    assert {"distance", "logging"} <= set(params)
    assert not {"distance_every", "log_dir", "progress", "solver_options"} & set(params)
    assert len(params) <= 22


def test_options_give_the_rows_of_the_old_keywords(tmp_path) -> None:
    solve = nf.SolveOptions(tol=1e-13)
    new = _rows(
        distance=nf.DistanceOptions(every=2, mode="track", solve_every=4, tol=1e-6, solver=solve),
        logging=nf.LogOptions(log_dir=tmp_path / "a", progress=False, tensorboard=False),
    )
    with pytest.warns(FutureWarning, match=r"distance=nf.DistanceOptions\(every=\.\.\.,") as got:
        old = _rows(
            distance_every=2,
            distance_mode="track",
            solve_every=4,
            distance_tol=1e-6,
            solver_options={"tol": 1e-13},
            log_dir=tmp_path / "b",
            progress=False,
            tensorboard=False,
        )
    assert len(got) == 1  # one warning per monitor, naming every old keyword
    assert (tmp_path / "a" / "history.csv").exists() and (tmp_path / "b" / "history.csv").exists()
    for a, b in zip(new, old, strict=True):
        for k in ("flow/rescaling0", "distance/rescaling0", "distance_exact"):
            np.testing.assert_array_equal(a[k], b[k])
    exact = [float(r["distance_exact"]) for r in new]
    assert exact[0] == 1 and exact[4] == 1 and exact[2] == 0, exact
    assert np.isnan(new[1]["distance/rescaling0"]).all()


def test_distance_false_and_no_warm_start() -> None:
    rows = _rows(distance=False, logging=nf.LogOptions(progress=False))
    assert "distance/rescaling0" not in rows[0]
    cold = _rows(
        distance=nf.DistanceOptions(every=1, mode="solve", warm_start=False),
        logging=nf.LogOptions(progress=False),
    )
    warm = _rows(
        distance=nf.DistanceOptions(every=1, mode="solve"), logging=nf.LogOptions(progress=False)
    )
    for a, b in zip(cold, warm, strict=True):
        np.testing.assert_allclose(
            a["distance/rescaling0"], b["distance/rescaling0"], rtol=1e-8, atol=1e-12
        )


def test_wrong_calls_name_the_field() -> None:
    m, syms, _, _ = _problem()
    kw = {"lr": 0.1, "batch_size": 8}
    with pytest.raises(TypeError, match=r"distance_every= given beside distance=Distance"):
        nf.NoetherMonitor(m, syms, **kw, distance=nf.DistanceOptions(), distance_every=10)
    with pytest.raises(TypeError, match=r"logging=LogOptions\(progress=\.\.\.\)"):
        nf.NoetherMonitor(m, syms, **kw, logging=nf.LogOptions(), progress=False)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['distance_every_n'\]"):
        nf.NoetherMonitor(m, syms, **kw, distance_every_n=10)
    with pytest.raises(TypeError, match=r"\['init2'\] are not solver options"):
        nf.NoetherMonitor(m, syms, **kw, solver_options={"init2": None})
    with pytest.raises(ValueError, match=r"distance_mode='fast' is not supported"):
        nf.DistanceOptions(mode="fast")
    with pytest.raises(ValueError, match=r"unknown \['xml'\]"):
        nf.LogOptions(formats=("csv", "xml"))
    with pytest.raises(ValueError, match=r"distance_every=3 must be a positive multiple"):
        nf.NoetherMonitor(m, syms, **kw, every=2, distance=nf.DistanceOptions(every=3))


def test_old_keywords_warn_with_the_new_spelling() -> None:
    """Each old keyword: a FutureWarning at the caller's line naming the option object."""
    m, syms, _, _ = _problem()
    kw = {"lr": 0.1, "batch_size": 8}
    with pytest.warns(FutureWarning) as got:
        nf.NoetherMonitor(m, syms, **kw, distance_every=20, progress=False, solver_options={})
    (w,) = got
    assert str(w.message) == (
        "NoetherMonitor(distance_every=..., progress=..., solver_options=...) is deprecated: "
        "pass distance=nf.DistanceOptions(every=..., solver=nf.SolveOptions(...)), "
        "logging=nf.LogOptions(progress=...) instead; the old form will be removed in a "
        "future release."
    )
    assert w.filename == __file__  # the warning points at the user's call
    for name, value, new in [
        ("distance_mode", "solve", "distance=nf.DistanceOptions(mode=...)"),
        ("solve_every", 200, "distance=nf.DistanceOptions(solve_every=...)"),
        ("distance_tol", 1e-3, "distance=nf.DistanceOptions(tol=...)"),
        ("distance_sweeps", None, "distance=nf.DistanceOptions(sweeps=...)"),
        ("log_dir", None, "logging=nf.LogOptions(log_dir=...)"),
        ("formats", ("csv",), "logging=nf.LogOptions(formats=...)"),
        ("tensorboard", False, "logging=nf.LogOptions(tensorboard=...)"),
        ("total", 5, "logging=nf.LogOptions(total=...)"),
    ]:
        with pytest.warns(FutureWarning, match=re.escape(f"pass {new} instead")) as got:
            nf.NoetherMonitor(m, syms, **kw, logging=None, **{name: value})
        assert got[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling: no warning
        nf.NoetherMonitor(
            m, syms, **kw, distance=nf.DistanceOptions(every=20), logging=nf.LogOptions()
        )


def test_integrations_warn_when_built() -> None:
    """The callbacks take the old keywords apart at construction, warning there."""
    pytest.importorskip("lightning")
    from noetherflow.integrations.lightning import NoetherCallback

    _, syms, _, _ = _problem()
    with pytest.warns(
        FutureWarning, match=r"NoetherCallback\(log_dir=\.\.\., distance_every"
    ) as got:
        cb = NoetherCallback(syms, log_dir="runs/x", distance_every=20)
    assert got[0].filename == __file__
    assert cb.log_options == nf.LogOptions(log_dir="runs/x")
    assert cb.distance == nf.DistanceOptions(every=20)
    with pytest.raises(TypeError, match=r"NoetherCallback: progress= given beside logging="):
        NoetherCallback(syms, logging=nf.LogOptions(), progress=False)
