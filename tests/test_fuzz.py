"""Hypothesis fuzzing of the public API (issues #16 and #29).

Every call either returns finite, correctly shaped results or raises one of the library's
documented errors (``ValueError`` / ``TypeError`` and their ``noetherflow`` subclasses) whose
message names the bad value: never a NaN result, a silent success on invalid input or a raw
internal error (``IndexError``, ``KeyError``, ``RuntimeError`` from torch), and a call that
fails leaves the model's parameters and buffers bit-for-bit as they were. Random small
models (depth, widths, activation, LayerNorm, dtype), NaN/Inf in weights, biases, inputs and
targets, hyper-parameters and wrong-type arguments. Small models and few examples: with the
command-line fuzzing (tests/test_fuzz_cli.py) well under a minute on two cores in the "ci"
profile; ``HYPOTHESIS_PROFILE=explore`` draws new examples, 20 times as many.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import noetherflow as nf

ALLOWED = (ValueError, TypeError)  # the library's errors all derive from ValueError
# The loaded profile (tests/conftest.py) decides the randomness: "ci" (default) draws the same
# examples every run, HYPOTHESIS_PROFILE=explore new ones, EXPLORE times as many.
EXPLORE = 20 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1


def fuzz(n: int) -> settings:
    """``n`` examples per test in CI (``n · EXPLORE`` when exploring), no deadline."""
    return settings(
        max_examples=n * EXPLORE, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


FUZZ = fuzz(25)
SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, -1e-3]


def _model(d_in: int, hidden: int, d_out: int, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out)).to(dtype)


def _syms(m: nn.Module) -> nf.SymmetrySet:
    return nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")])


def _finite(d: Any) -> bool:
    vals = d.values() if isinstance(d, dict) else [d]
    return all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in vals)


def _fixed() -> tuple[nn.Module, nf.SymmetrySet, Any]:
    m = _model(3, 4, 2, torch.float64)
    syms = _syms(m)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = torch.randn(8, 2, generator=g, dtype=torch.float64)
    return m, syms, nf.collect_stats(m, syms, nn.MSELoss(), x, y)


# -- collect_stats: shapes, dtypes, NaN/Inf in the batch -------------------------------------
@FUZZ
@given(
    d_in=st.integers(1, 4),
    hidden=st.integers(1, 5),
    d_out=st.integers(1, 3),
    n=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    poison=st.sampled_from([None, float("nan"), float("inf")]),
    where=st.sampled_from(["inputs", "targets"]),
    estimator=st.sampled_from(["hooks", "reference"]),
    reduction=st.sampled_from(["mean", "sum"]),
)
def test_collect_stats(
    d_in: int,
    hidden: int,
    d_out: int,
    n: int,
    dtype: torch.dtype,
    poison: float | None,
    where: str,
    estimator: str,
    reduction: str,
) -> None:
    m = _model(d_in, hidden, d_out, dtype)
    syms = _syms(m)
    x, y = torch.randn(n, d_in, dtype=dtype), torch.randn(n, d_out, dtype=dtype)
    if poison is not None:
        (x if where == "inputs" else y)[0, 0] = poison
    loss = nn.MSELoss(reduction=reduction)
    try:
        stats = nf.collect_stats(m, syms, loss, x, y, estimator=estimator, reduction=reduction)
    except ALLOWED as e:
        msg = str(e)
        assert poison is not None or n == 1, f"valid input refused: {msg}"
        if n == 1:  # checked first: Σ needs two samples
            assert "batch of 1 sample" in msg, msg
        else:
            assert any(w in msg for w in ("NaN", "nan", "Inf", "inf", "finite")), msg
        return
    assert poison is None, "NaN/Inf in the batch gave statistics without an error"
    for p in syms.params():
        assert stats.mean[p].shape == p.shape
        assert _finite(stats.mean[p])
    q = nf.charges(syms)
    assert set(q) == {"r"} and q["r"].shape == (hidden,) and _finite(q)


@FUZZ
@given(dtype=st.sampled_from([torch.int64, torch.int32, torch.bool]))
def test_collect_stats_integer_inputs(dtype: torch.dtype) -> None:
    # integer inputs to a float model: a clear error, not torch's matmul RuntimeError
    # (integer *targets* are legitimate: class indices)
    m = _model(3, 4, 2, torch.float64)
    x, y = torch.randn(5, 3).mul(3).to(dtype), torch.randn(5, 2, dtype=torch.float64)
    with pytest.raises(nf.StatisticsError, match=str(dtype).replace("torch.", "")):
        nf.collect_stats(m, _syms(m), nn.MSELoss(), x, y)


# -- hyper-parameters: lr, batch_size, weight_decay, time ------------------------------------
def _invalid(lr: float, batch_size: Any, wd: float, time: str) -> str | None:
    """The name of the first invalid hyper-parameter, or None."""
    if not (math.isfinite(lr) and lr > 0):
        return "lr="
    if not (isinstance(batch_size, int) and batch_size >= 1):
        return "batch_size="
    if not (math.isfinite(wd) and wd >= 0):
        return "weight_decay="
    if time == "discrete" and lr * wd >= 1:
        return "ηγ"
    return None


HYPER = {
    "lr": st.one_of(st.sampled_from(SPECIAL), st.floats(1e-3, 2.0)),
    "batch_size": st.one_of(st.sampled_from([0, -3, 2.5]), st.integers(1, 64)),
    "wd": st.one_of(st.sampled_from(SPECIAL), st.floats(0.0, 2.0)),
    "time": st.sampled_from(["continuous", "discrete"]),
}


@FUZZ
@given(**HYPER)
def test_flow_and_solver_hyperparameters(lr: float, batch_size: Any, wd: float, time: str) -> None:
    _, syms, stats = _fixed()
    bad = _invalid(lr, batch_size, wd, time)
    kw = {"lr": lr, "batch_size": batch_size, "weight_decay": wd, "time": time}
    for fn in (nf.noether_flow, nf.solve_equilibrium):
        try:
            out = fn(syms, stats, **kw)
        except ALLOWED as e:
            assert bad is not None, f"{fn.__name__} refused valid {kw}: {e}"
            # the message names one of the bad values (the first one checked may differ)
            names = ("lr=", "batch_size=", "weight_decay=", "ηγ", "κ", "kappa")
            assert any(w in str(e) for w in names), str(e)
            continue
        assert bad is None, f"{fn.__name__} accepted {bad} in {kw}"
        if fn is nf.noether_flow:
            assert set(out) == {"r"} and out["r"].shape == (4,) and _finite(out)
        else:
            assert _finite(out.distance) and out.converged


@FUZZ
@given(
    kappa=st.one_of(st.sampled_from(SPECIAL), st.floats(1e-3, 10.0)),
    c_mean=st.one_of(st.sampled_from(SPECIAL), st.floats(0.0, 10.0)),
    c_second=st.one_of(st.sampled_from(SPECIAL), st.floats(1e-3, 10.0)),
)
def test_noise_model(kappa: float, c_mean: float, c_second: float) -> None:
    _, syms, stats = _fixed()
    try:
        noise = nf.NoiseModel(kappa, c_mean, c_second)
    except ALLOWED as e:
        assert any(w in str(e) for w in ("kappa", "κ", "c_mean", "c_second")), str(e)
        assert (
            not all(math.isfinite(v) for v in (kappa, c_mean, c_second))
            or kappa < 0
            or (c_second <= 0 or c_mean < 0)
        ), f"valid NoiseModel refused: {e}"
        return
    assert all(math.isfinite(v) for v in (kappa, c_mean, c_second)), "non-finite accepted"
    assert kappa >= 0, f"kappa={kappa} accepted"  # κ = 0: no weight decay, continuous time
    try:
        flow = nf.noether_flow(syms, stats, noise)
    except ALLOWED as e:  # e.g. c_second = 0: no noise, the solver has nothing to balance
        assert str(e)
        return
    assert _finite(flow)


# -- mismatched symmetry sets ------------------------------------------------------------------
@FUZZ
@given(case=st.sampled_from(["other_model", "duplicate", "empty", "other_stats", "other_flow"]))
def test_mismatched_symmetry_sets(case: str) -> None:
    m, _, stats = _fixed()
    other = _model(3, 4, 2, torch.float64, seed=1)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    with pytest.raises(ALLOWED) as err:
        if case == "other_model":
            nf.collect_stats(m, _syms(other), nn.MSELoss(), x, y)
        elif case == "duplicate":
            r = nf.Rescaling(m[0], m[2], label="r")
            nf.SymmetrySet([r, r])
        elif case == "empty":
            nf.collect_stats(m, nf.SymmetrySet([]), nn.MSELoss(), x, y)
        elif case == "other_flow":  # statistics of another set (was a raw KeyError)
            nf.noether_flow(_syms(other), stats, lr=0.1, batch_size=8, weight_decay=1e-3)
        else:
            nf.solve_equilibrium(_syms(other), stats, lr=0.1, batch_size=8, weight_decay=1e-3)
    if case.startswith("other_"):
        assert "statistics" in str(err.value) or "symmetr" in str(err.value), str(err.value)
    else:
        assert str(err.value)


# -- teleport keeps the function ---------------------------------------------------------------
@FUZZ
@given(
    lr=st.floats(1e-3, 0.5),
    batch_size=st.integers(1, 32),
    wd=st.floats(0.0, 0.1),
    seed=st.integers(0, 5),
)
def test_teleport_keeps_the_function(lr: float, batch_size: int, wd: float, seed: int) -> None:
    m = _model(3, 4, 2, torch.float64, seed=seed)
    syms = _syms(m)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    stats = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
    before = m(x).detach()
    try:
        sol = nf.solve_equilibrium(syms, stats, lr=lr, batch_size=batch_size, weight_decay=wd)
    except ALLOWED as e:
        assert str(e)
        return
    nf.teleport(m, sol)
    after = m(x).detach()
    assert torch.isfinite(after).all()
    assert torch.allclose(after, before, rtol=1e-9, atol=1e-10)


# -- verify -----------------------------------------------------------------------------------
@FUZZ
@given(
    n=st.integers(1, 5),
    poison=st.sampled_from([None, float("nan"), float("inf")]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_verify(n: int, poison: float | None, dtype: torch.dtype) -> None:
    m = _model(3, 4, 2, dtype)
    syms = _syms(m)
    x = torch.randn(n, 3, dtype=dtype)
    if poison is not None:
        x[0, 0] = poison
    try:
        res = syms.verify(m, x)
    except ALLOWED as e:
        assert poison is not None, f"true symmetry rejected: {e}"
        assert "NaN" in str(e) or "finite" in str(e), str(e)
        return
    assert poison is None
    assert all(r.verified and math.isfinite(r.rel_change) for r in res)


# -- NoetherMonitor ----------------------------------------------------------------------------
@fuzz(12)
@given(
    every=st.sampled_from([0, -1, 1, 2]),
    lr=st.sampled_from([float("nan"), 0.0, -0.1, 0.1]),
    batch_size=st.sampled_from([0, 8]),
)
def test_monitor(every: int, lr: float, batch_size: int) -> None:
    m = _model(3, 4, 2, torch.float64)
    syms = _syms(m)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    bad = every < 1 or not (lr > 0) or batch_size < 1
    try:
        mon = nf.NoetherMonitor(
            m,
            syms,
            every=every,
            lr=lr,
            batch_size=batch_size,
            logging=nf.LogOptions(progress=False),
        )
    except ALLOWED as e:
        assert bad, f"valid monitor refused: {e}"
        assert any(w in str(e) for w in ("every=", "lr=", "batch_size=")), str(e)
        return
    assert not bad, f"monitor accepted every={every}, lr={lr}, batch_size={batch_size}"
    rows = []
    for _ in range(2):
        m.zero_grad(set_to_none=True)
        with mon.track():
            loss: Tensor = nn.functional.mse_loss(m(x), y)
            loss.backward()
        rows.append(mon.step(loss))
    row = rows[0]
    assert row is not None
    assert torch.isfinite(torch.as_tensor(row["flow/r"])).all()


# == issue #29: detection, wrong types, moved parameters, hyper-parameters =====================
def _snapshot(m: nn.Module) -> list[Tensor]:
    return [t.detach().clone() for t in (*m.parameters(), *m.buffers())]


def _unchanged(m: nn.Module, before: list[Tensor]) -> bool:
    """Parameters and buffers bit-for-bit as before (NaN compares equal to NaN)."""
    now = [*m.parameters(), *m.buffers()]
    return len(now) == len(before) and all(
        a.shape == b.shape and bool((a.detach() == b).logical_or(a.isnan() & b.isnan()).all())
        for a, b in zip(now, before, strict=True)
    )


def _ours(e: BaseException) -> bool:
    """Raised by the library's own validation (not by torch or Python deep inside it)."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and "noetherflow" in frames[-1].filename


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "leaky": nn.LeakyReLU, "id": nn.Identity}


