"""A zoo of small models for the symmetry-detection tests (tests/test_detect.py).

Each factory returns ``(model, example_inputs)``; sizes are tiny so that every test runs in
well under a second on a CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def mlp() -> tuple[nn.Module, Tensor]:
    """Linear → ReLU → Linear → LeakyReLU(0.3) → Dropout → Linear (all in a Sequential)."""
    net = nn.Sequential(
        nn.Linear(4, 6),
        nn.ReLU(),
        nn.Linear(6, 5),
        nn.LeakyReLU(0.3),
        nn.Dropout(0.2),
        nn.Linear(5, 3),
    )
    return net, torch.randn(8, 4)


class ResidualMLP(nn.Module):
    """fc1 → ReLU → fc2, then x + fc3(relu(fc2 ...)): the residual breaks fc3's rescaling."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 4)
        self.fc3 = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc2(F.relu(self.fc1(x)))
        h = h + self.fc3(torch.relu(h))
        return self.head(h)


def residual_mlp() -> tuple[nn.Module, Tensor]:
    return ResidualMLP(), torch.randn(8, 4)


class TanhMLP(nn.Module):
    """fc1 → tanh → fc2 → GELU → fc3: no exact symmetry at all (approximate only)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 5)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(5, 4)
        self.fc3 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc3(F.gelu(self.fc2(self.act(self.fc1(x)))))


def tanh_mlp() -> tuple[nn.Module, Tensor]:
    return TanhMLP(), torch.randn(8, 3)


class SmallCNN(nn.Module):
    """conv1 → BN → ReLU → MaxPool → conv2 → ReLU → MaxPool → flatten → fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 2 * 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


def small_cnn() -> tuple[nn.Module, Tensor]:
    return SmallCNN(), torch.randn(6, 2, 8, 8)


def vgg() -> tuple[nn.Module, Tensor]:
    """VGG-like: features (conv, ReLU, MaxPool) and a classifier behind nn.Flatten."""
    features = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 5, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
    classifier = nn.Sequential(
        nn.Flatten(),
        nn.Linear(5 * 2 * 2, 6),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(6, 3),
    )
    net = nn.Sequential()
    net.add_module("features", features)
    net.add_module("classifier", classifier)
    return net, torch.randn(4, 3, 8, 8)


class CausalSelfAttention(nn.Module):
    """GPT-style attention written by hand from nn.Linear, matmul and softmax."""

    def __init__(self, d: int, n_head: int, t_max: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(t_max, t_max)).view(1, 1, t_max, t_max))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q = self.q(x).view(B, T, self.n_head, hs).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_head, hs).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)); x + fc2(gelu(fc1(ln2(x))))."""

    def __init__(self, d: int = 8, n_head: int = 2, t_max: int = 5) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, t_max)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def gpt_block() -> tuple[nn.Module, Tensor]:
    return GPTBlock(), torch.randn(3, 5, 8)


class PackedAttention(nn.Module):
    """Attention with one packed c_attn Linear(d, 3d), split, and scaled_dot_product_attention."""

    def __init__(self, d: int = 8, n_head: int = 2) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def packed_attention() -> tuple[nn.Module, Tensor]:
    return PackedAttention(), torch.randn(2, 4, 8)


class MHABlock(nn.Module):
    """nn.MultiheadAttention (packed in_proj_weight), then a LayerNorm'd MLP head."""

    def __init__(self, d: int = 6, n_head: int = 3) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, n_head, batch_first=True)
        self.fc = nn.Linear(d, 4)
        self.ln = nn.LayerNorm(4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.mha(x, x, x)
        return self.out(self.ln(self.fc(y)))


def mha_block() -> tuple[nn.Module, Tensor]:
    return MHABlock(), torch.randn(2, 4, 6)


class TiedEmbeddings(nn.Module):
    """Embedding → Linear → ReLU → Linear → head with head.weight tied to the embedding."""

    def __init__(self, vocab: int = 7, d: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc1 = nn.Linear(d, 6)
        self.fc2 = nn.Linear(6, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(self.fc2(torch.relu(self.fc1(self.emb(idx)))))


def tied_embeddings() -> tuple[nn.Module, Tensor]:
    return TiedEmbeddings(), torch.randint(0, 7, (3, 5))


class Factorised(nn.Module):
    """A factorised layer U·W through a reshape keeping the feature axis, and w / ‖w‖."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(5, 3)
        self.u = nn.Linear(3, 4)
        self.g = nn.Parameter(torch.randn(2, 4))

    def forward(self, x: Tensor) -> Tensor:
        h = self.w(x).reshape(-1, 3)
        y = self.u(h)
        return y @ (self.g / self.g.norm()).T


def factorised() -> tuple[nn.Module, Tensor]:
    return Factorised(), torch.randn(2, 3, 5)


class GroupNormNet(nn.Module):
    """conv → GroupNorm → ReLU → conv (scale invariance of conv1), conv2 → BN in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(2, 4, 3)
        self.gn = nn.GroupNorm(2, 4)
        self.conv2 = nn.Conv1d(4, 3, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv2(F.relu(self.gn(self.conv1(x)))))


def group_norm_net() -> tuple[nn.Module, Tensor]:
    return GroupNormNet(), torch.randn(4, 2, 9)


class Untraceable(nn.Module):
    """Data-dependent control flow around two Sequentials: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        if h.sum() > 0:
            h = h * 2
        return self.head(h)


def untraceable() -> tuple[nn.Module, Tensor]:
    return Untraceable(), torch.randn(6, 3)


class NoSymmetry(nn.Module):
    """One Linear layer followed by tanh: nothing to find."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.fc(x))


def no_symmetry() -> tuple[nn.Module, Tensor]:
    return NoSymmetry(), torch.randn(4, 3)


class WithGRU(nn.Module):
    """An unsupported parametrised module (GRU) and a weight-normed Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(3, 4, batch_first=True)
        self.fc = nn.utils.parametrizations.weight_norm(nn.Linear(4, 4))
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.gru(x)
        return self.out(torch.relu(self.fc(y)))


def with_gru() -> tuple[nn.Module, Tensor]:
    return WithGRU(), torch.randn(2, 5, 3)


ZOO = {
    "mlp": mlp,
    "residual_mlp": residual_mlp,
    "tanh_mlp": tanh_mlp,
    "small_cnn": small_cnn,
    "vgg": vgg,
    "gpt_block": gpt_block,
    "packed_attention": packed_attention,
    "mha_block": mha_block,
    "tied_embeddings": tied_embeddings,
    "factorised": factorised,
    "group_norm_net": group_norm_net,
}
