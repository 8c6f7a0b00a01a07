"""Private: the command line's reading of errors that come from the user's environment.

A full disk, a read-only file system, a permission or too little memory is not a bug of
noetherflow: :func:`environment_error` turns each into one line naming the path, the system's
reason and the fix (exit code 2 in :mod:`noetherflow.cli`).
"""

from __future__ import annotations

import errno
from pathlib import Path

__all__ = ["environment_error", "os_error_message"]


def environment_error(exc: OSError | MemoryError, where: str | None) -> str:
    """One line for an ``OSError`` (:func:`os_error_message`) or a ``MemoryError``."""
    if isinstance(exc, MemoryError):
        return (
            "out of memory; pass smaller sizes (e.g. --input-shape, --batch-size, --jobs 1) "
            "or run on a machine with more memory"
        )
    return os_error_message(exc, where)


def os_error_message(exc: OSError, where: Path | str | None, flag: str = "--out") -> str:
    """One line for an operating-system error: what failed, on which path, and the fix.

    A full disk, a read-only file system or a permission error is the user's environment,
    not a bug; ``where`` names the directory when the error carries no file name (a write
    that fills the disk).
    """
    path = exc.filename or where or "the output directory"
    reason = exc.strerror or str(exc)
    code = exc.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return (
            f"cannot write {path}: {reason} (the disk or quota is full); free some space or "
            f"pass {flag} a directory on a disk with room"
        )
    if code == errno.EROFS:
        return f"cannot write {path}: {reason}; pass {flag} a directory on a writable disk"
    if code in (errno.EACCES, errno.EPERM):
        return (
            f"cannot access {path}: {reason}; pass {flag} a directory you can write, or fix "
            "its permissions (e.g. chmod u+rwx)"
        )
    return f"{path}: {reason}; check the path and the disk"
