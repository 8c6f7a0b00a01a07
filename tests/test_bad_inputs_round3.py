"""Regression tests for the third round of bad inputs (issue #29), one class per root cause.

Each test failed on the code before the fix: a silent wrong result (stale statistics, a
rescaled layer output, the eval-mode function of a BatchNorm model), a vacuous or misleading
check (``verify(scale=0)``, ``tolerance=-1``, NaN weights reported as "no symmetry"), or a
model turned NaN in place.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow import cli

DT = torch.float64


def _mlp(seed: int = 0) -> tuple[nn.Sequential, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")])
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(16, 3, generator=g, dtype=DT), torch.randn(16, 2, generator=g, dtype=DT)
    return m, syms, x, y


def _params(m: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def _unchanged(m: nn.Module, before: dict[str, Tensor]) -> bool:
    return all(torch.equal(p, before[n]) for n, p in m.named_parameters())


HYPER: dict[str, Any] = {"lr": 0.1, "batch_size": 4, "weight_decay": 1e-3}


# -- non-finite models and inputs reach detection ------------------------------------------
class TestNonFiniteDetection:
    """0 symmetries, exit 0, and a coverage report blaming "relative change inf"."""

    def test_nan_weight_is_named(self) -> None:
        m, _, x, _ = _mlp()
        with torch.no_grad():
            m[2].weight[0, 1] = float("nan")
        with pytest.raises(ValueError, match=r"parameter '2\.weight' \(shape \(2, 5\)\) has NaN"):
            nf.find_symmetries(m, x)
        with pytest.raises(ValueError, match=r"'2\.weight'.*NaN"):
            nf.SymmetrySet([nf.Rescaling(m[0], m[2])]).verify(m, x)

    @pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
    def test_non_finite_input_is_named(self, bad: float) -> None:
        m, _, x, _ = _mlp()
        x[3, 1] = bad
        what = "NaN" if math.isnan(bad) else "Inf"
        with pytest.raises(ValueError, match=rf"inputs contain NaN or Inf: input 0 .* {what}"):
            nf.find_symmetries(m, x)
        with pytest.raises(ValueError, match=r"input_ids"):  # keyword inputs are named too
            nf.find_symmetries(m, {"input_ids": x})

    def test_inspect_exits_2_naming_the_parameter(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        f = tmp_path / "nanmodel.py"
        f.write_text(
            textwrap.dedent(
                """
                import torch
                from torch import nn

                def make():
                    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
                    with torch.no_grad():
                        m[0].weight[0, 0] = float("nan")
                    return m
                """
            ),
            encoding="utf-8",
        )
        code = cli.main(["inspect", f"{f}:make", "--input-shape", "3"])
        err = capsys.readouterr().err
        assert code == cli.ExitCode.USAGE, err
        assert "'0.weight'" in err and "NaN" in err, err


# -- statistics know the parameters they were computed at ----------------------------------
class TestStaleStatistics:
    """20 SGD steps between collect_stats and the solve: flows after the teleport were 2.6e-4."""

    @staticmethod
    def _train(m: nn.Module, x: Tensor, y: Tensor, steps: int = 20) -> None:
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()

    @pytest.mark.parametrize("estimator", ["hooks", "reference", "microbatch"])
    def test_solver_and_flow_refuse_stale_statistics(self, estimator: str) -> None:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=estimator)
        self._train(m, x, y)
        for fn in (nf.solve_equilibrium, nf.noether_flow):
            with pytest.raises(nf.StatisticsError, match="changed since the statistics"):
                fn(syms, st, **HYPER)

    def test_capture_read_after_the_step_is_refused(self) -> None:
        # the statistics belong to the parameters of the backward, not those when read
        m, syms, x, y = _mlp()
        with nf.capture(m, syms) as cap:
            nn.functional.mse_loss(m(x), y).backward()
        self._train(m, x, y, steps=1)
        with pytest.raises(nf.StatisticsError, match="changed since the statistics"):
            nf.noether_flow(syms, cap.stats, **HYPER)

    def test_fresh_statistics_give_the_equilibrium(self) -> None:
        m, syms, x, y = _mlp()
        self._train(m, x, y)
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        nf.teleport(m, nf.solve_equilibrium(syms, st, **HYPER))
        after = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        flow = nf.noether_flow(syms, after, **HYPER)["r"]
        charge = nf.charges(syms)["r"]
        assert float(flow.abs().max()) < 1e-12 * float(charge.abs().max())
        # the teleport moved the parameters: the statistics of before are refused
        with pytest.raises(nf.StatisticsError, match="changed since"):
            nf.noether_flow(syms, st, **HYPER)


# -- hyper-parameters that made a check vacuous or the model NaN ---------------------------
class TestHyperParameters:
    def test_gradient_norm_teleport_step_size_nan_leaves_the_model(self) -> None:
        m, syms, x, y = _mlp()
        before = _params(m)
        for kw, name in (
            ({"step_size": float("nan")}, "step_size=nan"),
            ({"step_size": 0.0}, "step_size=0.0"),
            ({"step_size": -0.1}, "step_size=-0.1"),
            ({"steps": -1}, "steps=-1"),
            ({"steps": 2.5}, "steps=2.5"),
        ):
            with pytest.raises(ValueError, match=name):
                nf.gradient_norm_teleport(m, syms, nn.MSELoss(), x, y, **kw)
            assert _unchanged(m, before), kw
        res = nf.gradient_norm_teleport(m, syms, nn.MSELoss(), x, y, steps=0)
        assert _unchanged(m, before) and res.grad_norm_sq_after == res.grad_norm_sq_before

    def test_gradient_norm_teleport_nan_batch_leaves_the_model(self) -> None:
        m, syms, x, y = _mlp()
        before = _params(m)
        y[0, 0] = float("nan")
        with pytest.raises(nf.NonFiniteGradientError, match="unchanged"):
            nf.gradient_norm_teleport(m, syms, nn.MSELoss(), x, y)
        assert _unchanged(m, before)

    @pytest.mark.parametrize(
        ("kw", "match"),
        [
            ({"tolerance": -1.0}, "tolerance=-1.0 must be > 0"),
            ({"tolerance": 0.0}, "tolerance=0.0 must be > 0"),
            ({"tolerance": float("nan")}, "tolerance=nan is not finite"),
            ({"scale": 0.0}, "scale=0.0 must be > 0"),
            ({"scale": -0.5}, "scale=-0.5 must be > 0"),
            ({"scale": float("inf")}, "scale=inf is not finite"),
        ],
    )
    def test_verify_and_detection_refuse_vacuous_settings(
        self, kw: dict[str, float], match: str
    ) -> None:
        # tolerance=-1 reported "the model does not have these symmetries (relative change
        # 2e-16)"; scale=0 passed every symmetry without moving anything
        m, syms, x, _ = _mlp()
        with pytest.raises(ValueError, match=match):
            syms.verify(m, x, **kw)
        with pytest.raises(ValueError, match=match):
            nf.find_symmetries(m, x, **kw)


# -- a user's forward hook that rescales a layer's output ----------------------------------
@pytest.mark.parametrize("how", ["return", "in_place"])
def test_user_forward_hook_rescaling_the_output(how: str) -> None:
    """The hooks read the rescaled output's gradient: E[g²] 4× off (after a checked loss)."""
    m, syms, x, y = _mlp()
    loss = nn.MSELoss()
    nf.collect_stats(m, syms, loss, x, y)  # the loss object is checked (and then trusted)

    def double(_mod: nn.Module, _args: Any, out: Tensor) -> Tensor | None:
        if how == "return":
            return out * 2
        out.mul_(2)
        return None

    m[0].register_forward_hook(double)
    hooks = nf.collect_stats(m, syms, loss, x, y)
    ref = nf.collect_stats(m, syms, loss, x, y, estimator="reference")
    for p in syms.params():
        assert torch.allclose(hooks.mean[p], ref.mean[p], rtol=1e-12, atol=1e-15)
        assert torch.allclose(hooks.sq[p], ref.sq[p], rtol=1e-12, atol=1e-15)


