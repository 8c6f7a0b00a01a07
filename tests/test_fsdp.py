"""FSDP2 (``fully_shard``, gloo on CPU, 2 processes) equals one process on the global batch.

The symmetries are found before sharding (the supported order), on a model with a rescaling
(Linear-ReLU-Linear), two double rotations (two Linears with nothing between), a LayerNorm
scale invariance (eps = 0: exact) and the LayerNorm affine's channel rescaling; the rotations
share parameters with the others, so the set is coupled (per-sample gradients gathered,
Gauss-Seidel solve). Layouts: ``Shard(0)`` with odd widths (rows split 3 + 2), a one-row head
(rank 1 holds an empty shard), the first weight as ``Shard(1)``; batches are uneven (5 + 8).
Every rank saves its results (whole tensors, by parameter name); the parent compares them in
float64 at 1e-10 with the same calls in one process on the concatenated batch:
``collect_stats`` (hooks), charges (of a hand-built set too), ``noether_flow``,
``solve_equilibrium``, ``teleport`` (the parameters after it, and the function kept),
``NoetherMonitor`` rows over SGD-momentum steps and over plain SGD with incremental
distances, and ``EquilibriumTeleport`` (parameters, ``.grad``, momentum buffers). Also which
charges gather which parameters, that the symmetry objects stay on their (now ``FSDP…``)
modules, and the refusals. All checks share one 2-process spawn (start-up dominates);
tests/test_fsdp_hf.py runs a Hugging Face GPT-2.
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
from noetherflow import _shard
from noetherflow.monitor import NoetherMonitor
from noetherflow.stats.fsdp import bind_sharded

fsdp = pytest.importorskip("torch.distributed.fsdp")

DT = torch.float64
SIZES = (5, 8)  # uneven local batches
EVEN = 6  # the monitor's per-rank batch (S = 2 * EVEN): FSDP averages the ranks' means
LR, S, WD, STEPS = 0.05, 13, 1e-3, 3
LOSS = nn.functional.mse_loss


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, 6),
        nn.ReLU(),
        nn.Linear(6, 5),
        nn.Linear(5, 5),
        nn.LayerNorm(5, eps=0.0),
        nn.Linear(5, 3),
        nn.Linear(3, 1),  # one row over two ranks: rank 1's shard of its weight is empty
    ).to(DT)


def _diagonal_model() -> nn.Sequential:
    """Rescaling, scale invariance and channel rescaling only: the joint Newton solve, and
    the monitor's incremental (chord) distance between full solves."""
    torch.manual_seed(6)
    return nn.Sequential(
        nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.LayerNorm(5, eps=0.0), nn.Linear(5, 1)
    ).to(DT)


def _diagonal_rows(m: nn.Module, x: torch.Tensor, y: torch.Tensor, shard: bool) -> list[Any]:
    """NoetherMonitor rows over plain SGD steps: a full solve every 3 records, chords between."""
    syms = nf.find_symmetries(m, x)
    if shard:
        _shard_model(m)
    opt = torch.optim.SGD(m.parameters(), lr=LR, weight_decay=2 * WD)
    mon = NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=2 * EVEN,
        logging=nf.LogOptions(progress=False, tensorboard=False),
        distance=nf.DistanceOptions(every=1, solve_every=3),
    )
    rows = []
    for _ in range(STEPS):
        with mon.track():
            loss = LOSS(m(x), y)
            loss.backward()
        rows.append(mon.step(loss))
        opt.step()
        opt.zero_grad()
    mon.close()
    return rows


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sum(SIZES), 4, generator=g, dtype=DT)
    return x, torch.randn(sum(SIZES), 1, generator=g, dtype=DT)


def _even(x: torch.Tensor, y: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    return x[rank * EVEN : (rank + 1) * EVEN], y[rank * EVEN : (rank + 1) * EVEN]


def _symmetries(m: nn.Module) -> nf.SymmetrySet:
    syms = nf.find_symmetries(
        m, torch.randn(16, 4, generator=torch.Generator().manual_seed(2), dtype=DT)
    )
    assert sorted(type(s).__name__ for s in syms) == [
        "ChannelRescaling",
        "DoubleRotation",
        "DoubleRotation",
        "Rescaling",
        "ScaleInvariance",
    ]
    return syms


def _hand_built(m: nn.Module) -> nf.SymmetrySet:
    """A set built by hand (no parameter names recorded)."""
    return nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="h"), nf.DoubleRotation(m[2], m[3])])


