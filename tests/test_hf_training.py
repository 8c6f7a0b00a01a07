"""Training a Hugging Face language model with the monitor and the teleporter (issue 14).

A small GPT-2 LM (2 layers, width 32, 4 heads, vocabulary 50, 12 tokens, batch 4, random
init, nothing downloaded), called the Hugging Face way: ``model(input_ids=..., ...)`` or
``model(**batch)`` with the labels in the batch. Checked against the torch.func reference
in float64: the monitor's flows at every record of a 50-step run, all three estimators on
integer token inputs and keyword inputs, and a teleport through ``TeleportingOptimizer``
with a dict batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._errors import StatisticsError

T = pytest.importorskip("transformers")

DT = torch.float64
V, N, L = 50, 4, 12


def small_gpt2(dropout: float = 0.0) -> nn.Module:
    cfg = T.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=V,
        n_positions=16,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(cfg).to(DT)


def lm_loss(out: Any, ids: Tensor) -> Tensor:
    """Next-token cross-entropy, the mean over the batch of each sequence's token mean."""
    logits = out.logits[:, :-1].reshape(-1, V)
    return F.cross_entropy(logits, ids[:, 1:].reshape(-1))


def hf_loss(out: Any, _: Any) -> Tensor:
    """The model's own loss (labels in the batch)."""
    return out.loss


def batch(step: int, *, labels: bool = False) -> dict[str, Tensor]:
    """Sequences counting up from a random start modulo V: the next token is learnable."""
    gen = torch.Generator().manual_seed(1000 + step)
    ids = (torch.randint(0, V, (N, 1), generator=gen) + torch.arange(L)) % V
    b = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if labels:
        b["labels"] = ids
    return b


def rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# torch.func's vmap has no batching rule for CPU flash attention (the reference estimator)
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def test_gpt2_symmetries_from_keyword_inputs() -> None:
    model = small_gpt2()
    b = batch(0)
    syms = nf.find_symmetries(model, b)
    by_position = nf.find_symmetries(model, b["input_ids"])
    assert syms.names == by_position.names
    # per block: LayerNorm → c_attn, 4 heads × (q·k, v·c_proj), LayerNorm → c_fc
    assert len(syms) == 2 * (1 + 4 + 4 + 1)
    assert all(r.verified for r in syms.verification.values())


def test_monitor_runs_50_steps_on_a_small_gpt2() -> None:
    """50 SGD steps of the LM loss; at every record the flows equal the reference's."""
    model = small_gpt2().train()
    syms = nf.find_symmetries(model, batch(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-3)
    # the equilibrium distance is off: the coupled rotation solve is being rewritten (slow)
    mon = nf.NoetherMonitor(
        model,
        syms,
        every=5,
        optimizer=opt,
        batch_size=N,
        distance=False,
        logging=nf.LogOptions(progress=False),
    )
    assert set(mon.keys) == set(syms.names)  # every symmetry found is monitored
    checked = 0
    for step in range(50):
        b = batch(step)
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = lm_loss(model(**b), b["input_ids"])
            loss.backward()
        row = mon.step(loss)
        if row is not None:
            stats = nf.collect_stats(model, syms, lm_loss, b, b["input_ids"], estimator="reference")
            want = nf.noether_flow(syms, stats, lr=0.1, batch_size=N, weight_decay=5e-4)
            for name in syms.names:
                got = torch.as_tensor(row[f"flow/{mon.keys[name]}"])
                w = want[name] if got.dim() else want[name].norm()
                assert rel(got.reshape(w.shape), w) < 1e-9, (step, name)
                checked += 1
        opt.step()
    assert checked == 10 * len(syms)
    h = mon.history
    assert h["step"].tolist() == list(range(0, 50, 5))
    for name in syms.names:
        for kind in ("charge", "flow"):
            assert np.isfinite(h[f"{kind}/{mon.keys[name]}"]).all(), (kind, name)
    assert h["loss"][-1] < 0.9 * h["loss"][0]  # it learns
    mon.close()


@pytest.mark.parametrize("estimator", ["reference", "microbatch"])
def test_monitor_with_a_batch_estimator_and_hf_labels(estimator: str) -> None:
    """``mon.step(loss, inputs=batch)``: keyword inputs with labels, no targets."""
    model = small_gpt2().train()
    syms = nf.find_symmetries(model, batch(0))
    mon = nf.NoetherMonitor(
        model,
        syms,
        every=1,
        lr=0.1,
        batch_size=N,
        distance=False,
        logging=nf.LogOptions(progress=False),
        estimator=estimator,
        loss_fn=hf_loss,
    )
    for step in range(3):
        b = batch(step, labels=True)
        # the same estimator called directly on the same batch at the same θ
        stats = nf.collect_stats(model, syms, hf_loss, b, None, estimator=estimator)
        want = nf.noether_flow(syms, stats, lr=0.1, batch_size=N)
        model.zero_grad(set_to_none=True)
        with mon.track():
            loss = model(**b).loss
            loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        row = mon.step(loss, inputs=b)
        assert row is not None
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
        for name in syms.names:
            got = torch.as_tensor(row[f"flow/{mon.keys[name]}"])
            w = want[name] if got.dim() else want[name].norm()
            assert rel(got.reshape(w.shape), w) < 1e-12, (estimator, name)
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.1 * p.grad)


