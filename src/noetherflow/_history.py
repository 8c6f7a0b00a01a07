"""The monitor's history: its schema, the sinks that write it, and reading it back.

A *record* is a dict ``key → numpy array`` whose keys and shapes are fixed for the whole run
(the *schema*, ``key → shape``). Sinks receive each record:

* :class:`CsvSink` — ``history.csv``: one column per scalar, ``key[i,j]`` for the components of
  vector/matrix entries; values written with ``repr`` (exact round trip, ``nan``/``inf``);
* :class:`JsonlSink` — ``history.jsonl``: one JSON object per record (non-finite floats as
  strings, see :mod:`noetherflow._io`);
* :class:`TensorBoardSink` — scalars as scalars, vectors as histograms.

Each line is appended with one ``write`` and flushed, so the files are complete after every
record. :func:`load_history` reads either file (or a log directory) back to the dict of
arrays of :attr:`noetherflow.NoetherMonitor.history`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow._io import atomic_write_json, from_jsonable_float, to_jsonable

__all__ = [
    "CSV_NAME",
    "JSONL_NAME",
    "META_NAME",
    "CsvSink",
    "JsonlSink",
    "TensorBoardSink",
    "load_history",
    "open_tensorboard",
    "stack_rows",
    "write_meta",
]

CSV_NAME = "history.csv"
JSONL_NAME = "history.jsonl"
META_NAME = "monitor.json"
FORMATS = ("csv", "jsonl")
_INDEXED = re.compile(r"^(?P<key>.*)\[(?P<idx>\d+(?:,\d+)*)\]$")

Schema = Mapping[str, tuple[int, ...]]
Row = Mapping[str, np.ndarray]


# -- sinks --------------------------------------------------------------------------------
def write_meta(log_dir: Path, meta: Mapping[str, Any]) -> None:
    """Create ``log_dir`` and write ``monitor.json`` (atomically)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(log_dir / META_NAME, dict(meta))


class CsvSink:
    """``history.csv``: the header at creation (replacing an existing file), one line per row."""

    def __init__(self, path: Path, schema: Schema) -> None:
        self.path, self.schema = path, dict(schema)
        _write_line(path, _csv_line(csv_columns(schema)), mode="w")

    def write(self, row: Row) -> None:
        cells = []
        for key, shape in self.schema.items():
            v = row[key]
            if shape == ():
                cells.append(_fmt(v))
            else:
                cells += [_fmt(x) for x in np.asarray(v).reshape(-1)]
        _write_line(self.path, _csv_line(cells))

    def close(self) -> None:
        pass