def _names(m: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in m.named_parameters()}


def _whole(t: torch.Tensor) -> torch.Tensor:
    return _shard.full(t.detach()).clone()


def _entry_key(e: Any, names: dict[int, str]) -> str:
    """A block entry's key with its parameters and symmetries by name."""
    if isinstance(e, tuple):
        return "(" + ", ".join(_entry_key(v, names) for v in e) + ")"
    if isinstance(e, torch.Tensor | nf.Symmetry):
        return names[id(e)]
    return repr(e)


def _stats(st: nf.GradStats, m: nn.Module, syms: nf.SymmetrySet) -> dict[str, Any]:
    """GradStats keyed by parameter names (they survive pickling and sharding)."""
    n = _names(m) | {id(s): k for k, s in syms.items()}
    return {
        "n": st.n,
        "mean": {n[id(p)]: t.clone() for p, t in st.mean.items()},
        "blocks": {
            k: {_entry_key(e, n): b.get_entry(e).clone() for e in b.entries()}
            for k, b in sorted(st.blocks.items())
        },
        "samples": {n[id(p)]: t.clone() for p, t in st.samples.items()},
    }


def _run(m: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Everything compared, on this process's batch (sharded or not)."""
    res: dict[str, Any] = {}
    st = nf.collect_stats(m, syms, LOSS, x, y)
    res["stats"] = _stats(st, m, syms)
    res["charges"] = {k: v.clone() for k, v in nf.charges(syms).items()}
    res["flow"] = nf.noether_flow(syms, st, lr=LR, batch_size=S, weight_decay=WD)
    sol = nf.solve_equilibrium(syms, st, lr=LR, batch_size=S, weight_decay=WD)
    res["elements"] = {k: torch.as_tensor(v).clone() for k, v in sol.elements.items()}
    probe = torch.randn(7, 4, generator=torch.Generator().manual_seed(3), dtype=DT)
    with torch.no_grad():
        before = m(probe)
    nf.teleport(m, sol)
    with torch.no_grad():
        res["function_gap"] = float((m(probe) - before).abs().max())
    res["teleported"] = {n: _whole(p) for n, p in m.named_parameters()}
    res["charges_after"] = {k: v.clone() for k, v in nf.charges(syms).items()}
    return res


def _monitor(
    m: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor
) -> dict[str, Any]:
    """NoetherMonitor rows over SGD-momentum steps, then EquilibriumTeleport on the state."""
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9, weight_decay=2 * WD)
    mon = NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=2 * EVEN,
        logging=nf.LogOptions(progress=False, tensorboard=False),
        # one full (coupled, momentum) solve, on the first record
        distance=nf.DistanceOptions(every=STEPS, sweeps=None),
    )
    rows = []
    for _ in range(STEPS):
        with mon.track():
            loss = LOSS(m(x), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        rows.append(row)
        opt.step()
        opt.zero_grad()
    mon.close()
    LOSS(m(x), y).backward()  # a .grad to transport with the momentum buffers
    nf.EquilibriumTeleport(m, syms, LOSS, batch_size=2 * EVEN, optimizer=opt).teleport(x, y)
    return {
        "rows": rows,
        "params": {n: _whole(p) for n, p in m.named_parameters()},
        "grads": {n: _whole(p.grad) for n, p in m.named_parameters()},
        "buffers": {n: _whole(opt.state[p]["momentum_buffer"]) for n, p in m.named_parameters()},
    }


def _dim1(p: nn.Parameter) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(1) if p.ndim == 2 else None


def _shard_model(m: nn.Sequential) -> None:
    # the first weight along its input axis (Shard(1)): the rescaling's rows stay whole
    fsdp.fully_shard(m[0], shard_placement_fn=_dim1)
    for layer in m[1:]:
        if any(True for _ in layer.parameters()):
            fsdp.fully_shard(layer)
    fsdp.fully_shard(m)


def _gathers(syms: nf.SymmetrySet, m: nn.Module) -> dict[str, list[str]]:
    """The parameters each symmetry's charge all-gathers (DTensor.full_tensor calls)."""
    from torch.distributed.tensor import DTensor

    names = {p.to_local().data_ptr(): n for n, p in m.named_parameters()}  # a detached view
    seen: list[str] = []
    orig = DTensor.full_tensor

    def spy(self: DTensor, *a: Any, **k: Any) -> torch.Tensor:
        seen.append(names.get(self.to_local().data_ptr(), str(tuple(self.shape))))
        return orig(self, *a, **k)

    out = {}
    DTensor.full_tensor = spy  # type: ignore[method-assign]
    try:
        for name, s in syms.items():
            seen.clear()
            s.charge()
            out[name] = sorted(seen)
    finally:
        DTensor.full_tensor = orig  # type: ignore[method-assign]
    return out


def _errors(m: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    """What a sharded model refuses, as messages."""
    from torch.distributed.device_mesh import init_device_mesh

    msgs = []
    for call in (
        lambda: nf.collect_stats(m, syms, LOSS, x, y, estimator="reference"),
        lambda: nf.find_symmetries(m, x),
        lambda: syms.verify(m, x),
        lambda: nf.hessian_trace(m, LOSS, x, y),
    ):
        with pytest.raises(nf.UnsupportedLayerError) as e:
            call()
        msgs.append(str(e.value))
    hsdp = _model()
    hsyms = _symmetries(hsdp)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))
    fsdp.fully_shard(hsdp, mesh=mesh)  # HSDP: a 2-D mesh
    with pytest.raises(nf.UnsupportedLayerError) as e:
        nf.collect_stats(hsdp, hsyms, LOSS, x, y)
    msgs.append(str(e.value))
    return msgs


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        x, y = _batch()
        lo = sum(SIZES[:rank])
        xs, ys = x[lo : lo + SIZES[rank]], y[lo : lo + SIZES[rank]]
        m = _model()
        syms = _symmetries(m)
        modules = {
            n: [v for v in vars(s).values() if isinstance(v, nn.Module)] for n, s in syms.items()
        }
        objects = list(syms)
        hand = _hand_built(m)
        _shard_model(m)
        with pytest.raises(nf.StatisticsError) as stale:  # no model yet: the old tensors
            nf.charges(syms)
        res = _run(m, syms, xs, ys)
        res["stale"] = str(stale.value)
        res["hand_charges"] = nf.charges(bind_sharded(m, hand))  # no names: FSDP's record
        res["gathers"] = _gathers(syms, m)  # (syms are on the sharded parameters now)
        res["errors"] = _errors(m, syms, xs, ys)
        # the same symmetry objects, on the same (now FSDP…) modules, on the sharded parameters
        res["same_objects"] = all(a is b for a, b in zip(objects, syms, strict=True))
        res["same_modules"] = all(
            all(
                a is b
                for a, b in zip(
                    mods,
                    [v for v in vars(syms[n]).values() if isinstance(v, nn.Module)],
                    strict=True,
                )
            )
            for n, mods in modules.items()
        )
        res["classes"] = sorted({type(v).__name__ for ms in modules.values() for v in ms})
        own = {id(p) for p in m.parameters()}
        res["bound"] = all(id(p) in own and _shard.is_sharded(p) for p in syms.params())
        m2 = _model(seed=4)
        syms2 = _symmetries(m2)
        _shard_model(m2)
        res["train"] = _monitor(m2, syms2, *_even(x, y, rank))
        res["diagonal_rows"] = _diagonal_rows(_diagonal_model(), *_even(x, y, rank), shard=True)
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # a finished worker skips teardown, where gloo's threads can abort it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def single() -> dict[str, Any]:
    x, y = _batch()
    m = _model()
    hand = _hand_built(m)
    res = _run(m, _symmetries(m), x, y)
    res["hand_charges"] = nf.charges(hand)
    m2 = _model(seed=4)
    res["train"] = _monitor(m2, _symmetries(m2), x[: 2 * EVEN], y[: 2 * EVEN])
    res["diagonal_rows"] = _diagonal_rows(
        _diagonal_model(), x[: 2 * EVEN], y[: 2 * EVEN], shard=False
    )
    return res


