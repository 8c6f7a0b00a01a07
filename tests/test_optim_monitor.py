"""The monitor records the exact per-step decomposition of the optimizer's update (#18)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf

DT = torch.float64

OPTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, weight_decay=0.03),
    "sgdm": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.03),
    "nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.03
    ),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_monitor_last_step_is_exact(name: str) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[2], m[3])])
    x, y = torch.randn(32, 5, dtype=DT), torch.randn(32, 3, dtype=DT)
    opt = OPTS[name](m.parameters())
    mon = nf.NoetherMonitor(
        m,
        syms,
        optimizer=opt,
        batch_size=8,
        every=1,
        logging=nf.LogOptions(progress=False),
        distance=False,
    )
    assert mon.last_step is None
    for _ in range(4):
        idx = torch.randint(0, 32, (8,))
        opt.zero_grad()
        with mon.track():
            loss = F.mse_loss(m(x[idx]), y[idx])
            loss.backward()
        mon.step(loss)
        before = nf.charges(syms)
        opt.step()
        after = nf.charges(syms)
        parts = mon.last_step
        assert parts is not None
        for k, d in parts.items():
            sc = float(after[k].abs().max())
            assert float((d.before - before[k]).abs().max()) <= 1e-12 * sc
            assert float((d.after - after[k]).abs().max()) <= 1e-12 * sc
            total = d.before + d.decay + d.drift + d.noise
            assert float((total - after[k]).abs().max()) <= 1e-12 * sc
    mon.close()
    idx = torch.arange(8)
    opt.zero_grad()
    F.mse_loss(m(x[idx]), y[idx]).backward()
    last = mon.last_step
    opt.step()  # detached on close: no new record
    assert mon.last_step is last


def test_teleport_transports_the_momentum_buffer_as_a_cotangent() -> None:
    """Rescaling (diagonal A): after a teleport by e^{λA}, θ' = e^{λA}θ and the buffer
    b' = e^{−λA}b, so B = θᵀA·v is unchanged and E = vᵀAv becomes vᵀe^{−2λA}Av (v = −ηb).
    Checked against the moments recomputed from the transported parameters and buffer."""
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    ((_name, sym),) = syms.items()
    x, y = torch.randn(32, 5, dtype=DT), torch.randn(32, 3, dtype=DT)
    lr = 0.05
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, weight_decay=0.03)
    for _ in range(5):
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    from noetherflow.optim import bilinear_charge

    def moments() -> tuple[torch.Tensor, torch.Tensor]:
        th = {p: p.detach().clone() for p in sym.params}
        v = {p: -lr * opt.state[p]["momentum_buffer"].clone() for p in sym.params}
        return bilinear_charge(sym, th, v), bilinear_charge(sym, v, v)

    b0, e0 = moments()
    buf0 = {p: opt.state[p]["momentum_buffer"].clone() for p in sym.params}
    th0 = {p: p.detach().clone() for p in sym.params}
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer=opt, batch_size=8)
    sol = tp.teleport(x, y)
    assert sol.max_distance() > 1e-3
    b1, e1 = moments()
    sc = float(b0.abs().max())
    assert float((b1 - b0).abs().max()) <= 1e-12 * sc  # B invariant under cotangent transport
    # E' recomputed by hand: the per-coordinate scale of θ is s = θ'/θ, the buffer's is 1/s
    v_hand = {p: -lr * buf0[p] * th0[p] / p.detach() for p in sym.params}
    e_hand = bilinear_charge(sym, v_hand, v_hand)
    assert float((e1 - e_hand).abs().max()) <= 1e-10 * float(e1.abs().max())
    assert not torch.allclose(e1, e0, rtol=1e-3, atol=0)  # E does move


# -- the decomposition in the history (#18) ---------------------------------------------
HIST_OPTS = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.05, weight_decay=0.03), 1 - 0.05 * 0.03),
    "sgdm": (
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.03),
        1 - 0.05 * 0.03,
    ),
    "sgdm-damped": (
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.5, weight_decay=0.03),
        1 - 0.05 * 0.5 * 0.03,
    ),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), 1 - 0.01 * 0.1),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1), 1.0),
    "rmsprop": (lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5), 1.0),
}


@pytest.mark.parametrize("name", sorted(HIST_OPTS))
def test_recorded_decomposition_is_exact(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """step_decay + step_drift + step_noise of a row = its charge − the charge before the
    optimizer step that led to it, to 1e-12 (float64), for any torch.optim optimizer; decay
    and noise match an independent computation ((k² − 1)C and C(θ' − kθ)); the history
    files read back to the same numbers."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[2], m[3])])
    x, y = torch.randn(32, 5, dtype=DT), torch.randn(32, 3, dtype=DT)
    make, shrink = HIST_OPTS[name]
    opt = make(m.parameters())
    log = nf.LogOptions(log_dir=tmp_path, progress=False)
    kw = {"batch_size": 8, "every": 3, "full_matrices": True, "logging": log}
    if name.startswith(("sgd",)):
        mon = nf.NoetherMonitor(m, syms, optimizer=opt, **kw)
    else:
        with pytest.warns(UserWarning, match="no flows and distances"):
            mon = nf.NoetherMonitor(m, syms, optimizer=opt, **kw)
    before: dict[int, dict[str, torch.Tensor]] = {}
    theta: dict[int, dict[nn.Parameter, torch.Tensor]] = {}
    for i in range(10):
        idx = torch.randint(0, 32, (8,))
        opt.zero_grad()
        with mon.track():
            loss = F.mse_loss(m(x[idx]), y[idx])
            loss.backward()
        mon.step(loss)
        theta[i] = {p: p.detach().clone() for p in syms.params()}
        before[i + 1] = nf.charges(syms)
        opt.step()
    mon.close()
    h = mon.history
    assert list(h["step"]) == [0, 3, 6, 9]
    for r, step in enumerate(h["step"]):
        for sname, key in mon.keys.items():
            mat = "_matrix" if syms[sname].family.value == "rotation" else ""
            parts = [h[f"step_{p}{mat}/{key}"][r] for p in ("decay", "drift", "noise")]
            if step == 0:
                assert all(np.isnan(v).all() for v in parts)  # no step led to row 0
                continue
            c_after, c_before = h[f"charge{mat}/{key}"][r], before[int(step)][sname].numpy()
            sc = np.abs(c_after).max()
            assert np.abs(c_before + sum(parts) - c_after).max() <= 1e-12 * sc
            s = syms[sname]
            th0, th1 = theta[int(step) - 1], theta[int(step)]
            assert np.abs(parts[0] - (shrink**2 - 1) * c_before).max() <= 1e-12 * sc
            rest = {p: th1[p] - shrink * th0[p] for p in s.params}
            assert np.abs(parts[2] - s.charge_of(rest).numpy()).max() <= 1e-12 * sc
            if name == "sgd" and not mat:  # θᵀA g = 0 by symmetry: no drift for plain SGD
                assert np.abs(parts[1]).max() <= 1e-12 * sc
            if name in ("sgdm", "adamw"):
                assert np.abs(parts[1]).max() > 1e-6 * sc  # momentum/Adam: a real drift
        if not name.startswith("sgd"):
            assert not any(k.startswith(("flow/", "distance/")) for k in h)
    labels = [ax.get_ylabel() for ax in mon.plot().axes]
    assert {"charge", "step_drift", "step_noise"} <= set(labels)
    for fmt in ("history.csv", "history.jsonl"):
        back = nf.load_history(tmp_path / fmt)
        assert set(back) == set(h)
        for k, v in h.items():
            if k.startswith(("step_", "charge")):
                np.testing.assert_array_equal(back[k], v)


def test_adamw_monitor_20_steps_and_its_prediction() -> None:
    """AdamW on a scale-invariant weight: 20 steps; adamw_noise is nᵀAn of the step's own
    normalised direction (checked with β₁ = 0, where the update is −η·n exactly) and
    adamw_charge is eq. (A2) of it."""
    torch.manual_seed(0)
    lin = nn.Linear(6, 4).to(DT)
    head = nn.Linear(4, 2).to(DT)

    def model(x: torch.Tensor) -> torch.Tensor:
        w = lin.weight / lin.weight.norm()
        return head(torch.relu(x @ w.T))

    params = [lin.weight, *head.parameters()]
    sym = nf.ScaleInvariance([lin.weight], label="w")
    syms = nf.SymmetrySet([sym])
    lr, lam = 0.01, 0.1
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=lam, betas=(0.0, 0.99))
    with pytest.warns(UserWarning, match=r"AdamW.*scale-invariant symmetries \['w'\]"):
        mon = nf.NoetherMonitor(
            nn.ModuleList([lin, head]),
            syms,
            optimizer=opt,
            batch_size=8,
            every=1,
            logging=nf.LogOptions(progress=False),
        )
    x, y = torch.randn(64, 6, dtype=DT), torch.randn(64, 2, dtype=DT)
    for _ in range(20):
        idx = torch.randint(0, 64, (8,))
        opt.zero_grad()
        with mon.track():
            loss = F.mse_loss(model(x[idx]), y[idx])
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        w0 = lin.weight.detach().clone()
        opt.step()
        u = lin.weight.detach() - (1 - lr * lam) * w0  # the Adam part of the update
        n_true = float((u / lr).square().sum())
        assert abs(float(row["adamw_noise/w"].reshape(-1)[0]) - n_true) <= 1e-12 * n_true
        pred = nf.optim.adamw_equilibrium_charge(n_true, lr=lr, weight_decay=lam, beta1=0.0)
        assert abs(float(row["adamw_charge/w"].reshape(-1)[0]) - float(pred)) <= 1e-12 * float(pred)
        # the distance to it: |λ| of e^λ·w with ‖e^λ w‖² = C* (issue #31)
        lam_star = 0.5 * np.log(float(pred) / float(w0.square().sum()))
        assert abs(float(row["adamw_distance/w"].reshape(-1)[0]) - abs(lam_star)) <= 1e-10 * max(
            abs(lam_star), 1e-3
        )
    h = mon.history
    assert h["step"].shape == (20,) and np.isfinite(h["charge/w"]).all()
    assert np.isfinite(h["step_drift/w"][1:]).all()
    mon.close()
