"""Hypothesis fuzzing of the command line (issue #29).

Random arguments to ``reproduce``, ``report`` and ``inspect`` and random ``metrics.json``
contents: every run exits with a documented code (0, 1, 2 or 3), never 4 ("internal error … a
bug in noetherflow") or a traceback, and ``--strict`` agrees with the claims (exit 1 exactly
when a claim fails). The experiments themselves are replaced by a stub that writes one
record, so that the arguments, not the experiments, are under test.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import noetherflow.experiments as experiments
from noetherflow import cli

EXPLORE = 20 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1  # see conftest.py
CLI_FUZZ = settings(max_examples=25 * EXPLORE, deadline=None)
DOCUMENTED = {0, 1, 2, 3}
MODEL = "import torch\n\ndef make():\n    return torch.nn.Sequential(torch.nn.Linear(3, 2))\n"


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return int(code), err.getvalue()


def _stub(specs: Any, *, out_dir: Path, **_: Any) -> list[dict[str, Any]]:
    return [{"experiment": i, "status": "ok", "claims": []} for i, _ in specs]


INTS = st.one_of(st.integers(-5, 5), st.sampled_from([2**32, 2**63, 10**20]))
TEXT = st.one_of(
    st.sampled_from(["", " ", "abc", "1e3", "-1", "0", "3,x", "nan", "\x00", "../x", "1,,2"]),
    st.integers(-3, 10**12).map(str),
)
PATHS = st.sampled_from(["DIR", "FILE", "MISSING", "DIR/sub/deeper", "", "\x00bad"])


def _path(kind: str, root: Path) -> str:
    return {
        "DIR": str(root),
        "FILE": str(root / "a_file"),
        "MISSING": str(root / "missing"),
        "DIR/sub/deeper": str(root / "sub" / "deeper"),
    }.get(kind, kind)


@CLI_FUZZ
@given(
    command=st.sampled_from(["reproduce", "report", "inspect", "list", "demo", "bogus"]),
    ids=st.lists(st.sampled_from(["fig1", "all", "nope", "FIG2", "../x", ""]), max_size=2),
    opts=st.dictionaries(
        st.sampled_from(
            [
                "--seed",
                "--jobs",
                "--torch-threads",
                "--out",
                "--mnist",
                "--input-shape",
                "--batch-size",
                "--vocab-size",
                "--dtype",
            ]
        ),
        st.one_of(INTS.map(str), TEXT, PATHS),
        max_size=3,
    ),
    flags=st.lists(st.sampled_from(["--quick", "--strict", "--eval", "--json"]), max_size=2),
)
def test_any_arguments_exit_with_a_documented_code(
    command: str, ids: list[str], opts: dict[str, str], flags: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        (root / "a_file").write_text("x", encoding="utf-8")
        (root / "m.py").write_text(MODEL, encoding="utf-8")
        mp.setattr(experiments, "run_experiments", _stub)
        mp.chdir(root)  # nothing lands in the working tree
        argv = [command]
        if command == "inspect":
            argv.append(f"{root / 'm.py'}:make")
        elif command == "report":
            argv.append(_path(ids[0] if ids else "DIR", root))
        else:
            argv += ids
        for k, v in opts.items():
            argv += [k, _path(v, root)]
        code, err = _run(argv + flags)
    assert code in DOCUMENTED, f"{argv + flags} exited {code}: {err}"
    assert "internal error" not in err and "Traceback" not in err, f"{argv}: {err}"


CLAIM = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["c1", "c2", "c3"]),
        "holds": st.one_of(
            st.booleans(), st.sampled_from(["false", "true", 0, 1, None, [], {}, 0.5])
        ),
        "value": st.one_of(st.floats(allow_nan=False), st.none(), st.text(max_size=3)),
        "op": st.sampled_from(["<", ">", "<=", "??"]),
        "threshold": st.floats(allow_nan=False, allow_infinity=False),
    }
)
RECORD = st.fixed_dictionaries(
    {
        "experiment": st.just("fig1"),
        "status": st.sampled_from(["ok", "error", "weird"]),
        "claims": st.one_of(st.lists(CLAIM, max_size=3), st.sampled_from([None, "x", {}])),
        "figures": st.one_of(st.just([]), st.sampled_from([["f.png"], ["/etc/x.png"], "x"])),
        "error": st.one_of(st.none(), st.sampled_from(["boom", {"stage": "run"}])),
    }
)


@CLI_FUZZ
@given(rec=RECORD, depth=st.sampled_from([0, 0, 0, 50, 100_000]))
def test_report_of_any_metrics_json(rec: dict[str, Any], depth: int) -> None:
    """Any metrics.json: a documented exit code, and ``--strict`` agrees with the claims."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "fig1").mkdir()
        text = json.dumps(rec)
        if depth:
            text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
        (root / "fig1" / "metrics.json").write_text(text, encoding="utf-8")
        code, err = _run(["report", str(root), "--strict"])
    assert code in DOCUMENTED, f"exit {code}: {err}"
    assert "internal error" not in err and "Traceback" not in err, err
    claims = rec["claims"] if isinstance(rec["claims"], list) else []
    if depth > 10_000:
        assert code == cli.ExitCode.USAGE and "nested too deeply" in err, err
    elif any(not isinstance(c["holds"], bool) for c in claims):
        assert code == cli.ExitCode.USAGE and "true or false" in err, err
    elif rec["error"] or rec["status"] == "error":
        assert code == cli.ExitCode.EXPERIMENT_ERROR, err
    elif any(c["holds"] is False for c in claims):
        assert code == cli.ExitCode.CLAIMS_FAILED, err  # --strict: a failing claim is exit 1
    else:
        assert code == cli.ExitCode.OK, err
