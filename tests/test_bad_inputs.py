"""Regression tests for bad or inconsistent inputs (issue #16), organised by class.

Each case was a silent wrong result, a hang or an unclear error before; each test fails on
that code and asserts the clear error (value, expectation, fix) or the right behaviour now.
"""

from __future__ import annotations

import copy
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


def _mlp(seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")])
    x, y = torch.randn(16, 3, dtype=DT), torch.randn(16, 2, dtype=DT)
    return m, syms, x, y


class TestSolverRefusesInvalidInput:
    """The solver reported converged=True and distance 0 on these."""

    def test_nan_statistics(self) -> None:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y * float("nan"), check_finite=False)
        with pytest.raises(nf.NonFiniteGradientError, match=r"solve_equilibrium.*NaN/Inf"):
            nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=1e-3)

    def test_nan_parameters(self) -> None:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        with torch.no_grad():
            m[0].weight[0, 0] = float("inf")
        with pytest.raises(nf.NonFiniteGradientError, match="diverged"):
            nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=1e-3)

    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
    def test_weight_decay_not_finite_or_negative(self, bad: float) -> None:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        with pytest.raises(ValueError, match="weight_decay="):
            nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=bad)
        with pytest.raises(ValueError, match="weight_decay="):
            nf.noether_flow(syms, st, lr=0.1, batch_size=4, weight_decay=bad)

    @pytest.mark.parametrize(("lr", "wd"), [(2.0, 0.5), (1.0, 3.0)])
    def test_discrete_time_without_contraction(self, lr: float, wd: float) -> None:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        with pytest.raises(ValueError, match=r"ηγ < 1"):
            nf.solve_equilibrium(syms, st, lr=lr, batch_size=4, weight_decay=wd, time="discrete")
        # continuous time has κ = 4γ > 0 for the same numbers
        nf.solve_equilibrium(syms, st, lr=lr, batch_size=4, weight_decay=wd)

    @pytest.mark.parametrize(
        ("kw", "match"),
        [
            ({"lr": float("nan")}, "lr=nan"),
            ({"lr": float("inf")}, "lr=inf"),
            ({"lr": 0.0}, "lr=0.0"),
            ({"batch_size": 0}, "batch_size=0"),
            ({"batch_size": 2.5}, "batch_size=2.5"),
            ({"time": "euler"}, "time='euler'"),
        ],
    )
    def test_noise_model_validates_once(self, kw: dict[str, Any], match: str) -> None:
        base: dict[str, Any] = {"lr": 0.1, "batch_size": 4, "weight_decay": 0.0}
        with pytest.raises(ValueError, match=match):
            nf.NoiseModel.create(**{**base, **kw})


class TestTeleportTrust:
    """A teleport moved parameters it should not have."""

    def _solved(self) -> tuple[nn.Module, nf.SymmetrySet, nf.EquilibriumSolution, Tensor]:
        m, syms, x, y = _mlp()
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
        sol = nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=1e-3)
        assert sol.max_distance() > 1e-3
        return m, syms, sol, x

    def test_parameters_changed_since_solve(self) -> None:
        m, _, sol, _ = self._solved()
        with torch.no_grad():
            m[2].weight.mul_(1.01)  # e.g. an optimizer step in between
        before = m[0].weight.detach().clone()
        with pytest.raises(nf.TeleportError, match="changed since the solution was computed"):
            nf.teleport(m, sol)
        assert torch.equal(m[0].weight, before)  # nothing moved

    def test_applied_twice(self) -> None:
        m, _, sol, _ = self._solved()
        nf.teleport(sol)
        with pytest.raises(nf.TeleportError, match="applied already"):
            nf.teleport(m, sol)

    def test_undo_then_reapply_is_allowed(self) -> None:
        m, _, sol, _ = self._solved()
        h = nf.teleport(m, sol)
        after = m[0].weight.detach().clone()
        h.undo()
        nf.teleport(m, sol)
        assert torch.equal(m[0].weight, after)

    def test_parametrised_layer_is_refused(self) -> None:
        # weight_norm: a hand-declared Rescaling used to accept the computed weight, and a
        # teleport then moved the outputs (by 0.26 in the issue) or failed with a KeyError.
        m, _, _, _ = _mlp()
        nn.utils.parametrizations.weight_norm(m[0])
        with pytest.raises(nf.SymmetryDefinitionError, match="parametrised weight"):
            nf.SymmetrySet([nf.Rescaling(m[0], m[2])])

    def test_copy_moves_the_copy(self) -> None:
        m, _, sol, x = self._solved()
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        twin = copy.deepcopy(m)
        nf.teleport(twin, sol)
        for n, p in m.named_parameters():
            assert torch.equal(p, before[n]), n
        assert not torch.equal(twin[0].weight, before["0.weight"])
        assert float((twin(x) - m(x)).detach().abs().max()) < 1e-12


