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
mlp.fc1,mlp.fc2,norm2}.*, pooler.*, mlm_transform.*, mlm_norm.*, mlm_bias, classifier.*.
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
from zoo.plan import ModelPlan
from zoo.registry import register


def block_config(config: BertConfig) -> TransformerBlockConfig:
    """The `TransformerBlock` shape of a BERT's blocks."""
    return TransformerBlockConfig(
        width=config.hidden_size, heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size, activation="gelu", prenorm=False, causal=False,
        dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob, bias=True,
        eps=config.layer_norm_eps, recompute_attention=config.recompute_attention)


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
            self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        if config.head == "classification":
            self.classifier = nn.Linear(width, config.num_labels)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def parallel_plan(self) -> ModelPlan:
        """Each block is one shard and recompute unit and holds two tensor-parallel regions
        (`block_plan`); under sequence parallelism the blocks run on sequence shards, split after
        the embeddings and gathered after the last block for the heads. The embeddings and heads
        stay whole (the MLM bias is no module a plan can split)."""
        blocks = block_plan("blocks.*", block_config(self.config))
        return replace(blocks, sequence_split=("embeddings",), sequence_gather=(f"blocks.{len(self.blocks) - 1}",))

    @torch.no_grad()
    def init_weights(self) -> None:
        """BERT initialisation: N(0, 0.02) weights, zero biases, unit norms, a zero padding row."""
        init_transformer_(self)
        self.embeddings.word.weight[self.config.pad_token_id].zero_()
        if self.config.head == "mlm":
            self.mlm_bias.zero_()

    def num_parameters(self) -> int:
        """Number of parameters (the tied MLM decoder counted once)."""
        return sum(p.numel() for p in self.parameters())

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's last hidden states (B, S, W)."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, S); got {tuple(input_ids.shape)}")
        for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if tensor is not None and tensor.shape != input_ids.shape:
                raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}; got {tuple(tensor.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"input_ids length must be <= max_position_embeddings={self.config.max_position_embeddings}; "
                             f"got {input_ids.shape[1]}")
        padding = None if attention_mask is None else attention_mask.bool()
        x = self.embeddings(input_ids, token_type_ids=token_type_ids)
        for block in self.blocks:
            x = block(x, padding)
        return x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                skip_logits: bool | None = None) -> dict[str, torch.Tensor]:
        """labels: (B, S) token ids with -100 where unmasked (mlm); (B,) class ids, (B,) float
        targets (regression) or (B, num_labels) 0/1 targets (multi-label) (classification).
        skip_logits (mlm only): return only the fused loss; None skips when there are labels and the
        model trains or runs inside `zoo.nn.logits.loss_only()`."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
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
            return {"loss": linear_cross_entropy(transformed, weight, labels, self.mlm_bias)}
        logits = F.linear(transformed, weight, self.mlm_bias)
        if labels is None:
            return {"logits": logits}
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return {"loss": loss, "logits": logits}
