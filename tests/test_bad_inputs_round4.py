"""Round 4 of bad inputs: what a new researcher ran into trying the library as documented.

Each test failed on the code before its fix: a record after ``mon.close()`` was kept in memory
but silently not written to the files; ``find_symmetries`` on an empty batch returned 0
symmetries without a word; a ``loss_fn`` returning a per-sample vector or a Python float
failed deep in autograd; a teleport probe of another shape or dtype than the model takes (or
the stored float64 probe on a float32 copy) raised torch's matmul error; the Trainer and
Lightning callbacks accepted ``every=0`` and unknown monitor options until training started.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


def _mlp() -> tuple[nn.Sequential, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(DT)
    x = torch.randn(16, 4, dtype=DT)
    y = torch.randint(0, 3, (16,))
    return m, nf.find_symmetries(m, x), x, y


def _params(m: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


# -- the monitor after close() ----------------------------------------------------------------
def test_step_after_close_is_refused_not_silently_unlogged(tmp_path: Path) -> None:
    m, syms, x, y = _mlp()
    log = nf.LogOptions(log_dir=tmp_path, progress=False)
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=16, distance=False, logging=log)
    with mon.track():
        nn.functional.cross_entropy(m(x), y).backward()
    mon.step()
    mon.close()
    mon.close()  # closing twice is harmless
    with pytest.raises(ValueError, match=r"closed.*new NoetherMonitor"):
        mon.track()
    with pytest.raises(ValueError, match=r"closed.*new NoetherMonitor"):
        mon.step()
    assert len(mon.history["step"]) == 1
    assert len((tmp_path / "history.csv").read_text().splitlines()) == 2  # header + 1 row


# -- detection on an empty batch ----------------------------------------------------------------
@pytest.mark.parametrize("how", ["tensor", "dict"])
def test_find_symmetries_refuses_an_empty_batch(how: str) -> None:
    m, _, x, _ = _mlp()
    inputs = x[:0] if how == "tensor" else {"input": x[:0]}
    with pytest.raises(ValueError, match=r"empty.*0 samples.*at least one sample"):
        nf.find_symmetries(m, inputs)


def test_verify_refuses_an_empty_batch() -> None:
    m, syms, x, _ = _mlp()
    with pytest.raises(ValueError, match=r"empty.*0 samples"):
        syms.verify(m, x[:0])


# -- a loss_fn that does not return a scalar tensor ---------------------------------------------
@pytest.mark.parametrize("estimator", ["hooks", "microbatch"])
def test_per_sample_loss_vector_is_named(estimator: str) -> None:
    """A batch of one per sample (the reference estimator) gives a one-element loss: fine."""
    m, syms, x, y = _mlp()
    before = _params(m)
    n = 16 if estimator == "hooks" else 4
    with pytest.raises(nf.StatisticsError, match=rf"shape \({n},\).*scalar.*reduction='none'"):
        nf.collect_stats(
            m,
            syms,
            nn.CrossEntropyLoss(reduction="none"),
            x,
            y,
            estimator=estimator,
            micro_batch_size=4,
        )
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


@pytest.mark.parametrize(
    ("value", "hint"),
    [(1.0, "not .item()"), ("loss", "not .item()"), (None, "out.loss is None when no labels")],
)
def test_loss_fn_returning_a_non_tensor_is_named(value: object, hint: str) -> None:
    m, syms, x, y = _mlp()
    with pytest.raises(nf.StatisticsError, match=rf"loss_fn returned a .*scalar tensor.*{hint}"):
        nf.collect_stats(m, syms, lambda out, t: value, x, y)


def test_a_tuple_of_losses_is_named() -> None:
    m, syms, x, y = _mlp()
    loss = nn.CrossEntropyLoss()
    with pytest.raises(nf.StatisticsError, match=r"loss_fn returned a tuple"):
        nf.collect_stats(m, syms, lambda out, t: (loss(out, t),), x, y)


def test_model_failing_on_a_list_input_is_named() -> None:
    m, syms, x, y = _mlp()
    with pytest.raises(nf.StatisticsError, match=r"forward failed.*TypeError"):
        nf.collect_stats(m, syms, nn.CrossEntropyLoss(), [x], y)


# -- the teleport's probe -----------------------------------------------------------------------
def _solved() -> tuple[nn.Sequential, nf.EquilibriumSolution, Tensor]:
    m, syms, x, y = _mlp()
    stats = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y)
    sol = nf.solve_equilibrium(syms, stats, lr=0.1, batch_size=4, weight_decay=1e-3)
    return m, sol, x


def test_a_probe_the_model_cannot_run_is_named() -> None:
    m, sol, _ = _solved()
    before = _params(m)
    with pytest.raises(nf.TeleportError, match=r"probe \(\(3, 7\) float64.*check='off'"):
        nf.teleport(m, sol, probe=torch.randn(3, 7, dtype=DT))
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    nf.teleport(m, sol, probe=torch.randn(3, 4))  # nothing moved; float32: the model's dtype


def test_the_stored_probe_runs_in_the_dtype_of_a_copy() -> None:
    """A float32 copy of the float64 model the symmetries were found on: the stored probe
    is compared in the copy's own dtype (docs/concepts/teleport.md), as documented."""
    m, sol, x = _solved()
    m32 = copy.deepcopy(m).float()
    before = m32(x.float()).detach()
    nf.teleport(m32, sol)
    after = m32(x.float()).detach()
    assert float((after - before).norm() / before.norm()) < 1e-5


