"""Private: the deprecation path of old spellings (one message form, one warning class).

Every old spelling the package still accepts warns through :func:`warn_renamed`: a
:class:`FutureWarning` (shown to users by default) that names the old call and the new one.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["is_old_model_call", "warn_model", "warn_renamed"]


def warn_renamed(old: str, new: str, *, stacklevel: int = 2) -> None:
    """A :class:`FutureWarning`: ``old`` is deprecated, ``new`` replaces it.

    ``stacklevel`` counts from the caller of this function, as in :func:`warnings.warn`
    (2: the line that called the caller).
    """
    warnings.warn(
        f"{old} is deprecated: {new} instead; the old form will be removed in a future release.",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )


def is_old_model_call(first: Any, second: Any, new_type: type) -> bool:
    """The call starts ``(model, <new_type>)``: the old form with the dead ``model``."""
    return (first is None or isinstance(first, nn.Module)) and isinstance(second, new_type)


def warn_model(who: str, new_call: str) -> None:
    """A :class:`FutureWarning` for ``who(model, ...)`` naming ``new_call``."""
    warn_renamed(
        f"{who}(model, ...)", f"the model argument was never used; call {new_call}", stacklevel=3
    )