def _close(a: Any, b: Any, what: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            _close(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _close(u, v, f"{what}[{i}]")
    elif isinstance(a, torch.Tensor | np.ndarray):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-10, err_msg=what)
    else:
        assert a == b, what


@pytest.mark.parametrize(
    "key", ["stats", "charges", "flow", "elements", "teleported", "charges_after", "hand_charges"]
)
def test_fsdp_equals_one_process(
    ranks: list[dict[str, Any]], single: dict[str, Any], key: str
) -> None:
    assert single["stats"]["samples"], "the coupled set keeps per-sample gradients"
    for r in ranks:
        _close(r[key], single[key], key)


def test_fsdp_teleport_keeps_the_function(
    ranks: list[dict[str, Any]], single: dict[str, Any]
) -> None:
    assert single["function_gap"] < 1e-12
    moved = max(
        float((a - b).abs().max())
        for a, b in zip(single["teleported"].values(), _model().state_dict().values(), strict=True)
    )
    assert moved > 1e-3, "the teleport moved the parameters"
    for r in ranks:
        assert r["function_gap"] < 1e-12


def _rows_close(rows: list[Any], ref: list[Any]) -> None:
    assert all(np.isfinite(ref[0][k]).all() for k in ref[0] if k.startswith("distance"))
    for row, want in zip(rows, ref, strict=True):
        assert row.keys() == want.keys()
        for k in want:
            if k in ("time", "monitor_time"):
                continue
            np.testing.assert_allclose(row[k], want[k], rtol=1e-9, atol=1e-10, err_msg=k)


def test_fsdp_monitor_rows_equal_one_process(
    ranks: list[dict[str, Any]], single: dict[str, Any]
) -> None:
    for r in ranks:  # SGD momentum, coupled set: a full solve at every record
        _rows_close(r["train"]["rows"], single["train"]["rows"])


def test_fsdp_monitor_incremental_distance(
    ranks: list[dict[str, Any]], single: dict[str, Any]
) -> None:
    ref = single["diagonal_rows"]
    assert [float(row["distance_exact"]) for row in ref] == [1.0, 0.0, 0.0]  # chords between
    for r in ranks:
        _rows_close(r["diagonal_rows"], ref)


def test_fsdp_symmetries_stay_on_their_modules(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["same_objects"] and r["same_modules"] and r["bound"]
        assert r["classes"] == ["FSDPLayerNorm", "FSDPLinear"]


def test_fsdp_charges_gather_only_what_they_need(ranks: list[dict[str, Any]]) -> None:
    # diagonal charges are sums over shards; the rotation gathers its first layer (sharded
    # along the hidden axis d, rows of 2.weight and 2.bias) but not the second (3.weight,
    # whose hidden axis is its input axis, whole on every rank)
    for r in ranks:
        assert r["gathers"] == {
            "rescaling:0→2": [],
            "rotation:2→3": ["2.bias", "2.weight"],
            "scale:3→4": [],
            "rescaling:4→5": [],
            "rotation:5→6": ["5.bias", "5.weight"],  # 6.weight: rank 1's shard is empty
        }


def test_fsdp_refuses_what_it_does_not_support(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert "replaced by fully_shard" in r["stale"] and "bind_sharded" in r["stale"]
        ref, detect, verify, sharp, hsdp = r["errors"]
        assert "estimator='reference'" in ref and "estimator='hooks'" in ref
        assert "before sharding" in detect and "'0.weight'" in detect
        assert "SymmetrySet.verify" in verify and "before sharding" in verify
        assert "sharpness" in sharp and "unsharded copy" in sharp
        assert "2-D device mesh" in hsdp and "Replicate()" in hsdp and "Shard(dim=0)" in hsdp


@pytest.mark.parametrize("key", ["params", "grads", "buffers"])
def test_fsdp_equilibrium_teleport_after_training(
    ranks: list[dict[str, Any]], single: dict[str, Any], key: str
) -> None:
    # SGD-momentum steps, then EquilibriumTeleport: parameters, .grad and momentum buffers
    # (transported shard by shard) equal one process's
    for r in ranks:
        _close(r["train"][key], single["train"][key], key)
