"""Private: the deprecation path of the dead ``model`` argument of the main calls."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["is_old_model_call", "warn_model"]


def is_old_model_call(first: Any, second: Any, new_type: type) -> bool:
    """The call starts ``(model, <new_type>)``: the old form with the dead ``model``."""
    return (first is None or isinstance(first, nn.Module)) and isinstance(second, new_type)


def warn_model(who: str, new_call: str) -> None:
    """A :class:`FutureWarning` for ``who(model, ...)`` naming ``new_call``."""
    warnings.warn(
        f"{who}(model, ...) is deprecated: the model argument was never used. Call "
        f"{new_call} instead; the old form will be removed in a future release.",
        FutureWarning,
        stacklevel=3,
    )
