"""``NoetherTrainerCallback`` in a real ``transformers.Trainer`` run (issue #31).

A tiny GPT-2 (nothing downloaded) trained by ``Trainer`` with gradient accumulation, a
linear warmup from lr = 0, right-padded sequences with labels at -100, in float64: at every
record the flows equal the torch.func reference on the whole accumulated batch (the
Trainer normalises the loss by ``num_items_in_batch``: the token mean over the step).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import noetherflow as nf

T = pytest.importorskip("transformers")
from noetherflow.integrations.transformers import NoetherTrainerCallback  # noqa: E402

V, L = 40, 10
pytestmark = [
    pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Padded(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Counting sequences of 4..10 tokens, right-padded with 0, labels -100 on the padding."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = (torch.randint(0, V, (n, 1), generator=g) + torch.arange(L)) % V
        self.lens = torch.randint(4, L + 1, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i].clone()
        labels = ids.clone()
        ids[self.lens[i] :] = 0
        labels[self.lens[i] :] = -100
        return {"input_ids": ids, "labels": labels}


def gpt2() -> Any:
    cfg = T.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=V,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(cfg).to(torch.float64)


def lm_loss(out: Any, labels: torch.Tensor) -> torch.Tensor:
    """The Trainer's step loss: the summed token loss over ``num_items_in_batch``.

    (The Trainer counts the labels before the shift, so this is not quite the token mean.)
    """
    logits = out.logits[:, :-1].reshape(-1, V)
    total = F.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    return total / labels.ne(-100).sum()


class Reference(T.TrainerCallback):  # type: ignore[misc]
    """The torch.func reference on each step's micro-batches, at the monitor's θ."""

    def __init__(self, cb: NoetherTrainerCallback) -> None:
        self.cb, self.flows, self.batch, self.lrs = cb, [], [], []
        self.on = True

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.opt = kw["optimizer"]
        kw["model"].register_forward_pre_hook(self.keep, with_kwargs=True)

    def keep(self, mod: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if self.on and torch.is_grad_enabled():
            self.batch.append((kwargs["input_ids"], kwargs["labels"]))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        ids = torch.cat([b[0] for b in self.batch])
        labels = torch.cat([b[1] for b in self.batch])
        self.batch = []
        mon = self.cb.monitor
        assert mon is not None
        lr = self.opt.param_groups[0]["lr"]
        self.lrs.append(lr)
        if lr == 0:
            self.flows.append(None)
            return
        self.on = False
        st = nf.collect_stats(
            kw["model"], mon.syms, lm_loss, {"input_ids": ids}, labels, estimator="reference"
        )
        self.on = True
        self.flows.append(nf.noether_flow(mon.syms, st, lr=lr, batch_size=len(ids)))


def test_trainer_with_accumulation_warmup_and_padding_records_the_reference_flows(
    tmp_path: Any,
) -> None:
    model = gpt2()
    cb = NoetherTrainerCallback(every=1, distance=False)
    ref = Reference(cb)
    args = T.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        max_steps=4,
        learning_rate=0.05,
        optim="sgd",
        warmup_steps=2,
        lr_scheduler_type="linear",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = T.Trainer(model=model, args=args, train_dataset=Padded(), callbacks=[cb, ref])
    with pytest.warns(RuntimeWarning, match="lr is 0"):
        trainer.train()
    mon = cb.monitor
    assert mon is not None
    h = mon.history
    assert h["step"].tolist() == [0, 1, 2, 3]
    assert h["undefined"].tolist() == [1, 0, 0, 0]  # warmup: lr = 0 at the first step
    np.testing.assert_allclose(h["lr"], ref.lrs, rtol=0)
    checked = 0
    for i, want in enumerate(ref.flows):
        if want is None:
            continue
        for name, key in mon.keys.items():
            got, w = h[f"flow/{key}"][i], want[name].numpy()
            w = w if np.ndim(got) else np.linalg.norm(w)
            # HF's ForCausalLMLoss casts the logits to float32 (`logits.float()`), so the
            # Trainer's gradients are float32-exact; the float64 accumulation itself is
            # checked to 1e-8 in test_monitor_recipes.
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-12 * np.abs(w).max())
            checked += 1
    assert checked == 3 * len(mon.keys)
    assert np.isfinite(h["loss"]).all()
    logged = [
        e
        for e in trainer.state.log_history
        if "noether/charge/" + next(iter(mon.keys.values())) in str(e.keys())
        or any(k.startswith("noether/") for k in e)
    ]
    assert [e["step"] for e in logged] == [0, 1, 2, 3]


def test_trainer_adamw_with_no_decay_groups_warmup_and_accumulation(tmp_path: Any) -> None:
    """HF's default AdamW (biases and LayerNorm weights in a weight_decay=0 group), warmup,
    accumulation: the run completes; charges and the exact step decomposition are recorded,
    no SGD flow (said once)."""
    cb = NoetherTrainerCallback(every=1)
    args = T.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=3,
        learning_rate=1e-3,
        weight_decay=0.1,
        warmup_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        logging_steps=1,
    )
    trainer = T.Trainer(model=gpt2(), args=args, train_dataset=Padded(), callbacks=[cb])
    groups = None
    with pytest.warns(UserWarning, match="NoetherMonitor with AdamW") as caught:
        trainer.train()
        groups = {g["weight_decay"] for g in trainer.optimizer.param_groups}
    assert groups == {0.0, 0.1}
    assert sum("NoetherMonitor" in str(w.message) for w in caught) == 1
    mon = cb.monitor
    assert mon is not None
    h = mon.history
    assert h["step"].tolist() == [0, 1, 2]
    assert h["lr"][0] == 0.0 and h["lr"][1] == pytest.approx(1e-3)
    assert not any(k.startswith(("flow/", "distance/")) for k in h)
    for key in mon.keys.values():
        assert np.isfinite(h[f"charge/{key}"]).all()
        assert np.isfinite(h[f"step_drift/{key}"][1:]).all()  # the AdamW steps before rows 1, 2


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_records(reentrant: bool) -> None:
    """``gradient_checkpointing_enable()`` recomputes the forward in the backward pass: the
    hooks ignore the recompute (it raised "ran twice" before) and the flows are unchanged."""
    model = gpt2().train()
    ids = Padded().ids[:6]
    syms = nf.find_symmetries(model, {"input_ids": ids})

    def flows() -> dict[str, np.ndarray]:
        mon = nf.NoetherMonitor(model, syms, every=1, lr=0.1, batch_size=6, distance=False)
        model.zero_grad(set_to_none=True)
        with mon.track():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        return {k: np.asarray(v) for k, v in row.items() if k.startswith("flow/")}

    plain = flows()
    kw = {"use_reentrant": reentrant}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*requires_grad=True.*")  # reentrant note
        checkpointed = flows()
    for k, v in plain.items():
        np.testing.assert_allclose(checkpointed[k], v, rtol=1e-12, atol=0)


def test_attach_hands_the_records_to_the_reporters(tmp_path: Any) -> None:
    """The Trainer calls its reporters before the callbacks given to it; after
    ``cb.attach(trainer)`` a reporter's ``on_log`` carries the record of that step."""

    class Reporter(T.TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.logs: list[dict[str, float]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            self.logs.append(dict(logs))

    rep = Reporter()
    cb = NoetherTrainerCallback(every=1, distance=False)
    args = T.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=0.05,
        optim="sgd",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
    )
    trainer = T.Trainer(model=gpt2(), args=args, train_dataset=Padded(), callbacks=[rep, cb])
    cb.attach(trainer)
    trainer.train()
    steps = [e for e in rep.logs if "noether/lr" in e]
    assert len(steps) == 2 and all(e["noether/lr"] == e["learning_rate"] for e in steps)
