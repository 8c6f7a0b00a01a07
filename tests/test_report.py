"""The reproduction report's structure: paper order, quick banner, setup table, notes, failing
claims, and the corrections section (rendered from experiments.corrections with the measured
values of this run). Records are synthetic (no experiment is run), so these tests are fast."""

from __future__ import annotations

import html
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from noetherflow import report
from noetherflow.experiments import registry
from noetherflow.experiments.corrections import CORRECTIONS

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def _rec(exp: str, *, order: float | None = None, quick: bool = True, **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "experiment": exp,
        "description": f"{exp} description",
        "paper": "",
        "paper_order": order,
        "target": f"x.{exp}",
        "quick": quick,
        "seed": 0,
        "status": "ok",
        "elapsed_s": 1.0,
        "config": {"n": 1},
        "setup": [],
        "claims": [],
        "series": {},
        "results": {},
        "figures": [],
        "notes": "",
        "error": None,
        "environment": {},
    }
    rec.update(kw)
    return rec


def _claim(cid: str, value: float, holds: bool, note: str = "") -> dict[str, Any]:
    return {
        "id": cid,
        "statement": f"statement of {cid}",
        "value": value,
        "op": "<",
        "threshold": 0.1,
        "holds": holds,
        "note": note,
    }


def _unescape_md(md: str) -> str:
    """What a Markdown renderer shows for escaped text (backslash escapes, entities)."""
    text = re.sub(r"\\(.)", r"\1", md)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _positions(text: str, names: list[str], fmt: str) -> list[int]:
    return [text.index(fmt.format(n)) for n in names]


def test_experiments_in_paper_order_then_by_id(tmp_path: Path) -> None:
    records = [
        _rec("zeta"),
        _rec("thm54", order=5.4),
        _rec("alpha"),
        _rec("fig2", order=2.0),
        _rec("fig10", order=float("nan")),  # not a usable order: goes last, by id
    ]
    expected = ["fig2", "thm54", "alpha", "fig10", "zeta"]
    assert [r["experiment"] for r in report.order_records(records)] == expected
    md = report.render_markdown(records)
    pos = _positions(md, expected, "\n## {}\n")
    assert pos == sorted(pos)
    page = report.render_html(records, tmp_path)
    pos = _positions(page, expected, '<h2 id="{}">')
    assert pos == sorted(pos)
    table = report.summary_table(records)
    assert list(table.columns[0].cells) == expected


def test_quick_banner_only_for_quick_runs(tmp_path: Path) -> None:
    quick = [_rec("fig1", quick=True)]
    full = [_rec("fig1", quick=False)]
    assert report.QUICK_BANNER in report.render_markdown(quick)
    assert html.escape(report.QUICK_BANNER) in report.render_html(quick, tmp_path)
    assert report.QUICK_BANNER not in report.render_markdown(full)
    assert html.escape(report.QUICK_BANNER) not in report.render_html(full, tmp_path)
    mixed = report.render_markdown([_rec("fig1", quick=True), _rec("fig2", quick=False)])
    assert "(quick: fig1)" in mixed


def test_experiment_section_has_paper_setup_claims_figure_notes(tmp_path: Path) -> None:
    (tmp_path / "fig2").mkdir()
    (tmp_path / "fig2" / "fig2.png").write_bytes(PNG)
    rec = _rec(
        "fig2",
        order=2.0,
        paper="Fig. 2: SGD reaches the Thm 5.2 balance.",
        setup=[{"quantity": "η", "paper": "0.1", "ours": "0.05", "why": "diverges"}],
        claims=[_claim("balance_constant", 0.05, True), _claim("decay", 0.5, False, "slow")],
        figures=["fig2.png"],
        notes="Tried constant η = 0.1: balance error 0.2.",
    )
    md = report.render_markdown([rec], tmp_path)
    section = md[md.index("\n## fig2\n") :]
    for needle in (
        "**Paper:** Fig. 2: SGD reaches the Thm 5.2 balance.",
        "| quantity | paper | ours | why |",
        "| η | 0.1 | 0.05 | diverges |",
        "balance_constant",
        "![fig2: fig2.png](fig2/fig2.png)",
        "**Notes: settings tried and what they gave**",
        "Tried constant η = 0.1: balance error 0.2.",
    ):
        assert needle in section, needle
    order = [section.index(s) for s in ("**Paper:**", "| quantity |", "| holds |", "![", "**Notes")]
    assert order == sorted(order)
    page = report.render_html([rec], tmp_path)
    for needle in (
        "<b>Paper:</b> Fig. 2: SGD reaches the Thm 5.2 balance.",
        "<td>η</td><td>0.1</td><td>0.05</td><td>diverges</td>",
        "data:image/png;base64,",
        "Tried constant η = 0.1: balance error 0.2.",
    ):
        assert needle in page, needle
    # without setup(), the report says so instead of an empty table
    assert "defines no setup()" in report.render_markdown([_rec("fig3")])


