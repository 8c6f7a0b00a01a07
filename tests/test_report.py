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


def _claim(
    cid: str, value: float, holds: bool, note: str = "", *, kind: str = "paper", why: str = ""
) -> dict[str, Any]:
    return {
        "id": cid,
        "statement": f"statement of {cid}",
        "value": value,
        "op": "<",
        "threshold": 0.1,
        "holds": holds,
        "note": note,
        "kind": kind,
        "why": why,
    }


def _unescape_md(md: str) -> str:
    """What a Markdown renderer shows for escaped text (backslash escapes, entities)."""
    text = re.sub(r"\\(.)", r"\1", md)
    text = text.replace("&#40;", "(").replace("&#36;", "$")
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
    assert report.QUICK_BANNER in html.unescape(report.render_html(quick, tmp_path))
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


def test_failing_claims_listed_by_kind_with_their_why(tmp_path: Path) -> None:
    why = "the per-neuron noise differs by 31% (0.315) because tanh breaks the symmetry"
    records = [
        _rec(
            "fig6",
            claims=[
                _claim("sgd_similar", 0.315, False, "seed 1: 0.295", why=why),
                _claim("printed_form", 2.0, False, kind="printed", why="factor 2 as derived"),
                _claim("no_reason", 0.5, False, kind="beyond"),
            ],
        ),
        _rec("fig1", claims=[_claim("ok_claim", 0.0, True, why="not shown when it holds")]),
        _rec("boom", status="error", error={"stage": "run", "type": "ValueError", "message": "x"}),
    ]
    md = report.render_markdown(records)
    failing = md[md.index("## Failing claims and errors") : md.index("## Corrections")]
    assert "sgd_similar" in failing and "✗ 0.315" in failing and why in failing
    assert "ok_claim" not in failing and "not shown when it holds" not in md
    assert "boom: error in stage run: ValueError: x" in failing
    # grouped by kind, the paper's results first; a failing claim without why says so
    groups = [failing.index(k) for k in ("the paper's results", "formulas as printed", "ours,")]
    assert groups == sorted(groups)
    line = next(ln for ln in failing.splitlines() if "no_reason" in ln)
    assert "no reason recorded" in line
    # the note stays in the experiment's own table
    assert "seed 1: 0.295" in md[md.index("\n## fig6\n") :]
    page = report.render_html(records, tmp_path)
    assert why in page[page.index("Failing claims") : page.index("Corrections to")]
    clean = report.render_markdown([_rec("fig1", claims=[_claim("ok", 0.0, True)])])
    assert "Every claim holds and no experiment errored" in clean


def test_headline_counts_each_kind_apart(tmp_path: Path) -> None:
    claims = [
        _claim("a", 0.0, True),
        _claim("b", 1.0, False, why="w"),
        _claim("c", 1.0, False, kind="printed", why="w"),
        _claim("d", 0.0, True, kind="beyond"),
        {"id": "old", "op": "<", "threshold": 1, "value": 0, "holds": True},  # no kind: paper
    ]
    md = report.render_markdown([_rec("fig2", claims=claims)])
    head = md[: md.index("## Environment")]
    assert "**3/5 claims hold**" in head
    assert "the paper's results (`paper`): **2/3 hold**" in head
    assert "(`printed`): **0/1 hold**" in head and "(`beyond`): **1/1 hold**" in head
    row = next(ln for ln in md.splitlines() if ln.startswith("| [fig2]"))
    assert "| 2/3 | 0/1 | 1/1 |" in row
    page = html.unescape(report.render_html([_rec("fig2", claims=claims)], tmp_path))
    assert "2/3 hold" in page and "0/1 hold" in page


def test_environment_names_versions_platform_seed_and_times(tmp_path: Path) -> None:
    env = {"torch": "2.13.0", "numpy": "2.1.0", "python": "3.11.7", "platform": "Linux-x"}
    recs = [
        _rec("fig1", environment=env, elapsed_s=2.0, cpu_s=1.5),
        _rec("fig2", environment={**env, "torch": "2.12.0"}, elapsed_s=3.0, cpu_s=2.5),
    ]
    md = report.render_markdown(recs)
    section = md[md.index("## Environment") : md.index("## Summary")]
    needles = ("| torch | mixed: 2.12.0, 2.13.0 |", "| numpy | 2.1.0 |", "| Python | 3.11.7 |")
    needles += ("| platform | Linux-x |", "| seed | 0 |", "5.0 s", "4.0 s")
    for needle in needles:
        assert needle in section, needle
    assert "mixed: 2.12.0, 2.13.0" in report.render_html(recs, tmp_path)


def test_markdown_values_cannot_become_math_links_or_html() -> None:
    """arithmatex reads \\( … \\) and $ … $ as math: a value's parentheses stay bare and $ is
    an entity; brackets, backticks and HTML are neutralised."""
    text = "Ċ = (η/S) Tr[ΣA] costs $5 and $6 <b>x</b> `code` ![i](http://e/x.png)"
    md = report.render_markdown([_rec("fig1", description=text)])
    line = next(ln for ln in md.splitlines() if "costs" in ln and not ln.startswith("|"))
    assert "\\(" not in line and "$" not in line and "<b>" not in line
    assert "(η/S)" in line and "\\[ΣA\\]" in line and "&#36;5" in line and "\\`code\\`" in line
    assert "![i](" not in line


def test_html_values_are_autoescaped(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script>'
    rec = _rec("fig1", description=evil, claims=[_claim(evil, 1.0, False, why=evil)])
    page = report.render_html([rec], tmp_path)
    assert "<script>" not in page and "&lt;script&gt;" in page


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


def test_docs_markdown_pipeline_shows_values_as_text() -> None:
    """The Results page's Markdown (Python-Markdown with the docs' arithmatex and tables):
    a value's \\( … \\) or $ … $ stays text, never math; the table keeps its columns."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx")
    rec = _rec(
        "fig1",
        claims=[_claim("c", 2.0, False, why="4γ⟨C⟩ = (η/S)Tr[ΣA] costs $1 and $2 | x")],
    )
    md = report.render_markdown([rec])
    page = markdown.markdown(
        md,
        extensions=["tables", "md_in_html", "pymdownx.arithmatex", "pymdownx.superfences"],
        extension_configs={"pymdownx.arithmatex": {"generic": True}},
    )
    assert "arithmatex" not in page
    assert "(η/S)Tr[ΣA] costs $1 and $2 | x" in html.unescape(page)


def test_unchecked_results_are_listed(tmp_path: Path) -> None:
    from noetherflow.experiments.corrections import UNCHECKED

    md = report.render_markdown([_rec("fig1")])
    section = md[md.index("## Results of the paper not checked by this run") :]
    assert UNCHECKED and all(u.where in _unescape_md(section) for u in UNCHECKED)
    assert "not checked by this run" in report.render_html([_rec("fig1")], tmp_path)
