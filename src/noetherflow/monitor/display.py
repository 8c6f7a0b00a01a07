"""The monitor's live progress bar (rich), shown in terminals only."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ProgressDisplay", "is_terminal"]


def is_terminal() -> bool:
    """Whether stdout is a terminal (the default for showing a progress bar)."""
    return sys.stdout.isatty()


class ProgressDisplay:
    """A rich progress bar with the last record's loss and largest distance.

    Shows nothing when another rich live display is active (rich allows one at a time).
    """

    def __init__(self, total: int | None) -> None:
        from rich.errors import LiveError
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress: Any = Progress(
            TextColumn("[bold]noetherflow[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self._task = self._progress.add_task("train", total=total, info="")
        try:
            self._progress.start()
        except LiveError:  # another live display (e.g. a framework's progress bar) is active
            self._progress = None

    @property
    def active(self) -> bool:
        """Whether the bar is shown."""
        return self._progress is not None

    def advance(self, row: Mapping[str, np.ndarray] | None) -> None:
        """One step; with the record's summary when ``row`` is given."""
        if self._progress is None:
            return
        info = "" if row is None else _progress_info(row)
        if info:
            self._progress.update(self._task, advance=1, info=info)
        else:
            self._progress.update(self._task, advance=1)

    def stop(self) -> None:
        """Stop the live display (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _progress_info(row: Mapping[str, np.ndarray]) -> str:
    parts = []
    if np.isfinite(row["loss"]):
        parts.append(f"loss {float(row['loss']):.4g}")
    dist = [np.max(v) for k, v in row.items() if k.startswith("distance/") and v.size]
    fin = [d for d in dist if np.isfinite(d)]
    if fin:
        parts.append(f"max distance {max(fin):.3g}")
    return "  ".join(parts)
