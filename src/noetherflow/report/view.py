"""The report's one structure: what both templates (Markdown and HTML) render.

:func:`build_view` turns the records of a run into plain values (strings, numbers, lists and
dicts, never markup): the banner, the headline counted per claim kind, the environment, the
summary rows, the failing claims with their ``why``, the errors, the corrections with the
measured checks, and one section per experiment. The templates decide only the markup, and
escape every value (HTML: Jinja's autoescaping; Markdown: :mod:`noetherflow.report.render`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from noetherflow.experiments._claims import KINDS
from noetherflow.experiments.corrections import CORRECTIONS, UNCHECKED, Correction
from noetherflow.report.records import (
    FAILS,
    HOLDS,
    INTRO,
    KIND_LABELS,
    NO_WHY,
    QUICK_BANNER,
    QUICK_DETAIL,
    SAFE_NAME,
    ReportInputError,
    check_figure,
    claim_line,
    claims_of,
    counts,
    environment,
    error_of,
    failing,
    figure_path,
    figures_of,
    find_claim,
    fmt_value,
    kind_of,
    kind_totals,
    meta,
    order_records,
    quick_ids,
    seconds,
    setup_of,
    status_of,
    totals,
)

__all__ = ["build_view"]


def _claim_row(c: dict[str, Any]) -> dict[str, Any]:
    holds = bool(c.get("holds"))
    why = str(c.get("why") or "")
    return {
        "mark": HOLDS if holds else FAILS,
        "holds": holds,
        "id": str(c.get("id")),
        "kind": kind_of(c),
        "statement": str(c.get("statement", "")),
        "value": fmt_value(c.get("value")),
        "op": str(c.get("op")),
        "threshold": fmt_value(c.get("threshold")),
        "line": claim_line(c),
        "note": str(c.get("note", "") or ""),
        # a holding claim's why is not shown; a failing one without it says so
        "why": why if not holds else "",
        "why_missing": not holds and not why,
        "no_why": NO_WHY,
    }


def _kind_counts(claims: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in KINDS:
        mine = [c for c in claims if kind_of(c) == k]
        out[k] = f"{sum(c.get('holds') is True for c in mine)}/{len(mine)}" if mine else "—"
    return out


def _check(chk: Any, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    present, claim = find_claim(records, chk.experiment, chk.claim)
    state = "measured" if claim is not None else ("missing" if present else "not_run")
    return {
        "experiment": chk.experiment,
        "claim": chk.claim,
        "shows": chk.shows,
        "state": state,
        "line": claim_line(claim) if claim is not None else "",
        "holds": bool(claim and claim.get("holds")),
        "kind": kind_of(claim) if claim is not None else "",
        "note": str(claim.get("note") or "") if claim is not None else "",
    }


def _correction(c: Correction, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": c.id,
        "where": c.where,
        "paper": c.paper,
        "corrected": c.corrected,
        "derivation": list(c.derivation),
        "checks": [_check(chk, records) for chk in c.checks],
        "tests": list(c.tests),
    }


def _figure(root: Path | None, exp: str, fig: Any, *, inline: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "alt": f"{exp}: {fig}",
        "path": f"{exp}/{fig}",
        "error": "",
        "missing": False,
        "data": "",
    }
    try:
        path = figure_path(root, exp, fig) if root is not None else None
        if path is None:
            check_figure(exp, fig)
    except ReportInputError as exc:
        out["error"] = str(exc)
        return out
    if inline:
        if path is None or not path.is_file():
            out["missing"] = True
        else:
            try:
                raw = path.read_bytes()
            except OSError as exc:  # the report cannot be complete: say which figure
                raise ReportInputError(
                    f"cannot read the figure {path}: {exc.strerror or exc}; make it readable "
                    "(e.g. chmod u+r) or remove it from the experiment's metrics.json"
                ) from exc
            out["data"] = base64.b64encode(raw).decode("ascii")
    return out


def _experiment(r: dict[str, Any], root: Path | None, *, inline: bool) -> dict[str, Any]:
    exp = str(r.get("experiment"))
    err = error_of(r)
    return {
        "id": exp,
        "anchor": exp if SAFE_NAME.match(exp) else "",
        "description": str(r.get("description") or ""),
        "paper": str(r.get("paper") or ""),
        "status": status_of(r),
        "quick": str(r.get("quick")),
        "seed": str(r.get("seed")),
        "elapsed": f"{seconds(r.get('elapsed_s')):.2f}",
        "error": None
        if err is None
        else {
            "stage": str(err.get("stage")),
            "type": str(err.get("type")),
            "message": str(err.get("message")),
            "traceback": str(err.get("traceback", "")),
        },
        "setup": [
            {k: str(row.get(k, "")) for k in ("quantity", "paper", "ours", "why")}
            for row in setup_of(r)
        ],
        "claims": [_claim_row(c) for c in claims_of(r)],
        "figures": [_figure(root, exp, f, inline=inline) for f in figures_of(r)],
        "notes": str(r.get("notes") or ""),
        "config": json.dumps(r.get("config", {}), indent=2, ensure_ascii=False, default=str),
    }


def build_view(
    records: Sequence[dict[str, Any]], root: Path | None, *, inline_figures: bool
) -> dict[str, Any]:
    """The report as plain values (see the module docstring), experiments in paper order.

    Args:
        records: metrics dicts of one run.
        root: the results directory (figures are checked to lie inside it), or None to make
            only the checks that need no directory.
        inline_figures: read each figure's PNG (base64) for a self-contained HTML page.
    """
    records = order_records(records)
    held, total, errors = totals(records)
    per_kind = kind_totals(records)
    quick = quick_ids(records)
    info = meta(records)
    summary = []
    for r in records:
        h, t = counts(r)
        exp = str(r.get("experiment"))
        summary.append(
            {
                "id": exp,
                "anchor": exp if SAFE_NAME.match(exp) else "",
                "status": status_of(r),
                "held": h,
                "total": t,
                "kinds": _kind_counts(claims_of(r)),
                "elapsed": f"{seconds(r.get('elapsed_s')):.1f}",
                "description": str(r.get("description") or ""),
            }
        )
    bad = failing(records)
    return {
        "title": "noetherflow — reproduction report",
        "quick": bool(quick),
        "quick_which": "" if len(quick) == len(records) else f" (quick: {', '.join(quick)})",
        "quick_banner": QUICK_BANNER,
        "quick_detail": QUICK_DETAIL,
        "generated": info["generated"],
        "seed": info["seed"],
        "quick_values": info["quick"],
        "held": held,
        "total": total,
        "errors": errors,
        "kinds": [
            {"kind": k, "label": KIND_LABELS[k], "held": per_kind[k][0], "total": per_kind[k][1]}
            for k in KINDS
        ],
        "intro": INTRO,
        "environment": [{"key": k, "value": v} for k, v in environment(records)],
        "summary": summary,
        "failing": [{"experiment": exp, **_claim_row(c)} for exp, c in bad],
        "failing_by_kind": {k: sum(kind_of(c) == k for _, c in bad) for k in KINDS},
        "broken": [
            {
                "experiment": str(r.get("experiment")),
                **{k: str((error_of(r) or {}).get(k)) for k in ("stage", "type", "message")},
            }
            for r in records
            if error_of(r)
        ],
        "corrections": [_correction(c, records) for c in CORRECTIONS],
        "unchecked": [
            {"where": u.where, "statement": u.statement, "status": u.status} for u in UNCHECKED
        ],
        "experiments": [_experiment(r, root, inline=inline_figures) for r in records],
        "kind_names": list(KINDS),
    }
