r"""The reproduction report: ``report.md``, a self-contained ``report.html`` and a rich table.

Everything is rendered from the metrics dicts written by the harness (``<dir>/<id>/metrics.json``),
so a report can be regenerated from a results directory at any time (``noetherflow report DIR``).
Structure (the same in Markdown and HTML):

1. a banner when any experiment ran with ``--quick`` (sizes are reduced; not the paper's
   protocol);
2. a summary table, experiments in the paper's order (``PAPER_ORDER``; those without it last,
   then by id);
3. every failing claim with its note, and every experiment error;
4. "Corrections to the paper", rendered from
   :data:`noetherflow.experiments.corrections.CORRECTIONS`: the paper's text, the corrected
   statement, a two-line derivation and the measured check (the claim's value from this run);
5. per experiment: the paper's statement, the setup table (every deviation from the paper), the
   claims, the figure(s), the notes (settings tried and what they gave), the config.

Trust: metrics.json is data, never markup or a path to follow blindly. Every string from it is
escaped (HTML: :func:`html.escape`; Markdown: ``\ ` [ ] ( )`` backslash-escaped, ``& < >`` as
entities, ``|`` in table cells, code blocks fenced longer than any backtick run inside), and a
figure is read only if it is a PNG inside the results directory: a path that is absolute,
contains ``..`` or resolves outside the directory (also through the ``experiment`` field or a
symbolic link) is refused and shown as an error, never read.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from noetherflow._io import atomic_write_text
from noetherflow._report_records import (
    FAILS,
    HOLDS,
    INTRO,
    QUICK_BANNER,
    QUICK_DETAIL,
    SAFE_NAME,
    ReportInputError,
    check_figure,
    claim_line,
    claims_of,
    counts,
    error_of,
    failing,
    figure_path,
    figures_of,
    find_claim,
    fmt_value,
    load_records,
    meta,
    order_records,
    quick_ids,
    seconds,
    setup_of,
    status_of,
    totals,
)
from noetherflow.experiments.corrections import CORRECTIONS, Correction

__all__ = [
    "FAILS",
    "HOLDS",
    "QUICK_BANNER",
    "ReportInputError",
    "figure_path",
    "fmt_value",
    "load_records",
    "order_records",
    "render_html",
    "render_markdown",
    "summary_table",
    "write_report",
]

# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------

_MD_BACKSLASH = str.maketrans({c: "\\" + c for c in "\\`*[]()"})
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _md(s: Any) -> str:
    """Markdown-inert text: no link, image, code span or HTML can come out of ``s``."""
    text = str(s).translate(_MD_BACKSLASH)
    return "".join(_MD_ENTITIES.get(ch, ch) for ch in text)


def _md_cell(s: Any) -> str:
    return _md(s).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_block(s: Any, lang: str = "text") -> list[str]:
    """A fenced code block whose fence is longer than any backtick run inside ``s``."""
    text = str(s).rstrip()
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{lang}", text, fence]


def _md_correction(c: Correction, records: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        f"### {_md(c.where)}",
        "",
        f"- **Paper:** {_md(c.paper)}",
        f"- **Corrected:** {_md(c.corrected)}",
        f"- **Derivation:** {_md(c.derivation[0])}  ",
        f"  {_md(c.derivation[1])}",
    ]
    for chk in c.checks:
        present, claim = find_claim(records, chk.experiment, chk.claim)
        where = f"{_md(chk.experiment)} / {_md(chk.claim)}"
        if claim is not None:
            lines.append(
                f"- **Measured** ({where}): {_md(claim_line(claim))} — {_md(chk.shows)}"
                + (f". Note: {_md(claim.get('note'))}" if claim.get("note") else "")
            )
        elif present:
            lines.append(
                f"- **Measured** ({where}): claim not found in this run's {_md(chk.experiment)} "
                "(renamed or removed?)"
            )
        else:
            lines.append(
                f"- **Measured** ({where}): not measured in this run "
                f"(`noetherflow reproduce {chk.experiment}`)"
            )
    if c.tests:
        lines.append("- **Also tested by:** " + ", ".join(_md(t) for t in c.tests))
    return [*lines, ""]


def _md_experiment(r: dict[str, Any], root: Path | None) -> list[str]:
    exp = str(r.get("experiment"))
    lines = ["", f"## {_md(exp)}", ""]
    if r.get("description"):
        lines += [_md(r["description"]), ""]
    if r.get("paper"):
        lines += [f"**Paper:** {_md(r['paper'])}", ""]
    lines.append(
        f"status **{_md(status_of(r))}** · quick {_md(r.get('quick'))} · "
        f"seed {_md(r.get('seed'))} · elapsed {seconds(r.get('elapsed_s')):.2f} s"
    )
    err = error_of(r)
    if err:
        lines += [
            "",
            f"**Error** in stage {_md(err.get('stage'))}: {_md(err.get('type'))}: "
            f"{_md(err.get('message'))}",
            "",
            *_md_block(err.get("traceback", "")),
        ]
    rows = setup_of(r)
    lines += ["", "**Setup: deviations from the paper**", ""]
    if rows:
        lines += ["| quantity | paper | ours | why |", "|---|---|---|---|"]
        lines += [
            "| "
            + " | ".join(_md_cell(row.get(k, "")) for k in ("quantity", "paper", "ours", "why"))
            + " |"
            for row in rows
        ]
    else:
        lines.append("_Not stated: this experiment defines no setup()._")
    listed = claims_of(r)
    if listed:
        lines += [
            "",
            "| holds | claim | statement | value | op | threshold | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in listed:
            mark = HOLDS if c.get("holds") else FAILS
            lines.append(
                f"| {mark} | {_md_cell(c.get('id'))} | {_md_cell(c.get('statement', ''))} | "
                f"{_md_cell(fmt_value(c.get('value')))} | {_md_cell(c.get('op'))} | "
                f"{_md_cell(fmt_value(c.get('threshold')))} | {_md_cell(c.get('note', ''))} |"
            )
    elif not err:
        lines += ["", "_No claims._"]
    for f in figures_of(r):
        try:
            check_figure(exp, f) if root is None else figure_path(root, exp, f)
        except ReportInputError as exc:
            lines += ["", f"**Figure refused:** {_md(exc)}"]
            continue
        lines += ["", f"![{_md(exp)}: {_md(f)}]({quote(f'{exp}/{f}')})"]
    if r.get("notes"):
        lines += ["", "**Notes: settings tried and what they gave**", "", _md(r["notes"])]
    cfg = json.dumps(r.get("config", {}), indent=2, ensure_ascii=False, default=str)
    lines += [
        "",
        "<details><summary>config</summary>",
        "",
        *_md_block(cfg, "json"),
        "",
        "</details>",
    ]
    return lines


def render_markdown(records: Sequence[dict[str, Any]], out_dir: str | Path | None = None) -> str:
    """Markdown report; figure links are relative to the results directory.

    With ``out_dir`` a figure that resolves outside it (a symbolic link) is refused too; the
    path checks that need no directory are always made.
    """
    records = order_records(records)
    held, total, errors = totals(records)
    info = meta(records)
    root = None if out_dir is None else Path(out_dir)
    lines = ["# noetherflow — reproduction report", ""]
    quick = quick_ids(records)
    if quick:
        which = "" if len(quick) == len(records) else f" (quick: {', '.join(map(_md, quick))})"
        lines += [f"> **{QUICK_BANNER}**{which} {_md(QUICK_DETAIL)}", ""]
    lines += [
        f"Generated {info['generated']} · seed {_md(info['seed'])} · quick {info['quick']} · "
        f"**{held}/{total} claims hold** · {errors} experiment error(s)",
        "",
        _md(INTRO),
        "",
        "## Summary",
        "",
        "| experiment | status | claims holding | elapsed (s) | description |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        h, t = counts(r)
        exp = _md_cell(r.get("experiment"))
        link = f"[{exp}](#{exp})" if SAFE_NAME.match(str(r.get("experiment"))) else exp
        lines.append(
            f"| {link} | {status_of(r)} | {h}/{t} | {seconds(r.get('elapsed_s')):.1f} | "
            f"{_md_cell(r.get('description', ''))} |"
        )
    lines += ["", "## Failing claims and errors", ""]
    bad_claims = failing(records)
    broken = [r for r in records if error_of(r)]
    if not bad_claims and not broken:
        lines.append("_Every claim holds and no experiment errored._")
    if bad_claims:
        lines += [
            "| experiment | claim | statement | measured | note |",
            "|---|---|---|---|---|",
        ]
        for exp, c in bad_claims:
            lines.append(
                f"| {_md_cell(exp)} | {_md_cell(c.get('id'))} | {_md_cell(c.get('statement'))} | "
                f"{_md_cell(claim_line(c))} | {_md_cell(c.get('note', ''))} |"
            )
    for r in broken:
        err = error_of(r) or {}
        lines += [
            "",
            f"- {_md(r.get('experiment'))}: error in stage {_md(err.get('stage'))}: "
            f"{_md(err.get('type'))}: {_md(err.get('message'))}",
        ]
    lines += ["", "## Corrections to the paper", ""]
    for corr in CORRECTIONS:
        lines += _md_correction(corr, records)
    for r in records:
        lines += _md_experiment(r, root)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;width:100%}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;font-size:14px}
th{background:#f3f3f3}
.ok{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}.error{color:#cf222e}
.banner{background:#fff4ce;border:1px solid #e0b000;padding:8px 12px;font-weight:bold}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap}
img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
"""


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _img_tag(root: Path, exp: Any, fig: Any) -> str:
    try:
        path = figure_path(root, exp, fig)
    except ReportInputError as exc:
        return f'<p class="error">figure refused: {_e(exc)}</p>'
    if not path.is_file():
        return f'<p class="error">missing figure {_e(f"{exp}/{fig}")}</p>'
    try:
        raw = path.read_bytes()
    except OSError as exc:  # the report cannot be complete: say which figure, not "write"
        raise ReportInputError(
            f"cannot read the figure {path}: {exc.strerror or exc}; make it readable (e.g. "
            "chmod u+r) or remove it from the experiment's metrics.json"
        ) from exc
    data = base64.b64encode(raw).decode("ascii")
    return f'<img alt="{_e(f"{exp}: {fig}")}" src="data:image/png;base64,{data}">'


