"""Tutorial: Noether charges and flows under DDP (torchrun), on CPU with gloo.

Nothing noetherflow-specific is needed under ``torch.distributed``: ``nf.capture``,
``nf.collect_stats`` and ``nf.NoetherMonitor`` all-reduce their statistics whenever a process
group is initialised (one small all-reduce per record, no extra backward pass), so every rank
sees the statistics of the *global* batch — uneven local batches included, since each rank's
entries are weighted by N_r/N. Every rank must call ``mon.track()``/``mon.step()``; only rank
0 writes files. Pass ``batch_size`` = the global batch size: that is the S of SGD.

Either command works (one machine, 2 CPU processes)::

    torchrun --standalone --nproc_per_node=2 docs/tutorials/ddp_torchrun.py
    python docs/tutorials/ddp_torchrun.py        # spawns the 2 processes itself

For several machines see ``examples/ddp_torchrun.py`` (the same script at full size, NCCL
when CUDA is available).

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

LOCAL = (24, 40)  # uneven local batch sizes of ranks 0 and 1
LR, WD = 0.05, 1e-4  # η and γ of γ‖θ‖²


def make_model() -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(0)  # the same initial weights on every rank
    m = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    m = m.double()
    syms = nf.SymmetrySet(
        [nf.Rescaling(m[0], m[2], label="h1"), nf.Rescaling(m[2], m[4], label="h2")]
    )
    return m, syms


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    n = LOCAL[rank]
    return torch.randn(n, 10, generator=g, dtype=torch.float64), torch.randint(
        0, 3, (n,), generator=g
    )


def train(n_steps: int) -> float:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == len(LOCAL), f"this tutorial is written for {len(LOCAL)} processes"
    model, syms = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, weight_decay=2 * WD)  # λ = 2γ
    loss_fn = nn.CrossEntropyLoss()
    mon = nf.NoetherMonitor(
        ddp,
        syms,
        every=2,
        lr=LR,
        batch_size=sum(LOCAL),
        weight_decay=WD,
        logging=nf.LogOptions(progress=False),
    )
    reference: dict[str, torch.Tensor] = {}
    for step in range(n_steps):
        x, y = batch(step, rank)
        if step == 0:  # one process on the concatenated batch, computed on every rank
            xs, ys = zip(*(batch(0, r) for r in range(world)), strict=True)
            st = nf.collect_stats(
                model, syms, loss_fn, torch.cat(xs), torch.cat(ys), all_reduce=False
            )
            reference = nf.noether_flow(syms, st, lr=LR, batch_size=sum(LOCAL), weight_decay=WD)
            model.zero_grad()
        with mon.track():
            loss = loss_fn(ddp(x), y)
            loss.backward()
        mon.step(loss)  # before opt.step(): statistics and charges refer to the same θ
        opt.step()
        opt.zero_grad()
    mon.close()
    h = mon.history
    err = max(
        float((torch.as_tensor(h[f"flow/{n}"][0]) - reference[n]).abs().max()) for n in syms.names
    )
    if rank == 0:
        print(f"{world} ranks, local batches {LOCAL}; records at steps {h['step'].tolist()}")
        print(f"max |flow(DDP monitor) − flow(one process, concatenated batch)| = {err:.2e}")
    dist.barrier()  # tear down together: a rank whose peer already closed can abort (gloo)
    dist.destroy_process_group()
    assert err < 1e-10, err
    return err


def _spawned(rank: int, port: int, n_steps: int) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(len(LOCAL)),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    train(n_steps)
    # A finished worker skips the interpreter's teardown: gloo's threads could abort it
    # (SIGABRT after the check had passed, seen under load), failing a correct run.
    sys.stdout.flush()
    os._exit(0)


def main(tiny: bool = False) -> None:
    n_steps = 4 if tiny else 40
    if "RANK" in os.environ:  # launched by torchrun
        train(n_steps)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(port, n_steps), nprocs=len(LOCAL), join=True)


if __name__ == "__main__":
    main("--tiny" in sys.argv[1:])
