"""The batched closed-form simulators of the reproductions (fig2/fig8, fig3, thm54, fig6/fig9)
against noetherflow.train, step for step: the same minibatches fed to ``run_sgd(sampler=...)``
on an ``nn.Module`` give the same weights in float64 (issue #13: simulators that stay for
speed are tested once against the library's integrators)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from noetherflow.experiments import _nonlinear as nl
from noetherflow.experiments import _two_layer, fig3, thm54
from noetherflow.train import GeometricDecay, lr_sequence, run_sgd

DT = torch.float64


def _replay(batches: list[tuple[torch.Tensor, torch.Tensor]]):
    def sampler(step: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        return batches[step]

    return sampler


def _weights_after_each_step(model: nn.Module, names: list[str]):
    seen: list[list[torch.Tensor]] = []

    def callback(step: int, m: nn.Module) -> None:
        params = dict(m.named_parameters())
        seen.append([params[n].detach().clone() for n in names])

    return seen, callback


def test_fig2_train_two_layer_equals_run_sgd() -> None:
    n, d, S, steps, seed = 4, 6, 5, 40, 11
    U0, W0 = _two_layer.xavier_init(n, d, n, scale=1.0, seed=2)
    sx = torch.linspace(0.5, 1.5, n, dtype=DT)
    se = torch.tensor([[0.3, 1.0, 2.0, 0.7]], dtype=DT)
    sim = _two_layer.train_two_layer(
        U0[None],
        W0[None],
        sx,
        se,
        lr=0.05,
        batch_size=S,
        steps=steps,
        record_every=1,
        seed=seed,
        lr_final=0.01,
        decay_frac=0.5,
        chunk=steps,
    )
    # the simulator's stream: one chunk of inputs, then one of label noise
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn((steps, 1, S, n), generator=gen, dtype=DT) * sx.sqrt()
    es = torch.randn((steps, 1, S, n), generator=gen, dtype=DT) * se.sqrt()[:, None, :]
    batches = [(xs[k, 0], xs[k, 0] + es[k, 0]) for k in range(steps)]
    model, _ = _two_layer.two_layer_module(U0, W0)
    seen, callback = _weights_after_each_step(model, ["1.weight", "0.weight"])
    X_eval = torch.randn(8, n, dtype=DT)
    run_sgd(
        model,
        _two_layer.summed_sq_loss,
        X_eval,
        X_eval,
        lr=0.05,
        batch_size=S,
        steps=steps,
        schedule=GeometricDecay(steps, decay_frac=0.5, final_lr=0.01),
        sampler=_replay(batches),
        callback=callback,
    )
    rel = [float(_two_layer.rel_balance_error(U[None], W[None], sx, se)[0]) for U, W in seen]
    np.testing.assert_allclose(sim.rel_err[0], rel, rtol=1e-11, atol=0)
    torch.testing.assert_close(sim.U[0], seen[-1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(sim.W[0], seen[-1][1], rtol=0, atol=1e-12)
    # a real check: another learning rate gives other weights
    assert float((sim.U[0] - U0).abs().max()) > 1e-3


def test_thm54_train_deep_linear_equals_run_sgd() -> None:
    cfg = dataclasses.replace(thm54.Config.quick(), steps=30, n_runs=1, n_records=30)
    V, sx, se = thm54.problem(cfg, 1)
    depth, seed = 3, 5
    sim = thm54.train_deep_linear(cfg, V, sx, se, depth, seed)
    # replay the simulator's generator: the inits, then one chunk of x, then of ε
    k = cfg.rank
    dims = [cfg.d_x] + [k] * (depth - 1) + [cfg.d_y]
    gen = torch.Generator().manual_seed(seed)
    Ws = [
        torch.randn(1, dims[i + 1], dims[i], generator=gen, dtype=DT)
        * (cfg.init_scale / math.sqrt(dims[i]))
        for i in range(depth)
    ]
    lx, le = torch.linalg.cholesky(sx), torch.linalg.cholesky(se)
    S = cfg.batch_size
    xs = torch.randn((cfg.steps, 1, S, cfg.d_x), generator=gen, dtype=DT) @ lx.T
    ys = xs @ V.T + torch.randn((cfg.steps, 1, S, cfg.d_y), generator=gen, dtype=DT) @ le.T
    layers = [nn.Linear(dims[i], dims[i + 1], bias=False, dtype=DT) for i in range(depth)]
    with torch.no_grad():
        for layer, w in zip(layers, Ws, strict=True):
            layer.weight.copy_(w[0])
    model = nn.Sequential(*layers)
    run_sgd(
        model,
        _two_layer.summed_sq_loss,
        xs[0, 0],
        ys[0, 0],
        lr=cfg.lr,
        batch_size=S,
        steps=cfg.steps,
        schedule=GeometricDecay(cfg.steps, decay_frac=cfg.decay_frac, final_lr=cfg.lr_final),
        sampler=_replay([(xs[t, 0], ys[t, 0]) for t in range(cfg.steps)]),
    )
    for layer, w in zip(layers, sim["weights"], strict=True):
        torch.testing.assert_close(layer.weight.detach(), w[0], rtol=0, atol=1e-12)


class _Act(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.f = nl.activation(name)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.f(h)[0]


@pytest.mark.parametrize("act", ["tanh", "relu", "swish"])
def test_nonlinear_train_equals_run_sgd(act: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nl, "_TRAIN_DTYPE", DT)  # compare the update rule in float64
    n, h, S, steps, seed = 4, 7, 3, 25, 9
    U0, W0 = nl.init_weights(n, h, scale=1.0, seed=1)
    se = nl.noise_variances(n, 5.0)
    lrs = lr_sequence(GeometricDecay(steps, decay_frac=0.5, final_lr=0.01), 0.05, steps)
    sim = nl.train(U0, W0, [act], se, lrs=lrs, batch_size=S, seed=seed, chunk=steps)
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn((steps, S, n), generator=gen, dtype=DT)
    ys = xs + torch.randn((steps, S, n), generator=gen, dtype=DT) * se.sqrt()
    first, second = nn.Linear(n, h, bias=False, dtype=DT), nn.Linear(h, n, bias=False, dtype=DT)
    with torch.no_grad():
        first.weight.copy_(W0)
        second.weight.copy_(U0)
    model = nn.Sequential(first, _Act(act), second)
    run_sgd(
        model,
        _two_layer.summed_sq_loss,
        xs[0],
        ys[0],
        lr=0.05,
        batch_size=S,
        steps=steps,
        schedule=GeometricDecay(steps, decay_frac=0.5, final_lr=0.01),
        sampler=_replay([(xs[t], ys[t]) for t in range(steps)]),
    )
    torch.testing.assert_close(second.weight.detach(), sim.U[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(first.weight.detach(), sim.W[0], rtol=0, atol=1e-12)


def test_nonlinear_seeds_train_as_separate_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicates along the run axis (own init, own generator) are the single-seed runs."""
    monkeypatch.setattr(nl, "_TRAIN_DTYPE", DT)
    n, h, S, steps, acts = 4, 6, 3, 20, ["relu", "swish"]
    inits = [nl.init_weights(n, h, scale=1.0, seed=s) for s in (1, 2, 3)]
    U0, W0 = torch.stack([u for u, _ in inits]), torch.stack([w for _, w in inits])
    se = nl.noise_variances(n, 5.0)
    lrs = np.full(steps, 0.05)
    both = nl.train(U0, W0, acts, se, lrs=lrs, batch_size=S, seed=[7, 8, 9], chunk=7)
    assert both.U.shape == (3 * len(acts), n, h)
    for j, s in enumerate((7, 8, 9)):
        one = nl.train(U0[j], W0[j], acts, se, lrs=lrs, batch_size=S, seed=s, chunk=7)
        rows = slice(j * len(acts), (j + 1) * len(acts))
        torch.testing.assert_close(both.U[rows], one.U, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(both.W[rows], one.W, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(both.loss[rows], one.loss, rtol=1e-12)
    assert not torch.allclose(both.U[0], both.U[len(acts)])  # the replicates differ
    with pytest.raises(ValueError, match="one init per seed"):
        nl.train(U0, W0, acts, se, lrs=lrs, batch_size=S, seed=[7, 8])


@pytest.mark.parametrize("variant", ["annealed", "label_noise"])
def test_fig3_train_equals_run_sgd(variant: str) -> None:
    cfg = dataclasses.replace(
        fig3.Config.quick(),
        phi_x=(0.4,),
        dim=4,
        hidden=6,
        steps=30,
        n_records=30,
        dtype="float64",
        weight_decay=0.01,
        n_seeds=1,
    )
    seed = 3
    sim = fig3._train(cfg, seed, "sgd_wd", variant)
    U0, W0 = fig3.reduced_init(cfg, fig3.init_seed(seed, 0))
    varied = torch.tensor(fig3.input_variances(0.4, cfg.dim), dtype=DT)
    sx, se = (torch.ones_like(varied), varied) if variant == "label_noise" else (varied, None)
    key = ("fig3", "sgd_wd") if variant == "annealed" else ("fig3", "sgd_wd", variant)
    gen = torch.Generator().manual_seed(fig3.derive_seed(seed, *key))
    batches = []
    for _ in range(cfg.steps):
        X = torch.randn((1, cfg.batch_size, cfg.dim), generator=gen, dtype=DT) * sx.sqrt()
        E = torch.randn((1, cfg.batch_size, cfg.dim), generator=gen, dtype=DT)
        E = E if se is None else E * se.sqrt()
        batches.append((X[0], X[0] + E[0]))
    model, _ = _two_layer.two_layer_module(U0, W0)
    seen, callback = _weights_after_each_step(model, ["1.weight", "0.weight"])
    run_sgd(
        model,
        _two_layer.summed_sq_loss,
        batches[0][0],
        batches[0][1],
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        steps=cfg.steps,
        weight_decay=cfg.weight_decay,
        schedule=GeometricDecay(cfg.steps, decay_frac=cfg.decay_frac, final_lr=cfg.lr_final),
        sampler=_replay(batches),
        callback=callback,
    )
    u2 = np.array([float((U * U).sum()) for U, _ in seen])
    w2 = np.array([float((W * W).sum()) for _, W in seen])
    np.testing.assert_allclose(sim["u2"][0], u2, rtol=1e-11)
    np.testing.assert_allclose(sim["w2"][0], w2, rtol=1e-11)
    assert abs(w2[-1] / w2[0] - 1) > 1e-3  # the weights moved
