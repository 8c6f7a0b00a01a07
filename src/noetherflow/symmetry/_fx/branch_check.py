"""Verification on the other branches of control flow on input values (issue 26).

When the traced forward converted an input-dependent value to Python
(:mod:`noetherflow.symmetry._fx.branches`), a symmetry verified on the example holds for the
branch the example took, not necessarily for the others: ``relu if x.mean() > 0 else tanh``
has a rescaling on one branch only. :func:`check_branches` therefore

1. runs the model eagerly on a few variants of the example inputs (:func:`input_variants`:
   negated, shifted and resampled floats; resampled ids; masks with padding) and records
   the branch outcomes of each (the same :class:`~.branches.InputBranches` watch);
2. checks every verified symmetry on the whole model (float64) on each variant whose
   outcomes differ from the example's: a symmetry that changes the outputs there is
   rejected, naming the branch;
3. calls a branch *covered* when it is a ``bool`` seen both ways (the example and the
   variants together). The symmetries left are verified on every branch only when every
   branch is covered; otherwise they are kept but not marked verified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.branches import Branch, InputBranches

__all__ = ["BranchVerdict", "check_branches", "input_variants", "outcomes"]

_MAX_OTHER = 4  # distinct other-branch variants checked (each costs a float64 copy)


def _float_variants(x: Tensor, gen: torch.Generator) -> list[Tensor]:
    """Negated, shifted both ways, scaled and resampled copies of a float tensor ``x``."""
    if x.numel() == 0:
        return []
    std = float(x.detach().double().std()) if x.numel() > 1 else 1.0
    std = std if std > 0 else 1.0
    shift = float(x.detach().double().abs().max()) + std
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype)
    return [-x, x + shift, x - shift, 3.0 * x, noise * std]


def _int_variants(x: Tensor, gen: torch.Generator) -> list[Tensor]:
    """Padding patterns for 0/1 masks; resampled and reversed values for ids."""
    if x.numel() == 0:
        return []
    lo, hi = int(x.min()), int(x.max())
    if x.dtype == torch.bool or (lo >= 0 and hi <= 1):
        out = []
        if x.dim() >= 1 and x.shape[-1] > 1:
            for pos in (-1, 0):  # right and left padding of one position per row
                m = x.clone()
                m[..., pos] = 0
                m[..., 1 if pos == 0 else 0] = 1  # every row keeps a visible position
                out.append(m)
        return out
    ids = torch.randint(lo, hi + 1, x.shape, generator=gen).to(x.dtype)
    return [ids, x.flip(-1) if x.dim() else x]


def input_variants(inp: ModelInputs, seed: int) -> list[ModelInputs]:
    """Variants of ``inp`` that change one input tensor at a time (same shapes and dtypes)."""
    gen = torch.Generator().manual_seed(seed + 7)
    leaves = [(k, v) for k, v in inp.named_leaves() if isinstance(v, Tensor)]
    out: list[ModelInputs] = []
    for _, t in leaves:
        if t.is_floating_point():
            new = _float_variants(t, gen)
        elif t.is_complex():
            new = []
        else:
            new = _int_variants(t, gen)
        out.extend(_replaced(inp, t, v) for v in new)
    return out


def _replaced(inp: ModelInputs, old: Tensor, new: Tensor) -> ModelInputs:
    """``inp`` with the tensor ``old`` replaced by ``new``."""
    return inp.map(lambda a: new if a is old else a)


def outcomes(
    model: nn.Module, inp: ModelInputs, isolated: Callable[[], Any]
) -> tuple[Branch, ...] | None:
    """The branches an eager forward of ``model`` on ``inp`` takes, in order; None if it fails."""
    watch = InputBranches([inp.args, inp.kwargs])
    try:
        with isolated(), watch:
            inp(model)
    except Exception:  # a variant the model does not accept: it says nothing
        return None
    return tuple(watch.branches)


@dataclass
class BranchVerdict:
    """What :func:`check_branches` found.

    ``branches``: those of the example; ``uncovered``: those not seen both ways;
    ``others``: the number of variants checked that take another branch;
    ``failed``: symmetry index → why it was rejected.
    """

    branches: tuple[Branch, ...]
    uncovered: list[Branch] = field(default_factory=list)
    others: int = 0
    failed: dict[int, str] = field(default_factory=dict)

    def describe(self, limit: int = 3) -> str:
        """The branches, for warnings and notes."""
        parts = [b.describe() for b in self.branches[:limit]]
        more = f" and {len(self.branches) - limit} more" if len(self.branches) > limit else ""
        return "; ".join(parts) + more


def _key(b: Branch) -> tuple[str, str]:
    return (b.where, b.op)


def check_branches(
    model: nn.Module,
    inp: ModelInputs,
    isolated: Callable[[], Any],
    seed: int,
    check_on: Callable[[ModelInputs, int], float],
    n_syms: int,
    tolerance: float,
) -> BranchVerdict:
    """Check ``n_syms`` symmetries on the inputs that take other branches (module docstring).

    ``check_on(variant, i)`` is the relative output change of symmetry ``i`` on the whole
    model run on ``variant`` (float64).
    """
    base = outcomes(model, inp, isolated) or ()
    verdict = BranchVerdict(base)
    seen: dict[tuple[str, str], set[str]] = {}
    for b in base:
        seen.setdefault(_key(b), set()).add(b.value)
    distinct: set[tuple[Branch, ...]] = {base}
    for var in input_variants(inp, seed):
        got = outcomes(model, inp=var, isolated=isolated)
        if got is None or got in distinct:
            continue
        distinct.add(got)
        for b in got:
            seen.setdefault(_key(b), set()).add(b.value)
        if verdict.others >= _MAX_OTHER:
            continue
        verdict.others += 1
        changed = [b for b in got if b not in base] or list(base)
        for i in range(n_syms):
            if i in verdict.failed:
                continue
            rel = check_on(var, i)
            if not rel <= tolerance:
                verdict.failed[i] = (
                    f"changes the outputs by {rel:.2g} on inputs taking another branch at "
                    f"{changed[0].describe()}"
                )
    verdict.uncovered = [
        b for b in base if not (b.op == "__bool__" and {"True", "False"} <= seen[_key(b)])
    ]
    return verdict


def describe_uncovered(bs: Sequence[Branch]) -> str:
    return "; ".join(b.describe() for b in bs[:3]) + (
        f" and {len(bs) - 3} more" if len(bs) > 3 else ""
    )
