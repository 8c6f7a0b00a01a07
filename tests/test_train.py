"""Tests of noetherflow.train: SGD, GD, SGF, GF, schedules, divergence, determinism.

The model is the two-layer linear net f(x) = U W x (nn.Linear without bias), W of shape
[d, d_in], U of shape [d_out, d]. It has the double-rotation symmetry U → UG, W → G⁻¹W,
with Noether charges C_B = Tr[B(UᵀU − WWᵀ)] for symmetric B; in θ = (U, W) the generator
A acts as (U, W) ↦ (UB, −BW), so gᵀAg = ⟨g_U, g_U B⟩ − ⟨g_W, B g_W⟩.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from noetherflow.train import (
    Constant,
    GFMethod,
    LinearWarmup,
    ScheduleKind,
    StepDecay,
    TrainingData,
    gradient_noise,
    lr_sequence,
    make_schedule,
    per_sample_gradients,
    run_gd,
    run_gf,
    run_sgd,
    run_sgf,
    sample_batch,
)

DT = torch.float64
MSE = nn.MSELoss()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The models are tiny: intra-op threads only add contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_problem(
    seed: int = 0, n: int = 32, d_in: int = 4, d: int = 3, d_out: int = 2, scale: float = 1.0
) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = scale * torch.randn(n, d_in, generator=g, dtype=DT)
    teacher = torch.randn(d_out, d_in, generator=g, dtype=DT)
    Y = X @ teacher.T + 0.3 * torch.randn(n, d_out, generator=g, dtype=DT)
    model = nn.Sequential(nn.Linear(d_in, d, bias=False), nn.Linear(d, d_out, bias=False)).to(DT)
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(d, d_in, generator=g, dtype=DT) / math.sqrt(d_in))
        model[1].weight.copy_(torch.randn(d_out, d, generator=g, dtype=DT) / math.sqrt(d))
    return model, X, Y


def UW(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return model[1].weight, model[0].weight


def matrix_charge(model: nn.Module) -> torch.Tensor:
    U, W = UW(model)
    return (U.T @ U - W @ W.T).detach()


def random_symmetric(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(d, d, generator=g, dtype=DT)
    return (M + M.T) / 2


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---------------------------------------------------------------- (1) gradient flow


@pytest.mark.parametrize(("method", "steps"), [(GFMethod.RK4, 100), ("dop853", 5)])
def test_gf_conserves_matrix_charge(method: GFMethod | str, steps: int) -> None:
    # RK4 with h = 0.02 (observed drift ~1e-8); DOP853 adaptive at rtol 1e-10 (~1e-15).
    model, X, Y = make_problem()
    Q0 = matrix_charge(model)
    res = run_gf(model, MSE, X, Y, time=2.0, steps=steps, method=method, rtol=1e-10, atol=1e-12)
    drift = torch.linalg.norm(matrix_charge(model) - Q0) / torch.linalg.norm(Q0)
    assert not res.diverged
    assert res.history["loss"][-1] < 0.7 * res.history["loss"][0]  # the flow went somewhere
    assert res.final_time == pytest.approx(2.0)
    assert drift < 1e-6, f"GF changed U^TU - WW^T by {drift:.2e} (relative)"
    # The metric is sensitive: GD over the same time breaks conservation at O(η²).
    gd_model, _, _ = make_problem()
    run_gd(gd_model, MSE, X, Y, lr=0.1, steps=20)
    gd_drift = torch.linalg.norm(matrix_charge(gd_model) - Q0) / torch.linalg.norm(Q0)
    assert gd_drift > 1e-4


def test_gf_weight_decay_charge_decays_exponentially() -> None:
    # dC/dt = 2θᵀA(−∇L − 2γθ) = −4γC for every charge of the symmetry.
    model, X, Y = make_problem(seed=1)
    gamma, T = 0.1, 1.5
    Q0 = matrix_charge(model)
    run_gf(model, MSE, X, Y, time=T, steps=100, weight_decay=gamma)
    expected = math.exp(-4 * gamma * T) * Q0
    assert torch.linalg.norm(matrix_charge(model) - expected) / torch.linalg.norm(Q0) < 1e-7


def test_gf_history_grid_and_notes() -> None:
    model, X, Y = make_problem()
    res = run_gf(model, MSE, X, Y, time=1.0, steps=10, method="rk45", log_every=4)
    np.testing.assert_array_equal(res.history["step"], [0, 4, 8, 10])
    np.testing.assert_allclose(res.history["time"], [0.0, 0.4, 0.8, 1.0])
    assert np.isnan(res.history["lr"]).all()
    assert any("nfev" in note for note in res.notes)


# ---------------------------------------------------------------- (2) exact SGD identity


def test_sgd_exact_charge_identity_every_step() -> None:
    model, X, Y = make_problem(n=32, d=3)
    B = random_symmetric(3, seed=5)
    gamma, lr, S, steps, seed = 0.05, 0.05, 4, 100, 7
    replay = torch.Generator().manual_seed(seed)  # replays run_sgd's minibatch draws
    C, gAg, scale = [], [], []

    def callback(step: int, m: nn.Module) -> dict[str, float]:
        U, W = UW(m)
        c = torch.trace(B @ (U.T @ U - W @ W.T)).item()
        C.append(c)
        scale.append(torch.linalg.matrix_norm(B, 2).item() * (U.norm() ** 2 + W.norm() ** 2).item())
        if step < steps:
            idx = sample_batch(X.shape[0], S, generator=replay)
            gU, gW = torch.autograd.grad(MSE(m(X[idx]), Y[idx]), [U, W])
            gAg.append(((gU * (gU @ B)).sum() - (gW * (B @ gW)).sum()).item())
        return {"C": c}

    res = run_sgd(
        model,
        MSE,
        X,
        Y,
        lr=lr,
        batch_size=S,
        steps=steps,
        weight_decay=gamma,
        schedule=LinearWarmup(20, start_lr=0.01),
        generator=torch.Generator().manual_seed(seed),
        callback=callback,
    )
    assert not res.diverged and len(C) == steps + 1
    eta = res.history["lr"][:steps]
    C_arr, gAg_arr = np.array(C), np.array(gAg)
    pred = (1 - 2 * eta * gamma) ** 2 * C_arr[:-1] + eta**2 * gAg_arr
    err = np.abs(C_arr[1:] - pred) / np.array(scale[1:])
    assert err.max() < 1e-12, f"identity off by {err.max():.2e} (relative)"
    np.testing.assert_array_equal(res.history["C"], C_arr)
    # The test can fail: decoupled decay (1 − ηγ)² or no noise term are far off.
    wrong = (1 - eta * gamma) ** 2 * C_arr[:-1] + eta**2 * gAg_arr
    assert (np.abs(C_arr[1:] - wrong) / np.array(scale[1:])).max() > 1e-6
    no_noise = (1 - 2 * eta * gamma) ** 2 * C_arr[:-1]
    assert (np.abs(C_arr[1:] - no_noise) / np.array(scale[1:])).max() > 1e-6


def test_momentum_adds_note() -> None:
    model, X, Y = make_problem()
    res = run_sgd(model, MSE, X, Y, lr=0.01, batch_size=4, steps=3, momentum=0.9)
    assert any("momentum" in note and "identity" in note for note in res.notes)
    plain = run_sgd(make_problem()[0], MSE, X, Y, lr=0.01, batch_size=4, steps=3)
    assert plain.notes == []


# ---------------------------------------------------------------- (3) SGF noise


def test_per_sample_gradients_match_autograd_loop() -> None:
    model, X, Y = make_problem(n=5)
    ps = per_sample_gradients(model, MSE, X, Y)
    for i in range(5):
        grads = torch.autograd.grad(
            MSE(model(X[i : i + 1]), Y[i : i + 1]), list(model.parameters())
        )
        for (name, _), g in zip(model.named_parameters(), grads, strict=True):
            torch.testing.assert_close(ps[name][i], g, rtol=1e-12, atol=1e-14)


def test_per_sample_gradients_are_the_statistics_reference() -> None:
    # run_sgf's per-sample gradients and collect_stats(estimator="reference") share one
    # reference (noetherflow.stats.reference); the hooks estimator is an independent path.
    import noetherflow as nf

    g = torch.Generator().manual_seed(3)
    X = torch.randn(12, 4, generator=g, dtype=DT)
    Y = torch.randn(12, 2, generator=g, dtype=DT)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).to(DT)
    syms = nf.find_symmetries(model, X[:4])
    ps = per_sample_gradients(model, MSE, X, Y)
    by_param = {p: ps[n] for n, p in model.named_parameters()}
    for est in ("reference", "hooks"):
        st = nf.collect_stats(model, syms, MSE, X, Y, estimator=est)
        sq = st.blocks["diagonal"].sq
        assert sq, "no per-coordinate second moments collected"
        for p, mean in st.mean.items():
            torch.testing.assert_close(mean, by_param[p].mean(0), rtol=1e-12, atol=1e-14)
        for p, m2 in sq.items():
            torch.testing.assert_close(m2, (by_param[p] ** 2).mean(0), rtol=1e-12, atol=1e-14)


def test_per_sample_gradients_refuse_batchnorm_in_training_mode() -> None:
    from noetherflow import StatisticsError

    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)).to(DT)
    X, Y = torch.randn(6, 4, dtype=DT), torch.randn(6, 2, dtype=DT)
    with pytest.raises(StatisticsError, match="BatchNorm in training mode"):
        per_sample_gradients(model, MSE, X, Y)
    model.eval()
    assert per_sample_gradients(model, MSE, X, Y)["0.weight"].shape == (6, 3, 4)


def test_sgf_noise_has_the_gradient_covariance() -> None:
    # Monte Carlo: E‖Σ̂ − Σ‖_F² = ((Tr Σ)² + ‖Σ‖_F²)/n for n Gaussian draws with known mean.
    # Tolerance: 4 standard errors; with N = 8 (rank Σ ≤ 7) it is ≈ 0.08, below the 14%
    # error a 1/sqrt(N−1) normalisation would make.
    model, X, Y = make_problem(n=8)
    ps = per_sample_gradients(model, MSE, X, Y)
    G = torch.cat([ps[n].reshape(8, -1) for n, _ in model.named_parameters()], dim=1)
    centred = G - G.mean(0)
    Sigma = centred.T @ centred / 8
    n_draws = 20_000
    xi = gradient_noise(G, generator=torch.Generator().manual_seed(0), num_draws=n_draws)
    emp = xi.T @ xi / n_draws
    se = math.sqrt((torch.trace(Sigma) ** 2 + Sigma.norm() ** 2).item() / n_draws)
    rel_err = (torch.linalg.norm(emp - Sigma) / torch.linalg.norm(Sigma)).item()
    rel_se = se / torch.linalg.norm(Sigma).item()
    assert rel_se < 0.03
    assert rel_err < 4 * rel_se, f"covariance off by {rel_err:.3f} (tolerance {4 * rel_se:.3f})"
    # Noise lives in the span of the centred gradients: no component along ḡ-free nullspace.
    assert xi.shape == (n_draws, G.shape[1])


def test_sgf_step_is_drift_plus_scaled_noise() -> None:
    model, X, Y = make_problem(n=10)
    lr, S, gamma, seed = 0.05, 3, 0.02, 11
    theta0 = flat_params(model)
    ps = per_sample_gradients(model, MSE, X, Y)
    G = torch.cat([ps[n].reshape(10, -1) for n, _ in model.named_parameters()], dim=1)
    xi = gradient_noise(G, generator=torch.Generator().manual_seed(seed))
    expected = (1 - 2 * lr * gamma) * theta0 - lr * G.mean(0) + (lr / math.sqrt(S)) * xi
    res = run_sgf(
        model,
        MSE,
        X,
        Y,
        lr=lr,
        batch_size=S,
        steps=1,
        weight_decay=gamma,
        generator=torch.Generator().manual_seed(seed),
    )
    assert res.final_time == pytest.approx(lr)
    torch.testing.assert_close(flat_params(model), expected, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(expected, (1 - 2 * lr * gamma) * theta0 - lr * G.mean(0))


def test_sgf_subsampled_noise_runs() -> None:
    model, X, Y = make_problem()
    res = run_sgf(
        model,
        MSE,
        X,
        Y,
        lr=0.05,
        batch_size=4,
        steps=5,
        noise_samples=8,
        generator=torch.Generator().manual_seed(0),
    )
    assert not res.diverged and res.config["noise_samples"] == 8


# ---------------------------------------------------------------- (4) divergence


def test_divergence_recorded_not_raised() -> None:
    model, X, Y = make_problem(scale=3.0)
    res = run_sgd(
        model,
        MSE,
        X,
        Y,
        lr=2.0,
        batch_size=8,
        steps=200,
        generator=torch.Generator().manual_seed(0),
    )
    assert res.diverged
    k = res.diverged_at_step
    assert isinstance(k, int) and 0 < k <= 200
    assert res.steps_completed == k
    assert res.last_finite_loss is not None and math.isfinite(res.last_finite_loss)
    assert res.history["step"].max() <= k
    assert res.to_dict()["diverged_at_step"] == k


def test_gd_divergence_step_is_exact() -> None:
    model, X, Y = make_problem(scale=3.0)
    res = run_gd(model, MSE, X, Y, lr=2.0, steps=200, log_every=50)
    assert res.diverged
    k = res.diverged_at_step
    assert k is not None and k >= 1
    before = run_gd(make_problem(scale=3.0)[0], MSE, X, Y, lr=2.0, steps=k - 1)
    at = run_gd(make_problem(scale=3.0)[0], MSE, X, Y, lr=2.0, steps=k)
    assert not before.diverged
    assert at.diverged and at.diverged_at_step == k


@pytest.mark.parametrize("which", ["sgd", "gd", "sgf", "gf-rk4", "gf-dop853"])
def test_nonfinite_initial_state(which: str) -> None:
    model, X, Y = make_problem()
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    gen = torch.Generator().manual_seed(0)
    if which == "sgd":
        res = run_sgd(model, MSE, X, Y, lr=0.1, batch_size=4, steps=5, generator=gen)
    elif which == "gd":
        res = run_gd(model, MSE, X, Y, lr=0.1, steps=5)
    elif which == "sgf":
        res = run_sgf(model, MSE, X, Y, lr=0.1, batch_size=4, steps=5, generator=gen)
    else:
        res = run_gf(model, MSE, X, Y, time=1.0, steps=5, method=which.split("-")[1])
    assert res.diverged and res.diverged_at_step == 0
    assert res.last_finite_loss is None and res.steps_completed == 0


# ---------------------------------------------------------------- (5) schedules


def test_schedule_sequences() -> None:
    np.testing.assert_allclose(lr_sequence(None, 0.1, 3), [0.1, 0.1, 0.1])
    np.testing.assert_allclose(lr_sequence(Constant(), 0.1, 2), [0.1, 0.1])
    np.testing.assert_allclose(
        lr_sequence(LinearWarmup(4, start_lr=0.01), 0.05, 6), [0.01, 0.02, 0.03, 0.04, 0.05, 0.05]
    )
    np.testing.assert_allclose(
        lr_sequence(StepDecay([2, 4], gamma=0.5), 1.0, 6), [1, 1, 0.5, 0.5, 0.25, 0.25]
    )
    np.testing.assert_allclose(lr_sequence(lambda k: 1 / (k + 1), 0.6, 3), [0.6, 0.3, 0.2])
    np.testing.assert_allclose(lr_sequence("constant", 0.2, 2), [0.2, 0.2])
    warm = make_schedule(ScheduleKind.WARMUP, warmup_steps=2)
    np.testing.assert_allclose(lr_sequence(warm, 1.0, 3), [0.0, 0.5, 1.0])
    assert isinstance(make_schedule("step", milestones=[3]), StepDecay)


def test_schedule_drives_run_lr_and_time() -> None:
    model, X, Y = make_problem()
    res = run_gd(model, MSE, X, Y, lr=0.1, steps=6, schedule=StepDecay([3], gamma=0.1))
    np.testing.assert_allclose(res.history["lr"], [0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01])
    np.testing.assert_allclose(res.history["time"], [0, 0.1, 0.2, 0.3, 0.31, 0.32, 0.33])


@pytest.mark.parametrize(
    "build",
    [
        lambda: LinearWarmup(0),
        lambda: LinearWarmup(3, start_lr=-1.0),
        lambda: StepDecay([3, 2]),
        lambda: StepDecay([2], gamma=0.0),
        lambda: make_schedule("cosine"),
    ],
)
def test_schedule_errors(build) -> None:
    with pytest.raises(ValueError):
        build()


def test_negative_scheduled_lr_raises_naming_step() -> None:
    model, X, Y = make_problem()
    with pytest.raises(ValueError, match="at step 2"):
        run_gd(model, MSE, X, Y, lr=0.1, steps=5, schedule=lambda k: 1.0 - k)


# ---------------------------------------------------------------- (6) determinism


@pytest.mark.parametrize("runner", ["sgd", "sgf"])
def test_determinism_for_a_seed(runner: str) -> None:
    def go(seed: int) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        model, X, Y = make_problem()
        fn = run_sgd if runner == "sgd" else run_sgf
        res = fn(
            model,
            MSE,
            X,
            Y,
            lr=0.05,
            batch_size=4,
            steps=15,
            generator=torch.Generator().manual_seed(seed),
        )
        return res.history, res.final_state

    (h1, s1), (h2, s2), (h3, _) = go(3), go(3), go(4)
    for key in h1:
        np.testing.assert_array_equal(h1[key], h2[key])
    for key in s1:
        assert torch.equal(s1[key], s2[key])
    assert not np.array_equal(h1["loss"], h3["loss"])


# ---------------------------------------------------------------- plumbing


def test_logging_schedule_and_callback_keys() -> None:
    model, X, Y = make_problem()
    calls: list[int] = []

    def cb(step: int, m: nn.Module) -> dict[str, float] | None:
        calls.append(step)
        return {"w_norm": m[0].weight.norm()} if step >= 3 else None

    res = run_sgd(model, MSE, X, Y, lr=0.01, batch_size=4, steps=10, callback=cb, log_every=3)
    assert calls == [0, 3, 6, 9, 10]
    np.testing.assert_array_equal(res.history["step"], [0, 3, 6, 9, 10])
    assert res.history["step"].dtype == np.int64
    assert np.isnan(res.history["w_norm"][0]) and np.isfinite(res.history["w_norm"][1:]).all()
    assert set(res.history) == {"step", "time", "loss", "lr", "w_norm"}
    np.testing.assert_allclose(res.history["time"], 0.01 * res.history["step"])


def test_callback_reserved_key_rejected() -> None:
    model, X, Y = make_problem()
    with pytest.raises(ValueError, match="reserves"):
        run_gd(model, MSE, X, Y, lr=0.1, steps=1, callback=lambda k, m: {"loss": 1.0})


def test_sum_reduction_rejected() -> None:
    model, X, Y = make_problem()
    with pytest.raises(ValueError, match="batch mean"):
        run_gd(model, nn.MSELoss(reduction="sum"), X, Y, lr=0.1, steps=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.0}, "lr=0.0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"steps": -1}, "steps=-1"),
        ({"momentum": 1.0}, "momentum=1.0"),
        ({"log_every": 0}, "log_every=0"),
    ],
)
def test_argument_errors(kwargs: dict[str, float], match: str) -> None:
    model, X, Y = make_problem()
    args: dict[str, float] = {"lr": 0.1, "batch_size": 4, "steps": 1} | kwargs
    with pytest.raises(ValueError, match=match):
        run_sgd(model, MSE, X, Y, **args)  # type: ignore[arg-type]


def test_data_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="Shape mismatch"):
        TrainingData(torch.zeros(3, 2), torch.zeros(4, 1), MSE)


def test_full_loss_does_not_touch_batchnorm_stats() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).to(DT)
    X, Y = torch.randn(16, 3, dtype=DT), torch.randn(16, 1, dtype=DT)
    data = TrainingData(X, Y, MSE)
    before = model[1].running_mean.clone()
    data.full_loss(model)
    assert torch.equal(model[1].running_mean, before)
    res = run_sgd(model, MSE, X, Y, lr=0.01, batch_size=4, steps=2)
    assert not res.diverged
