"""DDP on CPU with gloo: statistics all-reduced over 2 ranks equal one process on the concatenated
batch (float64, 1e-10), with uneven batches, for collect_stats (hooks and reference) and the
monitor on a DDP-wrapped model.

All checks run in one 2-process spawn (start-up dominates); each rank saves its results and
the parent process compares them with single-process results.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import noetherflow as nf
from noetherflow.monitor import NoetherMonitor
from noetherflow.stats.distributed import all_reduce_mean, all_reduce_stats

DT = torch.float64
SIZES = (5, 8)  # uneven local batches
LR, S, WD = 0.05, 13, 1e-3


def _problem() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3)).to(DT)
    # rescaling and rotation share m[2]: a coupled set, so per-sample gradients are gathered too
    syms = nf.SymmetrySet(
        [
            nf.Rescaling(m[0], m[2], label="r"),
            nf.DoubleRotation(m[2], m[3], label="rot"),
        ]
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sum(SIZES), 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (sum(SIZES),), generator=g)
    return m, syms, x, y


def _flat(st: nf.GradStats, syms: nf.SymmetrySet) -> dict[str, Any]:
    """GradStats keyed by names that survive pickling across processes."""
    names = {id(p): f"{i}" for i, p in enumerate(syms.params())}
    sn = {s: n for n, s in syms.items()}
    return {
        "n": st.n,
        "mean": {names[id(p)]: t.clone() for p, t in st.mean.items()},
        "sq": {names[id(p)]: t.clone() for p, t in st.sq.items()},
        "side": {sn[s]: (a.clone(), b.clone()) for s, (a, b) in st.side.items()},
        "samples": {names[id(p)]: t.clone() for p, t in st.samples.items()},
    }


def _monitor_row(
    model: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor
) -> dict[str, np.ndarray]:
    mon = NoetherMonitor(
        model,
        syms,
        every=1,
        lr=LR,
        batch_size=S,
        weight_decay=WD,
        logging=nf.LogOptions(progress=False, tensorboard=False),
    )
    with mon.track():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    row = mon.step(loss)
    assert row is not None
    return row


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        m, syms, x, y = _problem()
        lo = sum(SIZES[:rank])
        xs, ys = x[lo : lo + SIZES[rank]], y[lo : lo + SIZES[rank]]
        ddp = nn.parallel.DistributedDataParallel(m)
        res: dict[str, Any] = {}
        for est in ("hooks", "reference"):
            st = nf.collect_stats(ddp, syms, nn.functional.cross_entropy, xs, ys, estimator=est)
            res[est] = _flat(st, syms)
        res["loss"] = float(all_reduce_mean(nn.functional.cross_entropy(m(xs), ys), SIZES[rank]))
        res["row"] = _monitor_row(ddp, syms, xs, ys)
        # the monitor's backward went through DDP: gradients are the average over ranks
        res["grad0"] = m[0].weight.grad.clone()
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    os._exit(0)  # a finished worker skips teardown, where gloo's threads can abort it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _assert_close(a: Any, b: Any, what: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            _assert_close(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, tuple):
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _assert_close(u, v, f"{what}[{i}]")
    elif isinstance(a, torch.Tensor | np.ndarray):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-10, err_msg=what)
    else:
        assert a == b, what


@pytest.mark.parametrize("estimator", ["hooks", "reference"])
def test_ddp_stats_equal_concatenated_batch(ranks: list[dict[str, Any]], estimator: str) -> None:
    m, syms, x, y = _problem()
    ref = _flat(
        nf.collect_stats(m, syms, nn.functional.cross_entropy, x, y, estimator=estimator), syms
    )
    assert ref["samples"], "the coupled set keeps per-sample gradients"
    for r in ranks:
        assert r[estimator]["n"] == sum(SIZES)
        _assert_close(r[estimator], ref, estimator)


def test_ddp_monitor_equals_single_process(ranks: list[dict[str, Any]]) -> None:
    m, syms, x, y = _problem()
    ref = _monitor_row(m, syms, x, y)
    with torch.no_grad():
        full_loss = float(nn.functional.cross_entropy(m(x), y))
    for r in ranks:
        assert abs(r["loss"] - full_loss) < 1e-12
        row = r["row"]
        assert row.keys() == ref.keys()
        for k in ref:
            if k in ("time", "monitor_time"):
                continue
            np.testing.assert_allclose(row[k], ref[k], rtol=1e-9, atol=1e-10, err_msg=k)
    # DDP itself still averaged the gradients (the monitor's hooks did not interfere)
    np.testing.assert_allclose(ranks[0]["grad0"], ranks[1]["grad0"], rtol=0, atol=1e-14)


def test_all_reduce_is_noop_without_process_group() -> None:
    m, syms, x, y = _problem()
    st = nf.collect_stats(m, syms, nn.functional.cross_entropy, x, y)
    before = _flat(st, syms)
    assert all_reduce_stats(st) is st
    _assert_close(_flat(st, syms), before, "noop")
    v = torch.tensor([1.5], dtype=DT)
    assert torch.equal(all_reduce_mean(v, 3), v)
