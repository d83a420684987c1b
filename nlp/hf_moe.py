"""Hugging Face interop for two mixture-of-experts families: a `MixtralForCausalLM` or
`OlmoeForCausalLM` folder as our `GPT` with rotary positions, RMSNorm, no biases and a mixture of
experts in every block, and back. OLMoE adds QK-norm (`GPTConfig.qk_norm`) and leaves the router's
top-k weights unnormalised (`norm_topk_prob`); their names are otherwise Mixtral's.

Names are those stored in the safetensors files, with or without the `model.` prefix. Three
layouts of the experts are read: transformers 5's stacked `mlp.experts.gate_up_proj` (E, 2F, W:
gate's F rows, then up's) and `mlp.experts.down_proj` (E, W, F) beside the router `mlp.gate`;
OLMoE's per-expert `mlp.experts.N.{gate,up,down}_proj` beside `mlp.gate`; and Mixtral's
per-expert `block_sparse_moe.experts.N.{w1,w3,w2}` (gate, up, down) beside `block_sparse_moe.gate`
of the checkpoints published before transformers 5. The export writes the first. Ours stacks the experts as
(E, F, W) gate and up and (E, W, F) down (`zoo.nn.moe`).

The router's load-balancing loss weight is `router_aux_loss_coef`; a config our model would not
reproduce (router jitter, a sliding window shorter than the context, attention dropout or biases,
clipped q/k/v, another activation or head width) is refused, naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from nlp.gpt import GPT, GPTConfig
from zoo.hf import StateReader, read_hf_config, read_hf_state
from zoo.model_folder import write_model_folder

_ATTENTION = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "out"}
_NORMS = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}
_LEGACY_EXPERTS = {"w1": "gate", "w3": "up", "w2": "down"}
_QK_NORMS = {"q_norm": "q_norm", "k_norm": "k_norm"}
FAMILIES = {"mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM"}
"""model_type -> the transformers class of the family's causal LM."""


def _refuse_unless(hf: dict[str, Any], key: str, allowed: tuple, default: Any) -> None:
    value = hf.get(key, default)
    if value not in allowed:
        raise ValueError(f"{hf.get('model_type', 'mixtral')} config {key}={value!r} is not supported; expected one "
                         f"of {list(allowed)}")


def _rope_theta(hf: dict[str, Any]) -> float:
    parameters = hf.get("rope_parameters") or {}
    if parameters.get("rope_type", "default") != "default":
        raise ValueError(f"{hf.get('model_type')} config rope_parameters.rope_type={parameters['rope_type']!r} is not "
                         "supported; expected 'default'")
    return float(parameters.get("rope_theta", hf.get("rope_theta", 1e6)))


