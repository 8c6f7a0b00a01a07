"""Layers that read batch × tokens flattened into one axis (issue 26).

A model may reshape ``[B, T, C]`` to ``[B·T, C]`` before an MLP. The hooks then see ``B·T``
rows along dim 0 where the batch has B samples, and would treat every row as a sample.
:func:`row_order` finds how the rows map to samples, by perturbing sample 0 of the inputs
and watching which rows of each captured layer's input change: rows ``0 … T−1`` (batch-major,
``x.reshape(B * T, C)``) or rows ``0, B, 2B, …`` (token-major, ``x.transpose(0, 1)``
first). :func:`regroup` then puts the factors back as ``[B, T·T', …]``: sample n's gradient is
the sum over its rows, which the token axis of the factors already sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._inputs import ModelInputs

__all__ = ["regroup", "row_order"]


def _perturbed(inp: ModelInputs, n: int) -> ModelInputs | None:
    """``inp`` with sample 0 of its first batched tensor changed (None if there is none)."""
    first = next((t for t in inp.tensors() if t.dim() and t.shape[0] == n), None)
    if first is None:
        return None
    new = first.clone()
    if new.is_floating_point():
        new[0] = new[0] + 1.0 + new[0].abs()
    else:
        hi = int(new.max()) + 1
        new[0] = (new[0] + 1) % max(hi, 2)
    return inp.map(lambda a: new if a is first else a)


def _inputs_of(model: nn.Module, mods: Sequence[nn.Module], inp: ModelInputs) -> list[Tensor]:
    got: dict[int, Tensor] = {}

    def hook(m: nn.Module, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], Tensor) and id(m) not in got:
            got[id(m)] = args[0].detach().clone()

    handles = [m.register_forward_pre_hook(hook) for m in mods]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            inp(model)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, v in buffers:
                b.copy_(v)
    return [got[id(m)] for m in mods if id(m) in got]


def row_order(
    model: nn.Module, mods: Sequence[nn.Module], inp: ModelInputs, n: int, rows: int
) -> bool | None:
    """True: batch-major rows, False: token-major, None: neither (or unclear)."""
    t = rows // n
    if rows % n or t < 2:
        return None
    other = _perturbed(inp, n)
    if other is None:
        return None
    base, moved = _inputs_of(model, mods, inp), _inputs_of(model, mods, other)
    if len(base) != len(mods) or len(moved) != len(mods):
        return None
    batch_rows, token_rows = set(range(t)), set(range(0, rows, n))
    verdicts = set()
    for a, b in zip(base, moved, strict=True):
        if a.shape != b.shape or a.shape[0] != rows:
            return None
        diff = (a - b).reshape(rows, -1).abs().amax(1)
        changed = {int(i) for i in torch.nonzero(diff != 0).flatten()}
        if not changed or not bool(torch.isfinite(diff).all()):
            return None
        if changed <= batch_rows and not changed <= token_rows:
            verdicts.add(True)
        elif changed <= token_rows and not changed <= batch_rows:
            verdicts.add(False)
        else:
            return None
    return verdicts.pop() if len(verdicts) == 1 else None


def regroup(t: Tensor, n: int, batch_major: bool) -> Tensor:
    """Factor ``[n·T, T', …]`` → ``[n, T·T', …]`` (rows of sample i together)."""
    rows, rest = t.shape[0], t.shape[1:]
    k = rows // n
    x = t.reshape(n, k, *rest) if batch_major else t.reshape(k, n, *rest).transpose(0, 1)
    if not rest:
        return x
    return x.reshape(n, k * rest[0], *rest[1:])
