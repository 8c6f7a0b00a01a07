"""Overhead of NoetherMonitor over plain training (issue 4: at most 10 % with every=10).

The MLP benchmark of the core issue: 784-1024-1024-10 ReLU, batch 256, cross-entropy, plain
SGD, per-neuron rescaling symmetries of both hidden layers (2048 generators). The plain loop
and the monitored loop run side by side, interleaved in blocks so that load on the machine
hits both alike; the ratio of median block times is printed, with the monitor's own time
per record broken down.

    python benchmarks/bench_monitor.py                   # charges + flows every 10 steps
    python benchmarks/bench_monitor.py --distance-every 100
    python benchmarks/bench_monitor.py --device cuda --blocks 10

Exit status 1 when the ratio exceeds ``--max-ratio`` (default 1.10), so the script can gate CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

import noetherflow as nf
from noetherflow.monitor import NoetherMonitor


def build(device: str, seed: int = 0) -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ).to(device)
    syms = nf.SymmetrySet(
        [nf.Rescaling(m[0], m[2], label="h1"), nf.Rescaling(m[2], m[4], label="h2")]
    )
    return m, syms


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="steps per block (a multiple of --every)")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks per loop")
    ap.add_argument(
        "--distance-every",
        type=int,
        default=0,
        help="also solve for the equilibrium distance every N steps (0: never)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--max-ratio", type=float, default=1.10)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps, 256, 784, generator=g).to(dev)
    y = torch.randint(0, 10, (args.steps, 256), generator=g).to(dev)
    loss_fn = nn.CrossEntropyLoss()
    lr = 0.01

    m_plain, _ = build(dev)
    m_mon, syms = build(dev)
    opt_plain = torch.optim.SGD(m_plain.parameters(), lr=lr)
    opt_mon = torch.optim.SGD(m_mon.parameters(), lr=lr)
    mon = NoetherMonitor(
        m_mon,
        syms,
        every=args.every,
        lr=lr,
        batch_size=256,
        distance=args.distance_every > 0,
        distance_every=args.distance_every or None,
        progress=False,
        tensorboard=False,
    )

    def plain_block() -> float:
        sync(dev)
        t = time.perf_counter()
        for i in range(args.steps):
            loss = loss_fn(m_plain(x[i]), y[i])
            loss.backward()
            opt_plain.step()
            opt_plain.zero_grad()
        sync(dev)
        return time.perf_counter() - t

    def monitored_block() -> float:
        sync(dev)
        t = time.perf_counter()
        for i in range(args.steps):
            with mon.track():
                loss = loss_fn(m_mon(x[i]), y[i])
                loss.backward()
            mon.step(loss)
            opt_mon.step()
            opt_mon.zero_grad()
        sync(dev)
        return time.perf_counter() - t

    plain_block()
    monitored_block()  # warm-up (allocations, lazy imports)
    tp, tm = [], []
    for _ in range(args.blocks):
        tp.append(plain_block())
        tm.append(monitored_block())
    p, q = statistics.median(tp), statistics.median(tm)
    ratio = q / p
    h = mon.history
    rec = h["monitor_time"][-args.blocks * (args.steps // args.every) :]
    print(
        f"device={dev} threads={torch.get_num_threads()} every={args.every} "
        f"steps/block={args.steps} blocks={args.blocks} distance_every={args.distance_every}"
    )
    print(f"plain     {1e3 * p / args.steps:8.2f} ms/step  (median block {p:.3f} s)")
    print(f"monitored {1e3 * q / args.steps:8.2f} ms/step  (median block {q:.3f} s)")
    print(
        f"monitor's own time per record (charges, flows, distance): "
        f"{1e3 * statistics.median(rec.tolist()):.1f} ms"
    )
    print(f"overhead ratio monitored/plain = {ratio:.3f}  (target <= {args.max_ratio:.2f})")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