def _flows(model: nn.Module, syms: nf.SymmetrySet, b: Any, y: Any, loss: Any) -> Any:
    out = {}
    for est in ("hooks", "reference", "microbatch"):  # micro-batches of one: exact
        st = nf.collect_stats(model, syms, loss, b, y, estimator=est, micro_batch_size=1)
        out[est] = nf.noether_flow(syms, st, lr=0.1, batch_size=N, weight_decay=1e-3)
    return out


@pytest.mark.parametrize("form", ["positional ids", "keyword", "keyword with labels"])
def test_every_estimator_takes_token_ids(form: str) -> None:
    """Integer inputs, no gradient w.r.t. them: hooks = reference = micro-batches of one."""
    model = small_gpt2().eval()
    b = batch(0, labels=form == "keyword with labels")
    ids = b["input_ids"]
    inputs: Any = ids if form == "positional ids" else b
    targets, loss = (None, hf_loss) if form == "keyword with labels" else (ids, lm_loss)
    syms = nf.find_symmetries(model, inputs)
    flows = _flows(model, syms, inputs, targets, loss)
    # Hugging Face's own loss upcasts the logits to float32 (logits.float()): round-off 1e-7
    tol = 1e-5 if loss is hf_loss else 1e-10
    for name in syms.names:
        ref = flows["reference"][name]
        assert rel(flows["hooks"][name], ref) < tol, name
        assert rel(flows["microbatch"][name], ref) < tol, name


def test_reference_estimator_runs_with_dropout_in_training_mode() -> None:
    """Dropout draws per sample inside vmap (it used to stop with vmap's randomness error)."""
    model = small_gpt2(dropout=0.1).train()
    b = batch(0)
    syms = nf.find_symmetries(model.eval(), b)
    model.train()
    st = nf.collect_stats(model, syms, lm_loss, b, b["input_ids"], estimator="reference")
    eval_st = nf.collect_stats(
        model.eval(), syms, lm_loss, b["input_ids"], b["input_ids"], estimator="reference"
    )
    p = syms.params()[0]
    assert torch.isfinite(st.mean[p]).all()
    assert rel(st.mean[p], eval_st.mean[p]) > 1e-3  # the masks did act


