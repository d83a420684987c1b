"""A CTranslate2 `TransformerSpec` translator (an OpenNMT or Marian model converted for CTranslate2, e.g.
the Argos Translate packages) as our `Translator`, its int8 weights dequantised (each row's int8
values over its float32 scale), with its vocabulary.

The model directory holds `model.bin` (read by `zoo.ctranslate2_io`), `config.json` (special tokens,
whether the source ends with EOS) and `shared_vocabulary.json` (one vocabulary for source and
target). Each layer's fused projections are split: self-attention's q, k, v rows (`linear_0`), the
cross-attention's k, v rows (`linear_1`). Post-norm or pre-norm (with the stacks' final norms), the
activation, embedding scaling and the decoder's zero start embedding come from the spec; a spec
feature our model does not have (ALiBi, merged source features, relative positions, a
non-sinusoidal position table) is refused by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from nlp.translation.config import TranslatorConfig
from nlp.translation.embedding import sinusoidal_positions
from nlp.translation.model import Translator
from zoo.ctranslate2_io import CTranslate2Model, read_ctranslate2

ACTIVATIONS = {0: "relu", 1: "gelu_tanh", 2: "silu", 3: "gelu"}
"""CTranslate2's activation enum -> ours."""
LAYER_NORM_EPS = 1e-6
"""CTranslate2's LayerNorm epsilon when the model's config names none."""


@dataclass(frozen=True)
class CTranslate2Vocabulary:
    """The shared vocabulary of a CTranslate2 translator: its tokens (id = index) and special tokens."""

    tokens: list[str]
    eos: str
    """The end-of-sentence token."""
    unk: str
    add_source_eos: bool
    """Whether a source ends with EOS."""

    def ids(self, pieces: list[str]) -> list[int]:
        """Token ids of `pieces` (unknown ones as `unk`'s)."""
        index = self._index
        return [index.get(piece, index[self.unk]) for piece in pieces]

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    @cached_property
    def _index(self) -> dict[str, int]:
        """Token -> id, built once."""
        return {token: i for i, token in enumerate(self.tokens)}


def _dequantised(model: CTranslate2Model, name: str) -> torch.Tensor:
    """Variable `name` as float32: int8 rows divided by their scales (`name`_scale)."""
    value = model[name]
    if value.dtype == torch.int8:
        scale = model[f"{name}_scale"]
        return value.float() / scale.float()[:, None]
    return value.float()


def _flag(model: CTranslate2Model, name: str, default: int = 0) -> int:
    return int(model[name]) if name in model.variables else default


def read_vocabulary(directory: str | os.PathLike) -> CTranslate2Vocabulary:
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    tokens = json.loads((directory / "shared_vocabulary.json").read_text())
    return CTranslate2Vocabulary(tokens, config.get("eos_token", "</s>"), config.get("unk_token", "<unk>"),
                                 bool(config.get("add_source_eos", False)))


