"""What the training callbacks (Lightning, Hugging Face) check when they are built."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from noetherflow._checks import check_positive_int
from noetherflow.monitor import NoetherMonitor
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["check_callback_options"]


def check_callback_options(
    who: str, syms: object, every: object, options: Mapping[str, Any], *, optional: bool = False
) -> int:
    """A training callback's ``syms``, ``every`` and monitor keywords, checked when it is built.

    ``options`` are what is left once :func:`~noetherflow.monitor.options.take_options` took
    the option objects: each must be a :class:`NoetherMonitor` keyword, so that a typo fails
    at the line that built the callback, not once training has started. ``optional``: ``syms``
    may be None (found at train begin). Returns ``every``.
    """
    if not (optional and syms is None) and not isinstance(syms, SymmetrySet):
        found = "nf.find_symmetries(model, x)" + (", or None to find them" if optional else "")
        raise TypeError(
            f"{who}: syms is a {type(syms).__name__}; expected a SymmetrySet ({found})."
        )
    known = set(inspect.signature(NoetherMonitor.__init__).parameters) - {"self", "old"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"{who}: unknown monitor options {unknown}; expected keywords of NoetherMonitor "
            f"({', '.join(sorted(known - {'model', 'syms'}))})."
        )
    return check_positive_int(every, "every", "optimizer steps between records")
