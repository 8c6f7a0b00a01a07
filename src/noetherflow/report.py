"""Reports of a reproduction run: ``report.md``, a self-contained ``report.html`` and a rich table.

Everything is rendered from the metrics dicts written by the harness (``<dir>/<id>/metrics.json``),
so a report can be regenerated from a results directory at any time (``noetherflow report DIR``).
Every claim is listed with its statement, measured value, op, threshold and whether it holds;
errors are shown with their traceback summary; figures are linked (markdown) or inlined as
base64 PNG (HTML).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from noetherflow._io import atomic_write_text
from noetherflow.experiments import METRICS_FILE, Status

__all__ = [
    "FAILS",
    "HOLDS",
    "fmt_value",
    "load_records",
    "render_html",
    "render_markdown",
    "summary_table",
    "write_report",
]

HOLDS = "✓"
FAILS = "✗"


def _natural_key(s: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def load_records(out_dir: str | Path, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Read ``out_dir/<id>/metrics.json`` for ``ids`` (default: every experiment found)."""
    root = Path(out_dir)
    if ids is None:
        paths = sorted(root.glob(f"*/{METRICS_FILE}"), key=lambda p: _natural_key(p.parent.name))
    else:
        paths = [root / i / METRICS_FILE for i in ids]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"no metrics.json at {', '.join(missing)}; "
            f"run `noetherflow reproduce <id> --out {root}` first"
        )
    if not paths:
        raise FileNotFoundError(
            f"no <id>/{METRICS_FILE} under {str(root)!r}; "
            f"run `noetherflow reproduce all --out {root}` first"
        )
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]


def fmt_value(v: Any) -> str:
    """Compact, readable number formatting for claims (NaN/None → 'nan')."""
    if v is None:
        return "nan"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v == 0 or (1e-3 <= abs(v) < 1e5):
            return f"{v:.4g}"
        return f"{v:.3e}"
    return str(v)


def _counts(rec: dict[str, Any]) -> tuple[int, int]:
    claims = rec.get("claims") or []
    return sum(bool(c.get("holds")) for c in claims), len(claims)


def _status(rec: dict[str, Any]) -> str:
    if rec.get("status") == Status.ERROR.value or rec.get("error"):
        return "error"
    held, total = _counts(rec)
    return "ok" if held == total else "claims failing"


def _totals(records: Sequence[dict[str, Any]]) -> tuple[int, int, int]:
    held = sum(_counts(r)[0] for r in records)
    total = sum(_counts(r)[1] for r in records)
    errors = sum(_status(r) == "error" for r in records)
    return held, total, errors


