"""Tests of automatic symmetry detection (nf.find_symmetries) on the model zoo in tests/zoo.py.

For every zoo model the expected symmetries are written out by hand below and compared
exactly (family, parameters, index sets, order). Every detected symmetry is then exercised
with the exact one-step identity of the core engine, C(θ') = (1−2ηγ)²C(θ) + η²gᵀAg, for a
few SGD steps in float64. Normalisation layers get eps = tiny in those runs, because their
invariances are exact only at eps = 0 (see noetherflow.symmetry.detect).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from noetherflow.cli import inspect_main
from noetherflow.flow import charges, exact_step_charges
from noetherflow.symmetry.coverage import CoverageStatus
from noetherflow.symmetry.detect import (
    DetectionError,
    find_symmetries,
    symmetry_signature,
)
from noetherflow.symmetry.rescaling import Rescaling
from noetherflow.symmetry.set import SymmetrySet

sys.path.insert(0, str(Path(__file__).parent))
import zoo

DT = torch.float64


def R(first: str, second: str, block: int = 1) -> tuple[Any, ...]:
    return ("rescaling", f"{first}.weight", f"{second}.weight", block)


def S(*params: str, per_channel: bool = False, groups: int | None = None) -> tuple[Any, ...]:
    sig = ("scale", params, per_channel)
    return sig if groups is None else (*sig, groups)


def lin(name: str, start: int, stop: int, bias: bool = True) -> tuple[tuple[Any, ...], ...]:
    out: tuple[tuple[Any, ...], ...] = ((f"{name}.weight", 0, start, stop),)
    return out + (((f"{name}.bias", 0, start, stop),) if bias else ())


def A(norm: str, *readers: str) -> tuple[Any, ...]:
    """A normalisation's affine weight and bias rescaled against the layers reading it."""
    up = ((f"{norm}.weight", 0, 1), (f"{norm}.bias", 0, 1))
    return ("rescaling", up, tuple((f"{r}.weight", 1, 1) for r in readers))


def rot(w: tuple[Any, ...], u: tuple[Any, ...]) -> tuple[Any, ...]:
    return ("rotation", w, u)


def mha_heads(e: int = 6, h: int = 3) -> list[tuple[Any, ...]]:
    k = e // h
    ip = [("mha.in_proj_weight", "mha.in_proj_bias")]
    qk, vo = [], []
    for i in range(h):
        q = tuple((n, 0, o + i * k, o + (i + 1) * k) for n in ip[0] for o in (0,))
        kk = tuple((n, 0, o + i * k, o + (i + 1) * k) for n in ip[0] for o in (e,))
        v = tuple((n, 0, o + i * k, o + (i + 1) * k) for n in ip[0] for o in (2 * e,))
        qk.append(rot(q, kk))
        vo.append(rot(v, (("mha.out_proj.weight", 1, i * k, (i + 1) * k),)))
    return qk + vo


