"""BERT encoder with masked-LM and sequence-classification heads: `Bert`, `BertConfig`."""

from nlp.bert.config import BertConfig
from nlp.bert.model import Bert

__all__ = ["Bert", "BertConfig"]
