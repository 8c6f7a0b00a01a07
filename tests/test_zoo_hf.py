"""Hugging Face families that detection used to miss, found completely and exactly (#26).

A few models of tests/hf_zoo.py (the full set is benchmarks/zoo_hf.py): partial rotary
(GPT-NeoX, Phi), interleaved partial rotary (GPT-J), fused qkv through the rotary function
(GPT-NeoX, Falcon), ``baddbmm`` attention scores (BLOOM), FalconLinear, T5LayerNorm,
ConvNeXtV2's LayerNorm subclass, RegNet's grouped convolutions. The expected q·k
symmetries follow from the configs: per key head, one per rotated plane and one for the
unrotated coordinates (when at least two); V/O one per key/value head. Every claim is
checked independently in float64, eval and train mode, on batches detection did not see
(hf_zoo.independent_change).
"""

from __future__ import annotations

import re

import pytest
import torch

import noetherflow as nf

pytest.importorskip("transformers")

import hf_zoo as Z

# model → (key heads, rotated planes per head, unrotated coordinates per head)
ROTARY = {
    "gpt-neox": (2, 2, 4),  # head_dim 8, rotary_pct 0.5
    "phi": (2, 1, 2),  # head_dim 4, partial_rotary_factor 0.5
    "gpt-j": (2, 2, 4),  # head_dim 8, rotary_dim 4 (interleaved pairs)
    "falcon": (1, 4, 0),  # multi-query: one key head, head_dim 8, full rotary
}


def _detect(name: str, train: bool) -> tuple[torch.nn.Module, nf.SymmetrySet, object]:
    torch.manual_seed(0)
    model, make = Z.MODELS[name]()
    model = model.to(torch.float64).train(train)
    return model, nf.find_symmetries(model, make(0)), make


def _holds(model: torch.nn.Module, syms: nf.SymmetrySet, make: object, train: bool) -> None:
    """Every claim exact on unseen batches; every parameter without one says why."""
    cov = syms.coverage(model)
    assert [p.name for p in cov.params if not p.symmetries and not p.reasons] == []
    for s in syms:
        zero = s.family.value == "scale"
        for seed in (1, 2):
            rel = Z.independent_change(model, s, make(seed), train, zero)  # type: ignore[operator]
            assert rel <= 1e-8, (s.label, rel)


@pytest.mark.parametrize("name", sorted(ROTARY))
def test_rotary_families_are_complete(name: str) -> None:
    model, syms, make = _detect(name, train=False)
    kv, planes, unrotated = ROTARY[name]
    qk = [n for n in syms.names if "·" in n]
    assert len([n for n in qk if "plane" in n]) == kv * planes
    assert len([n for n in qk if ",pass]" in n]) == (kv if unrotated >= 2 else 0)
    vo = [n for n in syms.names if re.search(r"→.*(dense|o_proj|out_proj)\[", n)]
    assert len(vo) == kv, syms.names
    _holds(model, syms, make, train=False)


def test_bloom_baddbmm_scores_give_qk_rotations() -> None:
    model, syms, make = _detect("bloom", train=False)
    qk = [n for n in syms.names if "query_key_value·" in n or "·h.0.self_attention" in n]
    assert len(qk) == 2, syms.names  # one per head
    _holds(model, syms, make, train=False)


@pytest.mark.parametrize("name", ["t5", "convnextv2", "distilbert"])
def test_renamed_norms_and_inline_modules_hold_in_both_modes(name: str) -> None:
    for train in (False, True):
        model, syms, make = _detect(name, train)
        assert len(syms) > 0
        _holds(model, syms, make, train)
    if name == "t5":  # T5LayerNorm's mean square in float32: its affines rescale exactly
        assert sum(n.startswith("rescaling:") and "layer_norm→" in n for n in syms.names) == 2
        assert not any(n.startswith("scale:") for n in syms.names)
    if name == "convnextv2":  # the LayerNorm subclass is a norm module: its eps is seen
        scale = [s for s in syms if s.family.value == "scale"]
        assert scale and all(getattr(s, "norm", None) is not None for s in scale)


@pytest.mark.parametrize(
    "name,layers",
    [
        ("deberta", ("in_proj",)),  # q_bias/v_bias stored apart, turned with the rows
        ("deberta-v2-rel", ("query_proj", "key_proj", "pos_key_proj", "pos_query_proj")),
        ("deberta-v2-shared", ("query_proj", "key_proj")),  # both also read the positions
    ],
)
def test_deberta_attention_is_complete(name: str, layers: tuple[str, ...]) -> None:
    """q·k per head (with the relative-position terms q·pkᵀ, k·pqᵀ) and V/O per head."""
    for train in (False, True):
        model, syms, make = _detect(name, train)
        qk = [n for n in syms.names if "·" in n]
        assert len(qk) == 2, syms.names  # two heads
        for n in qk:  # one rotation over every layer of the scores
            assert all(f"self.{layer}" in n for layer in layers), n
        vo = [n for n in syms.names if "→encoder.layer.0.attention.output.dense[" in n]
        assert len(vo) == 2, syms.names
        _holds(model, syms, make, train)
    if name == "deberta":
        cov = syms.coverage(model)
        for b in ("q_bias", "v_bias"):
            assert cov[f"encoder.layer.0.attention.self.{b}"].symmetries


def test_regnet_grouped_convolutions_are_rescaled() -> None:
    """BatchNorm affine → ReLU → grouped 3×3 (2 and 4 groups): one rescaling per stage."""
    for train in (False, True):
        model, syms, make = _detect("regnet", train)
        grouped = [
            n for n in syms.names if re.search(r"layer\.0\.normalization→.*layer\.1\.conv", n)
        ]
        assert len(grouped) == 2, syms.names
        _holds(model, syms, make, train)


def test_regnet_grouped_rescaling_hook_statistics_match_the_reference() -> None:
    """Eval-mode BatchNorm affine → grouped 3×3: the hooks' flows equal torch.func's."""
    from noetherflow.kernels.noise import NoiseModel

    model, syms, _ = _detect("regnet", train=False)
    g = torch.Generator().manual_seed(3)
    x = {"pixel_values": torch.randn(6, 3, 16, 16, dtype=torch.float64, generator=g)}
    y = torch.randn(6, 16, dtype=torch.float64, generator=g)

    def loss(out: object, t: torch.Tensor) -> torch.Tensor:
        return (out.pooler_output.flatten(1) - t).square().mean()  # type: ignore[attr-defined]

    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    want = nf.noether_flow(
        syms, nf.collect_stats(model, syms, loss, x, y, estimator="reference"), nm
    )
    for level in ("diag", "solve", "neuron"):
        got = nf.noether_flow(syms, nf.collect_stats(model, syms, loss, x, y, level=level), nm)
        for k in want:
            err = float((got[k] - want[k]).abs().max())
            assert err <= 1e-10 * float(want[k].abs().max()), (level, k)
