"""BERT on the fused `zoo.nn` layers: embeddings (word + position + type, LayerNorm, dropout),
post-LN `TransformerBlock`s with exact GELU, and one of three heads:

    "none":           {"last_hidden_state" (B, S, W), "pooler_output" (B, W) = tanh(dense(h[:, 0]))}
    "mlm":            dense + GELU + LayerNorm, then the decoder tied to the word embedding (+ bias):
                      {"logits" (B, S, V)} (+ "loss" with labels, as Hugging Face's BertForMaskedLM);
                      when skipping logits (by default with labels in training or `loss_only()`) only the labelled
                      positions are projected, fused with the cross-entropy: {"loss"}
    "classification": pooler, dropout, linear: {"logits" (B, num_labels)} (+ "loss" with labels, by
                      `BertConfig.problem_type`)

State-dict names: embeddings.{word,position,token_type,norm}.*, blocks.N.{attn.{q,k,v,out},norm1,
mlp.fc1,mlp.fc2,norm2}.*, pooler.*, mlm_transform.*, mlm_norm.*, mlm_decoder.bias, classifier.*.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from nlp.bert.config import BertConfig
from zoo.nn import (Embeddings, Norm, TransformerBlock, TransformerBlockConfig, bias_act_dropout, block_plan,
                    dropout, linear_cross_entropy)
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.nn.logits import skip_logits as decide_skip_logits
from zoo.nn.init import init_transformer_
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register


def block_config(config: BertConfig) -> TransformerBlockConfig:
    """The `TransformerBlock` shape of a BERT's blocks."""
    return TransformerBlockConfig(
        width=config.hidden_size, heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size, activation="gelu", prenorm=False, causal=False,
        dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob, bias=True,
        eps=config.layer_norm_eps, recompute_attention=config.recompute_attention)


