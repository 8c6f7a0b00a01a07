"""The Anderson mixing's least squares (noetherflow._anderson.least_squares) against LAPACK's.

The minimum-norm solution of a tall, thin problem, full rank and rank deficient, and the
same bits for the same inputs wherever the inputs lie in memory (what LAPACK's least squares
on MKL does not give, and the solver's side-by-side blocks need).
"""

from __future__ import annotations

import torch

from noetherflow._anderson import least_squares

DT = torch.float64


def _problem(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g, dtype=DT), torch.randn(n, generator=g, dtype=DT)


def test_full_rank_matches_lapack() -> None:
    for n, k, seed in [(26, 3, 0), (200, 8, 1), (768, 5, 2)]:
        a, b = _problem(n, k, seed)
        ref = torch.linalg.lstsq(a, b.unsqueeze(1)).solution[:, 0]
        got = least_squares(a, b)
        assert got.shape == (k,)
        assert torch.allclose(got, ref, rtol=1e-12, atol=1e-14)
        # the residual is orthogonal to the columns (the normal equations hold)
        assert float((a.mT @ (b - a @ got)).abs().max()) < 1e-10


def test_rank_deficient_gives_the_minimum_norm_solution() -> None:
    a, b = _problem(50, 3, 3)
    a = torch.cat([a, a[:, :1]], 1)  # a column twice: a one-dimensional null space
    got = least_squares(a, b)
    ref = torch.linalg.pinv(a) @ b
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)
    assert abs(float(got[0] - got[3])) < 1e-12  # the repeated column's weight split evenly
    zero = least_squares(torch.zeros(10, 2, dtype=DT), torch.ones(10, dtype=DT))
    assert torch.equal(zero, torch.zeros(2, dtype=DT))


def test_the_same_inputs_give_the_same_bits_anywhere_in_memory() -> None:
    a, b = _problem(200, 8, 4)
    first = least_squares(a, b)
    kept = []
    for shift in range(1, 17):  # copies at every 8-byte offset, among other allocations
        kept.append(torch.empty(1000 * shift, dtype=DT))
        buf = torch.empty(a.numel() + b.numel() + shift, dtype=DT)
        a2 = buf[shift : shift + a.numel()].view(a.shape)
        b2 = buf[shift + a.numel() :]
        a2.copy_(a)
        b2.copy_(b)
        assert torch.equal(least_squares(a2, b2), first), shift