@st.composite
def _nets(draw: st.DrawFn) -> tuple[nn.Module, Tensor, torch.dtype]:
    """A small MLP: 1–3 layers, widths 1–4, a random activation, maybe a LayerNorm."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    widths = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    act = ACTIVATIONS[draw(st.sampled_from(sorted(ACTIVATIONS)))]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers += [nn.LayerNorm(b)] if draw(st.booleans()) and b > 1 else []
            layers.append(act())
    torch.manual_seed(draw(st.integers(0, 3)))
    net = nn.Sequential(*layers).to(dtype)
    x = torch.randn(draw(st.integers(2, 5)), widths[0], dtype=dtype)
    return net, x, dtype


POISON = st.sampled_from([None, float("nan"), float("inf"), float("-inf")])
POSITIVE = st.one_of(st.sampled_from(SPECIAL), st.floats(1e-3, 1.0))


@FUZZ
@given(
    net=_nets(),
    case=st.sampled_from(["valid", "valid", "poison", "tolerance", "scale"]),
    poison=POISON.filter(lambda v: v is not None),
    where=st.sampled_from(["weight", "bias", "input"]),
    bad=st.sampled_from(SPECIAL),
    scale=st.floats(1e-2, 1.0),
)
def test_find_symmetries_and_verify(
    net: tuple[nn.Module, Tensor, torch.dtype],
    case: str,
    poison: float,
    where: str,
    bad: float,
    scale: float,
) -> None:
    """NaN/Inf weights or inputs, non-positive tolerance or scale: named, never "0 symmetries";
    otherwise every symmetry found passes verify, and the model is never changed."""
    m, x, dtype = net
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    kw = {"tolerance": tol, "scale": scale}
    if case == "poison":
        with torch.no_grad():
            (x if where == "input" else getattr(m[0], where)).view(-1)[0] = poison
    elif case != "valid":
        kw[case] = bad
    before = _snapshot(m)
    try:
        syms = nf.find_symmetries(m, x, **kw)
    except ALLOWED as e:
        msg = str(e)
        assert _ours(e), f"raw error: {type(e).__name__}: {msg}"
        assert case != "valid", f"valid input refused: {msg}"
        name = {"poison": f"'0.{where}'" if where != "input" else "input 0"}.get(case, case + "=")
        assert name in msg, msg
        assert _unchanged(m, before)
        return
    assert case == "valid", f"{case} was accepted: {kw}"
    assert _unchanged(m, before)
    for r in syms.verify(m, x, **kw):
        assert r.verified and math.isfinite(r.rel_change), r


def _bad_values() -> st.SearchStrategy[Any]:
    return st.sampled_from(
        ["abc", None, [1.0], {"a": 1}, torch.ones(2), object(), True, 1 + 1j, float("nan"), -1]
    )


def _api_calls() -> dict[str, Any]:
    """name → f(m, syms, x, y, stats, value): one argument of one public function."""
    h = {"lr": 0.1, "batch_size": 4, "weight_decay": 1e-3}
    loss = nn.MSELoss()

    calls: dict[str, Any] = {}
    for k in (
        "reduction",
        "estimator",
        "micro_batch_size",
        "chunk_size",
        "level",
        "check_finite",
        "check_loss",
        "timeout",
    ):
        extra = {"estimator": "microbatch"} if k == "micro_batch_size" else {}
        extra = {"estimator": "reference"} if k == "chunk_size" else extra
        calls[f"collect_stats.{k}"] = lambda m, s, x, y, st_, v, k=k, e=extra: nf.collect_stats(
            m, s, loss, x, y, **{**e, k: v}
        )
    calls["collect_stats.model"] = lambda m, s, x, y, st_, v: nf.collect_stats(v, s, loss, x, y)
    calls["collect_stats.syms"] = lambda m, s, x, y, st_, v: nf.collect_stats(m, v, loss, x, y)
    calls["collect_stats.loss_fn"] = lambda m, s, x, y, st_, v: nf.collect_stats(m, s, v, x, y)
    calls["collect_stats.inputs"] = lambda m, s, x, y, st_, v: nf.collect_stats(m, s, loss, v, y)
    calls["collect_stats.targets"] = lambda m, s, x, y, st_, v: nf.collect_stats(m, s, loss, x, v)
    for k in ("lr", "batch_size", "weight_decay", "time"):
        calls[f"noether_flow.{k}"] = lambda m, s, x, y, st_, v, k=k: nf.noether_flow(
            s, st_, **{**h, k: v}
        )
    calls["noether_flow.charges"] = lambda m, s, x, y, st_, v: nf.noether_flow(
        s, st_, **h, charges=v
    )
    for k in ("tol", "max_iter", "rtol_singular", "ridge", "solver", "fixed"):
        calls[f"solve_equilibrium.{k}"] = lambda m, s, x, y, st_, v, k=k: nf.solve_equilibrium(
            s, st_, **h, options=nf.SolveOptions(**{k: v})
        )
    calls["solve_equilibrium.init"] = lambda m, s, x, y, st_, v: nf.solve_equilibrium(
        s, st_, **h, init=v
    )
    for k in ("scale", "tolerance", "seed", "strict"):
        calls[f"verify.{k}"] = lambda m, s, x, y, st_, v, k=k: s.verify(m, x, **{k: v})
    for k in ("scale", "tolerance", "seed"):
        calls[f"find_symmetries.{k}"] = lambda m, s, x, y, st_, v, k=k: nf.find_symmetries(
            m, x, **{k: v}
        )
    calls["find_symmetries.inputs"] = lambda m, s, x, y, st_, v: nf.find_symmetries(m, v)
    for k in ("steps", "step_size", "optimizer"):
        calls[f"gradient_norm_teleport.{k}"] = lambda m, s, x, y, st_, v, k=k: (
            nf.gradient_norm_teleport(m, s, loss, x, y, **{k: v})
        )
    calls["gradient_norm_teleport.inputs"] = lambda m, s, x, y, st_, v: nf.gradient_norm_teleport(
        m, s, loss, v, y
    )
    calls["EquilibriumTeleport.loss_fn"] = lambda m, s, x, y, st_, v: nf.EquilibriumTeleport(
        m, s, v, **h
    )
    calls["EquilibriumTeleport.model"] = lambda m, s, x, y, st_, v: nf.EquilibriumTeleport(
        v, s, loss, **h
    )
    calls["EquilibriumTeleport.every"] = lambda m, s, x, y, st_, v: nf.EquilibriumTeleport(
        m, s, loss, **h, every=v
    )
    calls["NoiseModel.create.nesterov"] = lambda m, s, x, y, st_, v: nf.NoiseModel.create(
        lr=0.1, batch_size=4, momentum=0.9, nesterov=v
    )
    calls["transform_optimizer_state.optimizer"] = lambda m, s, x, y, st_, v: (
        nf.transform_optimizer_state(v, nf.solve_equilibrium(s, st_, **h))
    )
    calls["geometric_mean.X"] = lambda m, s, x, y, st_, v: nf.geometric_mean(v, torch.eye(2))
    calls["hvp.vector"] = lambda m, s, x, y, st_, v: nf.hvp(m, loss, x, y, v)
    calls["load_history.path"] = lambda m, s, x, y, st_, v: nf.load_history(v)
    return calls


CALLS = _api_calls()
# (call, value) pairs that are valid and must succeed: the rest must raise
VALID = {
    ("collect_stats.chunk_size", "None"),
    ("collect_stats.timeout", "None"),
    ("collect_stats.check_finite", "True"),
    ("collect_stats.check_loss", "True"),
    ("noether_flow.charges", "None"),
    ("noether_flow.time", "None"),  # the defaults: continuous time, no weight decay
    ("noether_flow.weight_decay", "None"),
    ("solve_equilibrium.ridge", "None"),
    ("solve_equilibrium.init", "None"),
    ("solve_equilibrium.fixed", "None"),
    ("verify.strict", "True"),
    ("verify.tolerance", "None"),
    ("gradient_norm_teleport.optimizer", "None"),
    ("EquilibriumTeleport.every", "None"),
    ("NoiseModel.create.nesterov", "None"),
    ("NoiseModel.create.nesterov", "True"),
}
# valid or refused, depending on loss_fn: a tensor of targets that MSELoss broadcasts
MAY = {("collect_stats.targets", "tensor([1., 1.])")}


@fuzz(100)
@given(call=st.sampled_from(sorted(CALLS)), value=_bad_values())
def test_wrong_type_arguments_are_named(call: str, value: Any) -> None:
    """A wrong-type or out-of-range argument: our error naming it, never torch's, model intact."""
    m, syms, stats = _fixed()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = torch.randn(8, 2, generator=g, dtype=torch.float64)
    before = _snapshot(m)
    arg = call.split(".")[1]
    try:
        CALLS[call](m, syms, x, y, stats, value)
    except ALLOWED as e:
        msg = str(e)
        assert _ours(e), f"{call}={value!r}: raw {type(e).__name__} from {e.__traceback__}: {msg}"
        assert (call, repr(value)) not in VALID, f"{call}={value!r} refused: {msg}"
        assert (call, repr(value)) not in MAY or arg in msg or "loss_fn" in msg, msg
        assert arg in msg or type(value).__name__ in msg or "expected" in msg, msg
        assert _unchanged(m, before), f"{call}={value!r} changed the model before failing"
        return
    assert (call, repr(value)) in VALID | MAY, f"{call}={value!r} was accepted"


