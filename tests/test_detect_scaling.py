"""Detection cost linear in depth (issue 14): candidates checked on the submodule holding them.

``find_symmetries`` verifies each candidate on the smallest submodule that holds every use of
its parameters and ran once, rerun alone on the inputs it received in the model's forward
(noetherflow.symmetry._fx.scope), then checks the composed action of all of them once on the
whole model. These tests count the work (calls of the model's layers, not seconds), compare
the result with whole-model verification of every candidate, and exercise the fallback and the
guards of the replay.
"""

from __future__ import annotations

from typing import Any

import pytest
import real_models as RM
import torch
from torch import nn

import noetherflow.symmetry.detect as D
from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.check import Checker
from noetherflow.symmetry._fx.scope import ScopeRecorder
from noetherflow.symmetry.detect import find_symmetries, symmetry_signature
from noetherflow.symmetry.rescaling import Rescaling

pytest.importorskip("transformers")


def _gpt2(n_layer: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, ids = RM.gpt2(n_layer=n_layer)
    return model.eval(), ids


def _sigs(model: nn.Module, syms: Any) -> list[Any]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [symmetry_signature(s, names) for s in syms]


def _layer_calls(monkeypatch: pytest.MonkeyPatch, n_layer: int) -> tuple[int, int]:
    """(calls of HF Conv1D, symmetries found) for one detection on a GPT-2 of n_layer blocks."""
    from transformers.pytorch_utils import Conv1D

    calls = [0]
    forward = Conv1D.forward

    def counted(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return forward(self, x)

    monkeypatch.setattr(Conv1D, "forward", counted)
    model, ids = _gpt2(n_layer)
    syms = find_symmetries(model, ids)
    return calls[0], len(syms)


def test_detection_cost_grows_linearly_with_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every linear layer of GPT-2 is a Conv1D, so its calls count the model's arithmetic:
    # tracing, the base forwards, every check and the final composed check included.
    c2, k2 = _layer_calls(monkeypatch, 2)
    c4, k4 = _layer_calls(monkeypatch, 4)
    assert (k2, k4) == (12, 24)  # per block: ln_1 → c_attn, ln_2 → c_fc, 2 heads × (qk, vo)
    # checking every candidate on the whole model costs ∝ depth², a ratio of ≈ 4 here
    assert c4 / c2 <= 2.2, (c2, c4)


def test_same_symmetries_as_whole_model_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _gpt2(2)
    local = find_symmetries(model, ids)
    notes = local.detection.sym_notes
    assert all("rerun alone" in notes[n] and "composed action" in notes[n] for n in local.names)
    assert any("GPT2Attention h.1.attn" in notes[n] for n in local.names)
    assert any("GPT2Block h.0 " in notes[n] for n in local.names)  # ln_1 → c_attn
    monkeypatch.setattr(D, "enclosing_scopes", lambda params, uses: ())
    whole = find_symmetries(model, ids)
    assert _sigs(model, whole) == _sigs(model, local)
    assert whole.names == local.names
    assert not any("rerun alone" in n for n in whole.detection.sym_notes.values())
    for name in local.names:  # both exact: float64 round-off only
        assert local.verification[name].rel_change < 1e-12
        assert whole.verification[name].rel_change < 1e-12


def test_failed_composed_check_falls_back_to_whole_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _gpt2(1)
    expected = _sigs(model, find_symmetries(model, ids))
    monkeypatch.setattr(Checker, "check_composed", lambda self, items, zero_eps: float("inf"))
    syms = find_symmetries(model, ids)
    assert _sigs(model, syms) == expected  # each one checked again, on the whole model
    assert not any("rerun alone" in n for n in syms.detection.sym_notes.values())


def test_composed_check_sees_a_broken_candidate() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(6, 3)
    checker = Checker(net, ModelInputs.of(x, "test"), None, None, 0, D._Isolated)
    good = Rescaling(net[0], net[2])
    bad = Rescaling(net[2], net[4])  # through tanh: not a symmetry
    gen = torch.Generator().manual_seed(0)
    e_good, e_bad = good.random_element(0.5, gen), bad.random_element(0.5, gen)
    assert checker.check_composed([(good, e_good)], False) < 1e-12
    assert checker.check_composed([(good, e_good), (bad, e_bad)], False) > 1e-3
    before = [p.detach().clone() for p in checker.copy(False).model.parameters()]
    checker.check_composed([(good, e_good), (bad, e_bad)], False)
    after = list(checker.copy(False).model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))  # restored


class _Mutating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        x.mul_(2.0)  # changes its input in place: a replay would not see what the forward saw
        return y


def test_replay_reproduces_the_forward_and_refuses_changed_inputs() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 3), nn.ReLU()), _Mutating())
    rec = ScopeRecorder(net, ["1", "2"])
    with torch.no_grad():
        net(torch.randn(4, 3))
    rec.remove()
    assert rec.replayable("1")
    with torch.no_grad():
        again = rec.replay("1")
    assert torch.equal(again.reshape(-1), rec.records["1"].output)
    assert not rec.replayable("2")  # its input was multiplied in place after the recording
    with pytest.raises(RuntimeError, match="changed in place"):
        rec.replay("2")


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(4, 6), nn.Linear(6, 5), nn.Linear(5, 3)
        nn.init.zeros_(self.head.weight)  # a zero-initialised head: its output is 0
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre, self.inner = nn.Linear(4, 4), _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(torch.tanh(self.pre(x))) + 1.0


def test_degenerate_control_works_on_a_submodule(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, x = _Outer(), torch.randn(8, 4)
    syms = find_symmetries(model, x)
    assert syms.names == ["rescaling:inner.fc1→inner.fc2", "rescaling:inner.fc2→inner.head"]
    notes = syms.detection.sym_notes
    assert all("_Inner inner (rerun alone" in notes[n] for n in syms.names)
    assert "at the current parameters" in notes["rescaling:inner.fc1→inner.fc2"]
    # the head's output and weights are 0: a generic perturbation of fc2 and head changes
    # nothing, so the check moved to a random parameter point, where it is informative
    assert "random parameter point" in notes["rescaling:inner.fc2→inner.head"]
    monkeypatch.setattr(D, "enclosing_scopes", lambda params, uses: ())
    whole = find_symmetries(model, x)
    assert whole.names == syms.names
    assert "random parameter point" in whole.detection.sym_notes["rescaling:inner.fc2→inner.head"]
