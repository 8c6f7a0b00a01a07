"""One check of "BatchNorm normalises by the batch" (issue #27), used by every estimator."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow._checks import batch_statistics

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "noetherflow"


def _bn(train: bool, track: bool) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(4, track_running_stats=track).train(train)


@pytest.mark.parametrize(
    ("train", "track", "coupled"),
    [(True, True, True), (True, False, True), (False, False, True), (False, True, False)],
)
def test_batch_statistics_follows_pytorch(train: bool, track: bool, coupled: bool) -> None:
    m = _bn(train, track)
    assert (batch_statistics(m) is not None) is coupled
    # the same rule as PyTorch's: the output in eval mode depends on the other samples
    x = torch.randn(6, 4, dtype=torch.float64)
    with torch.no_grad():
        whole, first = m.double()(x)[:2], m(x[:2])
    assert (not torch.allclose(whole, first, rtol=1e-12, atol=1e-12)) is coupled


def test_other_norms_do_not_couple_samples() -> None:
    for m in (nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.Linear(2, 2), nn.InstanceNorm1d(4)):
        assert batch_statistics(m.train()) is None


def _model() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False), nn.Linear(4, 2)
    ).double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    return m.eval(), syms, torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2).double()


@pytest.mark.parametrize("estimator", ["reference", "hooks"])
def test_eval_batchnorm_without_running_statistics_is_refused(estimator: str) -> None:
    """Before the one check, the reference estimator took such a model (eval mode)."""
    m, syms, x, y = _model()
    with pytest.raises(nf.UnsupportedLayerError, match="without running statistics") as err:
        nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=estimator)
    assert "estimator='microbatch'" in str(err.value)
    assert "track_running_stats=True" in str(err.value)
    # the micro-batch estimator takes it, as it takes training mode
    nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="microbatch", micro_batch_size=4)
    with pytest.raises(nf.StatisticsError, match="micro_batch_size=1"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="microbatch", micro_batch_size=1)


def test_batchnorm_training_is_checked_in_one_place() -> None:
    """No module but ``_checks.py`` tests a BatchNorm's mode or running statistics itself."""
    pat = re.compile(
        r"_BatchNorm\)? and \w+\.training|\.training or not \w+\.track_running_stats"
        r"|isinstance\(\w+, _BN\)"
    )
    where = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        if p.name != "_checks.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pat.search(line)
    ]
    assert not where, f"use noetherflow._checks.batch_statistics: {where}"
