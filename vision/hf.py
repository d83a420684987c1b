"""Hugging Face interop for ViT: import a `ViTModel` / `ViTForImageClassification` folder as our
`ViT`, export ours as a folder those classes' `from_pretrained` loads.

Names are those stored in the safetensors files (`vit.encoder.layer.N.attention.attention.query`,
...), which differ from transformers 5.x's in-memory names; the `vit.` prefix may be present or
not. Their query/key/value linears are our attn.q, attn.k and attn.v.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from vision.vit import ViT, ViTConfig
from zoo.hf import StateReader, read_hf_config, read_hf_state
from zoo.model_folder import write_model_folder

_LAYER = {"attention.attention.query": "attn.q", "attention.attention.key": "attn.k",
          "attention.attention.value": "attn.v", "layernorm_before": "norm1", "attention.output.dense": "attn.out", "layernorm_after": "norm2",
          "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"}
"""ViT layer names as stored (after encoder.layer.N.) and ours (after blocks.N.)."""
_ARCHITECTURES = {"none": "ViTModel", "classification": "ViTForImageClassification"}


def vit_config_from_hf(hf: dict[str, Any]) -> ViTConfig:
    """Our ViTConfig of a transformers ViTConfig dict."""
    for key, allowed, default in (("hidden_act", ("gelu",), "gelu"), ("qkv_bias", (True,), True),
                                  ("pooler_act", ("tanh",), "tanh")):
        if hf.get(key, default) not in allowed:
            raise ValueError(f"Hugging Face config {key}={hf.get(key)!r} is not supported; expected one of {list(allowed)}")
    if hf.get("pooler_output_size", hf["hidden_size"]) != hf["hidden_size"]:
        raise ValueError(f"Hugging Face config pooler_output_size={hf['pooler_output_size']} is not supported; "
                         f"expected hidden_size={hf['hidden_size']}")
    architecture = (hf.get("architectures") or ["ViTModel"])[0]
    head = "classification" if architecture == "ViTForImageClassification" else "none"
    fields = ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps")
    num_labels = len(hf.get("id2label") or {}) or hf.get("num_labels", 2)
    return ViTConfig(**{k: hf[k] for k in fields if k in hf}, head=head, num_labels=num_labels)


def vit_state_from_hf(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our ViT state dict from a ViTModel / ViTForImageClassification safetensors state."""
    reader = StateReader(state, ["vit."])
    out = {"embeddings.cls_token": reader.take("embeddings.cls_token"), "embeddings.positions": reader.take("embeddings.position_embeddings"),
           "embeddings.patch.weight": reader.take("embeddings.patch_embeddings.projection.weight"),
           "embeddings.patch.bias": reader.take("embeddings.patch_embeddings.projection.bias"),
           "norm.weight": reader.take("layernorm.weight"), "norm.bias": reader.take("layernorm.bias")}
    for layer in range(config.num_hidden_layers):
        prefix = f"encoder.layer.{layer}"
        for kind in ("weight", "bias"):
            for theirs, ours in _LAYER.items():
                out[f"blocks.{layer}.{ours}.{kind}"] = reader.take(f"{prefix}.{theirs}.{kind}")
    if config.head == "classification":
        out["classifier.weight"], out["classifier.bias"] = reader.take("classifier.weight"), reader.take("classifier.bias")
    elif reader.has("pooler.dense.weight"):
        out["pooler.weight"], out["pooler.bias"] = reader.take("pooler.dense.weight"), reader.take("pooler.dense.bias")
    else:
        raise ValueError("this ViTModel folder has no pooler (add_pooling_layer=False); memzoo's ViT with "
                         "head='none' has one")
    reader.finish()
    return out


def vit_from_hf(folder: str | os.PathLike) -> ViT:
    """Our ViT with the weights of a ViTModel / ViTForImageClassification folder."""
    config = vit_config_from_hf(read_hf_config(folder))
    model = ViT(config)
    model.load_state_dict(vit_state_from_hf(read_hf_state(folder), config))
    return model


def vit_to_hf(model: ViT, directory: str | os.PathLike) -> Path:
    """Write `model` as a ViTModel ("none") or ViTForImageClassification ("classification") folder."""
    c, ours = model.config, model.state_dict()
    prefix = "" if c.head == "none" else "vit."
    state = {f"{prefix}embeddings.cls_token": ours["embeddings.cls_token"],
             f"{prefix}embeddings.position_embeddings": ours["embeddings.positions"],
             f"{prefix}embeddings.patch_embeddings.projection.weight": ours["embeddings.patch.weight"],
             f"{prefix}embeddings.patch_embeddings.projection.bias": ours["embeddings.patch.bias"],
             f"{prefix}layernorm.weight": ours["norm.weight"], f"{prefix}layernorm.bias": ours["norm.bias"]}
    for layer in range(c.num_hidden_layers):
        theirs_prefix = f"{prefix}encoder.layer.{layer}"
        for kind in ("weight", "bias"):
            for theirs, mine in _LAYER.items():
                state[f"{theirs_prefix}.{theirs}.{kind}"] = ours[f"blocks.{layer}.{mine}.{kind}"]
    for kind in ("weight", "bias"):
        if c.head == "classification":
            state[f"classifier.{kind}"] = ours[f"classifier.{kind}"]
        else:
            state[f"pooler.dense.{kind}"] = ours[f"pooler.{kind}"]
    config = {"model_type": "vit", "architectures": [_ARCHITECTURES[c.head]], "image_size": c.image_size,
              "patch_size": c.patch_size, "num_channels": c.num_channels, "hidden_size": c.hidden_size,
              "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
              "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
              "hidden_dropout_prob": c.hidden_dropout_prob, "attention_probs_dropout_prob": c.attention_probs_dropout_prob,
              "layer_norm_eps": c.layer_norm_eps, "qkv_bias": True}
    if c.head == "classification":
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(c.num_labels)}
    return write_model_folder(directory, state, config)
