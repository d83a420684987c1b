"""Hugging Face interop for GPT-2 and BERT: import a transformers model folder as our `GPT` / `Bert`
and export ours as a folder `GPT2LMHeadModel` / `BertModel` / `BertForMaskedLM` /
`BertForSequenceClassification.from_pretrained` loads.

Names are those stored in the safetensors files: GPT-2's `Conv1D` weights are stored [in, out]
(transposed here), its causal-mask buffers (`attn.bias`, `attn.masked_bias`) and BERT's
`position_ids` are dropped, tied output weights (`lm_head.weight`, `cls.predictions.decoder.weight`)
are usually absent and, when present, must equal the word embedding; the `transformer.` / `bert.`
prefix may be present or not; legacy LayerNorm `gamma`/`beta` are read (see `zoo.hf`). GPT-2's
fused `c_attn` splits into our attn.q, attn.k, attn.v; BERT's query/key/value linears are those.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from nlp.bert import Bert, BertConfig
from nlp.gpt import GPT, GPTConfig
from nlp.hf_moe import is_hf_moe_shaped, moe_to_hf
from zoo.hf import StateReader, read_hf_config, read_hf_state
from zoo.model_folder import write_model_folder

GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
GPT2_END_OF_TEXT = 50256
"""GPT-2's <|endoftext|> id, its bos and eos token."""
BERT_HEADS = {"BertForMaskedLM": "mlm", "BertForPreTraining": "mlm", "BertForSequenceClassification": "classification"}


def _require(hf: dict[str, Any], key: str, allowed: tuple, default: Any) -> None:
    value = hf.get(key, default)
    if value not in allowed:
        raise ValueError(f"Hugging Face config {key}={value!r} is not supported; expected one of {list(allowed)}")


def _check_tied(reader: StateReader, name: str, embedding: torch.Tensor) -> None:
    if reader.has(name) and not torch.equal(reader.take(name), embedding):
        raise ValueError(f"{name} differs from the word embedding; only tied output weights are supported")


# GPT-2 ---------------------------------------------------------------------------------------------

_GPT2_BLOCK = {"ln_1": "norm1", "attn.c_proj": "attn.out", "ln_2": "norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
"""GPT-2's block parameter names (Conv1D weights stored [in, out]) and ours; GPT-2's attn.c_attn
holds our attn.q, attn.k and attn.v side by side."""
_GPT2_QKV = ("attn.q", "attn.k", "attn.v")

def gpt_config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    """Our GPTConfig of a GPT2Config dict (dropout: resid_pdrop, used for every dropout)."""
    _require(hf, "activation_function", GPT2_ACTIVATIONS, "gelu_new")
    _require(hf, "n_inner", (None, 4 * hf["n_embd"]), None)
    _require(hf, "scale_attn_weights", (True,), True)
    _require(hf, "scale_attn_by_inverse_layer_idx", (False,), False)
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                     n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=hf.get("resid_pdrop", 0.1), bias=True,
                     norm_eps=hf.get("layer_norm_epsilon", 1e-5))


