r"""Rendering the report's view (:mod:`noetherflow.report.view`) with Jinja2 templates.

Two environments over the same templates folder: HTML with Jinja's autoescaping (every value
through :func:`markupsafe.escape`), Markdown with the same guarantee by ``finalize``: every
``{{ value }}`` is made Markdown-inert (``\ ` * [ ]`` backslash-escaped; ``& < >`` and ``$`` as
entities, so no HTML, link, image, code span or math delimiter can come out of a value;
``(`` and ``)`` stay bare, since ``\(`` is a math delimiter to the docs' arithmatex, except a
``(`` right after a ``]``, written ``&#40;``), unless a filter already made it safe: ``cell``
(a table cell: also ``|`` and line breaks), ``fence`` (a code block fenced longer than any
backtick run inside) and ``url`` (a percent-quoted relative link).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from noetherflow._io import atomic_write_text
from noetherflow.report.records import (
    HOLDS,
    QUICK_BANNER,
    claim_line,
    claims_of,
    counts,
    error_of,
    kind_totals,
    order_records,
    seconds,
    status_of,
    totals,
)
from noetherflow.report.view import build_view

__all__ = ["md_escape", "render_html", "render_markdown", "summary_table", "write_report"]

_MD_BACKSLASH = str.maketrans({c: "\\" + c for c in "\\`*[]"})
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "$": "&#36;"}


class _MdSafe(str):
    """Markdown a filter produced (already inert); ``finalize`` passes it through."""


def md_escape(s: Any) -> str:
    """Markdown-inert text: no link, image, code span, HTML or math can come out of ``s``."""
    if isinstance(s, _MdSafe):
        return s
    text = "".join(_MD_ENTITIES.get(ch, ch) for ch in str(s).translate(_MD_BACKSLASH))
    return text.replace("\\](", "\\]&#40;")  # no "](" even escaped: never read as a link


def _cell(s: Any) -> _MdSafe:
    return _MdSafe(md_escape(s).replace("|", "\\|").replace("\r", " ").replace("\n", " "))


def _fence(s: Any, lang: str = "text") -> _MdSafe:
    text = str(s).rstrip()
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return _MdSafe(f"{fence}{lang}\n{text}\n{fence}")


def _url(path: str) -> _MdSafe:
    return _MdSafe(quote(path))


def _environment(*, html: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("noetherflow.report", "templates"),
        autoescape=html,
        finalize=None if html else md_escape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    if not html:
        env.filters.update(cell=_cell, fence=_fence, url=_url)
    return env


_HTML = _environment(html=True)
_MD = _environment(html=False)


def render_markdown(records: Sequence[dict[str, Any]], out_dir: str | Path | None = None) -> str:
    """Markdown report; figure links are relative to the results directory.

    With ``out_dir`` a figure that resolves outside it (a symbolic link) is refused too; the
    path checks that need no directory are always made.
    """
    root = None if out_dir is None else Path(out_dir)
    view = build_view(records, root, inline_figures=False)
    text = _MD.get_template("report.md.j2").render(**view)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def render_html(records: Sequence[dict[str, Any]], out_dir: str | Path) -> str:
    """Self-contained HTML report: figures from ``out_dir/<id>/`` inlined as base64 PNG."""
    view = build_view(records, Path(out_dir), inline_figures=True)
    return _HTML.get_template("report.html.j2").render(**view).rstrip("\n") + "\n"


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
    kinds = " · ".join(f"{k} {h}/{t}" for k, (h, t) in kind_totals(records).items() if t)
    table = Table(
        title=f"noetherflow reproduce — {held}/{total} claims hold ({kinds}), {errors} error(s)"
    )
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
