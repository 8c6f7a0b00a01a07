"""Bad inputs to the report and the command line (issues #16 and #19), one regression test per
case, each of which failed on the code before the fix, except two guards that already passed
and stay to keep it so: ``test_report_inside_figures_still_inlined`` (the refusal is not too
strict) and ``test_html_report_is_escaped`` (the HTML was already escaped; it now also covers
the setup, paper and notes fields).

Report: ``noetherflow report DIR`` reads only files inside DIR (figure paths that are absolute,
contain ``..`` or resolve outside DIR, also via the ``experiment`` field or a symbolic link, are
refused and shown as an escaped error); everything from metrics.json is escaped in HTML and
Markdown (checked by rendering the Markdown with a CommonMark and a Python-Markdown renderer).

CLI: documented exit codes; a user's mistake is one line on stderr, exit 2, no traceback
(``--debug`` shows it); values that would fail every experiment are refused at parse time;
``--help`` on every subcommand; ``--version``; ``python -m noetherflow``; ``inspect`` of token
models (``--dtype long``) and its hints. The process-level behaviour is checked in a subprocess.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from noetherflow import cli, report

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"\x89PNG\r\n\x1a\nSECRET-BYTES-OUTSIDE-THE-RESULTS-DIR"
EVIL = '<script>alert(1)</script> ![t](https://evil.example/t.png) <img src="http://x/y.png">'


def _record(exp: str = "fig1", **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "experiment": exp,
        "description": "d",
        "paper": "",
        "paper_order": None,
        "target": "t",
        "quick": False,
        "seed": 0,
        "status": "ok",
        "elapsed_s": 0.5,
        "config": {},
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


def _write(root: Path, rec: dict[str, Any], dirname: str | None = None) -> Path:
    d = root / (dirname or str(rec["experiment"]))
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.json").write_text(json.dumps(rec), encoding="utf-8")
    return d


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A PNG-looking file outside the results directory (tmp_path/results)."""
    path = tmp_path / "outside" / "secret.png"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def _report(results: Path) -> tuple[int, str, str]:
    code = cli.main(["report", str(results)])
    return (
        code,
        (results / "report.html").read_text(encoding="utf-8"),
        (results / "report.md").read_text(encoding="utf-8"),
    )


def _assert_not_read(page: str, md: str) -> None:
    assert base64.b64encode(SECRET).decode() not in page
    assert "SECRET-BYTES" not in page and "SECRET-BYTES" not in md
    assert "figure refused" in page


# --------------------------------------------------------------------------------------
# report: only files inside the results directory
# --------------------------------------------------------------------------------------


def test_report_refuses_absolute_figure_path(tmp_path: Path, secret: Path) -> None:
    results = tmp_path / "results"
    _write(results, _record(figures=[str(secret)]))
    code, page, md = _report(results)
    assert code == cli.ExitCode.OK
    _assert_not_read(page, md)
    assert f"]({secret}" not in md and "Figure refused" in md


def test_report_refuses_dotdot_figure_path(tmp_path: Path, secret: Path) -> None:
    results = tmp_path / "results"
    _write(results, _record(figures=["../../outside/secret.png"]))
    _, page, md = _report(results)
    _assert_not_read(page, md)
    assert "](fig1/../../outside" not in md and "Figure refused" in md


def test_report_refuses_escape_through_experiment_field(tmp_path: Path, secret: Path) -> None:
    results = tmp_path / "results"
    _write(results, _record(exp="../outside", figures=["secret.png"]), dirname="fig1")
    _, page, md = _report(results)
    _assert_not_read(page, md)
    assert "](../outside/secret.png)" not in md


def test_report_refuses_symlink_leading_outside(tmp_path: Path, secret: Path) -> None:
    results = tmp_path / "results"
    exp_dir = _write(results, _record(figures=["fig1.png"]))
    (exp_dir / "fig1.png").symlink_to(secret)
    _, page, md = _report(results)
    _assert_not_read(page, md)
    assert "](fig1/fig1.png)" not in md


def test_report_refuses_non_png_figure(tmp_path: Path) -> None:
    results = tmp_path / "results"
    exp_dir = _write(results, _record(figures=["metrics.json"]))
    _, page, _ = _report(results)
    assert "figure refused" in page and "is not a .png" in page
    assert base64.b64encode((exp_dir / "metrics.json").read_bytes()).decode() not in page


