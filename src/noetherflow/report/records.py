"""Reading a results directory for the report, safely, and the accessors the renderers share.

metrics.json is data, never markup or a path to follow blindly: :func:`load_records` reads only
``<dir>/*/metrics.json`` files that resolve inside ``<dir>``, and :func:`figure_path` gives a
figure's file only if it is a ``.png`` inside the directory (no absolute path, no ``..``, no
escape through the ``experiment`` field or a symbolic link). The accessors (``claims``,
``setup``, ``error``, ...) tolerate a malformed record, so a broken file cannot crash the report.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from noetherflow.experiments import METRICS_FILE, Status
from noetherflow.experiments._claims import KINDS

__all__ = [
    "ENV_KEYS",
    "FAILS",
    "KIND_LABELS",
    "NO_WHY",
    "HOLDS",
    "INTRO",
    "QUICK_BANNER",
    "QUICK_DETAIL",
    "SAFE_NAME",
    "ReportInputError",
    "check_figure",
    "claim_line",
    "claims_of",
    "counts",
    "error_of",
    "failing",
    "figure_path",
    "figures_of",
    "find_claim",
    "fmt_value",
    "environment",
    "inside",
    "kind_of",
    "kind_totals",
    "load_records",
    "meta",
    "natural_key",
    "order_records",
    "quick_ids",
    "seconds",
    "setup_of",
    "status_of",
    "totals",
]

HOLDS = "✓"
FAILS = "✗"
QUICK_BANNER = "Quick mode: sizes are reduced; not the paper's protocol."
QUICK_DETAIL = (
    "The claims below were measured at shrunk sizes (each experiment's Config.quick()); run "
    "`noetherflow reproduce all` without --quick for the paper's sizes."
)
INTRO = (
    'Ziyin et al. (2024), "Parameter Symmetry and Noise Equilibrium of Stochastic Gradient '
    "Descent\". Experiments appear in the paper's order; each states the paper's claim, every "
    "deviation from the paper's setup, the measured claims, the figures and the history of the "
    "settings tried."
)
#: How the report names each claim kind (the keys are ``Kind`` values).
KIND_LABELS = {
    "paper": "the paper's results",
    "printed": "formulas as printed (a failure confirms a correction)",
    "beyond": "ours, beyond the paper",
}
#: Shown beside a failing claim whose experiment gave no reason (a contract violation).
NO_WHY = "no reason recorded (every failing claim should state its measured cause)"
#: The environment keys the report shows, in order, with their labels.
ENV_KEYS = (
    ("noetherflow", "noetherflow"),
    ("torch", "torch"),
    ("numpy", "numpy"),
    ("python", "Python"),
    ("platform", "platform"),
    ("machine", "machine"),
    ("cpus", "CPUs"),
    ("jobs", "jobs"),
    ("torch_threads", "torch threads"),
)
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class ReportInputError(ValueError):
    """A results directory or metrics.json that cannot be read; the message names the file."""


def natural_key(s: str) -> list[object]:
    """Sort key that orders digits by value (fig2 before fig10)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# --------------------------------------------------------------------------------------
# Reading records (only inside the results directory)
# --------------------------------------------------------------------------------------


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (symbolic links resolved) lies inside ``root``."""
    return path.resolve().is_relative_to(root.resolve())


def load_records(out_dir: str | Path, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Read ``out_dir/<id>/metrics.json`` for ``ids`` (default: every experiment found).

    Raises :class:`FileNotFoundError` when there is nothing to read and
    :class:`ReportInputError` for a file that is not a metrics object, or lies outside
    ``out_dir`` (an id with a path separator, a symbolic link leading out).
    """
    root = Path(out_dir)
    if not root.is_dir():
        raise FileNotFoundError(
            f"results directory {str(root)!r} does not exist or is not a directory; "
            f"run `noetherflow reproduce all --out {root}` first"
        )
    if ids is None:
        paths = sorted(root.glob(f"*/{METRICS_FILE}"), key=lambda p: natural_key(p.parent.name))
    else:
        bad = [i for i in ids if not SAFE_NAME.match(i)]
        if bad:
            raise ReportInputError(f"experiment ids {bad} are not plain names (e.g. fig2)")
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
    records = []
    for p in paths:
        if not inside(p, root):
            raise ReportInputError(
                f"{p} resolves outside the results directory {str(root)!r} (a symbolic link?); "
                "the report reads only files inside it: copy the run there instead"
            )
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportInputError(f"cannot read {p}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ReportInputError(
                f"{p} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                f"re-run `noetherflow reproduce {p.parent.name} --out {root}`"
            ) from None
        except RecursionError:
            raise ReportInputError(
                f"{p} is nested too deeply to read (deeper than Python's recursion limit); "
                f"expected the flat object the harness writes: re-run `noetherflow reproduce "
                f"{p.parent.name} --out {root}`"
            ) from None
        if not isinstance(data, dict):
            raise ReportInputError(
                f"{p} holds a JSON {type(data).__name__}; expected the object the harness writes"
            )
        check_claims(data, p)
        records.append(data)
    return records