# -- integrations: options checked when the callback is built -----------------------------------
def test_trainer_callback_checks_its_options_at_construction() -> None:
    pytest.importorskip("transformers")
    from noetherflow.integrations.transformers import NoetherTrainerCallback

    with pytest.raises(ValueError, match=r"every=0"):
        NoetherTrainerCallback(every=0)
    with pytest.raises(TypeError, match=r"bogus"):
        NoetherTrainerCallback(every=1, bogus=1)
    with pytest.raises(TypeError, match=r"syms.*SymmetrySet"):
        NoetherTrainerCallback(syms=[1], every=1)  # type: ignore[arg-type]


def test_lightning_callback_checks_its_options_at_construction() -> None:
    pytest.importorskip("lightning")
    from noetherflow.integrations.lightning import NoetherCallback

    _, syms, _, _ = _mlp()
    with pytest.raises(ValueError, match=r"every=0"):
        NoetherCallback(syms, every=0)
    with pytest.raises(TypeError, match=r"bogus"):
        NoetherCallback(syms, every=1, bogus=1)
    with pytest.raises(TypeError, match=r"syms.*SymmetrySet"):
        NoetherCallback(None, every=1)  # type: ignore[arg-type]


# -- EquilibriumTeleport: every option checked when it is built ---------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"optimizer_state": "bogus"}, r"optimizer_state='bogus'.*'transform'.*'reset'"),
        ({"time": "bogus"}, r"time='bogus'.*'discrete'"),
        ({"reduction": "avg"}, r"reduction='avg'.*'mean'"),
        ({"batch_size": 0}, r"batch_size=0 must be a positive integer"),
        ({"batch_size": 2.5}, r"batch_size=2.5 must be a positive integer"),
        ({"micro_batch_size": 0}, r"micro_batch_size=0 must be a positive integer"),
    ],
)
def test_equilibrium_teleport_checks_its_options(kw: dict[str, object], match: str) -> None:
    m, syms, _, _ = _mlp()
    args: dict[str, object] = {"lr": 0.1, "batch_size": 4, **kw}
    with pytest.raises(ValueError, match=match):
        nf.EquilibriumTeleport(m, syms, nn.CrossEntropyLoss(), **args)  # type: ignore[arg-type]


def test_wrap_takes_an_optimizer() -> None:
    m, syms, _, _ = _mlp()
    tp = nf.EquilibriumTeleport(m, syms, nn.CrossEntropyLoss(), lr=0.1, batch_size=4)
    with pytest.raises(TypeError, match=r"wrap.*str.*torch.optim.Optimizer"):
        tp.wrap("sgd")  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["model", "syms"])
def test_monitor_names_a_wrong_model_or_set(which: str) -> None:
    m, syms, _, _ = _mlp()
    args = (None, syms) if which == "model" else (m, list(syms))
    with pytest.raises(TypeError, match=rf"NoetherMonitor: {which} is a"):
        nf.NoetherMonitor(*args, every=1, lr=0.1, batch_size=4)  # type: ignore[arg-type]


# -- LogOptions: each field checked when built --------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"log_dir": 3}, r"log_dir=3.*a directory path"),
        ({"tensorboard": "yes"}, r"tensorboard='yes'.*add_scalar"),
        ({"progress": "no"}, r"progress='no'.*True, False or None"),
        ({"total": -1}, r"total=-1 must be an integer >= 0"),
    ],
)
def test_log_options_check_their_fields(kw: dict[str, object], match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        nf.LogOptions(**kw)  # type: ignore[arg-type]


def test_a_writer_object_is_still_accepted() -> None:
    class Writer:
        def add_scalar(self, *a: object) -> None: ...

        def add_histogram(self, *a: object) -> None: ...

    assert isinstance(nf.LogOptions(tensorboard=Writer()).tensorboard, Writer)


def test_nested_track_is_named() -> None:
    """It used to blame the layers for not running inside the capture."""
    m, syms, x, y = _mlp()
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=16, distance=False)
    with pytest.raises(nf.StatisticsError, match=r"inside another mon.track"), mon.track():
        with mon.track():
            pass
    with mon.track():  # the monitor goes on
        nn.functional.cross_entropy(m(x), y).backward()
    assert mon.step() is not None