def translator_from_ctranslate2(directory: str | os.PathLike) -> Translator:
    """Our Translator with the weights of the CTranslate2 model in `directory` (its vocabulary:
    `read_vocabulary`). The importer of the `memzoo.ctranslate2` entry point TransformerSpec."""
    directory = Path(directory)
    model = read_ctranslate2(directory / "model.bin")
    if model.spec != "TransformerSpec":
        raise ValueError(f"{directory}/model.bin holds a {model.spec}; expected a TransformerSpec translator")
    for name in ("decoder/alibi", "encoder/embeddings_merge", "decoder/layernorm_embedding"):
        if _flag(model, name):
            raise ValueError(f"{directory}/model.bin sets {name}, which the Translator does not have")
    if any("relative" in name for name in model.variables):
        raise ValueError(f"{directory}/model.bin has relative positions, which the Translator does not have")
    vocabulary = read_vocabulary(directory)
    config_json = json.loads((directory / "config.json").read_text())
    prenorm = bool(_flag(model, "encoder/pre_norm", 1))
    if prenorm != bool(_flag(model, "decoder/pre_norm", 1)):
        raise ValueError(f"{directory}/model.bin mixes pre-norm and post-norm stacks")
    activation = _flag(model, "encoder/activation", 0)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{directory}/model.bin has activation {activation}; expected one of {sorted(ACTIVATIONS)}")
    embedding = _dequantised(model, "decoder/embeddings/weight")
    table = model["decoder/position_encodings/encodings"].float()
    vocab, width = embedding.shape
    if not torch.allclose(table, sinusoidal_positions(*table.shape), atol=1e-5):
        raise ValueError(f"{directory}/model.bin's position encodings are not the sinusoidal table the Translator makes")
    layers = {stack: len({name.split("/")[1] for name in model.variables if name.startswith(f"{stack}/layer_")})
              for stack in ("encoder", "decoder")}
    eos = vocabulary.tokens.index(vocabulary.eos)
    start = config_json.get("decoder_start_token", "<s>")
    config = TranslatorConfig(
        vocab_size=vocab, width=width, heads=_flag(model, "encoder/num_heads"), encoder_layers=layers["encoder"],
        decoder_layers=layers["decoder"], ffn_width=model["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        activation=ACTIVATIONS[activation], prenorm=prenorm, positions="sinusoidal", max_positions=table.shape[0],
        scale_embedding=bool(_flag(model, "decoder/scale_embeddings", 1)),
        final_logits_bias="decoder/projection/bias" in model.variables, pad_token_id=None,
        decoder_start_token_id=vocabulary.tokens.index(start) if start in vocabulary.tokens else eos,
        zero_start_embedding=bool(_flag(model, "decoder/start_from_zero_embedding")), eos_token_id=eos, dropout=0.0,
        attention_dropout=0.0, label_smoothing=0.1, eps=config_json.get("layer_norm_epsilon") or LAYER_NORM_EPS)
    state = {"embeddings.word.weight": embedding}
    if config.final_logits_bias:
        state["logits_bias"] = model["decoder/projection/bias"].float()
    norm = lambda scope: {"weight": model[f"{scope}/gamma"].float(), "bias": model[f"{scope}/beta"].float()}  # noqa: E731

    def linear(scope: str, rows: tuple[int, ...] | None = None) -> list[dict[str, torch.Tensor]]:
        weight, bias = _dequantised(model, f"{scope}/weight"), model[f"{scope}/bias"].float()
        rows = rows or (weight.shape[0],)
        return [{"weight": w, "bias": b} for w, b in zip(weight.split(rows), bias.split(rows))]

    def put(prefix: str, values: dict[str, torch.Tensor]) -> None:
        state.update({f"{prefix}.{key}": value for key, value in values.items()})

    for index in range(config.encoder_layers):
        theirs, ours = f"encoder/layer_{index}", f"encoder.{index}"
        for name, value in zip("qkv", linear(f"{theirs}/self_attention/linear_0", (width,) * 3)):
            put(f"{ours}.attn.{name}", value)
        put(f"{ours}.attn.out", linear(f"{theirs}/self_attention/linear_1")[0])
        put(f"{ours}.norm1", norm(f"{theirs}/self_attention/layer_norm"))
        put(f"{ours}.mlp.fc1", linear(f"{theirs}/ffn/linear_0")[0])
        put(f"{ours}.mlp.fc2", linear(f"{theirs}/ffn/linear_1")[0])
        put(f"{ours}.norm2", norm(f"{theirs}/ffn/layer_norm"))
    for index in range(config.decoder_layers):
        theirs, ours = f"decoder/layer_{index}", f"decoder.{index}"
        for name, value in zip("qkv", linear(f"{theirs}/self_attention/linear_0", (width,) * 3)):
            put(f"{ours}.self_attn.{name}", value)
        put(f"{ours}.self_attn.out", linear(f"{theirs}/self_attention/linear_1")[0])
        put(f"{ours}.norm1", norm(f"{theirs}/self_attention/layer_norm"))
        put(f"{ours}.cross_attn.q", linear(f"{theirs}/attention/linear_0")[0])
        for name, value in zip("kv", linear(f"{theirs}/attention/linear_1", (width,) * 2)):
            put(f"{ours}.cross_attn.{name}", value)
        put(f"{ours}.cross_attn.out", linear(f"{theirs}/attention/linear_2")[0])
        put(f"{ours}.norm2", norm(f"{theirs}/attention/layer_norm"))
        put(f"{ours}.mlp.fc1", linear(f"{theirs}/ffn/linear_0")[0])
        put(f"{ours}.mlp.fc2", linear(f"{theirs}/ffn/linear_1")[0])
        put(f"{ours}.norm3", norm(f"{theirs}/ffn/layer_norm"))
    if prenorm:
        put("encoder_norm", norm("encoder/layer_norm"))
        put("decoder_norm", norm("decoder/layer_norm"))
    translator = Translator(config)
    translator.load_state_dict(state)
    return translator.eval()