# -- geometric_mean ------------------------------------------------------------------------
class TestGeometricMean:
    def test_solves_p_y_p_equals_x(self) -> None:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(4, 4, generator=g, dtype=DT) for _ in range(2))
        X, Y = a @ a.T + 0.1 * torch.eye(4, dtype=DT), b @ b.T + 0.1 * torch.eye(4, dtype=DT)
        P = nf.geometric_mean(X, Y)
        assert torch.allclose(P @ Y @ P, X, rtol=0, atol=1e-10)
        assert float(torch.linalg.eigvalsh(P).min()) > 0

    @pytest.mark.parametrize(
        ("X", "match"),
        [
            (torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=DT), "X is not symmetric"),
            (-torch.eye(2, dtype=DT), "X is not positive definite"),
            (torch.zeros(2, 2, dtype=DT), "X is not positive definite"),
            (torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]], dtype=DT), "NaN/Inf"),
            (torch.eye(3, dtype=DT), "same d"),
            (torch.ones(2, 3, dtype=DT), r"shape \(2, 3\)"),
        ],
    )
    def test_refuses_what_is_not_spd(self, X: Tensor, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            nf.geometric_mean(X, torch.eye(2, dtype=DT))

    def test_refuses_a_non_tensor(self) -> None:
        with pytest.raises(TypeError, match="X is a list"):
            nf.geometric_mean([[1.0]], torch.eye(1, dtype=DT))  # type: ignore[arg-type]


# -- BatchNorm: the eval-mode function after a teleport -------------------------------------
def _bn_net(eps: float) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, eps=eps), nn.ReLU(), nn.Flatten(), nn.Linear(288, 3)
    ).to(DT)
    x, y = torch.randn(16, 3, 8, 8, dtype=DT), torch.randint(0, 3, (16,))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(5):  # running statistics away from their initial values
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m, x, y


