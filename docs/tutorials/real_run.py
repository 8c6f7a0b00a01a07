"""Tutorial: monitor a real run — the Hugging Face Trainer and Lightning, as people train.

Two runs with every recipe the monitor must survive, each in a few lines:

1. A small GPT-2 (from a config: nothing is downloaded) trained by ``transformers.Trainer``
   with its defaults: AdamW whose biases and LayerNorm weights sit in a ``weight_decay=0``
   group, a linear warmup from lr = 0, gradient accumulation, right-padded sequences with
   labels at -100, and bf16 autocast. ``NoetherTrainerCallback(every=N)`` finds the
   symmetries, reads the optimizer (through accelerate's wrapper) and merges the
   micro-batches of each step. Under AdamW it records charges, the exact decomposition of
   every recorded optimizer step and, for scale-invariant symmetries, AdamW's predicted
   equilibrium (none in GPT-2); SGD's flows and distances are not defined for AdamW.
2. A Lightning MLP with SGD + momentum, ``accumulate_grad_batches=2``,
   ``precision="bf16-mixed"`` and a warmup from 0: flows and distances at every record but
   the first, which lr = 0 leaves undefined (``undefined`` = 1, one warning).

The script ends by checking numbers: in run 1 the monitor's lr at each record equals the lr
the Trainer logged for that step, and its charges are finite; in run 2 the first record is
marked undefined and every later one has finite flows and distances.

Run: ``python docs/tutorials/real_run.py [--tiny]``
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import numpy as np
import torch
from torch import nn

import noetherflow as nf


def hf_run(tiny: bool, out_dir: str) -> None:
    import transformers as T

    from noetherflow.integrations.transformers import NoetherTrainerCallback

    vocab, length = 40, 12
    torch.manual_seed(0)
    config = T.GPT2Config(
        n_layer=1 if tiny else 2,
        n_embd=32,
        n_head=4,
        vocab_size=vocab,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = T.GPT2LMHeadModel(config)

    class Padded(torch.utils.data.Dataset):  # type: ignore[type-arg]
        """Counting sequences of 5..12 tokens, right-padded; labels -100 on the padding."""

        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(length)) % vocab
            self.lens = torch.randint(5, length + 1, (n,), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids, labels = self.ids[i].clone(), self.ids[i].clone()
            ids[self.lens[i] :], labels[self.lens[i] :] = 0, -100
            return {"input_ids": ids, "labels": labels}

    steps = 4 if tiny else 20
    args = T.TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_steps=steps,
        learning_rate=3e-3,
        weight_decay=0.01,  # AdamW; HF puts biases and LayerNorm weights in a 0-decay group
        warmup_steps=2,
        bf16=True,  # autocast: the monitor forms its statistics in float32
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
    )
    cb = NoetherTrainerCallback(every=1 if tiny else 5)
    trainer = T.Trainer(model=model, args=args, train_dataset=Padded(256), callbacks=[cb])
    trainer.remove_callback(T.trainer_callback.ProgressCallback)  # a quiet page: no bar, no logs
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="NoetherMonitor with AdamW")
        trainer.train()

    mon = cb.monitor
    assert mon is not None
    h = mon.history
    decays = sorted({g["weight_decay"] for g in trainer.optimizer.param_groups})
    print(f"HF Trainer: AdamW groups with weight_decay {decays}, {len(mon.keys)} symmetries")
    print(f"records at steps {h['step'].tolist()}, lr {np.round(h['lr'], 5).tolist()}")
    key = next(iter(mon.keys.values()))
    print(
        f"{key}: charge {h[f'charge/{key}'][-1].mean():.4f}, "
        f"last step's decay part {h[f'step_decay/{key}'][-1].mean():.2e}"
    )
    logged = {e["step"]: e["learning_rate"] for e in trainer.state.log_history if "loss" in e}
    # the Trainer logs at global_step after the step (1-based), the monitor at its index
    assert all(logged[int(s) + 1] == lr for s, lr in zip(h["step"], h["lr"], strict=True))
    assert np.isfinite(h[f"charge/{key}"]).all()


def lightning_run(tiny: bool, out_dir: str) -> None:
    import lightning as L

    from noetherflow.integrations.lightning import NoetherCallback

    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x)))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self) -> dict[str, object]:
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
            warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 3))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x[:, :3].argmax(1) + (x[:, 3] > 1).long()) % 3
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    net = Net()
    cb = NoetherCallback(
        nf.find_symmetries(net, x[:8]), every=4, distance=nf.DistanceOptions(every=4)
    )
    trainer = L.Trainer(
        max_steps=12 if tiny else 64,
        accumulate_grad_batches=2,  # records are those of the 32 samples of each step
        precision="bf16-mixed",
        callbacks=[cb],
        logger=L.pytorch.loggers.CSVLogger(out_dir),
        log_every_n_steps=4,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*lr is 0.*")  # the one notice of step 0
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(net, loader)

    mon = cb.monitor
    assert mon is not None
    h = mon.history
    key = next(iter(mon.keys.values()))
    print(f"Lightning: batch size {mon.batch_size}, records at steps {h['step'].tolist()}")
    print(f"undefined {h['undefined'].astype(int).tolist()} (1: lr = 0 at the warmup's start)")
    print(
        f"{key}: max |dC/dt| {np.abs(h[f'flow/{key}'][-1]).max():.3e}, "
        f"max distance {h[f'distance/{key}'][-1].max():.3f}"
    )
    assert mon.batch_size == 32 and h["undefined"][0] == 1 and (h["undefined"][1:] == 0).all()
    assert np.isfinite(h[f"flow/{key}"][1:]).all() and np.isfinite(h[f"distance/{key}"][1:]).all()


def main(tiny: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="nf_real_run_") as out:
        hf_run(tiny, out)
        lightning_run(tiny, out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the size CI runs (seconds)")
    main(ap.parse_args().tiny)
