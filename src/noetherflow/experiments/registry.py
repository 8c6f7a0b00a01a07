"""Experiment registry: id → import target (``"pkg.module"`` or ``"pkg.module:attr"``).

Every public module of :mod:`noetherflow.experiments` (name not starting with ``_``, other
than ``registry`` and ``corrections``) is an experiment whose id is the module name with
``_`` written ``-``: adding ``fig2.py`` is enough, no registration needed. :func:`register`
adds experiments that live elsewhere (plugins, tests). Modules are imported lazily, only when
an experiment is run or described.
"""

from __future__ import annotations

import pkgutil
import re
from collections.abc import Iterable

from noetherflow.experiments._base import ExperimentModule, describe_target, load_target

__all__ = [
    "ALL",
    "UnknownExperimentError",
    "describe",
    "experiment_ids",
    "load",
    "register",
    "resolve_ids",
    "target",
    "unregister",
]

ALL = "all"
_PACKAGE = "noetherflow.experiments"
_NOT_EXPERIMENTS = frozenset({"registry", "corrections"})
_EXTRA: dict[str, str] = {}
_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


class UnknownExperimentError(LookupError):
    """An experiment id that is not registered; the message lists the valid ids."""


def _natural_key(s: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _discovered() -> dict[str, str]:
    import noetherflow.experiments as pkg

    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name in _NOT_EXPERIMENTS:
            continue
        found[info.name.replace("_", "-")] = f"{_PACKAGE}.{info.name}"
    return found


def _all() -> dict[str, str]:
    return {**_discovered(), **_EXTRA}


def register(exp_id: str, target_path: str) -> None:
    """Register experiment ``exp_id`` implemented at ``target_path`` ("mod" or "mod:attr")."""
    if not _ID_RE.match(exp_id) or exp_id == ALL:
        raise ValueError(
            f"invalid experiment id {exp_id!r}; expected letters, digits, '_' or '-', "
            f"starting with a letter, and not {ALL!r}"
        )
    _EXTRA[exp_id] = target_path


def unregister(exp_id: str) -> None:
    """Remove an experiment added with :func:`register` (no-op if absent)."""
    _EXTRA.pop(exp_id, None)


def experiment_ids() -> list[str]:
    """All experiment ids, naturally sorted (fig1, fig2, …, fig10)."""
    return sorted(_all(), key=_natural_key)


def target(exp_id: str) -> str:
    """Import target of ``exp_id``; a helpful error lists the valid ids."""
    table = _all()
    if exp_id not in table:
        valid = ", ".join(sorted(table, key=_natural_key)) or "(none)"
        raise UnknownExperimentError(
            f"unknown experiment id {exp_id!r}; valid ids: {valid}, or {ALL!r} "
            f"(run `noetherflow list` to see them with descriptions)"
        )
    return table[exp_id]


def resolve_ids(ids: Iterable[str]) -> list[str]:
    """Expand ``"all"``, validate, de-duplicate (order kept)."""
    out: list[str] = []
    for i in ids:
        expanded = experiment_ids() if i == ALL else [i]
        for e in expanded:
            target(e)  # validates
            if e not in out:
                out.append(e)
    return out


def load(exp_id: str) -> ExperimentModule:
    """Import and return the experiment module (or object) for ``exp_id``."""
    return load_target(target(exp_id))


def describe(exp_id: str) -> str:
    """One-line description of ``exp_id`` (its DESCRIPTION or first docstring line)."""
    return describe_target(load(exp_id))