def moe_config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    """Our GPTConfig of a MixtralConfig or OlmoeConfig dict."""
    olmoe = hf.get("model_type") == "olmoe"
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    _refuse_unless(hf, "hidden_act", ("silu",), "silu")
    _refuse_unless(hf, "head_dim", (None, width // heads), None)
    _refuse_unless(hf, "router_jitter_noise", (0, 0.0), 0.0)
    _refuse_unless(hf, "attention_dropout", (0, 0.0), 0.0)
    _refuse_unless(hf, "attention_bias", (False,), False)
    _refuse_unless(hf, "clip_qkv", (None,), None)
    window = hf.get("sliding_window")
    if window is not None and window < hf["max_position_embeddings"]:
        raise ValueError(f"{hf.get('model_type')} config sliding_window={window} is not supported; expected None or at "
                         f"least max_position_embeddings={hf['max_position_embeddings']}")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"], n_layer=hf["num_hidden_layers"],
                     n_head=heads, n_kv_head=hf.get("num_key_value_heads") or heads, n_embd=width, dropout=0.0, bias=False,
                     positions="rotary", rope_theta=_rope_theta(hf), norm="rms", norm_eps=hf.get("rms_norm_eps", 1e-5),
                     qk_norm=olmoe, tie_embeddings=hf.get("tie_word_embeddings", False),
                     n_experts=hf["num_experts" if olmoe else "num_local_experts"], moe_top_k=hf["num_experts_per_tok"],
                     moe_hidden=hf["intermediate_size"], moe_normalize_top_k=hf.get("norm_topk_prob", not olmoe),
                     moe_balance_weight=hf.get("router_aux_loss_coef", 0.001))


def moe_state_from_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our GPT state dict from a Mixtral or OLMoE safetensors state (either layout of the experts)."""
    reader = StateReader(state)
    prefix = "model." if reader.has("model.embed_tokens.weight") else ""
    out = {"embeddings.word.weight": reader.take(f"{prefix}embed_tokens.weight"),
           "norm.weight": reader.take(f"{prefix}norm.weight")}
    if config.tie_embeddings:
        if reader.has("lm_head.weight") and not torch.equal(reader.take("lm_head.weight"), out["embeddings.word.weight"]):
            raise ValueError("lm_head.weight differs from the word embedding, but the config ties them")
    else:
        out["lm_head.weight"] = reader.take("lm_head.weight")
    for layer in range(config.n_layer):
        theirs, ours = f"{prefix}layers.{layer}", f"blocks.{layer}"
        for name, mine in _ATTENTION.items():
            out[f"{ours}.attn.{mine}.weight"] = reader.take(f"{theirs}.self_attn.{name}.weight")
        for name, mine in _NORMS.items():
            out[f"{ours}.{mine}.weight"] = reader.take(f"{theirs}.{name}.weight")
        for name, mine in _QK_NORMS.items() if config.qk_norm else ():
            out[f"{ours}.attn.{mine}.weight"] = reader.take(f"{theirs}.self_attn.{name}.weight")
        if reader.has(f"{theirs}.mlp.experts.gate_up_proj"):
            out[f"{ours}.mlp.router.weight"] = reader.take(f"{theirs}.mlp.gate.weight")
            gate_up = reader.take(f"{theirs}.mlp.experts.gate_up_proj")
            out[f"{ours}.mlp.experts.gate"], out[f"{ours}.mlp.experts.up"] = gate_up.chunk(2, 1)
            out[f"{ours}.mlp.experts.down"] = reader.take(f"{theirs}.mlp.experts.down_proj")
        elif reader.has(f"{theirs}.mlp.gate.weight"):
            out[f"{ours}.mlp.router.weight"] = reader.take(f"{theirs}.mlp.gate.weight")
            for mine in ("gate", "up", "down"):
                out[f"{ours}.mlp.experts.{mine}"] = torch.stack(
                    [reader.take(f"{theirs}.mlp.experts.{e}.{mine}_proj.weight") for e in range(config.n_experts)])
        else:
            moe = f"{theirs}.block_sparse_moe"
            out[f"{ours}.mlp.router.weight"] = reader.take(f"{moe}.gate.weight")
            for name, mine in _LEGACY_EXPERTS.items():
                out[f"{ours}.mlp.experts.{mine}"] = torch.stack([reader.take(f"{moe}.experts.{e}.{name}.weight")
                                                                 for e in range(config.n_experts)])
    reader.finish()
    return {name: tensor.contiguous() for name, tensor in out.items()}


def moe_from_hf(folder: str | os.PathLike) -> GPT:
    """Our GPT with the weights of a MixtralForCausalLM or OlmoeForCausalLM folder."""
    config = moe_config_from_hf(read_hf_config(folder))
    model = GPT(config)
    model.load_state_dict(moe_state_from_hf(read_hf_state(folder), config))
    return model


def is_hf_moe_shaped(config: GPTConfig) -> bool:
    """Whether `config` is a Mixtral or an OLMoE: rotary positions, RMSNorm, no biases, experts in
    every block and none shared."""
    return (config.positions == "rotary" and config.norm == "rms" and not config.bias and config.n_experts > 0
            and config.moe_every == 1 and config.n_shared_experts == 0)


def moe_to_hf(model: GPT, directory: str | os.PathLike) -> Path:
    """Write `model` (Mixtral-shaped: `is_hf_moe_shaped`, no dropout) as an OlmoeForCausalLM
    folder when it has QK-norm, else as a MixtralForCausalLM folder."""
    c = model.config
    family = "olmoe" if c.qk_norm else "mixtral"
    if not is_hf_moe_shaped(c) or c.dropout:
        raise ValueError(f"a Mixtral has rotary positions, RMSNorm, no biases, no dropout and experts in every block, "
                         f"none shared; this GPT has positions={c.positions!r}, norm={c.norm!r}, bias={c.bias}, "
                         f"dropout={c.dropout}, n_experts={c.n_experts}, moe_every={c.moe_every}, "
                         f"n_shared_experts={c.n_shared_experts}")
    ours = model.state_dict()
    state = {"model.embed_tokens.weight": ours["embeddings.word.weight"], "model.norm.weight": ours["norm.weight"]}
    if not c.tie_embeddings:
        state["lm_head.weight"] = ours["lm_head.weight"]
    for layer in range(c.n_layer):
        theirs, mine = f"model.layers.{layer}", f"blocks.{layer}"
        for name, our_name in _ATTENTION.items():
            state[f"{theirs}.self_attn.{name}.weight"] = ours[f"{mine}.attn.{our_name}.weight"]
        for name, our_name in _NORMS.items():
            state[f"{theirs}.{name}.weight"] = ours[f"{mine}.{our_name}.weight"]
        for name, our_name in _QK_NORMS.items() if c.qk_norm else ():
            state[f"{theirs}.self_attn.{name}.weight"] = ours[f"{mine}.attn.{our_name}.weight"]
        state[f"{theirs}.mlp.gate.weight"] = ours[f"{mine}.mlp.router.weight"]
        state[f"{theirs}.mlp.experts.gate_up_proj"] = torch.cat([ours[f"{mine}.mlp.experts.gate"],
                                                                    ours[f"{mine}.mlp.experts.up"]], 1)
        state[f"{theirs}.mlp.experts.down_proj"] = ours[f"{mine}.mlp.experts.down"]
    config = {"model_type": family, "architectures": [FAMILIES[family]], "vocab_size": c.vocab_size,
              "hidden_size": c.n_embd, "intermediate_size": c.moe_hidden or 4 * c.n_embd,
              "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
              "num_key_value_heads": c.n_kv_head or c.n_head, "hidden_act": "silu",
              "max_position_embeddings": c.block_size, "rms_norm_eps": c.norm_eps,
              "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"}, "rope_theta": c.rope_theta,
              "tie_word_embeddings": c.tie_embeddings, "num_local_experts" if family == "mixtral" else "num_experts":
              c.n_experts, "num_experts_per_tok": c.moe_top_k, "norm_topk_prob": c.moe_normalize_top_k,
              "router_aux_loss_coef": c.moe_balance_weight, "attention_bias": False, "clip_qkv": None,
              "router_jitter_noise": 0.0, "attention_dropout": 0.0, "sliding_window": None}
    return write_model_folder(directory, state, config)
