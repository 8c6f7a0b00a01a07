"""Noether charges, flows, the equilibrium and a teleport of an FSDP2 (``fully_shard``) model.

One machine, 2 CPU processes (gloo) — either command works:

    torchrun --standalone --nproc_per_node=2 examples/fsdp_torchrun.py
    python examples/fsdp_torchrun.py                 # spawns the 2 processes itself

(several machines: the ``torchrun`` commands of ``examples/ddp_torchrun.py``; NCCL is used
when CUDA is available).

The order that works: find the symmetries on the whole model, *then* shard it. The set keeps
pointing at the same modules (now ``FSDPLinear`` …); the first noetherflow call that sees
the sharded model (``NoetherMonitor``, ``collect_stats``, ``teleport``) swaps its parameters
for the sharded ones in place. The statistics come from the layers' whole activations of each
rank's batch, all-reduced as under DDP; the charges are sums over the local shards (a
rotation gathers the one side that is sharded along its hidden axis); a teleport scales each
shard by its own generators.

The script trains a few SGD steps under the monitor, teleports to the equilibrium, and
checks two numbers against one process that holds the whole model and the global batch
(gathered here): the monitor's first flows and the teleported parameters, to 1e-10 in float64.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import noetherflow as nf

LOCAL = 32  # samples per rank (FSDP averages the ranks' gradients: equal batches)
LR, WD = 0.05, 1e-4  # η and γ of γ‖θ‖² (SGD's weight_decay is 2γ)


def make_model(device: torch.device) -> nn.Sequential:
    torch.manual_seed(0)  # the same initial weights on every rank
    m = nn.Sequential(
        nn.Linear(20, 33),
        nn.ReLU(),
        nn.Linear(33, 17),
        nn.Linear(17, 17),
        nn.LayerNorm(17, eps=0.0),  # eps = 0: an exact scale invariance
        nn.Linear(17, 4),
    )
    return m.to(device, torch.float64)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(LOCAL, 20, generator=g, dtype=torch.float64)
    return x.to(device), torch.randint(0, 4, (LOCAL,), generator=g).to(device)


def train(
    model: nn.Module, syms: nf.SymmetrySet, world: int, rank: int, dev: torch.device, n_steps: int
) -> tuple[nf.EquilibriumSolution, dict[str, torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=2 * WD)
    mon = nf.NoetherMonitor(
        model,
        syms,
        every=2,
        optimizer=opt,
        batch_size=world * LOCAL,
        full_matrices=True,
        logging=nf.LogOptions(progress=False),
    )
    loss_fn = nn.CrossEntropyLoss()
    for step in range(n_steps):
        x, y = batch(step, rank, dev)
        with mon.track():
            loss = loss_fn(model(x), y)
            loss.backward()
        mon.step(loss)
        opt.step()
        opt.zero_grad()
    mon.close()
    h = mon.history  # a rotation's flow is the [d, d] matrix under flow_matrix/ (full_matrices)
    first = {
        n: torch.as_tensor(h.get(f"flow_matrix/{k}", h[f"flow/{k}"])[0])
        for n, k in mon.keys.items()
    }
    x, y = batch(n_steps, rank, dev)
    st = nf.collect_stats(model, syms, loss_fn, x, y, level="solve")
    sol = nf.solve_equilibrium(syms, st, lr=LR, batch_size=world * LOCAL, weight_decay=WD)
    nf.teleport(model, sol)
    return sol, first


def main(n_steps: int = 6) -> None:
    backend = os.environ.get("NF_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if backend == "nccl"
        else torch.device("cpu")
    )
    model = make_model(dev)
    syms = nf.find_symmetries(model, batch(0, rank, dev)[0])  # before sharding
    for layer in model:  # one FSDP unit per layer with parameters, then the root
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    sol, first = train(model, syms, world, rank, dev, n_steps)
    whole = {n: p.detach().full_tensor() for n, p in model.named_parameters()}  # for the check only

    # the reference: one process, the whole model, every rank's batch
    ref = make_model(dev)
    ref_syms = nf.find_symmetries(ref, batch(0, rank, dev)[0])
    cat = [torch.cat(t) for t in zip(*(batch(0, r, dev) for r in range(world)), strict=True)]
    st0 = nf.collect_stats(ref, ref_syms, nn.CrossEntropyLoss(), *cat, all_reduce=False)
    flows0 = nf.noether_flow(ref_syms, st0, lr=LR, batch_size=world * LOCAL, weight_decay=WD)
    err_flow = max(float((first[n] - f.cpu()).abs().max()) for n, f in flows0.items())
    opt = torch.optim.SGD(ref.parameters(), lr=LR, weight_decay=2 * WD)
    for step in range(n_steps):
        xs, ys = (
            torch.cat(t) for t in zip(*(batch(step, r, dev) for r in range(world)), strict=True)
        )
        nn.CrossEntropyLoss()(ref(xs), ys).backward()
        opt.step()
        opt.zero_grad()
    xs, ys = (
        torch.cat(t) for t in zip(*(batch(n_steps, r, dev) for r in range(world)), strict=True)
    )
    st = nf.collect_stats(
        ref, ref_syms, nn.CrossEntropyLoss(), xs, ys, level="solve", all_reduce=False
    )
    nf.teleport(
        ref, nf.solve_equilibrium(ref_syms, st, lr=LR, batch_size=world * LOCAL, weight_decay=WD)
    )
    err_tp = max(float((whole[n] - p.detach()).abs().max()) for n, p in ref.named_parameters())
    if rank == 0:
        print(f"{world} ranks × {LOCAL} samples; {len(syms)} symmetries: {', '.join(syms.names)}")
        print(f"max distance to the equilibrium before the teleport: {sol.max_distance():.3e}")
        print(f"max |flow(FSDP monitor) − flow(one process)|          = {err_flow:.2e}")
        print(f"max |θ teleported (FSDP) − θ teleported (one process)| = {err_tp:.2e}")
    dist.barrier()  # tear down together (gloo)
    dist.destroy_process_group()
    assert err_flow < 1e-10 and err_tp < 1e-10, (err_flow, err_tp)


def _spawned(rank: int, world: int, port: int, n_steps: int) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        NF_BACKEND="gloo",
    )
    torch.set_num_threads(1)
    main(n_steps)


if __name__ == "__main__":
    steps = 2 if "--tiny" in sys.argv[1:] else 6
    if "RANK" in os.environ:  # launched by torchrun
        main(steps)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        torch.multiprocessing.spawn(_spawned, args=(2, free, steps), nprocs=2, join=True)
