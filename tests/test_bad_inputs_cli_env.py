"""The command line in a hostile environment (issue #29): a full disk, a read-only or
non-writable ``--out``, a permission error, an unreadable figure, a ``metrics.json`` nested too
deeply and a claim whose ``holds`` is not a boolean.

Each was an "internal error … a bug in noetherflow" (exit 4), a message naming the wrong cause
("cannot write the report" for a figure it could not read) or a wrong verdict (``--strict``
exiting 0 on a failing claim); now each is one line naming the path and the fix, exit 2. The
operating-system errors are injected (the tests run as any user, root included); where a
real permission can be taken away (not root) a second test does so.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

import noetherflow.experiments as experiments
from noetherflow import cli
from noetherflow._io import atomic_write_json

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
PNG = b"\x89PNG\r\n\x1a\nfigure"


def _record(exp: str = "fig1", **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "experiment": exp,
        "status": "ok",
        "claims": [],
        "figures": [],
        "error": None,
    }
    rec.update(kw)
    return rec


def _results(tmp_path: Path, rec: dict[str, Any]) -> Path:
    d = tmp_path / "results" / str(rec["experiment"])
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(rec), encoding="utf-8")
    return d.parent


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, " ".join(err.split())


def _writes_metrics(monkeypatch: pytest.MonkeyPatch, exc: OSError | None = None) -> None:
    """``run_experiments`` replaced by one that writes a metrics.json (or raises ``exc``)."""

    def run(specs: Any, *, out_dir: Path, **_: Any) -> list[dict[str, Any]]:
        if exc is not None:
            raise exc
        rec = _record(specs[0][0])
        atomic_write_json(Path(out_dir) / rec["experiment"] / "metrics.json", rec)
        return [rec]

    monkeypatch.setattr(experiments, "run_experiments", run)


@pytest.mark.parametrize(
    ("code", "strerror", "fix"),
    [
        (errno.ENOSPC, "No space left on device", "free some space"),
        (errno.EROFS, "Read-only file system", "writable disk"),
        (errno.EACCES, "Permission denied", "a directory you can write"),
        (errno.EPERM, "Operation not permitted", "a directory you can write"),
    ],
)
def test_os_errors_during_a_run_are_user_errors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    strerror: str,
    fix: str,
) -> None:
    out = tmp_path / "out"
    where = out / "fig1" / "metrics.json"
    _writes_metrics(monkeypatch, OSError(code, strerror, str(where)))
    rc, err = _main(["reproduce", "fig1", "--quick", "--out", str(out)], capsys)
    assert rc == cli.ExitCode.USAGE, err
    assert str(where) in err and strerror in err and fix in err, err


def test_full_disk_without_a_file_name_names_the_out_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    _writes_metrics(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    rc, err = _main(["reproduce", "fig1", "--quick", "--out", str(out)], capsys)
    assert rc == cli.ExitCode.USAGE and str(out) in err and "free some space" in err, err


def test_non_writable_out_is_refused_before_any_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    real_open = os.open

    def refuse(path: Any, *args: Any, **kw: Any) -> int:
        if Path(os.fsdecode(path)).parent == out or Path(os.fsdecode(path)) == out:
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", refuse)
    ran: list[Any] = []
    monkeypatch.setattr(experiments, "run_experiments", lambda *a, **k: ran.append(a) or [])
    rc, err = _main(["reproduce", "fig1", "--quick", "--out", str(out)], capsys)
    assert rc == cli.ExitCode.USAGE and str(out) in err and "you can write" in err, err
    assert not ran  # refused before the (long) experiments, not after them


@pytest.mark.skipif(ROOT_USER or os.name != "posix", reason="root ignores permissions")
def test_read_only_out_directory_for_real(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        rc, err = _main(["reproduce", "fig1", "--quick", "--out", str(out)], capsys)
    finally:
        out.chmod(0o700)
    assert rc == cli.ExitCode.USAGE and str(out) in err, err


def test_unreadable_figure_is_named_as_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _results(tmp_path, _record(figures=["fig.png"]))
    fig = root / "fig1" / "fig.png"
    fig.write_bytes(PNG)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "fig.png":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    rc, err = _main(["report", str(root)], capsys)
    assert rc == cli.ExitCode.USAGE, err
    assert "cannot read the figure" in err and "fig.png" in err and "cannot write" not in err


@pytest.mark.skipif(ROOT_USER or os.name != "posix", reason="root ignores permissions")
def test_unreadable_figure_for_real(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _results(tmp_path, _record(figures=["fig.png"]))
    fig = root / "fig1" / "fig.png"
    fig.write_bytes(PNG)
    fig.chmod(0)
    try:
        rc, err = _main(["report", str(root)], capsys)
    finally:
        fig.chmod(0o600)
    assert rc == cli.ExitCode.USAGE and "cannot read the figure" in err, err


def test_report_into_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from noetherflow import report

    root = _results(tmp_path, _record())

    def full(*_: Any, **__: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "write_report", full)
    rc, err = _main(["report", str(root)], capsys)
    assert rc == cli.ExitCode.USAGE and str(root) in err and "free some space" in err, err


def test_deeply_nested_metrics_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    (root / "fig1").mkdir(parents=True)
    depth = 100_000
    text = '{"experiment": "fig1", "x": ' + "[" * depth + "]" * depth + "}"
    (root / "fig1" / "metrics.json").write_text(text, encoding="utf-8")
    rc, err = _main(["report", str(root)], capsys)
    assert rc == cli.ExitCode.USAGE and "nested too deeply" in err and "metrics.json" in err


@pytest.mark.parametrize("holds", ["false", "true", 0, 1, None, [False]])
def test_claim_holds_must_be_a_boolean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], holds: Any
) -> None:
    # "false" (a string) counted as failing in the summary, was missing from the failing
    # list, and --strict exited 0
    claim = {"id": "c1", "holds": holds, "value": 1.0, "op": "<", "threshold": 0.5}
    root = _results(tmp_path, _record(claims=[claim]))
    rc, err = _main(["report", str(root), "--strict"], capsys)
    assert rc == cli.ExitCode.USAGE, err
    assert "'c1'" in err and f"holds={json.dumps(holds)}" in err and "true or false" in err


@pytest.mark.parametrize(("holds", "code"), [(False, cli.ExitCode.CLAIMS_FAILED), (True, 0)])
def test_boolean_holds_still_decide_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], holds: bool, code: int
) -> None:
    claim = {"id": "c1", "holds": holds, "value": 1.0, "op": "<", "threshold": 0.5}
    root = _results(tmp_path, _record(claims=[claim]))
    rc, err = _main(["report", str(root), "--strict"], capsys)
    assert rc == code, err
