"""Compare the claims of two reproduction runs: values, relative change and verdicts.

Each side is either a results directory written by ``noetherflow reproduce`` (one
``<id>/metrics.json`` per experiment) or a JSON file of recorded values (for runs that are too
costly to repeat, e.g. the full size before a change), shaped as::

    {"<experiment>": {"<claim id>": {"value": 0.05, "op": "<", "threshold": 0.1,
                                      "holds": true, "source": "where it was recorded"}}}

(``op``, ``threshold``, ``holds`` and ``source`` are optional; a recorded claim without
``holds`` gets its verdict from ``value op threshold`` when both are given.)

For every claim present on both sides it prints: experiment, claim id, value before and after,
the relative change ``(after − before) / |before|``, and the verdict on each side; the claims
found on one side only (new, renamed or removed claims) are listed separately, and so are
experiments that crashed. ``--moved`` (default 0.01) marks the rows whose value moved by more
than that fraction, and a row whose verdict changed is marked too.

Usage::

    python benchmarks/compare_verdicts.py BEFORE AFTER               # Markdown tables
    python benchmarks/compare_verdicts.py BEFORE AFTER --only-changed
    python benchmarks/compare_verdicts.py BEFORE AFTER --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
}


@dataclass(frozen=True)
class Claim:
    """One claim as a run reported it (or as it was recorded).

    Attributes:
        experiment: experiment id (``fig2``).
        id: claim id within the experiment.
        value: measured value (``None`` when not a finite number or not recorded).
        op: comparison operator of the claim (``"<"``, ``">="``, ...) or ``None``.
        threshold: threshold of the claim or ``None``.
        holds: verdict, ``None`` when unknown.
        source: where a recorded value comes from (empty for a run's metrics.json).
    """

    experiment: str
    id: str
    value: float | None
    op: str | None
    threshold: float | None
    holds: bool | None
    source: str = ""


@dataclass(frozen=True)
class Row:
    """A claim present on both sides.

    Attributes:
        before: the claim on the first side.
        after: the claim on the second side.
        rel_change: ``(after − before) / |before|``; ``None`` when undefined.
        moved: ``|rel_change|`` above the tolerance (or one value missing or zero on one side).
        verdict_changed: both verdicts known and different.
        rule_changed: the operator or the threshold differs between the sides.
    """

    before: Claim
    after: Claim
    rel_change: float | None
    moved: bool
    verdict_changed: bool
    rule_changed: bool


@dataclass(frozen=True)
class Comparison:
    """Everything the report prints.

    Attributes:
        rows: claims on both sides, in experiment then claim order.
        only_before: claims only on the first side (removed or renamed).
        only_after: claims only on the second side (new or renamed).
        crashed: ``{side: {experiment: error}}`` for experiments whose run raised.
    """

    rows: list[Row]
    only_before: list[Claim]
    only_after: list[Claim]
    crashed: dict[str, dict[str, str]]


def _number(x: Any) -> float | None:
    """A float (booleans as 0/1, ±inf and NaN kept), or ``None`` when missing or not numeric."""
    if not isinstance(x, int | float):
        return None
    return float(x)


def _verdict(value: float | None, op: str | None, threshold: float | None) -> bool | None:
    if value is None or op is None or threshold is None or op not in _OPS:
        return None
    return bool(_OPS[op](value, threshold))


def claim_from_dict(experiment: str, d: Mapping[str, Any], source: str = "") -> Claim:
    """A :class:`Claim` from one entry of ``metrics.json``'s ``claims`` or of a recorded file.

    Raises:
        ValueError: the entry has no ``id``.
    """
    cid = d.get("id")
    if not isinstance(cid, str) or not cid:
        raise ValueError(
            f"claim of experiment {experiment!r} has no string 'id' (got {cid!r}); every claim "
            "needs one"
        )
    value, threshold = _number(d.get("value")), _number(d.get("threshold"))
    op = d.get("op") if isinstance(d.get("op"), str) else None
    holds = d.get("holds")
    if not isinstance(holds, bool):
        holds = _verdict(value, op, threshold)
    return Claim(experiment, cid, value, op, threshold, holds, str(d.get("source", source)))


def load_run(results: Path) -> tuple[dict[tuple[str, str], Claim], dict[str, str]]:
    """Claims of a results directory (``<id>/metrics.json``) and the experiments that raised.

    Returns:
        ``({(experiment, claim id): Claim}, {experiment: error message})``.

    Raises:
        FileNotFoundError: no ``*/metrics.json`` under ``results``.
    """
    files = sorted(results.glob("*/metrics.json"))
    if not files:
        raise FileNotFoundError(
            f"no <id>/metrics.json under {results}; pass the --out directory of a "
            "`noetherflow reproduce` run or a JSON file of recorded claims"
        )
    claims: dict[tuple[str, str], Claim] = {}
    crashed: dict[str, str] = {}
    for f in files:
        rec = json.loads(f.read_text(encoding="utf-8"))
        exp = str(rec.get("experiment", f.parent.name))
        if rec.get("error"):
            crashed[exp] = str(rec["error"]).splitlines()[0][:200]
        for c in rec.get("claims") or []:
            claim = claim_from_dict(exp, c)
            claims[(exp, claim.id)] = claim
    return claims, crashed


def load_recorded(path: Path) -> dict[tuple[str, str], Claim]:
    """Claims of a recorded-values JSON file (see the module docstring for its shape).

    Raises:
        ValueError: the file is not ``{experiment: {claim id: {...}}}``.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a JSON object {{experiment: {{claim id: {{value, ...}}}}}}, "
            f"got {type(data).__name__}"
        )
    claims: dict[tuple[str, str], Claim] = {}
    for exp, entries in data.items():
        if exp.startswith("_"):  # comments
            continue
        if not isinstance(entries, dict):
            raise ValueError(
                f"{path}: experiment {exp!r} maps to {type(entries).__name__}; expected an "
                "object {claim id: {value, op, threshold, holds, source}}"
            )
        for cid, entry in entries.items():
            claim = claim_from_dict(exp, {"id": cid, **entry})
            claims[(exp, cid)] = claim
    return claims


