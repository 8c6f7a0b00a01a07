"""FSDP2 on a Hugging Face GPT-2 LM (2 gloo processes) equals one process on the global batch.

Each block is sharded with ``fully_shard``: the HF ``Conv1D`` layers are read through their
``FSDPConv1D`` class, the per-head rotations act on column slices of the fused ``c_attn``,
the LayerNorms carry channel rescalings. Symmetries are found before sharding, statistics
collected at level ``'solve'`` on equal local batches (the LM loss is a mean over the
batch's tokens), then flows, charges and the teleported parameters are compared in float64
at 1e-10 (tests/test_fsdp.py covers the rest of the API on a small MLP).
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

fsdp = pytest.importorskip("torch.distributed.fsdp")
T = pytest.importorskip("transformers")

DT = torch.float64
LOCAL = 4  # sequences per rank
LR, S, WD = 0.05, 2 * LOCAL, 1e-3


def _gpt2() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cfg = T.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=32,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    ids = torch.randint(0, 32, (2 * LOCAL, 8), generator=torch.Generator().manual_seed(5))
    return T.GPT2LMHeadModel(cfg).to(DT).eval(), ids


def _run(m: nn.Module, ids: torch.Tensor, shard: bool) -> dict[str, Any]:
    syms = nf.find_symmetries(m, {"input_ids": ids[:2]})  # before sharding
    if shard:
        for block in m.transformer.h:
            fsdp.fully_shard(block)
        fsdp.fully_shard(m)
        rank = dist.get_rank()
        ids = ids[rank * LOCAL : (rank + 1) * LOCAL]
    st = nf.collect_stats(
        m, syms, lambda out, _: out.loss, {"input_ids": ids, "labels": ids}, None, level="solve"
    )
    sol = nf.solve_equilibrium(syms, st, lr=LR, batch_size=S, weight_decay=WD)
    out = {
        "flow": nf.noether_flow(syms, st, lr=LR, batch_size=S, weight_decay=WD),
        "charges": nf.charges(syms),
    }
    nf.teleport(m, sol)
    out["teleported"] = {n: _shard.full(p.detach()).clone() for n, p in m.named_parameters()}
    out["families"] = sorted({type(s).__name__ for s in syms})
    return out


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.save(_run(*_gpt2(), shard=True), Path(out) / f"rank{rank}.pt")
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
    out = tmp_path_factory.mktemp("fsdp_hf")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def single() -> dict[str, Any]:
    return _run(*_gpt2(), shard=False)


@pytest.mark.parametrize("key", ["flow", "charges", "teleported"])
def test_fsdp_gpt2_equals_one_process(
    ranks: list[dict[str, Any]], single: dict[str, Any], key: str
) -> None:
    ref = single
    assert ref["families"] == ["ChannelRescaling", "DoubleRotation"]
    for r in ranks:
        assert r["families"] == ref["families"]
        assert r[key].keys() == ref[key].keys()
        for k, want in ref[key].items():
            np.testing.assert_allclose(r[key][k], want, rtol=0, atol=1e-10, err_msg=f"{key}.{k}")
