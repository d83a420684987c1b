"""Hugging Face parity for two mixture-of-experts families, Mixtral and OLMoE (QK-norm, top-k
weights unnormalised): a tiny seeded `MixtralForCausalLM` / `OlmoeForCausalLM` that transformers
builds and saves loads into our GPT (rotary positions, RMSNorm, experts in every block) with its
logits, the routers' choices and greedy decoding, Mixtral in both layouts of the experts' weights;
our export loads back into transformers with the same logits; configs we would not reproduce are
refused by name."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import zoo
from nlp.gpt import GPT
from nlp.hf_moe import moe_config_from_hf
from zoo.hf import export_hf
from zoo.nn.moe import MoEFeedForward
from zoo.parity import relative_error

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=32, rope_theta=500.0,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {"mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, {"num_local_experts": 4}),
            "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM, {"num_experts": 4})}
EXPERTS, TOP_K = 4, CONFIG["num_experts_per_tok"]


def hf_config(family: str, **overrides):
    config_class, _, experts = FAMILIES[family]
    return config_class(**{**CONFIG, **experts, **overrides})


def hf_mixtral(tmp_path, family: str = "mixtral", **overrides):
    """A seeded tiny model of `family` with non-trivial norms, saved by transformers."""
    torch.manual_seed(0)
    model = FAMILIES[family][1](hf_config(family, **overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(tmp_path / family)
    return model, tmp_path / family


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(seed))


def routed_experts(model: GPT) -> list[torch.Tensor]:
    """Each MoE layer's assignments per expert of the last forward."""
    return [m.expert_counts for m in model.modules() if isinstance(m, MoEFeedForward)]


def hf_routed_experts(hf_model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's assignments per expert, from the router logits transformers returns."""
    logits = hf_model(tokens, output_router_logits=True).router_logits
    top = [layer.softmax(-1).topk(TOP_K, -1).indices.flatten() for layer in logits]
    return [torch.bincount(chosen, minlength=EXPERTS) for chosen in top]


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_with_transformers_logits_router_choices_and_greedy_tokens(tmp_path, family):
    hf_model, folder = hf_mixtral(tmp_path, family)
    model = zoo.load(folder).eval()
    assert isinstance(model, GPT) and model.config.positions == "rotary" and model.config.n_experts == 4
    assert model.config.rope_theta == 500.0 and not model.config.tie_embeddings
    olmoe = family == "olmoe"  # QK-norm, top-k weights left unnormalised
    assert (model.config.qk_norm, model.config.moe_normalize_top_k) == (olmoe, not olmoe)
    tokens = ids(1)
    with torch.no_grad():
        theirs, ours = hf_model(tokens).logits, model(tokens)["logits"]
        assert relative_error(ours, theirs) < 1e-5
        assert [c.tolist() for c in routed_experts(model)] == [c.tolist() for c in hf_routed_experts(hf_model, tokens)]
        # Decoding with our KV cache (rotary angles from the cached length on) gives transformers' greedy tokens.
        generated = model.generate(tokens[:1, :6], max_new_tokens=8, temperature=0.0)
        expected = hf_model.generate(tokens[:1, :6], max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert generated.tolist() == expected.tolist()


def test_mixtral_of_the_published_per_expert_layout_loads_alike(tmp_path):
    """The checkpoints published before transformers 5 store block_sparse_moe.experts.N.w1/w3/w2."""
    hf_model, folder = hf_mixtral(tmp_path)
    stored = load_file(str(folder / "model.safetensors"))
    legacy = {}
    for name, tensor in stored.items():
        if ".mlp.experts.gate_up_proj" in name:
            stem = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            for expert, (gate, up) in enumerate(zip(*tensor.chunk(2, 1))):
                legacy[f"{stem}.{expert}.w1.weight"], legacy[f"{stem}.{expert}.w3.weight"] = gate.clone(), up.clone()
        elif ".mlp.experts.down_proj" in name:
            stem = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts")
            for expert, down in enumerate(tensor):
                legacy[f"{stem}.{expert}.w2.weight"] = down.clone()
        else:
            legacy[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = tensor
    save_file(legacy, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokens = ids(2)
    with torch.no_grad():
        assert relative_error(zoo.load(folder).eval()(tokens)["logits"], hf_model(tokens).logits) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_our_export_is_a_folder_transformers_loads_with_the_same_logits(tmp_path, family):
    hf_model, folder = hf_mixtral(tmp_path, family)
    model = zoo.load(folder)
    with torch.no_grad():  # trained-looking weights: the export must carry ours, not the import's
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    export_hf(model, tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["architectures"] == [FAMILIES[family][1].__name__]
    reloaded = FAMILIES[family][1].from_pretrained(tmp_path / "exported").eval()
    tokens = ids(3)
    with torch.no_grad():
        assert relative_error(reloaded(tokens).logits, model.eval()(tokens)["logits"]) < 1e-5


def test_configs_we_would_not_reproduce_are_refused():
    base = hf_config("mixtral").to_dict()
    for key, value, message in (("router_jitter_noise", 0.1, "mixtral config router_jitter_noise=0.1"),
                                ("hidden_act", "gelu", "hidden_act='gelu'"),
                                ("sliding_window", 8, "sliding_window=8"),
                                ("attention_dropout", 0.1, "attention_dropout=0.1")):
        with pytest.raises(ValueError, match=message):
            moe_config_from_hf({**base, key: value})
    olmoe = hf_config("olmoe").to_dict()
    for key, value in (("clip_qkv", 8.0), ("attention_bias", True)):
        with pytest.raises(ValueError, match=f"olmoe config {key}={value!r}"):
            moe_config_from_hf({**olmoe, key: value})
    dense = GPT(moe_config_from_hf(base).__class__(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8,
                                                   positions="rotary", norm="rms", bias=False))
    with pytest.raises(ValueError, match="GPT-2 has biases.*positions='rotary'"):
        export_hf(dense, "/nonexistent")