@pytest.mark.parametrize("loss", ["abc", torch.ones(3), True])
def test_a_loss_that_is_not_one_number_is_named(loss: object) -> None:
    m, syms, x, y = _mlp()
    mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=16, distance=False)
    with mon.track():
        nn.functional.cross_entropy(m(x), y).backward()
    with pytest.raises(TypeError, match=r"step\(loss\).*expected the batch loss"):
        mon.step(loss)


# -- token ids beyond an embedding table ---------------------------------------------------------
class _Tok(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.l1, self.l2 = nn.Embedding(50, 8), nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, ids: Tensor) -> Tensor:
        return self.l2(self.l1(self.emb(ids)).relu())


def test_ids_beyond_the_table_are_named_not_blamed_on_a_layer() -> None:
    """It said "The first Linear layer expects 8 input features": not the cause."""
    ids = torch.randint(0, 500, (4, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(nf.DetectionError, match=r"ids up to 4\d\d.*emb \(50 tokens\)") as e:
        nf.find_symmetries(_Tok(), ids)
    assert "input features" not in str(e.value)


def test_inspect_names_the_vocab_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from noetherflow import cli

    f = tmp_path / "tok.py"
    f.write_text(
        "import torch.nn as nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 16), nn.ReLU(),"
        " nn.Linear(16, 4))\n"
    )
    args = ["inspect", f"{f}:make", "--input-shape", "16", "--dtype", "long", "--vocab-size"]
    assert cli.main([*args, "500"]) == cli.ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--vocab-size 500" in err and "0 (50 tokens)" in err and "Traceback" not in err


# -- undo after the parameters moved on ----------------------------------------------------------
def test_undo_after_a_training_step_is_refused_not_a_silent_revert() -> None:
    """undo() restored the pre-teleport parameters, silently discarding the step since."""
    m, sol, x = _solved()
    handle = nf.teleport(m, sol)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    nn.functional.cross_entropy(m(x), torch.zeros(16, dtype=torch.long)).backward()
    opt.step()
    stepped = _params(m)
    with pytest.raises(nf.TeleportError, match=r"changed since the teleport.*discard"):
        handle.undo()
    assert all(torch.equal(stepped[k], v) for k, v in m.state_dict().items())
    handle.undo(force=True)  # asked for: back to before the teleport
    assert not all(torch.equal(stepped[k], v) for k, v in m.state_dict().items())


def test_undo_right_after_the_teleport_is_exact() -> None:
    m, sol, _ = _solved()
    before = _params(m)
    nf.teleport(m, sol).undo()
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


# -- a plot before any record --------------------------------------------------------------------
def test_plot_before_any_record_is_named(tmp_path: Path) -> None:
    m, syms, _, _ = _mlp()
    mon = nf.NoetherMonitor(m, syms, every=100, lr=0.1, batch_size=4)
    with pytest.raises(ValueError, match=r"no records yet.*every=100"):
        mon.plot(tmp_path / "x.png")


# -- a parameter frozen after the symmetries were found ------------------------------------------
@pytest.mark.parametrize("who", ["collect_stats", "NoetherMonitor", "EquilibriumTeleport"])
def test_a_parameter_frozen_after_detection_is_named(who: str) -> None:
    """collect_stats blamed the inputs ("cannot register a hook on a tensor that doesn't
    require gradient"); the monitor said the parameter was missing from the optimizer."""
    torch.manual_seed(0)
    m = _Tok().to(DT)
    ids = torch.randint(0, 50, (8, 12))
    syms = nf.find_symmetries(m, ids)
    m.emb.weight.requires_grad_(False)  # fine-tuning with a frozen embedding
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)

    def loss(out: Tensor, t: Tensor) -> Tensor:
        return nn.functional.cross_entropy(out, t)

    calls = {
        "collect_stats": lambda: nf.collect_stats(m, syms, loss, ids, ids[:, 0]),
        "NoetherMonitor": lambda: nf.NoetherMonitor(m, syms, every=1, optimizer=opt, batch_size=8),
        "EquilibriumTeleport": lambda: nf.EquilibriumTeleport(m, syms, loss, lr=0.1, batch_size=8),
    }
    with pytest.raises(nf.StatisticsError, match=r"'emb.weight'.*frozen.*find_symmetries"):
        calls[who]()
    assert len(nf.find_symmetries(m, ids)) >= 1  # found after freezing: the frozen one left out


def test_a_compiled_model_is_read_through_to_its_module() -> None:
    """torch.compile(model) gave 0 symmetries without a word (the wrapper does not trace)."""
    m, syms, x, _ = _mlp()
    found = nf.find_symmetries(torch.compile(m), x)
    assert found.names == syms.names
    assert found.params() == syms.params()  # the same parameters: the wrapper shares them


# -- the optim helpers: wrong arguments named ----------------------------------------------------
def test_exact_step_charges_names_missing_and_misshaped_gradients() -> None:
    m, syms, _, _ = _mlp()
    with pytest.raises(ValueError, match=r"grads has no gradient for '0.weight'.*every parameter"):
        nf.exact_step_charges(syms, {}, lr=0.1)
    bad = {p: torch.zeros(3, dtype=DT) for p in m.parameters()}
    with pytest.raises(ValueError, match=r"'0.weight'.*shape \(3,\).*\(8, 4\)"):
        nf.exact_step_charges(syms, bad, lr=0.1)
    with pytest.raises(TypeError, match=r"syms.*SymmetrySet"):
        nf.exact_step_charges(list(syms), {}, lr=0.1)  # type: ignore[arg-type]


def test_step_recorder_names_its_arguments() -> None:
    m, syms, _, _ = _mlp()
    with pytest.raises(TypeError, match=r"StepRecorder: optimizer is a str"):
        nf.StepRecorder(syms, "sgd")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"StepRecorder: syms"):
        nf.StepRecorder([1], torch.optim.SGD(m.parameters(), lr=0.1))  # type: ignore[arg-type]


