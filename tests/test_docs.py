"""The documentation: tutorials run and check their numbers, the API reference is complete,
the getting-started tour runs, and the site builds with ``mkdocs build --strict``.

The tutorials run at ``--tiny`` size in subprocesses (each ends with an ``assert``). The
site is built from a temporary copy of ``mkdocs.yml`` and ``docs/`` with a Results page
generated from one quick experiment (fig1), so the repository is left untouched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIALS = sorted(p.name for p in (DOCS / "tutorials").glob("[a-z]*.py"))


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_MKDOCS_2_WARNING="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert res.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    )
    return res


def test_every_tutorial_has_a_page() -> None:
    assert len(TUTORIALS) == 6, TUTORIALS
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "tutorials").glob("*.md"))
    for script in TUTORIALS:
        assert f'--8<-- "docs/tutorials/{script}"' in pages, f"no page includes {script}"


@pytest.mark.parametrize("script", TUTORIALS)
def test_tutorial_runs_tiny(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each script as ``python docs/tutorials/<script> --tiny``; its final asserts must hold.

    In-process (runpy, under pytest's warnings-as-errors) to save a torch import each; the
    DDP tutorial spawns its own processes, so it runs as a subprocess.
    """
    path = DOCS / "tutorials" / script
    if script == "ddp_torchrun.py":
        _run([sys.executable, str(path), "--tiny"], ROOT, timeout=300)
        return
    monkeypatch.setattr(sys, "argv", [str(path), "--tiny"])
    runpy.run_path(str(path), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.strip(), f"{script} printed nothing"
    assert not re.search(r"\bnan\b", printed, re.I), f"{script} printed NaN:\n{printed}"
    shown = _documented_output(script)
    lines = [ln.strip() for ln in printed.splitlines() if ln.strip()]
    for want in shown:  # the page's "With `--tiny` it prints" block, line by line, in order
        assert want in lines, f"{script}: the page shows {want!r}, the run printed:\n{printed}"
        lines = lines[lines.index(want) + 1 :]


def _documented_output(script: str) -> list[str]:
    """The lines of the ```text block after "With `--tiny` it prints" on the script's page."""
    for page in (DOCS / "tutorials").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        if f'--8<-- "docs/tutorials/{script}"' in text:
            m = re.search(r"With `--tiny` it prints\s*```text\n(.*?)```", text, re.S)
            return [ln.strip() for ln in m.group(1).splitlines() if ln.strip()] if m else []
    return []


def test_tutorials_import_nothing_private() -> None:
    """Code copied from a tutorial page runs: no helper module beside the scripts."""
    for script in TUTORIALS:
        text = (DOCS / "tutorials" / script).read_text(encoding="utf-8")
        assert "sys.path.insert" not in text and not re.search(
            r"^(from|import) _(?!_future__)", text, re.M
        )
    assert not list((DOCS / "tutorials").glob("_*.py"))


def test_extending_examples_are_one_file_each_and_run() -> None:
    """Each extension of docs/extending.md is one file of docs/snippets/, shown and run.

    They run through the shared loader (``tests/snippets.py``): each registers a layer, a
    kernel or a matcher once; ``tests/test_extending.py`` runs them end to end.
    """
    import snippets

    page = (DOCS / "extending.md").read_text(encoding="utf-8")
    files = sorted(p.stem for p in (DOCS / "snippets").glob("*.py"))
    assert files == ["diagonal_family", "new_family", "new_layer", "new_matcher"]
    for name in files:
        assert f'--8<-- "docs/snippets/{name}.py:' in page, f"extending.md does not show {name}"
        snippets.load(name)


PAGES_WITH_OWN_TEST = {"getting-started.md"}  # run below with its training loop shortened


@pytest.mark.parametrize(
    "page",
    sorted(
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if "```python" in p.read_text(encoding="utf-8") and p.name not in PAGES_WITH_OWN_TEST
    ),
)
def test_page_code_blocks_run_as_written(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ```python block of a page runs, in order, as a reader pasting the page would run it.

    One namespace per page: a later block may use what an earlier block of the same page
    defined (the page reads top to bottom), never anything from another page.
    """
    monkeypatch.chdir(tmp_path)
    text = (DOCS / page).read_text(encoding="utf-8")
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        exec(compile(block, f"{page}[block {i}]", "exec"), namespace)


def test_public_api_has_docstrings_and_reference_pages() -> None:
    hooks = _load("nf_docs_hooks", DOCS / "hooks.py")
    assert hooks.api_problems() == []


class _Base:
    def inherited(self) -> None:
        """Documented once, here."""


class _Public(_Base):
    def inherited(self) -> None:
        pass

    def bare(self) -> None:
        pass

    @property
    def prop(self) -> int:
        return 0

    def _private(self) -> None:
        pass


def test_api_check_catches_missing_entries(tmp_path: Path) -> None:
    hooks = _load("nf_docs_hooks", DOCS / "hooks.py")
    (tmp_path / "x.md").write_text("::: noetherflow.charges\n::: noetherflow.not_public\n")
    problems = hooks.api_problems(tmp_path)
    assert any("noetherflow.teleport is public but not in the API reference" in p for p in problems)
    assert any("not_public, which is not in noetherflow.__all__" in p for p in problems)

    assert hooks.undocumented_members(_Public) == ["_Public.bare", "_Public.prop"]


def test_results_page_placeholder_and_conversion(tmp_path: Path) -> None:
    hooks = _load("nf_docs_hooks", DOCS / "hooks.py")
    assert "docs/gen_results.py" in hooks.report_markdown(tmp_path)
    assert hooks.MARKER in (DOCS / "reproduction" / "index.md").read_text(encoding="utf-8")
    gen = _load("nf_docs_gen_results", DOCS / "gen_results.py")
    md = "# title\n\n## fig1\n\n![fig1: fig1.png](fig1/fig1.png)\n[fig1](#fig1)\n"
    out = gen.convert(md)
    assert out.startswith("### fig1")
    assert "](_generated/fig1/fig1.png)" in out and "](#fig1)" in out


def test_getting_started_tour_runs() -> None:
    """The python blocks of getting-started.md, in order; the loop cut to 20 steps (two records)."""
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert "range(200)" in code and 'log_dir="runs/tour"' in code
    code = code.replace("range(200)", "range(20)").replace('log_dir="runs/tour"', "log_dir=None")
    ns: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "getting-started.md", "exec"), ns)
    assert float(ns["handle"].solution.max_distance()) > 0  # type: ignore[attr-defined]
    assert not re.search(r"\bnan\b", out.getvalue(), re.I), out.getvalue()  # issue #31


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    for mod in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(mod.split(".")[0]) is None or (
            "." in mod and importlib.util.find_spec(mod) is None
        ):
            pytest.skip(f"{mod} is not installed: pip install -e '.[docs]' to build the site")
    site = tmp_path / "site"
    work = tmp_path / "repo"
    work.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", work / "mkdocs.yml")
    shutil.copytree(DOCS, work / "docs", ignore=shutil.ignore_patterns("_generated", "__pycache__"))
    (work / "src").symlink_to(ROOT / "src", target_is_directory=True)
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)  # snippets
    # the Results page from one quick experiment (what `gen_results.py --ids fig1` does)
    from noetherflow.cli import main as cli

    assert cli(["reproduce", "fig1", "--quick", "--out", str(tmp_path / "run")]) == 0
    gen = _load("nf_docs_gen_results", work / "docs" / "gen_results.py")
    gen.copy_run(tmp_path / "run", work / "docs" / "reproduction" / "_generated")
    _run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], work, timeout=300)
    results = (site / "reproduction" / "index.html").read_text(encoding="utf-8")
    assert "gf_norm_conserved" in results and "_generated/fig1/fig1.png" in results
    # rendered, not garbled: the report sits in its wrapping block, its parentheses and
    # dollars are text (arithmatex found no math in the values), headings got their anchors
    report = results[results.index('class="nf-report"') :]
    assert 'class="arithmatex"' not in report and "\\(" not in report
    assert 'id="environment"' in report and 'id="fig1"' in report
    assert (site / "stylesheets" / "report.css").is_file()
    assert (site / "reproduction" / "_generated" / "fig1" / "fig1.png").is_file()
    ddp = (site / "tutorials" / "ddp.html").read_text(encoding="utf-8")
    assert "init_process_group" in ddp  # the script is included verbatim
    api = (site / "api" / "flow.html").read_text(encoding="utf-8")
    assert "noether_flow" in api and ":func:" not in api
    _check_browsable_from_disk(site)


def _check_browsable_from_disk(site: Path) -> None:
    """Opened as file://: links name .html files, nothing loads from the network, search has
    its inlined index (the offline plugin) and formulas have the local MathJax."""
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # served, not opened
    assert len(pages) > 10
    for page in pages:
        html = page.read_text(encoding="utf-8")
        for src in re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html):
            assert not src.startswith(("http:", "https:", "//")), f"{page.name} loads {src}"
        for href in re.findall(r'<a [^>]*href="([^"#]+)"', html):
            if not href.startswith(("http:", "https:", "mailto:", "data:")):
                assert href.endswith((".html", ".png", ".py")), f"{page.name} links {href}"
                assert (page.parent / href).resolve().is_file(), f"{page.name}: {href} missing"
    assert (
        (site / "search" / "search_index.js")
        .read_text(encoding="utf-8")
        .startswith("var __index =")
    )
    assert (site / "javascripts" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000
    flow = (site / "concepts" / "flow.html").read_text(encoding="utf-8")
    assert flow.count('class="arithmatex"') > 10 and "mathjax/tex-svg.js" in flow
