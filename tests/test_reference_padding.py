"""The reference estimator on a padded Hugging Face batch (issue #31).

GPT-2 branches on its attention mask, which ``vmap`` cannot run, so the reference takes each
sample's share of the batch loss one sample at a time (``contributions_loop``). With the loss
computed from the logits (labels as targets, ``ignore_index=-100``) it must equal the hooks
estimator in float64; with the loss computed inside the model over padded tokens the shares
are undefined and it must refuse instead of returning another quantity (28% off before).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import noetherflow as nf

T = pytest.importorskip("transformers")


def _padded() -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    cfg = T.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=32,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    m = T.GPT2LMHeadModel(cfg).double().eval()
    ids = torch.randint(1, 32, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[0, 4:], mask[2, 3:] = 0, 0
    labels = ids.masked_fill(mask == 0, -100)
    return m, {"input_ids": ids, "attention_mask": mask}, labels


def _lm_loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), y[:, 1:].flatten(), ignore_index=-100)


def test_padded_batch_reference_equals_hooks() -> None:
    m, batch, labels = _padded()
    with pytest.warns(nf.BranchWarning):  # the mask check is a branch on the inputs
        syms = nf.find_symmetries(m, batch)
    h = nf.collect_stats(m, syms, _lm_loss, batch, labels)
    r = nf.collect_stats(m, syms, _lm_loss, batch, labels, estimator="reference")
    assert len(h.sq) > 0
    for p in h.mean:
        assert torch.allclose(h.mean[p], r.mean[p], rtol=1e-10, atol=1e-14)
    for p in h.sq:
        assert torch.allclose(h.sq[p], r.sq[p], rtol=1e-10, atol=1e-14)


def test_in_model_loss_over_padded_tokens_is_refused() -> None:
    m, batch, labels = _padded()
    with pytest.warns(nf.BranchWarning):
        syms = nf.find_symmetries(m, batch)
    with pytest.raises(nf.StatisticsError, match="loss computed inside the model"):
        nf.collect_stats(
            m, syms, lambda o, _: o.loss, {**batch, "labels": labels}, None, estimator="reference"
        )