def _html_claims(claims: list[dict[str, Any]]) -> list[str]:
    parts = [
        "<table><tr><th>holds</th><th>claim</th><th>statement</th><th>value</th>"
        "<th>op</th><th>threshold</th><th>note</th></tr>"
    ]
    for c in claims:
        ok = bool(c.get("holds"))
        parts.append(
            f'<tr><td class="{"ok" if ok else "fail"}">{HOLDS if ok else FAILS}</td>'
            f"<td><code>{_e(c.get('id'))}</code></td>"
            f"<td>{_e(c.get('statement', ''))}</td>"
            f"<td>{_e(fmt_value(c.get('value')))}</td>"
            f"<td><code>{_e(c.get('op'))}</code></td>"
            f"<td>{_e(fmt_value(c.get('threshold')))}</td>"
            f"<td>{_e(c.get('note', ''))}</td></tr>"
        )
    return [*parts, "</table>"]


def _html_correction(c: Correction, records: Sequence[dict[str, Any]]) -> list[str]:
    items = [
        f"<li><b>Paper:</b> {_e(c.paper)}</li>",
        f"<li><b>Corrected:</b> {_e(c.corrected)}</li>",
        f"<li><b>Derivation:</b> {_e(c.derivation[0])}<br>{_e(c.derivation[1])}</li>",
    ]
    for chk in c.checks:
        present, claim = find_claim(records, chk.experiment, chk.claim)
        where = f"{_e(chk.experiment)} / <code>{_e(chk.claim)}</code>"
        if claim is not None:
            note = f". Note: {_e(claim.get('note'))}" if claim.get("note") else ""
            cls = "ok" if claim.get("holds") else "fail"
            items.append(
                f'<li><b>Measured</b> ({where}): <span class="{cls}">{_e(claim_line(claim))}'
                f"</span> — {_e(chk.shows)}{note}</li>"
            )
        elif present:
            items.append(f"<li><b>Measured</b> ({where}): claim not found in this run</li>")
        else:
            items.append(
                f"<li><b>Measured</b> ({where}): not measured in this run "
                f"(<code>noetherflow reproduce {_e(chk.experiment)}</code>)</li>"
            )
    if c.tests:
        items.append("<li><b>Also tested by:</b> " + ", ".join(_e(t) for t in c.tests) + "</li>")
    return [f"<h3>{_e(c.where)}</h3>", "<ul>", *items, "</ul>"]


