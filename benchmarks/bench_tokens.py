"""Statistics cost on a token model (issue 15): GPT-2, 4 layers, width 256, 8 heads,
batch 8 × 128 tokens, cross-entropy on next-token targets.

The symmetries are those ``find_symmetries`` finds (per-head rotations of the fused
``c_attn``, LayerNorm affine → ``c_attn``/``c_fc`` rescalings). Plain
forward+backward and ``collect_stats`` (hooks, each level) run interleaved in blocks so that
load on the machine hits both alike; the ratio of medians is printed, then the solve time.

    python benchmarks/bench_tokens.py
    python benchmarks/bench_tokens.py --device cuda --blocks 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import Tensor, nn

import noetherflow as nf


class LM(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).logits


def build(
    device: str,
    vocab: int,
    *,
    layers: int = 4,
    width: int = 256,
    heads: int = 8,
    batch: int = 8,
    tokens: int = 128,
) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    """The GPT-2 LM, its symmetries (LayerNorm affines left out) and a random batch."""
    import transformers as T

    torch.manual_seed(0)
    cfg = T.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_positions=tokens,
        vocab_size=vocab,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        bos_token_id=0,
        eos_token_id=0,
    )
    m = LM(T.GPT2LMHeadModel(cfg)).to(device)
    x = torch.randint(0, vocab, (batch, tokens), device=device)
    y = torch.randint(0, vocab, (batch, tokens), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = nf.find_symmetries(m, x[:2])
    norms = {
        id(p) for mod in m.modules() if isinstance(mod, nn.LayerNorm) for p in mod.parameters()
    }
    syms = nf.SymmetrySet([s for s in found if not any(id(p) in norms for p in s.params)])
    return m, syms, x, y


def loss_fn(out: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=3)
    args = ap.parse_args()
    m, syms, x, y = build(args.device, args.vocab)
    kinds: dict[str, int] = {}
    for s in syms:
        kinds[type(s).__name__] = kinds.get(type(s).__name__, 0) + 1
    print(f"symmetries: {kinds}")

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def plain() -> None:
        m.zero_grad(set_to_none=True)
        loss_fn(m(x), y).backward()

    levels = ["diag", "solve", "neuron"]
    runs = {"plain": plain}
    for lv in levels:
        runs[lv] = lambda lv=lv: nf.collect_stats(m, syms, loss_fn, x, y, level=lv)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(args.blocks):
        for k, fn in runs.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["plain"])
    print(f"plain fwd+bwd: {base * 1e3:.1f} ms")
    for lv in levels:
        t = statistics.median(times[lv])
        print(f"collect_stats level={lv}: {t * 1e3:.1f} ms = {t / base:.2f}x plain")
    st = nf.collect_stats(m, syms, loss_fn, x, y, level="solve")
    t0 = time.perf_counter()
    nf.solve_equilibrium(syms, st, lr=0.01, batch_size=8, weight_decay=1e-2)
    print(f"solve_equilibrium: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
