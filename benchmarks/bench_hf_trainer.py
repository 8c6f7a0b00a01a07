"""Cost of ``NoetherTrainerCallback`` in a ``transformers.Trainer`` run (issue #31).

A GPT-2 from a config (nothing downloaded) trained by ``Trainer`` on right-padded token
sequences with gradient accumulation and a warmup, once without and once with the callback,
side by side: the two runs alternate (order rotated every repetition, each a fresh Trainer on
the same initial weights), and the ratio of the median ``trainer.train()`` times (and of the
fastest repetitions) is printed, and the monitor's own time in the run (the sum of its rows'
``monitor_time``: hooks' statistics, flows, the record) over the plain run's, which the
load on a shared machine disturbs less than a ratio of two runs. The symmetries are found
before each monitored run and timed apart (a one-time cost the callback otherwise pays at
``on_train_begin``). Configurations (``--configs``):

* ``adamw`` — the Trainer's default AdamW (a no-decay group for biases and LayerNorm
  weights): charges, the step decomposition (no SGD flows exist for AdamW);
* ``sgd`` — ``optim="sgd"``: charges and flows at every record (``distance=False``);
* ``sgd-distance`` — the same with the distance to equilibrium every record (the coupled
  rotation solve of every attention head; expensive).

    python benchmarks/bench_hf_trainer.py                    # adamw and sgd, every=10
    python benchmarks/bench_hf_trainer.py --every 1 --configs adamw,sgd,sgd-distance

A report, not a test: no exit status from the ratios.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("adamw_torch", {}),
    "sgd": ("sgd", {"distance": False}),
    "sgd-distance": ("sgd", {"distance": "every"}),  # DistanceOptions(every=every): every record
}


class Padded(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Counting sequences of L/2..L tokens, right-padded; labels -100 on the padding."""

    def __init__(self, n: int, vocab: int, length: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(length)) % vocab
        self.lens = torch.randint(length // 2, length + 1, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, labels = self.ids[i].clone(), self.ids[i].clone()
        ids[self.lens[i] :], labels[self.lens[i] :] = 0, -100
        return {"input_ids": ids, "labels": labels}


def run(
    model: Any, optim: str, steps: int, every: int, options: dict[str, Any] | None
) -> tuple[float, float, float]:
    """Seconds of one ``trainer.train()`` (``options=None``: no callback), of detection and
    the monitor's own time in the run (the sum of its rows' ``monitor_time``).

    The symmetries are found before the Trainer starts (timed apart: a one-time cost that
    ``NoetherTrainerCallback`` otherwise pays at ``on_train_begin``) and passed as ``syms=``.
    """
    import transformers as T

    import noetherflow as nf
    from noetherflow.integrations.transformers import NoetherTrainerCallback

    detect = 0.0
    if options is not None:
        t0 = time.perf_counter()
        ids = Padded(8, model.config.vocab_size, model.config.n_positions).ids[:8]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            options = {**options, "syms": nf.find_symmetries(model, {"input_ids": ids})}
        detect = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as out:
        args = T.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=2,
            max_steps=steps,
            learning_rate=1e-3,
            weight_decay=0.01,
            warmup_steps=2,
            optim=optim,
            logging_steps=every,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            log_level="error",
        )
        vocab, length = model.config.vocab_size, model.config.n_positions
        cbs = [] if options is None else [NoetherTrainerCallback(every=every, **options)]
        trainer = T.Trainer(
            model=model, args=args, train_dataset=Padded(512, vocab, length), callbacks=cbs
        )
        trainer.remove_callback(T.trainer_callback.PrinterCallback)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the AdamW and lr = 0 notices
            trainer.train()
        secs = time.perf_counter() - t0
        own = float(cbs[0].monitor.history["monitor_time"].sum()) if cbs else 0.0
        return secs, detect, own


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    import transformers as T

    import noetherflow as nf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="adamw,sgd")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="toy sizes (the smoke test)")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    width, layers, length = (16, 1, 12) if a.tiny else (128, 2, 64)
    config = T.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=4,
        vocab_size=128,
        n_positions=length,
        bos_token_id=0,
        eos_token_id=0,
    )
    base = T.GPT2LMHeadModel(config)
    print(
        f"GPT-2 {layers} layers, width {width}, batch 8 × {length} tokens, accumulation 2, "
        f"{a.steps} steps, every={a.every}, {a.reps} repetitions, "
        f"{torch.get_num_threads()} threads"
    )
    results: dict[str, dict[str, float]] = {}
    for name in a.configs.split(","):
        optim, options = CONFIGS[name]
        options = {
            k: nf.DistanceOptions(every=a.every) if v == "every" else v for k, v in options.items()
        }
        times: dict[str, list[float]] = {"plain": [], "monitored": []}
        detect: list[float] = []
        own: list[float] = []
        for r in range(a.reps):
            order = ["plain", "monitored"][:: 1 if r % 2 == 0 else -1]
            for which in order:
                opts = None if which == "plain" else options
                secs, found, mine = run(copy.deepcopy(base), optim, a.steps, a.every, opts)
                times[which].append(secs)
                if opts is not None:
                    detect.append(found)
                    own.append(mine)
        med = {k: statistics.median(v) for k, v in times.items()}
        res = {
            "plain_s": med["plain"],
            "monitored_s": med["monitored"],
            "ratio": med["monitored"] / med["plain"],
            "ratio_min": min(times["monitored"]) / min(times["plain"]),
            "detect_s": statistics.median(detect),
            "records_over_plain": statistics.median(own) / med["plain"],
        }
        results[name] = res
        print(
            f"{name:>13}: plain {res['plain_s']:.2f} s, monitored {res['monitored_s']:.2f} s, "
            f"× {res['ratio']:.3f} (fastest: × {res['ratio_min']:.3f}); "
            f"records' monitor_time / plain {res['records_over_plain']:.3f}; "
            f"symmetry detection once: {res['detect_s']:.2f} s"
        )
    return results


if __name__ == "__main__":
    main()
