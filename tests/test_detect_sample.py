"""Detection checks candidates on a bounded sample of a large example (issue 28).

The rule (noetherflow.symmetry._fx.sample): at most ROWS rows, and for token ids at most
TOKENS tokens in all. These tests pin the rule, that the symmetries found are those of the
whole example, that a check degenerate on the sample is repeated on the whole example, and
that detection's work does not grow with the example: one float64 copy of the model, and
every layer call of the checks on the sample's rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import noetherflow.symmetry._fx.check as C
import noetherflow.symmetry.detect as D
from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.sample import ROWS, TOKENS, Sample, sample_of
from noetherflow.symmetry.detect import find_symmetries, symmetry_signature


def _whole(inp: ModelInputs, targets: Any) -> Sample:
    return Sample(inp, targets, (1, 1), None)


def test_rule_cuts_rows_and_tokens_and_leaves_small_examples_whole() -> None:
    ids = torch.randint(0, 9, (16, 128))
    mask = torch.ones(16, 128, dtype=torch.long)
    s = sample_of(ModelInputs.of({"input_ids": ids, "attention_mask": mask}, "t"), ids)
    assert s.inp.kwargs["input_ids"].shape == (ROWS, TOKENS // ROWS)
    assert s.inp.kwargs["attention_mask"].shape == (ROWS, TOKENS // ROWS)
    assert torch.equal(s.targets, ids[:ROWS, : TOKENS // ROWS])  # cut like the inputs
    assert (
        not s.whole
        and s.describe()
        == f"the first {ROWS} of 16 rows, the first {TOKENS // ROWS} of 128 tokens of each"
    )
    x = torch.randn(20, 3, 5, 5)  # not token ids: rows only
    s = sample_of(ModelInputs.of(x, "t"), None)
    assert s.inp.args[0].shape == (ROWS, 3, 5, 5) and s.tokens is None
    for small in (torch.randn(ROWS, 7), torch.randint(0, 9, (2, TOKENS // 2))):
        s = sample_of(ModelInputs.of(small, "t"), None)
        assert s.whole and s.inp.args[0] is small
    one = sample_of(ModelInputs.of(torch.randint(0, 9, (1, 512)), "t"), None)
    assert one.inp.args[0].shape == (1, TOKENS)


def _gpt2(n: int, t: int) -> tuple[nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=64,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    return model, torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(1))


def test_same_symmetries_as_on_the_whole_example(monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _gpt2(12, 40)
    syms = find_symmetries(model, ids)
    assert any(
        f"first {ROWS} of 12 rows, the first {TOKENS // ROWS} of 40 tokens" in n
        for n in syms.detection.notes
    )
    monkeypatch.setattr(D, "sample_of", _whole)
    every = find_symmetries(model, ids)
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(syms) == len(every) == 12
    assert [symmetry_signature(s, names) for s in syms] == [
        symmetry_signature(s, names) for s in every
    ]
    for name in syms.names:  # both exact: float64 round-off only
        assert syms.verification[name].rel_change < 1e-12


def test_work_does_not_grow_with_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.pytorch_utils import Conv1D

    copies: list[int] = []
    init = C._Copy.__init__

    def counted_copy(self: Any, *a: Any, **k: Any) -> None:
        copies.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(C._Copy, "__init__", counted_copy)
    rows: list[int] = []
    forward = Conv1D.forward

    def counted(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return forward(self, x)

    monkeypatch.setattr(Conv1D, "forward", counted)
    calls = []
    for n in (12, 48):
        rows.clear()
        copies.clear()
        model, ids = _gpt2(n, 40)
        assert len(find_symmetries(model, ids)) == 12
        assert len(copies) == 1  # one float64 copy of the model, whatever the example
        assert max(rows) == ROWS * (TOKENS // ROWS)  # every layer call on the sample only
        calls.append(len(rows))
    assert calls[0] == calls[1]  # the same reruns per candidate


class _NoBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 6, bias=False), nn.Linear(6, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_degenerate_on_the_sample_is_checked_on_the_whole_example() -> None:
    torch.manual_seed(0)
    # the sample's rows are 0: no bias, so every layer output there is 0 at any parameters
    x = torch.cat([torch.zeros(ROWS, 3), torch.randn(ROWS, 3)])
    syms = find_symmetries(_NoBias(), x)
    assert syms.names == ["rescaling:fc1→fc2"]
    assert syms.verification["rescaling:fc1→fc2"].rel_change < 1e-12
    assert any("1 whose check was degenerate there" in n for n in syms.detection.notes)
    # on the sample alone, the candidate is not claimed
    alone = find_symmetries(_NoBias(), x[:ROWS])
    assert not alone.names and "degenerate" in alone.detection.rejected[0][1]
