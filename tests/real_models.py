"""Small real architectures for tests/test_real_models.py and benchmarks/zoo.py.

Every factory returns ``(model, example_inputs)`` built from a tiny config (random init, no
weights downloaded). Hugging Face ``transformers`` builds GPT-2, BERT, Llama, ViT, ResNet,
ConvNeXt and Mamba; PyTorch builds its own transformer layers; the timm-style attention with a
fused ``qkv`` Linear and ``reshape``/``unbind`` and a MobileNet-style ReLU6 block are written
out here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Factory = Callable[[], tuple[nn.Module, Any]]


def gpt2(**config: Any) -> tuple[nn.Module, Any]:
    """GPT-2 (``Conv1D``, fused ``c_attn``); ``config`` overrides ``GPT2Config`` entries."""
    import transformers as T

    cfg = T.GPT2Config(
        **{
            "n_layer": 1,
            "n_embd": 16,
            "n_head": 2,
            "vocab_size": 32,
            "n_positions": 16,
            "bos_token_id": 0,
            "eos_token_id": 0,
            **config,
        }
    )
    return T.GPT2Model(cfg), torch.randint(0, 32, (2, 5))


def bert() -> tuple[nn.Module, Any]:
    import transformers as T

    cfg = T.BertConfig(
        num_hidden_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=32,
        max_position_embeddings=16,
    )
    return T.BertModel(cfg), torch.randint(0, 32, (2, 5))


def llama(**config: Any) -> tuple[nn.Module, Any]:
    """Llama-style: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention (4 q, 2 kv).

    ``config`` overrides entries of the ``LlamaConfig`` (e.g. ``attn_implementation``).
    """
    import transformers as T

    cfg = T.LlamaConfig(
        **{
            "num_hidden_layers": 1,
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 24,
            "vocab_size": 32,
            "max_position_embeddings": 16,
            **config,
        }
    )
    return T.LlamaModel(cfg), torch.randint(0, 32, (2, 5))


def vit() -> tuple[nn.Module, Any]:
    import transformers as T

    cfg = T.ViTConfig(
        num_hidden_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=8,
        patch_size=4,
        num_channels=3,
    )
    return T.ViTModel(cfg), torch.randn(2, 3, 8, 8)


def resnet() -> tuple[nn.Module, Any]:
    import transformers as T

    cfg = T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return T.ResNetModel(cfg), torch.randn(4, 3, 16, 16)


def convnext() -> tuple[nn.Module, Any]:
    import transformers as T

    cfg = T.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)
    return T.ConvNextModel(cfg), torch.randn(2, 3, 16, 16)


def encoder_layer() -> tuple[nn.Module, Any]:
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True), torch.randn(
        2, 5, 16
    )


def transformer() -> tuple[nn.Module, Any]:
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.1, batch_first=True)
    return model, (torch.randn(2, 5, 16), torch.randn(2, 4, 16))


class FusedQKVAttention(nn.Module):
    """timm-style attention: one fused ``qkv`` Linear, reshape, permute and unbind."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


def fused_qkv() -> tuple[nn.Module, Any]:
    return FusedQKVAttention(), torch.randn(2, 5, 16)


class ReLU6Block(nn.Module):
    """MobileNet-style: conv → BN → ReLU6 → conv → BN → ReLU → head (ReLU6 is not homogeneous)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu6(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def relu6_block() -> tuple[nn.Module, Any]:
    return ReLU6Block(), torch.randn(4, 3, 8, 8)


def mamba() -> tuple[nn.Module, Any]:
    """Mamba (selective scan): x_proj split into Δ, B, C; ``dt_proj.weight`` read by a matmul."""
    import transformers as T

    cfg = T.MambaConfig(
        num_hidden_layers=1,
        hidden_size=16,
        vocab_size=32,
        state_size=4,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
        use_cache=False,
    )
    return T.MambaModel(cfg), torch.randint(0, 32, (2, 5))


MODELS: dict[str, Factory] = {
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "vit": vit,
    "resnet": resnet,
    "convnext": convnext,
    "encoder_layer": encoder_layer,
    "transformer": transformer,
    "fused_qkv": fused_qkv,
    "relu6_block": relu6_block,
    "mamba": mamba,
}
