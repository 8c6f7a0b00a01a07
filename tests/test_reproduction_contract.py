"""Issue #17's contract in fig1, fig2, fig3, fig6, fig8, fig9, thm54: the paper's statement,
its position, the honest history and one setup row per deviation (quick sizes included)."""

from __future__ import annotations

import pytest

from noetherflow.experiments import fig1, fig2, fig3, fig6, fig8, fig9, thm54
from noetherflow.experiments._base import notes_of

MODULES = [fig1, fig2, fig3, fig6, fig8, fig9, thm54]
ORDER = {fig1: 1.0, fig2: 2.0, fig3: 3.0, thm54: 5.4, fig6: 6.0, fig8: 8.0, fig9: 9.0}


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_paper_notes_and_setup_rows(mod) -> None:
    assert isinstance(mod.PAPER, str) and len(mod.PAPER) > 40
    assert isinstance(notes_of(mod), str) and len(notes_of(mod)) > 80
    assert mod.PAPER_ORDER == ORDER[mod]
    full = mod.setup(mod.Config())
    quick = mod.setup(mod.Config.quick())
    for rows in (full, quick):
        assert rows and all(set(r) == {"quantity", "paper", "ours", "why"} for r in rows)
        assert all(isinstance(v, str) and v for r in rows for v in r.values())
        names = [r["quantity"] for r in rows]
        assert len(names) == len(set(names)), names
    assert not any(r["quantity"] == "quick mode" for r in full)
    assert any(r["quantity"] == "quick mode" for r in quick)


def test_paper_protocol_rows_name_the_schedule() -> None:
    """Where we anneal and the paper does not, a setup row says so."""
    for mod in (fig2, fig3, fig6, fig8, thm54):
        text = " ".join(r["ours"] for r in mod.setup(mod.Config()))
        assert "constant" in text and "decay" in text, mod.__name__
