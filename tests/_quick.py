"""Shared by the experiment tests: read one experiment's metrics.json from a reproduce run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from noetherflow.experiments import METRICS_FILE


def metrics(out: Path, exp_id: str) -> dict[str, Any]:
    """The metrics of ``exp_id`` under ``out``; fails the test if the experiment errored."""
    data: dict[str, Any] = json.loads((out / exp_id / METRICS_FILE).read_text(encoding="utf-8"))
    assert data["status"] == "ok", data.get("error")
    return data
