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
arrays of :attr:`noetherflow.NoetherMonitor.history`; a torn last line (a crash while
writing) is skipped with a warning naming the file and line.

History keys. Every key is ASCII and typable: ``<quantity>/<symmetry key>`` where the
symmetry key is :func:`symmetry_key` of the symmetry's name (``rescaling:fc1→fc2`` →
``rescaling.fc1_to_fc2``); the pretty name is kept for display only (plots, ``monitor.json``).

Flat records. :func:`flat_record` turns a record into ``key → float`` for scalar loggers
(TensorBoard scalars, Lightning's logger, :meth:`noetherflow.NoetherMonitor.on_record`):
scalars as they are, vectors as ``<key>/mean`` and ``<key>/max_abs`` (distances:
``<key>/max``), plus ``summary/max_abs_flow``, ``summary/max_distance`` and
``summary/at_infinity`` over all symmetries. NaN entries (not measured at this record) are
left out.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    "Outputs",
    "TensorBoardSink",
    "flat_record",
    "load_history",
    "open_tensorboard",
    "stack_rows",
    "symmetry_key",
    "symmetry_keys",
    "write_meta",
]

CSV_NAME = "history.csv"
JSONL_NAME = "history.jsonl"
META_NAME = "monitor.json"
FORMATS = ("csv", "jsonl")
_INDEXED = re.compile(r"^(?P<key>.*)\[(?P<idx>\d+(?:,\d+)*)\]$")

Schema = Mapping[str, tuple[int, ...]]
Row = Mapping[str, np.ndarray]


# -- keys ---------------------------------------------------------------------------------
_WORDS = {"→": "_to_", "↔": "_and_", "←": "_from_", ":": ".", "/": ".", "×": "x"}
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.\-]+")


def symmetry_key(name: str) -> str:
    """The ASCII key of a symmetry name in history keys, CSV columns and logger tags.

    Characters ``A-Z a-z 0-9 _ . -`` are kept; ``→`` becomes ``_to_``, ``↔`` ``_and_``,
    ``:`` and ``/`` a dot; accents are stripped; any other run of characters becomes one
    ``_``. Stable (a function of the name alone) and idempotent on ASCII keys.

    >>> symmetry_key("rescaling:0→2"), symmetry_key("layer1↔layer2"), symmetry_key("rescaling0")
    ('rescaling.0_to_2', 'layer1_and_layer2', 'rescaling0')
    """
    out = name
    for k, v in _WORDS.items():
        out = out.replace(k, v)
    # accents go (their combining marks), any other non-ASCII character (e.g. the "·" of
    # "rotation:q·k") is one of "any other characters": dropping it would glue two names
    out = "".join(
        c if c.isascii() else "_"
        for c in unicodedata.normalize("NFKD", out)
        if not unicodedata.combining(c)
    )
    out = _NOT_KEY.sub("_", out).strip("_")
    return out or "symmetry"


def symmetry_keys(names: Iterable[str]) -> dict[str, str]:
    """``name → key`` for a set's names; keys made unique by ``_2``, ``_3`` … in set order."""
    keys: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        key = base = symmetry_key(name)
        k = 2
        while key in used:
            key, k = f"{base}_{k}", k + 1
        used.add(key)
        keys[name] = key
    return keys


def flat_record(row: Row) -> dict[str, float]:
    """A record as ``key → float`` for scalar loggers (see the module docstring)."""
    out: dict[str, float] = {}
    flows: list[float] = []
    dists: list[float] = []
    at_inf: list[float] = []
    for key, value in row.items():
        v = np.asarray(value, dtype=np.float64)
        kind = key.split("/", 1)[0]
        if kind.endswith("_matrix"):
            continue  # the Frobenius norm is the scalar entry of the same symmetry
        if v.ndim == 0:
            x = float(v)
            if not math.isnan(x):
                out[key] = x
        else:
            fin = v[~np.isnan(v)]
            if fin.size == 0:
                continue
            if kind == "distance":
                out[f"{key}/max"] = float(fin.max())
            else:
                out[f"{key}/mean"] = float(fin.mean())
                out[f"{key}/max_abs"] = float(np.abs(fin).max())
        flat = v[~np.isnan(v)].reshape(-1)
        if kind == "flow":
            flows += np.abs(flat).tolist()
        elif kind == "distance":
            dists += flat.tolist()
        elif kind == "at_infinity":
            at_inf += flat.tolist()
    if flows:
        out["summary/max_abs_flow"] = max(flows)
    if dists:
        out["summary/max_distance"] = max(dists)
    if at_inf:
        out["summary/at_infinity"] = float(sum(at_inf))
    return out


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
        """Append ``row`` as one CSV line (vector entries in their columns)."""
        cells = []
        for key, shape in self.schema.items():
            v = row[key]
            if shape == ():
                cells.append(_fmt(v))
            else:
                cells += [_fmt(x) for x in np.asarray(v).reshape(-1)]
        _write_line(self.path, _csv_line(cells))

    def close(self) -> None:
        """Nothing to release: every line is written and closed at once."""


class JsonlSink:
    """``history.jsonl``: emptied at creation, one JSON object per row."""

    def __init__(self, path: Path, schema: Schema) -> None:
        self.path, self.schema = path, dict(schema)
        _write_line(path, "", mode="w")

    def write(self, row: Row) -> None:
        """Append ``row`` as one JSON line."""
        obj = {k: to_jsonable(row[k].tolist()) for k in self.schema}
        _write_line(self.path, json.dumps(obj, allow_nan=False) + "\n")

    def close(self) -> None:
        """Nothing to release: every line is written and closed at once."""