def _html_experiment(r: dict[str, Any], root: Path) -> list[str]:
    exp = r.get("experiment")
    parts = [f'<h2 id="{_e(exp)}">{_e(exp)}</h2>']
    if r.get("description"):
        parts.append(f"<p>{_e(r['description'])}</p>")
    if r.get("paper"):
        parts.append(f"<p><b>Paper:</b> {_e(r['paper'])}</p>")
    parts.append(
        f"<p>status <b>{_e(status_of(r))}</b> · quick {_e(r.get('quick'))} · "
        f"seed {_e(r.get('seed'))} · elapsed {seconds(r.get('elapsed_s')):.2f} s</p>"
    )
    err = error_of(r)
    if err:
        parts.append(
            f'<p class="error"><b>Error</b> in stage <code>{_e(err.get("stage"))}</code>: '
            f"<code>{_e(err.get('type'))}: {_e(err.get('message'))}</code></p>"
            f"<pre>{_e(err.get('traceback', ''))}</pre>"
        )
    parts.append("<p><b>Setup: deviations from the paper</b></p>")
    rows = setup_of(r)
    if rows:
        parts.append("<table><tr><th>quantity</th><th>paper</th><th>ours</th><th>why</th></tr>")
        for row in rows:
            cells = "".join(
                f"<td>{_e(row.get(k, ''))}</td>" for k in ("quantity", "paper", "ours", "why")
            )
            parts.append(f"<tr>{cells}</tr>")
        parts.append("</table>")
    else:
        parts.append("<p><i>Not stated: this experiment defines no setup().</i></p>")
    listed = claims_of(r)
    if listed:
        parts += _html_claims(listed)
    elif not err:
        parts.append("<p><i>No claims.</i></p>")
    for f in figures_of(r):
        parts.append(_img_tag(root, exp, f))
    if r.get("notes"):
        parts.append("<p><b>Notes: settings tried and what they gave</b></p>")
        parts.append(f"<pre>{_e(r['notes'])}</pre>")
    cfg = json.dumps(r.get("config", {}), indent=2, ensure_ascii=False, default=str)
    parts.append(f"<details><summary>config</summary><pre>{_e(cfg)}</pre></details>")
    return parts


