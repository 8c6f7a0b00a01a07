"""Shared by the tutorial scripts: the embedded digits data set and the ``--tiny`` flag."""

from __future__ import annotations

import argparse

import torch


def digits(n: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random images of scikit-learn's bundled 8×8 digits (float64 in [0, 1]) and labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float64) / 16.0
    y = torch.tensor(data.target)
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:n]
    return x[idx], y[idx]


def parse_tiny(doc: str | None) -> bool:
    """``--tiny``: the size the test suite runs (seconds); default: the documented size."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="run at the CI size")
    return bool(parser.parse_args().tiny)