class TensorBoardSink:
    """The finite entries of :func:`flat_record` as scalars; finite vectors as histograms.

    Tags are the ASCII history keys: ``charge/<sym>``, ``flow/<sym>``, ``distance/<sym>``
    (vectors: ``/mean``, ``/max_abs``, ``/max``), ``summary/*``, ``loss``, ``lr`` ….
    """

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.path = getattr(writer, "log_dir", None) or getattr(writer, "logdir", None)

    def write(self, row: Row) -> None:
        """Log ``row``'s finite entries at its step."""
        step = int(row["step"])
        for k, x in flat_record(row).items():
            if k != "step" and math.isfinite(x):
                self.writer.add_scalar(k, x, step)
        for k, v in row.items():
            if v.ndim > 0 and v.size > 0 and np.isfinite(v).all():
                self.writer.add_histogram(k, v, step)
        if hasattr(self.writer, "flush"):
            self.writer.flush()

    def close(self) -> None:
        """Close the writer."""
        if hasattr(self.writer, "close"):
            self.writer.close()


class Outputs:
    """The sinks and ``on_record`` callbacks of one monitor.

    An ``OSError`` (disk full, a network file system or logging service gone) stops that one
    destination with one warning; training and the other destinations go on (the monitor's
    in-memory history keeps every row).
    """

    def __init__(self) -> None:
        self.sinks: list[Any] = []
        self.callbacks: list[Callable[[dict[str, float]], Any]] = []

    def write(self, row: Row, step: int) -> None:
        """Send ``row`` to every sink, its :func:`flat_record` to every callback."""
        for sink in list(self.sinks):
            try:
                sink.write(row)
            except OSError as e:
                self.sinks.remove(sink)
                _io_failed(f"writing {sink.path or type(sink).__name__}", e, step)
        if self.callbacks:
            flat = flat_record(row)
            for cb in list(self.callbacks):
                try:
                    cb(dict(flat))
                except OSError as e:
                    self.callbacks.remove(cb)
                    _io_failed(f"the on_record callback {cb!r}", e, step)

    def close(self) -> None:
        """Close every sink (TensorBoard flushes)."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def _io_failed(what: str, err: OSError, step: int) -> None:
    warnings.warn(
        f"NoetherMonitor: {what} failed at step {step} ({err}); it is stopped for the rest of "
        "the run and training goes on. mon.history keeps every record in memory; the files "
        "hold the records written before the failure.",
        RuntimeWarning,
        stacklevel=5,
    )


def open_tensorboard(tensorboard: Any, log_dir: Path | None) -> Any:
    """The TensorBoard writer asked for.

    ``tensorboard`` is ``None`` (a writer when installed and ``log_dir`` is set), ``False``
    (none), ``True`` (required) or a writer-like object (returned as is).
    """
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
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"load_history: path is a {type(path).__name__} ({path!r:.40}); expected a str or "
            "Path of a history.jsonl/history.csv or of the monitor's log_dir."
        )
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


def _torn(p: Path, lineno: int, why: str) -> None:
    warnings.warn(
        f"{p}, line {lineno}: the last line is incomplete ({why}), most likely cut by a crash "
        "while writing; it is skipped.",
        RuntimeWarning,
        stacklevel=4,
    )


def _load_jsonl(p: Path) -> dict[str, np.ndarray]:
    rows: list[dict[str, np.ndarray]] = []
    schema: dict[str, tuple[int, ...]] = {}
    with open(p, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            row = {k: np.asarray(_decode(v), dtype=np.float64) for k, v in obj.items()}
            if schema and {k: v.shape for k, v in row.items()} != schema:
                raise ValueError("its keys or shapes differ from the first record's")
        except ValueError as e:
            if i == last:
                _torn(p, i + 1, str(e))
                break
            raise ValueError(
                f"{p}, line {i + 1}: not a monitor record ({e}); the file is damaged before its "
                "last line. Remove or repair that line (history.csv in the same directory holds "
                "the same records)."
            ) from None
        if not schema:
            schema = {k: v.shape for k, v in row.items()}
        rows.append(row)
    if not rows:
        schema = _meta_schema(p.parent)
    return stack_rows(rows, schema)


def _load_csv(p: Path) -> dict[str, np.ndarray]:
    with open(p, encoding="utf-8", newline="") as fh:
        text = fh.read()
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        raise ValueError(f"{p}: empty file; expected a CSV header (a monitor history.csv).")
    header, body = lines[0], lines[1:]
    data: list[list[float]] = []
    nonempty = [j for j, r in enumerate(body) if r]
    for j in nonempty:
        r = body[j]
        if j == nonempty[-1] and not text.endswith("\n"):
            _torn(p, j + 2, "no end of line")  # parseable or not, its last cell may be cut
            break
        try:
            if len(r) != len(header):
                raise ValueError(f"{len(r)} cells for {len(header)} columns")
            data.append([float(c) for c in r])
        except ValueError as e:
            if j == nonempty[-1]:
                _torn(p, j + 2, str(e))
                break
            raise ValueError(
                f"{p}, line {j + 2}: not a monitor record ({e}); the file is damaged before its "
                "last line. Remove or repair that line."
            ) from None
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
