"""thm52-wd: SGD with weight decay in train_two_layer against autograd on the same minibatch,
the ridges of the three forms, and a short run's verdicts (corrected holds, printed fail)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from noetherflow.experiments import _two_layer, thm52_wd
from noetherflow.experiments._base import notes_of

DT = torch.float64


def test_weight_decay_step_matches_autograd() -> None:
    g = torch.Generator().manual_seed(1)
    U0 = torch.randn(2, 3, 4, generator=g, dtype=DT)
    W0 = torch.randn(2, 4, 3, generator=g, dtype=DT)
    sx = torch.tensor([0.5, 1.0, 1.5], dtype=DT)
    se = torch.ones(2, 3, dtype=DT)
    lr, S, gamma, seed = 0.03, 5, 0.1, 7
    kw = {"lr": lr, "batch_size": S, "steps": 1, "record_every": 1, "seed": seed}
    got = _two_layer.train_two_layer(U0, W0, sx, se, weight_decay=gamma, **kw)
    gen = torch.Generator().manual_seed(seed)  # the draws of train_two_layer's first chunk
    xs = torch.randn((1, 2, S, 3), generator=gen, dtype=DT) * sx.sqrt()
    es = torch.randn((1, 2, S, 3), generator=gen, dtype=DT) * se.sqrt()[:, None, :]
    U, W = U0.clone().requires_grad_(), W0.clone().requires_grad_()
    res = xs[0] @ W.transpose(-2, -1) @ U.transpose(-2, -1) - xs[0] - es[0]
    loss = (res**2).sum(-1).mean(-1).sum() + gamma * ((U**2).sum() + (W**2).sum())
    gU, gW = torch.autograd.grad(loss, (U, W))
    torch.testing.assert_close(got.U, U0 - lr * gU, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got.W, W0 - lr * gW, rtol=1e-12, atol=1e-14)


def test_ridges_of_the_three_forms() -> None:
    cfg = thm52_wd.Config()
    r = thm52_wd.ridges(cfg)
    g, eta, S = cfg.weight_decay, cfg.lr, cfg.batch_size
    assert r["corrected"] == pytest.approx(g * (1 - eta * g) * S / eta, rel=1e-12)
    assert r["app_c"] == pytest.approx(g / eta) and r["main_text"] == pytest.approx(2 * g)


def test_short_run_tells_the_forms_apart(tmp_path: Path) -> None:
    cfg = dataclasses.replace(thm52_wd.Config.quick(), steps=16_000, n_records=160, n_seeds=2)
    res = thm52_wd.run(cfg, 0, tmp_path)
    claims = {c.id: c for c in thm52_wd.claims(res, cfg)}
    assert claims["wd_ratio_corrected"].holds, claims["wd_ratio_corrected"]
    assert not claims["wd_ratio_app_c_printed"].holds
    assert not claims["wd_ratio_main_text_printed"].holds
    assert all(c.why for c in claims.values()) and notes_of(thm52_wd)