def test_report_does_not_follow_a_linked_experiment_directory(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    _write(outside, _record(exp="fig9", description="from outside"), dirname="fig9")
    results = tmp_path / "results"
    _write(results, _record())
    (results / "fig9").symlink_to(outside / "fig9", target_is_directory=True)
    code = cli.main(["report", str(results)])
    assert code == cli.ExitCode.USAGE
    assert not (results / "report.md").exists()


def test_report_inside_figures_still_inlined(tmp_path: Path) -> None:
    results = tmp_path / "results"
    exp_dir = _write(results, _record(figures=["sub/fig1.png"]))
    (exp_dir / "sub").mkdir()
    (exp_dir / "sub" / "fig1.png").write_bytes(b"\x89PNG\r\n\x1a\nOK")
    _, page, md = _report(results)
    assert base64.b64encode(b"\x89PNG\r\n\x1a\nOK").decode() in page
    assert "](fig1/sub/fig1.png)" in md


# --------------------------------------------------------------------------------------
# report: everything from metrics.json is escaped
# --------------------------------------------------------------------------------------


def _evil_record() -> dict[str, Any]:
    claim = {
        "id": "c`x</code><script>alert(2)</script>",
        "statement": EVIL,
        "value": EVIL,
        "op": "<script>",
        "threshold": 1,
        "holds": False,
        "note": "a | b ```\n<script>alert(3)</script>\n[x](javascript:alert(4))",
    }
    return _record(
        exp="fig1",
        description=EVIL,
        paper=EVIL,
        notes=f"{EVIL}\n```\n<script>alert(5)</script>\n```",
        setup=[{"quantity": EVIL, "paper": "<b>", "ours": "`x`", "why": "[a](http://e.x)"}],
        claims=[claim],
        error={
            "stage": "<script>",
            "type": "E",
            "message": EVIL,
            "traceback": "```\n<script>alert(6)</script>\n````",
        },
        status="error",
        config={"<script>": "```"},
    )


def _rendered_markdown(md: str) -> list[str]:
    out = []
    from markdown_it import MarkdownIt

    out.append(MarkdownIt("commonmark").enable("table").render(md))
    markdown = pytest.importorskip("markdown")
    out.append(markdown.markdown(md, extensions=["tables", "fenced_code", "md_in_html"]))
    return out


def test_markdown_report_is_inert(tmp_path: Path) -> None:
    md = report.render_markdown([_evil_record()], tmp_path)
    for page in _rendered_markdown(md):
        low = page.lower()
        assert "<script" not in low, page
        assert "<img" not in low, page  # no remote image (no figure in this record)
        assert 'href="http' not in low and 'href="javascript' not in low, page
        assert "<b>" not in low.replace("<b>paper:</b>", "")  # only our own bold
    # raw text: a `<script` survives only inside fenced code blocks, shown literally
    outside_code = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", md)
    assert "<script" not in outside_code.lower() and "](http" not in outside_code


def test_html_report_is_escaped(tmp_path: Path) -> None:
    page = report.render_html([_evil_record()], tmp_path)
    low = page.lower()
    assert "<script" not in low and "<img" not in low
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_summary_table_is_not_rich_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    Console(width=200).print(report.summary_table([_record(exp="[red]x[/red]")]))
    assert "[red]x[/red]" in capsys.readouterr().out


def test_invalid_metrics_json_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    (results / "fig1").mkdir(parents=True)
    (results / "fig1" / "metrics.json").write_text('{"experiment": "fig1",', encoding="utf-8")
    assert cli.main(["report", str(results)]) == cli.ExitCode.USAGE
    err = capsys.readouterr().err
    assert "metrics.json is not valid JSON (line 1" in err and "Traceback" not in err
    (results / "fig1" / "metrics.json").write_text("[1, 2]", encoding="utf-8")
    assert cli.main(["report", str(results)]) == cli.ExitCode.USAGE
    assert "expected the object the harness writes" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# CLI: exit codes, no traceback, parse-time validation, --help, --version, python -m
# --------------------------------------------------------------------------------------


def _nf(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "noetherflow", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
        cwd=cwd,
    )


def _usage_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == cli.ExitCode.USAGE, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def test_exit_codes_are_the_documented_ones() -> None:
    assert [int(c) for c in cli.ExitCode] == [0, 1, 2, 3, 4, 130]
    for code in (0, 1, 2, 3):
        assert f"{code} " in (cli.__doc__ or "")


def test_user_mistakes_are_one_line_exit_2_no_traceback(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    bad_model = tmp_path / "bad.py"
    bad_model.write_text("def make(:\n")
    raising = tmp_path / "raising.py"
    raising.write_text("def make():\n    raise RuntimeError('no weights')\n")
    cases = [
        (("reproduce", "nope", "--out", str(tmp_path)), "unknown experiment id 'nope'"),
        (("reproduce", "fig1", "--seed", "-1"), "--seed: -1 is not between 0 and"),
        (("reproduce", "fig1", "--jobs", "0"), "--jobs: 0 is not >= 1"),
        (("reproduce", "fig1", "--torch-threads", "x"), "'x' is not an integer"),
        (("reproduce", "fig1", "--quick", "--out", str(a_file)), "exists and is not a directory"),
        (("report", str(tmp_path / "missing")), "does not exist or is not a directory"),
        (("inspect", f"{tmp_path}/none.py:make", "--input-shape", "3"), "does not exist"),
        (("inspect", f"{bad_model}:make", "--input-shape", "3"), "SyntaxError (line 1)"),
        (("inspect", f"{raising}:make", "--input-shape", "3"), "RuntimeError: no weights"),
        (("inspect", f"{raising}:other", "--input-shape", "3"), "no callable 'other'"),
        (("inspect", "x.py:make", "--input-shape", "3,-2"), "expected positive sizes"),
        (("inspect", "x.py:make", "--input-shape", "3", "--batch-size", "0"), "0 is not >= 1"),
        (("demo", "--seed", "-3"), "-3 is not between 0 and"),
    ]
    for args, needle in cases:
        proc = _nf(*args)
        _usage_error(proc, needle)
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
        assert needle in last, (args, proc.stderr)  # the message is one line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    raising = tmp_path / "raising.py"
    raising.write_text("def make():\n    raise RuntimeError('no weights')\n")
    proc = _nf("inspect", f"{raising}:make", "--input-shape", "3", "--debug")
    assert proc.returncode == cli.ExitCode.USAGE
    assert "Traceback" in proc.stderr and "RuntimeError: no weights" in proc.stderr


@pytest.mark.parametrize("command", ["list", "reproduce", "report", "inspect", "demo"])
def test_help_on_every_subcommand(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([command, "--help"]) == cli.ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith(f"usage: noetherflow {command}") and "--debug" in out


def test_inspect_help_says_it_imports_and_runs_the_file() -> None:
    proc = _nf("inspect", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "imports FILE.py (running its top-level code)" in text and "--dtype" in text


def test_version_and_python_m() -> None:
    from noetherflow import __version__

    proc = _nf("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"noetherflow {__version__}"
    proc = _nf("--help")
    assert proc.returncode == 0 and "Exit codes: 0 ok, 1" in " ".join(proc.stdout.split())


TOKEN_MODEL = """
import torch.nn as nn

class Tok(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(self.l1(self.emb(x)).relu())

def make():
    return Tok()
"""


def test_inspect_token_model_with_dtype_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "tok.py"
    f.write_text(TOKEN_MODEL)
    assert cli.main(["inspect", f"{f}:make", "--input-shape", "16", "--dtype", "long"]) == 0
    out, err = capsys.readouterr()
    assert "rescaling" in out and "l1" in out
    assert "importing and running" in err  # the output says it ran the user's file
    args = ["inspect", f"{f}:make", "--input-shape", "16", "--dtype", "long", "--vocab-size"]
    assert cli.main([*args, "50", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # the table → l1 rotation (GL of the embedding width) and l1 → l2 across the ReLU
    assert [s["name"] for s in data["symmetries"]] == ["rotation:emb→l1", "rescaling:l1→l2"]
    assert "coverage" in data
    # ids beyond the table: the model's own error, exit 2, no traceback
    assert cli.main([*args, "500"]) == cli.ExitCode.USAGE
    assert "error" in capsys.readouterr().err


def test_inspect_embedding_model_with_float_inputs_gets_the_right_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "tok.py"
    f.write_text(TOKEN_MODEL)
    assert cli.main(["inspect", f"{f}:make", "--input-shape", "16"]) == cli.ExitCode.USAGE
    err = capsys.readouterr().err
    assert "nn.Embedding layers (emb (50 tokens))" in err and "pass --dtype long" in err
    assert "expects 8 input features" not in err  # the old, wrong cause
    plain = tmp_path / "plain.py"
    plain.write_text("import torch.nn as nn\ndef make():\n    return nn.Linear(3, 2)\n")
    args = ["inspect", f"{plain}:make", "--input-shape", "3", "--dtype", "long"]
    assert cli.main(args) == cli.ExitCode.USAGE
    assert "needs --vocab-size N" in capsys.readouterr().err