@fuzz(10)
@given(
    steps=st.integers(0, 2),
    lr=st.floats(1e-3, 0.5),
    estimator=st.sampled_from(["hooks", "reference", "microbatch"]),
)
def test_statistics_refused_after_the_parameters_move(
    steps: int, lr: float, estimator: str
) -> None:
    """Statistics collected, SGD steps, then a solve: refused unless nothing moved."""
    m, syms, _ = _fixed()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = torch.randn(8, 2, generator=g, dtype=torch.float64)
    st_ = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=estimator, micro_batch_size=2)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    h = {"lr": 0.1, "batch_size": 4, "weight_decay": 1e-3}
    try:
        sol = nf.solve_equilibrium(syms, st_, **h)
    except nf.StatisticsError as e:
        assert steps > 0 and "changed since the statistics" in str(e), str(e)
        return
    assert steps == 0, f"statistics of {steps} steps ago were accepted"
    nf.teleport(m, sol)
    again = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=estimator, micro_batch_size=2)
    after = nf.noether_flow(syms, again, **h)["r"]
    assert float(after.abs().max()) < 1e-10 * float(nf.charges(syms)["r"].abs().max())


@FUZZ
@given(
    steps=st.one_of(st.sampled_from([-1, 0, 2.5]), st.integers(1, 4)),
    step_size=POSITIVE,
    poison=POISON,
)
def test_gradient_norm_teleport(steps: Any, step_size: float, poison: float | None) -> None:
    """Right result (‖∇L‖² does not drop, function kept) or an error, the model unchanged."""
    m, syms, _ = _fixed()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    y = torch.randn(8, 2, generator=g, dtype=torch.float64)
    if poison is not None:
        y[1, 1] = poison
    before, out0 = _snapshot(m), m(x).detach()
    bad = not (isinstance(steps, int) and steps >= 0) or not (
        math.isfinite(step_size) and step_size > 0
    )
    try:
        res = nf.gradient_norm_teleport(
            m, syms, nn.MSELoss(), x, y, steps=steps, step_size=step_size
        )
    except ALLOWED as e:
        assert _ours(e) and (bad or poison is not None), str(e)
        assert _unchanged(m, before)
        return
    assert not bad and poison is None
    assert math.isfinite(res.grad_norm_sq_after)
    assert res.grad_norm_sq_after >= res.grad_norm_sq_before * (1 - 1e-9)
    assert torch.allclose(m(x).detach(), out0, rtol=1e-9, atol=1e-12)