def _md_cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _meta(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    seeds = sorted({int(r["seed"]) for r in records if r.get("seed") is not None})
    quick = sorted({bool(r.get("quick")) for r in records})
    return {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "seed": ", ".join(map(str, seeds)) or "—",
        "quick": ", ".join(map(str, quick)) or "—",
    }


def render_markdown(records: Sequence[dict[str, Any]]) -> str:
    """Markdown report; figure links are relative to the results directory."""
    held, total, errors = _totals(records)
    meta = _meta(records)
    lines = [
        "# noetherflow — reproduction report",
        "",
        f"Generated {meta['generated']} · seed {meta['seed']} · quick {meta['quick']} · "
        f"**{held}/{total} claims hold** · {errors} experiment error(s)",
        "",
        "## Summary",
        "",
        "| experiment | status | claims holding | elapsed (s) | description |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        h, t = _counts(r)
        lines.append(
            f"| [{r['experiment']}](#{r['experiment']}) | {_status(r)} | {h}/{t} | "
            f"{r.get('elapsed_s', 0):.1f} | {_md_cell(r.get('description', ''))} |"
        )
    for r in records:
        exp = r["experiment"]
        lines += ["", f"## {exp}", ""]
        if r.get("description"):
            lines += [r["description"], ""]
        lines.append(
            f"status **{_status(r)}** · quick {r.get('quick')} · seed {r.get('seed')} · "
            f"elapsed {r.get('elapsed_s', 0):.2f} s"
        )
        err = r.get("error")
        if err:
            lines += [
                "",
                f"**Error** in stage `{err.get('stage')}`: "
                f"`{err.get('type')}: {err.get('message')}`",
                "",
                "```text",
                str(err.get("traceback", "")).rstrip(),
                "```",
            ]
        claims = r.get("claims") or []
        if claims:
            lines += [
                "",
                "| holds | claim | statement | value | op | threshold | note |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in claims:
                mark = HOLDS if c.get("holds") else FAILS
                lines.append(
                    f"| {mark} | `{c['id']}` | {_md_cell(c.get('statement', ''))} | "
                    f"{fmt_value(c.get('value'))} | `{c.get('op')}` | "
                    f"{fmt_value(c.get('threshold'))} | {_md_cell(c.get('note', ''))} |"
                )
        elif not err:
            lines += ["", "_No claims._"]
        for f in r.get("figures") or []:
            lines += ["", f"![{exp}: {f}]({exp}/{f})"]
        lines += [
            "",
            "<details><summary>config</summary>",
            "",
            "```json",
            json.dumps(r.get("config", {}), indent=2, ensure_ascii=False),
            "```",
            "",
            "</details>",
        ]
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;width:100%}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;font-size:14px}
th{background:#f3f3f3}
.ok{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}.error{color:#cf222e}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto}
img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
"""


def _img_tag(path: Path, alt: str) -> str:
    if not path.is_file():
        return f'<p class="error">missing figure {html.escape(str(path))}</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def render_html(records: Sequence[dict[str, Any]], out_dir: str | Path) -> str:
    """Self-contained HTML report: figures from ``out_dir/<id>/`` inlined as base64 PNG."""
    root = Path(out_dir)
    e = html.escape
    held, total, errors = _totals(records)
    meta = _meta(records)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>noetherflow — reproduction report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>noetherflow — reproduction report</h1>",
        f"<p>Generated {e(meta['generated'])} · seed {e(meta['seed'])} · "
        f"quick {e(meta['quick'])} · "
        f"<b>{held}/{total} claims hold</b> · {errors} experiment error(s)</p>",
        "<h2>Summary</h2>",
        "<table><tr><th>experiment</th><th>status</th><th>claims holding</th>"
        "<th>elapsed (s)</th><th>description</th></tr>",
    ]
    for r in records:
        h, t = _counts(r)
        st = _status(r)
        cls = "ok" if st == "ok" else "fail"
        parts.append(
            f'<tr><td><a href="#{e(r["experiment"])}">{e(r["experiment"])}</a></td>'
            f'<td class="{cls}">{e(st)}</td><td>{h}/{t}</td>'
            f"<td>{r.get('elapsed_s', 0):.1f}</td><td>{e(str(r.get('description', '')))}</td></tr>"
        )
    parts.append("</table>")
    for r in records:
        exp = r["experiment"]
        parts.append(f'<h2 id="{e(exp)}">{e(exp)}</h2>')
        if r.get("description"):
            parts.append(f"<p>{e(r['description'])}</p>")
        parts.append(
            f"<p>status <b>{e(_status(r))}</b> · quick {e(str(r.get('quick')))} · "
            f"seed {e(str(r.get('seed')))} · elapsed {r.get('elapsed_s', 0):.2f} s</p>"
        )
        err = r.get("error")
        if err:
            parts.append(
                f'<p class="error"><b>Error</b> in stage <code>{e(str(err.get("stage")))}</code>: '
                f"<code>{e(str(err.get('type')))}: {e(str(err.get('message')))}</code></p>"
                f"<pre>{e(str(err.get('traceback', '')))}</pre>"
            )
        claims = r.get("claims") or []
        if claims:
            parts.append(
                "<table><tr><th>holds</th><th>claim</th><th>statement</th><th>value</th>"
                "<th>op</th><th>threshold</th><th>note</th></tr>"
            )
            for c in claims:
                ok = bool(c.get("holds"))
                parts.append(
                    f'<tr><td class="{"ok" if ok else "fail"}">{HOLDS if ok else FAILS}</td>'
                    f"<td><code>{e(str(c['id']))}</code></td>"
                    f"<td>{e(str(c.get('statement', '')))}</td>"
                    f"<td>{e(fmt_value(c.get('value')))}</td>"
                    f"<td><code>{e(str(c.get('op')))}</code></td>"
                    f"<td>{e(fmt_value(c.get('threshold')))}</td>"
                    f"<td>{e(str(c.get('note', '')))}</td></tr>"
                )
            parts.append("</table>")
        elif not err:
            parts.append("<p><i>No claims.</i></p>")
        for f in r.get("figures") or []:
            parts.append(_img_tag(root / exp / f, f"{exp}: {f}"))
        cfg = json.dumps(r.get("config", {}), indent=2, ensure_ascii=False)
        parts.append(f"<details><summary>config</summary><pre>{e(cfg)}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(records: Sequence[dict[str, Any]], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``out_dir/report.md`` and ``out_dir/report.html`` atomically; returns both paths."""
    root = Path(out_dir)
    md = atomic_write_text(root / "report.md", render_markdown(records))
    page = atomic_write_text(root / "report.html", render_html(records, root))
    return md, page


def summary_table(records: Sequence[dict[str, Any]]) -> Any:
    """A rich Table: one row per experiment, then every failing claim and error below it."""
    from rich.markup import escape
    from rich.table import Table

    held, total, errors = _totals(records)
    table = Table(title=f"noetherflow reproduce — {held}/{total} claims hold, {errors} error(s)")
    table.add_column("experiment", style="bold")
    table.add_column("status")
    table.add_column("claims", justify="right")
    table.add_column("elapsed (s)", justify="right")
    table.add_column("details")
    for r in records:
        h, t = _counts(r)
        st = _status(r)
        style = {"ok": "green", "error": "red"}.get(st, "yellow")
        details: list[str] = []
        err = r.get("error")
        if err:
            details.append(f"{err.get('stage')}: {err.get('type')}: {err.get('message')}")
        for c in r.get("claims") or []:
            if not c.get("holds"):
                details.append(
                    f"{FAILS} {c['id']}: {fmt_value(c.get('value'))} {c.get('op')} "
                    f"{fmt_value(c.get('threshold'))}"
                )
        table.add_row(
            r["experiment"],
            f"[{style}]{st}[/{style}]",
            f"{h}/{t}",
            f"{r.get('elapsed_s', 0):.1f}",
            escape("\n".join(details)) or HOLDS,
        )
    return table