EXPECTED: dict[str, list[tuple[Any, ...]]] = {
    "mlp": [R("0", "2"), R("2", "5")],
    "residual_mlp": [R("fc1", "fc2")],  # fc2 and fc3 feed residual adds
    "tanh_mlp": [],  # only approximate (tanh, GELU): reported in the coverage
    "small_cnn": [
        S("conv1.weight", "conv1.bias", per_channel=True),
        A("bn1", "conv2"),  # BatchNorm affine → ReLU → conv2 (exact in train and eval mode)
        R("conv2", "fc", block=4),  # conv2 → ReLU → MaxPool → flatten: 4 columns per channel
    ],
    "vgg": [
        R("features.0", "features.2"),
        R("features.2", "features.5"),
        R("features.5", "classifier.1", block=4),
        R("classifier.1", "classifier.4"),
    ],
    "gpt_block": [
        A("ln1", "attn.q", "attn.k", "attn.v"),  # x.shape is a shape read, not a use
        rot(lin("attn.q", 0, 4), lin("attn.k", 0, 4)),
        rot(lin("attn.q", 4, 8), lin("attn.k", 4, 8)),
        rot(lin("attn.v", 0, 4), (("attn.proj.weight", 1, 0, 4),)),
        rot(lin("attn.v", 4, 8), (("attn.proj.weight", 1, 4, 8),)),
        A("ln2", "fc1"),
    ],
    "packed_attention": [
        rot(lin("c_attn", 0, 4), lin("c_attn", 8, 12)),
        rot(lin("c_attn", 4, 8), lin("c_attn", 12, 16)),
        rot(lin("c_attn", 16, 20), (("c_proj.weight", 1, 0, 4),)),
        rot(lin("c_attn", 20, 24), (("c_proj.weight", 1, 4, 8),)),
    ],
    "mha_block": [*mha_heads(), S("fc.weight", "fc.bias"), A("ln", "out")],
    "tied_embeddings": [R("fc1", "fc2")],  # fc2 → head is blocked: head.weight is tied
    "factorised": [rot(lin("w", 0, 3), (("u.weight", 1, 0, 3),)), S("g")],
    "group_norm_net": [
        S("conv1.weight", "conv1.bias", groups=2),  # each of GroupNorm's 2 groups on its own
        A("gn", "conv2"),
        S("conv2.weight", "conv2.bias", per_channel=True),
    ],
}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _exact_eps(model: nn.Module) -> nn.Module:
    norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)
    for m in model.modules():
        if isinstance(m, norms):
            m.eps = torch.finfo(DT).tiny
    return model


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_expected_symmetries(name: str) -> None:
    model, x = zoo.ZOO[name]()
    syms = find_symmetries(model, x)
    names = _names(model)
    got = [symmetry_signature(s, names) for s in syms]
    assert got == EXPECTED[name]
    for row in syms.to_dict():
        assert row["verified"] is True and row["tolerance"] == 1e-9
    cov = syms.coverage(model)
    assert {p.name for p in cov.params} == set(names.values())
    for p in cov.params:  # every parameter is claimed or comes with a reason
        assert p.symmetries or p.reasons


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_exact_step_identity(name: str) -> None:
    model, x = zoo.ZOO[name]()
    model = _exact_eps(model.to(DT))
    x = x.to(DT) if x.is_floating_point() else x
    syms = find_symmetries(model, x)
    assert len(syms) == len(EXPECTED[name])
    if not len(syms):
        return
    lr, wd = 0.05, 0.01
    for _ in range(3):
        model.zero_grad()
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        (out.square().mean() + out.mean()).backward()
        grads = {p: p.grad.detach().clone() for p in model.parameters() if p.grad is not None}
        pred = exact_step_charges(syms, grads, lr=lr, weight_decay=wd)
        with torch.no_grad():
            for p, g in grads.items():
                p.mul_(1 - 2 * lr * wd).sub_(lr * g)
        after = charges(syms)
        for key, val in after.items():
            scale = sum(float(p.detach().square().sum()) for p in syms[key].params)
            torch.testing.assert_close(val, pred[key], rtol=1e-10, atol=1e-10 * scale)


def test_to_dict_schema_attention() -> None:
    model, x = zoo.gpt_block()
    rows = find_symmetries(model, x).to_dict()
    assert rows[1] == {
        "name": "rotation:attn.q·attn.k[h0]",
        "family": "rotation",
        "modules": ["attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias"],
        "size": 4,
        "verified": True,
        "tolerance": 1e-9,
    }
    assert [r["size"] for r in rows] == [8, 4, 4, 4, 4, 8]  # ln1, 4 heads, ln2


def test_print_is_a_table_and_names_are_unique() -> None:
    model, x = zoo.vgg()
    syms = find_symmetries(model, x)
    text = str(syms)
    assert "rescaling" in text and "features.0.weight" in text and "✓" in text
    assert len(set(syms.names)) == len(syms)


# -- what must not be claimed ---------------------------------------------------------------


def test_residual_and_output_reasons() -> None:
    model, x = zoo.residual_mlp()
    cov = find_symmetries(model, x).coverage(model)
    assert cov["fc3.weight"].status is CoverageStatus.NONE
    assert any("residual" in r for r in cov["fc3.weight"].reasons)
    assert cov["fc1.weight"].status is CoverageStatus.COVERED


def test_tanh_and_gelu_are_approximate_in_coverage() -> None:
    model, x = zoo.tanh_mlp()
    syms = find_symmetries(model, x)
    assert len(syms) == 0
    cov = syms.coverage(model)
    entry = cov["fc1.weight"]
    assert entry.status is CoverageStatus.APPROXIMATE
    assert "Tanh" in entry.reasons[0] and "relative output change" in entry.reasons[0]
    assert any("gelu" in r for r in cov["fc2.bias"].reasons)


def test_batchnorm_eval_mode_is_not_scale_invariant() -> None:
    model, x = zoo.group_norm_net()
    model.eval()
    syms = find_symmetries(model, x)
    names = _names(model)
    assert [symmetry_signature(s, names) for s in syms] == [
        S("conv1.weight", "conv1.bias", groups=2),
        A("gn", "conv2"),
    ]
    # conv2.weight's columns are now covered by A("gn", "conv2"); its bias is not
    reasons = syms.coverage(model)["conv2.bias"].reasons
    assert any("eval mode" in r for r in reasons)