class TestCollectStatsLossCheck:
    """An L2 penalty inside loss_fn made the hooks' mean disagree with their E[g²]."""

    def test_l2_penalty_in_loss_is_refused(self) -> None:
        m, syms, x, y = _mlp()

        def loss_fn(out: Tensor, t: Tensor) -> Tensor:
            return nn.functional.mse_loss(out, t) + 1e-3 * sum(
                p.square().sum() for p in m.parameters()
            )

        with pytest.raises(nf.StatisticsError, match="weight_decay="):
            nf.collect_stats(m, syms, loss_fn, x, y)
        nf.collect_stats(m, syms, loss_fn, x, y, check_loss=False)  # opt out

    @pytest.mark.parametrize("reduction", ["mean", "sum"])
    def test_data_loss_passes(self, reduction: str) -> None:
        m, syms, x, y = _mlp()
        ref = nf.collect_stats(
            m,
            syms,
            nn.MSELoss(reduction=reduction),
            x,
            y,
            reduction=reduction,
            estimator="reference",
        )
        hk = nf.collect_stats(m, syms, nn.MSELoss(reduction=reduction), x, y, reduction=reduction)
        for p, v in ref.mean.items():
            assert float((hk.mean[p] - v).norm() / v.norm()) < 1e-12

    @pytest.mark.parametrize(("loss_red", "declared"), [("sum", "mean"), ("mean", "sum")])
    def test_reduction_declared_wrongly_is_refused(self, loss_red: str, declared: str) -> None:
        m, syms, x, y = _mlp()
        with pytest.raises(nf.StatisticsError, match=f"reduction={loss_red!r}"):
            nf.collect_stats(m, syms, nn.MSELoss(reduction=loss_red), x, y, reduction=declared)

    def test_float32_data_loss_passes(self) -> None:
        m, syms, x, y = _mlp()
        m = m.float()
        syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
        nf.collect_stats(m, syms, nn.MSELoss(), x.float() * 100, y.float())


# -- DDP: one 2-process gloo spawn for both cases ---------------------------------------------
def _ddp_worker(rank: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=30))
    torch.set_num_threads(1)
    res: dict[str, Any] = {}
    try:
        torch.manual_seed(0)
        m = nn.Sequential(
            nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)
        ).to(DT)
        a, b = nf.Rescaling(m[0], m[2], label="a"), nf.Rescaling(m[2], m[4], label="b")
        # the same symmetries, listed in a different order on rank 1: equal shapes and totals
        syms = nf.SymmetrySet([a, b] if rank == 0 else [b, a])
        x, y = torch.randn(6, 4, dtype=DT), torch.randn(6, 4, dtype=DT)
        try:
            nf.collect_stats(m, syms, nn.MSELoss(), x, y, timeout=20)
            res["order"] = "no error"
        except nf.StatisticsError as e:
            res["order"] = str(e)
        res.update(_ddp_dtype_and_values(rank, m, x, y))
        # rank 1 skips the next collective: rank 0 must get a clear error, not hang
        if rank == 0:
            t0 = time.perf_counter()
            try:
                syms0 = nf.SymmetrySet([a, b])
                nf.collect_stats(m, syms0, nn.MSELoss(), x, y, timeout=2)
                res["skip"] = "no error"
            except nf.StatisticsError as e:
                res["skip"] = str(e)
            res["skip_seconds"] = time.perf_counter() - t0
        else:
            time.sleep(8)
    finally:
        torch.save(res, Path(out) / f"rank{rank}.pt")
        os._exit(0)  # a timed-out gloo group cannot be torn down cleanly


