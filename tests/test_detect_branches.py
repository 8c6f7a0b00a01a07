"""Control flow on input values: no symmetry claimed from the example's branch alone (#26).

The concrete tracer treats the inputs as constants, so ``relu if x.mean() > 0 else tanh``
used to be fixed silently to the example's branch: a rescaling was marked verified, and on
inputs taking the other branch the outputs changed. Every claim here is checked
independently in float64 on inputs detection did not see.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.symmetry._fx.branch_check import input_variants
from noetherflow.symmetry._fx.branches import InputBranches

sys.path.insert(0, str(Path(__file__).parent))
import real_models as RM

DT = torch.float64


class _Branchy(nn.Module):
    """``a → (relu | other) → b`` where the branch depends on the mean of the input."""

    def __init__(self, other: str) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)
        self.other = other

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        if self.other == "tanh":
            h = torch.relu(h) if x.mean() > 0 else torch.tanh(h)
        elif self.other == "relu2":
            h = torch.relu(h) if x.mean() > 0 else 2 * torch.relu(h)
        else:  # a float of the input steers the output: no branch can be enumerated
            h = torch.relu(h) * float(x.abs().max())
        return self.b(h)


def _model(other: str) -> _Branchy:
    torch.manual_seed(0)
    return _Branchy(other).to(DT)


def _rel_change(model: nn.Module, sym: nf.Symmetry, x: Tensor) -> float:
    """Independent check: outputs before/after a fixed group element, float64."""
    with torch.no_grad():
        before = model(x)
        saved = [p.detach().clone() for p in sym.params]
        sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(3)))
        after = model(x)
        for p, v in zip(sym.params, saved, strict=True):
            p.copy_(v)
    return float((after - before).norm() / before.norm())


def test_input_watch_records_value_conversions_not_shapes() -> None:
    x = torch.randn(3, 4)
    with InputBranches([x]) as watch:
        _ = x.shape[0], x.size(1), len(x)
        y = x * 2
        flag = bool(y.mean() > 100)
    assert not flag
    assert [b.op for b in watch.branches] == ["__bool__"]
    assert watch.branches[0].value == "False"
    assert "test_detect_branches.py" in watch.branches[0].where
    assert "y.mean() > 100" in watch.branches[0].code


def test_rescaling_that_holds_on_one_branch_only_is_not_claimed() -> None:
    model = _model("tanh")
    x = torch.randn(8, 4, dtype=DT).abs()  # mean > 0: the relu branch
    with pytest.warns(nf.BranchWarning, match=r"x\.mean\(\) > 0"):
        syms = nf.find_symmetries(model, x)
    assert len(syms) == 0
    (label, why), *_ = syms.detection.rejected
    assert label == "rescaling:a→b" and "another branch" in why
    # what the old claim would have done: exact on the example's branch, wrong on the other
    resc = nf.Rescaling(model.a, model.b)
    assert _rel_change(model, resc, x) < 1e-12
    assert _rel_change(model, resc, -x) > 1e-2
    cov = syms.coverage(model)
    reasons = " ".join(r for p in cov.params if p.name == "a.weight" for r in p.reasons)
    assert "another branch" in reasons


def test_symmetry_of_every_branch_is_verified_without_warning() -> None:
    model = _model("relu2")
    x = torch.randn(8, 4, dtype=DT).abs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        syms = nf.find_symmetries(model, x)
    assert syms.names == ["rescaling:a→b"]
    assert syms.verification["rescaling:a→b"].verified
    assert any("control flow on the inputs" in n for n in syms.detection.notes)
    for inputs in (x, -x, torch.randn(5, 4, dtype=DT)):  # both branches, unseen inputs
        assert _rel_change(model, syms[0], inputs) < 1e-12


def test_branch_that_cannot_be_enumerated_is_kept_unverified() -> None:
    model = _model("float")
    x = torch.randn(8, 4, dtype=DT)
    with pytest.warns(nf.BranchWarning, match="not marked verified"):
        syms = nf.find_symmetries(model, x)
    assert syms.names == ["rescaling:a→b"]
    assert not syms.verification["rescaling:a→b"].verified
    assert "NOT verified for every input" in syms.detection.sym_notes["rescaling:a→b"]
    assert _rel_change(model, syms[0], torch.randn(5, 4, dtype=DT)) < 1e-12


def test_variants_keep_shapes_dtypes_and_valid_masks() -> None:
    ids = torch.randint(3, 9, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    inp = nf.symmetry.detect.ModelInputs.of({"input_ids": ids, "attention_mask": mask}, "t")
    vs = input_variants(inp, 0)
    assert vs
    for v in vs:
        for (k, a), (_, b) in zip(inp.named_leaves(), v.named_leaves(), strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, k
        got = v.kwargs["input_ids"]
        assert int(got.min()) >= 3 and int(got.max()) <= 8
        assert bool((v.kwargs["attention_mask"].sum(-1) >= 1).all())
    assert any(bool((v.kwargs["attention_mask"] == 0).any()) for v in vs)


def test_hugging_face_padding_branch_is_verified_both_ways() -> None:
    """GPT-2 with an attention mask branches on ``padding_mask.all()``: checked with padding."""
    pytest.importorskip("transformers")
    model, ids = RM.gpt2()
    model = model.to(DT).eval()
    plain = nf.find_symmetries(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masked = nf.find_symmetries(
            model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        )
    assert masked.names == plain.names and len(masked) > 0
    assert all(r.verified for r in masked.verification.values())
    padded = torch.ones_like(ids)
    padded[:, -2:] = 0
    for sym in masked:
        with torch.no_grad():
            before = model(input_ids=ids, attention_mask=padded).last_hidden_state
            saved = [p.detach().clone() for p in sym.params]
            sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(1)))
            after = model(input_ids=ids, attention_mask=padded).last_hidden_state
            for p, v in zip(sym.params, saved, strict=True):
                p.copy_(v)
        assert float((after - before).norm() / before.norm()) < 1e-10, sym.label
