"""Atomic file writes and strict-JSON conversion.

Every file the harness writes goes through :func:`atomic_write_bytes`: the data is written
to a temporary file in the *same directory* (same file system, so the rename is atomic),
flushed and fsynced, then moved over the target with :func:`os.replace`. A reader never
sees a half-written file and a crash never leaves a temporary file behind.

:func:`to_jsonable` turns numpy / torch values, dataclasses, enums and paths into plain JSON
types. Non-finite floats are not valid JSON, so NaN becomes ``null`` and ±inf the strings
``"inf"`` / ``"-inf"``; :func:`atomic_write_json` then serialises with ``allow_nan=False`` so
invalid JSON can never be produced.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "from_jsonable_float",
    "to_jsonable",
]


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_current_umask()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + os.replace).

    The parent directory is created if needed. Returns the target path.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, _FILE_MODE)  # mkstemp creates 0600; use the usual umask mode
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """Convert ``obj`` with :func:`to_jsonable` and write it as strict JSON, atomically."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)
    return atomic_write_text(path, text + "\n")


def _float(x: float) -> float | str | None:
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def from_jsonable_float(x: Any) -> float:
    """Inverse of the float encoding of :func:`to_jsonable` (``None`` → NaN, "inf" → inf)."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return float(x)
    return float(x)


def to_jsonable(obj: Any) -> Any:
    """Recursively convert ``obj`` into values :func:`json.dumps` accepts with allow_nan=False.

    numpy arrays and torch tensors become (nested) lists, numpy / torch scalars Python
    scalars, dataclasses dicts, enums their value, paths strings, tuples and sets lists,
    mapping keys strings. NaN → ``None``; +inf → ``"inf"``; -inf → ``"-inf"``.
    Anything else is converted with ``repr`` rather than failing.
    """
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return _float(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=repr) if isinstance(obj, set | frozenset) else obj
        return [to_jsonable(v) for v in items]
    # numpy and torch without importing them eagerly
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        mod = type(obj).__module__
        if mod.startswith("torch"):
            obj = obj.detach().cpu()
            tolist = obj.tolist
        if mod.startswith(("numpy", "torch")):
            return to_jsonable(tolist())
    if isinstance(obj, complex):
        return {"real": _float(obj.real), "imag": _float(obj.imag)}
    return repr(obj)