def check_claims(data: dict[str, Any], path: Path) -> None:
    """Refuse a claim whose ``holds`` is not a JSON boolean (``"false"`` would read as true).

    Every reader (the summary, the failing list, ``--strict``) then sees the same verdict.
    """
    for c in claims_of(data):
        if "holds" in c and not isinstance(c["holds"], bool):
            v = c["holds"]
            raise ReportInputError(
                f"{path}: claim {c.get('id')!r} has holds={json.dumps(v)} (a JSON "
                f"{type(v).__name__}); expected true or false, as the harness writes. Fix the "
                f"file or re-run `noetherflow reproduce {path.parent.name}`"
            )


def order_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's order: by ``paper_order``; records without one last, then by id."""

    def key(r: dict[str, Any]) -> tuple[bool, float, list[object]]:
        order = r.get("paper_order")
        number = math.inf
        if isinstance(order, int | float) and not isinstance(order, bool):
            number = float(order)
        ok = math.isfinite(number)
        return (not ok, number if ok else math.inf, natural_key(str(r.get("experiment", ""))))

    return sorted(records, key=key)


def check_figure(experiment: Any, figure: Any) -> tuple[str, str]:
    """The checks that need no directory: a plain experiment name, a relative .png path."""
    exp, fig = str(experiment), str(figure)
    if not SAFE_NAME.match(exp) or exp in {".", ".."}:
        raise ReportInputError(f"experiment {exp!r} is not a plain name; figure not read")
    parts = PurePosixPath(fig.replace("\\", "/")).parts
    if (
        not fig
        or PurePosixPath(fig).is_absolute()
        or PureWindowsPath(fig).is_absolute()
        or PureWindowsPath(fig).drive
        or ".." in parts
    ):
        raise ReportInputError(
            f"figure path {fig!r} is absolute or contains '..'; only files inside the results "
            "directory are read"
        )
    if not fig.lower().endswith(".png"):
        raise ReportInputError(f"figure {fig!r} is not a .png file; figure not read")
    return exp, fig


def figure_path(root: str | Path, experiment: Any, figure: Any) -> Path:
    """The file ``root/<experiment>/<figure>``, or :class:`ReportInputError` if it is not safe.

    Safe: ``experiment`` a plain name, ``figure`` a relative path without ``..`` ending in
    ``.png``, and the result (symbolic links resolved) inside ``root``.
    """
    exp, fig = check_figure(experiment, figure)
    path = Path(root) / exp / fig
    if not inside(path, Path(root)):
        raise ReportInputError(
            f"figure {exp}/{fig} resolves outside the results directory; figure not read"
        )
    return path


# --------------------------------------------------------------------------------------
# Values and small helpers
# --------------------------------------------------------------------------------------


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


def seconds(v: Any) -> float:
    """``v`` as a float (elapsed seconds), NaN when it is not a number."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return math.nan
    try:
        return float(v)
    except ValueError:
        return math.nan


def claims_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's claims that are dicts (none for a malformed record)."""
    claims = rec.get("claims")
    return [c for c in claims if isinstance(c, dict)] if isinstance(claims, list) else []


def setup_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's setup rows that are dicts (none for a malformed record)."""
    rows = rec.get("setup")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def figures_of(rec: dict[str, Any]) -> list[Any]:
    """The record's figure paths (none for a malformed record)."""
    figs = rec.get("figures")
    return list(figs) if isinstance(figs, list) else []


