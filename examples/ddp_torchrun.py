"""Noether charges and flows of a DDP run: every rank sees the statistics of the global batch.

One machine, 2 CPU processes (gloo) — either command works:

    torchrun --standalone --nproc_per_node=2 examples/ddp_torchrun.py
    python examples/ddp_torchrun.py                 # spawns the 2 processes itself

Several machines: start the same command on every machine, with one process per GPU; NCCL is
used when CUDA is available. With a fixed master (machine 0 at 10.0.0.1):

    # on machine 0                                   # on machine 1
    torchrun --nnodes=2 --nproc_per_node=8 \\         torchrun --nnodes=2 --nproc_per_node=8 \\
      --node_rank=0 --master_addr=10.0.0.1 \\          --node_rank=1 --master_addr=10.0.0.1 \\
      --master_port=29500 examples/ddp_torchrun.py     --master_port=29500 examples/ddp_torchrun.py

or with elastic rendezvous (same command everywhere):

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d \\
      --rdzv_endpoint=10.0.0.1:29500 --rdzv_id=noether1 examples/ddp_torchrun.py

Nothing noetherflow-specific is needed: ``nf.capture``/``nf.collect_stats`` and
``nf.NoetherMonitor`` all-reduce their statistics whenever ``torch.distributed`` is
initialised (one small all-reduce per record, no extra backward pass). Every rank must call
``mon.track()``/``mon.step()``; only rank 0 writes files.

The script ends by checking a number: the flows the monitor recorded on the first step (from
all-reduced statistics of uneven local batches) equal the flows of ``collect_stats`` on the
concatenated global batch in one process, to 1e-10 in float64.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
from torch import nn

import noetherflow as nf
from noetherflow.monitor import NoetherMonitor

LOCAL = (48, 80)  # uneven local batch sizes on ranks 0 and 1 (others use 64)
LR, WD = 0.05, 1e-4


def local_size(rank: int) -> int:
    return LOCAL[rank] if rank < len(LOCAL) else 64


def make_model(device: torch.device) -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(0)  # the same initial weights on every rank
    m = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    m = m.to(device, torch.float64)
    syms = nf.SymmetrySet(
        [nf.Rescaling(m[0], m[2], label="h1"), nf.Rescaling(m[2], m[4], label="h2")]
    )
    return m, syms


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(local_size(rank), 20, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (local_size(rank),), generator=g)
    return x.to(device), y.to(device)


def main() -> float:
    backend = os.environ.get("NF_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if backend == "nccl"
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model, syms = make_model(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, weight_decay=2 * WD)  # decay λ = 2γ
    loss_fn = nn.CrossEntropyLoss()
    global_batch = sum(local_size(r) for r in range(world))
    mon = NoetherMonitor(
        ddp,
        syms,
        every=5,
        lr=LR,
        batch_size=global_batch,
        weight_decay=WD,
        logging=nf.LogOptions(log_dir="runs/ddp_example", progress=False),
    )
    first: dict[str, torch.Tensor] = {}
    for step in range(20):
        x, y = batch(step, rank, device)
        if step == 0:  # the reference: one process, concatenated batch (gathered here)
            first = reference_flows(model, syms, x, y, world)
        with mon.track():
            loss = loss_fn(ddp(x), y)
            loss.backward()
        mon.step(loss)
        opt.step()
        opt.zero_grad()
    mon.close()
    h = mon.history
    err = max(
        float((torch.as_tensor(h[f"flow/{n}"][0]) - first[n].cpu()).abs().max()) for n in syms.names
    )
    if rank == 0:
        print(f"{world} ranks, global batch {global_batch}; records at steps {h['step'].tolist()}")
        print(
            f"loss {h['loss'][0]:.4f} → {h['loss'][-1]:.4f}; max |flow| at step 0: "
            f"{max(float(abs(h[f'flow/{n}'][0]).max()) for n in syms.names):.3e}"
        )
        print(f"max |flow(DDP monitor) − flow(one process, concatenated batch)| = {err:.2e}")
    dist.destroy_process_group()
    assert err < 1e-10, err
    return err


def reference_flows(
    model: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor, world: int
) -> dict[str, torch.Tensor]:
    """Flows of one process on the concatenated global batch (gathered from all ranks)."""
    sizes = [local_size(r) for r in range(world)]
    xs, ys = _gather_uneven(x, sizes), _gather_uneven(y, sizes)
    st = nf.collect_stats(
        model, syms, nn.CrossEntropyLoss(), torch.cat(xs), torch.cat(ys), all_reduce=False
    )
    return nf.noether_flow(syms, st, lr=LR, batch_size=sum(sizes), weight_decay=WD)


def _gather_uneven(t: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """all_gather needs equal shapes: pad to the largest local batch, then trim."""
    pad = t.new_zeros(max(sizes), *t.shape[1:])
    pad[: t.shape[0]] = t
    bufs = [torch.empty_like(pad) for _ in sizes]
    dist.all_gather(bufs, pad)
    return [b[:n] for b, n in zip(bufs, sizes, strict=True)]


def _spawned(rank: int, world: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        NF_BACKEND="gloo",
    )
    main()


if __name__ == "__main__":
    if "RANK" in os.environ:  # launched by torchrun
        main()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        torch.multiprocessing.spawn(_spawned, args=(2, free), nprocs=2, join=True)
        sys.exit(0)