def test_stationary_moments_names_its_step() -> None:
    with pytest.raises(TypeError, match=r"step is a str.*MomentumStep"):
        nf.stationary_moments(1.0, 1.0, "x")  # type: ignore[arg-type]


# -- declaring symmetries by hand ----------------------------------------------------------------
def test_rescaling_of_a_non_module_is_named() -> None:
    m, _, _, _ = _mlp()
    with pytest.raises(nf.SymmetryDefinitionError, match=r"first layer is a str"):
        nf.Rescaling("0", m[2])  # type: ignore[arg-type]


def test_scale_invariance_of_a_module_is_named() -> None:
    m, _, _, _ = _mlp()
    with pytest.raises(nf.SymmetryDefinitionError, match=r"takes parameters.*got a Linear.*weight"):
        nf.ScaleInvariance(m[0])  # type: ignore[arg-type]


# -- sharpness on a batch whose labels are among the inputs --------------------------------------
def test_monitor_sharpness_takes_a_dict_batch_without_targets() -> None:
    """mon.step(loss, inputs=batch) with the labels in the batch (targets=None, loss_fn on
    out.loss, as documented for Hugging Face models) was refused as "needs a batch"."""
    torch.manual_seed(0)
    m = _Tok().to(DT)
    ids = torch.randint(0, 50, (8, 12))
    syms = nf.find_symmetries(m, ids)

    class Wrap(nn.Module):  # a model taking keyword inputs and returning its own loss
        def __init__(self) -> None:
            super().__init__()
            self.inner = m

        def forward(self, input_ids: Tensor, labels: Tensor) -> Tensor:
            out = self.inner(input_ids)
            return nn.functional.cross_entropy(out.flatten(0, 1), labels.flatten())

    w = Wrap()
    batch = {"input_ids": ids, "labels": ids % 4}
    sh = nf.SharpnessOptions(n_samples=2, max_iter=3)
    opts = {"distance": False, "sharpness": sh, "loss_fn": lambda out, _: out}
    mon = nf.NoetherMonitor(w, syms, every=1, lr=0.1, batch_size=8, **opts)
    with mon.track():
        loss = w(**batch)
        loss.backward()
    row = mon.step(loss, inputs=batch)
    assert row is not None and np.isfinite(row["sharpness/trace"])
    with mon.track():
        w(**batch).backward()
    with pytest.raises(ValueError, match=r"needs a batch"):
        mon.step(w(**batch))  # no inputs at all: still refused


@pytest.mark.parametrize("estimator", ["reference", "microbatch"])
def test_trainer_callback_refuses_a_batch_estimator_when_built(estimator: str) -> None:
    """Accepted, then every run stopped at step 0 asking for mon.step(inputs=...), which the
    callback (not the user) calls."""
    pytest.importorskip("transformers")
    from noetherflow.integrations.transformers import NoetherTrainerCallback

    with pytest.raises(ValueError, match=rf"estimator='{estimator}'.*hooks"):
        NoetherTrainerCallback(every=1, estimator=estimator, loss_fn=lambda out, _: out.loss)
    NoetherTrainerCallback(every=1, estimator="hooks")  # the default, said explicitly
