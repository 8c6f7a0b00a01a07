"""A new detection matcher in one file: the rescaling through ``torch.abs``.

``|e^λ x| = e^λ |x|``: like a ReLU, ``abs`` is positively homogeneous, so the rescaling of
the neurons between two linear layers joined by it is a symmetry the built-in matchers do not
propose. The matcher runs at the ``"layer"`` stage (once per parameterised layer) and returns
candidates; ``find_symmetries`` checks each numerically before it is returned.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import noetherflow as nf
from noetherflow.symmetry._fx.engine import GraphInfo, Ledger, Proposal


# --8<-- [start:matcher]
def abs_rescaling(info: GraphInfo, src: Any, ledger: Ledger) -> list[Proposal]:
    """Linear → torch.abs → Linear: propose the per-neuron rescaling."""
    users = list(src.node.users)
    if len(users) != 1 or users[0].target is not torch.abs or len(users[0].users) != 1:
        return []
    reader = next(iter(users[0].users))
    first, second = src.module, info.module(reader)
    if not isinstance(first, nn.Linear) or not isinstance(second, nn.Linear):
        return []
    label = f"abs-rescaling:{src.name}→{info.qual(str(reader.target))}"
    return [
        Proposal(
            nf.Family.RESCALING,
            label,
            lambda: nf.Rescaling(first, second, label=label),  # built only if kept
            [*src.params, second.weight],
            info.order[src.node],
        )
    ]


nf.register_matcher("abs-rescaling", abs_rescaling)
# --8<-- [end:matcher]
