"""Detection's memory shortcuts give the numbers of the plain path (issue 28).

The composed whole-model check compares each layer output with the base as it is produced
(:meth:`Checker._streamed`) instead of holding a second signal; scope signals are dropped
after their last candidate and recomputed if needed (:meth:`Checker.release`); a single fresh
output is viewed, not copied (:func:`_flat`). Each is pinned against the plain computation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.check import Checker, _flat, producers
from noetherflow.symmetry.detect import _Isolated
from noetherflow.symmetry.set import _rebind


class _Twice(nn.Module):
    """An MLP whose middle layer runs twice (a probed part with two calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.mid, self.b = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.a(x))
        return self.b(torch.relu(self.mid(torch.relu(self.mid(h)))))


def _checker(model: nn.Module, x: Tensor, scopes: list[str] | None = None) -> Checker:
    inp = ModelInputs.of(x, "test")
    return Checker(model, inp, None, None, 0, _Isolated, scopes or [])


def test_streamed_whole_model_change_equals_the_stored_signal() -> None:
    torch.manual_seed(0)
    model, x = _Twice(), torch.randn(6, 4)
    chk = _checker(model, x)
    c = chk.copy(False)
    base = chk._base_of(c, "")
    with torch.no_grad():  # a generic change, so every part moves
        for p in c.model.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, dtype=p.dtype))
    stored = chk._signal(c)
    assert len(c.model.mid._forward_hooks) == 1 and stored["mid"].numel() == 2 * 6 * 8
    for skip in (set(), {"b"}):
        want = chk._rel(stored, base, skip)
        got = chk._streamed(c, base, skip)
        assert want > 1e-4 and abs(got - want) <= 1e-12 * want, (skip, got, want)
    # the part of two calls alone: the root of the squared norms is the norm of the whole
    only = {k for k in base if k != "mid"}
    want = chk._rel(stored, base, only)
    assert abs(chk._streamed(c, base, only) - want) <= 1e-12 * want


def test_composed_check_of_a_symmetry_stays_at_round_off() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(6, 4)
    syms = nf.find_symmetries(model, x)
    chk = _checker(model, x)
    gen = torch.Generator().manual_seed(0)
    items = [(s, s.random_element(0.5, gen)) for s in syms]
    rel = chk.check_composed(items, False)
    assert rel < 1e-13
    # and the same elements on the plain signal
    c = chk.copy(False)
    base = chk._base_of(c, "")
    s64s = [_rebind(s, c.mapping) for s, _ in items]
    saved = chk._state(s64s)
    for s64, (_, e) in zip(s64s, items, strict=True):
        s64.apply_(e)
    skip: set[str] = set().union(*(producers(s, c.model) for s in s64s))
    assert skip  # the layers the rescalings act on from the output side
    plain = chk._rel(chk._signal(c), base, skip)
    chk._restore(saved)
    assert abs(rel - plain) <= 1e-15


def test_released_scope_signals_are_recomputed_to_the_same_check() -> None:
    from tests.real_models import gpt2

    torch.manual_seed(0)
    model, x = gpt2(n_layer=2)
    model.eval()
    syms = nf.find_symmetries(model, x)
    rot = next(s for s in syms if isinstance(s, nf.DoubleRotation))
    scope = syms.detection.sym_notes[rot.label].split("Attention ")[1].split(" ")[0]  # type: ignore[union-attr]
    chk = _checker(model, x, [scope])
    e = rot.random_element(0.5, torch.Generator().manual_seed(2))
    first = chk.check(rot, e, False, 1e-9, 0.5, scopes=[scope])
    assert first.scope == scope
    chk.release([scope])
    assert (0, scope) not in chk._base
    again = chk.check(rot, e, False, 1e-9, 0.5, scopes=[scope])
    assert (again.rel, again.control, again.scope) == (first.rel, first.control, first.scope)


def test_flat_copies_an_output_that_is_a_parameter() -> None:
    class Const(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: Tensor) -> Tensor:
            return self.w

    m = Const()
    out = m(torch.zeros(1))
    flat = _flat(out, m)
    assert flat.untyped_storage().data_ptr() != m.w.untyped_storage().data_ptr()
    fresh = torch.randn(2, 3)
    assert _flat(fresh, m).untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr()
