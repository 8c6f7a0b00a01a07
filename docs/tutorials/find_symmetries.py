"""Tutorial: find the symmetries of a CNN and of a transformer block.

``nf.find_symmetries(model, example_inputs)`` traces the model with torch.fx, follows the
output features of every Linear/Conv layer through the graph, proposes the exponential
symmetries it can prove from the graph (per-neuron rescaling across ReLU, scale invariance
before a normalisation layer, double rotation between two linear maps — per attention head
for ``q·kᵀ`` and ``v → o``), and checks every proposal numerically in float64. The coverage
report says, for every parameter, which symmetries act on it or why none does (a residual
add, a non-homogeneous activation, a model output, …).

The mode matters: BatchNorm's scale invariance exists in training mode only, and dropout in
training mode breaks rotations. Call ``model.train()``/``model.eval()`` first, as you train.

The script ends by checking numbers: the families found in each model, and the largest
relative output change under a random group element, which must be below 1e-9.

Run: ``python docs/tutorials/find_symmetries.py [--tiny]``
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf


def small_cnn(width: int) -> nn.Sequential:
    """conv → ReLU → pool → conv → BatchNorm → ReLU → flatten → linear → ReLU → linear."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * width * 16, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


class Block(nn.Module):
    """A pre-norm transformer block: multi-head attention and a ReLU MLP, both residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (
            m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for m in (self.q, self.k, self.v)
        )
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.relu(self.fc1(self.ln2(x))))


def report(model: nn.Module, example: torch.Tensor) -> tuple[Counter[str], float]:
    syms = nf.find_symmetries(model, example)
    print(syms)  # a table: name, family, parameters acted on, size, verified
    print(syms.coverage(model))  # every parameter: covered, or why not
    worst = max(r.rel_change for r in syms.verification.values())
    return Counter(s.family.value for s in syms), worst


def main(tiny: bool = False) -> float:
    torch.manual_seed(0)
    width, d, heads = (4, 8, 2) if tiny else (16, 64, 4)

    cnn = small_cnn(width).train()  # training mode: BatchNorm's scale invariance exists
    fam_cnn, err_cnn = report(cnn, torch.randn(4, 1, 8, 8))

    block = Block(d, heads).eval()
    fam_block, err_block = report(block, torch.randn(2, 5, d))

    print(f"CNN: {dict(fam_cnn)}; transformer block: {dict(fam_block)}")
    worst = max(err_cnn, err_block)
    print(f"largest relative output change under a random group element: {worst:.1e}")
    # three rescalings (conv→conv across ReLU+max-pool, BatchNorm's affine → linear across
    # ReLU+flatten, linear→linear) and the per-channel scale invariance of the conv feeding
    # BatchNorm
    assert fam_cnn == Counter(rescaling=3, scale=1), fam_cnn
    # one rotation per head for q·kᵀ and for v → o; three rescalings: the MLP's, and each
    # LayerNorm's affine parameters against the layers reading it (ln1 → q, k, v; ln2 → fc1)
    assert fam_block == Counter(rotation=2 * heads, rescaling=3), fam_block
    assert worst < 1e-9, worst
    return worst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="run at the CI size (seconds)")
    main(parser.parse_args().tiny)
