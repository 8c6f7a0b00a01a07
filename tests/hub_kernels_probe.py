"""Run by tests/test_hub_kernels.py in a fresh process: ``python hub_kernels_probe.py on|off``.

``off`` hides the ``kernels`` package from ``transformers`` before it is imported. Prints one
JSON line: whether Llama's ``apply_rotary_pos_emb`` is a hub-kernel module, and per model the
symmetries found and the warnings of ``find_symmetries``.
"""

from __future__ import annotations

import json
import sys
import warnings

if sys.argv[1] == "off":
    sys.modules["kernels"] = None  # type: ignore[assignment]  # find_spec → None

import torch
import transformers as T
import transformers.models.llama.modeling_llama as llama

import noetherflow as nf

MODELS = {
    "llama": (T.LlamaConfig, T.LlamaModel),
    "mistral": (T.MistralConfig, T.MistralModel),
    "qwen2": (T.Qwen2Config, T.Qwen2Model),
}
found = {}
for name, (config, model_cls) in MODELS.items():
    cfg = config(
        num_hidden_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    model = model_cls(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        syms = nf.find_symmetries(model, torch.randint(0, 32, (2, 5)))
    found[name] = {
        "names": sorted(syms.names),
        "verified": all(r.verified for r in syms.verification.values()),
        "warnings": [str(w.message)[:200] for w in caught],
    }
# Mamba (its scan functions are hub-kernel wrappers too): eval and train mode
mamba_cfg = T.MambaConfig(
    num_hidden_layers=1,
    hidden_size=16,
    vocab_size=32,
    state_size=4,
    expand=2,
    conv_kernel=4,
    time_step_rank=4,
    use_cache=False,
)
torch.manual_seed(0)
mamba = T.MambaModel(mamba_cfg).double()
mamba_found = {}
for mode in ("eval", "train"):
    mamba.train(mode == "train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        msyms = nf.find_symmetries(mamba, torch.randint(0, 32, (2, 5)))
    mamba_found[mode] = {
        "names": sorted(msyms.names),
        "verified": all(r.verified for r in msyms.verification.values()),
    }
wrapped = isinstance(llama.apply_rotary_pos_emb, torch.nn.Module)
print(json.dumps({"wrapped": wrapped, "models": found, "mamba": mamba_found}))
