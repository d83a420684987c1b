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

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from nlp.translation.config import TranslatorConfig
from nlp.translation.decode import BeamSettings, beam_search
from nlp.translation.embedding import TranslatorEmbeddings
from zoo.nn import (DecoderBlock, Norm, TransformerBlock, TransformerBlockConfig, block_plan, decoder_block_plan,
                    linear_cross_entropy)
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.nn.init import init_transformer_
from zoo.nn.logits import skip_logits as decide_skip_logits
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register


def shift_right(labels: torch.Tensor, start: int, pad: int) -> torch.Tensor:
    """The decoder's inputs for `labels` (B, T): `start`, then labels[:, :-1], -100 read as `pad`
    (any id: the positions after a target's end predict nothing)."""
    shifted = labels.new_full(labels.shape, start)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad)


@register("translator", TranslatorConfig)
class Translator(nn.Module):
    """See the module docstring. State-dict names: embeddings.word.weight, embeddings.position.weight
    (a learned table; sinusoidal ones are not stored), encoder.N.*, decoder.N.*, encoder_norm.* and
    decoder_norm.* (pre-norm), logits_bias (with `final_logits_bias`)."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = TranslatorEmbeddings(config)
        shape = self._block_shape()
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

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's weight (V, W): the word embedding's."""
        return self.embeddings.word.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Linears and embeddings N(0, 0.02) (the padding row zero), biases zero, norms (1, 0)."""
        init_transformer_(self)
        if self.config.pad_token_id is not None:
            self.embeddings.word.weight[self.config.pad_token_id].zero_()

    def parallel_plan(self) -> ModelPlan:
        """Each encoder and decoder block is one shard and recompute unit whose attentions and
        feed-forward are tensor-parallel regions (`zoo.nn.block_plan`, `zoo.nn.decoder_block_plan`);
        the word embedding, and through it the output head, splits by vocabulary rows (unless a
        final logits bias, whole, stands beside it). Under sequence parallelism both sequences are
        split where they are embedded, and the encoder's output (the memory every cross-attention
        reads whole) and the decoder's are gathered where each stack ends. The pipeline cuts the
        encoder's and then the decoder's blocks, the carry holding both sequences' states."""
        config = self.config
        shape = self._block_shape()
        blocks = block_plan("encoder.*", shape).merged(decoder_block_plan("decoder.*", shape))
        last = (f"encoder.{config.encoder_layers - 1}", f"decoder.{config.decoder_layers - 1}")
        ends = ("encoder_norm", "decoder_norm") if config.prenorm else last
        head = (*(("decoder_norm",) if config.prenorm else ()), "embeddings.word",
                *(("logits_bias",) if config.final_logits_bias else ()))
        attached = (("encoder_norm", last[0]),) if config.prenorm else ()
        return replace(blocks, vocab_parallel=() if config.final_logits_bias else ("embeddings.word",),
                       sequence_split=("embeddings",),
                       sequence_parallel=(*blocks.sequence_parallel, *(ends if config.prenorm else ())),
                       sequence_gather=ends,
                       pipeline=PipelineSplit(pre=("embeddings",), post=head, attached=attached))

    def pipeline_enter(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> Carry:
        """First pipeline stage: {"memory": the source's embeddings (B, S, W), "hidden": the
        target's (B, T, W), "attention_mask": the source's (B, S) bool}; the encoder's blocks carry
        "memory" on, the decoder's "hidden"."""
        decoder_input_ids = self._decoder_inputs(decoder_input_ids, labels)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return {"memory": self.embeddings(input_ids),
                "hidden": self.embeddings(decoder_input_ids, zero_start=self.config.zero_start_embedding),
                "attention_mask": mask}

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One encoder block on carry["memory"] (the last one also applies the encoder's final norm),
        or one decoder block on carry["hidden"] over the memory."""
        encoder = {} if self.encoder is None else dict(self.encoder.named_children())  # a stage holds what it runs
        if any(block is held for held in encoder.values()):
            memory = block(carry["memory"], carry["attention_mask"])
            if self.encoder_norm is not None and encoder.get(str(self.config.encoder_layers - 1)) is block:
                memory = self.encoder_norm(memory)
            return {**carry, "memory": memory}
        return {**carry, "hidden": block(carry["hidden"], carry["memory"], carry["attention_mask"])}

    def pipeline_exit(self, carry: Carry, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Last pipeline stage: the decoder's final norm, the fused head + label-smoothed loss."""
        hidden = carry["hidden"] if self.decoder_norm is None else self.decoder_norm(carry["hidden"])
        return self._fused_loss(hidden, labels)

    def _block_shape(self) -> TransformerBlockConfig:
        config = self.config
        return TransformerBlockConfig(width=config.width, heads=config.heads, mlp_ratio=config.ffn_width / config.width,
                                      activation=config.activation, prenorm=config.prenorm, dropout=config.dropout,
                                      attention_dropout=config.attention_dropout, bias=config.bias, eps=config.eps)

    def _decoder_inputs(self, decoder_input_ids: torch.Tensor | None, labels: torch.Tensor | None) -> torch.Tensor:
        if decoder_input_ids is not None:
            return decoder_input_ids
        if labels is None:
            raise ValueError("Translator needs decoder_input_ids or labels (from which they are shifted); got neither")
        return shift_right(labels, self.config.decoder_start_token_id, self.filler_token_id)

    def _fused_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The label-smoothed mean cross-entropy of the head on the decoder's output (B, T, W), the
        logits never formed."""
        return linear_cross_entropy(hidden.flatten(0, 1), self.head_weight, labels.flatten(), self.logits_bias,
                                    label_smoothing=self.config.label_smoothing)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The source input_ids (B, S) and its attention_mask (B, S) -> the memory (B, S, W)."""
        mask = None if attention_mask is None else attention_mask.bool()
        x = self.embeddings(input_ids)
        for block in self.encoder:
            x = block(x, mask)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Target ids (B, T) over the memory (B, S, W) of a source with attention_mask (B, S) ->
        the decoder's output (B, T, W), before the head."""
        mask = None if attention_mask is None else attention_mask.bool()
        x = self.embeddings(decoder_input_ids, zero_start=self.config.zero_start_embedding)
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
        decoder_input_ids = self._decoder_inputs(decoder_input_ids, labels)
        skip = decide_skip_logits(skip_logits, self.training, labels is not None)
        hidden = self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)
        if skip:
            return {"loss": self._fused_loss(hidden, labels)}
        logits = F.linear(hidden, self.head_weight, self.logits_bias)
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