def error_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The record's error as a dict, or None."""
    err = rec.get("error")
    if not err:
        return None
    return err if isinstance(err, dict) else {"message": str(err)}


def counts(rec: dict[str, Any]) -> tuple[int, int]:
    """``(held, total)`` claims of one record."""
    claims = claims_of(rec)
    return sum(c.get("holds") is True for c in claims), len(claims)


def kind_of(claim: dict[str, Any]) -> str:
    """A claim's kind; a record written before kinds existed (or malformed) counts as paper."""
    kind = claim.get("kind")
    return kind if isinstance(kind, str) and kind in KINDS else "paper"


def kind_totals(records: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{kind: (held, total)}`` over every claim of ``records``, every kind present."""
    out = {k: (0, 0) for k in KINDS}
    for r in records:
        for c in claims_of(r):
            held, total = out[kind_of(c)]
            out[kind_of(c)] = (held + (c.get("holds") is True), total + 1)
    return out


def environment(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(label, value)`` rows: the environment, the seed, the wall and CPU time of a run.

    An entry with several values over the run is shown with all of them, marked "mixed", so a
    mixed-version run does not look uniform; times are summed over the experiments.
    """
    rows: list[tuple[str, str]] = []
    envs: list[dict[str, Any]] = [
        e for e in (r.get("environment") for r in records) if isinstance(e, dict)
    ]
    for key, label in ENV_KEYS:
        values = sorted({str(e[key]) for e in envs if e.get(key) is not None})
        if values:
            rows.append((label, values[0] if len(values) == 1 else "mixed: " + ", ".join(values)))
    seeds = sorted({str(r.get("seed")) for r in records if r.get("seed") is not None})
    rows.append(("seed", ", ".join(seeds) or "—"))
    wall = sum(v for v in (seconds(r.get("elapsed_s")) for r in records) if math.isfinite(v))
    rows.append(("wall time (sum over experiments)", f"{wall:.1f} s"))
    cpu = [seconds(r.get("cpu_s")) for r in records]
    if any(math.isfinite(v) for v in cpu):
        total = sum(v for v in cpu if math.isfinite(v))
        rows.append(("CPU time (sum over experiments)", f"{total:.1f} s ({total / 60:.1f} min)"))
    return rows


def status_of(rec: dict[str, Any]) -> str:
    """``"ok"``, ``"claims failing"`` or ``"error"``."""
    if rec.get("status") == Status.ERROR.value or error_of(rec):
        return "error"
    held, total = counts(rec)
    return "ok" if held == total else "claims failing"


def totals(records: Sequence[dict[str, Any]]) -> tuple[int, int, int]:
    """``(held, total, errors)`` over ``records``."""
    held = sum(counts(r)[0] for r in records)
    total = sum(counts(r)[1] for r in records)
    errors = sum(status_of(r) == "error" for r in records)
    return held, total, errors


def meta(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Generation time, the seeds and the quick flags of the run, as text."""
    seeds = sorted({str(r.get("seed")) for r in records if r.get("seed") is not None})
    quick = sorted({str(bool(r.get("quick"))) for r in records})
    return {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "seed": ", ".join(seeds) or "—",
        "quick": ", ".join(quick) or "—",
    }


def quick_ids(records: Sequence[dict[str, Any]]) -> list[str]:
    """The experiments that ran with ``--quick``."""
    return [str(r.get("experiment")) for r in records if r.get("quick") is True]


def failing(records: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(experiment, claim)`` for every claim that does not hold."""
    return [
        (str(r.get("experiment")), c)
        for r in records
        for c in claims_of(r)
        if c.get("holds") is not True  # as counts(): only a JSON true holds
    ]


def find_claim(
    records: Sequence[dict[str, Any]], experiment: str, claim: str
) -> tuple[bool, dict[str, Any] | None]:
    """(experiment present in the run, the claim or None)."""
    for r in records:
        if r.get("experiment") == experiment:
            return True, next((c for c in claims_of(r) if c.get("id") == claim), None)
    return False, None


def claim_line(c: dict[str, Any]) -> str:
    """``"✗ 0.3 < 0.1"``: mark, value, op and threshold of a claim."""
    mark = HOLDS if c.get("holds") else FAILS
    return f"{mark} {fmt_value(c.get('value'))} {c.get('op')} {fmt_value(c.get('threshold'))}"
