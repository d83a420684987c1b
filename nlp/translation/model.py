"""`Translator`: an encoder-decoder Transformer on the fused layers of `zoo.nn`.

The encoder is a stack of `zoo.nn.TransformerBlock`s over the source, the decoder a stack of
`zoo.nn.DecoderBlock`s (causal self-attention, cross-attention over the encoder's output, feed-
forward); one embedding serves source, target and the output head. Batches follow Hugging Face's
seq2seq keys: `input_ids` and `attention_mask` (the source, True/1 for real tokens), `labels` (the
target the decoder predicts at each position, -100 ignored), `decoder_input_ids` (default: the
labels shifted one to the right after `decoder_start_token_id`, -100 read as padding).

The training loss is the label-smoothed cross-entropy of the fused linear + cross-entropy
(`zoo.nn.linear_cross_entropy`), which never forms the (B, T, V) logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nlp.translation.config import TranslatorConfig
from nlp.translation.decode import BeamSettings, beam_search
from zoo.nn import DecoderBlock, Norm, TransformerBlock, TransformerBlockConfig, dropout, linear_cross_entropy
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.nn.init import init_transformer_
from zoo.nn.logits import skip_logits as decide_skip_logits
from zoo.plan import ModelPlan
from zoo.registry import register


def sinusoidal_positions(positions: int, width: int) -> torch.Tensor:
    """(positions, width) float32: position t's sin(t / 10000^(2i / width)) in column i of the
    first half and its cos in column i of the second (Marian's and fairseq's layout; an odd width
    gives the sines one column more)."""
    half = (width + 1) // 2
    frequencies = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / width)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * frequencies
    return torch.cat([angles.sin(), angles[:, : width // 2].cos()], dim=1).float()


def shift_right(labels: torch.Tensor, start: int, pad: int) -> torch.Tensor:
    """The decoder's inputs for `labels` (B, T): `start`, then labels[:, :-1], -100 read as `pad`
    (any id: the positions after a target's end predict nothing)."""
    shifted = labels.new_full(labels.shape, start)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad)


@register("translator", TranslatorConfig)
class Translator(nn.Module):
    """See the module docstring. State-dict names: embedding.weight, positions (a learned table's
    weight; sinusoidal tables are not stored), encoder.N.*, decoder.N.*, encoder_norm.* and
    decoder_norm.* (pre-norm), logits_bias (with `final_logits_bias`)."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.width, padding_idx=config.pad_token_id)
        if config.positions == "learned":
            self.positions = nn.Embedding(config.max_positions, config.width)
        else:
            self.register_buffer("positions", sinusoidal_positions(config.max_positions, config.width), persistent=False)
        shape = TransformerBlockConfig(width=config.width, heads=config.heads, mlp_ratio=config.ffn_width / config.width,
                                       activation=config.activation, prenorm=config.prenorm, dropout=config.dropout,
                                       attention_dropout=config.attention_dropout, bias=config.bias, eps=config.eps)
        self.encoder = nn.ModuleList(TransformerBlock(shape) for _ in range(config.encoder_layers))
        self.decoder = nn.ModuleList(DecoderBlock(shape) for _ in range(config.decoder_layers))
        self.encoder_norm = Norm(config.width, "layer", config.eps, bias=config.bias) if config.prenorm else None
        self.decoder_norm = Norm(config.width, "layer", config.eps, bias=config.bias) if config.prenorm else None
        if config.final_logits_bias:
            self.register_buffer("logits_bias", torch.zeros(config.vocab_size))
        else:
            self.logits_bias = None
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    @property
    def filler_token_id(self) -> int:
        """The id of positions that carry nothing (a target's after its end): padding, or EOS
        in a vocabulary without padding."""
        config = self.config
        return config.eos_token_id if config.pad_token_id is None else config.pad_token_id

    @torch.no_grad()
    def init_weights(self) -> None:
        """Linears and embeddings N(0, 0.02) (the padding row zero), biases zero, norms (1, 0)."""
        init_transformer_(self)
        if self.config.pad_token_id is not None:
            self.embedding.weight[self.config.pad_token_id].zero_()

    def parallel_plan(self) -> ModelPlan:
        """Each encoder and decoder block is one shard and recompute unit."""
        return ModelPlan(blocks=("encoder.*", "decoder.*"))

    def embed(self, ids: torch.Tensor, start: int = 0, decoder: bool = False) -> torch.Tensor:
        """ids (B, S) at positions start..start + S - 1 -> (B, S, W): scaled token embeddings plus
        positions, dropout; for the `decoder` with `zero_start_embedding`, position 0's token
        embedding is zeros."""
        config, length = self.config, ids.shape[1]
        if start + length > config.max_positions:
            raise ValueError(f"sequence of {start + length} positions exceeds max_positions={config.max_positions}")
        x = self.embedding(ids) * (math.sqrt(config.width) if config.scale_embedding else 1.0)
        if decoder and config.zero_start_embedding and start == 0:
            x = torch.cat([torch.zeros_like(x[:, :1]), x[:, 1:]], dim=1)
        positions = (self.positions.weight if isinstance(self.positions, nn.Embedding) else self.positions)
        x = x + positions[start:start + length].to(x.dtype)
        return dropout(x, config.dropout, self.training)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The source input_ids (B, S) and its attention_mask (B, S) -> the memory (B, S, W)."""
        mask = None if attention_mask is None else attention_mask.bool()
        x = self.embed(input_ids)
        for block in self.encoder:
            x = block(x, mask)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Target ids (B, T) over the memory (B, S, W) of a source with attention_mask (B, S) ->
        the decoder's output (B, T, W), before the head."""
        mask = None if attention_mask is None else attention_mask.bool()
        x = self.embed(decoder_input_ids, decoder=True)
        for block in self.decoder:
            x = block(x, memory, mask)
        return x if self.decoder_norm is None else self.decoder_norm(x)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                skip_logits: bool | None = None) -> dict[str, torch.Tensor]:
        """Returns {"logits": (B, T, V)}, with labels also {"loss"} (the label-smoothed mean
        cross-entropy over labelled positions, fp32); skip_logits: {"loss"} alone from the fused
        linear + cross-entropy (default: when there are labels and the model trains, or inside
        `zoo.nn.logits.loss_only()`)."""
        config = self.config
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("Translator needs decoder_input_ids or labels (from which they are shifted); got neither")
            decoder_input_ids = shift_right(labels, config.decoder_start_token_id, self.filler_token_id)
        skip = decide_skip_logits(skip_logits, self.training, labels is not None)
        hidden = self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)
        if skip:
            return {"loss": linear_cross_entropy(hidden.flatten(0, 1), self.embedding.weight, labels.flatten(),
                                                 self.logits_bias, label_smoothing=config.label_smoothing)}
        logits = F.linear(hidden, self.embedding.weight, self.logits_bias)
        if labels is None:
            return {"logits": logits}
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=config.label_smoothing)
        return {"loss": loss, "logits": logits}

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 settings: BeamSettings = BeamSettings(), use_cache: bool = True) -> list[list[int]]:
        """The best translation of each source row of input_ids (B, S) by beam search
        (`nlp.translation.decode`): target ids without the start token, ending with EOS unless cut
        at the maximum length."""
        return beam_search(self, input_ids, attention_mask, settings, use_cache)