def load(path: Path) -> tuple[dict[tuple[str, str], Claim], dict[str, str]]:
    """A results directory or a recorded-values file, whichever ``path`` is."""
    if path.is_dir():
        return load_run(path)
    if path.is_file():
        return load_recorded(path), {}
    raise FileNotFoundError(f"{path} is neither a results directory nor a JSON file")


def rel_change(before: float | None, after: float | None) -> float | None:
    """``(after − before) / |before|``; ``None`` if a value is missing, not finite or 0 before.

    Equal values (both 0, both +inf) give 0.
    """
    if before is None or after is None:
        return None
    if before == after:
        return 0.0
    if not (math.isfinite(before) and math.isfinite(after)):
        return None
    if before == 0.0:
        return None
    return (after - before) / abs(before)


def compare(
    before: Mapping[tuple[str, str], Claim],
    after: Mapping[tuple[str, str], Claim],
    tol: float = 0.01,
    crashed: Mapping[str, Mapping[str, str]] | None = None,
) -> Comparison:
    """Pair the claims of two sides by ``(experiment, claim id)``.

    Args:
        before: claims of the first side.
        after: claims of the second side.
        tol: a value "moved" when ``|rel_change| > tol`` (or when it cannot be computed while
            a value is present on either side).
        crashed: experiments that raised, per side label.
    """
    rows = []
    for key in sorted(before.keys() & after.keys()):
        b, a = before[key], after[key]
        rc = rel_change(b.value, a.value)
        moved = abs(rc) > tol if rc is not None else (b.value is not None or a.value is not None)
        rows.append(
            Row(
                before=b,
                after=a,
                rel_change=rc,
                moved=moved,
                verdict_changed=b.holds is not None and a.holds is not None and b.holds != a.holds,
                rule_changed=(b.op, b.threshold) != (a.op, a.threshold)
                and None not in (b.op, a.op, b.threshold, a.threshold),
            )
        )
    only_b = [before[k] for k in sorted(before.keys() - after.keys())]
    only_a = [after[k] for k in sorted(after.keys() - before.keys())]
    return Comparison(rows, only_b, only_a, {k: dict(v) for k, v in (crashed or {}).items()})


def holding(claims: Iterable[Claim]) -> dict[str, tuple[int, int]]:
    """``{experiment: (claims holding, claims)}`` for one side."""
    out: dict[str, tuple[int, int]] = {}
    for c in claims:
        n_ok, n = out.get(c.experiment, (0, 0))
        out[c.experiment] = (n_ok + bool(c.holds), n + 1)
    return dict(sorted(out.items()))


def _fmt_value(v: float | None) -> str:
    if v is None:
        return "—"
    if not math.isfinite(v):
        return str(v)
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"


def _fmt_verdict(h: bool | None) -> str:
    return "?" if h is None else ("holds" if h else "FAILS")


def _fmt_rule(c: Claim) -> str:
    return "" if c.op is None or c.threshold is None else f"{c.op} {_fmt_value(c.threshold)}"


