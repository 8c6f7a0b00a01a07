"""Hugging Face model types from tiny configs, for benchmarks/zoo.py and tests (issue 26).

Each factory returns ``(model, make_inputs)``: ``make_inputs(seed)`` draws a fresh batch, so
a claim can be checked on inputs detection has not seen. Random init, nothing downloaded.
Text models get ``input_ids`` (and nothing else); vision models ``pixel_values``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Inputs = Callable[[int], Any]
Factory = Callable[[], tuple[nn.Module, Inputs]]

V = 32  # vocabulary
H = 16  # hidden size


def _ids(seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, V, (2, 5), generator=g)}


def _pixels(size: int, channels: int = 3) -> Inputs:
    def make(seed: int) -> Any:
        g = torch.Generator().manual_seed(seed)
        return {
            "pixel_values": torch.randn(2, channels, size, size, generator=g, dtype=torch.float64)
        }

    return make


def _text(model_cls: str, cfg_cls: str, **cfg: Any) -> Factory:
    def build() -> tuple[nn.Module, Inputs]:
        import transformers as T

        config = getattr(T, cfg_cls)(**cfg)
        return getattr(T, model_cls)(config), _ids

    return build


def _vision(model_cls: str, cfg_cls: str, size: int, **cfg: Any) -> Factory:
    def build() -> tuple[nn.Module, Inputs]:
        import transformers as T

        config = getattr(T, cfg_cls)(**cfg)
        return getattr(T, model_cls)(config), _pixels(size)

    return build


_DEC = {"num_hidden_layers": 1, "hidden_size": H, "vocab_size": V, "max_position_embeddings": 16}
_LLAMA = {**_DEC, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24}
_BERT = {**_DEC, "num_attention_heads": 2, "intermediate_size": 32}

MODELS: dict[str, Factory] = {
    "gpt2": _text(
        "GPT2Model", "GPT2Config", n_layer=1, n_embd=H, n_head=2, vocab_size=V, n_positions=16
    ),
    "bert": _text("BertModel", "BertConfig", **_BERT),
    "roberta": _text("RobertaModel", "RobertaConfig", **_BERT, pad_token_id=1),
    "electra": _text("ElectraModel", "ElectraConfig", **_BERT, embedding_size=H),
    "distilbert": _text(
        "DistilBertModel",
        "DistilBertConfig",
        n_layers=1,
        dim=H,
        n_heads=2,
        hidden_dim=32,
        vocab_size=V,
        max_position_embeddings=16,
    ),
    "albert": _text("AlbertModel", "AlbertConfig", **_BERT, embedding_size=8),
    "deberta": _text("DebertaModel", "DebertaConfig", **_BERT),  # q_bias/v_bias stored apart
    "deberta-v2": _text("DebertaV2Model", "DebertaV2Config", **_BERT),
    "deberta-v2-rel": _text(
        "DebertaV2Model",
        "DebertaV2Config",
        **_BERT,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=4,
        max_relative_positions=8,
        embedding_size=8,  # embed_proj: Embedding → Linear
        conv_kernel_size=3,  # a ConvLayer after the first layer
        conv_groups=2,
        norm_rel_ebd="layer_norm",
    ),
    "deberta-v2-shared": _text(  # DeBERTa-v3's layout: key_proj/query_proj read the positions
        "DebertaV2Model",
        "DebertaV2Config",
        **_BERT,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=4,
        max_relative_positions=8,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
    ),
    "llama": _text("LlamaModel", "LlamaConfig", **_LLAMA),
    "mistral": _text("MistralModel", "MistralConfig", **_LLAMA),
    "qwen2": _text("Qwen2Model", "Qwen2Config", **_LLAMA),
    "gemma": _text("GemmaModel", "GemmaConfig", **_LLAMA, head_dim=4),
    "phi": _text("PhiModel", "PhiConfig", **_LLAMA, partial_rotary_factor=0.5),
    "gpt-neox": _text(
        "GPTNeoXModel", "GPTNeoXConfig", **_BERT, rotary_pct=0.5, use_parallel_residual=True
    ),
    "gpt-j": _text(
        "GPTJModel",
        "GPTJConfig",
        n_layer=1,
        n_embd=H,
        n_head=2,
        vocab_size=V,
        rotary_dim=4,
        n_positions=16,
    ),
    "opt": _text(
        "OPTModel",
        "OPTConfig",
        num_hidden_layers=1,
        hidden_size=H,
        num_attention_heads=2,
        ffn_dim=32,
        vocab_size=V,
        max_position_embeddings=16,
        word_embed_proj_dim=H,
    ),
    "bloom": _text("BloomModel", "BloomConfig", n_layer=1, hidden_size=H, n_head=2, vocab_size=V),
    "falcon": _text(
        "FalconModel",
        "FalconConfig",
        num_hidden_layers=1,
        hidden_size=H,
        num_attention_heads=2,
        vocab_size=V,
        new_decoder_architecture=False,
    ),
    "t5": _text(
        "T5EncoderModel",
        "T5Config",
        num_layers=1,
        d_model=H,
        d_kv=8,
        num_heads=2,
        d_ff=32,
        vocab_size=V,
    ),
    "mamba": _text(
        "MambaModel",
        "MambaConfig",
        num_hidden_layers=1,
        hidden_size=H,
        vocab_size=V,
        state_size=4,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
        use_cache=False,
    ),
    "vit": _vision(
        "ViTModel",
        "ViTConfig",
        8,
        num_hidden_layers=1,
        hidden_size=H,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=8,
        patch_size=4,
    ),
    "resnet": _vision(
        "ResNetModel",
        "ResNetConfig",
        16,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
    ),
    "regnet": _vision(  # grouped 3×3 convolutions (group width 4) between BatchNorms
        "RegNetModel",
        "RegNetConfig",
        16,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        groups_width=4,
        layer_type="x",
    ),
    "convnext": _vision(
        "ConvNextModel", "ConvNextConfig", 16, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2
    ),
    "convnextv2": _vision(
        "ConvNextV2Model",
        "ConvNextV2Config",
        16,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        num_stages=2,
    ),
}


# -- the independent check ----------------------------------------------------------------

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps")


def _set_eps(model: nn.Module, value: float | None, saved: dict[Any, float]) -> None:
    """Every float eps attribute set to ``value`` (None: back to ``saved``)."""
    for m in model.modules():
        for attr in _EPS_ATTRS:
            v = getattr(m, attr, None)
            if value is None and (m, attr) in saved:
                setattr(m, attr, saved[(m, attr)])
            elif value is not None and isinstance(v, float):
                saved[(m, attr)] = v
                setattr(m, attr, value)


def _flat(out: Any) -> torch.Tensor:
    from noetherflow.symmetry._fx.capture import flat_outputs

    return flat_outputs(out).double()


def independent_change(
    model: nn.Module, sym: Any, inputs: Any, train: bool, zero_eps: bool, seed: int = 0
) -> float:
    """Relative output change of ``model`` (float64) under a random element of ``sym``.

    Written apart from the library's checker: the model is run as is (its mode ``train``,
    dropout seeded alike before and after), the element drawn from ``seed``; with
    ``zero_eps`` every normalisation eps attribute is ~0 (1e-300: BatchNorm refuses 0).
    Parameters and buffers are restored afterwards.
    """
    saved_eps: dict[Any, float] = {}
    was = model.training
    state = {k: v.clone() for k, v in model.state_dict().items()}
    kw = inputs if isinstance(inputs, dict) else None
    call = (lambda: model(**kw)) if kw is not None else (lambda: model(inputs))
    try:
        if zero_eps:
            _set_eps(model, 1e-300, saved_eps)
        model.train(train)
        with torch.no_grad():
            torch.manual_seed(seed)
            before = _flat(call())
            model.load_state_dict(state)
            sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(seed + 11)))
            torch.manual_seed(seed)
            after = _flat(call())
        return float((after - before).norm() / before.norm().clamp_min(1e-300))
    finally:
        _set_eps(model, None, saved_eps)
        model.load_state_dict(state)
        model.train(was)
