"""Hugging Face interop for Marian (`MarianMTModel`, the OPUS-MT translators): a MarianMTModel folder
as our `Translator` (post-norm, swish feed-forwards, sinusoidal positions, one embedding shared by
source, target and head, a final logits bias), and back.

Names are those stored in the safetensors files, with or without the `model.` prefix. The stored
sinusoidal tables must be the ones `sinusoidal_positions` makes (they are refused otherwise); the
tied copies of the embedding (`encoder.embed_tokens`, `decoder.embed_tokens`, `lm_head`) must equal
`shared`. A config our model would not reproduce (separate vocabularies or embeddings, pre-norm,
activation dropout, encoder and decoder of different shapes, layer drop) is refused, naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from nlp.translation.config import TranslatorConfig
from nlp.translation.embedding import sinusoidal_positions
from nlp.translation.model import Translator
from zoo.hf import StateReader, read_hf_config, read_hf_state
from zoo.model_folder import write_model_folder

ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
"""Marian's activation_function -> ours."""
_ATTENTION = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "out"}
_ENCODER = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}
_DECODER = {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"}


def _require(hf: dict[str, Any], key: str, expected: Any, default: Any = None) -> None:
    value = hf.get(key, default)
    if value != expected:
        raise ValueError(f"marian config {key}={value!r} is not supported; expected {expected!r}")


def translator_config_from_hf(hf: dict[str, Any]) -> TranslatorConfig:
    """Our TranslatorConfig of a MarianConfig dict."""
    for ours, theirs in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        _require(hf, theirs, hf[ours])
    _require(hf, "decoder_vocab_size", hf["vocab_size"], hf["vocab_size"])
    _require(hf, "share_encoder_decoder_embeddings", True, True)
    _require(hf, "normalize_before", False, False)
    _require(hf, "activation_dropout", 0.0, 0.0)
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        _require(hf, key, 0.0, 0.0)
    activation = hf.get("activation_function", "swish")
    if activation not in ACTIVATIONS:
        raise ValueError(f"marian config activation_function={activation!r} is not supported; expected one of "
                         f"{sorted(ACTIVATIONS)}")
    return TranslatorConfig(
        vocab_size=hf["vocab_size"], width=hf["d_model"], heads=hf["encoder_attention_heads"],
        encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"], ffn_width=hf["encoder_ffn_dim"],
        activation=ACTIVATIONS[activation], prenorm=False, positions="sinusoidal",
        max_positions=hf["max_position_embeddings"], scale_embedding=hf.get("scale_embedding", True),
        final_logits_bias=True, pad_token_id=hf["pad_token_id"],
        decoder_start_token_id=hf.get("decoder_start_token_id", hf["pad_token_id"]), eos_token_id=hf["eos_token_id"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0), label_smoothing=0.0,
        bias=True, eps=1e-5)


def _take_tied(reader: StateReader, shared: torch.Tensor, name: str) -> None:
    if reader.has(name) and not torch.equal(reader.take(name), shared):
        raise ValueError(f"{name} differs from model.shared.weight, but Marian shares one embedding")


def translator_state_from_hf(state: dict[str, torch.Tensor], config: TranslatorConfig) -> dict[str, torch.Tensor]:
    """Our Translator state dict from a MarianMTModel safetensors state."""
    reader = StateReader(state, prefixes=("model.",))
    out = {"embeddings.word.weight": reader.take("shared.weight")}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        _take_tied(reader, out["embeddings.word.weight"], name)
    table = sinusoidal_positions(config.max_positions, config.width)
    for stack in ("encoder", "decoder"):
        name = f"{stack}.embed_positions.weight"
        if reader.has(name) and not torch.allclose(reader.take(name).float(), table, atol=1e-5):
            raise ValueError(f"{name} is not the sinusoidal table of Marian's layout this model computes")
    out["logits_bias"] = reader.take("final_logits_bias").reshape(-1)
    for index in range(config.encoder_layers):
        theirs, ours = f"encoder.layers.{index}", f"encoder.{index}"
        _linears(reader, out, theirs, ours, {**{f"self_attn.{k}": f"attn.{v}" for k, v in _ATTENTION.items()},
                                              "fc1": "mlp.fc1", "fc2": "mlp.fc2", **_ENCODER})
    for index in range(config.decoder_layers):
        theirs, ours = f"decoder.layers.{index}", f"decoder.{index}"
        _linears(reader, out, theirs, ours, {**{f"self_attn.{k}": f"self_attn.{v}" for k, v in _ATTENTION.items()},
                                              **{f"encoder_attn.{k}": f"cross_attn.{v}" for k, v in _ATTENTION.items()},
                                              "fc1": "mlp.fc1", "fc2": "mlp.fc2", **_DECODER})
    reader.finish()
    return out


def _linears(reader: StateReader, out: dict[str, torch.Tensor], theirs: str, ours: str, names: dict[str, str]) -> None:
    for their_name, our_name in names.items():
        for kind in ("weight", "bias"):
            out[f"{ours}.{our_name}.{kind}"] = reader.take(f"{theirs}.{their_name}.{kind}")


def translator_from_hf(folder: str | os.PathLike) -> Translator:
    """Our Translator with the weights of a MarianMTModel folder."""
    config = translator_config_from_hf(read_hf_config(folder))
    model = Translator(config)
    model.load_state_dict(translator_state_from_hf(read_hf_state(folder), config))
    return model


def translator_to_hf(model: Translator, directory: str | os.PathLike) -> Path:
    """Write `model` (Marian-shaped: post-norm, sinusoidal positions, a final logits bias, biases)
    as a MarianMTModel folder."""
    c = model.config
    if c.prenorm or c.positions != "sinusoidal" or not c.final_logits_bias or not c.bias:
        raise ValueError(f"a Marian is post-norm with sinusoidal positions, a final logits bias and biases; this "
                         f"Translator has prenorm={c.prenorm}, positions={c.positions!r}, "
                         f"final_logits_bias={c.final_logits_bias}, bias={c.bias}")
    ours = model.state_dict()
    state = {"model.shared.weight": ours["embeddings.word.weight"], "final_logits_bias": ours["logits_bias"][None]}
    for stack, layers, names in (("encoder", c.encoder_layers, _ENCODER), ("decoder", c.decoder_layers, _DECODER)):
        attentions = {"self_attn": "attn" if stack == "encoder" else "self_attn"}
        if stack == "decoder":
            attentions["encoder_attn"] = "cross_attn"
        for index in range(layers):
            theirs, mine = f"model.{stack}.layers.{index}", f"{stack}.{index}"
            mapping = {**{f"{a}.{k}": f"{b}.{v}" for a, b in attentions.items() for k, v in _ATTENTION.items()},
                       "fc1": "mlp.fc1", "fc2": "mlp.fc2", **names}
            for their_name, our_name in mapping.items():
                for kind in ("weight", "bias"):
                    state[f"{theirs}.{their_name}.{kind}"] = ours[f"{mine}.{our_name}.{kind}"]
    activation = {value: key for key, value in ACTIVATIONS.items() if key != "silu"}[c.activation]
    config = {"model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": c.vocab_size,
              "decoder_vocab_size": c.vocab_size, "d_model": c.width, "encoder_layers": c.encoder_layers,
              "decoder_layers": c.decoder_layers, "encoder_attention_heads": c.heads, "decoder_attention_heads": c.heads,
              "encoder_ffn_dim": c.ffn_width, "decoder_ffn_dim": c.ffn_width, "activation_function": activation,
              "max_position_embeddings": c.max_positions, "scale_embedding": c.scale_embedding,
              "pad_token_id": c.pad_token_id, "decoder_start_token_id": c.decoder_start_token_id,
              "eos_token_id": c.eos_token_id, "dropout": c.dropout, "attention_dropout": c.attention_dropout,
              "activation_dropout": 0.0, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
              "is_encoder_decoder": True}
    return write_model_folder(directory, state, config)