class DecoderBias(nn.Module):
    """The masked-LM decoder's bias (V,), its weight being the tied word embedding: a module of its
    own, so that a plan can name it (Hugging Face's cls.predictions.decoder.bias)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))


def _rename_root_bias(_module, state_dict, prefix, *args) -> None:
    """Checkpoints written before the decoder bias had its module hold it as mlm_bias."""
    if prefix + "mlm_bias" in state_dict:
        state_dict[prefix + "mlm_decoder.bias"] = state_dict.pop(prefix + "mlm_bias")


@register("bert", BertConfig)
class Bert(nn.Module):
    """forward(input_ids (B, S), attention_mask (B, S) 1 = token / 0 = padding, token_type_ids (B, S),
    labels) -> dict; see the module docstring for each head's outputs."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        width = config.hidden_size
        self.embeddings = Embeddings(config.vocab_size, width, positions=config.max_position_embeddings,
                                     token_types=config.type_vocab_size, norm=True, eps=config.layer_norm_eps,
                                     dropout=config.hidden_dropout_prob)
        self.blocks = nn.ModuleList(TransformerBlock(block_config(config)) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(width, width) if config.head != "mlm" else None
        if config.head == "mlm":
            self.mlm_transform = nn.Linear(width, width)
            self.mlm_norm = Norm(width, "layer", config.layer_norm_eps)
            self.mlm_decoder = DecoderBias(config.vocab_size)
            self.register_load_state_dict_pre_hook(_rename_root_bias)
        if config.head == "classification":
            self.classifier = nn.Linear(width, config.num_labels)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    @staticmethod
    def example_batch(config: BertConfig, rows: int) -> dict[str, torch.Tensor]:
        """A training micro batch of `rows` full-length sequences (max_position_embeddings tokens)
        of random tokens for the config's head: masked-LM labels on 15% of the positions, or one
        class per sequence: what `zoo plan` estimates a step with."""
        length = config.max_position_embeddings
        ids = torch.randint(1, config.vocab_size, (rows, length))
        batch = {"input_ids": ids, "attention_mask": torch.ones(rows, length, dtype=torch.long)}
        if config.head == "mlm":
            batch["labels"] = torch.where(torch.rand(rows, length) < 0.15, ids, IGNORE_INDEX)
        elif config.head == "classification":
            batch["labels"] = torch.randint(0, config.num_labels, (rows,))
        else:
            raise ValueError(f"BertConfig.head={config.head!r} has no training loss; a plan needs 'mlm' or 'classification'")
        return batch

    def parallel_plan(self) -> ModelPlan:
        """Each block is one shard and recompute unit and holds two tensor-parallel regions
        (`block_plan`); under sequence parallelism the blocks run on sequence shards, split after
        the embeddings and gathered after the last block for the heads. The embeddings and heads
        stay whole. A pipeline's first stage holds the embeddings, its last the head (with a copy
        of the word embedding, the MLM decoder's tied weight)."""
        blocks = block_plan("blocks.*", block_config(self.config))
        heads = {"mlm": ("mlm_transform", "mlm_norm", "mlm_decoder", "embeddings.word"),
                 "classification": ("pooler", "classifier"), "none": ()}[self.config.head]
        return replace(blocks, sequence_split=("embeddings",), sequence_gather=(f"blocks.{len(self.blocks) - 1}",),
                       pipeline=PipelineSplit(pre=("embeddings",), post=heads))

    @torch.no_grad()
    def init_weights(self) -> None:
        """BERT initialisation: N(0, 0.02) weights, zero biases, unit norms, a zero padding row."""
        init_transformer_(self)
        self.embeddings.word.weight[self.config.pad_token_id].zero_()
        if self.config.head == "mlm":
            self.mlm_decoder.bias.zero_()

    def num_parameters(self) -> int:
        """Number of parameters (the tied MLM decoder counted once)."""
        return sum(p.numel() for p in self.parameters())

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's last hidden states (B, S, W)."""
        carry = self.pipeline_enter(input_ids, attention_mask, token_type_ids)
        for block in self.blocks:
            carry = self.pipeline_block(block, carry)
        return carry["hidden"]

    def pipeline_enter(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> Carry:
        """First pipeline stage: {"hidden": (B, S, W) embeddings, "padding": (B, S) bool, True at
        tokens (when there is an attention_mask)}."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, S); got {tuple(input_ids.shape)}")
        for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if tensor is not None and tensor.shape != input_ids.shape:
                raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}; got {tuple(tensor.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"input_ids length must be <= max_position_embeddings={self.config.max_position_embeddings}; "
                             f"got {input_ids.shape[1]}")
        carry = {"hidden": self.embeddings(input_ids, token_type_ids=token_type_ids)}
        if attention_mask is not None:
            carry["padding"] = attention_mask.bool()
        return carry

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One block on {"hidden": (B, S, W)} with the padding mask, if any."""
        return {**carry, "hidden": block(carry["hidden"], carry.get("padding"))}

    def pipeline_exit(self, carry: Carry, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Last pipeline stage: the head's training loss on carry["hidden"] (B, S, W)."""
        if self.config.head == "none":
            raise ValueError("a BERT with head='none' has no loss to train; give it an mlm or classification head")
        if labels is None:
            raise ValueError("training BERT needs labels in the batch")
        return self._head(carry["hidden"], labels, skip_logits=True if self.config.head == "mlm" else None)["loss"]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                skip_logits: bool | None = None) -> dict[str, torch.Tensor]:
        """labels: (B, S) token ids with -100 where unmasked (mlm); (B,) class ids, (B,) float
        targets (regression) or (B, num_labels) 0/1 targets (multi-label) (classification).
        skip_logits (mlm only): return only the fused loss; None skips when there are labels and the
        model trains or runs inside `zoo.nn.logits.loss_only()`."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        return self._head(hidden, labels, skip_logits)

    def _head(self, hidden: torch.Tensor, labels: torch.Tensor | None, skip_logits: bool | None) -> dict[str, torch.Tensor]:
        """The head's outputs on the last hidden states (B, S, W); see `forward`."""
        head = self.config.head
        if head == "mlm":
            return self._masked_lm(hidden, labels, decide_skip_logits(skip_logits, self.training, labels is not None))
        if skip_logits:
            raise ValueError(f"skip_logits applies to the mlm head; this BERT has head={head!r}")
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        if head == "none":
            if labels is not None:
                raise ValueError("labels need a head; this BERT has head='none'")
            return {"last_hidden_state": hidden, "pooler_output": pooled}
        p = self.config.hidden_dropout_prob if self.config.classifier_dropout is None else self.config.classifier_dropout
        logits = self.classifier(dropout(pooled, p, self.training))
        output = {"logits": logits}
        if labels is not None:
            output["loss"] = self._classification_loss(logits, labels)
        return output

    def _classification_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Hugging Face's choice of loss (see `BertConfig.problem_type`), in fp32."""
        problem = self.config.problem_type
        if problem is None:
            integer = not (labels.is_floating_point() or labels.is_complex())
            problem = ("regression" if self.config.num_labels == 1 else
                       "single_label_classification" if integer else "multi_label_classification")
        if problem == "regression" and self.config.num_labels != 1:
            raise ValueError(f"problem_type 'regression' takes num_labels=1; got {self.config.num_labels}")
        expected = logits.shape if problem == "multi_label_classification" else logits.shape[:1]
        if labels.shape != expected:
            raise ValueError(f"labels for {problem} must have shape {tuple(expected)}; got {tuple(labels.shape)}")
        if problem == "regression":
            return F.mse_loss(logits.squeeze(-1).float(), labels.float())
        if problem == "single_label_classification":
            return F.cross_entropy(logits.float(), labels)
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())

    def _masked_lm(self, hidden: torch.Tensor, labels: torch.Tensor | None, skip_logits: bool) -> dict[str, torch.Tensor]:
        if labels is not None and labels.shape != hidden.shape[:2]:
            raise ValueError(f"labels must have the shape of input_ids {tuple(hidden.shape[:2])}; got {tuple(labels.shape)}")
        if skip_logits:
            selected = labels != IGNORE_INDEX
            hidden, labels = hidden[selected], labels[selected]  # only masked positions reach the vocabulary
        transformed = self.mlm_norm(bias_act_dropout(F.linear(hidden, self.mlm_transform.weight), self.mlm_transform.bias, "gelu"))
        weight = self.embeddings.word.weight
        if skip_logits:
            return {"loss": linear_cross_entropy(transformed, weight, labels, self.mlm_decoder.bias)}
        logits = F.linear(transformed, weight, self.mlm_decoder.bias)
        if labels is None:
            return {"logits": logits}
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return {"loss": loss, "logits": logits}