def _ddp_dtype_and_values(rank: int, m: nn.Module, x: Tensor, y: Tensor) -> dict[str, str]:
    """Rank 1 in float32 (gloo aborted with SIGABRT); rank 1 with other weights (averaged
    without a word); then equal models, which must still reduce."""
    out: dict[str, str] = {}
    for case in ("dtype", "values", "same"):
        mc = copy.deepcopy(m)
        xc, yc = x, y
        if rank == 1 and case == "dtype":
            mc, xc, yc = mc.float(), x.float(), y.float()
        if rank == 1 and case == "values":
            with torch.no_grad():
                mc[0].weight.add_(1e-3)
        syms = nf.SymmetrySet([nf.Rescaling(mc[0], mc[2], label="a")])
        try:
            nf.collect_stats(mc, syms, nn.MSELoss(), xc, yc, timeout=20)
            out[case] = "no error"
        except nf.StatisticsError as e:
            out[case] = str(e)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="class")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two gloo ranks' records of the bad calls (module level: pytest 9.2 deprecates
    class-scoped fixtures that are instance methods)."""
    out = tmp_path_factory.mktemp("ddp_bad")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


class TestDistributed:
    """Different symmetry orders were reduced silently; a skipped call hung for 30 minutes."""

    def test_symmetry_order_differs_across_ranks(self, ranks: list[dict[str, Any]]) -> None:
        for r in ranks:
            assert "different symmetry set" in r["order"], r["order"]

    def test_dtype_differs_across_ranks(self, ranks: list[dict[str, Any]]) -> None:
        # gloo aborted both processes (SIGABRT) in the all-reduce of mixed dtypes
        for r in ranks:
            assert "another dtype than rank 0" in r["dtype"] and "model.to(" in r["dtype"], r

    def test_parameter_values_differ_across_ranks(self, ranks: list[dict[str, Any]]) -> None:
        # without a DDP wrapper the statistics of two different models were averaged silently
        for r in ranks:
            assert "other parameter values than rank 0" in r["values"], r["values"]
            assert "DistributedDataParallel" in r["values"], r["values"]
        assert all(r["same"] == "no error" for r in ranks), [r["same"] for r in ranks]

    def test_skipped_collective_times_out_clearly(self, ranks: list[dict[str, Any]]) -> None:
        msg = ranks[0]["skip"]
        assert "did not join" in msg and "same number of times" in msg, msg
        assert ranks[0]["skip_seconds"] < 8


class TestSymmetriesOfAnotherModel:
    """Symmetries found on the original, statistics asked of a copy: the micro-batch estimator
    returned zero gradients silently (the copy's forward never touches the original's
    parameters) and the hooks blamed the layer types."""

    @pytest.mark.parametrize("estimator", ["hooks", "reference", "microbatch"])
    def test_collect_stats_refuses(self, estimator: str) -> None:
        m, syms, x, y = _mlp()
        other = copy.deepcopy(m)
        with pytest.raises(nf.StatisticsError, match=r"symmetry 'r' acts on a parameter of shape"):
            nf.collect_stats(
                other, syms, nn.MSELoss(), x, y, estimator=estimator, micro_batch_size=4
            )

    def test_monitor_and_teleporter_refuse(self) -> None:
        m, syms, _, _ = _mlp()
        other = copy.deepcopy(m)
        with pytest.raises(nf.StatisticsError, match=r"NoetherMonitor: .*find_symmetries"):
            nf.NoetherMonitor(other, syms, lr=0.1, batch_size=16)
        with pytest.raises(nf.StatisticsError, match=r"EquilibriumTeleport: .*not a parameter"):
            nf.EquilibriumTeleport(other, syms, nn.MSELoss(), lr=0.1, batch_size=16)