def test_failing_claims_listed_with_their_notes(tmp_path: Path) -> None:
    records = [
        _rec("fig6", claims=[_claim("sgd_similar", 0.315, False, "seed 1: 0.295")]),
        _rec("fig1", claims=[_claim("ok_claim", 0.0, True)]),
        _rec("boom", status="error", error={"stage": "run", "type": "ValueError", "message": "x"}),
    ]
    md = report.render_markdown(records)
    failing = md[md.index("## Failing claims and errors") : md.index("## Corrections")]
    assert "sgd_similar" in failing and "seed 1: 0.295" in failing and "✗ 0.315" in failing
    assert "ok_claim" not in failing
    assert "boom: error in stage run: ValueError: x" in failing
    page = report.render_html(records, tmp_path)
    assert "seed 1: 0.295" in page[page.index("Failing claims") : page.index("Corrections to")]
    clean = report.render_markdown([_rec("fig1", claims=[_claim("ok", 0.0, True)])])
    assert "Every claim holds and no experiment errored" in clean


def test_corrections_section_shows_measured_values(tmp_path: Path) -> None:
    first = CORRECTIONS[0]
    chk = first.checks[0]
    measured = _rec(chk.experiment, claims=[_claim(chk.claim, 0.0225, True, "three distances")])
    md = report.render_markdown([measured])
    section = md[md.index("## Corrections to the paper") :]
    plain = _unescape_md(section)
    for corr in CORRECTIONS:
        for text in (corr.where, corr.paper, corr.corrected, *corr.derivation):
            assert text in plain, text
    line = next(ln for ln in section.splitlines() if f"{chk.experiment} / {chk.claim}" in ln)
    assert "✓ 0.0225 &lt; 0.1" in line and "three distances" in line
    # an experiment that did not run: said so, never a made-up value
    other = CORRECTIONS[-1].checks[0]
    line = next(ln for ln in section.splitlines() if f"{other.experiment} / {other.claim}" in ln)
    assert "not measured in this run" in line
    # the experiment ran but the claim is gone (renamed): said so
    renamed = report.render_markdown([_rec(chk.experiment, claims=[_claim("other", 0, True)])])
    assert "claim not found" in renamed
    page = report.render_html([measured], tmp_path)
    assert "Corrections to the paper" in page and "three distances" in page


def test_corrections_data_is_complete_and_points_at_real_claims() -> None:
    """Every correction: paper text, corrected text, two derivation lines, at least one
    measured check on a registered experiment, and every check on a registered experiment
    names a claim id its source defines (a renamed claim fails here). A check may name an
    experiment that is not registered in this checkout (added by another part of the project);
    the report then says "not measured in this run"."""
    ids = set(registry.experiment_ids())
    assert len(CORRECTIONS) >= 7 and len({c.id for c in CORRECTIONS}) == len(CORRECTIONS)
    for corr in CORRECTIONS:
        assert corr.paper and corr.corrected and corr.where
        assert len(corr.derivation) == 2 and all(len(d) > 20 for d in corr.derivation)
        assert any(chk.experiment in ids for chk in corr.checks), corr.id
        for chk in corr.checks:
            if chk.experiment not in ids:
                continue
            module = importlib.import_module(registry.target(chk.experiment).partition(":")[0])
            source = inspect.getsource(module)
            # claims may live in a private helper module of the experiment (e.g. _fig3_claims)
            for helper in re.findall(r"from noetherflow\.experiments\.(_\w+) import", source):
                source += inspect.getsource(
                    importlib.import_module(f"noetherflow.experiments.{helper}")
                )
            assert re.search(rf"""["']{re.escape(chk.claim)}["']""", source), (
                corr.id,
                chk.experiment,
                chk.claim,
            )
    assert "corrections" not in ids  # a data module, not an experiment


@pytest.mark.parametrize("bad", [None, "x", 3, [1, 2]])
def test_malformed_record_fields_do_not_crash(tmp_path: Path, bad: Any) -> None:
    rec = _rec("fig1", claims=bad, setup=bad, figures=bad, elapsed_s=bad, paper_order=bad)
    assert "fig1" in report.render_markdown([rec])
    assert "fig1" in report.render_html([rec], tmp_path)
    report.summary_table([rec])
