"""Configuration of the BERT encoder (field names as in Hugging Face's BertConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BertHead = Literal["none", "mlm", "classification"]
ProblemType = Literal["regression", "single_label_classification", "multi_label_classification"]
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


@dataclass
class BertConfig:
    """Shape of a BERT (post-LN encoder, exact GELU, learned positions, token types) and its head."""

    vocab_size: int = 30522
    """Number of WordPiece ids."""
    hidden_size: int = 768
    """Model width W; divisible by num_attention_heads."""
    num_hidden_layers: int = 12
    """Number of transformer blocks."""
    num_attention_heads: int = 12
    """Attention heads per block."""
    intermediate_size: int = 3072
    """Feed-forward width."""
    max_position_embeddings: int = 512
    """Longest sequence (learned positions)."""
    type_vocab_size: int = 2
    """Number of token types (segments)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on each sublayer's output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon."""
    pad_token_id: int = 0
    """Id of the padding token (its embedding row starts at zero)."""
    head: BertHead = "none"
    """"none": encoder + pooler (BertModel); "mlm": masked-LM head tied to the word embedding
    (BertForMaskedLM, no pooler); "classification": pooler + linear classifier
    (BertForSequenceClassification)."""
    num_labels: int = 2
    """Classes of the classification head (1: regression with a mean-squared error)."""
    problem_type: ProblemType | None = None
    """Loss of the classification head, as Hugging Face's: "regression" (mean-squared error),
    "single_label_classification" (cross-entropy over (B,) class ids), "multi_label_classification"
    (binary cross-entropy over (B, num_labels) 0/1 targets); None picks regression for num_labels 1,
    else single- or multi-label by the labels' dtype (integer or float)."""
    classifier_dropout: float | None = None
    """Dropout before the classifier (None: hidden_dropout_prob)."""
    recompute_attention: bool = False
    """Recompute q, k, v and attention in backward instead of keeping them (see zoo.nn.block)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "num_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"BertConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig.hidden_size must be divisible by num_attention_heads="
                             f"{self.num_attention_heads}; got {self.hidden_size}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1); got {value}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"BertConfig.problem_type must be None or one of {', '.join(PROBLEM_TYPES)}; "
                             f"got {self.problem_type!r}")
        if self.head not in ("none", "mlm", "classification"):
            raise ValueError(f"BertConfig.head must be 'none', 'mlm' or 'classification'; got {self.head!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id must be in [0, vocab_size={self.vocab_size}); got {self.pad_token_id}")
