"""FSDP (``fully_shard``, gloo on CPU, 2 processes): the statistics refuse sharded
parameters with a clear error instead of returning per-shard numbers."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import noetherflow as nf

fsdp = pytest.importorskip("torch.distributed.fsdp")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
        syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
        fsdp.fully_shard(m)
        x, y = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
        msgs = []
        for est in ("hooks", "reference"):
            try:
                nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=est)
                msgs.append("no error")
            except nf.UnsupportedLayerError as e:
                msgs.append(str(e))
        try:
            with nf.capture(m, syms) as cap:
                nn.MSELoss()(m(x), y).backward()
            _ = cap.stats
            msgs.append("no error")
        except nf.UnsupportedLayerError as e:
            msgs.append(str(e))
        Path(out, f"rank{rank}.txt").write_text("\n---\n".join(msgs))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fsdp_statistics_raise_a_clear_error(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        msgs = (tmp_path / f"rank{r}.txt").read_text().split("\n---\n")
        assert len(msgs) == 3
        for msg in msgs:
            assert "FSDP fully_shard" in msg and "'0.weight'" in msg, msg