class _Tagger(nn.Module):
    """Embedding → Linear → ReLU → Linear, with an optional per-token weight keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, 6)
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, input_ids: Tensor, scale: Tensor | None = None) -> Tensor:
        h = self.emb(input_ids)
        if scale is not None:
            h = h * scale.unsqueeze(-1)
        return self.fc2(torch.relu(self.fc1(h)))


def _tagger() -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(0)
    m = _Tagger().to(DT)
    ids = torch.randint(0, V, (N, 5))
    y = torch.randn(N, 5, 3, dtype=DT)
    return m, nf.find_symmetries(m, ids), ids, y


def _mse(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).square().sum((1, 2)).mean()


@pytest.mark.parametrize("estimator", ["hooks", "reference", "microbatch"])
def test_float_token_ids_and_int_features_give_a_clear_error(estimator: str) -> None:
    m, syms, ids, y = _tagger()
    with pytest.raises(StatisticsError, match=r"integer tensor.*x\.long\(\)"):
        nf.collect_stats(m, syms, _mse, ids.to(DT), y, estimator=estimator)
    mlp = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).to(DT)
    s2 = nf.find_symmetries(mlp, torch.randn(4, 3, dtype=DT))
    x_int = torch.randint(0, 3, (4, 3))
    with pytest.raises(StatisticsError, match=r"integer inputs \['input 0 \(int64\)'\]"):
        nf.collect_stats(mlp, s2, _mse2, x_int, torch.randn(4, 2, dtype=DT), estimator=estimator)


def _mse2(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).square().sum(1).mean()


def test_keyword_inputs_split_by_batch_dimension() -> None:
    """A [1, T] keyword tensor goes unchanged to every sample; [N, T] is split."""
    m, syms, ids, y = _tagger()
    scale = torch.rand(1, 5, dtype=DT) + 0.5
    per_sample = torch.rand(N, 5, dtype=DT) + 0.5
    for kw in (
        {"input_ids": ids, "scale": scale},
        {"input_ids": ids, "scale": per_sample},
        {"input_ids": ids, "scale": None},
    ):
        ref = nf.collect_stats(m, syms, _mse, kw, y, estimator="reference")
        mb = nf.collect_stats(m, syms, _mse, kw, y, estimator="microbatch")
        hooks = nf.collect_stats(m, syms, _mse, kw, y)
        for p in syms.params():
            assert rel(mb.mean[p], ref.mean[p]) < 1e-12
            assert rel(hooks.mean[p], ref.mean[p]) < 1e-12
        for p, v in ref.sq.items():
            assert rel(mb.sq[p], v) < 1e-12 and rel(hooks.sq[p], v) < 1e-12
    # splitting the [N, T] scale matters: passed whole it would give other statistics
    whole = nf.collect_stats(m, syms, _mse, {"input_ids": ids, "scale": per_sample[:1]}, y)
    assert rel(whole.sq[m.fc1.weight], ref.sq[m.fc1.weight]) > 1e-3


def test_bad_inputs_give_clear_errors() -> None:
    m, syms, ids, y = _tagger()
    with pytest.raises(TypeError, match=r"string keys.*got the key 0"):
        nf.find_symmetries(m, {0: ids})
    with pytest.raises(ValueError, match="empty dict"):
        nf.collect_stats(m, syms, _mse, {}, y)
    with pytest.raises(TypeError, match="the inputs are None"):
        nf.find_symmetries(m, None)
    with pytest.raises(nf.DetectionError, match=r"input_idz=\(4, 5\) int64.*dict for keyword"):
        nf.find_symmetries(m, {"input_idz": ids})
    per_position = {"input_ids": ids, "scale": torch.ones(5, dtype=DT)}  # [T], not per sample
    nf.collect_stats(m, syms, _mse, per_position, y)  # hooks run the batch whole: fine
    for est in ("reference", "microbatch"):  # splitting it would mix samples
        with pytest.raises(ValueError, match=r"'scale' has shape \(5,\).*batch size is 4"):
            nf.collect_stats(m, syms, _mse, per_position, y, estimator=est)
    with pytest.raises(StatisticsError, match=r"targets is \(3, 5, 3\).*4 samples"):
        nf.collect_stats(m, syms, _mse, ids, y[:3], estimator="reference")
    with pytest.raises(StatisticsError, match=r"loss_fn\(outputs, None\) failed.*pass the targets"):
        nf.collect_stats(m, syms, _mse, ids, None, estimator="microbatch")
    with pytest.raises(StatisticsError, match=r"loss_fn\(outputs, None\) failed"):
        nf.collect_stats(m, syms, _mse, ids, None)


def test_teleporting_optimizer_takes_a_dict_batch() -> None:
    """``opt.step(batch=hf_batch)``: statistics on model(**batch), the function is kept."""
    model = small_gpt2().eval()
    b = batch(0, labels=True)
    syms = nf.find_symmetries(model, b)
    before = model(**b).logits.detach()
    tp = nf.EquilibriumTeleport(
        model,
        syms,
        hf_loss,
        lr=0.1,
        batch_size=N,
        weight_decay=1e-3,
        estimator="reference",
        solver_kwargs={"max_sweeps": 3},
    )
    opt = tp.wrap(torch.optim.SGD(model.parameters(), lr=0.0))
    model.zero_grad()
    opt.step(batch=b)
    assert len(tp.history) == 1
    after = model(**b).logits.detach()
    assert rel(after, before) < 1e-10
    assert tp.history[0].max_distance > 1e-3  # it moved


def test_docs_page_runs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The python blocks of docs/tutorials/hugging-face.md, in order, in one namespace."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "hugging-face.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "__docs__"}
    for b in blocks:
        exec(compile(b, str(page), "exec"), ns)
    assert len(ns["syms"]) == 20
    assert ns["row"] is not None and float(ns["change"]) < 1e-10
