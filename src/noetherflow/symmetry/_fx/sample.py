"""The bounded part of the example that each candidate is checked on (issue 28).

A candidate's check compares a signal before and after a group element; it needs a signal
that depends on the parameters (the degeneracy control says whether it does), not a large
batch. Checking every candidate on the whole example made detection cost
(candidates × examples): 312 reruns of a GPT-2 block on 4 × 128 tokens. So candidates are
captured, matched and checked on a *sample* of the example, chosen by a fixed rule:

* at most :data:`ROWS` rows: the first ones along dim 0 of every input tensor whose dim 0
  is the batch size (dim 0 of the first input tensor), as :meth:`ModelInputs.slice` cuts;
* when the first input tensor holds token ids (an integer tensor ``[B, T]``), at most
  :data:`TOKENS` tokens in all: the first ⌊TOKENS / rows⌋ of each row (at least one), cut along
  dim 1 of every tensor whose dim 1 is ``T`` (an attention mask, position ids).

The targets of a loss are cut the same way. An example within both bounds is its own sample.
Every check, the final composed one included, runs on the sample. The whole example is used
where the sample cannot decide: a candidate whose check is degenerate on the sample (its rows
do not see the parameters) is checked again on the whole example, with the same float64 copy,
and a model that does not run on the sample is checked on the whole example
(:func:`noetherflow.find_symmetries`). A composed check on the whole example costs two
float64 whole-model forwards on it: 5.9 s of 10.7 s for a 2-layer GPT-2 of width 768 at
4 × 128 tokens on one thread, far more at 12 layers than detection's 10 s target (issue 28).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree
from torch import Tensor

from noetherflow._inputs import ModelInputs

__all__ = ["ROWS", "TOKENS", "Sample", "sample_of"]

ROWS = 8
TOKENS = 32


@dataclass(frozen=True)
class Sample:
    """The sample's inputs and targets, and how it was cut (``rows``/``tokens`` of the whole)."""

    inp: ModelInputs
    targets: Any
    rows: tuple[int, int]  # (kept, of)
    tokens: tuple[int, int] | None  # (kept per row, of) when token ids were cut

    @property
    def whole(self) -> bool:
        return self.rows[0] == self.rows[1] and (
            self.tokens is None or self.tokens[0] == self.tokens[1]
        )

    def describe(self) -> str:
        what = f"the first {self.rows[0]} of {self.rows[1]} rows"
        if self.tokens is not None and self.tokens[0] < self.tokens[1]:
            what += f", the first {self.tokens[0]} of {self.tokens[1]} tokens of each"
        return what


def _cut(v: Any, n: int, rows: int, t: int, tokens: int) -> Any:
    if not isinstance(v, Tensor) or v.ndim == 0:
        return v
    if v.shape[0] == n and rows < n:
        v = v[:rows]
    if tokens < t and v.ndim >= 2 and v.shape[1] == t:
        v = v[:, :tokens]
    return v


def sample_of(inp: ModelInputs, targets: Any, rows: int = ROWS, tokens: int = TOKENS) -> Sample:
    """The sample of ``inp`` (and ``targets``) by the rule of the module docstring."""
    leaves = [v for _, v in inp.named_leaves() if isinstance(v, Tensor) and v.ndim]
    if not leaves:
        return Sample(inp, targets, (1, 1), None)
    first = leaves[0]
    n = int(first.shape[0])
    keep = min(n, rows)
    t, keep_t = 0, 0
    ids = first.ndim == 2 and not first.is_floating_point() and not first.is_complex()
    if ids:
        t = int(first.shape[1])
        keep_t = min(t, max(1, tokens // keep))
    cut = lambda v: _cut(v, n, keep, t, keep_t)  # noqa: E731 - one leaf at a time
    return Sample(
        inp.map(cut),
        pytree.tree_map(cut, targets),
        (keep, n),
        (keep_t, t) if ids else None,
    )