def test_layernorm_eps_is_reported() -> None:
    model, x = zoo.mha_block()
    cov = find_symmetries(model, x).coverage(model)
    note = " ".join(cov["fc.weight"].reasons)
    assert "eps" in note and "relative change" in note


def test_dropout_breaks_rotation_in_training_only() -> None:
    def make() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.3), nn.Linear(4, 2))

    x = torch.randn(5, 3)
    train = make().train()
    eval_ = make().eval()
    names = _names(train)
    got_train = [symmetry_signature(s, names) for s in find_symmetries(train, x)]
    got_eval = [symmetry_signature(s, _names(eval_)) for s in find_symmetries(eval_, x)]
    assert got_train == [R("0", "2")]
    assert got_eval == [rot(lin("0", 0, 4), (("2.weight", 1, 0, 4),))]


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(torch.relu(self.a(x)))))


def test_parameter_used_twice_is_not_claimed() -> None:
    model = _Shared()
    syms = find_symmetries(model, torch.randn(4, 3))
    assert len(syms) == 0
    reasons = syms.coverage(model)["a.weight"].reasons
    assert any("used 2 times" in r for r in reasons)


def test_tied_embeddings_reason() -> None:
    model, x = zoo.tied_embeddings()
    cov = find_symmetries(model, x).coverage(model)
    reasons = " ".join(cov["emb.weight"].reasons)
    assert "tied: also named head.weight" in reasons and "used 2 times" in reasons
    # an embedding is a supported layer (its table → fc1 rotation exists untied), not claimed
    # because the table is read twice
    assert "emb" not in cov.unsupported_modules
    assert "rotation:emb→fc1 not claimed" in reasons
    assert cov["emb.weight"].symmetries == ()


# -- bad input ------------------------------------------------------------------------------


def test_untraceable_model_falls_back_to_sequentials() -> None:
    model, x = zoo.untraceable()
    with pytest.warns(UserWarning, match="may be incomplete"):
        syms = find_symmetries(model, x)
    names = _names(model)
    assert [symmetry_signature(s, names) for s in syms] == [R("body.0", "body.2")]
    cov = syms.coverage(model)
    assert not cov.complete and "may be incomplete" in cov.notes[0]


def test_wrong_input_shape_is_a_clear_error() -> None:
    model, _ = zoo.mlp()
    with pytest.raises(DetectionError, match=r"shape \(2, 7\).*expects 4 input features"):
        find_symmetries(model, torch.randn(2, 7))


def test_model_without_symmetry_gives_empty_set_and_coverage() -> None:
    model, x = zoo.no_symmetry()
    syms = find_symmetries(model, x)
    assert len(syms) == 0 and syms.to_dict() == []
    cov = syms.coverage(model)
    assert [p.status for p in cov.params] == [CoverageStatus.NONE] * 2
    assert "returned as a model output" in cov["fc.weight"].reasons[0]


def test_unsupported_parametrised_modules_are_listed() -> None:
    model, x = zoo.with_gru()
    syms = find_symmetries(model, x)
    cov = syms.coverage(model)
    assert set(cov.unsupported_modules) == {"gru", "fc"}
    assert "parametrize" in cov.unsupported_modules["fc"]
    assert len(syms) == 0
    assert "unsupported" in str(cov)


def test_hand_built_set_coverage() -> None:
    model, _ = zoo.mlp()
    syms = SymmetrySet([Rescaling(model[0], model[2], label="r")])
    cov = syms.coverage(model)
    assert cov["0.weight"].symmetries == ("r",)
    assert cov["5.weight"].status is CoverageStatus.NONE


# -- CLI ------------------------------------------------------------------------------------


def test_inspect_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "models.py"
    f.write_text(
        "import torch.nn as nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),"
        " nn.Linear(4 * 15 * 15, 5), nn.ReLU(), nn.Linear(5, 2))\n"
    )
    assert inspect_main([f"{f}:make", "--input-shape", "3,32,32"]) == 0
    out = capsys.readouterr().out
    assert "rescaling:0→4" in out and "coverage" in out
    assert inspect_main([f"{f}:missing", "--input-shape", "3,32,32"]) == 2
    assert inspect_main([f"{f}:make", "--input-shape", "3,8,8"]) == 2
    assert "error" in capsys.readouterr().err