def render_html(records: Sequence[dict[str, Any]], out_dir: str | Path) -> str:
    """Self-contained HTML report: figures from ``out_dir/<id>/`` inlined as base64 PNG."""
    records = order_records(records)
    root = Path(out_dir)
    held, total, errors = totals(records)
    info = meta(records)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>noetherflow — reproduction report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>noetherflow — reproduction report</h1>",
    ]
    quick = quick_ids(records)
    if quick:
        which = "" if len(quick) == len(records) else f" (quick: {', '.join(quick)})"
        parts.append(f'<p class="banner">{_e(QUICK_BANNER + which)} {_e(QUICK_DETAIL)}</p>')
    parts += [
        f"<p>Generated {_e(info['generated'])} · seed {_e(info['seed'])} · "
        f"quick {_e(info['quick'])} · "
        f"<b>{held}/{total} claims hold</b> · {errors} experiment error(s)</p>",
        f"<p>{_e(INTRO)}</p>",
        "<h2>Summary</h2>",
        "<table><tr><th>experiment</th><th>status</th><th>claims holding</th>"
        "<th>elapsed (s)</th><th>description</th></tr>",
    ]
    for r in records:
        h, t = counts(r)
        st = status_of(r)
        cls = "ok" if st == "ok" else "fail"
        parts.append(
            f'<tr><td><a href="#{_e(r.get("experiment"))}">{_e(r.get("experiment"))}</a></td>'
            f'<td class="{cls}">{_e(st)}</td><td>{h}/{t}</td>'
            f"<td>{seconds(r.get('elapsed_s')):.1f}</td>"
            f"<td>{_e(r.get('description', ''))}</td></tr>"
        )
    parts += ["</table>", "<h2>Failing claims and errors</h2>"]
    bad_claims = failing(records)
    broken = [r for r in records if error_of(r)]
    if not bad_claims and not broken:
        parts.append("<p><i>Every claim holds and no experiment errored.</i></p>")
    if bad_claims:
        parts.append(
            "<table><tr><th>experiment</th><th>claim</th><th>statement</th><th>measured</th>"
            "<th>note</th></tr>"
        )
        for exp, c in bad_claims:
            parts.append(
                f"<tr><td>{_e(exp)}</td><td><code>{_e(c.get('id'))}</code></td>"
                f"<td>{_e(c.get('statement'))}</td><td>{_e(claim_line(c))}</td>"
                f"<td>{_e(c.get('note', ''))}</td></tr>"
            )
        parts.append("</table>")
    for r in broken:
        err = error_of(r) or {}
        parts.append(
            f'<p class="error">{_e(r.get("experiment"))}: error in stage {_e(err.get("stage"))}: '
            f"{_e(err.get('type'))}: {_e(err.get('message'))}</p>"
        )
    parts.append("<h2>Corrections to the paper</h2>")
    for corr in CORRECTIONS:
        parts += _html_correction(corr, records)
    for r in records:
        parts += _html_experiment(r, root)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(records: Sequence[dict[str, Any]], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``out_dir/report.md`` and ``out_dir/report.html`` atomically; returns both paths."""
    root = Path(out_dir)
    md = atomic_write_text(root / "report.md", render_markdown(records, root))
    page = atomic_write_text(root / "report.html", render_html(records, root))
    return md, page


def summary_table(records: Sequence[dict[str, Any]]) -> Any:
    """A rich Table in the paper's order: one row per experiment, failing claims and errors."""
    from rich.markup import escape
    from rich.table import Table

    records = order_records(records)
    held, total, errors = totals(records)
    table = Table(title=f"noetherflow reproduce — {held}/{total} claims hold, {errors} error(s)")
    table.add_column("experiment", style="bold")
    table.add_column("status")
    table.add_column("claims", justify="right")
    table.add_column("elapsed (s)", justify="right")
    table.add_column("details")
    for r in records:
        h, t = counts(r)
        st = status_of(r)
        style = {"ok": "green", "error": "red"}.get(st, "yellow")
        details: list[str] = []
        err = error_of(r)
        if err:
            details.append(f"{err.get('stage')}: {err.get('type')}: {err.get('message')}")
        for c in claims_of(r):
            if not c.get("holds"):
                details.append(f"{c.get('id')}: {claim_line(c)}")
        table.add_row(
            escape(str(r.get("experiment"))),
            f"[{style}]{st}[/{style}]",
            f"{h}/{t}",
            f"{seconds(r.get('elapsed_s')):.1f}",
            escape("\n".join(details)) or HOLDS,
        )
    if any(r.get("quick") is True for r in records):
        table.caption = QUICK_BANNER
    return table