def markdown(cmp: Comparison, labels: tuple[str, str], only_changed: bool = False) -> str:
    """The comparison as Markdown: paired claims, one-sided claims, crashes, totals."""
    lb, la = labels
    out = [
        f"### Claims in both ({len(cmp.rows)})",
        "",
        f"| experiment | claim | rule | {lb} | {la} | change | verdict {lb} → {la} | flags |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in cmp.rows:
        if only_changed and not (r.moved or r.verdict_changed or r.rule_changed):
            continue
        flags = [f for f, on in (("moved", r.moved), ("VERDICT", r.verdict_changed)) if on]
        rule = _fmt_rule(r.after)
        if r.rule_changed:
            flags.append("rule")
            rule = f"{_fmt_rule(r.before)} → {rule}"
        change = "—" if r.rel_change is None else f"{r.rel_change:+.1%}"
        out.append(
            f"| {r.after.experiment} | `{r.after.id}` | {rule} | {_fmt_value(r.before.value)} "
            f"| {_fmt_value(r.after.value)} | {change} | {_fmt_verdict(r.before.holds)} → "
            f"{_fmt_verdict(r.after.holds)} | {' '.join(flags)} |"
        )
    for title, claims in ((f"only in {lb}", cmp.only_before), (f"only in {la}", cmp.only_after)):
        out += ["", f"### Claims {title} ({len(claims)})", ""]
        if claims:
            out += ["| experiment | claim | rule | value | verdict |", "|---|---|---|---|---|"]
            out += [
                f"| {c.experiment} | `{c.id}` | {_fmt_rule(c)} | {_fmt_value(c.value)} "
                f"| {_fmt_verdict(c.holds)} |"
                for c in claims
            ]
    for side, errs in cmp.crashed.items():
        if errs:
            out += ["", f"### Experiments that raised ({side})", ""]
            out += [f"- {exp}: {msg}" for exp, msg in sorted(errs.items())]
    out += ["", summary(cmp, labels)]
    return "\n".join(out) + "\n"


def summary(cmp: Comparison, labels: tuple[str, str]) -> str:
    """One paragraph of counts: verdict changes, moved values, claims holding per side."""
    lb, la = labels
    n_v = sum(r.verdict_changed for r in cmp.rows)
    n_m = sum(r.moved for r in cmp.rows)
    hb = holding([r.before for r in cmp.rows] + cmp.only_before)
    ha = holding([r.after for r in cmp.rows] + cmp.only_after)
    per = " · ".join(
        f"{e} {hb.get(e, (0, 0))[0]}/{hb.get(e, (0, 0))[1]} → {ha.get(e, (0, 0))[0]}/"
        f"{ha.get(e, (0, 0))[1]}"
        for e in sorted(hb.keys() | ha.keys())
    )
    tot_b = [sum(v[i] for v in hb.values()) for i in (0, 1)]
    tot_a = [sum(v[i] for v in ha.values()) for i in (0, 1)]
    return (
        f"**Summary.** {len(cmp.rows)} claims in both: {n_v} verdict(s) changed, {n_m} "
        f"value(s) moved; {len(cmp.only_before)} only in {lb}, {len(cmp.only_after)} only in "
        f"{la}. Claims holding ({lb} → {la}): {per}; total {tot_b[0]}/{tot_b[1]} → "
        f"{tot_a[0]}/{tot_a[1]}."
    )


def to_json(cmp: Comparison) -> dict[str, Any]:
    """The comparison as plain JSON-able data."""
    return {
        "rows": [asdict(r) for r in cmp.rows],
        "only_before": [asdict(c) for c in cmp.only_before],
        "only_after": [asdict(c) for c in cmp.only_after],
        "crashed": cmp.crashed,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (0, or 2 on a usage error)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("before", type=Path, help="results directory or recorded-values JSON")
    p.add_argument("after", type=Path, help="results directory or recorded-values JSON")
    p.add_argument("--labels", nargs=2, default=("before", "after"), metavar=("B", "A"))
    p.add_argument("--moved", type=float, default=0.01, help="relative change flagged (0.01)")
    p.add_argument("--only-changed", action="store_true", help="print moved/changed rows only")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    if not (args.moved >= 0 and math.isfinite(args.moved)):
        p.error(f"--moved must be a finite fraction ≥ 0 (got {args.moved}); e.g. --moved 0.01")
    try:
        before, crashed_b = load(args.before)
        after, crashed_a = load(args.after)
    except (OSError, ValueError) as exc:
        print(f"compare_verdicts: {exc}", file=sys.stderr)
        return 2
    labels = (args.labels[0], args.labels[1])
    crashed = {labels[0]: crashed_b, labels[1]: crashed_a}
    cmp = compare(before, after, tol=args.moved, crashed=crashed)
    sys.stdout.write(markdown(cmp, labels, only_changed=args.only_changed))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(cmp), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