def gpt_state_from_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our GPT state dict from a GPT-2 safetensors state."""
    reader = StateReader(state, ["transformer."])
    reader.drop(lambda name: name.endswith((".attn.bias", ".attn.masked_bias")))
    out = {"embeddings.word.weight": reader.take("wte.weight"), "embeddings.position.weight": reader.take("wpe.weight")}
    _check_tied(reader, "lm_head.weight", out["embeddings.word.weight"])
    for layer in range(config.n_layer):
        for theirs, ours in _GPT2_BLOCK.items():
            weight = reader.take(f"h.{layer}.{theirs}.weight")
            out[f"blocks.{layer}.{ours}.weight"] = weight if theirs.startswith("ln") else weight.t()
            out[f"blocks.{layer}.{ours}.bias"] = reader.take(f"h.{layer}.{theirs}.bias")
        fused = {"weight": reader.take(f"h.{layer}.attn.c_attn.weight").t(), "bias": reader.take(f"h.{layer}.attn.c_attn.bias")}
        for kind, tensor in fused.items():
            for ours, piece in zip(_GPT2_QKV, tensor.split(config.n_embd)):
                out[f"blocks.{layer}.{ours}.{kind}"] = piece
    out["norm.weight"], out["norm.bias"] = reader.take("ln_f.weight"), reader.take("ln_f.bias")
    reader.finish()
    return out


def gpt_from_hf(folder: str | os.PathLike) -> GPT:
    """Our GPT with the weights of a GPT2LMHeadModel / GPT2Model folder."""
    config = gpt_config_from_hf(read_hf_config(folder))
    model = GPT(config)
    model.load_state_dict(gpt_state_from_hf(read_hf_state(folder), config))
    return model


def gpt_to_hf(model: GPT, directory: str | os.PathLike) -> Path:
    """Write `model` as a MixtralForCausalLM or OlmoeForCausalLM folder when it has their shape
    (`nlp.hf_moe.is_hf_moe_shaped`), else as a GPT2LMHeadModel folder (multi-head attention
    with biases, learned positions, LayerNorm, the head tied, dense feed-forwards only)."""
    c = model.config
    if is_hf_moe_shaped(c):
        return moe_to_hf(model, directory)
    if (not c.bias or c.n_kv_head not in (None, c.n_head) or c.n_experts or c.positions != "learned"
            or c.norm != "layer" or not c.tie_embeddings or c.qk_norm):
        raise ValueError(f"GPT-2 has biases, multi-head attention, learned positions, LayerNorm, a tied head and dense "
                         f"feed-forwards (and Mixtral and OLMoE rotary positions, RMSNorm, no biases and experts in every "
                         f"block); "
                         f"this GPT has bias={c.bias}, n_kv_head={c.n_kv_head}, positions={c.positions!r}, "
                         f"norm={c.norm!r}, tie_embeddings={c.tie_embeddings}, qk_norm={c.qk_norm}, n_experts={c.n_experts}")
    ours = model.state_dict()
    state = {"transformer.wte.weight": ours["embeddings.word.weight"], "transformer.wpe.weight": ours["embeddings.position.weight"],
             "transformer.ln_f.weight": ours["norm.weight"], "transformer.ln_f.bias": ours["norm.bias"]}
    for layer in range(c.n_layer):
        for theirs, mine in _GPT2_BLOCK.items():
            weight = ours[f"blocks.{layer}.{mine}.weight"]
            state[f"transformer.h.{layer}.{theirs}.weight"] = weight if mine.startswith("norm") else weight.t()
            state[f"transformer.h.{layer}.{theirs}.bias"] = ours[f"blocks.{layer}.{mine}.bias"]
        for kind in ("weight", "bias"):
            fused = torch.cat([ours[f"blocks.{layer}.{mine}.{kind}"] for mine in _GPT2_QKV])
            state[f"transformer.h.{layer}.attn.c_attn.{kind}"] = fused.t().contiguous() if kind == "weight" else fused
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": c.vocab_size,
              "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": None,
              "activation_function": "gelu_new", "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
              "layer_norm_epsilon": c.norm_eps, "tie_word_embeddings": True,
              # GPT-2's <|endoftext|> (50256) where the vocabulary has it, else the last id: transformers
              # defaults both to 50256, outside a smaller vocabulary.
              "bos_token_id": min(GPT2_END_OF_TEXT, c.vocab_size - 1), "eos_token_id": min(GPT2_END_OF_TEXT, c.vocab_size - 1)}
    return write_model_folder(directory, state, config)


# BERT ----------------------------------------------------------------------------------------------

def bert_config_from_hf(hf: dict[str, Any]) -> BertConfig:
    """Our BertConfig of a transformers BertConfig dict; the head follows `architectures`."""
    _require(hf, "hidden_act", ("gelu",), "gelu")
    _require(hf, "position_embedding_type", ("absolute",), "absolute")
    architecture = (hf.get("architectures") or ["BertModel"])[0]
    num_labels = len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
              "layer_norm_eps", "pad_token_id", "classifier_dropout")
    return BertConfig(**{k: hf[k] for k in fields if k in hf}, head=BERT_HEADS.get(architecture, "none"),
                      num_labels=num_labels, problem_type=hf.get("problem_type"))


_BERT_LAYER = {"attention.self.query": "attn.q", "attention.self.key": "attn.k", "attention.self.value": "attn.v",
               "attention.output.dense": "attn.out", "attention.output.LayerNorm": "norm1",
               "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2", "output.LayerNorm": "norm2"}
_BERT_EMBEDDINGS = {"word_embeddings": "word", "position_embeddings": "position", "token_type_embeddings": "token_type"}


def bert_state_from_hf(state: dict[str, torch.Tensor], config: BertConfig) -> dict[str, torch.Tensor]:
    """Our Bert state dict from a BERT safetensors state (BertModel, BertForMaskedLM,
    BertForPreTraining without its next-sentence head, BertForSequenceClassification)."""
    reader = StateReader(state, ["bert."])
    reader.drop(lambda name: name == "embeddings.position_ids" or name.startswith("cls.seq_relationship."))
    out = {f"embeddings.{ours}.weight": reader.take(f"embeddings.{theirs}.weight") for theirs, ours in _BERT_EMBEDDINGS.items()}
    out["embeddings.norm.weight"] = reader.take("embeddings.LayerNorm.weight")
    out["embeddings.norm.bias"] = reader.take("embeddings.LayerNorm.bias")
    for layer in range(config.num_hidden_layers):
        prefix = f"encoder.layer.{layer}"
        for kind in ("weight", "bias"):
            for theirs, ours in _BERT_LAYER.items():
                out[f"blocks.{layer}.{ours}.{kind}"] = reader.take(f"{prefix}.{theirs}.{kind}")
    if config.head == "mlm":
        reader.drop(lambda name: name.startswith("pooler."))
        for theirs, ours in (("transform.dense", "mlm_transform"), ("transform.LayerNorm", "mlm_norm")):
            for kind in ("weight", "bias"):
                out[f"{ours}.{kind}"] = reader.take(f"cls.predictions.{theirs}.{kind}")
        out["mlm_decoder.bias"] = reader.take("cls.predictions.bias")
        _check_tied(reader, "cls.predictions.decoder.weight", out["embeddings.word.weight"])
        _check_tied(reader, "cls.predictions.decoder.bias", out["mlm_decoder.bias"])
    else:
        out["pooler.weight"], out["pooler.bias"] = reader.take("pooler.dense.weight"), reader.take("pooler.dense.bias")
    if config.head == "classification":
        out["classifier.weight"], out["classifier.bias"] = reader.take("classifier.weight"), reader.take("classifier.bias")
    reader.finish()
    return out


def bert_from_hf(folder: str | os.PathLike) -> Bert:
    """Our Bert with the weights of a BertModel / BertForMaskedLM / BertForSequenceClassification folder."""
    config = bert_config_from_hf(read_hf_config(folder))
    model = Bert(config)
    model.load_state_dict(bert_state_from_hf(read_hf_state(folder), config))
    return model


def bert_to_hf(model: Bert, directory: str | os.PathLike) -> Path:
    """Write `model` as the transformers folder of its head: BertModel ("none"), BertForMaskedLM
    ("mlm") or BertForSequenceClassification ("classification")."""
    c = model.config
    ours = model.state_dict()
    prefix = "" if c.head == "none" else "bert."
    state = {f"{prefix}embeddings.{theirs}.weight": ours[f"embeddings.{mine}.weight"] for theirs, mine in _BERT_EMBEDDINGS.items()}
    state[f"{prefix}embeddings.LayerNorm.weight"] = ours["embeddings.norm.weight"]
    state[f"{prefix}embeddings.LayerNorm.bias"] = ours["embeddings.norm.bias"]
    width = c.hidden_size
    for layer in range(c.num_hidden_layers):
        theirs_prefix = f"{prefix}encoder.layer.{layer}"
        for kind in ("weight", "bias"):
            for theirs, mine in _BERT_LAYER.items():
                state[f"{theirs_prefix}.{theirs}.{kind}"] = ours[f"blocks.{layer}.{mine}.{kind}"]
    if c.head == "mlm":
        for theirs, mine in (("transform.dense", "mlm_transform"), ("transform.LayerNorm", "mlm_norm")):
            for kind in ("weight", "bias"):
                state[f"cls.predictions.{theirs}.{kind}"] = ours[f"{mine}.{kind}"]
        state["cls.predictions.bias"] = ours["mlm_decoder.bias"]
    else:
        state[f"{prefix}pooler.dense.weight"], state[f"{prefix}pooler.dense.bias"] = ours["pooler.weight"], ours["pooler.bias"]
    if c.head == "classification":
        state["classifier.weight"], state["classifier.bias"] = ours["classifier.weight"], ours["classifier.bias"]
    architecture = {"none": "BertModel", "mlm": "BertForMaskedLM", "classification": "BertForSequenceClassification"}[c.head]
    config = {"model_type": "bert", "architectures": [architecture], "vocab_size": c.vocab_size, "hidden_size": width,
              "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
              "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
              "hidden_dropout_prob": c.hidden_dropout_prob, "attention_probs_dropout_prob": c.attention_probs_dropout_prob,
              "max_position_embeddings": c.max_position_embeddings, "type_vocab_size": c.type_vocab_size,
              "layer_norm_eps": c.layer_norm_eps, "pad_token_id": c.pad_token_id, "position_embedding_type": "absolute",
              "classifier_dropout": c.classifier_dropout, "tie_word_embeddings": True}
    if c.head == "classification":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(c.num_labels)}
        config["problem_type"] = c.problem_type
    return write_model_folder(directory, state, config)
