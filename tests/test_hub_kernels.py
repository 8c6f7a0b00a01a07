"""Detection with and without the ``kernels`` package (issue 26).

With ``kernels`` installed, ``transformers`` replaces Llama-family ``apply_rotary_pos_emb``
by an ``nn.Module`` instance that the attention modules call without owning it (outside the
module tree), which made torch.fx refuse the whole model. The tracers now treat such a module
as the function it wraps. Checked three ways: a toy model calling a module outside its tree
(no ``kernels`` needed); the ``kernels`` decorators on a toy rotary model; and the real
Llama-family models from ``transformers``, whose detected symmetries must be the same in a
process with ``kernels`` and in one where it is hidden (``sys.modules["kernels"] = None``
makes ``transformers`` take its no-op decorators).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.symmetry._fx.hub import wrapped_function

DT = torch.float64
_OUTSIDE = nn.ReLU()  # a module the model calls but does not own


class _CallsOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(_OUTSIDE(self.a(x)))


def _whole_model(model: nn.Module, x: Tensor) -> nf.SymmetrySet:
    """``find_symmetries`` that fails the test if the model was traced piecewise."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the per-module fallback warns
        return nf.find_symmetries(model, x)


def test_module_outside_the_tree_is_traced_through() -> None:
    torch.manual_seed(0)
    model = _CallsOutside().to(DT)
    syms = _whole_model(model, torch.randn(8, 4, dtype=DT))
    assert list(syms.names) == ["rescaling:a→b"]
    assert all(r.verified for r in syms.verification.values())


def test_plain_modules_are_not_wrappers() -> None:
    assert wrapped_function(nn.Linear(2, 2)) is None
    assert wrapped_function(_OUTSIDE) is None


def _kernels_toy() -> tuple[nn.Module, Tensor]:
    """A q·k model whose rotary function goes through the real ``kernels`` decorators."""
    ker = pytest.importorskip("kernels")

    @ker.use_kernel_forward_from_hub("rotary_pos_emb")
    def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple:
        def rot(x: Tensor) -> Tensor:
            h = x.shape[-1] // 2
            return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    @ker.use_kernelized_func(apply_rotary_pos_emb)
    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k = nn.Linear(6, 4, bias=False), nn.Linear(6, 4, bias=False)
            self.out = nn.Linear(5, 2)

        def forward(self, x: Tensor) -> Tensor:
            t = torch.arange(x.shape[1], dtype=x.dtype)[:, None] * torch.tensor([1.0, 0.3])
            cos, sin = torch.cos(t).repeat(1, 2), torch.sin(t).repeat(1, 2)
            q, k = apply_rotary_pos_emb(self.q(x), self.k(x), cos, sin)
            return self.out((q @ k.transpose(-1, -2)).softmax(-1))

    assert isinstance(apply_rotary_pos_emb, nn.Module)  # what transformers gets with kernels
    assert wrapped_function(apply_rotary_pos_emb).__name__ == "apply_rotary_pos_emb"
    torch.manual_seed(0)
    return Scores().to(DT), torch.randn(3, 5, 6, dtype=DT)


def test_kernels_decorated_rotary_is_found() -> None:
    model, x = _kernels_toy()
    syms = _whole_model(model, x)
    planes = [n for n in syms.names if n.startswith("rotation:q·k")]
    assert len(planes) == 2  # head dim 4: two rotation planes, one d = 1 symmetry each
    assert all(r.verified for r in syms.verification.values())


_PROBE = Path(__file__).with_name("hub_kernels_probe.py")


@functools.cache
def _probe(kernels: bool) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(_PROBE), "on" if kernels else "off"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_llama_family_same_with_and_without_kernels() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("kernels")
    on, off = _probe(True), _probe(False)
    assert on["wrapped"] is True and off["wrapped"] is False  # both environments were tested
    assert on["models"] == off["models"]
    for name, found in on["models"].items():
        assert not found["warnings"], (name, found["warnings"])
        planes = [n for n in found["names"] if "plane" in n]
        assert len(planes) == 4, (name, found["names"])  # 2 planes × 2 key heads


def test_mamba_same_with_and_without_kernels() -> None:
    """Mamba's B/C rescaling and Δ rotation are found in both environments, eval and train."""
    pytest.importorskip("transformers")
    pytest.importorskip("kernels")
    on, off = _probe(True), _probe(False)
    assert on["mamba"] == off["mamba"]
    for mode in ("eval", "train"):
        found = on["mamba"][mode]
        assert found["verified"], (mode, found)
        assert found["names"] == [
            "rescaling:layers.0.mixer.x_proj[4:8]↔[8:12]",
            "rescaling:layers.0.norm→layers.0.mixer.in_proj",
            "rotation:layers.0.mixer.x_proj[0:4]→layers.0.mixer.dt_proj.weight",
        ], (mode, found)
