"""The python blocks of the Lightning and loggers pages run as written (in a scratch dir)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs" / "tutorials"


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*log_every_n_steps.*")
@pytest.mark.parametrize("page", ["lightning.md", "loggers.md", "monitor-training.md"])
def test_page_code_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if page == "lightning.md":
        pytest.importorskip("lightning")
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    ns: dict[str, object] = {"__name__": "__docs__"}
    for b in blocks:
        exec(compile(b, page, "exec"), ns)
    if page == "lightning.md":
        assert [r.step for r in ns["tp"].history] == [0, 4]  # type: ignore[attr-defined]
    elif page == "monitor-training.md":
        assert ns["mon"].history["step"].tolist() == [0, 5, 10, 15]  # type: ignore[attr-defined]
    else:
        assert (tmp_path / "records.csv").read_text().startswith("at_infinity/rescaling.0_to_2,")