def _eval_change(m: nn.Module, x: Tensor, move: Any) -> float:
    base = m.eval()(x).detach()
    m.train()
    move()
    return float((m.eval()(x).detach() - base).norm() / base.norm())


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batchnorm_eval_function_is_kept_exactly(eps: float) -> None:
    """Running var scaled without eps: the eval function moved by O(eps/var) (1.2e-4)."""
    m, x, _ = _bn_net(eps)
    s = nf.find_symmetries(m, x)["scale:0→1"]
    lam = torch.linspace(-0.7, 0.7, s.num_generators, dtype=DT)
    assert _eval_change(m, x, lambda: s.apply_(lam)) < 1e-13
    m2, _, _ = _bn_net(eps)
    s2 = nf.find_symmetries(m2, x)["scale:0→1"]
    bn = m2[1]
    v0 = bn.running_var.clone()
    s2.apply_(lam)
    s2.apply_(-lam)  # a group action: λ then −λ is the identity on the running variance
    assert torch.allclose(bn.running_var, v0, rtol=1e-13, atol=0)


def test_gradient_norm_teleport_moves_batchnorm_running_stats() -> None:
    """The running statistics were restored after the search: the eval function moved 4e-2."""
    m, x, y = _bn_net(1e-5)
    syms = nf.find_symmetries(m, x)
    loss = nn.functional.cross_entropy

    def move() -> None:
        nf.gradient_norm_teleport(m, syms, loss, x, y)

    assert _eval_change(m, x, move) < 1e-13


def test_solved_teleport_keeps_the_eval_function() -> None:
    """The held-out case: BatchNorm eps = 1e-3, a solved teleport, the model in eval mode."""
    m, x, y = _bn_net(1e-3)
    syms = nf.find_symmetries(m, x)
    st = nf.collect_stats(
        m, syms, nn.functional.cross_entropy, x, y, estimator="microbatch", micro_batch_size=4
    )
    sol = nf.solve_equilibrium(syms, st, **HYPER)
    assert sol.max_distance() > 1e-2

    def move() -> None:
        with pytest.warns(nf.EpsWarning):  # the train-mode function changes through eps
            nf.teleport(m, sol)

    assert _eval_change(m, x, move) < 1e-13


# -- docs/trust.md names tests that exist --------------------------------------------------
FILES = {
    "bad": "test_bad_inputs.py",
    "mon": "test_bad_inputs_monitor.py",
    "cli": "test_bad_inputs_report_cli.py",
    "real": "test_real_models.py",
    "fuzz": "test_fuzz.py",
    "r3": "test_bad_inputs_round3.py",
    "cli-env": "test_bad_inputs_cli_env.py",
    "hf": "test_hf_training.py",
    "trainer": "test_hf_trainer.py",
    "recipes": "test_monitor_recipes.py",
    "pl": "test_lightning_recipes.py",
}


def test_trust_page_names_existing_tests() -> None:
    """Every ``prefix::`Name[::name]``` of docs/trust.md is a test class or function there."""
    import re

    here = Path(__file__).parent
    page = (here.parent / "docs" / "trust.md").read_text(encoding="utf-8")
    refs = re.findall(
        r"\b(bad|mon|cli-env|cli|real|fuzz|r3|hf|trainer|recipes|pl)::`([A-Za-z_:]+)`", page
    )
    assert len(refs) > 40, len(refs)
    for prefix, name in refs:
        source = (here / FILES[prefix]).read_text(encoding="utf-8")
        for part in name.split("::"):
            assert re.search(rf"^\s*(def|class) {part}\b", source, re.M), f"{prefix}::{name}"


def test_find_symmetries_names_targets_its_loss_cannot_take() -> None:
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"loss_fn\(model\(example_inputs\), targets\).*a str"):
        nf.find_symmetries(m, x, loss_fn=nn.MSELoss(), targets="abc")
    with pytest.raises(ValueError, match="returned a float"):
        nf.find_symmetries(m, x, loss_fn=lambda out, y: 1.0, targets=None)
    ok = nf.find_symmetries(m, x, loss_fn=nn.MSELoss(), targets=torch.randn(5, 2).double())
    assert len(ok) == 1