class JsonlSink:
    """``history.jsonl``: emptied at creation, one JSON object per row."""

    def __init__(self, path: Path, schema: Schema) -> None:
        self.path, self.schema = path, dict(schema)
        _write_line(path, "", mode="w")

    def write(self, row: Row) -> None:
        obj = {k: to_jsonable(row[k].tolist()) for k in self.schema}
        _write_line(self.path, json.dumps(obj, allow_nan=False) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars (finite ones) as TensorBoard scalars, finite vectors as histograms."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def write(self, row: Row) -> None:
        step = int(row["step"])
        for k, v in row.items():
            if k == "step":
                continue
            if v.ndim == 0:
                if math.isfinite(float(v)):
                    self.writer.add_scalar(k, float(v), step)
            elif np.isfinite(v).all() and v.size > 0:
                self.writer.add_histogram(k, v, step)

    def close(self) -> None:
        if hasattr(self.writer, "close"):
            self.writer.close()


def open_tensorboard(tensorboard: Any, log_dir: Path | None) -> Any:
    """The TensorBoard writer asked for: ``None`` (when installed and ``log_dir`` is set),
    ``False`` (none), ``True`` (required) or a writer-like object (returned as is)."""
    if tensorboard is False or (tensorboard is None and log_dir is None):
        return None
    if tensorboard is not None and tensorboard is not True:
        return tensorboard  # a writer-like object
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if tensorboard is True:
            raise ImportError(
                "tensorboard=True needs the tensorboard package: pip install tensorboard."
            ) from None
        return None
    return SummaryWriter(log_dir=str(log_dir) if log_dir else None)


# -- formatting ---------------------------------------------------------------------------
def _fmt(x: Any) -> str:
    v = float(x)
    if isinstance(x, np.integer) or (isinstance(x, np.ndarray) and x.dtype.kind == "i"):
        return str(int(x))
    return repr(v)  # repr round-trips exactly; nan/inf parse back with float()


def csv_columns(schema: Schema) -> list[str]:
    """The CSV header of ``schema``: ``key`` for scalars, ``key[i,j]`` for components."""
    cols = []
    for key, shape in schema.items():
        if shape == ():
            cols.append(key)
        else:
            cols += [f"{key}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]
    return cols


def _csv_line(cells: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


def _write_line(path: Path, text: str, *, mode: str = "a") -> None:
    """Append ``text`` with one ``write`` call on an O_APPEND handle, then flush to disk."""
    with open(path, mode, encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def stack_rows(rows: Sequence[Row], schema: Schema) -> dict[str, np.ndarray]:
    """Rows → ``key → [records, *shape]`` (``step`` int64, the rest float64)."""
    out: dict[str, np.ndarray] = {}
    for key, shape in schema.items():
        if rows:
            out[key] = np.stack([np.asarray(r[key]) for r in rows])
        else:
            out[key] = np.empty((0, *shape))
        out[key] = out[key].astype(np.int64 if key == "step" else np.float64)
    return out


# -- reading back -------------------------------------------------------------------------
def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return from_jsonable_float(obj)


def load_history(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a monitor's ``history.jsonl`` or ``history.csv`` (or a log directory) back.

    Returns the same dict of arrays as :attr:`NoetherMonitor.history`.
    """
    p = Path(path)
    if p.is_dir():
        cand = [p / JSONL_NAME, p / CSV_NAME]
        found = [c for c in cand if c.exists()]
        if not found:
            raise FileNotFoundError(
                f"No {JSONL_NAME} or {CSV_NAME} in {p}; expected a monitor log_dir."
            )
        p = found[0]
    if p.suffix == ".jsonl":
        return _load_jsonl(p)
    if p.suffix == ".csv":
        return _load_csv(p)
    raise ValueError(f"{p}: expected a .jsonl or .csv history file or a log directory.")


def _load_jsonl(p: Path) -> dict[str, np.ndarray]:
    rows: list[dict[str, np.ndarray]] = []
    schema: dict[str, tuple[int, ...]] = {}
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            obj = json.loads(line)
            row = {k: np.asarray(_decode(v), dtype=np.float64) for k, v in obj.items()}
            if not schema:
                schema = {k: v.shape for k, v in row.items()}
            rows.append(row)
    if not rows:
        schema = _meta_schema(p.parent)
    return stack_rows(rows, schema)


def _load_csv(p: Path) -> dict[str, np.ndarray]:
    with open(p, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        data = [[float(c) for c in r] for r in reader if r]
    arr = np.asarray(data, dtype=np.float64).reshape(len(data), len(header))
    cols: dict[str, list[tuple[tuple[int, ...], int]]] = {}
    for j, name in enumerate(header):
        m = _INDEXED.match(name)
        if m:
            idx = tuple(int(i) for i in m["idx"].split(","))
            cols.setdefault(m["key"], []).append((idx, j))
        else:
            cols.setdefault(name, []).append(((), j))
    out: dict[str, np.ndarray] = {}
    for key, entries in cols.items():
        if entries[0][0] == ():
            out[key] = arr[:, entries[0][1]]
        else:
            shape = tuple(max(idx[d] for idx, _ in entries) + 1 for d in range(len(entries[0][0])))
            v = np.full((len(data), *shape), np.nan)
            for idx, j in entries:
                where: tuple[Any, ...] = (slice(None), *idx)
                v[where] = arr[:, j]
            out[key] = v
        out[key] = out[key].astype(np.int64 if key == "step" else np.float64)
    return out


def _meta_schema(d: Path) -> dict[str, tuple[int, ...]]:
    meta = d / META_NAME
    if not meta.exists():
        return {}
    sch = json.loads(meta.read_text(encoding="utf-8")).get("schema", {})
    return {k: tuple(v) for k, v in sch.items()}
